//! The heartbeat's rules by example, and their properties (proptest).

use super::*;
use gpum_protocol::{ProbeReport, Quarantine};
use proptest::prelude::*;

const T0: u64 = 1_000_000;

fn beat(seq: u64) -> HeartbeatRequest {
    HeartbeatRequest { seq, inventory_hash: "h1".into(), ..Default::default() }
}

fn known() -> NodeFacts {
    NodeFacts { inventory_hash: "h1".into(), last_heartbeat_at: Some(T0 as i64), ..Default::default() }
}

fn kinds(p: &BeatPlan) -> Vec<NodeEventKind> {
    p.events.iter().map(|e| e.kind).collect()
}

fn probe(state: VerificationState, reason: Option<ProbeFailure>) -> ProbeReport {
    ProbeReport { state, reason, output: "out".into(), finished_at: T0, image: "img".into() }
}

#[test]
fn the_first_beat_is_online_takes_a_sample_and_asks_for_an_unknown_inventory() {
    let facts = NodeFacts { inventory_hash: "h0".into(), ..Default::default() };
    let p = decide(&facts, &beat(1), Sent::default(), T0);
    assert_eq!(p.events, vec![event(T0, NodeEventKind::Online, "", "")]);
    assert!(p.sample && p.send_inventory());
    assert_eq!(
        (p.probe, p.quarantine_changed, p.deliver_commands, p.list_rentals),
        (None, false, false, false)
    );
}

#[test]
fn a_beat_after_a_gap_records_the_gap_at_the_last_beat_then_online() {
    let facts = known();
    let p = decide(&facts, &beat(2), Sent::default(), T0 + OFFLINE_AFTER_SECS);
    assert_eq!(
        p.events,
        vec![
            event(T0, NodeEventKind::Offline, "", ""),
            event(T0 + OFFLINE_AFTER_SECS, NodeEventKind::Online, "", "")
        ]
    );
    let p = decide(&facts, &beat(2), Sent::default(), T0 + OFFLINE_AFTER_SECS - 1);
    assert_eq!(p.events, vec![]);
    assert_eq!(p.inventory, InventoryPlan::Keep);
}

#[test]
fn a_sent_inventory_is_stored_and_an_event_only_when_it_differs() {
    let facts = known();
    let sent = |h| Sent { inventory_hash: Some(h), quarantine_json: None };
    assert_eq!(
        decide(&facts, &beat(2), sent("h1"), T0 + 1).inventory,
        InventoryPlan::Store { changed: false }
    );
    assert_eq!(
        decide(&facts, &beat(2), sent("h2"), T0 + 1).inventory,
        InventoryPlan::Store { changed: true }
    );
}

#[test]
fn the_check_is_an_event_when_its_verdict_or_a_failures_reason_changes() {
    let mut req = beat(2);
    req.probe = Some(probe(VerificationState::Verified, None));
    let p = decide(&known(), &req, Sent::default(), T0 + 1);
    assert_eq!(kinds(&p), vec![NodeEventKind::CheckPassed]);
    assert_eq!(
        p.probe.as_ref().map(|w| (w.state, w.output.as_str())),
        Some((VerificationState::Verified, "out"))
    );

    let verified = NodeFacts { verification: VerificationState::Verified, ..known() };
    assert_eq!(kinds(&decide(&verified, &req, Sent::default(), T0 + 1)), vec![]);

    let failed = NodeFacts {
        verification: VerificationState::Failed,
        probe_reason: Some(ProbeFailure::Timeout),
        ..known()
    };
    req.probe = Some(probe(VerificationState::Failed, Some(ProbeFailure::Timeout)));
    assert_eq!(kinds(&decide(&failed, &req, Sent::default(), T0 + 1)), vec![]);
    req.probe = Some(probe(VerificationState::Failed, Some(ProbeFailure::NoNvidiaRuntime)));
    let p = decide(&failed, &req, Sent::default(), T0 + 1);
    assert_eq!(p.events, vec![event(T0 + 1, NodeEventKind::CheckFailed, "no_nvidia_runtime", "")]);
    // Awaiting a check is written, never an event.
    req.probe = Some(probe(VerificationState::AwaitingCheck, None));
    let p = decide(&failed, &req, Sent::default(), T0 + 1);
    assert_eq!((kinds(&p), p.probe.map(|w| w.state)), (vec![], Some(VerificationState::AwaitingCheck)));
}

