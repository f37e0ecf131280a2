//! The install: the [`Plan`] the dry run shows, executed step by step through the seam.
//!
//! - **Verify first.** The first step downloads the agent and verifies it against the signed
//!   release manifest, test-runs it from `$TMPDIR`, and downloads and verifies every repository
//!   key the plan adds. A failure there (exit 20, or 10 for a noexec `$TMPDIR`) leaves the
//!   machine as it was.
//! - **Ask first.** A Docker restart that stops containers is confirmed (`--yes`, or a question
//!   on `/dev/tty`) before the first step; without a confirmation nothing is changed (exit 2).
//! - **Skip what is done.** Each step looks at the machine again and reports "already present"
//!   or "unchanged" instead of redoing it, so a re-run after a crash or a failure converges:
//!   same files, one source per repository, one node on the platform (the install id makes a
//!   repeated registration with the same code return the same node).
//! - **Named checkpoints** after every step ([`Step::checkpoint`]) let a `test-knobs` build die
//!   there, to prove the convergence.
//! - **Register late.** Registration runs after the machine is ready, so no server is created
//!   for a machine that fails; a refused registration leaves a running agent, its config and
//!   its binary as they were.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use gpum_common::agent_state::{self, Connection};
use gpum_common::{Failure, Lang};
use gpum_host::{Cmd, Host, Output};
use gpum_preflight::facts::LockFacts;
use gpum_repo_keys::keys::{self, VerifiedKey};
use gpum_repo_keys::pinned::Repo;
use gpum_repo_keys::release::ReleaseKeys;
use gpum_repo_keys::sources;
use serde::Serialize;

use crate::daemon_json::{self, Merged};
use crate::download;
use crate::knobs;
use crate::plan::{Plan, Purpose, Step};
use crate::text::{Msg, t};

/// How long the GPU check may take: the first probe pulls its image.
pub const GPU_WAIT_SECS: u64 = 600;
/// Where the install id lives (0600); written before the first registration, reused after.
pub const INSTALL_ID: &str = "/var/lib/gpum-agent/install-id";
/// How often the waits look again.
const POLL: Duration = Duration::from_millis(500);
/// Lines of apt's own output quoted in an error.
const TAIL_LINES: usize = 12;

/// What the owner asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub code: String,
    pub server: String,
    pub ca_file: Option<PathBuf>,
    pub yes: bool,
    pub allow_downgrade: bool,
    /// `--probe-registry`; `None`: the agent's defaults.
    pub probe_registries: Option<Vec<String>>,
    pub lang: Lang,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Option<String>),
    Skipped(String),
}

/// The owner's account of the run, printed at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub node_id: String,
    pub installed: Vec<String>,
    pub changed: Vec<String>,
    pub left_alone: Vec<String>,
    /// `verified`, `awaiting_check`, or `running` (the check had not finished).
    pub verification: String,
}

/// Prints step results as lines or JSON events.
pub struct Reporter<'a> {
    pub out: &'a mut dyn Write,
    pub json: bool,
    pub lang: Lang,
}

#[derive(Serialize)]
struct StepEvent<'a> {
    event: &'static str,
    index: usize,
    checkpoint: String,
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    step: &'a Step,
}

