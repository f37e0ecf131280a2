//! The systemd unit the installer writes to `/etc/systemd/system/gpum-agent.service`.
//!
//! It lives next to the agent because its exit-code contract is the agent's: `Restart=always`
//! brings the agent back after a `restart` command ([`crate::run::EXIT_RESTART`]) or a crash,
//! and `RestartPreventExitStatus=78` leaves it stopped for good after a revocation or a
//! configuration error.

/// The unit file's text.
pub const UNIT: &str = include_str!("../gpum-agent.service");

#[cfg(test)]
mod tests {
    use super::*;

    fn value(key: &str) -> Vec<&'static str> {
        UNIT.lines().filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('='))).collect()
    }

    #[test]
    fn restart_contract() {
        assert_eq!(value("ExecStart"), ["/opt/gpum-agent/gpum-agent run"]);
        assert_eq!(value("Restart"), ["always"]);
        assert_eq!(value("RestartPreventExitStatus"), [gpum_common::exit::STOPPED_FOR_GOOD.to_string()]);
        let restart = crate::run::EXIT_RESTART;
        assert!(restart != 0 && restart != gpum_common::exit::STOPPED_FOR_GOOD);
        // systemd kills after TimeoutStopSec; the agent's own grace must end first.
        let stop: u64 = value("TimeoutStopSec")[0].parse().unwrap();
        assert!(crate::run::STOP_GRACE.as_secs() < stop && crate::run::STOP_GRACE.as_secs() < 10);
    }

    #[test]
    fn hardened_and_writes_only_its_own_directories() {
        assert_eq!(value("ProtectSystem"), ["strict"]);
        assert_eq!(value("NoNewPrivileges"), ["yes"]);
        assert_eq!(value("ReadWritePaths"), ["/var/lib/gpum-agent /etc/gpum-agent"]);
        assert!(value("ProtectHostname").is_empty(), "the inventory must see hostname changes");
    }
}
