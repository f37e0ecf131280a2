//! `config.toml`: where the agent finds its platform, its node id and its token.
//!
//! The file is the whole configuration of `run`: no flag, no environment variable carries the
//! token, so it never shows in `/proc/<pid>/cmdline` or `environ`. It is written 0600 from
//! creation through [`Host::write_atomic`]. A missing or invalid file is a configuration error,
//! on which the service exits 78 and systemd leaves it stopped.

use std::path::{Path, PathBuf};

use gpum_common::agent_state::{DEFAULT_CONFIG, DEFAULT_STATE_DIR};
use gpum_host::Host;
use serde::{Deserialize, Serialize};

use crate::secret::Token;

pub use gpum_protocol::registry::{DEFAULT_REGISTRIES, valid_registry};

/// `compute` and `utility` (CUDA and NVML/`nvidia-smi`): the parts of the driver a rental may
/// get when the config names none, the toolkit's own default.
pub fn default_rental_driver_capabilities() -> Vec<String> {
    gpum_protocol::driver::DEFAULT_DRIVER_CAPABILITIES.iter().map(|s| s.to_string()).collect()
}

/// The most registries `probe_registries` may list.
pub const MAX_PROBE_REGISTRIES: usize = 32;

/// [`DEFAULT_REGISTRIES`], owned.
pub fn default_registries() -> Vec<String> {
    DEFAULT_REGISTRIES.iter().map(|s| s.to_string()).collect()
}

