//! The limit on guessing (issue 29, item 6; issue 32; issue 43, items 2 and 12): wrong admin
//! tokens, owners' wrong passwords and codes, wrong API keys and wrong relay credentials.
//!
//! - **Per door.** Each door ([`Door`]) counts its own failures: a right answer at one door
//!   clears only that door's count, so a valid owner API key, relay credential or sign-in of
//!   one's own cannot be used to wipe the failures of a guesser at another door.
//! - **Per address.** An address may fail [`FREE_FAILURES`] times at a door; from then on each
//!   failure blocks it at that door for a backoff that doubles, from 1 s up to [`MAX_BACKOFF`].
//!   While blocked, every request from it at that door is `429 too_many_requests` with
//!   `Retry-After`, and its token is not even checked, so a block cannot be used to guess. The
//!   address is the TCP peer's (or a trusted front's PROXY header, `listen`), never a header:
//!   IPv4 as itself, IPv6 by its /64.
//! - **Per wider prefix** (item 12): an IPv6 client usually holds a whole /48, that is 65,536
//!   /64s. The /48 counts too, with [`WIDE_FREE_FAILURES`] free failures, so fresh /64s buy no
//!   fresh guesses; a success never clears it (it is forgotten with time only).
//! - **Per account** (the sign-in's e-mail, known or not, so the answer tells nothing about
//!   which accounts exist): failures from any number of addresses count against the account,
//!   [`FREE_FAILURES`] free, then a doubling block of at most [`ACCOUNT_MAX_BACKOFF`]: a bounded
//!   delay, never a lock. Only the account's own sign-in clears it.
//! - **Shared by replicas.** The counts live in the database (table `throttle`), updated by one
//!   conditional statement each (`INSERT … ON CONFLICT … DO UPDATE`), so N replicas together
//!   allow what one does. The rows hold a SHA-256 of the address or e-mail, never the address;
//!   a row is deleted an hour ([`FORGET_AFTER`]) after its last failure, or by its door's success.
//! - **No eviction** (item 12): a row leaves only when forgotten or cleared, so a flood of new
//!   addresses cannot reset one that is being throttled. The table holds at most
//!   [`MAX_TRACKED`] rows; while it is full, the failures of addresses without a row of their
//!   own count together in one overflow row per door, and while that row blocks, so does every
//!   address without a row of its own at that door (fail closed: under such a flood a new
//!   client may wait, the guesser gets nothing).
//! - Each refusal is logged (the address, the door, the count, the block), never the token.
//!
//! The rules (what a count blocks, and for how long) are pure functions in the core
//! (`gpum_platform_core::throttle`: [`backoff`], [`blocked_for`]); [`Throttle`] is the thin I/O
//! around them.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, header};
use axum::response::{IntoResponse, Response};
use gpum_protocol::ErrorCode;
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::db::Db;
use crate::error::ApiError;
use crate::params;
use crate::sql::{Conn, OptionalExtension};

/// The rules (the constants, each door, what a count blocks and for how long) are the core's.
pub use gpum_platform_core::throttle::{
    ACCOUNT_MAX_BACKOFF, Counted, Door, FORGET_AFTER, FREE_FAILURES, MAX_BACKOFF, MAX_TRACKED, Rule,
    WIDE_FREE_FAILURES, backoff, blocked_for, retry_after,
};

/// What a count is kept for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    /// A client's address as [`client_key`] gives it.
    Address(IpAddr),
    /// The /48 of an IPv6 address.
    Wide(Ipv6Addr),
    /// An account, by its e-mail as typed (trimmed, lower case).
    Account(String),
    /// Every address without a row of its own while the table is full.
    Overflow,
}

impl Subject {
    /// What the rules count it as.
    fn counted(&self) -> Counted {
        match self {
            Subject::Address(_) => Counted::Address,
            Subject::Wide(_) => Counted::Wide,
            Subject::Account(_) => Counted::Account,
            Subject::Overflow => Counted::Overflow,
        }
    }

    fn rule(&self) -> Rule {
        self.counted().rule()
    }

