//! Verified downloads: gpum's signed artifacts (the agent binary) and the vendors' apt keys.
//!
//! An artifact is fetched only after the release's signed manifest: `manifest.json` and
//! `manifest.json.sig` first, the signature checked against the release key, then the entry for
//! the artifact asked for ([`Wanted::name`]) and the rollback rule
//! ([`gpum_repo_keys::release::check_version`]). So a missing, unsigned or wrong manifest, an
//! artifact it does not list, or a version older than the installed one stops the install
//! before the large download starts. The body is then hashed while it arrives, bounded by the
//! signed size (and [`MAX_ARTIFACT_BYTES`]), and written as it arrives to a partial file beside
//! the destination ([`Host::create_partial`]: created O_EXCL with the final mode, under a hidden
//! temporary name). Only after its size and SHA-256 equal the signed entry is the partial file
//! fsynced and renamed onto the destination; any failure drops it, which deletes it. So a
//! failure at any point leaves no file behind, partial or whole, and nothing unverified ever has
//! the name the installer executes.
//!
//! The destination directory is a fresh private directory under `$TMPDIR` (`/tmp` when unset),
//! see [`work_dir`]: the installer runs the downloaded agent from there, so the seed's advice for
//! a noexec `/tmp` (`sudo env TMPDIR=/var/tmp bash`) works.
//!
//! Every failure is [`Failure::Download`] (exit 20) with a reason that names the file and the
//! cause.

use std::io;
use std::path::{Path, PathBuf};

use gpum_common::Failure;
use gpum_host::{FileKind, FileStat, Host, env};
use gpum_repo_keys::keys::{self, VerifiedKey};
use gpum_repo_keys::pinned::Repo;
use gpum_repo_keys::release::{MANIFEST, MANIFEST_SIG, ReleaseKeys, verify_manifest};
use rand::RngCore;

pub use gpum_repo_keys::release::Wanted;

/// The largest artifact accepted. gpum binaries are tens of MB; a server that sends more is
/// broken or hostile, and the bound keeps a hostile server from filling the disk.
pub const MAX_ARTIFACT_BYTES: u64 = 256 << 20;
/// The largest manifest, signature or apt key accepted.
const MAX_SMALL_BYTES: u64 = 1 << 20;

/// `$TMPDIR`, or `/tmp` when it is unset or empty.
pub fn tmp_base(host: &dyn Host) -> PathBuf {
    env::tmpdir(host).unwrap_or_else(|| PathBuf::from(env::DEFAULT_TMPDIR))
}

