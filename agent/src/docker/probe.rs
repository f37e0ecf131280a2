//! The GPU probe: "Hardware verified" means `nvidia-smi` ran inside a container with
//! `--gpus all`.
//!
//! [`run_probe`] creates one container from the platform's image with command `nvidia-smi`,
//! the `--gpus all` device request (`DeviceRequest { Driver: "", Count: -1, Capabilities:
//! [["gpu"]] }`, exactly what the docker CLI sends), network mode `none` and the label
//! `gpum.probe=true`. It starts it, waits at most the given timeout, reads its output, and
//! force-removes it with its anonymous volumes in every outcome: success, failure, start
//! refused, timeout. If the agent dies mid-probe, [`cleanup_leftovers`] removes the container at
//! the next start. The image is pulled once when absent, with progress in the logs; images are
//! never removed.
//!
//! The result is a [`ProbeReport`]: verified, or failed with a [`ProbeFailure`] chosen by the
//! pure classifiers [`classify_start_error`] and [`classify_output`], and the output truncated to
//! [`PROBE_OUTPUT_MAX`] bytes. When the engine refuses the device request, the output is the
//! engine's message verbatim; an engine without the NVIDIA toolkit answers
//! `could not select device driver "" with capabilities: [[gpu]]`.
//!
//! The test seam. An engine without the NVIDIA toolkit refuses every `--gpus all` container, so
//! the success, `nvidia-smi` failure, timeout and NVML-error paths can only be exercised by a
//! probe that does not ask for GPUs and runs a *simulated* `nvidia-smi` (tests/sim/). That probe
//! is a [`ProbeSpec`] built by the hidden constructor [`ProbeSpec::simulation_without_gpu_request`],
//! which refuses any image outside the `gpum-test/` repository namespace. Production goes
//! through [`run_probe`], which always builds [`ProbeSpec::new`] and so always asks for all
//! GPUs; no configuration, environment variable or platform answer can reach the other
//! constructor. [`run_probe_with`] also returns what the engine said about the container
//! before it started ([`ProbeContainer`]), so tests can check its network mode, labels and
//! volumes against the engine rather than against our own request.
//!
//! A probe can take minutes when it pulls a large image: run it in its own task, not inline in
//! the heartbeat loop.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::container::{
    Config, CreateContainerOptions, LogsOptions, RemoveContainerOptions, WaitContainerOptions,
};
use bollard::image::CreateImageOptions;
use bollard::models::{DeviceRequest, HostConfig};
use futures_util::StreamExt;
use gpum_protocol::{PROBE_OUTPUT_MAX, ProbeFailure, ProbeReport, VerificationState};

use super::{Docker, DockerError, LABEL_PROBE, timed};

/// The probe's timeout when the caller has no reason to choose another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pull of the probe image may take.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The only repository namespace a probe without a GPU request may use (see the module docs).
pub const SIMULATION_IMAGE_PREFIX: &str = "gpum-test/";
/// What the probe runs.
pub const PROBE_COMMAND: &str = "nvidia-smi";

/// How one probe runs. Build it with [`ProbeSpec::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    image: String,
    timeout: Duration,
    pull_timeout: Duration,
    request_gpus: bool,
}

impl ProbeSpec {
    /// The production probe: `image`, all GPUs requested, `timeout` for start and run.
    pub fn new(image: &str, timeout: Duration) -> Self {
        Self { image: image.to_string(), timeout, pull_timeout: DEFAULT_PULL_TIMEOUT, request_gpus: true }
    }

    /// A probe that does NOT ask for GPUs, for tests of the simulated NVIDIA layer on an engine
    /// without the toolkit. Panics unless `image` is in the `gpum-test/` namespace.
    #[doc(hidden)]
    pub fn simulation_without_gpu_request(image: &str, timeout: Duration) -> Self {
        assert!(
            image.starts_with(SIMULATION_IMAGE_PREFIX),
            "a probe without a GPU request may only run a {SIMULATION_IMAGE_PREFIX} simulation image, not {image}"
        );
        Self { request_gpus: false, ..Self::new(image, timeout) }
    }

