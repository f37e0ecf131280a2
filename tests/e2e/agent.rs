//! `gpum-agent` end to end: the real binary against the real `gpum-platform` on loopback, with a
//! 1 s heartbeat interval.
//!
//! These tests check the wiring: that the binary heartbeats, obeys a command end to end, stops
//! with 78, writes its state, survives a platform that misbehaves. The rules behind them
//! (command de-duplication and limits, the interval clamp, the known-list cut, probe pacing, the
//! final exit) are `gpum_agent::core`'s unit and property tests.
//!
//! Nothing here is simulated. NVML is absent on a machine without an NVIDIA driver, and the
//! agent must run and report "no driver" (`nvml: library_missing`). Most tests point the agent at
//! a Docker socket that does not exist, which is also a state the agent must survive; the
//! command test uses the real engine, scoped with a `gpum.test.` label so it never touches
//! another test's containers.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use gpum_protocol::{NodeSummary, NvmlState, VerificationState};
use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};
use gpum_tests::{agent_cmd, bin, docker_answers, require_docker, run_with_stdin, text};

// Issue 47: today's agent against the previous release's platform, from its recorded answers.
#[path = "agent_compat.rs"]
mod compat;

const MISSING_DOCKER: &str = "/nonexistent/gpum-e2e/docker.sock";
const LONG: Duration = Duration::from_secs(20);

/// A registered node with its scratch state directory.
struct Node {
    dir: tempfile::TempDir,
    id: String,
}

