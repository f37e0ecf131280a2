//! What the install would do on this machine, computed from the audit's facts.
//!
//! `--dry-run` prints this [`Plan`]; the install ([`crate::apply`]) executes the same value,
//! step by step, so what the owner was shown is what runs. Steps name every repository (with
//! the pinned key fingerprints), package, file and service concretely.

use gpum_common::Lang;
use gpum_common::agent_state;
use gpum_preflight::Facts;
use gpum_repo_keys::pinned::{self, Distro, Repo};
use serde::Serialize;

/// One thing the install does, in the order it runs. The dry run prints these; the install
/// executes the same value ([`crate::apply`]) and never does anything that is not here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Step {
    /// Download the agent from the platform, verify it against the signed release manifest
    /// (name, version, SHA-256), and test-run it from `$TMPDIR`. Together with the repository
    /// keys, this is verified before anything on the machine changes.
    DownloadAgent { url: String },
    /// Download the key from `key_url`, refuse it unless its primary fingerprint is one of
    /// `fingerprints`, write it to `keyring`, and write the deb822 source to `sources`.
    AddRepository {
        id: String,
        uri: String,
        suite: String,
        components: Vec<String>,
        key_url: String,
        fingerprints: Vec<String>,
        keyring: String,
        sources: String,
    },
    /// `apt-get update` (with the new sources).
    AptUpdate,
    /// `apt-get install` of packages that are missing (or too old).
    InstallPackages { packages: Vec<String> },
    /// Merge the `nvidia` runtime into `path`, keeping every other key, after a backup.
    ConfigureDocker { path: String },
    /// `systemctl reload docker`: enough for a new `runtimes` entry.
    ReloadDocker,
    /// `systemctl restart docker`: needed when dockerd started before the toolkit's hook was
    /// installed (it registers its GPU device driver only at start). `stops`: the running
    /// containers without a restart policy, which stop; the installer asks first.
    RestartDocker { stops: Vec<String> },
    /// Register with the join code and write the agent's config (0600) with its token (and,
    /// with `--ca-file`, the name of the CA's copy, [`Purpose::AgentCa`]).
    Register { server: String, config: String },
    /// Write a file (created with `mode` from the first byte); skipped when identical. The
    /// agent's binary is the verified download, hashed again as it is installed.
    WriteFile { path: String, mode: String, purpose: Purpose },
    /// `systemctl daemon-reload`, `enable`, `restart NAME`, then wait up to `wait_secs` for its
    /// first accepted heartbeat.
    StartAgent { name: String, wait_secs: u64 },
    /// Wait for the agent's first GPU-in-a-container result.
    GpuCheck,
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
            Step::AddRepository { id, .. } => format!("add_repository_{id}"),
            Step::AptUpdate => "apt_update".into(),
            Step::InstallPackages { .. } => "install_packages".into(),
            Step::ConfigureDocker { .. } => "configure_docker".into(),
            Step::ReloadDocker => "reload_docker".into(),
            Step::RestartDocker { .. } => "restart_docker".into(),
            Step::Register { .. } => "register".into(),
            Step::WriteFile { purpose: Purpose::AgentBinary, .. } => "write_agent_binary".into(),
            Step::WriteFile { purpose: Purpose::AgentUnit, .. } => "write_agent_unit".into(),
            Step::WriteFile { purpose: Purpose::AgentProxy, .. } => "write_agent_proxy".into(),
            Step::WriteFile { purpose: Purpose::AgentProxyEnv, .. } => "write_agent_proxy_env".into(),
            Step::WriteFile { purpose: Purpose::AgentCa, .. } => "write_agent_ca".into(),
            Step::StartAgent { .. } => "start_agent".into(),
            Step::GpuCheck => "gpu_check".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
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
    /// Whether `--ca-file` was given: the install copies it for the agent.
    pub ca_file: bool,
}

/// The distribution whose repositories to use, from os-release.
pub fn distro(f: &Facts) -> Option<Distro> {
    match f.os.as_ref().ok()?.id.as_str() {
        "ubuntu" => Some(Distro::Ubuntu),
        "debian" => Some(Distro::Debian),
        _ => None,
    }
}

fn add_repo(r: &Repo, codename: &str) -> Step {
    Step::AddRepository {
        id: r.id.into(),
        uri: r.uri.into(),
        suite: r.suite.unwrap_or(codename).into(),
        components: r.components.iter().map(|c| c.to_string()).collect(),
        key_url: r.key_url.into(),
        fingerprints: r.fingerprints.iter().map(|f| f.to_string()).collect(),
        keyring: r.keyring_path(),
        sources: r.sources_path(),
    }
}

fn write(path: &str, mode: u32, purpose: Purpose) -> Step {
    Step::WriteFile { path: path.into(), mode: format!("{mode:04o}"), purpose }
}

