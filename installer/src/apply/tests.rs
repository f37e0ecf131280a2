//! `install` over `FakeHost`, with a fetcher that serves the vendors' real (pinned) keys
//! from the repository's copies and a stand-in agent: a failure at each step stops there,
//! with its exit code, and nothing after it runs or is written. The steps after
//! registration need a real platform: the test host runs them (`cargo xtask e2e`).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpum_common::{Failure, Lang};
use gpum_host::fake::FakeHost;
use gpum_host::{Cmd, Host, Output};
use gpum_repo_keys::keys::{self, VerifiedKey};
use gpum_repo_keys::pinned::Repo;

use super::fetch::hex_sha256;
use super::*;
use crate::download;
use crate::tests_support::*;

struct Offline {
    agent_runs: bool,
    bad_key: bool,
}

impl Fetcher for Offline {
    fn repo_key(&self, host: &dyn Host, repo: &Repo) -> Result<VerifiedKey, Failure> {
        if self.bad_key {
            return Err(Failure::Download(format!("{}: fingerprint not pinned", repo.key_url)));
        }
        keys::verify_repo_key(repo.key_copy, repo, host.now()).map_err(|e| Failure::Download(e.to_string()))
    }
    fn agent(
        &self,
        host: &dyn Host,
        _w: &download::Wanted,
        dest: &Path,
    ) -> Result<download::Fetched, Failure> {
        host.write_atomic(dest, AGENT, 0o700).map_err(|e| Failure::Download(e.to_string()))?;
        Ok(download::Fetched { path: dest.to_path_buf(), version: "0.1.0".into(), sha256: hex_sha256(AGENT) })
    }
    fn test_run(&self, _h: &dyn Host, _p: &Path) -> Result<(), Failure> {
        if self.agent_runs { Ok(()) } else { Err(Failure::AgentNoExec) }
    }
}

/// The stand-in agent's bytes; its "signed" SHA-256 is theirs.
const AGENT: &[u8] = b"agent";

const APT_UPDATE: &str =
    "env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 update";

fn opts() -> Options {
    Options {
        code: Some(gpum_protocol::joincode::JoinCode::generate().to_string()),
        // Nothing listens on port 9: registration fails without a platform.
        server: "http://127.0.0.1:9".into(),
        ca_file: None,
        yes: false,
        allow_downgrade: false,
        probe_registries: None,
        lang: Lang::En,
    }
}

fn go(h: &FakeHost, f: &Offline, o: &Options) -> (Result<Summary, Failure>, String) {
    let host: Arc<dyn Host> = Arc::new(h.clone());
    let gpu = t4();
    let audit = crate::Audit::run(
        h,
        &gpu,
        &gpum_preflight::GatherOptions {
            offline: true,
            server: Some(o.server.clone()),
            ..Default::default()
        },
        Lang::En,
    );
    assert!(audit.ready(), "{:?}", audit.findings);
    let mut out = Vec::new();
    let r = {
        let mut rep = Reporter { out: &mut out, json: false, lang: Lang::En };
        install(host, &audit, f, &NoCheckpoints, o, &mut rep)
    };
    (r, String::from_utf8(out).unwrap())
}

fn ran(h: &FakeHost) -> Vec<String> {
    h.ran().iter().map(|c| c.display()).filter(|c| !c.starts_with("systemctl show")).collect()
}

#[test]
fn a_noexec_tmpdir_or_a_bad_key_stops_before_anything_changes() {
    for (f, code) in [
        (Offline { agent_runs: false, bad_key: false }, 10),
        (Offline { agent_runs: true, bad_key: true }, 20),
    ] {
        let h = fresh_debian();
        let (r, out) = go(&h, &f, &opts());
        assert_eq!(r.unwrap_err().code(), code, "{out}");
        assert!(ran(&h).is_empty(), "{:?}", ran(&h));
        let written: Vec<_> = h.writes().into_iter().filter(|p| !p.starts_with("/tmp")).collect();
        assert!(written.is_empty(), "only the download directory may be touched: {written:?}");
    }
}

#[test]
fn an_apt_failure_is_exit_30_with_apts_own_lines_and_nothing_after_it_runs() {
    let h = fresh_debian().command(
        APT_UPDATE,
        Ok(Output {
            code: Some(100),
            stdout: b"Hit:1 http://x bookworm InRelease\n".to_vec(),
            stderr: b"E: The repository 'http://x bookworm Release' is not signed.\n".to_vec(),
        }),
    );
    let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
    let f = r.unwrap_err();
    assert_eq!(f.code(), 30);
    assert!(f.message(Lang::En).contains("is not signed"), "{}", f.message(Lang::En));
    assert!(out.contains("[FAIL] 4. refresh package lists"), "{out}");
    // The exit status as the owner reads it: a number, never Rust's `Some(100)`.
    assert!(f.message(Lang::En).contains("(exit 100)"), "{}", f.message(Lang::En));
    assert!(!f.message(Lang::En).contains("Some("), "{}", f.message(Lang::En));
    assert_eq!(ran(&h), [APT_UPDATE], "nothing past the failure");
    // The keys and sources were written, with the pinned keys.
    assert!(h.exists(Path::new("/etc/apt/keyrings/gpum-docker.gpg")));
    assert!(
        h.read_to_string(Path::new("/etc/apt/sources.list.d/gpum-docker.sources"))
            .unwrap()
            .contains("Signed-By: /etc/apt/keyrings/gpum-docker.gpg")
    );
    assert!(!h.exists(Path::new("/etc/docker/daemon.json")));
}

