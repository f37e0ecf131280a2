//! What the install would do on this machine, computed from the audit's facts.
//!
//! `--dry-run` prints this [`Plan`]; the install flow (a later issue) executes the same value,
//! step by step, so what the owner was shown is what runs. Steps name every repository (with
//! the pinned key fingerprints), package, file and service concretely.

use gpum_common::Lang;
use gpum_common::agent_state;
use gpum_preflight::Facts;
use gpum_repo_keys::pinned::{self, Distro, Repo};
use serde::Serialize;

/// One thing the install changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Step {
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
    /// `apt-get install` of packages that are missing.
    InstallPackages { packages: Vec<String> },
    /// Write a file (created with `mode` from the first byte).
    WriteFile { path: String, mode: String, purpose: Purpose },
    /// `systemctl restart NAME`; `stops_containers`: containers without a restart policy stop.
    RestartService { name: String, stops_containers: bool },
    /// `systemctl daemon-reload`, `enable --now NAME`.
    EnableService { name: String },
}

/// Why a file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// Docker's settings, with the `nvidia` runtime added and everything else kept.
    DockerNvidiaRuntime,
    /// The agent's configuration, holding its token (0600).
    AgentConfig,
    AgentUnit,
    AgentBinary,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(transparent)]
pub struct Plan {
    pub steps: Vec<Step>,
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

/// The plan for this machine. Docker and the toolkit are installed only when missing; Docker's
/// settings are written (and Docker restarted) only when it lacks the `nvidia` runtime.
pub fn plan(f: &Facts) -> Plan {
    let mut steps = Vec::new();
    let codename = f.os.as_ref().map(|o| o.codename.clone()).unwrap_or_default();
    let need_docker = !f.docker.present();
    let need_toolkit = !f.toolkit.present();
    if let Some(d) = distro(f) {
        let [docker, toolkit] = pinned::repos_for(d);
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
        steps.push(write(gpum_preflight::facts::DAEMON_JSON, 0o644, Purpose::DockerNvidiaRuntime));
        // A fresh Docker has no containers to stop.
        steps.push(Step::RestartService { name: "docker".into(), stops_containers: !need_docker });
    }
    steps.push(write(&format!("{}/gpum-agent", agent_state::INSTALL_DIR), 0o755, Purpose::AgentBinary));
    steps.push(write(agent_state::DEFAULT_CONFIG, 0o600, Purpose::AgentConfig));
    steps.push(write(agent_state::UNIT_PATH, 0o644, Purpose::AgentUnit));
    if f.existing.unit {
        steps.push(Step::RestartService { name: agent_state::SERVICE_NAME.into(), stops_containers: false });
    } else {
        steps.push(Step::EnableService { name: agent_state::SERVICE_NAME.into() });
    }
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
    /// One line for the human report.
    pub fn describe(&self, lang: Lang) -> String {
        let ru = lang == Lang::Ru;
        match self {
            Step::AddRepository { id, uri, suite, components, key_url, fingerprints, keyring, sources } => {
                let fprs = fingerprints.iter().map(|f| spaced_fpr(f)).collect::<Vec<_>>().join(", ");
                let comps =
                    if components.is_empty() { String::new() } else { format!(" {}", components.join(" ")) };
                if ru {
                    format!(
                        "добавить репозиторий {id}: {uri} {suite}{comps}; ключ {key_url}, принимается только отпечаток {fprs}; файлы {keyring}, {sources}"
                    )
                } else {
                    format!(
                        "add repository {id}: {uri} {suite}{comps}; key {key_url}, accepted only with fingerprint {fprs}; files {keyring}, {sources}"
                    )
                }
            }
            Step::AptUpdate => {
                if ru {
                    "обновить списки пакетов (apt-get update)".into()
                } else {
                    "refresh package lists (apt-get update)".into()
                }
            }
            Step::InstallPackages { packages } => {
                let p = packages.join(" ");
                if ru {
                    format!("установить пакеты: {p}")
                } else {
                    format!("install packages: {p}")
                }
            }
            Step::WriteFile { path, mode, purpose } => {
                let what = match (purpose, ru) {
                    (Purpose::DockerNvidiaRuntime, true) => {
                        "настройки Docker: добавить среду nvidia, остальное сохранить"
                    }
                    (Purpose::DockerNvidiaRuntime, false) => {
                        "Docker settings: add the nvidia runtime, keep the rest"
                    }
                    (Purpose::AgentConfig, true) => "настройки агента с его токеном",
                    (Purpose::AgentConfig, false) => "the agent's settings, with its token",
                    (Purpose::AgentUnit, true) => "служба systemd",
                    (Purpose::AgentUnit, false) => "the systemd unit",
                    (Purpose::AgentBinary, true) => "программа агента",
                    (Purpose::AgentBinary, false) => "the agent program",
                };
                if ru {
                    format!("записать {path} ({mode}): {what}")
                } else {
                    format!("write {path} ({mode}): {what}")
                }
            }
            Step::RestartService { name, stops_containers } => match (ru, stops_containers) {
                (true, true) => format!(
                    "перезапустить {name}; контейнеры без политики автозапуска при этом остановятся (установщик спросит подтверждение)"
                ),
                (true, false) => format!("перезапустить {name}"),
                (false, true) => format!(
                    "restart {name}; containers without a restart policy will stop (the installer asks first)"
                ),
                (false, false) => format!("restart {name}"),
            },
            Step::EnableService { name } => {
                if ru {
                    format!("включить и запустить службу {name}")
                } else {
                    format!("enable and start the {name} service")
                }
            }
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
