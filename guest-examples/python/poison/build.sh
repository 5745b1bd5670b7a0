#!/usr/bin/env bash
# Builds dist/poison.wasm, a shardlane:plugin record-handler component, from app.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
python_component "$here" record-handler
