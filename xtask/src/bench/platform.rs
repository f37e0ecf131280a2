//! `cargo xtask bench platform`: N simulated agents heartbeating against the real
//! `gpum-platform` (release build), and in the same run against a baseline: the least a
//! heartbeat endpoint can do (`platform/examples/bench_baseline.rs`: it parses the same JSON and
//! answers a fixed body, on the platform's own accept loop). Same harness, client, bodies and
//! keep-alive for both; over plain HTTP and over TLS (one certificate for both servers).
//! Goals: p99 < 50 ms at 10,000 heartbeats/s with none lost (100,000 nodes at the default
//! 10 s interval), and server CPU per heartbeat at most 3x the baseline's.
//!
//! The load generator shares the machine's cores with the server; its CPU time is reported
//! separately. The load is open-loop: each agent has a fixed schedule (phases spread evenly over
//! the interval), and latency is measured from the time a heartbeat was due, not from when it
//! was sent, so a slow server cannot hide its queueing (no coordinated omission). A heartbeat
//! that fails or takes over 5 s is lost. Server CPU is utime + stime from `/proc/<pid>/stat`
//! over the load window, divided by the heartbeats answered.
//!
//! Each load run begins with a warm-up at the same schedule, sent but not counted
//! (`GPUM_BENCH_WARMUP_SECS`, default 2, quick 1, and at least one interval): there the client
//! opens its connections (a TLS handshake each) and each node's first heartbeat fills its row.
//! Agents keep their connection for months, so the figure is the steady state. A heartbeat lost during the warm-up
//! still counts as lost. The machine's steal time (CPU the hypervisor gave to others) over the
//! measured window is reported beside each run: on a shared machine it moves both servers' tails.
//!
//! `GPUM_BENCH_NODES` (default 10,000; quick 2,000), `GPUM_BENCH_INTERVAL_MS` (default 1,000)
//! and `GPUM_BENCH_SECS` (default 20; quick 5) change the shape. The offered load is
//! nodes / interval.
//!
//! `--db postgres` (issue 35) runs the same load over plain HTTP (TLS costs the same whatever the
//! database) five times: the platform on SQLite (the same run's reference), the baseline, the
//! platform on PostgreSQL with one replica and one connection (`--db-connections 1`), with one
//! replica as `serve` starts by default (two connections), and with two replicas (two `serve`
//! processes on one database; each node's heartbeats go to them in turn). Each node set is registered first through a
//! platform process of its own, and every measured platform is a fresh process, so that the
//! database line of its log covers its own run. PostgreSQL is a private cluster that the bench
//! starts (`initdb` from Debian's `postgresql` package into the bench's temp directory, as the
//! `postgres` user when run as root; unix socket only) and stops at the end, error or not. It
//! keeps PostgreSQL's default durability (`fsync`, `synchronous_commit` on), because what is
//! measured is the platform's promise that an answer means durable. Server CPU is the replicas'
//! sum; PostgreSQL's CPU (every process of the cluster, exited backends included through the
//! postmaster's `cutime`) is reported apart, and both against SQLite's. Goals: the offered
//! 10,000 heartbeats/s answered (at least 99% of the offered rate over the window), p99 < 50 ms,
//! none lost, with one and with two replicas. `--quick` gives 2,000 nodes for 5 s.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpum_protocol::{
    GpuMetrics, GpuPublic, Health, HeartbeatRequest, Inventory, JoinCodeCreated, Metrics, NvmlState,
    PATH_ADMIN_JOIN_CODES, PATH_HEARTBEAT, PATH_REGISTER, RegisterRequest, RegisterResponse,
};
use tokio::sync::Semaphore;

use super::{Row, say};
use crate::util::percentile;

const MAX_IN_FLIGHT: usize = 256;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `--db`: `sqlite` (the default) or `postgres` (see [`run_postgres`]).
static DB: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn set_db(db: &str) -> Result<()> {
    if !["sqlite", "postgres"].contains(&db) {
        bail!("--db {db}: expected sqlite or postgres");
    }
    let _ = DB.set(db.to_owned());
    Ok(())
}

/// The release `gpum-platform` and the baseline server, built; their directory.
pub(super) fn release_platform() -> Result<PathBuf> {
    crate::util::release_build(&[
        "--locked",
        "-p",
        "gpum-platform",
        "--bin",
        "gpum-platform",
        "--example",
        "bench_baseline",
    ])
}

