//! The gpum agent protocol, version 1. Wire types live only here.
//!
//! Every endpoint is under [`API_PREFIX`]. The agent only ever dials out; the platform never
//! connects to a node. `docs/protocol.md` describes each endpoint with examples.
//!
//! Compatibility rules: fields are added, never renamed; unknown fields are ignored on read
//! (no `deny_unknown_fields`), so an older agent keeps working against a newer platform.
//! Command kinds travel as strings so that an agent can refuse, and report, a kind it does not
//! know instead of failing to parse the whole heartbeat answer.

pub mod driver;
pub mod earnings;
pub mod image;
pub mod joincode;
pub mod registry;
#[cfg(feature = "tunnel")]
pub mod tunnel;

pub use earnings::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const API_PREFIX: &str = "/api/v1";
pub const PATH_REGISTER: &str = "/api/v1/agent/register";
/// The installer's first call: binds a join code to its install id (issue 29, item 2).
pub const PATH_ENROLL: &str = "/api/v1/agent/enroll";
pub const PATH_HEARTBEAT: &str = "/api/v1/agent/heartbeat";
/// A release's files for an agent's upgrade (issue 47): `upgrade::release_file_path`.
pub const PATH_AGENT_RELEASES: &str = "/api/v1/agent/releases";
pub const PATH_ADMIN_JOIN_CODES: &str = "/api/v1/admin/join-codes";
pub const PATH_ADMIN_NODES: &str = "/api/v1/admin/nodes";
pub const PATH_ADMIN_PROBE_IMAGE: &str = "/api/v1/admin/probe-image";
/// The operator's owners: POST invites one (a one-time link), GET lists them.
pub const PATH_ADMIN_OWNERS: &str = "/api/v1/admin/owners";
/// An owner's API (bearer: one of their API keys): the same operations as the admin API's
/// nodes and join codes, on their own servers only.
pub const PATH_OWNER_NODES: &str = "/api/v1/owner/nodes";
/// An owner's view of the rentals on their servers (read-only; the tenant's environment values
/// and command are left out).
pub const PATH_OWNER_RENTALS: &str = "/api/v1/owner/rentals";
pub const PATH_OWNER_JOIN_CODES: &str = "/api/v1/owner/join-codes";
/// The operator's rentals (issue 33): POST creates one, GET lists them (`?node=ID`: one node's).
pub const PATH_ADMIN_RENTALS: &str = "/api/v1/admin/rentals";
/// The registries rental images may come from: GET shows them, PUT sets them (`null`: the
/// defaults).
pub const PATH_ADMIN_RENTAL_REGISTRIES: &str = "/api/v1/admin/rental-registries";
/// The bootstrap script, with the platform URL filled in.
pub const PATH_INSTALL_SH: &str = "/install.sh";
/// Downloads: `/dl/<file>` (the installer, the agent, their `.sha256` and `.sig`).
pub const PATH_DOWNLOADS: &str = "/dl";
/// The agent's tunnel (issue 34): `GET` with `Upgrade: gpum-tunnel` and the node's bearer token;
/// `101` and then yamux over the connection (docs/protocol.md, "The tunnel").
pub const PATH_TUNNEL: &str = "/api/v1/agent/tunnel";
/// The `Upgrade` protocol token of [`PATH_TUNNEL`].
pub const TUNNEL_UPGRADE: &str = "gpum-tunnel";
/// The prefix of a rental's tunnel credential: `gpumt_` and 64 hex digits (256 random bits).
pub const TUNNEL_CREDENTIAL_PREFIX: &str = "gpumt_";

/// `/api/v1/admin/nodes/{id}`: DELETE removes the node.
pub fn path_admin_node(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}")
}
/// `/api/v1/admin/nodes/{id}/commands`: POST queues a command.
pub fn path_admin_node_commands(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}/commands")
}
/// `/api/v1/admin/nodes/{id}/rotate-token`: POST replaces the node's token.
pub fn path_admin_node_rotate_token(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}/rotate-token")
}
/// `/api/v1/admin/nodes/{id}/known-containers`: PUT sets the containers the platform knows.
pub fn path_admin_node_known_containers(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}/known-containers")
}

/// `/api/v1/admin/nodes/{id}/events`: GET gives the node's event log ([`NodeEvents`]).
pub fn path_admin_node_events(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}/events")
}
/// `/api/v1/admin/nodes/{id}/metrics`: GET gives the node's figures over the last day
/// ([`NodeMetrics`]).
pub fn path_admin_node_metrics(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}/metrics")
}

/// `/api/v1/admin/nodes/{id}/maintenance` (and the owner API's, under [`PATH_OWNER_NODES`]):
/// GET lists the node's maintenance windows not yet over ([`MaintenanceWindows`]), POST plans
/// one ([`CreateMaintenanceRequest`]; issue 46).
pub fn path_admin_node_maintenance(id: &str) -> String {
    format!("{PATH_ADMIN_NODES}/{id}/maintenance")
}
/// `/api/v1/owner/nodes/{id}/maintenance`: [`path_admin_node_maintenance`]'s, for the owner's own
/// servers.
pub fn path_owner_node_maintenance(id: &str) -> String {
    format!("{PATH_OWNER_NODES}/{id}/maintenance")
}

/// `/api/v1/admin/rentals/{id}`: GET shows one rental ([`RentalSummary`]).
pub fn path_admin_rental(id: &str) -> String {
    format!("{PATH_ADMIN_RENTALS}/{id}")
}
/// `/api/v1/admin/rentals/{id}/stop`: POST stops it (the platform stops listing it).
pub fn path_admin_rental_stop(id: &str) -> String {
    format!("{PATH_ADMIN_RENTALS}/{id}/stop")
}

/// The heartbeat interval the platform gives when not told otherwise.
pub const DEFAULT_HEARTBEAT_INTERVAL_SECS: u64 = 10;
/// A node with no heartbeat for this long is offline.
pub const OFFLINE_AFTER_SECS: u64 = 60;

