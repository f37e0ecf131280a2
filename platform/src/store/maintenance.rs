//! Scheduled maintenance (issue 46): the windows an owner plans for a server, in the
//! `maintenance` table. The rules are the core's (`gpum_platform_core::maintenance`): a window is
//! checked there before it is written, and a node's summary carries the windows not over yet,
//! so that its verdict and a rental's placement read them with the node.

use super::*;
use gpum_platform_core::maintenance::{WindowError, check_new};
use gpum_protocol::{CreateMaintenanceRequest, MaintenanceWindow, MaintenanceWindows};

impl From<WindowError> for ApiError {
    fn from(e: WindowError) -> ApiError {
        let code = match e {
            WindowError::TooMany => ErrorCode::OwnerLimitReached,
            _ => ErrorCode::InvalidRequest,
        };
        ApiError::new(code, e.message())
    }
}

/// A node's windows not over at `now`, earliest first: one indexed lookup
/// (`maintenance_node`).
pub(super) fn windows(conn: &Conn, node_id: &str, now: u64) -> Result<Vec<MaintenanceWindow>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, starts_at, ends_at, created_at FROM maintenance WHERE node_id = ?1 AND ends_at > ?2
             ORDER BY starts_at, id",
        )?
        .query_map(params![node_id, now as i64], |r| {
            Ok(MaintenanceWindow {
                id: r.get(0)?,
                starts_at: r.get::<_, i64>(1)?.max(0) as u64,
                ends_at: r.get::<_, i64>(2)?.max(0) as u64,
                created_at: r.get::<_, i64>(3)?.max(0) as u64,
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// The windows of a live node within `scope` not over at `now`; `not_found` for a deleted
/// node, another owner's, or none.
pub fn maintenance_windows(
    conn: &Conn,
    now: u64,
    node_id: &str,
    scope: &Scope,
) -> Result<MaintenanceWindows, ApiError> {
    live_node(conn, node_id, scope)?;
    Ok(MaintenanceWindows { windows: windows(conn, node_id, now)? })
}

/// Plans a window on a live node within `scope`: `Ok(Err(_))` is the core's refusal (nothing
/// written), `Err(_)` the node's absence or the database's. Windows that are over are pruned
/// first, so the bound counts only those still to come.
pub fn add_maintenance(
    conn: &Conn,
    now: u64,
    node_id: &str,
    req: &CreateMaintenanceRequest,
    scope: &Scope,
) -> Result<Result<MaintenanceWindow, WindowError>, ApiError> {
    live_node(conn, node_id, scope)?;
    // The node's row is locked (PostgreSQL) so that two windows planned at once through two
    // replicas are counted one after the other.
    conn.prepare_cached(&conn.for_update("SELECT id FROM nodes WHERE id = ?1"))?
        .query_row(params![node_id], |r| r.get::<_, String>(0))?;
    conn.prepare_cached("DELETE FROM maintenance WHERE node_id = ?1 AND ends_at <= ?2")?
        .execute(params![node_id, now as i64])?;
    let planned: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM maintenance WHERE node_id = ?1")?
        .query_row(params![node_id], |r| r.get(0))?;
    if let Err(e) = check_new(req.starts_at, req.ends_at, now, planned.max(0) as usize) {
        return Ok(Err(e));
    }
    let w = MaintenanceWindow {
        id: new_id("mw-"),
        starts_at: req.starts_at,
        ends_at: req.ends_at,
        created_at: now,
    };
    conn.prepare_cached(
        "INSERT INTO maintenance (id, node_id, starts_at, ends_at, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![w.id, node_id, w.starts_at as i64, w.ends_at as i64, now as i64])?;
    Ok(Ok(w))
}

/// Deletes a window of a live node within `scope`; `not_found` for a window the node has not
/// (another node's included).
pub fn delete_maintenance(
    conn: &Conn,
    node_id: &str,
    window_id: &str,
    scope: &Scope,
) -> Result<(), ApiError> {
    live_node(conn, node_id, scope)?;
    let n = conn
        .prepare_cached("DELETE FROM maintenance WHERE node_id = ?1 AND id = ?2")?
        .execute(params![node_id, window_id])?;
    if n == 0 {
        return Err(ApiError::not_found("maintenance window"));
    }
    Ok(())
}

/// Every window of a node, when the node is deleted.
pub(super) fn delete_node_windows(conn: &Conn, node_id: &str) -> Result<(), ApiError> {
    conn.prepare_cached("DELETE FROM maintenance WHERE node_id = ?1")?.execute(params![node_id])?;
    Ok(())
}
