//! Issue 29, items 6, 11, 12, 13: admin authentication limits, database file modes, inventory
//! validation and answer headers.
//!
//! The real server over real HTTP(S) on loopback. A second client address is a second loopback
//! source address (a client socket bound to 127.0.0.2). `serve` itself is also started by hand
//! where what is tested is how it starts: the token file it refuses, the umask it runs under.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpum_platform::web::{LOGIN_COOKIE, SESSION_COOKIE};
use gpum_protocol::{
    ErrorBody, ErrorCode, GpuPublic, HeartbeatRequest, PATH_ADMIN_JOIN_CODES, PATH_ADMIN_NODES,
    PATH_ADMIN_PROBE_IMAGE, PATH_HEARTBEAT, PATH_OWNER_NODES, PATH_REGISTER, RegisterRequest,
    RegisterResponse, limits,
};
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::{Client, Response, StatusCode};

use super::inventory;

/// A client that trusts the platform's CA (if any), keeps no cookies, follows no redirect, and
/// connects from the loopback address `from`.
fn client_from(p: &TestPlatform, from: [u8; 4]) -> Client {
    let mut b = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .local_address(IpAddr::from(from));
    if let Some(pem) = p.ca_pem() {
        b = b
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

/// The answer's status, `Content-Type`, `Cache-Control`, `Retry-After` and body.
struct Ans {
    status: StatusCode,
    content_type: String,
    cache_control: Option<String>,
    retry_after: Option<u64>,
    body: String,
}

impl Ans {
    async fn of(r: Response) -> Ans {
        let h = |name: &str| r.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        let content_type = h("content-type").unwrap_or_default();
        let cache_control = h("cache-control");
        let retry_after = h("retry-after").map(|v| v.parse().unwrap());
        Ans { status: r.status(), content_type, cache_control, retry_after, body: r.text().await.unwrap() }
    }

    /// The protocol's error: JSON, its code's status, a message.
    fn error(&self) -> ErrorCode {
        assert!(
            self.content_type.starts_with("application/json"),
            "{} {}: {}",
            self.status,
            self.content_type,
            self.body
        );
        let e: ErrorBody = serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body));
        assert_eq!(e.error.code.http_status(), self.status.as_u16(), "{}", self.body);
        assert!(!e.error.message.is_empty());
        e.error.code
    }
}

async fn admin_nodes(c: &Client, p: &TestPlatform, token: &str) -> Ans {
    Ans::of(c.get(format!("{}{PATH_ADMIN_NODES}", p.url())).bearer_auth(token).send().await.unwrap()).await
}

/// Opens the sign-in form, then posts `token` with it.
async fn sign_in(c: &Client, p: &TestPlatform, token: &str) -> (Ans, Option<String>) {
    let form = c.get(format!("{}/dashboard/operator", p.url())).send().await.unwrap();
    let login = cookie(&form, LOGIN_COOKIE).expect("the form's cookie");
    let r = c
        .post(format!("{}/dashboard/operator", p.url()))
        .header("cookie", format!("{LOGIN_COOKIE}={login}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={login}&token={token}"))
        .send()
        .await
        .unwrap();
    let session = cookie(&r, SESSION_COOKIE).filter(|v| !v.is_empty());
    (Ans::of(r).await, session)
}

fn cookie(r: &Response, name: &str) -> Option<String> {
    r.headers().get_all("set-cookie").iter().find_map(|v| {
        let v = v.to_str().ok()?;
        Some(v.split(';').next()?.strip_prefix(name)?.strip_prefix('=')?.to_owned())
    })
}