#[test]
fn a_long_probe_output_is_cut_at_a_character_boundary() {
    let mut req = beat(2);
    let mut r = probe(VerificationState::Verified, None);
    r.output = "é".repeat(PROBE_OUTPUT_MAX);
    req.probe = Some(r);
    let out = decide(&known(), &req, Sent::default(), T0 + 1).probe.unwrap().output;
    assert_eq!(out.len(), PROBE_OUTPUT_MAX);
    assert!(out.chars().all(|c| c == 'é'));
}

#[test]
fn a_quarantine_is_an_event_when_it_begins_and_when_it_is_lifted() {
    let mut req = beat(2);
    req.quarantine = Some(Quarantine { reason: "GPU busy".into(), since: T0, gpu_uuids: vec![] });
    let sent = Sent { inventory_hash: None, quarantine_json: Some("{q}") };
    let p = decide(&known(), &req, sent, T0 + 1);
    assert_eq!(
        (p.events.clone(), p.quarantine_changed),
        (vec![event(T0 + 1, NodeEventKind::Quarantined, "", "GPU busy")], true)
    );
    let held = known().after(sent, &p, T0 + 1);
    assert_eq!(held.quarantine_json.as_deref(), Some("{q}"));
    assert!(!decide(&held, &req, sent, T0 + 2).quarantine_changed);
    let p = decide(&held, &beat(3), Sent::default(), T0 + 3);
    assert_eq!(kinds(&p), vec![NodeEventKind::QuarantineLifted]);
}

#[test]
fn commands_go_to_a_beat_not_a_handshake_and_rentals_are_listed_only_while_one_may_run() {
    let facts = NodeFacts { commands_waiting: true, rentals_until: Some(T0 as i64 + 10), ..known() };
    assert!(decide(&facts, &beat(1), Sent::default(), T0 + 1).deliver_commands);
    assert!(!decide(&facts, &beat(0), Sent::default(), T0 + 1).deliver_commands);
    assert!(decide(&facts, &beat(1), Sent::default(), T0 + 9).list_rentals);
    assert!(!decide(&facts, &beat(1), Sent::default(), T0 + 10).list_rentals);
}

fn arb_state() -> impl Strategy<Value = VerificationState> {
    prop::sample::select(VerificationState::ALL)
}

fn arb_reason() -> impl Strategy<Value = Option<ProbeFailure>> {
    prop::option::of(prop::sample::select(ProbeFailure::ALL))
}

fn arb_facts() -> impl Strategy<Value = NodeFacts> {
    (
        prop::sample::select(vec!["h0", "h1"]),
        prop::option::of(0i64..2_000_000),
        prop::option::of(0i64..2_000_000),
        arb_state(),
        arb_reason(),
        prop::option::of(0i64..2_000_000),
        prop::option::of(prop::sample::select(vec!["{a}", "{b}"])),
        any::<bool>(),
    )
        .prop_map(|(h, last, sample, verification, probe_reason, until, q, waiting)| NodeFacts {
            inventory_hash: h.into(),
            last_heartbeat_at: last,
            last_sample_at: sample,
            verification,
            probe_reason,
            rentals_until: until,
            quarantine_json: q.map(str::to_owned),
            commands_waiting: waiting,
            ..Default::default()
        })
}

/// A request, and what was sent of it (`Sent`), consistent with each other.
fn arb_beat() -> impl Strategy<Value = (HeartbeatRequest, Option<&'static str>, Option<&'static str>)> {
    (
        0u64..4,
        prop::sample::select(vec!["h0", "h1", "h2"]),
        any::<bool>(),
        prop::option::of((arb_state(), arb_reason())),
        prop::option::of(prop::sample::select(vec!["{a}", "{b}"])),
    )
        .prop_map(|(seq, hash, with_inventory, p, q)| {
            let req = HeartbeatRequest {
                seq,
                inventory_hash: hash.into(),
                probe: p.map(|(s, r)| probe(s, r)),
                quarantine: q.map(|q| Quarantine { reason: q.into(), since: 0, gpu_uuids: vec![] }),
                ..Default::default()
            };
            (req, with_inventory.then_some(hash), q)
        })
}

