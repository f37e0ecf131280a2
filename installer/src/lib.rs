//! gpum-install: the one-line installer's program.
//!
//! [`run`] is the whole program over the seam, so unit tests drive it with `FakeHost` and the
//! integration tests drive the real binary:
//! - `--dry-run`: gather facts (read-only), run every check, compute the [`plan::Plan`], print
//!   them (or `--json`), exit 0 when ready and 10 when not. It needs neither root nor a join code.
//! - without `--dry-run`: the pre-install gate, in the documented order (unknown parameter 2,
//!   not root 13, no systemd 14, join code missing or malformed 2, any failed check 10), then
//!   [`apply::install`] executes the same plan the dry run shows, and a summary.

pub mod apply;
pub mod apt;
pub mod cli;
pub mod daemon_json;
pub mod dockerd;
pub mod download;
pub mod knobs;
pub mod plan;
pub mod report;
pub mod text;
pub mod toolkit_config;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpum_common::{Failure, Lang, detect_lang, exit};
use gpum_host::{Host, env};
use gpum_preflight::gpu::GpuProbe;
use gpum_preflight::{Finding, GatherOptions, Registration};
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
    /// The repositories the plan may add (pinned, or the test host's with `test-knobs`).
    pub repos: Vec<gpum_repo_keys::pinned::Repo>,
}

impl Audit {
    /// [`Audit::with_knobs`] with the release values ([`knobs::Knobs::release`]).
    pub fn run(host: &dyn Host, gpu: &dyn GpuProbe, opts: &GatherOptions, lang: Lang) -> Audit {
        Self::with_knobs(host, gpu, opts, lang, &knobs::Knobs::release(), Registration::Unknown)
    }

    /// Gathers (read-only) and checks. The `apt_sources` check joins the preflight checks here,
    /// before `platform`, because it depends on the plan. `knobs` may lower the disk minimum and
    /// replace the repositories (`test-knobs` only). `registration`: what the install does with
    /// an installed agent's server ([`registration`]); a repair's plan keeps it.
    pub fn with_knobs(
        host: &dyn Host,
        gpu: &dyn GpuProbe,
        opts: &GatherOptions,
        lang: Lang,
        knobs: &knobs::Knobs,
        registration: Registration,
    ) -> Audit {
        let facts = gpum_preflight::gather(host, opts, gpu);
        let repos = plan::distro(&facts).map(|d| knobs.repos_for(d));
        let mut input = plan::PlanInput {
            server: opts.server.clone(),
            repos,
            docker: dockerd::gather(host, &facts),
            proxy: proxy_vars(host),
            ca_pem: opts.extra_roots_pem.first().cloned(),
            owner_sources: Vec::new(),
        };
        let mut plan = plan::plan(&facts, &input);
        let all: Vec<_> = repos.map(|r| r.to_vec()).unwrap_or_default();
        let wanted = apt::planned_repos(&plan, &all);
        let files =
            if wanted.is_empty() { Vec::new() } else { gpum_repo_keys::sources::read_apt_sources(host) };
        // A repository the owner already has, signed by exactly its pinned key, is used as it
        // is: the plan adds neither its source nor its key.
        input.owner_sources = apt::owner_sources(host, &files, &wanted, &plan);
        if !input.owner_sources.is_empty() {
            plan = plan::plan(&facts, &input);
        }
        if registration == Registration::Keep
            && let Some(node) = installed_node(host)
        {
            plan.keep_registration(&node.node_id);
        }
        // The checks know what the install will do: a toolkit with a known container escape is
        // a warning when the plan upgrades it.
        let cx = gpum_preflight::Context {
            min_free_bytes: knobs.min_free_bytes().unwrap_or(gpum_preflight::checks::MIN_FREE_BYTES),
            toolkit_will_be_upgraded: plan.installs_toolkit(),
            registration,
        };
        let mut findings = gpum_preflight::checks::run(&facts, &cx, lang);
        let planned = apt::planned_repos(&plan, &all);
        let apt_finding = apt::check(&files, &planned, lang);
        let at =
            findings.iter().position(|f| f.id == gpum_preflight::checks::PLATFORM).unwrap_or(findings.len());
        findings.insert(at, apt_finding);
        Audit { facts, findings, plan, repos: all }
    }

