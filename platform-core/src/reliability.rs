//! Issue 46: a server's reliability, what tenants are told of it: the share of the last
//! [`WINDOW_SECS`] (30 days, or since it registered when it is younger) in which it was online
//! with its GPUs in order, computed from its heartbeat history.
//!
//! The history is what the platform records: `online` at a heartbeat after none or after a gap,
//! `offline` at the last heartbeat before a gap (and, while a gap lasts, at the last heartbeat:
//! [`History::last_heartbeat_at`]), and the GPU check's and the quarantine's transitions. "In
//! order" means the check has not failed and the agent has not quarantined the machine: both say
//! a tenant could not have been served. What the owner chooses (a pause, no price yet) is not the
//! machine's reliability and does not count against it.
//!
//! The event log keeps a node's newest events only (`MAX_EVENTS_PER_NODE`): before its oldest
//! transition of a kind, the state is taken to be the one that transition left (before an
//! `offline`, online; before a `check_passed`, failed…), and before a node's first `online` it
//! was never seen.

use gpum_protocol::{NodeEventKind, Reliability};

/// The window reliability looks back over: 30 days.
pub const WINDOW_SECS: u64 = 30 * 86_400;

/// A transition the reliability counts, from the node's event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    Online,
    Offline,
    CheckFailed,
    CheckPassed,
    Quarantined,
    QuarantineLifted,
}

impl Change {
    /// The change an event of `kind` is, if it is one.
    pub fn of(kind: NodeEventKind) -> Option<Change> {
        Some(match kind {
            NodeEventKind::Online => Change::Online,
            NodeEventKind::Offline => Change::Offline,
            NodeEventKind::CheckFailed => Change::CheckFailed,
            NodeEventKind::CheckPassed => Change::CheckPassed,
            NodeEventKind::Quarantined => Change::Quarantined,
            NodeEventKind::QuarantineLifted => Change::QuarantineLifted,
            _ => return None,
        })
    }
}

/// What the reliability of one node is computed from.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Unix seconds.
    pub registered_at: u64,
    /// Its last heartbeat, if any.
    pub last_heartbeat_at: Option<u64>,
    /// Whether it is online now (a heartbeat within `OFFLINE_AFTER_SECS`).
    pub online_now: bool,
    /// The transitions its log holds, in any order: (Unix seconds, change).
    pub changes: Vec<(u64, Change)>,
}

/// The state of a node between two transitions.
#[derive(Debug, Clone, Copy)]
struct State {
    online: bool,
    check_failed: bool,
    quarantined: bool,
}

impl State {
    fn up(self) -> bool {
        self.online && !self.check_failed && !self.quarantined
    }

    fn apply(&mut self, c: Change) {
        match c {
            Change::Online => self.online = true,
            Change::Offline => self.online = false,
            Change::CheckFailed => self.check_failed = true,
            Change::CheckPassed => self.check_failed = false,
            Change::Quarantined => self.quarantined = true,
            Change::QuarantineLifted => self.quarantined = false,
        }
    }
}

/// The node's reliability at `now`; `None` while the window is empty (registered this very
/// second, or a clock that went back).
pub fn reliability(h: &History, now: u64) -> Option<Reliability> {
    let from = now.saturating_sub(WINDOW_SECS).max(h.registered_at);
    if from >= now {
        return None;
    }
    let mut changes: Vec<(u64, Change)> = h.changes.iter().copied().filter(|(at, _)| *at <= now).collect();
    // Offline now: from its last heartbeat (the log records that gap only when it ends).
    if !h.online_now {
        match h.last_heartbeat_at {
            Some(last) if last <= now => changes.push((last, Change::Offline)),
            _ => changes.push((h.registered_at.min(now), Change::Offline)),
        }
    }
    // In time order; at one second, `offline` (at the last heartbeat) after what that heartbeat
    // recorded, and the rest in one fixed order, so that the log's order does not matter.
    changes.sort_by_key(|(at, c)| (*at, matches!(c, Change::Offline), *c));
    // Before the oldest transition of each kind: the state it left.
    let first = |a: Change, b: Change| changes.iter().find(|(_, c)| *c == a || *c == b).map(|(_, c)| *c);
    let mut state = State {
        online: first(Change::Online, Change::Offline) == Some(Change::Offline),
        check_failed: first(Change::CheckFailed, Change::CheckPassed) == Some(Change::CheckPassed),
        quarantined: first(Change::Quarantined, Change::QuarantineLifted) == Some(Change::QuarantineLifted),
    };
    let mut up = 0u64;
    let mut at = from;
    for (t, c) in changes {
        if t > at {
            if state.up() {
                up += t - at;
            }
            at = t;
        }
        state.apply(c);
    }
    if state.up() {
        up += now - at;
    }
    Some(Reliability { up_secs: up, window_secs: now - from, permille: permille(up, now - from) })
}

