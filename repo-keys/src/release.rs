//! Verification of gpum's own release artifacts: a signed manifest that binds each artifact's
//! name, version, size and SHA-256, by a release key whose fingerprint is compiled in.
//!
//! A release directory (what the platform serves under `/dl/`) holds the artifacts, a
//! [`MANIFEST`] (`manifest.json`) listing every artifact:
//!
//! ```json
//! {"format": 1, "artifacts": [
//!   {"name": "gpum-agent", "version": "0.1.0", "size": 10482176, "sha256": "9f86d0…"}]}
//! ```
//!
//! and [`MANIFEST_SIG`] (`manifest.json.sig`), an OpenPGP detached signature over the manifest's
//! exact bytes by the release key ([`GPUM_RELEASE_KEY`], pinned by [`GPUM_RELEASE_FINGERPRINTS`];
//! the key never lives on the download server). A signature over a file alone says nothing about
//! what the file is: a validly signed `gpum-install`, or last year's signed `gpum-agent`, would
//! verify as today's agent. The manifest says which bytes are which artifact at which version,
//! so the verifier checks that the file it got is the one it asked for ([`Wanted::name`]) and
//! refuses a version older than the installed one ([`check_version`]) unless asked explicitly.
//!
//! The order is fail-closed and cheap first: the manifest's signature is checked before its JSON
//! is parsed (no parser sees unsigned bytes), the entry and the version rule before the artifact
//! download starts, and the artifact's size and SHA-256 while it arrives
//! ([`ArtifactVerifier::update`]), so one SHA-256 pass is the whole cost of verifying it.
//!
//! The `FILE.sha256` files that `cargo xtask sign` also writes are for `install.sh`, which has no
//! OpenPGP verifier; nothing here reads them.
//!
//! The functions take the trusted keys as a parameter, so tests use throwaway keys.

use std::collections::BTreeSet;
use std::time::SystemTime;

use sequoia_openpgp as openpgp;