#[test]
fn an_interrupted_dpkg_is_finished_before_apt_runs() {
    const CONFIGURE: &str = "env DEBIAN_FRONTEND=noninteractive dpkg --configure -a";
    // The journal entry a killed dpkg leaves; `dpkg --configure -a` replays and removes it.
    let h = fresh_debian()
        .file("/var/lib/dpkg/updates/0003", "")
        .command(CONFIGURE, Ok(Output { code: Some(0), stdout: Vec::new(), stderr: Vec::new() }))
        .command(
            APT_UPDATE,
            Ok(Output { code: Some(100), stdout: Vec::new(), stderr: b"E: stop here".to_vec() }),
        );
    let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
    assert_eq!(r.unwrap_err().code(), 30, "{out}");
    assert!(out.contains("dpkg was interrupted"), "said before it runs: {out}");
    assert_eq!(ran(&h), [CONFIGURE, APT_UPDATE], "dpkg finished first");
}

#[test]
fn a_held_package_lists_lock_is_waited_for_and_named() {
    // apt-daily holds the lists' lock for the whole run here: the install waits its 10 minutes
    // (the fake host's sleep returns at once), then stops with the holder named, before apt.
    let h = fresh_debian().lock_held("/var/lib/apt/lists/lock", 5150);
    let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
    let f = r.unwrap_err();
    assert_eq!(f.code(), 30, "{out}");
    assert!(
        out.contains("/var/lib/apt/lists/lock is held by process 5150") && out.contains("up to 10 minutes"),
        "{out}"
    );
    assert!(
        f.message(Lang::En).contains("still held by process 5150 after 10 minutes"),
        "{}",
        f.message(Lang::En)
    );
    assert!(!ran(&h).iter().any(|c| c.contains("apt-get")), "{:?}", ran(&h));
}

#[test]
fn an_invalid_daemon_json_is_never_overwritten() {
    // Docker present with the toolkit: the plan merges daemon.json and reloads. The file
    // turned invalid after the audit (the gate refuses an invalid one up front).
    let h = configured_debian();
    let gpu = t4();
    let audit = crate::Audit::run(
        &h,
        &gpu,
        &gpum_preflight::GatherOptions { offline: true, server: Some(opts().server), ..Default::default() },
        Lang::En,
    );
    assert!(audit.ready(), "{:?}", audit.findings);
    // Broken after the audit (a FakeHost's clones share one machine).
    let host_after = h.clone().file("/etc/docker/daemon.json", "{\"log-driver\": ");
    let host: Arc<dyn Host> = Arc::new(host_after.clone());
    let mut out = Vec::new();
    let mut rep = Reporter { out: &mut out, json: false, lang: Lang::En };
    let f = install(
        host,
        &audit,
        &Offline { agent_runs: true, bad_key: false },
        &NoCheckpoints,
        &opts(),
        &mut rep,
    )
    .unwrap_err();
    assert_eq!(f.code(), 30);
    assert!(f.message(Lang::En).contains("/etc/docker/daemon.json"), "{}", f.message(Lang::En));
    assert_eq!(host_after.read_to_string(Path::new("/etc/docker/daemon.json")).unwrap(), "{\"log-driver\": ");
    assert!(ran(&host_after).is_empty(), "no reload after a refused merge: {:?}", ran(&host_after));
}

#[test]
fn a_merge_keeps_the_owners_keys_backs_up_and_reloads_then_registration_failure_is_reported() {
    let h = configured_debian()
        .command("systemctl reload docker", Ok(Output { code: Some(0), ..Default::default() }))
        .unix_http(
            gpum_preflight::facts::DEFAULT_DOCKER_SOCKET,
            "/info",
            "HTTP/1.0 200 OK\r\n\r\n{\"Runtimes\":{\"runc\":{},\"nvidia\":{}}}",
        );
    let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
    // No platform listens: registration fails after the machine is ready.
    let f = r.unwrap_err();
    assert_eq!(f.code(), 1, "{out}");
    assert!(out.contains("[ ok ] 2. NVIDIA Container Toolkit settings"), "{out}");
    assert!(out.contains("[ ok ] 3. Docker settings"), "{out}");
    assert!(out.contains("[ ok ] 4. reload Docker's settings"), "{out}");
    assert!(out.contains("[FAIL] 5. register"), "{out}");
    let new = h.read_to_string(Path::new("/etc/docker/daemon.json")).unwrap();
    assert!(new.find("log-opts").unwrap() < new.find("runtimes").unwrap(), "{new}");
    assert!(new.contains("\"live-restore\": true"), "{new}");
    // The toolkit's settings: gpum's two values, every shipped line kept, the old file beside it.
    let toolkit = Path::new(gpum_preflight::facts::TOOLKIT_CONFIG);
    let new = h.read_to_string(toolkit).unwrap();
    assert!(gpum_preflight::parse::toolkit_config::parse(&new).unwrap().is_gpums(), "{new}");
    let shipped = crate::tests_support::fixture("nvidia-container-runtime-config.toml");
    assert!(shipped.lines().all(|l| new.lines().any(|n| n == l)), "{new}");
    let backups: Vec<_> =
        h.writes().into_iter().filter(|p| p.to_string_lossy().contains("config.toml.gpum-backup-")).collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    assert_eq!(h.read_to_string(&backups[0]).unwrap(), shipped);
    let backups: Vec<_> =
        h.writes().into_iter().filter(|p| p.to_string_lossy().contains("daemon.json.gpum-backup-")).collect();
    assert_eq!(backups.len(), 1);
    assert_eq!(h.read_to_string(&backups[0]).unwrap(), OWNER_DAEMON_JSON);
    assert_eq!(ran(&h), ["systemctl reload docker"], "nothing after the failed registration ran");
    assert!(!h.exists(Path::new("/opt/gpum-agent/gpum-agent")));
    assert!(!h.exists(Path::new("/etc/gpum-agent/config.toml")));
    // The install id was kept for the re-run.
    assert_eq!(h.read_to_string(Path::new(INSTALL_ID)).unwrap().trim().len(), 32);
}

