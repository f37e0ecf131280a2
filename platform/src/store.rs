//! The platform's state in SQLite: schema, migrations and every operation, as plain functions
//! over a `rusqlite::Connection`. The HTTP server and the CLI call the same functions, so the
//! admin API and `gpum-platform nodes ...` cannot drift apart.
//!
//! Privacy and secrecy, enforced here:
//! - node tokens and join codes are stored only as SHA-256 hashes (hex); the admin token is
//!   never stored at all (the server keeps its hash in memory);
//! - no column holds an IP address or anything derived from the connection;
//! - a deleted node keeps only its id, its token hash and when it was deleted, so its agent can
//!   be told `node_deleted` (410) instead of `unauthorized`.
//!
//! A replaced token's hash moves to `replaced_tokens`, so the platform can tell "your token was
//! replaced" (401 `token_replaced`, the agent stops for good) from "I never issued this".

use std::path::Path;

use gpum_protocol::joincode::JoinCode;
use gpum_protocol::{
    CommandKind, CommandQueued, CommandResult, CommandStatus, ErrorCode, Health, HeartbeatRequest,
    HeartbeatResponse, Inventory, JoinCodeCreated, Metrics, NodeList, NodeSummary, OFFLINE_AFTER_SECS,
    PROBE_OUTPUT_MAX, ProbeFailure, RegisterRequest, RegisterResponse, RemovedContainer, TokenRotated,
    VerificationState,
};
use rand::RngCore;
use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Default join-code lifetime.
pub const DEFAULT_JOIN_CODE_TTL_SECS: u64 = 24 * 3600;
/// How many command and removal records a node listing carries.
const HISTORY: i64 = 50;
/// Limits on what an agent may make the platform store, per heartbeat.
const MAX_CONTAINERS: usize = 1000;
const MAX_ID_LEN: usize = 128;

/// The migrations, in order. `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[r#"
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
"#];

/// Opens (creating when absent) the database, sets WAL mode and runs pending migrations.
pub fn open(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // In WAL mode NORMAL loses at most the last transactions on power loss, never integrity;
    // it saves an fsync per commit, which is what lets one SQLite file take 10,000 beats/s.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    migrate(&conn)?;
    Ok(conn)
}

fn migrate(conn: &Connection) -> Result<(), rusqlite::Error> {
    let done: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    for (i, m) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {m}; PRAGMA user_version = {}; COMMIT;", i + 1))?;
    }
    Ok(())
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

fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("{prefix}{}", hex::encode(b))
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn enum_str<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

fn enum_parse<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

// ---------------------------------------------------------------------------------------------
// Join codes

pub fn create_join_code(conn: &Connection, now: u64, ttl_secs: u64) -> Result<JoinCodeCreated, ApiError> {
    if ttl_secs == 0 || ttl_secs > 365 * 24 * 3600 {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "ttl_secs must be between 1 and 31536000"));
    }
    let code = JoinCode::generate().to_string();
    let expires_at = now + ttl_secs;
    conn.prepare_cached("INSERT INTO join_codes (code_hash, created_at, expires_at) VALUES (?1, ?2, ?3)")?
        .execute(params![hash_secret(&code), now as i64, expires_at as i64])?;
    Ok(JoinCodeCreated { code, expires_at })
}

// ---------------------------------------------------------------------------------------------
// Register

fn validate_inventory(inv: &Inventory) -> Result<(), ApiError> {
    if inv.private.gpu_uuids.len() > 64
        || inv.private.gpu_uuids.iter().any(|u| u.is_empty() || u.len() > MAX_ID_LEN)
    {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "gpu_uuids: at most 64 non-empty ids of up to 128 bytes",
        ));
    }
    Ok(())
}

