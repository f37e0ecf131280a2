//! The relay (issue 34): tenants reach the ports of their rentals through the platform, over the
//! tunnel their node's agent keeps open, with no inbound connection to the owner's machine.
//!
//! **The agent's side** ([`Relay::attach`]): `GET /api/v1/agent/tunnel` with the node's token and
//! `Upgrade: gpum-tunnel` is answered `101` (`server::tunnel`), and the connection becomes a
//! yamux session in which the relay opens one stream per tenant connection. One tunnel per node:
//! a new one replaces the old. Streams the agent opens are dropped.
//!
//! **The tenant's side** ([`serve_tenants`], `serve --relay-listen ADDR`): HTTP `CONNECT
//! rental-<hex>:<port>` with `Proxy-Authorization: Basic base64(<rental id>:<credential>)`,
//! TLS with the platform's certificate (plain only on loopback, like the API). Connections are
//! capped in all and per client address as on the API's listener (`listen`: one past its
//! address's cap is closed at once; a TLS terminator's address is not capped). In order:
//! - a client address blocked by the platform's throttle (wrong credentials, `crate::throttle`, door `Relay`) gets
//!   429; a missing, wrong or other rental's credential gets 407 and counts as a wrong token;
//! - a rental stopped, expired or ended gets 404; a port its spec does not list, 403;
//! - past [`RelayConfig::max_streams_per_rental`] streams, or past
//!   [`gpum_protocol::tunnel::MAX_TENANT_STREAMS`] on the node's tunnel (all its rentals
//!   together; yamux ends the whole connection at one stream past its limit, issue 43 item 4),
//!   503; a node whose agent has no tunnel, 502 (in a relay mesh, a node whose tunnel another
//!   replica holds is reached through it: [`mesh`]); an agent that refuses the stream (its rule, `gpum_agent::tunnel`), 502 with its reason;
//! - else `200`, and bytes flow both ways.
//!
//! The relay only ever routes a rental's stream into the tunnel of the node the rental was
//! created on: a node's agent cannot reach another node's rental. The stream's first line names
//! the rental and the port, never an address.
//!
//! **Keepalive** ([`gpum_protocol::tunnel`]): every [`RelayConfig::ping_every`] the relay opens
//! a stream whose first line is `ping`; a tunnel whose agent does not answer within
//! [`RelayConfig::ping_timeout`] is dropped, so a dead connection (a cut network, a NAT that
//! forgot it) frees its node's place, and its tenants' streams close, within a bounded time.
//!
//! **Bounds**: each direction copies through one buffer that grows only while data flows
//! ([`gpum_protocol::tunnel::CopyBuffer`]: 4 KiB idle, up to 256 KiB); yamux's per-stream window
//! pushes back on the agent's side and TCP's on the tenant's, so a slow reader stalls its own
//! stream and nothing buffers without bound. A stream with no byte either way for
//! [`RelayConfig::idle_timeout`] is closed. Bytes per second per rental (both directions
//! together) are limited by a token bucket when `--relay-rate` is set. Stopping a rental (or
//! deleting its node) closes its open streams at once ([`Relay::end_rental`]).

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::body::Body;
use base64::Engine;
use gpum_protocol::tunnel::{self, pump, read_line};
use gpum_protocol::{TunnelOpen, TunnelReply, limits};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::db::Db;
use crate::rentals::{Unreachable, reachable};
use crate::throttle::{Door, Throttle};

pub mod http;
pub mod mesh;

/// How long opening a stream and the agent's answer may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The relay's limits (`serve --relay-*`).
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub max_streams_per_rental: usize,
    pub idle_timeout: Duration,
    /// Bytes per second per rental, both directions together; `None`: unlimited.
    pub rate: Option<u64>,
    /// Tenant connections open at once (more wait in the backlog).
    pub max_connections: usize,
    /// Agents' tunnels open at once (`serve --max-tunnels`, sized from the file limit:
    /// `listen::share_descriptors`); one more is refused before its `101`.
    pub max_tunnels: usize,
    /// Tenant connections one client address (an IPv6 /64) may hold at once; one past it is
    /// closed as soon as it is accepted (`serve --max-connections-per-address`, as the API's).
    pub max_per_address: usize,
    /// Addresses not capped per address: TLS terminators (`serve --terminator-address`).
    pub terminators: Vec<crate::listen::Terminator>,
    /// How long a tenant has to send its `CONNECT` or request head (and finish TLS).
    pub header_timeout: Duration,
    /// Fronts whose connections start with a PROXY protocol header naming the tenant
    /// (`serve --relay-trust-proxy`), on both doors.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The HTTP door's domain (`serve --relay-domain`): rentals' ports are
    /// `<16 hex>-<port>.<domain>` ([`http::parse_host`]).
    pub domain: Option<String>,
    /// How often each tunnel is pinged, and how long its agent has to answer before the tunnel
    /// is dropped ([`gpum_protocol::tunnel::PING_EVERY`], [`gpum_protocol::tunnel::PING_TIMEOUT`];
    /// shorter only in tests).
    pub ping_every: Duration,
    pub ping_timeout: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            max_streams_per_rental: 64,
            idle_timeout: Duration::from_secs(600),
            rate: None,
            max_connections: 4096,
            max_tunnels: 4096,
            max_per_address: crate::listen::default_max_per_address(4096),
            terminators: vec![crate::listen::Terminator::Loopback],
            header_timeout: Duration::from_secs(20),
            trusted_proxies: Vec::new(),
            domain: None,
            ping_every: tunnel::PING_EVERY,
            ping_timeout: tunnel::PING_TIMEOUT,
        }
    }
}

