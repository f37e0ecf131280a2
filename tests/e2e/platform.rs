//! The real `gpum-platform` over real HTTP(S) on loopback: every error code, the join-code
//! lifecycle under a controlled clock, revocation, commands, the admin API and CLI, what the
//! database file holds, install.sh (shellcheck, and run with `sh` against the server), and
//! schemathesis against docs/openapi.yaml; and the hardening of issue 14 (bounded answers and
//! history, GPU squatting, streamed and regular-only downloads, slow clients, the public URL,
//! escaped terminal output) and idempotent registration (issue 9).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

use gpum_protocol::{
    CommandResult, ErrorBody, ErrorCode, HeartbeatRequest, HeartbeatResponse, Inventory, NodeList,
    PATH_ADMIN_JOIN_CODES, PATH_ADMIN_NODES, PATH_ADMIN_PROBE_IMAGE, PATH_HEARTBEAT, PATH_REGISTER,
    ProbeFailure, ProbeReport, RegisterRequest, RegisterResponse, VerificationState, joincode::JoinCode,
    limits,
};
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::{Client, StatusCode};

// Issue 29 (second hardening round): connection limits, and authentication and input checks.
#[path = "platform_auth.rs"]
mod auth;
#[path = "platform_limits.rs"]
mod conn_limits;
// Issue 32: owners' accounts, and every page and endpoint tried as another owner.
#[path = "platform_owners.rs"]
mod owners;
// Issue 33: rentals, the platform's side (admin API, CLI, heartbeat, expiry).
#[path = "platform_rentals.rs"]
mod rentals;
// Issue 44, items 1 and 2: effects reach every replica's relay, from every face.
#[path = "platform_effects.rs"]
mod effects;
// Issue 46: earnings, metered from what ran.
#[path = "platform_earnings.rs"]
mod earnings;
// Issue 46: alerts to owners, by e-mail (a real SMTP server) and signed webhook.
#[path = "platform_alerts.rs"]
mod alerts;
// Issue 47: releases, rollouts and the agent's upgrades, the platform's side.
#[path = "platform_upgrades.rs"]
mod upgrades;
// Issue 35: replicas on one PostgreSQL.
#[path = "platform_replicas.rs"]
mod replicas;
// Issue 47: the previous release's agent and platform, from recorded exchanges.
#[path = "platform_compat.rs"]
mod compat;

fn inventory(uuid: &str) -> Inventory {
    let mut inv = Inventory::default();
    inv.public.cpu_model = "Test CPU".into();
    inv.public.cpu_cores = 8;
    inv.public.gpus = vec![gpum_protocol::GpuPublic { model: "Tesla T4".into(), vram_mib: 15360 }];
    inv.private.hostname = "owner-box".into();
    inv.private.gpu_uuids = vec![uuid.to_owned()];
    inv
}

struct Api {
    c: Client,
    url: String,
}

/// An answer: status, `Date` header present, and the body as JSON.
struct Ans {
    status: StatusCode,
    date: bool,
    body: serde_json::Value,
}

impl Ans {
    fn code(&self) -> ErrorCode {
        let b: ErrorBody = serde_json::from_value(self.body.clone())
            .unwrap_or_else(|e| panic!("not an error body ({e}): {}", self.body));
        assert_eq!(b.error.code.http_status(), self.status.as_u16(), "status of {:?}", b.error.code);
        assert!(!b.error.message.is_empty());
        b.error.code
    }
    fn ok<T: serde::de::DeserializeOwned>(&self) -> T {
        assert!(self.status.is_success(), "{}: {}", self.status, self.body);
        serde_json::from_value(self.body.clone()).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

impl Api {
    fn new(p: &TestPlatform) -> Api {
        Api { c: p.http_client(), url: p.url().to_owned() }
    }

    async fn send(&self, rb: reqwest::RequestBuilder) -> Ans {
        let r = rb.send().await.expect("request");
        let status = r.status();
        let date = r.headers().get("date").is_some();
        let text = r.text().await.expect("body");
        let body =
            if text.is_empty() { serde_json::Value::Null } else { serde_json::from_str(&text).expect(&text) };
        Ans { status, date, body }
    }

    async fn post_raw(&self, path: &str, token: Option<&str>, body: impl Into<reqwest::Body>) -> Ans {
        let mut rb = self
            .c
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body.into());
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        self.send(rb).await
    }

    async fn post<T: serde::Serialize>(&self, path: &str, token: Option<&str>, body: &T) -> Ans {
        self.post_raw(path, token, serde_json::to_vec(body).unwrap()).await
    }

    async fn register(&self, code: &str, uuid: &str) -> Ans {
        let req = RegisterRequest {
            join_code: code.into(),
            agent_version: "0.1.0".into(),
            inventory: inventory(uuid),
            install_id: None,
        };
        self.post(PATH_REGISTER, None, &req).await
    }

    async fn heartbeat(&self, token: &str, req: &HeartbeatRequest) -> Ans {
        self.post(PATH_HEARTBEAT, Some(token), req).await
    }
}

fn beat(seq: u64) -> HeartbeatRequest {
    HeartbeatRequest { seq, inventory_hash: inventory("GPU-a").hash(), ..Default::default() }
}

/// The agent's heartbeat client (`gpum_host::http::PostClient`, hyper over rustls without
/// reqwest) against the real platform over TLS: with the platform's CA among its roots it gets
/// the platform's own JSON answer; without it the handshake is refused and nothing is sent; an
/// answer over the size given is refused; plain http off loopback is refused before any
/// connection.
#[tokio::test]
async fn the_heartbeat_client_verifies_tls_and_caps_the_answer() {
    use gpum_host::http::{ClientOptions, PostClient, PostError};
    let p = TestPlatform::start(PlatformOpts::default());
    let url = format!("{}{PATH_HEARTBEAT}", p.url());
    let ca = std::fs::read(p.ca_path().expect("a TLS platform has a CA")).unwrap();
    let opts = |roots: Vec<Vec<u8>>| ClientOptions {
        extra_roots_pem: roots,
        timeout: Some(std::time::Duration::from_secs(10)),
        ..ClientOptions::default()
    };
    let body = serde_json::to_vec(&beat(1)).unwrap();

    let trusting = PostClient::new(&url, &opts(vec![ca.clone()])).unwrap();
    let a = trusting.post_json(body.clone(), Some("not-a-token"), 1 << 20).await.unwrap();
    assert_eq!(a.status, 401, "{}", String::from_utf8_lossy(&a.body));
    let e: ErrorBody = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(e.error.code, ErrorCode::Unauthorized);
    // The same connection again, then an answer larger than allowed.
    assert_eq!(trusting.post_json(body.clone(), Some("not-a-token"), 1 << 20).await.unwrap().status, 401);
    let e = trusting.post_json(body.clone(), Some("not-a-token"), 10).await.unwrap_err();
    assert!(matches!(e, PostError::TooLarge(10)), "{e}");

    // Through a relay that counts connections: one carries every request, and after the relay
    // closes it (as a restarting server or a load balancer does) the next request opens one more.
    let relay = CountingRelay::start(p.port());
    let relayed = url.replace(&format!(":{}/", p.port()), &format!(":{}/", relay.port));
    let via = PostClient::new(&relayed, &opts(vec![ca.clone()])).unwrap();
    for _ in 0..3 {
        assert_eq!(via.post_json(body.clone(), Some("not-a-token"), 1 << 20).await.unwrap().status, 401);
    }
    assert_eq!(relay.accepted(), 1, "the connection is kept between requests");
    relay.close_all();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(via.post_json(body.clone(), Some("not-a-token"), 1 << 20).await.unwrap().status, 401);
    assert_eq!(relay.accepted(), 2, "a closed connection is replaced by one new one");

    let untrusting = PostClient::new(&url, &opts(Vec::new())).unwrap();
    let e = untrusting.post_json(body.clone(), Some("not-a-token"), 1 << 20).await.unwrap_err();
    assert!(matches!(&e, PostError::Transport(s) if s.contains("certificate")), "{e}");

    assert!(PostClient::new("http://10.0.0.1/v1/heartbeat", &opts(Vec::new())).is_err());
    assert!(PostClient::new(&url, &opts(vec![b"not a certificate".to_vec()])).is_err());
}

/// A loopback TCP relay to `upstream` that counts the connections it accepted and can close
/// them all.
struct CountingRelay {
    port: u16,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl CountingRelay {
    fn start(upstream: u16) -> CountingRelay {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (a, o) = (accepted.clone(), open.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                o.lock().unwrap().push(c.try_clone().unwrap());
                let (mut c2, mut s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c2, &mut s2);
                    let _ = s2.shutdown(std::net::Shutdown::Both);
                });
                let (mut c, mut s) = (c, s);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s, &mut c);
                    let _ = c.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        CountingRelay { port, accepted, open }
    }
    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn close_all(&self) {
        for c in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[tokio::test]
async fn join_code_errors_and_lifecycle_over_tls() {
    let p = TestPlatform::start(PlatformOpts::default());
    assert!(p.url().starts_with("https://"));
    let api = Api::new(&p);

    let a = api.register("GPUM-1234", "GPU-a").await;
    assert!(a.date, "every answer carries Date");
    assert_eq!(a.code(), ErrorCode::JoinCodeMalformed);
    // One changed symbol fails the check character: malformed, not unknown.
    let good = JoinCode::generate().to_string();
    let mut typo = good.clone().into_bytes();
    typo[6] = if typo[6] == b'7' { b'8' } else { b'7' };
    assert_eq!(
        api.register(&String::from_utf8(typo).unwrap(), "GPU-a").await.code(),
        ErrorCode::JoinCodeMalformed
    );
    assert_eq!(api.register(&good, "GPU-a").await.code(), ErrorCode::JoinCodeUnknown);

    let expiring = p.join_code_ttl("90s");
    p.advance_clock(91);
    assert_eq!(api.register(&expiring, "GPU-a").await.code(), ErrorCode::JoinCodeExpired);

    let code = p.join_code();
    let r: RegisterResponse = api.register(&code, "GPU-a").await.ok();
    assert_eq!(r.node_token.len(), 64, "256-bit token, hex");
    assert_eq!(r.heartbeat_interval_secs, 1);
    assert_eq!(r.probe_image, None);
    assert_eq!(api.register(&code, "GPU-b").await.code(), ErrorCode::JoinCodeUsed, "a code used twice");

    let second = p.join_code();
    assert_eq!(api.register(&second, "GPU-a").await.code(), ErrorCode::GpuAlreadyRegistered);
    // The refusal did not use up the code: after deleting the old server it registers.
    p.delete_node(&r.node_id);
    let r2: RegisterResponse = api.register(&second, "GPU-a").await.ok();
    assert_ne!(r2.node_id, r.node_id);
    assert_eq!(p.nodes().nodes.len(), 1);
}

#[tokio::test]
async fn bad_bodies_get_codes_never_500() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    for body in ["{", "null", "[]", "{\"join_code\":1}", "", "\u{0}"] {
        let a = api.post_raw(PATH_REGISTER, None, body.to_owned()).await;
        assert_eq!(a.code(), ErrorCode::InvalidJson, "{body:?}");
    }
    // Oversized bodies: the declared length is refused before the body is read. (A client that
    // keeps writing a body the server refused may see a reset instead of the answer, so these
    // requests declare the length and send no body.)
    let big = 2 * 1024 * 1024;
    assert_eq!(oversized(&p, PATH_REGISTER, None, big).await, (413, ErrorCode::PayloadTooLarge));
    assert_eq!(oversized(&p, PATH_HEARTBEAT, Some("x"), big).await, (401, ErrorCode::Unauthorized));
    let code = p.join_code();
    let r: RegisterResponse = api.register(&code, "GPU-a").await.ok();
    assert_eq!(
        oversized(&p, PATH_HEARTBEAT, Some(&r.node_token), big).await,
        (413, ErrorCode::PayloadTooLarge)
    );
    // Just under the limit is read and parsed (and is not valid JSON).
    let almost = vec![b' '; 1024 * 1024 - 1];
    assert_eq!(api.post_raw(PATH_REGISTER, None, almost).await.code(), ErrorCode::InvalidJson);
    assert_eq!(api.post_raw(PATH_HEARTBEAT, Some(&r.node_token), "{}").await.code(), ErrorCode::InvalidJson);
    let too_many = HeartbeatRequest {
        managed_containers: vec!["c".into(); limits::MAX_MANAGED_CONTAINERS + 1],
        ..beat(1)
    };
    assert_eq!(api.heartbeat(&r.node_token, &too_many).await.code(), ErrorCode::InvalidRequest);

    let a = api.send(api.c.get(format!("{}/nope", api.url))).await;
    assert_eq!(a.code(), ErrorCode::NotFound);
    assert!(a.date);
    let a = api.send(api.c.get(format!("{}{PATH_REGISTER}", api.url))).await;
    assert_eq!(a.code(), ErrorCode::MethodNotAllowed);
    assert!(p.log().lines().all(|l| !l.contains("panicked")), "{}", p.log());
}

/// A POST over plain HTTP that declares `len` bytes and sends none; returns the status and code.
async fn oversized(p: &TestPlatform, path: &str, token: Option<&str>, len: usize) -> (u16, ErrorCode) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", p.port())).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}Content-Length: {len}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Read until the JSON body is complete (the connection may stay open).
    let text = loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("the server answers without waiting for the body")
            .unwrap();
        buf.extend_from_slice(&chunk[..n]);
        let t = String::from_utf8_lossy(&buf).into_owned();
        if n == 0 || t.trim_end().ends_with("}}") {
            break t;
        }
    };
    let status: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(text.to_ascii_lowercase().contains("\r\ndate: "), "{text}");
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    let b: ErrorBody = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, b.error.code)
}

