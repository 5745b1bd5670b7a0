#!/usr/bin/env bash
# Builds dist/windowed-totals.wasm (see ../build-example.sh).
set -euo pipefail
exec "$(cd "$(dirname "$0")" && pwd)/../build-example.sh" windowed-totals
