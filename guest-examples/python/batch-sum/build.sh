#!/usr/bin/env bash
# Builds dist/batch-sum.wasm, a shardlane:plugin batch-handler component, from app.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
python_component "$here" batch-handler
