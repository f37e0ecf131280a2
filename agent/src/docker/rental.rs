//! Rentals (issue 33): the tenant's container, run isolated on exactly the rented GPUs, and
//! proved gone afterwards.
//!
//! Every heartbeat answer carries the node's whole desired set ([`RentalSpec`]s). [`reconcile`]
//! sets it against what the engine holds (containers carrying the [`RENTAL`] mark) and acts:
//! - **new**: the image, pinned by digest and from an accepted registry (the probe's rules,
//!   [`super::image`]), is found locally (by repository digest, or by id as for a `docker load`ed
//!   image) or pulled by digest; then the container is created from the image *id* and started;
//! - **present**: a running container is adopted as it is (after an agent restart nothing is
//!   recreated or killed); one that ended is reported `exited` with its exit code and left as it
//!   is (the agent restarts nothing on its own); one only `created` (the agent died between
//!   create and start) is started;
//! - **no longer listed, or past `ends_at`** by this machine's clock (whatever the platform says
//!   later): stopped with [`STOP_GRACE`], removed with its anonymous volumes, and then verified
//!   gone (the engine answers 404 for it) before it is reported `gone`.
//!
//! A failed step reports `failed` with a short reason; the engine's own words stay in this
//! machine's log. A rental that failed to start is not tried again (the platform makes a new
//! one); a teardown that failed is tried again at the next round, and until it succeeds no new
//! rental starts (that container may still hold any GPU: the new one waits as `starting`). A new
//! rental never gets a GPU that another rental present on the node holds.
//!
//! Rounds: the agent runs one after every heartbeat, answered or not, against the last answer's
//! set ([`crate::run`]), so a rental past its end stops even while the platform is unreachable.
//!
//! The reports ([`Book`]): the agent sends the current state of every rental it knows in every
//! heartbeat, at most [`limits::MAX_RENTALS_PER_NODE`]; a `gone` or `failed` rental is forgotten
//! once a heartbeat that carried that state was answered and the platform no longer lists it.
//!
//! What the container is ([`container_config`], pure and tested field by field):
//! - **marks**: `gpum.managed=true`, `gpum.rental=<id>` and the name `gpum-rental-<id>`: the
//!   unknown-container reconciler ([`super::reconcile`]) lists it as a managed container and
//!   never removes a desired rental's ([`crate::core`] counts it as known);
//! - **GPUs**: each a `GPU-`/`MIG-` UUID ([`valid_gpu_uuid`]: no comma, no keyword), none held by
//!   another rental present on the node (checked before the start, whatever the platform says);
//!   a device request for exactly the rented UUIDs, the same list as the toolkit's device-list
//!   mounts ([`gpu_list_mounts`]: `/dev/null` read-only at
//!   `/var/run/nvidia-container-devices/<UUID>`, which the installer makes the toolkit's only
//!   source for an unprivileged container, docs/agent.md "How a rental gets its GPUs"), and
//!   `NVIDIA_VISIBLE_DEVICES` set to them, last, over the image's and the spec's (which may say
//!   `all`); the spec's `NVIDIA_*` and `CUDA_VISIBLE_DEVICES` are dropped;
//! - **the rest of the driver** (issue 43): every other variable through which the toolkit
//!   mounts more of the driver or more device nodes is set too, over the image's:
//!   `NVIDIA_DRIVER_CAPABILITIES` from the spec (checked against the toolkit's names,
//!   `gpum_protocol::driver`; default `compute,utility`) and [`NVIDIA_NOTHING`], each to the
//!   value that asks for nothing;
//! - **limits**: refused before anything of the rental is made when its CPU or memory limit is
//!   zero or absent (the engine's "no limit") or beyond this [`Machine`] ([`check_limits`]);
//!   then CPU (`NanoCpus`), memory with swap equal to it, [`PIDS_LIMIT`] processes,
//!   `/dev/shm`, [`NOFILE`] open files, the log rotated ([`LOG_MAX_SIZE`] × [`LOG_MAX_FILES`]),
//!   and the writable layer's size (`--storage-opt size=`) where the data root supports it;
//!   where it does not (overlay2 without XFS project quotas; the engine refuses the option at
//!   create), the container is created without it and the `running` report says so
//!   ([`DISK_LIMIT_UNSUPPORTED`]);
//! - **privileges**: every capability dropped but [`CAP_ADD`], `no-new-privileges`, the engine's
//!   default seccomp profile (nothing unconfines it), not privileged, no bind mounts (but
//!   `/dev/null` for the device list) or devices (so no Docker socket), private PID and IPC
//!   namespaces, `init`, no restart policy;
//! - **network**: [`NETWORK`], a bridge of gpum's own with inter-container traffic disabled
//!   ([`ensure_network`]);
//! - **egress**: [`crate::egress`]'s nftables table, verified in the kernel (and put back when
//!   it is not) once per round in which a rental is wanted, before anything starts: no rental
//!   starts, nor a `created` one is started, unless it is in place; otherwise the rental is
//!   reported `failed` with why ([`crate::egress::Refusal::reason`]).
//!
//! Between rentals ([`super::gpucheck`], through the runner's guard): after a teardown, NVML must
//! find the rental's GPUs free and answering, else the rental is reported `failed` with why and
//! the node is quarantined (nothing starts until a recheck passes); before a rental starts on
//! GPUs another rental held last, the same check and the GPU probe on exactly those GPUs run
//! first.
//!
//! The tenant's environment is never logged (only its variable count), and the agent's token
//! never reaches the container.
//!
//! The test seam, as for the probe: an engine without the NVIDIA toolkit refuses every device
//! request, so the real-engine suites run rentals through [`Runner::simulation_without_gpu_request`]
//! (`test-knobs` builds only, `gpum-test/` images only), which leaves out the device request and
//! nothing else; the GPU fields are proved by the pure tests of [`container_config`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::{Config, CreateContainerOptions, ListContainersOptions, StopContainerOptions};
use bollard::image::CreateImageOptions;
use bollard::models::{
    DeviceRequest, HostConfig, HostConfigLogConfig, Mount, MountTypeEnum, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum,
};
use bollard::network::CreateNetworkOptions;
use futures_util::StreamExt;
use gpum_protocol::{RentalReport, RentalSpec, RentalState, limits};

use super::image::{PinnedImage, RefError};
use super::{Docker, DockerError, LABEL_MANAGED, Mark, timed};
use crate::egress::Gate;

/// The label carrying the rental's id, set on the container.
pub const LABEL_RENTAL: &str = "gpum.rental";
/// Every rental container's name: this and the rental's id.
pub const RENTAL_NAME_PREFIX: &str = "gpum-rental-";
/// What makes a container one of gpum's rentals: `gpum.managed=true` and `gpum.rental=<id>`, both
/// on the container itself, and the name `gpum-rental-…`.
pub const RENTAL: Mark =
    Mark { label: LABEL_MANAGED, also: &[LABEL_RENTAL], name_prefix: Some(RENTAL_NAME_PREFIX) };
