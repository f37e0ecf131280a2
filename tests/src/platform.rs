//! The real `gpum-platform` for end-to-end tests.
//!
//! [`TestPlatform::start`] runs the real binary (`gpum-platform serve`) on 127.0.0.1 with a port
//! the kernel picks, a fresh database (SQLite, or PostgreSQL with `GPUM_TEST_DB=postgres`:
//! `gpum_platform::testdb`), an admin token file, a test clock and either TLS (a
//! throwaway CA and a certificate for 127.0.0.1 and localhost) or `--insecure-http`. It returns
//! once the server has bound its socket. Admin operations run the real CLI against the same
//! database (`gpum-platform --db F ...`), so they are synchronous and work from any test, async
//! or not; the HTTP admin API is covered by `tests/e2e/platform.rs`.
//!
//! [`TestPlatform::stop`] and [`TestPlatform::restart`] keep the database and the port, for
//! "platform down, then back" tests. Dropping it kills the server.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use gpum_platform::sql::{Conn, Engine};
use gpum_platform::testdb::TestDb;
use gpum_protocol::{NodeList, NodeSummary};

/// How to start the platform.
#[derive(Debug, Clone)]
pub struct PlatformOpts {
    /// TLS with a throwaway CA (default), or plain HTTP on loopback.
    pub tls: bool,
    /// The interval given to agents (default 1 s, so tests run fast).
    pub heartbeat_interval_secs: u64,
    /// Served under `/dl/`.
    pub dist: Option<PathBuf>,
    /// Start with the admin API on (default).
    pub admin_api: bool,
    /// Extra arguments for `serve`.
    pub extra_args: Vec<String>,
    /// Start the server with this soft limit on open files (`ulimit -Sn`), as a service
    /// manager or a login shell might.
    pub nofile_soft_limit: Option<u64>,
    /// Start the server with this hard (and soft) limit on open files (`ulimit -n`), which
    /// `serve` cannot raise.
    pub nofile_limit: Option<u64>,
}

impl Default for PlatformOpts {
    fn default() -> Self {
        PlatformOpts {
            tls: true,
            heartbeat_interval_secs: 1,
            dist: None,
            admin_api: true,
            extra_args: Vec::new(),
            nofile_soft_limit: None,
            nofile_limit: None,
        }
    }
}

impl PlatformOpts {
    pub fn insecure_http() -> Self {
        PlatformOpts { tls: false, ..Default::default() }
    }
}

pub struct TestPlatform {
    dir: tempfile::TempDir,
    /// Shared with its replicas ([`TestPlatform::replica`]); dropped with the last of them.
    db: Arc<TestDb>,
    opts: PlatformOpts,
    child: Option<Child>,
    _stdout: Option<BufReader<ChildStdout>>,
    url: String,
    port: u16,
    ca_pem: Option<String>,
    admin_token: String,
}

impl TestPlatform {
    /// Starts the real server; panics (with its log) if it does not come up within 30 s.
    pub fn start(opts: PlatformOpts) -> TestPlatform {
        TestPlatform::start_on(opts, Arc::new(TestDb::new()))
    }

    /// Another `serve` process (its own port, admin token, clock and log) on the same database:
    /// a replica, as behind a load balancer (PostgreSQL).
    pub fn replica(&self) -> TestPlatform {
        TestPlatform::start_on(self.opts.clone(), self.db.clone())
    }

    /// [`TestPlatform::replica`] with options of its own (a relay on another port).
    pub fn replica_with(&self, opts: PlatformOpts) -> TestPlatform {
        TestPlatform::start_on(opts, self.db.clone())
    }

