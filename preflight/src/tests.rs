//! Checks and gathering against `FakeHost`, with the captured and reconstructed samples.

use std::path::{Path, PathBuf};

use gpum_common::Lang;
use gpum_common::agent_state::{AgentState, Connection, StopReason, Stopped};
use gpum_host::Output;
use gpum_host::fake::FakeHost;

use crate::checks::{self, *};
use crate::facts::{self, *};
use crate::gpu::GpuFacts;
use crate::parse::fixture;
use crate::{Status, failed_ids, ready};

fn t4() -> GpuFacts {
    GpuFacts::Ok { driver: "550.127.05".into(), gpus: vec!["Tesla T4".into()] }
}

/// A ready Ubuntu 22.04 GPU machine with Docker and the toolkit configured.
/// Docker's data root on its own XFS with project quotas (a rental's disk can be limited).
const XFS_DATA_ROOT: &str = "900 25 253:1 / /var/lib/docker rw,relatime shared:90 - xfs /dev/mapper/vg-docker rw,attr2,inode64,prjquota\n";

/// daemon.json with the runtime and live-restore, as the install leaves it.
fn daemon_json_configured() -> String {
    fixture("ubuntu2204-daemon-nvidia.json").replacen('{', "{\n    \"live-restore\": true,", 1)
}

fn ubuntu_ready() -> FakeHost {
    FakeHost::new()
        .file(OS_RELEASE, fixture("ubuntu2204.os-release"))
        .file(MOUNTINFO, fixture("debian12-container.mountinfo") + XFS_DATA_ROOT)
        .file(DAEMON_JSON, daemon_json_configured())
        .file(
            TOOLKIT_CONFIG,
            "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n\
             accept-nvidia-visible-devices-as-volume-mounts = true\n",
        )
        .file(DPKG_STATUS, safe_toolkit_status())
        .file("/usr/bin/docker", "")
        .file("/usr/bin/nvidia-ctk", "")
        .file("/usr/sbin/nft", "")
        .dir(SYSTEMD_RUN_DIR)
        .dir("/var/lib/docker")
        .env_var("PATH", "/usr/sbin:/usr/bin")
        .space_at("/var/lib/docker", 200_000_000_000)
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("ubuntu2204-docker-ping.http"))
}

/// The reconstructed dpkg status with the toolkit at 1.17.8, the first release without
/// CVE-2025-23266 (the fixture itself has 1.17.3).
fn safe_toolkit_status() -> String {
    fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", "1.17.8-1")
}

fn offline() -> GatherOptions {
    GatherOptions { offline: true, ..Default::default() }
}

fn audit(h: &FakeHost, gpu: &GpuFacts) -> (Facts, Vec<crate::Finding>) {
    let f = gather(h, &offline(), gpu);
    let r = run_all(&f, Lang::En);
    (f, r)
}

fn st(r: &[crate::Finding], id: &str) -> Status {
    status_of(r, id).unwrap()
}

#[test]
fn a_ready_machine_passes_everything_but_the_skipped_platform() {
    let h = ubuntu_ready();
    let (f, r) = audit(&h, &t4());
    assert_eq!(r.iter().map(|x| x.id).collect::<Vec<_>>(), checks::ALL);
    for x in &r {
        let want = if x.id == PLATFORM { Status::Skip } else { Status::Pass };
        assert_eq!(x.status, want, "{x:?}");
    }
    assert!(ready(&r));
    assert_eq!(f.docker.package, Some(("docker-ce".into(), "5:27.4.1-1~ubuntu.22.04~jammy".into())));
    assert_eq!(f.toolkit.package_version.as_deref(), Some("1.17.8-1"));
    assert!(!f.toolkit.vulnerable);
    assert_eq!(f.docker.binary.as_deref(), Some(Path::new("/usr/bin/docker")));
}

#[test]
fn toolkit_gpu_access_warns_on_the_shipped_settings_and_fails_on_a_broken_file() {
    let h = ubuntu_ready().file(TOOLKIT_CONFIG, fixture("nvidia-container-runtime-config.toml"));
    let (_, r) = audit(&h, &t4());
    assert_eq!(st(&r, TOOLKIT_GPU_ACCESS), Status::Warn, "the installer changes it");
    assert!(ready(&r));
    let (_, r) = audit(&ubuntu_ready().file(TOOLKIT_CONFIG, "[broken\n"), &t4());
    assert_eq!(st(&r, TOOLKIT_GPU_ACCESS), Status::Fail);
    assert_eq!(failed_ids(&r), [TOOLKIT_GPU_ACCESS]);
}