impl Node {
    fn state(&self) -> &Path {
        self.dir.path()
    }
    fn state_str(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }
    fn config(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    /// The node token, read with the agent's own config parser.
    fn token(&self) -> String {
        let text = std::fs::read_to_string(self.config()).unwrap();
        let cfg = gpum_enroll::config::Config::parse(&text, "config.toml").expect("a valid config");
        cfg.token.expose().to_string()
    }
    fn append_config(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new().append(true).open(self.config()).unwrap();
        writeln!(f, "{line}").unwrap();
    }
    /// Rewrites the server URL through `configure`, with the token on stdin.
    fn configure_server(&self, url: &str) {
        let token = self.token();
        let out = run_with_stdin(
            agent_cmd(&["configure", "--state", self.state_str(), "--server", url, "--node-id", &self.id]),
            &format!("{token}\n"),
        );
        assert!(out.status.success(), "configure: {}", text(&out));
    }
    fn status(&self, lang: &str) -> Output {
        agent_cmd(&["status", "--state", self.state_str()]).env("LANG", lang).output().unwrap()
    }
    fn status_json(&self) -> serde_json::Value {
        let out = agent_cmd(&["status", "--json", "--state", self.state_str()]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

fn register_args(p: &TestPlatform, dir: &Path, docker_socket: &str) -> Vec<String> {
    let mut a = vec![
        "register".to_string(),
        "--state".into(),
        dir.to_str().unwrap().into(),
        "--server".into(),
        p.url().into(),
        "--docker-socket".into(),
        docker_socket.into(),
    ];
    if let Some(ca) = p.ca_path() {
        a.push("--ca-file".into());
        a.push(ca.to_str().unwrap().into());
    }
    a
}

fn try_register(p: &TestPlatform, dir: &Path, code: &str, lang: &str) -> Output {
    let args = register_args(p, dir, MISSING_DOCKER);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = agent_cmd(&args);
    c.env("LANG", lang);
    run_with_stdin(c, &format!("{code}\n"))
}

fn register_with(p: &TestPlatform, docker_socket: &str) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let args = register_args(p, dir.path(), docker_socket);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_with_stdin(agent_cmd(&args), &format!("{}\n", p.join_code()));
    assert!(out.status.success(), "register failed: {}", text(&out));
    let host = gpum_host::RealHost::new();
    let st = gpum_common::agent_state::read(&host, dir.path()).unwrap().expect("state.json written");
    let id = st.node_id.expect("node id in state.json");
    Node { dir, id }
}

fn register(p: &TestPlatform) -> Node {
    register_with(p, MISSING_DOCKER)
}

/// A running `gpum-agent run`, its stderr in `agent.log` of the state directory.
struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    fn start(node: &Node) -> Agent {
        Agent::start_with(node, Command::new(bin("gpum-agent")), "debug")
    }

    /// Starts `cmd` (the agent binary, or a wrapper such as `unshare` in front of it).
    fn start_with(node: &Node, mut cmd: Command, log_level: &str) -> Agent {
        let log = node.state().join("agent.log");
        let f = std::fs::File::create(&log).unwrap();
        if cmd.get_program() != bin("gpum-agent").as_os_str() {
            cmd.arg(bin("gpum-agent"));
        }
        let child = cmd
            .args(["run", "--state", node.state_str()])
            .env("GPUM_LOG", log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("start agent");
        Agent { child, log }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Waits up to `timeout` for the agent to exit.
    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn node(p: &TestPlatform, id: &str) -> NodeSummary {
    p.node(id).expect("node listed")
}

fn last_seq(p: &TestPlatform, id: &str) -> u64 {
    node(p, id).last_seq.unwrap_or(0)
}

fn wait_heartbeats(p: &TestPlatform, id: &str, n: u64) {
    wait_until(LONG, &format!("{n} heartbeats of {id}"), || last_seq(p, id) >= n);
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn register_run_heartbeat_then_sigterm_exits_0_quickly() {
    let p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    assert_eq!(mode(&n.config()), 0o600, "config.toml holds the token");
    let mut a = Agent::start(&n);
    wait_heartbeats(&p, &n.id, 3);

    let s = node(&p, &n.id);
    assert!(s.online);
    assert_eq!(s.verification, VerificationState::AwaitingCheck, "no probe image: awaiting check");
    assert!(!s.inventory.private.kernel.is_empty() && !s.inventory.private.hostname.is_empty());
    assert!(s.inventory.public.cpu_cores >= 1 && s.inventory.public.ram_mib > 0);
    let health = s.health.expect("health reported");
    assert!(!health.docker_ok && health.docker_error.as_deref().unwrap_or("").contains(MISSING_DOCKER));
    if !Path::new("/dev/nvidiactl").exists() {
        // No driver here: the agent runs and says so.
        assert_eq!(health.nvml, NvmlState::LibraryMissing);
        assert!(s.inventory.public.gpus.is_empty());
    }
    assert!(s.last_metrics.expect("metrics").ram_total_mib > 0);

    let st = n.status_json();
    assert_eq!(st["connection"], "connected");
    assert_eq!(st["node_id"], n.id.as_str());

    let t0 = Instant::now();
    a.signal(nix::sys::signal::Signal::SIGTERM);
    let exit = a.wait_exit(Duration::from_secs(10)).expect("exits within 10 s of SIGTERM");
    assert_eq!(exit.code(), Some(0), "{}", a.log());
    eprintln!("SIGTERM -> exit in {:?}", t0.elapsed());
    assert!(a.log().contains("stopping"));
}

#[test]
fn the_token_never_shows_in_argv_environ_or_trace_logs() {
    let p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    let token = n.token();
    assert!(token.len() >= 32, "a real token");
    let a = Agent::start_with(&n, Command::new(bin("gpum-agent")), "trace");
    wait_heartbeats(&p, &n.id, 3);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", a.pid())).unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", a.pid())).unwrap();
    let contains = |hay: &[u8]| hay.windows(token.len()).any(|w| w == token.as_bytes());
    assert!(!contains(&cmdline) && !contains(&environ));
    let log = a.log();
    assert!(log.contains("TRACE"), "trace logging is on");
    assert!(log.lines().count() > 20, "the log has content");
    assert!(!log.contains(&token), "the token leaked into the log");
    for args in [vec!["status"], vec!["doctor", "--connectivity"], vec!["doctor", "--json"]] {
        let mut full = args.clone();
        full.extend(["--state", n.state_str()]);
        let out = agent_cmd(&full).env("GPUM_LOG", "trace").output().unwrap();
        assert!(!text(&out).contains(&token), "{args:?} printed the token");
        assert!(args[0] != "doctor" || text(&out).contains("redacted"), "{}", text(&out));
    }
}

#[test]
fn join_code_failures_exit_2_and_40_with_the_seed_messages() {
    let p = TestPlatform::start(PlatformOpts::default());
    let dir = tempfile::tempdir().unwrap();
    let ru = "ru_RU.UTF-8";

    let out = try_register(&p, dir.path(), "GPUM-12345", ru);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("Код подключения выглядит неверно"), "{}", text(&out));
    let out = try_register(&p, dir.path(), "", ru);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // Well-formed, but never issued.
    let unknown = gpum_protocol::joincode::JoinCode::generate().to_string();
    let out = try_register(&p, dir.path(), &unknown, ru);
    assert_eq!(out.status.code(), Some(40), "{}", text(&out));
    assert!(text(&out).contains("Код подключения недействителен, истёк или уже использован"));

    let code = p.join_code();
    assert!(try_register(&p, dir.path(), &code, ru).status.success());
    let out = try_register(&p, dir.path(), &code, "C.UTF-8");
    assert_eq!(out.status.code(), Some(40), "used twice: {}", text(&out));
    assert!(text(&out).contains("invalid, expired or already used"));

    let short = p.join_code_ttl("60s");
    p.advance_clock(120);
    let out = try_register(&p, dir.path(), &short, ru);
    assert_eq!(out.status.code(), Some(40), "expired: {}", text(&out));
    assert!(!dir.path().join("config.toml.tmp").exists());
}

#[test]
#[ignore = "needs root (a UTS namespace)"]
fn an_inventory_change_is_resent_in_full() {
    // A real change of a real fact: the agent runs in its own UTS namespace, and the test
    // renames that namespace's host while the agent runs.
    let probe = Command::new("unshare").args(["--uts", "true"]).status();
    assert!(probe.is_ok_and(|s| s.success()), "cannot create a UTS namespace: needs root");
    let p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    let mut cmd = Command::new("unshare");
    cmd.arg("--uts");
    let a = Agent::start_with(&n, cmd, "debug");
    wait_heartbeats(&p, &n.id, 2);
    let before = node(&p, &n.id).inventory;
    let new_name = format!("gpum-e2e-{}", std::process::id());
    let st = Command::new("nsenter")
        .args(["-t", &a.pid().to_string(), "--uts", "hostname", &new_name])
        .status()
        .unwrap();
    assert!(st.success());
    wait_until(LONG, "the new hostname on the platform", || {
        node(&p, &n.id).inventory.private.hostname == new_name
    });
    let after = node(&p, &n.id).inventory;
    assert_ne!(before.hash(), after.hash());
    assert_eq!(before.public, after.public, "only the hostname changed");
    assert!(a.log().contains("inventory changed"), "{}", a.log());
}

/// Queues a command of a kind the platform's API refuses to queue, straight into its database,
/// as a newer (or compromised) platform could send it.
fn queue_raw_command(p: &TestPlatform, node_id: &str, kind: &str) -> String {
    let id = format!("cmd-raw-{}", std::process::id());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    p.with_db(|db| {
        db.execute(
            "INSERT INTO commands (id, node_id, kind, queued_at, seq) VALUES (?1, ?2, ?3, ?4, (SELECT COALESCE(MAX(seq), 0) + 1 FROM commands))",
            gpum_platform::params![&id, node_id, kind, now],
        )
        .unwrap()
    });
    id
}

fn command_result(p: &TestPlatform, node_id: &str, cmd: &str) -> Option<gpum_protocol::CommandResult> {
    node(p, node_id).commands.into_iter().find(|c| c.id == cmd).and_then(|c| c.result)
}

#[test]
fn recheck_reruns_the_probe_unknown_commands_are_refused_restart_exits() {
    // With an engine the probe really runs (and its container is checked gone); without one it
    // ends as `docker_unavailable`: the commands' wiring is the same either way.
    let docker = docker_answers();
    let p = TestPlatform::start(PlatformOpts::default());
    let n = if docker { register_with(&p, "/var/run/docker.sock") } else { register(&p) };
    let image = if docker {
        n.append_config(&format!("test_docker_scope = \"gpum.test.agent-e2e=p{}\"", std::process::id()));
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned")
    } else {
        "gpum-test/busybox:absent".to_string()
    };
    assert_eq!(mode(&n.config()), 0o600);
    p.set_probe_image(&image);
    // Probes at most every 2 s (a test-knobs setting; 60 s by default): the recheck below may
    // be held back by the rate limit, and is answered when its probe starts.
    let mut cmd = Command::new(bin("gpum-agent"));
    cmd.env("GPUM_TEST_PROBE_GAP_SECS", "2");
    let mut a = Agent::start_with(&n, cmd, "debug");
    let probes = |a: &Agent| a.log().matches("running the GPU probe").count();

    // The first probe runs after the first answered heartbeat.
    wait_until(Duration::from_secs(60), "the first probe report", || {
        node(&p, &n.id).verification != VerificationState::AwaitingCheck
    });
    let s = node(&p, &n.id);
    eprintln!("probe: {:?} {:?}", s.verification, s.last_probe_reason);
    assert!(s.last_probe_output.is_some());
    assert_eq!(probes(&a), 1);

    let recheck = p.command(&n.id, "recheck");
    wait_until(LONG, "the recheck result", || command_result(&p, &n.id, &recheck).is_some());
    assert!(command_result(&p, &n.id, &recheck).unwrap().ok);
    wait_until(Duration::from_secs(60), "a second probe", || probes(&a) >= 2);

    let unknown = queue_raw_command(&p, &n.id, "format_disk");
    wait_until(LONG, "the refusal of an unknown command", || command_result(&p, &n.id, &unknown).is_some());
    let r = command_result(&p, &n.id, &unknown).unwrap();
    assert!(!r.ok && r.message.contains("unknown"), "{r:?}");
    assert!(a.running(), "an unknown command does not stop the agent");

    let restart = p.command(&n.id, "restart");
    let exit = a.wait_exit(LONG).expect("exits on restart");
    assert_eq!(exit.code(), Some(gpum_agent::run::EXIT_RESTART), "{}", a.log());
    assert!(command_result(&p, &n.id, &restart).is_some_and(|r| r.ok), "the restart was acknowledged first");
    // The probe container is gone: nothing with the probe label in this test's scope.
    if docker {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", "label=gpum.probe=true", "--filter"])
            .arg(format!("label=gpum.test.agent-e2e=p{}", std::process::id()))
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).trim().is_empty(), "a probe container was left behind");
    }
}

#[test]
fn a_deleted_node_exits_78_within_two_intervals_and_status_says_why() {
    let p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    let mut a = Agent::start(&n);
    wait_heartbeats(&p, &n.id, 2);
    p.delete_node(&n.id);
    let t0 = Instant::now();
    // Two intervals of 1 s, plus jitter and a loaded machine's slack.
    let exit = a.wait_exit(Duration::from_secs(5)).expect("exits after the node is deleted");
    eprintln!("deleted -> exit 78 in {:?}", t0.elapsed());
    assert_eq!(exit.code(), Some(78), "{}", a.log());
    assert_eq!(a.log().matches("revoked").count(), 1, "logged once: {}", a.log());

    let st = n.status_json();
    assert_eq!(st["connection"], "stopped");
    assert_eq!(st["stopped"]["reason"], "revoked");
    assert_eq!(st["stopped"]["detail"], "node_deleted");
    let ru = n.status("ru_RU.UTF-8");
    assert!(ru.status.success());
    assert!(text(&ru).contains("Агент остановлен: сервер удалён или токен заменён"), "{}", text(&ru));
    assert!(text(&n.status("C.UTF-8")).contains("Agent stopped: server deleted or token replaced"));
    // The config stays: stopping for good removes nothing.
    assert!(n.config().exists());
}

/// Issue 43: a token replaced in the cabinet, and the cabinet's own steps on a machine behind a
/// private CA with its own Docker socket, registries and `rentals = false`. The agent stops (78)
/// and `status` points at the cabinet's commands; `configure --server URL --node-id ID` with the
/// new token on stdin (the cabinet's first command, as shown) keeps every other setting, so the
/// machine connects again. (Before the fix `configure` wrote its flags alone: `ca_file` was
/// dropped and the TLS handshake with the private CA failed.)
#[test]
fn the_cabinets_steps_after_a_token_replacement_keep_every_setting() {
    let p = TestPlatform::start(PlatformOpts::default());
    assert!(p.ca_path().is_some(), "a platform behind a private CA");
    let n = register(&p);
    n.append_config("rentals = false");
    let before = std::fs::read_to_string(n.config()).unwrap();
    let parse = |t: &str| gpum_enroll::config::Config::parse(t, "config.toml").unwrap();
    let old = parse(&before);
    assert!(old.ca_file.is_some() && old.docker_socket.is_some() && !old.rentals, "{before}");

    let mut a = Agent::start(&n);
    wait_heartbeats(&p, &n.id, 1);
    let token = p.rotate_token(&n.id);
    let exit = a.wait_exit(Duration::from_secs(10)).expect("exits after the token is replaced");
    assert_eq!(exit.code(), Some(78), "{}", a.log());
    assert_eq!(n.status_json()["stopped"]["detail"], "token_replaced");
    for (lang, want) in [("ru_RU.UTF-8", "gpum-agent configure"), ("C.UTF-8", "gpum-agent configure")] {
        let st = n.status(lang);
        assert!(text(&st).contains(want), "{lang}: {}", text(&st));
    }

    // The cabinet's first command, as the page shows it (the server's public URL and the id).
    let out = run_with_stdin(
        agent_cmd(&["configure", "--state", n.state_str(), "--server", p.url(), "--node-id", &n.id]),
        &format!("{token}\n"),
    );
    assert!(out.status.success(), "configure: {}", text(&out));
    let after = parse(&std::fs::read_to_string(n.config()).unwrap());
    assert_eq!(after.token.expose(), token);
    assert_eq!(
        after,
        gpum_enroll::config::Config { token: after.token.clone(), ..old },
        "every other key kept"
    );
    let mode = std::fs::metadata(n.config()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // And the machine connects again through its private CA.
    let out = agent_cmd(&["smoke", "--state", n.state_str()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// Issue 35: two replicas on one PostgreSQL, as behind a load balancer. The agent registers and
/// heartbeats through one; the node is deleted through the other; the agent stops for good (78)
/// as it does on one platform.
#[test]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
fn a_node_deleted_through_one_replica_stops_its_agent_on_the_other() {
    use gpum_platform::sql::Engine;
    use gpum_platform::testdb::TestDb;
    let a = TestPlatform::start_on(PlatformOpts::default(), Arc::new(TestDb::on(Engine::Postgres)));
    let b = a.replica();
    let n = register(&b);
    let mut agent = Agent::start(&n);
    // Heard through b, seen through a.
    wait_heartbeats(&a, &n.id, 2);
    a.delete_node(&n.id);
    let exit = agent
        .wait_exit(Duration::from_secs(5))
        .expect("exits after the node is deleted on the other replica");
    assert_eq!(exit.code(), Some(78), "{}", agent.log());
    assert_eq!(n.status_json()["stopped"]["detail"], "node_deleted");
}

#[test]
fn missing_or_invalid_config_exits_78_with_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let out = agent_cmd(&["run", "--state", state]).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    let st = agent_cmd(&["status", "--state", state]).env("LANG", "ru_RU.UTF-8").output().unwrap();
    assert!(text(&st).contains("Агент остановлен: ошибка конфигурации"), "{}", text(&st));

    std::fs::write(
        dir.path().join("config.toml"),
        "server = 'http://10.1.2.3'\nnode_id = 'n'\ntoken = 'abc'\n",
    )
    .unwrap();
    let out = agent_cmd(&["run", "--state", state]).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "plain http off loopback is a config error: {}", text(&out));
    let st = agent_cmd(&["status", "--json", "--state", state]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["stopped"]["reason"], "config_error");
}

/// A loopback stand-in for a captive portal or a misconfigured reverse proxy: in `HTML` mode it
/// answers every request with an HTML 401/403/502 page; in `FORWARD` mode it pipes bytes to the
/// real platform.
struct Proxy {
    port: u16,
    mode: Arc<AtomicU8>,
}
const HTML: u8 = 0;
const FORWARD: u8 = 1;

impl Proxy {
    fn start(upstream: u16) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(HTML));
        let m = mode.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                n += 1;
                let m = m.load(Ordering::SeqCst);
                std::thread::spawn(move || if m == HTML { html(s, n) } else { forward(s, upstream) });
            }
        });
        Proxy { port, mode }
    }
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn html(s: TcpStream, n: u32) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    let status = ["401 Unauthorized", "403 Forbidden", "502 Bad Gateway"][n as usize % 3];
    let page = format!("<html><body><h1>{status}</h1>Please log in to the network.</body></html>");
    let mut s = s;
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    );
}

