//! The checks: pure functions from [`Facts`] to a [`Finding`], in the user's language.
//!
//! Every check runs and is reported; a failure never hides the checks after it. The ids are
//! stable (scripts read them from `--json`); the texts are not.

use std::fmt::Display;

use gpum_common::Lang;
use gpum_common::agent_state::{Connection, StopReason};
use gpum_common::texts::fill;

use crate::facts::{
    Facts, LockFacts, PlatformFacts, TOOLKIT_CONFIG, TOOLKIT_ESCAPE_CVE, TOOLKIT_MIN_SAFE_VERSION,
};
use crate::gpu::GpuFacts;
use crate::parse::toolkit_config::{AS_VOLUME_MOUNTS, ENVVAR_WHEN_UNPRIVILEGED};
use crate::text::Msg;
use crate::{Finding, Status};

/// The free space Docker's data root needs: 50 GB (decimal, as disk vendors and the guide count).
pub const MIN_FREE_BYTES: u64 = 50_000_000_000;

pub const ROOT: &str = "root";
pub const SYSTEMD: &str = "systemd";
pub const OS: &str = "os";
pub const ARCH: &str = "arch";
pub const TMP_EXEC: &str = "tmp_exec";
pub const DISK: &str = "disk";
pub const NVIDIA_DRIVER: &str = "nvidia_driver";
pub const DOCKER: &str = "docker";
pub const NVIDIA_TOOLKIT: &str = "nvidia_toolkit";
pub const NFTABLES: &str = "nftables";
pub const TOOLKIT_GPU_ACCESS: &str = "toolkit_gpu_access";
pub const LIVE_RESTORE: &str = "live_restore";
pub const DISK_LIMIT: &str = "disk_limit";
pub const DPKG_LOCK: &str = "dpkg_lock";
pub const EXISTING_INSTALL: &str = "existing_install";
pub const PLATFORM: &str = "platform";

/// Every check id, in report order.
pub const ALL: &[&str] = &[
    ROOT,
    SYSTEMD,
    OS,
    ARCH,
    TMP_EXEC,
    DISK,
    NVIDIA_DRIVER,
    DOCKER,
    NVIDIA_TOOLKIT,
    NFTABLES,
    TOOLKIT_GPU_ACCESS,
    LIVE_RESTORE,
    DISK_LIMIT,
    DPKG_LOCK,
    EXISTING_INSTALL,
    PLATFORM,
];

/// The row `m` of the crate's table in `lang`, its `{holes}` filled with `values`.
fn say(lang: Lang, m: Msg, values: &[(&str, &dyn Display)]) -> String {
    let values: Vec<(&str, String)> = values.iter().map(|(name, v)| (*name, v.to_string())).collect();
    let values: Vec<(&str, &str)> = values.iter().map(|(name, v)| (*name, v.as_str())).collect();
    fill(m.text(lang), &values)
}

/// What the checks need to know besides the facts: what the caller will do after them. The
/// checks read it and produce the right findings themselves; nobody patches a finding later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// The free space Docker's data root needs: [`MIN_FREE_BYTES`], lowered only by the
    /// installer's test knobs (a test host's data root lives on whatever disk CI has).
    pub min_free_bytes: u64,
    /// The install that follows upgrades the toolkit from NVIDIA's repository, so a toolkit
    /// with a known container escape is a warning with that fix instead of a failure.
    pub toolkit_will_be_upgraded: bool,
    /// What the install that follows does with an installed agent's server.
    pub registration: Registration,
}

/// What the install that follows does with an installed agent's server, which the
/// `existing_install` check tells the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Not known (no install follows, or a dry run without a code): both ways are told.
    Unknown,
    /// The join code the installed agent was registered with: the platform answers with the
    /// same server, and the install repairs the machine in place.
    SameCode,
    /// No code, or one the platform no longer accepts: the installed agent keeps its server
    /// and the install repairs the machine in place.
    Keep,
    /// Another code: a new server, which the platform refuses while the old one has the GPUs.
    NewCode,
}

