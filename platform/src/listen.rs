//! The accept loop: connections, TLS, timeouts and the caps on what one client holds.
//!
//! The platform faces the internet (or a TLS terminator that does), so a client must not be able
//! to hold its resources by being slow (issue 14, item 6) or by not reading (issue 29, item 1):
//! - **A connection cap.** At most [`Transport::max_connections`] connections are open at once;
//!   past it the loop stops accepting and new connections wait in the kernel's backlog until one
//!   closes. The cap is also kept below the process's file-descriptor limit (raised to its hard
//!   limit at start, [`raise_nofile_limit`]), so `accept` never fails with "Too many open files".
//! - **A cap per client address.** One address (an IPv6 address's /64) holds at most
//!   [`Transport::max_per_address`] of those connections; a connection past it is closed as soon
//!   as it is accepted, so it neither waits in the backlog ahead of other clients nor holds a
//!   slot. A TLS terminator's address ([`Transport::terminators`], loopback unless told
//!   otherwise) is shared by all its clients and is not capped: the terminator caps its own.
//! - **A header timeout.** A connection that has not sent a complete request head within
//!   [`Transport::header_timeout`] (hyper's `header_read_timeout`, which also bounds how long an
//!   idle keep-alive connection is kept) is closed; so is a TLS handshake that takes longer.
//! - **A write timeout.** A connection whose answer has not moved for
//!   [`Transport::write_timeout`] (the client reads nothing, so the socket's buffers stay full) is
//!   closed ([`WriteBound`]). It bounds a stall, not a whole answer: a long download that keeps
//!   moving is served to its end. Answers to pipelined requests are written one after the other,
//!   each only after the one before went out, so a client that queues thousands of requests and
//!   reads none is closed by the same bound; hyper buffers at most 64 KiB of them
//!   (`max_buf_size`).
//! - **A body timeout and a body budget** are enforced where bodies are read
//!   (`server::read_body`): the first [`BODY_OWN_BYTES`] of each body are its own, the rest comes
//!   from one [`BodyBudget`] shared by every request (`--body-memory`), so connections that send
//!   large bodies slowly hold a bounded amount of memory together, not a megabyte each.
//!
//! Only HTTP/1.1 is served (ALPN `http/1.1` under TLS): it has the header timeout, and an agent
//! uses one connection at a time anyway.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::{Extension, Router};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// File descriptors kept free for everything but client connections (the database and its
/// WAL, downloads being served, logs).
const FD_RESERVE: u64 = 64;

/// How long connections get to finish after a shutdown signal.
const GRACE: Duration = Duration::from_secs(5);

/// The bytes of each request body read without drawing on the [`BodyBudget`]: a heartbeat, even
/// one carrying an inventory, fits; what is larger (a long container list, or an attack) shares.
pub const BODY_OWN_BYTES: usize = 32 * 1024;

#[derive(Debug, Clone)]
pub struct Transport {
    pub header_timeout: Duration,
    pub max_connections: usize,
    /// The longest an answer's writing may make no progress before the connection is closed.
    pub write_timeout: Duration,
    /// Connections one client address may hold at once ([`default_max_per_address`]).
    pub max_per_address: usize,
    /// Addresses the per-address cap does not apply to: TLS terminators.
    pub terminators: Vec<Terminator>,
    /// Bytes of request bodies held at once beyond each body's own [`BODY_OWN_BYTES`].
    pub body_memory: usize,
}

impl Transport {
    /// The defaults of `serve` for these two bounds, with every other bound at its default.
    pub fn new(header_timeout: Duration, max_connections: usize) -> Transport {
        Transport {
            header_timeout,
            max_connections,
            write_timeout: Duration::from_secs(30),
            max_per_address: default_max_per_address(max_connections),
            terminators: vec![Terminator::Loopback],
            body_memory: 8 * 1024 * 1024,
        }
    }
}

/// Where a TLS terminator connects from: many clients share its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Terminator {
    /// Any loopback address (`127.0.0.0/8`, `::1`): a terminator on the same machine.
    Loopback,
    Addr(IpAddr),
}

