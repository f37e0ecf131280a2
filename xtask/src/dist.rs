//! `cargo xtask dist`: the release, built into `target/dist/` (docs/release.md), which
//! `gpum-platform serve --dist target/dist` serves as it is.
//!
//! - `gpum-install` and `gpum-agent` for `x86_64-unknown-linux-gnu` (they `dlopen` NVML, so they
//!   are glibc binaries), `gpum-platform` static for `x86_64-unknown-linux-musl`; all with the
//!   `release-small` profile (size first, stripped, fat LTO, one codegen unit), `--locked`, and
//!   always with `-p`: a `--workspace` build would unify in the features `tests/` turns on, and
//!   ship the test knobs. A marker string that exists only under `test-knobs` proves they are out.
//! - Reproducible: `SOURCE_DATE_EPOCH` is the last commit's time and every build path is remapped
//!   (`--remap-path-prefix`), so the bytes do not depend on where or when the tree was built.
//!   `--check-reproducible` builds the same tree again in another directory and compares.
//! - Gates that fail the build: the glibc needs ([`crate::elf`]), the size budget, lintian errors.
//! - Man pages and shell completions from the binaries' own clap definitions, in `man/` and
//!   `completions/` (not served: `/dl/` serves plain top-level files only).
//! - `gpum-agent_VERSION-1_amd64.deb` (cargo-deb) with the systemd unit derived from the agent's
//!   own (see [`deb_unit`]), the maintainer scripts of `packaging/deb/gpum-agent/`, the man pages
//!   and completions.
//! - Each artifact signed (`sign.rs`): `manifest.json` + `.sig` (what the installer verifies),
//!   `release.json` + `.sig` (the version, an expiry 30 days out and the manifest's SHA-256: what
//!   an agent verifies before it upgrades to this dist, issue 47),
//!   `FILE.sha256` (what install.sh checks) and `FILE.sig` (for `sqv`/`gpg --verify` by hand).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use sha2::{Digest, Sha256};

use crate::util;

pub const GNU: &str = "x86_64-unknown-linux-gnu";
pub const MUSL: &str = "x86_64-unknown-linux-musl";
/// The Cargo profile of the release (workspace Cargo.toml).
pub const PROFILE: &str = "release-small";
/// Each glibc binary must stay under this (the budget); the platform is not downloaded
/// by every node, so it has none.
pub const SIZE_BUDGET: u64 = 10 * 1024 * 1024;
/// The shipped binaries and their targets.
pub const BINARIES: [(&str, &str); 3] = [("gpum-install", GNU), ("gpum-agent", GNU), ("gpum-platform", MUSL)];
/// A string each binary holds only when built with a test-only feature: its `test-knobs` (a serde
/// field or a clap flag of a test knob), and for what links gpum-enroll its `test-next-version`
/// (the marker in `gpum_enroll::USER_AGENT`: the agent would report a version that is not the
/// release's). Finding one in a release binary fails the build.
const KNOB_MARKERS: [(&str, &str); 5] = [
    ("gpum-install", "crash_at"),
    ("gpum-install", "(test-next-version)"),
    ("gpum-agent", "test_reconcile_min_age_secs"),
    ("gpum-agent", "(test-next-version)"),
    ("gpum-platform", "test-clock-file"),
];
/// The packages built by cargo-deb.
pub const DEBS: [&str; 1] = ["gpum-agent"];
/// Marks a directory `dist` made, so that `--out` never empties a directory it did not make.
const MARKER: &str = ".gpum-dist";
/// The public key of what signed the release, beside the artifacts (hidden: not served).
pub const SIGNER: &str = ".signer.asc";

#[derive(Args)]
pub struct DistArgs {
    /// The secret release key (`cargo xtask release-key`). Without it, a development key kept in
    /// TARGET/dist-dev-key/ signs (made on first use).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Build the tree again in another directory and fail unless every binary is identical.
    #[arg(long)]
    pub check_reproducible: bool,
    /// Skip the .deb packages (and lintian).
    #[arg(long)]
    pub no_deb: bool,
    /// Output directory (default: TARGET/dist).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also build the agent whose instructions `bench/cost.rs` counts ([`build_measured_agent`]),
    /// before the glibc release build and beside the platform's (`cargo xtask test`).
    #[arg(skip)]
    pub measured_agent: bool,
}

