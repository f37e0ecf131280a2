//! The agent's side of the protocol: register and heartbeat over HTTPS, and what each failure
//! means.
//!
//! Deciding *whether* a failure is final is [`classify`]'s job, and nothing else decides it:
//! only an authenticated JSON `node_deleted` (410) or `token_replaced` (401) stops the agent for
//! good. A proxy's HTML 401/403, a 5xx, a timeout or a body that is not ours are all retried,
//! because a wrong "stop" leaves an owner's machine offline until someone reinstalls.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use gpum_host::http::{
    ClientOptions, PostAnswer, PostClient, PostError, Upgrade, client_for, error_chain, proxy_in_env,
};
use gpum_protocol::{
    EnrollRequest, EnrollResponse, ErrorBody, ErrorCode, HeartbeatRequest, HeartbeatResponse, PATH_ENROLL,
    PATH_HEARTBEAT, PATH_REGISTER, PATH_TUNNEL, RegisterRequest, RegisterResponse, TUNNEL_UPGRADE,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::secret::Token;

/// How long one request may take, all included. Shorter than systemd's stop timeout, so a
/// heartbeat in flight never holds up a stop.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer body read. A heartbeat answer within the protocol's limits (16 commands,
/// 1024 known container ids) is well under 200 kB; a larger one is not read into memory.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Why a call did not produce the expected answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The platform answered with its JSON error body.
    #[error("platform answered {status} {code:?}: {message}")]
    Api { status: u16, code: ErrorCode, message: String },
    /// Something answered, but not with our JSON: a proxy page, a bare 5xx, a captive portal.
    #[error("unexpected answer {status} ({content_type})")]
    Foreign { status: u16, content_type: String },
    /// No answer in time.
    #[error("no answer within the timeout")]
    Timeout,
    /// Could not connect, or the connection broke (includes TLS failures).
    #[error("cannot reach the platform: {0}")]
    Transport(String),
    /// A success status with a body we cannot read.
    #[error("unreadable answer: {0}")]
    Decode(String),
}

/// What the run loop does about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The platform revoked this node: record why, stop, and let systemd leave it stopped.
    StopForGood(ErrorCode),
    /// Anything else: back off and try again.
    Retry,
}

/// The one place that decides whether a failure ends the agent. See the module docs.
pub fn classify(e: &CallError) -> Verdict {
    match e {
        CallError::Api { status, code, .. } if code.is_revocation() && *status == code.http_status() => {
            Verdict::StopForGood(*code)
        }
        _ => Verdict::Retry,
    }
}

/// Whether the platform, or a proxy in front of it, refused the request's body itself (400
/// malformed, 413 too large, 422 unprocessable): sending the same body again would be refused
/// again. The agent's run loop then trims what it sends (its `outbox`).
pub fn is_refused_body(e: &CallError) -> bool {
    matches!(
        e,
        CallError::Api { status: 400 | 413 | 422, .. } | CallError::Foreign { status: 400 | 413 | 422, .. }
    )
}

/// An answer and the platform's clock.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    pub body: T,
    /// The `Date` header, when present and valid.
    pub server_date: Option<SystemTime>,
    /// Bytes of the request body sent (for the benchmark and debug logs).
    pub sent_bytes: usize,
}

/// Seconds `local` is ahead of `server`, when it is far enough off to matter. `Date` has a
/// one-second resolution and the request takes time, so a few seconds are noise.
pub fn clock_skew(local: SystemTime, server: Option<SystemTime>) -> Option<i64> {
    const NOISE_SECS: i64 = 5;
    let server = server?;
    let skew = match local.duration_since(server) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    (skew.abs() >= NOISE_SECS).then_some(skew)
}

/// A client of one platform.
#[derive(Clone)]
pub struct Platform {
    http: reqwest::Client,
    server: String,
    /// The heartbeat's own lean client ([`PostClient`]: one kept HTTP/1.1 connection over
    /// rustls, without reqwest's layers), made once. `None` when a proxy variable is set; the
    /// heartbeat then goes through reqwest, which speaks to proxies.
    heartbeat: Option<PostClient>,
    /// The tunnel's client (issue 34): the same TLS settings, one connection per tunnel,
    /// through the proxy the environment names for the platform (`CONNECT`, then TLS inside),
    /// by reqwest's rules, so it takes the heartbeat's path. `Err` (why) when that proxy is one
    /// it cannot speak to: the tunnel never goes around the owner's proxy
    /// ([`Platform::can_tunnel`]).
    tunnel: Result<PostClient, String>,
    /// The last heartbeat answer (2xx) read, and what it decoded to. A steady node gets the
    /// same answer every time (the interval, the known containers, the rentals): the same bytes
    /// decode to the same value, so they are decoded once.
    last_answer: Arc<Mutex<Option<LastAnswer>>>,
}

