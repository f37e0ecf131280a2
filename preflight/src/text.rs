//! Every text the checks report: one [`gpum_common::texts!`] table, Russian and English side by
//! side, grouped by check in the order of [`crate::checks::ALL`]. `{name}` holes are filled by the
//! checks; a `…Fix` row is a finding's fix.

gpum_common::texts! {
    /// A check's message or fix.
    pub enum Msg {
        // `root`.
        RootOk => ("запущено от имени root", "running as root"),
        RootNotRoot => (
            "Установщик нужно запускать от имени root (сейчас uid {uid})",
            "the installer must run as root (uid is {uid})",
        ),
        RootFix => ("повторите команду с sudo", "repeat the command with sudo"),
        // `systemd`.
        SystemdOk => ("systemd запущен (PID 1)", "systemd is running (PID 1)"),
        SystemdMissing => (
            "На этой машине не запущен systemd (нет /run/systemd/system)",
            "systemd is not running on this machine (no /run/systemd/system)",
        ),
        SystemdFix => (
            "контейнеры, WSL и системы без systemd не поддерживаются: установите на машину или ВМ, загруженную с systemd",
            "containers, WSL and systems without systemd are not supported: install on a machine or VM booted with systemd",
        ),
        // `os`.
        OsUnreadable => ("не удалось определить систему: {e}", "cannot tell the operating system: {e}"),
        OsUnreadableFix => ("нужна Ubuntu 22.04", "Ubuntu 22.04 is required"),
        OsNotVerifiedWithGpu => (
            "{name}: поддерживается, но установка с видеокартой ещё не проверена",
            "{name}: supported, but not verified with a GPU yet",
        ),
        OsNotVerifiedWithGpuFix => (
            "проверенная система: Ubuntu 22.04",
            "the verified system is Ubuntu 22.04",
        ),
        OsUnsupported => ("{name} не поддерживается", "{name} is not supported"),
        OsUnsupportedFix => (
            "нужна Ubuntu 22.04 (проверено) или Ubuntu 24.04 / Debian 12 (без проверки с видеокартой)",
            "use Ubuntu 22.04 (verified), or Ubuntu 24.04 / Debian 12 (not verified with a GPU)",
        ),
        // `arch`.
        ArchUnsupported => ("архитектура {a} не поддерживается", "architecture {a} is not supported"),
        ArchFix => ("нужна машина x86_64", "an x86_64 machine is required"),
        // `tmp_exec`.
        TmpExecNoexecFixTmpdir => (
            "укажите каталог, где запуск разрешён, например: sudo env TMPDIR=/var/tmp bash",
            "point TMPDIR at a directory that allows running programs, for example: sudo env TMPDIR=/var/tmp bash",
        ),
        TmpExecNoexecFixCommand => (
            "замените в команде установки sudo bash на sudo env TMPDIR=/var/tmp bash",
            "in the install command, replace sudo bash with sudo env TMPDIR=/var/tmp bash",
        ),
        TmpExecNoexec => (
            "{var} смонтирован с запретом запуска (noexec, точка монтирования {mp})",
            "{var} is mounted noexec (mount point {mp})",
        ),
        TmpExecOk => (
            "{var} разрешает запуск программ (точка монтирования {mp})",
            "{var} allows running programs (mount point {mp})",
        ),
        TmpExecUnknown => ("не удалось проверить {dir}: {why}", "could not check {dir}: {why}"),
        TmpExecUnknownFix => (
            "если {dir} смонтирован с noexec, используйте sudo env TMPDIR=/var/tmp bash",
            "if {dir} is mounted noexec, use sudo env TMPDIR=/var/tmp bash",
        ),
        // `disk`.
        DiskProbedInstead => ("{probed} (каталога {root} ещё нет)", "{probed} ({root} does not exist yet)"),
        DiskOk => ("свободно {free} ГБ под Docker: {at}", "{free} GB free for Docker at {at}"),
        DiskLow => (
            "под Docker свободно {free} ГБ ({at}), нужно не менее {need} ГБ",
            "only {free} GB free for Docker at {at}; at least {need} GB is needed",
        ),
        DiskLowFix => (
            "освободите место на этом разделе или укажите data-root на другом диске в /etc/docker/daemon.json",
            "free space on that filesystem, or set data-root in /etc/docker/daemon.json to a larger disk",
        ),
        DiskUnknown => ("не удалось узнать свободное место: {e}", "could not measure free space: {e}"),
        DiskUnknownFix => (
            "проверьте df -h {probed}: нужно не менее {need} ГБ",
            "check df -h {probed}: at least {need} GB is needed",
        ),
        // `nvidia_driver`.
        NvidiaDriverInstallFix => (
            "установите драйвер NVIDIA (например, sudo ubuntu-drivers install) и перезагрузите машину; gpum драйвер не ставит",
            "install the NVIDIA driver (for example sudo ubuntu-drivers install) and reboot; gpum does not install drivers",
        ),
        NvidiaDriverOk => (
            "драйвер {driver}, видеокарт: {n} ({list})",
            "driver {driver}, {n} GPU(s): {list}",
        ),
        NvidiaDriverLibraryMissing => (
            "драйвер NVIDIA не найден: библиотека {lib} не загружается ({detail})",
            "NVIDIA driver not found: library {lib} cannot be loaded ({detail})",
        ),
        NvidiaDriverLibraryBroken => (
            "библиотека {lib} повреждена или не та: {detail}",
            "library {lib} is broken or not NVML: {detail}",
        ),
        NvidiaDriverLibraryBrokenFix => ("переустановите драйвер NVIDIA", "reinstall the NVIDIA driver"),
        NvidiaDriverNotLoaded => (
            "драйвер NVIDIA установлен, но модуль ядра не загружен",
            "the NVIDIA driver is installed but its kernel module is not loaded",
        ),
        NvidiaDriverRebootFix => (
            "перезагрузите машину; проверьте nvidia-smi",
            "reboot the machine, then check nvidia-smi",
        ),
        NvidiaDriverVersionMismatch => (
            "версии драйвера NVIDIA в ядре и библиотеки различаются (драйвер обновлён без перезагрузки)",
            "NVIDIA driver/library version mismatch (the driver was updated without a reboot)",
        ),
        NvidiaDriverNoPermission => (
            "нет прав на обращение к драйверу NVIDIA",
            "no permission to talk to the NVIDIA driver",
        ),
        NvidiaDriverNoPermissionFix => ("запустите установщик через sudo", "run the installer with sudo"),
        NvidiaDriverNoDevices => (
            "драйвер NVIDIA {driver} работает, но видеокарт не видно",
            "NVIDIA driver {driver} works but sees no GPU",
        ),
        NvidiaDriverNoDevicesFix => (
            "проверьте nvidia-smi и lspci | grep -i nvidia; в ВМ видеокарта должна быть проброшена",
            "check nvidia-smi and lspci | grep -i nvidia; in a VM the GPU must be passed through",
        ),
        NvidiaDriverNvmlError => ("ошибка NVML: {e}", "NVML error: {e}"),
        NvidiaDriverNvmlErrorFix => ("проверьте nvidia-smi", "check nvidia-smi"),
        // `docker`.
        DockerDaemonJsonBad => (
            "файл настроек Docker не читается: {e}",
            "Docker's settings file cannot be used: {e}",
        ),
        DockerDaemonJsonBadFix => (
            "исправьте синтаксис JSON в /etc/docker/daemon.json (установщик дополняет этот файл)",
            "fix the JSON in /etc/docker/daemon.json (the installer adds to that file)",
        ),
        DockerSnap => (
            "Docker установлен из snap: с ним не работает NVIDIA Container Toolkit",
            "Docker is installed as a snap, which the NVIDIA Container Toolkit does not work with",
        ),
        DockerSnapFix => (
            "удалите его (sudo snap remove docker) и запустите установщик снова: он поставит Docker Engine из официального репозитория",
            "remove it (sudo snap remove docker) and run the installer again: it installs Docker Engine from Docker's repository",
        ),
        DockerAbsent => (
            "Docker не установлен: установщик поставит Docker Engine из официального репозитория",
            "Docker is not installed: the installer will install Docker Engine from Docker's repository",
        ),
        DockerOk => ("Docker {v} ({pkg})", "Docker {v} ({pkg})"),
        DockerNoRoot => (
            "Docker установлен ({pkg}), но без root нельзя спросить его версию",
            "Docker is installed ({pkg}), but its version cannot be asked without root",
        ),
        DockerNoRootFix => ("запустите проверку через sudo", "run the check with sudo"),
        DockerSilent => (
            "Docker установлен ({pkg}), но не отвечает: {e}",
            "Docker is installed ({pkg}) but does not answer: {e}",
        ),
        DockerSilentFix => (
            "запустите его: sudo systemctl start docker",
            "start it: sudo systemctl start docker",
        ),
        // `nvidia_toolkit`.
        NvidiaToolkitAbsent => (
            "NVIDIA Container Toolkit не установлен: установщик поставит его из репозитория NVIDIA",
            "NVIDIA Container Toolkit is not installed: the installer will install it from NVIDIA's repository",
        ),
        NvidiaToolkitUnpackaged => (
            "nvidia-ctk найден, но пакет nvidia-container-toolkit не установлен: версию проверить нельзя, а версии до {min} уязвимы ({cve}, выход из контейнера)",
            "nvidia-ctk is present but the nvidia-container-toolkit package is not installed: its version cannot be checked, and versions before {min} are vulnerable ({cve}, container escape)",
        ),
        NvidiaToolkitUnpackagedFix => (
            "удалите ручную установку и поставьте пакет nvidia-container-toolkit {min} или новее из репозитория NVIDIA",
            "remove the manual install and install the nvidia-container-toolkit package {min} or newer from NVIDIA's repository",
        ),
        NvidiaToolkitVulnerable => (
            "NVIDIA Container Toolkit {ver} уязвим ({cve}): образ контейнера может получить права root на этой машине",
            "NVIDIA Container Toolkit {ver} is vulnerable ({cve}): a container image can get root on this machine",
        ),
        NvidiaToolkitVulnerableUpgraded => (
            "установщик обновит его из репозитория NVIDIA",
            "the installer upgrades it from NVIDIA's repository",
        ),
        NvidiaToolkitVulnerableFix => (
            "обновите его до {min} или новее: sudo apt-get update && sudo apt-get install --only-upgrade nvidia-container-toolkit",
            "upgrade it to {min} or newer: sudo apt-get update && sudo apt-get install --only-upgrade nvidia-container-toolkit",
        ),
        NvidiaToolkitOk => (
            "NVIDIA Container Toolkit {ver}; среда nvidia настроена в /etc/docker/daemon.json",
            "NVIDIA Container Toolkit {ver}; the nvidia runtime is set in /etc/docker/daemon.json",
        ),
        NvidiaToolkitNoRuntime => (
            "NVIDIA Container Toolkit {ver} установлен, но в Docker нет среды nvidia: установщик настроит её и перезапустит Docker",
            "NVIDIA Container Toolkit {ver} is installed, but Docker has no nvidia runtime: the installer will configure it and restart Docker",
        ),
        NvidiaToolkitNoRuntimeFix => (
            "контейнеры без политики автозапуска при перезапуске Docker остановятся",
            "containers without a restart policy stop when Docker restarts",
        ),
        // `nftables`.
        NftablesOk => ("nftables есть ({p}): для аренд", "nftables is present ({p}): for rentals"),
        NftablesMissing => (
            "аренды требуют nftables: nft не найден, и агент не запустит ни одной аренды",
            "rentals need nftables: nft was not found, and the agent will run no rental",
        ),
        NftablesMissingFix => ("установите его: apt install nftables", "install it: apt install nftables"),
        // `toolkit_gpu_access`.
        ToolkitGpuAccessConfigBad => (
            "настройки NVIDIA Container Toolkit не читаются: {e}",
            "the NVIDIA Container Toolkit's settings cannot be used: {e}",
        ),
        ToolkitGpuAccessConfigBadFix => (
            "исправьте синтаксис TOML в {file} (установщик меняет в нём две настройки)",
            "fix the TOML in {file} (the installer changes two settings there)",
        ),
        ToolkitGpuAccessOk => (
            "контейнер без привилегий получает только GPU, выданные ему при создании: {env} = false, {mounts} = true",
            "an unprivileged container gets only the GPUs it was created with: {env} = false, {mounts} = true",
        ),
        ToolkitGpuAccessWillSet => (
            "установщик выключит выбор GPU переменной NVIDIA_VISIBLE_DEVICES образа ({env} = false в {file})",
            "the installer turns off GPU choice by an image's NVIDIA_VISIBLE_DEVICES ({env} = false in {file})",
        ),
        ToolkitGpuAccessOpen => (
            "контейнер без привилегий может взять любые GPU, задав NVIDIA_VISIBLE_DEVICES (например, all)",
            "an unprivileged container can take any GPU by setting NVIDIA_VISIBLE_DEVICES (all, for instance)",
        ),
        ToolkitGpuAccessOpenFix => (
            "установщик задаст {env} = false и {mounts} = true в {file} (копия прежнего файла останется рядом)",
            "the installer sets {env} = false and {mounts} = true in {file} (a copy of the old file stays beside it)",
        ),
        // `live_restore`.
        LiveRestoreDaemonJsonBad => (
            "файл настроек Docker не читается (см. docker)",
            "Docker's settings file cannot be used (see docker)",
        ),
        LiveRestoreSwarm => (
            "Docker в режиме swarm: он несовместим с live-restore, без которого перезапуск Docker останавливает аренды, а с ним swarm не запустится после перезапуска Docker",
            "Docker is in swarm mode: it cannot be combined with live-restore, without which a Docker restart stops rentals, and with which the swarm does not start after a Docker restart",
        ),
        LiveRestoreSwarmFix => (
            "выведите сервер из swarm (docker swarm leave) или сдавайте другой сервер",
            "take the machine out of the swarm (docker swarm leave) or rent out another machine",
        ),
        LiveRestoreOnByFlag => (
            "live-restore включён флагом dockerd --live-restore: контейнеры работают, пока Docker перезапускается",
            "live-restore is on by dockerd's --live-restore flag: containers keep running while Docker restarts",
        ),
        LiveRestoreOffByFlag => (
            "dockerd запущен с --live-restore=false: перезапуск Docker останавливает все контейнеры, и аренды тоже, а включить live-restore в daemon.json при этом флаге нельзя (Docker не запустится)",
            "dockerd runs with --live-restore=false: a Docker restart stops every container, rentals included, and daemon.json cannot turn live-restore on while that flag is given (Docker would not start)",
        ),
        LiveRestoreOffByFlagFix => (
            "уберите --live-restore=false из командной строки dockerd (systemctl edit docker), перезапустите Docker и запустите установщик снова",
            "remove --live-restore=false from dockerd's command line (systemctl edit docker), restart Docker and run the installer again",
        ),
        LiveRestoreOk => (
            "live-restore включён: контейнеры работают, пока Docker перезапускается",
            "live-restore is on: containers keep running while Docker restarts",
        ),
        LiveRestoreWillSet => (
            "установщик включит live-restore в /etc/docker/daemon.json",
            "the installer turns live-restore on in /etc/docker/daemon.json",
        ),
        LiveRestoreOff => (
            "live-restore выключен: перезапуск Docker останавливает все контейнеры, и аренды тоже",
            "live-restore is off: a Docker restart stops every container, rentals included",
        ),
        LiveRestoreOffFix => (
            "установщик добавит \"live-restore\": true в /etc/docker/daemon.json и перечитает настройки Docker (без перезапуска)",
            "the installer adds \"live-restore\": true to /etc/docker/daemon.json and reloads Docker (no restart)",
        ),
        // `disk_limit`.
        DiskLimitFix => (
            "чтобы ограничивать диск каждой аренды, разместите каталог данных Docker на XFS, смонтированной с prjquota, с драйвером overlay2",
            "to limit each rental's disk, put Docker's data root on XFS mounted with prjquota, with the overlay2 driver",
        ),
        DiskLimitStorageDriver => (
            "ограничение диска аренды не поддерживается: драйвер хранения {driver}, а не overlay2",
            "a rental's disk limit is not supported: the storage driver is {driver}, not overlay2",
        ),
        DiskLimitOk => (
            "ограничение диска аренды поддерживается: {root} на XFS с квотами проектов ({mp}), overlay2",
            "a rental's disk limit is supported: {root} is on XFS with project quotas ({mp}), overlay2",
        ),
        DiskLimitNoQuota => (
            "ограничение диска аренды не поддерживается: {root} на {fs} ({mp}) без квот проектов XFS; диск аренды ограничен только свободным местом",
            "a rental's disk limit is not supported: {root} is on {fs} ({mp}) without XFS project quotas; a rental's disk is bounded only by the free space",
        ),
        DiskLimitUnknown => (
            "ограничение диска аренды не поддерживается: не удалось узнать файловую систему {root}",
            "a rental's disk limit is not supported: the filesystem of {root} could not be read",
        ),
        // `dpkg_lock`.
        DpkgLockInterrupted => (
            "dpkg был прерван: остановленная установка или обновление не закончены ({n} в /var/lib/dpkg/updates)",
            "dpkg was interrupted: a stopped install or update is unfinished ({n} in /var/lib/dpkg/updates)",
        ),
        DpkgLockInterruptedFix => (
            "установщик сначала закончит её сам: dpkg --configure -a",
            "the installer finishes it first: dpkg --configure -a",
        ),
        DpkgLockOk => ("dpkg свободен", "dpkg is not locked"),
        DpkgLockHeld => (
            "{p} занят процессом {pid}: сейчас идёт другая установка или обновление",
            "{p} is held by process {pid}: another install or update is running",
        ),
        DpkgLockHeldFix => (
            "дождитесь её окончания (например, unattended-upgrades) и запустите установщик снова",
            "wait for it to finish (for example unattended-upgrades) and run the installer again",
        ),
        DpkgLockNoRoot => (
            "без root блокировку dpkg не проверить ({e})",
            "cannot probe dpkg's lock without root ({e})",
        ),
        DpkgLockUnknown => ("не удалось проверить блокировку dpkg: {e}", "could not probe dpkg's lock: {e}"),
        // `existing_install`.
        ExistingInstallNone => ("агент gpum не установлен", "no gpum agent is installed"),
        ExistingInstallStateUnreadable => (
            "агент gpum уже установлен, его состояние не читается: {err}",
            "a gpum agent is already installed; its state cannot be read: {err}",
        ),
        ExistingInstallStateUnreadableFix => (
            "посмотрите sudo /opt/gpum-agent/gpum-agent status; если его сервер ещё есть в личном кабинете, сначала удалите его",
            "see sudo /opt/gpum-agent/gpum-agent status; if its server still exists in your dashboard, delete it first",
        ),
        ExistingInstallNoState => (
            "найдены файлы агента gpum, но он ещё ни разу не записал состояние",
            "gpum agent files exist, but it has never written its state",
        ),
        ExistingInstallNoStateFix => (
            "если этот сервер есть в личном кабинете, сначала удалите его",
            "if this server exists in your dashboard, delete it first",
        ),
        ExistingInstallRevoked => (
            "прежний агент (сервер {node} на {server}) остановлен: сервер удалён или токен заменён; установка заменит его",
            "the previous agent (server {node} on {server}) stopped: server deleted or token replaced; the install replaces it",
        ),
        ExistingInstallConnStoppedConfig => (
            "остановлен: ошибка конфигурации",
            "stopped: configuration error",
        ),
        ExistingInstallConnConnected => ("на связи", "connected"),
        ExistingInstallConnConnecting => ("подключается", "connecting"),
        ExistingInstallConnUnreachable => ("платформа недоступна", "platform unreachable"),
        ExistingInstallConnStopped => ("остановлен", "stopped"),
        ExistingInstallSameCode => (
            "агент gpum уже установлен с этим кодом подключения (сервер {node} на {server}, {conn}): установка починит его на месте, сервер останется тем же",
            "a gpum agent is already installed with this join code (server {node} on {server}, {conn}): the install repairs it in place and keeps the server",
        ),
        ExistingInstallKeep => (
            "агент gpum уже установлен (сервер {node} на {server}, {conn}): установка без нового кода починит его на месте, сервер останется тем же",
            "a gpum agent is already installed (server {node} on {server}, {conn}): the install without a new code repairs it in place and keeps the server",
        ),
        ExistingInstallNewCode => (
            "агент gpum уже установлен (сервер {node} на {server}, {conn}) с другим кодом подключения; его сервер не удалён",
            "a gpum agent is already installed (server {node} on {server}, {conn}) with another join code; its server was not deleted",
        ),
        ExistingInstallNewCodeFix => (
            "сначала удалите тот сервер в личном кабинете, иначе установка остановится с сообщением «Эта видеокарта уже зарегистрирована на другом сервере»; чтобы только починить установку, запустите установщик без кода",
            "delete that server in your dashboard first, otherwise the install stops with \"This GPU is already registered to another server\"; to repair the install only, run the installer without a code",
        ),
        ExistingInstallUnknown => (
            "агент gpum уже установлен (сервер {node} на {server}, {conn}); его сервер не удалён",
            "a gpum agent is already installed (server {node} on {server}, {conn}); its server was not deleted",
        ),
        ExistingInstallUnknownFix => (
            "чтобы починить установку, запустите установщик снова с тем же кодом или без кода: сервер останется тем же; для нового кода сначала удалите тот сервер в личном кабинете, иначе установка остановится с сообщением «Эта видеокарта уже зарегистрирована на другом сервере»",
            "to repair the install, run the installer again with the same code or without one: the server stays the same; for a new code, delete that server in your dashboard first, otherwise the install stops with \"This GPU is already registered to another server\"",
        ),
        // `platform`.
        PlatformOffline => ("пропущено (--offline)", "skipped (--offline)"),
        PlatformNoServer => (
            "пропущено: адрес платформы не указан (--server)",
            "skipped: no platform URL given (--server)",
        ),
        PlatformReachable => (
            "{url} отвечает по защищённому соединению (HTTP {status})",
            "{url} answers over a verified connection (HTTP {status})",
        ),
        PlatformUnreachable => ("{url} недоступен: {error}", "{url} is unreachable: {error}"),
        PlatformUnreachableFix => (
            "проверьте выход в интернет (исходящий HTTPS), прокси и DNS",
            "check internet access (outgoing HTTPS), proxy and DNS",
        ),
        PlatformBadUrl => (
            "адрес платформы {url} не подходит: {error}",
            "the platform URL {url} cannot be used: {error}",
        ),
        PlatformBadUrlFix => (
            "скопируйте команду из личного кабинета целиком",
            "copy the command from your dashboard in full",
        ),
    }
}

#[cfg(test)]
mod tests {
    use gpum_common::Lang;

    use super::*;

    #[test]
    fn every_row_has_both_languages_with_the_same_holes() {
        for m in Msg::ALL {
            if let Err(e) = gpum_common::texts::check(m.text(Lang::Ru), m.text(Lang::En)) {
                panic!("{m:?}: {e}");
            }
        }
    }
}
