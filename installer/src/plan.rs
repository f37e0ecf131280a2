//! What the install would do on this machine, computed from the audit's facts.
//!
//! `--dry-run` prints this [`Plan`]; the install ([`crate::apply`]) executes the same value,
//! step by step, so what the owner was shown is what runs. Steps name every repository (with
//! the pinned key fingerprints), package, file and service concretely.

use gpum_common::Lang;
use gpum_common::agent_state;
use gpum_preflight::Facts;
use gpum_repo_keys::pinned::{self, Distro, Repo};
use gpum_repo_keys::sources::OwnerSource;
use serde::Serialize;

/// One thing the install does, in the order it runs. The dry run prints these; the install
/// executes the same value ([`crate::apply`]) and never does anything that is not here. Each
/// step carries the typed values it executes; the dry run's text and JSON are read from them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Step {
    /// Download the agent from the platform, verify it against the signed release manifest
    /// (name, version, SHA-256), and test-run it from `$TMPDIR`. Together with the repository
    /// keys, this is verified before anything on the machine changes.
    DownloadAgent { url: String },
    /// Download the repository's key, refuse it unless its primary fingerprint is pinned, write
    /// it to the keyring, and write the deb822 source.
    AddRepository(AddRepo),
    /// Use the apt source the owner already has for the repository (Docker's or NVIDIA's own
    /// instructions), whose keyring holds exactly the pinned key: no source and no key is
    /// added, and both of the owner's files stay as they are. The first step checks them
    /// again, before anything changes.
    UseSource(UseSource),
    /// `apt-get update` (with the new sources).
    AptUpdate,
    /// `apt-get install` of packages that are missing (or too old).
    InstallPackages { packages: Vec<String> },
    /// Set the toolkit's two settings in `path` (its `config.toml`) so that an unprivileged
    /// container gets only the GPUs listed as mounts by whoever creates it, never the ones its
    /// `NVIDIA_VISIBLE_DEVICES` names ([`crate::toolkit_config`]); every other line stays, after
    /// a backup. The hook reads the file at each container start: nothing to reload.
    ConfigureToolkit { path: String },
    /// Merge the `nvidia` runtime and, with `live_restore`, `"live-restore": true` into `path`,
    /// keeping every other key, after a backup. Without `live_restore` when dockerd has the
    /// `--live-restore` flag (the key in the file too would stop dockerd).
    ConfigureDocker { path: String, live_restore: bool },
    /// `systemctl reload docker`: enough for a new `runtimes` entry and `live-restore`.
    ReloadDocker,
    /// `systemctl restart docker`: needed when dockerd started before the toolkit's hook was
    /// installed (it registers its GPU device driver only at start). `stops`: the running
    /// containers without a restart policy, which stop; the installer asks first.
    RestartDocker { stops: Vec<String> },
    /// Register with the join code and write the agent's config (0600) with its token (and,
    /// with `--ca-file`, the name of the CA's copy, [`Purpose::AgentCa`]).
    Register { server: String, config: String },
    /// Keep the installed agent's registration (a repair: no join code, or one the platform no
    /// longer accepts): its config, token and server stay as they are, checked to be readable.
    KeepRegistration { node_id: String, config: String },
    /// Write `content` to `path` (created with `mode` from the first byte); skipped when
    /// identical. The JSON shows the mode in octal (`"0644"`) and never the content.
    WriteFile {
        path: String,
        #[serde(serialize_with = "octal")]
        mode: u32,
        purpose: Purpose,
        #[serde(skip)]
        content: Content,
    },
    /// `systemctl daemon-reload`, `enable`, `restart NAME`, then wait up to `wait_secs` for its
    /// first accepted heartbeat.
    StartAgent { name: String, wait_secs: u64 },
    /// Wait up to `wait_secs` for the agent's first GPU-in-a-container result (not in the JSON).
    GpuCheck {
        #[serde(skip)]
        wait_secs: u64,
    },
}

/// A repository to add, and the OS codename its suite defaults to. The JSON shows it flat:
/// `id`, `uri`, `suite`, `components`, `key_url`, `fingerprints`, `keyring`, `sources`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddRepo {
    pub repo: Repo,
    pub codename: String,
}

