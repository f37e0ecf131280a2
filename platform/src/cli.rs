//! The `gpum-platform` command line: `serve`, and the admin operations run directly against the
//! database file (the same functions the admin HTTP API calls, so both always agree). SQLite's
//! WAL mode lets these run while a server has the same file open.
//!
//! Exit codes: 0 done, 1 the operation failed (the message, or with `--json` the error body, says
//! why), 2 bad usage, which includes `serve` refusing a weak admin token file
//! ([`admin_token_weakness`]).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpum_common::text::{Escaped, escape_controls};
use gpum_platform_core::currency::Currency;
use gpum_protocol::{CommandKind, NodeList, UpdateNodeRequest};

use crate::accounts;
use crate::clock::Clock;
use crate::error::ApiError;
use crate::store::{self, Scope};

mod earnings;
mod serve;

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
    Serve(Box<serve::ServeArgs>),
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
    /// What the rentals earned (issue 46): per owner, server, month and day, and per rental;
    /// `--owner` for one owner's, `--csv` for the rentals as CSV.
    Earnings(earnings::EarningsArgs),
    /// Agent releases and their rollouts (issue 47): add a signed dist, list, roll out to a
    /// percentage of the servers, pause, resume, halt.
    Releases {
        #[command(subcommand)]
        cmd: ReleasesCmd,
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

#[derive(Debug, Subcommand)]
enum ReleasesCmd {
    /// Add a signed dist directory (`cargo xtask dist` / `sign`): release.json and its .sig,
    /// manifest.json and its .sig, gpum-agent. Refused unless they agree with each other.
    Add { dir: PathBuf },
    /// The releases, newest first, with their rollouts.
    List,
    /// Offer VERSION to PERCENT % of the servers (raising it keeps the servers already chosen);
    /// another current rollout ends.
    Rollout {
        version: String,
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        percent: u8,
        /// Halt by itself when more than this share (percent) of the servers that reported
        /// rolled back or refused the version (default 20).
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        max_failures: Option<u8>,
        /// A schedule: raise the percentage by STEP every `--every` while the rollout is
        /// active, up to 100 (the time paused or halted does not count).
        #[arg(long, requires = "every", value_parser = clap::value_parser!(u8).range(1..=100))]
        step: Option<u8>,
        /// The schedule's interval: a number with `m`, `h` or `d` (`30m`, `6h`, `1d`); at
        /// least a minute.
        #[arg(long, requires = "step", value_parser = parse_every)]
        every: Option<u64>,
        /// TEST ONLY: offer the version whatever the servers run (the downgrade test).
        #[cfg(feature = "test-knobs")]
        #[arg(long, hide = true)]
        offer_regardless: bool,
    },
    /// Offer the current rollout to no server until `resume`.
    Pause,
    /// Offer a paused or halted rollout again.
    Resume,
    /// Stop the current rollout (the operator's halt).
    Halt,
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
    /// The price per GPU-hour in the platform's currency, as typed on the page (`12.50`; in a
    /// currency without a minor unit, whole units).
    #[arg(long, conflicts_with = "no_price")]
    price: Option<String>,
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
    /// Automatic agent upgrades for this server (issue 47; the owner's switch, default on).
    #[arg(long, value_enum, value_name = "on|off")]
    auto_update: Option<OnOff>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

fn parse_price(s: &str, c: Currency) -> Result<u64, String> {
    crate::web::pages::parse_price(s, c).ok_or_else(|| {
        let example = crate::web::pages::price_text(1250, c);
        format!("--price {s:?} is not a price in {} such as {example}", c.code)
    })
}

impl SetArgs {
    /// The update, with the price read in the platform's currency `c`.
    fn request(&self, c: Currency) -> Result<UpdateNodeRequest, String> {
        let price = self.price.as_deref().map(|p| parse_price(p, c)).transpose()?;
        Ok(UpdateNodeRequest {
            name: if self.host_name { Some(None) } else { self.name.clone().map(Some) },
            price_per_gpu_hour: if self.no_price { Some(None) } else { price.map(Some) },
            min_rental_minutes: self.min_rental,
            paused: match (self.pause, self.resume) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            auto_update: self.auto_update.map(|o| o == OnOff::On),
        })
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
        return serve::start(serve::ServeConfig::check(*args, &db_path)?, clock);
    }
    if let Cmd::Backup { to } = &cli.cmd {
        return backup(&db_path, to, cli.json);
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
    match cli.cmd {
        Cmd::Serve(_) | Cmd::Backup { .. } | Cmd::Migrate { .. } => unreachable!("handled above"),
        Cmd::JoinCode { cmd } => join_code(cmd, now, json, &tx),
        Cmd::Owners { cmd } => owners(cmd, now, json, &tx),
        Cmd::Nodes { cmd } => nodes(cmd, now, json, &tx),
        Cmd::Rentals { cmd } => rentals(cmd, now, json, &tx),
        Cmd::Earnings(args) => earnings::run(&args, now, json, &tx),
        Cmd::Releases { cmd } => releases(cmd, now, json, &tx),
        Cmd::RentalRegistries { cmd } => rental_registries(&cmd, json, &tx),
        Cmd::ProbeImage { cmd } => probe_image(cmd, json, &tx),
    }
}

/// `backup --to FILE`: a consistent copy of a SQLite database.
fn backup(db_path: &std::path::Path, to: &std::path::Path, json: bool) -> Result<()> {
    if let crate::sql::Target::Postgres(_) = crate::sql::Target::parse(db_path) {
        bail!("backup copies a SQLite file; back PostgreSQL up with its own tools (pg_dump)");
    }
    let b = crate::db::backup(db_path, to)?;
    if json {
        println!("{}", serde_json::to_string(&b)?);
    } else {
        println!("{} ({} bytes)", escape_controls(&b.path.display().to_string()), b.bytes);
    }
    Ok(())
}

/// Prints `v` with `--json`, else the human line (its control characters escaped).
fn out(json: bool, v: &serde_json::Value, human: String) {
    if json {
        println!("{v}");
    } else {
        println!("{}", escape_controls(&human));
    }
}

/// `join-code create`.
fn join_code(cmd: JoinCodeCmd, now: u64, json: bool, tx: &Tx<'_>) -> Result<()> {
    let JoinCodeCmd::Create { ttl, owner } = cmd;
    let v = tx(&|c| {
        let scope = match &owner {
            Some(o) => Scope::Owner(accounts::find_owner(c, o)?.id),
            None => Scope::All,
        };
        Ok(serde_json::to_value(store::create_join_code(c, now, ttl, &scope)?)?)
    })?;
    out(json, &v, v["code"].as_str().unwrap_or_default().to_owned());
    Ok(())
}

/// `nodes …`: each one transaction, as the admin API's.
fn nodes(cmd: NodesCmd, now: u64, json: bool, tx: &Tx<'_>) -> Result<()> {
    match cmd {
        NodesCmd::List => {
            let v = tx(&|c| Ok(serde_json::to_value(store::list_nodes(c, now, &Scope::All)?)?))?;
            let list: NodeList = serde_json::from_value(v.clone())?;
            if json {
                println!("{v}");
            } else {
                println!("{}", human_nodes(&list, now, currency(tx)?));
            }
        }
        NodesCmd::Delete { id } => {
            let v = tx(&|c| {
                store::delete_node(c, now, &id, &Scope::All)?;
                Ok(serde_json::json!({ "deleted": id }))
            })?;
            out(json, &v, format!("deleted {id}"));
        }
        NodesCmd::Command { id, kind } => {
            let kind = CommandKind::parse(&kind).map(|k| k.as_str()).unwrap_or("");
            let v =
                tx(&|c| Ok(serde_json::to_value(store::queue_command(c, now, &id, kind, &Scope::All)?)?))?;
            out(json, &v, format!("queued {kind} for {id}: {}", v["id"].as_str().unwrap_or_default()));
        }
        NodesCmd::RotateToken { id } => {
            let v = tx(&|c| Ok(serde_json::to_value(store::rotate_token(c, now, &id, &Scope::All)?)?))?;
            out(json, &v, v["node_token"].as_str().unwrap_or_default().to_owned());
        }
        NodesCmd::Events { id } => {
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
        NodesCmd::Metrics { id } => {
            let v = tx(&|c| Ok(serde_json::to_value(store::node_samples(c, &id, now, &Scope::All)?)?))?;
            if json {
                println!("{v}");
            } else {
                let m: gpum_protocol::NodeMetrics = serde_json::from_value(v)?;
                println!("{}", human_metrics(&m));
            }
        }
        NodesCmd::Set(args) => {
            let cur = currency(tx)?;
            let req = args.request(cur).map_err(anyhow::Error::msg)?;
            let v = tx(&|c| Ok(serde_json::to_value(store::update_node(c, &args.id, &req, &Scope::All)?)?))?;
            out(json, &v, node_set_line(&args.id, &v, cur));
        }
        NodesCmd::KnownContainers { id, container_ids } => {
            let v = tx(&|c| {
                store::set_known_containers(c, &id, &container_ids)?;
                Ok(serde_json::json!({ "container_ids": container_ids }))
            })?;
            out(json, &v, format!("{id}: {} known container(s)", container_ids.len()));
        }
    }
    Ok(())
}

/// The platform's currency (`serve --currency`), read in its own transaction.
fn currency(tx: &Tx<'_>) -> Result<Currency> {
    let code = tx(&|c| Ok(serde_json::json!(store::currency(c)?.code)))?;
    Currency::parse(code.as_str().unwrap_or_default()).map_err(anyhow::Error::msg)
}

/// `nodes set`'s human line: the node's name, price, shortest rental and pause.
fn node_set_line(id: &str, v: &serde_json::Value, c: Currency) -> String {
    let price = v["price_per_gpu_hour"].as_u64().map_or_else(
        || "not for rent yet".to_owned(),
        |p| format!("{} {} per GPU-hour", c.code, crate::web::pages::price_text(p, c)),
    );
    let paused = if v["paused"].as_bool() == Some(true) { ", paused" } else { "" };
    format!(
        "{id}: {}, {price}, at least {} min{paused}",
        v["name"].as_str().unwrap_or_default(),
        v["min_rental_minutes"]
    )
}

/// `releases …`: each one transaction, as the admin API's.
fn releases(cmd: ReleasesCmd, now: u64, json: bool, tx: &Tx<'_>) -> Result<()> {
    use gpum_platform_core::rollout::Action;
    let action = |a: Action| -> Result<()> {
        let v = tx(&|c| Ok(serde_json::to_value(store::rollout_action(c, now, a)?)?))?;
        let r: gpum_protocol::RolloutSummary = serde_json::from_value(v.clone())?;
        out(json, &v, rollout_line(&r));
        Ok(())
    };
    match cmd {
        ReleasesCmd::Add { dir } => {
            let files = store::read_release_dir(&dir).map_err(anyhow::Error::msg)?;
            let v = tx(&|c| Ok(serde_json::to_value(store::add_release(c, now, &files)?)?))?;
            out(
                json,
                &v,
                format!(
                    "added {} (gpum-agent {} bytes, sha256 {})",
                    v["version"].as_str().unwrap_or_default(),
                    v["agent_size"],
                    v["agent_sha256"].as_str().unwrap_or_default()
                ),
            );
        }
        ReleasesCmd::List => {
            let v = tx(&|c| Ok(serde_json::to_value(store::list_releases(c, now)?)?))?;
            let list: gpum_protocol::ReleaseList = serde_json::from_value(v.clone())?;
            let mut s = format!("{:<12} {:<12} {:<12} ROLLOUT", "VERSION", "ADDED", "AGENT BYTES");
            for r in &list.releases {
                s.push_str(&format!(
                    "\n{:<12} {:<12} {:<12} {}",
                    Escaped(&r.version),
                    crate::store::iso_utc(r.added_at as i64).get(..10).unwrap_or_default(),
                    r.agent_size,
                    r.rollout.as_ref().map_or_else(|| "-".to_owned(), rollout_line)
                ));
            }
            if json { println!("{v}") } else { println!("{s}") }
        }
        ReleasesCmd::Rollout {
            version,
            percent,
            max_failures,
            step,
            every,
            #[cfg(feature = "test-knobs")]
            offer_regardless,
        } => {
            #[cfg(not(feature = "test-knobs"))]
            let offer_regardless = false;
            let req = gpum_protocol::RolloutRequest {
                percent,
                max_failure_percent: max_failures,
                offer_regardless,
                step: step
                    .zip(every)
                    .map(|(percent, every_secs)| gpum_protocol::RolloutStep { percent, every_secs }),
            };
            let v = tx(&|c| {
                Ok(serde_json::to_value(store::start_rollout(
                    c,
                    now,
                    &version,
                    &req,
                    cfg!(feature = "test-knobs"),
                )?)?)
            })?;
            let r: gpum_protocol::RolloutSummary = serde_json::from_value(v.clone())?;
            out(json, &v, rollout_line(&r));
        }
        ReleasesCmd::Pause => action(Action::Pause)?,
        ReleasesCmd::Resume => action(Action::Resume)?,
        ReleasesCmd::Halt => action(Action::Halt)?,
    }
    Ok(())
}

/// A rollout in one line: its version, state, percentage and, when halted, why.
pub fn rollout_line(r: &gpum_protocol::RolloutSummary) -> String {
    let why = match r.halt_reason {
        Some(gpum_protocol::HaltReason::Failures) => format!(
            ": {} of {} servers that reported rolled back or refused it (more than {} %)",
            r.failed, r.reported, r.max_failure_percent
        ),
        Some(gpum_protocol::HaltReason::Operator) => ": halted by the operator".to_owned(),
        None => format!(", {} of {} reported servers failed", r.failed, r.reported),
    };
    let schedule = match (r.step, r.next_step_at) {
        (Some(s), Some(next)) => format!(
            " (+{} % every {}, next at {})",
            s.percent,
            every_text(s.every_secs),
            crate::store::iso_utc(next.min(i64::MAX as u64) as i64)
        ),
        (Some(s), None) => format!(" (+{} % every {})", s.percent, every_text(s.every_secs)),
        (None, _) => String::new(),
    };
    format!("{} {} at {} %{schedule}{why}", r.version, r.state, r.percent)
}

/// `--every`: a whole number of minutes (`m`), hours (`h`) or days (`d`), at least a minute.
fn parse_every(s: &str) -> Result<u64, String> {
    let unit = match s.chars().last() {
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86_400,
        _ => return Err(format!("{s:?}: a number with m, h or d (30m, 6h, 1d)")),
    };
    let n: u64 =
        s[..s.len() - 1].parse().map_err(|_| format!("{s:?}: a number with m, h or d (30m, 6h, 1d)"))?;
    let secs = n.checked_mul(unit).ok_or_else(|| format!("{s:?}: too long"))?;
    if secs < gpum_protocol::MIN_ROLLOUT_STEP_SECS {
        return Err(format!("{s:?}: at least a minute (1m)"));
    }
    Ok(secs)
}

/// An interval as `--every` takes it: days, hours or minutes when whole, else seconds.
fn every_text(secs: u64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `rental-registries set|reset|show`.
fn rental_registries(cmd: &RentalRegistriesCmd, json: bool, tx: &Tx<'_>) -> Result<()> {
    let v = tx(&|c| {
        let list = match cmd {
            RentalRegistriesCmd::Set { registries } => crate::rentals::set_registries(c, Some(registries))?,
            RentalRegistriesCmd::Reset => crate::rentals::set_registries(c, None)?,
            RentalRegistriesCmd::Show => crate::rentals::registries(c)?,
        };
        Ok(serde_json::json!({ "registries": list }))
    })?;
    let list: Vec<String> = serde_json::from_value(v["registries"].clone())?;
    out(json, &v, list.join(" "));
    Ok(())
}

/// `probe-image set|clear|show`.
fn probe_image(cmd: ProbeImageCmd, json: bool, tx: &Tx<'_>) -> Result<()> {
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
    out(json, &v, v["image"].as_str().unwrap_or("(none)").to_owned());
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

pub(crate) type Tx<'a> = dyn Fn(&dyn Fn(&crate::sql::Conn) -> Result<serde_json::Value, ApiError>) -> Result<serde_json::Value>
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
fn human_nodes(list: &NodeList, now: u64, c: Currency) -> String {
    let mut s = format!(
        "{:<22} {:<24} {:<8} {:<15} {:<17} {:<9} {:<10} {:<10} GPUS",
        "ID",
        "OWNER",
        "STATE",
        "VERIFICATION",
        "RENTABLE",
        format!("PRICE {}", c.code),
        "AGENT",
        "LAST SEEN"
    );
    for n in &list.nodes {
        let state = if n.online { "online" } else { "offline" };
        let verif = n.verification.as_str();
        let seen = n
            .last_heartbeat_at
            .map(|t| format!("{}s ago", now.saturating_sub(t)))
            .unwrap_or_else(|| "never".into());
        let price =
            n.price_per_gpu_hour.map_or_else(|| "-".to_owned(), |p| crate::web::pages::price_text(p, c));
        let gpus: Vec<&str> = n.inventory.public.gpus.iter().map(|g| g.model.as_str()).collect();
        s.push_str(&format!(
            "\n{:<22} {:<24} {:<8} {:<15} {:<17} {:<9} {:<10} {:<10} {}",
            Escaped(&n.id),
            // The operator's own server (its join code named no owner) is in no owner's cabinet.
            Escaped(n.owner.as_deref().unwrap_or("(operator)")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_takes_minutes_hours_and_days_and_refuses_less_than_a_minute() {
        assert_eq!(parse_every("30m"), Ok(1800));
        assert_eq!(parse_every("6h"), Ok(21_600));
        assert_eq!(parse_every("1d"), Ok(86_400));
        for bad in ["0m", "", "h", "6", "6x", "-1h", "1.5h", "99999999999999999d"] {
            assert!(parse_every(bad).is_err(), "{bad:?}");
        }
        assert_eq!(every_text(21_600), "6h");
        assert_eq!(every_text(90), "90s");
        assert_eq!(every_text(1800), "30m");
    }

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
        let mut unpriced = node("node-b", None, RentableState::NoPrice);
        unpriced.owner = Some("ann@example.org".into());
        let text = human_nodes(
            &NodeList { nodes: vec![priced, unpriced], next: None },
            0,
            Currency::parse("USD").unwrap(),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("RENTABLE") && lines[0].contains("PRICE USD") && lines[0].contains("OWNER"),
            "{text}"
        );
        let cols = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        // The owner's e-mail, or the operator's own server (in no owner's cabinet).
        assert_eq!(
            cols(lines[1])[..6],
            ["node-a", "(operator)", "offline", "awaiting_check", "rentable", "12.50"],
            "{text}"
        );
        assert_eq!(
            cols(lines[2])[..6],
            ["node-b", "ann@example.org", "offline", "awaiting_check", "no_price", "-"],
            "{text}"
        );
    }

    /// Issue 29, item 6: `serve` took any 32 characters, `aaaa…` included.
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
