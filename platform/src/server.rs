//! The HTTP side: routes, authentication, error mapping, the `Date` header, downloads.
//!
//! Every answer, including 404, 405, 413 and a body that is not JSON, is either the endpoint's
//! JSON or `{"error":{"code","message"}}` with the code's status. Nothing here panics on input:
//! bodies are read as bytes (within [`BODY_LIMIT`] and the body timeout) and parsed by hand so
//! that every rejection maps to a stable code.
//!
//! No request header is trusted for anything but the bearer token and the body's length: the
//! URL written into `install.sh` is fixed at start ([`Config::public_url`]), never taken from
//! `Host`, and no address or forwarding header (`X-Forwarded-For`, `Forwarded`) is read.

use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use gpum_protocol::{
    CreateJoinCodeRequest, CreateMaintenanceRequest, CreateRentalRequest, EnrollRequest, ErrorCode,
    HeartbeatRequest, InviteOwnerRequest, MAX_EVENTS_PER_NODE, NodeDeleted, OwnerInvited,
    PATH_ADMIN_JOIN_CODES, PATH_ADMIN_NODES, PATH_ADMIN_OWNERS, PATH_ADMIN_PROBE_IMAGE,
    PATH_ADMIN_RENTAL_REGISTRIES, PATH_ADMIN_RENTALS, PATH_ENROLL, PATH_HEARTBEAT, PATH_INSTALL_SH,
    PATH_OWNER_JOIN_CODES, PATH_OWNER_NODES, PATH_OWNER_RENTALS, PATH_REGISTER, PATH_TUNNEL,
    QueueCommandRequest, RegisterRequest, RentalRegistries, SetKnownContainersRequest, SetProbeImageRequest,
    SetRentalRegistriesRequest, UpdateNodeRequest, UpdateOwnerRequest,
};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::accounts;
use crate::clock::Clock;
use crate::db::Db;
use crate::error::ApiError;
use crate::store::{self, Scope};
use crate::throttle::{self, Door, Throttle};
use axum::Extension;

/// The largest request body accepted. A heartbeat with a full inventory, 4 KiB of probe output
/// and a thousand container ids stays far below it.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// Every route, as (method, path template). docs/openapi.yaml documents exactly these; a test
/// proves both that the file matches this list and that the router serves each entry.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", PATH_ENROLL),
    ("POST", PATH_REGISTER),
    ("POST", PATH_HEARTBEAT),
    ("GET", PATH_TUNNEL),
    ("POST", PATH_ADMIN_JOIN_CODES),
    ("GET", PATH_ADMIN_NODES),
    ("GET", "/api/v1/admin/nodes/{id}"),
    ("PATCH", "/api/v1/admin/nodes/{id}"),
    ("DELETE", "/api/v1/admin/nodes/{id}"),
    ("POST", "/api/v1/admin/nodes/{id}/commands"),
    ("POST", "/api/v1/admin/nodes/{id}/rotate-token"),
    ("PUT", "/api/v1/admin/nodes/{id}/known-containers"),
    ("GET", "/api/v1/admin/nodes/{id}/events"),
    ("GET", "/api/v1/admin/nodes/{id}/metrics"),
    ("GET", "/api/v1/admin/nodes/{id}/maintenance"),
    ("POST", "/api/v1/admin/nodes/{id}/maintenance"),
    ("DELETE", "/api/v1/admin/nodes/{id}/maintenance/{window}"),
    ("GET", PATH_ADMIN_PROBE_IMAGE),
    ("PUT", PATH_ADMIN_PROBE_IMAGE),
    ("GET", PATH_ADMIN_RENTAL_REGISTRIES),
    ("PUT", PATH_ADMIN_RENTAL_REGISTRIES),
    ("POST", PATH_ADMIN_RENTALS),
    ("GET", PATH_ADMIN_RENTALS),
    ("GET", "/api/v1/admin/rentals/{id}"),
    ("POST", "/api/v1/admin/rentals/{id}/stop"),
    ("POST", PATH_ADMIN_OWNERS),
    ("GET", PATH_ADMIN_OWNERS),
    ("PATCH", "/api/v1/admin/owners/{id}"),
    ("POST", PATH_OWNER_JOIN_CODES),
    ("GET", PATH_OWNER_NODES),
    ("GET", "/api/v1/owner/nodes/{id}"),
    ("PATCH", "/api/v1/owner/nodes/{id}"),
    ("DELETE", "/api/v1/owner/nodes/{id}"),
    ("POST", "/api/v1/owner/nodes/{id}/commands"),
    ("POST", "/api/v1/owner/nodes/{id}/rotate-token"),
    ("GET", "/api/v1/owner/nodes/{id}/events"),
    ("GET", "/api/v1/owner/nodes/{id}/metrics"),
    ("GET", "/api/v1/owner/nodes/{id}/maintenance"),
    ("POST", "/api/v1/owner/nodes/{id}/maintenance"),
    ("DELETE", "/api/v1/owner/nodes/{id}/maintenance/{window}"),
    ("GET", "/api/v1/owner/rentals"),
    ("GET", "/api/v1/owner/rentals/{id}"),
    ("GET", gpum_protocol::PATH_OWNER_EARNINGS),
    ("GET", gpum_protocol::PATH_ADMIN_EARNINGS),
    ("GET", gpum_protocol::PATH_OWNER_ALERTS),
    ("PUT", gpum_protocol::PATH_OWNER_ALERTS),
    ("GET", gpum_protocol::PATH_ALERTS_PUBLIC_KEY),
    ("GET", PATH_INSTALL_SH),
    ("GET", "/dl/{file}"),
    ("GET", "/api/v1/agent/releases/{version}/{file}"),
    ("GET", gpum_protocol::PATH_ADMIN_RELEASES),
    ("POST", "/api/v1/admin/releases/{version}/rollout"),
    ("POST", "/api/v1/admin/releases/pause"),
    ("POST", "/api/v1/admin/releases/resume"),
    ("POST", "/api/v1/admin/releases/halt"),
];

