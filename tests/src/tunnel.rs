//! The setup the tunnel suites share (issue 34, `tests/e2e/tunnel.rs` and what includes it): a
//! node made rentable over HTTP, rentals whose container runs small servers, the real agent on
//! the simulated NVML, a tenant's `CONNECT` at the relay's TCP door, and an echo session.
//!
//! [`TunnelWorld::start`] puts it together: the real platform with the relay's doors, one node,
//! two rentals on it, and the agent running with its tunnel up.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use gpum_protocol::{
    GpuPublic, Health, HeartbeatRequest, Inventory, NvmlState, PATH_HEARTBEAT, PATH_REGISTER, ProbeReport,
    RegisterRequest, RegisterResponse, VerificationState,
};

use crate::bin;
use crate::platform::{PlatformOpts, TestPlatform, wait_until};

/// How long the suites wait for a rental to run, a tunnel to come up.
pub const LONG: Duration = Duration::from_secs(60);

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A node's inventory with two simulated T4s (the UUIDs [`start_agent`]'s simulated NVML has).
pub fn inventory() -> Inventory {
    let mut inv = Inventory::default();
    inv.public.cpu_model = "Test CPU".into();
    inv.public.cpu_cores = 16;
    inv.public.ram_mib = 65_536;
    inv.public.disk_gib = 500;
    inv.public.gpus = vec![GpuPublic { model: "Tesla T4".into(), vram_mib: 15_360 }; 2];
    inv.private.gpu_uuids = vec![
        "GPU-5a1e0000-0000-4000-8000-000000000000".into(),
        "GPU-5a1e0000-0000-4000-8000-000000000001".into(),
    ];
    inv
}

/// A node made rentable over HTTP (registered, its check passed, priced).
pub async fn rentable_node(p: &TestPlatform) -> RegisterResponse {
    rentable_node_with(p, inventory()).await
}

/// [`rentable_node`] with the given inventory.
pub async fn rentable_node_with(p: &TestPlatform, inventory: Inventory) -> RegisterResponse {
    // Trusts the platform's CA when it speaks TLS.
    let c = p.http_client();
    let inventory = || inventory.clone();
    let req = RegisterRequest {
        join_code: p.join_code(),
        agent_version: "0.1.0".into(),
        inventory: inventory(),
        install_id: None,
    };
    let reg: RegisterResponse =
        c.post(format!("{}{PATH_REGISTER}", p.url())).json(&req).send().await.unwrap().json().await.unwrap();
    let hb = HeartbeatRequest {
        seq: 1,
        inventory_hash: inventory().hash(),
        health: Health { docker_ok: true, nvml: NvmlState::Ok, ..Default::default() },
        probe: Some(ProbeReport {
            state: VerificationState::Verified,
            reason: None,
            output: "ok".into(),
            finished_at: 1,
            image: String::new(),
        }),
        ..Default::default()
    };
    let r =
        c.post(format!("{}{PATH_HEARTBEAT}", p.url())).bearer_auth(&reg.node_token).json(&hb).send().await;
    assert!(r.unwrap().status().is_success());
    p.cli_json(&["nodes", "set", &reg.node_id, "--price", "1.50"]);
    reg
}

/// A rental: its id and the tenant's credential (shown once, at creation).
#[derive(Debug, Clone)]
pub struct Rental {
    pub id: String,
    pub credential: String,
}

/// The rental's command: a web server on 8080 and a line echo server on 7000.
pub const SERVERS: &str = "mkdir -p /www && echo hello-from-rental > /www/index.html && httpd -p 8080 -h /www && exec nc -ll -p 7000 -e cat";

/// The ports [`create_rental`] lists.
pub const PORTS: [u16; 2] = [7000, 8080];

/// A rental exposing [`PORTS`] whose container runs [`SERVERS`].
pub fn create_rental(p: &TestPlatform, node: &str, image: &str) -> Rental {
    create_rental_running(p, node, image, SERVERS)
}

/// A rental exposing [`PORTS`] whose container runs `sh -c script`.
pub fn create_rental_running(p: &TestPlatform, node: &str, image: &str, script: &str) -> Rental {
    create_rental_with_ports(p, node, image, &PORTS, script)
}

