//! Verification of gpum's own release artifacts: a SHA-256 checksum (`FILE.sha256`) and an
//! OpenPGP detached signature (`FILE.sig`) by a release key whose fingerprint is compiled in.
//!
//! The seed admits that the checksum comes from the same site as the binary, so it only guards
//! against corruption. The signature is what guards against a compromised site: the installer
//! carries the release key ([`GPUM_RELEASE_KEY`]) and its pinned fingerprint
//! ([`GPUM_RELEASE_FINGERPRINTS`]), and the key never lives on the download server.
//!
//! Both checks run over one pass of the data ([`ArtifactVerifier::update`] while downloading):
//! when the signature is a v4 signature over SHA-256 (what `cargo xtask sign` makes), one
//! SHA-256 state serves both the checksum and the signature, so verifying costs about what
//! `sha256sum` costs. Any other hash algorithm gets its own state in the same pass.
//!
//! The functions take the trusted keys as a parameter, so tests use throwaway keys.

use std::time::SystemTime;

use sequoia_openpgp as openpgp;

use openpgp::cert::CertParser;
use openpgp::crypto::hash::Context;
use openpgp::packet::{Packet, Signature};
use openpgp::parse::{PacketParser, PacketParserResult, Parse};
use openpgp::policy::{HashAlgoSecurity, Policy, StandardPolicy};
use openpgp::types::{HashAlgorithm, SignatureType};
use openpgp::{Cert, KeyHandle};

use crate::keys::normalize_fpr;

/// The release key the installer trusts: the public part of the key made by
/// `cargo xtask release-key`. This one is a development key; docs/trust.md says how a real
/// release replaces it.
pub const GPUM_RELEASE_KEY: &[u8] = include_bytes!("../keys/gpum-release.asc");

/// The primary fingerprints a release signature may come from. Both this list and the key above
/// must change for a new key to be trusted; add the new fingerprint before removing the old to
/// rotate without breaking installers in the field.
pub const GPUM_RELEASE_FINGERPRINTS: &[&str] = &["083FEF640C776895BAACA1CE419C6C64FD2AAEA1"];

/// Why an artifact was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReleaseError {
    #[error("no trusted release key: {0}")]
    Keys(String),
    #[error("the checksum file is malformed")]
    ChecksumFile,
    #[error("the signature file is empty or malformed: {0}")]
    SignatureFile(String),
    #[error("SHA-256 mismatch: expected {expected}, got {actual}")]
    Sha256Mismatch { expected: String, actual: String },
    #[error("the signature is not by a trusted release key ({0})")]
    UntrustedSigner(String),
    #[error("bad signature: {0}")]
    BadSignature(String),
}

/// Release keys that passed the fingerprint pin.
#[derive(Debug, Clone)]
pub struct ReleaseKeys {
    certs: Vec<Cert>,
}

impl ReleaseKeys {
    /// Parses `keyring` and keeps the certificates whose primary fingerprint is in `trusted`.
    /// Refuses when none is: a pinned key that is absent is a broken build, not a warning.
    pub fn new(keyring: &[u8], trusted: &[&str]) -> Result<Self, ReleaseError> {
        let trusted: Vec<String> = trusted.iter().map(|f| normalize_fpr(f)).collect();
        let certs: Vec<Cert> = CertParser::from_bytes(keyring)
            .map_err(|e| ReleaseError::Keys(e.to_string()))?
            .collect::<openpgp::Result<Vec<_>>>()
            .map_err(|e| ReleaseError::Keys(e.to_string()))?
            .into_iter()
            .filter(|c| trusted.contains(&c.fingerprint().to_hex()))
            .collect();
        if certs.is_empty() {
            return Err(ReleaseError::Keys(format!(
                "no certificate with a pinned fingerprint ({})",
                trusted.join(", ")
            )));
        }
        Ok(Self { certs })
    }

    /// The key compiled into gpum.
    pub fn gpum() -> Self {
        Self::new(GPUM_RELEASE_KEY, GPUM_RELEASE_FINGERPRINTS)
            .expect("the compiled-in release key matches its pin")
    }
}

