//! What the agent reports about the machine: the inventory (slow-changing facts, resent only
//! when their hash changes) and the metrics (sent with every heartbeat).
//!
//! Sources, and nothing else: NVML (GPUs, driver, CUDA), the root cgroup's `cpu.stat` or
//! `/proc/stat` (CPU load, [`crate::cpu`]), `/proc/meminfo` (RAM; sysinfo for the CPU's model and
//! count, and as the fallback),
//! `statvfs` of Docker's data root (disk), `/etc/os-release`, `/proc/sys/kernel/osrelease`, the
//! hostname (`uname(2)`), and the Docker engine's version from its socket. No process list, no
//! file of the owner's, no container contents.
//!
//! Without a driver NVML is missing; that is a state to report ([`NvmlState::LibraryMissing`],
//! "no driver"), not a reason to stop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpum_host::Host;
#[cfg(any(test, feature = "test-knobs"))]
use gpum_host::env;
use gpum_protocol::{
    GpuMetrics, GpuPublic, Inventory, Metrics, NvmlState, PrivateInventory, PublicInventory,
};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;

use crate::cpu::CpuLoad;

/// Where Docker keeps its data unless the engine says otherwise.
pub const DEFAULT_DOCKER_ROOT: &str = "/var/lib/docker";

/// The listing's disk figure is rounded down to this many GiB, so that ordinary churn of free
/// space does not count as an inventory change (the exact figure travels in the metrics).
pub const DISK_GRANULARITY_GIB: u64 = 10;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// `PRETTY_NAME` of an os-release file (quotes removed), else `NAME VERSION_ID`.
pub fn parse_os_release(text: &str) -> Option<String> {
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'').to_string();
        match k.trim() {
            "PRETTY_NAME" if !v.is_empty() => return Some(v),
            "NAME" => name = Some(v),
            "VERSION_ID" => version = Some(v),
            _ => {}
        }
    }
    match (name, version) {
        (Some(n), Some(v)) => Some(format!("{n} {v}")),
        (Some(n), None) => Some(n),
        _ => None,
    }
}

/// CUDA driver version as NVML gives it (`12040`) to text (`12.4`).
pub fn cuda_version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// NVML, loaded once and kept; retried now and then while it is missing, so that a driver
/// installed after the agent started is noticed without a restart.
struct NvmlHandle {
    nvml: Option<Nvml>,
    state: NvmlState,
    detail: Option<String>,
    lib_path: Option<String>,
}

impl NvmlHandle {
    fn load(lib_path: Option<String>) -> NvmlHandle {
        let mut h = NvmlHandle { nvml: None, state: NvmlState::LibraryMissing, detail: None, lib_path };
        h.retry();
        h
    }

    fn retry(&mut self) {
        let res = match &self.lib_path {
            Some(p) => Nvml::builder().lib_path(std::ffi::OsStr::new(p)).init(),
            None => Nvml::init(),
        };
        match res {
            Ok(n) => {
                self.state = match n.device_count() {
                    Ok(0) => NvmlState::NoDevices,
                    Ok(_) => NvmlState::Ok,
                    Err(e) => classify_nvml(&e),
                };
                self.detail = None;
                self.nvml = Some(n);
            }
            Err(e) => {
                self.state = classify_nvml(&e);
                self.detail = Some(e.to_string());
                self.nvml = None;
            }
        }
    }
}

fn classify_nvml(e: &NvmlError) -> NvmlState {
    match e {
        NvmlError::LibloadingError(_) | NvmlError::FailedToLoadSymbol(_) | NvmlError::DriverNotLoaded => {
            NvmlState::LibraryMissing
        }
        NvmlError::LibRmVersionMismatch => NvmlState::DriverLibraryMismatch,
        _ => NvmlState::Error,
    }
}

