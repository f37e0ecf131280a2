//! The systemd unit the installer writes to `/etc/systemd/system/gpum-agent.service`.
//!
//! Its exit-code contract is the agent's: `Restart=always` brings the agent back after a
//! `restart` command (exit [`gpum_common::exit::RESTART`], the agent's `EXIT_RESTART`) or a crash,
//! and `RestartPreventExitStatus=78` leaves it stopped for good after a revocation or a
//! configuration error. Its `TimeoutStopSec` bounds the agent's [`STOP_GRACE`].

use std::time::Duration;

/// The unit file's text.
pub const UNIT: &str = include_str!("../gpum-agent.service");

/// How long a step in flight may run after SIGTERM before the agent exits anyway. Well below
/// systemd's default 90 s and the 10 s the owner's guide promises, and below the unit's
/// `TimeoutStopSec`, after which systemd kills the agent.
pub const STOP_GRACE: Duration = Duration::from_secs(8);

/// The drop-in that gives the service the proxy variables the installer was run with. It holds
/// no value, only the [`PROXY_ENV`] file's name: `systemctl show` prints a unit's `Environment=`
/// lines to every local user, and a proxy URL may carry a user name and a password.
pub const PROXY_DROP_IN: &str = "/etc/systemd/system/gpum-agent.service.d/proxy.conf";
/// The proxy variables themselves: root's, 0600 (written with that mode from the first byte),
/// read by systemd when it starts the service. `uninstall` removes it with `/etc/gpum-agent`.
pub const PROXY_ENV: &str = "/etc/gpum-agent/proxy.env";

/// The text of [`PROXY_DROP_IN`]. The `-` lets the service start when the file is gone (after
/// an `uninstall`, which keeps the drop-in, and a later install without a proxy).
pub fn proxy_drop_in() -> String {
    format!(
        "# Written by gpum-install: the proxy variables it was run with are in {PROXY_ENV} (0600).\n\
         [Service]\nEnvironmentFile=-{PROXY_ENV}\n"
    )
}

/// The text of [`PROXY_ENV`]: one `NAME="value"` line per variable, in systemd's
/// `EnvironmentFile=` syntax, where a double-quoted value keeps every character but `"`, `\`,
/// `` ` `` and `$`, which are escaped with a backslash.
pub fn proxy_env(vars: &[(String, String)]) -> String {
    let mut s = String::from("# Written by gpum-install: the proxy variables it was run with.\n");
    for (k, v) in vars {
        let mut q = String::with_capacity(v.len() + 2);
        for c in v.chars() {
            if matches!(c, '"' | '\\' | '`' | '$') {
                q.push('\\');
            }
            q.push(c);
        }
        s.push_str(&format!("{k}=\"{q}\"\n"));
    }
    s
}

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
        let restart = gpum_common::exit::RESTART;
        assert!(restart != 0 && restart != gpum_common::exit::STOPPED_FOR_GOOD);
        // systemd kills after TimeoutStopSec; the agent's own grace must end first.
        let stop: u64 = value("TimeoutStopSec")[0].parse().unwrap();
        assert!(STOP_GRACE.as_secs() < stop && STOP_GRACE.as_secs() < 10);
    }

    /// Issue 29, item 9: `systemctl show` prints `Environment=` to every user. The drop-in names
    /// the 0600 file and holds no value; the file holds the values, quoted for systemd.
    #[test]
    fn proxy_values_live_in_the_environment_file_not_the_drop_in() {
        let vars = vec![
            ("HTTPS_PROXY".to_string(), "http://user:s3cr\"t$x`\\@proxy:3128".to_string()),
            ("NO_PROXY".to_string(), "localhost,127.0.0.1".to_string()),
        ];
        let drop_in = proxy_drop_in();
        assert!(!drop_in.contains("s3cr") && !drop_in.contains("Environment="), "{drop_in}");
        assert!(drop_in.lines().any(|l| l == format!("EnvironmentFile=-{PROXY_ENV}")), "{drop_in}");
        assert!(PROXY_ENV.starts_with("/etc/gpum-agent/"), "removed by uninstall with the config");
        let env = proxy_env(&vars);
        let lines: Vec<&str> = env.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [r#"HTTPS_PROXY="http://user:s3cr\"t\$x\`\\@proxy:3128""#, r#"NO_PROXY="localhost,127.0.0.1""#]
        );
    }

    #[test]
    fn hardened_and_writes_only_its_own_directories() {
        assert_eq!(value("ProtectSystem"), ["strict"]);
        assert_eq!(value("NoNewPrivileges"), ["yes"]);
        assert_eq!(value("ReadWritePaths"), ["/var/lib/gpum-agent /etc/gpum-agent /opt/gpum-agent"]);
        assert!(value("ProtectHostname").is_empty(), "the inventory must see hostname changes");
        // `nft` for the rentals' egress table needs CAP_NET_ADMIN and netlink; nothing else.
        assert_eq!(value("CapabilityBoundingSet"), ["CAP_NET_ADMIN"]);
        assert_eq!(value("AmbientCapabilities"), [""]);
        assert!(value("RestrictAddressFamilies")[0].split(' ').any(|f| f == "AF_NETLINK"));
    }
}
