//! `gpum-agent register` and `configure`: how a node gets its token and its config file.
//!
//! [`register`] is also what the installer calls (same library function, so the two can never
//! disagree on the file's format or mode). The join code is checked locally first (format and
//! check symbol: exit 2 without a network round trip), then sent with the inventory; the
//! platform's four refusals become the seed's two exit-40 messages. [`enroll`] is the installer's
//! first call, which binds the code to its install id before the install begins.
//!
//! The inventory carries the Docker engine's version, which this crate does not ask for: the
//! caller passes a future that asks (the agent's Docker client, the installer's `GET /version`
//! on the socket), awaited only once the code has passed the local check.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpum_common::Failure;
use gpum_common::agent_state::{AgentState, Connection};
use gpum_host::Host;
use gpum_protocol::joincode::JoinCode;
use gpum_protocol::{EnrollRequest, ErrorCode, RegisterRequest};

use crate::client::{CallError, Platform, REQUEST_TIMEOUT};
use crate::config::{Config, ConfigError};
use crate::inventory::Gatherer;
use crate::secret::Token;

/// Where a registration writes, and how it reaches the platform.
#[derive(Debug, Clone)]
pub struct RegisterOptions {
    /// Platform base URL (https, or http to loopback).
    pub server: String,
    /// The config file to write (0600), e.g. `/etc/gpum-agent/config.toml` or `DIR/config.toml`.
    pub config_path: PathBuf,
    /// The state directory, where an initial `state.json` is written for `status`.
    pub state_dir: PathBuf,
    /// An extra trusted CA (PEM) for a platform with a private CA; stored in the config.
    pub ca_file: Option<PathBuf>,
    /// The Docker socket, stored in the config when not the default.
    pub docker_socket: Option<PathBuf>,
    /// The registries the probe image may come from (`--probe-registry`); `None` for the
    /// defaults ([`crate::config::default_registries`]). Check them with
    /// [`crate::config::check_registries`] first.
    pub probe_registries: Option<Vec<String>>,
    /// The installer's install id (see `RegisterRequest::install_id`); `None` from the CLI.
    pub install_id: Option<String>,
}

/// What a successful registration returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub node_id: String,
    pub heartbeat_interval_secs: u64,
    pub probe_image: Option<String>,
}

/// Maps a platform refusal of `register` to the user's failure.
pub fn register_failure(e: &CallError) -> Failure {
    match e {
        CallError::Api { code, .. } => match code {
            ErrorCode::JoinCodeMalformed => Failure::BadJoinCode,
            ErrorCode::JoinCodeUnknown | ErrorCode::JoinCodeExpired | ErrorCode::JoinCodeUsed => {
                Failure::JoinCodeRejected
            }
            ErrorCode::GpuAlreadyRegistered => Failure::GpuAlreadyRegistered,
            _ => Failure::Other(e.to_string()),
        },
        _ => Failure::Other(e.to_string()),
    }
}

fn platform_for(host: &dyn Host, server: &str, ca_file: Option<&Path>) -> Result<Platform, Failure> {
    let roots = match ca_file {
        Some(p) => vec![host.read(p).map_err(|e| Failure::Other(format!("{}: {e}", p.display())))?],
        None => Vec::new(),
    };
    Platform::new(server, roots, REQUEST_TIMEOUT).map_err(|e| Failure::Other(e.to_string()))
}

/// Registers this machine with `code` and writes the config. `docker_version` answers the
/// engine's version for the inventory (`None` when it does not answer); it is awaited after the
/// local checks. See the module docs.
pub async fn register(
    host: Arc<dyn Host>,
    opts: &RegisterOptions,
    code: &str,
    docker_version: impl Future<Output = Option<String>>,
) -> Result<Registered, Failure> {
    if code.trim().is_empty() {
        return Err(Failure::NoJoinCode);
    }
    let code = JoinCode::parse(code).map_err(|_| Failure::BadJoinCode)?;
    let platform = platform_for(host.as_ref(), &opts.server, opts.ca_file.as_deref())?;

    let docker_version = docker_version.await;
    let inventory = Gatherer::new(host.clone()).inventory(docker_version);
    let req = RegisterRequest {
        join_code: code.to_string(),
        agent_version: crate::AGENT_VERSION.to_string(),
        inventory,
        install_id: opts.install_id.clone(),
    };
    let ans = platform.register(&req).await.map_err(|e| register_failure(&e))?;
    let resp = ans.body;
    let token = Token::new(&resp.node_token)
        .ok_or_else(|| Failure::Other("the platform sent an empty token".into()))?;
    let cfg = Config {
        server: platform.server().to_string(),
        node_id: resp.node_id.clone(),
        token,
        ca_file: opts.ca_file.clone(),
        docker_socket: opts.docker_socket.clone(),
        probe_registries: opts.probe_registries.clone().unwrap_or_else(crate::config::default_registries),
        rentals: true,
        rental_driver_capabilities: crate::config::default_rental_driver_capabilities(),
        auto_update: true,
        test_docker_scope: None,
        test_reconcile_min_age: None,
        test_rentals_without_gpu_request: false,
        test_tunnel_silence: None,
    };
    write_config_and_state(host.as_ref(), &cfg, &opts.config_path, &opts.state_dir)?;
    tracing::info!(node_id = %resp.node_id, "registered");
    Ok(Registered {
        node_id: resp.node_id,
        heartbeat_interval_secs: resp.heartbeat_interval_secs,
        probe_image: resp.probe_image,
    })
}

