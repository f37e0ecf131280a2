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
