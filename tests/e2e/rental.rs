//! Rentals, the agent's side (issue 33), against the real engine on this machine: the container
//! as the engine made it, exits, stop and expiry, an agent restart, the limits, and containers
//! that are not gpum's.
//!
//! The engine here has no NVIDIA toolkit, so these rentals run through the agent's fenced test
//! seam [`rental::Runner::simulation_without_gpu_request`] (no device request, `gpum-test/`
//! images only); everything else about the container is production's. The GPU fields (the device
//! request by UUID) are proved by the pure tests in `agent/src/docker/rental.rs`; here the
//! environment that would widen them is checked inside the running container. On a machine with
//! a GPU, `tests/real-gpu/check.sh` runs a container with the rental's flags and checks that it
//! sees only the rented GPU.
//!
//! Every test scopes its client and its containers with a unique `gpum.test.scope` label, and a
//! guard removes whatever carries it when the test ends. What a test checks, it checks through the
//! docker CLI, independently of the agent's bollard calls.
#![allow(clippy::disallowed_methods)]

use std::process::Command;
use std::time::{Duration, Instant};

use gpum_agent::docker::Docker;
use gpum_agent::docker::rental::{self, Book, Machine, Runner};
use gpum_agent::egress::{self, Gate};
use gpum_enroll::config::default_registries;
use gpum_protocol::{EnvVar, RentalSpec, RentalState};
use gpum_tests::docker_scope::{Scope, docker, exists};
use gpum_tests::images;
use serde_json::Value;

/// Far in the future: 2033.
const LATER: u64 = 2_000_000_000;
const NOW: u64 = 1_800_000_000;

fn inspect(name: &str) -> Value {
    let v: Value = serde_json::from_str(&docker(&["inspect", name])).expect("inspect JSON");
    v[0].clone()
}

/// A unique rental id.
fn rental_id() -> String {
    format!("rent-{:016x}", rand_u64())
}

fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    t ^ (u64::from(std::process::id()) << 40) ^ 0x9e37_79b9_7f4a_7c15
}

fn spec(image: &str, command: &[&str]) -> RentalSpec {
    let id = rental_id();
    // Two GPUs of its own (no two rentals share one).
    let hex = &id[5..];
    RentalSpec {
        gpu_uuids: vec![
            format!("GPU-{}-0000-0000-0000-{hex}0000", &hex[..8]),
            format!("GPU-{}-0000-0000-0000-{hex}0001", &hex[..8]),
        ],
        id,
        image: image.to_string(),
        cpu_millis: 500,
        memory_mib: 256,
        disk_gib: 1,
        shm_mib: 32,
        env: vec![
            EnvVar { name: "GREETING".into(), value: "привет".into() },
            EnvVar { name: "NVIDIA_VISIBLE_DEVICES".into(), value: "all".into() },
            EnvVar { name: "CUDA_VISIBLE_DEVICES".into(), value: "0,1,2,3,4,5,6,7".into() },
        ],
        command: command.iter().map(|s| s.to_string()).collect(),
        ends_at: LATER,
        ports: vec![],
        driver_capabilities: vec![],
    }
}

fn busybox() -> String {
    images::pinned(&images::busybox().expect("test image")).expect("pinned")
}

/// The egress table's gate on this machine's own nftables, as the agent has it.
fn gate() -> Gate {
    Gate::new(std::sync::Arc::new(gpum_host::RealHost::new()))
}

/// This machine's CPUs and memory as the agent's inventory reports them (what `run` gives its
/// runner).
fn machine() -> Machine {
    let (cpu_cores, ram_mib) =
        gpum_enroll::inventory::Gatherer::new(std::sync::Arc::new(gpum_host::RealHost::new())).capacity();
    Machine { cpu_cores, ram_mib }
}

fn runner() -> Runner {
    Runner::new(&default_registries(), gate(), machine())
        .enabled(true)
        .simulation_without_gpu_request()
        .with_stop_grace(Duration::from_secs(1))
}

async fn round(d: &Docker, book: &Book, desired: &[RentalSpec], now: u64) {
    rental::reconcile(d, &runner(), book, desired, now).await.expect("the engine answered");
}

fn state(book: &Book, id: &str) -> RentalState {
    book.get(id).unwrap_or_else(|| panic!("no report for {id}")).state
}

