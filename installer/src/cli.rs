//! The command line, and the mapping of clap's errors onto gpum's exit codes and messages.
//!
//! clap parses; gpum speaks. Usage errors exit 2 with [`Failure::UnknownParameter`] or
//! [`Failure::Usage`] in the user's language; `--help` and `--version` print and exit 0.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{FromArgMatches, Parser};
use gpum_common::{Failure, Lang};

use crate::text::{Msg, t};

#[derive(Debug, Clone, Parser, PartialEq, Eq)]
#[command(
    name = "gpum-install",
    version,
    about = "Installs the gpum agent on a GPU machine. With --dry-run, only audits the machine and changes nothing.",
    after_help = after_help(Lang::En)
)]
pub struct Cli {
    /// Audit the machine and print what the install would do; change nothing. Needs no root
    /// and no join code.
    #[arg(long)]
    pub dry_run: bool,
    /// JSON output. With --dry-run: one object {"checks":[…],"plan":[…],"ready":bool}; else one
    /// event per line, the last {"event":"exit","code":N,…}.
    #[arg(long)]
    pub json: bool,
    /// Answer yes: restart Docker even when that stops containers without a restart policy
    /// ($GPUM_YES=1).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// An extra trusted CA (PEM) for a platform with a private CA; the agent keeps it in its
    /// config ($GPUM_CA_FILE). It adds a root; it never turns verification off.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<String>,
    /// A registry the GPU probe image may come from; repeat for several. Default: the agent's
    /// list (docker.io, nvcr.io, ghcr.io) ($GPUM_PROBE_REGISTRIES, comma-separated).
    #[arg(long = "probe-registry", value_name = "HOST")]
    pub probe_registries: Vec<String>,
    /// Install an agent older than the one installed ($GPUM_ALLOW_DOWNGRADE=1).
    #[arg(long)]
    pub allow_downgrade: bool,
    /// Make no network request (the platform check is skipped).
    #[arg(long)]
    pub offline: bool,
    /// The platform's URL (https://…); checked for reachability over TLS ($GPUM_SERVER).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The join code from your dashboard (else $GPUM_JOIN_CODE, else one line on stdin). Without
    /// one, an installed agent whose server exists is repaired in place, keeping its server.
    #[arg(long, value_name = "CODE")]
    pub code: Option<String>,
    /// Message language (default: $GPUM_LANG, else LC_ALL / LC_MESSAGES / LANG).
    #[arg(long, value_name = "ru|en", value_parser = ["ru", "en"])]
    pub lang: Option<String>,
}

/// `--help`'s closing text in `lang`: the exit codes, derived from `gpum-common`'s failure table
/// (the same rows as the owner's guides), then where the environment variables are. The rest of
/// clap's help is English.
fn after_help(lang: Lang) -> String {
    format!(
        "{}\n\n{}",
        gpum_common::guide::exit_code_summary("gpum-install", lang),
        t(Msg::HelpEnvironment, lang)
    )
}

/// The clap definition, for the man page and shell completions `cargo xtask dist` generates: in
/// English, as man pages are.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// What parsing decided.
#[derive(Debug)]
pub enum Parsed {
    Run(Cli),
    /// `--help` or `--version`: print this to stdout, exit 0.
    Print(String),
    Fail(Failure),
}

/// `--lang` as given, read before parsing so a usage error is already in the right language.
pub fn lang_flag(args: &[String]) -> Option<Lang> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if let Some(v) = a.strip_prefix("--lang=") {
            return Lang::parse(v);
        }
        if a == "--lang" {
            return it.next().and_then(|v| Lang::parse(v));
        }
    }
    None
}

/// Parses `args`; `--help` closes with the exit codes in `lang`.
pub fn parse(args: &[String], lang: Lang) -> Parsed {
    let parsed = command()
        .after_help(after_help(lang))
        .try_get_matches_from(args)
        .and_then(|m| Cli::from_arg_matches(&m));
    match parsed {
        Ok(c) => Parsed::Run(c),
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => Parsed::Print(e.render().to_string()),
            ErrorKind::UnknownArgument => {
                let arg = match e.get(ContextKind::InvalidArg) {
                    Some(ContextValue::String(s)) => s.clone(),
                    _ => first_line(&e),
                };
                Parsed::Fail(Failure::UnknownParameter(arg))
            }
            _ => Parsed::Fail(Failure::Usage(first_line(&e))),
        },
    }
}