pub fn register(
    conn: &Connection,
    now: u64,
    req: &RegisterRequest,
    heartbeat_interval_secs: u64,
) -> Result<RegisterResponse, ApiError> {
    let code = JoinCode::parse(&req.join_code)
        .map_err(|e| ApiError::new(ErrorCode::JoinCodeMalformed, format!("the join code {e}")))?;
    validate_inventory(&req.inventory)?;
    let code_hash = hash_secret(&code.to_string());
    let row: Option<(i64, Option<i64>)> = conn
        .prepare_cached("SELECT expires_at, used_at FROM join_codes WHERE code_hash = ?1")?
        .query_row(params![code_hash], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        None => return Err(ApiError::new(ErrorCode::JoinCodeUnknown, "this join code was never issued")),
        Some((_, Some(_))) => {
            return Err(ApiError::new(ErrorCode::JoinCodeUsed, "this join code was already used"));
        }
        Some((expires_at, None)) if now as i64 >= expires_at => {
            return Err(ApiError::new(ErrorCode::JoinCodeExpired, "this join code has expired"));
        }
        Some(_) => {}
    }
    // A GPU belongs to one live node. The code is not consumed on this refusal, so the owner
    // can delete the old server and run the installer again with the same code.
    for uuid in &req.inventory.private.gpu_uuids {
        let owner: Option<String> = conn
            .prepare_cached("SELECT node_id FROM node_gpus WHERE uuid = ?1")?
            .query_row(params![uuid], |r| r.get(0))
            .optional()?;
        if owner.is_some() {
            return Err(ApiError::new(
                ErrorCode::GpuAlreadyRegistered,
                "a GPU of this machine is already registered to another server; delete that server first",
            ));
        }
    }
    conn.prepare_cached("UPDATE join_codes SET used_at = ?1 WHERE code_hash = ?2")?
        .execute(params![now as i64, code_hash])?;
    let node_id = new_id("node-");
    let token = new_token();
    let (inventory_json, inventory_hash) = req.inventory.json_and_hash();
    conn.prepare_cached(
        "INSERT INTO nodes (id, token_hash, registered_at, agent_version, inventory_json, inventory_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        node_id,
        hash_secret(&token),
        now as i64,
        truncate(&req.agent_version, 64),
        inventory_json,
        inventory_hash
    ])?;
    set_gpus(conn, &node_id, &req.inventory.private.gpu_uuids)?;
    Ok(RegisterResponse {
        node_id,
        node_token: token,
        heartbeat_interval_secs,
        probe_image: probe_image(conn)?,
    })
}

fn set_gpus(conn: &Connection, node_id: &str, uuids: &[String]) -> Result<(), ApiError> {
    conn.prepare_cached("DELETE FROM node_gpus WHERE node_id = ?1")?.execute(params![node_id])?;
    for u in uuids {
        // INSERT OR REPLACE: a GPU moved between two live nodes follows its latest report.
        conn.prepare_cached("INSERT OR REPLACE INTO node_gpus (uuid, node_id) VALUES (?1, ?2)")?
            .execute(params![u, node_id])?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Heartbeat

/// Finds the live node a bearer token belongs to, or the revocation answer.
fn authenticate_node(conn: &Connection, token: &str) -> Result<String, ApiError> {
    authenticate_hash(conn, &hash_secret(token))
}

fn authenticate_hash(conn: &Connection, h: &str) -> Result<String, ApiError> {
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
        "this node's token was replaced; the agent stops. Create a new join code and run the installer again",
    ))
}

/// Authentication only, with no effect: `Ok` for a live node's token, else the answer.
pub fn check_node_token(conn: &Connection, token: &str) -> Result<(), ApiError> {
    authenticate_node(conn, token).map(|_| ())
}

fn node_deleted() -> ApiError {
    ApiError::new(
        ErrorCode::NodeDeleted,
        "this server was deleted on the platform; the agent stops. Create a new join code and run the installer again",
    )
}

/// The parts of a heartbeat that need no database: hashing and JSON encoding. The server does
/// this on its worker threads, so the single database thread only runs SQL.
pub struct PreparedBeat {
    token_hash: String,
    metrics_json: String,
    health_json: String,
    managed_json: String,
    /// The inventory's JSON and hash, when sent.
    inventory: Option<(String, String)>,
}

