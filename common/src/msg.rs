//! The messages. Russian wording is the seed's; English says the same thing.

use crate::Lang;
use crate::exit;

/// Every failure a user can see from `gpum-install` or the `gpum-agent` CLI.
///
/// Variants carry the detail that makes the message actionable (which parameter, which
/// checks failed, why a download was refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// «Неизвестный параметр» (2).
    UnknownParameter(String),
    /// Any other malformed command line (2); the text is clap's.
    Usage(String),
    /// «Не указан код подключения» (2).
    NoJoinCode,
    /// «Код подключения выглядит неверно» (2).
    BadJoinCode,
    /// «Установщик нужно запускать от имени root» (13).
    NotRoot,
    /// «На этой машине не запущен systemd» (14).
    NoSystemd,
    /// «Проверка машины не пройдена» (10), with the ids of the failed checks.
    PreflightFailed(Vec<String>),
    /// «Не удалось запустить скачанный агент» (10).
    AgentNoExec,
    /// «Не удалось скачать или проверить агент» (20), with the reason.
    Download(String),
    /// «Видеокарта не видна внутри контейнера» (31).
    GpuNotInContainer,
    /// «Код подключения недействителен, истёк или уже использован» (40).
    JoinCodeRejected,
    /// «Эта видеокарта уже зарегистрирована на другом сервере» (40).
    GpuAlreadyRegistered,
    /// «Служба не запустилась» (50).
    ServiceFailed,
    /// «Для чтения состояния агента нужны права root (sudo)» (13).
    StatusNeedsRoot,
    /// «Агент остановлен: сервер удалён или токен заменён» (78).
    StoppedRevoked,
    /// «Агент остановлен: ошибка конфигурации» (78), with what is wrong.
    StoppedConfig(String),
    /// `gpum-agent uninstall` without root (13).
    UninstallNeedsRoot,
    /// `gpum-agent uninstall` without `--yes` and without a terminal to ask on (2).
    UninstallNotConfirmed,
    /// Anything unexpected (1), with the error.
    Other(String),
    /// apt, or applying Docker's settings, failed during the install (30), with the tool's own
    /// last lines.
    SetupFailed(String),
    /// Docker must restart, which stops the named containers (they have no restart policy), and
    /// nobody confirmed it: no `--yes` and no terminal to ask on, or the owner said no (2).
    RestartNotConfirmed(Vec<String>),
}

