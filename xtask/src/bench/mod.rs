//! Benchmarks. Each prints its details, then every measured figure goes into one table: name,
//! measured value, goal, the same run's reference (what the figure is compared with), and the
//! verdict (a miss says by how much). `--json` prints the same table as JSON on stdout (the
//! details then go to stderr).

mod agent;
pub mod cost;
mod delay;
mod dryrun;
mod onenode;
mod platform;
mod sizes;
mod tunnel;
mod verify;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail};
use serde::Serialize;

/// A child process killed (and reaped) when dropped, so a failed bench leaves none behind.
struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpum-agent run --state STATE`, its output discarded, logging warnings only.
fn spawn_agent(agent: &Path, state: &Path) -> Result<Child> {
    Ok(Command::new(agent)
        .args(["run", "--state"])
        .arg(state)
        .env("GPUM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Whether stdout is reserved for the JSON table.
static JSON: AtomicBool = AtomicBool::new(false);

/// A line of a bench's details: stdout, or stderr under `--json`.
macro_rules! say {
    ($($t:tt)*) => {
        if $crate::bench::json_mode() { eprintln!($($t)*) } else { println!($($t)*) }
    };
}
pub(crate) use say;

pub fn json_mode() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    /// The measured median (or count), in `unit`.
    pub measured: f64,
    pub unit: &'static str,
    /// The goal, as a sentence fragment (`< 1 ms`, `<= 3x baseline`).
    pub goal: String,
    /// What the figure was compared with in the same run, if anything.
    pub reference: Option<String>,
    /// Whether the goal was met; `None` for figures without a goal.
    pub met: Option<bool>,
    /// `met`, `MISSED by …`, or `-`.
    pub verdict: String,
}

impl Row {
    /// A row whose goal is `measured <= limit` (or `<` when `strict`).
    pub fn at_most(name: &str, measured: f64, unit: &'static str, limit: f64, strict: bool) -> Row {
        let met = if strict { measured < limit } else { measured <= limit };
        let verdict = if met {
            "met".to_owned()
        } else {
            format!("MISSED by {:.0}%", (measured / limit - 1.0) * 100.0)
        };
        Row {
            name: name.to_owned(),
            measured,
            unit,
            goal: format!("{} {} {unit}", if strict { "<" } else { "<=" }, fmt(limit)),
            reference: None,
            met: Some(met),
            verdict,
        }
    }

    /// A row whose goal is `measured >= limit`.
    pub fn at_least(name: &str, measured: f64, unit: &'static str, limit: f64) -> Row {
        let met = measured >= limit;
        let verdict = if met {
            "met".to_owned()
        } else {
            format!("MISSED by {:.0}%", (1.0 - measured / limit) * 100.0)
        };
        Row {
            name: name.to_owned(),
            measured,
            unit,
            goal: format!(">= {} {unit}", fmt(limit)),
            reference: None,
            met: Some(met),
            verdict,
        }
    }

    /// A figure reported without a goal.
    pub fn info(name: &str, measured: f64, unit: &'static str) -> Row {
        Row {
            name: name.to_owned(),
            measured,
            unit,
            goal: "-".into(),
            reference: None,
            met: None,
            verdict: "-".into(),
        }
    }

    pub fn with_reference(mut self, r: impl Into<String>) -> Row {
        self.reference = Some(r.into());
        self
    }
}

fn fmt(v: f64) -> String {
    if v.abs() >= 1_000.0 {
        cost::thousands(v)
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// `--delay-ms` and `--rate-mbit`: the tunnel bench's delayed path (see `delay.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Delay {
    pub ms: Option<u64>,
    pub rate_mbit: Option<f64>,
}

pub fn run(which: &str, quick: bool, json: bool, db: &str, delay: Delay) -> Result<()> {
    // `GPUM_BENCH_UNOPTIMISED=1`: run from this build as it is (a reduced run on a machine too
    // busy to build the release one; its figures say so).
    if cfg!(debug_assertions) && std::env::var_os("GPUM_BENCH_UNOPTIMISED").is_none() {
        return run_optimised(which, quick, json, db, delay);
    }
    JSON.store(json, Ordering::Relaxed);
    platform::set_db(db)?;
    if delay.ms.is_some() && which != "tunnel" {
        bail!("--delay-ms is the tunnel bench's: cargo xtask bench tunnel --delay-ms N");
    }
    tunnel::set_delay(delay);
    let all = which == "all";
    let mut ran = false;
    let mut rows = Vec::new();
    for (name, f) in BENCHES {
        // `instructions` is part of `agent`; alone, it is the quick way to the figure.
        if (all && *name != "instructions") || which == *name {
            say!("== bench {name} ==");
            rows.extend(f(quick)?);
            ran = true;
        }
    }
    if !ran {
        bail!(
            "unknown bench {which}; one of: all, {}",
            BENCHES.iter().map(|b| b.0).collect::<Vec<_>>().join(", ")
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "\n== summary: cargo xtask bench {which}{}{}{}{} ==",
        if quick { " --quick" } else { "" },
        if db == "sqlite" { String::new() } else { format!(" --db {db}") },
        delay.ms.map(|ms| format!(" --delay-ms {ms}")).unwrap_or_default(),
        delay.rate_mbit.map(|m| format!(" --rate-mbit {m}")).unwrap_or_default()
    );
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    println!("{:<w$}  {:>16}  {:<22}  {:<34}  verdict", "name", "measured", "goal", "same-run reference");
    for r in &rows {
        println!(
            "{:<w$}  {:>16}  {:<22}  {:<34}  {}",
            r.name,
            format!("{} {}", fmt(r.measured), r.unit),
            r.goal,
            r.reference.as_deref().unwrap_or("-"),
            r.verdict
        );
    }
    Ok(())
}

/// `cargo xtask` is a debug build; benches run from an optimised one. The harness shares the
/// machine with what it measures (the platform bench's load generator, at 10,000 requests/s, took
/// 0.9 of the 2 cores as a debug build and 0.5 optimised), so its own cost is kept small.
fn run_optimised(which: &str, quick: bool, json: bool, db: &str, delay: Delay) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let release = crate::util::release_build(&["--locked", "-p", "xtask", "--bin", "xtask"])?;
    let mut cmd = std::process::Command::new(release.join("xtask"));
    cmd.arg("bench").arg(which).current_dir(crate::util::workspace_root());
    if quick {
        cmd.arg("--quick");
    }
    if json {
        cmd.arg("--json");
    }
    cmd.arg("--db").arg(db);
    if let Some(ms) = delay.ms {
        cmd.arg("--delay-ms").arg(ms.to_string());
    }
    if let Some(m) = delay.rate_mbit {
        cmd.arg("--rate-mbit").arg(m.to_string());
    }
    let e = cmd.exec();
    bail!("run the optimised xtask: {e}")
}

type BenchFn = fn(bool) -> Result<Vec<Row>>;

const BENCHES: &[(&str, BenchFn)] = &[
    ("agent", agent::run),
    ("dryrun", dryrun::run),
    ("instructions", cost::run),
    ("platform", platform::run),
    ("onenode", onenode::run),
    ("sizes", sizes::run),
    ("verify", verify::run),
    ("tunnel", tunnel::run),
];