impl RelayConfig {
    /// What the accept loop of either door bounds.
    pub(crate) fn door(&self) -> crate::listen::Door {
        crate::listen::Door {
            max_connections: self.max_connections,
            max_per_address: self.max_per_address,
            terminators: self.terminators.clone(),
            trusted_proxies: self.trusted_proxies.clone(),
            header_timeout: self.header_timeout,
        }
    }
}

type OpenRequest = oneshot::Sender<Option<yamux::Stream>>;

/// One node's tunnel: where to ask for a new stream.
struct Link {
    generation: u64,
    open: mpsc::Sender<OpenRequest>,
    /// Cancelled by [`Relay::end_node`]: the tunnel is dropped at once, its streams with it.
    ended: CancellationToken,
}

/// A rental's open streams: their count, what closes them, and its byte budget.
struct RentalStreams {
    count: usize,
    cancel: CancellationToken,
    bucket: Option<Arc<Bucket>>,
}

/// The streams open through the relay: per rental, and per node's tunnel.
#[derive(Default)]
struct Streams {
    rentals: HashMap<String, RentalStreams>,
    nodes: HashMap<String, usize>,
}

/// The tunnels of the nodes and the streams of the rentals.
pub struct Relay {
    pub cfg: RelayConfig,
    links: Mutex<HashMap<String, Link>>,
    streams: Mutex<Streams>,
    generation: AtomicU64,
    /// One permit per open tunnel: an upgraded connection leaves its door's connection cap
    /// behind, so it holds one of these instead (issue 43, item 3).
    tunnels: Arc<tokio::sync::Semaphore>,
    /// The relay mesh, when `serve --peer-secret-file` configures one ([`mesh`]).
    mesh: std::sync::OnceLock<Arc<mesh::Mesh>>,
}

/// A tunnel's place under [`RelayConfig::max_tunnels`], held until [`Relay::attach`] returns.
pub struct TunnelPermit(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit);

impl Relay {
    pub fn new(cfg: RelayConfig) -> Relay {
        let tunnels = Arc::new(tokio::sync::Semaphore::new(cfg.max_tunnels.max(1)));
        Relay {
            cfg,
            links: Mutex::default(),
            streams: Mutex::default(),
            generation: AtomicU64::new(0),
            tunnels,
            mesh: std::sync::OnceLock::new(),
        }
    }

    /// Joins the relay mesh: tunnels attached here are recorded as their nodes' homes, and a
    /// tenant's stream to a node whose tunnel is elsewhere is forwarded ([`mesh`]).
    pub fn set_mesh(&self, m: Arc<mesh::Mesh>) {
        let _ = self.mesh.set(m);
    }

    /// A place for one more tunnel, or `None` at [`RelayConfig::max_tunnels`]: asked for
    /// before the `101`, and given to [`Relay::attach`].
    pub fn tunnel_permit(&self) -> Option<TunnelPermit> {
        self.tunnels.clone().try_acquire_owned().ok().map(TunnelPermit)
    }

