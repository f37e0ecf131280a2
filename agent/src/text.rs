//! Every line the `gpum-agent` CLI prints besides gpum-common's `Failure`s (`uninstall`,
//! `register`, `smoke`, `status`): one [`gpum_common::texts!`] table, Russian and English side
//! by side. `{name}` holes are filled with [`gpum_common::texts::fill`].

gpum_common::texts! {
    /// A line the agent's CLI prints.
    pub enum Msg {
        // `uninstall`.
        UninstallPrompt => (
            "Удалить службу gpum-agent, её файлы и контейнеры с метками gpum.managed=true и gpum.probe=true? Docker, драйверы и образы останутся",
            "Remove the gpum-agent service, its files and the containers labelled gpum.managed=true and gpum.probe=true? Docker, drivers and images stay",
        ),
        UninstallDeclined => ("Ничего не удалено.", "Nothing was removed."),
        UninstallServiceRemoved => (
            "служба {name} (остановлена, отключена)",
            "service {name} (stopped, disabled)",
        ),
        UninstallContainerRemoved => ("контейнер {name} ({label}=true)", "container {name} ({label}=true)"),
        UninstallNetworkRemoved => ("сеть Docker {name}", "Docker network {name}"),
        UninstallTableRemoved => (
            "таблица nftables {table} (правила, отрезавшие аренды от вашей сети)",
            "nftables table {table} (the rules that cut rentals off from your network)",
        ),
        UninstallTestScopeKeeps => (
            "тестовая область: сеть аренд и таблица nftables общие для машины и оставлены",
            "test scope: the rentals' network and nftables table are the machine's and were left",
        ),
        UninstallNoService => ("службы gpum-agent нет", "no gpum-agent service"),
        UninstallNoSystemd => (
            "systemd не запущен: останавливать службу не нужно",
            "systemd is not running: there is no service to stop",
        ),
        UninstallContainersLeft => (
            "контейнеры с меткой {label}=true не удалены ({error}); когда Docker заработает, удалите их: \
             docker rm -f $(docker ps -aq --filter label={label}=true) (сначала проверьте список: \
             контейнеры, получившие метку от своего образа, принадлежат не gpum)",
            "containers labelled {label}=true were not removed ({error}); once Docker runs, remove them with \
             docker rm -f $(docker ps -aq --filter label={label}=true) (check the list first: a container \
             that got the label from its image is not gpum's)",
        ),
        UninstallNothingFound => (
            "Удалять нечего: gpum-agent не найден.",
            "Nothing to remove: gpum-agent was not found.",
        ),
        UninstallRemoved => ("Удалено:", "Removed:"),
        UninstallNote => ("Примечание:", "Note:"),
        UninstallFailed => ("Не удалось:", "Failed:"),
        UninstallLeftInPlace => (
            "Docker, драйверы и образы оставлены на месте.",
            "Docker, the drivers and the images were left in place.",
        ),
        // `register` and `smoke`.
        Registered => (
            "Сервер зарегистрирован: {node}. Настройки записаны в {config}.",
            "Registered as node {node}. The config is in {config}.",
        ),
        SmokeOk => ("ok: {detail}", "ok: {detail}"),
        SmokeFailed => (
            "проверка связи не прошла (код {code}): {detail}",
            "smoke failed (exit {code}): {detail}",
        ),
        // `status`: each label is at most 15 characters, so that the values line up.
        StatusNeverRan => (
            "Агент ещё не запускался: состояния нет. Зарегистрируйте его установщиком.",
            "The agent has not run yet: there is no state. Register it with the installer.",
        ),
        StatusNode => ("сервер:", "node:"),
        StatusServer => ("платформа:", "server:"),
        StatusConnection => ("соединение:", "connection:"),
        StatusLastHeartbeat => ("был на связи:", "last heartbeat:"),
        StatusVerification => ("проверка:", "verification:"),
        StatusDocker => ("Docker:", "docker:"),
        StatusClockSkew => ("разница часов:", "clock skew:"),
        StatusLastError => ("ошибка:", "last error:"),
        StatusStopped => ("остановлен:", "stopped:"),
        StatusQuarantine => ("карантин:", "quarantine:"),
        StatusConnecting => ("подключается", "connecting"),
        StatusConnected => ("подключён", "connected"),
        StatusUnreachable => ("платформа недоступна (повторяет попытки)", "unreachable (retrying)"),
        StatusStoppedValue => ("остановлен", "stopped"),
        StatusNever => ("ещё не было", "never"),
        StatusAwaitingCheck => ("ожидает проверки", "awaiting_check"),
        StatusVerified => ("оборудование проверено", "verified"),
        StatusCheckFailed => ("проверка не пройдена", "failed"),
        StatusDockerOk => ("работает", "ok"),
        StatusDockerUnavailable => ("недоступен", "unavailable"),
        StatusAgo => ("{date} ({secs} с назад)", "{date} ({secs} s ago)"),
        StatusSkew => (
            "{skew} с (часы этой машины минус часы платформы; проверьте NTP)",
            "{skew} s (this machine minus the platform; check NTP)",
        ),
        StatusStop => ("{message} ({detail}, {ago})", "{message} ({detail}, {ago})"),
        StatusQuarantined => (
            "{reason} (GPU: {gpus}; {ago}). Аренды не начнутся, пока повторная проверка (recheck) не найдёт GPU свободными.",
            "{reason} (GPUs: {gpus}; {ago}). No rental starts until a recheck finds the GPUs free.",
        ),
        // The last upgrade (issue 47), in `status` and `doctor`.
        StatusUpgrade => ("обновление:", "upgrade:"),
        UpgradeValue => ("{from} → {to}: {outcome} ({ago})", "{from} → {to}: {outcome} ({ago})"),
        UpgradePending => (
            "ждёт первого ответа платформы новой версии",
            "waiting for the new version's first accepted heartbeat",
        ),
        UpgradeSucceeded => ("выполнено", "succeeded"),
        UpgradeRolledBack => (
            "откачено к прежней версии: {detail}",
            "rolled back to the previous version: {detail}",
        ),
        UpgradeRefused => (
            "отклонено проверкой, ничего не изменено: {detail}",
            "refused by verification, nothing changed: {detail}",
        ),
        UpgradeFailed => (
            "не удалось, ничего не изменено, будет повторено: {detail}",
            "failed, nothing changed, will be retried: {detail}",
        ),
        // `doctor`: each label is at most 17 characters, so that the values line up.
        DoctorHost => ("[машина]", "[host]"),
        DoctorOs => ("система:", "os:"),
        DoctorKernel => ("ядро:", "kernel:"),
        DoctorArch => ("архитектура:", "arch:"),
        DoctorCpu => ("процессор:", "cpu:"),
        DoctorCpuValue => ("{model} (потоков: {threads})", "{model} ({threads} threads)"),
        DoctorRam => ("память:", "ram:"),
        DoctorRamValue => ("{mib} МиБ", "{mib} MiB"),
        DoctorDiskFree => ("место на диске:", "disk free:"),
        DoctorDiskFreeValue => ("{gib} ГиБ свободно (каталог данных Docker)", "{gib} GiB (Docker data root)"),
        DoctorRuntime => ("[среда контейнеров]", "[runtime]"),
        DoctorDockerSocket => ("сокет Docker:", "docker socket:"),
        DoctorDocker => ("Docker:", "docker:"),
        DoctorDockerUnavailable => ("недоступен: {error}", "unavailable: {error}"),
        DoctorNvidiaRuntime => ("среда nvidia:", "nvidia runtime:"),
        DoctorYes => ("есть", "yes"),
        DoctorNo => ("нет", "no"),
        DoctorGpu => ("[видеокарты]", "[gpu]"),
        DoctorNvml => ("NVML:", "nvml:"),
        DoctorNvmlOk => ("работает", "ok"),
        DoctorNvmlLibraryMissing => (
            "нет драйвера (libnvidia-ml не найдена)",
            "no driver (libnvidia-ml not found)",
        ),
        DoctorNvmlMismatch => (
            "версии драйвера и библиотеки различаются",
            "driver/library version mismatch",
        ),
        DoctorNvmlNoDevices => ("видеокарт не найдено", "no GPUs found"),
        DoctorNvmlError => ("ошибка: {detail}", "error: {detail}"),
        DoctorDriver => ("драйвер:", "driver:"),
        DoctorCuda => ("CUDA:", "cuda:"),
        DoctorGpuN => ("видеокарта {i}:", "gpu {i}:"),
        DoctorGpuValue => ("{model} ({mib} МиБ)", "{model} ({mib} MiB)"),
        DoctorPlatform => ("[платформа]", "[platform]"),
        DoctorConfig => ("настройки:", "config:"),
        DoctorConfigError => ("ошибка настроек:", "config error:"),
        DoctorServer => ("платформа:", "server:"),
        DoctorNode => ("сервер:", "node:"),
        DoctorToken => ("токен:", "token:"),
        DoctorTokenRedacted => ("<скрыт>", "<redacted>"),
        DoctorTokenAbsent => ("нет", "absent"),
        DoctorHandshake => ("проверка связи:", "handshake:"),
        DoctorHandshakeValue => ("{detail} (код {code})", "{detail} (exit {code})"),
        DoctorClockSkew => ("разница часов:", "clock skew:"),
        DoctorClockSkewValue => ("{skew} с", "{skew} s"),
        DoctorUpgrade => ("обновление:", "upgrade:"),
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
