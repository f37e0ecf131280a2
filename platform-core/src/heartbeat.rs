//! A heartbeat's rules (issue 44, item 1): what the store read about the node ([`NodeFacts`])
//! and what the agent sent, in; what to write and what to answer ([`BeatPlan`]), out. The store
//! (`store/heartbeat.rs`) reads the facts, calls [`decide`], and applies the plan.

use gpum_protocol::{
    HeartbeatRequest, NodeEventKind, OFFLINE_AFTER_SECS, PROBE_OUTPUT_MAX, ProbeFailure,
    SAMPLE_INTERVAL_SECS, UpgradeOffer, UpgradeOutcome, UpgradeReport, VerificationState,
};

use crate::rollout::{self, NodeUpgradeFacts, Rollout};

/// The longest agent version kept (a version is `MAJOR.MINOR.PATCH`; anything longer is cut).
pub const MAX_VERSION_LEN: usize = 64;

/// What the store holds about the node when its heartbeat comes (its row, read once).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// The node's id (its rollout bucket's seed).
    pub node_id: String,
    /// The hash of the inventory held.
    pub inventory_hash: String,
    /// Unix seconds of the last accepted heartbeat; `None` before the first.
    pub last_heartbeat_at: Option<i64>,
    /// Unix seconds of the last metrics sample kept.
    pub last_sample_at: Option<i64>,
    /// The check's verdict as held, and the reason of a failure.
    pub verification: VerificationState,
    pub probe_reason: Option<ProbeFailure>,
    /// The latest end of the node's rentals; none is listed after it.
    pub rentals_until: Option<i64>,
    /// The quarantine as last reported (its bounded JSON), if any.
    pub quarantine_json: Option<String>,
    /// Some command of the node's is not delivered yet.
    pub commands_waiting: bool,
    /// The agent's version and `auto_update` as last reported (issue 47).
    pub agent_version: String,
    pub agent_auto_update: Option<bool>,
    /// The owner's switch "automatic upgrades".
    pub auto_update: bool,
    /// The node's last upgrade report as held.
    pub last_upgrade: Option<LastUpgrade>,
    /// The version the node's last answer offered, if any.
    pub upgrade_offered: Option<String>,
    /// The rollout that is active or paused, if one is (read in the same lookup), its
    /// percentage where its schedule has brought it: what an offer and a failure's tally read.
    pub rollout: Option<Rollout>,
}

/// The node's last upgrade report as the store holds it: enough to tell a repeat of it, and
/// the version it failed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastUpgrade {
    pub to: String,
    pub outcome: UpgradeOutcome,
    /// The agent's time of the attempt's end.
    pub at: u64,
}

/// The agent's version and switch to write, when either changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentWrite {
    pub version: String,
    pub auto_update: Option<bool>,
}

/// What the platform made of the request before the rules (off the database thread): the
/// compared forms of what the agent sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent<'a> {
    /// The hash of the inventory the request carries, if it carries one.
    pub inventory_hash: Option<&'a str>,
    /// The quarantine the request carries, as stored (bounded JSON), if any.
    pub quarantine_json: Option<&'a str>,
}

/// What becomes of the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InventoryPlan {
    /// None sent, and the agent's hash is the one held: nothing to do.
    Keep,
    /// None sent, and the agent's hash differs from the one held: ask for it in the answer.
    Ask,
    /// Sent: stored (its GPUs checked free first); `changed` when it differs from the one held,
    /// which is an event (the store tells which parts changed).
    Store { changed: bool },
}

/// One event of the node's log that the beat writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub at: u64,
    pub kind: NodeEventKind,
    pub subject: String,
    pub detail: String,
}

/// The check's verdict and output, written as the agent reported them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeWrite {
    pub state: VerificationState,
    pub reason: Option<ProbeFailure>,
    /// Cut to [`PROBE_OUTPUT_MAX`] bytes (at a character boundary).
    pub output: String,
}