impl Reporter<'_> {
    fn step(&mut self, index: usize, step: &Step, result: Result<&Outcome, &Failure>) {
        let (tag, word, detail) = match result {
            Ok(Outcome::Done(d)) => (Msg::Done, "done", d.clone()),
            Ok(Outcome::Skipped(why)) => (Msg::Skipped, "skipped", Some(why.clone())),
            Err(f) => (Msg::Failed, "failed", Some(f.message(self.lang))),
        };
        if self.json {
            let ev = StepEvent {
                event: "step",
                index,
                checkpoint: step.checkpoint(),
                result: word,
                detail: detail.as_deref(),
                step,
            };
            let _ = serde_json::to_writer(&mut *self.out, &ev);
            let _ = writeln!(self.out);
        } else {
            let d = match (&detail, result) {
                (Some(d), Ok(_)) => format!(" — {}", gpum_common::text::escape_controls(d)),
                _ => String::new(),
            };
            let _ = writeln!(self.out, "{} {}. {}{d}", t(tag, self.lang), index, step.describe(self.lang));
        }
        let _ = self.out.flush();
    }

    /// A line that is not a step's result (a wait, a question answered).
    pub fn note(&mut self, text: &str) {
        if self.json {
            let _ =
                serde_json::to_writer(&mut *self.out, &serde_json::json!({"event": "note", "message": text}));
            let _ = writeln!(self.out);
        } else {
            let _ = writeln!(self.out, "       {}", gpum_common::text::escape_controls(text));
        }
        let _ = self.out.flush();
    }
}

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
    pub fn new(host: &dyn Host, opts: &Options) -> Result<NetFetcher, Failure> {
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
        let keys = match knobs::release_key(host) {
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
        self.rt.block_on(download::fetch_verified(
            host,
            &self.client,
            &self.dl_base,
            wanted,
            dest,
            0o700,
            &self.keys,
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

/// The run's state shared by the steps.
struct Run<'a> {
    host: Arc<dyn Host>,
    opts: &'a Options,
    plan: &'a Plan,
    facts: &'a gpum_preflight::Facts,
    repos: Vec<Repo>,
    fetcher: &'a dyn Fetcher,
    /// The registration's own runtime.
    rt: tokio::runtime::Runtime,
    work: Option<WorkDir>,
    /// The agent's SHA-256 as the signed manifest gives it (hex), set by the first step.
    agent_sha256: Option<String>,
    keys: Vec<(String, VerifiedKey)>,
    node: Option<gpum_agent::register::Registered>,
    summary: Summary,
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

/// Runs `plan`. See the module docs.
pub fn install(
    host: Arc<dyn Host>,
    audit: &crate::Audit,
    repos: Vec<Repo>,
    fetcher: &dyn Fetcher,
    opts: &Options,
    rep: &mut Reporter,
) -> Result<Summary, Failure> {
    let plan = &audit.plan;
    let lang = opts.lang;
    // Ask before anything happens.
    let stops = plan.stops();
    if !stops.is_empty() && !opts.yes {
        let q = t(Msg::ConfirmRestart, lang).replace("{names}", &crate::text::names(stops));
        match host.confirm(&q) {
            Ok(Some(true)) => rep.note(t(Msg::RestartConfirmed, lang)),
            _ => return Err(Failure::RestartNotConfirmed(stops.to_vec())),
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Other(e.to_string()))?;
    let mut run = Run {
        host: host.clone(),
        opts,
        plan,
        facts: &audit.facts,
        repos,
        fetcher,
        rt,
        work: None,
        agent_sha256: None,
        keys: Vec::new(),
        node: None,
        summary: Summary::default(),
    };
    for (i, step) in plan.steps.iter().enumerate() {
        match run.exec(step, rep) {
            Ok(o) => rep.step(i + 1, step, Ok(&o)),
            Err(f) => {
                rep.step(i + 1, step, Err(&f));
                return Err(f);
            }
        }
        knobs::checkpoint(host.as_ref(), &step.checkpoint());
    }
    run.left_alone();
    Ok(run.summary)
}

fn tail(o: &Output) -> String {
    let text = format!("{}\n{}", o.stdout_str(), String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..].join("\n")
}

/// Runs `cmd`; a failure to start or a non-zero exit is `SetupFailed` with the tool's last lines.
fn must(host: &dyn Host, cmd: &Cmd) -> Result<Output, Failure> {
    match host.run(cmd) {
        Ok(o) if o.success() => Ok(o),
        Ok(o) => Err(Failure::SetupFailed(format!("{} (exit {:?}):\n{}", cmd.display(), o.code, tail(&o)))),
        Err(e) => Err(Failure::SetupFailed(format!("{}: {e}", cmd.display()))),
    }
}

/// apt, non-interactive, waiting for a held dpkg lock instead of failing at once.
fn apt(args: &[&str]) -> Cmd {
    Cmd::new("env")
        .args([
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "-o",
            "DPkg::Lock::Timeout=600",
            "-o",
            "Acquire::Retries=3",
        ])
        .args(args.iter().copied())
}

/// dpkg's name for the machine's architecture.
fn dpkg_arch(uname_m: &str) -> &str {
    match uname_m {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl Run<'_> {
    fn lang(&self) -> Lang {
        self.opts.lang
    }

    fn exec(&mut self, step: &Step, rep: &mut Reporter) -> Result<Outcome, Failure> {
        let host = self.host.clone();
        let h = host.as_ref();
        let lang = self.lang();
        match step {
            Step::DownloadAgent { .. } => self.download(),
            Step::AddRepository { id, keyring, sources: src, .. } => {
                let repo = *self.repo(id)?;
                let key = self
                    .keys
                    .iter()
                    .find(|(k, _)| k == id)
                    .map(|(_, v)| v.keyring_bytes())
                    .ok_or_else(|| Failure::Other(format!("no verified key for {id}")))?;
                let codename = self.facts.os.as_ref().map(|o| o.codename.clone()).unwrap_or_default();
                let text = sources::render(&repo, &codename, dpkg_arch(&h.arch()));
                let same = h.read(Path::new(keyring)).ok().as_deref() == Some(&key[..])
                    && h.read_to_string(Path::new(src)).ok().as_deref() == Some(&text);
                if same {
                    return Ok(Outcome::Skipped(t(Msg::AlreadyPresent, lang).into()));
                }
                let vk = &self.keys.iter().find(|(k, _)| k == id).expect("checked above").1;
                keys::write_keyring(h, &repo, vk)
                    .map_err(|e| Failure::SetupFailed(format!("{keyring}: {e}")))?;
                sources::write_source(h, &repo, &codename, dpkg_arch(&h.arch()))
                    .map_err(|e| Failure::SetupFailed(format!("{src}: {e}")))?;
                self.summary.changed.push(format!("{keyring}, {src}"));
                Ok(Outcome::Done(None))
            }
            Step::AptUpdate => {
                self.lock_note(rep);
                must(h, &apt(&["update"]))?;
                Ok(Outcome::Done(None))
            }
            Step::InstallPackages { packages } => {
                self.lock_note(rep);
                rep.note(t(Msg::AptSlow, lang));
                let mut args = vec![
                    "install",
                    "-y",
                    "--no-install-recommends",
                    "-o",
                    "Dpkg::Options::=--force-confdef",
                    "-o",
                    "Dpkg::Options::=--force-confold",
                ];
                args.extend(packages.iter().map(String::as_str));
                must(h, &apt(&args))?;
                self.summary.installed.extend(packages.iter().cloned());
                Ok(Outcome::Done(None))
            }
            Step::ConfigureDocker { path } => self.configure_docker(Path::new(path)),
            Step::ReloadDocker => {
                must(h, &Cmd::new("systemctl").args(["reload", "docker"]))?;
                // A reload is a SIGHUP: dockerd applies it on its own time.
                for _ in 0..40 {
                    if self.engine_has_runtime() {
                        self.summary.changed.push("docker: reloaded".into());
                        return Ok(Outcome::Done(None));
                    }
                    h.sleep(Duration::from_millis(250));
                }
                Err(Failure::SetupFailed(
                    "dockerd did not list the nvidia runtime after systemctl reload docker".into(),
                ))
            }
            Step::RestartDocker { .. } => {
                must(h, &Cmd::new("systemctl").args(["restart", "docker"]))?;
                for _ in 0..120 {
                    if self.engine_answers() {
                        self.summary.changed.push("docker: restarted".into());
                        return Ok(Outcome::Done(None));
                    }
                    h.sleep(POLL);
                }
                Err(Failure::SetupFailed("Docker did not answer within 60 s of its restart".into()))
            }
            Step::Register { server, config } => self.register(server, Path::new(config)),
            Step::WriteFile { path, mode, purpose } => {
                let mode = u32::from_str_radix(mode, 8).unwrap_or(0o600);
                let data = match purpose {
                    Purpose::AgentBinary => self.verified_agent()?,
                    Purpose::AgentUnit => gpum_agent::unit::UNIT.as_bytes().to_vec(),
                    Purpose::AgentProxy => gpum_agent::unit::proxy_drop_in().into_bytes(),
                    Purpose::AgentProxyEnv => gpum_agent::unit::proxy_env(&crate::proxy_vars(h)).into_bytes(),
                    Purpose::AgentCa => {
                        let src = self
                            .opts
                            .ca_file
                            .as_ref()
                            .ok_or_else(|| Failure::Other("no --ca-file".into()))?;
                        h.read(src)
                            .map_err(|e| Failure::Usage(format!("--ca-file {}: {e}", src.display())))?
                    }
                };
                self.write_file(Path::new(path), &data, mode)
            }
            Step::StartAgent { name, wait_secs } => self.start(name, *wait_secs),
            Step::GpuCheck => self.gpu_check(rep),
        }
    }

    fn repo(&self, id: &str) -> Result<&Repo, Failure> {
        self.repos
            .iter()
            .find(|r| r.id == id)
            .ok_or_else(|| Failure::Other(format!("unknown repository {id}")))
    }

    fn lock_note(&self, rep: &mut Reporter) {
        if let LockFacts::Held { path, pid } = &self.facts.dpkg_lock
            && self.host.lock_holder(path).ok().flatten().is_some()
        {
            rep.note(
                &t(Msg::LockWait, self.lang())
                    .replace("{pid}", &pid.to_string())
                    .replace("{path}", &path.display().to_string()),
            );
        }
    }

    /// Step 1: every download and every verification, before anything changes.
    fn download(&mut self) -> Result<Outcome, Failure> {
        let host = self.host.clone();
        let h = host.as_ref();
        // The repository keys the plan will write.
        let ids: Vec<String> = self
            .plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::AddRepository { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect();
        for id in &ids {
            let repo = *self.repo(id)?;
            let key = self.fetcher.repo_key(h, &repo)?;
            self.keys.push((id.clone(), key));
        }
        // The agent.
        let dir = download::work_dir(h)?;
        self.work = Some(WorkDir { host: host.clone(), path: dir.clone() });
        let installed = installed_version(h);
        let wanted = download::Wanted {
            name: "gpum-agent",
            installed_version: installed.as_deref(),
            allow_downgrade: self.opts.allow_downgrade,
        };
        let dest = dir.join("gpum-agent");
        let fetched = self.fetcher.agent(h, &wanted, &dest)?;
        self.agent_sha256 = Some(fetched.sha256);
        let version = fetched.version;
        self.fetcher.test_run(h, &dest)?;
        let mut detail = format!("gpum-agent {version}");
        if !ids.is_empty() {
            detail.push_str("; ");
            detail.push_str(&t(Msg::KeysVerified, self.lang()).replace("{ids}", &ids.join(", ")));
        }
        Ok(Outcome::Done(Some(detail)))
    }

    fn configure_docker(&mut self, path: &Path) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let old = match h.read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Failure::SetupFailed(format!("{}: {e}", path.display()))),
        };
        let new = daemon_json::add_nvidia_runtime(old.as_deref()).map_err(|e| {
            Failure::SetupFailed(format!("{}: {e}; the file was left as it is", path.display()))
        })?;
        let Merged::Changed(text) = new else {
            return Ok(Outcome::Skipped(t(Msg::AlreadyPresent, self.lang()).into()));
        };
        let io = |e: std::io::Error| Failure::SetupFailed(format!("{}: {e}", path.display()));
        let mut detail = None;
        if let Some(old) = &old {
            let secs = h.now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            let backup = PathBuf::from(format!("{}.gpum-backup-{secs}", path.display()));
            h.write_atomic(&backup, old.as_bytes(), 0o644).map_err(io)?;
            detail = Some(t(Msg::BackupAt, self.lang()).replace("{path}", &backup.display().to_string()));
            self.summary.changed.push(format!("{} ({})", path.display(), backup.display()));
        } else {
            self.summary.changed.push(path.display().to_string());
        }
        if let Some(dir) = path.parent() {
            h.create_dir_all(dir, 0o755).map_err(io)?;
        }
        h.write_atomic(path, text.as_bytes(), 0o644).map_err(io)?;
        Ok(Outcome::Done(detail))
    }

    fn engine_answers(&self) -> bool {
        let h = self.host.as_ref();
        h.unix_http_get(&self.facts.docker.socket, "/_ping").is_ok_and(|r| r.status == 200)
    }

    fn engine_has_runtime(&self) -> bool {
        crate::dockerd::engine_lists_runtime(self.host.as_ref(), &self.facts.docker.socket) == Some(true)
    }

    fn register(&mut self, server: &str, config: &Path) -> Result<Outcome, Failure> {
        let host = self.host.clone();
        let h = host.as_ref();
        let io = |p: &Path, e: std::io::Error| Failure::Other(format!("{}: {e}", p.display()));
        for d in [agent_state::CONFIG_DIR, agent_state::DEFAULT_STATE_DIR] {
            h.create_dir_all(Path::new(d), 0o700).map_err(|e| io(Path::new(d), e))?;
        }
        let install_id = crate::install_id(h)?;
        let opts = gpum_agent::register::RegisterOptions {
            server: server.to_string(),
            config_path: config.to_path_buf(),
            state_dir: PathBuf::from(agent_state::DEFAULT_STATE_DIR),
            ca_file: agent_ca_file(self.plan, self.opts),
            docker_socket: None,
            probe_registries: self.opts.probe_registries.clone(),
            install_id: Some(install_id),
        };
        let r = self.rt.block_on(gpum_agent::register::register(host.clone(), &opts, &self.opts.code))?;
        self.summary.node_id = r.node_id.clone();
        self.summary.changed.push(format!("{} (0600)", config.display()));
        let detail = t(Msg::NodeRegistered, self.lang()).replace("{node}", &r.node_id);
        self.node = Some(r);
        Ok(Outcome::Done(Some(detail)))
    }

    /// The downloaded agent's bytes, read once, whose SHA-256 must still be the signed one: the
    /// bytes returned are the bytes hashed, and the bytes installed. Whatever changed the file
    /// since the first step verified it (minutes earlier, before apt and Docker) is refused with
    /// exit 20, before anything is written.
    fn verified_agent(&self) -> Result<Vec<u8>, Failure> {
        let h = self.host.as_ref();
        let (Some(work), Some(want)) = (&self.work, &self.agent_sha256) else {
            return Err(Failure::Other("no verified download of the agent".into()));
        };
        let path = work.path.join("gpum-agent");
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

    fn write_file(&mut self, path: &Path, data: &[u8], mode: u32) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        if h.read(path).ok().as_deref() == Some(data) {
            return Ok(Outcome::Skipped(t(Msg::Unchanged, self.lang()).into()));
        }
        let io = |e: std::io::Error| Failure::Other(format!("{}: {e}", path.display()));
        if let Some(dir) = path.parent() {
            // The config directory is root's alone, whichever step makes it first.
            let dmode = if dir == Path::new(agent_state::CONFIG_DIR) { 0o700 } else { 0o755 };
            h.create_dir_all(dir, dmode).map_err(io)?;
        }
        h.write_atomic(path, data, mode).map_err(io)?;
        self.summary.changed.push(path.display().to_string());
        Ok(Outcome::Done(None))
    }

    fn start(&mut self, name: &str, wait_secs: u64) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let node = self.node.as_ref().map(|n| n.node_id.clone()).unwrap_or_default();
        let t0 = h.now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        for args in [vec!["daemon-reload"], vec!["enable", name]] {
            must(h, &Cmd::new("systemctl").args(args)).map_err(|_| Failure::ServiceFailed)?;
        }
        // A unit that stopped for good (78) is "failed"; clear that so it can start again.
        let _ = h.run(&Cmd::new("systemctl").args(["reset-failed", name]));
        must(h, &Cmd::new("systemctl").args(["restart", name])).map_err(|_| Failure::ServiceFailed)?;
        for _ in 0..wait_secs * 2 {
            if let Ok(Some(st)) = agent_state::read(h, Path::new(agent_state::DEFAULT_STATE_DIR)) {
                if st.node_id.as_deref() == Some(&node)
                    && st.connection == Connection::Connected
                    && st.last_heartbeat_at.is_some_and(|at| at + 2 >= t0)
                {
                    return Ok(Outcome::Done(Some(t(Msg::AgentOnline, self.lang()).into())));
                }
                // A stop written since the restart, by a service that is now down (78 leaves
                // it down: RestartPreventExitStatus). A stop alone is not enough: the agent
                // that ran before this restart may have been told its token was replaced (the
                // registration above revokes it) and written its stop just before it was
                // replaced by the new process, which overwrites the state at its first answer.
                if st.stopped.is_some() && st.updated_at + 2 >= t0 && self.service_down(name) {
                    return Err(Failure::ServiceFailed);
                }
            }
            h.sleep(POLL);
        }
        Err(Failure::ServiceFailed)
    }

    fn service_down(&self, name: &str) -> bool {
        let h = self.host.as_ref();
        h.run(&Cmd::new("systemctl").args(["is-active", name]))
            .is_ok_and(|o| matches!(o.stdout_str().trim(), "failed" | "inactive"))
    }

    fn gpu_check(&mut self, rep: &mut Reporter) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let lang = self.lang();
        if self.node.as_ref().and_then(|n| n.probe_image.as_ref()).is_none() {
            self.summary.verification = "awaiting_check".into();
            return Ok(Outcome::Done(Some(t(Msg::AwaitingCheck, lang).into())));
        }
        rep.note(&t(Msg::WaitingForCheck, lang).replace("{secs}", &GPU_WAIT_SECS.to_string()));
        for _ in 0..GPU_WAIT_SECS * 2 {
            if let Ok(Some(st)) = agent_state::read(h, Path::new(agent_state::DEFAULT_STATE_DIR)) {
                match st.verification.as_deref() {
                    Some("verified") => {
                        self.summary.verification = "verified".into();
                        return Ok(Outcome::Done(Some(t(Msg::Verified, lang).into())));
                    }
                    Some("failed") => return Err(Failure::GpuNotInContainer),
                    _ => {}
                }
            }
            h.sleep(POLL);
        }
        self.summary.verification = "running".into();
        Ok(Outcome::Done(Some(t(Msg::CheckStillRunning, lang).into())))
    }

    fn left_alone(&mut self) {
        let lang = self.lang();
        if self.facts.docker.present() {
            self.summary.left_alone.push(t(Msg::LeftDocker, lang).into());
        }
        if self.facts.toolkit.present() && !crate::dockerd::toolkit_too_old(self.facts) {
            self.summary.left_alone.push(t(Msg::LeftToolkit, lang).into());
        }
        if self.facts.docker.daemon_json.is_some() {
            self.summary.left_alone.push(t(Msg::LeftDaemonJson, lang).into());
        }
        self.summary.left_alone.push(t(Msg::LeftContainers, lang).into());
    }
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
fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}

/// The CA file the agent's config names: the copy the plan writes ([`Purpose::AgentCa`]), which
/// registration reaches the platform through, else `--ca-file` itself (a plan without the copy).
fn agent_ca_file(plan: &Plan, opts: &Options) -> Option<PathBuf> {
    opts.ca_file.as_ref()?;
    let copy = plan.steps.iter().find_map(|s| match s {
        Step::WriteFile { path, purpose: Purpose::AgentCa, .. } => Some(PathBuf::from(path)),
        _ => None,
    });
    copy.or_else(|| opts.ca_file.clone())
}

/// The summary's lines.
pub fn write_summary(out: &mut dyn Write, s: &Summary, lang: Lang) -> std::io::Result<()> {
    let list =
        |v: &[String]| if v.is_empty() { t(Msg::SummaryNothing, lang).to_string() } else { v.join("; ") };
    writeln!(out)?;
    writeln!(out, "{}:", t(Msg::SummaryTitle, lang))?;
    writeln!(out, "  {}: {}", t(Msg::SummaryInstalled, lang), list(&s.installed))?;
    writeln!(out, "  {}: {}", t(Msg::SummaryChanged, lang), list(&s.changed))?;
    writeln!(out, "  {}: {}", t(Msg::SummaryLeftAlone, lang), list(&s.left_alone))?;
    writeln!(
        out,
        "  {}: {}",
        t(Msg::SummaryNext, lang),
        t(Msg::NextDashboard, lang).replace("{node}", &s.node_id)
    )?;
    writeln!(out, "        {}", t(Msg::NextStatus, lang))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! `install` over `FakeHost`, with a fetcher that serves the vendors' real (pinned) keys
    //! from the repository's copies and a stand-in agent: a failure at each step stops there,
    //! with its exit code, and nothing after it runs or is written. The steps after
    //! registration need a real platform: the test host runs them (`cargo xtask e2e`).
    use super::*;
    use crate::tests_support::*;
    use gpum_host::fake::FakeHost;

    struct Offline {
        agent_runs: bool,
        bad_key: bool,
    }

    impl Fetcher for Offline {
        fn repo_key(&self, host: &dyn Host, repo: &Repo) -> Result<VerifiedKey, Failure> {
            if self.bad_key {
                return Err(Failure::Download(format!("{}: fingerprint not pinned", repo.key_url)));
            }
            keys::verify_repo_key(repo.key_copy, repo, host.now())
                .map_err(|e| Failure::Download(e.to_string()))
        }
        fn agent(
            &self,
            host: &dyn Host,
            _w: &download::Wanted,
            dest: &Path,
        ) -> Result<download::Fetched, Failure> {
            host.write_atomic(dest, AGENT, 0o700).map_err(|e| Failure::Download(e.to_string()))?;
            Ok(download::Fetched {
                path: dest.to_path_buf(),
                version: "0.1.0".into(),
                sha256: hex_sha256(AGENT),
            })
        }
        fn test_run(&self, _h: &dyn Host, _p: &Path) -> Result<(), Failure> {
            if self.agent_runs { Ok(()) } else { Err(Failure::AgentNoExec) }
        }
    }

    /// The stand-in agent's bytes; its "signed" SHA-256 is theirs.
    const AGENT: &[u8] = b"agent";

    const APT_UPDATE: &str =
        "env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 update";

    fn opts() -> Options {
        Options {
            code: gpum_protocol::joincode::JoinCode::generate().to_string(),
            // Nothing listens on port 9: registration fails without a platform.
            server: "http://127.0.0.1:9".into(),
            ca_file: None,
            yes: false,
            allow_downgrade: false,
            probe_registries: None,
            lang: Lang::En,
        }
    }

    fn go(h: &FakeHost, f: &Offline, o: &Options) -> (Result<Summary, Failure>, String) {
        let host: Arc<dyn Host> = Arc::new(h.clone());
        let gpu = t4();
        let audit = crate::Audit::run(
            h,
            &gpu,
            &gpum_preflight::GatherOptions {
                offline: true,
                server: Some(o.server.clone()),
                ..Default::default()
            },
            Lang::En,
        );
        assert!(audit.ready(), "{:?}", audit.findings);
        let mut out = Vec::new();
        let r = {
            let mut rep = Reporter { out: &mut out, json: false, lang: Lang::En };
            install(host, &audit, audit.repos.clone(), f, o, &mut rep)
        };
        (r, String::from_utf8(out).unwrap())
    }

    fn ran(h: &FakeHost) -> Vec<String> {
        h.ran().iter().map(|c| c.display()).filter(|c| !c.starts_with("systemctl show")).collect()
    }

    #[test]
    fn a_noexec_tmpdir_or_a_bad_key_stops_before_anything_changes() {
        for (f, code) in [
            (Offline { agent_runs: false, bad_key: false }, 10),
            (Offline { agent_runs: true, bad_key: true }, 20),
        ] {
            let h = fresh_debian();
            let (r, out) = go(&h, &f, &opts());
            assert_eq!(r.unwrap_err().code(), code, "{out}");
            assert!(ran(&h).is_empty(), "{:?}", ran(&h));
            let written: Vec<_> = h.writes().into_iter().filter(|p| !p.starts_with("/tmp")).collect();
            assert!(written.is_empty(), "only the download directory may be touched: {written:?}");
        }
    }

    #[test]
    fn an_apt_failure_is_exit_30_with_apts_own_lines_and_nothing_after_it_runs() {
        let h = fresh_debian().command(
            APT_UPDATE,
            Ok(Output {
                code: Some(100),
                stdout: b"Hit:1 http://x bookworm InRelease\n".to_vec(),
                stderr: b"E: The repository 'http://x bookworm Release' is not signed.\n".to_vec(),
            }),
        );
        let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
        let f = r.unwrap_err();
        assert_eq!(f.code(), 30);
        assert!(f.message(Lang::En).contains("is not signed"), "{}", f.message(Lang::En));
        assert!(out.contains("[FAIL] 4. refresh package lists"), "{out}");
        assert_eq!(ran(&h), [APT_UPDATE], "nothing past the failure");
        // The keys and sources were written, with the pinned keys.
        assert!(h.exists(Path::new("/etc/apt/keyrings/gpum-docker.gpg")));
        assert!(
            h.read_to_string(Path::new("/etc/apt/sources.list.d/gpum-docker.sources"))
                .unwrap()
                .contains("Signed-By: /etc/apt/keyrings/gpum-docker.gpg")
        );
        assert!(!h.exists(Path::new("/etc/docker/daemon.json")));
    }

    #[test]
    fn an_invalid_daemon_json_is_never_overwritten() {
        // Docker present with the toolkit: the plan merges daemon.json and reloads. The file
        // turned invalid after the audit (the gate refuses an invalid one up front).
        let h = configured_debian();
        let audit_then_break = |h: &FakeHost| h.clone().file("/etc/docker/daemon.json", "{\"log-driver\": ");
        let host_after = audit_then_break(&h);
        let host: Arc<dyn Host> = Arc::new(host_after.clone());
        let gpu = t4();
        let audit = crate::Audit::run(
            &h,
            &gpu,
            &gpum_preflight::GatherOptions {
                offline: true,
                server: Some(opts().server),
                ..Default::default()
            },
            Lang::En,
        );
        let mut out = Vec::new();
        let mut rep = Reporter { out: &mut out, json: false, lang: Lang::En };
        let f = install(
            host,
            &audit,
            audit.repos.clone(),
            &Offline { agent_runs: true, bad_key: false },
            &opts(),
            &mut rep,
        )
        .unwrap_err();
        assert_eq!(f.code(), 30);
        assert!(f.message(Lang::En).contains("/etc/docker/daemon.json"));
        assert_eq!(
            host_after.read_to_string(Path::new("/etc/docker/daemon.json")).unwrap(),
            "{\"log-driver\": "
        );
        assert!(ran(&host_after).is_empty(), "no reload after a refused merge: {:?}", ran(&host_after));
    }

    #[test]
    fn a_merge_keeps_the_owners_keys_backs_up_and_reloads_then_registration_failure_is_reported() {
        let h = configured_debian()
            .command("systemctl reload docker", Ok(Output { code: Some(0), ..Default::default() }))
            .unix_http(
                gpum_preflight::facts::DEFAULT_DOCKER_SOCKET,
                "/info",
                "HTTP/1.0 200 OK\r\n\r\n{\"Runtimes\":{\"runc\":{},\"nvidia\":{}}}",
            );
        let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
        // No platform listens: registration fails after the machine is ready.
        let f = r.unwrap_err();
        assert_eq!(f.code(), 1, "{out}");
        assert!(out.contains("[ ok ] 2. Docker settings"), "{out}");
        assert!(out.contains("[ ok ] 3. reload Docker's settings"), "{out}");
        assert!(out.contains("[FAIL] 4. register"), "{out}");
        let new = h.read_to_string(Path::new("/etc/docker/daemon.json")).unwrap();
        assert!(new.find("log-opts").unwrap() < new.find("runtimes").unwrap(), "{new}");
        let backups: Vec<_> = h
            .writes()
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("daemon.json.gpum-backup-"))
            .collect();
        assert_eq!(backups.len(), 1);
        assert_eq!(h.read_to_string(&backups[0]).unwrap(), OWNER_DAEMON_JSON);
        assert_eq!(ran(&h), ["systemctl reload docker"], "nothing after the failed registration ran");
        assert!(!h.exists(Path::new("/opt/gpum-agent/gpum-agent")));
        assert!(!h.exists(Path::new("/etc/gpum-agent/config.toml")));
        // The install id was kept for the re-run.
        assert_eq!(h.read_to_string(Path::new(INSTALL_ID)).unwrap().trim().len(), 32);
    }

    #[test]
    fn a_restart_that_stops_containers_needs_a_yes() {
        let h = docker_without_toolkit_running("web");
        // No terminal, no --yes: refused before anything, with the container named.
        let (r, _) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
        assert_eq!(r.unwrap_err(), Failure::RestartNotConfirmed(vec!["web".into()]));
        assert!(ran(&h).is_empty() && h.writes().is_empty());
        // A terminal that says no: the same.
        let mut h2 = docker_without_toolkit_running("web");
        h2.answer = Some(false);
        assert_eq!(go(&h2, &Offline { agent_runs: true, bad_key: false }, &opts()).0.unwrap_err().code(), 2);
        assert!(h2.writes().is_empty());
        // --yes goes on (and stops at the first command the fake does not know).
        let h3 = docker_without_toolkit_running("web");
        let (r, out) =
            go(&h3, &Offline { agent_runs: true, bad_key: false }, &Options { yes: true, ..opts() });
        assert_eq!(r.unwrap_err().code(), 30, "{out}");
        assert_eq!(ran(&h3), [APT_UPDATE]);
    }

    /// A host that is `inner`, with its own environment, and that runs `hook` before each
    /// command: what another process does to the machine while apt runs.
    struct During<H> {
        inner: H,
        env: Vec<(String, String)>,
        hook: Hook<H>,
    }

    type Hook<H> = Box<dyn Fn(&H, &Cmd) + Send + Sync>;

    impl<H: Host> Host for During<H> {
        fn run(&self, cmd: &Cmd) -> std::io::Result<Output> {
            (self.hook)(&self.inner, cmd);
            self.inner.run(cmd)
        }
        fn read(&self, p: &Path) -> std::io::Result<Vec<u8>> {
            self.inner.read(p)
        }
        fn exists(&self, p: &Path) -> bool {
            self.inner.exists(p)
        }
        fn is_dir(&self, p: &Path) -> bool {
            self.inner.is_dir(p)
        }
        fn read_dir(&self, p: &Path) -> std::io::Result<Vec<PathBuf>> {
            self.inner.read_dir(p)
        }
        fn write_atomic(&self, p: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
            self.inner.write_atomic(p, data, mode)
        }
        fn create_dir_all(&self, p: &Path, mode: u32) -> std::io::Result<()> {
            self.inner.create_dir_all(p, mode)
        }
        fn remove_file(&self, p: &Path) -> std::io::Result<()> {
            self.inner.remove_file(p)
        }
        fn remove_dir_all(&self, p: &Path) -> std::io::Result<()> {
            self.inner.remove_dir_all(p)
        }
        fn space(&self, p: &Path) -> std::io::Result<gpum_host::FsSpace> {
            self.inner.space(p)
        }
        fn env(&self, key: &str) -> Option<String> {
            self.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()).or_else(|| self.inner.env(key))
        }
        fn euid(&self) -> u32 {
            self.inner.euid()
        }
        fn now(&self) -> std::time::SystemTime {
            self.inner.now()
        }
        fn arch(&self) -> String {
            self.inner.arch()
        }
        fn stdin_is_tty(&self) -> bool {
            self.inner.stdin_is_tty()
        }
        fn sleep(&self, d: Duration) {
            self.inner.sleep(d)
        }
        fn create_partial(&self, dest: &Path, mode: u32) -> std::io::Result<Box<dyn gpum_host::PartialFile>> {
            self.inner.create_partial(dest, mode)
        }
        fn create_dir_exclusive(&self, p: &Path, mode: u32) -> std::io::Result<()> {
            self.inner.create_dir_exclusive(p, mode)
        }
        fn lstat(&self, p: &Path) -> std::io::Result<gpum_host::FileStat> {
            self.inner.lstat(p)
        }
    }

    /// The audit of `h` (with `--ca-file` when `ca`), its plan cut down to the steps `keep`
    /// names by checkpoint: the steps after registration, without a platform.
    fn audit_keeping(h: &FakeHost, ca: bool, keep: &[&str]) -> crate::Audit {
        let mut audit = crate::Audit::run(
            h,
            &t4(),
            &gpum_preflight::GatherOptions {
                offline: true,
                server: Some(opts().server),
                extra_roots_pem: if ca { vec![b"(a PEM)".to_vec()] } else { Vec::new() },
            },
            Lang::En,
        );
        assert!(audit.ready(), "{:?}", audit.findings);
        audit.plan.steps.retain(|s| keep.contains(&s.checkpoint().as_str()));
        let left: Vec<String> = audit.plan.steps.iter().map(Step::checkpoint).collect();
        assert_eq!(left, keep, "the plan has these steps, in this order");
        audit
    }

    fn install_on(
        host: Arc<dyn Host>,
        audit: &crate::Audit,
        o: &Options,
    ) -> (Result<Summary, Failure>, String) {
        let mut out = Vec::new();
        let f = Offline { agent_runs: true, bad_key: false };
        let r = install(
            host,
            audit,
            Vec::new(),
            &f,
            o,
            &mut Reporter { out: &mut out, json: false, lang: Lang::En },
        );
        (r, String::from_utf8(out).unwrap())
    }

    /// Issue 29, item 5: the agent is verified in the first step and installed minutes later,
    /// after apt. Bytes swapped in the work directory in between (here: while apt runs) are
    /// refused with exit 20, and nothing is installed; the same run without the swap installs
    /// exactly the verified bytes.
    #[test]
    fn an_agent_changed_after_verification_is_refused_and_nothing_is_installed() {
        let bin = Path::new("/opt/gpum-agent/gpum-agent");
        let keep = ["download_agent", "apt_update", "write_agent_binary"];
        for swap in [true, false] {
            let h = fresh_debian().command(APT_UPDATE, Ok(Output { code: Some(0), ..Default::default() }));
            let audit = audit_keeping(&h, false, &keep);
            let host = During {
                inner: h.clone(),
                env: Vec::new(),
                hook: Box::new(move |inner: &FakeHost, cmd: &Cmd| {
                    if !swap || cmd.display() != APT_UPDATE {
                        return;
                    }
                    let work = inner.read_dir(Path::new("/tmp")).unwrap();
                    let [dir] = work.as_slice() else { panic!("one work directory: {work:?}") };
                    inner.write_atomic(&dir.join("gpum-agent"), b"#!/bin/sh\nevil\n", 0o700).unwrap();
                }),
            };
            let (r, out) = install_on(Arc::new(host), &audit, &opts());
            if swap {
                let f = r.unwrap_err();
                assert_eq!(f.code(), 20, "{out}");
                let msg = f.message(Lang::En);
                assert!(
                    msg.contains("changed after it was verified") && msg.contains(&hex_sha256(AGENT)),
                    "{msg}"
                );
                assert!(out.contains("[FAIL] 3."), "{out}");
                assert!(!h.exists(bin), "nothing installed");
                assert!(!h.writes().iter().any(|p| p.starts_with("/opt")), "{:?}", h.writes());
            } else {
                r.unwrap_or_else(|f| panic!("{f:?}: {out}"));
                assert_eq!(h.read(bin).unwrap(), AGENT);
            }
        }
    }

    /// Issues 29, items 9 and 10, on a real filesystem (a scratch root): the proxy's values
    /// are in a 0600 file that the drop-in only names, the drop-in holds no credential; the CA
    /// is copied into the config directory (0700) as a 0644 file of the installing user, and the
    /// config names the copy. A re-run with the same proxy and CA changes nothing.
    #[test]
    #[allow(clippy::disallowed_methods)]
    fn proxy_values_and_the_ca_are_the_services_own_files_with_their_modes() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = tempfile::tempdir().unwrap();
        let real = gpum_host::RealHost::with_root(root.path());
        let tmp = real.map(Path::new("/tmp"));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::create_dir_all(real.map(Path::new("/home/owner"))).unwrap();
        std::fs::write(real.map(Path::new("/home/owner/ca.pem")), pem).unwrap();
        let secret = "http://user:pa$$w0rd@proxy.example:3128";
        let env = vec![
            ("HTTPS_PROXY".to_string(), secret.to_string()),
            ("NO_PROXY".to_string(), "localhost".to_string()),
        ];

        let fake = fresh_debian().env_var("HTTPS_PROXY", secret).env_var("NO_PROXY", "localhost");
        let keep = ["download_agent", "write_agent_ca", "write_agent_proxy_env", "write_agent_proxy"];
        let audit = audit_keeping(&fake, true, &keep);
        let o = Options { ca_file: Some(PathBuf::from("/home/owner/ca.pem")), ..opts() };
        // Registration reaches the platform through the copy, and writes it into the config.
        assert_eq!(agent_ca_file(&audit.plan, &o), Some(PathBuf::from("/etc/gpum-agent/ca.pem")));
        assert_eq!(agent_ca_file(&audit.plan, &opts()), None);

        let host = || -> Arc<dyn Host> {
            Arc::new(During {
                inner: real.clone(),
                env: env.clone(),
                hook: Box::new(|_: &gpum_host::RealHost, _: &Cmd| {}),
            })
        };
        let (r, out) = install_on(host(), &audit, &o);
        r.unwrap_or_else(|f| panic!("{f:?}: {out}"));
        let euid = nix::unistd::geteuid().as_raw();
        let meta = |p: &str| {
            let m = std::fs::symlink_metadata(real.map(Path::new(p))).unwrap();
            (m.uid(), m.mode() & 0o7777)
        };
        let read = |p: &str| std::fs::read_to_string(real.map(Path::new(p))).unwrap();
        assert_eq!(meta("/etc/gpum-agent"), (euid, 0o700));
        assert_eq!(meta("/etc/gpum-agent/ca.pem"), (euid, 0o644));
        assert_eq!(read("/etc/gpum-agent/ca.pem").as_bytes(), pem);
        assert_eq!(meta("/etc/gpum-agent/proxy.env"), (euid, 0o600));
        let values = read("/etc/gpum-agent/proxy.env");
        assert!(values.contains(r#"HTTPS_PROXY="http://user:pa\$\$w0rd@proxy.example:3128""#), "{values}");
        assert!(values.contains(r#"NO_PROXY="localhost""#), "{values}");
        let drop_in = read(crate::plan::PROXY_DROP_IN);
        assert!(!drop_in.contains("w0rd") && !drop_in.contains("Environment="), "{drop_in}");
        assert!(drop_in.contains("EnvironmentFile=-/etc/gpum-agent/proxy.env"), "{drop_in}");
        assert_eq!(meta(crate::plan::PROXY_DROP_IN).1, 0o644);

        // Again, with the same proxy and CA: every file is left as it is.
        let (r, out) = install_on(host(), &audit, &o);
        r.unwrap_or_else(|f| panic!("{f:?}: {out}"));
        assert_eq!(out.matches("[skip]").count(), 3, "{out}");
    }
}
