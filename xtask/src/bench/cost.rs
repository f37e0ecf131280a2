//! The agent's instructions per steady heartbeat, counted by callgrind: a figure that means the
//! same on every machine, whatever else the machine does (time per heartbeat moves by 2× between
//! shared machines; instruction counts do not).
//!
//! Method (difference of two runs): two agents, registered with the same platform, run side by
//! side under `valgrind --tool=callgrind`; the platform serves with a 1 s interval. The first is
//! stopped (SIGTERM) once the platform has counted [`SHORT`] heartbeats from it, the second once
//! it has counted [`LONG`]. Both pay the same start, first heartbeat (full inventory) and stop,
//! so `(I_long - I_short) / (beats_long - beats_short)` is what one steady heartbeat costs. The
//! beats are those the platform counted after each agent exited (`last_seq`), so a heartbeat in
//! flight at the signal still counts.
//!
//! Phases: callgrind's inclusive cost of the agent's functions that do each part, by the same
//! difference. Work driven on other tasks (hyper's connection tasks, the runtime's own polling,
//! timers) is not inside any of them and shows as "runtime and the rest".
//!
//! The agent is the shipped build (`release-small`, as `cargo xtask dist` builds it) with its
//! symbol table kept and `test-knobs`, only so that a Docker test scope keeps it to this run's
//! containers (`crate::dist::build_measured_agent`): the
//! real engine is listed every heartbeat, as in production, but no other test's containers are
//! ever seen, let alone removed. The platform may be any build: its cost is not counted.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::say;

/// Heartbeats of the short and the long run.
pub const SHORT: u64 = 5;
pub const LONG: u64 = 35;

/// The line of `docs/benchmarks.md` that holds the committed figure.
pub const COMMITTED_KEY: &str = "agent_instructions_per_heartbeat:";

/// Where [`crate::dist::build_measured_agent`] puts the measured agent.
pub fn agent_cost_bin() -> PathBuf {
    crate::util::target_dir().join("agent-cost/gpum-agent")
}

/// `cargo xtask bench instructions`: the instruction count alone (about a minute), against the
/// release platform. `GPUM_AGENT_COST_BIN` measures that agent instead of building one (an
/// earlier build, to compare), and `GPUM_PLATFORM_BIN` serves from that platform instead of
/// building the release one (its cost is not counted, so any build does).
pub fn run(_quick: bool) -> Result<Vec<super::Row>> {
    let agent = match std::env::var_os("GPUM_AGENT_COST_BIN") {
        Some(p) => PathBuf::from(p),
        None => crate::dist::build_measured_agent()?,
    };
    let platform = match std::env::var_os("GPUM_PLATFORM_BIN") {
        Some(p) => PathBuf::from(p),
        None => crate::util::release_build(&["--locked", "-p", "gpum-platform", "--bin", "gpum-platform"])?
            .join("gpum-platform"),
    };
    let c = measure(&agent, &platform, crate::util::docker_answers())?;
    print(&c);
    Ok(rows(&c))
}

/// The table's rows for a measurement: the figure against the committed one, then each phase.
pub fn rows(c: &Cost) -> Vec<super::Row> {
    use super::Row;
    let mut rows = Vec::new();
    match committed() {
        Ok(n) => {
            say!(
                "  committed in docs/benchmarks.md: {}; this run is {:+.1}% (the regression test allows +20%)",
                thousands(n as f64),
                (c.per_beat / n as f64 - 1.0) * 100.0
            );
            rows.push(
                Row::at_most("agent: instructions per heartbeat", c.per_beat, "instr", n as f64 * 1.2, false)
                    .with_reference(format!("committed {}", thousands(n as f64))),
            );
        }
        Err(e) => {
            say!("  no committed figure: {e:#}");
            rows.push(Row::info("agent: instructions per heartbeat", c.per_beat, "instr"));
        }
    }
    for (name, n) in &c.phases {
        rows.push(Row::info(&format!("agent: instr, {name}"), *n, "instr"));
    }
    rows
}