    /// Whether node `id` has a tunnel now.
    pub fn has_tunnel(&self, id: &str) -> bool {
        self.links.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id)
    }

    /// Runs node `node_id`'s tunnel over `io` (the upgraded connection) until it breaks or is
    /// replaced by a newer one.
    pub async fn attach<T>(self: Arc<Self>, node_id: String, io: T, _permit: TunnelPermit)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = tunnel::buffered(io).compat();
        let mut conn = yamux::Connection::new(io, tunnel::yamux_config(), yamux::Mode::Server);
        let (tx, mut rx) = mpsc::channel::<OpenRequest>(64);
        // The keepalive asks for its streams like a tenant does, through a sender that does not
        // keep the link alive: replacing the link still ends this tunnel.
        let pinger = tx.downgrade();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let ended = CancellationToken::new();
        self.links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node_id.clone(), Link { generation, open: tx, ended: ended.clone() });
        tracing::info!(node = %node_id, "tunnel attached");
        if let Some(m) = self.mesh.get() {
            m.home(&node_id).await;
        }
        let mut waiting: std::collections::VecDeque<OpenRequest> = Default::default();
        let drive = poll_fn(|cx| {
            loop {
                loop {
                    match rx.poll_recv(cx) {
                        Poll::Ready(Some(r)) => waiting.push_back(r),
                        // Replaced by a newer tunnel, or the node was deleted.
                        Poll::Ready(None) => return Poll::Ready("replaced or ended"),
                        Poll::Pending => break,
                    }
                }
                // The connection first: this also lets go of the streams dropped since, so
                // that yamux's count is the relay's before a new one is asked for.
                loop {
                    match conn.poll_next_inbound(cx) {
                        // The agent opens no streams: anything it opens is dropped.
                        Poll::Ready(Some(Ok(s))) => drop(s),
                        Poll::Ready(Some(Err(e))) => {
                            tracing::debug!(error = %e, "tunnel connection");
                            return Poll::Ready("the connection broke");
                        }
                        Poll::Ready(None) => return Poll::Ready("the agent closed it"),
                        Poll::Pending => break,
                    }
                }
                let mut opened = false;
                while !waiting.is_empty() {
                    match conn.poll_new_outbound(cx) {
                        Poll::Ready(Ok(s)) => {
                            opened = true;
                            let _ = waiting.pop_front().expect("not empty").send(Some(s));
                        }
                        Poll::Ready(Err(e)) => {
                            tracing::debug!(error = %e, "tunnel: opening a stream");
                            return Poll::Ready("the connection broke");
                        }
                        Poll::Pending => break,
                    }
                }
                // A new stream is heard only once the connection is polled again.
                if !opened {
                    return Poll::Pending;
                }
            }
        });
        let end = tokio::select! {
            why = drive => why,
            why = keepalive(pinger, self.cfg.ping_every, self.cfg.ping_timeout) => why,
            () = ended.cancelled() => NODE_ENDED,
        };
        // Ending the node also closes its link's channel: whichever the select saw first.
        let end = if ended.is_cancelled() { NODE_ENDED } else { end };
        let was_current = {
            let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
            let current = links.get(&node_id).is_some_and(|l| l.generation == generation);
            if current {
                links.remove(&node_id);
            }
            current
        };
        if let Some(m) = self.mesh.get()
            && was_current
        {
            m.left(&node_id).await;
        }
        // A connection that answers no ping is dead: it is dropped, which ends its streams at
        // once (a close would wait for it in vain); so is one whose node was deleted or whose
        // token was replaced, whose streams must not outlive it. Others are closed in order first.
        if end != SILENT_AGENT && end != NODE_ENDED {
            let _ = tokio::time::timeout(Duration::from_secs(5), poll_fn(|cx| conn.poll_close(cx))).await;
        }
        drop(conn);
        tracing::info!(node = %node_id, why = end, "tunnel detached");
    }

    /// A new stream in node `node_id`'s tunnel, or `None` when it has none (or it broke).
    async fn open(&self, node_id: &str) -> Option<yamux::Stream> {
        let tx = self.links.lock().unwrap_or_else(|e| e.into_inner()).get(node_id)?.open.clone();
        let (otx, orx) = oneshot::channel();
        tx.send(otx).await.ok()?;
        tokio::time::timeout(OPEN_TIMEOUT, orx).await.ok()?.ok()?
    }

    /// Drops node `node_id`'s tunnel and its open streams at once (the node was deleted, or its
    /// token replaced).
    pub fn end_node(&self, node_id: &str) {
        if let Some(link) = self.links.lock().unwrap_or_else(|e| e.into_inner()).remove(node_id) {
            tracing::info!(node = %node_id, "relay: the node's tunnel ended; dropping it");
            link.ended.cancel();
        }
    }

    /// Closes rental `id`'s open streams at once (it was stopped).
    pub fn end_rental(&self, id: &str) {
        if let Some(r) = self.streams.lock().unwrap_or_else(|e| e.into_inner()).rentals.remove(id) {
            tracing::info!(rental = %id, streams = r.count, "relay: the rental ended; closing its streams");
            r.cancel.cancel();
        }
    }

    /// A slot for one more stream of rental `id` on node `node_id`'s tunnel: what closes it and
    /// its byte budget; why not past the rental's cap or the tunnel's.
    fn enter(
        &self,
        id: &str,
        node_id: &str,
    ) -> Result<(CancellationToken, Option<Arc<Bucket>>), &'static str> {
        let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let Streams { rentals, nodes } = &mut *s;
        let on_node = nodes.get(node_id).copied().unwrap_or(0);
        let e = rentals.entry(id.to_string()).or_insert_with(|| RentalStreams {
            count: 0,
            cancel: CancellationToken::new(),
            bucket: self.cfg.rate.map(|r| Arc::new(Bucket::new(r))),
        });
        if e.count >= self.cfg.max_streams_per_rental {
            return Err("the rental has its limit of streams open");
        }
        if on_node >= tunnel::MAX_TENANT_STREAMS {
            if e.count == 0 {
                rentals.remove(id);
            }
            return Err("the rental's server has its limit of streams open");
        }
        e.count += 1;
        let out = (e.cancel.clone(), e.bucket.clone());
        nodes.insert(node_id.to_string(), on_node + 1);
        Ok(out)
    }

    fn leave(&self, id: &str, node_id: &str, cancel: &CancellationToken) {
        let mut s = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = s.nodes.get_mut(node_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.nodes.remove(node_id);
            }
        }
        if let Some(e) = s.rentals.get_mut(id)
            && !cancel.is_cancelled()
        {
            e.count = e.count.saturating_sub(1);
            if e.count == 0 {
                s.rentals.remove(id);
            }
        }
    }
}

/// Why [`keepalive`] ended a tunnel.
const SILENT_AGENT: &str = "the agent did not answer a ping";

/// Why [`Relay::end_node`] ended a tunnel.
const NODE_ENDED: &str = "the node was deleted or its token replaced";

