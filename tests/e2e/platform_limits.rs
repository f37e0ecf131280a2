//! Issue 29, item 1: what one client can hold of the platform (connections, queued answers,
//! memory).
//!
//! Each test runs the real server on loopback with small bounds given on its command line, and
//! plays the client with raw sockets: one that never reads its answers, one that opens many
//! connections from one address (127.0.0.2 is a second loopback source address), and one that
//! sends large bodies and never finishes them.

use std::time::{Duration, Instant};

use gpum_protocol::PATH_REGISTER;
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

/// A connection to the platform from the loopback address `src` (127.0.0.1, 127.0.0.2, …).
async fn connect_from(src: [u8; 4], port: u16) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind((src, 0).into()).unwrap();
    sock.connect(([127, 0, 0, 1], port).into()).await.unwrap()
}

/// Whether the server closed the connection (EOF or reset) within `within`, reading and
/// dropping whatever it had sent until then.
async fn closed<R: AsyncRead + Unpin>(r: &mut R, within: Duration) -> bool {
    let mut b = vec![0u8; 64 * 1024];
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, r.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// `GET /install.sh` on a fresh connection from `src`; the status line, or what went wrong.
async fn install_sh_from(src: [u8; 4], port: u16) -> String {
    let mut s = connect_from(src, port).await;
    let req = b"GET /install.sh HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    if let Err(e) = s.write_all(req).await {
        return format!("write: {e}");
    }
    let mut buf = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await {
        Err(_) => "no answer within 5 s".into(),
        Ok(Err(e)) => format!("read: {e}"),
        Ok(Ok(_)) => String::from_utf8_lossy(&buf).lines().next().unwrap_or("(closed, no answer)").to_owned(),
    }
}

#[tokio::test]
async fn clients_that_never_read_lose_their_slots_after_the_write_timeout() {
    let dist = tempfile::tempdir().unwrap();
    // Far more than loopback's socket buffers hold, so the answer stalls.
    let file: Vec<u8> = (0..32 * 1024 * 1024).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(dist.path().join("gpum-agent"), &file).unwrap();
    let p = TestPlatform::start(PlatformOpts {
        dist: Some(dist.path().to_owned()),
        // Four slots, all of them taken by clients that never read. The header timeout is long,
        // so that only the write timeout can free them.
        extra_args: args(&["--max-connections", "4", "--write-timeout", "2", "--header-timeout", "60"]),
        ..PlatformOpts::insecure_http()
    });
    let mut hogs = Vec::new();
    let hogs_started = tokio::time::Instant::now();
    for i in 0..4 {
        let s = TcpStream::connect(("127.0.0.1", p.port())).await.unwrap();
        let (r, mut w) = s.into_split();
        // Two ask for a large download; two pipeline 4,000 requests for install.sh.
        let request = if i < 2 {
            "GET /dl/gpum-agent HTTP/1.1\r\nHost: x\r\n\r\n".to_owned()
        } else {
            "GET /install.sh HTTP/1.1\r\nHost: x\r\n\r\n".repeat(4000)
        };
        tokio::spawn(async move {
            let _ = w.write_all(request.as_bytes()).await;
            // Keep the write side open: the client is still "there".
            tokio::time::sleep(Duration::from_secs(120)).await;
            drop(w);
        });
        hogs.push(r);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A well-behaved client is answered once the write timeout has closed the others.
    let started = Instant::now();
    let c = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    let r = c
        .get(format!("{}/install.sh", p.url()))
        .send()
        .await
        .expect("install.sh is answered while four clients that never read hold every slot");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().starts_with("#!/bin/sh"));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "answered {took:?} after asking, with a write timeout of 2 s");
    // Reading would let an answer move again: first let every stall outlast the bound.
    tokio::time::sleep_until(hogs_started + Duration::from_secs(5)).await;
    for (i, h) in hogs.iter_mut().enumerate() {
        assert!(closed(h, Duration::from_secs(10)).await, "never-reading client {i} was kept");
    }
}

