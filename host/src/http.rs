//! The only place that builds HTTP clients.
//!
//! Clients verify TLS with rustls and the bundled Mozilla roots (webpki-roots), never the
//! system store's surprises, and refuse plain `http://` except to a loopback address, which is
//! what development and tests use. There is no switch to disable certificate checks: a test
//! server's certificate is added as an extra root instead.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::HttpError;

/// How a client may talk to its server.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Extra trusted root certificates, PEM (a test platform's self-signed CA).
    pub extra_roots_pem: Vec<Vec<u8>>,
    /// Total request timeout.
    pub timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub user_agent: Option<String>,
}

/// Checks that `url` is https, or http to a loopback host. Returns the parsed URL.
pub fn check_url(url: &str) -> Result<url::Url, HttpError> {
    let u = url::Url::parse(url).map_err(|_| HttpError::BadUrl(url.to_string()))?;
    match u.scheme() {
        "https" => Ok(u),
        "http" => {
            let loopback = match u.host() {
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
                Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
                None => false,
            };
            if loopback { Ok(u) } else { Err(HttpError::InsecureNonLoopback(url.to_string())) }
        }
        _ => Err(HttpError::Scheme(url.to_string())),
    }
}

/// An async client for talking to `base_url`. Refuses insecure URLs up front.
pub fn client_for(base_url: &str, opts: &ClientOptions) -> Result<reqwest::Client, HttpError> {
    check_url(base_url)?;
    let mut b = reqwest::Client::builder()
        .use_preconfigured_tls(tls_config(&opts.extra_roots_pem)?)
        .https_only(false) // http is allowed only to loopback, which check_url enforced
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(opts.user_agent.clone().unwrap_or_else(|| format!("gpum/{}", env!("CARGO_PKG_VERSION"))));
    if let Some(t) = opts.timeout {
        b = b.timeout(t);
    }
    if let Some(t) = opts.connect_timeout {
        b = b.connect_timeout(t);
    }
    Ok(b.build()?)
}

