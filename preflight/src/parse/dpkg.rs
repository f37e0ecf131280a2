//! dpkg's package database: `/var/lib/dpkg/status`, and `dpkg-query -s` output, which has the
//! same deb822 stanza format.
//!
//! The audit reads the status file instead of running `dpkg-query`: one read instead of a
//! process per package keeps the dry run fast, and the answer is the same.

/// One package stanza, the fields gpum uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Package {
    pub name: String,
    /// `Status:`, e.g. `install ok installed`, `deinstall ok config-files`.
    pub status: String,
    pub version: String,
    pub architecture: String,
}

impl Package {
    /// Unpacked and configured: the last word of `Status:` is `installed`.
    pub fn is_installed(&self) -> bool {
        self.status.split_whitespace().last() == Some("installed")
    }
}

/// Parses stanzas separated by blank lines. Continuation lines (starting with a space) are
/// skipped: none of the fields gpum reads spans lines.
pub fn parse(text: &str) -> Vec<Package> {
    let mut out = Vec::new();
    let mut cur = Package::default();
    let mut flush = |cur: &mut Package| {
        if !cur.name.is_empty() {
            out.push(std::mem::take(cur));
        } else {
            *cur = Package::default();
        }
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            flush(&mut cur);
            continue;
        }
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let Some((k, v)) = line.split_once(':') else { continue };
        let v = v.trim().to_string();
        match k {
            "Package" => cur.name = v,
            "Status" => cur.status = v,
            "Version" => cur.version = v,
            "Architecture" => cur.architecture = v,
            _ => {}
        }
    }
    flush(&mut cur);
    out
}

/// Like [`parse`], but only the stanzas of the packages in `names`. dpkg's status file is
/// ~700 KB with ~1000 stanzas on a desktop install; skipping the rest without allocating keeps
/// the audit fast.
pub fn parse_selected(text: &str, names: &[&str]) -> Vec<Package> {
    text.split("\n\n")
        .filter(|stanza| {
            stanza.lines().find_map(|l| l.strip_prefix("Package:")).is_some_and(|n| names.contains(&n.trim()))
        })
        .flat_map(parse)
        .collect()
}

/// The installed version of `name`, if it is installed.
pub fn installed_version<'a>(pkgs: &'a [Package], name: &str) -> Option<&'a str> {
    pkgs.iter().find(|p| p.name == name && p.is_installed()).map(|p| p.version.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::fixture;

    #[test]
    fn status_file_excerpt_captured() {
        let p = parse(&fixture("debian12-dpkg-status-excerpt"));
        assert_eq!(p.len(), 6);
        assert_eq!(installed_version(&p, "docker.io"), Some("20.10.24+dfsg1-1+deb12u1+b6"));
        assert_eq!(installed_version(&p, "containerd"), Some("1.6.20~ds1-1+deb12u3"));
        assert_eq!(installed_version(&p, "docker-ce"), None);
        assert!(p.iter().all(|x| !x.architecture.is_empty()));
    }

    #[test]
    fn selected_matches_full_parse() {
        let text = fixture("debian12-dpkg-status-excerpt");
        let all = parse(&text);
        let some = parse_selected(&text, &["docker.io", "libc6", "absent"]);
        assert_eq!(
            some,
            all.into_iter().filter(|p| p.name == "docker.io" || p.name == "libc6").collect::<Vec<_>>()
        );
        assert!(parse_selected(&text, &[]).is_empty());
    }

    #[test]
    fn dpkg_query_s_captured() {
        let p = parse(&fixture("debian12-dpkg-query-s.txt"));
        assert_eq!(p.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(), ["docker.io", "containerd"]);
        assert!(p.iter().all(Package::is_installed));
        // `dpkg-query -s` of a missing package prints no stanza at all.
        assert!(parse(&fixture("debian12-dpkg-query-missing.txt")).is_empty());
    }

    #[test]
    fn ubuntu_toolkit_reconstructed() {
        let p = parse(&fixture("ubuntu2204-dpkg-status-excerpt"));
        assert_eq!(installed_version(&p, "nvidia-container-toolkit"), Some("1.17.3-1"));
        assert_eq!(installed_version(&p, "docker-ce"), Some("5:27.4.1-1~ubuntu.22.04~jammy"));
        // Removed but not purged: config files only, not installed.
        assert_eq!(installed_version(&p, "docker.io"), None);
        assert!(p.iter().any(|x| x.name == "docker.io" && x.status == "deinstall ok config-files"));
    }
}
