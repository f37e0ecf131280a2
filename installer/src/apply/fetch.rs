//! Step 1: every download and every verification, before anything changes ([`Fetcher`]), and
//! what it verified ([`Verified`]), which the later steps install.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpum_common::Failure;
use gpum_common::agent_state;
use gpum_host::{Cmd, Host, Output};
use gpum_repo_keys::keys::VerifiedKey;
use gpum_repo_keys::pinned::Repo;
use gpum_repo_keys::release::ReleaseKeys;
use gpum_repo_keys::sources;

use super::steps::tail;
use super::{Options, Outcome, Run};
use crate::download;
use crate::knobs::Knobs;
use crate::plan::{Step, UseSource};
use crate::text::{Msg, t};

/// Where the first step's bytes come from: the platform and the vendors over HTTPS
/// ([`NetFetcher`]); unit tests pass one that serves known-good keys and a fake agent, so they
/// can drive every later step over `FakeHost`.
pub trait Fetcher {
    /// Downloads and verifies `repo`'s apt key against its pinned fingerprints.
    fn repo_key(&self, host: &dyn Host, repo: &Repo) -> Result<VerifiedKey, Failure>;
    /// Downloads and verifies the agent into `dest`; returns its signed version and SHA-256,
    /// which the install checks again on the bytes it installs.
    fn agent(
        &self,
        host: &dyn Host,
        wanted: &download::Wanted,
        dest: &Path,
    ) -> Result<download::Fetched, Failure>;
    /// [`Fetcher::agent`], telling `progress` the bytes received and the signed size as they
    /// arrive (the terminal's bar). Without an override, the bar does not move.
    fn agent_watched(
        &self,
        host: &dyn Host,
        wanted: &download::Wanted,
        dest: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<download::Fetched, Failure> {
        let _ = progress;
        self.agent(host, wanted, dest)
    }
    /// Runs the downloaded agent once (`version`); `Err(AgentNoExec)` when it cannot be executed.
    fn test_run(&self, host: &dyn Host, path: &Path) -> Result<(), Failure>;
}

/// The real downloads, see [`crate::download`].
pub struct NetFetcher {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    dl_base: String,
    keys: ReleaseKeys,
}

impl NetFetcher {
    /// `knobs` may replace the compiled-in release key (`test-knobs` only).
    pub fn new(host: &dyn Host, knobs: &Knobs, opts: &Options) -> Result<NetFetcher, Failure> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::Other(e.to_string()))?;
        let client = {
            let _ctx = rt.enter();
            let roots = match &opts.ca_file {
                Some(p) => vec![
                    host.read(p).map_err(|e| Failure::Usage(format!("--ca-file {}: {e}", p.display())))?,
                ],
                None => Vec::new(),
            };
            let copts = gpum_host::http::ClientOptions {
                extra_roots_pem: roots,
                timeout: Some(Duration::from_secs(900)),
                connect_timeout: Some(Duration::from_secs(20)),
                user_agent: None,
            };
            gpum_host::http::client_for(&opts.server, &copts).map_err(|e| Failure::Download(e.to_string()))?
        };
        let keys = match knobs.release_key(host) {
            Some((k, f)) => {
                ReleaseKeys::new(&k, &[f.as_str()]).map_err(|e| Failure::Download(e.to_string()))?
            }
            None => ReleaseKeys::gpum(),
        };
        Ok(NetFetcher { rt, client, dl_base: format!("{}/dl", opts.server.trim_end_matches('/')), keys })
    }
}