proptest! {
    /// A node is online from its first beat on: one `online` per first beat or gap, an
    /// `offline` exactly with it after a gap, and neither otherwise.
    #[test]
    fn online_is_recorded_once_per_first_beat_or_gap(facts in arb_facts(), (req, inv, q) in arb_beat(), dt in 0u64..200) {
        let now = facts.last_heartbeat_at.map_or(T0, |l| l.max(0) as u64 + dt);
        let p = decide(&facts, &req, Sent { inventory_hash: inv, quarantine_json: q }, now);
        let online = p.events.iter().filter(|e| e.kind == NodeEventKind::Online).count();
        let offline = p.events.iter().filter(|e| e.kind == NodeEventKind::Offline).count();
        let gap = facts.last_heartbeat_at.is_none_or(|_| dt >= OFFLINE_AFTER_SECS);
        prop_assert_eq!(online, usize::from(gap));
        prop_assert_eq!(offline, usize::from(gap && facts.last_heartbeat_at.is_some()));
        prop_assert!(p.events.iter().all(|e| e.at <= now));
    }

    /// The same beat again, a moment later, on what the first one wrote, writes no event, and
    /// the two keep at most one sample: a retried heartbeat is not news.
    #[test]
    fn a_repeated_beat_writes_no_event_and_no_sample(facts in arb_facts(), (req, inv, q) in arb_beat(), dt in 1u64..OFFLINE_AFTER_SECS) {
        let now = T0 + 1_000_000;
        let sent = Sent { inventory_hash: inv, quarantine_json: q };
        let first = decide(&facts, &req, sent, now);
        let after = facts.after(sent, &first, now);
        let again = decide(&after, &req, sent, now + dt);
        prop_assert_eq!(&again.events, &vec![]);
        prop_assert!(!(first.sample && again.sample));
        prop_assert!(!again.quarantine_changed);
        prop_assert_ne!(again.inventory, InventoryPlan::Store { changed: true });
    }

    /// What the plan says follows from the facts alone, as the store relies on: a handshake
    /// gets no command, the inventory is asked for only when none came and the hashes differ,
    /// and the probe is written exactly when one was reported, as reported.
    #[test]
    fn the_plan_follows_the_request(facts in arb_facts(), (req, inv, q) in arb_beat(), now in 0u64..3_000_000) {
        let p = decide(&facts, &req, Sent { inventory_hash: inv, quarantine_json: q }, now);
        prop_assert!(req.seq != 0 || !p.deliver_commands);
        prop_assert_eq!(p.deliver_commands, req.seq != 0 && facts.commands_waiting);
        prop_assert_eq!(p.send_inventory(), inv.is_none() && req.inventory_hash != facts.inventory_hash);
        prop_assert_eq!(
            p.probe.as_ref().map(|w| (w.state, w.reason)),
            req.probe.as_ref().map(|r| (r.state, r.reason))
        );
        prop_assert_eq!(p.quarantine_changed, q != facts.quarantine_json.as_deref());
        let checks = p.events.iter().filter(|e| matches!(e.kind, NodeEventKind::CheckPassed | NodeEventKind::CheckFailed)).count();
        prop_assert!(checks <= 1);
    }
}

mod upgrades {
    use super::*;
    use crate::rollout::Rollout;
    use gpum_protocol::{RolloutState, UpgradeOutcome, UpgradeReport};

    fn facts() -> NodeFacts {
        NodeFacts {
            node_id: "node-1".into(),
            agent_version: "0.1.0".into(),
            auto_update: true,
            rollout: Some(Rollout {
                version: "0.2.0".into(),
                state: RolloutState::Active,
                percent: 100,
                offer_regardless: false,
            }),
            ..known()
        }
    }

    fn report(outcome: UpgradeOutcome) -> UpgradeReport {
        UpgradeReport { from: "0.1.0".into(), to: "0.2.0".into(), outcome, detail: "x".repeat(5000), at: 7 }
    }

