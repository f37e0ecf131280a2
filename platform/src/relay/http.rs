//! The relay's HTTP door (issue 34, `serve --relay-http-listen ADDR --relay-domain DOMAIN`): a
//! tenant reaches an HTTP port of a rental by host name, `https://<16 hex>-<port>.<DOMAIN>/path`
//! (the rental id's hex digits, a dash, the container port: one DNS label of at most 22
//! characters, under one wildcard name and certificate, `*.<DOMAIN>`).
//!
//! **Credential.** `Authorization: Basic base64(<rental id>:<credential>)` (`curl -u`; a browser
//! prompts on the `401` with `WWW-Authenticate: Basic realm="gpum"`), or, for an application
//! that uses `Authorization` itself, `X-Gpum-Credential: <credential>` (then `Authorization`
//! passes through untouched, unless it carries the credential too). The relay consumes the
//! credential and removes every header that carries it (`X-Gpum-Credential` always, an
//! `Authorization: Basic` naming the rental, and any header holding the credential's text), so
//! it never reaches the container, which runs on the owner's machine. Every
//! request on a connection is checked, as the browser sends it each time. A wrong credential
//! (or another rental's) counts against the client's address like the TCP door's
//! (`web::throttle`, door `Relay`); a request with none is answered `401` without counting, as
//! a browser's first request always is.
//!
//! **Answers** are those of the TCP door, as plain HTTP: 429 blocked, 401 credential, 404 the
//! rental ended, 403 a port it does not list, 503 its stream cap, 502 no tunnel or the agent
//! refused; 400 for a host name that is not `<16 hex>-<port>.<DOMAIN>`; 421 for a request on a
//! kept-alive connection naming another rental or port than the connection's first.
//!
//! **Forwarding.** Each tenant connection holds one place under the rental's stream cap, from its
//! first admitted request until it closes, and one tunnel stream at a time in it (a container
//! that closes its side, `Connection: close`, gets a new stream at the next request). HTTP/1.1 with
//! hyper on both sides (a client connection over the stream); bodies stream through, never held
//! whole. `Host` is kept (the public name, so the application's absolute URLs work);
//! `X-Forwarded-Host` repeats it, `X-Forwarded-Proto: https` is set when this door did TLS
//! (behind a terminator, the terminator's passes through). No `X-Forwarded-For`: the relay
//! never hands the tenant's address to the machine the rental runs on (the owner's), as the TCP
//! door does not. `Upgrade` (WebSocket) passes through: after the container's `101` the two
//! connections are spliced as on the TCP door. The relay's idle timeout, rate bucket and
//! stream cap apply as on the TCP door ([`Metered`]); stopping the rental closes the
//! connection at once.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use super::{AgentStream, Bucket, Refused, Slot, Tenants, answer, blocked, check, open_in, parse_basic};

/// The header an application that uses `Authorization` itself can carry the credential in.
pub const CREDENTIAL_HEADER: &str = "x-gpum-credential";

/// `<16 hex>-<port>.<domain>` (any case, with or without `:port` or a final dot) as
/// (`rent-<16 hex>`, port). `domain` is the relay's, without a final dot.
pub fn parse_host(host: &str, domain: &str) -> Option<(String, u16)> {
    let host = host.to_ascii_lowercase();
    let host = match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h.to_string(),
        Some(_) => return None,
        None => host,
    };
    let host = host.strip_suffix('.').unwrap_or(&host);
    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(domain.as_str())?.strip_suffix('.')?;
    let (hex, port) = label.split_once('-')?;
    let hex_ok = hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let port_ok = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    let port: u16 = port.parse().ok().filter(|p| *p != 0 && port_ok)?;
    hex_ok.then(|| (format!("rent-{hex}"), port))
}

/// What a request carries for rental `id` ([`take_credential`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Presented {
    /// No credential: `401` (a browser's first request), not counted as a wrong one.
    Nothing,
    /// `Authorization: Basic` naming another rental: a wrong credential.
    OtherRental,
    Credential(String),
}

