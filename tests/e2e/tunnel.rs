//! Issue 34: a tenant reaches a rental's ports through the real relay (`serve --relay-listen`)
//! and the real agent's outbound tunnel, against the real engine on this machine. The rental's
//! container runs a line echo server (`nc -ll -e cat`) and a web server (`httpd`), through the
//! agent's `test-knobs` seam without the GPU request (`gpum-test/` images only).
//!
//! Proved here: an ssh-like interactive session (many round trips) and an HTTP request reach the
//! container; another rental's credential is 407; a port the rental does not list is 403;
//! stopping the rental closes its open stream and the next `CONNECT` is 404; the tunnel comes
//! back after the agent restarts and after the platform restarts.
//!
//! And against a hostile relay (a front the test makes before the real platform, which answers
//! the agent's tunnel upgrade itself and then opens whatever streams it likes): the agent refuses
//! another node's rental, an unknown one, a stopped one, one whose container exited, a port the
//! rental does not list, names that are addresses, and lines that are not requests; an extra
//! field naming an address changes nothing (the agent never reads an address); nothing reaches
//! the host.
//!
//! The setup (platform, node, rentals, agent, `CONNECT`) is `gpum_tests::tunnel`, shared with
//! the suites that build on it.
#![allow(clippy::disallowed_methods)]

mod tunnel_http;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};
use gpum_tests::require_docker;
use gpum_tests::tunnel::{
    LONG, ScopedContainers, TunnelWorld, agent_log, connect, create_rental, create_rental_running,
    echo_session, inventory, rentable_node_with, rental_state, start_agent, write_agent_config,
};

#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread")]
async fn tunnel_reaches_a_rentals_ports_and_nothing_else_and_survives_restarts() {
    require_docker("tunnel_reaches_a_rentals_ports_and_nothing_else_and_survives_restarts");
    let mut w = TunnelWorld::start(vec![]).await;
    let (relay, a, b) = (w.relay, w.a.clone(), w.b.clone());
    let ready = |w: &TunnelWorld, r| w.ready(r, 7000);

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
    w.restart_agent();
    wait_until(LONG, "the tunnel back after the agent restarted", || ready(&w, &b));
    echo_session(connect(relay, &b.id, 7000, &b.id, &b.credential).1.unwrap(), 5);

    // The platform restarts: the agent dials again.
    w.platform.restart();
    wait_until(LONG, "the tunnel back after the platform restarted", || ready(&w, &b));
    echo_session(connect(relay, &b.id, 7000, &b.id, &b.credential).1.unwrap(), 5);

    // Stopped: its open stream closes at once, and it answers 404.
    let (_, open) = connect(relay, &b.id, 7000, &b.id, &b.credential);
    let mut open = open.unwrap();
    // Through the admin API: the relay closes its streams now, before the agent hears of it.
    w.stop_rental(&b.id).await;
    open.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    assert_eq!(open.read(&mut buf).unwrap_or(0), 0, "the stream closed");
    assert!(t.elapsed() < Duration::from_secs(5), "at once: {:?}", t.elapsed());
    assert_eq!(connect(relay, &b.id, 7000, &b.id, &b.credential).0, 404);
    assert!(!w.agent_log().contains(&a.credential), "the credential never reaches the agent's log");
}

// ---------------------------------------------------------------------------------------------
// A hostile relay

/// Asks for a new stream in the relay's end of a tunnel.
type OpenStream = tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<yamux::Stream>>;

/// A front for the real platform at `platform` (`127.0.0.1:port`) that passes every request
/// through, byte for byte, except the agent's tunnel upgrade: that one it answers itself (`101`)
/// and hands the connection to the test, which then plays a hostile relay. Returns its URL and
/// where the upgraded connections arrive.
async fn hostile_front(platform: String) -> (String, tokio::sync::mpsc::Receiver<tokio::net::TcpStream>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let (tx, platform) = (tx.clone(), platform.clone());
            tokio::spawn(async move {
                // The first request's head, byte by byte, so that nothing after it is read.
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read(&mut b).await.unwrap_or(0) == 0 || head.len() > 64 * 1024 {
                        return;
                    }
                    head.push(b[0]);
                }
                let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                if text.starts_with(&format!("get {} ", gpum_protocol::PATH_TUNNEL))
                    && text.contains(&format!("upgrade: {}", gpum_protocol::TUNNEL_UPGRADE))
                    && text.contains("authorization: bearer ")
                {
                    let answer = format!(
                        "HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: {}\r\n\r\n",
                        gpum_protocol::TUNNEL_UPGRADE
                    );
                    s.write_all(answer.as_bytes()).await.unwrap();
                    let _ = tx.send(s).await;
                    return;
                }
                let Ok(mut up) = tokio::net::TcpStream::connect(platform.as_str()).await else { return };
                if up.write_all(&head).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
                }
            });
        }
    });
    (url, rx)
}

