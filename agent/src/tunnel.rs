//! The agent's outbound tunnel (issue 34): how a tenant reaches the ports of a rental with no
//! inbound connection to the owner's machine.
//!
//! While the platform lists a rental with ports that runs here, the agent keeps one connection
//! to the platform: `GET /api/v1/agent/tunnel` with its node token, the same URL and TLS rules as
//! its heartbeat ([`crate::client::Platform::tunnel`]), upgraded (`101`) to **yamux** over that
//! connection. The relay opens one stream per tenant connection (why yamux: the relay must open
//! streams toward the agent, which HTTP/2 lets only the client do; each stream has its own flow
//! window, so a slow tenant or container stalls only its stream, never the agent's memory; it
//! rides inside one TLS connection through terminators that pass upgrades, where QUIC's UDP
//! would not). Where the environment names a proxy for the platform (`HTTPS_PROXY`,
//! `ALL_PROXY`, `NO_PROXY`: reqwest's rules, which the heartbeat follows), the tunnel goes
//! through it: `CONNECT`, then TLS to the platform inside, then the upgrade; a proxy it cannot
//! speak to (not `http://`) means no tunnel, never a way around it. A broken tunnel is dialled
//! again with backoff; a deleted node or a replaced token ends it ([`crate::client::classify`],
//! the heartbeat's rule; the heartbeat then stops the agent).
//!
//! **Keepalive** ([`gpum_protocol::tunnel`]): the relay opens a `ping` stream every 20 s, which
//! the agent answers `pong`; a tunnel on which no stream came from the relay for
//! [`gpum_protocol::tunnel::SILENCE`] (a cut network, a NAT that forgot the connection, a
//! relay gone without a word) is dropped, its streams closed, and dialled again with backoff.
//!
//! Each stream starts with one JSON line from the relay, [`TunnelOpen`] (a rental and a port);
//! the agent answers one line, [`TunnelReply`], then copies bytes both ways. **The rule, fail
//! closed** ([`check`]): the rental is one the platform lists for this node, that runs here now
//! (reported `running`, before its end), the port is one its spec lists, and the address is that
//! of the rental's own container on gpum's rental network, as the engine reports it, inside that
//! network's subnet ([`crate::docker::address`]). The platform never names an address. When a
//! rental stops running here, its streams close at once (checked every [`CHECK_EVERY`] and at
//! every change of the platform's list); when no listed rental with ports runs, the tunnel
//! closes.
//!
//! Bounds: [`MAX_STREAMS`] streams on the connection, [`MAX_STREAMS_PER_RENTAL`] per rental,
//! yamux's window (256 KiB a stream to start) and one [`gpum_protocol::tunnel::CopyBuffer`] per
//! direction (4 KiB while idle, up to 256 KiB while data flows) bound the memory of a stream;
//! the line is at most [`limits::MAX_TUNNEL_LINE`] bytes and must come within [`LINE_TIMEOUT`]. Nothing the tenant sends is logged; refusals are logged with their reason.

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpum_protocol::tunnel::{self, read_line};
use gpum_protocol::{RentalSpec, RentalState, TunnelOpen, TunnelReply, limits};
use rand::SeedableRng;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::backoff::Backoff;
use crate::client::{Platform, Verdict, classify};
use crate::docker::rental::{Book, valid_id};
use crate::docker::{Docker, address};
use crate::secret::Token;

pub use gpum_protocol::tunnel::MAX_STREAMS;
/// Streams to one rental at once (the relay enforces its own bound first).
pub const MAX_STREAMS_PER_RENTAL: usize = 64;
/// How often the agent checks that the rentals behind open streams still run.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long the relay has to send a stream's first line.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to the container's port may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The backoff between dials: from 1 s, doubling, up to this.
pub const REDIAL_MAX: Duration = Duration::from_secs(60);

/// What the tunnel knows of the rentals: the platform's last list and the agent's own reports.
#[derive(Clone)]
pub struct Rentals {
    pub desired: watch::Receiver<Arc<Vec<RentalSpec>>>,
    pub book: Book,
}