/// The credential a request carries for rental `id`, taken out of its headers: from
/// [`CREDENTIAL_HEADER`] (which is always removed) or else from `Authorization: Basic` (removed
/// then; an application's own scheme, `Bearer` or the like, stays). Then every header that
/// carries the rental's credential in any other form goes too ([`carries_credential`]): with
/// the credential in both headers, `Authorization` went on to the container (issue 43, item 7).
pub fn take_credential(headers: &mut HeaderMap, id: &str) -> Presented {
    let presented = if let Some(v) = headers.remove(CREDENTIAL_HEADER) {
        match v.to_str() {
            Ok(s) => Presented::Credential(s.trim().to_string()),
            Err(_) => Presented::OtherRental,
        }
    } else {
        let basic = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(basic_any_case);
        let Some((user, credential)) = basic else { return Presented::Nothing };
        headers.remove(header::AUTHORIZATION);
        if user == id { Presented::Credential(credential) } else { Presented::OtherRental }
    };
    let credential = match &presented {
        Presented::Credential(c) => c.as_str(),
        _ => "",
    };
    let carriers: Vec<HeaderName> = headers
        .iter()
        .filter(|(_, v)| carries_credential(v, id, credential))
        .map(|(n, _)| n.clone())
        .collect();
    for n in carriers {
        headers.remove(n);
    }
    presented
}

/// Whether a header's value carries rental `id`'s credential: `credential` (what the request
/// presented; empty for none) anywhere in it, or HTTP Basic (any case of the scheme) naming the
/// rental or holding the credential.
fn carries_credential(value: &HeaderValue, id: &str, credential: &str) -> bool {
    let holds = |hay: &[u8]| {
        !credential.is_empty() && hay.windows(credential.len()).any(|w| w == credential.as_bytes())
    };
    holds(value.as_bytes())
        || value.to_str().ok().and_then(basic_any_case).is_some_and(|(u, p)| u == id || holds(p.as_bytes()))
}

/// `Basic <base64(user:password)>` with the scheme in any case (RFC 9110 11.1) and any spaces
/// before the token.
fn basic_any_case(value: &str) -> Option<(String, String)> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    parse_basic(&format!("Basic {}", token.trim()))
}

/// Headers that concern one hop (RFC 9110 7.6.1), not passed on; `Connection` and `Upgrade`
/// are put back for an upgrade.
const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "trailer", "upgrade"];

/// Serves tenants' HTTP requests on `listener` until `shutdown` completes; `tls`: this door
/// ends TLS itself (else it is on loopback, behind a terminator).
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    t: Arc<Tenants>,
    shutdown: impl Future<Output = ()>,
) {
    super::serve_door(listener, tls, t, 64 * 1024, shutdown, |io, peer, builder, t| async move {
        let tls = matches!(io, tokio_util::either::Either::Right(_));
        serve_conn(io, peer, tls, &builder, t).await
    })
    .await;
}

/// One tenant connection and what it holds.
struct Conn {
    t: Arc<Tenants>,
    client: IpAddr,
    tls: bool,
    /// Closes the connection (and its upgraded splice): the rental ended, or the stream idled.
    close: CancellationToken,
    /// Held by the connection and its upgraded splice; when both are gone, `done` is
    /// cancelled and what watches them stops.
    alive: Arc<tokio_util::sync::DropGuard>,
    done: CancellationToken,
    activity: Arc<Activity>,
    backend: tokio::sync::Mutex<Option<Backend>>,
}

/// The connection's place under the rental's stream cap (held until the tenant's connection
/// closes, whatever streams come and go under it), and its tunnel stream now, as an HTTP
/// client connection to the container's port.
struct Backend {
    id: String,
    port: u16,
    slot: Arc<Slot>,
    /// `None` once the container closed it (or said it would).
    send: Option<hyper::client::conn::http1::SendRequest<Body>>,
}

