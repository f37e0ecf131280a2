//! What the agent owes the platform, and what it has already done for it.
//!
//! [`Outbox`] holds the command results, removed containers and probe report that wait for an
//! answered heartbeat. One heartbeat carries at most the protocol's limits
//! (`gpum_protocol::limits`); the rest wait for the next one, oldest first. When the platform
//! (or a proxy in front of it) refuses a heartbeat as malformed or too large
//! ([`crate::client::is_refused_body`]), sending the same body again would be refused again,
//! forever: so each refusal halves what the next heartbeat carries, and a refusal of a
//! heartbeat that carried one item of each kind drops what it carried (logged). The first
//! heartbeat the platform accepts restores the full limits. Whatever the platform answers, the
//! queue drains or shrinks; no answer can hold it still.
//!
//! [`Answered`] remembers the commands the agent has answered (the newest
//! [`ANSWERED_MAX`]), so that a command handed over again is neither run nor answered twice.
//! It is kept in `commands.json` in the state directory, so that a `restart` handed over again
//! after the restart is not obeyed again.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use gpum_host::Host;
use gpum_protocol::limits::{MAX_COMMAND_RESULTS, MAX_REMOVED_CONTAINERS};
use gpum_protocol::{CommandResult, ProbeReport, RemovedContainer};

/// Halvings before a refused heartbeat carries one item of each kind: `64 >> 6 == 1`.
const MAX_SHRINK: u32 = 6;

/// One heartbeat's share of the outbox.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub results: Vec<CommandResult>,
    pub removed: Vec<RemovedContainer>,
    pub probe: Option<ProbeReport>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.results.is_empty() && self.removed.is_empty() && self.probe.is_none()
    }
}

/// What [`Outbox::refused`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The next heartbeat carries less.
    Shrunk { results_cap: usize, removed_cap: usize },
    /// The refused heartbeat carried at most one item of each kind: they were dropped.
    Dropped(Batch),
    /// It carried nothing of the outbox; there is nothing to trim.
    NothingToTrim,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Outbox {
    results: VecDeque<CommandResult>,
    removed: VecDeque<RemovedContainer>,
    probe: Option<ProbeReport>,
    shrink: u32,
}

impl Outbox {
    pub fn push_result(&mut self, r: CommandResult) {
        self.results.push_back(r);
    }

    pub fn push_removed(&mut self, list: impl IntoIterator<Item = RemovedContainer>) {
        self.removed.extend(list);
    }

    /// A new probe report replaces one not yet delivered.
    pub fn set_probe(&mut self, p: ProbeReport) {
        self.probe = Some(p);
    }

    pub fn has_result(&self, id: &str) -> bool {
        self.results.iter().any(|r| r.id == id)
    }

