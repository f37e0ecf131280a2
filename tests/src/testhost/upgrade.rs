//! What the upgrade scenarios need (issue 47): the releases `cargo xtask e2e` staged in
//! `releases/` (`b`, `b-tampered`, `bad`, `old`: xtask/src/e2e.rs says what each is), the
//! operator's `gpum-platform releases` commands inside the host, and what the host shows of the
//! agent it runs (its binary's version and SHA-256, the upgrade's files, the rollback guard).
//!
//! The operator's commands are the design's (`releases add DIR`, `releases rollout VERSION
//! --percent N`, `releases list`), run through [`Host::platform`] against the host's database,
//! as the admin API would.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpum_repo_keys::release::{RELEASE, ReleaseMeta};

use super::Host;
use super::rental::{quote, wait_node};

/// Where the staged releases are inside a host.
pub const RELEASES: &str = "/opt/gpum-e2e/releases";
/// The installed agent (the installer's path, the unit's `ExecStart`).
pub const AGENT: &str = "/opt/gpum-agent/gpum-agent";
/// The agent's upgrade files beside it and in its state directory (the design's paths).
pub const AGENT_NEW: &str = "/opt/gpum-agent/gpum-agent.new";
pub const AGENT_PREVIOUS: &str = "/opt/gpum-agent/gpum-agent.previous";
pub const UPGRADE_STATE: &str = "/var/lib/gpum-agent/upgrade.json";
/// The transient timer that runs the previous binary's `rollback` (the rollback guard).
pub const ROLLBACK_TIMER: &str = "gpum-agent-rollback.timer";
/// How long a new version has to send its first good heartbeat before the guard puts the
/// previous binary back (the design's BOUND).
pub const BOUND: Duration = Duration::from_secs(120);
/// The test-knobs-only flag of `releases rollout` that offers a release whatever the nodes'
/// versions (the downgrade scenario: the platform names an older version).
pub const ANY_VERSION_FLAG: &str = "--offer-regardless";

/// The version of the staged release `name` (`b`, `bad`, …), read from its `release.json` in
/// the stage on this machine (`stage` is the stage directory).
pub fn version_of(stage: &Path, name: &str) -> Result<String> {
    let p = stage.join("releases").join(name).join(RELEASE);
    let meta = ReleaseMeta::parse(&std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?)
        .with_context(|| format!("{}", p.display()))?;
    Ok(meta.version)
}

/// `gpum-platform releases add /opt/gpum-e2e/releases/NAME`.
pub fn add(h: &Host, name: &str) -> Result<String> {
    h.platform(&format!("releases add {}", quote(&format!("{RELEASES}/{name}"))))
        .with_context(|| format!("releases add {name}"))
}

/// `gpum-platform releases rollout VERSION --percent N` with `extra` flags.
pub fn rollout(h: &Host, version: &str, percent: u8, extra: &str) -> Result<String> {
    h.platform(&format!("releases rollout {} --percent {percent} {extra}", quote(version)))
        .with_context(|| format!("releases rollout {version}"))
}

/// `gpum-platform releases list` as text: its JSON form when it has one, else its table.
pub fn list(h: &Host) -> Result<String> {
    h.platform("--json releases list").or_else(|_| h.platform("releases list"))
}

/// The line(s) of [`list`] about `version`, or for JSON the object that names it: what the
/// platform shows of that release (its rollout's state, the outcomes reported).
pub fn shown(h: &Host, version: &str) -> Result<String> {
    let all = list(h)?;
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(all.trim()) {
        let items = match &v {
            serde_json::Value::Array(a) => a.clone(),
            serde_json::Value::Object(o) => {
                o.values().find_map(|x| x.as_array().cloned()).unwrap_or_else(|| vec![v.clone()])
            }
            _ => vec![v.clone()],
        };
        let mine: Vec<String> = items
            .iter()
            .filter(|i| i.to_string().contains(&format!("\"{version}\"")))
            .map(|i| i.to_string())
            .collect();
        let mut shown = mine;
        shown.extend(reports_on(h, version)?);
        return Ok(shown.join("\n"));
    }
    Ok(all.lines().filter(|l| l.contains(version)).collect::<Vec<_>>().join("\n"))
}

