#!/usr/bin/env bash
# Builds dist/windowed-totals.wasm, a shardlane:plugin@0.3.0 windowed-record-handler component, from app.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
python_component "$here" windowed-record-handler "$wit_current"
