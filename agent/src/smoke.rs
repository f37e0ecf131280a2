//! `gpum-agent smoke` and `doctor --connectivity`: one handshake with the platform.
//!
//! Exit codes, as the peer agent documents them: 0 ok, 3 no answer within 10 s, 4 the platform
//! rejected the token (a JSON 401 or 410 from the platform itself), 1 anything else — a
//! refused connection, a TLS failure, a proxy's HTML page, a 5xx.
//!
//! The handshake is a heartbeat with sequence number 0 and the full inventory. It does not run
//! commands: a command the platform hands out in its answer is left for the service.

use std::sync::Arc;
use std::time::Duration;

use gpum_common::exit;
use gpum_host::Host;
use gpum_protocol::{ErrorCode, Health, HeartbeatRequest};

use crate::client::{CallError, Platform};
use crate::config::{Config, Paths};
use crate::inventory::Gatherer;

/// The whole handshake's budget.
pub const BUDGET: Duration = Duration::from_secs(10);

/// What one handshake found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub code: i32,
    pub detail: String,
    pub clock_skew_secs: Option<i64>,
}

/// The exit code for a handshake's failure.
pub fn code_for(e: &CallError) -> i32 {
    match e {
        CallError::Timeout => exit::SMOKE_TIMEOUT,
        CallError::Api { code: ErrorCode::Unauthorized | ErrorCode::TokenReplaced, status: 401, .. }
        | CallError::Api { code: ErrorCode::NodeDeleted, status: 410, .. } => exit::SMOKE_TOKEN_REJECTED,
        _ => exit::OTHER,
    }
}

/// One handshake with the configured platform.
pub async fn handshake(host: Arc<dyn Host>, paths: &Paths) -> Handshake {
    let fail = |detail: String| Handshake { code: exit::OTHER, detail, clock_skew_secs: None };
    let cfg = match Config::load(host.as_ref(), &paths.config) {
        Ok(c) => c,
        Err(e) => return fail(e.to_string()),
    };
    let roots = match cfg.extra_roots(host.as_ref()) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    let platform = match Platform::new(&cfg.server, roots, BUDGET) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string()),
    };
    let work = async {
        let docker_version = crate::run::docker_version(host.as_ref(), cfg.docker_socket.as_deref()).await;
        let mut g = Gatherer::new(host.clone());
        let inv = g.inventory(docker_version.clone());
        let req = HeartbeatRequest {
            seq: 0,
            inventory_hash: inv.hash(),
            inventory: Some(inv),
            metrics: g.metrics(),
            health: Health {
                docker_ok: docker_version.is_some(),
                nvml: g.nvml_state(),
                ..Default::default()
            },
            ..Default::default()
        };
        platform.heartbeat(&cfg.token, &req).await
    };
    match tokio::time::timeout(BUDGET, work).await {
        Err(_) => Handshake {
            code: exit::SMOKE_TIMEOUT,
            detail: CallError::Timeout.to_string(),
            clock_skew_secs: None,
        },
        Ok(Err(e)) => Handshake { code: code_for(&e), detail: e.to_string(), clock_skew_secs: None },
        Ok(Ok(ans)) => Handshake {
            code: exit::OK,
            detail: format!("the platform at {} answered", cfg.server),
            clock_skew_secs: crate::client::clock_skew(host.now(), ans.server_date),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let api = |status, code| CallError::Api { status, code, message: String::new() };
        assert_eq!(code_for(&CallError::Timeout), 3);
        assert_eq!(code_for(&api(401, ErrorCode::Unauthorized)), 4);
        assert_eq!(code_for(&api(401, ErrorCode::TokenReplaced)), 4);
        assert_eq!(code_for(&api(410, ErrorCode::NodeDeleted)), 4);
        assert_eq!(code_for(&CallError::Foreign { status: 401, content_type: "text/html".into() }), 1);
        assert_eq!(code_for(&CallError::Transport("refused".into())), 1);
        assert_eq!(code_for(&api(500, ErrorCode::Internal)), 1);
    }
}
