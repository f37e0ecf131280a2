//! `cargo xtask e2e [NAME...]`: the test host scenarios (issue 10, docs/testhost.md).
//!
//! 1. Builds what the scenarios run: `gpum-install` with `--features test-knobs` and `gpum-agent`
//!    as a release has it (no test knobs), copied to `target/e2e/bin/`; then "version B" of the
//!    agent (issue 47's upgrade scenarios): the same agent with `test-next-version`, reporting
//!    the workspace version with its patch number one up (`GPUM_TEST_AGENT_VERSION`); then the
//!    workspace's binaries exactly as `cargo xtask test` builds them (the platform with its
//!    `test-knobs` test clock, the runner `gpum-e2e`), which puts `target/debug` back as the
//!    other suites need it. The installer and both agents compile in the e2e release key
//!    (`GPUM_DIST_RELEASE_KEY_ASC`/`GPUM_DIST_RELEASE_FINGERPRINT` with the feature
//!    `gpum-repo-keys/dist-key`, so that these builds are units of their own beside the
//!    workspace's): the agents verify an upgrade against it.
//! 2. Stages `target/e2e/stage/`, which every host mounts read-only at `/opt/gpum-e2e`:
//!    `bin/gpum-platform`; `dist/` with `gpum-install` and `gpum-agent` (debug info stripped, to
//!    keep downloads short), signed by `cargo xtask sign`'s code with the e2e release key
//!    (a throwaway key made once by `release-key`'s code and kept in `target/e2e/release-key/`,
//!    outside the repository's tracked files, so that the agents' builds stay cached across
//!    runs; `release.asc` and `release.fingerprint` are its public part, which the test-knobs
//!    installer trusts); `dist-tampered/`, the same with one byte of `gpum-agent` changed after
//!    signing; and `releases/`, the dists `gpum-platform releases add` takes in the upgrade
//!    scenarios, each signed by the same key ([`RELEASES`]).
//! 3. Runs `target/debug/gpum-e2e --stage target/e2e/stage [NAME...]`, which builds the host
//!    images when their recipe changed, runs the scenarios and prints `N passed, N failed`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util::{cargo_linted, target_dir, workspace_root};

/// The releases staged in `releases/NAME/` for the upgrade scenarios (issue 47), each a signed
/// dist of one `gpum-agent` as `cargo xtask sign` writes it (`release.json`, `manifest.json`,
/// their signatures, the `.sha256` and `.sig` files):
/// - `b`: version B (patch + 1), the agent built with `test-next-version`: a good upgrade;
/// - `b-tampered`: version B's bytes signed as patch + 3, then one byte of `gpum-agent` changed
///   and `manifest.json` and `release.json` made again to match it (what someone who holds the
///   platform but not the key can serve; `releases add` finds it consistent), the signatures
///   kept: the agent must refuse it and keep running;
/// - `bad`: patch + 2, correctly signed, whose `gpum-agent` is `#!/bin/sh\nexit 1`: it cannot
///   start, so the agent must come back on its own version by the rollback guard;
/// - `old`: [`OLD_VERSION`], lower than the installed one, correctly signed (the same tiny
///   script): a downgrade, which the agent refuses whatever the platform says.
pub const RELEASES: [&str; 4] = ["b", "b-tampered", "bad", "old"];
/// The version of `releases/old`: older than the workspace's.
pub const OLD_VERSION: &str = "0.0.9";
/// The `gpum-agent` of `releases/bad` and `releases/old`.
const CANNOT_START: &[u8] = b"#!/bin/sh\nexit 1\n";

pub fn run(names: &[String], jobs: Option<usize>) -> Result<()> {
    let st = prepare(names, jobs)?.status().context("running gpum-e2e")?;
    if !st.success() {
        bail!("gpum-e2e: {st}");
    }
    Ok(())
}

