//! The agent's Docker promises, against the real engine on this machine: the GPU probe, the
//! reconciler, leftover cleanup, uninstall, and a missing engine.
//!
//! Every test scopes its client and its containers with a unique `gpum.test.scope` label, so
//! that suites running in parallel processes never see (or remove) each other's containers, and
//! a guard removes whatever the test created when it ends, pass or fail. What a test checks, it
//! checks through the docker CLI, independently of the agent's own bollard calls.
//!
//! The engine here has no NVIDIA toolkit, so the probe scenarios other than "`--gpus all`
//! refused" run without the GPU request (the agent's fenced test seam) against the SIMULATED
//! `nvidia-smi` of `tests/sim/`.
#![allow(clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpum_agent::docker::ledger::{self, ProbeImages};
use gpum_agent::docker::probe::{self, ProbeSpec};
use gpum_agent::docker::reconcile::{self, ManagedContainer, Reconciler};
use gpum_agent::docker::watch::Watch;
use gpum_agent::docker::{Docker, DockerError};
use gpum_enroll::config::default_registries;
use gpum_protocol::{PROBE_OUTPUT_MAX, ProbeFailure, VerificationState};
use gpum_tests::docker_scope::{Scope, docker, exists};
use gpum_tests::{images, require_docker};

/// What this suite does within a [`Scope`] beyond the shared harness.
trait Containers {
    /// Names of the containers in this scope that exist now (any state).
    fn names(&self) -> HashSet<String>;
    /// Starts (`running`) or just creates a container named `<scope>-<name>` with `labels`.
    fn container(&self, name: &str, labels: &[&str], running: bool) -> String;
    /// Like [`Containers::container`], with the full name and the image given.
    fn container_from(&self, full: &str, image: &str, labels: &[&str], running: bool) -> String;
}

impl Containers for Scope {
    /// Names of the containers in this scope that exist now (any state).
    fn names(&self) -> HashSet<String> {
        docker(&["ps", "-a", "--filter", &format!("label={}", self.label()), "--format", "{{.Names}}"])
            .lines()
            .map(str::to_string)
            .collect()
    }
    /// Starts (`running`) or just creates a container named `<scope>-<name>` with `labels`.
    fn container(&self, name: &str, labels: &[&str], running: bool) -> String {
        let full = format!("{}-{name}", self.value);
        self.container_from(&full, &images::busybox().expect("test image"), labels, running)
    }
    fn container_from(&self, full: &str, image: &str, labels: &[&str], running: bool) -> String {
        let full = full.to_string();
        let mut args = vec![if running { "run" } else { "create" }];
        if running {
            args.push("-d");
        }
        let scope_label = self.label();
        args.extend(["--name", &full, "--network", "none", "--label", &scope_label]);
        for l in labels {
            args.extend(["--label", l]);
        }
        args.extend([image, "sleep", "3600"]);
        docker(&args);
        full
    }
}

fn id_of(name: &str) -> String {
    docker(&["inspect", "--format", "{{.Id}}", name])
}

// ---------------------------------------------------------------------------------------------
// Probe

/// Runs a simulated scenario without the GPU request and checks what every probe must leave:
/// a container that had network `none` and the probe label, gone afterwards with its volume.
async fn sim_probe(test: &str, scenario: &str, timeout: Duration) -> probe::ProbeOutcome {
    require_docker(test);
    let scope = Scope::new(test);
    let image = images::pinned(&images::sim_nvidia(scenario).expect("sim image")).expect("pinned");
    let d = scope.docker();
    let out = probe::run_probe_with(&d, &ProbeSpec::simulation_without_gpu_request(&image, timeout)).await;
    let c = out.container.clone().expect("a probe container was created");
    assert_hardened(&c);
    assert!(!out.pulled, "a local image is not pulled");
    assert!(c.device_requests.is_empty(), "simulation probes do not ask for GPUs");
    assert_eq!(c.volumes.len(), 1, "the sim image declares one anonymous volume: {:?}", c.volumes);
    assert!(out.removed);
    assert!(!exists("container", &c.id), "probe container {} left behind", c.name);
    assert!(!exists("volume", &c.volumes[0]), "anonymous volume {} left behind", c.volumes[0]);
    assert!(scope.names().is_empty(), "{:?}", scope.names());
    assert_eq!(out.report.image, image);
    assert!(out.report.output.len() <= PROBE_OUTPUT_MAX);
    out
}

