//! A node's heartbeat: its token checked, its report validated and recorded, the answer (the
//! commands and rentals it carries) built.

use super::*;

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
pub(super) struct BeatRow {
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
