//! One thread owns the server's SQLite connection and runs every operation, in batches.
//!
//! SQLite allows one writer at a time, and most requests (heartbeats) write. Instead of a pool
//! of connections fighting over the write lock, handlers send closures to this thread. It takes
//! whatever has queued up (up to [`MAX_BATCH`]), runs each inside its own SAVEPOINT within one
//! transaction, commits once, and only then answers the callers: group commit. A failed
//! operation rolls back to its savepoint and leaves the others in the batch alone. Under light
//! load a batch is one operation, so latency stays that of a single transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::ApiError;

const MAX_BATCH: usize = 512;

type Reply = Box<dyn FnOnce(bool) + Send>;
type Job = Box<dyn FnOnce(&Connection) -> Reply + Send>;

#[derive(Clone)]
pub struct Db {
    tx: mpsc::Sender<Job>,
    stats: Arc<Stats>,
}

/// Where the database thread's time goes; logged when the server stops (the platform bench
/// reads it).
#[derive(Debug, Default)]
pub struct Stats {
    pub ops: AtomicU64,
    pub transactions: AtomicU64,
    /// Nanoseconds spent running operations and committing.
    pub busy_ns: AtomicU64,
    /// Of which in COMMIT.
    pub commit_ns: AtomicU64,
}

impl Stats {
    pub fn summary(&self) -> String {
        let ops = self.ops.load(Ordering::Relaxed);
        let tx = self.transactions.load(Ordering::Relaxed).max(1);
        format!(
            "database: {ops} operations in {tx} transactions (mean batch {:.1}), busy {:.3} s, of which commit {:.3} s",
            ops as f64 / tx as f64,
            self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.commit_ns.load(Ordering::Relaxed) as f64 / 1e9
        )
    }
}

impl Db {
    /// Starts the database thread on an open connection.
    pub fn start(conn: Connection) -> Db {
        let (tx, rx) = mpsc::channel::<Job>();
        let stats = Arc::new(Stats::default());
        let st = stats.clone();
        std::thread::Builder::new()
            .name("gpum-db".into())
            .spawn(move || run(conn, rx, &st))
            .expect("spawn the database thread");
        Db { tx, stats }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Runs `f` on the database thread inside a transaction; its effects are committed before
    /// this returns `Ok`.
    pub async fn call<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, ApiError> + Send + 'static,
    {
        let (otx, orx) = oneshot::channel::<Result<T, ApiError>>();
        let job: Job = Box::new(move |conn: &Connection| {
            let r = match conn.execute_batch("SAVEPOINT op") {
                Ok(()) => {
                    let r = f(conn);
                    let end = if r.is_ok() { "RELEASE op" } else { "ROLLBACK TO op; RELEASE op" };
                    match conn.execute_batch(end) {
                        Ok(()) => r,
                        Err(e) => Err(ApiError::from(e)),
                    }
                }
                Err(e) => Err(ApiError::from(e)),
            };
            Box::new(move |committed: bool| {
                let _ = otx.send(if committed { r } else { Err(ApiError::internal()) });
            })
        });
        self.tx.send(job).map_err(|_| ApiError::internal())?;
        orx.await.unwrap_or_else(|_| Err(ApiError::internal()))
    }
}

fn run(conn: Connection, rx: mpsc::Receiver<Job>, stats: &Stats) {
    while let Ok(first) = rx.recv() {
        let started = Instant::now();
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
            tracing::error!("database: begin: {e}");
            for j in jobs {
                // Without a transaction, nothing may run; answer every caller with an error.
                drop(j);
            }
            continue;
        }
        let n = jobs.len() as u64;
        let replies: Vec<Reply> = jobs.into_iter().map(|j| j(&conn)).collect();
        let commit_started = Instant::now();
        let committed = match conn.execute_batch("COMMIT") {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("database: commit: {e}");
                let _ = conn.execute_batch("ROLLBACK");
                false
            }
        };
        stats.commit_ns.fetch_add(commit_started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.ops.fetch_add(n, Ordering::Relaxed);
        stats.transactions.fetch_add(1, Ordering::Relaxed);
        for r in replies {
            r(committed);
        }
    }
}