/// A rental exposing `ports` whose container runs `sh -c script`.
pub fn create_rental_with_ports(
    p: &TestPlatform,
    node: &str,
    image: &str,
    ports: &[u16],
    script: &str,
) -> Rental {
    let mut args: Vec<String> = [
        "rentals",
        "create",
        "--node",
        node,
        "--image",
        image,
        "--gpus",
        "1",
        "--cpu-millis",
        "500",
        "--memory-mib",
        "128",
        "--disk-gib",
        "1",
        "--shm-mib",
        "16",
        "--duration",
        "1h",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for port in ports {
        args.extend(["--port".to_string(), port.to_string()]);
    }
    args.extend(["--", "sh", "-c", script].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = p.cli_json(&args);
    Rental {
        id: v["spec"]["id"].as_str().unwrap().to_string(),
        credential: v["tunnel"]["credential"].as_str().expect("the credential, once").to_string(),
    }
}

/// The rental's state as the platform shows it (`running`, `gone`, …).
pub fn rental_state(p: &TestPlatform, id: &str) -> String {
    p.cli_json(&["rentals", "show", id])["state"].as_str().unwrap_or("").to_string()
}

/// Removes, when dropped, every container carrying the label `scope` (the agent's
/// `test_docker_scope`).
pub struct ScopedContainers(pub String);

impl ScopedContainers {
    /// A fresh scope for this process: `gpum.test.tunnel=<tag><pid>`.
    pub fn new(tag: &str) -> ScopedContainers {
        ScopedContainers(format!("gpum.test.tunnel={tag}{}", std::process::id()))
    }
}

impl Drop for ScopedContainers {
    fn drop(&mut self) {
        let out =
            Command::new("docker").args(["ps", "-aq", "--filter", &format!("label={}", self.0)]).output();
        for id in String::from_utf8_lossy(&out.map(|o| o.stdout).unwrap_or_default()).split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
        }
    }
}

/// Writes the agent's `config.toml` into `dir`: platform `server`, the node, its containers
/// labelled `scope`, rentals on without a GPU request (the `test-knobs` seam).
pub fn write_agent_config(dir: &Path, server: &str, node: &RegisterResponse, scope: &str) {
    write_agent_config_with(dir, server, node, scope, "");
}

/// [`write_agent_config`] with `extra` lines (`ca_file`, test knobs such as
/// `test_tunnel_silence_ms`).
pub fn write_agent_config_with(dir: &Path, server: &str, node: &RegisterResponse, scope: &str, extra: &str) {
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "server = '{server}'\nnode_id = '{}'\ntoken = '{}'\ntest_docker_scope = '{scope}'\n\
             test_rentals_without_gpu_request = true\nrentals = true\n{extra}",
            node.node_id, node.node_token
        ),
    )
    .unwrap();
}

