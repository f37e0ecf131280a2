//! Tiny local Docker images for the suites, built with `docker import` (the engine here cannot
//! pull).
//!
//! The root filesystem is `/bin/busybox` from the `busybox-static` package, one symlink per
//! applet, and the SIMULATED `nvidia-smi` of `tests/sim/nvidia-smi` at `/usr/bin/nvidia-smi`.
//! [`busybox`] is the plain image (for containers the reconciler tests start);
//! [`sim_nvidia`] is one tag per simulated `nvidia-smi` scenario, which is baked into the tag as
//! `ENV GPUM_SIM_NVIDIA_SMI=<scenario>`, plus `VOLUME /gpum-sim-scratch` so that every probe
//! container gets an anonymous volume whose removal the tests can check.
//!
//! The agent runs only probe images pinned by digest; [`pinned`] gives the reference the test
//! suites hand it for a local image: `gpum-test/busybox@<image id>`. An imported image has no
//! repository digest, so the agent resolves that reference by image id (as it does for an image
//! loaded with `docker load` on the test host). [`custom`] adds Dockerfile instructions (a
//! `LABEL`, an `ENTRYPOINT`) to the plain image, and [`with_files`] files of its own (an
//! `nvidia-smi` that lies), for tests of what the agent must not trust. [`SIM_NVIDIA_SMI`] is
//! the simulated `nvidia-smi` itself, for a test's simulated toolkit to mount.
//!
//! Images are cached by tag. The tag carries [`IMAGE_VERSION`] and a hash of the simulation
//! script, so editing the script rebuilds; an absent tag is rebuilt (checked once per process). Tests run in parallel
//! processes, so building holds an exclusive `flock` on a file in the target directory, and
//! re-checks the tag once it holds it.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

/// Bump when the layout of the root filesystem changes.
pub const IMAGE_VERSION: &str = "1";
/// The repository every test image lives in. The agent refuses to run a probe without a GPU
/// request on any other image.
pub const REPO: &str = "gpum-test/busybox";
/// The simulated `nvidia-smi` scenarios (see `tests/sim/nvidia-smi`).
pub const SCENARIOS: [&str; 6] = ["ok", "fail", "unknown_error", "mismatch", "hang", "flood"];

const SIM_SCRIPT: &str = include_str!("../sim/nvidia-smi");
/// The simulated `nvidia-smi` (`tests/sim/nvidia-smi`).
pub const SIM_NVIDIA_SMI: &str = SIM_SCRIPT;
const BUSYBOX: &str = "/bin/busybox";

/// `gpum-test/busybox:<version>`: busybox plus the simulated `nvidia-smi` (scenario `ok`).
pub fn busybox() -> Result<String> {
    let tag = format!("{REPO}:{}", version());
    ensure(&tag, &["ENV GPUM_SIM_NVIDIA_SMI=ok".to_string()])?;
    Ok(tag)
}

/// `gpum-test/busybox:<version>-<scenario>`: the simulated `nvidia-smi` behaves as `scenario`.
pub fn sim_nvidia(scenario: &str) -> Result<String> {
    if !SCENARIOS.contains(&scenario) {
        bail!("no simulated nvidia-smi scenario {scenario:?}; see tests/sim/nvidia-smi");
    }
    let tag = format!("{REPO}:{}-{}", version(), scenario.replace('_', "-"));
    ensure(&tag, &[format!("ENV GPUM_SIM_NVIDIA_SMI={scenario}"), "VOLUME /gpum-sim-scratch".to_string()])?;
    Ok(tag)
}

/// `gpum-test/busybox:<version>-x-<name>`: the plain image (scenario `ok`) plus `changes`, each a
/// `docker import --change` instruction such as `LABEL gpum.managed=true`. `name` tells the
/// variants apart and must be a valid tag part; each distinct `changes` needs its own `name`.
pub fn custom(name: &str, changes: &[&str]) -> Result<String> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        bail!("image variant name {name:?}: letters, digits and dashes only");
    }
    let tag = format!("{REPO}:{}-x-{name}", version());
    let mut all = vec!["ENV GPUM_SIM_NVIDIA_SMI=ok".to_string()];
    all.extend(changes.iter().map(|c| c.to_string()));
    ensure(&tag, &all)?;
    Ok(tag)
}

