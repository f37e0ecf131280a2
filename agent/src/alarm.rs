//! The heartbeat loop's alarm clock: one wake-up at the deadline, not three.
//!
//! tokio's timer wheel does not wake a sleeper at its deadline directly when the deadline is
//! more than 64 ms away: it wakes at the start of the wheel slot that holds it (64 ms slots up
//! to 4 s away, 4 s slots up to 4 min away), moves the sleeper to a finer slot, and sleeps
//! again. A 10 s heartbeat interval therefore woke the agent three times per heartbeat, a 1 s
//! one twice. Waking a process that slept costs tens of microseconds of CPU on a virtual
//! machine (the scheduler, and caches that went cold meanwhile), as much as the heartbeat's own
//! work (`cargo xtask bench agent`). A `timerfd` armed for the deadline wakes the loop once,
//! through the same epoll the runtime already waits on.
//!
//! Where no timerfd can be made or armed, [`Alarm::until`] falls back to tokio's sleep, so the
//! loop never loses its clock.

use std::cell::Cell;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use tokio::io::unix::AsyncFd;
use tokio::time::{Instant, sleep_until};

/// A one-shot alarm on `CLOCK_MONOTONIC`, the clock tokio's `Instant` reads.
pub struct Alarm {
    fd: Option<AsyncFd<Fd>>,
    /// The deadline the timerfd is armed for, if it has not gone off yet.
    armed: Cell<Option<Instant>>,
}

struct Fd(TimerFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The workspace's one `unsafe` block. tokio asks the caller of `AsyncFd::register` to promise
/// that the descriptor stays open, and stays the same one, for as long as the `AsyncFd` lives:
/// `Fd` owns its `TimerFd` (which owns its `OwnedFd`) by value, never replaces it, and
/// `as_raw_fd` always returns that descriptor; it is closed only when the `AsyncFd` drops it.
#[allow(unsafe_code)]
fn register(fd: Fd) -> Option<AsyncFd<Fd>> {
    // SAFETY: see above.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

impl Alarm {
    /// An alarm; must be made inside the tokio runtime.
    pub fn new() -> Alarm {
        let fd = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC)
            .ok()
            .and_then(|t| register(Fd(t)));
        Alarm { fd, armed: Cell::new(None) }
    }

    /// Waits until `at`. Cancel-safe: a wait dropped before `at` and started again for the same
    /// `at` keeps the alarm as it was; a new `at` re-arms it.
    pub async fn until(&self, at: Instant) {
        let Some(fd) = &self.fd else { return sleep_until(at).await };
        if self.armed.get() != Some(at) {
            // Zero would disarm the timer: an alarm already due goes off after 1 ns.
            let wait = at.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1));
            let when = Expiration::OneShot(TimeSpec::from_duration(wait));
            if fd.get_ref().0.set(when, TimerSetTimeFlags::empty()).is_err() {
                self.armed.set(None);
                return sleep_until(at).await;
            }
            self.armed.set(Some(at));
        }
        loop {
            let Ok(mut ready) = fd.readable().await else { return sleep_until(at).await };
            match ready.get_inner().0.wait() {
                Ok(()) => {
                    // Read, so no longer readable: the next arming then waits without a read.
                    ready.clear_ready();
                    self.armed.set(None);
                    return;
                }
                Err(Errno::EAGAIN) => ready.clear_ready(),
                Err(_) => {
                    self.armed.set(None);
                    return sleep_until(at).await;
                }
            }
        }
    }
}

impl Default for Alarm {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goes off at its deadline (never before), once per arming; a wait dropped early and
    /// started again keeps the deadline; a new deadline replaces the old one.
    #[tokio::test]
    async fn goes_off_at_the_deadline_and_survives_a_dropped_wait() {
        let alarm = Alarm::new();
        assert!(alarm.fd.is_some(), "a timerfd on this kernel");

        let at = Instant::now() + Duration::from_millis(80);
        alarm.until(at).await;
        assert!(Instant::now() >= at);

        // Dropped before its deadline, then awaited again for the same deadline.
        let at = Instant::now() + Duration::from_millis(1000);
        let early = tokio::time::timeout(Duration::from_millis(20), alarm.until(at)).await;
        assert!(early.is_err(), "did not go off early");
        alarm.until(at).await;
        assert!(Instant::now() >= at);

        // A deadline in the past goes off at once; a later one replaces an earlier one.
        alarm.until(Instant::now() - Duration::from_millis(5)).await;
        let near = Instant::now() + Duration::from_millis(30);
        let _ = tokio::time::timeout(Duration::from_millis(1), alarm.until(near)).await;
        let far = Instant::now() + Duration::from_millis(120);
        alarm.until(far).await;
        assert!(Instant::now() >= far, "the later deadline replaced the earlier one");
    }
}