/// Time spent per step, printed at the end.
struct Clock(Vec<(String, f64)>, Instant);

impl Clock {
    fn lap(&mut self, what: &str) {
        self.0.push((what.into(), self.1.elapsed().as_secs_f64()));
        self.1 = Instant::now();
    }
}

/// Returns the measured agent's path when `a.measured_agent` asked for it.
pub fn run(a: DistArgs) -> Result<Option<PathBuf>> {
    let mut clock = Clock(Vec::new(), Instant::now());
    let root = fs::canonicalize(util::workspace_root())?;
    let target = std::path::absolute(util::target_dir())?;
    let out = std::path::absolute(a.out.clone().unwrap_or_else(|| target.join("dist")))?;
    let epoch = source_date_epoch(&root)?;
    let version = env!("CARGO_PKG_VERSION");

    // Without `--key`, the development key signs, and the installer built here trusts it (and
    // only it): the one-liner of a platform serving this dist installs what it serves.
    let cert = signing_cert(a.key.as_deref(), &target)?;
    let trust = if a.key.is_none() { Some(dev_trust(&cert)?) } else { None };
    // `cargo xtask test` has the measured agent built first on the glibc side (it shares every
    // dependency with the release, which then compiles only its own crates again), while the
    // platform builds beside it.
    let measured = std::cell::RefCell::new(None);
    let build_measured = || -> Result<()> {
        *measured.borrow_mut() = Some(build_measured_agent_trusting(trust.as_ref())?);
        Ok(())
    };
    let before_gnu: Option<&dyn Fn() -> Result<()>> =
        if a.measured_agent { Some(&build_measured) } else { None };
    let built = build_trusting(&root, &target, &epoch, trust.as_ref(), before_gnu)?;
    clock.lap(if a.measured_agent { "build (and the measured agent)" } else { "build" });
    for (name, path) in &built {
        gate(name, path)?;
    }
    fresh_dir(&out)?;
    let mut artifacts = Vec::new();
    for (name, path) in &built {
        let dest = out.join(name);
        fs::copy(path, &dest).with_context(|| format!("copying {}", path.display()))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
        artifacts.push(dest);
    }
    print_sizes(&artifacts)?;

    let assets = target.join(GNU).join(PROFILE).join("deb-assets");
    write_docs(&out, &assets)?;
    clock.lap("gates, man pages, completions");

    if !a.no_deb {
        for pkg in DEBS {
            let deb = cargo_deb(&root, &target, &epoch, pkg, &out)?;
            lintian(&deb)?;
            artifacts.push(deb);
        }
        clock.lap("cargo-deb, lintian");
    }

    let expires = crate::sign::expires_in_days(crate::sign::DEFAULT_EXPIRES_DAYS);
    crate::sign::sign_with(&cert, version, expires, &artifacts)?;
    fs::write(out.join(SIGNER), openpgp_armored(&cert)?)?;
    clock.lap("sign");

    // A release (signed with its real key) is always checked; CI's throwaway build is not
    // (docs/release.md, "Reproducible").
    if a.check_reproducible || a.key.is_some() {
        check_reproducible(&root, &target, &epoch, &built, trust.as_ref())?;
        clock.lap("reproducibility build");
    }
    println!("dist: {} ready; served as is by `gpum-platform serve --dist {}`", out.display(), out.display());
    for (what, s) in &clock.0 {
        println!("  {what:<32} {s:>7.1} s");
    }
    Ok(measured.into_inner())
}

