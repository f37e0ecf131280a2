//! `gpum-platform serve`: arguments → a checked configuration → start.
//!
//! [`ServeConfig::check`] is pure: it turns the parsed arguments into a configuration whose
//! combinations hold (TLS or plain HTTP on loopback, the public URL, the relay's domain on a site of
//! its own, one SQLite writer, plain relay doors only on loopback, the terminators), or refuses
//! with the message the operator reads. [`start`] does the I/O: it reads the secrets' files,
//! opens the database, binds the listeners and runs until a signal.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::{BadUsage, admin_token_weakness};
use crate::clock::Clock;
use crate::server::{self, AppState, Config};
use crate::sql::Target;
use crate::store;

#[derive(Debug, clap::Args)]
pub(super) struct ServeArgs {
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
    /// The platform's currency (issue 46): an ISO 4217 code (RUB, USD, EUR…); every price and
    /// amount is in its minor units. Unset: the one set before, else RUB. It cannot change
    /// once a rental exists.
    #[arg(long, value_name = "CODE", value_parser = currency_arg)]
    currency: Option<String>,
    /// Alerts to owners by e-mail (issue 46): a TOML file naming the SMTP server (`host`,
    /// `port`, `from`, `tls` = starttls, tls or none, `username`, `password`); one holding a
    /// password must be 0600. Without it no alert e-mail is sent. docs/operator-guide.md, "Alerts".
    #[arg(long, value_name = "FILE")]
    smtp: Option<PathBuf>,
    /// Alerts to owners by webhook (issue 46): the platform's Ed25519 key that signs each body
    /// (PKCS#8 PEM, 0600), made there when the file does not exist; every replica needs the same
    /// file. Without it no webhook is sent.
    #[arg(long, value_name = "FILE")]
    alert_key_file: Option<PathBuf>,
    /// Seconds between two sweeps of the owners' alerts (servers offline, checks failed,
    /// quarantines).
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    alert_sweep_secs: u64,
    /// TEST ONLY (the `test-knobs` feature): ping each agent's tunnel every this many
    /// milliseconds, and drop it when the answer takes as long, instead of every 20 s within
    /// 15 s, so that an end-to-end test can cut the network and watch the tunnel come back.
    #[cfg(feature = "test-knobs")]
    #[arg(long, hide = true, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..))]
    test_relay_ping_ms: Option<u64>,
}

/// `serve`'s arguments once their combinations are checked ([`ServeConfig::check`]).
#[derive(Debug)]
pub(super) struct ServeConfig {
    /// The certificate chain and key, or `None`: plain HTTP on a loopback address.
    tls: Option<(PathBuf, PathBuf)>,
    /// `--public-url` without its trailing `/`; `None`: the listening address (loopback only).
    public_url: Option<String>,
    target: Target,
    /// Database connections: 1 on SQLite, `--db-connections` (default 2) on PostgreSQL.
    db_connections: u16,
    terminators: Vec<crate::listen::Terminator>,
    /// The rest, as given (clap checked their ranges).
    args: ServeArgs,
}