/// Whether the process has a proxy variable that reqwest would follow (`HTTPS_PROXY`,
/// `HTTP_PROXY`, `ALL_PROXY`, either case, not empty). The installer writes them into the agent's
/// unit when it ran with them; then the agent's heartbeat goes through reqwest, which speaks to
/// proxies, and not through [`PostClient`], which does not.
pub fn proxy_in_env() -> bool {
    ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

/// The TLS settings every client here has: rustls (ring), TLS 1.2 and 1.3, the bundled Mozilla
/// roots (webpki-roots) and the extra roots given (every certificate of each PEM), SNI,
/// certificate and name checks on. No ALPN: reqwest's client offers none, and [`PostClient`]
/// adds `http/1.1` (both speak HTTP/1.1 only). There is
/// no way to turn a check off. A PEM without a certificate, or with one rustls cannot take, is
/// an error, not an empty addition.
pub fn tls_config(extra_roots_pem: &[Vec<u8>]) -> Result<rustls::ClientConfig, HttpError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    for pem in extra_roots_pem {
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| HttpError::Tls(format!("extra root certificate: {e}")))?;
            roots.add(cert).map_err(|e| HttpError::Tls(format!("extra root certificate: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(HttpError::Tls("extra root certificate: no certificate in the PEM".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The sending half of one HTTP/1.1 connection.
type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// A lean client for one request made again and again: the agent's heartbeat, a POST of JSON
/// every 10 s. One HTTP/1.1 connection (hyper's `client::conn`, over rustls with [`tls_config`]),
/// kept between requests and opened again when the server closes it, without reqwest's layers
/// or a pool: reqwest parses the URL twice per request for its redirect layer, and its pool
/// hashes and locks for a connection there is only one of. Together they were half of the
/// heartbeat's HTTP instructions. No redirects are followed (reqwest's clients here follow none
/// either), and no proxies: see [`proxy_in_env`].
#[derive(Clone)]
pub struct PostClient {
    target: Arc<Target>,
    /// The request target in origin form (`/v1/heartbeat`).
    path: http::Uri,
    host_header: http::HeaderValue,
    user_agent: http::HeaderValue,
    timeout: Duration,
    connect_timeout: Option<Duration>,
    /// The connection between requests: taken while a request uses it, put back after a whole
    /// answer was read.
    idle: Arc<Mutex<Option<Sender>>>,
    /// The last bearer token and its `Authorization` value (marked sensitive): the same token
    /// every heartbeat, so the value is made once, not formatted and checked every time.
    auth: Arc<Mutex<Option<(String, http::HeaderValue)>>>,
}

/// Where a [`PostClient`] connects.
struct Target {
    host: url::Host<String>,
    port: u16,
    /// `host:port` as a `CONNECT` names it (`[v6]:port` for an IPv6 address).
    authority: String,
    /// For https: the connector, and the name the server's certificate must carry.
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    /// The HTTP proxy to go through with `CONNECT`, when [`PostClient::through_env_proxy`]
    /// found one.
    proxy: Option<Proxy>,
}

/// An HTTP proxy: where it listens, and its `Proxy-Authorization` (from the credentials in
/// its URL, marked sensitive; never printed: only `host:port` names the proxy in errors and
/// logs).
struct Proxy {
    host: String,
    port: u16,
    auth: Option<http::HeaderValue>,
}

/// The largest answer head a proxy may send to `CONNECT`.
const MAX_PROXY_HEAD: usize = 16 * 1024;

/// An answer read whole.
#[derive(Debug)]
pub struct PostAnswer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

/// Why a [`PostClient`] request has no answer.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("no answer within the timeout")]
    Timeout,
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
    /// Could not connect, TLS refused, or the connection broke; the whole chain of causes.
    #[error("{0}")]
    Transport(String),
}

impl PostClient {
    /// A client for POSTs to `url` (https, or http to a loopback address: [`check_url`]).
    pub fn new(url: &str, opts: &ClientOptions) -> Result<PostClient, HttpError> {
        use rustls::pki_types::ServerName;
        let bad = || HttpError::BadUrl(url.to_string());
        let parsed = check_url(url)?;
        let host = parsed.host().ok_or_else(bad)?.to_owned();
        let port = parsed.port_or_known_default().ok_or_else(bad)?;
        let tls = match parsed.scheme() {
            "https" => {
                let name = match &host {
                    url::Host::Domain(d) => ServerName::try_from(d.clone()).map_err(|_| bad())?,
                    url::Host::Ipv4(ip) => ServerName::IpAddress(IpAddr::V4(*ip).into()),
                    url::Host::Ipv6(ip) => ServerName::IpAddress(IpAddr::V6(*ip).into()),
                };
                let mut config = tls_config(&opts.extra_roots_pem)?;
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
            }
            _ => None,
        };
        let mut path = parsed.path().to_string();
        if let Some(q) = parsed.query() {
            path.push('?');
            path.push_str(q);
        }
        let host_str = parsed.host_str().ok_or_else(bad)?;
        let host_header = match parsed.port() {
            Some(p) => format!("{host_str}:{p}"),
            None => host_str.to_string(),
        };
        let ua = opts.user_agent.clone().unwrap_or_else(|| format!("gpum/{}", env!("CARGO_PKG_VERSION")));
        let authority = match &host {
            url::Host::Ipv6(ip) => format!("[{ip}]:{port}"),
            h => format!("{h}:{port}"),
        };
        Ok(PostClient {
            target: Arc::new(Target { host, port, authority, tls, proxy: None }),
            path: http::Uri::try_from(path).map_err(|_| bad())?,
            host_header: http::HeaderValue::try_from(host_header).map_err(|_| bad())?,
            user_agent: http::HeaderValue::try_from(ua).map_err(|_| bad())?,
            timeout: opts.timeout.unwrap_or(Duration::from_secs(30)),
            connect_timeout: opts.connect_timeout,
            idle: Arc::default(),
            auth: Arc::default(),
        })
    }

    /// The same client, going through the HTTP proxy the environment names for its URL, by the
    /// rules reqwest follows (hyper-util's `Matcher::from_env`: `HTTPS_PROXY` for an https URL,
    /// `HTTP_PROXY` for http, `ALL_PROXY` for both, either case, and `NO_PROXY`), so that it
    /// takes the path the agent's other requests take. Through it: `CONNECT host:port`, then TLS
    /// to the server inside. Only `http://` proxies are spoken to; another scheme (`socks5://`,
    /// `https://`) is an error, never a way around the proxy.
    pub fn through_env_proxy(self) -> Result<PostClient, HttpError> {
        self.through(&hyper_util::client::proxy::matcher::Matcher::from_env())
    }

    /// The same client, going through the proxy at `url` (`http://[user:password@]host:port`)
    /// whatever the environment says, as [`PostClient::through_env_proxy`] would.
    pub fn through_proxy(self, url: &str) -> Result<PostClient, HttpError> {
        self.through(&hyper_util::client::proxy::matcher::Matcher::builder().all(url).build())
    }

    fn through(self, matcher: &hyper_util::client::proxy::matcher::Matcher) -> Result<PostClient, HttpError> {
        let uri: http::Uri = format!("{}://{}{}", self.scheme(), self.target.authority, self.path)
            .parse()
            .map_err(|_| HttpError::BadUrl(self.target.authority.clone()))?;
        let Some(found) = matcher.intercept(&uri) else { return Ok(self) };
        let p = found.uri();
        let named = || format!("{}:{}", p.host().unwrap_or(""), p.port_u16().unwrap_or(0));
        if p.scheme_str() != Some("http") {
            return Err(HttpError::Proxy(format!(
                "the proxy {} is {}://; only http:// proxies are supported here",
                named(),
                p.scheme_str().unwrap_or("")
            )));
        }
        let host = p
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| HttpError::Proxy("the proxy URL names no host".into()))?;
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let auth = found.basic_auth().cloned().map(|mut v| {
            v.set_sensitive(true);
            v
        });
        let proxy = Proxy { host, port: p.port_u16().unwrap_or(80), auth };
        let t = &self.target;
        let target = Target {
            host: t.host.clone(),
            port: t.port,
            authority: t.authority.clone(),
            tls: t.tls.clone(),
            proxy: Some(proxy),
        };
        Ok(PostClient { target: Arc::new(target), ..self })
    }

    /// Whether this client goes through a proxy ([`PostClient::through_env_proxy`]), as
    /// `host:port` (never its credentials).
    pub fn proxy(&self) -> Option<String> {
        self.target.proxy.as_ref().map(|p| format!("{}:{}", p.host, p.port))
    }

    fn scheme(&self) -> &'static str {
        if self.target.tls.is_some() { "https" } else { "http" }
    }

    /// POSTs `body` as JSON, with `bearer` as the `Authorization` (marked sensitive, so hyper
    /// never prints it), and reads an answer of at most `max` bytes, all within the timeout.
    ///
    /// A request that the kept connection did not take (the server closed it while idle, or as
    /// the request went out, before a byte of it was written) is sent once more on a new
    /// connection, as hyper's pooled client does; one that was written is never sent twice.
    pub async fn post_json(
        &self,
        body: Vec<u8>,
        bearer: Option<&str>,
        max: usize,
    ) -> Result<PostAnswer, PostError> {
        let body = bytes::Bytes::from(body);
        let auth = match bearer {
            Some(t) => Some(self.bearer(t)?),
            None => None,
        };
        let call = async {
            let mut kept = self.idle.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(s) = kept.as_mut()
                && s.ready().await.is_err()
            {
                kept = None;
            }
            let reused = kept.is_some();
            tracing::trace!(reused, bytes = body.len(), "POST {}", self.path);
            let mut sender = match kept {
                Some(s) => s,
                None => self.connect().await?,
            };
            let mut res = sender.send_request(self.request(body.clone(), auth.clone())).await;
            if reused && matches!(&res, Err(e) if e.is_canceled()) {
                tracing::trace!(
                    "the kept connection closed before the request went out; once more on a new one"
                );
                sender = self.connect().await?;
                res = sender.send_request(self.request(body, auth)).await;
            }
            let (parts, resp_body) = res.map_err(|e| PostError::Transport(error_chain(&e)))?.into_parts();
            let len =
                parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
            if len.is_some_and(|n: u64| n > max as u64) {
                return Err(PostError::TooLarge(max));
            }
            let resp_body = collect_at_most(resp_body, max).await?;
            // The whole answer is in: the connection can carry the next request, unless the
            // server is closing it.
            let keep = !sender.is_closed();
            tracing::trace!(status = parts.status.as_u16(), bytes = resp_body.len(), keep, "answer read");
            if keep {
                *self.idle.lock().unwrap_or_else(PoisonError::into_inner) = Some(sender);
            }
            Ok(PostAnswer { status: parts.status.as_u16(), headers: parts.headers, body: resp_body.to_vec() })
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| PostError::Timeout)?
    }

    /// `Authorization: Bearer <t>`, marked sensitive; made again only when the token changed.
    fn bearer(&self, t: &str) -> Result<http::HeaderValue, PostError> {
        let mut last = self.auth.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((token, v)) = last.as_ref()
            && token == t
        {
            return Ok(v.clone());
        }
        let mut v = http::HeaderValue::try_from(format!("Bearer {t}"))
            .map_err(|_| PostError::Transport("the token is not a valid header value".into()))?;
        v.set_sensitive(true);
        *last = Some((t.to_string(), v.clone()));
        Ok(v)
    }

    fn request(
        &self,
        body: bytes::Bytes,
        auth: Option<http::HeaderValue>,
    ) -> http::Request<http_body_util::Full<bytes::Bytes>> {
        let mut req = http::Request::new(http_body_util::Full::new(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.path.clone();
        let h = req.headers_mut();
        h.insert(http::header::HOST, self.host_header.clone());
        h.insert(http::header::USER_AGENT, self.user_agent.clone());
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        if let Some(v) = auth {
            h.insert(http::header::AUTHORIZATION, v);
        }
        req
    }

    /// `GET` with `Connection: Upgrade` and `Upgrade: <protocol>` (the agent's tunnel, issue 34),
    /// on a connection of its own, never the kept one: on `101` the connection is handed over
    /// whole ([`Upgrade::Switched`]); any other answer is read (at most `max` bytes) and given
    /// back ([`Upgrade::Refused`]). Connecting and the answer's head are bounded by the timeout.
    pub async fn upgrade(&self, protocol: &str, bearer: &str, max: usize) -> Result<Upgrade, PostError> {
        let mut auth = http::HeaderValue::try_from(format!("Bearer {bearer}"))
            .map_err(|_| PostError::Transport("the token is not a valid header value".into()))?;
        auth.set_sensitive(true);
        let proto = http::HeaderValue::try_from(protocol)
            .map_err(|_| PostError::Transport("the protocol is not a valid header value".into()))?;
        let call = async {
            let mut sender = self.connect_upgradable().await?;
            let mut req = http::Request::new(http_body_util::Full::new(bytes::Bytes::new()));
            *req.uri_mut() = self.path.clone();
            let h = req.headers_mut();
            h.insert(http::header::HOST, self.host_header.clone());
            h.insert(http::header::USER_AGENT, self.user_agent.clone());
            h.insert(http::header::CONNECTION, http::HeaderValue::from_static("upgrade"));
            h.insert(http::header::UPGRADE, proto);
            h.insert(http::header::AUTHORIZATION, auth);
            let res = sender.send_request(req).await.map_err(|e| PostError::Transport(error_chain(&e)))?;
            if res.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                let io = hyper::upgrade::on(res).await.map_err(|e| PostError::Transport(error_chain(&e)))?;
                return Ok(Upgrade::Switched(hyper_util::rt::TokioIo::new(io)));
            }
            let (parts, body) = res.into_parts();
            let body = collect_at_most(body, max).await?;
            Ok(Upgrade::Refused(PostAnswer {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body: body.to_vec(),
            }))
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| PostError::Timeout)?
    }

    /// A new connection: each address the name resolves to in turn (each within the connect
    /// timeout), TCP_NODELAY, TLS when https, then HTTP/1.1. Its connection task runs until the
    /// server closes it or the client drops it.
    async fn connect(&self) -> Result<Sender, PostError> {
        self.connect_with(false).await
    }

    /// A new connection whose task allows an upgrade (see [`PostClient::upgrade`]).
    async fn connect_upgradable(&self) -> Result<Sender, PostError> {
        self.connect_with(true).await
    }

    async fn connect_with(&self, upgrades: bool) -> Result<Sender, PostError> {
        let t = &self.target;
        let failed =
            |e: &dyn std::fmt::Display| PostError::Transport(format!("error trying to connect: {e}"));
        let addrs: Vec<std::net::SocketAddr> = match (&t.proxy, &t.host) {
            (Some(p), _) => {
                tokio::net::lookup_host((p.host.as_str(), p.port)).await.map_err(|e| failed(&e))?.collect()
            }
            (None, url::Host::Domain(d)) => {
                tokio::net::lookup_host((d.as_str(), t.port)).await.map_err(|e| failed(&e))?.collect()
            }
            (None, url::Host::Ipv4(ip)) => vec![(*ip, t.port).into()],
            (None, url::Host::Ipv6(ip)) => vec![(*ip, t.port).into()],
        };
        let mut last: Option<std::io::Error> = None;
        let mut tcp = None;
        for a in addrs {
            let attempt = tokio::net::TcpStream::connect(a);
            let r = match self.connect_timeout {
                Some(d) => tokio::time::timeout(d, attempt).await.unwrap_or_else(|_| {
                    Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))
                }),
                None => attempt.await,
            };
            match r {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        tracing::trace!(host = %t.host, port = t.port, connected = tcp.is_some(), "connecting");
        let Some(tcp) = tcp else {
            return Err(match last {
                Some(e) => failed(&e),
                None => failed(&"the name has no address"),
            });
        };
        let _ = tcp.set_nodelay(true);
        let mut tcp = tcp;
        if let Some(p) = &t.proxy {
            connect_through(&mut tcp, p, &t.authority).await?;
        }
        match &t.tls {
            Some((connector, name)) => {
                let s = connector.connect(name.clone(), tcp).await.map_err(|e| failed(&error_chain(&e)))?;
                tracing::trace!(version = ?s.get_ref().1.protocol_version(), "TLS handshake done");
                handshake(s, upgrades).await
            }
            None => handshake(tcp, upgrades).await,
        }
    }
}

/// Asks the proxy on `tcp` for a tunnel to `authority` (`CONNECT`, HTTP/1.1) and reads its
/// answer's head, byte by byte so that nothing of the server's is read; `Ok` only on a 2xx.
async fn connect_through(
    tcp: &mut tokio::net::TcpStream,
    proxy: &Proxy,
    authority: &str,
) -> Result<(), PostError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let named = format!("{}:{}", proxy.host, proxy.port);
    let broke = |e: std::io::Error| PostError::Transport(format!("the proxy {named}: {e}"));
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    if let Some(auth) = &proxy.auth {
        head.extend_from_slice(b"Proxy-Authorization: ");
        head.extend_from_slice(auth.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    tcp.write_all(&head).await.map_err(broke)?;
    let mut answer = Vec::new();
    let mut b = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut b).await.map_err(broke)? == 0 {
            return Err(PostError::Transport(format!(
                "the proxy {named} closed the connection before answering CONNECT"
            )));
        }
        answer.push(b[0]);
        if answer.len() > MAX_PROXY_HEAD {
            return Err(PostError::Transport(format!(
                "the proxy {named} sent a head longer than {MAX_PROXY_HEAD} bytes"
            )));
        }
    }
    let status = proxy_status(&answer);
    tracing::trace!(proxy = %named, status = ?status, "CONNECT answered");
    match status {
        Some((code, _)) if (200..300).contains(&code) => Ok(()),
        Some((code, reason)) => Err(PostError::Transport(format!(
            "the proxy {named} refused CONNECT {authority}: {code} {reason}"
        ))),
        None => Err(PostError::Transport(format!("the proxy {named} did not answer CONNECT with HTTP"))),
    }
}

/// The status code and reason of an answer's head (`HTTP/1.x 200 Connection established`).
fn proxy_status(head: &[u8]) -> Option<(u16, String)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().splitn(3, ' ');
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?.parse().ok()?;
    let reason: String = parts.next().unwrap_or("").chars().filter(|c| !c.is_control()).take(100).collect();
    Some((code, reason))
}