impl AddRepo {
    /// The deb822 `Suites:` value.
    pub fn suite(&self) -> &str {
        self.repo.suite.unwrap_or(&self.codename)
    }
}

impl Serialize for AddRepo {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let r = &self.repo;
        let mut st = s.serialize_struct("AddRepo", 8)?;
        st.serialize_field("id", r.id)?;
        st.serialize_field("uri", r.uri)?;
        st.serialize_field("suite", self.suite())?;
        st.serialize_field("components", r.components)?;
        st.serialize_field("key_url", r.key_url)?;
        st.serialize_field("fingerprints", r.fingerprints)?;
        st.serialize_field("keyring", &r.keyring_path())?;
        st.serialize_field("sources", &r.sources_path())?;
        st.end()
    }
}

/// A repository served by the owner's own source ([`OwnerSource`]). The JSON shows it flat:
/// `id`, `uri`, `suite`, `file` (the owner's source), `keyring` (the key it names),
/// `fingerprints` (the pinned ones; the keyring holds one of them and nothing else).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UseSource {
    pub repo: Repo,
    pub codename: String,
    pub source: OwnerSource,
}

impl UseSource {
    /// The suite the owner's entry must name.
    pub fn suite(&self) -> &str {
        self.repo.suite.unwrap_or(&self.codename)
    }
}

impl Serialize for UseSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let r = &self.repo;
        let mut st = s.serialize_struct("UseSource", 6)?;
        st.serialize_field("id", r.id)?;
        st.serialize_field("uri", r.uri)?;
        st.serialize_field("suite", self.suite())?;
        st.serialize_field("file", &self.source.file.display().to_string())?;
        st.serialize_field("keyring", &self.source.keyring)?;
        st.serialize_field("fingerprints", r.fingerprints)?;
        st.end()
    }
}

fn octal<S: serde::Serializer>(mode: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{mode:04o}"))
}

/// What a [`Step::WriteFile`] writes.
#[derive(Clone, PartialEq, Eq)]
pub enum Content {
    /// The agent the first step downloaded and verified, hashed again as it is installed.
    VerifiedAgent,
    /// These bytes (the unit, the drop-in, the proxy's values, the CA's copy).
    Bytes(Vec<u8>),
}

/// Never the bytes: the proxy's values may carry a password.
impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Content::VerifiedAgent => f.write_str("VerifiedAgent"),
            Content::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
        }
    }
}

/// Why a file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    AgentBinary,
    AgentUnit,
    /// The drop-in that names [`Purpose::AgentProxyEnv`] for the service; it holds no value.
    AgentProxy,
    /// The proxy variables the installer was given, for the service (0600: a proxy URL may
    /// carry a password).
    AgentProxyEnv,
    /// The copy of `--ca-file` that the agent's config names (0644).
    AgentCa,
}

impl Step {
    /// The checkpoint after this step, for crash tests (`knobs::checkpoint`).
    pub fn checkpoint(&self) -> String {
        match self {
            Step::DownloadAgent { .. } => "download_agent".into(),
            Step::AddRepository(a) => format!("add_repository_{}", a.repo.id),
            Step::UseSource(u) => format!("use_source_{}", u.repo.id),
            Step::AptUpdate => "apt_update".into(),
            Step::InstallPackages { .. } => "install_packages".into(),
            Step::ConfigureToolkit { .. } => "configure_toolkit".into(),
            Step::ConfigureDocker { .. } => "configure_docker".into(),
            Step::ReloadDocker => "reload_docker".into(),
            Step::RestartDocker { .. } => "restart_docker".into(),
            // The same checkpoint: a repair stops where an install would.
            Step::Register { .. } | Step::KeepRegistration { .. } => "register".into(),
            Step::WriteFile { purpose: Purpose::AgentBinary, .. } => "write_agent_binary".into(),
            Step::WriteFile { purpose: Purpose::AgentUnit, .. } => "write_agent_unit".into(),
            Step::WriteFile { purpose: Purpose::AgentProxy, .. } => "write_agent_proxy".into(),
            Step::WriteFile { purpose: Purpose::AgentProxyEnv, .. } => "write_agent_proxy_env".into(),
            Step::WriteFile { purpose: Purpose::AgentCa, .. } => "write_agent_ca".into(),
            Step::StartAgent { .. } => "start_agent".into(),
            Step::GpuCheck { .. } => "gpu_check".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
    /// Whether the install installs (or upgrades) the NVIDIA Container Toolkit.
    pub fn installs_toolkit(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(s, Step::InstallPackages { packages }
                if packages.iter().any(|p| p == gpum_preflight::facts::TOOLKIT_PACKAGE))
        })
    }