/// Item 6. Wrong admin tokens from one address: five are answered 401; then the address is
/// refused 429 (JSON, `Retry-After`) for a doubling while at the admin API, the right token
/// included (the operator's sign-in, another door, counts on its own); another address is not
/// affected; each refusal is logged
/// with the address and never the token. Before the fix, every guess was a 401 at full speed.
#[tokio::test]
async fn admin_token_guessing_is_slowed_per_address() {
    let p = TestPlatform::start(PlatformOpts::default());
    let (guesser, other) = (client_from(&p, [127, 0, 0, 1]), client_from(&p, [127, 0, 0, 2]));
    let guesses: Vec<String> = (0..8).map(|i| format!("guess{i}-4f1d9a0c7b2e83d6a5c4b3a29180f7e6")).collect();
    for g in &guesses[..5] {
        let a = admin_nodes(&guesser, &p, g).await;
        assert_eq!(a.error(), ErrorCode::AdminUnauthorized, "within the first five");
    }
    let blocked = admin_nodes(&guesser, &p, &guesses[5]).await;
    assert_eq!(blocked.error(), ErrorCode::TooManyRequests);
    assert_eq!(blocked.retry_after, Some(1), "the first block is 1 s");
    assert_eq!(blocked.cache_control.as_deref(), Some("no-store"));
    // Blocked means not even looked at: the right token too.
    let a = admin_nodes(&guesser, &p, p.admin_token()).await;
    assert_eq!(a.error(), ErrorCode::TooManyRequests);
    // Another address signs in and uses the API as usual.
    assert_eq!(admin_nodes(&other, &p, p.admin_token()).await.status, StatusCode::OK);
    let (a, session) = sign_in(&other, &p, p.admin_token()).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert!(session.is_some());

    // After the block, one more wrong token blocks it again for twice as long.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(admin_nodes(&guesser, &p, &guesses[6]).await.error(), ErrorCode::AdminUnauthorized);
    let a = admin_nodes(&guesser, &p, &guesses[7]).await;
    assert_eq!((a.error(), a.retry_after), (ErrorCode::TooManyRequests, Some(2)));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(
        admin_nodes(&guesser, &p, p.admin_token()).await.status,
        StatusCode::OK,
        "the right token, after it"
    );

    let log = p.log();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what) && l.contains("127.0.0.1")).count();
    assert_eq!(lines("admin API: wrong secret"), 6, "one line per wrong token:\n{log}");
    assert!(lines("admin API: refused, too many wrong answers") >= 2, "{log}");
    let other = log.lines().filter(|l| l.contains("127.0.0.2"));
    assert!(
        other.clone().all(|l| !l.contains("wrong") && !l.contains("refused")),
        "no refusal for the other address:\n{log}"
    );
    assert_eq!(other.filter(|l| l.contains("the operator signed in")).count(), 1, "its sign-in is logged");
    for secret in guesses.iter().map(String::as_str).chain([p.admin_token()]) {
        assert!(!log.contains(secret), "a token in the log:\n{log}");
    }
}

/// Item 6, the sign-in form: its wrong tokens are slowed like the API's. Issue 43, item 2: each
/// door counts on its own, so the admin API stays open to the same address.
#[tokio::test]
async fn wrong_sign_ins_block_the_address_at_the_sign_in() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let c = client_from(&p, [127, 0, 0, 3]);
    for i in 0..5 {
        let (a, session) = sign_in(&c, &p, &format!("wrong-{i}")).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
        assert!(session.is_none());
    }
    let (a, _) = sign_in(&c, &p, "wrong-5").await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(a.retry_after.is_some());
    assert!(a.body.contains("id=\"login-error\""), "the form says why: {}", a.body);
    assert_eq!(admin_nodes(&c, &p, p.admin_token()).await.status, StatusCode::OK, "another door");
    let log = p.log();
    let wrong =
        log.lines().filter(|l| l.contains("operator sign-in: wrong secret") && l.contains("127.0.0.3"));
    assert_eq!(wrong.count(), 5, "{log}");
    assert!(!p.log().contains("wrong-"), "{}", p.log());
}

const OWNER_PW: &str = "correct horse battery";

