//! `cargo xtask bench tunnel` (issue 34): what the tunnel costs one stream, against the same
//! transfer over a direct connection in the same run.
//!
//! The release `gpum-platform` serves the relay on loopback (`--relay-listen`, plain HTTP), and
//! the release `gpum-agent` (with `test-knobs`, for the Docker test scope and a rental without the
//! GPU request) runs one rental on the real engine: a `gpum-test/busybox` image (busybox-static,
//! made here by `docker import`) with a line echo server on 7000 (`nc -ll -e cat`), a source on
//! 7001 (`dd if=/dev/zero`) and a sink on 7002 (`dd of=/dev/null`). The node is registered over
//! HTTP with a made-up inventory of one GPU, its check passed and priced, so that the rental can
//! be created before the agent runs (the agent then reports this machine's own inventory).
//!
//! Each figure is measured both ways in the same run, alternating: **through the tunnel** (a
//! `CONNECT` at the relay, yamux in the agent's tunnel, the agent's connection to the container)
//! and **direct** (a TCP connection from this machine straight to the container's address on
//! `gpum-rentals`: the same server and the same bytes, with no relay, tunnel or agent).
//!
//! Reported: download and upload throughput of 1 and of 4 streams at once (MB/s, the median of 3
//! runs each way; goal: at least 50 % of direct), the platform's and the agent's CPU (utime +
//! stime) per GB through the tunnel, the median round trip of a 64-byte line through the echo
//! server (goal: at most 1 ms added to direct), and the memory of an idle stream: the growth of
//! the platform's and the agent's RSS with 60 idle streams open (just under the per-rental cap of
//! 64), divided by 60. Everything runs on one machine, so the client, the relay, the agent and the container
//! share its cores: on 2 cores the tunnel's figures are pessimistic.
//!
//! `GPUM_BENCH_PLATFORM_BIN` and `GPUM_BENCH_AGENT_BIN` name other binaries to measure instead
//! of the release builds: the dist's static platform (musl, `release-small`) and the measured
//! agent (`release-small` with `test-knobs`) are the shipped build.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::symlink;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use gpum_protocol::{
    GpuPublic, Health, HeartbeatRequest, Inventory, NvmlState, PATH_HEARTBEAT, PATH_REGISTER, ProbeReport,
    RegisterRequest, VerificationState,
};

use super::cost::cli_json;
use super::delay::{DelayLine, Path};
use super::{Kill, Row, say, spawn_agent};
use crate::util::{docker_answers, median};

/// The bench's own image tag (busybox-static and its applets); rebuilt when absent.
const IMAGE: &str = "gpum-test/busybox:bench-tunnel-1";
const BUSYBOX: &str = "/bin/busybox";
/// Idle streams opened for the memory figure: just under the relay's and the agent's cap of 64
/// per rental (streams closed just before may still hold a slot for a moment).
const IDLE_STREAMS: usize = 60;
const LONG: Duration = Duration::from_secs(90);

/// `--delay-ms` / `--rate-mbit`, set once by `bench::run`.
static DELAY: std::sync::OnceLock<super::Delay> = std::sync::OnceLock::new();

pub fn set_delay(d: super::Delay) {
    let _ = DELAY.set(d);
}

/// The delayed path, if the bench was asked for one.
fn delayed_path() -> Option<Path> {
    let d = DELAY.get().copied().unwrap_or_default();
    d.ms.map(|ms| Path { round_trip: Duration::from_millis(ms), rate_bits: d.rate_mbit.map(|m| m * 1e6) })
}

/// Removes the bench's containers (by its Docker scope label) when dropped.
struct Containers(String);
impl Drop for Containers {
    fn drop(&mut self) {
        let out =
            Command::new("docker").args(["ps", "-aq", "--filter", &format!("label={}", self.0)]).output();
        for id in String::from_utf8_lossy(&out.map(|o| o.stdout).unwrap_or_default()).split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
        }
    }
}

