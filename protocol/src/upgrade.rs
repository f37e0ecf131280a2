//! Signed in-place agent upgrades (issue 47): what the platform offers in a heartbeat answer,
//! where the agent fetches the release from, and what it reports back.
//!
//! The platform only *names* a version. Everything that decides whether the agent runs it is
//! the agent's: the release's signed metadata (`release.json`, with an expiry) and signed
//! manifest, verified against the release key compiled into the agent, the artifact's name,
//! size and SHA-256, and a version strictly newer than its own (docs/trust.md).

use serde::{Deserialize, Serialize};

/// The files of one release an agent may fetch, under [`release_file_path`]. Anything else is
/// 404. The bodies are exactly the signed dist's files.
pub const RELEASE_FILES: [&str; 5] =
    ["release.json", "release.json.sig", "manifest.json", "manifest.json.sig", "gpum-agent"];

/// `GET /api/v1/agent/releases/{version}/{file}` (the node's bearer token): one file of a
/// release the operator added (`gpum-platform releases add DIR`).
pub fn release_file_path(version: &str, file: &str) -> String {
    format!("{}/{version}/{file}", crate::PATH_AGENT_RELEASES)
}

/// `HeartbeatResponse::upgrade`: the version the platform wants this node to run. Sent only to
/// a node in an active rollout whose owner has not turned automatic upgrades off. Older agents
/// ignore it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeOffer {
    /// `MAJOR.MINOR.PATCH`. The agent refuses one that is not newer than its own, whatever the
    /// platform says.
    pub version: String,
}

named_enum! {
    /// How an upgrade ended, as the agent reports it and the platform stores it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum UpgradeOutcome {
        /// The new version runs and its first heartbeat was accepted.
        Succeeded = "succeeded",
        /// The new version did not send a good heartbeat within the bound: the previous binary
        /// was put back and started.
        RolledBack = "rolled_back",
        /// Verification refused the release (signature, expiry, manifest, size, SHA-256, name,
        /// or a version not newer than the agent's own): nothing on the machine changed.
        Refused = "refused",
        /// The download or the write failed before the swap: nothing changed; retried later.
        Failed = "failed",
    }
}

/// `HeartbeatRequest::upgrade`: the last upgrade attempt's result. Sent until a heartbeat
/// carrying it is accepted (as command results are), and again after each restart until then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeReport {
    /// The version the agent ran before the attempt.
    pub from: String,
    /// The version it was offered.
    pub to: String,
    pub outcome: UpgradeOutcome,
    /// Short English text: why (at most [`crate::limits::MAX_TEXT_LEN`] bytes are kept).
    pub detail: String,
    /// Unix seconds (the agent's clock) when the attempt ended.
    pub at: u64,
}

/// The operator's releases (`gpum-platform releases …`): `GET` lists them with their rollouts;
/// `POST {PATH_ADMIN_RELEASES}/{version}/rollout` starts or changes one ([`RolloutRequest`]);
/// `POST {PATH_ADMIN_RELEASES}/pause|resume|halt` acts on the current rollout. Adding a release
/// is the command line's alone (`releases add DIR`, on the platform's machine: the agent binary is
/// larger than a request body may be).
pub const PATH_ADMIN_RELEASES: &str = "/api/v1/admin/releases";

named_enum! {
    /// Where a release's rollout stands. At most one rollout is `active` or `paused` at a
    /// time; starting another one marks the previous one `done`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum RolloutState {
        /// Offered to the nodes in its percentage.
        #[default]
        Active = "active",
        /// Offered to none until resumed.
        Paused = "paused",
        /// Stopped by the operator or by the failure rule; offered to none until resumed.
        Halted = "halted",
        /// Replaced by a later rollout.
        Done = "done",
    }
}

named_enum! {
    /// Why a rollout halted.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum HaltReason {
        /// `releases halt`.
        Operator = "operator",
        /// More than the rollout's share of the nodes that reported on its version rolled back
        /// or refused it.
        Failures = "failures",
    }
}