    pub fn ready(&self) -> bool {
        gpum_preflight::ready(&self.findings)
    }
}

/// The proxy variables the installer was started with, which the service gets too.
pub fn proxy_vars(host: &dyn Host) -> Vec<(String, String)> {
    env::PROXY_VARS
        .iter()
        .filter_map(|k| host.env(k).filter(|v| !v.is_empty()).map(|v| (k.to_string(), v)))
        .collect()
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

/// Why a repair cannot go to `server`: the installed agent belongs to another platform.
fn repair_elsewhere(node: &InstalledNode, server: &str) -> String {
    format!(
        "--server {server}: the installed agent (server {}) belongs to {}; a repair keeps its platform",
        node.node_id, node.server
    )
}

/// The lock one install holds from its gate on ([`Host::try_lock`]: a POSIX lock, released
/// when the process ends), so that two copies of the one-liner never interleave.
pub const INSTALL_LOCK: &str = "/run/gpum-install.lock";

/// The install id (`apply::INSTALL_ID`, 128 random bits in a root-only 0600 file): the one
/// already there, else a new one written before it is first sent.
pub fn install_id(h: &dyn Host) -> Result<String, Failure> {
    let io = |p: &Path, e: std::io::Error| Failure::Other(format!("{}: {e}", p.display()));
    let path = Path::new(apply::INSTALL_ID);
    if let Some(id) = h.read_to_string(path).ok().map(|s| s.trim().to_string())
        && id.len() == 32
        && id.chars().all(|c| c.is_ascii_hexdigit())
    {
        return Ok(id);
    }
    for d in [gpum_common::agent_state::CONFIG_DIR, gpum_common::agent_state::DEFAULT_STATE_DIR] {
        h.create_dir_all(Path::new(d), 0o700).map_err(|e| io(Path::new(d), e))?;
    }
    let mut b = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut b);
    let id: String = b.iter().map(|x| format!("{x:02x}")).collect();
    h.write_atomic(path, format!("{id}\n").as_bytes(), 0o600).map_err(|e| io(path, e))?;
    Ok(id)
}

