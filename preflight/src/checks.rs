//! The checks: pure functions from [`Facts`] to a [`Finding`], in the user's language.
//!
//! Every check runs and is reported; a failure never hides the checks after it. The ids are
//! stable (scripts read them from `--json`); the texts are not.

use gpum_common::Lang;
use gpum_common::agent_state::{Connection, StopReason};

use crate::facts::{
    Facts, LockFacts, PlatformFacts, TOOLKIT_CONFIG, TOOLKIT_ESCAPE_CVE, TOOLKIT_MIN_SAFE_VERSION,
};
use crate::gpu::GpuFacts;
use crate::parse::toolkit_config::{AS_VOLUME_MOUNTS, ENVVAR_WHEN_UNPRIVILEGED};
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

/// Picks the Russian or the English text; both are `format!` strings with the same captures.
macro_rules! tr {
    ($lang:expr, $ru:literal, $en:literal $(,)?) => {
        if $lang == Lang::Ru { format!($ru) } else { format!($en) }
    };
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
        Finding::pass(ROOT, tr!(lang, "запущено от имени root", "running as root"))
    } else {
        Finding::fail(
            ROOT,
            tr!(
                lang,
                "Установщик нужно запускать от имени root (сейчас uid {uid})",
                "the installer must run as root (uid is {uid})"
            ),
            Some(tr!(lang, "повторите команду с sudo", "repeat the command with sudo")),
        )
    }
}

pub fn systemd(f: &Facts, lang: Lang) -> Finding {
    if f.systemd {
        Finding::pass(SYSTEMD, tr!(lang, "systemd запущен (PID 1)", "systemd is running (PID 1)"))
    } else {
        Finding::fail(
            SYSTEMD,
            tr!(
                lang,
                "На этой машине не запущен systemd (нет /run/systemd/system)",
                "systemd is not running on this machine (no /run/systemd/system)"
            ),
            Some(tr!(
                lang,
                "контейнеры, WSL и системы без systemd не поддерживаются: установите на машину или ВМ, загруженную с systemd",
                "containers, WSL and systems without systemd are not supported: install on a machine or VM booted with systemd"
            )),
        )
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
                tr!(lang, "не удалось определить систему: {e}", "cannot tell the operating system: {e}"),
                Some(tr!(lang, "нужна Ubuntu 22.04", "Ubuntu 22.04 is required")),
            );
        }
    };
    let name =
        if o.pretty_name.is_empty() { format!("{} {}", o.id, o.version_id) } else { o.pretty_name.clone() };
    match os_support(&o.id, &o.version_id) {
        OsSupport::Verified => Finding::pass(OS, name),
        OsSupport::NotVerifiedWithGpu => Finding::warn(
            OS,
            tr!(
                lang,
                "{name}: поддерживается, но установка с видеокартой ещё не проверена",
                "{name}: supported, but not verified with a GPU yet"
            ),
            Some(tr!(lang, "проверенная система: Ubuntu 22.04", "the verified system is Ubuntu 22.04")),
        ),
        OsSupport::Unsupported => Finding::fail(
            OS,
            tr!(lang, "{name} не поддерживается", "{name} is not supported"),
            Some(tr!(
                lang,
                "нужна Ubuntu 22.04 (проверено) или Ubuntu 24.04 / Debian 12 (без проверки с видеокартой)",
                "use Ubuntu 22.04 (verified), or Ubuntu 24.04 / Debian 12 (not verified with a GPU)"
            )),
        ),
    }
}

