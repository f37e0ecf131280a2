//! Links the agent with `hot-text.ld`: the functions of a steady heartbeat, gathered into one
//! section ahead of the rest of the text, so that a heartbeat, which comes after its code has
//! left the CPU's caches, touches few pages of it (`xtask/src/bench/hot.rs`, which writes the
//! script, says why and what it measured). Only the layout changes: no code, no symbol.

// Cargo tells a build script its target only through the environment; `gpum_host::env` is the
// agent's, not available here.
#[allow(clippy::disallowed_methods)]
fn main() {
    println!("cargo:rerun-if-changed=hot-text.ld");
    let target = |k: &str| std::env::var(k).unwrap_or_default();
    // Both linkers of this target (lld, the default, and GNU ld) read `INSERT BEFORE`.
    if target("CARGO_CFG_TARGET_OS") == "linux" && target("CARGO_CFG_TARGET_ENV") == "gnu" {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hot-text.ld");
        println!("cargo:rustc-link-arg-bin=gpum-agent=-Wl,-T,{}", script.display());
    }
}
