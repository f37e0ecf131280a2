//! `run` over `FakeHost`: the dry run changes nothing, the gate keeps its order, the join code
//! comes from the documented places, and `--json` has the documented shape.

use gpum_common::Failure;
use gpum_host::fake::FakeHost;
use gpum_preflight::facts::*;
use gpum_preflight::gpu::GpuFacts;
use gpum_protocol::joincode::JoinCode;
use serde_json::Value;

use crate::plan::Step;
use crate::tests_support::{LANGS, configured_debian, docker_without_toolkit_running, fixture, lang_arg, t4};
use crate::{Io, join_code, run};

/// A fresh Ubuntu 22.04 GPU machine: no Docker, no toolkit, systemd, root.
fn fresh_ubuntu() -> FakeHost {
    FakeHost::new()
        .file(OS_RELEASE, fixture("ubuntu2204.os-release"))
        .file(MOUNTINFO, fixture("debian12-container.mountinfo"))
        .file(
            DPKG_STATUS,
            fixture("debian12-dpkg-status-excerpt").replace("Package: docker.io", "Package: not-docker"),
        )
        .dir(SYSTEMD_RUN_DIR)
        .dir("/var/lib")
        .space_at("/var/lib", 500_000_000_000)
        .env_var("PATH", "/usr/bin")
}

/// `daemon.json` as the install leaves it: the runtime and live-restore.
const CONFIGURED_DAEMON_JSON: &str = "{\"live-restore\": true, \"runtimes\": {\"nvidia\": {\"args\": [], \"path\": \"nvidia-container-runtime\"}}}";
/// The toolkit's settings as the install leaves them.
const GPUMS_TOOLKIT_CONFIG: &str = "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n\
                                    accept-nvidia-visible-devices-as-volume-mounts = true\n";

/// The audit of `h`, offline, in English.
fn audit(h: &FakeHost) -> crate::Audit {
    crate::Audit::run(h, &t4(), &GatherOptions { offline: true, ..Default::default() }, gpum_common::Lang::En)
}

struct Ran {
    code: i32,
    out: String,
    err: String,
}

fn go(h: &FakeHost, gpu: &GpuFacts, args: &[&str], stdin: &str) -> Ran {
    let args: Vec<String> =
        std::iter::once("gpum-install").chain(args.iter().copied()).map(String::from).collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut input = stdin.as_bytes();
    let host: std::sync::Arc<dyn gpum_host::Host> = std::sync::Arc::new(h.clone());
    let code = run(host, gpu, &args, &mut Io { stdin: &mut input, stdout: &mut out, stderr: &mut err });
    Ran { code, out: String::from_utf8(out).unwrap(), err: String::from_utf8(err).unwrap() }
}

/// Four groups but no check symbol: malformed.
const NO_CHECK: &str = "GPUM-7K3QD-M2X9P-4RT8V-H6W1N";

fn valid_code() -> String {
    // A valid code for these tests: the prefix and groups above, plus its own check symbol.
    let c = JoinCode::generate().to_string();
    assert!(JoinCode::parse(&c).is_ok());
    c
}

/// The dry run on `h` in every language, as committed snapshots (`src/snapshots/`): the human
/// report with its exit code and stderr, and the `--json` object (checks and plan). Returns the
/// human runs, in [`LANGS`] order.
fn snapshot_dry_run(name: &str, h: &FakeHost, gpu: &GpuFacts) -> Vec<Ran> {
    let mut human = Vec::new();
    for lang in LANGS {
        let l = lang_arg(lang);
        let r = go(h, gpu, &["--dry-run", "--offline", "--lang", l], "");
        let shown = format!("exit {}\n--- stdout\n{}--- stderr\n{}", r.code, r.out, r.err);
        insta::assert_snapshot!(format!("{name}_{l}_report"), shown);
        let j = go(h, gpu, &["--dry-run", "--offline", "--json", "--lang", l], "");
        assert_eq!(j.code, r.code, "--json exits as the human report does");
        assert!(j.err.is_empty(), "--json keeps stderr quiet: {}", j.err);
        assert_eq!(j.out.lines().count(), 1, "one object on one line");
        let v: Value = serde_json::from_str(&j.out).unwrap();
        assert_eq!(v["ready"], r.code == 0);
        insta::assert_json_snapshot!(format!("{name}_{l}_json"), v);
        human.push(r);
    }
    assert!(h.writes().is_empty(), "{:?}", h.writes());
    assert!(h.ran().iter().all(|c| READ_ONLY_COMMANDS.iter().any(|p| c.display().starts_with(p))));
    human
}