/// The last commit's time, so that two builds of one commit agree (an override in the
/// environment wins, for trees without git).
pub(crate) fn source_date_epoch(root: &Path) -> Result<String> {
    if let Ok(e) = std::env::var("SOURCE_DATE_EPOCH") {
        return Ok(e);
    }
    let o = Command::new("git")
        .args(["log", "-1", "--format=%ct"])
        .current_dir(root)
        .output()
        .context("running git log")?;
    let e = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() || e.is_empty() || !e.bytes().all(|b| b.is_ascii_digit()) {
        bail!("no commit time from git log (set SOURCE_DATE_EPOCH): {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(e)
}

/// The rustc flags that take the build's location out of the binaries.
fn rustflags(root: &Path, target: &Path) -> String {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    let mut flags = vec![
        format!("--remap-path-prefix={}=/gpum", root.display()),
        format!("--remap-path-prefix={}=/cargo", cargo_home.display()),
    ];
    // Build scripts' outputs (OUT_DIR) are under the target directory. Inside the tree the
    // first mapping covers it; elsewhere it needs its own (the last matching one wins).
    if !target.starts_with(root) {
        flags.push(format!("--remap-path-prefix={}=/gpum/target", target.display()));
    }
    flags.join("\x1f")
}

/// The release build's cargo command for the tree at `root`, into `target`: the profile, the
/// path remapping and the timestamp that make it reproducible.
fn release_cargo(root: &Path, target: &Path, epoch: &str) -> Command {
    let mut c = cargo_cmd();
    c.args(["build", "--locked", "--profile", PROFILE])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", target)
        .env("SOURCE_DATE_EPOCH", epoch)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags(root, target))
        .env_remove("RUSTFLAGS")
        .env("CC_x86_64_unknown_linux_musl", "musl-gcc");
    c
}

/// The glibc packages, built together so that they share one feature resolution (and so does
/// [`build_measured_agent`]).
const GNU_PACKAGES: [&str; 4] = ["-p", "gpum-install", "-p", "gpum-agent"];

/// Builds the three binaries of the tree at `root` into `target`; returns (name, path).
pub(crate) fn build(root: &Path, target: &Path, epoch: &str) -> Result<Vec<(String, PathBuf)>> {
    build_trusting(root, target, epoch, None, None)
}

/// The release key a dist built without `--key` compiles into its installer: the development
/// key's public part (armored) and primary fingerprint (`gpum_repo_keys::release`).
fn dev_trust(cert: &sequoia_openpgp::Cert) -> Result<(String, String)> {
    let armor = String::from_utf8(openpgp_armored(cert)?).context("the armored key is text")?;
    Ok((armor, cert.fingerprint().to_hex()))
}

/// [`build`], the installer trusting `trust` (armored key, fingerprint) instead of the committed
/// release key when given.
fn build_trusting(
    root: &Path,
    target: &Path,
    epoch: &str,
    trust: Option<&(String, String)>,
    before_gnu: Option<&dyn Fn() -> Result<()>>,
) -> Result<Vec<(String, PathBuf)>> {
    ensure_musl_target()?;
    // The static platform builds in a target directory of its own, beside the glibc builds:
    // two builds of one target directory wait for each other's lock, and each build ends in a
    // fat-LTO link that one core does alone, so side by side the two links overlap (on CI's
    // two cores this is minutes of the budget). Only the build scripts and proc macros, built
    // for the host in each directory, compile twice.
    let musl_dir = musl_target_dir(target);
    let mut musl = release_cargo(root, &musl_dir, epoch);
    musl.args(["--target", MUSL, "-p", "gpum-platform"]);
    let musl = spawn_cmd(musl)?;
    let gnu = (|| {
        if let Some(before) = before_gnu {
            before()?;
        }
        let mut gnu = release_cargo(root, target, epoch);
        gnu.args(["--target", GNU]).args(GNU_PACKAGES);
        if let Some((armor, fpr)) = trust {
            gnu.env("GPUM_DIST_RELEASE_KEY_ASC", armor).env("GPUM_DIST_RELEASE_FINGERPRINT", fpr);
        }
        run_cmd(gnu)
    })();
    let musl = musl.wait();
    gnu?;
    musl?;
    Ok(BINARIES
        .iter()
        .map(|(n, t)| {
            let dir = if *t == MUSL { &musl_dir } else { target };
            (n.to_string(), dir.join(t).join(PROFILE).join(n))
        })
        .collect())
}

/// Where the static platform is built: `TARGET/musl` (see [`build_trusting`]).
pub fn musl_target_dir(target: &Path) -> PathBuf {
    target.join("musl")
}

/// The agent whose instructions per heartbeat `bench/cost.rs` counts: the shipped build (the
/// same profile, flags, target directory and packages as [`build`], so every dependency is the
/// one the release compiles, and only the agent's own crates compile again) with
/// `test-knobs`, for the Docker test scope that keeps it to its own run's containers, and its
/// symbol table kept, for callgrind's names. Copied out to TARGET/agent-cost/gpum-agent.
/// `cargo xtask test` builds it before the release, so that the target directory ends with
/// the shipped agent (the release's knob gate would refuse this one).
pub fn build_measured_agent() -> Result<PathBuf> {
    build_measured_agent_trusting(None)
}

/// [`build_measured_agent`] with `trust` (armored key, fingerprint) compiled in as the release
/// key, as [`build_trusting`]'s glibc build has it: then gpum-repo-keys is the same unit in both
/// builds, and only the crates the test knobs change compile again for the release.
fn build_measured_agent_trusting(trust: Option<&(String, String)>) -> Result<PathBuf> {
    let root = fs::canonicalize(util::workspace_root())?;
    let target = std::path::absolute(util::target_dir())?;
    let epoch = source_date_epoch(&root)?;
    let mut c = release_cargo(&root, &target, &epoch);
    c.args(["--target", GNU])
        .args(GNU_PACKAGES)
        .args(["--bin", "gpum-agent", "--features", "gpum-agent/test-knobs"])
        // The agent's own override strips (Cargo.toml): its symbol table is kept here. Only the
        // agent's package: the profile's `strip` would make every dependency a unit of its own.
        .arg("--config")
        .arg(format!("profile.{PROFILE}.package.gpum-agent.strip=\"none\""));
    if let Some((armor, fpr)) = trust {
        c.env("GPUM_DIST_RELEASE_KEY_ASC", armor).env("GPUM_DIST_RELEASE_FINGERPRINT", fpr);
    }
    run_cmd(c)?;
    let dest = crate::bench::cost::agent_cost_bin();
    fs::create_dir_all(dest.parent().expect("a parent"))?;
    fs::copy(target.join(GNU).join(PROFILE).join("gpum-agent"), &dest)
        .with_context(|| format!("copying the measured agent to {}", dest.display()))?;
    Ok(dest)
}

/// The installer as [`build`] ships it (the same profile, flags, target directory and packages,
/// without `test-knobs`), for `bench dryrun`. Its symbol table is kept, as
/// [`build_measured_agent`] keeps the agent's (its package's `strip` alone, so every dependency
/// is the release's own), and the symbol table is no part of what the loader maps. Copied out
/// to TARGET/dryrun/gpum-install.
pub fn build_shipped_installer() -> Result<PathBuf> {
    let root = fs::canonicalize(util::workspace_root())?;
    let target = std::path::absolute(util::target_dir())?;
    let epoch = source_date_epoch(&root)?;
    let mut c = release_cargo(&root, &target, &epoch);
    c.args(["--target", GNU])
        .args(GNU_PACKAGES)
        .args(["--bin", "gpum-install"])
        .arg("--config")
        .arg(format!("profile.{PROFILE}.package.gpum-install.strip=\"none\""));
    run_cmd(c)?;
    let dest = util::target_dir().join("dryrun/gpum-install");
    fs::create_dir_all(dest.parent().expect("a parent"))?;
    fs::copy(target.join(GNU).join(PROFILE).join("gpum-install"), &dest)
        .with_context(|| format!("copying the installer to {}", dest.display()))?;
    Ok(dest)
}

fn cargo_cmd() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn run_cmd(c: Command) -> Result<()> {
    spawn_cmd(c)?.wait()
}

/// A command started and not yet waited for (see [`spawn_cmd`]).
struct Running {
    child: std::process::Child,
    show: String,
}

impl Running {
    fn wait(mut self) -> Result<()> {
        let st = self.child.wait().with_context(|| format!("waiting for {}", self.show))?;
        if !st.success() {
            bail!("{} failed: {st}", self.show);
        }
        Ok(())
    }
}

/// Starts `c`, printing it; [`Running::wait`] waits for it and fails unless it succeeded.
fn spawn_cmd(mut c: Command) -> Result<Running> {
    let show = format!(
        "{} {}",
        c.get_program().to_string_lossy(),
        c.get_args().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    );
    eprintln!("xtask: {show}");
    let child = c.spawn().with_context(|| format!("running {show}"))?;
    Ok(Running { child, show })
}

/// The musl standard library comes from rustup; `musl-gcc` (musl-tools) compiles the C parts.
fn ensure_musl_target() -> Result<()> {
    let o = Command::new("rustup").args(["target", "list", "--installed"]).output();
    let installed =
        o.map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == MUSL)).unwrap_or(false);
    if !installed {
        let mut c = Command::new("rustup");
        c.args(["target", "add", MUSL]);
        run_cmd(c)?;
    }
    if Command::new("musl-gcc").arg("--version").output().is_err() {
        bail!("musl-gcc is missing: apt-get install musl-tools (tests/setup-deps.sh does)");
    }
    Ok(())
}