    /// Bounds the image pull (default [`DEFAULT_PULL_TIMEOUT`]).
    pub fn with_pull_timeout(mut self, d: Duration) -> Self {
        self.pull_timeout = d;
        self
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    pub fn requests_gpus(&self) -> bool {
        self.request_gpus
    }
}

/// What the engine said about the probe container after creating it, before starting it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProbeContainer {
    pub id: String,
    pub name: String,
    /// `HostConfig.NetworkMode`; always `none`.
    pub network_mode: String,
    pub labels: HashMap<String, String>,
    /// `(driver, count, capabilities)` of each device request.
    pub device_requests: Vec<(String, i64, Vec<Vec<String>>)>,
    /// Names of the volumes mounted into it (anonymous ones included).
    pub volumes: Vec<String>,
}

/// A probe's result plus what tests need to check how it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub report: ProbeReport,
    /// `None` when no container was created (engine down, pull failed, create refused).
    pub container: Option<ProbeContainer>,
    /// Whether the container was removed afterwards (true whenever one was created, unless the
    /// engine failed the removal; `cleanup_leftovers` retries at the next start).
    pub removed: bool,
}

/// Runs the production probe: `nvidia-smi` in `image` with all GPUs, no network, removed after.
pub async fn run_probe(docker: &Docker, image: &str, timeout: Duration) -> ProbeReport {
    run_probe_with(docker, &ProbeSpec::new(image, timeout)).await.report
}

/// Runs the probe `spec` describes. Never fails: every failure is a report.
pub async fn run_probe_with(docker: &Docker, spec: &ProbeSpec) -> ProbeOutcome {
    let fail = |reason, output: String| ProbeOutcome {
        report: report(spec, Some(reason), &output),
        container: None,
        removed: false,
    };
    let api = match docker.api().await {
        Ok(a) => a,
        Err(e) => return fail(ProbeFailure::DockerUnavailable, e.to_string()),
    };
    if let Err((reason, msg)) = ensure_image(docker, spec).await {
        return fail(reason, msg);
    }

    let name = format!("gpum-probe-{:016x}", rand::random::<u64>());
    let device_requests = spec.request_gpus.then(|| {
        vec![DeviceRequest {
            driver: Some(String::new()),
            count: Some(-1),
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            ..Default::default()
        }]
    });
    let config = Config {
        image: Some(spec.image.clone()),
        cmd: Some(vec![PROBE_COMMAND.to_string()]),
        labels: Some(docker.labels_for(LABEL_PROBE)),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_string()),
            device_requests,
            auto_remove: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };
    let create = CreateContainerOptions { name: name.clone(), platform: None };
    let id =
        match timed(async { api.create_container(Some(create), config).await.map_err(DockerError::from) })
            .await
        {
            Ok(r) => r.id,
            Err(e) => {
                let (reason, msg) = classify_engine_error(&e);
                tracing::warn!(image = %spec.image, error = %msg, "the probe container could not be created");
                return fail(reason, msg);
            }
        };
    tracing::info!(container = %name, id = %id, image = %spec.image, gpus = spec.request_gpus, "probe started");
    let container = inspect(docker, &id, &name).await;

    let run = run_container(api, &id, spec.timeout).await;
    let output = read_logs(api, &id).await;
    let (reason, output) = match run {
        Run::Exited(code) => (classify_output(code, &output), output),
        Run::StartRefused(e) | Run::Engine(e) => {
            let (reason, msg) = classify_engine_error(&e);
            (Some(reason), if output.is_empty() { msg } else { format!("{msg}\n{output}") })
        }
        Run::TimedOut => (Some(ProbeFailure::Timeout), output),
    };

    let removed = remove_probe(api, &id).await;
    let rep = report(spec, reason, &output);
    tracing::info!(container = %name, id = %id, state = ?rep.state, reason = ?rep.reason, removed, "probe finished");
    ProbeOutcome { report: rep, container: Some(container), removed }
}

/// Removes every `gpum.probe=true` container (with its anonymous volumes), such as one left
/// by an agent that crashed mid-probe. Returns the names removed.
pub async fn cleanup_leftovers(docker: &Docker) -> Result<Vec<String>, DockerError> {
    let removed = docker.remove_all_labelled(LABEL_PROBE, true).await?;
    if !removed.is_empty() {
        tracing::info!(count = removed.len(), containers = ?removed, "removed probe containers left by an earlier run");
    }
    Ok(removed)
}