/// Bounds on every list that crosses the wire, so that no single answer or request can wedge
/// either side or fill the platform's disk. Both sides enforce them: the sender never sends
/// more, the receiver refuses (or truncates, where stated) anything larger.
pub mod limits {
    /// Commands handed to an agent in one heartbeat answer; the rest wait for the next one.
    pub const MAX_COMMANDS_PER_RESPONSE: usize = 16;
    /// Command results in one heartbeat request. An agent holding more sends the oldest first.
    pub const MAX_COMMAND_RESULTS: usize = 64;
    /// Removed containers reported in one heartbeat request; the agent keeps the rest for later.
    pub const MAX_REMOVED_CONTAINERS: usize = 64;
    /// Managed container ids in one heartbeat request.
    pub const MAX_MANAGED_CONTAINERS: usize = 1024;
    /// Known container ids in one heartbeat answer.
    pub const MAX_KNOWN_CONTAINERS: usize = 1024;
    /// GPUs in one inventory.
    pub const MAX_GPUS: usize = 64;
    /// Removed-container records the platform keeps per node (older ones are pruned).
    pub const MAX_REMOVED_HISTORY_PER_NODE: usize = 256;
    /// Length of any free-text string field (names, messages, versions) the platform stores.
    pub const MAX_TEXT_LEN: usize = 1024;
    // The numbers of an inventory (`Inventory::check_ranges`): far above any real machine, and
    // low enough that no sum of them a page or a listing makes can overflow.
    /// One GPU's memory, in MiB (16 TiB).
    pub const MAX_VRAM_MIB: u64 = 16 << 20;
    /// A machine's memory, in MiB (1 PiB).
    pub const MAX_RAM_MIB: u64 = 1 << 30;
    /// Free space for Docker's data root, in GiB (1 EiB).
    pub const MAX_DISK_GIB: u64 = 1 << 30;
    /// A machine's logical CPUs.
    pub const MAX_CPU_CORES: u32 = 1 << 16;
    /// Repeats of one join code by the install id it is bound to (enrollments and registrations
    /// after the first of each); past it the code answers `join_code_used`. An interrupted install
    /// is run again a few times, not thousands.
    pub const MAX_CODE_REPEATS: u32 = 32;
    /// Maintenance windows not yet over that one server holds (issue 46).
    pub const MAX_MAINTENANCE_WINDOWS_PER_NODE: usize = 32;
    /// How far ahead a maintenance window may end: 366 days, the longest rental.
    pub const MAX_MAINTENANCE_AHEAD_SECS: u64 = 366 * 86_400;
    /// Replaced tokens the platform remembers per node, the newest ones, so that their agents are
    /// told `token_replaced`; an older one gets `unauthorized`.
    pub const MAX_REPLACED_TOKENS_PER_NODE: usize = 16;
    /// Rentals on one node at once (each holds at least one GPU of it).
    pub const MAX_RENTALS_PER_NODE: usize = 64;
    /// Environment variables of one rental, and the bytes of each name and value.
    pub const MAX_RENTAL_ENV: usize = 128;
    pub const MAX_RENTAL_ENV_BYTES: usize = 4096;
    /// Arguments of a rental's command, and the bytes of each.
    pub const MAX_RENTAL_ARGS: usize = 256;
    pub const MAX_RENTAL_ARG_BYTES: usize = 4096;
    /// Rental reports in one heartbeat request: the live ones and those that ended since.
    pub const MAX_RENTAL_REPORTS: usize = 2 * MAX_RENTALS_PER_NODE;
    /// Container ports one rental exposes through the tunnel.
    pub const MAX_RENTAL_PORTS: usize = 8;
    /// The first line of a tunnel stream ([`super::TunnelOpen`], [`super::TunnelReply`]), in
    /// bytes with its newline: a longer one is refused.
    pub const MAX_TUNNEL_LINE: usize = 512;
}

// ---------------------------------------------------------------------------------------------
// Inventory

/// What renters may see: the listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PublicInventory {
    pub gpus: Vec<GpuPublic>,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub ram_mib: u64,
    /// Free space for Docker's data root, in GiB.
    pub disk_gib: u64,
    /// Whether a rental's disk can have a hard limit here: Docker's data root is on XFS mounted
    /// with project quotas (what overlay2's `--storage-opt size=` needs). `None` from agents that
    /// do not say, or when the mounts could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rental_disk_limit: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPublic {
    pub model: String,
    pub vram_mib: u64,
}

/// What only the owner sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PrivateInventory {
    pub hostname: String,
    pub gpu_uuids: Vec<String>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    /// `PRETTY_NAME` of os-release.
    pub os: String,
    pub kernel: String,
    pub docker_version: Option<String>,
    pub toolkit_version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Inventory {
    pub public: PublicInventory,
    pub private: PrivateInventory,
}

impl Inventory {
    /// A stable hash of the inventory (SHA-256 of its JSON, hex). The agent resends the full
    /// inventory only when this changes.
    pub fn hash(&self) -> String {
        self.json_and_hash().1
    }

    /// Whether its numbers are in range ([`limits::MAX_VRAM_MIB`], [`limits::MAX_RAM_MIB`],
    /// [`limits::MAX_DISK_GIB`], [`limits::MAX_CPU_CORES`]); `Err` names the first one that is
    /// not. The platform refuses an inventory that fails it (`invalid_request`), as it refuses
    /// a list over its limit: a node's inventory is written by whoever holds a join code.
    pub fn check_ranges(&self) -> Result<(), String> {
        let p = &self.public;
        let over =
            |what: &str, v: u64, max: u64| (v > max).then(|| format!("{what}: at most {max}, got {v}"));
        let first = p
            .gpus
            .iter()
            .find_map(|g| over("gpus[].vram_mib", g.vram_mib, limits::MAX_VRAM_MIB))
            .or_else(|| over("ram_mib", p.ram_mib, limits::MAX_RAM_MIB))
            .or_else(|| over("disk_gib", p.disk_gib, limits::MAX_DISK_GIB))
            .or_else(|| over("cpu_cores", p.cpu_cores.into(), limits::MAX_CPU_CORES.into()));
        first.map_or(Ok(()), Err)
    }

    /// The inventory's JSON and its [`Inventory::hash`], from one serialization (for a caller
    /// that stores both).
    pub fn json_and_hash(&self) -> (String, String) {
        let json = serde_json::to_string(self).expect("inventory serializes");
        let hash = hex::encode(Sha256::digest(json.as_bytes()));
        (json, hash)
    }
}

// ---------------------------------------------------------------------------------------------
// Register

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub join_code: String,
    pub agent_version: String,
    pub inventory: Inventory,
    /// A random id the installer writes (0600) before it registers, 32 hex digits. A repeat of
    /// the same join code with the same install id, within the code's lifetime, gets the same
    /// node and a fresh token (the first token is revoked), so a crash between the platform's
    /// answer and the token reaching `config.toml` never strands the owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_id: Option<String>,
}

/// `POST /api/v1/agent/enroll`: the installer's first call to the platform, before apt. It binds
/// the join code to the install id, a 128-bit secret the installer keeps in a root-only 0600
/// file; from then on the code registers only together with that install id. A code seen in a
/// process list after this call is useless to anyone else. A repeat with the same install id is
/// accepted (a re-run of an interrupted install), up to `limits::MAX_CODE_REPEATS` times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollRequest {
    pub join_code: String,
    /// 32 hexadecimal digits, as in [`RegisterRequest::install_id`].
    pub install_id: String,
}