pub struct Config {
    pub heartbeat_interval_secs: u64,
    /// SHA-256 of the admin token; `None` disables the admin API.
    pub admin_token_hash: Option<[u8; 32]>,
    pub dist: Option<PathBuf>,
    /// The URL written into install.sh, checked at start (`install::check_public_url`).
    pub public_url: String,
    /// The longest a request body may take to arrive.
    pub body_timeout: Duration,
    /// The platform's currency (`serve --currency`, read once at start: it cannot change once
    /// a rental exists), named on every price the pages show and parsed in its decimal places.
    pub currency: gpum_platform_core::currency::Currency,
}

pub struct AppState {
    pub db: Db,
    pub clock: Clock,
    pub cfg: Config,
    /// The agents' tunnels and the tenants' streams (issue 34).
    pub relay: Arc<crate::relay::Relay>,
    /// Wrong admin tokens, passwords, API keys and relay credentials, per client address.
    pub throttle: Arc<Throttle>,
    /// What alerts to owners are sent with (issue 46).
    pub alerts: Arc<crate::alerts::Alerts>,
}

type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    // One budget of wrong admin tokens per client address, for the admin API and the sign-in.
    let throttle = state.throttle.clone();
    let admin = Router::new()
        .route(PATH_ADMIN_JOIN_CODES, post(create_join_code))
        .route(PATH_ADMIN_NODES, get(list_nodes))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}"), get(show_node).delete(delete_node).patch(update_node))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/commands"), post(queue_command))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/rotate-token"), post(rotate_token))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/known-containers"), put(set_known_containers))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/events"), get(node_events))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/metrics"), get(node_metrics))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/maintenance"), get(list_maintenance).post(add_maintenance))
        .route(&format!("{PATH_ADMIN_NODES}/{{id}}/maintenance/{{window}}"), delete(delete_maintenance))
        .route(PATH_ADMIN_PROBE_IMAGE, get(get_probe_image).put(set_probe_image))
        .route(PATH_ADMIN_RENTAL_REGISTRIES, get(get_rental_registries).put(set_rental_registries))
        .route(PATH_ADMIN_RENTALS, post(create_rental).get(list_rentals))
        .route(&format!("{PATH_ADMIN_RENTALS}/{{id}}"), get(show_rental))
        .route(&format!("{PATH_ADMIN_RENTALS}/{{id}}/stop"), post(stop_rental))
        .route(PATH_ADMIN_OWNERS, post(invite_owner).get(list_owners))
        .route(gpum_protocol::PATH_ADMIN_EARNINGS, get(earnings))
        .route(&format!("{PATH_ADMIN_OWNERS}/{{id}}"), axum::routing::patch(update_owner))
        .route(gpum_protocol::PATH_ADMIN_RELEASES, get(list_releases))
        .route(&format!("{}/{{version}}/rollout", gpum_protocol::PATH_ADMIN_RELEASES), post(start_rollout))
        .route(&format!("{}/pause", gpum_protocol::PATH_ADMIN_RELEASES), post(pause_rollout))
        .route(&format!("{}/resume", gpum_protocol::PATH_ADMIN_RELEASES), post(resume_rollout))
        .route(&format!("{}/halt", gpum_protocol::PATH_ADMIN_RELEASES), post(halt_rollout))
        .route_layer(middleware::from_fn_with_state((state.clone(), throttle.clone()), admin_auth));
    // An owner's API: the same handlers, on their own servers only (the `Scope` their key
    // gives). What only the operator does (known containers, the check image, owners) is not here.
    let owner = Router::new()
        .route(PATH_OWNER_JOIN_CODES, post(create_join_code))
        .route(PATH_OWNER_NODES, get(list_nodes))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}"), get(show_node).delete(delete_node).patch(update_node))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}/commands"), post(queue_command))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}/rotate-token"), post(rotate_token))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}/events"), get(node_events))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}/metrics"), get(node_metrics))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}/maintenance"), get(list_maintenance).post(add_maintenance))
        .route(&format!("{PATH_OWNER_NODES}/{{id}}/maintenance/{{window}}"), delete(delete_maintenance))
        .route(PATH_OWNER_RENTALS, get(list_rentals))
        .route(&format!("{PATH_OWNER_RENTALS}/{{id}}"), get(show_rental))
        .route(gpum_protocol::PATH_OWNER_EARNINGS, get(earnings))
        .route(gpum_protocol::PATH_OWNER_ALERTS, get(get_alerts).put(put_alerts))
        .route_layer(middleware::from_fn_with_state((state.clone(), throttle.clone()), owner_auth));
    Router::new()
        .route(PATH_ENROLL, post(enroll))
        .route(PATH_REGISTER, post(register))
        .route(PATH_HEARTBEAT, post(heartbeat))
        .route(PATH_TUNNEL, get(tunnel))
        .route(PATH_INSTALL_SH, get(install_sh))
        .route("/dl/{file}", get(download))
        .route(&format!("{}/{{version}}/{{file}}", gpum_protocol::PATH_AGENT_RELEASES), get(release_file))
        .route(gpum_protocol::PATH_ALERTS_PUBLIC_KEY, get(alerts_public_key))
        .merge(admin)
        .merge(owner)
        .merge(crate::web::router(state.clone(), throttle))
        .fallback(|| async { ApiError::not_found("endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed on this endpoint")
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn_with_state(state.clone(), date_header))
        .with_state(state)
}