/// Waits until the container is no longer running.
fn wait_exited(name: &str) {
    let t = Instant::now();
    while docker(&["inspect", "--format", "{{.State.Running}}", name]) == "true" {
        assert!(t.elapsed() < Duration::from_secs(30), "{name} still running");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_container_has_every_isolation_flag_and_its_env_cannot_widen_the_gpus() {
    let scope = Scope::new("rental-flags");
    let d = scope.docker();
    let book = Book::default();
    // The image says every GPU, as CUDA images do.
    let image =
        images::pinned(&images::custom("rental-nvall", &["ENV NVIDIA_VISIBLE_DEVICES=all"]).expect("image"))
            .expect("pinned");
    let s = spec(&image, &["sleep", "3600"]);
    round(&d, &book, std::slice::from_ref(&s), NOW).await;
    let report = book.get(&s.id).unwrap();
    assert_eq!(report.state, RentalState::Running, "{report:?}");

    let name = rental::container_name(&s.id);
    let c = inspect(&name);
    let h = &c["HostConfig"];
    assert_eq!(c["Config"]["Labels"]["gpum.managed"], "true");
    assert_eq!(c["Config"]["Labels"]["gpum.rental"], s.id.as_str());
    assert_eq!(h["NanoCpus"], 500_000_000i64);
    assert_eq!(h["Memory"], 256i64 * 1024 * 1024);
    assert_eq!(h["MemorySwap"], h["Memory"], "swap equal to memory");
    assert_eq!(h["PidsLimit"], rental::PIDS_LIMIT);
    assert_eq!(h["ShmSize"], 32i64 * 1024 * 1024);
    assert_eq!(h["Ulimits"][0]["Name"], "nofile");
    assert_eq!(h["Ulimits"][0]["Soft"], rental::NOFILE);
    assert_eq!(h["Ulimits"][0]["Hard"], rental::NOFILE);
    assert_eq!(h["CapDrop"], serde_json::json!(["ALL"]));
    assert_eq!(h["CapAdd"], serde_json::json!(rental::CAP_ADD));
    assert_eq!(h["SecurityOpt"], serde_json::json!(["no-new-privileges:true"]));
    assert_eq!(h["Privileged"], false);
    assert_eq!(h["NetworkMode"], rental::NETWORK);
    assert_eq!(h["PidMode"], "", "private PID namespace");
    assert_eq!(h["IpcMode"], "private");
    assert_eq!(h["UsernsMode"], "");
    assert!(h["Binds"].is_null() && h["Devices"].as_array().is_none_or(Vec::is_empty), "{h}");
    assert!(c["Mounts"].as_array().unwrap().is_empty(), "no mounts, so no Docker socket: {}", c["Mounts"]);
    assert_eq!(h["ReadonlyRootfs"], false);
    assert_eq!(h["Init"], true);
    assert_eq!(h["RestartPolicy"]["Name"], "no");
    assert_eq!(h["AutoRemove"], false);
    assert_eq!(h["LogConfig"]["Config"]["max-size"], rental::LOG_MAX_SIZE);
    // The disk: limited where the engine can, else said so in the report.
    match h["StorageOpt"]["size"].as_str() {
        Some(size) => {
            assert_eq!(size, "1G");
            assert_eq!(report.reason, None);
        }
        None => assert_eq!(report.reason.as_deref(), Some(rental::DISK_LIMIT_UNSUPPORTED), "{report:?}"),
    }

    // Inside: the rented GPUs only, whatever the image and the spec said.
    let env = docker(&[
        "exec",
        &name,
        "sh",
        "-c",
        "echo \"$NVIDIA_VISIBLE_DEVICES|$CUDA_VISIBLE_DEVICES|$GREETING\"",
    ]);
    assert_eq!(env, format!("{}|{}", s.gpu_uuids.join(","), "|привет"));
    // The kernel's view: no new privileges, the default seccomp filter, and only the kept
    // capabilities (CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, KILL 5, SETGID 6, SETUID 7,
    // NET_BIND_SERVICE 10).
    let status = docker(&["exec", &name, "cat", "/proc/1/status"]);
    let field =
        |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("").to_string();
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2", "filter mode: the default profile");
    let want: u64 = [0, 1, 3, 5, 6, 7, 10].iter().map(|b| 1u64 << b).sum();
    assert_eq!(u64::from_str_radix(&field("CapEff:"), 16).unwrap(), want);
    assert_eq!(u64::from_str_radix(&field("CapBnd:"), 16).unwrap(), want);
    assert_eq!(docker(&["exec", &name, "sh", "-c", "ulimit -n"]), rental::NOFILE.to_string());

    // gpum's network: a labelled bridge without inter-container traffic.
    let n = inspect(rental::NETWORK);
    assert_eq!(n["Driver"], "bridge");
    assert_eq!(n["Labels"][rental::LABEL_NETWORK], "true");
    assert_eq!(n["Options"]["com.docker.network.bridge.enable_icc"], "false");

    // The next round adopts it as it is.
    let started = c["State"]["StartedAt"].clone();
    round(&d, &book, std::slice::from_ref(&s), NOW).await;
    assert_eq!(inspect(&name)["State"]["StartedAt"], started);
}

/// Issue 43: the toolkit reads more of an image's `NVIDIA_*` variables than the GPU list, and
/// each mounts more of the driver or more device nodes. The agent sets every one of them, so the
/// container (whose environment the engine gives the toolkit's hook) holds the agent's values,
/// not the image's: the spec's driver capabilities (default `compute,utility`) and nothing
/// else. `sim_toolkit` shows what the toolkit makes of either.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_images_nvidia_variables_are_the_agents() {
    let scope = Scope::new("rental-nvidia-env");
    let d = scope.docker();
    let book = Book::default();
    let image = images::pinned(
        &images::custom(
            "rental-nvidia-wide",
            &[
                "ENV NVIDIA_DRIVER_CAPABILITIES=all",
                "ENV NVIDIA_MOFED=enabled",
                "ENV NVIDIA_GDS=enabled",
                "ENV NVIDIA_GDRCOPY=enabled",
                "ENV NVIDIA_NVSWITCH=enabled",
                "ENV NVIDIA_IMEX_CHANNELS=all",
                "ENV NVIDIA_MIG_CONFIG_DEVICES=all",
                "ENV NVIDIA_MIG_MONITOR_DEVICES=all",
                "ENV NVIDIA_REQUIRE_JETPACK=csv-mounts=all",
            ],
        )
        .expect("image"),
    )
    .expect("pinned");
    let default = spec(&image, &["sleep", "3600"]);
    let video = RentalSpec {
        driver_capabilities: vec!["compute".into(), "utility".into(), "video".into()],
        ..spec(&image, &["sleep", "3600"])
    };
    // The owner allows video here (`rental_driver_capabilities`); by default only compute and
    // utility.
    let allowing = runner().driver_capabilities(&["compute".into(), "utility".into(), "video".into()]);
    let desired = [default.clone(), video.clone()];
    rental::reconcile(&d, &runner(), &book, std::slice::from_ref(&video), NOW).await.unwrap();
    let r = book.get(&video.id).unwrap();
    assert_eq!(r.state, RentalState::Failed, "{r:?}");
    assert!(r.reason.as_deref().unwrap_or("").contains("video is not one this machine allows"), "{r:?}");
    assert!(!exists("container", &rental::container_name(&video.id)));
    let book = Book::default();
    rental::reconcile(&d, &allowing, &book, &desired, NOW).await.unwrap();
    for (s, caps) in [(&default, "compute,utility"), (&video, "compute,utility,video")] {
        let report = book.get(&s.id).unwrap();
        assert_eq!(report.state, RentalState::Running, "{report:?}");
        let name = rental::container_name(&s.id);
        // The environment the engine hands the runtime (the image's merged with the container's).
        let env: Vec<String> = serde_json::from_value(inspect(&name)["Config"]["Env"].clone()).unwrap();
        let visible = s.gpu_uuids.join(",");
        let nvidia: std::collections::BTreeMap<&str, &str> =
            env.iter().filter_map(|v| v.split_once('=')).filter(|(k, _)| k.starts_with("NVIDIA_")).collect();
        let want: std::collections::BTreeMap<&str, &str> = [
            ("NVIDIA_DRIVER_CAPABILITIES", caps),
            ("NVIDIA_MOFED", "disabled"),
            ("NVIDIA_GDS", "disabled"),
            ("NVIDIA_GDRCOPY", "disabled"),
            ("NVIDIA_NVSWITCH", "disabled"),
            ("NVIDIA_IMEX_CHANNELS", "void"),
            ("NVIDIA_MIG_CONFIG_DEVICES", ""),
            ("NVIDIA_MIG_MONITOR_DEVICES", ""),
            ("NVIDIA_REQUIRE_JETPACK", ""),
            ("NVIDIA_VISIBLE_DEVICES", visible.as_str()),
        ]
        .into_iter()
        .collect();
        assert_eq!(nvidia, want, "{env:?}");
        assert_eq!(env.iter().filter(|v| v.starts_with("NVIDIA_DRIVER_CAPABILITIES=")).count(), 1);
        // And inside, as the workload sees it.
        let inside =
            docker(&["exec", &name, "sh", "-c", "echo \"$NVIDIA_DRIVER_CAPABILITIES|$NVIDIA_MOFED\""]);
        assert_eq!(inside, format!("{caps}|disabled"));
    }
    // A name outside the toolkit's set fails the rental before anything of it is made.
    let unknown = RentalSpec { driver_capabilities: vec!["all".into()], ..spec(&image, &["sleep", "3600"]) };
    round(&d, &book, std::slice::from_ref(&unknown), NOW).await;
    let r = book.get(&unknown.id).unwrap();
    assert_eq!(r.state, RentalState::Failed, "{r:?}");
    assert!(r.reason.as_deref().unwrap_or("").contains("driver_capabilities"), "{r:?}");
    assert!(!exists("container", &rental::container_name(&unknown.id)));
}

/// Issue 43: the engine reads a CPU or memory limit of 0 as "no limit". A rental whose limits
/// are zero, absent (the protocol reads them as 0) or beyond this machine is refused before
/// anything of it is made (no pull, no container), and its report, which the next heartbeat
/// carries to the platform, says why.
#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_without_limits_or_beyond_the_machine_is_refused_before_anything_is_made() {
    let scope = Scope::new("rental-limits");
    let d = scope.docker();
    let book = Book::default();
    let m = machine();
    // An image this engine does not hold: a refusal any later would have tried to pull it.
    let absent = format!("gpum-test/never-pulled@sha256:{}", "cd".repeat(32));
    let sleep = |image: &str| spec(image, &["sleep", "3600"]);
    let without = |image: &str| -> RentalSpec {
        let mut v = serde_json::to_value(sleep(image)).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("cpu_millis");
        o.remove("memory_mib");
        serde_json::from_value(v).expect("a spec without limits is read, to be refused")
    };
    let cases = [
        (RentalSpec { cpu_millis: 0, ..sleep(&busybox()) }, "no CPU limit"),
        (RentalSpec { memory_mib: 0, ..sleep(&busybox()) }, "no memory limit"),
        (without(&busybox()), "no CPU limit"),
        (RentalSpec { cpu_millis: m.cpu_cores * 1000 + 1, ..sleep(&busybox()) }, "beyond this machine"),
        (RentalSpec { memory_mib: m.ram_mib + 1, ..sleep(&busybox()) }, "beyond this machine"),
        (RentalSpec { memory_mib: u64::MAX, ..sleep(&busybox()) }, "beyond this machine"),
        (RentalSpec { cpu_millis: 0, ..sleep(&absent) }, "no CPU limit"),
    ];
    for (s, want) in cases {
        round(&d, &book, std::slice::from_ref(&s), NOW).await;
        let r = book.get(&s.id).unwrap();
        assert_eq!(r.state, RentalState::Failed, "{want}: {r:?}");
        let why = r.reason.as_deref().unwrap_or("");
        assert!(why.starts_with("refused: ") && why.contains(want), "{want}: {r:?}");
        assert!(!exists("container", &rental::container_name(&s.id)), "{want}: nothing made");
        // Not tried again while listed.
        round(&d, &book, std::slice::from_ref(&s), NOW).await;
        assert_eq!(book.get(&s.id).unwrap(), r);
    }
    assert!(!exists("image", &absent), "nothing pulled");
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_exit_code_is_reported_and_nothing_restarts_it() {
    let scope = Scope::new("rental-exit");
    let d = scope.docker();
    let book = Book::default();
    let s = spec(&busybox(), &["sh", "-c", "exit 7"]);
    let desired = [s.clone()];
    round(&d, &book, &desired, NOW).await;
    let name = rental::container_name(&s.id);
    let id = docker(&["inspect", "--format", "{{.Id}}", &name]);
    wait_exited(&name);
    round(&d, &book, &desired, NOW).await;
    let r = book.get(&s.id).unwrap();
    assert_eq!((r.state, r.exit_code), (RentalState::Exited, Some(7)), "{r:?}");
    // Still listed: left as it is, not started again, not recreated.
    round(&d, &book, &desired, NOW).await;
    assert_eq!(
        docker(&["inspect", "--format", "{{.Id}} {{.State.Running}} {{.RestartCount}}", &name]),
        format!("{id} false 0")
    );
    assert_eq!(state(&book, &s.id), RentalState::Exited);
    // The platform lets it go: removed, gone.
    round(&d, &book, &[], NOW).await;
    assert!(!exists("container", &id));
    assert_eq!(state(&book, &s.id), RentalState::Gone);
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_stop_and_expiry_remove_it_with_its_volumes_and_report_gone() {
    let scope = Scope::new("rental-gone");
    let d = scope.docker();
    let book = Book::default();
    // This image declares a VOLUME: each container gets an anonymous volume.
    let image = images::pinned(&images::sim_nvidia("ok").expect("image")).expect("pinned");
    let stopped = spec(&image, &["sleep", "3600"]);
    let expiring = RentalSpec { ends_at: NOW + 60, ..spec(&image, &["sleep", "3600"]) };
    let both = [stopped.clone(), expiring.clone()];
    round(&d, &book, &both, NOW).await;
    let mut volumes = Vec::new();
    let mut ids = Vec::new();
    for s in &both {
        assert_eq!(state(&book, &s.id), RentalState::Running);
        let c = inspect(&rental::container_name(&s.id));
        ids.push(c["Id"].as_str().unwrap().to_string());
        let v: Vec<String> =
            c["Mounts"].as_array().unwrap().iter().map(|m| m["Name"].as_str().unwrap().to_string()).collect();
        assert_eq!(v.len(), 1, "{v:?}");
        volumes.extend(v);
    }
    // The platform drops one; the other is still listed, but its end passed by this machine's
    // clock.
    round(&d, &book, std::slice::from_ref(&expiring), NOW + 60).await;
    for (i, s) in both.iter().enumerate() {
        assert_eq!(state(&book, &s.id), RentalState::Gone, "{:?}", book.get(&s.id));
        assert!(!exists("container", &ids[i]), "container of {} left behind", s.id);
        assert!(!exists("volume", &volumes[i]), "volume {} left behind", volumes[i]);
    }
    // Still listed after its end: never started again.
    round(&d, &book, std::slice::from_ref(&expiring), NOW + 120).await;
    assert!(!exists("container", &rental::container_name(&expiring.id)));
    assert_eq!(state(&book, &expiring.id), RentalState::Gone);
    // A rental listed already past its end never starts.
    let late = RentalSpec { ends_at: NOW, ..spec(&image, &["sleep", "3600"]) };
    round(&d, &book, std::slice::from_ref(&late), NOW).await;
    assert_eq!(state(&book, &late.id), RentalState::Gone);
    assert!(!exists("container", &rental::container_name(&late.id)));
    // Both reports go out until a heartbeat carrying them is answered and the platform no longer
    // lists them.
    let sent = book.reports();
    assert!(sent.iter().any(|r| r.id == stopped.id && r.state == RentalState::Gone));
    book.acked(&sent);
    round(&d, &book, &[], NOW + 180).await;
    assert!(book.reports().is_empty(), "{:?}", book.reports());
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_agent_restart_adopts_a_running_rental() {
    let scope = Scope::new("rental-adopt");
    let s = spec(&busybox(), &["sleep", "3600"]);
    let desired = [s.clone()];
    {
        let (d, book) = (scope.docker(), Book::default());
        round(&d, &book, &desired, NOW).await;
        assert_eq!(state(&book, &s.id), RentalState::Running);
    }
    let name = rental::container_name(&s.id);
    let before = docker(&["inspect", "--format", "{{.Id}} {{.State.StartedAt}} {{.State.Pid}}", &name]);
    // A new agent: a new client, nothing remembered.
    let (d, book) = (scope.docker(), Book::default());
    round(&d, &book, &desired, NOW).await;
    assert_eq!(state(&book, &s.id), RentalState::Running);
    let after = docker(&["inspect", "--format", "{{.Id}} {{.State.StartedAt}} {{.State.Pid}}", &name]);
    assert_eq!(before, after, "not recreated, not restarted");
    // What it said of its disk, it says again.
    let unlimited =
        !docker(&["inspect", "--format", "{{json .HostConfig.StorageOpt}}", &name]).contains("size");
    assert_eq!(
        book.get(&s.id).unwrap().reason.as_deref(),
        unlimited.then_some(rental::DISK_LIMIT_UNSUPPORTED)
    );
    assert_eq!(docker(&["inspect", "--format", "{{.State.Running}}", &name]), "true");
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_reconcile_never_touches_a_container_that_is_not_gpums() {
    let scope = Scope::new("rental-foreign");
    let d = scope.docker();
    let book = Book::default();
    let label = scope.label();
    // The owner's containers, in the test's scope: one named like a rental with the rental label
    // but not `gpum.managed`; one whose `gpum.managed=true` comes from its image.
    let plain = rental_id();
    let inherited = rental_id();
    let labelled_image = images::custom("rental-managed-label", &["LABEL gpum.managed=true"]).expect("image");
    for (rid, image, extra) in [
        (&plain, images::busybox().unwrap(), vec!["--label", "gpum.managed=false"]),
        (&inherited, labelled_image, vec![]),
    ] {
        let name = rental::container_name(rid);
        let rl = format!("gpum.rental={rid}");
        let mut args =
            vec!["run", "-d", "--name", &name, "--network", "none", "--label", &label, "--label", &rl];
        args.extend(extra);
        args.extend([image.as_str(), "sleep", "3600"]);
        docker(&args);
    }
    let ids: Vec<String> = [&plain, &inherited]
        .iter()
        .map(|r| docker(&["inspect", "--format", "{{.Id}}", &rental::container_name(r)]))
        .collect();
    // Nothing desired: nothing of the owner's is torn down.
    round(&d, &book, &[], NOW).await;
    // Desired under the same id: the agent cannot create its own (the name is taken) and says so,
    // and the owner's container stays as it was.
    let s = RentalSpec { id: plain.clone(), ..spec(&busybox(), &["sleep", "3600"]) };
    round(&d, &book, std::slice::from_ref(&s), NOW).await;
    let r = book.get(&plain).unwrap();
    assert_eq!(r.state, RentalState::Failed, "{r:?}");
    // And past its end.
    round(&d, &book, std::slice::from_ref(&s), LATER + 1).await;
    for id in &ids {
        assert_eq!(
            docker(&["inspect", "--format", "{{.State.Running}}", id]),
            "true",
            "the owner's {id} was touched"
        );
    }
    assert!(book.get(&inherited).is_none());
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_memory_hog_is_oom_killed_inside_and_a_fork_bomb_stops_at_the_pids_limit() {
    let scope = Scope::new("rental-limits");
    let d = scope.docker();
    let book = Book::default();
    // 32 MiB, and a shell that wants 200 MB in one variable.
    let hog = RentalSpec {
        memory_mib: 32,
        ..spec(&busybox(), &["sh", "-c", "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"])
    };
    // As many sleeping processes as it can make, counting aloud; the shell ends when a fork
    // fails.
    let bomb = RentalSpec {
        memory_mib: 1024,
        ..spec(
            &busybox(),
            &[
                "sh",
                "-c",
                "i=0; while [ $i -lt 6000 ]; do sleep 600 & i=$((i+1)); [ $((i % 128)) -eq 0 ] && echo $i; done; echo unbounded",
            ],
        )
    };
    let desired = [hog.clone(), bomb.clone()];
    round(&d, &book, &desired, NOW).await;
    let hog_name = rental::container_name(&hog.id);
    wait_exited(&hog_name);
    round(&d, &book, &desired, NOW).await;
    let r = book.get(&hog.id).unwrap();
    assert_eq!((r.state, r.exit_code), (RentalState::Exited, Some(137)), "{r:?}");
    assert_eq!(docker(&["inspect", "--format", "{{.State.OOMKilled}}", &hog_name]), "true");
    assert!(!docker(&["logs", &hog_name]).contains("survived"));

    // The fork bomb: it forked until the pids limit (tini, the shell and its sleeps), then a fork
    // failed and it ended; this machine (and the agent in it) can still start processes.
    let bomb_name = rental::container_name(&bomb.id);
    wait_exited(&bomb_name);
    let out = Command::new("docker").args(["logs", &bomb_name]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stderr.contains("can't fork"), "{stderr}");
    assert!(!stdout.contains("unbounded"));
    let forked: i64 = stdout.lines().filter_map(|l| l.trim().parse().ok()).max().unwrap_or(0);
    assert!(
        (rental::PIDS_LIMIT - 256..rental::PIDS_LIMIT).contains(&forked),
        "it forked {forked} processes, the limit is {}",
        rental::PIDS_LIMIT
    );
    assert!(Command::new("true").status().unwrap().success());
    round(&d, &book, &desired, NOW).await;
    let r = book.get(&bomb.id).unwrap();
    assert_eq!(r.state, RentalState::Exited, "{r:?}");
    // And the teardown takes all of them with it.
    round(&d, &book, &[], NOW).await;
    assert_eq!(state(&book, &bomb.id), RentalState::Gone);
    assert!(!exists("container", &bomb_name));
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_uninstall_removes_rentals_with_their_volumes_and_nothing_of_the_owners() {
    let scope = Scope::new("rental-uninstall");
    let d = scope.docker();
    let book = Book::default();
    let tag = images::sim_nvidia("ok").expect("image");
    let s = spec(&images::pinned(&tag).expect("pinned"), &["sleep", "3600"]);
    round(&d, &book, std::slice::from_ref(&s), NOW).await;
    let name = rental::container_name(&s.id);
    let c = inspect(&name);
    let volume = c["Mounts"][0]["Name"].as_str().expect("an anonymous volume").to_string();
    // The owner's container from the same image, with its own anonymous volume.
    let owner = format!("owner-{}", s.id);
    docker(&[
        "run",
        "-d",
        "--name",
        &owner,
        "--network",
        "none",
        "--label",
        &scope.label(),
        &tag,
        "sleep",
        "3600",
    ]);
    let owner_volume = inspect(&owner)["Mounts"][0]["Name"].as_str().unwrap().to_string();

    let root = tempfile::tempdir().unwrap();
    let host = gpum_host::RealHost::with_root(root.path());
    let u = gpum_agent::uninstall::uninstall(&host, Ok(&d), gpum_common::Lang::En).await;
    assert!(u.errors.is_empty(), "{:?}", u.errors);
    assert!(u.removed.iter().any(|r| r.contains(&name)), "{:?}", u.removed);
    assert!(!exists("container", &name));
    assert!(!exists("volume", &volume), "the rental's volume {volume} left behind");
    assert_eq!(docker(&["inspect", "--format", "{{.State.Running}}", &owner]), "true");
    assert!(exists("volume", &owner_volume));
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_images_are_pinned_from_accepted_registries_and_gpus_are_required() {
    let scope = Scope::new("rental-refused");
    let d = scope.docker();
    let book = Book::default();
    let hex = "ab".repeat(32);
    let production = Runner::new(&default_registries(), gate(), machine()).enabled(true);
    for (image, gpus, want) in [
        (images::busybox().unwrap(), true, "not pinned by digest"),
        (
            format!("127.0.0.1:5000/x@sha256:{hex}"),
            true,
            "registry 127.0.0.1:5000 is not one this node accepts",
        ),
        (format!("192.168.1.20/nvidia/cuda@sha256:{hex}"), true, "registry 192.168.1.20 is not one"),
        (busybox(), false, "no GPUs rented"),
    ] {
        let mut s = spec(&image, &["sleep", "3600"]);
        if !gpus {
            s.gpu_uuids.clear();
        }
        rental::reconcile(&d, &production, &book, std::slice::from_ref(&s), NOW).await.unwrap();
        let r = book.get(&s.id).unwrap();
        assert_eq!(r.state, RentalState::Failed, "{image}");
        assert!(r.reason.as_deref().unwrap_or("").contains(want), "{image}: {r:?}");
        assert!(!exists("container", &rental::container_name(&s.id)));
        // Not tried again while listed.
        rental::reconcile(&d, &production, &book, std::slice::from_ref(&s), NOW).await.unwrap();
        assert_eq!(book.get(&s.id).unwrap(), r);
    }
    // Off (the owner wrote `rentals = false`; a runner is off until enabled): nothing starts,
    // and the rental says why.
    let off = spec(&busybox(), &["sleep", "3600"]);
    rental::reconcile(
        &d,
        &Runner::new(&default_registries(), gate(), machine()),
        &book,
        std::slice::from_ref(&off),
        NOW,
    )
    .await
    .unwrap();
    let r = book.get(&off.id).unwrap();
    assert_eq!((r.state, r.reason.as_deref()), (RentalState::Failed, Some(rental::RENTALS_OFF)));
    assert!(!exists("container", &rental::container_name(&off.id)), "nothing ran");
    // The test seam runs nothing but the test images.
    let s = spec(&format!("docker.io/library/busybox@sha256:{hex}"), &["true"]);
    round(&d, &book, std::slice::from_ref(&s), NOW).await;
    assert_eq!(state(&book, &s.id), RentalState::Failed);
}

#[ignore = "needs a Docker engine"]
#[tokio::test]
async fn rental_two_rentals_never_share_a_gpu() {
    let scope = Scope::new("rental-shared-gpu");
    let d = scope.docker();
    let book = Book::default();
    let first = spec(&busybox(), &["sleep", "3600"]);
    round(&d, &book, std::slice::from_ref(&first), NOW).await;
    assert_eq!(state(&book, &first.id), RentalState::Running);
    // A second rental on one of the same GPUs, and one on a GPU of its own.
    let mut second = spec(&busybox(), &["sleep", "3600"]);
    second.gpu_uuids = vec!["GPU-aaaaaaaa-0000-0000-0000-000000000000".into(), first.gpu_uuids[1].clone()];
    let mut third = spec(&busybox(), &["sleep", "3600"]);
    third.gpu_uuids = vec!["GPU-bbbbbbbb-0000-0000-0000-000000000000".into()];
    // And one whose "UUID" would widen the list.
    let mut fourth = spec(&busybox(), &["sleep", "3600"]);
    fourth.gpu_uuids = vec!["GPU-cccccccc,all".into()];
    round(&d, &book, &[first.clone(), second.clone(), third.clone(), fourth.clone()], NOW).await;
    let r = book.get(&second.id).unwrap();
    assert_eq!(r.state, RentalState::Failed);
    assert!(r.reason.unwrap().contains("held by another rental"));
    assert!(!exists("container", &rental::container_name(&second.id)));
    assert_eq!(state(&book, &third.id), RentalState::Running);
    assert_eq!(state(&book, &fourth.id), RentalState::Failed);
    assert!(!exists("container", &rental::container_name(&fourth.id)));
    assert_eq!(state(&book, &first.id), RentalState::Running);
}

fn nft(args: &[&str]) -> std::process::Output {
    Command::new("nft").args(args).output().expect("nft (apt install nftables)")
}

/// Issue 33: no rental starts unless gpum's egress table is verified in the kernel. A round puts
/// it back when it is gone (a reboot or a flush: this test deletes it by hand), the kernel's
/// table is checked from outside the agent (`nft -j list`), and on a machine without `nft`
/// (a fake host that has none) nothing of the rental is made and it says why.
#[ignore = "needs a Docker engine and nftables (root)"]
#[tokio::test]
async fn rental_starts_only_behind_the_verified_egress_table() {
    let scope = Scope::new("rental-egress");
    let d = scope.docker();
    let book = Book::default();
    let tag = images::sim_nvidia("ok").expect("image");
    let image = images::pinned(&tag).expect("pinned");

    // Gone before the round (other tests' rounds may put it back meanwhile: either way the
    // round verifies it before it starts anything).
    let _ = nft(&["delete", "table", egress::FAMILY, egress::TABLE]);
    let s = spec(&image, &["sleep", "3600"]);
    round(&d, &book, std::slice::from_ref(&s), NOW).await;
    assert_eq!(state(&book, &s.id), RentalState::Running, "{:?}", book.get(&s.id));
    let listed = nft(&["-j", "list", "table", egress::FAMILY, egress::TABLE]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    assert_eq!(egress::verify_listing(&String::from_utf8_lossy(&listed.stdout)), Ok(()));

    // No nft on the machine: refused, nothing created.
    let bare = Runner::new(
        &default_registries(),
        Gate::new(std::sync::Arc::new(gpum_host::fake::FakeHost::new())),
        machine(),
    )
    .enabled(true)
    .simulation_without_gpu_request();
    let t = spec(&image, &["sleep", "3600"]);
    rental::reconcile(&d, &bare, &book, std::slice::from_ref(&t), NOW).await.unwrap();
    let r = book.get(&t.id).unwrap();
    assert_eq!((r.state, r.reason.as_deref()), (RentalState::Failed, Some(egress::NFT_MISSING)));
    assert!(!exists("container", &rental::container_name(&t.id)), "nothing ran");
}

/// Issue 43, the whole way: a compromised platform lists a rental whose stored spec says
/// `cpu_millis: 0` (Docker's "no limit"), then one whose spec has lost its CPU and memory limits
/// (edited in its database, as `agent.rs`'s `queue_raw_command` plays a platform that sends what
/// its API refuses). The real agent refuses each before anything of it is made, and its
/// heartbeat report shows on the platform: the rental `failed`, with why.
#[ignore = "needs a Docker engine"]
#[tokio::test(flavor = "multi_thread")]
async fn rental_without_limits_from_a_compromised_platform_is_reported_failed_with_why() {
    use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};
    use gpum_tests::tunnel::{
        LONG, ScopedContainers, agent_log, create_rental_running, rentable_node, rental_state, start_agent,
        write_agent_config,
    };
    gpum_tests::require_docker(
        "rental_without_limits_from_a_compromised_platform_is_reported_failed_with_why",
    );
    let p = TestPlatform::start(PlatformOpts::insecure_http());
    let node = rentable_node(&p).await;
    // An edit of a stored spec, and `tamper`, which makes it to rental `id`'s.
    type Edit = dyn Fn(&mut serde_json::Map<String, serde_json::Value>) + Sync;
    let tamper = |id: &str, f: &Edit| {
        p.with_db(|c| {
            let spec: String = c
                .query_row("SELECT spec_json FROM rentals WHERE id = ?1", gpum_platform::params![id], |row| {
                    row.get(0)
                })
                .unwrap();
            let mut v: serde_json::Value = serde_json::from_str(&spec).unwrap();
            f(v.as_object_mut().unwrap());
            c.execute(
                "UPDATE rentals SET spec_json = ?1 WHERE id = ?2",
                gpum_platform::params![&v.to_string(), id],
            )
            .unwrap();
        })
    };
    let containers = ScopedContainers::new("limits");
    let dir = tempfile::tempdir().unwrap();
    write_agent_config(dir.path(), p.url(), &node, &containers.0);
    // Each made and edited while no agent runs, so the agent never sees the honest spec.
    let edits: [&Edit; 2] = [&|o| drop(o.insert("cpu_millis".into(), 0.into())), &|o| {
        assert!(o.remove("cpu_millis").is_some() && o.remove("memory_mib").is_some())
    }];
    for edit in edits {
        let r = create_rental_running(&p, &node.node_id, &busybox(), "sleep 3600");
        tamper(&r.id, edit);
        let _agent = start_agent(dir.path(), 2);
        wait_until(LONG, "the rental reported", || !rental_state(&p, &r.id).is_empty());
        let shown = p.cli_json(&["rentals", "show", &r.id]);
        assert_eq!(shown["state"], "failed", "{shown}\n{}", agent_log(dir.path()));
        assert_eq!(shown["reason"], "refused: no CPU limit (cpu_millis is 0 or absent)", "{shown}");
        assert!(!exists("container", &rental::container_name(&r.id)), "nothing made");
    }
}
