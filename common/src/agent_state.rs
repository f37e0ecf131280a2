//! The agent's state file, `<state dir>/state.json`.
//!
//! Registration writes a fresh one; the running agent rewrites it atomically when it changes
//! (else every 30 s) and when it stops for good (gpum-enroll's `state` module); `gpum-agent
//! status`, the agent's `doctor` and the installer (its `existing_install` check, its wait for
//! the GPU check) read it. It holds no secret (the token lives only in `config.toml`, mode
//! 0600).

use std::io;
use std::path::{Path, PathBuf};

use gpum_host::Host;
use gpum_protocol::VerificationState;
use serde::{Deserialize, Serialize};

/// File name inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/gpum-agent";
/// Default config file (with the default state directory).
pub const DEFAULT_CONFIG: &str = "/etc/gpum-agent/config.toml";
/// Where the installed binary lives.
pub const INSTALL_DIR: &str = "/opt/gpum-agent";
pub const CONFIG_DIR: &str = "/etc/gpum-agent";
pub const UNIT_PATH: &str = "/etc/systemd/system/gpum-agent.service";
pub const SERVICE_NAME: &str = "gpum-agent";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Connection {
    /// Started, no answer yet.
    #[default]
    Connecting,
    /// The last heartbeat was answered.
    Connected,
    /// The last attempt failed; the agent is backing off and retrying.
    Unreachable,
    /// Stopped for good; see [`AgentState::stopped`].
    Stopped,
}

/// Why the agent stopped for good (exit 78).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `node_deleted` (410) or `token_replaced` (401): «сервер удалён или токен заменён».
    Revoked,
    /// Missing or invalid configuration: «ошибка конфигурации».
    ConfigError,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    pub reason: StopReason,
    /// The platform's error code or the config problem, for humans.
    pub detail: String,
    /// Unix seconds.
    pub at: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AgentState {
    pub node_id: Option<String>,
    pub server: Option<String>,
    pub connection: Connection,
    /// Unix seconds of the last answered heartbeat.
    pub last_heartbeat_at: Option<u64>,
    /// The latest probe's verdict, spelled as on the wire (`awaiting_check` | `verified` |
    /// `failed`).
    pub verification: Option<VerificationState>,
    /// The probe image the platform's last answer named; absent when it names none (the GPU
    /// check then waits, `awaiting_check`). The installer's repair reads it to know whether
    /// a check is coming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_image: Option<String>,
    /// The last error, for humans (no secrets).
    pub last_error: Option<String>,
    pub clock_skew_secs: Option<i64>,
    pub docker_ok: Option<bool>,
    pub stopped: Option<Stopped>,
    /// Unix seconds of this write.
    pub updated_at: u64,
}

/// The last in-place upgrade's record (issue 47), `<state dir>/upgrade.json`, 0600: written by
/// the agent before it swaps its binary (`pending`), by the new binary after its first
/// accepted heartbeat (`succeeded`), by the old binary's `rollback` (`rolled_back`), and by the
/// agent when an attempt was refused or failed. Read at the agent's start, and by `status` and
/// `doctor`.
pub const UPGRADE_FILE: &str = "upgrade.json";

/// Where an upgrade stands ([`UpgradeRecord::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpgradeState {
    /// The new binary is in place (or about to be); it must send a good heartbeat before
    /// [`UpgradeRecord::deadline`], or the rollback guard puts the previous one back.
    Pending,
    Succeeded,
    RolledBack,
    Refused,
    Failed,
}

impl UpgradeState {
    /// The outcome to report; `None` while pending.
    pub fn outcome(self) -> Option<gpum_protocol::UpgradeOutcome> {
        use gpum_protocol::UpgradeOutcome as O;
        match self {
            UpgradeState::Pending => None,
            UpgradeState::Succeeded => Some(O::Succeeded),
            UpgradeState::RolledBack => Some(O::RolledBack),
            UpgradeState::Refused => Some(O::Refused),
            UpgradeState::Failed => Some(O::Failed),
        }
    }

    /// The state an outcome ends in.
    pub fn of(outcome: gpum_protocol::UpgradeOutcome) -> UpgradeState {
        use gpum_protocol::UpgradeOutcome as O;
        match outcome {
            O::Succeeded => UpgradeState::Succeeded,
            O::RolledBack => UpgradeState::RolledBack,
            O::Refused => UpgradeState::Refused,
            O::Failed => UpgradeState::Failed,
        }
    }
}