impl std::str::FromStr for Terminator {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "loopback" {
            return Ok(Terminator::Loopback);
        }
        s.parse::<IpAddr>()
            .map(|a| Terminator::Addr(a.to_canonical()))
            .map_err(|_| format!("{s:?} is not an IP address, `loopback` or `none`"))
    }
}

impl Terminator {
    fn matches(self, ip: IpAddr) -> bool {
        match self {
            Terminator::Loopback => ip.is_loopback(),
            Terminator::Addr(a) => a == ip,
        }
    }
}

/// The default per-address cap: a sixteenth of the connection cap, at least 8. Sixteen addresses
/// are needed to fill the platform, and an address shared by a few dozen machines behind one NAT
/// still has a connection for each (64 at the default cap of 1024).
pub fn default_max_per_address(max_connections: usize) -> usize {
    (max_connections / 16).max(8)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 1024,
    }
}

/// The connection cap: the one asked for, but never more than the descriptors allow.
pub fn effective_max_connections(asked: usize, nofile: u64) -> usize {
    let allowed = nofile.saturating_sub(FD_RESERVE).max(1);
    asked.min(usize::try_from(allowed).unwrap_or(usize::MAX)).max(1)
}

/// What [`accept_loop`] bounds: one door (the API's listener, the relay's TCP or HTTP door).
#[derive(Debug, Clone)]
pub struct Door {
    /// Connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Connections one client address may hold at once ([`default_max_per_address`]).
    pub max_per_address: usize,
    /// Addresses the per-address cap does not apply to: TLS terminators.
    pub terminators: Vec<Terminator>,
    /// Peers whose connections start with a PROXY protocol header naming the client
    /// (`serve --relay-trust-proxy`); empty: no header is read from anyone.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// How long a trusted peer has to send its PROXY header.
    pub header_timeout: Duration,
}

/// The accept loop every door shares: a slot under [`Door::max_connections`] first (at the cap,
/// connections wait in the backlog), then `accept` (an error pauses the loop a moment rather
/// than spinning: EMFILE), then the client's address (a trusted proxy's PROXY header, or the
/// peer), then the per-address cap (one past it is closed at once and its slot given back).
/// `handle` then gets the connection and the client's address, on a task of `tracker`, holding
/// its slot until it returns. Runs until `shutdown` completes.
pub async fn accept_loop<H, F>(
    listener: TcpListener,
    door: Door,
    tracker: tokio_util::task::TaskTracker,
    shutdown: impl Future<Output = ()>,
    handle: H,
) where
    H: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(door.max_connections));
    let per_address = Arc::new(PerAddress::new(door.max_per_address, door.terminators.clone()));
    let trusted = Arc::new(door.trusted_proxies);
    let handle = Arc::new(handle);
    let mut pause = AcceptPause::default();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (mut stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(v) => {
                    pause = AcceptPause::default();
                    v
                }
                Err(e) => {
                    // ECONNABORTED and the like concern one connection; anything else (EMFILE)
                    // gets a pause that doubles while the errors go on, so the loop neither
                    // spins nor fills the log (issue 43, item 3).
                    let wait = pause.failed();
                    tracing::warn!(errors = pause.errors, pause_ms = wait.as_millis() as u64, "accept: {e}");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = &mut shutdown => break,
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (per_address, handle) = (per_address.clone(), handle.clone());
        if trusted.iter().any(|n| n.contains(&peer.ip().to_canonical())) {
            // A trusted front: the client is the one its header names. Read on the connection's
            // own task, so a slow front holds its slot, not the loop.
            let timeout = door.header_timeout;
            tracker.spawn(async move {
                let _permit = permit;
                let client = match tokio::time::timeout(timeout, read_proxy_header(&mut stream, peer)).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => return tracing::debug!("a PROXY header was refused: {e}"),
                    Err(_) => return tracing::debug!("a PROXY header timed out"),
                };
                // No address is logged: the platform logs none.
                let Some(_held) = per_address.admit(client.ip()) else {
                    return tracing::debug!("a connection over the per-address cap was closed");
                };
                handle(stream, client).await;
            });
        } else {
            // Over its address's cap, a connection is closed at once (and its slot given back).
            let Some(held) = per_address.admit(peer.ip()) else {
                tracing::debug!("a connection over the per-address cap was closed");
                continue;
            };
            tracker.spawn(async move {
                let _permit = permit;
                let _held = held;
                handle(stream, peer).await;
            });
        }
    }
}

