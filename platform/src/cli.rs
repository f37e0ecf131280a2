//! The `gpum-platform` command line: `serve`, and the admin operations run directly against the
//! database file (the same functions the admin HTTP API calls, so both always agree). SQLite's
//! WAL mode lets these run while a server has the same file open.
//!
//! Exit codes: 0 done, 1 the operation failed (the message, or with `--json` the error body, says
//! why), 2 bad usage, which includes `serve` refusing a weak admin token file
//! ([`admin_token_weakness`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpum_common::text::{Escaped, escape_controls};
use gpum_protocol::{CommandKind, NodeList, UpdateNodeRequest};
use sha2::{Digest, Sha256};

use crate::accounts;
use crate::clock::Clock;
use crate::error::ApiError;
use crate::server::{self, AppState, Config};
use crate::store::{self, Scope};

#[derive(Debug, Parser)]
#[command(name = "gpum-platform", version, about = "The gpum reference control plane")]
struct Cli {
    /// The database: a SQLite file (created when absent), or PostgreSQL as
    /// postgres://USER@HOST[:PORT]/DB (no password in it: it would show in the process list).
    #[arg(long, global = true, value_name = "FILE|URL")]
    db: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// TEST ONLY (the `test-knobs` feature, absent from release builds): add the number of
    /// seconds in this file to the system clock, read on every use.
    #[cfg(feature = "test-knobs")]
    #[arg(long, global = true, hide = true, value_name = "FILE")]
    test_clock_file: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the HTTP(S) server.
    Serve(Box<ServeArgs>),
    /// Join codes.
    JoinCode {
        #[command(subcommand)]
        cmd: JoinCodeCmd,
    },
    /// Nodes.
    Nodes {
        #[command(subcommand)]
        cmd: NodesCmd,
    },
    /// Owners' accounts: invite (a one-time link to set a password), list, disable, enable,
    /// reset-2fa.
    Owners {
        #[command(subcommand)]
        cmd: OwnersCmd,
    },
    /// The image of the GPU probe container.
    ProbeImage {
        #[command(subcommand)]
        cmd: ProbeImageCmd,
    },
    /// Rentals (issue 33): create one on a node, list, show, stop.
    Rentals {
        #[command(subcommand)]
        cmd: RentalsCmd,
    },
    /// The registries rental images may come from.
    RentalRegistries {
        #[command(subcommand)]
        cmd: RentalRegistriesCmd,
    },
    /// Move the whole database from SQLite into an empty PostgreSQL database (issue 35), with no
    /// `serve` running on either: `migrate --from sqlite:FILE --to postgres://USER@HOST/DB`.
    Migrate {
        /// The SQLite database, as `sqlite:FILE` (or just FILE).
        #[arg(long, value_name = "sqlite:FILE")]
        from: String,
        /// The PostgreSQL database (no password in the URL).
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Copy the database consistently, also while `serve` runs, into a new file (mode 0600: it
    /// holds token hashes). Restore: docs/operator-guide.md.
    Backup {
        /// The copy; it must not exist yet.
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on, e.g. 0.0.0.0:443 (port 0 picks a free port; the first line on
    /// stdout says which).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// PEM certificate chain for TLS.
    #[arg(long, value_name = "F", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long, value_name = "F", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve plain HTTP; allowed only on a loopback address.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    insecure_http: bool,
    /// A file holding the admin API bearer token; without it the admin API is off. At least 32
    /// random visible ASCII characters, e.g. from
    /// `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'`; a weaker one is refused (exit 2).
    #[arg(long, value_name = "F")]
    admin_token_file: Option<PathBuf>,
    /// Directory served under /dl/ (gpum-install, gpum-agent, their .sha256 and .sig).
    #[arg(long, value_name = "DIR")]
    dist: Option<PathBuf>,
    /// Heartbeat interval given to agents, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = gpum_protocol::DEFAULT_HEARTBEAT_INTERVAL_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    heartbeat_interval: u64,
    /// The platform's public URL, written into install.sh: https://, or http:// to a loopback
    /// host. Required unless --listen is a loopback address (then it defaults to that address).
    /// Never taken from a request's Host header.
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
    /// Seconds a client gets to send a request's headers (and to finish a TLS handshake); also
    /// how long an idle keep-alive connection stays open.
    #[arg(long, value_name = "SECS", default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=600))]
    header_timeout: u64,
    /// Seconds a client gets to send a request's body.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    body_timeout: u64,
    /// Connections open at once; more wait in the kernel's backlog. Kept below the process's
    /// file-descriptor limit, which is raised to its hard limit at start.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// Agents' tunnels open at once (one per server with a rental's ports); one more is refused
    /// (429) until one closes. Kept at most a quarter of the file-descriptor limit, the doors'
    /// connections sharing the rest.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_tunnels: u64,
    /// Seconds an answer's writing may make no progress (the client reads nothing) before the
    /// connection is closed. A download that keeps moving is never cut.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    write_timeout: u64,
    /// Connections one client address (an IPv6 /64) may hold at once; one past it is closed at
    /// once. Default: a sixteenth of --max-connections, at least 8. Terminators are not capped.
    /// The relay's tenant doors (--relay-listen, --relay-http-listen) each have their own count
    /// under the same cap.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections_per_address: Option<u64>,
    /// The address a TLS terminator connects from (repeatable): all its clients share it, so it
    /// is not capped per address. `loopback` (the default) is any loopback address; `none`, no
    /// terminator.
    #[arg(long, value_name = "ADDR", default_value = "loopback", value_parser = terminator_arg)]
    terminator_address: Vec<String>,
    /// MiB that request bodies may hold together beyond each body's first 32 KiB; a body that
    /// needs more waits for it, within --body-timeout.
    #[arg(long, value_name = "MIB", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    body_memory: u64,
    /// Connections to a PostgreSQL database, each a database thread running batches of
    /// requests side by side (default 2). SQLite has one writer: only 1 is allowed there.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    db_connections: Option<u16>,
    /// Also serve the tunnel relay for tenants on ADDR (issue 34): `CONNECT rental-<id>:<port>`
    /// with the rental's credential. TLS with --tls-cert/--tls-key; plain only with
    /// --insecure-http, on a loopback address.
    #[arg(long, value_name = "ADDR")]
    relay_listen: Option<SocketAddr>,
    /// Also serve the relay's HTTP door on ADDR: a rental's HTTP port by host name,
    /// `https://<16 hex>-<port>.<DOMAIN>/` (--relay-domain), with the rental's credential as
    /// HTTP Basic. TLS with --tls-cert/--tls-key (a wildcard certificate for *.DOMAIN); plain
    /// only with --insecure-http, on a loopback address (behind a TLS terminator).
    #[arg(long, value_name = "ADDR", requires = "relay_domain")]
    relay_http_listen: Option<SocketAddr>,
    /// The domain under which the HTTP door names rentals' ports (a wildcard DNS name
    /// *.DOMAIN points at the relay). It must be another registrable domain than the public
    /// URL's (gpum-usercontent.example for gpum.example, as GitHub serves user content from
    /// githubusercontent.com): tenants' pages must not be same-site with the dashboard.
    #[arg(long, value_name = "DOMAIN", value_parser = domain_arg)]
    relay_domain: Option<String>,
    /// Join the relay mesh of the replicas that share this database (issue 44): listen for the
    /// other replicas' forwarded tenant streams on ADDR, so that a tenant reaches a rental
    /// through any replica, whichever holds its node's tunnel. A private network only (plain
    /// TCP; each request proved with the mesh's secret).
    #[arg(long, value_name = "ADDR", requires_all = ["peer_addr", "peer_secret_file"])]
    peer_listen: Option<SocketAddr>,
    /// Where the other replicas reach this one's --peer-listen (HOST:PORT).
    #[arg(long, value_name = "HOST:PORT", requires = "peer_listen")]
    peer_addr: Option<String>,
    /// The mesh's shared secret (at least 32 characters, the same on every replica), in a file
    /// only its owner may read (0600).
    #[arg(long, value_name = "FILE", requires = "peer_listen")]
    peer_secret_file: Option<PathBuf>,
    /// Serve --relay-domain even though it is on the public URL's site (its registrable
    /// domain): tenants' pages are then same-site with the dashboard. Not recommended.
    #[arg(long, requires = "relay_domain")]
    allow_same_site_relay_domain: bool,
    /// A front (a TCP TLS terminator or load balancer) whose connections to the relay's doors
    /// start with a PROXY protocol header (v1 or v2) naming the tenant's address, which the
    /// per-address cap and the throttle then count (repeatable; an address or a CIDR block).
    /// A connection from it without a valid header is closed; from anywhere else, a header is
    /// never read.
    #[arg(long, value_name = "CIDR", value_parser = cidr_arg)]
    relay_trust_proxy: Vec<ipnet::IpNet>,
    /// Bytes per second one rental's tunnel streams may carry together (both directions);
    /// unlimited when not given.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1024..))]
    relay_rate: Option<u64>,
    /// Streams one rental may hold open at once through the relay (at most 960: one node's
    /// tunnel carries at most 960 tenant streams, all its rentals together).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=gpum_protocol::tunnel::MAX_TENANT_STREAMS as u64))]
    relay_max_streams: u64,
    /// Seconds a relay stream may carry no byte either way before it is closed.
    #[arg(long, value_name = "SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    relay_idle_timeout: u64,
    /// TEST ONLY (the `test-knobs` feature): ping each agent's tunnel every this many
    /// milliseconds, and drop it when the answer takes as long, instead of every 20 s within
    /// 15 s, so that an end-to-end test can cut the network and watch the tunnel come back.
    #[cfg(feature = "test-knobs")]
    #[arg(long, hide = true, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..))]
    test_relay_ping_ms: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum JoinCodeCmd {
    /// Create a single-use join code.
    Create {
        /// Lifetime: 24h, 30m, 90s, 7d or plain seconds.
        #[arg(long, default_value = "24h", value_parser = parse_duration)]
        ttl: u64,
        /// The owner (e-mail or id) whose server it registers; without it, the operator's own.
        #[arg(long, value_name = "OWNER")]
        owner: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum OwnersCmd {
    /// Invite an owner by e-mail; prints the one-time link (valid 7 days) that sets their
    /// password. Inviting an existing owner again gives a new link, e.g. for a forgotten password.
    Invite {
        email: String,
        /// The platform's public URL, as `serve --public-url` has it: the link starts with it.
        #[arg(long, value_name = "URL")]
        public_url: String,
    },
    /// List owners.
    List,
    /// Disable an owner (e-mail or id): they cannot sign in, their sessions end, their API keys
    /// are refused. Their servers stay.
    Disable { owner: String },
    /// Enable a disabled owner again. Their API keys stay revoked: they make new ones.
    Enable { owner: String },
    /// Turn off an owner's second factor (e-mail or id), for one who lost their authenticator
    /// and their recovery codes: their recovery codes go, every session and API key ends, and
    /// their pages say that the operator did it. Check who is asking first.
    #[command(name = "reset-2fa")]
    Reset2fa { owner: String },
    /// Show, or set, what one owner may hold: open join codes (unused, unexpired) and servers.
    /// One past either is refused (409 owner_limit_reached). Defaults: 100 and 1,000.
    Limits {
        /// The most open join codes per owner.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        open_codes: Option<u64>,
        /// The most servers per owner.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
        servers: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
enum NodesCmd {
    /// List nodes with their state.
    List,
    /// Delete a node; its agent stops for good on its next heartbeat.
    Delete { id: String },
    /// Queue a command for a node.
    Command {
        id: String,
        #[arg(value_parser = ["recheck", "restart"])]
        kind: String,
    },
    /// Replace a node's token (prints the new one); the old one gets `token_replaced`.
    RotateToken { id: String },
    /// Set the gpum.managed containers the platform knows on a node (none: forget them all).
    KnownContainers { id: String, container_ids: Vec<String> },
    /// A node's event log, newest first (`GET /api/v1/admin/nodes/{id}/events`).
    Events { id: String },
    /// A node's figures over the last day, a sample per 5 minutes, oldest first
    /// (`GET /api/v1/admin/nodes/{id}/metrics`).
    Metrics { id: String },
    /// Change a server's name, price, minimum rental time or pause, as the owner's page does
    /// (`PATCH /api/v1/admin/nodes/{id}`); prints its settings as they now are.
    Set(SetArgs),
}

#[derive(Debug, clap::Args)]
struct SetArgs {
    id: String,
    /// The server's name (1-64 characters).
    #[arg(long, conflicts_with = "host_name")]
    name: Option<String>,
    /// Give the server its host name back as its name.
    #[arg(long)]
    host_name: bool,
    /// The price per GPU-hour in the platform's currency, as typed on the page (`12.50`).
    #[arg(long, conflicts_with = "no_price", value_parser = parse_price)]
    price: Option<u64>,
    /// Take the server off rent ("not for rent yet").
    #[arg(long)]
    no_price: bool,
    /// The minimum rental time, in minutes (1-10080).
    #[arg(long, value_name = "MINUTES")]
    min_rental: Option<u32>,
    /// Take the server off the offer to tenants.
    #[arg(long, conflicts_with = "resume")]
    pause: bool,
    /// Offer it again.
    #[arg(long)]
    resume: bool,
}

fn parse_price(s: &str) -> Result<u64, String> {
    crate::web::pages::parse_price(s).ok_or_else(|| format!("{s:?} is not a price such as 12.50"))
}

impl SetArgs {
    fn request(&self) -> UpdateNodeRequest {
        UpdateNodeRequest {
            name: if self.host_name { Some(None) } else { self.name.clone().map(Some) },
            price_per_gpu_hour: if self.no_price { Some(None) } else { self.price.map(Some) },
            min_rental_minutes: self.min_rental,
            paused: match (self.pause, self.resume) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
        }
    }
}

#[derive(Debug, Subcommand)]
enum ProbeImageCmd {
    /// Set the probe image agents run.
    Set { image: String },
    /// Clear it: no probe runs, nodes show "awaiting check".
    Clear,
    /// Show it.
    Show,
}

// Parsed once per run: the create variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum RentalsCmd {
    /// Create a rental: everything is checked before anything is written.
    Create(CreateRentalArgs),
    /// List rentals, newest first.
    List {
        /// Only this node's.
        #[arg(long, value_name = "ID")]
        node: Option<String>,
    },
    /// Show one rental.
    Show { id: String },
    /// Stop a rental: the platform stops listing it and the agent tears it down.
    Stop { id: String },
}

#[derive(Debug, clap::Args)]
struct CreateRentalArgs {
    /// The node.
    #[arg(long, value_name = "ID")]
    node: String,
    /// The image, pinned by digest: name@sha256:<64 hex digits>.
    #[arg(long)]
    image: String,
    /// How many GPUs (the platform picks free ones).
    #[arg(long, value_name = "N", conflicts_with = "gpu")]
    gpus: Option<u32>,
    /// A GPU by UUID (repeat for more).
    #[arg(long, value_name = "UUID")]
    gpu: Vec<String>,
    /// CPU in thousandths of a core (2500: two and a half cores).
    #[arg(long, value_name = "MILLIS")]
    cpu_millis: u32,
    #[arg(long, value_name = "MIB")]
    memory_mib: u64,
    #[arg(long, value_name = "GIB")]
    disk_gib: u64,
    #[arg(long, value_name = "MIB")]
    shm_mib: u64,
    /// An environment variable, NAME=VALUE (repeat for more).
    #[arg(long, value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Until when, in Unix seconds.
    #[arg(long, value_name = "UNIX", conflicts_with = "duration")]
    ends_at: Option<u64>,
    /// For how long: 24h, 30m, 7d or seconds.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    duration: Option<u64>,
    /// A container port the tenant reaches through the relay (repeat for more; at most 8).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    port: Vec<u16>,
    /// A part of the NVIDIA driver the container gets (repeat for more): compat32, compute,
    /// display, graphics, ngx, utility or video. None given: compute and utility.
    #[arg(long, value_name = "NAME")]
    driver_capability: Vec<String>,
    /// The command and its arguments, after `--` (none: the image's own).
    #[arg(last = true)]
    command: Vec<String>,
}

impl CreateRentalArgs {
    fn request(&self) -> Result<gpum_protocol::CreateRentalRequest> {
        let env = self
            .env
            .iter()
            .map(|e| match e.split_once('=') {
                Some((name, value)) => Ok(gpum_protocol::EnvVar { name: name.into(), value: value.into() }),
                None => Err(anyhow::Error::new(BadUsage(format!("--env {e:?}: NAME=VALUE")))),
            })
            .collect::<Result<_>>()?;
        Ok(gpum_protocol::CreateRentalRequest {
            node_id: self.node.clone(),
            image: self.image.clone(),
            gpus: self.gpus,
            gpu_uuids: (!self.gpu.is_empty()).then(|| self.gpu.clone()),
            cpu_millis: self.cpu_millis,
            memory_mib: self.memory_mib,
            disk_gib: self.disk_gib,
            shm_mib: self.shm_mib,
            env,
            command: self.command.clone(),
            ends_at: self.ends_at,
            duration_secs: self.duration,
            ports: self.port.clone(),
            driver_capabilities: self.driver_capability.clone(),
        })
    }
}

#[derive(Debug, Subcommand)]
enum RentalRegistriesCmd {
    /// Set the list: `host` or `host:port` each.
    Set {
        #[arg(required = true)]
        registries: Vec<String>,
    },
    /// Back to the defaults (docker.io, nvcr.io, ghcr.io).
    Reset,
    Show,
}

/// The clap definition, for the man page and shell completions `cargo xtask dist` generates.
/// Without the `test-knobs` feature (as xtask builds it) it has no test-only flag.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Parses `24h`, `30m`, `90s`, `7d` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'd')) => (&s[..i], 86_400),
        Some((i, 'h')) => (&s[..i], 3_600),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 's')) => (&s[..i], 1),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 24h, 30m, 90s or 7d"))?;
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(|| format!("{s:?} is out of range"))
}

/// The exit code of bad usage: clap's, and `serve`'s for a weak admin token file.
pub const EXIT_USAGE: i32 = 2;

/// A refusal that is the caller's to fix in how it runs the command (exit [`EXIT_USAGE`]).
#[derive(Debug)]
struct BadUsage(String);

impl std::fmt::Display for BadUsage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadUsage {}

pub fn main() -> i32 {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            if json && let Some(api) = e.downcast_ref::<ApiError>() {
                println!("{}", serde_json::to_string(&api.body()).unwrap_or_default());
            } else {
                eprintln!("gpum-platform: {}", escape_controls(&format!("{e:#}")));
            }
            if e.downcast_ref::<BadUsage>().is_some() { EXIT_USAGE } else { 1 }
        }
    }
}

/// The shortest admin token `serve` accepts.
pub const MIN_ADMIN_TOKEN_LEN: usize = 32;

/// Why `token` (the admin token file's content, trimmed) is too weak to serve with, or `None`.
/// It must be at least [`MIN_ADMIN_TOKEN_LEN`] visible ASCII characters (what an
/// `Authorization` header and the sign-in form carry unchanged) and look random: 8 different
/// characters or more, 20 different pairs of neighbours or more (no short pattern repeated),
/// and at most half of it continuing a sequence (`abcdef…`, `0a1b2c…`). A random hex token of
/// 32 characters fails these about once in 30 million; one of 64, as the guide makes, never
/// in practice. The reason names counts, never the token.
pub fn admin_token_weakness(token: &str) -> Option<String> {
    use std::collections::HashSet;
    let b = token.as_bytes();
    if b.len() < MIN_ADMIN_TOKEN_LEN {
        return Some(format!("it has {} characters; at least {MIN_ADMIN_TOKEN_LEN} are needed", b.len()));
    }
    if !b.iter().all(u8::is_ascii_graphic) {
        return Some(
            "it holds a space, a control character or a non-ASCII character; use letters, digits and punctuation"
                .into(),
        );
    }
    let distinct = b.iter().collect::<HashSet<_>>().len();
    if distinct < 8 {
        return Some(format!("it uses only {distinct} different characters"));
    }
    let pairs = b.windows(2).collect::<HashSet<_>>().len();
    if pairs < 20 {
        return Some(format!("it repeats itself: only {pairs} different pairs of neighbouring characters"));
    }
    let steps = |i: usize, k: usize| {
        i >= 2 * k && i16::from(b[i]) - i16::from(b[i - k]) == i16::from(b[i - k]) - i16::from(b[i - 2 * k])
    };
    let in_sequence = (2..b.len()).filter(|&i| (1..=3).any(|k| steps(i, k))).count();
    if 2 * in_sequence > b.len() - 2 {
        return Some(format!(
            "{in_sequence} of its {} characters continue a sequence (like abcdef)",
            b.len()
        ));
    }
    None
}

fn run(cli: Cli) -> Result<()> {
    #[cfg(feature = "test-knobs")]
    let clock = Clock::with_offset_file(cli.test_clock_file.clone());
    #[cfg(not(feature = "test-knobs"))]
    let clock = Clock::system();
    if let Cmd::Migrate { from, to } = &cli.cmd {
        return migrate(from, to, cli.json);
    }
    let Some(db_path) = cli.db.clone() else { bail!("--db FILE is required") };
    if let Cmd::Serve(args) = cli.cmd {
        return serve(*args, db_path, clock);
    }
    if let Cmd::Backup { to } = &cli.cmd {
        if let crate::sql::Target::Postgres(_) = crate::sql::Target::parse(&db_path) {
            bail!("backup copies a SQLite file; back PostgreSQL up with its own tools (pg_dump)");
        }
        let b = crate::db::backup(&db_path, to)?;
        if cli.json {
            println!("{}", serde_json::to_string(&b)?);
        } else {
            println!("{} ({} bytes)", escape_controls(&b.path.display().to_string()), b.bytes);
        }
        return Ok(());
    }
    let conn = store::open(&db_path)
        .with_context(|| format!("open the database {}", crate::sql::Target::parse(&db_path).display()))?;
    let now = clock.now();
    let json = cli.json;
    // Each operation is one transaction, like one HTTP request.
    let tx =
        |f: &dyn Fn(&crate::sql::Conn) -> Result<serde_json::Value, ApiError>| -> Result<serde_json::Value> {
            conn.begin()?;
            match f(&conn) {
                Ok(v) => {
                    conn.execute_batch("COMMIT")?;
                    Ok(v)
                }
                Err(e) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Err(e.into())
                }
            }
        };
    // Human output is one line, or the node table whose fields are escaped one by one.
    let out = |v: &serde_json::Value, human: String| {
        if json {
            println!("{v}");
        } else {
            println!("{}", escape_controls(&human));
        }
    };
    match cli.cmd {
        Cmd::Serve(_) | Cmd::Backup { .. } | Cmd::Migrate { .. } => unreachable!("handled above"),
        Cmd::JoinCode { cmd: JoinCodeCmd::Create { ttl, owner } } => {
            let v = tx(&|c| {
                let scope = match &owner {
                    Some(o) => Scope::Owner(accounts::find_owner(c, o)?.id),
                    None => Scope::All,
                };
                Ok(serde_json::to_value(store::create_join_code(c, now, ttl, &scope)?)?)
            })?;
            out(&v, v["code"].as_str().unwrap_or_default().to_owned());
        }
        Cmd::Owners { cmd } => owners(cmd, now, json, &tx)?,
        Cmd::Nodes { cmd: NodesCmd::List } => {
            let v = tx(&|c| Ok(serde_json::to_value(store::list_nodes(c, now, &Scope::All)?)?))?;
            let list: NodeList = serde_json::from_value(v.clone())?;
            if json {
                println!("{v}");
            } else {
                println!("{}", human_nodes(&list, now));
            }
        }
        Cmd::Nodes { cmd: NodesCmd::Delete { id } } => {
            let v = tx(&|c| {
                store::delete_node(c, now, &id, &Scope::All)?;
                Ok(serde_json::json!({ "deleted": id }))
            })?;
            out(&v, format!("deleted {id}"));
        }
        Cmd::Nodes { cmd: NodesCmd::Command { id, kind } } => {
            let kind = CommandKind::parse(&kind).map(|k| k.as_str()).unwrap_or("");
            let v =
                tx(&|c| Ok(serde_json::to_value(store::queue_command(c, now, &id, kind, &Scope::All)?)?))?;
            out(&v, format!("queued {kind} for {id}: {}", v["id"].as_str().unwrap_or_default()));
        }
        Cmd::Nodes { cmd: NodesCmd::RotateToken { id } } => {
            let v = tx(&|c| Ok(serde_json::to_value(store::rotate_token(c, now, &id, &Scope::All)?)?))?;
            out(&v, v["node_token"].as_str().unwrap_or_default().to_owned());
        }
        Cmd::Nodes { cmd: NodesCmd::Events { id } } => {
            let v = tx(&|c| {
                Ok(serde_json::to_value(store::node_events(
                    c,
                    &id,
                    now,
                    gpum_protocol::MAX_EVENTS_PER_NODE,
                    &Scope::All,
                )?)?)
            })?;
            if json {
                println!("{v}");
            } else {
                let list: gpum_protocol::NodeEvents = serde_json::from_value(v)?;
                println!("{}", human_events(&list));
            }
        }
        Cmd::Nodes { cmd: NodesCmd::Metrics { id } } => {
            let v = tx(&|c| Ok(serde_json::to_value(store::node_samples(c, &id, now, &Scope::All)?)?))?;
            if json {
                println!("{v}");
            } else {
                let m: gpum_protocol::NodeMetrics = serde_json::from_value(v)?;
                println!("{}", human_metrics(&m));
            }
        }
        Cmd::Nodes { cmd: NodesCmd::Set(args) } => {
            let req = args.request();
            let v = tx(&|c| Ok(serde_json::to_value(store::update_node(c, &args.id, &req, &Scope::All)?)?))?;
            let price = v["price_per_gpu_hour"].as_u64().map_or_else(
                || "not for rent yet".to_owned(),
                |p| format!("{} per GPU-hour", crate::web::pages::price_text(p)),
            );
            let paused = if v["paused"].as_bool() == Some(true) { ", paused" } else { "" };
            let human = format!(
                "{}: {}, {price}, at least {} min{paused}",
                args.id,
                v["name"].as_str().unwrap_or_default(),
                v["min_rental_minutes"]
            );
            out(&v, human);
        }
        Cmd::Nodes { cmd: NodesCmd::KnownContainers { id, container_ids } } => {
            let v = tx(&|c| {
                store::set_known_containers(c, &id, &container_ids)?;
                Ok(serde_json::json!({ "container_ids": container_ids }))
            })?;
            out(&v, format!("{id}: {} known container(s)", container_ids.len()));
        }
        Cmd::Rentals { cmd } => rentals(cmd, now, json, &tx)?,
        Cmd::RentalRegistries { cmd } => {
            let v = tx(&|c| {
                let list = match &cmd {
                    RentalRegistriesCmd::Set { registries } => {
                        crate::rentals::set_registries(c, Some(registries))?
                    }
                    RentalRegistriesCmd::Reset => crate::rentals::set_registries(c, None)?,
                    RentalRegistriesCmd::Show => crate::rentals::registries(c)?,
                };
                Ok(serde_json::json!({ "registries": list }))
            })?;
            let list: Vec<String> = serde_json::from_value(v["registries"].clone())?;
            out(&v, list.join(" "));
        }
        Cmd::ProbeImage { cmd } => {
            let v = match cmd {
                ProbeImageCmd::Set { image } => tx(&|c| {
                    store::set_probe_image(c, Some(&image))?;
                    Ok(serde_json::json!({ "image": image }))
                })?,
                ProbeImageCmd::Clear => tx(&|c| {
                    store::set_probe_image(c, None)?;
                    Ok(serde_json::json!({ "image": null }))
                })?,
                ProbeImageCmd::Show => tx(&|c| Ok(serde_json::json!({ "image": store::probe_image(c)? })))?,
            };
            out(&v, v["image"].as_str().unwrap_or("(none)").to_owned());
        }
    }
    Ok(())
}

/// `migrate`: both ends opened (and so migrated) by `store::open`, then `migrate::copy`.
fn migrate(from: &str, to: &str, json: bool) -> Result<()> {
    use crate::sql::Target;
    let from = std::path::PathBuf::from(from.strip_prefix("sqlite:").unwrap_or(from));
    let Target::Sqlite(from) = Target::parse(&from) else { bail!("--from takes sqlite:FILE") };
    let Target::Postgres(to) = Target::parse(std::path::Path::new(to)) else {
        bail!("--to takes postgres://USER@HOST/DB")
    };
    if !from.is_file() {
        bail!("{}: no such database file", from.display());
    }
    let src = store::open(&from).with_context(|| format!("open the database {}", from.display()))?;
    let to = Target::Postgres(to);
    let dst = store::open_target(&to).with_context(|| format!("open {}", to.display()))?;
    let copied = crate::migrate::copy(&src, &dst)?;
    if json {
        let tables: serde_json::Map<String, serde_json::Value> =
            copied.iter().map(|(t, n)| (t.clone(), serde_json::json!(n))).collect();
        println!("{}", serde_json::json!({ "tables": tables }));
    } else {
        for (t, n) in &copied {
            println!("{t}: {n} rows");
        }
        println!(
            "copied {} into {}",
            escape_controls(&from.display().to_string()),
            escape_controls(&to.display())
        );
    }
    Ok(())
}

type Tx<'a> = dyn Fn(&dyn Fn(&crate::sql::Conn) -> Result<serde_json::Value, ApiError>) -> Result<serde_json::Value>
    + 'a;

/// `owners …`: each one transaction; the invitation link is printed once (the database keeps
/// its hash).
fn owners(cmd: OwnersCmd, now: u64, json: bool, tx: &Tx<'_>) -> Result<()> {
    let print = |v: &serde_json::Value, human: String| {
        if json {
            println!("{v}");
        } else {
            println!("{}", escape_controls(&human));
        }
    };
    match cmd {
        OwnersCmd::Limits { open_codes, servers } => {
            let v = tx(&|c| Ok(serde_json::to_value(store::set_owner_limits(c, open_codes, servers)?)?))?;
            let l: store::OwnerLimits = serde_json::from_value(v.clone())?;
            print(
                &v,
                format!("open join codes per owner: {}\nservers per owner: {}", l.open_codes, l.servers),
            );
        }
        OwnersCmd::Invite { email, public_url } => {
            crate::install::check_public_url(&public_url)
                .map_err(|e| anyhow::anyhow!("--public-url: {e}"))?;
            let v = tx(&|c| {
                let (owner, token, expires_at) = accounts::invite(c, now, &email)?;
                let invitation_url = crate::server::invitation_url(&public_url, &token);
                Ok(serde_json::to_value(gpum_protocol::OwnerInvited { owner, invitation_url, expires_at })?)
            })?;
            print(&v, v["invitation_url"].as_str().unwrap_or_default().to_owned());
        }
        OwnersCmd::List => {
            let v = tx(&|c| {
                Ok(serde_json::to_value(gpum_protocol::OwnerList {
                    owners: accounts::list_owners(c)?,
                    next: None,
                })?)
            })?;
            let list: gpum_protocol::OwnerList = serde_json::from_value(v.clone())?;
            let mut s = format!(
                "{:<20} {:<32} {:<9} {:<8} {:<5} SERVERS",
                "ID", "EMAIL", "STATE", "PASSWORD", "TOTP"
            );
            for o in &list.owners {
                s.push_str(&format!(
                    "\n{:<20} {:<32} {:<9} {:<8} {:<5} {}",
                    Escaped(&o.id),
                    Escaped(&o.email),
                    if o.disabled { "disabled" } else { "enabled" },
                    if o.password_set { "set" } else { "not yet" },
                    if o.totp { "on" } else { "off" },
                    o.servers
                ));
            }
            if json {
                println!("{v}");
            } else {
                println!("{s}");
            }
        }
        OwnersCmd::Disable { owner } => {
            let v = tx(&|c| Ok(serde_json::to_value(accounts::set_disabled(c, now, &owner, true)?)?))?;
            print(&v, format!("disabled {}", v["email"].as_str().unwrap_or_default()));
        }
        OwnersCmd::Enable { owner } => {
            let v = tx(&|c| Ok(serde_json::to_value(accounts::set_disabled(c, now, &owner, false)?)?))?;
            print(&v, format!("enabled {}", v["email"].as_str().unwrap_or_default()));
        }
        OwnersCmd::Reset2fa { owner } => {
            let v = tx(&|c| Ok(serde_json::to_value(accounts::reset_second_factor(c, now, &owner)?)?))?;
            print(
                &v,
                format!(
                    "second factor turned off for {}; their sessions and API keys ended",
                    v["email"].as_str().unwrap_or_default()
                ),
            );
        }
    }
    Ok(())
}

/// `rentals …`: each one transaction, like one admin API request.
fn rentals(cmd: RentalsCmd, now: u64, json: bool, tx: &Tx<'_>) -> Result<()> {
    use crate::rentals;
    let v = match &cmd {
        RentalsCmd::Create(args) => {
            let req = args.request()?;
            tx(&|c| Ok(serde_json::to_value(rentals::create(c, now, &req)?)?))?
        }
        RentalsCmd::List { node } => tx(&|c| {
            Ok(serde_json::to_value(rentals::list(
                c,
                now,
                node.as_deref(),
                rentals::MAX_LISTED,
                &Scope::All,
            )?)?)
        })?,
        RentalsCmd::Show { id } => {
            tx(&|c| Ok(serde_json::to_value(rentals::show(c, now, id, &Scope::All)?)?))?
        }
        RentalsCmd::Stop { id } => tx(&|c| Ok(serde_json::to_value(rentals::stop(c, now, id)?)?))?,
    };
    if json {
        println!("{v}");
        return Ok(());
    }
    let list: Vec<gpum_protocol::RentalSummary> = match cmd {
        RentalsCmd::List { .. } => serde_json::from_value::<gpum_protocol::RentalList>(v)?.rentals,
        _ => vec![serde_json::from_value(v)?],
    };
    println!("{}", human_rentals(&list));
    Ok(())
}

/// The rental table, a line each, every field escaped (the image and the ids are the operator's,
/// the state's reason an agent's).
fn human_rentals(list: &[gpum_protocol::RentalSummary]) -> String {
    let mut s = format!(
        "{:<22} {:<22} {:<9} {:<16} {:<5} {:<40} REASON",
        "ID", "NODE", "STATE", "UNTIL (UTC)", "GPUS", "IMAGE"
    );
    for r in list {
        let state = match (r.state, r.exit_code) {
            (Some(gpum_protocol::RentalState::Exited), Some(code)) => format!("exited {code}"),
            _ => crate::rentals::state_word(r),
        };
        s.push_str(&format!(
            "\n{:<22} {:<22} {:<9} {:<16} {:<5} {:<40} {}",
            Escaped(&r.spec.id),
            Escaped(&r.node_id),
            state,
            crate::web::pages::utc(r.spec.ends_at),
            r.spec.gpu_uuids.len(),
            Escaped(&r.spec.image),
            Escaped(r.reason.as_deref().unwrap_or(""))
        ));
    }
    // Only `rentals create` of a rental with ports has it: shown this once.
    for t in list.iter().filter_map(|r| r.tunnel.as_ref()) {
        s.push_str(&format!("\ntunnel credential (shown only now): {}", t.credential));
        for p in &t.ports {
            s.push_str(&format!("\n  port {}: CONNECT {}", p.port, p.target));
        }
    }
    s
}

/// The node table. Every field a node reported (its version, its GPU models) is printed with
/// control characters escaped, so that no node can clear the operator's screen or forge lines.
/// The node list for a terminal: with each server's price (per GPU-hour, `-` when none) and
/// its rentable verdict (`rentable`, or the first reason why not, as `rentable.state` names it).
fn human_nodes(list: &NodeList, now: u64) -> String {
    let mut s = format!(
        "{:<22} {:<8} {:<15} {:<17} {:<9} {:<10} {:<10} GPUS",
        "ID", "STATE", "VERIFICATION", "RENTABLE", "PRICE", "AGENT", "LAST SEEN"
    );
    for n in &list.nodes {
        let state = if n.online { "online" } else { "offline" };
        let verif = n.verification.as_str();
        let seen = n
            .last_heartbeat_at
            .map(|t| format!("{}s ago", now.saturating_sub(t)))
            .unwrap_or_else(|| "never".into());
        let price = n.price_per_gpu_hour.map_or_else(|| "-".to_owned(), crate::web::pages::price_text);
        let gpus: Vec<&str> = n.inventory.public.gpus.iter().map(|g| g.model.as_str()).collect();
        s.push_str(&format!(
            "\n{:<22} {:<8} {:<15} {:<17} {:<9} {:<10} {:<10} {}",
            Escaped(&n.id),
            state,
            verif,
            n.rentable.state.as_str(),
            price,
            Escaped(&n.agent_version),
            seen,
            Escaped(&gpus.join(", "))
        ));
    }
    s
}

/// The event log, a line per event (UTC), with what a node sent escaped.
fn human_events(list: &gpum_protocol::NodeEvents) -> String {
    let mut s = format!("{:<16} {:<18} {:<20} DETAIL", "AT (UTC)", "EVENT", "SUBJECT");
    for e in &list.events {
        s.push_str(&format!(
            "\n{:<16} {:<18} {:<20} {}",
            crate::web::pages::utc(e.at),
            e.kind.as_str(),
            Escaped(&e.subject),
            Escaped(&e.detail)
        ));
    }
    s
}

/// The day's samples, a line each: the host's figures, then each GPU's utilisation.
fn human_metrics(m: &gpum_protocol::NodeMetrics) -> String {
    let mut s = format!("{:<16} {:>6} {:>15} {:>9} GPU UTIL %", "AT (UTC)", "CPU %", "RAM MiB", "DISK GiB");
    for x in &m.samples {
        let g = &x.metrics;
        let util: Vec<String> = g.gpus.iter().map(|g| g.util_pct.to_string()).collect();
        s.push_str(&format!(
            "\n{:<16} {:>6.1} {:>15} {:>9} {}",
            crate::web::pages::utc(x.at),
            g.cpu_load_pct,
            format!("{}/{}", g.ram_used_mib, g.ram_total_mib),
            g.disk_free_gib,
            util.join(" ")
        ));
    }
    s
}

fn serve(args: ServeArgs, db_path: PathBuf, clock: Clock) -> Result<()> {
    let tls = match (&args.tls_cert, &args.tls_key, args.insecure_http) {
        (Some(c), Some(k), false) => Some((c.clone(), k.clone())),
        (None, None, true) => {
            if !args.listen.ip().is_loopback() {
                bail!("--insecure-http is allowed only on a loopback address, not {}", args.listen);
            }
            None
        }
        _ => bail!("give --tls-cert F --tls-key F, or --insecure-http on a loopback address"),
    };
    // The URL in install.sh is fixed here, before anything else happens.
    let public_url = match &args.public_url {
        Some(u) => {
            crate::install::check_public_url(u).map_err(|e| anyhow::anyhow!("--public-url: {e}"))?;
            Some(u.trim_end_matches('/').to_owned())
        }
        None if args.listen.ip().is_loopback() => None,
        None => bail!(
            "--public-url https://… is required when listening on {} (not loopback): it is the address \
             nodes download the installer from, and it is never taken from a request",
            args.listen
        ),
    };
    // Without --public-url the public URL is the listening address, an IP address: a site of
    // its own.
    if let (Some(url), Some(domain)) = (&public_url, &args.relay_domain) {
        let host = crate::install::public_url_host(url);
        if crate::relay::http::same_site(host, domain) && !args.allow_same_site_relay_domain {
            bail!(
                "--relay-domain {domain} is on the site of the public URL's host {host} (the same registrable \
                 domain): a tenant's page there could set cookies for the whole site and send same-site \
                 requests to the dashboard. Give the relay a domain of its own (e.g. gpum-usercontent.example \
                 for gpum.example, as GitHub serves user content from githubusercontent.com), or accept this \
                 with --allow-same-site-relay-domain"
            );
        }
    }
    let admin_token_hash = match &args.admin_token_file {
        None => None,
        Some(f) => {
            let t = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
            let t = t.trim();
            if let Some(why) = admin_token_weakness(t) {
                return Err(BadUsage(format!(
                    "the admin token in {} is too weak to guard the admin API: {why}. Make a new one \
                     with: (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {})",
                    f.display(),
                    f.display()
                ))
                .into());
            }
            Some(<[u8; 32]>::from(Sha256::digest(t.as_bytes())))
        }
    };
    let acceptor = match &tls {
        Some((cert, key)) => Some(crate::listen::tls_config(cert, key)?),
        None => None,
    };
    let target = crate::sql::Target::parse(&db_path);
    let db_connections = match (&target, args.db_connections) {
        (crate::sql::Target::Sqlite(_), Some(n)) if n > 1 => {
            bail!("--db-connections {n}: a SQLite database has one writer; more than 1 needs PostgreSQL")
        }
        (crate::sql::Target::Sqlite(_), _) => 1,
        (crate::sql::Target::Postgres(_), n) => n.unwrap_or(2),
    };
    let conn =
        store::open_target(&target).with_context(|| format!("open the database {}", target.display()))?;
    let mut conns = vec![conn];
    for _ in 1..db_connections {
        let more =
            conns[0].connect_again().with_context(|| format!("open the database {}", target.display()))?;
        conns.push(more);
    }
    let conn = &conns[0];
    // Checkpoints (copying the WAL back into the database file, with an fsync) run on their own
    // connection and thread, so no request waits for one inside its COMMIT; the database thread
    // only finishes one now and then so that the WAL restarts (Db::spawn_checkpointer). A WAL
    // that a long backup let grow is cut back when it restarts.
    // (SQLite only: PostgreSQL checkpoints by itself.)
    let ckpt = match conn.sqlite() {
        Some(c) => {
            c.pragma_update(None, "wal_autocheckpoint", 0)?;
            c.pragma_update(None, "journal_size_limit", crate::db::WAL_KEEP_BYTES)?;
            Some(store::open_target(&target)?)
        }
        None => None,
    };
    for (flag, addr) in
        [("--relay-listen", args.relay_listen), ("--relay-http-listen", args.relay_http_listen)]
    {
        if let Some(r) = addr
            && tls.is_none()
            && !r.ip().is_loopback()
        {
            bail!("{flag} without TLS is allowed only on a loopback address, not {r}");
        }
    }
    let listener =
        std::net::TcpListener::bind(args.listen).with_context(|| format!("listen on {}", args.listen))?;
    let bind = |addr: Option<SocketAddr>, flag: &str| -> anyhow::Result<Option<std::net::TcpListener>> {
        let Some(r) = addr else { return Ok(None) };
        let l = std::net::TcpListener::bind(r).with_context(|| format!("listen on {r} ({flag})"))?;
        l.set_nonblocking(true)?;
        Ok(Some(l))
    };
    let relay_listener = bind(args.relay_listen, "--relay-listen")?;
    let peer_listener = bind(args.peer_listen, "--peer-listen")?;
    let peer_secret = match &args.peer_secret_file {
        None => None,
        Some(f) => Some(read_peer_secret(f)?),
    };
    let relay_http_listener = bind(args.relay_http_listen, "--relay-http-listen")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let public_url =
        public_url.unwrap_or_else(|| format!("{}://{addr}", if tls.is_some() { "https" } else { "http" }));
    // The descriptors are shared by the tunnels and every door that accepts connections.
    let doors = 1 + usize::from(relay_listener.is_some()) + usize::from(relay_http_listener.is_some());
    let (max_connections, max_tunnels) = crate::listen::share_descriptors(
        crate::listen::raise_nofile_limit(),
        usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        usize::try_from(args.max_tunnels).unwrap_or(usize::MAX),
        doors,
    );
    let transport = crate::listen::Transport {
        header_timeout: Duration::from_secs(args.header_timeout),
        max_connections,
        write_timeout: Duration::from_secs(args.write_timeout),
        max_per_address: args
            .max_connections_per_address
            .map_or(crate::listen::default_max_per_address(max_connections), |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            }),
        terminators: terminators(&args.terminator_address)?,
        body_memory: usize::try_from(args.body_memory).unwrap_or(usize::MAX).saturating_mul(1024 * 1024),
    };
    #[cfg(feature = "test-knobs")]
    let (ping_every, ping_timeout) = match args.test_relay_ping_ms {
        Some(ms) => (Duration::from_millis(ms), Duration::from_millis(ms)),
        None => (gpum_protocol::tunnel::PING_EVERY, gpum_protocol::tunnel::PING_TIMEOUT),
    };
    #[cfg(not(feature = "test-knobs"))]
    let (ping_every, ping_timeout) = (gpum_protocol::tunnel::PING_EVERY, gpum_protocol::tunnel::PING_TIMEOUT);
    let relay = Arc::new(crate::relay::Relay::new(crate::relay::RelayConfig {
        max_streams_per_rental: usize::try_from(args.relay_max_streams).unwrap_or(64),
        idle_timeout: Duration::from_secs(args.relay_idle_timeout),
        rate: args.relay_rate,
        max_connections,
        max_tunnels,
        max_per_address: transport.max_per_address,
        terminators: transport.terminators.clone(),
        header_timeout: Duration::from_secs(args.header_timeout),
        trusted_proxies: args.relay_trust_proxy.clone(),
        domain: args.relay_domain.clone(),
        ping_every,
        ping_timeout,
    }));
    // PostgreSQL: the effects' `LISTEN` connection is made as the others were.
    let listen_target = conns[0].pg_target();
    let db = crate::db::Db::start_many(conns);
    let throttle = Arc::new(crate::throttle::Throttle::new(db.clone(), clock.clone()));
    let mesh = match (&args.peer_addr, peer_secret) {
        (Some(addr), Some(secret)) => {
            let m = crate::relay::mesh::Mesh::new(db.clone(), addr.clone(), &secret)
                .map_err(|e| BadUsage(format!("--peer-secret-file: {e}")))?;
            let m = Arc::new(m);
            relay.set_mesh(m.clone());
            Some(m)
        }
        _ => None,
    };
    if let Some(ckpt) = ckpt {
        db.spawn_checkpointer(ckpt, Duration::from_secs(1), crate::db::WAL_RESTART_FRAMES)?;
    }
    let state = Arc::new(AppState {
        db,
        clock,
        cfg: Config {
            heartbeat_interval_secs: args.heartbeat_interval,
            admin_token_hash,
            dist: args.dist.clone(),
            public_url,
            body_timeout: Duration::from_secs(args.body_timeout),
        },
        relay: relay.clone(),
        throttle: throttle.clone(),
    });

    init_logging();
    tracing::info!(
        public_url = %state.cfg.public_url,
        max_connections = transport.max_connections,
        max_tunnels,
        max_connections_per_address = transport.max_per_address,
        header_timeout_s = args.header_timeout,
        body_timeout_s = args.body_timeout,
        write_timeout_s = args.write_timeout,
        body_memory_mib = args.body_memory,
        db_connections,
        "serving"
    );

    if args.header_timeout <= args.heartbeat_interval {
        // The header timeout also closes idle keep-alive connections: agents would reconnect
        // for every heartbeat, and race the close now and then.
        tracing::warn!(
            "--header-timeout {} is not above --heartbeat-interval {}: agents' idle connections will be closed between heartbeats",
            args.header_timeout,
            args.heartbeat_interval
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let st = state.clone();
    let res = rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        // The one place the relay's tunnels and streams are ended: the effects any replica or
        // CLI command recorded, read from the database (`effects`).
        tokio::spawn(crate::effects::applier(
            state.db.clone(),
            relay.clone(),
            state.clock.clone(),
            listen_target,
        ));
        let tenants = Arc::new(crate::relay::Tenants {
            relay,
            db: state.db.clone(),
            clock: state.clock.clone(),
            throttle,
        });
        if let Some(l) = relay_listener {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %l.local_addr()?, tls = acceptor.is_some(), "relay listening");
            tokio::spawn(crate::relay::serve_tenants(
                l,
                acceptor.clone(),
                tenants.clone(),
                shutdown_signal(),
            ));
        }
        if let (Some(l), Some(m)) = (peer_listener, mesh) {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %l.local_addr()?, replica = %m.replica_id, peer_addr = %m.peer_addr, "relay mesh: peer listener");
            tokio::spawn(m.clone().keep_alive());
            tokio::spawn(crate::relay::mesh::serve_peers(l, tenants.clone(), m, shutdown_signal()));
        }
        if let Some(l) = relay_http_listener {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %l.local_addr()?, tls = acceptor.is_some(), "relay HTTP door listening");
            tokio::spawn(crate::relay::http::serve(l, acceptor.clone(), tenants, shutdown_signal()));
        }
        announce(acceptor.is_some(), addr)?;
        crate::listen::serve(listener, acceptor, server::router(state), transport, shutdown_signal()).await?;
        Ok::<(), anyhow::Error>(())
    });
    // A blocking task still running (a file being read) must not hold the process.
    rt.shutdown_timeout(Duration::from_secs(1));
    tracing::info!("stopped; {}", st.db.stats().summary());
    res
}