#[test]
fn a_restart_that_stops_containers_needs_a_yes() {
    let h = docker_without_toolkit_running("web");
    // No terminal, no --yes: refused before anything, with the container named.
    let (r, _) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
    assert_eq!(r.unwrap_err(), Failure::RestartNotConfirmed(vec!["web".into()]));
    assert!(ran(&h).is_empty() && h.writes().is_empty());
    // A terminal that says no: the same.
    let mut h2 = docker_without_toolkit_running("web");
    h2.answer = Some(false);
    assert_eq!(go(&h2, &Offline { agent_runs: true, bad_key: false }, &opts()).0.unwrap_err().code(), 2);
    assert!(h2.writes().is_empty());
    // --yes goes on (and stops at the first command the fake does not know).
    let h3 = docker_without_toolkit_running("web");
    let (r, out) = go(&h3, &Offline { agent_runs: true, bad_key: false }, &Options { yes: true, ..opts() });
    assert_eq!(r.unwrap_err().code(), 30, "{out}");
    assert_eq!(ran(&h3), [APT_UPDATE]);
}

/// A host that is `inner`, with its own environment, and that runs `hook` before each
/// command: what another process does to the machine while apt runs.
struct During<H> {
    inner: H,
    env: Vec<(String, String)>,
    hook: Hook<H>,
}

type Hook<H> = Box<dyn Fn(&H, &Cmd) + Send + Sync>;

impl<H: Host> Host for During<H> {
    fn run(&self, cmd: &Cmd) -> std::io::Result<Output> {
        (self.hook)(&self.inner, cmd);
        self.inner.run(cmd)
    }
    fn read(&self, p: &Path) -> std::io::Result<Vec<u8>> {
        self.inner.read(p)
    }
    fn read_to_string(&self, p: &Path) -> std::io::Result<String> {
        self.inner.read_to_string(p)
    }
    fn read_pieces(&self, p: &Path, each: &mut dyn FnMut(&[u8])) -> std::io::Result<()> {
        self.inner.read_pieces(p, each)
    }
    fn read_kept(&self, p: &Path) -> std::io::Result<Vec<u8>> {
        self.inner.read_kept(p)
    }
    fn hostname(&self) -> std::io::Result<String> {
        self.inner.hostname()
    }
    fn exists(&self, p: &Path) -> bool {
        self.inner.exists(p)
    }
    fn is_dir(&self, p: &Path) -> bool {
        self.inner.is_dir(p)
    }
    fn read_dir(&self, p: &Path) -> std::io::Result<Vec<PathBuf>> {
        self.inner.read_dir(p)
    }
    fn write_atomic(&self, p: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
        self.inner.write_atomic(p, data, mode)
    }
    fn create_dir_all(&self, p: &Path, mode: u32) -> std::io::Result<()> {
        self.inner.create_dir_all(p, mode)
    }
    fn remove_file(&self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_file(p)
    }
    fn remove_dir_all(&self, p: &Path) -> std::io::Result<()> {
        self.inner.remove_dir_all(p)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn space(&self, p: &Path) -> std::io::Result<gpum_host::FsSpace> {
        self.inner.space(p)
    }
    fn env(&self, key: &str) -> Option<String> {
        self.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()).or_else(|| self.inner.env(key))
    }
    fn euid(&self) -> u32 {
        self.inner.euid()
    }
    fn now(&self) -> std::time::SystemTime {
        self.inner.now()
    }
    fn monotonic(&self) -> Duration {
        self.inner.monotonic()
    }
    fn arch(&self) -> String {
        self.inner.arch()
    }
    fn stdin_is_tty(&self) -> bool {
        self.inner.stdin_is_tty()
    }
    fn stderr_is_tty(&self) -> bool {
        self.inner.stderr_is_tty()
    }
    fn run_with_status(&self, cmd: &Cmd, on_line: &mut dyn FnMut(&str)) -> std::io::Result<Output> {
        // The hook sees the command as it runs: with the fake's status pipe, descriptor 3.
        let args = cmd.args.iter().map(|a| a.replace(gpum_host::STATUS_FD, "3")).collect();
        (self.hook)(&self.inner, &Cmd { args, ..cmd.clone() });
        self.inner.run_with_status(cmd, on_line)
    }
    fn confirm(&self, prompt: &str) -> std::io::Result<Option<bool>> {
        self.inner.confirm(prompt)
    }
    fn changed(&self, p: &Path) -> std::io::Result<std::time::SystemTime> {
        self.inner.changed(p)
    }
    fn sleep(&self, d: Duration) {
        self.inner.sleep(d)
    }
    fn lock_holder(&self, p: &Path) -> std::io::Result<Option<i32>> {
        self.inner.lock_holder(p)
    }
    fn try_lock(&self, p: &Path) -> std::io::Result<Result<gpum_host::HeldLock, i32>> {
        self.inner.try_lock(p)
    }
    fn create_partial(&self, dest: &Path, mode: u32) -> std::io::Result<Box<dyn gpum_host::PartialFile>> {
        self.inner.create_partial(dest, mode)
    }
    fn create_dir_exclusive(&self, p: &Path, mode: u32) -> std::io::Result<()> {
        self.inner.create_dir_exclusive(p, mode)
    }
    fn lstat(&self, p: &Path) -> std::io::Result<gpum_host::FileStat> {
        self.inner.lstat(p)
    }
    fn unix_http_get(&self, socket: &Path, path: &str) -> std::io::Result<gpum_host::UnixHttpResponse> {
        self.inner.unix_http_get(socket, path)
    }
}