impl Failure {
    /// Every variant once, in exit-code order, with empty details: what the owner's guides'
    /// table is made of ([`crate::guide`]). [`Failure::ordinal`] names every variant in a
    /// `match`, so a new variant does not compile until it has its place; the constant check
    /// below the `impl` proves that `ALL[i]` is the variant with ordinal `i`.
    pub const ALL: &'static [Failure] = &[
        Failure::Other(String::new()),
        Failure::UnknownParameter(String::new()),
        Failure::Usage(String::new()),
        Failure::NoJoinCode,
        Failure::BadJoinCode,
        Failure::RestartNotConfirmed(Vec::new()),
        Failure::UninstallNotConfirmed,
        Failure::PreflightFailed(Vec::new()),
        Failure::AgentNoExec,
        Failure::NotRoot,
        Failure::StatusNeedsRoot,
        Failure::UninstallNeedsRoot,
        Failure::NoSystemd,
        Failure::Download(String::new()),
        Failure::SetupFailed(String::new()),
        Failure::GpuNotInContainer,
        Failure::JoinCodeRejected,
        Failure::GpuAlreadyRegistered,
        Failure::ServiceFailed,
        Failure::StoppedRevoked,
        Failure::StoppedConfig(String::new()),
    ];

    /// The variant's index in [`Failure::ALL`]. Exhaustive on purpose: see there.
    pub const fn ordinal(&self) -> usize {
        use Failure::*;
        match self {
            Other(_) => 0,
            UnknownParameter(_) => 1,
            Usage(_) => 2,
            NoJoinCode => 3,
            BadJoinCode => 4,
            RestartNotConfirmed(_) => 5,
            UninstallNotConfirmed => 6,
            PreflightFailed(_) => 7,
            AgentNoExec => 8,
            NotRoot => 9,
            StatusNeedsRoot => 10,
            UninstallNeedsRoot => 11,
            NoSystemd => 12,
            Download(_) => 13,
            SetupFailed(_) => 14,
            GpuNotInContainer => 15,
            JoinCodeRejected => 16,
            GpuAlreadyRegistered => 17,
            ServiceFailed => 18,
            StoppedRevoked => 19,
            StoppedConfig(_) => 20,
        }
    }

    /// The same variant with its detail replaced by a placeholder that names it, in `lang`
    /// (`‹параметр›`, `‹parameter›`): how the guides quote a message whose detail varies.
    pub fn with_placeholder(&self, lang: Lang) -> Failure {
        use Failure::*;
        let ph = |ru: &str, en: &str| format!("‹{}›", if lang == Lang::Ru { ru } else { en });
        match self {
            UnknownParameter(_) => UnknownParameter(ph("параметр", "parameter")),
            Usage(_) => Usage(ph("что не так", "what is wrong")),
            PreflightFailed(_) => PreflightFailed(vec![ph("проверки", "checks")]),
            Download(_) => Download(ph("причина", "reason")),
            StoppedConfig(_) => StoppedConfig(ph("что не так", "what is wrong")),
            Other(_) => Other(ph("что случилось", "what happened")),
            SetupFailed(_) => {
                SetupFailed(ph("последние строки apt или Docker", "the last lines of apt or Docker"))
            }
            RestartNotConfirmed(_) => RestartNotConfirmed(vec![ph("контейнеры", "containers")]),
            NoJoinCode
            | BadJoinCode
            | NotRoot
            | NoSystemd
            | AgentNoExec
            | GpuNotInContainer
            | JoinCodeRejected
            | GpuAlreadyRegistered
            | ServiceFailed
            | StatusNeedsRoot
            | StoppedRevoked
            | UninstallNeedsRoot
            | UninstallNotConfirmed => self.clone(),
        }
    }

    pub fn code(&self) -> i32 {
        use Failure::*;
        match self {
            UnknownParameter(_) | Usage(_) | NoJoinCode | BadJoinCode | UninstallNotConfirmed => exit::USAGE,
            NotRoot | StatusNeedsRoot | UninstallNeedsRoot => exit::NOT_ROOT,
            NoSystemd => exit::NO_SYSTEMD,
            PreflightFailed(_) | AgentNoExec => exit::PREFLIGHT,
            Download(_) => exit::DOWNLOAD,
            GpuNotInContainer => exit::GPU_NOT_IN_CONTAINER,
            JoinCodeRejected | GpuAlreadyRegistered => exit::JOIN_CODE,
            ServiceFailed => exit::SERVICE,
            StoppedRevoked | StoppedConfig(_) => exit::STOPPED_FOR_GOOD,
            Other(_) => exit::OTHER,
            SetupFailed(_) => exit::SETUP,
            RestartNotConfirmed(_) => exit::USAGE,
        }
    }

    /// The full message: what happened, then what to do.
    pub fn message(&self, lang: Lang) -> String {
        use Failure::*;
        let ru = lang == Lang::Ru;
        match self {
            UnknownParameter(p) => {
                if ru {
                    format!(
                        "Неизвестный параметр: {p}. Скопируйте команду из личного кабинета целиком или посмотрите --help."
                    )
                } else {
                    format!(
                        "Unknown parameter: {p}. Copy the command from your dashboard in full, or see --help."
                    )
                }
            }
            Usage(detail) => {
                if ru {
                    format!("Неверные параметры команды: {detail}\nПосмотрите --help.")
                } else {
                    format!("Invalid command line: {detail}\nSee --help.")
                }
            }
            NoJoinCode => {
                if ru {
                    "Не указан код подключения. Скопируйте команду из личного кабинета целиком, вместе с кодом (--code).".into()
                } else {
                    "No join code given. Copy the command from your dashboard in full, with its code (--code).".into()
                }
            }
            BadJoinCode => {
                if ru {
                    "Код подключения выглядит неверно. Скопируйте команду из личного кабинета целиком, вместе с кодом.".into()
                } else {
                    "The join code looks wrong. Copy the command from your dashboard in full, with its code."
                        .into()
                }
            }
            NotRoot => {
                if ru {
                    "Установщик нужно запускать от имени root. Повторите команду с sudo.".into()
                } else {
                    "The installer must run as root. Repeat the command with sudo.".into()
                }
            }
            NoSystemd => {
                if ru {
                    "На этой машине не запущен systemd. Контейнеры, WSL и системы без systemd не поддерживаются.".into()
                } else {
                    "systemd is not running on this machine. Containers, WSL and systems without systemd are not supported.".into()
                }
            }
            PreflightFailed(ids) => {
                if ru {
                    format!(
                        "Проверка машины не пройдена ({}). Исправьте отмеченное выше и запустите установщик снова.",
                        ids.join(", ")
                    )
                } else {
                    format!(
                        "The machine check failed ({}). Fix what is marked above and run the installer again.",
                        ids.join(", ")
                    )
                }
            }
            AgentNoExec => {
                if ru {
                    "Не удалось запустить скачанный агент. Скорее всего, /tmp смонтирован с запретом запуска (noexec): замените в команде установки sudo bash на sudo env TMPDIR=/var/tmp bash.".into()
                } else {
                    "Could not run the downloaded agent. Most likely /tmp is mounted noexec: in the install command, replace sudo bash with sudo env TMPDIR=/var/tmp bash.".into()
                }
            }
            Download(why) => {
                if ru {
                    format!(
                        "Не удалось скачать или проверить агент: {why}. Повторите попытку; если ошибка повторяется, напишите нам."
                    )
                } else {
                    format!(
                        "Could not download or verify the agent: {why}. Try again; if it keeps failing, contact us."
                    )
                }
            }
            GpuNotInContainer => {
                if ru {
                    "Видеокарта не видна внутри контейнера. Проверьте nvidia-smi на машине, затем выполните sudo nvidia-ctk runtime configure --runtime=docker и sudo systemctl restart docker.".into()
                } else {
                    "The GPU is not visible inside a container. Check nvidia-smi on the machine, then run sudo nvidia-ctk runtime configure --runtime=docker and sudo systemctl restart docker.".into()
                }
            }
            JoinCodeRejected => {
                if ru {
                    "Код подключения недействителен, истёк или уже использован. Создайте новый код в личном кабинете.".into()
                } else {
                    "The join code is invalid, expired or already used. Create a new code in your dashboard."
                        .into()
                }
            }
            GpuAlreadyRegistered => {
                if ru {
                    "Эта видеокарта уже зарегистрирована на другом сервере. Удалите тот сервер в личном кабинете и запустите установщик снова.".into()
                } else {
                    "This GPU is already registered to another server. Delete that server in your dashboard and run the installer again.".into()
                }
            }
            ServiceFailed => {
                if ru {
                    "Служба не запустилась. Посмотрите journalctl -u gpum-agent -n 50 и sudo /opt/gpum-agent/gpum-agent status.".into()
                } else {
                    "The service did not start. See journalctl -u gpum-agent -n 50 and sudo /opt/gpum-agent/gpum-agent status.".into()
                }
            }
            StatusNeedsRoot => {
                if ru {
                    "Для чтения состояния агента нужны права root (sudo). Запустите команду через sudo."
                        .into()
                } else {
                    "Reading the agent's state needs root (sudo). Run the command with sudo.".into()
                }
            }
            // What `gpum-agent status` shows after the service stopped for good (exit 78).
            StoppedRevoked => {
                format!("{}. {}", text(Text::StoppedRevoked, lang), text(Text::StoppedRevokedNext, lang))
            }
            StoppedConfig(why) if why.is_empty() => {
                format!("{}. {}", text(Text::StoppedConfig, lang), text(Text::StoppedConfigNext, lang))
            }
            StoppedConfig(why) => {
                format!(
                    "{} ({why}). {}",
                    text(Text::StoppedConfig, lang),
                    text(Text::StoppedConfigNext, lang)
                )
            }
            UninstallNeedsRoot => {
                if ru {
                    "Для удаления агента нужны права root. Запустите: sudo /opt/gpum-agent/gpum-agent uninstall --yes".into()
                } else {
                    "Removing the agent needs root. Run: sudo /opt/gpum-agent/gpum-agent uninstall --yes"
                        .into()
                }
            }
            UninstallNotConfirmed => {
                if ru {
                    "Удаление не подтверждено, а спросить негде (нет терминала). Ничего не удалено. Чтобы удалить, добавьте --yes: sudo /opt/gpum-agent/gpum-agent uninstall --yes".into()
                } else {
                    "The uninstall was not confirmed and there is no terminal to ask on. Nothing was removed. To remove, add --yes: sudo /opt/gpum-agent/gpum-agent uninstall --yes".into()
                }
            }
            Other(e) => {
                if ru {
                    format!("Ошибка: {e}")
                } else {
                    format!("Error: {e}")
                }
            }
            SetupFailed(why) => {
                if ru {
                    format!(
                        "Не удалось установить или настроить Docker и NVIDIA Container Toolkit: {why}\nИсправьте причину и запустите установщик снова: уже сделанное он пропустит."
                    )
                } else {
                    format!(
                        "Could not install or configure Docker and the NVIDIA Container Toolkit: {why}\nFix the cause and run the installer again: it skips what is already done."
                    )
                }
            }
            RestartNotConfirmed(names) => {
                let names = names.join(", ");
                if ru {
                    format!(
                        "Docker нужно перезапустить, и при этом остановятся контейнеры без политики автозапуска: {names}. Подтверждения нет (нет терминала или ответ «нет»), поэтому больше ничего не изменено. Остановите их сами или запустите установщик снова с --yes."
                    )
                } else {
                    format!(
                        "Docker must restart, which stops these containers that have no restart policy: {names}. It was not confirmed (no terminal, or the answer was no), so nothing more was changed. Stop them yourself, or run the installer again with --yes."
                    )
                }
            }
        }
    }
}