#[tokio::test]
async fn heartbeat_revocation_rotation_and_deletion() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();

    let a = api.post(PATH_HEARTBEAT, None, &beat(1)).await;
    assert_eq!(a.code(), ErrorCode::Unauthorized, "no token");
    assert_eq!(
        api.heartbeat(&"0".repeat(64), &beat(1)).await.code(),
        ErrorCode::Unauthorized,
        "unknown token"
    );
    let hb: HeartbeatResponse = api.heartbeat(&r.node_token, &beat(1)).await.ok();
    assert!(!hb.send_inventory, "the registered inventory matches the hash");

    let new = p.rotate_token(&r.node_id);
    assert_ne!(new, r.node_token);
    let a = api.heartbeat(&r.node_token, &beat(2)).await;
    assert_eq!((a.status, a.code()), (StatusCode::UNAUTHORIZED, ErrorCode::TokenReplaced));
    let _: HeartbeatResponse = api.heartbeat(&new, &beat(2)).await.ok();

    p.delete_node(&r.node_id);
    for t in [&new, &r.node_token] {
        let a = api.heartbeat(t, &beat(3)).await;
        assert_eq!((a.status, a.code()), (StatusCode::GONE, ErrorCode::NodeDeleted));
    }
    // Revocation wins over a bad body: one that is not JSON, and one that parses but is refused.
    let a = api.post_raw(PATH_HEARTBEAT, Some(&new), "not json").await;
    assert_eq!(a.code(), ErrorCode::NodeDeleted);
    let too_many = HeartbeatRequest {
        managed_containers: vec!["c".into(); limits::MAX_MANAGED_CONTAINERS + 1],
        ..beat(4)
    };
    assert_eq!(api.heartbeat(&new, &too_many).await.code(), ErrorCode::NodeDeleted);
    assert!(p.nodes().nodes.is_empty());
}

