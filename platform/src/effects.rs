//! Effects as data (issue 44, items 1 and 2): what a change of state must end that lives outside
//! the database, the relay's tunnels and streams, recorded as values in the same transaction as
//! the change, and applied by every `serve` process to its own relay.
//!
//! Why: the relay is each replica's memory, and the faces (the admin and owner APIs, the
//! cabinet, the CLI, which is a process of its own) each remembered, or forgot, to call it. Now
//! an operation that ends something live (a rental stopped, a node deleted, a token replaced, an
//! owner disabled) writes [`Effect`]s into the `effects` table through [`record`], and nothing
//! else calls [`Relay::end_rental`] or [`Relay::end_node`]: each `serve` runs one [`applier`],
//! which reads the effects after its cursor and applies them. It is woken at once by whatever
//! wrote them: PostgreSQL's `NOTIFY gpum_effects` (sent in the writing transaction, delivered at
//! its commit, to every replica listening on a connection of its own), and on SQLite by the
//! database thread after the batch commits ([`crate::db::Db::effects_written`]); a read every
//! [`POLL`] catches up a notification missed (a CLI command on SQLite, a dropped `LISTEN`
//! connection). A replica starts at the newest effect: older ones concern tunnels it never held.
//!
//! Order: the table's `rowid` increases with every effect, and effects are committed in that
//! order (SQLite has one writer; PostgreSQL's writers take [`ORDER_LOCK`], a transaction-scoped
//! advisory lock, before they draw an id, and hold it to their commit), so a reader that has
//! seen effect N has seen every effect before it. Pruning keeps the newest row, so SQLite never
//! hands out an old id again.
//!
//! Invariant: the faces never call the relay; an operation's effects are decided by the pure
//! functions in [`rules`] (`gpum_platform_core::effects`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::db::Db;
use crate::error::ApiError;
use crate::params;
use crate::relay::Relay;
use crate::sql::{Conn, Engine};

/// What a change of state ends, and which effects each operation has: rules of the core.
pub use gpum_platform_core::effects::{Effect, rules};

/// The one mapping between an [`Effect`] and its row (`kind`, `subject`).
const END_RENTAL: &str = "end_rental";
const END_NODE: &str = "end_node";

fn to_row(e: &Effect) -> (&'static str, &str) {
    match e {
        Effect::EndRental { rental_id } => (END_RENTAL, rental_id),
        Effect::EndNode { node_id } => (END_NODE, node_id),
    }
}

fn from_row(kind: &str, subject: String) -> Option<Effect> {
    match kind {
        END_RENTAL => Some(Effect::EndRental { rental_id: subject }),
        END_NODE => Some(Effect::EndNode { node_id: subject }),
        _ => None,
    }
}

/// Carries `effect` out on this replica's relay (a no-op where it holds nothing of it).
pub fn apply(effect: &Effect, relay: &Relay) {
    match effect {
        Effect::EndRental { rental_id } => relay.end_rental(rental_id),
        Effect::EndNode { node_id } => relay.end_node(node_id),
    }
}

/// The channel `NOTIFY` wakes the replicas on (PostgreSQL).
pub const CHANNEL: &str = "gpum_effects";

/// The advisory lock (PostgreSQL) that puts effect-writing transactions in their ids' order.
pub const ORDER_LOCK: i64 = 0x6770_756d_6566_6600; // "gpumeff\0"

/// The durable fallback: an applier reads the table at least this often.
pub const POLL: Duration = Duration::from_millis(500);

/// Effects older than this are pruned (every replica has long applied them).
pub const KEEP_SECS: u64 = 3600;

