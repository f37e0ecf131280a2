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
/// Log filter for the agent and platform (tracing's `EnvFilter` syntax).
pub const GPUM_LOG: &str = "GPUM_LOG";
/// Overrides of where the installer looks for the simulated/real NVML library (tests only).
pub const GPUM_NVML_LIB: &str = "GPUM_NVML_LIB";
/// The Docker socket the agent talks to (default `/var/run/docker.sock`).
pub const DOCKER_HOST: &str = "DOCKER_HOST";
/// Where programs are looked up (the preflight audit looks for `docker` and `nvidia-ctk` without
/// running them).
pub const PATH: &str = "PATH";
