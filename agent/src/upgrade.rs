//! The agent's in-place upgrade (issue 47): the I/O around the core's rule ([`crate::core::Upgrades`]).
//!
//! [`upgrade`] (the platform offered a newer version, the core decided to take it):
//! 1. the install's directories are root's and writable by no one else ([`check_layout`]);
//! 2. `release.json` and its signature, verified against the key compiled in (signature first,
//!    then the expiry: a platform serving stale metadata is refused), the version the platform
//!    named, strictly newer than this agent's own; then `manifest.json` and its signature, the
//!    manifest `release.json` names by SHA-256 (no mix-and-match), its `gpum-agent` entry at
//!    the release's version;
//! 3. the binary, streamed into a partial file beside [`NEW`] (created exclusively, 0755),
//!    hashed as it is written and bounded by the signed size, fsynced and renamed onto
//!    [`NEW`] only once size and SHA-256 match;
//! 4. the running binary copied to [`PREVIOUS`], `upgrade.json` written `pending` (0600), and the
//!    rollback guard started: a transient systemd timer that runs the **previous** binary's
//!    hidden `rollback` subcommand after [`BOUND`] ([`guard_command`]), so it works even when
//!    the new binary cannot start at all;
//! 5. [`NEW`] renamed over the binary (atomic), and the agent exits with `EXIT_RESTART`.
//!
//! Any doubt before the swap leaves the machine as it was ([`NEW`] removed, the guard stopped)
//! and ends the attempt `refused` (verification) or `failed` (download, write, guard).
//!
//! [`startup`] reads `upgrade.json` when the agent starts: a pending upgrade to this very
//! version waits for its first accepted heartbeat ([`confirm`]: `succeeded`, the guard stopped);
//! [`rollback`] (the guard, in the old binary) puts [`PREVIOUS`] back while the record still says
//! `pending`, records `rolled_back` and restarts the service. Rentals keep running through all
//! of it: an exit leaves the containers alone, and the next agent adopts them.
//!
//! Everything goes through the [`Host`] seam; the downloads through [`Platform::release_file`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpum_common::agent_state::{
    INSTALL_DIR, SERVICE_NAME, UpgradeRecord, UpgradeState, read_upgrade, write_upgrade,
};
use gpum_host::{Cmd, FileKind, Host};
use gpum_protocol::{UpgradeOutcome, UpgradeReport};
use gpum_repo_keys::release::{self, ReleaseKeys};
use tracing::{info, warn};

use crate::client::{CallError, Platform};
use crate::core::{UPGRADE_RETRY, UpgradeEnd, UpgradeStart};
use crate::secret::Token;

/// The binary's name in [`INSTALL_DIR`] and in the release's manifest.
pub const BINARY: &str = "gpum-agent";
/// The new binary, written and verified before the swap.
pub const NEW: &str = "gpum-agent.new";
/// The binary that ran before the swap, which the rollback guard puts back.
pub const PREVIOUS: &str = "gpum-agent.previous";
/// The transient unit of the rollback guard (`gpum-agent-rollback.timer` and `.service`).
pub const GUARD_UNIT: &str = "gpum-agent-rollback";
/// How long a new binary has to send its first good heartbeat before it is rolled back.
pub const BOUND: Duration = Duration::from_secs(120);
/// The largest `release.json`, manifest or signature read.
pub const MAX_META_BYTES: u64 = 1024 * 1024;
/// What the rollback records as its reason.
pub const ROLLED_BACK_DETAIL: &str = "no good heartbeat within 120 s";

/// Where the upgrade reads and writes: the install directory and the state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub install_dir: PathBuf,
    pub state_dir: PathBuf,
}

impl Layout {
    /// The installer's layout: `/opt/gpum-agent` and the given state directory.
    pub fn installed(state_dir: &Path) -> Layout {
        Layout { install_dir: PathBuf::from(INSTALL_DIR), state_dir: state_dir.to_path_buf() }
    }
    pub fn binary(&self) -> PathBuf {
        self.install_dir.join(BINARY)
    }
    pub fn new_binary(&self) -> PathBuf {
        self.install_dir.join(NEW)
    }
    pub fn previous(&self) -> PathBuf {
        self.install_dir.join(PREVIOUS)
    }
}

/// Whether this agent can upgrade in place: it runs from the installer's layout with the
/// system paths (a packaged agent, in `/usr/bin`, is upgraded by its package manager).
pub fn can_upgrade(host: &dyn Host, system_paths: bool, layout: &Layout) -> bool {
    system_paths && host.lstat(&layout.binary()).is_ok_and(|s| s.kind == FileKind::File)
}