    /// A repair: the registration step keeps the installed agent's server `node_id` instead of
    /// registering with a join code.
    pub fn keep_registration(&mut self, node_id: &str) {
        for s in &mut self.steps {
            if let Step::Register { config, .. } = s {
                *s = Step::KeepRegistration { node_id: node_id.to_string(), config: std::mem::take(config) };
            }
        }
    }

    /// The containers a Docker restart would stop (empty when there is no restart).
    pub fn stops(&self) -> &[String] {
        self.steps
            .iter()
            .find_map(|s| match s {
                Step::RestartDocker { stops } => Some(stops.as_slice()),
                _ => None,
            })
            .unwrap_or(&[])
    }
}

/// What the plan needs besides the preflight facts.
#[derive(Debug, Clone, Default)]
pub struct PlanInput {
    /// The platform (`--server`); the dry run may have none.
    pub server: Option<String>,
    /// The repositories for this distribution (pinned, or the test host's with `test-knobs`).
    pub repos: Option<[Repo; 2]>,
    /// What [`crate::dockerd`] found: the engine and the containers a restart would stop.
    pub docker: crate::dockerd::DockerRuntimeFacts,
    /// `HTTPS_PROXY`/`NO_PROXY`… as the installer got them.
    pub proxy: Vec<(String, String)>,
    /// `--ca-file`'s bytes, when given: the install copies them for the agent.
    pub ca_pem: Option<Vec<u8>>,
    /// The owner's sources that serve a repository with exactly its pinned key, by repository
    /// id ([`gpum_repo_keys::sources::owner_source`]): used instead of adding gpum's own.
    pub owner_sources: Vec<(&'static str, OwnerSource)>,
}

/// The distribution whose repositories to use, from os-release.
pub fn distro(f: &Facts) -> Option<Distro> {
    match f.os.as_ref().ok()?.id.as_str() {
        "ubuntu" => Some(Distro::Ubuntu),
        "debian" => Some(Distro::Debian),
        _ => None,
    }
}

fn write(path: &str, mode: u32, purpose: Purpose, content: Content) -> Step {
    Step::WriteFile { path: path.into(), mode, purpose, content }
}

/// The drop-in that names the file with the installer's proxy variables for the service.
pub const PROXY_DROP_IN: &str = gpum_enroll::unit::PROXY_DROP_IN;
/// The file with those variables (0600).
pub const PROXY_ENV: &str = gpum_enroll::unit::PROXY_ENV;
/// The agent's copy of `--ca-file` (0644).
pub const AGENT_CA: &str = gpum_enroll::config::INSTALLED_CA;
/// How long the service has to send its first accepted heartbeat (the seed's exit 50).
pub const START_WAIT_SECS: u64 = 60;
/// How long the GPU check may take: the first probe pulls its image.
pub const GPU_WAIT_SECS: u64 = 600;

/// The plan for this machine. Docker and the toolkit are installed only when missing (the
/// toolkit also when older than the first release without a known container escape); Docker's
/// settings are merged only when they lack the `nvidia` runtime; Docker is restarted only when
/// its GPU device driver cannot be registered otherwise, and reloaded when that is enough.
pub fn plan(f: &Facts, input: &PlanInput) -> Plan {
    let mut steps = Vec::new();
    let server = input.server.clone().unwrap_or_else(|| "https://PLATFORM".into());
    steps.push(Step::DownloadAgent { url: format!("{}/dl/gpum-agent", server.trim_end_matches('/')) });
    let codename = f.os.as_ref().map(|o| o.codename.clone()).unwrap_or_default();
    let need_docker = !f.docker.present();
    let need_toolkit = !f.toolkit.present() || crate::dockerd::toolkit_too_old(f);
    if let Some([docker, toolkit]) = input.repos.or_else(|| distro(f).map(pinned::repos_for)) {
        let mut packages: Vec<String> = Vec::new();
        let repository = |repo: Repo| {
            let codename = codename.clone();
            match input.owner_sources.iter().find(|(id, _)| *id == repo.id) {
                Some((_, source)) => Step::UseSource(UseSource { repo, codename, source: source.clone() }),
                None => Step::AddRepository(AddRepo { repo, codename }),
            }
        };
        if need_docker {
            steps.push(repository(docker));
            packages.extend(docker.packages.iter().map(|p| p.to_string()));
        }
        if need_toolkit {
            steps.push(repository(toolkit));
            packages.extend(toolkit.packages.iter().map(|p| p.to_string()));
        }
        if !packages.is_empty() {
            steps.push(Step::AptUpdate);
            steps.push(Step::InstallPackages { packages });
        }
    }
    // A toolkit settings file that cannot be parsed is refused by the checks, like daemon.json.
    let toolkit_config_usable = !matches!(f.toolkit.config, Some(Err(_)));
    if (need_toolkit || !f.toolkit.config_is_gpums()) && toolkit_config_usable {
        steps.push(Step::ConfigureToolkit { path: gpum_preflight::facts::TOOLKIT_CONFIG.into() });
    }
    let has_runtime = f.docker.has_nvidia_runtime();
    let live_restore = f.docker.has_live_restore();
    // A daemon.json that cannot be parsed is refused by the checks (and never overwritten):
    // the plan does not promise to merge into it.
    let daemon_json_usable = !matches!(f.docker.daemon_json, Some(Err(_)));
    // With dockerd's `--live-restore` flag the file must not get the key; in a swarm the audit
    // refuses (moby will not run swarm mode with live-restore).
    let add_live_restore = !live_restore && f.docker.may_set_live_restore();
    if (need_docker || !has_runtime || add_live_restore) && daemon_json_usable {
        let path = gpum_preflight::facts::DAEMON_JSON.into();
        steps.push(Step::ConfigureDocker { path, live_restore: add_live_restore });
    }
    if need_docker {
        // A fresh engine: its package started it, perhaps before the toolkit's hook was
        // unpacked. Nothing runs on it yet, so a restart costs nothing.
        steps.push(Step::RestartDocker { stops: Vec::new() });
    } else if need_toolkit || input.docker.driver_stale() {
        steps.push(Step::RestartDocker { stops: input.docker.at_risk.clone() });
    } else if !has_runtime || add_live_restore || input.docker.engine_lacks_runtime {
        steps.push(Step::ReloadDocker);
    }
    if let Some(pem) = &input.ca_pem {
        // Before registration, which reaches the platform through it and names it in the config.
        steps.push(write(AGENT_CA, 0o644, Purpose::AgentCa, Content::Bytes(pem.clone())));
    }
    steps.push(Step::Register { server, config: agent_state::DEFAULT_CONFIG.into() });
    let bin = format!("{}/gpum-agent", agent_state::INSTALL_DIR);
    steps.push(write(&bin, 0o755, Purpose::AgentBinary, Content::VerifiedAgent));
    let unit = gpum_enroll::unit::UNIT.as_bytes().to_vec();
    steps.push(write(agent_state::UNIT_PATH, 0o644, Purpose::AgentUnit, Content::Bytes(unit)));
    if !input.proxy.is_empty() {
        // The values first: the drop-in never names a file that is not there yet.
        let values = gpum_enroll::unit::proxy_env(&input.proxy).into_bytes();
        steps.push(write(PROXY_ENV, 0o600, Purpose::AgentProxyEnv, Content::Bytes(values)));
        let drop_in = gpum_enroll::unit::proxy_drop_in().into_bytes();
        steps.push(write(PROXY_DROP_IN, 0o644, Purpose::AgentProxy, Content::Bytes(drop_in)));
    }
    steps.push(Step::StartAgent { name: agent_state::SERVICE_NAME.into(), wait_secs: START_WAIT_SECS });
    steps.push(Step::GpuCheck { wait_secs: GPU_WAIT_SECS });
    Plan { steps }
}

/// `9DC858229FC7DD38854AE2D88D81803C0EBFCD88` as `9DC8 5822 9FC7 DD38 854A  E2D8 8D81 803C 0EBF CD88`.
pub fn spaced_fpr(f: &str) -> String {
    let groups: Vec<&str> = f.as_bytes().chunks(4).map(|c| std::str::from_utf8(c).unwrap_or("")).collect();
    let mut s = String::new();
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            s.push_str(if i == 5 { "  " } else { " " });
        }
        s.push_str(g);
    }
    s
}

