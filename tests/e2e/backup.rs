//! `gpum-platform backup` and the restore that docs/operator-guide.md describes, end to end:
//! the real platform over real HTTPS on loopback, the real agent, a backup taken while the
//! server serves the agent's heartbeats, and a fresh platform started on the restored file.
//! `backup` copies a SQLite file, so these run on SQLite whatever `GPUM_TEST_DB` says.
#![allow(clippy::disallowed_methods)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpum_protocol::{ErrorBody, ErrorCode, Inventory, PATH_REGISTER, RegisterRequest};
use gpum_tests::platform::{PlatformOpts, TestPlatform, wait_until};

/// A platform on SQLite, the engine `backup` copies.
fn start_on_sqlite() -> TestPlatform {
    let db = gpum_platform::testdb::TestDb::on(gpum_platform::sql::Engine::Sqlite);
    TestPlatform::start_on(PlatformOpts::default(), std::sync::Arc::new(db))
}
use gpum_tests::{agent_cmd, bin, run_with_stdin, text};

const MISSING_DOCKER: &str = "/nonexistent/gpum-e2e/docker.sock";
const PROBE: &str = "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The agent's token, read with its own config parser.
fn token(state: &Path) -> String {
    let t = std::fs::read_to_string(state.join("config.toml")).unwrap();
    gpum_enroll::config::Config::parse(&t, "config.toml").expect("config").token.expose().to_string()
}

/// Points the agent at another platform (URL and CA), keeping its node id and token.
fn configure(state: &Path, node: &str, p: &TestPlatform) {
    let ca = p.ca_path().expect("TLS");
    let out = run_with_stdin(
        agent_cmd(&[
            "configure",
            "--state",
            s(state),
            "--server",
            p.url(),
            "--node-id",
            node,
            "--ca-file",
            s(&ca),
        ]),
        &format!("{}\n", token(state)),
    );
    assert!(out.status.success(), "configure: {}", text(&out));
}

/// One authenticated heartbeat by the real agent: exit 0 when the platform accepted its token.
fn smoke(state: &Path) -> Output {
    agent_cmd(&["smoke", "--state", s(state)]).output().unwrap()
}

/// `POST /api/v1/agent/register` with `code`: the status and, for an error, its code.
async fn register(p: &TestPlatform, code: &str, gpu: &str) -> (u16, Option<ErrorCode>) {
    let mut inv = Inventory::default();
    inv.private.gpu_uuids = vec![gpu.to_owned()];
    let req = RegisterRequest {
        join_code: code.into(),
        agent_version: "0.1.0".into(),
        inventory: inv,
        install_id: None,
    };
    let r = p
        .http_client()
        .post(format!("{}{PATH_REGISTER}", p.url()))
        .json(&req)
        .send()
        .await
        .expect("register");
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    (status, serde_json::from_str::<ErrorBody>(&body).ok().map(|b| b.error.code))
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

struct Running(Child);
impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_backup_taken_while_serving_restores_nodes_tokens_and_join_codes() {
    let mut a = start_on_sqlite();
    let state = tempfile::tempdir().unwrap();
    let used = a.join_code();
    let ca = a.ca_path().unwrap();
    let out = run_with_stdin(
        agent_cmd(&[
            "register",
            "--state",
            s(state.path()),
            "--server",
            a.url(),
            "--docker-socket",
            MISSING_DOCKER,
            "--ca-file",
            s(&ca),
        ]),
        &format!("{used}\n"),
    );
    assert!(out.status.success(), "register: {}", text(&out));
    let host = gpum_host::RealHost::new();
    let node = gpum_common::agent_state::read(&host, state.path()).unwrap().unwrap().node_id.unwrap();
    let unused = a.join_code();
    a.set_probe_image(PROBE);

    // The agent's service beats every second while the backup is taken.
    let agent = Running(
        agent_cmd(&["run", "--state", s(state.path())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(Duration::from_secs(20), "the node's heartbeats", || {
        a.node(&node).is_some_and(|n| n.last_seq.unwrap_or(0) >= 2)
    });
    let dir = tempfile::tempdir().unwrap();
    let bk = dir.path().join("platform.backup.db");
    let out = a.cli(["--json", "backup", "--to", s(&bk)]);
    assert!(out.status.success(), "backup: {}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["path"], s(&bk));
    assert_eq!(v["bytes"].as_u64(), Some(std::fs::metadata(&bk).unwrap().len()));
    assert_eq!(mode(&bk), 0o600, "the backup holds token hashes");
    assert!(!dir.path().join("platform.backup.db-wal").exists(), "a backup is one file");
    // The server went on serving during and after the backup.
    let seq = a.node(&node).unwrap().last_seq.unwrap_or(0);
    wait_until(Duration::from_secs(20), "heartbeats after the backup", || {
        a.node(&node).is_some_and(|n| n.last_seq.unwrap_or(0) > seq)
    });
    drop(agent);
    // What happens after the backup is not in it.
    let late = a.join_code();
    assert!(a.terminate(Duration::from_secs(10)), "the platform stops on SIGTERM");

    // A refusal leaves the existing file as it was.
    let again = a.cli(["backup", "--to", s(&bk)]);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("never overwritten"), "{}", text(&again));
    assert_eq!(mode(&bk), 0o600);

    // Restore into a fresh platform, as the operator's guide says: stop, replace the file,
    // remove -wal and -shm, start.
    let mut b = start_on_sqlite();
    assert!(b.node(&node).is_none(), "a fresh platform");
    assert!(b.terminate(Duration::from_secs(10)));
    let db = b.db_path();
    for ext in ["", "-wal", "-shm"] {
        let f = PathBuf::from(format!("{}{ext}", db.display()));
        if f.exists() {
            std::fs::remove_file(&f).unwrap();
        }
    }
    std::fs::copy(&bk, &db).unwrap();
    b.restart();

    let n = b.node(&node).expect("the node survived");
    assert_eq!(n.id, node);
    assert_eq!(b.cli_json(&["probe-image", "show"])["image"], PROBE, "the settings survived");
    // Its token: the agent's heartbeat is accepted.
    configure(state.path(), &node, &b);
    let out = smoke(state.path());
    assert_eq!(out.status.code(), Some(0), "the restored platform accepts the agent's token: {}", text(&out));
    // The join codes: the used one stays used, the unused one still works, the later one never was.
    assert_eq!(register(&b, &used, "GPU-backup-1").await, (403, Some(ErrorCode::JoinCodeUsed)));
    assert_eq!(register(&b, &late, "GPU-backup-2").await, (403, Some(ErrorCode::JoinCodeUnknown)));
    assert_eq!(register(&b, &unused, "GPU-backup-3").await.0, 201);
    assert_eq!(b.nodes().nodes.len(), 2);
}

#[test]
fn a_backup_of_a_missing_database_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (db, bk) = (dir.path().join("nope.db"), dir.path().join("copy.db"));
    let out =
        Command::new(bin("gpum-platform")).args(["--db", s(&db), "backup", "--to", s(&bk)]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!db.exists() && !bk.exists(), "neither the database nor a copy was created");
}
