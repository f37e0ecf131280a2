//! One thread owns the server's database connection and runs every operation, in batches.
//!
//! SQLite allows one writer at a time, and most requests (heartbeats) write. On PostgreSQL the
//! same shape pays for one COMMIT (one WAL flush) per batch instead of one per request. Instead of a pool
//! of connections fighting over the write lock, handlers send closures to this thread. It takes
//! whatever has queued up (up to [`MAX_BATCH`]), runs each inside its own SAVEPOINT within one
//! transaction, commits once, and only then answers the callers: group commit. A failed
//! operation rolls back to its savepoint and leaves the others in the batch alone. Under light
//! load a batch is one operation, so latency stays that of a single transaction. On PostgreSQL
//! the savepoints travel in front of the operations' statements (`sql::Conn::savepoint`), so
//! they add no round trip; if one of them fails, the whole batch fails and nobody is told it
//! was stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use rusqlite::Connection;

use crate::sql::Conn;
use tokio::sync::oneshot;

use crate::error::ApiError;

const MAX_BATCH: usize = 512;

type Reply = Box<dyn FnOnce(bool) + Send>;
type Job = Box<dyn FnOnce(&Conn) -> Reply + Send>;

#[derive(Clone)]
pub struct Db {
    tx: mpsc::Sender<Job>,
    stats: Arc<Stats>,
    /// Set by the checkpoint thread when the WAL should restart; the database thread finishes
    /// the checkpoint between two batches ([`Db::spawn_checkpointer`]).
    restart: Arc<AtomicBool>,
    /// Notified after a batch that recorded effects commits (`effects::applier` waits on it).
    effects: Arc<tokio::sync::Notify>,
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
    /// Checkpoints finished on the database thread, so that the WAL could restart.
    pub restarts: AtomicU64,
    /// The longest attempt at one (finished or not), in nanoseconds: what a request waited for
    /// one at most.
    pub restart_max_ns: AtomicU64,
}