#[tokio::test]
async fn commands_probe_state_containers_and_offline() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let n = p.node(&r.node_id).unwrap();
    assert!(!n.online, "no heartbeat yet");
    assert_eq!(n.verification, VerificationState::AwaitingCheck);

    p.set_probe_image("gpum-test/probe:1");
    p.set_known_containers(&r.node_id, &["aaa", "bbb"]);
    // Never seen: offline. A command would wait for a heartbeat that may never come, so the
    // admin API and the CLI refuse it (409 `node_offline`, as the dashboard does) and queue
    // nothing.
    let commands = format!("{}{PATH_ADMIN_NODES}/{}/commands", p.url(), r.node_id);
    let a = api
        .send(
            api.c.post(&commands).bearer_auth(p.admin_token()).json(&serde_json::json!({"kind": "recheck"})),
        )
        .await;
    assert_eq!((a.status, a.code()), (StatusCode::CONFLICT, ErrorCode::NodeOffline));
    let out = p.cli(["--json", "nodes", "command", &r.node_id, "restart"]);
    assert_eq!(out.status.code(), Some(1));
    let b: ErrorBody = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(b.error.code, ErrorCode::NodeOffline);
    assert!(p.node(&r.node_id).unwrap().commands.is_empty(), "nothing queued");
    // A handshake (seq 0) brings it online and takes no command.
    let hb: HeartbeatResponse = api.heartbeat(&r.node_token, &beat(0)).await.ok();
    assert!(hb.commands.is_empty());
    let cmd = p.command(&r.node_id, "recheck");
    let mut req = beat(1);
    req.managed_containers = vec!["aaa".into(), "zzz".into()];
    req.probe = Some(ProbeReport {
        state: VerificationState::Failed,
        reason: Some(ProbeFailure::NvidiaSmiFailed),
        output: "NVIDIA-SMI has failed".into(),
        finished_at: 1,
        image: "gpum-test/probe:1".into(),
    });
    let hb: HeartbeatResponse = api.heartbeat(&r.node_token, &req).await.ok();
    assert_eq!(hb.probe_image.as_deref(), Some("gpum-test/probe:1"));
    assert_eq!(hb.known_containers, vec!["aaa", "bbb"]);
    assert_eq!(hb.commands.len(), 1);
    assert_eq!((hb.commands[0].id.as_str(), hb.commands[0].kind.as_str()), (cmd.as_str(), "recheck"));

    let mut req2 = beat(2);
    req2.managed_containers = vec!["aaa".into(), "zzz".into()];
    req2.inventory_hash = "changed".into();
    let hb: HeartbeatResponse = api.heartbeat(&r.node_token, &req2).await.ok();
    assert!(hb.commands.is_empty(), "a command is delivered once");
    assert!(hb.send_inventory, "an unknown inventory hash asks for the inventory");
    req2.command_results = vec![CommandResult { id: cmd.clone(), ok: true, message: "probe ran".into() }];
    req2.inventory = Some(inventory("GPU-c"));
    req2.inventory_hash = inventory("GPU-c").hash();
    let hb: HeartbeatResponse = api.heartbeat(&r.node_token, &req2).await.ok();
    assert!(!hb.send_inventory);

    let n = p.node(&r.node_id).unwrap();
    assert!(n.online);
    assert_eq!(n.verification, VerificationState::Failed);
    assert_eq!(n.last_probe_reason, Some(ProbeFailure::NvidiaSmiFailed));
    assert_eq!(n.last_probe_output.as_deref(), Some("NVIDIA-SMI has failed"));
    assert_eq!(n.managed_containers, vec!["aaa", "zzz"]);
    assert_eq!(n.inventory.private.gpu_uuids, vec!["GPU-c"]);
    assert_eq!(n.last_seq, Some(2));
    let c = &n.commands[0];
    assert!(c.delivered_at.is_some());
    assert_eq!(c.result.as_ref().map(|r| (r.ok, r.message.as_str())), Some((true, "probe ran")));

    // Real time passes too (up to a second or so here), hence 58 + 3 rather than 59 + 1.
    p.advance_clock(58);
    assert!(p.node(&r.node_id).unwrap().online, "online within 60 s");
    p.advance_clock(3);
    assert!(!p.node(&r.node_id).unwrap().online, "offline after 60 s without a heartbeat");
    let _: HeartbeatResponse = api.heartbeat(&r.node_token, &beat(3)).await.ok();
    assert!(p.node(&r.node_id).unwrap().online, "back online");
}

#[tokio::test]
async fn admin_http_api_needs_its_token_and_matches_the_cli() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let u = |path: &str| format!("{}{path}", p.url());
    let a = api.send(api.c.get(u(PATH_ADMIN_NODES))).await;
    assert_eq!((a.status, a.code()), (StatusCode::UNAUTHORIZED, ErrorCode::AdminUnauthorized));
    let a = api.send(api.c.post(u(PATH_ADMIN_JOIN_CODES)).bearer_auth("wrong")).await;
    assert_eq!(a.code(), ErrorCode::AdminUnauthorized);
    // A node token is not an admin token.
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let a = api.send(api.c.get(u(PATH_ADMIN_NODES)).bearer_auth(&r.node_token)).await;
    assert_eq!(a.code(), ErrorCode::AdminUnauthorized);

    let t = p.admin_token();
    let a = api
        .send(api.c.post(u(PATH_ADMIN_JOIN_CODES)).bearer_auth(t).json(&serde_json::json!({"ttl_secs": 60})))
        .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let code = a.body["code"].as_str().unwrap().to_owned();
    JoinCode::parse(&code).unwrap();
    let r2: RegisterResponse = api.register(&code, "GPU-b").await.ok();
    let a = api
        .send(api.c.post(u(PATH_ADMIN_JOIN_CODES)).bearer_auth(t).json(&serde_json::json!({"ttl_secs": 0})))
        .await;
    assert_eq!(a.code(), ErrorCode::InvalidRequest);

    let list: NodeList = api.send(api.c.get(u(PATH_ADMIN_NODES)).bearer_auth(t)).await.ok();
    assert_eq!(list.nodes.len(), 2);
    assert_eq!(list, p.nodes(), "HTTP and CLI read the same state");

    let cmd_url = u(&gpum_protocol::path_admin_node_commands(&r2.node_id));
    // Commands go only to an online server: a handshake (seq 0) brings it online.
    let _: HeartbeatResponse = api.heartbeat(&r2.node_token, &beat(0)).await.ok();
    let a = api.send(api.c.post(&cmd_url).bearer_auth(t).json(&serde_json::json!({"kind": "restart"}))).await;
    assert_eq!(a.status, StatusCode::CREATED);
    let a = api.send(api.c.post(&cmd_url).bearer_auth(t).json(&serde_json::json!({"kind": "rm -rf"}))).await;
    assert_eq!(a.code(), ErrorCode::InvalidRequest);
    let hb: HeartbeatResponse = api.heartbeat(&r2.node_token, &beat(1)).await.ok();
    assert_eq!(hb.commands[0].kind, "restart");

    let a = api
        .send(
            api.c
                .put(u(&gpum_protocol::path_admin_node_known_containers(&r2.node_id)))
                .bearer_auth(t)
                .json(&serde_json::json!({"container_ids": ["c1"]})),
        )
        .await;
    assert!(a.status.is_success());
    let a = api
        .send(
            api.c.put(u(PATH_ADMIN_PROBE_IMAGE)).bearer_auth(t).json(&serde_json::json!({"image": "img:1"})),
        )
        .await;
    assert!(a.status.is_success());
    let a = api.send(api.c.get(u(PATH_ADMIN_PROBE_IMAGE)).bearer_auth(t)).await;
    assert_eq!(a.body["image"], "img:1");
    let hb: HeartbeatResponse = api.heartbeat(&r2.node_token, &beat(2)).await.ok();
    assert_eq!((hb.known_containers, hb.probe_image.as_deref()), (vec!["c1".to_owned()], Some("img:1")));

    let a = api
        .send(api.c.post(u(&gpum_protocol::path_admin_node_rotate_token(&r2.node_id))).bearer_auth(t))
        .await;
    let new = a.body["node_token"].as_str().unwrap().to_owned();
    assert_eq!(api.heartbeat(&r2.node_token, &beat(3)).await.code(), ErrorCode::TokenReplaced);
    let node_url = u(&gpum_protocol::path_admin_node(&r2.node_id));
    assert!(api.send(api.c.delete(&node_url).bearer_auth(t)).await.status.is_success());
    assert_eq!(api.send(api.c.delete(&node_url).bearer_auth(t)).await.code(), ErrorCode::NotFound);
    assert_eq!(api.heartbeat(&new, &beat(4)).await.code(), ErrorCode::NodeDeleted);

    // The CLI answers the same codes, as JSON error bodies with exit 1.
    let out = p.cli(["--json", "nodes", "delete", &r2.node_id]);
    assert_eq!(out.status.code(), Some(1));
    let b: ErrorBody = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(b.error.code, ErrorCode::NotFound);
    let out = p.cli(["nodes", "command", &r.node_id, "format-disk"]);
    assert_eq!(out.status.code(), Some(2), "clap refuses an unknown kind");
}

