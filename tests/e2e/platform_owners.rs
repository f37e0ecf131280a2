//! Issue 32: owners' accounts. The real server over real HTTP on loopback, the real CLI: an
//! owner sees and changes only their own servers and join codes, on every dashboard page and
//! every endpoint of the owner API, tried as another owner; the operator sees all; sessions
//! survive a restart; a disabled owner is out; sign-in is rate-limited and logged.

use gpum_protocol::{
    NodeList, PATH_ADMIN_NODES, PATH_ADMIN_OWNERS, PATH_OWNER_JOIN_CODES, PATH_OWNER_NODES,
    PATH_OWNER_RENTALS, RegisterResponse,
};
use gpum_tests::owner::OwnerSession;
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use super::Api;

const PW_A: &str = "correct horse battery";
const PW_B: &str = "another long password";

/// Every dashboard page and form that names a server, as (method, path with `{id}`, fields).
/// web/mod.rs routes each; a GET that renders and a POST that changes are both tried.
type Fields = &'static [(&'static str, &'static str)];
const SERVER_PAGES: &[(&str, &str, Fields)] = &[
    ("GET", "/dashboard/servers/{id}", &[]),
    ("GET", "/dashboard/servers/{id}/rotate-token", &[]),
    ("GET", "/dashboard/servers/{id}/delete", &[]),
    ("POST", "/dashboard/servers/{id}/command", &[("kind", "restart")]),
    (
        "POST",
        "/dashboard/servers/{id}/settings",
        &[("name", "stolen"), ("price", "1.00"), ("min_rental", "60")],
    ),
    ("POST", "/dashboard/servers/{id}/pause", &[("paused", "true")]),
    ("POST", "/dashboard/servers/{id}/auto-update", &[("auto_update", "false")]),
    ("POST", "/dashboard/servers/{id}/rotate-token", &[]),
    ("POST", "/dashboard/servers/{id}/delete", &[]),
    (
        "POST",
        "/dashboard/servers/{id}/maintenance",
        &[("starts", "2026-12-07T00:00"), ("ends", "2030-01-01T00:00")],
    ),
    ("POST", "/dashboard/servers/{id}/maintenance/mw-x/delete", &[]),
];

async fn owner_api(
    p: &TestPlatform,
    method: &str,
    path: &str,
    key: &str,
    body: Option<&str>,
) -> (StatusCode, String) {
    let c = p.http_client();
    let url = format!("{}{path}", p.url());
    let mut rb = match method {
        "GET" => c.get(url),
        "POST" => c.post(url),
        "PATCH" => c.patch(url),
        "DELETE" => c.delete(url),
        m => panic!("{m}"),
    };
    rb = rb.bearer_auth(key);
    if let Some(b) = body {
        rb = rb.header("content-type", "application/json").body(b.to_owned());
    }
    let r = rb.send().await.unwrap();
    let status = r.status();
    assert_eq!(r.headers()["cache-control"], "no-store");
    (status, r.text().await.unwrap())
}

