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
    NodeMetrics, NodeSettings, NodeSummary, OFFLINE_AFTER_SECS, PROBE_OUTPUT_MAX, ProbeFailure, Quarantine,
    RegisterRequest, RegisterResponse, RemovedContainer, SAMPLE_INTERVAL_SECS, SAMPLE_WINDOW_SECS,
    TokenRotated, UpdateNodeRequest, VerificationState, limits,
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

/// The migrations, in order. `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE join_codes (
    code_hash   TEXT PRIMARY KEY,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
CREATE TABLE nodes (
    id                 TEXT PRIMARY KEY,
    token_hash         TEXT NOT NULL UNIQUE,
    registered_at      INTEGER NOT NULL,
    deleted_at         INTEGER,
    agent_version      TEXT NOT NULL DEFAULT '',
    inventory_json     TEXT NOT NULL DEFAULT '{}',
    inventory_hash     TEXT NOT NULL DEFAULT '',
    last_heartbeat_at  INTEGER,
    last_seq           INTEGER,
    metrics_json       TEXT,
    health_json        TEXT,
    verification       TEXT NOT NULL DEFAULT 'awaiting_check',
    probe_output       TEXT,
    probe_reason       TEXT,
    managed_json       TEXT NOT NULL DEFAULT '[]',
    known_json         TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE node_gpus (
    uuid     TEXT PRIMARY KEY,
    node_id  TEXT NOT NULL REFERENCES nodes(id)
);
CREATE INDEX node_gpus_node ON node_gpus(node_id);
CREATE TABLE replaced_tokens (
    token_hash   TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    replaced_at  INTEGER NOT NULL
);
CREATE TABLE commands (
    id              TEXT PRIMARY KEY,
    node_id         TEXT NOT NULL,
    kind            TEXT NOT NULL,
    queued_at       INTEGER NOT NULL,
    delivered_at    INTEGER,
    result_ok       INTEGER,
    result_message  TEXT,
    completed_at    INTEGER,
    seq             INTEGER NOT NULL
);
CREATE INDEX commands_pending ON commands(node_id, delivered_at);
CREATE TABLE container_removals (
    node_id  TEXT NOT NULL,
    at       INTEGER NOT NULL,
    id       TEXT NOT NULL,
    name     TEXT NOT NULL,
    reason   TEXT NOT NULL
);
CREATE INDEX container_removals_node ON container_removals(node_id);
CREATE TABLE settings (
    key    TEXT PRIMARY KEY,
    value  TEXT
);
"#,
    // Idempotent registration: a used code remembers the install id (hashed) that used it and the
    // node it created.
    r#"
ALTER TABLE join_codes ADD COLUMN install_id_hash TEXT;
ALTER TABLE join_codes ADD COLUMN node_id TEXT;
CREATE INDEX commands_node_seq ON commands(node_id, seq);
"#,
    // Bounded repeats (issue 29, items 2 and 3): how often the install id a code is bound to
    // used it again, and the replaced tokens of a node found by node for pruning.
    r#"
ALTER TABLE join_codes ADD COLUMN repeats INTEGER NOT NULL DEFAULT 0;
CREATE INDEX replaced_tokens_node ON replaced_tokens(node_id, replaced_at);
"#,
    // The owner's settings of a server (issue 32): a name (NULL: its host name), a price per
    // GPU-hour in minor units (NULL: not for rent yet), a minimum rental time, and paused.
    r#"
ALTER TABLE nodes ADD COLUMN name TEXT;
ALTER TABLE nodes ADD COLUMN price_per_gpu_hour INTEGER;
ALTER TABLE nodes ADD COLUMN min_rental_minutes INTEGER NOT NULL DEFAULT 60;
ALTER TABLE nodes ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
"#,
    // Owners' accounts (issue 32): each join code and node belongs to an owner (NULL: the
    // operator's own); invitations, dashboard sessions and API keys are kept as hashes only.
    r#"
CREATE TABLE owners (
    id             TEXT PRIMARY KEY,
    email          TEXT NOT NULL UNIQUE,
    password_hash  TEXT,
    totp_secret    TEXT,
    totp_last_step INTEGER,
    created_at     INTEGER NOT NULL,
    disabled_at    INTEGER
);
CREATE TABLE invitations (
    token_hash  TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
CREATE INDEX invitations_owner ON invitations(owner_id);
CREATE TABLE sessions (
    id_hash     TEXT PRIMARY KEY,
    owner_id    TEXT,
    csrf        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX sessions_owner ON sessions(owner_id, created_at);
CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL,
    key_hash      TEXT NOT NULL UNIQUE,
    label         TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER,
    revoked_at    INTEGER
);
CREATE INDEX api_keys_owner ON api_keys(owner_id);
ALTER TABLE nodes ADD COLUMN owner_id TEXT;
ALTER TABLE join_codes ADD COLUMN owner_id TEXT;
CREATE INDEX nodes_owner ON nodes(owner_id);
CREATE INDEX join_codes_owner ON join_codes(owner_id, expires_at);
"#,
    // The owner's view of a server over time (issue 32): samples of its figures, at most one per
    // `SAMPLE_INTERVAL_SECS` (`last_sample_at` decides it without a lookup) and a day of them;
    // and its event log, bounded per node.
    r#"
ALTER TABLE nodes ADD COLUMN last_sample_at INTEGER;
CREATE TABLE node_samples (
    node_id       TEXT NOT NULL,
    at            INTEGER NOT NULL,
    metrics_json  TEXT NOT NULL
);
CREATE INDEX node_samples_node ON node_samples(node_id, at);
CREATE TABLE node_events (
    node_id  TEXT NOT NULL,
    at       INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX node_events_node ON node_events(node_id);
"#,
    // A page that never misleads (issue 32): when the last probe report arrived, so that a
    // recheck is judged by the report that followed it, not by the command's acknowledgement.
    r#"
ALTER TABLE nodes ADD COLUMN probe_at INTEGER;
"#,
    // Rentals (issue 33): what the platform asks of a node, and what its agent last reported.
    // `listed` is 1 while the heartbeat answer carries it (until stopped, gone or failed; an
    // expired one is filtered by `ends_at`); the partial index makes that one lookup per beat.
    // `nodes.rentals_until` is the latest end of a rental ever listed for the node: a beat after
    // it (or of a node that never had one) skips the lookup.
    r#"
ALTER TABLE nodes ADD COLUMN rentals_until INTEGER;
CREATE TABLE rentals (
    id           TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    spec_json    TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    ends_at      INTEGER NOT NULL,
    stopped_at   INTEGER,
    listed       INTEGER NOT NULL DEFAULT 1,
    state        TEXT,
    exit_code    INTEGER,
    reason       TEXT,
    updated_at   INTEGER,
    started_at   INTEGER
);
CREATE INDEX rentals_node ON rentals(node_id, created_at);
CREATE INDEX rentals_listed ON rentals(node_id, ends_at) WHERE listed = 1;
"#,
    // Quarantine (issue 33): the node's quarantine as its agent last reported it (the
    // protocol's `Quarantine` as JSON, bounded), NULL when none. A heartbeat writes it only
    // when it changes.
    r#"
ALTER TABLE nodes ADD COLUMN quarantine_json TEXT;
"#,
    // The tunnel (issue 34): the SHA-256 of a rental's tenant credential, when it has ports.
    r#"
ALTER TABLE rentals ADD COLUMN tunnel_hash TEXT;
"#,
    // Issue 44, item 6: `rentals_listed` in the order the heartbeat reads it, as PostgreSQL's
    // always was (`schema::tests::both_engines_build_the_same_schema` found the difference).
    r#"
DROP INDEX rentals_listed;
CREATE INDEX rentals_listed ON rentals(node_id, created_at) WHERE listed = 1;
"#,
    // An owner who can always get back in (issue 43): recovery codes (only their SHA-256, each
    // deleted when used); when the operator last turned an owner's second factor off; the
    // second factor's new key a session is confirming (given only after the password and a
    // current code, so the form cannot name one), until when; and the one notice a session's
    // next servers page shows (the id of the server it deleted).
    r#"
CREATE TABLE recovery_codes (
    code_hash   TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX recovery_codes_owner ON recovery_codes(owner_id);
ALTER TABLE owners ADD COLUMN totp_reset_at INTEGER;
ALTER TABLE sessions ADD COLUMN totp_pending TEXT;
ALTER TABLE sessions ADD COLUMN totp_pending_until INTEGER;
ALTER TABLE sessions ADD COLUMN flash_deleted TEXT;
"#,
    // Issue 44, items 1 and 2: effects as data (`effects.rs`): what a change of state ends in
    // every replica's relay, written in the same transaction; `rowid` is the appliers' cursor.
    r#"
CREATE TABLE effects (
    at       INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL
);
CREATE INDEX effects_at ON effects(at);
"#,
    // The throttle's counts (issue 43): shared by replicas, per door and per subject (a hash
    // of an address, an IPv6 /48 or an e-mail; `crate::throttle`), `last_failure` in Unix ms.
    r#"
CREATE TABLE throttle (
    door          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    failures      INTEGER NOT NULL,
    last_failure  INTEGER NOT NULL,
    PRIMARY KEY (door, subject)
);
CREATE INDEX throttle_last ON throttle(last_failure);
"#,
    // Issue 44, item 4: lists read a page at a time in registration order, each page found
    // through an index instead of a sort of every row (the operator's, and each owner's).
    r#"
CREATE INDEX nodes_live_by_registration ON nodes(registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX nodes_owner_by_registration ON nodes(owner_id, registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX owners_by_creation ON owners(created_at, email);
"#,
    // 16: the relay mesh (issue 44, item 3): live replicas and which one holds each node's tunnel.
    r#"
CREATE TABLE replicas (
    id         TEXT PRIMARY KEY,
    peer_addr  TEXT NOT NULL,
    seen_at    INTEGER NOT NULL
);
CREATE TABLE tunnel_homes (
    node_id     TEXT PRIMARY KEY,
    replica_id  TEXT NOT NULL,
    since       INTEGER NOT NULL
);
"#,
];

/// The schema version this binary writes: on SQLite `PRAGMA user_version` (as before issue 35),
/// on PostgreSQL the one row of `schema_version`. A database at a higher version was migrated by
/// a newer gpum-platform, and this one refuses it rather than misread it.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// PostgreSQL's migrations, each with the schema version it brings the database to. The first
/// creates at once what SQLite's first ten migrations built up (PostgreSQL came with issue 35);
/// a later migration is added to both lists, with the same number. Where the DDL differs:
/// every integer is BIGINT (SQLite's INTEGER is 64-bit), and the tables whose pruning and order
/// rely on SQLite's implicit `rowid` get it as a real column, so the same SQL reads both.
const PG_MIGRATIONS: &[(usize, &str)] = &[
    (
        10,
        r#"
CREATE TABLE join_codes (
    code_hash        TEXT PRIMARY KEY,
    created_at       BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    used_at          BIGINT,
    install_id_hash  TEXT,
    node_id          TEXT,
    repeats          BIGINT NOT NULL DEFAULT 0,
    owner_id         TEXT
);
CREATE TABLE nodes (
    id                  TEXT PRIMARY KEY,
    token_hash          TEXT NOT NULL UNIQUE,
    registered_at       BIGINT NOT NULL,
    deleted_at          BIGINT,
    agent_version       TEXT NOT NULL DEFAULT '',
    inventory_json      TEXT NOT NULL DEFAULT '{}',
    inventory_hash      TEXT NOT NULL DEFAULT '',
    last_heartbeat_at   BIGINT,
    last_seq            BIGINT,
    metrics_json        TEXT,
    health_json         TEXT,
    verification        TEXT NOT NULL DEFAULT 'awaiting_check',
    probe_output        TEXT,
    probe_reason        TEXT,
    managed_json        TEXT NOT NULL DEFAULT '[]',
    known_json          TEXT NOT NULL DEFAULT '[]',
    name                TEXT,
    price_per_gpu_hour  BIGINT,
    min_rental_minutes  BIGINT NOT NULL DEFAULT 60,
    paused              BIGINT NOT NULL DEFAULT 0,
    owner_id            TEXT,
    last_sample_at      BIGINT,
    probe_at            BIGINT,
    rentals_until       BIGINT,
    quarantine_json     TEXT
);
CREATE TABLE node_gpus (
    uuid     TEXT PRIMARY KEY,
    node_id  TEXT NOT NULL REFERENCES nodes(id)
);
CREATE INDEX node_gpus_node ON node_gpus(node_id);
CREATE TABLE replaced_tokens (
    token_hash   TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    replaced_at  BIGINT NOT NULL,
    rowid        BIGSERIAL
);
CREATE INDEX replaced_tokens_node ON replaced_tokens(node_id, replaced_at);
CREATE TABLE commands (
    id              TEXT PRIMARY KEY,
    node_id         TEXT NOT NULL,
    kind            TEXT NOT NULL,
    queued_at       BIGINT NOT NULL,
    delivered_at    BIGINT,
    result_ok       BIGINT,
    result_message  TEXT,
    completed_at    BIGINT,
    seq             BIGINT NOT NULL
);
CREATE INDEX commands_pending ON commands(node_id, delivered_at);
CREATE INDEX commands_node_seq ON commands(node_id, seq);
CREATE TABLE container_removals (
    node_id  TEXT NOT NULL,
    at       BIGINT NOT NULL,
    id       TEXT NOT NULL,
    name     TEXT NOT NULL,
    reason   TEXT NOT NULL,
    rowid    BIGSERIAL
);
CREATE INDEX container_removals_node ON container_removals(node_id);
CREATE TABLE settings (
    key    TEXT PRIMARY KEY,
    value  TEXT
);
CREATE TABLE owners (
    id              TEXT PRIMARY KEY,
    email           TEXT NOT NULL UNIQUE,
    password_hash   TEXT,
    totp_secret     TEXT,
    totp_last_step  BIGINT,
    created_at      BIGINT NOT NULL,
    disabled_at     BIGINT
);
CREATE TABLE invitations (
    token_hash  TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT,
    rowid       BIGSERIAL
);
CREATE INDEX invitations_owner ON invitations(owner_id);
CREATE TABLE sessions (
    id_hash     TEXT PRIMARY KEY,
    owner_id    TEXT,
    csrf        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    rowid       BIGSERIAL
);
CREATE INDEX sessions_owner ON sessions(owner_id, created_at);
CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL,
    key_hash      TEXT NOT NULL UNIQUE,
    label         TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT,
    revoked_at    BIGINT,
    rowid         BIGSERIAL
);
CREATE INDEX api_keys_owner ON api_keys(owner_id);
CREATE INDEX nodes_owner ON nodes(owner_id);
CREATE INDEX join_codes_owner ON join_codes(owner_id, expires_at);
CREATE TABLE node_samples (
    node_id       TEXT NOT NULL,
    at            BIGINT NOT NULL,
    metrics_json  TEXT NOT NULL,
    rowid         BIGSERIAL
);
CREATE INDEX node_samples_node ON node_samples(node_id, at);
CREATE TABLE node_events (
    node_id  TEXT NOT NULL,
    at       BIGINT NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT '',
    rowid    BIGSERIAL
);
CREATE INDEX node_events_node ON node_events(node_id);
CREATE TABLE rentals (
    id           TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    spec_json    TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    ends_at      BIGINT NOT NULL,
    stopped_at   BIGINT,
    listed       BIGINT NOT NULL DEFAULT 1,
    state        TEXT,
    exit_code    BIGINT,
    reason       TEXT,
    updated_at   BIGINT,
    started_at   BIGINT,
    tunnel_hash  TEXT,
    rowid        BIGSERIAL
);
CREATE INDEX rentals_node ON rentals(node_id, created_at);
-- In the order the heartbeat lists them, so that PostgreSQL's planner takes it over
-- rentals_node (SQLite is told to use it: rentals::desired).
CREATE INDEX rentals_listed ON rentals(node_id, created_at) WHERE listed = 1;
"#,
    ),
    (
        11,
        r#"
DROP INDEX rentals_listed;
CREATE INDEX rentals_listed ON rentals(node_id, created_at) WHERE listed = 1;
"#,
    ),
    (
        12,
        r#"
CREATE TABLE recovery_codes (
    code_hash   TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX recovery_codes_owner ON recovery_codes(owner_id);
ALTER TABLE owners ADD COLUMN totp_reset_at BIGINT;
ALTER TABLE sessions ADD COLUMN totp_pending TEXT;
ALTER TABLE sessions ADD COLUMN totp_pending_until BIGINT;
ALTER TABLE sessions ADD COLUMN flash_deleted TEXT;
"#,
    ),
    (
        13,
        r#"
CREATE TABLE effects (
    at       BIGINT NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL,
    rowid    BIGSERIAL
);
CREATE INDEX effects_at ON effects(at);
"#,
    ),
    (
        14,
        r#"
CREATE TABLE throttle (
    door          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    failures      BIGINT NOT NULL,
    last_failure  BIGINT NOT NULL,
    PRIMARY KEY (door, subject)
);
CREATE INDEX throttle_last ON throttle(last_failure);
"#,
    ),
    (
        15,
        r#"
CREATE INDEX nodes_live_by_registration ON nodes(registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX nodes_owner_by_registration ON nodes(owner_id, registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX owners_by_creation ON owners(created_at, email);
"#,
    ),
    (
        16,
        r#"
CREATE TABLE replicas (
    id         TEXT PRIMARY KEY,
    peer_addr  TEXT NOT NULL,
    seen_at    BIGINT NOT NULL
);
CREATE TABLE tunnel_homes (
    node_id     TEXT PRIMARY KEY,
    replica_id  TEXT NOT NULL,
    since       BIGINT NOT NULL
);
"#,
    ),
];

/// Opens the platform's database at `db` (a SQLite file's path, created when absent, or a
/// `postgres://` URL) and runs pending migrations; a schema newer than [`SCHEMA_VERSION`] is
/// refused.
pub fn open(db: &Path) -> Result<Conn, crate::sql::Error> {
    open_target(&Target::parse(db))
}

/// [`open`] for a parsed target.
pub fn open_target(target: &Target) -> Result<Conn, crate::sql::Error> {
    match target {
        Target::Sqlite(path) => {
            crate::db::private_files(path)?;
            let conn = rusqlite::Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            // In WAL mode NORMAL loses at most the last transactions on power loss, never
            // integrity; it saves an fsync per commit, which is what lets one SQLite file take
            // 10,000 beats/s.
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            migrate_sqlite(&conn)?;
            Ok(Conn::from_sqlite(conn))
        }
        Target::Postgres(url) => {
            let conn = Conn::connect_postgres(url)?;
            migrate_postgres(&conn)?;
            Ok(conn)
        }
    }
}

fn newer_schema(found: i64) -> crate::sql::Error {
    crate::sql::Error::Refused(format!(
        "the database's schema is version {found}, newer than this gpum-platform knows \
         (version {SCHEMA_VERSION}): a newer gpum-platform migrated it; run that version (or newer)"
    ))
}

fn migrate_sqlite(conn: &rusqlite::Connection) -> Result<(), crate::sql::Error> {
    let done: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if done > SCHEMA_VERSION as i64 {
        return Err(newer_schema(done));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {m}; PRAGMA user_version = {}; COMMIT;", i + 1))?;
    }
    Ok(())
}

/// Key of the advisory lock under which a replica migrates, so that two starting at once do not
/// both create the schema.
const PG_MIGRATION_LOCK: i64 = 0x6770_756d_0035;

fn migrate_postgres(conn: &Conn) -> Result<(), crate::sql::Error> {
    conn.execute_batch(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK});
         CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)"
    ))?;
    let run = || -> Result<(), crate::sql::Error> {
        let done: i64 =
            conn.query_row("SELECT version FROM schema_version", [], |r| r.get(0)).optional()?.unwrap_or(0);
        if done > SCHEMA_VERSION as i64 {
            return Err(newer_schema(done));
        }
        for (version, m) in PG_MIGRATIONS.iter().filter(|(v, _)| *v as i64 > done) {
            conn.execute_batch(m)?;
            conn.execute("DELETE FROM schema_version", [])?;
            conn.execute("INSERT INTO schema_version (version) VALUES (?1)", params![*version as i64])?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

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

pub(crate) fn enum_str<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

pub(crate) fn enum_parse<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

// ---------------------------------------------------------------------------------------------
// Join codes

/// A new join code for `scope`'s owner (the operator's codes belong to no owner): the node it
/// registers is theirs.
pub fn create_join_code(
    conn: &Conn,
    now: u64,
    ttl_secs: u64,
    scope: &Scope,
) -> Result<JoinCodeCreated, ApiError> {
    if ttl_secs == 0 || ttl_secs > 365 * 24 * 3600 {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "ttl_secs must be between 1 and 31536000"));
    }
    if let Some(owner) = scope.owner() {
        let disabled: bool = conn
            .prepare_cached("SELECT disabled_at IS NOT NULL FROM owners WHERE id = ?1")?
            .query_row(params![owner], |r| r.get(0))
            .optional()?
            .unwrap_or(false);
        if disabled {
            return Err(crate::accounts::AccountError::OwnerDisabled.into());
        }
        check_open_codes(conn, now, owner)?;
    }
    let code = JoinCode::generate().to_string();
    let expires_at = now + ttl_secs;
    conn.prepare_cached(
        "INSERT INTO join_codes (code_hash, created_at, expires_at, owner_id) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![hash_secret(&code), now as i64, expires_at as i64, scope.owner()])?;
    Ok(JoinCodeCreated { code, expires_at })
}

/// A join code, looked up by its hash (what the dashboard's waiting page holds): when it
/// expires and the node it created, if it was used; `None` for another owner's. Read only.
pub fn join_code_use(
    conn: &Conn,
    code_hash: &str,
    scope: &Scope,
) -> Result<Option<(u64, Option<String>)>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT expires_at, node_id FROM join_codes WHERE code_hash = ?1 AND (CAST(?2 AS TEXT) IS NULL OR owner_id = ?2)",
        )?
        .query_row(params![code_hash, scope.owner()], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .optional()?)
}

/// An unused, unexpired join code, as the "add a machine" page lists it: by its hash (the code
/// itself is not stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCode {
    pub hash: String,
    pub created_at: u64,
    pub expires_at: u64,
}

/// The most open codes the page lists.
pub const OPEN_CODES_SHOWN: usize = 50;

/// The join codes not used yet and not expired at `now`, newest first (at most
/// [`OPEN_CODES_SHOWN`]).
pub fn open_join_codes(conn: &Conn, now: u64, scope: &Scope) -> Result<Vec<OpenCode>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT code_hash, created_at, expires_at FROM join_codes
             WHERE used_at IS NULL AND expires_at > ?1 AND (CAST(?3 AS TEXT) IS NULL OR owner_id = ?3)
             ORDER BY created_at DESC, code_hash LIMIT ?2",
        )?
        .query_map(params![now as i64, OPEN_CODES_SHOWN as i64, scope.owner()], |r| {
            Ok(OpenCode {
                hash: r.get(0)?,
                created_at: r.get::<_, i64>(1)? as u64,
                expires_at: r.get::<_, i64>(2)? as u64,
            })
        })?
        .collect::<Result<_, _>>()?)
}

