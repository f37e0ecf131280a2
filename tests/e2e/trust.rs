//! The trust chain end to end: real HTTP on loopback (a small server in this file), the real
//! download and verification code of `gpum-install`, real files.
//!
//! Every bad input of issue 3, and the swap, rename and rollback of issue 14 (item 11), is served
//! once and must be refused with exit 20, a message that says what was wrong, and no file left
//! behind. The happy path and `TMPDIR=/var/tmp` show that the refusals are not a verifier that
//! refuses everything. The work directory of issue 14 (item 12) is tried against a directory and
//! a symlink that another user prepared.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpum_common::{Failure, Lang};
use gpum_host::RealHost;
use gpum_host::http::{ClientOptions, client_for};
use gpum_install::download::{
    Fetched, MAX_ARTIFACT_BYTES, Wanted, create_private_dir, fetch_repo_key, fetch_verified, work_dir,
};
use gpum_repo_keys::keys::write_keyring;
use gpum_repo_keys::pinned::{DOCKER_UBUNTU, NVIDIA_TOOLKIT, Repo};
use gpum_repo_keys::release::ReleaseKeys;
use gpum_repo_keys::release::signing::{sha256_line, sign_detached, sign_release, throwaway_key};
use sequoia_openpgp as openpgp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the server answers for a path.
#[derive(Clone)]
enum Reply {
    Ok(Vec<u8>),
    /// Announces the full length, sends only the first half, then closes: a dropped download.
    Cut(Vec<u8>),
    /// Announces this many bytes and sends none: a body too large to accept.
    Announce(u64),
}

/// A minimal HTTP/1.1 server on 127.0.0.1: each connection gets one response, then is closed.
/// Unknown paths are 404.
async fn serve(files: HashMap<String, Reply>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let files = Arc::new(files);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else { return };
            let files = files.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req);
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (head, body) = match files.get(&path) {
                    Some(Reply::Ok(b)) => (
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            b.len()
                        ),
                        b.clone(),
                    ),
                    Some(Reply::Cut(b)) => (
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            b.len()
                        ),
                        b[..b.len() / 2].to_vec(),
                    ),
                    Some(Reply::Announce(n)) => (
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"),
                        Vec::new(),
                    ),
                    None => (
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_string(),
                        Vec::new(),
                    ),
                };
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
                let _ = s.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

fn client(base: &str) -> reqwest::Client {
    client_for(base, &ClientOptions { timeout: Some(Duration::from_secs(10)), ..Default::default() }).unwrap()
}

/// Every entry under `dir`, recursively: what a refused download must not leave.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        }
        out.push(p);
    }
    out
}

/// A refusal must be exit 20 with the seed's message in both languages and a reason that
/// contains `why`.
fn assert_refused(f: &Failure, why: &str) {
    assert_eq!(f.code(), 20, "{f:?}");
    let en = f.message(Lang::En);
    let ru = f.message(Lang::Ru);
    assert!(en.starts_with("Could not download or verify the agent:"), "{en}");
    assert!(ru.starts_with("Не удалось скачать или проверить агент:"), "{ru}");
    assert!(en.contains(why), "expected {why:?} in: {en}");
}

// ---------------------------------------------------------------- artifacts

struct Release {
    cert: openpgp::Cert,
    keys: ReleaseKeys,
    binary: Vec<u8>,
}

fn release() -> Release {
    let (cert, public, fpr) = throwaway_key();
    let keys = ReleaseKeys::new(&public, &[&fpr]).unwrap();
    // Big enough to arrive in many chunks.
    let binary: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    Release { cert, keys, binary }
}

impl Release {
    /// The signed manifest of a release holding this agent at 0.1.0: (manifest, signature).
    fn signed(&self) -> (Vec<u8>, Vec<u8>) {
        sign_release(
            &self.cert,
            &[("gpum-agent", "0.1.0", &self.binary), ("gpum-install", "0.1.0", INSTALLER)],
        )
    }
}

/// The installer's bytes in the same release: validly signed, but not the agent.
const INSTALLER: &[u8] = b"#!/bin/sh\necho this is gpum-install, not the agent\n";

const FRESH: Wanted<'static> = Wanted { name: "gpum-agent", installed_version: None, allow_downgrade: false };

/// A `/dl/` directory: the agent (when given) and the manifest and its signature (either may be
/// absent).
fn dl(binary: Option<Reply>, manifest: Option<Vec<u8>>, sig: Option<Vec<u8>>) -> HashMap<String, Reply> {
    let mut files = HashMap::new();
    if let Some(b) = binary {
        files.insert("/dl/gpum-agent".to_string(), b);
    }
    if let Some(m) = manifest {
        files.insert("/dl/manifest.json".into(), Reply::Ok(m));
    }
    if let Some(s) = sig {
        files.insert("/dl/manifest.json.sig".into(), Reply::Ok(s));
    }
    files
}

