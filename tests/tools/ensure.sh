#!/usr/bin/env bash
# Creates tests/tools/.venv with the exact tools of requirements.txt, once;
# prints the venv's python. Idempotent: a marker holding a copy of
# requirements.txt says the install finished and for which pins; a lock
# keeps concurrent tests from racing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
marker="$venv/.shardlane-installed"
requirements="$here/requirements.txt"
die() { echo "error: $*" >&2; exit 1; }
installed() { [[ -x "$venv/bin/python" && -f "$marker" ]] && cmp -s "$marker" "$requirements"; }
if ! installed; then
    command -v python3 >/dev/null 2>&1 || die "python3 not found: install the apt package python3"
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 \
        || die "python3 cannot create virtual environments: install the apt package python3-venv"
    mkdir -p "$here"
    exec 9>"$here/.venv.lock"
    flock 9
    if ! installed; then
        rm -rf "$venv"
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2 \
            || die "pip could not install tests/tools/requirements.txt"
        cp "$requirements" "$marker"
    fi
fi
echo "$venv/bin/python"