/// `serve`'s log, on stderr (the journal under systemd), filtered by `GPUM_LOG` (default
/// `info`): every field of every line escaped (`gpum_common::log::EscapedFields`: an e-mail typed
/// into the sign-in form cannot start a line of its own, issue 43), and colour only on a
/// terminal without `NO_COLOR` (a log file gets no escape sequence).
fn init_logging() {
    use std::io::IsTerminal;
    let colour = gpum_common::log::colour(
        std::io::stderr().is_terminal(),
        std::env::var_os(gpum_host::env::NO_COLOR).as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .fmt_fields(gpum_common::log::EscapedFields)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(gpum_host::env::GPUM_LOG)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
}

/// The relay mesh's secret from `f`: refused when others than its owner may read it, or when short.
fn read_peer_secret(f: &std::path::Path) -> Result<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode =
            std::fs::metadata(f).with_context(|| format!("read {}", f.display()))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(BadUsage(format!(
                "--peer-secret-file {}: others than its owner may read it (mode {:o}); make it 0600",
                f.display(),
                mode & 0o777
            ))
            .into());
        }
    }
    let s = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
    if s.trim().len() < 32 {
        return Err(BadUsage(format!(
            "--peer-secret-file {}: the secret is shorter than 32 characters. Make one with: \
             (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {})",
            f.display(),
            f.display()
        ))
        .into());
    }
    Ok(s.trim().to_string())
}