/// Parses a `sha256sum`-style line (`<64 hex>  <name>`). When the file names a file, it must be
/// `name`, so a checksum published for one file cannot vouch for another.
pub fn parse_sha256_file(text: &[u8], name: &str) -> Result<[u8; 32], ReleaseError> {
    let text = std::str::from_utf8(text).map_err(|_| ReleaseError::ChecksumFile)?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let line = lines.next().ok_or(ReleaseError::ChecksumFile)?;
    if lines.next().is_some() {
        return Err(ReleaseError::ChecksumFile);
    }
    let mut words = line.split_whitespace();
    let hex = words.next().ok_or(ReleaseError::ChecksumFile)?;
    if let Some(file) = words.next() {
        // sha256sum marks binary mode with a leading '*'.
        if file.trim_start_matches('*') != name || words.next().is_some() {
            return Err(ReleaseError::ChecksumFile);
        }
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex, &mut out).map_err(|_| ReleaseError::ChecksumFile)?;
    Ok(out)
}

/// Parses a detached signature file (armored or binary): one or more signature packets and
/// nothing else.
pub fn parse_signatures(data: &[u8]) -> Result<Vec<Signature>, ReleaseError> {
    let err = |e: String| ReleaseError::SignatureFile(e);
    if data.trim_ascii().is_empty() {
        return Err(err("empty".into()));
    }
    let mut sigs = Vec::new();
    let mut ppr = PacketParser::from_bytes(data).map_err(|e| err(e.to_string()))?;
    while let PacketParserResult::Some(pp) = ppr {
        let (packet, next) = pp.recurse().map_err(|e| err(e.to_string()))?;
        match packet {
            Packet::Signature(s) => sigs.push(s),
            p => return Err(err(format!("unexpected {} packet", p.tag()))),
        }
        ppr = next;
    }
    if sigs.is_empty() {
        return Err(err("no signature".into()));
    }
    Ok(sigs)
}

/// Checks an artifact while its bytes go by: feed every byte to [`update`](Self::update), then
/// call [`finish`](Self::finish). Construct it *before* downloading the artifact, so a missing or
/// malformed `.sha256` or `.sig` stops everything before the large download starts.
pub struct ArtifactVerifier {
    expected: [u8; 32],
    sigs: Vec<Signature>,
    /// SHA-256, prepared for v4 signatures, so it also serves signatures over SHA-256.
    sha256: Context,
    /// Signatures that need another hash state: (index into `sigs`, state).
    others: Vec<(usize, Context)>,
    len: u64,
}

impl ArtifactVerifier {
    pub fn new(sha256_file: &[u8], sig_file: &[u8], name: &str) -> Result<Self, ReleaseError> {
        let expected = parse_sha256_file(sha256_file, name)?;
        let sigs = parse_signatures(sig_file)?;
        let sha256 = HashAlgorithm::SHA256.context().expect("SHA-256 is supported").for_signature(4);
        let mut others = Vec::new();
        for (i, s) in sigs.iter().enumerate() {
            if s.version() == 4 && s.hash_algo() == HashAlgorithm::SHA256 {
                continue;
            }
            let Ok(b) = s.hash_algo().context() else { continue }; // reported at finish
            let mut ctx = b.for_signature(s.version());
            if let Some(salt) = s.salt() {
                ctx.update(salt);
            }
            others.push((i, ctx));
        }
        Ok(Self { expected, sigs, sha256, others, len: 0 })
    }