/// Gathers inventory and metrics. Keeps its handles (sysinfo, NVML) between heartbeats so each
/// one costs a few reads of `/proc` and a few NVML calls.
pub struct Gatherer {
    host: Arc<dyn Host>,
    sys: sysinfo::System,
    nvml: NvmlHandle,
    cpu_model: String,
    cpu_cores: u32,
    /// The running kernel's release: it changes only with a reboot, which restarts the agent,
    /// so it is read once.
    kernel: String,
    /// Docker's data root, for the disk figures.
    pub docker_root: PathBuf,
    calls: u64,
    /// `/etc/os-release` changes only with an upgrade; it is re-read every
    /// [`SLOW_FACTS_EVERY`] gatherings.
    os: Option<String>,
    /// Whether the data root's filesystem can limit a rental's disk (XFS with project quotas),
    /// from `/proc/self/mountinfo`, re-read with the os-release.
    disk_limit: Option<bool>,
    /// Free bytes of the data root at the last `metrics`, reused by the inventory.
    free_bytes: Option<u64>,
    /// RAM total and available, in bytes, from `/proc/meminfo` at the last `metrics` (or
    /// creation); `None` when it could not be read, and then sysinfo's figures are used.
    mem: Option<(u64, u64)>,
    /// The CPU counters at the last `metrics` (or creation), from which the next load figure is
    /// worked out; when they cannot be read, sysinfo's figure is used.
    cpu: CpuLoad,
    /// The last inventory digested, with its hash and probe key (see [`Gatherer::digest`]).
    digested: Option<(Inventory, String, String)>,
}

/// How many inventory gatherings between re-reads of slow-changing facts (NVML load retries
/// while it is missing, os-release): five minutes at the default interval.
pub const SLOW_FACTS_EVERY: u64 = 30;

/// The NVML library to load: the versioned name the driver installs (`libnvidia-ml.so.1`), the
/// same one the installer's audit loads. nvml-wrapper's default is the unversioned
/// `libnvidia-ml.so`, which only the driver's development package provides: an agent using it
/// saw no GPU on a machine whose audit had just found one (found in the test host: the node
/// registered without GPUs). Only a `test-knobs` build (and the unit tests) reads
/// `GPUM_NVML_LIB`, which names another library; a release build never reads it (issue 29).
pub fn nvml_lib(host: &dyn Host) -> String {
    #[cfg(any(test, feature = "test-knobs"))]
    if let Some(lib) = host.env(env::GPUM_NVML_LIB).filter(|s| !s.is_empty()) {
        return lib;
    }
    let _ = host;
    gpum_preflight::gpu::DEFAULT_NVML_LIB.to_string()
}

impl Gatherer {
    pub fn new(host: Arc<dyn Host>) -> Gatherer {
        let lib = Some(nvml_lib(host.as_ref()));
        let mut sys = sysinfo::System::new();
        sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
        let cpu_model = sys.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default();
        let cpu_cores = sys.cpus().len() as u32;
        sys.refresh_memory();
        let kernel = read_trim(host.as_ref(), "/proc/sys/kernel/osrelease").unwrap_or_default();
        let cpu = CpuLoad::new(host.as_ref());
        Gatherer {
            host,
            sys,
            nvml: NvmlHandle::load(lib),
            cpu_model,
            cpu_cores,
            kernel,
            docker_root: PathBuf::from(DEFAULT_DOCKER_ROOT),
            calls: 0,
            os: None,
            disk_limit: None,
            free_bytes: None,
            mem: None,
            cpu,
            digested: None,
        }
    }

    /// The inventory's hash ([`Inventory::hash`]) and probe key ([`probe_relevant`]). Both are
    /// kept with the inventory they were made from and reused while it stays the same, which is
    /// nearly always: serializing and hashing it every heartbeat was a tenth of the agent's
    /// work per heartbeat.
    pub fn digest(&mut self, inv: &Inventory) -> (String, String) {
        match &self.digested {
            Some((last, hash, key)) if last == inv => (hash.clone(), key.clone()),
            _ => {
                let (hash, key) = (inv.hash(), probe_relevant(inv));
                self.digested = Some((inv.clone(), hash.clone(), key.clone()));
                (hash, key)
            }
        }
    }

