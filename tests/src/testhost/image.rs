//! The test host's images, built by `tests/testhost/build-image.sh` and cached by recipe.
//!
//! The tag is `gpum-e2e/host:<12 hex digits>`, a SHA-256 over every file the build reads
//! (`tests/testhost/` and `tests/sim/`, paths and contents, in sorted order), so an edit to a
//! script, the package list or the simulation rebuilds, and an unchanged recipe is reused across
//! runs and by every scenario of a run ("built once per run" in CI, where the engine starts
//! empty). `<tag>-docker` is the variant with Debian's `docker.io` installed.
//!
//! Building holds an exclusive `flock` on `target/gpum-e2e-image.lock`, so parallel runners
//! build once.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// The repository of the host images on the outer engine.
pub const REPO: &str = "gpum-e2e/host";

/// The two images of one recipe.
#[derive(Debug, Clone)]
pub struct Images {
    /// Debian 12, systemd, the local repositories and the simulation; no Docker.
    pub base: String,
    /// The same with Debian's `docker.io` installed and enabled.
    pub docker: String,
}

/// The tags for the recipe in this checkout.
pub fn tags() -> Result<Images> {
    let h = recipe_hash()?;
    Ok(Images { base: format!("{REPO}:{h}"), docker: format!("{REPO}:{h}-docker") })
}

/// The first 12 hex digits of the SHA-256 over the recipe's files.
pub fn recipe_hash() -> Result<String> {
    let root = crate::workspace_root();
    let mut files = Vec::new();
    for dir in ["tests/testhost", "tests/sim"] {
        collect(&root.join(dir), &mut files)?;
    }
    // The toolkit's default settings, which the simulated toolkit package installs.
    files.push(root.join("tests/fixtures/preflight/nvidia-container-runtime-config.toml"));
    files.sort();
    let mut h = Sha256::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap_or(f);
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(fs::read(f).with_context(|| format!("reading {}", f.display()))?);
        h.update([0]);
    }
    Ok(hex::encode(h.finalize())[..12].to_string())
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            collect(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

pub fn image_exists(tag: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", tag])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Returns the images of this recipe, building them first when either is absent.
pub fn ensure() -> Result<Images> {
    let images = tags()?;
    if image_exists(&images.base) && image_exists(&images.docker) {
        return Ok(images);
    }
    let target = crate::target_dir();
    fs::create_dir_all(&target)?;
    let lock_path = target.join("gpum-e2e-image.lock");
    let file = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)?;
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if image_exists(&images.base) && image_exists(&images.docker) {
        return Ok(images);
    }
    let script = crate::workspace_root().join("tests/testhost/build-image.sh");
    eprintln!(
        "gpum-e2e: building the test host images {} and {} (a few minutes)",
        images.base, images.docker
    );
    let t = std::time::Instant::now();
    let st = Command::new("bash")
        .arg(&script)
        .arg(&images.base)
        .arg(&images.docker)
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !st.success() {
        bail!("{} failed: {st}", script.display());
    }
    eprintln!("gpum-e2e: built the test host images in {:.0} s", t.elapsed().as_secs_f64());
    Ok(images)
}
