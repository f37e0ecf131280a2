//! The steps after the first: each looks at the machine again and skips what is done.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use gpum_common::agent_state;
use gpum_common::{Failure, Lang};
use gpum_host::{Cmd, Host, Output};
use gpum_preflight::facts::{DPKG_LOCKS, dpkg_interrupted};
use gpum_repo_keys::keys;
use gpum_repo_keys::sources::{self, dpkg_arch};

use super::fetch::Verified;
use super::{Outcome, Reporter, Run, TAIL_LINES, agent_ca_file};
use crate::daemon_json::{self, Merged};
use crate::plan::{Content, Step};
use crate::text::{Msg, t};

pub(super) fn tail(o: &Output) -> String {
    let text = format!("{}\n{}", o.stdout_str(), String::from_utf8_lossy(&o.stderr));
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..].join("\n")
}

/// How a command ended, for the owner: `exit 100`, or the signal that killed it (no debug
/// formatting in an owner's message).
pub(super) fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("exit {c}"),
        None => "killed by a signal".into(),
    }
}

/// Runs `cmd`; a failure to start or a non-zero exit is `SetupFailed` with the tool's last lines.
pub(super) fn must(host: &dyn Host, cmd: &Cmd) -> Result<Output, Failure> {
    checked(cmd, host.run(cmd))
}

/// What [`must`] makes of `cmd`'s run.
pub(super) fn checked(cmd: &Cmd, run: std::io::Result<Output>) -> Result<Output, Failure> {
    match run {
        Ok(o) if o.success() => Ok(o),
        Ok(o) => {
            Err(Failure::SetupFailed(format!("{} ({}):\n{}", cmd.display(), exit_text(o.code), tail(&o))))
        }
        Err(e) => Err(Failure::SetupFailed(format!("{}: {e}", cmd.display()))),
    }
}

/// How often, and how many times, [`Run::wait_for_apt_locks`] looks again: 10 minutes.
const LOCK_POLL: std::time::Duration = std::time::Duration::from_secs(1);
const LOCK_WAIT_POLLS: u32 = 600;

