//! The platform's state in SQLite or PostgreSQL: schema, migrations and every operation, as
//! plain functions over a [`Conn`] (`sql.rs`: the same SQL on both engines). The HTTP server
//! and the CLI call the same functions, so the admin API and `gpum-platform nodes ...` cannot
//! drift apart.
//!
//! Privacy and secrecy, enforced here:
//! - node tokens, join codes and install ids are stored only as SHA-256 hashes (hex); the
//!   admin token is never stored at all (the server keeps its hash in memory);
//! - no column holds an IP address or anything derived from the connection;
//! - a deleted node keeps only its id, its token hash and when it was deleted, so its agent can
//!   be told `node_deleted` (410) instead of `unauthorized`.
//!
//! A replaced token's hash moves to `replaced_tokens`, so the platform can tell "your token was
//! replaced" (401 `token_replaced`, the agent stops for good) from "I never issued this".
//!
//! Bounded, so that no node can fill the disk: every list a heartbeat carries is refused over
//! `gpum_protocol::limits`, free text is cut to `limits::MAX_TEXT_LEN`, and the per-node
//! histories (removed containers, delivered commands) keep only their newest records.

use std::path::Path;

use crate::params;
use crate::sql::{Conn, OptionalExtension, Target};
use gpum_protocol::joincode::JoinCode;
use gpum_protocol::{
    CommandKind, CommandQueued, CommandResult, CommandStatus, ENROLL_GRACE_SECS, EnrollRequest,
    EnrollResponse, ErrorCode, Health, HeartbeatRequest, HeartbeatResponse, Inventory, JoinCodeCreated,
    MAX_EVENTS_PER_NODE, MAX_MIN_RENTAL_MINUTES, MAX_NODE_NAME_CHARS, MAX_PRICE_PER_GPU_HOUR,
    MAX_SAMPLES_PER_NODE, Metrics, MetricsSample, NodeEvent, NodeEventKind, NodeEvents, NodeList,
    NodeMetrics, NodeSettings, NodeSummary, OFFLINE_AFTER_SECS, Quarantine, RegisterRequest,
    RegisterResponse, RemovedContainer, SAMPLE_INTERVAL_SECS, SAMPLE_WINDOW_SECS, TokenRotated,
    UpdateNodeRequest, limits,
};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Default join-code lifetime.
pub const DEFAULT_JOIN_CODE_TTL_SECS: u64 = 24 * 3600;
/// How many command and removal records a node listing carries.
const HISTORY: i64 = 50;
/// The longest id (GPU UUID, container id, command id) the platform accepts.
const MAX_ID_LEN: usize = 128;
/// Delivered commands kept per node (older ones are pruned); pending ones are always kept.
pub const COMMAND_HISTORY_PER_NODE: usize = 256;

/// SHA-256 of a secret, hex. The only form in which secrets reach the database.
pub fn hash_secret(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A fresh 256-bit token, hex.
pub fn new_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

pub(crate) fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("{prefix}{}", hex::encode(b))
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

mod alerts;
mod earnings;
mod enroll;
mod events;
mod heartbeat;
mod maintenance;
mod migrations;
mod nodes;
mod owners;
mod releases;
mod reliability;
#[cfg(test)]
mod tests;

pub use alerts::*;
pub use earnings::{csv as earnings_csv, currency, earnings, image_name, iso_utc, set_currency};
pub use enroll::*;
pub(crate) use events::*;
pub use heartbeat::*;
pub use maintenance::{add_maintenance, delete_maintenance, maintenance_windows};
pub use migrations::*;
pub use nodes::*;
pub use owners::*;
pub use releases::{
    AGENT_FILE, CheckedRelease, ReleaseFiles, add_release, check_release, current_rollout, list_releases,
    read_release_dir, release_file, rollout_action, start_rollout,
};