/// The accept loop's pause after an error: 50 ms, doubling while the errors go on, at most
/// [`AcceptPause::MAX`]; a connection accepted starts it afresh.
#[derive(Debug, Default)]
struct AcceptPause {
    errors: u32,
}

impl AcceptPause {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    /// One more error in a row: how long to pause.
    fn failed(&mut self) -> Duration {
        self.errors = self.errors.saturating_add(1);
        Self::FIRST.saturating_mul(1u32.checked_shl(self.errors - 1).unwrap_or(u32::MAX)).min(Self::MAX)
    }
}

/// How the descriptors [`raise_nofile_limit`] left are shared (issue 43, item 3): an agent's
/// tunnel holds its connection's descriptor for as long as it lasts, outside every door's
/// connection cap, so tunnels have a cap of their own. Past [`FD_RESERVE`], tunnels get at most
/// a quarter (and at most `asked_tunnels`); the rest is shared equally by the `doors` that
/// accept connections (the API's listener, and the relay's doors when on), each capped at most
/// at `asked_connections`. Together they never reach the file limit. Returns (each door's
/// connection cap, the tunnel cap), each at least 1.
pub fn share_descriptors(
    nofile: u64,
    asked_connections: usize,
    asked_tunnels: usize,
    doors: usize,
) -> (usize, usize) {
    let budget = usize::try_from(nofile.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX).max(2);
    let tunnels = asked_tunnels.min(budget / 4).max(1);
    let per_door = ((budget - tunnels) / doors.max(1)).max(1);
    (asked_connections.min(per_door).max(1), tunnels)
}

/// Serves `app` on `listener` until `shutdown` completes, then gives open connections
/// [`GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    t: Transport,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let app = app.layer(Extension(BodyBudget::new(t.body_memory)));
    // Connections are told to finish through `stop` and counted by `tracker` (hyper-util's
    // graceful watcher cannot watch a connection that may be upgraded: the agent's tunnel).
    let stop = tokio_util::sync::CancellationToken::new();
    let tracker = tokio_util::task::TaskTracker::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(t.header_timeout).max_buf_size(64 * 1024);
    let builder = Arc::new(builder);
    let door = Door {
        max_connections: t.max_connections,
        max_per_address: t.max_per_address,
        terminators: t.terminators.clone(),
        trusted_proxies: Vec::new(),
        header_timeout: t.header_timeout,
    };
    let (header_timeout, write_timeout, watcher) = (t.header_timeout, t.write_timeout, stop.clone());
    accept_loop(listener, door, tracker.clone(), shutdown, move |stream, peer| {
        let stream = WriteBound::new(stream, write_timeout);
        let (builder, app, tls, watcher) = (builder.clone(), app.clone(), tls.clone(), watcher.clone());
        async move {
            match tls {
                None => serve_one(stream, peer, &builder, app, watcher).await,
                Some(acceptor) => match tokio::time::timeout(header_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => serve_one(s, peer, &builder, app, watcher).await,
                    Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                },
            }
        }
    })
    .await;
    stop.cancel();
    tracker.close();
    if tokio::time::timeout(GRACE, tracker.wait()).await.is_err() {
        tracing::info!("connections still open after {GRACE:?}; closing them");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The PROXY protocol

/// The longest PROXY header read: v1's is at most 107 bytes; v2's addresses and a few TLVs fit.
const PROXY_HEADER_MAX: usize = 512;

/// Reads the PROXY protocol header (v1 or v2, HAProxy's `proxy-protocol.txt`) a trusted front
/// sends first on `stream`, exactly its bytes, and returns the client it names. A `LOCAL` (v2)
/// or `UNKNOWN` (v1) header is the front's own connection (a health check): the peer itself.
/// Anything else (no header, a malformed one, a UNIX or UDP address) is an error: the
/// connection is closed (fail closed: a trusted front always sends one).
pub async fn read_proxy_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
) -> io::Result<SocketAddr> {
    use tokio::io::AsyncReadExt;
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    let mut buf = vec![0u8; 16];
    stream.read_exact(&mut buf[..5]).await?;
    if &buf[..5] == b"PROXY" {
        // v1: one line of text.
        buf.truncate(5);
        let mut b = [0u8; 1];
        while !buf.ends_with(b"\r\n") {
            if buf.len() >= 107 {
                return Err(bad("a PROXY v1 line longer than 107 bytes"));
            }
            stream.read_exact(&mut b).await?;
            buf.push(b[0]);
        }
    } else if &buf[..5] == b"\r\n\r\n\0" {
        // v2: 16 bytes, then as many as its length says.
        stream.read_exact(&mut buf[5..16]).await?;
        let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
        if 16 + len > PROXY_HEADER_MAX {
            return Err(bad("a PROXY v2 header longer than the relay reads"));
        }
        buf.resize(16 + len, 0);
        stream.read_exact(&mut buf[16..]).await?;
    } else {
        return Err(bad("no PROXY header from a trusted proxy"));
    }
    proxy_client(&buf, peer).map_err(|why| bad(&why))
}