impl Rentals {
    /// The spec of rental `id` if it runs here now (listed, reported running, before its end).
    fn running(&self, id: &str, now: u64) -> Option<RentalSpec> {
        let spec = self.desired.borrow().iter().find(|s| s.id == id).cloned()?;
        let running = self.book.get(id).is_some_and(|r| r.state == RentalState::Running);
        (running && now < spec.ends_at).then_some(spec)
    }

    /// Whether a tunnel is wanted: some listed rental with ports runs here.
    fn wanted(&self, now: u64) -> bool {
        let ids: Vec<String> =
            self.desired.borrow().iter().filter(|s| !s.ports.is_empty()).map(|s| s.id.clone()).collect();
        ids.iter().any(|id| self.running(id, now).is_some())
    }
}

/// Why a stream was refused; the text goes back to the relay (and so to the tenant).
pub fn check_spec(open: &TunnelOpen, spec: Option<&RentalSpec>) -> Result<(), String> {
    if !valid_id(&open.rental) {
        return Err("not a rental id".into());
    }
    let Some(spec) = spec else {
        return Err("this node does not run that rental now".into());
    };
    if !spec.ports.contains(&open.port) {
        return Err(format!("port {} is not one the rental exposes", open.port));
    }
    Ok(())
}

/// The rule of the module docs: `Ok` with the address to connect to, or the reason.
pub async fn check(
    docker: &Docker,
    rentals: &Rentals,
    open: &TunnelOpen,
    now: u64,
) -> Result<IpAddr, String> {
    let spec = if valid_id(&open.rental) { rentals.running(&open.rental, now) } else { None };
    check_spec(open, spec.as_ref())?;
    address::rental_address(docker, &open.rental).await.map_err(|e| e.to_string())
}

/// The open streams' rentals: each rental's token closes its streams at once.
#[derive(Clone, Default)]
struct Open(Arc<Mutex<HashMap<String, (CancellationToken, usize)>>>);

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (CancellationToken, usize)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a stream of `rental`, or `None` past [`MAX_STREAMS_PER_RENTAL`].
    fn enter(&self, rental: &str) -> Option<CancellationToken> {
        let mut m = self.lock();
        let e = m.entry(rental.to_string()).or_insert_with(|| (CancellationToken::new(), 0));
        if e.1 >= MAX_STREAMS_PER_RENTAL {
            return None;
        }
        e.1 += 1;
        Some(e.0.clone())
    }

    fn leave(&self, rental: &str) {
        let mut m = self.lock();
        if let Some(e) = m.get_mut(rental) {
            e.1 = e.1.saturating_sub(1);
            if e.1 == 0 {
                m.remove(rental);
            }
        }
    }

    /// Closes the streams of every rental `keep` says no to.
    fn close_unless(&self, keep: impl Fn(&str) -> bool) {
        let mut m = self.lock();
        m.retain(|id, (token, _)| {
            let k = keep(id);
            if !k {
                info!(rental = %id, "tunnel: the rental no longer runs; closing its streams");
                token.cancel();
            }
            k
        });
    }

    fn close_all(&self) {
        self.close_unless(|_| false);
    }
}