// ---------------------------------------------------------------------------------------------
// Register

pub(crate) fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, msg)
}

/// Refuses an inventory whose lists or numbers are over the protocol's limits
/// (`Inventory::check_ranges`). Its strings are cut when stored ([`bounded_inventory_json`]),
/// not refused.
fn validate_inventory(inv: &Inventory) -> Result<(), ApiError> {
    if inv.private.gpu_uuids.len() > limits::MAX_GPUS
        || inv.private.gpu_uuids.iter().any(|u| u.is_empty() || u.len() > MAX_ID_LEN)
    {
        return Err(invalid(format!(
            "gpu_uuids: at most {} non-empty ids of up to {MAX_ID_LEN} bytes",
            limits::MAX_GPUS
        )));
    }
    if inv.public.gpus.len() > limits::MAX_GPUS {
        return Err(invalid(format!("gpus: at most {}", limits::MAX_GPUS)));
    }
    inv.check_ranges().map_err(invalid)
}

/// The inventory's JSON as stored, with every free-text field cut to
/// [`limits::MAX_TEXT_LEN`] bytes, and the hash of the inventory as sent (what the agent
/// compares with).
fn bounded_inventory_json(inv: &Inventory) -> (String, String) {
    let (json, hash) = inv.json_and_hash();
    let long = |s: &str| s.len() > limits::MAX_TEXT_LEN;
    let long_opt = |s: &Option<String>| s.as_deref().is_some_and(long);
    let p = &inv.private;
    let needs_cut = long(&inv.public.cpu_model)
        || inv.public.gpus.iter().any(|g| long(&g.model))
        || long(&p.hostname)
        || long(&p.os)
        || long(&p.kernel)
        || [&p.driver_version, &p.cuda_version, &p.docker_version, &p.toolkit_version]
            .into_iter()
            .any(long_opt);
    if !needs_cut {
        return (json, hash);
    }
    let cut = |s: &mut String| *s = truncate(s, limits::MAX_TEXT_LEN);
    let mut inv = inv.clone();
    cut(&mut inv.public.cpu_model);
    inv.public.gpus.iter_mut().for_each(|g| cut(&mut g.model));
    let p = &mut inv.private;
    for s in [&mut p.hostname, &mut p.os, &mut p.kernel] {
        cut(s);
    }
    for s in [&mut p.driver_version, &mut p.cuda_version, &mut p.docker_version, &mut p.toolkit_version]
        .into_iter()
        .flatten()
    {
        cut(s);
    }
    (inv.json_and_hash().0, hash)
}

/// The install id's canonical form (32 lowercase hex digits), or `invalid_request`.
fn normalize_install_id(id: &str) -> Result<String, ApiError> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id.to_ascii_lowercase())
    } else {
        Err(invalid("install_id: 32 hexadecimal digits"))
    }
}

/// Equality of two digests without an early exit.
fn digest_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses `gpu_already_registered` when a GPU of `uuids` belongs to a live node other than
/// `node_id` (a deleted node gives its GPUs up). Registration and heartbeats share this rule.
fn check_gpus_free(conn: &Conn, uuids: &[String], node_id: Option<&str>) -> Result<(), ApiError> {
    for uuid in uuids {
        let owner: Option<String> = conn
            .prepare_cached("SELECT node_id FROM node_gpus WHERE uuid = ?1")?
            .query_row(params![uuid], |r| r.get(0))
            .optional()?;
        if owner.is_some_and(|o| Some(o.as_str()) != node_id) {
            return Err(gpu_taken());
        }
    }
    Ok(())
}

fn gpu_taken() -> ApiError {
    ApiError::new(
        ErrorCode::GpuAlreadyRegistered,
        "a GPU of this machine is already registered to another server; delete that server first",
    )
}

/// The join code's row, by the code's hash.
struct CodeRow {
    expires_at: i64,
    used_at: Option<i64>,
    /// The install id the code is bound to (by [`enroll`] or its first registration), hashed.
    install_id_hash: Option<String>,
    node_id: Option<String>,
    repeats: i64,
    /// The code's owner is disabled.
    owner_disabled: bool,
    /// The owner the code was made for; `None`: the operator's.
    owner_id: Option<String>,
}

fn code_row(conn: &Conn, code_hash: &str) -> Result<Option<CodeRow>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT expires_at, used_at, install_id_hash, node_id, repeats,
                    EXISTS (SELECT 1 FROM owners o WHERE o.id = join_codes.owner_id AND o.disabled_at IS NOT NULL),
                    owner_id
             FROM join_codes WHERE code_hash = ?1",
        )?
        .query_row(params![code_hash], |r| {
            Ok(CodeRow {
                expires_at: r.get(0)?,
                used_at: r.get(1)?,
                install_id_hash: r.get(2)?,
                node_id: r.get(3)?,
                repeats: r.get(4)?,
                owner_disabled: r.get(5)?,
                owner_id: r.get(6)?,
            })
        })
        .optional()?)
}

/// A code whose owner is disabled registers nothing (issue 43, item 13): `owners disable` ends
/// the owner's open codes, and a code read in the same moment is refused here.
fn owner_disabled_code() -> ApiError {
    ApiError::new(
        ErrorCode::JoinCodeExpired,
        "this join code's owner is disabled by the platform's operator; it registers no server",
    )
}

fn parse_code(raw: &str) -> Result<JoinCode, ApiError> {
    JoinCode::parse(raw)
        .map_err(|e| ApiError::new(ErrorCode::JoinCodeMalformed, format!("the join code {e}")))
}

fn code_unknown() -> ApiError {
    ApiError::new(ErrorCode::JoinCodeUnknown, "this join code was never issued")
}

fn code_used() -> ApiError {
    ApiError::new(ErrorCode::JoinCodeUsed, "this join code was already used")
}

fn code_expired() -> ApiError {
    ApiError::new(ErrorCode::JoinCodeExpired, "this join code has expired")
}

/// Counts one more use of a code by the install id it is bound to; `join_code_used` past
/// `limits::MAX_CODE_REPEATS`, so that repeating a code cannot grow the database without bound.
fn count_repeat(conn: &Conn, code_hash: &str, row: &CodeRow) -> Result<(), ApiError> {
    if row.repeats >= i64::from(limits::MAX_CODE_REPEATS) {
        return Err(code_used());
    }
    conn.prepare_cached("UPDATE join_codes SET repeats = repeats + 1 WHERE code_hash = ?1")?
        .execute(params![code_hash])?;
    Ok(())
}

/// `POST /api/v1/agent/enroll`: binds an unused code to `install_id` (see
/// [`gpum_protocol::EnrollRequest`]). The same install id may enroll again; any other gets
/// `join_code_used`, and so does a registration with the code that lacks the install id.
pub fn enroll(conn: &Conn, now: u64, req: &EnrollRequest) -> Result<EnrollResponse, ApiError> {
    let code = parse_code(&req.join_code)?;
    let id_hash = hash_secret(&normalize_install_id(&req.install_id)?);
    let code_hash = hash_secret(&code.to_string());
    let row = code_row(conn, &code_hash)?.ok_or_else(code_unknown)?;
    if row.owner_disabled {
        return Err(owner_disabled_code());
    }
    let live = (now as i64) < row.expires_at;
    match &row.install_id_hash {
        None if row.used_at.is_some() => Err(code_used()),
        None if !live => Err(code_expired()),
        None => {
            let expires_at = row.expires_at.max((now + ENROLL_GRACE_SECS) as i64);
            // Bound only if still unbound and unused (two replicas may race; see `register`).
            let bound = conn
                .prepare_cached(
                    "UPDATE join_codes SET install_id_hash = ?1, expires_at = ?2
                     WHERE code_hash = ?3 AND install_id_hash IS NULL AND used_at IS NULL",
                )?
                .execute(params![id_hash, expires_at, code_hash])?;
            if bound != 1 {
                return Err(code_used());
            }
            Ok(EnrollResponse { expires_at: expires_at as u64 })
        }
        Some(stored) if digest_eq(stored, &id_hash) && live => {
            count_repeat(conn, &code_hash, &row)?;
            Ok(EnrollResponse { expires_at: row.expires_at as u64 })
        }
        Some(_) if row.used_at.is_none() && !live => Err(code_expired()),
        Some(_) => Err(code_used()),
    }
}

pub fn register(
    conn: &Conn,
    now: u64,
    req: &RegisterRequest,
    heartbeat_interval_secs: u64,
) -> Result<RegisterResponse, ApiError> {
    let code = parse_code(&req.join_code)?;
    validate_inventory(&req.inventory)?;
    let install_id_hash =
        req.install_id.as_deref().map(normalize_install_id).transpose()?.map(|i| hash_secret(&i));
    let code_hash = hash_secret(&code.to_string());
    let row = code_row(conn, &code_hash)?.ok_or_else(code_unknown)?;
    if row.owner_disabled {
        return Err(owner_disabled_code());
    }
    let live = (now as i64) < row.expires_at;
    // Bound to an install id (enrolled, or registered with one): only that install id may use it.
    let same_install = match (&install_id_hash, &row.install_id_hash) {
        (Some(sent), Some(stored)) => digest_eq(sent, stored),
        (_, None) => true,
        (None, Some(_)) => false,
    };
    if row.used_at.is_some() {
        // The same installation asking again (it never saw the first answer, or crashed
        // before saving the token), within the code's lifetime: the same node, a new token.
        return match (&install_id_hash, &row.install_id_hash, &row.node_id) {
            (Some(_), Some(_), Some(node_id))
                if live && same_install && live_node(conn, node_id, &Scope::All).is_ok() =>
            {
                count_repeat(conn, &code_hash, &row)?;
                register_again(conn, now, req, node_id, heartbeat_interval_secs)
            }
            _ => Err(code_used()),
        };
    }
    if !same_install {
        return Err(code_used());
    }
    if !live {
        return Err(code_expired());
    }
    // A GPU belongs to one live node. The code is not consumed on this refusal, so the owner
    // can delete the old server and run the installer again with the same code.
    check_gpus_free(conn, &req.inventory.private.gpu_uuids, None)?;
    // So is the owner's limit of servers (issue 43, item 3).
    if let Some(owner) = &row.owner_id {
        check_servers(conn, owner)?;
    }
    let node_id = new_id("node-");
    // Taken only if still unused: with several replicas on one PostgreSQL, two may have read the
    // code as unused at the same moment; the second UPDATE waits for the first to commit, then
    // finds it used and changes nothing (issue 35). On SQLite, the one writer, it always takes.
    // So does an `owners disable` committed meanwhile: it ended the code (`expires_at`).
    let taken = conn
        .prepare_cached(
            "UPDATE join_codes SET used_at = ?1, install_id_hash = ?2, node_id = ?3
             WHERE code_hash = ?4 AND used_at IS NULL AND (install_id_hash IS NULL OR install_id_hash = ?2)
               AND expires_at > ?1",
        )?
        .execute(params![now as i64, install_id_hash, node_id, code_hash])?;
    if taken != 1 {
        return match code_row(conn, &code_hash)? {
            Some(r) if r.owner_disabled => Err(owner_disabled_code()),
            Some(r) if r.used_at.is_none() && r.expires_at <= now as i64 => Err(code_expired()),
            _ => Err(code_used()),
        };
    }
    let token = new_token();
    let (inventory_json, inventory_hash) = bounded_inventory_json(&req.inventory);
    conn.prepare_cached(
        "INSERT INTO nodes (id, token_hash, registered_at, agent_version, inventory_json, inventory_hash, owner_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, (SELECT owner_id FROM join_codes WHERE code_hash = ?7))",
    )?
    .execute(params![
        node_id,
        hash_secret(&token),
        now as i64,
        truncate(&req.agent_version, 64),
        inventory_json,
        inventory_hash,
        code_hash
    ])?;
    set_gpus(conn, &node_id, &req.inventory.private.gpu_uuids)?;
    record(conn, &node_id, now, NodeEventKind::Registered, "", "")?;
    Ok(RegisterResponse {
        node_id,
        node_token: token,
        heartbeat_interval_secs,
        probe_image: probe_image(conn)?,
    })
}

