//! Machine checks: what `gpum-install --dry-run` reports and what the agent's `doctor` reuses.
//!
//! The split is the point of this crate:
//! - [`facts::gather`] asks the machine, only through [`gpum_host::Host`] (plus NVML, see
//!   [`gpu`]), and only read-only: it reads files, stats paths, probes locks with `F_GETLK`, asks
//!   the Docker socket `GET /_ping`, and runs at most one read-only command (`systemctl show`,
//!   only when a gpum unit exists). So a dry run provably changes nothing.
//! - [`checks`] are pure functions from [`facts::Facts`] to [`Finding`]s, one per check, all
//!   reported (a failure never hides the checks after it).
//! - [`parse`] holds pure parsers of the machine's own formats, tested on captured samples.

pub mod checks;
pub mod facts;
pub mod gpu;
pub mod parse;
pub mod text;

use serde::Serialize;

pub use checks::{Context, Registration, run_all};
pub use facts::{Facts, GatherOptions, gather};

/// The outcome of one check. `Fail` means the install cannot proceed; `Warn` means it can, with
/// something the owner should know; `Skip` means the check was not run (and why is the message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
    Skip,
}

/// One check's result, in the user's language.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable id (`root`, `systemd`, `os`, …), the same in both languages.
    pub id: &'static str,
    pub status: Status,
    pub message: String,
    /// What to do about a `Fail` or `Warn`, when there is something to do.
    pub fix: Option<String>,
}

impl Finding {
    pub fn pass(id: &'static str, message: String) -> Self {
        Self { id, status: Status::Pass, message, fix: None }
    }
    pub fn warn(id: &'static str, message: String, fix: Option<String>) -> Self {
        Self { id, status: Status::Warn, message, fix }
    }
    pub fn fail(id: &'static str, message: String, fix: Option<String>) -> Self {
        Self { id, status: Status::Fail, message, fix }
    }
    pub fn skip(id: &'static str, message: String) -> Self {
        Self { id, status: Status::Skip, message, fix: None }
    }
}

/// True when no finding failed.
pub fn ready(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.status != Status::Fail)
}

/// The ids of the failed findings, in order.
pub fn failed_ids(findings: &[Finding]) -> Vec<String> {
    findings.iter().filter(|f| f.status == Status::Fail).map(|f| f.id.to_string()).collect()
}

#[cfg(test)]
mod tests;