/// The rollback guard: `systemd-run --unit=gpum-agent-rollback --on-active=120
/// /opt/gpum-agent/gpum-agent.previous rollback`.
pub fn guard_command(layout: &Layout) -> Cmd {
    Cmd::new("systemd-run").args([
        format!("--unit={GUARD_UNIT}"),
        format!("--on-active={}", BOUND.as_secs()),
        layout.previous().display().to_string(),
        "rollback".to_string(),
    ])
}

/// Stops the guard's timer (best effort: it may have run, or never started).
pub fn stop_guard(host: &dyn Host) {
    let cmd = Cmd::new("systemctl").arg("stop").arg(format!("{GUARD_UNIT}.timer"));
    match host.run(&cmd) {
        Ok(o) if o.success() => {}
        Ok(o) => info!(code = ?o.code, "the rollback guard's timer was not running"),
        Err(e) => warn!(error = %e, "could not stop the rollback guard's timer"),
    }
}

/// Why an attempt ended before the swap.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Problem {
    /// Verification refused what the platform served.
    Refused(String),
    /// The download or a write failed; retried later.
    Failed(String),
}

fn refused(e: impl std::fmt::Display) -> Problem {
    Problem::Refused(crate::client::truncate(&e.to_string(), 300))
}

fn failed(e: impl std::fmt::Display) -> Problem {
    Problem::Failed(crate::client::truncate(&e.to_string(), 300))
}

