//! The install: the [`Plan`] the dry run shows, executed step by step through the seam.
//!
//! - **Verify first.** The first step downloads the agent and verifies it against the signed
//!   release manifest, test-runs it from `$TMPDIR`, and downloads and verifies every repository
//!   key the plan adds. A failure there (exit 20, or 10 for a noexec `$TMPDIR`) leaves the
//!   machine as it was.
//! - **Ask first.** A Docker restart that stops containers is confirmed (`--yes`, or a question
//!   on `/dev/tty`) before the first step; without a confirmation nothing is changed (exit 2).
//! - **Skip what is done.** Each step looks at the machine again and reports "already present"
//!   or "unchanged" instead of redoing it, so a re-run after a crash or a failure converges:
//!   same files, one source per repository, one node on the platform (the install id makes a
//!   repeated registration with the same code return the same node).
//! - **Named checkpoints** after every step ([`Step::checkpoint`]) are a seam,
//!   [`Checkpoints`]: a `test-knobs` build dies there (`crate::knobs::Knobs`), and a unit test
//!   stops the install there and runs it again, to prove the convergence.
//! - **Register late.** Registration runs after the machine is ready, so no server is created
//!   for a machine that fails; a refused registration leaves a running agent, its config and
//!   its binary as they were.
//!
//! Each step carries the values it executes ([`Step`]); `fetch` is the first step (every
//! download and verification, and what it verified), `steps` the others, `waits` the waits for
//! Docker, the service and the GPU check.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpum_common::{Failure, Lang};
use gpum_host::Host;
use gpum_protocol::VerificationState;
use serde::Serialize;

use crate::plan::{Plan, Purpose, Step};
use crate::text::{Msg, t};

mod fetch;
mod progress;
mod steps;
#[cfg(test)]
mod tests;
mod waits;

pub use fetch::{Fetcher, NetFetcher};

/// Where the install id lives (0600); written before the first registration, reused after.
pub const INSTALL_ID: &str = "/var/lib/gpum-agent/install-id";
/// The SHA-256 (hex) of the join code the installed agent was registered with (0600), written
/// with its config: a later run tells the same code (a repair) from a new one before it asks the
/// platform. The code is single-use and bound to this install id, so its hash opens nothing.
pub const JOIN_CODE_HASH: &str = "/var/lib/gpum-agent/join-code.sha256";
/// How often the waits look again.
const POLL: Duration = Duration::from_millis(500);
/// Lines of apt's own output quoted in an error.
const TAIL_LINES: usize = 12;

/// What the owner asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The join code; `None` in a repair, whose plan keeps the installed registration.
    pub code: Option<String>,
    pub server: String,
    pub ca_file: Option<PathBuf>,
    pub yes: bool,
    pub allow_downgrade: bool,
    /// `--probe-registry`; `None`: the agent's defaults.
    pub probe_registries: Option<Vec<String>>,
    pub lang: Lang,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(Option<String>),
    Skipped(String),
}

/// The owner's account of the run, printed at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub node_id: String,
    pub installed: Vec<String>,
    pub changed: Vec<String>,
    pub left_alone: Vec<String>,
    /// How the GPU check ended; empty in the JSON until the check step ran.
    #[serde(serialize_with = "GpuCheck::serialize_or_empty")]
    pub verification: Option<GpuCheck>,
}

/// How the install's GPU check ended. A failed check is no summary: it ends the install (exit 60).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuCheck {
    /// The agent's `state.json` said so: `verified`, or `awaiting_check` (no probe image yet).
    Known(VerificationState),
    /// The check had not finished within the wait: `running`.
    StillRunning,
}

impl GpuCheck {
    /// The summary's word: the protocol's name of the state, or `running`.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuCheck::Known(v) => v.as_str(),
            GpuCheck::StillRunning => "running",
        }
    }

    fn serialize_or_empty<S: serde::Serializer>(v: &Option<GpuCheck>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.map_or("", GpuCheck::as_str))
    }
}

/// Prints step results as lines or JSON events.
pub struct Reporter<'a> {
    pub out: &'a mut dyn Write,
    pub json: bool,
    pub lang: Lang,
}

impl Reporter<'_> {
    fn step(&mut self, index: usize, step: &Step, result: Result<&Outcome, &Failure>) {
        let (tag, word, detail) = match result {
            Ok(Outcome::Done(d)) => (Msg::Done, "done", d.clone()),
            Ok(Outcome::Skipped(why)) => (Msg::Skipped, "skipped", Some(why.clone())),
            Err(f) => (Msg::Failed, "failed", Some(f.message(self.lang))),
        };
        if self.json {
            crate::report::Events::new(&mut *self.out).step(index, step, word, detail.as_deref());
        } else {
            let d = match (&detail, result) {
                (Some(d), Ok(_)) => format!(" — {}", gpum_common::text::escape_controls(d)),
                _ => String::new(),
            };
            let _ = writeln!(self.out, "{} {}. {}{d}", t(tag, self.lang), index, step.describe(self.lang));
        }
        let _ = self.out.flush();
    }

    /// A line that is not a step's result (a wait, a question answered).
    pub fn note(&mut self, text: &str) {
        if self.json {
            crate::report::Events::new(&mut *self.out).note(text);
        } else {
            let _ = writeln!(self.out, "       {}", gpum_common::text::escape_controls(text));
        }
        let _ = self.out.flush();
    }
}

