//! The service's rules, without I/O: what the agent does about each thing that happens.
//!
//! [`Core::handle`] takes an [`Event`] (the heartbeat timer, a heartbeat's outcome, a probe's
//! result, a removal round, a signal) with the time it happened ([`Now`]) and returns
//! [`Action`]s (send a heartbeat, start a probe, remove these containers, write a file, exit
//! with a code). It reads no clock, spawns nothing and touches neither Docker nor a file:
//! [`crate::run`] routes the events in and carries the actions out, as [`crate::outbox`] and
//! [`crate::docker::reconcile::Reconciler::decide`] already are, so every rule here is tested
//! in milliseconds (the tests below, proptest included).
//!
//! The rules it holds:
//! - **Lifecycle** ([`Lifecycle`]): running; a `restart` command is acknowledged with one more
//!   heartbeat, then the agent exits with [`EXIT_RESTART`]; SIGTERM/SIGINT lets the heartbeat in
//!   flight finish within [`STOP_GRACE`] (a second signal quits at once), then exit 0; a
//!   revocation ([`crate::client::classify`]) records why and exits 78, and nothing follows.
//! - **Commands** ([`Inbox`]): a command id is run and answered once, whatever the platform
//!   hands over again (kept in `commands.json`, see [`Answered`]); at most one answer's worth
//!   of new commands is taken per answer; a `recheck` is answered when its probe starts.
//! - **The interval**: the platform's, clamped to [`MIN_INTERVAL`]..[`MAX_INTERVAL`], ±10 %
//!   jitter; failures back off ([`crate::backoff`]) up to the interval.
//! - **The known list**: an answer whose known list is as long as the protocol allows may have
//!   been cut, so the reconciler removes nothing while it is.
//! - **Probes** ([`Probes`]): after the first answer, after a change of the probe-relevant facts
//!   or of the image, or on `recheck`, within the rate limit of [`ledger`].
//! - **`state.json`**: written when it changed, or every [`STATE_REFRESH`].
//! - **Upgrades** ([`Upgrades`], issue 47): an offer of a version strictly newer than the
//!   agent's own, with `auto_update` on, no upgrade in flight or unreported, and not refused
//!   or rolled back in this process (failed: retried after [`UPGRADE_RETRY`], doubling) starts
//!   one ([`Action::StartUpgrade`]); an offer not newer is refused without a download. The
//!   result ([`Event::UpgradeDone`]) is recorded ([`Action::RecordUpgrade`]) and sent in every
//!   heartbeat until one carrying it is accepted ([`Action::UpgradeReported`]); a swapped binary
//!   exits with [`EXIT_RESTART`]. A new binary confirms its upgrade after its first accepted
//!   heartbeat ([`Action::ConfirmUpgrade`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use gpum_common::agent_state::{AgentState, Connection, StopReason, Stopped};
use gpum_common::exit;
use gpum_protocol::{
    Command, CommandKind, CommandResult, DEFAULT_HEARTBEAT_INTERVAL_SECS, ErrorCode, HeartbeatResponse,
    ProbeReport, RemovedContainer, UpgradeOffer, UpgradeOutcome, UpgradeReport, VerificationState, limits,
};
use rand::rngs::StdRng;
use tracing::{debug, error, info, warn};

use crate::backoff::{Backoff, jittered};
use crate::client::{Answer, CallError, Verdict, classify, clock_skew, is_refused_body};
use crate::docker::ledger::{self, ProbeImages, ProbeLedger};
use crate::docker::reconcile::{self, ManagedContainer, Reconciler};
use crate::docker::rental;
use crate::outbox::{Answered, Batch, Outbox, Refusal};
use crate::state::unix;

/// Exit code after a `restart` command: neither 0 (a clean stop) nor 78 (stopped for good), so
/// it is visible in `systemctl status`; `Restart=always` restarts on it.
pub const EXIT_RESTART: i32 = gpum_common::exit::RESTART;
/// How long a step in flight may run after SIGTERM before the agent exits anyway: defined next
/// to the unit whose `TimeoutStopSec` bounds it.
pub use gpum_enroll::unit::STOP_GRACE;
/// The longest command id the agent answers (the platform's own ids are short).
pub const MAX_COMMAND_ID_LEN: usize = 128;
/// Interval bounds, whatever the platform says.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Even when nothing changes, `state.json` is rewritten this often, so `status` shows a recent
/// last heartbeat without a disk write per heartbeat.
pub const STATE_REFRESH: Duration = Duration::from_secs(30);
/// The most `recheck` commands waiting for a rate-limited probe; one more is answered at once
/// (the probe is due anyway), so that a platform cannot grow the list.
pub const MAX_WAITING_RECHECKS: usize = limits::MAX_COMMANDS_PER_RESPONSE;
/// After a probe finishes, the next heartbeat goes at most this soon, to report it.
pub const REPORT_PROBE_WITHIN: Duration = Duration::from_millis(200);

/// After an upgrade failed (download or write), the same version is tried again after this,
/// doubling with each failure up to [`UPGRADE_RETRY_MAX`].
pub const UPGRADE_RETRY: Duration = Duration::from_secs(10 * 60);
pub const UPGRADE_RETRY_MAX: Duration = Duration::from_secs(6 * 3600);
/// The longest version an offer may name; a longer one is ignored, not reported.
pub const MAX_OFFERED_VERSION_LEN: usize = 64;

/// When an event happened: the wall clock (for unix seconds and the platform's `Date`) and the
/// monotonic one (for every delay).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub wall: SystemTime,
    pub mono: Instant,
}

/// Every input of the core.
#[derive(Debug)]
pub enum Event {
    /// The loop started: the first state is written.
    Start,
    /// Time for a heartbeat ([`Core::beat_at`]).
    Tick,
    /// The heartbeat [`Action::Heartbeat`] asked for finished.
    Beat(Box<BeatDone>),
    /// The probe [`Action::StartProbe`] asked for finished.
    ProbeDone(Box<ProbeDone>),
    /// The probe's task failed (panicked); it brought back nothing.
    ProbeLost,
    /// A probe the rate limit held back may start now ([`Core::probe_at`]).
    ProbeDue,
    /// A removal round finished.
    Removed(Vec<RemovedContainer>),
    /// A rentals round finished ([`crate::docker::rental::reconcile`]); `changed`: a rental's
    /// state changed, so the next heartbeat goes soon to report it.
    RentalsDone { changed: bool },
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// The grace after a signal ran out ([`Core::stop_deadline`]).
    StopDeadline,
    /// The upgrade [`Action::StartUpgrade`] asked for ended.
    UpgradeDone(UpgradeEnd),
}

/// How an upgrade attempt ended ([`crate::upgrade::upgrade`]).
#[derive(Debug, Clone, PartialEq)]
pub enum UpgradeEnd {
    /// The new binary is in place and the rollback guard runs: exit, systemd starts it.
    Swapped,
    /// Refused or failed before the swap; nothing on the machine changed.
    Ended(UpgradeReport),
}

/// Every output of the core, carried out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Gather the facts and send this heartbeat; its outcome comes back as [`Event::Beat`].
    Heartbeat(Beat),
    /// Run the GPU probe; its result comes back as [`Event::ProbeDone`].
    StartProbe(ProbeStart),
    /// Remove these managed containers; the round comes back as [`Event::Removed`].
    Remove(Vec<ManagedContainer>),
    /// Save the answered commands ([`Core::answered`]) to `commands.json`.
    SaveAnswered,
    /// Save the probe ledger ([`Core::ledger`]) to `probes.json`.
    SaveLedger,
    /// Write [`Core::state_mut`] to `state.json`, then call [`Core::state_written`].
    WriteState,
    /// Abort the probe and the removal in flight.
    Abort,
    /// Fetch, verify and install this version ([`crate::upgrade::upgrade`]); it comes back as
    /// [`Event::UpgradeDone`].
    StartUpgrade(String),
    /// Record this ended attempt in `upgrade.json` (not yet reported).
    RecordUpgrade(UpgradeReport),
    /// This binary is the upgrade's and its first heartbeat was accepted: record it succeeded
    /// and stop the rollback guard.
    ConfirmUpgrade(UpgradeReport),
    /// A heartbeat carrying the upgrade's report was accepted: mark it reported.
    UpgradeReported,
    /// Exit with this code. Nothing follows.
    Exit(i32),
}

/// What a heartbeat sends besides the machine's facts.
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    pub seq: u64,
    pub batch: Batch,
    pub clock_skew: Option<i64>,
    /// The inventory hash the platform accepted last: the inventory is sent again only when it
    /// differs.
    pub accepted_hash: Option<String>,
    /// The last upgrade's report, until a heartbeat carrying it is accepted.
    pub upgrade: Option<UpgradeReport>,
}

/// What came back from a heartbeat.
#[derive(Debug)]
pub struct BeatDone {
    pub seq: u64,
    /// What it carried of the outbox.
    pub carried: Batch,
    /// Whether it carried the full inventory, and the inventory's hash.
    pub inventory_sent: bool,
    pub inventory_hash: String,
    /// The probe-relevant facts of this machine.
    pub probe_key: String,
    /// Whether the agent holds a Docker client, and whether the engine answered in this step.
    pub docker_connected: bool,
    pub docker_ok: bool,
    pub docker_error: Option<String>,
    /// The managed containers listed before it (empty when the listing failed).
    pub managed: Vec<ManagedContainer>,
    pub result: Result<Answer<HeartbeatResponse>, CallError>,
}

/// A probe to start.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeStart {
    pub image: String,
    /// Unix seconds of the start.
    pub now: u64,
    /// The probe images as the ledger knows them; they come back updated in [`ProbeDone`].
    pub images: ProbeImages,
}