/// Steps 1 and 2 (the builds and the stage); returns the runner's command (step 3), not yet
/// started: `cargo xtask test` runs it beside its suites.
pub fn prepare(names: &[String], jobs: Option<usize>) -> Result<Command> {
    let e2e = target_dir().join("e2e");
    let bin = e2e.join("bin");
    fs::create_dir_all(&bin)?;
    let debug = target_dir().join("debug");
    let version = env!("CARGO_PKG_VERSION");
    let version_b = bump_patch(version, 1)?;

    // The e2e release key, made once and kept: its public part is compiled into the agents, so
    // a new key per run would rebuild them every run.
    let key = e2e_key(&e2e.join("release-key"))?;
    let key_asc = String::from_utf8(key.public.clone()).context("the armored key is text")?;
    let trust = [
        ("GPUM_DIST_RELEASE_KEY_ASC", key_asc.as_str()),
        ("GPUM_DIST_RELEASE_FINGERPRINT", key.fingerprint.as_str()),
    ];

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
            "-p",
            "gpum-repo-keys",
            "--features",
            "gpum-install/test-knobs,gpum-repo-keys/dist-key",
        ],
        &trust,
    )?;
    copy(&debug.join("gpum-install"), &bin.join("gpum-install"))?;
    copy(&debug.join("gpum-agent"), &bin.join("gpum-agent"))?;
    // Version B: the one extra build of the upgrade scenarios, copied out before the next build
    // overwrites it. Its other crates have the features the build above unified into A (the
    // installer's turns on gpum-preflight's), so only gpum-enroll and gpum-agent compile again,
    // and B differs from A in its version alone.
    let mut env_b = trust.to_vec();
    env_b.push(("GPUM_TEST_AGENT_VERSION", version_b.as_str()));
    cargo_linted(
        &[
            "build",
            "--locked",
            "-p",
            "gpum-agent",
            "-p",
            "gpum-repo-keys",
            "-p",
            "gpum-preflight",
            "--features",
            "gpum-agent/test-next-version,gpum-repo-keys/dist-key,gpum-preflight/test-knobs",
        ],
        &env_b,
    )?;
    copy(&debug.join("gpum-agent"), &bin.join("gpum-agent-b"))?;
    // The same build as `cargo xtask test` (which runs first in CI), so nothing is rebuilt: the
    // platform with its test clock (`TEST_FEATURES`), and the runner `gpum-e2e`.
    cargo_linted(crate::DEBUG_BUILD, &[])?;

    let stage = e2e.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    for d in ["bin", "dist", "dist-tampered", "tls", "releases"] {
        fs::create_dir_all(stage.join(d))?;
    }
    strip(&debug.join("gpum-platform"), &stage.join("bin/gpum-platform"))?;
    strip(&bin.join("gpum-install"), &stage.join("dist/gpum-install"))?;
    strip(&bin.join("gpum-agent"), &stage.join("dist/gpum-agent"))?;

    // The e2e release key's public part goes into the stage for the test-knobs installer.
    fs::write(stage.join("release.asc"), &key.public)?;
    fs::write(stage.join("release.fingerprint"), &key.fingerprint)?;
    let expires = crate::sign::expires_in_days(crate::sign::DEFAULT_EXPIRES_DAYS);
    let files = ["gpum-install", "gpum-agent"].map(|n| stage.join("dist").join(n)).to_vec();
    crate::sign::sign_with(&key.cert, version, expires, &files)?;
    stage_releases(&stage.join("releases"), &key.cert, &bin.join("gpum-agent-b"), expires)?;
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
    cmd.args(names).current_dir(workspace_root());
    Ok(cmd)
}

/// The e2e release key: the certificate with its secret, its armored public part and its
/// fingerprint.
struct E2eKey {
    cert: sequoia_openpgp::Cert,
    public: Vec<u8>,
    fingerprint: String,
}