enum Run {
    Exited(i64),
    StartRefused(DockerError),
    Engine(DockerError),
    TimedOut,
}

/// Starts the container and waits for it to exit, all within `timeout`.
async fn run_container(api: &bollard::Docker, id: &str, timeout: Duration) -> Run {
    let started = Instant::now();
    let fut = async {
        if let Err(e) = api.start_container::<String>(id, None).await {
            return Run::StartRefused(e.into());
        }
        let mut wait =
            api.wait_container(id, Some(WaitContainerOptions { condition: "not-running".to_string() }));
        match wait.next().await {
            Some(Ok(r)) => Run::Exited(r.status_code),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Run::Exited(code),
            Some(Err(e)) => Run::Engine(e.into()),
            None => Run::Engine(DockerError::Other("the engine ended the wait without an exit code".into())),
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(id, after_ms = started.elapsed().as_millis() as u64, "probe timed out");
            Run::TimedOut
        }
    }
}

/// Pulls the image when the engine does not have it, logging progress.
async fn ensure_image(docker: &Docker, spec: &ProbeSpec) -> Result<(), (ProbeFailure, String)> {
    let api = docker.api().await.map_err(|e| (ProbeFailure::DockerUnavailable, e.to_string()))?;
    match timed(async { api.inspect_image(&spec.image).await.map_err(DockerError::from) }).await {
        Ok(_) => return Ok(()),
        Err(DockerError::NotFound(_)) => {}
        Err(e @ DockerError::Unavailable(_)) => return Err((ProbeFailure::DockerUnavailable, e.to_string())),
        Err(e) => return Err((ProbeFailure::ImagePullFailed, e.to_string())),
    }
    tracing::info!(image = %spec.image, "pulling the probe image");
    // Without a tag the engine would pull every tag of the repository; `docker pull` means
    // `latest` then, and so do we.
    let tag = if has_tag_or_digest(&spec.image) { String::new() } else { "latest".to_string() };
    let opts = CreateImageOptions { from_image: spec.image.clone(), tag, ..Default::default() };
    let pull = async {
        let mut stream = api.create_image(Some(opts), None, None);
        let mut last_log = Instant::now();
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| e.to_string())?;
            if let Some(err) = info.error {
                return Err(err);
            }
            let status = info.status.unwrap_or_default();
            let layer = info.id.unwrap_or_default();
            // Byte-level progress arrives many times a second; log it every few seconds and
            // every other status (layer done, digest, finished) as it comes.
            if status == "Downloading" || status == "Extracting" {
                if last_log.elapsed() >= Duration::from_secs(5) {
                    last_log = Instant::now();
                    tracing::info!(layer = %layer, progress = %info.progress.unwrap_or_default(), "{status}");
                }
            } else {
                tracing::info!(layer = %layer, "pull: {status}");
            }
        }
        Ok(())
    };
    match tokio::time::timeout(spec.pull_timeout, pull).await {
        Ok(Ok(())) => {
            tracing::info!(image = %spec.image, "probe image pulled");
            Ok(())
        }
        Ok(Err(e)) => {
            tracing::warn!(image = %spec.image, error = %e, "pulling the probe image failed");
            Err((ProbeFailure::ImagePullFailed, format!("pulling {} failed: {e}", spec.image)))
        }
        Err(_) => Err((
            ProbeFailure::ImagePullFailed,
            format!("pulling {} took longer than {}s", spec.image, spec.pull_timeout.as_secs()),
        )),
    }
}

fn has_tag_or_digest(image: &str) -> bool {
    image.contains('@') || image.rsplit('/').next().is_some_and(|last| last.contains(':'))
}

async fn inspect(docker: &Docker, id: &str, name: &str) -> ProbeContainer {
    let mut c = ProbeContainer { id: id.to_string(), name: name.to_string(), ..Default::default() };
    let Ok(api) = docker.api().await else { return c };
    let Ok(info) = timed(async { api.inspect_container(id, None).await.map_err(DockerError::from) }).await
    else {
        return c;
    };
    if let Some(hc) = info.host_config {
        c.network_mode = hc.network_mode.unwrap_or_default();
        c.device_requests = hc
            .device_requests
            .unwrap_or_default()
            .into_iter()
            .map(|d| (d.driver.unwrap_or_default(), d.count.unwrap_or(0), d.capabilities.unwrap_or_default()))
            .collect();
    }
    c.labels = info.config.and_then(|c| c.labels).unwrap_or_default();
    c.volumes = info.mounts.unwrap_or_default().into_iter().filter_map(|m| m.name).collect();
    c
}

