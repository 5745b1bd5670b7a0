#!/usr/bin/env bash
# Builds dist/poison.wasm, a shardlane:plugin record-handler component.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../componentize.sh" "$here" record-handler
