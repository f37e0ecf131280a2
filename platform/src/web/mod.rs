//! The owner's dashboard («личный кабинет»): server-rendered HTML under `/dashboard`, served by
//! the platform binary itself (templates, script and stylesheet compiled in; no Node, no CDN).
//!
//! It is another face of the admin API: every change goes through the same `store` functions as
//! the CLI and `/api/v1/admin` (`create_join_code`, `list_nodes`, `delete_node`, `queue_command`,
//! `rotate_token`; `update_node`, the name, price and pause, as `PATCH /api/v1/admin/nodes/{id}`;
//! `add_maintenance` and `delete_maintenance`, as `…/nodes/{id}/maintenance`),
//! so no rule exists twice.
//!
//! Security, because a node's inventory is written by whoever holds a join code:
//! - **Sign-in**: an owner with e-mail, password and (when on) a TOTP code ([`account`]); the
//!   operator with the admin token at `/dashboard/operator`, compared as SHA-256 digests in
//!   constant time. Both through a form (never in a URL); both start a session kept in the
//!   database ([`crate::accounts`]) whose cookie, `__Host-gpum_session`, is `HttpOnly`,
//!   `SameSite=Strict`, `Secure`, `Path=/` and has no `Domain` (a `__Host-` cookie: no other
//!   host of the site, such as a tenant's page under the relay's domain, can set it). Failures
//!   count against the client's address and, for an owner, against the account
//!   ([`crate::throttle`], each sign-in door on its own): past five, the form answers 429 for a
//!   growing while.
//! - **Scope**: an owner's session sees only their servers and join codes ([`Req::scope`] into
//!   every `store` call); the operator's sees all.
//! - **Every state-changing request is a POST with the session's CSRF token**, compared in
//!   constant time; the sign-in form carries a token of its own (a double-submit cookie). A GET
//!   changes nothing on the server (`?lang=` only sets the browser's language cookie; the GET
//!   that a new join code's POST redirects to takes the code out of its one-time flash,
//!   [`Flashes`], which is what makes a reload show it no more).
//! - **Every value is escaped** by maud; nothing uses `PreEscaped`.
//! - **`Content-Security-Policy`**: scripts, styles and fetches only from this origin, no inline
//!   script or style, no framing, forms post only here. `dashboard.js` is the only script.
//! - Every page is `Cache-Control: no-store` (a join code or a new token is shown once).
//!
//! Without `--admin-token-file` the dashboard says it is disabled, as the admin API does.

// The early answers of a handler (`Err(Response)`: the sign-in form, a refusal) are axum
// responses, made at most once per request; boxing them would only add noise.
#![allow(clippy::result_large_err)]

mod account;
mod agent_text;
pub(crate) mod i18n;
pub(crate) mod pages;
pub(crate) mod session;
mod trouble;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use gpum_common::Lang;
use gpum_protocol::{CommandKind, NodeSummary, UpdateNodeRequest};
use maud::Markup;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::accounts::{self, SessionRow};
use crate::error::ApiError;
use crate::server::{AppState, read_body};
use crate::store::{self, Scope};
use crate::throttle::{self, Door, Throttle};
use pages::{Ctx, JoinState, LoginError, Shown};
use session::ct_eq;

// The dashboard's cookies are `__Host-` cookies (issue 43): the browser takes one only from this
// very host, with `Secure`, `Path=/` and no `Domain`, so a page on another host of the same site
// (a tenant's page through the relay's HTTP door under the platform's domain) can neither set
// nor shadow them, and a cookie by any other name is never read. Chromium and Firefox take
// `Secure` cookies from `http://localhost` and `http://127.0.0.1` too, so the loopback setup
// works unchanged.
/// The session's cookie: a random 256-bit id (`session`).
pub const SESSION_COOKIE: &str = "__Host-gpum_session";
/// A sign-in form's key (a double-submit cookie: there is no session yet).
pub const LOGIN_COOKIE: &str = "__Host-gpum_login";
/// The language the switch chose.
pub const LANG_COOKIE: &str = "__Host-gpum_lang";

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

const JS: &str = include_str!("static/dashboard.js");
const CSS: &str = include_str!("static/dashboard.css");

/// The lifetimes the "add a machine" form offers, in seconds.
const TTL_CHOICES: [u64; 3] = [3600, 86_400, 604_800];

pub struct Web {
    app: Arc<AppState>,
    /// Fresh join codes between their POST and the GET it redirects to.
    flashes: Flashes,
    /// Shared with the admin API's bearer check.
    throttle: Arc<Throttle>,
    /// Password hashes checked at once (each Argon2id takes 19 MiB and tens of milliseconds of
    /// a core): a flood of sign-ins queues here instead of taking the machine's memory.
    hashing: tokio::sync::Semaphore,
}

/// Password hashes computed or checked at once.
const HASHING_AT_ONCE: usize = 2;

type St = State<Arc<Web>>;

/// The dashboard's routes, to merge into the platform's router; `throttle` is the admin API's.
pub fn router<S: Clone + Send + Sync + 'static>(app: Arc<AppState>, throttle: Arc<Throttle>) -> Router<S> {
    let web = Arc::new(Web {
        app,
        throttle,
        hashing: tokio::sync::Semaphore::new(HASHING_AT_ONCE),
        flashes: Flashes::default(),
    });
    Router::new()
        .route("/", get(|| async { Redirect::to("/dashboard") }))
        .route("/dashboard", get(servers))
        .route("/dashboard/login", get(account::login_form).post(account::login))
        .route("/dashboard/operator", get(login_form).post(login))
        .route("/dashboard/logout", axum::routing::post(logout))
        .route("/dashboard/invite/{token}", get(account::invite_form).post(account::accept))
        .route("/dashboard/account", get(account::account))
        .route("/dashboard/account/keys", axum::routing::post(account::create_key))
        .route("/dashboard/account/keys/{id}/revoke", axum::routing::post(account::revoke_key))
        .route("/dashboard/account/totp", axum::routing::post(account::totp_start))
        .route("/dashboard/account/totp/confirm", axum::routing::post(account::totp_confirm))
        .route("/dashboard/account/totp/off", axum::routing::post(account::totp_off))
        .route("/dashboard/account/recovery", axum::routing::post(account::recovery_codes))
        .route("/dashboard/account/alerts", axum::routing::post(account::save_alerts))
        .route("/dashboard/add", get(add_form).post(create_code))
        .route("/dashboard/earnings", get(earnings))
        .route("/dashboard/earnings.csv", get(earnings_csv))
        .route("/dashboard/join/{hash}", get(join_state))
        .route("/dashboard/servers/{id}", get(server))
        .route("/dashboard/servers/{id}/command", axum::routing::post(command))
        .route("/dashboard/servers/{id}/settings", axum::routing::post(settings))
        .route("/dashboard/servers/{id}/pause", axum::routing::post(pause))
        .route("/dashboard/servers/{id}/auto-update", axum::routing::post(auto_update))
        .route("/dashboard/servers/{id}/maintenance", axum::routing::post(add_maintenance))
        .route("/dashboard/servers/{id}/maintenance/{window}/delete", axum::routing::post(delete_maintenance))
        .route("/dashboard/servers/{id}/rotate-token", get(rotate_form).post(rotate))
        .route("/dashboard/servers/{id}/delete", get(delete_form).post(delete))
        .route("/dashboard/static/dashboard.js", get(|| async { asset("text/javascript", JS) }))
        .route("/dashboard/static/dashboard.css", get(|| async { asset("text/css", CSS) }))
        // Issue 46: every path under `/dashboard` is a page of the cabinet. The addresses an
        // owner may type lead to the page they mean; any other is "no such page", and an error
        // from anywhere below (a GET of a form's address, an oversized form, a refusal of the
        // API's) is a page in the owner's language ([`trouble::cabinet_pages`]).
        .route("/dashboard/", get(|| async { Redirect::to("/dashboard") }))
        .route("/dashboard/servers", get(|| async { Redirect::to("/dashboard") }))
        .route("/dashboard/join", get(|| async { Redirect::to("/dashboard/add") }))
        .route("/dashboard/{*rest}", axum::routing::any(trouble::unknown_page))
        // Set here, before the platform's JSON one reaches these routes (it fills in only the
        // fallbacks a route has not got).
        .method_not_allowed_fallback(trouble::not_a_form)
        .layer(middleware::from_fn_with_state(web.clone(), trouble::cabinet_pages))
        .layer(middleware::from_fn(security_headers))
        .with_state(web)
}

