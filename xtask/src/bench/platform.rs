//! `cargo xtask bench platform`: N simulated agents heartbeating against the real
//! `gpum-platform` (release build). Goal: 10,000 heartbeats/s at p99 < 50 ms with none lost,
//! which is 100,000 nodes at the default 10 s interval.
//!
//! The server runs with `--insecure-http` on loopback, so the figure is the platform's own cost
//! (HTTP, JSON, SQLite), not TLS; the load generator shares the machine's cores with it, and its
//! CPU time is reported separately. The load is open-loop: each agent has a fixed schedule
//! (phases spread evenly over the interval), and latency is measured from the time a heartbeat
//! was due, not from when it was sent, so a slow server cannot hide its queueing (no
//! coordinated omission). A heartbeat that fails or takes over 5 s is lost.
//!
//! `GPUM_BENCH_NODES` (default 10,000; quick 2,000), `GPUM_BENCH_INTERVAL_MS` (default 1,000)
//! and `GPUM_BENCH_SECS` (default 20; quick 5) change the shape. The offered load is
//! nodes / interval.
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

use crate::util::{percentile, workspace_root};

const MAX_IN_FLIGHT: usize = 256;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn run(quick: bool) -> Result<()> {
    let nodes = env_u64("GPUM_BENCH_NODES", if quick { 2_000 } else { 10_000 });
    let interval = Duration::from_millis(env_u64("GPUM_BENCH_INTERVAL_MS", 1_000));
    let secs = env_u64("GPUM_BENCH_SECS", if quick { 5 } else { 20 });

    crate::util::cargo(&["build", "--quiet", "--release", "-p", "gpum-platform"])?;
    let root = workspace_root();
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let exe = target.join("release/gpum-platform");

    let dir = std::env::temp_dir().join(format!("gpum-bench-platform-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let res = bench(&exe, &dir, nodes, interval, secs);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(exe: &Path, dir: &Path, token: &str) -> Result<Server> {
    use std::io::BufRead;
    std::fs::write(dir.join("admin-token"), token)?;
    let mut child = Command::new(exe)
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http"])
        .arg("--db")
        .arg(dir.join("bench.db"))
        .arg("--admin-token-file")
        .arg(dir.join("admin-token"))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("server.log"))?)
        .spawn()
        .context("start gpum-platform")?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let Some(url) = line.trim().strip_prefix("gpum-platform listening on ") else {
        bail!("gpum-platform did not start: {line:?}");
    };
    Ok(Server { url: url.to_owned(), child })
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

fn bench(exe: &Path, dir: &Path, nodes: u64, interval: Duration, secs: u64) -> Result<()> {
    let token = "b".repeat(64);
    let server = start(exe, dir, &token)?;
    let pid = server.child.id().to_string();
    let url = server.url.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let out = rt.block_on(load(&url, &token, nodes, interval, secs, &pid))?;
    // SIGTERM, so the server logs where its database time went.
    let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
    let mut server = server;
    let _ = server.child.wait();
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let db_line = log.lines().find(|l| l.contains("database:")).map(|l| l.trim().to_owned());
    println!("{out}");
    if let Some(l) = db_line {
        let l = l.split_once("database:").map(|x| x.1).unwrap_or(&l).trim();
        println!("  server database thread (whole run, incl. registration): {l}");
    }
    println!(
        "  command: GPUM_BENCH_NODES={nodes} GPUM_BENCH_INTERVAL_MS={} GPUM_BENCH_SECS={secs} cargo xtask bench platform",
        interval.as_millis()
    );
    Ok(())
}

async fn load(
    url: &str,
    admin: &str,
    nodes: u64,
    interval: Duration,
    secs: u64,
    pid: &str,
) -> Result<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(MAX_IN_FLIGHT)
        .http1_only()
        .build()?;

    // Register every node (not measured).
    let reg_started = Instant::now();
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
    let reg_secs = reg_started.elapsed().as_secs_f64();

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
    let end = start + Duration::from_secs(secs);
    let (cpu_srv0, cpu_me0) = (cpu_secs(pid), cpu_secs("self"));
    let mut tasks = Vec::new();
    for (i, (token, hash)) in agents.into_iter().enumerate() {
        let phase = interval.mul_f64(i as f64 / nodes as f64);
        let (c, url) = (client.clone(), format!("{url}{PATH_HEARTBEAT}"));
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
                let Ok(_permit) = in_flight.acquire().await else { break };
                let r = c.post(&url).bearer_auth(&token).json(&body).send().await;
                let good = match r {
                    Ok(resp) if resp.status().is_success() => resp.bytes().await.is_ok(),
                    _ => false,
                };
                last_done
                    .fetch_max((tokio::time::Instant::now() - start).as_micros() as u64, Ordering::Relaxed);
                if good {
                    ok.fetch_add(1, Ordering::Relaxed);
                    let ms = due.elapsed().as_secs_f64() * 1000.0;
                    lat.lock().expect("latency lock").push(ms);
                } else {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    // The due times span `secs`; a server that falls behind stretches the window.
    let (cpu_srv, cpu_me) = (cpu_secs(pid) - cpu_srv0, cpu_secs("self") - cpu_me0);
    let cpu_wall = (tokio::time::Instant::now() - start).as_secs_f64();
    let wall = (last_done.load(Ordering::Relaxed) as f64 / 1e6).max(secs as f64);
    let ok = ok.load(Ordering::Relaxed);
    let lost = lost.load(Ordering::Relaxed);
    let mut v = std::mem::take(&mut *lat.lock().expect("latency lock"));
    if v.is_empty() {
        bail!("no heartbeat succeeded ({lost} lost)");
    }
    let (p50, p99, max) = (percentile(&mut v, 50.0), percentile(&mut v, 99.0), percentile(&mut v, 100.0));
    let offered = nodes as f64 / interval.as_secs_f64();
    Ok(format!(
        "  {nodes} agents every {:?} (offered {offered:.0} heartbeats/s) for {secs} s, plain HTTP on loopback:\n  \
         achieved {:.0} heartbeats/s; latency from due time p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.1} ms; \
         lost {lost} of {}\n  CPU over the run: server {:.2} cores, load generator {:.2} cores (of {} on this machine)\n  \
         registration of {nodes} nodes (join code + register each): {reg_secs:.1} s",
        interval,
        ok as f64 / wall,
        ok + lost,
        cpu_srv / cpu_wall,
        cpu_me / cpu_wall,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    ))
}
