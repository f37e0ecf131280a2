//! The run's staging directory, mounted read-only at `/opt/gpum-e2e` in every host.
//!
//! `cargo xtask e2e` makes `bin/gpum-platform`, `dist/`, `dist-tampered/`, `release.asc` and
//! `release.fingerprint` (xtask owns signing); [`Stage::open`] adds `tls/`: a throwaway CA and a
//! certificate for 127.0.0.1 (and [`super::tunnel::PLATFORM_ADDR`], where `rental-tunnel` moves
//! the platform) that the platform serves and the host trusts.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Where the platform's CA is trusted inside a host (the `gpum-test-ca` unit copies it there);
/// the installer gets it as `--ca-file`.
pub const HOST_CA: &str = "/usr/local/share/ca-certificates/gpum-test-ca.crt";

pub struct Stage {
    pub dir: PathBuf,
    /// The release key's primary fingerprint (the test-knobs installer's `release_fingerprint`).
    pub release_fingerprint: String,
}

impl Stage {
    pub fn open(dir: &Path) -> Result<Stage> {
        for f in [
            "bin/gpum-platform",
            "dist/gpum-install",
            "dist/gpum-agent",
            "release.asc",
            "release.fingerprint",
        ] {
            if !dir.join(f).exists() {
                bail!("{} is missing: run `cargo xtask e2e`, which stages it", dir.join(f).display());
            }
        }
        let tls = dir.join("tls");
        fs::create_dir_all(&tls)?;
        if !tls.join("ca.pem").exists() {
            let (ca, cert, key) = make_certs()?;
            fs::write(tls.join("cert.pem"), cert)?;
            // Readable by the platform, which runs as root in the host; a throwaway key.
            fs::write(tls.join("key.pem"), key)?;
            fs::write(tls.join("ca.pem"), ca)?;
        }
        let release_fingerprint = fs::read_to_string(dir.join("release.fingerprint"))
            .context("release.fingerprint")?
            .trim()
            .to_string();
        Ok(Stage { dir: dir.to_path_buf(), release_fingerprint })
    }
}

/// A throwaway CA and a server certificate it signed for 127.0.0.1, localhost and the platform's
/// address in its own network namespace ([`super::tunnel::PLATFORM_ADDR`]):
/// (CA PEM, certificate PEM, key PEM).
fn make_certs() -> Result<(String, String, String)> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gpum e2e test CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        super::tunnel::PLATFORM_ADDR.to_owned(),
    ])?;
    params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}
