#!/usr/bin/env bash
# Builds every C guest example: echo, batch-sum, poison (0.1.0) and enrich, running-total (0.2.0) and windowed-totals (0.3.0).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for example in echo batch-sum poison enrich running-total windowed-totals; do
    "$here/$example/build.sh"
done
echo "built $here/echo/dist/echo.wasm $here/batch-sum/dist/batch-sum.wasm $here/poison/dist/poison.wasm $here/enrich/dist/enrich.wasm $here/running-total/dist/running-total.wasm $here/windowed-totals/dist/windowed-totals.wasm"
