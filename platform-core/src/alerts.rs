//! Alerts to owners (issue 46): which incidents of a server open and which end, from what the
//! platform knows of it now.
//!
//! The sweeper (`gpum_platform::alerts`) reads each watched server's [`Facts`], its owner's
//! [`Watch`] and the incidents open on it, and calls [`decide`]; it writes the [`Change`]s
//! (an incident row, and the notices it owes) and sends the notices. An incident of a kind opens
//! only while the owner watches that kind, and once open it ends only when its cause does: a
//! server back online, a check passed, a quarantine lifted (turning the kind off does not end
//! it, so every opened notice gets its ended one). The offline rule has two thresholds on
//! purpose: the incident opens after the owner's minutes of silence, and ends at the first
//! heartbeat, when the server is online again.

use gpum_protocol::{AlertKind, OFFLINE_AFTER_SECS};

/// What the platform knows of a server now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Its last heartbeat (unix seconds); `None`: it never sent one, so it is not "offline"
    /// (it was never online).
    pub last_heartbeat_at: Option<u64>,
    /// Its GPU check failed.
    pub check_failed: bool,
    /// Its agent quarantined it.
    pub quarantined: bool,
    /// It was deleted: whatever was open on it ends.
    pub deleted: bool,
}

/// What its owner asked to be told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    /// Silent for this long (seconds) opens an `offline` incident.
    pub offline_after_secs: u64,
    pub offline: bool,
    pub check_failed: bool,
    pub quarantined: bool,
}

impl Watch {
    /// `minutes` of silence, and the kinds listed.
    pub fn new(offline_minutes: u32, kinds: &[AlertKind]) -> Watch {
        Watch {
            offline_after_secs: u64::from(offline_minutes) * 60,
            offline: kinds.contains(&AlertKind::Offline),
            check_failed: kinds.contains(&AlertKind::CheckFailed),
            quarantined: kinds.contains(&AlertKind::Quarantined),
        }
    }

    fn watches(&self, kind: AlertKind) -> bool {
        match kind {
            AlertKind::Offline => self.offline,
            AlertKind::CheckFailed => self.check_failed,
            AlertKind::Quarantined => self.quarantined,
        }
    }
}

/// What changes on a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// An incident of this kind opens now.
    Open(AlertKind),
    /// The open incident of this kind ends now.
    Close(AlertKind),
}

/// Whether `kind`'s cause holds at `now`: `opening` asks for the threshold that opens an
/// incident, otherwise the one that keeps it open.
fn holds(kind: AlertKind, f: &Facts, w: &Watch, now: u64, opening: bool) -> bool {
    if f.deleted {
        return false;
    }
    match kind {
        AlertKind::Offline => {
            let Some(last) = f.last_heartbeat_at else { return false };
            // Never below the platform's own offline rule: a server that is online is never
            // reported offline, whatever the owner typed.
            let after =
                if opening { w.offline_after_secs.max(OFFLINE_AFTER_SECS) } else { OFFLINE_AFTER_SECS };
            now >= last.saturating_add(after)
        }
        AlertKind::CheckFailed => f.check_failed,
        AlertKind::Quarantined => f.quarantined,
    }
}

