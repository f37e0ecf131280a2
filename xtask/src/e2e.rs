//! `cargo xtask e2e [NAME...]`: the test host scenarios (issue 10, docs/testhost.md).
//!
//! 1. Builds what the scenarios run: `gpum-install` with `--features test-knobs` and `gpum-agent`
//!    as a release has it (no test knobs), copied to `target/e2e/bin/`; then the workspace's
//!    binaries exactly as `cargo xtask test` builds them (the platform with its `test-knobs` test
//!    clock, the runner `gpum-e2e`), which puts `target/debug` back as the other suites need it.
//! 2. Stages `target/e2e/stage/`, which every host mounts read-only at `/opt/gpum-e2e`:
//!    `bin/gpum-platform`; `dist/` with `gpum-install` and `gpum-agent` (debug info stripped, to
//!    keep downloads short), signed by `cargo xtask sign`'s code with a throwaway release key
//!    made for this run by `release-key`'s code in a temporary directory outside the repository,
//!    removed once signed (`release.asc` and `release.fingerprint` are its public part, which the
//!    test-knobs installer trusts); `dist-tampered/`, the same with one byte of `gpum-agent`
//!    changed after signing.
//! 3. Runs `target/debug/gpum-e2e --stage target/e2e/stage [NAME...]`, which builds the host
//!    images when their recipe changed, runs the scenarios and prints `N passed, N failed`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{cargo_linted, target_dir, workspace_root};

pub fn run(names: &[String], jobs: Option<usize>) -> Result<()> {
    let e2e = target_dir().join("e2e");
    let bin = e2e.join("bin");
    fs::create_dir_all(&bin)?;
    let debug = target_dir().join("debug");

    // What the test host runs: the installer with its test knobs, and the agent as a release
    // has it (without the agent's test knobs, which `cargo build --workspace` turns on through
    // tests/Cargo.toml). Both build in the shared target directory, so only these two crates
    // compile twice; they are copied out before the workspace build below puts the suites'
    // binaries back into `target/debug`.
    cargo_linted(
        &[
            "build",
            "--locked",
            "-p",
            "gpum-install",
            "-p",
            "gpum-agent",
            "--features",
            "gpum-install/test-knobs",
        ],
        &[],
    )?;
    copy(&debug.join("gpum-install"), &bin.join("gpum-install"))?;
    copy(&debug.join("gpum-agent"), &bin.join("gpum-agent"))?;
    // The same build as `cargo xtask test` (which runs first in CI), so nothing is rebuilt: the
    // platform with its test clock (`TEST_FEATURES`), and the runner `gpum-e2e`.
    cargo_linted(crate::DEBUG_BUILD, &[])?;

    let stage = e2e.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    for d in ["bin", "dist", "dist-tampered", "tls"] {
        fs::create_dir_all(stage.join(d))?;
    }
    strip(&debug.join("gpum-platform"), &stage.join("bin/gpum-platform"))?;
    strip(&bin.join("gpum-install"), &stage.join("dist/gpum-install"))?;
    strip(&bin.join("gpum-agent"), &stage.join("dist/gpum-agent"))?;

    // A throwaway release key for this run, outside the repository (as `release-key` insists),
    // removed at the end; its public part goes into the stage for the test-knobs installer.
    let keydir = std::env::temp_dir().join(format!("gpum-e2e-release-key-{}", std::process::id()));
    if keydir.exists() {
        fs::remove_dir_all(&keydir)?;
    }
    crate::sign::release_key(crate::sign::ReleaseKeyArgs {
        out: keydir.clone(),
        userid: "gpum e2e throwaway release key (not for production)".into(),
    })?;
    let signed = (|| -> Result<()> {
        let public = fs::read(keydir.join("gpum-release.asc"))?;
        fs::write(stage.join("release.asc"), &public)?;
        fs::write(stage.join("release.fingerprint"), fingerprint(&public)?)?;
        let files = ["gpum-install", "gpum-agent"].map(|n| stage.join("dist").join(n)).to_vec();
        crate::sign::sign(crate::sign::SignArgs {
            key: keydir.join("gpum-release.key"),
            version: env!("CARGO_PKG_VERSION").into(),
            files,
        })
    })();
    let _ = fs::remove_dir_all(&keydir);
    signed?;
    // The tampered copy: everything as signed, then one byte of gpum-agent changed.
    for e in fs::read_dir(stage.join("dist"))? {
        let e = e?;
        fs::copy(e.path(), stage.join("dist-tampered").join(e.file_name()))?;
    }
    let agent = stage.join("dist-tampered/gpum-agent");
    let mut bytes = fs::read(&agent)?;
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    fs::write(&agent, bytes)?;
    use std::os::unix::fs::PermissionsExt;
    for f in
        ["dist/gpum-install", "dist/gpum-agent", "dist-tampered/gpum-install", "dist-tampered/gpum-agent"]
    {
        fs::set_permissions(stage.join(f), fs::Permissions::from_mode(0o755))?;
    }

    let mut cmd = Command::new(debug.join("gpum-e2e"));
    cmd.arg("--stage").arg(&stage);
    if let Some(j) = jobs {
        cmd.arg("--jobs").arg(j.to_string());
    }
    cmd.args(names);
    let st = cmd.current_dir(workspace_root()).status().context("running gpum-e2e")?;
    if !st.success() {
        bail!("gpum-e2e: {st}");
    }
    Ok(())
}

/// The primary fingerprint of an armored public key.
fn fingerprint(armored: &[u8]) -> Result<String> {
    use sequoia_openpgp::parse::Parse;
    Ok(sequoia_openpgp::Cert::from_bytes(armored)?.fingerprint().to_hex())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    let tmp = tmp_beside(to);
    fs::copy(from, &tmp).with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    fs::rename(&tmp, to)?;
    Ok(())
}

/// A copy without debug information (`strip --strip-debug`); a plain copy when `strip` is
/// missing.
fn strip(from: &Path, to: &Path) -> Result<()> {
    let ok = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        copy(from, to)?;
    }
    Ok(())
}

fn tmp_beside(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}
