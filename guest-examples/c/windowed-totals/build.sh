#!/usr/bin/env bash
# Builds dist/windowed-totals.wasm, a shardlane:plugin@0.3.0 windowed-record-handler component, from windowed_totals.c.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
c_component "$here" windowed-record-handler "$wit_current"
