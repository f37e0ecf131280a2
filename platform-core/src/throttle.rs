//! The throttle's rules (issue 29, item 6; issue 32; issue 43, items 2 and 12): what a count of
//! wrong secrets at a door blocks, and for how long. `gpum_platform::throttle` keeps the counts
//! in the database (shared by replicas) and asks these functions; its module docs tell the whole
//! design (per door, per address, per /48, per account, the overflow row).
//!
//! Times are Unix milliseconds given by the caller: nothing here reads a clock.

use std::time::Duration;

/// Wrong answers an address (or an account) may give at one door before it is slowed down.
pub const FREE_FAILURES: u32 = 5;
/// Wrong answers an IPv6 /48 may give at one door, all its /64s together.
pub const WIDE_FREE_FAILURES: u32 = 64;
/// The longest block of an address.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The longest block of an account: the owner waits at most this long, whoever guesses.
pub const ACCOUNT_MAX_BACKOFF: Duration = Duration::from_secs(60);
/// How long a count is remembered after its last failure.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);
/// The most rows the table holds (each a few dozen bytes).
pub const MAX_TRACKED: i64 = 65_536;

/// Where a secret was presented. Each door counts on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Door {
    /// The admin API's bearer token.
    AdminApi,
    /// The operator's sign-in to the dashboard (the admin token in a form).
    OperatorSignIn,
    /// An owner's sign-in to the dashboard (e-mail, password, code).
    SignIn,
    /// A signed-in owner's password and code on the account page (issue 43), counted per
    /// address and per account (the owner's id): a session is not the account.
    AccountPage,
    /// The owner API's keys.
    OwnerApi,
    /// The relay's tenant credentials (issue 34), both doors.
    Relay,
}

impl Door {
    /// Every door, once.
    pub const ALL: [Door; 6] =
        [Door::AdminApi, Door::OperatorSignIn, Door::SignIn, Door::AccountPage, Door::OwnerApi, Door::Relay];

    /// For the log.
    pub fn name(self) -> &'static str {
        match self {
            Door::AdminApi => "admin API",
            Door::OperatorSignIn => "operator sign-in",
            Door::SignIn => "dashboard sign-in",
            Door::AccountPage => "account page",
            Door::OwnerApi => "owner API",
            Door::Relay => "tunnel relay",
        }
    }

    /// As stored in `throttle.door`.
    pub fn code(self) -> &'static str {
        match self {
            Door::AdminApi => "admin",
            Door::OperatorSignIn => "operator",
            Door::SignIn => "sign-in",
            Door::AccountPage => "account",
            Door::OwnerApi => "owner-api",
            Door::Relay => "relay",
        }
    }
}

/// What a count is kept for, as far as the rules care (the platform's subject carries the
/// address or the account itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// One client's address (IPv4, or an IPv6 /64).
    Address,
    /// The /48 of an IPv6 address.
    Wide,
    /// An account, by its e-mail.
    Account,
    /// Every address without a row of its own while the table is full.
    Overflow,
}

impl Counted {
    /// How many failures it has free, and its longest block.
    pub fn rule(self) -> Rule {
        match self {
            Counted::Address | Counted::Overflow => Rule { free: FREE_FAILURES, max: MAX_BACKOFF },
            Counted::Wide => Rule { free: WIDE_FREE_FAILURES, max: MAX_BACKOFF },
            Counted::Account => Rule { free: FREE_FAILURES, max: ACCOUNT_MAX_BACKOFF },
        }
    }

    /// Whether a success at its door clears it (a /48 and the overflow are forgotten with time
    /// only, so a success of one's own cannot wipe a guesser's count).
    pub fn cleared_by_success(self) -> bool {
        matches!(self, Counted::Address | Counted::Account)
    }
}

/// How many failures a subject has free, and its longest block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub free: u32,
    pub max: Duration,
}

/// The block after `failures` failures under `rule`, or none while within its free ones: 1 s at
/// the first failure past the free ones, doubling up to `rule.max`.
pub fn backoff(rule: Rule, failures: u32) -> Option<Duration> {
    let over = failures.checked_sub(rule.free)?;
    let secs = 1u64.checked_shl(over).unwrap_or(u64::MAX).min(rule.max.as_secs());
    Some(Duration::from_secs(secs))
}

