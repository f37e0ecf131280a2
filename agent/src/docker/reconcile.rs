//! The reconciler: containers labelled `gpum.managed=true` that the platform does not know are
//! removed, slowly, and no other container is ever touched.
//!
//! Each heartbeat the agent sends the ids of the managed containers ([`list_managed`], stopped
//! ones included; listed again whenever the engine's event stream reports a change, see
//! [`super::watch`]); the platform answers with the ids it knows. The decision of
//! what to remove is the pure [`Reconciler::decide`], so it can be tested over thousands of
//! random rounds without an engine: a container goes only after it was unknown in
//! `min_beats` (3) answers in a row AND for at least `min_age` (60 s). A platform that is
//! briefly wrong (a restore from backup, a bug, a half-written answer) therefore destroys
//! nothing; one answer that knows the container again resets its count.
//!
//! Call `decide` only with the known set of a heartbeat the platform actually answered: a
//! failed heartbeat is no evidence, and must not count as a beat.
//!
//! "Labelled" means set on the container itself: a `gpum.managed` label that the container's
//! image also carries may have been inherited from the image (the engine merges them), so it is
//! no proof, and such a container is the owner's ([`super::Docker::is_marked`]).
//!
//! [`remove`] then stops the container with a grace period and removes it, after re-reading its
//! labels (and its image's) from the engine right before stopping and again before removing
//! (the id could have been reused, or the label list could be stale). It never removes images or volumes: a volume may hold data a lease
//! owns, and deleting it is the platform's explicit decision, not a side effect here. Each
//! removal is logged with name, id and reason, and returned for the next heartbeat's
//! `removed_containers`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bollard::container::StopContainerOptions;
use gpum_protocol::RemovedContainer;

use super::{Docker, DockerError, MANAGED};

/// Unknown answers in a row before a container may go.
pub const MIN_BEATS: u32 = 3;
/// How long a container must have been unknown before it may go.
pub const MIN_AGE: Duration = Duration::from_secs(60);
/// How long `docker stop` waits for the container to exit before killing it.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// The reason sent to the platform (which shows it in the owner's language) and logged.
pub const REASON_UNKNOWN: &str = gpum_protocol::REMOVAL_REASON_UNKNOWN;

/// A `gpum.managed=true` container as listed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManagedContainer {
    pub id: String,
    pub name: String,
    /// The engine's state: `created`, `running`, `exited`, `paused`, ...
    pub state: String,
}

/// Every container with `gpum.managed=true` set on the container itself, running or stopped.
pub async fn list_managed(docker: &Docker) -> Result<Vec<ManagedContainer>, DockerError> {
    Ok(docker
        .list_marked(MANAGED)
        .await?
        .into_iter()
        .map(|(id, name, state)| ManagedContainer { id, name, state })
        .collect())
}

#[derive(Debug, Clone, Copy)]
struct Unknown {
    since: Instant,
    beats: u32,
}

/// Counts, per container, how long the platform has not known it.
#[derive(Debug, Clone)]
pub struct Reconciler {
    min_beats: u32,
    min_age: Duration,
    unknown: HashMap<String, Unknown>,
}

impl Default for Reconciler {
    fn default() -> Self {
        Self::new(MIN_BEATS, MIN_AGE)
    }
}

impl Reconciler {
    pub fn new(min_beats: u32, min_age: Duration) -> Self {
        Self { min_beats: min_beats.max(1), min_age, unknown: HashMap::new() }
    }

    /// One answered heartbeat: `present` are the managed containers listed before it, `known`
    /// the ids the platform answered with, `now` when the answer came. Returns the containers to
    /// remove now. Pure: it reads nothing but its arguments and its own counts.
    pub fn decide(
        &mut self,
        present: &[ManagedContainer],
        known: &HashSet<String>,
        now: Instant,
    ) -> Vec<ManagedContainer> {
        // Forget containers that are gone, so a reused id starts from zero.
        let present_ids: HashSet<&str> = present.iter().map(|c| c.id.as_str()).collect();
        self.unknown.retain(|id, _| present_ids.contains(id.as_str()));

        let mut out = Vec::new();
        let mut seen = HashSet::new();
        for c in present {
            if !seen.insert(c.id.as_str()) {
                continue;
            }
            if known.contains(&c.id) {
                self.unknown.remove(&c.id);
                continue;
            }
            let u = self.unknown.entry(c.id.clone()).or_insert(Unknown { since: now, beats: 0 });
            u.beats += 1;
            if u.beats >= self.min_beats && now.saturating_duration_since(u.since) >= self.min_age {
                out.push(c.clone());
            }
        }
        out
    }

    /// How many answers in a row have not known `id` (0 when known or never seen).
    pub fn unknown_beats(&self, id: &str) -> u32 {
        self.unknown.get(id).map_or(0, |u| u.beats)
    }
}

