//! The machine's CPU load: the share of all its CPUs' time spent working since the last
//! reading, as sysinfo works it out from `/proc/stat`.
//!
//! Two sources, one figure:
//! - **The root cgroup's `cpu.stat`** (cgroup v2, Linux 5.8 and later), where there is one: the
//!   machine's user and system time in microseconds, against the time passed times the CPUs
//!   online. The kernel makes it by summing one small record per CPU; it costs about a tenth of
//!   `/proc/stat`, which also prints every CPU's line and every interrupt's count, and so grows
//!   with the size of the machine (GPU servers have a hundred CPUs or more). The agent reads it
//!   every heartbeat (`cargo xtask bench agent`).
//! - **`/proc/stat`'s first line** everywhere else: an older kernel, cgroup v1 alone, or a
//!   cgroup namespace whose root is not the machine's.
//!
//! Both count user, nice, system, irq and softirq time as work, and idle, iowait and steal time
//! as not. One difference: time a CPU spends running a virtual machine's guest is work in the
//! cgroup figure, and is left out of the work in `/proc/stat`'s, as sysinfo leaves it out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpum_host::Host;

/// Where cgroup v2 is mounted: alone (`/sys/fs/cgroup`), or beside v1 (`unified`).
const CGROUP2_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

/// The CPUs online now, as a list of ranges (`0-63,128-191`).
pub const CPUS_ONLINE: &str = "/sys/devices/system/cpu/online";

/// Machine-wide CPU counters: time spent working, and all time, in one unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// User, nice, system, irq and softirq time.
    pub work: u64,
    /// That, plus idle, iowait and steal time (and guest time, for `/proc/stat`).
    pub total: u64,
}

/// The `cpu ` line of a `/proc/stat` (the first), in clock ticks, summed as sysinfo sums them:
/// guest time is inside user and nice already, so it counts once. Kernels before 2.6.33 give
/// fewer than ten figures; the missing ones count as zero. `None` for anything else.
pub fn parse_cpu_times(stat: &[u8]) -> Option<CpuTimes> {
    let line = stat.split(|b| *b == b'\n').next()?.strip_prefix(b"cpu ")?;
    let mut f = [0u64; 10];
    let mut n = 0;
    for (slot, v) in f.iter_mut().zip(std::str::from_utf8(line).ok()?.split_ascii_whitespace()) {
        *slot = v.parse().ok()?;
        n += 1;
    }
    if n < 4 {
        return None;
    }
    let [user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice] = f;
    let work = [user.saturating_sub(guest), nice.saturating_sub(guest_nice), system, irq, softirq]
        .into_iter()
        .fold(0u64, u64::saturating_add);
    let total = [work, idle, iowait, steal, guest, guest_nice].into_iter().fold(0u64, u64::saturating_add);
    Some(CpuTimes { work, total })
}

/// User plus system time, in microseconds, of a cgroup v2 `cpu.stat` (`user_usec`, which holds
/// nice time, and `system_usec`, which holds irq and softirq time). Not `usage_usec`: for the
/// root cgroup, kernels from 5.8 until a 2024 fix also counted steal time in it.
pub fn parse_cgroup_work_usec(stat: &[u8]) -> Option<u64> {
    let (mut user, mut system) = (None, None);
    for line in std::str::from_utf8(stat).ok()?.lines() {
        let (key, value) = line.split_once(' ')?;
        let slot = match key {
            "user_usec" => &mut user,
            "system_usec" => &mut system,
            _ => continue,
        };
        *slot = Some(value.trim().parse::<u64>().ok()?);
        if let (Some(u), Some(s)) = (user, system) {
            return u.checked_add(s);
        }
    }
    None
}

/// How many CPUs a list such as `/sys/devices/system/cpu/online` names (`0-3,8,10-11` is 7);
/// `None` for an empty or malformed list.
pub fn parse_cpu_count(list: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(list).ok()?.trim();
    let mut n = 0u64;
    for part in text.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u64>().ok()?, hi.parse::<u64>().ok()?),
            None => {
                let one = part.parse::<u64>().ok()?;
                (one, one)
            }
        };
        n = n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    Some(n)
}