/// The answer to [`EnrollRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollResponse {
    /// Until when (Unix seconds) the bound code can register: the code's own expiry, or at
    /// least `ENROLL_GRACE_SECS` after the enrollment, so that a long install never outlives it.
    pub expires_at: u64,
}

/// The least time an enrolled code stays valid for its install id, whatever its own expiry.
pub const ENROLL_GRACE_SECS: u64 = 6 * 3600;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub node_id: String,
    /// 256-bit random, hex. Shown once; the platform keeps only its SHA-256.
    pub node_token: String,
    pub heartbeat_interval_secs: u64,
    pub probe_image: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Heartbeat

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HeartbeatRequest {
    /// Increases by one per heartbeat since the agent started.
    pub seq: u64,
    pub inventory_hash: String,
    /// Present only when the hash changed since the last accepted heartbeat (and on the first).
    pub inventory: Option<Inventory>,
    pub metrics: Metrics,
    /// The latest GPU probe result, if any probe has run.
    pub probe: Option<ProbeReport>,
    /// Ids of the `gpum.managed=true` containers present, running or stopped.
    pub managed_containers: Vec<String>,
    /// Containers the agent removed since the last heartbeat.
    pub removed_containers: Vec<RemovedContainer>,
    pub command_results: Vec<CommandResult>,
    /// Health of the agent's dependencies.
    pub health: Health,
    /// What became of each rental the agent runs or ran since the last accepted heartbeat (issue
    /// 33). Absent from older agents.
    #[serde(default)]
    pub rentals: Vec<RentalReport>,
    /// Present while the node is quarantined: a GPU check after a rental's teardown (or the
    /// self-test before GPUs change hands) failed, and no rental starts until a recheck passes
    /// (issue 33). Sent in every heartbeat while it lasts; absent (older agents too): not
    /// quarantined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
    /// The version this agent runs (issue 47), in every heartbeat, so the platform sees an
    /// upgrade or a rollback at once. Absent from older agents: the platform keeps the version
    /// the registration named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Whether the agent's `config.toml` allows automatic upgrades (`auto_update`, default
    /// true). Absent from older agents, which cannot upgrade themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_update: Option<bool>,
    /// The last upgrade attempt's result, until a heartbeat carrying it is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeReport>,
}

/// Why a node is quarantined: no rental starts on it until a recheck finds its GPUs free and
/// answering and the GPU probe passing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    /// Short text: which GPU, and what was wrong (a process left on it, or it did not answer);
    /// at most [`limits::MAX_TEXT_LEN`] bytes are kept.
    pub reason: String,
    /// Unix seconds (the agent's clock) when the check failed.
    pub since: u64,
    /// The GPUs the failed check was about, by UUID (at most [`limits::MAX_GPUS`]).
    #[serde(default)]
    pub gpu_uuids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Metrics {
    /// Whole-machine CPU load, percent of all cores.
    #[serde(deserialize_with = "finite_f32")]
    pub cpu_load_pct: f32,
    pub ram_used_mib: u64,
    pub ram_total_mib: u64,
    pub disk_free_gib: u64,
    pub gpus: Vec<GpuMetrics>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuMetrics {
    pub index: u32,
    pub util_pct: u32,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    pub temp_c: u32,
    #[serde(deserialize_with = "finite_f32")]
    pub power_w: f32,
}

/// An `f32` that is a real number. JSON has no infinity, but `1e47` parses into an `f32` as one,
/// and serde_json writes it back as `null`, which would then fail to parse wherever it is read
/// again: such a value is refused where it enters.
fn finite_f32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    let v = f64::deserialize(d)?;
    let f = v as f32;
    if f.is_finite() { Ok(f) } else { Err(serde::de::Error::custom(format!("{v} is out of range"))) }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Health {
    /// The Docker engine answered.
    pub docker_ok: bool,
    /// Why Docker did not answer.
    pub docker_error: Option<String>,
    pub nvml: NvmlState,
    /// Seconds the agent's clock is ahead (+) or behind (-) the platform's `Date`, when more
    /// than a few seconds.
    pub clock_skew_secs: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NvmlState {
    Ok,
    /// libnvidia-ml could not be loaded: no driver.
    #[default]
    LibraryMissing,
    DriverLibraryMismatch,
    NoDevices,
    Error,
}

/// A unit enum whose every string form (serde's, `as_str`'s and `Display`'s) is the one literal written next to its variant, so no second table of names can
/// drift from the wire's.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Serialize, Deserialize)]
        $vis enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &[$name] = &[$($name::$variant,)+];

            /// The variant's name on the wire (and in the agent's `state.json`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The variant named `s` on the wire, if any ([`Self::as_str`]'s inverse).
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

// After the macro: its states are `named_enum!`s.
pub mod alerts;
pub use alerts::*;
pub mod upgrade;
pub use upgrade::{
    HaltReason, MIN_ROLLOUT_STEP_SECS, NodeUpgrades, PATH_ADMIN_RELEASES, ReleaseList, ReleaseSummary,
    RolloutRequest, RolloutState, RolloutStep, RolloutSummary, UpgradeOffer, UpgradeOutcome, UpgradeReport,
};

named_enum! {
    /// The platform's verdict on the hardware, as dashboards show it. The agent's `state.json`
    /// records the latest probe's with the same names.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub enum VerificationState {
        /// No probe image chosen yet, or no probe ran yet. Not an error.
        #[default]
        AwaitingCheck = "awaiting_check",
        Verified = "verified",
        Failed = "failed",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    pub state: VerificationState,
    pub reason: Option<ProbeFailure>,
    /// Combined output of the probe, truncated to [`PROBE_OUTPUT_MAX`] bytes.
    pub output: String,
    /// Unix seconds when the probe finished.
    pub finished_at: u64,
    pub image: String,
}

/// The most probe output a heartbeat carries.
pub const PROBE_OUTPUT_MAX: usize = 4096;

named_enum! {
    /// Why a GPU probe failed.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ProbeFailure {
        NoNvidiaRuntime = "no_nvidia_runtime",
        DeviceRequestRefused = "device_request_refused",
        NvidiaSmiFailed = "nvidia_smi_failed",
        NvmlUnknownError = "nvml_unknown_error",
        DriverLibraryMismatch = "driver_library_mismatch",
        ImagePullFailed = "image_pull_failed",
        Timeout = "timeout",
        DockerUnavailable = "docker_unavailable",
        /// The probe image is not pinned by digest (`name@sha256:<64 hex>`); nothing was pulled.
        ImageNotPinned = "image_not_pinned",
        /// The probe image's registry is not one the node accepts; nothing was pulled.
        RegistryNotAccepted = "registry_not_accepted",
    }
}

/// Why an agent removes a managed container: the platform does not know it. The dashboard shows
/// this reason in the owner's language; any other as it came.
pub const REMOVAL_REASON_UNKNOWN: &str = "unknown to the platform";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedContainer {
    pub id: String,
    pub name: String,
    pub reason: String,
}

/// A command from the platform. `kind` is one of [`CommandKind`]'s names; any other is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub id: String,
    pub kind: String,
}

