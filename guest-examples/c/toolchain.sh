# Shared by the C guest examples' build scripts: sourced, not run.
#
#   c_component <example-dir> <world> [<wit-dir>]
#
# builds <example-dir>/dist/<example>.wasm from the example's *.c files
# against the repository's wit/ folder. Skips the build when the component is
# newer than every input. See README.md for what each step does and why.
#
# Tools, and where they come from:
#   wit-bindgen    crates.io wit-bindgen-cli, pinned below, installed into
#                  guest-examples/c/.tools by this script when missing
#   clang, wasm-ld Debian packages clang-19 and lld-19
#   compiler-rt    Debian package libclang-rt-19-dev-wasm32
#   libc           Debian package wasi-libc (headers, libc.a, crt1-reactor.o)
#   wasm-component-ld  ships with the Rust toolchain (the rustc component,
#                  next to rust-lld; measured: Rust 1.95.0 has 0.5.21)
# System packages are never installed here: CI installs them (README.md).

c_root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$c_root/../.." && pwd)"
# echo, batch-sum and poison are shardlane:plugin@0.1.0 plugins, built
# against the frozen contract: they show that old plugins run unchanged.
wit_dir="$repo_root/wit/v0.1.0"
# enrich and running-total are shardlane:plugin@0.2.0 plugins, built
# against that frozen contract: 0.2.0 plugins run unchanged too.
wit_v2="$repo_root/wit/v0.2.0"
# windowed-totals is a shardlane:plugin@0.3.0 plugin: the current contract.
wit_current="$repo_root/wit"
tools_dir="$c_root/.tools"

# Pins. Changing one rebuilds every example (this file is a build input).
wit_bindgen_version="0.63.0" # matches the Rust guests' wit-bindgen 0.63
llvm_version="19"            # Debian bookworm: clang-19 1:19.1.7-3~deb12u1

die() {
    echo "error: $*" >&2
    exit 1
}

# wit-bindgen: the pinned CLI in .tools, installed from crates.io once. Only
# the C generator is built (--no-default-features --features c): a third of
# the full CLI's build time. --locked uses the crate's own Cargo.lock. A lock
# keeps examples built in parallel from installing it twice.
ensure_wit_bindgen() {
    wit_bindgen="$tools_dir/bin/wit-bindgen"
    if [[ -x "$wit_bindgen" ]] && [[ "$("$wit_bindgen" --version 2>/dev/null)" == "wit-bindgen-cli $wit_bindgen_version" ]]; then
        return
    fi
    command -v cargo >/dev/null 2>&1 \
        || die "cargo not found: wit-bindgen-cli $wit_bindgen_version is installed with cargo (Rust 1.88 or newer, via rustup)"
    command -v flock >/dev/null 2>&1 \
        || die "flock not found: install the apt package util-linux"
    mkdir -p "$tools_dir"
    (
        flock 9
        if [[ -x "$wit_bindgen" ]] && [[ "$("$wit_bindgen" --version 2>/dev/null)" == "wit-bindgen-cli $wit_bindgen_version" ]]; then
            exit 0
        fi
        echo "installing wit-bindgen-cli $wit_bindgen_version into $tools_dir (a few minutes, once)" >&2
        cargo install --quiet --locked --force --root "$tools_dir" \
            --no-default-features --features c \
            wit-bindgen-cli --version "=$wit_bindgen_version" \
            || die "cargo install wit-bindgen-cli $wit_bindgen_version failed"
    ) 9>"$c_root/.tools.lock"
}

