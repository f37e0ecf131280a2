//! `/etc/os-release` (os-release(5)): shell-style `KEY=value` lines.

use std::collections::BTreeMap;

/// The fields gpum uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OsRelease {
    /// `ID`, lower case: `ubuntu`, `debian`, …
    pub id: String,
    /// `ID_LIKE`, split on whitespace.
    pub id_like: Vec<String>,
    /// `VERSION_ID`: `22.04`, `12`, …
    pub version_id: String,
    /// `VERSION_CODENAME` (or `UBUNTU_CODENAME`): `jammy`, `noble`, `bookworm`.
    pub codename: String,
    pub pretty_name: String,
}

/// Unquotes one value: `"..."` with backslash escapes, `'...'` literally, or bare.
fn unquote(v: &str) -> String {
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) {
        let mut out = String::new();
        let mut esc = false;
        for c in inner.chars() {
            if esc {
                out.push(c);
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else {
                out.push(c);
            }
        }
        out
    } else if let Some(inner) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        inner.to_string()
    } else {
        v.to_string()
    }
}

/// All `KEY=value` pairs; comments and blank lines are skipped.
pub fn parse_map(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), unquote(v)))
        .collect()
}

pub fn parse(text: &str) -> OsRelease {
    let m = parse_map(text);
    let get = |k: &str| m.get(k).cloned().unwrap_or_default();
    let codename =
        m.get("VERSION_CODENAME").or_else(|| m.get("UBUNTU_CODENAME")).cloned().unwrap_or_default();
    OsRelease {
        id: get("ID").to_ascii_lowercase(),
        id_like: get("ID_LIKE").split_whitespace().map(str::to_ascii_lowercase).collect(),
        version_id: get("VERSION_ID"),
        codename,
        pretty_name: m.get("PRETTY_NAME").cloned().unwrap_or_else(|| get("NAME")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::fixture;

    #[test]
    fn debian12_captured() {
        let o = parse(&fixture("debian12.os-release"));
        assert_eq!(o.id, "debian");
        assert_eq!(o.version_id, "12");
        assert_eq!(o.codename, "bookworm");
        assert_eq!(o.pretty_name, "Debian GNU/Linux 12 (bookworm)");
        assert!(o.id_like.is_empty());
    }

    #[test]
    fn ubuntu_reconstructed() {
        let o = parse(&fixture("ubuntu2204.os-release"));
        assert_eq!((o.id.as_str(), o.version_id.as_str(), o.codename.as_str()), ("ubuntu", "22.04", "jammy"));
        assert_eq!(o.id_like, vec!["debian"]);
        let o = parse(&fixture("ubuntu2404.os-release"));
        assert_eq!((o.id.as_str(), o.version_id.as_str(), o.codename.as_str()), ("ubuntu", "24.04", "noble"));
        assert_eq!(o.pretty_name, "Ubuntu 24.04.1 LTS");
    }

    #[test]
    fn quoting_and_comments() {
        let o = parse(
            "# c\nID='ubuntu'\nVERSION_ID=\"22.04\"\nPRETTY_NAME=\"A \\\"q\\\" name\"\nUBUNTU_CODENAME=jammy\n\n",
        );
        assert_eq!(o.id, "ubuntu");
        assert_eq!(o.version_id, "22.04");
        assert_eq!(o.pretty_name, "A \"q\" name");
        assert_eq!(o.codename, "jammy");
        assert_eq!(parse(""), OsRelease::default());
    }
}
