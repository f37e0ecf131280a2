//! Project automation, run as `cargo xtask <command>`.
//!
//! - `test`: what CI runs: installs what the tests need (`tests/setup-deps.sh`), `cargo fmt
//!   --check`, `clippy -D warnings`, the binaries the end-to-end suites drive, the release
//!   (`dist`, whose output the suites then check; the second, reproducibility build is the
//!   release command's own, `dist --check-reproducible`, docs/release.md), the whole suite under
//!   nextest (then the tests marked `#[ignore = "needs …"]`, which need root, an engine, a
//!   browser, valgrind or the release, and the agent alone without `test-knobs`), and the test
//!   host scenarios (`e2e`), which run in the background from after the debug builds to the end.
//! - `bench`: the benchmarks (see `bench/`), printed as medians and ratios.
//! - `dist`: the release artifacts in `target/dist/` (see `dist.rs`, docs/release.md).
//! - `release-key`, `sign`: development release keys and artifact signatures.
//! - `e2e`: the test host scenarios (see `e2e.rs`).
//! - `docs`: the generated parts of the docs (see `docs.rs`).
#![allow(clippy::disallowed_methods)]

mod bench;
mod dist;
mod docs;
mod e2e;
mod elf;
mod sign;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gpum project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what the tests need, fmt --check, clippy -D warnings, every suite, then the test
    /// host scenarios (what CI runs).
    Test {
        /// Do not run tests/setup-deps.sh (apt, pip, starting Docker).
        #[arg(long)]
        no_setup: bool,
        /// Skip the test host scenarios (`cargo xtask e2e`).
        #[arg(long)]
        no_e2e: bool,
        /// Skip the release build (`cargo xtask dist`) and its checks.
        #[arg(long)]
        no_dist: bool,
        /// Extra arguments passed to `cargo nextest run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run benchmarks: agent, dryrun, instructions (the agent's instruction count alone), platform,
    /// onenode (one node's reads on 100,000 nodes against 10),
    /// sizes, verify, tunnel (needs Docker), or all (all but instructions, which agent includes).
    Bench {
        #[arg(default_value = "all")]
        which: String,
        /// Shorter runs, for a quick look.
        #[arg(long)]
        quick: bool,
        /// Print the summary table as JSON on stdout (details go to stderr).
        #[arg(long)]
        json: bool,
        /// The platform bench's database: sqlite (HTTP and TLS against the baseline), or
        /// postgres (a private PostgreSQL cluster, one and two replicas, against SQLite).
        #[arg(long, default_value = "sqlite", value_parser = ["sqlite", "postgres"])]
        db: String,
        /// The tunnel bench over a delayed path: this added round trip (ms) between the agent and
        /// the relay, and between the reference client and the container (a user-space delay line).
        #[arg(long)]
        delay_ms: Option<u64>,
        /// With `--delay-ms`: the delayed path's rate per direction and connection (Mbit/s).
        #[arg(long, requires = "delay_ms")]
        rate_mbit: Option<f64>,
    },
    /// Build the release into target/dist/: binaries, .debs, man pages, completions, signatures.
    Dist(dist::DistArgs),
    /// Make a development release signing key (kept outside the repository).
    ReleaseKey(sign::ReleaseKeyArgs),
    /// Sign a release: DIR/manifest.json + .sig, DIR/release.json + .sig, FILE.sha256 beside each FILE.
    Sign(sign::SignArgs),
    /// The test host scenarios (docs/testhost.md): all, or those named.
    E2e {
        names: Vec<String>,
        /// Scenarios run side by side (default 3).
        #[arg(long)]
        jobs: Option<usize>,
    },
    /// Write the generated parts of the docs (the owner's guides' exit-code tables).
    Docs {
        /// Change nothing; fail when a guide is out of date.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Test { no_setup, no_e2e, no_dist, args } => test(no_setup, no_e2e, no_dist, &args),
        Cmd::Dist(a) => dist::run(a).map(drop),
        Cmd::Bench { which, quick, json, db, delay_ms, rate_mbit } => {
            bench::run(&which, quick, json, &db, bench::Delay { ms: delay_ms, rate_mbit })
        }
        Cmd::ReleaseKey(a) => sign::release_key(a),
        Cmd::Sign(a) => sign::sign(a),
        Cmd::E2e { names, jobs } => e2e::run(&names, jobs),
        Cmd::Docs { check } => docs::run(check),
    }
}

