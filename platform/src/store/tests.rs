//! The store's tests, on the engine `GPUM_TEST_DB` names (`crate::testdb`).

use super::*;
use gpum_protocol::{PROBE_OUTPUT_MAX, ProbeFailure, ProbeReport, VerificationState};

/// A fresh database on the engine of `GPUM_TEST_DB` (`crate::testdb`).
pub(super) fn db() -> (crate::testdb::TestDb, Conn) {
    let t = crate::testdb::TestDb::new();
    let c = t.open();
    (t, c)
}

fn reg(conn: &Conn, now: u64, code: &str, uuid: &str) -> Result<RegisterResponse, ApiError> {
    let mut inventory = Inventory::default();
    inventory.private.gpu_uuids = vec![uuid.into()];
    register(
        conn,
        now,
        &RegisterRequest {
            join_code: code.into(),
            agent_version: "0.1.0".into(),
            inventory,
            install_id: None,
        },
        10,
    )
}

fn reg_id(
    conn: &Conn,
    now: u64,
    code: &str,
    uuid: &str,
    install_id: &str,
) -> Result<RegisterResponse, ApiError> {
    let mut inventory = Inventory::default();
    inventory.private.gpu_uuids = vec![uuid.into()];
    let req = RegisterRequest {
        join_code: code.into(),
        agent_version: "0.1.0".into(),
        inventory,
        install_id: Some(install_id.into()),
    };
    register(conn, now, &req, 10)
}

fn count(c: &Conn, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn migrations_are_idempotent() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p.db");
    drop(open(&p).unwrap());
    let c = open(&p).unwrap();
    let v: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(v as usize, MIGRATIONS.len());
    let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

/// A database made before the settings existed gains them with their defaults.
#[test]
fn the_settings_migration_keeps_existing_nodes() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("p.db");
    {
        let c = rusqlite::Connection::open(&p).unwrap();
        for (i, m) in MIGRATIONS.iter().enumerate().take(3) {
            c.execute_batch(&format!("BEGIN; {m}; PRAGMA user_version = {}; COMMIT;", i + 1)).unwrap();
        }
        let mut inv = Inventory::default();
        inv.private.hostname = "old-box".into();
        c.execute(
            "INSERT INTO nodes (id, token_hash, registered_at, inventory_json) VALUES ('node-old', 'h', 1, ?1)",
            rusqlite::params![serde_json::to_string(&inv).unwrap()],
        )
        .unwrap();
    }
    let c = open(&p).unwrap();
    let n = &list_nodes(&c, 2, &Scope::All).unwrap().nodes[0];
    assert_eq!(
        (n.name.as_str(), n.price_per_gpu_hour, n.min_rental_minutes, n.paused),
        ("old-box", None, 60, false)
    );
}