/// Everything a heartbeat does, as data. The store applies it in this order: inventory, events,
/// probe, quarantine, the node's row (and a sample), then removals, command results, commands
/// and rentals, which are the request's own lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeatPlan {
    pub inventory: InventoryPlan,
    /// Written in order (after the inventory's own event, if any).
    pub events: Vec<PlannedEvent>,
    pub probe: Option<ProbeWrite>,
    /// The quarantine changed: written as [`Sent::quarantine_json`].
    pub quarantine_changed: bool,
    /// Keep a sample of the metrics (at most one per [`SAMPLE_INTERVAL_SECS`]).
    pub sample: bool,
    /// Deliver the pending commands in the answer (never to a handshake, `seq == 0`).
    pub deliver_commands: bool,
    /// Look the node's rentals up for the answer (only while it may have one).
    pub list_rentals: bool,
    /// The agent's version or switch changed: written (issue 47).
    pub agent: Option<AgentWrite>,
    /// A new upgrade report (bounded), to record as the node's last; a repeat of the one held
    /// is not.
    pub upgrade_report: Option<UpgradeReport>,
    /// The report is a failure of the active rollout's version: count the version's reports
    /// and halt the rollout if the failures are over its share ([`rollout::halt`]).
    pub tally: Option<String>,
    /// The answer's offer ([`rollout::offer`], on the facts as this beat leaves them).
    pub offer: Option<UpgradeOffer>,
    /// The offer differs from the last answer's: written (what the pages call "upgrade
    /// pending"). A steady beat writes nothing.
    pub offer_changed: bool,
}

impl BeatPlan {
    /// Whether the answer asks for the inventory.
    pub fn send_inventory(&self) -> bool {
        self.inventory == InventoryPlan::Ask
    }
}