/// The e2e release key kept in `dir` (`gpum-release.key`, 0600, and `gpum-release.asc`), made on
/// first use. A throwaway key for test hosts only: `target/` is never committed nor shipped.
fn e2e_key(dir: &Path) -> Result<E2eKey> {
    use sequoia_openpgp::serialize::SerializeInto;
    let k = dir.join("gpum-release.key");
    if !k.exists() {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir)?;
        let (secret, _) = crate::sign::generate("gpum e2e throwaway release key (not for production)")?;
        let tmp = dir.join("gpum-release.key.new");
        crate::sign::write_new(&tmp, &secret, 0o600)?;
        fs::rename(&tmp, &k)?;
    }
    let cert = crate::sign::secret_cert(&fs::read(&k).with_context(|| format!("reading {}", k.display()))?)?;
    let public = cert.clone().strip_secret_key_material().armored().to_vec()?;
    fs::write(dir.join("gpum-release.asc"), &public)?;
    let fingerprint = cert.fingerprint().to_hex();
    Ok(E2eKey { cert, public, fingerprint })
}

/// `version` with its patch number `n` up: `0.1.0` → `0.1.1` for `n = 1`.
fn bump_patch(version: &str, n: u64) -> Result<String> {
    let parts: Vec<&str> = version.split('.').collect();
    let [major, minor, patch] = parts[..] else { bail!("{version:?} is not MAJOR.MINOR.PATCH") };
    let patch: u64 = patch.parse().with_context(|| format!("{version:?}: the patch is not a number"))?;
    Ok(format!("{major}.{minor}.{}", patch + n))
}

/// Writes [`RELEASES`] into `dir` (see there), all signed with `cert`.
fn stage_releases(dir: &Path, cert: &sequoia_openpgp::Cert, agent_b: &Path, expires: u64) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let version = env!("CARGO_PKG_VERSION");
    let one = |name: &str, version: &str, agent: Option<&Path>| -> Result<PathBuf> {
        let d = dir.join(name);
        fs::create_dir_all(&d)?;
        let f = d.join("gpum-agent");
        match agent {
            Some(a) => strip(a, &f)?,
            None => fs::write(&f, CANNOT_START)?,
        }
        fs::set_permissions(&f, fs::Permissions::from_mode(0o755))?;
        crate::sign::sign_with(cert, version, expires, std::slice::from_ref(&f))?;
        Ok(f)
    };
    one("b", &bump_patch(version, 1)?, Some(agent_b))?;
    one("bad", &bump_patch(version, 2)?, None)?;
    one("old", OLD_VERSION, None)?;
    let tampered = one("b-tampered", &bump_patch(version, 3)?, Some(agent_b))?;
    tamper(&tampered)?;
    for r in RELEASES {
        if !dir.join(r).join(gpum_repo_keys::release::RELEASE).exists() {
            bail!("releases/{r} was not staged");
        }
    }
    Ok(())
}