/// A fresh machine: ready, and the plan installs everything (Docker's and NVIDIA's repositories
/// with their pinned fingerprints, the packages, a restart that stops nothing, the agent).
#[test]
fn dry_run_on_a_fresh_machine_is_ready_writes_nothing_and_plans_everything() {
    let runs = snapshot_dry_run("fresh_ubuntu", &fresh_ubuntu(), &t4());
    assert!(runs.iter().all(|r| r.code == 0));
}

/// Docker and a safe toolkit, the runtime missing from the owner's daemon.json: merge, reload.
#[test]
fn dry_run_snapshot_docker_and_toolkit_without_the_runtime() {
    snapshot_dry_run("configured_debian", &configured_debian(), &t4());
}

/// Docker running a container without a restart policy, no toolkit: the restart names it.
#[test]
fn dry_run_snapshot_a_restart_that_stops_a_container() {
    snapshot_dry_run("docker_running_web", &docker_without_toolkit_running("web"), &t4());
}

/// A toolkit with a known container escape that the install upgrades: the check warns with the
/// installer's fix (the check's context), and the plan upgrades it and restarts Docker.
#[test]
fn dry_run_snapshot_a_vulnerable_toolkit_the_install_upgrades() {
    let h = fresh_ubuntu()
        .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt"))
        .file("/usr/bin/docker", "")
        .file("/usr/bin/nvidia-ctk", "")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"));
    let runs = snapshot_dry_run("vulnerable_toolkit", &h, &t4());
    assert!(runs.iter().all(|r| r.code == 0), "a toolkit the install upgrades does not fail the audit");
}