/// The unix time now, by `host`'s clock (the rentals' ends are unix times).
type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Runs the tunnel for as long as the agent runs: waits until a rental with ports runs, dials,
/// serves, dials again after a break (with backoff). Returns only when the platform revoked the
/// node.
///
/// `silence`: how long a tunnel may go without a stream from the relay before it is dropped
/// ([`gpum_protocol::tunnel::SILENCE`]; shorter only in end-to-end tests).
pub async fn run(
    platform: Platform,
    token: Token,
    docker: Arc<Docker>,
    rentals: Rentals,
    now: Clock,
    silence: Duration,
) {
    if let Err(why) = platform.can_tunnel() {
        // Fail closed: the tunnel must not go around the proxy the owner set. Tenants get 502
        // at the relay.
        warn!(reason = %why, "a rental has ports, but the tunnel cannot go through the proxy set for the agent; tenants cannot reach this machine's rentals");
        return;
    }
    if let Some(proxy) = platform.tunnel_proxy() {
        info!(proxy = %proxy, "the tunnel goes through the proxy set for the agent");
    }
    let mut failures = 0u32;
    let mut rentals = rentals;
    let mut backoff = Backoff::new(Duration::from_secs(1), REDIAL_MAX);
    let mut rng = rand::rngs::StdRng::from_entropy();
    loop {
        while !rentals.wanted(now()) {
            tokio::select! {
                r = rentals.desired.changed() => if r.is_err() { return },
                () = tokio::time::sleep(CHECK_EVERY) => {}
            }
        }
        match platform.tunnel(&token).await {
            Ok(io) => {
                backoff.reset();
                failures = 0;
                info!("tunnel open");
                let why = serve(io, &docker, &mut rentals, &now, silence).await;
                info!(why, "tunnel closed");
                if why == SILENT {
                    // The network may still be cut: the next dial waits its turn.
                    let wait = backoff.fail(&mut rng);
                    tokio::time::sleep(wait).await;
                }
            }
            Err(e) => match classify(&e) {
                Verdict::StopForGood(code) => {
                    warn!(code = ?code, "the platform refused the tunnel for good");
                    return;
                }
                Verdict::Retry => {
                    let wait = backoff.fail(&mut rng);
                    // The first failure of a series (a proxy refusing CONNECT, a platform
                    // down) is said plainly; its repeats only in the debug log.
                    if failures.is_multiple_of(30) {
                        warn!(error = %e, wait_ms = wait.as_millis() as u64, "could not open the tunnel; trying again");
                    } else {
                        debug!(error = %e, wait_ms = wait.as_millis() as u64, "could not open the tunnel");
                    }
                    failures += 1;
                    tokio::time::sleep(wait).await;
                }
            },
        }
    }
}

/// Why [`serve`] dropped a tunnel that went quiet.
const SILENT: &str = "no stream from the platform within the keepalive's bound";

/// Serves one tunnel connection until it breaks, goes silent for `silence` (no ping, no
/// tenant's stream) or is no longer wanted; says why it ended.
async fn serve<T>(
    io: T,
    docker: &Arc<Docker>,
    rentals: &mut Rentals,
    now: &Clock,
    silence: Duration,
) -> &'static str
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = gpum_protocol::tunnel::buffered(io).compat();
    let mut conn = yamux::Connection::new(io, gpum_protocol::tunnel::yamux_config(), yamux::Mode::Client);
    let open = Open::default();
    let mut tick = tokio::time::interval(CHECK_EVERY);
    let quiet = tokio::time::sleep(silence);
    tokio::pin!(quiet);
    let why = loop {
        tokio::select! {
            s = poll_fn(|cx| conn.poll_next_inbound(cx)) => match s {
                Some(Ok(stream)) => {
                    quiet.as_mut().reset(tokio::time::Instant::now() + silence);
                    let (docker, rentals, open, now) = (docker.clone(), rentals.clone(), open.clone(), now.clone());
                    tokio::spawn(async move { stream_task(stream, &docker, &rentals, &open, now).await });
                }
                Some(Err(e)) => {
                    debug!(error = %e, "tunnel connection");
                    break "the connection broke";
                }
                None => break "the platform closed it",
            },
            r = rentals.desired.changed() => if r.is_err() { break "the agent is stopping" },
            _ = tick.tick() => {}
            () = &mut quiet => break SILENT,
        }
        let t = now();
        open.close_unless(|id| rentals.running(id, t).is_some());
        if !rentals.wanted(t) {
            let _ = tokio::time::timeout(Duration::from_secs(5), poll_fn(|cx| conn.poll_close(cx))).await;
            break "no rental with ports runs here";
        }
    };
    open.close_all();
    why
}

