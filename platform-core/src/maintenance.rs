//! Scheduled maintenance (issue 46): the windows an owner plans for a server, `[starts_at,
//! ends_at)` in Unix seconds, and the rules they bring.
//!
//! - A window is planned only if its end is after its start, in the future, and at most
//!   [`limits::MAX_MAINTENANCE_AHEAD_SECS`] away, and the server holds fewer than
//!   [`limits::MAX_MAINTENANCE_WINDOWS_PER_NODE`] windows not yet over ([`check_new`]). Its start
//!   may be past: "from now until…".
//! - Inside a window the server is not rentable: the verdict is `maintenance`
//!   ([`crate::rentable::verdict`], by [`current`]).
//! - No rental is placed that would overlap a window ([`crate::placement::place`], by
//!   [`overlapping`]). A rental placed before the window was planned runs to its end (the
//!   immediate pause is the owner's way to take new rentals off at once).
//!
//! The cabinet's form sends the times as `datetime-local` text, read as UTC by [`parse_utc`].

use gpum_protocol::{MaintenanceWindow, limits};

/// Why a window is not planned. Each maps to one answer of the API and one text of the cabinet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowError {
    /// The end is not after the start.
    EndNotAfterStart,
    /// The end is not in the future.
    EndPassed,
    /// The end is further than [`limits::MAX_MAINTENANCE_AHEAD_SECS`] from now.
    TooFarAhead,
    /// The server holds [`limits::MAX_MAINTENANCE_WINDOWS_PER_NODE`] windows not yet over.
    TooMany,
}

impl WindowError {
    /// The API's text, naming the field.
    pub fn message(self) -> String {
        match self {
            WindowError::EndNotAfterStart => "ends_at: must be after starts_at".to_owned(),
            WindowError::EndPassed => "ends_at: must be in the future".to_owned(),
            WindowError::TooFarAhead => {
                format!("ends_at: at most {} days from now", limits::MAX_MAINTENANCE_AHEAD_SECS / 86_400)
            }
            WindowError::TooMany => format!(
                "the server holds its limit of {} maintenance windows: delete one first",
                limits::MAX_MAINTENANCE_WINDOWS_PER_NODE
            ),
        }
    }
}

/// Whether a window `[starts_at, ends_at)` may be planned at `now` on a server that holds
/// `planned` windows not yet over.
pub fn check_new(starts_at: u64, ends_at: u64, now: u64, planned: usize) -> Result<(), WindowError> {
    if ends_at <= starts_at {
        return Err(WindowError::EndNotAfterStart);
    }
    if ends_at <= now {
        return Err(WindowError::EndPassed);
    }
    if ends_at > now.saturating_add(limits::MAX_MAINTENANCE_AHEAD_SECS) {
        return Err(WindowError::TooFarAhead);
    }
    if planned >= limits::MAX_MAINTENANCE_WINDOWS_PER_NODE {
        return Err(WindowError::TooMany);
    }
    Ok(())
}

/// The window `now` is inside, if any (the one that started first).
pub fn current(windows: &[MaintenanceWindow], now: u64) -> Option<&MaintenanceWindow> {
    windows.iter().filter(|w| w.starts_at <= now && now < w.ends_at).min_by_key(|w| w.starts_at)
}

/// The first window (by start) that `[from, until)` overlaps, if any.
pub fn overlapping(windows: &[MaintenanceWindow], from: u64, until: u64) -> Option<&MaintenanceWindow> {
    windows.iter().filter(|w| w.starts_at < until && from < w.ends_at).min_by_key(|w| w.starts_at)
}

/// The days since 1970-01-01 of a date (proleptic Gregorian; H. Hinnant's `days_from_civil`,
/// the inverse of [`crate::metering::civil`]).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A `datetime-local` value (`YYYY-MM-DDTHH:MM`, optionally `:SS`; a space for the `T` too) read
/// as UTC, in Unix seconds; `None` for anything else, a date that does not exist, or a time
/// before 1970.
pub fn parse_utc(s: &str) -> Option<u64> {
    let s = s.trim();
    let (date, time) = s.split_once(['T', ' '])?;
    let num = |t: &str, len: usize| -> Option<u32> {
        (t.len() == len && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse().ok()).flatten()
    };
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?, 4)?, num(d.next()?, 2)?, num(d.next()?, 2)?);
    if d.next().is_some() {
        return None;
    }
    let mut t = time.split(':');
    let (h, min) = (num(t.next()?, 2)?, num(t.next()?, 2)?);
    let sec = match t.next() {
        Some(x) => num(x, 2)?,
        None => 0,
    };
    if t.next().is_some() || h > 23 || min > 59 || sec > 59 || !(1..=12).contains(&m) || day == 0 {
        return None;
    }
    let days = days_from_civil(i64::from(y), m, day);
    // A day past the month's end (`02-30`) comes back as another date.
    if crate::metering::civil(days) != (i64::from(y), m, day) {
        return None;
    }
    let secs = days * 86_400 + i64::from(h * 3600 + min * 60 + sec);
    u64::try_from(secs).ok()
}