named_enum! {
    /// The fixed list of commands an agent obeys.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum CommandKind {
        /// Re-run the GPU probe.
        Recheck = "recheck",
        /// Exit so that systemd starts the agent again.
        Restart = "restart",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResult {
    pub id: String,
    pub ok: bool,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct HeartbeatResponse {
    pub heartbeat_interval_secs: u64,
    pub commands: Vec<Command>,
    /// The `gpum.managed=true` container ids the platform knows; the agent removes the others
    /// after a grace period.
    pub known_containers: Vec<String>,
    pub probe_image: Option<String>,
    /// The platform holds no inventory matching `inventory_hash` (it lost it, or the agent
    /// skipped it): send the full inventory with the next heartbeat.
    #[serde(default)]
    pub send_inventory: bool,
    /// The rentals the platform wants on this node, whole, on every answer (issue 33): the agent
    /// runs exactly these and tears down any other rental container of its own. Older agents
    /// ignore it.
    #[serde(default)]
    pub rentals: Vec<RentalSpec>,
    /// The version the platform wants this node to run (issue 47): only while the node is in
    /// an active rollout and automatic upgrades are on for it. Older agents ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeOffer>,
}

// ---------------------------------------------------------------------------------------------
// Errors

/// Every error body: `{"error":{"code":"…","message":"…"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

/// Stable error codes. Listed, with their HTTP statuses, in docs/protocol.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the body is not valid JSON for this endpoint.
    InvalidJson,
    /// 400: a field has a bad value.
    InvalidRequest,
    /// 413
    PayloadTooLarge,
    /// 408: the request body did not arrive within the platform's body timeout.
    RequestTimeout,
    /// 400: the join code fails its format or check character.
    JoinCodeMalformed,
    /// 403
    JoinCodeUnknown,
    /// 403
    JoinCodeExpired,
    /// 403
    JoinCodeUsed,
    /// 409
    GpuAlreadyRegistered,
    /// 409: a command for a server that is offline; nothing was queued (a command reaches the
    /// agent only at its heartbeat).
    NodeOffline,
    /// 409: a rental for a server that cannot take one now (its owner disabled, offline, not
    /// verified, paused, not for rent, or already holding its limit of rentals), or that would
    /// overlap a maintenance window its owner planned (issue 46; the message names the window);
    /// the message names the server's rentable state. Nothing was created.
    NodeNotRentable,
    /// 409: the rental asks for more GPUs than the server has free, or for a GPU that is not the
    /// server's or that another live rental holds. Nothing was created.
    GpusUnavailable,
    /// 409: the owner holds the most open join codes or servers the operator allows
    /// (`gpum-platform owners limits`), or a server holds its limit of maintenance windows
    /// (issue 46); nothing was created, and a join code is not used up.
    OwnerLimitReached,
    /// 401: no token, or a token the platform never issued.
    Unauthorized,
    /// 401: the node's token was replaced. The agent stops for good.
    TokenReplaced,
    /// 410: the node was deleted. The agent stops for good.
    NodeDeleted,
    /// 401 on admin endpoints.
    AdminUnauthorized,
    /// 404
    NotFound,
    /// 405
    MethodNotAllowed,
    /// 429: too many wrong admin tokens from this address; wait `Retry-After` seconds.
    TooManyRequests,
    /// 500
    Internal,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidJson | InvalidRequest | JoinCodeMalformed => 400,
            PayloadTooLarge => 413,
            RequestTimeout => 408,
            JoinCodeUnknown | JoinCodeExpired | JoinCodeUsed => 403,
            GpuAlreadyRegistered | NodeOffline | NodeNotRentable | GpusUnavailable | OwnerLimitReached => 409,
            Unauthorized | TokenReplaced | AdminUnauthorized => 401,
            NodeDeleted => 410,
            NotFound => 404,
            MethodNotAllowed => 405,
            TooManyRequests => 429,
            Internal => 500,
        }
    }
    /// The only two answers on which an agent stops for good.
    pub fn is_revocation(self) -> bool {
        matches!(self, ErrorCode::NodeDeleted | ErrorCode::TokenReplaced)
    }
}

// ---------------------------------------------------------------------------------------------
// Admin

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CreateJoinCodeRequest {
    /// Seconds until the code expires; 24 h when absent.
    pub ttl_secs: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinCodeCreated {
    pub code: String,
    /// Unix seconds.
    pub expires_at: u64,
}

// `Default` is an empty summary for fixtures; it has a `min_rental_minutes` of 0, where a decoded
// one without the field has 60.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub id: String,
    pub online: bool,
    pub verification: VerificationState,
    pub last_probe_output: Option<String>,
    pub last_probe_reason: Option<ProbeFailure>,
    /// Unix seconds when the last probe report arrived, if any (a recheck is judged by the
    /// report that followed it).
    #[serde(default)]
    pub last_probe_at: Option<u64>,
    /// Unix seconds of the last heartbeat, if any.
    pub last_heartbeat_at: Option<u64>,
    pub registered_at: u64,
    pub agent_version: String,
    pub inventory: Inventory,
    pub last_metrics: Option<Metrics>,
    pub health: Option<Health>,
    /// The sequence number of the last accepted heartbeat.
    #[serde(default)]
    pub last_seq: Option<u64>,
    /// The `gpum.managed=true` containers the node last reported.
    #[serde(default)]
    pub managed_containers: Vec<String>,
    /// The containers the platform knows on this node (set by an admin; none on a fresh node).
    #[serde(default)]
    pub known_containers: Vec<String>,
    /// Containers the agent reported removing, oldest first (the latest 50).
    #[serde(default)]
    pub removed_containers: Vec<RemovedContainer>,
    /// Commands queued for this node, oldest first (the latest 50), with their results.
    #[serde(default)]
    pub commands: Vec<CommandStatus>,
    /// The name the owner gave the server; its host name until they do.
    #[serde(default)]
    pub name: String,
    /// Price per GPU-hour in minor units (cents) of the platform's one currency; `None`: not
    /// for rent yet.
    #[serde(default)]
    pub price_per_gpu_hour: Option<u64>,
    /// The shortest rental the owner accepts, in minutes.
    #[serde(default = "default_min_rental_minutes")]
    pub min_rental_minutes: u32,
    /// Paused by the owner: not offered to tenants.
    #[serde(default)]
    pub paused: bool,
    /// Rentable, or the one reason why not (computed by the platform on every read).
    #[serde(default)]
    pub rentable: Rentable,
    /// The share of the last 30 days it was online with its GPUs in order (issue 46);
    /// `None` in the first second after it registered.
    #[serde(default)]
    pub reliability: Option<Reliability>,
    /// Its GPUs rented, idle and not rentable (issue 46).
    #[serde(default)]
    pub occupancy: Occupancy,
    /// The e-mail of the owner whose server it is; `None` for the operator's own (registered
    /// with a join code that belongs to no owner).
    #[serde(default)]
    pub owner: Option<String>,
    /// The node's quarantine as its agent last reported it (issue 33); `None`: not
    /// quarantined. Its reason is the `quarantined` verdict's.
    #[serde(default)]
    pub quarantine: Option<Quarantine>,
    /// The maintenance windows its owner planned that are not over yet, earliest first (issue
    /// 46): no rental is placed that would overlap one, and inside one the verdict is
    /// `maintenance`. Absent from older platforms.
    #[serde(default)]
    pub maintenance: Vec<MaintenanceWindow>,
    /// Its agent's upgrades (issue 47): the owner's switch, the agent's, a pending one and the
    /// last result. Absent from older platforms.
    #[serde(default)]
    pub upgrades: NodeUpgrades,
}

