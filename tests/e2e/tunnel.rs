//! Issue 34: a tenant reaches a rental's ports through the real relay (`serve --relay-listen`)
//! and the real agent's outbound tunnel, against the real engine on this machine. The rental's
//! container runs a line echo server (`nc -ll -e cat`) and a web server (`httpd`), through the
//! agent's `test-knobs` seam without the GPU request (`gpum-test/` images only).
//!
//! Proved here: an ssh-like interactive session (many round trips) and an HTTP request reach the
//! container; another rental's credential is 407; a port the rental does not list is 403;
//! stopping the rental closes its open stream and the next `CONNECT` is 404; the tunnel comes
//! back after the agent restarts and after the platform restarts.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use gpum_protocol::{
    GpuPublic, Health, HeartbeatRequest, Inventory, NvmlState, PATH_HEARTBEAT, PATH_REGISTER, ProbeReport,
    RegisterRequest, RegisterResponse, VerificationState,
};
use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};
use gpum_tests::{bin, require_docker};

const LONG: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn inventory() -> Inventory {
    let mut inv = Inventory::default();
    inv.public.cpu_model = "Test CPU".into();
    inv.public.cpu_cores = 16;
    inv.public.ram_mib = 65_536;
    inv.public.disk_gib = 500;
    inv.public.gpus = vec![GpuPublic { model: "Tesla T4".into(), vram_mib: 15_360 }; 2];
    inv.private.gpu_uuids = vec![
        "GPU-11111111-2222-3333-4444-000000000001".into(),
        "GPU-11111111-2222-3333-4444-000000000002".into(),
    ];
    inv
}

/// A node made rentable over HTTP (registered, its check passed, priced).
async fn rentable_node(p: &TestPlatform) -> RegisterResponse {
    let c = reqwest::Client::new();
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

struct Rental {
    id: String,
    credential: String,
}

fn create_rental(p: &TestPlatform, node: &str, image: &str) -> Rental {
    let v = p.cli_json(&[
        "rentals", "create", "--node", node, "--image", image, "--gpus", "1", "--cpu-millis", "500",
        "--memory-mib", "128", "--disk-gib", "1", "--shm-mib", "16", "--duration", "1h", "--port", "7000",
        "--port", "8080", "--", "sh", "-c",
        "mkdir -p /www && echo hello-from-rental > /www/index.html && httpd -p 8080 -h /www && exec nc -ll -p 7000 -e cat",
    ]);
    Rental {
        id: v["spec"]["id"].as_str().unwrap().to_string(),
        credential: v["tunnel"]["credential"].as_str().expect("the credential, once").to_string(),
    }
}

struct AgentProc(Child);
impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(dir: &std::path::Path) -> AgentProc {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("agent.log")).unwrap();
    AgentProc(
        Command::new(bin("gpum-agent"))
            .args(["run", "--state", dir.to_str().unwrap()])
            .env("GPUM_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the agent"),
    )
}

/// `CONNECT` at the relay: the status, and the connection when it is 200.
fn connect(relay: u16, rental: &str, port: u16, user: &str, credential: &str) -> (u16, Option<TcpStream>) {
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

fn rental_state(p: &TestPlatform, id: &str) -> String {
    p.cli_json(&["rentals", "show", id])["state"].as_str().unwrap_or("").to_string()
}

/// The ssh-like session: many round trips of a line each.
fn echo_session(s: TcpStream, rounds: usize) {
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

#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread")]
async fn tunnel_reaches_a_rentals_ports_and_nothing_else_and_survives_restarts() {
    require_docker("tunnel_reaches_a_rentals_ports_and_nothing_else_and_survives_restarts");
    let relay = free_port();
    let mut p = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--relay-listen".into(), format!("127.0.0.1:{relay}")],
        ..PlatformOpts::insecure_http()
    });
    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    let node = rentable_node(&p).await;
    let a = create_rental(&p, &node.node_id, &image);
    let b = create_rental(&p, &node.node_id, &image);
    let scope = format!("gpum.test.tunnel=p{}", std::process::id());
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let out =
                Command::new("docker").args(["ps", "-aq", "--filter", &format!("label={}", self.0)]).output();
            for id in String::from_utf8_lossy(&out.map(|o| o.stdout).unwrap_or_default()).split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
            }
        }
    }
    let _cleanup = Cleanup(scope.clone());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "server = '{}'\nnode_id = '{}'\ntoken = '{}'\ntest_docker_scope = '{scope}'\n\
             test_rentals_without_gpu_request = true\nrentals = true\n",
            p.url(),
            node.node_id,
            node.node_token
        ),
    )
    .unwrap();
    let agent = start_agent(dir.path());
    let log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    wait_until(LONG, "both rentals running", || {
        rental_state(&p, &a.id) == "running" && rental_state(&p, &b.id) == "running"
    });
    let ready = |r: &Rental| connect(relay, &r.id, 7000, &r.id, &r.credential).1.is_some();
    let t = Instant::now();
    while !ready(&a) {
        assert!(t.elapsed() < LONG, "no tunnel; agent log:\n{}\nplatform log:\n{}", log(), p.log());
        std::thread::sleep(Duration::from_millis(200));
    }

    // An ssh-like session and an HTTP request reach the container.
    let (st, s) = connect(relay, &a.id, 7000, &a.id, &a.credential);
    assert_eq!(st, 200);
    echo_session(s.unwrap(), 50);
    let (st, s) = connect(relay, &a.id, 8080, &a.id, &a.credential);
    assert_eq!(st, 200);
    let mut s = s.unwrap();
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut page = String::new();
    s.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.") && page.contains("hello-from-rental"), "{page}");

    // Another rental's credential, a wrong one, and none: 407; a port not listed: 403.
    assert_eq!(connect(relay, &a.id, 7000, &a.id, &b.credential).0, 407);
    assert_eq!(connect(relay, &a.id, 7000, &b.id, &b.credential).0, 407);
    assert_eq!(connect(relay, &a.id, 7000, &a.id, "gpumt_0000").0, 407);
    assert_eq!(connect(relay, &a.id, 22, &a.id, &a.credential).0, 403);
    assert_eq!(connect(relay, &b.id, 7000, &b.id, &b.credential).0, 200, "b's own works");

    // The agent restarts: the tunnel comes back.
    drop(agent);
    let agent = start_agent(dir.path());
    wait_until(LONG, "the tunnel back after the agent restarted", || ready(&b));
    echo_session(connect(relay, &b.id, 7000, &b.id, &b.credential).1.unwrap(), 5);

    // The platform restarts: the agent dials again.
    p.restart();
    wait_until(LONG, "the tunnel back after the platform restarted", || ready(&b));
    echo_session(connect(relay, &b.id, 7000, &b.id, &b.credential).1.unwrap(), 5);

    // Stopped: its open stream closes at once, and it answers 404.
    let (_, open) = connect(relay, &b.id, 7000, &b.id, &b.credential);
    let mut open = open.unwrap();
    // Through the admin API: the relay closes its streams now, before the agent hears of it.
    let r = reqwest::Client::new()
        .post(format!("{}{}", p.url(), gpum_protocol::path_admin_rental_stop(&b.id)))
        .bearer_auth(p.admin_token())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    open.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(open.read(&mut buf).unwrap_or(0), 0, "the stream closed");
    assert!(t.elapsed() < Duration::from_secs(5), "at once: {:?}", t.elapsed());
    assert_eq!(connect(relay, &b.id, 7000, &b.id, &b.credential).0, 404);
    assert!(!log().contains(&a.credential), "the credential never reaches the agent's log");
    drop(agent);
}
