#!/usr/bin/env bash
# Builds every C guest example: echo, batch-sum and poison.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for example in echo batch-sum poison; do
    "$here/$example/build.sh"
done
echo "built $here/echo/dist/echo.wasm $here/batch-sum/dist/batch-sum.wasm $here/poison/dist/poison.wasm"