/// Serves `files`, downloads the agent into a scratch root with the release keys as `wanted`
/// says, and returns the result and the scratch directory.
async fn download(
    r: &Release,
    files: HashMap<String, Reply>,
    wanted: &Wanted<'_>,
) -> (Result<Fetched, Failure>, tempfile::TempDir) {
    let base = serve(files).await;
    let root = tempfile::tempdir().unwrap();
    let host = RealHost::with_root(root.path());
    let res = fetch_verified(
        &host,
        &client(&base),
        &format!("{base}/dl"),
        wanted,
        Path::new("/gpum-agent"),
        0o755,
        &r.keys,
    )
    .await;
    (res, root)
}

async fn refused(r: &Release, files: HashMap<String, Reply>, wanted: &Wanted<'_>, why: &str) {
    let (res, root) = download(r, files, wanted).await;
    assert_refused(&res.unwrap_err(), why);
    assert_eq!(files_under(root.path()), Vec::<PathBuf>::new(), "a refused download left files behind");
}

#[tokio::test]
async fn good_artifact_is_written_0755_after_verification() {
    let r = release();
    let (m, sig) = r.signed();
    let (res, root) = download(&r, dl(Some(Reply::Ok(r.binary.clone())), Some(m), Some(sig)), &FRESH).await;
    let p = root.path().join("gpum-agent");
    let got = res.unwrap();
    assert_eq!(got.path, PathBuf::from("/gpum-agent"));
    assert_eq!(got.version, "0.1.0");
    assert_eq!(std::fs::read(&p).unwrap(), r.binary);
    assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(files_under(root.path()), vec![p], "only the artifact, no temp file");
}

#[tokio::test]
async fn truncated_binary_is_refused() {
    let r = release();
    let (m, sig) = r.signed();
    let short = r.binary[..r.binary.len() - 4096].to_vec();
    refused(&r, dl(Some(Reply::Ok(short)), Some(m), Some(sig)), &FRESH, "the signed manifest").await;
}

#[tokio::test]
async fn dropped_connection_is_refused() {
    let r = release();
    let (m, sig) = r.signed();
    refused(&r, dl(Some(Reply::Cut(r.binary.clone())), Some(m), Some(sig)), &FRESH, "/dl/gpum-agent").await;
}

#[tokio::test]
async fn one_flipped_byte_is_refused() {
    let r = release();
    let (m, sig) = r.signed();
    let mut bad = r.binary.clone();
    bad[1_234_567] ^= 0x01;
    refused(&r, dl(Some(Reply::Ok(bad)), Some(m), Some(sig)), &FRESH, "SHA-256 mismatch").await;
}

#[tokio::test]
async fn signature_by_another_key_is_refused() {
    let r = release();
    let (stranger, _, _) = throwaway_key();
    // The manifest is right; only the signer is wrong.
    let (m, _) = r.signed();
    let sig = sign_detached(&stranger, &m);
    let files = dl(Some(Reply::Ok(r.binary.clone())), Some(m), Some(sig));
    refused(&r, files, &FRESH, "not by a trusted release key").await;
}

#[tokio::test]
async fn valid_signature_over_a_different_manifest_is_refused() {
    let r = release();
    let (m, _) = r.signed();
    let (_, other_sig) = sign_release(&r.cert, &[("gpum-agent", "0.1.0", b"an older agent")]);
    refused(&r, dl(Some(Reply::Ok(r.binary.clone())), Some(m), Some(other_sig)), &FRESH, "bad signature")
        .await;
}

#[tokio::test]
async fn missing_manifest_signature_is_refused() {
    let r = release();
    let (m, _) = r.signed();
    let files = dl(Some(Reply::Ok(r.binary.clone())), Some(m), None);
    refused(&r, files, &FRESH, "manifest.json.sig: HTTP 404").await;
}

#[tokio::test]
async fn missing_manifest_is_refused() {
    let r = release();
    let (_, sig) = r.signed();
    refused(&r, dl(Some(Reply::Ok(r.binary.clone())), None, Some(sig)), &FRESH, "manifest.json: HTTP 404")
        .await;
}

#[tokio::test]
async fn missing_binary_is_refused() {
    let r = release();
    let (m, sig) = r.signed();
    // The manifest and its signature are there; the binary itself is not (404).
    refused(&r, dl(None, Some(m), Some(sig)), &FRESH, "/dl/gpum-agent: HTTP 404").await;
}