/// Stamps `Date` from the platform's clock, so agents can detect skew (and tests can fake it).
async fn date_header(State(st): St, req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(st.clock.now_system())) {
        resp.headers_mut().insert(header::DATE, v);
    }
    resp
}

/// The last word on error answers: one that is neither the protocol's JSON nor a dashboard
/// page (axum's own plain-text rejections: a path parameter that is not UTF-8, say) becomes
/// `{"error":{"code","message"}}` with the code for its status. Every error the platform gives is
/// then JSON, whichever extractor refused the request.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !status.is_client_error() && !status.is_server_error() {
        return resp;
    }
    let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct.starts_with("application/json") || ct.starts_with("text/html") {
        return resp;
    }
    let code = match status {
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::REQUEST_TIMEOUT => ErrorCode::RequestTimeout,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::TOO_MANY_REQUESTS => ErrorCode::TooManyRequests,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::InvalidRequest,
    };
    // A rejection's text describes the request, never the server; at most a line of it.
    let text = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let text: String = text.trim().chars().take(300).collect();
    if code == ErrorCode::Internal {
        tracing::error!("{status}: {text}");
        return ApiError::internal().into_response();
    }
    let message =
        if text.is_empty() { status.canonical_reason().unwrap_or("bad request").to_owned() } else { text };
    ApiError::new(code, message).into_response()
}

// ---------------------------------------------------------------------------------------------
// Extraction

