//! Project automation, run as `cargo xtask <command>`.
//!
//! - `test`: what CI runs: installs what the tests need (`tests/setup-deps.sh`), `cargo fmt
//!   --check`, `clippy -D warnings`, the binaries the end-to-end suites drive, the release
//!   (`dist`, whose output the suites then check; the second, reproducibility build is the
//!   release command's own, `dist --check-reproducible`, docs/release.md), the whole suite under
//!   nextest (then the tests marked `#[ignore = "needs …"]`, which need root, an engine, a
//!   browser, valgrind or the release, and the agent alone without `test-knobs`), then the test
//!   host scenarios (`e2e`).
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
    /// sizes, verify, or all (all but instructions, which agent includes).
    Bench {
        #[arg(default_value = "all")]
        which: String,
        /// Shorter runs, for a quick look.
        #[arg(long)]
        quick: bool,
        /// Print the summary table as JSON on stdout (details go to stderr).
        #[arg(long)]
        json: bool,
    },
    /// Build the release into target/dist/: binaries, .debs, man pages, completions, signatures.
    Dist(dist::DistArgs),
    /// Make a development release signing key (kept outside the repository).
    ReleaseKey(sign::ReleaseKeyArgs),
    /// Sign a release: DIR/manifest.json + manifest.json.sig, and FILE.sha256 beside each FILE.
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
        Cmd::Dist(a) => dist::run(a),
        Cmd::Bench { which, quick, json } => bench::run(&which, quick, json),
        Cmd::ReleaseKey(a) => sign::release_key(a),
        Cmd::Sign(a) => sign::sign(a),
        Cmd::E2e { names, jobs } => e2e::run(&names, jobs),
        Cmd::Docs { check } => docs::run(check),
    }
}

/// The test-only features the suites need (the agent's come through `tests/Cargo.toml`).
pub const TEST_FEATURES: &str = "gpum-platform/test-knobs";

fn test(no_setup: bool, no_e2e: bool, no_dist: bool, extra: &[String]) -> Result<()> {
    use util::cargo;
    if !no_setup {
        let st = std::process::Command::new("bash")
            .arg(util::workspace_root().join("tests/setup-deps.sh"))
            .status()
            .map_err(|e| anyhow::anyhow!("tests/setup-deps.sh: {e}"))?;
        if !st.success() {
            anyhow::bail!("tests/setup-deps.sh failed: {st}");
        }
    }
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"])?;
    // The end-to-end suites drive the real binaries, with the platform's test clock (a
    // `test-knobs` feature that release builds lack).
    cargo(&["build", "--workspace", "--bins", "--locked", "--features", TEST_FEATURES])?;
    // The release, built once; the suites then check what was built (the glibc gate, the static
    // platform in an empty container, lintian, the signatures, serving). The second build that
    // proves it reproducible is the release command's (`dist --check-reproducible`,
    // docs/release.md): it costs about 6 minutes of CI's 40-minute budget and checks the
    // toolchain more than a change.
    let dist_dir = util::target_dir().join("dist");
    // A failed dist does not stop the suites (their dist checks then fail too); the exit status
    // still reports it.
    let mut dist_result = Ok(());
    if !no_dist {
        let started = std::time::Instant::now();
        let a = dist::DistArgs {
            key: None,
            check_reproducible: false,
            no_deb: false,
            out: Some(dist_dir.clone()),
        };
        dist_result = dist::run(a).map_err(|e| anyhow::anyhow!("cargo xtask dist: {e:#}"));
        if let Err(e) = &dist_result {
            eprintln!("xtask: {e}");
        }
        eprintln!("xtask: dist took {:.0} s", started.elapsed().as_secs_f64());
    }
    // The agent whose instructions per heartbeat the regression test counts (bench/cost.rs),
    // built once here: under nextest a build would start over with another environment.
    let started = std::time::Instant::now();
    cargo(bench::cost::BUILD_ARGS)?;
    eprintln!("xtask: the agent-cost build took {:.0} s", started.elapsed().as_secs_f64());
    let cost_bin = bench::cost::agent_cost_bin();
    let platform_bin = util::target_dir().join("debug/gpum-platform");
    let docker = util::docker_answers();
    eprintln!(
        "xtask: docker engine {}",
        if docker { "answers" } else { "absent: the Docker tests will fail" }
    );
    let mut args =
        vec!["nextest", "run", "--workspace", "--locked", "--no-fail-fast", "--features", TEST_FEATURES];
    args.extend(extra.iter().map(String::as_str));
    let dist_env = dist_dir.to_string_lossy().into_owned();
    let (cost_env, platform_env) =
        (cost_bin.to_string_lossy().into_owned(), platform_bin.to_string_lossy().into_owned());
    let mut env =
        vec![("GPUM_AGENT_COST_BIN", cost_env.as_str()), ("GPUM_PLATFORM_BIN", platform_env.as_str())];
    if !no_dist {
        env.push(("GPUM_DIST_DIR", dist_env.as_str()));
    }
    // Every test that runs anywhere.
    let suites = util::cargo_env(&args, &env);
    // The tests that need something of the machine (root, a Docker engine, chromium, valgrind,
    // the release build) are `#[ignore = "needs …"]`, so a plain `cargo nextest run` lists them
    // as skipped rather than passing them. Here, where tests/setup-deps.sh installed what they
    // need, they all run, and a missing requirement fails them. `--no-dist` leaves out the
    // ones that check the release.
    let mut ignored = args.clone();
    ignored.extend(["--run-ignored", "only", "--no-tests", "pass"]);
    if no_dist {
        ignored.extend(["-E", "not (binary_id(gpum-tests::dist) | test(dist_binaries_pass_the_gate))"]);
    }
    let ignored = util::cargo_env(&ignored, &env);
    // The agent as it ships, without `test-knobs`: in the runs above, tests/Cargo.toml's
    // dependency turns the feature on for the whole workspace (feature unification), so the
    // tests that prove a build without it ignores the test knobs (gpum-enroll's
    // `test_knobs_are_unknown_keys_without_the_feature`, `agent/tests/nvml_knob.rs`'s default
    // branch) only compile and run here, where the agent and its enrollment crate are the only
    // packages.
    let agent_default = util::cargo(&[
        "nextest",
        "run",
        "-p",
        "gpum-agent",
        "-p",
        "gpum-enroll",
        "--locked",
        "--no-fail-fast",
    ]);
    // The installer's tests over the simulated NVML library need its `test-knobs` (only such a
    // build reads `GPUM_NVML_LIB`); the workspace run above proves the default build ignores it.
    let knobs = util::cargo(&[
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
    ]);
    let suites = dist_result.and(suites).and(ignored).and(knobs).and(agent_default);
    if no_e2e {
        return suites;
    }
    // The scenarios run even when a suite failed, so one run shows everything; the exit status
    // still reports the failure.
    if !docker {
        anyhow::bail!("no Docker Engine answers: the test host scenarios cannot run (--no-e2e skips them)");
    }
    // The disk left, printed for the record: a CI machine's free space varies from run to run
    // (the hosts' data roots are tmpfs for that reason, tests/src/testhost/host.rs).
    disk_report();
    let scenarios = e2e::run(&[], None);
    suites.and(scenarios)
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