#[test]
fn live_restore_from_the_file_the_flag_and_swarm() {
    let off = ubuntu_ready().file(DAEMON_JSON, fixture("ubuntu2204-daemon-nvidia.json"));
    let (f, r) = audit(&off, &t4());
    assert_eq!(st(&r, LIVE_RESTORE), Status::Warn, "the installer adds it");
    assert!(f.docker.may_set_live_restore());
    let flag = |h: FakeHost, arg: &str| {
        h.file(DOCKERD_PID, "77\n").file("/proc/77/cmdline", format!("/usr/bin/dockerd\0{arg}\0-H\0fd://\0"))
    };
    let (f, r) = audit(&flag(off.clone(), "--live-restore"), &t4());
    assert_eq!((f.docker.live_restore_flag, st(&r, LIVE_RESTORE)), (Some(true), Status::Pass));
    assert!(!f.docker.may_set_live_restore(), "the key would conflict with the flag");
    let (_, r) = audit(&flag(ubuntu_ready(), "--live-restore=false"), &t4());
    assert_eq!(failed_ids(&r), [LIVE_RESTORE], "the flag wins over the file and cannot be merged away");
    let swarm = ubuntu_ready().file("/var/lib/docker/swarm/docker-state.json", "{}");
    let (f, r) = audit(&swarm, &t4());
    assert!(f.docker.swarm);
    assert_eq!(failed_ids(&r), [LIVE_RESTORE]);
    assert!(r.iter().any(|x| x.id == LIVE_RESTORE && x.message.contains("swarm")));
}

#[test]
fn live_restore_flag_parsing() {
    assert_eq!(facts::live_restore_flag(b"dockerd\0-H\0fd://"), None);
    assert_eq!(facts::live_restore_flag(b"dockerd\0--live-restore"), Some(true));
    assert_eq!(facts::live_restore_flag(b"dockerd\0--live-restore=false\0"), Some(false));
    assert_eq!(facts::live_restore_flag(b"dockerd\0--live-restore=false\0--live-restore"), Some(true));
    assert_eq!(facts::live_restore_flag(b"dockerd\0--live-restore-x"), None);
}

#[test]
fn disk_limit_needs_xfs_project_quotas_and_overlay2_and_never_blocks() {
    let (f, r) = audit(&ubuntu_ready(), &t4());
    assert_eq!(st(&r, DISK_LIMIT), Status::Pass);
    assert_eq!(f.disk.mount.unwrap().mount_point, Path::new("/var/lib/docker"));
    let ext4 = ubuntu_ready().file(MOUNTINFO, fixture("debian12-container.mountinfo"));
    let (_, r) = audit(&ext4, &t4());
    assert_eq!(st(&r, DISK_LIMIT), Status::Warn);
    assert!(ready(&r), "a machine without the limit is still rentable");
    let other =
        ubuntu_ready().file(DAEMON_JSON, "{\"storage-driver\": \"fuse-overlayfs\", \"live-restore\": true}");
    let (_, r) = audit(&other, &t4());
    assert_eq!(st(&r, DISK_LIMIT), Status::Warn);
    assert!(r.iter().any(|x| x.id == DISK_LIMIT && x.message.contains("fuse-overlayfs")));
}

#[test]
fn a_dry_run_gather_writes_nothing_and_runs_only_read_only_commands() {
    // An existing install with systemd makes gather run its one command.
    let state =
        AgentState { node_id: Some("n1".into()), connection: Connection::Connected, ..Default::default() };
    let h = ubuntu_ready()
        .file(gpum_common::agent_state::UNIT_PATH, "[Unit]\n")
        .file("/var/lib/gpum-agent/state.json", serde_json::to_vec(&state).unwrap())
        .command_ok(
            "systemctl show gpum-agent -p LoadState,ActiveState,SubState,Result,ExecMainStatus",
            &fixture("ubuntu2204-systemctl-show-active.txt"),
        );
    let (f, _) = audit(&h, &t4());
    assert!(h.writes().is_empty(), "{:?}", h.writes());
    let ran = h.ran();
    assert_eq!(ran.len(), 1);
    for c in ran {
        assert!(READ_ONLY_COMMANDS.iter().any(|p| c.display().starts_with(p)), "{}", c.display());
    }
    assert_eq!(f.existing.unit_state.unwrap().active_state, "active");
}