/// One `--relay-domain`: a DNS name of letters, digits, dashes and dots, lower-cased.
fn domain_arg(s: &str) -> Result<String, String> {
    let d = s.trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if d.len() > 200 || !d.split('.').all(label_ok) {
        return Err(format!("{s:?} is not a DNS name (e.g. relay.example.com)"));
    }
    Ok(d)
}

/// One `--relay-trust-proxy`: `192.0.2.10`, `10.0.0.0/8`, `2001:db8::/32`.
fn cidr_arg(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map(|n| n.trunc())
        .map_err(|_| format!("{s:?} is not an IP address or a CIDR block"))
}

/// One `--terminator-address`: an IP address, `loopback` or `none`.
fn terminator_arg(s: &str) -> Result<String, String> {
    if s != "none" {
        s.parse::<crate::listen::Terminator>()?;
    }
    Ok(s.to_owned())
}

/// The `--terminator-address` list: `none` stands alone.
fn terminators(given: &[String]) -> Result<Vec<crate::listen::Terminator>> {
    if given.iter().any(|g| g == "none") {
        if given.len() > 1 {
            bail!("--terminator-address none cannot be given with other addresses");
        }
        return Ok(Vec::new());
    }
    given
        .iter()
        .map(|g| g.parse().map_err(|e: String| anyhow::anyhow!("--terminator-address: {e}")))
        .collect()
}