// `Failure::ALL[i]` is the variant whose ordinal is `i`: none missing between, none twice.
const _: () = {
    let mut i = 0;
    while i < Failure::ALL.len() {
        assert!(Failure::ALL[i].ordinal() == i, "Failure::ALL is out of step with Failure::ordinal");
        i += 1;
    }
};

/// Short texts shared by more than one binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Text {
    /// Why the agent stopped for good after a `node_deleted`/`token_replaced` answer.
    StoppedRevoked,
    /// Why the agent stopped for good after a bad configuration.
    StoppedConfig,
    /// The next step after either stop.
    StoppedRevokedNext,
    StoppedConfigNext,
}

pub fn text(t: Text, lang: Lang) -> &'static str {
    let ru = lang == Lang::Ru;
    match t {
        Text::StoppedRevoked => {
            if ru {
                "Агент остановлен: сервер удалён или токен заменён"
            } else {
                "Agent stopped: server deleted or token replaced"
            }
        }
        Text::StoppedConfig => {
            if ru {
                "Агент остановлен: ошибка конфигурации"
            } else {
                "Agent stopped: configuration error"
            }
        }
        Text::StoppedRevokedNext => {
            if ru {
                "Создайте новый код и запустите установщик."
            } else {
                "Create a new join code and run the installer."
            }
        }
        Text::StoppedConfigNext => {
            if ru {
                "Проверьте /etc/gpum-agent/config.toml или запустите установщик с новым кодом."
            } else {
                "Check /etc/gpum-agent/config.toml or run the installer with a new code."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Failure> {
        use Failure::*;
        vec![
            UnknownParameter("--x".into()),
            Usage("u".into()),
            NoJoinCode,
            BadJoinCode,
            NotRoot,
            NoSystemd,
            PreflightFailed(vec!["disk".into()]),
            AgentNoExec,
            Download("sha256 mismatch".into()),
            GpuNotInContainer,
            JoinCodeRejected,
            GpuAlreadyRegistered,
            ServiceFailed,
            StatusNeedsRoot,
            StoppedRevoked,
            StoppedConfig("missing".into()),
            UninstallNeedsRoot,
            UninstallNotConfirmed,
            Other("x".into()),
            SetupFailed("apt-get install failed".into()),
            RestartNotConfirmed(vec!["web".into()]),
        ]
    }

    #[test]
    fn codes_match_the_seed() {
        use Failure::*;
        assert_eq!(NotRoot.code(), 13);
        assert_eq!(BadJoinCode.code(), 2);
        assert_eq!(NoJoinCode.code(), 2);
        assert_eq!(UnknownParameter(String::new()).code(), 2);
        assert_eq!(PreflightFailed(vec![]).code(), 10);
        assert_eq!(NoSystemd.code(), 14);
        assert_eq!(AgentNoExec.code(), 10);
        assert_eq!(Download(String::new()).code(), 20);
        assert_eq!(GpuNotInContainer.code(), 31);
        assert_eq!(JoinCodeRejected.code(), 40);
        assert_eq!(GpuAlreadyRegistered.code(), 40);
        assert_eq!(ServiceFailed.code(), 50);
        assert_eq!(StatusNeedsRoot.code(), 13);
        assert_eq!(StoppedRevoked.code(), 78);
        assert_eq!(StoppedConfig(String::new()).code(), 78);
        assert_eq!(SetupFailed(String::new()).code(), 30);
        assert_eq!(RestartNotConfirmed(vec![]).code(), 2);
        assert_eq!(UninstallNeedsRoot.code(), 13);
        assert_eq!(UninstallNotConfirmed.code(), 2);
    }

    #[test]
    fn russian_uses_the_seed_wording() {
        use Failure::*;
        let seed = [
            (NotRoot, "Установщик нужно запускать от имени root"),
            (BadJoinCode, "Код подключения выглядит неверно"),
            (NoJoinCode, "Не указан код подключения"),
            (UnknownParameter("--x".into()), "Неизвестный параметр"),
            (PreflightFailed(vec![]), "Проверка машины не пройдена"),
            (NoSystemd, "На этой машине не запущен systemd"),
            (AgentNoExec, "Не удалось запустить скачанный агент"),
            (Download(String::new()), "Не удалось скачать или проверить агент"),
            (GpuNotInContainer, "Видеокарта не видна внутри контейнера"),
            (JoinCodeRejected, "Код подключения недействителен, истёк или уже использован"),
            (GpuAlreadyRegistered, "Эта видеокарта уже зарегистрирована на другом сервере"),
            (ServiceFailed, "Служба не запустилась"),
            (StatusNeedsRoot, "Для чтения состояния агента нужны права root (sudo)"),
            (StoppedRevoked, "Агент остановлен: сервер удалён или токен заменён"),
            (StoppedConfig(String::new()), "Агент остановлен: ошибка конфигурации"),
        ];
        for (f, want) in seed {
            assert!(f.message(Lang::Ru).starts_with(want), "{f:?}: {}", f.message(Lang::Ru));
        }
    }

    #[test]
    fn all_holds_every_variant_once() {
        let mut seen: Vec<usize> = all().iter().map(Failure::ordinal).collect();
        seen.sort();
        assert_eq!(seen, (0..Failure::ALL.len()).collect::<Vec<_>>());
        for f in all() {
            let ph = f.with_placeholder(Lang::Ru);
            assert_eq!(ph.ordinal(), f.ordinal());
            assert_eq!(ph.code(), f.code());
            assert_eq!(Failure::ALL[f.ordinal()].code(), f.code());
        }
    }

    #[test]
    fn a_stop_says_what_to_do_next() {
        use Failure::*;
        assert_eq!(
            StoppedRevoked.message(Lang::Ru),
            "Агент остановлен: сервер удалён или токен заменён. Создайте новый код и запустите установщик."
        );
        assert_eq!(
            StoppedConfig("missing token".into()).message(Lang::En),
            "Agent stopped: configuration error (missing token). Check /etc/gpum-agent/config.toml or run the installer with a new code."
        );
    }

    #[test]
    fn every_message_exists_in_both_languages_and_differs() {
        for f in all() {
            let (ru, en) = (f.message(Lang::Ru), f.message(Lang::En));
            assert!(!ru.is_empty() && !en.is_empty());
            assert_ne!(ru, en, "{f:?}");
            assert!(en.is_ascii(), "English text must not leak Russian: {en}");
        }
    }
}