/// Checks and normalises a `probe_registries` list (from the file, `--probe-registry` or the
/// installer): each entry `host` or `host:port`, lower-cased, no duplicates.
pub fn check_registries(list: Vec<String>) -> Result<Vec<String>, String> {
    if list.len() > MAX_PROBE_REGISTRIES {
        return Err(format!("probe_registries lists more than {MAX_PROBE_REGISTRIES} registries"));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for r in list {
        let r = r.trim().to_ascii_lowercase();
        if !valid_registry(&r) {
            return Err(format!("probe_registries: {r:?} is not a registry (host or host:port)"));
        }
        if !out.contains(&r) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Name of the config file inside a `--state` directory.
pub const CONFIG_FILE: &str = "config.toml";

/// Where `gpum-install --ca-file` puts its copy of the owner's CA (root's, 0644), the file the
/// installed agent's `ca_file` names: the agent reads its CA at every start, so it must not be
/// a path the owner named once, wherever that is and whoever can change it later.
pub const INSTALLED_CA: &str = "/etc/gpum-agent/ca.pem";

/// Where the agent reads its config and keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub state_dir: PathBuf,
    pub config: PathBuf,
    /// Whether these are the system paths (`/etc/gpum-agent`, `/var/lib/gpum-agent`), which only
    /// root may read.
    pub system: bool,
}

impl Paths {
    /// `--state DIR` puts everything in DIR; without it the system paths are used.
    pub fn resolve(state: Option<&Path>) -> Paths {
        match state {
            Some(dir) => {
                let dir = absolute(dir);
                Paths { config: dir.join(CONFIG_FILE), state_dir: dir, system: false }
            }
            None => Paths {
                state_dir: PathBuf::from(DEFAULT_STATE_DIR),
                config: PathBuf::from(DEFAULT_CONFIG),
                system: true,
            },
        }
    }
}

/// The host seam maps paths under its root and ignores `.`/`..`, so a relative `--state` is
/// made absolute against the working directory first.
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Base URL of the platform, `https://…` (or `http://` to loopback).
    pub server: String,
    pub node_id: String,
    pub token: Token,
    /// An extra trusted CA (PEM file) for a platform with a private CA, such as a test or
    /// development platform. It adds a root; it never turns verification off. Read at every
    /// start; the installer's is its own copy, [`INSTALLED_CA`].
    pub ca_file: Option<PathBuf>,
    /// The Docker socket; `/var/run/docker.sock` when absent.
    pub docker_socket: Option<PathBuf>,
    /// The registries the GPU probe's image may come from (`host` or `host:port`; Docker Hub is
    /// `docker.io`). Set at install; [`DEFAULT_REGISTRIES`] when the file names none. An image
    /// from any other registry is refused before anything is pulled.
    pub probe_registries: Vec<String>,
    /// Whether this machine runs the platform's rentals. On by default (the agent's nftables
    /// table cuts a rental off from the owner's network, and no rental starts without it); the
    /// owner writes `rentals = false` in the file to refuse them, and a listed rental is then
    /// reported `failed` with why. Written to the file only when off, so `register` never
    /// writes it.
    pub rentals: bool,
    /// The parts of the NVIDIA driver a rental on this machine may get
    /// (`NVIDIA_DRIVER_CAPABILITIES`, names of `gpum_protocol::driver::DRIVER_CAPABILITIES`):
    /// the owner's bound on what the platform may ask for (issue 43), as `probe_registries`
    /// bounds its images. [`default_rental_driver_capabilities`] (`compute`, `utility`) when the
    /// file names none, and written only when it differs.
    pub rental_driver_capabilities: Vec<String>,
    /// Whether the agent upgrades itself when the platform offers a newer signed release
    /// (issue 47). On by default; the owner writes `auto_update = false` in the file to turn
    /// it off (the agent then reports it, and the platform offers nothing). Written to the
    /// file only when off, and kept by `configure` and a new registration.
    pub auto_update: bool,
    /// TEST ONLY: a `gpum.test.KEY=VALUE` label that narrows every container the agent lists,
    /// removes or creates to those carrying it, so end-to-end tests sharing one engine never
    /// touch each other's containers. Never written by `register`. Read from the file only with
    /// the `test-knobs` feature; always `None` in a release build.
    pub test_docker_scope: Option<(String, String)>,
    /// TEST ONLY, and only with `test_docker_scope`: how long a managed container must be
    /// unknown before the reconciler removes it, instead of
    /// the agent's `docker::reconcile::MIN_AGE` (60 s), so that an end-to-end test can watch the
    /// real agent remove one. The three-answers rule stays. Read only with `test-knobs`.
    pub test_reconcile_min_age: Option<std::time::Duration>,
    /// TEST ONLY, and only with `test_docker_scope`: run rentals without asking the engine for
    /// their GPUs (the agent's fenced seam for an engine without the NVIDIA toolkit; `gpum-test/`
    /// images only), so that an end-to-end test can watch the real agent run one. Read only with
    /// `test-knobs`.
    pub test_rentals_without_gpu_request: bool,
    /// TEST ONLY: how long the agent's tunnel may hear nothing from the relay before it is
    /// dropped and dialled again, instead of `gpum_protocol::tunnel::SILENCE` (60 s), so that an
    /// end-to-end test can cut the network and watch the tunnel come back. Read only with
    /// `test-knobs`.
    pub test_tunnel_silence: Option<std::time::Duration>,
}

/// The file's shape. Unknown keys are refused so that a typo is a visible configuration error
/// rather than a silently ignored setting.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    server: String,
    node_id: String,
    token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    docker_socket: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    probe_registries: Option<Vec<String>>,
    #[serde(default = "on", skip_serializing_if = "is_on")]
    rentals: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rental_driver_capabilities: Option<Vec<String>>,
    #[serde(default = "on", skip_serializing_if = "is_on")]
    auto_update: bool,
    // Without `test-knobs` these keys do not exist, and `deny_unknown_fields` refuses them.
    #[cfg(feature = "test-knobs")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    test_docker_scope: Option<String>,
    #[cfg(feature = "test-knobs")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    test_reconcile_min_age_secs: Option<u64>,
    #[cfg(feature = "test-knobs")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    test_rentals_without_gpu_request: bool,
    #[cfg(feature = "test-knobs")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    test_tunnel_silence_ms: Option<u64>,
}

fn on() -> bool {
    true
}

fn is_on(b: &bool) -> bool {
    *b
}

/// What is wrong with a config file; the text goes into «ошибка конфигурации: …».
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{0} is missing")]
    Missing(String),
    #[error("cannot read {0}: {1}")]
    Unreadable(String, String),
    #[error("{0} is not valid: {1}")]
    Invalid(String, String),
}

impl ConfigError {
    /// Permission problems are not configuration errors of the agent; `status` and the CLI
    /// turn them into "needs root".
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, ConfigError::Unreadable(_, e) if e.contains("ermission denied"))
    }
}

