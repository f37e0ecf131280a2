//! Verification of a downloaded apt repository key, and the keyring written from it.
//!
//! A vendor's key URL is one HTTPS fetch away from root on every machine, so the downloaded key
//! is checked before anything is written: it must parse as exactly one certificate (no
//! keyring with a stowaway), its primary fingerprint must be one of the pinned ones, and at
//! least one of its keys must be able to sign *now* (not expired, not revoked) so that apt will
//! not fail later with a confusing `EXPKEYSIG`. Armor must be clean: anything outside the
//! armor block is refused rather than ignored, because a parser that skips junk is a parser an
//! attacker can feed.
//!
//! The keyring is written in binary form (what apt's `Signed-By` expects for `.gpg`) through
//! [`gpum_host::Host::write_atomic`] with mode 0644, whatever the umask, never via `gpg -o`.

use std::path::Path;
use std::time::SystemTime;

use gpum_host::Host;
use sequoia_openpgp as openpgp;

use openpgp::Cert;
use openpgp::cert::CertParser;
use openpgp::parse::Parse;
use openpgp::policy::StandardPolicy;
use openpgp::serialize::SerializeInto;

use crate::pinned::Repo;

/// Why a key was refused. Each says what was wrong with the file, for the log and the message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("the key file is empty")]
    Empty,
    #[error("the key file has data outside its armor block")]
    TrailingData,
    #[error("the key file does not parse as an OpenPGP certificate: {0}")]
    Parse(String),
    #[error("the key file holds {0} certificates, expected exactly one")]
    CertCount(usize),
    #[error("the key's primary fingerprint {found} is not a pinned one ({pinned})")]
    Fingerprint { found: String, pinned: String },
    #[error("no key in certificate {0} can sign now (all signing keys are expired or revoked)")]
    NoValidSigningKey(String),
    #[error("writing the keyring failed: {0}")]
    Write(String),
}

/// A repository key that passed every check.
#[derive(Debug, Clone)]
pub struct VerifiedKey {
    pub cert: Cert,
    /// The primary fingerprint, upper-case hex.
    pub fingerprint: String,
}

impl VerifiedKey {
    /// The binary (unarmored) keyring apt reads through `Signed-By:`.
    pub fn keyring_bytes(&self) -> Vec<u8> {
        // Serializing a parsed certificate only fails on an internal invariant.
        self.cert.to_vec().expect("a parsed certificate serializes")
    }
}

/// Checks a downloaded key (armored or binary) against the pinned `fingerprints` at time `now`.
pub fn verify_key(data: &[u8], fingerprints: &[&str], now: SystemTime) -> Result<VerifiedKey, KeyError> {
    check_armor_framing(data)?;
    let certs: Vec<Cert> = CertParser::from_bytes(data)
        .map_err(|e| KeyError::Parse(e.to_string()))?
        .collect::<openpgp::Result<Vec<_>>>()
        .map_err(|e| KeyError::Parse(e.to_string()))?;
    if certs.len() != 1 {
        return Err(KeyError::CertCount(certs.len()));
    }
    let cert = certs.into_iter().next().expect("one certificate");
    let fingerprint = cert.fingerprint().to_hex();
    if !fingerprints.iter().any(|f| normalize_fpr(f) == fingerprint) {
        return Err(KeyError::Fingerprint { found: fingerprint, pinned: fingerprints.join(", ") });
    }
    if !can_sign_now(&cert, now) {
        return Err(KeyError::NoValidSigningKey(fingerprint));
    }
    Ok(VerifiedKey { cert, fingerprint })
}

/// Checks `data` for `repo`'s pinned fingerprints.
pub fn verify_repo_key(data: &[u8], repo: &Repo, now: SystemTime) -> Result<VerifiedKey, KeyError> {
    verify_key(data, repo.fingerprints, now)
}