fn forward(client: TcpStream, upstream: u16) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
    let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let t = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut s2);
        let _ = s2.shutdown(std::net::Shutdown::Write);
    });
    let (mut c, mut s) = (client, server);
    let _ = std::io::copy(&mut s, &mut c);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let _ = t.join();
}

#[test]
fn a_proxys_html_401_does_not_stop_the_agent() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let n = register(&p);
    let proxy = Proxy::start(p.port());
    n.configure_server(&proxy.url());
    let mut a = Agent::start(&n);
    // Several intervals of HTML 401/403/502 pages.
    wait_until(LONG, "the agent to meet the proxy", || a.log().contains("heartbeat failed"));
    std::thread::sleep(Duration::from_secs(4));
    assert!(a.running(), "an HTML 401 must not stop the agent: {}", a.log());
    assert_eq!(n.status_json()["connection"], "unreachable");
    assert!(n.status_json()["stopped"].is_null());
    let seq = last_seq(&p, &n.id);
    assert_eq!(seq, 0, "nothing reached the platform yet");

    proxy.mode.store(FORWARD, Ordering::SeqCst);
    wait_heartbeats(&p, &n.id, 2);
    assert!(a.running());
    // The platform records a beat before it answers; the agent logs after the answer.
    wait_until(LONG, "the agent to say the platform is reachable again", || {
        a.log().contains("platform reachable again")
    });
}