pub fn run(quick: bool) -> Result<Vec<Row>> {
    if DB.get().is_some_and(|d| d == "postgres") {
        return run_postgres(quick);
    }
    let shape = shape(quick);
    let Shape { nodes, interval, secs, warmup } = shape;
    let release = release_platform()?;
    let exe = release.join("gpum-platform");
    let baseline = release.join("examples/bench_baseline");

    let dir = std::env::temp_dir().join(format!("gpum-bench-platform-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let res = bench(&exe, &baseline, &dir, shape);
    let _ = std::fs::remove_dir_all(&dir);
    let runs = res?;
    say!(
        "  command: GPUM_BENCH_NODES={nodes} GPUM_BENCH_INTERVAL_MS={} GPUM_BENCH_SECS={secs} GPUM_BENCH_WARMUP_SECS={} cargo xtask bench platform",
        interval.as_millis(),
        warmup.as_secs()
    );
    let mut rows = Vec::new();
    for tls in [false, true] {
        let over = if tls { "TLS" } else { "HTTP" };
        let find = |server: &str| runs.iter().find(|r| r.tls == tls && r.server == server).map(|r| &r.stats);
        let (Some(p), Some(b)) = (find("platform"), find("baseline")) else { continue };
        let footprint =
            runs.iter().find(|r| r.tls == tls && r.server == "platform").and_then(|r| r.footprint);
        let rate = nodes as f64 / interval.as_secs_f64();
        rows.push(
            Row::at_most(&format!("platform {over}: p99 at {rate:.0}/s"), p.p99, "ms", 50.0, true)
                .with_reference(format!("baseline p99 {:.2} ms", b.p99)),
        );
        rows.push(Row::info(&format!("platform {over}: p50"), p.p50, "ms"));
        rows.push(Row::info(&format!("platform {over}: max"), p.max, "ms"));
        rows.push(Row::at_most(&format!("platform {over}: heartbeats lost"), p.lost as f64, "", 0.0, false));
        rows.push(Row::info(&format!("platform {over}: server CPU per heartbeat"), p.cpu_us, "us"));
        rows.push(
            Row::at_most(
                &format!("platform {over}: CPU ratio to baseline"),
                p.cpu_us / b.cpu_us,
                "x",
                3.0,
                false,
            )
            .with_reference(format!("baseline {:.1} us/heartbeat", b.cpu_us)),
        );
        if let Some((rss, db, growth, wal)) = footprint {
            rows.push(Row::info(&format!("platform {over}: server RSS ({nodes} nodes)"), rss, "MiB"));
            rows.push(Row::info(&format!("platform {over}: database file"), db, "MiB"));
            rows.push(Row::info(&format!("platform {over}: database growth per day"), growth, "MiB"));
            rows.push(Row::info(&format!("platform {over}: write-ahead log"), wal, "MiB"));
        }
    }
    Ok(rows)
}

struct Server {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// SIGTERM, then the line of the log that says where the database time went.
    fn stop(mut self) -> Option<String> {
        let _ = Command::new("kill").arg("-TERM").arg(self.pid()).status();
        let _ = self.child.wait();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().find_map(|l| l.split_once("database:").map(|x| x.1.trim().to_owned()))
    }
}

/// Starts `exe args...`, whose first line of output ends with its URL.
fn start(exe: &Path, args: &[&std::ffi::OsStr], log: PathBuf) -> Result<Server> {
    use std::io::BufRead;
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("start {}", exe.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let url = line.trim().rsplit(' ').next().unwrap_or("").to_owned();
    if !url.starts_with("http") {
        let _ = child.kill();
        bail!("{} did not start: {line:?}", exe.display());
    }
    Ok(Server { url, child, log })
}

/// The platform on the SQLite file `dir/bench.db`, over TLS with `certs` (a directory with
/// cert.pem and key.pem) or plain HTTP.
fn start_platform(exe: &Path, dir: &Path, certs: Option<&Path>) -> Result<Server> {
    let log = dir.join(if certs.is_some() { "server-tls.log" } else { "server.log" });
    start_platform_on(exe, dir, dir.join("bench.db").as_os_str(), certs, &[], log)
}

/// The platform on database `db` (what `--db` takes), with `extra` arguments to `serve`, its
/// stderr in `log`.
fn start_platform_on(
    exe: &Path,
    dir: &Path,
    db: &std::ffi::OsStr,
    certs: Option<&Path>,
    extra: &[&std::ffi::OsStr],
    log: PathBuf,
) -> Result<Server> {
    let token = dir.join("admin-token");
    let mut args: Vec<std::ffi::OsString> = vec!["serve".into(), "--listen".into(), "127.0.0.1:0".into()];
    args.extend(extra.iter().map(|a| a.to_os_string()));
    match certs {
        Some(c) => args.extend([
            "--tls-cert".into(),
            c.join("cert.pem").into(),
            "--tls-key".into(),
            c.join("key.pem").into(),
        ]),
        None => args.push("--insecure-http".into()),
    }
    args.extend(["--db".into(), db.into(), "--admin-token-file".into(), token.into()]);
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    start(exe, &refs, log)
}

fn start_baseline(exe: &Path, dir: &Path, certs: Option<&Path>) -> Result<Server> {
    let mut args: Vec<std::ffi::OsString> = vec!["serve".into()];
    if let Some(c) = certs {
        args.extend([
            "--tls-cert".into(),
            c.join("cert.pem").into(),
            "--tls-key".into(),
            c.join("key.pem").into(),
        ]);
    }
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    start(exe, &refs, dir.join("baseline.log"))
}

/// What one load run measured.
#[derive(Debug, Clone)]
pub struct Stats {
    pub ok: u64,
    pub lost: u64,
    pub achieved: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// Server CPU (utime + stime) per answered heartbeat, in microseconds.
    pub cpu_us: f64,
    /// Cores the server and the load generator used over the run.
    pub server_cores: f64,
    pub generator_cores: f64,
    /// The machine's steal time over the measured window, percent of all CPU time.
    pub steal_pct: f64,
    /// The bench database's file and WAL sizes when the measured window began.
    pub db_at_start: (u64, u64),
    /// PostgreSQL's CPU (all the bench cluster's processes) per answered heartbeat, in
    /// microseconds, and the cores it used; zero on SQLite.
    pub db_cpu_us: f64,
    pub db_cores: f64,
}

impl Stats {
    /// One run's figures in a line; with `postgres`, PostgreSQL's CPU too.
    fn line(&self, postgres: bool) -> String {
        let pg = if postgres {
            format!(", PostgreSQL {:.1} us ({:.2} cores)", self.db_cpu_us, self.db_cores)
        } else {
            String::new()
        };
        format!(
            "achieved {:.0} heartbeats/s; latency from due time p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms; \
             lost {} of {}; server CPU {:.1} us per heartbeat ({:.2} cores){pg}, load generator {:.2} cores; \
             steal {:.1}%",
            self.achieved,
            self.p50,
            self.p99,
            self.max,
            self.lost,
            self.ok + self.lost,
            self.cpu_us,
            self.server_cores,
            self.generator_cores,
            self.steal_pct
        )
    }
}

/// The load's shape: who heartbeats, how often, for how long after how long a warm-up.
#[derive(Debug, Clone, Copy)]
struct Shape {
    nodes: u64,
    interval: Duration,
    secs: u64,
    warmup: Duration,
}

/// One row of the bench's results: which server, over what, and what it measured.
#[derive(Debug, Clone)]
pub struct Run {
    pub server: &'static str,
    pub tls: bool,
    pub stats: Stats,
    /// The platform's RSS at the end of the load, its database file's size (MiB), that file's
    /// growth per day, and its write-ahead log's size (MiB).
    pub footprint: Option<(f64, f64, f64, f64)>,
}

/// The bench database's file and write-ahead log sizes, in bytes.
fn db_bytes(dir: &Path) -> (u64, u64) {
    let len = |f: &str| std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0);
    (len("bench.db"), len("bench.db-wal"))
}

/// `VmRSS` of a process, in KiB (0 when unreadable).
fn rss_kib(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The machine's (steal, total) CPU time so far, in clock ticks, from `/proc/stat`.
fn steal_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = s
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|l| l.split_whitespace().filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_default();
    // user nice system idle iowait irq softirq steal (guest time is within user already).
    (f.get(7).copied().unwrap_or(0), f.iter().take(8).sum())
}

/// utime + stime of a process, in seconds (clock ticks at the usual 100 Hz).
fn cpu_secs(pid: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn inventory(i: u64) -> Inventory {
    let mut inv = Inventory::default();
    inv.public.gpus = vec![GpuPublic { model: "Tesla T4".into(), vram_mib: 15360 }];
    inv.public.cpu_model = "AMD EPYC 7B12".into();
    inv.public.cpu_cores = 8;
    inv.public.ram_mib = 64_000;
    inv.public.disk_gib = 180;
    inv.private.hostname = format!("bench-{i}");
    inv.private.gpu_uuids = vec![format!("GPU-bench-{i:08}")];
    inv.private.os = "Ubuntu 22.04.4 LTS".into();
    inv.private.kernel = "5.15.0-105-generic".into();
    inv
}

fn client(ca: Option<&Path>) -> Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(MAX_IN_FLIGHT)
        .http1_only();
    if let Some(ca) = ca {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca)?)?);
    }
    Ok(b.build()?)
}