/// The join code's SHA-256 in hex, as [`apply::JOIN_CODE_HASH`] holds it.
pub fn code_sha256(code: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(code.trim().as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The installed agent a repair keeps: its config loads (token, server, node) and its state
/// does not say the platform deleted its server or replaced its token.
pub struct InstalledNode {
    pub node_id: String,
    pub server: String,
}

pub fn installed_node(h: &dyn Host) -> Option<InstalledNode> {
    let dir = Path::new(gpum_common::agent_state::DEFAULT_STATE_DIR);
    if let Ok(Some(st)) = gpum_common::agent_state::read(h, dir)
        && st.stopped.is_some_and(|s| s.reason == gpum_common::agent_state::StopReason::Revoked)
    {
        return None;
    }
    let cfg =
        gpum_enroll::config::Config::load(h, Path::new(gpum_common::agent_state::DEFAULT_CONFIG)).ok()?;
    Some(InstalledNode { node_id: cfg.node_id, server: cfg.server })
}

/// What an install with `code` does with the installed agent's server: the same code as the
/// one it was registered with ([`apply::JOIN_CODE_HASH`]) or none repairs in place; another is a
/// new registration. `None` with `repair == false`: a dry run without a code, not known.
pub fn registration(h: &dyn Host, code: Option<&JoinCode>, repair: bool) -> Registration {
    match code {
        None if repair => Registration::Keep,
        None => Registration::Unknown,
        Some(c) => {
            let stored = h.read_to_string(Path::new(apply::JOIN_CODE_HASH)).unwrap_or_default();
            if stored.trim() == code_sha256(&c.to_string()) {
                Registration::SameCode
            } else {
                Registration::NewCode
            }
        }
    }
}

/// Binds the join code to this installation's install id (`POST /api/v1/agent/enroll`).
fn enroll(h: &dyn Host, opts: &apply::Options) -> Result<(), Failure> {
    let id = install_id(h)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Other(e.to_string()))?;
    let code = opts.code.as_deref().ok_or(Failure::NoJoinCode)?;
    rt.block_on(gpum_enroll::register::enroll(h, &opts.server, opts.ca_file.as_deref(), code, &id))
}

fn fail(io: &mut Io, f: &Failure, lang: Lang, json: bool) -> i32 {
    if json {
        report::Events::new(io.stdout).failed(f, lang);
    }
    let _ = writeln!(io.stderr, "{}", f.message(lang));
    f.code()
}

/// A flag, else its environment variable (for cloud-init and Ansible; docs/install.md).
fn flag_or_env(host: &dyn Host, flag: Option<String>, var: &str) -> Option<String> {
    flag.or_else(|| host.env(var).filter(|v| !v.is_empty()))
}

fn env_true(host: &dyn Host, var: &str) -> bool {
    host.env(var).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// The program. `args` includes the program name. Returns the exit code.
pub fn run(host: Arc<dyn Host>, gpu: &dyn GpuProbe, args: &[String], io: &mut Io) -> i32 {
    let h = host.as_ref();
    // Read before parsing so a usage error is already in the right language; when parsing
    // succeeds, `--lang` is the same value clap saw, so this is the run's language too.
    let lang_flag = cli::lang_flag(args).or_else(|| h.env(env::GPUM_LANG).and_then(|l| Lang::parse(&l)));
    let lang = detect_lang(h, lang_flag);
    let cli = match cli::parse(args, lang) {
        cli::Parsed::Run(c) => c,
        cli::Parsed::Print(text) => {
            let _ = write!(io.stdout, "{text}");
            return exit::OK;
        }
        cli::Parsed::Fail(f) => return fail(io, &f, lang, false),
    };
    // The test host's knobs (`test-knobs` builds only), read once and passed down.
    let knobs = knobs::Knobs::load(h);
    let json = cli.json;
    let server = flag_or_env(h, cli.server.clone(), env::GPUM_SERVER);
    let ca_file = flag_or_env(h, cli.ca_file.clone(), env::GPUM_CA_FILE).map(PathBuf::from);
    let yes = cli.yes || env_true(h, env::GPUM_YES);
    let allow_downgrade = cli.allow_downgrade || env_true(h, env::GPUM_ALLOW_DOWNGRADE);
    let mut opts = GatherOptions { server: server.clone(), offline: cli.offline, ..Default::default() };
    if let Some(p) = &ca_file {
        match h.read(p) {
            Ok(pem) => opts.extra_roots_pem.push(pem),
            Err(e) => {
                return fail(io, &Failure::Usage(format!("--ca-file {}: {e}", p.display())), lang, json);
            }
        }
    }

    if cli.dry_run {
        // No code is needed, but one given on the command line is checked: a typo found now
        // saves the real run.
        if let Some(c) = &cli.code
            && JoinCode::parse(c).is_err()
        {
            return fail(io, &Failure::BadJoinCode, lang, false);
        }
        let code = cli.code.as_deref().and_then(|c| JoinCode::parse(c).ok());
        let audit = Audit::with_knobs(h, gpu, &opts, lang, &knobs, registration(h, code.as_ref(), false));
        let ready = audit.ready();
        if cli.json {
            let _ = report::JsonReport { checks: &audit.findings, plan: &audit.plan, ready }.write(io.stdout);
        } else {
            let _ = report::write_dry_run(io.stdout, &audit.findings, &audit.plan, ready, lang);
            if !ready {
                let _ = io.stdout.flush();
                return fail(
                    io,
                    &Failure::PreflightFailed(gpum_preflight::failed_ids(&audit.findings)),
                    lang,
                    false,
                );
            }
        }
        return if ready { exit::OK } else { exit::PREFLIGHT };
    }

    // The pre-install gate, in the documented order.
    if h.euid() != 0 {
        return fail(io, &Failure::NotRoot, lang, json);
    }
    if !h.is_dir(Path::new(gpum_preflight::facts::SYSTEMD_RUN_DIR)) {
        return fail(io, &Failure::NoSystemd, lang, json);
    }
    // One install at a time: the lock is held until this process ends (however it ends), and
    // a second copy stops here, before it reads the code or changes anything.
    let _install_lock = match h.try_lock(Path::new(INSTALL_LOCK)) {
        Ok(Ok(lock)) => lock,
        Ok(Err(pid)) => {
            let pid = if pid > 0 { pid.to_string() } else { "?".into() };
            return fail(io, &Failure::InstallRunning(pid), lang, json);
        }
        Err(e) => return fail(io, &Failure::Other(format!("{INSTALL_LOCK}: {e}")), lang, json),
    };
    // An installed agent whose server still exists can be repaired without a code: the same
    // one-liner without its code, or with one the platform no longer accepts.
    let installed = installed_node(h);
    let code = match join_code(h, cli.code.as_deref(), io.stdin) {
        Ok(c) => Some(c),
        Err(Failure::NoJoinCode) if installed.is_some() => None,
        Err(f) => return fail(io, &f, lang, json),
    };
    let repair = code.is_none().then_some(()).and(installed.as_ref());
    let server = match (server, repair) {
        (None, Some(node)) => Some(node.server.clone()),
        (server, _) => server,
    };
    let Some(server) = server else {
        return fail(io, &Failure::Usage("--server is required to install".into()), lang, json);
    };
    let wanted = server.trim_end_matches('/').to_string();
    let same_server = |node: &InstalledNode| node.server == wanted;
    if let Some(node) = repair {
        if !same_server(node) {
            return fail(io, &Failure::Usage(repair_elsewhere(node, &server)), lang, json);
        }
        apply::Reporter { out: &mut *io.stdout, json, lang }
            .note(&text::t(text::Msg::Repairing, lang).replace("{node}", &node.node_id));
    }
    opts.server = Some(server.clone());
    let mut audit =
        Audit::with_knobs(h, gpu, &opts, lang, &knobs, registration(h, code.as_ref(), repair.is_some()));
    if json {
        let mut events = report::Events::new(io.stdout);
        for f in &audit.findings {
            events.check(f);
        }
    } else {
        let _ = report::write_checks(io.stdout, &audit.findings, lang);
    }
    let _ = io.stdout.flush();
    if !audit.ready() {
        return fail(io, &Failure::PreflightFailed(gpum_preflight::failed_ids(&audit.findings)), lang, json);
    }
    let mut probe_registries = cli.probe_registries.clone();
    if probe_registries.is_empty()
        && let Some(v) = h.env(env::GPUM_PROBE_REGISTRIES)
    {
        probe_registries = v.split(',').map(str::trim).filter(|r| !r.is_empty()).map(String::from).collect();
    }
    let probe_registries = (!probe_registries.is_empty()).then_some(probe_registries);
    let mut aopts = apply::Options {
        code: code.as_ref().map(|c| c.to_string()),
        server,
        ca_file,
        yes,
        allow_downgrade,
        probe_registries,
        lang,
    };
    // The first call to the platform, before anything changes: the code is bound to this
    // installation, so that a code seen in a process list is useless to anyone else.
    if aopts.code.is_some() {
        match enroll(h, &aopts) {
            Ok(()) => {}
            // The code expired or was used (the "repair the next day" case): the installed
            // agent keeps its server, and the install repairs the machine in place.
            Err(Failure::JoinCodeRejected) if installed.as_ref().is_some_and(same_server) => {
                let node = installed.as_ref().map(|n| n.node_id.as_str()).unwrap_or_default();
                apply::Reporter { out: &mut *io.stdout, json, lang }
                    .note(&text::t(text::Msg::CodeRefusedRepairing, lang).replace("{node}", node));
                audit.plan.keep_registration(node);
                aopts.code = None;
            }
            Err(f) => return fail(io, &f, lang, json),
        }
    }
    let result = apply::NetFetcher::new(h, &knobs, &aopts).and_then(|fetcher| {
        let mut rep = apply::Reporter { out: &mut *io.stdout, json, lang };
        apply::install(host.clone(), &audit, &fetcher, &knobs, &aopts, &mut rep)
    });
    match result {
        Ok(summary) => {
            if json {
                report::Events::new(io.stdout).finished(&summary);
            } else {
                let _ = apply::write_summary(io.stdout, &summary, lang);
            }
            let _ = io.stdout.flush();
            exit::OK
        }
        Err(f) => fail(io, &f, lang, json),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_support;
