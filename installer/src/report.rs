//! The human report and the `--json` object.

use std::io::{self, Write};

use gpum_common::Lang;
use gpum_preflight::{Finding, Status};
use serde::Serialize;

use crate::plan::Plan;

/// What `--json` prints: `{"checks":[{"id","status","message","fix"}],"plan":[…],"ready":bool}`.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    pub checks: &'a [Finding],
    pub plan: &'a Plan,
    pub ready: bool,
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
    let fix_word = if lang == Lang::Ru { "что сделать" } else { "fix" };
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
    let ru = lang == Lang::Ru;
    writeln!(
        out,
        "{}",
        if ru {
            "Проверка машины (--dry-run: ничего не изменяется)"
        } else {
            "Machine check (--dry-run: nothing is changed)"
        }
    )?;
    write_checks(out, findings, lang)?;
    writeln!(out)?;
    writeln!(out, "{}", if ru { "Установка сделает:" } else { "The install would:" })?;
    for (i, s) in plan.steps.iter().enumerate() {
        writeln!(out, "  {}. {}", i + 1, s.describe(lang))?;
    }
    writeln!(out)?;
    if ready {
        writeln!(
            out,
            "{}",
            if ru {
                "Машина готова к установке. Запустите команду из личного кабинета без --dry-run."
            } else {
                "The machine is ready. Run the command from your dashboard without --dry-run."
            }
        )?;
    }
    Ok(())
}