/// Each phase: a name, and the functions (demangled prefixes; async ones are their
/// `{{closure}}`s) whose inclusive cost it is: the largest of them, as one may contain another
/// (`Gatherer::digest` calls `Inventory::json_and_hash` when the inventory changed). Functions
/// that LTO inlines have no symbol of their own, so these are the ones that keep theirs; the
/// agent has no hook to keep one out of line, so what is inlined into the loop's step (the
/// heartbeat's HTTP call and its JSON, measured so on 2026-12-04) shows in "runtime and the rest".
const PHASES: &[(&str, &[&str])] = &[
    (
        "Docker list",
        &["gpum_agent::docker::Docker::list_marked", "gpum_agent::docker::reconcile::list_managed"],
    ),
    ("metrics", &["gpum_enroll::inventory::Gatherer::metrics"]),
    ("inventory (gather)", &["gpum_enroll::inventory::Gatherer::inventory"]),
    (
        "inventory hash",
        &["gpum_enroll::inventory::Gatherer::digest", "gpum_protocol::Inventory::json_and_hash"],
    ),
    ("state file", &["gpum_agent::run::Agent::write_state"]),
];

/// What one measurement found.
#[derive(Debug, Clone)]
pub struct Cost {
    /// Instructions per steady heartbeat.
    pub per_beat: f64,
    /// Per phase, instructions per steady heartbeat.
    pub phases: Vec<(String, f64)>,
    /// Heartbeats the platform counted from the short and the long run.
    pub beats: (u64, u64),
    /// Whether the agents listed the real Docker Engine.
    pub docker: bool,
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Measures `agent` (a `build_measured_agent` build) against `platform`, with the real engine when
/// `docker`.
pub fn measure(agent: &Path, platform: &Path, docker: bool) -> Result<Cost> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        bail!("valgrind is not installed (tests/setup-deps.sh installs it)");
    }
    let dir = std::env::temp_dir().join(format!("gpum-agent-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let res = measure_in(agent, platform, docker, &dir);
    // `GPUM_BENCH_KEEP=1` keeps the callgrind files, to read with `callgrind_annotate`.
    if std::env::var_os("GPUM_BENCH_KEEP").is_some() {
        say!("  kept {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    res
}

fn measure_in(agent: &Path, platform: &Path, docker: bool, dir: &Path) -> Result<Cost> {
    let db = dir.join("platform.db");
    let mut p = Command::new(platform)
        .arg("--db")
        .arg(&db)
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--heartbeat-interval", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", platform.display()))?;
    let mut first = String::new();
    BufReader::new(p.stdout.take().context("stdout")?).read_line(&mut first)?;
    let _platform = Kill(p);
    let url = first.trim().rsplit(' ').next().context("platform url")?.to_owned();

    let runs = [SHORT, LONG];
    let mut agents = Vec::new();
    for (i, want) in runs.iter().enumerate() {
        let state = dir.join(format!("state{i}"));
        let node = register(agent, platform, &db, &url, &state, docker, i)?;
        let out = dir.join(format!("callgrind.{i}"));
        let child = Command::new("valgrind")
            // Mangled names, demangled as rustc does (`{:#}`, without the hash) for the phases.
            .args(["--tool=callgrind", "--dump-instr=no", "--dump-line=no", "--demangle=no"])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(agent)
            .args(["run", "--state"])
            .arg(&state)
            .env("GPUM_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("valgrind.{i}.log")))?)
            .spawn()
            .context("start the agent under valgrind")?;
        agents.push(Run { want: *want, node, out, child: Some(Kill(child)), beats: 0 });
    }

    // Stop each agent once the platform counted its beats.
    let deadline = Instant::now() + Duration::from_secs(LONG * 3 + 90);
    while agents.iter().any(|a| a.child.is_some()) {
        if Instant::now() > deadline {
            bail!("the agents did not reach {SHORT} and {LONG} heartbeats in time");
        }
        std::thread::sleep(Duration::from_millis(100));
        let seqs = seqs(platform, &db)?;
        for a in agents.iter_mut() {
            let Some(k) = a.child.as_mut() else { continue };
            if let Some(st) = k.0.try_wait()? {
                bail!("an agent under valgrind exited early ({st}); see its log");
            }
            if seqs.iter().any(|(id, s)| *id == a.node && *s >= a.want) {
                let pid = k.0.id().to_string();
                Command::new("kill").args(["-TERM", &pid]).status()?;
                let st = k.0.wait()?;
                a.child = None;
                if !st.success() {
                    bail!("the agent did not stop cleanly after SIGTERM: {st}");
                }
            }
        }
    }
    let seqs = seqs(platform, &db)?;
    for a in agents.iter_mut() {
        a.beats = seqs.iter().find(|(id, _)| *id == a.node).map(|x| x.1).context("node listed")?;
    }
    let (s, l) = (&agents[0], &agents[1]);
    let (is, il) = (total(&s.out)?, total(&l.out)?);
    let dbeats = l.beats.saturating_sub(s.beats);
    if dbeats == 0 {
        bail!("no difference in heartbeats ({} and {})", s.beats, l.beats);
    }
    let per = |a: f64, b: f64| (b - a) / dbeats as f64;
    let demangled = |v: Vec<(String, u64)>| -> Vec<(String, u64)> {
        v.into_iter().map(|(f, n)| (format!("{:#}", rustc_demangle::demangle(&f)), n)).collect()
    };
    let (ps, pl) = (demangled(annotate(&s.out)?), demangled(annotate(&l.out)?));
    let phase = |syms: &[&str], t: &[(String, u64)]| -> f64 {
        t.iter().filter(|(f, _)| syms.iter().any(|w| f.starts_with(w))).map(|x| x.1).max().unwrap_or(0) as f64
    };
    let mut phases = Vec::new();
    for (name, syms) in PHASES {
        phases.push((name.to_string(), per(phase(syms, &ps), phase(syms, &pl))));
    }
    let per_beat = per(is as f64, il as f64);
    let rest = per_beat - phases.iter().map(|p| p.1).sum::<f64>();
    // Hyper's connection tasks, the runtime, timers, applying the answer, and what was inlined.
    phases.push(("runtime and the rest".into(), rest));
    Ok(Cost { per_beat, phases, beats: (s.beats, l.beats), docker })
}

struct Run {
    want: u64,
    node: String,
    out: PathBuf,
    child: Option<Kill>,
    beats: u64,
}

/// `gpum-agent register` of a node into `state`, with the platform at `url` and the join code on
/// stdin.
pub fn agent_register(agent: &Path, url: &str, state: &Path, socket: &str, code: &str) -> Result<()> {
    let mut reg = Command::new(agent)
        .args(["register", "--state"])
        .arg(state)
        .args(["--server", url, "--docker-socket", socket])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    reg.stdin.take().context("stdin")?.write_all(format!("{code}\n").as_bytes())?;
    if !reg.wait()?.success() {
        bail!("gpum-agent register failed");
    }
    Ok(())
}

/// Registers one agent in `state`; returns its node id.
fn register(
    agent: &Path,
    platform: &Path,
    db: &Path,
    url: &str,
    state: &Path,
    docker: bool,
    i: usize,
) -> Result<String> {
    let code =
        cli_json(platform, db, &["join-code", "create"])?["code"].as_str().context("code")?.to_string();
    let socket = if docker { "/var/run/docker.sock" } else { "/nonexistent/docker.sock" };
    agent_register(agent, url, state, socket, &code)?;
    // Only this run's (nonexistent) containers: the reconciler sees no other test's.
    let mut cfg = std::fs::read_to_string(state.join("config.toml"))?;
    cfg.push_str(&format!("test_docker_scope = \"gpum.test.cost=c{}-{i}\"\n", std::process::id()));
    std::fs::write(state.join("config.toml"), cfg)?;
    config_value(state, "node_id")
}

/// A string value of the `config.toml` that `gpum-agent register` wrote into `state`.
pub fn config_value(state: &Path, key: &str) -> Result<String> {
    let text = std::fs::read_to_string(state.join("config.toml"))?;
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches(['"', '\'']).to_owned())
        })
        .with_context(|| format!("{key} in {}", state.join("config.toml").display()))
}

