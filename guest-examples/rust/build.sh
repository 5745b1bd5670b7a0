#!/usr/bin/env bash
# Builds every Rust example: <example>/dist/<example>.wasm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for example in echo batch-sum poison enrich running-total windowed-totals; do
  "$here/build-example.sh" "$example"
done