/// The client a whole PROXY header names ([`read_proxy_header`]).
pub fn proxy_client(header: &[u8], peer: SocketAddr) -> Result<SocketAddr, String> {
    use ppp::{HeaderResult, v1, v2};
    match HeaderResult::parse(header) {
        HeaderResult::V1(Ok(h)) if h.header.len() == header.len() => match h.addresses {
            v1::Addresses::Tcp4(a) => Ok(SocketAddr::from((a.source_address, a.source_port))),
            v1::Addresses::Tcp6(a) => Ok(SocketAddr::from((a.source_address, a.source_port))),
            v1::Addresses::Unknown => Ok(peer),
        },
        HeaderResult::V2(Ok(h)) if h.len() == header.len() => match (h.command, h.addresses) {
            (v2::Command::Local, _) => Ok(peer),
            (v2::Command::Proxy, v2::Addresses::IPv4(a)) if h.protocol == v2::Protocol::Stream => {
                Ok(SocketAddr::from((a.source_address, a.source_port)))
            }
            (v2::Command::Proxy, v2::Addresses::IPv6(a)) if h.protocol == v2::Protocol::Stream => {
                Ok(SocketAddr::from((a.source_address, a.source_port)))
            }
            _ => Err("a PROXY header for something other than TCP".into()),
        },
        HeaderResult::V1(Err(e)) => Err(format!("a malformed PROXY v1 header: {e}")),
        HeaderResult::V2(Err(e)) => Err(format!("a malformed PROXY v2 header: {e}")),
        _ => Err("a PROXY header with bytes after it".into()),
    }
}

