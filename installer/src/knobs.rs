//! TEST-ONLY knobs, compiled in only with the `test-knobs` cargo feature (release builds and the
//! default build lack it; `cargo xtask e2e` builds a separate installer with it for the test
//! host).
//!
//! With the feature, `/etc/gpum-test/installer.json` (read through the seam, so a scratch root
//! works too) may:
//! - replace the Docker and NVIDIA repositories (URI, suite, components, key URL and pinned
//!   fingerprints) with the test host's local, test-signed ones;
//! - name a release key (armored public key file and its fingerprint) that replaces the
//!   compiled-in one;
//! - name a checkpoint at which the installer kills itself (`crash_at`), to prove that a re-run
//!   converges;
//! - lower the disk check's minimum (`min_free_gb`), since the test host's data root is on
//!   whatever disk the CI machine has.
//!
//! Without the feature every function here answers "no knob": the pinned repositories, the
//! compiled-in release key, no crash. A test (`tests/e2e/testhost` and the unit test below)
//! proves that a build without the feature ignores the file.

use gpum_host::Host;
use gpum_repo_keys::pinned::{self, Distro, Repo};

/// Where the knobs live on a test host.
pub const KNOBS_FILE: &str = "/etc/gpum-test/installer.json";

#[cfg(feature = "test-knobs")]
mod imp {
    use std::path::Path;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    pub struct RepoOverride {
        pub uri: String,
        pub suite: Option<String>,
        #[serde(default)]
        pub components: Vec<String>,
        pub key_url: String,
        pub fingerprints: Vec<String>,
    }

    #[derive(Debug, Deserialize, Default)]
    pub struct Knobs {
        #[serde(default)]
        pub repos: Option<Repos>,
        #[serde(default)]
        pub release_key: Option<String>,
        #[serde(default)]
        pub release_fingerprint: Option<String>,
        #[serde(default)]
        pub crash_at: Option<String>,
        #[serde(default)]
        pub min_free_gb: Option<u64>,
    }

    #[derive(Debug, Deserialize)]
    pub struct Repos {
        pub docker: RepoOverride,
        pub nvidia: RepoOverride,
    }

    pub fn load(host: &dyn Host) -> Knobs {
        match host.read(Path::new(KNOBS_FILE)) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{KNOBS_FILE}: {e}")),
            Err(_) => Knobs::default(),
        }
    }

    fn leak(s: &str) -> &'static str {
        Box::leak(s.to_string().into_boxed_str())
    }

    fn leak_all(v: &[String]) -> &'static [&'static str] {
        Box::leak(v.iter().map(|s| leak(s)).collect::<Vec<_>>().into_boxed_slice())
    }

    pub fn apply(base: Repo, o: &RepoOverride) -> Repo {
        Repo {
            uri: leak(&o.uri),
            suite: o.suite.as_deref().map(leak),
            components: leak_all(&o.components),
            key_url: leak(&o.key_url),
            fingerprints: leak_all(&o.fingerprints),
            ..base
        }
    }
}

/// The repositories to add on `distro`: the pinned ones, or the test host's with the feature.
pub fn repos_for(host: &dyn Host, distro: Distro) -> [Repo; 2] {
    let pinned = pinned::repos_for(distro);
    #[cfg(feature = "test-knobs")]
    if let Some(r) = imp::load(host).repos {
        return [imp::apply(pinned[0], &r.docker), imp::apply(pinned[1], &r.nvidia)];
    }
    let _ = host;
    pinned
}

/// An armored release key and its pinned fingerprint that replace the compiled-in ones
/// (feature only).
pub fn release_key(host: &dyn Host) -> Option<(Vec<u8>, String)> {
    #[cfg(feature = "test-knobs")]
    {
        let k = imp::load(host);
        if let (Some(p), Some(f)) = (k.release_key, k.release_fingerprint) {
            let key = host.read(std::path::Path::new(&p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            return Some((key, f));
        }
    }
    let _ = host;
    None
}

/// Called at each named checkpoint of the install; with the feature and a matching `crash_at`,
/// the process dies there as a power cut would (SIGKILL: no cleanup, no destructor).
pub fn checkpoint(host: &dyn Host, name: &str) {
    #[cfg(feature = "test-knobs")]
    if imp::load(host).crash_at.as_deref() == Some(name) {
        eprintln!("gpum-install: TEST crash at checkpoint {name}");
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = (host, name);
}

/// The disk check's minimum, in bytes, when the knobs lower it (feature only): a test host's
/// Docker data root sits on whatever disk the CI machine has, so its scenarios set a small
/// minimum and prove the check with a data root smaller still.
pub fn min_free_bytes(host: &dyn Host) -> Option<u64> {
    #[cfg(feature = "test-knobs")]
    if let Some(gb) = imp::load(host).min_free_gb {
        return Some(gb * 1_000_000_000);
    }
    let _ = host;
    None
}

/// Whether this build has the knobs, for `--version` and the tests.
pub const ENABLED: bool = cfg!(feature = "test-knobs");

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn knobs_file_is_honoured_only_with_the_feature() {
        let file = r#"{"repos": {
            "docker": {"uri": "http://127.0.0.1:8088/docker", "suite": "bookworm", "components": ["stable"],
                       "key_url": "http://127.0.0.1:8088/docker.asc", "fingerprints": ["AAAA"]},
            "nvidia": {"uri": "http://127.0.0.1:8088/nvidia", "suite": "/", "components": [],
                       "key_url": "http://127.0.0.1:8088/nvidia.asc", "fingerprints": ["BBBB"]}}}"#;
        let h = FakeHost::new().file(KNOBS_FILE, file);
        let [d, n] = repos_for(&h, Distro::Debian);
        if ENABLED {
            assert_eq!(d.uri, "http://127.0.0.1:8088/docker");
            assert_eq!(d.fingerprints, ["AAAA"]);
            assert_eq!(d.id, pinned::DOCKER_DEBIAN.id, "ids and packages stay gpum's");
            assert_eq!(n.suite, Some("/"));
        } else {
            assert_eq!(
                [d, n],
                pinned::repos_for(Distro::Debian),
                "a build without the feature must ignore {KNOBS_FILE}"
            );
        }
        let h = FakeHost::new().file(KNOBS_FILE, r#"{"min_free_gb": 5}"#);
        assert_eq!(min_free_bytes(&h), ENABLED.then_some(5_000_000_000));
    }
}
