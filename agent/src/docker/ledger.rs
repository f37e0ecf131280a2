//! What the agent remembers about its GPU probes across restarts, in `probes.json` (0600) in its
//! state directory: when the last probes started, and which probe images it pulled itself.
//!
//! **The rate limit** ([`ProbeLedger::next_start`]): at most one probe start per [`MIN_GAP`] and
//! at most [`MAX_PER_HOUR`] in any hour, whatever the reason (the first heartbeat, a change of
//! the facts or of the image, a `recheck`, a restart). A platform that put `recheck` in every
//! answer at a 1 s interval made the agent start 146 probes in 24 s (issue 29, item 4): each
//! probe's report is sent 200 ms after it ends, and the answer held the next `recheck`. A probe
//! that is due inside the window waits for it ([`crate::core::Probes`] sets a timer); it is
//! deferred, not lost. The start times are kept on disk, so a `restart` does not reset the limit.
//! They are wall-clock seconds: a start that lies in the future (the clock was set back) counts
//! as now, so a clock set back delays the next probe by at most [`MIN_GAP`].
//!
//! **The probe images** ([`ProbeImages`]): the image ids of the last two probes (the current one
//! and the previous one), and the references of the images the agent pulled itself and has not
//! removed. [`remove_old_images`] removes, by the reference it pulled, every image the agent
//! pulled that is neither the current nor the previous probe image, unless a container (any
//! container, gpum's or not) uses it; the engine's own refusal to remove an image a container
//! uses (removal is never forced) is a second line. An image the agent did not pull (loaded
//! with `docker load`, pulled by the owner, or already on the machine when the probe asked for
//! it) is never in that list, and a reference is removed, not an image id, so an image the
//! machine also holds under another name keeps that name. Nothing else is ever removed: no
//! prune, no volume.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use bollard::container::ListContainersOptions;
use bollard::image::RemoveImageOptions;
use gpum_host::Host;
use serde::{Deserialize, Serialize};

use super::{Docker, DockerError, timed};

/// Where the ledger is kept, in the state directory.
pub const FILE: &str = "probes.json";
/// The least time between two probe starts.
pub const MIN_GAP: Duration = Duration::from_secs(60);
/// The most probe starts in any hour.
pub const MAX_PER_HOUR: usize = 10;
/// How many pulled images the ledger follows; beyond that the oldest is forgotten, which
/// means it is never removed (the safe side).
pub const MAX_PULLED: usize = 32;
/// How many image ids count as "the current and the previous" probe image.
pub const KEEP: usize = 2;
const HOUR: u64 = 3600;

/// A probe image the agent pulled: the reference it pulled by and the image id it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulledImage {
    pub reference: String,
    pub id: String,
}

/// The probe images the agent keeps track of (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeImages {
    /// The image ids of the last probes, oldest first, at most [`KEEP`].
    #[serde(default)]
    pub recent: Vec<String>,
    /// What the agent pulled and has not removed, oldest first, at most [`MAX_PULLED`].
    #[serde(default)]
    pub pulled: Vec<PulledImage>,
}

impl ProbeImages {
    /// Records a probe that ran (or was to run) image `id`, pulled by this agent as `pulled`.
    pub fn used(&mut self, id: &str, pulled: Option<&str>) {
        self.recent.retain(|r| r != id);
        self.recent.push(id.to_string());
        let extra = self.recent.len().saturating_sub(KEEP);
        self.recent.drain(..extra);
        if let Some(reference) = pulled {
            self.pulled.retain(|p| p.reference != reference);
            self.pulled.push(PulledImage { reference: reference.to_string(), id: id.to_string() });
            let extra = self.pulled.len().saturating_sub(MAX_PULLED);
            self.pulled.drain(..extra);
        }
    }

    /// The pulled images that are neither the current nor the previous probe image.
    pub fn removable(&self) -> Vec<PulledImage> {
        self.pulled.iter().filter(|p| !self.recent.contains(&p.id)).cloned().collect()
    }

