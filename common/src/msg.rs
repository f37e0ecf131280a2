//! The failures: one table, one row per failure. Russian wording is the seed's; English says the
//! same thing.
//!
//! Each row of [`failures!`] gives a variant (the kind, with the detail it carries and, for a
//! detail, the placeholder the guides show in its place), its exit code, who prints it, and its
//! message in Russian and in English. Everything else is generated from the rows: the enum,
//! [`Failure::ALL`], [`Failure::kind`], [`Failure::code`], [`Failure::who`],
//! [`Failure::with_placeholder`], [`Failure::message`], and from those the owner's guides'
//! table ([`crate::guide`]) and `gpum-install --help`'s exit codes. Adding a failure is adding
//! a row. The compiler checks the row: a message names a detail that is not there (a `format!`
//! error), a detail the messages never show (an unused variable), a detail without its
//! placeholder.

use crate::Lang;
use crate::exit;

/// How a variant's detail is shown in its message, and what stands for it in the guides.
trait Detail: Sized {
    /// The detail as the message prints it.
    fn show(&self) -> String;
    /// The detail that prints as `text` (the guides' `‹…›`).
    fn placeholder(text: String) -> Self;
}

impl Detail for String {
    fn show(&self) -> String {
        self.clone()
    }
    fn placeholder(text: String) -> Self {
        text
    }
}

/// A list (the failed checks, the containers): comma-separated.
impl Detail for Vec<String> {
    fn show(&self) -> String {
        self.join(", ")
    }
    fn placeholder(text: String) -> Self {
        vec![text]
    }
}

/// A detail shown in parentheses after what comes before it, or nothing when empty.
fn aside(s: &String) -> String {
    if s.is_empty() { String::new() } else { format!(" ({s})") }
}

