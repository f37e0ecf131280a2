//! Development release keys and artifact signing.
//!
//! `cargo xtask release-key --out DIR` makes an Ed25519 release key (certify-only primary, one
//! signing subkey) and writes `DIR/gpum-release.key` (secret, 0600, unencrypted: it is a
//! development key) and `DIR/gpum-release.asc` (public). DIR must be outside the repository, so
//! a secret key can never be committed by accident. Committing the public part as
//! `repo-keys/keys/gpum-release.asc` and its fingerprint into
//! `gpum_repo_keys::release::GPUM_RELEASE_FINGERPRINTS` is a deliberate, reviewed change
//! (docs/trust.md, "Rotating the release key").
//!
//! `cargo xtask sign --key DIR/gpum-release.key [--version V] FILE...` signs a release: the FILEs
//! must all be in one directory (the one the platform serves as `/dl/`), and it writes there
//! - `manifest.json`: name, version, size and SHA-256 of each FILE (and of the artifacts an
//!   earlier `sign` listed, kept only when their file is still there unchanged);
//! - `manifest.json.sig`: an armored detached signature over the manifest, which is what the
//!   installer verifies (`gpum_repo_keys::release`): it binds each file's bytes to its name and
//!   version, so one signed artifact cannot pass for another, nor an old one for a new one;
//! - `release.json` and `release.json.sig` (issue 47): the release's version (`--version`), an
//!   expiry (`--expires-days` from now, default 30) and the SHA-256 of the manifest written now,
//!   signed by the same key ([`gpum_repo_keys::release::ReleaseMeta`]); what an agent checks
//!   before it upgrades itself to this release (stale metadata, a manifest of another release, a
//!   version not newer than its own are refused). Sign again before it expires to keep offering
//!   the release (`gpum-platform releases add` takes the new files);
//! - `FILE.sha256` beside each FILE (sha256sum format), which `install.sh` checks;
//! - `FILE.sig` beside each FILE, an armored detached signature over the file alone, for people
//!   who check a download by hand (`sqv`, `gpg --verify`; docs/release.md). It says nothing of
//!   which artifact or version the file is: the installer goes by the manifest.
//!
//! `--version` defaults to the workspace version, which every gpum binary reports.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use sequoia_openpgp as openpgp;

use gpum_repo_keys::release::{
    MANIFEST, MANIFEST_SIG, Manifest, ManifestEntry, RELEASE, RELEASE_SIG, ReleaseMeta, signing,
};
use openpgp::Cert;
use openpgp::parse::Parse;
use openpgp::serialize::SerializeInto;

#[derive(Args)]
pub struct ReleaseKeyArgs {
    /// Directory to write the key into; must be outside the repository.
    #[arg(long)]
    pub out: PathBuf,
    /// User ID of the key.
    #[arg(long, default_value = "gpum development release key (not for production)")]
    pub userid: String,
}

/// `cargo xtask sign` (the help text is `after_help` below; the one-line summary is in main.rs).
#[derive(Args)]
#[command(after_help = "Writes, in DIR (the directory of the FILEs, which the platform serves as /dl/):\n  \
    manifest.json      name, version, size and SHA-256 of each FILE\n  \
    manifest.json.sig  the detached signature the installer verifies\n  \
    release.json       the release's version, expiry and the manifest's SHA-256 (agent upgrades)\n  \
    release.json.sig   its detached signature\n  \
    FILE.sha256        beside each FILE, for install.sh\n  \
    FILE.sig           beside each FILE, a detached signature for checking by hand\n\