use openpgp::cert::CertParser;
use openpgp::crypto::hash::Context;
use openpgp::packet::{Packet, Signature};
use openpgp::parse::{PacketParser, PacketParserResult, Parse};
use openpgp::policy::{HashAlgoSecurity, Policy, StandardPolicy};
use openpgp::types::SignatureType;
use openpgp::{Cert, KeyHandle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::keys::normalize_fpr;

/// The release key the installer trusts: the public part of the key made by
/// `cargo xtask release-key` ([`COMMITTED_RELEASE_KEY`]; a development key today, docs/trust.md
/// says how a real release replaces it), except in a dist built without `--key`: `cargo xtask
/// dist` then signs with its own development key and compiles that key in here
/// (`GPUM_DIST_RELEASE_KEY_ASC` and `GPUM_DIST_RELEASE_FINGERPRINT` at compile time), so that
/// the installer a self-built platform serves trusts that platform's own release and nothing
/// else (docs/release.md, docs/trust.md).
pub const GPUM_RELEASE_KEY: &[u8] = match option_env!("GPUM_DIST_RELEASE_KEY_ASC") {
    Some(k) => k.as_bytes(),
    None => COMMITTED_RELEASE_KEY,
};

/// The committed release key's public part.
pub const COMMITTED_RELEASE_KEY: &[u8] = include_bytes!("../keys/gpum-release.asc");

/// The primary fingerprints a release signature may come from. Both this list and the key above
/// must change for a new key to be trusted; add the new fingerprint before removing the old to
/// rotate without breaking installers in the field.
pub const GPUM_RELEASE_FINGERPRINTS: &[&str] = if option_env!("GPUM_DIST_RELEASE_FINGERPRINT").is_some() {
    DIST_FINGERPRINT
} else {
    COMMITTED_FINGERPRINTS
};

/// The committed key's pinned fingerprints.
pub const COMMITTED_FINGERPRINTS: &[&str] = &["083FEF640C776895BAACA1CE419C6C64FD2AAEA1"];

const DIST_FINGERPRINT: &[&str] = &[match option_env!("GPUM_DIST_RELEASE_FINGERPRINT") {
    Some(f) => f,
    None => "",
}];

// The key and its pin come together, or neither.
const _: () = assert!(
    option_env!("GPUM_DIST_RELEASE_KEY_ASC").is_some()
        == option_env!("GPUM_DIST_RELEASE_FINGERPRINT").is_some(),
    "GPUM_DIST_RELEASE_KEY_ASC and GPUM_DIST_RELEASE_FINGERPRINT are set together"
);

/// The manifest's file name in a release directory.
pub const MANIFEST: &str = "manifest.json";
/// Its detached signature's file name.
pub const MANIFEST_SIG: &str = "manifest.json.sig";
/// The manifest format this code reads. A manifest of another format is refused: a field an old
/// verifier would ignore could be one that restricts what it may accept.
pub const MANIFEST_FORMAT: u32 = 1;

/// Why an artifact was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReleaseError {
    #[error("no trusted release key: {0}")]
    Keys(String),
    #[error("the signature file is empty or malformed: {0}")]
    SignatureFile(String),
    #[error("the signature is not by a trusted release key ({0})")]
    UntrustedSigner(String),
    #[error("bad signature: {0}")]
    BadSignature(String),
    #[error("the signed manifest is malformed: {0}")]
    Manifest(String),
    #[error("the signed manifest lists no artifact named {0}")]
    NotListed(String),
    #[error("{0:?} is not a version (MAJOR.MINOR.PATCH)")]
    Version(String),
    #[error(
        "version {offered} is older than the installed {installed}; a downgrade must be asked for explicitly"
    )]
    Downgrade { offered: String, installed: String },
    #[error("size mismatch: the signed manifest says {expected} bytes, got {actual}")]
    SizeMismatch { expected: u64, actual: u64 },
    #[error("SHA-256 mismatch: expected {expected}, got {actual}")]
    Sha256Mismatch { expected: String, actual: String },
    /// `release.json` expired (issue 47): a platform serving stale metadata is refused.
    #[error("the signed release metadata expired at {expires} (now {now})")]
    Expired { expires: u64, now: u64 },
    /// `release.json` names another manifest than the one served beside it (issue 47).
    #[error("the release metadata and the manifest do not belong together: {0}")]
    MixAndMatch(String),
    /// The offered version is not strictly newer than the running one (issue 47).
    #[error("version {offered} is not newer than the running {running}")]
    NotNewer { offered: String, running: String },
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

// ---------------------------------------------------------------------------------- manifest

/// The signed list of a release's artifacts (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    pub artifacts: Vec<ManifestEntry>,
}

/// One artifact: the file name it is served under, its version, its size and its SHA-256
/// (64 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    pub name: String,
    pub version: String,
    pub size: u64,
    pub sha256: String,
}

impl Manifest {
    /// Parses and checks a manifest: the known format, at least one artifact, every name a
    /// plain file name and listed once, every version a semantic version, every SHA-256 64
    /// lowercase hex digits. Call it only on bytes whose signature passed ([`verify_manifest`]).
    pub fn parse(data: &[u8]) -> Result<Self, ReleaseError> {
        let bad = |why: String| ReleaseError::Manifest(why);
        let m: Manifest = serde_json::from_slice(data).map_err(|e| bad(e.to_string()))?;
        if m.format != MANIFEST_FORMAT {
            return Err(bad(format!("format {} (this installer reads format {MANIFEST_FORMAT})", m.format)));
        }
        if m.artifacts.is_empty() {
            return Err(bad("it lists no artifact".into()));
        }
        let mut seen = BTreeSet::new();
        for e in &m.artifacts {
            if !is_plain_name(&e.name) {
                return Err(bad(format!("{:?} is not a plain file name", e.name)));
            }
            if !seen.insert(e.name.as_str()) {
                return Err(bad(format!("{} is listed twice", e.name)));
            }
            parse_version(&e.version)?;
            if e.sha256.len() != 64 || !e.sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(bad(format!("the SHA-256 of {} is not 64 lowercase hex digits", e.name)));
            }
        }
        Ok(m)
    }

    /// The entry for `name`.
    pub fn entry(&self, name: &str) -> Result<&ManifestEntry, ReleaseError> {
        self.artifacts.iter().find(|e| e.name == name).ok_or_else(|| ReleaseError::NotListed(name.into()))
    }
}