/// Unix seconds as a `datetime-local` value in UTC, `YYYY-MM-DDTHH:MM` ([`parse_utc`]'s inverse
/// to the minute).
pub fn local_value(ts: u64) -> String {
    let (y, m, d) = crate::metering::civil((ts / 86_400) as i64);
    let s = ts % 86_400;
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}", s / 3600, s % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn w(id: &str, starts_at: u64, ends_at: u64) -> MaintenanceWindow {
        MaintenanceWindow { id: id.into(), starts_at, ends_at, created_at: 0 }
    }

    #[test]
    fn each_refusal_of_a_new_window() {
        let now = 1000;
        assert_eq!(check_new(500, 2000, now, 0), Ok(()), "a start in the past: from now on");
        assert_eq!(check_new(2000, 2000, now, 0), Err(WindowError::EndNotAfterStart));
        assert_eq!(check_new(3000, 2000, now, 0), Err(WindowError::EndNotAfterStart));
        assert_eq!(check_new(500, 1000, now, 0), Err(WindowError::EndPassed));
        let far = now + limits::MAX_MAINTENANCE_AHEAD_SECS;
        assert_eq!(check_new(now, far, now, 0), Ok(()));
        assert_eq!(check_new(now, far + 1, now, 0), Err(WindowError::TooFarAhead));
        let limit = limits::MAX_MAINTENANCE_WINDOWS_PER_NODE;
        assert_eq!(check_new(now, now + 1, now, limit - 1), Ok(()));
        assert_eq!(check_new(now, now + 1, now, limit), Err(WindowError::TooMany));
        assert_eq!(check_new(0, u64::MAX, now, 0), Err(WindowError::TooFarAhead));
        assert_eq!(check_new(0, u64::MAX, u64::MAX - 1, 0), Ok(()), "no overflow near the end of time");
    }

    #[test]
    fn current_and_overlapping_are_half_open() {
        let ws = [w("b", 300, 400), w("a", 100, 200)];
        assert_eq!(current(&ws, 99), None);
        assert_eq!(current(&ws, 100).map(|w| w.id.as_str()), Some("a"));
        assert_eq!(current(&ws, 199).map(|w| w.id.as_str()), Some("a"));
        assert_eq!(current(&ws, 200), None, "the end is outside");
        assert_eq!(overlapping(&ws, 0, 100), None, "ending at its start is before it");
        assert_eq!(overlapping(&ws, 0, 101).map(|w| w.id.as_str()), Some("a"));
        assert_eq!(overlapping(&ws, 200, 300), None, "between the two");
        assert_eq!(overlapping(&ws, 150, 1000).map(|w| w.id.as_str()), Some("a"), "the first by start");
        assert_eq!(overlapping(&ws, 399, 1000).map(|w| w.id.as_str()), Some("b"));
        assert_eq!(overlapping(&[], 0, u64::MAX), None);
    }

    #[test]
    fn datetime_local_values_read_as_utc() {
        // 2026-12-06 23:50:00 UTC.
        assert_eq!(parse_utc("2026-12-06T23:50"), Some(1_796_601_000));
        assert_eq!(parse_utc(" 2026-12-06 23:50:00 "), Some(1_796_601_000));
        assert_eq!(parse_utc("1970-01-01T00:00"), Some(0));
        assert_eq!(parse_utc("2028-02-29T12:00").map(local_value).as_deref(), Some("2028-02-29T12:00"));
        for bad in [
            "",
            "2026-12-06",
            "2026-12-06T24:00",
            "2026-12-06T23:60",
            "2026-13-01T00:00",
            "2026-02-30T00:00",
            "2027-02-29T00:00",
            "2026-12-00T00:00",
            "26-12-06T00:00",
            "2026-12-06T1:00",
            "2026-12-06T10:00:00:00",
            "2026-12-06T10:00Z",
            "1969-12-31T23:59",
            "+026-12-06T10:00",
            "２026-12-06T10:00",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad:?}");
        }
        assert_eq!(local_value(1_796_601_000), "2026-12-06T23:50");
    }

    proptest! {
        /// Every minute from 1970 to 9999 is written and read back the same.
        #[test]
        fn a_value_reads_back_as_written(minutes in 0u64..4_194_172_800) {
            let ts = minutes * 60;
            prop_assert_eq!(parse_utc(&local_value(ts)), Some(ts));
        }

        /// What overlaps is exactly what shares a second with the window.
        #[test]
        fn overlapping_means_a_shared_second(s in 0u64..100, len in 1u64..50, from in 0u64..200, dur in 1u64..50) {
            let ws = [w("x", s, s + len)];
            let shared = (from..from + dur).any(|t| s <= t && t < s + len);
            prop_assert_eq!(overlapping(&ws, from, from + dur).is_some(), shared);
        }
    }
}
