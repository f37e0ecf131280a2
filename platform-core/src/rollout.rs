//! A release's rollout (issue 47): which nodes the platform offers the release's version to,
//! and when the failures the nodes report halt it. The platform only *names* a version; the
//! agent verifies the signed release and refuses one that is not newer than its own.

use gpum_protocol::{HaltReason, RolloutState, UpgradeOutcome};
use sha2::{Digest, Sha256};

/// The rollout as the store holds it (the one `active` row, or the current one for a page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub version: String,
    pub state: RolloutState,
    /// 0 to 100.
    pub percent: u8,
    /// TEST ONLY (`test-knobs`): offer whatever version the node runs.
    pub offer_regardless: bool,
}

/// What the rule reads about one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeUpgradeFacts<'a> {
    pub node_id: &'a str,
    /// The agent version the node runs, as it last reported it (or registered with).
    pub running: &'a str,
    /// The owner's switch "automatic upgrades".
    pub owner_auto_update: bool,
    /// The agent's `auto_update` as reported (`None`: an agent that does not report it).
    pub agent_auto_update: Option<bool>,
    /// The node's last upgrade report: the version it was offered, and how it ended.
    pub last: Option<(&'a str, UpgradeOutcome)>,
}

/// `MAJOR.MINOR.PATCH`, each a decimal number without sign; anything else is no version.
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.');
    let mut num = || -> Option<u64> {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 19 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        p.parse().ok()
    };
    let v = (num()?, num()?, num()?);
    parts.next().is_none().then_some(v)
}

/// `offered` is a version strictly newer than `running` (both must parse: an unreadable
/// version is never older, so it is offered nothing).
pub fn is_newer(offered: &str, running: &str) -> bool {
    matches!((parse_version(offered), parse_version(running)), (Some(o), Some(r)) if o > r)
}

/// The node's stable bucket for a version, 0 to 99: SHA-256 of the node's id, a NUL, and the
/// version, as a big-endian number modulo 100. A rollout at `percent` takes the buckets below
/// it, so raising the percentage keeps every node already chosen, and each version picks its
/// own first nodes.
pub fn bucket(node_id: &str, version: &str) -> u8 {
    let mut h = Sha256::new();
    h.update(node_id.as_bytes());
    h.update([0]);
    h.update(version.as_bytes());
    let d = h.finalize();
    let n = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
    (n % 100) as u8
}

/// Whether an outcome means the node will not take this version again.
pub fn is_failure(outcome: UpgradeOutcome) -> bool {
    matches!(outcome, UpgradeOutcome::RolledBack | UpgradeOutcome::Refused)
}

/// The version the rollout offers this node, if any: the rollout is active; the node is in
/// its percentage ([`bucket`]); both the owner and the agent allow automatic upgrades; the
/// node's version is older than the release's (unless the test-only `offer_regardless`); and
/// the node has not rolled back or refused this version already.
pub fn offer(rollout: Option<&Rollout>, node: &NodeUpgradeFacts<'_>) -> Option<String> {
    let r = rollout?;
    let chosen = r.state == RolloutState::Active
        && bucket(node.node_id, &r.version) < r.percent.min(100)
        && node.owner_auto_update
        && node.agent_auto_update != Some(false)
        && (r.offer_regardless || is_newer(&r.version, node.running))
        && !node.last.is_some_and(|(to, outcome)| to == r.version && is_failure(outcome));
    chosen.then(|| r.version.clone())
}

/// The nodes that reported on a version, and how many of them rolled back or refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    pub reported: u32,
    pub failed: u32,
}

/// The auto-halt: an active rollout halts when at least one node failed and the failed nodes
/// are more than `max_failure_percent` % of the nodes that reported on its version.
pub fn halt(state: RolloutState, tally: Tally, max_failure_percent: u8) -> Option<HaltReason> {
    let over = u64::from(tally.failed) * 100 > u64::from(max_failure_percent) * u64::from(tally.reported);
    (state == RolloutState::Active && tally.failed >= 1 && over).then_some(HaltReason::Failures)
}

