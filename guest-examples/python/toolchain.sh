# Shared by the Python guest examples' build scripts: sourced, not run.
#
#   python_component <example-dir> <world> [<wit-dir>]
#
# builds <example-dir>/dist/<example>.wasm from <example-dir>/app.py against
# <wit-dir> (default: the frozen 0.1.0 contract, $wit_dir; $wit_current is
# the current one), installing the pinned componentize-py into
# guest-examples/python/.venv first when it is missing. Skips the build when
# the component is newer than every input.

py_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$py_root/../.." && pwd)"
# echo, batch-sum and poison are shardlane:plugin@0.1.0 plugins, built
# against the frozen contract: they show that old plugins run unchanged.
wit_dir="$repo_root/wit/v0.1.0"
# enrich and running-total are shardlane:plugin@0.2.0 plugins, built
# against that frozen contract: 0.2.0 plugins run unchanged too.
wit_v2="$repo_root/wit/v0.2.0"
# windowed-totals is a shardlane:plugin@0.3.0 plugin: the current contract.
wit_current="$repo_root/wit"
venv="$py_root/.venv"
requirements="$py_root/requirements.txt"

die() {
    echo "error: $*" >&2
    exit 1
}

# Creates .venv with the exact componentize-py of requirements.txt, once.
# A marker holding a copy of requirements.txt says the install finished and
# for which pins; a lock keeps concurrent example builds from racing.
ensure_toolchain() {
    local marker="$venv/.shardlane-installed"
    if [[ -x "$venv/bin/componentize-py" && -f "$marker" ]] && cmp -s "$marker" "$requirements"; then
        return
    fi
    command -v python3 >/dev/null 2>&1 \
        || die "python3 not found: install the apt package python3 (3.10 or newer)"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "python3 is $(python3 -V 2>&1 | cut -d' ' -f2); componentize-py needs 3.10 or newer"
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 \
        || die "python3 cannot create virtual environments: install the apt package python3-venv"
    command -v flock >/dev/null 2>&1 \
        || die "flock not found: install the apt package util-linux"
    (
        flock 9
        if [[ -x "$venv/bin/componentize-py" && -f "$marker" ]] && cmp -s "$marker" "$requirements"; then
            exit 0
        fi
        echo "installing $(grep -v '^#' "$requirements" | xargs) into $venv" >&2
        rm -rf "$venv"
        python3 -m venv "$venv" || die "python3 -m venv failed: install the apt package python3-venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            --no-input -r "$requirements" || die "pip could not install $requirements from PyPI"
        cp "$requirements" "$marker"
    ) 9>"$py_root/.venv.lock"
}

python_component() {
    local dir="$1" world="$2" wit_dir="${3:-$wit_dir}"
    local name
    name="$(basename "$dir")"
    local out="$dir/dist/$name.wasm"

    [[ -f "$wit_dir/plugin.wit" ]] || die "$wit_dir/plugin.wit not found"

    # Up to date: newer than the sources, the shared build files and the WIT.
    if [[ -f "$out" ]]; then
        local stale=0 input
        for input in "$dir"/*.py "$dir/build.sh" "$requirements" "$py_root/toolchain.sh" "$py_root"/lib/*.py "$wit_dir"/*.wit "$wit_dir"/deps/*.wit; do
            if [[ -e "$input" && ! "$out" -nt "$input" ]]; then
                stale=1
                break
            fi
        done
        if [[ $stale -eq 0 ]]; then
            echo "built $out (up to date)"
            return
        fi
    fi

    ensure_toolchain
    mkdir -p "$dir/dist"
    local tmp="$out.tmp.$$"
    # -p: only the example's own folder and, for the current contract, the
    # guest library (lib/: shardlane_guest) are on the guest's module path
    # (no site-packages from the build venv get bundled).
    local lib=()
    [[ "$wit_dir" == "$wit_current" ]] && lib=(-p "$py_root/lib")
    (
        cd "$dir"
        unset VIRTUAL_ENV
        "$venv/bin/componentize-py" -q -d "$wit_dir" -w "$world" \
            componentize app -p . "${lib[@]}" -o "$tmp"
    ) || { rm -f "$tmp"; die "componentize-py failed for $name"; }
    mv -f "$tmp" "$out"
    echo "built $out"
}