pub fn arch(f: &Facts, lang: Lang) -> Finding {
    let a = &f.arch;
    if a == "x86_64" {
        Finding::pass(ARCH, a.clone())
    } else {
        Finding::fail(
            ARCH,
            tr!(lang, "архитектура {a} не поддерживается", "architecture {a} is not supported"),
            Some(tr!(lang, "нужна машина x86_64", "an x86_64 machine is required")),
        )
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
                tr!(
                    lang,
                    "укажите каталог, где запуск разрешён, например: sudo env TMPDIR=/var/tmp bash",
                    "point TMPDIR at a directory that allows running programs, for example: sudo env TMPDIR=/var/tmp bash"
                )
            } else {
                tr!(
                    lang,
                    "замените в команде установки sudo bash на sudo env TMPDIR=/var/tmp bash",
                    "in the install command, replace sudo bash with sudo env TMPDIR=/var/tmp bash"
                )
            };
            Finding::fail(
                TMP_EXEC,
                tr!(
                    lang,
                    "{var} смонтирован с запретом запуска (noexec, точка монтирования {mp})",
                    "{var} is mounted noexec (mount point {mp})"
                ),
                Some(fix),
            )
        }
        Some(m) => {
            let mp = m.mount_point.display();
            Finding::pass(
                TMP_EXEC,
                tr!(
                    lang,
                    "{var} разрешает запуск программ (точка монтирования {mp})",
                    "{var} allows running programs (mount point {mp})"
                ),
            )
        }
        None => {
            let why = f.tmp.error.clone().unwrap_or_else(|| "no mount".into());
            Finding::warn(
                TMP_EXEC,
                tr!(lang, "не удалось проверить {dir}: {why}", "could not check {dir}: {why}"),
                Some(tr!(
                    lang,
                    "если {dir} смонтирован с noexec, используйте sudo env TMPDIR=/var/tmp bash",
                    "if {dir} is mounted noexec, use sudo env TMPDIR=/var/tmp bash"
                )),
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
        tr!(lang, "{probed} (каталога {root} ещё нет)", "{probed} ({root} does not exist yet)")
    };
    match &f.disk.space {
        Ok(s) if s.avail_bytes >= min_free => {
            let free = gb(s.avail_bytes);
            Finding::pass(
                DISK,
                tr!(lang, "свободно {free} ГБ под Docker: {at}", "{free} GB free for Docker at {at}"),
            )
        }
        Ok(s) => {
            let free = gb(s.avail_bytes);
            Finding::fail(
                DISK,
                tr!(
                    lang,
                    "под Docker свободно {free} ГБ ({at}), нужно не менее {need} ГБ",
                    "only {free} GB free for Docker at {at}; at least {need} GB is needed"
                ),
                Some(tr!(
                    lang,
                    "освободите место на этом разделе или укажите data-root на другом диске в /etc/docker/daemon.json",
                    "free space on that filesystem, or set data-root in /etc/docker/daemon.json to a larger disk"
                )),
            )
        }
        Err(e) => Finding::warn(
            DISK,
            tr!(lang, "не удалось узнать свободное место: {e}", "could not measure free space: {e}"),
            Some(tr!(
                lang,
                "проверьте df -h {probed}: нужно не менее {need} ГБ",
                "check df -h {probed}: at least {need} GB is needed"
            )),
        ),
    }
}

