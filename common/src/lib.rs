//! What gpum says to people, and with which exit code.
//!
//! [`Failure`] is the one enum that maps every failure of the installer and the agent CLI to
//! its exit code ([`Failure::code`]) and its message ([`Failure::message`]), generated from one
//! table with one row per failure (`msg.rs`). The Russian texts
//! follow the owner's guide (`shared/seeds/003_…txt`) word for word; each says what to do next.
//! Binaries call [`report`] once, at the end. [`guide`] renders all of it as the owner's
//! guides' table of messages and exit codes. Every other text a crate prints is in its own
//! [`texts!`] table ([`texts`]).

pub mod agent_state;
pub mod guide;
mod lang;
#[cfg(feature = "log")]
pub mod log;
mod msg;
pub mod text;
pub mod texts;

pub use lang::{Lang, detect_lang};
pub use msg::{Failure, FailureKind};

/// The documented exit codes, in one place.
pub mod exit {
    pub const OK: i32 = 0;
    /// Anything else (agent `smoke`, unexpected internal errors).
    pub const OTHER: i32 = 1;
    pub const USAGE: i32 = 2;
    /// Agent `smoke`: no answer within 10 s.
    pub const SMOKE_TIMEOUT: i32 = 3;
    /// Agent `smoke`: the server rejected the token.
    pub const SMOKE_TOKEN_REJECTED: i32 = 4;
    pub const PREFLIGHT: i32 = 10;
    pub const NOT_ROOT: i32 = 13;
    pub const NO_SYSTEMD: i32 = 14;
    pub const DOWNLOAD: i32 = 20;
    /// The install could not set up Docker or the NVIDIA Container Toolkit (apt, daemon.json, or
    /// applying Docker's settings failed).
    pub const SETUP: i32 = 30;
    pub const GPU_NOT_IN_CONTAINER: i32 = 31;
    pub const JOIN_CODE: i32 = 40;
    pub const SERVICE: i32 = 50;
    /// `gpum-agent run` after a `restart` command (`gpum_agent::run::EXIT_RESTART` is this):
    /// neither 0 nor 78, so systemd's `Restart=always` starts it again.
    pub const RESTART: i32 = 75;
    /// sysexits' EX_CONFIG: the agent stopped for good; systemd must not restart it.
    pub const STOPPED_FOR_GOOD: i32 = 78;
}

/// Prints a failure to stderr in `lang` and returns its exit code.
pub fn report(f: &Failure, lang: Lang) -> i32 {
    eprintln!("{}", f.message(lang));
    f.code()
}
