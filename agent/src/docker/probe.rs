//! The GPU probe: "Hardware verified" means `nvidia-smi` ran inside a container with
//! `--gpus all`.
//!
//! The platform names the image; everything else about the container is the agent's, so that a
//! compromised platform (or a leaked admin token) gets as little as possible out of it:
//! - **The image** must be pinned by digest (`name@sha256:<64 hex>`) and come from a registry
//!   in the node's `probe_registries` ([`super::image`]); anything else is a failed probe
//!   (`image_not_pinned`, `registry_not_accepted`) and nothing is pulled. A local image counts
//!   when its `RepoDigests` hold the reference, or when its id is the digest (an image loaded
//!   with `docker load` has no repository digest). Otherwise it is pulled by digest and
//!   checked again. The container is created from the image *id*. A pull stops, and what it
//!   brought is removed, once the image is larger than [`MAX_IMAGE_BYTES`] (see
//!   [`ProbeSpec::max_image_bytes`]).
//! - **What runs** is the agent's entrypoint, [`PROBE_COMMAND`] (`/usr/bin/nvidia-smi`, by its
//!   absolute path) with no arguments: the image's entrypoint, command and healthcheck never run.
//!   That path is where the NVIDIA Container Toolkit mounts the host's `nvidia-smi` into a
//!   container that asks for GPUs, over whatever file the image has there; a bare `nvidia-smi`
//!   would be looked up through the image's `PATH`, and an image with its own
//!   `/usr/local/bin/nvidia-smi` could print a success of its own (issue 29, item 4).
//!   [`PROBE_ENV`] sets `PATH` to [`PROBE_PATH`] and empties `LD_PRELOAD` and `LD_AUDIT` over the
//!   image's environment.
//! - **What it may do**: every capability dropped, `no-new-privileges`, a read-only root
//!   filesystem, [`PIDS_LIMIT`] processes, [`MEMORY_LIMIT_BYTES`] of memory, network `none`, not
//!   privileged. It asks for all GPUs (`DeviceRequest { Driver: "", Count: -1, Capabilities:
//!   [["gpu"]] }`, exactly what the docker CLI sends for `--gpus all`, and the toolkit's
//!   device-list mount for `all`, [`super::rental::gpu_list_mounts`], which is what the toolkit
//!   reads for an unprivileged container once the installer turned its environment variable off)
//!   and nothing else.
//! - **Its marks**: the labels `gpum.probe=true` and `gpum.probe.run=<this run's id>`, and a
//!   name starting `gpum-probe-`.
//!
//! [`run_probe`] starts it, waits at most the given timeout, reads its output, and force-removes
//! it with its anonymous volumes in every outcome: success, failure, start refused, timeout. If
//! the agent dies mid-probe, [`cleanup_leftovers`] removes the container at the next start.
//! The only images ever removed are probe images the agent pulled itself ([`super::ledger`]: an
//! image over the size cap at once, others once they are neither the current nor the previous
//! probe image). A pull failure is reported to the platform as its class (`image_pull_failed`)
//! with a fixed text: the engine's words, which can quote an internal service's reply and
//! address, stay in this machine's log.
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
//! constructor; the simulation probe is hardened and checked exactly like the production one.
//! Without the toolkit nothing is mounted over `/usr/bin/nvidia-smi`; a `test-knobs` build can
//! add [`ProbeSpec::with_simulated_toolkit`], which bind-mounts a simulated `nvidia-smi` there
//! read-only, as the toolkit does (`tests/sim/toolkit/` does the same in the test host).
//! [`run_probe_with`] also returns what the engine said about the container before it started
//! ([`ProbeContainer`]), so tests can check its network mode, labels, entrypoint, limits and
//! volumes against the engine rather than against our own request.
//!
//! A probe can take minutes when it pulls a large image: run it in its own task, not inline in
//! the heartbeat loop.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bollard::container::{
    Config, CreateContainerOptions, LogsOptions, RemoveContainerOptions, WaitContainerOptions,
};
use bollard::image::{CreateImageOptions, RemoveImageOptions};
use bollard::models::{DeviceRequest, HealthConfig, HostConfig};
use futures_util::StreamExt;
use gpum_protocol::{PROBE_OUTPUT_MAX, ProbeFailure, ProbeReport, VerificationState};