/// The gates each built binary must pass before anything is published.
fn gate(name: &str, path: &Path) -> Result<()> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let static_ = BINARIES.iter().any(|(n, t)| *n == name && *t == MUSL);
    crate::elf::check(name, &data, static_)?;
    if let Some((_, marker)) = KNOB_MARKERS.iter().find(|(n, m)| *n == name && contains(&data, m.as_bytes()))
    {
        bail!(
            "{name} holds {marker:?}: it was built with a test-only feature (test-knobs, test-next-version)"
        );
    }
    if !static_ && data.len() as u64 >= SIZE_BUDGET {
        bail!("{name} is {} bytes, over the budget of {SIZE_BUDGET}", data.len());
    }
    Ok(())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn print_sizes(files: &[PathBuf]) -> Result<()> {
    println!("{:<16} {:>10} {:>9} budget", "binary", "bytes", "MiB");
    for f in files {
        let len = fs::metadata(f)?.len();
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        let budget = if BINARIES.iter().any(|(n, t)| *n == name && *t == GNU) { "< 10 MiB" } else { "-" };
        println!("{name:<16} {len:>10} {:>9.2} {budget}", len as f64 / (1024.0 * 1024.0));
    }
    Ok(())
}

/// Empties `out` (only if `dist` made it) and marks it as `dist`'s.
fn fresh_dir(out: &Path) -> Result<()> {
    if out.exists() {
        let empty = fs::read_dir(out)?.next().is_none();
        if !empty && !out.join(MARKER).exists() {
            bail!(
                "{} is not empty and was not made by cargo xtask dist; choose another --out",
                out.display()
            );
        }
        fs::remove_dir_all(out).with_context(|| format!("emptying {}", out.display()))?;
    }
    fs::create_dir_all(out)?;
    fs::write(out.join(MARKER), "made by cargo xtask dist; emptied by the next run\n")?;
    Ok(())
}