/// An upgraded connection, as tokio's reader and writer.
pub type UpgradedIo = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

/// What [`PostClient::upgrade`] got.
pub enum Upgrade {
    /// `101`: the connection, now the new protocol's.
    Switched(UpgradedIo),
    /// Any other answer, read whole.
    Refused(PostAnswer),
}

/// HTTP/1.1 over `io`, its connection task spawned (allowing an upgrade when `upgrades`).
async fn handshake<T>(io: T, upgrades: bool) -> Result<Sender, PostError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| PostError::Transport(error_chain(&e)))?;
    tokio::spawn(async move {
        // Ends when the server closes the connection or the last sender is dropped; either way
        // the next request opens a new one. An upgraded connection's task ends when it hands
        // the connection over.
        let r = if upgrades { conn.with_upgrades().await } else { conn.await };
        tracing::trace!(error = r.err().map(|e| error_chain(&e)), "connection closed");
    });
    Ok(sender)
}

/// An error and its causes on one line, each cause once (a cause whose text is already there
/// is left out): the top line alone rarely says which check failed, such as which certificate
/// problem a TLS failure was.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// An answer's body, read whole but at most `max` bytes: more is [`PostError::TooLarge`].
async fn collect_at_most(body: hyper::body::Incoming, max: usize) -> Result<bytes::Bytes, PostError> {
    Ok(http_body_util::BodyExt::collect(http_body_util::Limited::new(body, max))
        .await
        .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
            Ok(_) => PostError::TooLarge(max),
            Err(e) => PostError::Transport(error_chain(e.as_ref())),
        })?
        .to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_names_each_cause_once() {
        #[derive(Debug)]
        struct Top(std::io::Error);
        impl std::fmt::Display for Top {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error sending request")
            }
        }
        impl std::error::Error for Top {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io =
            std::io::Error::new(std::io::ErrorKind::InvalidData, "invalid peer certificate: UnknownIssuer");
        assert_eq!(error_chain(&Top(io)), "error sending request: invalid peer certificate: UnknownIssuer");
        // A cause whose text the chain already holds is not repeated.
        let io = std::io::Error::other("error sending request");
        assert_eq!(error_chain(&Top(io)), "error sending request");
    }

    /// A loopback HTTP/1.1 server for [`PostClient`]'s tests. Each connection it accepts follows
    /// the next plan in turn, request by request: `Some(answer)` answers, `None` closes the
    /// connection after reading the request, without an answer. A connection closes after its
    /// plan's last step; one more within 300 ms after the plans is noted as such. Returns the
    /// port, a receiver told each time a connection was closed, and the bodies each connection
    /// received.
    fn scripted_server(
        plans: Vec<Vec<Option<&'static str>>>,
    ) -> (u16, std::sync::mpsc::Receiver<()>, std::thread::JoinHandle<Vec<Vec<String>>>) {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (closed_tx, closed) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for plan in plans {
                let (s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut bodies = Vec::new();
                for step in plan {
                    let mut len = 0;
                    loop {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0u8; len];
                    r.read_exact(&mut body).unwrap();
                    bodies.push(String::from_utf8(body).unwrap());
                    let Some(answer) = step else { break };
                    let mut w = &s;
                    write!(w, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}", answer.len()).unwrap();
                }
                // The connection closes here, with nothing more sent.
                drop((r, s));
                let _ = closed_tx.send(());
                seen.push(bodies);
            }
            // Any connection beyond the plans is a request sent again: noted, then closed.
            l.set_nonblocking(true).unwrap();
            let until = std::time::Instant::now() + Duration::from_millis(300);
            while std::time::Instant::now() < until {
                if l.accept().is_ok() {
                    seen.push(vec!["another connection".to_string()]);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        });
        (port, closed, t)
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// The server closes the kept connection between two requests (while this runtime's only
    /// thread is blocked, so the client hears of it only when it next looks): the next request
    /// goes once, on a new connection. (`ready()` sees the close before the request is handed
    /// over, so this does not reach the `Canceled` retry, a race no test here can force.)
    #[test]
    fn a_kept_connection_the_server_closed_is_not_used_again() {
        let (port, closed, server) = scripted_server(vec![vec![Some("one")], vec![Some("two")]]);
        let client =
            PostClient::new(&format!("http://127.0.0.1:{port}/beat"), &ClientOptions::default()).unwrap();
        let rt = current_thread();
        let a = rt.block_on(client.post_json(b"first".to_vec(), None, 1024)).unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"one"[..]));
        // The server closes the first connection; nothing on this thread runs meanwhile.
        closed.recv().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let b = rt.block_on(client.post_json(b"second".to_vec(), None, 1024)).unwrap();
        assert_eq!((b.status, b.body.as_slice()), (200, &b"two"[..]));
        assert_eq!(server.join().unwrap(), vec![vec!["first".to_string()], vec!["second".to_string()]]);
    }

    /// A request that went out on the kept connection and got no answer is an error, never sent
    /// a second time: the server saw it once, and no other connection came.
    #[test]
    fn a_request_that_was_written_is_never_sent_twice() {
        let (port, _closed, server) = scripted_server(vec![vec![Some("one"), None]]);
        let client =
            PostClient::new(&format!("http://127.0.0.1:{port}/beat"), &ClientOptions::default()).unwrap();
        let rt = current_thread();
        assert_eq!(rt.block_on(client.post_json(b"first".to_vec(), None, 1024)).unwrap().status, 200);
        let e = rt.block_on(client.post_json(b"second".to_vec(), None, 1024)).unwrap_err();
        assert!(matches!(e, PostError::Transport(_)), "{e:?}");
        assert_eq!(server.join().unwrap(), vec![vec!["first".to_string(), "second".to_string()]]);
    }

    /// Through a proxy (a scripted one on loopback): `CONNECT` with the proxy's Basic
    /// credentials, then the request inside once it answers 200; a refusal is an error that
    /// names the proxy and its answer, never the credentials.
    #[test]
    fn the_tunnel_goes_through_a_proxy_with_connect_and_a_refusal_is_named() {
        use std::io::{BufRead, BufReader, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let mut heads = Vec::new();
            for answer in ["HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "HTTP/1.1 200 OK\r\n\r\n"] {
                let (s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut head = String::new();
                while !head.ends_with("\r\n\r\n") {
                    if r.read_line(&mut head).unwrap() == 0 {
                        break;
                    }
                }
                (&s).write_all(answer.as_bytes()).unwrap();
                if answer.contains("200") {
                    // Inside the tunnel: the server's side, which switches.
                    let mut inner = String::new();
                    while !inner.ends_with("\r\n\r\n") {
                        if r.read_line(&mut inner).unwrap() == 0 {
                            break;
                        }
                    }
                    (&s).write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: t\r\n\r\n",
                    )
                    .unwrap();
                    heads.push(inner);
                }
                heads.push(head);
            }
            heads
        });
        let client = PostClient::new("http://127.0.0.1:9/api/tunnel", &ClientOptions::default())
            .unwrap()
            .through_proxy(&format!("http://owner:p4ss-w0rd@127.0.0.1:{port}"))
            .unwrap();
        assert_eq!(client.proxy(), Some(format!("127.0.0.1:{port}")));
        let rt = current_thread();
        let e = match rt.block_on(client.upgrade("t", "tok", 1024)) {
            Err(PostError::Transport(e)) => e,
            Err(e) => panic!("{e:?}"),
            Ok(_) => panic!("a refused CONNECT went on"),
        };
        assert!(
            e.contains(&format!(
                "the proxy 127.0.0.1:{port} refused CONNECT 127.0.0.1:9: 407 Proxy Authentication Required"
            )),
            "{e}"
        );
        assert!(!e.contains("p4ss-w0rd") && !e.contains("owner"), "{e}");
        assert!(matches!(rt.block_on(client.upgrade("t", "tok", 1024)), Ok(Upgrade::Switched(_))));
        let heads = server.join().unwrap();
        let auth = "Proxy-Authorization: Basic b3duZXI6cDRzcy13MHJk\r\n";
        assert!(
            heads[0].starts_with("CONNECT 127.0.0.1:9 HTTP/1.1\r\n") && heads[0].contains(auth),
            "{}",
            heads[0]
        );
        assert!(heads[1].starts_with("GET /api/tunnel HTTP/1.1\r\n"), "the request inside: {}", heads[1]);
        assert!(!heads[1].contains("Proxy-Authorization"), "the proxy's credentials stay with the proxy");
    }

    #[test]
    fn a_proxys_answer_to_connect_is_read_from_its_status_line() {
        assert_eq!(
            proxy_status(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            Some((200, "Connection established".into()))
        );
        assert_eq!(
            proxy_status(b"HTTP/1.0 403 Access violation\r\nX: y\r\n\r\n"),
            Some((403, "Access violation".into()))
        );
        assert_eq!(proxy_status(b"HTTP/1.1 407\r\n\r\n"), Some((407, String::new())));
        assert_eq!(proxy_status(b"SSH-2.0-OpenSSH\r\n\r\n"), None);
        assert_eq!(proxy_status(b"HTTP/1.1 abc ok\r\n\r\n"), None);
    }

    #[test]
    fn https_anywhere_http_only_loopback() {
        assert!(check_url("https://example.com/").is_ok());
        assert!(check_url("http://127.0.0.1:8080/").is_ok());
        assert!(check_url("http://[::1]:8080/").is_ok());
        assert!(check_url("http://localhost:1/").is_ok());
        assert!(matches!(check_url("http://10.0.0.1/"), Err(HttpError::InsecureNonLoopback(_))));
        assert!(matches!(check_url("http://example.com/"), Err(HttpError::InsecureNonLoopback(_))));
        assert!(matches!(check_url("ftp://example.com/"), Err(HttpError::Scheme(_))));
        assert!(matches!(check_url("not a url"), Err(HttpError::BadUrl(_))));
    }
}
