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
#   - mdbook, pinned below, with `cargo install --locked` into
#     tests/tools/mdbook (once: a few minutes);
#   - the example plugins of every language (Python's componentize-py and
#     JavaScript's componentize-js come with their build scripts).
# Then the floor the code stands on — `cargo fmt --check`, clippy with the
# workspace's lints as errors, rustdoc with its warnings as errors, the
# book built — and the suite. Arguments are passed to `cargo test --workspace` (e.g.
# `-- faults::`).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "--- toolchain: wasm32-wasip2 target, clippy and rustfmt"
rustup target list --installed | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2
for component in clippy rustfmt; do
  rustup component list --installed | grep -q "^$component" || rustup component add "$component"
done

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

mdbook_version=0.5.4
mdbook=tests/tools/mdbook/bin/mdbook
echo "--- mdbook $mdbook_version (the book in docs/)"
if [[ -x $mdbook ]] && [[ "$($mdbook --version)" == "mdbook v$mdbook_version" ]]; then
  echo "already installed"
else
  echo "installing into tests/tools/mdbook (a few minutes, once)"
  cargo install --quiet --locked --force --root tests/tools/mdbook \
    --no-default-features --features search mdbook --version "=$mdbook_version"
fi

echo "--- example plugins in every language (Rust, Python, JavaScript, C)"
CARGO_TARGET_DIR="$PWD/target/guests" guest-examples/rust/build.sh   # the target folder the tests use
guest-examples/python/build.sh
guest-examples/js/build.sh
guest-examples/c/build.sh
# The Rust guest library's own tests (the other languages' libraries are
# exercised by the windowed-totals conformance test).
(cd guest-examples/rust && CARGO_TARGET_DIR="$PWD/../../target/guests" cargo test --quiet -p shardlane-guest)

echo "--- lints: cargo fmt --check, clippy (-D warnings), rustdoc (-D warnings), the book"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --document-private-items
$mdbook build docs   # into target/book; its reference pages are checked against the code by `book::` tests

echo "--- tests: cargo test --workspace $*"
cargo test --workspace "$@"