impl PreparedBeat {
    pub fn new(token: &str, req: &HeartbeatRequest) -> Result<PreparedBeat, ApiError> {
        if req.managed_containers.len() > MAX_CONTAINERS
            || req.managed_containers.iter().any(|c| c.len() > MAX_ID_LEN)
            || req.removed_containers.len() > MAX_CONTAINERS
            || req.command_results.len() > MAX_CONTAINERS
        {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "too many or too long container ids or results",
            ));
        }
        let inventory = match &req.inventory {
            Some(inv) => {
                validate_inventory(inv)?;
                Some(inv.json_and_hash())
            }
            None => None,
        };
        Ok(PreparedBeat {
            token_hash: hash_secret(token),
            metrics_json: serde_json::to_string(&req.metrics)?,
            health_json: serde_json::to_string(&req.health)?,
            managed_json: serde_json::to_string(&req.managed_containers)?,
            inventory,
        })
    }
}

/// A heartbeat, start to end. The token is checked before the body: a revoked node hears so
/// even if its body is bad (the server does the same with [`PreparedBeat`] off this thread).
pub fn heartbeat(
    conn: &Connection,
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
    conn: &Connection,
    now: u64,
    req: &HeartbeatRequest,
    prep: &PreparedBeat,
    heartbeat_interval_secs: u64,
) -> Result<HeartbeatResponse, ApiError> {
    // One lookup serves the common case (the probe image rides along); the slow path tells the
    // revocation answers apart.
    type Row = (String, Option<i64>, String, String, Option<String>);
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT id, deleted_at, inventory_hash, known_json,
                    (SELECT value FROM settings WHERE key = 'probe_image')
             FROM nodes WHERE token_hash = ?1",
        )?
        .query_row(params![prep.token_hash], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .optional()?;
    let (node_id, stored_hash, known_json, probe_image) = match row {
        Some((id, None, h, k, img)) => (id, h, k, img),
        _ => {
            authenticate_hash(conn, &prep.token_hash)?;
            return Err(ApiError::internal());
        }
    };
    let mut send_inventory = false;
    if let (Some(inv), Some((json, hash))) = (&req.inventory, &prep.inventory) {
        conn.prepare_cached("UPDATE nodes SET inventory_json = ?1, inventory_hash = ?2 WHERE id = ?3")?
            .execute(params![json, hash, node_id])?;
        set_gpus(conn, &node_id, &inv.private.gpu_uuids)?;
    } else if req.inventory_hash != stored_hash {
        send_inventory = true;
    }

    if let Some(p) = &req.probe {
        conn.prepare_cached(
            "UPDATE nodes SET verification = ?1, probe_output = ?2, probe_reason = ?3 WHERE id = ?4",
        )?
        .execute(params![
            enum_str(p.state),
            truncate(&p.output, PROBE_OUTPUT_MAX),
            p.reason.map(enum_str),
            node_id
        ])?;
    }

    conn.prepare_cached(
        "UPDATE nodes SET last_heartbeat_at = ?1, last_seq = ?2, metrics_json = ?3, health_json = ?4, managed_json = ?5
         WHERE id = ?6",
    )?
    .execute(params![
        now as i64,
        req.seq as i64,
        prep.metrics_json,
        prep.health_json,
        prep.managed_json,
        node_id
    ])?;

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

    // Results are recorded once, and only for this node's own commands.
    for r in &req.command_results {
        conn.prepare_cached(
            "UPDATE commands SET result_ok = ?1, result_message = ?2, completed_at = ?3
             WHERE id = ?4 AND node_id = ?5 AND completed_at IS NULL",
        )?
        .execute(params![r.ok, truncate(&r.message, 1024), now as i64, r.id, node_id])?;
    }

    // Pending commands are delivered once: the answer that carries them marks them delivered.
    // A handshake (`seq == 0`, what `gpum-agent smoke` sends) gets none: a one-shot process that
    // exits right after would otherwise swallow a command meant for the service.
    let commands: Vec<gpum_protocol::Command> = if req.seq == 0 {
        Vec::new()
    } else {
        conn.prepare_cached(
            "SELECT id, kind FROM commands WHERE node_id = ?1 AND delivered_at IS NULL ORDER BY seq",
        )?
        .query_map(params![node_id], |r| Ok(gpum_protocol::Command { id: r.get(0)?, kind: r.get(1)? }))?
        .collect::<Result<_, _>>()?
    };
    if !commands.is_empty() {
        conn.prepare_cached(
            "UPDATE commands SET delivered_at = ?1 WHERE node_id = ?2 AND delivered_at IS NULL",
        )?
        .execute(params![now as i64, node_id])?;
    }

    Ok(HeartbeatResponse {
        heartbeat_interval_secs,
        commands,
        known_containers: serde_json::from_str(&known_json)?,
        probe_image,
        send_inventory,
    })
}

