//! Issue 29, item 8: `GPUM_NVML_LIB` is a test-only knob. The real `gpum-agent` binary of this
//! build runs with `GPUM_NVML_LIB` naming a library whose constructor writes a marker file: a
//! build without the `test-knobs` feature (a release build) must never load it; a build with
//! it (the suites' build, where tests/Cargo.toml turns it on) does, which shows the marker would
//! tell.
#![allow(clippy::disallowed_methods)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn gpum_nvml_lib_is_read_only_by_a_test_knobs_build() {
    let dir = std::env::temp_dir().join(format!("gpum-agent-nvml-knob-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = build_marker_lib(&dir);
    // A node whose platform does not answer (nothing listens on port 1 of loopback): the
    // agent loads NVML for its inventory as it starts, before the first heartbeat.
    std::fs::write(
        dir.join("config.toml"),
        "server = 'http://127.0.0.1:1'\nnode_id = 'knob-node'\ntoken = 'knob-token-0123456789'\n\
         docker_socket = '/nonexistent/gpum-knob/docker.sock'\n",
    )
    .unwrap();
    let marker = dir.join("constructor-ran");
    let log = dir.join("agent.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpum-agent"))
        .args(["run", "--state"])
        .arg(&dir)
        .env("GPUM_NVML_LIB", &lib)
        .env("GPUM_TEST_MARKER", &marker)
        .env("GPUM_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // "agent started" is logged after the inventory's gatherer (and so NVML) was set up.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    while Instant::now() < deadline && !text.contains("agent started") {
        std::thread::sleep(Duration::from_millis(50));
        text.clear();
        std::fs::File::open(&log).unwrap().read_to_string(&mut text).unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(text.contains("agent started"), "the agent did not start: {text}");
    if cfg!(feature = "test-knobs") {
        assert!(marker.exists(), "the test-knobs build loads the named library: {text}");
    } else {
        assert!(!marker.exists(), "a build without test-knobs loaded GPUM_NVML_LIB: {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
