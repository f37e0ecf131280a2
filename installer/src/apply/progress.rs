//! Progress on a terminal: what the long steps are doing, drawn with `indicatif` on stderr
//! while it is a terminal ([`gpum_host::Host::stderr_is_tty`]) and the output is not `--json`.
//! The agent's download shows its bytes and rate; `apt-get update` and `apt-get install` show
//! apt's own status lines (`APT::Status-Fd`, [`parse_apt_status`]), package by package; the
//! Docker restart and the waits for the first heartbeat and the GPU check show a spinner with
//! the time elapsed and the limit. Each [`Phase`] is cleared before its step's result line is
//! printed on stdout, so that line is the same as without a terminal.
//!
//! Without a terminal (a pipe, a file, cron) or with `--json` nothing is drawn and nothing else
//! changes: the same commands run (apt without a status pipe) and stdout is line by line, byte
//! for byte, what it always was.

use std::time::Duration;

use gpum_common::Lang;
use gpum_common::text::escape_controls;
use gpum_host::{Cmd, Host, Output, STATUS_FD};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::Run;
use super::steps::{apt, checked};
use crate::text::{Msg, t};

/// How often a spinner turns and the elapsed time is redrawn.
const TICK: Duration = Duration::from_millis(120);
/// How often the terminal is redrawn at most.
const REDRAW_HZ: u8 = 10;
/// ASCII only: whatever the terminal's font and locale.
const SPINNER: &str = "|/-\\ ";
const BAR: &str = "=> ";

/// Draws the phases of one install, or nothing.
pub(super) struct Progress {
    lang: Lang,
    /// Where a phase is drawn; `None`: nowhere (no terminal, or `--json`).
    target: Option<Box<dyn Fn() -> ProgressDrawTarget>>,
}

impl Progress {
    /// Draws on stderr when `on` (stderr is a terminal and the output is not `--json`).
    pub(super) fn new(on: bool, lang: Lang) -> Progress {
        let target: Option<Box<dyn Fn() -> ProgressDrawTarget>> =
            on.then(|| Box::new(|| ProgressDrawTarget::stderr_with_hz(REDRAW_HZ)) as _);
        Progress { lang, target }
    }

    /// Whether anything is drawn.
    pub(super) fn on(&self) -> bool {
        self.target.is_some()
    }

    /// A phase called `what` (its `{prefix}`), drawn with `template`.
    fn bar(&self, what: Msg, len: Option<u64>, template: &str) -> Phase {
        let Some(target) = &self.target else { return Phase(None) };
        let pb = ProgressBar::with_draw_target(len, target())
            .with_style(style(template))
            .with_prefix(t(what, self.lang));
        pb.enable_steady_tick(TICK);
        Phase(Some(pb))
    }

    /// The agent's download: a spinner while the signed manifest is fetched and checked,
    /// then the bytes received of the signed size, and the rate ([`Phase::bytes`]).
    pub(super) fn download(&self) -> Phase {
        self.bar(Msg::ProgressDownload, None, "{spinner} {prefix}")
    }

    /// An apt run: apt's percentage and its current line (a file, or a package and what dpkg
    /// does with it).
    pub(super) fn apt(&self, what: Msg) -> Phase {
        self.bar(what, Some(100), "{spinner} {prefix} [{bar:30}] {pos:>3}% {wide_msg}")
    }

    /// A wait of at most `limit`: a spinner, the time elapsed and the limit.
    pub(super) fn wait(&self, what: Msg, limit: Duration) -> Phase {
        let of = t(Msg::ProgressLimit, self.lang);
        self.bar(what, None, &format!("{{spinner}} {{prefix}}: {{elapsed_precise}} {of} {}", hms(limit)))
    }

    #[cfg(test)]
    pub(super) fn to(lang: Lang, target: impl Fn() -> ProgressDrawTarget + 'static) -> Progress {
        Progress { lang, target: Some(Box::new(target)) }
    }
}

/// The download's bar, once its size is known.
const BYTES: &str = "{spinner} {prefix} [{bar:30}] {bytes} / {total_bytes}, {binary_bytes_per_sec}";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .tick_chars(SPINNER)
        .progress_chars(BAR)
}