/// Pings a tunnel every `every` through `link` (see [`gpum_protocol::tunnel`]); returns why
/// the tunnel should end: its agent did not answer within `timeout`, or the link is gone.
async fn keepalive(link: mpsc::WeakSender<OpenRequest>, every: Duration, timeout: Duration) -> &'static str {
    loop {
        tokio::time::sleep(every).await;
        let Some(tx) = link.upgrade() else { return "replaced or ended" };
        let (otx, orx) = oneshot::channel();
        if tx.send(otx).await.is_err() {
            return "replaced or ended";
        }
        drop(tx);
        let ping = async {
            let stream = orx.await.ok().flatten()?;
            let mut s = BufReader::with_capacity(limits::MAX_TUNNEL_LINE, stream.compat());
            let mut line = tunnel::PING.to_vec();
            line.push(b'\n');
            s.write_all(&line).await.ok()?;
            s.flush().await.ok()?;
            // Any line is an answer: an agent older than the keepalive refuses the ping with one.
            read_line(&mut s).await.ok()?;
            let _ = s.shutdown().await;
            Some(())
        };
        if tokio::time::timeout(timeout, ping).await.ok().flatten().is_none() {
            return SILENT_AGENT;
        }
    }
}

/// A token bucket: `rate` bytes a second, a second's worth of burst. [`Bucket::take`] goes into
/// debt and sleeps it off, so a copy never holds more than its one buffer.
pub struct Bucket {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(rate: u64) -> Bucket {
        let rate = rate.max(1) as f64;
        Bucket { rate, state: Mutex::new((rate, Instant::now())) }
    }

    /// How long to wait before `n` more bytes may pass, at `now`.
    fn debt(&self, n: usize, now: Instant) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.rate).min(self.rate);
        s.1 = now;
        s.0 -= n as f64;
        if s.0 >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-s.0 / self.rate) }
    }

    pub async fn take(&self, n: usize) {
        let wait = self.debt(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// What the tenant listener needs.
pub struct Tenants {
    pub relay: Arc<Relay>,
    pub db: Db,
    pub clock: Clock,
    pub throttle: Arc<Throttle>,
}

/// A tenant's connection as a door gets it: plain (on loopback, behind a terminator) or after
/// the door's own TLS handshake.
pub(crate) type TenantIo = tokio_util::either::Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// What both tenant doors run until `shutdown` completes: the shared accept loop
/// ([`crate::listen::accept_loop`], with the relay's caps and trusted fronts), then the door's
/// TLS handshake when it ends TLS itself (bounded by the header timeout), then `serve` with an
/// HTTP/1 builder (header timeout, at most `max_buf` bytes of headers).
pub(crate) async fn serve_door<S, F>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    t: Arc<Tenants>,
    max_buf: usize,
    shutdown: impl Future<Output = ()>,
    serve: S,
) where
    S: Fn(TenantIo, SocketAddr, Arc<http1::Builder>, Arc<Tenants>) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(t.relay.cfg.header_timeout).max_buf_size(max_buf);
    let builder = Arc::new(builder);
    let door = t.relay.cfg.door();
    let tracker = tokio_util::task::TaskTracker::new();
    let serve = Arc::new(serve);
    crate::listen::accept_loop(listener, door, tracker, shutdown, move |stream, peer| {
        let (t, tls, builder, serve) = (t.clone(), tls.clone(), builder.clone(), serve.clone());
        async move {
            let io = match tls {
                None => tokio_util::either::Either::Left(stream),
                Some(acceptor) => {
                    match tokio::time::timeout(t.relay.cfg.header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => tokio_util::either::Either::Right(s),
                        Ok(Err(e)) => return tracing::debug!("relay TLS handshake: {e}"),
                        Err(_) => return tracing::debug!("relay TLS handshake timed out"),
                    }
                }
            };
            serve(io, peer, builder, t).await;
        }
    })
    .await;
}

/// Serves tenants' `CONNECT`s on `listener` until `shutdown` completes.
pub async fn serve_tenants(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    t: Arc<Tenants>,
    shutdown: impl Future<Output = ()>,
) {
    serve_door(listener, tls, t, 16 * 1024, shutdown, |io, peer, builder, t| async move {
        serve_tenant(io, peer, &builder, t).await
    })
    .await;
}

async fn serve_tenant<I>(io: I, peer: SocketAddr, builder: &http1::Builder, t: Arc<Tenants>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let t = t.clone();
        async move { Ok::<_, std::convert::Infallible>(connect(req, peer, t).await) }
    });
    if let Err(e) = builder.serve_connection(TokioIo::new(io), svc).with_upgrades().await {
        tracing::debug!("relay connection: {e}");
    }
}

pub(crate) fn answer(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(format!("{text}\n")));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    r
}

fn proxy_auth_required() -> Response<Body> {
    let mut r =
        answer(StatusCode::PROXY_AUTHENTICATION_REQUIRED, "the rental's id and credential are needed");
    r.headers_mut().insert(
        hyper::header::PROXY_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Basic realm=\"gpum\""),
    );
    r
}

/// `rental-<16 hex>:<port>` as (`rent-<16 hex>`, port).
pub fn parse_target(authority: &str) -> Option<(String, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let hex = host.strip_prefix("rental-")?;
    let id = format!("rent-{hex}");
    let ok = hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    ok.then_some((id, port))
}

