//! Image references: which ones gpum runs (issue 44, item 7). One set of rules for the
//! platform, which refuses a rental or probe image it would not run, and for the agent, which
//! refuses anything else whatever the platform sends; so neither can accept what the other
//! refuses.
//!
//! - **Pinned by digest.** Only `name@sha256:<64 hex digits>` is accepted: a tag can be moved
//!   to other content by whoever controls the registry, a digest cannot. A tag together with a
//!   digest (`name:tag@sha256:…`) is refused too, so that what the platform shows is exactly
//!   what runs.
//! - **From an accepted registry** ([`PinnedImage::check_registry`]): the node's
//!   `probe_registries` for the agent, the operator's rental registries for the platform
//!   ([`crate::registry::DEFAULT_REGISTRIES`] when none is set). Any other registry, a loopback
//!   or LAN address included, is refused before anything is pulled.
//!
//! Names follow the engine's own normalisation (`distribution/reference`): a first path
//! component that has a `.` or a `:`, is `localhost`, or has an upper-case letter is a registry;
//! otherwise the registry is `docker.io`, and a single-component name lives under `library/`
//! (`busybox@sha256:…` is `docker.io/library/busybox@sha256:…`). `index.docker.io` is
//! `docker.io`.
//!
//! Pure: no engine call here.

use std::fmt;

use crate::registry::valid_registry;

/// Docker Hub, the registry of names without one.
pub const DOCKER_HUB: &str = "docker.io";
/// The longest reference accepted; the engine's own limit on a name is 255 characters.
pub const MAX_REFERENCE_LEN: usize = 400;

/// Why a reference is refused. The texts name no registry reply and no address beyond the
/// reference itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefError {
    /// No digest, a digest of another algorithm or length, or a tag as well.
    NotPinned,
    /// Not a reference the engine would accept (empty, longer than [`MAX_REFERENCE_LEN`], a
    /// registry that is not `host[:port]`, a malformed path).
    Invalid,
    /// A registry that is not in the accepted list.
    RegistryNotAccepted(String),
}

impl fmt::Display for RefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefError::NotPinned => {
                f.write_str("the image must be pinned by digest: name@sha256:<64 hex digits>, with no tag")
            }
            RefError::Invalid => f.write_str("the image reference is not valid"),
            RefError::RegistryNotAccepted(r) => write!(f, "the image's registry {r} is not an accepted one"),
        }
    }
}

impl std::error::Error for RefError {}

/// An image reference that is pinned by digest and syntactically valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedImage {
    /// `host[:port]`, lower-case; `docker.io` for names without a registry.
    registry: String,
    /// The repository within the registry, e.g. `library/busybox`.
    path: String,
    /// 64 lower-case hex digits.
    hex: String,
}

impl PinnedImage {
    /// Parses `name@sha256:<64 hex>`.
    pub fn parse(reference: &str) -> Result<PinnedImage, RefError> {
        if reference.is_empty() || reference.len() > MAX_REFERENCE_LEN {
            return Err(RefError::Invalid);
        }
        let Some((name, digest)) = reference.split_once('@') else {
            return Err(if valid_name(reference) { RefError::NotPinned } else { RefError::Invalid });
        };
        let hex = digest.strip_prefix("sha256:").ok_or(RefError::NotPinned)?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(RefError::NotPinned);
        }
        let (registry, remainder) = split_registry(name);
        if !valid_registry(registry) {
            return Err(RefError::Invalid);
        }
        let last = remainder.rsplit('/').next().unwrap_or(remainder);
        if last.contains(':') {
            // `name:tag@sha256:…`: the tag is not what runs; refuse it rather than ignore it.
            return Err(RefError::NotPinned);
        }
        if !remainder.split('/').all(valid_component) {
            return Err(RefError::Invalid);
        }
        let registry = canonical_registry(registry);
        let path = if registry == DOCKER_HUB && !remainder.contains('/') {
            format!("library/{remainder}")
        } else {
            remainder.to_string()
        };
        Ok(PinnedImage { registry, path, hex: hex.to_string() })
    }

    /// The registry, e.g. `docker.io`, `nvcr.io`, `127.0.0.1:5000`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// `sha256:<hex>`: the manifest digest, and for an image loaded with `docker load` or
    /// `docker import` (which has no repository digest) its image id.
    pub fn digest(&self) -> String {
        format!("sha256:{}", self.hex)
    }

    /// Whether `accepted` (a node's `probe_registries`, the platform's rental registries) lists
    /// this image's registry, in any spelling of it.
    pub fn check_registry(&self, accepted: &[String]) -> Result<(), RefError> {
        if accepted.iter().any(|r| canonical_registry(r.trim()) == self.registry) {
            Ok(())
        } else {
            Err(RefError::RegistryNotAccepted(self.registry.clone()))
        }
    }

    /// Whether an entry of the engine's `RepoDigests` (e.g. `nvidia/cuda@sha256:…`, as the
    /// engine writes names without their registry) names this very image.
    pub fn is_repo_digest(&self, repo_digest: &str) -> bool {
        PinnedImage::parse(repo_digest).is_ok_and(|d| &d == self)
    }
}