/// No install follows (the agent's `doctor`): the real minimum, nothing upgraded.
impl Default for Context {
    fn default() -> Self {
        Context {
            min_free_bytes: MIN_FREE_BYTES,
            toolkit_will_be_upgraded: false,
            registration: Registration::Unknown,
        }
    }
}

/// Runs every check with the default [`Context`] (no install follows), in [`ALL`] order.
pub fn run_all(f: &Facts, lang: Lang) -> Vec<Finding> {
    run(f, &Context::default(), lang)
}

/// Runs every check in `cx`, in [`ALL`] order.
pub fn run(f: &Facts, cx: &Context, lang: Lang) -> Vec<Finding> {
    vec![
        root(f, lang),
        systemd(f, lang),
        os(f, lang),
        arch(f, lang),
        tmp_exec(f, lang),
        disk(f, cx, lang),
        nvidia_driver(f, lang),
        docker(f, lang),
        nvidia_toolkit(f, cx, lang),
        nftables(f, lang),
        toolkit_gpu_access(f, lang),
        live_restore(f, lang),
        disk_limit(f, lang),
        dpkg_lock(f, lang),
        existing_install(f, cx, lang),
        platform(f, lang),
    ]
}

pub fn root(f: &Facts, lang: Lang) -> Finding {
    let uid = f.euid;
    if uid == 0 {
        Finding::pass(ROOT, say(lang, Msg::RootOk, &[]))
    } else {
        Finding::fail(ROOT, say(lang, Msg::RootNotRoot, &[("uid", &uid)]), Some(say(lang, Msg::RootFix, &[])))
    }
}

pub fn systemd(f: &Facts, lang: Lang) -> Finding {
    if f.systemd {
        Finding::pass(SYSTEMD, say(lang, Msg::SystemdOk, &[]))
    } else {
        Finding::fail(SYSTEMD, say(lang, Msg::SystemdMissing, &[]), Some(say(lang, Msg::SystemdFix, &[])))
    }
}

/// Whether an OS is the verified one, supported without a GPU run yet, or unsupported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OsSupport {
    Verified,
    NotVerifiedWithGpu,
    Unsupported,
}

pub fn os_support(id: &str, version_id: &str) -> OsSupport {
    match (id, version_id) {
        ("ubuntu", "22.04") => OsSupport::Verified,
        ("ubuntu", "24.04") | ("debian", "12") => OsSupport::NotVerifiedWithGpu,
        _ => OsSupport::Unsupported,
    }
}

pub fn os(f: &Facts, lang: Lang) -> Finding {
    let o = match &f.os {
        Ok(o) => o,
        Err(e) => {
            return Finding::fail(
                OS,
                say(lang, Msg::OsUnreadable, &[("e", &e)]),
                Some(say(lang, Msg::OsUnreadableFix, &[])),
            );
        }
    };
    let name =
        if o.pretty_name.is_empty() { format!("{} {}", o.id, o.version_id) } else { o.pretty_name.clone() };
    match os_support(&o.id, &o.version_id) {
        OsSupport::Verified => Finding::pass(OS, name),
        OsSupport::NotVerifiedWithGpu => Finding::warn(
            OS,
            say(lang, Msg::OsNotVerifiedWithGpu, &[("name", &name)]),
            Some(say(lang, Msg::OsNotVerifiedWithGpuFix, &[])),
        ),
        OsSupport::Unsupported => Finding::fail(
            OS,
            say(lang, Msg::OsUnsupported, &[("name", &name)]),
            Some(say(lang, Msg::OsUnsupportedFix, &[])),
        ),
    }
}

pub fn arch(f: &Facts, lang: Lang) -> Finding {
    let a = &f.arch;
    if a == "x86_64" {
        Finding::pass(ARCH, a.clone())
    } else {
        Finding::fail(ARCH, say(lang, Msg::ArchUnsupported, &[("a", &a)]), Some(say(lang, Msg::ArchFix, &[])))
    }
}