/// The drop-in that names the file with the installer's proxy variables for the service.
pub const PROXY_DROP_IN: &str = gpum_agent::unit::PROXY_DROP_IN;
/// The file with those variables (0600).
pub const PROXY_ENV: &str = gpum_agent::unit::PROXY_ENV;
/// The agent's copy of `--ca-file` (0644).
pub const AGENT_CA: &str = gpum_agent::config::INSTALLED_CA;
/// How long the service has to send its first accepted heartbeat (the seed's exit 50).
pub const START_WAIT_SECS: u64 = 60;

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
        if need_docker {
            steps.push(add_repo(&docker, &codename));
            packages.extend(docker.packages.iter().map(|p| p.to_string()));
        }
        if need_toolkit {
            steps.push(add_repo(&toolkit, &codename));
            packages.extend(toolkit.packages.iter().map(|p| p.to_string()));
        }
        if !packages.is_empty() {
            steps.push(Step::AptUpdate);
            steps.push(Step::InstallPackages { packages });
        }
    }
    let has_runtime = f.docker.has_nvidia_runtime();
    if need_docker || !has_runtime {
        steps.push(Step::ConfigureDocker { path: gpum_preflight::facts::DAEMON_JSON.into() });
    }
    if need_docker {
        // A fresh engine: its package started it, perhaps before the toolkit's hook was
        // unpacked. Nothing runs on it yet, so a restart costs nothing.
        steps.push(Step::RestartDocker { stops: Vec::new() });
    } else if need_toolkit || input.docker.driver_stale() {
        steps.push(Step::RestartDocker { stops: input.docker.at_risk.clone() });
    } else if !has_runtime || input.docker.engine_lacks_runtime {
        steps.push(Step::ReloadDocker);
    }
    if input.ca_file {
        // Before registration, which reaches the platform through it and names it in the config.
        steps.push(write(AGENT_CA, 0o644, Purpose::AgentCa));
    }
    steps.push(Step::Register { server, config: agent_state::DEFAULT_CONFIG.into() });
    steps.push(write(&format!("{}/gpum-agent", agent_state::INSTALL_DIR), 0o755, Purpose::AgentBinary));
    steps.push(write(agent_state::UNIT_PATH, 0o644, Purpose::AgentUnit));
    if !input.proxy.is_empty() {
        // The values first: the drop-in never names a file that is not there yet.
        steps.push(write(PROXY_ENV, 0o600, Purpose::AgentProxyEnv));
        steps.push(write(PROXY_DROP_IN, 0o644, Purpose::AgentProxy));
    }
    steps.push(Step::StartAgent { name: agent_state::SERVICE_NAME.into(), wait_secs: START_WAIT_SECS });
    steps.push(Step::GpuCheck);
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
            Step::AddRepository { id, uri, suite, components, key_url, fingerprints, keyring, sources } => {
                let fprs = fingerprints.iter().map(|f| spaced_fpr(f)).collect::<Vec<_>>().join(", ");
                let comps =
                    if components.is_empty() { String::new() } else { format!(" {}", components.join(" ")) };
                tr(Msg::StepAddRepo)
                    .replace("{id}", id)
                    .replace("{repo}", &format!("{uri} {suite}{comps}"))
                    .replace("{key_url}", key_url)
                    .replace("{fprs}", &fprs)
                    .replace("{files}", &format!("{keyring}, {sources}"))
            }
            Step::AptUpdate => tr(Msg::StepAptUpdate).into(),
            Step::InstallPackages { packages } => {
                tr(Msg::StepInstall).replace("{packages}", &packages.join(" "))
            }
            Step::ConfigureDocker { path } => tr(Msg::StepConfigureDocker).replace("{path}", path),
            Step::ReloadDocker => tr(Msg::StepReloadDocker).into(),
            Step::RestartDocker { stops } if stops.is_empty() => tr(Msg::StepRestartDocker).into(),
            Step::RestartDocker { stops } => {
                tr(Msg::StepRestartDockerStops).replace("{names}", &crate::text::names(stops))
            }
            Step::Register { server, config } => {
                tr(Msg::StepRegister).replace("{server}", server).replace("{config}", config)
            }
            Step::WriteFile { path, mode, purpose } => {
                let what = match purpose {
                    Purpose::AgentBinary => Msg::FileAgentBinary,
                    Purpose::AgentUnit => Msg::FileAgentUnit,
                    Purpose::AgentProxy => Msg::FileAgentProxy,
                    Purpose::AgentProxyEnv => Msg::FileAgentProxyEnv,
                    Purpose::AgentCa => Msg::FileAgentCa,
                };
                tr(Msg::StepWrite).replace("{path}", path).replace("{mode}", mode).replace("{what}", tr(what))
            }
            Step::StartAgent { name, wait_secs } => {
                tr(Msg::StepStart).replace("{name}", name).replace("{secs}", &wait_secs.to_string())
            }
            Step::GpuCheck => tr(Msg::StepGpuCheck).into(),
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