/// A maintenance window an owner planned for a server (issue 46): `[starts_at, ends_at)` in
/// Unix seconds. No rental is placed that would overlap it; a rental placed before it was
/// planned runs to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MaintenanceWindow {
    pub id: String,
    pub starts_at: u64,
    pub ends_at: u64,
    /// When it was planned (Unix seconds).
    #[serde(default)]
    pub created_at: u64,
}

/// The answer to `GET …/nodes/{id}/maintenance`: the windows not over yet, earliest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MaintenanceWindows {
    pub windows: Vec<MaintenanceWindow>,
}

/// `POST …/nodes/{id}/maintenance`: plan a window `[starts_at, ends_at)` (Unix seconds). The end
/// is after the start, in the future, and at most [`limits::MAX_MAINTENANCE_AHEAD_SECS`] away;
/// a server holds at most [`limits::MAX_MAINTENANCE_WINDOWS_PER_NODE`] windows not yet over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateMaintenanceRequest {
    pub starts_at: u64,
    pub ends_at: u64,
}

named_enum! {
    /// Whether a server is rentable, or the first reason why not, in this order of precedence.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub enum RentableState {
        /// The operator disabled the server's owner (`owners disable`): none of their servers
        /// takes a rental until they are enabled again (issue 43).
        OwnerDisabled = "owner_disabled",
        /// No heartbeat within [`OFFLINE_AFTER_SECS`] (or none yet).
        #[default]
        Offline = "offline",
        /// Its agent quarantined it: a GPU check after a rental (or before GPUs changed hands)
        /// failed; [`NodeSummary::quarantine`] says why. Lifted by a recheck that passes.
        Quarantined = "quarantined",
        /// NVML is not working (`health.nvml` other than `ok`), or the inventory lists no GPU.
        NoGpu = "no_gpu",
        /// The GPU check ran and failed.
        CheckFailed = "check_failed",
        /// No check has run because the platform's operator has chosen no check image.
        AwaitingOperator = "awaiting_operator",
        /// A check image is chosen; the check has not run yet.
        AwaitingCheck = "awaiting_check",
        /// The owner has set no price.
        NoPrice = "no_price",
        /// Inside a maintenance window its owner planned ([`NodeSummary::maintenance`]; issue
        /// 46); `since` is the window's start. Added after the others: a client that does not
        /// know the word should read it as "not rentable".
        Maintenance = "maintenance",
        /// Paused by the owner.
        Paused = "paused",
        Rentable = "rentable",
    }
}

/// A server's verdict: rentable, or exactly why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rentable {
    pub state: RentableState,
    /// Unix seconds: for `offline`, the last heartbeat (`None`: never seen); for
    /// `owner_disabled` and `quarantined`, since when; for `maintenance`, the window's start;
    /// else `None`.
    pub since: Option<u64>,
}

/// A server's reliability (issue 46): the share of the last 30 days (or since it registered,
/// when younger) it was online with its GPUs in order (its check not failed, not quarantined),
/// from its heartbeat history. What tenants are told of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reliability {
    /// The share in tenths of a percent, rounded down: 0 to 1000.
    pub permille: u16,
    /// Seconds of the window it was online with its GPUs in order.
    pub up_secs: u64,
    /// The window's length in seconds: 30 days, or since it registered.
    pub window_secs: u64,
}

/// A server's GPUs at a glance (issue 46): each counted once, as rented (held by a rental),
/// idle (free on a rentable server) or not rentable (free on a server that is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Occupancy {
    pub rented: u32,
    pub idle: u32,
    pub not_rentable: u32,
}

/// The minimum rental time of a server whose owner has not set one.
pub const DEFAULT_MIN_RENTAL_MINUTES: u32 = 60;
/// The longest minimum rental time an owner may set: a week.
pub const MAX_MIN_RENTAL_MINUTES: u32 = 10_080;
/// The highest price per GPU-hour, in minor units (1,000,000.00 of the currency).
pub const MAX_PRICE_PER_GPU_HOUR: u64 = 100_000_000;
/// The longest server name, in characters.
pub const MAX_NODE_NAME_CHARS: usize = 64;

fn default_min_rental_minutes() -> u32 {
    DEFAULT_MIN_RENTAL_MINUTES
}

/// `PATCH /api/v1/admin/nodes/{id}`: what the owner changes; an absent field stays as it is.
/// `name: null` gives the server its host name back; `price_per_gpu_hour: null` takes it off
/// rent ("not for rent yet").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UpdateNodeRequest {
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub name: Option<Option<String>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rental_minutes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The owner's switch "automatic upgrades" (issue 47).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_update: Option<bool>,
}

/// A field that is present, `null` included, is `Some`; an absent one stays `None` (`default`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The answer to `PATCH /api/v1/admin/nodes/{id}`: the server's settings as they now are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSettings {
    pub id: String,
    pub name: String,
    pub price_per_gpu_hour: Option<u64>,
    pub min_rental_minutes: u32,
    pub paused: bool,
    /// Automatic upgrades (issue 47). Absent from older platforms: on.
    #[serde(default = "yes")]
    pub auto_update: bool,
}

fn yes() -> bool {
    true
}