/// clap's reason (its first paragraph, on one line), without the `error: ` prefix and the usage
/// block.
fn first_line(e: &clap::Error) -> String {
    let r = e.render().to_string();
    let para: Vec<&str> = r.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
    let s = para.join(" ");
    s.strip_prefix("error: ").unwrap_or(&s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(v: &[&str]) -> Vec<String> {
        std::iter::once("gpum-install").chain(v.iter().copied()).map(String::from).collect()
    }

    #[test]
    fn flags() {
        let Parsed::Run(c) = parse(
            &a(&["--dry-run", "--json", "--offline", "--server", "https://x", "--lang", "ru"]),
            Lang::En,
        ) else {
            panic!()
        };
        assert!(c.dry_run && c.json && c.offline);
        assert_eq!(c.server.as_deref(), Some("https://x"));
        assert_eq!(c.lang.as_deref(), Some("ru"));
    }

    #[test]
    fn usage_errors_map_to_failures() {
        match parse(&a(&["--frobnicate"]), Lang::En) {
            Parsed::Fail(Failure::UnknownParameter(p)) => assert_eq!(p, "--frobnicate"),
            other => panic!("{other:?}"),
        }
        match parse(&a(&["stray"]), Lang::En) {
            Parsed::Fail(Failure::UnknownParameter(p)) => assert_eq!(p, "stray"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(&a(&["--lang", "de"]), Lang::En), Parsed::Fail(Failure::Usage(_))));
        assert!(matches!(parse(&a(&["--server"]), Lang::En), Parsed::Fail(Failure::Usage(_))));
        // --json also works for the install (one event per line).
        assert!(matches!(parse(&a(&["--json", "--yes"]), Lang::En), Parsed::Run(c) if c.json && c.yes));
        for f in ["--help", "-h", "--version", "-V"] {
            assert!(matches!(parse(&a(&[f]), Lang::En), Parsed::Print(_)), "{f}");
        }
    }

    #[test]
    fn help_lists_the_exit_codes_from_the_failure_table() {
        let Parsed::Print(help) = parse(&a(&["--help"]), Lang::En) else { panic!() };
        for f in Failure::ALL.iter().filter(|f| f.who(Lang::En).contains("gpum-install")) {
            let msg = f.with_placeholder(Lang::En).message(Lang::En);
            let first = msg.split(['.', '\n']).next().unwrap();
            assert!(help.contains(first), "{f:?}: {first}\n{help}");
            assert!(help.contains(&format!("\n  {:<4}", f.code())), "{f:?}\n{help}");
        }
        assert!(help.contains("  1   Error: ‹what happened›"), "{help}");
        assert!(
            help.ends_with("Every flag also reads an environment variable: see docs/install.md.\n"),
            "{help:?}"
        );
    }

    #[test]
    fn help_closes_with_the_exit_codes_in_the_given_language() {
        let Parsed::Print(en) = parse(&a(&["--help"]), Lang::En) else { panic!() };
        let Parsed::Print(ru) = parse(&a(&["--help"]), Lang::Ru) else { panic!() };
        let (en_clap, _) = en.split_once("Exit codes:").unwrap();
        let (ru_clap, ru_codes) = ru.split_once("Коды выхода:").unwrap();
        assert_eq!(ru_clap, en_clap, "clap's part is the same");
        assert_eq!(ru_codes.lines().count(), en.split_once("Exit codes:").unwrap().1.lines().count());
        assert!(ru_codes.contains("\n  13  Установщик нужно запускать от имени root\n"), "{ru}");
        assert!(ru.ends_with("Каждый параметр можно задать и переменной окружения: см. docs/install.md.\n"));
        // The man page's definition stays English.
        let man = command().render_help().to_string();
        assert!(man.contains("\nExit codes:\n") && !man.contains("Коды"), "{man}");
    }

    #[test]
    fn lang_flag_is_read_before_parsing() {
        assert_eq!(lang_flag(&a(&["--bogus", "--lang", "ru"])), Some(Lang::Ru));
        assert_eq!(lang_flag(&a(&["--lang=en"])), Some(Lang::En));
        assert_eq!(lang_flag(&a(&["--lang"])), None);
        assert_eq!(lang_flag(&a(&["--", "--lang", "ru"])), None);
    }
}
