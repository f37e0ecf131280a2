//! Every environment variable gpum reads, in one place.
//!
//! No secret is ever read from the environment: tokens and join codes that arrive this way
//! would be visible in `/proc/<pid>/environ`. The one exception the seed needs is
//! [`GPUM_JOIN_CODE`]: a join code is single-use and short-lived, and the installer accepts it
//! there for scripted installs, preferring stdin.

/// Locale, most specific first.
pub const LC_ALL: &str = "LC_ALL";
pub const LC_MESSAGES: &str = "LC_MESSAGES";
pub const LANG: &str = "LANG";
/// Where temporary files go (`/tmp` when unset).
pub const TMPDIR: &str = "TMPDIR";
/// A join code for the installer when `--code` is not given.
pub const GPUM_JOIN_CODE: &str = "GPUM_JOIN_CODE";
/// The installer's flags, for unattended installs (cloud-init, Ansible): `--server`, `--lang`,
/// `--ca-file`, `--yes`, `--allow-downgrade`. docs/install.md lists them.
pub const GPUM_SERVER: &str = "GPUM_SERVER";
pub const GPUM_LANG: &str = "GPUM_LANG";
pub const GPUM_CA_FILE: &str = "GPUM_CA_FILE";
pub const GPUM_YES: &str = "GPUM_YES";
pub const GPUM_ALLOW_DOWNGRADE: &str = "GPUM_ALLOW_DOWNGRADE";
pub const GPUM_PROBE_REGISTRIES: &str = "GPUM_PROBE_REGISTRIES";
/// Proxy variables the installer passes on to the service. reqwest reads them for the agent's
/// requests, and the tunnel's client follows the same rules (`http::PostClient::through_env_proxy`,
/// through hyper-util's `Matcher::from_env`, which reqwest uses): `HTTPS_PROXY` for https,
/// `HTTP_PROXY` for http, `ALL_PROXY` for both, `NO_PROXY` for the exceptions.
pub const PROXY_VARS: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];
/// Log filter for the agent and platform (tracing's `EnvFilter` syntax).
pub const GPUM_LOG: &str = "GPUM_LOG";
/// Set to anything but empty: no colour in the platform's log, even on a terminal
/// (<https://no-color.org>; `gpum_common::log::colour`).
pub const NO_COLOR: &str = "NO_COLOR";
/// TEST ONLY: another NVML library (the simulated one) for the installer's audit and the agent's
/// inventory. Read only by builds with the `test-knobs` feature (`gpum_preflight::gpu::nvml_lib`,
/// `gpum_enroll::inventory::nvml_lib`); a release build never reads it, so no environment can
/// make it load a library of someone else's choosing.
pub const GPUM_NVML_LIB: &str = "GPUM_NVML_LIB";
/// TEST ONLY (read by `test-knobs` builds of the agent): the least seconds between two GPU probe
/// starts instead of 60, so that an end-to-end test can watch a held-back `recheck` run.
pub const GPUM_TEST_PROBE_GAP_SECS: &str = "GPUM_TEST_PROBE_GAP_SECS";
/// The Docker socket the agent talks to (default `/var/run/docker.sock`).
pub const DOCKER_HOST: &str = "DOCKER_HOST";
/// Where programs are looked up (the preflight audit looks for `docker` and `nvidia-ctk` without
/// running them).
pub const PATH: &str = "PATH";

/// Where temporary files go when [`TMPDIR`] is unset or empty.
pub const DEFAULT_TMPDIR: &str = "/tmp";

/// `$TMPDIR` when it is set and non-empty (an empty value means unset, as for `mktemp`). The
/// installer downloads there and the audit checks that directory's mount, so both read it here.
pub fn tmpdir(host: &dyn crate::Host) -> Option<std::path::PathBuf> {
    host.env(TMPDIR).filter(|d| !d.is_empty()).map(std::path::PathBuf::from)
}

/// Docker's default Unix socket, used when [`DOCKER_HOST`] is unset.
pub const DEFAULT_DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// The socket `$DOCKER_HOST` names: `None` when unset or empty, `Err` when it is not a
/// `unix://` URL (gpum asks Docker only over its Unix socket, never over the network). The audit
/// and the agent both read it here.
pub fn docker_host_socket(host: &dyn crate::Host) -> Option<Result<std::path::PathBuf, String>> {
    let h = host.env(DOCKER_HOST).filter(|h| !h.is_empty())?;
    Some(match h.strip_prefix("unix://") {
        Some(p) => Ok(p.into()),
        None => Err(format!("DOCKER_HOST={h} is not a Unix socket")),
    })
}

#[cfg(test)]
mod tests {
    use crate::fake::FakeHost;

    #[test]
    fn tmpdir_empty_means_unset() {
        assert_eq!(super::tmpdir(&FakeHost::new()), None);
        assert_eq!(super::tmpdir(&FakeHost::new().env_var("TMPDIR", "")), None);
        assert_eq!(super::tmpdir(&FakeHost::new().env_var("TMPDIR", "/var/tmp")), Some("/var/tmp".into()));
    }

    #[test]
    fn docker_host_only_as_a_unix_socket() {
        assert_eq!(super::docker_host_socket(&FakeHost::new()), None);
        assert_eq!(super::docker_host_socket(&FakeHost::new().env_var("DOCKER_HOST", "")), None);
        let h = FakeHost::new().env_var("DOCKER_HOST", "unix:///run/alt.sock");
        assert_eq!(super::docker_host_socket(&h), Some(Ok("/run/alt.sock".into())));
        let h = FakeHost::new().env_var("DOCKER_HOST", "tcp://10.0.0.1:2375");
        assert!(matches!(super::docker_host_socket(&h), Some(Err(e)) if e.contains("tcp://10.0.0.1:2375")));
    }
}