/// `gpum-test/busybox:<version>-f-<name>-<hash>`: the plain image with `files` added or
/// replaced, each `(path in the image, contents)` and executable, and no scenario in its
/// environment: for tests of what an image may carry (its own `nvidia-smi`, say). The tag holds
/// a hash of the files, so other contents under the same `name` build another image.
pub fn with_files(name: &str, files: &[(&str, &str)]) -> Result<String> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        bail!("image variant name {name:?}: letters, digits and dashes only");
    }
    let mut h: u32 = 0x811c9dc5;
    for (path, text) in files {
        for b in path.bytes().chain([0]).chain(text.bytes()).chain([0]) {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x01000193);
        }
    }
    let tag = format!("{REPO}:{}-f-{name}-{h:08x}", version());
    let files: Vec<(String, String)> = files.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
    if READY.lock().unwrap_or_else(|e| e.into_inner()).contains(&tag) {
        return Ok(tag);
    }
    build_if_absent(&tag, &[], &files)?;
    READY.lock().unwrap_or_else(|e| e.into_inner()).insert(tag.clone());
    Ok(tag)
}

/// The image id (`sha256:<64 hex>`) of a local tag.
pub fn id_of(tag: &str) -> Result<String> {
    let out = Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", tag]).output()?;
    if !out.status.success() {
        bail!("docker image inspect {tag}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `gpum-test/busybox@sha256:<id>`: `tag` pinned by digest, as the agent accepts a probe image.
pub fn pinned(tag: &str) -> Result<String> {
    Ok(format!("{REPO}@{}", id_of(tag)?))
}

/// `<IMAGE_VERSION>-<8 hex digits of the script's FNV-1a hash>`.
fn version() -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in SIM_SCRIPT.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    format!("{IMAGE_VERSION}-{h:08x}")
}

fn image_exists(tag: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", tag])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Tags this process already found or built: a suite asks for its image once per container it
/// creates, and each `docker image inspect` is a process of its own.
static READY: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn ensure(tag: &str, changes: &[String]) -> Result<()> {
    if READY.lock().unwrap_or_else(|e| e.into_inner()).contains(tag) {
        return Ok(());
    }
    build_if_absent(tag, changes, &[])?;
    READY.lock().unwrap_or_else(|e| e.into_inner()).insert(tag.to_string());
    Ok(())
}

fn build_if_absent(tag: &str, changes: &[String], files: &[(String, String)]) -> Result<()> {
    if image_exists(tag) {
        return Ok(());
    }
    let lock_path = crate::target_dir().join("gpum-test-images.lock");
    fs::create_dir_all(crate::target_dir())?;
    let file = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)?;
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", lock_path.display()))?;
    // Another process may have built it while we waited.
    if image_exists(tag) {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let tar = dir.path().join("rootfs.tar");
    build_rootfs(&dir.path().join("rootfs"), files)?;
    run(Command::new("tar")
        .arg("-C")
        .arg(dir.path().join("rootfs"))
        .args(["--owner=0", "--group=0", "-cf"])
        .arg(&tar)
        .arg("."))?;
    let mut import = Command::new("docker");
    import.arg("import");
    for c in changes {
        import.args(["--change", c]);
    }
    import.arg(&tar).arg(tag);
    run(&mut import).with_context(|| format!("docker import {tag}"))?;
    Ok(())
}

fn build_rootfs(root: &Path, files: &[(String, String)]) -> Result<()> {
    for d in ["bin", "usr/bin", "etc", "tmp", "proc", "sys", "dev"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy(BUSYBOX, root.join("bin/busybox"))
        .with_context(|| format!("{BUSYBOX} (install busybox-static)"))?;
    let list = Command::new(BUSYBOX).arg("--list").output().context("busybox --list")?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
        if applet.is_empty() || applet == "busybox" || applet.contains('/') {
            continue;
        }
        symlink("busybox", root.join("bin").join(applet))?;
    }
    let smi = root.join("usr/bin/nvidia-smi");
    fs::write(&smi, SIM_SCRIPT)?;
    fs::set_permissions(&smi, fs::Permissions::from_mode(0o755))?;
    fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    fs::write(root.join("etc/group"), "root:x:0:\n")?;
    for (path, text) in files {
        let at = root.join(path.trim_start_matches('/'));
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&at, text)?;
        fs::set_permissions(&at, fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