/// Why a keyring file the owner's apt source names is not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyringError {
    /// apt reads `*.asc` as armor and every other name as a binary keyring; gpum accepts only
    /// those two names, each in the form apt will read it.
    #[error("{0}: apt reads a keyring named like this in another form than the file has")]
    Form(String),
    #[error("{0}: {1}")]
    Key(String, KeyError),
}

/// Checks a keyring file that an existing apt source names (`signed-by=PATH`): it must be in
/// the form apt reads for its name (`.asc` armored, `.gpg` binary; any other name is refused),
/// and hold exactly one certificate whose primary fingerprint is one of `fingerprints` and
/// which can sign now: the same rules as a downloaded key ([`verify_key`]), so a keyring with
/// the pinned key and any other key beside it is refused.
pub fn verify_keyring_file(
    path: &str,
    data: &[u8],
    fingerprints: &[&str],
    now: SystemTime,
) -> Result<VerifiedKey, KeyringError> {
    let armored = data.trim_ascii_start().starts_with(b"-----BEGIN PGP PUBLIC KEY BLOCK-----");
    let form_ok = if path.ends_with(".asc") {
        armored
    } else if path.ends_with(".gpg") {
        !data.is_empty() && !data.trim_ascii_start().starts_with(b"-----")
    } else {
        false
    };
    if !form_ok {
        return Err(KeyringError::Form(path.to_string()));
    }
    verify_key(data, fingerprints, now).map_err(|e| KeyringError::Key(path.to_string(), e))
}

/// Whether the certificate is valid at `now` under the standard policy (primary not expired,
/// not revoked) and has at least one signing-capable key that is alive and not revoked.
/// The primary key counts when its self-signature grants signing, which is how the NVIDIA key
/// stays usable although its old signing subkeys expired.
pub(crate) fn can_sign_now(cert: &Cert, now: SystemTime) -> bool {
    let policy = StandardPolicy::new();
    let Ok(vc) = cert.with_policy(&policy, now) else { return false };
    if vc.alive().is_err() || matches!(vc.revocation_status(), openpgp::types::RevocationStatus::Revoked(_)) {
        return false;
    }
    vc.keys().for_signing().alive().revoked(false).next().is_some()
}

/// Upper-case hex, without spaces: how fingerprints are pinned and compared.
pub fn normalize_fpr(f: &str) -> String {
    f.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_uppercase()
}

/// Refuses an empty file, and an armored file with anything but whitespace before the
/// `-----BEGIN` line or after the matching `-----END` line. A binary file has no framing to
/// check; the parser refuses junk in it.
fn check_armor_framing(data: &[u8]) -> Result<(), KeyError> {
    let trimmed = data.trim_ascii();
    if trimmed.is_empty() {
        return Err(KeyError::Empty);
    }
    if !trimmed.starts_with(b"-----") {
        // Binary, or not a key at all: the parser decides. But text before an armor block is
        // junk we refuse, not skip.
        if trimmed.windows(10).any(|w| w == b"-----BEGIN") {
            return Err(KeyError::TrailingData);
        }
        return Ok(());
    }
    let text = std::str::from_utf8(trimmed).map_err(|_| KeyError::TrailingData)?;
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim_end();
    let Some(kind) = first.strip_prefix("-----BEGIN ").and_then(|s| s.strip_suffix("-----")) else {
        return Err(KeyError::Parse("malformed armor header".into()));
    };
    let footer = format!("-----END {kind}-----");
    // The footer must be the last non-blank line, and appear once.
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim_end();
    if last != footer || text.matches(footer.as_str()).count() != 1 {
        return Err(KeyError::TrailingData);
    }
    Ok(())
}