/// A JSON body whose every failure is an [`ApiError`]: 413 `payload_too_large` past the limit,
/// 408 `request_timeout` past the body timeout, 400 `invalid_json` for anything that does not
/// parse into `T`. The content type is not checked: clients are not browsers, and a bearer
/// token, not a cookie, authenticates them.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let bytes = read_body(req, state.cfg.body_timeout).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Reads the whole body: at most [`BODY_LIMIT`] bytes, within `timeout` (a client that sends
/// its body slowly, or never, does not hold the connection).
///
/// Memory follows what arrives, not what is announced: the buffer doubles as the body arrives,
/// up to its announced length (one copy, no list of chunks), and beyond each body's first
/// [`crate::listen::BODY_OWN_BYTES`] it is leased from the [`crate::listen::BodyBudget`] the
/// accept loop put in the request, waiting for it within `timeout`. So many connections that
/// send large bodies slowly hold the budget together, not a megabyte each.
pub(crate) async fn read_body(req: Request, timeout: Duration) -> Result<Bytes, ApiError> {
    use crate::listen::{BODY_OWN_BYTES, BodyBudget, BodyLease};
    use axum::body::HttpBody;
    use std::pin::Pin;
    let too_large =
        || ApiError::new(ErrorCode::PayloadTooLarge, format!("the request body is over {BODY_LIMIT} bytes"));
    // A declared length over the limit is refused before reading a byte of it.
    let declared =
        req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(too_large());
    }
    let declared = declared.and_then(|n| usize::try_from(n).ok());
    let mut lease = BodyLease::new(req.extensions().get::<BodyBudget>().cloned());
    let mut body = req.into_body();
    let read = async {
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            let frame = frame.map_err(|e| {
                ApiError::new(ErrorCode::InvalidJson, format!("could not read the request body: {e}"))
            })?;
            let Ok(data) = frame.into_data() else { continue };
            let len = buf.len() + data.len();
            if len > BODY_LIMIT {
                return Err(too_large());
            }
            if len > buf.capacity() {
                // Doubling from the body's own bytes, up to the announced length: a body that
                // announces a megabyte and sends a byte holds no more than its own.
                let most = declared.filter(|&n| n >= len).unwrap_or(BODY_LIMIT);
                let want = len.max(buf.capacity() * 2).max(BODY_OWN_BYTES).min(most);
                lease.cover(want).await;
                buf.reserve_exact(want - buf.len());
            }
            buf.extend_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    };
    match tokio::time::timeout(timeout, read).await {
        Err(_) => Err(ApiError::new(
            ErrorCode::RequestTimeout,
            format!("the request body did not arrive within {} s", timeout.as_secs()),
        )),
        Ok(r) => r,
    }
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(ErrorCode::InvalidJson, format!("the body is not valid JSON for this endpoint: {e}"))
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The admin API's guard: the bearer must be the admin token, and an address that sent too many
/// wrong ones is refused (429) for a while before its token is looked at
/// ([`crate::throttle`], door `AdminApi`). Every admin answer is
/// `Cache-Control: no-store`: some carry a secret shown once (a join code, a new node token).
async fn admin_auth(
    State((st, throttle)): State<(Arc<AppState>, Arc<Throttle>)>,
    req: Request,
    next: Next,
) -> Response {
    let mut resp = admin_answer(&st, &throttle, req, next).await;
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn admin_answer(st: &AppState, throttle: &Throttle, req: Request, next: Next) -> Response {
    let Some(want) = st.cfg.admin_token_hash else {
        return ApiError::new(
            ErrorCode::AdminUnauthorized,
            "the admin API is disabled: start the platform with --admin-token-file",
        )
        .into_response();
    };
    let client = throttle::client_key(&req);
    if let Err(wait) = throttle.check(Door::AdminApi, client, None).await {
        return throttle::too_many(wait);
    }
    let got: [u8; 32] = match bearer(req.headers()) {
        Some(t) => Sha256::digest(t.as_bytes()).into(),
        None => {
            return ApiError::new(ErrorCode::AdminUnauthorized, "missing admin bearer token").into_response();
        }
    };
    // Compare digests without an early exit.
    if got.iter().zip(want.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        throttle.failed(Door::AdminApi, client, None).await;
        return ApiError::new(ErrorCode::AdminUnauthorized, "wrong admin token").into_response();
    }
    throttle.succeeded(Door::AdminApi, client, None).await;
    let mut req = req;
    req.extensions_mut().insert(Scope::All);
    next.run(req).await
}

/// The owner API's guard: the bearer must be a live API key of an enabled owner; the handlers
/// then see only that owner's servers (`Scope::Owner`). Wrong keys count against the address
/// like wrong admin tokens. Every answer is `Cache-Control: no-store`.
async fn owner_auth(
    State((st, throttle)): State<(Arc<AppState>, Arc<Throttle>)>,
    req: Request,
    next: Next,
) -> Response {
    let mut resp = owner_answer(&st, &throttle, req, next).await;
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

async fn owner_answer(st: &AppState, throttle: &Throttle, mut req: Request, next: Next) -> Response {
    let client = throttle::client_key(&req);
    if let Err(wait) = throttle.check(Door::OwnerApi, client, None).await {
        return throttle::too_many(wait);
    }
    let Some(key) = bearer(req.headers()).map(str::to_owned) else {
        return ApiError::new(ErrorCode::Unauthorized, "missing API key (Authorization: Bearer gpumk_…)")
            .into_response();
    };
    let now = st.clock.now();
    match st.db.call(move |c| accounts::owner_by_api_key(c, now, &key)).await {
        Ok(Some(owner)) => {
            throttle.succeeded(Door::OwnerApi, client, None).await;
            req.extensions_mut().insert(Scope::Owner(owner));
            next.run(req).await
        }
        Ok(None) => {
            throttle.failed(Door::OwnerApi, client, None).await;
            ApiError::new(ErrorCode::Unauthorized, "unknown, revoked or disabled API key").into_response()
        }
        Err(e) => e.into_response(),
    }
}

// ---------------------------------------------------------------------------------------------
// Agent endpoints

async fn enroll(State(st): St, ApiJson(req): ApiJson<EnrollRequest>) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let r = st.db.call(move |c| store::enroll(c, now, &req)).await?;
    Ok(Json(r).into_response())
}

async fn register(State(st): St, ApiJson(req): ApiJson<RegisterRequest>) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let interval = st.cfg.heartbeat_interval_secs;
    let r = st.db.call(move |c| store::register(c, now, &req, interval)).await?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

async fn heartbeat(State(st): St, req: Request) -> Result<Response, ApiError> {
    // Authentication comes before the body, so a revoked agent learns it even if its body is bad.
    // The token is read off the request itself: a `HeaderMap` extractor would copy every header.
    let token = bearer(req.headers())
        .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "missing bearer token"))?
        .to_owned();
    // Reading, parsing and preparing (hashing, JSON encoding) happen here, off the database
    // thread. A deleted, replaced or unknown node hears so whatever it sends.
    let prepared = read_body(req, st.cfg.body_timeout).await.and_then(|bytes| {
        let req = parse_json::<HeartbeatRequest>(&bytes)?;
        let p = store::PreparedBeat::new(&token, &req)?;
        Ok((req, p))
    });
    let (req, prepared) = match prepared {
        Ok(v) => v,
        Err(e) => return Err(revocation_or(&st, &token, e).await),
    };
    let now = st.clock.now();
    let interval = st.cfg.heartbeat_interval_secs;
    let r = st.db.call(move |c| store::heartbeat_prepared(c, now, &req, &prepared, interval)).await?;
    Ok(Json(r).into_response())
}