#[test]
fn this_machine_shape_no_gpu_no_systemd_debian_docker_io_non_root() {
    // The shape of the development container: Debian 12, docker.io, no systemd, no NVIDIA.
    let h = FakeHost::new()
        .with_euid(65534)
        .file(OS_RELEASE, fixture("debian12.os-release"))
        .file(MOUNTINFO, fixture("debian12-container.mountinfo"))
        .file(DAEMON_JSON, fixture("debian12-daemon.json"))
        .file(DPKG_STATUS, fixture("debian12-dpkg-status-excerpt"))
        .file("/usr/local/bin/docker", "")
        .dir("/var/lib/docker")
        .space_at("/var/lib/docker", 80_000_000_000)
        .env_var("PATH", "/usr/local/bin:/usr/bin");
    let gpu = GpuFacts::LibraryMissing { lib: "libnvidia-ml.so.1".into(), detail: "cannot open".into() };
    let (f, r) = audit(&h, &gpu);
    assert_eq!(st(&r, ROOT), Status::Fail);
    assert_eq!(st(&r, SYSTEMD), Status::Fail);
    assert_eq!(st(&r, OS), Status::Warn);
    assert_eq!(st(&r, NVIDIA_DRIVER), Status::Fail);
    // The socket refuses (FakeHost has no answer); docker is present by binary and package.
    assert_eq!(st(&r, DOCKER), Status::Warn);
    assert_eq!(f.docker.package.as_ref().unwrap().0, "docker.io");
    assert_eq!(st(&r, NVIDIA_TOOLKIT), Status::Pass);
    assert_eq!(failed_ids(&r), ["root", "systemd", "nvidia_driver"]);
    assert!(!ready(&r));
}

#[test]
fn os_matrix() {
    assert_eq!(os_support("ubuntu", "22.04"), OsSupport::Verified);
    assert_eq!(os_support("ubuntu", "24.04"), OsSupport::NotVerifiedWithGpu);
    assert_eq!(os_support("debian", "12"), OsSupport::NotVerifiedWithGpu);
    assert_eq!(os_support("ubuntu", "20.04"), OsSupport::Unsupported);
    assert_eq!(os_support("debian", "11"), OsSupport::Unsupported);
    assert_eq!(os_support("fedora", "40"), OsSupport::Unsupported);
    let h = ubuntu_ready().file(OS_RELEASE, fixture("ubuntu2404.os-release"));
    let (_, r) = audit(&h, &t4());
    let os = r.iter().find(|x| x.id == OS).unwrap();
    assert_eq!(os.status, Status::Warn);
    assert!(os.message.contains("not verified with a GPU"), "{}", os.message);
    let ru = checks::os(&gather(&h, &offline(), &t4()), Lang::Ru);
    assert!(ru.message.contains("с видеокартой ещё не проверена"), "{}", ru.message);
    let h = ubuntu_ready().file(OS_RELEASE, "ID=fedora\nVERSION_ID=40\nPRETTY_NAME=\"Fedora Linux 40\"\n");
    assert_eq!(st(&audit(&h, &t4()).1, OS), Status::Fail);
}

#[test]
fn missing_os_release_fails_os() {
    let mut f = gather(&ubuntu_ready(), &offline(), &t4());
    f.os = Err("/etc/os-release: not found".into());
    assert_eq!(checks::os(&f, Lang::En).status, Status::Fail);
}

#[test]
fn arch_must_be_x86_64() {
    let h = ubuntu_ready().with_arch("aarch64");
    let r = audit(&h, &t4()).1;
    assert_eq!(st(&r, ARCH), Status::Fail);
    assert_eq!(failed_ids(&r), ["arch"]);
}

#[test]
fn noexec_tmp_fails_with_the_seed_fix() {
    let h = ubuntu_ready().file(MOUNTINFO, fixture("ubuntu2204-noexec-tmp.mountinfo"));
    let (_, r) = audit(&h, &t4());
    let t = r.iter().find(|x| x.id == TMP_EXEC).unwrap();
    assert_eq!(t.status, Status::Fail);
    assert!(t.fix.as_ref().unwrap().contains("sudo env TMPDIR=/var/tmp bash"));
    // A TMPDIR elsewhere (on an exec filesystem) passes even though /tmp is noexec.
    let h = ubuntu_ready()
        .file(MOUNTINFO, fixture("ubuntu2204-noexec-tmp.mountinfo"))
        .env_var("TMPDIR", "/var/tmp");
    let (f, r) = audit(&h, &t4());
    assert!(f.tmp.from_env);
    assert_eq!(st(&r, TMP_EXEC), Status::Pass);
    // And a TMPDIR on the noexec tmpfs fails, with the TMPDIR wording.
    let h = ubuntu_ready()
        .file(MOUNTINFO, fixture("debian12-noexec-tmpfs.mountinfo"))
        .env_var("TMPDIR", "/tmp/pfx");
    let t = checks::tmp_exec(&gather(&h, &offline(), &t4()), Lang::Ru);
    assert_eq!(t.status, Status::Fail);
    assert!(t.message.contains("$TMPDIR") && t.message.contains("noexec"), "{}", t.message);
    // No mountinfo: a warning, not a silent pass.
    let mut f = gather(&ubuntu_ready(), &offline(), &t4());
    f.tmp.mount = None;
    f.tmp.error = Some("gone".into());
    assert_eq!(checks::tmp_exec(&f, Lang::En).status, Status::Warn);
}

