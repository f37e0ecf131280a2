//! Issue 44, items 1 and 2: whatever face changes the state (the admin API, the owner's API, the
//! cabinet, the CLI, which is a process of its own) and whichever replica it reaches, the open
//! tenant streams that the change ends close within a second: a rental stopped, a node deleted,
//! a node's token replaced, an owner disabled.
//!
//! The relay is the real one (`serve --relay-listen`), and so is every face. The node's end of
//! the tunnel is the test's own (`TunnelEnd`: the upgrade with the node's token, then yamux,
//! answering each stream's first line and echoing what follows), so that one test can walk every
//! face over nodes that need no Docker engine; the real agent's end is proved in `tunnel.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use gpum_platform::sql::Engine;
use gpum_platform::testdb::TestDb;
use gpum_protocol::{
    Health, HeartbeatRequest, NvmlState, PATH_HEARTBEAT, PATH_OWNER_NODES, PATH_REGISTER, ProbeReport,
    RegisterRequest, RegisterResponse, VerificationState,
};
use gpum_tests::owner::OwnerSession;
use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};
use gpum_tests::tunnel::{Rental, connect, create_rental_with_ports, free_port};
use reqwest::StatusCode;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// How soon an ended stream must close: the effects' promise (about a second).
const CLOSED_WITHIN: Duration = Duration::from_secs(1);

const PORT: u16 = 7000;

fn image() -> String {
    format!("nvcr.io/nvidia/pytorch@sha256:{}", "ab".repeat(32))
}