/// How long a fresh join code waits for the GET its POST redirects to, in seconds.
const FLASH_TTL_SECS: u64 = 60;
/// Fresh codes kept at once (the oldest go first).
const MAX_FLASHES: usize = 64;

/// The one-time flash of a fresh join code: the POST that creates it answers 303 to
/// `/dashboard/join/{hash}` (so a reload resubmits nothing and makes no second code), and
/// leaves the code here, for that session and that hash only, for [`FLASH_TTL_SECS`]. The
/// first GET takes it out and shows it; a reload finds none and says the code was shown once.
/// The code is never in a URL and never in the database (only its hash is): it lives here a
/// minute at most, in memory, keyed by the SHA-256 of the session id.
#[derive(Default)]
struct Flashes(std::sync::Mutex<Vec<Flash>>);

struct Flash {
    session: [u8; 32],
    hash: String,
    code: String,
    expires_at: u64,
    until: u64,
}

impl Flashes {
    fn put(&self, session: &str, hash: &str, code: String, expires_at: u64, now: u64) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|f| f.until > now);
        if v.len() >= MAX_FLASHES {
            v.remove(0);
        }
        let session = Sha256::digest(session.as_bytes()).into();
        v.push(Flash { session, hash: hash.to_owned(), code, expires_at, until: now + FLASH_TTL_SECS });
    }

    /// The code left for this session and hash, taken out; `None` when there is none, or it
    /// waited too long.
    fn take(&self, session: &str, hash: &str, now: u64) -> Option<(String, u64)> {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|f| f.until > now);
        let key: [u8; 32] = Sha256::digest(session.as_bytes()).into();
        let i = v.iter().position(|f| f.session == key && f.hash == hash)?;
        let f = v.remove(i);
        Some((f.code, f.expires_at))
    }
}

fn asset(ct: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static(ct))], body).into_response()
}

/// The headers of every dashboard answer; `?lang=` also sets the language cookie.
async fn security_headers(req: Request, next: axum::middleware::Next) -> Response {
    let lang = query_lang(req.uri().query());
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(l) = lang {
        let v = format!("{LANG_COOKIE}={}; Path=/; Secure; SameSite=Strict; Max-Age=31536000", lang_code(l));
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.append(header::SET_COOKIE, v);
        }
    }
    resp
}

fn lang_code(l: Lang) -> &'static str {
    match l {
        Lang::Ru => "ru",
        Lang::En => "en",
    }
}

fn query_lang(q: Option<&str>) -> Option<Lang> {
    q?.split('&').find_map(|kv| kv.strip_prefix("lang=")).and_then(Lang::parse)
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(name)?.strip_prefix('='))
}

/// The request as a page sees it: its language, its path, and the session, if any (its id and
/// its row).
struct Req {
    ctx: Ctx,
    session: Option<(String, SessionRow)>,
}

impl Req {
    /// Whose servers this request may see: the signed-in owner's, or all for the operator.
    /// Only meaningful behind [`signed_in`].
    fn scope(&self) -> Scope {
        match self.session.as_ref().and_then(|(_, s)| s.owner.clone()) {
            Some(o) => Scope::Owner(o),
            None => Scope::All,
        }
    }

    /// The signed-in owner's id; `None` for the operator or no session.
    fn owner(&self) -> Option<&str> {
        self.session.as_ref().and_then(|(_, s)| s.owner.as_deref())
    }
}

impl FromRequestParts<Arc<Web>> for Req {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web>) -> Result<Self, Self::Rejection> {
        let lang = query_lang(parts.uri.query()).unwrap_or_else(|| {
            i18n::negotiate(
                cookie(&parts.headers, LANG_COOKIE),
                parts.headers.get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()),
            )
        });
        let now = web.app.clock.now();
        // Sessions live in the database, so a restart signs no one out. An id that is not 64
        // hex digits is no session of ours and costs no lookup.
        let session = match cookie(&parts.headers, SESSION_COOKIE) {
            Some(id) if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) => {
                let i = id.to_owned();
                match web.app.db.call(move |c| accounts::session(c, now, &i)).await {
                    Ok(Some(s)) => Some((id.to_owned(), s)),
                    _ => None,
                }
            }
            _ => None,
        };
        let csrf = session.as_ref().map(|(_, s)| s.csrf.clone());
        let account = session.as_ref().and_then(|(_, s)| s.email.clone());
        let currency = web.app.cfg.currency;
        Ok(Req { ctx: Ctx { lang, path: parts.uri.path().to_owned(), csrf, account, currency }, session })
    }
}

fn page(status: StatusCode, m: Markup) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], m.into_string()).into_response()
}

fn to_login() -> Response {
    Redirect::to("/dashboard/login").into_response()
}

/// A session cookie for `id` (empty and expired: signs out).
fn session_cookie(id: &str) -> HeaderValue {
    cookie_header(SESSION_COOKIE, id, if id.is_empty() { 0 } else { accounts::SESSION_TTL_SECS })
}

/// The guard of every signed-in page: `Err` is the answer to give instead (disabled, or off to
/// the sign-in form).
fn signed_in(web: &Web, r: &Req) -> Result<(), Response> {
    if web.app.cfg.admin_token_hash.is_none() {
        return Err(page(StatusCode::FORBIDDEN, pages::disabled(&r.ctx)));
    }
    if r.session.is_none() {
        return Err(to_login());
    }
    Ok(())
}

/// A signed-in request (the extractor of every signed-in page): refused as [`signed_in`] says
/// (disabled, or off to the sign-in form) before the handler runs.
struct SignedIn(Req);

impl std::ops::Deref for SignedIn {
    type Target = Req;
    fn deref(&self) -> &Req {
        &self.0
    }
}

impl FromRequestParts<Arc<Web>> for SignedIn {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web>) -> Result<Self, Response> {
        let Ok(r) = Req::from_request_parts(parts, web).await;
        signed_in(web, &r)?;
        Ok(SignedIn(r))
    }
}

/// A POSTed form whose `csrf` field matched the session's token (the extractor of every
/// signed-in form), behind the guard `G` ([`SignedIn`], or [`account::Owner`]): the guard
/// refuses first, then the body is read within the body timeout and limit, then a missing or
/// wrong token, or a form that does not parse, is answered with the stale-form page (403).
/// The sign-in forms (no session yet) have their own ([`sign_in_form`]).
struct CsrfForm<T, G = SignedIn> {
    signed: G,
    form: T,
    /// The client's address as the throttle counts it.
    client: std::net::IpAddr,
}

impl<T, G> axum::extract::FromRequest<Arc<Web>> for CsrfForm<T, G>
where
    T: DeserializeOwned,
    G: FromRequestParts<Arc<Web>, Rejection = Response> + std::ops::Deref<Target = Req> + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, web: &Arc<Web>) -> Result<Self, Response> {
        let client = throttle::client_key(&req);
        let (mut parts, body) = req.into_parts();
        let signed = G::from_request_parts(&mut parts, web).await?;
        let form = form(web, &signed, Request::from_parts(parts, body)).await?;
        Ok(CsrfForm { signed, form, client })
    }
}

fn api_error(r: &Req, e: ApiError) -> Response {
    if e.code == gpum_protocol::ErrorCode::NotFound {
        return page(StatusCode::NOT_FOUND, pages::not_found(&r.ctx));
    }
    e.into_response()
}