thread_local! {
    /// Set when an operation on this database thread recorded effects; the thread takes it
    /// after its batch commits and wakes the applier ([`take_written`]).
    static WRITTEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether effects were recorded on this thread since the last call (the database thread asks
/// after each commit).
pub fn take_written() -> bool {
    WRITTEN.with(|w| w.replace(false))
}

/// Records `effects` in the current transaction: committed with the change that produced them,
/// or not at all.
pub fn record(conn: &Conn, now: u64, effects: &[Effect]) -> Result<(), ApiError> {
    if effects.is_empty() {
        return Ok(());
    }
    if conn.engine() == Engine::Postgres {
        conn.prepare_cached("SELECT pg_advisory_xact_lock(?1)")?
            .query_row(params![ORDER_LOCK], |_| Ok(()))?;
    }
    for e in effects {
        let (kind, subject) = to_row(e);
        conn.prepare_cached("INSERT INTO effects (at, kind, subject) VALUES (?1, ?2, ?3)")?
            .execute(params![now as i64, kind, subject])?;
    }
    if conn.engine() == Engine::Postgres {
        conn.prepare_cached("SELECT pg_notify(?1, '')")?.query_row(params![CHANNEL], |_| Ok(()))?;
    }
    WRITTEN.with(|w| w.set(true));
    Ok(())
}

/// The newest effect's id (0 when none): where a starting replica's cursor begins.
pub fn newest(conn: &Conn) -> Result<i64, ApiError> {
    Ok(conn.query_row("SELECT COALESCE(MAX(rowid), 0) FROM effects", [], |r| r.get(0))?)
}

/// The effects after `cursor`, oldest first, at most 1,000 (the next read takes the rest).
pub fn after(conn: &Conn, cursor: i64) -> Result<Vec<(i64, Effect)>, ApiError> {
    let rows: Vec<(i64, String, String)> = conn
        .prepare_cached(
            "SELECT rowid, kind, subject FROM effects WHERE rowid > ?1 ORDER BY rowid LIMIT 1000",
        )?
        .query_map(params![cursor], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, kind, subject)| match from_row(&kind, subject) {
            Some(e) => Some((id, e)),
            None => {
                tracing::warn!(id, kind = %kind, "effects: an unknown kind, skipped");
                None
            }
        })
        .collect())
}

/// Deletes effects older than [`KEEP_SECS`], always keeping the newest (so that SQLite's next
/// id stays above every cursor).
pub fn prune(conn: &Conn, now: u64) -> Result<usize, ApiError> {
    let before = now.saturating_sub(KEEP_SECS) as i64;
    Ok(conn
        .prepare_cached("DELETE FROM effects WHERE at < ?1 AND rowid < (SELECT MAX(rowid) FROM effects)")?
        .execute(params![before])?)
}

/// What wakes the applier: the database thread after a commit that recorded effects, and on
/// PostgreSQL the `LISTEN` connection.
pub type Wake = Arc<Notify>;

