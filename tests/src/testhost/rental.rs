//! What every rental scenario needs (issue 33): the real platform and the real agent meeting in
//! the test host, from the dashboard's one-liner to a rental's last trace.
//!
//! - [`make_rentable`]: one-liner, the operator's check image, the GPU check passed on the
//!   SIMULATED GPUs, a price, not paused, and the owner's `rentals = true` ([`enable_rentals`]);
//!   returns the node id once the platform's verdict is `rentable`.
//! - [`load_image`]: a busybox-static image made inside the host's own engine with `docker import`
//!   (so nothing is pulled and the host image needs no change), with `VOLUME /data` so that every
//!   rental has an anonymous volume to leave behind; its reference is pinned by the image id,
//!   which the agent finds locally as it does for a `docker load`ed image.
//! - [`Spec`], [`create`], [`show`], [`wait_state`], [`stop`]: the platform's admin CLI inside the
//!   host (the same transactions as the admin API), JSON in, [`RentalSummary`] out.
//! - [`Seen`] and [`nothing_left`]: the rental's container as the inner `docker` CLI sees it while
//!   it runs, and after its end the proof, from outside the agent, that nothing of it is left: no
//!   container by label or name, no anonymous volume, no endpoint on `gpum-rentals`.
//!
//! The agent's names (`gpum-rental-<id>`, the `gpum.rental` label, the network) are its crate's
//! constants, so the checks follow them.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpum_agent::docker::rental::{LABEL_RENTAL, NETWORK, container_name};
use gpum_protocol::{RentableState, RentalState, RentalSummary, VerificationState};

use super::stage::HOST_CA;
use super::steps::{PLATFORM_URL, install_from, nodes, set_gpu, set_probe_image, wait_until};
use super::{Host, Run};

/// The rental image's repository in the host's engine (`gpum-test/`: the agent's test prefix).
pub const IMAGE_REPO: &str = "gpum-test/rental";

/// Installs with the dashboard's one-liner on a host with `gpus` SIMULATED GPUs and makes the node
/// rentable; returns its id. An install that does not exit 0, or a node that does not become
/// rentable within a minute, is an error carrying what was seen.
pub fn make_rentable(h: &Host, gpus: u32) -> Result<String> {
    make_rentable_from(h, gpus, PLATFORM_URL)
}

/// [`make_rentable`] with the one-liner of the platform at `url` (`rental-tunnel`'s platform in
/// its own network namespace).
pub fn make_rentable_from(h: &Host, gpus: u32, url: &str) -> Result<String> {
    set_gpu(
        h,
        &format!(
            r#"{{"state":"ok","gpus":{gpus},"model":"NVIDIA H100 80GB HBM3 (SIMULATED)","driver":"550.90.07","hook":"ok"}}"#
        ),
    )?;
    set_probe_image(h)?;
    let code = h.join_code("1h")?;
    let r = install_from(h, url, &format!("--code {code} --ca-file {HOST_CA} --yes"), &[], None)?;
    if r.code != 0 {
        bail!("the one-liner exited {}: {}", r.code, tail(&r.all(), 15));
    }
    let id = h.sh_ok("jq -r .node_id /var/lib/gpum-agent/state.json")?.trim().to_string();
    wait_node(h, &id, 60, "online and verified", |n| {
        n.online && n.verification == VerificationState::Verified
    })?;
    // The owner's page: a price, a one-minute minimum (so a scenario can make a short rental),
    // not paused.
    h.platform(&format!("nodes set {id} --price 1.00 --min-rental 1 --resume"))?;
    enable_rentals(h)?;
    wait_node(h, &id, 60, "rentable", |n| n.rentable.state == RentableState::Rentable)?;
    Ok(id)
}