/// The clap definitions of the three binaries.
fn commands() -> [(&'static str, clap::Command); 3] {
    [
        ("gpum-install", gpum_install::cli::command()),
        ("gpum-agent", gpum_agent::cli::command()),
        ("gpum-platform", gpum_platform::cli::command()),
    ]
}

/// Man pages (a page per command and subcommand) and bash, zsh and fish completions, into
/// `out/man/man1` and `out/completions/SHELL/`, and for the .deb into `assets` (pages gzipped
/// without name or time, as Debian wants and reproducibly).
fn write_docs(out: &Path, assets: &Path) -> Result<()> {
    use clap_complete::Shell;
    let man = out.join("man/man1");
    fs::create_dir_all(&man)?;
    let _ = fs::remove_dir_all(assets);
    fs::create_dir_all(assets.join("man"))?;
    for (name, cmd) in commands() {
        clap_mangen::generate_to(cmd.clone(), &man).with_context(|| format!("man pages of {name}"))?;
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let dir = out.join("completions").join(shell.to_string());
            fs::create_dir_all(&dir)?;
            let mut c = cmd.clone();
            clap_complete::generate_to(shell, &mut c, name, &dir)
                .with_context(|| format!("{shell} completion of {name}"))?;
            fs::copy(dir.join(completion_file(shell, name)), assets.join(completion_file(shell, name)))?;
        }
    }
    for page in fs::read_dir(&man)? {
        let page = page?.path();
        let gz =
            assets.join("man").join(format!("{}.gz", page.file_name().unwrap_or_default().to_string_lossy()));
        let o = Command::new("gzip").args(["-9", "-n", "-c"]).arg(&page).output().context("running gzip")?;
        if !o.status.success() {
            bail!("gzip {}: {}", page.display(), String::from_utf8_lossy(&o.stderr));
        }
        fs::write(gz, o.stdout)?;
    }
    fs::write(assets.join("gpum-agent.service"), deb_unit(gpum_enroll::unit::UNIT)?)?;
    Ok(())
}

