//! apt source entries: the deb822 `.sources` file gpum writes, and the detection of entries that
//! would make apt refuse to work once it is written.
//!
//! apt keys a repository by (URI, suite). When two entries for the same pair name different
//! keyrings, `apt-get update` stops with "Conflicting values set for option Signed-By regarding
//! source …" and *every* later apt command fails, not only gpum's. That happens on real machines
//! after get.docker.com or the NVIDIA instructions left a `docker.list` or
//! `nvidia-container-toolkit.list` with their own `signed-by=`. So preflight reads the existing
//! entries (through the Host, see [`read_apt_sources`]) and reports such entries *before* the
//! installer writes anything; [`conflicts`] is the pure function that decides.
//!
//! The parsers follow `sources.list(5)`: one-line entries in `*.list` (and `/etc/apt/sources.list`),
//! deb822 paragraphs in `*.sources`; files with any other extension are ignored, as apt does.

use std::fmt;
use std::path::{Path, PathBuf};

use gpum_host::Host;

use crate::pinned::Repo;

/// Where apt reads its sources from.
pub const SOURCES_LIST: &str = "/etc/apt/sources.list";
pub const SOURCES_LIST_D: &str = "/etc/apt/sources.list.d";

/// One source entry, from either format. A deb822 paragraph with several URIs or suites is
/// one entry here; matching looks at each URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub file: PathBuf,
    /// 1-based line where the entry (or the deb822 paragraph) starts.
    pub line: usize,
    /// `deb`, `deb-src`.
    pub types: Vec<String>,
    pub uris: Vec<String>,
    pub suites: Vec<String>,
    pub components: Vec<String>,
    /// The `signed-by` option / `Signed-By:` field as written (a path, fingerprints, or an
    /// inline armored key), trimmed. `None` when absent.
    pub signed_by: Option<String>,
    /// The `arch=` option / `Architectures:` field; empty when absent (every architecture).
    pub architectures: Vec<String>,
    /// The names of every other option or field (`trusted`, `allow-insecure`, `arch+`, …), as
    /// written: whatever they do, gpum does not rely on an entry that has one.
    pub other_options: Vec<String>,
}

/// Parses the files apt reads into entries; disabled and commented-out entries are skipped.
/// The format is chosen from the file name, as apt does.
pub fn parse_files(files: &[(PathBuf, String)]) -> Vec<Entry> {
    let mut out = Vec::new();
    for (path, text) in files {
        match format_of(path) {
            Some(Format::OneLine) => out.extend(parse_one_line(path, text)),
            Some(Format::Deb822) => out.extend(parse_deb822(path, text)),
            None => {}
        }
    }
    out
}

enum Format {
    OneLine,
    Deb822,
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("list") => Some(Format::OneLine),
        Some("sources") => Some(Format::Deb822),
        _ if path == Path::new(SOURCES_LIST) => Some(Format::OneLine),
        _ => None,
    }
}

/// One-line format: `deb [ opt=val ... ] uri suite [component ...]`, `#` starts a comment.
pub fn parse_one_line(path: &Path, text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((ty, rest)) = line.split_once(char::is_whitespace) else { continue };
        if ty != "deb" && ty != "deb-src" {
            continue;
        }
        let rest = rest.trim_start();
        let (opts, rest) = if let Some(r) = rest.strip_prefix('[') {
            match r.split_once(']') {
                Some((o, r)) => (o, r),
                None => continue, // apt rejects an unterminated option list; so do we
            }
        } else {
            ("", rest)
        };
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else { continue };
        let mut signed_by = None;
        let mut architectures = Vec::new();
        let mut other_options = Vec::new();
        for opt in opts.split_whitespace() {
            match opt.split_once('=') {
                Some((k, v)) if k.eq_ignore_ascii_case("signed-by") => signed_by = Some(v.trim().to_string()),
                Some((k, v)) if k.eq_ignore_ascii_case("arch") => {
                    architectures = v.split(',').filter(|a| !a.is_empty()).map(str::to_string).collect()
                }
                Some((k, _)) => other_options.push(k.to_string()),
                None => other_options.push(opt.to_string()),
            }
        }
        out.push(Entry {
            file: path.to_path_buf(),
            line: i + 1,
            types: vec![ty.to_string()],
            uris: vec![uri.to_string()],
            suites: vec![suite.to_string()],
            components: words.map(str::to_string).collect(),
            signed_by,
            architectures,
            other_options,
        });
    }
    out
}