impl Fetcher for NetFetcher {
    fn repo_key(&self, host: &dyn Host, repo: &Repo) -> Result<VerifiedKey, Failure> {
        self.rt.block_on(download::fetch_repo_key(host, &self.client, repo.key_url, repo))
    }
    fn agent(
        &self,
        host: &dyn Host,
        wanted: &download::Wanted,
        dest: &Path,
    ) -> Result<download::Fetched, Failure> {
        self.agent_watched(host, wanted, dest, &mut |_, _| {})
    }
    fn agent_watched(
        &self,
        host: &dyn Host,
        wanted: &download::Wanted,
        dest: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<download::Fetched, Failure> {
        self.rt.block_on(download::fetch_verified_watched(
            host,
            &self.client,
            &self.dl_base,
            wanted,
            dest,
            0o700,
            &self.keys,
            progress,
        ))
    }
    fn test_run(&self, host: &dyn Host, path: &Path) -> Result<(), Failure> {
        match host.run(&Cmd::new(path.display().to_string()).arg("version")) {
            Ok(o) if o.success() => Ok(()),
            Ok(o) => Err(Failure::Download(format!("the downloaded agent does not run: {}", tail(&o)))),
            // The seed's exit 10: a program that cannot be executed from $TMPDIR (noexec).
            Err(_) => Err(Failure::AgentNoExec),
        }
    }
}

/// What the first step downloaded and verified, which the later steps install.
pub(super) struct Verified {
    /// Where the agent was downloaded.
    work: WorkDir,
    /// The agent's SHA-256 as the signed manifest gives it (hex).
    agent_sha256: String,
    /// The key of every repository the plan adds, by repository id.
    keys: Vec<(&'static str, VerifiedKey)>,
}

impl Verified {
    /// The key the first step verified for `repo`; it fetched one for every
    /// [`Step::AddRepository`] of the plan.
    pub(super) fn key(&self, repo: &Repo) -> Result<&VerifiedKey, Failure> {
        self.keys
            .iter()
            .find(|(id, _)| *id == repo.id)
            .map(|(_, k)| k)
            .ok_or_else(|| Failure::Other(format!("no verified key for {}", repo.id)))
    }
}

/// The download directory, removed when the run ends (but not when it is killed: its name is
/// random and it holds nothing secret).
struct WorkDir {
    host: Arc<dyn Host>,
    path: PathBuf,
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = self.host.remove_dir_all(&self.path);
    }
}

impl Run<'_> {
    /// Step 1: every download and every verification, before anything changes.
    pub(super) fn download(&mut self) -> Result<(Verified, Outcome), Failure> {
        let host = self.host.clone();
        let h = host.as_ref();
        // The repository keys the plan will write.
        let mut keys = Vec::new();
        let mut ids: Vec<&str> = Vec::new();
        for s in &self.plan.steps {
            match s {
                Step::AddRepository(add) => {
                    keys.push((add.repo.id, self.fetcher.repo_key(h, &add.repo)?));
                    ids.push(add.repo.id);
                }
                Step::UseSource(u) => {
                    check_owner_source(h, u)?;
                    ids.push(u.repo.id);
                }
                _ => {}
            }
        }
        // The agent.
        let dir = download::work_dir(h)?;
        let work = WorkDir { host: host.clone(), path: dir.clone() };
        let installed = installed_version(h);
        let wanted = download::Wanted {
            name: "gpum-agent",
            installed_version: installed.as_deref(),
            allow_downgrade: self.opts.allow_downgrade,
        };
        let dest = dir.join("gpum-agent");
        let bar = self.progress.download();
        let fetched =
            self.fetcher.agent_watched(h, &wanted, &dest, &mut |done, total| bar.bytes(done, total))?;
        drop(bar);
        let version = fetched.version;
        self.fetcher.test_run(h, &dest)?;
        let mut detail = format!("gpum-agent {version}");
        if !ids.is_empty() {
            detail.push_str("; ");
            detail.push_str(&t(Msg::KeysVerified, self.lang()).replace("{ids}", &ids.join(", ")));
        }
        let verified = Verified { work, agent_sha256: fetched.sha256, keys };
        Ok((verified, Outcome::Done(Some(detail))))
    }

    /// The downloaded agent's bytes, read once, whose SHA-256 must still be the signed one: the
    /// bytes returned are the bytes hashed, and the bytes installed. Whatever changed the file
    /// since the first step verified it (minutes earlier, before apt and Docker) is refused with
    /// exit 20, before anything is written.
    pub(super) fn verified_agent(&self, verified: &Verified) -> Result<Vec<u8>, Failure> {
        let h = self.host.as_ref();
        let want = &verified.agent_sha256;
        let path = verified.work.path.join("gpum-agent");
        let data = h.read(&path).map_err(|e| Failure::Download(format!("{}: {e}", path.display())))?;
        let got = hex_sha256(&data);
        if got != *want {
            return Err(Failure::Download(format!(
                "{}: its SHA-256 is now {got}, not the signed {want}: it changed after it was verified, \
                 and was not installed",
                path.display()
            )));
        }
        Ok(data)
    }
}

/// The owner's source a [`Step::UseSource`] names, checked again as the audit checked it (the
/// same entry, its keyring holding exactly the pinned key): anything that changed since is
/// exit 20, before anything on the machine changes.
fn check_owner_source(h: &dyn Host, u: &UseSource) -> Result<(), Failure> {
    let files = sources::read_apt_sources(h);
    let arch = h.arch();
    let now = sources::owner_source(h, &files, &u.repo, u.suite(), sources::dpkg_arch(&arch), h.now());
    if now.as_ref() == Some(&u.source) {
        return Ok(());
    }
    Err(Failure::Download(format!(
        "{} ({}) no longer holds exactly the pinned key {}, or the source changed after the check; \
         nothing was changed",
        u.source.file.display(),
        u.source.keyring,
        u.source.fingerprint
    )))
}

/// The installed agent's version (`gpum-agent version` prints `gpum-agent X`), for the
/// rollback rule; `None` when there is none or it does not run.
fn installed_version(h: &dyn Host) -> Option<String> {
    let bin = Path::new(agent_state::INSTALL_DIR).join("gpum-agent");
    if !h.exists(&bin) {
        return None;
    }
    let o = h.run(&Cmd::new(bin.display().to_string()).arg("version")).ok().filter(Output::success)?;
    o.stdout_str().split_whitespace().nth(1).map(str::to_string)
}

/// SHA-256, lowercase hex, as the signed manifest writes it.
pub(super) fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}