// ---------------------------------------------------------------------------------------------
// Admin

fn live_node(conn: &Connection, id: &str) -> Result<(), ApiError> {
    let found: Option<Option<i64>> = conn
        .prepare_cached("SELECT deleted_at FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    match found {
        Some(None) => Ok(()),
        _ => Err(ApiError::not_found("node")),
    }
}

pub fn list_nodes(conn: &Connection, now: u64) -> Result<NodeList, ApiError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, registered_at, agent_version, inventory_json, last_heartbeat_at, last_seq, metrics_json,
                health_json, verification, probe_output, probe_reason, managed_json, known_json
         FROM nodes WHERE deleted_at IS NULL ORDER BY registered_at, id",
    )?;
    // Each row maps straight to its summary; the two histories are filled in after.
    let mut nodes: Vec<NodeSummary> = stmt
        .query_map([], |r| {
            let last_heartbeat_at = r.get::<_, Option<i64>>(4)?.map(|v| v as u64);
            Ok(NodeSummary {
                id: r.get(0)?,
                registered_at: r.get::<_, i64>(1)? as u64,
                agent_version: r.get(2)?,
                inventory: serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or_default(),
                online: last_heartbeat_at.is_some_and(|t| now < t + OFFLINE_AFTER_SECS),
                last_heartbeat_at,
                last_seq: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
                last_metrics: r
                    .get::<_, Option<String>>(6)?
                    .and_then(|m| serde_json::from_str::<Metrics>(&m).ok()),
                health: r.get::<_, Option<String>>(7)?.and_then(|h| serde_json::from_str::<Health>(&h).ok()),
                verification: enum_parse::<VerificationState>(&r.get::<_, String>(8)?).unwrap_or_default(),
                last_probe_output: r.get(9)?,
                last_probe_reason: r
                    .get::<_, Option<String>>(10)?
                    .and_then(|x| enum_parse::<ProbeFailure>(&x)),
                managed_containers: serde_json::from_str(&r.get::<_, String>(11)?).unwrap_or_default(),
                known_containers: serde_json::from_str(&r.get::<_, String>(12)?).unwrap_or_default(),
                removed_containers: Vec::new(),
                commands: Vec::new(),
            })
        })?
        .collect::<Result<_, _>>()?;
    for n in &mut nodes {
        n.removed_containers = removals(conn, &n.id)?;
        n.commands = command_history(conn, &n.id)?;
    }
    Ok(NodeList { nodes })
}

fn removals(conn: &Connection, node_id: &str) -> Result<Vec<RemovedContainer>, ApiError> {
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

fn command_history(conn: &Connection, node_id: &str) -> Result<Vec<CommandStatus>, ApiError> {
    let mut v: Vec<CommandStatus> = conn
        .prepare_cached(
            "SELECT id, kind, queued_at, delivered_at, result_ok, result_message FROM commands
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
            })
        })?
        .collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}

