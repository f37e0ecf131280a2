//! Small helpers for running tools.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// `cargo build --quiet --release` with `args` (packages, targets); returns `target/release`.
pub fn release_build(args: &[&str]) -> Result<PathBuf> {
    let mut all = vec!["build", "--quiet", "--release"];
    all.extend_from_slice(args);
    cargo(&all)?;
    Ok(target_dir().join("release"))
}

pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_env(args, &[])
}

/// What makes a build lint as `cargo clippy -- -D warnings` does: cargo runs clippy's driver in
/// place of rustc for the workspace's own crates (the driver lints, then compiles as rustc
/// would) and plain rustc for third-party ones. `cargo xtask test` and `cargo xtask e2e` build
/// with it, so linting costs no second compilation of every dependency in check mode. Every
/// debug build of theirs carries the same, or cargo compiles the workspace's crates again.
pub fn lint_env() -> Result<[(&'static str, String); 2]> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .current_dir(workspace_root())
        .output()
        .with_context(|| format!("running {rustc} --print sysroot"))?;
    let sysroot = String::from_utf8(out.stdout).context("rustc's sysroot")?;
    let driver = PathBuf::from(sysroot.trim()).join("bin/clippy-driver");
    if !driver.is_file() {
        bail!("{} is missing: rustup component add clippy (rust-toolchain.toml lists it)", driver.display());
    }
    // cargo-clippy's own encoding of the arguments after `--`.
    let args = ["-D", "warnings"].iter().map(|a| format!("{a}__CLIPPY_HACKERY__")).collect();
    Ok([("RUSTC_WORKSPACE_WRAPPER", driver.to_string_lossy().into_owned()), ("CLIPPY_ARGS", args)])
}

/// [`cargo_env`] with [`lint_env`].
pub fn cargo_linted(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let lint = lint_env()?;
    let mut all: Vec<(&str, &str)> = lint.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(env);
    cargo_env(args, &all)
}

pub fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let st = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !st.success() {
        bail!("cargo {} failed: {st}", args.join(" "));
    }
    Ok(())
}

pub fn docker_answers() -> bool {
    Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The median of a sample, which must not be empty.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// The p-th percentile (0..=100) by nearest rank.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
