//! `/proc/self/mountinfo` (proc(5)): which mount holds a path, with which options.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    /// Per-mount options (field 6): `rw`, `noexec`, `nosuid`, …
    pub options: Vec<String>,
    pub fstype: String,
    pub source: String,
    /// The filesystem's own options (the last field): XFS's `prjquota`/`pquota` are here.
    pub super_options: Vec<String>,
}

impl Mount {
    pub fn has(&self, opt: &str) -> bool {
        self.options.iter().any(|o| o == opt)
    }

    /// Whether the filesystem enforces project quotas, which Docker's overlay2 needs for a
    /// container's `--storage-opt size=` (XFS mounted with `prjquota`, or its alias `pquota`).
    pub fn has_project_quota(&self) -> bool {
        self.fstype == "xfs" && self.super_options.iter().any(|o| o == "prjquota" || o == "pquota")
    }
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses every well-formed line; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            // id parent maj:min root mount-point options [optional…] - fstype source super-options
            let sep = f.iter().position(|x| *x == "-")?;
            if sep < 6 || f.len() < sep + 3 {
                return None;
            }
            Some(Mount {
                mount_point: PathBuf::from(unescape(f[4])),
                options: f[5].split(',').map(str::to_string).collect(),
                fstype: f[sep + 1].to_string(),
                source: unescape(f[sep + 2]),
                super_options: f
                    .get(sep + 3)
                    .map(|o| o.split(',').map(str::to_string).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The mount that holds `path`: the longest mount point that is a prefix of it, and of equal
/// ones the last (a later mount hides an earlier one at the same place).
pub fn mount_for<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let mut best: Option<&Mount> = None;
    for m in mounts {
        if path.starts_with(&m.mount_point)
            && best.is_none_or(|b| m.mount_point.components().count() >= b.mount_point.components().count())
        {
            best = Some(m);
        }
    }
    best
}

/// [`mount_for`] over the text of a mountinfo, without parsing every line: only the line of
/// the mount found is parsed whole. The same answer as `mount_for(&parse(text), path)`, for a
/// caller that needs one mount (the agent rereads mountinfo every few minutes; parsing all of
/// it was most of that reread).
pub fn mount_for_in(text: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<(&str, usize)> = None;
    for line in text.lines() {
        let Some(point) = line.split(' ').nth(4) else { continue };
        let point = if point.contains('\\') { PathBuf::from(unescape(point)) } else { PathBuf::from(point) };
        if !path.starts_with(&point) {
            continue;
        }
        // The same well-formedness rule as [`parse`]: a `-` separator after at least six
        // fields, and three fields after it.
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.iter().position(|x| *x == "-") {
            Some(sep) if sep >= 6 && fields.len() >= sep + 3 => {}
            _ => continue,
        }
        let depth = point.components().count();
        if best.is_none_or(|(_, d)| depth >= d) {
            best = Some((line, depth));
        }
    }
    parse(best?.0).pop()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::fixture;

    #[test]
    fn xfs_project_quota_is_in_the_super_options() {
        let t = "36 25 253:1 / /var/lib/docker rw,relatime shared:1 - xfs /dev/mapper/vg-docker rw,attr2,inode64,logbufs=8,logbsize=32k,prjquota\n\
                 37 25 253:2 / /srv rw,relatime shared:2 - xfs /dev/sdb1 rw,attr2,inode64,logbufs=8,logbsize=32k,noquota\n\
                 38 25 253:3 / /data rw,relatime shared:3 - ext4 /dev/sdc1 rw,prjquota\n";
        let m = parse(t);
        assert!(m[0].has_project_quota(), "{m:?}");
        assert!(!m[0].has("prjquota"), "a super option, not a per-mount one");
        assert!(!m[1].has_project_quota());
        assert!(!m[2].has_project_quota(), "overlay2's size limit is XFS's alone");
        let pq = "39 25 253:4 / /x rw - xfs /dev/sdd rw,pquota\n";
        assert!(parse(pq)[0].has_project_quota());
    }

    #[test]
    fn debian12_container_captured() {
        let m = parse(&fixture("debian12-container.mountinfo"));
        assert_eq!(m.len(), 21);
        let tmp = mount_for(&m, Path::new("/tmp")).unwrap();
        assert_eq!(tmp.mount_point, Path::new("/"));
        assert_eq!(tmp.fstype, "ext4");
        assert!(!tmp.has("noexec"));
        let d = mount_for(&m, Path::new("/var/lib/docker/overlay2")).unwrap();
        assert_eq!(d.mount_point, Path::new("/var/lib/docker"));
        assert!(mount_for(&m, Path::new("/dev/shm/x")).unwrap().mount_point == Path::new("/dev/shm"));
    }

    #[test]
    fn noexec_tmpfs_captured() {
        // Captured with `unshare -m` + `mount -t tmpfs -o noexec,nosuid,nodev tmpfs /tmp/pfx` and a
        // second tmpfs whose source has a space.
        let m = parse(&fixture("debian12-noexec-tmpfs.mountinfo"));
        let t = mount_for(&m, Path::new("/tmp/pfx/sub")).unwrap();
        assert_eq!(t.fstype, "tmpfs");
        assert!(t.has("noexec") && t.has("nosuid"));
        assert!(!mount_for(&m, Path::new("/tmp/pfxx")).unwrap().has("noexec"), "prefix is by component");
        assert_eq!(mount_for(&m, Path::new("/mnt")).unwrap().source, "my tmp");
    }

    #[test]
    fn ubuntu_noexec_tmp_reconstructed() {
        let m = parse(&fixture("ubuntu2204-noexec-tmp.mountinfo"));
        let t = mount_for(&m, Path::new("/tmp")).unwrap();
        assert!(t.has("noexec"));
        assert!(!mount_for(&m, Path::new("/var/tmp")).unwrap().has("noexec"));
    }

    #[test]
    fn one_mount_from_the_text_is_the_one_from_the_parse() {
        let garbage = "garbage line\n1 2 3 - x\n\n";
        for name in [
            "debian12-container.mountinfo",
            "debian12-noexec-tmpfs.mountinfo",
            "ubuntu2204-noexec-tmp.mountinfo",
        ] {
            let text = format!("{garbage}{}", fixture(name));
            let all = parse(&text);
            for p in [
                "/",
                "/tmp",
                "/tmp/pfx/sub",
                "/tmp/pfxx",
                "/mnt",
                "/var/lib/docker/overlay2",
                "/dev/shm/x",
                "/var/tmp",
                "/nonexistent/x",
            ] {
                assert_eq!(
                    mount_for_in(&text, Path::new(p)),
                    mount_for(&all, Path::new(p)).cloned(),
                    "{name} {p}"
                );
            }
        }
        assert_eq!(mount_for_in("", Path::new("/")), None);
    }

    #[test]
    fn escapes_and_garbage() {
        assert_eq!(unescape("a\\040b\\134c"), "a b\\c");
        assert_eq!(unescape("tail\\04"), "tail\\04");
        assert!(parse("garbage line\n\n1 2 3").is_empty());
        let m =
            parse("36 35 98:0 /mnt1 /mnt\\040x rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n");
        assert_eq!(m[0].mount_point, Path::new("/mnt x"));
        assert_eq!(m[0].fstype, "ext3");
    }
}