    /// The row's key: a hash, so the table holds no address and no e-mail.
    fn key(&self) -> String {
        let h = |kind: &str, bytes: &[u8]| {
            let mut d = Sha256::new();
            d.update(b"gpum-throttle\0");
            d.update(kind.as_bytes());
            d.update([0]);
            d.update(bytes);
            format!("{kind}:{}", hex::encode(d.finalize()))
        };
        match self {
            Subject::Address(IpAddr::V4(a)) => h("a4", &a.octets()),
            Subject::Address(IpAddr::V6(a)) => h("a6", &a.octets()),
            Subject::Wide(a) => h("w6", &a.octets()),
            Subject::Account(e) => h("u", e.as_bytes()),
            Subject::Overflow => "overflow".to_string(),
        }
    }

    /// Whether a success at its door clears it.
    fn cleared_by_success(&self) -> bool {
        self.counted().cleared_by_success()
    }
}

/// What is counted for `client` (and `account`, at a sign-in).
fn subjects(client: IpAddr, account: Option<&str>) -> Vec<Subject> {
    let mut out = vec![Subject::Address(client)];
    if let IpAddr::V6(v6) = client {
        let s = v6.segments();
        out.push(Subject::Wide(Ipv6Addr::new(s[0], s[1], s[2], 0, 0, 0, 0, 0)));
    }
    if let Some(a) = account {
        out.push(Subject::Account(account_key(a)));
    }
    out
}

