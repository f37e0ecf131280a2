//! The limit on guessing (issue 29, item 6; issue 32): wrong admin tokens (the admin API, the
//! operator's sign-in), owners' wrong passwords and codes (the dashboard's sign-in) and wrong API
//! keys (the owner API) share one budget per client address.
//!
//! - An address may get the token wrong [`FREE_FAILURES`] times. From then on each failure
//!   blocks it for a backoff that doubles, from 1 s up to [`MAX_BACKOFF`]; while blocked, every
//!   admin request from it is `429 too_many_requests` with `Retry-After`, and its token is not
//!   even checked, so a block cannot be used to guess.
//! - The address is the TCP peer's (`ConnectInfo`, set by the accept loop), never a header: the
//!   platform trusts none. IPv6 addresses count by their /64, which one client usually holds
//!   whole. Behind a TLS terminator every request comes from the terminator's address, so one
//!   guesser slows everyone's sign-in there; `docs/operator-guide.md` says so.
//! - A right token clears its address; an address with no failure for [`FORGET_AFTER`] is
//!   forgotten.
//! - Memory is bounded: at most [`MAX_TRACKED`] addresses are held; past it the forgotten ones
//!   go first, then the one whose last failure is oldest.
//! - Each refusal is logged (the address, the count, the block), never the token. Addresses live
//!   only in this table and the log; the database holds none.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, header};
use axum::response::{IntoResponse, Response};
use gpum_protocol::ErrorCode;

use crate::error::ApiError;

/// Wrong tokens an address may send before it is slowed down.
pub const FREE_FAILURES: u32 = 5;
/// The longest block.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long an address is remembered after its last failure.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// The most addresses held at once (each entry is a few dozen bytes).
pub const MAX_TRACKED: usize = 4096;

/// Where an admin token was presented, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    SignIn,
    AdminApi,
    /// The owner API's keys.
    OwnerApi,
    /// The relay's tenant credentials (issue 34).
    Relay,
}

