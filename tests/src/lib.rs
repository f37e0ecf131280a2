//! The end-to-end harness: finds the real binaries, starts the real platform, builds local
//! Docker images, and holds the simulated NVIDIA layer (the only simulated part of the
//! system; see `sim/`).
//!
//! Suites live in `tests/e2e/*.rs`, one per capability.
#![allow(clippy::disallowed_methods)]

pub mod browser;
pub mod docker_scope;
pub mod images;
pub mod owner;
pub mod platform;
pub mod testhost;
pub mod tunnel;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the workspace").to_path_buf()
}

/// The NVML simulation (`tests/sim/nvml/libnvidia-ml-sim.c`, the only simulated layer) built
/// into `dir`, for an agent run with `GPUM_NVML_LIB` naming it (a `test-knobs` build). gcc is
/// one of the tests' dependencies (tests/setup-deps.sh).
pub fn build_nvml_sim(dir: &std::path::Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sim/nvml/libnvidia-ml-sim.c");
    let out = dir.join("libnvidia-ml-sim.so");
    let st = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src).status().expect("cc");
    assert!(st.success(), "cc {}: {st}", src.display());
    out
}

/// The target directory cargo builds into.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// A workspace binary, built by `cargo build --workspace --bins` (which `cargo xtask test` runs
/// first). Panics with that instruction when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let p = target_dir().join("debug").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (cargo xtask test does)",
        p.display()
    );
    p
}

/// Whether a Docker engine answers here.
pub fn docker_answers() -> bool {
    std::process::Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Call at the top of a Docker test, one marked `#[ignore = "needs a Docker engine"]` (run
/// with `--run-ignored`, as `cargo xtask test` does): panics when no engine answers, so a
/// missing engine fails the test rather than passing it as a skip.
pub fn require_docker(test: &str) {
    assert!(docker_answers(), "{test}: needs a Docker engine, and none answers");
}

/// `gpum-agent ARGS` in English (`LANG=C.UTF-8`, no `LC_*` override), ready to run.
pub fn agent_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(bin("gpum-agent"));
    c.args(args).env("LANG", "C.UTF-8").env_remove("LC_ALL").env_remove("LC_MESSAGES");
    c
}

/// Runs `c` with `stdin` written to its standard input (how secrets reach our binaries) and
/// waits for it.
pub fn run_with_stdin(mut c: Command, stdin: &str) -> Output {
    let mut child =
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().expect("wait")
}

/// A finished command's standard output then standard error, as text.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The release `cargo xtask dist` built, for the suites that check it (`tests/e2e/dist.rs`,
/// each marked `#[ignore = "needs cargo xtask dist's output"]`): `GPUM_DIST_DIR`, which `cargo
/// xtask test` sets after its dist step. Panics when it is not there.
pub fn require_dist(test: &str) -> PathBuf {
    match std::env::var_os("GPUM_DIST_DIR").map(PathBuf::from) {
        Some(d) if d.join(".gpum-dist").exists() => d,
        Some(d) => panic!("{test}: GPUM_DIST_DIR={} holds no cargo xtask dist output", d.display()),
        None => panic!("{test}: GPUM_DIST_DIR is not set (cargo xtask test sets it after its dist step)"),
    }
}
