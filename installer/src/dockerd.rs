//! What the plan needs to know about the running Docker Engine, read-only: whether dockerd
//! started before the NVIDIA hook was installed, and which running containers a restart would
//! stop.
//!
//! dockerd registers its GPU device driver (what `--gpus` and the agent's probe need) only at
//! start, and only when `nvidia-container-runtime-hook` is on its `PATH` then (moby's
//! `daemon/nvidia_linux.go`, an `init()`); a `systemctl reload` adds a new `runtimes` entry but
//! never that driver (measured in the test host, docs/testhost.md). So the question "reload or
//! restart?" is answered by comparing dockerd's start time with the hook's ctime (when dpkg put
//! it there). The facts come from `/var/run/docker.pid`, `/proc/<pid>/stat`, `/proc/stat` and
//! two `GET`s on the Docker socket; none of them changes anything, so the dry run shows the same
//! decision the install takes. The registration asks one more, [`engine_version`], for the
//! inventory it sends.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use gpum_host::{Host, env};
use gpum_preflight::Facts;

/// The hook whose presence at dockerd's start registers the GPU device driver.
pub const HOOK: &str = "nvidia-container-runtime-hook";
/// Where dockerd writes its pid by default.
pub const PID_FILES: &[&str] = &["/var/run/docker.pid", "/run/docker.pid"];
/// Linux's USER_HZ on every architecture gpum supports: `/proc/<pid>/stat` counts in it.
const CLK_TCK: u64 = 100;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerRuntimeFacts {
    /// When the running dockerd started; `None` when none runs (or it cannot be told).
    pub dockerd_started: Option<SystemTime>,
    /// When the hook was installed (its ctime); `None` when it is not on `PATH`.
    pub hook_installed: Option<SystemTime>,
    /// Running containers without a restart policy (names): a Docker restart stops them.
    pub at_risk: Vec<String>,
    /// `daemon.json` declares the `nvidia` runtime but the running engine does not list it:
    /// the file was written after dockerd last read it (an install killed between the two).
    pub engine_lacks_runtime: bool,
}

impl DockerRuntimeFacts {
    /// The hook is there, but the running dockerd started before it: `--gpus` is refused until
    /// dockerd restarts.
    pub fn driver_stale(&self) -> bool {
        match (self.dockerd_started, self.hook_installed) {
            (Some(started), Some(hook)) => hook > started,
            _ => false,
        }
    }
}

/// Reads the facts; see the module docs.
pub fn gather(host: &dyn Host, facts: &Facts) -> DockerRuntimeFacts {
    let mut out = DockerRuntimeFacts {
        hook_installed: hook_path(host).and_then(|p| host.changed(&p).ok()),
        ..Default::default()
    };
    if facts.docker.engine.is_err() {
        return out;
    }
    out.dockerd_started = dockerd_started(host);
    out.at_risk = at_risk(host, &facts.docker.socket);
    // Only when the file has the runtime: `/info` is the engine's slowest read-only call, and the
    // audit of a machine without the runtime needs no answer from it.
    if facts.docker.has_nvidia_runtime() {
        out.engine_lacks_runtime = engine_lists_runtime(host, &facts.docker.socket) == Some(false);
    }
    out
}

/// Whether the running engine lists the `nvidia` runtime (`GET /info`); `None` when it cannot
/// be asked. The plan (did dockerd read the file?) and the reload step (did it now?) both ask.
pub fn engine_lists_runtime(host: &dyn Host, socket: &Path) -> Option<bool> {
    let r = host.unix_http_get(socket, "/info").ok().filter(|r| r.status == 200)?;
    let v = serde_json::from_slice::<serde_json::Value>(&r.body).ok()?;
    v["Runtimes"].as_object().map(|m| m.contains_key(crate::daemon_json::RUNTIME))
}

/// The running engine's version (`GET /version`, its `Version`), as the agent reports it in
/// its inventory; `None` when the engine does not answer.
pub fn engine_version(host: &dyn Host, socket: &Path) -> Option<String> {
    let r = host.unix_http_get(socket, "/version").ok().filter(|r| r.status == 200)?;
    let v = serde_json::from_slice::<serde_json::Value>(&r.body).ok()?;
    v["Version"].as_str().map(str::to_owned)
}

fn hook_path(host: &dyn Host) -> Option<PathBuf> {
    let path = host
        .env(env::PATH)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    path.split(':').filter(|d| d.starts_with('/')).map(|d| Path::new(d).join(HOOK)).find(|p| host.exists(p))
}