/// The largest share of failed nodes a rollout accepts by default, in percent of the nodes
/// that reported on its version.
pub const DEFAULT_MAX_FAILURE_PERCENT: u8 = 20;

/// `POST {PATH_ADMIN_RELEASES}/{version}/rollout`: offer `version` to `percent` % of the
/// eligible nodes (a stable choice: raising the percentage keeps the nodes already chosen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutRequest {
    /// 0 to 100.
    pub percent: u8,
    /// The share of failed nodes (of those that reported) above which the rollout halts
    /// itself; [`DEFAULT_MAX_FAILURE_PERCENT`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failure_percent: Option<u8>,
    /// TEST ONLY (platforms built with the `test-knobs` feature; refused otherwise): offer the
    /// version whatever the node runs, so a test can prove the agent refuses a downgrade.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offer_regardless: bool,
    /// The schedule: the percentage rises by itself ([`RolloutStep`]); absent, it changes only
    /// when the operator sets it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<RolloutStep>,
}

/// A rollout's schedule: while the rollout is active, its percentage rises by `percent` every
/// `every_secs`, up to 100. The time it spends paused or halted does not count: a step falls
/// due `every_secs` of active time after the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutStep {
    /// 1 to 100.
    pub percent: u8,
    /// At least [`MIN_ROLLOUT_STEP_SECS`].
    pub every_secs: u64,
}

/// The shortest interval between two scheduled steps: a minute (the failures of one step must
/// have time to come back before the next).
pub const MIN_ROLLOUT_STEP_SECS: u64 = 60;

/// A release's rollout, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutSummary {
    pub version: String,
    pub state: RolloutState,
    pub percent: u8,
    pub max_failure_percent: u8,
    /// Set when `state` is `halted`.
    #[serde(default)]
    pub halt_reason: Option<HaltReason>,
    /// The nodes that reported on this version, and how many of them rolled back or refused
    /// it (at the halt, for a rollout the failures halted; else now).
    pub reported: u32,
    pub failed: u32,
    /// Unix seconds: when the rollout started, and when its state or percentage last changed
    /// (a scheduled step is not a change of the row: `percent` is computed from the schedule).
    pub started_at: u64,
    pub updated_at: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub offer_regardless: bool,
    /// The schedule, when the rollout has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<RolloutStep>,
    /// Unix seconds: when the next scheduled step raises `percent`, for an active rollout with a
    /// schedule below 100 %.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_step_at: Option<u64>,
}

/// One release the operator added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseSummary {
    pub version: String,
    /// Unix seconds.
    pub added_at: u64,
    /// The agent binary's size and SHA-256 (hex), as the signed manifest lists them.
    pub agent_size: u64,
    pub agent_sha256: String,
    /// The signed metadata's expiry (Unix seconds): agents refuse the release after it.
    pub expires: u64,
    /// Its rollout, if one was started.
    #[serde(default)]
    pub rollout: Option<RolloutSummary>,
}

/// `GET {PATH_ADMIN_RELEASES}`: newest added first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReleaseList {
    pub releases: Vec<ReleaseSummary>,
}

/// A server's upgrades as its owner and the operator see them (`NodeSummary::upgrades`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeUpgrades {
    /// The owner's switch "automatic upgrades" (default on).
    pub auto_update: bool,
    /// What the agent's `config.toml` says (`None`: an agent that does not report it).
    #[serde(default)]
    pub agent_auto_update: Option<bool>,
    /// The version the current rollout offers this server and it has not reported on yet.
    #[serde(default)]
    pub pending: Option<String>,
    /// The last upgrade's result the agent reported.
    #[serde(default)]
    pub last: Option<UpgradeReport>,
}

impl Default for NodeUpgrades {
    fn default() -> Self {
        NodeUpgrades { auto_update: true, agent_auto_update: None, pending: None, last: None }
    }
}