/// What every probe container must be, as the engine reports it (issue 14, item 1).
fn assert_hardened(c: &probe::ProbeContainer) {
    assert_eq!(c.network_mode, "none", "the engine says the probe had a network");
    assert_eq!(c.labels.get("gpum.probe").map(String::as_str), Some("true"));
    assert_eq!(c.labels.get("gpum.probe.run").map(String::as_str), Some(probe::run_id()));
    assert!(c.name.starts_with("gpum-probe-"), "{}", c.name);
    assert_eq!(c.entrypoint, [probe::PROBE_COMMAND], "the agent's entrypoint, by path, not the image's");
    assert_eq!(probe::PROBE_COMMAND, "/usr/bin/nvidia-smi", "where the NVIDIA toolkit mounts it");
    assert!(c.cmd.is_empty(), "no command from the image: {:?}", c.cmd);
    assert_eq!(c.healthcheck, ["NONE"], "the image's healthcheck never runs");
    assert_eq!(c.cap_drop, ["ALL"]);
    assert!(c.cap_add.is_empty() && !c.privileged);
    assert!(c.security_opt.iter().any(|o| o.starts_with("no-new-privileges")), "{:?}", c.security_opt);
    assert!(c.readonly_rootfs, "read-only root");
    assert_eq!(c.pids_limit, Some(probe::PIDS_LIMIT));
    assert_eq!(c.memory, Some(probe::MEMORY_LIMIT_BYTES));
    assert!(c.env.iter().any(|e| e == "LD_PRELOAD="), "{:?}", c.env);
    let paths: Vec<&String> = c.env.iter().filter(|e| e.starts_with("PATH=")).collect();
    assert_eq!(paths, [&format!("PATH={}", probe::PROBE_PATH)], "the agent's PATH only: {:?}", c.env);
    assert!(c.image_id.starts_with("sha256:"), "created by image id: {}", c.image_id);
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_success_is_verified() {
    let out = sim_probe("probe_success", "ok", Duration::from_secs(20)).await;
    assert_eq!(out.report.state, VerificationState::Verified, "{:?}", out.report);
    assert_eq!(out.report.reason, None);
    assert!(out.report.output.contains("Tesla T4 (SIMULATED)"), "{}", out.report.output);
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_nvidia_smi_failing_is_classified() {
    let out = sim_probe("probe_fail", "fail", Duration::from_secs(20)).await;
    assert_eq!(out.report.state, VerificationState::Failed);
    assert_eq!(out.report.reason, Some(ProbeFailure::NvidiaSmiFailed));
    assert!(
        out.report.output.contains("couldn't communicate with the NVIDIA driver"),
        "{}",
        out.report.output
    );
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_nvml_unknown_error_is_classified() {
    let out = sim_probe("probe_unknown", "unknown_error", Duration::from_secs(20)).await;
    assert_eq!(out.report.reason, Some(ProbeFailure::NvmlUnknownError));
    assert_eq!(out.report.output.trim(), "Failed to initialize NVML: Unknown Error");
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_driver_library_mismatch_is_classified() {
    let out = sim_probe("probe_mismatch", "mismatch", Duration::from_secs(20)).await;
    assert_eq!(out.report.reason, Some(ProbeFailure::DriverLibraryMismatch));
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_output_is_truncated() {
    let out = sim_probe("probe_flood", "flood", Duration::from_secs(20)).await;
    assert_eq!(out.report.state, VerificationState::Verified);
    assert_eq!(out.report.output.len(), PROBE_OUTPUT_MAX, "about 75 KB of output cut to the limit");
    // The head is kept: the table first, then the start of the flood.
    let o = &out.report.output;
    assert!(o.starts_with("Tue Dec  2 09:00:00 2026") && o.contains("Tesla T4 (SIMULATED)"), "{o}");
    assert!(o.contains("simulated flood line 0:") && !o.contains("simulated flood line 1023:"), "{o}");
}

/// A hanging `nvidia-smi` times out, and while it hangs the test checks from outside, with the
/// docker CLI, that the container has no network interface but loopback.
#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_timeout_kills_and_removes_and_had_no_network() {
    let test = "probe_timeout";
    require_docker(test);
    let scope = Scope::new(test);
    let image = images::pinned(&images::sim_nvidia("hang").expect("sim image")).expect("pinned");
    let d = scope.docker();
    let filter = format!("label={}", scope.label());
    let watcher = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let id = docker(&["ps", "-q", "--filter", &filter, "--filter", "label=gpum.probe=true"]);
            if !id.is_empty() {
                let mode = docker(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", &id]);
                let dev = docker(&["exec", &id, "cat", "/proc/net/dev"]);
                // The probe's own process, PID 1 of the container, as the kernel sees it.
                let status = docker(&["exec", &id, "cat", "/proc/1/status"]);
                let wrote = Command::new("docker")
                    .args(["exec", &id, "touch", "/gpum-write-check"])
                    .output()
                    .unwrap()
                    .status
                    .success();
                return Some((mode, dev, status, wrote));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    });
    let started = Instant::now();
    let out =
        probe::run_probe_with(&d, &ProbeSpec::simulation_without_gpu_request(&image, Duration::from_secs(8)))
            .await;
    let elapsed = started.elapsed();
    let (mode, dev, status, wrote) = watcher.await.unwrap().expect("saw the running probe container");
    assert_eq!(mode, "none");
    let field =
        |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("?").to_string();
    assert_eq!(field("CapEff:"), "0000000000000000", "every capability dropped: {status}");
    assert_eq!(field("CapBnd:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert!(!wrote, "the root filesystem is read-only");
    let ifaces: Vec<&str> = dev.lines().skip(2).filter_map(|l| l.split(':').next()).map(str::trim).collect();
    assert_eq!(ifaces, ["lo"], "{dev}");
    assert_eq!(out.report.reason, Some(ProbeFailure::Timeout), "{:?}", out.report);
    assert!(out.report.output.contains("hanging"), "output so far is kept: {}", out.report.output);
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    let c = out.container.unwrap();
    assert!(!exists("container", &c.id) && !exists("volume", &c.volumes[0]));
    assert!(scope.names().is_empty());
}

/// The production probe (`--gpus all`) on this engine. Without the NVIDIA toolkit the engine
/// refuses the device request; the report carries the engine's words verbatim.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_gpus_all_is_refused_by_this_engine() {
    let test = "probe_gpus_all";
    require_docker(test);
    let scope = Scope::new(test);
    let image = images::pinned(&images::sim_nvidia("ok").expect("sim image")).expect("pinned");
    let d = scope.docker();
    let has_runtime = d.has_nvidia_runtime().await.expect("engine info");
    let out = probe::run_probe_with(&d, &ProbeSpec::new(&image, Duration::from_secs(20))).await;
    eprintln!("engine answer to --gpus all: {:?} {:?}", out.report.reason, out.report.output);
    let c = out.container.clone().expect("the engine creates the container and refuses at start");
    assert_eq!(c.device_requests, vec![(String::new(), -1, vec![vec!["gpu".to_string()]])], "--gpus all");
    assert_hardened(&c);
    assert!(out.removed && !exists("container", &c.id) && !exists("volume", &c.volumes[0]));
    if !has_runtime {
        assert_eq!(out.report.state, VerificationState::Failed);
        assert_eq!(out.report.reason, Some(ProbeFailure::DeviceRequestRefused));
        assert!(
            out.report.output.starts_with(r#"could not select device driver "" with capabilities: [[gpu]]"#),
            "{}",
            out.report.output
        );
    }
    // The plain entry point makes the same request.
    let rep = probe::run_probe(&d, &image, Duration::from_secs(20), &default_registries()).await;
    assert_eq!(rep.reason, out.report.reason);
    assert!(scope.names().is_empty());
}

/// Issue 14, items 1 and 2: an image not pinned by digest, or from a registry the node does not
/// accept (a loopback registry here, as an internal service would be), is refused before any
/// pull; and when a pull does fail, the report carries its class and a fixed text, never the
/// engine's words with the address in them.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn probe_images_are_pinned_from_accepted_registries_and_pull_failures_are_a_class() {
    let test = "probe_pull";
    require_docker(test);
    let scope = Scope::new(test);
    let d = scope.docker();
    let hex = "0123456789abcdef".repeat(4);
    // A registry on loopback where nothing listens: no traffic leaves the machine.
    for (image, want) in [
        ("127.0.0.1:9/gpum-test/absent:1".to_string(), ProbeFailure::ImageNotPinned),
        (images::sim_nvidia("ok").unwrap(), ProbeFailure::ImageNotPinned),
        (format!("127.0.0.1:9/gpum-test/absent@sha256:{hex}"), ProbeFailure::RegistryNotAccepted),
        (format!("localhost:9/gpum-test/absent@sha256:{hex}"), ProbeFailure::RegistryNotAccepted),
    ] {
        let out = probe::run_probe_with(&d, &ProbeSpec::new(&image, Duration::from_secs(20))).await;
        assert_eq!(out.report.reason, Some(want), "{image}: {:?}", out.report);
        assert!(!out.pulled && out.container.is_none(), "{image}");
    }
    // A local image counts only when its reference's registry is accepted too: the same image
    // id behind a loopback registry's name is refused.
    let id = images::id_of(&images::sim_nvidia("ok").unwrap()).unwrap();
    let out =
        probe::run_probe_with(&d, &ProbeSpec::new(&format!("127.0.0.1:9/x@{id}"), Duration::from_secs(20)))
            .await;
    assert_eq!(out.report.reason, Some(ProbeFailure::RegistryNotAccepted), "{:?}", out.report);
    // An owner who lists that registry gets a pull; its failure is reported as a class.
    let image = format!("127.0.0.1:9/gpum-test/absent@sha256:{hex}");
    let spec = ProbeSpec::new(&image, Duration::from_secs(20)).with_registries(&["127.0.0.1:9".to_string()]);
    let out = probe::run_probe_with(&d, &spec).await;
    assert_eq!(out.report.reason, Some(ProbeFailure::ImagePullFailed), "{:?}", out.report);
    assert!(out.pulled);
    assert_eq!(out.report.output, probe::PULL_FAILED_OUTPUT);
    assert!(!out.report.output.contains("127.0.0.1"), "{}", out.report.output);
    assert!(out.container.is_none() && scope.names().is_empty());
}

/// Issue 14, item 1: the image's entrypoint and command never run, and its `LD_PRELOAD` does
/// not reach the probe; the agent's `nvidia-smi` runs instead.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn the_images_entrypoint_command_and_preload_never_run() {
    let test = "probe_entrypoint";
    require_docker(test);
    let scope = Scope::new(test);
    let tag = images::custom(
        "hostile-entrypoint",
        &[
            r#"ENTRYPOINT ["/bin/sh", "-c", "echo IMAGE-ENTRYPOINT-RAN; exit 0"]"#,
            r#"CMD ["IMAGE-CMD"]"#,
            "ENV LD_PRELOAD=/gpum-evil.so",
        ],
    )
    .expect("image");
    let image = images::pinned(&tag).unwrap();
    let d = scope.docker();
    let out = probe::run_probe_with(
        &d,
        &ProbeSpec::simulation_without_gpu_request(&image, Duration::from_secs(20)),
    )
    .await;
    let c = out.container.clone().expect("created");
    assert_hardened(&c);
    assert!(!c.env.iter().any(|e| e.contains("gpum-evil")), "{:?}", c.env);
    assert!(!out.report.output.contains("IMAGE-ENTRYPOINT-RAN"), "{}", out.report.output);
    assert!(out.report.output.contains("Tesla T4 (SIMULATED)"), "{}", out.report.output);
    assert_eq!(out.report.state, VerificationState::Verified);
    assert!(out.removed && scope.names().is_empty());
}

/// A simulated toolkit's `nvidia-smi` in `dir`: the simulation of `tests/sim/nvidia-smi` with
/// the machine's state fixed to `scenario`, as the real toolkit's binary describes the machine
/// whatever the image's environment says.
fn simulated_toolkit(dir: &Path, scenario: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("nvidia-smi-{scenario}"));
    let script = format!(
        "#!/bin/sh\n# gpum tests: the simulated toolkit's nvidia-smi, machine state {scenario}\nset -- {scenario}\n{}",
        images::SIM_NVIDIA_SMI
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Issue 29, item 4: an image with its own `nvidia-smi`, both in `/usr/local/bin` (first on the
/// image's default `PATH`, where a bare `nvidia-smi` was found) and in `/usr/bin` (where the
/// toolkit mounts the host's), each printing a success, cannot make the probe "verified". The
/// agent runs `/usr/bin/nvidia-smi` by path with its own `PATH`, and the toolkit's binary
/// (simulated here, mounted read-only where the real toolkit mounts it) covers the image's.
/// With the simulated GPU failing, the probe fails; with it working, the output is the
/// toolkit's, not the image's. Before the fix the first probe came back verified with the
/// image's text.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn an_images_own_nvidia_smi_cannot_fake_a_verified_probe() {
    let test = "probe_fake_smi";
    require_docker(test);
    let scope = Scope::new(test);
    let fake = "#!/bin/sh\necho 'FAKE-SMI | NVIDIA-SMI 550.54.15  Driver Version: 550.54.15 | Tesla T4 (SIMULATED)'\nexit 0\n";
    let tag = images::with_files(
        "fake-smi",
        &[
            ("/usr/local/bin/nvidia-smi", fake),
            ("/usr/local/sbin/nvidia-smi", fake),
            ("/usr/bin/nvidia-smi", fake),
        ],
    )
    .expect("image");
    let image = images::pinned(&tag).unwrap();
    // The image's own binaries do what they claim, when run by their owner.
    let own = docker(&["run", "--rm", "--network", "none", &tag, "nvidia-smi"]);
    assert!(own.contains("FAKE-SMI"), "{own}");
    let d = scope.docker();
    let dir = tempfile::tempdir().unwrap();
    for (scenario, want) in [("fail", Some(ProbeFailure::NvidiaSmiFailed)), ("ok", None)] {
        let spec = ProbeSpec::simulation_without_gpu_request(&image, Duration::from_secs(20))
            .with_simulated_toolkit(&simulated_toolkit(dir.path(), scenario));
        let out = probe::run_probe_with(&d, &spec).await;
        assert!(
            !out.report.output.contains("FAKE-SMI"),
            "{scenario}: the image's program ran: {:?}",
            out.report
        );
        let c = out.container.clone().expect("a probe container was created");
        assert_hardened(&c);
        assert_eq!(out.report.reason, want, "{scenario}: {:?}", out.report);
        match want {
            Some(_) => {
                assert_eq!(out.report.state, VerificationState::Failed);
                assert!(
                    out.report.output.contains("couldn't communicate with the NVIDIA driver"),
                    "{}",
                    out.report.output
                );
            }
            None => {
                assert_eq!(out.report.state, VerificationState::Verified);
                assert!(out.report.output.contains("| NVIDIA-SMI 535.183.01"), "{}", out.report.output);
            }
        }
        assert!(out.removed && !exists("container", &c.id));
    }
    assert!(scope.names().is_empty());
}

/// A registry on loopback (the engine treats `127.0.0.0/8` as an insecure registry, so plain
/// HTTP is enough), serving images made here through the reads of the Registry HTTP API v2
/// that a pull by digest makes: `/v2/`, a manifest by digest, a blob by digest. Nothing leaves
/// the machine. Blobs go out in 64 KiB pieces with a short pause, as over a network, and the
/// bytes sent of each are counted.
struct Registry {
    port: u16,
    state: std::sync::Arc<std::sync::Mutex<RegistryState>>,
    /// The repository namespace of this registry's images, unique per test.
    ns: String,
}

#[derive(Default)]
struct RegistryState {
    /// Content by digest: `(content type, bytes)`.
    content: HashMap<String, (String, Vec<u8>)>,
    /// Bytes written per blob digest.
    sent: HashMap<String, usize>,
}

impl Registry {
    fn start(test: &str) -> Registry {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = std::sync::Arc::new(std::sync::Mutex::new(RegistryState::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                let st = st.clone();
                std::thread::spawn(move || Registry::serve(s, &st));
            }
        });
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let ns = format!("gpum-test/{}{}x{nanos:x}", test.replace(['_', '-'], ""), std::process::id());
        Registry { port, state, ns }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Adds an image `name` of one gzipped layer holding `payload` at `/payload`; returns its
    /// reference pinned by the manifest's digest.
    fn add_image(&self, name: &str, payload: &[u8]) -> String {
        use sha2::{Digest, Sha256};
        let digest = |b: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(b)));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("payload"), payload).unwrap();
        let tar = Command::new("tar")
            .args(["-C"])
            .arg(dir.path())
            .args(["--owner=0", "--group=0", "--mtime=@0", "-cf", "-", "payload"])
            .output()
            .unwrap();
        assert!(tar.status.success());
        std::fs::write(dir.path().join("layer.tar"), &tar.stdout).unwrap();
        let gz = Command::new("gzip").args(["-n", "-c"]).arg(dir.path().join("layer.tar")).output().unwrap();
        assert!(gz.status.success());
        let layer = gz.stdout;
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [digest(&tar.stdout)]},
            "history": [{"created_by": "gpum tests/e2e/docker.rs"}],
        })
        .to_string()
        .into_bytes();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": config.len(), "digest": digest(&config)},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": layer.len(), "digest": digest(&layer)}],
        })
        .to_string()
        .into_bytes();
        let m = digest(&manifest);
        let mut st = self.state.lock().unwrap();
        st.content.insert(digest(&config), ("application/octet-stream".into(), config));
        st.content.insert(digest(&layer), ("application/octet-stream".into(), layer));
        st.content
            .insert(m.clone(), ("application/vnd.docker.distribution.manifest.v2+json".into(), manifest));
        format!("{}/{}/{name}@{m}", self.host(), self.ns)
    }

    /// The bytes sent of `reference`'s one layer so far, and the layer's size.
    fn layer_sent(&self, reference: &str) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        let m = reference.rsplit('@').next().unwrap();
        let manifest: serde_json::Value = serde_json::from_slice(&st.content[m].1).unwrap();
        let layer = manifest["layers"][0]["digest"].as_str().unwrap();
        (st.sent.get(layer).copied().unwrap_or(0), st.content[layer].1.len())
    }

    fn serve(s: std::net::TcpStream, st: &std::sync::Mutex<RegistryState>) {
        use std::io::{BufRead, Write};
        let mut r = std::io::BufReader::new(s.try_clone().unwrap());
        let mut request = String::new();
        // A TLS hello (the engine tries https first) is not a request line: the connection closes.
        if r.read_line(&mut request).is_err() {
            return;
        }
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
        }
        let mut parts = request.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let found = if path == "/v2/" {
            Some(("application/json".to_string(), b"{}".to_vec(), None))
        } else {
            let digest = path.rsplit('/').next().unwrap_or("");
            let blob = path.contains("/blobs/");
            st.lock()
                .unwrap()
                .content
                .get(digest)
                .map(|(t, b)| (t.clone(), b.clone(), blob.then(|| digest.to_string())))
        };
        let mut s = s;
        let Some((ctype, body, blob)) = found else {
            let page = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#;
            let _ = write!(
                s,
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nDocker-Distribution-API-Version: registry/2.0\r\nConnection: close\r\n\r\n",
                page.len()
            );
            let _ = s.write_all(page);
            return;
        };
        let digest = blob.clone().unwrap_or_else(|| path.rsplit('/').next().unwrap_or("").to_string());
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nDocker-Content-Digest: {digest}\r\nDocker-Distribution-API-Version: registry/2.0\r\nConnection: close\r\n\r\n",
            body.len()
        );
        if s.write_all(head.as_bytes()).is_err() || method == "HEAD" {
            return;
        }
        for chunk in body.chunks(64 * 1024) {
            if s.write_all(chunk).is_err() {
                return;
            }
            if let Some(d) = &blob {
                *st.lock().unwrap().sent.entry(d.clone()).or_default() += chunk.len();
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// Removes the images a test pulled from its registry, whatever the outcome.
struct PulledGuard(Vec<String>);

impl Drop for PulledGuard {
    fn drop(&mut self) {
        for r in &self.0 {
            let _ = Command::new("docker").args(["rmi", r]).output();
        }
    }
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    use std::io::Read;
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut b).unwrap();
    b
}

/// Issue 29, item 4: a probe image over the size cap is not kept. Here the cap is 1 MiB and the
/// image's one layer about 8 MiB (random bytes, which gzip cannot shrink): the pull is stopped
/// as the engine announces the layer's size, what it left is removed, and the probe fails as
/// `image_pull_failed` with a fixed text. Before the fix the whole image was pulled and kept.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn a_probe_image_over_the_size_cap_is_removed() {
    let test = "probe_cap";
    require_docker(test);
    let scope = Scope::new(test);
    let reg = Registry::start(test);
    let big = reg.add_image("big", &random_bytes(8 * 1024 * 1024));
    let _guard = PulledGuard(vec![big.clone()]);
    let cap = 1024 * 1024;
    let spec = ProbeSpec::new(&big, Duration::from_secs(20))
        .with_registries(&[reg.host()])
        .with_max_image_bytes(cap);
    let out = probe::run_probe_with(&scope.docker(), &spec).await;
    assert!(out.pulled, "{:?}", out.report);
    assert_eq!(out.report.reason, Some(ProbeFailure::ImagePullFailed), "{:?}", out.report);
    assert_eq!(out.report.output, probe::image_too_large_output(cap));
    assert!(out.container.is_none() && out.image_id.is_none() && out.pulled_reference.is_none());
    // The engine announced the layer's size as it began: the pull stopped long before the end.
    let (sent, size) = reg.layer_sent(&big);
    assert!(sent < size, "the whole layer was downloaded ({sent} of {size} bytes)");
    // Whether the pull stopped mid-way or the image landed first, nothing of it stays, even
    // after the engine had time to finish a pull it did not cancel.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!exists("image", &big), "the oversized probe image is still on the machine");
    // A small image from the same registry passes the same cap.
    let small = reg.add_image("small", &random_bytes(4096));
    let _guard2 = PulledGuard(vec![small.clone()]);
    let spec = ProbeSpec::new(&small, Duration::from_secs(20))
        .with_registries(&[reg.host()])
        .with_max_image_bytes(cap);
    let out = probe::run_probe_with(&scope.docker(), &spec).await;
    assert!(out.pulled && out.pulled_reference.as_deref() == Some(small.as_str()), "{:?}", out);
    assert!(exists("image", &small));
    assert!(scope.names().is_empty());
}

