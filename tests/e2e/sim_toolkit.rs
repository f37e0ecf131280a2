//! The SIMULATED NVIDIA Container Toolkit hook (`tests/sim/toolkit/nvidia-container-runtime-hook`)
//! on crafted OCI bundles, no engine: it must choose a container's GPUs as the real hook does with
//! each setting (NVIDIA/nvidia-container-toolkit `internal/config/image/cuda_image.go`,
//! `VisibleDevices`: device-list mounts first when accepted, else `NVIDIA_VISIBLE_DEVICES` only
//! when privileged or accepted from unprivileged containers), and the simulated `nvidia-smi` it
//! copies in must show exactly those GPUs. The scenarios `rental-gpus` and the rental suite rely
//! on both. Needs `sh` and `jq` (the hook's own dependencies in the test host).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// The simulated machine's UUIDs (tests/sim/nvml and the hook agree on them).
const GPU0: &str = "GPU-5a1e0000-0000-4000-8000-000000000000";
const GPU1: &str = "GPU-5a1e0000-0000-4000-8000-000000000001";
/// gpum's settings, as the installer writes them.
const GPUMS: &str = "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n\
                     accept-nvidia-visible-devices-as-volume-mounts = true\n";
/// The toolkit as its package ships it (both keys commented out: the defaults).
fn shipped() -> String {
    std::fs::read_to_string(
        gpum_tests::workspace_root().join("tests/fixtures/preflight/nvidia-container-runtime-config.toml"),
    )
    .unwrap()
}

fn sim(rel: &str) -> PathBuf {
    gpum_tests::workspace_root().join("tests/sim").join(rel)
}

/// One container start: its spec's env, mounts and privilege, under a toolkit `config` (`None`:
/// no file, the defaults).
#[derive(Default)]
struct Start<'a> {
    env: &'a [&'a str],
    mounts: Vec<Value>,
    privileged: bool,
    config: Option<&'a str>,
}

/// A read-only `/dev/null` device-list mount, as the agent adds one per rented GPU.
fn device_mount(id: &str) -> Value {
    json!({"destination": format!("{MOUNT_ROOT}/{id}"), "type": "bind", "source": "/dev/null", "options": ["rbind", "ro"]})
}

/// What the hook did: its exit, stderr, and the GPUs `nvidia-smi -L` lists inside (`None`: the
/// hook left the container alone, no GPU container); the driver capabilities it mounted and the
/// IMEX channels it made (empty when it left the container alone).
struct Seen {
    hook: Output,
    gpus: Option<Vec<String>>,
    smi: Option<Output>,
    caps: Vec<String>,
    imex: Vec<String>,
}