fn dockerd_started(host: &dyn Host) -> Option<SystemTime> {
    let pid = PID_FILES.iter().find_map(|p| host.read_to_string(Path::new(p)).ok())?;
    let pid: u32 = pid.trim().parse().ok()?;
    let stat = host.read_to_string(&Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    let btime = host.read_to_string(Path::new("/proc/stat")).ok()?;
    start_time(&stat, &btime)
}

/// A process's start time from its `/proc/<pid>/stat` and the machine's `/proc/stat`.
pub fn start_time(stat: &str, proc_stat: &str) -> Option<SystemTime> {
    // The command name (field 2) is in parentheses and may hold spaces or parentheses itself:
    // the fields after the last ')' start with field 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = rest.split_whitespace().nth(19)?.parse().ok()?;
    let btime: u64 = proc_stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(btime) + Duration::from_millis(ticks * 1000 / CLK_TCK))
}

fn at_risk(host: &dyn Host, socket: &Path) -> Vec<String> {
    let Ok(r) = host.unix_http_get(socket, "/containers/json") else { return Vec::new() };
    let Ok(list) = serde_json::from_slice::<serde_json::Value>(&r.body) else { return Vec::new() };
    let mut names = Vec::new();
    for c in list.as_array().into_iter().flatten() {
        let Some(id) = c["Id"].as_str().filter(|i| i.chars().all(|ch| ch.is_ascii_hexdigit())) else {
            continue;
        };
        let Ok(r) = host.unix_http_get(socket, &format!("/containers/{id}/json")) else { continue };
        let Ok(d) = serde_json::from_slice::<serde_json::Value>(&r.body) else { continue };
        if stops_on_restart(&d) {
            let name = d["Name"].as_str().unwrap_or(id).trim_start_matches('/').to_string();
            names.push(name);
        }
    }
    names.sort();
    names
}

/// Whether a running container (its `GET /containers/{id}/json`) stops for good when dockerd
/// restarts: it has no restart policy (`no` or none). `always` and `unless-stopped` come back;
/// so does `on-failure`, since dockerd restarts it after a daemon restart too.
pub fn stops_on_restart(inspect: &serde_json::Value) -> bool {
    matches!(inspect["HostConfig"]["RestartPolicy"]["Name"].as_str().unwrap_or(""), "" | "no")
}

/// The installed toolkit has a known container escape (preflight's `ToolkitFacts::vulnerable`,
/// dpkg's version order against 1.17.8): the install upgrades it.
pub fn toolkit_too_old(f: &Facts) -> bool {
    f.toolkit.vulnerable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_reads_field_22_after_the_command_name() {
        // Shaped like a real line, with a command name that holds ") (" itself.
        let stat = "1234 (dockerd) (x)) S 1 1234 1234 0 -1 4194560 5000 0 0 0 30 20 0 0 20 0 12 0 4200 123456 789 18446744073709551615";
        let t = start_time(stat, "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n").unwrap();
        assert_eq!(t, SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_042));
        assert_eq!(start_time("garbage", "btime 1"), None);
    }

    #[test]
    fn stale_only_when_the_hook_came_after_dockerd() {
        let at = |s| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let f = |d, h| DockerRuntimeFacts { dockerd_started: d, hook_installed: h, ..Default::default() };
        assert!(f(at(100), at(200)).driver_stale());
        assert!(!f(at(300), at(200)).driver_stale());
        assert!(!f(None, at(200)).driver_stale());
        assert!(!f(at(100), None).driver_stale());
    }

    #[test]
    fn the_engine_version_is_versions_answer() {
        use gpum_host::fake::FakeHost;
        let sock = Path::new("/var/run/docker.sock");
        let body =
            r#"{"Platform":{"Name":"Docker Engine - Community"},"Version":"27.3.1","ApiVersion":"1.47"}"#;
        let ok = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{body}");
        assert_eq!(
            engine_version(&FakeHost::new().unix_http(sock, "/version", ok), sock).as_deref(),
            Some("27.3.1")
        );
        assert_eq!(engine_version(&FakeHost::new(), sock), None, "no engine");
        let down = "HTTP/1.1 500 Internal Server Error\r\n\r\n{\"Version\":\"27.3.1\"}";
        assert_eq!(engine_version(&FakeHost::new().unix_http(sock, "/version", down), sock), None);
    }

    #[test]
    fn restart_policies() {
        let p = |n: &str| serde_json::json!({"HostConfig": {"RestartPolicy": {"Name": n}}});
        assert!(stops_on_restart(&p("")) && stops_on_restart(&p("no")));
        assert!(!stops_on_restart(&p("always")) && !stops_on_restart(&p("unless-stopped")));
        assert!(!stops_on_restart(&p("on-failure")));
    }
}