    /// RAM total and used, in bytes: `MemTotal` and `MemTotal - MemAvailable` from
    /// `/proc/meminfo` (sysinfo's definition of used), reading only the lines needed. sysinfo
    /// parses the whole file, which cost a sixth of a heartbeat; it remains the fallback.
    fn refresh_memory(&mut self) {
        self.mem = self.host.read_kept(Path::new("/proc/meminfo")).ok().and_then(|b| parse_meminfo(&b));
        if self.mem.is_none() {
            self.sys.refresh_memory();
        }
    }

    /// This machine's logical CPUs and memory in MiB, as the inventory reports them: what no
    /// rental's limits may exceed (the agent's `docker::rental::check_limits`).
    pub fn capacity(&self) -> (u32, u64) {
        (self.cpu_cores, self.total_memory() / MIB)
    }

    fn total_memory(&self) -> u64 {
        self.mem.map(|m| m.0).unwrap_or_else(|| self.sys.total_memory())
    }

    fn used_memory(&self) -> u64 {
        self.mem.map(|(t, a)| t.saturating_sub(a)).unwrap_or_else(|| self.sys.used_memory())
    }

    pub fn nvml_state(&self) -> NvmlState {
        self.nvml.state
    }

    /// Why NVML did not load, for `doctor` and logs.
    pub fn nvml_detail(&self) -> Option<&str> {
        self.nvml.detail.as_deref()
    }

    /// Free and total bytes where Docker keeps its data (or the nearest existing parent).
    fn disk(&self) -> (u64, u64) {
        let mut p: &Path = &self.docker_root;
        loop {
            if let Ok(s) = self.host.space(p) {
                return (s.avail_bytes, s.total_bytes);
            }
            match p.parent() {
                Some(parent) => p = parent,
                None => return (0, 0),
            }
        }
    }

    /// Whether the mount holding the data root enforces project quotas (the same rule as the
    /// installer's `disk_limit` check); `None` when mountinfo cannot be read.
    fn disk_limit(&self) -> Option<bool> {
        let text = self.host.read_to_string(Path::new("/proc/self/mountinfo")).ok()?;
        Some(
            gpum_preflight::parse::mountinfo::mount_for_in(&text, &self.docker_root)
                .is_some_and(|m| m.has_project_quota()),
        )
    }

    /// The inventory now. `docker_version` comes from the engine (the caller holds the socket).
    /// RAM is as of the last [`Gatherer::metrics`] (or creation); call that first for fresh
    /// figures, as the heartbeat does.
    pub fn inventory(&mut self, docker_version: Option<String>) -> Inventory {
        if self.os.is_none() || self.calls.is_multiple_of(SLOW_FACTS_EVERY) {
            self.os = self
                .host
                .read_to_string(Path::new("/etc/os-release"))
                .ok()
                .and_then(|t| parse_os_release(&t));
            self.disk_limit = self.disk_limit();
        }
        self.calls += 1;
        if self.nvml.nvml.is_none() && self.calls.is_multiple_of(SLOW_FACTS_EVERY) {
            self.nvml.retry();
        }
        let mut gpus = Vec::new();
        let mut gpu_uuids = Vec::new();
        let (mut driver_version, mut cuda_version) = (None, None);
        if let Some(n) = &self.nvml.nvml {
            driver_version = n.sys_driver_version().ok();
            cuda_version = n.sys_cuda_driver_version().ok().map(cuda_version_text);
            for i in 0..n.device_count().unwrap_or(0) {
                let Ok(d) = n.device_by_index(i) else { continue };
                gpus.push(GpuPublic {
                    model: d.name().unwrap_or_default(),
                    vram_mib: d.memory_info().map(|m| m.total / MIB).unwrap_or(0),
                });
                if let Ok(u) = d.uuid() {
                    gpu_uuids.push(u);
                }
            }
        }
        let free_gib = self.free_bytes.unwrap_or_else(|| self.disk().0) / GIB;
        Inventory {
            public: PublicInventory {
                gpus,
                cpu_model: self.cpu_model.clone(),
                cpu_cores: self.cpu_cores,
                ram_mib: self.total_memory() / MIB,
                disk_gib: free_gib / DISK_GRANULARITY_GIB * DISK_GRANULARITY_GIB,
                rental_disk_limit: self.disk_limit,
            },
            private: PrivateInventory {
                // The hostname can change while the agent runs: asked every time (one
                // `uname(2)` on the real host).
                hostname: self.host.hostname().unwrap_or_default(),
                gpu_uuids,
                driver_version,
                cuda_version,
                os: self.os.clone().unwrap_or_default(),
                kernel: self.kernel.clone(),
                docker_version,
                // The toolkit's version lives in dpkg's database, which the agent does not read;
                // a toolkit change still shows through the probe.
                toolkit_version: None,
            },
        }
    }