/// Issue 32: a server's name, price, minimum rental time and pause, over real HTTP.
#[tokio::test]
async fn admin_api_sets_a_servers_name_price_and_pause() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let t = p.admin_token();
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let url = format!("{}{}", p.url(), gpum_protocol::path_admin_node(&r.node_id));
    let patch = |body: serde_json::Value| api.send(api.c.patch(&url).bearer_auth(t).json(&body));
    let settings = |p: &TestPlatform| {
        let n = p.node(&r.node_id).unwrap();
        (n.name, n.price_per_gpu_hour, n.min_rental_minutes, n.paused)
    };
    // The defaults: the host name, not for rent, an hour, not paused.
    assert_eq!(settings(&p), ("owner-box".to_owned(), None, 60, false));

    let a = patch(serde_json::json!({"name": "Rack 3 <b>A100</b>", "price_per_gpu_hour": 1250,
                                     "min_rental_minutes": 90}))
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(
        a.body,
        serde_json::json!({"id": r.node_id, "name": "Rack 3 <b>A100</b>", "price_per_gpu_hour": 1250,
                           "min_rental_minutes": 90, "paused": false, "auto_update": true})
    );
    let a = patch(serde_json::json!({"paused": true})).await;
    assert_eq!(a.body["paused"], true);
    // The node list carries them, over HTTP as in the CLI.
    assert_eq!(settings(&p), ("Rack 3 <b>A100</b>".to_owned(), Some(1250), 90, true));
    let list: NodeList =
        api.send(api.c.get(format!("{}{PATH_ADMIN_NODES}", p.url())).bearer_auth(t)).await.ok();
    assert_eq!(list.nodes[0].price_per_gpu_hour, Some(1250));
    assert_eq!(list, p.nodes());
    // The verdict rides along, machine-readable: no heartbeat yet, so offline since never.
    let raw = api.send(api.c.get(format!("{}{PATH_ADMIN_NODES}", p.url())).bearer_auth(t)).await;
    assert_eq!(raw.body["nodes"][0]["rentable"], serde_json::json!({"state": "offline", "since": null}));

    // Refusals: 400 with the field named, and nothing written, not even the good fields.
    for (body, code, word) in [
        (serde_json::json!({"name": "", "paused": false}), ErrorCode::InvalidRequest, "name"),
        (serde_json::json!({"name": "x".repeat(65)}), ErrorCode::InvalidRequest, "name"),
        (serde_json::json!({"name": "evil\u{1b}[2J"}), ErrorCode::InvalidRequest, "control"),
        (serde_json::json!({"name": "two\nlines"}), ErrorCode::InvalidRequest, "control"),
        (serde_json::json!({"price_per_gpu_hour": 0}), ErrorCode::InvalidRequest, "price_per_gpu_hour"),
        (serde_json::json!({"price_per_gpu_hour": -5}), ErrorCode::InvalidJson, ""),
        (serde_json::json!({"price_per_gpu_hour": 12.5}), ErrorCode::InvalidJson, ""),
        (
            serde_json::json!({"min_rental_minutes": 10081, "paused": false}),
            ErrorCode::InvalidRequest,
            "min_rental",
        ),
        (serde_json::json!({"min_rental_minutes": 0}), ErrorCode::InvalidRequest, "min_rental"),
        (serde_json::json!({"price": 100}), ErrorCode::InvalidJson, "price"),
    ] {
        let a = patch(body.clone()).await;
        assert_eq!((a.status, a.code()), (StatusCode::BAD_REQUEST, code), "{body}: {}", a.body);
        assert!(a.body["error"]["message"].as_str().unwrap().contains(word), "{body}: {}", a.body);
    }
    assert_eq!(settings(&p), ("Rack 3 <b>A100</b>".to_owned(), Some(1250), 90, true));

    // null: the host name back and off rent; resume.
    let a = patch(serde_json::json!({"name": null, "price_per_gpu_hour": null, "paused": false})).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(settings(&p), ("owner-box".to_owned(), None, 90, false));

    // The operator's CLI sets the same, through the same checks.
    let v = p.cli_json(&[
        "nodes",
        "set",
        &r.node_id,
        "--name",
        "Rack 4",
        "--price",
        "12,5",
        "--min-rental",
        "120",
        "--pause",
    ]);
    assert_eq!(
        v,
        serde_json::json!({"id": r.node_id, "name": "Rack 4", "price_per_gpu_hour": 1250,
                           "min_rental_minutes": 120, "paused": true, "auto_update": true})
    );
    let out = p.cli(["nodes", "set", &r.node_id, "--host-name", "--no-price", "--resume"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{}: owner-box, not for rent yet, at least 120 min", r.node_id)
    );
    assert_eq!(settings(&p), ("owner-box".to_owned(), None, 120, false));
    for bad in
        [&["--price", "12.505"][..], &["--min-rental", "0"], &["--name", "a\u{7}b"], &["--pause", "--resume"]]
    {
        let mut args = vec!["nodes", "set", r.node_id.as_str()];
        args.extend_from_slice(bad);
        let out = p.cli(&args);
        assert!(!out.status.success(), "{bad:?}: {out:?}");
    }
    assert_eq!(settings(&p), ("owner-box".to_owned(), None, 120, false), "nothing changed by a refusal");

    // The admin token is needed; an unknown or deleted node is 404.
    let a = api.send(api.c.patch(&url).json(&serde_json::json!({"paused": true}))).await;
    assert_eq!(a.code(), ErrorCode::AdminUnauthorized);
    let other = format!("{}{}", p.url(), gpum_protocol::path_admin_node("node-nope"));
    let a = api.send(api.c.patch(&other).bearer_auth(t).json(&serde_json::json!({"paused": true}))).await;
    assert_eq!(a.code(), ErrorCode::NotFound);
    p.delete_node(&r.node_id);
    assert_eq!(patch(serde_json::json!({"paused": true})).await.code(), ErrorCode::NotFound);
}

#[tokio::test]
async fn admin_api_is_off_without_a_token_file() {
    let p = TestPlatform::start(PlatformOpts { admin_api: false, ..PlatformOpts::insecure_http() });
    let api = Api::new(&p);
    let a = api.send(api.c.get(format!("{}{PATH_ADMIN_NODES}", p.url())).bearer_auth(p.admin_token())).await;
    assert_eq!(a.code(), ErrorCode::AdminUnauthorized);
}