/// With a proxy variable (the installer writes them into the unit), heartbeats go through the
/// proxy: reqwest's client, which speaks to proxies, and not the heartbeat's lean client, which
/// goes direct. The stand-in proxy first answers with its own page, so nothing reaches the
/// platform; then it forwards, and the heartbeats (absolute-form requests) arrive.
#[test]
fn with_a_proxy_variable_heartbeats_go_through_the_proxy() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let n = register(&p);
    let proxy = Proxy::start(p.port());
    let mut cmd = Command::new(bin("gpum-agent"));
    cmd.env("HTTP_PROXY", proxy.url()).env_remove("NO_PROXY").env_remove("no_proxy");
    let mut a = Agent::start_with(&n, cmd, "debug");
    wait_until(LONG, "the agent's heartbeat to meet the proxy", || a.log().contains("heartbeat failed"));
    assert_eq!(last_seq(&p, &n.id), 0, "a heartbeat went around the proxy: {}", a.log());
    proxy.mode.store(FORWARD, Ordering::SeqCst);
    wait_heartbeats(&p, &n.id, 2);
    assert!(a.running(), "{}", a.log());
}

#[test]
fn platform_down_for_many_intervals_then_back() {
    let mut p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    let mut a = Agent::start(&n);
    wait_heartbeats(&p, &n.id, 2);
    p.stop();
    std::thread::sleep(Duration::from_secs(6));
    assert!(a.running(), "{}", a.log());
    assert_eq!(n.status_json()["connection"], "unreachable");
    let seq = last_seq(&p, &n.id);
    p.restart();
    let t0 = Instant::now();
    wait_until(LONG, "a heartbeat after the platform came back", || last_seq(&p, &n.id) > seq);
    eprintln!("back after {:?}", t0.elapsed());
    assert!(a.running());
    let log = a.log();
    // One warning for the outage, not one per attempt.
    let warns = log.lines().filter(|l| l.contains("WARN") && l.contains("heartbeat failed")).count();
    assert_eq!(warns, 1, "{log}");
    assert!(log.lines().filter(|l| l.contains("DEBUG") && l.contains("heartbeat failed")).count() >= 2);
}

#[test]
fn the_platform_clock_being_off_is_reported_not_fatal() {
    let p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    let mut a = Agent::start(&n);
    wait_heartbeats(&p, &n.id, 1);
    p.advance_clock(600);
    wait_until(LONG, "the skew in health", || {
        node(&p, &n.id).health.and_then(|h| h.clock_skew_secs).is_some_and(|s| (-610..=-590).contains(&s))
    });
    assert!(a.running());
    wait_until(LONG, "the skew in status", || n.status_json()["clock_skew_secs"].as_i64().is_some());
    assert!(text(&n.status("C.UTF-8")).contains("clock skew"));
}