/// Issue 29, item 4: the agent keeps at most the current and the previous probe image of those
/// it pulled itself. Older ones it pulled are removed (by the reference it pulled); an image the
/// owner pulled is never removed, nor one that any container uses (it goes once unused). Each
/// probe here is the production one (`--gpus all`, refused by this engine after the pull), through
/// the same call the service makes after every probe. Before the fix no image was ever removed.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn old_probe_images_the_agent_pulled_are_removed_and_no_other() {
    let test = "probe_retain";
    require_docker(test);
    let scope = Scope::new(test);
    let reg = Registry::start(test);
    let [a, b, c, owners] = ["a", "b", "c", "owners"].map(|n| reg.add_image(n, &random_bytes(4096)));
    let _guard = PulledGuard(vec![a.clone(), b.clone(), c.clone(), owners.clone()]);
    // The owner pulled this one: it is on the machine before any probe asks for it.
    docker(&["pull", "-q", &owners]);
    let d = scope.docker();
    let mut images = ProbeImages::default();
    let mut probe = async |image: &str| {
        let spec = ProbeSpec::new(image, Duration::from_secs(20)).with_registries(&[reg.host()]);
        let out = ledger::probe_and_tidy(&d, &spec, &mut images).await;
        assert!(out.image_id.is_some(), "{image}: {:?}", out.report);
        out.pulled
    };
    let on_machine = |r: &str| exists("image", r);

    assert!(probe(&a).await && probe(&b).await, "pulled by the agent");
    assert!(on_machine(&a) && on_machine(&b), "the current and the previous stay");
    assert!(!probe(&owners).await, "already on the machine: not pulled");
    assert!(!on_machine(&a), "older than the previous probe image, pulled by the agent: removed");
    assert!(on_machine(&b) && on_machine(&owners));
    // An owner's container (no gpum label) uses `b`: it stays while that container exists.
    let user = scope.container_from(&format!("{}-user", scope.value), &b, &[], false);
    assert!(probe(&c).await);
    assert!(on_machine(&b), "an image a container uses is never removed");
    docker(&["rm", &user]);
    assert!(probe(&a).await, "pulled again, since it was removed");
    assert!(!on_machine(&b), "unused now, and older than the previous: removed");
    assert!(on_machine(&owners), "the owner pulled it: never removed");
    assert!(on_machine(&c) && on_machine(&a));
    assert_eq!(
        images.pulled.iter().map(|p| p.reference.as_str()).collect::<Vec<_>>(),
        [c.as_str(), a.as_str()]
    );
    assert!(scope.names().is_empty(), "{:?}", scope.names());
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn leftover_probes_are_removed_and_nothing_else() {
    let test = "probe_leftovers";
    require_docker(test);
    let scope = Scope::new(test);
    let busybox = images::busybox().unwrap();
    let probe_labels = ["gpum.probe=true", "gpum.probe.run=0123456789abcdef"];
    let named = |n: &str| format!("gpum-probe-{}-{n}", scope.value);
    let crashed = scope.container_from(&named("crashed"), &busybox, &probe_labels, true);
    let stopped = scope.container_from(&named("stopped"), &busybox, &probe_labels, false);
    let decoy = scope.container("decoy", &[], true);
    let not_true =
        scope.container_from(&named("false"), &busybox, &["gpum.probe=false", "gpum.probe.run=x"], false);
    // One label is not enough, and neither are both labels without the name.
    let one_label = scope.container_from(&named("one-label"), &busybox, &["gpum.probe=true"], false);
    let unnamed = scope.container("owner-named", &probe_labels, false);
    let mut removed = probe::cleanup_leftovers(&scope.docker()).await.expect("cleanup");
    removed.sort();
    let mut want = vec![crashed.clone(), stopped.clone()];
    want.sort();
    assert_eq!(removed, want);
    assert_eq!(scope.names(), HashSet::from([decoy, not_true, one_label, unnamed]));
}