#[test]
fn settings_change_only_what_is_sent_and_are_checked_first() {
    let (_d, c) = db();
    let code = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
    let mut inventory = Inventory::default();
    inventory.private.hostname = "gpu-box".into();
    let req = RegisterRequest { join_code: code, agent_version: "1".into(), inventory, install_id: None };
    let id = register(&c, 1000, &req, 10).unwrap().node_id;
    let s = node_settings(&c, &id).unwrap();
    assert_eq!(
        (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
        ("gpu-box", None, 60, false)
    );

    let upd = |r: UpdateNodeRequest| update_node(&c, &id, &r, &Scope::All);
    let s = upd(UpdateNodeRequest {
        name: Some(Some("  Rack 3 «A100» ".into())),
        price_per_gpu_hour: Some(Some(1250)),
        min_rental_minutes: Some(120),
        paused: None,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
        ("Rack 3 «A100»", Some(1250), 120, false)
    );
    // Only the field sent changes.
    let s = upd(UpdateNodeRequest { paused: Some(true), ..Default::default() }).unwrap();
    assert_eq!(
        (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
        ("Rack 3 «A100»", Some(1250), 120, true)
    );
    let n = list_nodes(&c, 1001, &Scope::All).unwrap().nodes.remove(0);
    assert_eq!(
        (n.name.as_str(), n.price_per_gpu_hour, n.min_rental_minutes, n.paused),
        ("Rack 3 «A100»", Some(1250), 120, true)
    );

    // Every refusal writes nothing, even of the fields that were good.
    let bad = [
        (
            UpdateNodeRequest { name: Some(Some("".into())), paused: Some(false), ..Default::default() },
            SettingsError::NameLength,
        ),
        (
            UpdateNodeRequest { name: Some(Some("   ".into())), ..Default::default() },
            SettingsError::NameLength,
        ),
        (
            UpdateNodeRequest { name: Some(Some("я".repeat(65))), ..Default::default() },
            SettingsError::NameLength,
        ),
        (
            UpdateNodeRequest { name: Some(Some("a\nb".into())), ..Default::default() },
            SettingsError::NameControl,
        ),
        (
            UpdateNodeRequest { name: Some(Some("a\u{1b}[31m".into())), ..Default::default() },
            SettingsError::NameControl,
        ),
        // Issue 46: bidirectional controls make a name read otherwise than it is written.
        (
            UpdateNodeRequest { name: Some(Some("rig\u{202E}gnp.exe".into())), ..Default::default() },
            SettingsError::NameBidi,
        ),
        (
            UpdateNodeRequest { name: Some(Some("a\u{2067}b\u{2069}".into())), ..Default::default() },
            SettingsError::NameBidi,
        ),
        (
            UpdateNodeRequest { name: Some(Some("a\u{200F}".into())), ..Default::default() },
            SettingsError::NameBidi,
        ),
        (
            UpdateNodeRequest {
                price_per_gpu_hour: Some(Some(0)),
                paused: Some(false),
                ..Default::default()
            },
            SettingsError::Price,
        ),
        (
            UpdateNodeRequest {
                price_per_gpu_hour: Some(Some(MAX_PRICE_PER_GPU_HOUR + 1)),
                ..Default::default()
            },
            SettingsError::Price,
        ),
        (UpdateNodeRequest { min_rental_minutes: Some(0), ..Default::default() }, SettingsError::MinRental),
        (
            UpdateNodeRequest { min_rental_minutes: Some(10_081), paused: Some(false), ..Default::default() },
            SettingsError::MinRental,
        ),
    ];
    for (r, want) in bad {
        assert_eq!(check_update(&r).unwrap_err(), want, "{r:?}");
        let e = upd(r).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert_eq!(e.message, want.message());
    }
    let s = node_settings(&c, &id).unwrap();
    assert_eq!(
        (s.name.as_str(), s.price_per_gpu_hour, s.min_rental_minutes, s.paused),
        ("Rack 3 «A100»", Some(1250), 120, true),
        "nothing was written"
    );
    // The edges are accepted.
    let s = upd(UpdateNodeRequest {
        name: Some(Some("я".repeat(64))),
        price_per_gpu_hour: Some(Some(MAX_PRICE_PER_GPU_HOUR)),
        min_rental_minutes: Some(10_080),
        paused: Some(false),
        ..Default::default()
    })
    .unwrap();
    assert_eq!((s.name.chars().count(), s.min_rental_minutes, s.paused), (64, 10_080, false));
    // null: the host name back, and off rent.
    let s = upd(UpdateNodeRequest { name: Some(None), price_per_gpu_hour: Some(None), ..Default::default() })
        .unwrap();
    assert_eq!((s.name.as_str(), s.price_per_gpu_hour), ("gpu-box", None));
    // Unknown and deleted nodes are 404; deletion forgets the settings.
    upd(UpdateNodeRequest { name: Some(Some("x".into())), ..Default::default() }).unwrap();
    assert_eq!(
        update_node(&c, "node-nope", &UpdateNodeRequest::default(), &Scope::All).unwrap_err().code,
        ErrorCode::NotFound
    );
    delete_node(&c, 1002, &id, &Scope::All).unwrap();
    assert_eq!(upd(UpdateNodeRequest::default()).unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(count(&c, "SELECT COUNT(*) FROM nodes WHERE name IS NOT NULL"), 0);
}

#[test]
fn join_code_lifecycle() {
    let (_d, c) = db();
    let code = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
    let open = open_join_codes(&c, 1000, &Scope::All).unwrap();
    assert_eq!(
        open,
        vec![OpenCode { hash: hash_secret(&code), created_at: 1000, expires_at: 1060, owner: None }]
    );
    assert!(open_join_codes(&c, 1060, &Scope::All).unwrap().is_empty(), "expired: not open");
    let err = |r: Result<RegisterResponse, ApiError>| r.unwrap_err().code;
    assert_eq!(err(reg(&c, 1000, "GPUM-123", "g")), ErrorCode::JoinCodeMalformed);
    assert_eq!(err(reg(&c, 1000, &JoinCode::generate().to_string(), "g")), ErrorCode::JoinCodeUnknown);
    assert_eq!(err(reg(&c, 1060, &code, "g")), ErrorCode::JoinCodeExpired);
    let r = reg(&c, 1059, &code.to_lowercase(), "g").unwrap();
    assert_eq!(r.node_token.len(), 64);
    assert_eq!(err(reg(&c, 1059, &code, "g")), ErrorCode::JoinCodeUsed);
    let code2 = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
    let open = open_join_codes(&c, 1059, &Scope::All).unwrap();
    assert_eq!(
        open.iter().map(|o| o.hash.clone()).collect::<Vec<_>>(),
        [hash_secret(&code2)],
        "used: not open"
    );
    assert_eq!(err(reg(&c, 1001, &code2, "g")), ErrorCode::GpuAlreadyRegistered);
    // The refusal did not consume the code: after deleting the old node it works.
    delete_node(&c, 1002, &r.node_id, &Scope::All).unwrap();
    reg(&c, 1003, &code2, "g").unwrap();
}

/// Two replicas' transactions on one node (issue 35): the second waits for the first's
/// COMMIT on the node's row and then reads what it wrote, so two first heartbeats sent to two
/// replicas at once record one "online" event, not two, and two commands sent at once get
/// their own places in the node's queue. Deterministic: the first transaction is held open
/// while the second is seen waiting.
#[test]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
fn two_transactions_on_one_node_take_turns() {
    let t = crate::testdb::TestDb::on(crate::sql::Engine::Postgres);
    let a = t.open();
    let code = create_join_code(&a, 0, 60, &Scope::All).unwrap().code;
    let r = reg(&a, 0, &code, "g").unwrap();
    let in_turn = |first: &dyn Fn(&Conn), second: Box<dyn FnOnce(&Conn) + Send>| {
        let b = t.open();
        a.begin().unwrap();
        first(&a);
        let other = std::thread::spawn(move || {
            b.begin().unwrap();
            second(&b);
            b.commit().unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!other.is_finished(), "the second transaction waits for the first's row lock");
        a.commit().unwrap();
        other.join().unwrap();
    };
    let beat = |token: String| {
        move |c: &Conn| {
            heartbeat(c, 10, &token, &HeartbeatRequest { seq: 1, ..Default::default() }, 10).unwrap();
        }
    };
    in_turn(&beat(r.node_token.clone()), Box::new(beat(r.node_token.clone())));
    let online =
        format!("SELECT COUNT(*) FROM node_events WHERE kind = '{}'", NodeEventKind::Online.as_str());
    assert_eq!(count(&a, &online), 1);

    let send = |id: String| move |c: &Conn| drop(queue_command(c, 11, &id, "recheck", &Scope::All).unwrap());
    in_turn(&send(r.node_id.clone()), Box::new(send(r.node_id.clone())));
    assert_eq!(count(&a, "SELECT COUNT(DISTINCT seq) FROM commands"), 2);

    // One machine registered twice at once, with two join codes: its GPU is the first's, and
    // the second is refused (its check ran before the first committed).
    let codes = [0, 1].map(|_| create_join_code(&a, 0, 60, &Scope::All).unwrap().code);
    let [first, second] = codes;
    in_turn(
        &|c: &Conn| drop(reg(c, 12, &first, "g2").unwrap()),
        Box::new(move |c: &Conn| {
            assert_eq!(reg(c, 12, &second, "g2").unwrap_err().code, ErrorCode::GpuAlreadyRegistered);
            // What the refused registration wrote goes, as its savepoint would take it.
            c.rollback();
            c.begin().unwrap();
        }),
    );
    assert_eq!(count(&a, "SELECT COUNT(*) FROM node_gpus WHERE uuid = 'g2'"), 1);
    assert_eq!(count(&a, "SELECT COUNT(*) FROM nodes WHERE deleted_at IS NULL"), 2);
}

#[test]
fn heartbeat_commands_revocation() {
    let (_d, c) = db();
    let code = create_join_code(&c, 0, 60, &Scope::All).unwrap().code;
    let r = reg(&c, 0, &code, "g").unwrap();
    let mut hb = HeartbeatRequest { seq: 1, ..Default::default() };
    let a = heartbeat(&c, 1, &r.node_token, &hb, 10).unwrap();
    assert!(a.send_inventory, "hash mismatch asks for the inventory");
    assert_eq!(a.probe_image, None);
    set_probe_image(&c, Some("img:1")).unwrap();
    assert_eq!(heartbeat(&c, 1, &r.node_token, &hb, 10).unwrap().probe_image.as_deref(), Some("img:1"));
    let too_many = HeartbeatRequest {
        seq: 1,
        managed_containers: vec!["c".into(); limits::MAX_MANAGED_CONTAINERS + 1],
        ..Default::default()
    };
    assert_eq!(heartbeat(&c, 1, &r.node_token, &too_many, 10).unwrap_err().code, ErrorCode::InvalidRequest);
    let q = queue_command(&c, 2, &r.node_id, "recheck", &Scope::All).unwrap();
    assert_eq!(
        queue_command(&c, 2, &r.node_id, "format", &Scope::All).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
    hb.seq = 0;
    let a = heartbeat(&c, 2, &r.node_token, &hb, 10).unwrap();
    assert!(a.commands.is_empty(), "a handshake (smoke) never takes a command");
    hb.seq = 2;
    hb.probe = Some(ProbeReport {
        state: VerificationState::Verified,
        reason: None,
        output: "x".repeat(10_000),
        finished_at: 2,
        image: "i".into(),
    });
    let a = heartbeat(&c, 3, &r.node_token, &hb, 10).unwrap();
    assert_eq!(a.commands, vec![gpum_protocol::Command { id: q.id.clone(), kind: "recheck".into() }]);
    let a = heartbeat(&c, 4, &r.node_token, &hb, 10).unwrap();
    assert!(a.commands.is_empty(), "delivered once");
    hb.command_results = vec![CommandResult { id: q.id.clone(), ok: true, message: "done".into() }];
    heartbeat(&c, 5, &r.node_token, &hb, 10).unwrap();
    let n = &list_nodes(&c, 5, &Scope::All).unwrap().nodes[0];
    assert!(n.online);
    assert_eq!(n.verification, VerificationState::Verified);
    assert_eq!(n.last_probe_output.as_ref().unwrap().len(), PROBE_OUTPUT_MAX);
    assert_eq!(n.commands[0].result.as_ref().unwrap().message, "done");
    // When the result and the probe report arrived: what the page judges a command by.
    assert_eq!((n.commands[0].delivered_at, n.commands[0].completed_at), (Some(3), Some(5)));
    assert_eq!(n.last_probe_at, Some(5), "each beat carrying a report");
    assert!(!list_nodes(&c, 5 + OFFLINE_AFTER_SECS, &Scope::All).unwrap().nodes[0].online);
    let late = queue_command(&c, 5 + OFFLINE_AFTER_SECS, &r.node_id, "restart", &Scope::All).unwrap_err();
    assert_eq!((late.code, late.code.http_status()), (ErrorCode::NodeOffline, 409));
    assert_eq!(list_nodes(&c, 5, &Scope::All).unwrap().nodes[0].commands.len(), 1, "nothing queued");

    let new = rotate_token(&c, 6, &r.node_id, &Scope::All).unwrap();
    assert_eq!(heartbeat(&c, 7, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::TokenReplaced);
    heartbeat(&c, 7, &new.node_token, &hb, 10).unwrap();
    assert_eq!(heartbeat(&c, 7, &new_token(), &hb, 10).unwrap_err().code, ErrorCode::Unauthorized);
    delete_node(&c, 8, &r.node_id, &Scope::All).unwrap();
    assert_eq!(heartbeat(&c, 9, &new.node_token, &hb, 10).unwrap_err().code, ErrorCode::NodeDeleted);
    assert_eq!(heartbeat(&c, 9, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::NodeDeleted);
    assert_eq!(
        heartbeat(&c, 9, &new.node_token, &too_many, 10).unwrap_err().code,
        ErrorCode::NodeDeleted,
        "revocation wins over a bad body"
    );
    assert_eq!(delete_node(&c, 9, &r.node_id, &Scope::All).unwrap_err().code, ErrorCode::NotFound);
    assert!(list_nodes(&c, 9, &Scope::All).unwrap().nodes.is_empty());
}

const ID_A: &str = "0123456789abcdef0123456789abcdef";
const ID_B: &str = "fedcba9876543210fedcba9876543210";

#[test]
fn a_repeat_with_the_same_install_id_gets_the_same_node_and_a_new_token() {
    let (_d, c) = db();
    let code = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
    let first = reg_id(&c, 1000, &code, "g", ID_A).unwrap();
    // The same installation again (its answer was lost): same node, fresh token, and the
    // first token is revoked.
    let again = reg_id(&c, 1010, &code, "g", &ID_A.to_uppercase()).unwrap();
    assert_eq!(again.node_id, first.node_id);
    assert_ne!(again.node_token, first.node_token);
    let hb = HeartbeatRequest { seq: 1, ..Default::default() };
    assert_eq!(heartbeat(&c, 1011, &first.node_token, &hb, 10).unwrap_err().code, ErrorCode::TokenReplaced);
    heartbeat(&c, 1011, &again.node_token, &hb, 10).unwrap();
    assert_eq!(list_nodes(&c, 1011, &Scope::All).unwrap().nodes.len(), 1, "exactly one node");
    // Every other reuse stays `join_code_used`: another install id, none, or too late.
    let used = |r: Result<RegisterResponse, ApiError>| r.unwrap_err().code;
    assert_eq!(used(reg_id(&c, 1012, &code, "g", ID_B)), ErrorCode::JoinCodeUsed);
    assert_eq!(used(reg(&c, 1012, &code, "g")), ErrorCode::JoinCodeUsed);
    assert_eq!(used(reg_id(&c, 1060, &code, "g", ID_A)), ErrorCode::JoinCodeUsed, "past the code's lifetime");
    // Nor after the node was deleted.
    delete_node(&c, 1013, &first.node_id, &Scope::All).unwrap();
    assert_eq!(used(reg_id(&c, 1014, &code, "g", ID_A)), ErrorCode::JoinCodeUsed);
    // A code first used without an install id cannot be repeated with one.
    let code2 = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
    reg(&c, 1015, &code2, "h").unwrap();
    assert_eq!(used(reg_id(&c, 1016, &code2, "h", ID_A)), ErrorCode::JoinCodeUsed);
    // A malformed install id is refused before the code is used.
    let code3 = create_join_code(&c, 1000, 60, &Scope::All).unwrap().code;
    for bad in ["", "0123", "g123456789abcdef0123456789abcdef", &format!("{ID_A}0")] {
        assert_eq!(used(reg_id(&c, 1017, &code3, "k", bad)), ErrorCode::InvalidRequest, "{bad:?}");
    }
    reg_id(&c, 1018, &code3, "k", ID_B).unwrap();
    // Only the install id's hash is stored.
    let stored: Vec<String> = c
        .prepare_cached("SELECT install_id_hash FROM join_codes WHERE install_id_hash IS NOT NULL")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(stored, vec![hash_secret(ID_A), hash_secret(ID_B)]);
}

#[test]
fn a_repeat_cannot_take_another_nodes_gpu() {
    let (_d, c) = db();
    let code = create_join_code(&c, 0, 60, &Scope::All).unwrap().code;
    let other = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "theirs").unwrap();
    let mine = reg_id(&c, 0, &code, "mine", ID_A).unwrap();
    assert_eq!(reg_id(&c, 1, &code, "theirs", ID_A).unwrap_err().code, ErrorCode::GpuAlreadyRegistered);
    // The refusal changed nothing: the first token still works.
    heartbeat(&c, 2, &mine.node_token, &HeartbeatRequest { seq: 1, ..Default::default() }, 10).unwrap();
    assert_eq!(
        list_nodes(&c, 2, &Scope::All).unwrap().nodes.iter().filter(|n| n.id == other.node_id).count(),
        1
    );
}

#[test]
fn commands_come_in_bounded_batches_oldest_first() {
    let (_d, c) = db();
    let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
    let n = 2 * limits::MAX_COMMANDS_PER_RESPONSE + 3;
    // Never seen: offline, and refused a command (nothing queued); a handshake brings it
    // online without taking any.
    assert_eq!(
        queue_command(&c, 1, &r.node_id, "recheck", &Scope::All).unwrap_err().code,
        ErrorCode::NodeOffline
    );
    assert_eq!(count(&c, "SELECT COUNT(*) FROM commands"), 0);
    heartbeat(&c, 1, &r.node_token, &HeartbeatRequest::default(), 10).unwrap();
    let queued: Vec<String> =
        (0..n).map(|_| queue_command(&c, 1, &r.node_id, "recheck", &Scope::All).unwrap().id).collect();
    let mut got = Vec::new();
    for seq in 1.. {
        let a = heartbeat(&c, 2, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
        assert!(a.commands.len() <= limits::MAX_COMMANDS_PER_RESPONSE, "{} in one answer", a.commands.len());
        if a.commands.is_empty() {
            break;
        }
        got.extend(a.commands.into_iter().map(|c| c.id));
    }
    assert_eq!(got, queued, "every command once, in order");
    // Results up to the limit are taken; more are refused as a whole.
    let results = |k: usize| HeartbeatRequest {
        seq: 9,
        command_results: got
            .iter()
            .cycle()
            .take(k)
            .map(|id| CommandResult { id: id.clone(), ok: true, message: "m".into() })
            .collect(),
        ..Default::default()
    };
    heartbeat(&c, 3, &r.node_token, &results(limits::MAX_COMMAND_RESULTS), 10).unwrap();
    assert_eq!(
        heartbeat(&c, 3, &r.node_token, &results(limits::MAX_COMMAND_RESULTS + 1), 10).unwrap_err().code,
        ErrorCode::InvalidRequest
    );
}

#[test]
fn histories_stay_bounded_per_node() {
    let (_d, c) = db();
    let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
    let long = "x".repeat(100_000);
    for seq in 1..=50u64 {
        let hb = HeartbeatRequest {
            seq,
            removed_containers: (0..limits::MAX_REMOVED_CONTAINERS)
                .map(|i| RemovedContainer {
                    id: format!("{seq}-{i}"),
                    name: long.clone(),
                    reason: long.clone(),
                })
                .collect(),
            health: Health { docker_error: Some(long.clone()), ..Default::default() },
            ..Default::default()
        };
        heartbeat(&c, seq, &r.node_token, &hb, 10).unwrap();
    }
    assert_eq!(
        count(&c, "SELECT COUNT(*) FROM container_removals") as usize,
        limits::MAX_REMOVED_HISTORY_PER_NODE
    );
    assert!(count(&c, "SELECT MAX(length(name) + length(reason)) FROM container_removals") <= 768);
    assert!(count(&c, "SELECT length(health_json) FROM nodes") < 2 * limits::MAX_TEXT_LEN as i64);
    // The newest records are the ones kept.
    let n = &list_nodes(&c, 51, &Scope::All).unwrap().nodes[0];
    assert_eq!(n.removed_containers.last().unwrap().id, format!("50-{}", limits::MAX_REMOVED_CONTAINERS - 1));
    let over = HeartbeatRequest {
        seq: 51,
        removed_containers: vec![
            RemovedContainer { id: "x".into(), name: "n".into(), reason: "r".into() };
            limits::MAX_REMOVED_CONTAINERS + 1
        ],
        ..Default::default()
    };
    assert_eq!(heartbeat(&c, 51, &r.node_token, &over, 10).unwrap_err().code, ErrorCode::InvalidRequest);

    // Delivered commands too: pending ones always stay.
    for _ in 0..COMMAND_HISTORY_PER_NODE + 40 {
        queue_command(&c, 52, &r.node_id, "recheck", &Scope::All).unwrap();
    }
    for seq in 60..100 {
        heartbeat(&c, 53, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
    }
    assert_eq!(count(&c, "SELECT COUNT(*) FROM commands") as usize, COMMAND_HISTORY_PER_NODE);
    assert_eq!(count(&c, "SELECT COUNT(*) FROM commands WHERE delivered_at IS NULL"), 0);
}

#[test]
fn long_inventory_text_is_cut_but_its_hash_kept() {
    let (_d, c) = db();
    let mut inv = Inventory::default();
    inv.private.gpu_uuids = vec!["g".into()];
    inv.private.hostname = "h".repeat(500_000);
    inv.public.gpus = vec![gpum_protocol::GpuPublic { model: "m".repeat(5000), vram_mib: 1 }];
    let code = create_join_code(&c, 0, 60, &Scope::All).unwrap().code;
    let r = register(
        &c,
        0,
        &RegisterRequest {
            join_code: code,
            agent_version: "v".repeat(5000),
            inventory: inv.clone(),
            install_id: None,
        },
        10,
    )
    .unwrap();
    let n = &list_nodes(&c, 1, &Scope::All).unwrap().nodes[0];
    assert_eq!(n.inventory.private.hostname.len(), limits::MAX_TEXT_LEN);
    assert_eq!(n.inventory.public.gpus[0].model.len(), limits::MAX_TEXT_LEN);
    assert_eq!(n.agent_version.len(), 64);
    // The agent's hash still matches: no endless "send the inventory".
    let hb = HeartbeatRequest { seq: 1, inventory_hash: inv.hash(), ..Default::default() };
    assert!(!heartbeat(&c, 2, &r.node_token, &hb, 10).unwrap().send_inventory);
    inv.public.gpus = vec![gpum_protocol::GpuPublic { model: "m".into(), vram_mib: 1 }; limits::MAX_GPUS + 1];
    let hb =
        HeartbeatRequest { seq: 2, inventory_hash: inv.hash(), inventory: Some(inv), ..Default::default() };
    assert_eq!(heartbeat(&c, 3, &r.node_token, &hb, 10).unwrap_err().code, ErrorCode::InvalidRequest);
}

fn metrics(util: u32) -> Metrics {
    Metrics {
        cpu_load_pct: 12.5,
        ram_used_mib: 1000,
        ram_total_mib: 4000,
        disk_free_gib: 100,
        gpus: vec![gpum_protocol::GpuMetrics {
            index: 0,
            util_pct: util,
            mem_used_mib: 10,
            mem_total_mib: 20,
            temp_c: 50,
            power_w: 70.5,
        }],
    }
}

fn kinds(c: &Conn, id: &str, now: u64) -> Vec<NodeEventKind> {
    node_events(c, id, now, MAX_EVENTS_PER_NODE, &Scope::All)
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

/// A beat every 10 s for two days: one sample per interval at most, none older than a day,
/// a day's worth at most; the samples are what the beats carried.
#[test]
fn samples_are_at_most_one_per_interval_and_a_day_of_them() {
    let (_d, c) = db();
    let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
    let mut beats = 0;
    let mut t = 1000;
    while t <= 1000 + 2 * SAMPLE_WINDOW_SECS {
        let hb = HeartbeatRequest {
            seq: beats + 1,
            metrics: metrics((t / 10 % 100) as u32),
            ..Default::default()
        };
        heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
        beats += 1;
        // The table itself, not only what the read gives back, stays bounded.
        let rows = count(&c, "SELECT COUNT(*) FROM node_samples") as usize;
        assert!(rows <= MAX_SAMPLES_PER_NODE, "{rows} rows at {t}");
        t += 10;
    }
    let now = t - 10;
    let m = node_samples(&c, &r.node_id, now, &Scope::All).unwrap();
    assert_eq!(m.interval_secs, SAMPLE_INTERVAL_SECS);
    assert_eq!(m.samples.len(), (SAMPLE_WINDOW_SECS / SAMPLE_INTERVAL_SECS) as usize, "{beats} beats");
    assert!(m.samples.iter().all(|s| s.at > now - SAMPLE_WINDOW_SECS && s.at <= now));
    for w in m.samples.windows(2) {
        assert!(w[1].at - w[0].at >= SAMPLE_INTERVAL_SECS, "{} then {}", w[0].at, w[1].at);
    }
    let last = m.samples.last().unwrap();
    assert_eq!(last.metrics, metrics((last.at / 10 % 100) as u32), "the figures of that beat");
    // Past a day without beats, nothing is left to show; a deleted node keeps no sample.
    assert!(node_samples(&c, &r.node_id, now + SAMPLE_WINDOW_SECS, &Scope::All).unwrap().samples.is_empty());
    delete_node(&c, now, &r.node_id, &Scope::All).unwrap();
    assert_eq!(count(&c, "SELECT COUNT(*) FROM node_samples"), 0);
    assert_eq!(node_samples(&c, "node-none", now, &Scope::All).unwrap_err().code, ErrorCode::NotFound);
}

/// The hot path's writes, counted by SQLite: a steady beat changes one row (the node's), a
/// beat that takes a sample two (and the day's oldest sample goes), none writes an event.
#[test]
fn a_steady_heartbeat_writes_one_row() {
    let d = crate::testdb::TestDb::on(crate::sql::Engine::Sqlite);
    let c = d.open();
    let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
    let beat = |t: u64, seq: u64| {
        let before = c.sqlite().unwrap().total_changes();
        let hb = HeartbeatRequest { seq, metrics: metrics(5), ..Default::default() };
        heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
        c.sqlite().unwrap().total_changes() - before
    };
    assert_eq!(beat(1, 1), 3, "the first: the node, an online event, a sample");
    for seq in 2..30 {
        assert_eq!(beat(seq, seq), 1, "beat {seq}");
    }
    // A beat every 50 s for a day and more: one in six takes a sample, and once a day of
    // them is kept, each of those also drops the oldest.
    let mut changes = std::collections::BTreeMap::<u64, usize>::new();
    let mut t = 1;
    for seq in 30..(30 + 2 * SAMPLE_WINDOW_SECS / 50) {
        t += 50;
        *changes.entry(beat(t, seq)).or_default() += 1;
    }
    let keys: Vec<u64> = changes.keys().copied().collect();
    assert_eq!(keys, [1, 2, 3], "{changes:?}");
    let sampled = changes[&2] + changes[&3];
    assert_eq!(sampled as u64, 2 * SAMPLE_WINDOW_SECS / SAMPLE_INTERVAL_SECS, "{changes:?}");
    let events = count(&c, "SELECT COUNT(*) FROM node_events");
    assert_eq!(events, 2, "registered and online, nothing more");
}

/// A clock moved back, then forward, never piles samples up past the bound.
#[test]
fn samples_stay_bounded_when_the_clock_jumps() {
    let (_d, c) = db();
    let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
    let mut seq = 1;
    for round in 0..3u64 {
        for i in 0..400u64 {
            let t = 10_000 + round * 7 + i * SAMPLE_INTERVAL_SECS;
            let hb = HeartbeatRequest { seq, metrics: metrics(1), ..Default::default() };
            heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
            seq += 1;
        }
        // Back to the start: no sample until the clock passes the last one again.
        heartbeat(&c, 10_000, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
        seq += 1;
    }
    assert!(count(&c, "SELECT COUNT(*) FROM node_samples") as usize <= MAX_SAMPLES_PER_NODE);
}

/// Each kind of event is recorded once, on its transition, never on a repeated beat; the
/// log is newest first; a deleted node keeps only `deleted`.
#[test]
fn each_event_is_recorded_once_on_its_transition() {
    use NodeEventKind::*;
    let (_d, c) = db();
    let code = create_join_code(&c, 0, 3600, &Scope::All).unwrap().code;
    let r = reg(&c, 100, &code, "g").unwrap();
    let id = r.node_id.clone();
    assert_eq!(kinds(&c, &id, 100), [Registered]);
    let mut seq = 0;
    let mut beat = |t: u64, f: &dyn Fn(&mut HeartbeatRequest)| {
        seq += 1;
        let mut hb = HeartbeatRequest { seq, ..Default::default() };
        f(&mut hb);
        heartbeat(&c, t, &r.node_token, &hb, 10).unwrap();
    };
    // Online at the first beat, and not again while beats keep coming.
    for t in [110, 120, 130] {
        beat(t, &|_| {});
    }
    assert_eq!(kinds(&c, &id, 130), [Online, Registered]);
    // Offline while no beat comes (derived, not stored), then both recorded once it returns.
    let gap_end = 130 + OFFLINE_AFTER_SECS + 50;
    assert_eq!(kinds(&c, &id, gap_end - 1), [Offline, Online, Registered]);
    assert_eq!(count(&c, "SELECT COUNT(*) FROM node_events WHERE kind = 'offline'"), 0);
    beat(gap_end, &|_| {});
    beat(gap_end + 10, &|_| {});
    let ev = node_events(&c, &id, gap_end + 10, 50, &Scope::All).unwrap().events;
    assert_eq!(ev.iter().map(|e| e.kind).collect::<Vec<_>>(), [Online, Offline, Online, Registered]);
    assert_eq!((ev[0].at, ev[1].at), (gap_end, 130), "offline since its last heartbeat");
    // The check: passed once, failed once per reason, passed again.
    let probe =
        |state, reason| ProbeReport { state, reason, output: "o".into(), finished_at: 1, image: "i".into() };
    let t0 = gap_end + 20;
    for (i, (state, reason)) in [
        (VerificationState::Verified, None),
        (VerificationState::Verified, None),
        (VerificationState::Failed, Some(ProbeFailure::Timeout)),
        (VerificationState::Failed, Some(ProbeFailure::Timeout)),
        (VerificationState::Failed, Some(ProbeFailure::NoNvidiaRuntime)),
        (VerificationState::Verified, None),
    ]
    .into_iter()
    .enumerate()
    {
        let p = probe(state, reason);
        beat(t0 + i as u64, &|hb| hb.probe = Some(p.clone()));
    }
    let ev = node_events(&c, &id, t0 + 10, 4, &Scope::All).unwrap().events;
    let got: Vec<_> = ev.iter().map(|e| (e.kind, e.subject.as_str())).collect();
    assert_eq!(
        got,
        [(CheckPassed, ""), (CheckFailed, "no_nvidia_runtime"), (CheckFailed, "timeout"), (CheckPassed, "")]
    );
    // Hardware: a changed inventory once, naming what changed; the same one again, nothing.
    let t1 = t0 + 20;
    let mut inv = Inventory::default();
    inv.private.gpu_uuids = vec!["g".into()];
    inv.public.ram_mib = 64_000;
    inv.private.driver_version = Some("550".into());
    for i in 0..3 {
        let inv = inv.clone();
        beat(t1 + i, &move |hb| {
            hb.inventory_hash = inv.hash();
            hb.inventory = Some(inv.clone());
        });
    }
    let ev = &node_events(&c, &id, t1 + 5, 1, &Scope::All).unwrap().events[0];
    assert_eq!((ev.kind, ev.subject.as_str()), (HardwareChanged, "ram,software"));
    assert_eq!(count(&c, "SELECT COUNT(*) FROM node_events WHERE kind = 'hardware_changed'"), 1);
    // A command: sent, then its result once, however often the agent repeats it.
    let t2 = t1 + 10;
    let q = queue_command(&c, t2, &id, "restart", &Scope::All).unwrap();
    beat(t2 + 1, &|_| {});
    for i in 2..5 {
        let q = q.id.clone();
        beat(t2 + i, &move |hb| {
            hb.command_results =
                vec![CommandResult { id: q.clone(), ok: false, message: "no <docker>".into() }]
        });
    }
    let ev = node_events(&c, &id, t2 + 5, 2, &Scope::All).unwrap().events;
    let got: Vec<_> = ev.iter().map(|e| (e.kind, e.subject.as_str(), e.detail.as_str())).collect();
    assert_eq!(got, [(CommandFailed, "restart", "no <docker>"), (CommandSent, "restart", "")]);
    // Containers removed come from their own history, in time order with the rest.
    let t3 = t2 + 10;
    beat(t3, &|hb| {
        hb.removed_containers =
            vec![RemovedContainer { id: "c1".into(), name: "job-1".into(), reason: "unknown".into() }]
    });
    rotate_token(&c, t3 + 1, &id, &Scope::All).unwrap();
    let ev = node_events(&c, &id, t3 + 1, 2, &Scope::All).unwrap().events;
    let got: Vec<_> = ev.iter().map(|e| (e.kind, e.subject.as_str(), e.detail.as_str())).collect();
    assert_eq!(got, [(TokenReplaced, "", ""), (ContainerRemoved, "job-1", "unknown")]);
    // Times never go up as the log goes down.
    let all = node_events(&c, &id, t3 + 1, MAX_EVENTS_PER_NODE, &Scope::All).unwrap().events;
    assert!(all.windows(2).all(|w| w[0].at >= w[1].at), "{all:?}");
    // Issue 46: offline since the last heartbeat (the token replacement stopped the agent), the
    // `offline` it shows goes in its place by time, under the replacement that caused it.
    let later = t3 + 1 + OFFLINE_AFTER_SECS + 5;
    let all = node_events(&c, &id, later, MAX_EVENTS_PER_NODE, &Scope::All).unwrap().events;
    assert!(all.windows(2).all(|w| w[0].at >= w[1].at), "{all:?}");
    let got: Vec<_> = all.iter().take(3).map(|e| e.kind).collect();
    assert_eq!(got, [TokenReplaced, Offline, ContainerRemoved], "{all:?}");
    let two = node_events(&c, &id, later, 2, &Scope::All).unwrap().events;
    assert_eq!(two.iter().map(|e| e.kind).collect::<Vec<_>>(), [TokenReplaced, Offline]);
    // Deleted: only that remains, and nothing else can be done to it.
    delete_node(&c, t3 + 2, &id, &Scope::All).unwrap();
    assert_eq!(kinds(&c, &id, t3 + 500), [Deleted]);
    assert_eq!(node_events(&c, "node-none", 1, 10, &Scope::All).unwrap_err().code, ErrorCode::NotFound);
}

/// However many transitions a node goes through, its log keeps the newest
/// `MAX_EVENTS_PER_NODE` (and the removals their own bound).
#[test]
fn the_event_log_stays_bounded_per_node() {
    let (_d, c) = db();
    let r = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "g").unwrap();
    let other = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "h").unwrap();
    let mut t = 10;
    for seq in 1..=(MAX_EVENTS_PER_NODE as u64) {
        // A gap before each beat: offline and online, two events each time.
        heartbeat(&c, t, &r.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
        queue_command(&c, t, &r.node_id, "recheck", &Scope::All).unwrap();
        t += OFFLINE_AFTER_SECS + 1;
    }
    let rows = |id: &str| {
        c.query_row("SELECT COUNT(*) FROM node_events WHERE node_id = ?1", params![id], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap()
    };
    assert_eq!(rows(&r.node_id) as usize, MAX_EVENTS_PER_NODE);
    assert_eq!(rows(&other.node_id), 1, "another node's log is its own");
    let ev = node_events(&c, &r.node_id, t, usize::MAX >> 1, &Scope::All).unwrap().events;
    assert_eq!(ev.len(), MAX_EVENTS_PER_NODE + 1, "and the derived offline");
    assert_eq!(ev[1].kind, NodeEventKind::CommandSent, "the newest are kept");
    assert_eq!(node_events(&c, &r.node_id, t, 3, &Scope::All).unwrap().events.len(), 3);
    assert!(node_events(&c, &r.node_id, t, 0, &Scope::All).unwrap().events.is_empty());
}

#[test]
fn a_heartbeat_cannot_take_another_nodes_gpu() {
    let (_d, c) = db();
    let a = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "GPU-a").unwrap();
    let b = reg(&c, 0, &create_join_code(&c, 0, 60, &Scope::All).unwrap().code, "GPU-b").unwrap();
    let beat = |uuids: &[&str], seq: u64| {
        let mut inv = Inventory::default();
        inv.private.gpu_uuids = uuids.iter().map(|u| u.to_string()).collect();
        HeartbeatRequest { seq, inventory_hash: inv.hash(), inventory: Some(inv), ..Default::default() }
    };
    let owner = |uuid: &str| -> Option<String> {
        c.query_row("SELECT node_id FROM node_gpus WHERE uuid = ?1", params![uuid], |r| r.get(0))
            .optional()
            .unwrap()
    };
    let err = heartbeat(&c, 1, &b.node_token, &beat(&["GPU-b", "GPU-a"], 1), 10).unwrap_err();
    assert_eq!(err.code, ErrorCode::GpuAlreadyRegistered);
    assert_eq!(owner("GPU-a"), Some(a.node_id.clone()), "A keeps its GPU");
    assert_eq!(owner("GPU-b"), Some(b.node_id.clone()), "nothing of the refused heartbeat was stored");
    let n = node(&c, 1, &b.node_id, &Scope::All).unwrap();
    assert_eq!(n.last_seq, None);
    // Its own GPUs, a new free one, or one listed twice are fine.
    heartbeat(&c, 2, &b.node_token, &beat(&["GPU-b", "GPU-c", "GPU-c"], 2), 10).unwrap();
    assert_eq!(owner("GPU-c"), Some(b.node_id.clone()));
    // Once A is deleted its GPU is free, for a heartbeat as for a registration.
    delete_node(&c, 3, &a.node_id, &Scope::All).unwrap();
    heartbeat(&c, 4, &b.node_token, &beat(&["GPU-b", "GPU-a"], 3), 10).unwrap();
    assert_eq!(owner("GPU-a"), Some(b.node_id.clone()));
}

/// Registers a node with one GPU at `now` with a fresh code of `scope`.
fn node_at(c: &Conn, now: u64, scope: &Scope, gpu: &str) -> String {
    let code = create_join_code(c, now, 60, scope).unwrap().code;
    reg(c, now, &code, gpu).unwrap().node_id
}

/// What one node's lookup costs, in statements.
fn lookup_cost(c: &Conn, now: u64, id: &str) -> u64 {
    let before = crate::sql::statements_run();
    node(c, now, id, &Scope::All).unwrap();
    crate::sql::statements_run() - before
}

// Issue 44, item 4: reading one node ran `list_nodes` (1 + 2N statements) and kept one.
#[test]
fn one_node_costs_the_same_with_1_and_200_nodes() {
    let (_t, c) = db();
    let first = node_at(&c, 1, &Scope::All, "GPU-0");
    let alone = lookup_cost(&c, 2, &first);
    for i in 1..200 {
        node_at(&c, 1 + i, &Scope::All, &format!("GPU-{i}"));
    }
    assert_eq!(list_nodes(&c, 300, &Scope::All).unwrap().nodes.len(), 200);
    let among_200 = lookup_cost(&c, 300, &first);
    assert_eq!(alone, among_200, "one node's lookup must not grow with the number of nodes");
    assert!(
        among_200 <= 7,
        "the row, its removals, its commands, the check image, its reliability's transitions, its \
         rentals' GPUs and its maintenance windows (issue 46): {among_200}"
    );
    // A page costs what its own nodes cost, not what the platform holds.
    let page = Page { limit: 10, after: None };
    let before = crate::sql::statements_run();
    assert_eq!(list_nodes_page(&c, 300, &Scope::All, &page).unwrap().nodes.len(), 10);
    assert!(crate::sql::statements_run() - before <= 2 + 5 * 10);
}

#[test]
fn one_node_reads_as_the_list_shows_it_and_only_within_its_scope() {
    let (_t, c) = db();
    let (a, _, _) = crate::accounts::invite(&c, 1, "a@example.org").unwrap();
    let (b, _, _) = crate::accounts::invite(&c, 1, "b@example.org").unwrap();
    let mine = node_at(&c, 2, &Scope::Owner(a.id.clone()), "GPU-a");
    let theirs = node_at(&c, 2, &Scope::Owner(b.id.clone()), "GPU-b");
    let listed = list_nodes(&c, 4, &Scope::All).unwrap().nodes;
    for n in &listed {
        assert_eq!(&node(&c, 4, &n.id, &Scope::All).unwrap(), n, "the same row mapping");
    }
    let scope_a = Scope::Owner(a.id.clone());
    assert_eq!(node(&c, 4, &mine, &scope_a).unwrap().id, mine);
    let not_found = |id: &str, scope: &Scope| node(&c, 4, id, scope).unwrap_err().code;
    assert_eq!(not_found(&theirs, &scope_a), ErrorCode::NotFound, "another owner's");
    assert_eq!(not_found("n_none", &Scope::All), ErrorCode::NotFound, "none");
    delete_node(&c, 5, &mine, &Scope::All).unwrap();
    assert_eq!(not_found(&mine, &scope_a), ErrorCode::NotFound, "deleted");
    assert_eq!(not_found(&mine, &Scope::All), ErrorCode::NotFound, "deleted, for the operator too");
    // An owner's pages hold their own servers only.
    let page = list_nodes_page(&c, 6, &Scope::Owner(b.id.clone()), &Page::default()).unwrap();
    assert_eq!(page.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), [theirs.as_str()]);
    assert_eq!(page.next, None);
}

#[test]
fn pages_hold_every_node_exactly_once_and_a_deleted_nodes_cursor_still_works() {
    let (_t, c) = db();
    // Seven nodes, several registered in the same second (the id breaks the tie).
    let mut ids: Vec<String> = [1, 1, 1, 2, 2, 3, 3]
        .iter()
        .enumerate()
        .map(|(i, at)| node_at(&c, *at, &Scope::All, &format!("GPU-{i}")))
        .collect();
    let all: Vec<String> = list_nodes(&c, 9, &Scope::All).unwrap().nodes.into_iter().map(|n| n.id).collect();
    ids.sort();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(sorted, ids);
    let mut seen = Vec::new();
    let mut page = Page { limit: 3, after: None };
    let mut sizes = Vec::new();
    loop {
        let got = list_nodes_page(&c, 9, &Scope::All, &page).unwrap();
        sizes.push(got.nodes.len());
        seen.extend(got.nodes.into_iter().map(|n| n.id));
        match got.next {
            Some(next) => page.after = Some(Cursor::parse(&next).unwrap()),
            None => break,
        }
    }
    assert_eq!(seen, all, "every node once, in registration order");
    assert_eq!(sizes, [3, 3, 1]);
    // A page that ends exactly at the last node says there is no next one.
    let six = list_nodes_page(&c, 9, &Scope::All, &Page { limit: 7, after: None }).unwrap();
    assert_eq!((six.nodes.len(), six.next), (7, None));
    // The cursor of the first page, whose last node is then deleted, still gives the rest.
    let first = list_nodes_page(&c, 9, &Scope::All, &Page { limit: 3, after: None }).unwrap();
    let cursor = Cursor::parse(first.next.as_deref().unwrap()).unwrap();
    delete_node(&c, 10, &all[2], &Scope::All).unwrap();
    let rest = list_nodes_page(&c, 11, &Scope::All, &Page { limit: 500, after: Some(cursor) }).unwrap();
    assert_eq!(rest.nodes.into_iter().map(|n| n.id).collect::<Vec<_>>(), all[3..]);
    // Limits and cursors are checked.
    assert_eq!(Page::parse(None, None).unwrap(), Page { limit: DEFAULT_PAGE_LIMIT, after: None });
    assert_eq!(Page::parse(Some("500"), None).unwrap().limit, MAX_PAGE_LIMIT);
    for bad in ["0", "501", "-1", "ten", ""] {
        assert_eq!(Page::parse(Some(bad), None).unwrap_err().code, ErrorCode::InvalidRequest, "{bad:?}");
    }
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    for bad in ["%%%".to_owned(), b64("no-colon"), b64("x:n_1"), b64("5:"), String::new()] {
        assert_eq!(Page::parse(None, Some(&bad)).unwrap_err().code, ErrorCode::InvalidRequest, "{bad:?}");
    }
}

// A page is found through an index in its order, not by sorting every node (SQLite's plan;
// PostgreSQL has the same indexes, `schema::tests` proves the schemas equal).
#[test]
fn a_page_walks_an_index_and_sorts_nothing() {
    let d = tempfile::tempdir().unwrap();
    let c = open(&d.path().join("p.db")).unwrap();
    let plan = |sql: &str| -> String {
        let s = c.sqlite().unwrap();
        let mut st = s.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let unbound = vec![rusqlite::types::Null; st.parameter_count()];
        let rows = st.query_map(rusqlite::params_from_iter(unbound), |r| r.get::<_, String>(3)).unwrap();
        rows.map(|r| r.unwrap()).collect::<Vec<_>>().join("\n")
    };
    let all = plan(PAGE_ALL);
    assert!(all.contains("nodes_live_by_registration") && !all.contains("TEMP B-TREE"), "{all}");
    let owned = plan(PAGE_OWNED);
    assert!(owned.contains("nodes_owner_by_registration") && !owned.contains("TEMP B-TREE"), "{owned}");
}

/// Issue 46: maintenance windows are checked by the core's rules before anything is written,
/// bounded per server (windows that are over are pruned, not counted), listed with the server
/// until they are over, kept within the owner's scope, and deleted with the server.
#[test]
fn maintenance_windows_are_checked_bounded_scoped_and_go_with_the_node() {
    use gpum_platform_core::maintenance::WindowError;
    use gpum_protocol::CreateMaintenanceRequest as Req;
    let (_t, c) = db();
    let (a, _, _) = crate::accounts::invite(&c, 1, "a@example.org").unwrap();
    let (b, _, _) = crate::accounts::invite(&c, 1, "b@example.org").unwrap();
    let (mine, theirs) = (Scope::Owner(a.id.clone()), Scope::Owner(b.id.clone()));
    let id = node_at(&c, 2, &mine, "GPU-m");
    let rows = |c: &Conn| -> i64 {
        c.query_row("SELECT COUNT(*) FROM maintenance WHERE node_id = ?1", params![id], |r| r.get(0)).unwrap()
    };

    let w = add_maintenance(&c, 10, &id, &Req { starts_at: 100, ends_at: 200 }, &mine).unwrap().unwrap();
    assert!(w.id.starts_with("mw-") && w.created_at == 10, "{w:?}");
    assert_eq!(
        add_maintenance(&c, 10, &id, &Req { starts_at: 200, ends_at: 100 }, &mine).unwrap(),
        Err(WindowError::EndNotAfterStart)
    );
    assert_eq!(
        add_maintenance(&c, 10, &id, &Req { starts_at: 1, ends_at: 10 }, &mine).unwrap(),
        Err(WindowError::EndPassed)
    );
    let not_found = |e: ApiError| e.code;
    assert_eq!(
        not_found(add_maintenance(&c, 10, &id, &Req { starts_at: 1, ends_at: 99 }, &theirs).unwrap_err()),
        ErrorCode::NotFound,
        "another owner's server"
    );
    assert_eq!(rows(&c), 1, "a refusal writes nothing");
    // Listed with the server (and on its own) until it is over.
    assert_eq!(node(&c, 150, &id, &Scope::All).unwrap().maintenance, std::slice::from_ref(&w));
    assert_eq!(maintenance_windows(&c, 199, &id, &mine).unwrap().windows, std::slice::from_ref(&w));
    assert!(node(&c, 200, &id, &Scope::All).unwrap().maintenance.is_empty());
    assert_eq!(not_found(maintenance_windows(&c, 10, &id, &theirs).unwrap_err()), ErrorCode::NotFound);

    // The bound counts the windows not over: at 150 the first is one of them, at 200 it is pruned.
    let limit = limits::MAX_MAINTENANCE_WINDOWS_PER_NODE as u64;
    for i in 1..limit {
        add_maintenance(&c, 150, &id, &Req { starts_at: 1000 + i, ends_at: 2000 + i }, &mine)
            .unwrap()
            .unwrap();
    }
    let one_more = Req { starts_at: 5000, ends_at: 6000 };
    assert_eq!(add_maintenance(&c, 150, &id, &one_more, &mine).unwrap(), Err(WindowError::TooMany));
    let e: ApiError = WindowError::TooMany.into();
    assert_eq!(e.code, ErrorCode::OwnerLimitReached);
    assert!(add_maintenance(&c, 200, &id, &one_more, &mine).unwrap().is_ok(), "the first is over");
    assert_eq!(rows(&c), limit as i64);

    // Deleted one by one within the owner's scope; the rest with the server.
    let first = maintenance_windows(&c, 200, &id, &mine).unwrap().windows[0].id.clone();
    assert_eq!(not_found(delete_maintenance(&c, &id, &first, &theirs).unwrap_err()), ErrorCode::NotFound);
    assert_eq!(not_found(delete_maintenance(&c, &id, "mw-none", &mine).unwrap_err()), ErrorCode::NotFound);
    delete_maintenance(&c, &id, &first, &mine).unwrap();
    assert_eq!(rows(&c), limit as i64 - 1);
    delete_node(&c, 300, &id, &mine).unwrap();
    assert_eq!(rows(&c), 0);
}

/// Issue 46, alerts: a sweep opens one incident however many replicas sweep, each notice is
/// claimed by one claim only, and the end is owed on the channels the opening was told on.
#[test]
fn an_incident_opens_once_and_each_notice_is_claimed_once() {
    use gpum_protocol::{AlertChannel, AlertDelivery, AlertKind, AlertSettings, AlertState};
    let (_t, c) = db();
    let (a, _, _) = crate::accounts::invite(&c, 1, "a@example.org").unwrap();
    let scope = Scope::Owner(a.id.clone());
    let code = create_join_code(&c, 10, 60, &scope).unwrap().code;
    let node = reg(&c, 10, &code, "GPU-a").unwrap();
    let beat = |now: u64, seq: u64| {
        heartbeat(&c, now, &node.node_token, &HeartbeatRequest { seq, ..Default::default() }, 10).unwrap();
    };
    beat(100, 1);
    let both = Channels { email: true, webhook: true };
    // Settings without an address open nothing.
    set_alert_settings(&c, &a.id, &AlertSettings { offline_minutes: 5, ..Default::default() }, 50).unwrap();
    assert_eq!(sweep_owners(&c, 1000, "", 100, both).unwrap(), None);
    let incidents = |c: &Conn| count(c, "SELECT COUNT(*) FROM alert_incidents");
    assert_eq!(incidents(&c), 0);
    let settings = AlertSettings {
        email: Some("a@example.org".into()),
        webhook_url: Some("https://hooks.example.com/gpum".into()),
        offline_minutes: 5,
        kinds: AlertKind::ALL.to_vec(),
        language: "ru".into(),
    };
    set_alert_settings(&c, &a.id, &settings, 60).unwrap();
    assert_eq!(alert_settings(&c, &a.id).unwrap(), Some(settings));
    sweep_owners(&c, 399, "", 100, both).unwrap();
    assert_eq!(incidents(&c), 0, "silent for 299 s of the 300");
    // Two replicas sweep at the same time: one incident, two notices.
    sweep_owners(&c, 400, "", 100, both).unwrap();
    sweep_owners(&c, 400, "", 100, both).unwrap();
    assert_eq!(incidents(&c), 1);
    assert_eq!(count(&c, "SELECT COUNT(*) FROM alert_notices"), 2);
    let first = claim_notices(&c, 401, 100).unwrap();
    assert_eq!(first.len(), 2);
    assert!(claim_notices(&c, 401, 100).unwrap().is_empty(), "claimed once");
    let n = &first[0];
    assert_eq!(
        (n.kind, n.state, n.node_id.as_str(), n.lang),
        (AlertKind::Offline, AlertState::Opened, node.node_id.as_str(), gpum_common::Lang::Ru)
    );
    for n in &first {
        let (d, e) = match n.channel {
            AlertChannel::Email => (AlertDelivery::Delivered, None),
            AlertChannel::Webhook => (AlertDelivery::Failed, Some("the webhook answered 500")),
        };
        record_delivery(&c, n, d, e).unwrap();
    }
    // Back: the end is owed on both channels, once.
    beat(500, 2);
    sweep_owners(&c, 500, "", 100, both).unwrap();
    sweep_owners(&c, 501, "", 100, Channels { email: true, webhook: false }).unwrap();
    let ended = claim_notices(&c, 502, 100).unwrap();
    assert_eq!(
        ended.iter().map(|n| (n.state, n.channel)).collect::<Vec<_>>(),
        [(AlertState::Closed, AlertChannel::Email), (AlertState::Closed, AlertChannel::Webhook)]
    );
    assert_eq!(count(&c, "SELECT COUNT(*) FROM alert_incidents WHERE closed_at = 500"), 1);
    let recent = recent_notices(&c, &a.id, RECENT_NOTICES).unwrap();
    assert_eq!(recent.len(), 4);
    assert!(recent.iter().any(
        |n| n.delivery == AlertDelivery::Failed && n.error.as_deref() == Some("the webhook answered 500")
    ));
    assert_eq!(recent.iter().filter(|n| n.delivery == AlertDelivery::Pending).count(), 2);
    // A deleted server's open incident ends with it.
    beat(600, 3);
    sweep_owners(&c, 1000, "", 100, both).unwrap();
    assert_eq!(count(&c, "SELECT COUNT(*) FROM alert_incidents WHERE closed_at IS NULL"), 1);
    crate::store::delete_node(&c, 2000, &node.node_id, &Scope::All).unwrap();
    sweep_owners(&c, 2000, "", 100, both).unwrap();
    assert_eq!(count(&c, "SELECT COUNT(*) FROM alert_incidents WHERE closed_at IS NULL"), 0);
    // Kept 90 days after they end, then gone with their notices.
    sweep_owners(&c, 2000 + ALERT_RETENTION_SECS, "", 100, both).unwrap();
    assert_eq!(count(&c, "SELECT COUNT(*) FROM alert_incidents"), 1, "the one that ended at 2000");
    sweep_owners(&c, 2001 + ALERT_RETENTION_SECS, "", 100, both).unwrap();
    assert_eq!(
        count(&c, "SELECT COUNT(*) FROM alert_incidents") + count(&c, "SELECT COUNT(*) FROM alert_notices"),
        0
    );
}
