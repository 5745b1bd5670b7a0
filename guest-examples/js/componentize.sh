#!/usr/bin/env bash
# Builds one JavaScript example into a shardlane:plugin component.
#
# Usage: componentize.sh <example-dir> <world> [0.2.0 | 0.3.0]
#   -> <example-dir>/dist/<example>.wasm, from <example-dir>/<example>.js,
#   against the frozen 0.1.0 contract, the frozen 0.2.0 one, or the current
#   one (wit/) with 0.3.0
#
# Shared by every example's build.sh, so each of those stays one command. It
# installs the pinned componentize-js (package-lock.json) into node_modules
# when that is missing or stale, skips the build when the component is newer
# than everything it is made from, and disables every optional WASI feature
# of the JS engine, so the component imports nothing but shardlane:plugin.
set -euo pipefail

js="$(cd "$(dirname "$0")" && pwd)"
example_dir="$(cd "$1" && pwd)"
world="$2"
example="$(basename "$example_dir")"
# echo, batch-sum and poison are shardlane:plugin@0.1.0 plugins, built
# against the frozen contract: they show that old plugins run unchanged.
# enrich and running-total are 0.2.0 plugins, built against that frozen
# contract; windowed-totals is a 0.3.0 plugin: the current contract.
case "${3:-}" in
  0.3.0) wit="$js/../../wit" ;;
  0.2.0) wit="$js/../../wit/v0.2.0" ;;
  *) wit="$js/../../wit/v0.1.0" ;;
esac
out="$example_dir/dist/$example.wasm"

# Skip the rebuild when the component is newer than its inputs: the example's
# sources, the shared files of the JS examples and the WIT.
if [[ -f "$out" ]] && [[ -z "$(find "$example_dir" -path "$example_dir/dist" -prune -o -type f -newer "$out" -print -quit)" ]] \
  && [[ -z "$(find "$js/package.json" "$js/package-lock.json" "$js/componentize.sh" "$js/lib" "$wit" -type f -newer "$out" -print -quit)" ]]; then
  echo "built $out"
  exit 0
fi

command -v node >/dev/null || { echo "error: node not found: install Node.js 20 (apt package nodejs)" >&2; exit 1; }
command -v npm >/dev/null || { echo "error: npm not found: install Node.js 20 with npm (apt package nodejs)" >&2; exit 1; }
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if (( node_major < 20 )); then
  echo "error: node $(node --version) is too old: componentize-js needs Node.js 20 or newer (tested with 20) (apt package nodejs)" >&2
  exit 1
fi

# Install the pinned toolchain when node_modules is missing or older than the
# lockfile. The lock keeps concurrent builds from running npm ci at once.
(
  flock 9
  if [[ ! -f "$js/node_modules/.package-lock.json" || "$js/package-lock.json" -nt "$js/node_modules/.package-lock.json" ]]; then
    npm ci --prefix "$js" --no-audit --no-fund --loglevel=error >&2
  fi
) 9<"$js/package-lock.json"

mkdir -p "$example_dir/dist"
# Run from the JS examples' folder with a relative source path:
# componentize-js names the module by its path relative to the working
# directory (so the component does not depend on where the checkout lives),
# mangles an absolute path when the working directory is `/`, and resolves
# imports inside the working directory only (the guest library,
# lib/shardlane-guest.js, is imported as ../lib/shardlane-guest.js).
cd "$js"
# Write beside the target and rename, so a failed build never leaves a
# component that looks up to date.
"$js/node_modules/.bin/componentize-js" "$example/$example.js" \
  --wit "$wit" \
  --world-name "$world" \
  --disable stdio random clocks http fetch-event \
  --out "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