/// Changes one byte of the signed `agent` and makes its directory's `manifest.json` and
/// `release.json` again to match (size and SHA-256; the manifest's SHA-256), keeping every
/// signature as it was: consistent files no key signed.
fn tamper(agent: &Path) -> Result<()> {
    use gpum_repo_keys::release::{MANIFEST, Manifest, RELEASE, ReleaseMeta, signing};
    let dir = agent.parent().expect("a file in a directory");
    let mut bytes = fs::read(agent)?;
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    fs::write(agent, &bytes)?;
    let m = Manifest::parse(&fs::read(dir.join(MANIFEST))?)?;
    let entries = m
        .artifacts
        .into_iter()
        .map(|e| if e.name == "gpum-agent" { signing::entry(&e.name, &e.version, &bytes) } else { e })
        .collect();
    let manifest = signing::manifest_json(entries);
    let meta = ReleaseMeta::parse(&fs::read(dir.join(RELEASE))?)?;
    fs::write(dir.join(MANIFEST), &manifest)?;
    fs::write(dir.join(RELEASE), signing::release_json(&meta.version, meta.expires, &manifest))?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_repo_keys::release::{
        MANIFEST, MANIFEST_SIG, RELEASE, RELEASE_SIG, ReleaseError, ReleaseKeys, verify_upgrade,
    };

    #[test]
    fn bump_patch_counts_up() {
        assert_eq!(bump_patch("0.1.0", 1).unwrap(), "0.1.1");
        assert_eq!(bump_patch("1.2.9", 3).unwrap(), "1.2.12");
        assert!(bump_patch("1.2", 1).is_err());
    }

    /// What the upgrade scenarios rely on, checked with the agent's own verifier: `b` upgrades
    /// the installed version, `bad` too (it fails only when started), `old` is not newer, and
    /// `b-tampered` is consistent for the platform (sizes, SHA-256s, the manifest's SHA-256) but
    /// fails its signatures.
    #[test]
    fn staged_releases_are_what_the_scenarios_expect() {
        let dir = std::env::temp_dir().join(format!("gpum-xtask-e2e-releases-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (secret, public) = crate::sign::generate("test").unwrap();
        let cert = crate::sign::secret_cert(&secret).unwrap();
        use sequoia_openpgp::serialize::SerializeInto;
        let keys =
            ReleaseKeys::new(&public.armored().to_vec().unwrap(), &[&public.fingerprint().to_hex()]).unwrap();
        let agent_b = dir.join("agent-b");
        fs::write(&agent_b, b"version B of the agent".repeat(100)).unwrap();
        let expires = crate::sign::expires_in_days(30);
        let releases = dir.join("releases");
        stage_releases(&releases, &cert, &agent_b, expires).unwrap();
        let a = env!("CARGO_PKG_VERSION");
        let now = crate::sign::expires_in_days(0);
        let check = |name: &str| {
            let d = releases.join(name);
            let r = |f: &str| fs::read(d.join(f)).unwrap();
            let got = verify_upgrade(
                &keys,
                &r(RELEASE),
                &r(RELEASE_SIG),
                &r(MANIFEST),
                &r(MANIFEST_SIG),
                "gpum-agent",
                a,
                now,
            );
            got.and_then(|(meta, mut v)| {
                v.update(&r("gpum-agent"))?;
                v.finish()?;
                Ok(meta.version)
            })
        };
        assert_eq!(check("b").unwrap(), bump_patch(a, 1).unwrap());
        assert_eq!(fs::read(releases.join("b/gpum-agent")).unwrap(), fs::read(&agent_b).unwrap());
        assert_eq!(check("bad").unwrap(), bump_patch(a, 2).unwrap());
        assert_eq!(fs::read(releases.join("bad/gpum-agent")).unwrap(), CANNOT_START);
        assert!(matches!(check("old"), Err(ReleaseError::NotNewer { .. })), "{:?}", check("old"));
        assert!(
            matches!(check("b-tampered"), Err(ReleaseError::BadSignature(_))),
            "{:?}",
            check("b-tampered")
        );
        // The tampered release is consistent for anyone without the key.
        let t = releases.join("b-tampered");
        let manifest = fs::read(t.join(MANIFEST)).unwrap();
        let m = gpum_repo_keys::release::Manifest::parse(&manifest).unwrap();
        let bytes = fs::read(t.join("gpum-agent")).unwrap();
        assert_ne!(bytes, fs::read(&agent_b).unwrap());
        let e = m.entry("gpum-agent").unwrap();
        assert_eq!(
            e,
            &gpum_repo_keys::release::signing::entry("gpum-agent", &bump_patch(a, 3).unwrap(), &bytes)
        );
        let meta = gpum_repo_keys::release::ReleaseMeta::parse(&fs::read(t.join(RELEASE)).unwrap()).unwrap();
        gpum_repo_keys::release::check_manifest_matches(&meta, &manifest).unwrap();
        assert_eq!(meta.version, e.version);
        fs::remove_dir_all(&dir).unwrap();
    }
}
