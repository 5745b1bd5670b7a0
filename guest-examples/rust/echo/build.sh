#!/usr/bin/env bash
# Builds dist/echo.wasm, a shardlane:plugin record-handler component.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target_dir="${CARGO_TARGET_DIR:-$here/../target}"
rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
cargo build --manifest-path "$here/Cargo.toml" --release --target wasm32-wasip2 --target-dir "$target_dir"
mkdir -p "$here/dist"
cp "$target_dir/wasm32-wasip2/release/echo.wasm" "$here/dist/echo.wasm"
echo "built $here/dist/echo.wasm"
