//! The GPUs between two rentals (issue 33): the check after a teardown, the quarantine when it
//! fails, and the self-test before GPUs change hands.
//!
//! - **After a teardown** ([`Guard::after_teardown`]): once the rental's container is verified
//!   gone, NVML is asked about each GPU the rental held (by UUID): whether it answers, and which
//!   processes (compute and graphics) run on it. A process can take a moment to go, so the
//!   question is asked again for a short while ([`SETTLE_TRIES`] × [`SETTLE_PAUSE`]). A GPU
//!   still busy, or one that does not answer, **quarantines the node**.
//! - **The quarantine** ([`gpum_protocol::Quarantine`]): kept in `gpus.json` in the state
//!   directory (so it survives a restart), sent in every heartbeat while it lasts, and while it
//!   does no rental starts (reported `failed` with the reason). A GPU probe that passes,
//!   followed by NVML finding the quarantined GPUs free and answering, lifts it
//!   ([`Guard::recheck`]; the `recheck` command runs that probe). A `gpus.json` that exists but
//!   cannot be read is a quarantine too (fail closed).
//! - **Before GPUs change hands** ([`Guard::before_start`]): the ledger remembers which rental
//!   last held each GPU. Before a rental starts on a GPU another rental held, the same NVML
//!   check runs on exactly those GPUs, then the GPU probe with a device request for exactly
//!   them; the rental starts only if both pass, and a failure quarantines. This probe does not
//!   go through the probe rate limit ([`super::ledger`]): it is bounded by rental starts (one
//!   per new rental on used GPUs at most), which only the platform's operator creates.
//!
//! The rules are pure functions ([`check_verdict`], [`GpuLedger::changing_hands`],
//! [`GpuLedger::held_by`]) tested below; NVML sits behind [`GpuQuery`] (the real one is
//! [`NvmlQuery`], over `gpum_enroll::inventory::gpu_use`), so [`Guard`] is tested with a fake.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpum_host::Host;
use gpum_protocol::{Quarantine, RentalSpec, VerificationState, limits};
use serde::{Deserialize, Serialize};

pub use gpum_enroll::inventory::GpuUse;

use super::Docker;
use super::probe::{self, ProbeSpec};

/// Where the ledger is kept, in the state directory.
pub const FILE: &str = "gpus.json";
/// How many times NVML is asked before a busy or silent GPU counts.
pub const SETTLE_TRIES: u32 = 10;
/// The pause between two questions.
pub const SETTLE_PAUSE: Duration = Duration::from_secs(1);
/// The longest reason kept.
const MAX_REASON: usize = 512;

/// Whether every GPU of `found` answered and runs nothing; else the reason, naming each GPU
/// that did not. Pure.
pub fn check_verdict(found: &[(String, GpuUse)]) -> Result<(), String> {
    let bad: Vec<String> = found
        .iter()
        .filter_map(|(uuid, u)| match u {
            GpuUse::Free => None,
            GpuUse::Busy(pids) => {
                let shown: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
                let more = if pids.len() > shown.len() { ", …" } else { "" };
                let n = pids.len();
                let s = if n == 1 { "" } else { "es" };
                Some(format!("{uuid}: {n} process{s} left (pid {}{more})", shown.join(", ")))
            }
            GpuUse::NoAnswer(why) => Some(format!("{uuid} does not answer ({why})")),
            // Not this machine's GPU: nothing of it to wait for or quarantine ([`not_here`]).
            GpuUse::NotHere => None,
        })
        .collect();
    if bad.is_empty() { Ok(()) } else { Err(cut(&bad.join("; "))) }
}