/// What happens at the checkpoint after each step, named by [`Step::checkpoint`]: the binary
/// goes on, or with `test-knobs` dies there (`crate::knobs::Knobs`); a test may stop the
/// install there instead, as a crash would, and run it again.
pub trait Checkpoints {
    /// The step named `name` is done. `Break` ends the install at once, with nothing after it.
    fn reached(&self, name: &str) -> ControlFlow<()>;
}

/// Checkpoints that never stop the install.
pub struct NoCheckpoints;

impl Checkpoints for NoCheckpoints {
    fn reached(&self, _name: &str) -> ControlFlow<()> {
        ControlFlow::Continue(())
    }
}

/// The install stopped at a checkpoint ([`Checkpoints::reached`] said so); only a test's
/// checkpoints do.
fn stopped(name: &str) -> Failure {
    Failure::Other(format!("stopped at checkpoint {name}"))
}

/// The run's state shared by the steps.
struct Run<'a> {
    host: Arc<dyn Host>,
    opts: &'a Options,
    plan: &'a Plan,
    facts: &'a gpum_preflight::Facts,
    fetcher: &'a dyn Fetcher,
    /// The registration's own runtime.
    rt: tokio::runtime::Runtime,
    node: Option<gpum_enroll::register::Registered>,
    /// A repair kept the installed registration ([`Step::KeepRegistration`]).
    kept: bool,
    summary: Summary,
    /// What the long steps draw on a terminal.
    progress: progress::Progress,
}

/// Runs `plan`, with `checkpoints` after each step. See the module docs.
pub fn install(
    host: Arc<dyn Host>,
    audit: &crate::Audit,
    fetcher: &dyn Fetcher,
    checkpoints: &dyn Checkpoints,
    opts: &Options,
    rep: &mut Reporter,
) -> Result<Summary, Failure> {
    let plan = &audit.plan;
    let lang = opts.lang;
    // Ask before anything happens.
    let stops = plan.stops();
    if !stops.is_empty() && !opts.yes {
        let q = t(Msg::ConfirmRestart, lang).replace("{names}", &crate::text::names(stops));
        match host.confirm(&q) {
            Ok(Some(true)) => rep.note(t(Msg::RestartConfirmed, lang)),
            _ => return Err(Failure::RestartNotConfirmed(stops.to_vec())),
        }
    }
    // The plan always starts with the download ([`crate::plan::plan`]); every later step
    // installs what it verified.
    let Some((first @ Step::DownloadAgent { .. }, rest)) = plan.steps.split_first() else {
        return Err(Failure::Other("the plan does not start with the download".into()));
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Other(e.to_string()))?;
    let mut run = Run {
        host: host.clone(),
        opts,
        plan,
        facts: &audit.facts,
        fetcher,
        rt,
        node: None,
        kept: false,
        summary: Summary::default(),
        progress: progress::Progress::new(!rep.json && host.stderr_is_tty(), lang),
    };
    let verified = match run.download() {
        Ok((v, o)) => {
            rep.step(1, first, Ok(&o));
            v
        }
        Err(f) => {
            rep.step(1, first, Err(&f));
            return Err(f);
        }
    };
    if checkpoints.reached(&first.checkpoint()).is_break() {
        return Err(stopped(&first.checkpoint()));
    }
    for (i, step) in rest.iter().enumerate() {
        match run.exec(step, &verified, rep) {
            Ok(o) => rep.step(i + 2, step, Ok(&o)),
            Err(f) => {
                rep.step(i + 2, step, Err(&f));
                return Err(f);
            }
        }
        if checkpoints.reached(&step.checkpoint()).is_break() {
            return Err(stopped(&step.checkpoint()));
        }
    }
    run.left_alone();
    Ok(run.summary)
}

/// The CA file the agent's config names: the copy the plan writes ([`Purpose::AgentCa`]), which
/// registration reaches the platform through, else `--ca-file` itself (a plan without the copy).
fn agent_ca_file(plan: &Plan, opts: &Options) -> Option<PathBuf> {
    opts.ca_file.as_ref()?;
    let copy = plan.steps.iter().find_map(|s| match s {
        Step::WriteFile { path, purpose: Purpose::AgentCa, .. } => Some(PathBuf::from(path)),
        _ => None,
    });
    copy.or_else(|| opts.ca_file.clone())
}

/// The summary's lines.
pub fn write_summary(out: &mut dyn Write, s: &Summary, lang: Lang) -> std::io::Result<()> {
    let list =
        |v: &[String]| if v.is_empty() { t(Msg::SummaryNothing, lang).to_string() } else { v.join("; ") };
    writeln!(out)?;
    writeln!(out, "{}:", t(Msg::SummaryTitle, lang))?;
    writeln!(out, "  {}: {}", t(Msg::SummaryInstalled, lang), list(&s.installed))?;
    writeln!(out, "  {}: {}", t(Msg::SummaryChanged, lang), list(&s.changed))?;
    writeln!(out, "  {}: {}", t(Msg::SummaryLeftAlone, lang), list(&s.left_alone))?;
    writeln!(
        out,
        "  {}: {}",
        t(Msg::SummaryNext, lang),
        t(Msg::NextDashboard, lang).replace("{node}", &s.node_id)
    )?;
    writeln!(out, "        {}", t(Msg::NextStatus, lang))?;
    Ok(())
}