    pub fn len(&self) -> usize {
        self.results.len() + self.removed.len() + usize::from(self.probe.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn caps(&self) -> (usize, usize) {
        ((MAX_COMMAND_RESULTS >> self.shrink).max(1), (MAX_REMOVED_CONTAINERS >> self.shrink).max(1))
    }

    /// Takes the next heartbeat's share, oldest first, within the limits. The probe report
    /// stays here until [`Outbox::delivered`] (a newer one may replace it meanwhile).
    pub fn take(&mut self) -> Batch {
        let (rc, mc) = self.caps();
        let results = self.results.drain(..rc.min(self.results.len())).collect();
        let removed = self.removed.drain(..mc.min(self.removed.len())).collect();
        Batch { results, removed, probe: self.probe.clone() }
    }

    /// The platform accepted the heartbeat that carried `b`.
    pub fn delivered(&mut self, b: &Batch) {
        if self.probe.is_some() && self.probe == b.probe {
            self.probe = None;
        }
        self.shrink = 0;
    }

    /// The heartbeat that carried `b` failed in a way that says nothing about its body (no
    /// answer, a 5xx, a proxy page): it goes out again, first.
    pub fn failed(&mut self, b: Batch) {
        for r in b.results.into_iter().rev() {
            self.results.push_front(r);
        }
        for r in b.removed.into_iter().rev() {
            self.removed.push_front(r);
        }
    }

    /// The platform refused the heartbeat that carried `b` as malformed or too large. See the
    /// module docs.
    pub fn refused(&mut self, b: Batch) -> Refusal {
        if b.is_empty() {
            return Refusal::NothingToTrim;
        }
        if self.shrink >= MAX_SHRINK || (b.results.len() <= 1 && b.removed.len() <= 1) {
            if self.probe.is_some() && self.probe == b.probe {
                self.probe = None;
            }
            // Stay small until the platform accepts a heartbeat: the next items may be as bad.
            self.shrink = MAX_SHRINK;
            return Refusal::Dropped(b);
        }
        self.shrink += 1;
        self.failed(b);
        let (results_cap, removed_cap) = self.caps();
        Refusal::Shrunk { results_cap, removed_cap }
    }
}

/// The most answered command ids remembered.
pub const ANSWERED_MAX: usize = 256;
/// Where [`Answered`] is kept, in the state directory.
pub const ANSWERED_FILE: &str = "commands.json";

/// The ids of the commands already answered, newest last. See the module docs.
#[derive(Debug)]
pub struct Answered {
    path: PathBuf,
    order: VecDeque<String>,
    set: HashSet<String>,
}

impl Answered {
    /// Loads `commands.json` from `state_dir`; a missing or unreadable file is an empty log.
    pub fn load(host: &dyn Host, state_dir: &Path) -> Answered {
        let path = state_dir.join(ANSWERED_FILE);
        let ids: Vec<String> =
            host.read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let mut a = Answered { path, order: VecDeque::new(), set: HashSet::new() };
        for id in ids {
            a.insert(id);
        }
        a
    }

    pub fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    fn insert(&mut self, id: String) -> bool {
        if !self.set.insert(id.clone()) {
            return false;
        }
        self.order.push_back(id);
        while self.order.len() > ANSWERED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }

    /// Records `ids` as answered and saves the log when it changed.
    pub fn record(&mut self, host: &dyn Host, ids: impl IntoIterator<Item = String>) -> std::io::Result<()> {
        if self.insert_all(ids) { self.save(host) } else { Ok(()) }
    }

    /// Records `ids` as answered, in memory; returns whether the log changed (then it is to be
    /// saved with [`Answered::save`]).
    pub fn insert_all(&mut self, ids: impl IntoIterator<Item = String>) -> bool {
        let mut changed = false;
        for id in ids {
            changed |= self.insert(id);
        }
        changed
    }

    /// Writes the log to `commands.json` (0600, atomically).
    pub fn save(&self, host: &dyn Host) -> std::io::Result<()> {
        let json = serde_json::to_vec(&self.order).expect("ids serialize");
        host.write_atomic(&self.path, &json, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    fn result(i: usize) -> CommandResult {
        CommandResult { id: format!("c{i}"), ok: true, message: String::new() }
    }

    fn removed(i: usize) -> RemovedContainer {
        RemovedContainer { id: format!("r{i}"), name: format!("n{i}"), reason: "x".into() }
    }

    fn outbox(results: usize, rem: usize) -> Outbox {
        let mut o = Outbox::default();
        (0..results).for_each(|i| o.push_result(result(i)));
        o.push_removed((0..rem).map(removed));
        o
    }

    #[test]
    fn a_heartbeat_never_carries_more_than_the_limits_and_the_rest_waits_in_order() {
        let mut o = outbox(1000, 200);
        let mut seen = Vec::new();
        let mut beats = 0;
        while !o.is_empty() {
            let b = o.take();
            assert!(b.results.len() <= MAX_COMMAND_RESULTS && b.removed.len() <= MAX_REMOVED_CONTAINERS);
            seen.extend(b.results.iter().map(|r| r.id.clone()));
            o.delivered(&b);
            beats += 1;
        }
        assert_eq!(beats, 1000_usize.div_ceil(MAX_COMMAND_RESULTS));
        assert_eq!(seen, (0..1000).map(|i| format!("c{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn a_failed_heartbeat_puts_its_items_back_first() {
        let mut o = outbox(3, 1);
        let b = o.take();
        o.push_result(result(99));
        o.failed(b.clone());
        assert_eq!(o.take().results, [result(0), result(1), result(2), result(99)]);
    }

    /// A platform that refuses every heartbeat carrying one poisoned result: the outbox shrinks,
    /// drops the poison alone, and everything else is delivered. The old behaviour (resend the
    /// same body forever) never delivered anything.
    #[test]
    fn refusals_shrink_then_drop_only_what_was_refused_and_the_queue_drains() {
        let mut o = outbox(0, 0);
        o.push_result(CommandResult { id: "poison".into(), ok: false, message: "x".repeat(100_000) });
        (0..100).for_each(|i| o.push_result(result(i)));
        o.push_removed((0..10).map(removed));
        let mut delivered = Vec::new();
        let mut dropped = Vec::new();
        for _ in 0..200 {
            if o.is_empty() {
                break;
            }
            let b = o.take();
            if b.results.iter().any(|r| r.id == "poison") {
                match o.refused(b) {
                    Refusal::Dropped(d) => dropped.extend(d.results.into_iter().map(|r| r.id)),
                    Refusal::Shrunk { .. } => {}
                    Refusal::NothingToTrim => unreachable!(),
                }
            } else {
                delivered.extend(b.results.iter().map(|r| r.id.clone()));
                o.delivered(&b);
            }
        }
        assert!(o.is_empty(), "the queue drained");
        assert_eq!(dropped, ["poison"]);
        assert_eq!(delivered, (0..100).map(|i| format!("c{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn a_platform_that_refuses_everything_still_empties_the_queue() {
        let mut o = outbox(300, 100);
        o.set_probe(ProbeReport {
            state: gpum_protocol::VerificationState::Failed,
            reason: None,
            output: String::new(),
            finished_at: 0,
            image: String::new(),
        });
        let mut beats = 0;
        while !o.is_empty() {
            let b = o.take();
            let _ = o.refused(b);
            beats += 1;
            assert!(beats < 400, "stuck");
        }
        // Six halvings, then one item of each kind per refusal.
        assert!(beats <= MAX_SHRINK as usize + 300, "{beats}");
        assert_eq!(o.refused(Batch::default()), Refusal::NothingToTrim);
    }

    #[test]
    fn acceptance_restores_the_full_limits() {
        let mut o = outbox(200, 0);
        let b = o.take();
        assert!(matches!(o.refused(b), Refusal::Shrunk { results_cap: 32, .. }));
        assert_eq!(o.take().results.len(), 32);
        let b = o.take();
        o.delivered(&b);
        assert_eq!(o.take().results.len(), MAX_COMMAND_RESULTS);
    }

    #[test]
    fn answered_ids_are_bounded_and_survive_a_restart() {
        let h = FakeHost::new();
        let dir = Path::new("/s");
        let mut a = Answered::load(&h, dir);
        a.record(&h, (0..ANSWERED_MAX + 10).map(|i| format!("c{i}"))).unwrap();
        assert!(!a.contains("c0") && a.contains(&format!("c{}", ANSWERED_MAX + 9)));
        let b = Answered::load(&h, dir);
        assert!(b.contains("c10") && !b.contains("c9"));
        assert_eq!(b.order.len(), ANSWERED_MAX);
        let writes = h.writes().len();
        let mut b = b;
        b.record(&h, ["c10".to_string()]).unwrap();
        assert_eq!(h.writes().len(), writes, "nothing new, nothing written");
    }
}
