//! What the installer prints about the audit and the install: the human report, and the one
//! writer of the `--json` output ([`JsonReport`] for the dry run's object, [`Events`] for every
//! line of the install's event stream). No other module formats JSON for stdout.

use std::io::{self, Write};

use gpum_common::{Failure, Lang};
use gpum_preflight::{Finding, Status};
use serde::Serialize;

use crate::apply::Summary;
use crate::plan::{Plan, Step};
use crate::text::{Msg, t};

/// What `--dry-run --json` prints: `{"checks":[{"id","status","message","fix"}],"plan":[…],"ready":bool}`.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    pub checks: &'a [Finding],
    pub plan: &'a Plan,
    pub ready: bool,
}

impl JsonReport<'_> {
    /// The object on one line.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)?;
        out.flush()
    }
}

/// One line of the install's `--json` stream (docs/install.md): `{"event":"check"|"step"|
/// "note"|"exit",…}`, the last always `exit` with its `code`.
#[derive(Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event<'a> {
    /// One finding of the audit, before anything changes.
    Check { check: &'a Finding },
    /// A step's result: `result` is `done`, `skipped` or `failed`.
    Step {
        index: usize,
        checkpoint: String,
        result: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        detail: Option<&'a str>,
        step: &'a Step,
    },
    /// A line that is not a step's result (a wait, a question answered).
    Note { message: &'a str },
    /// The end: a failure's `message`, or the install's `summary`.
    Exit {
        code: i32,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        summary: Option<&'a Summary>,
    },
}

/// The writer of the `--json` event stream: one [`Event`] per line, flushed, so a reader sees
/// each as it happens.
pub struct Events<'a> {
    out: &'a mut dyn Write,
}

impl<'a> Events<'a> {
    pub fn new(out: &'a mut dyn Write) -> Self {
        Events { out }
    }

    /// Writes `ev` as one line. A closed stdout is not the install's failure: errors are
    /// ignored, as for the human lines.
    pub fn emit(&mut self, ev: &Event) {
        let _ = serde_json::to_writer(&mut *self.out, ev);
        let _ = writeln!(self.out);
        let _ = self.out.flush();
    }

    pub fn check(&mut self, check: &Finding) {
        self.emit(&Event::Check { check });
    }

    pub fn step(&mut self, index: usize, step: &Step, result: &'static str, detail: Option<&str>) {
        self.emit(&Event::Step { index, checkpoint: step.checkpoint(), result, detail, step });
    }

    pub fn note(&mut self, message: &str) {
        self.emit(&Event::Note { message });
    }

    /// The last line of a failed run.
    pub fn failed(&mut self, f: &Failure, lang: Lang) {
        self.emit(&Event::Exit { code: f.code(), message: Some(f.message(lang)), summary: None });
    }

    /// The last line of a finished install.
    pub fn finished(&mut self, summary: &Summary) {
        self.emit(&Event::Exit { code: gpum_common::exit::OK, message: None, summary: Some(summary) });
    }
}

fn tag(s: Status) -> &'static str {
    match s {
        Status::Pass => "[ ok ]",
        Status::Warn => "[warn]",
        Status::Fail => "[FAIL]",
        Status::Skip => "[skip]",
    }
}

/// One line per check, and an indented fix under those that have one.
pub fn write_checks(out: &mut dyn Write, findings: &[Finding], lang: Lang) -> io::Result<()> {
    let fix_word = t(Msg::ReportFix, lang);
    for f in findings {
        writeln!(out, "{} {}: {}", tag(f.status), f.id, f.message)?;
        if let Some(fix) = &f.fix {
            writeln!(out, "       {fix_word}: {fix}")?;
        }
    }
    Ok(())
}

/// The dry run's full human report: the checks, the plan, and the verdict.
pub fn write_dry_run(
    out: &mut dyn Write,
    findings: &[Finding],
    plan: &Plan,
    ready: bool,
    lang: Lang,
) -> io::Result<()> {
    writeln!(out, "{}", t(Msg::ReportTitle, lang))?;
    write_checks(out, findings, lang)?;
    writeln!(out)?;
    writeln!(out, "{}", t(Msg::ReportPlan, lang))?;
    for (i, s) in plan.steps.iter().enumerate() {
        writeln!(out, "  {}. {}", i + 1, s.describe(lang))?;
    }
    writeln!(out)?;
    if ready {
        writeln!(out, "{}", t(Msg::ReportReady, lang))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// docs/install.md: one JSON object per line, `event` first, the last `exit` with its code.
    #[test]
    fn every_event_is_one_json_line_named_first() {
        let check = Finding::warn("disk", "low".into(), Some("free space".into()));
        let summary = Summary {
            node_id: "n1".into(),
            verification: Some(crate::apply::GpuCheck::Known(gpum_protocol::VerificationState::Verified)),
            ..Default::default()
        };
        let mut out = Vec::new();
        let mut ev = Events::new(&mut out);
        ev.check(&check);
        ev.step(4, &Step::AptUpdate, "skipped", Some("unchanged"));
        ev.step(5, &Step::ReloadDocker, "done", None);
        ev.note("waiting");
        ev.finished(&summary);
        ev.failed(&Failure::NotRoot, Lang::En);
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().all(|l| l.starts_with(r#"{"event":""#)), "{text}");
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(
            lines,
            [
                json!({"event": "check", "check": {"id": "disk", "status": "warn", "message": "low", "fix": "free space"}}),
                json!({"event": "step", "index": 4, "checkpoint": "apt_update", "result": "skipped",
                       "detail": "unchanged", "step": {"action": "apt_update"}}),
                json!({"event": "step", "index": 5, "checkpoint": "reload_docker", "result": "done",
                       "step": {"action": "reload_docker"}}),
                json!({"event": "note", "message": "waiting"}),
                json!({"event": "exit", "code": 0, "summary": serde_json::to_value(&summary).unwrap()}),
                json!({"event": "exit", "code": Failure::NotRoot.code(), "message": Failure::NotRoot.message(Lang::En)}),
            ]
        );
    }
}
