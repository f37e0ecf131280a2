//! The test host (issue 10, docs/testhost.md): a Debian 12 container with systemd as PID 1, apt
//! with local signed repositories, a real `dockerd` once installed, the real `gpum-platform` on
//! loopback with TLS, and the SIMULATED NVIDIA layer of `tests/sim/` — the only simulated part.
//!
//! - [`image`]: the host images, built by `tests/testhost/build-image.sh`, cached by recipe hash.
//! - [`host`]: one running host (start, exec, files, the platform's admin CLI, removal).
//! - [`stage`]: what the run mounts into every host at `/opt/gpum-e2e` (made by
//!   `cargo xtask e2e`; this module adds the TLS files).
//! - [`seed`]: the seed's failure titles, for the Russian comparisons.
//! - [`steps`]: what every scenario does on a host (the one-liner, the simulated GPU's file, the
//!   check image, the node list, waiting for a condition).
//! - [`rental`]: what every rental scenario needs (issue 33): a rentable node, the rental image,
//!   the platform's rentals, and the proof that nothing of one is left.
//! - [`lan`]: a made-up LAN and internet in network namespaces, for `rental-network`.
//! - [`tunnel`]: the platform in a network namespace of its own, a host with no inbound path and
//!   a tenant who reaches a rental only through the relay, for `rental-tunnel` (issue 34).
//! - [`upgrade`]: the staged releases, the operator's `releases` commands and the installed
//!   agent as the host shows it, for the upgrade scenarios (issue 47).
//!
//! The scenarios themselves are in `src/bin/gpum-e2e.rs`.

pub mod host;
pub mod image;
pub mod lan;
pub mod rental;
pub mod seed;
pub mod stage;
pub mod steps;
pub mod tunnel;
pub mod upgrade;

pub use host::{Host, HostOpts, Run};
pub use image::Images;