use super::image::{DEFAULT_REGISTRIES, PinnedImage, RefError};
use super::{Docker, DockerError, LABEL_PROBE, LABEL_PROBE_RUN, PROBE, PROBE_NAME_PREFIX, timed};

/// The probe's timeout when the caller has no reason to choose another.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pull of the probe image may take.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// The only repository namespace a probe without a GPU request may use (see the module docs).
pub const SIMULATION_IMAGE_PREFIX: &str = "gpum-test/";
/// Where the NVIDIA Container Toolkit mounts the host's `nvidia-smi` into a container that asks
/// for GPUs, over any file of that name the image has: libnvidia-container puts the driver's
/// utilities in `/usr/bin`, and a CDI spec mounts the host's `/usr/bin/nvidia-smi` at the same
/// path.
pub const TOOLKIT_NVIDIA_SMI: &str = "/usr/bin/nvidia-smi";
/// What the probe runs: the container's entrypoint, set by the agent, with no arguments: the
/// toolkit's `nvidia-smi`, by its absolute path. The image's own entrypoint and command never
/// run, and a bare name would be looked up through the image's `PATH`, where its own
/// `/usr/local/bin/nvidia-smi` comes first.
pub const PROBE_COMMAND: &str = TOOLKIT_NVIDIA_SMI;
/// The `PATH` the probe runs with, over the image's (`nvidia-smi` itself needs none; a program it
/// starts finds only the toolkit's and the image's system directories).
pub const PROBE_PATH: &str = "/usr/bin:/bin";
/// The most processes the probe container may hold (`nvidia-smi` needs a handful).
pub const PIDS_LIMIT: i64 = 64;
/// The probe container's memory limit, swap included.
pub const MEMORY_LIMIT_BYTES: i64 = 256 * 1024 * 1024;
/// Environment the agent sets in the probe, overriding the image's: the dynamic loader's
/// injection variables are emptied, so that an image's `LD_PRELOAD` reaches neither
/// `nvidia-smi` nor a container hook that inherits the container's environment (the way of
/// CVE-2025-23266 on NVIDIA Container Toolkit 1.17.7 and older; the audit refuses those too), and
/// `PATH` is the agent's [`PROBE_PATH`].
pub const PROBE_ENV: [&str; 3] = ["LD_PRELOAD=", "LD_AUDIT=", "PATH=/usr/bin:/bin"];
/// The largest probe image the agent keeps: what a pull may announce (the layers' sizes as the
/// engine reports them while downloading) and what the pulled image may take on disk. The probe
/// needs nothing of its own (`nvidia-smi` comes from the toolkit); NVIDIA's CUDA base images are
/// about 250 MB. A larger image is removed and the probe fails as `image_pull_failed`.
pub const MAX_IMAGE_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// The only output a refused or failed pull reports: the engine's own words may quote an
/// internal service's reply and its address, and go no further than this machine's log.
pub const PULL_FAILED_OUTPUT: &str = "pulling the probe image failed (details are in the agent's log)";

/// This agent run's probe id, the value of every probe's `gpum.probe.run` label.
pub fn run_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

/// How one probe runs. Build it with [`ProbeSpec::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    image: String,
    registries: Vec<String>,
    timeout: Duration,
    pull_timeout: Duration,
    request_gpus: bool,
    max_image_bytes: u64,
    /// A simulated `nvidia-smi` on this machine, bind-mounted read-only at [`TOOLKIT_NVIDIA_SMI`]
    /// (simulation probes of a `test-knobs` build only).
    simulated_toolkit: Option<PathBuf>,
    /// Exactly these GPUs, by UUID, instead of all (the self-test before GPUs change hands,
    /// [`super::gpucheck`]).
    gpu_uuids: Option<Vec<String>>,
}

