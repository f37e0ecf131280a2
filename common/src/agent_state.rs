//! The agent's state file, `<state dir>/state.json`.
//!
//! The agent writes it atomically after every heartbeat attempt and when it stops; `gpum-agent
//! status`, the agent's `doctor` and the installer's `existing_install` check read it. It holds no
//! secret (the token lives only in `config.toml`, mode 0600).

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
    /// `awaiting_check` | `verified` | `failed` (the protocol's VerificationState, as text).
    pub verification: Option<String>,
    /// The last error, for humans (no secrets).
    pub last_error: Option<String>,
    pub clock_skew_secs: Option<i64>,
    pub docker_ok: Option<bool>,
    pub stopped: Option<Stopped>,
    /// Unix seconds of this write.
    pub updated_at: u64,
}