/// How much longer a count of `failures`, the last at `last_ms`, blocks at `now_ms` (Unix
/// milliseconds); `None` when it does not (within the free ones, the block over, or forgotten).
pub fn blocked_for(rule: Rule, failures: u32, last_ms: i64, now_ms: i64) -> Option<Duration> {
    if now_ms.saturating_sub(last_ms) >= FORGET_AFTER.as_millis() as i64 {
        return None;
    }
    let until = last_ms.saturating_add(backoff(rule, failures)?.as_millis() as i64);
    (until > now_ms).then(|| Duration::from_millis((until - now_ms) as u64))
}

/// A wait in whole seconds, rounded up, at least 1: what `Retry-After` says.
pub fn retry_after(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ADDR: Rule = Rule { free: FREE_FAILURES, max: MAX_BACKOFF };

    #[test]
    fn five_free_failures_then_a_doubling_block_forgotten_after_an_hour() {
        assert_eq!(backoff(ADDR, FREE_FAILURES - 1), None);
        assert_eq!(backoff(ADDR, FREE_FAILURES), Some(Duration::from_secs(1)));
        assert_eq!(backoff(ADDR, FREE_FAILURES + 1), Some(Duration::from_secs(2)));
        assert_eq!(backoff(ADDR, u32::MAX), Some(MAX_BACKOFF));
        assert_eq!(backoff(Counted::Account.rule(), u32::MAX), Some(ACCOUNT_MAX_BACKOFF), "bounded");
        assert_eq!(backoff(Counted::Wide.rule(), WIDE_FREE_FAILURES - 1), None);
        assert_eq!(blocked_for(ADDR, 5, 1000, 1500), Some(Duration::from_millis(500)));
        assert_eq!(blocked_for(ADDR, 5, 1000, 2000), None);
        assert_eq!(blocked_for(ADDR, 4, 1000, 1000), None);
        let hour = FORGET_AFTER.as_millis() as i64;
        assert_eq!(blocked_for(ADDR, 100, 0, hour), None, "forgotten");
        assert_eq!(retry_after(Duration::from_millis(200)), 1);
        assert_eq!(retry_after(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after(Duration::ZERO), 1);
    }

    #[test]
    fn only_an_address_and_an_account_are_cleared_by_a_success() {
        assert!(Counted::Address.cleared_by_success());
        assert!(Counted::Account.cleared_by_success());
        assert!(!Counted::Wide.cleared_by_success());
        assert!(!Counted::Overflow.cleared_by_success());
    }

    #[test]
    fn each_door_has_its_own_code() {
        for (i, a) in Door::ALL.iter().enumerate() {
            for b in &Door::ALL[..i] {
                assert_ne!(a.code(), b.code());
                assert_ne!(a.name(), b.name());
            }
        }
    }

    fn counted() -> impl Strategy<Value = Counted> {
        prop_oneof![
            Just(Counted::Address),
            Just(Counted::Wide),
            Just(Counted::Account),
            Just(Counted::Overflow)
        ]
    }

    proptest! {
        /// One more failure never shortens the block, and no block is ever longer than the
        /// rule's longest.
        #[test]
        fn the_backoff_is_monotone_and_bounded(c in counted(), failures: u32) {
            let rule = c.rule();
            let now = backoff(rule, failures);
            prop_assert!(now.is_none_or(|b| b >= Duration::from_secs(1) && b <= rule.max));
            prop_assert_eq!(now.is_some(), failures >= rule.free);
            if let Some(next) = failures.checked_add(1) {
                prop_assert!(backoff(rule, next) >= now);
            }
        }

        /// A block only shrinks as time goes on, never outlasts its backoff, and is gone
        /// once the count is forgotten.
        #[test]
        fn a_block_shrinks_with_time_and_ends(
            c in counted(),
            failures in 0u32..80,
            last in 0i64..1_000_000_000,
            dt in 0i64..10_000_000,
            more in 0i64..10_000_000,
        ) {
            let rule = c.rule();
            let a = blocked_for(rule, failures, last, last + dt);
            let b = blocked_for(rule, failures, last, last + dt + more);
            prop_assert!(b <= a);
            prop_assert!(a.is_none_or(|w| Some(w) <= backoff(rule, failures)));
            let forgotten = last + FORGET_AFTER.as_millis() as i64;
            prop_assert_eq!(blocked_for(rule, failures, last, forgotten), None);
        }
    }
}