#[tokio::test]
async fn oversized_binary_is_refused_before_anything_is_written() {
    let r = release();
    let (m, sig) = r.signed();
    let n = MAX_ARTIFACT_BYTES + 1;
    let why = format!("{n} bytes is larger than the {MAX_ARTIFACT_BYTES}-byte limit");
    refused(&r, dl(Some(Reply::Announce(n)), Some(m), Some(sig)), &FRESH, &why).await;
}

#[tokio::test]
async fn oversized_signature_is_refused() {
    let r = release();
    let (m, _) = r.signed();
    let huge = vec![b'A'; (1 << 20) + 1];
    let files = dl(Some(Reply::Ok(r.binary.clone())), Some(m), Some(huge));
    refused(&r, files, &FRESH, "larger than 1048576 bytes").await;
}

// ---------------------------------------------------------------- issue 14, item 11

/// A download site swaps the agent for another validly signed artifact of the same release
/// (the installer), and offers the per-file checksum and signature that used to be enough, made
/// for the installer's bytes and renamed. The signed manifest says what `gpum-agent` is.
#[tokio::test]
async fn swapped_file_is_refused() {
    let r = release();
    let (m, sig) = r.signed();
    let mut files = dl(Some(Reply::Ok(INSTALLER.to_vec())), Some(m), Some(sig));
    files.insert("/dl/gpum-agent.sha256".into(), Reply::Ok(sha256_line("gpum-agent", INSTALLER)));
    files.insert("/dl/gpum-agent.sig".into(), Reply::Ok(sign_detached(&r.cert, INSTALLER)));
    refused(&r, files, &FRESH, "/dl/gpum-agent: the server announces").await;
}

/// The same swap with a body the size of the agent's: the hash decides.
#[tokio::test]
async fn swapped_file_of_the_same_size_is_refused() {
    let r = release();
    let (m, sig) = r.signed();
    let mut other = INSTALLER.repeat(r.binary.len() / INSTALLER.len() + 1);
    other.truncate(r.binary.len());
    refused(&r, dl(Some(Reply::Ok(other)), Some(m), Some(sig)), &FRESH, "SHA-256 mismatch").await;
}

/// A validly signed release of the installer alone, its installer served as `gpum-agent`: the
/// manifest does not name it `gpum-agent`. Renaming the entry in the manifest breaks the
/// signature.
#[tokio::test]
async fn renamed_artifact_is_refused() {
    let r = release();
    let (m, sig) = sign_release(&r.cert, &[("gpum-install", "0.1.0", INSTALLER)]);
    let files = dl(Some(Reply::Ok(INSTALLER.to_vec())), Some(m.clone()), Some(sig.clone()));
    refused(&r, files, &FRESH, "lists no artifact named gpum-agent").await;

    let renamed = String::from_utf8(m).unwrap().replace("\"gpum-install\"", "\"gpum-agent\"").into_bytes();
    let files = dl(Some(Reply::Ok(INSTALLER.to_vec())), Some(renamed), Some(sig));
    refused(&r, files, &FRESH, "bad signature").await;
}

/// A site serves last release's signed agent (0.1.0) to a machine running 0.2.0: refused, unless
/// the owner asked for the downgrade. The same version is a re-install, and goes.
#[tokio::test]
async fn rollback_is_refused_unless_asked_for() {
    let r = release();
    let (m, sig) = r.signed();
    let files = || dl(Some(Reply::Ok(r.binary.clone())), Some(m.clone()), Some(sig.clone()));
    let installed =
        |v, allow_downgrade| Wanted { name: "gpum-agent", installed_version: Some(v), allow_downgrade };
    refused(&r, files(), &installed("0.2.0", false), "version 0.1.0 is older than the installed 0.2.0").await;
    refused(&r, files(), &installed("not-a-version", false), "is not a version").await;

    for ok in [installed("0.2.0", true), installed("0.1.0", false), installed("0.1.0-rc.1", false)] {
        let (res, root) = download(&r, files(), &ok).await;
        assert_eq!(res.unwrap().version, "0.1.0", "{ok:?}");
        assert_eq!(std::fs::read(root.path().join("gpum-agent")).unwrap(), r.binary);
    }
}

// ---------------------------------------------------------------- issue 14, item 12