/// The `csrf` field of a form body, whatever else it holds.
fn form_key(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Csrf {
        csrf: String,
    }
    serde_urlencoded::from_bytes::<Csrf>(bytes).ok().map(|c| c.csrf)
}

/// A POSTed form of a signed-in request ([`CsrfForm`]): read within the body timeout and limit,
/// parsed, and its `csrf` field checked against the session's token. `Err` is the answer to
/// give instead.
async fn form<T: DeserializeOwned>(web: &Web, r: &Req, req: Request) -> Result<T, Response> {
    let bytes = read_body(req, web.app.cfg.body_timeout).await.map_err(IntoResponse::into_response)?;
    let stale = || page(StatusCode::FORBIDDEN, pages::stale(&r.ctx));
    let Some(csrf) = form_key(&bytes) else { return Err(stale()) };
    let want = r.session.as_ref().map(|(_, s)| s.csrf.as_str()).unwrap_or("");
    if want.is_empty() || !ct_eq(&csrf, want) {
        return Err(stale());
    }
    trouble::parse_form(&r.ctx, &bytes)
}

/// A `__Host-` cookie's header: `Secure`, `Path=/`, no `Domain`, never read by scripts, never
/// sent from another site.
fn cookie_header(name: &str, value: &str, max_age: u64) -> HeaderValue {
    let v = format!("{name}={value}; Path=/; Secure; HttpOnly; SameSite=Strict; Max-Age={max_age}");
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

// ---------------------------------------------------------------------------------------------
// Sign-in

// ---------------------------------------------------------------------------------------------
// The operator's sign-in, with the admin token (`/dashboard/operator`): sees every server.
// Owners sign in with their e-mail and password (`account`), and the page never asks them for
// the admin token.

async fn login_form(State(web): St, r: Req) -> Response {
    if web.app.cfg.admin_token_hash.is_none() {
        return page(StatusCode::FORBIDDEN, pages::disabled(&r.ctx));
    }
    if r.session.is_some() {
        return Redirect::to("/dashboard").into_response();
    }
    login_page(&r, StatusCode::OK, None)
}

fn login_page(r: &Req, status: StatusCode, error: Option<LoginError>) -> Response {
    let token = session::random_hex();
    let mut resp = page(status, pages::operator_login(&r.ctx, &token, error));
    resp.headers_mut().append(header::SET_COOKIE, cookie_header(LOGIN_COOKIE, &token, 3600));
    resp
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(web): St, r: Req, req: Request) -> Response {
    let Some(want) = web.app.cfg.admin_token_hash else {
        return page(StatusCode::FORBIDDEN, pages::disabled(&r.ctx));
    };
    // A blocked address is refused before its token is looked at, or even read.
    let (client, f) = match sign_in_form::<LoginForm>(&web, &r, Door::OperatorSignIn, req, |secs| {
        login_page(&r, StatusCode::TOO_MANY_REQUESTS, Some(LoginError::TooMany(secs)))
    })
    .await
    {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let got: [u8; 32] = Sha256::digest(f.token.trim().as_bytes()).into();
    if got.iter().zip(want.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        web.throttle.failed(Door::OperatorSignIn, client, None).await;
        return login_page(&r, StatusCode::UNAUTHORIZED, Some(LoginError::WrongToken));
    }
    web.throttle.succeeded(Door::OperatorSignIn, client, None).await;
    tracing::info!(client = %client_text(client), "dashboard: the operator signed in");
    start_session(&web, &r, None).await
}

fn client_text(c: std::net::IpAddr) -> String {
    c.to_string()
}

/// What every sign-in form (the operator's, an owner's) does first: a blocked address is refused
/// before its form is even read (429 with `Retry-After`, the page `too_many(secs)` makes); then
/// the form must carry the key this browser was given with it (a double-submit cookie, since
/// there is no session yet). `Ok` is the client's address and the parsed form.
async fn sign_in_form<T: DeserializeOwned>(
    web: &Web,
    r: &Req,
    door: Door,
    req: Request,
    too_many: impl FnOnce(u64) -> Response,
) -> Result<(std::net::IpAddr, T), Response> {
    let client = throttle::client_key(&req);
    if let Err(wait) = web.throttle.check(door, client, None).await {
        let secs = throttle::retry_after(wait);
        let mut resp = too_many(secs);
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return Err(resp);
    }
    let login_cookie = cookie(req.headers(), LOGIN_COOKIE).unwrap_or("").to_owned();
    let bytes = read_body(req, web.app.cfg.body_timeout).await.map_err(IntoResponse::into_response)?;
    let stale = || page(StatusCode::FORBIDDEN, pages::stale(&r.ctx));
    let Some(csrf) = form_key(&bytes) else { return Err(stale()) };
    if login_cookie.is_empty() || !ct_eq(&csrf, &login_cookie) {
        return Err(stale());
    }
    trouble::parse_form(&r.ctx, &bytes).map(|f| (client, f))
}

/// Starts a session (`owner`: `None` for the operator) and sends the browser to the servers.
async fn start_session(web: &Web, r: &Req, owner: Option<String>) -> Response {
    let now = web.app.clock.now();
    let id = match web.app.db.call(move |c| accounts::create_session(c, now, owner.as_deref())).await {
        Ok(id) => id,
        Err(e) => return api_error(r, e),
    };
    let mut resp = Redirect::to("/dashboard").into_response();
    let h = resp.headers_mut();
    h.append(header::SET_COOKIE, session_cookie(&id));
    h.append(header::SET_COOKIE, cookie_header(LOGIN_COOKIE, "", 0));
    resp
}

#[derive(Deserialize)]
struct Empty {}

async fn logout(State(web): St, CsrfForm { signed: r, .. }: CsrfForm<Empty>) -> Response {
    if let Some((id, _)) = &r.session {
        let i = id.clone();
        if let Err(e) = web.app.db.call(move |c| accounts::end_session(c, &i)).await {
            return api_error(&r, e);
        }
    }
    let mut resp = to_login();
    resp.headers_mut().append(header::SET_COOKIE, session_cookie(""));
    resp
}

// ---------------------------------------------------------------------------------------------
// Servers

/// One page of the servers in `scope`.
async fn nodes(
    web: &Web,
    scope: Scope,
    page: store::Page,
) -> Result<(gpum_protocol::NodeList, u64), ApiError> {
    let now = web.app.clock.now();
    let list = web.app.db.call(move |c| store::list_nodes_page(c, now, &scope, &page)).await?;
    Ok((list, now))
}

/// The servers page. Its one notice, "server X was deleted", is what this session did, kept with
/// the session and taken once (issue 43): nothing in the address is printed, so a link cannot
/// make the owner's own page say something the platform did not do.
async fn servers(State(web): St, r: SignedIn, RawQuery(q): RawQuery) -> Response {
    // A page of servers at a time (issue 44): `?after=` is the cursor the "next" link carries.
    // A cursor the platform did not give (a hand-edited or mangled link) leads to the first page.
    let want = match crate::server::page_query(q.as_deref(), false) {
        Ok(p) => p,
        Err(_) => return Redirect::to("/dashboard").into_response(),
    };
    let after = want.after.as_ref().map(store::Cursor::encode);
    let sid = r.session.as_ref().map(|(id, _)| id.clone()).unwrap_or_default();
    let deleted = match web.app.db.call(move |c| accounts::take_flash_deleted(c, &sid)).await {
        Ok(d) => d,
        Err(e) => return api_error(&r, e),
    };
    let reset_at = r.session.as_ref().and_then(|(_, s)| s.totp_reset_at);
    match nodes(&web, r.scope(), want).await {
        Ok((list, now)) => {
            let at = pages::PageAt { after: after.as_deref(), next: list.next.as_deref() };
            page(StatusCode::OK, pages::servers(&r.ctx, &list.nodes, at, now, deleted.as_deref(), reset_at))
        }
        Err(e) => api_error(&r, e),
    }
}

/// Issue 46: the earnings of the session's servers (the operator's: every server's).
async fn read_earnings(web: &Web, r: &Req) -> Result<gpum_protocol::Earnings, ApiError> {
    let now = web.app.clock.now();
    let scope = r.scope();
    web.app.db.call(move |c| store::earnings(c, now, &scope, None)).await
}

async fn earnings(State(web): St, r: SignedIn) -> Response {
    match read_earnings(&web, &r).await {
        Ok(e) => page(StatusCode::OK, pages::earnings(&r.ctx, &e)),
        Err(e) => api_error(&r, e),
    }
}

/// The same as CSV (the owner API's `?format=csv`), as a download.
async fn earnings_csv(State(web): St, r: SignedIn) -> Response {
    match read_earnings(&web, &r).await {
        Ok(e) => (
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (header::CONTENT_DISPOSITION, "attachment; filename=\"gpum-earnings.csv\""),
            ],
            store::earnings_csv(&e),
        )
            .into_response(),
        Err(e) => api_error(&r, e),
    }
}

/// Whether the platform's operator has chosen a check image (without one, a recheck runs no
/// check, whatever the agent acknowledges).
async fn check_image(web: &Web) -> bool {
    web.app.db.call(store::probe_image).await.is_ok_and(|i| i.is_some())
}

async fn one_node(web: &Web, r: &Req, id: &str) -> Result<(NodeSummary, u64), ApiError> {
    let now = web.app.clock.now();
    let (id, scope) = (id.to_owned(), r.scope());
    let n = web.app.db.call(move |c| store::node(c, now, &id, &scope)).await?;
    Ok((n, now))
}

/// How many events the server's page shows.
const EVENTS_SHOWN: usize = 50;

/// A node with what its page shows of its past (the day's samples, the newest events), read in
/// one database call.
async fn node_with_history(
    web: &Web,
    r: &Req,
    id: &str,
) -> Result<(NodeSummary, pages::History, u64), ApiError> {
    let now = web.app.clock.now();
    let (id, scope) = (id.to_owned(), r.scope());
    web.app
        .db
        .call(move |c| {
            let n = store::node(c, now, &id, &scope)?;
            let samples = store::node_samples(c, &id, now, &scope)?.samples;
            let events = store::node_events(c, &id, now, EVENTS_SHOWN, &scope)?.events;
            let rentals = crate::rentals::list(c, now, Some(&id), pages::RENTALS_SHOWN, &scope)?.rentals;
            let rollout = store::current_rollout(c, now)?;
            Ok((n, pages::History { samples, events, rentals, rollout }, now))
        })
        .await
}

async fn server(State(web): St, r: SignedIn, Path(id): Path<String>) -> Response {
    match node_with_history(&web, &r, &id).await {
        Ok((n, h, now)) => {
            page(StatusCode::OK, pages::server(&r.ctx, &n, &h, now, None, check_image(&web).await))
        }
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct CommandForm {
    kind: String,
}

async fn command(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<CommandForm>,
) -> Response {
    // A kind the platform has no command for is refused here, by the value that was sent (the
    // store would only see it emptied).
    let Some(kind) = CommandKind::parse(&f.kind) else {
        return trouble::bad_form(&r.ctx, pages::BadForm::UnknownCommand(f.kind));
    };
    let kind = kind.as_str().to_owned();
    let now = web.app.clock.now();
    let i = id.clone();
    let scope = r.scope();
    // A command reaches the agent only at its heartbeat, so an offline server is refused one
    // (the page disables its buttons; a crafted POST queues nothing either), by the store's
    // rule, the same for the admin API and the CLI.
    match web.app.db.call(move |c| store::queue_command(c, now, &i, &kind, &scope)).await {
        Ok(_) => Redirect::to(&format!("/dashboard/servers/{id}")).into_response(),
        Err(e) if e.code == gpum_protocol::ErrorCode::NodeOffline => {
            page(StatusCode::CONFLICT, pages::command_refused(&r.ctx, &id))
        }
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct SettingsForm {
    name: String,
    price: String,
    min_rental: String,
}

/// The settings form: an empty name gives the host name back, an empty price takes the server
/// off rent. A refused value shows the page again (400) with why, and changes nothing.
async fn settings(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<SettingsForm>,
) -> Response {
    let typed = |error| pages::Refused {
        error,
        name: f.name.clone(),
        price: f.price.clone(),
        min_rental: f.min_rental.clone(),
    };
    let price = match f.price.trim() {
        "" => Ok(None),
        p => pages::parse_price(p, web.app.cfg.currency).map(Some).ok_or(store::SettingsError::Price),
    };
    let min = f.min_rental.trim().parse::<u32>().map_err(|_| store::SettingsError::MinRental);
    let name = if f.name.trim().is_empty() { None } else { Some(f.name.clone()) };
    let upd = price.and_then(|price| {
        let u = UpdateNodeRequest {
            name: Some(name),
            price_per_gpu_hour: Some(price),
            min_rental_minutes: Some(min?),
            paused: None,
            auto_update: None,
        };
        store::check_update(&u).map(|_| u)
    });
    let upd = match upd {
        Ok(u) => u,
        Err(e) => {
            let refused = typed(e);
            return match node_with_history(&web, &r, &id).await {
                Ok((n, h, now)) => page(
                    StatusCode::BAD_REQUEST,
                    pages::server(&r.ctx, &n, &h, now, Some(&refused), check_image(&web).await),
                ),
                Err(e) => api_error(&r, e),
            };
        }
    };
    let (i, scope) = (id.clone(), r.scope());
    match web.app.db.call(move |c| store::update_node(c, &i, &upd, &scope)).await {
        Ok(_) => Redirect::to(&format!("/dashboard/servers/{id}")).into_response(),
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct PauseForm {
    /// `true` or `false`; anything else is refused with why (400), not as a stale form.
    paused: String,
}

async fn pause(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<PauseForm>,
) -> Response {
    let paused = match f.paused.as_str() {
        "true" => true,
        "false" => false,
        _ => return trouble::bad_form(&r.ctx, pages::BadForm::Value { field: "paused", value: f.paused }),
    };
    let upd = UpdateNodeRequest { paused: Some(paused), ..Default::default() };
    let (i, scope) = (id.clone(), r.scope());
    match web.app.db.call(move |c| store::update_node(c, &i, &upd, &scope)).await {
        Ok(_) => Redirect::to(&format!("/dashboard/servers/{id}")).into_response(),
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct AutoUpdateForm {
    /// `true` or `false`; anything else is refused with why (400).
    auto_update: String,
}

/// Issue 47: the owner's switch "automatic upgrades", as `PATCH …/nodes/{id}` with
/// `auto_update`.
async fn auto_update(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<AutoUpdateForm>,
) -> Response {
    let on = match f.auto_update.as_str() {
        "true" => true,
        "false" => false,
        _ => {
            return trouble::bad_form(
                &r.ctx,
                pages::BadForm::Value { field: "auto_update", value: f.auto_update },
            );
        }
    };
    let upd = UpdateNodeRequest { auto_update: Some(on), ..Default::default() };
    let (i, scope) = (id.clone(), r.scope());
    match web.app.db.call(move |c| store::update_node(c, &i, &upd, &scope)).await {
        Ok(_) => Redirect::to(&format!("/dashboard/servers/{id}")).into_response(),
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct MaintenanceForm {
    /// `datetime-local` values, read as UTC.
    starts: String,
    ends: String,
}

/// Issue 46: plans a maintenance window by the store's (and the core's) rules, as the API does.
/// A refused value shows the page again (400) with why at its field and what was typed.
async fn add_maintenance(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<MaintenanceForm>,
) -> Response {
    use gpum_platform_core::maintenance::parse_utc;
    use pages::MaintenanceError;
    let now = web.app.clock.now();
    let req = match (parse_utc(&f.starts), parse_utc(&f.ends)) {
        (None, _) => Err(MaintenanceError::Start),
        (_, None) => Err(MaintenanceError::End),
        (Some(starts_at), Some(ends_at)) => {
            Ok(gpum_protocol::CreateMaintenanceRequest { starts_at, ends_at })
        }
    };
    let error = match req {
        Err(e) => e,
        Ok(req) => {
            let (i, scope) = (id.clone(), r.scope());
            match web.app.db.call(move |c| store::add_maintenance(c, now, &i, &req, &scope)).await {
                Ok(Ok(_)) => {
                    return Redirect::to(&format!("/dashboard/servers/{id}#maintenance")).into_response();
                }
                Ok(Err(e)) => MaintenanceError::Window(e),
                Err(e) => return api_error(&r, e),
            }
        }
    };
    let refused = pages::MaintenanceRefused { error, starts: f.starts, ends: f.ends };
    match node_with_history(&web, &r, &id).await {
        Ok((n, h, now)) => page(
            StatusCode::BAD_REQUEST,
            pages::server_typed(
                &r.ctx,
                &n,
                &h,
                now,
                Some(pages::TypedForm::Maintenance(&refused)),
                check_image(&web).await,
            ),
        ),
        Err(e) => api_error(&r, e),
    }
}

async fn delete_maintenance(
    State(web): St,
    Path((id, window)): Path<(String, String)>,
    CsrfForm { signed: r, .. }: CsrfForm<Empty>,
) -> Response {
    let (i, scope) = (id.clone(), r.scope());
    match web.app.db.call(move |c| store::delete_maintenance(c, &i, &window, &scope)).await {
        Ok(()) => Redirect::to(&format!("/dashboard/servers/{id}#maintenance")).into_response(),
        Err(e) => api_error(&r, e),
    }
}

async fn rotate_form(State(web): St, r: SignedIn, Path(id): Path<String>) -> Response {
    match one_node(&web, &r, &id).await {
        Ok((n, _)) => page(StatusCode::OK, pages::confirm_rotate(&r.ctx, &n.id)),
        Err(e) => api_error(&r, e),
    }
}

async fn rotate(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, .. }: CsrfForm<Empty>,
) -> Response {
    let now = web.app.clock.now();
    let (i, scope) = (id.clone(), r.scope());
    match web.app.db.call(move |c| store::rotate_token(c, now, &i, &scope)).await {
        Ok(t) => page(StatusCode::OK, pages::rotated(&r.ctx, &id, &t.node_token, &web.app.cfg.public_url)),
        Err(e) => api_error(&r, e),
    }
}

async fn delete_form(State(web): St, r: SignedIn, Path(id): Path<String>) -> Response {
    match one_node(&web, &r, &id).await {
        Ok((n, _)) => page(StatusCode::OK, pages::confirm_delete(&r.ctx, &n.id)),
        Err(e) => api_error(&r, e),
    }
}

async fn delete(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, .. }: CsrfForm<Empty>,
) -> Response {
    let now = web.app.clock.now();
    let (i, scope) = (id.clone(), r.scope());
    let sid = r.session.as_ref().map(|(s, _)| s.clone()).unwrap_or_default();
    let deleted = web
        .app
        .db
        .call(move |c| {
            store::delete_node(c, now, &i, &scope)?;
            accounts::set_flash_deleted(c, &sid, &i)
        })
        .await;
    match deleted {
        Ok(()) => Redirect::to("/dashboard").into_response(),
        Err(e) => api_error(&r, e),
    }
}

// ---------------------------------------------------------------------------------------------
// Adding a machine

/// What the install command fetches from `/dl/`: `install.sh` the installer and its checksum,
/// the installer the signed manifest and the agent (docs/operator-guide.md, "Serving releases").
pub(crate) const DIST_FILES: [&str; 5] =
    ["gpum-install", "gpum-install.sha256", "manifest.json", "manifest.json.sig", "gpum-agent"];

/// Whether `/dl/` serves every file of [`DIST_FILES`] now: looked at on each page, so a dist
/// filled in after start counts, and by the rule `/dl/` serves by (regular files only).
async fn dist(web: &Web) -> pages::Dist {
    let Some(dir) = web.app.cfg.dist.clone() else { return pages::Dist::Off };
    let lacks = tokio::task::spawn_blocking(move || {
        DIST_FILES
            .into_iter()
            .filter(|f| crate::server::open_regular(&dir.join(f)).is_none())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_else(|_| DIST_FILES.to_vec());
    if lacks.is_empty() { pages::Dist::Served } else { pages::Dist::Lacks(lacks) }
}

async fn add_form(State(web): St, r: SignedIn) -> Response {
    let (now, scope) = (web.app.clock.now(), r.scope());
    match web.app.db.call(move |c| store::open_join_codes(c, now, &scope)).await {
        Ok(open) => page(StatusCode::OK, pages::add(&r.ctx, &dist(&web).await, &open, now)),
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct AddForm {
    /// One of [`TTL_CHOICES`]; anything else is refused with why (400).
    ttl: String,
}

/// Creates a code and answers 303 to its page, leaving the code in the one-time flash
/// ([`Flashes`]): a reload of that page makes no second code and shows this one no more.
async fn create_code(State(web): St, CsrfForm { signed: r, form: f, .. }: CsrfForm<AddForm>) -> Response {
    let Some(ttl) = f.ttl.parse::<u64>().ok().filter(|t| TTL_CHOICES.contains(t)) else {
        return trouble::bad_form(&r.ctx, pages::BadForm::Value { field: "ttl", value: f.ttl });
    };
    let now = web.app.clock.now();
    let scope = r.scope();
    let created = match web.app.db.call(move |c| store::create_join_code(c, now, ttl, &scope)).await {
        Ok(c) => c,
        Err(e) if e.code == gpum_protocol::ErrorCode::OwnerLimitReached => {
            let max = web.app.db.call(store::owner_limits).await.map_or(0, |l| l.open_codes);
            return page(StatusCode::CONFLICT, pages::open_codes_limit(&r.ctx, max));
        }
        Err(e) => return api_error(&r, e),
    };
    let hash = store::hash_secret(&created.code);
    if let Some((sid, _)) = &r.session {
        web.flashes.put(sid, &hash, created.code, created.expires_at, now);
    }
    Redirect::to(&format!("/dashboard/join/{hash}")).into_response()
}

/// Where a join code stands: the live status at the top, then the code and its command if this
/// is the GET right after its POST ([`Flashes`]), else why they are not shown. The code is named
/// by its hash (what the database holds), so the code itself never appears in a URL.
async fn join_state(State(web): St, r: SignedIn, Path(hash): Path<String>) -> Response {
    let no_such_code = || page(StatusCode::NOT_FOUND, pages::not_found_as(&r.ctx, i18n::Msg::NoSuchJoinCode));
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return no_such_code();
    }
    let (h, scope) = (hash.clone(), r.scope());
    let used = match web.app.db.call(move |c| store::join_code_use(c, &h, &scope)).await {
        Ok(Some(u)) => u,
        Ok(None) => return no_such_code(),
        Err(e) => return api_error(&r, e),
    };
    let now = web.app.clock.now();
    // The node the code registered, if any: looked up alone, not found in a list of all.
    let node = match used.1.clone() {
        Some(id) => {
            let scope = r.scope();
            match web.app.db.call(move |c| store::node(c, now, &id, &scope)).await {
                Ok(n) => Some(n),
                Err(e) if e.code == gpum_protocol::ErrorCode::NotFound => None,
                Err(e) => return api_error(&r, e),
            }
        }
        None => None,
    };
    let open = used.1.is_none() && now < used.0;
    let status = match used {
        (_, Some(id)) => match &node {
            Some(n) if n.last_heartbeat_at.is_some() => pages::join_status(&r.ctx, JoinState::Node(n)),
            Some(_) => pages::join_status(&r.ctx, JoinState::Registered(&id)),
            None => pages::join_status(&r.ctx, JoinState::Deleted),
        },
        (expires_at, None) if now >= expires_at => pages::join_status(&r.ctx, JoinState::Expired),
        (_, None) => pages::join_status(&r.ctx, JoinState::Waiting),
    };
    let fresh = r.session.as_ref().and_then(|(sid, _)| web.flashes.take(sid, &hash, now));
    // Looked at only when the command is shown, not at each refresh.
    let dist = if fresh.is_some() { dist(&web).await } else { pages::Dist::Off };
    let shown = match &fresh {
        Some((code, expires_at)) => {
            Shown::Code { code, expires_at: *expires_at, public_url: &web.app.cfg.public_url, dist: &dist }
        }
        None => Shown::Once,
    };
    page(StatusCode::OK, pages::join_page(&r.ctx, &hash, status, open, shown, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::db::Db;
    use crate::server::Config;
    use axum::body::Body;
    use std::time::Duration;
    use tower::ServiceExt;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn app(dir: &std::path::Path, admin: bool) -> Router {
        app_with(dir, admin, None)
    }

    fn app_with(dir: &std::path::Path, admin: bool, dist: Option<std::path::PathBuf>) -> Router {
        let conn = store::open(&dir.join("p.db")).unwrap();
        let db = Db::start(conn);
        let state = Arc::new(AppState {
            db: db.clone(),
            clock: Clock::system(),
            cfg: Config {
                heartbeat_interval_secs: 10,
                admin_token_hash: admin.then(|| Sha256::digest(TOKEN.as_bytes()).into()),
                dist,
                public_url: "https://gpum.example".into(),
                body_timeout: Duration::from_secs(5),
                currency: gpum_platform_core::currency::DEFAULT,
            },
            relay: Arc::new(crate::relay::Relay::new(Default::default())),
            throttle: Arc::new(Throttle::new(db, Clock::system())),
            alerts: Default::default(),
        });
        crate::server::router(state)
    }

    async fn call(app: &Router, method: &str, path: &str, cookie: &str, body: &str) -> Response {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body.to_owned()))
            .unwrap();
        app.clone().oneshot(req).await.unwrap()
    }

    async fn text(r: Response) -> String {
        String::from_utf8(axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap().to_vec()).unwrap()
    }

    fn set_cookie(r: &Response, name: &str) -> String {
        r.headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .find(|c| c.starts_with(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} cookie"))
    }

    fn value(set_cookie: &str) -> String {
        set_cookie.split(';').next().unwrap().split_once('=').unwrap().1.to_owned()
    }

    /// Signs in; returns the session cookie's value and the page's CSRF token.
    async fn sign_in(app: &Router) -> (String, String) {
        let form = call(app, "GET", "/dashboard/operator", "", "").await;
        let login = value(&set_cookie(&form, LOGIN_COOKIE));
        let r = call(
            app,
            "POST",
            "/dashboard/operator",
            &format!("{LOGIN_COOKIE}={login}"),
            &format!("csrf={login}&token={TOKEN}"),
        )
        .await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let c = set_cookie(&r, SESSION_COOKIE);
        for flag in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/"] {
            assert!(c.split("; ").any(|f| f == flag), "{flag}: {c}");
        }
        let sid = value(&c);
        let page =
            text(call(app, "GET", "/dashboard/add", &format!("{SESSION_COOKIE}={sid}"), "").await).await;
        let csrf = page.split("name=\"csrf\" value=\"").nth(1).unwrap()[..64].to_owned();
        (sid, csrf)
    }

    /// Creates a code as the form does: 303 to its page, whose first GET shows it; returns
    /// that page.
    async fn create(app: &Router, cookie: &str, csrf: &str) -> String {
        let r = call(app, "POST", "/dashboard/add", cookie, &format!("ttl=3600&csrf={csrf}")).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let to = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
        let r = call(app, "GET", &to, cookie, "").await;
        assert_eq!(r.status(), StatusCode::OK);
        text(r).await
    }

    /// A `--dist` directory holding `files`, each a few bytes.
    fn dist_with(dir: &std::path::Path, files: &[&str]) -> std::path::PathBuf {
        let d = dir.join("dist");
        std::fs::create_dir_all(&d).unwrap();
        for f in files {
            std::fs::write(d.join(f), b"x").unwrap();
        }
        d
    }

    /// Issue 43: with the relay's pages on a subdomain of the platform's site, a tenant's
    /// script could set `gpum_login` or `gpum_session` for `Domain=<the site>` (a sign-in into
    /// the attacker's account). Every cookie of the dashboard is a `__Host-` cookie (`Secure`,
    /// `Path=/`, no `Domain`), which no other host can set, and one by any other name is not
    /// read.
    #[tokio::test]
    async fn every_cookie_is_a_host_cookie_and_no_other_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path(), true);
        let form = call(&app, "GET", "/dashboard/operator?lang=ru", "", "").await;
        let set: Vec<String> = form
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(set.len(), 2, "the form's key and the language: {set:?}");
        let (sid, _) = sign_in(&app).await;
        let form = call(&app, "GET", "/dashboard/operator", "", "").await;
        let login = value(&set_cookie(&form, LOGIN_COOKIE));
        let r = call(
            &app,
            "POST",
            "/dashboard/operator",
            &format!("{LOGIN_COOKIE}={login}"),
            &format!("csrf={login}&token={TOKEN}"),
        )
        .await;
        let mut all = set.clone();
        all.extend(r.headers().get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_owned()));
        assert!(all.len() >= 4, "{all:?}");
        for c in &all {
            let mut parts = c.split("; ");
            let name = parts.next().unwrap().split_once('=').unwrap().0;
            let attrs: Vec<&str> = parts.collect();
            assert!(name.starts_with("__Host-gpum_"), "{c}");
            assert!(attrs.contains(&"Secure") && attrs.contains(&"Path=/"), "{c}");
            assert!(attrs.contains(&"SameSite=Strict"), "{c}");
            assert!(!attrs.iter().any(|a| a.to_ascii_lowercase().starts_with("domain=")), "{c}");
        }
        // The session under another name (what a script on another host can set) is no session,
        // nor is a sign-in form's key.
        for cookie in [format!("gpum_session={sid}"), format!("x{SESSION_COOKIE}={sid}")] {
            let r = call(&app, "GET", "/dashboard", &cookie, "").await;
            assert_eq!(r.status(), StatusCode::SEE_OTHER, "{cookie}");
            assert_eq!(r.headers()[header::LOCATION], "/dashboard/login", "{cookie}");
        }
        let r = call(&app, "GET", "/dashboard", &format!("{SESSION_COOKIE}={sid}"), "").await;
        assert_eq!(r.status(), StatusCode::OK);
        let form = call(&app, "GET", "/dashboard/operator", "", "").await;
        let login = value(&set_cookie(&form, LOGIN_COOKIE));
        let r = call(
            &app,
            "POST",
            "/dashboard/operator",
            &format!("gpum_login={login}"),
            &format!("csrf={login}&token={TOKEN}"),
        )
        .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "a form key under another name is no key");
    }

    #[tokio::test]
    async fn sign_in_csrf_and_headers() {
        let dir = tempfile::tempdir().unwrap();
        let app = app_with(dir.path(), true, Some(dist_with(dir.path(), &DIST_FILES)));
        let r = call(&app, "GET", "/dashboard", "", "").await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        // A wrong token, and a form this browser was not given.
        let form = call(&app, "GET", "/dashboard/operator", "", "").await;
        let login = value(&set_cookie(&form, LOGIN_COOKIE));
        let cookie = format!("{LOGIN_COOKIE}={login}");
        let r =
            call(&app, "POST", "/dashboard/operator", &cookie, &format!("csrf={login}&token=wrong")).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        let r = call(&app, "POST", "/dashboard/operator", "", &format!("csrf={login}&token={TOKEN}")).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);

        let (sid, csrf) = sign_in(&app).await;
        let cookie = format!("{SESSION_COOKIE}={sid}");
        let r = call(&app, "POST", "/dashboard/add", &cookie, "ttl=3600&csrf=00").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "a wrong form key");
        let r = call(&app, "POST", "/dashboard/add", &cookie, "ttl=3600").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "no form key");
        let r = call(&app, "POST", "/dashboard/add", &cookie, &format!("ttl=5&csrf={csrf}")).await;
        assert_eq!(
            r.status(),
            StatusCode::BAD_REQUEST,
            "a lifetime the form does not offer, with why (issue 46)"
        );
        let page = create(&app, &cookie, &csrf).await;
        assert!(page.contains("{ echo gpum_code=GPUM-"));
        assert!(page.contains("; curl -fsSL https://gpum.example/install.sh; } | sudo bash -s --"));
        assert!(page.contains("data-state=\"waiting\""));
        // Sign-out needs the key too, then ends the session.
        let r = call(&app, "POST", "/dashboard/logout", &cookie, "csrf=00").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let r = call(&app, "POST", "/dashboard/logout", &cookie, &format!("csrf={csrf}")).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        assert_eq!(call(&app, "GET", "/dashboard", &cookie, "").await.status(), StatusCode::SEE_OTHER);
    }

    /// The install command is shown only when `/dl/` serves what it fetches; otherwise the page
    /// says what the operator must do, in the page's language.
    #[tokio::test]
    async fn the_install_command_only_when_the_platform_serves_it() {
        let dir = tempfile::tempdir().unwrap();
        let full = dist_with(dir.path(), &DIST_FILES);
        let lacking = dir.path().join("lacking");
        std::fs::create_dir(&lacking).unwrap();
        for f in ["gpum-install", "gpum-install.sha256", "manifest.json"] {
            std::fs::write(lacking.join(f), b"x").unwrap();
        }
        // A symlink is not served by `/dl/`, so it does not count.
        std::os::unix::fs::symlink(full.join("gpum-agent"), lacking.join("gpum-agent")).unwrap();
        let cases: [(Option<std::path::PathBuf>, &[&str]); 3] = [
            (Some(full), &[]),
            (None, &["start it with --dist DIR", "запустите её с --dist КАТАЛОГ"]),
            (
                Some(lacking),
                &[
                    "lacks release files: manifest.json.sig, gpum-agent.",
                    "не хватает файлов выпуска: manifest.json.sig, gpum-agent.",
                ],
            ),
        ];
        for (dist, says) in cases {
            let app = app_with(dir.path(), true, dist);
            let (sid, csrf) = sign_in(&app).await;
            for (i, lang) in ["en", "ru"].into_iter().enumerate() {
                let cookie = format!("{SESSION_COOKIE}={sid}; {LANG_COOKIE}={lang}");
                let form = text(call(&app, "GET", "/dashboard/add", &cookie, "").await).await;
                let created = create(&app, &cookie, &csrf).await;
                assert!(created.contains("id=\"join-code\""), "{created}");
                if says.is_empty() {
                    assert!(created.contains("id=\"cmd-install\""), "{created}");
                    assert!(!form.contains("no-install-command") && !created.contains("no-install-command"));
                } else {
                    for page in [&form, &created] {
                        assert!(page.contains("id=\"no-install-command\""), "{page}");
                        assert!(page.contains(says[i]), "{lang}: {page}");
                    }
                    assert!(!created.contains("cmd-install") && !created.contains("install.sh"), "{created}");
                }
            }
        }
    }

    /// The join-code page is reached by a redirect after the POST: the POST answers 303 to
    /// `/dashboard/join/{hash}` (the code in no URL), the first GET shows the code once, a
    /// reload (or another session, or a GET a minute late) shows the status without it and
    /// says why; the open code is listed on "Add a machine" until it is used, and a used code's
    /// page shows no command.
    #[tokio::test]
    async fn a_new_code_is_shown_once_after_a_redirect_and_listed_while_open() {
        let dir = tempfile::tempdir().unwrap();
        let app = app_with(dir.path(), true, Some(dist_with(dir.path(), &DIST_FILES)));
        let (sid, csrf) = sign_in(&app).await;
        let (other, _) = sign_in(&app).await;
        for (lang, once) in [("en", "The code was shown once"), ("ru", "Код показан один раз")]
        {
            let cookie = format!("{SESSION_COOKIE}={sid}; {LANG_COOKIE}={lang}");
            let r = call(&app, "POST", "/dashboard/add", &cookie, &format!("ttl=3600&csrf={csrf}")).await;
            assert_eq!(r.status(), StatusCode::SEE_OTHER);
            let to = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
            let hash = to.strip_prefix("/dashboard/join/").unwrap().to_owned();
            assert_eq!(hash.len(), 64, "{to}");
            assert!(text(r).await.is_empty(), "the POST's answer shows no code");

            // Another session's GET does not take it.
            let r = call(&app, "GET", &to, &format!("{SESSION_COOKIE}={other}"), "").await;
            assert!(!text(r).await.contains("GPUM-"));
            let first = text(call(&app, "GET", &to, &cookie, "").await).await;
            let code = first.split("id=\"join-code\">").nth(1).unwrap().split('<').next().unwrap();
            assert!(code.starts_with("GPUM-"), "{first}");
            assert_eq!(store::hash_secret(code), hash, "the page's hash is this code's");
            assert!(first.contains("id=\"cmd-install\"") && first.contains("data-state=\"waiting\""));
            // The live status sits above the code.
            assert!(first.find("id=\"join-state\"").unwrap() < first.find("id=\"join-code\"").unwrap());

            let again = text(call(&app, "GET", &to, &cookie, "").await).await;
            assert!(!again.contains("GPUM-") && !again.contains("cmd-install"), "{again}");
            assert!(again.contains("data-state=\"waiting\"") && again.contains(once), "{again}");

            // Listed as open on "Add a machine", by its page, never by the code.
            let add = text(call(&app, "GET", "/dashboard/add", &cookie, "").await).await;
            assert!(add.contains(&format!("href=\"/dashboard/join/{hash}\"")), "{add}");
            assert!(!add.contains(code));
        }
        // A join page that does not exist (a malformed address, or no such code) names the
        // join code, not a server (issue 46), in the owner's language.
        for (lang, says) in [
            ("en", "No such join code. Create a new code."),
            ("ru", "Такого кода подключения нет. Создайте новый код."),
        ] {
            let cookie = format!("{SESSION_COOKIE}={sid}; {LANG_COOKIE}={lang}");
            for to in ["/dashboard/join/abc".to_owned(), format!("/dashboard/join/{}", "0".repeat(64))] {
                let r = call(&app, "GET", &to, &cookie, "").await;
                assert_eq!(r.status(), StatusCode::NOT_FOUND, "{to}");
                let body = text(r).await;
                let said = body.split("id=\"not-found\">").nth(1).and_then(|b| b.split('<').next());
                assert_eq!(said, Some(says), "{to}: {body}");
            }
        }
        // A fresh code not fetched within a minute is gone from memory.
        let cookie = format!("{SESSION_COOKIE}={sid}");
        let flashes = Flashes::default();
        flashes.put(&sid, "h", "GPUM-X".into(), 9, 100);
        assert_eq!(flashes.take(&sid, "h", 100 + FLASH_TTL_SECS), None);
        flashes.put(&sid, "h", "GPUM-X".into(), 9, 100);
        assert_eq!(flashes.take(&other, "h", 101), None, "another session");
        assert_eq!(flashes.take(&sid, "h", 101), Some(("GPUM-X".into(), 9)));
        assert_eq!(flashes.take(&sid, "h", 101), None, "once");

        // Used: no longer open, and its page shows no command, only the status.
        let r = call(&app, "POST", "/dashboard/add", &cookie, &format!("ttl=3600&csrf={csrf}")).await;
        let to = r.headers()[header::LOCATION].to_str().unwrap().to_owned();
        let page = text(call(&app, "GET", &to, &cookie, "").await).await;
        let code = page.split("id=\"join-code\">").nth(1).unwrap().split('<').next().unwrap().to_owned();
        let conn = store::open(&dir.path().join("p.db")).unwrap();
        let now = crate::clock::Clock::system().now();
        let req = gpum_protocol::RegisterRequest {
            join_code: code,
            agent_version: "1".into(),
            inventory: Default::default(),
            install_id: None,
        };
        store::register(&conn, now, &req, 10).unwrap();
        let page = text(call(&app, "GET", &to, &cookie, "").await).await;
        assert!(page.contains("data-state=\"registered\"") && page.contains("data-open=\"false\""), "{page}");
        assert!(!page.contains("cmd-install") && page.contains("id=\"code-closed\""), "{page}");
        let add = text(call(&app, "GET", "/dashboard/add", &cookie, "").await).await;
        assert!(!add.contains(&to), "a used code is not open");
    }

    #[tokio::test]
    async fn off_without_an_admin_token_and_languages() {
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path(), false);
        let r = call(&app, "GET", "/dashboard", "", "").await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(text(r).await.contains("The dashboard is disabled"));
        let req = Request::builder()
            .uri("/dashboard/login")
            .header(header::ACCEPT_LANGUAGE, "ru-RU,ru;q=0.9")
            .body(Body::empty())
            .unwrap();
        assert!(text(app.clone().oneshot(req).await.unwrap()).await.contains("Личный кабинет выключен"));
        let r = call(&app, "GET", "/dashboard?lang=ru", "", "").await;
        assert!(set_cookie(&r, LANG_COOKIE).starts_with("__Host-gpum_lang=ru;"));
        assert!(text(r).await.contains("Личный кабинет выключен"));
        assert!(
            text(call(&app, "GET", "/dashboard", "__Host-gpum_lang=ru", "").await).await.contains("выключен")
        );
    }

    /// Issue 44, item 5: the cabinet's handlers take their guard from extractors ([`SignedIn`],
    /// [`account::Owner`], [`CsrfForm`]); each signed-in route answers as it did with the
    /// preambles: the dashboard off (403, the disabled page), no session (to the sign-in form),
    /// the operator on an owner's page (to the servers), and a form without the session's token
    /// (403, the stale-form page), which changes nothing. The second factor's recovery codes look
    /// at the session's second factor first, as before.
    #[tokio::test]
    async fn every_signed_in_route_is_refused_as_before() {
        const GETS: [&str; 7] = [
            "/dashboard",
            "/dashboard/account",
            "/dashboard/add",
            "/dashboard/join/abc",
            "/dashboard/servers/node-x",
            "/dashboard/servers/node-x/rotate-token",
            "/dashboard/servers/node-x/delete",
        ];
        const SERVER_POSTS: [&str; 10] = [
            "/dashboard/logout",
            "/dashboard/add",
            "/dashboard/servers/node-x/command",
            "/dashboard/servers/node-x/settings",
            "/dashboard/servers/node-x/pause",
            "/dashboard/servers/node-x/auto-update",
            "/dashboard/servers/node-x/rotate-token",
            "/dashboard/servers/node-x/delete",
            "/dashboard/servers/node-x/maintenance",
            "/dashboard/servers/node-x/maintenance/mw-x/delete",
        ];
        const ACCOUNT_POSTS: [&str; 6] = [
            "/dashboard/account/alerts",
            "/dashboard/account/keys",
            "/dashboard/account/keys/key-x/revoke",
            "/dashboard/account/totp",
            "/dashboard/account/totp/confirm",
            "/dashboard/account/totp/off",
        ];
        const RECOVERY: &str = "/dashboard/account/recovery";
        let posts = || SERVER_POSTS.iter().chain(&ACCOUNT_POSTS);
        let to = |r: &Response| r.headers()[header::LOCATION].to_str().unwrap().to_owned();
        let body = "csrf=wrong&kind=restart&name=n&price=1&min_rental=60&paused=true&auto_update=true&ttl=3600&label=k&password=p&code=1";

        // The dashboard off.
        let dir = tempfile::tempdir().unwrap();
        let off = app(dir.path(), false);
        for p in GETS {
            let r = call(&off, "GET", p, "", "").await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "GET {p}");
            assert!(text(r).await.contains("id=\"disabled\""), "GET {p}");
        }
        for p in posts() {
            let r = call(&off, "POST", p, "", body).await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "POST {p}");
            assert!(text(r).await.contains("id=\"disabled\""), "POST {p}");
        }
        let r = call(&off, "POST", RECOVERY, "", body).await;
        assert_eq!((r.status(), to(&r)), (StatusCode::SEE_OTHER, "/dashboard/account".into()));

        // No session, or one the platform does not know.
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path(), true);
        for cookie in ["", &format!("{SESSION_COOKIE}={}", "ab".repeat(32))] {
            for (m, p) in GETS.iter().map(|p| ("GET", p)).chain(posts().map(|p| ("POST", p))) {
                let r = call(&app, m, p, cookie, body).await;
                assert_eq!(
                    (r.status(), to(&r)),
                    (StatusCode::SEE_OTHER, "/dashboard/login".into()),
                    "{m} {p}"
                );
            }
            let r = call(&app, "POST", RECOVERY, cookie, body).await;
            assert_eq!((r.status(), to(&r)), (StatusCode::SEE_OTHER, "/dashboard/account".into()));
        }

        // The operator: a wrong token or none is a stale form; an owner's pages send them to the
        // servers, before the token is looked at.
        let (sid, csrf) = sign_in(&app).await;
        let cookie = format!("{SESSION_COOKIE}={sid}");
        for p in SERVER_POSTS {
            for b in [body.to_owned(), body.replace("csrf=wrong&", ""), format!("csrf={}", &csrf[..63])] {
                let r = call(&app, "POST", p, &cookie, &b).await;
                assert_eq!(r.status(), StatusCode::FORBIDDEN, "POST {p} {b}");
                assert!(text(r).await.contains("id=\"stale\""), "POST {p}");
            }
        }
        for p in ACCOUNT_POSTS.iter().chain(&["/dashboard/account"]) {
            let m = if *p == "/dashboard/account" { "GET" } else { "POST" };
            let r = call(&app, m, p, &cookie, body).await;
            assert_eq!((r.status(), to(&r)), (StatusCode::SEE_OTHER, "/dashboard".into()), "{m} {p}");
        }
        let r = call(&app, "POST", RECOVERY, &cookie, body).await;
        assert_eq!((r.status(), to(&r)), (StatusCode::SEE_OTHER, "/dashboard/account".into()));
        // The stale forms changed nothing: the session is still signed in.
        let r = call(&app, "GET", "/dashboard", &cookie, "").await;
        assert_eq!(r.status(), StatusCode::OK);

        // An owner: the account's forms without the token are stale forms too.
        let conn = store::open(&dir.path().join("p.db")).unwrap();
        let now = Clock::system().now();
        let (owner, _, _) = accounts::invite(&conn, now, "owner@example.com").unwrap();
        let osid = accounts::create_session(&conn, now, Some(&owner.id)).unwrap();
        let cookie = format!("{SESSION_COOKIE}={osid}");
        for p in ACCOUNT_POSTS {
            let r = call(&app, "POST", p, &cookie, body).await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "POST {p}");
            assert!(text(r).await.contains("id=\"stale\""), "POST {p}");
        }
        let r = call(&app, "GET", "/dashboard/account", &cookie, "").await;
        assert_eq!(r.status(), StatusCode::OK);
    }
}