/// `upgrade.json` ([`UPGRADE_FILE`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeRecord {
    /// The version that ran before the attempt.
    pub from: String,
    /// The version offered.
    pub to: String,
    /// Unix seconds: when the attempt started, and the rollback guard's deadline (0 when no
    /// swap was made).
    pub started: u64,
    #[serde(default)]
    pub deadline: u64,
    pub state: UpgradeState,
    /// Short English text: why it was refused, failed or rolled back.
    #[serde(default)]
    pub detail: String,
    /// Unix seconds when it ended; absent while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    /// Whether a heartbeat carrying its report was accepted; until then each start sends it.
    #[serde(default)]
    pub reported: bool,
}

impl UpgradeRecord {
    /// The report for the platform, once it ended.
    pub fn report(&self) -> Option<gpum_protocol::UpgradeReport> {
        Some(gpum_protocol::UpgradeReport {
            from: self.from.clone(),
            to: self.to.clone(),
            outcome: self.state.outcome()?,
            detail: self.detail.clone(),
            at: self.at.unwrap_or(self.started),
        })
    }
}

/// `<state_dir>/upgrade.json`.
pub fn upgrade_path(state_dir: &Path) -> PathBuf {
    state_dir.join(UPGRADE_FILE)
}

/// Reads `upgrade.json`; `Ok(None)` when no upgrade was ever tried.
pub fn read_upgrade(host: &dyn Host, state_dir: &Path) -> io::Result<Option<UpgradeRecord>> {
    match host.read(&upgrade_path(state_dir)) {
        Ok(b) => {
            serde_json::from_slice(&b).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `upgrade.json` atomically, 0600.
pub fn write_upgrade(host: &dyn Host, state_dir: &Path, rec: &UpgradeRecord) -> io::Result<()> {
    let data = serde_json::to_vec_pretty(rec).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    host.write_atomic(&upgrade_path(state_dir), &data, 0o600)
}

/// `<state_dir>/state.json`.
pub fn state_path(state_dir: &Path) -> PathBuf {
    state_dir.join(STATE_FILE)
}

/// Reads the state; `Ok(None)` when the agent never wrote one, `InvalidData` when it is not
/// valid JSON of this schema. The one reader for the agent's `status`/`doctor` and the
/// installer's `existing_install` check, so they cannot disagree on what a state file says.
pub fn read(host: &dyn Host, state_dir: &Path) -> io::Result<Option<AgentState>> {
    match host.read(&state_path(state_dir)) {
        Ok(b) => {
            serde_json::from_slice(&b).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn read_absent_valid_and_invalid() {
        let dir = Path::new(DEFAULT_STATE_DIR);
        assert_eq!(read(&FakeHost::new(), dir).unwrap(), None);
        let st =
            AgentState { node_id: Some("n".into()), connection: Connection::Connected, ..Default::default() };
        let h = FakeHost::new().file(state_path(dir), serde_json::to_vec(&st).unwrap());
        assert_eq!(read(&h, dir).unwrap(), Some(st));
        let h = FakeHost::new().file(state_path(dir), "{not json");
        assert_eq!(read(&h, dir).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    /// A state file as the agent wrote it while `verification` was a string: it still reads,
    /// and written again it is the same bytes.
    #[test]
    fn a_state_file_of_the_string_era_reads_and_writes_the_same() {
        let before = r#"{
  "node_id": "n-8f3a",
  "server": "https://gpum.example",
  "connection": "connected",
  "last_heartbeat_at": 1796290406,
  "verification": "verified",
  "last_error": null,
  "clock_skew_secs": -7,
  "docker_ok": true,
  "stopped": {
    "reason": "revoked",
    "detail": "token_replaced",
    "at": 1796290410
  },
  "updated_at": 1796290410
}"#;
        let dir = Path::new(DEFAULT_STATE_DIR);
        let st = read(&FakeHost::new().file(state_path(dir), before), dir).unwrap().unwrap();
        assert_eq!(st.verification, Some(VerificationState::Verified));
        assert_eq!(st.connection, Connection::Connected);
        assert_eq!(st.stopped.as_ref().map(|s| s.reason), Some(StopReason::Revoked));
        assert_eq!(String::from_utf8(serde_json::to_vec_pretty(&st).unwrap()).unwrap(), before);
        for (text, v) in [
            ("awaiting_check", Some(VerificationState::AwaitingCheck)),
            ("failed", Some(VerificationState::Failed)),
        ] {
            let json = before.replace("\"verified\"", &format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<AgentState>(&json).unwrap().verification, v, "{text}");
        }
        let json = before.replace("\"verified\"", "null");
        assert_eq!(serde_json::from_str::<AgentState>(&json).unwrap().verification, None);
        assert_eq!(
            serde_json::to_string_pretty(&serde_json::from_str::<AgentState>(&json).unwrap()).unwrap(),
            json
        );
    }
}