impl ServeConfig {
    /// The checked configuration, or the refusal `serve` prints (exit 1). Reads nothing.
    pub(super) fn check(args: ServeArgs, db_path: &Path) -> Result<ServeConfig> {
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
        let target = Target::parse(db_path);
        let db_connections = match (&target, args.db_connections) {
            (Target::Sqlite(_), Some(n)) if n > 1 => {
                bail!("--db-connections {n}: a SQLite database has one writer; more than 1 needs PostgreSQL")
            }
            (Target::Sqlite(_), _) => 1,
            (Target::Postgres(_), n) => n.unwrap_or(2),
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
        let terminators = terminators(&args.terminator_address)?;
        Ok(ServeConfig { tls, public_url, target, db_connections, terminators, args })
    }
}

/// The admin API's token hash from `--admin-token-file`; a weak token is bad usage (exit 2).
fn admin_token_hash(file: Option<&Path>) -> Result<Option<[u8; 32]>> {
    let Some(f) = file else { return Ok(None) };
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
    Ok(Some(<[u8; 32]>::from(Sha256::digest(t.as_bytes()))))
}

/// The database's connections (`--db-connections`) and, on SQLite, the checkpointer's own.
type Connections = (Vec<crate::sql::Conn>, Option<crate::sql::Conn>);

/// `--currency`: a code the platform knows (`gpum_platform_core::currency`), with whatever
/// decimal places it has: the owners' prices are typed and shown in them (`12.50`, `1250` yen,
/// `1.250` dinars).
fn currency_arg(s: &str) -> Result<String, String> {
    Ok(gpum_platform_core::currency::Currency::parse(s)?.code.to_owned())
}

fn open_database(target: &Target, db_connections: u16) -> Result<Connections> {
    let conn =
        store::open_target(target).with_context(|| format!("open the database {}", target.display()))?;
    let mut conns = vec![conn];
    for _ in 1..db_connections {
        let more =
            conns[0].connect_again().with_context(|| format!("open the database {}", target.display()))?;
        conns.push(more);
    }
    // Checkpoints (copying the WAL back into the database file, with an fsync) run on their own
    // connection and thread, so no request waits for one inside its COMMIT; the database thread
    // only finishes one now and then so that the WAL restarts (Db::spawn_checkpointer). A WAL
    // that a long backup let grow is cut back when it restarts.
    // (SQLite only: PostgreSQL checkpoints by itself.)
    let ckpt = match conns[0].sqlite() {
        Some(c) => {
            c.pragma_update(None, "wal_autocheckpoint", 0)?;
            c.pragma_update(None, "journal_size_limit", crate::db::WAL_KEEP_BYTES)?;
            Some(store::open_target(target)?)
        }
        None => None,
    };
    Ok((conns, ckpt))
}

/// The sockets `serve` listens on: the platform's door and the optional relay doors.
struct Doors {
    main: std::net::TcpListener,
    relay: Option<std::net::TcpListener>,
    relay_http: Option<std::net::TcpListener>,
    peer: Option<std::net::TcpListener>,
}

impl Doors {
    fn bind(args: &ServeArgs) -> Result<Doors> {
        let main =
            std::net::TcpListener::bind(args.listen).with_context(|| format!("listen on {}", args.listen))?;
        let bind = |addr: Option<SocketAddr>, flag: &str| -> Result<Option<std::net::TcpListener>> {
            let Some(r) = addr else { return Ok(None) };
            let l = std::net::TcpListener::bind(r).with_context(|| format!("listen on {r} ({flag})"))?;
            l.set_nonblocking(true)?;
            Ok(Some(l))
        };
        let relay = bind(args.relay_listen, "--relay-listen")?;
        let peer = bind(args.peer_listen, "--peer-listen")?;
        let relay_http = bind(args.relay_http_listen, "--relay-http-listen")?;
        main.set_nonblocking(true)?;
        Ok(Doors { main, relay, relay_http, peer })
    }

    /// The doors that accept connections and share the descriptors with the tunnels.
    fn count(&self) -> usize {
        1 + usize::from(self.relay.is_some()) + usize::from(self.relay_http.is_some())
    }
}

/// The connections' limits, once the descriptors are shared among the doors and the tunnels;
/// and the most tunnels at once.
fn transport(
    args: &ServeArgs,
    terminators: Vec<crate::listen::Terminator>,
    doors: usize,
) -> (crate::listen::Transport, usize) {
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
        terminators,
        body_memory: usize::try_from(args.body_memory).unwrap_or(usize::MAX).saturating_mul(1024 * 1024),
    };
    (transport, max_tunnels)
}

fn relay_config(
    args: &ServeArgs,
    transport: &crate::listen::Transport,
    max_tunnels: usize,
) -> crate::relay::RelayConfig {
    #[cfg(feature = "test-knobs")]
    let (ping_every, ping_timeout) = match args.test_relay_ping_ms {
        Some(ms) => (Duration::from_millis(ms), Duration::from_millis(ms)),
        None => (gpum_protocol::tunnel::PING_EVERY, gpum_protocol::tunnel::PING_TIMEOUT),
    };
    #[cfg(not(feature = "test-knobs"))]
    let (ping_every, ping_timeout) = (gpum_protocol::tunnel::PING_EVERY, gpum_protocol::tunnel::PING_TIMEOUT);
    crate::relay::RelayConfig {
        max_streams_per_rental: usize::try_from(args.relay_max_streams).unwrap_or(64),
        idle_timeout: Duration::from_secs(args.relay_idle_timeout),
        rate: args.relay_rate,
        max_connections: transport.max_connections,
        max_tunnels,
        max_per_address: transport.max_per_address,
        terminators: transport.terminators.clone(),
        header_timeout: Duration::from_secs(args.header_timeout),
        trusted_proxies: args.relay_trust_proxy.clone(),
        domain: args.relay_domain.clone(),
        ping_every,
        ping_timeout,
    }
}

