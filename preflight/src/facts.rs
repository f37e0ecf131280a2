//! Gathering facts, read-only, through the seam.
//!
//! Every probe here reads: files, `stat`, `statvfs`, an `F_GETLK` lock query, one `GET /_ping`
//! on the Docker socket, NVML, and (only when a gpum unit file exists and systemd runs)
//! `systemctl show`. [`READ_ONLY_COMMANDS`] lists every command line prefix this module may run,
//! so a test can prove a dry run runs nothing else. Failures to probe become facts too (an
//! `Err` with the reason): the checks decide what they mean.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpum_common::agent_state::{self, AgentState};
use gpum_host::http::error_chain;
use gpum_host::{Cmd, FsSpace, Host, env};

use crate::gpu::{GpuFacts, GpuProbe};
use crate::parse::docker::{self, DaemonJson, Engine};
use crate::parse::dpkg::{self, Package};
use crate::parse::mountinfo::{self, Mount};
use crate::parse::os_release::{self, OsRelease};
use crate::parse::systemctl::{self, UnitState};
use crate::parse::toolkit_config::{self, ToolkitConfig};

/// Command-line prefixes [`gather`] may run. All of them only read.
pub const READ_ONLY_COMMANDS: &[&str] = &["systemctl show "];

pub const OS_RELEASE: &str = "/etc/os-release";
pub const OS_RELEASE_FALLBACK: &str = "/usr/lib/os-release";
pub const MOUNTINFO: &str = "/proc/self/mountinfo";
pub const DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// The NVIDIA Container Toolkit's settings (its hook's and runtime's).
pub const TOOLKIT_CONFIG: &str = "/etc/nvidia-container-runtime/config.toml";
pub const DEFAULT_DATA_ROOT: &str = "/var/lib/docker";
/// dockerd's pid file (its `--pidfile` default): its command line is read for `--live-restore`.
pub const DOCKERD_PID: &str = "/var/run/docker.pid";
/// Under Docker's data root: the state swarm mode keeps while the engine is in a swarm (moby's
/// `daemon/cluster`: `swarmDirName`, `stateFile`; `docker swarm leave` removes it).
pub const SWARM_STATE: &str = "swarm/docker-state.json";
pub const DPKG_STATUS: &str = "/var/lib/dpkg/status";
/// apt takes the frontend lock, dpkg the second, `apt-get update` the package lists' (held by
/// `apt-daily` on a freshly booted Ubuntu); any held means another install or update is running.
pub const DPKG_LOCKS: &[&str] =
    &["/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock"];
/// dpkg's journal: a file here (named by digits) is an operation dpkg began and did not finish
/// (it was killed, or the machine lost power); apt refuses to install until `dpkg --configure -a`
/// has replayed it.
pub const DPKG_UPDATES: &str = "/var/lib/dpkg/updates";
pub const DEFAULT_DOCKER_SOCKET: &str = env::DEFAULT_DOCKER_SOCKET;
pub const SYSTEMD_RUN_DIR: &str = "/run/systemd/system";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin";

/// Packages whose presence the checks and the plan care about.
pub const DOCKER_PACKAGES: &[&str] = &["docker-ce", "docker.io", "moby-engine", "docker-engine"];
pub const TOOLKIT_PACKAGE: &str = "nvidia-container-toolkit";
/// The oldest NVIDIA Container Toolkit without a known container escape: 1.17.7 and older let an
/// image's `LD_PRELOAD` reach a hook that runs as root on the host (CVE-2025-23266).
pub const TOOLKIT_MIN_SAFE_VERSION: &str = "1.17.8";
/// The container-escape CVE that older toolkits carry.
pub const TOOLKIT_ESCAPE_CVE: &str = "CVE-2025-23266";