/// `Basic base64(user:password)` as (user, password).
pub fn parse_basic(value: &str) -> Option<(String, String)> {
    let b64 = value.strip_prefix("Basic ").or_else(|| value.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let s = String::from_utf8(raw).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// Why a tenant is not let through; each door words "authenticate" its own way (407 on the
/// TCP door, 401 on the HTTP door).
pub(crate) enum Refused {
    /// No credential, a wrong one or another rental's: counted as a wrong token.
    Credential,
    /// Every other answer: 404, 403, 503, 502.
    Answer(StatusCode, String),
}

/// The client's address as the throttle counts it (IPv6 by its /64).
pub(crate) fn throttle_key(peer: SocketAddr) -> std::net::IpAddr {
    let mut req = Request::new(());
    req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
    crate::throttle::client_key(&req)
}

/// 429 while the throttle blocks `client` (call first, before any credential is looked at).
pub(crate) async fn blocked(t: &Tenants, client: std::net::IpAddr) -> Option<Response<Body>> {
    let wait = t.throttle.check(Door::Relay, client, None).await.err()?;
    let mut r = answer(StatusCode::TOO_MANY_REQUESTS, "too many wrong credentials from this address");
    r.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from(crate::throttle::retry_after(wait)),
    );
    Some(r)
}

/// Rental `id`'s credential checked (a wrong one counts against `client`), then whether it runs
/// and lists `port`: its node, or why not.
pub(crate) async fn check(
    t: &Tenants,
    client: std::net::IpAddr,
    id: &str,
    port: u16,
    credential: Option<String>,
) -> Result<crate::rentals::Reachable, Refused> {
    let Some(credential) = credential else {
        t.throttle.failed(Door::Relay, client, None).await;
        return Err(Refused::Credential);
    };
    let now = t.clock.now();
    let user = id.to_string();
    let found = t.db.call(move |c| Ok(reachable(c, now, &user, &credential))).await;
    let rental = match found {
        Ok(Ok(r)) => r,
        Ok(Err(Unreachable::WrongCredential)) => {
            t.throttle.failed(Door::Relay, client, None).await;
            return Err(Refused::Credential);
        }
        Ok(Err(Unreachable::Ended)) => {
            t.throttle.succeeded(Door::Relay, client, None).await;
            return Err(Refused::Answer(StatusCode::NOT_FOUND, "the rental has ended".into()));
        }
        Err(_) => {
            return Err(Refused::Answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "the platform could not look the rental up".into(),
            ));
        }
    };
    t.throttle.succeeded(Door::Relay, client, None).await;
    if !rental.ports.contains(&port) {
        return Err(Refused::Answer(StatusCode::FORBIDDEN, "the rental does not expose that port".into()));
    }
    Ok(rental)
}

/// One stream of a rental, counted under its cap until dropped.
pub(crate) struct Slot {
    relay: Arc<Relay>,
    id: String,
    node_id: String,
    /// Cancelled when the rental ends ([`Relay::end_rental`]).
    pub(crate) cancel: CancellationToken,
    pub(crate) bucket: Option<Arc<Bucket>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.relay.leave(&self.id, &self.node_id, &self.cancel);
    }
}

/// A slot for one more stream of rental `id` on node `node_id`'s tunnel; 503 past the
/// rental's cap or the tunnel's.
pub(crate) fn slot(relay: &Arc<Relay>, id: &str, node_id: &str) -> Result<Slot, Refused> {
    let (cancel, bucket) = relay
        .enter(id, node_id)
        .map_err(|why| Refused::Answer(StatusCode::SERVICE_UNAVAILABLE, why.into()))?;
    Ok(Slot { relay: relay.clone(), id: id.to_string(), node_id: node_id.to_string(), cancel, bucket })
}

/// The stream to rental `id`'s `port` in its node's tunnel, the agent's yes read (502
/// otherwise): the tunnel here, or, in a mesh, the one another replica holds ([`mesh`]).
pub(crate) async fn open_in(
    relay: &Relay,
    node_id: &str,
    id: &str,
    port: u16,
) -> Result<AgentStream, Refused> {
    if let Some(m) = relay.mesh.get()
        && !relay.has_tunnel(node_id)
    {
        return m.forward(node_id, id, port).await;
    }
    open_stream(relay, node_id, id, port).await.map_err(|(st, why)| Refused::Answer(st, why))
}

/// A slot and a stream in the tunnel held here, never forwarded: for a peer's request
/// ([`mesh`]), as [`mesh::PeerReply`] when refused.
async fn open_local(
    relay: &Arc<Relay>,
    node_id: &str,
    id: &str,
    port: u16,
) -> Result<(AgentStream, Slot), mesh::PeerReply> {
    let refused = |status: StatusCode, why: String| mesh::PeerReply {
        ok: false,
        status: status.as_u16(),
        reason: Some(why),
    };
    let slot = match slot(relay, id, node_id) {
        Ok(s) => s,
        Err(Refused::Answer(st, why)) => return Err(refused(st, why)),
        Err(Refused::Credential) => return Err(refused(StatusCode::FORBIDDEN, String::new())),
    };
    let agent = open_stream(relay, node_id, id, port).await.map_err(|(st, why)| refused(st, why))?;
    Ok((agent, slot))
}

/// A slot for one more stream of rental `id` ([`slot`]), then the stream ([`open_in`]).
pub(crate) async fn open_for(
    relay: &Arc<Relay>,
    node_id: &str,
    id: &str,
    port: u16,
) -> Result<(AgentStream, Slot), Refused> {
    let slot = slot(relay, id, node_id)?;
    let agent = open_in(relay, node_id, id, port).await?;
    Ok((agent, slot))
}

