//! Docker: the Engine API's `GET /_ping` headers (version), its `GET /info` answer (the same
//! JSON as `docker info --format '{{json .}}'`), and `/etc/docker/daemon.json`.
//!
//! The audit asks `/_ping` rather than `/info`: the daemon answers it in ~0.1 ms where `/info`
//! costs ~5 ms of the daemon querying containerd and runc, a third of the dry run's budget. The
//! runtimes then come from `daemon.json`, which is where `nvidia-ctk runtime configure` puts
//! them. `parse_info` stays for the agent's `doctor`, which can afford it.

use serde_json::Value;

/// The engine's version, from the headers every Engine API answer carries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Engine {
    /// From `Server: Docker/20.10.24+dfsg1 (linux)`.
    pub version: String,
    /// From `Api-Version: 1.41`.
    pub api_version: String,
}

/// Reads the engine version from `GET /_ping` response headers.
pub fn parse_ping(headers: &[(String, String)]) -> Result<Engine, String> {
    let get = |n: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.trim());
    let server = get("Server").ok_or("no Server header: not a Docker Engine")?;
    let version = server
        .strip_prefix("Docker/")
        .and_then(|v| v.split_whitespace().next())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("unexpected Server header {server:?}"))?;
    Ok(Engine {
        version: version.to_string(),
        api_version: get("Api-Version").unwrap_or_default().to_string(),
    })
}

/// What `GET /info` says that gpum uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DockerInfo {
    pub server_version: String,
    /// Names of the configured runtimes (`runc`, `nvidia`, …), sorted.
    pub runtimes: Vec<String>,
    pub default_runtime: String,
    pub root_dir: String,
    pub operating_system: String,
}

impl DockerInfo {
    pub fn has_runtime(&self, name: &str) -> bool {
        self.runtimes.iter().any(|r| r == name)
    }
    /// The snap package keeps its data under `/var/snap/docker`.
    pub fn is_snap(&self) -> bool {
        self.root_dir.starts_with("/var/snap/docker")
    }
}

fn keys(v: Option<&Value>) -> Vec<String> {
    let mut k: Vec<String> =
        v.and_then(Value::as_object).map(|o| o.keys().cloned().collect()).unwrap_or_default();
    k.sort();
    k
}

fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or_default().to_string()
}

pub fn parse_info(json: &str) -> Result<DockerInfo, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    if !v.is_object() || v.get("ServerVersion").is_none() {
        return Err("not a Docker /info answer".into());
    }
    Ok(DockerInfo {
        server_version: str_of(&v, "ServerVersion"),
        runtimes: keys(v.get("Runtimes")),
        default_runtime: str_of(&v, "DefaultRuntime"),
        root_dir: str_of(&v, "DockerRootDir"),
        operating_system: str_of(&v, "OperatingSystem"),
    })
}

/// What gpum reads from `/etc/docker/daemon.json`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DaemonJson {
    /// `data-root` (or the pre-17.05 `graph`).
    pub data_root: Option<String>,
    pub runtimes: Vec<String>,
    pub default_runtime: Option<String>,
    /// `live-restore`: containers keep running while dockerd restarts.
    pub live_restore: Option<bool>,
    /// `storage-driver` (absent: the engine's default, overlay2 on the filesystems gpum meets).
    pub storage_driver: Option<String>,
}

pub fn parse_daemon_json(json: &str) -> Result<DaemonJson, String> {
    if json.trim().is_empty() {
        // dockerd accepts an empty file, and so do we.
        return Ok(DaemonJson::default());
    }
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    if !v.is_object() {
        return Err("not a JSON object".into());
    }
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(DaemonJson {
        data_root: s("data-root").or_else(|| s("graph")),
        runtimes: keys(v.get("runtimes")),
        default_runtime: s("default-runtime"),
        live_restore: v.get("live-restore").and_then(Value::as_bool),
        storage_driver: s("storage-driver"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::fixture;

    fn headers(name: &str) -> Vec<(String, String)> {
        gpum_host::UnixHttpResponse::parse(fixture(name).as_bytes()).unwrap().headers
    }

    #[test]
    fn ping_captured_and_reconstructed() {
        let e = parse_ping(&headers("debian12-docker-ping.http")).unwrap();
        assert_eq!(e, Engine { version: "20.10.24+dfsg1".into(), api_version: "1.41".into() });
        let e = parse_ping(&headers("ubuntu2204-docker-ping.http")).unwrap();
        assert_eq!(e.version, "27.4.1");
        assert!(parse_ping(&[]).is_err());
        assert!(parse_ping(&[("server".into(), "nginx/1.25".into())]).is_err());
    }

    #[test]
    fn info_captured_debian12_docker_io() {
        let i = parse_info(&fixture("debian12-docker-api-info.json")).unwrap();
        assert_eq!(i.server_version, "20.10.24+dfsg1");
        assert_eq!(i.runtimes, ["io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc"]);
        assert!(!i.has_runtime("nvidia"));
        assert_eq!(i.root_dir, "/var/lib/docker");
        assert!(!i.is_snap());
    }

    #[test]
    fn info_with_nvidia_runtime_reconstructed() {
        let i = parse_info(&fixture("ubuntu2204-docker-info-nvidia.json")).unwrap();
        assert_eq!(i.server_version, "27.4.1");
        assert!(i.has_runtime("nvidia"));
        assert_eq!(i.default_runtime, "runc");
    }

    #[test]
    fn info_snap_reconstructed() {
        let i = parse_info(&fixture("ubuntu2404-docker-info-snap.json")).unwrap();
        assert!(i.is_snap());
        assert!(parse_info("{}").is_err());
        assert!(parse_info("not json").is_err());
    }

    #[test]
    fn daemon_json() {
        let d = parse_daemon_json(&fixture("debian12-daemon.json")).unwrap();
        assert_eq!(d.data_root.as_deref(), Some("/var/lib/docker"));
        assert!(d.runtimes.is_empty());
        let d = parse_daemon_json(&fixture("ubuntu2204-daemon-nvidia.json")).unwrap();
        assert_eq!(d.runtimes, ["nvidia"]);
        assert_eq!(d.data_root, None);
        assert_eq!(parse_daemon_json("  \n").unwrap(), DaemonJson::default());
        assert_eq!(
            parse_daemon_json(r#"{"graph":"/srv/docker"}"#).unwrap().data_root.as_deref(),
            Some("/srv/docker")
        );
        let d = parse_daemon_json(r#"{"live-restore": true, "storage-driver": "overlay2"}"#).unwrap();
        assert_eq!((d.live_restore, d.storage_driver.as_deref()), (Some(true), Some("overlay2")));
        assert_eq!(parse_daemon_json("{}").unwrap().live_restore, None);
        assert!(parse_daemon_json("[1]").is_err());
        assert!(parse_daemon_json("{").is_err());
    }
}