/// A repeated registration of the same installation: the node takes the new inventory and a
/// fresh token; the first token is revoked like a rotated one (`token_replaced`).
fn register_again(
    conn: &Conn,
    now: u64,
    req: &RegisterRequest,
    node_id: &str,
    heartbeat_interval_secs: u64,
) -> Result<RegisterResponse, ApiError> {
    check_gpus_free(conn, &req.inventory.private.gpu_uuids, Some(node_id))?;
    let TokenRotated { node_token } = rotate_token(conn, now, node_id, &Scope::All)?;
    let (inventory_json, inventory_hash) = bounded_inventory_json(&req.inventory);
    hardware_changed(conn, now, node_id, &inventory_json, &inventory_hash)?;
    conn.prepare_cached(
        "UPDATE nodes SET agent_version = ?1, inventory_json = ?2, inventory_hash = ?3 WHERE id = ?4",
    )?
    .execute(params![truncate(&req.agent_version, 64), inventory_json, inventory_hash, node_id])?;
    set_gpus(conn, node_id, &req.inventory.private.gpu_uuids)?;
    Ok(RegisterResponse {
        node_id: node_id.to_owned(),
        node_token,
        heartbeat_interval_secs,
        probe_image: probe_image(conn)?,
    })
}

/// Replaces the node's GPUs. Callers have checked with [`check_gpus_free`] that none belongs to
/// another node; a UUID listed twice is stored once.
/// Records the node's GPUs. [`check_gpus_free`] looked first, but another replica's
/// transaction may have taken one since (two registrations of one machine at once): the insert
/// returns the GPU's owner as committed (on PostgreSQL it waits for that other transaction), and
/// a GPU that another node now holds refuses this one, as the check would have.
fn set_gpus(conn: &Conn, node_id: &str, uuids: &[String]) -> Result<(), ApiError> {
    conn.prepare_cached("DELETE FROM node_gpus WHERE node_id = ?1")?.execute(params![node_id])?;
    for u in uuids {
        let owner: String = conn
            .prepare_cached(
                "INSERT INTO node_gpus (uuid, node_id) VALUES (?1, ?2)
                 ON CONFLICT (uuid) DO UPDATE SET node_id = node_gpus.node_id RETURNING node_id",
            )?
            .query_row(params![u, node_id], |r| r.get(0))?;
        if owner != node_id {
            return Err(gpu_taken());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Heartbeat

/// Finds the live node a bearer token belongs to, or the revocation answer.
fn authenticate_node(conn: &Conn, token: &str) -> Result<String, ApiError> {
    authenticate_hash(conn, &hash_secret(token))
}

fn authenticate_hash(conn: &Conn, h: &str) -> Result<String, ApiError> {
    let row: Option<(String, Option<i64>)> = conn
        .prepare_cached("SELECT id, deleted_at FROM nodes WHERE token_hash = ?1")?
        .query_row(params![h], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        Some((id, None)) => return Ok(id),
        Some((_, Some(_))) => return Err(node_deleted()),
        None => {}
    }
    let replaced: Option<String> = conn
        .prepare_cached("SELECT node_id FROM replaced_tokens WHERE token_hash = ?1")?
        .query_row(params![h], |r| r.get(0))
        .optional()?;
    let Some(node_id) = replaced else {
        return Err(ApiError::new(ErrorCode::Unauthorized, "unknown node token"));
    };
    let deleted: Option<Option<i64>> = conn
        .prepare_cached("SELECT deleted_at FROM nodes WHERE id = ?1")?
        .query_row(params![node_id], |r| r.get(0))
        .optional()?;
    if matches!(deleted, Some(Some(_))) {
        return Err(node_deleted());
    }
    Err(ApiError::new(
        ErrorCode::TokenReplaced,
        "this node's token was replaced; the agent stops. Give it the new token on the machine with \
         the commands the dashboard showed with it (gpum-agent configure, which keeps the agent's \
         other settings, then a restart of gpum-agent)",
    ))
}

/// The node of a live node's token, else the answer a heartbeat would get (the tunnel).
pub fn node_of_token(conn: &Conn, token: &str) -> Result<String, ApiError> {
    authenticate_node(conn, token)
}

/// Authentication only, with no effect: `Ok` for a live node's token, else the answer.
pub fn check_node_token(conn: &Conn, token: &str) -> Result<(), ApiError> {
    authenticate_node(conn, token).map(|_| ())
}

fn node_deleted() -> ApiError {
    ApiError::new(
        ErrorCode::NodeDeleted,
        "this server was deleted on the platform; the agent stops. Create a new join code and run the installer again",
    )
}

/// The parts of a heartbeat that need no database: checking the limits, hashing and JSON
/// encoding. The server does this on its worker threads, so the single database thread only
/// runs SQL.
pub struct PreparedBeat {
    token_hash: String,
    metrics_json: String,
    health_json: String,
    managed_json: String,
    /// The inventory's JSON (strings bounded) and hash, when sent.
    inventory: Option<(String, String)>,
    /// The quarantine's JSON (bounded), when the agent reports one.
    quarantine_json: Option<String>,
}

/// Refuses a heartbeat whose lists are over the protocol's limits ([`limits`]). An agent never
/// sends more; the platform stores nothing of a refused heartbeat.
fn validate_beat(req: &HeartbeatRequest) -> Result<(), ApiError> {
    let over = |what: &str, n: usize, max: usize| {
        (n > max).then(|| invalid(format!("{what}: at most {max} per heartbeat, got {n}")))
    };
    if let Some(e) = over("managed_containers", req.managed_containers.len(), limits::MAX_MANAGED_CONTAINERS)
        .or_else(|| over("removed_containers", req.removed_containers.len(), limits::MAX_REMOVED_CONTAINERS))
        .or_else(|| over("command_results", req.command_results.len(), limits::MAX_COMMAND_RESULTS))
        .or_else(|| over("metrics.gpus", req.metrics.gpus.len(), limits::MAX_GPUS))
        .or_else(|| over("rentals", req.rentals.len(), limits::MAX_RENTAL_REPORTS))
    {
        return Err(e);
    }
    if req.managed_containers.iter().any(|c| c.len() > MAX_ID_LEN) {
        return Err(invalid(format!("managed_containers: ids of up to {MAX_ID_LEN} bytes")));
    }
    if let Some(inv) = &req.inventory {
        validate_inventory(inv)?;
    }
    Ok(())
}

impl PreparedBeat {
    pub fn new(token: &str, req: &HeartbeatRequest) -> Result<PreparedBeat, ApiError> {
        validate_beat(req)?;
        let mut health = None;
        if req.health.docker_error.as_deref().is_some_and(|e| e.len() > limits::MAX_TEXT_LEN) {
            let mut h = req.health.clone();
            h.docker_error = h.docker_error.map(|e| truncate(&e, limits::MAX_TEXT_LEN));
            health = Some(h);
        }
        Ok(PreparedBeat {
            token_hash: hash_secret(token),
            metrics_json: serde_json::to_string(&req.metrics)?,
            health_json: serde_json::to_string(health.as_ref().unwrap_or(&req.health))?,
            managed_json: serde_json::to_string(&req.managed_containers)?,
            inventory: req.inventory.as_ref().map(bounded_inventory_json),
            quarantine_json: req.quarantine.as_ref().map(bounded_quarantine_json).transpose()?,
        })
    }
}

/// A quarantine as stored: its reason cut to [`limits::MAX_TEXT_LEN`], at most
/// [`limits::MAX_GPUS`] GPU UUIDs of at most [`MAX_ID_LEN`] bytes each.
fn bounded_quarantine_json(q: &Quarantine) -> Result<String, ApiError> {
    let q = Quarantine {
        reason: truncate(&q.reason, limits::MAX_TEXT_LEN),
        since: q.since,
        gpu_uuids: q.gpu_uuids.iter().take(limits::MAX_GPUS).map(|g| truncate(g, MAX_ID_LEN)).collect(),
    };
    Ok(serde_json::to_string(&q)?)
}

/// A heartbeat, start to end. The token is checked before the body: a revoked node hears so
/// even if its body is bad (the server does the same with [`PreparedBeat`] off this thread).
pub fn heartbeat(
    conn: &Conn,
    now: u64,
    token: &str,
    req: &HeartbeatRequest,
    heartbeat_interval_secs: u64,
) -> Result<HeartbeatResponse, ApiError> {
    match PreparedBeat::new(token, req) {
        Ok(p) => heartbeat_prepared(conn, now, req, &p, heartbeat_interval_secs),
        Err(e) => {
            check_node_token(conn, token)?;
            Err(e)
        }
    }
}

pub fn heartbeat_prepared(
    conn: &Conn,
    now: u64,
    req: &HeartbeatRequest,
    prep: &PreparedBeat,
    heartbeat_interval_secs: u64,
) -> Result<HeartbeatResponse, ApiError> {
    // One lookup serves the common case (the probe image rides along, what the event log
    // and the samples compare with, and whether any command waits); the slow path tells the
    // revocation answers apart. It locks the node's row (on PostgreSQL; SQLite's transaction
    // holds the whole database), so that two replicas answering one node at once take turns,
    // and the second sees what the first wrote: one "online" event, not two.
    let row: Option<BeatRow> = conn
        .prepare_cached(&conn.for_update(
            "SELECT id, deleted_at, inventory_hash, known_json,
                    (SELECT value FROM settings WHERE key = 'probe_image'),
                    last_heartbeat_at, last_sample_at, verification, probe_reason, rentals_until,
                    quarantine_json,
                    EXISTS (SELECT 1 FROM commands WHERE node_id = nodes.id AND delivered_at IS NULL)
             FROM nodes WHERE token_hash = ?1",
        ))?
        .query_row(params![prep.token_hash], |r| {
            Ok(BeatRow {
                id: r.get(0)?,
                deleted_at: r.get(1)?,
                inventory_hash: r.get(2)?,
                known_json: r.get(3)?,
                probe_image: r.get(4)?,
                last_heartbeat_at: r.get(5)?,
                last_sample_at: r.get(6)?,
                verification: r.get(7)?,
                probe_reason: r.get(8)?,
                rentals_until: r.get(9)?,
                quarantine_json: r.get(10)?,
                commands_waiting: r.get(11)?,
            })
        })
        .optional()?;
    let BeatRow {
        id: node_id,
        inventory_hash: stored_hash,
        known_json,
        probe_image,
        last_heartbeat_at,
        last_sample_at,
        verification,
        probe_reason,
        rentals_until,
        quarantine_json,
        commands_waiting,
        ..
    } = match row {
        Some(row) if row.deleted_at.is_none() => row,
        _ => {
            authenticate_hash(conn, &prep.token_hash)?;
            return Err(ApiError::internal());
        }
    };
    let node_id = node_id.as_str();
    let mut send_inventory = false;
    if let (Some(inv), Some((json, hash))) = (&req.inventory, &prep.inventory) {
        // The rule of registration: a GPU of another live node cannot be taken over. Nothing
        // of this heartbeat is stored then (this is the first write).
        check_gpus_free(conn, &inv.private.gpu_uuids, Some(node_id))?;
        // Only an inventory that differs from the one held is an event (an agent sends it again
        // at each start).
        if *hash != stored_hash {
            hardware_changed(conn, now, node_id, json, hash)?;
        }
        conn.prepare_cached("UPDATE nodes SET inventory_json = ?1, inventory_hash = ?2 WHERE id = ?3")?
            .execute(params![json, hash, node_id])?;
        set_gpus(conn, node_id, &inv.private.gpu_uuids)?;
    } else if req.inventory_hash != stored_hash {
        send_inventory = true;
    }

    // Online after a gap: the gap is recorded when it ends, as "offline" at the last heartbeat
    // before it (while it lasts, `node_events` derives it), so no timer has to watch the nodes
    // and a beat writes an event only on this transition.
    let now_i = now as i64;
    match last_heartbeat_at {
        None => record(conn, node_id, now, NodeEventKind::Online, "", "")?,
        Some(last) if now_i >= last.saturating_add(OFFLINE_AFTER_SECS as i64) => {
            record(conn, node_id, last.max(0) as u64, NodeEventKind::Offline, "", "")?;
            record(conn, node_id, now, NodeEventKind::Online, "", "")?;
        }
        Some(_) => {}
    }

    if let Some(p) = &req.probe {
        // The check's verdict is an event when it changes (a failure also when its reason does).
        let reason = p.reason.map(enum_str);
        let changed = enum_str(p.state) != verification
            || (p.state == VerificationState::Failed && reason != probe_reason);
        match p.state {
            VerificationState::Verified if changed => {
                record(conn, node_id, now, NodeEventKind::CheckPassed, "", "")?
            }
            VerificationState::Failed if changed => {
                record(conn, node_id, now, NodeEventKind::CheckFailed, reason.as_deref().unwrap_or(""), "")?
            }
            _ => {}
        }
        conn.prepare_cached(
            "UPDATE nodes SET verification = ?1, probe_output = ?2, probe_reason = ?3, probe_at = ?4
             WHERE id = ?5",
        )?
        .execute(params![
            enum_str(p.state),
            truncate(&p.output, PROBE_OUTPUT_MAX),
            p.reason.map(enum_str),
            now as i64,
            node_id
        ])?;
    }

    // The quarantine is written, and is an event, only when it changes (issue 33).
    if prep.quarantine_json != quarantine_json {
        match &req.quarantine {
            Some(q) => record(conn, node_id, now, NodeEventKind::Quarantined, "", &q.reason)?,
            None => record(conn, node_id, now, NodeEventKind::QuarantineLifted, "", "")?,
        }
        conn.prepare_cached("UPDATE nodes SET quarantine_json = ?1 WHERE id = ?2")?
            .execute(params![prep.quarantine_json, node_id])?;
    }

    // At most one sample of the figures per interval, decided by the node's own row: most
    // beats write none.
    let sample = last_sample_at.is_none_or(|t| now_i >= t.saturating_add(SAMPLE_INTERVAL_SECS as i64));
    conn.prepare_cached(
        "UPDATE nodes SET last_heartbeat_at = ?1, last_seq = ?2, metrics_json = ?3, health_json = ?4, managed_json = ?5,
             last_sample_at = CASE WHEN ?7 THEN ?1 ELSE last_sample_at END
         WHERE id = ?6",
    )?
    .execute(params![
        now_i,
        req.seq as i64,
        prep.metrics_json,
        prep.health_json,
        prep.managed_json,
        node_id,
        sample
    ])?;
    if sample {
        conn.prepare_cached("INSERT INTO node_samples (node_id, at, metrics_json) VALUES (?1, ?2, ?3)")?
            .execute(params![node_id, now_i, prep.metrics_json])?;
        // A day of them, and never more than a day's worth (a clock moved back cannot pile
        // them up).
        conn.prepare_cached("DELETE FROM node_samples WHERE node_id = ?1 AND at <= ?2")?
            .execute(params![node_id, now_i - SAMPLE_WINDOW_SECS as i64])?;
        conn.prepare_cached(
            "DELETE FROM node_samples WHERE node_id = ?1 AND rowid <= (
                 SELECT rowid FROM node_samples WHERE node_id = ?1 ORDER BY rowid DESC LIMIT 1 OFFSET ?2)",
        )?
        .execute(params![node_id, MAX_SAMPLES_PER_NODE as i64])?;
    }

    if !req.removed_containers.is_empty() {
        for r in &req.removed_containers {
            conn.prepare_cached(
                "INSERT INTO container_removals (node_id, at, id, name, reason) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                node_id,
                now as i64,
                truncate(&r.id, MAX_ID_LEN),
                truncate(&r.name, 256),
                truncate(&r.reason, 512)
            ])?;
        }
        // The history is bounded per node: the oldest records go.
        conn.prepare_cached(
            "DELETE FROM container_removals WHERE node_id = ?1 AND rowid <= (
                 SELECT rowid FROM container_removals WHERE node_id = ?1 ORDER BY rowid DESC LIMIT 1 OFFSET ?2)",
        )?
        .execute(params![node_id, limits::MAX_REMOVED_HISTORY_PER_NODE as i64])?;
    }

    // Results are recorded once, and only for this node's own commands.
    for r in &req.command_results {
        let message = truncate(&r.message, limits::MAX_TEXT_LEN);
        let kind: Option<String> = conn
            .prepare_cached(
                "UPDATE commands SET result_ok = ?1, result_message = ?2, completed_at = ?3
                 WHERE id = ?4 AND node_id = ?5 AND completed_at IS NULL RETURNING kind",
            )?
            .query_row(params![r.ok, message, now as i64, r.id, node_id], |r| r.get(0))
            .optional()?;
        if let Some(kind) = kind {
            let k = if r.ok { NodeEventKind::CommandOk } else { NodeEventKind::CommandFailed };
            record(conn, node_id, now, k, &kind, &message)?;
        }
    }

    // Pending commands are delivered once, oldest first and at most
    // `MAX_COMMANDS_PER_RESPONSE` per answer (the rest wait for the next heartbeat): the answer
    // that carries them marks them delivered. A handshake (`seq == 0`, what `gpum-agent smoke`
    // sends) gets none: a one-shot process that exits right after would otherwise swallow a
    // command meant for the service.
    let pending: Vec<gpum_protocol::Command> = if req.seq == 0 || !commands_waiting {
        Vec::new()
    } else {
        conn.prepare_cached(
            "SELECT id, kind FROM commands WHERE node_id = ?1 AND delivered_at IS NULL ORDER BY seq LIMIT ?2",
        )?
        .query_map(params![node_id, limits::MAX_COMMANDS_PER_RESPONSE as i64], |r| {
            Ok(gpum_protocol::Command { id: r.get(0)?, kind: r.get(1)? })
        })?
        .collect::<Result<_, _>>()?
    };
    // Each is handed out by the UPDATE that marks it, only if still pending: two replicas
    // answering the same node at once (a retry sent to the other) cannot both deliver one. (On
    // PostgreSQL the node's row, updated above, already makes the second heartbeat wait for the
    // first's COMMIT; this does not depend on that order.)
    let mut commands = Vec::with_capacity(pending.len());
    for c in pending {
        if conn
            .prepare_cached("UPDATE commands SET delivered_at = ?1 WHERE id = ?2 AND delivered_at IS NULL")?
            .execute(params![now as i64, c.id])?
            == 1
        {
            commands.push(c);
        }
    }
    if !commands.is_empty() {
        // Delivered commands are history, bounded per node; pending ones always stay.
        conn.prepare_cached(
            "DELETE FROM commands WHERE node_id = ?1 AND delivered_at IS NOT NULL AND seq <= (
                 SELECT seq FROM commands WHERE node_id = ?1 AND delivered_at IS NOT NULL
                 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
        )?
        .execute(params![node_id, COMMAND_HISTORY_PER_NODE as i64])?;
    }

    // Rentals (issue 33): the reports first (only this node's own), then what it should run:
    // one indexed lookup, empty for a node with none.
    if !req.rentals.is_empty() {
        crate::rentals::record_reports(conn, now, node_id, &req.rentals)?;
    }
    // The node's row says whether it can have any: most nodes skip the lookup.
    let rentals = if rentals_until.is_some_and(|t| t > now as i64) {
        crate::rentals::desired(conn, now, node_id)?
    } else {
        Vec::new()
    };

    let mut known_containers: Vec<String> = serde_json::from_str(&known_json)?;
    known_containers.truncate(limits::MAX_KNOWN_CONTAINERS);
    Ok(HeartbeatResponse {
        heartbeat_interval_secs,
        commands,
        known_containers,
        probe_image,
        send_inventory,
        rentals,
    })
}