/// The owner API's routes that name a server, with a body each accepts from the right owner.
fn owner_node_routes() -> Vec<(&'static str, String, Option<&'static str>)> {
    let mut v = Vec::new();
    for (m, p) in gpum_platform_routes() {
        if p.starts_with(PATH_OWNER_NODES) && p.contains("{id}") {
            let body = match (m, p.rsplit('/').next().unwrap_or("")) {
                ("PATCH", _) => Some(r#"{"name":"stolen","paused":true}"#),
                ("POST", "commands") => Some(r#"{"kind":"recheck"}"#),
                ("POST", "maintenance") => Some(r#"{"starts_at":0,"ends_at":4000000000}"#),
                _ => None,
            };
            v.push((m, p.to_owned(), body));
        }
    }
    v
}

/// The platform's own route list (server::ROUTES), as docs/openapi.yaml documents it: read from
/// the spec, which a unit test keeps equal to the router.
fn gpum_platform_routes() -> Vec<(&'static str, &'static str)> {
    let spec = std::fs::read_to_string(gpum_tests::workspace_root().join("docs/openapi.yaml")).unwrap();
    let spec: &'static str = Box::leak(spec.into_boxed_str());
    let mut out = Vec::new();
    let mut path: Option<&'static str> = None;
    for line in spec.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
            path = Some(&line[2..2 + p.len() + 1]);
            continue;
        }
        if let (Some(p), Some(m)) = (path, line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')))
            && let Some(m) = match m {
                "get" => Some("GET"),
                "post" => Some("POST"),
                "patch" => Some("PATCH"),
                "put" => Some("PUT"),
                "delete" => Some("DELETE"),
                _ => None,
            }
        {
            out.push((m, p));
        }
    }
    assert!(out.len() > 20, "routes read from the spec: {out:?}");
    out
}

#[tokio::test]
async fn an_owner_sees_and_changes_only_their_own_on_every_page_and_endpoint() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let a = OwnerSession::accept(&p, &p.invite_owner("ann@example.com"), PW_A).await;
    let b = OwnerSession::accept(&p, &p.invite_owner("Bob@Example.com"), PW_B).await;

    // A's server (a code from her page), B's (from the CLI), and the operator's own.
    let created = a.post("/dashboard/add", &[("ttl", "3600")]).await;
    assert_eq!(created.status, StatusCode::SEE_OTHER, "{}", created.body);
    let page = a.get(created.location.as_deref().expect("to the code's page")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let code_a = page.body.split("id=\"join-code\">").nth(1).map(|s| s[..s.find('<').unwrap()].to_owned());
    let code_a = code_a.unwrap_or_else(|| panic!("a code on the page: {}", page.body));
    let code_hash_a = hex::encode(Sha256::digest(code_a.as_bytes()));
    let node_a: RegisterResponse = api.register(&code_a, "GPU-own-a").await.ok();
    let node_b: RegisterResponse =
        api.register(&p.owner_join_code("bob@example.com"), "GPU-own-b").await.ok();
    let node_op: RegisterResponse = api.register(&p.join_code(), "GPU-own-op").await.ok();

    // Lists: each owner their own; the operator all three.
    let listed = |body: &str, id: &str| {
        body.contains(&format!("data-id=\"{id}\"")) || body.contains(&format!("/dashboard/servers/{id}\""))
    };
    let la = a.get("/dashboard").await.body;
    assert!(
        listed(&la, &node_a.node_id) && !listed(&la, &node_b.node_id) && !listed(&la, &node_op.node_id),
        "{la}"
    );
    let lb = b.get("/dashboard").await.body;
    assert!(listed(&lb, &node_b.node_id) && !listed(&lb, &node_a.node_id), "{lb}");
    assert_eq!(p.nodes().nodes.len(), 3, "the operator's CLI sees all");
    assert_eq!(p.node(&node_a.node_id).unwrap().owner.as_deref(), Some("ann@example.com"));
    assert_eq!(p.node(&node_b.node_id).unwrap().owner.as_deref(), Some("bob@example.com"));
    assert_eq!(p.node(&node_op.node_id).unwrap().owner, None, "the operator's own");

    // Every server page and form, as B, on A's server: 404, and nothing changes.
    let before = p.node(&node_a.node_id).unwrap();
    for (m, path, fields) in SERVER_PAGES {
        let path = path.replace("{id}", &node_a.node_id);
        let r = if *m == "GET" { b.get(&path).await } else { b.post(&path, fields).await };
        assert_eq!(r.status, StatusCode::NOT_FOUND, "B: {m} {path}: {}", r.body);
        assert!(!r.body.contains(&before.name) || before.name.is_empty(), "nothing of A's server shows");
    }
    let r = b.get(&format!("/dashboard/join/{code_hash_a}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "A's join code's page, as B");
    // A's open codes are listed on her "Add a machine" page, not on B's.
    let open = a.post("/dashboard/add", &[("ttl", "3600")]).await;
    let open_hash =
        open.location.as_deref().and_then(|l| l.strip_prefix("/dashboard/join/")).unwrap().to_owned();
    assert!(a.get("/dashboard/add").await.body.contains(&open_hash), "listed for A");
    assert!(!b.get("/dashboard/add").await.body.contains(&open_hash), "not for B");
    assert_eq!(b.get(&format!("/dashboard/join/{open_hash}")).await.status, StatusCode::NOT_FOUND);
    let after = p.node(&node_a.node_id).expect("A's server is still there");
    assert_eq!((after.name, after.paused, after.commands.len()), (before.name.clone(), false, 0));
    // The same pages as A work (the test above is not vacuous).
    assert_eq!(a.get(&format!("/dashboard/servers/{}", node_a.node_id)).await.status, StatusCode::OK);
    assert_eq!(a.get(&format!("/dashboard/join/{code_hash_a}")).await.status, StatusCode::OK);
    let r = a.post(&format!("/dashboard/servers/{}/pause", node_a.node_id), &[("paused", "true")]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert!(p.node(&node_a.node_id).unwrap().paused);

    // The owner API: every route that names a server, with B's key on A's server: 404.
    let key_a = a.create_api_key("ci").await;
    let key_b = b.create_api_key("laptop").await;
    let routes = owner_node_routes();
    assert_eq!(routes.len(), 10, "{routes:?}");
    for (m, path, body) in &routes {
        let path = path.replace("{id}", &node_a.node_id).replace("{window}", "mw-x");
        let (status, text) = owner_api(&p, m, &path, &key_b, *body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "B's key: {m} {path}: {text}");
    }
    let after = p.node(&node_a.node_id).expect("still there");
    assert_eq!((after.name.as_str(), after.commands.len()), (before.name.as_str(), 0), "nothing changed");
    // The rentals routes answer an owner (read-only; the store's scoping is the unit test
    // `an_owner_sees_only_rentals_on_their_servers_without_the_tenants_secrets`).
    let (status, text) =
        owner_api(&p, "GET", &format!("{PATH_OWNER_RENTALS}?node={}", node_a.node_id), &key_b, None).await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, r#"{"rentals":[]}"#));
    let (status, _) = owner_api(&p, "GET", &format!("{PATH_OWNER_RENTALS}/r-none"), &key_b, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = owner_api(&p, "GET", PATH_OWNER_RENTALS, p.admin_token(), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the admin token is not an owner's key");
    let (status, text) = owner_api(&p, "GET", PATH_OWNER_NODES, &key_b, None).await;
    assert_eq!(status, StatusCode::OK);
    let list: NodeList = serde_json::from_str(&text).unwrap();
    assert_eq!(list.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), [node_b.node_id.as_str()]);
    // A's key does what the page does, on A's server.
    let (status, text) = owner_api(
        &p,
        "PATCH",
        &format!("{PATH_OWNER_NODES}/{}", node_a.node_id),
        &key_a,
        Some(r#"{"name":"ann-1"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(p.node(&node_a.node_id).unwrap().name, "ann-1");
    let (status, text) = owner_api(&p, "POST", PATH_OWNER_JOIN_CODES, &key_a, None).await;
    assert_eq!(status, StatusCode::CREATED, "{text}");
    let code: serde_json::Value = serde_json::from_str(&text).unwrap();
    let node_a2: RegisterResponse = api.register(code["code"].as_str().unwrap(), "GPU-own-a2").await.ok();
    let (_, text) = owner_api(&p, "GET", PATH_OWNER_NODES, &key_a, None).await;
    let list: NodeList = serde_json::from_str(&text).unwrap();
    assert_eq!(list.nodes.len(), 2, "the key's join code registered A's server: {text}");
    assert!(list.nodes.iter().any(|n| n.id == node_a2.node_id));
    let (status, _) =
        owner_api(&p, "DELETE", &format!("{PATH_OWNER_NODES}/{}", node_a2.node_id), &key_a, None).await;
    assert_eq!(status, StatusCode::OK);

    // Keys and tokens do not cross: an owner key on the admin API, the admin token on the owner
    // API, a made-up key.
    let (status, _) = owner_api(&p, "GET", PATH_ADMIN_NODES, &key_a, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = owner_api(&p, "GET", PATH_OWNER_NODES, p.admin_token(), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) =
        owner_api(&p, "GET", PATH_OWNER_NODES, &format!("gpumk_{}", "0".repeat(64)), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Revoking a key stops it at once; B cannot revoke A's.
    let keys_page = a.get("/dashboard/account").await.body;
    let key_id = keys_page.split("data-key=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let r = b.post(&format!("/dashboard/account/keys/{key_id}/revoke"), &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "not B's key");
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key_a, None).await.0, StatusCode::OK);
    let r = a.post(&format!("/dashboard/account/keys/{key_id}/revoke"), &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key_a, None).await.0, StatusCode::UNAUTHORIZED);

    // The database holds no key, password, session id or invitation token in the clear.
    let db = p.db_bytes();
    let db = String::from_utf8_lossy(&db);
    for secret in [key_a.as_str(), key_b.as_str(), PW_A, PW_B, a.session.as_str(), b.session.as_str()] {
        assert!(!db.contains(secret), "a secret in the database file");
    }
}

#[tokio::test]
async fn sessions_survive_a_restart_and_a_disabled_owner_is_out() {
    let mut p = TestPlatform::start(PlatformOpts::insecure_http());
    let link = p.invite_owner("cy@example.com");
    let cy = OwnerSession::accept(&p, &link, PW_A).await;
    let key = cy.create_api_key("k").await;
    // The link worked once.
    let again = p.http_client().get(&link).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
    assert!(again.text().await.unwrap().contains("id=\"invite-gone\""));

    p.restart();
    let r = cy.get("/dashboard").await;
    assert_eq!(r.status, StatusCode::OK, "a restart signs no one out");

    // The operator disables Cy: the session ends, the key is refused, sign-in fails.
    let admin = p.http_client();
    let r = admin
        .patch(format!("{}{PATH_ADMIN_OWNERS}/cy@example.com", p.url()))
        .bearer_auth(p.admin_token())
        .json(&serde_json::json!({"disabled": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = cy.get("/dashboard").await;
    assert_eq!((r.status, r.location.as_deref()), (StatusCode::SEE_OTHER, Some("/dashboard/login")));
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key, None).await.0, StatusCode::UNAUTHORIZED);
    let (page, s) = OwnerSession::sign_in(&p, "cy@example.com", PW_A, "").await;
    assert!(s.is_none() && page.status == StatusCode::UNAUTHORIZED, "{}", page.body);
    // Enabled again (CLI), the password works.
    p.cli_json(&["owners", "enable", "cy@example.com"]);
    let (page, s) = OwnerSession::sign_in(&p, "CY@example.com", PW_A, "").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert!(s.is_some());
    let list = p.cli_json(&["owners", "list"]);
    assert_eq!(list["owners"][0]["email"], "cy@example.com");
    assert_eq!(list["owners"][0]["password_set"], true);
}

#[tokio::test]
async fn wrong_passwords_are_rate_limited_logged_and_tell_nothing() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    OwnerSession::accept(&p, &p.invite_owner("dee@example.com"), PW_A).await;
    // An unknown address and a wrong password get the same answer.
    let (unknown, _) = OwnerSession::sign_in(&p, "nobody@example.com", PW_A, "").await;
    let (wrong, _) = OwnerSession::sign_in(&p, "dee@example.com", "wrong password!", "").await;
    assert_eq!((unknown.status, wrong.status), (StatusCode::UNAUTHORIZED, StatusCode::UNAUTHORIZED));
    let msg =
        |b: &str| b.split("id=\"login-error\">").nth(1).map(|s| s.split('<').next().unwrap().to_owned());
    assert_eq!(msg(&unknown.body), msg(&wrong.body));
    for _ in 0..4 {
        OwnerSession::sign_in(&p, "dee@example.com", "wrong password!", "").await;
    }
    // Past five failures, even the right password waits.
    let (page, s) = OwnerSession::sign_in(&p, "dee@example.com", PW_A, "").await;
    assert_eq!(page.status, StatusCode::TOO_MANY_REQUESTS, "{}", page.body);
    assert!(s.is_none());
    let log = p.log();
    assert!(log.contains("an owner's sign-in failed") && log.contains("dee@example.com"), "{log}");
    assert!(!log.contains("wrong password!") && !log.contains(PW_A), "no password in the log");
}

// ---------------------------------------------------------------------------------------------
// Issue 43: an open session is not the account; an owner can always get back in.

/// The code an authenticator app shows for `secret` (base32) at the platform's time, the
/// system's plus the test clock's `offset`.
fn app_code(secret: &str, offset: i64) -> String {
    use totp_rs::{Algorithm, Secret, TOTP};
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let bytes = Secret::Encoded(secret.to_owned()).to_bytes().expect("a base32 key");
    TOTP::new(Algorithm::SHA1, 6, 1, 30, bytes).expect("a TOTP").generate(now.saturating_add_signed(offset))
}

/// The recovery codes a page shows (each in a `class="recovery-code"` element).
fn recovery_codes(body: &str) -> Vec<String> {
    body.split("class=\"recovery-code\">").skip(1).map(|s| s[..s.find('<').unwrap()].to_owned()).collect()
}

/// Whether the account page says the second factor is on.
async fn totp_on(o: &OwnerSession) -> bool {
    let page = o.get("/dashboard/account").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    page.body.contains("data-on=\"true\"")
}

/// Turns the second factor on from the account page with the password, as an owner does: the
/// fresh key, then a code of it; returns the key and the recovery codes the page shows once.
async fn turn_on_totp(o: &OwnerSession, password: &str, offset: i64) -> (String, Vec<String>) {
    let page = o.post("/dashboard/account/totp", &[("password", password)]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let secret = gpum_tests::owner::text_of(&page.body, "totp-secret").expect("the key on the page");
    let code = app_code(&secret, offset);
    let page = o.post("/dashboard/account/totp/confirm", &[("secret", &secret), ("code", &code)]).await;
    assert!(page.status.is_success() || page.status == StatusCode::SEE_OTHER, "{}", page.body);
    assert!(totp_on(o).await, "the second factor is on");
    (secret, recovery_codes(&page.body))
}

/// Issue 43, item 1: with the second factor on, a session alone (a shared computer, a stolen
/// cookie) can neither replace it nor turn it off; the password and a current code can.
#[tokio::test]
async fn issue43_a_session_alone_cannot_replace_or_turn_off_the_second_factor() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let email = "eve-target@example.com";
    let a = OwnerSession::accept(&p, &p.invite_owner(email), PW_A).await;
    let mut off = 0i64;
    let (s1, _) = turn_on_totp(&a, PW_A, off).await;

    // The reproduction: the next step, a fresh key from the session alone, confirmed with its
    // own code.
    off += 60;
    p.advance_clock(60);
    let page = a.post("/dashboard/account/totp", &[]).await;
    assert!(!page.body.contains("id=\"totp-secret\""), "a new key without the password: {}", page.body);
    assert_ne!(page.status, StatusCode::OK);
    // A key of the attacker's own, confirmed with its code, without any start: refused.
    let s2 = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP";
    let page =
        a.post("/dashboard/account/totp/confirm", &[("secret", s2), ("code", &app_code(s2, off))]).await;
    assert!(!page.status.is_success() && page.status != StatusCode::SEE_OTHER, "{}", page.body);
    // A current code without the password does not turn it off either.
    let page = a.post("/dashboard/account/totp/off", &[("code", &app_code(&s1, off))]).await;
    assert_ne!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert!(totp_on(&a).await, "still on");
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &app_code(s2, off)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "the attacker's key signs no one in");
    off += 60;
    p.advance_clock(60);
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &app_code(&s1, off)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "the owner's key still does: {}", r.body);

    // The owner replaces it with the password and a current code.
    off += 60;
    p.advance_clock(60);
    let page = a.post("/dashboard/account/totp", &[("password", PW_A), ("code", &app_code(&s1, off))]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let s3 = gpum_tests::owner::text_of(&page.body, "totp-secret").expect("a new key");
    // The form's key is not what is confirmed: the one the platform gave this session is.
    let page =
        a.post("/dashboard/account/totp/confirm", &[("secret", s2), ("code", &app_code(s2, off))]).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "{}", page.body);
    let page =
        a.post("/dashboard/account/totp/confirm", &[("secret", &s3), ("code", &app_code(&s3, off))]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(recovery_codes(&page.body).len(), 10, "a new key, new recovery codes");
    off += 60;
    p.advance_clock(60);
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &app_code(&s1, off)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "the old key is gone");
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &app_code(&s3, off)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    // And turns it off with the password and a code.
    off += 60;
    p.advance_clock(60);
    let page =
        a.post("/dashboard/account/totp/off", &[("password", PW_A), ("code", &app_code(&s3, off))]).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert!(!totp_on(&a).await);
}

/// Issue 43, item 6: the account page's checks of a password and a code count as failed
/// sign-ins do: past five, 429, and then not even the right ones are looked at.
#[tokio::test]
async fn issue43_wrong_codes_on_the_account_page_are_throttled() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let a = OwnerSession::accept(&p, &p.invite_owner("guess@example.com"), PW_A).await;
    let (secret, _) = turn_on_totp(&a, PW_A, 0).await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let page = a.post("/dashboard/account/totp/off", &[("password", PW_A), ("code", "000000")]).await;
        statuses.push(page.status.as_u16());
    }
    assert!(statuses[..5].iter().all(|s| *s == 400), "{statuses:?}");
    assert!(statuses.contains(&429), "never throttled: {statuses:?}");
    assert!(totp_on(&a).await);
    // The block is a delay, not a lock: once it passes, the right code works.
    p.advance_clock(60);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let page = a
            .post("/dashboard/account/totp/off", &[("password", PW_A), ("code", &app_code(&secret, 60))])
            .await;
        if page.status == StatusCode::TOO_MANY_REQUESTS {
            assert!(page.body.contains("id=\"account-error\""), "{}", page.body);
            assert!(std::time::Instant::now() < end, "still blocked");
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            continue;
        }
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
        break;
    }
    assert!(!totp_on(&a).await);
}

/// Issue 43, items 5 and 11: a reset invitation sets the password and nothing more (the owner
/// signs in with the second factor as usual), and ends every session and API key; disabling an
/// owner revokes their keys, so enabling them again brings none back.
#[tokio::test]
async fn issue43_a_reset_link_neither_passes_the_second_factor_nor_keeps_keys() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let email = "reset@example.com";
    let a = OwnerSession::accept(&p, &p.invite_owner(email), PW_A).await;
    let (secret, _) = turn_on_totp(&a, PW_A, 0).await;
    let key = a.create_api_key("before the reset").await;
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key, None).await.0, StatusCode::OK);

    let (page, session) = OwnerSession::accept_page(&p, &p.invite_owner(email), PW_B).await;
    assert_eq!(session, None, "a reset link starts no session: {}", page.body);
    assert_eq!(
        (page.status, page.location.as_deref()),
        (StatusCode::SEE_OTHER, Some("/dashboard/login?reset=1"))
    );
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(a.get("/dashboard").await.status, StatusCode::SEE_OTHER, "the old session ended");
    let (r, _) = OwnerSession::sign_in(&p, email, PW_B, "").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "the new password alone is not enough");
    p.advance_clock(60);
    let (r, s) = OwnerSession::sign_in(&p, email, PW_B, &app_code(&secret, 60)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let a = s.unwrap();

    // Disable, enable: the keys made before stay revoked.
    let key = a.create_api_key("before the disable").await;
    p.cli_json(&["owners", "disable", email]);
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key, None).await.0, StatusCode::UNAUTHORIZED);
    p.cli_json(&["owners", "enable", email]);
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key, None).await.0, StatusCode::UNAUTHORIZED);
}

