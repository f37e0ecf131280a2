//! Every line `gpum-install` prints besides the checks (their texts are preflight's) and the
//! failures (gpum-common's `Failure`): one [`gpum_common::texts!`] table, Russian and English
//! side by side. `{name}` holes are filled by the caller.

use gpum_common::Lang;

gpum_common::texts! {
    /// A line the installer prints.
    pub enum Msg {
        // The dry run's human report (`crate::report`).
        ReportTitle => (
            "Проверка машины (--dry-run: ничего не изменяется)",
            "Machine check (--dry-run: nothing is changed)",
        ),
        ReportFix => ("что сделать", "fix"),
        ReportPlan => ("Установка сделает:", "The install would:"),
        ReportReady => (
            "Машина готова к установке. Запустите команду из личного кабинета без --dry-run.",
            "The machine is ready. Run the command from your dashboard without --dry-run.",
        ),
        StepDownload => (
            "скачать агент {url}, проверить подпись (имя, версия, SHA-256) и пробно запустить",
            "download the agent {url}, verify its signature (name, version, SHA-256) and test-run it",
        ),
        StepAddRepo => (
            "добавить репозиторий {id}: {repo}; ключ {key_url}, принимается только отпечаток {fprs}; файлы {files}",
            "add repository {id}: {repo}; key {key_url}, accepted only with fingerprint {fprs}; files {files}",
        ),
        StepUseSource => (
            "использовать ваш источник apt {file} для {id}: его ключ {keyring} — ровно закреплённый, отпечаток {fprs}; источник и ключ не меняются",
            "use your apt source {file} for {id}: its key {keyring} is exactly the pinned one, fingerprint {fprs}; the source and the key are not changed",
        ),
        StepAptUpdate => (
            "обновить списки пакетов (apt-get update)",
            "refresh package lists (apt-get update)",
        ),
        StepInstall => ("установить пакеты: {packages}", "install packages: {packages}"),
        StepConfigureToolkit => (
            "настройки NVIDIA Container Toolkit {path}: GPU только из списка, который задаёт создатель контейнера, а не из NVIDIA_VISIBLE_DEVICES образа ({env} = false, {mounts} = true), остальное сохранить (с резервной копией)",
            "NVIDIA Container Toolkit settings {path}: GPUs only from the list the container's creator sets, never from an image's NVIDIA_VISIBLE_DEVICES ({env} = false, {mounts} = true), keep the rest (with a backup)",
        ),
        StepConfigureDocker => (
            "настройки Docker {path}: добавить среду nvidia и live-restore (контейнеры переживают перезапуск Docker), остальное сохранить (с резервной копией)",
            "Docker settings {path}: add the nvidia runtime and live-restore (containers outlive a Docker restart), keep the rest (with a backup)",
        ),
        StepConfigureDockerRuntime => (
            "настройки Docker {path}: добавить среду nvidia, остальное сохранить (с резервной копией)",
            "Docker settings {path}: add the nvidia runtime, keep the rest (with a backup)",
        ),
        StepReloadDocker => (
            "перечитать настройки Docker (systemctl reload docker; контейнеры не останавливаются)",
            "reload Docker's settings (systemctl reload docker; no container stops)",
        ),
        StepRestartDocker => (
            "перезапустить docker (контейнеров, которые остановятся, нет)",
            "restart docker (no container will stop)",
        ),
        StepRestartDockerStops => (
            "перезапустить docker; остановятся контейнеры без политики автозапуска: {names} (установщик спросит подтверждение)",
            "restart docker; these containers without a restart policy will stop: {names} (the installer asks first)",
        ),
        StepRegister => (
            "зарегистрировать сервер на {server} по коду подключения; записать {config} (0600) с токеном",
            "register the server with {server} using the join code; write {config} (0600) with its token",
        ),
        StepKeepRegistration => (
            "оставить регистрацию установленного агента: сервер {node}, {config} не меняется (починка на месте)",
            "keep the installed agent's registration: server {node}, {config} unchanged (a repair in place)",
        ),
        StepWrite => ("записать {path} ({mode}): {what}", "write {path} ({mode}): {what}"),
        StepStart => (
            "включить и (пере)запустить службу {name}, дождаться первого ответа платформы (до {secs} с)",
            "enable and (re)start the {name} service, wait for the platform's first answer (up to {secs} s)",
        ),
        StepGpuCheck => (
            "дождаться проверки видеокарты внутри контейнера",
            "wait for the GPU check inside a container",
        ),
        FileAgentBinary => ("программа агента", "the agent program"),
        FileAgentUnit => ("служба systemd", "the systemd unit"),
        FileAgentProxy => (
            "настройка службы: откуда брать переменные прокси",
            "the service's setting that names the proxy variables' file",
        ),
        FileAgentProxyEnv => ("переменные прокси для службы", "the proxy variables for the service"),
        FileAgentCa => ("копия --ca-file для агента", "the agent's copy of --ca-file"),
        Done => ("[ ok ]", "[ ok ]"),
        Skipped => ("[skip]", "[skip]"),
        Failed => ("[FAIL]", "[FAIL]"),
        KeysVerified => (
            "ключи репозиториев проверены по отпечаткам: {ids}",
            "repository keys verified against their pinned fingerprints: {ids}",
        ),
        AlreadyPresent => ("уже есть", "already present"),
        SourceKept => ("ваш источник и ключ оставлены как есть", "your source and key are left as they are"),
        Unchanged => ("без изменений", "unchanged"),
        BackupAt => ("резервная копия: {path}", "backup: {path}"),
        LockWait => (
            "{path} занят процессом {pid}: идёт другая установка или обновление; жду её окончания (до 10 минут)…",
            "{path} is held by process {pid}: another install or update is running; waiting for it (up to 10 minutes)…",
        ),
        FinishDpkg => (
            "dpkg был прерван (остановленная установка или обновление): заканчиваю его работу, dpkg --configure -a…",
            "dpkg was interrupted (a stopped install or update): finishing its work, dpkg --configure -a…",
        ),
        AptSlow => ("это может занять несколько минут…", "this can take a few minutes…"),
        ConfirmRestart => (
            "Docker нужно перезапустить; остановятся контейнеры без политики автозапуска: {names}. Продолжить?",
            "Docker must restart, which stops these containers without a restart policy: {names}. Continue?",
        ),
        RestartConfirmed => ("перезапуск Docker подтверждён", "the Docker restart was confirmed"),
        NodeRegistered => ("сервер {node}", "server {node}"),
        RegistrationKept => ("сервер {node} остаётся тем же", "server {node} stays the same"),
        CodeRefusedRepairing => (
            "Код подключения не принят (истёк или уже использован). Установленный агент сохраняет свой сервер {node}: установка починит его на месте",
            "The join code was not accepted (expired or already used). The installed agent keeps its server {node}: the install repairs it in place",
        ),
        Repairing => (
            "Без кода подключения: установленный агент сохраняет свой сервер {node}, установка починит его на месте",
            "Without a join code: the installed agent keeps its server {node}, and the install repairs it in place",
        ),
        AgentOnline => (
            "служба работает, платформа приняла первый сигнал",
            "the service runs and the platform accepted its first heartbeat",
        ),
        AwaitingCheck => (
            "ожидает проверки: платформа ещё не выбрала образ для проверки (это не ошибка)",
            "awaiting check: the platform has not chosen a probe image yet (not an error)",
        ),
        CheckStillRunning => (
            "проверка ещё идёт; результат покажет sudo /opt/gpum-agent/gpum-agent status",
            "the check is still running; sudo /opt/gpum-agent/gpum-agent status will show its result",
        ),
        Verified => (
            "оборудование проверено: видеокарта видна внутри контейнера",
            "hardware verified: the GPU is visible inside a container",
        ),
        WaitingForCheck => (
            "жду результата проверки (до {secs} с; первый раз Docker скачивает образ)…",
            "waiting for the check's result (up to {secs} s; the first time Docker downloads the image)…",
        ),
        SummaryTitle => ("Итог", "Summary"),
        SummaryInstalled => ("Установлено", "Installed"),
        SummaryChanged => ("Изменено", "Changed"),
        SummaryLeftAlone => ("Не тронуто", "Left alone"),
        SummaryNext => ("Дальше", "Next"),
        SummaryNothing => ("ничего", "nothing"),
        LeftDocker => ("Docker Engine (уже был установлен)", "Docker Engine (already installed)"),
        LeftToolkit => (
            "NVIDIA Container Toolkit (уже был установлен)",
            "the NVIDIA Container Toolkit (already installed)",
        ),
        LeftSource => (
            "ваш источник apt {file} и ключ {keyring}",
            "your apt source {file} and its key {keyring}",
        ),
        LeftContainers => ("ваши контейнеры, образы и тома", "your containers, images and volumes"),
        LeftDaemonJson => (
            "остальные настройки в /etc/docker/daemon.json",
            "every other setting in /etc/docker/daemon.json",
        ),
        NextStatus => (
            "состояние агента: sudo /opt/gpum-agent/gpum-agent status; журнал: journalctl -u gpum-agent -n 50",
            "the agent's state: sudo /opt/gpum-agent/gpum-agent status; its log: journalctl -u gpum-agent -n 50",
        ),
        NextDashboard => ("сервер {node} виден в личном кабинете", "server {node} is in your dashboard"),
        // The `apt_sources` check (`crate::apt`).
        AptSourcesClash => (
            "существующие источники apt конфликтуют с теми, что добавит установщик (apt перестанет работать): {list}",
            "existing apt sources clash with the ones the installer adds (apt would stop working): {list}",
        ),
        AptSourcesClashFix => (
            "уберите эти записи (например, sudo rm {files}) и запустите установщик снова",
            "remove those entries (for example sudo rm {files}) and run the installer again",
        ),
        AptSourcesElsewhere => (
            "репозиторий уже подключён в другом файле: {list}",
            "a repository is already configured elsewhere: {list}",
        ),
        AptSourcesElsewhereFix => ("лишние записи можно удалить", "the extra entries can be removed"),
        AptSourcesNoneToAdd => ("новые репозитории не нужны", "no repository needs to be added"),
        AptSourcesNoClash => (
            "нет конфликтов с добавляемыми репозиториями ({ids})",
            "no clash with the repositories to add ({ids})",
        ),
        // The progress drawn on stderr when it is a terminal (`crate::apply::progress`); the
        // step's result line replaces it.
        ProgressDownload => ("скачиваю агент", "downloading the agent"),
        ProgressAptUpdate => ("обновляю списки пакетов", "refreshing the package lists"),
        ProgressAptInstall => ("устанавливаю пакеты", "installing packages"),
        ProgressDockerRestart => ("перезапускаю Docker", "restarting Docker"),
        ProgressDockerReload => ("жду, пока Docker перечитает настройки", "waiting for Docker to reload"),
        ProgressHeartbeat => (
            "жду первого ответа платформы агенту",
            "waiting for the agent's first heartbeat",
        ),
        ProgressGpuCheck => ("жду проверки видеокарты", "waiting for the GPU check"),
        ProgressLimit => ("из", "of"),
        // `--help`'s last line, after the exit codes.
        HelpEnvironment => (
            "Каждый параметр можно задать и переменной окружения: см. docs/install.md.",
            "Every flag also reads an environment variable: see docs/install.md.",
        ),
    }
}

/// The text of `m` in `lang`.
pub fn t(m: Msg, lang: Lang) -> &'static str {
    m.text(lang)
}

/// Names for a message line, with terminal control characters escaped (they come from Docker).
pub fn names(v: &[String]) -> String {
    v.iter().map(|n| gpum_common::text::escape_controls(n).into_owned()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_both_languages_with_the_same_holes() {
        assert!(Msg::ALL.contains(&Msg::ReportReady) && Msg::ALL.contains(&Msg::Done));
        for m in Msg::ALL {
            let (ru, en) = (t(*m, Lang::Ru), t(*m, Lang::En));
            if let Err(e) = gpum_common::texts::check(ru, en) {
                panic!("{m:?}: {e}");
            }
        }
    }
}