impl ProbeSpec {
    /// The production probe: `image`, all GPUs requested, `timeout` for start and run, the
    /// default accepted registries (see [`ProbeSpec::with_registries`]). The image is checked
    /// when the probe runs: a reference that is not pinned by digest, or not from an accepted
    /// registry, is a failed probe, and nothing is pulled.
    pub fn new(image: &str, timeout: Duration) -> Self {
        Self {
            image: image.to_string(),
            registries: DEFAULT_REGISTRIES.iter().map(|s| s.to_string()).collect(),
            timeout,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            request_gpus: true,
            max_image_bytes: MAX_IMAGE_BYTES,
            simulated_toolkit: None,
            gpu_uuids: None,
        }
    }

    /// Asks for exactly `uuids` (a device request by UUID, as a rental's) rather than all GPUs:
    /// the self-test of the GPUs a rental is about to get ([`super::gpucheck`]).
    pub fn on_gpus(mut self, uuids: &[String]) -> Self {
        self.gpu_uuids = Some(uuids.to_vec());
        self
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

    /// The registries the image may come from (the config's `probe_registries`).
    pub fn with_registries(mut self, registries: &[String]) -> Self {
        self.registries = registries.to_vec();
        self
    }

    /// Bounds the image pull (default [`DEFAULT_PULL_TIMEOUT`]).
    pub fn with_pull_timeout(mut self, d: Duration) -> Self {
        self.pull_timeout = d;
        self
    }

    /// Lowers the image size cap (default [`MAX_IMAGE_BYTES`]), so that tests can pull an image
    /// over it without pulling gigabytes. `test-knobs` builds only.
    #[cfg(any(test, feature = "test-knobs"))]
    #[doc(hidden)]
    pub fn with_max_image_bytes(mut self, bytes: u64) -> Self {
        self.max_image_bytes = bytes;
        self
    }

    /// Mounts `nvidia_smi` (a file on the engine's machine) read-only at [`TOOLKIT_NVIDIA_SMI`], as the
    /// NVIDIA Container Toolkit mounts the host's over whatever the image has there. Only for a
    /// probe without a GPU request (panics otherwise), in `test-knobs` builds.
    #[cfg(any(test, feature = "test-knobs"))]
    #[doc(hidden)]
    pub fn with_simulated_toolkit(mut self, nvidia_smi: &std::path::Path) -> Self {
        assert!(!self.request_gpus, "only a probe without a GPU request gets the simulated toolkit");
        self.simulated_toolkit = Some(nvidia_smi.to_path_buf());
        self
    }

    /// The largest image this probe keeps (see [`MAX_IMAGE_BYTES`]).
    pub fn max_image_bytes(&self) -> u64 {
        self.max_image_bytes
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
    /// The image id the container was created from.
    pub image_id: String,
    /// `HostConfig.NetworkMode`; always `none`.
    pub network_mode: String,
    pub labels: HashMap<String, String>,
    /// `(driver, count, capabilities)` of each device request.
    pub device_requests: Vec<(String, i64, Vec<Vec<String>>)>,
    /// Names of the volumes mounted into it (anonymous ones included).
    pub volumes: Vec<String>,
    /// `Config.Entrypoint` and `Config.Cmd` as the engine merged them with the image's.
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `Config.Healthcheck.Test`.
    pub healthcheck: Vec<String>,
    /// `Config.Env`: the image's environment merged with the agent's [`PROBE_ENV`].
    pub env: Vec<String>,
    /// `HostConfig.CapDrop`, `CapAdd`, `SecurityOpt`, `ReadonlyRootfs`, `PidsLimit`, `Memory`,
    /// `Privileged`.
    pub cap_drop: Vec<String>,
    pub cap_add: Vec<String>,
    pub security_opt: Vec<String>,
    pub readonly_rootfs: bool,
    pub pids_limit: Option<i64>,
    pub memory: Option<i64>,
    pub privileged: bool,
}

/// A probe's result plus what tests need to check how it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeOutcome {
    pub report: ProbeReport,
    /// `None` when no container was created (image refused, engine down, pull failed, create
    /// refused).
    pub container: Option<ProbeContainer>,
    /// Whether the container was removed afterwards (true whenever one was created, unless the
    /// engine failed the removal; `cleanup_leftovers` retries at the next start).
    pub removed: bool,
    /// Whether the engine was asked to pull.
    pub pulled: bool,
    /// The id of the image the probe ran (or was to run), once the engine had it.
    pub image_id: Option<String>,
    /// The reference this probe pulled the image by, when it pulled it and the image stayed:
    /// what [`super::ledger`] records as the agent's own.
    pub pulled_reference: Option<String>,
}

/// Runs the production probe: `nvidia-smi` in `image` with all GPUs, no network, removed after;
/// `image` must be pinned by digest and come from one of `registries`.
pub async fn run_probe(
    docker: &Docker,
    image: &str,
    timeout: Duration,
    registries: &[String],
) -> ProbeReport {
    run_probe_with(docker, &ProbeSpec::new(image, timeout).with_registries(registries)).await.report
}

/// Runs the probe `spec` describes. Never fails: every failure is a report.
pub async fn run_probe_with(docker: &Docker, spec: &ProbeSpec) -> ProbeOutcome {
    let fail = |reason, output: String, pulled| ProbeOutcome {
        report: report(spec, Some(reason), &output),
        container: None,
        removed: false,
        pulled,
        image_id: None,
        pulled_reference: None,
    };
    // The reference first, before the engine is asked anything: a refused image is never pulled.
    let image = match PinnedImage::parse(&spec.image)
        .and_then(|i| i.check_registry(&spec.registries).map(|()| i))
    {
        Ok(i) => i,
        Err(e) => {
            let reason = match e {
                RefError::NotPinned | RefError::Invalid => ProbeFailure::ImageNotPinned,
                RefError::RegistryNotAccepted(_) => ProbeFailure::RegistryNotAccepted,
            };
            tracing::warn!(image = %spec.image, error = %e, "refused the probe image; nothing was pulled");
            return fail(reason, e.to_string(), false);
        }
    };
    let api = match docker.api().await {
        Ok(a) => a,
        Err(e) => return fail(ProbeFailure::DockerUnavailable, e.to_string(), false),
    };
    let (image_id, pulled) = match ensure_image(docker, spec, &image).await {
        Ok(x) => x,
        Err((reason, msg, pulled)) => return fail(reason, msg, pulled),
    };
    let pulled_reference = pulled.then(|| image.to_string());
    let fail = |reason, output: String| ProbeOutcome {
        image_id: Some(image_id.clone()),
        pulled_reference: pulled_reference.clone(),
        ..fail(reason, output, pulled)
    };

    let name = format!("{PROBE_NAME_PREFIX}{:016x}", rand::random::<u64>());
    let device_requests = spec.request_gpus.then(|| {
        vec![DeviceRequest {
            driver: Some(String::new()),
            count: spec.gpu_uuids.is_none().then_some(-1),
            device_ids: spec.gpu_uuids.clone(),
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            ..Default::default()
        }]
    });
    // What the toolkit does for a GPU container, done by the simulation for one without.
    let mounts = spec.request_gpus.then(|| super::rental::gpu_list_mounts(&["all".to_string()]));
    let binds =
        spec.simulated_toolkit.as_ref().map(|p| vec![format!("{}:{TOOLKIT_NVIDIA_SMI}:ro", p.display())]);
    let config = Config {
        // By id: what was checked is what runs, whatever a tag or digest points to meanwhile.
        image: Some(image_id.clone()),
        entrypoint: Some(vec![PROBE_COMMAND.to_string()]),
        cmd: Some(Vec::new()),
        env: Some(PROBE_ENV.iter().map(|s| s.to_string()).collect()),
        labels: Some(docker.labels_for(LABEL_PROBE, &[(LABEL_PROBE_RUN, run_id())])),
        // An image's HEALTHCHECK would run the image's command inside the container.
        healthcheck: Some(HealthConfig { test: Some(vec!["NONE".to_string()]), ..Default::default() }),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_string()),
            device_requests,
            mounts,
            binds,
            auto_remove: Some(false),
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".to_string()]),
            security_opt: Some(vec!["no-new-privileges:true".to_string()]),
            readonly_rootfs: Some(true),
            pids_limit: Some(PIDS_LIMIT),
            memory: Some(MEMORY_LIMIT_BYTES),
            memory_swap: Some(MEMORY_LIMIT_BYTES),
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
    tracing::info!(container = %name, id = %id, image = %spec.image, image_id = %image_id, gpus = spec.request_gpus, "probe started");
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
    ProbeOutcome {
        report: rep,
        container: Some(container),
        removed,
        pulled,
        image_id: Some(image_id),
        pulled_reference,
    }
}

/// Removes every probe container (`gpum.probe=true` and `gpum.probe.run` set on the container,
/// named `gpum-probe-…`) with its anonymous volumes, such as one left by an agent that crashed
/// mid-probe. Returns the names removed.
pub async fn cleanup_leftovers(docker: &Docker) -> Result<Vec<String>, DockerError> {
    let removed = docker.remove_all_marked(PROBE, true).await?;
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

/// The id of the local image `image` names, if the engine has it (see [`local_image`]); the
/// rentals find their images the same way.
pub(crate) async fn local_image_id(
    docker: &Docker,
    image: &PinnedImage,
) -> Result<Option<String>, DockerError> {
    local_image(docker.api().await?, image).await
}

/// The id of the local image `image` names, if the engine has it: an image whose
/// `RepoDigests` hold that reference (pulled by it), or whose id is its digest (loaded with
/// `docker load`, which records no repository digest).
async fn local_image(api: &bollard::Docker, image: &PinnedImage) -> Result<Option<String>, DockerError> {
    match timed(async { api.inspect_image(&image.to_string()).await.map_err(DockerError::from) }).await {
        Ok(i) if i.repo_digests.as_deref().unwrap_or_default().iter().any(|d| image.is_repo_digest(d)) => {
            if let Some(id) = i.id {
                return Ok(Some(id));
            }
        }
        Ok(_) | Err(DockerError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let digest = image.digest();
    match timed(async { api.inspect_image(&digest).await.map_err(DockerError::from) }).await {
        Ok(i) if i.id.as_deref() == Some(digest.as_str()) => Ok(Some(digest)),
        Ok(_) | Err(DockerError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The id of the image to run: the local one, else pulled by digest (progress in the logs) and
/// checked again. Errors carry whether a pull was attempted. A pull failure is reported as its
/// class only; the engine's words go to this machine's log.
///
/// The size cap ([`ProbeSpec::max_image_bytes`]): while the pull runs, the sizes the engine
/// reports for the layers it downloads are added up, and the pull is dropped (the engine cancels
/// it with the request) as soon as they exceed the cap; once pulled, the image's size on disk is
/// checked too. Either way what the pull left under this reference is removed (only the
/// reference the agent pulled: an image the machine holds under another name stays) and the
/// probe fails as `image_pull_failed` with [`image_too_large_output`]. The engine's API cannot
/// say an image's size before the pull (its distribution endpoint gives the manifest's size
/// only), so the bound is what one pull may download before it is stopped.
async fn ensure_image(
    docker: &Docker,
    spec: &ProbeSpec,
    image: &PinnedImage,
) -> Result<(String, bool), (ProbeFailure, String, bool)> {
    let api = docker.api().await.map_err(|e| (ProbeFailure::DockerUnavailable, e.to_string(), false))?;
    let engine_failed = |e: DockerError, pulled| match e {
        e @ DockerError::Unavailable(_) => (ProbeFailure::DockerUnavailable, e.to_string(), pulled),
        e => {
            tracing::warn!(image = %image, error = %e, "could not look up the probe image");
            (ProbeFailure::ImagePullFailed, PULL_FAILED_OUTPUT.to_string(), pulled)
        }
    };
    if let Some(id) = local_image(api, image).await.map_err(|e| engine_failed(e, false))? {
        return Ok((id, false));
    }
    let cap = spec.max_image_bytes;
    let too_large = || (ProbeFailure::ImagePullFailed, image_too_large_output(cap), true);
    tracing::info!(image = %image, "pulling the probe image");
    let opts = CreateImageOptions { from_image: image.to_string(), ..Default::default() };
    let pull = async {
        let mut stream = api.create_image(Some(opts), None, None);
        let mut last_log = Instant::now();
        let mut layers = LayerSizes::default();
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| Pull::Failed(e.to_string()))?;
            if let Some(err) = info.error {
                return Err(Pull::Failed(err));
            }
            let status = info.status.unwrap_or_default();
            let layer = info.id.unwrap_or_default();
            if let Some(d) = &info.progress_detail
                && status == "Downloading"
                && layers.saw(&layer, d.current, d.total) > cap
            {
                // Dropping the stream closes the request, and the engine cancels the pull.
                return Err(Pull::TooLarge(layers.total()));
            }
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
        Ok(Ok(())) => {}
        Ok(Err(Pull::Failed(e))) => {
            tracing::warn!(image = %image, error = %e, "pulling the probe image failed");
            return Err((ProbeFailure::ImagePullFailed, PULL_FAILED_OUTPUT.to_string(), true));
        }
        Ok(Err(Pull::TooLarge(bytes))) => {
            tracing::warn!(image = %image, announced_bytes = bytes, cap_bytes = cap, "the probe image is larger than the agent accepts; pull stopped");
            remove_pulled(api, image).await;
            return Err(too_large());
        }
        Err(_) => {
            tracing::warn!(image = %image, secs = spec.pull_timeout.as_secs(), "pulling the probe image took too long");
            remove_pulled(api, image).await;
            return Err((
                ProbeFailure::ImagePullFailed,
                format!("pulling the probe image took longer than {}s", spec.pull_timeout.as_secs()),
                true,
            ));
        }
    }
    let size =
        match timed(async { api.inspect_image(&image.to_string()).await.map_err(DockerError::from) }).await {
            Ok(i) => i.size.map(|s| u64::try_from(s).unwrap_or(0)),
            Err(_) => None,
        };
    if let Some(size) = size.filter(|s| *s > cap) {
        tracing::warn!(image = %image, size_bytes = size, cap_bytes = cap, "the pulled probe image is larger than the agent accepts; removing it");
        remove_pulled(api, image).await;
        return Err(too_large());
    }
    match local_image(api, image).await.map_err(|e| engine_failed(e, true))? {
        Some(id) => {
            tracing::info!(image = %image, id = %id, size_bytes = size.unwrap_or(0), "probe image pulled");
            Ok((id, true))
        }
        None => {
            tracing::warn!(image = %image, "the engine pulled, but holds no image with that digest");
            Err((ProbeFailure::ImagePullFailed, PULL_FAILED_OUTPUT.to_string(), true))
        }
    }
}

/// How a pull went wrong.
enum Pull {
    /// The engine's words (they stay in this machine's log).
    Failed(String),
    /// The layers announced more than the cap: the sum so far.
    TooLarge(u64),
}

/// The sizes of the layers a pull downloads, as its progress reports them: per layer the larger
/// of its announced total and what has arrived (a registry that announces no size is still
/// bounded by what it sends).
#[derive(Debug, Default)]
struct LayerSizes(HashMap<String, u64>);

impl LayerSizes {
    /// Records one progress report of `layer`; returns the sum over all layers.
    fn saw(&mut self, layer: &str, current: Option<i64>, total: Option<i64>) -> u64 {
        let bytes = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0);
        let seen = bytes(current).max(bytes(total));
        let entry = self.0.entry(layer.to_string()).or_default();
        *entry = (*entry).max(seen);
        self.total()
    }

    fn total(&self) -> u64 {
        self.0.values().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// The fixed text a probe reports when its image is over the cap.
pub fn image_too_large_output(cap: u64) -> String {
    format!("the probe image is larger than this agent accepts ({} MiB); it was removed", cap / (1024 * 1024))
}

/// Removes the reference `image` that this agent's pull just added, if it is there: not forced,
/// so an image a container uses stays, and by reference, so the same image under another name
/// stays as well.
async fn remove_pulled(api: &bollard::Docker, image: &PinnedImage) {
    let opts = RemoveImageOptions { force: false, noprune: false };
    let reference = image.to_string();
    match timed(async { api.remove_image(&reference, Some(opts), None).await.map_err(DockerError::from) })
        .await
    {
        Ok(_) => tracing::info!(image = %image, "removed the probe image the agent pulled"),
        Err(DockerError::NotFound(_)) => {}
        Err(e) => {
            tracing::warn!(image = %image, error = %e, "could not remove the probe image the agent pulled")
        }
    }
}

async fn inspect(docker: &Docker, id: &str, name: &str) -> ProbeContainer {
    let mut c = ProbeContainer { id: id.to_string(), name: name.to_string(), ..Default::default() };
    let Ok(api) = docker.api().await else { return c };
    let Ok(info) = timed(async { api.inspect_container(id, None).await.map_err(DockerError::from) }).await
    else {
        return c;
    };
    c.image_id = info.image.unwrap_or_default();
    if let Some(hc) = info.host_config {
        c.network_mode = hc.network_mode.unwrap_or_default();
        c.cap_drop = hc.cap_drop.unwrap_or_default();
        c.cap_add = hc.cap_add.unwrap_or_default();
        c.security_opt = hc.security_opt.unwrap_or_default();
        c.readonly_rootfs = hc.readonly_rootfs.unwrap_or(false);
        c.pids_limit = hc.pids_limit;
        c.memory = hc.memory;
        c.privileged = hc.privileged.unwrap_or(false);
        c.device_requests = hc
            .device_requests
            .unwrap_or_default()
            .into_iter()
            .map(|d| (d.driver.unwrap_or_default(), d.count.unwrap_or(0), d.capabilities.unwrap_or_default()))
            .collect();
    }
    if let Some(cfg) = info.config {
        c.labels = cfg.labels.unwrap_or_default();
        c.entrypoint = cfg.entrypoint.unwrap_or_default();
        c.cmd = cfg.cmd.unwrap_or_default();
        c.healthcheck = cfg.healthcheck.and_then(|h| h.test).unwrap_or_default();
        c.env = cfg.env.unwrap_or_default();
    }
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

    /// A refused image is reported before the engine is asked anything: with no engine at all
    /// the reason is the image's, not `docker_unavailable`, and nothing was pulled.
    #[tokio::test]
    async fn an_unpinned_or_foreign_image_is_refused_before_any_engine_call() {
        let d = Docker::connect(Some(std::path::Path::new("/dev/null"))).unwrap();
        let hex = "ab".repeat(32);
        for (image, want) in [
            ("nvidia/cuda:12.4.1-base-ubuntu22.04".to_string(), ProbeFailure::ImageNotPinned),
            ("127.0.0.1:9/gpum-test/absent:1".to_string(), ProbeFailure::ImageNotPinned),
            (format!("127.0.0.1:5000/x@sha256:{hex}"), ProbeFailure::RegistryNotAccepted),
            (format!("192.168.1.20/nvidia/cuda@sha256:{hex}"), ProbeFailure::RegistryNotAccepted),
            (format!("localhost/x@sha256:{hex}"), ProbeFailure::RegistryNotAccepted),
        ] {
            let out = run_probe_with(&d, &ProbeSpec::new(&image, DEFAULT_TIMEOUT)).await;
            assert_eq!(out.report.reason, Some(want), "{image}: {:?}", out.report);
            assert_eq!(out.report.state, VerificationState::Failed);
            assert!(!out.pulled && out.container.is_none());
            assert!(!out.report.output.contains("docker.sock") && !out.report.output.contains("/dev/null"));
        }
        // The config's list decides: an owner's own registry, once listed, gets as far as the
        // engine (absent here).
        let own = format!("registry.lan:5000/x@sha256:{hex}");
        let spec = ProbeSpec::new(&own, DEFAULT_TIMEOUT).with_registries(&["registry.lan:5000".to_string()]);
        assert_eq!(run_probe_with(&d, &spec).await.report.reason, Some(ProbeFailure::DockerUnavailable));
    }

    #[test]
    fn a_pull_is_bounded_by_what_its_layers_announce() {
        let mut l = LayerSizes::default();
        assert_eq!(l.saw("a", Some(10), Some(100)), 100);
        assert_eq!(l.saw("a", Some(60), Some(100)), 100, "a layer counts once");
        // A registry that announces no size is bounded by what it sent.
        assert_eq!(l.saw("b", Some(30), None), 130);
        assert_eq!(l.saw("b", Some(70), None), 170);
        assert_eq!(l.saw("c", Some(-5), Some(i64::MAX)), 170 + i64::MAX as u64, "no wrap, no negative");
        assert_eq!(l.saw("d", None, Some(i64::MAX)), u64::MAX, "the sum saturates");
        assert!(image_too_large_output(MAX_IMAGE_BYTES).contains("2048 MiB"));
    }

    #[test]
    fn the_probe_runs_the_toolkits_nvidia_smi_by_path_with_the_agents_path() {
        assert_eq!(PROBE_COMMAND, TOOLKIT_NVIDIA_SMI);
        assert!(PROBE_COMMAND.starts_with('/'), "a bare name is looked up through the image's PATH");
        assert!(PROBE_ENV.contains(&format!("PATH={PROBE_PATH}").as_str()), "{PROBE_ENV:?}");
        let sim = ProbeSpec::simulation_without_gpu_request("gpum-test/busybox:1-ok", DEFAULT_TIMEOUT)
            .with_simulated_toolkit(std::path::Path::new("/tmp/nvidia-smi"));
        assert!(sim.simulated_toolkit.is_some());
        let r = std::panic::catch_unwind(|| {
            ProbeSpec::new("nvidia/cuda@sha256:0", DEFAULT_TIMEOUT)
                .with_simulated_toolkit(std::path::Path::new("/tmp/nvidia-smi"))
        });
        assert!(r.is_err(), "a production probe gets the real toolkit only");
    }

    #[test]
    fn production_spec_asks_for_gpus_and_the_seam_is_fenced() {
        assert!(ProbeSpec::new("nvidia/cuda@sha256:0", DEFAULT_TIMEOUT).requests_gpus());
        let sim = ProbeSpec::simulation_without_gpu_request("gpum-test/busybox:1-ok", DEFAULT_TIMEOUT);
        assert!(!sim.requests_gpus());
        let r = std::panic::catch_unwind(|| {
            ProbeSpec::simulation_without_gpu_request("nvidia/cuda:12.4.1-base-ubuntu22.04", DEFAULT_TIMEOUT)
        });
        assert!(r.is_err(), "a real image must never run without the GPU request");
    }
}