/// Registers a node with `code` (GPU `uuid`), has it pass its check, and prices it.
pub(crate) async fn rentable(p: &TestPlatform, code: String, uuid: &str) -> RegisterResponse {
    let c = p.http_client();
    // The tunnel suites' machine (memory, cores, two GPUs), with GPUs of its own.
    let mut inventory = gpum_tests::tunnel::inventory();
    inventory.private.gpu_uuids = vec![format!("{uuid}0"), format!("{uuid}1")];
    let req = RegisterRequest {
        join_code: code,
        agent_version: "0.1.0".into(),
        inventory: inventory.clone(),
        install_id: None,
    };
    let r = c.post(format!("{}{PATH_REGISTER}", p.url())).json(&req).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "register");
    let reg: RegisterResponse = r.json().await.unwrap();
    let hb = HeartbeatRequest {
        seq: 1,
        inventory_hash: inventory.hash(),
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

/// The port at which a [`TunnelEnd`] answers HTTP requests (every other port echoes).
pub(crate) const HTTP_PORT: u16 = 8080;

/// The node's end of its tunnel, held by the test: answers every stream's first line with
/// `{"ok":true}` (a ping with `pong`), then echoes what follows, or on [`HTTP_PORT`] answers
/// each request `200` with the rental's id as the body. Dropped, it ends.
pub(crate) struct TunnelEnd(tokio::task::JoinHandle<()>);

impl Drop for TunnelEnd {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl TunnelEnd {
    /// Opens node `token`'s tunnel at platform `p`.
    async fn open(p: &TestPlatform, token: &str) -> TunnelEnd {
        TunnelEnd::open_at(p.port(), token).await
    }

    /// Opens node `token`'s tunnel at the platform's API on loopback port `api` (plain HTTP).
    pub(crate) async fn open_at(api: u16, token: &str) -> TunnelEnd {
        use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};
        let mut io = tokio::net::TcpStream::connect(("127.0.0.1", api)).await.unwrap();
        // Small frames (a stream's first line, its answer) go out at once, not after Nagle's
        // wait for an acknowledgement.
        io.set_nodelay(true).unwrap();
        let head = format!(
            "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: {}\r\n\r\n",
            gpum_protocol::PATH_TUNNEL,
            gpum_protocol::TUNNEL_UPGRADE
        );
        io.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut b = [0u8; 1];
        while !answer.ends_with(b"\r\n\r\n") {
            assert_eq!(io.read(&mut b).await.unwrap(), 1, "the upgrade's answer");
            answer.push(b[0]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
        let task = tokio::spawn(async move {
            let mut conn = yamux::Connection::new(
                io.compat(),
                gpum_protocol::tunnel::yamux_config(),
                yamux::Mode::Client,
            );
            while let Some(Ok(stream)) = std::future::poll_fn(|cx| conn.poll_next_inbound(cx)).await {
                tokio::spawn(async move {
                    let mut s = tokio::io::BufReader::new(stream.compat());
                    let mut first = String::new();
                    if s.read_line(&mut first).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if first.trim_end() == "ping" {
                        let _ = s.write_all(b"pong\n").await;
                        let _ = s.shutdown().await;
                        return;
                    }
                    if s.write_all(b"{\"ok\":true}\n").await.is_err() || s.flush().await.is_err() {
                        return;
                    }
                    let open: gpum_protocol::TunnelOpen = match serde_json::from_str(&first) {
                        Ok(o) => o,
                        Err(_) => return,
                    };
                    if open.port == HTTP_PORT {
                        // Each request head answered with the rental's id (GETs: no body).
                        let mut line = String::new();
                        loop {
                            line.clear();
                            match s.read_line(&mut line).await {
                                Ok(0) | Err(_) => return,
                                Ok(_) if line == "\r\n" => {
                                    let body = open.rental.as_bytes();
                                    let head =
                                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                                    if s.write_all(head.as_bytes()).await.is_err()
                                        || s.write_all(body).await.is_err()
                                        || s.flush().await.is_err()
                                    {
                                        return;
                                    }
                                }
                                Ok(_) => {}
                            }
                        }
                    }
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() || s.flush().await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        TunnelEnd(task)
    }
}

/// A tenant's open stream to rental `r` through the relay at `relay`, proved open by an echo.
fn open_stream(relay: u16, r: &Rental) -> TcpStream {
    let mut s = None;
    wait_until(Duration::from_secs(20), "the rental reachable through the relay", || {
        s = connect(relay, &r.id, PORT, &r.id, &r.credential).1;
        s.is_some()
    });
    let mut s = s.unwrap();
    s.write_all(b"hello\n").unwrap();
    let mut back = [0u8; 6];
    s.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"hello\n");
    s
}

/// Whether the stream closes (EOF or reset) within [`CLOSED_WITHIN`], with nothing else
/// arriving on it: `Err` says what happened instead.
async fn closed(s: TcpStream) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        let mut s = s;
        s.set_read_timeout(Some(CLOSED_WITHIN)).unwrap();
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Ok(0) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Ok(n) => Err(format!("{:?} arrived instead of the close", &buf[..n])),
            Err(e) => Err(format!("the stream is still open after {CLOSED_WITHIN:?} ({e})")),
        }
    })
    .await
    .unwrap()
}

/// The new token as the cabinet shows it: `<code id="new-token">…</code>`.
fn shown_token(page: &str) -> Option<String> {
    Some(page.split("id=\"new-token\">").nth(1)?.split('<').next()?.trim().to_owned())
}

fn rental(p: &TestPlatform, node: &str) -> Rental {
    create_rental_with_ports(p, node, &image(), &[PORT], "true")
}

/// Platform `front` (which the faces reach) and `relay_of` (whose relay the tenant uses, and
/// which holds the tunnel) may be two replicas.
struct World<'a> {
    front: &'a TestPlatform,
    holder: &'a TestPlatform,
    relay: u16,
}

impl World<'_> {
    /// The stream closes within [`CLOSED_WITHIN`] (see [`closed`]); else the test fails with
    /// the platforms' logs.
    async fn closes(&self, s: TcpStream, what: &str) {
        if let Err(e) = closed(s).await {
            panic!(
                "{what}: {e}\nthe platform that holds the tunnel:\n{}\nthe one the faces reached:\n{}",
                self.holder.log(),
                if std::ptr::eq(self.front, self.holder) {
                    String::from("(the same)")
                } else {
                    self.front.log()
                }
            );
        }
    }

    async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> serde_json::Value {
        let mut r = self
            .front
            .http_client()
            .request(method, format!("{}{path}", self.front.url()))
            .bearer_auth(self.front.admin_token());
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap_or(serde_json::Value::Null)
    }

    async fn owner_api(&self, key: &str, method: reqwest::Method, path: &str) -> serde_json::Value {
        let r = self
            .front
            .http_client()
            .request(method, format!("{}{path}", self.front.url()))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap_or(serde_json::Value::Null)
    }
}

/// Every face, every operation that ends something live, on the engine `GPUM_TEST_DB` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_face_closes_the_streams_its_change_ends_at_once() {
    let relay = free_port();
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--relay-listen".into(), format!("127.0.0.1:{relay}")],
        ..PlatformOpts::insecure_http()
    });
    let w = World { front: &p, holder: &p, relay };
    walk_every_face(&w).await;
}

/// Issue 44, item 2, across replicas: on PostgreSQL, each change sent to the replica that does
/// not hold the tunnel (its API, and the CLI) closes the streams held by the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
async fn a_change_sent_to_one_replica_closes_the_streams_the_other_holds() {
    let relay = free_port();
    let holder = TestPlatform::start_on(
        PlatformOpts {
            extra_args: vec!["--relay-listen".into(), format!("127.0.0.1:{relay}")],
            ..PlatformOpts::insecure_http()
        },
        Arc::new(TestDb::on(Engine::Postgres)),
    );
    // The other replica, on the same database, with a relay of its own that holds nothing.
    let front = holder.replica_with(PlatformOpts {
        extra_args: vec!["--relay-listen".into(), format!("127.0.0.1:{}", free_port())],
        ..PlatformOpts::insecure_http()
    });
    let w = World { front: &front, holder: &holder, relay };
    walk_every_face(&w).await;
}

