//! gpum-install: the one-line installer's program.
//!
//! [`run`] is the whole program over the seam, so unit tests drive it with `FakeHost` and the
//! integration tests drive the real binary. Today it does two things:
//! - `--dry-run`: gather facts (read-only), run every check, compute the [`plan::Plan`], print
//!   them (or `--json`), exit 0 when ready and 10 when not. It needs neither root nor a join code.
//! - without `--dry-run`: the pre-install gate, in the documented order (unknown parameter 2,
//!   not root 13, no systemd 14, join code missing or malformed 2, any failed check 10). The
//!   install flow itself is a later issue: a machine that passes gets
//!   [`Failure::InstallNotImplemented`] (exit 1), never a false 0.

pub mod apt;
pub mod cli;
pub mod download;
pub mod plan;
pub mod report;

use std::io::{Read, Write};
use std::path::Path;

use gpum_common::{Failure, Lang, detect_lang, exit};
use gpum_host::{Host, env};
use gpum_preflight::gpu::GpuProbe;
use gpum_preflight::{Finding, GatherOptions};
use gpum_protocol::joincode::JoinCode;

/// The process's standard streams, passed in so tests can capture them.
pub struct Io<'a> {
    pub stdin: &'a mut dyn Read,
    pub stdout: &'a mut dyn Write,
    pub stderr: &'a mut dyn Write,
}

/// Everything the audit found: the facts, one finding per check, and the plan.
#[derive(Debug)]
pub struct Audit {
    pub facts: gpum_preflight::Facts,
    pub findings: Vec<Finding>,
    pub plan: plan::Plan,
}

impl Audit {
    /// Gathers (read-only) and checks. The `apt_sources` check joins the preflight checks here,
    /// before `platform`, because it depends on the plan.
    pub fn run(host: &dyn Host, gpu: &dyn GpuProbe, opts: &GatherOptions, lang: Lang) -> Audit {
        let facts = gpum_preflight::gather(host, opts, gpu);
        let mut findings = gpum_preflight::run_all(&facts, lang);
        let plan = plan::plan(&facts);
        let all: Vec<_> =
            plan::distro(&facts).map(|d| gpum_repo_keys::pinned::repos_for(d).to_vec()).unwrap_or_default();
        let repos = apt::planned_repos(&plan, &all);
        let files =
            if repos.is_empty() { Vec::new() } else { gpum_repo_keys::sources::read_apt_sources(host) };
        let apt_finding = apt::check(&files, &repos, lang);
        let at =
            findings.iter().position(|f| f.id == gpum_preflight::checks::PLATFORM).unwrap_or(findings.len());
        findings.insert(at, apt_finding);
        Audit { facts, findings, plan }
    }

    pub fn ready(&self) -> bool {
        gpum_preflight::ready(&self.findings)
    }
}

/// The longest line read from stdin for a join code; anything longer is not one.
const STDIN_LIMIT: u64 = 4096;

/// The join code: `--code`, else `GPUM_JOIN_CODE`, else the first line of stdin when stdin is
/// not a terminal. Its check character catches typos here, before any network call.
pub fn join_code(host: &dyn Host, flag: Option<&str>, stdin: &mut dyn Read) -> Result<JoinCode, Failure> {
    let raw = match flag {
        Some(c) => c.to_string(),
        None => match host.env(env::GPUM_JOIN_CODE).filter(|c| !c.trim().is_empty()) {
            Some(c) => c,
            None if !host.stdin_is_tty() => {
                let mut buf = String::new();
                // Invalid UTF-8 or a read error is simply "no code".
                let _ = stdin.take(STDIN_LIMIT).read_to_string(&mut buf);
                buf.lines().next().unwrap_or_default().to_string()
            }
            None => String::new(),
        },
    };
    if raw.trim().is_empty() {
        return Err(Failure::NoJoinCode);
    }
    JoinCode::parse(&raw).map_err(|_| Failure::BadJoinCode)
}

fn fail(io: &mut Io, f: &Failure, lang: Lang) -> i32 {
    let _ = writeln!(io.stderr, "{}", f.message(lang));
    f.code()
}

/// The program. `args` includes the program name. Returns the exit code.
pub fn run(host: &dyn Host, gpu: &dyn GpuProbe, args: &[String], io: &mut Io) -> i32 {
    // Read before parsing so a usage error is already in the right language; when parsing
    // succeeds, `--lang` is the same value clap saw, so this is the run's language too.
    let lang = detect_lang(host, cli::lang_flag(args));
    let cli = match cli::parse(args) {
        cli::Parsed::Run(c) => c,
        cli::Parsed::Print(text) => {
            let _ = write!(io.stdout, "{text}");
            return exit::OK;
        }
        cli::Parsed::Fail(f) => return fail(io, &f, lang),
    };
    let opts = GatherOptions { server: cli.server.clone(), offline: cli.offline, ..Default::default() };

    if cli.dry_run {
        // No code is needed, but one given on the command line is checked: a typo found now
        // saves the real run.
        if let Some(c) = &cli.code
            && JoinCode::parse(c).is_err()
        {
            return fail(io, &Failure::BadJoinCode, lang);
        }
        let audit = Audit::run(host, gpu, &opts, lang);
        let ready = audit.ready();
        if cli.json {
            let r = report::JsonReport { checks: &audit.findings, plan: &audit.plan, ready };
            let _ = serde_json::to_writer(&mut *io.stdout, &r);
            let _ = writeln!(io.stdout);
        } else {
            let _ = report::write_dry_run(io.stdout, &audit.findings, &audit.plan, ready, lang);
            if !ready {
                let _ = io.stdout.flush();
                return fail(
                    io,
                    &Failure::PreflightFailed(gpum_preflight::failed_ids(&audit.findings)),
                    lang,
                );
            }
        }
        return if ready { exit::OK } else { exit::PREFLIGHT };
    }

    // The pre-install gate, in the documented order.
    if host.euid() != 0 {
        return fail(io, &Failure::NotRoot, lang);
    }
    if !host.is_dir(Path::new(gpum_preflight::facts::SYSTEMD_RUN_DIR)) {
        return fail(io, &Failure::NoSystemd, lang);
    }
    if let Err(f) = join_code(host, cli.code.as_deref(), io.stdin) {
        return fail(io, &f, lang);
    }
    let audit = Audit::run(host, gpu, &opts, lang);
    let _ = report::write_checks(io.stdout, &audit.findings, lang);
    let _ = io.stdout.flush();
    if !audit.ready() {
        return fail(io, &Failure::PreflightFailed(gpum_preflight::failed_ids(&audit.findings)), lang);
    }
    fail(io, &Failure::InstallNotImplemented, lang)
}

#[cfg(test)]
mod tests;