/// The node's row as a heartbeat reads it, in its one lookup.
struct BeatRow {
    id: String,
    deleted_at: Option<i64>,
    inventory_hash: String,
    known_json: String,
    probe_image: Option<String>,
    last_heartbeat_at: Option<i64>,
    last_sample_at: Option<i64>,
    verification: String,
    probe_reason: Option<String>,
    /// The latest end of the node's rentals (`rentals::create` raises it); none after it.
    rentals_until: Option<i64>,
    /// The quarantine as last reported (JSON), if any.
    quarantine_json: Option<String>,
    /// Some command of the node's is not delivered yet: most beats skip that lookup.
    commands_waiting: bool,
}

// ---------------------------------------------------------------------------------------------
// The event log and the samples

/// Appends an event to a node's log, which keeps its newest [`MAX_EVENTS_PER_NODE`]. Called
/// where the event happens, and on a heartbeat only on a transition.
pub(crate) fn record(
    conn: &Conn,
    node_id: &str,
    at: u64,
    kind: NodeEventKind,
    subject: &str,
    detail: &str,
) -> Result<(), ApiError> {
    conn.prepare_cached(
        "INSERT INTO node_events (node_id, at, kind, subject, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        node_id,
        at as i64,
        kind.as_str(),
        truncate(subject, 256),
        truncate(detail, limits::MAX_TEXT_LEN)
    ])?;
    conn.prepare_cached(
        "DELETE FROM node_events WHERE node_id = ?1 AND rowid <= (
             SELECT rowid FROM node_events WHERE node_id = ?1 ORDER BY rowid DESC LIMIT 1 OFFSET ?2)",
    )?
    .execute(params![node_id, MAX_EVENTS_PER_NODE as i64])?;
    Ok(())
}

/// Records `hardware_changed` when the inventory `json` (as stored, with its `hash`) differs from
/// the one the node holds, naming the parts that changed.
fn hardware_changed(conn: &Conn, now: u64, node_id: &str, json: &str, hash: &str) -> Result<(), ApiError> {
    let (old_json, old_hash): (String, String) = conn
        .prepare_cached("SELECT inventory_json, inventory_hash FROM nodes WHERE id = ?1")?
        .query_row(params![node_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if old_hash == hash {
        return Ok(());
    }
    let old: Inventory = serde_json::from_str(&old_json).unwrap_or_default();
    let new: Inventory = serde_json::from_str(json).unwrap_or_default();
    let (o, n) = (&old.private, &new.private);
    let parts = [
        ("gpus", old.public.gpus != new.public.gpus || o.gpu_uuids != n.gpu_uuids),
        ("cpu", old.public.cpu_model != new.public.cpu_model || old.public.cpu_cores != new.public.cpu_cores),
        ("ram", old.public.ram_mib != new.public.ram_mib),
        ("disk", old.public.disk_gib != new.public.disk_gib),
        (
            "software",
            (&o.os, &o.kernel, &o.driver_version, &o.cuda_version, &o.docker_version, &o.toolkit_version)
                != (
                    &n.os,
                    &n.kernel,
                    &n.driver_version,
                    &n.cuda_version,
                    &n.docker_version,
                    &n.toolkit_version,
                ),
        ),
        ("hostname", o.hostname != n.hostname),
    ];
    let changed: Vec<&str> = parts.iter().filter(|(_, c)| *c).map(|(p, _)| *p).collect();
    record(conn, node_id, now, NodeEventKind::HardwareChanged, &changed.join(","), "")
}

// ---------------------------------------------------------------------------------------------
// Admin

/// Whose servers a request may see and change: the operator's (every server, through the admin
/// token: the admin API, the CLI, the operator's sign-in) or one owner's (their session or API
/// key). Every function below that names a node takes one, so no handler can forget it: a node
/// of another owner is "not found", exactly like one that does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Owner(String),
}

impl Scope {
    /// The owner whose rows these are; `None` for the operator.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Scope::All => None,
            Scope::Owner(id) => Some(id),
        }
    }
}

/// A node (live or deleted) within `scope`; `not_found` for another owner's.
fn owned(conn: &Conn, id: &str, scope: &Scope) -> Result<(), ApiError> {
    let Scope::Owner(want) = scope else { return Ok(()) };
    let owner: Option<Option<String>> = conn
        .prepare_cached("SELECT owner_id FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    match owner {
        Some(Some(o)) if o == *want => Ok(()),
        _ => Err(ApiError::not_found("node")),
    }
}

/// A live node within `scope`; `not_found` for a deleted one, another owner's, or none.
pub(crate) fn live_node(conn: &Conn, id: &str, scope: &Scope) -> Result<(), ApiError> {
    let found: Option<(Option<i64>, Option<String>)> = conn
        .prepare_cached("SELECT deleted_at, owner_id FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match (found, scope) {
        (Some((None, _)), Scope::All) => Ok(()),
        (Some((None, Some(o))), Scope::Owner(want)) if o == *want => Ok(()),
        _ => Err(ApiError::not_found("node")),
    }
}

/// Whether a node whose last heartbeat was at `last` is online at `now`: the one rule of the
/// list, the dashboard and the refusal of commands.
fn online(last: Option<u64>, now: u64) -> bool {
    last.is_some_and(|t| now < t.saturating_add(OFFLINE_AFTER_SECS))
}

/// The columns a node's summary is read from, in the order [`node_summary`] reads them. The
/// list and the one-node lookup share it, so they cannot show a node differently.
macro_rules! node_select {
    () => {
        "SELECT id, registered_at, agent_version, inventory_json, last_heartbeat_at, last_seq, metrics_json,
                health_json, verification, probe_output, probe_reason, managed_json, known_json,
                name, price_per_gpu_hour, min_rental_minutes, paused, probe_at,
                (SELECT email FROM owners WHERE owners.id = nodes.owner_id), quarantine_json,
                (SELECT disabled_at FROM owners WHERE owners.id = nodes.owner_id)
         FROM nodes "
    };
}

/// One row of [`node_select!`] as its summary (and its owner's standing); the histories and the
/// verdict are filled in by [`completed`].
fn node_summary(
    r: &crate::sql::Row<'_>,
    now: u64,
) -> crate::sql::Result<(NodeSummary, crate::rentable::Owner)> {
    let last_heartbeat_at = r.get::<_, Option<i64>>(4)?.map(|v| v as u64);
    let inventory: Inventory = serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or_default();
    let owner = match r.get::<_, Option<i64>>(20)? {
        Some(at) => crate::rentable::Owner::Disabled { since: at.max(0) as u64 },
        None => crate::rentable::Owner::Enabled,
    };
    let n = NodeSummary {
        id: r.get(0)?,
        registered_at: r.get::<_, i64>(1)? as u64,
        agent_version: r.get(2)?,
        name: r.get::<_, Option<String>>(13)?.unwrap_or_else(|| inventory.private.hostname.clone()),
        price_per_gpu_hour: r.get::<_, Option<i64>>(14)?.map(|v| v.max(0) as u64),
        min_rental_minutes: r.get::<_, i64>(15)?.clamp(1, i64::from(MAX_MIN_RENTAL_MINUTES)) as u32,
        paused: r.get(16)?,
        inventory,
        online: online(last_heartbeat_at, now),
        last_probe_at: r.get::<_, Option<i64>>(17)?.map(|v| v as u64),
        last_heartbeat_at,
        last_seq: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
        last_metrics: r.get::<_, Option<String>>(6)?.and_then(|m| serde_json::from_str::<Metrics>(&m).ok()),
        health: r.get::<_, Option<String>>(7)?.and_then(|h| serde_json::from_str::<Health>(&h).ok()),
        verification: enum_parse::<VerificationState>(&r.get::<_, String>(8)?).unwrap_or_default(),
        last_probe_output: r.get(9)?,
        last_probe_reason: r.get::<_, Option<String>>(10)?.and_then(|x| enum_parse::<ProbeFailure>(&x)),
        managed_containers: serde_json::from_str(&r.get::<_, String>(11)?).unwrap_or_default(),
        known_containers: serde_json::from_str(&r.get::<_, String>(12)?).unwrap_or_default(),
        removed_containers: Vec::new(),
        commands: Vec::new(),
        rentable: Default::default(),
        owner: r.get(18)?,
        quarantine: r.get::<_, Option<String>>(19)?.and_then(|q| serde_json::from_str::<Quarantine>(&q).ok()),
    };
    Ok((n, owner))
}

/// A summary read by [`node_summary`] with its two histories and its rentable verdict: two
/// queries, whatever the number of nodes.
fn completed(
    conn: &Conn,
    (mut n, owner): (NodeSummary, crate::rentable::Owner),
    check_image_chosen: bool,
) -> Result<NodeSummary, ApiError> {
    n.removed_containers = removals(conn, &n.id)?;
    n.commands = command_history(conn, &n.id)?;
    n.rentable = crate::rentable::verdict(&n, check_image_chosen, owner);
    Ok(n)
}

/// One live node within `scope`, as the list shows it: four queries (its row, its removals, its
/// commands, the check image), whatever the number of nodes (issue 44: one node costs one node).
/// `not_found` for a deleted node, another owner's, or none.
pub fn node(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<NodeSummary, ApiError> {
    let row = conn
        .prepare_cached(concat!(
            node_select!(),
            "WHERE id = ?1 AND deleted_at IS NULL AND (CAST(?2 AS TEXT) IS NULL OR owner_id = ?2)"
        ))?
        .query_row(params![id, scope.owner()], |r| node_summary(r, now))
        .optional()?
        .ok_or_else(|| ApiError::not_found("node"))?;
    completed(conn, row, probe_image(conn)?.is_some())
}

/// How many nodes a page holds unless `?limit=` says otherwise.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// The most nodes one page holds.
pub const MAX_PAGE_LIMIT: u32 = 500;

/// Where a page of a list starts: after the item with this sort key, a time and a unique text
/// (a node's `registered_at` and `id`; an owner's `created_at` and e-mail). Its text form is
/// opaque to clients (base64url); the item it names need not exist any more, so a cursor taken
/// before a deletion still works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub(crate) at: i64,
    pub(crate) key: String,
}

/// The longest key a cursor carries (an e-mail address at most 254).
const MAX_CURSOR_KEY: usize = 320;

impl Cursor {
    fn of(n: &NodeSummary) -> Cursor {
        Cursor { at: n.registered_at as i64, key: n.id.clone() }
    }

    /// The text a client passes back as `?after=`.
    pub fn encode(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}:{}", self.at, self.key))
    }

    /// A cursor from [`Cursor::encode`]; `invalid_request` for anything else.
    pub fn parse(s: &str) -> Result<Cursor, ApiError> {
        use base64::Engine as _;
        let bad =
            || ApiError::new(ErrorCode::InvalidRequest, "the cursor (after) is not one the platform gave");
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).map_err(|_| bad())?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let (at, key) = raw.split_once(':').ok_or_else(bad)?;
        let at = at.parse::<i64>().map_err(|_| bad())?;
        if key.is_empty() || key.len() > MAX_CURSOR_KEY {
            return Err(bad());
        }
        Ok(Cursor { at, key: key.to_owned() })
    }
}

/// Which page of a list: at most `limit` items after `after` (from the start when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub limit: u32,
    pub after: Option<Cursor>,
}

impl Default for Page {
    fn default() -> Page {
        Page { limit: DEFAULT_PAGE_LIMIT, after: None }
    }
}

impl Page {
    /// A page from a request's `limit` and `after` (either may be absent); `invalid_request`
    /// for a limit outside 1..=[`MAX_PAGE_LIMIT`] or a cursor the platform did not give.
    pub fn parse(limit: Option<&str>, after: Option<&str>) -> Result<Page, ApiError> {
        // The same bounds for every list (nodes, owners).
        let limit = match limit {
            None => DEFAULT_PAGE_LIMIT,
            Some(l) => match l.parse::<u32>() {
                Ok(l) if (1..=MAX_PAGE_LIMIT).contains(&l) => l,
                _ => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidRequest,
                        format!("limit must be a whole number from 1 to {MAX_PAGE_LIMIT}"),
                    ));
                }
            },
        };
        let after = after.map(Cursor::parse).transpose()?;
        Ok(Page { limit, after })
    }
}

/// A page of every live node (the operator's), after the cursor `(?1, ?2)`, `?3` rows.
const PAGE_ALL: &str = concat!(
    node_select!(),
    "WHERE deleted_at IS NULL AND (registered_at, id) > (?1, ?2) ORDER BY registered_at, id LIMIT ?3"
);
/// A page of owner `?1`'s live nodes, after the cursor `(?2, ?3)`, `?4` rows.
const PAGE_OWNED: &str = concat!(
    node_select!(),
    "WHERE deleted_at IS NULL AND owner_id = ?1 AND (registered_at, id) > (?2, ?3) ORDER BY registered_at, id LIMIT ?4"
);

