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

/// An exit code that comes without a [`Failure`] message: (code, who, what it means), the texts
/// Russian and English side by side.
pub struct Outcome {
    pub code: i32,
    pub who: (&'static str, &'static str),
    pub what: (&'static str, &'static str),
}

/// The exit codes that are not a [`Failure`]. The agent's restart code,
/// `gpum_agent::run::EXIT_RESTART`, is [`exit::RESTART`].
pub const OUTCOMES: &[Outcome] = &[
    Outcome {
        code: exit::OK,
        who: ("gpum-install", "gpum-install"),
        what: (
            "установка завершена; с --dry-run: машина готова. «Ожидает проверки» после установки — тоже 0: образ для проверки ещё не выбран, это не ошибка",
            "installed; with --dry-run: the machine is ready. \"Awaiting check\" after the install is 0 too: no probe image has been chosen yet, which is not an error",
        ),
    },
    Outcome {
        code: exit::OK,
        who: ("gpum-agent", "gpum-agent"),
        what: (
            "команда выполнена; run (служба): остановлена по SIGTERM (systemctl stop)",
            "the command succeeded; run (the service): stopped by SIGTERM (systemctl stop)",
        ),
    },
    Outcome {
        code: exit::OTHER,
        who: ("gpum-agent uninstall", "gpum-agent uninstall"),
        what: (
            "удалено не всё: итог перечисляет, что удалено, и после «Не удалось:» — что нет",
            "not everything was removed: the summary lists what was, and after \"Failed:\" what was not",
        ),
    },
    Outcome {
        code: exit::OTHER,
        who: ("gpum-agent smoke, doctor --connectivity", "gpum-agent smoke, doctor --connectivity"),
        what: (
            "платформа не ответила как надо: соединение отклонено, ошибка TLS, страница прокси, ошибка 5xx",
            "the platform did not answer properly: connection refused, a TLS error, a proxy's page, a 5xx error",
        ),
    },
    Outcome {
        code: exit::USAGE,
        who: ("gpum-agent", "gpum-agent"),
        what: (
            "неизвестная команда или параметр; текст — clap, по-английски; gpum-agent --help",
            "unknown command or option; the text is clap's, in English; gpum-agent --help",
        ),
    },
    Outcome {
        code: exit::SMOKE_TIMEOUT,
        who: ("gpum-agent smoke, doctor --connectivity", "gpum-agent smoke, doctor --connectivity"),
        what: ("платформа не ответила за 10 секунд", "no answer from the platform within 10 seconds"),
    },
    Outcome {
        code: exit::SMOKE_TOKEN_REJECTED,
        who: ("gpum-agent smoke, doctor --connectivity", "gpum-agent smoke, doctor --connectivity"),
        what: (
            "платформа отклонила токен (сервер удалён, токен заменён или неизвестен)",
            "the platform rejected the token (server deleted, token replaced or unknown)",
        ),
    },
    Outcome {
        code: exit::RESTART,
        who: ("служба gpum-agent", "the gpum-agent service"),
        what: (
            "перезапуск по команде платформы; systemd сразу запускает агент снова",
            "a restart the platform asked for; systemd starts the agent again at once",
        ),
    },
];

fn pick(texts: (&'static str, &'static str), lang: Lang) -> &'static str {
    if lang == Lang::Ru { texts.0 } else { texts.1 }
}

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
            .map(|o| (o.code, pick(o.who, lang).to_owned(), format!("*{}*", cell(pick(o.what, lang))))),
    );
    rows.sort_by_key(|r| r.0);
    let head = pick(
        ("| Код | Кто | Сообщение или что значит |", "| Code | Who | Message, or what it means |"),
        lang,
    );
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
            .filter(|o| names_program(o.who.1, program))
            .map(|o| (o.code, first_sentence(pick(o.what, lang)).to_owned())),
    );
    rows.sort_by_key(|r| r.0);
    let mut s = pick(("Коды выхода:", "Exit codes:"), lang).to_owned();
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