/// One tenant request: the checks of the module docs, in order.
async fn connect(
    mut req: Request<hyper::body::Incoming>,
    peer: SocketAddr,
    t: Arc<Tenants>,
) -> Response<Body> {
    if req.method() != hyper::Method::CONNECT {
        return answer(StatusCode::METHOD_NOT_ALLOWED, "the relay answers only CONNECT rental-<id>:<port>");
    }
    let client = throttle_key(peer);
    if let Some(r) = blocked(&t, client).await {
        return r;
    }
    let Some((id, port)) = req.uri().authority().and_then(|a| parse_target(a.as_str())) else {
        return answer(StatusCode::BAD_REQUEST, "the target is rental-<16 hex digits>:<port>");
    };
    let credential = req
        .headers()
        .get(hyper::header::PROXY_AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_basic)
        .filter(|(u, _)| *u == id)
        .map(|(_, c)| c);
    let opened = match check(&t, client, &id, port, credential).await {
        Ok(rental) => open_for(&t.relay, &rental.node_id, &id, port).await,
        Err(e) => Err(e),
    };
    let (agent, slot) = match opened {
        Ok(v) => v,
        Err(Refused::Credential) => return proxy_auth_required(),
        Err(Refused::Answer(status, why)) => return answer(status, &why),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let idle = t.relay.cfg.idle_timeout;
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(up) => {
                let tenant = TokioIo::new(up);
                tokio::select! {
                    () = splice(tenant, agent, slot.bucket.clone(), idle) => {}
                    () = slot.cancel.cancelled() => tracing::debug!(rental = %id, "relay: stream closed, the rental ended"),
                }
            }
            Err(e) => tracing::debug!(error = %e, "relay: the tenant's connection did not switch"),
        }
        drop(slot);
    });
    Response::new(Body::empty())
}

/// A stream to a rental's port: in a tunnel held here, or through the replica that holds it.
pub(crate) type AgentStream =
    BufReader<tokio_util::either::Either<tokio_util::compat::Compat<yamux::Stream>, TcpStream>>;

/// Opens a stream to rental `id`'s port in its node's tunnel and reads the agent's answer.
async fn open_stream(
    relay: &Relay,
    node_id: &str,
    id: &str,
    port: u16,
) -> Result<AgentStream, (StatusCode, String)> {
    let no_tunnel =
        || (StatusCode::BAD_GATEWAY, "the rental's server has no tunnel to the platform now".to_string());
    let stream = relay.open(node_id).await.ok_or_else(no_tunnel)?;
    // The line's buffer stays with the stream: small, so that idle streams are.
    let mut s =
        BufReader::with_capacity(limits::MAX_TUNNEL_LINE, tokio_util::either::Either::Left(stream.compat()));
    let mut line = serde_json::to_vec(&TunnelOpen { rental: id.to_string(), port }).expect("plain JSON");
    line.push(b'\n');
    let talk = async {
        s.write_all(&line).await?;
        s.flush().await?;
        read_line(&mut s).await
    };
    let reply = match tokio::time::timeout(OPEN_TIMEOUT, talk).await {
        Ok(Ok(l)) => l,
        _ => return Err((StatusCode::BAD_GATEWAY, "the rental's server did not answer".into())),
    };
    match serde_json::from_slice::<TunnelReply>(&reply) {
        Ok(TunnelReply { ok: true, .. }) => Ok(s),
        Ok(TunnelReply { reason, .. }) => {
            let why = reason.unwrap_or_default();
            let why: String = why.chars().filter(|c| !c.is_control()).take(200).collect();
            Err((StatusCode::BAD_GATEWAY, format!("the rental's server refused: {why}")))
        }
        Err(_) => Err((StatusCode::BAD_GATEWAY, "the rental's server answered something else".into())),
    }
}