/// The agent's process; killed when dropped.
pub struct AgentProc(pub Child);

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent, on the SIMULATED NVML (`tests/sim/nvml`, `gpus` GPUs, whose UUIDs the inventories
/// above use; no more, or the node would claim another node's GPU): after a rental's teardown it
/// asks NVML whether the rental's GPUs are free, and a machine without NVML would quarantine the
/// node instead of reporting the rental gone. It logs to `dir/agent.log` ([`agent_log`]).
pub fn start_agent(dir: &Path, gpus: u32) -> AgentProc {
    start_agent_env(dir, gpus, &[])
}

/// [`start_agent`] with the environment variables `env`; no proxy variable of the test's own
/// environment reaches the agent, only those `env` sets.
pub fn start_agent_env(dir: &Path, gpus: u32, env: &[(&str, String)]) -> AgentProc {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("agent.log")).unwrap();
    let sim = crate::build_nvml_sim(dir);
    let gpu_json = dir.join("gpu.json");
    std::fs::write(&gpu_json, format!(r#"{{"state":"ok","gpus":{gpus}}}"#)).unwrap();
    let mut cmd = Command::new(bin("gpum-agent"));
    cmd.args(["run", "--state", dir.to_str().unwrap()])
        .env("GPUM_LOG", "debug")
        .env("GPUM_NVML_LIB", &sim)
        .env("GPUM_SIM_CONFIG", &gpu_json)
        .env_remove("GPUM_SIM_NVML");
    for k in gpum_host::env::PROXY_VARS {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    AgentProc(cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().expect("start the agent"))
}

/// What [`start_agent`] has logged into `dir`.
pub fn agent_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
}

/// `CONNECT` at the relay's TCP door on loopback port `relay`: the status, and the connection
/// when it is 200.
pub fn connect(
    relay: u16,
    rental: &str,
    port: u16,
    user: &str,
    credential: &str,
) -> (u16, Option<TcpStream>) {
    let mut s = TcpStream::connect(("127.0.0.1", relay)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let target = format!("rental-{}:{port}", rental.strip_prefix("rent-").unwrap());
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{credential}"));
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n")
        .unwrap();
    // The head, byte by byte, so that nothing after it is read.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).unwrap_or(0) == 0 {
            break;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, (status == 200).then_some(s))
}

/// The ssh-like session: many round trips of a line each.
pub fn echo_session(s: TcpStream, rounds: usize) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    for i in 0..rounds {
        let line = format!("round {i} привет\n");
        w.write_all(line.as_bytes()).unwrap();
        let mut back = String::new();
        r.read_line(&mut back).unwrap();
        assert_eq!(back, line, "round {i}");
    }
}

/// The real platform with the relay's TCP door (and whatever `extra_args` add), one rentable
/// node, two rentals on it (`a` and `b`, each running `script` and listing `ports`), and the
/// agent running them with its tunnel up (a `CONNECT` to `a`'s first port answers 200).
pub struct TunnelWorld {
    /// Dropped first: the agent is killed before the platform.
    pub agent: Option<AgentProc>,
    pub platform: TestPlatform,
    /// The relay's TCP door's loopback port (`--relay-listen`).
    pub relay: u16,
    pub node: RegisterResponse,
    pub a: Rental,
    pub b: Rental,
    /// The agent's state directory (its config and log).
    pub dir: tempfile::TempDir,
    /// Dropped last: removes the rentals' containers.
    pub containers: ScopedContainers,
}

impl TunnelWorld {
    /// [`TunnelWorld`] with rentals running [`SERVERS`] on [`PORTS`].
    pub async fn start(extra_args: Vec<String>) -> TunnelWorld {
        Self::start_with(extra_args, &PORTS, SERVERS).await
    }

    /// [`TunnelWorld`] with rentals running `script` and listing `ports` (the first is the one
    /// waited on).
    pub async fn start_with(extra_args: Vec<String>, ports: &[u16], script: &str) -> TunnelWorld {
        let relay = free_port();
        let mut args = vec!["--relay-listen".to_string(), format!("127.0.0.1:{relay}")];
        args.extend(extra_args);
        let p = TestPlatform::start(PlatformOpts { extra_args: args, ..PlatformOpts::insecure_http() });
        let image = crate::images::pinned(&crate::images::busybox().expect("test image")).expect("pinned");
        let node = rentable_node(&p).await;
        let a = create_rental_with_ports(&p, &node.node_id, &image, ports, script);
        let b = create_rental_with_ports(&p, &node.node_id, &image, ports, script);
        let containers = ScopedContainers::new("p");
        let dir = tempfile::tempdir().unwrap();
        write_agent_config(dir.path(), p.url(), &node, &containers.0);
        let agent = start_agent(dir.path(), 2);
        let w = TunnelWorld { agent: Some(agent), platform: p, relay, node, a, b, dir, containers };
        wait_until(LONG, "both rentals running", || {
            w.state(&w.a.id) == "running" && w.state(&w.b.id) == "running"
        });
        let t = Instant::now();
        while !w.ready(&w.a, ports[0]) {
            assert!(
                t.elapsed() < LONG,
                "no tunnel; agent log:\n{}\nplatform log:\n{}",
                w.agent_log(),
                w.platform.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        w
    }

    /// Whether a `CONNECT` to rental `r`'s `port` answers 200 now.
    pub fn ready(&self, r: &Rental, port: u16) -> bool {
        connect(self.relay, &r.id, port, &r.id, &r.credential).1.is_some()
    }

    /// `CONNECT` to rental `r`'s `port` with its own credential.
    pub fn connect(&self, r: &Rental, port: u16) -> (u16, Option<TcpStream>) {
        connect(self.relay, &r.id, port, &r.id, &r.credential)
    }

    pub fn state(&self, id: &str) -> String {
        rental_state(&self.platform, id)
    }

    pub fn agent_log(&self) -> String {
        agent_log(self.dir.path())
    }

    /// Kills the agent and starts it again on the same state.
    pub fn restart_agent(&mut self) {
        self.agent = None;
        self.agent = Some(start_agent(self.dir.path(), 2));
    }

    /// Stops rental `id` through the admin API (the relay closes its streams at once).
    pub async fn stop_rental(&self, id: &str) {
        let r = reqwest::Client::new()
            .post(format!("{}{}", self.platform.url(), gpum_protocol::path_admin_rental_stop(id)))
            .bearer_auth(self.platform.admin_token())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "stop {id}: {}", r.status());
    }
}
