#!/usr/bin/env bash
# Builds dist/batch-sum.wasm (see ../build-example.sh).
set -euo pipefail
exec "$(cd "$(dirname "$0")" && pwd)/../build-example.sh" batch-sum
