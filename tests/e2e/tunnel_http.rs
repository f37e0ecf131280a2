//! The relay's HTTP door (`serve --relay-http-listen --relay-domain`), over the real relay, the
//! real agent and a rental's container on the real engine: HTTP requests by host name reach the
//! container's ports (busybox `httpd`, and a shell server on 8081 that answers with the request
//! head it got, or `101` then `cat` for an upgrade); bodies larger than every buffer arrive
//! intact both ways; wrong, other rental's and missing credentials are 401 with a Basic
//! challenge (and soon 429, counted like the TCP door's); an unlisted port is 403, a listed one
//! that does not speak HTTP 502; the credential never reaches the container; an upgraded
//! connection flows; stopping the rental closes its open connections and its host name answers
//! 404.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::StreamExt;
use gpum_tests::platform::{PlatformOpts, RELAY_TEST_DOMAIN, TestPlatform};
use gpum_tests::require_docker;
use gpum_tests::tunnel::{
    LONG, Rental, SERVERS, ScopedContainers, TunnelWorld, create_rental_with_ports, free_port, rentable_node,
    start_agent, write_agent_config,
};
use sha2::{Digest, Sha256};

const DOMAIN: &str = "relay.test";

/// The shell server of port 8081 (busybox `nc -ll -e`): the request head back as the body, or
/// for an `Upgrade` a `101` and then every byte back.
const ECHO_SH: &str = r#"#!/bin/sh
h=""
while IFS= read -r l; do
  l=$(printf '%s' "$l" | tr -d '\r')
  [ -z "$l" ] && break
  h="$h$l
"
done
case "$h" in
  *[Uu]pgrade:*) printf 'HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n'; exec cat;;
esac
printf 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' "${#h}" "$h"
"#;

/// A CGI program of `httpd`: the SHA-256 of the request body.
const SUM_CGI: &str = "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\nhead -c \"$CONTENT_LENGTH\" | sha256sum | cut -d' ' -f1\n";

/// 3 MB: far past the relay's 16 KiB copy buffer, hyper's buffers and yamux's 256 KiB window.
const BIG: usize = 3_000_000;

fn script() -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "mkdir -p /www/cgi-bin && head -c {BIG} /dev/urandom > /www/big && \
         sha256sum /www/big | cut -d' ' -f1 > /www/big.sha256 && \
         echo {} | base64 -d > /www/cgi-bin/sum && echo {} | base64 -d > /echo.sh && \
         chmod +x /www/cgi-bin/sum /echo.sh && (nc -ll -p 8081 -e /echo.sh &) && {SERVERS}",
        b64(SUM_CGI),
        b64(ECHO_SH)
    )
}

/// The host name of rental `r`'s `port`.
fn host(r: &Rental, port: u16) -> String {
    format!("{}-{port}.{DOMAIN}", r.id.strip_prefix("rent-").unwrap())
}

/// A client that reaches `host`'s names at the door on loopback port `door`.
fn client(door: u16, hosts: &[String]) -> reqwest::Client {
    let mut c = reqwest::Client::builder().timeout(Duration::from_secs(60));
    for h in hosts {
        c = c.resolve(h, ([127, 0, 0, 1], door).into());
    }
    c.build().unwrap()
}