/// The GPUs of `found` that NVML finds on no device of this machine. A container of another
/// gpum installation on the same Docker engine (another owner's, or a deleted node's) can hold
/// GPUs that are not this machine's: such a GPU is no rental's here and no check of this
/// machine can ever pass on it, so it neither quarantines the node nor keeps a quarantine
/// (issue 46: a quarantine over a GPU the machine does not have could never be lifted). Pure.
pub fn not_here(found: &[(String, GpuUse)]) -> Vec<String> {
    found.iter().filter(|(_, u)| *u == GpuUse::NotHere).map(|(uuid, _)| uuid.clone()).collect()
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_REASON {
        return s.to_string();
    }
    let mut end = MAX_REASON;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// What `gpus.json` holds: which rental last held each GPU, and the quarantine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLedger {
    /// GPU UUID → the id of the rental that last held it.
    #[serde(default)]
    pub holders: BTreeMap<String, String>,
    #[serde(default)]
    pub quarantine: Option<Quarantine>,
}

impl GpuLedger {
    /// Reads it from `state_dir`: none is an empty ledger; one that cannot be read or parsed
    /// is a quarantine (whether GPUs changed hands is unknown).
    pub fn load(host: &dyn Host, state_dir: &Path, now: u64) -> GpuLedger {
        let path = state_dir.join(FILE);
        if !host.exists(&path) {
            return GpuLedger::default();
        }
        match host
            .read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<GpuLedger>(&b).map_err(|e| e.to_string()))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "the GPU ledger could not be read; the node is quarantined until a recheck passes");
                GpuLedger {
                    holders: BTreeMap::new(),
                    quarantine: Some(Quarantine {
                        reason: format!("the agent's GPU ledger ({FILE}) could not be read"),
                        since: now,
                        gpu_uuids: Vec::new(),
                    }),
                }
            }
        }
    }

    /// Writes it to `state_dir` (0600, atomically).
    pub fn save(&self, host: &dyn Host, state_dir: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(self).expect("the ledger serializes");
        host.write_atomic(&state_dir.join(FILE), &json, 0o600)
    }

    /// The GPUs of `uuids` that another rental than `rental` held last. Pure.
    pub fn changing_hands(&self, rental: &str, uuids: &[String]) -> Vec<String> {
        uuids.iter().filter(|u| self.holders.get(*u).is_some_and(|h| h != rental)).cloned().collect()
    }

    /// The GPUs `rental` held last.
    pub fn held_by(&self, rental: &str) -> Vec<String> {
        self.holders.iter().filter(|(_, h)| h.as_str() == rental).map(|(u, _)| u.clone()).collect()
    }

    /// `rental` holds `uuids` now. The ledger stays bounded: a GPU the machine no longer has
    /// is forgotten once there are more than [`limits::MAX_GPUS`] × 4 entries.
    pub fn hold(&mut self, rental: &str, uuids: &[String]) {
        for u in uuids {
            self.holders.insert(u.clone(), rental.to_string());
        }
        while self.holders.len() > limits::MAX_GPUS * 4 {
            let Some(first) = self.holders.keys().find(|k| !uuids.contains(k)).cloned() else { break };
            self.holders.remove(&first);
        }
    }
}

/// NVML, as the guard asks it (a fake in tests).
pub trait GpuQuery: Send + Sync + fmt::Debug {
    /// For each of `uuids`: whether it answers and what runs on it. Blocking.
    fn query(&self, uuids: &[String]) -> Vec<(String, GpuUse)>;
}

/// The machine's NVML (the library the inventory loads).
#[derive(Debug, Clone)]
pub struct NvmlQuery {
    pub lib: String,
}

impl GpuQuery for NvmlQuery {
    fn query(&self, uuids: &[String]) -> Vec<(String, GpuUse)> {
        gpum_enroll::inventory::gpu_use(&self.lib, uuids)
    }
}