pub fn nvidia_driver(f: &Facts, lang: Lang) -> Finding {
    let install_fix = || {
        tr!(
            lang,
            "установите драйвер NVIDIA (например, sudo ubuntu-drivers install) и перезагрузите машину; gpum драйвер не ставит",
            "install the NVIDIA driver (for example sudo ubuntu-drivers install) and reboot; gpum does not install drivers"
        )
    };
    match &f.gpu {
        GpuFacts::Ok { driver, gpus } => {
            let n = gpus.len();
            let list = gpus.join(", ");
            Finding::pass(
                NVIDIA_DRIVER,
                tr!(lang, "драйвер {driver}, видеокарт: {n} ({list})", "driver {driver}, {n} GPU(s): {list}"),
            )
        }
        GpuFacts::LibraryMissing { lib, detail } => Finding::fail(
            NVIDIA_DRIVER,
            tr!(
                lang,
                "драйвер NVIDIA не найден: библиотека {lib} не загружается ({detail})",
                "NVIDIA driver not found: library {lib} cannot be loaded ({detail})"
            ),
            Some(install_fix()),
        ),
        GpuFacts::LibraryBroken { lib, detail } => Finding::fail(
            NVIDIA_DRIVER,
            tr!(
                lang,
                "библиотека {lib} повреждена или не та: {detail}",
                "library {lib} is broken or not NVML: {detail}"
            ),
            Some(tr!(lang, "переустановите драйвер NVIDIA", "reinstall the NVIDIA driver")),
        ),
        GpuFacts::DriverNotLoaded => Finding::fail(
            NVIDIA_DRIVER,
            tr!(
                lang,
                "драйвер NVIDIA установлен, но модуль ядра не загружен",
                "the NVIDIA driver is installed but its kernel module is not loaded"
            ),
            Some(tr!(
                lang,
                "перезагрузите машину; проверьте nvidia-smi",
                "reboot the machine, then check nvidia-smi"
            )),
        ),
        GpuFacts::VersionMismatch => Finding::fail(
            NVIDIA_DRIVER,
            tr!(
                lang,
                "версии драйвера NVIDIA в ядре и библиотеки различаются (драйвер обновлён без перезагрузки)",
                "NVIDIA driver/library version mismatch (the driver was updated without a reboot)"
            ),
            Some(tr!(
                lang,
                "перезагрузите машину; проверьте nvidia-smi",
                "reboot the machine, then check nvidia-smi"
            )),
        ),
        GpuFacts::NoPermission => Finding::fail(
            NVIDIA_DRIVER,
            tr!(
                lang,
                "нет прав на обращение к драйверу NVIDIA",
                "no permission to talk to the NVIDIA driver"
            ),
            Some(tr!(lang, "запустите установщик через sudo", "run the installer with sudo")),
        ),
        GpuFacts::NoDevices { driver } => Finding::fail(
            NVIDIA_DRIVER,
            tr!(
                lang,
                "драйвер NVIDIA {driver} работает, но видеокарт не видно",
                "NVIDIA driver {driver} works but sees no GPU"
            ),
            Some(tr!(
                lang,
                "проверьте nvidia-smi и lspci | grep -i nvidia; в ВМ видеокарта должна быть проброшена",
                "check nvidia-smi and lspci | grep -i nvidia; in a VM the GPU must be passed through"
            )),
        ),
        GpuFacts::Other(e) => Finding::fail(
            NVIDIA_DRIVER,
            tr!(lang, "ошибка NVML: {e}", "NVML error: {e}"),
            Some(tr!(lang, "проверьте nvidia-smi", "check nvidia-smi")),
        ),
    }
}

pub fn docker(f: &Facts, lang: Lang) -> Finding {
    let d = &f.docker;
    if let Some(Err(e)) = &d.daemon_json {
        return Finding::fail(
            DOCKER,
            tr!(lang, "файл настроек Docker не читается: {e}", "Docker's settings file cannot be used: {e}"),
            Some(tr!(
                lang,
                "исправьте синтаксис JSON в /etc/docker/daemon.json (установщик дополняет этот файл)",
                "fix the JSON in /etc/docker/daemon.json (the installer adds to that file)"
            )),
        );
    }
    if d.snap {
        return Finding::fail(
            DOCKER,
            tr!(
                lang,
                "Docker установлен из snap: с ним не работает NVIDIA Container Toolkit",
                "Docker is installed as a snap, which the NVIDIA Container Toolkit does not work with"
            ),
            Some(tr!(
                lang,
                "удалите его (sudo snap remove docker) и запустите установщик снова: он поставит Docker Engine из официального репозитория",
                "remove it (sudo snap remove docker) and run the installer again: it installs Docker Engine from Docker's repository"
            )),
        );
    }
    if !d.present() {
        return Finding::pass(
            DOCKER,
            tr!(
                lang,
                "Docker не установлен: установщик поставит Docker Engine из официального репозитория",
                "Docker is not installed: the installer will install Docker Engine from Docker's repository"
            ),
        );
    }
    let pkg = d.package.as_ref().map(|(n, v)| format!("{n} {v}")).unwrap_or_else(|| "docker".into());
    match &d.engine {
        Ok(e) => {
            let v = &e.version;
            Finding::pass(DOCKER, tr!(lang, "Docker {v} ({pkg})", "Docker {v} ({pkg})"))
        }
        Err(e) if f.euid != 0 && e.contains("ermission denied") => Finding::warn(
            DOCKER,
            tr!(
                lang,
                "Docker установлен ({pkg}), но без root нельзя спросить его версию",
                "Docker is installed ({pkg}), but its version cannot be asked without root"
            ),
            Some(tr!(lang, "запустите проверку через sudo", "run the check with sudo")),
        ),
        Err(e) => Finding::warn(
            DOCKER,
            tr!(
                lang,
                "Docker установлен ({pkg}), но не отвечает: {e}",
                "Docker is installed ({pkg}) but does not answer: {e}"
            ),
            Some(tr!(
                lang,
                "запустите его: sudo systemctl start docker",
                "start it: sudo systemctl start docker"
            )),
        ),
    }
}