#[test]
fn smoke_exit_codes() {
    let p = TestPlatform::start(PlatformOpts::default());
    let n = register(&p);
    let smoke = |n: &Node| agent_cmd(&["smoke", "--state", n.state_str()]).output().unwrap();
    let out = smoke(&n);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // 1: nothing listens (connection refused).
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let n2 = register(&p);
    n2.configure_server(&format!("http://127.0.0.1:{free}"));
    assert_eq!(smoke(&n2).status.code(), Some(1), "{}", text(&smoke(&n2)));

    // 3: something accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    n2.configure_server(&format!("http://127.0.0.1:{}", silent.local_addr().unwrap().port()));
    let t0 = Instant::now();
    let out = smoke(&n2);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(t0.elapsed() < Duration::from_secs(15));
    assert_eq!(
        agent_cmd(&["doctor", "--connectivity", "--state", n2.state_str()]).output().unwrap().status.code(),
        Some(3),
        "doctor --connectivity uses smoke's codes"
    );
    drop(silent);

    // 4: the platform rejects the token.
    p.rotate_token(&n.id);
    let out = smoke(&n);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
}

#[test]
#[ignore = "needs root (it drops root to run status)"]
fn status_without_root_exits_13() {
    assert_eq!(nix::unistd::geteuid().as_raw(), 0, "the test drops root, so it needs root");
    // A copy of the binary that uid 65534 can execute wherever the target directory is.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("gpum-agent");
    std::fs::copy(bin("gpum-agent"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .arg("status")
        .env("LANG", "ru_RU.UTF-8")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(13), "{}", text(&out));
    assert!(text(&out).contains("Для чтения состояния агента нужны права root (sudo)"), "{}", text(&out));
}

#[test]
fn cli_shape() {
    let out = agent_cmd(&["--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    for c in ["register", "configure", "run", "smoke", "status", "doctor", "version"] {
        assert!(text(&out).contains(c), "--help lists {c}");
    }
    assert_eq!(agent_cmd(&["frobnicate"]).output().unwrap().status.code(), Some(2));
    assert_eq!(agent_cmd(&[]).output().unwrap().status.code(), Some(2));
    let v = agent_cmd(&["version"]).output().unwrap();
    assert!(v.status.success() && text(&v).contains(env!("CARGO_PKG_VERSION")));
    let d = agent_cmd(&["doctor", "--state", "/nonexistent/gpum"]).output().unwrap();
    assert_eq!(d.status.code(), Some(0), "the full report is not a verdict: {}", text(&d));
    assert!(text(&d).contains("[gpu]") && text(&d).contains("[platform]"));
    assert!(text(&d).contains("\n  handshake:        "), "{}", text(&d));
    // Under a Russian locale the labels are Russian too, not only the checks.
    let d =
        agent_cmd(&["doctor", "--state", "/nonexistent/gpum"]).env("LANG", "ru_RU.UTF-8").output().unwrap();
    assert_eq!(d.status.code(), Some(0), "{}", text(&d));
    for label in ["[видеокарты]", "[платформа]", "\n  настройки:        ", "\n  проверка связи:   "]
    {
        assert!(text(&d).contains(label), "{label:?} in {}", text(&d));
    }
    assert!(!text(&d).contains("[platform]") && !text(&d).contains("handshake:"), "{}", text(&d));
}

#[test]
fn sigterm_during_a_hung_heartbeat_exits_0_within_10_s_and_a_second_signal_at_once() {
    let p = TestPlatform::start(PlatformOpts::default());
    // Something that accepts connections and never answers: the heartbeat hangs in flight.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let n = register(&p);
    n.configure_server(&url);

    let mut a = Agent::start(&n);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(a.running());
    let t0 = Instant::now();
    a.signal(nix::sys::signal::Signal::SIGTERM);
    let exit = a.wait_exit(Duration::from_secs(10)).expect("exits within 10 s of SIGTERM even mid-request");
    assert_eq!(exit.code(), Some(0), "{}", a.log());
    eprintln!("SIGTERM with a hung heartbeat -> exit in {:?}", t0.elapsed());

    let mut b = Agent::start(&n);
    std::thread::sleep(Duration::from_millis(1500));
    b.signal(nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    let t1 = Instant::now();
    b.signal(nix::sys::signal::Signal::SIGINT);
    let exit = b.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(exit.code(), Some(0));
    assert!(t1.elapsed() < Duration::from_secs(2), "the second signal quits at once, not after the grace");
    assert!(b.log().contains("second signal"), "{}", b.log());
    drop(silent);
}

/// The reconciler in the real agent: an unknown `gpum.managed=true` container is removed and
/// reported, while a known one and an unlabelled one stay. The config's test-only
/// `test_reconcile_min_age_secs = 0` drops the 60 s age rule (the three-answers rule stays), so
/// the removal happens within seconds; the thresholds themselves are tested in `docker.rs`.
#[ignore = "needs a Docker engine"]
#[test]
fn unknown_managed_containers_are_removed_known_and_unlabelled_ones_stay() {
    require_docker("unknown_managed_containers_are_removed");
    let image = gpum_tests::images::busybox().expect("test image");
    let scope = format!("gpum.test.agent-e2e=m{}", std::process::id());
    let create = |labels: &[&str]| {
        let mut c = Command::new("docker");
        c.arg("create");
        for l in labels {
            c.args(["--label", l]);
        }
        let out = c.args([image.as_str(), "true"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let known = create(&["gpum.managed=true", &scope]);
    let unknown = create(&["gpum.managed=true", &scope]);
    let unlabelled = create(&[&scope]);
    // Removed on every exit, a failed assertion included.
    struct Remove(Vec<String>);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = Command::new("docker").arg("rm").arg("-f").args(&self.0).output();
        }
    }
    let _remove = Remove(vec![known.clone(), unknown.clone(), unlabelled.clone()]);
    let exists = |id: &str| Command::new("docker").args(["inspect", id]).output().unwrap().status.success();

    let p = TestPlatform::start(PlatformOpts::default());
    let n = register_with(&p, "/var/run/docker.sock");
    n.append_config(&format!("test_docker_scope = \"{scope}\"\ntest_reconcile_min_age_secs = 0"));
    p.set_known_containers(&n.id, &[&known]);
    let a = Agent::start(&n);
    // The first report that lists it, kept as it was: the removal follows a few beats later.
    let mut first = None;
    wait_until(LONG, "the managed containers on the platform", || {
        let s = node(&p, &n.id);
        let listed = s.managed_containers.contains(&unknown);
        first = Some(s);
        listed
    });
    let s = first.expect("a report");
    let mut listed = s.managed_containers.clone();
    listed.sort();
    let mut want = vec![known.clone(), unknown.clone()];
    want.sort();
    assert_eq!(listed, want, "only the labelled containers are listed");
    assert!(s.health.is_some_and(|h| h.docker_ok));

    wait_until(LONG, "the removal of the unknown container, reported", || {
        node(&p, &n.id).removed_containers.iter().any(|r| r.id == unknown)
    });
    assert!(!exists(&unknown), "reported removed but still there: {}", a.log());
    assert!(a.log().contains("removed managed container"), "{}", a.log());
    // However many more heartbeats pass, the known and the unlabelled container stay.
    let seq = last_seq(&p, &n.id);
    wait_heartbeats(&p, &n.id, seq + 4);
    assert!(exists(&known) && exists(&unlabelled), "{}", a.log());
    assert_eq!(node(&p, &n.id).managed_containers, vec![known.clone()]);

    // A container that appears while the agent runs is reported within a few heartbeats: the
    // engine's event stream says the list changed. (Without it, the agent would list again only
    // after `LIST_AT_LEAST_EVERY`, 60 s.)
    let late = create(&["gpum.managed=true", &scope]);
    let _remove_late = Remove(vec![late.clone()]);
    wait_until(Duration::from_secs(20), "the new managed container on the platform", || {
        node(&p, &n.id).managed_containers.contains(&late)
    });
}

// ---------------------------------------------------------------------------------------------
// Issue 14, item 4: no platform answer can wedge the agent.

/// A stand-in platform on loopback that misbehaves on purpose, as a buggy or hostile platform
/// could: it hands over more commands than one answer may carry, hands answered ones over
/// again, and refuses (400/413) bodies it dislikes. The real platform behaves; this one is here
/// to prove that the agent survives one that does not. It records every result it accepted.
struct StubPlatform {
    port: u16,
    state: Arc<std::sync::Mutex<StubState>>,
}

#[derive(Default)]
struct StubState {
    /// `(id, kind)` handed over in every answer (all of them, or only the unanswered ones).
    commands: Vec<(String, String)>,
    resend_answered: bool,
    /// Times each result id was accepted.
    results: std::collections::HashMap<String, u32>,
    /// A result id whose presence makes the stub refuse the whole body with 400.
    poison: Option<String>,
    /// The probe image every answer names.
    probe_image: Option<String>,
    /// Whether every answer also carries a `recheck` never handed over before (its id holds
    /// control characters, as a hostile platform's could).
    fresh_recheck: bool,
    /// How many fresh rechecks were handed over, and each accepted result's message.
    rechecks_sent: u32,
    messages: std::collections::HashMap<String, String>,
    accepted: u32,
    refused: u32,
    /// The rentals every answer lists (issue 33), and each rental's states as the heartbeats
    /// reported them, in order, a repeat of the last one left out.
    rentals: Vec<serde_json::Value>,
    rental_states: std::collections::HashMap<String, Vec<String>>,
    /// Each rental's last reason, and the last heartbeat's `quarantine` (issue 33).
    rental_reasons: std::collections::HashMap<String, String>,
    quarantine: serde_json::Value,
}

impl StubPlatform {
    fn start(state: StubState) -> StubPlatform {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(std::sync::Mutex::new(state));
        let st = state.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let st = st.clone();
                std::thread::spawn(move || stub_answer(s, &st));
            }
        });
        StubPlatform { port, state }
    }

    /// A state directory with a config pointing at this stub (no registration: the stub takes
    /// any token).
    fn node(&self) -> Node {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.toml"),
            format!(
                "server = 'http://127.0.0.1:{}'\nnode_id = 'stub-node'\ntoken = 'stub-token-0123456789'\n\
                 docker_socket = '{MISSING_DOCKER}'\n",
                self.port
            ),
        )
        .unwrap();
        Node { dir, id: "stub-node".into() }
    }

    fn with<T>(&self, f: impl FnOnce(&StubState) -> T) -> T {
        f(&self.state.lock().unwrap())
    }
}