    /// The metrics now. CPU load is the average since the previous call.
    pub fn metrics(&mut self) -> Metrics {
        let cpu = match self.cpu.busy_pct(self.host.as_ref()) {
            Some(busy) => busy,
            None => {
                self.sys.refresh_cpu_usage();
                self.sys.global_cpu_usage()
            }
        };
        self.refresh_memory();
        let mut gpus = Vec::new();
        if let Some(n) = &self.nvml.nvml {
            for i in 0..n.device_count().unwrap_or(0) {
                let Ok(d) = n.device_by_index(i) else { continue };
                let mem = d.memory_info().ok();
                gpus.push(GpuMetrics {
                    index: i,
                    util_pct: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                    mem_used_mib: mem.as_ref().map(|m| m.used / MIB).unwrap_or(0),
                    mem_total_mib: mem.as_ref().map(|m| m.total / MIB).unwrap_or(0),
                    temp_c: d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                    power_w: d.power_usage().map(|mw| mw as f32 / 1000.0).unwrap_or(0.0),
                });
            }
        }
        let free = self.disk().0;
        self.free_bytes = Some(free);
        Metrics {
            cpu_load_pct: if cpu.is_finite() { (cpu * 10.0).round() / 10.0 } else { 0.0 },
            ram_used_mib: self.used_memory() / MIB,
            ram_total_mib: self.total_memory() / MIB,
            disk_free_gib: free / GIB,
            gpus,
        }
    }
}

/// `MemTotal` and `MemAvailable` of a `/proc/meminfo`, in bytes; stops reading once both are
/// found (they are the first and third lines).
pub fn parse_meminfo(text: &[u8]) -> Option<(u64, u64)> {
    let (mut total, mut avail) = (None, None);
    for line in text.split(|b| *b == b'\n') {
        let field = if line.starts_with(b"MemTotal:") {
            &mut total
        } else if line.starts_with(b"MemAvailable:") {
            &mut avail
        } else {
            continue;
        };
        let rest = std::str::from_utf8(&line[line.iter().position(|b| *b == b':')? + 1..]).ok()?;
        let mut parts = rest.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        let unit = match parts.next() {
            Some("kB") => 1024,
            None => 1,
            Some(_) => return None,
        };
        *field = Some(n.checked_mul(unit)?);
        if let (Some(t), Some(a)) = (total, avail) {
            return Some((t, a));
        }
    }
    None
}