/// The toolkit's presence, version and runtime; a vulnerable one fails unless `cx` says the
/// install upgrades it.
pub fn nvidia_toolkit(f: &Facts, cx: &Context, lang: Lang) -> Finding {
    let t = &f.toolkit;
    if !t.present() {
        return Finding::pass(
            NVIDIA_TOOLKIT,
            tr!(
                lang,
                "NVIDIA Container Toolkit не установлен: установщик поставит его из репозитория NVIDIA",
                "NVIDIA Container Toolkit is not installed: the installer will install it from NVIDIA's repository"
            ),
        );
    }
    let min = TOOLKIT_MIN_SAFE_VERSION;
    let cve = TOOLKIT_ESCAPE_CVE;
    let Some(ver) = t.package_version.clone() else {
        // `nvidia-ctk` without the package: installed by hand, its version unknown to dpkg.
        return Finding::warn(
            NVIDIA_TOOLKIT,
            tr!(
                lang,
                "nvidia-ctk найден, но пакет nvidia-container-toolkit не установлен: версию проверить нельзя, а версии до {min} уязвимы ({cve}, выход из контейнера)",
                "nvidia-ctk is present but the nvidia-container-toolkit package is not installed: its version cannot be checked, and versions before {min} are vulnerable ({cve}, container escape)"
            ),
            Some(tr!(
                lang,
                "удалите ручную установку и поставьте пакет nvidia-container-toolkit {min} или новее из репозитория NVIDIA",
                "remove the manual install and install the nvidia-container-toolkit package {min} or newer from NVIDIA's repository"
            )),
        );
    };
    if t.vulnerable {
        let message = tr!(
            lang,
            "NVIDIA Container Toolkit {ver} уязвим ({cve}): образ контейнера может получить права root на этой машине",
            "NVIDIA Container Toolkit {ver} is vulnerable ({cve}): a container image can get root on this machine"
        );
        if cx.toolkit_will_be_upgraded {
            return Finding::warn(
                NVIDIA_TOOLKIT,
                message,
                Some(tr!(
                    lang,
                    "установщик обновит его из репозитория NVIDIA",
                    "the installer upgrades it from NVIDIA's repository"
                )),
            );
        }
        return Finding::fail(
            NVIDIA_TOOLKIT,
            message,
            Some(tr!(
                lang,
                "обновите его до {min} или новее: sudo apt-get update && sudo apt-get install --only-upgrade nvidia-container-toolkit",
                "upgrade it to {min} or newer: sudo apt-get update && sudo apt-get install --only-upgrade nvidia-container-toolkit"
            )),
        );
    }
    if f.docker.has_nvidia_runtime() {
        Finding::pass(
            NVIDIA_TOOLKIT,
            tr!(
                lang,
                "NVIDIA Container Toolkit {ver}; среда nvidia настроена в /etc/docker/daemon.json",
                "NVIDIA Container Toolkit {ver}; the nvidia runtime is set in /etc/docker/daemon.json"
            ),
        )
    } else {
        Finding::warn(
            NVIDIA_TOOLKIT,
            tr!(
                lang,
                "NVIDIA Container Toolkit {ver} установлен, но в Docker нет среды nvidia: установщик настроит её и перезапустит Docker",
                "NVIDIA Container Toolkit {ver} is installed, but Docker has no nvidia runtime: the installer will configure it and restart Docker"
            ),
            Some(tr!(
                lang,
                "контейнеры без политики автозапуска при перезапуске Docker остановятся",
                "containers without a restart policy stop when Docker restarts"
            )),
        )
    }
}