/// The agent's tunnel (issue 34, `relay`): the node's token as for a heartbeat (a deleted node or
/// a replaced token hears so), `Upgrade: gpum-tunnel`, then `101` and the connection is the
/// relay's.
async fn tunnel(State(st): St, mut req: Request) -> Result<Response, ApiError> {
    let token = bearer(req.headers())
        .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "missing bearer token"))?
        .to_owned();
    let node_id = st.db.call(move |c| store::node_of_token(c, &token)).await?;
    let asks = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(gpum_protocol::TUNNEL_UPGRADE));
    if !asks {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("the tunnel needs Connection: Upgrade and Upgrade: {}", gpum_protocol::TUNNEL_UPGRADE),
        ));
    }
    // The upgraded connection leaves the listener's connection cap; it holds a tunnel's place.
    let Some(permit) = st.relay.tunnel_permit() else {
        tracing::warn!(node = %node_id, max_tunnels = st.relay.cfg.max_tunnels, "tunnel refused: the platform holds its limit of tunnels");
        return Err(ApiError::new(
            ErrorCode::TooManyRequests,
            "the platform holds its limit of tunnels open; try again later",
        ));
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let relay = st.relay.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => relay.attach(node_id, hyper_util::rt::TokioIo::new(io), permit).await,
            Err(e) => tracing::debug!(error = %e, "the tunnel did not switch"),
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    resp.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(gpum_protocol::TUNNEL_UPGRADE));
    Ok(resp)
}

/// `GET /api/v1/agent/releases/{version}/{file}` (issue 47): one file of a release the
/// operator added, exactly as added, to a live node's token (a deleted node or a replaced token
/// hears so, as at a heartbeat). Only [`gpum_protocol::upgrade::RELEASE_FILES`]; anything
/// else, or an unknown version, is 404. The agent verifies what it gets; the platform only
/// serves it.
async fn release_file(
    State(st): St,
    Path((version, file)): Path<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    let token = bearer(req.headers())
        .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "missing bearer token"))?
        .to_owned();
    let known = gpum_protocol::upgrade::RELEASE_FILES.contains(&file.as_str());
    let body = st
        .db
        .call(move |c| {
            store::check_node_token(c, &token)?;
            if !known {
                return Ok(None);
            }
            store::release_file(c, &version, &file)
        })
        .await?;
    let Some(body) = body else { return Err(ApiError::not_found("release file")) };
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))], body).into_response())
}

/// For a heartbeat whose body is bad: the revocation or authentication answer if there is one
/// (without recording anything), else the body's error.
async fn revocation_or(st: &AppState, token: &str, body_err: ApiError) -> ApiError {
    let t = token.to_owned();
    match st.db.call(move |c| store::check_node_token(c, &t)).await {
        Ok(()) => body_err,
        Err(e) => e,
    }
}

// ---------------------------------------------------------------------------------------------
// Admin endpoints

async fn create_join_code(
    State(st): St,
    Extension(scope): Extension<Scope>,
    req: Request,
) -> Result<Response, ApiError> {
    let bytes = read_body(req, st.cfg.body_timeout).await?;
    // An empty body means the defaults.
    let req: CreateJoinCodeRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        CreateJoinCodeRequest::default()
    } else {
        parse_json(&bytes)?
    };
    let now = st.clock.now();
    let ttl = req.ttl_secs.unwrap_or(store::DEFAULT_JOIN_CODE_TTL_SECS);
    let r = st.db.call(move |c| store::create_join_code(c, now, ttl, &scope)).await?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

/// A page of the nodes (an owner's: their own), `?limit=` (1 to 500, 100 by default) after
/// `?after=` (the `next` of the page before). Any other query parameter is refused.
async fn list_nodes(
    State(st): St,
    Extension(scope): Extension<Scope>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let page = page_query(q.as_deref(), true)?;
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::list_nodes_page(c, now, &scope, &page)).await?).into_response())
}

/// One node (an owner's: only their own), as the list shows it; `not_found` for a deleted node,
/// another owner's, or none.
async fn show_node(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::node(c, now, &id, &scope)).await?).into_response())
}

/// The page a list request asks for: its `limit` and `after` parameters. `strict`: any other
/// parameter is refused (the API); otherwise it is left to the caller (the dashboard).
pub(crate) fn page_query(q: Option<&str>, strict: bool) -> Result<store::Page, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.unwrap_or(""))
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, "the query is not valid"))?;
    let (mut limit, mut after) = (None, None);
    for (k, v) in pairs {
        match k.as_str() {
            "limit" => limit = Some(v),
            "after" => after = Some(v),
            _ if strict => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("unknown query parameter {k:?}"),
                ));
            }
            _ => {}
        }
    }
    store::Page::parse(limit.as_deref(), after.as_deref())
}

async fn delete_node(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let i = id.clone();
    // Its tunnel and its rentals' streams end through the effects it records (`effects`).
    st.db.call(move |c| store::delete_node(c, now, &i, &scope)).await?;
    Ok(Json(NodeDeleted { deleted: id }).into_response())
}

/// The server's maintenance windows not over yet (issue 46).
async fn list_maintenance(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::maintenance_windows(c, now, &id, &scope)).await?).into_response())
}

/// Plans a maintenance window: 201 with it, or the core's refusal (400, or 409 at the limit).
async fn add_maintenance(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CreateMaintenanceRequest>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let w = st.db.call(move |c| store::add_maintenance(c, now, &id, &req, &scope)).await??;
    Ok((StatusCode::CREATED, Json(w)).into_response())
}