/// The names the platform serves under `/dl/`: letters, digits and `.-_+`, no leading dot.
fn is_plain_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 255
        && !n.starts_with('.')
        && n.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+'))
}

fn parse_version(v: &str) -> Result<semver::Version, ReleaseError> {
    semver::Version::parse(v).map_err(|_| ReleaseError::Version(v.into()))
}

/// The rollback rule: `offered` may replace `installed` when it is the same or a newer version
/// (semantic-version precedence; build metadata does not count). An older one is refused unless
/// `allow_downgrade`. With nothing installed any version goes. An installed version that cannot
/// be read is refused too (nothing to compare with is no proof of an upgrade), unless
/// `allow_downgrade`.
pub fn check_version(
    offered: &str,
    installed: Option<&str>,
    allow_downgrade: bool,
) -> Result<(), ReleaseError> {
    let new = parse_version(offered)?;
    let Some(installed) = installed else { return Ok(()) };
    if allow_downgrade {
        return Ok(());
    }
    let old = parse_version(installed.trim())?;
    if new.cmp_precedence(&old) == std::cmp::Ordering::Less {
        return Err(ReleaseError::Downgrade { offered: offered.into(), installed: installed.trim().into() });
    }
    Ok(())
}

/// Which artifact the caller wants, and under which version rule (see [`check_version`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted<'a> {
    /// The artifact's name in the manifest, which is also its file name: `gpum-agent`.
    pub name: &'a str,
    /// The version installed now (`0.1.0`), or `None` on a machine without it.
    pub installed_version: Option<&'a str>,
    /// Accept a version older than the installed one. Only an explicit request sets it.
    pub allow_downgrade: bool,
}

/// A manifest whose signature passed. Only [`verify_manifest`] makes one.
#[derive(Debug, Clone)]
pub struct SignedManifest {
    manifest: Manifest,
}

impl SignedManifest {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Finds `wanted.name`, applies the version rule, and returns the verifier for its bytes.
    /// Call it before downloading the artifact, so a refusal costs no large download.
    pub fn verifier(&self, wanted: &Wanted) -> Result<ArtifactVerifier, ReleaseError> {
        let entry = self.manifest.entry(wanted.name)?;
        check_version(&entry.version, wanted.installed_version, wanted.allow_downgrade)?;
        let mut expected = [0u8; 32];
        hex::decode_to_slice(&entry.sha256, &mut expected).expect("checked by Manifest::parse");
        Ok(ArtifactVerifier { entry: entry.clone(), expected, sha256: Sha256::new(), len: 0 })
    }
}

/// Checks `sig_file` (a detached signature) over `manifest`'s exact bytes against `keys` at
/// `now`, and only then parses it.
pub fn verify_manifest(
    manifest: &[u8],
    sig_file: &[u8],
    keys: &ReleaseKeys,
    now: SystemTime,
) -> Result<SignedManifest, ReleaseError> {
    verify_detached(manifest, sig_file, keys, now)?;
    Ok(SignedManifest { manifest: Manifest::parse(manifest)? })
}

// ---------------------------------------------------------------------------------- artifact

/// Checks an artifact's bytes while they go by: feed every byte to [`update`](Self::update),
/// then call [`finish`](Self::finish). Made by [`SignedManifest::verifier`].
#[derive(Debug, Clone)]
pub struct ArtifactVerifier {
    entry: ManifestEntry,
    expected: [u8; 32],
    sha256: Sha256,
    len: u64,
}

/// An artifact that passed: the signed entry it matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedArtifact {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

impl ArtifactVerifier {
    /// The signed entry being checked against.
    pub fn entry(&self) -> &ManifestEntry {
        &self.entry
    }

