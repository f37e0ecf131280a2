//! Verification of an apt `InRelease` file (a cleartext-signed message) against a keyring.
//!
//! apt does this itself with gpgv; doing it here lets the installer check a freshly added
//! repository's metadata with the key it just pinned, before apt is pointed at it, and report a
//! precise cause instead of apt's "NO_PUBKEY"/"EXPKEYSIG" lines. It also lets the tests prove the
//! verifier on real signed data (this crate's `tests/fixtures/` hold real Debian files).

use std::io::Read;
use std::time::SystemTime;

use sequoia_openpgp as openpgp;

use openpgp::cert::CertParser;
use openpgp::parse::Parse;
use openpgp::parse::stream::{MessageLayer, MessageStructure, VerificationHelper, VerifierBuilder};
use openpgp::policy::StandardPolicy;
use openpgp::{Cert, KeyHandle};

/// Why an `InRelease` file was refused.
#[derive(Debug, thiserror::Error)]
pub enum InReleaseError {
    #[error("the keyring does not parse: {0}")]
    Keyring(String),
    #[error("the file is not a cleartext-signed message: {0}")]
    Format(String),
    #[error("no good signature by a key in the keyring: {0}")]
    BadSignature(String),
}

/// Checks the cleartext signature of `inrelease` against the certificates in `keyring` (binary
/// or armored, one or many) at time `now`, and returns the signed text (what apt then parses).
/// At least one signature must be good; Debian signs with several keys, and a keyring that
/// knows only one of them is enough, as with gpgv.
pub fn verify_inrelease(
    inrelease: &[u8],
    keyring: &[u8],
    now: SystemTime,
) -> Result<Vec<u8>, InReleaseError> {
    if !inrelease.trim_ascii_start().starts_with(b"-----BEGIN PGP SIGNED MESSAGE-----") {
        return Err(InReleaseError::Format("missing the -----BEGIN PGP SIGNED MESSAGE----- header".into()));
    }
    let certs: Vec<Cert> = CertParser::from_bytes(keyring)
        .map_err(|e| InReleaseError::Keyring(e.to_string()))?
        .collect::<openpgp::Result<_>>()
        .map_err(|e| InReleaseError::Keyring(e.to_string()))?;
    if certs.is_empty() {
        return Err(InReleaseError::Keyring("no certificate".into()));
    }
    let policy = StandardPolicy::new();
    let helper = Helper { certs };
    let mut v = VerifierBuilder::from_bytes(inrelease)
        .map_err(|e| InReleaseError::Format(e.to_string()))?
        .with_policy(&policy, now, helper)
        .map_err(|e| InReleaseError::BadSignature(e.to_string()))?;
    let mut text = Vec::new();
    // The verifier withholds the end of the data until the signature checked out, and reports a
    // bad signature as a read error.
    v.read_to_end(&mut text).map_err(|e| InReleaseError::BadSignature(e.to_string()))?;
    if !v.message_processed() {
        return Err(InReleaseError::Format("the message did not end".into()));
    }
    Ok(text)
}

struct Helper {
    certs: Vec<Cert>,
}

impl VerificationHelper for Helper {
    fn get_certs(&mut self, _ids: &[KeyHandle]) -> openpgp::Result<Vec<Cert>> {
        Ok(self.certs.clone())
    }

    fn check(&mut self, structure: MessageStructure) -> openpgp::Result<()> {
        let mut errors = Vec::new();
        for layer in structure {
            match layer {
                MessageLayer::SignatureGroup { results } => {
                    for r in results {
                        match r {
                            Ok(_) => return Ok(()),
                            Err(e) => errors.push(e.to_string()),
                        }
                    }
                }
                // A cleartext-signed file has no compression or encryption layer.
                _ => return Err(anyhow::anyhow!("unexpected message layer")),
            }
        }
        if errors.is_empty() {
            errors.push("no signature".into());
        }
        Err(anyhow::anyhow!(errors.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECURITY: &[u8] = include_bytes!("../tests/fixtures/bookworm-security_InRelease");
    const UPDATES: &[u8] = include_bytes!("../tests/fixtures/bookworm-updates_InRelease");
    const DEBIAN_KEYRING: &[u8] = include_bytes!("../tests/fixtures/debian-archive-keyring.gpg");

    /// The fixtures were signed on 2026-11-30; verify them as of 2026-12-01, so the
    /// test does not depend on today's date (Debian's archive keys expire).
    fn when() -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_083_200)
    }

    #[test]
    fn real_debian_inrelease_files_verify() {
        for f in [SECURITY, UPDATES] {
            let text = verify_inrelease(f, DEBIAN_KEYRING, when()).unwrap();
            let text = String::from_utf8(text).unwrap();
            assert!(text.starts_with("Origin: Debian\n"), "{}", &text[..80]);
            assert!(text.contains("\nSHA256:\n"));
        }
    }

    #[test]
    fn one_changed_byte_fails() {
        let s = std::str::from_utf8(SECURITY).unwrap();
        // Change one byte in the signed text: a digit of a hash in the SHA256 list.
        let at = s.find("\nSHA256:\n").unwrap() + 10;
        let mut bad = SECURITY.to_vec();
        bad[at] = if bad[at] == b'0' { b'1' } else { b'0' };
        assert_eq!(bad.iter().zip(SECURITY).filter(|(a, b)| a != b).count(), 1);
        let e = verify_inrelease(&bad, DEBIAN_KEYRING, when()).unwrap_err();
        assert!(matches!(e, InReleaseError::BadSignature(_)), "{e}");
        // And one changed byte in the header line of the text.
        let mut bad = SECURITY.to_vec();
        let at = s.find("Origin: Debian").unwrap();
        bad[at] = b'o';
        assert!(verify_inrelease(&bad, DEBIAN_KEYRING, when()).is_err());
    }

    #[test]
    fn wrong_keyring_fails() {
        let docker = crate::pinned::DOCKER_UBUNTU.key_copy;
        let e = verify_inrelease(SECURITY, docker, when()).unwrap_err();
        assert!(matches!(e, InReleaseError::BadSignature(_)), "{e}");
        assert!(matches!(verify_inrelease(SECURITY, b"", when()), Err(InReleaseError::Keyring(_))));
    }

    #[test]
    fn not_a_signed_message_fails() {
        let e = verify_inrelease(b"Origin: Debian\n", DEBIAN_KEYRING, when()).unwrap_err();
        assert!(matches!(e, InReleaseError::Format(_)));
        // The text without its signature block.
        let s = std::str::from_utf8(SECURITY).unwrap();
        let cut = &s[..s.find("-----BEGIN PGP SIGNATURE-----").unwrap()];
        assert!(verify_inrelease(cut.as_bytes(), DEBIAN_KEYRING, when()).is_err());
    }
}