/// Fetches, verifies and installs `version` (see the module docs). `own` is this binary's
/// version; `keys` the release keys (compiled in: [`ReleaseKeys::gpum`]).
pub async fn upgrade(
    host: &dyn Host,
    platform: &Platform,
    token: &Token,
    layout: &Layout,
    keys: &ReleaseKeys,
    own: &str,
    version: &str,
) -> UpgradeEnd {
    let started = crate::state::unix(host.now());
    match attempt(host, platform, token, layout, keys, own, version, started).await {
        Ok(()) => UpgradeEnd::Swapped,
        Err(p) => {
            // Nothing stays of the attempt: the machine is as it was.
            if host.exists(&layout.new_binary()) {
                let _ = host.remove_file(&layout.new_binary());
            }
            let (outcome, detail) = match p {
                Problem::Refused(d) => (UpgradeOutcome::Refused, d),
                Problem::Failed(d) => (UpgradeOutcome::Failed, d),
            };
            UpgradeEnd::Ended(UpgradeReport {
                from: own.to_string(),
                to: version.to_string(),
                outcome,
                detail,
                at: crate::state::unix(host.now()),
            })
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn attempt(
    host: &dyn Host,
    platform: &Platform,
    token: &Token,
    layout: &Layout,
    keys: &ReleaseKeys,
    own: &str,
    version: &str,
    started: u64,
) -> Result<(), Problem> {
    // The platform's word is only a name: never older or equal, whatever it says.
    release::check_newer(version, own).map_err(refused)?;
    check_layout(host, layout).map_err(failed)?;
    let fetch = |file: &'static str| fetch_small(platform, token, version, file);

    // The four small files (each size-bounded), then the whole check in one call, the one the
    // release staging test also runs (`release::verify_upgrade`): `release.json`'s signature,
    // format and expiry, the manifest's signature, the manifest the metadata names, the
    // agent's entry at the metadata's version, and that version strictly newer than ours.
    let (meta_bytes, meta_sig) = (fetch(release::RELEASE).await?, fetch(release::RELEASE_SIG).await?);
    let (manifest, manifest_sig) = (fetch(release::MANIFEST).await?, fetch(release::MANIFEST_SIG).await?);
    let (meta, mut verifier) =
        release::verify_upgrade(keys, &meta_bytes, &meta_sig, &manifest, &manifest_sig, BINARY, own, started)
            .map_err(refused)?;
    if meta.version != version {
        return Err(refused(format!("the signed release is {}, not the offered {version}", meta.version)));
    }

    // A `.new` left by an attempt that was killed is ours: it goes before the fresh one.
    if host.exists(&layout.new_binary()) {
        host.remove_file(&layout.new_binary()).map_err(|e| failed(format!("{NEW}: {e}")))?;
    }
    let mut part =
        host.create_partial(&layout.new_binary(), 0o755).map_err(|e| failed(format!("{NEW}: {e}")))?;
    let size = verifier.entry().size;
    let mut why: Option<Problem> = None;
    let got = {
        let mut each = |chunk: &[u8]| -> Result<(), String> {
            if let Err(e) = verifier.update(chunk) {
                why = Some(refused(&e));
                return Err(e.to_string());
            }
            if let Err(e) = part.write_all(chunk) {
                why = Some(failed(format!("{NEW}: {e}")));
                return Err(e.to_string());
            }
            Ok(())
        };
        platform.release_file(token, version, BINARY, size, &mut each).await
    };
    if let Some(p) = why {
        return Err(p);
    }
    got.map_err(|e| transport(BINARY, &e))?;
    verifier.finish().map_err(refused)?;
    part.commit().map_err(|e| failed(format!("{NEW}: {e}")))?;
    info!(version, "the new agent is verified and written beside the running one");

    // From here the machine changes: the previous binary kept, the record, the guard, the swap.
    let current = host.read(&layout.binary()).map_err(|e| failed(format!("{BINARY}: {e}")))?;
    host.write_atomic(&layout.previous(), &current, 0o755).map_err(|e| failed(format!("{PREVIOUS}: {e}")))?;
    let rec = UpgradeRecord {
        from: own.to_string(),
        to: version.to_string(),
        started,
        deadline: started + BOUND.as_secs(),
        state: UpgradeState::Pending,
        detail: String::new(),
        at: None,
        reported: false,
    };
    write_upgrade(host, &layout.state_dir, &rec).map_err(|e| failed(format!("upgrade.json: {e}")))?;
    // A guard left from an earlier attempt would make the name taken.
    stop_guard(host);
    let _ = host.run(&Cmd::new("systemctl").arg("reset-failed").arg(format!("{GUARD_UNIT}.service")));
    match host.run(&guard_command(layout)) {
        Ok(o) if o.success() => {}
        Ok(o) => {
            return Err(failed(format!(
                "could not start the rollback guard: systemd-run exited {:?}: {}",
                o.code,
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        Err(e) => return Err(failed(format!("could not start the rollback guard: {e}"))),
    }
    if let Err(e) = host.rename(&layout.new_binary(), &layout.binary()) {
        stop_guard(host);
        return Err(failed(format!("could not swap the binary: {e}")));
    }
    info!(
        from = own,
        to = version,
        "the new agent is in place; the rollback guard runs for {} s",
        BOUND.as_secs()
    );
    Ok(())
}

/// A small release file (metadata, manifest, signatures), read whole.
async fn fetch_small(
    platform: &Platform,
    token: &Token,
    version: &str,
    file: &'static str,
) -> Result<Vec<u8>, Problem> {
    let mut body = Vec::new();
    let mut each = |chunk: &[u8]| -> Result<(), String> {
        body.extend_from_slice(chunk);
        Ok(())
    };
    platform
        .release_file(token, version, file, MAX_META_BYTES, &mut each)
        .await
        .map_err(|e| transport(file, &e))?;
    Ok(body)
}

/// A download that did not come: a body larger than allowed, or one the verifier stopped, is
/// refused; anything else (the network, a 404, a 5xx) failed, and is retried later.
fn transport(file: &str, e: &CallError) -> Problem {
    match e {
        CallError::Decode(_) => refused(format!("{file}: {e}")),
        _ => failed(format!("{file}: {e}")),
    }
}

/// The installer's rule for where a binary goes: the install directory and every directory
/// above it are directories (not links), root's, and writable by no one else; the binary is
/// root's regular file.
pub fn check_layout(host: &dyn Host, layout: &Layout) -> Result<(), String> {
    let mut dir = Some(layout.install_dir.as_path());
    while let Some(d) = dir {
        let st = host.lstat(d).map_err(|e| format!("{}: {e}", d.display()))?;
        if st.kind != FileKind::Dir || st.uid != 0 || st.mode & 0o022 != 0 {
            return Err(format!(
                "{} must be a directory of root's that no one else can write (uid {}, mode {:o})",
                d.display(),
                st.uid,
                st.mode
            ));
        }
        dir = d.parent();
    }
    let st = host.lstat(&layout.binary()).map_err(|e| format!("{}: {e}", layout.binary().display()))?;
    if st.kind != FileKind::File || st.uid != 0 {
        return Err(format!("{} is not root's regular file", layout.binary().display()));
    }
    Ok(())
}

/// What the agent starts from (see the module docs): a pending upgrade to `own` to confirm, an
/// unreported result, the versions never to try again. A record `pending` for another version
/// is an attempt killed before its swap: it ends `failed`, and its leftovers go.
pub fn startup(host: &dyn Host, layout: &Layout, own: &str, auto_update: bool) -> UpgradeStart {
    let mut s = UpgradeStart { own: own.to_string(), auto_update, ..Default::default() };
    let mut rec = match read_upgrade(host, &layout.state_dir) {
        Ok(Some(r)) => r,
        Ok(None) => return s,
        Err(e) => {
            warn!(error = %e, "could not read upgrade.json; treating it as no upgrade");
            return s;
        }
    };
    let now = crate::state::unix(host.now());
    if rec.state == UpgradeState::Pending {
        if rec.to == own {
            info!(from = %rec.from, to = %rec.to, "this agent is an upgrade; it confirms after its first accepted heartbeat");
            s.confirm = Some((rec.from, rec.to));
            return s;
        }
        warn!(to = %rec.to, "an upgrade was interrupted before its swap; nothing changed");
        stop_guard(host);
        if host.exists(&layout.new_binary()) {
            let _ = host.remove_file(&layout.new_binary());
        }
        rec.state = UpgradeState::Failed;
        rec.detail = "interrupted before the swap".into();
        rec.at = Some(now);
        rec.reported = false;
        if let Err(e) = write_upgrade(host, &layout.state_dir, &rec) {
            warn!(error = %e, "could not record the interrupted upgrade");
        }
    }
    match rec.state {
        UpgradeState::RolledBack => {
            warn!(to = %rec.to, detail = %rec.detail, "the upgrade was rolled back; this version is not tried again");
            s.never.push(rec.to.clone());
        }
        UpgradeState::Failed => {
            let at = rec.at.unwrap_or(rec.started);
            let left = (at + UPGRADE_RETRY.as_secs()).saturating_sub(now);
            if left > 0 {
                s.failed = Some((rec.to.clone(), Duration::from_secs(left)));
            }
        }
        _ => {}
    }
    if !rec.reported {
        s.report = rec.report();
    }
    s
}

/// The new binary's first heartbeat was accepted: `succeeded`, and the guard stopped.
pub fn confirm(host: &dyn Host, layout: &Layout, r: &UpgradeReport) {
    record(host, layout, r);
    stop_guard(host);
}

/// Records an ended attempt (not yet reported).
pub fn record(host: &dyn Host, layout: &Layout, r: &UpgradeReport) {
    let old = read_upgrade(host, &layout.state_dir).ok().flatten().filter(|o| o.to == r.to);
    let rec = UpgradeRecord {
        from: r.from.clone(),
        to: r.to.clone(),
        started: old.as_ref().map_or(r.at, |o| o.started),
        deadline: old.as_ref().map_or(0, |o| o.deadline),
        state: UpgradeState::of(r.outcome),
        detail: r.detail.clone(),
        at: Some(r.at),
        reported: false,
    };
    if let Err(e) = write_upgrade(host, &layout.state_dir, &rec) {
        warn!(error = %e, "could not record the upgrade's result");
    }
}

/// A heartbeat carrying the report was accepted.
pub fn reported(host: &dyn Host, layout: &Layout) {
    match read_upgrade(host, &layout.state_dir) {
        Ok(Some(mut rec)) if !rec.reported && rec.state != UpgradeState::Pending => {
            rec.reported = true;
            if let Err(e) = write_upgrade(host, &layout.state_dir, &rec) {
                warn!(error = %e, "could not record that the upgrade was reported");
            }
        }
        _ => {}
    }
}

/// `gpum-agent rollback`, the guard, run by the timer from the previous binary: while the
/// record still says `pending`, the previous binary goes back over the new one, the record
/// says `rolled_back`, and the service restarts. Otherwise it does nothing. Returns the exit
/// code.
pub fn rollback(host: &dyn Host, layout: &Layout) -> i32 {
    let mut rec = match read_upgrade(host, &layout.state_dir) {
        Ok(Some(r)) if r.state == UpgradeState::Pending => r,
        Ok(_) => {
            info!("no upgrade is pending; nothing to roll back");
            return gpum_common::exit::OK;
        }
        Err(e) => {
            warn!(error = %e, "cannot read upgrade.json; nothing rolled back");
            return gpum_common::exit::OTHER;
        }
    };
    if let Err(e) = host.rename(&layout.previous(), &layout.binary()) {
        warn!(error = %e, "could not put the previous agent back");
        return gpum_common::exit::OTHER;
    }
    rec.state = UpgradeState::RolledBack;
    rec.detail = ROLLED_BACK_DETAIL.into();
    rec.at = Some(crate::state::unix(host.now()));
    rec.reported = false;
    if let Err(e) = write_upgrade(host, &layout.state_dir, &rec) {
        warn!(error = %e, "could not record the rollback");
    }
    warn!(from = %rec.from, to = %rec.to, "rolled back: {ROLLED_BACK_DETAIL}; restarting the previous agent");
    match host.run(&Cmd::new("systemctl").args(["restart", SERVICE_NAME])) {
        Ok(o) if o.success() => gpum_common::exit::OK,
        Ok(o) => {
            warn!(code = ?o.code, "systemctl restart failed");
            gpum_common::exit::OTHER
        }
        Err(e) => {
            warn!(error = %e, "could not run systemctl");
            gpum_common::exit::OTHER
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::SystemTime;

    use gpum_host::fake::{FakeHost, Node};
    use gpum_host::{FileStat, Output};
    use gpum_repo_keys::release::signing::{entry, sign_detached, sign_release, throwaway_key};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const OLD: &[u8] = b"the running agent 0.1.0";
    const TOKEN: &str = "tok-node-upgrade";
    const GUARD: &str =
        "systemd-run --unit=gpum-agent-rollback --on-active=120 /opt/gpum-agent/gpum-agent.previous rollback";
    const STOP_GUARD: &str = "systemctl stop gpum-agent-rollback.timer";

    fn ok() -> std::io::Result<Output> {
        Ok(Output { code: Some(0), ..Default::default() })
    }

    fn layout() -> Layout {
        Layout::installed(Path::new("/var/lib/gpum-agent"))
    }

    fn unix_now() -> u64 {
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
    }

    /// An installed agent: its binary (0755), its state directory, systemd answering. Its clock
    /// is the real one, as the throwaway keys are made now.
    fn machine() -> FakeHost {
        let mut h = FakeHost::new()
            .file("/var/lib/gpum-agent/state.json", "{}")
            .command(GUARD, ok())
            .command(STOP_GUARD, ok())
            .command("systemctl reset-failed gpum-agent-rollback.service", ok())
            .command("systemctl restart gpum-agent", ok());
        h.write_atomic(&layout().binary(), OLD, 0o755).unwrap();
        h.now = SystemTime::now();
        h
    }

    /// A signed release of `agent` at `version`, as the platform serves it: the five files.
    struct Release {
        keys: ReleaseKeys,
        cert: sequoia_openpgp::Cert,
        files: HashMap<String, Vec<u8>>,
        version: String,
    }

    fn release_json(version: &str, expires: u64, manifest: &[u8]) -> Vec<u8> {
        let sha = entry("m", "0.0.0", manifest).sha256;
        format!(r#"{{"format":1,"version":"{version}","expires":{expires},"manifest_sha256":"{sha}"}}"#)
            .into_bytes()
    }

    impl Release {
        fn new(version: &str, agent: &[u8]) -> Release {
            let (cert, public, fpr) = throwaway_key();
            let keys = ReleaseKeys::new(&public, &[&fpr]).unwrap();
            let mut r = Release { keys, cert, files: HashMap::new(), version: version.into() };
            r.sign(&[("gpum-agent", version, agent)], version, unix_now() + 3600);
            r.put(BINARY, agent.to_vec());
            r
        }

        /// Signs a manifest of `artifacts` and a release.json of `version` naming it.
        fn sign(&mut self, artifacts: &[(&str, &str, &[u8])], version: &str, expires: u64) {
            let (m, msig) = sign_release(&self.cert, artifacts);
            let meta = release_json(version, expires, &m);
            let meta_sig = sign_detached(&self.cert, &meta);
            self.put(release::MANIFEST, m);
            self.put(release::MANIFEST_SIG, msig);
            self.put(release::RELEASE, meta);
            self.put(release::RELEASE_SIG, meta_sig);
        }

        fn put(&mut self, file: &str, data: Vec<u8>) {
            let path = gpum_protocol::upgrade::release_file_path(&self.version, file);
            self.files.insert(path, data);
        }

        /// Serves the files over loopback HTTP (only to the node's token; anything else 404),
        /// and runs the upgrade to `offered` from `own` on `h`.
        async fn offer(&self, h: &FakeHost, own: &str, offered: &str) -> UpgradeEnd {
            let server = serve(self.files.clone()).await;
            let platform = Platform::new(&server, Vec::new(), Duration::from_secs(10)).unwrap();
            let token = Token::new(TOKEN).unwrap();
            upgrade(h, &platform, &token, &layout(), &self.keys, own, offered).await
        }
    }

    /// A minimal HTTP/1.1 server on loopback: `GET path` with the node's bearer token answers
    /// the file, anything else the platform's JSON 404.
    async fn serve(files: HashMap<String, Vec<u8>>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let files = files.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut tmp = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut tmp).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&tmp[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    let authorized = head
                        .lines()
                        .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {TOKEN}")));
                    let (status, body) = match files.get(&path) {
                        Some(b) if authorized => ("200 OK", b.clone()),
                        _ => (
                            "404 Not Found",
                            br#"{"error":{"code":"not_found","message":"no such file"}}"#.to_vec(),
                        ),
                    };
                    let resp = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                    let _ = s.write_all(&body).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        format!("http://{addr}")
    }

    fn ended(end: UpgradeEnd) -> UpgradeReport {
        match end {
            UpgradeEnd::Ended(r) => r,
            UpgradeEnd::Swapped => panic!("swapped"),
        }
    }

    fn ran(h: &FakeHost) -> Vec<String> {
        h.ran().iter().map(Cmd::display).collect()
    }

    fn mode(h: &FakeHost, p: &Path) -> Option<u32> {
        match h.tree().get(p) {
            Some(Node::File { mode, .. }) => Some(*mode),
            _ => None,
        }
    }

    /// The whole sequence: verified, written beside the old one (0755), the previous binary
    /// kept (0755), upgrade.json pending (0600) with its deadline, the guard started, then the
    /// swap, in that order.
    #[tokio::test]
    async fn a_good_release_is_verified_written_guarded_and_swapped_in_order() {
        let new = b"the new agent 0.2.0 ".repeat(5000);
        let rel = Release::new("0.2.0", &new);
        let h = machine();
        let writes_before = h.writes().len();
        assert_eq!(rel.offer(&h, "0.1.0", "0.2.0").await, UpgradeEnd::Swapped);
        assert_eq!(h.read(&layout().binary()).unwrap(), new);
        assert_eq!(mode(&h, &layout().binary()), Some(0o755));
        assert_eq!(h.read(&layout().previous()).unwrap(), OLD);
        assert_eq!(mode(&h, &layout().previous()), Some(0o755));
        assert!(!h.exists(&layout().new_binary()));
        let rec = read_upgrade(&h, &layout().state_dir).unwrap().unwrap();
        assert_eq!(
            (rec.from.as_str(), rec.to.as_str(), rec.state),
            ("0.1.0", "0.2.0", UpgradeState::Pending)
        );
        assert_eq!(rec.deadline, rec.started + 120);
        assert_eq!(mode(&h, Path::new("/var/lib/gpum-agent/upgrade.json")), Some(0o600));
        let writes: Vec<PathBuf> = h.writes()[writes_before..].to_vec();
        let l = layout();
        assert_eq!(
            writes,
            [
                l.new_binary(),
                l.previous(),
                PathBuf::from("/var/lib/gpum-agent/upgrade.json"),
                l.new_binary(),
                l.binary()
            ]
        );
        assert_eq!(ran(&h), [STOP_GUARD, "systemctl reset-failed gpum-agent-rollback.service", GUARD]);
    }

    /// A change to the served release.
    type Edit = Box<dyn Fn(&mut Release)>;

    /// Every refusal of verification leaves the machine exactly as it was: no file written,
    /// no command run, outcome refused.
    #[tokio::test]
    async fn what_fails_verification_is_refused_with_nothing_written() {
        let new = b"the new agent 0.2.0".repeat(100);
        let now = unix_now();
        let cases: Vec<(&str, Edit, &str, &str)> = vec![
            (
                "tampered bytes",
                Box::new(|r: &mut Release| {
                    let mut b = b"the new agent 0.2.0".repeat(100);
                    b[7] ^= 1;
                    r.put(BINARY, b);
                }),
                "0.2.0",
                "SHA-256",
            ),
            (
                "longer bytes",
                Box::new(|r: &mut Release| r.put(BINARY, b"the new agent 0.2.0".repeat(101))),
                "0.2.0",
                "larger",
            ),
            (
                "release.json signed by a stranger",
                Box::new(|r: &mut Release| {
                    let (stranger, _, _) = throwaway_key();
                    let meta = r.files[&gpum_protocol::upgrade::release_file_path("0.2.0", release::RELEASE)]
                        .clone();
                    r.put(release::RELEASE_SIG, sign_detached(&stranger, &meta));
                }),
                "0.2.0",
                "trusted",
            ),
            (
                "release.json edited",
                Box::new(|r: &mut Release| {
                    let path = gpum_protocol::upgrade::release_file_path("0.2.0", release::RELEASE);
                    let meta = String::from_utf8(r.files[&path].clone())
                        .unwrap()
                        .replace("\"expires\":", "\"expires\": ");
                    r.put(release::RELEASE, meta.into_bytes());
                }),
                "0.2.0",
                "signature",
            ),
            (
                "expired",
                Box::new(move |r: &mut Release| {
                    r.sign(
                        &[("gpum-agent", "0.2.0", &b"the new agent 0.2.0".repeat(100)[..])],
                        "0.2.0",
                        now - 1,
                    )
                }),
                "0.2.0",
                "expired",
            ),
            (
                "manifest of another release (mix-and-match)",
                Box::new(move |r: &mut Release| {
                    let body = b"the new agent 0.2.0".repeat(100);
                    let (m, _) = sign_release(
                        &r.cert,
                        &[("gpum-agent", "0.2.0", &body[..]), ("gpum-install", "0.2.0", &b"i"[..])],
                    );
                    let meta = release_json("0.2.0", now + 3600, &m);
                    let sig = sign_detached(&r.cert, &meta);
                    r.put(release::RELEASE, meta);
                    r.put(release::RELEASE_SIG, sig);
                }),
                "0.2.0",
                "belong together",
            ),
            (
                "wrong name",
                Box::new(move |r: &mut Release| {
                    r.sign(
                        &[("gpum-install", "0.2.0", &b"the new agent 0.2.0".repeat(100)[..])],
                        "0.2.0",
                        now + 3600,
                    )
                }),
                "0.2.0",
                "gpum-agent",
            ),
            (
                "entry of another version",
                Box::new(move |r: &mut Release| {
                    r.sign(
                        &[("gpum-agent", "0.3.0", &b"the new agent 0.2.0".repeat(100)[..])],
                        "0.2.0",
                        now + 3600,
                    )
                }),
                "0.2.0",
                "0.3.0",
            ),
            (
                "release of another version than offered",
                Box::new(move |r: &mut Release| {
                    r.sign(
                        &[("gpum-agent", "0.2.1", &b"the new agent 0.2.0".repeat(100)[..])],
                        "0.2.1",
                        now + 3600,
                    )
                }),
                "0.2.0",
                "not the offered",
            ),
            ("offered older", Box::new(|_: &mut Release| {}), "0.0.9", "not newer"),
            ("offered equal", Box::new(|_: &mut Release| {}), "0.1.0", "not newer"),
        ];
        for (what, edit, offered, why) in cases {
            let mut rel = Release::new("0.2.0", &new);
            edit(&mut rel);
            let h = machine();
            let before = (h.tree(), h.writes().len());
            let r = ended(rel.offer(&h, "0.1.0", offered).await);
            assert_eq!(r.outcome, UpgradeOutcome::Refused, "{what}: {r:?}");
            assert!(r.detail.contains(why), "{what}: {}", r.detail);
            assert_eq!((r.from.as_str(), r.to.as_str()), ("0.1.0", offered), "{what}");
            assert_eq!((h.tree(), h.writes().len()), before, "{what}: something changed");
            assert!(ran(&h).is_empty(), "{what}: {:?}", ran(&h));
        }
    }

    /// A newer signed release over a newer running agent is still refused: only strictly newer.
    #[tokio::test]
    async fn a_signed_older_release_is_refused_over_a_newer_agent() {
        let rel = Release::new("0.2.0", b"agent 0.2.0");
        let h = machine();
        let before = h.tree();
        let r = ended(rel.offer(&h, "0.3.0", "0.2.0").await);
        assert_eq!(r.outcome, UpgradeOutcome::Refused);
        assert_eq!(h.tree(), before);
    }

    /// A download or a write that fails is `failed` (retried later), and nothing changed; a
    /// guard that cannot start leaves the binary as it was and no `.new`.
    #[tokio::test]
    async fn transport_and_guard_failures_are_failed_and_change_nothing_that_runs() {
        let new = b"agent 0.2.0".repeat(10);
        let mut rel = Release::new("0.2.0", &new);
        rel.files.remove(&gpum_protocol::upgrade::release_file_path("0.2.0", BINARY));
        let h = machine();
        let before = h.tree();
        let r = ended(rel.offer(&h, "0.1.0", "0.2.0").await);
        assert_eq!(r.outcome, UpgradeOutcome::Failed, "{r:?}");
        assert_eq!(h.tree(), before);

        let rel = Release::new("0.2.0", &new);
        let h = machine()
            .command(GUARD, Ok(Output { code: Some(1), stderr: b"no bus".to_vec(), ..Default::default() }));
        let r = ended(rel.offer(&h, "0.1.0", "0.2.0").await);
        assert_eq!(r.outcome, UpgradeOutcome::Failed);
        assert!(r.detail.contains("rollback guard"), "{}", r.detail);
        assert_eq!(h.read(&layout().binary()).unwrap(), OLD);
        assert!(!h.exists(&layout().new_binary()));
    }

    /// The installer's rule: a directory above the binary that others can write is refused
    /// before anything is downloaded.
    #[tokio::test]
    async fn a_writable_parent_fails_before_any_download() {
        let rel = Release::new("0.2.0", b"agent");
        let h = machine().stat("/opt", FileStat { kind: FileKind::Dir, uid: 0, mode: 0o777 });
        let before = h.tree();
        let r = ended(rel.offer(&h, "0.1.0", "0.2.0").await);
        assert_eq!(r.outcome, UpgradeOutcome::Failed);
        assert!(r.detail.contains("/opt"), "{}", r.detail);
        assert_eq!(h.tree(), before);
        let h = machine().stat("/opt/gpum-agent", FileStat { kind: FileKind::Symlink, uid: 0, mode: 0o777 });
        assert_eq!(ended(rel.offer(&h, "0.1.0", "0.2.0").await).outcome, UpgradeOutcome::Failed);
    }

    /// The new binary starts: pending to its own version → it confirms after its first
    /// accepted heartbeat (succeeded, guard stopped); the platform is told once.
    #[tokio::test]
    async fn the_new_binary_confirms_and_stops_the_guard() {
        let rel = Release::new("0.2.0", b"agent 0.2.0");
        let h = machine();
        assert_eq!(rel.offer(&h, "0.1.0", "0.2.0").await, UpgradeEnd::Swapped);
        let s = startup(&h, &layout(), "0.2.0", true);
        assert_eq!(s.confirm, Some(("0.1.0".into(), "0.2.0".into())));
        assert_eq!(s.report, None);
        let r = UpgradeReport {
            from: "0.1.0".into(),
            to: "0.2.0".into(),
            outcome: UpgradeOutcome::Succeeded,
            detail: String::new(),
            at: 5,
        };
        let ran_before = h.ran().len();
        confirm(&h, &layout(), &r);
        assert_eq!(ran(&h)[ran_before..], [STOP_GUARD]);
        let rec = read_upgrade(&h, &layout().state_dir).unwrap().unwrap();
        assert_eq!(
            (rec.state, rec.reported, rec.deadline),
            (UpgradeState::Succeeded, false, rec.started + 120)
        );
        // A restart before the report was delivered sends it again.
        assert_eq!(startup(&h, &layout(), "0.2.0", true).report, Some(r.clone()));
        reported(&h, &layout());
        let s = startup(&h, &layout(), "0.2.0", true);
        assert_eq!((s.report, s.confirm), (None, None));
        // The guard, if it runs now, does nothing.
        let ran_before = h.ran().len();
        assert_eq!(rollback(&h, &layout()), 0);
        assert_eq!(h.read(&layout().binary()).unwrap(), b"agent 0.2.0");
        assert_eq!(h.ran().len(), ran_before);
    }

    /// The guard (the old binary's `rollback`) while still pending: the previous binary goes
    /// back, rolled_back is recorded, the service restarts; the old agent then reports it and
    /// never tries that version again.
    #[tokio::test]
    async fn the_guard_rolls_back_a_pending_upgrade_and_the_old_agent_never_retries() {
        let rel = Release::new("0.2.0", b"agent 0.2.0 that cannot start");
        let h = machine();
        assert_eq!(rel.offer(&h, "0.1.0", "0.2.0").await, UpgradeEnd::Swapped);
        assert_eq!(rollback(&h, &layout()), 0);
        assert_eq!(h.read(&layout().binary()).unwrap(), OLD);
        assert!(!h.exists(&layout().previous()));
        assert_eq!(ran(&h).last().map(String::as_str), Some("systemctl restart gpum-agent"));
        let rec = read_upgrade(&h, &layout().state_dir).unwrap().unwrap();
        assert_eq!(rec.state, UpgradeState::RolledBack);
        assert_eq!(rec.detail, ROLLED_BACK_DETAIL);
        assert_eq!(mode(&h, Path::new("/var/lib/gpum-agent/upgrade.json")), Some(0o600));
        let s = startup(&h, &layout(), "0.1.0", true);
        assert_eq!(s.never, ["0.2.0"]);
        let r = s.report.unwrap();
        assert_eq!(
            (r.from.as_str(), r.to.as_str(), r.outcome),
            ("0.1.0", "0.2.0", UpgradeOutcome::RolledBack)
        );
        assert_eq!(r.detail, "no good heartbeat within 120 s");
        assert!(s.confirm.is_none());
        // A second run of the guard changes nothing.
        assert_eq!(rollback(&h, &layout()), 0);
        assert_eq!(h.read(&layout().binary()).unwrap(), OLD);
    }

    /// An attempt killed between its record and its swap: the old binary, starting again, ends
    /// it `failed`, removes its `.new` and stops the guard.
    #[test]
    fn an_attempt_interrupted_before_the_swap_ends_failed() {
        let h = machine();
        h.write_atomic(&layout().new_binary(), b"half", 0o755).unwrap();
        let rec = UpgradeRecord {
            from: "0.1.0".into(),
            to: "0.2.0".into(),
            started: 10,
            deadline: 130,
            state: UpgradeState::Pending,
            detail: String::new(),
            at: None,
            reported: false,
        };
        write_upgrade(&h, &layout().state_dir, &rec).unwrap();
        let s = startup(&h, &layout(), "0.1.0", true);
        assert!(s.confirm.is_none());
        assert_eq!(s.report.map(|r| r.outcome), Some(UpgradeOutcome::Failed));
        assert!(!h.exists(&layout().new_binary()));
        assert_eq!(ran(&h), [STOP_GUARD]);
        assert_eq!(read_upgrade(&h, &layout().state_dir).unwrap().unwrap().state, UpgradeState::Failed);
    }

    #[test]
    fn only_the_installers_layout_upgrades_in_place() {
        let h = machine();
        assert!(can_upgrade(&h, true, &layout()));
        assert!(!can_upgrade(&h, false, &layout()), "a --state agent");
        assert!(!can_upgrade(&FakeHost::new(), true, &layout()), "a packaged agent in /usr/bin");
        assert_eq!(guard_command(&layout()).display(), GUARD);
    }
}