Signing more files later adds them to the manifest; an earlier entry whose file is gone or\n\
changed is dropped.\n\n\
Example (a test platform's --dist directory):\n  \
    cargo xtask release-key --out /tmp/gpum-key\n  \
    cargo xtask sign --key /tmp/gpum-key/gpum-release.key dist/gpum-install dist/gpum-agent")]
pub struct SignArgs {
    /// The secret key file made by `cargo xtask release-key`.
    #[arg(long)]
    pub key: PathBuf,
    /// The version recorded for the files signed now.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    pub version: String,
    /// Days from now until release.json expires: an agent refuses to upgrade to this release
    /// after that, until it is signed again.
    #[arg(long, default_value_t = DEFAULT_EXPIRES_DAYS, value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub expires_days: u64,
    /// Files to sign, all in one directory (DIR).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// `--expires-days`' default, and `cargo xtask dist`'s.
pub const DEFAULT_EXPIRES_DAYS: u64 = 30;

/// Unix seconds `days` from now: release.json's `expires`.
pub fn expires_in_days(days: u64) -> u64 {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    now + days * 86_400
}

pub fn release_key(a: ReleaseKeyArgs) -> Result<()> {
    let repo = fs::canonicalize(crate::util::workspace_root())?;
    let inside = |p: &Path| p.starts_with(&repo);
    // Checked before creating anything, and again once symlinks can be resolved.
    if inside(&std::path::absolute(&a.out)?) {
        bail!("{} is inside the repository; put the release key elsewhere", a.out.display());
    }
    fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let out = fs::canonicalize(&a.out)?;
    if inside(&out) {
        bail!("{} is inside the repository; put the release key elsewhere", out.display());
    }
    let (secret, public) = generate(&a.userid)?;
    let key_path = out.join("gpum-release.key");
    let pub_path = out.join("gpum-release.asc");
    write_new(&key_path, &secret, 0o600)?;
    write_new(&pub_path, &public.armored().to_vec()?, 0o644)?;
    println!("secret key:  {}", key_path.display());
    println!("public key:  {}", pub_path.display());
    println!("fingerprint: {}", public.fingerprint().to_hex());
    Ok(())
}

/// A new release key: its armored secret form, and the public certificate.
pub fn generate(userid: &str) -> Result<(Vec<u8>, Cert)> {
    let (cert, _, _) = signing::generate_key(userid);
    let secret = cert.as_tsk().armored().to_vec()?;
    Ok((secret, cert.strip_secret_key_material()))
}

/// Creates a file that must not exist yet, with `mode` from the start.
pub fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(())
}

pub fn sign(a: SignArgs) -> Result<()> {
    let tsk = fs::read(&a.key).with_context(|| format!("reading {}", a.key.display()))?;
    sign_with(&secret_cert(&tsk)?, &a.version, expires_in_days(a.expires_days), &a.files)
}

/// Signs `files` (one directory) as release `version` with `cert`, its release.json expiring at
/// `expires` (unix seconds; see the module docs).
pub fn sign_with(cert: &Cert, version: &str, expires: u64, files: &[PathBuf]) -> Result<()> {
    let dir = release_dir(files)?;
    let mut entries = Vec::new();
    for f in files {
        let data = fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let name = file_name(f)?;
        if entries.iter().any(|e: &ManifestEntry| e.name == name) {
            bail!("{name} is given twice");
        }
        fs::write(append_ext(f, "sha256"), signing::sha256_line(&name, &data))?;
        fs::write(append_ext(f, "sig"), signing::sign_detached(cert, &data))?;
        entries.push(signing::entry(&name, version, &data));
    }
    for kept in earlier_entries(&dir, &entries)? {
        entries.push(kept);
    }
    let manifest = signing::manifest_json(entries);
    // Checked as the installer will read it, before anything is signed.
    let parsed = Manifest::parse(&manifest).context("the manifest would be refused")?;
    let sig = signing::sign_detached(cert, &manifest);
    let (release, release_sig) = signing::sign_release_meta(cert, version, expires, &manifest);
    // Read back as the agent will, before anything is written.
    let meta = ReleaseMeta::parse(&release).context("the release metadata would be refused")?;
    fs::write(dir.join(MANIFEST), &manifest)?;
    fs::write(dir.join(MANIFEST_SIG), sig)?;
    fs::write(dir.join(RELEASE), &release)?;
    fs::write(dir.join(RELEASE_SIG), release_sig)?;
    println!("signed {}:", dir.join(MANIFEST).display());
    for e in &parsed.artifacts {
        println!("  {} {} ({} bytes, sha256 {})", e.name, e.version, e.size, e.sha256);
    }
    println!(
        "signed {}: release {}, expires at {} (unix)",
        dir.join(RELEASE).display(),
        meta.version,
        meta.expires
    );
    Ok(())
}

/// The one directory all `files` are in.
fn release_dir(files: &[PathBuf]) -> Result<PathBuf> {
    let dirs: Vec<PathBuf> = files
        .iter()
        .map(|f| {
            let abs = fs::canonicalize(f).with_context(|| format!("reading {}", f.display()))?;
            Ok(abs.parent().expect("a file has a parent").to_path_buf())
        })
        .collect::<Result<_>>()?;
    if dirs.iter().any(|d| d != &dirs[0]) {
        bail!(
            "sign the files of one release directory together (got files in {} and others)",
            dirs[0].display()
        );
    }
    Ok(dirs[0].clone())
}

/// The entries of an existing `dir/manifest.json` for names not signed now, kept only when the
/// file is still there with the same size and SHA-256 (the file is hashed again).
fn earlier_entries(dir: &Path, now: &[ManifestEntry]) -> Result<Vec<ManifestEntry>> {
    let Ok(old) = fs::read(dir.join(MANIFEST)) else { return Ok(Vec::new()) };
    let Ok(old) = Manifest::parse(&old) else {
        eprintln!("replacing {}: it is not a valid manifest", dir.join(MANIFEST).display());
        return Ok(Vec::new());
    };
    let mut kept = Vec::new();
    for e in old.artifacts.into_iter().filter(|e| !now.iter().any(|n| n.name == e.name)) {
        match fs::read(dir.join(&e.name)) {
            Ok(data) if signing::entry(&e.name, &e.version, &data) == e => kept.push(e),
            _ => {
                eprintln!("dropping {} {} from the manifest: its file is gone or changed", e.name, e.version)
            }
        }
    }
    Ok(kept)
}

fn file_name(p: &Path) -> Result<String> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .with_context(|| format!("{} has no file name", p.display()))
}

