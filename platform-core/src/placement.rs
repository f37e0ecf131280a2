//! A rental's placement (issue 33; issue 44, item 1): whether a checked request is placed on a
//! server now, until when, and on which of its GPUs.
//!
//! `gpum_platform::rentals::create` reads the server, the GPUs its rentals hold and how many it
//! lists, calls [`place`], and writes what it answers; `rentals::refused` turns each
//! [`Refusal`] into the API's error. What needs no server (the image's form, the numbers'
//! bounds, the environment) is checked before, by `rentals::check_request`.
//!
//! The rules, in the order they are applied (the first refusal is the answer):
//! the server is rentable (the one verdict of [`crate::rentable::verdict`]; inside a maintenance
//! window, the window is named); the end is at least the server's minimum rental time away and
//! at most [`MAX_RENTAL_SECS`]; the rental overlaps none of the maintenance windows its owner
//! planned (issue 46, [`crate::maintenance`]); CPU, memory and disk fit
//! the server; it lists fewer than [`limits::MAX_RENTALS_PER_NODE`] rentals; the GPUs asked by
//! UUID are the server's and held by no other rental, or the count asked is free (the first
//! free ones in the inventory's order are taken). Two rentals never share a GPU.

use gpum_protocol::{CreateRentalRequest, MaintenanceWindow, NodeSummary, RentableState, limits};

/// The longest rental: a year.
pub const MAX_RENTAL_SECS: u64 = 366 * 86_400;

/// Where and until when a rental is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The GPUs (UUIDs) it gets: the server's, held by no other rental, as many as asked.
    pub gpu_uuids: Vec<String>,
    /// Its end (Unix seconds).
    pub ends_at: u64,
}

/// Why a rental is not placed. Each maps to exactly one answer of the API
/// (`gpum_platform::rentals::refused`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The request names neither or both of `ends_at` and `duration_secs`, or neither or both
    /// of `gpus` and `gpu_uuids`, or names a GPU twice (`check_request` refuses it first; here
    /// so that the rule alone never gives a GPU twice).
    Malformed(&'static str),
    /// The server's verdict is not rentable; a quarantine's reason goes with it.
    NotRentable { state: RentableState, quarantine: Option<String> },
    /// The end is nearer than the server's minimum rental time.
    TooShort { min_rental_minutes: u32 },
    /// The end is further than [`MAX_RENTAL_SECS`].
    TooLong,
    /// The rental would overlap this maintenance window of the server's (issue 46): it is on
    /// now, or starts before the rental's end.
    Maintenance { window: MaintenanceWindow },
    /// More CPU than the server's cores.
    Cpu { cores: u32 },
    /// More memory than the server's.
    Memory { ram_mib: u64 },
    /// More disk than the server has free.
    Disk { disk_gib: u64 },
    /// The server lists its limit of rentals.
    Full { limit: usize },
    /// A GPU asked by UUID is not one of the server's.
    NotOwnGpu { uuid: String },
    /// A GPU asked by UUID is held by another rental.
    HeldGpu { uuid: String },
    /// Fewer free GPUs than the count asked.
    TooFewFree { free: usize, total: usize, asked: u32 },
}