    fn forget(&mut self, reference: &str) {
        self.pulled.retain(|p| p.reference != reference);
    }
}

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeLedger {
    /// Unix seconds of the probe starts within the last hour, oldest first.
    #[serde(default)]
    pub starts: Vec<u64>,
    #[serde(default)]
    pub images: ProbeImages,
}

impl ProbeLedger {
    /// Reads `probes.json` from `state_dir`; a missing or unreadable file is an empty ledger.
    pub fn load(host: &dyn Host, state_dir: &Path) -> ProbeLedger {
        host.read(&state_dir.join(FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Writes it to `state_dir` (0600, atomically).
    pub fn save(&self, host: &dyn Host, state_dir: &Path) -> std::io::Result<()> {
        let json = serde_json::to_vec(self).expect("the ledger serializes");
        host.write_atomic(&state_dir.join(FILE), &json, 0o600)
    }

    /// `None` when a probe may start at `now` (unix seconds), else when it may: `gap` after the
    /// last start ([`MIN_GAP`] but in tests), and an hour after the start [`MAX_PER_HOUR`]
    /// starts back.
    pub fn next_start(&mut self, now: u64, gap: Duration) -> Option<u64> {
        self.forget_old(now);
        let after_last = self.starts.last().map(|l| l + gap.as_secs()).filter(|t| *t > now);
        let after_hour = (self.starts.len() >= MAX_PER_HOUR)
            .then(|| self.starts[self.starts.len() - MAX_PER_HOUR] + HOUR)
            .filter(|t| *t > now);
        after_last.into_iter().chain(after_hour).max()
    }

    /// Records a probe start at `now`.
    pub fn started(&mut self, now: u64) {
        self.forget_old(now);
        self.starts.push(now);
    }

    /// Drops the starts older than an hour and counts a start in the future as `now`.
    fn forget_old(&mut self, now: u64) {
        for s in &mut self.starts {
            *s = (*s).min(now);
        }
        self.starts.retain(|s| s + HOUR > now);
        self.starts.sort_unstable();
    }
}

/// Runs the probe `spec` describes, then records its image in `images` and removes the probe
/// images the agent pulled that are neither the current nor the previous one: what the service
/// does for every probe.
pub async fn probe_and_tidy(
    docker: &Docker,
    spec: &super::probe::ProbeSpec,
    images: &mut ProbeImages,
) -> super::probe::ProbeOutcome {
    let out = super::probe::run_probe_with(docker, spec).await;
    if let Some(id) = &out.image_id {
        images.used(id, out.pulled_reference.as_deref());
        remove_old_images(docker, images).await;
    }
    out
}

/// Removes the probe images `images` says the agent may remove (see the module docs); returns
/// the references removed. An image that is gone already is forgotten; one a container uses, or
/// that the engine refuses to remove, stays listed and is tried again after the next probe.
pub async fn remove_old_images(docker: &Docker, images: &mut ProbeImages) -> Vec<String> {
    let candidates = images.removable();
    if candidates.is_empty() {
        return Vec::new();
    }
    let Ok(api) = docker.api().await else { return Vec::new() };
    // Every container, running or not, gpum's or the owner's: an image any of them uses stays.
    let opts = ListContainersOptions::<String> { all: true, ..Default::default() };
    let in_use: HashSet<String> =
        match timed(async { api.list_containers(Some(opts)).await.map_err(DockerError::from) }).await {
            Ok(list) => list.into_iter().filter_map(|c| c.image_id).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot list containers; no probe image is removed now");
                return Vec::new();
            }
        };
    let mut removed = Vec::new();
    for p in candidates {
        if in_use.contains(&p.id) {
            tracing::debug!(image = %p.reference, "an old probe image is used by a container; it stays");
            continue;
        }
        // The reference must still name the image the agent pulled.
        match timed(async { api.inspect_image(&p.reference).await.map_err(DockerError::from) }).await {
            Ok(i) if i.id.as_deref() == Some(p.id.as_str()) => {}
            Ok(_) | Err(DockerError::NotFound(_)) => {
                images.forget(&p.reference);
                continue;
            }
            Err(e) => {
                tracing::debug!(image = %p.reference, error = %e, "cannot inspect an old probe image");
                continue;
            }
        }
        let opts = RemoveImageOptions { force: false, noprune: false };
        let reference = p.reference.clone();
        match timed(async { api.remove_image(&reference, Some(opts), None).await.map_err(DockerError::from) })
            .await
        {
            Ok(_) => {
                tracing::info!(image = %p.reference, id = %p.id, "removed an old probe image the agent pulled");
                images.forget(&p.reference);
                removed.push(p.reference);
            }
            Err(DockerError::NotFound(_)) => images.forget(&p.reference),
            Err(e) => {
                tracing::warn!(image = %p.reference, error = %e, "could not remove an old probe image; it stays")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    /// The scheduler against the platform of issue 29: `recheck` in every answer, an answer a
    /// second, for ten minutes. At most one start a minute, at most ten an hour.
    #[test]
    fn a_recheck_every_second_starts_at_most_one_probe_a_minute() {
        let mut l = ProbeLedger::default();
        let t0 = 1_800_000_000;
        let mut starts = Vec::new();
        for now in t0..t0 + 600 {
            if l.next_start(now, MIN_GAP).is_none() {
                l.started(now);
                starts.push(now - t0);
            }
        }
        assert_eq!(starts, (0..10).map(|i| i * 60).collect::<Vec<_>>());
        // The eleventh waits for the hour to pass since the first.
        assert_eq!(l.next_start(t0 + 600, MIN_GAP), Some(t0 + HOUR));
        assert_eq!(l.next_start(t0 + HOUR, MIN_GAP), None);
        // Inside the window a probe is told when it may run, not refused.
        let mut l = ProbeLedger::default();
        l.started(t0);
        assert_eq!(l.next_start(t0 + 1, MIN_GAP), Some(t0 + 60));
        assert_eq!(l.next_start(t0 + 59, MIN_GAP), Some(t0 + 60));
        assert_eq!(l.next_start(t0 + 60, MIN_GAP), None);
    }

    #[test]
    fn the_limit_survives_a_restart_and_a_clock_set_back() {
        let host = FakeHost::new();
        let dir = Path::new("/var/lib/gpum-agent");
        let t0 = 1_800_000_000;
        let mut l = ProbeLedger::default();
        l.started(t0);
        l.save(&host, dir).unwrap();
        assert_eq!(host.writes(), [dir.join(FILE)]);
        let mut again = ProbeLedger::load(&host, dir);
        assert_eq!(again.next_start(t0 + 10, MIN_GAP), Some(t0 + 60), "a restart does not reset the limit");
        // The clock went back a day: the start counts as now, not as a day ahead.
        assert_eq!(again.next_start(t0 - 86_400, MIN_GAP), Some(t0 - 86_400 + 60));
        assert!(ProbeLedger::load(&host, Path::new("/nonexistent")).starts.is_empty());
    }

    #[test]
    fn only_pulled_images_older_than_the_previous_one_are_removable() {
        let mut i = ProbeImages::default();
        i.used("sha256:a", Some("r/a@sha256:1"));
        i.used("sha256:b", Some("r/b@sha256:2"));
        assert!(i.removable().is_empty(), "current and previous stay");
        // An image the agent did not pull becomes current: `a` is now older than the previous.
        i.used("sha256:local", None);
        assert_eq!(i.removable(), [PulledImage { reference: "r/a@sha256:1".into(), id: "sha256:a".into() }]);
        i.forget("r/a@sha256:1");
        i.used("sha256:c", Some("r/c@sha256:3"));
        assert_eq!(i.recent, ["sha256:local", "sha256:c"]);
        assert_eq!(i.removable().iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["sha256:b"]);
        // The same image used again moves to the front; nothing the agent did not pull is listed.
        i.used("sha256:b", None);
        assert!(i.removable().is_empty());
        assert!(i.pulled.iter().all(|p| p.id != "sha256:local"));
        for n in 0..MAX_PULLED + 5 {
            i.used(&format!("sha256:{n}"), Some(&format!("r/x@sha256:{n}")));
        }
        assert_eq!(i.pulled.len(), MAX_PULLED);
    }
}