/// deb822 format: paragraphs separated by blank lines; a line starting with whitespace continues
/// the previous field (how an inline `Signed-By:` key is written); `Enabled: no` disables.
pub fn parse_deb822(path: &Path, text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut start = 0usize;
    let mut flush = |fields: &mut Vec<(String, String)>, start: usize| {
        if fields.is_empty() {
            return;
        }
        let get = |k: &str| {
            fields.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|(_, v)| v.trim().to_string())
        };
        let words =
            |k: &str| get(k).map(|v| v.split_whitespace().map(str::to_string).collect()).unwrap_or_default();
        let enabled = get("Enabled").map(|v| !v.eq_ignore_ascii_case("no")).unwrap_or(true);
        const KNOWN: [&str; 7] =
            ["Types", "URIs", "Suites", "Components", "Signed-By", "Architectures", "Enabled"];
        let other_options = fields
            .iter()
            .filter(|(n, _)| !KNOWN.iter().any(|k| n.eq_ignore_ascii_case(k)))
            .map(|(n, _)| n.clone())
            .collect();
        if enabled {
            out.push(Entry {
                file: path.to_path_buf(),
                line: start,
                types: words("Types"),
                uris: words("URIs"),
                suites: words("Suites"),
                components: words("Components"),
                signed_by: get("Signed-By").filter(|v| !v.is_empty()),
                architectures: words("Architectures"),
                other_options,
            });
        }
        fields.clear();
    };
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut fields, start);
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = fields.last_mut() {
                v.push('\n');
                v.push_str(line.trim());
            }
            continue;
        }
        if fields.is_empty() {
            start = i + 1;
        }
        if let Some((k, v)) = line.split_once(':') {
            fields.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    flush(&mut fields, start);
    out
}

/// What is wrong with an existing entry for one of gpum's repositories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictKind {
    /// The entry names another keyring (or none): once gpum's source is added, apt fails with
    /// "Conflicting values set for option Signed-By".
    SignedBy { found: Option<String>, expected: String },
    /// The entry agrees with gpum's but lives in another file: apt warns that targets are
    /// configured multiple times, and removing one file later breaks nothing but confuses people.
    Duplicate,
}

/// An existing apt source entry that clashes with the source gpum would write for a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub repo_id: &'static str,
    pub file: PathBuf,
    pub line: usize,
    pub uri: String,
    pub kind: ConflictKind,
}

impl Conflict {
    /// Whether apt would refuse to work (as opposed to only warning).
    pub fn is_fatal(&self) -> bool {
        matches!(self.kind, ConflictKind::SignedBy { .. })
    }
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = format!("{}:{}", self.file.display(), self.line);
        match &self.kind {
            ConflictKind::SignedBy { found, expected } => {
                let found = match found {
                    Some(v) if v.starts_with("-----BEGIN") => "an inline key".to_string(),
                    Some(v) => v.clone(),
                    None => "no Signed-By".to_string(),
                };
                write!(
                    f,
                    "{at}: {} is signed by {found}, gpum uses {expected} (apt: Conflicting values set for option Signed-By)",
                    self.uri
                )
            }
            ConflictKind::Duplicate => write!(f, "{at}: {} is already configured here", self.uri),
        }
    }
}

/// The entries in `files` that clash with gpum's source for `repo`: entries for the same URI
/// with another `Signed-By` (fatal for apt), and agreeing entries outside gpum's own file
/// (duplicates). gpum's own file with gpum's keyring is not a conflict, so a re-run is clean.
pub fn conflicts(files: &[(PathBuf, String)], repo: &Repo) -> Vec<Conflict> {
    let expected = repo.keyring_path();
    let ours = PathBuf::from(repo.sources_path());
    let mut out = Vec::new();
    for e in parse_files(files) {
        let Some(uri) = e.uris.iter().find(|u| same_uri(u, repo.uri)) else { continue };
        let kind = if e.signed_by.as_deref() != Some(expected.as_str()) {
            ConflictKind::SignedBy { found: e.signed_by.clone(), expected: expected.clone() }
        } else if e.file != ours {
            ConflictKind::Duplicate
        } else {
            continue;
        };
        out.push(Conflict { repo_id: repo.id, file: e.file.clone(), line: e.line, uri: uri.clone(), kind });
    }
    out
}