/// The applier: one per `serve` process. Reads the effects after its cursor whenever woken or
/// every [`POLL`], applies them to `relay`, and prunes old ones now and then.
pub async fn applier(
    db: Db,
    relay: Arc<Relay>,
    clock: crate::clock::Clock,
    listen: Option<crate::pgurl::PgTarget>,
) {
    let wake = db.effects_written();
    if let Some(target) = listen {
        tokio::spawn(listen_loop(target, wake.clone()));
    }
    let mut cursor = loop {
        match db.call(newest).await {
            Ok(n) => break n,
            Err(e) => {
                tracing::warn!(error = %e.message, "effects: reading the newest; again in a second");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let mut last_prune = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
        loop {
            let from = cursor;
            match db.call(move |c| after(c, from)).await {
                Ok(batch) => {
                    let more = batch.len() >= 1000;
                    for (id, e) in batch {
                        tracing::info!(effect = ?e, "effects: applying");
                        apply(&e, &relay);
                        cursor = cursor.max(id);
                    }
                    if !more {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, "effects: reading; again at the next poll");
                    break;
                }
            }
        }
        if last_prune.elapsed() >= Duration::from_secs(60) {
            last_prune = std::time::Instant::now();
            let now = clock.now();
            if let Err(e) = db.call(move |c| prune(c, now)).await {
                tracing::warn!(error = %e.message, "effects: pruning");
            }
        }
    }
}

/// Keeps a `LISTEN gpum_effects` connection of its own and wakes the applier at each
/// notification; connects again a second after it breaks (the poll covers the gap).
async fn listen_loop(target: crate::pgurl::PgTarget, wake: Wake) {
    loop {
        let r = match &target.tls {
            Some(tls) => match target.config.connect(tls.clone()).await {
                Ok((client, conn)) => listen_on(client, conn, &wake).await,
                Err(e) => Err(e),
            },
            None => match target.config.connect(tokio_postgres::NoTls).await {
                Ok((client, conn)) => listen_on(client, conn, &wake).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "effects: the LISTEN connection; again in a second");
        }
        // Whatever was sent meanwhile is read now.
        wake.notify_one();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen_on<S, T>(
    client: tokio_postgres::Client,
    mut conn: tokio_postgres::Connection<S, T>,
    wake: &Wake,
) -> Result<(), tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_postgres::AsyncMessage;
    let sql = format!("LISTEN {CHANNEL}");
    let listen = client.batch_execute(&sql);
    tokio::pin!(listen);
    let mut listening = false;
    loop {
        let msg = std::future::poll_fn(|cx| {
            if !listening && let std::task::Poll::Ready(r) = listen.as_mut().poll(cx) {
                listening = true;
                if let Err(e) = r {
                    return std::task::Poll::Ready(Some(Err(e)));
                }
                // Effects sent before LISTEN took hold are read now.
                wake.notify_one();
            }
            conn.poll_message(cx)
        })
        .await;
        match msg {
            Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => return Ok(()),
        }
    }
}

use std::future::Future as _;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdb::TestDb;

    /// The invariant, checked as a tidy test: no face, and no operation, calls the relay.
    #[test]
    fn only_the_applier_calls_the_relay() {
        let sources = [
            ("server.rs", include_str!("server.rs")),
            ("cli.rs", include_str!("cli.rs")),
            ("web/mod.rs", include_str!("web/mod.rs")),
            ("web/account.rs", include_str!("web/account.rs")),
            ("store/mod.rs", include_str!("store/mod.rs")),
            ("store/enroll.rs", include_str!("store/enroll.rs")),
            ("store/heartbeat.rs", include_str!("store/heartbeat.rs")),
            ("store/nodes.rs", include_str!("store/nodes.rs")),
            ("store/owners.rs", include_str!("store/owners.rs")),
            ("rentals.rs", include_str!("rentals.rs")),
            ("accounts.rs", include_str!("accounts.rs")),
        ];
        for (name, src) in sources {
            assert!(
                !src.contains(".end_rental(") && !src.contains(".end_node("),
                "{name} calls the relay itself"
            );
        }
    }

    #[test]
    fn an_effect_round_trips_through_its_row() {
        for e in
            [Effect::EndRental { rental_id: "rent-1".into() }, Effect::EndNode { node_id: "node-1".into() }]
        {
            let (kind, subject) = to_row(&e);
            assert_eq!(from_row(kind, subject.to_owned()), Some(e));
        }
        assert_eq!(from_row("end_everything", "x".into()), None);
    }

    /// Recorded effects come back after a cursor in order; pruning keeps the newest, so the
    /// next id is still above every cursor. On the engine `GPUM_TEST_DB` names.
    #[test]
    fn effects_come_back_in_order_and_pruning_keeps_the_newest() {
        let db = TestDb::new();
        let c = db.open();
        assert_eq!(newest(&c).unwrap(), 0);
        record(&c, 100, &rules::node_deleted("node-1", &["rent-1".into()])).unwrap();
        let start = newest(&c).unwrap();
        record(&c, 200, &rules::token_replaced("node-2")).unwrap();
        let all = after(&c, 0).unwrap();
        assert_eq!(
            all.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(),
            vec![
                Effect::EndNode { node_id: "node-1".into() },
                Effect::EndRental { rental_id: "rent-1".into() },
                Effect::EndNode { node_id: "node-2".into() },
            ]
        );
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "{all:?}");
        assert_eq!(after(&c, start).unwrap().len(), 1);
        let top = newest(&c).unwrap();
        // Everything is old: only the newest stays.
        assert_eq!(prune(&c, 200 + KEEP_SECS + 1).unwrap(), 2);
        assert_eq!(newest(&c).unwrap(), top);
        record(&c, 300, &rules::rental_stopped("rent-9", true)).unwrap();
        assert_eq!(
            after(&c, top).unwrap(),
            vec![(top + 1, Effect::EndRental { rental_id: "rent-9".into() })]
        );
        assert!(take_written());
        assert!(!take_written());
    }
}
