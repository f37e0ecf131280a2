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
///
/// The stanzas are the pieces between `\n\n`, as `str::split` gives them, found with
/// `memchr::memmem` (vectorised): `str::split`'s byte-by-byte search over the whole file was
/// most of the dry run's own work (`cargo xtask bench dryrun`).
pub fn parse_selected(text: &str, names: &[&str]) -> Vec<Package> {
    let mut out = Vec::new();
    let mut start = 0;
    let ends = memchr::memmem::find_iter(text.as_bytes(), b"\n\n").chain([text.len()]);
    for end in ends {
        // Both ends are at ASCII bytes (or the end), so on character boundaries.
        let stanza = &text[start..end];
        start = end + 2;
        if stanza.lines().find_map(|l| l.strip_prefix("Package:")).is_some_and(|n| names.contains(&n.trim()))
        {
            out.extend(parse(stanza));
        }
    }
    out
}

/// Compares two Debian package versions as dpkg does (`dpkg --compare-versions`): epoch
/// first, then the upstream version, then the revision, each by dpkg's `verrevcmp` (`~` sorts
/// before everything, even the end; letters before other characters; digit runs by value).
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let (ea, ua, ra) = split_version(a);
    let (eb, ub, rb) = split_version(b);
    ea.cmp(&eb).then_with(|| verrevcmp(ua, ub).cmp(&0)).then_with(|| verrevcmp(ra, rb).cmp(&0))
}

/// `[epoch:]upstream[-revision]`.
fn split_version(v: &str) -> (u64, &str, &str) {
    let v = v.trim();
    let (epoch, rest) = match v.split_once(':') {
        Some((e, r)) if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) => (e.parse().unwrap_or(0), r),
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((u, r)) => (epoch, u, r),
        None => (epoch, rest, ""),
    }
}

/// dpkg's `order()`: where a non-digit character sorts.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(b'~') => -1,
        Some(c) => i32::from(c) + 256,
    }
}

/// dpkg's `verrevcmp`.
fn verrevcmp(a: &str, b: &str) -> i32 {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    let digit = |s: &[u8]| s.first().is_some_and(u8::is_ascii_digit);
    while !a.is_empty() || !b.is_empty() {
        while (!a.is_empty() && !digit(a)) || (!b.is_empty() && !digit(b)) {
            let (ac, bc) = (order(a.first().copied()), order(b.first().copied()));
            if ac != bc {
                return ac - bc;
            }
            a = a.get(1..).unwrap_or_default();
            b = b.get(1..).unwrap_or_default();
        }
        while a.first() == Some(&b'0') {
            a = &a[1..];
        }
        while b.first() == Some(&b'0') {
            b = &b[1..];
        }
        let mut first_diff = 0;
        while digit(a) && digit(b) {
            if first_diff == 0 {
                first_diff = i32::from(a[0]) - i32::from(b[0]);
            }
            a = &a[1..];
            b = &b[1..];
        }
        if digit(a) {
            return 1;
        }
        if digit(b) {
            return -1;
        }
        if first_diff != 0 {
            return first_diff;
        }
    }
    0
}

/// The installed version of `name`, if it is installed.
pub fn installed_version<'a>(pkgs: &'a [Package], name: &str) -> Option<&'a str> {
    pkgs.iter().find(|p| p.name == name && p.is_installed()).map(|p| p.version.as_str())
}

/// [`parse_selected`] over a text that arrives in pieces ([`gpum_host::Host::read_pieces`]),
/// holding only the stanza being read, not the whole text: the same packages, and none at all
/// when the whole is not UTF-8 (as when the text is read whole and fails to be a `str`).
#[derive(Debug, Default)]
pub struct Selected {
    /// What has arrived since the last `\n\n`.
    pending: Vec<u8>,
    found: Vec<Package>,
    not_utf8: bool,
}

impl Selected {
    /// Takes the next piece, keeping the stanzas of `names`.
    pub fn feed(&mut self, piece: &[u8], names: &[&str]) {
        self.pending.extend_from_slice(piece);
        // The separators are ASCII, so a character never spans one: each stanza is UTF-8 on
        // its own exactly when the whole text is.
        let mut start = 0;
        // Non-overlapping, from the left, as `str::split` finds them; `pending` starts right
        // after the last one found, so the search goes on where it left off.
        for end in memchr::memmem::find_iter(&self.pending, b"\n\n") {
            Self::stanza(&self.pending[start..end], names, &mut self.found, &mut self.not_utf8);
            start = end + 2;
        }
        self.pending.drain(..start);
    }

    /// The packages found, once the whole text arrived.
    pub fn finish(mut self, names: &[&str]) -> Vec<Package> {
        let rest = std::mem::take(&mut self.pending);
        Self::stanza(&rest, names, &mut self.found, &mut self.not_utf8);
        if self.not_utf8 { Vec::new() } else { self.found }
    }

    fn stanza(bytes: &[u8], names: &[&str], found: &mut Vec<Package>, not_utf8: &mut bool) {
        match std::str::from_utf8(bytes) {
            Ok(stanza) => found.extend(parse_selected(stanza, names)),
            Err(_) => *not_utf8 = true,
        }
    }
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
    fn selected_in_pieces_matches_the_whole() {
        let text = fixture("debian12-dpkg-status-excerpt");
        let names = ["docker.io", "libc6", "containerd", "absent"];
        let whole = parse_selected(&text, &names);
        assert!(whole.len() >= 2);
        let odd = format!("\n\n\n{}\n\n\n\n{text}\n\n\n", text.replace("\n\n", "\n\n\n"));
        for t in [text.as_str(), odd.as_str(), "", "\n", "\n\n"] {
            for size in [1, 2, 3, 7, 64, 4096, 1 << 20] {
                let mut s = Selected::default();
                for piece in t.as_bytes().chunks(size) {
                    s.feed(piece, &names);
                }
                assert_eq!(s.finish(&names), parse_selected(t, &names), "pieces of {size}");
            }
        }
        // Not UTF-8 anywhere: nothing, as `read_to_string` failing gave.
        let mut bad = text.clone().into_bytes();
        bad.extend_from_slice(b"\n\nPackage: x\nDescription: \xff\n");
        let mut s = Selected::default();
        s.feed(&bad, &names);
        assert!(s.finish(&names).is_empty());
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
    fn versions_compare_as_dpkg_does() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        // Each pair checked with `dpkg --compare-versions` on Debian 12 (dpkg 1.21).
        for (a, b, want) in [
            ("1.17.7-1", "1.17.8", Less),
            ("1.17.8-1", "1.17.8", Greater),
            ("1.17.8", "1.17.8", Equal),
            ("1.17.10-1", "1.17.8", Greater),
            ("1.17.3-1", "1.17.8", Less),
            ("1.18.0-1", "1.17.8", Greater),
            ("1.17.8~rc.1-1", "1.17.8", Less),
            ("1:1.0", "1.17.8", Greater),
            ("1.9.0-1", "1.17.8", Less),
            ("2.0~beta", "2.0", Less),
            ("1.0a", "1.0", Greater),
            ("1.0+b1", "1.0a", Greater),
            ("1.017", "1.17", Equal),
            ("5:27.4.1-1~ubuntu.22.04~jammy", "5:27.4.1-1", Less),
        ] {
            assert_eq!(compare_versions(a, b), want, "{a} vs {b}");
            assert_eq!(compare_versions(b, a), want.reverse(), "{b} vs {a}");
        }
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