pub fn tmp_exec(f: &Facts, lang: Lang) -> Finding {
    let dir = f.tmp.dir.display().to_string();
    // "$TMPDIR (/scratch)" when it came from the environment, plain "/tmp" otherwise.
    let var = if f.tmp.from_env { format!("$TMPDIR ({dir})") } else { dir.clone() };
    match &f.tmp.mount {
        Some(m) if m.has("noexec") => {
            let mp = m.mount_point.display();
            let fix = if f.tmp.from_env {
                say(lang, Msg::TmpExecNoexecFixTmpdir, &[])
            } else {
                say(lang, Msg::TmpExecNoexecFixCommand, &[])
            };
            Finding::fail(TMP_EXEC, say(lang, Msg::TmpExecNoexec, &[("mp", &mp), ("var", &var)]), Some(fix))
        }
        Some(m) => {
            let mp = m.mount_point.display();
            Finding::pass(TMP_EXEC, say(lang, Msg::TmpExecOk, &[("mp", &mp), ("var", &var)]))
        }
        None => {
            let why = f.tmp.error.clone().unwrap_or_else(|| "no mount".into());
            Finding::warn(
                TMP_EXEC,
                say(lang, Msg::TmpExecUnknown, &[("dir", &dir), ("why", &why)]),
                Some(say(lang, Msg::TmpExecUnknownFix, &[("dir", &dir)])),
            )
        }
    }
}

/// Bytes as decimal gigabytes with one decimal.
pub fn gb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e9)
}

/// Free space at Docker's data root against `cx.min_free_bytes`.
pub fn disk(f: &Facts, cx: &Context, lang: Lang) -> Finding {
    let min_free = cx.min_free_bytes;
    let root = f.disk.data_root.display().to_string();
    let probed = f.disk.probed.display().to_string();
    let need = gb(min_free);
    let at = if f.disk.probed == f.disk.data_root {
        root.clone()
    } else {
        say(lang, Msg::DiskProbedInstead, &[("probed", &probed), ("root", &root)])
    };
    match &f.disk.space {
        Ok(s) if s.avail_bytes >= min_free => {
            let free = gb(s.avail_bytes);
            Finding::pass(DISK, say(lang, Msg::DiskOk, &[("at", &at), ("free", &free)]))
        }
        Ok(s) => {
            let free = gb(s.avail_bytes);
            Finding::fail(
                DISK,
                say(lang, Msg::DiskLow, &[("at", &at), ("free", &free), ("need", &need)]),
                Some(say(lang, Msg::DiskLowFix, &[])),
            )
        }
        Err(e) => Finding::warn(
            DISK,
            say(lang, Msg::DiskUnknown, &[("e", &e)]),
            Some(say(lang, Msg::DiskUnknownFix, &[("need", &need), ("probed", &probed)])),
        ),
    }
}

pub fn nvidia_driver(f: &Facts, lang: Lang) -> Finding {
    let install_fix = || say(lang, Msg::NvidiaDriverInstallFix, &[]);
    match &f.gpu {
        GpuFacts::Ok { driver, gpus } => {
            let n = gpus.len();
            let list = gpus.join(", ");
            Finding::pass(
                NVIDIA_DRIVER,
                say(lang, Msg::NvidiaDriverOk, &[("driver", &driver), ("list", &list), ("n", &n)]),
            )
        }
        GpuFacts::LibraryMissing { lib, detail } => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverLibraryMissing, &[("detail", &detail), ("lib", &lib)]),
            Some(install_fix()),
        ),
        GpuFacts::LibraryBroken { lib, detail } => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverLibraryBroken, &[("detail", &detail), ("lib", &lib)]),
            Some(say(lang, Msg::NvidiaDriverLibraryBrokenFix, &[])),
        ),
        GpuFacts::DriverNotLoaded => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverNotLoaded, &[]),
            Some(say(lang, Msg::NvidiaDriverRebootFix, &[])),
        ),
        GpuFacts::VersionMismatch => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverVersionMismatch, &[]),
            Some(say(lang, Msg::NvidiaDriverRebootFix, &[])),
        ),
        GpuFacts::NoPermission => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverNoPermission, &[]),
            Some(say(lang, Msg::NvidiaDriverNoPermissionFix, &[])),
        ),
        GpuFacts::NoDevices { driver } => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverNoDevices, &[("driver", &driver)]),
            Some(say(lang, Msg::NvidiaDriverNoDevicesFix, &[])),
        ),
        GpuFacts::Other(e) => Finding::fail(
            NVIDIA_DRIVER,
            say(lang, Msg::NvidiaDriverNvmlError, &[("e", &e)]),
            Some(say(lang, Msg::NvidiaDriverNvmlErrorFix, &[])),
        ),
    }
}