#[test]
fn dry_run_on_a_configured_machine_plans_only_the_agent() {
    let configured = || {
        fresh_ubuntu()
            .file(DAEMON_JSON, CONFIGURED_DAEMON_JSON)
            .file(TOOLKIT_CONFIG, GPUMS_TOOLKIT_CONFIG)
            .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", "1.17.8-1"))
            .file("/usr/bin/docker", "")
            .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("ubuntu2204-docker-ping.http"))
    };
    let kinds = |h: &FakeHost| -> Vec<String> {
        let a = audit(h);
        assert!(a.ready(), "{:?}", a.findings);
        a.plan.steps.iter().map(|s| s.checkpoint()).collect()
    };
    let agent =
        ["download_agent", "register", "write_agent_binary", "write_agent_unit", "start_agent", "gpu_check"];
    assert_eq!(kinds(&configured()), agent, "a configured machine: only the agent");
    // The toolkit as its package ships it: its settings change; the hook reads them at each
    // container start, so nothing reloads.
    let h = configured().file(TOOLKIT_CONFIG, fixture("nvidia-container-runtime-config.toml"));
    let mut want = agent.to_vec();
    want.insert(1, "configure_toolkit");
    assert_eq!(kinds(&h), want);
    // Only live-restore missing: merged into daemon.json, and a reload applies it.
    let h = configured().file(DAEMON_JSON, fixture("ubuntu2204-daemon-nvidia.json"));
    let mut want = agent.to_vec();
    want.splice(1..1, ["configure_docker", "reload_docker"]);
    assert_eq!(kinds(&h), want);
    assert!(
        audit(&h)
            .plan
            .steps
            .contains(&Step::ConfigureDocker { path: DAEMON_JSON.into(), live_restore: true })
    );
    // dockerd runs with --live-restore: the file must not get the key too (dockerd would refuse
    // to start or reload), so a runtime-less file gets the runtime alone.
    let flag = |h: FakeHost, arg: &str| {
        h.file(DOCKERD_PID, "4242\n")
            .file("/proc/4242/cmdline", format!("/usr/bin/dockerd\0-H\0fd://\0{arg}\0"))
    };
    let h = flag(configured().file(DAEMON_JSON, fixture("ubuntu2204-daemon-nvidia.json")), "--live-restore");
    assert_eq!(kinds(&h), agent, "live-restore on by the flag");
    let h = flag(configured().file(DAEMON_JSON, "{}"), "--live-restore=true");
    let a = audit(&h);
    assert!(a.plan.steps.contains(&Step::ConfigureDocker { path: DAEMON_JSON.into(), live_restore: false }));
    assert!(a.plan.steps.contains(&Step::ReloadDocker), "{:?}", a.plan.steps);
    // --live-restore=false, or a swarm: refused before anything changes.
    let off = flag(configured(), "--live-restore=false");
    let swarm = configured().file("/var/lib/docker/swarm/docker-state.json", "{}");
    for h in [off, swarm] {
        let a = audit(&h);
        assert!(!a.ready());
        let f = a.findings.iter().find(|f| f.id == gpum_preflight::checks::LIVE_RESTORE).unwrap();
        assert_eq!(f.status, gpum_preflight::Status::Fail, "{f:?}");
    }
    // Docker present without the toolkit: install it, merge daemon.json, and restart Docker
    // (its GPU driver registers only at start).
    let h = fresh_ubuntu()
        .file(
            DPKG_STATUS,
            fixture("ubuntu2204-dpkg-status-excerpt").replace("nvidia-container-toolkit", "not-the-toolkit"),
        )
        .file("/usr/bin/docker", "")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"));
    let a = audit(&h);
    assert!(a.plan.steps.iter().any(|s| matches!(s, Step::RestartDocker { .. })), "{:?}", a.plan.steps);
    assert!(
        a.plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::AddRepository(r) if r.repo.id == "gpum-nvidia-container-toolkit"))
    );
    assert!(!a.plan.steps.iter().any(|s| matches!(s, Step::AddRepository(r) if r.repo.id == "gpum-docker")));
    // Docker and the toolkit present, only the runtime missing: a reload is enough.
    let h = fresh_ubuntu()
        .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", "1.17.8-1"))
        .file("/usr/bin/docker", "")
        .file("/usr/bin/nvidia-ctk", "")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"));
    let a = audit(&h);
    assert!(a.plan.steps.contains(&Step::ReloadDocker), "{:?}", a.plan.steps);
    assert!(a.plan.steps.contains(&Step::ConfigureDocker { path: DAEMON_JSON.into(), live_restore: true }));
    assert!(
        !a.plan.steps.iter().any(|s| matches!(s, Step::RestartDocker { .. } | Step::InstallPackages { .. }))
    );
    // Everything configured, but the running engine never read the file (an install killed
    // between writing daemon.json and reloading): a reload, nothing else.
    let h = fresh_ubuntu()
        .file(DAEMON_JSON, CONFIGURED_DAEMON_JSON)
        .file(TOOLKIT_CONFIG, GPUMS_TOOLKIT_CONFIG)
        .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", "1.17.8-1"))
        .file("/usr/bin/docker", "")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("ubuntu2204-docker-ping.http"))
        .unix_http(DEFAULT_DOCKER_SOCKET, "/info", "HTTP/1.0 200 OK\r\n\r\n{\"Runtimes\":{\"runc\":{}}}");
    let a = audit(&h);
    let kinds: Vec<String> = a.plan.steps.iter().map(|s| s.checkpoint()).collect();
    assert_eq!(
        kinds,
        [
            "download_agent",
            "reload_docker",
            "register",
            "write_agent_binary",
            "write_agent_unit",
            "start_agent",
            "gpu_check"
        ]
    );
    // A toolkit with a known container escape (older than 1.17.8) is upgraded from its repository.
    let h = fresh_ubuntu()
        .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt"))
        .file("/usr/bin/docker", "")
        .file("/usr/bin/nvidia-ctk", "")
        .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"));
    let a = audit(&h);
    assert!(
        a.plan.steps.iter().any(
            |s| matches!(s, Step::InstallPackages { packages } if packages == &["nvidia-container-toolkit"])
        ),
        "{:?}",
        a.plan.steps
    );
    assert!(a.plan.steps.iter().any(|s| matches!(s, Step::RestartDocker { .. })));
}