/// Another user (uid 65534) prepared what used to be this run's work directory,
/// `$TMPDIR/gpum-install.<pid>`, world-writable, with their own `gpum-agent` inside; and a
/// symlink to it under another name. The work directory is somewhere else, ours, 0700; theirs
/// is left exactly as it was; and neither path can be created as ours. The installer runs as
/// root, and so does this test where it can; otherwise the planted directory is the test user's
/// own (still world-writable), which the old code adopted all the same.
#[test]
fn work_dir_adopts_nothing_another_user_prepared() {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    let other = if euid == 0 { 65534 } else { euid };
    let root = tempfile::tempdir().unwrap();
    let host = RealHost::with_root(root.path());
    let base = host.map(&gpum_install::download::tmp_base(&host));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777)).unwrap();

    let planted = base.join(format!("gpum-install.{}", std::process::id()));
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("gpum-agent"), b"#!/bin/sh\necho owned\n").unwrap();
    for p in [&planted, &planted.join("gpum-agent")] {
        std::os::unix::fs::chown(p, Some(other), Some(other)).unwrap();
    }
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let link = base.join("gpum-install.link");
    std::os::unix::fs::symlink(&planted, &link).unwrap();

    let dir = host.map(&work_dir(&host).unwrap());
    let st = std::fs::symlink_metadata(&dir).unwrap();
    let theirs = std::fs::symlink_metadata(&planted).unwrap();
    assert_ne!(dir, planted, "the prepared directory was adopted");
    assert!(st.file_type().is_dir());
    assert_eq!((st.uid(), st.mode() & 0o7777), (euid, 0o700));
    assert_eq!((theirs.uid(), theirs.mode() & 0o7777), (other, 0o777), "theirs is left as it was");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);

    for p in [&planted, &link] {
        let target = Path::new("/").join(p.strip_prefix(root.path()).unwrap());
        let e = create_private_dir(&host, &target).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{}", p.display());
    }
    assert_eq!(std::fs::symlink_metadata(&planted).unwrap().mode() & 0o7777, 0o777);
}

/// A `$TMPDIR` that others can write to and that is not sticky: anyone could rename the work
/// directory away and put theirs in its place, so none is made there.
#[test]
fn work_dir_refuses_a_tmpdir_others_can_rename_in() {
    let root = tempfile::tempdir().unwrap();
    let host = RealHost::with_root(root.path());
    let base = host.map(&gpum_install::download::tmp_base(&host));
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
    let f = work_dir(&host).unwrap_err();
    assert_refused(&f, "not sticky");
    assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
}

/// `TMPDIR=/var/tmp`, as the seed advises for a noexec `/tmp`: the work directory and the
/// verified agent land under `/var/tmp`, and the agent can be executed from there. The process
/// environment can only be set for a new process, so the test re-runs itself as a child.
#[test]
fn tmpdir_var_tmp_is_honoured() {
    const CHILD: &str = "GPUM_TRUST_TMPDIR_CHILD";
    if std::env::var(CHILD).is_err() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tmpdir_var_tmp_is_honoured", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("TMPDIR", "/var/tmp")
            .output()
            .unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{text}");
        assert!(text.contains("CHILD-OK /var/tmp/gpum-install."), "{text}");
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (cert, public, fpr) = throwaway_key();
        let keys = ReleaseKeys::new(&public, &[&fpr]).unwrap();
        // A real executable, so "allows exec" is tested, not assumed.
        let binary = b"#!/bin/sh\necho agent-ran\n".to_vec();
        let (m, sig) = sign_release(&cert, &[("gpum-agent", "0.1.0", &binary)]);
        let base = serve(dl(Some(Reply::Ok(binary)), Some(m), Some(sig))).await;
        let host = RealHost::new();
        let dir = work_dir(&host).unwrap();
        assert!(dir.starts_with("/var/tmp"), "{}", dir.display());
        let dest = dir.join("gpum-agent");
        let res =
            fetch_verified(&host, &client(&base), &format!("{base}/dl"), &FRESH, &dest, 0o755, &keys).await;
        let ran = res.as_ref().ok().map(|f| std::process::Command::new(&f.path).output().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(res.unwrap().path, dest);
        assert_eq!(String::from_utf8_lossy(&ran.unwrap().stdout), "agent-ran\n");
        println!("CHILD-OK {}", dest.display());
    });
}

// ---------------------------------------------------------------- apt keys

/// Serves `body` as a repository key, fetches it for `repo` and, only when it passed, writes the
/// keyring into a scratch root, as the installer does.
async fn fetch_key(body: Vec<u8>, repo: &Repo) -> (Result<(), Failure>, tempfile::TempDir) {
    let base = serve(HashMap::from([("/gpg".to_string(), Reply::Ok(body))])).await;
    let root = tempfile::tempdir().unwrap();
    let host = RealHost::with_root(root.path());
    let res = match fetch_repo_key(&host, &client(&base), &format!("{base}/gpg"), repo).await {
        Ok(k) => write_keyring(&host, repo, &k).map_err(|e| Failure::Download(e.to_string())),
        Err(f) => Err(f),
    };
    (res, root)
}

