//! Russian or English, from the locale.

use gpum_host::{Host, env};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lang {
    Ru,
    #[default]
    En,
}

impl Lang {
    /// Parses `--lang` values.
    pub fn parse(s: &str) -> Option<Lang> {
        match s.to_ascii_lowercase().as_str() {
            "ru" => Some(Lang::Ru),
            "en" => Some(Lang::En),
            _ => None,
        }
    }
}

/// POSIX precedence: the first of `LC_ALL`, `LC_MESSAGES`, `LANG` that is set and non-empty
/// decides; `ru…` means Russian, anything else English. `--lang` (the `flag`) wins over all.
pub fn detect_lang(host: &dyn Host, flag: Option<Lang>) -> Lang {
    if let Some(l) = flag {
        return l;
    }
    for k in [env::LC_ALL, env::LC_MESSAGES, env::LANG] {
        if let Some(v) = host.env(k).filter(|v| !v.is_empty()) {
            return if v.to_ascii_lowercase().starts_with("ru") { Lang::Ru } else { Lang::En };
        }
    }
    Lang::En
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::fake::FakeHost;

    #[test]
    fn precedence() {
        let h = FakeHost::new().env_var("LANG", "ru_RU.UTF-8");
        assert_eq!(detect_lang(&h, None), Lang::Ru);
        let h = FakeHost::new().env_var("LANG", "ru_RU.UTF-8").env_var("LC_ALL", "C.UTF-8");
        assert_eq!(detect_lang(&h, None), Lang::En);
        let h = FakeHost::new().env_var("LC_ALL", "").env_var("LC_MESSAGES", "ru_UA");
        assert_eq!(detect_lang(&h, None), Lang::Ru);
        assert_eq!(detect_lang(&FakeHost::new(), None), Lang::En);
        assert_eq!(detect_lang(&h, Some(Lang::En)), Lang::En);
    }
}