async fn serve_conn<I>(io: I, peer: SocketAddr, tls: bool, builder: &http1::Builder, t: Arc<Tenants>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = t.relay.cfg.idle_timeout;
    let done = CancellationToken::new();
    let conn = Arc::new(Conn {
        client: super::throttle_key(peer),
        t,
        tls,
        close: CancellationToken::new(),
        alive: Arc::new(done.clone().drop_guard()),
        done,
        activity: Arc::new(Activity::new()),
        backend: tokio::sync::Mutex::new(None),
    });
    let c = conn.clone();
    let svc = hyper::service::service_fn(move |req| {
        let c = c.clone();
        async move { Ok::<_, std::convert::Infallible>(c.request(req).await) }
    });
    let served = builder.serve_connection(TokioIo::new(io), svc).with_upgrades();
    tokio::select! {
        r = served => if let Err(e) = r { tracing::debug!("relay HTTP connection: {e}") },
        () = conn.close.cancelled() => tracing::debug!("relay HTTP connection closed: the rental ended or it idled"),
        () = conn.activity.idle_for(idle) => tracing::debug!("relay HTTP connection idle; closed"),
    }
}

fn unauthorized() -> Response<Body> {
    let mut r = answer(StatusCode::UNAUTHORIZED, "the rental's id and credential are needed");
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"gpum\""));
    r
}

