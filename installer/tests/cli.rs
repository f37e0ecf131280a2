//! The real `gpum-install` binary on this machine: as `nobody` (via `setpriv`), with a noexec
//! tmpfs as `TMPDIR` (inside `unshare -m`), in both languages, `--json` parsed, usage errors,
//! and the platform check against a loopback server. Always `--offline` or a loopback `--server`.
//!
//! The machine's own facts are asserted honestly: where `/run/systemd/system` is absent the
//! `systemd` check must fail, and where no `libnvidia-ml.so.1` is installed `nvidia_driver` must
//! say the library is missing. Nothing here is simulated.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// The binary, runnable by `nobody`: the build output itself when every directory above it is
/// searchable by others, else a copy in a world-readable directory (reused across tests, keyed
/// by the build's size and mtime, so nothing piles up).
fn bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let built = PathBuf::from(env!("CARGO_BIN_EXE_gpum-install"));
        let others_can =
            |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o001 != 0).unwrap_or(false);
        if built.ancestors().all(|a| a.as_os_str().is_empty() || others_can(a)) {
            return built;
        }
        let m = std::fs::metadata(&built).unwrap();
        let stamp = m.modified().unwrap().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("gpum-install-it-{}-{stamp}", m.len()));
        let dst = dir.join("gpum-install");
        if !dst.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let tmp = dir.join(format!(".gpum-install.{}", std::process::id()));
            std::fs::copy(&built, &tmp).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, &dst).unwrap();
        }
        dst
    })
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A command with a clean, English, predictable environment.
fn cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null());
    c
}

fn install(args: &[&str]) -> Command {
    let mut c = cmd(bin().to_str().unwrap());
    c.args(args);
    c
}

/// The same, as `nobody` (uid/gid 65534, no groups). Requires root to switch; callers skip
/// otherwise (and when not root, the plain run is already non-root).
fn install_as_nobody(args: &[&str]) -> Command {
    let mut c = cmd("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin().to_str().unwrap()]).args(args);
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("spawn")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)))
}

fn check<'a>(v: &'a Value, id: &str) -> &'a Value {
    v["checks"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap_or_else(|| panic!("no check {id}"))
}

fn systemd_is_pid1() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

fn nvml_installed() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| text(&o.stdout).contains("libnvidia-ml.so.1"))
        .unwrap_or(false)
}

