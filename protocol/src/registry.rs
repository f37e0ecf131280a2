//! Image registries: which entries the operator's rental list and the agent's
//! `probe_registries` accept, and the default list both start from. One rule, so the platform
//! never accepts a registry that the agent refuses, or the other way round.

/// The registries images come from when no list is set.
pub const DEFAULT_REGISTRIES: [&str; 3] = ["docker.io", "nvcr.io", "ghcr.io"];

/// Whether `s` is a registry: `host` or `host:port` (DNS labels or IPv4 digits, a port 1–65535);
/// no scheme, no path, no IPv6 literal.
pub fn valid_registry(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok_and(|n| n > 0)
    });
    host_ok && port_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_entries() {
        for ok in ["docker.io", "nvcr.io", "registry.lan:5000", "localhost", "127.0.0.1:5000", "r.io:65535"] {
            assert!(valid_registry(ok), "{ok}");
        }
        for bad in [
            "",
            "https://docker.io",
            "docker.io/",
            "a b",
            "x:",
            "x:abc",
            "x:0",
            "x:65536",
            "x:+80",
            "-x.io",
            "[::1]:5000",
        ] {
            assert!(!valid_registry(bad), "{bad}");
        }
        assert!(DEFAULT_REGISTRIES.iter().all(|r| valid_registry(r)));
    }
}
