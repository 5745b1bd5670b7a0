#!/usr/bin/env bash
# Builds dist/running-total.wasm (see ../build-example.sh).
set -euo pipefail
exec "$(cd "$(dirname "$0")" && pwd)/../build-example.sh" running-total