/// One page of the live nodes within `scope`, in registration order, with the cursor of the
/// next page when there is one: 3 + 2 × `limit` queries at most, whatever the number of nodes.
pub fn list_nodes_page(conn: &Conn, now: u64, scope: &Scope, page: &Page) -> Result<NodeList, ApiError> {
    let limit = page.limit.clamp(1, MAX_PAGE_LIMIT);
    let (after_at, after_id) = page.after.as_ref().map_or((i64::MIN, ""), |c| (c.at, c.key.as_str()));
    // One more row than asked tells whether there is a next page. The operator's and an owner's
    // each walk an index in this order from the cursor on (`nodes_live_by_registration`,
    // `nodes_owner_by_registration`), so a page costs its own rows, not the platform's.
    let more_than_asked = i64::from(limit) + 1;
    let mut rows: Vec<(NodeSummary, crate::rentable::Owner)> = match scope.owner() {
        None => conn
            .prepare_cached(PAGE_ALL)?
            .query_map(params![after_at, after_id, more_than_asked], |r| node_summary(r, now))?
            .collect::<Result<_, _>>()?,
        Some(owner) => conn
            .prepare_cached(PAGE_OWNED)?
            .query_map(params![owner, after_at, after_id, more_than_asked], |r| node_summary(r, now))?
            .collect::<Result<_, _>>()?,
    };
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let check_image_chosen = probe_image(conn)?.is_some();
    let nodes = rows
        .into_iter()
        .map(|row| completed(conn, row, check_image_chosen))
        .collect::<Result<Vec<_>, _>>()?;
    let next = match nodes.last() {
        Some(last) if more => Some(Cursor::of(last).encode()),
        _ => None,
    };
    Ok(NodeList { nodes, next })
}

/// Every live node within `scope`, read page by page (the CLI's `nodes list`, the tests).
pub fn list_nodes(conn: &Conn, now: u64, scope: &Scope) -> Result<NodeList, ApiError> {
    let mut page = Page { limit: MAX_PAGE_LIMIT, after: None };
    let mut nodes = Vec::new();
    loop {
        let list = list_nodes_page(conn, now, scope, &page)?;
        nodes.extend(list.nodes);
        match list.next {
            Some(next) => page.after = Some(Cursor::parse(&next)?),
            None => return Ok(NodeList { nodes, next: None }),
        }
    }
}

fn removals(conn: &Conn, node_id: &str) -> Result<Vec<RemovedContainer>, ApiError> {
    let mut v: Vec<RemovedContainer> = conn
        .prepare_cached(
            "SELECT id, name, reason FROM container_removals WHERE node_id = ?1 ORDER BY rowid DESC LIMIT ?2",
        )?
        .query_map(params![node_id, HISTORY], |r| {
            Ok(RemovedContainer { id: r.get(0)?, name: r.get(1)?, reason: r.get(2)? })
        })?
        .collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}

fn command_history(conn: &Conn, node_id: &str) -> Result<Vec<CommandStatus>, ApiError> {
    let mut v: Vec<CommandStatus> = conn
        .prepare_cached(
            "SELECT id, kind, queued_at, delivered_at, result_ok, result_message, completed_at FROM commands
             WHERE node_id = ?1 ORDER BY seq DESC LIMIT ?2",
        )?
        .query_map(params![node_id, HISTORY], |r| {
            let id: String = r.get(0)?;
            let ok: Option<bool> = r.get(4)?;
            let message: Option<String> = r.get(5)?;
            Ok(CommandStatus {
                result: ok.map(|ok| CommandResult {
                    id: id.clone(),
                    ok,
                    message: message.unwrap_or_default(),
                }),
                id,
                kind: r.get(1)?,
                queued_at: r.get::<_, i64>(2)? as u64,
                delivered_at: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                completed_at: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
            })
        })?
        .collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}

/// The node's row: its last heartbeat and whether it was deleted; `not_found` if there never
/// was such a node.
fn node_row(conn: &Conn, id: &str) -> Result<(Option<i64>, bool), ApiError> {
    conn.prepare_cached("SELECT last_heartbeat_at, deleted_at IS NOT NULL FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or_else(|| ApiError::not_found("node"))
}

/// A node's figures over the last day before `now`, oldest first: at most one sample per
/// [`SAMPLE_INTERVAL_SECS`]. A deleted node has none.
pub fn node_samples(conn: &Conn, node_id: &str, now: u64, scope: &Scope) -> Result<NodeMetrics, ApiError> {
    owned(conn, node_id, scope)?;
    node_row(conn, node_id)?;
    let now = now as i64;
    let samples = conn
        .prepare_cached(
            "SELECT at, metrics_json FROM node_samples WHERE node_id = ?1 AND at > ?2 AND at <= ?3
             ORDER BY at, rowid",
        )?
        .query_map(params![node_id, now - SAMPLE_WINDOW_SECS as i64, now], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?
        .filter_map(|row| match row {
            Ok((at, json)) => serde_json::from_str::<Metrics>(&json)
                .ok()
                .map(|metrics| Ok(MetricsSample { at: at as u64, metrics })),
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_, _>>()?;
    Ok(NodeMetrics { interval_secs: SAMPLE_INTERVAL_SECS, samples })
}

/// A node's event log, newest first, at most `limit` entries: the recorded events, the
/// containers its agent removed (kept apart, in `container_removals`), and, while it is offline
/// now, `offline` at its last heartbeat (recorded only once the gap ends). A deleted node's log
/// holds only `deleted`.
pub fn node_events(
    conn: &Conn,
    node_id: &str,
    now: u64,
    limit: usize,
    scope: &Scope,
) -> Result<NodeEvents, ApiError> {
    owned(conn, node_id, scope)?;
    let (last_beat, deleted) = node_row(conn, node_id)?;
    let mut events = Vec::new();
    if let Some(last) = last_beat
        && !deleted
        && now as i64 >= last.saturating_add(OFFLINE_AFTER_SECS as i64)
        && limit > 0
    {
        events.push(NodeEvent {
            at: last.max(0) as u64,
            kind: NodeEventKind::Offline,
            subject: String::new(),
            detail: String::new(),
        });
    }
    let rows = conn
        .prepare_cached(
            "SELECT at, kind, subject, detail, 0 AS src, rowid FROM node_events WHERE node_id = ?1
             UNION ALL
             SELECT at, 'container_removed', name, reason, 1 AS src, rowid FROM container_removals
             WHERE node_id = ?1
             ORDER BY at DESC, src DESC, rowid DESC LIMIT ?2",
        )?
        .query_map(params![node_id, (limit - events.len()) as i64], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    // A kind this version does not know (written by a newer one) is left out.
    events.extend(rows.into_iter().filter_map(|(at, kind, subject, detail)| {
        Some(NodeEvent { at: at.max(0) as u64, kind: enum_parse(&kind)?, subject, detail })
    }));
    Ok(NodeEvents { events })
}

/// Why the owner's settings of a server are refused; [`SettingsError::message`] is the API's
/// text, the dashboard has its own in both languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingsError {
    /// Empty, or longer than [`MAX_NODE_NAME_CHARS`].
    NameLength,
    /// A control character (a newline, an escape...).
    NameControl,
    /// Zero, or over [`MAX_PRICE_PER_GPU_HOUR`].
    Price,
    /// Outside `1..=`[`MAX_MIN_RENTAL_MINUTES`].
    MinRental,
}

impl SettingsError {
    pub fn message(self) -> String {
        match self {
            SettingsError::NameLength => format!("name must be 1 to {MAX_NODE_NAME_CHARS} characters"),
            SettingsError::NameControl => "name must not contain control characters".to_owned(),
            SettingsError::Price => format!(
                "price_per_gpu_hour must be 1 to {MAX_PRICE_PER_GPU_HOUR} minor units, or null (not for rent)"
            ),
            SettingsError::MinRental => {
                format!("min_rental_minutes must be 1 to {MAX_MIN_RENTAL_MINUTES}")
            }
        }
    }
}

impl From<SettingsError> for ApiError {
    fn from(e: SettingsError) -> ApiError {
        ApiError::new(ErrorCode::InvalidRequest, e.message())
    }
}

/// A server name as stored: trimmed, 1 to [`MAX_NODE_NAME_CHARS`] characters, no control
/// character.
pub fn check_name(name: &str) -> Result<String, SettingsError> {
    let name = name.trim();
    if name.chars().any(char::is_control) {
        return Err(SettingsError::NameControl);
    }
    let n = name.chars().count();
    if n == 0 || n > MAX_NODE_NAME_CHARS {
        return Err(SettingsError::NameLength);
    }
    Ok(name.to_owned())
}

/// Checks every field of `req` (before anything is written): the normalised name, if one.
pub fn check_update(req: &UpdateNodeRequest) -> Result<Option<Option<String>>, SettingsError> {
    if let Some(Some(p)) = req.price_per_gpu_hour
        && !(1..=MAX_PRICE_PER_GPU_HOUR).contains(&p)
    {
        return Err(SettingsError::Price);
    }
    if let Some(m) = req.min_rental_minutes
        && !(1..=MAX_MIN_RENTAL_MINUTES).contains(&m)
    {
        return Err(SettingsError::MinRental);
    }
    match &req.name {
        Some(Some(n)) => Ok(Some(Some(check_name(n)?))),
        Some(None) => Ok(Some(None)),
        None => Ok(None),
    }
}

/// Changes the owner's settings of a live node: only the fields `req` carries, all or none.
pub fn update_node(
    conn: &Conn,
    id: &str,
    req: &UpdateNodeRequest,
    scope: &Scope,
) -> Result<NodeSettings, ApiError> {
    let name = check_update(req)?;
    live_node(conn, id, scope)?;
    conn.prepare_cached(
        "UPDATE nodes SET
             name = CASE WHEN ?2 THEN ?3 ELSE name END,
             price_per_gpu_hour = CASE WHEN ?4 THEN ?5 ELSE price_per_gpu_hour END,
             min_rental_minutes = COALESCE(?6, min_rental_minutes),
             paused = COALESCE(?7, paused)
         WHERE id = ?1",
    )?
    .execute(params![
        id,
        name.is_some(),
        name.flatten(),
        req.price_per_gpu_hour.is_some(),
        req.price_per_gpu_hour.flatten().map(|p| p as i64),
        req.min_rental_minutes,
        req.paused,
    ])?;
    node_settings(conn, id)
}

/// A live node's settings, its name defaulting to its host name.
pub fn node_settings(conn: &Conn, id: &str) -> Result<NodeSettings, ApiError> {
    let row = conn
        .prepare_cached(
            "SELECT name, inventory_json, price_per_gpu_hour, min_rental_minutes, paused FROM nodes
             WHERE id = ?1 AND deleted_at IS NULL",
        )?
        .query_row(params![id], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, bool>(4)?,
            ))
        })
        .optional()?;
    let Some((name, inv, price, min, paused)) = row else { return Err(ApiError::not_found("node")) };
    let name = name.unwrap_or_else(|| {
        serde_json::from_str::<Inventory>(&inv).map(|i| i.private.hostname).unwrap_or_default()
    });
    Ok(NodeSettings {
        id: id.to_owned(),
        name,
        price_per_gpu_hour: price.map(|v| v.max(0) as u64),
        min_rental_minutes: min.clamp(1, i64::from(MAX_MIN_RENTAL_MINUTES)) as u32,
        paused,
    })
}

/// Deletes a node: its next heartbeat gets 410 `node_deleted`. Everything but the id, the token
/// hash and the deletion time goes.
pub fn delete_node(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<(), ApiError> {
    live_node(conn, id, scope)?;
    conn.prepare_cached(
        "UPDATE nodes SET deleted_at = ?1, inventory_json = '{}', inventory_hash = '', metrics_json = NULL, last_sample_at = NULL,
             health_json = NULL, probe_output = NULL, probe_reason = NULL, managed_json = '[]', known_json = '[]',
             agent_version = '', name = NULL, price_per_gpu_hour = NULL, paused = 0
         WHERE id = ?2",
    )?
    .execute(params![now as i64, id])?;
    conn.prepare_cached("DELETE FROM node_gpus WHERE node_id = ?1")?.execute(params![id])?;
    // Its rentals end (no heartbeat will carry them again); their records stay for the operator.
    let ended = crate::rentals::end_for_node(conn, now, id, "node deleted")?;
    // Its tunnel and those rentals' streams end on every replica.
    crate::effects::record(conn, now, &crate::effects::rules::node_deleted(id, &ended))?;
    conn.prepare_cached("DELETE FROM commands WHERE node_id = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM container_removals WHERE node_id = ?1")?.execute(params![id])?;
    // Its history goes too: the event log keeps only that it was deleted, and when.
    conn.prepare_cached("DELETE FROM node_samples WHERE node_id = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM node_events WHERE node_id = ?1")?.execute(params![id])?;
    record(conn, id, now, NodeEventKind::Deleted, "", "")?;
    Ok(())
}

pub fn queue_command(
    conn: &Conn,
    now: u64,
    id: &str,
    kind: &str,
    scope: &Scope,
) -> Result<CommandQueued, ApiError> {
    let Some(kind) = CommandKind::parse(kind) else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("unknown command kind {kind:?}; one of: recheck, restart"),
        ));
    };
    live_node(conn, id, scope)?;
    // A command reaches the agent only at its heartbeat: an offline server is refused one, by
    // every door (the dashboard, the admin API, the CLI), and nothing is queued.
    // The node's row is locked (PostgreSQL) so that two commands sent to it at once through two
    // replicas get their places in its queue one after the other.
    let last: Option<i64> = conn
        .prepare_cached(&conn.for_update("SELECT last_heartbeat_at FROM nodes WHERE id = ?1"))?
        .query_row(params![id], |r| r.get(0))?;
    if !online(last.map(|v| v as u64), now) {
        return Err(ApiError::new(
            ErrorCode::NodeOffline,
            "the server is offline: a command reaches it only at its heartbeat; nothing was queued",
        ));
    }
    let cmd_id = new_id("cmd-");
    // Its place in the node's queue (the index on node_id, seq finds the last at once).
    let seq: i64 = conn.query_row(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM commands WHERE node_id = ?1",
        params![id],
        |r| r.get(0),
    )?;
    conn.prepare_cached(
        "INSERT INTO commands (id, node_id, kind, queued_at, seq) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![cmd_id, id, kind.as_str(), now as i64, seq])?;
    record(conn, id, now, NodeEventKind::CommandSent, kind.as_str(), "")?;
    Ok(CommandQueued { id: cmd_id })
}