/// The file name `clap_complete::generate_to` gives each shell's completion.
fn completion_file(shell: clap_complete::Shell, name: &str) -> String {
    use clap_complete::Shell;
    match shell {
        Shell::Zsh => format!("_{name}"),
        Shell::Fish => format!("{name}.fish"),
        _ => format!("{name}.bash"),
    }
}

/// The packaged unit, derived from the one the installer writes (its restart contract and
/// hardening stay one text): the binary is in /usr/bin rather than /opt/gpum-agent, the
/// documentation is the man page, and the service does not start until `gpum-agent register`
/// has written the configuration. Fails when the unit no longer has a line this edits, so the
/// two cannot drift apart silently.
pub fn deb_unit(unit: &str) -> Result<String> {
    let edits: [(&str, Option<&str>); 4] = [
        ("ExecStart=/opt/gpum-agent/gpum-agent run", Some("ExecStart=/usr/bin/gpum-agent run")),
        // A packaged agent is upgraded by the package manager, never in place (issue 47).
        (
            "ReadWritePaths=/var/lib/gpum-agent /etc/gpum-agent /opt/gpum-agent",
            Some("ReadWritePaths=/var/lib/gpum-agent /etc/gpum-agent"),
        ),
        (
            "Documentation=file:///opt/gpum-agent/README",
            Some("Documentation=man:gpum-agent(1)\nConditionPathExists=/etc/gpum-agent/config.toml"),
        ),
        (
            "# /etc/systemd/system/gpum-agent.service.",
            Some(
                "# /etc/systemd/system/gpum-agent.service; packaged in the .deb as\n# /lib/systemd/system/gpum-agent.service, starting only once configured.",
            ),
        ),
    ];
    let mut lines: Vec<String> = Vec::new();
    let mut used = [false; 4];
    for line in unit.lines() {
        match edits.iter().position(|(from, _)| line == *from) {
            Some(i) => {
                used[i] = true;
                if let Some(to) = edits[i].1 {
                    lines.push(to.to_string());
                }
            }
            None => lines.push(line.to_string()),
        }
    }
    if let Some(i) = used.iter().position(|u| !u) {
        bail!("the agent's unit has no line {:?}: update dist::deb_unit", edits[i].0);
    }
    let text = lines.join("\n") + "\n";
    if text.contains("/opt/gpum-agent") {
        bail!("the packaged unit still names /opt/gpum-agent: update dist::deb_unit");
    }
    Ok(text)
}

/// `cargo deb` for `pkg`, from the binaries already built (`--no-build`, not stripped again),
/// with the assets `write_docs` made; returns the .deb's path.
fn cargo_deb(root: &Path, target: &Path, epoch: &str, pkg: &str, out: &Path) -> Result<PathBuf> {
    let version = format!("{}-1", env!("CARGO_PKG_VERSION"));
    let deb = out.join(format!("{pkg}_{version}_amd64.deb"));
    let mut c = cargo_cmd();
    c.args(["deb", "--locked", "--no-build", "--no-strip", "-p", pkg, "--profile", PROFILE, "--target", GNU])
        .arg("--deb-revision")
        .arg("1")
        .arg("--output")
        .arg(&deb)
        .current_dir(root)
        .env("CARGO_TARGET_DIR", target)
        .env("SOURCE_DATE_EPOCH", epoch);
    run_cmd(c).context("cargo-deb (cargo install cargo-deb --locked; tests/setup-deps.sh does)")?;
    if !deb.is_file() {
        bail!("cargo deb wrote no {}", deb.display());
    }
    Ok(deb)
}

