//! The third-party apt repositories gpum adds, pinned: where they are, what they are called, and
//! which primary-key fingerprints may sign them.
//!
//! A vendor's key rotation is a one-line change: add the new fingerprint to `fingerprints`.
//! Copies of the keys (from `shared/keys/`) are in `keys/` for tests and offline checks.

/// One apt repository and the keys that may sign it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repo {
    /// Short id, used in file names: `/etc/apt/keyrings/<id>.gpg`, `/etc/apt/sources.list.d/<id>.sources`.
    pub id: &'static str,
    /// Where the armored public key is published.
    pub key_url: &'static str,
    /// The deb822 `URIs:` value.
    pub uri: &'static str,
    /// The deb822 `Suites:` value; `None` means the OS codename (`jammy`, `noble`, `bookworm`).
    pub suite: Option<&'static str>,
    /// The deb822 `Components:` value; empty for a flat repository.
    pub components: &'static [&'static str],
    /// Accepted primary-key fingerprints, upper-case hex without spaces.
    pub fingerprints: &'static [&'static str],
    /// The packages this repository provides to gpum.
    pub packages: &'static [&'static str],
    /// The offline copy of the key.
    pub key_copy: &'static [u8],
}

impl Repo {
    pub fn keyring_path(&self) -> String {
        format!("/etc/apt/keyrings/{}.gpg", self.id)
    }
    pub fn sources_path(&self) -> String {
        format!("/etc/apt/sources.list.d/{}.sources", self.id)
    }
}

const DOCKER_FPR: &str = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88";
const NVIDIA_FPR: &str = "C95B321B61E88C1809C4F759DDCAE044F796ECB0";
const DOCKER_PACKAGES: &[&str] =
    &["docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-compose-plugin"];

pub const DOCKER_UBUNTU: Repo = Repo {
    id: "gpum-docker",
    key_url: "https://download.docker.com/linux/ubuntu/gpg",
    uri: "https://download.docker.com/linux/ubuntu",
    suite: None,
    components: &["stable"],
    fingerprints: &[DOCKER_FPR],
    packages: DOCKER_PACKAGES,
    key_copy: include_bytes!("../keys/docker-apt.asc"),
};

pub const DOCKER_DEBIAN: Repo = Repo {
    id: "gpum-docker",
    key_url: "https://download.docker.com/linux/debian/gpg",
    uri: "https://download.docker.com/linux/debian",
    suite: None,
    components: &["stable"],
    fingerprints: &[DOCKER_FPR],
    packages: DOCKER_PACKAGES,
    key_copy: include_bytes!("../keys/docker-apt.asc"),
};

pub const NVIDIA_TOOLKIT: Repo = Repo {
    id: "gpum-nvidia-container-toolkit",
    key_url: "https://nvidia.github.io/libnvidia-container/gpgkey",
    uri: "https://nvidia.github.io/libnvidia-container/stable/deb/amd64",
    suite: Some("/"),
    components: &[],
    fingerprints: &[NVIDIA_FPR],
    packages: &["nvidia-container-toolkit"],
    key_copy: include_bytes!("../keys/nvidia-container-toolkit-apt.asc"),
};

/// Which distribution's Docker repository to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distro {
    Ubuntu,
    Debian,
}

/// The repositories gpum needs on a distribution, in the order they are added.
pub fn repos_for(distro: Distro) -> [Repo; 2] {
    match distro {
        Distro::Ubuntu => [DOCKER_UBUNTU, NVIDIA_TOOLKIT],
        Distro::Debian => [DOCKER_DEBIAN, NVIDIA_TOOLKIT],
    }
}