/// Reads up to [`PROBE_OUTPUT_MAX`] bytes of the container's stdout and stderr, in order.
async fn read_logs(api: &bollard::Docker, id: &str) -> String {
    let opts = LogsOptions::<String> { stdout: true, stderr: true, follow: false, ..Default::default() };
    let mut stream = api.logs(id, Some(opts));
    let mut buf: Vec<u8> = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            buf.extend_from_slice(&chunk.into_bytes());
            // One byte more than the limit, so truncation shows.
            if buf.len() > PROBE_OUTPUT_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(super::CALL_TIMEOUT, read).await;
    String::from_utf8_lossy(&buf).into_owned()
}

async fn remove_probe(api: &bollard::Docker, id: &str) -> bool {
    let opts = RemoveContainerOptions { v: true, force: true, link: false };
    match timed(async { api.remove_container(id, Some(opts)).await.map_err(DockerError::from) }).await {
        Ok(()) | Err(DockerError::NotFound(_)) => true,
        Err(e) => {
            tracing::warn!(id, error = %e, "could not remove the probe container; it goes at the next start");
            false
        }
    }
}

fn report(spec: &ProbeSpec, reason: Option<ProbeFailure>, output: &str) -> ProbeReport {
    let finished_at = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    ProbeReport {
        state: if reason.is_some() { VerificationState::Failed } else { VerificationState::Verified },
        reason,
        output: truncate_output(output),
        finished_at,
        image: spec.image.clone(),
    }
}