impl Step {
    /// One line for the human report; the texts are in [`crate::text`].
    pub fn describe(&self, lang: Lang) -> String {
        use crate::text::{Msg, t};
        let tr = |m: Msg| t(m, lang);
        match self {
            Step::DownloadAgent { url } => tr(Msg::StepDownload).replace("{url}", url),
            Step::AddRepository(a) => {
                let r = &a.repo;
                let fprs = r.fingerprints.iter().map(|f| spaced_fpr(f)).collect::<Vec<_>>().join(", ");
                let comps = if r.components.is_empty() {
                    String::new()
                } else {
                    format!(" {}", r.components.join(" "))
                };
                tr(Msg::StepAddRepo)
                    .replace("{id}", r.id)
                    .replace("{repo}", &format!("{} {}{comps}", r.uri, a.suite()))
                    .replace("{key_url}", r.key_url)
                    .replace("{fprs}", &fprs)
                    .replace("{files}", &format!("{}, {}", r.keyring_path(), r.sources_path()))
            }
            Step::UseSource(u) => {
                let r = &u.repo;
                let fprs = r.fingerprints.iter().map(|f| spaced_fpr(f)).collect::<Vec<_>>().join(", ");
                tr(Msg::StepUseSource)
                    .replace("{id}", r.id)
                    .replace("{file}", &u.source.file.display().to_string())
                    .replace("{keyring}", &u.source.keyring)
                    .replace("{fprs}", &fprs)
            }
            Step::AptUpdate => tr(Msg::StepAptUpdate).into(),
            Step::InstallPackages { packages } => {
                tr(Msg::StepInstall).replace("{packages}", &packages.join(" "))
            }
            Step::ConfigureToolkit { path } => tr(Msg::StepConfigureToolkit)
                .replace("{path}", path)
                .replace("{env}", gpum_preflight::parse::toolkit_config::ENVVAR_WHEN_UNPRIVILEGED)
                .replace("{mounts}", gpum_preflight::parse::toolkit_config::AS_VOLUME_MOUNTS),
            Step::ConfigureDocker { path, live_restore: true } => {
                tr(Msg::StepConfigureDocker).replace("{path}", path)
            }
            Step::ConfigureDocker { path, live_restore: false } => {
                tr(Msg::StepConfigureDockerRuntime).replace("{path}", path)
            }
            Step::ReloadDocker => tr(Msg::StepReloadDocker).into(),
            Step::RestartDocker { stops } if stops.is_empty() => tr(Msg::StepRestartDocker).into(),
            Step::RestartDocker { stops } => {
                tr(Msg::StepRestartDockerStops).replace("{names}", &crate::text::names(stops))
            }
            Step::Register { server, config } => {
                tr(Msg::StepRegister).replace("{server}", server).replace("{config}", config)
            }
            Step::KeepRegistration { node_id, config } => {
                tr(Msg::StepKeepRegistration).replace("{node}", node_id).replace("{config}", config)
            }
            Step::WriteFile { path, mode, purpose, .. } => {
                let what = match purpose {
                    Purpose::AgentBinary => Msg::FileAgentBinary,
                    Purpose::AgentUnit => Msg::FileAgentUnit,
                    Purpose::AgentProxy => Msg::FileAgentProxy,
                    Purpose::AgentProxyEnv => Msg::FileAgentProxyEnv,
                    Purpose::AgentCa => Msg::FileAgentCa,
                };
                tr(Msg::StepWrite)
                    .replace("{path}", path)
                    .replace("{mode}", &format!("{mode:04o}"))
                    .replace("{what}", tr(what))
            }
            Step::StartAgent { name, wait_secs } => {
                tr(Msg::StepStart).replace("{name}", name).replace("{secs}", &wait_secs.to_string())
            }
            Step::GpuCheck { .. } => tr(Msg::StepGpuCheck).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_grouped_like_gpg() {
        assert_eq!(
            spaced_fpr("9DC858229FC7DD38854AE2D88D81803C0EBFCD88"),
            "9DC8 5822 9FC7 DD38 854A  E2D8 8D81 803C 0EBF CD88"
        );
    }
}