/// Issue 43: a lost authenticator. Recovery codes, shown once when the second factor is turned
/// on, sign in in place of a code, each once; a new set (password and code) replaces the old;
/// the operator's `owners reset-2fa` (and its admin API twin) turns the second factor off, ends
/// every session and key, and the owner sees that it happened.
#[tokio::test]
async fn issue43_recovery_codes_and_the_operators_reset_get_an_owner_back_in() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let email = "lost-phone@example.com";
    let a = OwnerSession::accept(&p, &p.invite_owner(email), PW_A).await;
    let (secret, codes) = turn_on_totp(&a, PW_A, 0).await;
    assert_eq!(codes.len(), 10, "recovery codes shown once");
    assert!(codes.iter().all(|c| c.len() == 19 && c.matches('-').count() == 3), "{codes:?}");
    assert!(recovery_codes(&a.get("/dashboard/account").await.body).is_empty(), "never shown again");
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &codes[0]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "a recovery code in place of a code: {}", r.body);
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &codes[0]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "each works once");
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &codes[1].to_uppercase().replace('-', " ")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "typed as people type it: {}", r.body);
    let (r, _) = OwnerSession::sign_in(&p, email, "a wrong password!", &codes[2]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "not in place of the password");
    // The database holds none of them.
    let db = p.db_bytes();
    let db = String::from_utf8_lossy(&db);
    assert!(codes.iter().all(|c| !db.contains(c.as_str()) && !db.contains(&c.replace('-', ""))));

    // A new set needs the password and a code; the old set stops working.
    p.advance_clock(60);
    let page = a.post("/dashboard/account/recovery", &[("password", PW_A)]).await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST, "no code: {}", page.body);
    let page =
        a.post("/dashboard/account/recovery", &[("password", PW_A), ("code", &app_code(&secret, 60))]).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let fresh = recovery_codes(&page.body);
    assert_eq!(fresh.len(), 10);
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &codes[3]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "the old set is gone");
    let (r, s) = OwnerSession::sign_in(&p, email, PW_A, &fresh[0]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let a = s.unwrap();

    // The operator's reset: off, every session and key ended, the owner is told.
    let key = a.create_api_key("k").await;
    let out = p.cli_json(&["owners", "reset-2fa", email]);
    assert_eq!((out["email"].as_str(), out["totp"].as_bool()), (Some(email), Some(false)), "{out}");
    assert_eq!(a.get("/dashboard").await.status, StatusCode::SEE_OTHER, "the session ended");
    assert_eq!(owner_api(&p, "GET", PATH_OWNER_NODES, &key, None).await.0, StatusCode::UNAUTHORIZED);
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, &fresh[1]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "the password alone now: {}", r.body);
    let (r, s) = OwnerSession::sign_in(&p, email, PW_A, "").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let a = s.unwrap();
    let account = a.get("/dashboard/account").await.body;
    assert!(account.contains("id=\"totp-reset\""), "the owner sees the reset: {account}");
    assert!(a.get("/dashboard").await.body.contains("id=\"totp-reset\""), "on the servers page too");
    // A bad address is a clear error, with the code of the API's.
    let out = p.cli(["owners", "reset-2fa", "nobody@example.com"]);
    assert!(!out.status.success());

    // The admin API's twin.
    p.advance_clock(60);
    let (_, _) = turn_on_totp(&a, PW_A, 120).await;
    let r = p
        .http_client()
        .patch(format!("{}{PATH_ADMIN_OWNERS}/{email}", p.url()))
        .bearer_auth(p.admin_token())
        .json(&serde_json::json!({"reset_second_factor": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["totp"], false, "{v}");
    assert_eq!(a.get("/dashboard").await.status, StatusCode::SEE_OTHER, "the session ended");
    let (r, _) = OwnerSession::sign_in(&p, email, PW_A, "").await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
}

/// Issue 43: `/dashboard?deleted=<anything>` printed "Server <anything> was deleted" on the
/// owner's own page. Only what the platform did is said: a flash kept with the session.
#[tokio::test]
async fn issue43_the_deleted_notice_says_only_what_the_platform_did() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let a = OwnerSession::accept(&p, &p.invite_owner("flash@example.com"), PW_A).await;
    let phish = "srv-1%20was%20deleted.%20Your%20account%20is%20suspended%2C%20call%20%2B1-555-0100";
    let page = a.get(&format!("/dashboard?deleted={phish}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains("555-0100") && !page.body.contains("id=\"flash\""), "{}", page.body);

    let node: RegisterResponse =
        api.register(&p.owner_join_code("flash@example.com"), "GPU-flash").await.ok();
    let r = a.post(&format!("/dashboard/servers/{}/delete", node.node_id), &[]).await;
    assert_eq!((r.status, r.location.as_deref()), (StatusCode::SEE_OTHER, Some("/dashboard")));
    let page = a.get("/dashboard").await;
    let flash = gpum_tests::owner::text_of(&page.body, "flash").expect("the notice");
    assert!(flash.contains(&node.node_id), "{flash}");
    assert!(!a.get("/dashboard").await.body.contains("id=\"flash\""), "shown once");
}

