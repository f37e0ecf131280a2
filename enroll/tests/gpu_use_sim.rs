//! The agent's GPU check after a rental (issue 33) asks NVML, through nvml-wrapper, which
//! processes run on each rented GPU and whether it answers (`inventory::gpu_use`). Here the real
//! dlopen and the real symbol lookups (`nvmlDeviceGetHandleByUUID`,
//! `nvmlDeviceGetComputeRunningProcesses_v3`, `nvmlDeviceGetGraphicsRunningProcesses_v3`, …) run
//! against the SIMULATED NVML (`tests/sim/nvml/libnvidia-ml-sim.c`, the only simulated layer),
//! driven by its JSON file as the test host's `/etc/gpum-sim/gpu.json` drives it.
//!
//! The simulation reads `GPUM_SIM_CONFIG` from the environment of the process that loads it, and
//! a test may not change its own environment; so the test runs itself again as a child with the
//! variable set, and the child does the checks.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

use gpum_enroll::inventory::{GpuUse, gpu_use};

const TEST: &str = "gpu_use_through_the_simulated_nvml";

/// The UUID the simulation gives GPU `i`.
fn uuid(i: u32) -> String {
    format!("GPU-5a1e0000-0000-4000-8000-{i:012}")
}

/// Builds the simulation into `dir`. gcc is one of the tests' dependencies
/// (tests/setup-deps.sh), so its absence fails the test.
fn build_sim(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/sim/nvml/libnvidia-ml-sim.c");
    let out = dir.join("libnvidia-ml-sim.so");
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc, to build the NVML simulation (tests/setup-deps.sh installs gcc)");
    assert!(st.success(), "cc {}: {st}", src.display());
    out
}

#[test]
fn gpu_use_through_the_simulated_nvml() {
    if let (Ok(config), Ok(lib)) = (std::env::var("GPUM_SIM_CONFIG"), std::env::var("GPUM_TEST_SIM_LIB")) {
        return child(Path::new(&config), &lib);
    }
    let dir = std::env::temp_dir().join(format!("gpum-gpu-use-sim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lib = build_sim(&dir);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture"])
        .env("GPUM_SIM_CONFIG", dir.join("gpu.json"))
        .env("GPUM_TEST_SIM_LIB", &lib)
        .env_remove("GPUM_SIM_NVML")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    // The child ran this very test (and not nothing).
    assert!(text.contains("1 passed"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The checks, in the child whose environment points the simulation at `config`.
fn child(config: &Path, lib: &str) {
    let set = |json: &str| std::fs::write(config, json).unwrap();
    let all = [uuid(0), uuid(1)];

    // A quiet machine: both GPUs free.
    set(r#"{"state":"ok","gpus":2}"#);
    assert_eq!(gpu_use(lib, &all), vec![(uuid(0), GpuUse::Free), (uuid(1), GpuUse::Free)]);

    // What a hung workload leaves: compute processes on GPU 0, a graphics one on GPU 1; and a
    // UUID this machine does not have.
    set(r#"{"state":"ok","gpus":2,"processes":"0:4243,0:4242","graphics":"1:77"}"#);
    let found = gpu_use(lib, &[uuid(0), uuid(1), uuid(7)]);
    assert_eq!(found[0], (uuid(0), GpuUse::Busy(vec![4242, 4243])));
    assert_eq!(found[1], (uuid(1), GpuUse::Busy(vec![77])));
    // Not one of this machine's GPUs (NVML_ERROR_NOT_FOUND): not a GPU that does not answer
    // (issue 46: no quarantine over it).
    assert_eq!(found[2], (uuid(7), GpuUse::NotHere));

    // A GPU that fell off the bus.
    set(r#"{"state":"ok","gpus":2,"lost":"1"}"#);
    let found = gpu_use(lib, &all);
    assert_eq!(found[0], (uuid(0), GpuUse::Free));
    assert!(matches!(&found[1], (_, GpuUse::NoAnswer(why)) if why.contains("fell off the bus")), "{found:?}");

    // The driver gone: no GPU answers.
    set(r#"{"state":"driver_not_loaded","gpus":2}"#);
    assert!(gpu_use(lib, &all).iter().all(|(_, u)| matches!(u, GpuUse::NoAnswer(_))));

    // Cleared again: free. The check's own init and shutdown leave another handle of the same
    // process (the agent's inventory) working, as NVML's counted init does.
    set(r#"{"state":"ok","gpus":2,"processes":""}"#);
    let kept = nvml_wrapper::Nvml::builder().lib_path(std::ffi::OsStr::new(lib)).init().unwrap();
    assert_eq!(gpu_use(lib, &all), vec![(uuid(0), GpuUse::Free), (uuid(1), GpuUse::Free)]);
    assert_eq!(kept.device_count().unwrap(), 2, "the inventory's handle still works");
}