/// Deletes a node: its next heartbeat gets 410 `node_deleted`. Everything but the id, the token
/// hash and the deletion time goes.
pub fn delete_node(conn: &Connection, now: u64, id: &str) -> Result<(), ApiError> {
    live_node(conn, id)?;
    conn.prepare_cached(
        "UPDATE nodes SET deleted_at = ?1, inventory_json = '{}', inventory_hash = '', metrics_json = NULL,
             health_json = NULL, probe_output = NULL, probe_reason = NULL, managed_json = '[]', known_json = '[]',
             agent_version = ''
         WHERE id = ?2",
    )?
    .execute(params![now as i64, id])?;
    conn.prepare_cached("DELETE FROM node_gpus WHERE node_id = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM commands WHERE node_id = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM container_removals WHERE node_id = ?1")?.execute(params![id])?;
    Ok(())
}

pub fn queue_command(conn: &Connection, now: u64, id: &str, kind: &str) -> Result<CommandQueued, ApiError> {
    let Some(kind) = CommandKind::parse(kind) else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("unknown command kind {kind:?}; one of: recheck, restart"),
        ));
    };
    live_node(conn, id)?;
    let cmd_id = new_id("cmd-");
    let seq: i64 = conn.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM commands", [], |r| r.get(0))?;
    conn.prepare_cached(
        "INSERT INTO commands (id, node_id, kind, queued_at, seq) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![cmd_id, id, kind.as_str(), now as i64, seq])?;
    Ok(CommandQueued { id: cmd_id })
}

pub fn rotate_token(conn: &Connection, now: u64, id: &str) -> Result<TokenRotated, ApiError> {
    live_node(conn, id)?;
    let old: String = conn
        .prepare_cached("SELECT token_hash FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))?;
    let token = new_token();
    conn.prepare_cached(
        "INSERT OR REPLACE INTO replaced_tokens (token_hash, node_id, replaced_at) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![old, id, now as i64])?;
    conn.prepare_cached("UPDATE nodes SET token_hash = ?1 WHERE id = ?2")?
        .execute(params![hash_secret(&token), id])?;
    Ok(TokenRotated { node_token: token })
}

pub fn set_known_containers(conn: &Connection, id: &str, ids: &[String]) -> Result<(), ApiError> {
    if ids.len() > MAX_CONTAINERS || ids.iter().any(|c| c.is_empty() || c.len() > MAX_ID_LEN) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "container_ids: at most 1000 ids of 1 to 128 bytes",
        ));
    }
    live_node(conn, id)?;
    conn.prepare_cached("UPDATE nodes SET known_json = ?1 WHERE id = ?2")?
        .execute(params![serde_json::to_string(ids)?, id])?;
    Ok(())
}