impl Conn {
    /// One request: the checks of the module docs, in order, then on to the container.
    async fn request(&self, mut req: Request<hyper::body::Incoming>) -> Response<Body> {
        self.activity.touch();
        let t = &self.t;
        if let Some(r) = blocked(t, self.client) {
            return r;
        }
        let domain = t.relay.cfg.domain.as_deref().unwrap_or_default();
        let host =
            req.uri().authority().map(|a| a.as_str().to_string()).or_else(|| {
                req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_string)
            });
        let Some((id, port)) = host.as_deref().and_then(|h| parse_host(h, domain)) else {
            return answer(StatusCode::BAD_REQUEST, &format!("the host is <16 hex digits>-<port>.{domain}"));
        };
        // Taken out before anything else can see the request.
        let credential = match take_credential(req.headers_mut(), &id) {
            Presented::Nothing => return unauthorized(),
            Presented::OtherRental => None,
            Presented::Credential(c) => Some(c),
        };
        let rental = match check(t, self.client, &id, port, credential).await {
            Ok(r) => r,
            Err(Refused::Credential) => return unauthorized(),
            Err(Refused::Answer(status, why)) => return answer(status, &why),
        };
        let upgrade = req.headers().contains_key(header::UPGRADE);
        let tenant_up = upgrade.then(|| hyper::upgrade::on(&mut req));
        let mut fwd = forward_request(req, self.tls, upgrade).map(Body::new);
        let mut backend = self.backend.lock().await;
        // Twice at most: a kept-alive stream the container has closed since (which it said with
        // `Connection: close`, or which refuses the request before a byte of it went out) is
        // replaced by a new one under the same slot.
        let mut tries = 0;
        let (mut resp, slot) = loop {
            tries += 1;
            let b = match &mut *backend {
                Some(b) if b.id != id || b.port != port => {
                    return answer(
                        StatusCode::MISDIRECTED_REQUEST,
                        "this connection reaches another rental or port; open a new one",
                    );
                }
                Some(b) => b,
                None => {
                    let slot = match super::slot(&t.relay, &id) {
                        Ok(s) => Arc::new(s),
                        Err(Refused::Answer(status, why)) => return answer(status, &why),
                        Err(Refused::Credential) => return unauthorized(),
                    };
                    self.watch(&slot);
                    backend.insert(Backend { id: id.clone(), port, slot, send: None })
                }
            };
            if b.send.as_ref().is_some_and(|s| s.is_closed()) {
                b.send = None;
            }
            let send = match &mut b.send {
                Some(s) => s,
                None => match self.open(&rental.node_id, &id, port, &b.slot).await {
                    Ok(s) => b.send.insert(s),
                    Err(Refused::Answer(status, why)) => return answer(status, &why),
                    Err(Refused::Credential) => return unauthorized(),
                },
            };
            if let Err(e) = send.ready().await {
                b.send = None;
                if tries < 2 {
                    continue;
                }
                tracing::debug!(error = %e, "relay: the rental's port closed the connection");
                return answer(StatusCode::BAD_GATEWAY, "the rental's port did not answer over HTTP");
            }
            match send.try_send_request(fwd).await {
                Ok(r) => {
                    if closes(&r) {
                        b.send = None;
                    }
                    break (r, b.slot.clone());
                }
                Err(mut e) => {
                    b.send = None;
                    match e.take_message() {
                        Some(again) if tries < 2 => fwd = again,
                        _ => {
                            tracing::debug!(error = %e.error(), "relay: the rental's port did not answer over HTTP");
                            return answer(
                                StatusCode::BAD_GATEWAY,
                                "the rental's port did not answer over HTTP",
                            );
                        }
                    }
                }
            }
        };
        drop(backend);
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(tenant_up) = tenant_up else {
                return answer(StatusCode::BAD_GATEWAY, "the rental's port switched protocols unasked");
            };
            let backend_up = hyper::upgrade::on(&mut resp);
            let (close, activity, idle) =
                (self.close.clone(), self.activity.clone(), t.relay.cfg.idle_timeout);
            let alive = self.alive.clone();
            tokio::spawn(async move {
                let _alive = alive;
                let (Ok(tenant), Ok(container)) = (tenant_up.await, backend_up.await) else {
                    return tracing::debug!("relay: an upgrade did not complete");
                };
                let (mut tenant, mut container) = (TokioIo::new(tenant), TokioIo::new(container));
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut tenant, &mut container) => {}
                    () = close.cancelled() => {}
                    () = slot.cancel.cancelled() => {}
                    () = activity.idle_for(idle) => tracing::debug!("relay: upgraded stream idle; closed"),
                }
                drop(slot);
            });
        }
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            strip_hop_by_hop(resp.headers_mut());
        }
        resp.map(Body::new)
    }

    /// Opens a stream (under the connection's `slot`) and an HTTP client connection over it.
    async fn open(
        &self,
        node_id: &str,
        id: &str,
        port: u16,
        slot: &Slot,
    ) -> Result<hyper::client::conn::http1::SendRequest<Body>, Refused> {
        let agent = open_in(&self.t.relay, node_id, id, port).await?;
        let io = Metered::new(agent, slot.bucket.clone(), self.activity.clone());
        let (send, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(io)).await {
            Ok(v) => v,
            Err(e) => {
                return Err(Refused::Answer(
                    StatusCode::BAD_GATEWAY,
                    format!("the tunnel stream failed: {e}"),
                ));
            }
        };
        let close = self.close.clone();
        tokio::spawn(async move {
            tokio::select! {
                r = conn.with_upgrades() => if let Err(e) = r { tracing::debug!(error = %e, "relay: the container's HTTP connection") },
                () = close.cancelled() => {}
            }
        });
        Ok(send)
    }

    /// The rental's end closes the tenant's connection, whatever its streams are doing.
    fn watch(&self, slot: &Slot) {
        let (close, ended, done) = (self.close.clone(), slot.cancel.clone(), self.done.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = done.cancelled() => {}
                () = ended.cancelled() => {
                    tracing::debug!("relay: the rental ended; closing its HTTP connection");
                    close.cancel();
                }
            }
        });
    }
}