/// Issue 14, item 3: the engine merges an image's labels into its containers. An owner's
/// containers from images that carry gpum's labels survive the reconciler, the leftover-probe
/// sweep and uninstall, even when named like a probe, and even with the label repeated on the
/// container (a label the image has is no proof). Containers gpum made are still found, so the
/// survival is not for want of looking.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn labels_inherited_from_an_image_are_not_gpum_s() {
    let test = "inherited";
    require_docker(test);
    let scope = Scope::new(test);
    let managed_img = images::custom("label-managed", &["LABEL gpum.managed=true"]).unwrap();
    let probe_img =
        images::custom("label-probe", &["LABEL gpum.probe=true", "LABEL gpum.probe.run=owner"]).unwrap();
    let busybox = images::busybox().unwrap();
    let owner_managed =
        scope.container_from(&format!("{}-owner-managed", scope.value), &managed_img, &[], true);
    let owner_managed_again = scope.container_from(
        &format!("{}-owner-managed-again", scope.value),
        &managed_img,
        &["gpum.managed=true"],
        false,
    );
    let owner_probe =
        scope.container_from(&format!("gpum-probe-{}-owner", scope.value), &probe_img, &[], true);
    let gpums = scope.container("gpums", &["gpum.managed=true"], false);
    let gpum_probe = scope.container_from(
        &format!("gpum-probe-{}-left", scope.value),
        &busybox,
        &["gpum.probe=true", "gpum.probe.run=0123"],
        false,
    );
    let d = scope.docker();
    // The engine's own filter sees the inherited labels: the agent must look further.
    let engine_sees = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label={}", scope.label()),
        "--filter",
        "label=gpum.managed=true",
        "--format",
        "{{.Names}}",
    ]);
    assert!(engine_sees.contains(&owner_managed), "{engine_sees}");

    let listed: HashSet<String> =
        reconcile::list_managed(&d).await.unwrap().into_iter().map(|c| c.name).collect();
    assert_eq!(listed, HashSet::from([gpums.clone()]));
    // Handed one by mistake, the reconciler refuses to touch it.
    for name in [&owner_managed, &owner_managed_again] {
        let c = ManagedContainer { id: id_of(name), name: name.clone(), state: "running".into() };
        assert!(matches!(
            reconcile::remove(&d, &c, Duration::from_secs(1)).await,
            Err(DockerError::NotManaged(_))
        ));
    }
    // A reconciler that decides on every listed container removes only gpum's.
    let mut r = Reconciler::new(1, Duration::ZERO);
    for c in r.decide(&reconcile::list_managed(&d).await.unwrap(), &HashSet::new(), Instant::now()) {
        reconcile::remove(&d, &c, Duration::from_secs(1)).await.unwrap();
    }
    assert_eq!(probe::cleanup_leftovers(&d).await.unwrap(), vec![gpum_probe]);
    let root = tempfile::tempdir().unwrap();
    let host = gpum_host::RealHost::with_root(root.path());
    let u = gpum_agent::uninstall::uninstall(&host, Ok(&d), gpum_common::Lang::En).await;
    assert!(u.errors.is_empty(), "{:?}", u.errors);
    assert_eq!(scope.names(), HashSet::from([owner_managed, owner_managed_again, owner_probe]));
}