pub fn docker(f: &Facts, lang: Lang) -> Finding {
    let d = &f.docker;
    if let Some(Err(e)) = &d.daemon_json {
        return Finding::fail(
            DOCKER,
            say(lang, Msg::DockerDaemonJsonBad, &[("e", &e)]),
            Some(say(lang, Msg::DockerDaemonJsonBadFix, &[])),
        );
    }
    if d.snap {
        return Finding::fail(
            DOCKER,
            say(lang, Msg::DockerSnap, &[]),
            Some(say(lang, Msg::DockerSnapFix, &[])),
        );
    }
    if !d.present() {
        return Finding::pass(DOCKER, say(lang, Msg::DockerAbsent, &[]));
    }
    let pkg = d.package.as_ref().map(|(n, v)| format!("{n} {v}")).unwrap_or_else(|| "docker".into());
    match &d.engine {
        Ok(e) => {
            let v = &e.version;
            Finding::pass(DOCKER, say(lang, Msg::DockerOk, &[("pkg", &pkg), ("v", &v)]))
        }
        Err(e) if f.euid != 0 && e.contains("ermission denied") => Finding::warn(
            DOCKER,
            say(lang, Msg::DockerNoRoot, &[("pkg", &pkg)]),
            Some(say(lang, Msg::DockerNoRootFix, &[])),
        ),
        Err(e) => Finding::warn(
            DOCKER,
            say(lang, Msg::DockerSilent, &[("e", &e), ("pkg", &pkg)]),
            Some(say(lang, Msg::DockerSilentFix, &[])),
        ),
    }
}

/// The toolkit's presence, version and runtime; a vulnerable one fails unless `cx` says the
/// install upgrades it.
pub fn nvidia_toolkit(f: &Facts, cx: &Context, lang: Lang) -> Finding {
    let t = &f.toolkit;
    if !t.present() {
        return Finding::pass(NVIDIA_TOOLKIT, say(lang, Msg::NvidiaToolkitAbsent, &[]));
    }
    let min = TOOLKIT_MIN_SAFE_VERSION;
    let cve = TOOLKIT_ESCAPE_CVE;
    let Some(ver) = t.package_version.clone() else {
        // `nvidia-ctk` without the package: installed by hand, its version unknown to dpkg.
        return Finding::warn(
            NVIDIA_TOOLKIT,
            say(lang, Msg::NvidiaToolkitUnpackaged, &[("cve", &cve), ("min", &min)]),
            Some(say(lang, Msg::NvidiaToolkitUnpackagedFix, &[("min", &min)])),
        );
    };
    if t.vulnerable {
        let message = say(lang, Msg::NvidiaToolkitVulnerable, &[("cve", &cve), ("ver", &ver)]);
        if cx.toolkit_will_be_upgraded {
            return Finding::warn(
                NVIDIA_TOOLKIT,
                message,
                Some(say(lang, Msg::NvidiaToolkitVulnerableUpgraded, &[])),
            );
        }
        return Finding::fail(
            NVIDIA_TOOLKIT,
            message,
            Some(say(lang, Msg::NvidiaToolkitVulnerableFix, &[("min", &min)])),
        );
    }
    if f.docker.has_nvidia_runtime() {
        Finding::pass(NVIDIA_TOOLKIT, say(lang, Msg::NvidiaToolkitOk, &[("ver", &ver)]))
    } else {
        Finding::warn(
            NVIDIA_TOOLKIT,
            say(lang, Msg::NvidiaToolkitNoRuntime, &[("ver", &ver)]),
            Some(say(lang, Msg::NvidiaToolkitNoRuntimeFix, &[])),
        )
    }
}