/// The audit of `h` (with `--ca-file`'s bytes `ca`), its plan cut down to the steps `keep`
/// names by checkpoint: the steps after registration, without a platform.
fn audit_keeping(h: &FakeHost, ca: Option<&[u8]>, keep: &[&str]) -> crate::Audit {
    let mut audit = crate::Audit::run(
        h,
        &t4(),
        &gpum_preflight::GatherOptions {
            offline: true,
            server: Some(opts().server),
            extra_roots_pem: ca.map(<[u8]>::to_vec).into_iter().collect(),
        },
        Lang::En,
    );
    assert!(audit.ready(), "{:?}", audit.findings);
    audit.plan.steps.retain(|s| keep.contains(&s.checkpoint().as_str()));
    let left: Vec<String> = audit.plan.steps.iter().map(Step::checkpoint).collect();
    assert_eq!(left, keep, "the plan has these steps, in this order");
    audit
}

fn install_on(host: Arc<dyn Host>, audit: &crate::Audit, o: &Options) -> (Result<Summary, Failure>, String) {
    let mut out = Vec::new();
    let f = Offline { agent_runs: true, bad_key: false };
    let r = install(
        host,
        audit,
        &f,
        &NoCheckpoints,
        o,
        &mut Reporter { out: &mut out, json: false, lang: Lang::En },
    );
    (r, String::from_utf8(out).unwrap())
}

/// Issue 29, item 5: the agent is verified in the first step and installed minutes later,
/// after apt. Bytes swapped in the work directory in between (here: while apt runs) are
/// refused with exit 20, and nothing is installed; the same run without the swap installs
/// exactly the verified bytes.
#[test]
fn an_agent_changed_after_verification_is_refused_and_nothing_is_installed() {
    let bin = Path::new("/opt/gpum-agent/gpum-agent");
    let keep = ["download_agent", "apt_update", "write_agent_binary"];
    for swap in [true, false] {
        let h = fresh_debian().command(APT_UPDATE, Ok(Output { code: Some(0), ..Default::default() }));
        let audit = audit_keeping(&h, None, &keep);
        let host = During {
            inner: h.clone(),
            env: Vec::new(),
            hook: Box::new(move |inner: &FakeHost, cmd: &Cmd| {
                if !swap || cmd.display() != APT_UPDATE {
                    return;
                }
                let work = inner.read_dir(Path::new("/tmp")).unwrap();
                let [dir] = work.as_slice() else { panic!("one work directory: {work:?}") };
                inner.write_atomic(&dir.join("gpum-agent"), b"#!/bin/sh\nevil\n", 0o700).unwrap();
            }),
        };
        let (r, out) = install_on(Arc::new(host), &audit, &opts());
        if swap {
            let f = r.unwrap_err();
            assert_eq!(f.code(), 20, "{out}");
            let msg = f.message(Lang::En);
            assert!(
                msg.contains("changed after it was verified") && msg.contains(&hex_sha256(AGENT)),
                "{msg}"
            );
            assert!(out.contains("[FAIL] 3."), "{out}");
            assert!(!h.exists(bin), "nothing installed");
            assert!(!h.writes().iter().any(|p| p.starts_with("/opt")), "{:?}", h.writes());
        } else {
            r.unwrap_or_else(|f| panic!("{f:?}: {out}"));
            assert_eq!(h.read(bin).unwrap(), AGENT);
        }
    }
}

