use super::*;
use proptest::prelude::*;

const OFF: i64 = OFFLINE_AFTER_SECS as i64;
/// No change.
const NONE: [RunChange; 0] = [];

fn b<'a>(now: i64, last: Option<i64>, running: &'a [&'a str]) -> Beat<'a> {
    Beat { now, last_beat: last, handshake: false, running }
}

fn open(r: &str, at: i64) -> RunChange {
    RunChange::Open { rental: r.into(), at }
}

fn close(r: &str, at: i64) -> RunChange {
    RunChange::Close { rental: r.into(), at }
}

#[test]
fn a_run_opens_at_the_first_running_report_and_closes_at_the_first_other() {
    // The first report of `running` opens a run; more of them change nothing.
    assert_eq!(beat(&[], b(100, Some(90), &["r"])), [open("r", 100)]);
    assert_eq!(beat(&["r"], b(110, Some(100), &["r"])), NONE);
    // A beat that reports it otherwise (or not at all) closes it then.
    assert_eq!(beat(&["r"], b(120, Some(110), &[])), [close("r", 120)]);
    // Only `running` counts: nothing opens for a rental reported pulling, starting, exited…
    assert_eq!(beat(&[], b(120, Some(110), &[])), NONE);
}

#[test]
fn an_offline_gap_is_not_billed() {
    // The node was silent for the offline threshold: the run ended at its last beat; it opens
    // again at this one if the rental still runs.
    let last = 1000;
    assert_eq!(beat(&["r"], b(last + OFF, Some(last), &["r"])), [close("r", last), open("r", last + OFF)]);
    assert_eq!(beat(&["r"], b(last + OFF + 500, Some(last), &[])), [close("r", last)]);
    // Just under the threshold is no gap.
    assert_eq!(beat(&["r"], b(last + OFF - 1, Some(last), &["r"])), NONE);
}

#[test]
fn a_handshake_closes_nothing_by_leaving_reports_out() {
    let hs = Beat { now: 200, last_beat: Some(195), handshake: true, running: &[] };
    assert_eq!(beat(&["r"], hs), NONE);
    // A gap still ends the run.
    let hs = Beat { now: 200 + OFF, last_beat: Some(200), handshake: true, running: &[] };
    assert_eq!(beat(&["r"], hs), [close("r", 200)]);
}

#[test]
fn a_rental_named_twice_opens_one_run() {
    assert_eq!(beat(&[], b(5, None, &["r", "r", "s"])), [open("r", 5), open("s", 5)]);
}

#[test]
fn amounts_round_to_the_nearest_minor_unit_halves_up() {
    // 150.00 an hour (15 000 minor units): an hour is exactly that.
    assert_eq!(amount(3600, 15_000), 15_000);
    assert_eq!(amount(1, 1800), 1); // 0.5 → 1
    assert_eq!(amount(1, 1799), 0); // 0.4997 → 0
    assert_eq!(amount(0, 1_000_000), 0);
    assert_eq!(amount(u64::MAX, u64::MAX), u64::MAX);
}

#[test]
fn a_hand_computed_rental_across_midnight() {
    // 2 GPUs at 150.00 RUB per GPU-hour. Runs: 23:00–01:00 (over midnight), then after an
    // offline gap 02:00–02:30.
    let midnight = 20_000 * DAY_SECS; // 2024-10-04 00:00 UTC
    let spans = [(midnight - 3600, midnight + 3600), (midnight + 7200, midnight + 9000)];
    let c = charge(&spans, 2, Some(15_000));
    assert_eq!(c.gpu_seconds, 2 * (7200 + 1800));
    assert_eq!(c.amount, 75_000); // 5 GPU-hours × 150.00
    assert_eq!(
        c.days,
        [
            DayShare { day: 19_999, gpu_seconds: 7200, amount: 30_000 },
            DayShare { day: 20_000, gpu_seconds: 10_800, amount: 45_000 },
        ]
    );
    assert_eq!(day_name(19_999), "2024-10-03");
    // Unpriced: the time counts, nothing is charged.
    let c = charge(&spans, 2, None);
    assert_eq!((c.gpu_seconds, c.amount), (18_000, 0));
    // Nothing ran: nothing charged, no day.
    assert_eq!(charge(&[], 4, Some(15_000)), Charge::default());
}

#[test]
fn an_open_run_counts_up_to_the_last_heartbeat() {
    assert_eq!(Run { start: 100, end: None }.span(160), (100, 160));
    assert_eq!(Run { start: 100, end: Some(130) }.span(160), (100, 130));
    // A clock moved back never makes time negative.
    assert_eq!(Run { start: 100, end: None }.span(50), (100, 100));
}

#[test]
fn dates_are_utc_and_proleptic_gregorian() {
    assert_eq!(civil(0), (1970, 1, 1));
    assert_eq!(civil(-1), (1969, 12, 31));
    assert_eq!(civil(19_782), (2024, 2, 29));
    assert_eq!(civil(11_016), (2000, 2, 29));
    assert_eq!(day_name(20_000), "2024-10-04");
    assert_eq!(month_name((2026, 3)), "2026-03");
    assert_eq!(gpu_hours(5400, 2), "1.50");
    assert_eq!(gpu_hours(1, 4), "0.0002");
    assert_eq!(gpu_hours(7199, 0), "1");
}

#[test]
fn the_summary_adds_rentals_up_per_server_day_and_month() {
    let d = 20_026 * DAY_SECS; // 2024-10-30
    let a = charge(&[(d, d + 3600)], 1, Some(10_000));
    let b2 = charge(&[(d + 2 * DAY_SECS - 1800, d + 2 * DAY_SECS + 1800)], 2, Some(20_000)); // over Oct/Nov
    let c = charge(&[], 1, Some(10_000));
    let s = summarize(&[
        Charged { server: "n1", charge: &a },
        Charged { server: "n2", charge: &b2 },
        Charged { server: "n1", charge: &c },
    ]);
    assert_eq!(s.total, Sum { rentals: 3, gpu_seconds: 3600 + 7200, amount: 10_000 + 40_000 });
    assert_eq!(s.servers[0], ("n1".into(), Sum { rentals: 2, gpu_seconds: 3600, amount: 10_000 }));
    assert_eq!(s.servers[1], ("n2".into(), Sum { rentals: 1, gpu_seconds: 7200, amount: 40_000 }));
    assert_eq!(s.months[&(2024, 10)], Sum { rentals: 2, gpu_seconds: 3600 + 3600, amount: 10_000 + 20_000 });
    assert_eq!(s.months[&(2024, 11)], Sum { rentals: 1, gpu_seconds: 3600, amount: 20_000 });
    assert_eq!(s.days.len(), 3);
}

/// One beat of a simulated node: seconds since the previous one, and which of three rentals
/// it reports running.
fn beats() -> impl Strategy<Value = Vec<(i64, [bool; 3])>> {
    proptest::collection::vec(((1i64..3 * OFF), proptest::array::uniform3(any::<bool>())), 1..60)
}

const IDS: [&str; 3] = ["a", "b", "c"];

proptest! {
    /// The runs that the rule keeps give each rental exactly the time between two beats in
    /// which it was reported running at the first and that were less than the offline
    /// threshold apart: the reference model, written the other way round.
    #[test]
    fn runs_bill_exactly_the_reported_running_time(seq in beats()) {
        let mut runs: Vec<(&str, i64, Option<i64>)> = Vec::new();
        let mut t = 1_000_000i64;
        let mut last: Option<i64> = None;
        let mut expected = [0i64; 3];
        let mut prev: Option<(i64, [bool; 3])> = None;
        for (dt, running) in &seq {
            t += dt;
            if let Some((pt, pr)) = prev {
                for i in 0..3 {
                    if pr[i] && t - pt < OFF {
                        expected[i] += t - pt;
                    }
                }
            }
            let names: Vec<&str> = IDS.iter().zip(running).filter(|(_, r)| **r).map(|(n, _)| *n).collect();
            let open_now: Vec<&str> = runs.iter().filter(|r| r.2.is_none()).map(|r| r.0).collect();
            for ch in beat(&open_now, b(t, last, &names)) {
                match ch {
                    RunChange::Open { rental, at } => {
                        prop_assert!(!runs.iter().any(|r| r.0 == rental && r.2.is_none()), "two open runs");
                        let id = IDS.iter().find(|x| **x == rental).unwrap();
                        runs.push((*id, at, None));
                    }
                    RunChange::Close { rental, at } => {
                        let r = runs.iter_mut().find(|r| r.0 == rental && r.2.is_none()).expect("an open run");
                        prop_assert!(at >= r.1);
                        r.2 = Some(at);
                    }
                }
            }
            last = Some(t);
            prev = Some((t, *running));
        }
        for (i, id) in IDS.iter().enumerate() {
            let spans: Vec<(i64, i64)> = runs.iter().filter(|r| r.0 == *id)
                .map(|r| Run { start: r.1, end: r.2 }.span(t)).collect();
            prop_assert_eq!(charge(&spans, 1, Some(0)).gpu_seconds as i64, expected[i], "{}", id);
        }
    }

    /// A rental's days add up to exactly its charge, and more time never costs less.
    #[test]
    fn days_add_up_to_the_charge(
        spans in proptest::collection::vec((0i64..10 * DAY_SECS, 0i64..2 * DAY_SECS), 0..8),
        gpus in 1u32..9,
        price in 0u64..10_000_000,
    ) {
        let spans: Vec<(i64, i64)> = spans.into_iter().map(|(s, l)| (s, s + l)).collect();
        let c = charge(&spans, gpus, Some(price));
        prop_assert_eq!(c.days.iter().map(|d| d.amount).sum::<u64>(), c.amount);
        prop_assert_eq!(c.days.iter().map(|d| d.gpu_seconds).sum::<u64>(), c.gpu_seconds);
        prop_assert_eq!(c.amount, amount(c.gpu_seconds, price));
        prop_assert!(c.gpu_seconds.is_multiple_of(u64::from(gpus)));
        let mut more = spans.clone();
        more.push((20 * DAY_SECS, 20 * DAY_SECS + 3600));
        prop_assert!(charge(&more, gpus, Some(price)).amount >= c.amount);
        let s = summarize(&[Charged { server: "n", charge: &c }, Charged { server: "m", charge: &c }]);
        prop_assert_eq!(s.total.amount, 2 * c.amount);
        prop_assert_eq!(s.days.values().map(|d| d.amount).sum::<u64>(), s.total.amount);
        prop_assert_eq!(s.months.values().map(|d| d.amount).sum::<u64>(), s.total.amount);
    }

    #[test]
    fn civil_dates_follow_each_other(day in -800_000i64..800_000) {
        let (y, m, d) = civil(day);
        let (y2, m2, d2) = civil(day + 1);
        prop_assert!((1..=12).contains(&m) && (1..=31).contains(&d));
        prop_assert!((y2, m2, d2) > (y, m, d));
        prop_assert!(d2 == d + 1 || (d2 == 1 && (m2 == m + 1 || (m == 12 && m2 == 1 && y2 == y + 1))));
    }
}
