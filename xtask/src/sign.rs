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
//! `cargo xtask sign --key DIR/gpum-release.key FILE...` writes `FILE.sha256` (sha256sum
//! format) and `FILE.sig` (an armored detached signature over SHA-256, which is what lets the
//! installer verify the checksum and the signature in one pass over the data).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use sequoia_openpgp as openpgp;

use gpum_repo_keys::release::signing;
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

#[derive(Args)]
pub struct SignArgs {
    /// The secret key file made by `cargo xtask release-key`.
    #[arg(long)]
    pub key: PathBuf,
    /// Files to sign.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
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
fn write_new(path: &Path, data: &[u8], mode: u32) -> Result<()> {
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
    for f in &a.files {
        let data = fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let (sum, sig) = sign_bytes(&tsk, &data, &file_name(f))?;
        fs::write(append_ext(f, "sha256"), sum)?;
        fs::write(append_ext(f, "sig"), sig)?;
        println!("signed {}", f.display());
    }
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn append_ext(p: &Path, ext: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// The `.sha256` and `.sig` contents for `data` named `name`, signed with the secret key `tsk`.
pub fn sign_bytes(tsk: &[u8], data: &[u8], name: &str) -> Result<(Vec<u8>, Vec<u8>)> {
    let cert = Cert::from_bytes(tsk).context("parsing the secret key")?;
    if !cert.is_tsk() {
        bail!("the key file holds no secret key");
    }
    Ok(signing::sign(&cert, data, name))
}
