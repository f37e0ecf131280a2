//! gpum-enroll: what the agent (`gpum-agent`) and its installer (`gpum-install`) both need, so
//! that the installer does not carry the agent's Docker client and run loop.
//!
//! [`register`] (a node's registration and the installer's enrollment) writes [`config`] (the
//! 0600 file with the token, wrapped in [`secret::Token`]) and the first [`state`] file; it
//! reaches the platform through [`client`] and sends the [`inventory`] (the CPU load from
//! [`cpu`]). [`unit`] is the service's systemd unit and the proxy drop-in the installer writes.
//!
//! Nothing here talks to Docker: the engine's version, which the inventory carries, is an input
//! the caller passes (the agent asks with its Docker client, the installer over the socket
//! through its host seam).

#[cfg(not(feature = "test-next-version"))]
macro_rules! agent_version {
    () => {
        env!("CARGO_PKG_VERSION")
    };
}
#[cfg(feature = "test-next-version")]
macro_rules! agent_version {
    () => {
        env!("GPUM_TEST_AGENT_VERSION")
    };
}

/// The agent's own version string, `MAJOR.MINOR.PATCH`, one for the whole agent: `--version`,
/// the start log, the client's user agent, the registration and every heartbeat's
/// `agent_version`, and the upgrade's "strictly newer than my own" rule (issue 47). It is the
/// workspace version, except with the feature `test-next-version` (TEST ONLY: the test hosts'
/// "version B" of the same tree, built by `cargo xtask e2e`), where it is the compile-time
/// variable `GPUM_TEST_AGENT_VERSION`. Release builds never have that feature (`cargo xtask
/// dist` refuses an agent whose user agent carries its marker: [`USER_AGENT`]).
pub const AGENT_VERSION: &str = agent_version!();

/// The HTTP user agent of the agent's and the installer's calls: `gpum-agent/VERSION`, and with
/// `test-next-version` a marker after it that `cargo xtask dist` looks for (`KNOB_MARKERS`).
#[cfg(not(feature = "test-next-version"))]
pub const USER_AGENT: &str = concat!("gpum-agent/", agent_version!());
#[cfg(feature = "test-next-version")]
pub const USER_AGENT: &str = concat!("gpum-agent/", agent_version!(), " (test-next-version)");

pub mod client;
pub mod config;
pub mod cpu;
pub mod inventory;
pub mod register;
pub mod secret;
pub mod state;
pub mod unit;

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `test-next-version` (every build but the test hosts' version B) the agent is the
    /// workspace's version, and its user agent carries no marker that `dist` refuses.
    #[test]
    #[cfg(not(feature = "test-next-version"))]
    fn the_agent_reports_the_workspace_version() {
        assert_eq!(AGENT_VERSION, env!("CARGO_PKG_VERSION"));
        assert_eq!(USER_AGENT, format!("gpum-agent/{AGENT_VERSION}"));
        assert!(!USER_AGENT.contains("test-next-version"));
    }

    /// With it, the compile-time version and the marker.
    #[test]
    #[cfg(feature = "test-next-version")]
    fn version_b_reports_its_own_version_and_the_marker() {
        assert_eq!(AGENT_VERSION, env!("GPUM_TEST_AGENT_VERSION"));
        assert_ne!(AGENT_VERSION, env!("CARGO_PKG_VERSION"));
        assert!(USER_AGENT.ends_with(" (test-next-version)"), "{USER_AGENT}");
    }
}