/// The test-only features the suites need (the agent's come through `tests/Cargo.toml`).
pub const TEST_FEATURES: &str = "gpum-platform/test-knobs";

/// The debug build the suites and the scenarios drive: every binary and example, with the
/// platform's test clock (a `test-knobs` feature that release builds lack).
/// Every test of the workspace with the test knobs, those that need something of the machine
/// included (`#[ignore = "needs …"]`), none stopping the run.
const NEXTEST_ALL: &[&str] = &[
    "nextest",
    "run",
    "--workspace",
    "--locked",
    "--no-fail-fast",
    "--features",
    TEST_FEATURES,
    "--run-ignored",
    "all",
];

pub const DEBUG_BUILD: &[&str] =
    &["build", "--workspace", "--bins", "--examples", "--locked", "--features", TEST_FEATURES];

/// Each step of `cargo xtask test`, timed; a failed step does not stop the ones after it (one
/// run shows everything), but the run's status reports it.
struct Steps {
    done: Vec<(&'static str, f64, bool)>,
    failed: Option<anyhow::Error>,
    began: std::time::Instant,
}

impl Steps {
    fn new() -> Self {
        Self { done: Vec::new(), failed: None, began: std::time::Instant::now() }
    }

    fn run<T>(&mut self, name: &'static str, f: impl FnOnce() -> Result<T>) -> Option<T> {
        let started = std::time::Instant::now();
        let r = f();
        self.done.push((name, started.elapsed().as_secs_f64(), r.is_ok()));
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("xtask: {name}: {e:#}");
                self.failed.get_or_insert(e);
                None
            }
        }
    }

    /// The table of steps and their times, then the first failure, if any.
    fn finish(self) -> Result<()> {
        eprintln!("xtask: steps");
        let total: f64 = self.done.iter().map(|d| d.1).sum();
        for (name, secs, ok) in &self.done {
            eprintln!("  {:>6.0} s  {}  {name}", secs, if *ok { "ok    " } else { "FAILED" });
        }
        eprintln!("  {total:>6.0} s  the steps' sum (what ran in the background overlaps them)");
        eprintln!("  {:>6.0} s  from the first step to the last", self.began.elapsed().as_secs_f64());
        self.failed.map_or(Ok(()), Err)
    }
}