/// Places `ask` on `node` at `now`: `held` are the GPUs its rentals hold now, `listed` how many
/// rentals it lists now. Pure: the caller read all of it.
pub fn place(
    node: &NodeSummary,
    held: &[String],
    listed: usize,
    ask: &CreateRentalRequest,
    now: u64,
) -> Result<Placement, Refusal> {
    if node.rentable.state == RentableState::Maintenance
        && let Some(w) = crate::maintenance::current(&node.maintenance, now)
    {
        return Err(Refusal::Maintenance { window: w.clone() });
    }
    if node.rentable.state != RentableState::Rentable {
        let quarantine = match (node.rentable.state, &node.quarantine) {
            (RentableState::Quarantined, Some(q)) => Some(q.reason.clone()),
            _ => None,
        };
        return Err(Refusal::NotRentable { state: node.rentable.state, quarantine });
    }
    let ends_at = match (ask.ends_at, ask.duration_secs) {
        (Some(t), None) => t,
        (None, Some(d)) => now.saturating_add(d),
        _ => return Err(Refusal::Malformed("ends_at, duration_secs: exactly one of them")),
    };
    let min = u64::from(node.min_rental_minutes) * 60;
    if ends_at < now.saturating_add(min) {
        return Err(Refusal::TooShort { min_rental_minutes: node.min_rental_minutes });
    }
    if ends_at > now.saturating_add(MAX_RENTAL_SECS) {
        return Err(Refusal::TooLong);
    }
    if let Some(w) = crate::maintenance::overlapping(&node.maintenance, now, ends_at) {
        return Err(Refusal::Maintenance { window: w.clone() });
    }
    let p = &node.inventory.public;
    if u64::from(ask.cpu_millis) > u64::from(p.cpu_cores) * 1000 {
        return Err(Refusal::Cpu { cores: p.cpu_cores });
    }
    if ask.memory_mib > p.ram_mib {
        return Err(Refusal::Memory { ram_mib: p.ram_mib });
    }
    if ask.disk_gib > p.disk_gib {
        return Err(Refusal::Disk { disk_gib: p.disk_gib });
    }
    if listed >= limits::MAX_RENTALS_PER_NODE {
        return Err(Refusal::Full { limit: limits::MAX_RENTALS_PER_NODE });
    }
    let own = &node.inventory.private.gpu_uuids;
    let gpu_uuids = match (ask.gpus, &ask.gpu_uuids) {
        (None, Some(uuids)) => {
            if let Some(u) = uuids.iter().find(|u| !own.contains(u)) {
                return Err(Refusal::NotOwnGpu { uuid: u.clone() });
            }
            if let Some(u) = uuids.iter().find(|u| held.contains(u)) {
                return Err(Refusal::HeldGpu { uuid: u.clone() });
            }
            if uuids.iter().enumerate().any(|(i, u)| uuids[..i].contains(u)) {
                return Err(Refusal::Malformed("gpu_uuids: each GPU once"));
            }
            uuids.clone()
        }
        (Some(n), None) => {
            let free: Vec<&String> = own.iter().filter(|u| !held.contains(u)).collect();
            if free.len() < n as usize {
                return Err(Refusal::TooFewFree { free: free.len(), total: own.len(), asked: n });
            }
            free.into_iter().take(n as usize).cloned().collect()
        }
        _ => {
            return Err(Refusal::Malformed(
                "gpus, gpu_uuids: exactly one of them (a count, or the GPUs' UUIDs)",
            ));
        }
    };
    Ok(Placement { gpu_uuids, ends_at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::{Quarantine, Rentable, VerificationState};
    use proptest::prelude::*;

    const NOW: u64 = 1_000_000;

    /// A rentable server: 8 cores, 64 GiB, 500 GiB free, GPUs `GPU-0`… (`gpus` of them), a
    /// minimum rental of an hour.
    fn server(gpus: usize) -> NodeSummary {
        let mut n = NodeSummary {
            id: "node-1".into(),
            online: true,
            verification: VerificationState::Verified,
            last_heartbeat_at: Some(NOW),
            registered_at: 1,
            agent_version: "1".into(),
            name: "n".into(),
            price_per_gpu_hour: Some(150),
            min_rental_minutes: 60,
            rentable: Rentable { state: RentableState::Rentable, since: None },
            ..Default::default()
        };
        n.inventory.public.cpu_cores = 8;
        n.inventory.public.ram_mib = 65_536;
        n.inventory.public.disk_gib = 500;
        n.inventory.private.gpu_uuids = (0..gpus).map(|i| format!("GPU-{i}")).collect();
        n
    }

    /// A request for `gpus` GPUs for two hours, well within the server.
    fn ask(gpus: u32) -> CreateRentalRequest {
        CreateRentalRequest {
            node_id: "node-1".into(),
            gpus: Some(gpus),
            cpu_millis: 1000,
            memory_mib: 1024,
            disk_gib: 10,
            shm_mib: 64,
            duration_secs: Some(7200),
            ..Default::default()
        }
    }

    fn uuids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_count_takes_the_first_free_gpus() {
        let held = uuids(&["GPU-0", "GPU-2"]);
        assert_eq!(
            place(&server(4), &held, 1, &ask(2), NOW),
            Ok(Placement { gpu_uuids: uuids(&["GPU-1", "GPU-3"]), ends_at: NOW + 7200 })
        );
        assert_eq!(
            place(&server(4), &held, 1, &ask(3), NOW),
            Err(Refusal::TooFewFree { free: 2, total: 4, asked: 3 })
        );
    }

    #[test]
    fn gpus_by_uuid_are_the_servers_and_free() {
        let by = |v: &[&str]| CreateRentalRequest { gpus: None, gpu_uuids: Some(uuids(v)), ..ask(1) };
        let held = uuids(&["GPU-1"]);
        assert_eq!(
            place(&server(2), &held, 0, &by(&["GPU-0"]), NOW).map(|p| p.gpu_uuids),
            Ok(uuids(&["GPU-0"]))
        );
        assert_eq!(
            place(&server(2), &held, 0, &by(&["GPU-0", "GPU-1"]), NOW),
            Err(Refusal::HeldGpu { uuid: "GPU-1".into() })
        );
        assert_eq!(
            place(&server(2), &held, 0, &by(&["GPU-1", "GPU-9"]), NOW),
            Err(Refusal::NotOwnGpu { uuid: "GPU-9".into() }),
            "not the server's comes before held"
        );
    }

    #[test]
    fn each_refusal() {
        let mut n = server(1);
        n.rentable.state = RentableState::Paused;
        assert_eq!(
            place(&n, &[], 0, &ask(1), NOW),
            Err(Refusal::NotRentable { state: RentableState::Paused, quarantine: None })
        );
        n.rentable.state = RentableState::Quarantined;
        n.quarantine = Some(Quarantine { reason: "left over".into(), since: 1, gpu_uuids: vec![] });
        assert_eq!(
            place(&n, &[], 0, &ask(1), NOW),
            Err(Refusal::NotRentable {
                state: RentableState::Quarantined,
                quarantine: Some("left over".into())
            })
        );
        let n = server(1);
        let short = CreateRentalRequest { duration_secs: Some(3599), ..ask(1) };
        assert_eq!(place(&n, &[], 0, &short, NOW), Err(Refusal::TooShort { min_rental_minutes: 60 }));
        let exact = CreateRentalRequest { duration_secs: None, ends_at: Some(NOW + 3600), ..ask(1) };
        assert_eq!(place(&n, &[], 0, &exact, NOW).map(|p| p.ends_at), Ok(NOW + 3600));
        let long = CreateRentalRequest { duration_secs: Some(MAX_RENTAL_SECS + 1), ..ask(1) };
        assert_eq!(place(&n, &[], 0, &long, NOW), Err(Refusal::TooLong));
        let year = CreateRentalRequest { duration_secs: Some(MAX_RENTAL_SECS), ..ask(1) };
        assert!(place(&n, &[], 0, &year, NOW).is_ok(), "the longest is allowed");
        let cpu = CreateRentalRequest { cpu_millis: 8001, ..ask(1) };
        assert_eq!(place(&n, &[], 0, &cpu, NOW), Err(Refusal::Cpu { cores: 8 }));
        let mem = CreateRentalRequest { memory_mib: 65_537, ..ask(1) };
        assert_eq!(place(&n, &[], 0, &mem, NOW), Err(Refusal::Memory { ram_mib: 65_536 }));
        let disk = CreateRentalRequest { disk_gib: 501, ..ask(1) };
        assert_eq!(place(&n, &[], 0, &disk, NOW), Err(Refusal::Disk { disk_gib: 500 }));
        assert_eq!(
            place(&n, &[], limits::MAX_RENTALS_PER_NODE, &ask(1), NOW),
            Err(Refusal::Full { limit: limits::MAX_RENTALS_PER_NODE })
        );
        let neither = CreateRentalRequest { duration_secs: None, ..ask(1) };
        assert!(matches!(place(&n, &[], 0, &neither, NOW), Err(Refusal::Malformed(_))));
        let both = CreateRentalRequest { gpu_uuids: Some(uuids(&["GPU-0"])), ..ask(1) };
        assert!(matches!(place(&n, &[], 0, &both, NOW), Err(Refusal::Malformed(_))));
    }

    fn window(id: &str, starts_at: u64, ends_at: u64) -> MaintenanceWindow {
        MaintenanceWindow { id: id.into(), starts_at, ends_at, created_at: 1 }
    }

    /// Issue 46: a rental that would overlap a window is refused naming it; one that ends at
    /// its start is placed; inside a window the verdict's refusal names the window too.
    #[test]
    fn a_maintenance_window_is_never_overlapped() {
        let mut n = server(1);
        n.maintenance =
            vec![window("mw-late", NOW + 9000, NOW + 9999), window("mw-1", NOW + 7200, NOW + 9000)];
        let ends_before = CreateRentalRequest { duration_secs: Some(7200), ..ask(1) };
        assert_eq!(place(&n, &[], 0, &ends_before, NOW).map(|p| p.ends_at), Ok(NOW + 7200));
        let overlaps = CreateRentalRequest { duration_secs: Some(7201), ..ask(1) };
        assert_eq!(
            place(&n, &[], 0, &overlaps, NOW),
            Err(Refusal::Maintenance { window: window("mw-1", NOW + 7200, NOW + 9000) })
        );
        let after = CreateRentalRequest { duration_secs: Some(3600), ..ask(1) };
        assert!(place(&n, &[], 0, &after, NOW + 9999).is_ok(), "after the last window");
        // Inside one: the store's verdict says `maintenance`, and the refusal names the window.
        n.rentable = gpum_protocol::Rentable { state: RentableState::Maintenance, since: Some(NOW + 7200) };
        assert_eq!(
            place(&n, &[], 0, &after, NOW + 8000),
            Err(Refusal::Maintenance { window: window("mw-1", NOW + 7200, NOW + 9000) })
        );
        // A too-short or too-long end is named first: the window is not the answer to fix.
        let short = CreateRentalRequest { duration_secs: Some(60), ..ask(1) };
        n.rentable.state = RentableState::Rentable;
        assert_eq!(place(&n, &[], 0, &short, NOW + 7100), Err(Refusal::TooShort { min_rental_minutes: 60 }));
    }

    /// A request: a count or UUIDs (some not the server's), a duration around the bounds, and
    /// CPU, memory and disk around the server's.
    fn request() -> impl Strategy<Value = CreateRentalRequest> {
        (
            prop_oneof![
                (1u32..10).prop_map(|n| (Some(n), None)),
                proptest::collection::vec(0usize..10, 1..6).prop_map(|v| {
                    let mut u: Vec<String> = v.into_iter().map(|i| format!("GPU-{i}")).collect();
                    u.dedup();
                    (None, Some(u))
                }),
            ],
            prop_oneof![0u64..7200, (MAX_RENTAL_SECS - 10)..(MAX_RENTAL_SECS + 10), 3600u64..MAX_RENTAL_SECS],
            6000u32..10_000,
            60_000u64..70_000,
            400u64..600,
        )
            .prop_map(|((gpus, gpu_uuids), d, cpu, mem, disk)| CreateRentalRequest {
                gpus,
                gpu_uuids,
                duration_secs: Some(d),
                cpu_millis: cpu,
                memory_mib: mem,
                disk_gib: disk,
                ..ask(1)
            })
    }

    proptest! {
        /// Whatever is asked: a placement gives only the server's GPUs, none held, none twice,
        /// exactly as many as asked, and ends within the server's minimum and the longest.
        #[test]
        fn a_placement_never_gives_a_held_or_foreign_gpu_nor_more_than_asked(
            gpus in 0usize..8,
            held in proptest::collection::vec(0usize..8, 0..8),
            listed in 0usize..70,
            req in request(),
            now in 0u64..2_000_000_000,
        ) {
            let node = server(gpus);
            let held: Vec<String> = held.into_iter().map(|i| format!("GPU-{i}")).collect();
            let asked = req.gpus.map_or_else(|| req.gpu_uuids.as_ref().unwrap().len(), |n| n as usize);
            match place(&node, &held, listed, &req, now) {
                Ok(p) => {
                    prop_assert_eq!(p.gpu_uuids.len(), asked);
                    for (i, u) in p.gpu_uuids.iter().enumerate() {
                        prop_assert!(node.inventory.private.gpu_uuids.contains(u), "{u} is the server's");
                        prop_assert!(!held.contains(u), "{u} is not held");
                        prop_assert!(!p.gpu_uuids[..i].contains(u), "{u} once");
                    }
                    prop_assert!(p.ends_at >= now + 3600);
                    prop_assert!(p.ends_at <= now + MAX_RENTAL_SECS);
                    prop_assert!(listed < limits::MAX_RENTALS_PER_NODE);
                    prop_assert!(u64::from(req.cpu_millis) <= 8000 && req.memory_mib <= 65_536);
                    prop_assert!(req.disk_gib <= 500);
                }
                Err(Refusal::TooLong) => {
                    prop_assert!(req.duration_secs.unwrap() > MAX_RENTAL_SECS);
                }
                Err(Refusal::TooShort { .. }) => prop_assert!(req.duration_secs.unwrap() < 3600),
                Err(Refusal::Malformed(m)) => {
                    let twice = req.gpu_uuids.as_ref().is_some_and(|v| v.iter().enumerate().any(|(i, u)| v[..i].contains(u)));
                    prop_assert!(twice, "a well-formed request: {}", m);
                }
                Err(_) => {}
            }
        }

        /// Issue 46: whatever the windows and the request, no placement overlaps a window, and
        /// a refusal for maintenance names a window that the rental would overlap.
        #[test]
        fn no_placement_ever_overlaps_a_maintenance_window(
            windows in proptest::collection::vec((0u64..40_000, 1u64..20_000), 0..6),
            req in request(),
            now in 0u64..30_000,
        ) {
            let mut node = server(8);
            node.maintenance = windows
                .iter()
                .enumerate()
                .map(|(i, &(s, len))| window(&format!("mw-{i}"), NOW + s, NOW + s + len))
                .collect();
            let now = NOW + now;
            if let Some(w) = crate::maintenance::current(&node.maintenance, now) {
                node.rentable = gpum_protocol::Rentable { state: RentableState::Maintenance, since: Some(w.starts_at) };
            }
            match place(&node, &[], 0, &req, now) {
                Ok(p) => {
                    for w in &node.maintenance {
                        prop_assert!(p.ends_at <= w.starts_at || w.ends_at <= now, "{:?} overlaps {:?}", (now, p.ends_at), w);
                    }
                }
                Err(Refusal::Maintenance { window: w }) => {
                    prop_assert!(node.maintenance.contains(&w));
                    prop_assert!(w.ends_at > now, "a window that is over refuses nothing");
                }
                Err(_) => {}
            }
        }

        /// A server that is not rentable places nothing, whatever else holds.
        #[test]
        fn a_server_not_rentable_places_nothing(
            state in proptest::sample::select(RentableState::ALL.to_vec()),
            req in request(),
        ) {
            let mut node = server(8);
            node.rentable.state = state;
            let r = place(&node, &[], 0, &req, NOW);
            if state != RentableState::Rentable {
                // (A `maintenance` verdict without a window now is the store's clock and the
                // core's disagreeing: still not rentable.)
                prop_assert!(matches!(r, Err(Refusal::NotRentable { .. })), "{:?}", r);
            }
        }
    }
}