/// An owner's sign-in from `c` (its own loopback address): the answer's status.
async fn owner_sign_in(c: &Client, p: &TestPlatform, email: &str, password: &str) -> Ans {
    let form = c.get(format!("{}/dashboard/login", p.url())).send().await.unwrap();
    let key = cookie(&form, LOGIN_COOKIE).expect("the form's cookie");
    let r = c
        .post(format!("{}/dashboard/login", p.url()))
        .header("cookie", format!("{LOGIN_COOKIE}={key}"))
        .form(&[("csrf", key.as_str()), ("email", email), ("password", password), ("code", "")])
        .send()
        .await
        .unwrap();
    Ans::of(r).await
}

/// Issue 43, item 2: one success at a door clears no other door's failures. Before the fix a
/// valid owner API call after every four wrong sign-ins wiped the address's count, and the
/// guesses went on at full speed, all 401. Now the fifth wrong sign-in blocks the sign-in
/// whatever the owner API says.
#[tokio::test]
async fn a_success_at_another_door_does_not_clear_wrong_sign_ins() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let owner =
        gpum_tests::owner::OwnerSession::accept(&p, &p.invite_owner("mine@example.com"), OWNER_PW).await;
    let key = owner.create_api_key("guesser").await;
    gpum_tests::owner::OwnerSession::accept(&p, &p.invite_owner("victim@example.com"), OWNER_PW).await;
    let c = client_from(&p, [127, 0, 0, 4]);
    let mut statuses = Vec::new();
    for round in 0..3 {
        for i in 0..4 {
            let a = owner_sign_in(&c, &p, "victim@example.com", &format!("guess {round} {i}")).await;
            statuses.push(a.status.as_u16());
        }
        let r = c.get(format!("{}{PATH_OWNER_NODES}", p.url())).bearer_auth(&key).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "the owner API key works");
    }
    let mut want = vec![401; 5];
    want.resize(12, 429);
    assert_eq!(statuses, want);
}

/// Issue 43, item 2: an account's wrong sign-ins count from every address; the account waits a
/// bounded while (the right password, from a fresh address, gets in once it is over), and
/// other accounts are not touched.
#[tokio::test]
async fn an_accounts_wrong_sign_ins_from_many_addresses_add_up() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    gpum_tests::owner::OwnerSession::accept(&p, &p.invite_owner("dee@example.com"), OWNER_PW).await;
    gpum_tests::owner::OwnerSession::accept(&p, &p.invite_owner("eve@example.com"), OWNER_PW).await;
    for i in 0..5u8 {
        let c = client_from(&p, [127, 0, 1, 10 + i]);
        let a = owner_sign_in(&c, &p, "dee@example.com", "wrong password!").await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "address {i}: {}", a.body);
    }
    let fresh = client_from(&p, [127, 0, 1, 50]);
    let a = owner_sign_in(&fresh, &p, "dee@example.com", OWNER_PW).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "the account waits: {}", a.body);
    let wait = a.retry_after.expect("Retry-After");
    assert!((1..=60).contains(&wait), "{wait}");
    let a = owner_sign_in(&fresh, &p, "eve@example.com", OWNER_PW).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "another account signs in: {}", a.body);
    tokio::time::sleep(Duration::from_secs(wait) + Duration::from_millis(100)).await;
    let a = owner_sign_in(&fresh, &p, "dee@example.com", OWNER_PW).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "after the wait: {}", a.body);
}

// ---------------------------------------------------------------------------------------------
// `serve`, started by hand