/// Issue 43, item 10: a newline in the sign-in e-mail started a log line of its own (the e-mail
/// was logged raw), and `serve` wrote terminal colour codes into its log file. Every field of
/// every line is escaped, as the agent's are, and colour is only for a terminal.
#[tokio::test]
async fn log_lines_cannot_be_forged_and_a_log_file_has_no_colour() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let forged = "x@example.com\n2026-01-01T00:00:00Z  INFO gpum_platform: dashboard: an owner signed in \
                  email=boss@example.com\r\x1b[2Jx";
    let (page, s) = OwnerSession::sign_in(&p, forged, "wrong password!", "").await;
    assert_eq!(page.status, StatusCode::UNAUTHORIZED, "{}", page.body);
    assert!(s.is_none());
    let log = p.log();
    assert!(!log.contains('\x1b'), "no escape sequence, colour or other, in a log file: {log:?}");
    assert!(!log.contains('\r'), "{log:?}");
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("an owner's sign-in failed")).collect();
    assert_eq!(failed.len(), 1, "{log}");
    assert!(
        failed[0].contains(r"x@example.com\n2026-01-01t00:00:00z"),
        "escaped in its own line: {}",
        failed[0]
    );
    assert!(
        log.lines().all(|l| !l.starts_with("2026-01-01")
            && (!l.contains("an owner signed in") || l.contains("an owner's sign-in failed"))),
        "no forged line: {log}"
    );
}

