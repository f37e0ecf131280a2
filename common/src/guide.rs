//! The owner's guides' table of messages and exit codes, made from the code.
//!
//! `docs/owner-guide.ru.md` and `docs/owner-guide.en.md` hold [`exit_code_table`] between
//! [`BEGIN`] and [`END`]. The rows are every [`Failure`] (its exit code, who prints it, and its
//! message as printed, with `‹…›` where a detail goes) and the exit codes that come without a
//! message of their own ([`OUTCOMES`]: success, `smoke`'s codes, the agent's restart). `cargo
//! xtask docs` writes the table into the guides; `tests/e2e/guides.rs` fails when a guide's
//! table differs from this one. [`exit_code_summary`] is the same rows, shorter, for a
//! program's `--help`.

use crate::{Failure, Lang, exit};

/// The marker lines around the generated table in a guide.
pub const BEGIN: &str = "<!-- exit-codes:begin -->";
pub const END: &str = "<!-- exit-codes:end -->";

crate::texts! {
    /// What the guides' table and the `--help` summary say besides the failures' messages:
    /// the table's head, the summary's title, and who ends with each [`Outcome`] and what it
    /// means.
    pub enum Text {
        TableHead => ("| Код | Кто | Сообщение или что значит |", "| Code | Who | Message, or what it means |"),
        SummaryTitle => ("Коды выхода:", "Exit codes:"),
        WhoInstall => ("gpum-install", "gpum-install"),
        WhatInstallOk => (
            "установка завершена; с --dry-run: машина готова. «Ожидает проверки» после установки — тоже 0: образ для проверки ещё не выбран, это не ошибка",
            "installed; with --dry-run: the machine is ready. \"Awaiting check\" after the install is 0 too: no probe image has been chosen yet, which is not an error",
        ),
        WhoAgent => ("gpum-agent", "gpum-agent"),
        WhatAgentOk => (
            "команда выполнена; run (служба): остановлена по SIGTERM (systemctl stop)",
            "the command succeeded; run (the service): stopped by SIGTERM (systemctl stop)",
        ),
        WhoUninstall => ("gpum-agent uninstall", "gpum-agent uninstall"),
        WhatUninstallPartial => (
            "удалено не всё: итог перечисляет, что удалено, и после «Не удалось:» — что нет",
            "not everything was removed: the summary lists what was, and after \"Failed:\" what was not",
        ),
        WhoSmoke => ("gpum-agent smoke, doctor --connectivity", "gpum-agent smoke, doctor --connectivity"),
        WhatPlatformBadAnswer => (
            "платформа не ответила как надо: соединение отклонено, ошибка TLS, страница прокси, ошибка 5xx",
            "the platform did not answer properly: connection refused, a TLS error, a proxy's page, a 5xx error",
        ),
        WhatAgentUsage => (
            "неизвестная команда или параметр; текст — clap, по-английски; gpum-agent --help",
            "unknown command or option; the text is clap's, in English; gpum-agent --help",
        ),
        WhatSmokeTimeout => (
            "платформа не ответила за 10 секунд",
            "no answer from the platform within 10 seconds",
        ),
        WhatSmokeTokenRejected => (
            "платформа отклонила токен (сервер удалён, токен заменён или неизвестен)",
            "the platform rejected the token (server deleted, token replaced or unknown)",
        ),
        WhoService => ("служба gpum-agent", "the gpum-agent service"),
        WhatRestart => (
            "перезапуск по команде платформы; systemd сразу запускает агент снова",
            "a restart the platform asked for; systemd starts the agent again at once",
        ),
    }
}

/// An exit code that comes without a [`Failure`] message: the code, who ends with it, and what it
/// means (rows of [`Text`]).
pub struct Outcome {
    pub code: i32,
    pub who: Text,
    pub what: Text,
}