fn start(s: Start) -> Seen {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let mut caps = vec!["CAP_CHOWN", "CAP_NET_BIND_SERVICE"];
    if s.privileged {
        caps.push("CAP_SYS_ADMIN");
    }
    let mut mounts = vec![json!({"destination": "/proc", "type": "proc", "source": "proc"})];
    mounts.extend(s.mounts);
    let spec = json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "env": s.env, "capabilities": {"bounding": caps, "effective": caps}},
        "root": {"path": "rootfs"},
        "mounts": mounts,
    });
    std::fs::write(bundle.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
    let gpu_json = dir.path().join("gpu.json");
    std::fs::write(&gpu_json, r#"{"state":"ok","gpus":2,"model":"NVIDIA H100 80GB HBM3 (SIMULATED)","driver":"550.90.07","hook":"ok"}"#)
        .unwrap();
    let toolkit = dir.path().join("config.toml");
    if let Some(c) = s.config {
        std::fs::write(&toolkit, c).unwrap();
    }
    let mut child = Command::new("sh")
        .arg(sim("toolkit/nvidia-container-runtime-hook"))
        .arg("prestart")
        .env("GPUM_SIM_CONFIG", &gpu_json)
        .env("GPUM_SIM_SMI", sim("nvidia-smi"))
        .env("GPUM_SIM_TOOLKIT_CONFIG", &toolkit)
        .env("GPUM_SIM_HOOK_LOG", dir.path().join("hook.log"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh");
    let state = json!({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": bundle});
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &serde_json::to_vec(&state).unwrap()).unwrap();
    let hook = child.wait_with_output().unwrap();
    let lines = |f: &str| -> Vec<String> {
        std::fs::read_to_string(rootfs.join("etc/gpum-sim").join(f))
            .map(|t| t.lines().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (caps, imex) = (lines("capabilities"), lines("imex-channels"));
    let smi_path = rootfs.join("usr/bin/nvidia-smi");
    if !smi_path.exists() {
        return Seen { hook, gpus: None, smi: None, caps, imex };
    }
    // The container's own nvidia-smi, reading the files the hook put into its root.
    let smi = Command::new("sh")
        .arg(&smi_path)
        .arg("-L")
        .env("GPUM_SIM_CONFIG", rootfs.join("etc/gpum-sim/gpu.json"))
        .env("GPUM_SIM_VISIBLE", rootfs.join("etc/gpum-sim/visible"))
        .output()
        .unwrap();
    let gpus = String::from_utf8_lossy(&smi.stdout)
        .lines()
        .filter_map(|l| l.split("(UUID: ").nth(1).map(|u| u.trim_end_matches(')').to_string()))
        .collect();
    Seen { hook, gpus: Some(gpus), smi: Some(smi), caps, imex }
}

fn gpus(s: &Seen) -> Option<Vec<&str>> {
    assert!(s.hook.status.success(), "hook failed: {}", String::from_utf8_lossy(&s.hook.stderr));
    s.gpus.as_ref().map(|g| g.iter().map(String::as_str).collect())
}

fn jq_present() {
    let ok = Command::new("jq").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "the simulated hook needs jq (apt-get install jq)");
    assert!(Path::new("/bin/sh").exists());
}

#[test]
fn the_toolkits_defaults_let_an_images_env_take_any_gpu() {
    jq_present();
    for config in [None, Some(shipped())] {
        let c = config.as_deref();
        let all = start(Start { env: &["NVIDIA_VISIBLE_DEVICES=all"], config: c, ..Default::default() });
        assert_eq!(gpus(&all), Some(vec![GPU0, GPU1]), "defaults (file: {})", c.is_some());
        // The device-list mounts are not read unless accepted: the env decides.
        let s = start(Start {
            env: &[&format!("NVIDIA_VISIBLE_DEVICES={GPU0}")],
            mounts: vec![device_mount(GPU1)],
            config: c,
            ..Default::default()
        });
        assert_eq!(gpus(&s), Some(vec![GPU0]));
    }
}

#[test]
fn gpums_settings_ignore_an_unprivileged_env_and_take_the_device_list_mounts() {
    jq_present();
    let c = Some(GPUMS);
    // `docker run --gpus all` (moby sets the variable) or an image's NVIDIA_VISIBLE_DEVICES=all:
    // no GPU container at all, and no error, as the real hook.
    let s = start(Start { env: &["NVIDIA_VISIBLE_DEVICES=all"], config: c, ..Default::default() });
    assert_eq!(gpus(&s), None);
    // A rental: the agent's mount for its one UUID; the image's `all` (last in the env, as moby
    // appends its own value first) changes nothing.
    let s = start(Start {
        env: &[&format!("NVIDIA_VISIBLE_DEVICES={GPU1}"), "NVIDIA_VISIBLE_DEVICES=all"],
        mounts: vec![device_mount(GPU1)],
        config: c,
        ..Default::default()
    });
    assert_eq!(gpus(&s), Some(vec![GPU1]));
    // The probe's mount for every GPU.
    let s = start(Start { mounts: vec![device_mount("all")], config: c, ..Default::default() });
    assert_eq!(gpus(&s), Some(vec![GPU0, GPU1]));
    // Only a /dev/null source is a device-list entry: an owner's bind of another file is not.
    let mut fake = device_mount(GPU0);
    fake["source"] = json!("/tmp/x");
    let s = start(Start {
        env: &["NVIDIA_VISIBLE_DEVICES=all"],
        mounts: vec![fake],
        config: c,
        ..Default::default()
    });
    assert_eq!(gpus(&s), None);
    // A privileged container may still choose by env (the toolkit's rule; gpum never creates one).
    let s = start(Start {
        env: &["NVIDIA_VISIBLE_DEVICES=0"],
        privileged: true,
        config: c,
        ..Default::default()
    });
    assert_eq!(gpus(&s), Some(vec![GPU0]));
}

#[test]
fn the_variables_values_as_the_real_hook_reads_them() {
    jq_present();
    let env = |e: &[&str]| gpus(&start(Start { env: e, ..Default::default() })).map(|v| v.join(","));
    assert_eq!(env(&["NVIDIA_VISIBLE_DEVICES=1"]), Some(GPU1.into()), "an index");
    assert_eq!(env(&[&format!("NVIDIA_VISIBLE_DEVICES={GPU1},{GPU0}")]), Some(format!("{GPU0},{GPU1}")));
    assert_eq!(
        env(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=all"]),
        Some(format!("{GPU0},{GPU1}"))
    );
    assert_eq!(env(&["NVIDIA_VISIBLE_DEVICES=void"]), None, "void: not a GPU container");
    assert_eq!(env(&["NVIDIA_VISIBLE_DEVICES="]), None, "empty: not a GPU container");
    assert_eq!(env(&["PATH=/bin"]), None, "unset on a non-CUDA image");
    assert_eq!(env(&["CUDA_VERSION=12.2"]), Some(format!("{GPU0},{GPU1}")), "a legacy CUDA image: all");
    assert_eq!(env(&["CUDA_VERSION=12.2", "NVIDIA_REQUIRE_CUDA=cuda>=12.2"]), None);
    // none: a GPU container (driver files) without any device; nvidia-smi finds none.
    let s = start(Start { env: &["NVIDIA_VISIBLE_DEVICES=none"], ..Default::default() });
    assert_eq!(gpus(&s), Some(vec![]));
    assert_eq!(s.smi.unwrap().status.code(), Some(6), "No devices were found");
    // An unknown device fails the container's start, as nvidia-container-cli does.
    let s = start(Start { env: &["NVIDIA_VISIBLE_DEVICES=GPU-deadbeef"], ..Default::default() });
    assert_eq!(s.hook.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&s.hook.stderr).contains("GPU-deadbeef: unknown device"));
    let s = start(Start { env: &["NVIDIA_VISIBLE_DEVICES=2"], ..Default::default() });
    assert_eq!(s.hook.status.code(), Some(1), "index 2 on a two-GPU machine");
}

/// Issue 43: the toolkit reads more of the container's `NVIDIA_*` variables than the GPU list,
/// whatever the container's privileges and gpum's settings: the driver capabilities (which
/// parts of the driver are mounted), the IMEX channels, MIG configuration. The hook decides them
/// as the real one does (see its header); an image's own values widen what a rental gets, and
/// the agent's environment (`container_env`, put by the engine in place of the image's variables
/// of the same names) asks for the spec's capabilities and nothing else.
#[test]
fn an_images_other_nvidia_variables_are_overridden_by_the_agents() {
    jq_present();
    let image = [
        "NVIDIA_DRIVER_CAPABILITIES=all",
        "NVIDIA_IMEX_CHANNELS=0,1",
        "NVIDIA_MOFED=enabled",
        "NVIDIA_GDS=enabled",
        "NVIDIA_NVSWITCH=enabled",
        "NVIDIA_GDRCOPY=enabled",
        "NVIDIA_REQUIRE_JETPACK=csv-mounts=all",
    ];
    let all: Vec<String> =
        ["compat32", "compute", "display", "graphics", "ngx", "utility", "video"].map(String::from).into();
    let rental = |caps: &[&str]| gpum_protocol::RentalSpec {
        id: "rent-00112233445566aa".into(),
        image: "i".into(),
        gpu_uuids: vec![GPU1.into()],
        cpu_millis: 1000,
        memory_mib: 1024,
        disk_gib: 1,
        shm_mib: 64,
        env: vec![],
        command: vec![],
        ends_at: 1,
        ports: vec![],
        driver_capabilities: caps.iter().map(|c| c.to_string()).collect(),
    };
    // The engine: the container's variables in place of the image's of the same name.
    let merged = |agent: &[String]| -> Vec<String> {
        let named = |v: &str| v.split_once('=').map(|(k, _)| k.to_string()).unwrap_or_default();
        let mut env: Vec<String> = image
            .iter()
            .filter(|v| !agent.iter().any(|a| named(a) == named(v)))
            .map(|v| v.to_string())
            .collect();
        env.extend(agent.iter().cloned());
        env
    };
    for config in [Some(GPUMS), None] {
        // The image alone (its GPU chosen by the device-list mount, as the agent's is).
        let alone = merged(&[format!("NVIDIA_VISIBLE_DEVICES={GPU1}")]);
        let env: Vec<&str> = alone.iter().map(String::as_str).collect();
        let s = start(Start { env: &env, mounts: vec![device_mount(GPU1)], config, ..Default::default() });
        assert_eq!(gpus(&s), Some(vec![GPU1]));
        assert_eq!(s.caps, all, "the image's `all`: every part of the driver");
        // IMEX channels by variable: only where the toolkit accepts variables (its defaults).
        let channels: &[&str] = if config.is_some() { &[] } else { &["0", "1"] };
        assert_eq!(s.imex, channels, "settings: {config:?}");

        // The agent's environment over it.
        for (asked, want) in
            [(&[][..], &["compute", "utility"][..]), (&["video", "compute"], &["compute", "video"])]
        {
            let agent = gpum_agent::docker::rental::container_env(&rental(asked));
            let env = merged(&agent);
            let env: Vec<&str> = env.iter().map(String::as_str).collect();
            let s =
                start(Start { env: &env, mounts: vec![device_mount(GPU1)], config, ..Default::default() });
            assert!(s.hook.status.success(), "{}", String::from_utf8_lossy(&s.hook.stderr));
            assert_eq!(s.caps, want, "settings: {config:?}");
            assert!(s.imex.is_empty(), "no IMEX channel: {:?}", s.imex);
            // Without "utility" the driver's nvidia-smi is not mounted.
            assert_eq!(s.smi.is_some(), want.contains(&"utility"));
        }
    }
    // What the toolkit refuses, it refuses at the container's start: a name outside its set, and
    // MIG configuration in an unprivileged container (the agent sets both variables).
    for (env, want) in [
        (&["NVIDIA_DRIVER_CAPABILITIES=compute,gpu"][..], "unsupported capabilities"),
        (&["NVIDIA_MIG_CONFIG_DEVICES=all"], "cannot set MIG_CONFIG_DEVICES in non privileged container"),
        (&["NVIDIA_MIG_MONITOR_DEVICES=all"], "cannot set MIG_MONITOR_DEVICES in non privileged container"),
    ] {
        let visible = format!("NVIDIA_VISIBLE_DEVICES={GPU0}");
        let env: Vec<&str> = env.iter().copied().chain([visible.as_str()]).collect();
        let s = start(Start { env: &env, ..Default::default() });
        assert_eq!(s.hook.status.code(), Some(1), "{env:?}");
        assert!(
            String::from_utf8_lossy(&s.hook.stderr).contains(want),
            "{}",
            String::from_utf8_lossy(&s.hook.stderr)
        );
    }
    // A legacy CUDA image without the variable gets every capability; a current one the default.
    let s = start(Start { env: &["CUDA_VERSION=12.2"], ..Default::default() });
    assert_eq!(s.caps, all);
    let s = start(Start { env: &["NVIDIA_VISIBLE_DEVICES=0"], ..Default::default() });
    assert_eq!(s.caps, ["compute", "utility"]);
}
