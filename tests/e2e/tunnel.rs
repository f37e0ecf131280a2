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
//! And the tunnel's keepalive and its way out: through a forwarder the test cuts for longer than
//! every timeout (the relay drops the dead tunnel, the tenant's stream closes, the tunnel comes
//! back by itself once the network heals), and through a real HTTP proxy (`tinyproxy`, with
//! Basic authentication and an idle timeout shorter than the test's quiet time).
//!
//! The setup (platform, node, rentals, agent, `CONNECT`) is `gpum_tests::tunnel`, shared with
//! the suites that build on it.
#![allow(clippy::disallowed_methods)]

mod tunnel_http;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};
use gpum_tests::require_docker;
use gpum_tests::tunnel::{
    LONG, ScopedContainers, TunnelWorld, agent_log, connect, create_rental, create_rental_running,
    echo_session, free_port, inventory, rentable_node, rentable_node_with, rental_state, start_agent,
    start_agent_env, write_agent_config_with,
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
    // The agent's platform is the hostile front. This relay sends no keepalive pings: the
    // agent is told to wait for them longer than the test takes.
    let extra = "test_tunnel_silence_ms = 3600000\n";
    write_agent_config_with(dir.path(), &front, &node, &containers.0, extra);
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

// ---------------------------------------------------------------------------------------------
// Keepalive, network cuts, proxies

/// A loopback TCP forwarder to `to` that the test can cut like a network: while cut, and for
/// ever after on the connections that saw the cut (as a NAT that lost their state), bytes stop
/// moving and nothing is closed; connections made after the cut heals work again.
struct Forwarder {
    port: u16,
    cutting: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Forwarder {
    async fn start(to: std::net::SocketAddr) -> Forwarder {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let cutting = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let (c, n) = (cutting.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((down, _)) = l.accept().await {
                let (cutting, cuts) = (c.clone(), n.clone());
                tokio::spawn(async move {
                    let born = cuts.load(Ordering::SeqCst);
                    let dead = move || cutting.load(Ordering::SeqCst) || cuts.load(Ordering::SeqCst) != born;
                    if dead() {
                        // Accepted by the kernel, then nothing: a dial into a cut network.
                        let _held = down;
                        return std::future::pending::<()>().await;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(to).await else { return };
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    let one_way = |mut r: tokio::net::tcp::OwnedReadHalf,
                                   mut w: tokio::net::tcp::OwnedWriteHalf,
                                   dead: Box<dyn Fn() -> bool + Send>| async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match r.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if dead() {
                                // Bytes vanish; both sockets stay open, nothing more is read.
                                let _held = (r, w);
                                return std::future::pending::<()>().await;
                            }
                            if w.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = w.shutdown().await;
                    };
                    let d2 = dead.clone();
                    tokio::join!(one_way(dr, uw, Box::new(dead)), one_way(ur, dw, Box::new(d2)));
                });
            }
        });
        Forwarder { port, cutting, cuts }
    }

    fn cut(&self) {
        self.cuts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.cutting.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn heal(&self) {
        self.cutting.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 34's "survives a network cut longer than the idle timeout": the agent reaches the
/// platform through a forwarder the test cuts (no byte moves, nothing is closed) for longer
/// than the relay's stream idle timeout, its ping timeout and the agent's silence bound. The
/// relay drops the dead tunnel (a tenant gets 502, not a hang) and the tenant's open stream is
/// closed; the agent notices the silence and dials again; once the network heals, the tunnel
/// comes back by itself and a new tenant connection works within a bounded time.
#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tunnel_comes_back_after_a_network_cut_longer_than_its_timeouts() {
    require_docker("tunnel_comes_back_after_a_network_cut_longer_than_its_timeouts");
    let relay = free_port();
    // Pings every second, each answered within a second; streams idle 2 s are closed.
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec![
            "--relay-listen".into(),
            format!("127.0.0.1:{relay}"),
            "--relay-idle-timeout".into(),
            "2".into(),
            "--test-relay-ping-ms".into(),
            "1000".into(),
        ],
        ..PlatformOpts::insecure_http()
    });
    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    let node = rentable_node(&p).await;
    let a = create_rental(&p, &node.node_id, &image);
    let containers = ScopedContainers::new("c");
    let fwd = Forwarder::start(format!("127.0.0.1:{}", p.port()).parse().unwrap()).await;
    let dir = tempfile::tempdir().unwrap();
    // The agent hears from the relay every second; 3 s of silence and it drops the tunnel.
    let server = format!("http://127.0.0.1:{}", fwd.port);
    write_agent_config_with(dir.path(), &server, &node, &containers.0, "test_tunnel_silence_ms = 3000\n");
    let agent = start_agent_env(dir.path(), 2, &[]);
    let log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let ready =
        || tokio::task::block_in_place(|| connect(relay, &a.id, 7000, &a.id, &a.credential).1.is_some());
    let t = Instant::now();
    while !ready() {
        assert!(t.elapsed() < LONG, "no tunnel; agent log:\n{}\nplatform log:\n{}", log(), p.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let opened = log().matches("tunnel open").count();
    let (st, s) = tokio::task::block_in_place(|| connect(relay, &a.id, 7000, &a.id, &a.credential));
    assert_eq!(st, 200);
    let mut s = s.unwrap();
    tokio::task::block_in_place(|| echo_session(s.try_clone().unwrap(), 3));

    fwd.cut();
    let cut_at = Instant::now();
    // The relay hears no answer to its ping: it drops the tunnel, and a tenant gets 502 at
    // once instead of a stream into a dead connection.
    let status = || tokio::task::block_in_place(|| connect(relay, &a.id, 7000, &a.id, &a.credential).0);
    while status() != 502 {
        assert!(
            cut_at.elapsed() < Duration::from_secs(20),
            "the relay kept a dead tunnel; platform log:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dropped = cut_at.elapsed();
    // The tenant's open stream is closed, not left hanging.
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 16];
    let r = tokio::task::block_in_place(|| s.read(&mut buf));
    assert!(
        matches!(&r, Ok(0))
            || matches!(&r, Err(e) if !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the old stream still hangs: {r:?}"
    );
    // The cut lasts well past the relay's idle timeout (2 s), its ping timeout (1 s) and the
    // agent's silence bound (3 s); the agent dropped its end on its own.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(cut_at.elapsed())).await;
    assert!(
        log().contains("no stream from the platform within the keepalive"),
        "the agent did not notice the silence; its log:\n{}",
        log()
    );
    fwd.heal();
    let healed = Instant::now();
    while !ready() {
        assert!(
            healed.elapsed() < Duration::from_secs(45),
            "the tunnel did not come back; agent log:\n{}\nplatform log:\n{}",
            log(),
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back = healed.elapsed();
    let (st, s) = tokio::task::block_in_place(|| connect(relay, &a.id, 7000, &a.id, &a.credential));
    assert_eq!(st, 200);
    tokio::task::block_in_place(|| echo_session(s.unwrap(), 5));
    assert!(log().matches("tunnel open").count() > opened, "a new tunnel, dialled by the agent");
    eprintln!(
        "the relay dropped the dead tunnel {dropped:?} into the cut; the tunnel was back {back:?} after it healed"
    );
    drop(agent);
}

/// A tenant's `CONNECT` at a relay that speaks TLS (the platform's certificate, trusted through
/// its CA): the status, and the connection when it is 200.
async fn connect_tls(
    relay: u16,
    ca_pem: &str,
    rental: &str,
    port: u16,
    credential: &str,
) -> (u16, Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = gpum_host::http::tls_config(&[ca_pem.as_bytes().to_vec()]).unwrap();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", relay)).await.unwrap();
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut s = connector.connect(name, tcp).await.expect("TLS to the relay");
    let target = format!("rental-{}:{port}", rental.strip_prefix("rent-").unwrap());
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{rental}:{credential}"));
    let req =
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {auth}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(20), s.read(&mut b)).await {
            Ok(Ok(1)) => head.push(b[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, (status == 200).then_some(s))
}

/// The ssh-like session of [`echo_session`], over any async stream.
async fn echo_session_async<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: S, rounds: usize) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut s = tokio::io::BufReader::new(s);
    for i in 0..rounds {
        let line = format!("round {i} через прокси\n");
        s.write_all(line.as_bytes()).await.unwrap();
        s.flush().await.unwrap();
        let mut back = String::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_line(&mut back)).await.unwrap().unwrap();
        assert_eq!(back, line, "round {i}");
    }
}

/// A real HTTP proxy (Debian's `tinyproxy`, tests/setup-deps.sh) on loopback, with Basic
/// authentication and an idle timeout of `idle_secs`. Killed when dropped.
struct Tinyproxy {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Tinyproxy {
    fn start(dir: &std::path::Path, user: &str, password: &str, idle_secs: u32) -> Tinyproxy {
        let port = free_port();
        let conf = dir.join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout {idle_secs}\nMaxClients 64\nLogLevel Info\n\
                 PidFile \"{}\"\nBasicAuth {user} {password}\n",
                dir.join("tinyproxy.pid").display()
            ),
        )
        .unwrap();
        let log = dir.join("tinyproxy.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("tinyproxy")
            .args(["-d", "-c"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("tinyproxy (tests/setup-deps.sh installs it)");
        let proxy = Tinyproxy { child, port, log };
        wait_until(Duration::from_secs(10), "tinyproxy listening", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        proxy
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 34, behind a proxy: where `HTTPS_PROXY` names an HTTP proxy (a real `tinyproxy` with
/// Basic authentication), the agent's tunnel goes through it (`CONNECT`, TLS to the platform
/// inside, then the upgrade) and carries a tenant's session; the proxy's idle timeout (3 s)
/// does not cut it, since the keepalive moves bytes every second. With a wrong proxy password
/// the proxy refuses `CONNECT`, and the tunnel's client says so, naming the proxy and its answer.
/// The proxy's credentials never reach the agent's log or an error.
#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tunnel_goes_through_the_agents_http_proxy() {
    require_docker("tunnel_goes_through_the_agents_http_proxy");
    let relay = free_port();
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec![
            "--relay-listen".into(),
            format!("127.0.0.1:{relay}"),
            "--test-relay-ping-ms".into(),
            "1000".into(),
        ],
        ..PlatformOpts::default()
    });
    let ca = p.ca_pem().expect("a TLS platform").to_string();
    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    let node = rentable_node(&p).await;
    let a = create_rental(&p, &node.node_id, &image);
    let containers = ScopedContainers::new("x");
    let dir = tempfile::tempdir().unwrap();
    let (user, good, bad) = ("gpum-owner", "Pr0xy-h2-good-4471", "Pr0xy-h2-bad-9902");
    let proxy = Tinyproxy::start(dir.path(), user, good, 3);
    let ca_file = p.ca_path().unwrap();
    let extra = format!("ca_file = '{}'\ntest_tunnel_silence_ms = 3000\n", ca_file.display());
    write_agent_config_with(dir.path(), p.url(), &node, &containers.0, &extra);
    let log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    let via =
        |password: &str| vec![("HTTPS_PROXY", format!("http://{user}:{password}@127.0.0.1:{}", proxy.port))];

    // The wrong password: the proxy refuses CONNECT, and the tunnel's client (the agent's own,
    // as its run loop uses it: the loop logs the error and dials again with backoff) names the
    // proxy and its answer, never the credentials.
    let opts = gpum_host::http::ClientOptions {
        extra_roots_pem: vec![ca.as_bytes().to_vec()],
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let client =
        gpum_host::http::PostClient::new(&format!("{}{}", p.url(), gpum_protocol::PATH_TUNNEL), &opts)
            .unwrap()
            .through_proxy(&format!("http://{user}:{bad}@127.0.0.1:{}", proxy.port))
            .unwrap();
    let refused = match client.upgrade(gpum_protocol::TUNNEL_UPGRADE, &node.node_token, 1024).await {
        Err(gpum_host::http::PostError::Transport(e)) => e,
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("the proxy let a wrong password through"),
    };
    // tinyproxy answers a wrong password 401 (others 407).
    let said = format!("the proxy 127.0.0.1:{} refused CONNECT 127.0.0.1:{}: ", proxy.port, p.port());
    assert!(refused.contains(&format!("{said}401")) || refused.contains(&format!("{said}407")), "{refused}");
    assert!(!refused.contains(bad), "{refused}");

    // The right one: the tunnel goes through the proxy and carries a session.
    let agent = start_agent_env(dir.path(), 2, &via(good));
    let t = Instant::now();
    let stream = loop {
        if let (200, Some(s)) = connect_tls(relay, &ca, &a.id, 7000, &a.credential).await {
            break s;
        }
        assert!(t.elapsed() < LONG, "no tunnel; agent log:\n{}\nproxy log:\n{}", log(), proxy.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    echo_session_async(stream, 20).await;
    assert!(
        log().contains(&format!("127.0.0.1:{}", proxy.port)),
        "the agent names the proxy it goes through"
    );
    let opened = log().matches("tunnel open").count();
    // Quiet for twice the proxy's idle timeout: the keepalive holds the same tunnel open.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (st, s) = connect_tls(relay, &ca, &a.id, 7000, &a.credential).await;
    assert_eq!(st, 200);
    echo_session_async(s.unwrap(), 3).await;
    assert_eq!(log().matches("tunnel open").count(), opened, "the same tunnel, not a new one:\n{}", log());
    let connects = proxy.log().matches(&format!("CONNECT 127.0.0.1:{}", p.port())).count();
    assert!(connects >= 1, "the proxy carried the tunnel; its log:\n{}", proxy.log());
    // The proxy goes away: so does the tunnel (it went through the proxy, not around it), and
    // the agent cannot dial it again until the proxy is back.
    drop(proxy);
    let t = Instant::now();
    while connect_tls(relay, &ca, &a.id, 7000, &a.credential).await.0 != 502 {
        assert!(t.elapsed() < Duration::from_secs(20), "the tunnel outlived its proxy:\n{}", log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for secret in [good, bad] {
        assert!(!log().contains(secret), "a proxy password reached the agent's log");
    }
    drop(agent);
}
