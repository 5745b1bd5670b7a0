#!/usr/bin/env bash
# Builds dist/enrich.wasm, a shardlane:plugin@0.2.0 record-handler component, from enrich.c.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../toolchain.sh"
c_component "$here" record-handler "$wit_v2"