    pub fn update(&mut self, data: &[u8]) {
        self.sha256.update(data);
        for (_, c) in &mut self.others {
            c.update(data);
        }
        self.len += data.len() as u64;
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks the SHA-256, then that at least one signature is a good binary-document
    /// signature, alive at `now`, by a signing key of a trusted certificate that is valid
    /// (not expired, not revoked) at `now`.
    pub fn finish(self, keys: &ReleaseKeys, now: SystemTime) -> Result<(), ReleaseError> {
        let actual =
            self.sha256.clone().into_digest().map_err(|e| ReleaseError::BadSignature(e.to_string()))?;
        if actual[..] != self.expected[..] {
            return Err(ReleaseError::Sha256Mismatch {
                expected: hex::encode(self.expected),
                actual: hex::encode(actual),
            });
        }
        let policy = StandardPolicy::new();
        let mut why = Vec::new();
        for (i, sig) in self.sigs.iter().enumerate() {
            let ctx = if sig.version() == 4 && sig.hash_algo() == HashAlgorithm::SHA256 {
                Some(self.sha256.clone())
            } else {
                self.others.iter().find(|(j, _)| *j == i).map(|(_, c)| c.clone())
            };
            let Some(ctx) = ctx else {
                why.push(format!("unsupported hash algorithm {}", sig.hash_algo()));
                continue;
            };
            match check_one(sig, ctx, keys, &policy, now) {
                Ok(()) => return Ok(()),
                Err(e) => why.push(e),
            }
        }
        // An untrusted signer is the more useful diagnosis when no signature is even by our key.
        if why.iter().all(|w| w.starts_with("issuer ")) {
            Err(ReleaseError::UntrustedSigner(why.join("; ")))
        } else {
            Err(ReleaseError::BadSignature(why.join("; ")))
        }
    }
}

fn check_one(
    sig: &Signature,
    ctx: Context,
    keys: &ReleaseKeys,
    policy: &dyn Policy,
    now: SystemTime,
) -> Result<(), String> {
    if sig.typ() != SignatureType::Binary {
        return Err(format!("signature type {} is not a binary-document signature", sig.typ()));
    }
    policy.signature(sig, HashAlgoSecurity::CollisionResistance).map_err(|e| e.to_string())?;
    sig.signature_alive(now, std::time::Duration::ZERO).map_err(|e| e.to_string())?;
    let issuers: Vec<KeyHandle> = sig.get_issuers();
    let mut found_key = false;
    for cert in &keys.certs {
        let Ok(vc) = cert.with_policy(policy, now) else { continue };
        if vc.alive().is_err() {
            continue;
        }
        for ka in vc.keys().for_signing().alive().revoked(false).key_handles(issuers.iter()) {
            found_key = true;
            if sig.verify_hash(ka.key(), ctx.clone()).is_ok() {
                return Ok(());
            }
        }
    }
    if found_key {
        Err("the signature does not match the data".into())
    } else {
        Err(format!(
            "issuer {} is not a valid signing key of a trusted release key",
            issuers.iter().map(|h| h.to_hex()).collect::<Vec<_>>().join(",")
        ))
    }
}

/// Verifies a whole artifact held in memory.
pub fn verify_artifact(
    data: &[u8],
    sha256_file: &[u8],
    sig_file: &[u8],
    name: &str,
    keys: &ReleaseKeys,
    now: SystemTime,
) -> Result<(), ReleaseError> {
    let mut v = ArtifactVerifier::new(sha256_file, sig_file, name)?;
    v.update(data);
    v.finish(keys, now)
}

/// The signing side, for development only: `cargo xtask release-key`/`sign` and the tests use
/// it, the installer never does (it holds no secret key). One implementation of "a correctly
/// signed artifact" keeps the tests and the tooling honest with each other.
pub mod signing {
    use super::*;
    use openpgp::cert::{CertBuilder, CipherSuite};
    use openpgp::serialize::SerializeInto;
    use openpgp::serialize::stream::{Armorer, Message, Signer};
    use openpgp::types::KeyFlags;
    use sha2::Digest;
    use std::io::Write;

    /// A throwaway release key: (certificate with secrets, armored public key, fingerprint).
    pub fn throwaway_key() -> (Cert, Vec<u8>, String) {
        generate_key("throwaway release key")
    }

