//! The seed's failure list (`tests/fixtures/seed-owner-guide.ru.txt`, a copy of `shared/seeds/003_…txt`): lines of the form
//! `• «Title» (код N): what to do.` The Russian scenarios check that gpum's message for a failure
//! (`gpum_common::Failure::message(Lang::Ru)`) carries the seed's title for that exit code, and
//! that the installer's output carries it too.

use anyhow::{Context, Result, bail};

/// One failure the seed documents.
#[derive(Debug, Clone)]
pub struct SeedFailure {
    pub title: String,
    pub code: i32,
    /// The seed's text after the colon.
    pub fix: String,
}

/// The seed: `GPUM_SEED_FILE` when set, else the repository's copy,
/// `tests/fixtures/seed-owner-guide.ru.txt` (byte for byte `shared/seeds/003_073c84e361f18c1c.txt`,
/// which a CI checkout does not have beside it).
pub fn seed_text() -> Result<String> {
    let path = match std::env::var_os("GPUM_SEED_FILE") {
        Some(p) => std::path::PathBuf::from(p),
        None => crate::workspace_root().join("tests/fixtures/seed-owner-guide.ru.txt"),
    };
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// Every `«Title» (код N): fix` line of the seed.
pub fn failures(seed: &str) -> Vec<SeedFailure> {
    let mut out = Vec::new();
    for line in seed.lines() {
        let Some(open) = line.find('«') else { continue };
        let Some(close) = line[open..].find('»').map(|i| open + i) else { continue };
        let rest = &line[close + '»'.len_utf8()..];
        let Some(rest) = rest.trim_start().strip_prefix("(код ") else { continue };
        let Some(end) = rest.find(')') else { continue };
        let Ok(code) = rest[..end].trim().parse::<i32>() else { continue };
        let fix = rest[end + 1..].trim_start_matches(':').trim().to_string();
        out.push(SeedFailure {
            title: line[open + '«'.len_utf8()..close].to_string(),
            code,
            fix: fix.clone(),
        });
        // "The same code 2 for the other messages about the command's parameters («…», «…»)":
        // titles quoted in the fix text share the line's code.
        let mut rest = fix.as_str();
        while let Some(o) = rest.find('«') {
            let after = &rest[o + '«'.len_utf8()..];
            let Some(c) = after.find('»') else { break };
            out.push(SeedFailure { title: after[..c].to_string(), code, fix: fix.clone() });
            rest = &after[c + '»'.len_utf8()..];
        }
    }
    out
}

/// The seed entry for exit `code` whose title gpum's Russian `message` carries.
pub fn entry_for<'a>(seed: &'a [SeedFailure], code: i32, message: &str) -> Result<&'a SeedFailure> {
    match seed.iter().find(|f| f.code == code && message.contains(&f.title)) {
        Some(f) => Ok(f),
        None => bail!(
            "gpum's Russian message for exit {code} carries none of the seed's titles for that code ({:?}): {message}",
            seed.iter().filter(|f| f.code == code).map(|f| f.title.as_str()).collect::<Vec<_>>()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_seed_failure_lines() {
        let s = "x\n• «Установщик нужно запускать от имени root» (код 13): повторите команду с sudo.\n\
                 • «Код подключения выглядит неверно» (код 2): скопируйте команду. Тот же код 2 у \
                 («Не указан код подключения», «Неизвестный параметр»).\nплохо «a» без кода\n";
        let f = failures(s);
        assert_eq!(f.len(), 4);
        assert_eq!((f[3].title.as_str(), f[3].code), ("Неизвестный параметр", 2));
        assert_eq!(f[0].title, "Установщик нужно запускать от имени root");
        assert_eq!(f[0].code, 13);
        assert_eq!(f[0].fix, "повторите команду с sudo.");
        assert_eq!(f[1].code, 2);
        assert!(entry_for(&f, 13, "Ошибка: Установщик нужно запускать от имени root. Повторите.").is_ok());
        assert!(entry_for(&f, 2, "Установщик нужно запускать от имени root").is_err());
    }

    #[test]
    fn the_real_seed_lists_every_installer_exit_code() {
        // The repository's copy is always there (`seed_text`); nothing to skip.
        let seed = seed_text().expect("the seed");
        let codes: std::collections::BTreeSet<i32> = failures(&seed).iter().map(|f| f.code).collect();
        for c in [2, 10, 13, 14, 20, 31, 40, 50] {
            assert!(codes.contains(&c), "the seed has no failure line for exit {c}: {codes:?}");
        }
    }
}