/// lintian, failing on errors; warnings are printed.
pub fn lintian(deb: &Path) -> Result<()> {
    let o = Command::new("lintian")
        .args(["--fail-on", "error", "--tag-display-limit", "0"])
        .arg(deb)
        .output()
        .context("running lintian (apt-get install lintian; tests/setup-deps.sh does)")?;
    let text = String::from_utf8_lossy(&o.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&o.stderr));
    let errors = text.lines().filter(|l| l.starts_with("E: ")).count();
    if !o.status.success() || errors > 0 {
        bail!("lintian: {} has {errors} error(s)", deb.display());
    }
    println!(
        "lintian: {}: no errors, {} warning(s)",
        deb.display(),
        text.lines().filter(|l| l.starts_with("W: ")).count()
    );
    Ok(())
}

/// The certificate that signs: `--key`, else the development key in TARGET/dist-dev-key/.
fn signing_cert(key: Option<&Path>, target: &Path) -> Result<sequoia_openpgp::Cert> {
    let path = match key {
        Some(k) => k.to_path_buf(),
        None => {
            let dir = target.join("dist-dev-key");
            let k = dir.join("gpum-release.key");
            if !k.exists() {
                fs::create_dir_all(&dir)?;
                let (secret, public) =
                    crate::sign::generate("gpum development release key (cargo xtask dist)")?;
                crate::sign::write_new(&k, &secret, 0o600)?;
                fs::write(dir.join("gpum-release.asc"), openpgp_armored(&public)?)?;
            }
            eprintln!("dist: no --key: signing with the development key {}", k.display());
            k
        }
    };
    crate::sign::secret_cert(&fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
}

/// The armored public certificate.
fn openpgp_armored(cert: &sequoia_openpgp::Cert) -> Result<Vec<u8>> {
    use sequoia_openpgp::serialize::SerializeInto;
    cert.clone().strip_secret_key_material().armored().to_vec()
}

/// Copies the tree (tracked files, and new ones git does not ignore, as they are on disk) to
/// TARGET/dist-repro/src, builds it there with TARGET/dist-repro/src/target, and compares each
/// binary's SHA-256 with the first build's. The copy's target directory is kept between runs
/// (the dependencies then need no rebuild); the sources are replaced.
fn check_reproducible(
    root: &Path,
    target: &Path,
    epoch: &str,
    built: &[(String, PathBuf)],
    trust: Option<&(String, String)>,
) -> Result<()> {
    let copy = target.join("dist-repro/src");
    if copy.exists() {
        for e in fs::read_dir(&copy)? {
            let p = e?.path();
            if p.file_name() != Some("target".as_ref()) {
                if p.is_dir() && !p.is_symlink() { fs::remove_dir_all(&p)? } else { fs::remove_file(&p)? }
            }
        }
    }
    let o = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .context("git ls-files")?;
    if !o.status.success() {
        bail!("git ls-files: {}", String::from_utf8_lossy(&o.stderr));
    }
    for rel in o.stdout.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let rel = Path::new(std::str::from_utf8(rel).context("a file name that is not UTF-8")?);
        let (from, to) = (root.join(rel), copy.join(rel));
        let Ok(meta) = fs::symlink_metadata(&from) else { continue }; // deleted, not yet committed
        fs::create_dir_all(to.parent().expect("a file has a parent"))?;
        if meta.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
        } else {
            fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    let again = build_trusting(&copy, &copy.join("target"), epoch, trust, None)?;
    let mut differ = Vec::new();
    println!("{:<16} {:<64} same", "binary", "sha256");
    for ((name, a), (_, b)) in built.iter().zip(&again) {
        let (ha, hb) = (sha256(a)?, sha256(b)?);
        println!("{name:<16} {ha:<64} {}", if ha == hb { "yes" } else { "NO" });
        if ha != hb {
            differ.push(format!("{name}: {ha} ({}) vs {hb} ({})", a.display(), b.display()));
        }
    }
    if !differ.is_empty() {
        bail!("not reproducible: a build in another directory differs:\n  {}", differ.join("\n  "));
    }
    println!("reproducible: a second build in {} gave identical binaries", copy.display());
    Ok(())
}

fn sha256(p: &Path) -> Result<String> {
    Ok(hex::encode(Sha256::digest(fs::read(p).with_context(|| format!("reading {}", p.display()))?)))
}

/// The dist directory the tests check: `GPUM_DIST_DIR`, set by `cargo xtask test` after its
/// dist step. Those tests are marked `#[ignore = "needs cargo xtask dist's output"]`, and
/// `cargo xtask test` runs them (`--run-ignored`): a missing build fails them.
#[cfg(test)]
pub fn require_dist(test: &str) -> PathBuf {
    match std::env::var_os("GPUM_DIST_DIR").map(PathBuf::from) {
        Some(d) if d.join(MARKER).exists() => d,
        Some(d) => panic!("{test}: GPUM_DIST_DIR={} holds no cargo xtask dist output", d.display()),
        None => panic!("{test}: GPUM_DIST_DIR is not set (cargo xtask test sets it after its dist step)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packaged unit keeps the installer's unit, moves the binary to /usr/bin, and waits for
    /// the configuration; a unit without the lines it edits is refused.
    #[test]
    fn deb_unit_is_the_agents_unit_waiting_for_its_config() {
        let unit = gpum_enroll::unit::UNIT;
        let deb = deb_unit(unit).unwrap();
        let value = |t: &str, key: &str| -> Vec<String> {
            t.lines()
                .filter_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
                .map(String::from)
                .collect()
        };
        assert_eq!(value(&deb, "ExecStart"), ["/usr/bin/gpum-agent run"]);
        assert_eq!(value(&deb, "ConditionPathExists"), [gpum_common::agent_state::DEFAULT_CONFIG]);
        assert!(!deb.contains("/opt/gpum-agent"));
        for key in ["Restart", "RestartPreventExitStatus", "ProtectSystem", "StateDirectory", "WantedBy"] {
            assert_eq!(value(&deb, key), value(unit, key), "{key}");
        }
        assert_eq!(value(&deb, "ReadWritePaths"), ["/var/lib/gpum-agent /etc/gpum-agent"]);
        assert!(deb_unit(&unit.replace("/etc/gpum-agent /opt/gpum-agent\n", "/etc/gpum-agent\n")).is_err());
    }

    /// Every binary has a man page and three completions, generated from its clap definition.
    #[test]
    fn docs_cover_every_binary() {
        let dir = std::env::temp_dir().join(format!("gpum-xtask-docs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        write_docs(&dir.join("out"), &dir.join("assets")).unwrap();
        for (name, _) in BINARIES {
            let page = fs::read_to_string(dir.join(format!("out/man/man1/{name}.1"))).unwrap();
            assert!(page.contains(".TH ") && page.contains(name), "{name}");
            for f in [format!("bash/{name}.bash"), format!("zsh/_{name}"), format!("fish/{name}.fish")] {
                let c = fs::read_to_string(dir.join("out/completions").join(&f)).unwrap();
                assert!(c.contains(name), "{f}");
            }
            assert!(dir.join(format!("assets/man/{name}.1.gz")).is_file());
        }
        // Subcommands have their own pages; test-only flags have none.
        assert!(dir.join("out/man/man1/gpum-agent-register.1").is_file());
        let platform = fs::read_to_string(dir.join("out/man/man1/gpum-platform-serve.1")).unwrap();
        assert!(platform.contains("dist") && !platform.contains("test\\-clock"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_remap_the_tree_and_a_target_outside_it() {
        let f = rustflags(Path::new("/src/gpum"), Path::new("/src/gpum/target"));
        assert!(f.split('\x1f').any(|x| x == "--remap-path-prefix=/src/gpum=/gpum"));
        assert_eq!(f.split('\x1f').count(), 2);
        let f = rustflags(Path::new("/src/gpum"), Path::new("/elsewhere/t"));
        assert_eq!(f.split('\x1f').next_back(), Some("--remap-path-prefix=/elsewhere/t=/gpum/target"));
    }

    #[test]
    fn out_dir_is_emptied_only_when_dist_made_it() {
        let dir = std::env::temp_dir().join(format!("gpum-xtask-out-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("precious"), b"x").unwrap();
        assert!(fresh_dir(&dir).is_err());
        assert!(dir.join("precious").exists());
        fs::remove_file(dir.join("precious")).unwrap();
        fresh_dir(&dir).unwrap();
        fs::write(dir.join("old"), b"x").unwrap();
        fresh_dir(&dir).unwrap();
        assert!(!dir.join("old").exists() && dir.join(MARKER).exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