/// An e-mail as the account's count knows it.
fn account_key(email: &str) -> String {
    email.trim().to_lowercase()
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

/// One count as stored.
#[derive(Debug, Clone, Copy)]
struct Count {
    failures: u32,
    last_ms: i64,
}

fn count(c: &Conn, door: Door, key: &str) -> crate::sql::Result<Option<Count>> {
    c.query_row(
        "SELECT failures, last_failure FROM throttle WHERE door = ?1 AND subject = ?2",
        params![door.code(), key],
        |r| {
            Ok(Count { failures: u32::try_from(r.get::<_, i64>(0)?).unwrap_or(u32::MAX), last_ms: r.get(1)? })
        },
    )
    .optional()
}

/// The longest block among `subjects` at `door` at `now_ms`: what [`Throttle::check`] asks.
fn check_in(c: &Conn, door: Door, subjects: &[Subject], now_ms: i64) -> crate::sql::Result<Option<Duration>> {
    let mut wait: Option<Duration> = None;
    let mut own_row = false;
    for s in subjects {
        let Some(n) = count(c, door, &s.key())? else { continue };
        own_row |= matches!(s, Subject::Address(_));
        wait = wait.max(blocked_for(s.rule(), n.failures, n.last_ms, now_ms));
    }
    if !own_row && let Some(n) = count(c, door, &Subject::Overflow.key())? {
        wait = wait.max(blocked_for(Subject::Overflow.rule(), n.failures, n.last_ms, now_ms));
    }
    Ok(wait)
}

/// Counts one failure of each of `subjects` at `door` (a subject without a row while the table
/// holds `max_rows` counts into the overflow row instead); the longest block it starts, with
/// the address's count for the log.
fn fail_in(
    c: &Conn,
    door: Door,
    subjects: &[Subject],
    now_ms: i64,
    max_rows: i64,
) -> crate::sql::Result<(Option<Duration>, u32)> {
    let forgotten = now_ms - FORGET_AFTER.as_millis() as i64;
    c.execute("DELETE FROM throttle WHERE last_failure < ?1", params![forgotten])?;
    let mut block: Option<Duration> = None;
    let mut address_failures = 0;
    let mut overflowed = false;
    for s in subjects {
        let mut s = s.clone();
        if count(c, door, &s.key())?.is_none() {
            let rows: i64 = c.query_row("SELECT COUNT(*) FROM throttle", [], |r| r.get(0))?;
            if rows >= max_rows {
                if overflowed {
                    continue;
                }
                overflowed = true;
                s = Subject::Overflow;
            }
        }
        let failures: i64 = c.query_row(
            "INSERT INTO throttle (door, subject, failures, last_failure) VALUES (?1, ?2, 1, ?3)
             ON CONFLICT (door, subject) DO UPDATE SET
                 failures = CASE WHEN throttle.last_failure < ?4 THEN 1 ELSE throttle.failures + 1 END,
                 last_failure = ?3
             RETURNING failures",
            params![door.code(), s.key(), now_ms, forgotten],
            |r| r.get(0),
        )?;
        let failures = u32::try_from(failures).unwrap_or(u32::MAX);
        if matches!(s, Subject::Address(_)) {
            address_failures = failures;
        }
        block = block.max(backoff(s.rule(), failures));
    }
    Ok((block, address_failures))
}

fn succeed_in(c: &Conn, door: Door, subjects: &[Subject]) -> crate::sql::Result<()> {
    for s in subjects.iter().filter(|s| s.cleared_by_success()) {
        c.execute("DELETE FROM throttle WHERE door = ?1 AND subject = ?2", params![door.code(), s.key()])?;
    }
    Ok(())
}

/// The log of refusals: at most one line per door a second, with how many were not logged, so
/// a blocked client that keeps knocking cannot fill the log.
#[derive(Default)]
struct RefusalLog {
    doors: std::collections::HashMap<&'static str, (std::time::Instant, u64)>,
}

impl RefusalLog {
    /// Whether to log a refusal at `door` now; `Some` with the refusals left out since the last.
    fn take(&mut self, door: Door, now: std::time::Instant) -> Option<u64> {
        let e = self.doors.entry(door.code()).or_insert((now - Duration::from_secs(2), 0));
        if now.duration_since(e.0) >= Duration::from_secs(1) {
            let skipped = e.1;
            *e = (now, 0);
            Some(skipped)
        } else {
            e.1 += 1;
            None
        }
    }
}

/// See the module docs.
pub struct Throttle {
    db: Db,
    clock: Clock,
    max_rows: i64,
    refusals: std::sync::Mutex<RefusalLog>,
}

impl Throttle {
    pub fn new(db: Db, clock: Clock) -> Throttle {
        Throttle { db, clock, max_rows: MAX_TRACKED, refusals: Default::default() }
    }

    /// With a smaller table, for tests of what happens when it is full.
    #[cfg(any(test, feature = "test-knobs"))]
    pub fn with_max_rows(mut self, max_rows: i64) -> Throttle {
        self.max_rows = max_rows;
        self
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_system().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    /// `Err` with the time left while `client` (or, at a sign-in, `account`) is blocked at
    /// `door`: the caller answers 429 with it (the APIs with [`too_many`], the sign-in with its
    /// form). Call it before looking at the secret. When the database cannot answer, the
    /// client is refused for a second (fail closed).
    pub async fn check(&self, door: Door, client: IpAddr, account: Option<&str>) -> Result<(), Duration> {
        let subjects = subjects(client, account);
        let now = self.now_ms();
        let r = self.db.call(move |c| check_in(c, door, &subjects, now).map_err(ApiError::from)).await;
        match r {
            Ok(None) => Ok(()),
            Ok(Some(wait)) => {
                let log = self
                    .refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take(door, std::time::Instant::now());
                if let Some(not_logged) = log {
                    tracing::warn!(
                        client = %client,
                        retry_after_s = retry_after(wait),
                        refusals_not_logged = not_logged,
                        "{}: refused, too many wrong answers",
                        door.name()
                    );
                }
                Err(wait)
            }
            Err(e) => {
                tracing::error!(error = %e.message, "{}: the throttle could not be read; refused", door.name());
                Err(Duration::from_secs(1))
            }
        }
    }

    /// Counts a wrong answer from `client` (and against `account`, at a sign-in) at `door`, and
    /// logs it. Returns the block it starts, if any.
    pub async fn failed(&self, door: Door, client: IpAddr, account: Option<&str>) -> Option<Duration> {
        let subjects = subjects(client, account);
        let now = self.now_ms();
        let max_rows = self.max_rows;
        let r =
            self.db.call(move |c| fail_in(c, door, &subjects, now, max_rows).map_err(ApiError::from)).await;
        match r {
            Ok((block, failures)) => {
                tracing::warn!(
                    client = %client,
                    failures,
                    blocked_for_s = block.map_or(0, |b| b.as_secs()),
                    "{}: wrong secret",
                    door.name()
                );
                block
            }
            Err(e) => {
                tracing::error!(error = %e.message, "{}: a failure could not be counted", door.name());
                None
            }
        }
    }

    /// A right answer at `door`: `client`'s count there (and `account`'s) starts afresh. Other
    /// doors' counts, and the /48's, are not touched.
    pub async fn succeeded(&self, door: Door, client: IpAddr, account: Option<&str>) {
        let subjects = subjects(client, account);
        let r = self.db.call(move |c| succeed_in(c, door, &subjects).map_err(ApiError::from)).await;
        if let Err(e) = r {
            tracing::error!(error = %e.message, "{}: a success could not be recorded", door.name());
        }
    }
}

/// The APIs' `429 too_many_requests`, with `Retry-After`.
pub fn too_many(wait: Duration) -> Response {
    let secs = retry_after(wait);
    let mut resp = ApiError::new(
        ErrorCode::TooManyRequests,
        format!("too many wrong secrets from this address; try again in {secs} s"),
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

    /// Each subject takes its rule from the core; the rules themselves are tested there.
    #[test]
    fn each_subject_counts_by_its_rule_and_a_429_says_when_to_retry() {
        let acct = Subject::Account("a@example.com".into()).rule();
        assert_eq!(backoff(acct, u32::MAX), Some(ACCOUNT_MAX_BACKOFF), "an account's delay is bounded");
        assert_eq!(Subject::Address(ip("192.0.2.1")).rule().free, FREE_FAILURES);
        assert_eq!(Subject::Wide(Ipv6Addr::UNSPECIFIED).rule().free, WIDE_FREE_FAILURES);
        assert!(!Subject::Overflow.cleared_by_success());
        let r = too_many(Duration::from_millis(200));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn refusals_are_logged_at_most_once_a_second_per_door() {
        let mut l = RefusalLog::default();
        let t0 = std::time::Instant::now();
        assert_eq!(l.take(Door::AdminApi, t0), Some(0));
        for _ in 0..1000 {
            assert_eq!(l.take(Door::AdminApi, t0 + Duration::from_millis(500)), None);
        }
        assert_eq!(l.take(Door::Relay, t0), Some(0), "another door");
        assert_eq!(l.take(Door::AdminApi, t0 + Duration::from_secs(1)), Some(1000));
    }

    #[test]
    fn ipv6_counts_by_its_64_and_its_48_and_mapped_ipv4_as_ipv4() {
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
        let a = subjects(req("[2001:db8:1:2::1]:5"), None);
        let b = subjects(req("[2001:db8:1:3::1]:5"), None);
        assert_ne!(a[0].key(), b[0].key());
        assert_eq!(a[1].key(), b[1].key(), "one /48");
        assert_eq!(subjects(ip("192.0.2.7"), None).len(), 1);
        assert_eq!(
            subjects(ip("192.0.2.7"), Some(" A@Example.com "))[1],
            Subject::Account("a@example.com".into())
        );
    }

    struct T {
        _db: crate::testdb::TestDb,
        conn: Conn,
    }

    fn table() -> T {
        let db = crate::testdb::TestDb::new();
        let conn = db.open();
        T { _db: db, conn }
    }

    fn fail(t: &T, door: Door, client: &str, account: Option<&str>, now: i64, max: i64) -> Option<Duration> {
        fail_in(&t.conn, door, &subjects(ip(client), account), now, max).unwrap().0
    }

    fn check(t: &T, door: Door, client: &str, account: Option<&str>, now: i64) -> Option<Duration> {
        check_in(&t.conn, door, &subjects(ip(client), account), now).unwrap()
    }

    fn ok(t: &T, door: Door, client: &str, account: Option<&str>) {
        succeed_in(&t.conn, door, &subjects(ip(client), account)).unwrap();
    }

    /// Item 2: a success clears only its own door's count (and only its own account's).
    #[test]
    fn a_success_clears_only_its_own_doors_count() {
        let t = table();
        let a = "192.0.2.1";
        for _ in 0..FREE_FAILURES {
            fail(&t, Door::SignIn, a, Some("victim@example.com"), 1000, MAX_TRACKED);
        }
        assert!(check(&t, Door::SignIn, a, None, 1000).is_some());
        for door in [Door::OwnerApi, Door::Relay, Door::AdminApi, Door::OperatorSignIn] {
            assert_eq!(check(&t, door, a, None, 1000), None, "{door:?} is not blocked");
            ok(&t, door, a, None);
        }
        assert!(check(&t, Door::SignIn, a, None, 1000).is_some(), "other doors' successes clear nothing");
        // A sign-in to another account of one's own clears the address, not the victim's count.
        ok(&t, Door::SignIn, a, Some("mine@example.com"));
        assert_eq!(check(&t, Door::SignIn, a, Some("mine@example.com"), 1000), None);
        assert!(check(&t, Door::SignIn, "198.51.100.9", Some("victim@example.com"), 1000).is_some());
        ok(&t, Door::SignIn, "198.51.100.9", Some("Victim@example.com"));
        assert_eq!(check(&t, Door::SignIn, a, Some("victim@example.com"), 1000), None);
    }

    /// Item 2: an account's failures from many addresses add up, and block it for a bounded
    /// while only.
    #[test]
    fn an_accounts_failures_from_many_addresses_add_up_to_a_bounded_delay() {
        let t = table();
        let mut last = None;
        for i in 0..50 {
            last = fail(&t, Door::SignIn, &format!("192.0.2.{i}"), Some("o@example.com"), 1000, MAX_TRACKED);
        }
        assert_eq!(last, Some(ACCOUNT_MAX_BACKOFF));
        assert!(check(&t, Door::SignIn, "203.0.113.1", Some("o@example.com"), 1000).is_some());
        assert_eq!(check(&t, Door::SignIn, "203.0.113.1", Some("other@example.com"), 1000), None);
        let later = 1000 + ACCOUNT_MAX_BACKOFF.as_millis() as i64;
        assert_eq!(check(&t, Door::SignIn, "203.0.113.1", Some("o@example.com"), later), None);
    }

    /// Item 12: fresh /64s of one /48 buy no fresh guesses.
    #[test]
    fn fresh_64s_of_one_48_do_not_reset_the_count() {
        let t = table();
        let mut blocked = 0;
        for i in 0..(WIDE_FREE_FAILURES + 10) {
            let a = format!("2001:db8:7:{i:x}::");
            if check(&t, Door::Relay, &a, None, 1000).is_some() {
                blocked += 1;
                continue;
            }
            fail(&t, Door::Relay, &a, None, 1000, MAX_TRACKED);
        }
        assert_eq!(blocked, 10, "past the /48's free failures every /64 of it is refused");
        assert_eq!(check(&t, Door::Relay, "2001:db8:8::", None, 1000), None, "another /48 is not");
    }

    /// Item 12: a full table evicts nobody; new addresses' failures share one overflow count.
    #[test]
    fn a_full_table_evicts_no_throttled_address() {
        let t = table();
        let max = 20;
        let victim = "192.0.2.1";
        for _ in 0..FREE_FAILURES + 3 {
            fail(&t, Door::Relay, victim, None, 1000, max);
        }
        let wait = check(&t, Door::Relay, victim, None, 1000).expect("blocked");
        for i in 0..200u32 {
            let a = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)).to_string();
            fail(&t, Door::Relay, &a, None, 1000 + i64::from(i), max);
        }
        let rows: i64 = t.conn.query_row("SELECT COUNT(*) FROM throttle", [], |r| r.get(0)).unwrap();
        assert!(rows <= max + 1, "{rows} rows");
        assert!(check(&t, Door::Relay, victim, None, 1000).is_some_and(|w| w >= wait), "still blocked");
        assert!(
            check(&t, Door::Relay, "10.9.9.9", None, 1200).is_some(),
            "the overflow blocks new addresses"
        );
        // After an hour the table is empty again.
        let later = 2000 + FORGET_AFTER.as_millis() as i64;
        fail(&t, Door::Relay, "10.9.9.9", None, later, max);
        let rows: i64 = t.conn.query_row("SELECT COUNT(*) FROM throttle", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 1);
    }

    /// No address is stored, only its hash.
    #[test]
    fn the_table_holds_no_address_and_no_email() {
        let t = table();
        fail(&t, Door::SignIn, "192.0.2.77", Some("someone@example.com"), 1000, MAX_TRACKED);
        let keys: Vec<String> = t
            .conn
            .prepare_cached("SELECT subject FROM throttle")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(keys.len(), 2);
        assert!(keys.iter().all(|k| !k.contains("192.0.2") && !k.contains("example")), "{keys:?}");
    }
}
