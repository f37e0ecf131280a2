//! `cargo xtask bench agent`: the running agent's footprint. The shipped build of
//! `gpum-agent run` (`release-small` with its symbol table; `test-knobs` only for the Docker
//! test scope that keeps it to its own containers: `crate::dist::build_measured_agent`) heartbeats at 1 s against the release
//! `gpum-platform` on loopback for 5 minutes (`--quick`: 40 s), through a byte-counting TCP
//! relay, with the real Docker engine when one answers. Then its instructions per steady
//! heartbeat, by phase, under callgrind (see `cost.rs`): the figure that means the same on
//! every machine, which the regression test compares with `docs/benchmarks.md`.
//!
//! Reported: peak RSS (`VmHWM`), steady RSS (median `VmRSS` after a 10 s warm-up), CPU time per
//! heartbeat (the sum of `/proc/<pid>/task/*/schedstat` run time over the steady window, divided
//! by the heartbeats the platform counted), and bytes per steady heartbeat (both directions, HTTP
//! on loopback: TLS adds its record overhead on top). Goals: RSS < 12 MiB, CPU <= 0.3 ms and
//! < 1 KiB per heartbeat. The CPU figure has no same-run reference: it moves with the machine
//! (by 2x and more between shared VMs, docs/benchmarks.md), so the instruction count is the
//! figure to compare across runs.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cost::{agent_register, cli_json};
use super::{Kill, Row, say, spawn_agent};
use crate::util::{docker_answers, median};

pub fn run(quick: bool) -> Result<Vec<Row>> {
    let total = if quick { Duration::from_secs(40) } else { Duration::from_secs(300) };
    let warmup = Duration::from_secs(10);
    let agent = crate::dist::build_measured_agent()?;
    let release = crate::util::release_build(&["--locked", "-p", "gpum-platform"])?;
    let platform = release.join("gpum-platform");

    let dir = std::env::temp_dir().join(format!("gpum-bench-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("platform.db");
    let mut p = Command::new(&platform)
        .arg("--db")
        .arg(&db)
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--heartbeat-interval", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start gpum-platform")?;
    let mut first = String::new();
    BufReader::new(p.stdout.take().expect("stdout")).read_line(&mut first)?;
    let platform_proc = Kill(p);
    let port: u16 = first.trim().rsplit(':').next().and_then(|s| s.parse().ok()).context("platform port")?;

    let relay = Relay::start(port)?;
    let relay_url = format!("http://127.0.0.1:{}", relay.port);
    let code =
        cli_json(&platform, &db, &["join-code", "create"])?["code"].as_str().context("code")?.to_string();
    let state = dir.join("state");
    let docker = docker_answers();
    let socket = if docker { "/var/run/docker.sock" } else { "/nonexistent/docker.sock" };
    agent_register(&agent, &relay_url, &state, socket, &code)?;
    if docker {
        // Only this bench's own (nonexistent) containers: the reconciler sees nothing else.
        let mut cfg = std::fs::read_to_string(state.join("config.toml"))?;
        cfg.push_str(&format!("test_docker_scope = \"gpum.test.bench=b{}\"\n", std::process::id()));
        std::fs::write(state.join("config.toml"), cfg)?;
    }
    let node_id =
        cli_json(&platform, &db, &["nodes", "list"])?["nodes"][0]["id"].as_str().context("node")?.to_string();
    let a = spawn_agent(&agent, &state)?;
    let pid = a.id();
    let mut a = Kill(a);

    let t0 = Instant::now();
    std::thread::sleep(warmup);
    let seq0 = last_seq(&platform, &db, &node_id)?;
    let (cpu0, bytes0) = (cpu_ns(pid)?, relay.bytes.load(Ordering::SeqCst));
    let mut rss = Vec::new();
    while t0.elapsed() < total {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(s) = a.0.try_wait()? {
            bail!("the agent exited during the bench: {s}");
        }
        rss.push(status_kib(pid, "VmRSS")? as f64);
    }
    let seq1 = last_seq(&platform, &db, &node_id)?;
    let (cpu1, bytes1) = (cpu_ns(pid)?, relay.bytes.load(Ordering::SeqCst));
    let peak = status_kib(pid, "VmHWM")?;
    let beats = seq1.saturating_sub(seq0).max(1);
    let steady = median(&mut rss);
    let cpu_ms = (cpu1 - cpu0) as f64 / 1e6 / beats as f64;
    let bytes = (bytes1 - bytes0) as f64 / beats as f64;
    // Both processes go before their directory does, so neither writes into it afterwards.
    drop(a);
    drop(platform_proc);
    let _ = std::fs::remove_dir_all(&dir);

    let mib = |kib: f64| kib / 1024.0;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    say!(
        "command: cargo xtask bench agent{} ({}s at 1 s heartbeats, {} steady heartbeats, docker: {})",
        if quick { " --quick" } else { "" },
        total.as_secs(),
        beats,
        if docker { "real engine" } else { "absent" }
    );
    say!("peak RSS:   {:.2} MiB; goal < 12 MiB: {}", mib(peak as f64), verdict(mib(peak as f64) < 12.0));
    say!("steady RSS: {:.2} MiB (median)", mib(steady));
    say!(
        "CPU:        {cpu_ms:.3} ms per heartbeat; goal <= 0.3 ms: {} (moves with the machine; the \
         instruction count below does not)",
        verdict(cpu_ms <= 0.3)
    );
    say!(
        "bytes:      {bytes:.0} B per steady heartbeat, both directions, plain HTTP; goal < 1 KiB: {}",
        verdict(bytes < 1024.0)
    );
    let cost = super::cost::measure(&agent, &platform, docker)?;
    super::cost::print(&cost);
    let mut rows = vec![
        Row::at_most("agent: peak RSS", mib(peak as f64), "MiB", 12.0, true),
        Row::info("agent: steady RSS (median)", mib(steady), "MiB"),
        Row::at_most("agent: CPU per heartbeat", cpu_ms, "ms", 0.3, false)
            .with_reference("none: moves with the machine"),
        Row::at_most("agent: bytes per heartbeat", bytes, "B", 1024.0, true),
    ];
    rows.extend(super::cost::rows(&cost));
    Ok(rows)
}

fn last_seq(platform: &Path, db: &Path, id: &str) -> Result<u64> {
    let v = cli_json(platform, db, &["nodes", "list"])?;
    let n = v["nodes"].as_array().and_then(|a| a.iter().find(|n| n["id"] == id)).context("node listed")?;
    Ok(n["last_seq"].as_u64().unwrap_or(0))
}

/// CPU time of every thread of `pid`, in nanoseconds (first field of each task's schedstat).
fn cpu_ns(pid: u32) -> Result<u64> {
    let mut sum = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let s = std::fs::read_to_string(t?.path().join("schedstat")).unwrap_or_default();
        sum += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(sum)
}

fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.trim_start_matches(':').trim().strip_suffix("kB")))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("{key} in /proc/{pid}/status"))
}

/// A loopback TCP relay that counts every byte in both directions.
struct Relay {
    port: u16,
    bytes: Arc<AtomicU64>,
}

impl Relay {
    fn start(upstream: u16) -> Result<Relay> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        let bytes = Arc::new(AtomicU64::new(0));
        let b = bytes.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let Ok(s) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                pipe(c.try_clone().expect("clone"), s.try_clone().expect("clone"), b.clone());
                pipe(s, c, b.clone());
            }
        });
        Ok(Relay { port, bytes })
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, count: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match std::io::Read::read(&mut from, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    count.fetch_add(n as u64, Ordering::SeqCst);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}