/// The request as the container gets it: origin-form target, hop-by-hop headers dropped (but
/// an upgrade's), `X-Forwarded-Host` and, when this door did TLS, `X-Forwarded-Proto`.
fn forward_request<B>(req: Request<B>, tls: bool, upgrade: bool) -> Request<B> {
    let (mut parts, body) = req.into_parts();
    let keep_upgrade = upgrade.then(|| {
        (parts.headers.get(header::UPGRADE).cloned(), parts.headers.get(header::CONNECTION).cloned())
    });
    strip_hop_by_hop(&mut parts.headers);
    if let Some((Some(up), _)) = keep_upgrade {
        parts.headers.insert(header::UPGRADE, up);
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let host = parts.uri.authority().map(|a| a.as_str().to_string());
    if let Some(h) = host.and_then(|h| HeaderValue::from_str(&h).ok()) {
        parts.headers.insert(header::HOST, h);
    }
    if let Some(h) = parts.headers.get(header::HOST).cloned() {
        parts.headers.insert(HeaderName::from_static("x-forwarded-host"), h);
    }
    if tls {
        parts.headers.insert(HeaderName::from_static("x-forwarded-proto"), HeaderValue::from_static("https"));
    }
    if let Some(pq) = parts.uri.path_and_query().cloned() {
        parts.uri = pq.into();
    }
    parts.version = hyper::Version::HTTP_11;
    Request::from_parts(parts, body)
}

/// Whether the container closes its connection after this answer (`Connection: close`, or
/// HTTP/1.0 without `keep-alive`).
fn closes<B>(resp: &Response<B>) -> bool {
    let tokens = || {
        resp.headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
    };
    tokens().any(|t| t == "close")
        || (resp.version() == hyper::Version::HTTP_10 && !tokens().any(|t| t == "keep-alive"))
}

/// Removes the headers of one hop: [`HOP_BY_HOP`] and whatever `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in HOP_BY_HOP {
        headers.remove(n);
    }
}

/// When bytes last moved through a connection's stream (or a request arrived).
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0) }
    }

    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Completes once nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let since = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = self.start.elapsed().saturating_sub(since);
            if quiet >= idle {
                return;
            }
            tokio::time::sleep(idle - quiet).await;
        }
    }
}

/// The tunnel stream with the rental's byte budget and the connection's activity: each read or
/// write is counted, and one that puts the rental in debt makes the next wait it off (so
/// nothing more than hyper's buffers is held, as on the TCP door's copy).
struct Metered<S = AgentStream> {
    io: S,
    bucket: Option<Arc<Bucket>>,
    activity: Arc<Activity>,
    wait: Option<Pin<Box<Sleep>>>,
}

impl<S> Metered<S> {
    fn new(io: S, bucket: Option<Arc<Bucket>>, activity: Arc<Activity>) -> Metered<S> {
        Metered { io, bucket, activity, wait: None }
    }

    /// `Pending` while a debt is being waited off.
    fn paid(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(w) = &mut self.wait {
            std::task::ready!(w.as_mut().poll(cx));
            self.wait = None;
        }
        Poll::Ready(())
    }