/// Serves `cfg` until SIGTERM or Ctrl-C: reads the secrets' files, opens the database, binds
/// the doors, then runs them.
pub(super) fn start(cfg: ServeConfig, clock: Clock) -> Result<()> {
    let ServeConfig { tls, public_url, target, db_connections, terminators, args } = cfg;
    let admin_token_hash = admin_token_hash(args.admin_token_file.as_deref())?;
    let acceptor = match &tls {
        Some((cert, key)) => Some(crate::listen::tls_config(cert, key)?),
        None => None,
    };
    let (conns, ckpt) = open_database(&target, db_connections)?;
    if let Some(code) = &args.currency {
        let c = store::set_currency(&conns[0], code).map_err(|e| anyhow::anyhow!("--currency: {e}"))?;
        tracing::info!(currency = c.code, minor_units = c.minor_units, "currency");
    }
    // Read once: it cannot change once a rental exists (`store::set_currency`).
    let currency = store::currency(&conns[0]).map_err(|e| anyhow::anyhow!("the currency: {}", e.message))?;
    let alerts = crate::alerts::Alerts {
        smtp: args
            .smtp
            .as_deref()
            .map(crate::alerts::load_smtp)
            .transpose()
            .map_err(|e| BadUsage(format!("{e:#}")))?,
        key: args
            .alert_key_file
            .as_deref()
            .map(crate::alerts::load_or_create_key)
            .transpose()
            .map_err(|e| BadUsage(format!("{e:#}")))?,
        sweep_every: Duration::from_secs(args.alert_sweep_secs),
    };
    let doors = Doors::bind(&args)?;
    let peer_secret = match &args.peer_secret_file {
        None => None,
        Some(f) => Some(read_peer_secret(f)?),
    };
    let addr = doors.main.local_addr()?;
    let public_url =
        public_url.unwrap_or_else(|| format!("{}://{addr}", if tls.is_some() { "https" } else { "http" }));
    let (transport, max_tunnels) = transport(&args, terminators, doors.count());
    let relay = Arc::new(crate::relay::Relay::new(relay_config(&args, &transport, max_tunnels)));
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
            currency,
        },
        relay,
        throttle,
        alerts: Arc::new(alerts),
    });
    init_logging();
    log_start(&args, &state, &transport, max_tunnels, db_connections);
    tracing::info!(
        smtp = state.alerts.smtp.as_ref().map_or("off", |s| s.describe.as_str()),
        webhook_key = state.alerts.key.as_ref().map_or("off", |k| k.public_b64.as_str()),
        sweep_s = args.alert_sweep_secs,
        "alerts to owners"
    );
    run(Running { state, doors, acceptor, transport, mesh, listen_target })
}

/// The first lines of `serve`'s log: what it serves with, and a warning when the header
/// timeout would close agents' idle connections.
fn log_start(
    args: &ServeArgs,
    state: &AppState,
    transport: &crate::listen::Transport,
    max_tunnels: usize,
    db_connections: u16,
) {
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
}

/// What runs once everything is opened and bound.
struct Running {
    state: Arc<AppState>,
    doors: Doors,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    transport: crate::listen::Transport,
    mesh: Option<Arc<crate::relay::mesh::Mesh>>,
    listen_target: Option<crate::pgurl::PgTarget>,
}

