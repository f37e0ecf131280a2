//! Metering (issue 46, "Money"): what a rental is charged, from what really ran.
//!
//! - **A run** is a span in which the agent reported the rental `running`: it opens at the
//!   heartbeat that first reports it `running`, and closes at the first heartbeat that reports
//!   it otherwise (or leaves it out), at the last heartbeat before the node went offline (a gap
//!   of [`OFFLINE_AFTER_SECS`] or more between two beats), or at the node's last heartbeat when
//!   the node is deleted. The desired state (listed, stopped, expired) never counts: only the
//!   agent's reports do. [`beat`] is that rule for one heartbeat.
//! - **Billable time** is the sum of a rental's runs, in whole seconds, times its GPUs
//!   (GPU-seconds). A run still open counts up to the node's last heartbeat.
//! - **The amount** is in integer minor units of the platform's currency: GPU-seconds × the
//!   price per GPU-hour (fixed when the rental was created) / 3600, **rounded to the nearest
//!   minor unit, halves up, once per rental** on its whole billable time ([`amount`]). Nothing
//!   is floating point.
//! - **Days and months** are UTC. A rental's share of a day is its cumulative amount at the
//!   day's end less that at its start, each rounded by the same rule, so the days of a rental
//!   add up to exactly its amount, and every total is a sum of exact integers
//!   ([`charge`], [`summarize`]).

use std::collections::BTreeMap;

pub use gpum_protocol::OFFLINE_AFTER_SECS;

/// Seconds in a day (UTC days have no leap seconds in Unix time).
pub const DAY_SECS: i64 = 86_400;

/// What one heartbeat does to the node's runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RunChange {
    /// The rental's open run ends at `at`.
    Close { rental: String, at: i64 },
    /// A run of the rental starts at `at`.
    Open { rental: String, at: i64 },
}

/// What a heartbeat tells the meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat<'a> {
    /// When it came (Unix seconds).
    pub now: i64,
    /// The node's previous heartbeat, if any.
    pub last_beat: Option<i64>,
    /// The beat is a handshake (`seq == 0`, `gpum-agent smoke`): it carries no reports, and
    /// their absence closes nothing.
    pub handshake: bool,
    /// The node's own rentals this beat reports `running`.
    pub running: &'a [&'a str],
}

/// The rule of one heartbeat: `open` are the node's rentals with a run open. Changes come
/// closes first, then opens, each in the order of the inputs.
pub fn beat(open: &[&str], b: Beat<'_>) -> Vec<RunChange> {
    let gap = b.last_beat.is_some_and(|l| b.now >= l.saturating_add(OFFLINE_AFTER_SECS as i64));
    let mut closes = Vec::new();
    let mut still_open: Vec<&str> = Vec::new();
    for &r in open {
        if gap {
            // The node was offline: the run ended at its last heartbeat before the gap.
            let at = b.last_beat.unwrap_or(b.now).min(b.now);
            closes.push(RunChange::Close { rental: r.to_owned(), at });
        } else if !b.running.contains(&r) && !b.handshake {
            closes.push(RunChange::Close { rental: r.to_owned(), at: b.now });
        } else {
            still_open.push(r);
        }
    }
    let mut opens = Vec::new();
    for (i, &r) in b.running.iter().enumerate() {
        if !still_open.contains(&r) && !b.running[..i].contains(&r) {
            opens.push(RunChange::Open { rental: r.to_owned(), at: b.now });
        }
    }
    closes.extend(opens);
    closes
}

/// A run as stored: its start and, once closed, its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub start: i64,
    pub end: Option<i64>,
}

impl Run {
    /// The span it counts: an open run up to `open_end` (the node's last heartbeat); never
    /// negative.
    pub fn span(&self, open_end: i64) -> (i64, i64) {
        let end = self.end.unwrap_or(open_end).max(self.start);
        (self.start, end)
    }
}

/// The amount, in minor units, of `gpu_seconds` at `price` minor units per GPU-hour: rounded
/// to the nearest minor unit, halves up. Exact (128-bit integers), saturating at `u64::MAX`.
pub fn amount(gpu_seconds: u64, price: u64) -> u64 {
    let n = gpu_seconds as u128 * price as u128;
    u64::try_from((n + 1800) / 3600).unwrap_or(u64::MAX)
}

/// One UTC day's share of a rental.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayShare {
    /// Days since 1970-01-01 (UTC).
    pub day: i64,
    pub gpu_seconds: u64,
    pub amount: u64,
}

/// What a rental is charged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Charge {
    pub gpu_seconds: u64,
    pub amount: u64,
    /// Its days, in order, each with some billable time.
    pub days: Vec<DayShare>,
}