    /// Hashes `data`. Refuses as soon as more bytes arrive than the signed size, so a hostile
    /// server cannot make the caller store more than that.
    pub fn update(&mut self, data: &[u8]) -> Result<(), ReleaseError> {
        self.len += data.len() as u64;
        if self.len > self.entry.size {
            return Err(ReleaseError::SizeMismatch { expected: self.entry.size, actual: self.len });
        }
        self.sha256.update(data);
        Ok(())
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks the size and the SHA-256 against the signed entry.
    pub fn finish(self) -> Result<VerifiedArtifact, ReleaseError> {
        if self.len != self.entry.size {
            return Err(ReleaseError::SizeMismatch { expected: self.entry.size, actual: self.len });
        }
        let actual = self.sha256.finalize();
        if actual[..] != self.expected[..] {
            return Err(ReleaseError::Sha256Mismatch {
                expected: self.entry.sha256.clone(),
                actual: hex::encode(actual),
            });
        }
        Ok(VerifiedArtifact { name: self.entry.name, version: self.entry.version, sha256: self.entry.sha256 })
    }
}

/// Verifies a whole artifact held in memory against a manifest and its signature.
pub fn verify_artifact(
    data: &[u8],
    manifest: &[u8],
    manifest_sig: &[u8],
    wanted: &Wanted,
    keys: &ReleaseKeys,
    now: SystemTime,
) -> Result<VerifiedArtifact, ReleaseError> {
    let mut v = verify_manifest(manifest, manifest_sig, keys, now)?.verifier(wanted)?;
    v.update(data)?;
    v.finish()
}

// ---------------------------------------------------------------------------- release.json
// Issue 47. MINIMAL VERSION written by the agent helper so the agent builds against the
// design's contract (`verify_release(keys, data, sig, now_unix) -> ReleaseMeta`); the keys
// helper's fuller version replaces this block at merge.

/// The signed release metadata's file name (issue 47), beside [`MANIFEST`].
pub const RELEASE: &str = "release.json";
/// Its detached signature's file name.
pub const RELEASE_SIG: &str = "release.json.sig";
/// The `release.json` format this code reads.
pub const RELEASE_FORMAT: u32 = 1;

/// `release.json`: `{"format":1,"version":"0.2.0","expires":<unix secs>,"manifest_sha256":"<hex>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseDoc {
    format: u32,
    version: String,
    expires: u64,
    manifest_sha256: String,
}

/// Signed release metadata that passed [`verify_release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseMeta {
    pub version: String,
    /// Unix seconds after which it is refused.
    pub expires: u64,
    /// SHA-256 (64 lowercase hex digits) of the exact bytes of the release's `manifest.json`.
    pub manifest_sha256: String,
}

/// The manifest served with `meta` must be the one it names: SHA-256 of `manifest_bytes` equal
/// to `meta.manifest_sha256`, else [`ReleaseError::MixAndMatch`].
pub fn check_manifest_matches(meta: &ReleaseMeta, manifest_bytes: &[u8]) -> Result<(), ReleaseError> {
    let actual = hex::encode(Sha256::digest(manifest_bytes));
    if actual != meta.manifest_sha256 {
        return Err(ReleaseError::MixAndMatch(format!(
            "release {} names manifest {}, got one of {actual}",
            meta.version, meta.manifest_sha256
        )));
    }
    Ok(())
}

/// Checks `sig` over `data` (`release.json`'s exact bytes) first, then parses it: the known
/// format, a semantic version, a SHA-256, and `expires > now_unix` (else
/// [`ReleaseError::Expired`]).
pub fn verify_release(
    keys: &ReleaseKeys,
    data: &[u8],
    sig: &[u8],
    now_unix: u64,
) -> Result<ReleaseMeta, ReleaseError> {
    let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(now_unix);
    verify_detached(data, sig, keys, now)?;
    let bad = |why: String| ReleaseError::Manifest(format!("release.json: {why}"));
    let d: ReleaseDoc = serde_json::from_slice(data).map_err(|e| bad(e.to_string()))?;
    if d.format != RELEASE_FORMAT {
        return Err(bad(format!("format {} (this agent reads format {RELEASE_FORMAT})", d.format)));
    }
    parse_version(&d.version)?;
    if d.manifest_sha256.len() != 64
        || !d.manifest_sha256.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return Err(bad("manifest_sha256 is not 64 lowercase hex digits".into()));
    }
    if d.expires <= now_unix {
        return Err(ReleaseError::Expired { expires: d.expires, now: now_unix });
    }
    Ok(ReleaseMeta { version: d.version, expires: d.expires, manifest_sha256: d.manifest_sha256 })
}