async fn key_refused(body: Vec<u8>, repo: &Repo, why: &str) {
    let (res, root) = fetch_key(body, repo).await;
    assert_refused(&res.unwrap_err(), why);
    assert_eq!(files_under(root.path()), Vec::<PathBuf>::new(), "a refused key left files behind");
}

fn another_cert() -> openpgp::Cert {
    openpgp::cert::CertBuilder::general_purpose(Some("someone else")).generate().unwrap().0
}

#[tokio::test]
async fn pinned_keys_are_accepted_and_written_as_binary_keyrings() {
    for repo in [DOCKER_UBUNTU, NVIDIA_TOOLKIT] {
        let (res, root) = fetch_key(repo.key_copy.to_vec(), &repo).await;
        res.unwrap();
        let p = root.path().join(repo.keyring_path().trim_start_matches('/'));
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert!(!std::fs::read(&p).unwrap().starts_with(b"-----"), "apt's .gpg keyring must be binary");
    }
}

#[tokio::test]
async fn wrong_key_is_refused() {
    key_refused(NVIDIA_TOOLKIT.key_copy.to_vec(), &DOCKER_UBUNTU, "is not a pinned one").await;
}

#[tokio::test]
async fn key_with_an_extra_certificate_is_refused() {
    use openpgp::parse::Parse;
    use openpgp::serialize::SerializeInto;
    let mut keyring = openpgp::Cert::from_bytes(DOCKER_UBUNTU.key_copy).unwrap().to_vec().unwrap();
    keyring.extend(another_cert().to_vec().unwrap());
    key_refused(keyring, &DOCKER_UBUNTU, "holds 2 certificates").await;
}

#[tokio::test]
async fn key_whose_signing_keys_are_all_expired_is_refused() {
    use openpgp::serialize::SerializeInto;
    use openpgp::types::KeyFlags;
    let past = SystemTime::now() - Duration::from_secs(30 * 86400);
    let (cert, _) = openpgp::cert::CertBuilder::new()
        .add_userid("expired signer")
        .set_creation_time(past)
        .set_primary_key_flags(KeyFlags::empty().set_certification())
        .add_subkey(KeyFlags::empty().set_signing(), Duration::from_secs(86400), None)
        .generate()
        .unwrap();
    let fpr: &'static str = Box::leak(cert.fingerprint().to_hex().into_boxed_str());
    let repo = Repo { fingerprints: Box::leak(Box::new([fpr])), ..DOCKER_UBUNTU };
    key_refused(cert.armored().to_vec().unwrap(), &repo, "can sign now").await;
}

#[tokio::test]
async fn armored_key_with_garbage_appended_is_refused() {
    let mut body = DOCKER_UBUNTU.key_copy.to_vec();
    body.extend_from_slice(b"\n<script>alert(1)</script>\n");
    key_refused(body, &DOCKER_UBUNTU, "outside its armor block").await;
}

#[tokio::test]
async fn empty_key_file_is_refused() {
    key_refused(Vec::new(), &DOCKER_UBUNTU, "is empty").await;
}

#[tokio::test]
async fn missing_key_is_refused() {
    let base = serve(HashMap::new()).await;
    let host = RealHost::with_root(tempfile::tempdir().unwrap().path());
    let f = fetch_repo_key(&host, &client(&base), &format!("{base}/gpg"), &DOCKER_UBUNTU).await.unwrap_err();
    assert_refused(&f, "HTTP 404");
}

// ---------------------------------------------------------------- the platform check's TLS

/// The dry run's platform check verifies TLS: the real platform over HTTPS with a certificate
/// from a CA the installer does not trust fails the check (and so the audit), naming the
/// certificate problem. With no switch to turn verification off, this is the only outcome.
#[test]
fn platform_check_refuses_an_untrusted_certificate() {
    let p = gpum_tests::platform::TestPlatform::start(Default::default());
    assert!(p.url().starts_with("https://"), "{}", p.url());
    let o = std::process::Command::new(gpum_tests::bin("gpum-install"))
        .args(["--dry-run", "--json", "--lang", "en", "--server", p.url()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(10), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let check = v["checks"].as_array().unwrap().iter().find(|c| c["id"] == "platform").unwrap();
    assert_eq!(check["status"], "fail", "{check}");
    let msg = check["message"].as_str().unwrap().to_lowercase();
    assert!(msg.contains("certificate"), "{msg}");
    assert_eq!(v["ready"], false);
}
