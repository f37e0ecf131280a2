//! One running test host: a fresh container of a host image with systemd as PID 1, a real
//! `dockerd` (when installed) on its own tmpfs data root, no network, and the run's staging
//! directory (the platform binary, the signed artifacts, the TLS files) bind-mounted read-only at
//! `/opt/gpum-e2e`. Dropping it removes the container, and its data root with it.
//!
//! The data root is a tmpfs of a fixed size rather than a volume on this machine's disk, so
//! that the installer's disk check sees the same free space on every machine: a CI machine whose
//! disk had 4.7 GB left failed every install scenario with exit 10 (`disk`). The inner dockerd
//! uses overlay2 on it; a host's images and containers take tens of MB of memory.
//!
//! The `docker run` flags replace `--privileged`, which fails on machines whose processes lack
//! `CAP_SYS_RESOURCE` (`../shared/testhost-notes.md`, docs/testhost.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How to start a host.
#[derive(Debug, Clone)]
pub struct HostOpts {
    /// The image (`Images::base` or `Images::docker`).
    pub image: String,
    /// Start systemd as PID 1 (else the `gpum-testhost-nosystemd` entry point).
    pub systemd: bool,
    /// Mount `/tmp` with `noexec`.
    pub tmp_noexec: bool,
    /// Where `/opt/gpum-e2e` comes from.
    pub stage: PathBuf,
    /// Give `/var/lib/docker` this size instead of [`DATA_ROOT_SIZE`]: "1g", a data root too
    /// small for Docker; [`RENTAL_DATA_ROOT_SIZE`], one whose free space the agent reports as
    /// room for a rental.
    pub data_root_size: Option<String>,
}

/// The size of every host's `/var/lib/docker` tmpfs: more than the scenarios' disk minimum
/// (5 GB, `min_free_gb` in the installer's test knobs). Only what is written takes memory.
pub const DATA_ROOT_SIZE: &str = "8g";

/// The data root of a host that runs rentals: the agent reports free space in steps of 10 GiB
/// (`gpum_enroll::inventory::DISK_GRANULARITY_GIB`), so 8 GB is "0 GiB free" and the platform
/// refuses any rental's `disk_gib`; 20 GB is "10 GiB". Still only what is written takes memory.
pub const RENTAL_DATA_ROOT_SIZE: &str = "20g";

pub struct Host {
    name: String,
    systemd: bool,
}

/// The result of a command inside the host.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
    /// A pseudo-result that only carries a text, for checks on things other than a command.
    pub fn text(s: &str) -> Run {
        Run { code: 0, stdout: s.to_string(), stderr: String::new() }
    }

    /// stdout and stderr together.
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Boot timeout: systemd reaches `running` in a few seconds; a loaded CI machine gets more.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