async fn walk_every_face(w: &World<'_>) {
    let (p, relay) = (w.holder, w.relay);
    let email = "ann@example.com";
    let owner = OwnerSession::accept(w.front, &w.front.invite_owner(email), "a long enough password 1").await;
    let key = owner.create_api_key("effects").await;
    let node = |i: u32| {
        let code = w.front.owner_join_code(email);
        async move { rentable(p, code, &format!("GPU-e44{i:05}-0000-4000-8000-00000000000")).await }
    };

    // A rental stopped: through the admin API and the CLI (an owner stops none).
    let n = node(0).await;
    let mut tunnel = TunnelEnd::open(p, &n.node_token).await;
    let r = rental(p, &n.node_id);
    let s = open_stream(relay, &r);
    w.admin(reqwest::Method::POST, &gpum_protocol::path_admin_rental_stop(&r.id), None).await;
    w.closes(s, "stopped through the admin API").await;
    let r = rental(p, &n.node_id);
    let s = open_stream(relay, &r);
    w.front.cli_json(&["rentals", "stop", &r.id]);
    w.closes(s, "stopped through the CLI").await;

    // Its token replaced: through the admin API, the owner's API, the cabinet and the CLI. The
    // tunnel the old token opened ends; the new token's holder opens its own.
    let r = rental(p, &n.node_id);
    for face in ["the admin API", "the owner's API", "the cabinet", "the CLI"] {
        let s = open_stream(relay, &r);
        let token = match face {
            "the admin API" => {
                let path = gpum_protocol::path_admin_node_rotate_token(&n.node_id);
                w.admin(reqwest::Method::POST, &path, None).await["node_token"].as_str().unwrap().to_owned()
            }
            "the owner's API" => {
                let path = format!("{PATH_OWNER_NODES}/{}/rotate-token", n.node_id);
                w.owner_api(&key, reqwest::Method::POST, &path).await["node_token"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            }
            "the cabinet" => {
                let page = owner.post(&format!("/dashboard/servers/{}/rotate-token", n.node_id), &[]).await;
                assert_eq!(page.status, StatusCode::OK, "{}", page.body);
                shown_token(&page.body).expect("the new token on the page")
            }
            _ => w.front.cli_json(&["nodes", "rotate-token", &n.node_id])["node_token"]
                .as_str()
                .unwrap()
                .to_owned(),
        };
        w.closes(s, &format!("its token replaced through {face}")).await;
        tunnel = TunnelEnd::open(p, &token).await;
    }

    // A node deleted: through the admin API, the owner's API, the cabinet and the CLI.
    for (i, face) in ["the admin API", "the owner's API", "the cabinet", "the CLI"].into_iter().enumerate() {
        let n = node(1 + i as u32).await;
        let _tunnel = TunnelEnd::open(p, &n.node_token).await;
        let r = rental(p, &n.node_id);
        let s = open_stream(relay, &r);
        match i {
            0 => {
                w.admin(reqwest::Method::DELETE, &gpum_protocol::path_admin_node(&n.node_id), None).await;
            }
            1 => {
                w.owner_api(&key, reqwest::Method::DELETE, &format!("{PATH_OWNER_NODES}/{}", n.node_id))
                    .await;
            }
            2 => {
                let page = owner.post(&format!("/dashboard/servers/{}/delete", n.node_id), &[]).await;
                assert!(page.status.is_redirection() || page.status.is_success(), "{}", page.body);
            }
            _ => {
                w.front.cli_json(&["nodes", "delete", &n.node_id]);
            }
        }
        w.closes(s, &format!("its node deleted through {face}")).await;
    }

    // Its owner disabled: through the admin API and the CLI; their rentals end.
    let r = rental(p, &n.node_id);
    let s = open_stream(relay, &r);
    w.admin(
        reqwest::Method::PATCH,
        &format!("{}/{email}", gpum_protocol::PATH_ADMIN_OWNERS),
        Some(serde_json::json!({"disabled": true})),
    )
    .await;
    w.closes(s, "its owner disabled through the admin API").await;
    w.front.cli_json(&["owners", "enable", email]);
    let r = rental(p, &n.node_id);
    let s = open_stream(relay, &r);
    w.front.cli_json(&["owners", "disable", email]);
    w.closes(s, "its owner disabled through the CLI").await;
    w.front.cli_json(&["owners", "enable", email]);
    drop(tunnel);
}