/// What `releases rollout|pause|resume|halt` do to a rollout's state, or why they cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pause,
    Resume,
    Halt,
}

/// The state after `action`, or `None` when it does not apply to `state` (pausing what is not
/// active, resuming what is not paused or halted, halting what is done or halted).
pub fn apply(state: RolloutState, action: Action) -> Option<RolloutState> {
    use RolloutState::*;
    match (action, state) {
        (Action::Pause, Active) => Some(Paused),
        (Action::Resume, Paused | Halted) => Some(Active),
        (Action::Halt, Active | Paused) => Some(Halted),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rollout(percent: u8) -> Rollout {
        Rollout { version: "0.2.0".into(), state: RolloutState::Active, percent, offer_regardless: false }
    }

    fn node(id: &str) -> NodeUpgradeFacts<'_> {
        NodeUpgradeFacts {
            node_id: id,
            running: "0.1.0",
            owner_auto_update: true,
            agent_auto_update: Some(true),
            last: None,
        }
    }

    #[test]
    fn versions_compare_as_numbers() {
        assert!(is_newer("0.10.0", "0.9.9"));
        assert!(is_newer("1.0.0", "0.99.99"));
        assert!(!is_newer("0.2.0", "0.2.0"));
        assert!(!is_newer("0.1.9", "0.2.0"));
        assert!(!is_newer("0.2.0", "garbage"), "an unreadable running version is offered nothing");
        assert!(!is_newer("0.2", "0.1.0"));
        assert!(!is_newer("0.2.0-rc1", "0.1.0"));
        assert!(!is_newer("+1.0.0", "0.1.0"));
        assert_eq!(parse_version("1.2.3"), Some((1, 2, 3)));
        assert_eq!(parse_version("1.2.3.4"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn the_whole_fleet_at_100_and_none_at_0() {
        for i in 0..200 {
            let id = format!("node-{i}");
            assert_eq!(offer(Some(&rollout(100)), &node(&id)), Some("0.2.0".into()));
            assert_eq!(offer(Some(&rollout(0)), &node(&id)), None);
        }
    }

    #[test]
    fn each_condition_holds_the_offer_back() {
        let r = rollout(100);
        assert_eq!(offer(None, &node("n")), None, "no rollout");
        for state in [RolloutState::Paused, RolloutState::Halted, RolloutState::Done] {
            assert_eq!(offer(Some(&Rollout { state, ..r.clone() }), &node("n")), None, "{state}");
        }
        assert_eq!(offer(Some(&r), &NodeUpgradeFacts { owner_auto_update: false, ..node("n") }), None);
        assert_eq!(offer(Some(&r), &NodeUpgradeFacts { agent_auto_update: Some(false), ..node("n") }), None);
        assert_eq!(
            offer(Some(&r), &NodeUpgradeFacts { agent_auto_update: None, ..node("n") }),
            Some("0.2.0".into()),
            "an agent that does not report the switch is offered (it ignores what it does not know)"
        );
        assert_eq!(offer(Some(&r), &NodeUpgradeFacts { running: "0.2.0", ..node("n") }), None);
        assert_eq!(offer(Some(&r), &NodeUpgradeFacts { running: "0.3.0", ..node("n") }), None);
        for failed in [UpgradeOutcome::RolledBack, UpgradeOutcome::Refused] {
            assert_eq!(
                offer(Some(&r), &NodeUpgradeFacts { last: Some(("0.2.0", failed)), ..node("n") }),
                None
            );
            assert_eq!(
                offer(Some(&r), &NodeUpgradeFacts { last: Some(("0.1.5", failed)), ..node("n") }),
                Some("0.2.0".into()),
                "a failure of another version does not hold this one back"
            );
        }
        assert_eq!(
            offer(Some(&r), &NodeUpgradeFacts { last: Some(("0.2.0", UpgradeOutcome::Failed)), ..node("n") }),
            Some("0.2.0".into()),
            "a failed download is retried"
        );
    }

    #[test]
    fn offer_regardless_names_an_older_version_only_under_its_flag() {
        let r = Rollout { offer_regardless: true, ..rollout(100) };
        let newer = NodeUpgradeFacts { running: "0.3.0", ..node("n") };
        assert_eq!(offer(Some(&r), &newer), Some("0.2.0".into()));
        let off = NodeUpgradeFacts { owner_auto_update: false, ..newer };
        assert_eq!(offer(Some(&r), &off), None, "the owner's switch still holds");
    }

    #[test]
    fn the_halt_rule() {
        let active = RolloutState::Active;
        assert_eq!(halt(active, Tally { reported: 1, failed: 1 }, 20), Some(HaltReason::Failures));
        assert_eq!(halt(active, Tally { reported: 5, failed: 1 }, 20), None, "exactly 20 % is not more");
        assert_eq!(halt(active, Tally { reported: 4, failed: 1 }, 20), Some(HaltReason::Failures));
        assert_eq!(halt(active, Tally { reported: 10, failed: 0 }, 0), None, "at least one node failed");
        assert_eq!(halt(active, Tally { reported: 10, failed: 1 }, 0), Some(HaltReason::Failures));
        assert_eq!(halt(active, Tally { reported: 10, failed: 10 }, 100), None);
        assert_eq!(halt(RolloutState::Paused, Tally { reported: 1, failed: 1 }, 20), None);
    }

    #[test]
    fn the_operator_actions() {
        use RolloutState::*;
        assert_eq!(apply(Active, Action::Pause), Some(Paused));
        assert_eq!(apply(Paused, Action::Resume), Some(Active));
        assert_eq!(apply(Halted, Action::Resume), Some(Active));
        assert_eq!(apply(Paused, Action::Halt), Some(Halted));
        assert_eq!(apply(Done, Action::Resume), None);
        assert_eq!(apply(Halted, Action::Pause), None);
        assert_eq!(apply(Active, Action::Resume), None);
    }

    proptest! {
        /// Raising the percentage never takes a node out, and the share chosen follows it.
        #[test]
        fn raising_the_percentage_keeps_the_chosen(id in "[a-z0-9-]{1,30}", a in 0u8..=100, b in 0u8..=100) {
            let (lo, hi) = (a.min(b), a.max(b));
            let n = node(&id);
            if offer(Some(&rollout(lo)), &n).is_some() {
                prop_assert!(offer(Some(&rollout(hi)), &n).is_some());
            }
            prop_assert!(bucket(&id, "0.2.0") < 100);
            prop_assert_eq!(bucket(&id, "0.2.0"), bucket(&id, "0.2.0"));
        }

        /// Never an offer of a version that is not newer, without the test flag.
        #[test]
        fn never_an_older_or_equal_version(r in (0u64..5, 0u64..5, 0u64..5), o in (0u64..5, 0u64..5, 0u64..5),
                                           percent in 0u8..=100, owner: bool, agent in proptest::option::of(any::<bool>())) {
            let running = format!("{}.{}.{}", r.0, r.1, r.2);
            let version = format!("{}.{}.{}", o.0, o.1, o.2);
            let ro = Rollout { version: version.clone(), state: RolloutState::Active, percent, offer_regardless: false };
            let n = NodeUpgradeFacts { node_id: "n1", running: &running, owner_auto_update: owner, agent_auto_update: agent, last: None };
            if offer(Some(&ro), &n).is_some() {
                prop_assert!(o > r && owner && agent != Some(false));
            }
        }

        /// The halt rule is exactly "more than the share, at least one".
        #[test]
        fn halts_exactly_over_the_share(reported in 0u32..1000, failed in 0u32..1000, share in 0u8..=100) {
            let failed = failed.min(reported);
            let h = halt(RolloutState::Active, Tally { reported, failed }, share).is_some();
            prop_assert_eq!(h, failed >= 1 && (failed as f64) / (reported as f64) > share as f64 / 100.0);
        }
    }
}