/// One stream: the line, the rule, the answer, then the bytes.
async fn stream_task(stream: yamux::Stream, docker: &Docker, rentals: &Rentals, open: &Open, now: Clock) {
    let mut s = BufReader::with_capacity(limits::MAX_TUNNEL_LINE, stream.compat());
    let line = match tokio::time::timeout(LINE_TIMEOUT, read_line(&mut s)).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return debug!(error = %e, "tunnel: a stream without a good first line"),
        Err(_) => return debug!("tunnel: no first line in time"),
    };
    if line == tunnel::PING {
        let mut pong = tunnel::PONG.to_vec();
        pong.push(b'\n');
        let _ = s.write_all(&pong).await;
        let _ = s.shutdown().await;
        return;
    }
    let req: TunnelOpen = match serde_json::from_slice(&line) {
        Ok(r) => r,
        Err(_) => return refuse(&mut s, None, "the first line is not a tunnel request".into()).await,
    };
    let ip = match check(docker, rentals, &req, now()).await {
        Ok(ip) => ip,
        Err(why) => return refuse(&mut s, Some(&req), why).await,
    };
    let Some(cancel) = open.enter(&req.rental) else {
        return refuse(&mut s, Some(&req), format!("the rental has {MAX_STREAMS_PER_RENTAL} streams open"))
            .await;
    };
    let result = async {
        let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((ip, req.port)))
            .await
        {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                return refuse(&mut s, Some(&req), format!("the container's port does not answer: {e}"))
                    .await;
            }
            Err(_) => {
                return refuse(&mut s, Some(&req), "the container's port does not answer in time".into())
                    .await;
            }
        };
        let _ = tcp.set_nodelay(true);
        if reply(&mut s, &TunnelReply { ok: true, reason: None }).await.is_err() {
            return;
        }
        debug!(rental = %req.rental, port = req.port, "tunnel: stream open");
        let (sr, sw) = tokio::io::split(s);
        let (tr, tw) = tcp.into_split();
        let both = async {
            tokio::join!(tunnel::pump(sr, tw, |_| async {}), tunnel::pump(tr, sw, |_| async {}));
        };
        tokio::select! {
            () = both => debug!(rental = %req.rental, port = req.port, "tunnel: stream ended"),
            () = cancel.cancelled() => {
                debug!(rental = %req.rental, port = req.port, "tunnel: stream closed, the rental stopped");
            }
        }
    };
    result.await;
    open.leave(&req.rental);
}

async fn reply<W: AsyncWrite + Unpin>(w: &mut W, r: &TunnelReply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await
}

async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, req: Option<&TunnelOpen>, why: String) {
    warn!(
        rental = %req.map_or("", |r| r.rental.as_str()).escape_debug(),
        port = req.map_or(0, |r| r.port),
        reason = %why,
        "tunnel: refused a stream"
    );
    let _ = reply(w, &TunnelReply { ok: false, reason: Some(why) }).await;
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ports: &[u16]) -> RentalSpec {
        RentalSpec {
            id: "rent-00112233445566aa".into(),
            image: "x@sha256:0".into(),
            gpu_uuids: vec![],
            cpu_millis: 1000,
            memory_mib: 1024,
            disk_gib: 1,
            shm_mib: 64,
            env: vec![],
            command: vec![],
            ends_at: 2_000_000_000,
            ports: ports.to_vec(),
            driver_capabilities: vec![],
        }
    }

    #[test]
    fn tunnel_streams_reach_only_listed_ports_of_rentals_that_run_here() {
        let open = |rental: &str, port| TunnelOpen { rental: rental.into(), port };
        let s = spec(&[22, 8080]);
        assert_eq!(check_spec(&open("rent-00112233445566aa", 22), Some(&s)), Ok(()));
        assert!(check_spec(&open("rent-00112233445566aa", 23), Some(&s)).unwrap_err().contains("port 23"));
        assert!(check_spec(&open("rent-00112233445566aa", 22), None).unwrap_err().contains("does not run"));
        assert!(check_spec(&open("../etc", 22), Some(&s)).unwrap_err().contains("not a rental id"));
    }

    #[test]
    fn tunnel_rentals_run_only_while_listed_running_and_before_their_end() {
        let (tx, rx) = watch::channel(Arc::new(vec![spec(&[22])]));
        let r = Rentals { desired: rx, book: Book::default() };
        let id = "rent-00112233445566aa";
        assert!(r.running(id, 1).is_none(), "not reported running yet");
        r.book.set(id, RentalState::Running, None, None);
        assert!(r.running(id, 1).is_some() && r.wanted(1));
        assert!(r.running(id, 2_000_000_000).is_none(), "past its end");
        r.book.set(id, RentalState::Stopping, None, None);
        assert!(r.running(id, 1).is_none());
        r.book.set(id, RentalState::Running, None, None);
        tx.send_replace(Arc::new(vec![]));
        assert!(r.running(id, 1).is_none() && !r.wanted(1), "no longer listed");
        tx.send_replace(Arc::new(vec![spec(&[])]));
        assert!(r.running(id, 1).is_some() && !r.wanted(1), "no ports: no tunnel");
    }
}