// ---------------------------------------------------------------------------------------------
// Reconciler

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn reconciler_removes_only_unknown_managed_containers_after_the_grace() {
    let test = "reconcile";
    require_docker(test);
    let scope = Scope::new(test);
    let known_run = scope.container("known-running", &["gpum.managed=true"], true);
    let known_stopped = scope.container("known-stopped", &["gpum.managed=true"], false);
    let unknown_run = scope.container("unknown-running", &["gpum.managed=true"], true);
    let unknown_stopped = scope.container("unknown-stopped", &["gpum.managed=true"], false);
    let mine_run = scope.container("owner-running", &[], true);
    let mine_stopped = scope.container("owner-stopped", &[], false);
    let mine_false = scope.container("owner-managed-false", &["gpum.managed=false"], true);
    let d = scope.docker();

    let known: HashSet<String> = [id_of(&known_run), id_of(&known_stopped)].into();
    // The production thresholds (3 beats, 60 s), on a synthetic clock: the engine is real, the
    // time between heartbeats is not, so the test neither waits a minute nor races one.
    let mut r = Reconciler::default();
    let t0 = Instant::now();
    let at = |secs: u64| t0 + Duration::from_secs(secs);

    let present = reconcile::list_managed(&d).await.expect("list");
    let names: HashSet<String> = present.iter().map(|c| c.name.clone()).collect();
    assert_eq!(
        names,
        HashSet::from([
            known_run.clone(),
            known_stopped.clone(),
            unknown_run.clone(),
            unknown_stopped.clone()
        ])
    );
    assert!(present.iter().any(|c| c.state == "created") && present.iter().any(|c| c.state == "running"));
    // Three answers 10 s apart: three beats, but only 20 s.
    for secs in [0, 10, 20] {
        let present = reconcile::list_managed(&d).await.expect("list");
        assert!(r.decide(&present, &known, at(secs)).is_empty());
    }
    // 59 s: still young.
    let present = reconcile::list_managed(&d).await.expect("list");
    assert!(r.decide(&present, &known, at(59)).is_empty());
    assert_eq!(scope.names().len(), 7, "nothing removed before the grace");
    let present = reconcile::list_managed(&d).await.expect("list");
    let doomed = r.decide(&present, &known, at(60));
    let doomed_names: HashSet<String> = doomed.iter().map(|c| c.name.clone()).collect();
    assert_eq!(doomed_names, HashSet::from([unknown_run.clone(), unknown_stopped.clone()]));
    for c in &doomed {
        let rc = reconcile::remove(&d, c, Duration::from_secs(1)).await.expect("remove");
        assert_eq!((rc.id.as_str(), rc.name.as_str()), (c.id.as_str(), c.name.as_str()));
        assert_eq!(rc.reason, reconcile::REASON_UNKNOWN);
    }
    assert_eq!(
        scope.names(),
        HashSet::from([known_run, known_stopped, mine_run.clone(), mine_stopped, mine_false])
    );

    // Handed an unlabelled container by mistake, remove refuses and it survives.
    let fake = ManagedContainer { id: id_of(&mine_run), name: mine_run.clone(), state: "running".into() };
    assert!(matches!(
        reconcile::remove(&d, &fake, Duration::from_secs(1)).await,
        Err(DockerError::NotManaged(_))
    ));
    assert!(exists("container", &mine_run));
}

