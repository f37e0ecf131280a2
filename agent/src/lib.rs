//! gpum-agent: the service on a GPU owner's machine, and its CLI.
//!
//! The binary (`src/main.rs`) only calls [`cli::main`]. The pieces, in the order a heartbeat
//! meets them: [`config`] (the 0600 file with the token, wrapped in [`secret::Token`]),
//! [`inventory`] (NVML, sysinfo, `/proc`, os-release; the CPU load from [`cpu`]), [`client`]
//! (HTTPS to the platform and the one decision of which failures are final), [`backoff`] (how
//! to retry), [`core`] (the service's rules, without I/O), [`run`] (the event loop that routes
//! them), [`state`] (`state.json` for `status`), and [`docker`]
//! (probe and reconciler).
//! `docs/agent.md` is the user's view; ARCHITECTURE.md lists what the agent never does.

pub mod alarm;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod config;
pub mod core;
pub mod cpu;
pub mod docker;
pub mod doctor;
pub mod inventory;
pub mod outbox;
pub mod register;
pub mod run;
pub mod secret;
pub mod smoke;
pub mod state;
pub mod status;
pub mod text;
pub mod uninstall;
pub mod unit;