/// `HH:MM:SS`, as `indicatif` writes the time elapsed.
fn hms(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// One phase on the terminal, cleared when dropped (before the step's result line).
pub(super) struct Phase(Option<ProgressBar>);

impl Phase {
    /// `done` bytes of `total` received.
    pub(super) fn bytes(&self, done: u64, total: u64) {
        let Some(pb) = &self.0 else { return };
        if pb.length().is_none() {
            pb.set_style(style(BYTES));
        }
        pb.update(|st| {
            st.set_len(total);
            st.set_pos(done);
        });
    }

    /// One line apt wrote to its status pipe.
    pub(super) fn apt_line(&self, line: &str) {
        let (Some(pb), Some(st)) = (&self.0, parse_apt_status(line)) else { return };
        // apt counts the download, then dpkg's work, each from 0 to 100.
        pb.set_position(st.percent.round() as u64);
        pb.set_message(escape_controls(&st.line()).into_owned());
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        if let Some(pb) = self.0.take() {
            pb.finish_and_clear();
        }
    }
}

/// What one of apt's status lines says (apt's `doc/progress-reporting.txt`: `dlstatus`,
/// `pmstatus`, `pmerror` and `pmconffile`, each `KIND:ITEM:PERCENT:TEXT`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct AptStatus<'a> {
    pub kind: AptKind,
    /// A download's item number, or the package (without its architecture), or `dpkg-exec`.
    pub item: &'a str,
    /// 0 to 100.
    pub percent: f64,
    /// apt's words, in apt's language: `Retrieving file 2 of 5`, `Unpacking docker-ce (amd64)`.
    pub text: &'a str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AptKind {
    /// `dlstatus`: files downloading.
    Download,
    /// `pmstatus`: dpkg at work on a package.
    Package,
    /// `pmerror`: dpkg failed on a package.
    Error,
    /// `pmconffile`: a configuration file question (answered by `--force-confold`).
    Conffile,
}

impl AptStatus<'_> {
    /// The line shown beside the bar: apt's words, with the package first where they do not
    /// name it.
    fn line(&self) -> String {
        match self.kind {
            AptKind::Package | AptKind::Error | AptKind::Conffile
                if self.item != "dpkg-exec" && !self.text.contains(self.item) =>
            {
                format!("{}: {}", self.item, self.text)
            }
            _ => self.text.to_string(),
        }
    }
}

/// Parses one of apt's status lines; `None` for anything else (a line of another kind, a
/// malformed one, a percentage that is no number).
pub(super) fn parse_apt_status(line: &str) -> Option<AptStatus<'_>> {
    let mut parts = line.trim_end_matches(['\r', '\n']).splitn(4, ':');
    let kind = match parts.next()? {
        "dlstatus" => AptKind::Download,
        "pmstatus" => AptKind::Package,
        "pmerror" => AptKind::Error,
        "pmconffile" => AptKind::Conffile,
        _ => return None,
    };
    let item = parts.next()?;
    let percent: f64 = parts.next()?.trim().parse().ok()?;
    if !percent.is_finite() {
        return None;
    }
    let text = parts.next()?.trim();
    Some(AptStatus { kind, item, percent: percent.clamp(0.0, 100.0), text })
}

impl Run<'_> {
    /// `apt-get ARGS` as [`super::steps::must`] runs it; on a terminal with a status pipe
    /// whose lines move `what`'s bar. Failures name the command as it is without the pipe.
    pub(super) fn apt_watched(&self, args: &[&str], what: Msg) -> Result<Output, gpum_common::Failure> {
        let h: &dyn Host = self.host.as_ref();
        let plain = apt(args);
        if !self.progress.on() {
            return checked(&plain, h.run(&plain));
        }
        let fd = format!("APT::Status-Fd={STATUS_FD}");
        let watched = Cmd { args: with_status_fd(&plain.args, &fd), ..plain.clone() };
        let phase = self.progress.apt(what);
        let out = h.run_with_status(&watched, &mut |line| phase.apt_line(line));
        drop(phase);
        checked(&plain, out)
    }
}