/// The share of CPU time spent working between two readings, in percent, as sysinfo works it
/// out (0 when the counters did not move).
pub fn cpu_busy_pct(before: CpuTimes, now: CpuTimes) -> f32 {
    let work = now.work.saturating_sub(before.work) as f32;
    let total = match now.total.saturating_sub(before.total) {
        0 => 1.0,
        t => t as f32,
    };
    (work / total * 100.0).min(100.0)
}

/// The root cgroup's `cpu.stat`, if this machine has one this process can see: a cgroup v2
/// directory (it has `cgroup.controllers`) that is the root of the whole hierarchy (it has no
/// `cgroup.type`, which every other cgroup has, including a cgroup namespace's root in a
/// container), with a `cpu.stat` that holds the two figures, and a list of CPUs online.
pub fn root_cgroup_cpu_stat(host: &dyn Host) -> Option<PathBuf> {
    parse_cpu_count(&host.read_kept(Path::new(CPUS_ONLINE)).ok()?)?;
    CGROUP2_MOUNTS.iter().map(Path::new).find_map(|dir| {
        let stat = dir.join("cpu.stat");
        let root = host.exists(&dir.join("cgroup.controllers")) && !host.exists(&dir.join("cgroup.type"));
        (root && host.read_kept(&stat).ok().and_then(|b| parse_cgroup_work_usec(&b)).is_some())
            .then_some(stat)
    })
}

/// Where the counters come from, chosen once, when the agent starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The root cgroup's `cpu.stat` at this path.
    RootCgroup(PathBuf),
    /// `/proc/stat`.
    ProcStat,
}

/// The CPU load between readings (see the module docs).
#[derive(Debug)]
pub struct CpuLoad {
    source: Source,
    /// The counters at the last reading, and (for the cgroup) when it was taken.
    last: Option<(CpuTimes, Duration)>,
}