/// The table's syntax, one row per failure:
///
/// ```text
/// /// docs
/// Variant(detail: Type [as show_fn], ("плейсхолдер", "placeholder")) {
///     code: exit::X, who: ("кто", "who"), ru: "… {detail} …", en: "… {detail} …",
/// }
/// ```
///
/// or `Variant { … }` for a failure without a detail. `Type` is `String` or `Vec<String>`
/// ([`Detail`]); `show_fn` replaces [`Detail::show`] for that row.
macro_rules! failures {
    ($(
        $(#[$doc:meta])*
        $var:ident $( ($field:ident : $ty:ty $(as $show:path)?, ($ph_ru:literal, $ph_en:literal)) )? {
            code: $code:expr,
            who: ($who_ru:literal, $who_en:literal),
            ru: $ru:literal,
            en: $en:literal $(,)?
        }
    )*) => {
        /// Every failure a user can see from `gpum-install` or the `gpum-agent` CLI.
        ///
        /// Variants carry the detail that makes the message actionable (which parameter, which
        /// checks failed, why a download was refused).
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Failure {
            $( $(#[$doc])* $var $( ($ty) )?, )*
        }

        /// A [`Failure`]'s variant without its detail; `kind as usize` is its row.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum FailureKind {
            $( $var, )*
        }

        impl Failure {
            /// Every variant once, in the table's order (exit-code order), with empty details:
            /// what the owner's guides' table is made of ([`crate::guide`]).
            pub const ALL: &'static [Failure] = &[ $( Failure::$var $( (<$ty>::new()) )?, )* ];

            /// The variant without its detail.
            pub const fn kind(&self) -> FailureKind {
                match self {
                    $( Failure::$var { .. } => FailureKind::$var, )*
                }
            }

            /// The variant's index in [`Failure::ALL`].
            pub const fn ordinal(&self) -> usize {
                self.kind() as usize
            }

            /// The exit code.
            pub const fn code(&self) -> i32 {
                match self {
                    $( Failure::$var { .. } => $code, )*
                }
            }

            /// Who prints it, for the guides' table.
            pub const fn who(&self, lang: Lang) -> &'static str {
                match (self, lang) {
                    $(
                        (Failure::$var { .. }, Lang::Ru) => $who_ru,
                        (Failure::$var { .. }, Lang::En) => $who_en,
                    )*
                }
            }

            /// The same variant with its detail replaced by a placeholder that names it, in
            /// `lang` (`‹параметр›`, `‹parameter›`): how the guides quote a message whose detail
            /// varies.
            pub fn with_placeholder(&self, lang: Lang) -> Failure {
                #[allow(unused_variables)]
                let ph = |ru: &str, en: &str| format!("‹{}›", match lang { Lang::Ru => ru, Lang::En => en });
                match self {
                    $(
                        Failure::$var { .. } => Failure::$var $( (
                            <$ty as Detail>::placeholder(ph($ph_ru, $ph_en))
                        ) )?,
                    )*
                }
            }

            /// The full message: what happened, then what to do.
            pub fn message(&self, lang: Lang) -> String {
                match self {
                    $(
                        Failure::$var $( ($field) )? => {
                            $( let $field = failures!(@show $field $(, $show)?); )?
                            match lang {
                                Lang::Ru => format!($ru),
                                Lang::En => format!($en),
                            }
                        }
                    )*
                }
            }
        }
    };
    (@show $field:ident) => { Detail::show($field) };
    (@show $field:ident, $show:path) => { $show($field) };
}

failures! {
    /// Anything unexpected, with the error.
    Other(e: String, ("что случилось", "what happened")) {
        code: exit::OTHER,
        who: ("любая программа gpum", "any gpum program"),
        ru: "Ошибка: {e}",
        en: "Error: {e}",
    }
    /// «Неизвестный параметр».
    UnknownParameter(p: String, ("параметр", "parameter")) {
        code: exit::USAGE,
        who: ("gpum-install", "gpum-install"),
        ru: "Неизвестный параметр: {p}. Скопируйте команду из личного кабинета целиком или посмотрите --help.",
        en: "Unknown parameter: {p}. Copy the command from your dashboard in full, or see --help.",
    }
    /// Any other malformed command line; the text is clap's.
    Usage(detail: String, ("что не так", "what is wrong")) {
        code: exit::USAGE,
        who: ("gpum-install, gpum-agent register и configure", "gpum-install, gpum-agent register and configure"),
        ru: "Неверные параметры команды: {detail}\nПосмотрите --help.",
        en: "Invalid command line: {detail}\nSee --help.",
    }
    /// «Не указан код подключения».
    NoJoinCode {
        code: exit::USAGE,
        who: ("gpum-install, gpum-agent register", "gpum-install, gpum-agent register"),
        ru: "Не указан код подключения. Скопируйте команду из личного кабинета целиком, вместе с кодом (--code).",
        en: "No join code given. Copy the command from your dashboard in full, with its code (--code).",
    }
    /// «Код подключения выглядит неверно».
    BadJoinCode {
        code: exit::USAGE,
        who: ("gpum-install, gpum-agent register", "gpum-install, gpum-agent register"),
        ru: "Код подключения выглядит неверно. Скопируйте команду из личного кабинета целиком, вместе с кодом.",
        en: "The join code looks wrong. Copy the command from your dashboard in full, with its code.",
    }
    /// Docker must restart, which stops the named containers (they have no restart policy), and
    /// nobody confirmed it: no `--yes` and no terminal to ask on, or the owner said no.
    RestartNotConfirmed(names: Vec<String>, ("контейнеры", "containers")) {
        code: exit::USAGE,
        who: ("gpum-install", "gpum-install"),
        ru: "Docker нужно перезапустить, и при этом остановятся контейнеры без политики автозапуска: {names}. Подтверждения нет (нет терминала или ответ «нет»), поэтому больше ничего не изменено. Остановите их сами или запустите установщик снова с --yes.",
        en: "Docker must restart, which stops these containers that have no restart policy: {names}. It was not confirmed (no terminal, or the answer was no), so nothing more was changed. Stop them yourself, or run the installer again with --yes.",
    }
    /// `gpum-agent uninstall` without `--yes` and without a terminal to ask on.
    UninstallNotConfirmed {
        code: exit::USAGE,
        who: ("gpum-agent uninstall", "gpum-agent uninstall"),
        ru: "Удаление не подтверждено, а спросить негде (нет терминала). Ничего не удалено. Чтобы удалить, добавьте --yes: sudo /opt/gpum-agent/gpum-agent uninstall --yes",
        en: "The uninstall was not confirmed and there is no terminal to ask on. Nothing was removed. To remove, add --yes: sudo /opt/gpum-agent/gpum-agent uninstall --yes",
    }
    /// «Проверка машины не пройдена», with the ids of the failed checks.
    PreflightFailed(ids: Vec<String>, ("проверки", "checks")) {
        code: exit::PREFLIGHT,
        who: ("gpum-install, также с --dry-run", "gpum-install, also with --dry-run"),
        ru: "Проверка машины не пройдена ({ids}). Исправьте отмеченное выше и запустите установщик снова.",
        en: "The machine check failed ({ids}). Fix what is marked above and run the installer again.",
    }
    /// «Не удалось запустить скачанный агент».
    AgentNoExec {
        code: exit::PREFLIGHT,
        who: ("install.sh, gpum-install", "install.sh, gpum-install"),
        ru: "Не удалось запустить скачанный агент. Скорее всего, /tmp смонтирован с запретом запуска (noexec): замените в команде установки sudo bash на sudo env TMPDIR=/var/tmp bash.",
        en: "Could not run the downloaded agent. Most likely /tmp is mounted noexec: in the install command, replace sudo bash with sudo env TMPDIR=/var/tmp bash.",
    }
    /// Another `gpum-install` holds the install lock (`/run/gpum-install.lock`), with its pid:
    /// this copy stopped before changing anything.
    InstallRunning(pid: String, ("номер процесса", "process id")) {
        code: exit::PREFLIGHT,
        who: ("gpum-install", "gpum-install"),
        ru: "На этой машине уже идёт установка gpum (процесс {pid}). Эта копия ничего не изменила. Дождитесь окончания той установки; если она не завершилась успешно, запустите установщик снова.",
        en: "A gpum install is already running on this machine (process {pid}). This copy changed nothing. Wait for that install to finish; if it did not succeed, run the installer again.",
    }
    /// «Установщик нужно запускать от имени root».
    NotRoot {
        code: exit::NOT_ROOT,
        who: ("gpum-install", "gpum-install"),
        ru: "Установщик нужно запускать от имени root. Повторите команду с sudo.",
        en: "The installer must run as root. Repeat the command with sudo.",
    }
    /// «Для чтения состояния агента нужны права root (sudo)».
    StatusNeedsRoot {
        code: exit::NOT_ROOT,
        who: ("gpum-agent status", "gpum-agent status"),
        ru: "Для чтения состояния агента нужны права root (sudo). Запустите команду через sudo.",
        en: "Reading the agent's state needs root (sudo). Run the command with sudo.",
    }
    /// `gpum-agent uninstall` without root.
    UninstallNeedsRoot {
        code: exit::NOT_ROOT,
        who: ("gpum-agent uninstall", "gpum-agent uninstall"),
        ru: "Для удаления агента нужны права root. Запустите: sudo /opt/gpum-agent/gpum-agent uninstall --yes",
        en: "Removing the agent needs root. Run: sudo /opt/gpum-agent/gpum-agent uninstall --yes",
    }
    /// «На этой машине не запущен systemd».
    NoSystemd {
        code: exit::NO_SYSTEMD,
        who: ("gpum-install", "gpum-install"),
        ru: "На этой машине не запущен systemd. Контейнеры, WSL и системы без systemd не поддерживаются.",
        en: "systemd is not running on this machine. Containers, WSL and systems without systemd are not supported.",
    }
    /// «Не удалось скачать или проверить агент», with the reason.
    Download(why: String, ("причина", "reason")) {
        code: exit::DOWNLOAD,
        who: ("install.sh, gpum-install", "install.sh, gpum-install"),
        ru: "Не удалось скачать или проверить агент: {why}. Повторите попытку; если ошибка повторяется, напишите нам.",
        en: "Could not download or verify the agent: {why}. Try again; if it keeps failing, contact us.",
    }
    /// apt, or applying Docker's settings, failed during the install, with the tool's own last
    /// lines.
    SetupFailed(why: String, ("последние строки apt или Docker", "the last lines of apt or Docker")) {
        code: exit::SETUP,
        who: ("gpum-install", "gpum-install"),
        ru: "Не удалось установить или настроить Docker и NVIDIA Container Toolkit: {why}\nИсправьте причину и запустите установщик снова: уже сделанное он пропустит.",
        en: "Could not install or configure Docker and the NVIDIA Container Toolkit: {why}\nFix the cause and run the installer again: it skips what is already done.",
    }
    /// «Видеокарта не видна внутри контейнера».
    GpuNotInContainer {
        code: exit::GPU_NOT_IN_CONTAINER,
        who: ("gpum-install", "gpum-install"),
        ru: "Видеокарта не видна внутри контейнера. Проверьте nvidia-smi на машине, затем выполните sudo nvidia-ctk runtime configure --runtime=docker и sudo systemctl restart docker.",
        en: "The GPU is not visible inside a container. Check nvidia-smi on the machine, then run sudo nvidia-ctk runtime configure --runtime=docker and sudo systemctl restart docker.",
    }
    /// «Код подключения недействителен, истёк или уже использован».
    JoinCodeRejected {
        code: exit::JOIN_CODE,
        who: ("gpum-install, gpum-agent register", "gpum-install, gpum-agent register"),
        ru: "Код подключения недействителен, истёк или уже использован. Создайте новый код в личном кабинете.",
        en: "The join code is invalid, expired or already used. Create a new code in your dashboard.",
    }
    /// «Эта видеокарта уже зарегистрирована на другом сервере».
    GpuAlreadyRegistered {
        code: exit::JOIN_CODE,
        who: ("gpum-install, gpum-agent register", "gpum-install, gpum-agent register"),
        ru: "Эта видеокарта уже зарегистрирована на другом сервере. Удалите тот сервер в личном кабинете и запустите установщик снова.",
        en: "This GPU is already registered to another server. Delete that server in your dashboard and run the installer again.",
    }
    /// «Служба не запустилась».
    ServiceFailed {
        code: exit::SERVICE,
        who: ("gpum-install", "gpum-install"),
        ru: "Служба не запустилась. Посмотрите journalctl -u gpum-agent -n 50 и sudo /opt/gpum-agent/gpum-agent status.",
        en: "The service did not start. See journalctl -u gpum-agent -n 50 and sudo /opt/gpum-agent/gpum-agent status.",
    }
    /// «Агент остановлен: сервер удалён или токен заменён»: the service stopped for good after a
    /// `node_deleted`/`token_replaced` answer; `gpum-agent status` shows it.
    StoppedRevoked {
        code: exit::STOPPED_FOR_GOOD,
        who: ("служба gpum-agent; текст показывает gpum-agent status", "the gpum-agent service; gpum-agent status shows the text"),
        ru: "Агент остановлен: сервер удалён или токен заменён. Если токен заменили в личном кабинете, выполните на машине команды, которые кабинет показал вместе с новым токеном (gpum-agent configure меняет только сервер, номер и токен, остальные настройки сохраняются). Если сервер удалён, создайте новый код и запустите установщик.",
        en: "Agent stopped: server deleted or token replaced. If the token was replaced in the dashboard, run on the machine the commands the dashboard showed with the new token (gpum-agent configure changes only the server, the node and the token; every other setting stays). If the server was deleted, create a new join code and run the installer.",
    }
    /// «Агент остановлен: ошибка конфигурации», with what is wrong (empty: not known).
    StoppedConfig(why: String as aside, ("что не так", "what is wrong")) {
        code: exit::STOPPED_FOR_GOOD,
        who: ("служба gpum-agent; текст показывает gpum-agent status", "the gpum-agent service; gpum-agent status shows the text"),
        ru: "Агент остановлен: ошибка конфигурации{why}. Проверьте /etc/gpum-agent/config.toml или запустите установщик с новым кодом.",
        en: "Agent stopped: configuration error{why}. Check /etc/gpum-agent/config.toml or run the installer with a new code.",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant, its detail filled (with the placeholder, so no detail is empty).
    fn all() -> Vec<Failure> {
        Failure::ALL.iter().map(|f| f.with_placeholder(Lang::En)).collect()
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
        assert_eq!(InstallRunning(String::new()).code(), 10);
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
    fn all_is_every_kind_once_in_order() {
        for (i, f) in Failure::ALL.iter().enumerate() {
            assert_eq!(f.ordinal(), i, "{f:?}");
            let ph = f.with_placeholder(Lang::Ru);
            assert_eq!((ph.kind(), ph.code()), (f.kind(), f.code()));
        }
        // Sorted by exit code, as the guides list them.
        assert!(Failure::ALL.windows(2).all(|w| w[0].code() <= w[1].code()));
    }

    #[test]
    fn details_are_shown_and_placeholders_name_them() {
        use Failure::*;
        let f = PreflightFailed(vec!["disk".into(), "gpu".into()]);
        assert_eq!(
            f.message(Lang::En),
            "The machine check failed (disk, gpu). Fix what is marked above and run the installer again."
        );
        assert_eq!(
            UnknownParameter("--x".into()).with_placeholder(Lang::Ru),
            UnknownParameter("‹параметр›".into())
        );
        assert_eq!(
            RestartNotConfirmed(vec![]).with_placeholder(Lang::En),
            RestartNotConfirmed(vec!["‹containers›".into()])
        );
        assert_eq!(NotRoot.with_placeholder(Lang::En), NotRoot);
        // Every detail a variant carries appears in its message, in both languages.
        for lang in [Lang::Ru, Lang::En] {
            for f in Failure::ALL {
                let ph = f.with_placeholder(lang);
                if ph != *f {
                    assert!(ph.message(lang).contains('‹'), "{f:?}: {}", ph.message(lang));
                }
            }
        }
    }

    #[test]
    fn a_stop_says_what_to_do_next() {
        use Failure::*;
        assert_eq!(
            StoppedRevoked.message(Lang::Ru),
            "Агент остановлен: сервер удалён или токен заменён. Если токен заменили в личном кабинете, выполните на машине команды, которые кабинет показал вместе с новым токеном (gpum-agent configure меняет только сервер, номер и токен, остальные настройки сохраняются). Если сервер удалён, создайте новый код и запустите установщик."
        );
        assert_eq!(
            StoppedConfig("missing token".into()).message(Lang::En),
            "Agent stopped: configuration error (missing token). Check /etc/gpum-agent/config.toml or run the installer with a new code."
        );
        assert_eq!(
            StoppedConfig(String::new()).message(Lang::Ru),
            "Агент остановлен: ошибка конфигурации. Проверьте /etc/gpum-agent/config.toml или запустите установщик с новым кодом."
        );
    }

    #[test]
    fn every_message_exists_in_both_languages_and_differs() {
        for f in all() {
            let (ru, en) = (f.message(Lang::Ru), f.message(Lang::En));
            assert!(!ru.is_empty() && !en.is_empty());
            assert_ne!(ru, en, "{f:?}");
            let bare = en.replace(['‹', '›'], "");
            assert!(bare.is_ascii(), "English text must not leak Russian: {en}");
            assert!(!f.who(Lang::Ru).is_empty() && f.who(Lang::En).is_ascii(), "{f:?}");
        }
    }
}
