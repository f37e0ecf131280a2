//! `cargo xtask bench verify`: the time to verify a 10 MB binary (the signed manifest's OpenPGP
//! signature, then the binary's SHA-256, as the installer does) against `sha256sum` on the same file. Goal: within 1.2x.
//!
//! Both are measured as whole processes on a warm page cache (what an owner would time), the
//! verifier being `repo-keys/examples/verify_file.rs` built in release mode. The in-process
//! median is printed too, to separate process start-up from hashing.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::{Row, say};
use crate::util::{median, release_build};

pub fn run(quick: bool) -> Result<Vec<Row>> {
    let runs = if quick { 7 } else { 31 };
    let dir = std::env::temp_dir().join(format!("gpum-bench-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let res = bench(&dir, runs);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

fn bench(dir: &Path, runs: usize) -> Result<Vec<Row>> {
    let exe =
        release_build(&["-p", "gpum-repo-keys", "--example", "verify_file"])?.join("examples/verify_file");

    // A 10 MB pseudo-random "binary", listed in a manifest signed with a throwaway key, as `cargo xtask sign` does.
    let file = dir.join("gpum-agent");
    let mut data = vec![0u8; 10 * 1000 * 1000];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(&file, &data)?;
    let (cert, public, _) = gpum_repo_keys::release::signing::throwaway_key();
    let (manifest, sig) =
        gpum_repo_keys::release::signing::sign_release(&cert, &[("gpum-agent", "0.1.0", &data)]);
    std::fs::write(dir.join(gpum_repo_keys::release::MANIFEST), manifest)?;
    std::fs::write(dir.join(gpum_repo_keys::release::MANIFEST_SIG), sig)?;
    let key = dir.join("release.asc");
    std::fs::write(&key, public)?;

    let time = |cmd: &mut Command| -> Result<f64> {
        let t = Instant::now();
        let out = cmd.output()?;
        let el = t.elapsed().as_secs_f64() * 1000.0;
        if !out.status.success() {
            bail!("{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
        }
        Ok(el)
    };
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    // Warm the page cache and both binaries, then alternate so drift hits both equally.
    time(Command::new("sha256sum").arg(&file))?;
    time(Command::new(&exe).arg(&file).arg(&key))?;
    for _ in 0..runs {
        theirs.push(time(Command::new("sha256sum").arg(&file))?);
        ours.push(time(Command::new(&exe).arg(&file).arg(&key))?);
    }
    let inproc = Command::new(&exe).arg(&file).arg(&key).args(["--repeat", &runs.to_string()]).output()?;
    let inproc_us: f64 =
        String::from_utf8_lossy(&inproc.stdout).trim().parse().context("in-process median")?;
    let (m_ours, m_theirs) = (median(&mut ours), median(&mut theirs));
    say!("10 MB file, {runs} runs each, medians (process start to exit):");
    say!("  sha256sum:                 {m_theirs:8.2} ms");
    say!(
        "  verify (SHA-256 + sig):    {m_ours:8.2} ms   ({:.2}x sha256sum; goal <= 1.20x)",
        m_ours / m_theirs
    );
    say!("  verify, in-process only:   {:8.2} ms", inproc_us / 1000.0);
    Ok(vec![
        Row::at_most("verify: 10 MB, ratio to sha256sum", m_ours / m_theirs, "x", 1.2, false)
            .with_reference(format!("sha256sum {m_theirs:.2} ms")),
    ])
}
