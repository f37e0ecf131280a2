//! `gpum-agent run`: the service's life, as one event loop.
//!
//! Lifecycle: load the config (missing or invalid: record "configuration error", exit 78) ->
//! connect to Docker (down is a state, not an error) -> remove probe containers a crash left ->
//! loop -> exit code. Every input is an [`Event`] and one `select!` picks the next one:
//! the heartbeat timer, the heartbeat step finishing, a probe finishing, a removal finishing,
//! a rentals round finishing, and SIGTERM/SIGINT.
//!
//! Rentals ([`rental`]): after every heartbeat step, answered or not, one rentals round runs in
//! its own task against the last answer's desired set (none before the first answer since the
//! agent started, so a restart tears nothing down before the platform has spoken); a round asked
//! for while one runs waits for it. Each request carries the rentals' current reports.
//!
//! This module only routes: it hands each event to [`crate::core::Core`], which holds every
//! rule of the service (the lifecycle, commands, the interval, the known list, probe
//! scheduling, when `state.json` is written) without I/O, and carries out the [`Action`]s it
//! returns: it spawns the probe and the removals, sends the heartbeat, writes the files and
//! exits. What stays here is how the facts are gathered: the Docker client, the engine's event
//! stream and the managed containers' last listing, the inventory gatherer.
//!
//! A heartbeat *step* runs as its own future: list the managed containers, gather inventory and
//! metrics, POST the heartbeat. Its outcome goes back to the core ([`BeatDone`]). Failures go
//! through [`crate::client::classify`] (whether) and [`crate::backoff::Backoff`] (how); only a
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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpum_common::agent_state::{Connection, StopReason, Stopped};
use gpum_common::exit;
use gpum_host::{Host, env};
use gpum_protocol::{
    ErrorCode, Health, HeartbeatRequest, ProbeFailure, ProbeReport, RemovedContainer, RentalReport,
    RentalSpec, VerificationState, limits,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio::time::sleep_until;
use tracing::{debug, error, info, trace, warn};

use crate::client::{Platform, REQUEST_TIMEOUT};
use crate::config::{Config, Paths};
use crate::core::{Action, Beat, BeatDone, Core, Event, Now, ProbeDone, ProbeStart, Settings, UpgradeEnd};
use crate::docker::ledger::{self, ProbeLedger};
use crate::docker::{Docker, DockerError, gpucheck, probe, reconcile, rental, watch};
use crate::inventory::Gatherer;
use crate::outbox::{Answered, Batch};
use crate::secret::Token;

pub use crate::core::{EXIT_RESTART, STOP_GRACE};

/// The longest a Docker call inside a heartbeat step may take; a hung engine must not hold up
/// heartbeats.
pub const DOCKER_STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest the agent of a deleted node spends tearing its rentals down before it exits:
/// each stop waits [`rental::STOP_GRACE`] at most.
pub const END_RENTALS_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest the upgrade's downloads may take, each (issue 47).
pub const UPGRADE_TIMEOUT: Duration = Duration::from_secs(600);

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

/// What a heartbeat step takes with it.
struct StepInput {
    /// Shared with the loop: one reference count, not a copy of the clients, per heartbeat.
    platform: Arc<Platform>,
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

/// What it brings back: the gatherer travels back to the loop, and the outcome goes to the
/// core (with what the request carried, so that on failure its pending results are sent
/// again).
struct StepOutput {
    gatherer: Box<Gatherer>,
    /// Whether the managed containers were listed in this step (not reused).
    listed: bool,
    docker_version: Option<String>,
    /// The rental reports the request carried.
    rentals_sent: Vec<RentalReport>,
    done: Box<BeatDone>,
}

///
/// The futures of the Docker and HTTP calls are large (kilobytes each); they are boxed here, so
/// that this step's own future stays small and is not copied whole on every spawn and poll,
/// and the output is boxed for the same reason (it was a third of the agent's instructions per
/// heartbeat, in `memcpy`; see `cargo xtask bench agent`).
async fn step(mut s: StepInput) -> StepOutput {
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
    let rentals_sent = std::mem::take(&mut s.req.rentals);
    let req = &mut s.req;
    let done = Box::new(BeatDone {
        seq: req.seq,
        carried: carried(req),
        inventory_sent: req.inventory.is_some(),
        inventory_hash: std::mem::take(&mut req.inventory_hash),
        probe_key,
        docker_connected: s.docker.is_some(),
        docker_ok: req.health.docker_ok,
        docker_error: req.health.docker_error.take(),
        managed,
        result,
    });
    StepOutput { gatherer: s.gatherer, listed, docker_version, rentals_sent, done }
}

/// The loop's I/O: the platform, Docker, the gatherer and the state directory; the rules are
/// the [`Core`]'s.
struct Agent {
    host: Arc<dyn Host>,
    state_dir: PathBuf,
    cfg: Config,
    platform: Arc<Platform>,
    docker_socket: Option<PathBuf>,
    docker: Option<Arc<Docker>>,
    docker_error: Option<String>,
    docker_version: Option<String>,
    /// The engine's event stream for the managed containers, and their last good list with
    /// when it was taken: a heartbeat reuses the list while the stream reports no change.
    watch: Option<watch::Watch>,
    listed: Option<(Vec<reconcile::ManagedContainer>, Instant)>,
    gatherer: Option<Box<Gatherer>>,
    core: Core,
    /// Rentals: what the agent knows of each (reported every heartbeat), how they run, and the
    /// platform's last desired set (`None` until an answer came since the agent started: before
    /// that, nothing is torn down).
    rentals: rental::Book,
    rental_runner: rental::Runner,
    desired: Option<Vec<RentalSpec>>,
    /// The GPU check between rentals and the quarantine ([`gpucheck`]), shared with the runner.
    gpus: gpucheck::Guard,
    /// The tunnel (issue 34, [`crate::tunnel`]): the platform's last list, and the task,
    /// started at the first list that has a rental with ports.
    tunnel_desired: tokio::sync::watch::Sender<Arc<Vec<RentalSpec>>>,
    tunnel_task: Option<JoinHandle<()>>,
    /// Upgrades (issue 47, [`crate::upgrade`]): where, and whether this agent takes them (the
    /// config's `auto_update` and an install that can upgrade in place), reported every beat.
    layout: crate::upgrade::Layout,
    auto_update: bool,
    /// The version the upgrade in flight installs.
    upgrading: Option<String>,
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
    let mut agent = Agent::new(host, paths, cfg, platform);
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
    fn new(host: Arc<dyn Host>, paths: &Paths, cfg: Config, platform: Platform) -> Agent {
        let state_dir = paths.state_dir.clone();
        let layout = crate::upgrade::Layout::installed(&state_dir);
        let can_upgrade = crate::upgrade::can_upgrade(host.as_ref(), paths.system, &layout);
        let auto_update = cfg.auto_update && can_upgrade;
        if cfg.auto_update && !can_upgrade {
            info!(
                "automatic upgrades need the installer's layout (/opt/gpum-agent); this agent does not upgrade itself"
            );
        }
        let upgrade =
            crate::upgrade::startup(host.as_ref(), &layout, gpum_enroll::AGENT_VERSION, auto_update);
        let docker_socket = docker_socket(host.as_ref(), cfg.docker_socket.as_deref());
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
        let nvml = gpucheck::NvmlQuery { lib: crate::inventory::nvml_lib(host.as_ref()) };
        let gpus = gpucheck::Guard::new(host.clone(), &state_dir, Arc::new(nvml), &cfg.probe_registries);
        let gatherer = Box::new(Gatherer::new(host.clone()));
        let (cpu_cores, ram_mib) = gatherer.capacity();
        let rental_runner = rental::Runner::new(
            &cfg.probe_registries,
            crate::egress::Gate::new(host.clone()),
            rental::Machine { cpu_cores, ram_mib },
        )
        .driver_capabilities(&cfg.rental_driver_capabilities)
        .enabled(cfg.rentals)
        .with_guard(gpus.clone());
        // TEST ONLY: rentals without the GPU request, on an engine without the NVIDIA toolkit
        // (`test-knobs` builds, `gpum-test/` images only; see `docker::rental`).
        #[cfg(feature = "test-knobs")]
        let rental_runner = if cfg.test_rentals_without_gpu_request {
            rental_runner.simulation_without_gpu_request()
        } else {
            rental_runner
        };
        let core = Core::new(Settings {
            node_id: cfg.node_id.clone(),
            server: cfg.server.clone(),
            answered,
            ledger,
            probe_gap,
            reconcile_min_age: cfg.test_reconcile_min_age.unwrap_or(reconcile::MIN_AGE),
            rng: StdRng::from_entropy(),
            now: Instant::now(),
            upgrade,
        });
        Agent {
            gatherer: Some(gatherer),
            host,
            state_dir,
            cfg,
            platform: Arc::new(platform),
            docker_socket,
            docker: None,
            docker_error: None,
            docker_version: None,
            watch: None,
            listed: None,
            core,
            rentals: rental::Book::default(),
            rental_runner,
            desired: None,
            gpus,
            tunnel_desired: tokio::sync::watch::channel(Arc::new(Vec::new())).0,
            tunnel_task: None,
            layout,
            auto_update,
            upgrading: None,
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
        info!(node_id = %self.cfg.node_id, server = %self.cfg.server, version = gpum_enroll::AGENT_VERSION, "agent started");
        self.connect_docker();
        if self.cfg.rentals {
            // The rentals' egress table back in place (after a reboot or a flush) before any
            // rental runs; every round that starts one verifies it again (`docker::rental`).
            let gate = self.rental_runner.egress().clone();
            tokio::spawn(async move {
                let _ = gate.ensure().await;
            });
        }
        if let Some(d) = self.docker.clone() {
            // A probe container left by a crash mid-probe goes first, before anything new starts.
            tokio::spawn(async move {
                if let Err(e) = probe::cleanup_leftovers(&d).await {
                    debug!(error = %e, "could not look for leftover probe containers");
                }
            });
        }

        // The tasks in flight are locals, one variable each, so that each `select!` branch
        // borrows only its own.
        // The heartbeat in flight is polled here, in the loop's own task, rather than spawned:
        // a spawned task cost an allocation, a queue and a wake-up of this task each beat. A
        // panic in it ends the agent (release builds abort on panic anyway), and systemd
        // restarts it.
        let mut step_task: Option<std::pin::Pin<Box<dyn Future<Output = StepOutput> + Send>>> = None;
        let mut probe_task: Option<JoinHandle<ProbeDone>> = None;
        let mut removal_task: Option<JoinHandle<Vec<RemovedContainer>>> = None;
        // One rentals round at a time; a round asked for while one runs waits for it.
        let mut rental_task: Option<JoinHandle<bool>> = None;
        let mut rental_due = false;
        let mut upgrade_task: Option<JoinHandle<UpgradeEnd>> = None;
        // The heartbeat's own clock: one wake-up per beat (see `alarm`).
        let alarm = crate::alarm::Alarm::new();
        let mut actions = Vec::new();
        let mut ev = Event::Start;

        loop {
            let now = Now { wall: self.host.now(), mono: Instant::now() };
            self.core.handle(now, ev, &mut actions);
            for action in actions.drain(..) {
                match action {
                    Action::Heartbeat(b) => step_task = Some(Box::pin(step(self.step_input(b)))),
                    Action::StartProbe(p) => probe_task = Some(self.start_probe(p)),
                    Action::Remove(doomed) => {
                        if let Some(d) = self.docker.clone() {
                            removal_task = Some(tokio::spawn(remove_all(d, doomed)));
                        }
                    }
                    Action::SaveAnswered => {
                        if let Err(e) = self.core.answered().save(self.host.as_ref()) {
                            warn!(error = %e, "could not record the answered commands");
                        }
                    }
                    Action::SaveLedger => {
                        if let Err(e) = self.core.ledger().save(self.host.as_ref(), &self.state_dir) {
                            warn!(error = %e, dir = %self.state_dir.display(), "could not write the probe ledger");
                        }
                    }
                    Action::WriteState => self.write_state(now.mono),
                    Action::Abort => {
                        abort(&mut probe_task);
                        abort(&mut removal_task);
                        abort(&mut upgrade_task);
                    }
                    Action::StartUpgrade(version) => upgrade_task = Some(self.start_upgrade(version)),
                    Action::RecordUpgrade(r) => crate::upgrade::record(self.host.as_ref(), &self.layout, &r),
                    Action::ConfirmUpgrade(r) => {
                        crate::upgrade::confirm(self.host.as_ref(), &self.layout, &r)
                    }
                    Action::UpgradeReported => crate::upgrade::reported(self.host.as_ref(), &self.layout),
                    Action::Exit(code) => {
                        if self.node_deleted() {
                            abort(&mut rental_task);
                            self.end_rentals().await;
                        }
                        return code;
                    }
                }
            }
            if rental_due && rental_task.is_none() {
                rental_due = false;
                rental_task = self.start_rentals(now.wall);
            }

            let (beat_at, probe_at, stop_at) =
                (self.core.beat_at(), self.core.probe_at(), self.core.stop_deadline());
            ev = tokio::select! {
                biased;
                Some(name) = signals.recv() => Event::Signal(name),
                _ = until(stop_at), if stop_at.is_some() => Event::StopDeadline,
                out = poll_step(&mut step_task), if step_task.is_some() => {
                    step_task = None;
                    // Every heartbeat, answered or not, reconciles the rentals: one past its end
                    // stops even while the platform cannot be reached.
                    rental_due = true;
                    Event::Beat(self.step_back(out))
                }
                r = join(&mut rental_task), if rental_task.is_some() => {
                    rental_task = None;
                    if let Some(w) = &self.watch {
                        w.set_stale();
                    }
                    Event::RentalsDone { changed: r.unwrap_or(false) }
                }
                r = join(&mut probe_task), if probe_task.is_some() => {
                    probe_task = None;
                    match r {
                        Ok(done) => Event::ProbeDone(Box::new(done)),
                        Err(e) => {
                            error!(error = %e, "probe task failed");
                            Event::ProbeLost
                        }
                    }
                }
                _ = until(probe_at), if probe_at.is_some() => Event::ProbeDue,
                r = join(&mut upgrade_task), if upgrade_task.is_some() => {
                    upgrade_task = None;
                    let version = self.upgrading.take().unwrap_or_default();
                    Event::UpgradeDone(r.unwrap_or_else(|e| {
                        error!(error = %e, "upgrade task failed");
                        self.upgrade_lost(&version, &e.to_string())
                    }))
                }
                r = join(&mut removal_task), if removal_task.is_some() => {
                    removal_task = None;
                    // The agent changed the set itself: list again at the next heartbeat rather
                    // than rely on the engine's events arriving first.
                    if let Some(w) = &self.watch {
                        w.set_stale();
                    }
                    Event::Removed(r.unwrap_or_default())
                }
                _ = alarm.until(tokio::time::Instant::from_std(beat_at.unwrap_or(now.mono))), if beat_at.is_some() => {
                    self.connect_docker();
                    Event::Tick
                }
            };
        }
    }

    fn step_input(&mut self, b: Beat) -> StepInput {
        let Beat { seq, batch, clock_skew, accepted_hash, upgrade } = b;
        let req = HeartbeatRequest {
            seq,
            agent_version: Some(gpum_enroll::AGENT_VERSION.to_string()),
            auto_update: Some(self.auto_update),
            upgrade,
            probe: batch.probe,
            removed_containers: batch.removed,
            command_results: batch.results,
            rentals: self.rentals.reports(),
            quarantine: self.gpus.quarantine(),
            health: Health {
                docker_ok: false,
                docker_error: if self.docker.is_none() { self.docker_error.clone() } else { None },
                clock_skew_secs: clock_skew,
                ..Default::default()
            },
            ..Default::default()
        };
        // The engine's version changes only with an upgrade, which restarts the engine (the
        // listing fails, so the cache is dropped); asking every few minutes catches the rest.
        let refresh_docker_version = seq.is_multiple_of(crate::inventory::SLOW_FACTS_EVERY);
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
            accepted_hash,
        }
    }

    /// Takes the gatherer back and keeps the managed containers' listing for the next steps;
    /// returns the outcome for the core.
    fn step_back(&mut self, out: StepOutput) -> Box<BeatDone> {
        let StepOutput { gatherer, listed, docker_version, rentals_sent, done } = out;
        self.gatherer = Some(gatherer);
        if let Ok(ans) = &done.result {
            self.rentals.acked(&rentals_sent);
            self.desired = Some(ans.body.rentals.clone());
            self.gpus.set_probe_image(ans.body.probe_image.clone());
            self.feed_tunnel(&ans.body.rentals);
        }
        self.docker_version = docker_version;
        if listed {
            self.listed = Some((done.managed.clone(), Instant::now()));
        } else if !done.docker_ok {
            self.listed = None;
            if let Some(w) = &self.watch {
                w.set_stale();
            }
        }
        done
    }

    /// Spawns the upgrade the core decided on ([`crate::upgrade::upgrade`]): its own client, whose
    /// timeout allows a binary of some megabytes on a slow line.
    fn start_upgrade(&mut self, version: String) -> JoinHandle<UpgradeEnd> {
        let (host, layout, token) = (self.host.clone(), self.layout.clone(), self.cfg.token.clone());
        let platform = self.cfg.extra_roots(host.as_ref()).map_err(|e| e.to_string()).and_then(|roots| {
            Platform::new(&self.cfg.server, roots, UPGRADE_TIMEOUT).map_err(|e| e.to_string())
        });
        self.upgrading = Some(version.clone());
        let lost = |e: String| self.upgrade_lost(&version, &e);
        let platform = match platform {
            Ok(p) => p,
            Err(e) => {
                let end = lost(e);
                return tokio::spawn(async move { end });
            }
        };
        tokio::spawn(async move {
            let keys = gpum_repo_keys::release::ReleaseKeys::gpum();
            crate::upgrade::upgrade(
                host.as_ref(),
                &platform,
                &token,
                &layout,
                &keys,
                gpum_enroll::AGENT_VERSION,
                &version,
            )
            .await
        })
    }

    /// An upgrade that ended without a word (its task failed): `failed`, retried later.
    fn upgrade_lost(&self, version: &str, detail: &str) -> UpgradeEnd {
        UpgradeEnd::Ended(gpum_protocol::UpgradeReport {
            from: gpum_enroll::AGENT_VERSION.to_string(),
            to: version.to_string(),
            outcome: gpum_protocol::UpgradeOutcome::Failed,
            detail: detail.to_string(),
            at: crate::state::unix(self.host.now()),
        })
    }

    /// Spawns the GPU probe the core started.
    fn start_probe(&mut self, p: ProbeStart) -> JoinHandle<ProbeDone> {
        let ProbeStart { image, now, mut images } = p;
        let docker = self.docker.clone();
        let registries = self.cfg.probe_registries.clone();
        let socket_error = self.docker_error.clone();
        let gpus = self.gpus.clone();
        tokio::spawn(async move {
            match docker {
                Some(d) => {
                    let spec =
                        probe::ProbeSpec::new(&image, probe::DEFAULT_TIMEOUT).with_registries(&registries);
                    let out = ledger::probe_and_tidy(&d, &spec, &mut images).await;
                    // A quarantine is lifted by a probe that passed and GPUs found free.
                    gpus.recheck(out.report.state).await;
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
        })
    }

    /// Spawns a rentals round against the platform's last desired set, if an answer came and the
    /// engine is connected. The task returns whether a rental's report changed.
    fn start_rentals(&mut self, wall: std::time::SystemTime) -> Option<JoinHandle<bool>> {
        let (Some(d), Some(desired)) = (self.docker.clone(), self.desired.clone()) else {
            return None;
        };
        // Nothing desired, nothing known, no rental container in the last listing: no engine
        // call (the agent's heartbeat stays as cheap as it was without rentals).
        let idle = desired.is_empty()
            && self.rentals.is_empty()
            && self.listed.as_ref().is_some_and(|(list, _)| {
                !list.iter().any(|c| c.name.starts_with(rental::RENTAL_NAME_PREFIX))
            });
        if idle {
            return None;
        }
        let (book, runner) = (self.rentals.clone(), self.rental_runner.clone());
        let now = crate::state::unix(wall);
        Some(tokio::spawn(async move {
            let before = book.reports();
            if let Err(e) = rental::reconcile(&d, &runner, &book, &desired, now).await {
                debug!(error = %e, "could not reconcile the rentals");
            }
            book.reports() != before
        }))
    }

    /// Whether the core stopped for good because the platform deleted this node (410
    /// `node_deleted`; a replaced token is not a deletion: the node and its rentals live on).
    fn node_deleted(&self) -> bool {
        let deleted = serde_json::to_value(ErrorCode::NodeDeleted).ok();
        self.core.state().stopped.as_ref().is_some_and(|s| {
            s.reason == StopReason::Revoked
                && deleted.as_ref().and_then(|d| d.as_str()) == Some(s.detail.as_str())
        })
    }

    /// The node was deleted: the platform ended every rental of it then, and no heartbeat will
    /// list one again, so none may run on here. Each rental container is torn down as a round
    /// with nothing desired does it (stopped, removed with its anonymous volumes, verified
    /// gone), within [`END_RENTALS_TIMEOUT`]. Nothing else is touched: the probe's and any other
    /// managed container stay, as for any stop for good.
    async fn end_rentals(&mut self) {
        let Some(d) = self.docker.clone() else { return };
        let now = crate::state::unix(self.host.now());
        let round = rental::reconcile(&d, &self.rental_runner, &self.rentals, &[], now);
        match tokio::time::timeout(END_RENTALS_TIMEOUT, round).await {
            Ok(Ok(())) => match rental::containers(&d).await {
                Ok(left) if left.is_empty() => info!("the node was deleted: its rentals are torn down"),
                Ok(left) => {
                    warn!(left = left.len(), "the node was deleted: not every rental could be torn down")
                }
                Err(e) => {
                    warn!(error = %e, "the node was deleted: could not list the rentals after their teardown")
                }
            },
            Ok(Err(e)) => {
                warn!(error = %e, "the node was deleted: its rentals could not be listed to tear them down")
            }
            Err(_) => warn!("the node was deleted: tearing its rentals down took too long"),
        }
    }

    /// Hands the platform's list to the tunnel, and starts the tunnel's task at the first list
    /// with a rental that has ports (it then dials only while such a rental runs here).
    fn feed_tunnel(&mut self, desired: &[RentalSpec]) {
        self.tunnel_desired.send_if_modified(|d| {
            let changed = d.as_slice() != desired;
            if changed {
                *d = Arc::new(desired.to_vec());
            }
            changed
        });
        let Some(docker) = self.docker.clone() else { return };
        if self.tunnel_task.is_some() || !desired.iter().any(|s| !s.ports.is_empty()) {
            return;
        }
        let rentals =
            crate::tunnel::Rentals { desired: self.tunnel_desired.subscribe(), book: self.rentals.clone() };
        let host = self.host.clone();
        let now = Arc::new(move || crate::state::unix(host.now()));
        let (platform, token) = (Platform::clone(&self.platform), self.cfg.token.clone());
        let silence = self.cfg.test_tunnel_silence.unwrap_or(gpum_protocol::tunnel::SILENCE);
        self.tunnel_task =
            Some(tokio::spawn(crate::tunnel::run(platform, token, docker, rentals, now, silence)));
    }

    /// Writes `state.json` as the core asked ([`Action::WriteState`]).
    fn write_state(&mut self, now: Instant) {
        match crate::state::write(self.host.as_ref(), &self.state_dir, self.core.state_mut()) {
            Ok(()) => self.core.state_written(now),
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
async fn until(at: Option<Instant>) {
    match at {
        Some(t) => sleep_until(tokio::time::Instant::from_std(t)).await,
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