fn announce(tls: bool, addr: SocketAddr) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", server::listening_line(tls, addr))?;
    out.flush()?;
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44: the mesh's secret is refused from a file others may read, or when short; its
    /// value is never in the error.
    #[test]
    fn the_peer_secret_file_is_owner_only_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("peer-secret");
        let secret = "0123456789abcdef0123456789abcdef";
        std::fs::write(&f, format!("{secret}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_peer_secret(&f).unwrap_err().to_string();
        assert!(e.contains("0600") && e.contains("644") && !e.contains(secret), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_peer_secret(&f).unwrap(), secret);
        std::fs::write(&f, "tiny-q7").unwrap();
        let e = read_peer_secret(&f).unwrap_err().to_string();
        assert!(e.contains("32 characters") && !e.contains("tiny-q7"), "{e}");
    }

    /// Issue 29, item 6: `serve` took any 32 characters, `aaaa…` included.
    #[test]
    fn the_node_list_shows_the_price_and_the_rentable_verdict() {
        use gpum_protocol::{Inventory, NodeSummary, RentableState};
        let node = |id: &str, price: Option<u64>, state: RentableState| {
            let mut n: NodeSummary = serde_json::from_value(serde_json::json!({
                "id": id, "online": false, "verification": "awaiting_check", "registered_at": 0,
                "agent_version": "1", "inventory": Inventory::default(),
            }))
            .unwrap();
            n.price_per_gpu_hour = price;
            n.rentable.state = state;
            n
        };
        let priced = node("node-a", Some(1250), RentableState::Rentable);
        let unpriced = node("node-b", None, RentableState::NoPrice);
        let text = human_nodes(&NodeList { nodes: vec![priced, unpriced], next: None }, 0);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("RENTABLE") && lines[0].contains("PRICE"), "{text}");
        let cols = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[1])[..5],
            ["node-a", "offline", "awaiting_check", "rentable", "12.50"],
            "{text}"
        );
        assert_eq!(cols(lines[2])[..5], ["node-b", "offline", "awaiting_check", "no_price", "-"], "{text}");
    }

    #[test]
    fn weak_admin_tokens_are_refused() {
        let urandom_hex = |n: usize| {
            let mut b = vec![0u8; n];
            std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut b).unwrap();
            hex::encode(b)
        };
        // What the guide makes (64 hex digits), a 128-bit hex token, base64 and punctuation.
        for _ in 0..200 {
            for t in [urandom_hex(32), urandom_hex(16)] {
                assert_eq!(admin_token_weakness(&t), None, "{t}");
            }
        }
        assert_eq!(admin_token_weakness("q/Ta1Vt9ESa/xAYBFGX7JHQ0+HZcBSqY"), None);
        for (t, why) in [
            ("0123456789abcdef0123456789abcde", "31 characters"),
            (&"a".repeat(64), "only 1 different"),
            ("passwordpasswordpasswordpassword", "different characters"),
            ("0123456789abcdef0123456789abcdef", "repeats itself"),
            ("ABCDEFGHIJKLMNOPQRSTUVWXYZ012345", "sequence"),
            ("0a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p", "sequence"),
            ("9f86d081884c7d65 9a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "a space"),
            ("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a0é", "non-ASCII"),
        ] {
            let got = admin_token_weakness(t).unwrap_or_else(|| panic!("{t} was accepted"));
            assert!(got.contains(why), "{t}: {got}");
            assert!(!got.contains(t), "the reason quotes the token: {got}");
        }
    }

    #[test]
    fn terminator_addresses() {
        use crate::listen::Terminator;
        let list = |a: &[&str]| terminators(&a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(list(&["loopback"]).unwrap(), vec![Terminator::Loopback]);
        assert!(list(&["none"]).unwrap().is_empty());
        assert!(list(&["none", "loopback"]).is_err());
        let mapped = list(&["::ffff:203.0.113.7", "2001:db8::1"]).unwrap();
        assert_eq!(
            mapped,
            vec![
                Terminator::Addr("203.0.113.7".parse().unwrap()),
                Terminator::Addr("2001:db8::1".parse().unwrap())
            ]
        );
        assert!(terminator_arg("proxy.example").is_err());
    }

    #[test]
    fn relay_domains_and_trusted_proxies_parse() {
        assert_eq!(domain_arg("Relay.GPUM.example.").unwrap(), "relay.gpum.example");
        for bad in ["", "relay..example", "-relay.example", "relay_x.example", "*.relay.example", "a b"] {
            assert!(domain_arg(bad).is_err(), "{bad:?}");
        }
        assert_eq!(cidr_arg("127.0.0.1").unwrap(), "127.0.0.1/32".parse().unwrap());
        assert_eq!(cidr_arg("10.1.2.3/8").unwrap(), "10.0.0.0/8".parse().unwrap());
        assert_eq!(cidr_arg("2001:db8::1/32").unwrap(), "2001:db8::/32".parse().unwrap());
        assert!(cidr_arg("proxy.example").is_err());
        assert!(cidr_arg("10.0.0.0/33").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("24h"), Ok(86_400));
        assert_eq!(parse_duration("30m"), Ok(1_800));
        assert_eq!(parse_duration("90s"), Ok(90));
        assert_eq!(parse_duration("7d"), Ok(604_800));
        assert_eq!(parse_duration("120"), Ok(120));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("-1h").is_err());
    }
}
