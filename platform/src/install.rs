//! The bootstrap script served at `/install.sh`: `assets/install.sh` with the platform URL
//! filled in. The URL is fixed when the server starts (`serve --public-url`, or the loopback
//! address it listens on), never taken from a request, and checked to hold only characters that
//! are safe inside the script's single quotes.
//!
//! Every node downloads its installer from that URL, so [`check_public_url`] accepts plain
//! `http://` only for a loopback host: anywhere else the script must use HTTPS.

const TEMPLATE: &str = include_str!("../assets/install.sh");
const PLACEHOLDER: &str = "@GPUM_PLATFORM_URL@";

/// Whether `url` may be written into the script: http(s), and only URL characters that need
/// no quoting in sh.
pub fn url_is_safe(url: &str) -> bool {
    (url.starts_with("https://") || url.starts_with("http://"))
        && url.len() <= 512
        && url.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~:/[]%@+,=".contains(&b))
}

/// Why `url` cannot be the platform's public URL, if it cannot: it must be [`url_is_safe`],
/// have a host and no user part, and be `https://`, or `http://` to a loopback host
/// (`localhost`, `127.0.0.0/8`, `[::1]`).
pub fn check_public_url(url: &str) -> Result<(), String> {
    let url = url.trim_end_matches('/');
    if !url_is_safe(url) {
        return Err(format!("{url:?} is not an http(s) URL of plain characters (no spaces or quotes)"));
    }
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{url:?} has no host, or has a user part"));
    }
    if scheme == "https" || (scheme == "http" && is_loopback_host(authority)) {
        return Ok(());
    }
    Err(format!(
        "{url:?} is plain http to a host that is not loopback: every node would download the installer \
         unencrypted. Use https:// (a TLS terminator in front is fine)"
    ))
}

/// The host of a public URL (`https://host[:port]/…`), without brackets or port.
pub fn public_url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    host_of(rest.split(['/', '?', '#']).next().unwrap_or(""))
}

/// The host of `authority` (`host[:port]`, `[v6]:port`).
fn host_of(authority: &str) -> &str {
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    }
}

/// Whether the host of `authority` (`host[:port]`) is loopback.
fn is_loopback_host(authority: &str) -> bool {
    let host = host_of(authority);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The script for a platform at `url` (without a trailing slash). Panics on an unsafe URL,
/// which callers rule out with [`url_is_safe`].
pub fn render(url: &str) -> String {
    let url = url.trim_end_matches('/');
    assert!(url_is_safe(url), "unsafe platform URL");
    TEMPLATE.replace(PLACEHOLDER, url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_in_the_url() {
        let s = render("https://gpum.example:8443/");
        assert!(s.contains("GPUM_PLATFORM_URL='https://gpum.example:8443'\n"));
        assert!(!s.contains(PLACEHOLDER));
        assert!(s.starts_with("#!/bin/sh\n"));
    }

    #[test]
    fn public_url_is_https_or_loopback_http() {
        for ok in [
            "https://gpum.example",
            "https://gpum.example:8443/",
            "https://203.0.113.7",
            "http://127.0.0.1:8080",
            "http://127.9.9.9",
            "http://localhost:1",
            "http://[::1]:80",
        ] {
            assert_eq!(check_public_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://gpum.example",
            "http://10.0.0.1:80",
            "http://[2001:db8::1]:80",
            "http://127.0.0.1.evil.example",
            "http://localhost.evil.example",
            "http://user@127.0.0.1",
            "https://",
            "ftp://gpum.example",
            "gpum.example",
            "https://x/'; id",
        ] {
            assert!(check_public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_shell_metacharacters() {
        for bad in ["https://x/'; rm -rf /; '", "https://x/$(id)", "ftp://x", "https://x y", "https://x/`id`"]
        {
            assert!(!url_is_safe(bad), "{bad}");
        }
    }
}