impl Door {
    fn name(self) -> &'static str {
        match self {
            Door::SignIn => "dashboard sign-in",
            Door::AdminApi => "admin API",
            Door::OwnerApi => "owner API",
            Door::Relay => "tunnel relay",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    last_failure: Instant,
    blocked_until: Option<Instant>,
    /// Whether a refusal during the current block was logged (one line per block).
    block_logged: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Throttle {
    entries: Mutex<HashMap<IpAddr, Entry>>,
}

/// The address a request is counted under: the peer's, IPv4 as itself (also when mapped into
/// IPv6), IPv6 by its /64. A request without one (only in-process tests) shares one bucket.
pub fn client_key<B>(req: &Request<B>) -> IpAddr {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |c| c.0.ip());
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The backoff after `failures` wrong tokens, or none while within [`FREE_FAILURES`].
fn backoff(failures: u32) -> Option<Duration> {
    let over = failures.checked_sub(FREE_FAILURES)?;
    let secs = 1u64.checked_shl(over).unwrap_or(u64::MAX).min(MAX_BACKOFF.as_secs());
    Some(Duration::from_secs(secs))
}

impl Throttle {
    /// `Err` with the time left while `client` is blocked (the caller answers 429 with it: the
    /// admin API with [`too_many`], the sign-in with its form); call it before looking at the
    /// token.
    pub fn check(&self, client: IpAddr, door: Door) -> Result<(), Duration> {
        self.check_at(client, door, Instant::now())
    }

    fn check_at(&self, client: IpAddr, door: Door, now: Instant) -> Result<(), Duration> {
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = map.get_mut(&client) else { return Ok(()) };
        let Some(until) = e.blocked_until.filter(|u| *u > now) else { return Ok(()) };
        let wait = until - now;
        if !e.block_logged {
            e.block_logged = true;
            tracing::warn!(
                client = %client,
                failures = e.failures,
                retry_after_s = retry_after(wait),
                "{}: refused, too many wrong admin tokens from this address",
                door.name()
            );
        }
        Err(wait)
    }

    /// Counts a wrong token from `client` and logs it. Returns the block it starts, if any.
    pub fn failed(&self, client: IpAddr, door: Door) -> Option<Duration> {
        self.failed_at(client, door, Instant::now())
    }

    fn failed_at(&self, client: IpAddr, door: Door, now: Instant) -> Option<Duration> {
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(&client) && map.len() >= MAX_TRACKED {
            make_room(&mut map, now);
        }
        let e = map.entry(client).or_insert(Entry {
            failures: 0,
            last_failure: now,
            blocked_until: None,
            block_logged: false,
        });
        if now.duration_since(e.last_failure) >= FORGET_AFTER {
            e.failures = 0;
        }
        e.failures = e.failures.saturating_add(1);
        e.last_failure = now;
        let block = backoff(e.failures);
        e.blocked_until = block.map(|b| now + b);
        e.block_logged = false;
        tracing::warn!(
            client = %client,
            failures = e.failures,
            blocked_for_s = block.map_or(0, |b| b.as_secs()),
            "{}: wrong admin token",
            door.name()
        );
        block
    }

    /// A right token: `client` starts afresh.
    pub fn succeeded(&self, client: IpAddr) {
        let mut map = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&client);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

/// Drops the forgotten addresses and, if that is not enough, the one whose last failure is the
/// oldest.
fn make_room(map: &mut HashMap<IpAddr, Entry>, now: Instant) {
    map.retain(|_, e| now.duration_since(e.last_failure) < FORGET_AFTER);
    if map.len() >= MAX_TRACKED
        && let Some(oldest) = map.iter().min_by_key(|(_, e)| e.last_failure).map(|(k, _)| *k)
    {
        map.remove(&oldest);
    }
}

/// A wait in whole seconds, rounded up, at least 1: what `Retry-After` says.
pub fn retry_after(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

/// The admin API's `429 too_many_requests`, with `Retry-After`.
pub fn too_many(wait: Duration) -> Response {
    let secs = retry_after(wait);
    let mut resp = ApiError::new(
        ErrorCode::TooManyRequests,
        format!("too many wrong admin tokens from this address; try again in {secs} s"),
    )
    .into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn five_free_failures_then_a_doubling_block() {
        let t = Throttle::default();
        let a = ip("192.0.2.1");
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES - 1 {
            assert_eq!(t.failed_at(a, Door::AdminApi, t0), None);
            assert!(t.check_at(a, Door::AdminApi, t0).is_ok());
        }
        assert_eq!(t.failed_at(a, Door::SignIn, t0), Some(Duration::from_secs(1)));
        let r = too_many(t.check_at(a, Door::AdminApi, t0).unwrap_err());
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        // Another address is not touched.
        assert!(t.check_at(ip("192.0.2.2"), Door::AdminApi, t0).is_ok());
        // After the block, the next failure doubles it, up to the cap.
        let t1 = t0 + Duration::from_secs(1);
        assert!(t.check_at(a, Door::AdminApi, t1).is_ok());
        assert_eq!(t.failed_at(a, Door::AdminApi, t1), Some(Duration::from_secs(2)));
        assert_eq!(t.check_at(a, Door::AdminApi, t1), Err(Duration::from_secs(2)));
        for n in 0..20 {
            t.failed_at(a, Door::AdminApi, t1 + Duration::from_secs(n));
        }
        assert_eq!(backoff(u32::MAX), Some(MAX_BACKOFF));
        // A right token clears it; an hour without failures forgets it.
        t.succeeded(a);
        assert!(t.check_at(a, Door::AdminApi, t1).is_ok());
        for _ in 0..FREE_FAILURES {
            t.failed_at(a, Door::AdminApi, t1);
        }
        assert_eq!(t.failed_at(a, Door::AdminApi, t1 + FORGET_AFTER), None);
    }

    #[test]
    fn the_table_is_bounded_and_evicts_the_oldest() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let first = ip("10.0.0.0");
        for _ in 0..FREE_FAILURES {
            t.failed_at(first, Door::AdminApi, t0);
        }
        for i in 1..(MAX_TRACKED as u32 + 100) {
            t.failed_at(
                IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000u32 + i)),
                Door::AdminApi,
                t0 + Duration::from_millis(i.into()),
            );
        }
        assert_eq!(t.len(), MAX_TRACKED);
        assert!(t.check_at(first, Door::AdminApi, t0).is_ok(), "the oldest went first");
    }

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let req = |a: &str| {
            let mut r = Request::new(());
            r.extensions_mut().insert(ConnectInfo(a.parse::<SocketAddr>().unwrap()));
            client_key(&r)
        };
        assert_eq!(req("[2001:db8:1:2:aaaa::1]:5"), req("[2001:db8:1:2:bbbb::9]:6"));
        assert_ne!(req("[2001:db8:1:2::1]:5"), req("[2001:db8:1:3::1]:5"));
        assert_eq!(req("[::ffff:192.0.2.7]:5"), ip("192.0.2.7"));
        assert_eq!(req("192.0.2.7:80"), ip("192.0.2.7"));
        assert_eq!(client_key(&Request::new(())), ip("::"));
    }
}
