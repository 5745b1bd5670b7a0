#!/usr/bin/env bash
# Builds dist/running-total.wasm, a shardlane:plugin@0.2.0 record-handler component.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../componentize.sh" "$here" record-handler 0.2.0