/// Issues 29, items 9 and 10, on a real filesystem (a scratch root): the proxy's values
/// are in a 0600 file that the drop-in only names, the drop-in holds no credential; the CA
/// is copied into the config directory (0700) as a 0644 file of the installing user, and the
/// config names the copy. A re-run with the same proxy and CA changes nothing.
#[test]
#[allow(clippy::disallowed_methods)]
fn proxy_values_and_the_ca_are_the_services_own_files_with_their_modes() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root = tempfile::tempdir().unwrap();
    let real = gpum_host::RealHost::with_root(root.path());
    let tmp = real.map(Path::new("/tmp"));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    std::fs::create_dir_all(real.map(Path::new("/home/owner"))).unwrap();
    std::fs::write(real.map(Path::new("/home/owner/ca.pem")), pem).unwrap();
    let secret = "http://user:pa$$w0rd@proxy.example:3128";
    let env = vec![
        ("HTTPS_PROXY".to_string(), secret.to_string()),
        ("NO_PROXY".to_string(), "localhost".to_string()),
    ];

    let fake = fresh_debian().env_var("HTTPS_PROXY", secret).env_var("NO_PROXY", "localhost");
    let keep = ["download_agent", "write_agent_ca", "write_agent_proxy_env", "write_agent_proxy"];
    let audit = audit_keeping(&fake, Some(pem), &keep);
    let o = Options { ca_file: Some(PathBuf::from("/home/owner/ca.pem")), ..opts() };
    // Registration reaches the platform through the copy, and writes it into the config.
    assert_eq!(agent_ca_file(&audit.plan, &o), Some(PathBuf::from("/etc/gpum-agent/ca.pem")));
    assert_eq!(agent_ca_file(&audit.plan, &opts()), None);

    let host = || -> Arc<dyn Host> {
        Arc::new(During {
            inner: real.clone(),
            env: env.clone(),
            hook: Box::new(|_: &gpum_host::RealHost, _: &Cmd| {}),
        })
    };
    let (r, out) = install_on(host(), &audit, &o);
    r.unwrap_or_else(|f| panic!("{f:?}: {out}"));
    let euid = nix::unistd::geteuid().as_raw();
    let meta = |p: &str| {
        let m = std::fs::symlink_metadata(real.map(Path::new(p))).unwrap();
        (m.uid(), m.mode() & 0o7777)
    };
    let read = |p: &str| std::fs::read_to_string(real.map(Path::new(p))).unwrap();
    assert_eq!(meta("/etc/gpum-agent"), (euid, 0o700));
    assert_eq!(meta("/etc/gpum-agent/ca.pem"), (euid, 0o644));
    assert_eq!(read("/etc/gpum-agent/ca.pem").as_bytes(), pem);
    assert_eq!(meta("/etc/gpum-agent/proxy.env"), (euid, 0o600));
    let values = read("/etc/gpum-agent/proxy.env");
    assert!(values.contains(r#"HTTPS_PROXY="http://user:pa\$\$w0rd@proxy.example:3128""#), "{values}");
    assert!(values.contains(r#"NO_PROXY="localhost""#), "{values}");
    let drop_in = read(crate::plan::PROXY_DROP_IN);
    assert!(!drop_in.contains("w0rd") && !drop_in.contains("Environment="), "{drop_in}");
    assert!(drop_in.contains("EnvironmentFile=-/etc/gpum-agent/proxy.env"), "{drop_in}");
    assert_eq!(meta(crate::plan::PROXY_DROP_IN).1, 0o644);

    // Again, with the same proxy and CA: every file is left as it is.
    let (r, out) = install_on(host(), &audit, &o);
    r.unwrap_or_else(|f| panic!("{f:?}: {out}"));
    assert_eq!(out.matches("[skip]").count(), 3, "{out}");
}

/// A platform on loopback that answers every call (`enroll`, `register`) as the reference one
/// does for one install id: always the same node and token. Enough for the install's steps
/// after registration to run over `FakeHost`.
fn platform() -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let mut r = BufReader::new(s);
            let mut len = 0;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let answer = serde_json::json!({
                "node_id": NODE, "node_token": "ab".repeat(32),
                "heartbeat_interval_secs": 30, "probe_image": null,
            })
            .to_string();
            let _ = write!(
                r.get_mut(),
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    url
}

/// The node [`platform`] registers.
const NODE: &str = "n-crash";

/// What the commands did to the machine, beyond its files: what a real machine would show
/// after them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Effects {
    /// Packages apt installed.
    installed: std::collections::BTreeSet<String>,
    /// The `daemon.json` the running engine last (re)loaded.
    docker_runs_with: Option<Vec<u8>>,
    /// The unit file systemd last loaded (`daemon-reload`).
    units_loaded: Option<Vec<u8>>,
    enabled: bool,
    /// The binary and the config the running agent was last started with.
    agent_runs_with: Option<(Vec<u8>, Vec<u8>)>,
}

/// A fresh Debian machine whose commands succeed and take effect: apt installs (into
/// [`Effects`]), a Docker restart brings the engine up, the agent, once started, reports itself
/// connected in its state file as the real one does after its first heartbeat.
fn machine() -> (FakeHost, Arc<dyn Host>, Arc<std::sync::Mutex<Effects>>) {
    machine_with(fresh_debian())
}

/// [`machine`] from `h`.
fn machine_with(h: FakeHost) -> (FakeHost, Arc<dyn Host>, Arc<std::sync::Mutex<Effects>>) {
    use gpum_common::agent_state::{AgentState, Connection, DEFAULT_STATE_DIR, state_path};
    let effects = Arc::new(std::sync::Mutex::new(Effects::default()));
    let fx = effects.clone();
    let hook = move |inner: &FakeHost, cmd: &Cmd| {
        let line = cmd.display();
        let apt = line.starts_with("env DEBIAN_FRONTEND=noninteractive apt-get ");
        if !apt && (!line.starts_with("systemctl ") || line.starts_with("systemctl show ")) {
            return;
        }
        // Known to the fake: it answers success.
        let _ = inner.clone().command_ok(&line, "");
        let read = |p: &str| inner.read(Path::new(p)).ok();
        let mut fx = fx.lock().unwrap();
        if apt {
            if let Some(at) = cmd.args.iter().position(|a| a == "install") {
                let packages = cmd.args[at + 1..].iter().filter(|a| !a.starts_with('-') && !a.contains("::"));
                fx.installed.extend(packages.cloned());
            }
            return;
        }
        match cmd.args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["restart" | "reload", "docker"] => {
                fx.docker_runs_with = read("/etc/docker/daemon.json");
                let _ = inner.clone().unix_http(
                    gpum_preflight::facts::DEFAULT_DOCKER_SOCKET,
                    "/_ping",
                    fixture("debian12-docker-ping.http"),
                );
            }
            ["daemon-reload"] => fx.units_loaded = read(gpum_common::agent_state::UNIT_PATH),
            ["enable", "gpum-agent"] => fx.enabled = true,
            ["restart", "gpum-agent"] => {
                fx.agent_runs_with = Some((
                    read("/opt/gpum-agent/gpum-agent").unwrap(),
                    read("/etc/gpum-agent/config.toml").unwrap(),
                ));
                let now = inner.now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
                let st = AgentState {
                    node_id: Some(NODE.into()),
                    connection: Connection::Connected,
                    last_heartbeat_at: Some(now),
                    updated_at: now,
                    ..Default::default()
                };
                let path = state_path(Path::new(DEFAULT_STATE_DIR));
                inner.write_atomic(&path, &serde_json::to_vec(&st).unwrap(), 0o600).unwrap();
            }
            _ => {}
        }
    };
    let host: Arc<dyn Host> = Arc::new(During { inner: h.clone(), env: Vec::new(), hook: Box::new(hook) });
    (h, host, effects)
}

/// Stops the install at one checkpoint, as a crash there would.
struct StopAt(String);

impl Checkpoints for StopAt {
    fn reached(&self, name: &str) -> ControlFlow<()> {
        if name == self.0 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    }
}

/// One run of the installer on `host`, as the binary does it: a new audit of the machine as
/// it is now, then its plan.
fn run_once(
    host: &Arc<dyn Host>,
    o: &Options,
    cps: &dyn Checkpoints,
) -> (Result<Summary, Failure>, Vec<String>) {
    let audit = crate::Audit::run(
        host.as_ref(),
        &t4(),
        &gpum_preflight::GatherOptions {
            offline: true,
            server: Some(o.server.clone()),
            ..Default::default()
        },
        Lang::En,
    );
    assert!(audit.ready(), "{:?}", audit.findings);
    let mut out = Vec::new();
    let f = Offline { agent_runs: true, bad_key: false };
    let r = install(
        host.clone(),
        &audit,
        &f,
        cps,
        o,
        &mut Reporter { out: &mut out, json: false, lang: Lang::En },
    );
    let text = String::from_utf8(out).unwrap();
    if let Err(e) = &r {
        assert!(matches!(e, Failure::Other(m) if m.starts_with("stopped at checkpoint")), "{e:?}: {text}");
    }
    (r, audit.plan.steps.iter().map(Step::checkpoint).collect())
}

/// The file tree a run leaves, less the download directory under `/tmp` (random, and left
/// behind by a real crash) and with the install id (random per machine) checked and masked.
fn tree(h: &FakeHost) -> std::collections::BTreeMap<PathBuf, gpum_host::fake::Node> {
    use gpum_host::fake::Node;
    let mut t = h.tree();
    t.retain(|p, _| !p.starts_with("/tmp/"));
    if let Some(Node::File { data, .. }) = t.get_mut(Path::new(INSTALL_ID)) {
        assert_eq!(data.len(), 33, "{data:?}");
        *data = b"(an install id)".to_vec();
    }
    t
}

/// Crash convergence at unit speed (the test host's `crash-rerun` does it with real kills):
/// for every checkpoint of a fresh machine's full plan, the install stops there and runs again
/// on the same machine; the files (paths, modes, contents) and what the commands did are then
/// those of one uninterrupted run on a fresh machine.
#[test]
fn a_rerun_after_a_stop_at_any_checkpoint_converges_on_the_uninterrupted_install() {
    let o = Options { server: platform(), ..opts() };
    let (h, host, fx) = machine();
    let (r, checkpoints) = run_once(&host, &o, &NoCheckpoints);
    let summary = r.unwrap();
    assert_eq!(summary.node_id, NODE);
    let (want_tree, want_fx) = (tree(&h), fx.lock().unwrap().clone());
    assert!(
        want_fx.agent_runs_with.is_some() && want_fx.enabled && want_fx.docker_runs_with.is_some(),
        "{want_fx:?}"
    );
    assert!(checkpoints.len() >= 10, "the full plan: {checkpoints:?}");
    for cp in &checkpoints {
        let (h, host, fx) = machine();
        let (r, _) = run_once(&host, &o, &StopAt(cp.clone()));
        assert!(r.is_err(), "stopped at {cp}");
        let id_then = h.read(Path::new(INSTALL_ID)).ok();
        let (r, _) = run_once(&host, &o, &NoCheckpoints);
        let again = r.unwrap_or_else(|e| panic!("the re-run after {cp}: {e:?}"));
        assert_eq!(again.node_id, NODE, "after {cp}");
        if let Some(id) = id_then {
            assert_eq!(h.read(Path::new(INSTALL_ID)).unwrap(), id, "after {cp}: the install id is kept");
        }
        assert_eq!(tree(&h), want_tree, "the files after a stop at {cp} and a re-run");
        assert_eq!(*fx.lock().unwrap(), want_fx, "what the commands did after a stop at {cp} and a re-run");
    }
}

/// The summary's `verification` keeps its JSON words: the protocol's names, `running`, or empty
/// before the check step.
#[test]
fn the_summary_names_the_check_as_before() {
    use gpum_protocol::VerificationState;
    let word = |v| {
        serde_json::to_value(Summary { verification: v, ..Default::default() }).unwrap()["verification"]
            .clone()
    };
    assert_eq!(word(None), "");
    assert_eq!(word(Some(GpuCheck::Known(VerificationState::Verified))), "verified");
    assert_eq!(word(Some(GpuCheck::Known(VerificationState::AwaitingCheck))), "awaiting_check");
    assert_eq!(word(Some(GpuCheck::StillRunning)), "running");
}

/// Issue 31: after an install, the same code is told apart from a new one (the hash the
/// registration recorded), and a repair without a code keeps the installed registration: no
/// call to any platform, the config byte for byte as it was, the service restarted, the same
/// server in the summary, and the audit's `existing_install` a pass that says so.
#[test]
fn a_repair_without_a_code_keeps_the_registration_and_calls_no_platform() {
    use gpum_preflight::Registration;
    let o = Options { server: platform(), ..opts() };
    let (h, host, fx) = machine();
    let (r, _) = run_once(&host, &o, &NoCheckpoints);
    assert_eq!(r.unwrap().node_id, NODE);
    let code = gpum_protocol::joincode::JoinCode::parse(o.code.as_deref().unwrap()).unwrap();
    let other = gpum_protocol::joincode::JoinCode::generate();
    let recorded = h.tree().remove(Path::new(JOIN_CODE_HASH));
    assert!(
        matches!(recorded, Some(gpum_host::fake::Node::File { mode: 0o600, .. })),
        "the code's hash, 0600: {recorded:?}"
    );
    assert_eq!(crate::registration(&h, Some(&code), false), Registration::SameCode);
    assert_eq!(crate::registration(&h, Some(&other), false), Registration::NewCode);
    assert_eq!(crate::registration(&h, None, true), Registration::Keep);
    assert_eq!(crate::registration(&h, None, false), Registration::Unknown);
    let node = crate::installed_node(&h).expect("an installed, live agent");
    assert_eq!((node.node_id.as_str(), node.server.as_str()), (NODE, o.server.as_str()));

    let config = h.read(Path::new(gpum_common::agent_state::DEFAULT_CONFIG)).unwrap();
    fx.lock().unwrap().agent_runs_with = None;
    let audit = crate::Audit::with_knobs(
        host.as_ref(),
        &t4(),
        &gpum_preflight::GatherOptions { offline: true, ..Default::default() },
        Lang::En,
        &crate::knobs::Knobs::release(),
        Registration::Keep,
    );
    let existing = audit.findings.iter().find(|f| f.id == gpum_preflight::checks::EXISTING_INSTALL).unwrap();
    assert_eq!(existing.status, gpum_preflight::Status::Pass, "{}", existing.message);
    assert!(existing.message.contains("repairs it in place"), "{}", existing.message);
    assert!(
        audit
            .plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::KeepRegistration { node_id, .. } if node_id == NODE))
    );
    assert!(!audit.plan.steps.iter().any(|s| matches!(s, Step::Register { .. })));
    // No code, and a server where nothing listens: any registration would fail.
    let repair = Options { code: None, server: "http://127.0.0.1:9".into(), ..opts() };
    let mut out = Vec::new();
    let f = Offline { agent_runs: true, bad_key: false };
    let r = install(
        host.clone(),
        &audit,
        &f,
        &NoCheckpoints,
        &repair,
        &mut Reporter { out: &mut out, json: false, lang: Lang::En },
    );
    let out = String::from_utf8(out).unwrap();
    assert_eq!(r.unwrap().node_id, NODE, "{out}");
    assert!(out.contains("server n-crash stays the same"), "{out}");
    assert_eq!(h.read(Path::new(gpum_common::agent_state::DEFAULT_CONFIG)).unwrap(), config);
    let runs = fx.lock().unwrap().agent_runs_with.clone().expect("the service was restarted");
    assert_eq!(runs.1, config, "with the kept config");
}

