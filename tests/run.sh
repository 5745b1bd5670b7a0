#!/usr/bin/env bash
# The README's test command: sets up everything the test suite needs on a
# fresh machine of this kind — idempotently, so a machine that already has
# it pays nothing — then runs the whole suite. `.ci/run` calls this.
#
# What it installs, each only when missing:
#   - the wasm32-wasip2 Rust target (every guest);
#   - Debian's chromium (status-page test), clang-19, lld-19,
#     libclang-rt-19-dev-wasm32 and wasi-libc (C guests), podman, buildah
#     and runc (the container image test), docker-registry (an OCI registry
#     for the artifact-store tests), with apt-get (as root, or through sudo);
#   - the npm emulators pinned in tests/emulators/package-lock.json;
#   - the Python test tools pinned in tests/tools/requirements.txt (a venv;
#     moto's S3 server among them);
#   - the example plugins of every language (Python's componentize-py and
#     JavaScript's componentize-js come with their build scripts).
# Arguments are passed to `cargo test --workspace` (e.g. `-- faults::`).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "--- toolchain: wasm32-wasip2 target"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2

echo "--- Debian packages: headless Chromium (status page test), clang/lld 19 + wasi-libc (C guests), podman/buildah/runc (container image test), docker-registry (OCI artifact store test)"
packages=(chromium clang-19 lld-19 libclang-rt-19-dev-wasm32 wasi-libc podman buildah runc docker-registry)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "installing ${missing[*]}"
  as_root=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "error: installing ${missing[*]} needs root (or sudo)" >&2; exit 1; }
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "all present"
fi

echo "--- emulators (pinned in tests/emulators/package-lock.json)"
if [[ -f tests/emulators/node_modules/kinesis-local/main.js && -f tests/emulators/node_modules/dynalite/cli.js ]]; then
  echo "already installed"
else
  (cd tests/emulators && npm ci --no-audit --no-fund)
fi

echo "--- Python test tools (pinned in tests/tools/requirements.txt)"
tests/tools/ensure.sh >/dev/null && echo "in tests/tools/.venv"

echo "--- example plugins in every language (Rust, Python, JavaScript, C)"
CARGO_TARGET_DIR="$PWD/target/guests" guest-examples/rust/build.sh   # the target folder the tests use
guest-examples/python/build.sh
guest-examples/js/build.sh
guest-examples/c/build.sh

echo "--- tests: cargo test --workspace $*"
cargo test --workspace "$@"