fn test(no_setup: bool, no_e2e: bool, no_dist: bool, extra: &[String]) -> Result<()> {
    use util::{cargo, cargo_linted};
    let mut steps = Steps::new();
    // What the tests need (tests/setup-deps.sh: apt, cargo-deb, the musl target, pip) installs
    // beside fmt and the debug builds, which need none of it (the xtask build before them
    // compiled the same crates without it): on a fresh machine its downloads and unpacking
    // overlap the compiler instead of delaying it (the CI budget). It is waited for before the
    // release, the first step that needs it.
    let setup = if no_setup { None } else { Some(Background::setup()) };
    steps.run("fmt", || cargo(&["fmt", "--all", "--check"]));
    // Lints (`cargo clippy --all-targets -- -D warnings`): every debug build below compiles the
    // workspace's crates through clippy's driver (util::lint_env), so each build is also the
    // lint of what it compiles, and a warning fails it. Between them they cover every target:
    // the binaries and examples here, the tests in the suites' builds, the crates without their
    // test knobs in the agent's feature-off run and this first build, the platform as released
    // (built before the workspace build puts the test one back in target/debug).
    steps.run("lint + build: the platform without test-knobs", || {
        cargo_linted(&["build", "--locked", "-p", "gpum-platform", "--lib", "--bins"], &[])
    });
    steps.run("lint + build: debug, the workspace with test knobs", || cargo_linted(DEBUG_BUILD, &[]));
    if let Some(setup) = setup
        && steps.run("setup (tests/setup-deps.sh): what was left of it", || setup.finish()).is_none()
    {
        return steps.finish();
    }
    // The release, built once; the suites then check what was built (the glibc gate, the static
    // platform in an empty container, lintian, the signatures, serving). The second build that
    // proves it reproducible is the release command's (`dist --check-reproducible`,
    // docs/release.md): it checks the toolchain more than a change. On its glibc side it first
    // builds the agent whose instructions per heartbeat the regression test counts
    // (bench/cost.rs): the shipped build with test knobs, sharing every dependency with the
    // release build, which runs after it so that the target directory ends with the shipped
    // agent; the static platform builds beside both (dist.rs, `build_trusting`).
    // The test host scenarios (`cargo xtask e2e`) run beside the release build and the suites:
    // their builds and stage first (debug builds, which put `target/debug` back as the suites
    // need it), then the runner in the background (its output in target/e2e-scenarios.log,
    // printed when it is waited for, last). A scenario mostly waits (systemd, dockerd, apt and
    // the agent inside its test host, the timers of the agent and the platform), so this
    // overlaps its waiting with the builds' compiling (the CI budget).
    let docker = util::docker_answers();
    eprintln!(
        "xtask: docker engine {}",
        if docker { "answers" } else { "absent: the Docker tests will fail" }
    );
    let scenarios = if no_e2e {
        None
    } else if docker {
        disk_report();
        steps
            .run("scenarios: their builds and stage (cargo xtask e2e)", || e2e::prepare(&[], None))
            .map(|cmd| Background::start("the scenarios (cargo xtask e2e)", cmd, "e2e-scenarios.log"))
    } else {
        steps.run("scenarios (cargo xtask e2e)", || -> Result<()> {
            anyhow::bail!(
                "no Docker Engine answers: the test host scenarios cannot run (--no-e2e skips them)"
            )
        });
        None
    };
    let dist_dir = util::target_dir().join("dist");
    let cost_bin = if no_dist {
        steps.run("release: the measured agent", dist::build_measured_agent)
    } else {
        let a = dist::DistArgs {
            key: None,
            check_reproducible: false,
            no_deb: false,
            out: Some(dist_dir.clone()),
            measured_agent: true,
        };
        steps
            .run("release: the measured agent, dist (glibc; musl beside), .deb, signatures", || dist::run(a))
            .flatten()
    };
    let platform_bin = util::target_dir().join("debug/gpum-platform");
    // Every test, in one run: those that need something of the machine (root, a Docker engine,
    // chromium, valgrind, the release build) are `#[ignore = "needs …"]`, so a plain `cargo
    // nextest run` lists them as skipped rather than passing them; here, where
    // tests/setup-deps.sh installed what they need, they run beside the rest, and a missing
    // requirement fails them. `--no-dist` leaves out the ones that check the release.
    let mut args = NEXTEST_ALL.to_vec();
    if no_dist {
        args.extend(["-E", "not (binary_id(gpum-tests::dist) | test(dist_binaries_pass_the_gate))"]);
    }
    args.extend(extra.iter().map(String::as_str));
    let (dist_env, platform_env) =
        (dist_dir.to_string_lossy().into_owned(), platform_bin.to_string_lossy().into_owned());
    let cost_env = cost_bin.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let mut env = vec![("GPUM_PLATFORM_BIN", platform_env.as_str())];
    if !cost_env.is_empty() {
        env.push(("GPUM_AGENT_COST_BIN", cost_env.as_str()));
    }
    if !no_dist {
        env.push(("GPUM_DIST_DIR", dist_env.as_str()));
    }
    steps.run("suites: every test of the workspace", || cargo_linted(&args, &env));
    // The platform's suites again, on PostgreSQL (issue 35): its unit tests (the store's among
    // them) and the end-to-end suites of the platform and of the trust chain, with every database a fresh one in a private cluster that
    // the first test starts (platform/src/testdb.rs). The tests that only SQLite has (its files,
    // WAL, backup) open their own SQLite databases. The dashboard's browser suite, the agent's,
    // the rentals' and the tunnel's run once, above (the CI budget): what they read and store
    // goes through the store functions (the cabinet's pages read the nodes, summaries, events,
    // earnings, windows and alerts the owner API answers from), heartbeat, rentals and
    // relay-holder code that the platform's unit tests and suite (its owner API, replicas and
    // effects included) run on PostgreSQL here.
    steps.run("suites: the platform on PostgreSQL", || {
        let mut pg_env = env.clone();
        pg_env.push(("GPUM_TEST_DB", "postgres"));
        let mut args = NEXTEST_ALL.to_vec();
        args.extend([
            "-E",
            "package(gpum-platform) | binary_id(gpum-tests::platform) | binary_id(gpum-tests::trust)",
        ]);
        cargo_linted(&args, &pg_env)
    });
    // The agent as it ships, without `test-knobs`: in the run above, tests/Cargo.toml's
    // dependency turns the feature on for the whole workspace (feature unification), so the
    // tests that prove a build without it ignores the test knobs (gpum-enroll's
    // `test_knobs_are_unknown_keys_without_the_feature`, `agent/tests/nvml_knob.rs`'s default
    // branch) only compile and run here, where the agent and its enrollment crate are the only
    // packages.
    steps.run("suites: the agent without test-knobs", || {
        cargo_linted(
            &["nextest", "run", "-p", "gpum-agent", "-p", "gpum-enroll", "--locked", "--no-fail-fast"],
            &[],
        )
    });
    // The installer's tests over the simulated NVML library need its `test-knobs` (only such a
    // build reads `GPUM_NVML_LIB`); the workspace run above proves the default build ignores it.
    steps.run("suites: the installer with test-knobs", || {
        cargo_linted(
            &[
                "nextest",
                "run",
                "-p",
                "gpum-install",
                "--locked",
                "--no-fail-fast",
                "--features",
                "gpum-install/test-knobs",
                "--test",
                "cli",
            ],
            &[],
        )
    });
    if let Some(scenarios) = scenarios {
        steps.run("scenarios: what was left of them", || scenarios.finish());
    }
    steps.finish()
}

