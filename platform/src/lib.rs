//! gpum-platform: the reference control plane of the gpum protocol, on SQLite or PostgreSQL.
//!
//! It is the executable spec of `gpum-protocol` and what every end-to-end test runs against.
//! It runs on the operator's server, not on an owner's machine, so it does its own I/O instead
//! of going through the `gpum-host` seam.
//!
//! - [`store`]: schema, migrations and every operation over a [`sql::Conn`]; the HTTP
//!   admin API and the CLI both call it.
//! - [`sql`]: the seam to the engine, SQLite or PostgreSQL (issue 35): one SQL text per
//!   statement for both, values, rows, cached statements.
//! - [`pgurl`]: what a `postgres://` URL means: TLS (checked, or plain only on the machine or
//!   when asked), the password from a private file.
//! - [`accounts`]: owners, invitations, passwords (Argon2id), TOTP, dashboard sessions and API
//!   keys; every node and join code belongs to an owner or to the operator ([`store::Scope`]).
//! - [`rentals`]: tenant rentals (issue 33): validation, the operator's API, what the heartbeat
//!   carries and records.
//! - [`db`]: the database threads with group commit, used by the server.
//! - [`server`]: axum routes, authentication, error mapping, `Date`, downloads.
//! - [`throttle`]: the limit on guessing secrets, per door, address and account, shared by
//!   replicas through the database.
//! - [`alerts`]: alerts to owners (issue 46): the sweeper, e-mail and signed webhooks.
//! - [`web`]: the owner's dashboard, server-rendered HTML over the same `store` functions.
//! - [`cli`]: the `gpum-platform` command line.
//!
//! The rules themselves (a rental's placement, the rentable verdict, the effects' and the
//! throttle's rules) are pure functions in `gpum-platform-core`; this crate reads, calls them
//! and writes.
#![allow(clippy::disallowed_methods)]

pub mod accounts;
pub mod alerts;
pub mod cli;
pub mod clock;
pub mod db;
pub mod effects;
pub mod error;
pub mod install;
pub mod listen;
pub mod migrate;
pub mod pgurl;
pub mod relay;
/// The rentable verdict, a rule of the core (`gpum-platform-core`).
pub use gpum_platform_core::rentable;
pub mod rentals;
/// The platform's pure rules, from `gpum-platform-core` (issue 44, item 1).
pub mod rules {
    pub use gpum_platform_core::heartbeat;
}
pub mod schema;
pub mod server;
pub mod sql;
pub mod store;
#[cfg(any(test, feature = "test-knobs"))]
pub mod testdb;
pub mod throttle;
pub mod web;