/// A queued command as the admin sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandStatus {
    pub id: String,
    pub kind: String,
    /// Unix seconds.
    pub queued_at: u64,
    /// Unix seconds when a heartbeat answer carried it; it is delivered once.
    pub delivered_at: Option<u64>,
    /// What the agent reported, once it did.
    pub result: Option<CommandResult>,
    /// Unix seconds when the agent's result arrived.
    #[serde(default)]
    pub completed_at: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SetKnownContainersRequest {
    /// Container ids, as the agent reports them.
    pub container_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    pub nodes: Vec<NodeSummary>,
    /// The cursor of the next page (`?after=`), absent on the last page (issue 44): a list is
    /// read a page at a time, in registration order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCommandRequest {
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandQueued {
    pub id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDeleted {
    pub deleted: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetProbeImageRequest {
    /// `None` clears it: no probe runs, nodes show "awaiting check".
    pub image: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRotated {
    /// The new token, shown once.
    pub node_token: String,
}

/// `POST /api/v1/admin/owners`: invite an owner by e-mail. Inviting an existing owner again
/// gives a new link (the old one stops working); accepting it sets a new password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviteOwnerRequest {
    pub email: String,
}

/// An owner as the operator sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerSummary {
    pub id: String,
    pub email: String,
    /// Unix seconds.
    pub created_at: u64,
    /// A disabled owner cannot sign in, and their API keys are refused.
    pub disabled: bool,
    /// Whether they accepted an invitation (set a password).
    pub password_set: bool,
    /// Whether they signed in with a second factor (TOTP).
    pub totp: bool,
    /// Their live servers.
    pub servers: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OwnerList {
    pub owners: Vec<OwnerSummary>,
    /// The cursor of the next page (`?after=`), absent on the last page (issue 44).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The answer to an invitation: the one-time link, shown once (the platform keeps its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerInvited {
    pub owner: OwnerSummary,
    pub invitation_url: String,
    /// Unix seconds.
    pub expires_at: u64,
}

/// `PATCH /api/v1/admin/owners/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UpdateOwnerRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// `true`: the second factor off, its recovery codes gone, every session and API key ended
    /// (`owners reset-2fa`); `false` does nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_second_factor: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// History: the figures over the last day, and the event log

/// The platform keeps at most one sample of a node's figures per this many seconds.
pub const SAMPLE_INTERVAL_SECS: u64 = 300;
/// How far back the samples go: a day.
pub const SAMPLE_WINDOW_SECS: u64 = 86_400;
/// Samples kept per node: a day of them, and one more.
pub const MAX_SAMPLES_PER_NODE: usize = (SAMPLE_WINDOW_SECS / SAMPLE_INTERVAL_SECS) as usize + 1;
/// Events the platform keeps per node (older ones are pruned); removed containers are kept
/// apart, [`limits::MAX_REMOVED_HISTORY_PER_NODE`] of them.
pub const MAX_EVENTS_PER_NODE: usize = 256;

/// One sample of a node's figures, as its heartbeat carried them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsSample {
    /// Unix seconds.
    pub at: u64,
    pub metrics: Metrics,
}

/// `GET /api/v1/admin/nodes/{id}/metrics`: the samples of the last day, oldest first, at most one
/// per [`SAMPLE_INTERVAL_SECS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeMetrics {
    pub interval_secs: u64,
    pub samples: Vec<MetricsSample>,
}

named_enum! {
    /// What happened to a node, as its event log names it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum NodeEventKind {
        /// The node registered with a join code.
        Registered = "registered",
        /// Its first heartbeat, or the first after a gap of [`OFFLINE_AFTER_SECS`] or more.
        Online = "online",
        /// No heartbeat after `at` (its last one) for [`OFFLINE_AFTER_SECS`] or more.
        Offline = "offline",
        /// The heartbeat carried an inventory that differs from the one held; `subject` lists
        /// the parts that changed (`gpus`, `cpu`, `ram`, `disk`, `software`, `hostname`),
        /// comma-separated.
        HardwareChanged = "hardware_changed",
        /// The GPU check passed, where it had not before.
        CheckPassed = "check_passed",
        /// The GPU check failed, where it had not before or for another reason; `subject` is
        /// the [`ProbeFailure`], if the agent gave one.
        CheckFailed = "check_failed",
        /// A command was queued; `subject` is its kind.
        CommandSent = "command_sent",
        /// The agent reported a command done; `subject` is its kind, `detail` its message.
        CommandOk = "command_ok",
        /// The agent reported a command failed; `subject` is its kind, `detail` its message.
        CommandFailed = "command_failed",
        /// The agent removed a container; `subject` is its name, `detail` why.
        ContainerRemoved = "container_removed",
        /// The node's token was replaced (by an admin, or by the same installation
        /// registering again).
        TokenReplaced = "token_replaced",
        /// The node was deleted; the only event a deleted node keeps.
        Deleted = "deleted",
        /// A rental was created on the node; `subject` is its id, `detail` its image.
        RentalCreated = "rental_created",
        /// The agent first reported the rental `running`; `subject` is its id.
        RentalStarted = "rental_started",
        /// The rental's process ended by itself; `subject` is its id, `detail` the exit code.
        RentalExited = "rental_exited",
        /// The operator stopped the rental; `subject` is its id.
        RentalStopped = "rental_stopped",
        /// The agent tore the rental down and verified it gone; `subject` is its id.
        RentalGone = "rental_gone",
        /// The rental could not run, or its teardown could not be verified; `subject` is its
        /// id, `detail` the agent's reason.
        RentalFailed = "rental_failed",
        /// The agent quarantined the node (or changed why); `detail` is its reason.
        Quarantined = "quarantined",
        /// The agent lifted the quarantine: a recheck found the GPUs free and answering.
        QuarantineLifted = "quarantine_lifted",
    }
}

/// One entry of a node's event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    /// Unix seconds.
    pub at: u64,
    pub kind: NodeEventKind,
    /// What the event is about, by kind (see [`NodeEventKind`]); empty when nothing.
    #[serde(default)]
    pub subject: String,
    /// A message that goes with it, by kind; empty when none.
    #[serde(default)]
    pub detail: String,
}

/// `GET /api/v1/admin/nodes/{id}/events`: the node's event log, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvents {
    pub events: Vec<NodeEvent>,
}

// ---------------------------------------------------------------------------------------------
// Rentals (issue 33)

