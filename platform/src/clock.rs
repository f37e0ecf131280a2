//! The platform's clock.
//!
//! Join-code expiry and the 60-second offline rule depend on time, and tests must not wait for
//! them. `--test-clock-file F` (hidden, only in builds with the `test-knobs` feature) makes the clock the system time plus a number
//! of seconds read from `F` on every call; a missing or empty file means no offset. Tests write a
//! larger number to move the platform into the future. The same clock stamps the `Date` header,
//! so a test can also make the platform's clock look skewed to an agent. A file holding `=T`
//! stops the clock at Unix second `T` (issue 46: metering's sums, checked to the second).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Default)]
pub struct Clock {
    offset_file: Option<PathBuf>,
}

impl Clock {
    pub fn system() -> Self {
        Clock { offset_file: None }
    }

    pub fn with_offset_file(path: Option<PathBuf>) -> Self {
        Clock { offset_file: path }
    }

    fn offset_secs(&self) -> i64 {
        let Some(path) = &self.offset_file else { return 0 };
        std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse::<i64>().ok()).unwrap_or(0)
    }

    /// The stopped time a test set (`=T` in the file), if any.
    fn fixed_secs(&self) -> Option<u64> {
        let path = self.offset_file.as_ref()?;
        std::fs::read_to_string(path).ok()?.trim().strip_prefix('=')?.parse().ok()
    }

    /// Now, as a `SystemTime`.
    pub fn now_system(&self) -> SystemTime {
        if let Some(t) = self.fixed_secs() {
            return UNIX_EPOCH + Duration::from_secs(t);
        }
        let off = self.offset_secs();
        let base = SystemTime::now();
        if off >= 0 {
            base + Duration::from_secs(off.unsigned_abs())
        } else {
            base - Duration::from_secs(off.unsigned_abs())
        }
    }

    /// Now, in Unix seconds.
    pub fn now(&self) -> u64 {
        self.now_system().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_file_moves_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("clock");
        let c = Clock::with_offset_file(Some(f.clone()));
        let before = c.now();
        std::fs::write(&f, "3600\n").unwrap();
        let after = c.now();
        assert!((3599..=3601).contains(&(after - before)), "{before} -> {after}");
        std::fs::write(&f, "garbage").unwrap();
        assert!(c.now() < after);
        std::fs::write(&f, "=1800000000\n").unwrap();
        assert_eq!(c.now(), 1_800_000_000);
    }
}
