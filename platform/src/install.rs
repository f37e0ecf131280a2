//! The bootstrap script served at `/install.sh`: `assets/install.sh` with the platform URL
//! filled in. The URL is checked to hold only characters that are safe inside the script's
//! single quotes, so no request can inject shell code.

const TEMPLATE: &str = include_str!("../assets/install.sh");
const PLACEHOLDER: &str = "@GPUM_PLATFORM_URL@";

/// Whether `url` may be written into the script: http(s), and only URL characters that need
/// no quoting in sh.
pub fn url_is_safe(url: &str) -> bool {
    (url.starts_with("https://") || url.starts_with("http://"))
        && url.len() <= 512
        && url.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~:/[]%@+,=".contains(&b))
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
    fn refuses_shell_metacharacters() {
        for bad in ["https://x/'; rm -rf /; '", "https://x/$(id)", "ftp://x", "https://x y", "https://x/`id`"]
        {
            assert!(!url_is_safe(bad), "{bad}");
        }
    }
}