/// The exit codes that are not a [`Failure`]. The agent's restart code,
/// `gpum_agent::run::EXIT_RESTART`, is [`exit::RESTART`].
pub const OUTCOMES: &[Outcome] = &[
    Outcome { code: exit::OK, who: Text::WhoInstall, what: Text::WhatInstallOk },
    Outcome { code: exit::OK, who: Text::WhoAgent, what: Text::WhatAgentOk },
    Outcome { code: exit::OTHER, who: Text::WhoUninstall, what: Text::WhatUninstallPartial },
    Outcome { code: exit::OTHER, who: Text::WhoSmoke, what: Text::WhatPlatformBadAnswer },
    Outcome { code: exit::USAGE, who: Text::WhoAgent, what: Text::WhatAgentUsage },
    Outcome { code: exit::SMOKE_TIMEOUT, who: Text::WhoSmoke, what: Text::WhatSmokeTimeout },
    Outcome { code: exit::SMOKE_TOKEN_REJECTED, who: Text::WhoSmoke, what: Text::WhatSmokeTokenRejected },
    Outcome { code: exit::RESTART, who: Text::WhoService, what: Text::WhatRestart },
];

/// A table cell: one line, no column separator.
fn cell(s: &str) -> String {
    s.replace('\n', " ").replace('|', "\\|")
}

/// The Markdown table, sorted by exit code: every [`Failure`] with its message as printed, then
/// within each code the exit codes without a message (in italics).
pub fn exit_code_table(lang: Lang) -> String {
    let mut rows: Vec<(i32, String, String)> = Failure::ALL
        .iter()
        .map(|f| {
            let msg = f.with_placeholder(lang).message(lang);
            (f.code(), f.who(lang).to_owned(), cell(&msg))
        })
        .collect();
    rows.extend(
        OUTCOMES
            .iter()
            .map(|o| (o.code, o.who.text(lang).to_owned(), format!("*{}*", cell(o.what.text(lang))))),
    );
    rows.sort_by_key(|r| r.0);
    let head = Text::TableHead.text(lang);
    let mut s = format!("{head}\n|---|---|---|\n");
    for (code, who, text) in rows {
        s.push_str(&format!("| {code} | {} | {text} |\n", cell(&who)));
    }
    s
}

/// Whether a row's "who" (English) names `program`: one of its comma- or semicolon-separated
/// parts is `program`, or starts with it and a space (`gpum-agent status`); "any gpum program"
/// names every program.
fn names_program(who: &str, program: &str) -> bool {
    who.starts_with("any ")
        || who
            .split([',', ';'])
            .map(str::trim)
            .any(|p| p == program || p.strip_prefix(program).is_some_and(|rest| rest.starts_with(' ')))
}

/// A message's first sentence, without its full stop.
fn first_sentence(s: &str) -> &str {
    let end = [s.find(". "), s.find('\n')].into_iter().flatten().min().unwrap_or(s.len());
    s[..end].trim_end_matches('.')
}

/// The exit codes `program` ends with, for its `--help`, in `lang`: a title line, then per code
/// the first sentence of each message (`‹…›` where a detail goes) and of each outcome without a
/// message, one per line, from the same rows as [`exit_code_table`].
pub fn exit_code_summary(program: &str, lang: Lang) -> String {
    let mut rows: Vec<(i32, String)> = Failure::ALL
        .iter()
        .filter(|f| names_program(f.who(Lang::En), program))
        .map(|f| (f.code(), first_sentence(&f.with_placeholder(lang).message(lang)).to_owned()))
        .collect();
    rows.extend(
        OUTCOMES
            .iter()
            .filter(|o| names_program(o.who.text(Lang::En), program))
            .map(|o| (o.code, first_sentence(o.what.text(lang)).to_owned())),
    );
    rows.sort_by_key(|r| r.0);
    let mut s = Text::SummaryTitle.text(lang).to_owned();
    let mut last = None;
    for (code, text) in rows {
        let shown = if last == Some(code) { String::new() } else { code.to_string() };
        last = Some(code);
        s.push_str(&format!("\n  {shown:<4}{text}"));
    }
    s
}