/// Stops `c` (waiting `stop_grace` before the engine kills it), then removes it, if and only if
/// the engine still says it carries `gpum.managed=true`. Never removes images or volumes.
pub async fn remove(
    docker: &Docker,
    c: &ManagedContainer,
    stop_grace: Duration,
) -> Result<RemovedContainer, DockerError> {
    let api = docker.api().await?;
    docker.check_marked(&c.id, MANAGED).await?;
    let grace = stop_grace.as_secs().max(1) as i64;
    let stop = async {
        match api.stop_container(&c.id, Some(StopContainerOptions { t: grace })).await {
            // 304: already stopped.
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => {
                Ok(())
            }
            Err(e) => Err(DockerError::from(e)),
        }
    };
    // The engine itself waits `grace` before killing; give the call that long plus the usual.
    match tokio::time::timeout(stop_grace + super::CALL_TIMEOUT, stop).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(DockerError::Unavailable("the engine did not stop the container in time".into()));
        }
    }
    // Re-check right before removing: `force_remove_if` inspects the labels again.
    docker.force_remove_if(&c.id, MANAGED, false).await?;
    tracing::info!(container = %c.name, id = %c.id, reason = REASON_UNKNOWN, "removed managed container");
    Ok(RemovedContainer { id: c.id.clone(), name: c.name.clone(), reason: REASON_UNKNOWN.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(id: &str) -> ManagedContainer {
        ManagedContainer { id: id.into(), name: format!("n-{id}"), state: "running".into() }
    }

    fn known(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn needs_three_beats_and_sixty_seconds() {
        let t0 = Instant::now();
        let mut r = Reconciler::default();
        let present = [c("a"), c("b")];
        let k = known(&["b"]);
        assert!(r.decide(&present, &k, t0).is_empty());
        assert!(r.decide(&present, &k, t0 + Duration::from_secs(10)).is_empty());
        // Three beats, but only 20 s.
        assert!(r.decide(&present, &k, t0 + Duration::from_secs(20)).is_empty());
        assert_eq!(r.unknown_beats("a"), 3);
        assert!(r.decide(&present, &k, t0 + Duration::from_secs(59)).is_empty());
        assert_eq!(r.decide(&present, &k, t0 + Duration::from_secs(60)), vec![c("a")]);
        assert_eq!(r.unknown_beats("b"), 0);
    }

    #[test]
    fn age_alone_is_not_enough() {
        let t0 = Instant::now();
        let mut r = Reconciler::default();
        assert!(r.decide(&[c("a")], &known(&[]), t0).is_empty());
        assert!(r.decide(&[c("a")], &known(&[]), t0 + Duration::from_secs(600)).is_empty());
        assert_eq!(r.decide(&[c("a")], &known(&[]), t0 + Duration::from_secs(601)), vec![c("a")]);
    }

    #[test]
    fn known_again_resets() {
        let t0 = Instant::now();
        let mut r = Reconciler::default();
        let s = |n: u64| t0 + Duration::from_secs(n * 30);
        r.decide(&[c("a")], &known(&[]), s(0));
        r.decide(&[c("a")], &known(&[]), s(1));
        r.decide(&[c("a")], &known(&["a"]), s(2));
        assert_eq!(r.unknown_beats("a"), 0);
        assert!(r.decide(&[c("a")], &known(&[]), s(3)).is_empty());
        assert!(r.decide(&[c("a")], &known(&[]), s(4)).is_empty());
        // Third unknown beat in a row, but only 60 s since it became unknown again at s(3).
        assert_eq!(r.decide(&[c("a")], &known(&[]), s(5)), vec![c("a")]);
    }

    #[test]
    fn a_vanished_container_starts_over() {
        let t0 = Instant::now();
        let mut r = Reconciler::new(3, Duration::ZERO);
        r.decide(&[c("a")], &known(&[]), t0);
        r.decide(&[c("a")], &known(&[]), t0);
        r.decide(&[], &known(&[]), t0);
        assert!(r.decide(&[c("a")], &known(&[]), t0).is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Over random mixes and many rounds: a container is returned only if it was present and
        /// unknown in the last `min_beats` rounds in a row, spanning at least `min_age`; a known
        /// one is never returned.
        #[test]
        fn never_returns_a_known_or_young_container(
            rounds in proptest::collection::vec(
                (proptest::collection::vec((0u8..8, any::<bool>()), 0..8), 0u64..40),
                1..60,
            ),
        ) {
            let min_beats = 3;
            let min_age = Duration::from_secs(60);
            let mut r = Reconciler::new(min_beats, min_age);
            let t0 = Instant::now();
            let mut now = t0;
            // Per id: the times of its consecutive unknown rounds (reset when known or absent).
            let mut streak: HashMap<String, Vec<Instant>> = HashMap::new();
            for (mix, step) in rounds {
                now += Duration::from_secs(step);
                let mut present = Vec::new();
                let mut k = HashSet::new();
                for (id, is_known) in &mix {
                    let id = format!("c{id}");
                    if present.iter().any(|p: &ManagedContainer| p.id == id) { continue; }
                    present.push(c(&id));
                    if *is_known { k.insert(id); }
                }
                streak.retain(|id, _| present.iter().any(|p| &p.id == id));
                for p in &present {
                    if k.contains(&p.id) { streak.remove(&p.id); } else { streak.entry(p.id.clone()).or_default().push(now); }
                }
                let out = r.decide(&present, &k, now);
                for o in &out {
                    prop_assert!(!k.contains(&o.id), "returned a known container {}", o.id);
                    let s = &streak[&o.id];
                    prop_assert!(s.len() as u32 >= min_beats);
                    prop_assert!(now.duration_since(s[0]) >= min_age);
                }
                // And every container that qualifies is returned (the reconciler is not stuck).
                for (id, s) in &streak {
                    let due = s.len() as u32 >= min_beats && now.duration_since(s[0]) >= min_age;
                    prop_assert_eq!(due, out.iter().any(|o| &o.id == id), "id {}", id);
                }
            }
        }
    }
}