#[test]
fn plain_http_only_on_loopback_with_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.db");
    let run = |args: &[&str]| {
        Command::new(gpum_tests::bin("gpum-platform"))
            .arg("serve")
            .arg("--db")
            .arg(&db)
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["--listen", "0.0.0.0:0", "--insecure-http"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("loopback"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&["--listen", "127.0.0.1:0"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--insecure-http"));
    // A SQLite file has one writer: a second database thread is refused, before the file is made.
    let o = run(&["--listen", "127.0.0.1:0", "--insecure-http", "--db-connections", "2"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--db-connections 2") && err.contains("one writer"), "{err}");
    assert!(!db.exists());
}

/// Issue 43, items 8 and 9, through the real binary: `serve` refuses a `hostaddr=` that sends
/// a plain connection off the machine before connecting anywhere (192.0.2.2 is TEST-NET-1, and
/// the refusal comes before any connection), and a refusal never prints the URL's password,
/// in whatever form the URL holds it.
#[test]
fn serve_refuses_a_database_url_off_the_machine_or_with_a_password_and_never_prints_it() {
    let dir = tempfile::tempdir().unwrap();
    let passfile = dir.path().join("pgpass");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&passfile).unwrap();
        f.write_all(b"*:*:*:*:FilePw7\n").unwrap();
    }
    let run = |db: &str| {
        let o = Command::new(gpum_tests::bin("gpum-platform"))
            .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--db", db])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        )
    };
    let url =
        format!("postgres://gpum@localhost:5432/gpum?hostaddr=192.0.2.2&passfile={}", passfile.display());
    let (code, out) = run(&url);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("another host") && out.contains("sslmode=verify-full"), "{out}");
    assert!(!out.contains("FilePw7"), "{out}");
    for url in [
        "postgres://gpum@db.internal/gpum?password=TopSecretPw2",
        "postgres://gpum@db.internal/gpum?sslmode=disable&password=TopSecretPw2",
        "postgres://gpum@db.internal/gpum?pass%77ord=TopSecretPw2",
        "postgres://gpum:TopSecretPw2@db.internal/gpum",
        "postgres://gpum:Top/SecretPw2@db.internal/gpum",
        "postgres://gpum:Top%53ecretPw2@localhost/gpum",
    ] {
        let (code, out) = run(url);
        assert_eq!(code, Some(1), "{url}: {out}");
        assert!(out.contains("password"), "{url}: {out}");
        assert!(!out.contains("Secret"), "{url}: {out}");
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn database_holds_no_secret_and_no_address() {
    let mut p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let code = p.join_code();
    let unused = p.join_code();
    let r: RegisterResponse = api.register(&code, "GPU-a").await.ok();
    for i in 1..=3 {
        let _: HeartbeatResponse = api.heartbeat(&r.node_token, &beat(i)).await.ok();
    }
    let rotated = p.rotate_token(&r.node_id);
    let _: HeartbeatResponse = api.heartbeat(&rotated, &beat(4)).await.ok();
    let read_all = |p: &TestPlatform| p.db_bytes();
    // Read while running (WAL holds the recent writes), then after a restart checkpointed them.
    for round in 0..2 {
        let bytes = read_all(&p);
        assert!(bytes.len() > 4096, "read the database");
        assert!(contains(&bytes, r.node_id.as_bytes()), "sanity: the file holds the node");
        assert!(contains(&bytes, b"owner-box"), "sanity: the file holds the inventory");
        let compact = |c: &str| c.replace('-', "");
        for secret in [&code, &unused, &compact(&code), &r.node_token, &rotated, &p.admin_token().to_owned()]
        {
            assert!(!contains(&bytes, secret.as_bytes()), "round {round}: a secret in clear");
            assert!(!contains(&bytes, secret.to_lowercase().as_bytes()));
        }
        for addr in ["127.0.0.1", "localhost", "::1"] {
            assert!(!contains(&bytes, addr.as_bytes()), "round {round}: {addr} in the database");
        }
        p.restart();
    }
}

// ---------------------------------------------------------------------------------------------
// install.sh and /dl/

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

fn dist_with_installer(dir: &Path, hash_ok: bool) {
    let script = b"#!/bin/sh\necho \"dummy installer ran with: $*\"\necho \"from=$0\"\nread -r l || true\necho \"stdin=$l\"\nexit 7\n";
    std::fs::write(dir.join("gpum-install"), script).unwrap();
    let hash = if hash_ok { sha256_hex(script) } else { sha256_hex(b"something else") };
    std::fs::write(dir.join("gpum-install.sha256"), format!("{hash}  gpum-install\n")).unwrap();
    std::fs::write(dir.join("gpum-install.sig"), b"sig").unwrap();
}

/// A platform serving a dummy installer under `/dl/`, and its install.sh saved in a fresh
/// directory.
struct InstallSh {
    p: TestPlatform,
    dist: tempfile::TempDir,
    work: tempfile::TempDir,
    script: PathBuf,
    text: String,
}

/// Starts the platform with `opts` and a dummy installer whose published checksum matches it
/// (`hash_ok`) or not, then fetches `/install.sh`.
async fn serve_install_sh(opts: PlatformOpts, hash_ok: bool) -> InstallSh {
    let dist = tempfile::tempdir().unwrap();
    dist_with_installer(dist.path(), hash_ok);
    let p = TestPlatform::start(PlatformOpts { dist: Some(dist.path().to_owned()), ..opts });
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("install.sh");
    let r = p.http_client().get(format!("{}/install.sh", p.url())).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("date").is_some());
    let text = r.text().await.unwrap();
    std::fs::write(&script, &text).unwrap();
    InstallSh { p, dist, work, script, text }
}

#[tokio::test]
async fn install_sh_passes_shellcheck_and_runs_a_verified_installer() {
    let InstallSh { p, dist, work, script, text } = serve_install_sh(PlatformOpts::default(), true).await;
    assert!(text.contains(&format!("GPUM_PLATFORM_URL='{}'", p.url())), "the platform URL is filled in");

    let sc =
        Command::new("shellcheck").arg("--shell=sh").arg(&script).output().expect(
            "shellcheck is not installed: apt-get install shellcheck (.ci/run does); this test needs it",
        );
    assert!(sc.status.success(), "shellcheck:\n{}", String::from_utf8_lossy(&sc.stdout));

    let tmp = work.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = Command::new("sh")
        .arg(&script)
        .args(["--code", "GPUM-X", "--dry-run"])
        .env("TMPDIR", &tmp)
        .env("CURL_CA_BUNDLE", p.ca_path().unwrap())
        .env("LANG", "C.UTF-8")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "the installer's exit code comes through: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("dummy installer ran with: --server {} --code GPUM-X --dry-run", p.url())),
        "the platform URL is passed as --server, then the script's own arguments: {stdout}"
    );
    assert!(stdout.contains(&format!("from={}", tmp.display())), "downloaded under TMPDIR: {stdout}");
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "cleaned up");

    // /dl/ serves the files, and nothing outside the directory.
    let c = p.http_client();
    for f in ["gpum-install", "gpum-install.sha256", "gpum-install.sig"] {
        let r = c.get(format!("{}/dl/{f}", p.url())).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{f}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), std::fs::read(dist.path().join(f)).unwrap().as_slice());
    }
    for bad in ["..%2Fplatform.db", "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", ".hidden", "missing", "a%00b"] {
        let r = c.get(format!("{}/dl/{bad}", p.url())).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{bad}");
    }
    // Dot segments go as they are (`--path-as-is`): a URL library resolves them before sending
    // (`/dl/..` is `/`, which redirects to the dashboard).
    let ca = p.ca_path().expect("this platform serves TLS");
    for bad in ["/dl/..", "/dl/%2E%2E", "/dl/../../etc/passwd", "/dl/./../platform.db"] {
        let out = std::process::Command::new("curl")
            .args(["-sS", "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(&ca)
            .arg(format!("{}{bad}", p.url()))
            .output()
            .expect("curl");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "404",
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Issue 29, item 2: the dashboard's command sets the code as a shell variable on a line ahead
/// of the script, and install.sh hands it to the installer on stdin: it is in no command line
/// (neither bash's, nor the installer's).
#[tokio::test]
async fn install_sh_passes_the_dashboards_code_on_stdin_not_in_argv() {
    let InstallSh { p, dist: _dist, work, script, .. } =
        serve_install_sh(PlatformOpts::default(), true).await;
    let code = JoinCode::generate().to_string();
    // As tests/e2e/dashboard.rs reads them off the page.
    let fetch = format!("curl -fsSL {}/install.sh", p.url());
    let install = format!("{{ echo gpum_code={code}; {fetch}; }} | sudo bash -s --");
    let dry_run = format!("{install} --dry-run");
    let tmp = work.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // The command as the dashboard gives it, with `sudo` left out and the script read from
    // the file fetched above instead of through curl.
    for (cmd, args) in [(&install, ""), (&dry_run, " --dry-run")] {
        let local = cmd.replace(&fetch, &format!("cat {}", script.display())).replace("sudo bash", "bash");
        let out = Command::new("bash")
            .arg("-c")
            .arg(&local)
            .env("TMPDIR", &tmp)
            .env("CURL_CA_BUNDLE", p.ca_path().unwrap())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(7), "{local}: {stdout} {}", String::from_utf8_lossy(&out.stderr));
        assert!(
            stdout.contains(&format!("dummy installer ran with: --server {}{args}\n", p.url())),
            "no code among the installer's arguments: {stdout}"
        );
        assert!(stdout.contains(&format!("stdin={code}\n")), "the code on the installer's stdin: {stdout}");
    }
}

/// Issue 29, item 13: where only wget is installed, install.sh follows no redirect (as curl
/// without `-L` follows none), so a redirect cannot lead it from https to http.
#[test]
fn install_sh_with_wget_follows_no_redirect() {
    use std::io::{Read as _, Write as _};
    use std::net::TcpListener;
    let text = include_str!("../../platform/assets/install.sh");
    // The redirect's target counts the connections it gets, and answers 404.
    let target = TcpListener::bind("127.0.0.1:0").unwrap();
    let target_port = target.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = reached.clone();
    std::thread::spawn(move || {
        for conn in target.incoming() {
            let Ok(mut c) = conn else { return };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let redirector = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = redirector.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in redirector.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(
                c,
                "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{target_port}/dl/x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    let work = tempfile::tempdir().unwrap();
    let script = work.path().join("install.sh");
    std::fs::write(&script, text.replace("@GPUM_PLATFORM_URL@", &format!("http://127.0.0.1:{port}")))
        .unwrap();
    // A PATH with wget and the tools install.sh uses, but no curl.
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["sh", "mktemp", "head", "cut", "tr", "sha256sum", "chmod", "rm", "wget"] {
        let found = ["/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(tool)).find(|p| p.exists());
        let found =
            found.unwrap_or_else(|| panic!("{tool} is not installed (tests/setup-deps.sh installs wget)"));
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    let tmp = work.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = Command::new(bin.join("sh"))
        .arg(&script)
        .arg("--dry-run")
        .env_clear()
        .env("PATH", &bin)
        .env("TMPDIR", &tmp)
        .env("LANG", "C.UTF-8")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(20), "{stderr}");
    assert!(stderr.contains("cannot download"), "{stderr}");
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0, "wget followed the redirect");
}

#[tokio::test]
async fn install_sh_exits_20_when_the_hash_does_not_match() {
    let InstallSh { p: _p, dist, work, script, .. } =
        serve_install_sh(PlatformOpts::insecure_http(), false).await;
    let tmp = work.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    for (lang, msg) in [
        ("ru_RU.UTF-8", "Не удалось скачать или проверить агент"),
        ("en_US.UTF-8", "Could not download or verify the agent"),
    ] {
        let out = Command::new("sh")
            .arg(&script)
            .arg("--code")
            .arg("X")
            .env("TMPDIR", &tmp)
            .env("LANG", lang)
            .env_remove("LC_ALL")
            .env_remove("LC_MESSAGES")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(20), "{stderr}");
        assert!(stderr.contains(msg), "{lang}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("dummy installer ran"), "nothing ran");
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "no file left behind");
    }
    // A missing installer is the same failure.
    std::fs::remove_file(dist.path().join("gpum-install")).unwrap();
    let out = Command::new("sh").arg(&script).env("TMPDIR", &tmp).env("LANG", "C").output().unwrap();
    assert_eq!(out.status.code(), Some(20));
}

// ---------------------------------------------------------------------------------------------
// schemathesis

fn schemathesis() -> Option<&'static str> {
    ["schemathesis", "st"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// schemathesis (from PyPI, not written here) generates requests from docs/openapi.yaml and
/// checks the real server: no 5xx, and every answer conforms to the schema. Twice: with the admin
/// token (every operation; the owner API's answer 401 to it, as documented), then with an owner's
/// API key on the owner API's operations, with a server of theirs to find.
#[tokio::test]
async fn schemathesis_finds_no_5xx_and_no_schema_violation() {
    let Some(st) = schemathesis() else {
        panic!("schemathesis is not installed: python3 -m pip install schemathesis (.ci/run does)");
    };
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    // Some state for the generated requests to find.
    let api = Api::new(&p);
    let _: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let owner = gpum_tests::owner::OwnerSession::accept(
        &p,
        &p.invite_owner("st@example.com"),
        "schemathesis password",
    )
    .await;
    let key = owner.create_api_key("schemathesis").await;
    let _: RegisterResponse = api.register(&p.owner_join_code("st@example.com"), "GPU-st").await.ok();
    let spec = gpum_tests::workspace_root().join("docs/openapi.yaml");
    for (bearer, only_owner) in [(p.admin_token().to_owned(), false), (key, true)] {
        let out = tokio::task::spawn_blocking({
            let (url, spec) = (p.url().to_owned(), spec.clone());
            move || {
                let mut cmd = Command::new(st);
                cmd.arg("run")
                    .arg(&spec)
                    .args(["--url", &url])
                    .args(["--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance"])
                    .args(["--max-examples", "25"])
                    .args(["--header", &format!("Authorization: Bearer {bearer}")])
                    .args(["--no-color"])
                    .env("SCHEMATHESIS_HOOKS", "");
                if only_owner {
                    cmd.args(["--include-tag", "owner"]);
                }
                cmd.output().expect("run schemathesis")
            }
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "schemathesis (owner API only: {only_owner}) failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if only_owner {
            assert!(stdout.contains("/api/v1/owner/nodes"), "the owner API was exercised: {stdout}");
        }
    }
    assert!(p.log().lines().all(|l| !l.contains("panicked")), "{}", p.log());
}

#[tokio::test]
async fn restart_keeps_the_database_and_the_port() {
    let mut p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let url = p.url().to_owned();
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    p.stop();
    assert!(!p.is_running());
    let down =
        api.c.post(format!("{url}{PATH_HEARTBEAT}")).bearer_auth(&r.node_token).json(&beat(1)).send().await;
    assert!(down.is_err(), "nothing answers while stopped");
    p.restart();
    assert_eq!(p.url(), url, "same port");
    let api = Api::new(&p);
    let _: HeartbeatResponse = api.heartbeat(&r.node_token, &beat(2)).await.ok();
    assert_eq!(p.node(&r.node_id).unwrap().last_seq, Some(2));
}

/// Unmounts on drop, so a failing assertion leaves no mount behind.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
#[ignore = "needs root (mounts a tmpfs)"]
async fn install_sh_exits_10_when_tmpdir_is_noexec() {
    let InstallSh { p: _p, dist: _dist, work, script, .. } =
        serve_install_sh(PlatformOpts::insecure_http(), true).await;
    let noexec = work.path().join("noexec");
    std::fs::create_dir(&noexec).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "noexec,size=16m", "tmpfs"])
        .arg(&noexec)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(mounted, "cannot mount a tmpfs here: needs root");
    let _m = Mount(noexec.clone());
    let out = Command::new("sh")
        .arg(&script)
        .args(["--code", "X"])
        .env("TMPDIR", &noexec)
        .env("LANG", "ru_RU.UTF-8")
        .env_remove("LC_ALL")
        .env_remove("LC_MESSAGES")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(10), "{stderr}");
    assert!(stderr.contains("Не удалось запустить скачанный агент"), "{stderr}");
    assert!(stderr.contains("sudo env TMPDIR=/var/tmp bash"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("dummy installer ran"));
    assert_eq!(std::fs::read_dir(&noexec).unwrap().count(), 0, "cleaned up");
}

// ---------------------------------------------------------------------------------------------
// Issue 9: idempotent registration; issue 14: hardening

async fn register_with_id(api: &Api, code: &str, uuid: &str, install_id: &str) -> Ans {
    let req = RegisterRequest {
        join_code: code.into(),
        agent_version: "0.1.0".into(),
        inventory: inventory(uuid),
        install_id: Some(install_id.into()),
    };
    api.post(PATH_REGISTER, None, &req).await
}

#[tokio::test]
async fn a_repeated_registration_with_the_same_install_id_gets_the_same_node() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let code = p.join_code();
    let id = "00112233445566778899aabbccddeeff";
    let first: RegisterResponse = register_with_id(&api, &code, "GPU-a", id).await.ok();
    // The installer crashed before saving the token and runs again with the same command.
    let again: RegisterResponse = register_with_id(&api, &code, "GPU-a", id).await.ok();
    assert_eq!(again.node_id, first.node_id, "the same node");
    assert_ne!(again.node_token, first.node_token, "a fresh token");
    assert_eq!(api.heartbeat(&first.node_token, &beat(1)).await.code(), ErrorCode::TokenReplaced);
    let _: HeartbeatResponse = api.heartbeat(&again.node_token, &beat(1)).await.ok();
    assert_eq!(p.nodes().nodes.len(), 1, "exactly one node");
    // Anyone else with the code is still refused.
    let other = "ffeeddccbbaa99887766554433221100";
    assert_eq!(register_with_id(&api, &code, "GPU-a", other).await.code(), ErrorCode::JoinCodeUsed);
    assert_eq!(api.register(&code, "GPU-a").await.code(), ErrorCode::JoinCodeUsed);
    assert_eq!(
        register_with_id(&api, &p.join_code(), "GPU-z", "xyz").await.code(),
        ErrorCode::InvalidRequest
    );
}

async fn enroll(api: &Api, code: &str, install_id: &str) -> Ans {
    let req = gpum_protocol::EnrollRequest { join_code: code.into(), install_id: install_id.into() };
    api.post(gpum_protocol::PATH_ENROLL, None, &req).await
}

/// Issue 29, item 2: the installer's first call binds the code to its install id. A local user
/// who read the code off a process list afterwards can neither enroll nor register with it,
/// with or without an install id of their own; the installer itself can repeat both.
#[tokio::test]
async fn an_enrolled_code_is_useless_without_its_install_id() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let code = p.join_code();
    let owner = "00112233445566778899aabbccddeeff";
    let thief = "ffeeddccbbaa99887766554433221100";
    let bound: gpum_protocol::EnrollResponse = enroll(&api, &code, owner).await.ok();
    assert!(bound.expires_at > 0);
    // The thief, at any point before the owner's registration.
    assert_eq!(enroll(&api, &code, thief).await.code(), ErrorCode::JoinCodeUsed);
    assert_eq!(register_with_id(&api, &code, "GPU-fake", thief).await.code(), ErrorCode::JoinCodeUsed);
    assert_eq!(api.register(&code, "GPU-fake").await.code(), ErrorCode::JoinCodeUsed);
    assert!(p.nodes().nodes.is_empty(), "no fake machine");
    // The owner's install, run twice (interrupted), then registering.
    let _: gpum_protocol::EnrollResponse = enroll(&api, &code, owner).await.ok();
    let r: RegisterResponse = register_with_id(&api, &code, "GPU-a", owner).await.ok();
    assert_eq!(p.nodes().nodes.len(), 1);
    assert_eq!(p.nodes().nodes[0].id, r.node_id);
    // Unknown, malformed and expired codes keep their own answers.
    assert_eq!(
        enroll(&api, "GPUM-7K3QD-M2X9P-4RT8V-H6W1N", owner).await.code(),
        ErrorCode::JoinCodeMalformed
    );
    let unknown = JoinCode::generate().to_string();
    assert_eq!(enroll(&api, &unknown, owner).await.code(), ErrorCode::JoinCodeUnknown);
    assert_eq!(enroll(&api, &p.join_code(), "xyz").await.code(), ErrorCode::InvalidRequest);
    let short = p.join_code_ttl("1m");
    p.advance_clock(120);
    assert_eq!(enroll(&api, &short, owner).await.code(), ErrorCode::JoinCodeExpired);
}

/// Issue 29, item 3: one code repeated by its own install id is bounded (repeats per code), and
/// so are the replaced tokens a node's repeats and rotations leave behind.
#[tokio::test]
async fn repeating_a_code_cannot_grow_the_database_without_bound() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let code = p.join_code();
    let id = "00112233445566778899aabbccddeeff";
    let mut last: RegisterResponse = register_with_id(&api, &code, "GPU-a", id).await.ok();
    let max = limits::MAX_CODE_REPEATS as usize;
    for _ in 0..max {
        last = register_with_id(&api, &code, "GPU-a", id).await.ok();
    }
    assert_eq!(register_with_id(&api, &code, "GPU-a", id).await.code(), ErrorCode::JoinCodeUsed);
    assert_eq!(enroll(&api, &code, id).await.code(), ErrorCode::JoinCodeUsed);
    // The newest token works; the newest replaced ones are still told `token_replaced`.
    let _: HeartbeatResponse = api.heartbeat(&last.node_token, &beat(1)).await.ok();
    for _ in 0..(2 * limits::MAX_REPLACED_TOKENS_PER_NODE) {
        p.rotate_token(&last.node_id);
    }
    let kept: i64 = p.with_db(|db| {
        db.query_row(
            "SELECT COUNT(*) FROM replaced_tokens WHERE node_id = ?1",
            gpum_platform::params![&last.node_id],
            |r| r.get(0),
        )
        .unwrap()
    });
    assert_eq!(kept as usize, limits::MAX_REPLACED_TOKENS_PER_NODE, "replaced tokens kept per node");
}

#[tokio::test]
async fn heartbeat_answers_carry_a_bounded_number_of_commands() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let t = p.admin_token();
    let n = 3 * limits::MAX_COMMANDS_PER_RESPONSE + 1;
    // Commands go only to an online server: a handshake (seq 0) brings it online.
    let _: HeartbeatResponse = api.heartbeat(&r.node_token, &beat(0)).await.ok();
    for _ in 0..n {
        let a = api
            .send(
                api.c
                    .post(format!("{}{}", p.url(), gpum_protocol::path_admin_node_commands(&r.node_id)))
                    .bearer_auth(t)
                    .json(&serde_json::json!({"kind": "recheck"})),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED);
    }
    let mut delivered = 0;
    let mut results = Vec::new();
    for seq in 1..=10 {
        let mut req = beat(seq);
        req.command_results = std::mem::take(&mut results);
        let hb: HeartbeatResponse = api.heartbeat(&r.node_token, &req).await.ok();
        assert!(
            hb.commands.len() <= limits::MAX_COMMANDS_PER_RESPONSE,
            "{} commands in one answer",
            hb.commands.len()
        );
        delivered += hb.commands.len();
        results = hb
            .commands
            .iter()
            .map(|c| CommandResult { id: c.id.clone(), ok: true, message: "ran".into() })
            .collect();
    }
    assert_eq!(delivered, n, "the rest came with the next answers");
    let node = p.node(&r.node_id).unwrap();
    assert!(node.commands.iter().all(|c| c.result.is_some()), "every result was taken");
}

/// The bytes the database's live data takes: SQLite's pages in use, or the sum of PostgreSQL's
/// live rows.
fn db_live_bytes(p: &TestPlatform) -> u64 {
    p.with_db(|c| {
        let q = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64;
        match c.engine() {
            gpum_platform::sql::Engine::Sqlite => {
                (q("PRAGMA page_count") - q("PRAGMA freelist_count")) * q("PRAGMA page_size")
            }
            gpum_platform::sql::Engine::Postgres => {
                let tables: Vec<String> = c
                    .prepare_cached("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
                    .unwrap()
                    .query_map([], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                tables
                    .iter()
                    .map(|t| q(&format!("SELECT COALESCE(SUM(pg_column_size(t.*)), 0)::bigint FROM {t} t")))
                    .sum()
            }
        }
    })
}

#[tokio::test]
async fn fifty_oversized_heartbeats_leave_the_database_small() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let r: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let before = db_live_bytes(&p);
    // 1000 such records make a body just under the 1 MiB limit.
    let long = "x".repeat(300);
    let removed = |seq: u64, n: usize| {
        (0..n)
            .map(|i| gpum_protocol::RemovedContainer {
                id: format!("{seq:04}{i:04}{}", "f".repeat(100)),
                name: long.clone(),
                reason: long.clone(),
            })
            .collect::<Vec<_>>()
    };
    // What the review sent: a thousand removals per heartbeat (refused now), and then the most
    // the limits allow (taken, and pruned).
    for seq in 1..=50 {
        let big = HeartbeatRequest { removed_containers: removed(seq, 1000), ..beat(seq) };
        let a = api.heartbeat(&r.node_token, &big).await;
        assert!(a.status == StatusCode::BAD_REQUEST || a.status.is_success(), "{}", a.status);
        let max = HeartbeatRequest {
            removed_containers: removed(seq, limits::MAX_REMOVED_CONTAINERS),
            ..beat(seq)
        };
        let _: HeartbeatResponse = api.heartbeat(&r.node_token, &max).await.ok();
    }
    let after = db_live_bytes(&p);
    assert!(after < before + 2 * 1024 * 1024, "the database grew from {before} to {after} bytes");
    let node = p.node(&r.node_id).unwrap();
    assert!(!node.removed_containers.is_empty());
    let kept: i64 =
        p.with_db(|c| c.query_row("SELECT COUNT(*) FROM container_removals", [], |r| r.get(0)).unwrap());
    assert_eq!(kept as usize, limits::MAX_REMOVED_HISTORY_PER_NODE);
}

#[tokio::test]
async fn a_heartbeat_cannot_take_another_nodes_gpu() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let a: RegisterResponse = api.register(&p.join_code(), "GPU-a").await.ok();
    let b: RegisterResponse = api.register(&p.join_code(), "GPU-b").await.ok();
    let mut squat = beat(1);
    squat.inventory = Some(inventory("GPU-a"));
    squat.inventory_hash = inventory("GPU-a").hash();
    let ans = api.heartbeat(&b.node_token, &squat).await;
    assert_eq!((ans.status, ans.code()), (StatusCode::CONFLICT, ErrorCode::GpuAlreadyRegistered));
    assert_eq!(p.node(&a.node_id).unwrap().inventory.private.gpu_uuids, vec!["GPU-a"]);
    assert_eq!(p.node(&b.node_id).unwrap().inventory.private.gpu_uuids, vec!["GPU-b"]);
    // A deleted node's GPU is free again.
    p.delete_node(&a.node_id);
    let _: HeartbeatResponse = api.heartbeat(&b.node_token, &squat).await.ok();
    assert_eq!(p.node(&b.node_id).unwrap().inventory.private.gpu_uuids, vec!["GPU-a"]);
}

#[tokio::test]
async fn nodes_list_prints_control_characters_escaped() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let mut inv = inventory("GPU-a");
    inv.public.gpus[0].model = "T4\x1b[2J\x1b[H\nnode-forged online verified".into();
    let req = RegisterRequest {
        join_code: p.join_code(),
        agent_version: "0.1\u{9b}31m\r".into(),
        inventory: inv,
        install_id: None,
    };
    let _: RegisterResponse = api.post(PATH_REGISTER, None, &req).await.ok();
    let out = p.cli(["nodes", "list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "a control character reached the terminal: {text:?}"
    );
    assert_eq!(text.lines().count(), 2, "the header and one node: {text}");
    assert!(text.contains("T4\\x1b[2J\\x1b[H\\nnode-forged"), "{text}");
    assert!(text.contains("0.1\\u{9b}31m\\r"), "{text}");
}

// install.sh's URL

#[tokio::test]
async fn install_sh_never_reflects_the_host_header() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let get = |host: &'static str| {
        let port = p.port();
        async move {
            raw_http(port, &format!("GET /install.sh HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"))
                .await
        }
    };
    let text = get("evil.example").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains(&format!("GPUM_PLATFORM_URL='{}'", p.url())), "the bound loopback address: {text}");
    assert!(!text.contains("evil.example"));

    let p2 = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--public-url".into(), "https://gpum.example/".into()],
        ..PlatformOpts::insecure_http()
    });
    let text =
        raw_http(p2.port(), "GET /install.sh HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
            .await;
    assert!(text.contains("GPUM_PLATFORM_URL='https://gpum.example'\n"), "{text}");
    assert!(!text.contains("evil.example"));
}