/// `nft`, which the agent needs for the rentals' egress table (issue 33): without it the agent
/// refuses every rental, and the machine still serves the platform otherwise, so a warning.
pub fn nftables(f: &Facts, lang: Lang) -> Finding {
    match &f.nft {
        Some(p) => {
            let p = p.display();
            Finding::pass(NFTABLES, say(lang, Msg::NftablesOk, &[("p", &p)]))
        }
        None => Finding::warn(
            NFTABLES,
            say(lang, Msg::NftablesMissing, &[]),
            Some(say(lang, Msg::NftablesMissingFix, &[])),
        ),
    }
}

/// Whether an unprivileged container can choose GPUs with its own `NVIDIA_VISIBLE_DEVICES`
/// (the toolkit's default), or gets only the GPUs its creator listed as mounts (gpum's setting).
/// A file that cannot be read fails: the installer would have to change it.
pub fn toolkit_gpu_access(f: &Facts, lang: Lang) -> Finding {
    let (file, env, mounts) = (TOOLKIT_CONFIG, ENVVAR_WHEN_UNPRIVILEGED, AS_VOLUME_MOUNTS);
    match &f.toolkit.config {
        Some(Err(e)) => Finding::fail(
            TOOLKIT_GPU_ACCESS,
            say(lang, Msg::ToolkitGpuAccessConfigBad, &[("e", &e)]),
            Some(say(lang, Msg::ToolkitGpuAccessConfigBadFix, &[("file", &file)])),
        ),
        _ if f.toolkit.config_is_gpums() => Finding::pass(
            TOOLKIT_GPU_ACCESS,
            say(lang, Msg::ToolkitGpuAccessOk, &[("env", &env), ("mounts", &mounts)]),
        ),
        _ if !f.toolkit.present() => Finding::pass(
            TOOLKIT_GPU_ACCESS,
            say(lang, Msg::ToolkitGpuAccessWillSet, &[("env", &env), ("file", &file)]),
        ),
        _ => Finding::warn(
            TOOLKIT_GPU_ACCESS,
            say(lang, Msg::ToolkitGpuAccessOpen, &[]),
            Some(say(
                lang,
                Msg::ToolkitGpuAccessOpenFix,
                &[("env", &env), ("file", &file), ("mounts", &mounts)],
            )),
        ),
    }
}

/// Whether containers (a rental's too) keep running while dockerd restarts (`live-restore`).
/// Refused where the installer cannot turn it on safely: dockerd started with
/// `--live-restore=false` (the key in `daemon.json` too would stop dockerd), or the engine in a
/// swarm (moby refuses to start swarm mode with live-restore: the swarm would be gone after the
/// next Docker restart).
pub fn live_restore(f: &Facts, lang: Lang) -> Finding {
    let d = &f.docker;
    if let Some(Err(_)) = &d.daemon_json {
        return Finding::skip(LIVE_RESTORE, say(lang, Msg::LiveRestoreDaemonJsonBad, &[]));
    }
    if d.swarm {
        let (msg, fix) =
            (say(lang, Msg::LiveRestoreSwarm, &[]), Some(say(lang, Msg::LiveRestoreSwarmFix, &[])));
        return Finding::fail(LIVE_RESTORE, msg, fix);
    }
    match d.live_restore_flag {
        Some(true) => {
            return Finding::pass(LIVE_RESTORE, say(lang, Msg::LiveRestoreOnByFlag, &[]));
        }
        Some(false) => {
            return Finding::fail(
                LIVE_RESTORE,
                say(lang, Msg::LiveRestoreOffByFlag, &[]),
                Some(say(lang, Msg::LiveRestoreOffByFlagFix, &[])),
            );
        }
        None => {}
    }
    if d.has_live_restore() {
        return Finding::pass(LIVE_RESTORE, say(lang, Msg::LiveRestoreOk, &[]));
    }
    if !d.present() {
        return Finding::pass(LIVE_RESTORE, say(lang, Msg::LiveRestoreWillSet, &[]));
    }
    Finding::warn(
        LIVE_RESTORE,
        say(lang, Msg::LiveRestoreOff, &[]),
        Some(say(lang, Msg::LiveRestoreOffFix, &[])),
    )
}