pub fn cli_json(platform: &Path, db: &Path, args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new(platform).arg("--db").arg(db).arg("--json").args(args).output()?;
    if !out.status.success() {
        bail!("gpum-platform {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every node's id and last heartbeat sequence number.
fn seqs(platform: &Path, db: &Path) -> Result<Vec<(String, u64)>> {
    let v = cli_json(platform, db, &["nodes", "list"])?;
    Ok(v["nodes"]
        .as_array()
        .context("nodes")?
        .iter()
        .map(|n| (n["id"].as_str().unwrap_or("").to_owned(), n["last_seq"].as_u64().unwrap_or(0)))
        .collect())
}

/// The program's total instructions, from the `summary:` (or `totals:`) line of a callgrind
/// output file.
fn total(out: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(out).with_context(|| format!("read {}", out.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary:").or_else(|| l.strip_prefix("totals:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no summary line in {}", out.display()))
}

/// Inclusive instructions per function, from `callgrind_annotate`.
fn annotate(out: &Path) -> Result<Vec<(String, u64)>> {
    let o = Command::new("callgrind_annotate")
        .arg("--inclusive=yes")
        .arg("--threshold=100")
        .arg(out)
        .output()
        .context("callgrind_annotate")?;
    if !o.status.success() {
        bail!("callgrind_annotate {}: {}", out.display(), String::from_utf8_lossy(&o.stderr));
    }
    Ok(parse_annotate(&String::from_utf8_lossy(&o.stdout)))
}

/// Lines like `1,234,567 (12.34%)  file.rs:crate::path::fn [/path/bin]`: (function, count).
pub fn parse_annotate(text: &str) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    for l in text.lines() {
        let l = l.trim_start();
        let Some((n, rest)) = l.split_once(' ') else { continue };
        let Ok(n) = n.replace(',', "").parse::<u64>() else { continue };
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.split_once(')').map(|x| x.1).unwrap_or("").trim_start(),
            None => rest,
        };
        // `file:function [object]`; the file may be `???`.
        let f = rest.split_once(':').map(|x| x.1).unwrap_or(rest);
        let f = f.rsplit_once(" [").map(|x| x.0).unwrap_or(f).trim();
        v.push((f.to_owned(), n));
    }
    v
}

/// The committed figure in `docs/benchmarks.md`.
pub fn committed() -> Result<u64> {
    let path = crate::util::workspace_root().join("docs/benchmarks.md");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .find_map(|l| l.trim().trim_start_matches('`').strip_prefix(COMMITTED_KEY))
        .and_then(|v| v.trim().trim_end_matches('`').replace(',', "").parse().ok())
        .with_context(|| format!("no `{COMMITTED_KEY} N` line in {}", path.display()))
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < -0.5 { format!("-{out}") } else { out }
}

/// Prints the figure and its phases.
pub fn print(c: &Cost) {
    say!(
        "instructions per steady heartbeat: {} (callgrind, difference of {} and {} heartbeats, docker: {})",
        thousands(c.per_beat),
        c.beats.0,
        c.beats.1,
        if c.docker { "real engine" } else { "absent" }
    );
    for (name, n) in &c.phases {
        let pct = if c.per_beat > 0.0 { n / c.per_beat * 100.0 } else { 0.0 };
        say!("  {name:<34} {:>10} ({pct:4.1}%)", thousands(*n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotate_lines_parse() {
        let t = "--------\n  Ir\n\
                 1,234,567 (12.34%)  src/inventory.rs:gpum_enroll::inventory::Gatherer::metrics [/x/gpum-agent]\n\
                 9 (0.00%)  ???:tokio::runtime::park [/x/gpum-agent]\n";
        let v = parse_annotate(t);
        assert_eq!(
            v,
            vec![
                ("gpum_enroll::inventory::Gatherer::metrics".to_owned(), 1_234_567),
                ("tokio::runtime::park".to_owned(), 9)
            ]
        );
        assert_eq!(thousands(185_976.0), "185,976");
        assert_eq!(thousands(999.0), "999");
    }

    /// The regression check (not timed): the agent's instructions per steady heartbeat may not
    /// exceed the figure committed in `docs/benchmarks.md` by more than 20%. `cargo xtask test`
    /// builds the measured agent once, names it in `GPUM_AGENT_COST_BIN` (and the platform in
    /// `GPUM_PLATFORM_BIN`) and runs this test; without valgrind, an engine or those binaries
    /// it fails.
    #[test]
    #[ignore = "needs valgrind, a Docker engine and cargo xtask test's GPUM_AGENT_COST_BIN"]
    fn agent_instructions_per_heartbeat_within_20_percent_of_committed() {
        let bins = (std::env::var_os("GPUM_AGENT_COST_BIN"), std::env::var_os("GPUM_PLATFORM_BIN"));
        let (Some(agent), Some(platform)) = bins else {
            panic!("GPUM_AGENT_COST_BIN and GPUM_PLATFORM_BIN are not set (cargo xtask test sets them)");
        };
        assert!(
            crate::util::docker_answers(),
            "no Docker engine answers; the committed figure is with the real engine"
        );
        let limit = committed().expect("committed figure") as f64 * 1.2;
        let c = measure(Path::new(&agent), Path::new(&platform), true).expect("measure");
        print(&c);
        assert!(
            c.per_beat <= limit,
            "instructions per heartbeat {} exceed the committed figure by more than 20% (limit {}); \
             profile with `cargo xtask bench agent`, fix, or commit a new figure with a reason",
            thousands(c.per_beat),
            thousands(limit)
        );
    }
}
