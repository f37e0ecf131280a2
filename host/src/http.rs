//! The only place that builds HTTP clients.
//!
//! Clients verify TLS with rustls and the bundled Mozilla roots (webpki-roots), never the
//! system store's surprises, and refuse plain `http://` except to a loopback address, which is
//! what development and tests use. There is no switch to disable certificate checks: a test
//! server's certificate is added as an extra root instead.

use std::net::IpAddr;
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
/// certificate and name checks on (no ALPN: both clients speak HTTP/1.1 only). There is
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
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

type Pooled = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Full<bytes::Bytes>,
>;

/// A lean client for one request made again and again: the agent's heartbeat, a POST of JSON
/// every 10 s. It is hyper's pooled HTTP/1.1 client (the one reqwest is built on) over rustls
/// with [`tls_config`], without reqwest's layers: reqwest parses the URL twice per request for
/// its redirect layer, which was a quarter of the heartbeat's HTTP instructions. No redirects
/// are followed (reqwest's clients here follow none either), and no proxies: see
/// [`proxy_in_env`]. The connection is kept between requests and opened again when the server
/// closes it.
#[derive(Clone)]
pub struct PostClient {
    client: Pooled,
    uri: http::Uri,
    user_agent: http::HeaderValue,
    timeout: Duration,
}

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
        let parsed = check_url(url)?;
        let uri: http::Uri = parsed.as_str().parse().map_err(|_| HttpError::BadUrl(url.to_string()))?;
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(opts.connect_timeout);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(&opts.extra_roots_pem)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        let ua = opts.user_agent.clone().unwrap_or_else(|| format!("gpum/{}", env!("CARGO_PKG_VERSION")));
        Ok(PostClient {
            client,
            uri,
            user_agent: http::HeaderValue::try_from(ua).map_err(|_| HttpError::BadUrl(url.to_string()))?,
            timeout: opts.timeout.unwrap_or(Duration::from_secs(30)),
        })
    }

    /// POSTs `body` as JSON, with `bearer` as the `Authorization` (marked sensitive, so hyper
    /// never prints it), and reads an answer of at most `max` bytes, all within the timeout.
    pub async fn post_json(
        &self,
        body: Vec<u8>,
        bearer: Option<&str>,
        max: usize,
    ) -> Result<PostAnswer, PostError> {
        let mut req = http::Request::new(http_body_util::Full::new(bytes::Bytes::from(body)));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.uri.clone();
        let h = req.headers_mut();
        h.insert(http::header::USER_AGENT, self.user_agent.clone());
        h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        if let Some(t) = bearer {
            let mut v = http::HeaderValue::try_from(format!("Bearer {t}"))
                .map_err(|_| PostError::Transport("the token is not a valid header value".into()))?;
            v.set_sensitive(true);
            h.insert(http::header::AUTHORIZATION, v);
        }
        let call = async {
            let resp = self.client.request(req).await.map_err(|e| PostError::Transport(chain(&e)))?;
            let (parts, body) = resp.into_parts();
            let len =
                parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
            if len.is_some_and(|n: u64| n > max as u64) {
                return Err(PostError::TooLarge(max));
            }
            let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, max))
                .await
                .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
                    Ok(_) => PostError::TooLarge(max),
                    Err(e) => PostError::Transport(chain(e.as_ref())),
                })?
                .to_bytes();
            Ok(PostAnswer { status: parts.status.as_u16(), headers: parts.headers, body: body.to_vec() })
        };
        tokio::time::timeout(self.timeout, call).await.map_err(|_| PostError::Timeout)?
    }
}

/// An error and its causes, one line: the top line alone rarely says which check failed.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

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