fn append_ext(p: &Path, ext: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// The certificate with its secret key, from the file `cargo xtask release-key` wrote.
pub fn secret_cert(tsk: &[u8]) -> Result<Cert> {
    let cert = Cert::from_bytes(tsk).context("parsing the secret key")?;
    if !cert.is_tsk() {
        bail!("the key file holds no secret key");
    }
    Ok(cert)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_repo_keys::release::{ReleaseKeys, Wanted, verify_artifact};
    use std::time::SystemTime;

    /// What `sign` writes is what the installer accepts, per name and version; signing one more
    /// file later keeps the earlier, unchanged entries.
    #[test]
    fn sign_writes_a_manifest_the_verifier_accepts() {
        let dir = std::env::temp_dir().join(format!("gpum-xtask-sign-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let (secret, public) = generate("test").unwrap();
        let key = dir.join("k.key");
        fs::write(&key, &secret).unwrap();
        let keys =
            ReleaseKeys::new(&public.armored().to_vec().unwrap(), &[&public.fingerprint().to_hex()]).unwrap();
        let rel = dir.join("dl");
        fs::create_dir_all(&rel).unwrap();
        fs::write(rel.join("gpum-agent"), b"agent").unwrap();
        fs::write(rel.join("gpum-install"), b"installer").unwrap();
        let args = |files: &[&str], version: &str| SignArgs {
            key: key.clone(),
            version: version.into(),
            expires_days: DEFAULT_EXPIRES_DAYS,
            files: files.iter().map(|f| rel.join(f)).collect(),
        };
        sign(args(&["gpum-agent"], "0.2.0")).unwrap();
        sign(args(&["gpum-install"], "0.2.1")).unwrap();
        let m = fs::read(rel.join(MANIFEST)).unwrap();
        let sig = fs::read(rel.join(MANIFEST_SIG)).unwrap();
        let check = |data: &[u8], name| {
            let w = Wanted { name, installed_version: None, allow_downgrade: false };
            verify_artifact(data, &m, &sig, &w, &keys, SystemTime::now()).map(|v| v.version)
        };
        assert_eq!(check(b"agent", "gpum-agent").unwrap(), "0.2.0");
        assert_eq!(check(b"installer", "gpum-install").unwrap(), "0.2.1");
        assert!(check(b"installer", "gpum-agent").is_err());
        // release.json names the last signing's version and the manifest written with it, and
        // the agent's upgrade check accepts the pair.
        let now = expires_in_days(0);
        let meta = gpum_repo_keys::release::verify_release(
            &keys,
            &fs::read(rel.join(RELEASE)).unwrap(),
            &fs::read(rel.join(RELEASE_SIG)).unwrap(),
            now,
        )
        .unwrap();
        assert_eq!(meta.version, "0.2.1");
        assert!(meta.expires >= now + DEFAULT_EXPIRES_DAYS * 86_400 && meta.expires < now + 31 * 86_400);
        gpum_repo_keys::release::check_manifest_matches(&meta, &m).unwrap();

        let sum = fs::read_to_string(rel.join("gpum-agent.sha256")).unwrap();
        assert!(sum.ends_with("  gpum-agent\n"), "{sum}");
        let own = fs::read(rel.join("gpum-agent.sig")).unwrap();
        gpum_repo_keys::release::verify_detached(b"agent", &own, &keys, SystemTime::now()).unwrap();
        assert!(
            gpum_repo_keys::release::verify_detached(b"installer", &own, &keys, SystemTime::now()).is_err()
        );

        // A changed file drops its old entry when another file is signed.
        fs::write(rel.join("gpum-agent"), b"agent, rebuilt").unwrap();
        sign(args(&["gpum-install"], "0.2.1")).unwrap();
        let m = Manifest::parse(&fs::read(rel.join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(m.artifacts.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["gpum-install"]);

        // Files from two directories are refused.
        fs::write(dir.join("elsewhere"), b"x").unwrap();
        let mut two = args(&["gpum-agent"], "0.2.0");
        two.files.push(dir.join("elsewhere"));
        assert!(sign(two).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