/// Whether a rental's disk can be limited here: Docker's overlay2 enforces `--storage-opt size=`
/// only on XFS mounted with project quotas. Read-only, from mountinfo and `daemon.json`.
pub fn disk_limit(f: &Facts, lang: Lang) -> Finding {
    let root = f.disk.data_root.display().to_string();
    let driver = f
        .docker
        .daemon_json
        .as_ref()
        .and_then(|d| d.as_ref().ok())
        .and_then(|d| d.storage_driver.clone())
        .unwrap_or_else(|| "overlay2".into());
    let fix = Some(say(lang, Msg::DiskLimitFix, &[]));
    if driver != "overlay2" {
        return Finding::warn(
            DISK_LIMIT,
            say(lang, Msg::DiskLimitStorageDriver, &[("driver", &driver)]),
            fix,
        );
    }
    match &f.disk.mount {
        Some(m) if m.has_project_quota() => {
            let mp = m.mount_point.display().to_string();
            Finding::pass(DISK_LIMIT, say(lang, Msg::DiskLimitOk, &[("mp", &mp), ("root", &root)]))
        }
        Some(m) => {
            let (fs, mp) = (m.fstype.clone(), m.mount_point.display().to_string());
            Finding::warn(
                DISK_LIMIT,
                say(lang, Msg::DiskLimitNoQuota, &[("fs", &fs), ("mp", &mp), ("root", &root)]),
                fix,
            )
        }
        None => Finding::warn(DISK_LIMIT, say(lang, Msg::DiskLimitUnknown, &[("root", &root)]), fix),
    }
}

pub fn dpkg_lock(f: &Facts, lang: Lang) -> Finding {
    match &f.dpkg_lock {
        LockFacts::Free if !f.dpkg_interrupted.is_empty() => {
            let n = f.dpkg_interrupted.len();
            Finding::warn(
                DPKG_LOCK,
                say(lang, Msg::DpkgLockInterrupted, &[("n", &n)]),
                Some(say(lang, Msg::DpkgLockInterruptedFix, &[])),
            )
        }
        LockFacts::Free => Finding::pass(DPKG_LOCK, say(lang, Msg::DpkgLockOk, &[])),
        LockFacts::Held { path, pid } => {
            let p = path.display();
            Finding::warn(
                DPKG_LOCK,
                say(lang, Msg::DpkgLockHeld, &[("p", &p), ("pid", &pid)]),
                Some(say(lang, Msg::DpkgLockHeldFix, &[])),
            )
        }
        LockFacts::Unknown(e) if f.euid != 0 => {
            Finding::skip(DPKG_LOCK, say(lang, Msg::DpkgLockNoRoot, &[("e", &e)]))
        }
        LockFacts::Unknown(e) => {
            Finding::warn(DPKG_LOCK, say(lang, Msg::DpkgLockUnknown, &[("e", &e)]), None)
        }
    }
}