fn event(at: u64, kind: NodeEventKind, subject: &str, detail: &str) -> PlannedEvent {
    PlannedEvent { at, kind, subject: subject.to_owned(), detail: detail.to_owned() }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// The heartbeat's rules.
pub fn decide(facts: &NodeFacts, req: &HeartbeatRequest, sent: Sent<'_>, now: u64) -> BeatPlan {
    let now_i = now as i64;
    let inventory = match sent.inventory_hash {
        Some(hash) => InventoryPlan::Store { changed: hash != facts.inventory_hash },
        None if req.inventory_hash != facts.inventory_hash => InventoryPlan::Ask,
        None => InventoryPlan::Keep,
    };

    // Online after a gap: the gap is recorded when it ends, as "offline" at the last heartbeat
    // before it (while it lasts, the event log derives it), so no timer has to watch the nodes
    // and a beat writes an event only on this transition.
    let mut events = Vec::new();
    match facts.last_heartbeat_at {
        None => events.push(event(now, NodeEventKind::Online, "", "")),
        Some(last) if now_i >= last.saturating_add(OFFLINE_AFTER_SECS as i64) => {
            events.push(event(last.max(0) as u64, NodeEventKind::Offline, "", ""));
            events.push(event(now, NodeEventKind::Online, "", ""));
        }
        Some(_) => {}
    }

    // The check's verdict is an event when it changes (a failure also when its reason does).
    let probe = req.probe.as_ref().map(|p| {
        let changed = p.state != facts.verification
            || (p.state == VerificationState::Failed && p.reason != facts.probe_reason);
        match p.state {
            VerificationState::Verified if changed => {
                events.push(event(now, NodeEventKind::CheckPassed, "", ""))
            }
            VerificationState::Failed if changed => {
                events.push(event(now, NodeEventKind::CheckFailed, p.reason.map_or("", |r| r.as_str()), ""))
            }
            _ => {}
        }
        ProbeWrite { state: p.state, reason: p.reason, output: cut(&p.output, PROBE_OUTPUT_MAX) }
    });

    // The quarantine is written, and is an event, only when it changes (issue 33).
    let quarantine_changed = sent.quarantine_json != facts.quarantine_json.as_deref();
    if quarantine_changed {
        events.push(match &req.quarantine {
            Some(q) => event(now, NodeEventKind::Quarantined, "", &q.reason),
            None => event(now, NodeEventKind::QuarantineLifted, "", ""),
        });
    }

    // The agent's version and switch (issue 47): written when they change, which is at an
    // upgrade or a rollback, or when the owner edits the agent's config.
    let version = req.agent_version.as_deref().map(|v| cut(v, MAX_VERSION_LEN));
    let auto = req.auto_update.or(facts.agent_auto_update);
    let agent = (version.as_ref().is_some_and(|v| *v != facts.agent_version)
        || auto != facts.agent_auto_update)
        .then(|| AgentWrite {
            version: version.clone().unwrap_or_else(|| facts.agent_version.clone()),
            auto_update: auto,
        });
    let running = agent.as_ref().map_or(facts.agent_version.as_str(), |a| a.version.as_str());

    // The upgrade's report, once: the agent sends it until a beat carrying it is accepted, so a
    // repeat of the one held writes nothing.
    let upgrade_report = req
        .upgrade
        .as_ref()
        .map(|u| UpgradeReport {
            from: cut(&u.from, MAX_VERSION_LEN),
            to: cut(&u.to, MAX_VERSION_LEN),
            outcome: u.outcome,
            detail: cut(&u.detail, gpum_protocol::limits::MAX_TEXT_LEN),
            at: u.at,
        })
        .filter(|u| {
            facts
                .last_upgrade
                .as_ref()
                .is_none_or(|l| (l.to.as_str(), l.outcome, l.at) != (u.to.as_str(), u.outcome, u.at))
        });
    let tally = upgrade_report
        .as_ref()
        .filter(|u| rollout::is_failure(u.outcome))
        .filter(|u| facts.rollout.as_ref().is_some_and(|r| r.version == u.to))
        .map(|u| u.to.clone());
    let last = match &upgrade_report {
        Some(u) => Some((u.to.as_str(), u.outcome)),
        None => facts.last_upgrade.as_ref().map(|l| (l.to.as_str(), l.outcome)),
    };
    let offer = rollout::offer(
        facts.rollout.as_ref(),
        &NodeUpgradeFacts {
            node_id: &facts.node_id,
            running,
            owner_auto_update: facts.auto_update,
            agent_auto_update: auto,
            last,
        },
    )
    .map(|version| UpgradeOffer { version });

    let offer_changed = offer.as_ref().map(|o| o.version.as_str()) != facts.upgrade_offered.as_deref();
    BeatPlan {
        agent,
        upgrade_report,
        tally,
        offer,
        offer_changed,
        inventory,
        events,
        probe,
        quarantine_changed,
        // At most one sample of the figures per interval, decided by the node's own row: most
        // beats write none.
        sample: facts.last_sample_at.is_none_or(|t| now_i >= t.saturating_add(SAMPLE_INTERVAL_SECS as i64)),
        // A handshake (`seq == 0`, what `gpum-agent smoke` sends) gets none: a one-shot process
        // that exits right after would otherwise swallow a command meant for the service.
        deliver_commands: req.seq != 0 && facts.commands_waiting,
        list_rentals: facts.rentals_until.is_some_and(|t| t > now_i),
    }
}

impl NodeFacts {
    /// The facts as they are once `plan` is applied at `now` (what the next beat
    /// reads), but for what the store alone knows (commands still waiting, rentals).
    pub fn after(&self, sent: Sent<'_>, plan: &BeatPlan, now: u64) -> NodeFacts {
        let mut f = self.clone();
        if let Some(hash) = sent.inventory_hash {
            f.inventory_hash = hash.to_owned();
        }
        if let Some(p) = &plan.probe {
            f.verification = p.state;
            f.probe_reason = p.reason;
        }
        if plan.quarantine_changed {
            f.quarantine_json = sent.quarantine_json.map(str::to_owned);
        }
        if plan.sample {
            f.last_sample_at = Some(now as i64);
        }
        if let Some(a) = &plan.agent {
            f.agent_version = a.version.clone();
            f.agent_auto_update = a.auto_update;
        }
        if plan.offer_changed {
            f.upgrade_offered = plan.offer.as_ref().map(|o| o.version.clone());
        }
        if let Some(u) = &plan.upgrade_report {
            f.last_upgrade = Some(LastUpgrade { to: u.to.clone(), outcome: u.outcome, at: u.at });
        }
        f.last_heartbeat_at = Some(now as i64);
        f
    }
}

#[cfg(test)]
mod tests;