    fn moved(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.activity.touch();
        if let Some(b) = &self.bucket {
            let debt = b.debt(n, Instant::now());
            if !debt.is_zero() {
                self.wait = Some(Box::pin(tokio::time::sleep(debt)));
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.paid(cx));
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        this.moved(buf.filled().len() - before);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.paid(cx));
        let n = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, data))?;
        this.moved(n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_http_host_names_parse_strictly() {
        let d = "relay.example.com";
        let ok = Some(("rent-00112233445566aa".to_string(), 8080));
        assert_eq!(parse_host("00112233445566aa-8080.relay.example.com", d), ok);
        assert_eq!(parse_host("00112233445566AA-8080.Relay.Example.COM", d), ok, "any case");
        assert_eq!(parse_host("00112233445566aa-8080.relay.example.com:443", d), ok);
        assert_eq!(parse_host("00112233445566aa-8080.relay.example.com.", d), ok);
        assert_eq!(parse_host("00112233445566aa-8080.relay.example.com", "relay.example.com."), ok);
        for bad in [
            "00112233445566aa-0.relay.example.com",
            "00112233445566aa-65536.relay.example.com",
            "00112233445566aa-+80.relay.example.com",
            "00112233445566aa.relay.example.com",
            "0011223344556-8080.relay.example.com",
            "00112233445566ag-8080.relay.example.com",
            "x.00112233445566aa-8080.relay.example.com",
            "00112233445566aa-8080.relay.example.org",
            "00112233445566aa-8080.evilrelay.example.com",
            "00112233445566aa-8080relay.example.com",
            "relay.example.com",
            "00112233445566aa-8080.relay.example.com:x",
            "[::1]:443",
        ] {
            assert_eq!(parse_host(bad, d), None, "{bad}");
        }
        // The scheme fits one DNS label with room to spare.
        assert!("ffffffffffffffff-65535".len() <= 63);
    }

    /// The stream of a rental with a rate carries it at that rate (both directions together),
    /// and every byte counts as activity for the idle timeout.
    #[tokio::test]
    async fn relay_http_stream_is_paced_by_the_rentals_bucket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (near, mut far) = tokio::io::duplex(64 * 1024);
        let activity = Arc::new(Activity::new());
        let mut m = Metered::new(near, Some(Arc::new(Bucket::new(10_000))), activity.clone());
        let started = Instant::now();
        // A second's burst passes at once; 10 000 more bytes take about a second.
        m.write_all(&[1u8; 10_000]).await.unwrap();
        assert!(started.elapsed() < Duration::from_millis(500), "the burst");
        far.write_all(&[2u8; 10_000]).await.unwrap();
        let mut back = vec![0u8; 10_000];
        m.read_exact(&mut back).await.unwrap();
        m.write_all(&[3u8; 1]).await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(5), "{took:?}");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), activity.idle_for(Duration::from_millis(500)))
                .await
                .is_err(),
            "bytes just moved: not idle"
        );
        tokio::time::timeout(Duration::from_secs(2), activity.idle_for(Duration::from_millis(500)))
            .await
            .expect("idle once nothing moves");
    }

    #[test]
    fn relay_http_requests_go_on_without_hop_by_hop_headers() {
        let req = Request::get("http://00112233445566aa-8080.relay.example.com/a/b?c=d")
            .header("host", "ignored.example")
            .header("connection", "keep-alive, x-hop")
            .header("x-hop", "1")
            .header("keep-alive", "timeout=5")
            .header("proxy-authorization", "Basic eA==")
            .header("te", "trailers")
            .header("x-app", "kept")
            .body(())
            .unwrap();
        let f = forward_request(req, true, false);
        assert_eq!(f.uri(), "/a/b?c=d", "origin-form");
        assert_eq!(f.headers()["host"], "00112233445566aa-8080.relay.example.com", "the name asked for");
        assert_eq!(f.headers()["x-forwarded-host"], "00112233445566aa-8080.relay.example.com");
        assert_eq!(f.headers()["x-forwarded-proto"], "https");
        assert_eq!(f.headers()["x-app"], "kept");
        for gone in ["connection", "x-hop", "keep-alive", "proxy-authorization", "te", "x-forwarded-for"] {
            assert!(f.headers().get(gone).is_none(), "{gone}");
        }
        // An upgrade keeps what it needs; plain HTTP says nothing of the scheme.
        let req = Request::get("/ws")
            .header("host", "00112233445566aa-8080.relay.example.com")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("x-forwarded-proto", "https")
            .body(())
            .unwrap();
        let f = forward_request(req, false, true);
        assert_eq!(f.headers()["upgrade"], "websocket");
        assert_eq!(f.headers()["connection"], "upgrade");
        assert_eq!(f.headers()["x-forwarded-proto"], "https", "a terminator's passes through");
        // Whether the container closes after its answer.
        let resp = |v: hyper::Version, c: Option<&str>| {
            let mut r = Response::builder().version(v);
            if let Some(c) = c {
                r = r.header("connection", c);
            }
            r.body(()).unwrap()
        };
        assert!(closes(&resp(hyper::Version::HTTP_11, Some("Close"))));
        assert!(!closes(&resp(hyper::Version::HTTP_11, None)));
        assert!(closes(&resp(hyper::Version::HTTP_10, None)));
        assert!(!closes(&resp(hyper::Version::HTTP_10, Some("keep-alive"))));
    }

    #[test]
    fn relay_http_credential_is_taken_out_of_the_request() {
        use base64::Engine;
        let basic = |s: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s));
        let id = "rent-00112233445566aa";
        // Basic naming the rental: taken, and the header is gone.
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, basic(&format!("{id}:gpumt_secret")).parse().unwrap());
        assert_eq!(take_credential(&mut h, id), Presented::Credential("gpumt_secret".into()));
        assert!(h.get(header::AUTHORIZATION).is_none());
        // The application's own Authorization stays when the credential comes in our header.
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer app-token".parse().unwrap());
        h.insert(CREDENTIAL_HEADER, "gpumt_secret".parse().unwrap());
        assert_eq!(take_credential(&mut h, id), Presented::Credential("gpumt_secret".into()));
        assert!(h.get(CREDENTIAL_HEADER).is_none());
        assert_eq!(h.get(header::AUTHORIZATION).unwrap(), "Bearer app-token");
        // Basic naming another rental: a wrong credential, and it is not passed on.
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, basic("rent-ffffffffffffffff:gpumt_secret").parse().unwrap());
        assert_eq!(take_credential(&mut h, id), Presented::OtherRental);
        assert!(h.get(header::AUTHORIZATION).is_none());
        // Neither: nothing, and an application's bearer token is left alone.
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer app-token".parse().unwrap());
        assert_eq!(take_credential(&mut h, id), Presented::Nothing);
        assert!(h.get(header::AUTHORIZATION).is_some());
    }

    /// Issue 43, item 7: with the credential in `X-Gpum-Credential` and again as
    /// `Authorization: Basic <rental:C>`, the `Authorization` header went on to the container,
    /// on the owner's machine. No header that carries the rental's credential goes on, in
    /// whatever form or header it came.
    #[test]
    fn relay_http_no_header_carries_the_credential_on() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let id = "rent-00112233445566aa";
        let c = "gpumt_secret";
        let left = |h: &HeaderMap| -> Vec<String> {
            h.iter().map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v.as_bytes()))).collect()
        };
        for (name, value) in [
            ("authorization", format!("Basic {}", b64(&format!("{id}:{c}")))),
            ("authorization", format!("BASIC {}", b64(&format!("{id}:{c}")))),
            ("authorization", format!("basic  {}", b64(&format!("{id}:{c}")))),
            // The rental's id with another (an old) credential: still the rental's.
            ("authorization", format!("Basic {}", b64(&format!("{id}:gpumt_old")))),
            // Another user name with the rental's credential.
            ("authorization", format!("Basic {}", b64(&format!("me:{c}")))),
            ("authorization", format!("Bearer {c}")),
            ("x-api-key", c.to_string()),
            ("cookie", format!("a=1; token={c}")),
        ] {
            let mut h = HeaderMap::new();
            h.insert(CREDENTIAL_HEADER, c.parse().unwrap());
            h.append(HeaderName::from_static(name), value.parse().unwrap());
            h.insert("x-app", "kept".parse().unwrap());
            assert_eq!(take_credential(&mut h, id), Presented::Credential(c.into()), "{name}: {value}");
            assert_eq!(left(&h), ["x-app: kept"], "{name}: {value}");
        }
        // With the credential as Basic, a copy of it in another header goes too.
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Basic {}", b64(&format!("{id}:{c}"))).parse().unwrap());
        h.insert("x-token", format!("t={c}").parse().unwrap());
        h.insert("x-app", "kept".parse().unwrap());
        assert_eq!(take_credential(&mut h, id), Presented::Credential(c.into()));
        assert_eq!(left(&h), ["x-app: kept"]);
        // The application's own Authorization, without the credential, still passes.
        let mut h = HeaderMap::new();
        h.insert(CREDENTIAL_HEADER, c.parse().unwrap());
        h.insert(header::AUTHORIZATION, format!("Basic {}", b64("app-user:app-pw")).parse().unwrap());
        assert_eq!(take_credential(&mut h, id), Presented::Credential(c.into()));
        assert_eq!(left(&h), [format!("authorization: Basic {}", b64("app-user:app-pw"))]);
    }
}