/// apt, non-interactive, waiting for a held dpkg lock instead of failing at once.
pub(super) fn apt(args: &[&str]) -> Cmd {
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

impl Run<'_> {
    pub(super) fn lang(&self) -> Lang {
        self.opts.lang
    }

    /// Every step after the first, which is [`Run::download`].
    pub(super) fn exec(
        &mut self,
        step: &Step,
        verified: &Verified,
        rep: &mut Reporter,
    ) -> Result<Outcome, Failure> {
        let host = self.host.clone();
        let h = host.as_ref();
        let lang = self.lang();
        match step {
            Step::DownloadAgent { .. } => {
                Err(Failure::Other("the download is the plan's first step, and only that".into()))
            }
            Step::AddRepository(add) => {
                let (repo, codename) = (&add.repo, add.codename.as_str());
                let vk = verified.key(repo)?;
                let (keyring, src) = (repo.keyring_path(), repo.sources_path());
                let text = sources::render(repo, codename, dpkg_arch(&h.arch()));
                let same = h.read(Path::new(&keyring)).ok() == Some(vk.keyring_bytes())
                    && h.read_to_string(Path::new(&src)).ok().as_deref() == Some(&text);
                if same {
                    return Ok(Outcome::Skipped(t(Msg::AlreadyPresent, lang).into()));
                }
                keys::write_keyring(h, repo, vk)
                    .map_err(|e| Failure::SetupFailed(format!("{keyring}: {e}")))?;
                sources::write_source(h, repo, codename, dpkg_arch(&h.arch()))
                    .map_err(|e| Failure::SetupFailed(format!("{src}: {e}")))?;
                self.summary.changed.push(format!("{keyring}, {src}"));
                Ok(Outcome::Done(None))
            }
            // Checked again in the first step; nothing of the owner's is written.
            Step::UseSource(_) => Ok(Outcome::Skipped(t(Msg::SourceKept, lang).into())),
            Step::AptUpdate => {
                self.wait_for_apt_locks(rep)?;
                self.finish_dpkg(rep)?;
                self.apt_watched(&["update"], Msg::ProgressAptUpdate)?;
                Ok(Outcome::Done(None))
            }
            Step::InstallPackages { packages } => {
                self.wait_for_apt_locks(rep)?;
                self.finish_dpkg(rep)?;
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
                self.apt_watched(&args, Msg::ProgressAptInstall)?;
                self.summary.installed.extend(packages.iter().cloned());
                Ok(Outcome::Done(None))
            }
            Step::ConfigureToolkit { path } => {
                self.edit_config(Path::new(path), crate::toolkit_config::configure)
            }
            Step::ConfigureDocker { path, live_restore } => self.edit_config(Path::new(path), |old| {
                daemon_json::configure(old, *live_restore).map_err(|e| e.to_string())
            }),
            Step::ReloadDocker => {
                let _p = self.progress.wait(Msg::ProgressDockerReload, super::waits::RUNTIME_WAIT);
                must(h, &Cmd::new("systemctl").args(["reload", "docker"]))?;
                self.wait_for_runtime()?;
                self.summary.changed.push("docker: reloaded".into());
                Ok(Outcome::Done(None))
            }
            Step::RestartDocker { .. } => {
                let _p = self.progress.wait(Msg::ProgressDockerRestart, super::waits::ENGINE_WAIT);
                must(h, &Cmd::new("systemctl").args(["restart", "docker"]))?;
                self.wait_for_engine()?;
                self.summary.changed.push("docker: restarted".into());
                Ok(Outcome::Done(None))
            }
            Step::Register { server, config } => self.register(server, Path::new(config)),
            Step::KeepRegistration { node_id, config } => self.keep_registration(node_id, Path::new(config)),
            Step::WriteFile { path, mode, content, .. } => {
                let agent;
                let data = match content {
                    Content::VerifiedAgent => {
                        agent = self.verified_agent(verified)?;
                        &agent
                    }
                    Content::Bytes(b) => b,
                };
                self.write_file(Path::new(path), data, *mode)
            }
            Step::StartAgent { name, wait_secs } => self.start(name, *wait_secs),
            Step::GpuCheck { wait_secs } => self.gpu_check(*wait_secs, rep),
        }
    }

    /// Waits, up to 10 minutes, while another process holds dpkg's or the package lists' lock
    /// (`apt-daily` on a freshly booted Ubuntu holds the lists' for minutes), saying once per
    /// lock who holds it. apt's own `DPkg::Lock::Timeout` covers a lock taken after this.
    fn wait_for_apt_locks(&self, rep: &mut Reporter) -> Result<(), Failure> {
        let h = self.host.as_ref();
        for lock in DPKG_LOCKS {
            let path = Path::new(lock);
            let mut said = false;
            let mut polls = 0;
            while let Ok(Some(pid)) = h.lock_holder(path) {
                if polls == LOCK_WAIT_POLLS {
                    return Err(Failure::SetupFailed(format!(
                        "{lock} is still held by process {pid} after 10 minutes"
                    )));
                }
                if !said {
                    rep.note(
                        &t(Msg::LockWait, self.lang())
                            .replace("{pid}", &pid.to_string())
                            .replace("{path}", lock),
                    );
                    said = true;
                }
                h.sleep(LOCK_POLL);
                polls += 1;
            }
        }
        Ok(())
    }

    /// Finishes what an interrupted dpkg left (its journal, [`dpkg_interrupted`]), after saying
    /// so: apt refuses every install until `dpkg --configure -a` has run.
    fn finish_dpkg(&self, rep: &mut Reporter) -> Result<(), Failure> {
        let h = self.host.as_ref();
        if dpkg_interrupted(h).is_empty() {
            return Ok(());
        }
        rep.note(t(Msg::FinishDpkg, self.lang()));
        must(h, &Cmd::new("env").args(["DEBIAN_FRONTEND=noninteractive", "dpkg", "--configure", "-a"]))?;
        Ok(())
    }

    /// Changes the settings file `path` with `merge` (the owner's `daemon.json`, the toolkit's
    /// `config.toml`), after a backup beside it; a file `merge` refuses is left as it is.
    fn edit_config(
        &mut self,
        path: &Path,
        merge: impl Fn(Option<&str>) -> Result<Merged, String>,
    ) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let old = match h.read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Failure::SetupFailed(format!("{}: {e}", path.display()))),
        };
        let new = merge(old.as_deref()).map_err(|e| {
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

    fn register(&mut self, server: &str, config: &Path) -> Result<Outcome, Failure> {
        let host = self.host.clone();
        let h = host.as_ref();
        let io = |p: &Path, e: std::io::Error| Failure::Other(format!("{}: {e}", p.display()));
        for d in [agent_state::CONFIG_DIR, agent_state::DEFAULT_STATE_DIR] {
            h.create_dir_all(Path::new(d), 0o700).map_err(|e| io(Path::new(d), e))?;
        }
        let install_id = crate::install_id(h)?;
        let opts = gpum_enroll::register::RegisterOptions {
            server: server.to_string(),
            config_path: config.to_path_buf(),
            state_dir: PathBuf::from(agent_state::DEFAULT_STATE_DIR),
            ca_file: agent_ca_file(self.plan, self.opts),
            docker_socket: None,
            probe_registries: self.opts.probe_registries.clone(),
            install_id: Some(install_id),
        };
        // The inventory's Docker version, asked on the socket the audit found (`DOCKER_HOST`'s
        // or the default, as the agent resolves it).
        let engine = async { crate::dockerd::engine_version(h, &self.facts.docker.socket) };
        let code = self.opts.code.as_deref().ok_or(Failure::NoJoinCode)?;
        let r = self.rt.block_on(gpum_enroll::register::register(host.clone(), &opts, code, engine))?;
        // Which code this server came from, so that a re-run with it is told it repairs.
        let hash = Path::new(super::JOIN_CODE_HASH);
        h.write_atomic(hash, format!("{}\n", crate::code_sha256(code)).as_bytes(), 0o600)
            .map_err(|e| io(hash, e))?;
        self.summary.node_id = r.node_id.clone();
        self.summary.changed.push(format!("{} (0600)", config.display()));
        let detail = t(Msg::NodeRegistered, self.lang()).replace("{node}", &r.node_id);
        self.node = Some(r);
        Ok(Outcome::Done(Some(detail)))
    }

    /// A repair: the installed agent's config stays as it is, and must load (its token and
    /// server are what the service will use) and name the server the plan keeps.
    fn keep_registration(&mut self, node_id: &str, config: &Path) -> Result<Outcome, Failure> {
        let h = self.host.as_ref();
        let cfg = gpum_enroll::config::Config::load(h, config)
            .map_err(|e| Failure::Other(format!("{}: {e}", config.display())))?;
        if cfg.node_id != node_id {
            return Err(Failure::Other(format!(
                "{}: server {} instead of {node_id}",
                config.display(),
                gpum_common::text::escape_controls(&cfg.node_id)
            )));
        }
        self.summary.node_id = node_id.to_string();
        // The platform's probe image is not known without registering: the GPU wait reads the
        // agent's own result instead ([`Run::gpu_check`]).
        self.node = Some(gpum_enroll::register::Registered {
            node_id: node_id.to_string(),
            heartbeat_interval_secs: 0,
            probe_image: None,
        });
        self.kept = true;
        Ok(Outcome::Skipped(t(Msg::RegistrationKept, self.lang()).replace("{node}", node_id)))
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

    pub(super) fn left_alone(&mut self) {
        let lang = self.lang();
        if self.facts.docker.present() {
            self.summary.left_alone.push(t(Msg::LeftDocker, lang).into());
        }
        if self.facts.toolkit.present() && !crate::dockerd::toolkit_too_old(self.facts) {
            self.summary.left_alone.push(t(Msg::LeftToolkit, lang).into());
        }
        for s in &self.plan.steps {
            if let Step::UseSource(u) = s {
                self.summary.left_alone.push(
                    t(Msg::LeftSource, lang)
                        .replace("{file}", &u.source.file.display().to_string())
                        .replace("{keyring}", &u.source.keyring),
                );
            }
        }
        if self.facts.docker.daemon_json.is_some() {
            self.summary.left_alone.push(t(Msg::LeftDaemonJson, lang).into());
        }
        self.summary.left_alone.push(t(Msg::LeftContainers, lang).into());
    }
}