/// A revoked agent (its server deleted) is nothing to repair: a new code is needed.
#[test]
fn a_revoked_agent_is_not_repaired() {
    use gpum_common::agent_state::{AgentState, Connection, StopReason, Stopped};
    let o = Options { server: platform(), ..opts() };
    let (h, host, _fx) = machine();
    run_once(&host, &o, &NoCheckpoints).0.unwrap();
    assert!(crate::installed_node(&h).is_some());
    let st = AgentState {
        node_id: Some(NODE.into()),
        connection: Connection::Stopped,
        stopped: Some(Stopped { reason: StopReason::Revoked, detail: "node_deleted".into(), at: 1 }),
        ..Default::default()
    };
    let path = gpum_common::agent_state::state_path(Path::new(gpum_common::agent_state::DEFAULT_STATE_DIR));
    h.write_atomic(&path, &serde_json::to_vec(&st).unwrap(), 0o600).unwrap();
    assert!(crate::installed_node(&h).is_none());
}

/// Progress on a terminal (issue 31): only when stderr is a terminal and the output is not
/// `--json` do the apt runs get a status pipe (`-o APT::Status-Fd=N`, the fake's pipe is 3);
/// otherwise the same commands run as always. Whichever way, stdout is the same, byte for byte:
/// the progress is drawn on stderr and cleared before each step's line.
#[test]
fn progress_needs_a_terminal_and_changes_no_byte_of_stdout() {
    const STATUS: &str = "-o APT::Status-Fd=3 ";
    let o = Options { server: platform(), ..opts() };
    let run = |stderr_tty: bool, json: bool| {
        let mut h = fresh_debian();
        h.stderr_tty = stderr_tty;
        let h = h.status_lines(
            &APT_UPDATE.replace("apt-get ", &format!("apt-get {STATUS}")),
            &["dlstatus:1:50.0000:Retrieving file 1 of 2", "dlstatus:2:100.0000:Retrieving file 2 of 2"],
        );
        let (h, host, fx) = machine_with(h);
        let audit = crate::Audit::run(
            host.as_ref(),
            &t4(),
            &gpum_preflight::GatherOptions {
                offline: true,
                server: Some(o.server.clone()),
                ..Default::default()
            },
            Lang::En,
        );
        let mut out = Vec::new();
        let f = Offline { agent_runs: true, bad_key: false };
        let r = install(
            host,
            &audit,
            &f,
            &NoCheckpoints,
            &o,
            &mut Reporter { out: &mut out, json, lang: Lang::En },
        );
        assert_eq!(r.map(|s| s.node_id), Ok(NODE.to_string()));
        let fx = fx.lock().unwrap().clone();
        (String::from_utf8(out).unwrap(), ran(&h), fx)
    };
    let (plain, plain_ran, plain_fx) = run(false, false);
    assert!(plain_ran.iter().any(|c| c.contains("apt-get") && c.ends_with(" update")), "{plain_ran:?}");
    assert!(!plain_ran.iter().any(|c| c.contains("Status-Fd")), "no terminal, no status pipe: {plain_ran:?}");
    // --json on a terminal: the commands and the output of --json anywhere else.
    let (json_tty, json_tty_ran, _) = run(true, true);
    let (json, json_ran, _) = run(false, true);
    assert_eq!(json_tty_ran, plain_ran);
    assert_eq!(json_ran, plain_ran);
    assert_eq!(json_tty, json);
    assert!(json.lines().all(|l| l.starts_with('{')), "{json}");
    // A terminal: apt reports through its status pipe; stdout is unchanged.
    let (tty, tty_ran, tty_fx) = run(true, false);
    assert_eq!(tty, plain);
    assert_eq!(tty_fx, plain_fx, "the same effects");
    let apt: Vec<&String> = tty_ran.iter().filter(|c| c.contains("apt-get")).collect();
    assert_eq!(apt.len(), 2, "{tty_ran:?}");
    assert!(apt.iter().all(|c| c.contains(&format!("apt-get {STATUS}"))), "{apt:?}");
    let without: Vec<String> = tty_ran.iter().map(|c| c.replace(STATUS, "")).collect();
    assert_eq!(without, plain_ran, "the same commands, apt's with its status pipe");
}

