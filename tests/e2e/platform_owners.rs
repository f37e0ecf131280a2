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
    ("POST", "/dashboard/servers/{id}/rotate-token", &[]),
    ("POST", "/dashboard/servers/{id}/delete", &[]),
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
    assert_eq!(routes.len(), 6, "{routes:?}");
    for (m, path, body) in &routes {
        let path = path.replace("{id}", &node_a.node_id);
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