/// Issue 29, items 9 and 10: with a proxy and `--ca-file`, the plan copies the CA for the agent
/// before registration (0644) and writes the proxy's values to a 0600 file before the drop-in
/// that names it (0644); neither the plan nor the dry run's output carries a value.
#[test]
fn dry_run_plans_the_ca_copy_and_a_0600_file_for_the_proxy_values() {
    let secret = "http://user:hunter2@proxy.example:3128";
    let h =
        fresh_ubuntu().env_var("HTTPS_PROXY", secret).file("/root/ca.pem", "-----BEGIN CERTIFICATE-----\n");
    let r = go(&h, &t4(), &["--dry-run", "--offline", "--json", "--ca-file", "/root/ca.pem"], "");
    assert_eq!(r.code, 0, "{}{}", r.out, r.err);
    assert!(!r.out.contains("hunter2"), "{}", r.out);
    let v: Value = serde_json::from_str(&r.out).unwrap();
    let files: Vec<(String, String, String)> = v["plan"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["action"] == "write_file" || s["action"] == "register")
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap_or_default().to_string();
            (f("purpose"), f("path"), f("mode"))
        })
        .collect();
    let row = |p: &str, path: &str, mode: &str| (p.to_string(), path.to_string(), mode.to_string());
    assert_eq!(
        files,
        [
            row("agent_ca", "/etc/gpum-agent/ca.pem", "0644"),
            row("", "", ""),
            row("agent_binary", "/opt/gpum-agent/gpum-agent", "0755"),
            row("agent_unit", "/etc/systemd/system/gpum-agent.service", "0644"),
            row("agent_proxy_env", "/etc/gpum-agent/proxy.env", "0600"),
            row("agent_proxy", "/etc/systemd/system/gpum-agent.service.d/proxy.conf", "0644"),
        ],
        "the CA's copy, registration, then the service's files"
    );
    assert!(h.writes().is_empty());
}

/// Not root: the report still lists every check and the plan, then fails with exit 10 and the
/// failed checks named on stderr, in the locale's language; `--lang` wins over the locale.
#[test]
fn dry_run_human_report_in_both_languages_and_exit_10_when_not_ready() {
    let h = fresh_ubuntu().with_euid(1000);
    let runs = snapshot_dry_run("not_root", &h, &t4());
    assert!(runs.iter().all(|r| r.code == 10));
    let by_locale = |h: &FakeHost, args: &[&str]| go(h, &t4(), args, "");
    let ru = fresh_ubuntu().with_euid(1000).env_var("LANG", "ru_RU.UTF-8");
    let r = by_locale(&ru, &["--dry-run", "--offline"]);
    let want = |lang| &runs[LANGS.iter().position(|l| *l == lang).unwrap()];
    assert_eq!(
        (r.code, &r.out, &r.err),
        (10, &want(gpum_common::Lang::Ru).out, &want(gpum_common::Lang::Ru).err)
    );
    let r = by_locale(&ru, &["--dry-run", "--offline", "--lang", "en"]);
    assert_eq!(
        (r.code, &r.out, &r.err),
        (10, &want(gpum_common::Lang::En).out, &want(gpum_common::Lang::En).err)
    );
    let r = by_locale(&h, &["--dry-run", "--offline"]);
    assert_eq!(r.out, want(gpum_common::Lang::En).out, "no locale: English");
    assert!(ru.writes().is_empty());
}

