//! Rentable, or exactly why not: one verdict per server, computed here only, which the admin
//! API (`NodeSummary::rentable`), the servers list and the server page all show.

use gpum_protocol::{NodeSummary, NvmlState, Rentable, RentableState, VerificationState};

/// Where the server's owner stands with the operator (`owners disable`/`enable`). The
/// operator's own servers belong to no owner and are always [`Owner::Enabled`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Enabled,
    /// Disabled at this time (unix seconds).
    Disabled {
        since: u64,
    },
}

/// The verdict on `n`, the first reason in this order: its owner disabled (since when), offline
/// (since its last heartbeat), quarantined by its agent (since when; the reason is
/// `n.quarantine`'s), no GPU or no driver, the GPU check failed, awaiting the operator's check
/// image, awaiting the check, no price, inside a maintenance window its owner planned (since its
/// start; issue 46), paused by the owner; else rentable.
/// `check_image_chosen`: the operator has set a probe image; `now` the time of the verdict. A
/// deleted server is not listed, so it has no verdict.
pub fn verdict(n: &NodeSummary, check_image_chosen: bool, owner: Owner, now: u64) -> Rentable {
    let state = if let Owner::Disabled { since } = owner {
        return Rentable { state: RentableState::OwnerDisabled, since: Some(since) };
    } else if !n.online {
        return Rentable { state: RentableState::Offline, since: n.last_heartbeat_at };
    } else if let Some(q) = &n.quarantine {
        return Rentable { state: RentableState::Quarantined, since: Some(q.since) };
    } else if no_gpu(n) {
        RentableState::NoGpu
    } else if n.verification == VerificationState::Failed {
        RentableState::CheckFailed
    } else if n.verification == VerificationState::AwaitingCheck {
        if check_image_chosen { RentableState::AwaitingCheck } else { RentableState::AwaitingOperator }
    } else if n.price_per_gpu_hour.is_none() {
        RentableState::NoPrice
    } else if let Some(w) = crate::maintenance::current(&n.maintenance, now) {
        return Rentable { state: RentableState::Maintenance, since: Some(w.starts_at) };
    } else if n.paused {
        RentableState::Paused
    } else {
        RentableState::Rentable
    };
    Rentable { state, since: None }
}