/// The output cut to at most [`PROBE_OUTPUT_MAX`] bytes, on a character boundary.
pub fn truncate_output(s: &str) -> String {
    if s.len() <= PROBE_OUTPUT_MAX {
        return s.to_string();
    }
    let mut end = PROBE_OUTPUT_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Why a finished `nvidia-smi` failed, from its exit code and output; `None` when it passed.
///
/// NVML's own words win over the exit code: "Failed to initialize NVML: Unknown Error" (the
/// container lost its device cgroup, typically after a `systemctl daemon-reload`) and
/// "Driver/library version mismatch" (the driver was upgraded without a reboot) each have their
/// own reason, because each has its own fix.
pub fn classify_output(exit_code: i64, output: &str) -> Option<ProbeFailure> {
    let lower = output.to_ascii_lowercase();
    if lower.contains("failed to initialize nvml: unknown error") {
        Some(ProbeFailure::NvmlUnknownError)
    } else if lower.contains("driver/library version mismatch") {
        Some(ProbeFailure::DriverLibraryMismatch)
    } else if exit_code != 0 {
        Some(ProbeFailure::NvidiaSmiFailed)
    } else {
        None
    }
}

/// Why the engine refused to create or start the probe container, from its message.
pub fn classify_start_error(message: &str) -> ProbeFailure {
    let lower = message.to_ascii_lowercase();
    if lower.contains("could not select device driver") {
        // The engine has no device driver for `--gpus`: the NVIDIA Container Toolkit's hook is
        // not installed. This machine's engine answers this way.
        ProbeFailure::DeviceRequestRefused
    } else if lower.contains("unknown or invalid runtime name: nvidia")
        || (lower.contains("nvidia-container-runtime") && lower.contains("not found"))
    {
        ProbeFailure::NoNvidiaRuntime
    } else if lower.contains("driver/library version mismatch") {
        ProbeFailure::DriverLibraryMismatch
    } else if lower.contains("nvml") && lower.contains("unknown error") {
        ProbeFailure::NvmlUnknownError
    } else if lower.contains("nvidia-container-cli") || lower.contains("nvidia-container") {
        // The toolkit ran and refused the request (no devices, driver not loaded, ...).
        ProbeFailure::DeviceRequestRefused
    } else {
        ProbeFailure::NvidiaSmiFailed
    }
}

fn classify_engine_error(e: &DockerError) -> (ProbeFailure, String) {
    match e {
        DockerError::Unavailable(_) => (ProbeFailure::DockerUnavailable, e.to_string()),
        DockerError::Api { message, .. } | DockerError::NotFound(message) | DockerError::Other(message) => {
            (classify_start_error(message), message.clone())
        }
        DockerError::NotManaged(_) => (ProbeFailure::NvidiaSmiFailed, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_real_engine_answers() {
        // This machine's Docker 20.10 without the toolkit, verbatim.
        assert_eq!(
            classify_start_error(r#"could not select device driver "" with capabilities: [[gpu]]"#),
            ProbeFailure::DeviceRequestRefused
        );
        assert_eq!(
            classify_start_error("unknown or invalid runtime name: nvidia"),
            ProbeFailure::NoNvidiaRuntime
        );
        assert_eq!(
            classify_start_error(
                "OCI runtime create failed: container_linux.go:380: starting container process caused: \
                 process_linux.go:545: container init caused: Running hook #0:: error running hook: exit \
                 status 1, stdout: , stderr: nvidia-container-cli: initialization error: nvml error: \
                 driver/library version mismatch: unknown"
            ),
            ProbeFailure::DriverLibraryMismatch
        );
        assert_eq!(
            classify_start_error(
                "failed to create shim task: OCI runtime create failed: runc create failed: unable to start \
                 container process: error during container init: error running hook #0: error running hook: \
                 exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: \
                 initialization error: load library failed: libnvidia-ml.so.1: cannot open shared object file"
            ),
            ProbeFailure::DeviceRequestRefused
        );
        assert_eq!(
            classify_start_error(r#"exec: "nvidia-smi": executable file not found in $PATH: unknown"#),
            ProbeFailure::NvidiaSmiFailed
        );
    }

    #[test]
    fn classifies_nvidia_smi_output() {
        assert_eq!(classify_output(0, "| NVIDIA-SMI 550.54.15  Driver Version: 550.54.15 |"), None);
        assert_eq!(
            classify_output(255, "Failed to initialize NVML: Unknown Error\n"),
            Some(ProbeFailure::NvmlUnknownError)
        );
        assert_eq!(
            classify_output(
                18,
                "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90"
            ),
            Some(ProbeFailure::DriverLibraryMismatch)
        );
        assert_eq!(
            classify_output(
                9,
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
            ),
            Some(ProbeFailure::NvidiaSmiFailed)
        );
        // The NVML text decides even when the exit code claims success.
        assert_eq!(
            classify_output(0, "Failed to initialize NVML: Unknown Error"),
            Some(ProbeFailure::NvmlUnknownError)
        );
    }

    #[test]
    fn truncates_on_a_char_boundary() {
        let s = "я".repeat(PROBE_OUTPUT_MAX); // two bytes each
        let t = truncate_output(&s);
        assert!(t.len() <= PROBE_OUTPUT_MAX && t.len() >= PROBE_OUTPUT_MAX - 1);
        assert!(s.starts_with(&t));
        assert_eq!(truncate_output("short"), "short");
    }

    #[test]
    fn untagged_images_mean_latest() {
        assert!(!has_tag_or_digest("nvidia/cuda"));
        assert!(!has_tag_or_digest("localhost:5000/nvidia/cuda"));
        assert!(has_tag_or_digest("localhost:5000/nvidia/cuda:12.4.1-base-ubuntu22.04"));
        assert!(has_tag_or_digest("nvidia/cuda@sha256:abc"));
    }

    #[test]
    fn production_spec_asks_for_gpus_and_the_seam_is_fenced() {
        assert!(ProbeSpec::new("nvidia/cuda:12.4.1-base-ubuntu22.04", DEFAULT_TIMEOUT).requests_gpus());
        let sim = ProbeSpec::simulation_without_gpu_request("gpum-test/busybox:1-ok", DEFAULT_TIMEOUT);
        assert!(!sim.requests_gpus());
        let r = std::panic::catch_unwind(|| {
            ProbeSpec::simulation_without_gpu_request("nvidia/cuda:12.4.1-base-ubuntu22.04", DEFAULT_TIMEOUT)
        });
        assert!(r.is_err(), "a real image must never run without the GPU request");
    }
}