/// `nft`, which the agent needs for the rentals' egress table (issue 33): without it the agent
/// refuses every rental, and the machine still serves the platform otherwise, so a warning.
pub fn nftables(f: &Facts, lang: Lang) -> Finding {
    match &f.nft {
        Some(p) => {
            let p = p.display();
            Finding::pass(
                NFTABLES,
                tr!(lang, "nftables есть ({p}): для аренд", "nftables is present ({p}): for rentals"),
            )
        }
        None => Finding::warn(
            NFTABLES,
            tr!(
                lang,
                "аренды требуют nftables: nft не найден, и агент не запустит ни одной аренды",
                "rentals need nftables: nft was not found, and the agent will run no rental"
            ),
            Some(tr!(lang, "установите его: apt install nftables", "install it: apt install nftables")),
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
            tr!(
                lang,
                "настройки NVIDIA Container Toolkit не читаются: {e}",
                "the NVIDIA Container Toolkit's settings cannot be used: {e}"
            ),
            Some(tr!(
                lang,
                "исправьте синтаксис TOML в {file} (установщик меняет в нём две настройки)",
                "fix the TOML in {file} (the installer changes two settings there)"
            )),
        ),
        _ if f.toolkit.config_is_gpums() => Finding::pass(
            TOOLKIT_GPU_ACCESS,
            tr!(
                lang,
                "контейнер без привилегий получает только GPU, выданные ему при создании: {env} = false, {mounts} = true",
                "an unprivileged container gets only the GPUs it was created with: {env} = false, {mounts} = true"
            ),
        ),
        _ if !f.toolkit.present() => Finding::pass(
            TOOLKIT_GPU_ACCESS,
            tr!(
                lang,
                "установщик выключит выбор GPU переменной NVIDIA_VISIBLE_DEVICES образа ({env} = false в {file})",
                "the installer turns off GPU choice by an image's NVIDIA_VISIBLE_DEVICES ({env} = false in {file})"
            ),
        ),
        _ => Finding::warn(
            TOOLKIT_GPU_ACCESS,
            tr!(
                lang,
                "контейнер без привилегий может взять любые GPU, задав NVIDIA_VISIBLE_DEVICES (например, all)",
                "an unprivileged container can take any GPU by setting NVIDIA_VISIBLE_DEVICES (all, for instance)"
            ),
            Some(tr!(
                lang,
                "установщик задаст {env} = false и {mounts} = true в {file} (копия прежнего файла останется рядом)",
                "the installer sets {env} = false and {mounts} = true in {file} (a copy of the old file stays beside it)"
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
        return Finding::skip(
            LIVE_RESTORE,
            tr!(
                lang,
                "файл настроек Docker не читается (см. docker)",
                "Docker's settings file cannot be used (see docker)"
            ),
        );
    }
    if d.swarm {
        let (msg, fix) = (
            tr!(
                lang,
                "Docker в режиме swarm: он несовместим с live-restore, без которого перезапуск Docker останавливает аренды, а с ним swarm не запустится после перезапуска Docker",
                "Docker is in swarm mode: it cannot be combined with live-restore, without which a Docker restart stops rentals, and with which the swarm does not start after a Docker restart"
            ),
            Some(tr!(
                lang,
                "выведите сервер из swarm (docker swarm leave) или сдавайте другой сервер",
                "take the machine out of the swarm (docker swarm leave) or rent out another machine"
            )),
        );
        return Finding::fail(LIVE_RESTORE, msg, fix);
    }
    match d.live_restore_flag {
        Some(true) => {
            return Finding::pass(
                LIVE_RESTORE,
                tr!(
                    lang,
                    "live-restore включён флагом dockerd --live-restore: контейнеры работают, пока Docker перезапускается",
                    "live-restore is on by dockerd's --live-restore flag: containers keep running while Docker restarts"
                ),
            );
        }
        Some(false) => {
            return Finding::fail(
                LIVE_RESTORE,
                tr!(
                    lang,
                    "dockerd запущен с --live-restore=false: перезапуск Docker останавливает все контейнеры, и аренды тоже, а включить live-restore в daemon.json при этом флаге нельзя (Docker не запустится)",
                    "dockerd runs with --live-restore=false: a Docker restart stops every container, rentals included, and daemon.json cannot turn live-restore on while that flag is given (Docker would not start)"
                ),
                Some(tr!(
                    lang,
                    "уберите --live-restore=false из командной строки dockerd (systemctl edit docker), перезапустите Docker и запустите установщик снова",
                    "remove --live-restore=false from dockerd's command line (systemctl edit docker), restart Docker and run the installer again"
                )),
            );
        }
        None => {}
    }
    if d.has_live_restore() {
        return Finding::pass(
            LIVE_RESTORE,
            tr!(
                lang,
                "live-restore включён: контейнеры работают, пока Docker перезапускается",
                "live-restore is on: containers keep running while Docker restarts"
            ),
        );
    }
    if !d.present() {
        return Finding::pass(
            LIVE_RESTORE,
            tr!(
                lang,
                "установщик включит live-restore в /etc/docker/daemon.json",
                "the installer turns live-restore on in /etc/docker/daemon.json"
            ),
        );
    }
    Finding::warn(
        LIVE_RESTORE,
        tr!(
            lang,
            "live-restore выключен: перезапуск Docker останавливает все контейнеры, и аренды тоже",
            "live-restore is off: a Docker restart stops every container, rentals included"
        ),
        Some(tr!(
            lang,
            "установщик добавит \"live-restore\": true в /etc/docker/daemon.json и перечитает настройки Docker (без перезапуска)",
            "the installer adds \"live-restore\": true to /etc/docker/daemon.json and reloads Docker (no restart)"
        )),
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
    let fix = Some(tr!(
        lang,
        "чтобы ограничивать диск каждой аренды, разместите каталог данных Docker на XFS, смонтированной с prjquota, с драйвером overlay2",
        "to limit each rental's disk, put Docker's data root on XFS mounted with prjquota, with the overlay2 driver"
    ));
    if driver != "overlay2" {
        return Finding::warn(
            DISK_LIMIT,
            tr!(
                lang,
                "ограничение диска аренды не поддерживается: драйвер хранения {driver}, а не overlay2",
                "a rental's disk limit is not supported: the storage driver is {driver}, not overlay2"
            ),
            fix,
        );
    }
    match &f.disk.mount {
        Some(m) if m.has_project_quota() => {
            let mp = m.mount_point.display().to_string();
            Finding::pass(
                DISK_LIMIT,
                tr!(
                    lang,
                    "ограничение диска аренды поддерживается: {root} на XFS с квотами проектов ({mp}), overlay2",
                    "a rental's disk limit is supported: {root} is on XFS with project quotas ({mp}), overlay2"
                ),
            )
        }
        Some(m) => {
            let (fs, mp) = (m.fstype.clone(), m.mount_point.display().to_string());
            Finding::warn(
                DISK_LIMIT,
                tr!(
                    lang,
                    "ограничение диска аренды не поддерживается: {root} на {fs} ({mp}) без квот проектов XFS; диск аренды ограничен только свободным местом",
                    "a rental's disk limit is not supported: {root} is on {fs} ({mp}) without XFS project quotas; a rental's disk is bounded only by the free space"
                ),
                fix,
            )
        }
        None => Finding::warn(
            DISK_LIMIT,
            tr!(
                lang,
                "ограничение диска аренды не поддерживается: не удалось узнать файловую систему {root}",
                "a rental's disk limit is not supported: the filesystem of {root} could not be read"
            ),
            fix,
        ),
    }
}

pub fn dpkg_lock(f: &Facts, lang: Lang) -> Finding {
    match &f.dpkg_lock {
        LockFacts::Free if !f.dpkg_interrupted.is_empty() => {
            let n = f.dpkg_interrupted.len();
            Finding::warn(
                DPKG_LOCK,
                tr!(
                    lang,
                    "dpkg был прерван: остановленная установка или обновление не закончены ({n} в /var/lib/dpkg/updates)",
                    "dpkg was interrupted: a stopped install or update is unfinished ({n} in /var/lib/dpkg/updates)"
                ),
                Some(tr!(
                    lang,
                    "установщик сначала закончит её сам: dpkg --configure -a",
                    "the installer finishes it first: dpkg --configure -a"
                )),
            )
        }
        LockFacts::Free => Finding::pass(DPKG_LOCK, tr!(lang, "dpkg свободен", "dpkg is not locked")),
        LockFacts::Held { path, pid } => {
            let p = path.display();
            Finding::warn(
                DPKG_LOCK,
                tr!(
                    lang,
                    "{p} занят процессом {pid}: сейчас идёт другая установка или обновление",
                    "{p} is held by process {pid}: another install or update is running"
                ),
                Some(tr!(
                    lang,
                    "дождитесь её окончания (например, unattended-upgrades) и запустите установщик снова",
                    "wait for it to finish (for example unattended-upgrades) and run the installer again"
                )),
            )
        }
        LockFacts::Unknown(e) if f.euid != 0 => Finding::skip(
            DPKG_LOCK,
            tr!(
                lang,
                "без root блокировку dpkg не проверить ({e})",
                "cannot probe dpkg's lock without root ({e})"
            ),
        ),
        LockFacts::Unknown(e) => Finding::warn(
            DPKG_LOCK,
            tr!(lang, "не удалось проверить блокировку dpkg: {e}", "could not probe dpkg's lock: {e}"),
            None,
        ),
    }
}

pub fn existing_install(f: &Facts, cx: &Context, lang: Lang) -> Finding {
    let e = &f.existing;
    if !e.any() {
        return Finding::pass(
            EXISTING_INSTALL,
            tr!(lang, "агент gpum не установлен", "no gpum agent is installed"),
        );
    }
    let state = match &e.state {
        Some(Ok(s)) => s,
        Some(Err(err)) => {
            return Finding::warn(
                EXISTING_INSTALL,
                tr!(
                    lang,
                    "агент gpum уже установлен, его состояние не читается: {err}",
                    "a gpum agent is already installed; its state cannot be read: {err}"
                ),
                Some(tr!(
                    lang,
                    "посмотрите sudo /opt/gpum-agent/gpum-agent status; если его сервер ещё есть в личном кабинете, сначала удалите его",
                    "see sudo /opt/gpum-agent/gpum-agent status; if its server still exists in your dashboard, delete it first"
                )),
            );
        }
        None => {
            return Finding::warn(
                EXISTING_INSTALL,
                tr!(
                    lang,
                    "найдены файлы агента gpum, но он ещё ни разу не записал состояние",
                    "gpum agent files exist, but it has never written its state"
                ),
                Some(tr!(
                    lang,
                    "если этот сервер есть в личном кабинете, сначала удалите его",
                    "if this server exists in your dashboard, delete it first"
                )),
            );
        }
    };
    let server = state.server.clone().unwrap_or_else(|| "?".into());
    let node = state.node_id.clone().unwrap_or_else(|| "?".into());
    match &state.stopped {
        Some(s) if s.reason == StopReason::Revoked => Finding::pass(
            EXISTING_INSTALL,
            tr!(
                lang,
                "прежний агент (сервер {node} на {server}) остановлен: сервер удалён или токен заменён; установка заменит его",
                "the previous agent (server {node} on {server}) stopped: server deleted or token replaced; the install replaces it"
            ),
        ),
        _ => {
            let conn = match (&state.connection, &state.stopped) {
                (_, Some(_)) => tr!(lang, "остановлен: ошибка конфигурации", "stopped: configuration error"),
                (Connection::Connected, _) => tr!(lang, "на связи", "connected"),
                (Connection::Connecting, _) => tr!(lang, "подключается", "connecting"),
                (Connection::Unreachable, _) => tr!(lang, "платформа недоступна", "platform unreachable"),
                (Connection::Stopped, _) => tr!(lang, "остановлен", "stopped"),
            };
            match cx.registration {
                Registration::SameCode => Finding::pass(
                    EXISTING_INSTALL,
                    tr!(
                        lang,
                        "агент gpum уже установлен с этим кодом подключения (сервер {node} на {server}, {conn}): установка починит его на месте, сервер останется тем же",
                        "a gpum agent is already installed with this join code (server {node} on {server}, {conn}): the install repairs it in place and keeps the server"
                    ),
                ),
                Registration::Keep => Finding::pass(
                    EXISTING_INSTALL,
                    tr!(
                        lang,
                        "агент gpum уже установлен (сервер {node} на {server}, {conn}): установка без нового кода починит его на месте, сервер останется тем же",
                        "a gpum agent is already installed (server {node} on {server}, {conn}): the install without a new code repairs it in place and keeps the server"
                    ),
                ),
                Registration::NewCode => Finding::warn(
                    EXISTING_INSTALL,
                    tr!(
                        lang,
                        "агент gpum уже установлен (сервер {node} на {server}, {conn}) с другим кодом подключения; его сервер не удалён",
                        "a gpum agent is already installed (server {node} on {server}, {conn}) with another join code; its server was not deleted"
                    ),
                    Some(tr!(
                        lang,
                        "сначала удалите тот сервер в личном кабинете, иначе установка остановится с сообщением «Эта видеокарта уже зарегистрирована на другом сервере»; чтобы только починить установку, запустите установщик без кода",
                        "delete that server in your dashboard first, otherwise the install stops with \"This GPU is already registered to another server\"; to repair the install only, run the installer without a code"
                    )),
                ),
                Registration::Unknown => Finding::warn(
                    EXISTING_INSTALL,
                    tr!(
                        lang,
                        "агент gpum уже установлен (сервер {node} на {server}, {conn}); его сервер не удалён",
                        "a gpum agent is already installed (server {node} on {server}, {conn}); its server was not deleted"
                    ),
                    Some(tr!(
                        lang,
                        "чтобы починить установку, запустите установщик снова с тем же кодом или без кода: сервер останется тем же; для нового кода сначала удалите тот сервер в личном кабинете, иначе установка остановится с сообщением «Эта видеокарта уже зарегистрирована на другом сервере»",
                        "to repair the install, run the installer again with the same code or without one: the server stays the same; for a new code, delete that server in your dashboard first, otherwise the install stops with \"This GPU is already registered to another server\""
                    )),
                ),
            }
        }
    }
}

pub fn platform(f: &Facts, lang: Lang) -> Finding {
    match &f.platform {
        PlatformFacts::Offline => {
            Finding::skip(PLATFORM, tr!(lang, "пропущено (--offline)", "skipped (--offline)"))
        }
        PlatformFacts::NoServer => Finding::skip(
            PLATFORM,
            tr!(
                lang,
                "пропущено: адрес платформы не указан (--server)",
                "skipped: no platform URL given (--server)"
            ),
        ),
        PlatformFacts::Reachable { url, status } => Finding::pass(
            PLATFORM,
            tr!(
                lang,
                "{url} отвечает по защищённому соединению (HTTP {status})",
                "{url} answers over a verified connection (HTTP {status})"
            ),
        ),
        PlatformFacts::Unreachable { url, error } => Finding::fail(
            PLATFORM,
            tr!(lang, "{url} недоступен: {error}", "{url} is unreachable: {error}"),
            Some(tr!(
                lang,
                "проверьте выход в интернет (исходящий HTTPS), прокси и DNS",
                "check internet access (outgoing HTTPS), proxy and DNS"
            )),
        ),
        PlatformFacts::BadUrl { url, error } => Finding::fail(
            PLATFORM,
            tr!(
                lang,
                "адрес платформы {url} не подходит: {error}",
                "the platform URL {url} cannot be used: {error}"
            ),
            Some(tr!(
                lang,
                "скопируйте команду из личного кабинета целиком",
                "copy the command from your dashboard in full"
            )),
        ),
    }
}

/// The status of the check `id` in `findings`.
pub fn status_of(findings: &[Finding], id: &str) -> Option<Status> {
    findings.iter().find(|f| f.id == id).map(|f| f.status)
}