/// Docker with the toolkit but no runtime, and a daemon.json that is not JSON: the check
/// refuses it, so the plan does not list the merge into it (the installer never touches it).
#[test]
fn the_plan_never_promises_to_configure_a_daemon_json_the_checks_refuse() {
    let h = docker_without_toolkit_running("web");
    let ok = audit(&h);
    assert!(ok.plan.steps.iter().any(|s| matches!(s, Step::ConfigureDocker { .. })), "{:?}", ok.plan.steps);
    let h = h.file("/etc/docker/daemon.json", "{\"log-driver\": ");
    let bad = audit(&h);
    assert!(!bad.ready(), "{:?}", bad.findings);
    assert!(
        !bad.plan.steps.iter().any(|s| matches!(s, Step::ConfigureDocker { .. })),
        "{:?}",
        bad.plan.steps
    );
    for lang in LANGS {
        let r = go(&h, &t4(), &["--dry-run", "--offline", "--lang", lang_arg(lang)], "");
        assert_eq!(r.code, 10, "{}", r.err);
        let promise = match lang {
            gpum_common::Lang::Ru => "добавить среду nvidia",
            _ => "add the nvidia runtime",
        };
        assert!(!r.out.contains(promise), "{}", r.out);
    }
}

#[test]
fn dry_run_needs_no_code_but_checks_one_given() {
    let h = fresh_ubuntu();
    assert_eq!(go(&h, &t4(), &["--dry-run", "--offline"], "").code, 0);
    let r = go(&h, &t4(), &["--dry-run", "--offline", "--code", NO_CHECK], "");
    assert_eq!(r.code, 2);
    assert!(r.err.contains("join code looks wrong"));
    assert_eq!(go(&h, &t4(), &["--dry-run", "--offline", "--code", &valid_code()], "").code, 0);
}

#[test]
fn the_gate_keeps_its_order() {
    // 1. unknown parameter first, even as non-root.
    let h = fresh_ubuntu().with_euid(1000);
    assert_eq!(go(&h, &t4(), &["--nope"], "").code, 2);
    // 2. not root, before systemd and the code.
    let h = FakeHost::new().with_euid(1000);
    assert_eq!(go(&h, &t4(), &[], "").code, 13);
    // 3. no systemd, before the code.
    let h = FakeHost::new();
    let r = go(&h, &t4(), &[], "");
    assert_eq!(r.code, 14, "{}", r.err);
    // 4. the code: missing, then malformed.
    let h = fresh_ubuntu();
    let r = go(&h, &t4(), &["--offline"], "");
    assert_eq!(r.code, 2);
    assert!(r.err.contains("No join code"));
    let r = go(&h, &t4(), &["--offline", "--code", "GPUM-XXXX"], "");
    assert_eq!(r.code, 2);
    assert!(r.err.contains("looks wrong"));
    // 5. every failed check, listed.
    let h = fresh_ubuntu().with_arch("aarch64").file(MOUNTINFO, fixture("ubuntu2204-noexec-tmp.mountinfo"));
    let r = go(
        &h,
        &GpuFacts::DriverNotLoaded,
        &["--offline", "--server", "https://p.example", "--code", &valid_code()],
        "",
    );
    assert_eq!(r.code, 10);
    assert!(r.err.contains("(arch, tmp_exec, nvidia_driver)"), "{}", r.err);
    assert!(r.out.contains("[FAIL] tmp_exec"));
    // All passing, but no platform to install from: a usage error, nothing changed.
    let h = fresh_ubuntu();
    let r = go(&h, &t4(), &["--code", &valid_code()], "");
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(r.err.contains("--server"), "{}", r.err);
    assert!(h.writes().is_empty(), "{:?}", h.writes());
}

#[test]
fn a_second_install_stops_before_anything_while_one_holds_the_lock() {
    let h = fresh_ubuntu().lock_held(crate::INSTALL_LOCK, 4242);
    for lang in LANGS {
        let r = go(
            &h,
            &t4(),
            &["--offline", "--server", "https://p.example", "--yes", "--lang", lang_arg(lang)],
            &format!("{}\n", valid_code()),
        );
        assert_eq!(r.code, 10, "{}", r.err);
        assert!(r.err.contains(&Failure::InstallRunning("4242".into()).message(lang)), "{}", r.err);
        assert!(!r.out.contains("[PASS]"), "stopped before the audit: {}", r.out);
    }
    assert!(h.writes().is_empty(), "{:?}", h.writes());
    assert!(h.ran().is_empty(), "{:?}", h.ran());
}