# The Debian (LLVM $llvm_version + wasi-libc) and Rust pieces. Each missing
# one fails with the apt package (or toolchain) that provides it.
find_toolchain() {
    local llvm_bin="/usr/lib/llvm-$llvm_version/bin"
    clang="$llvm_bin/clang"
    [[ -x "$clang" ]] || die "clang $llvm_version not found ($clang): install the apt package clang-$llvm_version"
    wasm_ld="$llvm_bin/wasm-ld"
    [[ -x "$wasm_ld" ]] || die "wasm-ld $llvm_version not found ($wasm_ld): install the apt package lld-$llvm_version"

    # clang's own answer, so the path follows the clang version.
    builtins="$("$clang" --target=wasm32-wasi -print-libgcc-file-name 2>/dev/null || true)"
    [[ -f "$builtins" ]] \
        || die "compiler-rt for wasm32 not found (${builtins:-?}): install the apt package libclang-rt-$llvm_version-dev-wasm32"

    wasi_include="/usr/include/wasm32-wasi"
    wasi_lib="/usr/lib/wasm32-wasi"
    [[ -f "$wasi_include/stdlib.h" && -f "$wasi_lib/libc.a" && -f "$wasi_lib/crt1-reactor.o" ]] \
        || die "wasi-libc not found ($wasi_include, $wasi_lib): install the apt package wasi-libc"

    command -v rustc >/dev/null 2>&1 \
        || die "rustc not found: wasm-component-ld comes with the Rust toolchain (install Rust 1.95 with rustup)"
    local sysroot host
    sysroot="$(rustc --print sysroot)"
    host="$(rustc -vV | sed -n 's/^host: //p')"
    component_ld="$sysroot/lib/rustlib/$host/bin/wasm-component-ld"
    [[ -x "$component_ld" ]] \
        || die "wasm-component-ld not found ($component_ld): it ships with recent Rust toolchains (rustup update; measured with 1.95)"
}

c_component() {
    local dir="$1" world="$2" wit_dir="${3:-$wit_dir}"
    local name
    name="$(basename "$dir")"
    local out="$dir/dist/$name.wasm"
    local build="$dir/build"

    [[ -f "$wit_dir/plugin.wit" ]] || die "$wit_dir/plugin.wit not found"

    # Up to date: newer than the sources, the shared build files and the WIT.
    if [[ -f "$out" ]]; then
        local stale=0 input
        for input in "$dir"/*.c "$dir"/*.h "$dir/build.sh" "$c_root/toolchain.sh" \
            "$c_root"/common/* "$wit_dir"/*.wit "$wit_dir"/deps/*.wit; do
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

    find_toolchain
    ensure_wit_bindgen

    rm -rf "$build"
    mkdir -p "$build" "$dir/dist"

    # 1. Bindings: <world>.h/.c (types, the log import, the export glue,
    #    cabi_realloc and the *_free helpers) and <world>_component_type.o,
    #    a wasm object holding only a custom section with the world's
    #    component type, which wasm-component-ld reads in step 3.
    "$wit_bindgen" c "$wit_dir" --world "$world" --out-dir "$build" >"$build/wit-bindgen.log" 2>&1 \
        || { cat "$build/wit-bindgen.log" >&2; die "wit-bindgen c failed for $name"; }
    local stem="${world//-/_}"

    # 2. Compile for wasm32-wasi against Debian's wasi-libc headers only:
    #    -nostdlibinc drops /usr/include (glibc's headers, which clang would
    #    otherwise fall back to) and keeps clang's own stddef.h/stdint.h.
    local cflags=(--target=wasm32-wasi -O2 -std=c11 -nostdlibinc -isystem "$wasi_include"
        -I "$build" -I "$c_root/common")
    local objects=() src
    "$clang" "${cflags[@]}" -c "$build/$stem.c" -o "$build/$stem.o" \
        || die "clang failed on the generated $stem.c"
    objects+=("$build/$stem.o")
    for src in "$dir"/*.c; do
        "$clang" "${cflags[@]}" -Wall -Wextra -c "$src" -o "$build/$(basename "${src%.c}").o" \
            || die "clang failed on $src"
        objects+=("$build/$(basename "${src%.c}").o")
    done

    # 3. Link and componentize in one step. wasm-component-ld runs wasm-ld
    #    (reactor: crt1-reactor.o provides _initialize, which the component
    #    runs once at instantiation; there is no main; compiler-rt's builtins
    #    supply 128-bit division and the like), then turns the core module
    #    into a component from the component-type section. A guest that pulls
    #    WASI preview1 calls out of libc (printf, time, ...) gets them adapted
    #    to WASI 0.2 by its built-in reactor adapter; these examples pull none.
    #    Linked inside build/ under its final name (the name section records
    #    the file name, so the output is byte-for-byte reproducible), then
    #    moved into dist/ whole.
    local tmp="$build/$name.wasm"
    "$component_ld" --wasm-ld-path "$wasm_ld" --wasi-adapter reactor \
        -o "$tmp" \
        "$wasi_lib/crt1-reactor.o" --entry _initialize \
        "${objects[@]}" "$build/${stem}_component_type.o" \
        -L "$wasi_lib" -lc "$builtins" \
        -O2 --strip-debug --stack-first \
        || die "wasm-component-ld failed for $name"
    mv -f "$tmp" "$out"
    echo "built $out"
}
