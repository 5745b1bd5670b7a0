#!/usr/bin/env bash
# Builds dist/batch-sum.wasm, a shardlane:plugin batch-handler component, from batch_sum.c.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
c_component "$here" batch-handler