/// Deletes a maintenance window: the windows left.
async fn delete_maintenance(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path((id, window)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let left = st
        .db
        .call(move |c| {
            store::delete_maintenance(c, &id, &window, &scope)?;
            store::maintenance_windows(c, now, &id, &scope)
        })
        .await?;
    Ok(Json(left).into_response())
}

/// The owner's settings of a server: name, price, minimum rental time, paused.
/// An owner's alert settings (issue 46), with the notices sent lately and what the platform
/// can send with.
pub(crate) fn alerts_view(
    c: &crate::sql::Conn,
    alerts: &crate::alerts::Alerts,
    owner: &str,
) -> Result<gpum_protocol::AlertSettingsView, ApiError> {
    Ok(gpum_protocol::AlertSettingsView {
        settings: store::alert_settings(c, owner)?.unwrap_or_default(),
        email_available: alerts.smtp.is_some(),
        webhook_public_key: alerts.key.as_ref().map(|k| k.public_b64.clone()),
        sent: store::recent_notices(c, owner, store::RECENT_NOTICES)?,
    })
}

fn alerts_owner(scope: &Scope) -> Result<String, ApiError> {
    scope.owner().map(str::to_owned).ok_or_else(|| ApiError::not_found("endpoint"))
}

async fn get_alerts(State(st): St, Extension(scope): Extension<Scope>) -> Result<Response, ApiError> {
    let owner = alerts_owner(&scope)?;
    let alerts = st.alerts.clone();
    Ok(Json(st.db.call(move |c| alerts_view(c, &alerts, &owner)).await?).into_response())
}

async fn put_alerts(
    State(st): St,
    Extension(scope): Extension<Scope>,
    ApiJson(req): ApiJson<gpum_protocol::AlertSettings>,
) -> Result<Response, ApiError> {
    let owner = alerts_owner(&scope)?;
    let alerts = st.alerts.clone();
    let now = st.clock.now();
    let view = st
        .db
        .call(move |c| {
            store::set_alert_settings(c, &owner, &req, now)?;
            alerts_view(c, &alerts, &owner)
        })
        .await?;
    Ok(Json(view).into_response())
}

/// The key webhooks are signed with; 404 when the operator set none.
async fn alerts_public_key(State(st): St) -> Result<Response, ApiError> {
    let key = st.alerts.key.as_ref().ok_or_else(|| ApiError::not_found("alert signing key"))?;
    Ok(Json(gpum_protocol::AlertPublicKey {
        algorithm: "ed25519".into(),
        public_key: key.public_b64.clone(),
    })
    .into_response())
}

async fn update_node(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateNodeRequest>,
) -> Result<Response, ApiError> {
    Ok(Json(st.db.call(move |c| store::update_node(c, &id, &req, &scope)).await?).into_response())
}

async fn queue_command(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<QueueCommandRequest>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let r = st.db.call(move |c| store::queue_command(c, now, &id, &req.kind, &scope)).await?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

async fn rotate_token(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::rotate_token(c, now, &id, &scope)).await?).into_response())
}

/// Invites an owner: the one-time link to set a password, shown once.
async fn invite_owner(
    State(st): St,
    ApiJson(req): ApiJson<InviteOwnerRequest>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let (owner, token, expires_at) = st.db.call(move |c| accounts::invite(c, now, &req.email)).await?;
    let invitation_url = invitation_url(&st.cfg.public_url, &token);
    Ok((StatusCode::CREATED, Json(OwnerInvited { owner, invitation_url, expires_at })).into_response())
}

/// Where an invitation token is used: the dashboard's page that sets the password.
pub fn invitation_url(public_url: &str, token: &str) -> String {
    format!("{}/dashboard/invite/{token}", public_url.trim_end_matches('/'))
}

/// A page of the owners, `?limit=` and `?after=` as for the nodes.
async fn list_owners(State(st): St, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let page = page_query(q.as_deref(), true)?;
    Ok(Json(st.db.call(move |c| accounts::list_owners_page(c, &page)).await?).into_response())
}

/// Disables or enables an owner (by id or e-mail), and resets their second factor (the CLI's
/// `owners reset-2fa`).
async fn update_owner(
    State(st): St,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<UpdateOwnerRequest>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let r = st
        .db
        .call(move |c| {
            if req.reset_second_factor == Some(true) {
                accounts::reset_second_factor(c, now, &id)?;
            }
            match req.disabled {
                Some(d) => accounts::set_disabled(c, now, &id, d),
                None => accounts::find_owner(c, &id),
            }
        })
        .await?;
    Ok(Json(r).into_response())
}

// ---------------------------------------------------------------------------------------------
// Rentals (issue 33): the operator's

async fn list_releases(State(st): St) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::list_releases(c, now)).await?).into_response())
}

async fn start_rollout(
    State(st): St,
    Path(version): Path<String>,
    ApiJson(req): ApiJson<gpum_protocol::RolloutRequest>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let knobs = cfg!(feature = "test-knobs");
    Ok(Json(st.db.call(move |c| store::start_rollout(c, now, &version, &req, knobs)).await?).into_response())
}

async fn rollout_action(
    st: &AppState,
    action: gpum_platform_core::rollout::Action,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::rollout_action(c, now, action)).await?).into_response())
}

async fn pause_rollout(State(st): St) -> Result<Response, ApiError> {
    rollout_action(&st, gpum_platform_core::rollout::Action::Pause).await
}

async fn resume_rollout(State(st): St) -> Result<Response, ApiError> {
    rollout_action(&st, gpum_platform_core::rollout::Action::Resume).await
}