#[test]
fn disk_uses_daemon_json_data_root_or_the_nearest_existing_parent() {
    let h = ubuntu_ready()
        .file(DAEMON_JSON, r#"{"data-root": "/srv/docker/data"}"#)
        .dir("/srv")
        .space_at("/srv", 49_999_999_999);
    let (f, r) = audit(&h, &t4());
    assert_eq!(f.disk.data_root, PathBuf::from("/srv/docker/data"));
    assert!(f.disk.from_daemon_json);
    assert_eq!(f.disk.probed, PathBuf::from("/srv"));
    let d = r.iter().find(|x| x.id == DISK).unwrap();
    assert_eq!(d.status, Status::Fail);
    assert!(d.message.contains("50.0 GB"), "{}", d.message);
    let h = ubuntu_ready()
        .file(DAEMON_JSON, r#"{"data-root": "/srv/docker"}"#)
        .dir("/srv")
        .space_at("/srv", MIN_FREE_BYTES);
    assert_eq!(st(&audit(&h, &t4()).1, DISK), Status::Pass);
    // No daemon.json and no /var/lib/docker yet: measure /var/lib (then /var, then /).
    let h = FakeHost::new().dir("/var/lib").space_at("/var/lib", 60_000_000_000);
    let f = gather(&h, &offline(), &t4());
    assert_eq!(f.disk.data_root, PathBuf::from(DEFAULT_DATA_ROOT));
    assert_eq!(f.disk.probed, PathBuf::from("/var/lib"));
    assert_eq!(checks::disk(&f, &Context::default(), Lang::En).status, Status::Pass);
    // Cannot measure: a warning.
    let h = FakeHost::new();
    assert_eq!(
        checks::disk(&gather(&h, &offline(), &t4()), &Context::default(), Lang::En).status,
        Status::Warn
    );
}

/// The installer's test knobs lower the minimum through the context; the finding says the
/// minimum it was measured against.
#[test]
fn disk_is_measured_against_the_contexts_minimum() {
    let h = ubuntu_ready().space_at("/var/lib/docker", 6_000_000_000);
    let f = gather(&h, &offline(), &t4());
    let d = checks::disk(&f, &Context::default(), Lang::En);
    assert_eq!(d.status, Status::Fail);
    assert!(d.message.contains("at least 50.0 GB"), "{}", d.message);
    let low = Context { min_free_bytes: 5_000_000_000, ..Context::default() };
    assert_eq!(checks::disk(&f, &low, Lang::En).status, Status::Pass);
    let high = Context { min_free_bytes: 7_000_000_000, ..Context::default() };
    let d = checks::disk(&f, &high, Lang::En);
    assert!(d.message.contains("at least 7.0 GB"), "{}", d.message);
    let (run, one) = (run(&f, &low, Lang::En), checks::disk(&f, &low, Lang::En));
    assert_eq!(run.iter().find(|x| x.id == DISK), Some(&one), "run passes its context to the check");
}

#[test]
fn nvidia_driver_states_are_told_apart() {
    let f0 = gather(&ubuntu_ready(), &offline(), &t4());
    let cases = [
        (GpuFacts::LibraryMissing { lib: "libnvidia-ml.so.1".into(), detail: "x".into() }, "not found"),
        (GpuFacts::LibraryBroken { lib: "l".into(), detail: "x".into() }, "broken"),
        (GpuFacts::DriverNotLoaded, "kernel module"),
        (GpuFacts::VersionMismatch, "mismatch"),
        (GpuFacts::NoDevices { driver: "550".into() }, "sees no GPU"),
        (GpuFacts::NoPermission, "permission"),
        (GpuFacts::Other("boom".into()), "boom"),
    ];
    let mut msgs = Vec::new();
    for (g, want) in cases {
        let mut f = f0.clone();
        f.gpu = g;
        let x = checks::nvidia_driver(&f, Lang::En);
        assert_eq!(x.status, Status::Fail);
        assert!(x.message.contains(want), "{}", x.message);
        assert!(x.fix.is_some());
        msgs.push(x.message);
    }
    msgs.dedup();
    assert_eq!(msgs.len(), 7);
    let x = checks::nvidia_driver(&f0, Lang::Ru);
    assert!(x.message.contains("Tesla T4") && x.message.contains("550.127.05"));
}

#[test]
fn docker_absent_snap_silent_and_bad_daemon_json() {
    // Absent: it will be installed, which is fine.
    let h = FakeHost::new().file(OS_RELEASE, fixture("ubuntu2204.os-release"));
    let f = gather(&h, &offline(), &t4());
    assert!(!f.docker.present());
    assert_eq!(checks::docker(&f, Lang::En).status, Status::Pass);
    assert_eq!(checks::nvidia_toolkit(&f, &Context::default(), Lang::En).status, Status::Pass);
    // Snap, seen by its binary or by its data root.
    let h = ubuntu_ready().file("/snap/bin/docker", "");
    assert_eq!(st(&audit(&h, &t4()).1, DOCKER), Status::Fail);
    let h = ubuntu_ready().file("/snap/bin/docker", "").env_var("PATH", "/snap/bin:/usr/bin");
    let (f, r) = audit(&h, &t4());
    assert_eq!(f.docker.binary.as_deref(), Some(Path::new("/snap/bin/docker")));
    assert!(f.docker.snap);
    assert!(r.iter().find(|x| x.id == DOCKER).unwrap().fix.as_ref().unwrap().contains("snap remove docker"));
    // Installed but the engine does not answer.
    let h = ubuntu_ready().unix_http(
        DEFAULT_DOCKER_SOCKET,
        "/_ping",
        "HTTP/1.0 500 Internal Server Error\r\n\r\noops",
    );
    let d = checks::docker(&gather(&h, &offline(), &t4()), Lang::En);
    assert_eq!(d.status, Status::Warn);
    assert!(d.message.contains("HTTP 500"));
    // A broken daemon.json fails: the installer must merge the runtime into it.
    let h = ubuntu_ready().file(DAEMON_JSON, "{ \"runtimes\": ");
    assert_eq!(st(&audit(&h, &t4()).1, DOCKER), Status::Fail);
    // DOCKER_HOST pointing at another Unix socket is honoured.
    let h = ubuntu_ready().env_var("DOCKER_HOST", "unix:///run/alt.sock").unix_http(
        "/run/alt.sock",
        "/_ping",
        fixture("debian12-docker-ping.http"),
    );
    let f = gather(&h, &offline(), &t4());
    assert_eq!(f.docker.engine.as_ref().unwrap().version, "20.10.24+dfsg1");
    let d = checks::docker(&f, Lang::En);
    assert_eq!(d.message, "Docker 20.10.24+dfsg1 (docker-ce 5:27.4.1-1~ubuntu.22.04~jammy)");
    // DOCKER_HOST over TCP cannot be asked without the network: reported, not guessed.
    let h = ubuntu_ready().env_var("DOCKER_HOST", "tcp://10.0.0.1:2375");
    let f = gather(&h, &offline(), &t4());
    assert!(f.docker.engine.as_ref().unwrap_err().contains("not a Unix socket"));
}

#[test]
fn toolkit_without_the_nvidia_runtime_warns_about_the_restart() {
    let h = ubuntu_ready().file(DAEMON_JSON, "{}");
    let x = checks::nvidia_toolkit(&gather(&h, &offline(), &t4()), &Context::default(), Lang::En);
    assert_eq!(x.status, Status::Warn);
    assert!(x.fix.unwrap().contains("restart policy"));
    // No daemon.json at all: the same.
    let h = FakeHost::new().file(DPKG_STATUS, safe_toolkit_status());
    assert_eq!(
        checks::nvidia_toolkit(&gather(&h, &offline(), &t4()), &Context::default(), Lang::En).status,
        Status::Warn
    );
    // The runtime as nvidia-ctk writes it: pass.
    assert_eq!(
        checks::nvidia_toolkit(&gather(&ubuntu_ready(), &offline(), &t4()), &Context::default(), Lang::En)
            .status,
        Status::Pass
    );
}

/// Issue 14, item 1: a toolkit with a known container escape fails the audit, whatever else is
/// configured, and the fact the installer plans its upgrade from says so.
#[test]
fn a_toolkit_older_than_1_17_8_fails_with_the_cve_and_the_fix() {
    let h = ubuntu_ready().file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt"));
    let (f, r) = audit(&h, &t4());
    assert_eq!(f.toolkit.package_version.as_deref(), Some("1.17.3-1"));
    assert!(f.toolkit.vulnerable);
    assert_eq!(st(&r, NVIDIA_TOOLKIT), Status::Fail);
    assert!(!ready(&r));
    let x = checks::nvidia_toolkit(&f, &Context::default(), Lang::En);
    assert!(x.message.contains("1.17.3-1") && x.message.contains("CVE-2025-23266"), "{}", x.message);
    assert!(x.fix.as_deref().unwrap().contains("1.17.8"), "{:?}", x.fix);
    let ru = checks::nvidia_toolkit(&f, &Context::default(), Lang::Ru);
    assert!(ru.message.contains("уязвим") && ru.fix.as_deref().unwrap().contains("обновите"), "{ru:?}");
    // The boundary, in dpkg's order: 1.17.7 fails, 1.17.8 and a later 1.17.10 pass.
    for (v, vulnerable) in
        [("1.17.7-1", true), ("1.17.8~rc.1-1", true), ("1.17.8-1", false), ("1.17.10-1", false)]
    {
        let h = ubuntu_ready()
            .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", v));
        let f = gather(&h, &offline(), &t4());
        assert_eq!(f.toolkit.vulnerable, vulnerable, "{v}");
        assert_eq!(
            checks::nvidia_toolkit(&f, &Context::default(), Lang::En).status == Status::Fail,
            vulnerable,
            "{v}"
        );
    }
    // When the install upgrades it: the same message, a warning, and the installer's fix.
    let up = Context { toolkit_will_be_upgraded: true, ..Context::default() };
    let (fail, warn) = (
        checks::nvidia_toolkit(&f, &Context::default(), Lang::En),
        checks::nvidia_toolkit(&f, &up, Lang::En),
    );
    assert_eq!((fail.status, warn.status), (Status::Fail, Status::Warn));
    assert_eq!(warn.message, fail.message);
    assert_eq!(warn.fix.as_deref(), Some("the installer upgrades it from NVIDIA's repository"));
    let ru = checks::nvidia_toolkit(&f, &up, Lang::Ru);
    assert_eq!(ru.status, Status::Warn);
    assert_eq!(ru.fix.as_deref(), Some("установщик обновит его из репозитория NVIDIA"));
    assert!(ready(&run(&f, &up, Lang::En)));
    // A safe toolkit is not touched by the context.
    let safe = gather(&ubuntu_ready(), &offline(), &t4());
    assert_eq!(
        checks::nvidia_toolkit(&safe, &up, Lang::En),
        checks::nvidia_toolkit(&safe, &Context::default(), Lang::En)
    );
    // No package, only nvidia-ctk: the version cannot be checked, a warning says so.
    let h = ubuntu_ready().file(DPKG_STATUS, "");
    let x = checks::nvidia_toolkit(&gather(&h, &offline(), &t4()), &Context::default(), Lang::En);
    assert_eq!(x.status, Status::Warn);
    assert!(x.message.contains("cannot be checked"), "{}", x.message);
}

/// Issue 33: the agent refuses rentals without nftables; the audit says so as a warning (the
/// machine still serves), with the package to install.
#[test]
fn nftables_missing_is_a_warning_that_rentals_need_it() {
    let (f, r) = audit(&ubuntu_ready(), &t4());
    assert_eq!(f.nft.as_deref(), Some(Path::new("/usr/sbin/nft")));
    assert_eq!(st(&r, NFTABLES), Status::Pass);
    let h = FakeHost::new().env_var("PATH", "/usr/sbin:/usr/bin");
    let f = gather(&h, &offline(), &t4());
    assert_eq!(f.nft, None);
    for (lang, says, fix) in [
        (Lang::En, "rentals need nftables", "apt install nftables"),
        (Lang::Ru, "аренды требуют nftables", "apt install nftables"),
    ] {
        let x = checks::nftables(&f, lang);
        assert_eq!(x.status, Status::Warn);
        assert!(x.message.contains(says), "{x:?}");
        assert!(x.fix.as_deref().unwrap_or("").contains(fix), "{x:?}");
    }
}

#[test]
fn dpkg_lock_held_is_a_warning() {
    let h = ubuntu_ready().lock_held("/var/lib/dpkg/lock-frontend", 4242);
    let (f, r) = audit(&h, &t4());
    assert_eq!(f.dpkg_lock, LockFacts::Held { path: "/var/lib/dpkg/lock-frontend".into(), pid: 4242 });
    let x = r.iter().find(|x| x.id == DPKG_LOCK).unwrap();
    assert_eq!(x.status, Status::Warn);
    assert!(x.message.contains("4242"));
    assert!(ready(&r), "a held lock is a warning, not a failure");
    let mut f = f.clone();
    f.dpkg_lock = LockFacts::Unknown("permission denied".into());
    assert_eq!(checks::dpkg_lock(&f, Lang::En).status, Status::Warn);
    f.euid = 1000;
    assert_eq!(checks::dpkg_lock(&f, Lang::En).status, Status::Skip);
}

#[test]
fn the_package_lists_lock_counts_as_a_held_lock() {
    let h = ubuntu_ready().lock_held("/var/lib/apt/lists/lock", 777);
    let (f, r) = audit(&h, &t4());
    assert_eq!(f.dpkg_lock, LockFacts::Held { path: "/var/lib/apt/lists/lock".into(), pid: 777 });
    let x = r.iter().find(|x| x.id == DPKG_LOCK).unwrap();
    assert_eq!(x.status, Status::Warn);
    assert!(x.message.contains("/var/lib/apt/lists/lock") && x.message.contains("777"), "{}", x.message);
}

#[test]
fn an_interrupted_dpkg_is_reported_and_left_to_the_install() {
    let (f, r) = audit(&ubuntu_ready(), &t4());
    assert!(f.dpkg_interrupted.is_empty());
    assert_eq!(r.iter().find(|x| x.id == DPKG_LOCK).unwrap().status, Status::Pass);
    // What a killed dpkg leaves: a journal entry named by digits (other names are not dpkg's).
    let h = ubuntu_ready().file("/var/lib/dpkg/updates/0001", "").file("/var/lib/dpkg/updates/tmp.i", "");
    let (f, r) = audit(&h, &t4());
    assert_eq!(f.dpkg_interrupted, vec![std::path::PathBuf::from("/var/lib/dpkg/updates/0001")]);
    let x = r.iter().find(|x| x.id == DPKG_LOCK).unwrap();
    assert_eq!(x.status, Status::Warn);
    assert!(x.message.contains("interrupted"), "{}", x.message);
    assert!(x.fix.as_deref().is_some_and(|h| h.contains("dpkg --configure -a")), "{:?}", x.fix);
    assert!(ready(&r), "the install finishes it: a warning, not a failure");
}

fn with_state(state: &AgentState) -> FakeHost {
    ubuntu_ready()
        .file("/etc/gpum-agent/config.toml", "token = \"secret\"\n")
        .file("/var/lib/gpum-agent/state.json", serde_json::to_vec(state).unwrap())
}

#[test]
fn existing_install_reports_its_state_and_whether_its_server_was_deleted() {
    let revoked = AgentState {
        node_id: Some("node-7".into()),
        server: Some("https://gpum.example".into()),
        connection: Connection::Stopped,
        stopped: Some(Stopped { reason: StopReason::Revoked, detail: "node_deleted".into(), at: 1 }),
        ..Default::default()
    };
    let x = checks::existing_install(
        &gather(&with_state(&revoked), &offline(), &t4()),
        &Context::default(),
        Lang::En,
    );
    assert_eq!(x.status, Status::Pass);
    assert!(x.message.contains("server deleted") && x.message.contains("node-7"), "{}", x.message);

    let live = AgentState {
        node_id: Some("node-8".into()),
        connection: Connection::Connected,
        ..Default::default()
    };
    let h = with_state(&live);
    let x = checks::existing_install(&gather(&h, &offline(), &t4()), &Context::default(), Lang::Ru);
    assert_eq!(x.status, Status::Warn);
    assert!(x.fix.unwrap().contains("Эта видеокарта уже зарегистрирована на другом сервере"));
    // The config holds the token: gather looks at its existence only, never its contents.
    assert!(h.reads().iter().any(|p| p.ends_with("state.json")), "{:?}", h.reads());
    assert!(
        !h.reads().iter().any(|p| p == Path::new(gpum_common::agent_state::DEFAULT_CONFIG)),
        "{:?}",
        h.reads()
    );
    assert!(h.ran().is_empty());

    let cfg_err = AgentState {
        stopped: Some(Stopped { reason: StopReason::ConfigError, detail: "x".into(), at: 1 }),
        connection: Connection::Stopped,
        ..Default::default()
    };
    let x = checks::existing_install(
        &gather(&with_state(&cfg_err), &offline(), &t4()),
        &Context::default(),
        Lang::En,
    );
    assert_eq!(x.status, Status::Warn);
    assert!(x.message.contains("configuration error"));

    let h = ubuntu_ready().file("/var/lib/gpum-agent/state.json", "{not json");
    assert_eq!(
        checks::existing_install(&gather(&h, &offline(), &t4()), &Context::default(), Lang::En).status,
        Status::Warn
    );
    let h = ubuntu_ready().file("/opt/gpum-agent/gpum-agent", "");
    assert_eq!(
        checks::existing_install(&gather(&h, &offline(), &t4()), &Context::default(), Lang::En).status,
        Status::Warn
    );
}

/// Issue 31: the finding says what the install that follows does with the installed agent's
/// server, which only the installer knows (the code it was given against the one recorded).
#[test]
fn existing_install_tells_a_repair_from_a_new_registration() {
    let live = AgentState {
        node_id: Some("node-8".into()),
        server: Some("https://gpum.example".into()),
        connection: Connection::Connected,
        ..Default::default()
    };
    let f = gather(&with_state(&live), &offline(), &t4());
    let with = |registration| Context { registration, ..Context::default() };
    for lang in [Lang::En, Lang::Ru] {
        let same = checks::existing_install(&f, &with(Registration::SameCode), lang);
        let keep = checks::existing_install(&f, &with(Registration::Keep), lang);
        let new = checks::existing_install(&f, &with(Registration::NewCode), lang);
        let unknown = checks::existing_install(&f, &with(Registration::Unknown), lang);
        // A repair keeps the server: nothing for the owner to do, and no word of deleting it.
        for x in [&same, &keep] {
            assert_eq!(x.status, Status::Pass, "{}", x.message);
            assert!(x.message.contains("node-8"), "{}", x.message);
            assert!(x.fix.is_none());
            assert!(!x.message.contains("удалите") && !x.message.contains("delete"), "{}", x.message);
        }
        assert_ne!(same.message, keep.message);
        // A new code while the server exists: the seed's message.
        assert_eq!(new.status, Status::Warn);
        let fix = new.fix.unwrap();
        assert!(
            fix.contains("Эта видеокарта уже зарегистрирована на другом сервере")
                || fix.contains("This GPU is already registered to another server"),
            "{fix}"
        );
        // Not known: both ways.
        assert_eq!(unknown.status, Status::Warn);
        assert_ne!(unknown.fix, Some(fix));
    }
}

#[test]
fn platform_is_skipped_offline_or_without_a_server_and_refuses_plain_http_elsewhere() {
    let h = ubuntu_ready();
    let f = gather(&h, &GatherOptions::default(), &t4());
    assert_eq!(f.platform, PlatformFacts::NoServer);
    assert_eq!(checks::platform(&f, Lang::En).status, Status::Skip);
    let opts =
        GatherOptions { server: Some("https://gpum.example".into()), offline: true, ..Default::default() };
    assert_eq!(gather(&h, &opts, &t4()).platform, PlatformFacts::Offline);
    // Plain http to a non-loopback host is refused before any connection is tried.
    let opts = GatherOptions { server: Some("http://10.1.2.3/".into()), ..Default::default() };
    let f = gather(&h, &opts, &t4());
    assert!(matches!(f.platform, PlatformFacts::BadUrl { .. }), "{:?}", f.platform);
    assert_eq!(checks::platform(&f, Lang::En).status, Status::Fail);
}

#[test]
fn platform_reachable_and_unreachable_on_loopback() {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", l.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf);
        s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap();
    });
    let opts = GatherOptions { server: Some(url.clone()), ..Default::default() };
    let f = facts::gather(&FakeHost::new(), &opts, &t4());
    t.join().unwrap();
    assert_eq!(f.platform, PlatformFacts::Reachable { url, status: 404 });
    assert_eq!(checks::platform(&f, Lang::En).status, Status::Pass);
    // A closed port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let opts = GatherOptions { server: Some(format!("http://127.0.0.1:{port}/")), ..Default::default() };
    let f = facts::gather(&FakeHost::new(), &opts, &t4());
    assert!(matches!(f.platform, PlatformFacts::Unreachable { .. }), "{:?}", f.platform);
}