mod property {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 3,
            max_shrink_iters: 4,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        /// Random mixes of labelled/unlabelled, running/stopped containers, and random known
        /// sets over several rounds, against the real engine: no unlabelled container and no
        /// container known in the current answer is ever lost.
        #[ignore = "needs a Docker engine"]
        #[test]
        fn never_loses_an_unlabelled_or_known_container(
            mix in proptest::collection::vec((any::<bool>(), any::<bool>()), 2..6),
            knowns in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 6), 4),
        ) {
            require_docker("reconcile_property");
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let scope = Scope::new("reconcile-prop");
            let mut all = Vec::new();
            for (i, (managed, running)) in mix.iter().enumerate() {
                let labels: &[&str] = if *managed { &["gpum.managed=true"] } else { &[] };
                let name = scope.container(&format!("c{i}"), labels, *running);
                all.push((id_of(&name), name, *managed));
            }
            let d = scope.docker();
            let min_beats = 2;
            let mut r = Reconciler::new(min_beats, Duration::ZERO);
            // Unknown answers in a row per container, as the platform gave them.
            let mut streak: HashMap<String, u32> = HashMap::new();
            for known_bits in &knowns {
                let known: HashSet<String> = all
                    .iter()
                    .zip(known_bits)
                    .filter(|((_, _, managed), k)| *managed && **k)
                    .map(|((id, _, _), _)| id.clone())
                    .collect();
                let before = scope.names();
                for (id, name, managed) in &all {
                    if *managed && before.contains(name) && !known.contains(id) {
                        *streak.entry(id.clone()).or_default() += 1;
                    } else {
                        streak.remove(id);
                    }
                }
                let present = rt.block_on(reconcile::list_managed(&d)).unwrap();
                for c in r.decide(&present, &known, Instant::now()) {
                    rt.block_on(reconcile::remove(&d, &c, Duration::from_secs(1))).unwrap();
                }
                let alive = scope.names();
                for (id, name, managed) in &all {
                    if !managed {
                        prop_assert!(alive.contains(name), "lost unlabelled {}", name);
                    } else if before.contains(name) && !alive.contains(name) {
                        prop_assert!(!known.contains(id), "removed {} while the platform knew it", name);
                        let s = streak.get(id).copied().unwrap_or(0);
                        prop_assert!(s >= min_beats, "removed {} after {} unknown answers", name, s);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Docker down

/// A missing socket, a socket nobody listens on, and a socket that disappears after connecting:
/// clean errors and a `docker_unavailable` probe report, never a panic.
#[tokio::test]
async fn missing_or_dead_socket_is_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    assert!(matches!(Docker::connect(Some(&missing)), Err(DockerError::Unavailable(_))));

    let dead = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let d = Docker::connect(Some(&dead)).expect("the socket file exists");
    assert!(matches!(d.version().await, Err(DockerError::Unavailable(_))), "{:?}", d.version().await);
    assert!(matches!(reconcile::list_managed(&d).await, Err(DockerError::Unavailable(_))));
    let pinned = format!("nvidia/cuda@sha256:{}", "ab".repeat(32));
    let rep = probe::run_probe(&d, &pinned, Duration::from_secs(5), &default_registries()).await;
    assert_eq!(rep.reason, Some(ProbeFailure::DockerUnavailable), "{rep:?}");
    assert_eq!(rep.state, VerificationState::Failed);

    std::fs::remove_file(&dead).unwrap();
    assert!(
        matches!(d.has_nvidia_runtime().await, Err(DockerError::Unavailable(m)) if m.contains("not found"))
    );
    assert!(matches!(probe::cleanup_leftovers(&d).await, Err(DockerError::Unavailable(_))));
}

// ---------------------------------------------------------------------------------------------
// The engine connection

/// A relay on a Unix socket of its own in front of the real engine's socket: it counts the
/// connections it accepts, and can close every one of them at once (what an engine restart does
/// to its clients).
struct Relay {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    open: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    listener: tokio::task::JoinHandle<()>,
}

impl Relay {
    fn start() -> Relay {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (a, o) = (accepted.clone(), open.clone());
        let listener = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                o.lock().unwrap().push(tokio::spawn(async move {
                    let Ok(mut engine) = tokio::net::UnixStream::connect("/var/run/docker.sock").await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
                }));
            }
        });
        Relay { _dir: dir, path, accepted, open, listener }
    }
    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Closes every connection relayed so far, on both sides.
    fn close_all(&self) {
        for t in self.open.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.close_all();
        self.listener.abort();
    }
}