/// Docker's and NVIDIA's own sources on a fresh Debian 12 machine, each keyring holding exactly
/// its pinned key: the install adds no source and no key, says so, and leaves both of the
/// owner's files as they were, byte for byte.
fn debian_with_owners_sources() -> FakeHost {
    let nvidia = keys::verify_repo_key(
        gpum_repo_keys::pinned::NVIDIA_TOOLKIT.key_copy,
        &gpum_repo_keys::pinned::NVIDIA_TOOLKIT,
        std::time::SystemTime::now(),
    )
    .unwrap()
    .keyring_bytes();
    fresh_debian()
        .file(
            "/etc/apt/sources.list.d/docker.list",
            "deb [arch=amd64 signed-by=/etc/apt/keyrings/docker.asc] https://download.docker.com/linux/debian bookworm stable\n",
        )
        .file("/etc/apt/keyrings/docker.asc", gpum_repo_keys::pinned::DOCKER_DEBIAN.key_copy)
        .file(
            "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
            "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n",
        )
        .file("/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg", nvidia)
}

const OWNERS_FILES: [&str; 4] = [
    "/etc/apt/sources.list.d/docker.list",
    "/etc/apt/keyrings/docker.asc",
    "/etc/apt/sources.list.d/nvidia-container-toolkit.list",
    "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg",
];

