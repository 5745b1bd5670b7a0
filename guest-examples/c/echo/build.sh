#!/usr/bin/env bash
# Builds dist/echo.wasm, a shardlane:plugin record-handler component, from echo.c.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
c_component "$here" record-handler