fn read_trim(host: &dyn Host, path: &str) -> Option<String> {
    host.read_to_string(Path::new(path)).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The parts of the inventory whose change calls for a new GPU probe: GPUs, driver, OS, kernel,
/// Docker and toolkit. The hostname and the free disk are not among them.
pub fn probe_relevant(inv: &Inventory) -> String {
    let p = &inv.private;
    format!(
        "{:?}|{:?}|{:?}|{:?}|{}|{}|{:?}|{:?}",
        inv.public.gpus,
        p.gpu_uuids,
        p.driver_version,
        p.cuda_version,
        p.os,
        p.kernel,
        p.docker_version,
        p.toolkit_version
    )
}

/// What NVML says of one GPU, for the agent's GPU check after a rental (issue 33).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuUse {
    /// It answers, and no process runs on it.
    Free,
    /// It answers, and these processes (compute and graphics, by host pid) run on it.
    Busy(Vec<u32>),
    /// It does not answer (lost, or NVML itself failed); NVML's words.
    NoAnswer(String),
    /// NVML knows no GPU by this UUID on this machine (`NVML_ERROR_NOT_FOUND`; a GPU fallen off
    /// the bus answers `GPU_IS_LOST`, a [`GpuUse::NoAnswer`]): not one of this machine's GPUs,
    /// as a container of another installation on the same Docker engine can hold (issue 46).
    NotHere,
}