#[tokio::test]
async fn a_download_that_keeps_moving_is_served_whole() {
    let dist = tempfile::tempdir().unwrap();
    let file: Vec<u8> = (0..16 * 1024 * 1024).map(|i: u32| (i % 253) as u8).collect();
    std::fs::write(dist.path().join("gpum-agent"), &file).unwrap();
    let p = TestPlatform::start(PlatformOpts {
        dist: Some(dist.path().to_owned()),
        extra_args: args(&["--write-timeout", "1"]),
        ..PlatformOpts::insecure_http()
    });
    // A slow reader: the whole takes several times the write timeout, each pause far less.
    let mut s = TcpStream::connect(("127.0.0.1", p.port())).await.unwrap();
    s.write_all(b"GET /dl/gpum-agent HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut b = vec![0u8; 64 * 1024];
    let mut since_pause = 0;
    loop {
        let n = s.read(&mut b).await.expect("the server does not cut a download that moves");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&b[..n]);
        since_pause += n;
        if since_pause >= 1024 * 1024 {
            since_pause = 0;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    assert!(started.elapsed() > Duration::from_secs(2), "{:?}", started.elapsed());
    let text_end = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got[..text_end]));
    assert!(got[text_end..] == file[..], "got {} of {} bytes", got.len() - text_end, file.len());
}

