//! Build script: links the `shardlane` binary with packed relative
//! relocations (RELR, `-z pack-relative-relocs`) on Linux with glibc.
//!
//! Why: the binary is position independent, so the dynamic loader applies
//! one relative relocation per pointer in its read-only data at start-up
//! (about 116,000 here). As classic RELA entries that table is 2.8 MB,
//! read whole at every start and left resident: 7 % of an idle host's
//! memory (BENCHMARKS.md, "Memory and idle polling"). RELR packs the same relocations into
//! bitmaps of a few kilobytes; the binary stays position independent, so
//! address-space randomisation is unchanged.
//!
//! Needs glibc 2.36 or later where the binary runs (Debian 12, Ubuntu
//! 22.10, RHEL 10, the container image's distroless `cc-debian12`): an
//! older glibc refuses to start it, naming `GLIBC_ABI_DT_RELR`. Needs a
//! linker that knows the flag: rustc's own `rust-lld` (the default on
//! x86-64 Linux), LLD 15+, GNU ld 2.38+. Only binaries are linked this way
//! (`rustc-link-arg-bins`), not the test and bench executables.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
