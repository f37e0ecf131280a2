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
