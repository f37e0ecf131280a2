//! Verified downloads: gpum's signed artifacts (the agent binary) and the vendors' apt keys.
//!
//! An artifact is fetched with its `.sha256` and `.sig` first, so a missing or malformed
//! checksum or signature stops the install before the large download starts. The body is then
//! hashed while it arrives ([`ArtifactVerifier`], one SHA-256 pass serving both the checksum and
//! the signature) and written as it arrives to a partial file beside the destination
//! ([`Host::create_partial`]: created O_EXCL with the final mode, under a hidden temporary name),
//! bounded by [`MAX_ARTIFACT_BYTES`]. Only after every check has passed is the partial file
//! fsynced and renamed onto the destination; any failure drops it, which deletes it. So a failure
//! at any point leaves no file behind, partial or whole, and nothing unverified ever has the name
//! the installer executes.
//!
//! The destination directory is under `$TMPDIR` (`/tmp` when unset), see [`work_dir`]: the
//! installer runs the downloaded agent from there, so the seed's advice for a noexec `/tmp`
//! (`sudo env TMPDIR=/var/tmp bash`) works.
//!
//! Every failure is [`Failure::Download`] (exit 20) with a reason that names the file and the
//! cause.

use std::path::{Path, PathBuf};

use gpum_common::Failure;
use gpum_host::{Host, env};
use gpum_repo_keys::keys::{self, VerifiedKey};
use gpum_repo_keys::pinned::Repo;
use gpum_repo_keys::release::{ArtifactVerifier, ReleaseKeys};

/// The largest artifact accepted. gpum binaries are tens of MB; a server that sends more is
/// broken or hostile, and the bound keeps a hostile server from filling the disk.
pub const MAX_ARTIFACT_BYTES: u64 = 256 << 20;
/// The largest `.sha256`, `.sig` or apt key accepted.
const MAX_SMALL_BYTES: u64 = 1 << 20;

/// `$TMPDIR`, or `/tmp` when it is unset or empty.
pub fn tmp_base(host: &dyn Host) -> PathBuf {
    env::tmpdir(host).unwrap_or_else(|| PathBuf::from(env::DEFAULT_TMPDIR))
}

/// A fresh private directory for this run's downloads, `$TMPDIR/gpum-install.<pid>`, mode 0700
/// (the downloaded agent is about to run as root; nobody else may swap it).
pub fn work_dir(host: &dyn Host) -> Result<PathBuf, Failure> {
    let dir = tmp_base(host).join(format!("gpum-install.{}", std::process::id()));
    host.create_dir_all(&dir, 0o700)
        .map_err(|e| Failure::Download(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

fn fail(url: &str, why: impl std::fmt::Display) -> Failure {
    Failure::Download(format!("{url}: {why}"))
}

/// GETs `url` whole, refusing anything but 200 and anything over `max` bytes.
async fn get_small(client: &reqwest::Client, url: &str, max: u64) -> Result<Vec<u8>, Failure> {
    let mut resp = send(client, url).await?;
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| fail(url, e))? {
        body.extend_from_slice(&chunk);
        if body.len() as u64 > max {
            return Err(fail(url, format!("larger than {max} bytes")));
        }
    }
    Ok(body)
}

async fn send(client: &reqwest::Client, url: &str) -> Result<reqwest::Response, Failure> {
    gpum_host::http::check_url(url).map_err(|e| fail(url, e))?;
    let resp = client.get(url).send().await.map_err(|e| fail(url, e))?;
    if resp.status() != reqwest::StatusCode::OK {
        return Err(fail(url, format!("HTTP {}", resp.status())));
    }
    Ok(resp)
}

/// Downloads `url` with `url.sha256` and `url.sig`, verifies both against `keys` at the host's
/// current time, and only then writes the artifact to `dest` with `mode`. Returns `dest`.
///
/// The name checked against the `.sha256` line is the last path segment of `url`.
pub async fn fetch_verified(
    host: &dyn Host,
    client: &reqwest::Client,
    url: &str,
    dest: &Path,
    mode: u32,
    keys: &ReleaseKeys,
) -> Result<PathBuf, Failure> {
    let name = url.rsplit('/').next().unwrap_or_default();
    let sum_url = format!("{url}.sha256");
    let sig_url = format!("{url}.sig");
    let sum = get_small(client, &sum_url, MAX_SMALL_BYTES).await?;
    let sig = get_small(client, &sig_url, MAX_SMALL_BYTES).await?;
    let mut verifier = ArtifactVerifier::new(&sum, &sig, name).map_err(|e| fail(url, e))?;

    let mut resp = send(client, url).await?;
    if let Some(n) = resp.content_length().filter(|n| *n > MAX_ARTIFACT_BYTES) {
        return Err(fail(url, format!("{n} bytes is larger than the {MAX_ARTIFACT_BYTES}-byte limit")));
    }
    let writing = |e: std::io::Error| fail(url, format!("writing {}: {e}", dest.display()));
    // Dropped on every early return below, which deletes the partial file.
    let mut partial = host.create_partial(dest, mode).map_err(writing)?;
    let mut len: u64 = 0;
    while let Some(chunk) = resp.chunk().await.map_err(|e| fail(url, e))? {
        len += chunk.len() as u64;
        if len > MAX_ARTIFACT_BYTES {
            return Err(fail(url, format!("larger than the {MAX_ARTIFACT_BYTES}-byte limit")));
        }
        verifier.update(&chunk);
        partial.write_all(&chunk).map_err(writing)?;
    }
    verifier.finish(keys, host.now()).map_err(|e| fail(url, e))?;
    partial.commit().map_err(writing)?;
    Ok(dest.to_path_buf())
}

/// Downloads `repo`'s apt key from `url` (normally `repo.key_url`) and verifies it against the
/// pinned fingerprints at the host's current time. Nothing is written; the caller writes the
/// keyring with [`keys::write_keyring`] once the key passed.
pub async fn fetch_repo_key(
    host: &dyn Host,
    client: &reqwest::Client,
    url: &str,
    repo: &Repo,
) -> Result<VerifiedKey, Failure> {
    let data = get_small(client, url, MAX_SMALL_BYTES).await?;
    keys::verify_repo_key(&data, repo, host.now()).map_err(|e| fail(url, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn tmpdir_is_honoured_and_defaults_to_tmp() {
        assert_eq!(tmp_base(&FakeHost::new()), PathBuf::from("/tmp"));
        assert_eq!(tmp_base(&FakeHost::new().env_var("TMPDIR", "")), PathBuf::from("/tmp"));
        let h = FakeHost::new().env_var("TMPDIR", "/var/tmp");
        let d = work_dir(&h).unwrap();
        assert!(d.to_string_lossy().starts_with("/var/tmp/gpum-install."), "{}", d.display());
        assert!(h.is_dir(&d));
    }

    #[test]
    fn failures_are_exit_20_and_name_the_url() {
        let f = fail("https://x/dl/gpum-agent", "HTTP 404 Not Found");
        assert_eq!(f.code(), 20);
        assert!(f.message(gpum_common::Lang::En).contains("https://x/dl/gpum-agent: HTTP 404"));
    }
}