pub fn probe_image(conn: &Connection) -> Result<Option<String>, ApiError> {
    let v: Option<Option<String>> = conn
        .prepare_cached("SELECT value FROM settings WHERE key = 'probe_image'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(v.flatten())
}

pub fn set_probe_image(conn: &Connection, image: Option<&str>) -> Result<(), ApiError> {
    if let Some(i) = image
        && (i.is_empty() || i.len() > 512 || i.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "image: 1 to 512 characters, no spaces"));
    }
    conn.prepare_cached("INSERT OR REPLACE INTO settings (key, value) VALUES ('probe_image', ?1)")?
        .execute(params![image])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::ProbeReport;

    fn db() -> (tempfile::TempDir, Connection) {
        let d = tempfile::tempdir().unwrap();
        let c = open(&d.path().join("p.db")).unwrap();
        (d, c)
    }

    fn reg(conn: &Connection, now: u64, code: &str, uuid: &str) -> Result<RegisterResponse, ApiError> {
        let mut inventory = Inventory::default();
        inventory.private.gpu_uuids = vec![uuid.into()];
        register(
            conn,
            now,
            &RegisterRequest { join_code: code.into(), agent_version: "0.1.0".into(), inventory },
            10,
        )
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

    #[test]
    fn join_code_lifecycle() {
        let (_d, c) = db();
        let code = create_join_code(&c, 1000, 60).unwrap().code;
        let err = |r: Result<RegisterResponse, ApiError>| r.unwrap_err().code;
        assert_eq!(err(reg(&c, 1000, "GPUM-123", "g")), ErrorCode::JoinCodeMalformed);
        assert_eq!(err(reg(&c, 1000, &JoinCode::generate().to_string(), "g")), ErrorCode::JoinCodeUnknown);
        assert_eq!(err(reg(&c, 1060, &code, "g")), ErrorCode::JoinCodeExpired);
        let r = reg(&c, 1059, &code.to_lowercase(), "g").unwrap();
        assert_eq!(r.node_token.len(), 64);
        assert_eq!(err(reg(&c, 1059, &code, "g")), ErrorCode::JoinCodeUsed);
        let code2 = create_join_code(&c, 1000, 60).unwrap().code;
        assert_eq!(err(reg(&c, 1001, &code2, "g")), ErrorCode::GpuAlreadyRegistered);
        // The refusal did not consume the code: after deleting the old node it works.
        delete_node(&c, 1002, &r.node_id).unwrap();
        reg(&c, 1003, &code2, "g").unwrap();
    }

    #[test]
    fn heartbeat_commands_revocation() {
        let (_d, c) = db();
        let code = create_join_code(&c, 0, 60).unwrap().code;
        let r = reg(&c, 0, &code, "g").unwrap();
        let mut hb = HeartbeatRequest { seq: 1, ..Default::default() };
        let a = heartbeat(&c, 1, &r.node_token, &hb, 10).unwrap();
        assert!(a.send_inventory, "hash mismatch asks for the inventory");
        assert_eq!(a.probe_image, None);
        set_probe_image(&c, Some("img:1")).unwrap();
        assert_eq!(heartbeat(&c, 1, &r.node_token, &hb, 10).unwrap().probe_image.as_deref(), Some("img:1"));
        let too_many =
            HeartbeatRequest { seq: 1, managed_containers: vec!["c".into(); 1001], ..Default::default() };
        assert_eq!(
            heartbeat(&c, 1, &r.node_token, &too_many, 10).unwrap_err().code,
            ErrorCode::InvalidRequest
        );
        let q = queue_command(&c, 2, &r.node_id, "recheck").unwrap();
        assert_eq!(queue_command(&c, 2, &r.node_id, "format").unwrap_err().code, ErrorCode::InvalidRequest);
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
        let n = &list_nodes(&c, 5).unwrap().nodes[0];
        assert!(n.online);
        assert_eq!(n.verification, VerificationState::Verified);
        assert_eq!(n.last_probe_output.as_ref().unwrap().len(), PROBE_OUTPUT_MAX);
        assert_eq!(n.commands[0].result.as_ref().unwrap().message, "done");
        assert!(!list_nodes(&c, 5 + OFFLINE_AFTER_SECS).unwrap().nodes[0].online);

        let new = rotate_token(&c, 6, &r.node_id).unwrap();
        assert_eq!(heartbeat(&c, 7, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::TokenReplaced);
        heartbeat(&c, 7, &new.node_token, &hb, 10).unwrap();
        assert_eq!(heartbeat(&c, 7, &new_token(), &hb, 10).unwrap_err().code, ErrorCode::Unauthorized);
        delete_node(&c, 8, &r.node_id).unwrap();
        assert_eq!(heartbeat(&c, 9, &new.node_token, &hb, 10).unwrap_err().code, ErrorCode::NodeDeleted);
        assert_eq!(heartbeat(&c, 9, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::NodeDeleted);
        assert_eq!(
            heartbeat(&c, 9, &new.node_token, &too_many, 10).unwrap_err().code,
            ErrorCode::NodeDeleted,
            "revocation wins over a bad body"
        );
        assert_eq!(delete_node(&c, 9, &r.node_id).unwrap_err().code, ErrorCode::NotFound);
        assert!(list_nodes(&c, 9).unwrap().nodes.is_empty());
    }
}
