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
//! The file is read once, into [`Knobs`], at the program's entry point ([`crate::run`]), and
//! the struct is passed down. Without the feature [`Knobs`] holds nothing and answers "no
//! knob": the pinned repositories, the compiled-in release key, checkpoints that go on. A test
//! (`tests/e2e/testhost` and the unit test below) proves that a build without the feature
//! ignores the file.

use std::ops::ControlFlow;

use gpum_host::Host;
use gpum_repo_keys::pinned::{self, Distro, Repo};

use crate::apply::Checkpoints;

/// Where the knobs live on a test host.
pub const KNOBS_FILE: &str = "/etc/gpum-test/installer.json";

#[cfg(feature = "test-knobs")]
mod imp {
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

    /// The file, as written.
    #[derive(Debug, Deserialize, Default)]
    pub struct File {
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

    pub fn load(host: &dyn Host) -> File {
        match host.read(std::path::Path::new(KNOBS_FILE)) {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{KNOBS_FILE}: {e}")),
            Err(_) => File::default(),
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

/// What the installer may be told by a test host, loaded once at the program's entry point
/// ([`crate::run`]) and passed down. Without the feature it holds nothing and every answer is
/// the release one: the pinned repositories, the compiled-in release key, the check's own disk
/// minimum, and checkpoints that go straight on.
#[derive(Debug, Default)]
pub struct Knobs {
    #[cfg(feature = "test-knobs")]
    file: imp::File,
}

impl Knobs {
    /// The release values: what every build without the feature has, and what a unit test gets.
    pub fn release() -> Knobs {
        Knobs::default()
    }

    /// Reads [`KNOBS_FILE`] through the seam (so a scratch root works too) with the feature;
    /// without it, reads nothing and is [`Knobs::release`].
    pub fn load(host: &dyn Host) -> Knobs {
        #[cfg(feature = "test-knobs")]
        return Knobs { file: imp::load(host) };
        #[cfg(not(feature = "test-knobs"))]
        {
            let _ = host;
            Knobs::release()
        }
    }

    /// The repositories to add on `distro`: the pinned ones, or the test host's.
    pub fn repos_for(&self, distro: Distro) -> [Repo; 2] {
        let pinned = pinned::repos_for(distro);
        #[cfg(feature = "test-knobs")]
        if let Some(r) = &self.file.repos {
            return [imp::apply(pinned[0], &r.docker), imp::apply(pinned[1], &r.nvidia)];
        }
        pinned
    }

    /// An armored release key (read from the file the knobs name) and its pinned fingerprint,
    /// which replace the compiled-in ones; `None`: the compiled-in ones.
    pub fn release_key(&self, host: &dyn Host) -> Option<(Vec<u8>, String)> {
        #[cfg(feature = "test-knobs")]
        if let (Some(p), Some(f)) = (&self.file.release_key, &self.file.release_fingerprint) {
            let key = host.read(std::path::Path::new(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            return Some((key, f.clone()));
        }
        let _ = host;
        None
    }

    /// The disk check's minimum, in bytes, when the knobs lower it: a test host's Docker data
    /// root sits on whatever disk the CI machine has, so its scenarios set a small minimum and
    /// prove the check with a data root smaller still.
    pub fn min_free_bytes(&self) -> Option<u64> {
        #[cfg(feature = "test-knobs")]
        if let Some(gb) = self.file.min_free_gb {
            return Some(gb * 1_000_000_000);
        }
        None
    }
}

/// The install's checkpoints as the binary has them: with the feature and a matching
/// `crash_at`, the process dies there as a power cut would (SIGKILL: no cleanup, no destructor;
/// the test host's `crash-rerun` expects exit 137 and `checkpoint NAME` on stderr). Otherwise
/// the install goes on.
impl Checkpoints for Knobs {
    fn reached(&self, name: &str) -> ControlFlow<()> {
        #[cfg(feature = "test-knobs")]
        if self.file.crash_at.as_deref() == Some(name) {
            eprintln!("gpum-install: TEST crash at checkpoint {name}");
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = name;
        ControlFlow::Continue(())
    }
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
        let [d, n] = Knobs::load(&h).repos_for(Distro::Debian);
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
        assert_eq!(Knobs::load(&h).min_free_bytes(), ENABLED.then_some(5_000_000_000));
        // Loaded once: a file changed later is not read again.
        let k = Knobs::load(&h);
        let _ = h.remove_file(std::path::Path::new(KNOBS_FILE));
        assert_eq!(k.min_free_bytes(), ENABLED.then_some(5_000_000_000));
        assert_eq!(Knobs::release().min_free_bytes(), None, "the release values lower nothing");
        assert_eq!(Knobs::release().repos_for(Distro::Debian), pinned::repos_for(Distro::Debian));
    }

    #[test]
    fn a_crash_at_another_checkpoint_goes_on() {
        let h = FakeHost::new().file(KNOBS_FILE, r#"{"crash_at": "gpu_check"}"#);
        assert_eq!(Knobs::load(&h).reached("apt_update"), ControlFlow::Continue(()));
        assert_eq!(Knobs::release().reached("gpu_check"), ControlFlow::Continue(()));
    }
}