/// Asks NVML (the library `lib`, loaded for this call only, so that it reports what is true
/// now) for each of `uuids`: whether it answers and which processes run on it. Blocking; a few
/// NVML calls per GPU.
pub fn gpu_use(lib: &str, uuids: &[String]) -> Vec<(String, GpuUse)> {
    let nvml = match Nvml::builder().lib_path(std::ffi::OsStr::new(lib)).init() {
        Ok(n) => n,
        Err(e) => {
            let why = format!("NVML: {e}");
            return uuids.iter().map(|u| (u.clone(), GpuUse::NoAnswer(why.clone()))).collect();
        }
    };
    uuids
        .iter()
        .map(|u| {
            let found = nvml.device_by_uuid(u.as_str()).and_then(|d| {
                let mut pids: Vec<u32> = d.running_compute_processes()?.into_iter().map(|p| p.pid).collect();
                pids.extend(d.running_graphics_processes()?.into_iter().map(|p| p.pid));
                // It answers a plain question too (a GPU fallen off the bus fails here).
                d.memory_info()?;
                Ok(pids)
            });
            let state = match found {
                Ok(p) if p.is_empty() => GpuUse::Free,
                Ok(mut p) => {
                    p.sort_unstable();
                    p.dedup();
                    GpuUse::Busy(p)
                }
                Err(NvmlError::NotFound) => GpuUse::NotHere,
                Err(e) => GpuUse::NoAnswer(e.to_string()),
            };
            (u.clone(), state)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn meminfo_total_and_available() {
        let text = b"MemTotal:        8029388 kB\nMemFree:          400116 kB\nMemAvailable:    5311484 kB\nBuffers: 1 kB\n";
        assert_eq!(super::parse_meminfo(text), Some((8_029_388 * 1024, 5_311_484 * 1024)));
        // Without MemAvailable (kernels before 3.14) the caller falls back to sysinfo.
        assert_eq!(super::parse_meminfo(b"MemTotal: 10 kB\nMemFree: 5 kB\n"), None);
        assert_eq!(super::parse_meminfo(b"MemTotal: x kB\nMemAvailable: 1 kB\n"), None);
    }

    #[test]
    fn nvml_is_loaded_by_the_name_the_driver_installs() {
        use gpum_host::fake::FakeHost;
        assert_eq!(nvml_lib(&FakeHost::new()), "libnvidia-ml.so.1");
        assert_eq!(nvml_lib(&FakeHost::new()), gpum_preflight::gpu::DEFAULT_NVML_LIB);
        assert_eq!(nvml_lib(&FakeHost::new().env_var("GPUM_NVML_LIB", "/x/sim.so")), "/x/sim.so");
    }

    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn os_release_samples() {
        let ubuntu = "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\n";
        assert_eq!(parse_os_release(ubuntu).as_deref(), Some("Ubuntu 22.04.4 LTS"));
        assert_eq!(parse_os_release("NAME=Foo\nVERSION_ID=1\n").as_deref(), Some("Foo 1"));
        assert_eq!(parse_os_release(""), None);
        let debian = include_str!("../../tests/fixtures/preflight/debian12.os-release");
        assert_eq!(parse_os_release(debian).as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
    }

    #[test]
    fn cuda_text() {
        assert_eq!(cuda_version_text(12040), "12.4");
        assert_eq!(cuda_version_text(11080), "11.8");
    }

    #[test]
    fn cpu_load_is_the_share_of_work_since_the_last_metrics() {
        let host = Arc::new(
            FakeHost::new()
                .env_var("GPUM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
                .file("/proc/stat", "cpu  100 0 100 800 0 0 0 0 0 0\n")
                .space_at("/var/lib/docker", 10 * GIB),
        );
        let mut g = Gatherer::new(host.clone());
        // 300 ticks pass, 75 of them working.
        host.write_atomic(Path::new("/proc/stat"), b"cpu  150 0 125 1025 0 0 0 0 0 0\n", 0o444).unwrap();
        assert_eq!(g.metrics().cpu_load_pct, 25.0);
        // Then 100 more, all idle.
        host.write_atomic(Path::new("/proc/stat"), b"cpu  150 0 125 1125 0 0 0 0 0 0\n", 0o444).unwrap();
        assert_eq!(g.metrics().cpu_load_pct, 0.0);
    }

    /// The disk limit a rental can have is the installer's rule: the mount holding Docker's data
    /// root is XFS with project quotas; unknown when mountinfo cannot be read.
    #[test]
    fn the_inventory_says_whether_a_rentals_disk_can_be_limited() {
        let line = |fs: &str, opts: &str| {
            format!(
                "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                 40 22 8:16 / /var/lib/docker rw,relatime shared:9 - {fs} /dev/sdb rw,{opts}\n"
            )
        };
        for (mountinfo, want) in [
            (Some(line("xfs", "attr2,inode64,prjquota")), Some(true)),
            (Some(line("xfs", "attr2,inode64,pquota")), Some(true)),
            (Some(line("xfs", "attr2,inode64,noquota")), Some(false)),
            (Some(line("ext4", "errors=remount-ro")), Some(false)),
            (None, None),
        ] {
            let mut h = FakeHost::new()
                .env_var("GPUM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
                .space_at("/var/lib/docker", 10 * GIB);
            if let Some(m) = &mountinfo {
                h = h.file("/proc/self/mountinfo", m.as_str());
            }
            let mut g = Gatherer::new(Arc::new(h));
            assert_eq!(g.inventory(None).public.rental_disk_limit, want, "{mountinfo:?}");
        }
    }

    #[test]
    fn without_a_driver_it_reports_library_missing_and_still_gathers() {
        let host: Arc<dyn Host> = Arc::new(
            FakeHost::new()
                .env_var("GPUM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
                .file("/etc/os-release", "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\n")
                .file("/proc/sys/kernel/hostname", "box\n")
                .file("/proc/sys/kernel/osrelease", "6.8.0-40-generic\n")
                .space_at("/var/lib/docker", 123 * GIB),
        );
        let mut g = Gatherer::new(host);
        assert_eq!(g.nvml_state(), NvmlState::LibraryMissing);
        assert!(g.nvml_detail().is_some());
        let inv = g.inventory(Some("27.3.1".into()));
        assert!(inv.public.gpus.is_empty());
        assert_eq!(inv.public.disk_gib, 120);
        assert_eq!(inv.private.hostname, "box");
        assert_eq!(inv.private.kernel, "6.8.0-40-generic");
        assert_eq!(inv.private.os, "Ubuntu 22.04.4 LTS");
        assert!(inv.public.cpu_cores >= 1);
        assert!(inv.public.ram_mib > 0);
        let m = g.metrics();
        assert_eq!(m.disk_free_gib, 123);
        assert!(m.ram_total_mib > 0 && m.gpus.is_empty());
        // Same facts, same hash: nothing is resent.
        assert_eq!(inv.hash(), g.inventory(Some("27.3.1".into())).hash());
        let changed = g.inventory(Some("27.4.0".into()));
        assert_ne!(inv.hash(), changed.hash());
        assert_ne!(probe_relevant(&inv), probe_relevant(&changed));
    }
}