/// The agent keeps one connection to the engine between calls (a heartbeat lists the managed
/// containers every 10 s; a new connection each time cost system calls on both sides), and
/// when the engine closes it, as a restart does, the next call opens a new one and succeeds.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn the_engine_connection_is_kept_between_calls_and_renewed_after_a_close() {
    require_docker("the_engine_connection_is_kept_between_calls_and_renewed_after_a_close");
    let scope = Scope::new("keepalive");
    let relay = Relay::start();
    let d = scope.docker_at(Some(&relay.path));
    let c = scope.container("m", &["gpum.managed=true"], false);
    for _ in 0..5 {
        let listed = reconcile::list_managed(&d).await.expect("listed through the relay");
        assert_eq!(listed.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), [c.as_str()]);
    }
    d.version().await.expect("the version through the relay");
    assert_eq!(relay.accepted(), 1, "one connection for the negotiation, five lists and the version");

    relay.close_all();
    // The idle connection's task sees the close; the next call does not use it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let listed =
        reconcile::list_managed(&d).await.expect("listed again after the engine closed the connection");
    assert_eq!(listed.len(), 1);
    reconcile::list_managed(&d).await.unwrap();
    assert_eq!(relay.accepted(), 2, "a new connection after the close, then kept again");
}

/// Polls `w` for up to `within`; whether it was marked stale.
async fn stale_within(w: &Watch, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        if w.take_stale() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The engine's event stream marks the managed list stale when a managed container of the
/// scope is created or removed, also when the change came before the stream was open (the
/// subscription asks for the last second's events), and when the stream ends (the engine
/// restarted); a container without the label changes nothing.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn the_event_stream_marks_the_managed_list_stale() {
    require_docker("the_event_stream_marks_the_managed_list_stale");
    let scope = Scope::new("watch");
    let relay = Relay::start();
    let d = std::sync::Arc::new(scope.docker_at(Some(&relay.path)));
    let w = Watch::start(d.clone());
    assert!(w.take_stale(), "stale until a first list");
    // Created at once, very likely before the stream is open.
    let first = scope.container("first", &["gpum.managed=true"], false);
    assert!(stale_within(&w, Duration::from_secs(10)).await, "the creation of {first} was reported");
    // Quiet: one unlabelled container, in the scope.
    scope.container("owner", &[], false);
    assert!(!stale_within(&w, Duration::from_secs(2)).await, "an unlabelled container is not gpum's");
    docker(&["rm", "-f", &first]);
    assert!(stale_within(&w, Duration::from_secs(10)).await, "the removal of {first} was reported");
    assert!(!w.take_stale(), "taking the mark clears it");
    w.set_stale();
    assert!(w.take_stale());

    relay.close_all();
    assert!(stale_within(&w, Duration::from_secs(10)).await, "the end of the stream was reported");
    // The stream opens again (through a new connection) after a second, and reports the next
    // change. Its first events may repeat the last second's (over-reporting costs one list).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    w.take_stale();
    assert!(!stale_within(&w, Duration::from_secs(1)).await);
    scope.container("second", &["gpum.managed=true"], true);
    assert!(stale_within(&w, Duration::from_secs(10)).await, "a change after the stream opened again");
    assert!(relay.accepted() >= 2, "the stream opened again: {} connections", relay.accepted());
}