/// One request's head and body over a raw connection (`Connection: close`).
fn raw(door: u16, request: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", door)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread")]
async fn tunnel_http_door_reaches_a_rentals_web_ports_by_host_name() {
    require_docker("tunnel_http_door_reaches_a_rentals_web_ports_by_host_name");
    let door = free_port();
    let args = vec![
        "--relay-http-listen".to_string(),
        format!("127.0.0.1:{door}"),
        "--relay-domain".to_string(),
        DOMAIN.to_string(),
    ];
    let w = TunnelWorld::start_with(args, &[7000, 8080, 8081], &script()).await;
    let (a, b) = (w.a.clone(), w.b.clone());
    let hosts: Vec<String> =
        [&a, &b].iter().flat_map(|r| [host(r, 8080), host(r, 8081), host(r, 7000), host(r, 22)]).collect();
    let c = client(door, &hosts);
    let url = |r: &Rental, port: u16, path: &str| format!("http://{}:{door}{path}", host(r, port));

    // A page, with the credential as HTTP Basic.
    let r = c.get(url(&a, 8080, "/index.html")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello-from-rental\n");

    // A download larger than every buffer on the way, hashed as it streams in.
    let want =
        c.get(url(&a, 8080, "/big.sha256")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    let want = want.text().await.unwrap().trim().to_string();
    let t = Instant::now();
    let r = c.get(url(&a, 8080, "/big")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (mut h, mut n, mut body) = (Sha256::new(), 0usize, r.bytes_stream());
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        n += chunk.len();
        h.update(&chunk);
    }
    assert_eq!(n, BIG);
    assert_eq!(hex::encode(h.finalize()), want, "the download arrived intact");
    eprintln!("{BIG} bytes down through the HTTP door (debug build) in {:?}", t.elapsed());

    // An upload as large, which the container hashes.
    let upload: Vec<u8> = (0..BIG).map(|i| (i * 7 + i / 4096) as u8).collect();
    let sent = hex::encode(Sha256::digest(&upload));
    let r = c
        .post(url(&a, 8080, "/cgi-bin/sum"))
        .basic_auth(&a.id, Some(&a.credential))
        .body(upload)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap().trim(), sent, "the upload arrived intact");

    // What the container sees: the host name kept, and no credential.
    let r = c.get(url(&a, 8081, "/seen")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let seen = r.text().await.unwrap().to_ascii_lowercase();
    assert!(seen.starts_with("get /seen http/1.1\n"), "{seen}");
    assert!(seen.contains(&format!("host: {}:{door}\n", host(&a, 8081))), "{seen}");
    assert!(seen.contains(&format!("x-forwarded-host: {}:{door}\n", host(&a, 8081))), "{seen}");
    assert!(!seen.contains("authorization"), "the credential was stripped: {seen}");
    assert!(!seen.contains(&a.credential.to_ascii_lowercase()), "{seen}");
    // In X-Gpum-Credential, the application's own Authorization passes, the credential does not.
    let r = c
        .get(url(&a, 8081, "/app"))
        .header("X-Gpum-Credential", &a.credential)
        .bearer_auth("the-apps-own-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = r.text().await.unwrap().to_ascii_lowercase();
    assert!(seen.contains("authorization: bearer the-apps-own-token\n"), "{seen}");
    assert!(!seen.contains(&a.credential.to_ascii_lowercase()) && !seen.contains("x-gpum"), "{seen}");
    // Issue 43, item 7: the credential in both X-Gpum-Credential and Authorization: Basic, and
    // a copy in a header of the tenant's own: none of them reaches the container.
    let r = c
        .get(url(&a, 8081, "/both"))
        .header("X-Gpum-Credential", &a.credential)
        .basic_auth(&a.id, Some(&a.credential))
        .header("X-Copy", format!("k={}", a.credential))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = r.text().await.unwrap().to_ascii_lowercase();
    assert!(seen.starts_with("get /both http/1.1\n"), "{seen}");
    assert!(!seen.contains("authorization") && !seen.contains("x-copy"), "{seen}");
    assert!(!seen.contains(&a.credential.to_ascii_lowercase()) && !seen.contains("x-gpum"), "{seen}");

    // Wrong credentials: 401 with a challenge a browser answers; a listed port only.
    let r = c.get(url(&a, 8080, "/")).send().await.unwrap();
    assert_eq!(r.status(), 401, "no credential");
    assert_eq!(r.headers()["www-authenticate"], "Basic realm=\"gpum\"");
    let r = c.get(url(&a, 8080, "/")).basic_auth(&a.id, Some(&b.credential)).send().await.unwrap();
    assert_eq!(r.status(), 401, "another rental's credential");
    let r = c.get(url(&a, 8080, "/")).basic_auth(&b.id, Some(&b.credential)).send().await.unwrap();
    assert_eq!(r.status(), 401, "another rental's id and credential");
    let r = c.get(url(&a, 8080, "/")).basic_auth(&a.id, Some("gpumt_0000")).send().await.unwrap();
    assert_eq!(r.status(), 401, "a wrong credential");
    let r = c.get(url(&a, 22, "/")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 403, "a port the rental does not list");
    let r = c.get(url(&a, 7000, "/")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 502, "a listed port that does not speak HTTP (the line echo server)");
    let r = raw(door, "GET / HTTP/1.1\r\nHost: elsewhere.example\r\nConnection: close\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");

    // b's servers start after its 3 MB file is written: wait for them.
    let t = Instant::now();
    while !c
        .get(url(&b, 8080, "/"))
        .basic_auth(&b.id, Some(&b.credential))
        .send()
        .await
        .is_ok_and(|r| r.status() != 502)
    {
        assert!(t.elapsed() < LONG, "b's web server never answered");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // An upgrade (a WebSocket's handshake, in shape): after the 101 the bytes flow both ways.
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", b.id, b.credential));
    let upgraded = || {
        let mut s = TcpStream::connect(("127.0.0.1", door)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET /ws HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic {auth}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
            host(&b, 8081)
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut byte).unwrap(), 1, "{}", String::from_utf8_lossy(&head));
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_string();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        s
    };
    let mut s = upgraded();
    for i in 0..20 {
        let line = format!("frame {i}\n");
        s.write_all(line.as_bytes()).unwrap();
        let mut back = vec![0u8; line.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, line.as_bytes());
    }

    // Stopped: its open connections close at once, and its names answer 404.
    let mut kept = TcpStream::connect(("127.0.0.1", door)).unwrap();
    write!(
        kept,
        "GET /index.html HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic {auth}\r\n\r\n",
        host(&b, 8080)
    )
    .unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200", "a kept-alive connection to b");
    w.stop_rental(&b.id).await;
    let t = Instant::now();
    let mut rest = Vec::new();
    let _ = kept.read_to_end(&mut rest);
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "the upgraded connection closed");
    assert!(t.elapsed() < Duration::from_secs(5), "at once: {:?}", t.elapsed());
    // A new client: stopping b closed its kept-alive connections, the pool's included, and the
    // pool could hand one of those out before it saw it closed (a CI run did: IncompleteMessage).
    let c = client(door, &hosts);
    let r = c.get(url(&b, 8080, "/")).basic_auth(&b.id, Some(&b.credential)).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // a still answers.
    let r = c.get(url(&a, 8080, "/index.html")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(!w.agent_log().contains(&a.credential), "the credential never reaches the agent's log");
    assert!(!w.platform.log().contains(&a.credential), "nor the platform's");

    // Wrong credentials count against the address like the TCP door's: soon 429.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let r = c.get(url(&a, 8080, "/")).basic_auth(&a.id, Some("gpumt_0000")).send().await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses[0], 401, "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    let r = c.get(url(&a, 8080, "/index.html")).basic_auth(&a.id, Some(&a.credential)).send().await.unwrap();
    assert_eq!(r.status(), 429, "while blocked, even the right credential waits");
}

/// The HTTP door with TLS of its own (the platform's certificate, which covers
/// `*.relay.localhost`): a request by host name over HTTPS reaches the container, which is told
/// `X-Forwarded-Proto: https`; the agent's tunnel goes over the API's TLS as usual.
#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread")]
async fn tunnel_http_door_serves_tls_with_the_platforms_certificate() {
    require_docker("tunnel_http_door_serves_tls_with_the_platforms_certificate");
    let door = free_port();
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec![
            "--relay-http-listen".into(),
            format!("127.0.0.1:{door}"),
            "--relay-domain".into(),
            RELAY_TEST_DOMAIN.into(),
        ],
        ..Default::default()
    });
    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    let node = rentable_node(&p).await;
    let r = create_rental_with_ports(&p, &node.node_id, &image, &[8080, 8081], &script());
    let containers = ScopedContainers::new("t");
    let dir = tempfile::tempdir().unwrap();
    write_agent_config(dir.path(), p.url(), &node, &containers.0);
    let ca = p.ca_path().expect("a TLS platform has a CA");
    let mut config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
    config.push_str(&format!("ca_file = '{}'\n", ca.display()));
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let _agent = start_agent(dir.path(), 2);
    let name = |port: u16| format!("{}-{port}.{RELAY_TEST_DOMAIN}", r.id.strip_prefix("rent-").unwrap());
    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(p.ca_pem().unwrap().as_bytes()).unwrap())
        .resolve(&name(8080), ([127, 0, 0, 1], door).into())
        .resolve(&name(8081), ([127, 0, 0, 1], door).into())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let get = |port: u16, path: &'static str| {
        c.get(format!("https://{}:{door}{path}", name(port))).basic_auth(&r.id, Some(&r.credential)).send()
    };
    // Until the rental runs and the tunnel is up: 502 (no tunnel) or 404/connection errors.
    let t = Instant::now();
    loop {
        match get(8080, "/index.html").await {
            Ok(resp) if resp.status() == 200 => {
                assert_eq!(resp.text().await.unwrap(), "hello-from-rental\n");
                break;
            }
            other => assert!(
                t.elapsed() < LONG,
                "no answer through the TLS door: {other:?}\nplatform log:\n{}",
                p.log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let seen = get(8081, "/seen").await.unwrap().text().await.unwrap().to_ascii_lowercase();
    assert!(seen.contains("x-forwarded-proto: https\n"), "{seen}");
    assert!(!seen.contains("authorization"), "{seen}");
    // Plain HTTP at the TLS door gets nowhere.
    let plain = raw(door, &format!("GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", name(8080)));
    assert!(!plain.contains("hello-from-rental") && !plain.starts_with("HTTP/1.1 2"), "{plain}");
}

/// The TCP door's limits hold on the HTTP door: a rental's stream cap (`503`), its byte rate,
/// and the idle timeout, which closes an upgraded connection that carries nothing and gives its
/// stream back.
#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread")]
async fn tunnel_http_door_keeps_the_relays_limits() {
    require_docker("tunnel_http_door_keeps_the_relays_limits");
    let door = free_port();
    let args: Vec<String> = [
        "--relay-http-listen",
        &format!("127.0.0.1:{door}"),
        "--relay-domain",
        DOMAIN,
        "--relay-max-streams",
        "1",
        "--relay-idle-timeout",
        "3",
        "--relay-rate",
        "1000000",
    ]
    .map(String::from)
    .to_vec();
    let w = TunnelWorld::start_with(args, &[7000, 8080, 8081], &script()).await;
    let b = w.b.clone();
    let hosts = [host(&b, 8080), host(&b, 8081)];
    let c = client(door, &hosts);
    let url = |port: u16, path: &str| format!("http://{}:{door}{path}", host(&b, port));
    let get = |path: &'static str| c.get(url(8080, path)).basic_auth(&b.id, Some(&b.credential)).send();

    // b's servers start after its 3 MB file is written: wait for them.
    let t = Instant::now();
    while !get("/index.html").await.is_ok_and(|r| r.status() == 200) {
        assert!(t.elapsed() < LONG, "b's web server never answered");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // 3 MB at 1 MB/s, with a second's burst: about two seconds, less the last read's debt that
    // nothing waits off (hyper reads up to a few hundred KiB at once); unpaced, it takes a
    // fraction of a second. On the same kept-alive connection, under the same slot, although
    // httpd closes its side after each answer.
    // A connection of the wait above that the relay has answered and is closing may still hold
    // the rental's only stream for a moment (it is given back when that connection ends): a 503
    // then is waited out, as the wait above waits out the servers' start.
    let waited = Instant::now();
    let took = loop {
        let t = Instant::now();
        let r = get("/big").await.unwrap();
        if r.status() == 503 && waited.elapsed() < LONG {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        }
        assert_eq!(r.status(), 200);
        assert_eq!(r.bytes().await.unwrap().len(), BIG);
        break t.elapsed();
    };
    assert!(took >= Duration::from_millis(1200), "the rate was not applied: {took:?}");
    // Its connection closed, its slot is free again.
    drop(c);

    // One upgraded connection holds the rental's only stream: another request is 503.
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", b.id, b.credential));
    let t = Instant::now();
    let mut s = loop {
        let mut s = TcpStream::connect(("127.0.0.1", door)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "GET /ws HTTP/1.1\r\nHost: {}\r\nAuthorization: Basic {auth}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
            host(&b, 8081)
        )
        .unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        if &head == b"HTTP/1.1 101" {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{}", String::from_utf8_lossy(&head));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let fresh = client(door, &hosts);
    let r = fresh.get(url(8080, "/index.html")).basic_auth(&b.id, Some(&b.credential)).send().await.unwrap();
    assert_eq!(r.status(), 503, "past the stream cap");

    // Nothing moves for the idle timeout: the upgraded connection is closed and its stream freed.
    let t = Instant::now();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let idle = t.elapsed();
    assert!(idle >= Duration::from_secs(2) && idle < Duration::from_secs(10), "closed after {idle:?}");
    // (A new client: the idle timeout closed the other's kept-alive connection too.)
    let r = client(door, &hosts)
        .get(url(8080, "/index.html"))
        .basic_auth(&b.id, Some(&b.credential))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the stream came back");
}

/// The tenant's page of [`tenant_pages_cannot_plant_a_cookie_the_dashboard_reads`]: it sets every
/// cookie a script on another host of the site could try for the dashboard (its names with
/// `Domain` set to the site and to the dashboard's host, the `__Host-` names with and without a
/// `Domain`), then signs the browser in as the attacker by a same-site POST whose form key is
/// the one it planted (sign-in CSRF).
fn planting_page(cabinet: &str, attacker: &str, password: &str) -> String {
    format!(
        r#"<!doctype html><html><head><title>tenant</title></head><body>
<form id="f" method="post" action="{cabinet}/dashboard/login">
<input name="csrf" value="planted"><input name="email" value="{attacker}">
<input name="password" value="{password}"><input name="code" value=""></form>
<script>
[
  "gpum_login=planted; Domain=example.com; Path=/; Secure",
  "gpum_session=planted; Domain=example.com; Path=/; Secure",
  "gpum_login=planted; Domain=gpum.example.com; Path=/; Secure",
  "__Host-gpum_login=planted; Domain=example.com; Path=/; Secure",
  "__Host-gpum_login=planted; Domain=gpum.example.com; Path=/; Secure",
  "__Host-gpum_session=planted; Domain=example.com; Path=/; Secure",
  "__Host-gpum_login=planted; Path=/; Secure",
  "__Host-gpum_lang=ru; Domain=example.com; Path=/; Secure"
].forEach(function (c) {{ document.cookie = c; }});
document.getElementById("f").submit();
</script></body></html>"#
    )
}

/// Issue 43: with the documented layout (the dashboard at `gpum.example.com`, tenants' pages
/// under `*.relay.gpum.example.com`, which `serve` now refuses unless told so) a tenant's page is
/// same-site with the dashboard. In real Chromium, a page served through the HTTP door (over
/// TLS) plants cookies for the whole site (the control: they do arrive at the dashboard's host)
/// and posts a sign-in as the attacker with the form key it planted (with the old cookie names
/// this signed the victim's browser in to the attacker's account); the dashboard reads only its
/// `__Host-` cookies, which no other host can set: the sign-in is refused as a stale form, no
/// session starts, and the dashboard's form key is its own.
#[ignore = "needs a Docker engine, chromium and chromedriver"]
#[tokio::test(flavor = "multi_thread")]
async fn tenant_pages_cannot_plant_a_cookie_the_dashboard_reads() {
    use gpum_platform::web::{LOGIN_COOKIE, SESSION_COOKIE};
    use gpum_tests::platform::{SITE_RELAY_DOMAIN, SITE_TEST_HOST};
    require_docker("tenant_pages_cannot_plant_a_cookie_the_dashboard_reads");
    let door = free_port();
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec![
            "--relay-http-listen".into(),
            format!("127.0.0.1:{door}"),
            "--relay-domain".into(),
            SITE_RELAY_DOMAIN.into(),
            "--public-url".into(),
            format!("https://{SITE_TEST_HOST}"),
            "--allow-same-site-relay-domain".into(),
        ],
        ..Default::default()
    });
    let cabinet = format!("https://{SITE_TEST_HOST}:{}", p.port());
    let (attacker, password) = ("mallory@example.com", "mallory's long password");
    gpum_tests::owner::OwnerSession::accept(&p, &p.invite_owner(attacker), password).await;

    let image =
        gpum_tests::images::pinned(&gpum_tests::images::busybox().expect("test image")).expect("pinned");
    let node = rentable_node(&p).await;
    let page = base64::engine::general_purpose::STANDARD.encode(planting_page(&cabinet, attacker, password));
    let script = format!("mkdir -p /www && echo {page} | base64 -d > /www/plant.html && {SERVERS}");
    let r = create_rental_with_ports(&p, &node.node_id, &image, &[8080], &script);
    let containers = ScopedContainers::new("c");
    let dir = tempfile::tempdir().unwrap();
    write_agent_config(dir.path(), p.url(), &node, &containers.0);
    let ca = p.ca_path().expect("a TLS platform has a CA");
    let mut config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
    config.push_str(&format!("ca_file = '{}'\n", ca.display()));
    std::fs::write(dir.path().join("config.toml"), config).unwrap();
    let _agent = start_agent(dir.path(), 2);
    let tenant = format!("{}-8080.{SITE_RELAY_DOMAIN}", r.id.strip_prefix("rent-").unwrap());
    let c = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(p.ca_pem().unwrap().as_bytes()).unwrap())
        .resolve(&tenant, ([127, 0, 0, 1], door).into())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let t = Instant::now();
    loop {
        let got = c
            .get(format!("https://{tenant}:{door}/plant.html"))
            .basic_auth(&r.id, Some(&r.credential))
            .send()
            .await;
        if let Ok(resp) = got
            && resp.status() == 200
        {
            assert!(resp.text().await.unwrap().contains("planted"));
            break;
        }
        assert!(t.elapsed() < LONG, "the tenant's page never answered; platform log:\n{}", p.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let b = gpum_tests::browser::Browser::start_with(
        "tenant_pages_cannot_plant_a_cookie_the_dashboard_reads",
        "en",
        &[
            format!(
                "--host-resolver-rules=MAP {SITE_TEST_HOST} 127.0.0.1, MAP *.{SITE_RELAY_DOMAIN} 127.0.0.1"
            ),
            // The throwaway CA is the test's; the pages still count as https (Secure cookies).
            "--ignore-certificate-errors".into(),
        ],
    )
    .await;
    // The tenant's page (the credential in the URL, as a browser remembers it after the prompt).
    b.goto(&format!("https://{}:{}@{tenant}:{door}/plant.html", r.id, r.credential)).await;
    let t = Instant::now();
    while !b.url().await.starts_with(&cabinet) || !b.has("body").await {
        assert!(t.elapsed() < Duration::from_secs(20), "the page never posted: {}", b.url().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.wait_for("#stale").await;
    assert!(b.url().await.ends_with("/dashboard/login"), "{}", b.url().await);

    // What the dashboard's host holds now: the planted cookies of other names arrived (the
    // page is same-site: the attack is real), none of the dashboard's names is planted.
    let cookies = b.client.get_all_cookies().await.unwrap();
    let seen: Vec<(String, String)> =
        cookies.iter().map(|c| (c.name().to_owned(), c.value().to_owned())).collect();
    assert!(seen.contains(&("gpum_login".into(), "planted".into())), "the control: {seen:?}");
    assert!(seen.contains(&("gpum_session".into(), "planted".into())), "the control: {seen:?}");
    assert!(!seen.iter().any(|(n, v)| n.starts_with("__Host-") && (v == "planted" || v == "ru")), "{seen:?}");
    assert!(!seen.iter().any(|(n, _)| n == SESSION_COOKIE), "no session started: {seen:?}");
    // Not signed in as anyone: the dashboard sends the browser to its sign-in form, whose key
    // is the dashboard's own.
    b.goto(&format!("{cabinet}/dashboard")).await;
    b.wait_for("form").await;
    assert!(b.url().await.ends_with("/dashboard/login"), "{}", b.url().await);
    let key = b.client.get_named_cookie(LOGIN_COOKIE).await.expect("the dashboard's form key");
    assert!(key.value().len() == 64 && key.value() != "planted", "{}", key.value());
    assert!(!p.log().contains("dashboard: an owner signed in"), "{}", p.log());
    b.close().await;
}