/// `args` with `-o OPTION` before apt-get's command (its first argument that is not an option).
fn with_status_fd(args: &[String], option: &str) -> Vec<String> {
    let at = args.iter().position(|a| a == "apt-get").map_or(0, |i| i + 1);
    let mut v = args[..at].to_vec();
    v.extend(["-o".to_string(), option.to_string()]);
    v.extend_from_slice(&args[at..]);
    v
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use indicatif::TermLike;

    use super::*;

    #[test]
    fn apt_status_lines_are_parsed() {
        let st = |kind, item, percent, text| Some(AptStatus { kind, item, percent, text });
        // As apt 2.6 (Debian 12) writes them.
        assert_eq!(
            parse_apt_status("dlstatus:1:9.0566:Retrieving file 1 of 3"),
            st(AptKind::Download, "1", 9.0566, "Retrieving file 1 of 3")
        );
        assert_eq!(
            parse_apt_status("dlstatus:3:61.2500:Retrieving file 3 of 5 (2s remaining)\n"),
            st(AptKind::Download, "3", 61.25, "Retrieving file 3 of 5 (2s remaining)")
        );
        assert_eq!(
            parse_apt_status("pmstatus:dpkg-exec:0.0000:Running dpkg"),
            st(AptKind::Package, "dpkg-exec", 0.0, "Running dpkg")
        );
        assert_eq!(
            parse_apt_status("pmstatus:docker-ce:42.8571:Unpacking docker-ce (amd64)"),
            st(AptKind::Package, "docker-ce", 42.8571, "Unpacking docker-ce (amd64)")
        );
        // The text may hold colons; only the first three separate fields.
        assert_eq!(
            parse_apt_status(
                "pmerror:jq:50.0000:error processing archive /var/cache/apt/archives/jq.deb: broken"
            ),
            st(AptKind::Error, "jq", 50.0, "error processing archive /var/cache/apt/archives/jq.deb: broken")
        );
        assert_eq!(
            parse_apt_status("pmconffile:/etc/x.conf:10.0000:'/etc/x.conf' '/etc/x.conf.dpkg-new' 1 1"),
            st(AptKind::Conffile, "/etc/x.conf", 10.0, "'/etc/x.conf' '/etc/x.conf.dpkg-new' 1 1")
        );
        // A percentage out of range is held to 0..100.
        assert_eq!(parse_apt_status("dlstatus:2:100.5:Retrieving file 2 of 2").unwrap().percent, 100.0);
        assert_eq!(parse_apt_status("dlstatus:2:-1:x").unwrap().percent, 0.0);
        // Anything else is not a status line.
        for bad in [
            "",
            "Reading package lists...",
            "Get:1 http://127.0.0.1:8088/docker bookworm InRelease [3,138 B]",
            "pmstatus:docker-ce",
            "pmstatus:docker-ce:many:Unpacking",
            "pmstatus:docker-ce:NaN:Unpacking",
            "pmstatus:docker-ce:inf:Unpacking",
            "media-change:cdrom:Debian:/media/cdrom",
            "status:docker-ce:10:Installing",
        ] {
            assert_eq!(parse_apt_status(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_line_beside_the_bar_names_the_package() {
        let line = |l: &str| parse_apt_status(l).unwrap().line();
        assert_eq!(line("pmstatus:jq:20.0000:Unpacking jq (amd64)"), "Unpacking jq (amd64)");
        assert_eq!(line("pmstatus:jq:20.0000:Installed"), "jq: Installed");
        assert_eq!(line("pmstatus:dpkg-exec:0.0000:Running dpkg"), "Running dpkg");
        assert_eq!(line("dlstatus:1:0.0000:Retrieving file 1 of 3"), "Retrieving file 1 of 3");
    }

    #[test]
    fn the_status_option_goes_before_apts_command() {
        let plain = apt(&["install", "-y", "jq"]);
        let v = with_status_fd(&plain.args, "APT::Status-Fd={status_fd}");
        let i = v.iter().position(|a| a == "apt-get").unwrap();
        assert_eq!(v[i + 1..i + 3], ["-o", "APT::Status-Fd={status_fd}"]);
        assert_eq!(v[..=i], plain.args[..=i]);
        assert_eq!(v[i + 3..], plain.args[i + 1..]);
    }

    /// A terminal that keeps every frame drawn on it.
    #[derive(Debug, Clone, Default)]
    pub(in crate::apply) struct Screen(Arc<Mutex<Vec<String>>>);

    impl Screen {
        pub(in crate::apply) fn frames(&self) -> Vec<String> {
            self.0.lock().unwrap().iter().filter(|f| !f.trim().is_empty()).cloned().collect()
        }
        pub(in crate::apply) fn target(&self) -> ProgressDrawTarget {
            ProgressDrawTarget::term_like_with_hz(Box::new(self.clone()), 100)
        }
    }

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, _n: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _n: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _n: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _n: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push(s.to_string());
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push(s.to_string());
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Waits for the next steady tick, which draws the phase as it is now.
    fn next_tick() {
        std::thread::sleep(TICK + TICK / 2);
    }

    #[test]
    fn apts_lines_move_the_bar_package_by_package() {
        let screen = Screen::default();
        let s = screen.clone();
        let p = Progress::to(Lang::En, move || s.target());
        let phase = p.apt(Msg::ProgressAptInstall);
        for l in [
            "dlstatus:1:50.0000:Retrieving file 1 of 2",
            "pmstatus:containerd.io:12.5000:Unpacking containerd.io (amd64)",
            "Reading package lists...",
            "pmstatus:docker-ce:75.0000:Setting up docker-ce (5:27.5.1-1~debian.12~bookworm)",
        ] {
            phase.apt_line(l);
            next_tick();
        }
        let pb = phase.0.clone().unwrap();
        assert_eq!(pb.position(), 75);
        assert_eq!(pb.message(), "Setting up docker-ce (5:27.5.1-1~debian.12~bookworm)");
        drop(phase);
        assert!(pb.is_finished(), "a phase ends when dropped");
        let frames = screen.frames();
        let has = |needle: &str| frames.iter().any(|f| f.contains(needle));
        assert!(has("installing packages ["), "{frames:#?}");
        assert!(has(" 50% Retrieving file 1 of 2"), "{frames:#?}");
        assert!(has(" 13% Unpacking containerd.io (amd64)"), "{frames:#?}");
        assert!(has(" 75% Setting up docker-ce"), "{frames:#?}");
        assert!(has("[======================>"), "three quarters of the bar: {frames:#?}");
    }

    #[test]
    fn the_download_shows_bytes_and_the_waits_their_limit() {
        let screen = Screen::default();
        let s = screen.clone();
        let p = Progress::to(Lang::Ru, move || s.target());
        let phase = p.download();
        next_tick();
        phase.bytes(3 << 20, 12 << 20);
        next_tick();
        drop(phase);
        let phase = p.wait(Msg::ProgressGpuCheck, Duration::from_secs(300));
        next_tick();
        drop(phase);
        let frames = screen.frames();
        let has = |needle: &str| frames.iter().any(|f| f.contains(needle));
        assert!(
            frames.iter().any(|f| f.ends_with("скачиваю агент")),
            "before the size is known: {frames:#?}"
        );
        assert!(has("скачиваю агент [=======>"), "{frames:#?}");
        assert!(has("3.00 MiB / 12.00 MiB"), "{frames:#?}");
        assert!(has("жду проверки видеокарты: 00:00:00 из 00:05:00"), "{frames:#?}");
    }

    #[test]
    fn without_a_terminal_nothing_is_drawn() {
        let p = Progress::new(false, Lang::En);
        assert!(!p.on());
        for phase in [p.download(), p.apt(Msg::ProgressAptUpdate), p.wait(Msg::ProgressHeartbeat, TICK)] {
            assert!(phase.0.is_none());
            phase.bytes(1, 2);
            phase.apt_line("pmstatus:jq:20.0000:Unpacking jq (amd64)");
        }
    }

    #[test]
    fn hms_is_indicatifs_elapsed_format() {
        assert_eq!(hms(Duration::from_secs(60)), "00:01:00");
        assert_eq!(hms(Duration::from_secs(3725)), "01:02:05");
    }
}
