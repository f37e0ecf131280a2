//! The node's event log and its metric samples, both bounded per node.

use super::*;

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
        kind,
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
pub(super) fn hardware_changed(
    conn: &Conn,
    now: u64,
    node_id: &str,
    json: &str,
    hash: &str,
) -> Result<(), ApiError> {
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