/// An apt source the owner already has for one of gpum's repositories (Docker's `docker.list`
/// with `/etc/apt/keyrings/docker.asc`, NVIDIA's `nvidia-container-toolkit.list` with
/// `/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg`), which the install uses as it
/// is instead of adding its own: found by [`owner_source`] only when its keyring holds exactly
/// the pinned key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerSource {
    /// The file with the entry (the first, when several agree).
    pub file: PathBuf,
    pub line: usize,
    /// The keyring its `signed-by` names.
    pub keyring: String,
    /// The pinned primary fingerprint the keyring holds, upper-case hex.
    pub fingerprint: String,
}

/// The entry (and the keyring path it names) that the owner's sources give for `repo`, when
/// every entry apt has for the repository's URI agrees with what gpum would write: the same
/// suite (`suite`), the components gpum needs, this architecture (`arch`, dpkg's name) among
/// its own, one and the same `signed-by` keyring file (an absolute path ending `.asc` or
/// `.gpg`), no other option (`trusted=yes` and the like), and none in gpum's own file. `None`
/// at the least doubt: the install then adds its own source, and [`conflicts`] reports the
/// owner's entries as today. The keyring's contents are [`owner_source`]'s to check.
pub fn owner_entry(
    files: &[(PathBuf, String)],
    repo: &Repo,
    suite: &str,
    arch: &str,
) -> Option<(Entry, String)> {
    let ours = PathBuf::from(repo.sources_path());
    let matching: Vec<Entry> =
        parse_files(files).into_iter().filter(|e| e.uris.iter().any(|u| same_uri(u, repo.uri))).collect();
    let first = matching.first()?;
    let keyring = first.signed_by.clone()?;
    let path_ok = keyring.starts_with('/')
        && !keyring.chars().any(char::is_whitespace)
        && (keyring.ends_with(".asc") || keyring.ends_with(".gpg"));
    if !path_ok {
        return None;
    }
    let agrees = |e: &Entry| {
        e.file != ours
            && e.signed_by.as_deref() == Some(keyring.as_str())
            && e.other_options.is_empty()
            && !e.types.is_empty()
            && e.types.iter().all(|t| t == "deb" || t == "deb-src")
            && e.suites == [suite]
    };
    if !matching.iter().all(agrees) {
        return None;
    }
    let serves = |e: &&Entry| {
        e.types.iter().any(|t| t == "deb")
            && repo.components.iter().all(|c| e.components.iter().any(|x| x == c))
            && (e.architectures.is_empty() || e.architectures.iter().any(|a| a == arch))
    };
    let entry = matching.iter().find(serves)?.clone();
    Some((entry, keyring))
}

/// The owner's source for `repo` ([`owner_entry`]) when its keyring file holds exactly the
/// pinned key ([`keys::verify_keyring_file`]), and it and the source's file are plain files
/// that only root can change (a keyring a user could rewrite is no pinned key). `None` at the
/// least doubt (missing, unreadable, another key, an extra key, another form): the install then
/// adds its own, and the `apt_sources` check refuses the clash as before.
pub fn owner_source(
    host: &dyn Host,
    files: &[(PathBuf, String)],
    repo: &Repo,
    suite: &str,
    arch: &str,
    now: std::time::SystemTime,
) -> Option<OwnerSource> {
    let (entry, keyring) = owner_entry(files, repo, suite, arch)?;
    let root_only = |p: &Path| {
        host.lstat(p).is_ok_and(|s| s.kind == gpum_host::FileKind::File && s.uid == 0 && s.mode & 0o022 == 0)
    };
    if !root_only(&entry.file) || !root_only(Path::new(&keyring)) {
        return None;
    }
    let data = host.read(Path::new(&keyring)).ok()?;
    let key = crate::keys::verify_keyring_file(&keyring, &data, repo.fingerprints, now).ok()?;
    Some(OwnerSource { file: entry.file, line: entry.line, keyring, fingerprint: key.fingerprint })
}