    /// A new Ed25519 release key: certify-only primary, one signing subkey, no expiry.
    /// Returns (certificate with secrets, armored public key, fingerprint).
    pub fn generate_key(userid: &str) -> (Cert, Vec<u8>, String) {
        let (cert, _) = CertBuilder::new()
            .set_cipher_suite(CipherSuite::Cv25519)
            .add_userid(userid)
            .set_primary_key_flags(KeyFlags::empty().set_certification())
            .add_signing_subkey()
            .generate()
            .expect("key generation");
        let public = cert.clone().strip_secret_key_material().armored().to_vec().expect("serialize");
        let fpr = cert.fingerprint().to_hex();
        (cert, public, fpr)
    }

    /// The `.sha256` text and armored detached `.sig` for `data` named `name`.
    pub fn sign(cert: &Cert, data: &[u8], name: &str) -> (Vec<u8>, Vec<u8>) {
        let policy = StandardPolicy::new();
        let key = cert
            .keys()
            .with_policy(&policy, None)
            .secret()
            .for_signing()
            .alive()
            .revoked(false)
            .next()
            .expect("a signing key");
        let keypair = key.key().clone().into_keypair().expect("keypair");
        let mut sig = Vec::new();
        {
            let m = Message::new(&mut sig);
            let m = Armorer::new(m).kind(openpgp::armor::Kind::Signature).build().expect("armor");
            let mut w = Signer::new(m, keypair)
                .expect("signer")
                .detached()
                .hash_algo(HashAlgorithm::SHA256)
                .expect("sha256")
                .build()
                .expect("build");
            w.write_all(data).expect("write");
            w.finalize().expect("finalize");
        }
        let sum = format!("{}  {name}\n", hex::encode(sha2::Sha256::digest(data)));
        (sum.into_bytes(), sig)
    }
}

#[cfg(test)]
mod tests {
    use super::signing::{sign, throwaway_key};
    use super::*;

    fn now() -> SystemTime {
        SystemTime::now()
    }

    #[test]
    fn compiled_in_key_matches_its_pin() {
        let k = ReleaseKeys::gpum();
        assert_eq!(k.certs.len(), 1);
        assert!(!GPUM_RELEASE_KEY.windows(10).any(|w| w == b"PRIVATE KE"), "a secret key was committed");
    }

    #[test]
    fn good_artifact_verifies_in_chunks() {
        let (cert, public, fpr) = throwaway_key();
        let keys = ReleaseKeys::new(&public, &[&fpr]).unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (sum, sig) = sign(&cert, &data, "gpum-agent");
        let mut v = ArtifactVerifier::new(&sum, &sig, "gpum-agent").unwrap();
        for c in data.chunks(4096) {
            v.update(c);
        }
        assert_eq!(v.len(), data.len() as u64);
        v.finish(&keys, now()).unwrap();
    }

    #[test]
    fn each_bad_input_is_refused() {
        let (cert, public, fpr) = throwaway_key();
        let keys = ReleaseKeys::new(&public, &[&fpr]).unwrap();
        let data = b"the agent binary".repeat(1000);
        let (sum, sig) = sign(&cert, &data, "a");
        let v = |d: &[u8], s: &[u8], g: &[u8]| verify_artifact(d, s, g, "a", &keys, now());

        // Truncated binary and one flipped byte: checksum mismatch.
        assert!(matches!(v(&data[..data.len() - 1], &sum, &sig), Err(ReleaseError::Sha256Mismatch { .. })));
        let mut flipped = data.clone();
        flipped[100] ^= 1;
        assert!(matches!(v(&flipped, &sum, &sig), Err(ReleaseError::Sha256Mismatch { .. })));
        // The checksum matches but the signature is over another file.
        let other = b"another file".to_vec();
        let (other_sum, other_sig) = sign(&cert, &other, "a");
        assert!(matches!(v(&data, &sum, &other_sig), Err(ReleaseError::BadSignature(_))));
        // A good checksum and a signature by another key.
        let (stranger, _, _) = throwaway_key();
        let (_, stranger_sig) = sign(&stranger, &data, "a");
        assert!(matches!(v(&data, &sum, &stranger_sig), Err(ReleaseError::UntrustedSigner(_))));
        // Missing or empty signature and checksum files.
        assert!(matches!(v(&data, &sum, b""), Err(ReleaseError::SignatureFile(_))));
        assert!(matches!(v(&data, b"", &sig), Err(ReleaseError::ChecksumFile)));
        assert!(matches!(v(&data, b"zz  a\n", &sig), Err(ReleaseError::ChecksumFile)));
        // A checksum published for another file name.
        assert_eq!(v(&other, &other_sum.replace_name("b"), &other_sig), Err(ReleaseError::ChecksumFile));
        // A public key in place of a signature.
        assert!(matches!(v(&data, &sum, &public), Err(ReleaseError::SignatureFile(_))));
        // And the good case, for contrast.
        v(&data, &sum, &sig).unwrap();
    }