/// `part` of `whole` in tenths of a percent, rounded down (99.95 % is 999, never "100 %" while
/// a second was lost).
fn permille(part: u64, whole: u64) -> u16 {
    if whole == 0 {
        return 0;
    }
    ((u128::from(part.min(whole)) * 1000 / u128::from(whole)) as u16).min(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY: u64 = 86_400;
    const T0: u64 = 1_700_000_000;

    fn h(registered_at: u64, last: Option<u64>, online_now: bool, changes: &[(u64, Change)]) -> History {
        History { registered_at, last_heartbeat_at: last, online_now, changes: changes.to_vec() }
    }

    #[test]
    fn always_online_is_all_and_never_seen_is_nothing() {
        let now = T0 + 40 * DAY;
        let r = reliability(&h(T0, Some(now - 5), true, &[(T0, Change::Online)]), now).unwrap();
        assert_eq!((r.up_secs, r.window_secs, r.permille), (WINDOW_SECS, WINDOW_SECS, 1000));
        let r = reliability(&h(T0, None, false, &[]), T0 + DAY).unwrap();
        assert_eq!((r.up_secs, r.window_secs, r.permille), (0, DAY, 0));
        assert_eq!(reliability(&h(T0, None, false, &[]), T0), None, "an empty window");
    }

    /// A hand-computed case: registered 10 days ago, online an hour after, offline for a day
    /// (days 3 to 4), its check failed for half a day (day 6), quarantined for 6 hours (day 8),
    /// and offline for the last 12 hours.
    #[test]
    fn a_hand_computed_history() {
        let now = T0 + 10 * DAY;
        let changes = [
            (T0 + 3600, Change::Online),
            (T0 + 3 * DAY, Change::Offline),
            (T0 + 4 * DAY, Change::Online),
            (T0 + 6 * DAY, Change::CheckFailed),
            (T0 + 6 * DAY + DAY / 2, Change::CheckPassed),
            (T0 + 8 * DAY, Change::Quarantined),
            (T0 + 8 * DAY + DAY / 4, Change::QuarantineLifted),
        ];
        let r = reliability(&h(T0, Some(now - DAY / 2), false, &changes), now).unwrap();
        let down = 3600 + DAY + DAY / 2 + DAY / 4 + DAY / 2;
        assert_eq!(r.window_secs, 10 * DAY);
        assert_eq!(r.up_secs, 10 * DAY - down);
        assert_eq!(r.permille, ((10 * DAY - down) * 1000 / (10 * DAY)) as u16);
        assert_eq!(r.permille, 770);
    }

    /// Only the last 30 days count; what was before sets the state the window starts in.
    #[test]
    fn the_window_is_the_last_thirty_days() {
        let now = T0 + 100 * DAY;
        // Offline from day 10 to day 80: the window opens offline, and it ends 10 days in.
        let changes =
            [(T0, Change::Online), (T0 + 10 * DAY, Change::Offline), (T0 + 80 * DAY, Change::Online)];
        let r = reliability(&h(T0, Some(now), true, &changes), now).unwrap();
        assert_eq!((r.up_secs, r.window_secs), (20 * DAY, WINDOW_SECS));
        assert_eq!(r.permille, 666);
    }

    /// The log kept only newer events: before its oldest `offline`, the node was online.
    #[test]
    fn a_pruned_log_starts_in_the_state_its_oldest_transition_left() {
        let now = T0 + 40 * DAY;
        let changes = [(now - DAY, Change::Offline), (now - DAY / 2, Change::Online)];
        let r = reliability(&h(T0, Some(now), true, &changes), now).unwrap();
        assert_eq!(r.up_secs, WINDOW_SECS - DAY / 2);
        let changes = [(now - DAY, Change::CheckPassed), (T0 + 10 * DAY, Change::Online)];
        let r = reliability(&h(T0, Some(now), true, &changes), now).unwrap();
        assert_eq!(r.up_secs, DAY, "failed until the check passed, a day ago");
    }

    #[test]
    fn events_kinds_map_to_changes() {
        assert_eq!(Change::of(NodeEventKind::Online), Some(Change::Online));
        assert_eq!(Change::of(NodeEventKind::QuarantineLifted), Some(Change::QuarantineLifted));
        assert_eq!(Change::of(NodeEventKind::CommandSent), None);
        assert_eq!(permille(1, 3), 333);
        assert_eq!(permille(1999, 2000), 999, "never rounded up to all");
    }

    fn any_change() -> impl Strategy<Value = Change> {
        prop_oneof![
            Just(Change::Online),
            Just(Change::Offline),
            Just(Change::CheckFailed),
            Just(Change::CheckPassed),
            Just(Change::Quarantined),
            Just(Change::QuarantineLifted),
        ]
    }

    fn any_history() -> impl Strategy<Value = (History, u64)> {
        (
            0..60 * DAY,
            proptest::collection::vec((0..60 * DAY, any_change()), 0..40),
            proptest::option::of(0..60 * DAY),
            any::<bool>(),
            0..60 * DAY,
        )
            .prop_map(|(reg, changes, last, online_now, age)| {
                let changes = changes.into_iter().map(|(t, c)| (T0 + reg + t / 2, c)).collect();
                let h = History {
                    registered_at: T0 + reg,
                    last_heartbeat_at: last.map(|l| T0 + reg + l / 2),
                    online_now,
                    changes,
                };
                (h, T0 + reg + age + 1)
            })
    }

    proptest! {
        /// Up time never exceeds the window, the window never exceeds 30 days, and the share is
        /// the two's ratio.
        #[test]
        fn bounded((h, now) in any_history()) {
            let r = reliability(&h, now).unwrap();
            prop_assert!(r.up_secs <= r.window_secs);
            prop_assert!(r.window_secs <= WINDOW_SECS && r.window_secs > 0);
            prop_assert!(r.permille <= 1000);
            prop_assert_eq!(r.permille, permille(r.up_secs, r.window_secs));
        }

        /// The order the log gives the changes in does not matter.
        #[test]
        fn order_free((mut h, now) in any_history()) {
            let a = reliability(&h, now);
            h.changes.reverse();
            prop_assert_eq!(a, reliability(&h, now));
        }

        /// A quarantine of `len` seconds added to a history that had none takes at most `len`
        /// seconds of up time away, and never adds any.
        #[test]
        fn a_quarantine_never_helps((mut h, now) in any_history(), start in 0..30 * DAY, len in 1..5 * DAY) {
            h.changes.retain(|(_, c)| !matches!(c, Change::Quarantined | Change::QuarantineLifted));
            let before = reliability(&h, now).unwrap();
            let s = now.saturating_sub(start);
            h.changes.push((s, Change::Quarantined));
            h.changes.push((s + len, Change::QuarantineLifted));
            let after = reliability(&h, now).unwrap();
            prop_assert!(after.up_secs <= before.up_secs, "{before:?} {after:?}");
            prop_assert!(before.up_secs - after.up_secs <= len, "{before:?} {after:?}");
        }

        /// Always online and in order: all of the window.
        #[test]
        fn always_up(reg in 0..60 * DAY, age in 1..60 * DAY) {
            let h = History {
                registered_at: T0 + reg,
                last_heartbeat_at: Some(T0 + reg + age),
                online_now: true,
                changes: vec![(T0 + reg, Change::Online)],
            };
            let r = reliability(&h, T0 + reg + age).unwrap();
            prop_assert_eq!(r.up_secs, r.window_secs);
            prop_assert_eq!(r.permille, 1000);
        }
    }
}
