//! Issue 46: a node's reliability, read from its event log and computed by the core's rule
//! (`gpum_platform_core::reliability`).

use gpum_platform_core::reliability::{Change, History, reliability};
use gpum_protocol::{NodeEventKind, NodeSummary, Reliability};

use crate::error::ApiError;
use crate::params;
use crate::sql::Conn;

/// The reliability of `n` at `now`, from the transitions its event log holds (one query).
pub(super) fn of(conn: &Conn, n: &NodeSummary, now: u64) -> Result<Option<Reliability>, ApiError> {
    let changes = conn
        .prepare_cached("SELECT at, kind FROM node_events WHERE node_id = ?1")?
        .query_map(params![n.id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        // A kind this version does not know (a newer replica's) is no transition it counts.
        .filter_map(|(at, kind)| Some((at.max(0) as u64, Change::of(NodeEventKind::parse(&kind)?)?)))
        .collect();
    let h = History {
        registered_at: n.registered_at,
        last_heartbeat_at: n.last_heartbeat_at,
        online_now: n.online,
        changes,
    };
    Ok(reliability(&h, now))
}