/// Runs `gpum-platform serve` under umask 022 on a fresh database in `dir`, with `token` as the
/// admin token file's content. `Ok` once it listens (with its port), `Err` with its exit code
/// and stderr if it exits first.
fn serve(dir: &Path, token: &str) -> Result<(Child, u16), (i32, String)> {
    let token_file = dir.join("admin-token");
    std::fs::write(&token_file, token).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("umask 022 && exec \"$0\" \"$@\"")
        .arg(gpum_tests::bin("gpum-platform"))
        .args(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--db"])
        .arg(dir.join("platform.db"))
        .arg("--admin-token-file")
        .arg(&token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    if let Some(port) = line.trim().rsplit(':').next().and_then(|p| p.parse().ok()) {
        return Ok((child, port));
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    Err((status.code().unwrap_or(-1), err))
}

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// Item 6: `serve` refuses an admin token file that is short or not random-looking, with exit 2
/// and a message that says how to make one (and does not repeat the token). Before the fix, 32
/// characters of anything were enough, and a short one was exit 1. The guide's own recipe, and
/// the test harness's token, are accepted.
#[test]
fn serve_refuses_a_weak_admin_token_file() {
    for (token, why) in [
        ("0123456789abcdef0123456789abcde\n", "31 characters"),
        (&"a".repeat(64), "different characters"),
        ("0123456789abcdef0123456789abcdef", "repeats itself"),
        ("abcdefghijklmnopqrstuvwxyz012345", "sequence"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        match serve(dir.path(), token) {
            Ok((c, _)) => {
                stop(c);
                panic!("serve accepted the admin token {token:?}");
            }
            Err((code, err)) => {
                assert_eq!(code, 2, "{err}");
                assert!(err.contains("too weak") && err.contains(why), "{err}");
                assert!(err.contains("head -c 32 /dev/urandom"), "it says how to make one: {err}");
                assert!(!err.contains(token.trim()), "the token in the message: {err}");
            }
        }
    }
    // The recipe of the README and the guides.
    let out = Command::new("sh")
        .arg("-c")
        .arg("head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
        .output()
        .unwrap();
    let made = String::from_utf8(out.stdout).unwrap();
    assert_eq!(made.len(), 64, "{made:?}");
    let dir = tempfile::tempdir().unwrap();
    let (c, _) = serve(dir.path(), &made).unwrap_or_else(|(code, err)| panic!("exit {code}: {err}"));
    stop(c);
}

/// Item 11: under umask 022, the database, its WAL and its shared memory are 0600 (they hold host
/// names, GPU UUIDs and token hashes); before the fix they were 0644.
#[tokio::test]
async fn database_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let token = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let (child, port) = serve(dir.path(), token).unwrap_or_else(|(code, err)| panic!("exit {code}: {err}"));
    // A write, so that the WAL holds something.
    let r = Client::new()
        .post(format!("http://127.0.0.1:{port}{PATH_ADMIN_JOIN_CODES}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    for name in ["platform.db", "platform.db-wal", "platform.db-shm"] {
        let m = std::fs::metadata(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{name}");
    }
    stop(child);
}

// ---------------------------------------------------------------------------------------------
// Inventory numbers

/// Item 12: an inventory whose numbers are out of range (two GPUs of `u64::MAX` MiB, which
/// overflowed the server page's sum) is refused at registration and in a heartbeat with the
/// protocol's 400 `invalid_request`, and nothing of it is stored; the server page of a node
/// with a sane inventory renders.
#[tokio::test]
async fn out_of_range_inventory_numbers_are_refused() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let c = client_from(&p, [127, 0, 0, 1]);
    let register = |inv: gpum_protocol::Inventory, code: String| {
        let body = RegisterRequest {
            join_code: code,
            agent_version: "0.1.0".into(),
            inventory: inv,
            install_id: None,
        };
        c.post(format!("{}{PATH_REGISTER}", p.url())).json(&body).send()
    };
    let mut huge = inventory("GPU-huge");
    huge.public.gpus = vec![GpuPublic { model: "Huge".into(), vram_mib: u64::MAX }; 2];
    huge.private.gpu_uuids = vec!["GPU-huge-0".into(), "GPU-huge-1".into()];
    let code = p.join_code();
    let a = Ans::of(register(huge.clone(), code.clone()).await.unwrap()).await;
    assert_eq!(a.error(), ErrorCode::InvalidRequest, "{}", a.body);
    assert!(a.body.contains("vram_mib"), "{}", a.body);
    for (what, inv) in [
        ("ram_mib", {
            let mut i = inventory("GPU-r");
            i.public.ram_mib = limits::MAX_RAM_MIB + 1;
            i
        }),
        ("disk_gib", {
            let mut i = inventory("GPU-d");
            i.public.disk_gib = u64::MAX;
            i
        }),
        ("cpu_cores", {
            let mut i = inventory("GPU-c");
            i.public.cpu_cores = u32::MAX;
            i
        }),
    ] {
        let a = Ans::of(register(inv, code.clone()).await.unwrap()).await;
        assert_eq!(a.error(), ErrorCode::InvalidRequest, "{what}");
        assert!(a.body.contains(what), "{}", a.body);
    }
    assert!(p.nodes().nodes.is_empty(), "nothing registered");

    // The same code still works with a sane inventory; a heartbeat cannot bring the bad one in.
    let mut fine = inventory("GPU-fine");
    fine.public.gpus = vec![GpuPublic { model: "Big GPU".into(), vram_mib: limits::MAX_VRAM_MIB }; 2];
    fine.private.gpu_uuids = vec!["GPU-fine-0".into(), "GPU-fine-1".into()];
    let r = register(fine.clone(), code).await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let reg: RegisterResponse = r.json().await.unwrap();
    let beat =
        HeartbeatRequest { seq: 1, inventory_hash: huge.hash(), inventory: Some(huge), ..Default::default() };
    let r =
        c.post(format!("{}{PATH_HEARTBEAT}", p.url())).bearer_auth(&reg.node_token).json(&beat).send().await;
    assert_eq!(Ans::of(r.unwrap()).await.error(), ErrorCode::InvalidRequest);
    let node = p.node(&reg.node_id).unwrap();
    assert_eq!(node.inventory, fine, "the refused inventory was not stored");

    // The server page renders (the debug build panicked on the sum before).
    let (a, session) = sign_in(&c, &p, p.admin_token()).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    let session = session.unwrap();
    for path in [format!("/dashboard/servers/{}", reg.node_id), "/dashboard".to_owned()] {
        let r = c
            .get(format!("{}{path}", p.url()))
            .header("cookie", format!("{SESSION_COOKIE}={session}"))
            .send()
            .await;
        let a = Ans::of(r.unwrap()).await;
        assert_eq!(a.status, StatusCode::OK, "{path}: {}", a.body);
        assert!(a.body.contains("2 × Big GPU (16384 GiB)"), "{path}: {}", a.body);
    }
    assert!(p.log().lines().all(|l| !l.contains("panicked")), "{}", p.log());
}

// ---------------------------------------------------------------------------------------------
// Answers

/// Item 13: the admin API's answers that carry a secret shown once, a join code and a node's new
/// token, are `Cache-Control: no-store` (as every admin answer now is).
#[tokio::test]
async fn admin_secrets_are_not_stored_by_caches() {
    let p = TestPlatform::start(PlatformOpts::default());
    let c = client_from(&p, [127, 0, 0, 1]);
    let r = c.post(format!("{}{PATH_ADMIN_JOIN_CODES}", p.url())).bearer_auth(p.admin_token()).send().await;
    let a = Ans::of(r.unwrap()).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    assert_eq!(a.cache_control.as_deref(), Some("no-store"), "join code");
    let code: serde_json::Value = serde_json::from_str(&a.body).unwrap();
    let req = RegisterRequest {
        join_code: code["code"].as_str().unwrap().into(),
        agent_version: "0.1.0".into(),
        inventory: inventory("GPU-nostore"),
        install_id: None,
    };
    let reg: RegisterResponse =
        c.post(format!("{}{PATH_REGISTER}", p.url())).json(&req).send().await.unwrap().json().await.unwrap();
    let r = c
        .post(format!("{}{PATH_ADMIN_NODES}/{}/rotate-token", p.url(), reg.node_id))
        .bearer_auth(p.admin_token())
        .send()
        .await;
    let a = Ans::of(r.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert!(a.body.contains("node_token"));
    assert_eq!(a.cache_control.as_deref(), Some("no-store"), "new token");
}

/// Item 13: every route, given a bad path parameter (not UTF-8 once decoded), a bad query or a
/// bad body, answers every 400 (and every other error) outside the dashboard as the protocol's
/// JSON error. Before the fix, axum's rejections were `text/plain`. Under `/dashboard` every
/// error is a cabinet page in the owner's language instead (issue 46), never `text/plain`.
#[tokio::test]
async fn every_400_is_the_protocols_json_error() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let c = client_from(&p, [127, 0, 0, 1]);
    let (_, session) = sign_in(&c, &p, p.admin_token()).await;
    let session = session.expect("signed in");
    let nodes = PATH_ADMIN_NODES;
    let mut requests: Vec<(&str, String, &str)> = Vec::new();
    for bad in ["%FF", "%C3%28", "x%00y"] {
        for (m, path) in [
            ("DELETE", format!("{nodes}/{bad}")),
            ("POST", format!("{nodes}/{bad}/commands")),
            ("POST", format!("{nodes}/{bad}/rotate-token")),
            ("PUT", format!("{nodes}/{bad}/known-containers")),
            ("GET", format!("/dl/{bad}")),
            ("GET", format!("/dashboard/servers/{bad}")),
            ("POST", format!("/dashboard/servers/{bad}/command")),
            ("GET", format!("/dashboard/servers/{bad}/rotate-token")),
            ("POST", format!("/dashboard/servers/{bad}/rotate-token")),
            ("GET", format!("/dashboard/servers/{bad}/delete")),
            ("POST", format!("/dashboard/servers/{bad}/delete")),
            ("GET", format!("/dashboard/join/{bad}")),
        ] {
            requests.push((m, path, "{}"));
        }
    }
    for (m, path) in [
        ("POST", PATH_REGISTER),
        ("POST", "/api/v1/agent/enroll"),
        ("POST", PATH_HEARTBEAT),
        ("POST", PATH_ADMIN_JOIN_CODES),
        ("PUT", PATH_ADMIN_PROBE_IMAGE),
        ("POST", "/api/v1/admin/nodes/node-x/commands"),
        ("PUT", "/api/v1/admin/nodes/node-x/known-containers"),
    ] {
        for body in ["{", "[]", "{\"x\":1}", "\u{0}"] {
            requests.push((m, path.to_owned(), body));
        }
    }
    for (m, path) in [
        ("GET", "/dashboard?deleted=a&deleted=b"),
        ("GET", "/dashboard?lang=xx&deleted=%FF"),
        ("GET", "/install.sh?x=%FF"),
        ("GET", "/api/v1/admin/nodes?x=1&x=2"),
        ("PATCH", "/api/v1/admin/nodes/node-x"),
        ("GET", "/api/v1/nowhere"),
    ] {
        requests.push((m, path.to_owned(), ""));
    }
    let mut seen_400 = 0;
    for (m, path, body) in &requests {
        let url = format!("{}{path}", p.url());
        let r = c
            .request(m.parse().unwrap(), &url)
            .bearer_auth(p.admin_token())
            .header("cookie", format!("{SESSION_COOKIE}={session}"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let a = Ans::of(r).await;
        if a.status == StatusCode::BAD_REQUEST {
            seen_400 += 1;
        }
        if path.starts_with("/dashboard") {
            if a.status.is_client_error() {
                assert!(
                    a.content_type.starts_with("text/html") && a.body.contains("gpum dashboard"),
                    "{m} {path}: {} {} {}",
                    a.status,
                    a.content_type,
                    a.body
                );
            }
        } else if a.status.is_client_error() {
            a.error();
        }
        assert!(!a.status.is_server_error(), "{m} {path}: {} {}", a.status, a.body);
    }
    assert!(seen_400 > 30, "the bad inputs reached their extractors ({seen_400} answers were 400)");
}