fn bench(exe: &Path, baseline: &Path, dir: &Path, shape: Shape) -> Result<Vec<Run>> {
    let Shape { nodes, interval, secs, warmup } = shape;
    // Random-looking, as `serve` requires of an admin token (a loopback bench needs no secret).
    let token = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".to_owned();
    std::fs::write(dir.join("admin-token"), &token)?;
    let certs = dir.join("certs");
    let st = Command::new(baseline).arg("cert").arg(&certs).status()?;
    if !st.success() {
        bail!("bench_baseline cert failed");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let describe = |tls: bool| {
        format!(
            "{nodes} agents every {interval:?} (offered {:.0} heartbeats/s) for {secs} s after {} s of warm-up, {} on loopback, keep-alive",
            nodes as f64 / interval.as_secs_f64(),
            warmup.as_secs(),
            if tls { "TLS" } else { "plain HTTP" }
        )
    };

    // Register every node once, over plain HTTP (not measured); both transports use them.
    let server = start_platform(exe, dir, None)?;
    let reg_started = Instant::now();
    let agents = rt.block_on(register_all(&client(None)?, &server.url, &token, nodes))?;
    let reg_secs = reg_started.elapsed().as_secs_f64();
    say!("  registration of {nodes} nodes (join code + register each): {reg_secs:.1} s");

    let mut rows = Vec::new();
    let mut plain = Some(server);
    for tls in [false, true] {
        let c = client(tls.then(|| certs.join("ca.pem")).as_deref())?;
        let server = match plain.take() {
            Some(s) => s,
            None => start_platform(exe, dir, Some(&certs))?,
        };
        let p = rt.block_on(load(&c, &Target::one(&server), &agents, shape, dir))?;
        let db0 = p.db_at_start;
        let rss = rss_kib(&server.pid());
        let db1 = db_bytes(dir);
        let db_line = server.stop();
        // The baseline gets the same bodies and tokens; it checks only that a token is there.
        let b = start_baseline(baseline, dir, tls.then_some(certs.as_path()))?;
        let bs = rt.block_on(load(&c, &Target::one(&b), &agents, shape, dir))?;
        b.stop();
        say!("  {}:", describe(tls));
        for (name, st) in [("platform", &p), ("baseline", &bs)] {
            say!("    {name}: {}", st.line(false));
        }
        let ratio = p.cpu_us / bs.cpu_us;
        say!(
            "    server CPU per heartbeat: {ratio:.2}x the baseline's; goal <= 3x: {}; p99 goal < 50 ms: {}",
            if ratio <= 3.0 {
                "met".to_owned()
            } else {
                format!("MISSED by {:.0}%", (ratio / 3.0 - 1.0) * 100.0)
            },
            if p.p99 < 50.0 && p.lost == 0 {
                "met".to_owned()
            } else {
                format!("MISSED (p99 {:.1} ms, lost {})", p.p99, p.lost)
            }
        );
        // The database file's growth over the load window, extrapolated to a day of heartbeats
        // at this rate; the WAL apart (it is reused after each checkpoint, or should be).
        let mib = |b: u64| b as f64 / 1048576.0;
        let growth_day = (mib(db1.0) - mib(db0.0)) / secs as f64 * 86_400.0;
        say!(
            "    platform database: file {:.1} MiB after the run ({:+.2} MiB over it: {:+.0} MiB per day of heartbeats \
             at this rate), WAL {:.1} MiB; server RSS {:.1} MiB",
            mib(db1.0),
            mib(db1.0) - mib(db0.0),
            growth_day,
            mib(db1.1),
            rss as f64 / 1024.0
        );
        if let Some(l) = db_line {
            say!("    platform database thread (whole run): {l}");
        }
        let footprint = (rss as f64 / 1024.0, mib(db1.0), growth_day, mib(db1.1));
        rows.push(Run { server: "platform", tls, stats: p, footprint: Some(footprint) });
        rows.push(Run { server: "baseline", tls, stats: bs, footprint: None });
    }
    Ok(rows)
}

/// Registers `nodes` nodes through the admin and register API; returns each one's token and
/// inventory hash.
async fn register_all(
    client: &reqwest::Client,
    url: &str,
    admin: &str,
    nodes: u64,
) -> Result<Vec<(String, String)>> {
    let sem = Arc::new(Semaphore::new(64));
    let mut handles = Vec::new();
    for i in 0..nodes {
        let (c, url, admin, sem) = (client.clone(), url.to_owned(), admin.to_owned(), sem.clone());
        handles.push(tokio::spawn(async move {
            let _p = sem.acquire().await?;
            let code: JoinCodeCreated = c
                .post(format!("{url}{PATH_ADMIN_JOIN_CODES}"))
                .bearer_auth(&admin)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let req = RegisterRequest {
                join_code: code.code,
                agent_version: "bench".into(),
                inventory: inventory(i),
                install_id: None,
            };
            let r: RegisterResponse = c
                .post(format!("{url}{PATH_REGISTER}"))
                .json(&req)
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok((r.node_token, req.inventory.hash()))
        }));
    }
    let mut agents = Vec::with_capacity(nodes as usize);
    for h in handles {
        agents.push(h.await??);
    }
    Ok(agents)
}

/// Where one load run sends its heartbeats and whose CPU it counts.
struct Target<'a> {
    /// The servers' URLs; each node's heartbeats go to them in turn.
    urls: Vec<String>,
    /// The servers' process ids (their CPU is summed).
    pids: Vec<String>,
    /// The PostgreSQL cluster the servers use, if any (its processes' CPU is counted apart).
    pg: Option<&'a PgCluster>,
}