/// What a probe brings back: its report, and the probe images after it (`None` when it could
/// not reach the engine).
#[derive(Debug)]
pub struct ProbeDone {
    pub report: ProbeReport,
    pub images: Option<ProbeImages>,
}

/// Where the service is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Running,
    /// A `restart` command is in the answer being applied; the next heartbeat acknowledges it.
    RestartDue,
    /// The heartbeat carrying the acknowledgement is on its way; when it ends, the agent exits
    /// with [`EXIT_RESTART`].
    Restarting,
    /// A signal came: the heartbeat in flight may finish until `deadline`, then exit 0.
    Stopping {
        deadline: Instant,
    },
    /// The agent exited with this code (78: stopped for good). The core does nothing more.
    Exited(i32),
}

/// The commands the platform hands over: which are new, and the `recheck`s waiting for a
/// probe to start.
#[derive(Debug)]
pub struct Inbox {
    /// The commands already answered (kept in `commands.json`).
    answered: Answered,
    /// The `recheck` commands answered when the next probe starts.
    rechecks: Vec<String>,
}

/// What [`Inbox::admit`] says of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Answered before, or already in this answer: neither run nor answered again.
    Answered,
    /// An id that cannot be answered.
    BadId,
    /// New, but one answer's worth is taken already; it comes again.
    Later,
    New,
}

impl Inbox {
    pub fn new(answered: Answered) -> Inbox {
        Inbox { answered, rechecks: Vec::new() }
    }

    fn admit(&self, id: &str, newly: &[String], outbox: &Outbox) -> Admit {
        // A still undelivered answer stays queued.
        if self.answered.contains(id) || newly.iter().any(|n| n == id) || outbox.has_result(id) {
            Admit::Answered
        } else if id.is_empty() || id.len() > MAX_COMMAND_ID_LEN {
            Admit::BadId
        } else if newly.len() >= limits::MAX_COMMANDS_PER_RESPONSE {
            Admit::Later
        } else {
            Admit::New
        }
    }

    /// Answers every waiting `recheck` with `message`.
    fn answer_rechecks(&mut self, outbox: &mut Outbox, message: &str) {
        for id in std::mem::take(&mut self.rechecks) {
            outbox.push_result(CommandResult { id, ok: true, message: message.into() });
        }
    }
}

/// When the GPU probe runs: the facts and image it last ran on, whether one is wanted or
/// running, and the rate limit ([`ledger`]).
#[derive(Debug)]
pub struct Probes {
    /// The probe-relevant facts of the last answered step, and those the last probe ran on.
    key: Option<String>,
    probed_key: Option<String>,
    image: Option<String>,
    probed_image: Option<String>,
    wanted: bool,
    running: bool,
    /// When probes started and which images the agent pulled (`probes.json`), and the least
    /// time between two starts ([`ledger::MIN_GAP`] but in tests).
    ledger: ProbeLedger,
    gap: Duration,
    /// When a probe the rate limit held back may start.
    at: Option<Instant>,
}

/// What [`Probes::next`] decided.
enum Next {
    /// No image is set: no probe runs.
    NoImage,
    /// Nothing to do (running, or nothing changed).
    Nothing,
    /// Due, held back by the rate limit until [`Probes::at`].
    Wait,
    /// Start it with this image now (recorded in the ledger).
    Start(String),
}

impl Probes {
    pub fn new(ledger: ProbeLedger, gap: Duration) -> Probes {
        Probes {
            key: None,
            probed_key: None,
            image: None,
            probed_image: None,
            wanted: true,
            running: false,
            ledger,
            gap,
            at: None,
        }
    }

    /// Whether a probe is due now (see [`Core`]'s rules), and if it may start.
    fn next(&mut self, now: Now) -> Next {
        let Some(image) = self.image.clone() else {
            self.at = None;
            return Next::NoImage;
        };
        if self.running {
            return Next::Nothing;
        }
        let changed = self.key != self.probed_key || self.probed_image.as_deref() != Some(image.as_str());
        if !(self.wanted || changed) {
            return Next::Nothing;
        }
        let secs = unix(now.wall);
        if let Some(at) = self.ledger.next_start(secs, self.gap) {
            let wait = Duration::from_secs(at.saturating_sub(secs));
            if self.at.is_none() {
                info!(
                    in_secs = wait.as_secs(),
                    gap_secs = self.gap.as_secs(),
                    per_hour = ledger::MAX_PER_HOUR,
                    "a GPU probe is due; it waits for the rate limit"
                );
            }
            self.at = Some(now.mono + wait);
            return Next::Wait;
        }
        self.at = None;
        self.ledger.started(secs);
        self.wanted = false;
        self.probed_key = self.key.clone();
        self.probed_image = Some(image.clone());
        self.running = true;
        Next::Start(image)
    }
}

/// What the core starts from about upgrades (read from `upgrade.json` by
/// [`crate::upgrade::startup`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpgradeStart {
    /// This binary's version.
    pub own: String,
    /// The config's `auto_update`, and whether this install can upgrade in place at all.
    pub auto_update: bool,
    /// `(from, to)`: this binary is a pending upgrade's new one; it confirms after its first
    /// accepted heartbeat.
    pub confirm: Option<(String, String)>,
    /// An ended attempt not yet reported.
    pub report: Option<UpgradeReport>,
    /// Versions never tried again (rolled back here).
    pub never: Vec<String>,
    /// A version whose attempt failed, and how long until it may be tried again.
    pub failed: Option<(String, Duration)>,
}

/// The upgrade rule's state (see the module docs).
#[derive(Debug)]
pub struct Upgrades {
    own: String,
    auto_update: bool,
    in_flight: bool,
    confirm: Option<(String, String)>,
    /// The report to send until a heartbeat carrying it is accepted, and the one the heartbeat
    /// in flight carries.
    report: Option<UpgradeReport>,
    sent: Option<UpgradeReport>,
    /// Refused or rolled back: not tried again while this process runs.
    never: HashSet<String>,
    /// Failed: (when it may be tried again, failures so far).
    failed: HashMap<String, (Instant, u32)>,
}

/// What [`Upgrades::decide`] says of an offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offer {
    /// Nothing to do now (off, busy, refused before, waiting for a retry).
    Ignore(&'static str),
    /// Refused without a download: the version is not newer than this agent's own.
    Refuse(String),
    /// Start the upgrade.
    Start,
}

impl Upgrades {
    pub fn new(s: UpgradeStart, now: Instant) -> Upgrades {
        let failed = s.failed.into_iter().map(|(v, wait)| (v, (now + wait, 1))).collect();
        Upgrades {
            own: s.own,
            auto_update: s.auto_update,
            in_flight: false,
            confirm: s.confirm,
            report: s.report,
            sent: None,
            never: s.never.into_iter().collect(),
            failed,
        }
    }

    /// The rule for an offer (pure; see the module docs).
    pub fn decide(&self, offer: &UpgradeOffer, now: Instant) -> Offer {
        let v = offer.version.as_str();
        if !self.auto_update {
            Offer::Ignore("automatic upgrades are off")
        } else if v.len() > MAX_OFFERED_VERSION_LEN {
            // Not even reported: its report would carry it back.
            Offer::Ignore("the offered version is too long to be one")
        } else if self.in_flight || self.confirm.is_some() {
            Offer::Ignore("an upgrade is in flight")
        } else if self.report.is_some() {
            Offer::Ignore("the last upgrade's report is not delivered yet")
        } else if self.never.contains(v) {
            Offer::Ignore("this version was refused or rolled back")
        } else if self.failed.get(v).is_some_and(|(at, _)| now < *at) {
            Offer::Ignore("this version failed; waiting to retry")
        } else if let Err(e) = gpum_repo_keys::release::check_newer(v, &self.own) {
            Offer::Refuse(crate::client::truncate(&e.to_string(), 200))
        } else {
            Offer::Start
        }
    }

    /// Whether an upgrade runs now.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The report waiting to be delivered.
    pub fn report(&self) -> Option<&UpgradeReport> {
        self.report.as_ref()
    }

    /// An attempt ended before the swap.
    fn ended(&mut self, r: &UpgradeReport, now: Instant) {
        self.in_flight = false;
        match r.outcome {
            UpgradeOutcome::Refused | UpgradeOutcome::RolledBack => {
                self.never.insert(r.to.clone());
            }
            UpgradeOutcome::Failed => {
                let n = self.failed.get(&r.to).map_or(1, |(_, n)| n + 1);
                let wait = UPGRADE_RETRY.saturating_mul(1 << (n - 1).min(10)).min(UPGRADE_RETRY_MAX);
                self.failed.insert(r.to.clone(), (now + wait, n));
            }
            UpgradeOutcome::Succeeded => {}
        }
        self.report = Some(r.clone());
    }
}

/// `state.json`'s contents and when they were last written.
#[derive(Debug)]
struct StateFile {
    state: AgentState,
    last_written: Option<(AgentState, Instant)>,
}

impl StateFile {
    /// Whether it changed since the last write, or the last write is older than
    /// [`STATE_REFRESH`].
    fn due(&self, now: Instant) -> bool {
        match &self.last_written {
            None => true,
            Some((prev, at)) => {
                now.saturating_duration_since(*at) >= STATE_REFRESH || !same_but_times(prev, &self.state)
            }
        }
    }
}

/// What the core starts from.
pub struct Settings {
    pub node_id: String,
    pub server: String,
    pub answered: Answered,
    pub ledger: ProbeLedger,
    /// The least time between two probe starts ([`ledger::MIN_GAP`] but in tests).
    pub probe_gap: Duration,
    /// How long a container must be unknown before it goes ([`reconcile::MIN_AGE`] but in tests).
    pub reconcile_min_age: Duration,
    pub rng: StdRng,
    /// When the loop starts: the first heartbeat is due then.
    pub now: Instant,
    /// Upgrades (issue 47).
    pub upgrade: UpgradeStart,
}

