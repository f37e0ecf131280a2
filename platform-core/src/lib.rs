//! The platform's core (issue 44, items 1 and 5): the rules that decide, as pure functions.
//!
//! `gpum-platform` reads the database, calls a function here with what it read and the time
//! (`now` is always an argument), and writes what it answers. So every rule is tested in
//! microseconds, with examples and properties, and no database (the agent's `core.rs` is the
//! model).
//!
//! - [`heartbeat`]: what one heartbeat changes (inventory, events, probe, quarantine, sample,
//!   commands, rentals), as a plan.
//! - [`placement`]: whether a rental is placed on a server, and on which GPUs.
//! - [`rentable`]: rentable, or exactly why not.
//! - [`effects`]: what each operation ends that lives outside the database (the relay's
//!   tunnels and streams), as values.
//! - [`throttle`]: what a count of wrong secrets blocks, and for how long.
//! - [`metering`]: a rental's runs from the agent's reports, and what it is charged; the
//!   [`currency`] its amounts are in.
//! - [`maintenance`]: the windows an owner plans, in which no rental is placed (issue 46).
//! - [`occupancy`]: a server's GPUs rented, idle and not rentable (issue 46).
//! - [`reliability`]: the share of the last 30 days a server was online with its GPUs in
//!   order, from its heartbeat history (issue 46).
//!
//! - [`rollout`]: which nodes a release's rollout offers its version to, and when the
//!   failures halt it (issue 47).
//! - [`alerts`]: which incidents of a server open and end, for its owner's alerts (issue 46).
//!
//! Invariant: no I/O, no clock, no randomness; the dependencies are `gpum-protocol` and `sha2`
//! (`tests/tidy.rs` checks it).

pub mod alerts;
pub mod currency;
pub mod effects;
pub mod heartbeat;
pub mod maintenance;
pub mod metering;
pub mod occupancy;
pub mod placement;
pub mod reliability;
pub mod rentable;
pub mod rollout;
pub mod throttle;
