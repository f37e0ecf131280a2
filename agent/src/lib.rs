//! gpum-agent: the service on a GPU owner's machine, and its CLI.
//!
//! The binary (`src/main.rs`) only calls [`cli::main`]. The pieces, in the order a heartbeat
//! meets them: [`config`] (the 0600 file with the token, wrapped in [`secret::Token`]),
//! [`inventory`] (NVML, sysinfo, `/proc`, os-release; the CPU load from [`cpu`]), [`client`]
//! (HTTPS to the platform and the one decision of which failures are final), [`backoff`] (how
//! to retry), [`core`] (the service's rules, without I/O), [`run`] (the event loop that routes
//! them), [`state`] (`state.json` for `status`), and [`docker`]
//! (probe and reconciler).
//!
//! [`client`], [`config`], [`cpu`], [`inventory`], [`register`], [`secret`], [`state`] and
//! [`unit`] are gpum-enroll's, which the installer shares without the Docker client and the run
//! loop; they are re-exported here under their old paths.
//! `docs/agent.md` is the user's view; ARCHITECTURE.md lists what the agent never does.

pub use gpum_enroll::{client, config, cpu, inventory, register, secret, state, unit};

pub mod alarm;
pub mod backoff;
pub mod cli;
pub mod core;
pub mod docker;
pub mod doctor;
pub mod egress;
pub mod outbox;
pub mod run;
pub mod smoke;
pub mod status;
pub mod text;
pub mod tunnel;
pub mod uninstall;
pub mod upgrade;