/// A heartbeat answer's body, and what it decoded to.
type LastAnswer = (Vec<u8>, HeartbeatResponse);

/// The connection of an established tunnel: the upgraded HTTP/1.1 connection.
pub type TunnelIo = gpum_host::http::UpgradedIo;

impl Platform {
    /// A client for `server` (https, or http to loopback), trusting `extra_roots_pem` besides
    /// the bundled roots.
    pub fn new(
        server: &str,
        extra_roots_pem: Vec<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Platform, CallError> {
        let opts = ClientOptions {
            extra_roots_pem,
            timeout: Some(timeout),
            connect_timeout: Some(CONNECT_TIMEOUT.min(timeout)),
            user_agent: Some(crate::USER_AGENT.to_string()),
        };
        let http = client_for(server, &opts).map_err(|e| CallError::Transport(e.to_string()))?;
        let server = server.trim_end_matches('/').to_string();
        let heartbeat = if proxy_in_env() {
            None
        } else {
            Some(
                PostClient::new(&format!("{server}{PATH_HEARTBEAT}"), &opts)
                    .map_err(|e| CallError::Transport(e.to_string()))?,
            )
        };
        let tunnel = PostClient::new(&format!("{server}{PATH_TUNNEL}"), &opts)
            .map_err(|e| CallError::Transport(e.to_string()))?
            .through_env_proxy()
            .map_err(|e| e.to_string());
        Ok(Platform { http, server, heartbeat, tunnel, last_answer: Arc::default() })
    }

    /// Opens the tunnel (issue 34): `GET` [`PATH_TUNNEL`] upgraded to [`TUNNEL_UPGRADE`] with
    /// the node's token. Any other answer is an error that [`classify`] judges as it judges a
    /// heartbeat's (a deleted node or a replaced token is final).
    pub async fn tunnel(&self, token: &Token) -> Result<TunnelIo, CallError> {
        let tunnel = self.tunnel.as_ref().map_err(|why| CallError::Transport(why.clone()))?;
        let up =
            tunnel.upgrade(TUNNEL_UPGRADE, token.expose(), MAX_ANSWER_BYTES).await.map_err(|e| match e {
                PostError::Timeout => CallError::Timeout,
                PostError::TooLarge(max) => {
                    CallError::Decode(format!("the answer is larger than {max} bytes"))
                }
                PostError::Transport(s) => {
                    CallError::Transport(truncate(&format!("error opening the tunnel: {s}"), 300))
                }
            })?;
        match up {
            Upgrade::Switched(io) => Ok(io),
            Upgrade::Refused(PostAnswer { status, headers, body }) => {
                let content_type = headers
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                match answer::<serde_json::Value>(status, None, &content_type, &body, 0) {
                    // A 2xx that is not 101: the server does not speak the tunnel.
                    Ok(_) => Err(CallError::Foreign { status, content_type: truncate(&content_type, 60) }),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Whether this machine can open the tunnel: `Err` (why) when the proxy the environment
    /// names is one the tunnel's client cannot speak to (it never goes around it).
    pub fn can_tunnel(&self) -> Result<(), String> {
        self.tunnel.as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// The proxy the tunnel goes through (`host:port`), if any.
    pub fn tunnel_proxy(&self) -> Option<String> {
        self.tunnel.as_ref().ok().and_then(PostClient::proxy)
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    pub async fn enroll(&self, req: &EnrollRequest) -> Result<Answer<EnrollResponse>, CallError> {
        self.post(format!("{}{PATH_ENROLL}", self.server), None, req).await
    }

    pub async fn register(&self, req: &RegisterRequest) -> Result<Answer<RegisterResponse>, CallError> {
        self.post(format!("{}{PATH_REGISTER}", self.server), None, req).await
    }

    /// One heartbeat: the request's JSON, the call, the answer decoded. Its future is boxed
    /// (small to hold in the step's).
    pub fn heartbeat<'a>(
        &'a self,
        token: &'a Token,
        req: &'a HeartbeatRequest,
    ) -> Pin<Box<impl Future<Output = Result<Answer<HeartbeatResponse>, CallError>> + 'a>> {
        Box::pin(self.heartbeat_call(token, req))
    }

    async fn heartbeat_call(
        &self,
        token: &Token,
        req: &HeartbeatRequest,
    ) -> Result<Answer<HeartbeatResponse>, CallError> {
        let Some(client) = &self.heartbeat else {
            return self.post(format!("{}{PATH_HEARTBEAT}", self.server), Some(token), req).await;
        };
        let bytes = encode(req)?;
        let sent_bytes = bytes.len();
        let a =
            client.post_json(bytes, Some(token.expose()), MAX_ANSWER_BYTES).await.map_err(|e| match e {
                PostError::Timeout => CallError::Timeout,
                PostError::TooLarge(max) => {
                    CallError::Decode(format!("the answer is larger than {max} bytes"))
                }
                PostError::Transport(s) => {
                    CallError::Transport(truncate(&format!("error sending request: {s}"), 300))
                }
            })?;
        let PostAnswer { status, headers, body } = a;
        let header = |name| headers.get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok());
        let server_date = header(reqwest::header::DATE).and_then(|s| httpdate::parse_http_date(s).ok());
        if (200..300).contains(&status) {
            let mut last = self.last_answer.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((bytes, decoded)) = last.as_ref()
                && *bytes == body
            {
                return Ok(Answer { body: decoded.clone(), server_date, sent_bytes });
            }
            let a = answer::<HeartbeatResponse>(status, server_date, "", &body, sent_bytes)?;
            *last = Some((body, a.body.clone()));
            return Ok(a);
        }
        let content_type = header(reqwest::header::CONTENT_TYPE).unwrap_or("").to_string();
        answer(status, server_date, &content_type, &body, sent_bytes)
    }

    /// One file of a release (issue 47): `GET` [`gpum_protocol::upgrade::release_file_path`]
    /// with the node's token, its body handed to `each` piece by piece as it arrives, at most
    /// `max` bytes (more is refused before it is all read). `each` may refuse a piece (the
    /// caller's verifier): the download stops there with [`CallError::Decode`] carrying its
    /// reason. Nothing of the body is trusted here: the caller verifies it.
    pub async fn release_file(
        &self,
        token: &Token,
        version: &str,
        file: &str,
        max: u64,
        each: &mut (dyn FnMut(&[u8]) -> Result<(), String> + Send),
    ) -> Result<(), CallError> {
        let url = format!("{}{}", self.server, gpum_protocol::upgrade::release_file_path(version, file));
        let mut resp = self.http.get(url).bearer_auth(token.expose()).send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let content_type = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = read_capped(resp, 64 * 1024).await.unwrap_or_default();
            return match answer::<serde_json::Value>(status, None, &content_type, &body, 0) {
                Ok(_) => Err(CallError::Foreign { status, content_type: truncate(&content_type, 60) }),
                Err(e) => Err(e),
            };
        }
        if resp.content_length().is_some_and(|n| n > max) {
            return Err(CallError::Decode(format!("{file} is larger than {max} bytes")));
        }
        let mut got = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            got += chunk.len() as u64;
            if got > max {
                return Err(CallError::Decode(format!("{file} is larger than {max} bytes")));
            }
            each(&chunk).map_err(CallError::Decode)?;
        }
        Ok(())
    }

    async fn post<U: reqwest::IntoUrl, Req: Serialize, Resp: DeserializeOwned>(
        &self,
        url: U,
        token: Option<&Token>,
        body: &Req,
    ) -> Result<Answer<Resp>, CallError> {
        let bytes = encode(body)?;
        let sent_bytes = bytes.len();
        let mut rb =
            self.http.post(url).header(reqwest::header::CONTENT_TYPE, "application/json").body(bytes);
        if let Some(t) = token {
            // bearer_auth marks the header value sensitive, so hyper never prints it.
            rb = rb.bearer_auth(t.expose());
        }
        let resp = rb.send().await.map_err(transport)?;
        let status = resp.status().as_u16();
        let server_date = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| httpdate::parse_http_date(s).ok());
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = read_capped(resp, MAX_ANSWER_BYTES).await?;
        answer(status, server_date, &content_type, &body, sent_bytes)
    }
}

/// What an answer read whole means: ours on success, the platform's JSON error, or something
/// else's page.
fn answer<Resp: DeserializeOwned>(
    status: u16,
    server_date: Option<SystemTime>,
    content_type: &str,
    body: &[u8],
    sent_bytes: usize,
) -> Result<Answer<Resp>, CallError> {
    if (200..300).contains(&status) {
        let body = serde_json::from_slice(body).map_err(|e| CallError::Decode(e.to_string()))?;
        return Ok(Answer { body, server_date, sent_bytes });
    }
    if content_type.starts_with("application/json")
        && let Ok(e) = serde_json::from_slice::<ErrorBody>(body)
    {
        return Err(CallError::Api { status, code: e.error.code, message: truncate(&e.error.message, 200) });
    }
    Err(CallError::Foreign { status, content_type: truncate(content_type, 60) })
}

/// A request's JSON, written into room for a steady heartbeat (about 500 bytes), so that it
/// does not grow three times on the way (`serde_json::to_vec` starts at 128 bytes).
fn encode<Req: Serialize>(body: &Req) -> Result<Vec<u8>, CallError> {
    let mut out = Vec::with_capacity(1024);
    serde_json::to_writer(&mut out, body).map_err(|e| CallError::Decode(e.to_string()))?;
    Ok(out)
}

/// Reads an answer's body, refusing one larger than `max` bytes before it is all in memory.
async fn read_capped(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, CallError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(CallError::Decode(format!("the answer is larger than {max} bytes")));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > max {
            return Err(CallError::Decode(format!("the answer is larger than {max} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn transport(e: reqwest::Error) -> CallError {
    if e.is_timeout() {
        return CallError::Timeout;
    }
    // The full chain says "connection refused" or which TLS check failed; reqwest's top line
    // alone does not.
    CallError::Transport(truncate(&error_chain(&e), 300))
}

/// `s` cut to at most `max` bytes on a character boundary, with `…` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, code: ErrorCode) -> CallError {
        CallError::Api { status, code, message: String::new() }
    }

    #[test]
    fn only_authenticated_json_revocations_stop() {
        assert_eq!(classify(&api(410, ErrorCode::NodeDeleted)), Verdict::StopForGood(ErrorCode::NodeDeleted));
        assert_eq!(
            classify(&api(401, ErrorCode::TokenReplaced)),
            Verdict::StopForGood(ErrorCode::TokenReplaced)
        );
        // A revocation code with the wrong status is not the platform speaking.
        assert_eq!(classify(&api(200, ErrorCode::NodeDeleted)), Verdict::Retry);
        assert_eq!(classify(&api(500, ErrorCode::TokenReplaced)), Verdict::Retry);
        for e in [
            api(401, ErrorCode::Unauthorized),
            api(500, ErrorCode::Internal),
            api(400, ErrorCode::InvalidJson),
            api(404, ErrorCode::NotFound),
            CallError::Foreign { status: 401, content_type: "text/html".into() },
            CallError::Foreign { status: 403, content_type: "text/html".into() },
            CallError::Foreign { status: 410, content_type: "text/html".into() },
            CallError::Foreign { status: 502, content_type: String::new() },
            CallError::Timeout,
            CallError::Transport("refused".into()),
            CallError::Decode("eof".into()),
        ] {
            assert_eq!(classify(&e), Verdict::Retry, "{e:?}");
        }
    }

    #[test]
    fn only_body_refusals_trim_the_outbox() {
        assert!(is_refused_body(&api(400, ErrorCode::InvalidJson)));
        assert!(is_refused_body(&CallError::Foreign { status: 413, content_type: "text/html".into() }));
        for e in [
            api(401, ErrorCode::Unauthorized),
            api(500, ErrorCode::Internal),
            CallError::Foreign { status: 502, content_type: String::new() },
            CallError::Timeout,
        ] {
            assert!(!is_refused_body(&e), "{e:?}");
        }
    }

    #[test]
    fn skew() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(clock_skew(t, None), None);
        assert_eq!(clock_skew(t, Some(t - Duration::from_secs(2))), None);
        assert_eq!(clock_skew(t, Some(t - Duration::from_secs(120))), Some(120));
        assert_eq!(clock_skew(t, Some(t + Duration::from_secs(300))), Some(-300));
    }

    #[test]
    fn truncates_on_char_boundaries() {
        assert_eq!(truncate("абв", 3), "а…");
        assert_eq!(truncate("abc", 3), "abc");
    }
}