pub fn run(quick: bool) -> Result<Vec<Row>> {
    if !docker_answers() {
        bail!("the tunnel bench needs a Docker engine: the rental runs in it");
    }
    let mib: u64 = if quick { 64 } else { 256 };
    let rounds = if quick { 400 } else { 2000 };
    let (platform, agent, builds) = binaries()?;
    let image = image()?;

    let dir = std::env::temp_dir().join(format!("gpum-bench-tunnel-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("platform.db");
    let relay = free_port()?;
    let mut p = Command::new(&platform)
        .arg("--db")
        .arg(&db)
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--heartbeat-interval", "1"])
        .arg("--relay-listen")
        .arg(format!("127.0.0.1:{relay}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start gpum-platform")?;
    let mut first = String::new();
    BufReader::new(p.stdout.take().expect("stdout")).read_line(&mut first)?;
    let platform_proc = Kill(p);
    let api: u16 = first.trim().rsplit(':').next().and_then(|s| s.parse().ok()).context("platform port")?;

    let (node_id, token) = rentable_node(api, &platform, &db)?;
    let script = format!(
        "nc -ll -p 7000 -e cat & nc -ll -p 7001 -e dd if=/dev/zero bs=65536 count={} & \
         exec nc -ll -p 7002 -e dd of=/dev/null bs=65536",
        mib * 16
    );
    let created = cli_json(
        &platform,
        &db,
        &[
            "rentals",
            "create",
            "--node",
            &node_id,
            "--image",
            &image,
            "--gpus",
            "1",
            "--cpu-millis",
            "2000",
            "--memory-mib",
            "1024",
            "--disk-gib",
            "1",
            "--shm-mib",
            "16",
            "--duration",
            "1h",
            "--port",
            "7000",
            "--port",
            "7001",
            "--port",
            "7002",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )?;
    let id = created["spec"]["id"].as_str().context("rental id")?.to_string();
    let credential = created["tunnel"]["credential"].as_str().context("the credential")?.to_string();

    let scope = format!("gpum.test.bench=t{}", std::process::id());
    let _containers = Containers(scope.clone());
    // Over a delayed path the agent reaches the platform (its heartbeats and its tunnel) through
    // a delay line.
    let path = delayed_path();
    let agent_line = path.map(|p| DelayLine::start(("127.0.0.1", api), p)).transpose()?;
    let server_port = agent_line.as_ref().map_or(api, DelayLine::port);
    let state = dir.join("state");
    std::fs::create_dir_all(&state)?;
    std::fs::write(
        state.join("config.toml"),
        format!(
            "server = 'http://127.0.0.1:{server_port}'\nnode_id = '{node_id}'\ntoken = '{token}'\n\
             test_docker_scope = '{scope}'\ntest_rentals_without_gpu_request = true\nrentals = true\n"
        ),
    )?;
    let a = spawn_agent(&agent, &state)?;
    let agent_pid = a.id();
    let agent_proc = Kill(a);
    let platform_pid = platform_proc.0.id();

    let t = Instant::now();
    while cli_json(&platform, &db, &["rentals", "show", &id])?["state"] != "running" {
        if t.elapsed() > LONG {
            bail!("the rental did not run within {LONG:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let ip = container_ip(&format!("gpum-rental-{id}"))?;
    let tunnel = |port: u16| connect(relay, &id, &credential, port);
    // The reference crosses the same delayed path: one delay line per port, in front of the
    // container.
    let lines = match path {
        Some(p) => [7000u16, 7001, 7002]
            .iter()
            .map(|&port| Ok((port, DelayLine::start((ip.as_str(), port), p)?)))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let direct = |port: u16| -> Result<TcpStream> {
        let s = match lines.iter().find(|(p, _)| *p == port) {
            Some((_, line)) => TcpStream::connect(("127.0.0.1", line.port()))?,
            None => TcpStream::connect((ip.as_str(), port))?,
        };
        s.set_nodelay(true)?;
        Ok(s)
    };
    let t = Instant::now();
    while tunnel(7000).is_err() {
        if t.elapsed() > LONG {
            bail!("no tunnel within {LONG:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    if let Some(p) = path {
        let rows = delayed(p, quick, mib, &builds, &tunnel, &direct)?;
        drop(agent_proc);
        drop(platform_proc);
        drop(agent_line);
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(rows);
    }

    // Latency: one connection each way, rounds in alternating blocks.
    let (mut lt, mut ld) = (tunnel(7000)?, direct(7000)?);
    round_trips(&mut lt, 50)?;
    round_trips(&mut ld, 50)?;
    let (mut rt, mut rd) = (Vec::new(), Vec::new());
    for _ in 0..4 {
        rd.extend(round_trips(&mut ld, rounds / 4)?);
        rt.extend(round_trips(&mut lt, rounds / 4)?);
    }
    drop((lt, ld));
    let (med_t, med_d) = (median(&mut rt), median(&mut rd));

    // Throughput: 1 and 4 streams (each its own connection, `mib` MiB each), 3 runs each way,
    // alternating; the platform's and the agent's CPU (utime + stime) over the tunnel's
    // transfers, per GB the tunnel moved.
    let bytes = mib * 1024 * 1024;
    let (mut cpu_p, mut cpu_a, mut moved) = (0.0, 0.0, 0u64);
    let mut through = |streams: usize, port: u16, way: fn(TcpStream, u64) -> Result<f64>| -> Result<f64> {
        let (p0, a0) = (cpu_secs(platform_pid), cpu_secs(agent_pid));
        let r = parallel(streams, bytes, || way(tunnel(port)?, bytes))?;
        cpu_p += cpu_secs(platform_pid) - p0;
        cpu_a += cpu_secs(agent_pid) - a0;
        moved += streams as u64 * bytes;
        Ok(r)
    };
    let mut shares = Vec::new();
    for streams in [1usize, 4] {
        let (mut down_t, mut down_d, mut up_t, mut up_d) = (vec![], vec![], vec![], vec![]);
        for _ in 0..3 {
            down_d.push(parallel(streams, bytes, || download(direct(7001)?, bytes))?);
            down_t.push(through(streams, 7001, download)?);
            up_d.push(parallel(streams, bytes, || upload(direct(7002)?, bytes))?);
            up_t.push(through(streams, 7002, upload)?);
        }
        shares.push((streams, "download", median(&mut down_t), median(&mut down_d)));
        shares.push((streams, "upload", median(&mut up_t), median(&mut up_d)));
    }
    let gb = moved as f64 / 1e9;

    // Memory per idle stream: RSS before and with IDLE_STREAMS streams open, each one echoed
    // once (so the agent's side is connected), after a few opened and closed to warm up.
    for _ in 0..4 {
        let mut s = tunnel(7000)?;
        round_trips(&mut s, 1)?;
    }
    std::thread::sleep(Duration::from_secs(2));
    let (p0, a0) = (rss_kib(platform_pid)?, rss_kib(agent_pid)?);
    let mut idle = Vec::new();
    for _ in 0..IDLE_STREAMS {
        let mut s = tunnel(7000)?;
        round_trips(&mut s, 1)?;
        idle.push(s);
    }
    std::thread::sleep(Duration::from_secs(2));
    let (p1, a1) = (rss_kib(platform_pid)?, rss_kib(agent_pid)?);
    let per = |a: u64, b: u64| (b as f64 - a as f64) / IDLE_STREAMS as f64;
    let (per_p, per_a) = (per(p0, p1), per(a0, a1));
    drop(idle);

    drop(agent_proc);
    drop(platform_proc);
    let _ = std::fs::remove_dir_all(&dir);

    say!(
        "command: cargo xtask bench tunnel{} ({builds}; the relay on loopback, plain; the rental on the \
         real engine at {ip}; {mib} MiB per stream and transfer, {rounds} round trips)",
        if quick { " --quick" } else { "" }
    );
    say!(
        "round trip (64 B line, median): tunnel {med_t:.3} ms, direct {med_d:.3} ms, added {:.3} ms",
        med_t - med_d
    );
    for (streams, way, t, d) in &shares {
        say!("{streams} stream(s), {way}: tunnel {t:.0} MB/s, direct {d:.0} MB/s ({:.0} %)", t / d * 100.0);
    }
    say!(
        "CPU over the tunnel's transfers ({gb:.1} GB): platform {cpu_p:.2} s, agent {cpu_a:.2} s, \
         {:.2} and {:.2} s per GB",
        cpu_p / gb,
        cpu_a / gb
    );
    say!(
        "idle streams: {IDLE_STREAMS} open: platform RSS {:.1} -> {:.1} MiB, agent RSS {:.1} -> {:.1} MiB",
        p0 as f64 / 1024.0,
        p1 as f64 / 1024.0,
        a0 as f64 / 1024.0,
        a1 as f64 / 1024.0
    );
    let mut rows: Vec<Row> = shares
        .iter()
        .map(|(streams, way, t, d)| {
            Row::at_least(
                &format!("tunnel: {streams} stream(s) {way}, share of direct"),
                t / d * 100.0,
                "%",
                50.0,
            )
            .with_reference(format!("direct {d:.0} MB/s, tunnel {t:.0}"))
        })
        .collect();
    rows.extend([
        Row::info("tunnel: platform CPU per GB through the tunnel", cpu_p / gb, "s")
            .with_reference(format!("{cpu_p:.2} s over {gb:.1} GB")),
        Row::info("tunnel: agent CPU per GB through the tunnel", cpu_a / gb, "s")
            .with_reference(format!("{cpu_a:.2} s over {gb:.1} GB")),
        Row::at_most("tunnel: added median round trip", med_t - med_d, "ms", 1.0, false)
            .with_reference(format!("direct {med_d:.3} ms, tunnel {med_t:.3}")),
        Row::info("tunnel: platform RSS per idle stream", per_p, "KiB")
            .with_reference(format!("{IDLE_STREAMS} streams over {:.1} MiB", p0 as f64 / 1024.0)),
        Row::info("tunnel: agent RSS per idle stream", per_a, "KiB")
            .with_reference(format!("{IDLE_STREAMS} streams over {:.1} MiB", a0 as f64 / 1024.0)),
    ]);
    Ok(rows)
}

/// The platform and the agent to measure, and words for the command line: the binaries named
/// by `GPUM_BENCH_PLATFORM_BIN` and `GPUM_BENCH_AGENT_BIN` (for example the dist's static
/// platform and the measured agent, `dist::build_measured_agent`), else release builds (the
/// agent with `test-knobs`, for the Docker test scope and a rental without the GPU request).
fn binaries() -> Result<(std::path::PathBuf, std::path::PathBuf, String)> {
    let given = |v: &str| std::env::var_os(v).map(std::path::PathBuf::from);
    let (p, a) = (given("GPUM_BENCH_PLATFORM_BIN"), given("GPUM_BENCH_AGENT_BIN"));
    let words = |p: &Option<std::path::PathBuf>, a: &Option<std::path::PathBuf>| match (p, a) {
        (None, None) => "release builds".to_owned(),
        _ => format!(
            "platform {}, agent {}",
            p.as_ref().map_or("release".into(), |p| p.display().to_string()),
            a.as_ref().map_or("release".into(), |a| a.display().to_string())
        ),
    };
    let w = words(&p, &a);
    if let (Some(p), Some(a)) = (&p, &a) {
        return Ok((p.clone(), a.clone(), w));
    }
    let release = crate::util::release_build(&[
        "--locked",
        "-p",
        "gpum-platform",
        "-p",
        "gpum-agent",
        "--features",
        "gpum-agent/test-knobs",
    ])?;
    Ok((
        p.unwrap_or_else(|| release.join("gpum-platform")),
        a.unwrap_or_else(|| release.join("gpum-agent")),
        w,
    ))
}

/// utime + stime of a process and its exited threads, in seconds (clock ticks at 100 Hz).
fn cpu_secs(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// Over a delayed path: the round trip, and 1 and 4 streams' throughput each way, through the
/// tunnel and direct (the same path), alternating, 3 runs each (medians). Goal: 80 % of direct.
fn delayed(
    p: Path,
    quick: bool,
    mib: u64,
    builds: &str,
    tunnel: &(dyn Fn(u16) -> Result<TcpStream> + Sync),
    direct: &(dyn Fn(u16) -> Result<TcpStream> + Sync),
) -> Result<Vec<Row>> {
    let ms = p.round_trip.as_millis();
    let rate = p.rate_bits.map(|b| format!(", {} Mbit/s", b / 1e6)).unwrap_or_default();
    let (mut lt, mut ld) = (tunnel(7000)?, direct(7000)?);
    let n = if quick { 20 } else { 100 };
    round_trips(&mut lt, 5)?;
    round_trips(&mut ld, 5)?;
    let (mut rt, mut rd) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        rd.extend(round_trips(&mut ld, n / 2)?);
        rt.extend(round_trips(&mut lt, n / 2)?);
    }
    drop((lt, ld));
    let (med_t, med_d) = (median(&mut rt), median(&mut rd));
    let bytes = mib * 1024 * 1024;
    say!(
        "command: cargo xtask bench tunnel{} --delay-ms {ms}{} ({builds}; a delay line of {ms} ms \
         round trip{rate} between the agent and the platform, and in front of the container for direct; \
         {mib} MiB per stream)",
        if quick { " --quick" } else { "" },
        p.rate_bits.map(|b| format!(" --rate-mbit {}", b / 1e6)).unwrap_or_default()
    );
    say!("round trip (64 B line, median): tunnel {med_t:.3} ms, direct {med_d:.3} ms");
    let mut rows = vec![
        Row::at_most(&format!("tunnel {ms} ms: added median round trip"), med_t - med_d, "ms", 1.0, false)
            .with_reference(format!("direct {med_d:.2} ms, tunnel {med_t:.2}")),
    ];
    for streams in [1usize, 4] {
        let (mut down_t, mut down_d, mut up_t, mut up_d) = (vec![], vec![], vec![], vec![]);
        for _ in 0..3 {
            down_d.push(parallel(streams, bytes, || download(direct(7001)?, bytes))?);
            down_t.push(parallel(streams, bytes, || download(tunnel(7001)?, bytes))?);
            up_d.push(parallel(streams, bytes, || upload(direct(7002)?, bytes))?);
            up_t.push(parallel(streams, bytes, || upload(tunnel(7002)?, bytes))?);
        }
        let (down_t, down_d, up_t, up_d) =
            (median(&mut down_t), median(&mut down_d), median(&mut up_t), median(&mut up_d));
        for (way, t, d) in [("download", down_t, down_d), ("upload", up_t, up_d)] {
            say!(
                "{streams} stream(s), {way}: tunnel {t:.0} MB/s, direct {d:.0} MB/s ({:.0} %)",
                t / d * 100.0
            );
            rows.push(
                Row::at_least(
                    &format!("tunnel {ms} ms{rate}: {streams} stream(s) {way}, share of direct"),
                    t / d * 100.0,
                    "%",
                    80.0,
                )
                .with_reference(format!("direct {d:.0} MB/s, tunnel {t:.0}")),
            );
        }
    }
    Ok(rows)
}

/// `streams` transfers of `bytes` each at once (each its own connection, made in its thread):
/// their bytes together over the time until the last ends, in MB/s.
fn parallel(streams: usize, bytes: u64, one: impl Fn() -> Result<f64> + Sync) -> Result<f64> {
    let t = Instant::now();
    std::thread::scope(|s| {
        let all: Vec<_> = (0..streams).map(|_| s.spawn(&one)).collect();
        for h in all {
            h.join().map_err(|_| anyhow::anyhow!("a transfer panicked"))??;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok((streams as u64 * bytes) as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `gpum-test/busybox@<image id>`: the bench's image, imported when absent.
fn image() -> Result<String> {
    let id = |tag: &str| {
        Command::new("docker")
            .args(["image", "inspect", "--format", "{{.Id}}", tag])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if id(IMAGE).is_none() {
        let dir = std::env::temp_dir().join(format!("gpum-bench-tunnel-image-{}", std::process::id()));
        let root = dir.join("rootfs");
        for d in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
            std::fs::create_dir_all(root.join(d))?;
        }
        std::fs::copy(BUSYBOX, root.join("bin/busybox")).context("/bin/busybox (install busybox-static)")?;
        let list = Command::new(BUSYBOX).arg("--list").output().context("busybox --list")?;
        for applet in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
            if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
                symlink("busybox", root.join("bin").join(applet))?;
            }
        }
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
        let tar = dir.join("rootfs.tar");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .args(["--owner=0", "--group=0", "-cf"])
            .arg(&tar)
            .arg(".")
            .status()?
            .success()
            && Command::new("docker").arg("import").arg(&tar).arg(IMAGE).output()?.status.success();
        let _ = std::fs::remove_dir_all(&dir);
        if !ok {
            bail!("could not build {IMAGE}");
        }
    }
    let id = id(IMAGE).context("the bench image")?;
    Ok(format!("gpum-test/busybox@{id}"))
}

/// A node over HTTP with a made-up inventory of one GPU, its check passed, priced: rentable.
fn rentable_node(api: u16, platform: &std::path::Path, db: &std::path::Path) -> Result<(String, String)> {
    let code =
        cli_json(platform, db, &["join-code", "create"])?["code"].as_str().context("code")?.to_string();
    let mut inv = Inventory::default();
    inv.public.cpu_model = "Bench CPU".into();
    inv.public.cpu_cores = 16;
    inv.public.ram_mib = 65_536;
    inv.public.disk_gib = 500;
    inv.public.gpus = vec![GpuPublic { model: "Tesla T4".into(), vram_mib: 15_360 }];
    inv.private.gpu_uuids = vec!["GPU-b0b0b0b0-2222-3333-4444-000000000001".into()];
    let req = RegisterRequest {
        join_code: code,
        agent_version: "0.1.0".into(),
        inventory: inv.clone(),
        install_id: None,
    };
    let reg = post(api, PATH_REGISTER, None, &serde_json::to_value(&req)?)?;
    let node_id = reg["node_id"].as_str().context("node_id")?.to_string();
    let token = reg["node_token"].as_str().context("node_token")?.to_string();
    let hb = HeartbeatRequest {
        seq: 1,
        inventory_hash: inv.hash(),
        health: Health { docker_ok: true, nvml: NvmlState::Ok, ..Default::default() },
        probe: Some(ProbeReport {
            state: VerificationState::Verified,
            reason: None,
            output: "ok".into(),
            finished_at: 1,
            image: String::new(),
        }),
        ..Default::default()
    };
    post(api, PATH_HEARTBEAT, Some(&token), &serde_json::to_value(&hb)?)?;
    cli_json(platform, db, &["nodes", "set", &node_id, "--price", "1.50"])?;
    Ok((node_id, token))
}

/// One JSON `POST` over plain HTTP/1.1; the answer's body, which must be a 2xx's.
fn post(port: u16, path: &str, bearer: Option<&str>, body: &serde_json::Value) -> Result<serde_json::Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let b = serde_json::to_vec(body)?;
    let auth = bearer.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n{auth}\r\n",
        b.len()
    )?;
    s.write_all(&b)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").context("an HTTP answer")?;
    if !head.starts_with("HTTP/1.1 2") {
        bail!("POST {path}: {head}\n{body}");
    }
    Ok(serde_json::from_str(body)?)
}

fn container_ip(name: &str) -> Result<String> {
    let out = Command::new("docker")
        .args([
            "inspect",
            "--format",
            "{{(index .NetworkSettings.Networks \"gpum-rentals\").IPAddress}}",
            name,
        ])
        .output()?;
    let ip = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || ip.is_empty() {
        bail!("no address of {name} on gpum-rentals");
    }
    Ok(ip)
}

/// A stream to the rental's `port` through the relay: `CONNECT`, then `200`.
fn connect(relay: u16, id: &str, credential: &str, port: u16) -> Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", relay))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let target = gpum_protocol::tunnel_target(id, port);
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{credential}"));
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n")?;
    // The head, byte by byte, so that nothing after it is read.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            break;
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("CONNECT {target}: {}", String::from_utf8_lossy(&head).lines().next().unwrap_or(""));
    }
    s.set_read_timeout(None)?;
    Ok(s)
}

/// `n` round trips of a 64-byte line through the echo server, each in milliseconds.
fn round_trips(s: &mut TcpStream, n: usize) -> Result<Vec<f64>> {
    let mut line = [b'x'; 64];
    line[63] = b'\n';
    let mut back = [0u8; 64];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&line)?;
        s.read_exact(&mut back)?;
        v.push(t.elapsed().as_secs_f64() * 1e3);
        if back != line {
            bail!("the echo server sent back something else");
        }
    }
    Ok(v)
}

/// Reads the source's `bytes` to its end: MB/s.
fn download(mut s: TcpStream, bytes: u64) -> Result<f64> {
    let t = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        match s.read(&mut buf)? {
            0 => break,
            n => got += n as u64,
        }
    }
    let secs = t.elapsed().as_secs_f64();
    if got != bytes {
        bail!("downloaded {got} bytes of {bytes}");
    }
    Ok(got as f64 / secs / 1e6)
}

/// Writes `bytes` to the sink, closes its side and waits for the sink's end: MB/s.
fn upload(mut s: TcpStream, bytes: u64) -> Result<f64> {
    let t = Instant::now();
    let buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    while sent < bytes {
        let n = (bytes - sent).min(buf.len() as u64) as usize;
        s.write_all(&buf[..n])?;
        sent += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)?;
    Ok(sent as f64 / t.elapsed().as_secs_f64() / 1e6)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:").and_then(|r| r.trim().strip_suffix("kB")))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("VmRSS in /proc/{pid}/status"))
}
