//! Machines for the unit tests of the audit and the install.

use gpum_common::Lang;
use gpum_host::fake::FakeHost;
use gpum_preflight::facts::*;
use gpum_preflight::gpu::GpuFacts;

/// Every language, for the tests that go through each. `Lang` has no `ALL` of its own: the
/// `match` below stops compiling when a language is added, so this list cannot fall behind.
pub const LANGS: [Lang; 2] = [Lang::Ru, Lang::En];
const _: () = match Lang::En {
    Lang::Ru | Lang::En => (),
};

/// `--lang`'s value for `lang`.
pub fn lang_arg(lang: Lang) -> &'static str {
    match lang {
        Lang::Ru => "ru",
        Lang::En => "en",
    }
}

pub fn t4() -> GpuFacts {
    GpuFacts::Ok { driver: "550.127.05".into(), gpus: vec!["Tesla T4".into()] }
}

pub fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/preflight").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The owner's own Docker settings.
pub const OWNER_DAEMON_JSON: &str =
    "{\n  \"log-opts\": {\"max-size\": \"10m\"},\n  \"registry-mirrors\": [\"https://mirror.example\"]\n}\n";

/// A fresh Debian 12 GPU machine: no Docker, no toolkit, systemd, root.
pub fn fresh_debian() -> FakeHost {
    FakeHost::new()
        .file(OS_RELEASE, fixture("debian12.os-release"))
        .file(MOUNTINFO, fixture("debian12-container.mountinfo"))
        .file(
            DPKG_STATUS,
            fixture("debian12-dpkg-status-excerpt").replace("Package: docker.io", "Package: not-docker"),
        )
        .dir(SYSTEMD_RUN_DIR)
        .dir("/var/lib")
        .dir("/tmp")
        .space_at("/var/lib", 500_000_000_000)
        .env_var("PATH", "/usr/bin")
}

/// Docker and a safe toolkit installed, daemon.json without the nvidia runtime.
pub fn configured_debian() -> FakeHost {
    FakeHost::new()
        .file(OS_RELEASE, fixture("debian12.os-release"))
        .file(MOUNTINFO, fixture("debian12-container.mountinfo"))
        .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", "1.17.8-1"))
        .file(DAEMON_JSON, OWNER_DAEMON_JSON)
        .file(TOOLKIT_CONFIG, fixture("nvidia-container-runtime-config.toml"))
        .file("/usr/bin/docker", "")
        .file("/usr/bin/nvidia-ctk", "")
        .dir(SYSTEMD_RUN_DIR)
        .dir("/var/lib")
        .dir("/tmp")
        .space_at("/var/lib", 500_000_000_000)
        .env_var("PATH", "/usr/bin")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"))
}

/// Docker running one container named `name` without a restart policy; no toolkit.
pub fn docker_without_toolkit_running(name: &str) -> FakeHost {
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    fresh_debian()
        .file(DPKG_STATUS, fixture("debian12-dpkg-status-excerpt"))
        .file("/usr/bin/docker", "")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"))
        .unix_http(DEFAULT_DOCKER_SOCKET, "/containers/json", format!("HTTP/1.0 200 OK\r\n\r\n[{{\"Id\":\"{id}\"}}]"))
        .unix_http(
            DEFAULT_DOCKER_SOCKET,
            &format!("/containers/{id}/json"),
            format!("HTTP/1.0 200 OK\r\n\r\n{{\"Name\":\"/{name}\",\"HostConfig\":{{\"RestartPolicy\":{{\"Name\":\"no\"}}}}}}"),
        )
}