async fn halt_rollout(State(st): St) -> Result<Response, ApiError> {
    rollout_action(&st, gpum_platform_core::rollout::Action::Halt).await
}

async fn get_rental_registries(State(st): St) -> Result<Response, ApiError> {
    let registries = st.db.call(crate::rentals::registries).await?;
    Ok(Json(RentalRegistries { registries }).into_response())
}

async fn set_rental_registries(
    State(st): St,
    ApiJson(req): ApiJson<SetRentalRegistriesRequest>,
) -> Result<Response, ApiError> {
    let registries =
        st.db.call(move |c| crate::rentals::set_registries(c, req.registries.as_deref())).await?;
    Ok(Json(RentalRegistries { registries }).into_response())
}

async fn create_rental(
    State(st): St,
    ApiJson(req): ApiJson<CreateRentalRequest>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let r = st.db.call(move |c| crate::rentals::create(c, now, &req)).await?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

/// All rentals (an owner's: those on their servers), newest first; `?node=ID`: one node's. Any
/// other query parameter is refused.
async fn list_rentals(
    State(st): St,
    Extension(scope): Extension<Scope>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut node: Option<String> = None;
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.as_deref().unwrap_or(""))
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, "the query is not valid"))?;
    for (k, v) in pairs {
        match k.as_str() {
            "node" => node = Some(v),
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("unknown query parameter {k:?}"),
                ));
            }
        }
    }
    let now = st.clock.now();
    Ok(Json(
        st.db
            .call(move |c| crate::rentals::list(c, now, node.as_deref(), crate::rentals::MAX_LISTED, &scope))
            .await?,
    )
    .into_response())
}

/// Issue 46: the earnings of the rentals within the caller's scope, as JSON or
/// (`?format=csv`) CSV; the operator may name one owner (`?owner=ID`).
async fn earnings(
    State(st): St,
    Extension(scope): Extension<Scope>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut owner: Option<String> = None;
    let mut as_csv = false;
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q.as_deref().unwrap_or(""))
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, "the query is not valid"))?;
    for (k, v) in pairs {
        match (k.as_str(), v.as_str()) {
            ("owner", _) if matches!(scope, Scope::All) => owner = Some(v),
            ("format", "csv") => as_csv = true,
            ("format", "json") => as_csv = false,
            ("format", _) => {
                return Err(ApiError::new(ErrorCode::InvalidRequest, "format: csv or json"));
            }
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("unknown query parameter {k:?}"),
                ));
            }
        }
    }
    let now = st.clock.now();
    let e = st
        .db
        .call(move |c| {
            let owner = match &owner {
                Some(o) => Some(accounts::find_owner(c, o)?.id),
                None => None,
            };
            store::earnings(c, now, &scope, owner.as_deref())
        })
        .await?;
    if as_csv {
        let mut r = store::earnings_csv(&e).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
        r.headers_mut().insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment; filename=\"gpum-earnings.csv\""),
        );
        return Ok(r);
    }
    Ok(Json(e).into_response())
}

async fn show_rental(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| crate::rentals::show(c, now, &id, &scope)).await?).into_response())
}

async fn stop_rental(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let rid = id.clone();
    // Its tenants' streams close through the effect it records (`effects`), on every replica.
    let r = st.db.call(move |c| crate::rentals::stop(c, now, &rid)).await?;
    Ok(Json(r).into_response())
}

async fn set_known_containers(
    State(st): St,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<SetKnownContainersRequest>,
) -> Result<Response, ApiError> {
    let ids = req.container_ids.clone();
    st.db.call(move |c| store::set_known_containers(c, &id, &ids)).await?;
    Ok(Json(req).into_response())
}

/// The node's event log, newest first (a deleted node's holds only `deleted`).
async fn node_events(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    let r = st.db.call(move |c| store::node_events(c, &id, now, MAX_EVENTS_PER_NODE, &scope)).await?;
    Ok(Json(r).into_response())
}

/// The node's figures over the last day, oldest first.
async fn node_metrics(
    State(st): St,
    Extension(scope): Extension<Scope>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let now = st.clock.now();
    Ok(Json(st.db.call(move |c| store::node_samples(c, &id, now, &scope)).await?).into_response())
}

async fn get_probe_image(State(st): St) -> Result<Response, ApiError> {
    let image = st.db.call(store::probe_image).await?;
    Ok(Json(SetProbeImageRequest { image }).into_response())
}

async fn set_probe_image(
    State(st): St,
    ApiJson(req): ApiJson<SetProbeImageRequest>,
) -> Result<Response, ApiError> {
    let image = req.image.clone();
    st.db.call(move |c| store::set_probe_image(c, image.as_deref())).await?;
    Ok(Json(req).into_response())
}

// ---------------------------------------------------------------------------------------------
// Downloads

/// The bootstrap script for the URL fixed at start. The request (its `Host` included) plays no
/// part: a script built from a header could send nodes anywhere.
async fn install_sh(State(st): St) -> Response {
    let body = crate::install::render(&st.cfg.public_url);
    ([(header::CONTENT_TYPE, "text/x-shellscript; charset=utf-8")], body).into_response()
}

/// Whether `name` is a plain file name: no separators, no leading dot, nothing odd.
pub fn safe_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'+'))
}