/// dpkg's name for the machine's architecture (`uname -m`).
pub fn dpkg_arch(uname_m: &str) -> &str {
    match uname_m {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// apt compares URIs after normalising a trailing slash; scheme and host are case-insensitive.
/// `$(ARCH)` (which the NVIDIA instructions use) is apt's own substitution and matches any one
/// path segment.
fn same_uri(a: &str, b: &str) -> bool {
    let norm = |s: &str| {
        let s = s.trim().trim_end_matches('/');
        match s.split_once("://") {
            Some((scheme, rest)) => {
                let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
                (scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), path.to_string())
            }
            None => (String::new(), String::new(), s.to_string()),
        }
    };
    let (sa, ha, pa) = norm(a);
    let (sb, hb, pb) = norm(b);
    if sa != sb || ha != hb {
        return false;
    }
    let (pa, pb): (Vec<&str>, Vec<&str>) = (pa.split('/').collect(), pb.split('/').collect());
    pa.len() == pb.len() && pa.iter().zip(&pb).all(|(x, y)| x == y || *x == "$(ARCH)" || *y == "$(ARCH)")
}

/// Reads every file apt would read for sources, through the Host. Unreadable files are skipped:
/// apt would fail on them too, and preflight reports apt's own state separately.
pub fn read_apt_sources(host: &dyn Host) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let main = PathBuf::from(SOURCES_LIST);
    if let Ok(t) = host.read_to_string(&main) {
        out.push((main, t));
    }
    if let Ok(entries) = host.read_dir(Path::new(SOURCES_LIST_D)) {
        for p in entries {
            if format_of(&p).is_some()
                && let Ok(t) = host.read_to_string(&p)
            {
                out.push((p, t));
            }
        }
    }
    out
}

/// The deb822 source gpum writes for `repo`. `codename` fills the suite for repositories whose
/// suite is the OS release (`jammy`, `noble`, `bookworm`); `arch` is dpkg's architecture.
pub fn render(repo: &Repo, codename: &str, arch: &str) -> String {
    let suite = repo.suite.unwrap_or(codename);
    let mut s = String::new();
    s.push_str("# Written by gpum-install. The key is pinned by fingerprint; see docs/trust.md.\n");
    s.push_str("Types: deb\n");
    s.push_str(&format!("URIs: {}\n", repo.uri));
    s.push_str(&format!("Suites: {suite}\n"));
    if !repo.components.is_empty() {
        s.push_str(&format!("Components: {}\n", repo.components.join(" ")));
    }
    s.push_str(&format!("Architectures: {arch}\n"));
    s.push_str(&format!("Signed-By: {}\n", repo.keyring_path()));
    s
}