/// Copies both ways, each through one [`gpum_protocol::tunnel::CopyBuffer`] (small while the stream is idle), until
/// both ends are done or nothing moved for `idle`.
async fn splice<A, B>(a: A, b: B, bucket: Option<Arc<Bucket>>, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    // Each chunk marks the stream busy, then waits for the rental's byte budget.
    let each = |n: usize| {
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        let bucket = bucket.clone();
        async move {
            if let Some(b) = bucket {
                b.take(n).await;
            }
        }
    };
    let both = async {
        let _ = tokio::join!(pump(ar, bw, each), pump(br, aw, each));
    };
    let watchdog = async {
        loop {
            let since = Duration::from_millis(last.load(Ordering::Relaxed));
            let quiet = start.elapsed().saturating_sub(since);
            if quiet >= idle {
                tracing::debug!("relay: stream idle; closed");
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    };
    tokio::select! {
        () = both => {}
        () = watchdog => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn relay_targets_and_credentials_parse_strictly() {
        assert_eq!(parse_target("rental-00112233445566aa:22"), Some(("rent-00112233445566aa".into(), 22)));
        assert_eq!(parse_target("rental-00112233445566aa:0"), None);
        assert_eq!(parse_target("rental-00112233445566AA:22"), None);
        assert_eq!(parse_target("rental-0011:22"), None);
        assert_eq!(parse_target("10.0.0.1:22"), None);
        assert_eq!(parse_target("rental-00112233445566aa"), None);
        let b = base64::engine::general_purpose::STANDARD.encode("rent-1:gpumt_x:y");
        assert_eq!(parse_basic(&format!("Basic {b}")), Some(("rent-1".into(), "gpumt_x:y".into())));
        assert_eq!(parse_basic("Bearer abc"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
    }

    #[test]
    fn relay_bucket_lets_a_second_through_then_paces() {
        let b = Bucket::new(1000);
        let t = Instant::now();
        assert_eq!(b.debt(1000, t), Duration::ZERO, "a second's burst");
        assert_eq!(b.debt(500, t), Duration::from_millis(500));
        assert_eq!(b.debt(0, t + Duration::from_millis(500)), Duration::ZERO, "paid off");
    }

    #[tokio::test]
    async fn relay_rental_streams_are_capped_and_closed_when_it_ends() {
        let r = Relay::new(RelayConfig { max_streams_per_rental: 2, ..Default::default() });
        let (a, _) = r.enter("rent-1", "node-1").unwrap();
        let (b, _) = r.enter("rent-1", "node-1").unwrap();
        assert!(r.enter("rent-1", "node-1").is_err(), "the cap");
        assert!(r.enter("rent-2", "node-1").is_ok(), "per rental");
        r.leave("rent-1", "node-1", &b);
        let (c, _) = r.enter("rent-1", "node-1").unwrap();
        r.end_rental("rent-1");
        assert!(a.is_cancelled() && c.is_cancelled());
        assert!(r.enter("rent-1", "node-1").is_ok(), "a fresh count after the end");
    }

    /// Issue 43, item 4: the rentals of one node together open more streams than its tunnel
    /// carries (17 rentals × 64). Before the fix, stream 1,025 made yamux end the whole
    /// connection: every open stream died and every later one got 502. Now the one past
    /// [`tunnel::MAX_TENANT_STREAMS`] is refused 503, the open ones carry on, and once some
    /// close new ones are let through.
    #[tokio::test]
    async fn relay_a_stream_past_the_tunnels_limit_is_refused_and_nothing_else_is_touched() {
        let relay = Arc::new(Relay::new(RelayConfig::default()));
        let (relay_end, agent_end) = tokio::io::duplex(1024 * 1024);
        tokio::spawn(relay.clone().attach("node-a".into(), relay_end, relay.tunnel_permit().unwrap()));
        // An agent that says yes to every stream, then echoes it.
        tokio::spawn(async move {
            let mut conn =
                yamux::Connection::new(agent_end.compat(), tunnel::yamux_config(), yamux::Mode::Client);
            while let Some(Ok(stream)) = poll_fn(|cx| conn.poll_next_inbound(cx)).await {
                tokio::spawn(async move {
                    let mut s = BufReader::new(stream.compat());
                    if read_line(&mut s).await.is_err() {
                        return;
                    }
                    let mut yes = serde_json::to_vec(&TunnelReply { ok: true, reason: None }).unwrap();
                    yes.push(b'\n');
                    if s.write_all(&yes).await.is_err() || s.flush().await.is_err() {
                        return;
                    }
                    let (mut r, mut w) = tokio::io::split(s);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        while !relay.has_tunnel("node-a") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut open = Vec::new();
        let mut refused = Vec::new();
        for rental in 0..17 {
            let id = format!("rent-{rental:016x}");
            for _ in 0..64 {
                let r =
                    tokio::time::timeout(Duration::from_secs(20), open_for(&relay, "node-a", &id, 22)).await;
                let r = r.unwrap_or_else(|_| panic!("stream {} hangs", open.len() + refused.len()));
                match r {
                    Ok(v) => open.push(v),
                    Err(Refused::Answer(status, why)) => refused.push((status, why)),
                    Err(Refused::Credential) => unreachable!(),
                }
            }
        }
        assert_eq!(open.len(), tunnel::MAX_TENANT_STREAMS);
        assert_eq!(refused.len(), 17 * 64 - tunnel::MAX_TENANT_STREAMS);
        assert!(refused.iter().all(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE), "{:?}", refused[0]);
        assert!(relay.has_tunnel("node-a"), "the tunnel is kept");
        // Every open stream still carries bytes.
        for (i, (s, _)) in open.iter_mut().enumerate().step_by(97) {
            let msg = format!("hello {i}\n");
            s.write_all(msg.as_bytes()).await.unwrap();
            s.flush().await.unwrap();
            let mut back = vec![0; msg.len()];
            tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut back)).await.unwrap().unwrap();
            assert_eq!(back, msg.as_bytes());
        }
        // Streams that close make room for new ones, again and again.
        for round in 0..3 {
            open.truncate(open.len() - 100);
            for k in 0..100 {
                let id = format!("rent-{:016x}", 1000 + round * 100 + k);
                let v = open_for(&relay, "node-a", &id, 22).await;
                let (s, slot) = v.unwrap_or_else(|_| panic!("round {round}: a freed place is used"));
                open.push((s, slot));
                assert!(relay.has_tunnel("node-a"));
            }
            assert!(open_for(&relay, "node-a", "rent-00000000000000fe", 22).await.is_err(), "full again");
        }
    }

    /// The keepalive: an agent that answers the relay's pings keeps its tunnel; one that goes
    /// silent (its connection open, nothing read or written: a cut network) loses it within a
    /// ping and its timeout, and the node's place is free again.
    #[tokio::test]
    async fn relay_keeps_a_tunnel_that_answers_pings_and_drops_a_silent_one() {
        let cfg = RelayConfig {
            ping_every: Duration::from_millis(100),
            ping_timeout: Duration::from_millis(200),
            ..Default::default()
        };
        let relay = Arc::new(Relay::new(cfg));
        // An agent that answers every ping.
        let (relay_end, agent_end) = tokio::io::duplex(64 * 1024);
        let attached =
            tokio::spawn(relay.clone().attach("node-a".into(), relay_end, relay.tunnel_permit().unwrap()));
        let answered = Arc::new(AtomicU64::new(0));
        let count = answered.clone();
        let agent = tokio::spawn(async move {
            let mut conn =
                yamux::Connection::new(agent_end.compat(), tunnel::yamux_config(), yamux::Mode::Client);
            while let Some(Ok(stream)) = poll_fn(|cx| conn.poll_next_inbound(cx)).await {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut s = BufReader::new(stream.compat());
                    if read_line(&mut s).await.ok().as_deref() == Some(tunnel::PING) {
                        let _ = s.write_all(b"pong\n").await;
                        let _ = s.shutdown().await;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(relay.has_tunnel("node-a"), "a tunnel that answers is kept");
        assert!(answered.load(Ordering::Relaxed) >= 5, "pinged every 100 ms");

        // A silent one: its connection stays open, and nothing comes back.
        let (relay_end, _silent) = tokio::io::duplex(64 * 1024);
        let silent =
            tokio::spawn(relay.clone().attach("node-b".into(), relay_end, relay.tunnel_permit().unwrap()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(relay.has_tunnel("node-b"));
        let t = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), silent).await.expect("dropped in time").unwrap();
        assert!(!relay.has_tunnel("node-b"), "its place is free");
        assert!(t.elapsed() < Duration::from_secs(1), "within a ping and its timeout: {:?}", t.elapsed());
        assert!(relay.has_tunnel("node-a"), "the other tunnel is untouched");
        agent.abort();
        attached.abort();
    }

    /// The TCP door with `cfg` on a loopback port, over a scratch database (kept while the
    /// returned directory lives): its address, what stops it, and its task.
    async fn tenant_door(
        cfg: RelayConfig,
    ) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::start(crate::store::open(&dir.path().join("p.db")).unwrap());
        let t = Arc::new(Tenants {
            relay: Arc::new(Relay::new(cfg)),
            throttle: Arc::new(Throttle::new(db.clone(), Clock::system())),
            db,
            clock: Clock::system(),
        });
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_tenants(l, None, t, stop.clone().cancelled_owned()));
        (addr, stop, server, dir)
    }

    /// One client address holds at most `max_per_address` tenant connections: the next is closed
    /// as soon as it is accepted, and a slot given back admits one again.
    #[tokio::test]
    async fn relay_tenant_connections_are_capped_per_client_address() {
        use tokio::net::TcpStream;
        // No terminator: loopback is counted like any client here.
        let cfg = RelayConfig { max_per_address: 2, terminators: vec![], ..Default::default() };
        let (addr, stop, server, _dir) = tenant_door(cfg).await;
        // Closed at once: EOF (or a reset) well before the header timeout.
        let closed = |mut s: TcpStream| async move {
            let mut b = [0u8; 1];
            matches!(tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await, Ok(Ok(0) | Err(_)))
        };
        // Served: a CONNECT without a credential is answered 407.
        let served = |mut s: TcpStream| async move {
            s.write_all(b"CONNECT rental-00112233445566aa:22 HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let mut head = [0u8; 12];
            tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head))
                .await
                .is_ok_and(|r| r.is_ok())
                && &head == b"HTTP/1.1 407"
        };
        let a = TcpStream::connect(addr).await.unwrap();
        let b = TcpStream::connect(addr).await.unwrap();
        // The two are accepted (and counted) before the third arrives.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(closed(TcpStream::connect(addr).await.unwrap()).await, "the third is closed");
        drop(a);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(served(TcpStream::connect(addr).await.unwrap()).await, "a freed slot admits one");
        drop(b);
        stop.cancel();
        server.await.unwrap();
    }

    /// Behind a front that speaks the PROXY protocol: its header is read and the request served;
    /// the same header from an untrusted peer is not a header but a bad request.
    #[tokio::test]
    async fn relay_proxy_headers_only_from_trusted_fronts() {
        let cfg =
            RelayConfig { trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()], ..Default::default() };
        let (addr, stop, server, _dir) = tenant_door(cfg).await;
        let status = |from: &'static str| async move {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::new(from.parse().unwrap(), 0)).unwrap();
            let mut s = sock.connect(addr).await.unwrap();
            s.write_all(
                b"PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\nCONNECT rental-00112233445566aa:22 HTTP/1.1\r\nHost: x\r\n\r\n",
            )
            .await
            .unwrap();
            let mut head = [0u8; 12];
            match tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head)).await {
                Ok(Ok(_)) => String::from_utf8_lossy(&head).to_string(),
                _ => "closed".to_string(),
            }
        };
        assert_eq!(status("127.0.0.1").await, "HTTP/1.1 407", "the trusted front's request is served");
        assert_eq!(status("127.0.0.2").await, "HTTP/1.1 400", "an untrusted peer's header is refused");
        stop.cancel();
        server.await.unwrap();
    }
}