/// The owner's switch: `rentals = true` in `/etc/gpum-agent/config.toml` (first line, so it is
/// a top-level key whatever tables follow), then the agent restarted and active again. A line
/// already there is set to `true`.
pub fn enable_rentals(h: &Host) -> Result<()> {
    h.sh_ok(
        "f=/etc/gpum-agent/config.toml; \
         if grep -q '^[[:space:]]*rentals[[:space:]]*=' $f; then sed -i 's/^[[:space:]]*rentals[[:space:]]*=.*/rentals = true/' $f; \
         else sed -i '1i rentals = true' $f; fi; \
         test \"$(stat -c %a $f)\" = 600 && systemctl restart gpum-agent",
    )?;
    wait_until(h, "systemctl is-active -q gpum-agent", 30, "the agent active after its restart")
}

/// Polls the platform's node `id` every 500 ms until `ok` holds, for up to `secs`.
pub fn wait_node(
    h: &Host,
    id: &str,
    secs: u64,
    what: &str,
    ok: impl Fn(&gpum_protocol::NodeSummary) -> bool,
) -> Result<gpum_protocol::NodeSummary> {
    let start = Instant::now();
    loop {
        let n = nodes(h)?.into_iter().find(|n| n.id == id);
        match n {
            Some(n) if ok(&n) => return Ok(n),
            _ if start.elapsed() > Duration::from_secs(secs) => {
                bail!("node {id} not {what} within {secs} s: {n:?}");
            }
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// Makes the rental image in the host's engine and returns its pinned reference,
/// `gpum-test/rental@sha256:<image id>`. Busybox-static's applets, `VOLUME /data`, and
/// `sleep 86400` as its command. Needs Docker installed (after [`make_rentable`]).
pub fn load_image(h: &Host) -> Result<String> {
    let id = h.sh_ok(&format!(
        "set -e; d=$(mktemp -d); mkdir -p \"$d\"/bin \"$d\"/etc \"$d\"/tmp \"$d\"/proc \"$d\"/sys \"$d\"/dev \"$d\"/data; \
         cp /bin/busybox \"$d\"/bin/busybox; \
         for a in $(\"$d\"/bin/busybox --list); do [ \"$a\" = busybox ] || ln -s busybox \"$d/bin/$a\"; done; \
         printf 'root:x:0:0:root:/:/bin/sh\\n' > \"$d\"/etc/passwd; printf 'root:x:0:\\n' > \"$d\"/etc/group; \
         tar -C \"$d\" --owner=0 --group=0 -c . \
           | docker import --change 'VOLUME /data' --change 'CMD [\"sleep\",\"86400\"]' - {IMAGE_REPO}:sim; \
         rm -rf \"$d\""
    ))?;
    let id = id.trim();
    if !id.starts_with("sha256:") || id.len() != 71 {
        bail!("docker import printed {id:?}, not an image id");
    }
    Ok(format!("{IMAGE_REPO}@{id}"))
}

/// A rental to create: the operator's `rentals create` fields. [`Spec::new`] gives a small one
/// (1 GPU, half a core, 128 MiB, 1 GiB disk, 16 MiB shm, 10 minutes, the image's command).
#[derive(Debug, Clone)]
pub struct Spec {
    pub node: String,
    pub image: String,
    pub gpus: u32,
    pub cpu_millis: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    pub shm_mib: u64,
    /// `--duration` (`10m`, `90`, …), unless `ends_at` is set.
    pub duration: String,
    /// `--ends-at` in Unix seconds.
    pub ends_at: Option<u64>,
    pub env: Vec<(String, String)>,
    /// The command and its arguments (empty: the image's own).
    pub command: Vec<String>,
    /// The container ports the tenant reaches through the relay (`--port`, issue 34).
    pub ports: Vec<u16>,
}

impl Spec {
    pub fn new(node: &str, image: &str) -> Spec {
        Spec {
            node: node.to_string(),
            image: image.to_string(),
            gpus: 1,
            cpu_millis: 500,
            memory_mib: 128,
            disk_gib: 1,
            shm_mib: 16,
            duration: "10m".to_string(),
            ends_at: None,
            env: Vec::new(),
            command: Vec::new(),
            ports: Vec::new(),
        }
    }

    /// The command, run by `sh -c SCRIPT` inside the container.
    pub fn shell(mut self, script: &str) -> Spec {
        self.command = vec!["sh".into(), "-c".into(), script.into()];
        self
    }
}

/// Creates the rental through the platform's admin CLI (all checks of the admin API apply). For a
/// rental with ports the answer carries the tenant's credential (`tunnel`), shown only here.
pub fn create(h: &Host, s: &Spec) -> Result<RentalSummary> {
    let mut args = format!(
        "--json rentals create --node {} --image {} --gpus {} --cpu-millis {} --memory-mib {} --disk-gib {} --shm-mib {}",
        quote(&s.node),
        quote(&s.image),
        s.gpus,
        s.cpu_millis,
        s.memory_mib,
        s.disk_gib,
        s.shm_mib
    );
    match s.ends_at {
        Some(t) => args.push_str(&format!(" --ends-at {t}")),
        None => args.push_str(&format!(" --duration {}", quote(&s.duration))),
    }
    for (k, v) in &s.env {
        args.push_str(&format!(" --env {}", quote(&format!("{k}={v}"))));
    }
    for p in &s.ports {
        args.push_str(&format!(" --port {p}"));
    }
    if !s.command.is_empty() {
        args.push_str(" --");
        for a in &s.command {
            args.push(' ');
            args.push_str(&quote(a));
        }
    }
    let out = h.platform(&args).context("rentals create")?;
    serde_json::from_str(out.trim()).with_context(|| format!("rentals create printed {out:?}"))
}

/// The rental as the platform shows it.
pub fn show(h: &Host, id: &str) -> Result<RentalSummary> {
    let out = h.platform(&format!("--json rentals show {}", quote(id)))?;
    serde_json::from_str(out.trim()).with_context(|| format!("rentals show printed {out:?}"))
}

/// The operator stops the rental (the platform stops listing it; the agent tears it down).
pub fn stop(h: &Host, id: &str) -> Result<RentalSummary> {
    let out = h.platform(&format!("--json rentals stop {}", quote(id)))?;
    serde_json::from_str(out.trim()).with_context(|| format!("rentals stop printed {out:?}"))
}

/// Polls the platform every 500 ms until the rental's reported state is `state`, for up to
/// `secs`; an error names the last state seen and its reason. A rental that reaches `failed`
/// while another state is awaited ends the wait at once.
pub fn wait_state(h: &Host, id: &str, state: RentalState, secs: u64) -> Result<RentalSummary> {
    let start = Instant::now();
    loop {
        let r = show(h, id)?;
        if r.state == Some(state) {
            return Ok(r);
        }
        let failed = r.state == Some(RentalState::Failed);
        if failed || start.elapsed() > Duration::from_secs(secs) {
            bail!(
                "rental {id}: not {} within {secs} s; the platform shows {:?} ({}), listed {}",
                state.as_str(),
                r.state.map(|s| s.as_str()),
                r.reason.as_deref().unwrap_or("no reason"),
                r.listed
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A rental's container as the inner engine shows it while it runs.
#[derive(Debug, Clone)]
pub struct Seen {
    pub rental: String,
    /// The container's full id.
    pub container: String,
    /// Its anonymous volumes' names.
    pub volumes: Vec<String>,
    /// Its init's PID on the host (`State.Pid`).
    pub pid: u32,
}

/// Reads rental `id`'s container (`gpum-rental-<id>`) with `docker inspect`; an error unless it
/// exists, runs, and carries the rental's label.
pub fn seen(h: &Host, id: &str) -> Result<Seen> {
    let name = container_name(id);
    let out = h.sh_ok(&format!("docker inspect {}", quote(&name)))?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let c = &v[0];
    if c["Config"]["Labels"][LABEL_RENTAL].as_str() != Some(id) {
        bail!("{name} does not carry {LABEL_RENTAL}={id}: {}", c["Config"]["Labels"]);
    }
    if c["State"]["Running"].as_bool() != Some(true) {
        bail!("{name} is not running: {}", c["State"]);
    }
    let volumes = c["Mounts"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["Type"] == "volume")
                .filter_map(|m| m["Name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Ok(Seen {
        rental: id.to_string(),
        container: c["Id"].as_str().context("Id")?.to_string(),
        volumes,
        pid: c["State"]["Pid"].as_u64().context("State.Pid")? as u32,
    })
}

/// What is left of rental `id` in the host's engine, checked with the inner `docker` CLI (not
/// through the agent): a container with its label or its name, an anonymous volume no container
/// uses (the test host makes none but the rentals'), an endpoint on `gpum-rentals` by its name.
/// Empty: nothing. With `seen`, also its very container id and volumes by name.
pub fn nothing_left(h: &Host, id: &str, seen: Option<&Seen>) -> Result<Vec<String>> {
    let name = container_name(id);
    let mut left = Vec::new();
    let by_label =
        h.sh_ok(&format!("docker ps -aq --no-trunc --filter label={LABEL_RENTAL}={}", quote(id)))?;
    if !by_label.trim().is_empty() {
        left.push(format!("a container labelled {LABEL_RENTAL}={id}: {}", by_label.trim()));
    }
    let by_name = h.sh_ok(&format!(
        "docker ps -a --no-trunc --format '{{{{.ID}}}} {{{{.Names}}}}' | awk '$2 == \"{name}\"'"
    ))?;
    if !by_name.trim().is_empty() {
        left.push(format!("a container named {name}: {}", by_name.trim()));
    }
    let dangling = h.sh_ok("docker volume ls -q --filter dangling=true")?;
    if !dangling.trim().is_empty() {
        left.push(format!(
            "volumes no container uses: {}",
            dangling.split_whitespace().collect::<Vec<_>>().join(" ")
        ));
    }
    // The network may be absent (nothing ever attached): then nothing is on it.
    let net = h.sh(&format!("docker network inspect {NETWORK} --format '{{{{json .Containers}}}}'"))?;
    if net.code == 0 {
        let eps: serde_json::Value = serde_json::from_str(net.stdout.trim()).unwrap_or_default();
        for (cid, ep) in eps.as_object().into_iter().flatten() {
            if ep["Name"] == name.as_str() || seen.is_some_and(|s| s.container == *cid) {
                left.push(format!("an endpoint on {NETWORK}: {cid} {}", ep["Name"]));
            }
        }
    }
    if let Some(s) = seen {
        let c = h.sh(&format!("docker inspect --type container {} >/dev/null 2>&1", s.container))?;
        if c.code == 0 {
            left.push(format!("the container {}", s.container));
        }
        for v in &s.volumes {
            if h.sh(&format!("docker volume inspect {} >/dev/null 2>&1", quote(v)))?.code == 0 {
                left.push(format!("its volume {v}"));
            }
        }
        if h.sh(&format!("test -d /proc/{}", s.pid))?.code == 0
            && h.sh(&format!("grep -q {} /proc/{}/cgroup", s.container, s.pid))?.code == 0
        {
            left.push(format!("its init process {}", s.pid));
        }
    }
    Ok(left)
}

/// A cgroup file of the rental's container: `controller` (`pids`, `memory`) and `file`, read on
/// the host (cgroup v1, the `cgroupfs` driver, as this project's machines have, or cgroup v2).
pub fn cgroup_file(h: &Host, s: &Seen, controller: &str, file: &str) -> Result<String> {
    h.sh_ok(&format!(
        "root=/sys/fs/cgroup/{controller}; p=$(grep -m1 ':{controller}:' /proc/{pid}/cgroup | cut -d: -f3); \
         if [ -z \"$p\" ]; then root=/sys/fs/cgroup; p=$(grep -m1 '^0::' /proc/{pid}/cgroup | cut -d: -f3); fi; \
         cat \"$root$p/{file}\"",
        pid = s.pid
    ))
}

/// `s` in single quotes for the host's shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `r`'s output, for a check's report.
pub fn text(r: &RentalSummary) -> Run {
    Run::text(&format!(
        "{} {:?} listed={} exit={:?} reason={:?}",
        r.spec.id,
        r.state.map(|s| s.as_str()),
        r.listed,
        r.exit_code,
        r.reason
    ))
}