    /// [`TestPlatform::start`] on the given database.
    pub fn start_on(opts: PlatformOpts, db: Arc<TestDb>) -> TestPlatform {
        let dir = tempfile::Builder::new().prefix("gpum-platform-test").tempdir().expect("temp dir");
        let admin_token = random_hex(32);
        write_private(&dir.path().join("admin-token"), admin_token.as_bytes());
        std::fs::write(dir.path().join("clock"), "0\n").expect("clock file");
        let mut ca_pem = None;
        if opts.tls {
            let (ca, cert, key) = make_certs();
            std::fs::write(dir.path().join("ca.pem"), &ca).expect("ca.pem");
            std::fs::write(dir.path().join("cert.pem"), cert).expect("cert.pem");
            write_private(&dir.path().join("key.pem"), key.as_bytes());
            ca_pem = Some(ca);
        }
        let mut p = TestPlatform {
            dir,
            db,
            opts,
            child: None,
            _stdout: None,
            url: String::new(),
            port: 0,
            ca_pem,
            admin_token,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let ulimit = match (self.opts.nofile_limit, self.opts.nofile_soft_limit) {
            (Some(n), _) => Some(format!("ulimit -n {n}")),
            (None, Some(n)) => Some(format!("ulimit -Sn {n}")),
            (None, None) => None,
        };
        let mut cmd = match ulimit {
            None => Command::new(crate::bin("gpum-platform")),
            Some(ulimit) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!("{ulimit} && exec \"$0\" \"$@\"")).arg(crate::bin("gpum-platform"));
                c
            }
        };
        cmd.arg("serve")
            .arg("--db")
            .arg(self.db_path())
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--heartbeat-interval")
            .arg(self.opts.heartbeat_interval_secs.to_string())
            .arg("--test-clock-file")
            .arg(d.join("clock"));
        if self.opts.tls {
            cmd.arg("--tls-cert").arg(d.join("cert.pem")).arg("--tls-key").arg(d.join("key.pem"));
        } else {
            cmd.arg("--insecure-http");
        }
        if self.opts.admin_api {
            cmd.arg("--admin-token-file").arg(d.join("admin-token"));
        }
        if let Some(dist) = &self.opts.dist {
            cmd.arg("--dist").arg(dist);
        }
        cmd.args(&self.opts.extra_args);
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.log_path()).expect("log file");
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log).env("GPUM_LOG", "info");
        let mut child = cmd.spawn().expect("spawn gpum-platform");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let n = r.read_line(&mut line).unwrap_or(0);
            let _ = tx.send((n, line, r));
        });
        let (n, line, reader) = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(v) => v,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("gpum-platform did not start within 30 s; log:\n{}", self.log());
            }
        };
        let Some(url) = line.trim().strip_prefix("gpum-platform listening on ").filter(|_| n > 0) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpum-platform did not start (said {line:?}); log:\n{}", self.log());
        };
        let port: u16 =
            url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port in the listening line");
        self.port = port;
        // Clients use the name the certificate carries.
        self.url = format!("{}://127.0.0.1:{port}", if self.opts.tls { "https" } else { "http" });
        self.child = Some(child);
        self._stdout = Some(reader);
    }

    /// The base URL, e.g. `https://127.0.0.1:40123` (no trailing slash).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PEM of the CA that signed the server's certificate (TLS mode only).
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A file holding [`Self::ca_pem`] (TLS mode only), e.g. for `CURL_CA_BUNDLE`.
    pub fn ca_path(&self) -> Option<PathBuf> {
        self.ca_pem.as_ref().map(|_| self.dir.path().join("ca.pem"))
    }

    /// The admin API bearer token.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// What `--db` is given: the SQLite file, or the PostgreSQL database's URL.
    pub fn db_path(&self) -> PathBuf {
        self.db.target()
    }

    /// The engine the platform runs on.
    pub fn engine(&self) -> Engine {
        self.db.engine()
    }

    /// Runs `f` on a connection of its own to the platform's database, on a thread of its own
    /// (PostgreSQL's synchronous client may not run on an async test's thread).
    pub fn with_db<T: Send>(&self, f: impl FnOnce(&Conn) -> T + Send) -> T {
        std::thread::scope(|s| s.spawn(|| f(&self.db.open())).join().expect("database thread"))
    }

    /// Everything the database holds, as bytes: SQLite's files (with `-wal` and `-shm`), or
    /// PostgreSQL's `pg_dump` of the database.
    pub fn db_bytes(&self) -> Vec<u8> {
        match &*self.db {
            TestDb::Postgres { .. } => self.db.dump(),
            TestDb::Sqlite(_) => {
                let mut bytes = Vec::new();
                for suffix in ["", "-wal", "-shm"] {
                    let f = format!("{}{suffix}", self.db_path().display());
                    bytes.extend(std::fs::read(&f).unwrap_or_default());
                }
                bytes
            }
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("platform.log")
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// A reqwest client that trusts the test CA (and nothing else).
    pub fn http_client(&self) -> reqwest::Client {
        let mut b = reqwest::Client::builder().timeout(Duration::from_secs(20));
        if let Some(pem) = &self.ca_pem {
            b = b
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA PEM"));
        }
        b.build().expect("reqwest client")
    }

    /// Runs the real CLI against this platform's database and clock; returns its output.
    pub fn cli<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        Command::new(crate::bin("gpum-platform"))
            .arg("--db")
            .arg(self.db_path())
            .arg("--test-clock-file")
            .arg(self.dir.path().join("clock"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run gpum-platform")
    }

    /// Runs the CLI with `--json`, panics on failure, returns the parsed output.
    pub fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let out = self.cli(&a);
        assert!(
            out.status.success(),
            "gpum-platform {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("gpum-platform {args:?}: not JSON ({e})"))
    }

    /// A fresh join code valid for 24 h.
    pub fn join_code(&self) -> String {
        self.join_code_ttl("24h")
    }

    /// A fresh join code with a TTL like `90s` or `1h`.
    pub fn join_code_ttl(&self, ttl: &str) -> String {
        self.cli_json(&["join-code", "create", "--ttl", ttl])["code"].as_str().expect("code").to_owned()
    }

    pub fn nodes(&self) -> NodeList {
        serde_json::from_value(self.cli_json(&["nodes", "list"])).expect("NodeList")
    }

    pub fn node(&self, id: &str) -> Option<NodeSummary> {
        self.nodes().nodes.into_iter().find(|n| n.id == id)
    }

    pub fn delete_node(&self, id: &str) {
        self.cli_json(&["nodes", "delete", id]);
    }

    /// Queues `recheck` or `restart`; returns the command id.
    pub fn command(&self, id: &str, kind: &str) -> String {
        self.cli_json(&["nodes", "command", id, kind])["id"].as_str().expect("command id").to_owned()
    }

    /// Replaces the node's token; returns the new one.
    pub fn rotate_token(&self, id: &str) -> String {
        self.cli_json(&["nodes", "rotate-token", id])["node_token"].as_str().expect("token").to_owned()
    }

    pub fn set_probe_image(&self, image: &str) {
        self.cli_json(&["probe-image", "set", image]);
    }

    pub fn clear_probe_image(&self) {
        self.cli_json(&["probe-image", "clear"]);
    }

    /// Sets the `gpum.managed` containers the platform knows on a node (empty: none).
    pub fn set_known_containers(&self, id: &str, container_ids: &[&str]) {
        let mut a = vec!["nodes", "known-containers", id];
        a.extend_from_slice(container_ids);
        self.cli_json(&a);
    }

    /// Invites an owner with the real CLI (`owners invite`); returns the one-time link.
    pub fn invite_owner(&self, email: &str) -> String {
        self.cli_json(&["owners", "invite", email, "--public-url", self.url()])["invitation_url"]
            .as_str()
            .expect("invitation_url")
            .to_owned()
    }

    /// A join code for an owner's server (`join-code create --owner`).
    pub fn owner_join_code(&self, owner: &str) -> String {
        self.cli_json(&["join-code", "create", "--owner", owner])["code"].as_str().expect("code").to_owned()
    }

    /// Moves the platform's clock (server and CLI) forward by `secs` (backward if negative).
    pub fn advance_clock(&self, secs: i64) {
        let f = self.dir.path().join("clock");
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let (fixed, cur) = match text.trim().strip_prefix('=') {
            Some(t) => ("=", t.parse::<i64>().unwrap_or(0)),
            None => ("", text.trim().parse().unwrap_or(0)),
        };
        let tmp = self.dir.path().join("clock.tmp");
        std::fs::write(&tmp, format!("{fixed}{}\n", cur + secs)).expect("write clock");
        std::fs::rename(&tmp, &f).expect("rename clock");
    }

    /// Stops the platform's clock (server and CLI) at Unix second `t` (metering's sums, checked
    /// to the second); [`TestPlatform::advance_clock`] then moves it from there.
    pub fn set_clock(&self, t: u64) {
        let f = self.dir.path().join("clock");
        let tmp = self.dir.path().join("clock.tmp");
        std::fs::write(&tmp, format!("={t}\n")).expect("write clock");
        std::fs::rename(&tmp, &f).expect("rename clock");
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGTERM and waits up to `within` for the server to exit; returns whether it did.
    /// Either way the server is stopped afterwards.
    pub fn terminate(&mut self, within: Duration) -> bool {
        let Some(mut c) = self.child.take() else { return true };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + within;
        let exited = loop {
            if matches!(c.try_wait(), Ok(Some(_))) {
                break true;
            }
            if Instant::now() >= end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !exited {
            let _ = c.kill();
            let _ = c.wait();
        }
        self._stdout = None;
        exited
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stops the server (SIGKILL), keeping the database and the port number.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self._stdout = None;
    }

    /// Starts the server again on the same port with the same database.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for TestPlatform {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `f` every 50 ms until it is true; panics with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").expect("urandom"), &mut b)
        .expect("random");
    hex::encode(b)
}

pub fn write_private(path: &Path, data: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).expect("create");
    f.write_all(data).expect("write");
}

/// The domain the test certificate covers with a wildcard, for the relay's HTTP door under TLS.
pub const RELAY_TEST_DOMAIN: &str = "relay.localhost";

/// The documented layout of a platform and its relay on one site (issue 43), which the test
/// certificate covers too: the dashboard at [`SITE_TEST_HOST`], tenants' pages under
/// [`SITE_RELAY_DOMAIN`]. A test's browser reaches these names on loopback
/// (`--host-resolver-rules`); nothing is ever sent to them.
pub const SITE_TEST_HOST: &str = "gpum.example.com";
pub const SITE_RELAY_DOMAIN: &str = "relay.gpum.example.com";

/// A throwaway CA and a server certificate it signed for 127.0.0.1, localhost,
/// `*.relay.localhost` (the relay's HTTP door, [`RELAY_TEST_DOMAIN`]), [`SITE_TEST_HOST`] and
/// `*.`[`SITE_RELAY_DOMAIN`]: (CA PEM, certificate PEM, key PEM).
fn make_certs() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gpum test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA cert");
    let key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        format!("*.{RELAY_TEST_DOMAIN}"),
        SITE_TEST_HOST.to_owned(),
        format!("*.{SITE_RELAY_DOMAIN}"),
    ])
    .expect("server params");
    params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let cert = params.signed_by(&key, &ca, &ca_key).expect("server cert");
    (ca.pem(), cert.pem(), key.serialize_pem())
}