/// A rental's charge: its runs (spans `(start, end)`, open ones already ended at the node's
/// last heartbeat by [`Run::span`]) on `gpus` GPUs at `price` minor units per GPU-hour (`None`:
/// unpriced, nothing charged but the time still counted). Overlapping spans count once.
pub fn charge(spans: &[(i64, i64)], gpus: u32, price: Option<u64>) -> Charge {
    // Seconds per day, overlaps merged.
    let mut sorted: Vec<(i64, i64)> = spans.iter().copied().filter(|(s, e)| e > s).collect();
    sorted.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (s, e) in sorted {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut per_day: BTreeMap<i64, u64> = BTreeMap::new();
    for (s, e) in merged {
        let mut t = s;
        while t < e {
            let day = t.div_euclid(DAY_SECS);
            let day_end = (day + 1) * DAY_SECS;
            let until = e.min(day_end);
            *per_day.entry(day).or_default() += (until - t) as u64;
            t = until;
        }
    }
    let price = price.unwrap_or(0);
    let mut cum_secs = 0u64;
    let mut cum_amount = 0u64;
    let mut days = Vec::with_capacity(per_day.len());
    for (day, secs) in per_day {
        let gs = secs.saturating_mul(gpus as u64);
        cum_secs = cum_secs.saturating_add(gs);
        let now_amount = amount(cum_secs, price);
        days.push(DayShare { day, gpu_seconds: gs, amount: now_amount - cum_amount });
        cum_amount = now_amount;
    }
    Charge { gpu_seconds: cum_secs, amount: cum_amount, days }
}

/// One rental, as [`summarize`] takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charged<'a> {
    pub server: &'a str,
    pub charge: &'a Charge,
}

/// A line of the totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sum {
    pub rentals: u64,
    pub gpu_seconds: u64,
    pub amount: u64,
}

impl Sum {
    fn add(&mut self, gpu_seconds: u64, amount: u64) {
        self.gpu_seconds = self.gpu_seconds.saturating_add(gpu_seconds);
        self.amount = self.amount.saturating_add(amount);
    }
}

/// The totals: per server (in the order first met), per UTC day and per month (`(year,
/// month)`), and overall.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    pub servers: Vec<(String, Sum)>,
    pub days: BTreeMap<i64, Sum>,
    pub months: BTreeMap<(i64, u32), Sum>,
    pub total: Sum,
}

/// Adds rentals' charges up. A rental counts in a day's or a month's `rentals` when it has
/// billable time in it.
pub fn summarize(rentals: &[Charged<'_>]) -> Summary {
    let mut s = Summary::default();
    for r in rentals {
        let c = r.charge;
        let i = match s.servers.iter().position(|(id, _)| id == r.server) {
            Some(i) => i,
            None => {
                s.servers.push((r.server.to_owned(), Sum::default()));
                s.servers.len() - 1
            }
        };
        s.servers[i].1.rentals += 1;
        s.servers[i].1.add(c.gpu_seconds, c.amount);
        s.total.rentals += 1;
        s.total.add(c.gpu_seconds, c.amount);
        let mut months_seen: Vec<(i64, u32)> = Vec::new();
        for d in &c.days {
            let day = s.days.entry(d.day).or_default();
            day.rentals += 1;
            day.add(d.gpu_seconds, d.amount);
            let (y, m, _) = civil(d.day);
            let month = s.months.entry((y, m)).or_default();
            if !months_seen.contains(&(y, m)) {
                months_seen.push((y, m));
                month.rentals += 1;
            }
            month.add(d.gpu_seconds, d.amount);
        }
    }
    s
}

/// The date `(year, month, day)` of a day since 1970-01-01 (proleptic Gregorian; H. Hinnant's
/// `civil_from_days`).
pub fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `YYYY-MM-DD` of a day since 1970-01-01.
pub fn day_name(days: i64) -> String {
    let (y, m, d) = civil(days);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM` of a month.
pub fn month_name((y, m): (i64, u32)) -> String {
    format!("{y:04}-{m:02}")
}

/// GPU-seconds as GPU-hours with `places` decimals, truncated (for display; sums use the
/// seconds).
pub fn gpu_hours(gpu_seconds: u64, places: u32) -> String {
    let whole = gpu_seconds / 3600;
    if places == 0 {
        return whole.to_string();
    }
    let scale = 10u64.pow(places);
    let frac = (gpu_seconds % 3600) as u128 * scale as u128 / 3600;
    format!("{whole}.{frac:0width$}", width = places as usize)
}

#[cfg(test)]
mod tests;
