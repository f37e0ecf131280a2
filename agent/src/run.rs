//! `gpum-agent run`: the service's life, as one event loop.
//!
//! Lifecycle: load the config (missing or invalid: record "configuration error", exit 78) ->
//! connect to Docker (down is a state, not an error) -> remove probe containers a crash left ->
//! loop -> exit code. Every input is an [`Event`] and one `select!` picks the next one:
//! the heartbeat timer, the heartbeat step finishing, a probe finishing, a removal finishing,
//! and SIGTERM/SIGINT.
//!
//! A heartbeat *step* runs as its own task: list the managed containers, gather inventory and
//! metrics, POST the heartbeat. The loop applies its answer: interval, commands, the known
//! containers (to the reconciler), the probe image. Failures go through
//! [`crate::client::classify`] (whether) and [`crate::backoff::Backoff`] (how); only a
//! revocation ends the loop, with exit 78 and the reason in `state.json`. The agent logs state
//! transitions (connected -> unreachable -> connected), not every failure.
//!
//! Exit codes: 0 after SIGTERM/SIGINT (the step in flight is given [`STOP_GRACE`] to finish; a
//! second signal quits at once), [`EXIT_RESTART`] after a `restart` command (the unit has
//! `Restart=always`, so systemd starts it again), 78 when revoked or misconfigured (the unit has
//! `RestartPreventExitStatus=78`).
//!
//! The agent never removes anything when it stops for good: containers stay, as the owner's
//! guide says.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpum_common::agent_state::{AgentState, Connection, StopReason, Stopped};
use gpum_common::exit;
use gpum_host::{Host, env};
use gpum_protocol::{
    CommandKind, CommandResult, DEFAULT_HEARTBEAT_INTERVAL_SECS, ErrorCode, Health, HeartbeatRequest,
    HeartbeatResponse, ProbeFailure, ProbeReport, RemovedContainer, VerificationState, limits,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio::time::sleep_until;
use tracing::{debug, error, info, trace, warn};

use crate::backoff::{Backoff, jittered};
use crate::client::{
    Answer, CallError, Platform, REQUEST_TIMEOUT, Verdict, classify, clock_skew, is_refused_body,
};
use crate::config::{Config, Paths};
use crate::docker::ledger::{self, ProbeImages, ProbeLedger};
use crate::docker::{Docker, DockerError, probe, reconcile, watch};
use crate::inventory::Gatherer;
use crate::outbox::{Answered, Batch, Outbox, Refusal};
use crate::secret::Token;

/// Exit code after a `restart` command: neither 0 (a clean stop) nor 78 (stopped for good), so
/// it is visible in `systemctl status`; `Restart=always` restarts on it.
pub const EXIT_RESTART: i32 = gpum_common::exit::RESTART;
/// How long a step in flight may run after SIGTERM before the agent exits anyway. Well below
/// systemd's default 90 s and the 10 s the owner's guide promises.
pub const STOP_GRACE: Duration = Duration::from_secs(8);
/// The longest a Docker call inside a heartbeat step may take; a hung engine must not hold up
/// heartbeats.
pub const DOCKER_STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest command id the agent answers (the platform's own ids are short).
const MAX_COMMAND_ID_LEN: usize = 128;
/// Interval bounds, whatever the platform says.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Even when nothing changes, `state.json` is rewritten this often, so `status` shows a recent
/// last heartbeat without a disk write per heartbeat.
const STATE_REFRESH: Duration = Duration::from_secs(30);
/// The most `recheck` commands waiting for a rate-limited probe; one more is answered at once
/// (the probe is due anyway), so that a platform cannot grow the list.
const MAX_WAITING_RECHECKS: usize = limits::MAX_COMMANDS_PER_RESPONSE;

/// The Docker socket: the config's, else `DOCKER_HOST` when it is a `unix://` URL, else the
/// default.
pub fn docker_socket(host: &dyn Host, configured: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = configured {
        return Some(p.to_path_buf());
    }
    env::docker_host_socket(host).and_then(Result::ok)
}

/// The engine's version, or `None` when it does not answer within [`DOCKER_STEP_TIMEOUT`].
pub async fn docker_version(host: &dyn Host, configured: Option<&Path>) -> Option<String> {
    let d = Docker::connect(docker_socket(host, configured).as_deref()).ok()?;
    tokio::time::timeout(DOCKER_STEP_TIMEOUT, d.version()).await.ok()?.ok()
}

/// Every input of the loop.
enum Event {
    /// Time for a heartbeat.
    Tick,
    /// The heartbeat step finished.
    Step(Box<StepOutput>),
    /// A probe finished.
    Probe(Box<ProbeDone>),
    /// A probe the rate limit held back may start now.
    ProbeDue,
    /// A removal round finished.
    Removed(Vec<RemovedContainer>),
    /// SIGTERM or SIGINT.
    Signal(&'static str),
    /// The grace after a signal ran out.
    StopDeadline,
}

/// What a probe task brings back: its report, and the probe images after it (`None` when it
/// could not reach the engine).
struct ProbeDone {
    report: ProbeReport,
    images: Option<ProbeImages>,
}

/// What a heartbeat step takes with it.
struct StepInput {
    platform: Platform,
    token: Token,
    docker: Option<Arc<Docker>>,
    gatherer: Box<Gatherer>,
    req: HeartbeatRequest,
    accepted_hash: Option<String>,
    /// The engine's version as last asked, and whether to ask again in this step.
    docker_version: Option<String>,
    refresh_docker_version: bool,
    /// The managed containers as last listed, when nothing can have changed since (see
    /// [`watch`]); `None` lists them again.
    unchanged: Option<Vec<reconcile::ManagedContainer>>,
}

/// What it brings back. The gatherer travels back to the loop, and so does the request, so
/// that on failure its pending results are sent again.
struct StepOutput {
    gatherer: Box<Gatherer>,
    req: HeartbeatRequest,
    probe_key: String,
    managed: Vec<reconcile::ManagedContainer>,
    /// Whether `managed` was listed in this step (not reused).
    listed: bool,
    docker_version: Option<String>,
    result: Result<Answer<HeartbeatResponse>, CallError>,
}

///
/// The futures of the Docker and HTTP calls are large (kilobytes each); they are boxed here, so
/// that this step's own future stays small and is not copied whole on every spawn and poll,
/// and the output is boxed for the same reason (it was a third of the agent's instructions per
/// heartbeat, in `memcpy`; see `cargo xtask bench agent`).
async fn step(mut s: StepInput) -> Box<StepOutput> {
    let mut docker_version = s.docker_version.take();
    let mut managed = Vec::new();
    let listed_now = s.unchanged.is_none();
    match &s.docker {
        Some(d) => {
            let listed = match s.unchanged.take() {
                Some(list) => Ok(Ok(list)),
                None => tokio::time::timeout(DOCKER_STEP_TIMEOUT, Box::pin(reconcile::list_managed(d))).await,
            };
            match listed {
                Ok(Ok(list)) => {
                    managed = list;
                    s.req.health.docker_ok = true;
                    if s.refresh_docker_version || docker_version.is_none() {
                        docker_version = tokio::time::timeout(DOCKER_STEP_TIMEOUT, Box::pin(d.version()))
                            .await
                            .ok()
                            .and_then(Result::ok);
                    }
                }
                Ok(Err(e)) => s.req.health.docker_error = Some(e.to_string()),
                Err(_) => s.req.health.docker_error = Some("the Docker engine did not answer in time".into()),
            }
        }
        None => {
            s.req.health.docker_error.get_or_insert_with(|| "Docker is not available".into());
        }
    }
    if !s.req.health.docker_ok {
        docker_version = None;
    }
    // Metrics first: they refresh the RAM figures the inventory reads.
    s.req.metrics = s.gatherer.metrics();
    let mut inv = s.gatherer.inventory(docker_version.clone());
    inv.public.gpus.truncate(limits::MAX_GPUS);
    inv.private.gpu_uuids.truncate(limits::MAX_GPUS);
    s.req.health.nvml = s.gatherer.nvml_state();
    // The hash and the probe key are worked out again only when the inventory changed.
    let (hash, probe_key) = s.gatherer.digest(&inv);
    s.req.inventory_hash = hash;
    if s.accepted_hash.as_deref() != Some(s.req.inventory_hash.as_str()) {
        s.req.inventory = Some(inv);
    }
    // Within the protocol's limits, whatever this machine holds.
    s.req.managed_containers =
        managed.iter().take(limits::MAX_MANAGED_CONTAINERS).map(|c| c.id.clone()).collect();
    s.req.metrics.gpus.truncate(limits::MAX_GPUS);
    let m = &s.req.metrics;
    trace!(
        cpu_pct = m.cpu_load_pct,
        ram_used_mib = m.ram_used_mib,
        disk_free_gib = m.disk_free_gib,
        gpus = m.gpus.len(),
        "metrics"
    );
    trace!(hash = %s.req.inventory_hash, resent = s.req.inventory.is_some(), "inventory");
    trace!(
        docker_ok = s.req.health.docker_ok,
        managed = managed.len(),
        listed = listed_now,
        "managed containers"
    );
    let result = s.platform.heartbeat(&s.token, &s.req).await;
    let listed = listed_now && s.req.health.docker_ok;
    Box::new(StepOutput {
        gatherer: s.gatherer,
        req: s.req,
        probe_key,
        managed,
        listed,
        docker_version,
        result,
    })
}

/// The loop's state.
struct Agent {
    host: Arc<dyn Host>,
    state_dir: PathBuf,
    cfg: Config,
    platform: Platform,
    docker_socket: Option<PathBuf>,
    docker: Option<Arc<Docker>>,
    docker_error: Option<String>,
    docker_version: Option<String>,
    /// The engine's event stream for the managed containers, and their last good list with
    /// when it was taken: a heartbeat reuses the list while the stream reports no change.
    watch: Option<watch::Watch>,
    listed: Option<(Vec<reconcile::ManagedContainer>, Instant)>,
    gatherer: Option<Box<Gatherer>>,
    state: AgentState,
    last_written: Option<(AgentState, Instant)>,
    rng: StdRng,
    seq: u64,
    interval: Duration,
    backoff: Backoff,
    accepted_hash: Option<String>,
    /// The probe-relevant facts of the last answered step, and those the last probe ran on.
    probe_key: Option<String>,
    probed_key: Option<String>,
    probe_image: Option<String>,
    probed_image: Option<String>,
    probe_wanted: bool,
    probe_running: bool,
    /// When probes started and which images the agent pulled (`probes.json`), and the least
    /// time between two starts ([`ledger::MIN_GAP`]).
    ledger: ProbeLedger,
    probe_gap: Duration,
    /// When a probe the rate limit held back may start.
    probe_at: Option<tokio::time::Instant>,
    /// The `recheck` commands answered when the next probe starts.
    rechecks: Vec<String>,
    /// Results waiting for an answered heartbeat, sent within the protocol's limits.
    outbox: Outbox,
    /// The commands already answered (kept in `commands.json`).
    answered: Answered,
    /// Whether the last answer's known list was as long as the platform may send (so possibly
    /// cut): the reconciler then removes nothing.
    known_truncated: bool,
    reconciler: reconcile::Reconciler,
    skew: Option<i64>,
    /// A `restart` command arrived; it is acknowledged with one more heartbeat, then the agent
    /// exits with [`EXIT_RESTART`].
    restart_requested: bool,
}

/// Runs the service until it stops; returns the exit code.
pub async fn run(host: Arc<dyn Host>, paths: &Paths) -> i32 {
    let cfg = match Config::load(host.as_ref(), &paths.config) {
        Ok(c) => c,
        Err(e) => return stop_config(host.as_ref(), &paths.state_dir, None, e.to_string()),
    };
    let roots = match cfg.extra_roots(host.as_ref()) {
        Ok(r) => r,
        Err(e) => return stop_config(host.as_ref(), &paths.state_dir, Some(&cfg), e.to_string()),
    };
    let platform = match Platform::new(&cfg.server, roots, REQUEST_TIMEOUT) {
        Ok(p) => p,
        Err(e) => return stop_config(host.as_ref(), &paths.state_dir, Some(&cfg), e.to_string()),
    };
    let mut agent = Agent::new(host, paths.state_dir.clone(), cfg, platform);
    agent.main_loop().await
}

/// Records a configuration error and returns 78.
fn stop_config(host: &dyn Host, state_dir: &Path, cfg: Option<&Config>, detail: String) -> i32 {
    error!(error = %detail, "configuration error; the agent stops and systemd leaves it stopped");
    let mut st = crate::state::read(host, state_dir).ok().flatten().unwrap_or_default();
    if let Some(c) = cfg {
        st.node_id = Some(c.node_id.clone());
        st.server = Some(c.server.clone());
    }
    st.connection = Connection::Stopped;
    st.stopped =
        Some(Stopped { reason: StopReason::ConfigError, detail, at: crate::state::unix(host.now()) });
    if let Err(e) = crate::state::write(host, state_dir, &mut st) {
        warn!(error = %e, "could not record the stop in the state directory");
    }
    exit::STOPPED_FOR_GOOD
}

impl Agent {
    fn new(host: Arc<dyn Host>, state_dir: PathBuf, cfg: Config, platform: Platform) -> Agent {
        let interval = Duration::from_secs(DEFAULT_HEARTBEAT_INTERVAL_SECS);
        let docker_socket = docker_socket(host.as_ref(), cfg.docker_socket.as_deref());
        let state = AgentState {
            node_id: Some(cfg.node_id.clone()),
            server: Some(cfg.server.clone()),
            connection: Connection::Connecting,
            verification: Some(verification_text(VerificationState::AwaitingCheck).into()),
            ..Default::default()
        };
        let reconciler = reconcile::Reconciler::new(
            reconcile::MIN_BEATS,
            cfg.test_reconcile_min_age.unwrap_or(reconcile::MIN_AGE),
        );
        let answered = Answered::load(host.as_ref(), &state_dir);
        let ledger = ProbeLedger::load(host.as_ref(), &state_dir);
        // TEST ONLY: a shorter gap between probes, so that an end-to-end test can watch a
        // held-back probe run (`test-knobs` builds; the hourly cap stays).
        #[cfg(feature = "test-knobs")]
        let probe_gap = host
            .env(env::GPUM_TEST_PROBE_GAP_SECS)
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(ledger::MIN_GAP, Duration::from_secs);
        #[cfg(not(feature = "test-knobs"))]
        let probe_gap = ledger::MIN_GAP;
        Agent {
            gatherer: Some(Box::new(Gatherer::new(host.clone()))),
            host,
            state_dir,
            cfg,
            platform,
            docker_socket,
            docker: None,
            docker_error: None,
            docker_version: None,
            watch: None,
            listed: None,
            state,
            last_written: None,
            rng: StdRng::from_entropy(),
            seq: 0,
            interval,
            backoff: Backoff::for_interval(interval),
            accepted_hash: None,
            probe_key: None,
            probed_key: None,
            probe_image: None,
            probed_image: None,
            probe_wanted: true,
            probe_running: false,
            ledger,
            probe_gap,
            probe_at: None,
            rechecks: Vec::new(),
            outbox: Outbox::default(),
            answered,
            known_truncated: false,
            reconciler,
            skew: None,
            restart_requested: false,
        }
    }

    fn connect_docker(&mut self) {
        if self.docker.is_some() {
            return;
        }
        let connected = Docker::connect(self.docker_socket.as_deref());
        // The test scope exists only in a `test-knobs` build (see `config::Config`).
        #[cfg(feature = "test-knobs")]
        let connected = connected.map(|d| match &self.cfg.test_docker_scope {
            Some((k, v)) => d.with_test_scope(k, v),
            None => d,
        });
        match connected {
            Ok(d) => {
                let d = Arc::new(d);
                self.watch = Some(watch::Watch::start(d.clone()));
                self.docker = Some(d);
                self.docker_error = None;
            }
            Err(e) => {
                if self.docker_error.is_none() {
                    warn!(error = %e, "Docker is not available; the agent keeps running and reports it");
                }
                self.docker_error = Some(e.to_string());
            }
        }
    }

    async fn main_loop(&mut self) -> i32 {
        let mut signals = match signals() {
            Ok(rx) => rx,
            Err(e) => {
                error!(error = %e, "cannot install signal handlers");
                return exit::OTHER;
            }
        };
        info!(node_id = %self.cfg.node_id, server = %self.cfg.server, version = env!("CARGO_PKG_VERSION"), "agent started");
        self.connect_docker();
        if let Some(d) = self.docker.clone() {
            // A probe container left by a crash mid-probe goes first, before anything new starts.
            tokio::spawn(async move {
                if let Err(e) = probe::cleanup_leftovers(&d).await {
                    debug!(error = %e, "could not look for leftover probe containers");
                }
            });
        }
        self.write_state(true);

        // The tasks in flight are locals, one variable each, so that each `select!` branch
        // borrows only its own.
        // The heartbeat in flight is polled here, in the loop's own task, rather than spawned:
        // a spawned task cost an allocation, a queue and a wake-up of this task each beat. A
        // panic in it ends the agent (release builds abort on panic anyway), and systemd
        // restarts it.
        let mut step_task: Option<std::pin::Pin<Box<dyn Future<Output = Box<StepOutput>> + Send>>> = None;
        let mut probe_task: Option<JoinHandle<ProbeDone>> = None;
        let mut removal_task: Option<JoinHandle<Vec<RemovedContainer>>> = None;
        // The heartbeat's own clock: one wake-up per beat (see `alarm`).
        let alarm = crate::alarm::Alarm::new();
        let mut next_beat = tokio::time::Instant::now();
        let mut stop_deadline: Option<tokio::time::Instant> = None;
        let mut restart = Restart::No;

        loop {
            let probe_at = self.probe_at;
            let ev = tokio::select! {
                biased;
                Some(name) = signals.recv() => Event::Signal(name),
                _ = sleep_until(stop_deadline.unwrap_or(next_beat)), if stop_deadline.is_some() => Event::StopDeadline,
                out = poll_step(&mut step_task), if step_task.is_some() => {
                    step_task = None;
                    Event::Step(out)
                }
                r = join(&mut probe_task), if probe_task.is_some() => {
                    probe_task = None;
                    self.probe_running = false;
                    match r {
                        Ok(done) => Event::Probe(Box::new(done)),
                        Err(e) => { error!(error = %e, "probe task failed"); continue; }
                    }
                }
                _ = until(probe_at), if probe_at.is_some() && probe_task.is_none() && stop_deadline.is_none() => {
                    Event::ProbeDue
                }
                r = join(&mut removal_task), if removal_task.is_some() => {
                    removal_task = None;
                    Event::Removed(r.unwrap_or_default())
                }
                _ = alarm.until(next_beat), if step_task.is_none() && stop_deadline.is_none() => Event::Tick,
            };

            match ev {
                Event::Signal(name) => {
                    if stop_deadline.is_some() {
                        info!(signal = name, "second signal; quitting now");
                        return exit::OK;
                    }
                    info!(signal = name, "stopping: finishing the current step");
                    // A probe killed here leaves a container that `cleanup_leftovers` removes at
                    // the next start; a removal killed here is retried by the reconciler.
                    abort(&mut probe_task);
                    abort(&mut removal_task);
                    if step_task.is_none() {
                        return exit::OK;
                    }
                    stop_deadline = Some(tokio::time::Instant::now() + STOP_GRACE);
                }
                Event::StopDeadline => {
                    warn!("the heartbeat in flight did not finish in time; exiting anyway");
                    return exit::OK;
                }
                Event::Tick => {
                    self.connect_docker();
                    step_task = Some(Box::pin(step(self.step_input())));
                }
                Event::Step(out) => {
                    let (delay, doomed) = match self.on_step(out) {
                        Ok(x) => x,
                        Err(code) => {
                            abort(&mut probe_task);
                            abort(&mut removal_task);
                            return code;
                        }
                    };
                    if stop_deadline.is_some() {
                        return exit::OK;
                    }
                    match restart {
                        // The acknowledgement went out (or could not): exit, systemd restarts.
                        Restart::Acking => {
                            info!("restarting on the platform's command");
                            return EXIT_RESTART;
                        }
                        Restart::No if self.restart_requested => {
                            restart = Restart::Acking;
                            next_beat = tokio::time::Instant::now();
                            continue;
                        }
                        Restart::No => {}
                    }
                    next_beat = tokio::time::Instant::now() + delay;
                    if removal_task.is_none()
                        && !doomed.is_empty()
                        && let Some(d) = self.docker.clone()
                    {
                        removal_task = Some(tokio::spawn(remove_all(d, doomed)));
                    }
                    if probe_task.is_none() {
                        probe_task = self.maybe_start_probe();
                    }
                }
                Event::ProbeDue => {
                    self.probe_at = None;
                    probe_task = self.maybe_start_probe();
                }
                Event::Probe(done) => {
                    let ProbeDone { report: rep, images } = *done;
                    if let Some(images) = images
                        && images != self.ledger.images
                    {
                        self.ledger.images = images;
                        self.save_ledger();
                    }
                    info!(state = ?rep.state, reason = ?rep.reason, "GPU probe finished");
                    self.state.verification = Some(verification_text(rep.state).into());
                    self.outbox.set_probe(rep);
                    self.write_state(false);
                    // Report it soon rather than a whole interval later.
                    next_beat = next_beat.min(tokio::time::Instant::now() + Duration::from_millis(200));
                }
                Event::Removed(list) => {
                    // The agent changed the set itself: list again at the next heartbeat rather
                    // than rely on the engine's events arriving first.
                    if let Some(w) = &self.watch {
                        w.set_stale();
                    }
                    self.outbox.push_removed(list)
                }
            }
        }
    }

    fn step_input(&mut self) -> StepInput {
        self.seq += 1;
        let batch = self.outbox.take();
        let req = HeartbeatRequest {
            seq: self.seq,
            probe: batch.probe,
            removed_containers: batch.removed,
            command_results: batch.results,
            health: Health {
                docker_ok: false,
                docker_error: if self.docker.is_none() { self.docker_error.clone() } else { None },
                clock_skew_secs: self.skew,
                ..Default::default()
            },
            ..Default::default()
        };
        // The engine's version changes only with an upgrade, which restarts the engine (the
        // listing fails, so the cache is dropped); asking every few minutes catches the rest.
        let refresh_docker_version = self.seq.is_multiple_of(crate::inventory::SLOW_FACTS_EVERY);
        // The stale mark is cleared before the list is taken, so a change during the list marks
        // it again for the next heartbeat.
        let stale = self.watch.as_ref().is_none_or(watch::Watch::take_stale);
        let unchanged = match &self.listed {
            Some((list, at)) if !stale && at.elapsed() < watch::LIST_AT_LEAST_EVERY => Some(list.clone()),
            _ => None,
        };
        StepInput {
            unchanged,
            docker_version: self.docker_version.clone(),
            refresh_docker_version,
            platform: self.platform.clone(),
            token: self.cfg.token.clone(),
            docker: self.docker.clone(),
            gatherer: self.gatherer.take().expect("the gatherer is home between steps"),
            req,
            accepted_hash: self.accepted_hash.clone(),
        }
    }

    /// Applies a finished step: `Ok((delay until the next heartbeat, containers to remove))`, or
    /// `Err(exit code)` when the agent stops for good.
    fn on_step(
        &mut self,
        mut out: Box<StepOutput>,
    ) -> Result<(Duration, Vec<reconcile::ManagedContainer>), i32> {
        self.gatherer = Some(out.gatherer);
        self.docker_version = out.docker_version.take();
        let now = self.host.now();
        let docker_ok = out.req.health.docker_ok;
        // Log transitions only; a missing socket was already logged when connecting failed.
        let logged_before = self.state.docker_ok.is_some() || self.docker.is_some();
        if logged_before && Some(docker_ok) != self.state.docker_ok {
            match &out.req.health.docker_error {
                None => info!("Docker engine answers"),
                Some(e) => {
                    warn!(error = %e, "Docker engine does not answer; the agent keeps running and reports it")
                }
            }
        }
        self.state.docker_ok = Some(docker_ok);
        if out.listed {
            self.listed = Some((out.managed.clone(), Instant::now()));
        } else if !docker_ok {
            self.listed = None;
            if let Some(w) = &self.watch {
                w.set_stale();
            }
        }
        match out.result {
            Ok(ans) => {
                if self.state.connection != Connection::Connected {
                    if self.backoff.failures() > 0 {
                        info!(failed_attempts = self.backoff.failures(), "platform reachable again");
                    } else {
                        info!("connected to the platform");
                    }
                }
                self.backoff.reset();
                let resp = ans.body;
                let skew = clock_skew(now, ans.server_date);
                if skew.is_some() && self.skew.is_none() {
                    warn!(skew_secs = skew, "this machine's clock differs from the platform's; reporting it");
                }
                self.skew = skew;
                if out.req.inventory.is_some() {
                    if self.accepted_hash.is_some() {
                        info!("inventory changed; sent it in full");
                    }
                    self.accepted_hash = Some(out.req.inventory_hash.clone());
                }
                // Only what this heartbeat carried is delivered; a probe that finished while it
                // was in flight is still pending.
                self.outbox.delivered(&carried(&mut out.req));
                if self.probe_key.as_deref() != Some(out.probe_key.as_str()) {
                    if self.probe_key.is_some() {
                        info!("hardware or software changed; the GPU probe runs again");
                    }
                    self.probe_key = Some(out.probe_key.clone());
                }
                let doomed = self.apply_answer(&resp, &out.managed);
                self.state.connection = Connection::Connected;
                self.state.last_heartbeat_at = Some(crate::state::unix(now));
                self.state.last_error = None;
                self.state.clock_skew_secs = self.skew;
                self.write_state(false);
                debug!(seq = out.req.seq, bytes = ans.sent_bytes, "heartbeat answered");
                Ok((jittered(self.interval, &mut self.rng), doomed))
            }
            Err(e) => {
                let batch = carried(&mut out.req);
                if let Verdict::StopForGood(code) = classify(&e) {
                    return Err(self.stop_revoked(code, &e));
                }
                if is_refused_body(&e) {
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
                self.state.connection = Connection::Unreachable;
                self.state.last_error = Some(e.to_string());
                self.write_state(false);
                Ok((delay, Vec::new()))
            }
        }
    }

    /// Applies the platform's answer; returns the managed containers to remove now.
    fn apply_answer(
        &mut self,
        resp: &HeartbeatResponse,
        managed: &[reconcile::ManagedContainer],
    ) -> Vec<reconcile::ManagedContainer> {
        let secs = if resp.heartbeat_interval_secs == 0 {
            DEFAULT_HEARTBEAT_INTERVAL_SECS
        } else {
            resp.heartbeat_interval_secs
        };
        let interval = Duration::from_secs(secs).clamp(MIN_INTERVAL, MAX_INTERVAL);
        if interval != self.interval {
            info!(secs = interval.as_secs(), "heartbeat interval set by the platform");
            self.interval = interval;
            self.backoff.set_cap(interval);
        }
        if resp.probe_image != self.probe_image {
            match &resp.probe_image {
                Some(img) => info!(image = %img, "probe image set by the platform"),
                None => info!("no probe image: the GPU check waits («Ожидает проверки»)"),
            }
            self.probe_image = resp.probe_image.clone();
        }
        if self.probe_image.is_none() && !self.probe_running {
            self.state.verification = Some(verification_text(VerificationState::AwaitingCheck).into());
        }
        // At most one answer's worth of new commands is taken; the rest, still unanswered, come
        // again. Commands already answered are skipped first, so that a platform that hands
        // them over again cannot hide the new ones behind them.
        let mut newly: Vec<String> = Vec::new();
        let mut left = 0usize;
        for c in &resp.commands {
            // Answered once, never run or answered again (a still undelivered answer stays queued).
            if self.answered.contains(&c.id) || newly.contains(&c.id) || self.outbox.has_result(&c.id) {
                debug!(id = %c.id, "command already answered");
                continue;
            }
            if c.id.is_empty() || c.id.len() > MAX_COMMAND_ID_LEN {
                warn!(len = c.id.len(), "ignored a command whose id is empty or too long to answer");
                continue;
            }
            if newly.len() >= limits::MAX_COMMANDS_PER_RESPONSE {
                left += 1;
                continue;
            }
            newly.push(c.id.clone());
            let result = match CommandKind::parse(&c.kind) {
                Some(CommandKind::Recheck) => {
                    info!(id = %c.id, "command recheck: the GPU probe runs again, within the rate limit");
                    self.probe_wanted = true;
                    let answer =
                        |msg: &str| Some(CommandResult { id: c.id.clone(), ok: true, message: msg.into() });
                    if self.probe_image.is_none() {
                        answer("no probe image is set; the check waits for one")
                    } else if self.rechecks.len() < MAX_WAITING_RECHECKS {
                        // Answered when the probe starts, which the rate limit may hold back.
                        self.rechecks.push(c.id.clone());
                        None
                    } else {
                        answer("a probe is due already; it runs when the rate limit allows")
                    }
                }
                Some(CommandKind::Restart) => {
                    info!(id = %c.id, "command restart: exiting so that systemd starts the agent again");
                    self.restart_requested = true;
                    Some(CommandResult { id: c.id.clone(), ok: true, message: "restarting".into() })
                }
                None => {
                    let kind = crate::client::truncate(&c.kind, 64);
                    warn!(id = %c.id, kind = %kind, "refused an unknown command");
                    Some(CommandResult {
                        id: c.id.clone(),
                        ok: false,
                        message: format!("unknown command {kind:?}: refused"),
                    })
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
        if let Err(e) = self.answered.record(self.host.as_ref(), newly) {
            warn!(error = %e, "could not record the answered commands");
        }
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
        if self.docker.is_some() && self.state.docker_ok == Some(true) {
            let known: HashSet<String> = resp.known_containers.iter().cloned().collect();
            return self.reconciler.decide(managed, &known, Instant::now());
        }
        Vec::new()
    }

    /// Starts the GPU probe when one is due: after the first answered heartbeat, after a change
    /// of the probe-relevant facts or of the image, or on `recheck`, within the rate limit
    /// ([`ledger`]: a probe due inside the window sets [`Agent::probe_at`] and starts then).
    /// Without an image no probe runs (awaiting check); without Docker it waits for Docker. The
    /// waiting `recheck` commands are answered when the probe starts.
    fn maybe_start_probe(&mut self) -> Option<JoinHandle<ProbeDone>> {
        let Some(image) = self.probe_image.clone() else {
            self.probe_at = None;
            self.answer_rechecks("no probe image is set; the check waits for one");
            return None;
        };
        if self.probe_running {
            return None;
        }
        let changed =
            self.probe_key != self.probed_key || self.probed_image.as_deref() != Some(image.as_str());
        if !(self.probe_wanted || changed) {
            return None;
        }
        let now = crate::state::unix(self.host.now());
        if let Some(at) = self.ledger.next_start(now, self.probe_gap) {
            let wait = Duration::from_secs(at.saturating_sub(now));
            if self.probe_at.is_none() {
                info!(
                    in_secs = wait.as_secs(),
                    gap_secs = self.probe_gap.as_secs(),
                    per_hour = ledger::MAX_PER_HOUR,
                    "a GPU probe is due; it waits for the rate limit"
                );
            }
            self.probe_at = Some(tokio::time::Instant::now() + wait);
            return None;
        }
        self.probe_at = None;
        self.ledger.started(now);
        self.save_ledger();
        self.answer_rechecks("probe started");
        self.probe_wanted = false;
        self.probed_key = self.probe_key.clone();
        self.probed_image = Some(image.clone());
        self.probe_running = true;
        info!(image = %image, "running the GPU probe");
        let docker = self.docker.clone();
        let registries = self.cfg.probe_registries.clone();
        let socket_error = self.docker_error.clone();
        let mut images = self.ledger.images.clone();
        Some(tokio::spawn(async move {
            match docker {
                Some(d) => {
                    let spec =
                        probe::ProbeSpec::new(&image, probe::DEFAULT_TIMEOUT).with_registries(&registries);
                    let out = ledger::probe_and_tidy(&d, &spec, &mut images).await;
                    ProbeDone { report: out.report, images: Some(images) }
                }
                // Without an engine the GPU cannot be shown to work in a container: that is the
                // honest result. When Docker comes back its version changes the probe-relevant
                // facts, and the probe runs again.
                None => ProbeDone {
                    report: ProbeReport {
                        state: VerificationState::Failed,
                        reason: Some(ProbeFailure::DockerUnavailable),
                        output: socket_error.unwrap_or_else(|| "Docker is not available".into()),
                        finished_at: now,
                        image,
                    },
                    images: None,
                },
            }
        }))
    }

    /// Answers every waiting `recheck` with `message`.
    fn answer_rechecks(&mut self, message: &str) {
        for id in std::mem::take(&mut self.rechecks) {
            self.outbox.push_result(CommandResult { id, ok: true, message: message.into() });
        }
    }

    fn save_ledger(&mut self) {
        if let Err(e) = self.ledger.save(self.host.as_ref(), &self.state_dir) {
            warn!(error = %e, dir = %self.state_dir.display(), "could not write the probe ledger");
        }
    }

    fn stop_revoked(&mut self, code: ErrorCode, e: &CallError) -> i32 {
        error!(code = ?code, error = %e, "the platform revoked this node (server deleted or token replaced); stopping for good. Containers are left in place");
        self.state.connection = Connection::Stopped;
        self.state.stopped = Some(Stopped {
            reason: StopReason::Revoked,
            detail: serde_json::to_value(code)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            at: crate::state::unix(self.host.now()),
        });
        self.write_state(true);
        exit::STOPPED_FOR_GOOD
    }

    /// Writes `state.json` when it changed, or when the last write is older than
    /// [`STATE_REFRESH`]; `force` writes regardless.
    fn write_state(&mut self, force: bool) {
        let due = match &self.last_written {
            None => true,
            Some((prev, at)) => at.elapsed() >= STATE_REFRESH || !same_but_times(prev, &self.state),
        };
        if !(force || due) {
            return;
        }
        match crate::state::write(self.host.as_ref(), &self.state_dir, &mut self.state) {
            Ok(()) => self.last_written = Some((self.state.clone(), Instant::now())),
            Err(e) => warn!(error = %e, dir = %self.state_dir.display(), "could not write the state file"),
        }
    }
}

/// Moves what a heartbeat request carried from the outbox back out of it.
fn carried(req: &mut HeartbeatRequest) -> Batch {
    Batch {
        results: std::mem::take(&mut req.command_results),
        removed: std::mem::take(&mut req.removed_containers),
        probe: req.probe.clone(),
    }
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
        && *last_error == b.last_error
        && *clock_skew_secs == b.clock_skew_secs
        && *docker_ok == b.docker_ok
        && *stopped == b.stopped
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restart {
    No,
    /// The heartbeat carrying the acknowledgement is on its way.
    Acking,
}

/// SIGTERM and SIGINT, each by name, from a task of their own. The loop polls this channel's
/// receiver (an atomic load while nothing came) rather than the two signal streams, whose
/// futures it would otherwise make and poll again on each of its four wake-ups per heartbeat
/// (`cargo xtask bench instructions`).
fn signals() -> std::io::Result<tokio::sync::mpsc::Receiver<&'static str>> {
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                Some(()) = term.recv() => "SIGTERM",
                Some(()) = int.recv() => "SIGINT",
                else => return,
            };
            if tx.send(name).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// The step in flight, until it finishes; pending forever when there is none.
async fn poll_step<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; pending forever when there is none. The timer is made only when the branch
/// is polled, not on each of the loop's wake-ups.
async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Awaits a task slot the caller checked is occupied.
async fn join<T>(slot: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match slot.as_mut() {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

fn abort<T>(slot: &mut Option<JoinHandle<T>>) {
    if let Some(h) = slot.take() {
        h.abort();
    }
}

/// Removes the containers the reconciler gave up on, one by one, re-checking each label.
async fn remove_all(d: Arc<Docker>, doomed: Vec<reconcile::ManagedContainer>) -> Vec<RemovedContainer> {
    let mut removed = Vec::new();
    for c in doomed {
        match reconcile::remove(&d, &c, reconcile::STOP_GRACE).await {
            Ok(r) => removed.push(r),
            Err(DockerError::NotFound(_)) => {}
            Err(e) => {
                warn!(container = %c.name, id = %c.id, error = %e, "could not remove an unknown managed container")
            }
        }
    }
    removed
}

/// The verification state as `state.json` spells it.
pub fn verification_text(v: VerificationState) -> &'static str {
    match v {
        VerificationState::AwaitingCheck => "awaiting_check",
        VerificationState::Verified => "verified",
        VerificationState::Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