/// A fresh private directory for this run's downloads: `$TMPDIR/gpum-install.<64 random bits>`,
/// made by [`create_private_dir`]. The downloaded agent is about to run as root, so no other
/// user may prepare, swap or write into this directory: the name cannot be guessed, the mkdir
/// adopts nothing that is already there, and the result is checked with `lstat`.
///
/// The whole path must be safe, not only its last component ([`check_tmp_path`]): `$TMPDIR`
/// and every directory above it, up to `/`, must be a directory (not a symlink) owned by root or
/// the current user, and not writable by others unless it is sticky (as `/tmp` and `/var/tmp`
/// are). Whoever owns a directory on the path, or can write to one that is not sticky, can
/// rename what is below it away and put their own tree in its place, work directory and agent
/// included.
pub fn work_dir(host: &dyn Host) -> Result<PathBuf, Failure> {
    let base = tmp_base(host);
    check_tmp_path(host, &base).map_err(|why| {
        Failure::Download(format!("{} cannot hold the work directory: {why}", base.display()))
    })?;
    let mut last = None;
    // A name already taken is a collision (2^-64) or someone planting names: take another.
    for _ in 0..8 {
        let dir = base.join(format!("gpum-install.{:016x}", rand::rngs::OsRng.next_u64()));
        match create_private_dir(host, &dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(Failure::Download(format!("cannot create {}: {e}", dir.display()))),
        }
    }
    Err(Failure::Download(format!(
        "cannot create a work directory under {}: {}",
        base.display(),
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// Creates `dir` with an exclusive mkdir (it fails when anything is there, a symlink included),
/// mode 0700, then checks with `lstat` that what is there now is a directory, not a symlink,
/// owned by the current effective uid, with mode exactly 0700.
pub fn create_private_dir(host: &dyn Host, dir: &Path) -> io::Result<()> {
    host.create_dir_exclusive(dir, 0o700)?;
    let st = host.lstat(dir)?;
    is_private(&st, host.euid()).map_err(|why| io::Error::other(format!("{}: {why}", dir.display())))
}

/// A directory, not a symlink, owned by `euid`, mode exactly 0700.
fn is_private(st: &FileStat, euid: u32) -> Result<(), String> {
    if st.kind != FileKind::Dir || st.uid != euid || st.mode != 0o700 {
        return Err(format!(
            "not a private directory: {:?}, owner {}, mode {:o} (expected a directory of uid {euid}, mode 700)",
            st.kind, st.uid, st.mode
        ));
    }
    Ok(())
}

/// Checks `base` and every directory above it, from `/` down: each must be a directory (not a
/// symlink), owned by root or the current user, and not writable by group or others unless it
/// is sticky. A sticky directory lets no one but an entry's owner rename or remove the entry,
/// and the entry below it is checked in turn, so `/tmp` (1777) holding a root-owned directory
/// is safe; a directory writable by others without the sticky bit, or owned by another user,
/// is not. `base` must be absolute, with no `..`. The reason names the directory at fault.
pub fn check_tmp_path(host: &dyn Host, base: &Path) -> Result<(), String> {
    use std::path::Component;
    if !base.is_absolute() || base.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err("it is not an absolute path without \"..\"; set TMPDIR to one".into());
    }
    let euid = host.euid();
    // From `/` down, so the reason names the highest directory at fault.
    let chain: Vec<&Path> = base.ancestors().collect();
    for dir in chain.into_iter().rev() {
        let d = dir.display();
        let st = host.lstat(dir).map_err(|e| format!("{d}: {e}"))?;
        if st.kind != FileKind::Dir {
            return Err(format!(
                "{d} is a {:?}, not a directory; set TMPDIR to a path without symlinks",
                st.kind
            ));
        }
        if st.uid != 0 && st.uid != euid {
            return Err(format!("{d} belongs to uid {}, neither root nor you", st.uid));
        }
        if st.mode & 0o022 != 0 && st.mode & 0o1000 == 0 {
            return Err(format!("others can write to {d} (mode {:o}) and it is not sticky", st.mode));
        }
    }
    Ok(())
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

/// A verified artifact, in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// `dest`.
    pub path: PathBuf,
    /// The version the signed manifest gives it.
    pub version: String,
    /// Its SHA-256, hex.
    pub sha256: String,
}

/// Downloads the artifact `wanted.name` from the release directory `dl_base` (the platform's
/// `https://…/dl`), verifies it against the release's signed manifest with `keys` at the host's
/// current time, and only then puts it at `dest` with `mode`.
///
/// Refused (exit 20, nothing written): a manifest or signature that is missing, malformed, not
/// by a trusted key or not over these bytes; an artifact the manifest does not list under
/// `wanted.name`; a version older than `wanted.installed_version` without
/// `wanted.allow_downgrade`; a body whose size or SHA-256 differs from the signed entry.
pub async fn fetch_verified(
    host: &dyn Host,
    client: &reqwest::Client,
    dl_base: &str,
    wanted: &Wanted<'_>,
    dest: &Path,
    mode: u32,
    keys: &ReleaseKeys,
) -> Result<Fetched, Failure> {
    fetch_verified_watched(host, client, dl_base, wanted, dest, mode, keys, &mut |_, _| {}).await
}

/// [`fetch_verified`], telling `progress` the artifact's bytes received and its signed size as
/// they arrive (the installer's bar on a terminal).
#[allow(clippy::too_many_arguments)]
pub async fn fetch_verified_watched(
    host: &dyn Host,
    client: &reqwest::Client,
    dl_base: &str,
    wanted: &Wanted<'_>,
    dest: &Path,
    mode: u32,
    keys: &ReleaseKeys,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Fetched, Failure> {
    let base = dl_base.trim_end_matches('/');
    let url = format!("{base}/{}", wanted.name);
    let manifest_url = format!("{base}/{MANIFEST}");
    let sig_url = format!("{base}/{MANIFEST_SIG}");
    let manifest = get_small(client, &manifest_url, MAX_SMALL_BYTES).await?;
    let sig = get_small(client, &sig_url, MAX_SMALL_BYTES).await?;
    let signed = verify_manifest(&manifest, &sig, keys, host.now()).map_err(|e| fail(&manifest_url, e))?;
    let mut verifier = signed.verifier(wanted).map_err(|e| fail(&url, e))?;
    let size = verifier.entry().size;
    if size > MAX_ARTIFACT_BYTES {
        return Err(fail(&url, format!("{size} bytes is larger than the {MAX_ARTIFACT_BYTES}-byte limit")));
    }

    let mut resp = send(client, &url).await?;
    if let Some(n) = resp.content_length() {
        if n > MAX_ARTIFACT_BYTES {
            return Err(fail(&url, format!("{n} bytes is larger than the {MAX_ARTIFACT_BYTES}-byte limit")));
        }
        if n != size {
            return Err(fail(&url, format!("the server announces {n} bytes, the signed manifest {size}")));
        }
    }
    let writing = |e: std::io::Error| fail(&url, format!("writing {}: {e}", dest.display()));
    // Dropped on every early return below, which deletes the partial file.
    let mut partial = host.create_partial(dest, mode).map_err(writing)?;
    let mut received = 0u64;
    progress(received, size);
    while let Some(chunk) = resp.chunk().await.map_err(|e| fail(&url, e))? {
        verifier.update(&chunk).map_err(|e| fail(&url, e))?;
        partial.write_all(&chunk).map_err(writing)?;
        received += chunk.len() as u64;
        progress(received, size);
    }
    let ok = verifier.finish().map_err(|e| fail(&url, e))?;
    partial.commit().map_err(writing)?;
    Ok(Fetched { path: dest.to_path_buf(), version: ok.version, sha256: ok.sha256 })
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

    fn sticky_tmp() -> FileStat {
        FileStat { kind: FileKind::Dir, uid: 0, mode: 0o1777 }
    }

    #[test]
    fn tmpdir_is_honoured_and_defaults_to_tmp() {
        assert_eq!(tmp_base(&FakeHost::new()), PathBuf::from("/tmp"));
        assert_eq!(tmp_base(&FakeHost::new().env_var("TMPDIR", "")), PathBuf::from("/tmp"));
        let h = FakeHost::new().env_var("TMPDIR", "/var/tmp").stat("/var/tmp", sticky_tmp());
        let d = work_dir(&h).unwrap();
        assert!(d.to_string_lossy().starts_with("/var/tmp/gpum-install."), "{}", d.display());
        assert!(h.is_dir(&d));
        assert_eq!(h.lstat(&d).unwrap(), FileStat { kind: FileKind::Dir, uid: 0, mode: 0o700 });
    }

    /// Issue 14, item 12: the name is not the pid (nor anything else one can guess), and two
    /// runs get different directories.
    #[test]
    fn work_dir_name_is_random() {
        let h = FakeHost::new().stat("/tmp", sticky_tmp());
        let (a, b) = (work_dir(&h).unwrap(), work_dir(&h).unwrap());
        assert_ne!(a, b);
        for d in [&a, &b] {
            let suffix = d.file_name().unwrap().to_str().unwrap().strip_prefix("gpum-install.").unwrap();
            assert_eq!(suffix.len(), 16, "{suffix}");
            assert_ne!(suffix, std::process::id().to_string());
        }
    }

    /// Whatever is already at the path is refused, and what the mkdir made is checked: owner,
    /// kind and mode.
    #[test]
    fn private_dir_adopts_nothing() {
        let theirs = FileStat { kind: FileKind::Dir, uid: 65534, mode: 0o700 };
        let link = FileStat { kind: FileKind::Symlink, uid: 65534, mode: 0o777 };
        let h = FakeHost::new().stat("/tmp", sticky_tmp()).stat("/tmp/a", theirs).stat("/tmp/b", link);
        for p in ["/tmp/a", "/tmp/b"] {
            let e = create_private_dir(&h, Path::new(p)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{p}");
        }
        create_private_dir(&h, Path::new("/tmp/c")).unwrap();
        assert_eq!(h.lstat(Path::new("/tmp/a")).unwrap(), theirs, "left as it was");
    }

    /// What the lstat after the mkdir must see; anything else (a swap, a filesystem that
    /// ignores the owner or the mode) is refused.
    #[test]
    fn only_a_0700_directory_of_ours_is_private() {
        let st = |kind, uid, mode| FileStat { kind, uid, mode };
        assert!(is_private(&st(FileKind::Dir, 0, 0o700), 0).is_ok());
        assert!(is_private(&st(FileKind::Dir, 1000, 0o700), 1000).is_ok());
        assert!(is_private(&st(FileKind::Dir, 65534, 0o700), 0).is_err());
        assert!(is_private(&st(FileKind::Symlink, 0, 0o700), 0).is_err());
        assert!(is_private(&st(FileKind::Dir, 0, 0o755), 0).is_err());
        assert!(is_private(&st(FileKind::Dir, 0, 0o1700), 0).is_err());
        assert!(is_private(&st(FileKind::File, 0, 0o700), 0).is_err());
    }

    #[test]
    fn a_tmpdir_others_can_rename_in_is_refused() {
        let cases = [
            (FileStat { kind: FileKind::Dir, uid: 0, mode: 0o777 }, "not sticky"),
            (FileStat { kind: FileKind::Dir, uid: 0, mode: 0o775 }, "not sticky"),
            (FileStat { kind: FileKind::Dir, uid: 1000, mode: 0o1777 }, "neither root nor you"),
            (FileStat { kind: FileKind::Symlink, uid: 0, mode: 0o777 }, "not a directory"),
        ];
        for (st, why) in cases {
            let h = FakeHost::new().env_var("TMPDIR", "/scratch").stat("/scratch", st);
            let f = work_dir(&h).unwrap_err();
            assert_eq!(f.code(), 20);
            let msg = f.message(gpum_common::Lang::En);
            assert!(msg.contains(why), "{why}: {msg}");
            assert!(h.writes().is_empty(), "nothing created under a refused TMPDIR");
        }
        assert!(work_dir(&FakeHost::new().env_var("TMPDIR", "/missing")).is_err());
        // Root's own 0755 directory, and the sticky /tmp, are fine.
        let ok = FakeHost::new().env_var("TMPDIR", "/root/tmp").dir("/root/tmp");
        work_dir(&ok).unwrap();
    }

    /// Issue 29, item 5: not only `$TMPDIR` but every directory above it. Whoever owns one, or
    /// can write to one that is not sticky, can rename `$TMPDIR` away with the work directory
    /// and the verified agent in it, and put their own tree in its place.
    #[test]
    fn a_tmpdir_below_a_directory_others_control_is_refused() {
        let dir = |uid, mode| FileStat { kind: FileKind::Dir, uid, mode };
        let cases = [
            (dir(1000, 0o755), "/scratch belongs to uid 1000, neither root nor you"),
            (dir(0, 0o777), "others can write to /scratch (mode 777) and it is not sticky"),
            (dir(0, 0o775), "others can write to /scratch (mode 775) and it is not sticky"),
            (FileStat { kind: FileKind::Symlink, uid: 0, mode: 0o777 }, "/scratch is a Symlink"),
        ];
        for (parent, why) in cases {
            let h = FakeHost::new()
                .env_var("TMPDIR", "/scratch/tmp")
                .stat("/scratch", parent)
                .stat("/scratch/tmp", sticky_tmp());
            let f = work_dir(&h).unwrap_err();
            assert_eq!(f.code(), 20);
            let msg = f.message(gpum_common::Lang::En);
            assert!(msg.contains(why), "{why}: {msg}");
            assert!(h.writes().is_empty(), "nothing created under a refused TMPDIR");
        }
        // `/` itself is on the path.
        let h = FakeHost::new().stat("/", dir(1000, 0o755)).stat("/tmp", sticky_tmp());
        assert!(work_dir(&h).unwrap_err().message(gpum_common::Lang::En).contains("/ belongs to uid 1000"));
        // Only an absolute path without `..` can be checked for what it names.
        for bad in ["scratch/tmp", "/tmp/../scratch/tmp"] {
            let h = FakeHost::new().env_var("TMPDIR", bad).stat("/scratch/tmp", sticky_tmp()).dir("/tmp");
            assert!(work_dir(&h).unwrap_err().message(gpum_common::Lang::En).contains("\"..\""), "{bad}");
        }
        // A sticky parent, or one of the installing user's own, is fine.
        for (parent, euid) in [(dir(0, 0o1777), 0), (dir(1000, 0o700), 1000)] {
            let h = FakeHost::new()
                .with_euid(euid)
                .env_var("TMPDIR", "/scratch/tmp")
                .stat("/scratch", parent)
                .stat("/scratch/tmp", dir(euid, 0o700));
            work_dir(&h).unwrap();
        }
    }

    /// The same on a real filesystem (a scratch root): a world-writable parent without the
    /// sticky bit, then (as root) a parent of another user, are refused; the same parent made
    /// 0755 and the installing user's is fine.
    #[test]
    #[allow(clippy::disallowed_methods)]
    fn a_real_tmpdir_below_a_parent_others_control_is_refused() {
        use gpum_host::RealHost;
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let host = RealHost::with_root(root.path());
        let (parent, tmp) = (host.map(Path::new("/a")), host.map(Path::new("/a/tmp")));
        std::fs::create_dir_all(&tmp).unwrap();
        let chmod = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        chmod(&tmp, 0o1777);
        chmod(&parent, 0o777);
        let base = Path::new("/a/tmp");
        let why = check_tmp_path(&host, base).unwrap_err();
        assert!(why.contains("others can write to /a (mode 777) and it is not sticky"), "{why}");
        chmod(&parent, 0o755);
        check_tmp_path(&host, base).unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&parent, Some(65534), Some(65534)).unwrap();
            let why = check_tmp_path(&host, base).unwrap_err();
            assert!(why.contains("/a belongs to uid 65534"), "{why}");
        }
    }

    #[test]
    fn failures_are_exit_20_and_name_the_url() {
        let f = fail("https://x/dl/gpum-agent", "HTTP 404 Not Found");
        assert_eq!(f.code(), 20);
        assert!(f.message(gpum_common::Lang::En).contains("https://x/dl/gpum-agent: HTTP 404"));
    }
}