/// A rental as the platform wants it on a node: one container of the tenant's image on exactly
/// these GPUs, with hard limits, until `ends_at`. The agent decides nothing about it but how to
/// run it safely (docs/protocol.md, "Rentals").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalSpec {
    /// `rent-` and 16 hex digits.
    pub id: String,
    /// Pinned by digest: `registry/name@sha256:…`, from a registry the platform accepts.
    pub image: String,
    /// The rented GPUs, by UUID: the container sees these and no other.
    pub gpu_uuids: Vec<String>,
    /// CPU, in thousandths of a core (2500: two and a half cores). Absent reads as 0, which the
    /// agent refuses, as it refuses more than its machine has (issue 43): no rental runs
    /// without a CPU limit.
    #[serde(default)]
    pub cpu_millis: u32,
    /// Memory, in MiB; swap is the same (none beyond it). Absent reads as 0, refused as
    /// `cpu_millis` is.
    #[serde(default)]
    pub memory_mib: u64,
    /// Disk for the container's writable layer, in GiB, where the data root can limit it.
    pub disk_gib: u64,
    /// `/dev/shm`, in MiB.
    pub shm_mib: u64,
    /// The environment, set after the image's own (the image cannot widen the rented GPUs:
    /// the agent sets `NVIDIA_VISIBLE_DEVICES` last).
    #[serde(default)]
    pub env: Vec<EnvVar>,
    /// The command; empty: the image's own.
    #[serde(default)]
    pub command: Vec<String>,
    /// Unix seconds: the agent stops the rental then, whatever the platform says later.
    pub ends_at: u64,
    /// The container ports a tenant may reach through the tunnel (issue 34); the agent connects
    /// to no other. Empty (also from an older platform): no tunnel.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// The parts of the NVIDIA driver mounted into the container (`NVIDIA_DRIVER_CAPABILITIES`,
    /// which the agent sets from this, whatever the image says): names of
    /// [`driver::DRIVER_CAPABILITIES`], each once. Empty (also from an older platform):
    /// [`driver::DEFAULT_DRIVER_CAPABILITIES`]. A name outside the set fails the rental.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_capabilities: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

named_enum! {
    /// Where a rental stands on its node, as its agent reports it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum RentalState {
        /// Its image is being pulled.
        Pulling = "pulling",
        /// Its container is being created and started (and its GPUs checked first).
        Starting = "starting",
        Running = "running",
        /// Its process ended by itself (`exit_code`).
        Exited = "exited",
        /// Being torn down (stopped, expired, or no longer listed by the platform).
        Stopping = "stopping",
        /// Torn down and verified gone: no container, no process on its GPUs.
        Gone = "gone",
        /// It could not run, or its teardown could not be verified (`reason`).
        Failed = "failed",
    }
}

