//! A node's heartbeat: its token checked, its report validated and recorded, the answer (the
//! commands and rentals it carries) built.

use super::*;
use crate::rules::heartbeat::{
    self as heartbeat_rules, BeatPlan, InventoryPlan, LastUpgrade, NodeFacts, Sent,
};
use gpum_platform_core::rollout::{self, Rollout};
use gpum_protocol::{RolloutState, UpgradeOutcome};

/// Finds the live node a bearer token belongs to, or the revocation answer.
pub(super) fn authenticate_node(conn: &Conn, token: &str) -> Result<String, ApiError> {
    authenticate_hash(conn, &hash_secret(token))
}

pub(super) fn authenticate_hash(conn: &Conn, h: &str) -> Result<String, ApiError> {
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

pub(super) fn node_deleted() -> ApiError {
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
pub(super) fn validate_beat(req: &HeartbeatRequest) -> Result<(), ApiError> {
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
pub(super) fn bounded_quarantine_json(q: &Quarantine) -> Result<String, ApiError> {
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

/// A heartbeat whose body was checked ([`PreparedBeat`]): the node's facts read (its row, once),
/// the rules' plan made ([`crate::rules::heartbeat::decide`], pure), and the plan applied.
pub fn heartbeat_prepared(
    conn: &Conn,
    now: u64,
    req: &HeartbeatRequest,
    prep: &PreparedBeat,
    heartbeat_interval_secs: u64,
) -> Result<HeartbeatResponse, ApiError> {
    let Some(BeatRow { id: node_id, facts, probe_image, known_json }) =
        read_facts(conn, now, &prep.token_hash)?
    else {
        // The slow path tells the revocation answers apart.
        authenticate_hash(conn, &prep.token_hash)?;
        return Err(ApiError::internal());
    };
    let node_id = node_id.as_str();
    let sent = Sent {
        inventory_hash: prep.inventory.as_ref().map(|(_, hash)| hash.as_str()),
        quarantine_json: prep.quarantine_json.as_deref(),
    };
    let plan = heartbeat_rules::decide(&facts, req, sent, now);

    if let (InventoryPlan::Store { changed }, Some(inv), Some((json, hash))) =
        (plan.inventory, &req.inventory, &prep.inventory)
    {
        // The rule of registration: a GPU of another live node cannot be taken over. Nothing
        // of this heartbeat is stored then (this is the first write).
        check_gpus_free(conn, &inv.private.gpu_uuids, Some(node_id))?;
        if changed {
            hardware_changed(conn, now, node_id, json, hash)?;
        }
        conn.prepare_cached("UPDATE nodes SET inventory_json = ?1, inventory_hash = ?2 WHERE id = ?3")?
            .execute(params![json, hash, node_id])?;
        set_gpus(conn, node_id, &inv.private.gpu_uuids)?;
    }
    for e in &plan.events {
        record(conn, node_id, e.at, e.kind, &e.subject, &e.detail)?;
    }
    write_node(conn, now, node_id, req, prep, &plan)?;
    super::releases::apply_beat(conn, now, node_id, &plan)?;
    record_removals(conn, now, node_id, &req.removed_containers)?;
    record_results(conn, now, node_id, &req.command_results)?;
    let commands = if plan.deliver_commands { deliver_commands(conn, now, node_id)? } else { Vec::new() };

    // Rentals (issue 33): the reports first (only this node's own), then what it should run:
    // one indexed lookup, empty for a node with none; the node's row says whether it can have
    // any, so most nodes skip the lookup.
    if !req.rentals.is_empty() {
        crate::rentals::record_reports(conn, now, node_id, &req.rentals)?;
    }
    // Metering (issue 46): the runs this beat opens and closes, for a node that has or had a
    // rental (`rentals_until` is set by the first one); the others skip the lookup.
    if !req.rentals.is_empty() || facts.rentals_until.is_some() {
        super::earnings::meter(conn, now, node_id, facts.last_heartbeat_at, req.seq, &req.rentals)?;
    }
    let rentals = if plan.list_rentals { crate::rentals::desired(conn, now, node_id)? } else { Vec::new() };

    let mut known_containers: Vec<String> = serde_json::from_str(&known_json)?;
    known_containers.truncate(limits::MAX_KNOWN_CONTAINERS);
    Ok(HeartbeatResponse {
        heartbeat_interval_secs,
        commands,
        known_containers,
        probe_image,
        send_inventory: plan.send_inventory(),
        rentals,
        upgrade: plan.offer,
    })
}

/// The node's row as a heartbeat reads it, in its one lookup: the facts the rules take, and
/// what the answer carries as it is.
struct BeatRow {
    id: String,
    facts: NodeFacts,
    probe_image: Option<String>,
    known_json: String,
}

/// The live node of `token_hash`, read once. One lookup serves the common case (the probe image
/// rides along, what the event log and the samples compare with, and whether any command
/// waits). It locks the node's row (on PostgreSQL; SQLite's transaction holds the whole
/// database), so that two replicas answering one node at once take turns, and the second sees
/// what the first wrote: one online event, not two. `None` for a deleted or unknown node.
fn read_facts(conn: &Conn, now: u64, token_hash: &str) -> Result<Option<BeatRow>, ApiError> {
    // The rollout that is active or paused (issue 47) rides along in the same statement: a
    // lookup in a table of a few rows by its index, then its row by its key, so a steady
    // heartbeat costs no extra statement. Only the node's row is locked (`FOR UPDATE OF`).
    let row = conn
        .prepare_cached(&conn.for_update_of(
            "SELECT id, deleted_at, inventory_hash, known_json,
                    (SELECT value FROM settings WHERE key = 'probe_image'),
                    last_heartbeat_at, last_sample_at, verification, probe_reason, rentals_until,
                    quarantine_json,
                    EXISTS (SELECT 1 FROM commands WHERE node_id = nodes.id AND delivered_at IS NULL),
                    agent_version, agent_auto_update, auto_update, upgrade_to, upgrade_outcome, upgrade_at,
                    upgrade_offered,
                    ro.version, ro.state, ro.percent, ro.offer_regardless, ro.step_percent, ro.step_secs,
                    ro.stepped_at
             FROM nodes
             LEFT JOIN rollouts ro ON ro.version =
                 (SELECT version FROM rollouts WHERE state IN (?2, ?3) ORDER BY started_at DESC LIMIT 1)
             WHERE nodes.token_hash = ?1",
            "nodes",
        ))?
        .query_row(params![token_hash, RolloutState::Active, RolloutState::Paused], |r| {
            let deleted_at: Option<i64> = r.get(1)?;
            let id: String = r.get(0)?;
            let upgrade_to: Option<String> = r.get(15)?;
            let upgrade_outcome: Option<UpgradeOutcome> = r.get(16)?;
            let upgrade_at: Option<i64> = r.get(17)?;
            let rollout_version: Option<String> = r.get(19)?;
            let row = BeatRow {
                known_json: r.get(3)?,
                probe_image: r.get(4)?,
                facts: NodeFacts {
                    node_id: id.clone(),
                    inventory_hash: r.get(2)?,
                    last_heartbeat_at: r.get(5)?,
                    last_sample_at: r.get(6)?,
                    verification: r.get(7)?,
                    probe_reason: r.get(8)?,
                    rentals_until: r.get(9)?,
                    quarantine_json: r.get(10)?,
                    commands_waiting: r.get(11)?,
                    agent_version: r.get(12)?,
                    agent_auto_update: r.get(13)?,
                    auto_update: r.get(14)?,
                    last_upgrade: match (upgrade_to, upgrade_outcome) {
                        (Some(to), Some(outcome)) => {
                            Some(LastUpgrade { to, outcome, at: upgrade_at.unwrap_or(0).max(0) as u64 })
                        }
                        _ => None,
                    },
                    upgrade_offered: r.get(18)?,
                    rollout: match rollout_version {
                        Some(version) => {
                            let state: RolloutState = r.get(20)?;
                            let percent = r.get::<_, i64>(21)?.clamp(0, 100) as u8;
                            let step = super::releases::stored_step(r.get(23)?, r.get(24)?);
                            let since = r.get::<_, i64>(25)?.max(0) as u64;
                            Some(Rollout {
                                version,
                                state,
                                percent: rollout::scheduled_percent(state, percent, step, since, now),
                                offer_regardless: r.get(22)?,
                            })
                        }
                        None => None,
                    },
                },
                id,
            };
            Ok(deleted_at.is_none().then_some(row))
        })
        .optional()?;
    Ok(row.flatten())
}

/// The plan's writes to the node's own row: the check's verdict, the quarantine, the figures
/// of this beat, and a sample of them when the plan keeps one.
fn write_node(
    conn: &Conn,
    now: u64,
    node_id: &str,
    req: &HeartbeatRequest,
    prep: &PreparedBeat,
    plan: &BeatPlan,
) -> Result<(), ApiError> {
    let now_i = now as i64;
    if let Some(p) = &plan.probe {
        conn.prepare_cached(
            "UPDATE nodes SET verification = ?1, probe_output = ?2, probe_reason = ?3, probe_at = ?4
             WHERE id = ?5",
        )?
        .execute(params![p.state, p.output, p.reason, now_i, node_id])?;
    }
    if plan.quarantine_changed {
        conn.prepare_cached("UPDATE nodes SET quarantine_json = ?1 WHERE id = ?2")?
            .execute(params![prep.quarantine_json, node_id])?;
    }
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
        plan.sample
    ])?;
    if plan.sample {
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
    Ok(())
}

/// The containers the agent removed, kept as a history bounded per node.
fn record_removals(
    conn: &Conn,
    now: u64,
    node_id: &str,
    removed: &[RemovedContainer],
) -> Result<(), ApiError> {
    if removed.is_empty() {
        return Ok(());
    }
    for r in removed {
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
    Ok(())
}

/// Results are recorded once, and only for this node's own commands.
fn record_results(conn: &Conn, now: u64, node_id: &str, results: &[CommandResult]) -> Result<(), ApiError> {
    for r in results {
        let message = truncate(&r.message, limits::MAX_TEXT_LEN);
        // Read as the word stored: a replica of a newer release may have queued a kind this
        // one does not know (the agent refuses it and says so; see `deliver_commands`).
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
    Ok(())
}

/// Pending commands are delivered once, oldest first and at most `MAX_COMMANDS_PER_RESPONSE`
/// per answer (the rest wait for the next heartbeat): the answer that carries them marks them
/// delivered.
fn deliver_commands(conn: &Conn, now: u64, node_id: &str) -> Result<Vec<gpum_protocol::Command>, ApiError> {
    // The kind goes out as the word stored, as the wire carries it: a command that a replica of
    // a newer release queued is delivered, and the agent, which knows its own commands, refuses
    // one it does not know and reports why (`gpum_protocol::Command`). Queuing takes a
    // `CommandKind`, so this replica writes no unknown word itself.
    let pending: Vec<(String, String)> = conn
        .prepare_cached(
            "SELECT id, kind FROM commands WHERE node_id = ?1 AND delivered_at IS NULL ORDER BY seq LIMIT ?2",
        )?
        .query_map(params![node_id, limits::MAX_COMMANDS_PER_RESPONSE as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    // Each is handed out by the UPDATE that marks it, only if still pending: two replicas
    // answering the same node at once (a retry sent to the other) cannot both deliver one. (On
    // PostgreSQL the node's row, updated above, already makes the second heartbeat wait for the
    // first's COMMIT; this does not depend on that order.)
    let mut commands = Vec::with_capacity(pending.len());
    for (id, kind) in pending {
        if conn
            .prepare_cached("UPDATE commands SET delivered_at = ?1 WHERE id = ?2 AND delivered_at IS NULL")?
            .execute(params![now as i64, id])?
            == 1
        {
            commands.push(gpum_protocol::Command { id, kind });
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
    Ok(commands)
}