#[test]
fn every_finding_exists_in_both_languages() {
    let h = FakeHost::new()
        .with_euid(1)
        .with_arch("armv7l")
        .file(MOUNTINFO, fixture("ubuntu2204-noexec-tmp.mountinfo"));
    let gpu = GpuFacts::DriverNotLoaded;
    let f = gather(&h, &offline(), &gpu);
    let (ru, en) = (run_all(&f, Lang::Ru), run_all(&f, Lang::En));
    for (r, e) in ru.iter().zip(&en) {
        assert_eq!((r.id, r.status), (e.id, e.status));
        assert_ne!(r.message, e.message, "{}", r.id);
        assert!(e.message.is_ascii() && e.fix.as_deref().unwrap_or("").is_ascii(), "{e:?}");
    }
}

#[test]
fn no_systemd_output_parser_matches_gather_choice() {
    // gather decides "systemd" from /run/systemd/system, and never asks systemctl then.
    let h = ubuntu_ready().file(gpum_common::agent_state::UNIT_PATH, "").command(
        "systemctl show gpum-agent -p LoadState,ActiveState,SubState,Result,ExecMainStatus",
        Ok(Output {
            code: Some(1),
            stdout: vec![],
            stderr: fixture("debian12-systemctl-nosystemd.txt").into_bytes(),
        }),
    );
    let f = gather(&h, &offline(), &t4());
    assert!(f.existing.unit_state.is_none());
    assert_eq!(h.ran().len(), 1, "systemd is up in this fake, so systemctl was asked");
}