impl Host {
    /// Starts a fresh host named `gpum-e2e-<label>-<pid>` and waits until it is up (systemd
    /// `running`, or for the no-systemd entry point, the platform answering).
    pub fn start(label: &str, opts: &HostOpts) -> Result<Host> {
        let name = format!("gpum-e2e-{label}-{}", std::process::id());
        // A leftover of an interrupted run with the same pid is removed first.
        let _ = docker(&["rm", "-f", "-v", &name]);
        let host = Host { name: name.clone(), systemd: opts.systemd };
        let data_root = format!(
            "/var/lib/docker:rw,exec,size={}",
            opts.data_root_size.as_deref().unwrap_or(DATA_ROOT_SIZE)
        );
        let tmp = if opts.tmp_noexec { "/tmp:rw,noexec,nosuid,nodev" } else { "/tmp:rw,exec,nosuid,nodev" };
        let stage = opts.stage.canonicalize().with_context(|| format!("{}", opts.stage.display()))?;
        let entry = if opts.systemd {
            "/usr/local/sbin/gpum-testhost-init"
        } else {
            "/usr/local/sbin/gpum-testhost-nosystemd"
        };
        let args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            name.clone(),
            "--hostname".into(),
            format!("gpum-e2e-{label}"),
            "--network".into(),
            "none".into(),
            "--cgroupns=private".into(),
            "--cap-add".into(),
            "ALL".into(),
            "--cap-drop".into(),
            "SYS_RESOURCE".into(),
            "--security-opt".into(),
            "seccomp=unconfined".into(),
            "--security-opt".into(),
            "apparmor=unconfined".into(),
            "--security-opt".into(),
            "systempaths=unconfined".into(),
            "--device-cgroup-rule".into(),
            "a *:* rwm".into(),
            "--tmpfs".into(),
            "/run".into(),
            "--tmpfs".into(),
            "/run/lock".into(),
            "--tmpfs".into(),
            tmp.into(),
            "--stop-signal".into(),
            "SIGRTMIN+3".into(),
            "-e".into(),
            "container=docker".into(),
            "--tmpfs".into(),
            data_root,
            "-v".into(),
            format!("{}:/opt/gpum-e2e:ro", stage.display()),
            "--entrypoint".into(),
            entry.into(),
            opts.image.clone(),
        ];
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_ok(&argv)?;
        host.wait_up()?;
        Ok(host)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn wait_up(&self) -> Result<()> {
        let start = Instant::now();
        if self.systemd {
            // Until systemd has its bus up, systemctl answers "offline" (or fails) at once.
            let state = loop {
                let left = BOOT_TIMEOUT.saturating_sub(start.elapsed()).as_secs().max(1);
                let r = self.sh(&format!("timeout {left} systemctl is-system-running --wait"))?;
                let state = r.stdout.trim().to_string();
                if !(state.is_empty() || state == "offline") || start.elapsed() > BOOT_TIMEOUT {
                    break state;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            if state != "running" {
                let failed = self.sh("systemctl --failed --no-legend --plain")?.stdout;
                bail!(
                    "{}: systemd is {state:?} after {:?}; failed units: {failed}",
                    self.name,
                    start.elapsed()
                );
            }
        }
        // The platform listens a moment after its unit started.
        self.wait_for(
            "the platform on 127.0.0.1:8443",
            Duration::from_secs(30),
            "curl -fsS -o /dev/null https://127.0.0.1:8443/install.sh",
        )
    }

    /// Polls `cmd` (as root) every 200 ms until it exits 0.
    pub fn wait_for(&self, what: &str, timeout: Duration, cmd: &str) -> Result<()> {
        let start = Instant::now();
        loop {
            let r = self.sh(cmd)?;
            if r.code == 0 {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!("{}: timed out after {timeout:?} waiting for {what}: {}", self.name, r.all().trim());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `bash -c cmd` as root.
    pub fn sh(&self, cmd: &str) -> Result<Run> {
        self.exec(None, &[], cmd, None)
    }

    /// `bash -c cmd` as `user` (None: root), with extra environment variables and stdin.
    pub fn exec(
        &self,
        user: Option<&str>,
        env: &[(&str, &str)],
        cmd: &str,
        stdin: Option<&[u8]>,
    ) -> Result<Run> {
        let mut c = Command::new("docker");
        c.arg("exec");
        if stdin.is_some() {
            c.arg("-i");
        }
        if let Some(u) = user {
            c.args(["-u", u, "-w", "/home/owner"]);
        }
        for (k, v) in env {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        c.arg(&self.name).args(["bash", "-c", cmd]);
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().context("docker exec")?;
        if let Some(data) = stdin {
            let mut si = child.stdin.take().expect("piped");
            si.write_all(data)?;
        }
        Ok(Run::from(child.wait_with_output()?))
    }

    /// `bash -c cmd` as root; an error unless it exits 0.
    pub fn sh_ok(&self, cmd: &str) -> Result<String> {
        let r = self.sh(cmd)?;
        if r.code != 0 {
            bail!("{}: `{cmd}` exited {}: {}", self.name, r.code, r.all().trim());
        }
        Ok(r.stdout)
    }

    /// Writes a file inside the host (as root), creating its directory.
    pub fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        let cmd = format!("mkdir -p \"$(dirname '{path}')\" && cat > '{path}' && chmod {mode:o} '{path}'");
        let r = self.exec(None, &[], &cmd, Some(data))?;
        if r.code != 0 {
            bail!("{}: writing {path}: {}", self.name, r.all().trim());
        }
        Ok(())
    }

    /// Copies a file from this machine into the host.
    pub fn copy_in(&self, from: &Path, to: &str) -> Result<()> {
        docker_ok(&["cp", &from.to_string_lossy(), &format!("{}:{to}", self.name)])
    }

    /// The platform's admin CLI inside the host, against its database.
    pub fn platform(&self, args: &str) -> Result<String> {
        self.sh_ok(&format!(
            "/opt/gpum-e2e/bin/gpum-platform --db /var/lib/gpum-test-platform/platform.db \
             --test-clock-file /etc/gpum-test/clock {args}"
        ))
    }

    /// A fresh join code.
    pub fn join_code(&self, ttl: &str) -> Result<String> {
        Ok(self.platform(&format!("join-code create --ttl {ttl}"))?.trim().to_string())
    }

    /// `nodes list --json`.
    pub fn nodes(&self) -> Result<serde_json::Value> {
        Ok(serde_json::from_str(&self.platform("--json nodes list")?)?)
    }

    /// The last lines of the journal (all units, or one), for failure reports.
    pub fn journal(&self, unit: Option<&str>, lines: u32) -> String {
        let u = unit.map(|u| format!("-u {u}")).unwrap_or_default();
        self.sh(&format!("journalctl --no-pager -n {lines} {u}")).map(|r| r.all()).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if std::env::var_os("GPUM_E2E_KEEP").is_some() {
            eprintln!("gpum-e2e: keeping {} (GPUM_E2E_KEEP)", self.name);
            return;
        }
        let _ = docker(&["rm", "-f", "-v", &self.name]);
    }
}

fn docker(args: &[&str]) -> Result<Output> {
    Command::new("docker").args(args).stdin(Stdio::null()).output().context("running docker")
}

fn docker_ok(args: &[&str]) -> Result<()> {
    let o = docker(args)?;
    if !o.status.success() {
        bail!("docker {} failed: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}
