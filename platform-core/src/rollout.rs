//! A release's rollout (issue 47): which nodes the platform offers the release's version to,
//! and when the failures the nodes report halt it. The platform only *names* a version; the
//! agent verifies the signed release and refuses one that is not newer than its own.

use gpum_protocol::{HaltReason, RolloutState, RolloutStep, UpgradeOutcome};
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

/// A rollout's percentage at `now` on its schedule: `percent`, what it was at `since` (the
/// start, the last resume, or the last change by hand), raised by `step.percent` for each
/// whole `step.every_secs` since, up to 100. Without a schedule, `percent`. Only an active
/// rollout moves (any other `state` is at `percent`): the store folds the percentage reached
/// into `percent` when the rollout stops, and a resume starts the interval anew.
pub fn scheduled_percent(
    state: RolloutState,
    percent: u8,
    step: Option<RolloutStep>,
    since: u64,
    now: u64,
) -> u8 {
    let base = u64::from(percent.min(100));
    let Some(s) = step.filter(|s| s.every_secs > 0 && state == RolloutState::Active) else {
        return base as u8;
    };
    let steps = now.saturating_sub(since) / s.every_secs;
    base.saturating_add(steps.saturating_mul(u64::from(s.percent))).min(100) as u8
}

/// When the schedule next raises the percentage (unix seconds), or `None`: no schedule, not
/// active, or already at 100 %.
pub fn next_step_at(
    state: RolloutState,
    percent: u8,
    step: Option<RolloutStep>,
    since: u64,
    now: u64,
) -> Option<u64> {
    let s = step.filter(|s| s.every_secs > 0 && s.percent > 0 && state == RolloutState::Active)?;
    if scheduled_percent(state, percent, step, since, now) >= 100 {
        return None;
    }
    let done = now.saturating_sub(since) / s.every_secs;
    Some(since.saturating_add(done.saturating_add(1).saturating_mul(s.every_secs)))
}

/// Why a schedule is refused: a step of 0 or over 100 %, or an interval under
/// [`gpum_protocol::MIN_ROLLOUT_STEP_SECS`].
pub fn check_step(step: &RolloutStep) -> Result<(), String> {
    if !(1..=100).contains(&step.percent) {
        return Err(format!("step percent: 1 to 100, got {}", step.percent));
    }
    if step.every_secs < gpum_protocol::MIN_ROLLOUT_STEP_SECS {
        return Err(format!(
            "step every: at least {} s, got {} s",
            gpum_protocol::MIN_ROLLOUT_STEP_SECS,
            step.every_secs
        ));
    }
    Ok(())
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

/// The auto-halt: an active or paused rollout halts when at least one node failed and the
/// failed nodes are more than `max_failure_percent` % of the nodes that reported on its
/// version. A paused one too: a node that took the version before the pause can still report
/// its rollback, and `resume` must not then hand the version out again as if nothing failed
/// (resuming a halted rollout is the operator's explicit decision).
pub fn halt(state: RolloutState, tally: Tally, max_failure_percent: u8) -> Option<HaltReason> {
    let over = u64::from(tally.failed) * 100 > u64::from(max_failure_percent) * u64::from(tally.reported);
    let running = matches!(state, RolloutState::Active | RolloutState::Paused);
    (running && tally.failed >= 1 && over).then_some(HaltReason::Failures)
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

    const A: RolloutState = RolloutState::Active;

    fn step(percent: u8, every_secs: u64) -> Option<RolloutStep> {
        Some(RolloutStep { percent, every_secs })
    }

    #[test]
    fn a_schedule_raises_the_percentage_by_whole_steps_up_to_100() {
        let s = step(10, 3600);
        assert_eq!(scheduled_percent(A, 5, s, 1000, 1000), 5);
        assert_eq!(scheduled_percent(A, 5, s, 1000, 1000 + 3599), 5);
        assert_eq!(scheduled_percent(A, 5, s, 1000, 1000 + 3600), 15);
        assert_eq!(scheduled_percent(A, 5, s, 1000, 1000 + 7300), 25);
        assert_eq!(scheduled_percent(A, 5, s, 1000, 1000 + 100 * 3600), 100);
        assert_eq!(scheduled_percent(A, 5, s, 1000, 500), 5, "a clock before `since` raises nothing");
        assert_eq!(scheduled_percent(A, 5, None, 0, u64::MAX), 5);
        assert_eq!(scheduled_percent(A, 5, step(100, 60), 0, u64::MAX), 100);
        assert_eq!(next_step_at(A, 5, s, 1000, 1000), Some(4600));
        assert_eq!(next_step_at(A, 5, s, 1000, 4600), Some(8200));
        assert_eq!(next_step_at(A, 95, s, 1000, 4600), None, "at 100 %");
        assert_eq!(next_step_at(A, 5, None, 1000, 4600), None);
        for stopped in [RolloutState::Paused, RolloutState::Halted, RolloutState::Done] {
            assert_eq!(scheduled_percent(stopped, 5, s, 1000, 1000 + 7300), 5, "{stopped:?} does not move");
            assert_eq!(next_step_at(stopped, 5, s, 1000, 1000), None, "{stopped:?}");
        }
        assert!(check_step(&RolloutStep { percent: 0, every_secs: 3600 }).is_err());
        assert!(check_step(&RolloutStep { percent: 101, every_secs: 3600 }).is_err());
        assert!(check_step(&RolloutStep { percent: 10, every_secs: 59 }).is_err());
        assert!(check_step(&RolloutStep { percent: 10, every_secs: 60 }).is_ok());
    }

    proptest! {
        /// The scheduled percentage never falls with time, never passes 100, and rises exactly
        /// when `next_step_at` says.
        #[test]
        fn a_schedule_only_rises_and_steps_when_it_says(
            base in 0u8..=100, pct in 1u8..=100, every in 60u64..100_000, since in 0u64..1 << 40, a in 0u64..1 << 30, b in 0u64..1 << 30,
        ) {
            let s = step(pct, every);
            let (t1, t2) = (since + a.min(b), since + a.max(b));
            let (p1, p2) = (scheduled_percent(A, base, s, since, t1), scheduled_percent(A, base, s, since, t2));
            prop_assert!(p1 <= p2 && p2 <= 100);
            if let Some(next) = next_step_at(A, base, s, since, t1) {
                prop_assert!(next > t1);
                prop_assert_eq!(scheduled_percent(A, base, s, since, next - 1), p1);
                prop_assert!(scheduled_percent(A, base, s, since, next) > p1);
            } else {
                prop_assert_eq!(p1, 100);
            }
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
        assert_eq!(
            halt(RolloutState::Paused, Tally { reported: 1, failed: 1 }, 20),
            Some(HaltReason::Failures)
        );
        assert_eq!(halt(RolloutState::Paused, Tally { reported: 5, failed: 1 }, 20), None);
        for done in [RolloutState::Halted, RolloutState::Done] {
            assert_eq!(halt(done, Tally { reported: 1, failed: 1 }, 20), None, "{done:?}");
        }
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
