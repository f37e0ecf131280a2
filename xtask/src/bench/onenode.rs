//! `cargo xtask bench onenode` (issue 44, item 4: one node costs one node). Reading one node used
//! to list them all (1 + 2N statements), so an owner's server page on a platform of 100,000
//! nodes made the database thread run 200,000 queries. This bench measures, in one run, two
//! reads about one node on a platform holding 10 nodes and on one holding 100,000:
//!
//! - the server page, `GET /dashboard/servers/{id}`, signed in as the nodes' owner;
//! - `GET /api/v1/owner/nodes/{id}`, with the owner's API key.
//!
//! Each platform is the real `gpum-platform serve` (release build) on its own SQLite file. The
//! nodes, their owner, a session and an API key are written into the file before it starts, in
//! one transaction of plain inserts (registering 100,000 nodes over HTTP would measure
//! registration, not reads). The node read is the one in the middle of the registration order.
//! Requests go one at a time over one kept-alive connection, after a warm-up; the figure is the
//! median. Goal: each read on 100,000 nodes at most 2x its median on 10.
//!
//! `GPUM_BENCH_NODES` (default 100,000; quick 20,000) and `GPUM_BENCH_REQUESTS` (default 200;
//! quick 50) change the shape. `GPUM_BENCH_PLATFORM_BIN` runs a `gpum-platform` already built
//! (for a reduced run on a busy machine, say a debug build; the report says which ran).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use gpum_platform::{accounts, params, store};

use super::{Row, say};

/// The platform with fewer nodes, the same run's reference.
const SMALL: u64 = 10;
/// Requests sent and not counted before each measured series.
const WARMUP: usize = 10;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