/// The changes on a server with `facts`, watched by `watch`, with incidents of the kinds `open`
/// open on it, at `now`: at most one per kind, an `Open` only of a kind not open and an
/// `Close` only of one that is.
pub fn decide(facts: &Facts, watch: &Watch, open: &[AlertKind], now: u64) -> Vec<Change> {
    let mut out = Vec::new();
    for &kind in AlertKind::ALL {
        let is_open = open.contains(&kind);
        if is_open && !holds(kind, facts, watch, now, false) {
            out.push(Change::Close(kind));
        } else if !is_open && watch.watches(kind) && holds(kind, facts, watch, now, true) {
            out.push(Change::Open(kind));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use AlertKind::*;
    use proptest::prelude::*;

    const ALL: Watch =
        Watch { offline_after_secs: 600, offline: true, check_failed: true, quarantined: true };

    fn up(last: u64) -> Facts {
        Facts { last_heartbeat_at: Some(last), check_failed: false, quarantined: false, deleted: false }
    }

    #[test]
    fn offline_opens_after_the_owners_minutes_and_ends_at_the_next_heartbeat() {
        let f = up(1000);
        // Offline for the platform after 60 s, but the owner said 10 minutes.
        assert_eq!(decide(&f, &ALL, &[], 1000 + 61), vec![]);
        assert_eq!(decide(&f, &ALL, &[], 1000 + 599), vec![]);
        assert_eq!(decide(&f, &ALL, &[], 1000 + 600), vec![Change::Open(Offline)]);
        // Still silent: nothing more.
        assert_eq!(decide(&f, &ALL, &[Offline], 1000 + 5000), vec![]);
        // A heartbeat: online again, the incident ends.
        assert_eq!(decide(&up(6000), &ALL, &[Offline], 6001), vec![Change::Close(Offline)]);
        // Silent again past the platform's minute but within the owner's ten: it stays ended...
        assert_eq!(decide(&up(6000), &ALL, &[], 6100), vec![]);
        // ...while an open one does not end until the server is really online.
        assert_eq!(decide(&up(6000), &ALL, &[Offline], 6100), vec![]);
    }

    #[test]
    fn a_threshold_below_the_platforms_minute_is_the_minute() {
        let w = Watch { offline_after_secs: 0, ..ALL };
        assert_eq!(decide(&up(1000), &w, &[], 1030), vec![]);
        assert_eq!(decide(&up(1000), &w, &[], 1060), vec![Change::Open(Offline)]);
    }

    #[test]
    fn a_server_that_never_sent_a_heartbeat_is_not_offline() {
        let f = Facts { last_heartbeat_at: None, ..up(0) };
        assert_eq!(decide(&f, &ALL, &[], 1_000_000), vec![]);
    }

    #[test]
    fn check_and_quarantine_open_and_end_with_their_cause() {
        let f = Facts { check_failed: true, quarantined: true, ..up(1000) };
        assert_eq!(decide(&f, &ALL, &[], 1001), vec![Change::Open(CheckFailed), Change::Open(Quarantined)]);
        let passed = Facts { check_failed: false, ..f };
        assert_eq!(
            decide(&passed, &ALL, &[CheckFailed, Quarantined], 1002),
            vec![Change::Close(CheckFailed)]
        );
        assert_eq!(decide(&up(1003), &ALL, &[Quarantined], 1003), vec![Change::Close(Quarantined)]);
    }

    #[test]
    fn only_watched_kinds_open_but_an_open_one_ends_with_its_cause() {
        let none = Watch::new(10, &[]);
        let f = Facts { check_failed: true, quarantined: true, ..up(0) };
        assert_eq!(decide(&f, &none, &[], 100_000), vec![]);
        // Opened while watched, then the owner turned the kind off: it ends when the check passes.
        assert_eq!(decide(&f, &none, &[CheckFailed], 100_000), vec![]);
        assert_eq!(decide(&up(100_000), &none, &[CheckFailed], 100_000), vec![Change::Close(CheckFailed)]);
        assert_eq!(
            Watch::new(5, &[Quarantined]),
            Watch { offline_after_secs: 300, offline: false, check_failed: false, quarantined: true }
        );
    }

    #[test]
    fn a_deleted_server_ends_everything_and_opens_nothing() {
        let f = Facts { check_failed: true, quarantined: true, deleted: true, ..up(0) };
        assert_eq!(decide(&f, &ALL, &[], 100_000), vec![]);
        assert_eq!(
            decide(&f, &ALL, &[Offline, CheckFailed, Quarantined], 100_000),
            vec![Change::Close(Offline), Change::Close(CheckFailed), Change::Close(Quarantined)]
        );
    }

    fn kinds() -> impl Strategy<Value = Vec<AlertKind>> {
        proptest::sample::subsequence(AlertKind::ALL.to_vec(), 0..=3)
    }

    /// One sweep's input: seconds since the last sweep, whether a heartbeat came, the check and
    /// the quarantine, deleted, and what the owner watches.
    fn step() -> impl Strategy<Value = (u64, bool, bool, bool, bool, u32, Vec<AlertKind>)> {
        (
            0u64..400,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            proptest::bool::weighted(0.02),
            0u32..8,
            kinds(),
        )
    }

    proptest! {
        /// Applying the changes sweep after sweep, whatever happens: never two open incidents of
        /// one kind, every end follows an open of its kind, and a sweep right after another
        /// (same facts, same time) changes nothing.
        #[test]
        fn incidents_pair_up(steps in proptest::collection::vec(step(), 1..60)) {
            let mut now = 1_000u64;
            let mut last = None;
            let mut open: Vec<AlertKind> = Vec::new();
            let mut deleted = false;
            for (dt, beat, check_failed, quarantined, delete, minutes, watched) in steps {
                now += dt;
                if beat && !deleted {
                    last = Some(now);
                }
                deleted |= delete;
                let facts = Facts { last_heartbeat_at: last, check_failed, quarantined, deleted };
                let watch = Watch::new(minutes, &watched);
                for c in decide(&facts, &watch, &open, now) {
                    match c {
                        Change::Open(k) => {
                            prop_assert!(!open.contains(&k), "{k:?} opened twice");
                            prop_assert!(watch.watches(k));
                            open.push(k);
                        }
                        Change::Close(k) => {
                            prop_assert!(open.contains(&k), "{k:?} ended without an open one");
                            open.retain(|o| *o != k);
                        }
                    }
                }
                prop_assert_eq!(decide(&facts, &watch, &open, now), vec![]);
                if deleted {
                    prop_assert!(open.is_empty());
                }
            }
        }
    }
}