/// gpum's own bridge network for rentals.
pub const NETWORK: &str = "gpum-rentals";
/// The label that makes the network gpum's.
pub const LABEL_NETWORK: &str = "gpum.network";
/// The network's bridge interface on the host (what the egress table, [`crate::egress`], names).
pub const BRIDGE_NAME: &str = "gpum-rent0";
/// The resolvers a rental's names go to (through the engine's embedded DNS, which forwards
/// from inside the container's network): public ones, because the host's own are usually the
/// owner's router or another LAN address, which the egress table drops, so a rental would
/// resolve nothing. Cloudflare's and Quad9's, two operators for one failure.
pub const DNS: [&str; 2] = ["1.1.1.1", "9.9.9.9"];
/// The most processes (threads included) one rental holds: a fork bomb stops here, far below
/// the host's own limit, while a data loader with many workers still fits.
pub const PIDS_LIMIT: i64 = 4096;
/// Open files per process, soft and hard: enough for a busy server, and bounded. It must not be
/// above the engine's own hard limit (the runtime cannot raise it: the start fails with "error
/// setting rlimit"): systemd's default is 524288, and sandboxed engines go as low as 20000.
pub const NOFILE: i64 = 16384;
/// The capabilities a rental keeps, all others dropped: what a normal image needs to install
/// packages and drop to its own user (`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `SETUID`, `SETGID`),
/// to signal its own processes (`KILL`) and to serve on a port below 1024 inside its network
/// namespace (`NET_BIND_SERVICE`). Not kept, among others: `NET_RAW` (raw sockets, spoofing),
/// `SYS_ADMIN`, `SYS_PTRACE`, `MKNOD`, `NET_ADMIN`, `AUDIT_WRITE`, `SETFCAP`.
pub const CAP_ADD: [&str; 7] =
    ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL", "NET_BIND_SERVICE"];
/// The container's log: one file at most this large, this many kept, so a chatty workload
/// cannot fill the owner's disk through its log.
pub const LOG_MAX_SIZE: &str = "10m";
pub const LOG_MAX_FILES: &str = "3";
/// How long a stop waits for the workload to exit before the engine kills it.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long an image pull may take.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The reason a running rental carries when this machine cannot limit its disk.
pub const DISK_LIMIT_UNSUPPORTED: &str =
    "disk limit not enforced: Docker's data root does not support it (overlay2 needs XFS with pquota)";
/// The only test repository a rental without a GPU request may use.
pub const SIMULATION_IMAGE_PREFIX: &str = "gpum-test/";

/// The container name of rental `id`.
pub fn container_name(id: &str) -> String {
    format!("{RENTAL_NAME_PREFIX}{id}")
}

/// Whether `id` is a rental id as the protocol defines it: `rent-` and 16 lower-case hex digits.
/// It becomes part of a container name and a label, so nothing else is accepted.
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("rent-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Whether `uuid` names one GPU as NVML does (`GPU-<uuid>`, or a MIG device's `MIG-…`): no
/// comma, no keyword (`all`, `none`, `void`), nothing else, so that the list the agent joins into
/// `NVIDIA_VISIBLE_DEVICES` holds exactly the rented devices.
pub fn valid_gpu_uuid(uuid: &str) -> bool {
    (uuid.starts_with("GPU-") || uuid.starts_with("MIG-"))
        && uuid.len() <= 96
        && uuid.bytes().skip(4).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/')
        && uuid.len() > 4
}

/// What this machine has, which no rental's limits may exceed: its logical CPUs and its memory,
/// the figures of the inventory it reports (which the platform checks a rental against too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    pub cpu_cores: u32,
    pub ram_mib: u64,
}

/// Whether rental `s` may run with its limits on machine `m`; else why not. The engine reads a
/// CPU or memory limit of 0 as "no limit", so a zero (or absent: the protocol reads it as 0)
/// limit is refused, and so is one beyond the machine, which limits nothing either. A machine
/// whose figures are unknown (0) refuses every rental. Pure.
pub fn check_limits(s: &RentalSpec, m: Machine) -> Result<(), String> {
    if s.cpu_millis == 0 {
        return Err("refused: no CPU limit (cpu_millis is 0 or absent)".into());
    }
    if s.memory_mib == 0 {
        return Err("refused: no memory limit (memory_mib is 0 or absent)".into());
    }
    if u64::from(s.cpu_millis) > u64::from(m.cpu_cores) * 1000 {
        return Err(format!(
            "refused: cpu_millis {} is beyond this machine's {} CPUs",
            s.cpu_millis, m.cpu_cores
        ));
    }
    if s.memory_mib > m.ram_mib {
        return Err(format!(
            "refused: memory_mib {} is beyond this machine's {} MiB",
            s.memory_mib, m.ram_mib
        ));
    }
    Ok(())
}