/// A command running beside the steps of `cargo xtask test` (tests/setup-deps.sh beside the
/// first builds, the scenarios beside the release and the suites), its output in a log file
/// under the target directory, printed when it is waited for.
struct Background {
    what: &'static str,
    /// Waits for the command: its status and how long it ran.
    waiter: std::thread::JoinHandle<std::io::Result<(std::process::ExitStatus, f64)>>,
    log: std::path::PathBuf,
}

impl Background {
    fn start(what: &'static str, mut cmd: std::process::Command, log: &str) -> Self {
        let log = util::target_dir().join(log);
        let started = std::time::Instant::now();
        let child = std::fs::create_dir_all(util::target_dir())
            .and_then(|()| std::fs::File::create(&log))
            .and_then(|f| {
                let err = f.try_clone()?;
                cmd.stdin(std::process::Stdio::null()).stdout(f).stderr(err).spawn()
            });
        let waiter = std::thread::spawn(move || {
            let st = child?.wait()?;
            Ok((st, started.elapsed().as_secs_f64()))
        });
        eprintln!("xtask: in the background, beside the steps below: {what}; its output: {}", log.display());
        Self { what, waiter, log }
    }

    fn setup() -> Self {
        let mut c = std::process::Command::new("bash");
        c.arg(util::workspace_root().join("tests/setup-deps.sh"));
        Self::start("tests/setup-deps.sh", c, "setup-deps.log")
    }

    fn finish(self) -> Result<()> {
        let what = self.what;
        let (st, secs) = self
            .waiter
            .join()
            .map_err(|_| anyhow::anyhow!("waiting for {what} panicked"))?
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprint!("{out}");
        eprintln!("xtask: {what} ran {secs:.0} s beside the other steps ({})", self.log.display());
        anyhow::ensure!(st.success(), "{what} failed: {st}");
        Ok(())
    }
}

/// Prints `df -h` for the target directory and Docker's data root (nothing on failure).
fn disk_report() {
    let target = util::target_dir();
    let _ = std::process::Command::new("df")
        .arg("-h")
        .arg(&target)
        .arg("/var/lib/docker")
        .stdin(std::process::Stdio::null())
        .status();
}