// ---------------------------------------------------------------------------------------------
// Uninstall

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn uninstall_on_a_scratch_root_removes_only_what_gpum_owns() {
    let test = "uninstall";
    require_docker(test);
    let scope = Scope::new(test);
    let root = tempfile::tempdir().unwrap();
    let put = |p: &str| {
        let p = root.path().join(p.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "x").unwrap();
    };
    let owned = [
        "/opt/gpum-agent/gpum-agent",
        "/etc/gpum-agent/config.toml",
        "/var/lib/gpum-agent/state.json",
        "/etc/systemd/system/gpum-agent.service",
    ];
    let decoys = [
        "/opt/gpum-agent-old/keep",
        "/opt/other/keep",
        "/etc/gpum-agent.conf.bak",
        "/etc/systemd/system/other.service",
        "/var/lib/docker-decoy/keep",
        "/var/lib/gpum-agent2/keep",
    ];
    owned.iter().chain(&decoys).for_each(|p| put(p));
    let managed = scope.container("managed", &["gpum.managed=true"], true);
    let probe_left = scope.container_from(
        &format!("gpum-probe-{}", scope.value),
        &images::busybox().unwrap(),
        &["gpum.probe=true", "gpum.probe.run=0123"],
        false,
    );
    let owner = scope.container("owner", &[], true);
    let owner_false = scope.container("owner-false", &["gpum.managed=false", "gpum.probe=false"], false);
    let image = images::busybox().unwrap();

    let host = gpum_host::RealHost::with_root(root.path());
    let d = scope.docker();
    let u = gpum_agent::uninstall::uninstall(&host, Ok(&d), gpum_common::Lang::En).await;
    assert!(u.errors.is_empty(), "{:?}", u.errors);
    assert!(u.notes.iter().any(|n| n.contains("systemd is not running")), "{:?}", u.notes);
    for p in owned {
        assert!(!root.path().join(p.trim_start_matches('/')).exists(), "{p} survived");
    }
    for p in ["/opt/gpum-agent", "/etc/gpum-agent", "/var/lib/gpum-agent"] {
        assert!(!root.path().join(p.trim_start_matches('/')).exists(), "{p} survived");
        assert!(u.removed.contains(&p.to_string()), "{:?}", u.removed);
    }
    for p in decoys {
        assert!(root.path().join(p.trim_start_matches('/')).exists(), "{p} was removed");
    }
    assert!(
        u.removed.iter().any(|r| r.contains(&managed)) && u.removed.iter().any(|r| r.contains(&probe_left))
    );
    assert_eq!(scope.names(), HashSet::from([owner, owner_false]));
    assert!(exists("image", &image), "images stay");
    let text = gpum_agent::uninstall::render(&u, gpum_common::Lang::En);
    assert!(
        text.contains("Removed:") && text.contains("/etc/gpum-agent") && text.contains(&managed),
        "{text}"
    );

    // A second run finds nothing and says so.
    let again = gpum_agent::uninstall::uninstall(&host, Ok(&d), gpum_common::Lang::En).await;
    assert!(again.removed.is_empty() && again.errors.is_empty());
    assert!(Path::new(&root.path().join("opt/other/keep")).exists());
}

/// The real binary, without `--yes` and without a terminal, refuses before touching anything.
#[test]
fn uninstall_without_yes_and_without_a_tty_refuses() {
    let out = Command::new(gpum_tests::bin("gpum-agent"))
        .args(["uninstall"])
        .env("LANG", "C.UTF-8")
        .env_remove("LC_ALL")
        .env_remove("LC_MESSAGES")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Nothing was removed") && stderr.contains("--yes"), "{stderr}");
}
