//! Writes a function whose name is 80,000 characters long: a trap inside it
//! puts that name in the trap message's backtrace, as a hostile guest can.

fn main() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    let name = format!("trap_in_{}", "a".repeat(80_000));
    let source = format!(
        "/// Traps, with its long name on the stack.\n#[inline(never)]\npub fn {name}(why: &str) -> ! {{\n    panic!(\"{{why}}\")\n}}\n\npub fn trap_with_a_long_name(why: &str) -> ! {{\n    {name}(std::hint::black_box(why))\n}}\n"
    );
    std::fs::write(out.join("long_name.rs"), source).unwrap();
    println!("cargo::rerun-if-changed=build.rs");
}