/// The installer's first call to the platform: binds `code` to `install_id` (see
/// `gpum_protocol::EnrollRequest`), so that the code is useless to anyone who reads it later.
/// Refusals map as [`register`]'s do (the seed's exit 40).
pub async fn enroll(
    host: &dyn Host,
    server: &str,
    ca_file: Option<&Path>,
    code: &str,
    install_id: &str,
) -> Result<(), Failure> {
    let code = JoinCode::parse(code).map_err(|_| Failure::BadJoinCode)?;
    let platform = platform_for(host, server, ca_file)?;
    let req = EnrollRequest { join_code: code.to_string(), install_id: install_id.to_string() };
    platform.enroll(&req).await.map_err(|e| register_failure(&e))?;
    Ok(())
}

/// `configure`: hands the agent a node token (first line of `token_input`) with the server and,
/// when given, the node id. Over an existing config file it changes only what it is given and
/// keeps every other setting as it is (`ca_file`, `docker_socket`, `probe_registries`,
/// `rentals = false`, …): the cabinet's steps after a token replacement name only the server
/// and the node, and a machine behind a private CA or with its own Docker socket must keep them
/// (issue 43). An existing file that cannot be read is refused, never replaced: its settings
/// would be lost.
pub fn configure(
    host: &dyn Host,
    opts: &RegisterOptions,
    node_id: Option<&str>,
    token_input: &str,
) -> Result<(), Failure> {
    let line = token_input.lines().next().unwrap_or("");
    let token =
        Token::new(line).ok_or_else(|| Failure::Usage("no node token on the first line of stdin".into()))?;
    gpum_host::http::check_url(&opts.server).map_err(|e| Failure::Usage(e.to_string()))?;
    let server = opts.server.trim_end_matches('/').to_string();
    let cfg = match Config::load(host, &opts.config_path) {
        Ok(old) => Config {
            server,
            node_id: node_id.map_or(old.node_id.clone(), str::to_string),
            token,
            ca_file: opts.ca_file.clone().or(old.ca_file.clone()),
            docker_socket: opts.docker_socket.clone().or(old.docker_socket.clone()),
            probe_registries: opts.probe_registries.clone().unwrap_or(old.probe_registries.clone()),
            ..old
        },
        Err(ConfigError::Missing(_)) => Config {
            server,
            node_id: node_id.unwrap_or("unknown").to_string(),
            token,
            ca_file: opts.ca_file.clone(),
            docker_socket: opts.docker_socket.clone(),
            probe_registries: opts.probe_registries.clone().unwrap_or_else(crate::config::default_registries),
            rentals: true,
            rental_driver_capabilities: crate::config::default_rental_driver_capabilities(),
            auto_update: true,
            test_docker_scope: None,
            test_reconcile_min_age: None,
            test_rentals_without_gpu_request: false,
            test_tunnel_silence: None,
        },
        Err(e) => {
            return Err(Failure::Usage(format!(
                "{e}; configure changes only what it is given and keeps the file's other settings, \
                 so it does not replace a file it cannot read: fix it, or move it away to start \
                 from this command's options alone"
            )));
        }
    };
    write_config_and_state(host, &cfg, &opts.config_path, &opts.state_dir)
}

