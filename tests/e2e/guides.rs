//! The owner's guides against the code: the table of messages and exit codes in
//! `docs/owner-guide.{ru,en}.md` must be the one `gpum_common::guide` renders from `Failure` and
//! the exit codes, every message the prose quotes with an exit code must be one the programs
//! print with that code, and the exit codes defined outside `gpum-common` must agree with it.
//! `cargo xtask docs` rewrites the tables.

use gpum_common::agent_state::StopReason;
use gpum_common::{Failure, Lang, exit, guide};

const GUIDES: &[(&str, Lang)] = &[("docs/owner-guide.ru.md", Lang::Ru), ("docs/owner-guide.en.md", Lang::En)];

fn read(rel: &str) -> String {
    let p = gpum_tests::workspace_root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The lines only in `want` (`-`) and only in `got` (`+`), in order.
fn diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut out = String::new();
    for l in &w {
        if !g.contains(l) {
            out.push_str(&format!("- {l}\n"));
        }
    }
    for l in &g {
        if !w.contains(l) {
            out.push_str(&format!("+ {l}\n"));
        }
    }
    if out.is_empty() {
        out.push_str("(the same lines, in another order)\n");
    }
    out
}

#[test]
fn the_exit_code_tables_are_the_code_s() {
    let mut failures = Vec::new();
    for (rel, lang) in GUIDES {
        let doc = read(rel);
        let want = guide::exit_code_table(*lang);
        match guide::current(&doc) {
            None => failures.push(format!("{rel}: no `{}` … `{}` lines", guide::BEGIN, guide::END)),
            Some(got) if got != want => failures.push(format!(
                "{rel}: the table differs from the code (- code, + guide):\n{}",
                diff(&want, got)
            )),
            Some(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{}\nRegenerate the tables with `cargo xtask docs`, then review and commit the guides.",
        failures.join("\n")
    );
}

/// Every `«message» (код N)` (Russian) or `"message" (exit code N)` (English) in the prose.
fn quoted_with_code(doc: &str, open: char, close: &str, code_word: &str) -> Vec<(String, i32)> {
    let mut found = Vec::new();
    let mut rest = doc;
    while let Some(i) = rest.find(open) {
        rest = &rest[i + open.len_utf8()..];
        let Some(j) = rest.find(close) else { break };
        // A quote may be wrapped across lines: one space for each run of whitespace.
        let quoted = rest[..j].split_whitespace().collect::<Vec<_>>().join(" ");
        rest = &rest[j + close.len()..];
        let code_words: Vec<&str> = code_word.split(' ').collect();
        let mut after = rest.split_whitespace();
        let opens = after.next().and_then(|w| w.strip_prefix('(')) == Some(code_words[0]);
        if opens && code_words[1..].iter().all(|w| after.next() == Some(w)) {
            let digits: String =
                after.next().unwrap_or("").chars().take_while(char::is_ascii_digit).collect();
            if let Ok(code) = digits.parse() {
                found.push((quoted, code));
            }
        }
    }
    found
}

#[test]
fn every_quoted_message_has_its_exit_code() {
    for (rel, lang, open, close, word) in [
        ("docs/owner-guide.ru.md", Lang::Ru, '«', "»", "код"),
        ("docs/owner-guide.en.md", Lang::En, '"', "\"", "exit code"),
    ] {
        let doc = read(rel);
        let quotes = quoted_with_code(&doc, open, close, word);
        assert!(quotes.len() >= 18, "{rel}: the prose quotes messages with their codes: {quotes:?}");
        for (q, code) in quotes {
            let matching: Vec<&Failure> = Failure::ALL
                .iter()
                .filter(|f| f.with_placeholder(lang).message(lang).starts_with(q.as_str()))
                .collect();
            assert!(!matching.is_empty(), "{rel}: {open}{q}{close} is no message gpum prints");
            assert!(
                matching.iter().any(|f| f.code() == code),
                "{rel}: {open}{q}{close} exits {}, not {code}",
                matching[0].code()
            );
        }
    }
}

#[test]
fn exit_codes_defined_elsewhere_agree_with_gpum_common() {
    assert_eq!(gpum_agent::run::EXIT_RESTART, exit::RESTART);
    assert!(guide::OUTCOMES.iter().any(|o| o.code == exit::RESTART));
    // What `status` shows after the service stopped for good is the table's exit-78 message.
    for lang in [Lang::Ru, Lang::En] {
        assert_eq!(
            gpum_agent::status::stop_message(StopReason::Revoked, lang),
            Failure::StoppedRevoked.message(lang)
        );
        assert_eq!(
            gpum_agent::status::stop_message(StopReason::ConfigError, lang),
            Failure::StoppedConfig(String::new()).message(lang)
        );
    }
    assert_eq!(Failure::StoppedRevoked.code(), exit::STOPPED_FOR_GOOD);
}

#[test]
fn the_two_guides_have_the_same_sections() {
    // Headings outside code blocks, by level.
    let heads = |rel: &str| {
        let mut fenced = false;
        let mut levels = Vec::new();
        for l in read(rel).lines() {
            if l.starts_with("```") {
                fenced = !fenced;
            } else if !fenced && l.starts_with('#') {
                levels.push(l.chars().take_while(|c| *c == '#').count());
            }
        }
        levels
    };
    let (ru, en) = (heads("docs/owner-guide.ru.md"), heads("docs/owner-guide.en.md"));
    assert!(ru.len() >= 10, "{ru:?}");
    assert_eq!(ru, en, "the Russian and English guides have the same sections, in the same order");
}