/// The service's state and rules. See the module docs.
#[derive(Debug)]
pub struct Core {
    lifecycle: Lifecycle,
    seq: u64,
    /// A heartbeat is in flight; when the next one is due.
    beat_in_flight: bool,
    next_beat: Instant,
    interval: Duration,
    backoff: Backoff,
    rng: StdRng,
    accepted_hash: Option<String>,
    skew: Option<i64>,
    file: StateFile,
    inbox: Inbox,
    probes: Probes,
    removal_running: bool,
    /// Results waiting for an answered heartbeat, sent within the protocol's limits.
    outbox: Outbox,
    /// Whether the last answer's known list was as long as the platform may send (so possibly
    /// cut): the reconciler then removes nothing.
    known_truncated: bool,
    reconciler: Reconciler,
    upgrades: Upgrades,
}

impl Core {
    pub fn new(s: Settings) -> Core {
        let interval = Duration::from_secs(DEFAULT_HEARTBEAT_INTERVAL_SECS);
        let state = AgentState {
            node_id: Some(s.node_id),
            server: Some(s.server),
            connection: Connection::Connecting,
            verification: Some(VerificationState::AwaitingCheck),
            ..Default::default()
        };
        Core {
            lifecycle: Lifecycle::Running,
            seq: 0,
            beat_in_flight: false,
            next_beat: s.now,
            interval,
            backoff: Backoff::for_interval(interval),
            rng: s.rng,
            accepted_hash: None,
            skew: None,
            file: StateFile { state, last_written: None },
            inbox: Inbox::new(s.answered),
            probes: Probes::new(s.ledger, s.probe_gap),
            removal_running: false,
            outbox: Outbox::default(),
            known_truncated: false,
            reconciler: Reconciler::new(reconcile::MIN_BEATS, s.reconcile_min_age),
            upgrades: Upgrades::new(s.upgrade, s.now),
        }
    }