/// Drives the relay's end (yamux server) of an upgraded tunnel connection; streams are opened
/// through the returned sender.
fn drive_tunnel(io: tokio::net::TcpStream) -> OpenStream {
    use std::task::Poll;
    use tokio_util::compat::TokioAsyncReadCompatExt;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<yamux::Stream>>(8);
    tokio::spawn(async move {
        let mut conn = yamux::Connection::new(io.compat(), yamux::Config::default(), yamux::Mode::Server);
        let mut waiting = std::collections::VecDeque::new();
        std::future::poll_fn(|cx| {
            while let Poll::Ready(Some(r)) = rx.poll_recv(cx) {
                waiting.push_back(r);
            }
            while !waiting.is_empty() {
                match conn.poll_new_outbound(cx) {
                    Poll::Ready(Ok(s)) => {
                        let _ = waiting.pop_front().expect("not empty").send(s);
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            loop {
                match conn.poll_next_inbound(cx) {
                    Poll::Ready(Some(Ok(s))) => drop(s),
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
    });
    tx
}

type AgentStream = tokio::io::BufReader<tokio_util::compat::Compat<yamux::Stream>>;

/// Opens a stream, sends `line` as its first line, and returns the agent's answer line.
async fn ask(tunnel: &OpenStream, line: &str) -> (gpum_protocol::TunnelReply, AgentStream) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    use tokio_util::compat::FuturesAsyncReadCompatExt;
    let (otx, orx) = tokio::sync::oneshot::channel();
    tunnel.send(otx).await.expect("the tunnel is up");
    let s = tokio::time::timeout(Duration::from_secs(10), orx).await.expect("a stream in time").unwrap();
    let mut s = tokio::io::BufReader::new(s.compat());
    s.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    s.flush().await.unwrap();
    let mut reply = String::new();
    tokio::time::timeout(Duration::from_secs(20), s.read_line(&mut reply))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let reply = serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply:?} for {line}: {e}"));
    (reply, s)
}

/// The agent refuses `line` with a reason containing `why`, and nothing else flows.
async fn refused(tunnel: &OpenStream, line: &str, why: &str) {
    use tokio::io::AsyncReadExt;
    let (reply, mut s) = ask(tunnel, line).await;
    assert!(!reply.ok, "{line} was let through");
    let reason = reply.reason.unwrap_or_default();
    assert!(reason.contains(why), "{line}: {reason:?} does not say {why:?}");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{line}: the agent closed the stream, sent {rest:?}");
}

/// A line through an open stream comes back (the rental's echo server).
async fn echoes(s: &mut AgentStream, line: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    s.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    s.flush().await.unwrap();
    let mut back = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_line(&mut back)).await.unwrap().unwrap();
    assert_eq!(back, format!("{line}\n"));
}

#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tunnel_agent_refuses_what_a_hostile_relay_asks() {
    require_docker("tunnel_agent_refuses_what_a_hostile_relay_asks");
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let (front, mut tunnels) = hostile_front(p.url().trim_start_matches("http://").to_string()).await;
    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    // Rentals are created before the agent runs: its first heartbeat reports this machine's own
    // inventory (no GPU), after which nothing new can be rented on the node.
    let mut three = inventory();
    three.private.gpu_uuids.push("GPU-5a1e0000-0000-4000-8000-000000000002".into());
    three.public.gpus.push(three.public.gpus[0].clone());
    let node = rentable_node_with(&p, three).await;
    let mut other_inv = inventory();
    other_inv.private.gpu_uuids = vec!["GPU-5a1e0000-0000-4000-8000-000000000003".into()];
    other_inv.public.gpus.truncate(1);
    let other = rentable_node_with(&p, other_inv).await;
    let a = create_rental(&p, &node.node_id, &image);
    let stopped = create_rental(&p, &node.node_id, &image);
    let elsewhere = create_rental(&p, &other.node_id, &image);
    let exited = create_rental_running(&p, &node.node_id, &image, "exit 3");
    let containers = ScopedContainers::new("h");
    let dir = tempfile::tempdir().unwrap();
    // The agent's platform is the hostile front.
    write_agent_config(dir.path(), &front, &node, &containers.0);
    let agent = start_agent(dir.path(), 3);
    let log = || agent_log(dir.path());
    let running = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(LONG, "both rentals running", || {
            rental_state(&p, &a.id) == "running" && rental_state(&p, &stopped.id) == "running"
        })
    }));
    assert!(running.is_ok(), "{}\nthe agent's log:\n{}", p.cli_json(&["rentals", "show", &a.id]), log());
    // One stopped (its container torn down), one whose container exits at once.
    let r = reqwest::Client::new()
        .post(format!("{}{}", p.url(), gpum_protocol::path_admin_rental_stop(&stopped.id)))
        .bearer_auth(p.admin_token())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let gone = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(LONG, "the stopped rental gone", || rental_state(&p, &stopped.id) == "gone")
    }));
    assert!(
        gone.is_ok(),
        "the stopped rental: {}\nthe agent's log:\n{}",
        p.cli_json(&["rentals", "show", &stopped.id]),
        log()
    );
    wait_until(LONG, "the other rental exited", || rental_state(&p, &exited.id) == "exited");

    // The host listens on a port of its own, on every address (the rentals' gateway included).
    let host = TcpListener::bind("0.0.0.0:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let host_port = host.local_addr().unwrap().port();

    let io = tokio::time::timeout(LONG, tunnels.recv()).await.expect("the agent dials the tunnel").unwrap();
    let tunnel = drive_tunnel(io);
    let open = |rental: &str, port: u16| serde_json::json!({ "rental": rental, "port": port }).to_string();

    // The control: a's listed port, through this relay's end, reaches a's echo server.
    let (reply, mut s) = ask(&tunnel, &open(&a.id, 7000)).await;
    assert!(reply.ok, "{reply:?}");
    echoes(&mut s, "through a hostile relay").await;

    // Another node's rental, one that never was, one stopped, one exited: not run here now.
    for id in [&elsewhere.id, "rent-ffffffffffffffff", &stopped.id, &exited.id] {
        refused(&tunnel, &open(id, 7000), "does not run").await;
    }
    // Ports a does not list: its ssh port, and the host's listener.
    refused(&tunnel, &open(&a.id, 22), "port 22 is not one").await;
    refused(&tunnel, &open(&a.id, host_port), &format!("port {host_port} is not one")).await;
    // Names that are addresses or paths, not rental ids.
    for name in ["127.0.0.1", "172.17.0.1", "localhost", "../rent-00112233445566aa", "rent-"] {
        refused(&tunnel, &open(name, host_port), "not a rental id").await;
    }
    refused(&tunnel, &format!("CONNECT 127.0.0.1:{host_port} HTTP/1.1"), "not a tunnel request").await;
    refused(&tunnel, r#"{"rental":1,"port":22}"#, "not a tunnel request").await;
    // An address in an extra field is not read: the stream reaches a's own container.
    let line = serde_json::json!({
        "rental": a.id, "port": 7000, "host": "127.0.0.1", "address": format!("127.0.0.1:{host_port}"),
    });
    let (reply, mut s2) = ask(&tunnel, &line.to_string()).await;
    assert!(reply.ok, "{reply:?}");
    echoes(&mut s2, "still the container").await;

    // The tunnel survived all of it, and the agent said why each was refused.
    echoes(&mut s, "the first stream still works").await;
    assert!(
        matches!(host.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "nothing reached the host's listener"
    );
    let refusals = log().matches("tunnel: refused a stream").count();
    assert!(refusals >= 13, "{refusals} refusals logged:\n{}", log());
    drop(agent);
}