/// The GPU check, the quarantine and the self-test, shared by the rentals round and the probe
/// task. Build it with [`Guard::new`]; clones share one ledger.
#[derive(Clone)]
pub struct Guard {
    ledger: Arc<Mutex<GpuLedger>>,
    host: Arc<dyn Host>,
    state_dir: PathBuf,
    query: Arc<dyn GpuQuery>,
    tries: u32,
    pause: Duration,
    /// The probe image the platform set last (the self-test's), and the accepted registries.
    probe_image: Arc<Mutex<Option<String>>>,
    registries: Vec<String>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("ledger", &*self.lock()).field("query", &self.query).finish()
    }
}

impl Guard {
    /// The guard over `state_dir`'s ledger (loaded now), asking `query`, probing with images
    /// from `registries`.
    pub fn new(
        host: Arc<dyn Host>,
        state_dir: &Path,
        query: Arc<dyn GpuQuery>,
        registries: &[String],
    ) -> Guard {
        let now = crate::state::unix(host.now());
        let ledger = GpuLedger::load(host.as_ref(), state_dir, now);
        Guard {
            ledger: Arc::new(Mutex::new(ledger)),
            host,
            state_dir: state_dir.to_path_buf(),
            query,
            tries: SETTLE_TRIES,
            pause: SETTLE_PAUSE,
            probe_image: Arc::new(Mutex::new(None)),
            registries: registries.to_vec(),
        }
    }

