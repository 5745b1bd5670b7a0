#!/usr/bin/env bash
# Builds one Rust example, guest-examples/rust/<example>/dist/<example>.wasm:
# a shardlane:plugin component, straight from cargo's wasm32-wasip2 target.
# Usage: build-example.sh <example>   (each example's build.sh calls this)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
example="${1:?usage: build-example.sh <example>}"
target_dir="${CARGO_TARGET_DIR:-$here/target}"
command -v cargo >/dev/null || { echo "error: cargo not found: install Rust 1.95 or newer (https://rustup.rs)" >&2; exit 1; }
rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
cargo build --quiet --manifest-path "$here/$example/Cargo.toml" --release --target wasm32-wasip2 --target-dir "$target_dir"
mkdir -p "$here/$example/dist"
cp "$target_dir/wasm32-wasip2/release/${example//-/_}.wasm" "$here/$example/dist/$example.wasm"
echo "built $here/$example/dist/$example.wasm"
