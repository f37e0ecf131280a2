//! Whether the managed containers may have changed since the agent last listed them.
//!
//! Listing the managed containers every heartbeat cost the engine a list and the agent a round
//! trip, 48,000 instructions and a wake-up, every 10 s, for a list that changes when a lease
//! starts or ends. [`Watch`] holds the engine's event stream open instead, filtered on the
//! managed label (within the test scope, if any): any container event there (create, start,
//! die, rename, destroy, ...) marks the list stale, and so does the stream ending (the engine
//! stopped or restarted). The heartbeat lists again only when the list is stale, when the last
//! list failed, or when it is older than [`LIST_AT_LEAST_EVERY`], the safety net for a change the
//! stream could not report (an engine that hangs with the stream open).
//!
//! No change is lost between a list and the stream: each subscription asks the engine for the
//! events since one second before the stream was (re)opened or last ended (the engine keeps its
//! recent events for this), every list is taken after the flag was cleared, and a change during
//! a list sets the flag again for the next heartbeat.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::system::EventsOptions;
use futures_util::StreamExt;

use super::{Docker, MANAGED};

/// The longest a heartbeat reuses a list without asking the engine again.
pub const LIST_AT_LEAST_EVERY: Duration = Duration::from_secs(60);
/// The first wait before opening the stream again after it ended; it doubles up to
/// [`RESUBSCRIBE_MAX`] while the engine does not answer.
const RESUBSCRIBE_FIRST: Duration = Duration::from_secs(1);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(30);

/// The engine's event stream for the managed containers; stops when dropped.
#[derive(Debug)]
pub struct Watch {
    stale: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Opens the stream in a task of the current runtime. Until a first list is taken, the
    /// list is stale.
    pub fn start(docker: Arc<Docker>) -> Watch {
        let stale = Arc::new(AtomicBool::new(true));
        let task = tokio::spawn(follow(docker, stale.clone()));
        Watch { stale, task }
    }

    /// Whether the list may have changed; clears the mark, so take the list after this call.
    pub fn take_stale(&self) -> bool {
        self.stale.swap(false, Ordering::SeqCst)
    }

    /// Marks the list stale (a list that failed).
    pub fn set_stale(&self) {
        self.stale.store(true, Ordering::SeqCst);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Seconds since the epoch, one second early (the engine's event times are whole seconds).
fn since_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    secs.saturating_sub(1).to_string()
}

async fn follow(docker: Arc<Docker>, stale: Arc<AtomicBool>) {
    let mut since = since_now();
    let mut wait = RESUBSCRIBE_FIRST;
    loop {
        let opened = tokio::time::Instant::now();
        if let Ok(api) = docker.api().await {
            let mut filters: HashMap<String, Vec<String>> = docker.label_filter(MANAGED);
            filters.insert("type".into(), vec!["container".into()]);
            let opts = EventsOptions { since: Some(since.clone()), until: None, filters };
            let mut events = api.events(Some(opts));
            while let Some(event) = events.next().await {
                if event.is_err() {
                    break;
                }
                stale.store(true, Ordering::SeqCst);
            }
        }
        // The stream ended or never opened: what happened meanwhile is unknown.
        stale.store(true, Ordering::SeqCst);
        since = since_now();
        // A stream that lasted was a good one: the engine restarted, try again soon.
        if opened.elapsed() >= RESUBSCRIBE_MAX {
            wait = RESUBSCRIBE_FIRST;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RESUBSCRIBE_MAX);
    }
}