/// Writes gpum's source for `repo` to `repo.sources_path()`, atomically, mode 0644 (apt reads
/// sources as the unprivileged `_apt` user too).
pub fn write_source(host: &dyn Host, repo: &Repo, codename: &str, arch: &str) -> std::io::Result<()> {
    host.write_atomic(Path::new(&repo.sources_path()), render(repo, codename, arch).as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pinned::{DOCKER_UBUNTU, NVIDIA_TOOLKIT};

    fn f(p: &str, t: &str) -> (PathBuf, String) {
        (PathBuf::from(p), t.to_string())
    }

    /// What get.docker.com leaves behind on Ubuntu 22.04.
    const GET_DOCKER_LIST: &str = "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu jammy stable\n";
    /// What the NVIDIA Container Toolkit install guide writes.
    const NVIDIA_LIST: &str = "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://nvidia.github.io/libnvidia-container/experimental/deb/$(ARCH) /\n";

    #[test]
    fn get_docker_list_conflicts_with_ours() {
        let files = [f("/etc/apt/sources.list.d/docker.list", GET_DOCKER_LIST)];
        let c = conflicts(&files, &DOCKER_UBUNTU);
        assert_eq!(c.len(), 1);
        assert!(c[0].is_fatal());
        assert_eq!(c[0].line, 1);
        assert_eq!(
            c[0].kind,
            ConflictKind::SignedBy {
                found: Some("/etc/apt/keyrings/docker.asc".into()),
                expected: "/etc/apt/keyrings/gpum-docker.gpg".into()
            }
        );
        assert!(c[0].to_string().contains("Conflicting values set for option Signed-By"), "{}", c[0]);
    }

    #[test]
    fn nvidia_arch_variable_matches_and_comment_is_ignored() {
        let files = [f("/etc/apt/sources.list.d/nvidia-container-toolkit.list", NVIDIA_LIST)];
        let c = conflicts(&files, &NVIDIA_TOOLKIT);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].uri, "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)");
        // The Docker repository is not concerned.
        assert!(conflicts(&files, &DOCKER_UBUNTU).is_empty());
    }

    #[test]
    fn our_own_file_is_clean_and_a_copy_elsewhere_is_a_duplicate() {
        let ours = render(&DOCKER_UBUNTU, "jammy", "amd64");
        let files = [f("/etc/apt/sources.list.d/gpum-docker.sources", &ours)];
        assert!(conflicts(&files, &DOCKER_UBUNTU).is_empty());
        let files = [
            f("/etc/apt/sources.list.d/gpum-docker.sources", &ours),
            f("/etc/apt/sources.list.d/old.sources", &ours),
        ];
        let c = conflicts(&files, &DOCKER_UBUNTU);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, ConflictKind::Duplicate);
        assert!(!c[0].is_fatal());
    }

    #[test]
    fn entry_without_signed_by_conflicts() {
        // apt also fails when one entry has Signed-By and the other has none.
        let files = [f(SOURCES_LIST, "deb https://download.docker.com/linux/ubuntu/ jammy stable\n")];
        let c = conflicts(&files, &DOCKER_UBUNTU);
        assert_eq!(c.len(), 1);
        assert!(matches!(&c[0].kind, ConflictKind::SignedBy { found: None, .. }));
    }

    #[test]
    fn deb822_inline_key_disabled_and_other_extensions() {
        let text = "Types: deb\nURIs: https://download.docker.com/linux/ubuntu\nSuites: jammy\nComponents: stable\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBFit2ioBEADhWpZ8/wvZ6hUTiXOwQHXMAlaFHcPH9hAtr4F1y2+OYdbtMuth\n -----END PGP PUBLIC KEY BLOCK-----\n\n# second paragraph, disabled\nTypes: deb\nURIs: https://download.docker.com/linux/ubuntu\nSuites: jammy\nEnabled: no\n";
        let files = [
            f("/etc/apt/sources.list.d/docker.sources", text),
            f("/etc/apt/sources.list.d/docker.list.save", GET_DOCKER_LIST),
            f("/etc/apt/sources.list.d/docker.list.distUpgrade", GET_DOCKER_LIST),
        ];
        let c = conflicts(&files, &DOCKER_UBUNTU);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].line, 1);
        assert!(c[0].to_string().contains("an inline key"));
    }

    #[test]
    fn one_line_parser_handles_options_spacing_and_components() {
        let e = parse_one_line(
            Path::new("/x.list"),
            "  # comment\ndeb [ arch=amd64,arm64 signed-by=/k.gpg ] http://archive.ubuntu.com/ubuntu jammy main universe # tail\ndeb-src http://a/b jammy\ndeb [broken http://a jammy\nrubbish\n",
        );
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].line, 2);
        assert_eq!(e[0].signed_by.as_deref(), Some("/k.gpg"));
        assert_eq!(e[0].components, ["main", "universe"]);
        assert_eq!(e[1].types, ["deb-src"]);
        assert_eq!(e[1].signed_by, None);
    }

    #[test]
    fn deb822_real_ubuntu_sources() {
        // The stock Ubuntu 24.04 /etc/apt/sources.list.d/ubuntu.sources.
        let text = "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu/\nSuites: noble noble-updates noble-backports\nComponents: main restricted universe multiverse\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n\nTypes: deb\nURIs: http://security.ubuntu.com/ubuntu/\nSuites: noble-security\nComponents: main restricted universe multiverse\nSigned-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n";
        let e = parse_deb822(Path::new("/etc/apt/sources.list.d/ubuntu.sources"), text);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].suites, ["noble", "noble-updates", "noble-backports"]);
        assert_eq!(e[1].line, 7);
        assert_eq!(e[1].signed_by.as_deref(), Some("/usr/share/keyrings/ubuntu-archive-keyring.gpg"));
        assert!(conflicts(&[(e[0].file.clone(), text.into())], &DOCKER_UBUNTU).is_empty());
    }

    #[test]
    fn render_is_parseable_deb822() {
        let t = render(&NVIDIA_TOOLKIT, "jammy", "amd64");
        let e = parse_deb822(Path::new("/x.sources"), &t);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].uris, [NVIDIA_TOOLKIT.uri]);
        assert_eq!(e[0].suites, ["/"]);
        assert!(e[0].components.is_empty());
        assert_eq!(e[0].signed_by.as_deref(), Some("/etc/apt/keyrings/gpum-nvidia-container-toolkit.gpg"));
        let t = render(&DOCKER_UBUNTU, "jammy", "amd64");
        assert!(t.contains("Suites: jammy\nComponents: stable\n"), "{t}");
    }

    #[test]
    fn written_source_is_0644_and_clean_on_rerun() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let host = gpum_host::RealHost::with_root(dir.path());
        gpum_host::Host::create_dir_all(&host, std::path::Path::new("/etc/apt/sources.list.d"), 0o755)
            .unwrap();
        write_source(&host, &DOCKER_UBUNTU, "jammy", "amd64").unwrap();
        let p = dir.path().join("etc/apt/sources.list.d/gpum-docker.sources");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o644);
        // What was written is what a re-run reads back, and it is not a conflict with itself.
        assert!(conflicts(&read_apt_sources(&host), &DOCKER_UBUNTU).is_empty());
        assert_eq!(read_apt_sources(&host).len(), 1);
    }

    mod owner {
        use super::*;
        use gpum_host::fake::FakeHost;
        use gpum_host::{FileKind, FileStat};
        use sequoia_openpgp::Cert;
        use sequoia_openpgp::parse::Parse;
        use sequoia_openpgp::serialize::SerializeInto;
        use std::time::SystemTime;

        const DOCKER_LIST: &str = "/etc/apt/sources.list.d/docker.list";
        const DOCKER_ASC: &str = "/etc/apt/keyrings/docker.asc";
        const NVIDIA_LIST_PATH: &str = "/etc/apt/sources.list.d/nvidia-container-toolkit.list";
        const NVIDIA_GPG: &str = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg";

        /// `gpg --dearmor` of an armored key: its binary packets.
        fn dearmor(armored: &[u8]) -> Vec<u8> {
            let mut r = sequoia_openpgp::armor::Reader::from_bytes(
                armored,
                sequoia_openpgp::armor::ReaderMode::Tolerant(None),
            );
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut r, &mut out).unwrap();
            out
        }

        /// One armor block holding these binary packets.
        fn armor(binary: &[u8]) -> Vec<u8> {
            let mut out = Vec::new();
            let mut w =
                sequoia_openpgp::armor::Writer::new(&mut out, sequoia_openpgp::armor::Kind::PublicKey)
                    .unwrap();
            std::io::Write::write_all(&mut w, binary).unwrap();
            w.finalize().unwrap();
            out
        }

        fn other_key() -> Vec<u8> {
            crate::keys::tests::signing_cert().to_vec().unwrap()
        }

        /// Docker's own instructions on Ubuntu 22.04: the armored key as downloaded, `arch=amd64`.
        fn docker_layout(key: &[u8]) -> FakeHost {
            FakeHost::new().file(DOCKER_LIST, GET_DOCKER_LIST).file(DOCKER_ASC, key.to_vec())
        }

        /// NVIDIA's instructions: the key through `gpg --dearmor`, `$(ARCH)` in the URI.
        fn nvidia_layout(key: &[u8]) -> FakeHost {
            FakeHost::new().file(NVIDIA_LIST_PATH, NVIDIA_LIST).file(NVIDIA_GPG, key.to_vec())
        }

        fn docker(h: &FakeHost) -> Option<OwnerSource> {
            owner_source(h, &read_apt_sources(h), &DOCKER_UBUNTU, "jammy", "amd64", SystemTime::now())
        }

        fn nvidia(h: &FakeHost) -> Option<OwnerSource> {
            owner_source(h, &read_apt_sources(h), &NVIDIA_TOOLKIT, "/", "amd64", SystemTime::now())
        }

        #[test]
        fn dockers_layout_with_the_pinned_armored_key_is_used() {
            let s = docker(&docker_layout(DOCKER_UBUNTU.key_copy)).expect("Docker's own layout is used");
            assert_eq!(s.file, Path::new(DOCKER_LIST));
            assert_eq!(s.line, 1);
            assert_eq!(s.keyring, DOCKER_ASC);
            assert_eq!(s.fingerprint, DOCKER_UBUNTU.fingerprints[0]);
        }

        #[test]
        fn nvidias_layout_with_the_pinned_dearmored_key_is_used() {
            let s =
                nvidia(&nvidia_layout(&dearmor(NVIDIA_TOOLKIT.key_copy))).expect("NVIDIA's layout is used");
            assert_eq!(s.file, Path::new(NVIDIA_LIST_PATH));
            assert_eq!(s.keyring, NVIDIA_GPG);
            assert_eq!(s.fingerprint, NVIDIA_TOOLKIT.fingerprints[0]);
        }

        #[test]
        fn a_keyring_with_another_key_is_not_used() {
            // Docker's key where NVIDIA's should be, and the reverse; and a throwaway key.
            assert_eq!(nvidia(&nvidia_layout(&dearmor(DOCKER_UBUNTU.key_copy))), None);
            assert_eq!(docker(&docker_layout(NVIDIA_TOOLKIT.key_copy)), None);
            assert_eq!(docker(&docker_layout(&armor(&other_key()))), None);
            assert_eq!(nvidia(&nvidia_layout(&other_key())), None);
        }

        #[test]
        fn a_keyring_with_the_pinned_key_and_another_is_not_used() {
            let mut both = dearmor(NVIDIA_TOOLKIT.key_copy);
            both.extend(other_key());
            assert_eq!(nvidia(&nvidia_layout(&both)), None, "binary keyring, two certificates");
            let mut both = dearmor(DOCKER_UBUNTU.key_copy);
            both.extend(other_key());
            assert_eq!(docker(&docker_layout(&armor(&both))), None, "one armor block, two certificates");
            let mut two_blocks = DOCKER_UBUNTU.key_copy.to_vec();
            two_blocks.extend(armor(&other_key()));
            assert_eq!(docker(&docker_layout(&two_blocks)), None, "two armor blocks");
            // The pinned key alone, re-armored, is still fine: the check is the key, not the bytes.
            let again = armor(&Cert::from_bytes(DOCKER_UBUNTU.key_copy).unwrap().to_vec().unwrap());
            assert!(docker(&docker_layout(&again)).is_some());
        }

        #[test]
        fn a_missing_unreadable_or_empty_keyring_is_not_used() {
            let h = FakeHost::new().file(DOCKER_LIST, GET_DOCKER_LIST);
            assert_eq!(docker(&h), None, "missing");
            assert_eq!(docker(&docker_layout(b"")), None, "empty");
            assert_eq!(docker(&docker_layout(b"<html>404</html>")), None, "junk");
            // A directory where the keyring should be.
            let h = FakeHost::new().file(DOCKER_LIST, GET_DOCKER_LIST).dir(DOCKER_ASC);
            assert_eq!(docker(&h), None, "a directory");
        }

        #[test]
        fn a_keyring_in_the_form_apt_would_not_read_is_not_used() {
            // apt reads `.asc` as armor and `.gpg` as binary: the other way round fails there.
            assert_eq!(docker(&docker_layout(&dearmor(DOCKER_UBUNTU.key_copy))), None);
            assert_eq!(nvidia(&nvidia_layout(NVIDIA_TOOLKIT.key_copy)), None);
            // Any other name is not guessed at.
            let list = GET_DOCKER_LIST.replace("docker.asc", "docker.key");
            let h = FakeHost::new()
                .file(DOCKER_LIST, list)
                .file("/etc/apt/keyrings/docker.key", DOCKER_UBUNTU.key_copy);
            assert_eq!(docker(&h), None);
        }

        #[test]
        fn a_keyring_or_source_others_could_rewrite_is_not_used() {
            let writable = |kind, uid, mode| FileStat { kind, uid, mode };
            for (path, st) in [
                (DOCKER_ASC, writable(FileKind::File, 1000, 0o644)),
                (DOCKER_ASC, writable(FileKind::File, 0, 0o666)),
                (DOCKER_ASC, writable(FileKind::File, 0, 0o664)),
                (DOCKER_ASC, writable(FileKind::Symlink, 0, 0o777)),
                (DOCKER_LIST, writable(FileKind::File, 0, 0o646)),
            ] {
                let h = docker_layout(DOCKER_UBUNTU.key_copy).stat(path, st);
                assert_eq!(docker(&h), None, "{path} {st:?}");
            }
        }

        #[test]
        fn an_entry_gpum_would_not_write_is_not_used() {
            let key = DOCKER_UBUNTU.key_copy;
            let not_used = |list: &str| {
                let h = FakeHost::new().file(DOCKER_LIST, list).file(DOCKER_ASC, key);
                assert_eq!(docker(&h), None, "{list}");
            };
            let ok = GET_DOCKER_LIST;
            assert!(docker(&FakeHost::new().file(DOCKER_LIST, ok).file(DOCKER_ASC, key)).is_some());
            not_used(&ok.replace("arch=amd64", "arch=amd64 trusted=yes"));
            not_used(&ok.replace("arch=amd64", "arch=arm64"));
            not_used(&ok.replace(" jammy ", " focal "));
            not_used(&ok.replace(" stable", " test"));
            not_used(&ok.replace("signed-by=/etc/apt/keyrings/docker.asc", "signed-by=etc/docker.asc"));
            not_used(&ok.replace(" signed-by=/etc/apt/keyrings/docker.asc", ""));
            not_used(&ok.replace("deb ", "deb-src "));
            // A second entry for the same repository with another keyring (apt refuses it too).
            not_used(&format!(
                "{ok}deb [signed-by=/usr/share/keyrings/docker.gpg] https://download.docker.com/linux/ubuntu jammy stable\n"
            ));
            // A second entry that agrees is fine (apt only warns about the duplicate).
            let h = FakeHost::new().file(DOCKER_LIST, format!("{ok}{ok}")).file(DOCKER_ASC, key);
            assert!(docker(&h).is_some());
            // gpum's own file is not the owner's: it is rewritten by the install, as before.
            let ours = render(&DOCKER_UBUNTU, "jammy", "amd64")
                .replace("/etc/apt/keyrings/gpum-docker.gpg", DOCKER_ASC);
            let h = FakeHost::new().file(DOCKER_UBUNTU.sources_path(), ours).file(DOCKER_ASC, key);
            assert_eq!(docker(&h), None);
        }

        #[test]
        fn a_deb822_owner_source_is_used_and_unknown_fields_are_refused() {
            let text = "Types: deb\nURIs: https://download.docker.com/linux/ubuntu\nSuites: jammy\nComponents: stable\nArchitectures: amd64\nSigned-By: /etc/apt/keyrings/docker.asc\n";
            let h = FakeHost::new()
                .file("/etc/apt/sources.list.d/docker.sources", text)
                .file(DOCKER_ASC, DOCKER_UBUNTU.key_copy);
            assert_eq!(docker(&h).unwrap().file, Path::new("/etc/apt/sources.list.d/docker.sources"));
            let h = FakeHost::new()
                .file("/etc/apt/sources.list.d/docker.sources", format!("{text}Trusted: yes\n"))
                .file(DOCKER_ASC, DOCKER_UBUNTU.key_copy);
            assert_eq!(docker(&h), None);
        }
    }

    #[test]
    fn reads_through_the_host() {
        let h = gpum_host::fake::FakeHost::new()
            .file(SOURCES_LIST, "deb http://archive.ubuntu.com/ubuntu jammy main\n")
            .file("/etc/apt/sources.list.d/docker.list", GET_DOCKER_LIST)
            .file("/etc/apt/sources.list.d/readme.txt", "not a source");
        let files = read_apt_sources(&h);
        assert_eq!(files.len(), 2, "{files:?}");
        assert_eq!(conflicts(&files, &DOCKER_UBUNTU).len(), 1);
    }
}