/// Serves one connection. Each request carries the peer's address as axum's `ConnectInfo`
/// (what the throttle counts by, `crate::throttle`); no header is read for it.
async fn serve_one<I>(
    io: I,
    peer: SocketAddr,
    builder: &http1::Builder,
    app: Router,
    stop: tokio_util::sync::CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let app = TowerToHyperService::new(app);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
        hyper::service::Service::call(&app, req)
    });
    // Upgrades are allowed: the agent's tunnel (`relay`) takes its connection over after `101`.
    let conn = builder.serve_connection(TokioIo::new(io), svc).with_upgrades();
    tokio::pin!(conn);
    let r = tokio::select! {
        r = conn.as_mut() => r,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = r {
        tracing::debug!("connection: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Connections per address

/// Open connections per client address (the API's listener, and the relay's tenant door).
pub(crate) struct PerAddress {
    cap: usize,
    terminators: Vec<Terminator>,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One admitted connection; its address's count goes down when it is dropped.
pub(crate) struct Held {
    table: Arc<PerAddress>,
    key: Option<IpAddr>,
}

impl PerAddress {
    pub(crate) fn new(cap: usize, terminators: Vec<Terminator>) -> PerAddress {
        PerAddress { cap: cap.max(1), terminators, open: Mutex::new(HashMap::new()) }
    }

    /// What a peer is counted under: its IPv4 address, or its IPv6 address's /64 (one
    /// subscriber's network); `None` for a terminator, which is not counted.
    fn key(&self, ip: IpAddr) -> Option<IpAddr> {
        let ip = ip.to_canonical();
        if self.terminators.iter().any(|t| t.matches(ip)) {
            return None;
        }
        Some(match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        })
    }

    /// A hold on one more connection for `ip`, or `None` when its address is at the cap.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Held> {
        let key = self.key(ip);
        if let Some(k) = key {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            let n = open.entry(k).or_insert(0);
            if *n >= self.cap {
                return None;
            }
            *n += 1;
        }
        Some(Held { table: self.clone(), key })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(k) = self.key else { return };
        let mut open = self.table.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                open.remove(&k);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The write timeout

/// A connection's socket whose writes fail with `TimedOut` once they have made no progress for
/// the bound: the client is not reading, and the socket's buffers are full. Each byte written
/// starts the bound again, so an answer of any length that keeps moving is never cut.
pub struct WriteBound<I> {
    io: I,
    bound: Duration,
    /// Armed (reset to now + bound) when a write first finds the socket full.
    stall: Pin<Box<Sleep>>,
    stalled: bool,
}

impl<I> WriteBound<I> {
    pub fn new(io: I, bound: Duration) -> WriteBound<I> {
        WriteBound { io, bound, stall: Box::pin(tokio::time::sleep(bound)), stalled: false }
    }

    /// The inner socket is full: `Pending` until the bound since it first was, then the error.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.stalled {
            self.stalled = true;
            let deadline = Instant::now() + self.bound;
            self.stall.as_mut().reset(deadline);
        }
        match self.stall.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing of its answer for {} s", self.bound.as_secs()),
            ))),
        }
    }

    /// The outcome of a write: progress disarms the bound, a full socket arms it.
    fn wrote(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Pending => self.pending(cx),
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.stalled = false;
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteBound<I> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteBound<I> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    // A flush or a shutdown that finds the socket full arms the bound too; one that completes
    // says nothing about progress, so it does not disarm it.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Pending => this.pending(cx),
            r => r,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_shutdown(cx) {
            Poll::Pending => this.pending(cx),
            r => r,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Request bodies

/// The memory request bodies may hold together beyond each one's own [`BODY_OWN_BYTES`], in
/// bytes. [`serve`] puts it in every request's extensions; `server::read_body` takes a
/// [`BodyLease`] on it as a body arrives, and waits (within the body timeout) when it is spent.
#[derive(Clone)]
pub struct BodyBudget(Arc<Semaphore>);

impl BodyBudget {
    /// A budget of `bytes`, never less than one whole body needs.
    pub fn new(bytes: usize) -> BodyBudget {
        let least = crate::server::BODY_LIMIT - BODY_OWN_BYTES;
        BodyBudget(Arc::new(Semaphore::new(bytes.clamp(least, Semaphore::MAX_PERMITS))))
    }

    /// The bytes not held by any body now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// What one body holds of a [`BodyBudget`] (none without one); given back when dropped.
#[derive(Default)]
pub struct BodyLease {
    budget: Option<BodyBudget>,
    held: Option<OwnedSemaphorePermit>,
}

impl BodyLease {
    pub fn new(budget: Option<BodyBudget>) -> BodyLease {
        BodyLease { budget, held: None }
    }

    /// Waits until the lease covers a body buffer of `bytes` (its first [`BODY_OWN_BYTES`] are
    /// free).
    pub async fn cover(&mut self, bytes: usize) {
        let Some(budget) = &self.budget else { return };
        let held = self.held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        let need = bytes.saturating_sub(BODY_OWN_BYTES).saturating_sub(held);
        if need == 0 {
            return;
        }
        let need = u32::try_from(need).unwrap_or(u32::MAX);
        let more = budget.0.clone().acquire_many_owned(need).await.expect("the semaphore is never closed");
        match &mut self.held {
            Some(p) => p.merge(more),
            None => self.held = Some(more),
        }
    }
}

/// The rustls server configuration from a PEM certificate chain and key, HTTP/1.1 only.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("read the certificate chain {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("read the private key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not form a valid pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_pause_longer_while_they_go_on() {
        let mut p = AcceptPause::default();
        let waits: Vec<u64> = (0..8).map(|_| p.failed().as_millis() as u64).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        for _ in 0..100 {
            assert_eq!(p.failed(), AcceptPause::MAX);
        }
    }

    /// Issue 43, item 3: tunnels and the doors' connections together stay below the file limit.
    #[test]
    fn tunnels_and_doors_share_the_descriptors_below_the_limit() {
        for nofile in [100u64, 300, 1024, 65_536, 1 << 20] {
            for doors in 1..=3 {
                let (per_door, tunnels) = share_descriptors(nofile, usize::MAX, usize::MAX, doors);
                assert!((per_door * doors + tunnels) as u64 <= nofile - FD_RESERVE, "{nofile} {doors}");
                assert!(tunnels >= 1 && per_door >= 1);
            }
        }
        assert_eq!(share_descriptors(300, 10_000, 10_000, 1), (177, 59));
        assert_eq!(share_descriptors(1 << 20, 4096, 1024, 3), (4096, 1024), "what was asked, when it fits");
    }

    #[test]
    fn the_cap_stays_below_the_descriptor_limit() {
        assert_eq!(effective_max_connections(1024, 20_000), 1024);
        assert_eq!(effective_max_connections(1024, 256), 192);
        assert_eq!(effective_max_connections(1024, 10), 1);
        assert_eq!(effective_max_connections(0, 10_000), 1);
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_address_is_capped_and_its_slots_come_back() {
        let t = Arc::new(PerAddress::new(2, vec![Terminator::Loopback]));
        let a = t.admit(ip("192.0.2.1")).unwrap();
        let b = t.admit(ip("192.0.2.1")).unwrap();
        assert!(t.admit(ip("192.0.2.1")).is_none(), "a third connection from one address");
        // The same address written as IPv4-mapped IPv6 (a dual-stack listener) is the same.
        assert!(t.admit(ip("::ffff:192.0.2.1")).is_none());
        let _other = t.admit(ip("192.0.2.2")).expect("another address has its own share");
        drop(a);
        let _c = t.admit(ip("192.0.2.1")).expect("a closed connection gives its slot back");
        drop(b);
        drop(_c);
        drop(_other);
        assert!(t.open.lock().unwrap().is_empty(), "no entry is kept for an address with none open");
    }

    #[test]
    fn ipv6_is_counted_per_64_and_terminators_are_not_counted() {
        let t = Arc::new(PerAddress::new(1, vec![Terminator::Loopback]));
        let _a = t.admit(ip("2001:db8:1:2::1")).unwrap();
        assert!(t.admit(ip("2001:db8:1:2:ffff::9")).is_none(), "the same /64");
        let _b = t.admit(ip("2001:db8:1:3::1")).expect("another /64");
        let _l: Vec<_> = (0..10).map(|_| t.admit(ip("127.0.0.1")).expect("loopback: a terminator")).collect();
        let _l6 = t.admit(ip("::1")).expect("::1 too");

        let t = Arc::new(PerAddress::new(1, vec!["203.0.113.7".parse().unwrap()]));
        let _a = t.admit(ip("127.0.0.1")).unwrap();
        assert!(t.admit(ip("127.0.0.1")).is_none(), "loopback is capped when not named");
        let _r: Vec<_> = (0..10).map(|_| t.admit(ip("203.0.113.7")).expect("a named terminator")).collect();
        assert!("none".parse::<Terminator>().is_err(), "`none` is the command line's, not an address");
    }

    #[test]
    fn the_default_share_is_a_sixteenth_and_at_least_8() {
        assert_eq!(default_max_per_address(1024), 64);
        assert_eq!(default_max_per_address(20), 8);
        assert_eq!(default_max_per_address(1), 8);
    }

    #[tokio::test]
    async fn a_write_that_makes_no_progress_fails_after_the_bound() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (server, mut client) = tokio::io::duplex(1024);
        let mut w = WriteBound::new(server, Duration::from_millis(300));
        // Reading now and then keeps it going, however long the whole takes.
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut b = [0u8; 512];
            while got < 16 * 1024 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                got += client.read(&mut b).await.unwrap();
            }
            client
        });
        let started = std::time::Instant::now();
        w.write_all(&[7u8; 16 * 1024]).await.expect("a write that keeps moving is not cut");
        assert!(started.elapsed() > Duration::from_millis(300), "it took longer than the bound in all");
        let _client = reader.await.unwrap();
        // Nobody reads: the buffer fills and the write fails once the bound has passed.
        let started = std::time::Instant::now();
        let e = w.write_all(&[7u8; 4096]).await.expect_err("a stalled write fails");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    }

    fn v2(command: ppp::v2::Command, protocol: ppp::v2::Protocol, src: &str) -> Vec<u8> {
        use ppp::v2::{Builder, IPv4, Version};
        let src: std::net::SocketAddrV4 = src.parse().unwrap();
        let a = IPv4::new(*src.ip(), [192, 0, 2, 1].into(), src.port(), 443);
        Builder::with_addresses(Version::Two | command, protocol, a).build().unwrap()
    }

    #[test]
    fn proxy_headers_name_the_client_or_are_refused() {
        use ppp::v2::{Command, Protocol};
        let peer: SocketAddr = "10.0.0.5:40000".parse().unwrap();
        let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
        assert_eq!(
            proxy_client(b"PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\n", peer),
            Ok(sa("198.51.100.7:5555"))
        );
        assert_eq!(
            proxy_client(b"PROXY TCP6 2001:db8::7 2001:db8::1 5555 443\r\n", peer),
            Ok(sa("[2001:db8::7]:5555"))
        );
        assert_eq!(proxy_client(b"PROXY UNKNOWN\r\n", peer), Ok(peer), "the front's own connection");
        let h = v2(Command::Proxy, Protocol::Stream, "198.51.100.8:6000");
        assert_eq!(proxy_client(&h, peer), Ok(sa("198.51.100.8:6000")));
        assert_eq!(proxy_client(&v2(Command::Local, Protocol::Unspecified, "1.2.3.4:1"), peer), Ok(peer));
        assert!(proxy_client(&v2(Command::Proxy, Protocol::Datagram, "1.2.3.4:1"), peer).is_err(), "UDP");
        for bad in [
            &b"PROXY TCP4 999.51.100.7 192.0.2.1 5555 443\r\n"[..],
            b"PROXY TCP4 198.51.100.7 192.0.2.1 5555\r\n",
            b"PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\nGET",
            b"PROXY TCP9 198.51.100.7 192.0.2.1 5555 443\r\n",
            b"GET / HTTP/1.1\r\n",
        ] {
            assert!(proxy_client(bad, peer).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let mut truncated = v2(Command::Proxy, Protocol::Stream, "198.51.100.8:6000");
        truncated.pop();
        assert!(proxy_client(&truncated, peer).is_err());
    }

    /// A trusted front's header sets the address the per-address cap counts; a trusted front
    /// without a valid header is closed; anyone else's bytes are never read as a header.
    #[tokio::test]
    async fn the_accept_loop_reads_proxy_headers_only_from_trusted_fronts() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let door = Door {
            max_connections: 64,
            max_per_address: 1,
            terminators: vec![],
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            header_timeout: Duration::from_secs(5),
        };
        let stop = tokio_util::sync::CancellationToken::new();
        // Each connection is told the client it was counted as, then held until it closes.
        let server = tokio::spawn(accept_loop(
            l,
            door,
            tokio_util::task::TaskTracker::new(),
            stop.clone().cancelled_owned(),
            |mut s: TcpStream, client: SocketAddr| async move {
                let _ = s.write_all(format!("{client}\n").as_bytes()).await;
                let mut b = [0u8; 64];
                while s.read(&mut b).await.is_ok_and(|n| n > 0) {}
            },
        ));
        let from = |ip: &'static str| async move {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.bind(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
            sock.connect(addr).await.unwrap()
        };
        let told = |mut s: TcpStream| async move {
            let mut out = Vec::new();
            let mut b = [0u8; 1];
            loop {
                match tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await {
                    Ok(Ok(1)) if b[0] != b'\n' => out.push(b[0]),
                    Ok(Ok(1)) => return (Some(String::from_utf8(out).unwrap()), s),
                    _ => return (None, s),
                }
            }
        };
        let mut held = Vec::new();
        let mut s = from("127.0.0.1").await;
        s.write_all(b"PROXY TCP4 198.51.100.7 192.0.2.1 5555 443\r\n").await.unwrap();
        let (c, s) = told(s).await;
        assert_eq!(c.as_deref(), Some("198.51.100.7:5555"));
        held.push(s);
        // The same client through the same front: over its cap of 1, closed.
        let mut s = from("127.0.0.1").await;
        s.write_all(b"PROXY TCP4 198.51.100.7 192.0.2.1 5556 443\r\n").await.unwrap();
        assert_eq!(told(s).await.0, None, "the tenant's address is capped, not the front's");
        // Another client through the front (v2): its own share.
        let mut s = from("127.0.0.1").await;
        s.write_all(&v2(ppp::v2::Command::Proxy, ppp::v2::Protocol::Stream, "198.51.100.8:6000"))
            .await
            .unwrap();
        let (c, s) = told(s).await;
        assert_eq!(c.as_deref(), Some("198.51.100.8:6000"));
        held.push(s);
        // The trusted front without a header, or with a malformed one: closed.
        let mut s = from("127.0.0.1").await;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert_eq!(told(s).await.0, None, "no header from a trusted front");
        let mut s = from("127.0.0.1").await;
        s.write_all(b"PROXY TCP4 198.51.100.9 192.0.2.1 99999 443\r\n").await.unwrap();
        assert_eq!(told(s).await.0, None, "a malformed header");
        // An untrusted peer's header is not read: it is counted as itself.
        let mut s = from("127.0.0.2").await;
        s.write_all(b"PROXY TCP4 198.51.100.10 192.0.2.1 5555 443\r\n").await.unwrap();
        let (c, s) = told(s).await;
        assert!(c.is_some_and(|c| c.starts_with("127.0.0.2:")), "an untrusted peer is itself");
        held.push(s);
        drop(held);
        stop.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn bodies_share_the_budget_beyond_their_own_bytes() {
        let budget = BodyBudget::new(0);
        let total = budget.available();
        assert_eq!(total, crate::server::BODY_LIMIT - BODY_OWN_BYTES, "never less than one body needs");
        let mut small = BodyLease::new(Some(budget.clone()));
        small.cover(BODY_OWN_BYTES).await;
        assert_eq!(budget.available(), total, "a body within its own bytes takes nothing");
        let mut big = BodyLease::new(Some(budget.clone()));
        big.cover(BODY_OWN_BYTES + 1000).await;
        big.cover(BODY_OWN_BYTES + 3000).await;
        assert_eq!(budget.available(), total - 3000);
        let mut waiting = BodyLease::new(Some(budget.clone()));
        let blocked =
            tokio::time::timeout(Duration::from_millis(100), waiting.cover(crate::server::BODY_LIMIT));
        assert!(blocked.await.is_err(), "a spent budget makes the next large body wait");
        drop(big);
        assert_eq!(budget.available(), total, "a finished body gives its share back");
        waiting.cover(crate::server::BODY_LIMIT).await;
        assert_eq!(budget.available(), 0);
    }
}
