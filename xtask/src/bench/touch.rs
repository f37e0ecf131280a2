//! The memory a steady heartbeat touches, and what touching memory after a sleep costs on the
//! machine at hand. On some VMs the second dwarfs every other cost: there, a heartbeat's time
//! follows how many pages it touches far more than how many instructions it runs.
//!
//! - [`per_beat`]: the kernel's accessed bits of the agent's pages are cleared
//!   (`/proc/<pid>/clear_refs`), one heartbeat passes, and `/proc/<pid>/smaps` says how much of
//!   each mapping was touched since (`Referenced`), grouped as the agent's own code, its own
//!   data (constants, vtables, statics), its private memory (heap, stacks, anonymous maps) and
//!   shared libraries. The libraries' figure is an upper bound: a page another process read
//!   through the page cache is marked referenced for all.
//! - [`idle_penalty`]: a thread of the bench touches one byte in each of 64 pages of its own,
//!   after sleeping 1 ms and after sleeping 1 s, and reads its own CPU time around the touch.
//!   The first is the touch with the memory warm; where the second is far above it, the host
//!   charges the guest for memory touched again after idling.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

/// KiB of each kind touched in one heartbeat (medians over the samples).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Touched {
    pub own_code: f64,
    pub own_data: f64,
    pub private: f64,
    pub libraries: f64,
}

impl Touched {
    pub fn total(&self) -> f64 {
        self.own_code + self.own_data + self.private + self.libraries
    }
}

/// What one beat of `pid` (whose executable is `binary`) touched, median of `samples` windows
/// of `beat` each. Each window is one heartbeat: the agent wakes once per beat.
pub fn per_beat(pid: u32, binary: &Path, samples: usize, beat: Duration) -> Result<Touched> {
    let binary = std::fs::canonicalize(binary).with_context(|| format!("{}", binary.display()))?;
    let binary = binary.to_str().context("the agent's path is not UTF-8")?;
    let mut all = Vec::with_capacity(samples);
    for _ in 0..samples {
        std::fs::write(format!("/proc/{pid}/clear_refs"), "1")
            .with_context(|| format!("/proc/{pid}/clear_refs cannot be written (it needs root)"))?;
        std::thread::sleep(beat);
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        all.push(parse_smaps(&smaps, binary));
    }
    let pick = |f: fn(&Touched) -> f64| crate::util::median(&mut all.iter().map(f).collect::<Vec<_>>());
    Ok(Touched {
        own_code: pick(|t| t.own_code),
        own_data: pick(|t| t.own_data),
        private: pick(|t| t.private),
        libraries: pick(|t| t.libraries),
    })
}

/// Sums `Referenced:` over the mappings of a `/proc/<pid>/smaps` text, by kind.
pub fn parse_smaps(smaps: &str, binary: &str) -> Touched {
    #[derive(Clone, Copy)]
    enum Kind {
        OwnCode,
        OwnData,
        Private,
        Library,
        Other,
    }
    let mut t = Touched::default();
    let mut kind = Kind::Other;
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let Some(first) = f.next() else { continue };
        if let Some(kib) = first.strip_prefix("Referenced:").map(|_| f.next()) {
            let kib: f64 = kib.and_then(|v| v.parse().ok()).unwrap_or(0.0);
            match kind {
                Kind::OwnCode => t.own_code += kib,
                Kind::OwnData => t.own_data += kib,
                Kind::Private => t.private += kib,
                Kind::Library => t.libraries += kib,
                Kind::Other => {}
            }
            continue;
        }
        // A mapping's header: `start-end perms offset dev inode [path]`.
        let is_header = first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        if !is_header {
            continue;
        }
        let perms = f.next().unwrap_or("");
        let path = f.nth(3).unwrap_or("");
        kind = if path == binary {
            if perms.contains('x') { Kind::OwnCode } else { Kind::OwnData }
        } else if path.is_empty() || path == "[heap]" || path.starts_with("[stack") {
            Kind::Private
        } else if path.starts_with('/') {
            Kind::Library
        } else {
            // [vdso], [vvar], [vsyscall]: the kernel's.
            Kind::Other
        };
    }
    t
}

/// The CPU time, in microseconds, that touching one byte in each of 64 pages takes a thread
/// after sleeping `idle`: the median of `samples`.
pub fn idle_penalty(idle: Duration, samples: usize) -> Result<f64> {
    const PAGES: usize = 64;
    let buf = vec![1u8; PAGES * 4096];
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        std::thread::sleep(idle);
        let t0 = thread_cpu()?;
        let mut sum = 0u64;
        for p in 0..PAGES {
            // `black_box` keeps each read in the build.
            sum += u64::from(std::hint::black_box(&buf)[p * 4096]);
        }
        let t1 = thread_cpu()?;
        std::hint::black_box(sum);
        times.push((t1 - t0).as_secs_f64() * 1e6);
    }
    Ok(crate::util::median(&mut times))
}

/// This thread's CPU time, to the nanosecond (`schedstat` moves only when the scheduler runs).
fn thread_cpu() -> Result<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(Duration::from(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d000000000-55d000010000 r--p 00000000 fe:00 42                         /opt/gpum/gpum-agent
Size:                 64 kB
Referenced:           12 kB
55d000010000-55d000100000 r-xp 00010000 fe:00 42                         /opt/gpum/gpum-agent
Size:                960 kB
Referenced:          700 kB
Anonymous:             0 kB
55d000200000-55d000240000 rw-p 00000000 00:00 0                          [heap]
Referenced:          160 kB
7f0000000000-7f0000100000 r-xp 00026000 fe:00 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
Referenced:          800 kB
7f0000200000-7f0000204000 rw-p 00000000 00:00 0 
Referenced:           16 kB
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Referenced:           28 kB
7ffc00100000-7ffc00102000 r-xp 00000000 00:00 0                          [vdso]
Referenced:            4 kB
";

    /// Each mapping's `Referenced` goes to its kind; the kernel's own maps count nowhere.
    #[test]
    fn smaps_referenced_is_summed_by_kind() {
        let t = parse_smaps(SMAPS, "/opt/gpum/gpum-agent");
        assert_eq!(t, Touched { own_code: 700.0, own_data: 12.0, private: 204.0, libraries: 800.0 });
        assert_eq!(t.total(), 1716.0);
        // Another binary's path makes the agent's mappings libraries.
        let other = parse_smaps(SMAPS, "/usr/bin/other");
        assert_eq!((other.own_code, other.libraries), (0.0, 1512.0));
    }

    /// On this machine: a thread that touches its pages right after a 1 ms sleep reads a
    /// positive CPU time; the clear-and-read cycle works on a real process (this one).
    #[test]
    fn the_probes_run_on_this_machine() {
        let warm = idle_penalty(Duration::from_millis(1), 3).unwrap();
        assert!(warm > 0.0 && warm.is_finite(), "{warm} us");
        let me = std::env::current_exe().unwrap();
        let Ok(t) = per_beat(std::process::id(), &me, 1, Duration::from_millis(10)) else {
            eprintln!("skipped: /proc/self/clear_refs cannot be written here (not root)");
            return;
        };
        // This test's own code ran inside the window: some of the binary was touched.
        assert!(t.own_code > 0.0 && t.private > 0.0, "{t:?}");
    }
}
