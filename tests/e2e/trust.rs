//! The trust chain end to end: real HTTP on loopback (a small server in this file), the real
//! download and verification code of `gpum-install`, real files.
//!
//! Every bad input of issue 3 is served once and must be refused with exit 20, a message that
//! says what was wrong, and no file left behind. The happy path and `TMPDIR=/var/tmp` show
//! that the refusals are not a verifier that refuses everything.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gpum_common::{Failure, Lang};
use gpum_host::RealHost;
use gpum_host::http::{ClientOptions, client_for};
use gpum_install::download::{MAX_ARTIFACT_BYTES, fetch_repo_key, fetch_verified, work_dir};
use gpum_repo_keys::keys::write_keyring;
use gpum_repo_keys::pinned::{DOCKER_UBUNTU, NVIDIA_TOOLKIT, Repo};
use gpum_repo_keys::release::ReleaseKeys;
use gpum_repo_keys::release::signing::{sign, throwaway_key};
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

/// Serves `binary` with `.sha256` and `.sig` (either may be absent), downloads it into a scratch
/// root with the release keys, and returns the result and the scratch directory.
async fn download(
    r: &Release,
    binary: Reply,
    sum: Option<Vec<u8>>,
    sig: Option<Vec<u8>>,
) -> (Result<PathBuf, Failure>, tempfile::TempDir) {
    let mut files = HashMap::from([("/dl/gpum-agent".to_string(), binary)]);
    if let Some(s) = sum {
        files.insert("/dl/gpum-agent.sha256".into(), Reply::Ok(s));
    }
    if let Some(s) = sig {
        files.insert("/dl/gpum-agent.sig".into(), Reply::Ok(s));
    }
    let base = serve(files).await;
    let root = tempfile::tempdir().unwrap();
    let host = RealHost::with_root(root.path());
    let url = format!("{base}/dl/gpum-agent");
    let res = fetch_verified(&host, &client(&base), &url, Path::new("/gpum-agent"), 0o755, &r.keys).await;
    (res, root)
}

async fn refused(r: &Release, binary: Reply, sum: Option<Vec<u8>>, sig: Option<Vec<u8>>, why: &str) {
    let (res, root) = download(r, binary, sum, sig).await;
    assert_refused(&res.unwrap_err(), why);
    assert_eq!(files_under(root.path()), Vec::<PathBuf>::new(), "a refused download left files behind");
}

#[tokio::test]
async fn good_artifact_is_written_0755_after_verification() {
    let r = release();
    let (sum, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    let (res, root) = download(&r, Reply::Ok(r.binary.clone()), Some(sum), Some(sig)).await;
    let p = root.path().join("gpum-agent");
    assert_eq!(res.unwrap(), PathBuf::from("/gpum-agent"));
    assert_eq!(std::fs::read(&p).unwrap(), r.binary);
    assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(files_under(root.path()), vec![p], "only the artifact, no temp file");
}

#[tokio::test]
async fn truncated_binary_is_refused() {
    let r = release();
    let (sum, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    let short = r.binary[..r.binary.len() - 4096].to_vec();
    refused(&r, Reply::Ok(short), Some(sum), Some(sig), "SHA-256 mismatch").await;
}

#[tokio::test]
async fn dropped_connection_is_refused() {
    let r = release();
    let (sum, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    refused(&r, Reply::Cut(r.binary.clone()), Some(sum), Some(sig), "/dl/gpum-agent").await;
}

#[tokio::test]
async fn one_flipped_byte_is_refused() {
    let r = release();
    let (sum, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    let mut bad = r.binary.clone();
    bad[1_234_567] ^= 0x01;
    refused(&r, Reply::Ok(bad), Some(sum), Some(sig), "SHA-256 mismatch").await;
}

#[tokio::test]
async fn signature_by_another_key_is_refused() {
    let r = release();
    let (stranger, _, _) = throwaway_key();
    // The checksum is right; only the signer is wrong.
    let (sum, sig) = sign(&stranger, &r.binary, "gpum-agent");
    refused(&r, Reply::Ok(r.binary.clone()), Some(sum), Some(sig), "not by a trusted release key").await;
}

#[tokio::test]
async fn valid_signature_over_a_different_file_is_refused() {
    let r = release();
    let (sum, _) = sign(&r.cert, &r.binary, "gpum-agent");
    let (_, other_sig) = sign(&r.cert, b"an older agent", "gpum-agent");
    refused(&r, Reply::Ok(r.binary.clone()), Some(sum), Some(other_sig), "bad signature").await;
}

#[tokio::test]
async fn missing_sig_is_refused() {
    let r = release();
    let (sum, _) = sign(&r.cert, &r.binary, "gpum-agent");
    refused(&r, Reply::Ok(r.binary.clone()), Some(sum), None, "gpum-agent.sig: HTTP 404").await;
}

#[tokio::test]
async fn missing_sha256_is_refused() {
    let r = release();
    let (_, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    refused(&r, Reply::Ok(r.binary.clone()), None, Some(sig), "gpum-agent.sha256: HTTP 404").await;
}

#[tokio::test]
async fn missing_binary_is_refused() {
    let r = release();
    let (sum, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    // The checksum and signature are there; the binary itself is not (404).
    let base = serve(HashMap::from([
        ("/dl/gpum-agent.sha256".to_string(), Reply::Ok(sum)),
        ("/dl/gpum-agent.sig".to_string(), Reply::Ok(sig)),
    ]))
    .await;
    let root = tempfile::tempdir().unwrap();
    let host = RealHost::with_root(root.path());
    let url = format!("{base}/dl/gpum-agent");
    let f = fetch_verified(&host, &client(&base), &url, Path::new("/gpum-agent"), 0o755, &r.keys)
        .await
        .unwrap_err();
    assert_refused(&f, "/dl/gpum-agent: HTTP 404");
    assert_eq!(files_under(root.path()), Vec::<PathBuf>::new());
}

#[tokio::test]
async fn oversized_binary_is_refused_before_anything_is_written() {
    let r = release();
    let (sum, sig) = sign(&r.cert, &r.binary, "gpum-agent");
    let n = MAX_ARTIFACT_BYTES + 1;
    let why = format!("{n} bytes is larger than the {MAX_ARTIFACT_BYTES}-byte limit");
    refused(&r, Reply::Announce(n), Some(sum), Some(sig), &why).await;
}

#[tokio::test]
async fn oversized_signature_is_refused() {
    let r = release();
    let (sum, _) = sign(&r.cert, &r.binary, "gpum-agent");
    let huge = vec![b'A'; (1 << 20) + 1];
    refused(&r, Reply::Ok(r.binary.clone()), Some(sum), Some(huge), "larger than 1048576 bytes").await;
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
        let (sum, sig) = sign(&cert, &binary, "gpum-agent");
        let base = serve(HashMap::from([
            ("/dl/gpum-agent".to_string(), Reply::Ok(binary)),
            ("/dl/gpum-agent.sha256".to_string(), Reply::Ok(sum)),
            ("/dl/gpum-agent.sig".to_string(), Reply::Ok(sig)),
        ]))
        .await;
        let host = RealHost::new();
        let dir = work_dir(&host).unwrap();
        assert!(dir.starts_with("/var/tmp"), "{}", dir.display());
        let dest = dir.join("gpum-agent");
        let res =
            fetch_verified(&host, &client(&base), &format!("{base}/dl/gpum-agent"), &dest, 0o755, &keys)
                .await;
        let ran = res.as_ref().ok().map(|p| std::process::Command::new(p).output().unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(res.unwrap(), dest);
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
