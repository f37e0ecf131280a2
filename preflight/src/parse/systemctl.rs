//! `systemctl show UNIT -p A,B,…` output: `Key=value` lines.

use std::collections::BTreeMap;

/// The state of a unit, as `systemctl show` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitState {
    /// `active`, `inactive`, `failed`, `activating`, …
    pub active_state: String,
    pub sub_state: String,
    /// `success`, `exit-code`, …
    pub result: String,
    /// The main process's last exit status (78 when the agent stopped for good).
    pub exec_main_status: Option<i32>,
    /// `loaded`, `not-found`, …
    pub load_state: String,
}

/// The properties `parse_show` expects, for the command line.
pub const SHOW_PROPERTIES: &str = "LoadState,ActiveState,SubState,Result,ExecMainStatus";

pub fn parse_show(text: &str) -> UnitState {
    let m: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let s = |k: &str| m.get(k).map(|v| v.trim().to_string()).unwrap_or_default();
    UnitState {
        active_state: s("ActiveState"),
        sub_state: s("SubState"),
        result: s("Result"),
        exec_main_status: m.get("ExecMainStatus").and_then(|v| v.trim().parse().ok()),
        load_state: s("LoadState"),
    }
}

/// Whether `systemctl`'s stderr says systemd is not PID 1 (containers, WSL without systemd).
pub fn says_no_systemd(stderr: &str) -> bool {
    stderr.contains("not been booted with systemd") || stderr.contains("Failed to connect to bus")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::fixture;

    #[test]
    fn stopped_for_good_reconstructed() {
        let u = parse_show(&fixture("ubuntu2204-systemctl-show-stopped78.txt"));
        assert_eq!(u.load_state, "loaded");
        assert_eq!(u.active_state, "failed");
        assert_eq!(u.result, "exit-code");
        assert_eq!(u.exec_main_status, Some(78));
    }

    #[test]
    fn running_reconstructed() {
        let u = parse_show(&fixture("ubuntu2204-systemctl-show-active.txt"));
        assert_eq!((u.active_state.as_str(), u.sub_state.as_str()), ("active", "running"));
        assert_eq!(u.exec_main_status, Some(0));
    }

    #[test]
    fn no_systemd_captured() {
        // Captured on this Debian 12 container, where PID 1 is not systemd.
        let err = fixture("debian12-systemctl-nosystemd.txt");
        assert!(says_no_systemd(&err));
        assert_eq!(parse_show(&err), UnitState::default());
        assert!(!says_no_systemd("ActiveState=active\n"));
    }
}