pub fn run(quick: bool) -> Result<Vec<Row>> {
    let big = env_u64("GPUM_BENCH_NODES", if quick { 20_000 } else { 100_000 });
    let requests = env_u64("GPUM_BENCH_REQUESTS", if quick { 50 } else { 200 }) as usize;
    if big < SMALL || requests == 0 {
        bail!("GPUM_BENCH_NODES must be at least {SMALL} and GPUM_BENCH_REQUESTS at least 1");
    }
    let exe = match std::env::var_os("GPUM_BENCH_PLATFORM_BIN") {
        Some(p) => PathBuf::from(p),
        None => super::platform::release_platform()?.join("gpum-platform"),
    };
    say!("  platform: {}", exe.display());
    let dir = std::env::temp_dir().join(format!("gpum-bench-onenode-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let res: Result<Vec<Medians>> = [SMALL, big].iter().map(|&n| measure(&exe, &dir, n, requests)).collect();
    let _ = std::fs::remove_dir_all(&dir);
    let [small, large] = <[Medians; 2]>::try_from(res?).map_err(|_| anyhow::anyhow!("two runs"))?;
    say!(
        "  command: GPUM_BENCH_NODES={big} GPUM_BENCH_REQUESTS={requests}{} cargo xtask bench onenode",
        if std::env::var_os("GPUM_BENCH_PLATFORM_BIN").is_some() {
            " GPUM_BENCH_PLATFORM_BIN=…"
        } else {
            ""
        }
    );
    let mut rows = Vec::new();
    for (what, s, l) in [("server page", small.page, large.page), ("owner API node", small.api, large.api)] {
        rows.push(
            Row::at_most(&format!("onenode: {what}, {big} vs {SMALL} nodes"), l / s, "x", 2.0, false)
                .with_reference(format!("median {s:.2} ms vs {l:.2} ms")),
        );
        rows.push(Row::info(&format!("onenode: {what} median, {big} nodes"), l, "ms"));
    }
    Ok(rows)
}

/// Median milliseconds of the two reads on one platform.
struct Medians {
    page: f64,
    api: f64,
}

/// What the bench signs in with, and the node it reads.
struct Seeded {
    node: String,
    session: String,
    key: String,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `nodes` nodes of one owner, straight into the database file at `db` (migrated by opening
/// it), in one transaction; a session and an API key of that owner.
fn seed(db: &Path, nodes: u64) -> Result<Seeded> {
    let conn = store::open(db).map_err(|e| anyhow::anyhow!("open {}: {e}", db.display()))?;
    let t = now();
    let err = |e: gpum_platform::error::ApiError| anyhow::anyhow!("{}", e.message);
    conn.begin().map_err(|e| anyhow::anyhow!("{e}"))?;
    let (owner, _, _) = accounts::invite(&conn, t, "bench@example.org").map_err(err)?;
    let session = accounts::create_session(&conn, t, Some(&owner.id)).map_err(err)?;
    let (_, key) = accounts::create_api_key(&conn, t, &owner.id, "bench").map_err(err)?;
    let mut inv = gpum_protocol::Inventory::default();
    for i in 0..nodes {
        inv.private.hostname = format!("bench-{i}");
        inv.private.gpu_uuids = vec![format!("GPU-bench-{i:08}")];
        let inventory = serde_json::to_string(&inv)?;
        conn.prepare_cached(
            "INSERT INTO nodes (id, token_hash, registered_at, agent_version, inventory_json, owner_id,
                                last_heartbeat_at, last_seq)
             VALUES (?1, ?2, ?3, '0.1.0', ?4, ?5, ?6, 1)",
        )
        .and_then(|mut s| {
            s.execute(params![
                format!("n_bench{i:08}"),
                format!("{i:064x}"),
                (t - nodes + i) as i64,
                inventory,
                owner.id,
                t as i64
            ])
        })
        .map_err(|e| anyhow::anyhow!("seed node {i}: {e}"))?;
    }
    conn.commit().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Seeded { node: format!("n_bench{:08}", nodes / 2), session, key })
}

/// A `gpum-platform serve`, killed when dropped.
struct Server(Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn measure(exe: &Path, dir: &Path, nodes: u64, requests: usize) -> Result<Medians> {
    use std::io::BufRead;
    let here = dir.join(format!("n{nodes}"));
    std::fs::create_dir_all(&here)?;
    let db = here.join("bench.db");
    let started = Instant::now();
    let s = seed(&db, nodes)?;
    say!("  {nodes} nodes seeded in {:.1} s", started.elapsed().as_secs_f64());
    let token = here.join("admin-token");
    std::fs::write(&token, "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")?;
    let mut child = Command::new(exe)
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--db"])
        .arg(&db)
        .arg("--admin-token-file")
        .arg(&token)
        .env("GPUM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(here.join("server.log"))?)
        .spawn()
        .with_context(|| format!("start {}", exe.display()))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let server = Server(child);
    let url = line.trim().rsplit(' ').next().unwrap_or("").to_owned();
    if !url.starts_with("http") {
        bail!("{} did not start: {line:?}", exe.display());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let medians = rt.block_on(async {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).http1_only().build()?;
        let page = client
            .get(format!("{url}/dashboard/servers/{}", s.node))
            .header("Cookie", format!("{}={}", gpum_platform::web::SESSION_COOKIE, s.session));
        let api =
            client.get(format!("{url}{}/{}", gpum_protocol::PATH_OWNER_NODES, s.node)).bearer_auth(&s.key);
        let page = median_ms(page, requests, |b| b.contains(&s.node) && b.contains("<html")).await?;
        let api = median_ms(api, requests, |b| b.contains(&format!("\"id\":\"{}\"", s.node))).await?;
        anyhow::Ok(Medians { page, api })
    })?;
    drop(server);
    say!(
        "  {nodes} nodes: server page {:.2} ms, owner API node {:.2} ms (medians)",
        medians.page,
        medians.api
    );
    Ok(medians)
}

/// The median time of `n` requests like `req`, one at a time, after a warm-up; every answer
/// must be 200 and pass `ok`.
async fn median_ms(req: reqwest::RequestBuilder, n: usize, ok: impl Fn(&str) -> bool) -> Result<f64> {
    let mut times = Vec::with_capacity(n);
    for i in 0..WARMUP + n {
        let r = req.try_clone().context("request")?;
        let t = Instant::now();
        let resp = r.send().await?;
        let status = resp.status();
        let body = resp.text().await?;
        let took = t.elapsed().as_secs_f64() * 1000.0;
        if !status.is_success() || !ok(&body) {
            bail!("unexpected answer {status}: {}", body.chars().take(300).collect::<String>());
        }
        if i >= WARMUP {
            times.push(took);
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}
