#!/usr/bin/env bash
# Builds dist/windowed-totals.wasm, a shardlane:plugin@0.3.0 windowed-record-handler component.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../componentize.sh" "$here" windowed-record-handler 0.3.0