/// No GPU or no driver: NVML does not work (a node that sent no health yet counts as one whose
/// NVML is unknown, so not working), or the inventory lists no GPU.
pub fn no_gpu(n: &NodeSummary) -> bool {
    n.health.as_ref().is_none_or(|h| h.nvml != NvmlState::Ok) || n.inventory.public.gpus.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::{GpuPublic, Health, Rentable as V};

    /// A server that is rentable: online, NVML ok, one GPU, verified, priced, not paused.
    fn rentable() -> NodeSummary {
        let mut n = NodeSummary {
            id: "n".into(),
            online: true,
            verification: VerificationState::Verified,
            last_heartbeat_at: Some(100),
            registered_at: 1,
            agent_version: "1".into(),
            health: Some(Health { nvml: NvmlState::Ok, ..Default::default() }),
            name: "n".into(),
            price_per_gpu_hour: Some(150),
            min_rental_minutes: 60,
            ..Default::default()
        };
        n.inventory.public.gpus = vec![GpuPublic { model: "G".into(), vram_mib: 1024 }];
        n
    }

    fn quarantine() -> gpum_protocol::Quarantine {
        gpum_protocol::Quarantine {
            reason: "GPU GPU-1: 1 process left (pid 4242)".into(),
            since: 50,
            gpu_uuids: vec!["GPU-1".into()],
        }
    }

    /// The time of every verdict here.
    const NOW: u64 = 200;

    fn state(n: &NodeSummary, image: bool) -> RentableState {
        verdict(n, image, Owner::Enabled, NOW).state
    }

    /// A window around [`NOW`].
    fn window() -> gpum_protocol::MaintenanceWindow {
        gpum_protocol::MaintenanceWindow { id: "mw-1".into(), starts_at: 150, ends_at: 250, created_at: 1 }
    }

    #[test]
    fn each_reason_alone() {
        use RentableState::*;
        let n = rentable();
        assert_eq!(verdict(&n, true, Owner::Enabled, NOW), V { state: Rentable, since: None });
        // The check image matters only while a check is awaited.
        assert_eq!(state(&n, false), Rentable);

        let mut off = rentable();
        off.online = false;
        assert_eq!(verdict(&off, true, Owner::Enabled, NOW), V { state: Offline, since: Some(100) });
        off.last_heartbeat_at = None;
        assert_eq!(verdict(&off, true, Owner::Enabled, NOW), V { state: Offline, since: None });

        for nvml in [
            NvmlState::LibraryMissing,
            NvmlState::DriverLibraryMismatch,
            NvmlState::NoDevices,
            NvmlState::Error,
        ] {
            let mut m = rentable();
            m.health.as_mut().unwrap().nvml = nvml;
            assert_eq!(state(&m, true), NoGpu, "{nvml:?}");
        }
        let mut m = rentable();
        m.health = None;
        assert_eq!(state(&m, true), NoGpu, "no health reported yet");
        let mut m = rentable();
        m.inventory.public.gpus.clear();
        assert_eq!(state(&m, true), NoGpu, "NVML ok but no GPU listed");

        let mut m = rentable();
        m.verification = VerificationState::Failed;
        assert_eq!(state(&m, true), CheckFailed);

        let mut m = rentable();
        m.quarantine = Some(quarantine());
        assert_eq!(verdict(&m, true, Owner::Enabled, NOW), V { state: Quarantined, since: Some(50) });

        let mut m = rentable();
        m.verification = VerificationState::AwaitingCheck;
        assert_eq!(state(&m, false), AwaitingOperator);
        assert_eq!(state(&m, true), AwaitingCheck);

        let mut m = rentable();
        m.price_per_gpu_hour = None;
        assert_eq!(state(&m, true), NoPrice);

        let mut m = rentable();
        m.paused = true;
        assert_eq!(state(&m, true), Paused);

        // Issue 46: inside a window its owner planned, since the window's start; before and
        // after it, rentable.
        let mut m = rentable();
        m.maintenance = vec![window()];
        assert_eq!(verdict(&m, true, Owner::Enabled, NOW), V { state: Maintenance, since: Some(150) });
        assert_eq!(verdict(&m, true, Owner::Enabled, 149).state, Rentable);
        assert_eq!(verdict(&m, true, Owner::Enabled, 250).state, Rentable);

        // Issue 43, item 13: a disabled owner's server said "rentable".
        assert_eq!(
            verdict(&rentable(), true, Owner::Disabled { since: 70 }, NOW),
            V { state: OwnerDisabled, since: Some(70) }
        );
    }

    /// Every reason present at once, then removed one by one: each time the verdict is the
    /// next reason in the order of precedence.
    #[test]
    fn the_order_of_precedence() {
        use RentableState::*;
        let mut n = rentable();
        n.online = false;
        n.health = Some(Health { nvml: NvmlState::LibraryMissing, ..Default::default() });
        n.inventory.public.gpus.clear();
        n.verification = VerificationState::Failed;
        n.price_per_gpu_hour = None;
        n.paused = true;
        n.quarantine = Some(quarantine());
        n.maintenance = vec![window()];
        let mut seen = vec![verdict(&n, false, Owner::Disabled { since: 1 }, NOW).state];
        seen.push(state(&n, false));
        n.online = true;
        seen.push(state(&n, false));
        n.quarantine = None;
        seen.push(state(&n, false));
        n.health.as_mut().unwrap().nvml = NvmlState::Ok;
        seen.push(state(&n, false));
        n.inventory.public.gpus = rentable().inventory.public.gpus;
        seen.push(state(&n, false));
        n.verification = VerificationState::AwaitingCheck;
        seen.push(state(&n, false));
        seen.push(state(&n, true));
        n.verification = VerificationState::Verified;
        seen.push(state(&n, true));
        n.price_per_gpu_hour = Some(1);
        seen.push(state(&n, true));
        n.maintenance.clear();
        seen.push(state(&n, true));
        n.paused = false;
        seen.push(state(&n, true));
        assert_eq!(
            seen,
            [
                OwnerDisabled,
                Offline,
                Quarantined,
                NoGpu,
                NoGpu,
                CheckFailed,
                AwaitingOperator,
                AwaitingCheck,
                NoPrice,
                Maintenance,
                Paused,
                Rentable
            ]
        );
        // Every state is reached.
        for s in RentableState::ALL {
            assert!(seen.contains(s), "{s}");
        }
    }

    #[test]
    fn on_the_wire() {
        let v = serde_json::to_value(V { state: RentableState::AwaitingOperator, since: None }).unwrap();
        assert_eq!(v, serde_json::json!({"state": "awaiting_operator", "since": null}));
        let v = serde_json::to_value(V { state: RentableState::Offline, since: Some(7) }).unwrap();
        assert_eq!(v, serde_json::json!({"state": "offline", "since": 7}));
    }

    proptest::proptest! {
        /// Rentable exactly when no reason holds; a disabled owner comes before everything; the
        /// time given is the owner's, the last heartbeat's or the quarantine's, and only theirs.
        #[test]
        fn rentable_exactly_when_no_reason_holds(
            online: bool,
            nvml_ok: bool,
            has_gpu: bool,
            verification in proptest::sample::select(VerificationState::ALL.to_vec()),
            priced: bool,
            paused: bool,
            quarantined: bool,
            in_window: bool,
            image: bool,
            disabled in proptest::option::of(0u64..1000),
        ) {
            let mut n = rentable();
            n.online = online;
            n.health.as_mut().unwrap().nvml = if nvml_ok { NvmlState::Ok } else { NvmlState::Error };
            if !has_gpu {
                n.inventory.public.gpus.clear();
            }
            n.verification = verification;
            n.price_per_gpu_hour = priced.then_some(1);
            n.paused = paused;
            n.quarantine = quarantined.then(quarantine);
            // A window now, or one that ended at this very second (outside it).
            n.maintenance = vec![if in_window { window() } else { gpum_protocol::MaintenanceWindow { ends_at: NOW, ..window() } }];
            let owner = disabled.map_or(Owner::Enabled, |since| Owner::Disabled { since });
            let v = verdict(&n, image, owner, NOW);
            let clear = disabled.is_none()
                && online
                && !quarantined
                && nvml_ok
                && has_gpu
                && verification == VerificationState::Verified
                && priced
                && !in_window
                && !paused;
            proptest::prop_assert_eq!(v.state == RentableState::Rentable, clear, "{:?}", v);
            if let Some(since) = disabled {
                proptest::prop_assert_eq!(v.clone(), V { state: RentableState::OwnerDisabled, since: Some(since) });
            }
            let timed = matches!(
                v.state,
                RentableState::OwnerDisabled
                    | RentableState::Offline
                    | RentableState::Quarantined
                    | RentableState::Maintenance
            );
            proptest::prop_assert!(timed || v.since.is_none());
        }
    }
}