impl<'a> Target<'a> {
    fn one(s: &Server) -> Target<'a> {
        Target { urls: vec![s.url.clone()], pids: vec![s.pid()], pg: None }
    }

    fn replicas(servers: &[&Server], pg: &'a PgCluster) -> Target<'a> {
        Target {
            urls: servers.iter().map(|s| s.url.clone()).collect(),
            pids: servers.iter().map(|s| s.pid()).collect(),
            pg: Some(pg),
        }
    }

    fn server_cpu(&self) -> f64 {
        self.pids.iter().map(|p| cpu_secs(p)).sum()
    }

    fn db_cpu(&self) -> f64 {
        self.pg.map(|c| c.cpu_secs()).unwrap_or(0.0)
    }
}

async fn load(
    client: &reqwest::Client,
    target: &Target<'_>,
    agents: &[(String, String)],
    shape: Shape,
    dir: &Path,
) -> Result<Stats> {
    let Shape { interval, secs, warmup, .. } = shape;
    let nodes = agents.len() as u64;
    // Heartbeat on schedule.
    let ok = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    // Microseconds from `start` to the last completion: the throughput's denominator.
    let last_done = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::<f64>::with_capacity(
        (nodes * secs * 1000 / interval.as_millis().max(1) as u64) as usize,
    )));
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    // Heartbeats due before `measured` are the warm-up.
    let measured = start + warmup;
    let end = measured + Duration::from_secs(secs);
    let window_start = async {
        tokio::time::sleep_until(measured).await;
        (target.server_cpu(), target.db_cpu(), cpu_secs("self"), steal_ticks(), db_bytes(dir))
    };
    let urls: Arc<Vec<String>> =
        Arc::new(target.urls.iter().map(|u| format!("{u}{PATH_HEARTBEAT}")).collect());
    let mut tasks = Vec::new();
    for (i, (token, hash)) in agents.iter().cloned().enumerate() {
        let phase = interval.mul_f64(i as f64 / nodes as f64);
        let (c, urls) = (client.clone(), urls.clone());
        let (ok, lost, lat, in_flight) = (ok.clone(), lost.clone(), lat.clone(), in_flight.clone());
        let last_done = last_done.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(start + phase, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            // One body per agent; only `seq` changes between beats.
            let mut body = HeartbeatRequest {
                inventory_hash: hash,
                inventory: None,
                metrics: Metrics {
                    cpu_load_pct: 3.5,
                    ram_used_mib: 5_200,
                    ram_total_mib: 64_000,
                    disk_free_gib: 180,
                    gpus: vec![GpuMetrics {
                        index: 0,
                        util_pct: 0,
                        mem_used_mib: 0,
                        mem_total_mib: 15_360,
                        temp_c: 34,
                        power_w: 9.8,
                    }],
                },
                health: Health {
                    docker_ok: true,
                    docker_error: None,
                    nvml: NvmlState::Ok,
                    clock_skew_secs: None,
                },
                ..Default::default()
            };
            loop {
                let due = tick.tick().await;
                if due >= end {
                    break;
                }
                body.seq += 1;
                // With replicas, a node's heartbeats alternate between them.
                let url = &urls[(i + body.seq as usize) % urls.len()];
                let Ok(_permit) = in_flight.acquire().await else { break };
                let r = c.post(url).bearer_auth(&token).json(&body).send().await;
                let good = match r {
                    Ok(resp) if resp.status().is_success() => resp.bytes().await.is_ok(),
                    _ => false,
                };
                last_done.fetch_max(
                    (tokio::time::Instant::now() - measured).as_micros() as u64,
                    Ordering::Relaxed,
                );
                if good && due < measured {
                    // The warm-up: sent, not counted.
                } else if good {
                    ok.fetch_add(1, Ordering::Relaxed);
                    let ms = due.elapsed().as_secs_f64() * 1000.0;
                    lat.lock().expect("latency lock").push(ms);
                } else {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let ((cpu_srv0, cpu_db0, cpu_me0, (steal0, total0), db_at_start), joined) =
        tokio::join!(window_start, async {
            for t in tasks {
                t.await?;
            }
            anyhow::Ok(())
        });
    joined?;
    // The due times span `secs`; a server that falls behind stretches the window.
    let (steal1, total1) = steal_ticks();
    let (cpu_srv, cpu_db, cpu_me) =
        (target.server_cpu() - cpu_srv0, target.db_cpu() - cpu_db0, cpu_secs("self") - cpu_me0);
    let wall = (last_done.load(Ordering::Relaxed) as f64 / 1e6).max(secs as f64);
    let ok = ok.load(Ordering::Relaxed);
    let lost = lost.load(Ordering::Relaxed);
    let mut v = std::mem::take(&mut *lat.lock().expect("latency lock"));
    if v.is_empty() {
        bail!("no heartbeat succeeded ({lost} lost)");
    }
    let (p50, p99, max) = (percentile(&mut v, 50.0), percentile(&mut v, 99.0), percentile(&mut v, 100.0));
    Ok(Stats {
        ok,
        lost,
        achieved: ok as f64 / wall,
        p50,
        p99,
        max,
        cpu_us: cpu_srv / ok.max(1) as f64 * 1e6,
        // Over the load, not the wait for each agent's tick after the end (up to an interval).
        server_cores: cpu_srv / wall,
        generator_cores: cpu_me / wall,
        steal_pct: (steal1 - steal0) as f64 / (total1 - total0).max(1) as f64 * 100.0,
        db_at_start,
        db_cpu_us: cpu_db / ok.max(1) as f64 * 1e6,
        db_cores: cpu_db / wall,
    })
}

/// `--db postgres`: the same load, over plain HTTP, against the SQLite platform (the same run's
/// reference), the baseline, and the platform on PostgreSQL ([`bench_postgres`]).
pub fn run_postgres(quick: bool) -> Result<Vec<Row>> {
    let shape = shape(quick);
    let Shape { nodes, interval, secs, warmup } = shape;
    let release = release_platform()?;
    let dir = std::env::temp_dir().join(format!("gpum-bench-platform-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let res =
        bench_postgres(&release.join("gpum-platform"), &release.join("examples/bench_baseline"), &dir, shape);
    // The cluster is stopped by now (`PgCluster`'s drop), whatever happened.
    let _ = std::fs::remove_dir_all(&dir);
    let runs = res?;
    say!(
        "  command: GPUM_BENCH_NODES={nodes} GPUM_BENCH_INTERVAL_MS={} GPUM_BENCH_SECS={secs} GPUM_BENCH_WARMUP_SECS={} cargo xtask bench platform --db postgres",
        interval.as_millis(),
        warmup.as_secs()
    );
    let rate = nodes as f64 / interval.as_secs_f64();
    let find = |name: &str| runs.iter().find(|r| r.0 == name).map(|r| &r.1);
    let find_db = |name: &str| runs.iter().find(|r| r.0 == name).map(|r| r.2).unwrap_or_default();
    let (Some(sq), Some(base)) = (find("sqlite"), find("baseline")) else {
        bail!("the SQLite runs are missing")
    };
    let mut rows = Vec::new();
    for (name, st, db) in &runs {
        if *name == "baseline" {
            continue;
        }
        let per_hb = st.cpu_us + st.db_cpu_us;
        // The one-connection run shows what the second database thread adds; the goal is the
        // platform as it starts by default.
        let goal = !name.ends_with("1 connection");
        let achieved = format!("{name}: heartbeats/s answered");
        rows.push(
            if goal {
                Row::at_least(&achieved, st.achieved, "/s", rate * 0.99)
            } else {
                Row::info(&achieved, st.achieved, "/s")
            }
            .with_reference(format!("offered {rate:.0}/s")),
        );
        let r = if goal {
            Row::at_most(&format!("{name}: p99"), st.p99, "ms", 50.0, true)
        } else {
            Row::info(&format!("{name}: p99"), st.p99, "ms")
        };
        rows.push(if *name == "sqlite" {
            r.with_reference(format!("baseline p99 {:.2} ms", base.p99))
        } else {
            r.with_reference(format!("SQLite p99 {:.2} ms", sq.p99))
        });
        rows.push(Row::info(&format!("{name}: p50"), st.p50, "ms"));
        rows.push(Row::at_most(&format!("{name}: heartbeats lost"), st.lost as f64, "", 0.0, false));
        rows.push(
            Row::info(&format!("{name}: server CPU per heartbeat"), st.cpu_us, "us")
                .with_reference(format!("baseline {:.1} us", base.cpu_us)),
        );
        if *name != "sqlite" {
            rows.push(Row::info(&format!("{name}: PostgreSQL CPU per heartbeat"), st.db_cpu_us, "us"));
            rows.push(
                Row::info(&format!("{name}: all CPU per heartbeat, to SQLite's"), per_hb / sq.cpu_us, "x")
                    .with_reference(format!("SQLite {:.1} us", sq.cpu_us)),
            );
        }
        if db.transactions > 0 {
            let per_tx = |s: f64| s / db.transactions as f64 * 1e3;
            let sq_db = find_db("sqlite");
            let batch = Row::info(
                &format!("{name}: heartbeats per COMMIT"),
                db.ops as f64 / db.transactions as f64,
                "",
            );
            rows.push(if *name == "sqlite" {
                batch
            } else {
                batch.with_reference(format!(
                    "SQLite {:.1}",
                    sq_db.ops as f64 / sq_db.transactions.max(1) as f64
                ))
            });
            rows.push(
                Row::info(&format!("{name}: COMMIT wait per transaction"), per_tx(db.commit_s), "ms")
                    .with_reference(format!("busy {:.2} ms per transaction", per_tx(db.busy_s))),
            );
        }
    }
    Ok(rows)
}

/// The load's shape from the environment (see the module's comment).
fn shape(quick: bool) -> Shape {
    let nodes = env_u64("GPUM_BENCH_NODES", if quick { 2_000 } else { 10_000 });
    let interval = Duration::from_millis(env_u64("GPUM_BENCH_INTERVAL_MS", 1_000));
    let secs = env_u64("GPUM_BENCH_SECS", if quick { 5 } else { 20 });
    // At least one whole interval, so that every node has been heard from once.
    let warmup =
        Duration::from_secs(env_u64("GPUM_BENCH_WARMUP_SECS", if quick { 1 } else { 2 })).max(interval);
    Shape { nodes, interval, secs, warmup }
}

/// The runs of `--db postgres`, in order: SQLite, the baseline, PostgreSQL with one replica and
/// one connection, with one replica, with two. Every platform is a fresh process started after registration, so that the database line
/// of its log (`busy`, `commit`) covers its load run alone.
fn bench_postgres(
    exe: &Path,
    baseline: &Path,
    dir: &Path,
    shape: Shape,
) -> Result<Vec<(&'static str, Stats, DbLine)>> {
    let Shape { nodes, interval, secs, warmup } = shape;
    let token = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    std::fs::write(dir.join("admin-token"), token)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let c = client(None)?;
    say!(
        "  {nodes} agents every {interval:?} (offered {:.0} heartbeats/s) for {secs} s after {} s of warm-up, plain HTTP on loopback, keep-alive",
        nodes as f64 / interval.as_secs_f64(),
        warmup.as_secs()
    );
    let mut runs = Vec::new();
    let report = |name: &str, st: &Stats, lines: &[Option<String>]| -> DbLine {
        say!("    {name}: {}", st.line(true));
        for (i, l) in lines.iter().enumerate() {
            if let Some(l) = l {
                say!("      replica {} database threads (warm-up and load): {l}", i + 1);
            }
        }
        lines.iter().flatten().map(|l| DbLine::parse(l)).fold(DbLine::default(), DbLine::add)
    };

    // SQLite: the same run's reference.
    let sqlite = dir.join("bench.db");
    let reg = start_platform(exe, dir, None)?;
    let t = Instant::now();
    let agents = rt.block_on(register_all(&c, &reg.url, token, nodes))?;
    say!("  SQLite: registration of {nodes} nodes: {:.1} s", t.elapsed().as_secs_f64());
    reg.stop();
    let s = start_platform_on(exe, dir, sqlite.as_os_str(), None, &[], dir.join("sqlite.log"))?;
    let st = rt.block_on(load(&c, &Target::one(&s), &agents, shape, dir))?;
    let db = report("sqlite", &st, &[s.stop()]);
    runs.push(("sqlite", st, db));

    let b = start_baseline(baseline, dir, None)?;
    let st = rt.block_on(load(&c, &Target::one(&b), &agents, shape, dir))?;
    b.stop();
    let db = report("baseline", &st, &[]);
    runs.push(("baseline", st, db));

    // PostgreSQL: its own nodes (the same number), registered through one replica.
    let pg = PgCluster::start(&dir.join("pg"))?;
    say!("  PostgreSQL {}: {}", pg.version()?, pg.settings()?);
    let url = std::ffi::OsString::from(pg.url());
    let reg = start_platform_on(exe, dir, &url, None, &[], dir.join("pg-register.log"))?;
    let t = Instant::now();
    let agents = rt.block_on(register_all(&c, &reg.url, token, nodes))?;
    say!("  PostgreSQL: registration of {nodes} nodes: {:.1} s", t.elapsed().as_secs_f64());
    reg.stop();

    // One replica with one connection (one database thread), then as `serve` starts by default
    // (`--db-connections 2`), then two replicas so.
    let one = std::ffi::OsString::from("1");
    let a =
        start_platform_on(exe, dir, &url, None, &["--db-connections".as_ref(), &one], dir.join("pg1c.log"))?;
    let st = rt.block_on(load(&c, &Target::replicas(&[&a], &pg), &agents, shape, dir))?;
    let db = report("postgres, 1 replica, 1 connection", &st, &[a.stop()]);
    runs.push(("postgres, 1 replica, 1 connection", st, db));

    let a = start_platform_on(exe, dir, &url, None, &[], dir.join("pg1.log"))?;
    let st = rt.block_on(load(&c, &Target::replicas(&[&a], &pg), &agents, shape, dir))?;
    let db = report("postgres, 1 replica", &st, &[a.stop()]);
    runs.push(("postgres, 1 replica", st, db));

    let a = start_platform_on(exe, dir, &url, None, &[], dir.join("pg2a.log"))?;
    let b = start_platform_on(exe, dir, &url, None, &[], dir.join("pg2b.log"))?;
    let st = rt.block_on(load(&c, &Target::replicas(&[&a, &b], &pg), &agents, shape, dir))?;
    let db = report("postgres, 2 replicas", &st, &[a.stop(), b.stop()]);
    runs.push(("postgres, 2 replicas", st, db));
    Ok(runs)
}

/// The figures of the platform's database line (`db::Stats::summary`), summed over replicas.
#[derive(Debug, Default, Clone, Copy)]
struct DbLine {
    ops: u64,
    transactions: u64,
    /// Seconds the database thread ran operations and commits; of which in COMMIT.
    busy_s: f64,
    commit_s: f64,
}

impl DbLine {
    /// `N operations in T transactions (…), busy B s, of which commit C s; …`; zeros for what is
    /// not there.
    fn parse(l: &str) -> DbLine {
        let w: Vec<&str> = l.split_whitespace().collect();
        let before = |word: &str| -> f64 {
            w.iter()
                .position(|x| *x == word)
                .and_then(|i| w.get(i.checked_sub(1)?))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        let after = |key: &str| -> f64 {
            l.split_once(key)
                .and_then(|x| x.1.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        DbLine {
            ops: before("operations") as u64,
            transactions: before("transactions") as u64,
            busy_s: after("busy "),
            commit_s: after("of which commit "),
        }
    }

    fn add(self, o: DbLine) -> DbLine {
        DbLine {
            ops: self.ops + o.ops,
            transactions: self.transactions + o.transactions,
            busy_s: self.busy_s + o.busy_s,
            commit_s: self.commit_s + o.commit_s,
        }
    }
}

/// The bench's private PostgreSQL cluster (Debian's `postgresql` package): `initdb` into `dir`,
/// as the `postgres` user when we are root (initdb refuses root), a unix socket in `dir` and no
/// TCP, PostgreSQL's default durability (`fsync` and `synchronous_commit` on: the bench measures
/// the promise the platform makes). Dropping it stops the cluster; the caller removes `dir`.
struct PgCluster {
    dir: PathBuf,
}

/// The superuser `initdb` creates, trusted on the socket (only root and `postgres` reach `dir`).
const PG_USER: &str = "gpum";
const PG_DB: &str = "bench";

impl PgCluster {
    fn start(dir: &Path) -> Result<PgCluster> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        if is_root() {
            pg_run(Command::new("chown").arg("postgres:postgres").arg(dir))?;
        }
        let data = dir.join("data");
        pg_run(pg_command("initdb")?.arg("-D").arg(&data).args([
            "-U",
            PG_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]))?;
        // From here on, dropping the value stops whatever started.
        let c = PgCluster { dir: dir.to_owned() };
        pg_run(
            pg_command("pg_ctl")?
                .arg("start")
                .arg("-w")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("log"))
                .arg("-o")
                .arg(format!("-c listen_addresses='' -k {}", dir.display())),
        )?;
        pg_run(pg_command("createdb")?.arg("-h").arg(dir).args(["-U", PG_USER, PG_DB]))?;
        Ok(c)
    }

    /// What `--db` takes: the bench database over the cluster's socket.
    fn url(&self) -> String {
        let host = self.dir.to_string_lossy().replace('/', "%2F");
        format!("postgres://{PG_USER}@{host}/{PG_DB}")
    }

    fn psql(&self, sql: &str) -> Result<String> {
        let out = pg_command("psql")?
            .arg("-h")
            .arg(&self.dir)
            .args(["-U", PG_USER, "-d", PG_DB, "-XAt", "-F", " ", "-c", sql])
            .output()?;
        if !out.status.success() {
            bail!("psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn version(&self) -> Result<String> {
        self.psql("SHOW server_version")
    }

    /// The settings that decide what a commit costs, as `name=value` pairs.
    fn settings(&self) -> Result<String> {
        let s = self.psql(
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings WHERE name IN \
             ('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', 'shared_buffers', \
             'commit_delay', 'max_connections')",
        )?;
        Ok(s)
    }

    /// utime + stime of every process of the cluster, in seconds: the postmaster, its live
    /// children (backends, WAL writer, checkpointer…), and its children that have exited (the
    /// postmaster's cutime + cstime).
    fn cpu_secs(&self) -> f64 {
        let Some(pm) = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        else {
            return 0.0;
        };
        let mut total = proc_stat(&pm).map(|f| f.utime + f.stime + f.cutime + f.cstime).unwrap_or(0.0);
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            if let Some(f) = proc_stat(&pid).filter(|f| f.ppid == pm) {
                total += f.utime + f.stime;
            }
        }
        total
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Ok(mut c) = pg_command("pg_ctl") {
            let _ = c.args(["stop", "-m", "fast", "-D"]).arg(self.dir.join("data")).output();
        }
    }
}

/// Fields of `/proc/<pid>/stat`: the parent, and the CPU times in seconds.
struct ProcStat {
    ppid: String,
    utime: f64,
    stime: f64,
    cutime: f64,
    cstime: f64,
}

fn proc_stat(pid: &str) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    Some(ProcStat { ppid: f.get(1)?.to_string(), utime: t(11), stime: t(12), cutime: t(13), cstime: t(14) })
}

/// Whether the effective user is root (the second `Uid:` field of `/proc/self/status`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        .unwrap_or(false)
}

/// A program of Debian's PostgreSQL (newest version in `/usr/lib/postgresql/*/bin`, else PATH),
/// run as the `postgres` user when we are root.
fn pg_command(name: &str) -> Result<Command> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.is_file())
        .collect();
    versions.sort();
    let prog = versions.pop().unwrap_or_else(|| PathBuf::from(name));
    Ok(if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(prog);
        c
    } else {
        Command::new(prog)
    })
}

fn pg_run(c: &mut Command) -> Result<()> {
    let out =
        c.output().with_context(|| format!("run {c:?} (is PostgreSQL installed? tests/setup-deps.sh)"))?;
    if !out.status.success() {
        bail!(
            "{c:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::DbLine;

    /// The line as `db::Stats::summary` writes it (after `database:`; captured from a run).
    #[test]
    fn the_database_line_is_read() {
        let l = "600 operations in 599 transactions (mean batch 1.0), busy 2.103 s, of which commit 1.823 s; \
                 WAL restarts 0 (each waited at most 0.0 ms)";
        let d = DbLine::parse(l);
        assert_eq!((d.ops, d.transactions), (600, 599));
        assert!((d.busy_s - 2.103).abs() < 1e-9 && (d.commit_s - 1.823).abs() < 1e-9, "{d:?}");
        assert_eq!(d.add(d).transactions, 1198);
        assert_eq!(DbLine::parse("").transactions, 0);
    }
}