pub fn existing_install(f: &Facts, cx: &Context, lang: Lang) -> Finding {
    let e = &f.existing;
    if !e.any() {
        return Finding::pass(EXISTING_INSTALL, say(lang, Msg::ExistingInstallNone, &[]));
    }
    let state = match &e.state {
        Some(Ok(s)) => s,
        Some(Err(err)) => {
            return Finding::warn(
                EXISTING_INSTALL,
                say(lang, Msg::ExistingInstallStateUnreadable, &[("err", &err)]),
                Some(say(lang, Msg::ExistingInstallStateUnreadableFix, &[])),
            );
        }
        None => {
            return Finding::warn(
                EXISTING_INSTALL,
                say(lang, Msg::ExistingInstallNoState, &[]),
                Some(say(lang, Msg::ExistingInstallNoStateFix, &[])),
            );
        }
    };
    let server = state.server.clone().unwrap_or_else(|| "?".into());
    let node = state.node_id.clone().unwrap_or_else(|| "?".into());
    match &state.stopped {
        Some(s) if s.reason == StopReason::Revoked => Finding::pass(
            EXISTING_INSTALL,
            say(lang, Msg::ExistingInstallRevoked, &[("node", &node), ("server", &server)]),
        ),
        _ => {
            let conn = match (&state.connection, &state.stopped) {
                (_, Some(_)) => say(lang, Msg::ExistingInstallConnStoppedConfig, &[]),
                (Connection::Connected, _) => say(lang, Msg::ExistingInstallConnConnected, &[]),
                (Connection::Connecting, _) => say(lang, Msg::ExistingInstallConnConnecting, &[]),
                (Connection::Unreachable, _) => say(lang, Msg::ExistingInstallConnUnreachable, &[]),
                (Connection::Stopped, _) => say(lang, Msg::ExistingInstallConnStopped, &[]),
            };
            match cx.registration {
                Registration::SameCode => Finding::pass(
                    EXISTING_INSTALL,
                    say(
                        lang,
                        Msg::ExistingInstallSameCode,
                        &[("conn", &conn), ("node", &node), ("server", &server)],
                    ),
                ),
                Registration::Keep => Finding::pass(
                    EXISTING_INSTALL,
                    say(
                        lang,
                        Msg::ExistingInstallKeep,
                        &[("conn", &conn), ("node", &node), ("server", &server)],
                    ),
                ),
                Registration::NewCode => Finding::warn(
                    EXISTING_INSTALL,
                    say(
                        lang,
                        Msg::ExistingInstallNewCode,
                        &[("conn", &conn), ("node", &node), ("server", &server)],
                    ),
                    Some(say(lang, Msg::ExistingInstallNewCodeFix, &[])),
                ),
                Registration::Unknown => Finding::warn(
                    EXISTING_INSTALL,
                    say(
                        lang,
                        Msg::ExistingInstallUnknown,
                        &[("conn", &conn), ("node", &node), ("server", &server)],
                    ),
                    Some(say(lang, Msg::ExistingInstallUnknownFix, &[])),
                ),
            }
        }
    }
}

pub fn platform(f: &Facts, lang: Lang) -> Finding {
    match &f.platform {
        PlatformFacts::Offline => Finding::skip(PLATFORM, say(lang, Msg::PlatformOffline, &[])),
        PlatformFacts::NoServer => Finding::skip(PLATFORM, say(lang, Msg::PlatformNoServer, &[])),
        PlatformFacts::Reachable { url, status } => {
            Finding::pass(PLATFORM, say(lang, Msg::PlatformReachable, &[("status", &status), ("url", &url)]))
        }
        PlatformFacts::Unreachable { url, error } => Finding::fail(
            PLATFORM,
            say(lang, Msg::PlatformUnreachable, &[("error", &error), ("url", &url)]),
            Some(say(lang, Msg::PlatformUnreachableFix, &[])),
        ),
        PlatformFacts::BadUrl { url, error } => Finding::fail(
            PLATFORM,
            say(lang, Msg::PlatformBadUrl, &[("error", &error), ("url", &url)]),
            Some(say(lang, Msg::PlatformBadUrlFix, &[])),
        ),
    }
}

/// The status of the check `id` in `findings`.
pub fn status_of(findings: &[Finding], id: &str) -> Option<Status> {
    findings.iter().find(|f| f.id == id).map(|f| f.status)
}