#[test]
fn help_and_version_exit_0() {
    let o = run(install(&["--help"]));
    assert_eq!(o.status.code(), Some(0));
    let en = text(&o.stdout);
    assert!(en.contains("--dry-run"));
    assert!(en.contains("\nExit codes:\n  0   installed; with --dry-run: the machine is ready\n"), "{en}");
    assert!(en.contains("\n  13  The installer must run as root\n"), "{en}");
    // Under a Russian locale the exit codes are Russian; clap's part above them stays as it is.
    let mut c = install(&["--help"]);
    c.env("LANG", "ru_RU.UTF-8");
    let o = run(c);
    assert_eq!(o.status.code(), Some(0));
    let ru = text(&o.stdout);
    let (ru_clap, ru_codes) = ru.split_once("Коды выхода:").unwrap_or_else(|| panic!("{ru}"));
    assert_eq!(Some(ru_clap), en.split_once("Exit codes:").map(|(clap, _)| clap), "{ru}");
    assert!(ru_codes.starts_with("\n  0   установка завершена;"), "{ru}");
    assert!(ru_codes.contains("\n  13  Установщик нужно запускать от имени root\n"), "{ru}");
    assert!(!ru_codes.contains("Error:") && !ru_codes.contains("Every flag"), "{ru}");
    assert!(ru.ends_with("см. docs/install.md.\n"), "{ru}");
    // --lang wins over the locale, as for every other message.
    let mut c = install(&["--help", "--lang", "en"]);
    c.env("LANG", "ru_RU.UTF-8");
    assert_eq!(text(&run(c).stdout), en);
    let o = run(install(&["--version"]));
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn usage_errors_exit_2_in_both_languages() {
    let o = run(install(&["--dry-run", "--frobnicate"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).starts_with("Unknown parameter: --frobnicate"), "{}", text(&o.stderr));
    let mut c = install(&["--frobnicate"]);
    c.env("LANG", "ru_RU.UTF-8");
    let o = run(c);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).starts_with("Неизвестный параметр: --frobnicate"), "{}", text(&o.stderr));
    let o = run(install(&["--frobnicate", "--lang", "ru"]));
    assert!(text(&o.stderr).starts_with("Неизвестный параметр"));
    let o = run(install(&["--lang", "xx"]));
    assert_eq!(o.status.code(), Some(2));
    let o = run(install(&["--dry-run", "--offline", "--code", "GPUM-NOT-A-CODE"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("join code looks wrong"));
}

/// The audit as `nobody` reports root as failed, and this machine's facts as they are.
#[test]
fn dry_run_as_nobody_json_reports_this_machine_honestly() {
    let mut c = if is_root() {
        install_as_nobody(&["--dry-run", "--offline", "--json"])
    } else {
        install(&["--dry-run", "--offline", "--json"])
    };
    c.env("LANG", "C.UTF-8");
    let o = run(c);
    assert_eq!(o.status.code(), Some(10), "{}", text(&o.stderr));
    assert!(o.stderr.is_empty(), "--json keeps stderr quiet: {}", text(&o.stderr));
    let v = json(&o);
    assert_eq!(v["ready"], false);
    assert_eq!(check(&v, "root")["status"], "fail");
    assert!(check(&v, "root")["message"].as_str().unwrap().contains("uid"));
    assert_eq!(check(&v, "platform")["status"], "skip");
    if !systemd_is_pid1() {
        assert_eq!(check(&v, "systemd")["status"], "fail");
    }
    if !nvml_installed() {
        let d = check(&v, "nvidia_driver");
        assert_eq!(d["status"], "fail");
        assert!(d["message"].as_str().unwrap().contains("cannot be loaded"), "{d}");
    }
    for c in v["checks"].as_array().unwrap() {
        assert!(["pass", "warn", "fail", "skip"].contains(&c["status"].as_str().unwrap()), "{c}");
    }
    assert!(!v["plan"].as_array().unwrap().is_empty());
}

#[test]
fn dry_run_human_report_in_russian_from_the_locale() {
    let mut c = if is_root() {
        install_as_nobody(&["--dry-run", "--offline"])
    } else {
        install(&["--dry-run", "--offline"])
    };
    c.env("LANG", "ru_RU.UTF-8");
    let o = run(c);
    assert_eq!(o.status.code(), Some(10));
    let out = text(&o.stdout);
    assert!(out.contains("[FAIL] root: Установщик нужно запускать от имени root"), "{out}");
    assert!(out.contains("Установка сделает:"));
    assert!(text(&o.stderr).starts_with("Проверка машины не пройдена ("), "{}", text(&o.stderr));
}

#[test]
fn without_dry_run_as_nobody_exits_13() {
    let c = if is_root() { install_as_nobody(&["--offline"]) } else { install(&["--offline"]) };
    let o = run(c);
    assert_eq!(o.status.code(), Some(13), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("must run as root"));
}

#[test]
fn without_dry_run_as_root_stops_at_systemd_on_this_machine() {
    if !is_root() || systemd_is_pid1() {
        eprintln!("SKIP: needs root on a machine without systemd as PID 1");
        return;
    }
    // The code is malformed too, but systemd comes first.
    let o = run(install(&["--offline", "--code", "nope"]));
    assert_eq!(o.status.code(), Some(14), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("systemd is not running"));
}

/// Runs `args` with TMPDIR on a fresh noexec tmpfs in a private mount namespace (root only).
/// `None` when this machine cannot make one (then the caller says so and skips).
fn in_noexec_tmpfs(as_nobody: bool, args: &[&str]) -> Option<Output> {
    if !is_root() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("gpum-noexec-{}-{}", std::process::id(), as_nobody));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let prefix = if as_nobody { "setpriv --reuid=65534 --regid=65534 --clear-groups " } else { "" };
    let script = format!(
        "mount -t tmpfs -o noexec,nosuid,nodev,size=1m gpum-test {d} || exit 99; exec env TMPDIR={d} {prefix}{} {}",
        bin().display(),
        args.join(" ")
    );
    let mut c = cmd("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    let o = run(c);
    let _ = std::fs::remove_dir(&dir);
    if o.status.code() == Some(99) || text(&o.stderr).contains("unshare failed") {
        return None;
    }
    Some(o)
}

#[test]
fn a_noexec_tmpdir_fails_tmp_exec_with_the_seed_fix() {
    let Some(o) = in_noexec_tmpfs(false, &["--dry-run", "--offline", "--json"]) else {
        eprintln!(
            "SKIP: cannot mount a tmpfs in a private mount namespace here (needs root and CAP_SYS_ADMIN)"
        );
        return;
    };
    assert_eq!(o.status.code(), Some(10), "{}", text(&o.stderr));
    let v = json(&o);
    let t = check(&v, "tmp_exec");
    assert_eq!(t["status"], "fail", "{t}");
    assert!(t["message"].as_str().unwrap().contains("noexec"));
    assert!(t["fix"].as_str().unwrap().contains("sudo env TMPDIR=/var/tmp bash"));
    // As nobody, in Russian.
    let o = in_noexec_tmpfs(true, &["--dry-run", "--offline", "--lang", "ru"]).unwrap();
    assert_eq!(o.status.code(), Some(10));
    let out = text(&o.stdout);
    assert!(out.contains("[FAIL] tmp_exec: $TMPDIR"), "{out}");
    assert!(out.contains("sudo env TMPDIR=/var/tmp bash"));
    assert!(text(&o.stderr).contains("tmp_exec"));
}

#[test]
fn the_default_tmp_passes_tmp_exec_here() {
    let o = run(install(&["--dry-run", "--offline", "--json"]));
    let v = json(&o);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let tmp_noexec = mounts.lines().any(|l| l.split(' ').nth(4) == Some("/tmp") && l.contains("noexec"));
    assert_eq!(check(&v, "tmp_exec")["status"], if tmp_noexec { "fail" } else { "pass" });
}

/// A one-shot HTTP server on loopback that answers `status`.
fn loopback_server(status: &'static str) -> (String, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 2048];
        let _ = s.read(&mut buf);
        let _ = write!(s, "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    });
    (url, h)
}

#[test]
fn platform_check_against_a_loopback_server() {
    let (url, h) = loopback_server("200 OK");
    let o = run(install(&["--dry-run", "--json", "--server", &url]));
    h.join().unwrap();
    let v = json(&o);
    let p = check(&v, "platform");
    assert_eq!(p["status"], "pass", "{p}");
    assert!(p["message"].as_str().unwrap().contains("HTTP 200"));
    // Nothing listens: the check fails and the machine is not ready.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = run(install(&["--dry-run", "--json", "--server", &format!("http://127.0.0.1:{port}/")]));
    assert_eq!(o.status.code(), Some(10));
    let v = json(&o);
    assert_eq!(check(&v, "platform")["status"], "fail");
    // Plain http off loopback is refused without a connection.
    let o = run(install(&["--dry-run", "--json", "--server", "http://192.0.2.1/"]));
    let v = json(&o);
    assert!(check(&v, "platform")["message"].as_str().unwrap().contains("loopback"));
}

/// Whether this binary reads `GPUM_NVML_LIB`: only a build with the `test-knobs` feature, which
/// turns on gpum-preflight's (the feature of this crate is the binary's too).
const NVML_KNOB: bool = cfg!(feature = "test-knobs");

#[cfg(feature = "test-knobs")]
#[test]
fn nvml_library_override_is_reported_as_missing() {
    let mut c = install(&["--dry-run", "--offline", "--json"]);
    c.env("GPUM_NVML_LIB", "/nonexistent/libnvidia-ml.so.1");
    let v = json(&run(c));
    let d = check(&v, "nvidia_driver");
    assert_eq!(d["status"], "fail");
    assert!(d["message"].as_str().unwrap().contains("/nonexistent/libnvidia-ml.so.1"));
}

/// Issue 29, item 8: `GPUM_NVML_LIB=evil.so gpum-install --dry-run` ran the library's
/// constructor as root. A library whose constructor writes a marker file is built here and
/// named in `GPUM_NVML_LIB`: a default build (what `cargo xtask dist` ships) must never load
/// it, whatever the variable says; a `test-knobs` build loads it, which shows the marker
/// would tell. Skipped without a C compiler.
#[test]
fn gpum_nvml_lib_is_ignored_without_test_knobs() {
    let dir = tempfile_dir("gpum-nvml-knob");
    let lib = build_marker_lib(&dir);
    let marker = dir.join("constructor-ran");
    let mut c = install(&["--dry-run", "--offline", "--json"]);
    c.env("GPUM_NVML_LIB", &lib).env("GPUM_TEST_MARKER", &marker);
    let o = run(c);
    let v = json(&o);
    let d = check(&v, "nvidia_driver");
    let message = d["message"].as_str().unwrap();
    if NVML_KNOB {
        assert!(marker.exists(), "the test-knobs build loads the named library: {d}");
    } else {
        assert!(!marker.exists(), "a default build loaded GPUM_NVML_LIB={}: {d}", lib.display());
        assert!(!message.contains(lib.to_str().unwrap()), "{d}");
        if !nvml_installed() {
            // Without a driver the default name is what is missing.
            assert!(message.contains("libnvidia-ml.so.1"), "{d}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fresh directory under the system's temporary directory, named for this process.
fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tests/fixtures/load-marker.c` built into `dir`. gcc is one of the tests' dependencies
/// (tests/setup-deps.sh), so its absence fails the test rather than skipping it.
fn build_marker_lib(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/load-marker.c");
    let out = dir.join("libmarker.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc, to build the marker library (tests/setup-deps.sh installs gcc)");
    assert!(st.success(), "cc {}: {st}", src.display());
    out
}

/// Builds the NVML simulation (`tests/sim/nvml/libnvidia-ml-sim.c`, the only simulated layer)
/// into `dir`, or `None` without a C compiler.
#[cfg(feature = "test-knobs")]
fn build_nvml_sim(dir: &Path) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sim/nvml/libnvidia-ml-sim.c");
    let out = dir.join("libnvidia-ml.so.1");
    let st = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&out).arg(&src).status().ok()?;
    st.success().then_some(out)
}

/// The real dlopen and NVML calls through nvml-wrapper, against the simulated library: every
/// driver state the check tells apart, and the passing one. Needs `GPUM_NVML_LIB`, so only in a
/// `test-knobs` build (`cargo test -p gpum-install --features test-knobs`).
#[cfg(feature = "test-knobs")]
#[test]
fn nvidia_driver_states_through_a_simulated_nvml() {
    let dir = std::env::temp_dir().join(format!("gpum-nvml-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(lib) = build_nvml_sim(&dir) else {
        eprintln!("SKIP: no C compiler to build the NVML simulation");
        return;
    };
    let cases = [
        ("ok", "pass", "driver 550.127.05, 2 GPU(s): Tesla T4 (simulated), Tesla T4 (simulated)"),
        ("driver_not_loaded", "fail", "kernel module is not loaded"),
        ("mismatch", "fail", "version mismatch"),
        ("no_devices", "fail", "sees no GPU"),
        ("no_permission", "fail", "no permission"),
    ];
    for (mode, status, text_part) in cases {
        let mut c = install(&["--dry-run", "--offline", "--json"]);
        c.env("GPUM_NVML_LIB", &lib).env("GPUM_SIM_NVML", mode).env("GPUM_SIM_NVML_GPUS", "2");
        let v = json(&run(c));
        let d = check(&v, "nvidia_driver");
        assert_eq!(d["status"], status, "{mode}: {d}");
        assert!(d["message"].as_str().unwrap().contains(text_part), "{mode}: {d}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