    /// Asks NVML `tries` times, `pause` apart (tests ask fewer times, sooner).
    pub fn with_settle(mut self, tries: u32, pause: Duration) -> Guard {
        self.tries = tries.max(1);
        self.pause = pause;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GpuLedger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The quarantine, while there is one (what every heartbeat carries).
    pub fn quarantine(&self) -> Option<Quarantine> {
        self.lock().quarantine.clone()
    }

    /// The ledger as it is now (tests, diagnostics).
    pub fn ledger(&self) -> GpuLedger {
        self.lock().clone()
    }

    /// The probe image the platform set last; the self-test runs it.
    pub fn set_probe_image(&self, image: Option<String>) {
        *self.probe_image.lock().unwrap_or_else(|e| e.into_inner()) = image;
    }

    fn save(&self, ledger: &GpuLedger) -> Result<(), String> {
        ledger.save(self.host.as_ref(), &self.state_dir).map_err(|e| {
            tracing::warn!(error = %e, dir = %self.state_dir.display(), "could not write the GPU ledger");
            format!("the agent's GPU ledger ({FILE}) could not be written")
        })
    }

    fn set_quarantine(&self, reason: &str, uuids: &[String]) {
        let now = crate::state::unix(self.host.now());
        let mut l = self.lock();
        tracing::error!(reason, gpus = ?uuids, "the node is quarantined: no rental starts until a recheck passes");
        l.quarantine = Some(Quarantine {
            reason: cut(reason),
            since: now,
            gpu_uuids: uuids.iter().take(limits::MAX_GPUS).cloned().collect(),
        });
        let copy = l.clone();
        drop(l);
        // In memory it holds anyway; a failed write is logged.
        let _ = self.save(&copy);
    }

    /// Asks NVML about `uuids` until they are free and answering or the tries run out. `Ok`
    /// holds those NVML finds on no device of this machine ([`not_here`]).
    async fn settle(&self, uuids: &[String]) -> Result<Vec<String>, String> {
        let mut last = Ok(Vec::new());
        for i in 0..self.tries {
            if i > 0 {
                tokio::time::sleep(self.pause).await;
            }
            let (q, u) = (self.query.clone(), uuids.to_vec());
            let found = tokio::task::spawn_blocking(move || q.query(&u))
                .await
                .map_err(|e| format!("the GPU check did not finish ({e})"))?;
            last = check_verdict(&found).map(|()| not_here(&found));
            if last.is_ok() {
                return last;
            }
        }
        last
    }

    /// The GPUs rental `rental` holds as the ledger knows them.
    pub fn held_by(&self, rental: &str) -> Vec<String> {
        self.lock().held_by(rental)
    }

    /// After rental `rental`'s container was verified gone: its GPUs (`uuids`) must be free and
    /// answering, else the node is quarantined and the reason returned.
    pub async fn after_teardown(&self, rental: &str, uuids: &[String]) -> Result<(), String> {
        if uuids.is_empty() {
            return Ok(());
        }
        match self.settle(uuids).await {
            Ok(elsewhere) => {
                if !elsewhere.is_empty() {
                    tracing::warn!(rental, gpus = ?elsewhere, "the container held GPUs that are not this machine's (another installation's container on the same engine?): not checked");
                }
                tracing::info!(rental, gpus = ?uuids, "GPU check after the teardown passed: this machine's GPUs are free and answering");
                Ok(())
            }
            Err(why) => {
                let reason = format!("GPU check after rental {rental} failed: {why}");
                self.set_quarantine(&reason, uuids);
                Err(reason)
            }
        }
    }

    /// Before rental `s` starts: refused while quarantined; on GPUs another rental held last,
    /// the NVML check and the probe on exactly those GPUs (a failure quarantines); then the
    /// ledger records `s` as their holder. `Err` is the rental's `failed` reason.
    pub async fn before_start(&self, docker: &Docker, s: &RentalSpec) -> Result<(), String> {
        let (changing, quarantined) = {
            let l = self.lock();
            (l.changing_hands(&s.id, &s.gpu_uuids), l.quarantine.clone())
        };
        if let Some(q) = quarantined {
            return Err(format!("refused: this node is quarantined: {}", q.reason));
        }
        if !changing.is_empty() {
            tracing::info!(rental = %s.id, gpus = ?changing, "GPUs change hands: the self-test runs first");
            match self.settle(&changing).await {
                Err(why) => {
                    let reason = format!("self-test before rental {} failed: {why}", s.id);
                    self.set_quarantine(&reason, &changing);
                    return Err(format!("refused: {reason}"));
                }
                // Nothing wrong with this machine's GPUs, so no quarantine: the rental names
                // GPUs it does not have.
                Ok(elsewhere) if !elsewhere.is_empty() => {
                    return Err(format!("refused: not GPUs of this machine: {}", elsewhere.join(", ")));
                }
                Ok(_) => {}
            }
            let image = self.probe_image.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let Some(image) = image else {
                // Nothing was shown wrong with the GPUs: not a quarantine, but no start either.
                return Err("refused: the self-test before GPUs change hands needs a probe image, and the \
                            platform has set none"
                    .into());
            };
            let spec = ProbeSpec::new(&image, probe::DEFAULT_TIMEOUT)
                .with_registries(&self.registries)
                .on_gpus(&changing);
            let report = probe::run_probe_with(docker, &spec).await.report;
            if report.state != VerificationState::Verified {
                let what = report
                    .reason
                    .and_then(|r| serde_json::to_value(r).ok())
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_else(|| "failed".into());
                let reason = format!(
                    "self-test before rental {} failed: the GPU probe on {} failed ({what})",
                    s.id,
                    changing.join(", ")
                );
                self.set_quarantine(&reason, &changing);
                return Err(format!("refused: {reason}"));
            }
            tracing::info!(rental = %s.id, gpus = ?changing, "self-test passed");
        }
        let mut l = self.lock();
        let before = l.clone();
        l.hold(&s.id, &s.gpu_uuids);
        if *l != before {
            let copy = l.clone();
            drop(l);
            // Fail closed: a start whose holder is not on disk could skip the next self-test.
            if let Err(e) = self.save(&copy) {
                *self.lock() = before;
                return Err(format!("refused: {e}"));
            }
        }
        Ok(())
    }

    /// After a GPU probe: while quarantined, a probe that passed and NVML finding the
    /// quarantined GPUs free and answering lift the quarantine. Returns whether it was lifted.
    pub async fn recheck(&self, probe: VerificationState) -> bool {
        let Some(q) = self.quarantine() else { return false };
        if probe != VerificationState::Verified {
            tracing::warn!(reason = %q.reason, "the GPU probe did not pass: the node stays quarantined");
            return false;
        }
        match self.settle(&q.gpu_uuids).await {
            Ok(elsewhere) => {
                if !elsewhere.is_empty() {
                    tracing::warn!(gpus = ?elsewhere, "the quarantine names GPUs that are not this machine's: nothing of them to wait for");
                }
                let mut l = self.lock();
                // Unchanged meanwhile (a new failure stays).
                if l.quarantine.as_ref() != Some(&q) {
                    return false;
                }
                l.quarantine = None;
                let copy = l.clone();
                drop(l);
                let _ = self.save(&copy);
                tracing::info!(reason = %q.reason, "recheck passed: the GPUs are free and answering; quarantine lifted");
                true
            }
            Err(why) => {
                tracing::warn!(reason = %why, "recheck: the GPUs are not free yet; the node stays quarantined");
                false
            }
        }
    }
}

/// The GPUs container `cid` was given, from the engine: its device request's UUIDs, else its
/// `NVIDIA_VISIBLE_DEVICES` (a rental made before the ledger existed, or the test seam).
pub async fn container_gpus(docker: &Docker, cid: &str) -> Vec<String> {
    let Ok(api) = docker.api().await else { return Vec::new() };
    let Ok(info) =
        super::timed(async { api.inspect_container(cid, None).await.map_err(super::DockerError::from) })
            .await
    else {
        return Vec::new();
    };
    let from_request: Vec<String> = info
        .host_config
        .and_then(|h| h.device_requests)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|d| d.device_ids.unwrap_or_default())
        .collect();
    if !from_request.is_empty() {
        return from_request;
    }
    let env = info.config.and_then(|c| c.env).unwrap_or_default();
    env.iter()
        .rev()
        .find_map(|v| v.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .map(|v| v.split(',').filter(|u| super::rental::valid_gpu_uuid(u)).map(String::from).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn the_verdict_names_every_gpu_that_is_not_free() {
        assert_eq!(check_verdict(&[]), Ok(()));
        assert_eq!(check_verdict(&[("GPU-a".into(), GpuUse::Free)]), Ok(()));
        let found = [
            ("GPU-a".to_string(), GpuUse::Free),
            ("GPU-b".to_string(), GpuUse::Busy(vec![4242])),
            ("GPU-c".to_string(), GpuUse::NoAnswer("GPU is lost".into())),
            ("GPU-d".to_string(), GpuUse::Busy(vec![1, 2])),
        ];
        assert_eq!(
            check_verdict(&found),
            Err("GPU-b: 1 process left (pid 4242); GPU-c does not answer (GPU is lost); GPU-d: 2 processes left (pid 1, 2)"
                .into())
        );
        let many = [("GPU-a".to_string(), GpuUse::Busy((0..100).collect()))];
        let why = check_verdict(&many).unwrap_err();
        assert!(why.contains("100 processes") && why.ends_with(", …)"), "{why}");
        let long: Vec<(String, GpuUse)> =
            (0..64).map(|i| (format!("GPU-{i:060}"), GpuUse::NoAnswer("x".repeat(50)))).collect();
        assert!(check_verdict(&long).unwrap_err().len() <= MAX_REASON + '…'.len_utf8());
    }

    #[test]
    fn gpus_change_hands_only_from_another_rental() {
        let mut l = GpuLedger::default();
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Never held: nothing to hand over.
        assert!(l.changing_hands("rent-a", &g(&["GPU-1", "GPU-2"])).is_empty());
        l.hold("rent-a", &g(&["GPU-1", "GPU-2"]));
        // The same rental again (adopted after a restart): not a change.
        assert!(l.changing_hands("rent-a", &g(&["GPU-1", "GPU-2"])).is_empty());
        assert_eq!(l.changing_hands("rent-b", &g(&["GPU-2", "GPU-3"])), g(&["GPU-2"]));
        assert_eq!(l.held_by("rent-a"), g(&["GPU-1", "GPU-2"]));
        l.hold("rent-b", &g(&["GPU-2", "GPU-3"]));
        assert_eq!(l.held_by("rent-a"), g(&["GPU-1"]));
        assert_eq!(l.held_by("rent-b"), g(&["GPU-2", "GPU-3"]));
        // Bounded.
        for i in 0..(limits::MAX_GPUS * 5) {
            l.hold(&format!("rent-{i}"), &[format!("GPU-x{i:04}")]);
        }
        assert_eq!(l.holders.len(), limits::MAX_GPUS * 4);
        assert_eq!(l.held_by(&format!("rent-{}", limits::MAX_GPUS * 5 - 1)).len(), 1, "the newest stays");
    }

    /// A fake NVML: each GPU's answers in turn (the last one repeats).
    #[derive(Debug, Default)]
    struct Fake(Mutex<BTreeMap<String, Vec<GpuUse>>>);

    impl Fake {
        fn set(&self, uuid: &str, answers: Vec<GpuUse>) {
            self.0.lock().unwrap().insert(uuid.into(), answers);
        }
    }

    impl GpuQuery for Fake {
        fn query(&self, uuids: &[String]) -> Vec<(String, GpuUse)> {
            let mut m = self.0.lock().unwrap();
            uuids
                .iter()
                .map(|u| {
                    let a = m.entry(u.clone()).or_insert_with(|| vec![GpuUse::Free]);
                    let now = if a.len() > 1 { a.remove(0) } else { a[0].clone() };
                    (u.clone(), now)
                })
                .collect()
        }
    }

    fn guard(host: &FakeHost, fake: Arc<Fake>) -> Guard {
        let host: Arc<dyn Host> = Arc::new(host.clone());
        Guard::new(host, Path::new("/var/lib/gpum-agent"), fake, &[]).with_settle(3, Duration::from_millis(1))
    }

    #[tokio::test]
    async fn a_process_that_goes_within_the_settle_time_is_no_failure() {
        let host = FakeHost::new();
        let fake = Arc::new(Fake::default());
        fake.set("GPU-1", vec![GpuUse::Busy(vec![7]), GpuUse::Busy(vec![7]), GpuUse::Free]);
        let g = guard(&host, fake);
        assert_eq!(g.after_teardown("rent-a", &["GPU-1".into()]).await, Ok(()));
        assert_eq!(g.quarantine(), None);
    }

    #[tokio::test]
    async fn a_failed_check_quarantines_survives_a_restart_refuses_starts_and_a_passing_recheck_lifts_it() {
        let host = FakeHost::new();
        let fake = Arc::new(Fake::default());
        fake.set("GPU-1", vec![GpuUse::Busy(vec![4242])]);
        let g = guard(&host, fake.clone());
        let why = g.after_teardown("rent-a", &["GPU-1".into()]).await.unwrap_err();
        assert_eq!(why, "GPU check after rental rent-a failed: GPU-1: 1 process left (pid 4242)");
        let q = g.quarantine().expect("quarantined");
        assert_eq!((q.reason.as_str(), q.gpu_uuids.as_slice()), (why.as_str(), &["GPU-1".to_string()][..]));

        // Kept on disk: a new agent starts quarantined.
        let g = guard(&host, fake.clone());
        assert_eq!(g.quarantine(), Some(q.clone()));

        // A failed probe, or the process still there, keeps it.
        assert!(!g.recheck(VerificationState::Failed).await);
        assert!(!g.recheck(VerificationState::Verified).await);
        assert!(g.quarantine().is_some());

        // The process is gone and the probe passed: lifted, on disk too.
        fake.set("GPU-1", vec![GpuUse::Free]);
        assert!(g.recheck(VerificationState::Verified).await);
        assert_eq!(g.quarantine(), None);
        assert_eq!(guard(&host, fake).quarantine(), None);
    }

    #[tokio::test]
    async fn a_gpu_that_does_not_answer_quarantines() {
        let host = FakeHost::new();
        let fake = Arc::new(Fake::default());
        fake.set("GPU-2", vec![GpuUse::NoAnswer("GPU is lost".into())]);
        let g = guard(&host, fake);
        let why = g.after_teardown("rent-a", &["GPU-1".into(), "GPU-2".into()]).await.unwrap_err();
        assert!(why.ends_with("GPU-2 does not answer (GPU is lost)"), "{why}");
        assert_eq!(g.quarantine().unwrap().gpu_uuids, vec!["GPU-1".to_string(), "GPU-2".to_string()]);
    }

    /// Issue 46: a container of another installation on the same engine held a GPU this
    /// machine does not have. Its teardown checks this machine's GPUs only, and a quarantine
    /// an older agent set over such a GPU is lifted by a recheck instead of lasting for ever.
    #[tokio::test]
    async fn a_gpu_that_is_not_this_machines_neither_quarantines_nor_keeps_a_quarantine() {
        let host = FakeHost::new();
        let fake = Arc::new(Fake::default());
        fake.set("GPU-other", vec![GpuUse::NotHere]);
        let g = guard(&host, fake.clone());
        assert_eq!(g.after_teardown("rent-x", &["GPU-1".into(), "GPU-other".into()]).await, Ok(()));
        assert_eq!(g.quarantine(), None);
        // This machine's GPU still busy: the quarantine names it alone.
        fake.set("GPU-1", vec![GpuUse::Busy(vec![5])]);
        let why = g.after_teardown("rent-x", &["GPU-1".into(), "GPU-other".into()]).await.unwrap_err();
        assert_eq!(why, "GPU check after rental rent-x failed: GPU-1: 1 process left (pid 5)");

        // The quarantine an older agent wrote, over the other machine's GPU only.
        fake.set("GPU-1", vec![GpuUse::Free]);
        let old = GpuLedger {
            holders: BTreeMap::new(),
            quarantine: Some(Quarantine {
                reason: "GPU check after rental rent-x failed: GPU-other does not answer (Not found)".into(),
                since: 1,
                gpu_uuids: vec!["GPU-other".into()],
            }),
        };
        old.save(&host, Path::new("/var/lib/gpum-agent")).unwrap();
        let g = guard(&host, fake.clone());
        assert!(g.quarantine().is_some());
        assert!(!g.recheck(VerificationState::Failed).await, "a probe that failed lifts nothing");
        assert!(g.recheck(VerificationState::Verified).await);
        assert_eq!(g.quarantine(), None);

        // A rental on a GPU that is not here is refused, and nothing is quarantined.
        let not_a_socket = tempfile::NamedTempFile::new().unwrap();
        let d = Docker::connect(Some(not_a_socket.path())).unwrap();
        assert_eq!(g.before_start(&d, &spec("rent-y", &["GPU-1", "GPU-other"])).await, Ok(()));
        let why = g.before_start(&d, &spec("rent-z", &["GPU-1", "GPU-other"])).await.unwrap_err();
        assert_eq!(why, "refused: not GPUs of this machine: GPU-other");
        assert_eq!(g.quarantine(), None);
        assert_eq!(
            not_here(&[("a".into(), GpuUse::Free), ("b".into(), GpuUse::NotHere)]),
            vec!["b".to_string()]
        );
    }

    fn spec(id: &str, gpus: &[&str]) -> RentalSpec {
        RentalSpec {
            id: id.into(),
            image: "gpum-test/x@sha256:0".into(),
            gpu_uuids: gpus.iter().map(|g| g.to_string()).collect(),
            cpu_millis: 1000,
            memory_mib: 256,
            disk_gib: 0,
            shm_mib: 64,
            env: vec![],
            command: vec![],
            ends_at: 2_000_000_000,
            ports: vec![],
            driver_capabilities: vec![],
        }
    }

    #[tokio::test]
    async fn gpus_that_change_hands_are_self_tested_first_and_a_quarantine_refuses_every_start() {
        let host = FakeHost::new();
        let fake = Arc::new(Fake::default());
        let g = Guard::new(
            Arc::new(host.clone()),
            Path::new("/var/lib/gpum-agent"),
            fake.clone(),
            &["docker.io".into()],
        )
        .with_settle(2, Duration::from_millis(1));
        // An engine that does not answer: a probe that runs fails with `docker_unavailable`.
        // (a plain file where the socket would be: every connection is refused).
        let not_a_socket = tempfile::NamedTempFile::new().unwrap();
        let d = Docker::connect(Some(not_a_socket.path())).unwrap();
        let a = spec("rent-a", &["GPU-1"]);
        // GPUs never held: no self-test (no engine call); the holder is recorded, on disk.
        assert_eq!(g.before_start(&d, &a).await, Ok(()));
        assert_eq!(guard(&host, fake.clone()).ledger().held_by("rent-a"), vec!["GPU-1".to_string()]);
        // The same rental again (adopted, or started once more): no change of hands.
        fake.set("GPU-1", vec![GpuUse::Busy(vec![9])]);
        assert_eq!(g.before_start(&d, &a).await, Ok(()));

        // Another rental on GPU-1, which still runs a process: the self-test fails and
        // quarantines; the holder stays rent-a.
        let b = spec("rent-b", &["GPU-1", "GPU-2"]);
        let why = g.before_start(&d, &b).await.unwrap_err();
        assert_eq!(why, "refused: self-test before rental rent-b failed: GPU-1: 1 process left (pid 9)");
        assert_eq!(
            g.quarantine().unwrap().gpu_uuids,
            vec!["GPU-1".to_string()],
            "only the GPUs changing hands"
        );
        assert_eq!(g.ledger().held_by("rent-a"), vec!["GPU-1".to_string()]);
        // Quarantined: nothing starts, not even on GPUs no one held.
        let why = g.before_start(&d, &spec("rent-c", &["GPU-3"])).await.unwrap_err();
        assert!(
            why.starts_with("refused: this node is quarantined: self-test before rental rent-b"),
            "{why}"
        );

        // Free again, recheck passed: the self-test runs its NVML part, and then needs the probe.
        fake.set("GPU-1", vec![GpuUse::Free]);
        assert!(g.recheck(VerificationState::Verified).await);
        let why = g.before_start(&d, &b).await.unwrap_err();
        assert!(why.contains("needs a probe image"), "{why}");
        assert_eq!(g.quarantine(), None, "nothing was shown wrong with the GPUs");
        // The probe on exactly GPU-1 runs and fails (the engine does not answer): quarantine.
        g.set_probe_image(Some(format!("docker.io/library/busybox@sha256:{}", "a".repeat(64))));
        let why = g.before_start(&d, &b).await.unwrap_err();
        assert_eq!(
            why,
            "refused: self-test before rental rent-b failed: the GPU probe on GPU-1 failed (docker_unavailable)"
        );
        assert!(g.quarantine().is_some());
        assert_eq!(g.ledger().held_by("rent-b"), Vec::<String>::new());
    }

    #[test]
    fn an_unreadable_ledger_is_a_quarantine() {
        let host = FakeHost::new();
        host.write_atomic(&Path::new("/var/lib/gpum-agent").join(FILE), b"{not json", 0o600).unwrap();
        let g = guard(&host, Arc::new(Fake::default()));
        let q = g.quarantine().expect("fail closed");
        assert!(q.reason.contains("could not be read"), "{}", q.reason);
        // None at all is a fresh machine.
        let fresh = FakeHost::new();
        assert_eq!(guard(&fresh, Arc::new(Fake::default())).ledger(), GpuLedger::default());
    }
}