/// Issue 44, item 4: one node is read alone (`GET …/nodes/{id}`, the owner's and the operator's),
/// and the lists come a page at a time: every node exactly once across pages, a cursor taken
/// from a node deleted since still works, the limits are checked. Over real HTTP.
#[tokio::test]
async fn issue44_one_node_alone_and_node_lists_by_pages() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let a = OwnerSession::accept(&p, &p.invite_owner("pages-a@example.com"), PW_A).await;
    let b = OwnerSession::accept(&p, &p.invite_owner("pages-b@example.com"), PW_B).await;
    let mut mine = Vec::new();
    for i in 0..5 {
        let r: RegisterResponse =
            api.register(&p.owner_join_code("pages-a@example.com"), &format!("GPU-page-{i}")).await.ok();
        mine.push(r.node_id);
    }
    let theirs: RegisterResponse =
        api.register(&p.owner_join_code("pages-b@example.com"), "GPU-page-b").await.ok();
    let key_a = a.create_api_key("pages").await;
    let key_b = b.create_api_key("pages").await;

    // Every page of A's, two at a time: each of A's servers once, in registration order.
    let walk = |base: String, key: String, limit: u32| {
        let p = &p;
        async move {
            let (mut seen, mut sizes, mut after) = (Vec::new(), Vec::new(), None::<String>);
            loop {
                let q = match &after {
                    Some(c) => format!("{base}?limit={limit}&after={c}"),
                    None => format!("{base}?limit={limit}"),
                };
                let (status, text) = owner_api(p, "GET", &q, &key, None).await;
                assert_eq!(status, StatusCode::OK, "{q}: {text}");
                let page: NodeList = serde_json::from_str(&text).unwrap();
                sizes.push(page.nodes.len());
                seen.extend(page.nodes.into_iter().map(|n| n.id));
                match page.next {
                    Some(n) => after = Some(n),
                    None => return (seen, sizes),
                }
            }
        }
    };
    // Registration order: by second, then by id (several register in the same second).
    let list: NodeList = {
        let (_, text) = owner_api(&p, "GET", PATH_OWNER_NODES, &key_a, None).await;
        serde_json::from_str(&text).unwrap()
    };
    assert_eq!(list.next, None, "five fit the default page");
    let ids = |l: &[String]| {
        let mut v = l.to_vec();
        v.sort();
        v
    };
    assert_eq!(ids(&list.nodes.iter().map(|n| n.id.clone()).collect::<Vec<_>>()), ids(&mine));
    let mine: Vec<String> = list.nodes.iter().map(|n| n.id.clone()).collect();
    let (seen, sizes) = walk(PATH_OWNER_NODES.to_owned(), key_a.clone(), 2).await;
    assert_eq!(seen, mine, "each of A's servers once, in order");
    assert_eq!(sizes, [2, 2, 1]);
    // The operator's list holds them all, B's too.
    let (all, sizes) = walk(PATH_ADMIN_NODES.to_owned(), p.admin_token().to_owned(), 4).await;
    assert_eq!(sizes, [4, 2]);
    let mut want = mine.clone();
    want.push(theirs.node_id.clone());
    assert_eq!(ids(&all), ids(&want));

    // One node alone, as the list shows it; another owner's or a deleted one is not found.
    let one = |key: String, path: String| {
        let p = &p;
        async move { owner_api(p, "GET", &path, &key, None).await }
    };
    let (status, text) = one(key_a.clone(), format!("{PATH_OWNER_NODES}/{}", mine[1])).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let shown: gpum_protocol::NodeSummary = serde_json::from_str(&text).unwrap();
    assert_eq!(shown, list.nodes[1]);
    let (status, text) =
        one(p.admin_token().to_owned(), format!("{PATH_ADMIN_NODES}/{}", theirs.node_id)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (status, text) = one(key_b.clone(), format!("{PATH_OWNER_NODES}/{}", mine[1])).await;
    assert_eq!((status, text.contains("not_found")), (StatusCode::NOT_FOUND, true), "{text}");

    // A cursor from a node deleted since still gives the rest.
    let (_, text) = owner_api(&p, "GET", &format!("{PATH_OWNER_NODES}?limit=2"), &key_a, None).await;
    let first: NodeList = serde_json::from_str(&text).unwrap();
    p.delete_node(&mine[1]);
    let (status, text) = one(key_a.clone(), format!("{PATH_OWNER_NODES}/{}", mine[1])).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted: {text}");
    let q = format!("{PATH_OWNER_NODES}?after={}", first.next.unwrap());
    let (status, text) = owner_api(&p, "GET", &q, &key_a, None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let rest: NodeList = serde_json::from_str(&text).unwrap();
    assert_eq!(rest.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), [&mine[2], &mine[3], &mine[4]]);

    // Limits and cursors are checked, with the documented code.
    for q in ["limit=0", "limit=501", "limit=x", "after=not-a-cursor", "after=", "page=2"] {
        for (base, key) in [(PATH_OWNER_NODES, key_a.as_str()), (PATH_ADMIN_NODES, p.admin_token())] {
            let (status, text) = owner_api(&p, "GET", &format!("{base}?{q}"), key, None).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{base}?{q}: {text}");
            assert!(text.contains("invalid_request"), "{text}");
        }
    }
    let (status, _) = owner_api(&p, "GET", &format!("{PATH_OWNER_NODES}?limit=500"), &key_a, None).await;
    assert_eq!(status, StatusCode::OK);

    // The owners' list comes in pages too, each owner once.
    let (mut emails, mut after) = (Vec::new(), None::<String>);
    loop {
        let q = match &after {
            Some(c) => format!("{PATH_ADMIN_OWNERS}?limit=1&after={c}"),
            None => format!("{PATH_ADMIN_OWNERS}?limit=1"),
        };
        let (status, text) = owner_api(&p, "GET", &q, p.admin_token(), None).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let page: gpum_protocol::OwnerList = serde_json::from_str(&text).unwrap();
        assert_eq!(page.owners.len(), 1);
        emails.push(page.owners[0].email.clone());
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    emails.sort();
    assert_eq!(emails, ["pages-a@example.com", "pages-b@example.com"]);
    let (status, _) =
        owner_api(&p, "GET", &format!("{PATH_ADMIN_OWNERS}?limit=0"), p.admin_token(), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// Issue 44, item 4: the servers page shows a page of servers (100) and a link to the next; the
/// next page links back to the first; a link the platform did not make leads to the first page.
#[tokio::test]
async fn issue44_the_servers_page_shows_a_page_and_a_next_link() {
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let api = Api::new(&p);
    let a = OwnerSession::accept(&p, &p.invite_owner("many@example.com"), PW_A).await;
    let key = a.create_api_key("many").await;
    let c = p.http_client();
    for i in 0..101 {
        let r = c.post(format!("{}{PATH_OWNER_JOIN_CODES}", p.url())).bearer_auth(&key).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let code: gpum_protocol::JoinCodeCreated = r.json().await.unwrap();
        let _: RegisterResponse = api.register(&code.code, &format!("GPU-many-{i:03}")).await.ok();
    }
    let rows = |body: &str| body.matches("class=\"server\"").count();
    let first = a.get("/dashboard").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(rows(&first.body), 100, "a page of 100");
    assert!(!first.body.contains("id=\"first-page\""));
    let next =
        first.body.split("id=\"next-page\" href=\"").nth(1).expect("a next link").split('"').next().unwrap();
    assert!(next.starts_with("/dashboard?after="), "{next}");
    let second = a.get(next).await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(rows(&second.body), 1, "the 101st");
    assert!(second.body.contains("id=\"first-page\"") && !second.body.contains("id=\"next-page\""));
    assert!(second.body.contains(&format!("data-live=\"{next}\"")), "the live refresh reads the same page");
    let bad = a.get("/dashboard?after=not-a-cursor").await;
    assert_eq!((bad.status, bad.location.as_deref()), (StatusCode::SEE_OTHER, Some("/dashboard")));
}