    /// The upgrade rule's state.
    pub fn upgrades(&self) -> &Upgrades {
        &self.upgrades
    }

    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle
    }

    fn stopping(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Stopping { .. } | Lifecycle::Exited(_))
    }

    /// When the next heartbeat is due; `None` while one is in flight or the agent stops.
    pub fn beat_at(&self) -> Option<Instant> {
        (!self.beat_in_flight && !self.stopping()).then_some(self.next_beat)
    }

    /// When a probe the rate limit held back may start; `None` while one runs or the agent
    /// stops.
    pub fn probe_at(&self) -> Option<Instant> {
        self.probes.at.filter(|_| !self.probes.running && !self.stopping())
    }

    /// When the agent exits anyway after a signal.
    pub fn stop_deadline(&self) -> Option<Instant> {
        match self.lifecycle {
            Lifecycle::Stopping { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// The heartbeat interval as the platform set it (clamped).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    pub fn state(&self) -> &AgentState {
        &self.file.state
    }

    /// The state, for [`Action::WriteState`] (the writer stamps `updated_at`).
    pub fn state_mut(&mut self) -> &mut AgentState {
        &mut self.file.state
    }

    /// `state.json` was written at `now`.
    pub fn state_written(&mut self, now: Instant) {
        self.file.last_written = Some((self.file.state.clone(), now));
    }

    /// For [`Action::SaveAnswered`].
    pub fn answered(&self) -> &Answered {
        &self.inbox.answered
    }

    /// For [`Action::SaveLedger`].
    pub fn ledger(&self) -> &ProbeLedger {
        &self.probes.ledger
    }

    /// Applies `ev`, which happened at `now`; appends what to do to `out`, in order.
    pub fn handle(&mut self, now: Now, ev: Event, out: &mut Vec<Action>) {
        if let Lifecycle::Exited(_) = self.lifecycle {
            return;
        }
        match ev {
            Event::Start => out.push(Action::WriteState),
            Event::Tick => {
                self.seq += 1;
                self.beat_in_flight = true;
                self.upgrades.sent = self.upgrades.report.clone();
                out.push(Action::Heartbeat(Beat {
                    seq: self.seq,
                    batch: self.outbox.take(),
                    clock_skew: self.skew,
                    accepted_hash: self.accepted_hash.clone(),
                    upgrade: self.upgrades.sent.clone(),
                }));
            }
            Event::Beat(done) => self.on_beat(now, *done, out),
            Event::ProbeDone(done) => {
                self.probes.running = false;
                let ProbeDone { report, images } = *done;
                if let Some(images) = images
                    && images != self.probes.ledger.images
                {
                    self.probes.ledger.images = images;
                    out.push(Action::SaveLedger);
                }
                info!(state = ?report.state, reason = ?report.reason, "GPU probe finished");
                self.file.state.verification = Some(report.state);
                self.outbox.set_probe(report);
                self.write_state(false, now, out);
                // Report it soon rather than a whole interval later.
                self.next_beat = self.next_beat.min(now.mono + REPORT_PROBE_WITHIN);
            }
            Event::ProbeLost => self.probes.running = false,
            Event::ProbeDue => {
                self.probes.at = None;
                self.maybe_start_probe(now, out);
            }
            Event::Removed(list) => {
                self.removal_running = false;
                self.outbox.push_removed(list);
            }
            Event::RentalsDone { changed } => {
                if changed {
                    self.next_beat = self.next_beat.min(now.mono + REPORT_PROBE_WITHIN);
                }
            }
            Event::Signal(name) => {
                if self.stop_deadline().is_some() {
                    info!(signal = name, "second signal; quitting now");
                    return self.exit(exit::OK, out);
                }
                info!(signal = name, "stopping: finishing the current step");
                // A probe killed here leaves a container that `cleanup_leftovers` removes at
                // the next start; a removal killed here is retried by the reconciler.
                out.push(Action::Abort);
                if !self.beat_in_flight {
                    return self.exit(exit::OK, out);
                }
                self.lifecycle = Lifecycle::Stopping { deadline: now.mono + STOP_GRACE };
            }
            Event::StopDeadline => {
                warn!("the heartbeat in flight did not finish in time; exiting anyway");
                self.exit(exit::OK, out);
            }
            Event::UpgradeDone(UpgradeEnd::Swapped) => {
                info!("upgraded: the new binary is in place; restarting into it (rentals keep running)");
                out.push(Action::Abort);
                self.exit(EXIT_RESTART, out);
            }
            Event::UpgradeDone(UpgradeEnd::Ended(r)) => {
                warn!(to = %r.to, outcome = %r.outcome, detail = %r.detail, "upgrade did not happen; nothing changed");
                self.upgrades.ended(&r, now.mono);
                out.push(Action::RecordUpgrade(r));
                self.next_beat = self.next_beat.min(now.mono + REPORT_PROBE_WITHIN);
            }
        }
    }

    /// An accepted answer: the report it carried is delivered, a pending upgrade of this
    /// binary is confirmed, and an offer is judged ([`Upgrades::decide`]).
    fn on_upgrade_answer(&mut self, now: Now, offer: Option<&UpgradeOffer>, out: &mut Vec<Action>) {
        let u = &mut self.upgrades;
        if let Some(sent) = u.sent.take()
            && u.report.as_ref() == Some(&sent)
        {
            u.report = None;
            out.push(Action::UpgradeReported);
        }
        if let Some((from, to)) = u.confirm.take() {
            info!(from = %from, to = %to, "upgrade confirmed: the platform accepted this version's first heartbeat");
            let r = UpgradeReport {
                from,
                to,
                outcome: UpgradeOutcome::Succeeded,
                detail: String::new(),
                at: unix(now.wall),
            };
            u.report = Some(r.clone());
            out.push(Action::ConfirmUpgrade(r));
            self.next_beat = self.next_beat.min(now.mono + REPORT_PROBE_WITHIN);
            return;
        }
        let Some(offer) = offer else { return };
        if self.lifecycle != Lifecycle::Running {
            return;
        }
        match u.decide(offer, now.mono) {
            Offer::Ignore(why) => debug!(version = %offer.version, why, "upgrade offer not taken"),
            Offer::Refuse(detail) => {
                warn!(version = %offer.version, own = %u.own, "refused the offered upgrade: not newer than this agent");
                let r = UpgradeReport {
                    from: u.own.clone(),
                    to: offer.version.clone(),
                    outcome: UpgradeOutcome::Refused,
                    detail,
                    at: unix(now.wall),
                };
                u.ended(&r, now.mono);
                out.push(Action::RecordUpgrade(r));
            }
            Offer::Start => {
                info!(version = %offer.version, own = %u.own, "the platform offers a newer agent; upgrading");
                u.in_flight = true;
                out.push(Action::StartUpgrade(offer.version.clone()));
            }
        }
    }

    fn exit(&mut self, code: i32, out: &mut Vec<Action>) {
        self.lifecycle = Lifecycle::Exited(code);
        out.push(Action::Exit(code));
    }

    /// A heartbeat finished: its answer or its failure, then what follows.
    fn on_beat(&mut self, now: Now, mut b: BeatDone, out: &mut Vec<Action>) {
        self.beat_in_flight = false;
        let st = &mut self.file.state;
        // Log transitions only; a missing socket was already logged when connecting failed.
        let logged_before = st.docker_ok.is_some() || b.docker_connected;
        if logged_before && Some(b.docker_ok) != st.docker_ok {
            match &b.docker_error {
                None => info!("Docker engine answers"),
                Some(e) => {
                    warn!(error = %e, "Docker engine does not answer; the agent keeps running and reports it")
                }
            }
        }
        st.docker_ok = Some(b.docker_ok);
        let result = std::mem::replace(&mut b.result, Err(CallError::Timeout));
        let (delay, doomed) = match result {
            Ok(ans) => self.on_answer(now, &mut b, ans, out),
            Err(e) => {
                if let Verdict::StopForGood(code) = classify(&e) {
                    return self.stop_revoked(now, code, &e, out);
                }
                (self.failed(now, b.carried, &e, out), Vec::new())
            }
        };
        if self.stop_deadline().is_some() {
            return self.exit(exit::OK, out);
        }
        match self.lifecycle {
            // The acknowledgement went out (or could not): exit, systemd restarts.
            Lifecycle::Restarting => {
                info!("restarting on the platform's command");
                return self.exit(EXIT_RESTART, out);
            }
            Lifecycle::RestartDue => {
                self.lifecycle = Lifecycle::Restarting;
                self.next_beat = now.mono;
                return;
            }
            _ => {}
        }
        self.next_beat = now.mono + delay;
        if !self.removal_running && !doomed.is_empty() {
            self.removal_running = true;
            out.push(Action::Remove(doomed));
        }
        if !self.probes.running {
            self.maybe_start_probe(now, out);
        }
    }

    /// The platform answered: returns the delay until the next heartbeat and the containers to
    /// remove.
    fn on_answer(
        &mut self,
        now: Now,
        b: &mut BeatDone,
        ans: Answer<HeartbeatResponse>,
        out: &mut Vec<Action>,
    ) -> (Duration, Vec<ManagedContainer>) {
        if self.file.state.connection != Connection::Connected {
            if self.backoff.failures() > 0 {
                info!(failed_attempts = self.backoff.failures(), "platform reachable again");
            } else {
                info!("connected to the platform");
            }
        }
        self.backoff.reset();
        let resp = ans.body;
        let skew = clock_skew(now.wall, ans.server_date);
        if skew.is_some() && self.skew.is_none() {
            warn!(skew_secs = skew, "this machine's clock differs from the platform's; reporting it");
        }
        self.skew = skew;
        if b.inventory_sent {
            if self.accepted_hash.is_some() {
                info!("inventory changed; sent it in full");
            }
            self.accepted_hash = Some(std::mem::take(&mut b.inventory_hash));
        }
        // Only what this heartbeat carried is delivered; a probe that finished while it was in
        // flight is still pending.
        self.outbox.delivered(&b.carried);
        if self.probes.key.as_deref() != Some(b.probe_key.as_str()) {
            if self.probes.key.is_some() {
                info!("hardware or software changed; the GPU probe runs again");
            }
            self.probes.key = Some(std::mem::take(&mut b.probe_key));
        }
        let doomed = self.apply_answer(now, &resp, b, out);
        self.on_upgrade_answer(now, resp.upgrade.as_ref(), out);
        let st = &mut self.file.state;
        st.connection = Connection::Connected;
        st.last_heartbeat_at = Some(unix(now.wall));
        st.last_error = None;
        st.clock_skew_secs = self.skew;
        self.write_state(false, now, out);
        debug!(seq = b.seq, bytes = ans.sent_bytes, "heartbeat answered");
        (jittered(self.interval, &mut self.rng), doomed)
    }

    /// The heartbeat failed, not for good: returns the delay until the next one.
    fn failed(&mut self, now: Now, batch: Batch, e: &CallError, out: &mut Vec<Action>) -> Duration {
        // The upgrade's report was not delivered: it goes again with the next heartbeat.
        self.upgrades.sent = None;
        if is_refused_body(e) {
            // The same body would be refused again: carry less, or drop what was refused.
            match self.outbox.refused(batch) {
                Refusal::Shrunk { results_cap, removed_cap } => {
                    warn!(error = %e, results_cap, removed_cap, "the platform refused the heartbeat's body; sending less")
                }
                Refusal::Dropped(b) => warn!(
                    error = %e,
                    results = ?b.results.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
                    removed = b.removed.len(),
                    probe = b.probe.is_some(),
                    "the platform refused the heartbeat's body again; dropped what it carried"
                ),
                Refusal::NothingToTrim => {}
            }
        } else {
            // Undelivered results go out with the next heartbeat, first.
            self.outbox.failed(batch);
        }
        let delay = self.backoff.fail(&mut self.rng);
        if self.backoff.failures() == 1 {
            warn!(error = %e, "heartbeat failed; retrying with backoff (further failures are logged at debug level)");
        } else {
            debug!(error = %e, failures = self.backoff.failures(), delay_ms = delay.as_millis() as u64, "heartbeat failed");
        }
        self.file.state.connection = Connection::Unreachable;
        self.file.state.last_error = Some(e.to_string());
        self.write_state(false, now, out);
        delay
    }

    /// Applies the platform's answer; returns the managed containers to remove now.
    fn apply_answer(
        &mut self,
        now: Now,
        resp: &HeartbeatResponse,
        b: &BeatDone,
        out: &mut Vec<Action>,
    ) -> Vec<ManagedContainer> {
        let interval = clamped_interval(resp.heartbeat_interval_secs);
        if interval != self.interval {
            info!(secs = interval.as_secs(), "heartbeat interval set by the platform");
            self.interval = interval;
            self.backoff.set_cap(interval);
        }
        if resp.probe_image != self.probes.image {
            match &resp.probe_image {
                Some(img) => info!(image = %img, "probe image set by the platform"),
                None => info!("no probe image: the GPU check waits («Ожидает проверки»)"),
            }
            self.probes.image = resp.probe_image.clone();
            self.file.state.probe_image = resp.probe_image.clone();
        }
        if self.probes.image.is_none() && !self.probes.running {
            self.file.state.verification = Some(VerificationState::AwaitingCheck);
        }
        self.take_commands(&resp.commands, out);
        // Reconcile only against an answer the platform actually gave (this one), and only with
        // a listing that succeeded: a failed listing is no evidence either way.
        let truncated = resp.known_containers.len() >= limits::MAX_KNOWN_CONTAINERS;
        if truncated && !self.known_truncated {
            warn!(
                count = resp.known_containers.len(),
                "the platform's list of known containers may be cut at the protocol's limit; removing nothing while it is"
            );
        }
        self.known_truncated = truncated;
        if truncated {
            return Vec::new();
        }
        if b.docker_connected && self.file.state.docker_ok == Some(true) {
            let mut known: HashSet<String> = resp.known_containers.iter().cloned().collect();
            // A desired rental's container is the rental reconciler's, never an unknown one.
            let rentals: HashSet<String> =
                resp.rentals.iter().map(|r| rental::container_name(&r.id)).collect();
            known.extend(b.managed.iter().filter(|c| rentals.contains(&c.name)).map(|c| c.id.clone()));
            return self.reconciler.decide(&b.managed, &known, now.mono);
        }
        Vec::new()
    }

    /// At most one answer's worth of new commands is taken; the rest, still unanswered, come
    /// again. Commands already answered are skipped first, so that a platform that hands them
    /// over again cannot hide the new ones behind them.
    fn take_commands(&mut self, commands: &[Command], out: &mut Vec<Action>) {
        let mut newly: Vec<String> = Vec::new();
        let mut left = 0usize;
        for c in commands {
            match self.inbox.admit(&c.id, &newly, &self.outbox) {
                Admit::Answered => {
                    debug!(id = %c.id, "command already answered");
                    continue;
                }
                Admit::BadId => {
                    warn!(len = c.id.len(), "ignored a command whose id is empty or too long to answer");
                    continue;
                }
                Admit::Later => {
                    left += 1;
                    continue;
                }
                Admit::New => {}
            }
            newly.push(c.id.clone());
            let answer = |ok: bool, msg: String| Some(CommandResult { id: c.id.clone(), ok, message: msg });
            let result = match CommandKind::parse(&c.kind) {
                Some(CommandKind::Recheck) => {
                    info!(id = %c.id, "command recheck: the GPU probe runs again, within the rate limit");
                    self.probes.wanted = true;
                    if self.probes.image.is_none() {
                        answer(true, "no probe image is set; the check waits for one".into())
                    } else if self.inbox.rechecks.len() < MAX_WAITING_RECHECKS {
                        // Answered when the probe starts, which the rate limit may hold back.
                        self.inbox.rechecks.push(c.id.clone());
                        None
                    } else {
                        answer(true, "a probe is due already; it runs when the rate limit allows".into())
                    }
                }
                Some(CommandKind::Restart) => {
                    info!(id = %c.id, "command restart: exiting so that systemd starts the agent again");
                    if self.lifecycle == Lifecycle::Running {
                        self.lifecycle = Lifecycle::RestartDue;
                    }
                    answer(true, "restarting".into())
                }
                None => {
                    let kind = crate::client::truncate(&c.kind, 64);
                    warn!(id = %c.id, kind = %kind, "refused an unknown command");
                    answer(false, format!("unknown command {kind:?}: refused"))
                }
            };
            if let Some(result) = result {
                self.outbox.push_result(result);
            }
        }
        if left > 0 {
            warn!(
                left,
                limit = limits::MAX_COMMANDS_PER_RESPONSE,
                "the platform handed over more commands than one answer may carry; the rest wait"
            );
        }
        // Recorded before a `restart` exits, so that the same command after the restart is not
        // obeyed again.
        if self.inbox.answered.insert_all(newly) {
            out.push(Action::SaveAnswered);
        }
    }

    /// Starts the GPU probe when one is due ([`Probes::next`]). Without an image no probe runs
    /// (awaiting check); without Docker it runs and reports that Docker is unavailable. The
    /// waiting `recheck` commands are answered when the probe starts.
    fn maybe_start_probe(&mut self, now: Now, out: &mut Vec<Action>) {
        match self.probes.next(now) {
            Next::NoImage => {
                self.inbox.answer_rechecks(&mut self.outbox, "no probe image is set; the check waits for one")
            }
            Next::Nothing | Next::Wait => {}
            Next::Start(image) => {
                out.push(Action::SaveLedger);
                self.inbox.answer_rechecks(&mut self.outbox, "probe started");
                info!(image = %image, "running the GPU probe");
                out.push(Action::StartProbe(ProbeStart {
                    image,
                    now: unix(now.wall),
                    images: self.probes.ledger.images.clone(),
                }));
            }
        }
    }

    fn stop_revoked(&mut self, now: Now, code: ErrorCode, e: &CallError, out: &mut Vec<Action>) {
        error!(code = ?code, error = %e, "the platform revoked this node (server deleted or token replaced); stopping for good. Containers are left in place (a deleted node's rentals excepted)");
        self.file.state.connection = Connection::Stopped;
        self.file.state.stopped = Some(Stopped {
            reason: StopReason::Revoked,
            detail: serde_json::to_value(code)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            at: unix(now.wall),
        });
        self.write_state(true, now, out);
        out.push(Action::Abort);
        self.exit(exit::STOPPED_FOR_GOOD, out);
    }

    /// Asks for `state.json` to be written when it is due ([`StateFile::due`]); `force` asks
    /// regardless.
    fn write_state(&mut self, force: bool, now: Now, out: &mut Vec<Action>) {
        if force || self.file.due(now.mono) {
            out.push(Action::WriteState);
        }
    }
}

/// The platform's interval (0: the default), within [`MIN_INTERVAL`]..[`MAX_INTERVAL`].
pub fn clamped_interval(secs: u64) -> Duration {
    let secs = if secs == 0 { DEFAULT_HEARTBEAT_INTERVAL_SECS } else { secs };
    Duration::from_secs(secs).clamp(MIN_INTERVAL, MAX_INTERVAL)
}

/// Whether two states differ only in their timestamps (the heartbeat's and the write's). It
/// runs every heartbeat, so it compares in place rather than cloning; the destructuring makes a
/// new field a compile error here until it is compared.
fn same_but_times(a: &AgentState, b: &AgentState) -> bool {
    let AgentState {
        node_id,
        server,
        connection,
        last_heartbeat_at: _,
        verification,
        probe_image,
        last_error,
        clock_skew_secs,
        docker_ok,
        stopped,
        updated_at: _,
    } = a;
    *node_id == b.node_id
        && *server == b.server
        && *connection == b.connection
        && *verification == b.verification
        && *probe_image == b.probe_image
        && *last_error == b.last_error
        && *clock_skew_secs == b.clock_skew_secs
        && *docker_ok == b.docker_ok
        && *stopped == b.stopped
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use gpum_host::fake::FakeHost;
    use gpum_protocol::RentalSpec;
    use proptest::prelude::*;
    use rand::SeedableRng;

    use super::*;

    /// The core, driven as the run loop drives it, against a simulated clock and platform.
    struct Sim {
        core: Core,
        wall0: SystemTime,
        mono0: Instant,
        elapsed: Duration,
        /// Every action, in order.
        actions: Vec<Action>,
        /// The heartbeat and the probe in flight.
        beat: Option<Beat>,
        probe: Option<ProbeStart>,
        /// The command results the platform accepted, in order.
        delivered: Vec<CommandResult>,
        /// What the heartbeats list as managed.
        managed: Vec<ManagedContainer>,
    }

    impl Sim {
        fn new() -> Sim {
            Sim::with_upgrade(UpgradeStart::default())
        }

        fn with_upgrade(upgrade: UpgradeStart) -> Sim {
            let mono0 = Instant::now();
            let core = Core::new(Settings {
                node_id: "node".into(),
                server: "https://platform.example".into(),
                answered: Answered::load(&FakeHost::new(), Path::new("/var/lib/gpum-agent")),
                ledger: ProbeLedger::default(),
                probe_gap: ledger::MIN_GAP,
                reconcile_min_age: reconcile::MIN_AGE,
                rng: StdRng::seed_from_u64(7),
                now: mono0,
                upgrade,
            });
            Sim {
                core,
                wall0: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                mono0,
                elapsed: Duration::ZERO,
                actions: Vec::new(),
                beat: None,
                probe: None,
                delivered: Vec::new(),
                managed: Vec::new(),
            }
        }

        fn now(&self) -> Now {
            Now { wall: self.wall0 + self.elapsed, mono: self.mono0 + self.elapsed }
        }

        fn advance(&mut self, d: Duration) {
            self.elapsed += d;
        }

        fn exited(&self) -> Option<i32> {
            match self.core.lifecycle() {
                Lifecycle::Exited(code) => Some(code),
                _ => None,
            }
        }

        /// Hands `ev` to the core; returns what it asked for (also kept in `actions`).
        fn send(&mut self, ev: Event) -> Vec<Action> {
            let mut out = Vec::new();
            self.core.handle(self.now(), ev, &mut out);
            for a in &out {
                match a {
                    Action::Heartbeat(b) => {
                        assert!(self.beat.is_none(), "two heartbeats in flight");
                        self.beat = Some(b.clone());
                    }
                    Action::StartProbe(p) => {
                        assert!(self.probe.is_none(), "two probes in flight");
                        self.probe = Some(p.clone());
                    }
                    _ => {}
                }
            }
            self.actions.extend(out.iter().cloned());
            out
        }

        /// Waits until the next heartbeat is due and sends it.
        fn tick(&mut self) {
            let at = self.core.beat_at().expect("a heartbeat is due");
            self.advance(at.saturating_duration_since(self.now().mono));
            self.send(Event::Tick);
        }

        /// The heartbeat in flight ends with `answer`.
        fn finish(&mut self, answer: Result<HeartbeatResponse, CallError>) -> Vec<Action> {
            let b = self.beat.take().expect("a heartbeat in flight");
            if answer.is_ok() {
                self.delivered.extend(b.batch.results.iter().cloned());
            }
            let done = BeatDone {
                seq: b.seq,
                carried: b.batch,
                inventory_sent: b.accepted_hash.is_none(),
                inventory_hash: "hash".into(),
                probe_key: "key".into(),
                docker_connected: true,
                docker_ok: true,
                docker_error: None,
                managed: self.managed.clone(),
                result: answer.map(|body| Answer { body, server_date: None, sent_bytes: 0 }),
            };
            self.send(Event::Beat(Box::new(done)))
        }

        /// One heartbeat, answered with `answer`.
        fn beat(&mut self, answer: Result<HeartbeatResponse, CallError>) -> Vec<Action> {
            self.tick();
            self.finish(answer)
        }

        /// The probe in flight, if any, finishes; a probe the rate limit held back starts when
        /// it may.
        fn probes(&mut self) {
            if let Some(p) = self.probe.take() {
                let report = ProbeReport {
                    state: VerificationState::Verified,
                    reason: None,
                    output: String::new(),
                    finished_at: p.now,
                    image: p.image,
                };
                self.send(Event::ProbeDone(Box::new(ProbeDone { report, images: Some(p.images) })));
            }
            if let Some(at) = self.core.probe_at()
                && at <= self.now().mono
            {
                self.send(Event::ProbeDue);
            }
        }

        /// Unix seconds of every probe start so far.
        fn probe_starts(&self) -> Vec<u64> {
            self.actions
                .iter()
                .filter_map(|a| match a {
                    Action::StartProbe(p) => Some(p.now),
                    _ => None,
                })
                .collect()
        }
    }

    fn answer(secs: u64, image: Option<&str>, commands: &[(String, &str)]) -> HeartbeatResponse {
        HeartbeatResponse {
            heartbeat_interval_secs: secs,
            commands: commands
                .iter()
                .map(|(id, kind)| Command { id: id.clone(), kind: (*kind).into() })
                .collect(),
            known_containers: Vec::new(),
            probe_image: image.map(String::from),
            send_inventory: false,
            rentals: Vec::new(),
            upgrade: None,
        }
    }

    fn revoked() -> CallError {
        CallError::Api { status: 410, code: ErrorCode::NodeDeleted, message: "deleted".into() }
    }

    fn container(i: usize) -> ManagedContainer {
        ManagedContainer { id: format!("id{i}"), name: format!("c{i}"), state: "running".into() }
    }

    const KINDS: [&str; 3] = ["recheck", "recheck", "bogus"];

    /// The commands of one answer (an id from a small pool, a kind from [`KINDS`]), whether the
    /// heartbeat fails instead, and the seconds until the next one.
    type Round = (Vec<(u8, usize)>, bool, u64);

    /// A platform's round: the commands it hands over (ids from a small pool, so they repeat),
    /// whether the heartbeat fails instead, and how long until the next one.
    fn rounds() -> impl Strategy<Value = Vec<Round>> {
        prop::collection::vec(
            (
                prop::collection::vec((0u8..24, 0..KINDS.len()), 0..=limits::MAX_COMMANDS_PER_RESPONSE),
                any::<bool>(),
                0u64..200,
            ),
            1..40,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever the answers' order and repeats, and whatever heartbeats fail, each command
        /// is answered in exactly one accepted heartbeat (a `recheck` when its probe starts,
        /// within the rate limit).
        #[test]
        fn a_command_is_answered_exactly_once(rounds in rounds()) {
            let mut sim = Sim::new();
            sim.send(Event::Start);
            let mut handed = HashSet::new();
            for (commands, fail, wait) in rounds {
                let commands: Vec<(String, &str)> =
                    commands.iter().map(|(id, k)| (format!("cmd-{id}"), KINDS[*k])).collect();
                let a = if fail {
                    Err(CallError::Timeout)
                } else {
                    handed.extend(commands.iter().map(|(id, _)| id.clone()));
                    Ok(answer(10, Some("img"), &commands))
                };
                sim.beat(a);
                sim.probes();
                sim.advance(Duration::from_secs(wait));
                sim.probes();
            }
            // Then a quiet platform for over an hour: every waiting `recheck` gets its probe.
            for _ in 0..80 {
                sim.beat(Ok(answer(60, Some("img"), &[])));
                sim.probes();
            }
            let mut ids: Vec<String> = sim.delivered.iter().map(|r| r.id.clone()).collect();
            ids.sort();
            let n = ids.len();
            ids.dedup();
            prop_assert_eq!(n, ids.len(), "a command answered twice");
            prop_assert_eq!(ids.into_iter().collect::<HashSet<_>>(), handed);
            prop_assert_eq!(sim.exited(), None);
        }

        /// Whatever interval the platform asks for, the next heartbeat comes within the clamp
        /// (±10 % jitter), and a failure's backoff never waits longer than the interval.
        #[test]
        fn the_interval_stays_within_its_clamp(answers in prop::collection::vec((any::<u64>(), any::<bool>()), 1..30)) {
            let mut sim = Sim::new();
            let mut interval = Duration::from_secs(DEFAULT_HEARTBEAT_INTERVAL_SECS);
            for (secs, fail) in answers {
                let secs = match secs % 4 { 0 => secs, 1 => secs % 5, 2 => secs % 7200, _ => 0 };
                sim.tick();
                let delay = if fail {
                    sim.finish(Err(CallError::Timeout));
                    sim.core.beat_at().unwrap() - sim.now().mono
                } else {
                    sim.finish(Ok(answer(secs, None, &[])));
                    interval = clamped_interval(secs);
                    let d = sim.core.beat_at().unwrap() - sim.now().mono;
                    prop_assert!(d >= interval.mul_f64(0.9) && d <= interval.mul_f64(1.1), "{secs}: {d:?}");
                    d
                };
                prop_assert!(interval >= MIN_INTERVAL && interval <= MAX_INTERVAL);
                prop_assert!(delay <= MAX_INTERVAL.mul_f64(1.1) && delay <= interval.mul_f64(1.1));
                prop_assert_eq!(sim.core.interval(), interval);
            }
        }

        /// An answer whose known list is as long as the protocol allows may have been cut: while
        /// it is, no container is removed, however long they have been unknown.
        #[test]
        fn a_cut_known_list_never_removes_anything(cuts in prop::collection::vec(any::<bool>(), 1..30), n in 1usize..5) {
            let mut sim = Sim::new();
            sim.managed = (0..n).map(container).collect();
            let full: Vec<String> = (0..limits::MAX_KNOWN_CONTAINERS).map(|i| format!("other{i}")).collect();
            let mut unknown_beats = 0;
            for cut in cuts {
                let mut a = answer(100, None, &[]);
                if cut {
                    a.known_containers = full.clone();
                }
                let out = sim.beat(Ok(a));
                let removes = out.iter().any(|a| matches!(a, Action::Remove(_)));
                prop_assert!(!(cut && removes), "removed while the known list was cut");
                if !cut {
                    unknown_beats += 1;
                }
                // The rule still works when the list is whole: the third unknown answer, a
                // minute or more after the first, removes them (and each one after, as they stay).
                prop_assert_eq!(removes, !cut && unknown_beats >= reconcile::MIN_BEATS as usize);
                if let Some(Action::Remove(list)) = out.iter().find(|a| matches!(a, Action::Remove(_))) {
                    prop_assert_eq!(list, &sim.managed);
                    sim.send(Event::Removed(Vec::new()));
                }
            }
        }

        /// Whatever asks for probes (`recheck` in every answer, image changes, failures, long
        /// and short waits), they never start more often than the ledger allows: one per
        /// `MIN_GAP`, `MAX_PER_HOUR` in any hour.
        #[test]
        fn probes_never_start_faster_than_the_ledger_allows(
            rounds in prop::collection::vec((0u64..400, any::<bool>(), 0usize..3, any::<bool>(), any::<bool>()), 1..120)
        ) {
            let mut sim = Sim::new();
            let images = [Some("a"), Some("b"), None];
            for (i, (wait, recheck, image, fail, finish)) in rounds.into_iter().enumerate() {
                let a = if fail {
                    Err(CallError::Timeout)
                } else if recheck {
                    Ok(answer(1, images[image], &[(format!("r{i}"), "recheck")]))
                } else {
                    Ok(answer(1, images[image], &[]))
                };
                sim.beat(a);
                if finish {
                    sim.probes();
                }
                sim.advance(Duration::from_secs(wait));
                sim.probes();
            }
            let starts = sim.probe_starts();
            for w in starts.windows(2) {
                prop_assert!(w[1] >= w[0] + ledger::MIN_GAP.as_secs(), "{starts:?}");
            }
            for (i, s) in starts.iter().enumerate() {
                let in_hour = starts[i..].iter().take_while(|t| **t < s + 3600).count();
                prop_assert!(in_hour <= ledger::MAX_PER_HOUR, "{starts:?}");
            }
        }

        /// Whatever came before, a revocation records why, aborts what runs, exits 78, and the
        /// core asks for nothing after it.
        #[test]
        fn a_final_failure_ends_in_exit_78_and_nothing_after(rounds in rounds(), signal in any::<bool>()) {
            let mut sim = Sim::new();
            sim.send(Event::Start);
            for (commands, fail, wait) in rounds {
                let commands: Vec<(String, &str)> =
                    commands.iter().map(|(id, k)| (format!("c{id}"), KINDS[*k])).collect();
                sim.beat(if fail { Err(CallError::Timeout) } else { Ok(answer(5, Some("img"), &commands)) });
                sim.advance(Duration::from_secs(wait));
                sim.probes();
            }
            sim.tick();
            if signal {
                // A stop in progress does not hide the revocation.
                prop_assert!(!sim.send(Event::Signal("SIGTERM")).contains(&Action::Exit(exit::OK)));
            }
            let out = sim.finish(Err(revoked()));
            prop_assert_eq!(&out[out.len() - 3..], &[Action::WriteState, Action::Abort, Action::Exit(78)]);
            prop_assert_eq!(sim.exited(), Some(exit::STOPPED_FOR_GOOD));
            let st = sim.core.state();
            prop_assert_eq!(&st.connection, &Connection::Stopped);
            prop_assert_eq!(st.stopped.as_ref().map(|s| s.reason), Some(StopReason::Revoked));
            prop_assert_eq!(sim.core.beat_at(), None);
            prop_assert_eq!(sim.core.probe_at(), None);
            let after = [
                Event::Tick,
                Event::ProbeDue,
                Event::Signal("SIGTERM"),
                Event::StopDeadline,
                Event::Removed(Vec::new()),
                Event::Start,
            ];
            for ev in after {
                prop_assert!(sim.send(ev).is_empty());
            }
        }
    }

    /// A desired rental's container is the rental reconciler's: the unknown-container rule never
    /// removes it, however long the platform leaves it out of `known_containers`; once the
    /// platform no longer lists the rental, the rule applies to it again like to any other.
    #[test]
    fn a_desired_rentals_container_is_never_removed_as_unknown() {
        let mut sim = Sim::new();
        let rid = "rent-00112233445566aa";
        let rental_container =
            ManagedContainer { id: "rid".into(), name: rental::container_name(rid), state: "running".into() };
        sim.managed = vec![rental_container.clone(), container(1)];
        let spec = RentalSpec {
            id: rid.into(),
            image: "x@sha256:0".into(),
            gpu_uuids: vec!["GPU-1".into()],
            cpu_millis: 1000,
            memory_mib: 1024,
            disk_gib: 0,
            shm_mib: 64,
            env: vec![],
            command: vec![],
            ends_at: 2_000_000_000,
            ports: vec![],
            driver_capabilities: vec![],
        };
        let mut removed = Vec::new();
        for _ in 0..10 {
            let mut a = answer(30, None, &[]);
            a.rentals = vec![spec.clone()];
            for act in sim.beat(Ok(a)) {
                if let Action::Remove(list) = act {
                    removed.extend(list);
                    sim.send(Event::Removed(Vec::new()));
                }
            }
        }
        assert!(!removed.is_empty(), "the other unknown container goes");
        assert!(removed.iter().all(|c| c.id != "rid"), "the desired rental's container stayed: {removed:?}");
        // No longer listed: it is an unknown managed container again.
        let mut gone = false;
        for _ in 0..5 {
            for act in sim.beat(Ok(answer(30, None, &[]))) {
                if let Action::Remove(list) = act {
                    gone |= list.iter().any(|c| c.id == "rid");
                    sim.send(Event::Removed(Vec::new()));
                }
            }
        }
        assert!(gone);
    }

    #[test]
    fn a_restart_is_acknowledged_by_one_more_heartbeat_then_exits() {
        let mut sim = Sim::new();
        sim.managed = vec![container(1)];
        // Three answers that do not know the container, a minute apart: the third would remove
        // it, but the restart comes first.
        for _ in 0..2 {
            sim.beat(Ok(answer(60, None, &[])));
        }
        let out = sim.beat(Ok(answer(60, None, &[("r1".into(), "restart")])));
        assert!(out.contains(&Action::SaveAnswered), "recorded before the exit: {out:?}");
        assert!(!out.iter().any(|a| matches!(a, Action::Remove(_) | Action::Exit(_))), "{out:?}");
        assert_eq!(sim.core.lifecycle(), Lifecycle::Restarting);
        assert_eq!(sim.core.beat_at(), Some(sim.now().mono), "the acknowledgement goes at once");
        sim.tick();
        let results = &sim.beat.as_ref().unwrap().batch.results;
        assert_eq!(results, &[CommandResult { id: "r1".into(), ok: true, message: "restarting".into() }]);
        // Delivered or not, the agent exits; the same command after the restart is not obeyed.
        assert_eq!(sim.finish(Err(CallError::Timeout)).last(), Some(&Action::Exit(EXIT_RESTART)));
        assert!(sim.core.answered().contains("r1"));
    }

    #[test]
    fn a_signal_lets_the_heartbeat_in_flight_finish_and_a_second_one_quits() {
        let mut sim = Sim::new();
        assert_eq!(
            sim.send(Event::Signal("SIGTERM")),
            [Action::Abort, Action::Exit(exit::OK)],
            "idle: at once"
        );

        let mut sim = Sim::new();
        sim.tick();
        assert_eq!(sim.send(Event::Signal("SIGTERM")), [Action::Abort]);
        assert_eq!(sim.core.stop_deadline(), Some(sim.now().mono + STOP_GRACE));
        assert_eq!(sim.core.beat_at(), None, "no new heartbeat while stopping");
        // Even a restart in the last answer ends in 0: the owner stopped the service.
        assert_eq!(
            sim.finish(Ok(answer(10, None, &[("r".into(), "restart")]))).last(),
            Some(&Action::Exit(0))
        );

        let mut sim = Sim::new();
        sim.tick();
        sim.send(Event::Signal("SIGTERM"));
        assert_eq!(sim.send(Event::Signal("SIGINT")), [Action::Exit(exit::OK)]);

        let mut sim = Sim::new();
        sim.tick();
        sim.send(Event::Signal("SIGTERM"));
        assert_eq!(sim.send(Event::StopDeadline), [Action::Exit(exit::OK)]);
    }

    #[test]
    fn one_answer_takes_at_most_its_share_of_new_commands_and_skips_answered_ones_first() {
        let mut sim = Sim::new();
        let old: Vec<(String, &str)> = (0..20).map(|i| (format!("old{i}"), "bogus")).collect();
        sim.beat(Ok(answer(10, None, &old[..limits::MAX_COMMANDS_PER_RESPONSE])));
        // The answered ones come first again, then new ones: the new ones are still taken.
        let mut again = old.clone();
        again.extend((0..20).map(|i| (format!("new{i}"), "bogus")));
        again.push((String::new(), "bogus"));
        again.push(("x".repeat(MAX_COMMAND_ID_LEN + 1), "bogus"));
        sim.beat(Ok(answer(10, None, &again)));
        sim.beat(Ok(answer(10, None, &again)));
        sim.beat(Ok(answer(10, None, &again)));
        let ids: Vec<&str> = sim.delivered.iter().map(|r| r.id.as_str()).collect();
        // 16, then the 4 old ones left and 12 new ones, then the 8 new ones left; the two
        // ids that cannot be answered are ignored.
        assert_eq!(ids.len(), 40, "every valid id once: {ids:?}");
        assert!(ids[..20].iter().all(|i| i.starts_with("old")), "{ids:?}");
        assert!(ids[20..].iter().all(|i| i.starts_with("new")), "{ids:?}");
        assert!(sim.delivered.iter().all(|r| !r.ok && r.message.starts_with("unknown command")));
    }

    #[test]
    fn a_recheck_without_an_image_is_answered_at_once_and_the_state_waits() {
        let mut sim = Sim::new();
        sim.beat(Ok(answer(10, None, &[("r".into(), "recheck")])));
        sim.beat(Ok(answer(10, None, &[])));
        assert_eq!(sim.delivered[0].message, "no probe image is set; the check waits for one");
        assert_eq!(sim.core.state().verification, Some(VerificationState::AwaitingCheck));
        assert!(sim.probe_starts().is_empty());
        // With an image, the probe starts after the answer and its result is reported soon.
        let out = sim.beat(Ok(answer(10, Some("img"), &[])));
        assert!(out.contains(&Action::SaveLedger), "{out:?}");
        assert_eq!(sim.probe_starts().len(), 1);
        sim.probes();
        assert_eq!(sim.core.beat_at(), Some(sim.now().mono + REPORT_PROBE_WITHIN));
        assert_eq!(sim.core.state().verification, Some(VerificationState::Verified));
    }

    #[test]
    fn the_state_file_is_written_on_a_change_or_every_refresh() {
        let mut sim = Sim::new();
        assert_eq!(sim.send(Event::Start), [Action::WriteState]);
        sim.core.state_written(sim.now().mono);
        let writes = |out: &[Action]| out.iter().filter(|a| **a == Action::WriteState).count();
        // Connecting -> connected is a change.
        assert_eq!(writes(&sim.beat(Ok(answer(10, None, &[])))), 1);
        sim.core.state_written(sim.now().mono);
        // Only the heartbeat's time moved: no write until STATE_REFRESH has passed.
        assert_eq!(writes(&sim.beat(Ok(answer(10, None, &[])))), 0);
        sim.advance(STATE_REFRESH);
        assert_eq!(writes(&sim.beat(Ok(answer(10, None, &[])))), 1);
        sim.core.state_written(sim.now().mono);
        // Unreachable is a change.
        assert_eq!(writes(&sim.beat(Err(CallError::Timeout))), 1);
        assert_eq!(sim.core.state().connection, Connection::Unreachable);
    }

    #[test]
    fn only_timestamps_do_not_count_as_a_change() {
        let a = AgentState {
            node_id: Some("n".into()),
            connection: Connection::Connected,
            last_heartbeat_at: Some(10),
            updated_at: 10,
            ..Default::default()
        };
        let mut b = a.clone();
        b.last_heartbeat_at = Some(20);
        b.updated_at = 21;
        assert!(same_but_times(&a, &b));
        b.connection = Connection::Unreachable;
        assert!(!same_but_times(&a, &b));
        let mut c = a.clone();
        c.last_error = Some("timeout".into());
        assert!(!same_but_times(&a, &c));
    }

    // ------------------------------------------------------------------ upgrades (issue 47)

    fn up(own: &str) -> UpgradeStart {
        UpgradeStart { own: own.into(), auto_update: true, ..Default::default() }
    }

    fn offering(version: &str) -> HeartbeatResponse {
        HeartbeatResponse { upgrade: Some(UpgradeOffer { version: version.into() }), ..answer(60, None, &[]) }
    }

    fn starts(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::StartUpgrade(v) => Some(v.clone()),
                _ => None,
            })
            .collect()
    }

    fn recorded(actions: &[Action]) -> Vec<UpgradeReport> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::RecordUpgrade(r) | Action::ConfirmUpgrade(r) => Some(r.clone()),
                _ => None,
            })
            .collect()
    }

    fn report(to: &str, outcome: UpgradeOutcome) -> UpgradeReport {
        UpgradeReport { from: "0.1.0".into(), to: to.into(), outcome, detail: "why".into(), at: 1 }
    }

    /// An offer of a newer version starts one upgrade; while it runs the same offer starts no
    /// other; the swap exits with EXIT_RESTART (systemd starts the new binary).
    #[test]
    fn an_offer_of_a_newer_version_starts_one_upgrade_and_the_swap_restarts() {
        let mut sim = Sim::with_upgrade(up("0.1.0"));
        sim.send(Event::Start);
        assert_eq!(starts(&sim.beat(Ok(offering("0.2.0")))), ["0.2.0"]);
        assert!(sim.core.upgrades().in_flight());
        assert!(starts(&sim.beat(Ok(offering("0.2.0")))).is_empty());
        assert!(starts(&sim.beat(Ok(offering("0.3.0")))).is_empty());
        let out = sim.send(Event::UpgradeDone(UpgradeEnd::Swapped));
        assert_eq!(out.last(), Some(&Action::Exit(EXIT_RESTART)));
        assert_eq!(sim.exited(), Some(EXIT_RESTART));
    }

    /// Whatever the platform says, an offer not newer than the agent's own is refused without
    /// a download, reported in every heartbeat until one carrying it is accepted, and not
    /// judged again while the process runs.
    #[test]
    fn an_offer_not_newer_is_refused_and_reported_until_accepted() {
        let mut sim = Sim::with_upgrade(up("0.2.0"));
        sim.send(Event::Start);
        let out = sim.beat(Ok(offering("0.1.0")));
        assert!(starts(&out).is_empty());
        let r = recorded(&out);
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].from.as_str(), r[0].to.as_str(), r[0].outcome),
            ("0.2.0", "0.1.0", UpgradeOutcome::Refused)
        );
        assert!(r[0].detail.contains("not newer"), "{}", r[0].detail);
        // Carried by the next heartbeat; a failed one does not deliver it.
        sim.tick();
        assert_eq!(sim.beat.as_ref().unwrap().upgrade.as_ref(), Some(&r[0]));
        let out = sim.finish(Err(CallError::Timeout));
        assert!(!out.contains(&Action::UpgradeReported));
        sim.tick();
        assert_eq!(sim.beat.as_ref().unwrap().upgrade.as_ref(), Some(&r[0]));
        let out = sim.finish(Ok(offering("0.1.0")));
        assert!(out.contains(&Action::UpgradeReported));
        assert!(starts(&out).is_empty() && recorded(&out).is_empty(), "refused once: not judged again");
        sim.tick();
        assert_eq!(sim.beat.as_ref().unwrap().upgrade, None);
        // Equal is not newer either.
        let out = sim.finish(Ok(offering("0.2.0")));
        assert_eq!(recorded(&out).iter().map(|r| r.outcome).collect::<Vec<_>>(), [UpgradeOutcome::Refused]);
        assert!(starts(&out).is_empty());
    }

    #[test]
    fn an_offered_version_too_long_to_be_one_is_ignored_not_reported() {
        let mut sim = Sim::with_upgrade(up("0.1.0"));
        sim.send(Event::Start);
        let out = sim.beat(Ok(offering(&format!("9.9.{}", "9".repeat(100)))));
        assert!(starts(&out).is_empty() && recorded(&out).is_empty());
    }

    #[test]
    fn with_auto_update_off_no_offer_is_taken() {
        let mut sim = Sim::with_upgrade(UpgradeStart { auto_update: false, ..up("0.1.0") });
        sim.send(Event::Start);
        for v in ["0.2.0", "0.0.1", "9.9.9"] {
            let out = sim.beat(Ok(offering(v)));
            assert!(starts(&out).is_empty() && recorded(&out).is_empty(), "{v}");
        }
    }

    /// A failed attempt (download, write) is retried after UPGRADE_RETRY, doubling; a refused
    /// one (verification) or a rolled-back one is never tried again by this process.
    #[test]
    fn failed_is_retried_after_a_backoff_refused_never() {
        let mut sim = Sim::with_upgrade(up("0.1.0"));
        sim.send(Event::Start);
        assert_eq!(starts(&sim.beat(Ok(offering("0.2.0")))), ["0.2.0"]);
        let out = sim.send(Event::UpgradeDone(UpgradeEnd::Ended(report("0.2.0", UpgradeOutcome::Failed))));
        assert_eq!(recorded(&out), [report("0.2.0", UpgradeOutcome::Failed)]);
        assert!(!sim.core.upgrades().in_flight());
        // Delivered with the next beat; offers wait for the retry time.
        sim.beat(Ok(offering("0.2.0")));
        assert!(starts(&sim.beat(Ok(offering("0.2.0")))).is_empty());
        sim.advance(UPGRADE_RETRY);
        assert_eq!(starts(&sim.beat(Ok(offering("0.2.0")))), ["0.2.0"]);
        sim.send(Event::UpgradeDone(UpgradeEnd::Ended(report("0.2.0", UpgradeOutcome::Failed))));
        sim.beat(Ok(answer(60, None, &[])));
        sim.advance(UPGRADE_RETRY);
        assert!(starts(&sim.beat(Ok(offering("0.2.0")))).is_empty(), "the second wait is twice as long");
        sim.advance(UPGRADE_RETRY);
        assert_eq!(starts(&sim.beat(Ok(offering("0.2.0")))), ["0.2.0"]);
        sim.send(Event::UpgradeDone(UpgradeEnd::Ended(report("0.2.0", UpgradeOutcome::Refused))));
        sim.beat(Ok(answer(60, None, &[])));
        sim.advance(UPGRADE_RETRY_MAX * 2);
        assert!(starts(&sim.beat(Ok(offering("0.2.0")))).is_empty());
        // Another version is judged on its own.
        assert_eq!(starts(&sim.beat(Ok(offering("0.3.0")))), ["0.3.0"]);
    }

    /// At start: a rolled-back version is never tried; an unreported result goes with the
    /// first heartbeat; a failure's wait carries over.
    #[test]
    fn what_upgrade_json_said_at_start_holds() {
        let r = report("0.2.0", UpgradeOutcome::RolledBack);
        let mut sim = Sim::with_upgrade(UpgradeStart {
            report: Some(r.clone()),
            never: vec!["0.2.0".into()],
            failed: Some(("0.3.0".into(), Duration::from_secs(600))),
            ..up("0.1.0")
        });
        sim.send(Event::Start);
        sim.tick();
        assert_eq!(sim.beat.as_ref().unwrap().upgrade.as_ref(), Some(&r));
        let out = sim.finish(Ok(offering("0.2.0")));
        assert!(out.contains(&Action::UpgradeReported));
        assert!(starts(&out).is_empty(), "rolled back: never again");
        assert!(starts(&sim.beat(Ok(offering("0.3.0")))).is_empty(), "failed a moment ago");
        sim.advance(Duration::from_secs(600));
        assert_eq!(starts(&sim.beat(Ok(offering("0.3.0")))), ["0.3.0"]);
    }

    /// The new binary of a pending upgrade confirms after its first *accepted* heartbeat, and
    /// reports Succeeded; no offer is taken before that report is delivered.
    #[test]
    fn a_new_binary_confirms_after_its_first_accepted_heartbeat() {
        let mut sim = Sim::with_upgrade(UpgradeStart {
            confirm: Some(("0.1.0".into(), "0.2.0".into())),
            ..up("0.2.0")
        });
        sim.send(Event::Start);
        let out = sim.beat(Err(CallError::Timeout));
        assert!(recorded(&out).is_empty(), "a failed heartbeat confirms nothing");
        let out = sim.beat(Ok(offering("0.3.0")));
        let confirmed: Vec<&Action> = out.iter().filter(|a| matches!(a, Action::ConfirmUpgrade(_))).collect();
        assert_eq!(confirmed.len(), 1);
        let Action::ConfirmUpgrade(r) = confirmed[0] else { unreachable!() };
        assert_eq!(
            (r.from.as_str(), r.to.as_str(), r.outcome),
            ("0.1.0", "0.2.0", UpgradeOutcome::Succeeded)
        );
        assert!(starts(&out).is_empty());
        sim.tick();
        assert_eq!(sim.beat.as_ref().unwrap().upgrade.as_ref(), Some(r));
        let out = sim.finish(Ok(offering("0.3.0")));
        assert!(out.contains(&Action::UpgradeReported));
        assert_eq!(starts(&out), ["0.3.0"]);
    }

    /// An offer in the answer that carries a `restart` is not taken: the agent is leaving.
    #[test]
    fn no_upgrade_starts_while_the_agent_restarts() {
        let mut sim = Sim::with_upgrade(up("0.1.0"));
        sim.send(Event::Start);
        let a = HeartbeatResponse {
            upgrade: Some(UpgradeOffer { version: "0.2.0".into() }),
            ..answer(60, None, &[("r1".into(), "restart")])
        };
        assert!(starts(&sim.beat(Ok(a))).is_empty());
    }

    /// The platform's offers, the heartbeats' fates and the attempts' ends in any order.
    #[derive(Debug, Clone)]
    enum Step {
        Beat { offer: Option<usize>, ok: bool },
        End(bool),
        Wait(u64),
    }

    const VERSIONS: [&str; 5] = ["0.0.9", "0.1.0", "0.1.1", "0.2.0", "1.0.0-rc.1"];

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                4 => (prop::option::of(0..VERSIONS.len()), any::<bool>()).prop_map(|(offer, ok)| Step::Beat { offer, ok }),
                1 => any::<bool>().prop_map(Step::End),
                1 => (0u64..8000).prop_map(Step::Wait),
            ],
            1..60,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Whatever the platform offers and whatever fails: at most one upgrade at a time,
        /// only of a version strictly newer than the agent's own, never of one refused before,
        /// never with auto_update off; and each result is carried by every heartbeat until one
        /// carrying it is accepted, then by none.
        #[test]
        fn the_upgrade_rule_holds_whatever_happens(steps in steps(), auto in any::<bool>()) {
            let own = "0.1.0";
            let mut sim = Sim::with_upgrade(UpgradeStart { auto_update: auto, ..up(own) });
            sim.send(Event::Start);
            let newer = |v: &str| gpum_repo_keys::release::check_newer(v, own).is_ok();
            let mut in_flight: Option<String> = None;
            let mut refused: HashSet<String> = HashSet::new();
            let mut owed: Option<UpgradeReport> = None;
            for step in steps {
                match step {
                    Step::Beat { offer, ok } => {
                        sim.tick();
                        let carried = sim.beat.as_ref().unwrap().upgrade.clone();
                        prop_assert_eq!(&carried, &owed);
                        let answer = match offer {
                            Some(i) => offering(VERSIONS[i]),
                            None => answer(60, None, &[]),
                        };
                        let out = sim.finish(if ok { Ok(answer) } else { Err(CallError::Timeout) });
                        if ok && carried.is_some() {
                            prop_assert!(out.contains(&Action::UpgradeReported));
                            owed = None;
                        }
                        for v in starts(&out) {
                            prop_assert!(auto);
                            prop_assert!(in_flight.is_none(), "two upgrades at once");
                            prop_assert!(newer(&v), "{} is not newer", v);
                            prop_assert!(!refused.contains(&v), "{} was refused before", v);
                            in_flight = Some(v);
                        }
                        for r in recorded(&out) {
                            prop_assert_eq!(r.outcome, UpgradeOutcome::Refused);
                            prop_assert!(!newer(&r.to));
                            refused.insert(r.to.clone());
                            owed = Some(r);
                        }
                    }
                    Step::End(refuse) => {
                        if let Some(v) = in_flight.take() {
                            let outcome = if refuse { UpgradeOutcome::Refused } else { UpgradeOutcome::Failed };
                            let r = UpgradeReport { from: own.into(), to: v.clone(), outcome, detail: String::new(), at: 0 };
                            let out = sim.send(Event::UpgradeDone(UpgradeEnd::Ended(r.clone())));
                            prop_assert_eq!(recorded(&out), vec![r.clone()]);
                            if refuse {
                                refused.insert(v);
                            }
                            owed = Some(r);
                        }
                    }
                    Step::Wait(secs) => sim.advance(Duration::from_secs(secs)),
                }
            }
        }
    }
}
