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

pub mod client;
pub mod config;
pub mod cpu;
pub mod inventory;
pub mod register;
pub mod secret;
pub mod state;
pub mod unit;

/// The agent's version: what it registers with, reports in every heartbeat (issue 47), and
/// compares an offered upgrade with (strictly newer, or refused).
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