impl CpuLoad {
    /// Chooses the source and takes the first reading, so that the first load is the average
    /// since this call.
    pub fn new(host: &dyn Host) -> CpuLoad {
        let source = root_cgroup_cpu_stat(host).map_or(Source::ProcStat, Source::RootCgroup);
        let mut load = CpuLoad { source, last: None };
        load.last = load.read(host);
        load
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The load since the last reading, in percent; `None` when the counters could not be read
    /// (the caller then asks sysinfo), and then the next load is again since the last good one.
    pub fn busy_pct(&mut self, host: &dyn Host) -> Option<f32> {
        let now = self.read(host)?;
        let before = self.last.replace(now).map_or(CpuTimes::default(), |(t, _)| t);
        Some(cpu_busy_pct(before, now.0))
    }

    /// The counters now. For the cgroup, `total` runs on from the last reading by the time
    /// passed times the CPUs online now; from boot at the first.
    fn read(&self, host: &dyn Host) -> Option<(CpuTimes, Duration)> {
        let clock = host.monotonic();
        match &self.source {
            Source::ProcStat => {
                host.read_kept(Path::new("/proc/stat")).ok().and_then(|b| parse_cpu_times(&b))
            }
            Source::RootCgroup(stat) => {
                let work = parse_cgroup_work_usec(&host.read_kept(stat).ok()?)?;
                let cpus = parse_cpu_count(&host.read_kept(Path::new(CPUS_ONLINE)).ok()?)?;
                let (before, since) = self.last.unwrap_or_default();
                let passed = u64::try_from(clock.saturating_sub(since).as_micros()).unwrap_or(u64::MAX);
                let total = before.total.saturating_add(passed.saturating_mul(cpus));
                Some(CpuTimes { work, total })
            }
        }
        .map(|t| (t, clock))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpum_host::fake::FakeHost;

    use super::*;

    #[test]
    fn cpu_counters_and_load_as_sysinfo_counts_them() {
        let stat = b"cpu  100 20 30 800 40 5 5 10 16 4\ncpu0 50 10 15 400 20 2 3 5 8 2\nintr 1 2\n";
        // work: (100-16) + (20-4) + 30 + 5 + 5 = 140; total: 140 + 800 + 40 + 10 + 16 + 4.
        assert_eq!(parse_cpu_times(stat), Some(CpuTimes { work: 140, total: 1010 }));
        // An old kernel's shorter line; a file that does not start with the total.
        assert_eq!(parse_cpu_times(b"cpu  1 2 3 4\n"), Some(CpuTimes { work: 6, total: 10 }));
        assert_eq!(parse_cpu_times(b"cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_cpu_times(b"cpu  1 2 x 4\n"), None);
        assert_eq!(parse_cpu_times(b"cpu  1 2\n"), None);
        let before = CpuTimes { work: 140, total: 1010 };
        assert_eq!(cpu_busy_pct(before, CpuTimes { work: 165, total: 1110 }), 25.0);
        assert_eq!(cpu_busy_pct(before, before), 0.0, "no time passed");
        assert_eq!(cpu_busy_pct(before, CpuTimes { work: 100, total: 900 }), 0.0, "counters reset");
    }

    #[test]
    fn the_cgroup_counters_are_user_plus_system_time() {
        // A root cgroup's file as Linux 6.1 writes it: usage_usec there also holds steal time.
        let stat = b"usage_usec 9000\nuser_usec 5000\nsystem_usec 2500\nnice_usec 100\n";
        assert_eq!(parse_cgroup_work_usec(stat), Some(7500));
        assert_eq!(parse_cgroup_work_usec(b"usage_usec 1\nuser_usec 5000\n"), None, "no system_usec");
        assert_eq!(parse_cgroup_work_usec(b"user_usec x\nsystem_usec 1\n"), None);
        assert_eq!(parse_cgroup_work_usec(b""), None);
    }

    #[test]
    fn a_cpu_list_counts_its_ranges() {
        assert_eq!(parse_cpu_count(b"0\n"), Some(1));
        assert_eq!(parse_cpu_count(b"0-1\n"), Some(2));
        assert_eq!(parse_cpu_count(b"0-3,8,10-11\n"), Some(7));
        assert_eq!(parse_cpu_count(b"0-63,128-191\n"), Some(128));
        assert_eq!(parse_cpu_count(b"\n"), None);
        assert_eq!(parse_cpu_count(b"3-1\n"), None);
        assert_eq!(parse_cpu_count(b"0-a\n"), None);
    }

    fn cgroup_host(dir: &str) -> Arc<FakeHost> {
        Arc::new(
            FakeHost::new()
                .file(CPUS_ONLINE, "0-3\n")
                .file(format!("{dir}/cgroup.controllers"), "cpuset cpu io memory pids\n")
                .file(format!("{dir}/cpu.stat"), "usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
                .file("/proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0\n"),
        )
    }

    fn set_work(host: &FakeHost, dir: &str, user: u64, system: u64) {
        let text = format!("usage_usec {}\nuser_usec {user}\nsystem_usec {system}\n", user + system);
        host.write_atomic(&Path::new(dir).join("cpu.stat"), text.as_bytes(), 0o444).unwrap();
    }

    /// The root cgroup wherever cgroup v2 is mounted; its load is the work over the time passed
    /// times the CPUs online, each reading since the last one.
    #[test]
    fn the_root_cgroup_gives_the_load_over_the_cpus_online() {
        for dir in CGROUP2_MOUNTS {
            let host = cgroup_host(dir);
            let mut load = CpuLoad::new(host.as_ref());
            assert_eq!(load.source(), &Source::RootCgroup(Path::new(dir).join("cpu.stat")), "{dir}");
            // 1 s passes on 4 CPUs: 4,000,000 us, of which 1,000,000 working.
            host.advance(Duration::from_secs(1));
            set_work(&host, dir, 600_000, 400_000);
            assert_eq!(load.busy_pct(host.as_ref()), Some(25.0), "{dir}");
            // 2 s more, all idle.
            host.advance(Duration::from_secs(2));
            assert_eq!(load.busy_pct(host.as_ref()), Some(0.0), "{dir}");
            // A CPU goes offline: 1 s on 3 CPUs, 1.5 s of work of 3.
            host.write_atomic(Path::new(CPUS_ONLINE), b"0-2\n", 0o444).unwrap();
            host.advance(Duration::from_secs(1));
            set_work(&host, dir, 1_600_000, 900_000);
            assert_eq!(load.busy_pct(host.as_ref()), Some(50.0), "{dir}");
            // Unreadable for a beat: no figure, and the next is since the last good reading.
            host.remove_file(&Path::new(dir).join("cpu.stat")).unwrap();
            host.advance(Duration::from_secs(1));
            assert_eq!(load.busy_pct(host.as_ref()), None);
            set_work(&host, dir, 2_200_000, 900_000);
            host.advance(Duration::from_secs(1));
            assert_eq!(load.busy_pct(host.as_ref()), Some(10.0), "{dir}: 0.6 s of 6 s");
        }
    }

    /// A cgroup that is not the hierarchy's root (a container's cgroup namespace), no cgroup v2,
    /// a root without `cpu.stat` (before Linux 5.8) or without a CPU list: `/proc/stat`.
    #[test]
    fn anything_but_the_root_cgroup_falls_back_to_proc_stat() {
        let namespaced = cgroup_host("/sys/fs/cgroup");
        namespaced.write_atomic(Path::new("/sys/fs/cgroup/cgroup.type"), b"domain\n", 0o644).unwrap();
        let v1_only =
            Arc::new(FakeHost::new().file(CPUS_ONLINE, "0-3\n").file("/proc/stat", "cpu  1 0 1 8\n"));
        let old_kernel = cgroup_host("/sys/fs/cgroup");
        old_kernel.remove_file(Path::new("/sys/fs/cgroup/cpu.stat")).unwrap();
        let no_list = cgroup_host("/sys/fs/cgroup");
        no_list.remove_file(Path::new(CPUS_ONLINE)).unwrap();
        for host in [namespaced, v1_only, old_kernel, no_list] {
            let mut load = CpuLoad::new(host.as_ref());
            assert_eq!(load.source(), &Source::ProcStat);
            host.write_atomic(Path::new("/proc/stat"), b"cpu  150 0 125 1025 0 0 0 0 0 0\n", 0o444).unwrap();
            assert!(load.busy_pct(host.as_ref()).is_some());
        }
    }

    /// On the machine that runs the tests, both sources see the same load over the same
    /// window, while one thread works and the rest of the machine does what it does.
    #[test]
    fn on_this_machine_both_sources_agree() {
        let host = gpum_host::RealHost::new();
        let mut cgroup = CpuLoad::new(&host);
        if *cgroup.source() == Source::ProcStat {
            eprintln!("skipped: no root cgroup v2 cpu.stat here ({:?})", CGROUP2_MOUNTS);
            return;
        }
        let mut proc_stat = CpuLoad { source: Source::ProcStat, last: None };
        proc_stat.last = proc_stat.read(&host);
        let start = std::time::Instant::now();
        let mut spin = 0u64;
        while start.elapsed() < Duration::from_millis(1500) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let (a, b) = (cgroup.busy_pct(&host).unwrap(), proc_stat.busy_pct(&host).unwrap());
        let cpus = parse_cpu_count(&std::fs::read(CPUS_ONLINE).unwrap()).unwrap() as f32;
        // One CPU of `cpus` spun the whole window (less what a hypervisor stole); /proc/stat
        // counts in 10 ms ticks.
        assert!(a >= 100.0 / cpus * 0.5, "the cgroup saw {a}% with one CPU of {cpus} busy");
        assert!((a - b).abs() <= 10.0, "cgroup {a}% against /proc/stat {b}%");
    }
}
