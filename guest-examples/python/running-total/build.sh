#!/usr/bin/env bash
# Builds dist/running-total.wasm, a shardlane:plugin@0.2.0 record-handler component, from app.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
python_component "$here" record-handler "$wit_v2"