#[test]
fn join_code_sources_in_order() {
    let good = valid_code();
    let other = valid_code();
    let h = FakeHost::new().env_var("GPUM_JOIN_CODE", &other);
    // --code wins over the environment.
    assert_eq!(join_code(&h, Some(&good), &mut "".as_bytes()).unwrap().to_string(), good);
    // The environment wins over stdin.
    assert_eq!(join_code(&h, None, &mut good.as_bytes()).unwrap().to_string(), other);
    // stdin, first line, when it is not a terminal.
    let h = FakeHost::new();
    let input = format!("{good}\nrest\n");
    assert_eq!(join_code(&h, None, &mut input.as_bytes()).unwrap().to_string(), good);
    // A terminal is never read.
    let mut h = FakeHost::new();
    h.tty = true;
    assert_eq!(join_code(&h, None, &mut input.as_bytes()).unwrap_err(), gpum_common::Failure::NoJoinCode);
    assert_eq!(
        join_code(&FakeHost::new(), None, &mut "".as_bytes()).unwrap_err(),
        gpum_common::Failure::NoJoinCode
    );
    assert_eq!(
        join_code(&FakeHost::new(), None, &mut "GPUM-123\n".as_bytes()).unwrap_err(),
        gpum_common::Failure::BadJoinCode
    );
}