#[tokio::test]
async fn one_address_holds_at_most_its_share_of_the_connections() {
    let p = TestPlatform::start(PlatformOpts {
        extra_args: args(&[
            "--max-connections",
            "4",
            "--max-connections-per-address",
            "2",
            // Loopback is a terminator's address unless told otherwise; here it is two clients.
            "--terminator-address",
            "none",
            "--header-timeout",
            "60",
        ]),
        ..PlatformOpts::insecure_http()
    });
    // Six idle connections from one address: two are kept, the rest closed at once.
    let mut idle = Vec::new();
    for _ in 0..6 {
        let mut s = connect_from([127, 0, 0, 1], p.port()).await;
        s.write_all(b"GET /install.sh HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
        idle.push(s);
    }
    let mut kept = 0;
    for s in &mut idle {
        if !closed(s, Duration::from_millis(700)).await {
            kept += 1;
        }
    }
    assert_eq!(kept, 2, "connections from 127.0.0.1 kept open with a cap of 2 per address");
    // Another address is served at once, while the first is at its cap.
    let started = Instant::now();
    let line = install_sh_from([127, 0, 0, 2], p.port()).await;
    assert!(line.starts_with("HTTP/1.1 200"), "127.0.0.2: {line}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // The first address still gets nothing more, and is served again once it closes its own.
    let line = install_sh_from([127, 0, 0, 1], p.port()).await;
    assert!(!line.starts_with("HTTP/1.1"), "127.0.0.1 over its cap was answered: {line}");
    drop(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let line = install_sh_from([127, 0, 0, 1], p.port()).await;
    assert!(line.starts_with("HTTP/1.1 200"), "127.0.0.1 after closing its connections: {line}");
}

#[tokio::test]
async fn a_terminator_on_loopback_is_not_capped_per_address() {
    // By default loopback is a terminator's address: every client behind it shares it.
    let p = TestPlatform::start(PlatformOpts {
        extra_args: args(&["--max-connections-per-address", "2", "--header-timeout", "60"]),
        ..PlatformOpts::insecure_http()
    });
    let mut idle = Vec::new();
    for _ in 0..6 {
        let mut s = connect_from([127, 0, 0, 1], p.port()).await;
        s.write_all(b"GET /install.sh HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
        idle.push(s);
    }
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(!closed(s, Duration::from_millis(200)).await, "connection {i} from the terminator closed");
    }
    let line = install_sh_from([127, 0, 0, 1], p.port()).await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
}

#[tokio::test]
async fn large_bodies_that_never_finish_hold_bounded_memory() {
    let p = TestPlatform::start(PlatformOpts {
        extra_args: args(&["--body-timeout", "6"]),
        ..PlatformOpts::insecure_http()
    });
    let pid = p.pid().unwrap();
    let url = format!("{}{PATH_REGISTER}", p.url());
    let c = p.http_client();
    assert_eq!(c.post(&url).body("{}").send().await.unwrap().status(), StatusCode::BAD_REQUEST);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rest = super::rss_kib(pid);

    // 64 connections that each announce 1 MiB (the limit) and send all of it but one byte.
    let head = format!("POST {PATH_REGISTER} HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n");
    let mut readers = Vec::new();
    for _ in 0..64 {
        let s = TcpStream::connect(("127.0.0.1", p.port())).await.unwrap();
        let (r, mut w) = s.into_split();
        let head = head.clone();
        tokio::spawn(async move {
            let _ = w.write_all(head.as_bytes()).await;
            let _ = w.write_all(&vec![b' '; 1024 * 1024 - 1]).await;
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(w);
        });
        readers.push(r);
    }
    let mut peak = rest;
    let sampling = Instant::now();
    let mut small_answered = None;
    while sampling.elapsed() < Duration::from_secs(4) {
        peak = peak.max(super::rss_kib(pid));
        if small_answered.is_none() && sampling.elapsed() > Duration::from_secs(1) {
            // Meanwhile a small body is read at once: it draws on no shared budget.
            let asked = Instant::now();
            let r = c.post(&url).body("{}").send().await.unwrap();
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{}", r.text().await.unwrap_or_default());
            small_answered = Some(asked.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let small = small_answered.unwrap();
    assert!(small < Duration::from_secs(2), "a small body waited {small:?} behind the large ones");
    // Every one of them is answered (408) once the body timeout has passed, including those
    // that waited for the budget.
    for (i, r) in readers.iter_mut().enumerate() {
        let mut head = [0u8; 12];
        let got = tokio::time::timeout(Duration::from_secs(10), r.read_exact(&mut head)).await;
        assert!(matches!(got, Ok(Ok(_))), "connection {i} was not answered");
        assert_eq!(&head, b"HTTP/1.1 408", "connection {i}");
    }
    drop(readers);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = super::rss_kib(pid);
    eprintln!("RSS: {rest} KiB at rest, {peak} KiB at the peak, {after} KiB after");
    // Holding every body whole would take 64 MiB over the resting size; the shared budget is
    // 8 MiB, and each body's own bytes 32 KiB.
    assert!(peak < rest + 40 * 1024, "RSS went from {rest} KiB to {peak} KiB with 64 large bodies");
    assert!(after < rest + 40 * 1024, "RSS stayed at {after} KiB (at rest: {rest} KiB)");
}

/// Issue 43, item 3: what one owner may hold. Before the fix one owner's API key made join codes
/// and registered servers without end (300 in 0.7 s). The operator's limits (`owners limits`,
/// defaults 100 open codes and 1,000 servers) refuse one past either with 409
/// `owner_limit_reached`, and a refused registration does not use its code up.
#[tokio::test]
async fn an_owner_holds_at_most_the_operators_limits_of_codes_and_servers() {
    use gpum_protocol::{
        ErrorCode, JoinCodeCreated, PATH_OWNER_JOIN_CODES, PATH_OWNER_NODES, RegisterResponse,
    };
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let defaults = p.cli_json(&["owners", "limits"]);
    assert_eq!((defaults["open_codes"].as_u64(), defaults["servers"].as_u64()), (Some(100), Some(1000)));
    let set = p.cli_json(&["owners", "limits", "--open-codes", "3", "--servers", "2"]);
    assert_eq!((set["open_codes"].as_u64(), set["servers"].as_u64()), (Some(3), Some(2)));
    let owner = gpum_tests::owner::OwnerSession::accept(
        &p,
        &p.invite_owner("many@example.com"),
        "correct horse battery",
    )
    .await;
    let key = owner.create_api_key("script").await;
    let c = p.http_client();
    let new_code = || async {
        let r = c.post(format!("{}{PATH_OWNER_JOIN_CODES}", p.url())).bearer_auth(&key).send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        let (status, body) = new_code().await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        codes.push(serde_json::from_str::<JoinCodeCreated>(&body).unwrap().code);
    }
    let (status, body) = new_code().await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let e: gpum_protocol::ErrorBody = serde_json::from_str(&body).unwrap();
    assert_eq!(e.error.code, ErrorCode::OwnerLimitReached);
    assert!(e.error.message.contains("3 open join codes"), "{}", e.error.message);
    // The dashboard says so in the owner's language.
    let page = owner.post("/dashboard/add", &[("ttl", "3600")]).await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert!(page.body.contains("id=\"codes-limit\"") && page.body.contains(" 3 "), "{}", page.body);
    // The operator's own codes are not an owner's.
    p.join_code();

    let api = super::Api::new(&p);
    let first: RegisterResponse = api.register(&codes[0], "GPU-lim-0").await.ok();
    let _: RegisterResponse = api.register(&codes[1], "GPU-lim-1").await.ok();
    let refused = api.register(&codes[2], "GPU-lim-2").await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.code(), ErrorCode::OwnerLimitReached);
    // Used codes are not open: a new one may be made, and the refused code still works once a
    // server is deleted.
    assert_eq!(new_code().await.0, StatusCode::CREATED);
    let r = c
        .delete(format!("{}{PATH_OWNER_NODES}/{}", p.url(), first.node_id))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let _: RegisterResponse = api.register(&codes[2], "GPU-lim-2").await.ok();
}

/// Asks for node `token`'s tunnel on a connection of its own; the answer's status code and
/// the connection (kept open: after `101` it is the tunnel).
async fn open_tunnel(port: u16, token: &str) -> (u16, TcpStream) {
    let mut s = connect_from([127, 0, 0, 1], port).await;
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: {}\r\n\r\n",
        gpum_protocol::PATH_TUNNEL,
        gpum_protocol::TUNNEL_UPGRADE
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // The head, byte by byte, so that nothing of the tunnel after it is read.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut b)).await.unwrap().unwrap();
        assert_ne!(n, 0, "closed after {:?}", String::from_utf8_lossy(&head));
        head.push(b[0]);
    }
    let status = String::from_utf8_lossy(&head).split(' ').nth(1).unwrap().parse().unwrap();
    (status, s)
}

/// Issue 43, item 3: agents' tunnels have a cap of their own, sized from the file limit. Before
/// the fix an upgraded connection left its slot behind: with `ulimit -n 300` one owner's 283
/// tunnels took every descriptor, the admin API timed out and `accept` failed thousands of
/// times. Under `ulimit -n 160` a quarter of what is left past the reserve (24) get `101`, the
/// next are refused 429 before any upgrade, the API keeps answering, and a closed tunnel makes
/// room for another.
#[tokio::test]
async fn tunnels_have_a_cap_of_their_own_below_the_file_limit() {
    use gpum_protocol::{PATH_ADMIN_NODES, RegisterResponse};
    let p = TestPlatform::start(PlatformOpts { nofile_limit: Some(160), ..PlatformOpts::insecure_http() });
    let api = super::Api::new(&p);
    let mut tokens = Vec::new();
    for i in 0..40 {
        let r: RegisterResponse = api.register(&p.join_code(), &format!("GPU-tun-{i}")).await.ok();
        tokens.push(r.node_token);
    }
    let mut tunnels = Vec::new();
    let mut statuses = Vec::new();
    for t in &tokens {
        let (status, s) = open_tunnel(p.port(), t).await;
        statuses.push(status);
        if status == 101 {
            tunnels.push(s);
        }
    }
    let upgraded = statuses.iter().filter(|s| **s == 101).count();
    assert_eq!(upgraded, 24, "{statuses:?}");
    assert!(statuses[24..].iter().all(|s| *s == 429), "{statuses:?}");
    // The API answers the operator meanwhile.
    let r = p.http_client().get(format!("{}{PATH_ADMIN_NODES}", p.url())).bearer_auth(p.admin_token());
    assert_eq!(r.send().await.unwrap().status(), StatusCode::OK);
    // A tunnel that closes makes room for another.
    drop(tunnels.pop());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, s) = open_tunnel(p.port(), &tokens[30]).await;
        if status == 101 {
            tunnels.push(s);
            break;
        }
        assert!(Instant::now() < deadline, "no room after a tunnel closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(p.log().contains("tunnel refused: the platform holds its limit of tunnels"));
}