/// What the agent reports of one rental.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalReport {
    pub id: String,
    pub state: RentalState,
    /// The container's exit code, once `exited`.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Why, when `failed` (or why it is stopping); short text.
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /api/v1/admin/rentals`: a rental on one node. Either `gpus` (a count: the platform
/// picks free GPUs of the node) or `gpu_uuids` (exactly these); either `ends_at` or
/// `duration_secs`. The platform checks every field before it writes anything
/// (docs/protocol.md, "Rentals").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateRentalRequest {
    pub node_id: String,
    /// `name@sha256:<64 hex>`, from a registry the platform accepts.
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuids: Option<Vec<String>>,
    pub cpu_millis: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    pub shm_mib: u64,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub command: Vec<String>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_secs: Option<u64>,
    /// Container ports the tenant reaches through the relay: at most
    /// [`limits::MAX_RENTAL_PORTS`], each 1–65535, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// The parts of the NVIDIA driver the container gets: names of
    /// [`driver::DRIVER_CAPABILITIES`], each once; none given: `compute,utility`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub driver_capabilities: Vec<String>,
}

/// A rental as the operator sees it: what the platform asks of the node, and what its agent
/// last reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalSummary {
    pub node_id: String,
    pub spec: RentalSpec,
    /// Unix seconds.
    pub created_at: u64,
    /// Unix seconds when the operator stopped it, or its node was deleted.
    pub stopped_at: Option<u64>,
    /// Whether the heartbeat answer still carries it: not stopped, not expired, not `gone` or
    /// `failed`.
    pub listed: bool,
    /// What the agent last reported; `None` until it reports.
    pub state: Option<RentalState>,
    pub exit_code: Option<i64>,
    /// The agent's reason (`failed`, `stopping`), or the platform's when it stopped it.
    pub reason: Option<String>,
    /// Unix seconds of the last change of `state`.
    pub updated_at: Option<u64>,
    /// Only in the answer that created a rental with ports: how the tenant reaches them. The
    /// platform keeps only the credential's SHA-256; it is never shown again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelAccess>,
    /// Issue 46: its price, fixed when it was created (absent for one created before, on a
    /// server that had none then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<RentalPrice>,
}

/// A rental's tenant access through the relay (issue 34).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelAccess {
    /// `gpumt_` and 64 hex digits: the password of `Proxy-Authorization: Basic`, with the
    /// rental's id as the user.
    pub credential: String,
    pub ports: Vec<TunnelPort>,
}

/// One exposed port: the `CONNECT` target a tenant names at the relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelPort {
    pub port: u16,
    /// `rental-<id without rent->:<port>`.
    pub target: String,
}

/// The `CONNECT` target of a rental's port at the relay: `rental-<hex>:<port>`.
pub fn tunnel_target(rental_id: &str, port: u16) -> String {
    format!("rental-{}:{port}", rental_id.strip_prefix("rent-").unwrap_or(rental_id))
}

/// The first line the relay writes on a tunnel stream (JSON, then `\n`): which rental's port
/// the tenant asked for. It names no address: the agent finds the rental's container itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelOpen {
    pub rental: String,
    pub port: u16,
}

/// The agent's answer line on a tunnel stream; after `ok`, bytes flow both ways.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelReply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The first line of a peer connection between two replicas of the platform (the relay mesh,
/// issue 44; `gpum-platform`'s `relay::mesh` speaks both ends): a tenant's stream to `rental`'s
/// `port` on `node`, forwarded to the replica that holds the node's tunnel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerOpen {
    pub rental: String,
    pub port: u16,
    pub node: String,
    /// Unix seconds.
    pub at: u64,
    /// Random, used once.
    pub nonce: String,
    /// Hex HMAC-SHA256, keyed with the mesh's secret, of [`PeerOpen::signed`].
    pub mac: String,
}

impl PeerOpen {
    /// What [`PeerOpen::mac`] proves: every field but the proof.
    pub fn signed(&self) -> String {
        format!("gpum-peer-1\n{}\n{}\n{}\n{}\n{}", self.rental, self.port, self.node, self.at, self.nonce)
    }
}

/// The answer line of the replica that holds the tunnel: the agent's yes (bytes flow both ways
/// after it), or the status its own door would give and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReply {
    pub ok: bool,
    #[serde(default)]
    pub status: u16,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `PUT /api/v1/admin/rental-registries`: `host` or `host:port` each; `None` goes back to the
/// defaults (`docker.io`, `nvcr.io`, `ghcr.io`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetRentalRegistriesRequest {
    pub registries: Option<Vec<String>>,
}

/// The registries rental images may come from, as the platform holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalRegistries {
    pub registries: Vec<String>,
}

/// `GET /api/v1/admin/rentals`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalList {
    pub rentals: Vec<RentalSummary>,
}

#[cfg(test)]
mod tests {
    /// Issue 43: a rental whose limits are absent is still read (so the agent can refuse it and
    /// say why, instead of losing the whole answer), with 0, which the agent refuses; an older
    /// platform's spec has no driver capabilities (the default).
    #[test]
    fn a_rental_without_limits_reads_as_zero_limits() {
        let s: super::RentalSpec = serde_json::from_str(
            r#"{"id":"rent-00112233445566aa","image":"i","gpu_uuids":["GPU-1"],"disk_gib":1,"shm_mib":64,"ends_at":9}"#,
        )
        .expect("read without cpu_millis and memory_mib");
        assert_eq!((s.cpu_millis, s.memory_mib), (0, 0));
        assert!(s.driver_capabilities.is_empty());
        assert!(!serde_json::to_string(&s).unwrap().contains("driver_capabilities"), "absent when empty");
    }

    /// Fuzzing found it (fuzz/findings/): an out-of-range float became infinity, stored as
    /// `null`, and the node's metrics vanished from `nodes list`.
    #[test]
    fn metrics_refuse_numbers_that_are_not_finite_f32() {
        let g = |p: &str| {
            format!(
                r#"{{"index":0,"util_pct":1,"mem_used_mib":1,"mem_total_mib":2,"temp_c":30,"power_w":{p}}}"#
            )
        };
        assert_eq!(serde_json::from_str::<GpuMetrics>(&g("70.5")).unwrap().power_w, 70.5);
        assert!(serde_json::from_str::<GpuMetrics>(&g("1e47")).is_err());
        assert!(serde_json::from_str::<GpuMetrics>(&g("-1e39")).is_err());
        let m = |c: &str| {
            format!(
                r#"{{"cpu_load_pct":{c},"ram_used_mib":1,"ram_total_mib":2,"disk_free_gib":3,"gpus":[]}}"#
            )
        };
        assert!(serde_json::from_str::<Metrics>(&m("12.5")).is_ok());
        assert!(serde_json::from_str::<Metrics>(&m("1e300")).is_err());
    }

    use super::*;

    #[test]
    fn error_body_shape() {
        let b = ErrorBody { error: ErrorDetail { code: ErrorCode::NodeDeleted, message: "gone".into() } };
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"error":{"code":"node_deleted","message":"gone"}}"#
        );
        assert!(ErrorCode::NodeDeleted.is_revocation() && ErrorCode::TokenReplaced.is_revocation());
        assert!(!ErrorCode::Unauthorized.is_revocation());
        assert_eq!(ErrorCode::NodeDeleted.http_status(), 410);
        assert_eq!(ErrorCode::TokenReplaced.http_status(), 401);
    }

    /// Issue 29, item 12: two GPUs of `u64::MAX` MiB overflowed the dashboard's sum.
    #[test]
    fn inventory_numbers_have_ranges() {
        let mut inv = Inventory::default();
        let gpu = |vram_mib| GpuPublic { model: "GPU".into(), vram_mib };
        inv.public.gpus = vec![gpu(limits::MAX_VRAM_MIB); limits::MAX_GPUS];
        inv.public.ram_mib = limits::MAX_RAM_MIB;
        inv.public.disk_gib = limits::MAX_DISK_GIB;
        inv.public.cpu_cores = limits::MAX_CPU_CORES;
        assert_eq!(inv.check_ranges(), Ok(()));
        // The largest sum a page can make fits.
        assert!(limits::MAX_VRAM_MIB.checked_mul(limits::MAX_GPUS as u64).is_some());
        let refused = |f: &dyn Fn(&mut Inventory)| {
            let mut i = inv.clone();
            f(&mut i);
            i.check_ranges().unwrap_err()
        };
        assert!(refused(&|i| i.public.gpus[1].vram_mib = u64::MAX).starts_with("gpus[].vram_mib"));
        assert!(refused(&|i| i.public.ram_mib += 1).starts_with("ram_mib"));
        assert!(refused(&|i| i.public.disk_gib = u64::MAX).starts_with("disk_gib"));
        assert!(refused(&|i| i.public.cpu_cores = u32::MAX).starts_with("cpu_cores"));
    }

    #[test]
    fn inventory_hash_tracks_changes() {
        let mut inv = Inventory::default();
        let h1 = inv.hash();
        assert_eq!(h1, inv.hash());
        inv.private.driver_version = Some("550.54.15".into());
        assert_ne!(h1, inv.hash());
        let (json, hash) = inv.json_and_hash();
        assert_eq!(serde_json::from_str::<Inventory>(&json).unwrap(), inv);
        assert_eq!(hash, inv.hash());
    }

    /// Issue 46: `maintenance` is added, none renamed: a summary from an older platform (no
    /// `maintenance`) reads with none, and the new state and window cross the wire as written.
    #[test]
    fn maintenance_is_added_on_the_wire() {
        let mut old = serde_json::to_value(NodeSummary::default()).unwrap();
        old.as_object_mut().unwrap().remove("maintenance");
        let n: NodeSummary = serde_json::from_value(old).unwrap();
        assert!(n.maintenance.is_empty());
        let v = serde_json::to_value(Rentable { state: RentableState::Maintenance, since: Some(5) }).unwrap();
        assert_eq!(v, serde_json::json!({"state": "maintenance", "since": 5}));
        let w = MaintenanceWindow { id: "mw-1".into(), starts_at: 5, ends_at: 9, created_at: 1 };
        let v = serde_json::to_value(&w).unwrap();
        assert_eq!(v, serde_json::json!({"id": "mw-1", "starts_at": 5, "ends_at": 9, "created_at": 1}));
        let words: Vec<&str> = RentableState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            words,
            [
                "owner_disabled",
                "offline",
                "quarantined",
                "no_gpu",
                "check_failed",
                "awaiting_operator",
                "awaiting_check",
                "no_price",
                "maintenance",
                "paused",
                "rentable"
            ],
            "every earlier word kept"
        );
        assert!(
            serde_json::from_str::<CreateMaintenanceRequest>(r#"{"starts_at":1,"ends_at":2,"x":3}"#).is_err(),
            "a request's unknown field is refused"
        );
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let r: HeartbeatResponse = serde_json::from_str(
            r#"{"heartbeat_interval_secs":10,"commands":[{"id":"1","kind":"format_disk"}],"known_containers":[],"probe_image":null,"future":1}"#,
        )
        .unwrap();
        assert_eq!(CommandKind::parse(&r.commands[0].kind), None);
        assert_eq!(CommandKind::parse("recheck"), Some(CommandKind::Recheck));
    }

    #[test]
    fn verification_names_are_the_wires() {
        for v in VerificationState::ALL {
            let wire = serde_json::to_string(v).unwrap();
            assert_eq!(wire, format!("\"{}\"", v.as_str()));
            assert_eq!(v.to_string(), v.as_str());
            assert_eq!(serde_json::from_str::<VerificationState>(&wire).unwrap(), *v);
        }
        let names: Vec<&str> = VerificationState::ALL.iter().map(|v| v.as_str()).collect();
        assert_eq!(names, ["awaiting_check", "verified", "failed"]);
    }
}
