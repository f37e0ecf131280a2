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

/// Frames in the WAL (4 KiB pages: 64 MiB) past which the checkpoint thread resets it.
pub const WAL_RESET_FRAMES: i64 = 16_384;

/// How long a reset waits for readers, blocking the writer meanwhile, before it gives up until
/// the next second's try.
const WAL_RESET_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// One round of the server's checkpoint thread, on its own connection: returns the WAL's frames
/// before the round, and whether the WAL was reset.
///
/// A PASSIVE checkpoint copies what it can into the database file without blocking anybody. Under
/// a steady stream of commits it never catches up with the writer, and SQLite only rewinds the
/// WAL after a checkpoint that did, so the `-wal` file grows without end (3.2 GiB after 40 s at
/// 10,000 heartbeats/s, docs/benchmarks.md). Past `reset_frames` frames this therefore takes a
/// TRUNCATE checkpoint: it holds the writer back while it copies the few frames the PASSIVE one
/// left and truncates the file. It waits at most [`WAL_RESET_WAIT`] for readers on an older
/// snapshot (a `backup` in progress); then it gives up and the next round tries again.
pub fn checkpoint(conn: &Connection, reset_frames: i64) -> rusqlite::Result<(i64, bool)> {
    let (_busy, frames): (i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if frames < reset_frames {
        return Ok((frames, false));
    }
    conn.busy_timeout(WAL_RESET_WAIT)?;
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
    Ok((frames, busy == 0))
}

/// What [`backup`] wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Backup {
    pub path: std::path::PathBuf,
    pub bytes: u64,
}

/// `gpum-platform backup --to FILE`: a consistent copy of the database at `db`, taken while a
/// server may be writing to it.
///
/// The copy is SQLite's `VACUUM INTO`: one read transaction, so it is a snapshot of one moment
/// (WAL lets the server go on committing meanwhile), compacted, with no `-wal` of its own. The
/// file holds token and join-code hashes, so it is created here first, exclusively (an existing
/// file or a symlink is refused, never overwritten) and mode 0600, and `VACUUM INTO` fills the
/// empty file. SQLite does not fsync what `VACUUM INTO` writes; this does, then checks the copy
/// with `PRAGMA integrity_check`. On any failure the partial file is removed.
pub fn backup(db: &std::path::Path, to: &std::path::Path) -> anyhow::Result<Backup> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    use anyhow::{Context, bail};
    use rusqlite::OpenFlags;

    // The source must exist: a mistyped --db must not create an empty database and back it up.
    let src =
        Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .with_context(|| format!("open the database {}", db.display()))?;
    src.busy_timeout(std::time::Duration::from_secs(5))?;
    let Some(to_str) = to.to_str() else { bail!("{}: the backup's path must be UTF-8", to.display()) };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .with_context(|| format!("create {} (an existing file is never overwritten)", to.display()))?;
    // Exactly 0600, whatever the umask left.
    let copy = || -> anyhow::Result<u64> {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        src.execute("VACUUM INTO ?1", [to_str]).context("VACUUM INTO")?;
        file.sync_all()?;
        if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        let check = Connection::open_with_flags(to, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let verdict: String = check.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        if verdict != "ok" {
            bail!("the copy fails SQLite's integrity check: {verdict}");
        }
        Ok(std::fs::metadata(to)?.len())
    };
    match copy() {
        Ok(bytes) => Ok(Backup { path: to.to_path_buf(), bytes }),
        Err(e) => {
            let _ = std::fs::remove_file(to);
            Err(e.context(format!("back up {} to {}", db.display(), to.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wal_len(db: &std::path::Path) -> u64 {
        std::fs::metadata(db.with_extension("db-wal")).map(|m| m.len()).unwrap_or(0)
    }

    /// A platform database with its own table `t`, written with automatic checkpoints off, as
    /// the server's writer is.
    fn writer_with_table(column: &str) -> (tempfile::TempDir, std::path::PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("platform.db");
        let writer = crate::store::open(&path).unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer.execute_batch(&format!("CREATE TABLE t (x {column})")).unwrap();
        (dir, path, writer)
    }

    #[test]
    fn checkpoint_resets_the_wal_only_past_its_threshold_and_keeps_every_row() {
        let (_dir, path, writer) = writer_with_table("BLOB");
        for _ in 0..200 {
            writer.execute("INSERT INTO t (x) VALUES (zeroblob(2000))", []).unwrap();
        }
        let ckpt = crate::store::open(&path).unwrap();
        let before = wal_len(&path);
        assert!(before > 200 * 2000, "the WAL holds the inserts: {before} bytes");

        // Below the threshold: PASSIVE only, which never shrinks the file.
        let (frames, reset) = checkpoint(&ckpt, i64::MAX).unwrap();
        assert!(frames >= 200, "{frames} frames");
        assert!(!reset);
        assert_eq!(wal_len(&path), before);

        // Past it: the WAL is emptied.
        let (frames_again, reset) = checkpoint(&ckpt, 10).unwrap();
        assert_eq!(frames_again, frames);
        assert!(reset);
        assert_eq!(wal_len(&path), 0);

        // Nothing lost, seen from a connection opened afterwards, and the writer goes on.
        writer.execute("INSERT INTO t (x) VALUES (zeroblob(10))", []).unwrap();
        let reader = crate::store::open(&path).unwrap();
        let n: i64 = reader.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 201);
    }

    #[test]
    fn a_reset_gives_up_while_a_reader_holds_an_older_snapshot() {
        let (_dir, path, writer) = writer_with_table("INTEGER");
        writer.execute("INSERT INTO t (x) VALUES (1)", []).unwrap();
        // A backup's read transaction, on the snapshot before the next write.
        let reader = crate::store::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let n: i64 = reader.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        writer.execute("INSERT INTO t (x) VALUES (2)", []).unwrap();

        let ckpt = crate::store::open(&path).unwrap();
        let started = Instant::now();
        let (_, reset) = checkpoint(&ckpt, 1).unwrap();
        assert!(!reset, "the reader's snapshot is still in the WAL");
        assert!(wal_len(&path) > 0);
        assert!(started.elapsed() < std::time::Duration::from_secs(4), "it gave up instead of waiting on");

        // Once the reader is done, the next round resets it and both rows are there.
        reader.execute_batch("COMMIT").unwrap();
        let (_, reset) = checkpoint(&ckpt, 1).unwrap();
        assert!(reset);
        assert_eq!(wal_len(&path), 0);
        let n: i64 = writer.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2);
    }
}