impl Config {
    /// Parses the text of a config file. `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let invalid = |why: String| ConfigError::Invalid(origin.to_string(), why);
        // toml's error text quotes the offending line, which could be the token line: keep
        // only its first line's message without the excerpt.
        let f: ConfigFile = toml::from_str(text).map_err(|e| invalid(e.message().to_string()))?;
        gpum_host::http::check_url(&f.server).map_err(|e| invalid(format!("server: {e}")))?;
        if f.node_id.trim().is_empty() {
            return Err(invalid("node_id is empty".into()));
        }
        let token = Token::new(&f.token).ok_or_else(|| invalid("token is empty or malformed".into()))?;
        #[cfg(feature = "test-knobs")]
        let (test_docker_scope, test_reconcile_min_age) = {
            let scope = match &f.test_docker_scope {
                None => None,
                Some(s) => match s.split_once('=') {
                    Some((k, v)) if k.starts_with("gpum.test.") && !v.is_empty() => {
                        Some((k.to_string(), v.to_string()))
                    }
                    _ => return Err(invalid("test_docker_scope must be gpum.test.KEY=VALUE".into())),
                },
            };
            if f.test_reconcile_min_age_secs.is_some() && scope.is_none() {
                return Err(invalid("test_reconcile_min_age_secs needs test_docker_scope".into()));
            }
            if f.test_rentals_without_gpu_request && scope.is_none() {
                return Err(invalid("test_rentals_without_gpu_request needs test_docker_scope".into()));
            }
            (scope, f.test_reconcile_min_age_secs.map(std::time::Duration::from_secs))
        };
        #[cfg(feature = "test-knobs")]
        let test_rentals_without_gpu_request = f.test_rentals_without_gpu_request;
        #[cfg(feature = "test-knobs")]
        let test_tunnel_silence = f.test_tunnel_silence_ms.map(std::time::Duration::from_millis);
        #[cfg(not(feature = "test-knobs"))]
        let (
            test_docker_scope,
            test_reconcile_min_age,
            test_rentals_without_gpu_request,
            test_tunnel_silence,
        ) = (None, None, false, None);
        let probe_registries = match f.probe_registries {
            None => default_registries(),
            Some(list) => check_registries(list).map_err(invalid)?,
        };
        let rental_driver_capabilities = match f.rental_driver_capabilities {
            None => default_rental_driver_capabilities(),
            Some(list) => {
                gpum_protocol::driver::check_driver_capabilities(&list)
                    .map_err(|e| invalid(format!("rental_{e}")))?;
                list
            }
        };
        Ok(Config {
            server: f.server.trim_end_matches('/').to_string(),
            node_id: f.node_id,
            token,
            ca_file: f.ca_file,
            docker_socket: f.docker_socket,
            probe_registries,
            rentals: f.rentals,
            rental_driver_capabilities,
            auto_update: f.auto_update,
            test_docker_scope,
            test_reconcile_min_age,
            test_rentals_without_gpu_request,
            test_tunnel_silence,
        })
    }

    /// Reads and parses `path`.
    pub fn load(host: &dyn Host, path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        match host.read_to_string(path) {
            Ok(text) => Config::parse(&text, &origin),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ConfigError::Missing(origin)),
            Err(e) => Err(ConfigError::Unreadable(origin, e.to_string())),
        }
    }

    /// The file's text. It holds the token: write it only with mode 0600.
    pub fn to_toml(&self) -> String {
        let f = ConfigFile {
            server: self.server.clone(),
            node_id: self.node_id.clone(),
            token: self.token.expose().to_string(),
            ca_file: self.ca_file.clone(),
            docker_socket: self.docker_socket.clone(),
            probe_registries: Some(self.probe_registries.clone()),
            rentals: self.rentals,
            rental_driver_capabilities: (self.rental_driver_capabilities
                != default_rental_driver_capabilities())
            .then(|| self.rental_driver_capabilities.clone()),
            auto_update: self.auto_update,
            #[cfg(feature = "test-knobs")]
            test_docker_scope: self.test_docker_scope.as_ref().map(|(k, v)| format!("{k}={v}")),
            #[cfg(feature = "test-knobs")]
            test_reconcile_min_age_secs: self.test_reconcile_min_age.map(|d| d.as_secs()),
            #[cfg(feature = "test-knobs")]
            test_rentals_without_gpu_request: self.test_rentals_without_gpu_request,
            #[cfg(feature = "test-knobs")]
            test_tunnel_silence_ms: self.test_tunnel_silence.map(|d| d.as_millis() as u64),
        };
        toml::to_string(&f).expect("config serializes")
    }

    /// Writes the file atomically with mode 0600 from creation, creating its directory (0700)
    /// when missing.
    pub fn save(&self, host: &dyn Host, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent()
            && !host.is_dir(dir)
        {
            host.create_dir_all(dir, 0o700)?;
        }
        host.write_atomic(path, self.to_toml().as_bytes(), 0o600)
    }

    /// The extra CA's PEM, when configured.
    pub fn extra_roots(&self, host: &dyn Host) -> Result<Vec<Vec<u8>>, ConfigError> {
        match &self.ca_file {
            None => Ok(Vec::new()),
            Some(p) => host
                .read(p)
                .map(|b| vec![b])
                .map_err(|e| ConfigError::Unreadable(p.display().to_string(), e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    fn sample() -> Config {
        Config {
            server: "https://gpum.example".into(),
            node_id: "n-1".into(),
            token: Token::new("tok-secret").unwrap(),
            ca_file: None,
            docker_socket: None,
            rentals: true,
            probe_registries: default_registries(),
            rental_driver_capabilities: default_rental_driver_capabilities(),
            auto_update: true,
            test_docker_scope: None,
            test_reconcile_min_age: None,
            test_rentals_without_gpu_request: false,
            test_tunnel_silence: None,
        }
    }

    #[test]
    fn roundtrip_and_0600() {
        let h = FakeHost::new();
        let p = Path::new("/s/config.toml");
        sample().save(&h, p).unwrap();
        assert_eq!(Config::load(&h, p).unwrap(), sample());
        assert!(h.writes().contains(&p.to_path_buf()));
    }

    #[test]
    fn errors_are_config_errors_without_the_token() {
        let h = FakeHost::new();
        assert!(matches!(Config::load(&h, Path::new("/nope")), Err(ConfigError::Missing(_))));
        let bad = [
            "server = 'http://10.0.0.1'\nnode_id='n'\ntoken='tok-secret'",
            "server = 'https://x'\nnode_id=''\ntoken='tok-secret'",
            "server = 'https://x'\nnode_id='n'\ntoken=''",
            "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\nextra=1",
            "server = 'https://x'\nnode_id='n'\ntoken='tok-secret",
            "garbage",
            "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\ntest_docker_scope='gpum.managed=true'",
            "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\ntest_reconcile_min_age_secs=0",
            "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\ntest_rentals_without_gpu_request=true",
        ];
        for b in bad {
            let e = Config::parse(b, "c").unwrap_err();
            assert!(matches!(e, ConfigError::Invalid(..)), "{b}: {e:?}");
            assert!(!e.to_string().contains("tok-secret"), "{e}");
        }
    }

    /// A release build (no `test-knobs`) refuses the test keys as unknown: no config file can
    /// narrow what the agent sees or shorten the reconciler's grace.
    #[cfg(not(feature = "test-knobs"))]
    #[test]
    fn test_knobs_are_unknown_keys_without_the_feature() {
        for knob in [
            "test_docker_scope='gpum.test.s=1'",
            "test_reconcile_min_age_secs=0",
            "test_rentals_without_gpu_request=true",
        ] {
            let text = format!("server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\n{knob}");
            let e = Config::parse(&text, "c").unwrap_err();
            assert!(matches!(&e, ConfigError::Invalid(_, why) if why.contains("unknown field")), "{e:?}");
        }
    }

    #[cfg(feature = "test-knobs")]
    #[test]
    fn the_test_reconcile_age_comes_only_with_a_test_scope_and_roundtrips() {
        let text = "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\n\
                    test_docker_scope='gpum.test.s=1'\ntest_reconcile_min_age_secs=0";
        let c = Config::parse(text, "c").unwrap();
        assert_eq!(c.test_reconcile_min_age, Some(std::time::Duration::ZERO));
        assert_eq!(Config::parse(&c.to_toml(), "c").unwrap(), c);
        assert_eq!(sample().test_reconcile_min_age, None);
        assert!(!sample().to_toml().contains("test_reconcile"));
    }

    /// Rentals are on unless the owner writes `rentals = false` (the egress table is in place
    /// before any rental starts); a register never writes the key, and an owner's `false`
    /// survives a save.
    #[test]
    fn rentals_are_on_unless_the_owner_turns_them_off() {
        let base = "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\n";
        assert!(Config::parse(base, "c").unwrap().rentals);
        assert!(!sample().to_toml().contains("rentals"));
        assert!(Config::parse(&format!("{base}rentals = true\n"), "c").unwrap().rentals);
        let off = Config::parse(&format!("{base}rentals = false\n"), "c").unwrap();
        assert!(!off.rentals);
        assert!(off.to_toml().contains("rentals = false"));
        assert_eq!(Config::parse(&off.to_toml(), "c").unwrap(), off);
        assert!(Config::parse(&format!("{base}rentals = 'yes'\n"), "c").is_err());
    }

    /// Issue 47: automatic upgrades are on unless the owner writes `auto_update = false`;
    /// a register never writes the key, and the owner's `false` survives a save.
    #[test]
    fn auto_update_is_on_unless_the_owner_turns_it_off() {
        let base = "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\n";
        assert!(Config::parse(base, "c").unwrap().auto_update);
        assert!(!sample().to_toml().contains("auto_update"));
        let off = Config::parse(&format!("{base}auto_update = false\n"), "c").unwrap();
        assert!(!off.auto_update);
        assert!(off.to_toml().contains("auto_update = false"));
        assert_eq!(Config::parse(&off.to_toml(), "c").unwrap(), off);
        assert!(Config::parse(&format!("{base}auto_update = 'no'\n"), "c").is_err());
    }

    /// Issue 43: the owner's bound on the driver's parts a rental may get: `compute,utility`
    /// unless the file says otherwise, only the toolkit's names, written only when not the
    /// default.
    #[test]
    fn rental_driver_capabilities_default_are_checked_and_roundtrip() {
        let base = "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\n";
        let c = Config::parse(base, "c").unwrap();
        assert_eq!(c.rental_driver_capabilities, ["compute", "utility"]);
        assert!(!c.to_toml().contains("rental_driver_capabilities"));
        let c = Config::parse(
            &format!("{base}rental_driver_capabilities = ['compute', 'utility', 'video']"),
            "c",
        )
        .unwrap();
        assert_eq!(c.rental_driver_capabilities, ["compute", "utility", "video"]);
        assert_eq!(Config::parse(&c.to_toml(), "c").unwrap(), c);
        for bad in ["['all']", "['compute', 'compute']", "['gpu']", "'compute'"] {
            let e = Config::parse(&format!("{base}rental_driver_capabilities = {bad}"), "c").unwrap_err();
            assert!(matches!(e, ConfigError::Invalid(..)), "{bad}: {e:?}");
        }
    }

    #[test]
    fn probe_registries_default_are_checked_and_roundtrip() {
        let base = "server = 'https://x'\nnode_id='n'\ntoken='tok-secret'\n";
        let c = Config::parse(base, "c").unwrap();
        assert_eq!(c.probe_registries, ["docker.io", "nvcr.io", "ghcr.io"]);
        let c = Config::parse(
            &format!("{base}probe_registries = ['Registry.LAN:5000', 'nvcr.io', 'nvcr.io']"),
            "c",
        )
        .unwrap();
        assert_eq!(c.probe_registries, ["registry.lan:5000", "nvcr.io"]);
        assert_eq!(Config::parse(&c.to_toml(), "c").unwrap(), c);
        // An empty list is the owner's choice: no probe image is accepted.
        assert!(
            Config::parse(&format!("{base}probe_registries = []"), "c").unwrap().probe_registries.is_empty()
        );
        for bad in ["['https://docker.io']", "['docker.io/x']", "['']", "'docker.io'"] {
            let e = Config::parse(&format!("{base}probe_registries = {bad}"), "c").unwrap_err();
            assert!(matches!(e, ConfigError::Invalid(..)), "{bad}: {e:?}");
        }
    }

    #[test]
    fn paths() {
        let p = Paths::resolve(None);
        assert!(p.system);
        assert_eq!(p.config, Path::new("/etc/gpum-agent/config.toml"));
        let p = Paths::resolve(Some(Path::new("/tmp/x")));
        assert_eq!(p.config, Path::new("/tmp/x/config.toml"));
        assert!(!p.system);
        assert!(Paths::resolve(Some(Path::new("rel"))).state_dir.is_absolute());
    }
}