impl Stats {
    pub fn summary(&self) -> String {
        let ops = self.ops.load(Ordering::Relaxed);
        let tx = self.transactions.load(Ordering::Relaxed).max(1);
        format!(
            "database: {ops} operations in {tx} transactions (mean batch {:.1}), busy {:.3} s, of which commit {:.3} s; \
             WAL restarts {} (each waited at most {:.1} ms)",
            ops as f64 / tx as f64,
            self.busy_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.commit_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.restarts.load(Ordering::Relaxed),
            self.restart_max_ns.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

impl Db {
    /// Starts the database thread on an open connection.
    pub fn start(conn: Conn) -> Db {
        Db::start_many(vec![conn])
    }

    /// Starts one database thread per connection, all taking batches from one queue (issue 35:
    /// PostgreSQL, where one connection waits on round trips while the machine has cores left).
    /// Their transactions run side by side, as those of two replicas do, and are correct
    /// together for the same reasons (row locks, conditional updates). SQLite has one writer:
    /// give it one connection.
    pub fn start_many(conns: Vec<Conn>) -> Db {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let stats = Arc::new(Stats::default());
        let restart = Arc::new(AtomicBool::new(false));
        let effects = Arc::new(tokio::sync::Notify::new());
        for (i, conn) in conns.into_iter().enumerate() {
            let (st, rs, rx, fx) = (stats.clone(), restart.clone(), rx.clone(), effects.clone());
            std::thread::Builder::new()
                .name(format!("gpum-db-{i}"))
                .spawn(move || run(conn, &rx, &st, &rs, &fx))
                .expect("spawn the database thread");
        }
        Db { tx, stats, restart, effects }
    }

    /// Starts the checkpoint thread on its own connection `ckpt` to the same database: every
    /// `period` it copies the WAL back into the database file (PASSIVE: nobody waits for it), and
    /// once the WAL holds `restart_frames` frames it has the database thread finish the job.
    ///
    /// Why both: SQLite rewinds the WAL only after a checkpoint that reached its last frame, and
    /// under a steady stream of commits a concurrent checkpoint never does (the WAL grew to
    /// 3.2 GiB in 40 s at 10,000 heartbeats/s, docs/benchmarks.md). The database thread is the
    /// only writer, so its own PASSIVE checkpoint between two batches always reaches the end:
    /// it copies just the frames committed since the big copy (milliseconds' worth), and the
    /// next transaction starts the WAL over. A blocking (TRUNCATE) checkpoint from this thread
    /// did the same but stalled every write for 55 to 110 ms each time, which was the
    /// platform's p99. A reader on an older snapshot (a `backup`) keeps the WAL from restarting
    /// until it is done; nothing waits for it.
    pub fn spawn_checkpointer(
        &self,
        ckpt: Conn,
        period: std::time::Duration,
        restart_frames: i64,
    ) -> std::io::Result<()> {
        if ckpt.sqlite().is_none() {
            return Err(std::io::Error::other("checkpoints are SQLite's"));
        }
        let restart = self.restart.clone();
        std::thread::Builder::new().name("gpum-checkpoint".into()).spawn(move || {
            let Some(ckpt) = ckpt.sqlite() else { return };
            loop {
                std::thread::sleep(period);
                match close_in(ckpt, restart_frames) {
                    Ok(true) => restart.store(true, Ordering::Relaxed),
                    Ok(false) => {}
                    Err(e) => tracing::warn!("database checkpoint: {e}"),
                }
            }
        })?;
        Ok(())
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// What the database threads notify after a batch that recorded effects commits: the
    /// in-process wake-up of `effects::applier` (SQLite's only one; PostgreSQL's `NOTIFY`
    /// reaches the other replicas).
    pub fn effects_written(&self) -> Arc<tokio::sync::Notify> {
        self.effects.clone()
    }

    /// Runs `f` on the database thread inside a transaction; its effects are committed before
    /// this returns `Ok`.
    pub async fn call<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Conn) -> Result<T, ApiError> + Send + 'static,
    {
        let (otx, orx) = oneshot::channel::<Result<T, ApiError>>();
        let job: Job = Box::new(move |conn: &Conn| {
            let r = match conn.savepoint() {
                Ok(()) => {
                    let r = f(conn);
                    match conn.end_savepoint(r.is_ok()) {
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

/// The next batch: waits for one job, then takes whatever else has queued, up to [`MAX_BATCH`].
/// Another database thread waits for the queue meanwhile, and takes what comes after.
fn next_batch(rx: &std::sync::Mutex<mpsc::Receiver<Job>>) -> Option<Vec<Job>> {
    let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
    let mut jobs = vec![rx.recv().ok()?];
    while jobs.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
    Some(jobs)
}

fn run(
    conn: Conn,
    rx: &std::sync::Mutex<mpsc::Receiver<Job>>,
    stats: &Stats,
    restart: &AtomicBool,
    effects: &tokio::sync::Notify,
) {
    while let Some(jobs) = next_batch(rx) {
        let started = Instant::now();
        if let Err(e) = conn.begin_or_reconnect() {
            tracing::error!("database: begin: {}", e.detail());
            for j in jobs {
                // Without a transaction, nothing may run; answer every caller with an error.
                drop(j);
            }
            continue;
        }
        let n = jobs.len() as u64;
        let replies: Vec<Reply> = jobs.into_iter().map(|j| j(&conn)).collect();
        let commit_started = Instant::now();
        let committed = match conn.commit() {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("database: commit: {}", e.detail());
                conn.rollback();
                false
            }
        };
        stats.commit_ns.fetch_add(commit_started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        stats.ops.fetch_add(n, Ordering::Relaxed);
        stats.transactions.fetch_add(1, Ordering::Relaxed);
        // Effects recorded in this batch are in the database now: the applier reads them.
        if crate::effects::take_written() && committed {
            effects.notify_one();
        }
        for r in replies {
            r(committed);
        }
        if restart.swap(false, Ordering::Relaxed)
            && let Some(conn) = conn.sqlite()
        {
            let started = Instant::now();
            let done = checkpoint(conn);
            // Every attempt held the next batch back, a finished one or not.
            stats.restart_max_ns.fetch_max(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match done {
                Ok(w) if w.complete() => {
                    stats.restarts.fetch_add(1, Ordering::Relaxed);
                }
                // A reader on an older snapshot; the next round tries again.
                Ok(_) => {}
                Err(e) => tracing::warn!("database checkpoint: {e}"),
            }
        }
    }
}

/// Frames in the WAL (4 KiB pages: 64 MiB) past which it restarts ([`Db::spawn_checkpointer`]).
pub const WAL_RESTART_FRAMES: i64 = 16_384;

/// What a WAL file over this size is cut back to when it restarts (`journal_size_limit`): twice
/// the restart size, so that cutting (an `ftruncate`, 7 ms, measured) happens only after
/// something held the restart back, such as a long backup, and not at every restart.
pub const WAL_KEEP_BYTES: i64 = 2 * WAL_RESTART_FRAMES * 4096;

/// What a checkpoint found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wal {
    /// Frames in the WAL.
    pub frames: i64,
    /// Of which now copied into the database file.
    pub copied: i64,
}

impl Wal {
    /// Every frame is in the database file: the next write transaction starts the WAL over.
    pub fn complete(&self) -> bool {
        self.copied == self.frames
    }
}

/// The most frames that the checkpoint thread leaves for the database thread to copy, give or
/// take what comes in while it hands over: a few milliseconds of writes.
const HANDOVER_FRAMES: i64 = 256;

/// The checkpoint thread's round: a PASSIVE checkpoint and, once the WAL holds `restart_frames`
/// frames, more of them, each copying what was committed during the one before, until that is
/// at most [`HANDOVER_FRAMES`] (or four passes). Returns whether the database thread should now
/// finish the checkpoint and so restart the WAL.
fn close_in(ckpt: &Connection, restart_frames: i64) -> rusqlite::Result<bool> {
    let mut w = checkpoint(ckpt)?;
    if w.frames < restart_frames {
        return Ok(false);
    }
    for _ in 0..3 {
        let next = checkpoint(ckpt)?;
        let came_in = next.frames - w.frames;
        w = next;
        if came_in <= HANDOVER_FRAMES {
            break;
        }
    }
    Ok(true)
}

/// A PASSIVE checkpoint on `conn`: copies into the database file what no reader still needs,
/// waits for nobody, and fsyncs (the WAL before, the database file after) as SQLite does.
pub fn checkpoint(conn: &Connection) -> rusqlite::Result<Wal> {
    let (busy, frames, copied): (i64, i64, i64) =
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    // Busy: another checkpoint was running; it did the work, or the next round will.
    Ok(if busy != 0 { Wal { frames, copied: 0 } } else { Wal { frames, copied } })
}

/// Makes the database at `path` private before SQLite opens it (issue 29, item 11): the file is
/// created here, mode 0600 whatever the umask, when it does not exist yet, and an existing
/// database, `-wal`, `-shm` or `-journal` that others may read is narrowed to 0600. SQLite gives
/// the `-wal`, `-shm` and `-journal` files it creates later the database file's mode, so they
/// are 0600 too. They hold host names, GPU UUIDs and token hashes.
///
/// Narrowing fails (and so does opening) only where the caller is neither the file's owner nor
/// root, that is, where someone else could read the file: `chmod 600` it as its owner.
pub fn private_files(path: &std::path::Path) -> rusqlite::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    let refuse = |what: &std::path::Path, e: std::io::Error| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!("make {} private (mode 0600): {e}", what.display())),
        )
    };
    // SQLite's in-memory and temporary databases have no file.
    if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
        return Ok(());
    }
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(f) => f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(|e| refuse(path, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refuse(path, e)),
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = std::path::Path::new(&name);
        match std::fs::metadata(file) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| refuse(file, e))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(refuse(file, e)),
        }
    }
    Ok(())
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
    fn writer_with_table(column: &str) -> (tempfile::TempDir, std::path::PathBuf, Conn) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("platform.db");
        let writer = crate::store::open(&path).unwrap();
        writer.sqlite().unwrap().pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer.execute_batch(&format!("CREATE TABLE t (x {column})")).unwrap();
        (dir, path, writer)
    }

    fn mode(p: &std::path::Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Issue 29, item 11: under umask 022 the database, its WAL and its shared memory were 0644.
    /// (The end-to-end test `auth::database_files_are_private` runs the server under umask 022.)
    #[test]
    fn the_database_and_its_wal_and_shm_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("platform.db");
        let c = crate::store::open(&path).unwrap();
        c.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1)").unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let f = dir.path().join(format!("platform.db{suffix}"));
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
        drop(c);
        // A database made readable by others (an older platform's) is narrowed when opened.
        let old = dir.path().join("old.db");
        drop(crate::store::open(&old).unwrap());
        let w = crate::store::open(&old).unwrap();
        w.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1)").unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let f = dir.path().join(format!("old.db{suffix}"));
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let _again = crate::store::open(&old).unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let f = dir.path().join(format!("old.db{suffix}"));
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
    }