/// `doc` with the text between its [`BEGIN`] and [`END`] lines replaced by `table`; `None` when
/// the markers are missing or out of order.
pub fn splice(doc: &str, table: &str) -> Option<String> {
    let b = doc.find(BEGIN)?;
    let after_begin = b + BEGIN.len();
    let e = after_begin + doc[after_begin..].find(END)?;
    Some(format!("{}\n{}{}", &doc[..after_begin], table, &doc[e..]))
}

/// The text between the markers (what [`splice`] replaces), or `None`.
pub fn current(doc: &str) -> Option<&str> {
    let b = doc.find(BEGIN)? + BEGIN.len();
    let e = b + doc[b..].find(END)?;
    Some(doc[b..e].strip_prefix('\n').unwrap_or(&doc[b..e]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_and_outcome_is_a_row_in_both_languages() {
        for lang in [Lang::Ru, Lang::En] {
            let t = exit_code_table(lang);
            assert_eq!(t.lines().count(), 2 + Failure::ALL.len() + OUTCOMES.len(), "{t}");
            for f in Failure::ALL {
                let msg = cell(&f.with_placeholder(lang).message(lang));
                let row = format!("| {} | {} | {msg} |", f.code(), cell(f.who(lang)));
                assert!(t.contains(&row), "{f:?} missing: {row}\n{t}");
            }
            // Sorted by code.
            let codes: Vec<i32> =
                t.lines().skip(2).map(|l| l.split('|').nth(1).unwrap().trim().parse().unwrap()).collect();
            assert!(codes.windows(2).all(|w| w[0] <= w[1]), "{codes:?}");
        }
        assert!(exit_code_table(Lang::Ru).contains("‹параметр›"));
        assert!(exit_code_table(Lang::En).contains("| Unknown parameter: ‹parameter›. Copy"));
    }

    #[test]
    fn the_help_summary_lists_every_code_the_program_ends_with() {
        let en = exit_code_summary("gpum-install", Lang::En);
        for f in Failure::ALL {
            let line = first_sentence(&f.with_placeholder(Lang::En).message(Lang::En)).to_owned();
            let printed = names_program(f.who(Lang::En), "gpum-install");
            assert_eq!(en.contains(&line), printed, "{f:?}: {line}\n{en}");
        }
        assert!(
            en.starts_with("Exit codes:\n  0   installed; with --dry-run: the machine is ready\n"),
            "{en}"
        );
        assert!(en.contains("\n  1   Error: ‹what happened›\n"), "{en}");
        assert!(en.contains("\n  2   Unknown parameter: ‹parameter›\n      Invalid command line"), "{en}");
        assert!(!en.contains("uninstall") && !en.contains("78"), "{en}");
        let ru = exit_code_summary("gpum-install", Lang::Ru);
        assert!(ru.starts_with("Коды выхода:\n  0   установка завершена;"), "{ru}");
        assert!(ru.contains("\n  13  Установщик нужно запускать от имени root\n"), "{ru}");
        assert_eq!(ru.lines().count(), en.lines().count());
        assert!(names_program("gpum-agent status", "gpum-agent"));
        assert!(!names_program("gpum-agent status", "gpum-agent status-x"));
        assert!(!names_program("the gpum-agent service", "gpum-install"));
    }

    #[test]
    fn every_text_has_both_languages_with_the_same_holes() {
        for t in Text::ALL {
            if let Err(e) = crate::texts::check(t.text(Lang::Ru), t.text(Lang::En)) {
                panic!("{t:?}: {e}");
            }
        }
    }

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let doc = format!("a\n{BEGIN}\nold\n{END}\nb\n");
        let new = splice(&doc, "| new |\n").unwrap();
        assert_eq!(new, format!("a\n{BEGIN}\n| new |\n{END}\nb\n"));
        assert_eq!(current(&new), Some("| new |\n"));
        assert_eq!(splice(&new, "| new |\n").as_deref(), Some(new.as_str()), "idempotent");
        assert!(splice("no markers", "x").is_none());
        assert!(splice(&format!("{END}\n{BEGIN}"), "x").is_none());
    }
}