/// Writes the verified key as `repo`'s binary keyring, atomically, mode 0644.
pub fn write_keyring(host: &dyn Host, repo: &Repo, key: &VerifiedKey) -> Result<(), KeyError> {
    let path = repo.keyring_path();
    let dir = Path::new(&path).parent().expect("keyring path has a directory");
    if !host.is_dir(dir) {
        // /etc/apt/keyrings exists on Ubuntu 22.04+, but not on every older or minimal system.
        host.create_dir_all(dir, 0o755).map_err(|e| KeyError::Write(format!("{}: {e}", dir.display())))?;
    }
    host.write_atomic(Path::new(&path), &key.keyring_bytes(), 0o644)
        .map_err(|e| KeyError::Write(format!("{path}: {e}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::pinned::{DOCKER_UBUNTU, NVIDIA_TOOLKIT};
    use openpgp::cert::CertBuilder;
    use openpgp::serialize::SerializeInto;
    use openpgp::types::KeyFlags;
    use std::time::Duration;

    fn now() -> SystemTime {
        SystemTime::now()
    }

    /// A throwaway certificate whose only signing key is a subkey that expired: the primary is
    /// certify-only. Built with signature times in the past so the subkey is really expired now.
    pub(crate) fn cert_with_only_expired_signing() -> Cert {
        let past = SystemTime::now() - Duration::from_secs(10 * 86400);
        let (cert, _) = CertBuilder::new()
            .add_userid("expired signer <expired@example.invalid>")
            .set_creation_time(past)
            .set_primary_key_flags(KeyFlags::empty().set_certification())
            .add_subkey(KeyFlags::empty().set_signing(), Duration::from_secs(86400), None)
            .generate()
            .unwrap();
        cert
    }

    pub(crate) fn signing_cert() -> Cert {
        let (cert, _) = CertBuilder::general_purpose(Some("t <t@example.invalid>")).generate().unwrap();
        cert
    }

    fn armored(c: &Cert) -> Vec<u8> {
        c.armored().to_vec().unwrap()
    }

    #[test]
    fn pinned_docker_key_is_accepted() {
        let k = verify_repo_key(DOCKER_UBUNTU.key_copy, &DOCKER_UBUNTU, now()).unwrap();
        assert_eq!(k.fingerprint, "9DC858229FC7DD38854AE2D88D81803C0EBFCD88");
        // The binary keyring parses back to the same certificate.
        let back = Cert::from_bytes(&k.keyring_bytes()).unwrap();
        assert_eq!(back.fingerprint(), k.cert.fingerprint());
        assert!(!k.keyring_bytes().starts_with(b"-----"));
    }

    #[test]
    fn nvidia_copy_with_expired_subkeys_is_accepted_because_the_primary_signs() {
        let k = verify_repo_key(NVIDIA_TOOLKIT.key_copy, &NVIDIA_TOOLKIT, now()).unwrap();
        assert_eq!(k.fingerprint, "C95B321B61E88C1809C4F759DDCAE044F796ECB0");
        // And indeed every signing *subkey* of this copy is expired.
        let p = StandardPolicy::new();
        let vc = k.cert.with_policy(&p, now()).unwrap();
        assert!(vc.keys().subkeys().for_signing().alive().next().is_none());
    }

    #[test]
    fn wrong_key_is_refused() {
        let e = verify_repo_key(DOCKER_UBUNTU.key_copy, &NVIDIA_TOOLKIT, now()).unwrap_err();
        assert!(matches!(e, KeyError::Fingerprint { .. }), "{e}");
    }

    #[test]
    fn only_expired_signing_keys_is_refused() {
        let c = cert_with_only_expired_signing();
        let fpr = c.fingerprint().to_hex();
        let e = verify_key(&armored(&c), &[&fpr], now()).unwrap_err();
        assert_eq!(e, KeyError::NoValidSigningKey(fpr.clone()));
        // The same certificate was fine while its subkey lived.
        let then = now() - Duration::from_secs(10 * 86400 - 3600);
        assert!(verify_key(&armored(&c), &[&fpr], then).is_ok());
    }

    #[test]
    fn revoked_certificate_is_refused() {
        let (cert, rev) = CertBuilder::general_purpose(Some("r")).generate().unwrap();
        let (cert, _) = cert.insert_packets(rev).unwrap();
        let fpr = cert.fingerprint().to_hex();
        assert_eq!(
            verify_key(&armored(&cert), &[&fpr], now()).unwrap_err(),
            KeyError::NoValidSigningKey(fpr)
        );
    }

    #[test]
    fn two_certificates_are_refused() {
        let mut data = DOCKER_UBUNTU.key_copy.to_vec();
        data.extend_from_slice(&armored(&signing_cert()));
        // Concatenated armor blocks: refused by the framing check before parsing.
        assert!(verify_repo_key(&data, &DOCKER_UBUNTU, now()).is_err());
        // One binary keyring with two certificates: refused by the count.
        let mut bin = Cert::from_bytes(DOCKER_UBUNTU.key_copy).unwrap().to_vec().unwrap();
        bin.extend(signing_cert().to_vec().unwrap());
        assert_eq!(verify_repo_key(&bin, &DOCKER_UBUNTU, now()).unwrap_err(), KeyError::CertCount(2));
        // One armor block holding two certificates: refused by the count.
        let two = format!(
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n{}\n-----END PGP PUBLIC KEY BLOCK-----\n",
            base64_lines(&bin)
        );
        assert_eq!(
            verify_repo_key(two.as_bytes(), &DOCKER_UBUNTU, now()).unwrap_err(),
            KeyError::CertCount(2)
        );
    }

    fn base64_lines(b: &[u8]) -> String {
        use base64::Engine;
        let s = base64::engine::general_purpose::STANDARD.encode(b);
        s.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap()).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn garbage_after_armor_is_refused() {
        let mut data = DOCKER_UBUNTU.key_copy.to_vec();
        data.extend_from_slice(b"\n<html>oops</html>\n");
        assert_eq!(verify_repo_key(&data, &DOCKER_UBUNTU, now()).unwrap_err(), KeyError::TrailingData);
        // Trailing whitespace is fine.
        let mut data = DOCKER_UBUNTU.key_copy.to_vec();
        data.extend_from_slice(b"\n\n  \n");
        assert!(verify_repo_key(&data, &DOCKER_UBUNTU, now()).is_ok());
    }

    #[test]
    fn empty_and_junk_are_refused() {
        assert_eq!(verify_repo_key(b"", &DOCKER_UBUNTU, now()).unwrap_err(), KeyError::Empty);
        assert_eq!(verify_repo_key(b" \n", &DOCKER_UBUNTU, now()).unwrap_err(), KeyError::Empty);
        assert!(matches!(
            verify_repo_key(b"<html>404</html>", &DOCKER_UBUNTU, now()),
            Err(KeyError::Parse(_))
        ));
        // A truncated key.
        let k = DOCKER_UBUNTU.key_copy;
        assert!(verify_repo_key(&k[..k.len() / 2], &DOCKER_UBUNTU, now()).is_err());
    }

    #[test]
    fn fingerprints_compare_without_spaces_or_case() {
        let spaced = "9dc8 5822 9fc7 dd38 854a  e2d8 8d81 803c 0ebf cd88";
        assert!(verify_key(DOCKER_UBUNTU.key_copy, &[spaced], now()).is_ok());
    }

    #[test]
    fn keyring_is_written_0644_atomically_under_a_strict_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let host = gpum_host::RealHost::with_root(dir.path());
        let k = verify_repo_key(DOCKER_UBUNTU.key_copy, &DOCKER_UBUNTU, now()).unwrap();
        // A restrictive umask must not narrow the mode (apt's _apt user reads the keyring).
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let res = write_keyring(&host, &DOCKER_UBUNTU, &k);
        nix::sys::stat::umask(old);
        res.unwrap();
        let p = dir.path().join("etc/apt/keyrings/gpum-docker.gpg");
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert_eq!(std::fs::read(&p).unwrap(), k.keyring_bytes());
        // No temp file left beside it.
        let names: Vec<_> =
            std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from("gpum-docker.gpg")]);
    }
}