impl fmt::Display for PinnedImage {
    /// The fully qualified form, `registry/path@sha256:hex`, which the engine pulls as is.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@sha256:{}", self.registry, self.path, self.hex)
    }
}

/// The engine's split of a name into registry and remainder (`splitDockerDomain`).
fn split_registry(name: &str) -> (&str, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            (first, rest)
        }
        _ => (DOCKER_HUB, name),
    }
}

/// A registry as the engine names it: lower case, Docker Hub's aliases as `docker.io`.
pub fn canonical_registry(r: &str) -> String {
    let r = r.to_ascii_lowercase();
    if r == "index.docker.io" || r == "registry-1.docker.io" { DOCKER_HUB.to_string() } else { r }
}

/// A path component: lower-case letters and digits, separated by `.`, `_`, `__` or dashes,
/// starting and ending with a letter or digit.
fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b.iter().all(|&x| x.is_ascii_lowercase() || x.is_ascii_digit() || matches!(x, b'.' | b'_' | b'-'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !c.contains("..")
        && !c.contains("___")
}

/// Whether `name` (no digest) is a valid name with an optional tag, to tell "not pinned" from
/// "not a reference at all".
fn valid_name(name: &str) -> bool {
    let (registry, remainder) = split_registry(name);
    let (path, tag) = match remainder.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, Some(t)),
        _ => (remainder, None),
    };
    valid_registry(registry)
        && path.split('/').all(valid_component)
        && tag.is_none_or(|t| {
            !t.is_empty()
                && t.len() <= 128
                && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn p(s: &str) -> Result<PinnedImage, RefError> {
        PinnedImage::parse(s)
    }

    fn accepted() -> Vec<String> {
        crate::registry::DEFAULT_REGISTRIES.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn docker_hub_names_are_normalised_like_the_engine_does() {
        let b = p(&format!("busybox@sha256:{H}")).unwrap();
        assert_eq!(b.registry(), "docker.io");
        assert_eq!(b.to_string(), format!("docker.io/library/busybox@sha256:{H}"));
        assert_eq!(b, p(&format!("docker.io/library/busybox@sha256:{H}")).unwrap());
        assert_eq!(b, p(&format!("index.docker.io/library/busybox@sha256:{H}")).unwrap());
        let c = p(&format!("nvidia/cuda@sha256:{H}")).unwrap();
        assert_eq!(c.to_string(), format!("docker.io/nvidia/cuda@sha256:{H}"));
        // The test host's loaded image: a Docker Hub name, accepted by default.
        let t = p(&format!("gpum-test/probe@sha256:{H}")).unwrap();
        assert_eq!(t.registry(), "docker.io");
        assert!(t.check_registry(&accepted()).is_ok());
        assert_eq!(t.digest(), format!("sha256:{H}"));
    }

    #[test]
    fn registries_with_a_dot_a_port_or_localhost() {
        for (r, reg) in [
            (format!("nvcr.io/nvidia/cuda@sha256:{H}"), "nvcr.io"),
            (format!("ghcr.io/o/r/x@sha256:{H}"), "ghcr.io"),
            (format!("127.0.0.1:5000/x@sha256:{H}"), "127.0.0.1:5000"),
            (format!("192.168.1.10/x@sha256:{H}"), "192.168.1.10"),
            (format!("localhost/x@sha256:{H}"), "localhost"),
            (format!("localhost:5000/x@sha256:{H}"), "localhost:5000"),
            (format!("Registry/x@sha256:{H}"), "registry"),
            (format!("NVCR.IO/nvidia/cuda@sha256:{H}"), "nvcr.io"),
        ] {
            let i = p(&r).unwrap_or_else(|e| panic!("{r}: {e}"));
            assert_eq!(i.registry(), reg, "{r}");
        }
    }

    #[test]
    fn only_accepted_registries_pass() {
        let a = accepted();
        for ok in ["nvcr.io/nvidia/cuda", "ghcr.io/o/x", "busybox", "docker.io/nvidia/cuda"] {
            assert!(p(&format!("{ok}@sha256:{H}")).unwrap().check_registry(&a).is_ok(), "{ok}");
        }
        for bad in [
            "127.0.0.1:5000/x",
            "127.0.0.1/x",
            "localhost/x",
            "localhost:5000/gpum-test/probe",
            "10.0.0.5:443/x",
            "192.168.1.10/nvidia/cuda",
            "evil.example/nvidia/cuda",
            "nvcr.io:5000/nvidia/cuda",
            "docker.io.evil.example/x",
        ] {
            let e = p(&format!("{bad}@sha256:{H}")).unwrap().check_registry(&a).unwrap_err();
            assert!(matches!(e, RefError::RegistryNotAccepted(_)), "{bad}: {e:?}");
        }
        // An owner's own registry, when the config lists it.
        let own = vec!["registry.lan:5000".to_string()];
        assert!(p(&format!("registry.lan:5000/x@sha256:{H}")).unwrap().check_registry(&own).is_ok());
        assert!(p(&format!("busybox@sha256:{H}")).unwrap().check_registry(&own).is_err());
        assert!(p(&format!("busybox@sha256:{H}")).unwrap().check_registry(&[]).is_err());
    }

    #[test]
    fn anything_not_pinned_by_a_sha256_digest_is_refused() {
        for r in [
            "busybox".to_string(),
            "busybox:latest".to_string(),
            "nvidia/cuda:12.4.1-base-ubuntu22.04".to_string(),
            "127.0.0.1:5000/x:1".to_string(),
            format!("busybox@sha256:{}", &H[..63]),
            format!("busybox@sha256:{H}0"),
            format!("busybox@sha256:{}", H.to_uppercase()),
            format!("busybox@sha512:{H}{H}"),
            format!("busybox:1.36@sha256:{H}"),
            format!("busybox@{H}"),
        ] {
            assert_eq!(p(&r), Err(RefError::NotPinned), "{r}");
        }
    }

    #[test]
    fn malformed_references_are_invalid() {
        for r in [
            String::new(),
            format!("Busybox@sha256:{H}"),
            format!("/x@sha256:{H}"),
            format!("x//y@sha256:{H}"),
            format!("-x@sha256:{H}"),
            format!("x y@sha256:{H}"),
            format!("x\n@sha256:{H}"),
            format!("[::1]:5000/x@sha256:{H}"),
            format!("{}@sha256:{H}", "a".repeat(MAX_REFERENCE_LEN)),
            "a b".to_string(),
        ] {
            assert_eq!(p(&r), Err(RefError::Invalid), "{r:?}");
        }
    }

    #[test]
    fn repo_digests_match_in_any_spelling_of_the_same_name() {
        let i = p(&format!("docker.io/library/busybox@sha256:{H}")).unwrap();
        assert!(i.is_repo_digest(&format!("busybox@sha256:{H}")));
        assert!(!i.is_repo_digest(&format!("other@sha256:{H}")));
        assert!(!i.is_repo_digest(&format!("busybox@sha256:{}", H.replace('0', "1"))));
        assert!(!i.is_repo_digest("busybox"));
    }
}