/// What the caller asked for.
#[derive(Debug, Clone, Default)]
pub struct GatherOptions {
    /// The platform URL (`--server`), checked for reachability over TLS.
    pub server: Option<String>,
    /// `--offline`: make no network request at all.
    pub offline: bool,
    /// Extra trusted roots for the platform check (a test platform's CA), PEM.
    pub extra_roots_pem: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmpFacts {
    /// `$TMPDIR`, or `/tmp`.
    pub dir: PathBuf,
    pub from_env: bool,
    /// The mount holding `dir`; `None` when mountinfo could not be read.
    pub mount: Option<Mount>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFacts {
    /// Docker's data root: `data-root` from daemon.json, else `/var/lib/docker`.
    pub data_root: PathBuf,
    pub from_daemon_json: bool,
    /// The nearest existing directory at or above `data_root`, whose filesystem was measured.
    pub probed: PathBuf,
    pub space: Result<FsSpace, String>,
    /// The mount that holds the data root (`None`: mountinfo could not be read).
    pub mount: Option<Mount>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerFacts {
    /// `docker` found on `PATH` (not run).
    pub binary: Option<PathBuf>,
    /// The snap package is installed (`/snap/bin/docker`, or `docker` on `PATH` under `/snap/`).
    pub snap: bool,
    pub socket: PathBuf,
    /// The engine's version from `GET /_ping`, or why it could not be asked.
    pub engine: Result<Engine, String>,
    /// The installed Docker package and its version (`docker-ce`, `docker.io`, …).
    pub package: Option<(String, String)>,
    /// `/etc/docker/daemon.json`: `None` when absent, `Err` when unreadable or invalid.
    pub daemon_json: Option<Result<DaemonJson, String>>,
    /// The engine is in a swarm ([`SWARM_STATE`] exists under the data root). Swarm mode and
    /// `live-restore` exclude each other: with both, the swarm does not start at dockerd's next start.
    pub swarm: bool,
    /// `--live-restore` on the running dockerd's command line (`Some(false)` for
    /// `--live-restore=false`). dockerd refuses to start, or to reload, when a setting is both a
    /// flag and in `daemon.json`: with the flag, the file must not get the key.
    pub live_restore_flag: Option<bool>,
}

impl DockerFacts {
    /// `daemon.json` declares the `nvidia` runtime (what `nvidia-ctk runtime configure` writes).
    pub fn has_nvidia_runtime(&self) -> bool {
        self.daemon_json
            .as_ref()
            .and_then(|d| d.as_ref().ok())
            .is_some_and(|d| d.runtimes.iter().any(|r| r == "nvidia"))
    }
    /// `live-restore` is on: by dockerd's flag, else by `daemon.json`.
    pub fn has_live_restore(&self) -> bool {
        match self.live_restore_flag {
            Some(on) => on,
            None => self
                .daemon_json
                .as_ref()
                .and_then(|d| d.as_ref().ok())
                .is_some_and(|d| d.live_restore == Some(true)),
        }
    }
    /// The installer may put `"live-restore": true` into `daemon.json`: dockerd has no
    /// `--live-restore` flag (a key that is also a flag stops dockerd) and is in no swarm.
    pub fn may_set_live_restore(&self) -> bool {
        self.live_restore_flag.is_none() && !self.swarm
    }
    pub fn present(&self) -> bool {
        self.binary.is_some() || self.package.is_some() || self.engine.is_ok() || self.snap
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolkitFacts {
    /// `nvidia-ctk` on `PATH`.
    pub ctk: Option<PathBuf>,
    /// `nvidia-container-runtime` on `PATH`.
    pub runtime: Option<PathBuf>,
    /// The installed `nvidia-container-toolkit` package's version, as dpkg records it.
    pub package_version: Option<String>,
    /// The installed package is older than [`TOOLKIT_MIN_SAFE_VERSION`] (dpkg's version order):
    /// it has a known container escape ([`TOOLKIT_ESCAPE_CVE`]) and must be upgraded before gpum
    /// runs a probe through it. False when no package is installed.
    pub vulnerable: bool,
    /// [`TOOLKIT_CONFIG`], parsed (`None`: the file does not exist).
    pub config: Option<Result<ToolkitConfig, String>>,
}

impl ToolkitFacts {
    pub fn present(&self) -> bool {
        self.ctk.is_some() || self.package_version.is_some()
    }

    /// The toolkit's settings already are gpum's (see [`ToolkitConfig::is_gpums`]).
    pub fn config_is_gpums(&self) -> bool {
        matches!(&self.config, Some(Ok(c)) if c.is_gpums())
    }

    /// Whether an installed version `v` is older than [`TOOLKIT_MIN_SAFE_VERSION`].
    pub fn is_vulnerable_version(v: &str) -> bool {
        dpkg::compare_versions(v, TOOLKIT_MIN_SAFE_VERSION) == std::cmp::Ordering::Less
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockFacts {
    Free,
    Held {
        path: PathBuf,
        pid: i32,
    },
    /// Could not probe (e.g. not root: the lock files are 0640).
    Unknown(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExistingFacts {
    pub config: bool,
    pub unit: bool,
    pub binary: bool,
    /// `state.json`: `None` when absent.
    pub state: Option<Result<AgentState, String>>,
    /// `systemctl show gpum-agent`, when the unit exists and systemd runs.
    pub unit_state: Option<UnitState>,
}

impl ExistingFacts {
    pub fn any(&self) -> bool {
        self.config || self.unit || self.binary || self.state.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlatformFacts {
    Offline,
    NoServer,
    Reachable { url: String, status: u16 },
    Unreachable { url: String, error: String },
    BadUrl { url: String, error: String },
}

/// Everything the checks and the plan need to know.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub euid: u32,
    /// `/run/systemd/system` exists: systemd is PID 1 (sd_booted(3)).
    pub systemd: bool,
    pub os: Result<OsRelease, String>,
    pub arch: String,
    pub tmp: TmpFacts,
    pub disk: DiskFacts,
    pub gpu: GpuFacts,
    pub docker: DockerFacts,
    pub toolkit: ToolkitFacts,
    pub dpkg_lock: LockFacts,
    /// dpkg's unfinished operations ([`dpkg_interrupted`]).
    pub dpkg_interrupted: Vec<PathBuf>,
    pub existing: ExistingFacts,
    pub platform: PlatformFacts,
    /// `nft` on `PATH` (nftables): the agent's rentals need it.
    pub nft: Option<PathBuf>,
}

/// Asks the machine. Read-only; see the module docs.
pub fn gather(host: &dyn Host, opts: &GatherOptions, gpu: &dyn GpuProbe) -> Facts {
    let systemd = host.is_dir(Path::new(SYSTEMD_RUN_DIR));
    let mounts = host.read_to_string(Path::new(MOUNTINFO)).map(|t| mountinfo::parse(&t));
    let daemon_json = match host.read_to_string(Path::new(DAEMON_JSON)) {
        Ok(t) => Some(docker::parse_daemon_json(&t).map_err(|e| format!("{DAEMON_JSON}: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(format!("{DAEMON_JSON}: {e}"))),
    };
    let wanted: Vec<&str> = DOCKER_PACKAGES.iter().copied().chain([TOOLKIT_PACKAGE]).collect();
    // In pieces: the file is most of a megabyte, and holding it whole cost the dry run a
    // millisecond of fresh memory (docs/benchmarks.md, issue 45).
    let mut selected = dpkg::Selected::default();
    let read = host.read_pieces(Path::new(DPKG_STATUS), &mut |piece| selected.feed(piece, &wanted));
    let packages: Vec<Package> = read
        .map(|()| selected.finish(&wanted))
        .unwrap_or_default()
        .into_iter()
        .filter(Package::is_installed)
        .collect();
    let path_dirs: Vec<PathBuf> = host
        .env(env::PATH)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into())
        .split(':')
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    let which = |name: &str| path_dirs.iter().map(|d| d.join(name)).find(|p| host.exists(p));

    let disk = disk_facts(host, daemon_json.as_ref(), mounts.as_ref().ok().map(Vec::as_slice));
    let data_root = disk.data_root.clone();
    Facts {
        euid: host.euid(),
        systemd,
        os: read_os(host),
        arch: host.arch(),
        tmp: tmp_facts(host, mounts.as_ref().map_err(|e| e.to_string())),
        disk,
        gpu: gpu.probe(host),
        docker: docker_facts(host, &packages, which("docker"), daemon_json, data_root),
        toolkit: {
            let package_version = dpkg::installed_version(&packages, TOOLKIT_PACKAGE).map(str::to_string);
            ToolkitFacts {
                ctk: which("nvidia-ctk"),
                runtime: which("nvidia-container-runtime"),
                vulnerable: package_version.as_deref().is_some_and(ToolkitFacts::is_vulnerable_version),
                package_version,
                config: match host.read_to_string(Path::new(TOOLKIT_CONFIG)) {
                    Ok(t) => Some(toolkit_config::parse(&t).map_err(|e| format!("{TOOLKIT_CONFIG}: {e}"))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => Some(Err(format!("{TOOLKIT_CONFIG}: {e}"))),
                },
            }
        },
        dpkg_lock: lock_facts(host),
        dpkg_interrupted: dpkg_interrupted(host),
        nft: which("nft"),
        existing: existing_facts(host, systemd),
        platform: platform_facts(opts),
    }
}

fn read_os(host: &dyn Host) -> Result<OsRelease, String> {
    host.read_to_string(Path::new(OS_RELEASE))
        .or_else(|_| host.read_to_string(Path::new(OS_RELEASE_FALLBACK)))
        .map(|t| os_release::parse(&t))
        .map_err(|e| format!("{OS_RELEASE}: {e}"))
}

fn tmp_facts(host: &dyn Host, mounts: Result<&Vec<Mount>, String>) -> TmpFacts {
    let env_dir = env::tmpdir(host);
    let from_env = env_dir.is_some();
    let dir = env_dir.unwrap_or_else(|| PathBuf::from(env::DEFAULT_TMPDIR));
    match mounts {
        Ok(m) => TmpFacts { mount: mountinfo::mount_for(m, &dir).cloned(), dir, from_env, error: None },
        Err(e) => TmpFacts { dir, from_env, mount: None, error: Some(format!("{MOUNTINFO}: {e}")) },
    }
}

fn disk_facts(
    host: &dyn Host,
    daemon_json: Option<&Result<DaemonJson, String>>,
    mounts: Option<&[Mount]>,
) -> DiskFacts {
    let configured = daemon_json.and_then(|d| d.as_ref().ok()).and_then(|d| d.data_root.clone());
    let from_daemon_json = configured.is_some();
    let data_root = PathBuf::from(configured.unwrap_or_else(|| DEFAULT_DATA_ROOT.into()));
    let mut probed = data_root.clone();
    while !host.exists(&probed) {
        match probed.parent() {
            Some(p) => probed = p.to_path_buf(),
            None => break,
        }
    }
    let space = host.space(&probed).map_err(|e| format!("{}: {e}", probed.display()));
    let mount = mounts.and_then(|m| mountinfo::mount_for(m, &probed)).cloned();
    DiskFacts { data_root, from_daemon_json, probed, space, mount }
}

/// The Docker socket: `DOCKER_HOST` when it names a Unix socket, else the default.
fn docker_socket(host: &dyn Host) -> Result<PathBuf, String> {
    env::docker_host_socket(host).unwrap_or_else(|| Ok(PathBuf::from(DEFAULT_DOCKER_SOCKET)))
}

fn docker_facts(
    host: &dyn Host,
    packages: &[Package],
    binary: Option<PathBuf>,
    daemon_json: Option<Result<DaemonJson, String>>,
    data_root: PathBuf,
) -> DockerFacts {
    let socket = docker_socket(host);
    let engine = match &socket {
        Ok(s) => match host.unix_http_get(s, "/_ping") {
            Ok(r) if r.status == 200 => docker::parse_ping(&r.headers),
            Ok(r) => Err(format!("GET /_ping on {}: HTTP {}", s.display(), r.status)),
            Err(e) => Err(format!("{}: {e}", s.display())),
        },
        Err(e) => Err(e.clone()),
    };
    let snap = host.exists(Path::new("/snap/bin/docker"))
        || binary.as_ref().is_some_and(|b| b.starts_with("/snap/"));
    let package = DOCKER_PACKAGES
        .iter()
        .find_map(|n| dpkg::installed_version(packages, n).map(|v| (n.to_string(), v.to_string())));
    DockerFacts {
        binary,
        snap,
        socket: socket.unwrap_or_else(|_| PathBuf::from(DEFAULT_DOCKER_SOCKET)),
        engine,
        package,
        daemon_json,
        swarm: host.exists(&data_root.join(SWARM_STATE)),
        live_restore_flag: dockerd_live_restore_flag(host),
    }
}

/// `--live-restore` on the running dockerd's command line ([`DOCKERD_PID`], then
/// `/proc/<pid>/cmdline`); `None` when absent or when dockerd is not running.
fn dockerd_live_restore_flag(host: &dyn Host) -> Option<bool> {
    let pid = host.read_to_string(Path::new(DOCKERD_PID)).ok()?;
    let pid: u32 = pid.trim().parse().ok()?;
    let cmdline = host.read(&PathBuf::from(format!("/proc/{pid}/cmdline"))).ok()?;
    live_restore_flag(&cmdline)
}

/// The `--live-restore` flag in a NUL-separated command line (the last one counts, as in Go's
/// flag parsing): `--live-restore`, `--live-restore=true|false`.
pub fn live_restore_flag(cmdline: &[u8]) -> Option<bool> {
    let mut flag = None;
    for arg in cmdline.split(|b| *b == 0).map(String::from_utf8_lossy) {
        match arg.as_ref() {
            "--live-restore" => flag = Some(true),
            a => {
                if let Some(v) = a.strip_prefix("--live-restore=") {
                    flag = Some(!matches!(v, "false" | "0" | "f" | "F" | "FALSE" | "False"));
                }
            }
        }
    }
    flag
}

/// The journal entries dpkg left unfinished ([`DPKG_UPDATES`]); none when the directory cannot
/// be read.
pub fn dpkg_interrupted(host: &dyn Host) -> Vec<PathBuf> {
    let mut pending: Vec<PathBuf> = host
        .read_dir(Path::new(DPKG_UPDATES))
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    pending.sort();
    pending
}

fn lock_facts(host: &dyn Host) -> LockFacts {
    for l in DPKG_LOCKS {
        match host.lock_holder(Path::new(l)) {
            Ok(Some(pid)) => return LockFacts::Held { path: PathBuf::from(l), pid },
            Ok(None) => {}
            Err(e) => return LockFacts::Unknown(format!("{l}: {e}")),
        }
    }
    LockFacts::Free
}

fn existing_facts(host: &dyn Host, systemd: bool) -> ExistingFacts {
    let state_dir = Path::new(agent_state::DEFAULT_STATE_DIR);
    let state = agent_state::read(host, state_dir)
        .map_err(|e| format!("{}: {e}", agent_state::state_path(state_dir).display()))
        .transpose();
    let unit = host.exists(Path::new(agent_state::UNIT_PATH));
    let unit_state = if unit && systemd {
        let cmd =
            Cmd::new("systemctl").args(["show", agent_state::SERVICE_NAME, "-p", systemctl::SHOW_PROPERTIES]);
        host.run(&cmd).ok().filter(|o| o.success()).map(|o| systemctl::parse_show(&o.stdout_str()))
    } else {
        None
    };
    ExistingFacts {
        // The config holds the token: only its existence is looked at, never its contents.
        config: host.exists(Path::new(agent_state::DEFAULT_CONFIG)),
        unit,
        binary: host.exists(&Path::new(agent_state::INSTALL_DIR).join("gpum-agent")),
        state,
        unit_state,
    }
}

fn platform_facts(opts: &GatherOptions) -> PlatformFacts {
    if opts.offline {
        return PlatformFacts::Offline;
    }
    let Some(url) = opts.server.clone() else { return PlatformFacts::NoServer };
    let client_opts = gpum_host::http::ClientOptions {
        extra_roots_pem: opts.extra_roots_pem.clone(),
        timeout: Some(Duration::from_secs(8)),
        connect_timeout: Some(Duration::from_secs(5)),
        user_agent: None,
    };
    if let Err(e) = gpum_host::http::check_url(&url) {
        return PlatformFacts::BadUrl { url, error: error_chain(&e) };
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return PlatformFacts::Unreachable { url, error: e.to_string() },
    };
    // The client's connector needs the runtime's context when it is built.
    let _ctx = rt.enter();
    let client = match gpum_host::http::client_for(&url, &client_opts) {
        Ok(c) => c,
        Err(e) => return PlatformFacts::BadUrl { url, error: error_chain(&e) },
    };
    // Any HTTP answer over a verified connection means the platform is reachable; what the
    // answer says is the later protocol's business.
    match rt.block_on(client.get(&url).send()) {
        Ok(r) => PlatformFacts::Reachable { url, status: r.status().as_u16() },
        Err(e) => PlatformFacts::Unreachable { url, error: error_chain(&e) },
    }
}