/// Runs the doors, the relay's and the effects' applier until a signal.
fn run(r: Running) -> Result<()> {
    let Running { state, doors, acceptor, transport, mesh, listen_target } = r;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let st = state.clone();
    let res = rt.block_on(async move {
        let addr = doors.main.local_addr()?;
        let listener = tokio::net::TcpListener::from_std(doors.main)?;
        let relay = state.relay.clone();
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
            throttle: state.throttle.clone(),
        });
        if let Some(l) = doors.relay {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %l.local_addr()?, tls = acceptor.is_some(), "relay listening");
            tokio::spawn(crate::relay::serve_tenants(
                l,
                acceptor.clone(),
                tenants.clone(),
                shutdown_signal(),
            ));
        }
        if let (Some(l), Some(m)) = (doors.peer, mesh) {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %l.local_addr()?, replica = %m.replica_id, peer_addr = %m.peer_addr, "relay mesh: peer listener");
            tokio::spawn(m.clone().keep_alive());
            tokio::spawn(crate::relay::mesh::serve_peers(l, tenants.clone(), m, shutdown_signal()));
        }
        if let Some(l) = doors.relay_http {
            let l = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %l.local_addr()?, tls = acceptor.is_some(), "relay HTTP door listening");
            tokio::spawn(crate::relay::http::serve(l, acceptor.clone(), tenants, shutdown_signal()));
        }
        // Alerts to owners (issue 46): every replica sweeps; each notice is claimed by one.
        tokio::spawn(crate::alerts::sweeper(state.clone()));
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

    /// `serve`'s arguments as the command line gives them (after `serve`).
    fn args(given: &[&str]) -> ServeArgs {
        use clap::Parser;
        let line = ["gpum-platform", "serve"].iter().chain(given);
        match super::super::Cli::try_parse_from(line).unwrap().cmd {
            super::super::Cmd::Serve(a) => *a,
            other => panic!("{other:?}"),
        }
    }

    fn refusal(given: &[&str], db: &str) -> String {
        format!("{:#}", ServeConfig::check(args(given), Path::new(db)).unwrap_err())
    }

    /// On loopback with plain HTTP nothing else is needed: the public URL is the listening
    /// address, SQLite gets one connection, PostgreSQL two, the terminator is any loopback address.
    #[test]
    fn defaults_on_loopback() {
        use crate::listen::Terminator;
        let c = ServeConfig::check(args(&["--listen", "127.0.0.1:0", "--insecure-http"]), Path::new("p.db"))
            .unwrap();
        assert_eq!((c.tls, c.public_url, c.db_connections), (None, None, 1));
        assert_eq!(c.target, Target::Sqlite("p.db".into()));
        assert_eq!(c.terminators, vec![Terminator::Loopback]);
        assert_eq!((c.args.header_timeout, c.args.body_timeout, c.args.max_connections), (20, 30, 1024));
        let pg = "postgres://gpum@localhost/gpum";
        let c =
            ServeConfig::check(args(&["--listen", "127.0.0.1:0", "--insecure-http"]), Path::new(pg)).unwrap();
        assert_eq!(c.db_connections, 2);
        let c = ServeConfig::check(
            args(&[
                "--listen",
                "0.0.0.0:443",
                "--tls-cert",
                "c.pem",
                "--tls-key",
                "k.pem",
                "--public-url",
                "https://gpum.example/",
                "--relay-domain",
                "gpum-usercontent.example",
                "--relay-listen",
                "0.0.0.0:8443",
                "--db-connections",
                "4",
                "--terminator-address",
                "none",
            ]),
            Path::new(pg),
        )
        .unwrap();
        assert_eq!(c.tls, Some(("c.pem".into(), "k.pem".into())));
        assert_eq!(c.public_url.as_deref(), Some("https://gpum.example"));
        assert_eq!(c.db_connections, 4);
        assert!(c.terminators.is_empty());
    }

    /// Each refusal, with the message `serve` printed before it was split.
    #[test]
    fn each_refusal() {
        let db = "p.db";
        let plain = ["--listen", "127.0.0.1:0", "--insecure-http"];
        for (given, said) in [
            (
                &["--listen", "0.0.0.0:80", "--insecure-http"][..],
                "--insecure-http is allowed only on a loopback address, not 0.0.0.0:80",
            ),
            (
                &["--listen", "127.0.0.1:0"][..],
                "give --tls-cert F --tls-key F, or --insecure-http on a loopback address",
            ),
            (
                &["--listen", "0.0.0.0:443", "--tls-cert", "c", "--tls-key", "k"][..],
                "--public-url https://… is required when listening on 0.0.0.0:443 (not loopback)",
            ),
            (
                &["--listen", "127.0.0.1:0", "--insecure-http", "--public-url", "ftp://x"][..],
                "--public-url: ",
            ),
            (
                &[
                    "--listen",
                    "127.0.0.1:0",
                    "--insecure-http",
                    "--public-url",
                    "http://127.0.0.1:8080",
                    "--relay-http-listen",
                    "127.0.0.1:0",
                    "--relay-domain",
                    "gpum.example",
                ][..],
                "",
            ),
            (
                &["--listen", "127.0.0.1:0", "--insecure-http", "--relay-listen", "0.0.0.0:9000"][..],
                "--relay-listen without TLS is allowed only on a loopback address, not 0.0.0.0:9000",
            ),
            (
                &["--listen", "127.0.0.1:0", "--insecure-http", "--db-connections", "2"][..],
                "--db-connections 2: a SQLite database has one writer; more than 1 needs PostgreSQL",
            ),
            (
                &[
                    "--listen",
                    "127.0.0.1:0",
                    "--insecure-http",
                    "--terminator-address",
                    "none",
                    "--terminator-address",
                    "::1",
                ][..],
                "--terminator-address none cannot be given with other addresses",
            ),
        ] {
            if said.is_empty() {
                // An IP address is a site of its own: no same-site refusal.
                assert!(ServeConfig::check(args(given), Path::new(db)).is_ok(), "{given:?}");
                continue;
            }
            let got = refusal(given, db);
            assert!(got.starts_with(said), "{given:?}: {got}");
        }
        let same_site = [
            "--listen",
            "0.0.0.0:443",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--public-url",
            "https://gpum.example",
            "--relay-http-listen",
            "0.0.0.0:8443",
            "--relay-domain",
            "relay.gpum.example",
        ];
        let got = refusal(&same_site, db);
        assert!(
            got.starts_with(
                "--relay-domain relay.gpum.example is on the site of the public URL's host gpum.example"
            ),
            "{got}"
        );
        let allowed = [&same_site[..], &["--allow-same-site-relay-domain"]].concat();
        assert!(ServeConfig::check(args(&allowed), Path::new(db)).is_ok());
        assert!(ServeConfig::check(args(&plain), Path::new(db)).is_ok());
    }

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
}