/// Issue 43: `serve` refuses a `--relay-domain` on the public URL's site (tenants' pages would
/// be same-site with the dashboard) unless told so with `--allow-same-site-relay-domain`; a
/// domain of its own is served. Each is decided before anything is opened or bound.
#[test]
fn serve_refuses_a_relay_domain_on_the_dashboards_site_unless_told() {
    let dir = tempfile::tempdir().unwrap();
    let run = |public: &str, relay: &str, more: &[&str]| {
        let o = Command::new(gpum_tests::bin("gpum-platform"))
            .arg("serve")
            .arg("--db")
            .arg(dir.path().join("p.db"))
            .args(["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"])
            .args(["--listen", "0.0.0.0:0", "--public-url", public])
            .args(["--relay-http-listen", "0.0.0.0:0", "--relay-domain", relay])
            .args(more)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    for (public, relay) in [
        ("https://gpum.example", "relay.gpum.example"),
        ("https://app.gpum.example.com:8443/", "relay.gpum.example.com"),
        ("https://gpum.example.co.uk", "relay.example.co.uk"),
    ] {
        let (code, err) = run(public, relay, &[]);
        assert_eq!(code, Some(1), "{public} {relay}: {err}");
        assert!(err.contains("--relay-domain") && err.contains("--allow-same-site-relay-domain"), "{err}");
        assert!(!dir.path().join("p.db").exists(), "refused before the database is opened");
        // Told so, it goes on (to the certificate, which does not exist here).
        let (code, err) = run(public, relay, &["--allow-same-site-relay-domain"]);
        assert_eq!(code, Some(1));
        assert!(err.contains("/nonexistent/cert.pem") && !err.contains("same-site"), "{err}");
    }
    for (public, relay) in
        [("https://gpum.example", "gpum-usercontent.example"), ("https://gpum.github.io", "relay.github.io")]
    {
        let (code, err) = run(public, relay, &[]);
        assert_eq!(code, Some(1));
        assert!(
            err.contains("/nonexistent/cert.pem") && !err.contains("same-site"),
            "{public} {relay}: {err}"
        );
    }
}

#[test]
fn serve_requires_an_https_public_url_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(gpum_tests::bin("gpum-platform"))
            .arg("serve")
            .arg("--db")
            .arg(dir.path().join("p.db"))
            .args(["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"])
            .args(args)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    // No bind happens: each is refused before the server listens.
    let (code, err) = run(&["--listen", "0.0.0.0:0"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--public-url https://") && err.contains("required"), "{err}");
    for url in ["http://gpum.example", "http://192.0.2.1:8080", "ftp://gpum.example"] {
        let (code, err) = run(&["--listen", "0.0.0.0:0", "--public-url", url]);
        assert_eq!(code, Some(1), "{url}");
        assert!(err.contains("--public-url"), "{url}: {err}");
    }
    let (code, err) = run(&["--listen", "127.0.0.1:0", "--public-url", "http://gpum.example"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("plain http"), "{err}");
}

// Slow clients

/// Sends `request` on a fresh connection and reads until the server closes it (at most 10 s).
async fn raw_http(port: u16, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Connections that send part of a request head and then nothing.
async fn slow_clients(port: u16, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut v = Vec::new();
    for _ in 0..n {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(b"GET /install.sh HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
        v.push(s);
    }
    v
}

/// Whether the server closed `s` (EOF or reset) within `within`.
async fn closed_by_server(s: &mut tokio::net::TcpStream, within: std::time::Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut b = [0u8; 256];
    loop {
        match tokio::time::timeout(within, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test]
async fn three_hundred_slow_header_clients_do_not_starve_install_sh() {
    // A soft limit of 256 open files, as a shell's default can be: the server raises it, and
    // keeps its connection cap below it.
    let p = TestPlatform::start(PlatformOpts {
        nofile_soft_limit: Some(256),
        extra_args: vec!["--header-timeout".into(), "3".into()],
        ..PlatformOpts::insecure_http()
    });
    let mut slow = slow_clients(p.port(), 300).await;
    let started = std::time::Instant::now();
    let r = p.http_client().get(format!("{}/install.sh", p.url())).send().await.expect("install.sh answers");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().starts_with("#!/bin/sh"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "answered at once: {:?}",
        started.elapsed()
    );
    // The header timeout closes every one of them.
    for s in &mut slow {
        assert!(closed_by_server(s, std::time::Duration::from_secs(10)).await, "a slow client was kept");
    }
    assert!(!p.log().contains("Too many open files"), "{}", p.log());
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test]
async fn the_connection_cap_holds_and_the_server_recovers() {
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--max-connections".into(), "20".into(), "--header-timeout".into(), "2".into()],
        ..PlatformOpts::insecure_http()
    });
    let pid = p.pid().unwrap();
    // At rest: once the descriptors the platform opens by itself after its start (on PostgreSQL
    // the effects' `LISTEN` connection) are open, that is three readings alike.
    let mut base = open_fds(pid);
    let mut alike = 0;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = open_fds(pid);
        alike = if now == base { alike + 1 } else { 0 };
        base = now;
        if alike == 3 {
            break;
        }
    }
    let _slow = slow_clients(p.port(), 60).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let held = open_fds(pid);
    assert!(held <= base + 20, "{held} descriptors open with a cap of 20 connections (at rest: {base})");
    // Slow clients time out, those waiting get their turn, and so does a real request.
    let started = std::time::Instant::now();
    let r = p.http_client().get(format!("{}/install.sh", p.url())).send().await.expect("install.sh answers");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_body_that_never_arrives_times_out() {
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--body-timeout".into(), "2".into()],
        ..PlatformOpts::insecure_http()
    });
    let started = std::time::Instant::now();
    let text = raw_http(
        p.port(),
        &format!("POST {PATH_REGISTER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"join"),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(started.elapsed() < std::time::Duration::from_secs(8), "{:?}", started.elapsed());
}

// /dl/

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn downloads_stream_with_bounded_memory_for_slow_clients() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dist = tempfile::tempdir().unwrap();
    let size = 64 * 1024 * 1024;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    std::fs::write(dist.path().join("gpum-agent"), &data).unwrap();
    let p = TestPlatform::start(PlatformOpts {
        dist: Some(dist.path().to_owned()),
        ..PlatformOpts::insecure_http()
    });
    let pid = p.pid().unwrap();

    // One whole download is right.
    let body = p
        .http_client()
        .get(format!("{}/dl/gpum-agent", p.url()))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(sha256_hex(&body), sha256_hex(&data));
    drop(body);
    let before = rss_kib(pid);

    // Twenty clients that ask for the file and read almost none of it.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", p.port())).await.unwrap();
        s.write_all(b"GET /dl/gpum-agent HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut b = [0u8; 4096];
        let n = s.read(&mut b).await.unwrap();
        assert!(String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 200"));
        slow.push(s);
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let during = rss_kib(pid);
    // Reading the file whole per request would take 20 × 64 MiB.
    assert!(during < before + 64 * 1024, "RSS went from {before} KiB to {during} KiB");
}

#[tokio::test]
async fn downloads_serve_only_regular_files() {
    let dist = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"outside --dist").unwrap();
    std::fs::write(dist.path().join("gpum-install"), b"installer").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), dist.path().join("escape")).unwrap();
    std::os::unix::fs::symlink(dist.path().join("gpum-install"), dist.path().join("alias")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dist.path().join("zero")).unwrap();
    std::fs::create_dir(dist.path().join("subdir")).unwrap();
    let fifo = Command::new("mkfifo").arg(dist.path().join("fifo")).status().unwrap();
    assert!(fifo.success());
    let mut p = TestPlatform::start(PlatformOpts {
        dist: Some(dist.path().to_owned()),
        ..PlatformOpts::insecure_http()
    });
    let c = reqwest::Client::builder().timeout(std::time::Duration::from_secs(5)).build().unwrap();
    let r = c.get(format!("{}/dl/gpum-install", p.url())).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    for name in ["escape", "alias", "zero", "subdir", "fifo"] {
        let r =
            c.get(format!("{}/dl/{name}", p.url())).send().await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{name}");
    }
    assert!(
        p.terminate(std::time::Duration::from_secs(10)),
        "SIGTERM stops the server, the FIFO notwithstanding"
    );
}
