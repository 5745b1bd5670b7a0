#!/usr/bin/env bash
# Builds dist/batch-sum.wasm, a shardlane:plugin batch-handler component.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../componentize.sh" "$here" batch-handler