    /// Frames in the WAL now, counted from its last restart.
    fn frames(c: &Conn) -> i64 {
        checkpoint(c.sqlite().unwrap()).unwrap().frames
    }

    #[test]
    fn a_checkpoint_that_reaches_the_end_restarts_the_wal_at_the_next_write() {
        let (_dir, path, writer) = writer_with_table("BLOB");
        for _ in 0..200 {
            writer.execute("INSERT INTO t (x) VALUES (zeroblob(2000))", []).unwrap();
        }
        let ckpt = crate::store::open(&path).unwrap();
        let w = checkpoint(ckpt.sqlite().unwrap()).unwrap();
        assert!(w.frames >= 200, "{w:?}");
        assert!(w.complete(), "no writer ran meanwhile: {w:?}");
        writer.execute("INSERT INTO t (x) VALUES (1)", []).unwrap();
        assert!(frames(&ckpt) < 10, "the WAL started over");
        let n: i64 =
            crate::store::open(&path).unwrap().query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 201);
    }

    #[test]
    fn a_reader_on_an_older_snapshot_holds_the_restart_back_without_anyone_waiting() {
        let (_dir, path, writer) = writer_with_table("INTEGER");
        writer.execute("INSERT INTO t (x) VALUES (1)", []).unwrap();
        // A backup's read transaction, on the snapshot before the next writes.
        let reader = crate::store::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let n: i64 = reader.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        for i in 2..=50 {
            writer.execute("INSERT INTO t (x) VALUES (?1)", crate::params![i]).unwrap();
        }

        let started = Instant::now();
        let w = checkpoint(writer.sqlite().unwrap()).unwrap();
        assert!(!w.complete(), "the reader's snapshot is still in the WAL: {w:?}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "a PASSIVE checkpoint waits for nobody"
        );
        writer.execute("INSERT INTO t (x) VALUES (51)", []).unwrap();
        assert!(frames(&writer) > w.frames, "no restart: the WAL grew on");

        // Once the reader is done, the next checkpoint reaches the end and the WAL restarts.
        reader.execute_batch("COMMIT").unwrap();
        assert!(checkpoint(writer.sqlite().unwrap()).unwrap().complete());
        writer.execute("INSERT INTO t (x) VALUES (52)", []).unwrap();
        assert!(frames(&writer) < 5);
        let n: i64 = writer.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 52);
    }

    /// The server's arrangement: a writer that never pauses, a concurrent checkpointer. The WAL
    /// keeps restarting and its file stays bounded, and every write is there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_a_writer_that_never_pauses_the_wal_keeps_restarting() {
        let (_dir, path, writer) = writer_with_table("BLOB");
        writer.sqlite().unwrap().pragma_update(None, "journal_size_limit", 64 * 4096).unwrap();
        let db = Db::start(writer);
        db.spawn_checkpointer(crate::store::open(&path).unwrap(), std::time::Duration::from_millis(20), 64)
            .unwrap();
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move {
                    let mut n = 0u64;
                    let until = Instant::now() + std::time::Duration::from_secs(20);
                    while db.stats().restarts.load(Ordering::Relaxed) < 5 && Instant::now() < until {
                        db.call(|c| Ok(c.execute("INSERT INTO t (x) VALUES (zeroblob(3000))", [])?))
                            .await
                            .unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut written = 0;
        for w in writers {
            written += w.await.unwrap();
        }
        assert!(db.stats().restarts.load(Ordering::Relaxed) >= 5, "{}", db.stats().summary());
        let n: u64 = db.call(|c| Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?)).await.unwrap();
        assert_eq!(n, written);
        // Each insert is at least one 4 KiB frame; without restarts the file holds them all.
        let wal = wal_len(&path);
        assert!(wal < written * 4096 / 2, "WAL {wal} bytes after {written} inserts");
    }

    /// Group commit on both engines: operations sent at once share transactions, each answered
    /// after its batch's COMMIT; one that fails rolls back to its own SAVEPOINT and leaves the
    /// others of its batch in place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    async fn a_batch_commits_together_and_a_failed_operation_changes_nothing() {
        for engine in [crate::sql::Engine::Sqlite, crate::sql::Engine::Postgres] {
            let t = crate::testdb::TestDb::on(engine);
            let db = Db::start(t.open());
            let calls: Vec<_> = (0..200)
                .map(|i| {
                    let db = db.clone();
                    tokio::spawn(async move {
                        db.call(move |c| {
                            let key = format!("k{i}");
                            c.execute(
                                "INSERT INTO settings (key, value) VALUES (?1, 'v')",
                                crate::params![key],
                            )?;
                            if i % 10 == 0 { Err(ApiError::internal()) } else { Ok(()) }
                        })
                        .await
                    })
                })
                .collect();
            for (i, c) in calls.into_iter().enumerate() {
                assert_eq!(c.await.unwrap().is_ok(), i % 10 != 0, "{engine:?} {i}");
            }
            let n: i64 = db
                .call(|c| {
                    Ok(c.query_row("SELECT count(*) FROM settings WHERE key LIKE 'k%'", [], |r| r.get(0))?)
                })
                .await
                .unwrap();
            assert_eq!(n, 180, "{engine:?}");
            let (ops, tx) =
                (db.stats().ops.load(Ordering::Relaxed), db.stats().transactions.load(Ordering::Relaxed));
            assert!(tx < ops, "{engine:?}: {}", db.stats().summary());
        }
    }

    /// The savepoints that travel in front of statements (PostgreSQL): an operation whose
    /// statement fails (a duplicate key) is rolled back alone, in a batch with others and on
    /// several database threads; an operation that swallows a failed statement and says it
    /// succeeded is not believed: on PostgreSQL that failure aborted the transaction, so its
    /// batch fails as a whole and nobody is told anything was stored.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    async fn a_failed_statement_rolls_back_its_operation_alone_and_a_swallowed_one_fails_the_batch() {
        let t = crate::testdb::TestDb::on(crate::sql::Engine::Postgres);
        let db = Db::start_many(vec![t.open(), t.open()]);
        let put = |i: usize| {
            let db = db.clone();
            tokio::spawn(async move {
                db.call(move |c| {
                    c.execute(
                        "INSERT INTO settings (key, value) VALUES (?1, 'v')",
                        crate::params![format!("d{i}")],
                    )?;
                    // Every seventh inserts the same key twice: its second INSERT fails.
                    if i.is_multiple_of(7) {
                        c.execute(
                            "INSERT INTO settings (key, value) VALUES (?1, 'v')",
                            crate::params![format!("d{i}")],
                        )?;
                    }
                    Ok(())
                })
                .await
            })
        };
        let calls: Vec<_> = (0..300).map(put).collect();
        for (i, c) in calls.into_iter().enumerate() {
            assert_eq!(c.await.unwrap().is_ok(), i % 7 != 0, "{i}");
        }
        let keys = |db: Db| async move {
            db.call(|c| {
                Ok(c.prepare_cached("SELECT key FROM settings WHERE key LIKE 'd%' OR key LIKE 's%'")?
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<std::collections::BTreeSet<_>, _>>()?)
            })
            .await
            .unwrap()
        };
        let stored = keys(db.clone()).await;
        let want: std::collections::BTreeSet<_> =
            (0..300).filter(|i| i % 7 != 0).map(|i| format!("d{i}")).collect();
        assert_eq!(stored, want);
        assert!(db.stats().transactions.load(Ordering::Relaxed) < 300, "{}", db.stats().summary());

        // One operation swallows its failed statement; the one beside it in the batch did
        // nothing wrong, but shared the aborted transaction.
        let db1 = Db::start(t.open());
        let swallow = db1.call(|c| {
            c.execute("INSERT INTO settings (key, value) VALUES ('s1', 'v')", [])?;
            let _ = c.execute("INSERT INTO settings (key, value) VALUES ('s1', 'v')", []);
            Ok(())
        });
        let honest = db1.call(|c| Ok(c.execute("INSERT INTO settings (key, value) VALUES ('s2', 'v')", [])?));
        let (a, b) = tokio::join!(swallow, honest);
        assert!(a.is_err(), "the swallowed failure was reported as stored");
        if b.is_ok() {
            // It ran in a batch of its own, after the failed one.
            assert_eq!(db1.stats().transactions.load(Ordering::Relaxed), 2, "{}", db1.stats().summary());
        }
        let stored = keys(db1.clone()).await;
        assert!(!stored.contains("s1"), "{stored:?}");
        assert_eq!(stored.contains("s2"), b.is_ok(), "{stored:?}");
    }

    /// PostgreSQL closed the database thread's connection (a restart, an administrator, a
    /// failover): the next batch connects again instead of failing for ever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    async fn a_closed_postgres_connection_is_opened_again() {
        let t = crate::testdb::TestDb::on(crate::sql::Engine::Postgres);
        let db = Db::start(t.open());
        let put = |k: &'static str| {
            db.call(move |c| {
                Ok(c.execute("INSERT INTO settings (key, value) VALUES (?1, 'v')", crate::params![k])?)
            })
        };
        assert_eq!(put("before").await.unwrap(), 1);
        let crate::testdb::TestDb::Postgres { name } = &t else { unreachable!() };
        crate::testdb::cluster().admin(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ));
        // The backend ends a moment after it is told to; an operation that was running on it
        // then fails (and is answered so), and the one after it runs on a new connection.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        if put("after").await.is_err() {
            assert_eq!(put("after").await.unwrap(), 1, "the next operation runs on a new connection");
        }
        let n: i64 =
            db.call(|c| Ok(c.query_row("SELECT count(*) FROM settings", [], |r| r.get(0))?)).await.unwrap();
        assert_eq!(n, 2);
    }
}