#[test]
fn help_and_version_exit_0() {
    let h = FakeHost::new();
    let r = go(&h, &t4(), &["--help"], "");
    assert_eq!(r.code, 0);
    assert!(r.out.contains("--dry-run") && r.out.contains("Exit codes"));
    let r = go(&h, &t4(), &["--version"], "");
    assert_eq!(r.code, 0);
    assert!(r.out.contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn a_conflicting_docker_list_fails_apt_sources() {
    let h = fresh_ubuntu().file(
        "/etc/apt/sources.list.d/docker.list",
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu jammy stable\n",
    );
    let r = go(&h, &t4(), &["--dry-run", "--offline", "--json"], "");
    assert_eq!(r.code, 10);
    let v: Value = serde_json::from_str(&r.out).unwrap();
    let apt = v["checks"].as_array().unwrap().iter().find(|c| c["id"] == "apt_sources").unwrap();
    assert_eq!(apt["status"], "fail");
    assert_eq!(v["ready"], false);
}

/// Issue 30, part 2: each step carries the values the install executes (the proxy's values in
/// the file's content, the mode as a number, the repository itself, the GPU check's wait),
/// while the JSON keeps its documented shape and neither it nor `Debug` shows a content.
#[test]
fn each_step_carries_what_the_install_executes_and_the_json_keeps_its_shape() {
    use crate::plan::{Content, Purpose};
    let secret = "http://user:hunter2@proxy.example:3128";
    let h = fresh_ubuntu().env_var("HTTPS_PROXY", secret);
    let a = audit(&h);
    let file = |p: Purpose| {
        a.plan
            .steps
            .iter()
            .find_map(|s| match s {
                Step::WriteFile { purpose, mode, content, .. } if *purpose == p => {
                    Some((*mode, content.clone()))
                }
                _ => None,
            })
            .unwrap()
    };
    let values = gpum_enroll::unit::proxy_env(&[("HTTPS_PROXY".into(), secret.into())]);
    assert_eq!(file(Purpose::AgentProxyEnv), (0o600, Content::Bytes(values.into_bytes())));
    assert_eq!(
        file(Purpose::AgentUnit),
        (0o644, Content::Bytes(gpum_enroll::unit::UNIT.as_bytes().to_vec()))
    );
    assert_eq!(file(Purpose::AgentBinary), (0o755, Content::VerifiedAgent));
    let repos: Vec<(&str, &str)> = a
        .plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::AddRepository(r) => Some((r.repo.id, r.codename.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(repos, [("gpum-docker", "jammy"), ("gpum-nvidia-container-toolkit", "jammy")]);
    assert_eq!(a.plan.steps.last(), Some(&Step::GpuCheck { wait_secs: crate::plan::GPU_WAIT_SECS }));

    assert!(!format!("{:?}", a.plan).contains("hunter2"), "Debug never shows a file's content");
    let v = serde_json::to_value(&a.plan).unwrap();
    assert!(!v.to_string().contains("hunter2"), "{v}");
    let keys = |s: &Value| {
        let mut k: Vec<String> = s.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    for s in v.as_array().unwrap() {
        let want: &[&str] = match s["action"].as_str().unwrap() {
            "write_file" => &["action", "mode", "path", "purpose"],
            "add_repository" => &[
                "action",
                "components",
                "fingerprints",
                "id",
                "key_url",
                "keyring",
                "sources",
                "suite",
                "uri",
            ],
            "gpu_check" => &["action"],
            _ => continue,
        };
        assert_eq!(keys(s), want, "{s}");
    }
    let env = v.as_array().unwrap().iter().find(|s| s["purpose"] == "agent_proxy_env").unwrap();
    assert_eq!(env["mode"], "0600");
    let toolkit = &v[2];
    assert_eq!(toolkit["suite"], "/");
    assert_eq!(toolkit["components"], serde_json::json!([]));
}

/// The owner followed Docker's and NVIDIA's own instructions before meeting gpum: their sources
/// are used as they are when each keyring holds exactly the pinned key, and refused as before
/// (exit 10, `apt_sources`) otherwise.
mod owner_sources {
    use super::*;
    use gpum_preflight::Status;
    use gpum_repo_keys::keys::verify_repo_key;
    use gpum_repo_keys::pinned::{DOCKER_UBUNTU, NVIDIA_TOOLKIT, Repo};

    const DOCKER_LIST: &str = "/etc/apt/sources.list.d/docker.list";
    const DOCKER_ASC: &str = "/etc/apt/keyrings/docker.asc";
    /// Docker's instructions for Ubuntu 22.04, verbatim.
    const DOCKER_LINE: &str = "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/ubuntu jammy stable\n";
    const NVIDIA_LIST: &str = "/etc/apt/sources.list.d/nvidia-container-toolkit.list";
    const NVIDIA_GPG: &str = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg";
    /// NVIDIA's instructions, verbatim (`$(ARCH)` is apt's).
    const NVIDIA_LINE: &str = "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n";

    /// The key as `gpg --dearmor` writes it: binary packets.
    fn binary(repo: &Repo) -> Vec<u8> {
        verify_repo_key(repo.key_copy, repo, std::time::SystemTime::now()).unwrap().keyring_bytes()
    }

    /// Docker and a toolkit older than 1.17.8 (which the install upgrades) installed from
    /// NVIDIA's source, with `keyring` at NVIDIA's keyring path (none: missing).
    fn old_toolkit_from_nvidias_source(keyring: Option<Vec<u8>>) -> FakeHost {
        let h = fresh_ubuntu()
            .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt"))
            .file("/usr/bin/docker", "")
            .file("/usr/bin/nvidia-ctk", "")
            .unix_http(DEFAULT_DOCKER_SOCKET, "/_ping", fixture("debian12-docker-ping.http"))
            .file(NVIDIA_LIST, NVIDIA_LINE);
        match keyring {
            Some(k) => h.file(NVIDIA_GPG, k),
            None => h,
        }
    }

    fn repo_steps(a: &crate::Audit) -> Vec<String> {
        a.plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::AddRepository(_) | Step::UseSource(_)))
            .map(|s| s.checkpoint())
            .collect()
    }

    fn apt_finding(a: &crate::Audit) -> &gpum_preflight::Finding {
        a.findings.iter().find(|f| f.id == crate::apt::APT_SOURCES).unwrap()
    }

    #[test]
    fn dockers_layout_with_its_armored_key_is_used_as_it_is() {
        let h = fresh_ubuntu().file(DOCKER_LIST, DOCKER_LINE).file(DOCKER_ASC, DOCKER_UBUNTU.key_copy);
        let a = audit(&h);
        assert!(a.ready(), "{:?}", a.findings);
        assert_eq!(
            repo_steps(&a),
            ["use_source_gpum-docker", "add_repository_gpum-nvidia-container-toolkit"]
        );
        let Some(Step::UseSource(u)) = a.plan.steps.iter().find(|s| matches!(s, Step::UseSource(_))) else {
            panic!("{:?}", a.plan.steps)
        };
        assert_eq!(u.source.file, std::path::Path::new(DOCKER_LIST));
        assert_eq!(u.source.keyring, DOCKER_ASC);
        assert_eq!(u.source.fingerprint, DOCKER_UBUNTU.fingerprints[0]);
        assert_eq!(apt_finding(&a).status, Status::Pass);
        // The dry run says so, naming the file; the JSON step has its documented fields.
        let r = go(&h, &t4(), &["--dry-run", "--offline", "--lang", "en"], "");
        assert_eq!(r.code, 0, "{}{}", r.out, r.err);
        assert!(
            r.out.contains("use your apt source /etc/apt/sources.list.d/docker.list for gpum-docker: its key /etc/apt/keyrings/docker.asc"),
            "{}",
            r.out
        );
        let j = go(&h, &t4(), &["--dry-run", "--offline", "--json"], "");
        let v: Value = serde_json::from_str(&j.out).unwrap();
        let step = v["plan"].as_array().unwrap().iter().find(|s| s["action"] == "use_source").unwrap();
        let mut keys: Vec<&str> = step.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["action", "file", "fingerprints", "id", "keyring", "suite", "uri"], "{step}");
        assert_eq!(step["file"], DOCKER_LIST);
        assert_eq!(step["suite"], "jammy");
        assert!(h.writes().is_empty(), "{:?}", h.writes());
    }

    #[test]
    fn nvidias_layout_with_its_binary_key_serves_the_toolkits_upgrade() {
        let h = old_toolkit_from_nvidias_source(Some(binary(&NVIDIA_TOOLKIT)));
        let a = audit(&h);
        assert!(a.ready(), "{:?}", a.findings);
        assert!(a.plan.installs_toolkit(), "{:?}", a.plan.steps);
        assert_eq!(
            repo_steps(&a),
            ["use_source_gpum-nvidia-container-toolkit"],
            "no source and no key added"
        );
        assert_eq!(apt_finding(&a).status, Status::Pass);
        let runs = snapshot_dry_run("nvidia_source_old_toolkit", &h, &t4());
        assert!(runs.iter().all(|r| r.code == 0 && r.out.contains(NVIDIA_LIST)));
        // A current toolkit needs no repository at all: nothing changes for it.
        let h = old_toolkit_from_nvidias_source(Some(binary(&NVIDIA_TOOLKIT)))
            .file(DPKG_STATUS, fixture("ubuntu2204-dpkg-status-excerpt").replace("1.17.3-1", "1.17.8-1"));
        assert!(repo_steps(&audit(&h)).is_empty());
    }

    #[test]
    fn a_keyring_without_exactly_the_pinned_key_is_refused_as_before() {
        let mut extra = binary(&NVIDIA_TOOLKIT);
        extra.extend(binary(&DOCKER_UBUNTU));
        for (why, keyring) in [
            ("another key", Some(binary(&DOCKER_UBUNTU))),
            ("the pinned key and another", Some(extra)),
            ("no keyring file", None),
            ("not a key", Some(b"<html>404</html>".to_vec())),
        ] {
            let h = old_toolkit_from_nvidias_source(keyring);
            let a = audit(&h);
            assert!(!a.ready(), "{why}");
            assert_eq!(repo_steps(&a), ["add_repository_gpum-nvidia-container-toolkit"], "{why}");
            // Today's finding, word for word: the same check on the same files.
            let today = crate::apt::check(
                &gpum_repo_keys::sources::read_apt_sources(&h),
                &[a.repos[1]],
                gpum_common::Lang::En,
            );
            assert_eq!(apt_finding(&a), &today, "{why}");
            assert_eq!(today.status, Status::Fail);
            assert!(today.fix.as_deref().unwrap().contains(NVIDIA_LIST), "{why}");
            let r = go(&h, &t4(), &["--dry-run", "--offline", "--lang", "en"], "");
            assert_eq!(r.code, 10, "{why}: {}", r.out);
            assert!(r.out.contains("Conflicting values set for option Signed-By"), "{why}: {}", r.out);
            assert!(h.writes().is_empty(), "{why}");
        }
    }
}