fn write_config_and_state(
    host: &dyn Host,
    cfg: &Config,
    config_path: &Path,
    state_dir: &Path,
) -> Result<(), Failure> {
    // An owner who refused rentals (`rentals = false`) or automatic upgrades (`auto_update =
    // false`) still refuses them after a new registration: the keys are the owner's, and the
    // register's defaults are on.
    let kept;
    let cfg = match Config::load(host, config_path) {
        Ok(old) if !old.rentals || !old.auto_update => {
            kept = Config {
                rentals: cfg.rentals && old.rentals,
                auto_update: cfg.auto_update && old.auto_update,
                ..cfg.clone()
            };
            &kept
        }
        _ => cfg,
    };
    cfg.save(host, config_path).map_err(|e| Failure::Other(format!("{}: {e}", config_path.display())))?;
    // A fresh state: a new registration clears an earlier stop, so `status` does not show a
    // revocation of the previous node.
    let mut st = AgentState {
        node_id: Some(cfg.node_id.clone()),
        server: Some(cfg.server.clone()),
        connection: Connection::Connecting,
        ..Default::default()
    };
    crate::state::write(host, state_dir, &mut st)
        .map_err(|e| Failure::Other(format!("{}: {e}", state_dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn the_four_refusals_are_exit_40_with_two_messages() {
        let api = |code| CallError::Api { status: code_status(code), code, message: String::new() };
        fn code_status(c: ErrorCode) -> u16 {
            c.http_status()
        }
        for c in [ErrorCode::JoinCodeUnknown, ErrorCode::JoinCodeExpired, ErrorCode::JoinCodeUsed] {
            assert_eq!(register_failure(&api(c)), Failure::JoinCodeRejected);
        }
        assert_eq!(register_failure(&api(ErrorCode::GpuAlreadyRegistered)), Failure::GpuAlreadyRegistered);
        assert_eq!(register_failure(&api(ErrorCode::JoinCodeMalformed)).code(), 2);
        assert_eq!(register_failure(&CallError::Timeout).code(), 1);
        assert_eq!(register_failure(&api(ErrorCode::Internal)).code(), 1);
    }

    fn opts() -> RegisterOptions {
        RegisterOptions {
            server: "http://127.0.0.1:9".into(),
            config_path: PathBuf::from("/s/config.toml"),
            state_dir: PathBuf::from("/s"),
            ca_file: None,
            docker_socket: None,
            probe_registries: None,
            install_id: None,
        }
    }

    #[tokio::test]
    async fn malformed_or_missing_codes_fail_before_any_request() {
        let h: Arc<dyn Host> = Arc::new(FakeHost::new());
        // Nor is the engine asked.
        async fn never_asked() -> Option<String> {
            panic!("the engine is asked only once the code is well-formed")
        }
        assert_eq!(register(h.clone(), &opts(), "GPUM-1234", never_asked()).await, Err(Failure::BadJoinCode));
        assert_eq!(register(h.clone(), &opts(), "  \n", never_asked()).await, Err(Failure::NoJoinCode));
    }

    #[test]
    fn configure_writes_0600_config_and_state() {
        let h = FakeHost::new();
        configure(&h, &opts(), Some("n-7"), "tok-abc\nignored\n").unwrap();
        let cfg = Config::load(&h, Path::new("/s/config.toml")).unwrap();
        assert_eq!(cfg.token.expose(), "tok-abc");
        assert_eq!(cfg.node_id, "n-7");
        let st = crate::state::read(&h, Path::new("/s")).unwrap().unwrap();
        assert_eq!(st.node_id.as_deref(), Some("n-7"));
        assert!(configure(&h, &opts(), None, "\n").is_err());
    }

    /// Issue 43: the cabinet's steps after a token replacement give `configure` only the server,
    /// the node and the token; every other key of the file stays (before the fix `ca_file` and
    /// `docker_socket` were dropped, `probe_registries` reset), and a given one is changed.
    #[test]
    fn configure_changes_only_what_it_is_given() {
        let h = FakeHost::new();
        let path = Path::new("/s/config.toml");
        let every = Config {
            server: "https://old.example".into(),
            node_id: "n-7".into(),
            token: Token::new("tok-old").unwrap(),
            ca_file: Some(PathBuf::from("/etc/gpum-agent/ca.pem")),
            docker_socket: Some(PathBuf::from("/run/user-docker/docker.sock")),
            probe_registries: vec!["registry.lan:5000".into()],
            rentals: false,
            rental_driver_capabilities: vec!["compute".into(), "utility".into(), "video".into()],
            auto_update: false,
            // The test keys exist only with `test-knobs`; without it they are not in the file.
            test_docker_scope: cfg!(feature = "test-knobs").then(|| ("gpum.test.s".into(), "1".into())),
            test_reconcile_min_age: cfg!(feature = "test-knobs").then(|| std::time::Duration::from_secs(3)),
            test_rentals_without_gpu_request: cfg!(feature = "test-knobs"),
            test_tunnel_silence: cfg!(feature = "test-knobs").then(|| std::time::Duration::from_millis(500)),
        };
        every.save(&h, path).unwrap();
        let cabinet = RegisterOptions { server: "https://gpum.example/".into(), ..opts() };
        configure(&h, &cabinet, Some("n-7"), "tok-new\n").unwrap();
        let cfg = Config::load(&h, path).unwrap();
        assert_eq!(
            cfg,
            Config {
                server: "https://gpum.example".into(),
                token: Token::new("tok-new").unwrap(),
                ..every.clone()
            }
        );
        assert_eq!(cfg.token.expose(), "tok-new");
        // Without --node-id the node stays; what is given is changed.
        let given = RegisterOptions {
            ca_file: Some(PathBuf::from("/etc/gpum-agent/other.pem")),
            docker_socket: Some(PathBuf::from("/var/run/docker.sock")),
            probe_registries: Some(vec!["nvcr.io".into()]),
            ..cabinet.clone()
        };
        configure(&h, &given, None, "tok-3").unwrap();
        let cfg = Config::load(&h, path).unwrap();
        assert_eq!(cfg.node_id, "n-7");
        assert_eq!(cfg.ca_file.as_deref(), Some(Path::new("/etc/gpum-agent/other.pem")));
        assert_eq!(cfg.docker_socket.as_deref(), Some(Path::new("/var/run/docker.sock")));
        assert_eq!(cfg.probe_registries, ["nvcr.io"]);
        assert!(!cfg.rentals, "still off");
        // A file it cannot read is not replaced.
        h.write_atomic(path, b"server = 'https://x'\ngarbage", 0o600).unwrap();
        let e = configure(&h, &cabinet, Some("n-7"), "tok-4").unwrap_err();
        assert_eq!(e.code(), 2, "{e:?}");
        assert_eq!(h.read_to_string(path).unwrap(), "server = 'https://x'\ngarbage");
    }

    /// Rentals are on by default, and an owner's `rentals = false` survives a new registration.
    #[test]
    fn a_new_registration_keeps_the_owners_refusal_of_rentals() {
        let h = FakeHost::new();
        let path = Path::new("/s/config.toml");
        configure(&h, &opts(), Some("n-7"), "tok-abc").unwrap();
        assert!(Config::load(&h, path).unwrap().rentals);
        let off = Config { rentals: false, ..Config::load(&h, path).unwrap() };
        off.save(&h, path).unwrap();
        configure(&h, &opts(), Some("n-8"), "tok-def").unwrap();
        let cfg = Config::load(&h, path).unwrap();
        assert_eq!((cfg.node_id.as_str(), cfg.rentals), ("n-8", false));
    }

    /// Issue 47: automatic upgrades are on by default, and an owner's `auto_update = false`
    /// survives `configure` and a new registration (the seed's re-registration path).
    #[test]
    fn the_owners_auto_update_false_survives_configure_and_a_new_registration() {
        let h = FakeHost::new();
        let path = Path::new("/s/config.toml");
        configure(&h, &opts(), Some("n-7"), "tok-abc").unwrap();
        assert!(Config::load(&h, path).unwrap().auto_update);
        let off = Config { auto_update: false, ..Config::load(&h, path).unwrap() };
        off.save(&h, path).unwrap();
        configure(&h, &opts(), Some("n-8"), "tok-def").unwrap();
        let cfg = Config::load(&h, path).unwrap();
        assert_eq!((cfg.node_id.as_str(), cfg.auto_update, cfg.rentals), ("n-8", false, true));
        // What `register` writes after a new join code: its defaults, with the owner's refusal.
        let fresh = Config { node_id: "n-9".into(), ..sample_on() };
        write_config_and_state(&h, &fresh, path, Path::new("/s")).unwrap();
        let cfg = Config::load(&h, path).unwrap();
        assert_eq!((cfg.node_id.as_str(), cfg.auto_update), ("n-9", false));
    }

    fn sample_on() -> Config {
        Config {
            server: "https://gpum.example".into(),
            node_id: "n".into(),
            token: Token::new("tok-x").unwrap(),
            ca_file: None,
            docker_socket: None,
            probe_registries: crate::config::default_registries(),
            rentals: true,
            rental_driver_capabilities: crate::config::default_rental_driver_capabilities(),
            auto_update: true,
            test_docker_scope: None,
            test_reconcile_min_age: None,
            test_rentals_without_gpu_request: false,
            test_tunnel_silence: None,
        }
    }
}