pub fn rotate_token(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<TokenRotated, ApiError> {
    live_node(conn, id, scope)?;
    let old: String = conn
        .prepare_cached("SELECT token_hash FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))?;
    let token = new_token();
    conn.prepare_cached(
        "INSERT INTO replaced_tokens (token_hash, node_id, replaced_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (token_hash) DO UPDATE SET node_id = excluded.node_id, replaced_at = excluded.replaced_at",
    )?
    .execute(params![old, id, now as i64])?;
    // Only the newest replaced tokens are remembered (their agents are told `token_replaced`),
    // so repeated rotations and re-registrations cannot grow the table without bound.
    conn.prepare_cached(
        "DELETE FROM replaced_tokens WHERE node_id = ?1 AND rowid NOT IN
           (SELECT rowid FROM replaced_tokens WHERE node_id = ?1
            ORDER BY replaced_at DESC, rowid DESC LIMIT ?2)",
    )?
    .execute(params![id, limits::MAX_REPLACED_TOKENS_PER_NODE as i64])?;
    conn.prepare_cached("UPDATE nodes SET token_hash = ?1 WHERE id = ?2")?
        .execute(params![hash_secret(&token), id])?;
    record(conn, id, now, NodeEventKind::TokenReplaced, "", "")?;
    // The tunnel the old token opened ends on every replica.
    crate::effects::record(conn, now, &crate::effects::rules::token_replaced(id))?;
    Ok(TokenRotated { node_token: token })
}

pub fn set_known_containers(conn: &Conn, id: &str, ids: &[String]) -> Result<(), ApiError> {
    if ids.len() > limits::MAX_KNOWN_CONTAINERS || ids.iter().any(|c| c.is_empty() || c.len() > MAX_ID_LEN) {
        return Err(invalid(format!(
            "container_ids: at most {} ids of 1 to {MAX_ID_LEN} bytes",
            limits::MAX_KNOWN_CONTAINERS
        )));
    }
    live_node(conn, id, &Scope::All)?;
    conn.prepare_cached("UPDATE nodes SET known_json = ?1 WHERE id = ?2")?
        .execute(params![serde_json::to_string(ids)?, id])?;
    Ok(())
}

/// What one owner may hold (issue 43, item 3): open join codes (unused, unexpired) and live
/// servers. Set by the operator (`gpum-platform owners limits`, kept in `settings`, so every
/// replica applies the same); the defaults are more than an honest owner meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OwnerLimits {
    pub open_codes: u64,
    pub servers: u64,
}

impl Default for OwnerLimits {
    fn default() -> Self {
        OwnerLimits { open_codes: 100, servers: 1000 }
    }
}

const LIMIT_OPEN_CODES: &str = "owner_max_open_codes";
const LIMIT_SERVERS: &str = "owner_max_servers";

/// The owners' limits in force.
pub fn owner_limits(conn: &Conn) -> Result<OwnerLimits, ApiError> {
    let get = |key: &str| -> Result<Option<u64>, ApiError> {
        let v: Option<Option<String>> = conn
            .prepare_cached("SELECT value FROM settings WHERE key = ?1")?
            .query_row(params![key], |r| r.get(0))
            .optional()?;
        Ok(v.flatten().and_then(|s| s.parse().ok()))
    };
    let d = OwnerLimits::default();
    Ok(OwnerLimits {
        open_codes: get(LIMIT_OPEN_CODES)?.unwrap_or(d.open_codes),
        servers: get(LIMIT_SERVERS)?.unwrap_or(d.servers),
    })
}

/// Sets the limits given (the operator's CLI); the others stay.
pub fn set_owner_limits(
    conn: &Conn,
    open_codes: Option<u64>,
    servers: Option<u64>,
) -> Result<OwnerLimits, ApiError> {
    for (key, v) in [(LIMIT_OPEN_CODES, open_codes), (LIMIT_SERVERS, servers)] {
        let Some(v) = v else { continue };
        conn.prepare_cached(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?
        .execute(params![key, v.to_string()])?;
    }
    owner_limits(conn)
}

/// Locks owner `owner`'s row until the transaction ends (PostgreSQL: another replica's check
/// of the same owner's limits waits for this one's COMMIT), so a count and the insert after it
/// are not raced.
fn lock_owner(conn: &Conn, owner: &str) -> Result<(), ApiError> {
    conn.prepare_cached(&conn.for_update("SELECT id FROM owners WHERE id = ?1"))?
        .query_row(params![owner], |r| r.get::<_, String>(0))
        .optional()?;
    Ok(())
}

fn limit_reached(what: &str, n: u64) -> ApiError {
    ApiError::new(
        ErrorCode::OwnerLimitReached,
        format!(
            "the owner holds {n} {what}, the most the platform's operator allows; \
             delete or let some expire first, or ask the operator to raise the limit"
        ),
    )
}

/// Refuses a join code past owner `owner`'s open codes.
fn check_open_codes(conn: &Conn, now: u64, owner: &str) -> Result<(), ApiError> {
    lock_owner(conn, owner)?;
    let max = owner_limits(conn)?.open_codes;
    let open: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM join_codes WHERE owner_id = ?1 AND used_at IS NULL AND expires_at > ?2",
        )?
        .query_row(params![owner, now as i64], |r| r.get(0))?;
    if u64::try_from(open).unwrap_or(0) >= max {
        return Err(limit_reached("open join codes", max));
    }
    Ok(())
}

/// Refuses a registration past owner `owner`'s servers.
fn check_servers(conn: &Conn, owner: &str) -> Result<(), ApiError> {
    lock_owner(conn, owner)?;
    let max = owner_limits(conn)?.servers;
    let live: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM nodes WHERE owner_id = ?1 AND deleted_at IS NULL")?
        .query_row(params![owner], |r| r.get(0))?;
    if u64::try_from(live).unwrap_or(0) >= max {
        return Err(limit_reached("servers", max));
    }
    Ok(())
}

pub fn probe_image(conn: &Conn) -> Result<Option<String>, ApiError> {
    let v: Option<Option<String>> = conn
        .prepare_cached("SELECT value FROM settings WHERE key = 'probe_image'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(v.flatten())
}

pub fn set_probe_image(conn: &Conn, image: Option<&str>) -> Result<(), ApiError> {
    if let Some(i) = image
        && (i.is_empty() || i.len() > 512 || i.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "image: 1 to 512 characters, no spaces"));
    }
    conn.prepare_cached(
        "INSERT INTO settings (key, value) VALUES ('probe_image', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![image])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::ProbeReport;

    /// A fresh database on the engine of `GPUM_TEST_DB` (`crate::testdb`).
    fn db() -> (crate::testdb::TestDb, Conn) {
        let t = crate::testdb::TestDb::new();
        let c = t.open();
        (t, c)
    }

    fn reg(conn: &Conn, now: u64, code: &str, uuid: &str) -> Result<RegisterResponse, ApiError> {
        let mut inventory = Inventory::default();
        inventory.private.gpu_uuids = vec![uuid.into()];
        register(
            conn,
            now,
            &RegisterRequest {
                join_code: code.into(),
                agent_version: "0.1.0".into(),
                inventory,
                install_id: None,
            },
            10,
        )
    }

    fn reg_id(
        conn: &Conn,
        now: u64,
        code: &str,
        uuid: &str,
        install_id: &str,
    ) -> Result<RegisterResponse, ApiError> {
        let mut inventory = Inventory::default();
        inventory.private.gpu_uuids = vec![uuid.into()];
        let req = RegisterRequest {
            join_code: code.into(),
            agent_version: "0.1.0".into(),
            inventory,
            install_id: Some(install_id.into()),
        };
        register(conn, now, &req, 10)
    }

    fn count(c: &Conn, sql: &str) -> i64 {
        c.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn migrations_are_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.db");
        drop(open(&p).unwrap());
        let c = open(&p).unwrap();
        let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v as usize, MIGRATIONS.len());
        let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }

    /// A database made before the settings existed gains them with their defaults.
    #[test]
    fn the_settings_migration_keeps_existing_nodes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.db");
        {
            let c = rusqlite::Connection::open(&p).unwrap();
            for (i, m) in MIGRATIONS.iter().enumerate().take(3) {
                c.execute_batch(&format!("BEGIN; {m}; PRAGMA user_version = {}; COMMIT;", i + 1)).unwrap();
            }
            let mut inv = Inventory::default();
            inv.private.hostname = "old-box".into();
            c.execute(
                "INSERT INTO nodes (id, token_hash, registered_at, inventory_json) VALUES ('node-old', 'h', 1, ?1)",
                rusqlite::params![serde_json::to_string(&inv).unwrap()],
            )
            .unwrap();
        }
        let c = open(&p).unwrap();
        let n = &list_nodes(&c, 2, &Scope::All).unwrap().nodes[0];
        assert_eq!(
            (n.name.as_str(), n.price_per_gpu_hour, n.min_rental_minutes, n.paused),
            ("old-box", None, 60, false)
        );
    }

    #[test]
    fn settings_change_only_what_is_sent_and_are_checked_first() {
        let (_d, c) = db();
        let code = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
        let mut inventory = Inventory::default();
        inventory.private.hostname = "gpu-box".into();
        let req = RegisterRequest { join_code: code, agent_version: "1".into(), inventory, install_id: None };
        let id = register(&c, 1000, &req, 10).unwrap().node_id;
        let s = node_settings(&c, &id).unwrap();
        assert_eq!(
            (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
            ("gpu-box", None, 60, false)
        );

        let upd = |r: UpdateNodeRequest| update_node(&c, &id, &r, &Scope::All);
        let s = upd(UpdateNodeRequest {
            name: Some(Some("  Rack 3 «A100» ".into())),
            price_per_gpu_hour: Some(Some(1250)),
            min_rental_minutes: Some(120),
            paused: None,
        })
        .unwrap();
        assert_eq!(
            (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
            ("Rack 3 «A100»", Some(1250), 120, false)
        );
        // Only the field sent changes.
        let s = upd(UpdateNodeRequest { paused: Some(true), ..Default::default() }).unwrap();
        assert_eq!(
            (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
            ("Rack 3 «A100»", Some(1250), 120, true)
        );
        let n = list_nodes(&c, 1001, &Scope::All).unwrap().nodes.remove(0);
        assert_eq!(
            (n.name.as_str(), n.price_per_gpu_hour, n.min_rental_minutes, n.paused),
            ("Rack 3 «A100»", Some(1250), 120, true)
        );

        // Every refusal writes nothing, even of the fields that were good.
        let bad = [
            (
                UpdateNodeRequest { name: Some(Some("".into())), paused: Some(false), ..Default::default() },
                SettingsError::NameLength,
            ),
            (
                UpdateNodeRequest { name: Some(Some("   ".into())), ..Default::default() },
                SettingsError::NameLength,
            ),
            (
                UpdateNodeRequest { name: Some(Some("я".repeat(65))), ..Default::default() },
                SettingsError::NameLength,
            ),
            (
                UpdateNodeRequest { name: Some(Some("a\nb".into())), ..Default::default() },
                SettingsError::NameControl,
            ),
            (
                UpdateNodeRequest { name: Some(Some("a\u{1b}[31m".into())), ..Default::default() },
                SettingsError::NameControl,
            ),
            (
                UpdateNodeRequest {
                    price_per_gpu_hour: Some(Some(0)),
                    paused: Some(false),
                    ..Default::default()
                },
                SettingsError::Price,
            ),
            (
                UpdateNodeRequest {
                    price_per_gpu_hour: Some(Some(MAX_PRICE_PER_GPU_HOUR + 1)),
                    ..Default::default()
                },
                SettingsError::Price,
            ),
            (
                UpdateNodeRequest { min_rental_minutes: Some(0), ..Default::default() },
                SettingsError::MinRental,
            ),
            (
                UpdateNodeRequest {
                    min_rental_minutes: Some(10_081),
                    paused: Some(false),
                    ..Default::default()
                },
                SettingsError::MinRental,
            ),
        ];
        for (r, want) in bad {
            assert_eq!(check_update(&r).unwrap_err(), want, "{r:?}");
            let e = upd(r).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest);
            assert_eq!(e.message, want.message());
        }
        let s = node_settings(&c, &id).unwrap();
        assert_eq!(
            (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
            ("Rack 3 «A100»", Some(1250), 120, true),
            "nothing was written"
        );
        // The edges are accepted.
        let s = upd(UpdateNodeRequest {
            name: Some(Some("я".repeat(64))),
            price_per_gpu_hour: Some(Some(MAX_PRICE_PER_GPU_HOUR)),
            min_rental_minutes: Some(10_080),
            paused: Some(false),
        })
        .unwrap();
        assert_eq!((s.name.chars().count(), s.min_rental_minutes, s.paused), (64, 10_080, false));
        // null: the host name back, and off rent.
        let s =
            upd(UpdateNodeRequest { name: Some(None), price_per_gpu_hour: Some(None), ..Default::default() })
                .unwrap();
        assert_eq!((s.name.as_str(), s.price_per_gpu_hour), ("gpu-box", None));
        // Unknown and deleted nodes are 404; deletion forgets the settings.
        upd(UpdateNodeRequest { name: Some(Some("x".into())), ..Default::default() }).unwrap();
        assert_eq!(
            update_node(&c, "node-nope", &UpdateNodeRequest::default(), &Scope::All).unwrap_err().code,
            ErrorCode::NotFound
        );
        delete_node(&c, 1002, &id, &Scope::All).unwrap();
        assert_eq!(upd(UpdateNodeRequest::default()).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(count(&c, "SELECT COUNT(*) FROM nodes WHERE name IS NOT NULL"), 0);
    }

    #[test]
    fn join_code_lifecycle() {
        let (_d, c) = db();
        let code = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
        let open = open_join_codes(&c, 1000, &Scope::All).unwrap();
        assert_eq!(open, vec![OpenCode { hash: hash_secret(&code), created_at: 1000, expires_at: 1060 }]);
        assert!(open_join_codes(&c, 1060, &Scope::All).unwrap().is_empty(), "expired: not open");
        let err = |r: Result<RegisterResponse, ApiError>| r.unwrap_err().code;
        assert_eq!(err(reg(&c, 1000, "GPUM-123", "g")), ErrorCode::JoinCodeMalformed);
        assert_eq!(err(reg(&c, 1000, &JoinCode::generate().to_string(), "g")), ErrorCode::JoinCodeUnknown);
        assert_eq!(err(reg(&c, 1060, &code, "g")), ErrorCode::JoinCodeExpired);
        let r = reg(&c, 1059, &code.to_lowercase(), "g").unwrap();
        assert_eq!(r.node_token.len(), 64);
        assert_eq!(err(reg(&c, 1059, &code, "g")), ErrorCode::JoinCodeUsed);
        let code2 = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
        let open = open_join_codes(&c, 1059, &Scope::All).unwrap();
        assert_eq!(
            open.iter().map(|o| o.hash.clone()).collect::<Vec<_>>(),
            [hash_secret(&code2)],
            "used: not open"
        );
        assert_eq!(err(reg(&c, 1001, &code2, "g")), ErrorCode::GpuAlreadyRegistered);
        // The refusal did not consume the code: after deleting the old node it works.
        delete_node(&c, 1002, &r.node_id, &Scope::All).unwrap();
        reg(&c, 1003, &code2, "g").unwrap();
    }

    /// Two replicas' transactions on one node (issue 35): the second waits for the first's
    /// COMMIT on the node's row and then reads what it wrote, so two first heartbeats sent to two
    /// replicas at once record one "online" event, not two, and two commands sent at once get
    /// their own places in the node's queue. Deterministic: the first transaction is held open
    /// while the second is seen waiting.
    #[test]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    fn two_transactions_on_one_node_take_turns() {
        let t = crate::testdb::TestDb::on(crate::sql::Engine::Postgres);
        let a = t.open();
        let code = create_join_code(&a, 0, 60, &Scope::All).unwrap().code;
        let r = reg(&a, 0, &code, "g").unwrap();
        let in_turn = |first: &dyn Fn(&Conn), second: Box<dyn FnOnce(&Conn) + Send>| {
            let b = t.open();
            a.begin().unwrap();
            first(&a);
            let other = std::thread::spawn(move || {
                b.begin().unwrap();
                second(&b);
                b.commit().unwrap();
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert!(!other.is_finished(), "the second transaction waits for the first's row lock");
            a.commit().unwrap();
            other.join().unwrap();
        };
        let beat = |token: String| {
            move |c: &Conn| {
                heartbeat(c, 10, &token, &HeartbeatRequest { seq: 1, ..Default::default() }, 10).unwrap();
            }
        };
        in_turn(&beat(r.node_token.clone()), Box::new(beat(r.node_token.clone())));
        let online =
            format!("SELECT COUNT(*) FROM node_events WHERE kind = '{}'", NodeEventKind::Online.as_str());
        assert_eq!(count(&a, &online), 1);

        let send =
            |id: String| move |c: &Conn| drop(queue_command(c, 11, &id, "recheck", &Scope::All).unwrap());
        in_turn(&send(r.node_id.clone()), Box::new(send(r.node_id.clone())));
        assert_eq!(count(&a, "SELECT COUNT(DISTINCT seq) FROM commands"), 2);

        // One machine registered twice at once, with two join codes: its GPU is the first's, and
        // the second is refused (its check ran before the first committed).
        let codes = [0, 1].map(|_| create_join_code(&a, 0, 60, &Scope::All).unwrap().code);
        let [first, second] = codes;
        in_turn(
            &|c: &Conn| drop(reg(c, 12, &first, "g2").unwrap()),
            Box::new(move |c: &Conn| {
                assert_eq!(reg(c, 12, &second, "g2").unwrap_err().code, ErrorCode::GpuAlreadyRegistered);
                // What the refused registration wrote goes, as its savepoint would take it.
                c.rollback();
                c.begin().unwrap();
            }),
        );
        assert_eq!(count(&a, "SELECT COUNT(*) FROM node_gpus WHERE uuid = 'g2'"), 1);
        assert_eq!(count(&a, "SELECT COUNT(*) FROM nodes WHERE deleted_at IS NULL"), 2);
    }

    #[test]
    fn heartbeat_commands_revocation() {
        let (_d, c) = db();
        let code = create_join_code(&c, 0, 60, &Scope::All).unwrap().code;
        let r = reg(&c, 0, &code, "g").unwrap();
        let mut hb = HeartbeatRequest { seq: 1, ..Default::default() };
        let a = heartbeat(&c, 1, &r.node_token, &hb, 10).unwrap();
        assert!(a.send_inventory, "hash mismatch asks for the inventory");
        assert_eq!(a.probe_image, None);
        set_probe_image(&c, Some("img:1")).unwrap();
        assert_eq!(heartbeat(&c, 1, &r.node_token, &hb, 10).unwrap().probe_image.as_deref(), Some("img:1"));
        let too_many = HeartbeatRequest {
            seq: 1,
            managed_containers: vec!["c".into(); limits::MAX_MANAGED_CONTAINERS + 1],
            ..Default::default()
        };
        assert_eq!(
            heartbeat(&c, 1, &r.node_token, &too_many, 10).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        let q = queue_command(&c, 2, &r.node_id, "recheck", &Scope::All).unwrap();
        assert_eq!(
            queue_command(&c, 2, &r.node_id, "format", &Scope::All).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        hb.seq = 0;
        let a = heartbeat(&c, 2, &r.node_token, &hb, 10).unwrap();
        assert!(a.commands.is_empty(), "a handshake (smoke) never takes a command");
        hb.seq = 2;
        hb.probe = Some(ProbeReport {
            state: VerificationState::Verified,
            reason: None,
            output: "x".repeat(10_000),
            finished_at: 2,
            image: "i".into(),
        });
        let a = heartbeat(&c, 3, &r.node_token, &hb, 10).unwrap();
        assert_eq!(a.commands, vec![gpum_protocol::Command { id: q.id.clone(), kind: "recheck".into() }]);
        let a = heartbeat(&c, 4, &r.node_token, &hb, 10).unwrap();
        assert!(a.commands.is_empty(), "delivered once");
        hb.command_results = vec![CommandResult { id: q.id.clone(), ok: true, message: "done".into() }];
        heartbeat(&c, 5, &r.node_token, &hb, 10).unwrap();
        let n = &list_nodes(&c, 5, &Scope::All).unwrap().nodes[0];
        assert!(n.online);
        assert_eq!(n.verification, VerificationState::Verified);
        assert_eq!(n.last_probe_output.as_ref().unwrap().len(), PROBE_OUTPUT_MAX);
        assert_eq!(n.commands[0].result.as_ref().unwrap().message, "done");
        // When the result and the probe report arrived: what the page judges a command by.
        assert_eq!((n.commands[0].delivered_at, n.commands[0].completed_at), (Some(3), Some(5)));
        assert_eq!(n.last_probe_at, Some(5), "each beat carrying a report");
        assert!(!list_nodes(&c, 5 + OFFLINE_AFTER_SECS, &Scope::All).unwrap().nodes[0].online);
        let late = queue_command(&c, 5 + OFFLINE_AFTER_SECS, &r.node_id, "restart", &Scope::All).unwrap_err();
        assert_eq!((late.code, late.code.http_status()), (ErrorCode::NodeOffline, 409));
        assert_eq!(list_nodes(&c, 5, &Scope::All).unwrap().nodes[0].commands.len(), 1, "nothing queued");

        let new = rotate_token(&c, 6, &r.node_id, &Scope::All).unwrap();
        assert_eq!(heartbeat(&c, 7, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::TokenReplaced);
        heartbeat(&c, 7, &new.node_token, &hb, 10).unwrap();
        assert_eq!(heartbeat(&c, 7, &new_token(), &hb, 10).unwrap_err().code, ErrorCode::Unauthorized);
        delete_node(&c, 8, &r.node_id, &Scope::All).unwrap();
        assert_eq!(heartbeat(&c, 9, &new.node_token, &hb, 10).unwrap_err().code, ErrorCode::NodeDeleted);
        assert_eq!(heartbeat(&c, 9, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::NodeDeleted);
        assert_eq!(
            heartbeat(&c, 9, &new.node_token, &too_many, 10).unwrap_err().code,
            ErrorCode::NodeDeleted,
            "revocation wins over a bad body"
        );
        assert_eq!(delete_node(&c, 9, &r.node_id, &Scope::All).unwrap_err().code, ErrorCode::NotFound);
        assert!(list_nodes(&c, 9, &Scope::All).unwrap().nodes.is_empty());
    }

    const ID_A: &str = "0123456789abcdef0123456789abcdef";
    const ID_B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn a_repeat_with_the_same_install_id_gets_the_same_node_and_a_new_token() {
        let (_d, c) = db();
        let code = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
        let first = reg_id(&c, 1000, &code, "g", ID_A).unwrap();
        // The same installation again (its answer was lost): same node, fresh token, and the
        // first token is revoked.
        let again = reg_id(&c, 1010, &code, "g", &ID_A.to_uppercase()).unwrap();
        assert_eq!(again.node_id, first.node_id);
        assert_ne!(again.node_token, first.node_token);
        let hb = HeartbeatRequest { seq: 1, ..Default::default() };
        assert_eq!(
            heartbeat(&c, 1011, &first.node_token, &hb, 10).unwrap_err().code,
            ErrorCode::TokenReplaced
        );
        heartbeat(&c, 1011, &again.node_token, &hb, 10).unwrap();
        assert_eq!(list_nodes(&c, 1011, &Scope::All).unwrap().nodes.len(), 1, "exactly one node");
        // Every other reuse stays `join_code_used`: another install id, none, or too late.
        let used = |r: Result<RegisterResponse, ApiError>| r.unwrap_err().code;
        assert_eq!(used(reg_id(&c, 1012, &code, "g", ID_B)), ErrorCode::JoinCodeUsed);
        assert_eq!(used(reg(&c, 1012, &code, "g")), ErrorCode::JoinCodeUsed);
        assert_eq!(
            used(reg_id(&c, 1060, &code, "g", ID_A)),
            ErrorCode::JoinCodeUsed,
            "past the code's lifetime"
        );
        // Nor after the node was deleted.
        delete_node(&c, 1013, &first.node_id, &Scope::All).unwrap();
        assert_eq!(used(reg_id(&c, 1014, &code, "g", ID_A)), ErrorCode::JoinCodeUsed);
        // A code first used without an install id cannot be repeated with one.
        let code2 = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
        reg(&c, 1015, &code2, "h").unwrap();
        assert_eq!(used(reg_id(&c, 1016, &code2, "h", ID_A)), ErrorCode::JoinCodeUsed);
        // A malformed install id is refused before the code is used.
        let code3 = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
        for bad in ["", "0123", "g123456789abcdef0123456789abcdef", &format!("{ID_A}0")] {
            assert_eq!(used(reg_id(&c, 1017, &code3, "k", bad)), ErrorCode::InvalidRequest, "{bad:?}");
        }
        reg_id(&c, 1018, &code3, "k", ID_B).unwrap();
        // Only the install id's hash is stored.
        let stored: Vec<String> = c
            .prepare_cached("SELECT install_id_hash FROM join_codes WHERE install_id_hash IS NOT NULL")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(stored, vec![hash_secret(ID_A), hash_secret(ID_B)]);
    }

    #[test]
    fn a_repeat_cannot_take_another_nodes_gpu() {
        let (_d, c) = db();
        let code = create_join_code(&c, 0, 60, &Scope::All).unwrap().code;
        let other = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "theirs").unwrap();
        let mine = reg_id(&c, 0, &code, "mine", ID_A).unwrap();
        assert_eq!(reg_id(&c, 1, &code, "theirs", ID_A).unwrap_err().code, ErrorCode::GpuAlreadyRegistered);
        // The refusal changed nothing: the first token still works.
        heartbeat(&c, 2, &mine.node_token, &HeartbeatRequest { seq: 1, ..Default::default() }, 10).unwrap();
        assert_eq!(
            list_nodes(&c, 2, &Scope::All).unwrap().nodes.iter().filter(|n| n.id == other.node_id).count(),
            1
        );
    }

    #[test]
    fn commands_come_in_bounded_batches_oldest_first() {
        let (_d, c) = db();
        let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
        let n = 2 * limits::MAX_COMMANDS_PER_RESPONSE + 3;
        // Never seen: offline, and refused a command (nothing queued); a handshake brings it
        // online without taking any.
        assert_eq!(
            queue_command(&c, 1, &r.node_id, "recheck", &Scope::All).unwrap_err().code,
            ErrorCode::NodeOffline
        );
        assert_eq!(count(&c, "SELECT COUNT(*) FROM commands"), 0);
        heartbeat(&c, 1, &r.node_token, &HeartbeatRequest::default(), 10).unwrap();
        let queued: Vec<String> =
            (0..n).map(|_| queue_command(&c, 1, &r.node_id, "recheck", &Scope::All).unwrap().id).collect();
        let mut got = Vec::new();
        for seq in 1.. {
            let a =
                heartbeat(&c, 2, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
            assert!(
                a.commands.len() <= limits::MAX_COMMANDS_PER_RESPONSE,
                "{} in one answer",
                a.commands.len()
            );
            if a.commands.is_empty() {
                break;
            }
            got.extend(a.commands.into_iter().map(|c| c.id));
        }
        assert_eq!(got, queued, "every command once, in order");
        // Results up to the limit are taken; more are refused as a whole.
        let results = |k: usize| HeartbeatRequest {
            seq: 9,
            command_results: got
                .iter()
                .cycle()
                .take(k)
                .map(|id| CommandResult { id: id.clone(), ok: true, message: "m".into() })
                .collect(),
            ..Default::default()
        };
        heartbeat(&c, 3, &r.node_token, &results(limits::MAX_COMMAND_RESULTS), 10).unwrap();
        assert_eq!(
            heartbeat(&c, 3, &r.node_token, &results(limits::MAX_COMMAND_RESULTS + 1), 10).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
    }

    #[test]
    fn histories_stay_bounded_per_node() {
        let (_d, c) = db();
        let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
        let long = "x".repeat(100_000);
        for seq in 1..=50u64 {
            let hb = HeartbeatRequest {
                seq,
                removed_containers: (0..limits::MAX_REMOVED_CONTAINERS)
                    .map(|i| RemovedContainer {
                        id: format!("{seq}-{i}"),
                        name: long.clone(),
                        reason: long.clone(),
                    })
                    .collect(),
                health: Health { docker_error: Some(long.clone()), ..Default::default() },
                ..Default::default()
            };
            heartbeat(&c, seq, &r.node_token, &hb, 10).unwrap();
        }
        assert_eq!(
            count(&c, "SELECT COUNT(*) FROM container_removals") as usize,
            limits::MAX_REMOVED_HISTORY_PER_NODE
        );
        assert!(count(&c, "SELECT MAX(length(name) + length(reason)) FROM container_removals") <= 768);
        assert!(count(&c, "SELECT length(health_json) FROM nodes") < 2 * limits::MAX_TEXT_LEN as i64);
        // The newest records are the ones kept.
        let n = &list_nodes(&c, 51, &Scope::All).unwrap().nodes[0];
        assert_eq!(
            n.removed_containers.last().unwrap().id,
            format!("50-{}", limits::MAX_REMOVED_CONTAINERS - 1)
        );
        let over = HeartbeatRequest {
            seq: 51,
            removed_containers: vec![
                RemovedContainer { id: "x".into(), name: "n".into(), reason: "r".into() };
                limits::MAX_REMOVED_CONTAINERS + 1
            ],
            ..Default::default()
        };
        assert_eq!(heartbeat(&c, 51, &r.node_token, &over, 10).unwrap_err().code, ErrorCode::InvalidRequest);

        // Delivered commands too: pending ones always stay.
        for _ in 0..COMMAND_HISTORY_PER_NODE + 40 {
            queue_command(&c, 52, &r.node_id, "recheck", &Scope::All).unwrap();
        }
        for seq in 60..100 {
            heartbeat(&c, 53, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
        }
        assert_eq!(count(&c, "SELECT COUNT(*) FROM commands") as usize, COMMAND_HISTORY_PER_NODE);
        assert_eq!(count(&c, "SELECT COUNT(*) FROM commands WHERE delivered_at IS NULL"), 0);
    }

    #[test]
    fn long_inventory_text_is_cut_but_its_hash_kept() {
        let (_d, c) = db();
        let mut inv = Inventory::default();
        inv.private.gpu_uuids = vec!["g".into()];
        inv.private.hostname = "h".repeat(500_000);
        inv.public.gpus = vec![gpum_protocol::GpuPublic { model: "m".repeat(5000), vram_mib: 1 }];
        let code = create_join_code(&c, 0, 60, &Scope::All).unwrap().code;
        let r = register(
            &c,
            0,
            &RegisterRequest {
                join_code: code,
                agent_version: "v".repeat(5000),
                inventory: inv.clone(),
                install_id: None,
            },
            10,
        )
        .unwrap();
        let n = &list_nodes(&c, 1, &Scope::All).unwrap().nodes[0];
        assert_eq!(n.inventory.private.hostname.len(), limits::MAX_TEXT_LEN);
        assert_eq!(n.inventory.public.gpus[0].model.len(), limits::MAX_TEXT_LEN);
        assert_eq!(n.agent_version.len(), 64);
        // The agent's hash still matches: no endless "send the inventory".
        let hb = HeartbeatRequest { seq: 1, inventory_hash: inv.hash(), ..Default::default() };
        assert!(!heartbeat(&c, 2, &r.node_token, &hb, 10).unwrap().send_inventory);
        inv.public.gpus =
            vec![gpum_protocol::GpuPublic { model: "m".into(), vram_mib: 1 }; limits::MAX_GPUS + 1];
        let hb = HeartbeatRequest {
            seq: 2,
            inventory_hash: inv.hash(),
            inventory: Some(inv),
            ..Default::default()
        };
        assert_eq!(heartbeat(&c, 3, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::InvalidRequest);
    }

    fn metrics(util: u32) -> Metrics {
        Metrics {
            cpu_load_pct: 12.5,
            ram_used_mib: 1000,
            ram_total_mib: 4000,
            disk_free_gib: 100,
            gpus: vec![gpum_protocol::GpuMetrics {
                index: 0,
                util_pct: util,
                mem_used_mib: 10,
                mem_total_mib: 20,
                temp_c: 50,
                power_w: 70.5,
            }],
        }
    }

    fn kinds(c: &Conn, id: &str, now: u64) -> Vec<NodeEventKind> {
        node_events(c, id, now, MAX_EVENTS_PER_NODE, &Scope::All)
            .unwrap()
            .events
            .into_iter()
            .map(|e| e.kind)
            .collect()
    }

    /// A beat every 10 s for two days: one sample per interval at most, none older than a day,
    /// a day's worth at most; the samples are what the beats carried.
    #[test]
    fn samples_are_at_most_one_per_interval_and_a_day_of_them() {
        let (_d, c) = db();
        let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
        let mut beats = 0;
        let mut t = 1000;
        while t <= 1000 + 2 * SAMPLE_WINDOW_SECS {
            let hb = HeartbeatRequest {
                seq: beats + 1,
                metrics: metrics((t / 10 % 100) as u32),
                ..Default::default()
            };
            heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
            beats += 1;
            // The table itself, not only what the read gives back, stays bounded.
            let rows = count(&c, "SELECT COUNT(*) FROM node_samples") as usize;
            assert!(rows <= MAX_SAMPLES_PER_NODE, "{rows} rows at {t}");
            t += 10;
        }
        let now = t - 10;
        let m = node_samples(&c, &r.node_id, now, &Scope::All).unwrap();
        assert_eq!(m.interval_secs, SAMPLE_INTERVAL_SECS);
        assert_eq!(m.samples.len(), (SAMPLE_WINDOW_SECS / SAMPLE_INTERVAL_SECS) as usize, "{beats} beats");
        assert!(m.samples.iter().all(|s| s.at > now - SAMPLE_WINDOW_SECS && s.at <= now));
        for w in m.samples.windows(2) {
            assert!(w[1].at - w[0].at >= SAMPLE_INTERVAL_SECS, "{} then {}", w[0].at, w[1].at);
        }
        let last = m.samples.last().unwrap();
        assert_eq!(last.metrics, metrics((last.at / 10 % 100) as u32), "the figures of that beat");
        // Past a day without beats, nothing is left to show; a deleted node keeps no sample.
        assert!(
            node_samples(&c, &r.node_id, now + SAMPLE_WINDOW_SECS, &Scope::All).unwrap().samples.is_empty()
        );
        delete_node(&c, now, &r.node_id, &Scope::All).unwrap();
        assert_eq!(count(&c, "SELECT COUNT(*) FROM node_samples"), 0);
        assert_eq!(node_samples(&c, "node-none", now, &Scope::All).unwrap_err().code, ErrorCode::NotFound);
    }

    /// The hot path's writes, counted by SQLite: a steady beat changes one row (the node's), a
    /// beat that takes a sample two (and the day's oldest sample goes), none writes an event.
    #[test]
    fn a_steady_heartbeat_writes_one_row() {
        let d = crate::testdb::TestDb::on(crate::sql::Engine::Sqlite);
        let c = d.open();
        let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
        let beat = |t: u64, seq: u64| {
            let before = c.sqlite().unwrap().total_changes();
            let hb = HeartbeatRequest { seq, metrics: metrics(5), ..Default::default() };
            heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
            c.sqlite().unwrap().total_changes() - before
        };
        assert_eq!(beat(1, 1), 3, "the first: the node, an online event, a sample");
        for seq in 2..30 {
            assert_eq!(beat(seq, seq), 1, "beat {seq}");
        }
        // A beat every 50 s for a day and more: one in six takes a sample, and once a day of
        // them is kept, each of those also drops the oldest.
        let mut changes = std::collections::BTreeMap::<u64, usize>::new();
        let mut t = 1;
        for seq in 30..(30 + 2 * SAMPLE_WINDOW_SECS / 50) {
            t += 50;
            *changes.entry(beat(t, seq)).or_default() += 1;
        }
        let keys: Vec<u64> = changes.keys().copied().collect();
        assert_eq!(keys, [1, 2, 3], "{changes:?}");
        let sampled = changes[&2] + changes[&3];
        assert_eq!(sampled as u64, 2 * SAMPLE_WINDOW_SECS / SAMPLE_INTERVAL_SECS, "{changes:?}");
        let events = count(&c, "SELECT COUNT(*) FROM node_events");
        assert_eq!(events, 2, "registered and online, nothing more");
    }

    /// A clock moved back, then forward, never piles samples up past the bound.
    #[test]
    fn samples_stay_bounded_when_the_clock_jumps() {
        let (_d, c) = db();
        let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
        let mut seq = 1;
        for round in 0..3u64 {
            for i in 0..400u64 {
                let t = 10_000 + round * 7 + i * SAMPLE_INTERVAL_SECS;
                let hb = HeartbeatRequest { seq, metrics: metrics(1), ..Default::default() };
                heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
                seq += 1;
            }
            // Back to the start: no sample until the clock passes the last one again.
            heartbeat(&c, 10_000, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10)
                .unwrap();
            seq += 1;
        }
        assert!(count(&c, "SELECT COUNT(*) FROM node_samples") as usize <= MAX_SAMPLES_PER_NODE);
    }

    /// Each kind of event is recorded once, on its transition, never on a repeated beat; the
    /// log is newest first; a deleted node keeps only `deleted`.
    #[test]
    fn each_event_is_recorded_once_on_its_transition() {
        use NodeEventKind::*;
        let (_d, c) = db();
        let code = create_join_code(&c, 0, 3600, &Scope::All).unwrap().code;
        let r = reg(&c, 100, &code, "g").unwrap();
        let id = r.node_id.clone();
        assert_eq!(kinds(&c, &id, 100), [Registered]);
        let mut seq = 0;
        let mut beat = |t: u64, f: &dyn Fn(&mut HeartbeatRequest)| {
            seq += 1;
            let mut hb = HeartbeatRequest { seq, ..Default::default() };
            f(&mut hb);
            heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
        };
        // Online at the first beat, and not again while beats keep coming.
        for t in [110, 120, 130] {
            beat(t, &|_| {});
        }
        assert_eq!(kinds(&c, &id, 130), [Online, Registered]);
        // Offline while no beat comes (derived, not stored), then both recorded once it returns.
        let gap_end = 130 + OFFLINE_AFTER_SECS + 50;
        assert_eq!(kinds(&c, &id, gap_end - 1), [Offline, Online, Registered]);
        assert_eq!(count(&c, "SELECT COUNT(*) FROM node_events WHERE kind = 'offline'"), 0);
        beat(gap_end, &|_| {});
        beat(gap_end + 10, &|_| {});
        let ev = node_events(&c, &id, gap_end + 10, 50, &Scope::All).unwrap().events;
        assert_eq!(ev.iter().map(|e| e.kind).collect::<Vec<_>>(), [Online, Offline, Online, Registered]);
        assert_eq!((ev[0].at, ev[1].at), (gap_end, 130), "offline since its last heartbeat");
        // The check: passed once, failed once per reason, passed again.
        let probe = |state, reason| ProbeReport {
            state,
            reason,
            output: "o".into(),
            finished_at: 1,
            image: "i".into(),
        };
        let t0 = gap_end + 20;
        for (i, (state, reason)) in [
            (VerificationState::Verified, None),
            (VerificationState::Verified, None),
            (VerificationState::Failed, Some(ProbeFailure::Timeout)),
            (VerificationState::Failed, Some(ProbeFailure::Timeout)),
            (VerificationState::Failed, Some(ProbeFailure::NoNvidiaRuntime)),
            (VerificationState::Verified, None),
        ]
        .into_iter()
        .enumerate()
        {
            let p = probe(state, reason);
            beat(t0 + i as u64, &|hb| hb.probe = Some(p.clone()));
        }
        let ev = node_events(&c, &id, t0 + 10, 4, &Scope::All).unwrap().events;
        let got: Vec<_> = ev.iter().map(|e| (e.kind, e.subject.as_str())).collect();
        assert_eq!(
            got,
            [
                (CheckPassed, ""),
                (CheckFailed, "no_nvidia_runtime"),
                (CheckFailed, "timeout"),
                (CheckPassed, "")
            ]
        );
        // Hardware: a changed inventory once, naming what changed; the same one again, nothing.
        let t1 = t0 + 20;
        let mut inv = Inventory::default();
        inv.private.gpu_uuids = vec!["g".into()];
        inv.public.ram_mib = 64_000;
        inv.private.driver_version = Some("550".into());
        for i in 0..3 {
            let inv = inv.clone();
            beat(t1 + i, &move |hb| {
                hb.inventory_hash = inv.hash();
                hb.inventory = Some(inv.clone());
            });
        }
        let ev = &node_events(&c, &id, t1 + 5, 1, &Scope::All).unwrap().events[0];
        assert_eq!((ev.kind, ev.subject.as_str()), (HardwareChanged, "ram,software"));
        assert_eq!(count(&c, "SELECT COUNT(*) FROM node_events WHERE kind = 'hardware_changed'"), 1);
        // A command: sent, then its result once, however often the agent repeats it.
        let t2 = t1 + 10;
        let q = queue_command(&c, t2, &id, "restart", &Scope::All).unwrap();
        beat(t2 + 1, &|_| {});
        for i in 2..5 {
            let q = q.id.clone();
            beat(t2 + i, &move |hb| {
                hb.command_results =
                    vec![CommandResult { id: q.clone(), ok: false, message: "no <docker>".into() }]
            });
        }
        let ev = node_events(&c, &id, t2 + 5, 2, &Scope::All).unwrap().events;
        let got: Vec<_> = ev.iter().map(|e| (e.kind, e.subject.as_str(), e.detail.as_str())).collect();
        assert_eq!(got, [(CommandFailed, "restart", "no <docker>"), (CommandSent, "restart", "")]);
        // Containers removed come from their own history, in time order with the rest.
        let t3 = t2 + 10;
        beat(t3, &|hb| {
            hb.removed_containers =
                vec![RemovedContainer { id: "c1".into(), name: "job-1".into(), reason: "unknown".into() }]
        });
        rotate_token(&c, t3 + 1, &id, &Scope::All).unwrap();
        let ev = node_events(&c, &id, t3 + 1, 2, &Scope::All).unwrap().events;
        let got: Vec<_> = ev.iter().map(|e| (e.kind, e.subject.as_str(), e.detail.as_str())).collect();
        assert_eq!(got, [(TokenReplaced, "", ""), (ContainerRemoved, "job-1", "unknown")]);
        // Times never go up as the log goes down.
        let all = node_events(&c, &id, t3 + 1, MAX_EVENTS_PER_NODE, &Scope::All).unwrap().events;
        assert!(all.windows(2).all(|w| w[0].at >= w[1].at), "{all:?}");
        // Deleted: only that remains, and nothing else can be done to it.
        delete_node(&c, t3 + 2, &id, &Scope::All).unwrap();
        assert_eq!(kinds(&c, &id, t3 + 500), [Deleted]);
        assert_eq!(node_events(&c, "node-none", 1, 10, &Scope::All).unwrap_err().code, ErrorCode::NotFound);
    }

    /// However many transitions a node goes through, its log keeps the newest
    /// `MAX_EVENTS_PER_NODE` (and the removals their own bound).
    #[test]
    fn the_event_log_stays_bounded_per_node() {
        let (_d, c) = db();
        let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
        let other = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "h").unwrap();
        let mut t = 10;
        for seq in 1..=(MAX_EVENTS_PER_NODE as u64) {
            // A gap before each beat: offline and online, two events each time.
            heartbeat(&c, t, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
            queue_command(&c, t, &r.node_id, "recheck", &Scope::All).unwrap();
            t += OFFLINE_AFTER_SECS + 1;
        }
        let rows = |id: &str| {
            c.query_row("SELECT COUNT(*) FROM node_events WHERE node_id = ?1", params![id], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
        };
        assert_eq!(rows(&r.node_id) as usize, MAX_EVENTS_PER_NODE);
        assert_eq!(rows(&other.node_id), 1, "another node's log is its own");
        let ev = node_events(&c, &r.node_id, t, usize::MAX >> 1, &Scope::All).unwrap().events;
        assert_eq!(ev.len(), MAX_EVENTS_PER_NODE + 1, "and the derived offline");
        assert_eq!(ev[1].kind, NodeEventKind::CommandSent, "the newest are kept");
        assert_eq!(node_events(&c, &r.node_id, t, 3, &Scope::All).unwrap().events.len(), 3);
        assert!(node_events(&c, &r.node_id, t, 0, &Scope::All).unwrap().events.is_empty());
    }

    #[test]
    fn a_heartbeat_cannot_take_another_nodes_gpu() {
        let (_d, c) = db();
        let a = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "GPU-a").unwrap();
        let b = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "GPU-b").unwrap();
        let beat = |uuids: &[&str], seq: u64| {
            let mut inv = Inventory::default();
            inv.private.gpu_uuids = uuids.iter().map(|u| u.to_string()).collect();
            HeartbeatRequest { seq, inventory_hash: inv.hash(), inventory: Some(inv), ..Default::default() }
        };
        let owner = |uuid: &str| -> Option<String> {
            c.query_row("SELECT node_id FROM node_gpus WHERE uuid = ?1", params![uuid], |r| r.get(0))
                .optional()
                .unwrap()
        };
        let err = heartbeat(&c, 1, &b.node_token, &beat(&["GPU-b", "GPU-a"], 1), 10).unwrap_err();
        assert_eq!(err.code, ErrorCode::GpuAlreadyRegistered);
        assert_eq!(owner("GPU-a"), Some(a.node_id.clone()), "A keeps its GPU");
        assert_eq!(owner("GPU-b"), Some(b.node_id.clone()), "nothing of the refused heartbeat was stored");
        let n = node(&c, 1, &b.node_id, &Scope::All).unwrap();
        assert_eq!(n.last_seq, None);
        // Its own GPUs, a new free one, or one listed twice are fine.
        heartbeat(&c, 2, &b.node_token, &beat(&["GPU-b", "GPU-c", "GPU-c"], 2), 10).unwrap();
        assert_eq!(owner("GPU-c"), Some(b.node_id.clone()));
        // Once A is deleted its GPU is free, for a heartbeat as for a registration.
        delete_node(&c, 3, &a.node_id, &Scope::All).unwrap();
        heartbeat(&c, 4, &b.node_token, &beat(&["GPU-b", "GPU-a"], 3), 10).unwrap();
        assert_eq!(owner("GPU-a"), Some(b.node_id.clone()));
    }

    /// Registers a node with one GPU at `now` with a fresh code of `scope`.
    fn node_at(c: &Conn, now: u64, scope: &Scope, gpu: &str) -> String {
        let code = create_join_code(c, now, 60, scope).unwrap().code;
        reg(c, now, &code, gpu).unwrap().node_id
    }

    /// What one node's lookup costs, in statements.
    fn lookup_cost(c: &Conn, now: u64, id: &str) -> u64 {
        let before = crate::sql::statements_run();
        node(c, now, id, &Scope::All).unwrap();
        crate::sql::statements_run() - before
    }

    // Issue 44, item 4: reading one node ran `list_nodes` (1 + 2N statements) and kept one.
    #[test]
    fn one_node_costs_the_same_with_1_and_200_nodes() {
        let (_t, c) = db();
        let first = node_at(&c, 1, &Scope::All, "GPU-0");
        let alone = lookup_cost(&c, 2, &first);
        for i in 1..200 {
            node_at(&c, 1 + i, &Scope::All, &format!("GPU-{i}"));
        }
        assert_eq!(list_nodes(&c, 300, &Scope::All).unwrap().nodes.len(), 200);
        let among_200 = lookup_cost(&c, 300, &first);
        assert_eq!(alone, among_200, "one node's lookup must not grow with the number of nodes");
        assert!(among_200 <= 4, "the row, its removals, its commands, the check image: {among_200}");
        // A page costs what its own nodes cost, not what the platform holds.
        let page = Page { limit: 10, after: None };
        let before = crate::sql::statements_run();
        assert_eq!(list_nodes_page(&c, 300, &Scope::All, &page).unwrap().nodes.len(), 10);
        assert!(crate::sql::statements_run() - before <= 2 + 2 * 10);
    }

    #[test]
    fn one_node_reads_as_the_list_shows_it_and_only_within_its_scope() {
        let (_t, c) = db();
        let (a, _, _) = crate::accounts::invite(&c, 1, "a@example.org").unwrap();
        let (b, _, _) = crate::accounts::invite(&c, 1, "b@example.org").unwrap();
        let mine = node_at(&c, 2, &Scope::Owner(a.id.clone()), "GPU-a");
        let theirs = node_at(&c, 2, &Scope::Owner(b.id.clone()), "GPU-b");
        let listed = list_nodes(&c, 4, &Scope::All).unwrap().nodes;
        for n in &listed {
            assert_eq!(&node(&c, 4, &n.id, &Scope::All).unwrap(), n, "the same row mapping");
        }
        let scope_a = Scope::Owner(a.id.clone());
        assert_eq!(node(&c, 4, &mine, &scope_a).unwrap().id, mine);
        let not_found = |id: &str, scope: &Scope| node(&c, 4, id, scope).unwrap_err().code;
        assert_eq!(not_found(&theirs, &scope_a), ErrorCode::NotFound, "another owner's");
        assert_eq!(not_found("n_none", &Scope::All), ErrorCode::NotFound, "none");
        delete_node(&c, 5, &mine, &Scope::All).unwrap();
        assert_eq!(not_found(&mine, &scope_a), ErrorCode::NotFound, "deleted");
        assert_eq!(not_found(&mine, &Scope::All), ErrorCode::NotFound, "deleted, for the operator too");
        // An owner's pages hold their own servers only.
        let page = list_nodes_page(&c, 6, &Scope::Owner(b.id.clone()), &Page::default()).unwrap();
        assert_eq!(page.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), [theirs.as_str()]);
        assert_eq!(page.next, None);
    }

    #[test]
    fn pages_hold_every_node_exactly_once_and_a_deleted_nodes_cursor_still_works() {
        let (_t, c) = db();
        // Seven nodes, several registered in the same second (the id breaks the tie).
        let mut ids: Vec<String> = [1, 1, 1, 2, 2, 3, 3]
            .iter()
            .enumerate()
            .map(|(i, at)| node_at(&c, *at, &Scope::All, &format!("GPU-{i}")))
            .collect();
        let all: Vec<String> =
            list_nodes(&c, 9, &Scope::All).unwrap().nodes.into_iter().map(|n| n.id).collect();
        ids.sort();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(sorted, ids);
        let mut seen = Vec::new();
        let mut page = Page { limit: 3, after: None };
        let mut sizes = Vec::new();
        loop {
            let got = list_nodes_page(&c, 9, &Scope::All, &page).unwrap();
            sizes.push(got.nodes.len());
            seen.extend(got.nodes.into_iter().map(|n| n.id));
            match got.next {
                Some(next) => page.after = Some(Cursor::parse(&next).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, all, "every node once, in registration order");
        assert_eq!(sizes, [3, 3, 1]);
        // A page that ends exactly at the last node says there is no next one.
        let six = list_nodes_page(&c, 9, &Scope::All, &Page { limit: 7, after: None }).unwrap();
        assert_eq!((six.nodes.len(), six.next), (7, None));
        // The cursor of the first page, whose last node is then deleted, still gives the rest.
        let first = list_nodes_page(&c, 9, &Scope::All, &Page { limit: 3, after: None }).unwrap();
        let cursor = Cursor::parse(first.next.as_deref().unwrap()).unwrap();
        delete_node(&c, 10, &all[2], &Scope::All).unwrap();
        let rest = list_nodes_page(&c, 11, &Scope::All, &Page { limit: 500, after: Some(cursor) }).unwrap();
        assert_eq!(rest.nodes.into_iter().map(|n| n.id).collect::<Vec<_>>(), all[3..]);
        // Limits and cursors are checked.
        assert_eq!(Page::parse(None, None).unwrap(), Page { limit: DEFAULT_PAGE_LIMIT, after: None });
        assert_eq!(Page::parse(Some("500"), None).unwrap().limit, MAX_PAGE_LIMIT);
        for bad in ["0", "501", "-1", "ten", ""] {
            assert_eq!(Page::parse(Some(bad), None).unwrap_err().code, ErrorCode::InvalidRequest, "{bad:?}");
        }
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        for bad in ["%%%".to_owned(), b64("no-colon"), b64("x:n_1"), b64("5:"), String::new()] {
            assert_eq!(Page::parse(None, Some(&bad)).unwrap_err().code, ErrorCode::InvalidRequest, "{bad:?}");
        }
    }

    // A page is found through an index in its order, not by sorting every node (SQLite's plan;
    // PostgreSQL has the same indexes, `schema::tests` proves the schemas equal).
    #[test]
    fn a_page_walks_an_index_and_sorts_nothing() {
        let d = tempfile::tempdir().unwrap();
        let c = open(&d.path().join("p.db")).unwrap();
        let plan = |sql: &str| -> String {
            let s = c.sqlite().unwrap();
            let mut st = s.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let unbound = vec![rusqlite::types::Null; st.parameter_count()];
            let rows = st.query_map(rusqlite::params_from_iter(unbound), |r| r.get::<_, String>(3)).unwrap();
            rows.map(|r| r.unwrap()).collect::<Vec<_>>().join("\n")
        };
        let all = plan(PAGE_ALL);
        assert!(all.contains("nodes_live_by_registration") && !all.contains("TEMP B-TREE"), "{all}");
        let owned = plan(PAGE_OWNED);
        assert!(owned.contains("nodes_owner_by_registration") && !owned.contains("TEMP B-TREE"), "{owned}");
    }
}