    #[test]
    fn an_active_rollout_offers_and_a_steady_beat_writes_nothing_of_the_agent() {
        let req = HeartbeatRequest { agent_version: Some("0.1.0".into()), ..beat(2) };
        let p = decide(&facts(), &req, Sent::default(), T0 + 1);
        assert_eq!(p.offer.map(|o| o.version), Some("0.2.0".into()));
        assert_eq!(p.agent, None, "the same version and no switch reported: nothing to write");
        assert_eq!(p.upgrade_report, None);
        let off = NodeFacts { auto_update: false, ..facts() };
        assert_eq!(decide(&off, &req, Sent::default(), T0 + 1).offer, None, "the owner's switch");
        let agent_off = HeartbeatRequest { auto_update: Some(false), ..req.clone() };
        let p = decide(&facts(), &agent_off, Sent::default(), T0 + 1);
        assert_eq!(p.offer, None, "the agent's switch");
        assert_eq!(p.agent.map(|a| a.auto_update), Some(Some(false)), "the agent's switch is written once");
    }

    #[test]
    fn a_new_version_is_written_and_is_offered_no_more() {
        let req = HeartbeatRequest {
            agent_version: Some("0.2.0".into()),
            upgrade: Some(report(UpgradeOutcome::Succeeded)),
            ..beat(2)
        };
        let p = decide(&facts(), &req, Sent::default(), T0 + 1);
        assert_eq!(p.agent.as_ref().map(|a| a.version.as_str()), Some("0.2.0"));
        assert_eq!(p.offer, None);
        let u = p.upgrade_report.clone().expect("recorded");
        assert_eq!(u.detail.len(), gpum_protocol::limits::MAX_TEXT_LEN, "the detail is cut");
        assert_eq!(p.tally, None, "a success halts nothing");
        // The same report again (the agent resends until accepted): recorded once.
        let after = facts().after(Sent::default(), &p, T0 + 1);
        let again = decide(&after, &req, Sent::default(), T0 + 2);
        assert_eq!(again.upgrade_report, None);
        assert_eq!(again.agent, None);
    }

    #[test]
    fn a_rollback_is_counted_and_that_version_is_offered_no_more() {
        let req = HeartbeatRequest {
            agent_version: Some("0.1.0".into()),
            upgrade: Some(report(UpgradeOutcome::RolledBack)),
            ..beat(2)
        };
        let p = decide(&facts(), &req, Sent::default(), T0 + 1);
        assert_eq!(p.tally.as_deref(), Some("0.2.0"));
        assert_eq!(p.offer, None, "not offered again in the very answer");
        let after = facts().after(Sent::default(), &p, T0 + 1);
        let again = decide(
            &after,
            &HeartbeatRequest { agent_version: Some("0.1.0".into()), ..beat(3) },
            Sent::default(),
            T0 + 2,
        );
        assert_eq!((again.offer, again.tally), (None, None));
        // A report of another version than the active rollout's counts toward nothing.
        let other = HeartbeatRequest {
            upgrade: Some(UpgradeReport { to: "0.1.5".into(), ..report(UpgradeOutcome::Refused) }),
            ..beat(2)
        };
        assert_eq!(decide(&facts(), &other, Sent::default(), T0 + 1).tally, None);
    }

    /// A paused rollout offers nothing, but a failure reported on its version still counts
    /// toward its halt (a node that took it before the pause can still roll back).
    #[test]
    fn a_paused_rollout_offers_nothing_and_still_counts_a_rollback() {
        let mut paused = facts();
        paused.rollout.as_mut().expect("a rollout").state = RolloutState::Paused;
        let steady = HeartbeatRequest { agent_version: Some("0.1.0".into()), ..beat(2) };
        assert_eq!(decide(&paused, &steady, Sent::default(), T0 + 1).offer, None);
        let req = HeartbeatRequest { upgrade: Some(report(UpgradeOutcome::RolledBack)), ..steady };
        assert_eq!(decide(&paused, &req, Sent::default(), T0 + 1).tally.as_deref(), Some("0.2.0"));
    }
}