/// The servers' last upgrade reports about `version`, as the operator's `nodes list` shows
/// them (`upgrades.last`, with its `outcome`): the release's own line carries only counts.
fn reports_on(h: &Host, version: &str) -> Result<Vec<String>> {
    fn walk(v: &serde_json::Value, version: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(o) => {
                if let Some(last) = o.get("last")
                    && last.get("to").and_then(|t| t.as_str()) == Some(version)
                {
                    out.push(last.to_string());
                }
                o.values().for_each(|x| walk(x, version, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, version, out)),
            _ => {}
        }
    }
    let nodes = h.platform("--json nodes list")?;
    let v: serde_json::Value = serde_json::from_str(nodes.trim()).context("nodes list --json")?;
    let mut out = Vec::new();
    walk(&v, version, &mut out);
    Ok(out)
}

/// Polls [`shown`] every second until `ok` holds, for up to `secs`; returns what it showed.
pub fn wait_shown(
    h: &Host,
    version: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> Result<String> {
    let start = Instant::now();
    loop {
        let s = shown(h, version)?;
        if ok(&s) {
            return Ok(s);
        }
        if start.elapsed() > Duration::from_secs(secs) {
            bail!("release {version}: not {what} within {secs} s; the platform shows: {s}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Whether the platform's text about a release says its rollout halted.
pub fn halted(shown: &str) -> bool {
    shown.contains("halted")
}

/// Whether the platform's text about a release records a node's outcome `outcome`
/// (`gpum_protocol::upgrade::UpgradeOutcome`'s word, e.g. `rolled_back`).
pub fn records(shown: &str, outcome: gpum_protocol::upgrade::UpgradeOutcome) -> bool {
    shown.contains(outcome.as_str())
}

/// The installed agent as the host has it: `gpum-agent --version`'s version and the binary's
/// SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub version: String,
    pub sha256: String,
}

pub fn installed(h: &Host) -> Result<Installed> {
    let v = h.sh_ok(&format!("{AGENT} --version"))?;
    let version = v.split_whitespace().last().context("gpum-agent --version printed nothing")?.to_string();
    let sum = h.sh_ok(&format!("sha256sum {AGENT}"))?;
    let sha256 = sum.split_whitespace().next().context("sha256sum")?.to_string();
    Ok(Installed { version, sha256 })
}

/// The agent unit's main PID (0 when it does not run).
pub fn agent_pid(h: &Host) -> Result<String> {
    Ok(h.sh_ok("systemctl show -p MainPID --value gpum-agent")?.trim().to_string())
}

/// Waits until the platform's node `id` reports `version` (its heartbeats' `agent_version`)
/// and is online, for up to `secs`.
pub fn wait_version(h: &Host, id: &str, version: &str, secs: u64) -> Result<gpum_protocol::NodeSummary> {
    wait_node(h, id, secs, &format!("online on agent {version}"), |n| n.online && n.agent_version == version)
}

/// The upgrade's leftovers that must not exist after a refusal: the new binary's temporary
/// file, the previous binary's copy, the rollback guard. Each one present is named.
pub fn leftovers_of_a_refusal(h: &Host) -> Result<Vec<String>> {
    let mut left = Vec::new();
    for f in [AGENT_NEW, AGENT_PREVIOUS] {
        if h.sh(&format!("test -e {f}"))?.code == 0 {
            left.push(f.to_string());
        }
    }
    if h.sh(&format!("systemctl is-active -q {ROLLBACK_TIMER}"))?.code == 0 {
        left.push(format!("{ROLLBACK_TIMER} active"));
    }
    Ok(left)
}

/// `upgrade.json`'s state (`pending`, `succeeded`, `rolled_back`), or `None` when there is none.
pub fn upgrade_state(h: &Host) -> Result<Option<String>> {
    let r = h.sh(&format!("cat {UPGRADE_STATE}"))?;
    if r.code != 0 {
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_str(r.stdout.trim()).with_context(|| format!("{UPGRADE_STATE}: {}", r.stdout))?;
    Ok(v["state"].as_str().map(String::from))
}