/// The upgrade's version rule (issue 47): `offered` must be strictly newer than `running`
/// (semantic-version precedence); equal, older or unreadable is refused.
pub fn check_newer(offered: &str, running: &str) -> Result<(), ReleaseError> {
    let new = parse_version(offered)?;
    let old = parse_version(running.trim())?;
    if new.cmp_precedence(&old) != std::cmp::Ordering::Greater {
        return Err(ReleaseError::NotNewer { offered: offered.into(), running: running.trim().into() });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------- signatures

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

/// At least one signature in `sig_file` must be a good binary-document signature over `data`,
/// alive at `now`, by a signing key of a trusted certificate that is valid (not expired, not
/// revoked) at `now`.
pub fn verify_detached(
    data: &[u8],
    sig_file: &[u8],
    keys: &ReleaseKeys,
    now: SystemTime,
) -> Result<(), ReleaseError> {
    let sigs = parse_signatures(sig_file)?;
    let policy = StandardPolicy::new();
    let mut why = Vec::new();
    for sig in &sigs {
        let Ok(builder) = sig.hash_algo().context() else {
            why.push(format!("unsupported hash algorithm {}", sig.hash_algo()));
            continue;
        };
        let mut ctx = builder.for_signature(sig.version());
        if let Some(salt) = sig.salt() {
            ctx.update(salt);
        }
        ctx.update(data);
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

/// The signing side, for development only: `cargo xtask release-key`/`sign` and the tests use
/// it, the installer never does (it holds no secret key). One implementation of "a correctly
/// signed release" keeps the tests and the tooling honest with each other.
pub mod signing {
    use super::*;
    use openpgp::cert::{CertBuilder, CipherSuite};
    use openpgp::serialize::SerializeInto;
    use openpgp::serialize::stream::{Armorer, Message, Signer};
    use openpgp::types::{HashAlgorithm, KeyFlags};
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

    /// The manifest entry for `data` published as `name` at `version`.
    pub fn entry(name: &str, version: &str, data: &[u8]) -> ManifestEntry {
        ManifestEntry {
            name: name.into(),
            version: version.into(),
            size: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
        }
    }

    /// The manifest's bytes: entries sorted by name, pretty-printed, a final newline.
    pub fn manifest_json(mut entries: Vec<ManifestEntry>) -> Vec<u8> {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let m = Manifest { format: MANIFEST_FORMAT, artifacts: entries };
        let mut out = serde_json::to_vec_pretty(&m).expect("a manifest serializes");
        out.push(b'\n');
        out
    }

    /// An armored detached signature over `data` (v4, SHA-256) by `cert`'s signing key.
    pub fn sign_detached(cert: &Cert, data: &[u8]) -> Vec<u8> {
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
        sig
    }

    /// A signed release of `(name, version, bytes)` artifacts: the manifest and its signature.
    pub fn sign_release(cert: &Cert, artifacts: &[(&str, &str, &[u8])]) -> (Vec<u8>, Vec<u8>) {
        let manifest = manifest_json(artifacts.iter().map(|(n, v, d)| entry(n, v, d)).collect());
        let sig = sign_detached(cert, &manifest);
        (manifest, sig)
    }

    /// `release.json`'s bytes for `version`, `expires` (unix seconds) and `manifest`'s bytes
    /// (issue 47; minimal version, see [`super::verify_release`]).
    pub fn release_json(version: &str, expires: u64, manifest: &[u8]) -> Vec<u8> {
        let d = ReleaseDoc {
            format: RELEASE_FORMAT,
            version: version.into(),
            expires,
            manifest_sha256: hex::encode(Sha256::digest(manifest)),
        };
        let mut out = serde_json::to_vec(&d).expect("release.json serializes");
        out.push(b'\n');
        out
    }

    /// The `sha256sum` line for `data` named `name` (the `.sha256` file `install.sh` checks).
    pub fn sha256_line(name: &str, data: &[u8]) -> Vec<u8> {
        format!("{}  {name}\n", hex::encode(Sha256::digest(data))).into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::signing::{entry, manifest_json, sign_detached, sign_release, throwaway_key};
    use super::*;

    fn now() -> SystemTime {
        SystemTime::now()
    }

    fn want(name: &str) -> Wanted<'_> {
        Wanted { name, installed_version: None, allow_downgrade: false }
    }

    struct Rel {
        cert: Cert,
        keys: ReleaseKeys,
    }

    fn rel() -> Rel {
        let (cert, public, fpr) = throwaway_key();
        Rel { keys: ReleaseKeys::new(&public, &[&fpr]).unwrap(), cert }
    }

    #[test]
    fn compiled_in_key_matches_its_pin() {
        let k = ReleaseKeys::gpum();
        assert_eq!(k.certs.len(), 1);
        // A build without a dist's own key trusts the committed one.
        if option_env!("GPUM_DIST_RELEASE_FINGERPRINT").is_none() {
            assert_eq!(
                (GPUM_RELEASE_KEY, GPUM_RELEASE_FINGERPRINTS),
                (COMMITTED_RELEASE_KEY, COMMITTED_FINGERPRINTS)
            );
        } else {
            assert_ne!(GPUM_RELEASE_FINGERPRINTS, COMMITTED_FINGERPRINTS);
        }
        assert!(!GPUM_RELEASE_KEY.windows(10).any(|w| w == b"PRIVATE KE"), "a secret key was committed");
    }

    #[test]
    fn good_artifact_verifies_in_chunks() {
        let r = rel();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (m, sig) =
            sign_release(&r.cert, &[("gpum-agent", "0.1.0", &data), ("gpum-install", "0.1.0", b"i")]);
        let mut v = verify_manifest(&m, &sig, &r.keys, now()).unwrap().verifier(&want("gpum-agent")).unwrap();
        for c in data.chunks(4096) {
            v.update(c).unwrap();
        }
        assert_eq!(v.len(), data.len() as u64);
        let ok = v.finish().unwrap();
        assert_eq!((ok.name.as_str(), ok.version.as_str()), ("gpum-agent", "0.1.0"));
    }

    /// Issue 14, item 11: a validly signed file of another name does not verify as the one asked
    /// for, whether it is served in its place or listed in its place.
    #[test]
    fn a_signed_file_of_another_name_is_refused() {
        let r = rel();
        let (agent, installer) = (b"the agent".to_vec(), b"the installer".to_vec());
        let (m, sig) =
            sign_release(&r.cert, &[("gpum-agent", "0.1.0", &agent), ("gpum-install", "0.1.0", &installer)]);
        // The installer's bytes served as the agent.
        let got = verify_artifact(&installer, &m, &sig, &want("gpum-agent"), &r.keys, now());
        assert!(
            matches!(got, Err(ReleaseError::SizeMismatch { .. } | ReleaseError::Sha256Mismatch { .. })),
            "{got:?}"
        );
        // Same size, so the hash decides.
        let same_len = b"the agenT".to_vec();
        let got = verify_artifact(&same_len, &m, &sig, &want("gpum-agent"), &r.keys, now());
        assert!(matches!(got, Err(ReleaseError::Sha256Mismatch { .. })), "{got:?}");
        // A signed release that lists only the installer.
        let (m1, sig1) = sign_release(&r.cert, &[("gpum-install", "0.1.0", &installer)]);
        let got = verify_artifact(&installer, &m1, &sig1, &want("gpum-agent"), &r.keys, now());
        assert_eq!(got, Err(ReleaseError::NotListed("gpum-agent".into())));
        // The manifest edited to rename the installer's entry: its signature no longer holds.
        let renamed = String::from_utf8(m1).unwrap().replace("gpum-install", "gpum-agent").into_bytes();
        let got = verify_artifact(&installer, &renamed, &sig1, &want("gpum-agent"), &r.keys, now());
        assert!(matches!(got, Err(ReleaseError::BadSignature(_))), "{got:?}");
        verify_artifact(&agent, &m, &sig, &want("gpum-agent"), &r.keys, now()).unwrap();
    }

    /// Issue 14, item 11: an older signed release is refused over a newer installed one, unless
    /// a downgrade is asked for.
    #[test]
    fn rollback_is_refused_unless_asked_for() {
        let r = rel();
        let old = b"agent 0.0.9".to_vec();
        let (m, sig) = sign_release(&r.cert, &[("gpum-agent", "0.0.9", &old)]);
        let w = |installed, allow_downgrade| Wanted {
            name: "gpum-agent",
            installed_version: installed,
            allow_downgrade,
        };
        let got = verify_artifact(&old, &m, &sig, &w(Some("0.1.0"), false), &r.keys, now());
        assert_eq!(got, Err(ReleaseError::Downgrade { offered: "0.0.9".into(), installed: "0.1.0".into() }));
        verify_artifact(&old, &m, &sig, &w(Some("0.1.0"), true), &r.keys, now()).unwrap();
        verify_artifact(&old, &m, &sig, &w(Some("0.0.9"), false), &r.keys, now()).unwrap();
        verify_artifact(&old, &m, &sig, &w(None, false), &r.keys, now()).unwrap();
    }

    #[test]
    fn version_rule() {
        assert!(check_version("0.2.0", Some("0.1.9"), false).is_ok());
        assert!(check_version("0.10.0", Some("0.9.0"), false).is_ok(), "numeric, not lexical");
        assert!(check_version("1.0.0", Some("1.0.0-rc.1"), false).is_ok());
        assert!(check_version("1.0.0-rc.1", Some("1.0.0"), false).is_err(), "a pre-release is older");
        assert!(
            check_version("1.0.0+build.2", Some("1.0.0+build.9"), false).is_ok(),
            "build metadata is ignored"
        );
        assert!(check_version("0.9.0", Some(" 0.10.0\n"), false).is_err());
        // Unreadable versions fail closed.
        assert_eq!(
            check_version("0.1.0", Some("latest"), false),
            Err(ReleaseError::Version("latest".into()))
        );
        assert!(check_version("0.1.0", Some("latest"), true).is_ok());
        assert!(check_version("1.0", None, false).is_err());
    }

    #[test]
    fn each_bad_input_is_refused() {
        let r = rel();
        let data = b"the agent binary".repeat(1000);
        let (m, sig) = sign_release(&r.cert, &[("a", "1.0.0", &data)]);
        let v = |d: &[u8], m: &[u8], s: &[u8]| verify_artifact(d, m, s, &want("a"), &r.keys, now());

        // Truncated, extended and one flipped byte.
        assert!(matches!(v(&data[..data.len() - 1], &m, &sig), Err(ReleaseError::SizeMismatch { .. })));
        assert!(matches!(v(&[&data[..], b"x"].concat(), &m, &sig), Err(ReleaseError::SizeMismatch { .. })));
        let mut flipped = data.clone();
        flipped[100] ^= 1;
        assert!(matches!(v(&flipped, &m, &sig), Err(ReleaseError::Sha256Mismatch { .. })));
        // A signature over another manifest, and one by another key.
        let (_, other_sig) = sign_release(&r.cert, &[("a", "1.0.0", b"other")]);
        assert!(matches!(v(&data, &m, &other_sig), Err(ReleaseError::BadSignature(_))));
        let (stranger, _, _) = throwaway_key();
        assert!(matches!(v(&data, &m, &sign_detached(&stranger, &m)), Err(ReleaseError::UntrustedSigner(_))));
        // Missing or empty signature, a public key in its place.
        assert!(matches!(v(&data, &m, b""), Err(ReleaseError::SignatureFile(_))));
        assert!(matches!(v(&data, &m, GPUM_RELEASE_KEY), Err(ReleaseError::SignatureFile(_))));
        // One byte of whitespace added to the signed manifest.
        assert!(matches!(v(&data, &[&m[..], b" "].concat(), &sig), Err(ReleaseError::BadSignature(_))));
        // The good case, for contrast.
        v(&data, &m, &sig).unwrap();
    }

    /// A validly signed manifest that breaks a rule is still refused: the signer can make
    /// mistakes, and a verifier that trusted any signed JSON would turn them into installs.
    #[test]
    fn signed_but_malformed_manifests_are_refused() {
        let r = rel();
        let e = entry("a", "1.0.0", b"x");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{\"format\":2,\"artifacts\":[]}".to_vec(), "format 2"),
            (manifest_json(vec![]), "lists no artifact"),
            (manifest_json(vec![e.clone(), e.clone()]), "listed twice"),
            (manifest_json(vec![ManifestEntry { name: "../a".into(), ..e.clone() }]), "plain file name"),
            (manifest_json(vec![ManifestEntry { name: ".a".into(), ..e.clone() }]), "plain file name"),
            (manifest_json(vec![ManifestEntry { version: "v1".into(), ..e.clone() }]), "not a version"),
            (
                manifest_json(vec![ManifestEntry { sha256: e.sha256.to_uppercase(), ..e.clone() }]),
                "lowercase hex",
            ),
            (
                String::from_utf8(manifest_json(vec![e.clone()]))
                    .unwrap()
                    .replace("\"size\"", "\"extra\": 1, \"size\"")
                    .into_bytes(),
                "unknown field",
            ),
            (b"[]".to_vec(), "malformed"),
        ];
        for (m, why) in cases {
            let got = verify_manifest(&m, &sign_detached(&r.cert, &m), &r.keys, now()).unwrap_err();
            assert!(got.to_string().contains(why), "{why}: {got}");
        }
    }

    /// Rotation: one keyring file holding the old and the new key, both pinned; a release signed
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
            let (m, sig) = sign_release(c, &[("a", "1.0.0", b"agent")]);
            verify_artifact(b"agent", &m, &sig, &want("a"), &keys, now()).unwrap();
        }
        let (m, sig) = sign_release(&extra, &[("a", "1.0.0", b"agent")]);
        assert!(matches!(
            verify_artifact(b"agent", &m, &sig, &want("a"), &keys, now()),
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
        let r = rel();
        let (m, sig) = sign_release(&r.cert, &[("a", "1.0.0", b"x")]);
        // Verified before the key existed: no valid signing key then.
        let before = now() - Duration::from_secs(3600);
        assert!(verify_artifact(b"x", &m, &sig, &want("a"), &r.keys, before).is_err());
    }

    /// Issue 47: release.json's signature first, then its expiry; the manifest it names by
    /// SHA-256, and only strictly newer versions.
    #[test]
    fn release_metadata_is_signed_expires_and_names_its_manifest() {
        let r = rel();
        let (m, _) = sign_release(&r.cert, &[("gpum-agent", "0.2.0", b"agent")]);
        let now = now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        let data = signing::release_json("0.2.0", now + 3600, &m);
        let sig = sign_detached(&r.cert, &data);
        let meta = verify_release(&r.keys, &data, &sig, now).unwrap();
        assert_eq!((meta.version.as_str(), meta.expires), ("0.2.0", now + 3600));
        check_manifest_matches(&meta, &m).unwrap();
        assert!(matches!(
            check_manifest_matches(&meta, &[&m[..], b" "].concat()),
            Err(ReleaseError::MixAndMatch(_))
        ));
        assert_eq!(
            verify_release(&r.keys, &data, &sig, now + 3600),
            Err(ReleaseError::Expired { expires: now + 3600, now: now + 3600 })
        );
        let edited = String::from_utf8(data.clone()).unwrap().replace("0.2.0", "0.3.0").into_bytes();
        assert!(matches!(verify_release(&r.keys, &edited, &sig, now), Err(ReleaseError::BadSignature(_))));
        let (stranger, _, _) = throwaway_key();
        assert!(matches!(
            verify_release(&r.keys, &data, &sign_detached(&stranger, &data), now),
            Err(ReleaseError::UntrustedSigner(_))
        ));
        let extra =
            b"{\"format\":1,\"version\":\"0.2.0\",\"expires\":1900000000,\"manifest_sha256\":\"00\",\"x\":1}";
        assert!(verify_release(&r.keys, extra, &sign_detached(&r.cert, extra), now).is_err());
        check_newer("0.2.0", "0.1.9").unwrap();
        for (o, run) in [("0.1.0", "0.1.0"), ("0.0.9", "0.1.0"), ("1.0.0-rc.1", "1.0.0"), ("x", "0.1.0")] {
            assert!(check_newer(o, run).is_err(), "{o} over {run}");
        }
    }

    #[test]
    fn sha256_line_is_sha256sum_format() {
        assert_eq!(
            signing::sha256_line("x", b""),
            b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  x\n"
        );
    }
}