fn stub_answer(s: TcpStream, st: &std::sync::Mutex<StubState>) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    if r.read_exact(&mut body).is_err() {
        return;
    }
    let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let ids: Vec<String> = req["command_results"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["id"].as_str().map(String::from)).collect())
        .unwrap_or_default();
    let messages: Vec<(String, String)> = req["command_results"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| Some((r["id"].as_str()?.to_string(), r["message"].as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let mut g = st.lock().unwrap();
    for r in req["rentals"].as_array().into_iter().flatten() {
        let (Some(id), Some(state)) = (r["id"].as_str(), r["state"].as_str()) else { continue };
        let seen = g.rental_states.entry(id.to_string()).or_default();
        if seen.last().map(String::as_str) != Some(state) {
            seen.push(state.to_string());
        }
        if let Some(why) = r["reason"].as_str() {
            g.rental_reasons.insert(id.to_string(), why.to_string());
        }
    }
    g.quarantine = req["quarantine"].clone();
    let too_many = ids.len() > gpum_protocol::limits::MAX_COMMAND_RESULTS;
    let poisoned = g.poison.as_ref().is_some_and(|p| ids.contains(p));
    let (status, ctype, page) = if too_many || poisoned {
        g.refused += 1;
        let status = if too_many { "413 Payload Too Large" } else { "400 Bad Request" };
        (status, "text/plain", "refused".to_string())
    } else {
        g.accepted += 1;
        for id in ids {
            *g.results.entry(id).or_default() += 1;
        }
        g.messages.extend(messages);
        if g.fresh_recheck {
            g.rechecks_sent += 1;
            let id = format!("recheck-\x1b[2J\x07-{}", g.rechecks_sent);
            g.commands.push((id, "recheck".into()));
        }
        let commands: Vec<serde_json::Value> = g
            .commands
            .iter()
            .filter(|(id, _)| g.resend_answered || !g.results.contains_key(id))
            .map(|(id, kind)| serde_json::json!({ "id": id, "kind": kind }))
            .collect();
        let answer = serde_json::json!({
            "heartbeat_interval_secs": 1,
            "commands": commands,
            "known_containers": [],
            "probe_image": g.probe_image,
            "rentals": g.rentals,
        });
        ("200 OK", "application/json", answer.to_string())
    };
    drop(g);
    let mut s = s;
    let _ = write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    );
}

/// A platform that refuses every heartbeat carrying one particular result: the agent sends
/// less and less, drops that one result, and delivers every other. Before the fix, the same
/// refused body went out forever and nothing was delivered again.
#[test]
fn a_refused_body_is_trimmed_and_the_rest_is_delivered() {
    let mut commands: Vec<(String, String)> = vec![("cmd-poison".into(), "recheck".into())];
    commands.extend((0..20).map(|i| (format!("cmd-{i:02}"), "recheck".to_string())));
    let stub = StubPlatform::start(StubState {
        commands: commands.clone(),
        poison: Some("cmd-poison".into()),
        ..Default::default()
    });
    let n = stub.node();
    let mut a = Agent::start(&n);
    wait_until(Duration::from_secs(60), "every other result delivered", || {
        stub.with(|s| commands.iter().skip(1).all(|(id, _)| s.results.contains_key(id)))
    });
    stub.with(|s| {
        assert!(s.refused >= 1, "the poison was sent and refused");
        assert!(!s.results.contains_key("cmd-poison"));
    });
    assert!(a.log().contains("dropped what it carried"), "{}", a.log());
    // It goes on: more heartbeats are accepted, and it is connected.
    let accepted = stub.with(|s| s.accepted);
    wait_until(LONG, "more heartbeats", || stub.with(|s| s.accepted >= accepted + 2));
    assert!(a.running());
    assert_eq!(n.status_json()["connection"], "connected");
}

/// A platform that hands over the same `restart` again after the agent restarted (its
/// acknowledgement lost, or a bug): the restart is obeyed once, not in a loop. Before the fix,
/// every start obeyed it again.
#[test]
fn a_restart_handed_over_again_after_the_restart_is_not_obeyed_twice() {
    let stub = StubPlatform::start(StubState {
        commands: vec![("cmd-restart".into(), "restart".into())],
        resend_answered: true,
        ..Default::default()
    });
    let n = stub.node();
    let mut a = Agent::start(&n);
    let exit = a.wait_exit(LONG).expect("exits on restart");
    assert_eq!(exit.code(), Some(gpum_agent::run::EXIT_RESTART), "{}", a.log());
    // What systemd does next: start it again, with the same state directory.
    let mut b = Agent::start(&n);
    let accepted = stub.with(|s| s.accepted);
    wait_until(LONG, "heartbeats after the restart", || stub.with(|s| s.accepted >= accepted + 3));
    assert!(b.running(), "obeyed the same restart again: {}", b.log());
    assert_eq!(stub.with(|s| s.results.get("cmd-restart").copied()), Some(1));
}

/// Issue 29, items 4 and 7, the wiring: a platform that puts a new `recheck` in every answer
/// (the pacing rule itself is `core`'s and the ledger's tests): the real agent consults its
/// ledger, keeps it in `probes.json` of its state directory and reads it back after a restart,
/// and its log lines carry the platform's terminal escapes escaped, never raw. (No engine here:
/// each probe ends at once as `docker_unavailable`, the fastest a probe can be.)
#[test]
fn a_recheck_in_every_answer_starts_no_more_probes_than_the_rate_limit() {
    let image = "gpum-test/busybox\x1b]0;owned\x07@sha256:\x1b[2J";
    let stub = StubPlatform::start(StubState {
        probe_image: Some(image.into()),
        fresh_recheck: true,
        ..Default::default()
    });
    let n = stub.node();
    let probes = |a: &Agent| a.log().matches("running the GPU probe").count();
    let mut a = Agent::start(&n);
    wait_until(LONG, "six answers with a recheck each", || stub.with(|s| s.accepted >= 6));
    assert!(a.running(), "{}", a.log());
    assert_eq!(probes(&a), 1, "one probe, the rest held back: {}", a.log());
    assert!(a.log().contains("it waits for the rate limit"), "{}", a.log());
    // The first recheck came with the first answer and was answered when its probe started; the
    // later ones wait for the next probe, answered then (not lost, not answered early).
    stub.with(|s| {
        let first = "recheck-\x1b[2J\x07-1";
        assert_eq!(s.messages.get(first).map(String::as_str), Some("probe started"), "{:?}", s.messages);
        assert_eq!(s.results.len(), 1, "only the first recheck is answered yet: {:?}", s.results);
    });
    // A restart keeps the limit: the agent that starts again probes no sooner.
    a.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(a.wait_exit(LONG).and_then(|s| s.code()), Some(0));
    let first_log = a.log();
    let mut b = Agent::start(&n);
    let accepted = stub.with(|s| s.accepted);
    wait_until(LONG, "three more answers", || stub.with(|s| s.accepted >= accepted + 3));
    assert!(b.running(), "{}", b.log());
    assert_eq!(probes(&b), 0, "the limit survived the restart: {}", b.log());
    assert!(b.log().contains("it waits for the rate limit"), "{}", b.log());
    assert!(n.state().join("probes.json").exists());
    b.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(b.wait_exit(LONG).and_then(|s| s.code()), Some(0));
    let second_log = b.log();
    // Item 7: the platform's text in the log lines is escaped, never raw.
    for log in [first_log, second_log] {
        assert!(log.contains("probe image set by the platform"), "{log}");
        assert!(log.contains("command recheck"), "{log}");
        assert!(
            !log.contains('\x1b') && !log.contains('\x07'),
            "a raw control character in the log: {log:?}"
        );
        assert!(log.contains("\\x1b]0;owned\\x07@sha256:\\x1b[2J"), "{log}");
    }
}

/// Issue 33, the agent's side of rentals through the real binary, against a stub platform: a
/// rental runs, survives an agent restart (adopted, not recreated), and at its end the agent
/// tears it down, asks NVML whether its GPU is free (the SIMULATED NVML, `GPUM_NVML_LIB`, driven
/// by its JSON file) and reports it gone. A second rental's GPU still runs a process after its
/// teardown (as a hung workload would leave): it is reported failed with why, the node is
/// quarantined (in every heartbeat, and in `gpus.json`), and a new rental is refused. The engine
/// here has no NVIDIA toolkit: the agent runs the rentals through its `test-knobs` seam without
/// the GPU request (`test_rentals_without_gpu_request`).
#[ignore = "needs a Docker engine"]
#[test]
fn rentals_run_survive_an_agent_restart_stop_at_their_end_and_a_busy_gpu_quarantines() {
    require_docker("rentals_run_survive_an_agent_restart_stop_at_their_end_and_a_busy_gpu_quarantines");
    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let rid = |i: u64| {
        format!("rent-{:016x}", (now.as_nanos() as u64 ^ u64::from(std::process::id())).wrapping_add(i))
    };
    let (id, busy, late) = (rid(0), rid(1), rid(2));
    // The simulation's GPUs 0 and 1.
    let gpu = |i: u32| format!("GPU-5a1e0000-0000-4000-8000-{i:012}");
    let name = gpum_agent::docker::rental::container_name(&id);
    struct Remove(Vec<String>);
    impl Drop for Remove {
        fn drop(&mut self) {
            for n in &self.0 {
                let _ = Command::new("docker").args(["rm", "-f", "-v", n]).output();
            }
        }
    }
    let _remove =
        Remove([&id, &busy, &late].iter().map(|i| gpum_agent::docker::rental::container_name(i)).collect());
    let rental = |id: &str, gpu: &str, ends_at: u64| {
        serde_json::json!({
            "id": id, "image": image, "gpu_uuids": [gpu],
            "cpu_millis": 500, "memory_mib": 128, "disk_gib": 0, "shm_mib": 16,
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            "command": ["sleep", "3600"], "ends_at": ends_at,
        })
    };
    let stub = StubPlatform::start(StubState {
        rentals: vec![rental(&id, &gpu(0), now.as_secs() + 15), rental(&busy, &gpu(1), now.as_secs() + 25)],
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "server = 'http://127.0.0.1:{}'\nnode_id = 'stub-node'\ntoken = 'stub-token-0123456789'\n\
             test_docker_scope = 'gpum.test.agent-rental=p{}'\ntest_rentals_without_gpu_request = true\nrentals = true\n",
            stub.port,
            std::process::id()
        ),
    )
    .unwrap();
    // The simulated NVML and the file that describes the machine to it.
    let sim = gpum_tests::build_nvml_sim(dir.path());
    let gpu_json = dir.path().join("gpu.json");
    std::fs::write(&gpu_json, r#"{"state":"ok","gpus":2}"#).unwrap();
    let agent = || {
        let mut c = Command::new(bin("gpum-agent"));
        c.env("GPUM_NVML_LIB", &sim).env("GPUM_SIM_CONFIG", &gpu_json).env_remove("GPUM_SIM_NVML");
        c
    };
    let n = Node { dir, id: "stub-node".into() };
    let states =
        |stub: &StubPlatform, id: &str| stub.with(|s| s.rental_states.get(id).cloned().unwrap_or_default());
    let last = |stub: &StubPlatform, id: &str| states(stub, id).last().cloned().unwrap_or_default();
    let inspect = |f: &str| {
        let out = Command::new("docker").args(["inspect", "--format", f, &name]).output().unwrap();
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };

    let mut a = Agent::start_with(&n, agent(), "debug");
    wait_until(LONG, "the rentals reported running", || {
        last(&stub, &id) == "running" && last(&stub, &busy) == "running"
    });
    // What a hung workload leaves on the second rental's GPU: a process NVML still lists.
    std::fs::write(&gpu_json, r#"{"state":"ok","gpus":2,"processes":"1:4242"}"#).unwrap();
    let started = inspect("{{.Id}} {{.State.StartedAt}}").expect("its container");
    assert_eq!(
        inspect("{{range .Config.Env}}{{println .}}{{end}}")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("NVIDIA_VISIBLE_DEVICES="))
            .collect::<Vec<_>>(),
        vec![format!("NVIDIA_VISIBLE_DEVICES={}", gpu(0))]
    );

    // Killed outright: the rental runs on, and the next agent adopts it.
    a.signal(nix::sys::signal::Signal::SIGKILL);
    assert!(a.wait_exit(LONG).is_some());
    assert_eq!(inspect("{{.State.Running}}").as_deref(), Some("true"));
    let accepted = stub.with(|s| s.accepted);
    let _b = Agent::start_with(&n, agent(), "debug");
    wait_until(LONG, "heartbeats from the new agent", || stub.with(|s| s.accepted >= accepted + 3));
    assert_eq!(inspect("{{.Id}} {{.State.StartedAt}}"), Some(started), "not recreated, not restarted");
    assert_eq!(last(&stub, &id), "running");

    // Its end passes; the platform still lists it. Its GPU is free: gone.
    wait_until(Duration::from_secs(40), "the rental reported gone", || last(&stub, &id) == "gone");
    assert!(inspect("{{.Id}}").is_none(), "its container is gone");
    let seen = states(&stub, &id);
    assert!(
        seen.ends_with(&["stopping".to_string(), "gone".to_string()])
            || seen.ends_with(&["gone".to_string()]),
        "{seen:?}"
    );
    assert!(stub.with(|s| s.quarantine.is_null()), "not quarantined while the GPUs are free");

    // The second one's end passes: its container goes, but a process is left on its GPU (the
    // agent asks again for a while, then gives up): failed, and the node is quarantined.
    wait_until(Duration::from_secs(60), "the busy rental reported failed", || last(&stub, &busy) == "failed");
    assert!(!container_exists(&gpum_agent::docker::rental::container_name(&busy)), "its container is gone");
    let why = stub.with(|s| s.rental_reasons.get(&busy).cloned().unwrap_or_default());
    let expected = format!("GPU check after rental {busy} failed: {}: 1 process left (pid 4242)", gpu(1));
    assert_eq!(why, expected);
    wait_until(LONG, "the heartbeat carrying the quarantine", || !stub.with(|s| s.quarantine.is_null()));
    let q = stub.with(|s| s.quarantine.clone());
    assert_eq!(
        (q["reason"].as_str(), q["gpu_uuids"].clone()),
        (Some(expected.as_str()), serde_json::json!([gpu(1)]))
    );
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(n.state().join("gpus.json")).unwrap()).unwrap();
    assert_eq!(kept["quarantine"], q, "kept in the state directory");
    assert_eq!(std::fs::metadata(n.state().join("gpus.json")).unwrap().permissions().mode() & 0o777, 0o600);

    // While quarantined a new rental, even on the GPU that was free, is refused.
    stub.state.lock().unwrap().rentals.push(rental(&late, &gpu(0), now.as_secs() + 3600));
    wait_until(LONG, "the new rental refused", || last(&stub, &late) == "failed");
    let why = stub.with(|s| s.rental_reasons.get(&late).cloned().unwrap_or_default());
    assert_eq!(why, format!("refused: this node is quarantined: {expected}"));
    assert!(!container_exists(&gpum_agent::docker::rental::container_name(&late)), "nothing started");
}

/// Whether the engine knows container `name`.
fn container_exists(name: &str) -> bool {
    Command::new("docker").args(["inspect", name]).output().unwrap().status.success()
}