/// Chunks a download is sent in; a slow client holds one or two of them, never the file.
const DOWNLOAD_CHUNK: usize = 64 * 1024;

/// `/dl/<file>`: a regular file of `--dist`, streamed. Anything else (a symlink, even to a file
/// inside the directory; a FIFO; a device; a directory) is 404.
async fn download(State(st): St, Path(file): Path<String>) -> Result<Response, ApiError> {
    let Some(dir) = &st.cfg.dist else { return Err(ApiError::not_found("file")) };
    if !safe_file_name(&file) {
        return Err(ApiError::not_found("file"));
    }
    let path = dir.join(&file);
    let opened = tokio::task::spawn_blocking(move || open_regular(&path)).await.ok().flatten();
    let Some((f, len)) = opened else { return Err(ApiError::not_found("file")) };
    let ct = if file.ends_with(".sha256") { "text/plain; charset=utf-8" } else { "application/octet-stream" };
    let stream = tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(f), DOWNLOAD_CHUNK);
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(ct)),
            (header::CONTENT_LENGTH, HeaderValue::from(len)),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Opens `path` for reading if, and only if, it is a regular file, with its length. The name is
/// checked with `lstat` first, then opened with `O_NOFOLLOW` (no symlink, even one swapped in
/// between) and `O_NONBLOCK` (opening a FIFO cannot block), and the opened file must be the one
/// checked and still regular.
pub fn open_regular(path: &FsPath) -> Option<(std::fs::File, u64)> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let before = std::fs::symlink_metadata(path).ok()?;
    if !before.file_type().is_file() {
        return None;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let m = f.metadata().ok()?;
    (m.file_type().is_file() && m.dev() == before.dev() && m.ino() == before.ino()).then_some((f, m.len()))
}

/// Where a server listens; printed on stdout once bound so callers can use port 0.
pub fn listening_line(tls: bool, addr: SocketAddr) -> String {
    format!("gpum-platform listening on {}://{addr}", if tls { "https" } else { "http" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;
    use tower::ServiceExt;

    /// (method, path) pairs under `paths:` in docs/openapi.yaml, read by indentation.
    fn openapi_routes() -> Vec<(String, String)> {
        let text = include_str!("../../docs/openapi.yaml");
        let mut in_paths = false;
        let mut path = String::new();
        let mut out = Vec::new();
        for line in text.lines() {
            if !line.starts_with(' ') {
                in_paths = line.starts_with("paths:");
                continue;
            }
            if !in_paths {
                continue;
            }
            if let Some(p) = line.strip_prefix("  /") {
                path = format!("/{}", p.trim_end_matches(':'));
            } else if let Some(m) = line.strip_prefix("    ")
                && !m.starts_with(' ')
                && let Some(m) = m.strip_suffix(':')
                && ["get", "post", "put", "delete", "patch"].contains(&m)
            {
                out.push((m.to_uppercase(), path.clone()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn openapi_lists_exactly_the_routes() {
        let mut ours: Vec<(String, String)> =
            ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        ours.sort();
        assert_eq!(openapi_routes(), ours);
    }

    #[tokio::test]
    async fn every_route_is_served_and_no_other_method() {
        let dir = tempfile::tempdir().unwrap();
        let conn = store::open(&dir.path().join("p.db")).unwrap();
        let db = Db::start(conn);
        let state = Arc::new(AppState {
            db: db.clone(),
            clock: Clock::system(),
            cfg: Config {
                heartbeat_interval_secs: 10,
                admin_token_hash: Some(Sha256::digest(b"t").into()),
                dist: None,
                public_url: "http://127.0.0.1:1".into(),
                body_timeout: Duration::from_secs(30),
                currency: gpum_platform_core::currency::DEFAULT,
            },
            relay: Arc::new(crate::relay::Relay::new(Default::default())),
            throttle: Arc::new(Throttle::new(db, Clock::system())),
            alerts: Default::default(),
        });
        let app = router(state);
        let call = |method: &str, path: &str| {
            let app = app.clone();
            let req = Request::builder()
                .method(Method::from_bytes(method.as_bytes()).unwrap())
                .uri(
                    path.replace("{id}", "node-x")
                        .replace("{file}", "gpum-install")
                        .replace("{version}", "0.1.0"),
                )
                .header(header::AUTHORIZATION, "Bearer t")
                .header(header::HOST, "127.0.0.1:1")
                .body(Body::from("{}"))
                .unwrap();
            async move {
                let resp = app.oneshot(req).await.unwrap();
                assert!(resp.headers().contains_key(header::DATE));
                let status = resp.status();
                let body = axum::body::to_bytes(resp.into_body(), BODY_LIMIT).await.unwrap();
                (status, String::from_utf8_lossy(&body).into_owned())
            }
        };
        for (m, p) in ROUTES {
            let (status, body) = call(m, p).await;
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{m} {p}");
            assert!(!body.contains("endpoint not found"), "{m} {p} is not routed");
            for other in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
                if ROUTES.iter().any(|(m2, p2)| *m2 == other && p2 == p) {
                    continue;
                }
                let (status, body) = call(other, p).await;
                assert!(
                    status == StatusCode::METHOD_NOT_ALLOWED && body.contains("method_not_allowed"),
                    "{other} {p}: {status} {body}"
                );
            }
        }
    }
}