#[test]
fn the_owners_sources_are_used_and_left_byte_identical() {
    let h = debian_with_owners_sources();
    let before: Vec<Vec<u8>> = OWNERS_FILES.iter().map(|p| h.read(Path::new(p)).unwrap()).collect();
    let h = h
        .command(APT_UPDATE, Ok(Output { code: Some(100), stdout: Vec::new(), stderr: b"E: stop".to_vec() }));
    let (r, out) = go(&h, &Offline { agent_runs: true, bad_key: false }, &opts());
    assert_eq!(r.unwrap_err().code(), 30, "{out}");
    assert!(out.contains("repository keys verified against their pinned fingerprints: gpum-docker, gpum-nvidia-container-toolkit"), "{out}");
    assert!(
        out.contains("[skip] 2. use your apt source /etc/apt/sources.list.d/docker.list for gpum-docker")
            && out.contains(
                "[skip] 3. use your apt source /etc/apt/sources.list.d/nvidia-container-toolkit.list"
            ),
        "{out}"
    );
    assert!(out.contains("your source and key are left as they are"), "{out}");
    assert_eq!(ran(&h), [APT_UPDATE], "apt runs with the owner's sources");
    let after: Vec<Vec<u8>> = OWNERS_FILES.iter().map(|p| h.read(Path::new(p)).unwrap()).collect();
    assert_eq!(before, after);
    let apt: Vec<_> = h.writes().into_iter().filter(|p| !p.starts_with("/tmp")).collect();
    assert!(apt.is_empty(), "no source, no key, nothing of the owner's written: {apt:?}");
}

#[test]
fn an_owners_keyring_changed_after_the_audit_stops_before_anything_changes() {
    let h = debian_with_owners_sources();
    let gpu = t4();
    let audit = crate::Audit::run(
        &h,
        &gpu,
        &gpum_preflight::GatherOptions { offline: true, server: Some(opts().server), ..Default::default() },
        Lang::En,
    );
    assert!(audit.ready(), "{:?}", audit.findings);
    // Another key where Docker's was, after the audit (a FakeHost's clones share one machine).
    let after =
        h.clone().file("/etc/apt/keyrings/docker.asc", gpum_repo_keys::pinned::NVIDIA_TOOLKIT.key_copy);
    let host: Arc<dyn Host> = Arc::new(after.clone());
    let mut out = Vec::new();
    let mut rep = Reporter { out: &mut out, json: false, lang: Lang::En };
    let f = install(
        host,
        &audit,
        &Offline { agent_runs: true, bad_key: false },
        &NoCheckpoints,
        &opts(),
        &mut rep,
    )
    .unwrap_err();
    assert_eq!(f.code(), 20, "{}", String::from_utf8_lossy(&out));
    assert!(f.message(Lang::En).contains("/etc/apt/sources.list.d/docker.list"), "{}", f.message(Lang::En));
    assert!(ran(&after).is_empty(), "{:?}", ran(&after));
    let written: Vec<_> = after.writes().into_iter().filter(|p| !p.starts_with("/tmp")).collect();
    assert!(written.is_empty(), "{written:?}");
}
