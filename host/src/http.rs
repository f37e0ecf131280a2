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
        .use_rustls_tls()
        .https_only(false) // http is allowed only to loopback, which check_url enforced
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(opts.user_agent.clone().unwrap_or_else(|| format!("gpum/{}", env!("CARGO_PKG_VERSION"))));
    for pem in &opts.extra_roots_pem {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem)?);
    }
    if let Some(t) = opts.timeout {
        b = b.timeout(t);
    }
    if let Some(t) = opts.connect_timeout {
        b = b.connect_timeout(t);
    }
    Ok(b.build()?)
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