/// Whether a rental may get the parts of the driver `asked` (its spec's list; empty: the
/// default) on a machine whose owner allows `allowed`; else why not. A name outside the
/// toolkit's set is refused whatever the owner allows (fail closed), and so is one the owner
/// did not allow: the platform cannot widen what a rental gets of the driver. Pure.
pub fn check_driver_capabilities(asked: &[String], allowed: &[String]) -> Result<(), String> {
    gpum_protocol::driver::check_driver_capabilities(asked).map_err(|e| format!("refused: {e}"))?;
    let default: Vec<String> =
        gpum_protocol::driver::DEFAULT_DRIVER_CAPABILITIES.iter().map(|s| s.to_string()).collect();
    let asked = if asked.is_empty() { &default[..] } else { asked };
    match asked.iter().find(|c| !allowed.contains(c)) {
        Some(c) => Err(format!(
            "refused: driver capability {c} is not one this machine allows (rental_driver_capabilities: {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

/// The NVIDIA Container Toolkit's other variables that mount more of the driver or more device
/// nodes, each with the value that asks for nothing, set by the agent over the image's (the
/// tenant's are dropped): MIG configuration and monitoring (a privileged container's), the
/// IMEX channels, and the GPUDirect Storage, MOFED, GDRCopy and NVSwitch parts (the `nvidia`
/// runtime's feature gates, read when it is dockerd's default runtime: only `enabled` turns one
/// on), and the Jetson CSV mounts (only `csv-mounts=all` widens them). Read from
/// NVIDIA/nvidia-container-toolkit d34b304: `cmd/nvidia-container-runtime-hook/container_config.go`,
/// `internal/config/image/cuda_image.go` and `envvars.go`, `internal/modifier/gated.go` and
/// `cdi.go`. The toolkit's other `NVIDIA_*` variables (`NVIDIA_REQUIRE_*`,
/// `NVIDIA_DISABLE_REQUIRE`) only check the driver's version and are left to the image.
pub const NVIDIA_NOTHING: [(&str, &str); 8] = [
    ("NVIDIA_MIG_CONFIG_DEVICES", ""),
    ("NVIDIA_MIG_MONITOR_DEVICES", ""),
    ("NVIDIA_IMEX_CHANNELS", "void"),
    ("NVIDIA_GDS", "disabled"),
    ("NVIDIA_MOFED", "disabled"),
    ("NVIDIA_GDRCOPY", "disabled"),
    ("NVIDIA_NVSWITCH", "disabled"),
    ("NVIDIA_REQUIRE_JETPACK", ""),
];

/// Whether the tenant may set variable `name`: a plain name, and none of the ones that choose
/// GPUs (the agent sets `NVIDIA_VISIBLE_DEVICES` itself; the toolkit reads `NVIDIA_*`).
fn tenant_may_set(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('=')
        && !name.contains('\0')
        && !name.starts_with("NVIDIA_")
        && name != "CUDA_VISIBLE_DEVICES"
}

/// The value of `NVIDIA_VISIBLE_DEVICES` for `uuids`: the UUIDs joined by `,`, or `void` (no GPU)
/// when there are none.
pub fn visible_devices(uuids: &[String]) -> String {
    if uuids.is_empty() { "void".to_string() } else { uuids.join(",") }
}

/// Where the NVIDIA Container Toolkit reads a container's device list as mounts
/// (`DeviceListAsVolumeMountsRoot` in its `internal/config/image`): each `/dev/null` mounted at
/// `<root>/<id>` asks for device `<id>`, and only a mount whose source is `/dev/null` counts.
pub const DEVICE_LIST_ROOT: &str = "/var/run/nvidia-container-devices";

/// The toolkit's device-list mounts for `ids` (UUIDs, or `all` for the probe): `/dev/null`,
/// read-only, at [`DEVICE_LIST_ROOT`]`/<id>`. Empty for no id.
pub fn gpu_list_mounts(ids: &[String]) -> Vec<Mount> {
    ids.iter()
        .map(|id| Mount {
            target: Some(format!("{DEVICE_LIST_ROOT}/{id}")),
            source: Some("/dev/null".to_string()),
            typ: Some(MountTypeEnum::BIND),
            read_only: Some(true),
            ..Default::default()
        })
        .collect()
}

/// The container's environment: the tenant's (minus what it may not set), then
/// [`NVIDIA_NOTHING`], `NVIDIA_DRIVER_CAPABILITIES` from the spec (checked before the
/// rental starts), and `NVIDIA_VISIBLE_DEVICES`, last. The engine puts each of these in place of
/// the image's variable of the same name, so the image's values never reach the toolkit.
pub fn container_env(spec: &RentalSpec) -> Vec<String> {
    let mut env: Vec<String> = spec
        .env
        .iter()
        .take(limits::MAX_RENTAL_ENV)
        .filter(|v| tenant_may_set(&v.name) && !v.value.contains('\0'))
        .map(|v| format!("{}={}", v.name, v.value))
        .collect();
    env.extend(NVIDIA_NOTHING.iter().map(|(k, v)| format!("{k}={v}")));
    env.push(format!(
        "NVIDIA_DRIVER_CAPABILITIES={}",
        gpum_protocol::driver::driver_capabilities_value(&spec.driver_capabilities)
    ));
    env.push(format!("NVIDIA_VISIBLE_DEVICES={}", visible_devices(&spec.gpu_uuids)));
    env
}

/// The engine's create options for `spec`, running image `image_id`, with `labels` (the client's
/// `Docker::labels_for`). `request_gpus` is false only for the test seam. `disk_limit` asks
/// for the writable layer's size limit. Pure.
pub fn container_config(
    spec: &RentalSpec,
    image_id: &str,
    labels: HashMap<String, String>,
    request_gpus: bool,
    disk_limit: bool,
) -> Config<String> {
    let mib = |m: u64| i64::try_from(m.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
    let memory = mib(spec.memory_mib);
    let device_requests = request_gpus.then(|| {
        vec![DeviceRequest {
            driver: Some(String::new()),
            device_ids: Some(spec.gpu_uuids.clone()),
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            ..Default::default()
        }]
    });
    let storage_opt = (disk_limit && spec.disk_gib > 0)
        .then(|| HashMap::from([("size".to_string(), format!("{}G", spec.disk_gib))]));
    Config {
        image: Some(image_id.to_string()),
        cmd: (!spec.command.is_empty())
            .then(|| spec.command.iter().take(limits::MAX_RENTAL_ARGS).cloned().collect()),
        env: Some(container_env(spec)),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some(NETWORK.to_string()),
            dns: Some(DNS.iter().map(|a| a.to_string()).collect()),
            ipc_mode: Some("private".to_string()),
            mounts: (request_gpus && !spec.gpu_uuids.is_empty()).then(|| gpu_list_mounts(&spec.gpu_uuids)),
            device_requests,
            nano_cpus: Some(i64::from(spec.cpu_millis) * 1_000_000),
            memory: Some(memory),
            memory_swap: Some(memory),
            pids_limit: Some(PIDS_LIMIT),
            shm_size: Some(mib(spec.shm_mib)),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".to_string()),
                soft: Some(NOFILE),
                hard: Some(NOFILE),
            }]),
            storage_opt,
            cap_drop: Some(vec!["ALL".to_string()]),
            cap_add: Some(CAP_ADD.iter().map(|c| c.to_string()).collect()),
            security_opt: Some(vec!["no-new-privileges:true".to_string()]),
            privileged: Some(false),
            readonly_rootfs: Some(false),
            init: Some(true),
            auto_remove: Some(false),
            publish_all_ports: Some(false),
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::NO),
                maximum_retry_count: None,
            }),
            log_config: Some(HostConfigLogConfig {
                typ: Some("json-file".to_string()),
                config: Some(HashMap::from([
                    ("max-size".to_string(), LOG_MAX_SIZE.to_string()),
                    ("max-file".to_string(), LOG_MAX_FILES.to_string()),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether the engine's refusal is the storage driver's "no size limit here".
pub fn is_disk_limit_unsupported(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("storage-opt") || m.contains("storage opt") || m.contains("pquota")
}

/// Creates gpum's rental network if it is missing: a bridge labelled `gpum.network=true`, with
/// inter-container traffic disabled. An existing network of that name that is not gpum's, or that
/// allows inter-container traffic, is an error: the agent does not run rentals in it.
pub async fn ensure_network(docker: &Docker) -> Result<(), DockerError> {
    let api = docker.api().await?;
    for attempt in 0..2 {
        match timed(async { api.inspect_network::<String>(NETWORK, None).await.map_err(DockerError::from) })
            .await
        {
            Ok(n) => {
                let labels = n.labels.unwrap_or_default();
                let options = n.options.unwrap_or_default();
                if labels.get(LABEL_NETWORK).map(String::as_str) != Some("true") {
                    return Err(DockerError::Other(format!("network {NETWORK} exists and is not gpum's")));
                }
                if options.get("com.docker.network.bridge.enable_icc").map(String::as_str) != Some("false") {
                    return Err(DockerError::Other(format!(
                        "network {NETWORK} allows traffic between containers"
                    )));
                }
                return Ok(());
            }
            Err(DockerError::NotFound(_)) if attempt == 0 => {}
            Err(e) => return Err(e),
        }
        let opts = CreateNetworkOptions {
            name: NETWORK.to_string(),
            check_duplicate: true,
            driver: "bridge".to_string(),
            options: HashMap::from([
                ("com.docker.network.bridge.enable_icc".to_string(), "false".to_string()),
                ("com.docker.network.bridge.name".to_string(), BRIDGE_NAME.to_string()),
            ]),
            labels: HashMap::from([(LABEL_NETWORK.to_string(), "true".to_string())]),
            ..Default::default()
        };
        match timed(async { api.create_network(opts).await.map_err(DockerError::from) }).await {
            Ok(_) => tracing::info!(network = NETWORK, "created gpum's rental network"),
            // Created meanwhile (another agent call): inspected again above.
            Err(DockerError::Api { status: 409, .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Err(DockerError::Other(format!("network {NETWORK} could not be created")))
}

/// Removes gpum's rental network (`uninstall`, after the rentals): `Ok(true)` when it was
/// removed, `Ok(false)` when there is none or the one of that name is not gpum's (left alone).
/// A network that still has containers attached is an error, and stays.
pub async fn remove_network(docker: &Docker) -> Result<bool, DockerError> {
    let api = docker.api().await?;
    let n =
        match timed(async { api.inspect_network::<String>(NETWORK, None).await.map_err(DockerError::from) })
            .await
        {
            Ok(n) => n,
            Err(DockerError::NotFound(_)) => return Ok(false),
            Err(e) => return Err(e),
        };
    if n.labels.unwrap_or_default().get(LABEL_NETWORK).map(String::as_str) != Some("true") {
        return Ok(false);
    }
    if let Some(attached) = n.containers.filter(|c| !c.is_empty()) {
        return Err(DockerError::Other(format!(
            "network {NETWORK} still has {} container(s) attached",
            attached.len()
        )));
    }
    match timed(async { api.remove_network(NETWORK).await.map_err(DockerError::from) }).await {
        Ok(()) | Err(DockerError::NotFound(_)) => Ok(true),
        Err(e) => Err(e),
    }
}

/// One rental's entry in the [`Book`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    report: RentalReport,
    /// A heartbeat carrying exactly this report was answered.
    acked: bool,
}

/// What the agent knows of its rentals: the current report of each, shared between the
/// reconcile task (which updates it as it goes: pulling, starting, …) and the heartbeat (which
/// sends it).
#[derive(Debug, Clone, Default)]
pub struct Book(Arc<Mutex<BTreeMap<String, Entry>>>);

impl Book {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `state` for rental `id` (a changed report is not acknowledged yet).
    pub fn set(&self, id: &str, state: RentalState, exit_code: Option<i64>, reason: Option<String>) {
        let report = RentalReport { id: id.to_string(), state, exit_code, reason };
        let mut m = self.lock();
        match m.get_mut(id) {
            Some(e) if e.report == report => {}
            _ => {
                tracing::info!(rental = id, state = %state.as_str(), exit_code, reason = report.reason.as_deref().unwrap_or(""), "rental");
                m.insert(id.to_string(), Entry { report, acked: false });
            }
        }
    }

    /// The report of rental `id`, if known.
    pub fn get(&self, id: &str) -> Option<RentalReport> {
        self.lock().get(id).map(|e| e.report.clone())
    }

    /// What the next heartbeat carries: every known rental's report, at most
    /// [`limits::MAX_RENTALS_PER_NODE`], the unfinished ones first.
    pub fn reports(&self) -> Vec<RentalReport> {
        let m = self.lock();
        let (mut live, done): (Vec<_>, Vec<_>) =
            m.values().map(|e| e.report.clone()).partition(|r| !is_final(r.state));
        live.extend(done);
        live.truncate(limits::MAX_RENTALS_PER_NODE);
        live
    }

    /// A heartbeat carrying `sent` was answered.
    pub fn acked(&self, sent: &[RentalReport]) {
        let mut m = self.lock();
        for r in sent {
            if let Some(e) = m.get_mut(&r.id)
                && e.report == *r
            {
                e.acked = true;
            }
        }
    }

    /// Forgets the finished rentals the platform no longer lists and was told about.
    fn forget_delivered(&self, desired: &HashSet<&str>) {
        self.lock().retain(|id, e| !(is_final(e.report.state) && e.acked && !desired.contains(id.as_str())));
    }

    /// Whether no rental is known.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn ids(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

/// `gone` and `failed`: nothing more happens to the rental unless something is left to tear down.
fn is_final(s: RentalState) -> bool {
    matches!(s, RentalState::Gone | RentalState::Failed)
}

/// Why a listed rental does not run on a machine whose owner turned rentals off.
pub const RENTALS_OFF: &str =
    "refused: rentals are off on this machine (its owner set rentals = false in the agent's config)";

/// How rentals run on this node. Build it with [`Runner::new`].
#[derive(Debug, Clone)]
pub struct Runner {
    /// The owner's `rentals` (on unless `rentals = false`); off, nothing starts (see
    /// [`RENTALS_OFF`]).
    enabled: bool,
    /// The egress table's keeper: nothing starts unless it verified the table in this round.
    egress: Gate,
    registries: Vec<String>,
    request_gpus: bool,
    stop_grace: Duration,
    pull_timeout: Duration,
    /// The GPU check after a teardown, the quarantine and the self-test ([`super::gpucheck`]).
    /// A runner that asks for GPUs and has none starts nothing.
    guard: Option<super::gpucheck::Guard>,
    /// What no rental's limits may exceed ([`check_limits`]).
    machine: Machine,
    /// The parts of the driver a rental may get: the owner's `rental_driver_capabilities`
    /// ([`check_driver_capabilities`]).
    driver_capabilities: Vec<String>,
}

impl Runner {
    /// The production runner: images from `registries` (the config's `probe_registries`), the
    /// rented GPUs requested, the egress table kept by `egress` (on the machine itself: `nft`
    /// through the agent's [`gpum_host::Host`]), no rental's limits beyond `machine`, the
    /// driver's default parts only (see [`Runner::driver_capabilities`]). Off until
    /// [`Runner::enabled`].
    pub fn new(registries: &[String], egress: Gate, machine: Machine) -> Runner {
        Runner {
            machine,
            driver_capabilities: gpum_protocol::driver::DEFAULT_DRIVER_CAPABILITIES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            enabled: false,
            egress,
            registries: registries.to_vec(),
            request_gpus: true,
            stop_grace: STOP_GRACE,
            pull_timeout: PULL_TIMEOUT,
            guard: None,
        }
    }

    /// Checks the GPUs after each teardown and before they change hands, with `guard`.
    pub fn with_guard(mut self, guard: super::gpucheck::Guard) -> Runner {
        self.guard = Some(guard);
        self
    }

    /// A runner that does NOT ask the engine for the GPUs, for the real-engine tests on a machine
    /// without the NVIDIA toolkit (see the module docs). Only `gpum-test/` images run with it;
    /// `test-knobs` builds only.
    #[cfg(any(test, feature = "test-knobs"))]
    #[doc(hidden)]
    pub fn simulation_without_gpu_request(mut self) -> Runner {
        self.request_gpus = false;
        self
    }

    /// The parts of the driver a rental may ask for: the owner's `rental_driver_capabilities`.
    pub fn driver_capabilities(mut self, allowed: &[String]) -> Runner {
        self.driver_capabilities = allowed.to_vec();
        self
    }

    /// Runs rentals only when the owner turned them on (the config's `rentals`); a runner that is
    /// off still tears down any rental container it finds.
    pub fn enabled(mut self, on: bool) -> Runner {
        self.enabled = on;
        self
    }

    /// The egress table's keeper this runner starts rentals behind.
    pub fn egress(&self) -> &Gate {
        &self.egress
    }

    /// A shorter stop grace (tests).
    pub fn with_stop_grace(mut self, d: Duration) -> Runner {
        self.stop_grace = d;
        self
    }
}

/// A rental container as listed.
#[derive(Debug, Clone)]
struct Actual {
    id: String,
    state: String,
}

/// The rental containers the engine holds now, by rental id.
async fn list(docker: &Docker) -> Result<HashMap<String, Actual>, DockerError> {
    let mut out = HashMap::new();
    for (id, name, state) in docker.list_marked(RENTAL).await? {
        if let Some(rid) = name.strip_prefix(RENTAL_NAME_PREFIX) {
            out.insert(rid.to_string(), Actual { id, state });
        }
    }
    Ok(out)
}

/// One reconcile round against `desired` (an answer's whole list) at unix time `now`. Updates
/// `book` as it goes. An engine that cannot be listed ends the round with that error (nothing
/// is known, so nothing is done).
pub async fn reconcile(
    docker: &Docker,
    runner: &Runner,
    book: &Book,
    desired: &[RentalSpec],
    now: u64,
) -> Result<(), DockerError> {
    if let Some(bad) = desired.iter().find(|s| !valid_id(&s.id)) {
        tracing::warn!(count = desired.iter().filter(|s| !valid_id(&s.id)).count(), example = %bad.id.escape_debug(), "the platform listed rentals with ids that are not rental ids; ignoring them");
    }
    let desired: Vec<&RentalSpec> =
        desired.iter().filter(|s| valid_id(&s.id)).take(limits::MAX_RENTALS_PER_NODE).collect();
    let wanted: HashSet<&str> = desired.iter().filter(|s| now < s.ends_at).map(|s| s.id.as_str()).collect();
    let listed: HashSet<&str> = desired.iter().map(|s| s.id.as_str()).collect();
    book.forget_delivered(&listed);
    let actual = list(docker).await?;

    // Teardown first: what is no longer wanted frees its GPUs before anything new starts.
    let mut left_behind = false;
    for (rid, c) in &actual {
        if !wanted.contains(rid.as_str()) {
            let why = if listed.contains(rid.as_str()) { "expired" } else { "no longer listed" };
            teardown(docker, runner, book, rid, &c.id, why).await;
            left_behind |= book.get(rid).is_some_and(|r| r.state != RentalState::Gone);
        }
    }
    // Rentals known to the book, neither wanted nor present: gone (verified by the listing).
    for rid in book.ids() {
        if !wanted.contains(rid.as_str())
            && !actual.contains_key(&rid)
            && book.get(&rid).is_some_and(|r| !is_final(r.state))
        {
            book.set(&rid, RentalState::Gone, None, None);
        }
    }
    // Listed but already expired, never seen here: nothing to run.
    for s in &desired {
        if !wanted.contains(s.id.as_str()) && !actual.contains_key(&s.id) && book.get(&s.id).is_none() {
            book.set(&s.id, RentalState::Gone, None, Some("expired before it started".into()));
        }
    }
    // The egress table, once per round in which anything is wanted, before anything starts:
    // verified in the kernel, and put back when it is not (a reboot, a flush).
    let needs_table = wanted.iter().any(|rid| {
        actual.contains_key(*rid)
            || book.get(rid).is_none_or(|r| !is_final(r.state) && r.state != RentalState::Exited)
    });
    let egress: Result<(), &'static str> = if !runner.enabled {
        Err(RENTALS_OFF)
    } else if needs_table {
        runner.egress.ensure().await.map_err(|r| r.reason())
    } else {
        Err(crate::egress::NOT_IN_PLACE)
    };
    // The GPUs the rentals present hold: a new rental never shares one, whatever the platform
    // says.
    let mut held: HashSet<&str> = desired
        .iter()
        .filter(|s| actual.contains_key(&s.id) && wanted.contains(s.id.as_str()))
        .flat_map(|s| s.gpu_uuids.iter().map(String::as_str))
        .collect();
    for s in desired.iter().filter(|s| wanted.contains(s.id.as_str())) {
        match actual.get(&s.id) {
            Some(c) => observe(docker, book, s, c, &egress).await,
            None => match book.get(&s.id) {
                // Failed to start, or gone: the platform makes a new rental.
                Some(r) if is_final(r.state) || r.state == RentalState::Exited => {}
                _ => {
                    // A container whose teardown failed may still hold any GPU: nothing new
                    // starts until it is gone (tried again at the next round).
                    if left_behind {
                        let why = "waiting: an earlier rental's teardown has not finished".to_string();
                        book.set(&s.id, RentalState::Starting, None, Some(why));
                        continue;
                    }
                    if let Some(g) = s.gpu_uuids.iter().find(|g| held.contains(g.as_str())) {
                        let why = format!("refused: GPU {g} is held by another rental");
                        book.set(&s.id, RentalState::Failed, None, Some(why));
                        continue;
                    }
                    start(docker, runner, book, s, &egress).await;
                    if book.get(&s.id).is_some_and(|r| r.state == RentalState::Running) {
                        held.extend(s.gpu_uuids.iter().map(String::as_str));
                    }
                }
            },
        }
    }
    Ok(())
}

/// A present, wanted rental: adopt it as it is and report what it is doing.
async fn observe(
    docker: &Docker,
    book: &Book,
    s: &RentalSpec,
    c: &Actual,
    egress: &Result<(), &'static str>,
) {
    let reason = match book.get(&s.id) {
        Some(r) => r.reason.filter(|_| r.state == RentalState::Running),
        // Adopted (after an agent restart): whether its disk is limited, from the engine.
        None => disk_note(docker, s, &c.id).await,
    };
    match c.state.as_str() {
        "running" | "paused" | "restarting" => book.set(&s.id, RentalState::Running, None, reason),
        "created" => {
            // The agent stopped between create and start: started only behind the table.
            if let Err(why) = egress {
                book.set(&s.id, RentalState::Failed, None, Some(why.to_string()));
                return;
            }
            match start_container(docker, &c.id).await {
                Ok(()) => book.set(&s.id, RentalState::Running, None, reason),
                Err(e) => fail(book, &s.id, "the container could not be started", &e),
            }
        }
        // Its exit was reported already: no engine call for it again.
        _ if book.get(&s.id).is_some_and(|r| r.state == RentalState::Exited) => {}
        _ => {
            // exited, dead: its process ended by itself.
            match exit_code(docker, &c.id).await {
                Ok(code) => book.set(&s.id, RentalState::Exited, Some(code), None),
                Err(e) => fail(book, &s.id, "the container's state could not be read", &e),
            }
        }
    }
}

/// [`DISK_LIMIT_UNSUPPORTED`] when `s` asked for a disk limit and container `cid` has none.
async fn disk_note(docker: &Docker, s: &RentalSpec, cid: &str) -> Option<String> {
    if s.disk_gib == 0 {
        return None;
    }
    let api = docker.api().await.ok()?;
    let info =
        timed(async { api.inspect_container(cid, None).await.map_err(DockerError::from) }).await.ok()?;
    let limited = info.host_config.and_then(|h| h.storage_opt).is_some_and(|o| o.contains_key("size"));
    (!limited).then(|| DISK_LIMIT_UNSUPPORTED.to_string())
}

fn fail(book: &Book, id: &str, reason: &str, e: &DockerError) {
    tracing::warn!(rental = id, error = %e, "{reason}");
    book.set(id, RentalState::Failed, None, Some(reason.to_string()));
}

async fn exit_code(docker: &Docker, id: &str) -> Result<i64, DockerError> {
    let api = docker.api().await?;
    let info = timed(async { api.inspect_container(id, None).await.map_err(DockerError::from) }).await?;
    Ok(info.state.and_then(|s| s.exit_code).unwrap_or(-1))
}

async fn start_container(docker: &Docker, id: &str) -> Result<(), DockerError> {
    let api = docker.api().await?;
    timed(async { api.start_container::<String>(id, None).await.map_err(DockerError::from) }).await
}

/// Pull (if needed), create and start rental `s`.
async fn start(
    docker: &Docker,
    runner: &Runner,
    book: &Book,
    s: &RentalSpec,
    egress: &Result<(), &'static str>,
) {
    let id = s.id.as_str();
    if !runner.enabled {
        book.set(id, RentalState::Failed, None, Some(RENTALS_OFF.into()));
        return;
    }
    // What the platform asks, checked before anything of the rental is made (issue 43): hard
    // limits that fit this machine, and only the toolkit's named parts of the driver.
    let asked = check_limits(s, runner.machine)
        .and_then(|()| check_driver_capabilities(&s.driver_capabilities, &runner.driver_capabilities));
    if let Err(why) = asked {
        book.set(id, RentalState::Failed, None, Some(why));
        return;
    }

    if !runner.request_gpus && !s.image.starts_with(SIMULATION_IMAGE_PREFIX) {
        book.set(
            id,
            RentalState::Failed,
            None,
            Some("refused: a rental without GPUs runs test images only".into()),
        );
        return;
    }
    if runner.request_gpus && s.gpu_uuids.is_empty() {
        book.set(id, RentalState::Failed, None, Some("refused: no GPUs rented".into()));
        return;
    }
    let mut seen = HashSet::new();
    if let Some(g) = s.gpu_uuids.iter().find(|g| !valid_gpu_uuid(g) || !seen.insert(g.as_str())) {
        let why = format!("refused: {} is not a GPU UUID, or is listed twice", g.escape_debug());
        book.set(id, RentalState::Failed, None, Some(why));
        return;
    }
    // Nothing starts on a quarantined node ([`super::gpucheck`]).
    if let Some(q) = runner.guard.as_ref().and_then(|g| g.quarantine()) {
        book.set(
            id,
            RentalState::Failed,
            None,
            Some(format!("refused: this node is quarantined: {}", q.reason)),
        );
        return;
    }
    let image =
        match PinnedImage::parse(&s.image).and_then(|i| i.check_registry(&runner.registries).map(|()| i)) {
            Ok(i) => i,
            Err(e) => {
                let why = match e {
                    RefError::NotPinned => {
                        "image refused: not pinned by digest (name@sha256:<64 hex digits>)".to_string()
                    }
                    RefError::Invalid => "image refused: not a valid image reference".to_string(),
                    RefError::RegistryNotAccepted(r) => {
                        format!("image refused: registry {r} is not one this node accepts (probe_registries)")
                    }
                };
                book.set(id, RentalState::Failed, None, Some(why));
                return;
            }
        };
    // Fail closed: no table verified in this round, nothing of this rental is made.
    if let Err(why) = egress {
        book.set(id, RentalState::Failed, None, Some(why.to_string()));
        return;
    }
    if let Err(e) = ensure_network(docker).await {
        return fail(book, id, "gpum's rental network is not usable", &e);
    }
    let image_id = match super::probe::local_image_id(docker, &image).await {
        Ok(Some(i)) => i,
        Ok(None) => {
            book.set(id, RentalState::Pulling, None, None);
            match pull(docker, runner, &image).await {
                Ok(i) => i,
                Err(e) => {
                    return fail(book, id, "pulling the image failed (details are in the agent's log)", &e);
                }
            }
        }
        Err(e) => return fail(book, id, "the image could not be looked up", &e),
    };
    book.set(id, RentalState::Starting, None, None);
    // GPUs another rental held last: checked and probed first; the ledger records this one.
    // Without the GPU check, GPUs are never handed out.
    let checked = match &runner.guard {
        Some(g) => g.before_start(docker, s).await,
        None if runner.request_gpus => Err("refused: the GPU check is not set up".to_string()),
        None => Ok(()),
    };
    if let Err(why) = checked {
        book.set(id, RentalState::Failed, None, Some(why));
        return;
    }
    let api = match docker.api().await {
        Ok(a) => a,
        Err(e) => return fail(book, id, "Docker is unavailable", &e),
    };
    let name = container_name(id);
    let labels = docker.labels_for(LABEL_MANAGED, &[(LABEL_RENTAL, id)]);
    tracing::info!(rental = id, container = %name, image = %s.image, image_id = %image_id, gpus = ?s.gpu_uuids, env_vars = s.env.len(), "creating the rental's container");
    let create = |disk_limit: bool| {
        let config = container_config(s, &image_id, labels.clone(), runner.request_gpus, disk_limit);
        let opts = CreateContainerOptions { name: name.clone(), platform: None };
        async move {
            timed(async { api.create_container(Some(opts), config).await.map_err(DockerError::from) }).await
        }
    };
    let mut note = None;
    let created = match create(true).await {
        Err(DockerError::Api { message, .. }) if s.disk_gib > 0 && is_disk_limit_unsupported(&message) => {
            tracing::warn!(rental = id, error = %message, "the engine cannot limit this rental's disk; creating it without the limit");
            note = Some(DISK_LIMIT_UNSUPPORTED.to_string());
            create(false).await
        }
        r => r,
    };
    let cid = match created {
        Ok(r) => r.id,
        Err(e) => return fail(book, id, "the container could not be created", &e),
    };
    if let Err(e) = start_container(docker, &cid).await {
        // Nothing half-made stays behind.
        let _ = docker.force_remove_if(&cid, RENTAL, true).await;
        return fail(book, id, "the container could not be started", &e);
    }
    book.set(id, RentalState::Running, None, note);
}

/// Pulls `image` by digest; returns its id.
async fn pull(docker: &Docker, runner: &Runner, image: &PinnedImage) -> Result<String, DockerError> {
    let api = docker.api().await?;
    tracing::info!(image = %image, "pulling a rental's image");
    let opts = CreateImageOptions { from_image: image.to_string(), ..Default::default() };
    let run = async {
        let mut stream = api.create_image(Some(opts), None, None);
        while let Some(item) = stream.next().await {
            let info = item.map_err(DockerError::from)?;
            if let Some(err) = info.error {
                return Err(DockerError::Other(err));
            }
        }
        Ok(())
    };
    match tokio::time::timeout(runner.pull_timeout, run).await {
        Ok(r) => r?,
        Err(_) => return Err(DockerError::Other("the pull took too long".into())),
    }
    super::probe::local_image_id(docker, image)
        .await?
        .ok_or_else(|| DockerError::Other("the engine pulled, but holds no image with that digest".into()))
}

/// Stop, remove with anonymous volumes, verify gone, then (with a guard) the GPU check on its
/// GPUs; reports `stopping`, then `gone` or `failed` (a failed GPU check also quarantines).
async fn teardown(docker: &Docker, runner: &Runner, book: &Book, rid: &str, cid: &str, why: &str) {
    book.set(rid, RentalState::Stopping, None, Some(why.to_string()));
    // Its GPUs, read before the container goes: the ledger's, and the engine's for it.
    let mut gpus = Vec::new();
    if let Some(g) = &runner.guard {
        gpus = g.held_by(rid);
        for u in super::gpucheck::container_gpus(docker, cid).await {
            if !gpus.contains(&u) {
                gpus.push(u);
            }
        }
    }
    match remove(docker, cid, runner.stop_grace).await {
        Ok(()) => match &runner.guard {
            Some(g) => match g.after_teardown(rid, &gpus).await {
                Ok(()) => book.set(rid, RentalState::Gone, None, None),
                Err(reason) => book.set(rid, RentalState::Failed, None, Some(reason)),
            },
            None => book.set(rid, RentalState::Gone, None, None),
        },
        Err(e) => fail(book, rid, "the teardown could not be verified", &e),
    }
}

/// Stops container `cid` (if, right now, it is a rental of gpum's), removes it with its anonymous
/// volumes, and checks the engine no longer knows it.
async fn remove(docker: &Docker, cid: &str, grace: Duration) -> Result<(), DockerError> {
    let api = docker.api().await?;
    docker.check_marked(cid, RENTAL).await?;
    let t = grace.as_secs().max(1) as i64;
    let stop = async {
        match api.stop_container(cid, Some(StopContainerOptions { t })).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => {
                Ok(())
            }
            Err(e) => Err(DockerError::from(e)),
        }
    };
    match tokio::time::timeout(grace + super::CALL_TIMEOUT, stop).await {
        Ok(Ok(()) | Err(DockerError::NotFound(_))) => {}
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(DockerError::Unavailable("the engine did not stop the container in time".into()));
        }
    }
    match docker.force_remove_if(cid, RENTAL, true).await {
        Ok(()) | Err(DockerError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    match timed(async { api.inspect_container(cid, None).await.map_err(DockerError::from) }).await {
        Err(DockerError::NotFound(_)) => Ok(()),
        Ok(_) => Err(DockerError::Other("the container is still there after its removal".into())),
        Err(e) => Err(e),
    }
}

/// The rental containers of this client's scope, by id, running or not (for tests and
/// diagnostics).
pub async fn containers(docker: &Docker) -> Result<Vec<(String, String)>, DockerError> {
    let api = docker.api().await?;
    let opts =
        ListContainersOptions { all: true, filters: docker.label_filter(RENTAL), ..Default::default() };
    let list = timed(async { api.list_containers(Some(opts)).await.map_err(DockerError::from) }).await?;
    Ok(list
        .into_iter()
        .filter_map(|c| Some((c.id?, c.names?.into_iter().next()?.trim_start_matches('/').to_string())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::EnvVar;

    fn spec() -> RentalSpec {
        RentalSpec {
            id: "rent-00112233445566aa".into(),
            image: "nvidia/cuda@sha256:0".into(),
            gpu_uuids: vec!["GPU-1111".into(), "GPU-2222".into()],
            cpu_millis: 2500,
            memory_mib: 4096,
            disk_gib: 20,
            shm_mib: 512,
            env: vec![
                EnvVar { name: "A".into(), value: "1".into() },
                EnvVar { name: "NVIDIA_VISIBLE_DEVICES".into(), value: "all".into() },
                EnvVar { name: "NVIDIA_DRIVER_CAPABILITIES".into(), value: "all".into() },
                EnvVar { name: "CUDA_VISIBLE_DEVICES".into(), value: "0,1,2,3".into() },
                EnvVar { name: "B=C".into(), value: "x".into() },
                EnvVar { name: "".into(), value: "x".into() },
            ],
            command: vec!["python".into(), "train.py".into()],
            ends_at: 2_000_000_000,
            ports: vec![],
            driver_capabilities: vec![],
        }
    }

    #[test]
    fn rental_ids_are_checked_before_they_name_anything() {
        assert!(valid_id("rent-00112233445566aa"));
        for bad in [
            "rent-0011",
            "rent-00112233445566AA",
            "rent-00112233445566aa0",
            "x-00112233445566aa",
            "rent-../../etc/ab",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
        assert_eq!(container_name("rent-00112233445566aa"), "gpum-rental-rent-00112233445566aa");
    }

    #[test]
    fn rental_env_cannot_widen_the_gpus() {
        let env = container_env(&spec());
        assert_eq!(env.first().unwrap(), "A=1", "the tenant's, but what chooses GPUs");
        assert_eq!(env.iter().filter(|v| !v.starts_with("NVIDIA_")).count(), 1);
        assert_eq!(env.last().unwrap(), "NVIDIA_VISIBLE_DEVICES=GPU-1111,GPU-2222", "set last");
        let none = RentalSpec { gpu_uuids: vec![], ..spec() };
        assert_eq!(container_env(&none).last().unwrap(), "NVIDIA_VISIBLE_DEVICES=void");
    }

    /// Issue 43: every variable through which the toolkit mounts more of the driver or more
    /// device nodes is set, once each, whatever the image or the tenant says.
    #[test]
    fn rental_env_sets_every_nvidia_variable_the_toolkit_reads() {
        let env = container_env(&spec());
        let nvidia: Vec<&str> = env.iter().filter(|v| v.starts_with("NVIDIA_")).map(String::as_str).collect();
        assert_eq!(
            nvidia,
            [
                "NVIDIA_MIG_CONFIG_DEVICES=",
                "NVIDIA_MIG_MONITOR_DEVICES=",
                "NVIDIA_IMEX_CHANNELS=void",
                "NVIDIA_GDS=disabled",
                "NVIDIA_MOFED=disabled",
                "NVIDIA_GDRCOPY=disabled",
                "NVIDIA_NVSWITCH=disabled",
                "NVIDIA_REQUIRE_JETPACK=",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                "NVIDIA_VISIBLE_DEVICES=GPU-1111,GPU-2222",
            ]
        );
        let video = RentalSpec { driver_capabilities: vec!["compute".into(), "video".into()], ..spec() };
        assert!(container_env(&video).contains(&"NVIDIA_DRIVER_CAPABILITIES=compute,video".to_string()));
    }

    /// Issue 43: only the toolkit's names, and only those the owner allows (by default
    /// `compute,utility`, which a spec without a list asks for).
    #[test]
    fn rental_driver_capabilities_are_the_toolkits_and_the_owners() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let default = v(&["compute", "utility"]);
        assert_eq!(check_driver_capabilities(&[], &default), Ok(()));
        assert_eq!(check_driver_capabilities(&v(&["utility"]), &default), Ok(()));
        let why = check_driver_capabilities(&v(&["compute", "video"]), &default).unwrap_err();
        assert!(why.contains("driver capability video is not one this machine allows"), "{why}");
        assert_eq!(
            check_driver_capabilities(&v(&["compute", "video"]), &v(&["compute", "video", "utility"])),
            Ok(())
        );
        for bad in [&["all"][..], &["gpu"], &["compute", "compute"]] {
            let why = check_driver_capabilities(&v(bad), &v(&gpum_protocol::driver::DRIVER_CAPABILITIES))
                .unwrap_err();
            assert!(why.starts_with("refused: driver_capabilities: "), "{why}");
        }
        // An owner who allows less than the default refuses a spec without a list.
        assert!(check_driver_capabilities(&[], &v(&["compute"])).is_err());
    }

    /// Issue 43: the engine reads a CPU or memory limit of 0 as none; the agent refuses a rental
    /// without either, or with one beyond the machine.
    #[test]
    fn rental_limits_zero_absent_or_beyond_the_machine_are_refused() {
        let m = Machine { cpu_cores: 4, ram_mib: 8192 };
        assert_eq!(check_limits(&spec(), m), Ok(()));
        assert_eq!(check_limits(&RentalSpec { cpu_millis: 4000, memory_mib: 8192, ..spec() }, m), Ok(()));
        for (bad, want) in [
            (RentalSpec { cpu_millis: 0, ..spec() }, "no CPU limit"),
            (RentalSpec { memory_mib: 0, ..spec() }, "no memory limit"),
            (RentalSpec { cpu_millis: 4001, ..spec() }, "cpu_millis 4001 is beyond this machine's 4 CPUs"),
            (RentalSpec { memory_mib: 8193, ..spec() }, "memory_mib 8193 is beyond this machine's 8192 MiB"),
            (RentalSpec { memory_mib: u64::MAX, ..spec() }, "beyond"),
        ] {
            let why = check_limits(&bad, m).unwrap_err();
            assert!(why.starts_with("refused: ") && why.contains(want), "{why}");
        }
        // Unknown figures refuse everything.
        assert!(check_limits(&spec(), Machine { cpu_cores: 0, ram_mib: 0 }).is_err());
    }

    #[test]
    fn rental_container_config_field_by_field() {
        let labels = HashMap::from([
            ("gpum.managed".to_string(), "true".to_string()),
            ("gpum.rental".to_string(), "rent-00112233445566aa".to_string()),
        ]);
        let c = container_config(&spec(), "sha256:img", labels.clone(), true, true);
        assert_eq!(c.image.as_deref(), Some("sha256:img"));
        assert_eq!(c.labels, Some(labels));
        assert_eq!(c.cmd, Some(vec!["python".to_string(), "train.py".to_string()]));
        assert_eq!(c.entrypoint, None, "the image's entrypoint stays");
        let h = c.host_config.unwrap();
        let dr = h.device_requests.unwrap();
        assert_eq!(dr.len(), 1);
        assert_eq!(dr[0].device_ids, Some(vec!["GPU-1111".to_string(), "GPU-2222".to_string()]));
        assert_eq!(dr[0].capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(dr[0].count, None, "by UUID, never a count (a count of -1 is every GPU)");
        assert_eq!(h.nano_cpus, Some(2_500_000_000));
        assert_eq!(h.memory, Some(4096 * 1024 * 1024));
        assert_eq!(h.memory_swap, h.memory, "no swap beyond memory");
        assert_eq!(h.pids_limit, Some(PIDS_LIMIT));
        assert_eq!(h.shm_size, Some(512 * 1024 * 1024));
        let u = h.ulimits.unwrap();
        assert_eq!(
            (u[0].name.as_deref(), u[0].soft, u[0].hard),
            (Some("nofile"), Some(NOFILE), Some(NOFILE))
        );
        assert_eq!(h.storage_opt, Some(HashMap::from([("size".to_string(), "20G".to_string())])));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.cap_add.unwrap(), CAP_ADD.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(
            !CAP_ADD.contains(&"SYS_ADMIN")
                && !CAP_ADD.contains(&"NET_RAW")
                && !CAP_ADD.contains(&"NET_ADMIN")
        );
        assert_eq!(
            h.security_opt,
            Some(vec!["no-new-privileges:true".to_string()]),
            "default seccomp: nothing unconfined"
        );
        assert_eq!(h.privileged, Some(false));
        assert_eq!(h.network_mode.as_deref(), Some(NETWORK));
        // Public resolvers: the host's own (often the owner's router) are behind the egress table.
        // (`egress_denies_what_the_issue_lists_and_not_the_internet` checks they are reachable.)
        assert_eq!(h.dns.clone().unwrap(), DNS);
        assert_eq!(h.pid_mode, None, "private PID namespace");
        assert_eq!(h.ipc_mode.as_deref(), Some("private"));
        assert_eq!(h.userns_mode, None);
        assert_eq!(h.uts_mode, None);
        // Nothing of the host but /dev/null, once per rented GPU, where the toolkit reads the
        // device list: the only GPUs an unprivileged container gets with gpum's toolkit settings.
        let mounts = h.mounts.clone().unwrap();
        let targets: Vec<&str> = mounts.iter().filter_map(|m| m.target.as_deref()).collect();
        assert_eq!(
            targets,
            ["/var/run/nvidia-container-devices/GPU-1111", "/var/run/nvidia-container-devices/GPU-2222"]
        );
        assert!(mounts.iter().all(|m| m.source.as_deref() == Some("/dev/null")
            && m.typ == Some(MountTypeEnum::BIND)
            && m.read_only == Some(true)));
        assert_eq!((h.binds, h.devices, h.volumes_from), (None, None, None), "nothing else of the host");
        assert_eq!(h.readonly_rootfs, Some(false));
        assert_eq!(h.init, Some(true));
        assert_eq!(h.restart_policy.unwrap().name, Some(RestartPolicyNameEnum::NO));
        assert_eq!(h.port_bindings, None);
        let log = h.log_config.unwrap().config.unwrap();
        assert_eq!((log["max-size"].as_str(), log["max-file"].as_str()), (LOG_MAX_SIZE, LOG_MAX_FILES));

        // Without the disk limit (an engine that cannot), and the test seam without GPUs.
        let c = container_config(&spec(), "sha256:img", HashMap::new(), false, false);
        let h = c.host_config.unwrap();
        assert_eq!(h.storage_opt, None);
        assert_eq!(h.device_requests, None);
        assert_eq!(h.mounts, None, "no GPU asked for, no device list");
        assert_eq!(c.env.unwrap().last().unwrap(), "NVIDIA_VISIBLE_DEVICES=GPU-1111,GPU-2222");
        // The image's command when the spec has none.
        let c = container_config(
            &RentalSpec { command: vec![], disk_gib: 0, ..spec() },
            "i",
            HashMap::new(),
            true,
            true,
        );
        assert_eq!(c.cmd, None);
        assert_eq!(c.host_config.unwrap().storage_opt, None, "no size asked, no option");
    }

    #[test]
    fn rental_gpu_uuids_name_one_device_each() {
        assert!(valid_gpu_uuid("GPU-11111111-2222-3333-4444-555555555555"));
        assert!(valid_gpu_uuid("MIG-GPU-11111111-2222-3333-4444-555555555555/1/0"));
        assert!(valid_gpu_uuid("MIG-4ab9e2c2-1e1e-5a1d-9b9c-0123456789ab"));
        for bad in ["all", "none", "void", "0", "GPU-", "GPU-a,GPU-b", "GPU-a b", "GPU-a\n", "gpu-abc", ""] {
            assert!(!valid_gpu_uuid(bad), "{bad:?}");
        }
    }

    #[test]
    fn rental_disk_limit_refusals_are_recognised() {
        // Docker 20.10 and 27 on overlay2 over ext4, verbatim.
        assert!(is_disk_limit_unsupported(
            "--storage-opt is supported only for overlay over xfs with 'pquota' mount option"
        ));
        assert!(!is_disk_limit_unsupported("No such image: sha256:abc"));
    }

    #[test]
    fn rental_book_reports_every_rental_and_forgets_delivered_final_ones() {
        let b = Book::default();
        b.set("rent-a", RentalState::Running, None, None);
        b.set("rent-b", RentalState::Gone, None, None);
        let sent = b.reports();
        assert_eq!(sent.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), vec!["rent-a", "rent-b"]);
        // Not yet delivered: kept even when no longer listed.
        b.forget_delivered(&HashSet::new());
        assert_eq!(b.reports().len(), 2);
        b.acked(&sent);
        // Still listed by the platform: kept.
        b.forget_delivered(&HashSet::from(["rent-b"]));
        assert_eq!(b.reports().len(), 2);
        b.forget_delivered(&HashSet::new());
        assert_eq!(
            b.reports().iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            vec!["rent-a"],
            "running stays"
        );
        // A change after the ack needs its own ack.
        b.set("rent-a", RentalState::Gone, None, None);
        b.forget_delivered(&HashSet::new());
        assert_eq!(b.reports().len(), 1);
        // Bounded.
        for i in 0..(limits::MAX_RENTALS_PER_NODE + 5) {
            b.set(&format!("rent-{i:03}"), RentalState::Running, None, None);
        }
        assert_eq!(b.reports().len(), limits::MAX_RENTALS_PER_NODE);
    }
}