    trait ReplaceName {
        fn replace_name(&self, n: &str) -> Vec<u8>;
    }
    impl ReplaceName for Vec<u8> {
        fn replace_name(&self, n: &str) -> Vec<u8> {
            let s = String::from_utf8(self.clone()).unwrap();
            format!("{}  {n}\n", s.split_whitespace().next().unwrap()).into_bytes()
        }
    }

    /// Rotation: one keyring file holding the old and the new key, both pinned; an artifact signed
    /// by either verifies, and one by an unpinned key in the same file does not.
    #[test]
    fn rotation_keyring_with_two_keys() {
        use openpgp::serialize::Serialize;
        let (old, _, old_fpr) = throwaway_key();
        let (new, _, new_fpr) = throwaway_key();
        let (extra, _, _) = throwaway_key();
        let mut armored = Vec::new();
        {
            let mut w = openpgp::armor::Writer::new(&mut armored, openpgp::armor::Kind::PublicKey).unwrap();
            for c in [&old, &new, &extra] {
                c.clone().strip_secret_key_material().serialize(&mut w).unwrap();
            }
            w.finalize().unwrap();
        }
        let keys = ReleaseKeys::new(&armored, &[&old_fpr, &new_fpr]).unwrap();
        assert_eq!(keys.certs.len(), 2);
        for c in [&old, &new] {
            let (sum, sig) = sign(c, b"agent", "a");
            verify_artifact(b"agent", &sum, &sig, "a", &keys, now()).unwrap();
        }
        let (sum, sig) = sign(&extra, b"agent", "a");
        assert!(matches!(
            verify_artifact(b"agent", &sum, &sig, "a", &keys, now()),
            Err(ReleaseError::UntrustedSigner(_))
        ));
    }

    #[test]
    fn untrusted_fingerprint_is_no_key() {
        let (_, public, _) = throwaway_key();
        assert!(matches!(ReleaseKeys::new(&public, GPUM_RELEASE_FINGERPRINTS), Err(ReleaseError::Keys(_))));
        assert!(matches!(ReleaseKeys::new(b"", GPUM_RELEASE_FINGERPRINTS), Err(ReleaseError::Keys(_))));
    }

    #[test]
    fn key_not_yet_valid_is_refused() {
        use std::time::Duration;
        let (cert, public, fpr) = throwaway_key();
        let keys = ReleaseKeys::new(&public, &[&fpr]).unwrap();
        let data = b"x".to_vec();
        let (sum, sig) = sign(&cert, &data, "a");
        // Verified before the key existed: no valid signing key then.
        let before = now() - Duration::from_secs(3600);
        assert!(verify_artifact(&data, &sum, &sig, "a", &keys, before).is_err());
    }

    #[test]
    fn sha256sum_format_variants() {
        let h = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert!(parse_sha256_file(format!("{h}\n").as_bytes(), "x").is_ok());
        assert!(parse_sha256_file(format!("{h} *x\n").as_bytes(), "x").is_ok());
        assert!(parse_sha256_file(format!("{h}  x\n{h}  y\n").as_bytes(), "x").is_err());
        assert!(parse_sha256_file(&h.as_bytes()[..62], "x").is_err());
    }
}
