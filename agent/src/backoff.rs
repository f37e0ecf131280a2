//! *How* the agent retries: capped exponential backoff with full jitter.
//!
//! *Whether* it retries is [`crate::client::classify`]'s decision; this module only spaces the
//! attempts. The cap is the heartbeat interval, so that once the platform is back the next
//! heartbeat succeeds within one interval, and full jitter (a uniform draw below the current
//! ceiling) spreads thousands of agents that lost the platform at the same moment.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    /// `base` is the first ceiling; it doubles per failure up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base: base.min(cap), cap, failures: 0 }
    }

    /// The backoff for a heartbeat interval: starts at an eighth of it (at least 250 ms),
    /// capped at the interval itself.
    pub fn for_interval(interval: Duration) -> Self {
        Backoff::new((interval / 8).max(Duration::from_millis(250)), interval)
    }

    pub fn set_cap(&mut self, cap: Duration) {
        self.cap = cap;
        self.base = self.base.min(cap);
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The ceiling for the next delay, without jitter.
    pub fn ceiling(&self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(20);
        self.base.saturating_mul(1u32 << exp).min(self.cap)
    }

    /// Records a failure and returns how long to wait: uniform in `[0, ceiling]`.
    pub fn fail(&mut self, rng: &mut impl Rng) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let ceil = self.ceiling();
        Duration::from_nanos(rng.gen_range(0..=ceil.as_nanos().min(u64::MAX as u128) as u64))
    }

    /// Records a success; the next failure starts from `base` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The interval with ±10 % jitter, so agents that started together drift apart.
pub fn jittered(interval: Duration, rng: &mut impl Rng) -> Duration {
    let f: f64 = rng.gen_range(0.9..=1.1);
    interval.mul_f64(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn grows_then_caps_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let mut rng = StdRng::seed_from_u64(7);
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            let d = b.fail(&mut rng);
            assert!(d <= b.ceiling());
            ceilings.push(b.ceiling().as_secs());
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 10, 10, 10, 10]);
        b.reset();
        b.fail(&mut rng);
        assert_eq!(b.ceiling(), Duration::from_secs(1));
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut b = Backoff::new(Duration::from_secs(8), Duration::from_secs(8));
        let ds: Vec<Duration> = (0..1000).map(|_| b.fail(&mut rng)).collect();
        assert!(ds.iter().any(|d| *d < Duration::from_secs(1)));
        assert!(ds.iter().any(|d| *d > Duration::from_secs(7)));
        assert!(ds.iter().all(|d| *d <= Duration::from_secs(8)));
    }

    #[test]
    fn never_overflows() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut b = Backoff::for_interval(Duration::from_secs(10));
        for _ in 0..10_000 {
            assert!(b.fail(&mut rng) <= Duration::from_secs(10));
        }
        let j = jittered(Duration::from_secs(10), &mut rng);
        assert!(j >= Duration::from_secs(9) && j <= Duration::from_secs(11));
    }
}

#[cfg(test)]
mod platform_outage {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// The platform is down for 60 intervals, then back. The delays are walked on a virtual
    /// clock (the run loop sleeps exactly what [`Backoff::fail`] returns, nothing else): the
    /// agent keeps trying without flooding, and is back within one interval.
    #[test]
    fn platform_down_for_many_intervals_then_back() {
        let interval = Duration::from_secs(10);
        let mut b = Backoff::for_interval(interval);
        let mut rng = StdRng::seed_from_u64(3);
        let back_at = interval * 60;
        let mut now = Duration::ZERO;
        let mut attempts = 0u32;
        while now < back_at {
            attempts += 1;
            now += b.fail(&mut rng);
        }
        assert!(now - back_at <= interval, "back {:?} after the platform", now - back_at);
        // Full jitter under a cap of one interval averages half an interval between attempts:
        // about 120 attempts in 60 intervals; never a flood, never giving up.
        assert!((60..=200).contains(&attempts), "{attempts} attempts");
        b.reset();
        assert_eq!(b.failures(), 0);
    }
}
