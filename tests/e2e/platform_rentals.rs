//! Issue 33: rentals, the platform's side. The real server over real HTTP on loopback and the
//! real CLI against its database and clock: a rental created through the admin API and through
//! the CLI, checked before anything is written; the agent's heartbeat answer carries it; a
//! report moves its state; stop and expiry (the test clock) take it out of the answer; the CLI's
//! human output escapes what it prints.

use gpum_protocol::{
    CreateRentalRequest, EnvVar, GpuPublic, Health, HeartbeatRequest, HeartbeatResponse, Inventory,
    NodeEvents, NvmlState, PATH_ADMIN_NODES, PATH_ADMIN_RENTAL_REGISTRIES, PATH_ADMIN_RENTALS, ProbeReport,
    RegisterRequest, RegisterResponse, RentalList, RentalRegistries, RentalReport, RentalState,
    RentalSummary, VerificationState, path_admin_node_events, path_admin_rental, path_admin_rental_stop,
};
use gpum_protocol::{MaintenanceWindow, MaintenanceWindows, NodeSummary, path_owner_node_maintenance};
use gpum_tests::owner::OwnerSession;
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::StatusCode;

use super::{Ans, Api};

const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn rental_inventory(tag: &str) -> Inventory {
    let mut inv = Inventory::default();
    inv.public.cpu_model = "Test CPU".into();
    inv.public.cpu_cores = 16;
    inv.public.ram_mib = 65_536;
    inv.public.disk_gib = 500;
    inv.public.gpus = vec![GpuPublic { model: "Tesla T4".into(), vram_mib: 15_360 }; 2];
    inv.private.hostname = "owner-box".into();
    inv.private.gpu_uuids = vec![format!("GPU-{tag}-0"), format!("GPU-{tag}-1")];
    inv
}

fn rental_beat(seq: u64, tag: &str, rentals: Vec<RentalReport>) -> HeartbeatRequest {
    HeartbeatRequest {
        seq,
        inventory_hash: rental_inventory(tag).hash(),
        health: Health { docker_ok: true, nvml: NvmlState::Ok, ..Default::default() },
        rentals,
        ..Default::default()
    }
}

/// A node that is rentable: registered, beating with NVML working, its check passed, priced.
async fn rentable_node(p: &TestPlatform, api: &Api, tag: &str) -> RegisterResponse {
    rentable_node_with(p, api, tag, &p.join_code()).await
}

/// [`rentable_node`], registered with `code` (an owner's, for one).
async fn rentable_node_with(p: &TestPlatform, api: &Api, tag: &str, code: &str) -> RegisterResponse {
    let req = RegisterRequest {
        join_code: code.to_owned(),
        agent_version: "0.1.0".into(),
        inventory: rental_inventory(tag),
        install_id: None,
    };
    let reg: RegisterResponse = api.post(gpum_protocol::PATH_REGISTER, None, &req).await.ok();
    let mut hb = rental_beat(1, tag, vec![]);
    hb.probe = Some(ProbeReport {
        state: VerificationState::Verified,
        reason: None,
        output: "ok".into(),
        finished_at: 1,
        image: String::new(),
    });
    let _: HeartbeatResponse = api.heartbeat(&reg.node_token, &hb).await.ok();
    p.cli_json(&["nodes", "set", &reg.node_id, "--price", "1.50"]);
    assert_eq!(p.node(&reg.node_id).unwrap().rentable.state.as_str(), "rentable");
    reg
}

fn request(node_id: &str) -> CreateRentalRequest {
    CreateRentalRequest {
        node_id: node_id.into(),
        image: format!("nvcr.io/nvidia/pytorch@sha256:{H}"),
        gpus: Some(1),
        cpu_millis: 4000,
        memory_mib: 16_384,
        disk_gib: 50,
        shm_mib: 1024,
        env: vec![EnvVar { name: "EPOCHS".into(), value: "3".into() }],
        command: vec!["python".into(), "train.py".into()],
        duration_secs: Some(2 * 3600),
        ..Default::default()
    }
}

async fn admin_get(p: &TestPlatform, api: &Api, path: &str) -> Ans {
    api.send(api.c.get(format!("{}{path}", p.url())).bearer_auth(p.admin_token())).await
}

/// Created through the admin API (checked first: a refused request writes nothing), carried by
/// the heartbeat answer, moved by the agent's reports, stopped: the next answer no longer
/// carries it, and the event log shows each step once.
#[tokio::test]
async fn a_rental_is_created_carried_reported_and_stopped_over_http() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let node = rentable_node(&p, &api, "a").await;
    let admin = Some(p.admin_token());

    // Refusals, each with the protocol's error shape, and nothing written.
    let mut bad = request(&node.node_id);
    bad.env.push(EnvVar { name: "NVIDIA_VISIBLE_DEVICES".into(), value: "all".into() });
    let a = api.post(PATH_ADMIN_RENTALS, admin, &bad).await;
    assert_eq!(a.code(), gpum_protocol::ErrorCode::InvalidRequest);
    assert!(a.body["error"]["message"].as_str().unwrap().contains("NVIDIA_VISIBLE_DEVICES"), "{}", a.body);
    let mut bad = request(&node.node_id);
    bad.image = "nvcr.io/nvidia/pytorch:latest".into();
    assert_eq!(
        api.post(PATH_ADMIN_RENTALS, admin, &bad).await.code(),
        gpum_protocol::ErrorCode::InvalidRequest
    );
    let mut three = request(&node.node_id);
    three.gpus = Some(3);
    assert_eq!(
        api.post(PATH_ADMIN_RENTALS, admin, &three).await.code(),
        gpum_protocol::ErrorCode::GpusUnavailable
    );
    let unknown = api.post_raw(PATH_ADMIN_RENTALS, admin, r#"{"node_id":"x","surprise":1}"#).await;
    assert_eq!(unknown.code(), gpum_protocol::ErrorCode::InvalidJson);
    assert_eq!(
        api.post(PATH_ADMIN_RENTALS, None, &request(&node.node_id)).await.status,
        StatusCode::UNAUTHORIZED
    );
    let none: RentalList = admin_get(&p, &api, PATH_ADMIN_RENTALS).await.ok();
    assert!(none.rentals.is_empty());

    // The registries are the platform's setting: nvcr.io off the list, the image is refused.
    let put = |body: &'static str| {
        let url = format!("{}{PATH_ADMIN_RENTAL_REGISTRIES}", p.url());
        api.send(
            api.c.put(url).bearer_auth(p.admin_token()).header("content-type", "application/json").body(body),
        )
    };
    let set: RentalRegistries =
        put(r#"{"registries":["GHCR.io","ghcr.io","registry.example.com:5000"]}"#).await.ok();
    assert_eq!(set.registries, ["ghcr.io", "registry.example.com:5000"]);
    let a = api.post(PATH_ADMIN_RENTALS, admin, &request(&node.node_id)).await;
    assert_eq!(a.code(), gpum_protocol::ErrorCode::InvalidRequest);
    assert!(a.body["error"]["message"].as_str().unwrap().contains("registry nvcr.io"), "{}", a.body);
    assert_eq!(
        put(r#"{"registries":["not a host"]}"#).await.code(),
        gpum_protocol::ErrorCode::InvalidRequest
    );
    let back: RentalRegistries = put(r#"{"registries":null}"#).await.ok();
    assert_eq!(back.registries, ["docker.io", "nvcr.io", "ghcr.io"]);
    let shown: RentalRegistries = admin_get(&p, &api, PATH_ADMIN_RENTAL_REGISTRIES).await.ok();
    assert_eq!(shown, back);

    // Created.
    let a = api.post(PATH_ADMIN_RENTALS, admin, &request(&node.node_id)).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let r: RentalSummary = a.ok();
    assert_eq!((r.state, r.listed, r.spec.gpu_uuids.len()), (None, true, 1));
    assert!(r.spec.id.starts_with("rent-"));

    // The agent's next answer carries it, whole.
    let hb: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(2, "a", vec![])).await.ok();
    assert_eq!(hb.rentals, std::slice::from_ref(&r.spec));

    // Reports move its state; a report for an id that is not this node's changes nothing.
    let rep = |state, exit_code| RentalReport { id: r.spec.id.clone(), state, exit_code, reason: None };
    let stranger = RentalReport {
        id: "rent-0000000000000000".into(),
        state: RentalState::Failed,
        exit_code: None,
        reason: None,
    };
    let _: HeartbeatResponse = api
        .heartbeat(&node.node_token, &rental_beat(3, "a", vec![rep(RentalState::Running, None), stranger]))
        .await
        .ok();
    let shown: RentalSummary = admin_get(&p, &api, &path_admin_rental(&r.spec.id)).await.ok();
    assert_eq!(shown.state, Some(RentalState::Running));
    assert_eq!(
        admin_get(&p, &api, &path_admin_rental("rent-0000000000000000")).await.code(),
        gpum_protocol::ErrorCode::NotFound
    );

    // Listed by node; another node's list is empty.
    let by_node: RentalList =
        admin_get(&p, &api, &format!("{PATH_ADMIN_RENTALS}?node={}", node.node_id)).await.ok();
    assert_eq!(by_node.rentals.len(), 1);
    let other: RentalList = admin_get(&p, &api, &format!("{PATH_ADMIN_RENTALS}?node=node-x")).await.ok();
    assert!(other.rentals.is_empty());

    // Stopped: the next answer no longer carries it; the agent reports it going, then gone.
    let stopped: RentalSummary = api.post_raw(&path_admin_rental_stop(&r.spec.id), admin, "").await.ok();
    assert!(!stopped.listed && stopped.stopped_at.is_some());
    let hb: HeartbeatResponse = api
        .heartbeat(&node.node_token, &rental_beat(4, "a", vec![rep(RentalState::Stopping, None)]))
        .await
        .ok();
    assert!(hb.rentals.is_empty());
    let _: HeartbeatResponse =
        api.heartbeat(&node.node_token, &rental_beat(5, "a", vec![rep(RentalState::Gone, None)])).await.ok();
    let shown: RentalSummary = admin_get(&p, &api, &path_admin_rental(&r.spec.id)).await.ok();
    assert_eq!(shown.state, Some(RentalState::Gone));

    let ev: NodeEvents = admin_get(&p, &api, &path_admin_node_events(&node.node_id)).await.ok();
    let kinds: Vec<&str> =
        ev.events.iter().rev().map(|e| e.kind.as_str()).filter(|k| k.starts_with("rental_")).collect();
    assert_eq!(kinds, ["rental_created", "rental_started", "rental_stopped", "rental_gone"]);
}

/// The CLI creates, lists, shows and stops, in JSON and for a terminal; a rental expires at its
/// end (the test clock) and the answer stops carrying it; deleting the node ends the rest.
#[tokio::test]
async fn the_cli_creates_and_stops_and_expiry_ends_a_rental() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let node = rentable_node(&p, &api, "b").await;
    let id = node.node_id.as_str();
    let image = format!("nvcr.io/nvidia/pytorch@sha256:{H}");
    let base = [
        "rentals",
        "create",
        "--node",
        id,
        "--image",
        &image,
        "--cpu-millis",
        "2000",
        "--memory-mib",
        "8192",
        "--disk-gib",
        "20",
        "--shm-mib",
        "512",
    ];
    let with = |more: &[&str]| -> Vec<String> { base.iter().chain(more).map(|s| s.to_string()).collect() };

    // The registries from the CLI: a rental from a registry off the list is refused.
    let set = p.cli_json(&["rental-registries", "set", "ghcr.io"]);
    assert_eq!(set["registries"], serde_json::json!(["ghcr.io"]));
    let out = p.cli(with(&["--gpus", "1", "--duration", "2h"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("registry nvcr.io is not one"));
    let out = p.cli(["rental-registries", "show"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ghcr.io");
    let reset = p.cli_json(&["rental-registries", "reset"]);
    assert_eq!(reset["registries"], serde_json::json!(["docker.io", "nvcr.io", "ghcr.io"]));

    // Refused with the error body and exit 1, nothing written.
    let out =
        p.cli(["--json"].iter().map(|s| s.to_string()).chain(with(&["--gpus", "1", "--duration", "10m"])));
    assert_eq!(out.status.code(), Some(1));
    let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("minimum rental time"));

    let short = with(&["--gpu", "GPU-b-1", "--duration", "2h", "--env", "A=1", "--", "sleep", "infinity"]);
    let short: RentalSummary =
        serde_json::from_value(p.cli_json(&short.iter().map(String::as_str).collect::<Vec<_>>())).unwrap();
    assert_eq!(short.spec.gpu_uuids, ["GPU-b-1"]);
    assert_eq!(short.spec.command, ["sleep", "infinity"]);
    let long = with(&["--gpus", "1", "--duration", "5h"]);
    let long: RentalSummary =
        serde_json::from_value(p.cli_json(&long.iter().map(String::as_str).collect::<Vec<_>>())).unwrap();
    assert_eq!(long.spec.gpu_uuids, ["GPU-b-0"]);
    // No GPU is left.
    let out = p.cli(with(&["--gpus", "1", "--duration", "5h"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpus_unavailable"));

    let hb: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(2, "b", vec![])).await.ok();
    assert_eq!(hb.rentals, [short.spec.clone(), long.spec.clone()]);

    // The terminal table.
    let out = p.cli(["rentals", "list", "--node", id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.starts_with("ID "), "{text}");
    assert!(text.contains(&short.spec.id) && text.contains("pending"), "{text}");
    // What an agent reported is escaped on a terminal.
    let rep = RentalReport {
        id: short.spec.id.clone(),
        state: RentalState::Failed,
        exit_code: None,
        reason: Some("bad\x1b[2Jthing".into()),
    };
    let _: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(3, "b", vec![rep])).await.ok();
    let out = p.cli(["rentals", "show", &short.spec.id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains('\x1b') && text.contains("failed"), "{text:?}");

    // Expiry: at its end the answer no longer carries it.
    let hb: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(4, "b", vec![])).await.ok();
    assert_eq!(hb.rentals, std::slice::from_ref(&long.spec));
    p.advance_clock(5 * 3600);
    let hb: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(5, "b", vec![])).await.ok();
    assert!(hb.rentals.is_empty());
    let shown: RentalSummary =
        serde_json::from_value(p.cli_json(&["rentals", "show", &long.spec.id])).unwrap();
    assert!(!shown.listed && shown.stopped_at.is_none());

    // A stop by the CLI, then the node deleted: its rentals end with the reason recorded.
    let third = with(&["--gpus", "1", "--duration", "2h"]);
    let third: RentalSummary =
        serde_json::from_value(p.cli_json(&third.iter().map(String::as_str).collect::<Vec<_>>())).unwrap();
    let fourth = with(&["--gpus", "1", "--duration", "2h"]);
    let fourth: RentalSummary =
        serde_json::from_value(p.cli_json(&fourth.iter().map(String::as_str).collect::<Vec<_>>())).unwrap();
    let stopped: RentalSummary =
        serde_json::from_value(p.cli_json(&["rentals", "stop", &third.spec.id])).unwrap();
    assert!(stopped.stopped_at.is_some());
    p.delete_node(id);
    let gone: RentalSummary =
        serde_json::from_value(p.cli_json(&["rentals", "show", &fourth.spec.id])).unwrap();
    assert_eq!((gone.listed, gone.reason.as_deref()), (false, Some("node deleted")));
    let all: RentalList = serde_json::from_value(p.cli_json(&["rentals", "list"])).unwrap();
    assert_eq!(all.rentals.len(), 4);
}

/// Issue 43, item 13: after `owners disable`, the operator's list still said `rentable` for the
/// owner's priced server, the admin API created a rental on it (201), and a join code the
/// owner had not used yet registered a new server (201). Now the verdict says why not (since
/// when), a rental is refused with that reason, the owner's open codes register nothing (nor
/// enroll), and the operator cannot make the disabled owner a new one. Enabled again, the
/// server is rentable; the codes stay refused (a disable ends them, as it ends invitations).
#[tokio::test]
async fn a_disabled_owners_servers_are_off_offer_and_their_codes_refused() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let admin = Some(p.admin_token());
    p.invite_owner("eve@example.com");
    let node = rentable_node_with(&p, &api, "eve", &p.owner_join_code("eve@example.com")).await;
    let unused = p.owner_join_code("eve@example.com");
    let bound = p.owner_join_code("eve@example.com");
    let enrolled = api
        .post(
            gpum_protocol::PATH_ENROLL,
            None,
            &gpum_protocol::EnrollRequest {
                join_code: bound.clone(),
                install_id: "0123456789abcdef0123456789abcde2".into(),
            },
        )
        .await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.body);

    p.advance_clock(7);
    p.cli_json(&["owners", "disable", "eve@example.com"]);
    assert_eq!(p.cli_json(&["owners", "list"])["owners"][0]["disabled"], true);

    // The verdict, in JSON, for a terminal and in the admin API.
    let n = p.node(&node.node_id).unwrap();
    assert_eq!(n.rentable.state.as_str(), "owner_disabled");
    assert!(n.rentable.since.is_some(), "since the owner was disabled");
    let human = p.cli(["nodes", "list"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("owner_disabled") && !human.contains(" rentable "), "{human}");
    let listed = admin_get(&p, &api, PATH_ADMIN_NODES).await;
    assert_eq!(listed.body["nodes"][0]["rentable"]["state"], "owner_disabled", "{}", listed.body);

    // No rental is placed on it, through the API or the CLI.
    let a = api.post(PATH_ADMIN_RENTALS, admin, &request(&node.node_id)).await;
    assert_eq!(a.code(), gpum_protocol::ErrorCode::NodeNotRentable, "{}", a.body);
    assert!(a.body["error"]["message"].as_str().unwrap().contains("owner_disabled"), "{}", a.body);
    let image = format!("nvcr.io/nvidia/pytorch@sha256:{H}");
    let o = p.cli([
        "rentals",
        "create",
        "--node",
        &node.node_id,
        "--image",
        &image,
        "--gpus",
        "1",
        "--cpu-millis",
        "1000",
        "--memory-mib",
        "1024",
        "--disk-gib",
        "1",
        "--shm-mib",
        "64",
        "--duration",
        "2h",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("owner_disabled"), "{o:?}");
    let none: RentalList = admin_get(&p, &api, PATH_ADMIN_RENTALS).await.ok();
    assert!(none.rentals.is_empty());

    // The owner's open codes register nothing, whether bound to an install or not.
    for (code, install_id) in
        [(&unused, None), (&bound, Some("0123456789abcdef0123456789abcde2".to_string()))]
    {
        let req = RegisterRequest {
            join_code: code.clone(),
            agent_version: "0.1.0".into(),
            inventory: rental_inventory("eve-new"),
            install_id,
        };
        let a = api.post(gpum_protocol::PATH_REGISTER, None, &req).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
        assert_eq!(a.code(), gpum_protocol::ErrorCode::JoinCodeExpired, "{}", a.body);
    }
    let a = api
        .post(
            gpum_protocol::PATH_ENROLL,
            None,
            &gpum_protocol::EnrollRequest {
                join_code: unused.clone(),
                install_id: "0123456789abcdef0123456789abcde3".into(),
            },
        )
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    assert_eq!(p.nodes().nodes.len(), 1, "nothing new was registered");
    // Nor does the operator make the disabled owner a new code.
    let o = p.cli(["join-code", "create", "--owner", "eve@example.com"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("disabled"), "{o:?}");

    // Enabled again: the server is rentable; the codes a disable ended stay ended.
    p.cli_json(&["owners", "enable", "eve@example.com"]);
    let hb: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(2, "eve", vec![])).await.ok();
    assert!(hb.rentals.is_empty());
    assert_eq!(p.node(&node.node_id).unwrap().rentable.state.as_str(), "rentable");
    let req = RegisterRequest {
        join_code: unused.clone(),
        agent_version: "0.1.0".into(),
        inventory: rental_inventory("eve-new"),
        install_id: None,
    };
    assert_eq!(
        api.post(gpum_protocol::PATH_REGISTER, None, &req).await.code(),
        gpum_protocol::ErrorCode::JoinCodeExpired
    );
    let created: RentalSummary = api.post(PATH_ADMIN_RENTALS, admin, &request(&node.node_id)).await.ok();
    assert!(created.listed);
}

/// Issue 46, scheduled maintenance, over HTTP: the owner plans a window through the owner API
/// (a bad one refused in the API's error shape, nothing written); the operator's list, the
/// marketplace's, shows it; a rental that would overlap it is refused naming it, one that ends
/// at its start is placed; inside it the verdict is `maintenance` and nothing is placed;
/// deleted, the server is rentable again.
#[tokio::test]
async fn a_maintenance_window_refuses_the_rentals_that_would_overlap_it() {
    /// 2026-12-06 23:50:00 UTC.
    const T0: u64 = 1_796_601_000;
    const HOUR: u64 = 3600;
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let admin = Some(p.admin_token());
    p.set_clock(T0);
    let owner = OwnerSession::accept(&p, &p.invite_owner("mo@example.com"), "a long enough password").await;
    let key = owner.create_api_key("maintenance").await;
    let node = rentable_node_with(&p, &api, "mo", &p.owner_join_code("mo@example.com")).await;
    let path = path_owner_node_maintenance(&node.node_id);
    let plan = |body: String| api.post_raw(&path, Some(&key), body);

    // Refused with why, nothing written.
    for (body, code, field) in [
        (
            format!(r#"{{"starts_at":{},"ends_at":{}}}"#, T0 + 5 * HOUR, T0 + 3 * HOUR),
            "invalid_request",
            "ends_at",
        ),
        (
            format!(r#"{{"starts_at":{T0},"ends_at":{}}}"#, T0 + 400 * 24 * HOUR),
            "invalid_request",
            "366 days",
        ),
        (format!(r#"{{"starts_at":{},"ends_at":{}}}"#, T0 - 100, T0 - 1), "invalid_request", "future"),
        (r#"{"starts_at":1,"ends_at":2,"why":"x"}"#.to_owned(), "invalid_json", "why"),
    ] {
        let a = plan(body.clone()).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}: {}", a.body);
        assert_eq!(a.body["error"]["code"], code, "{body}: {}", a.body);
        assert!(a.body["error"]["message"].as_str().unwrap().contains(field), "{body}: {}", a.body);
    }
    let w: MaintenanceWindow =
        plan(format!(r#"{{"starts_at":{},"ends_at":{}}}"#, T0 + 3 * HOUR, T0 + 5 * HOUR)).await.ok();
    let owner_get = |path: String| api.send(api.c.get(format!("{}{path}", p.url())).bearer_auth(&key));
    let listed: MaintenanceWindows = owner_get(path.clone()).await.ok();
    assert_eq!(listed.windows, std::slice::from_ref(&w));
    // The operator's list of servers carries it.
    let all = admin_get(&p, &api, PATH_ADMIN_NODES).await;
    assert_eq!(all.body["nodes"][0]["maintenance"][0]["id"], w.id.as_str(), "{}", all.body);
    assert_eq!(all.body["nodes"][0]["rentable"]["state"], "rentable", "not yet in it");

    // A rental that would overlap it is refused, naming it; one that ends at its start is placed.
    let mut four_hours = request(&node.node_id);
    four_hours.duration_secs = Some(4 * HOUR);
    let a = api.post(PATH_ADMIN_RENTALS, admin, &four_hours).await;
    assert_eq!(a.code(), gpum_protocol::ErrorCode::NodeNotRentable, "{}", a.body);
    let why = a.body["error"]["message"].as_str().unwrap();
    assert!(why.contains(&w.id) && why.contains("2026-12-07T02:50:00Z"), "{why}");
    let mut three_hours = request(&node.node_id);
    three_hours.duration_secs = Some(3 * HOUR);
    let placed: RentalSummary = api.post(PATH_ADMIN_RENTALS, admin, &three_hours).await.ok();
    assert_eq!(placed.spec.ends_at, w.starts_at);

    // Inside the window (the agent still beating): the verdict says so, and nothing is placed.
    p.set_clock(T0 + 3 * HOUR + 600);
    let _: HeartbeatResponse = api.heartbeat(&node.node_token, &rental_beat(2, "mo", vec![])).await.ok();
    let n: NodeSummary =
        owner_get(format!("{}/{}", gpum_protocol::PATH_OWNER_NODES, node.node_id)).await.ok();
    assert_eq!((n.rentable.state.as_str(), n.rentable.since), ("maintenance", Some(w.starts_at)));
    let mut one_hour = request(&node.node_id);
    one_hour.duration_secs = Some(HOUR);
    let a = api.post(PATH_ADMIN_RENTALS, admin, &one_hour).await;
    assert_eq!(a.code(), gpum_protocol::ErrorCode::NodeNotRentable, "{}", a.body);
    assert!(a.body["error"]["message"].as_str().unwrap().contains(&w.id), "{}", a.body);

    // Deleted: the windows left are none, and the server is rentable again.
    let left: MaintenanceWindows =
        api.send(api.c.delete(format!("{}{path}/{}", p.url(), w.id)).bearer_auth(&key)).await.ok();
    assert!(left.windows.is_empty());
    let gone = api.send(api.c.delete(format!("{}{path}/{}", p.url(), w.id)).bearer_auth(&key)).await;
    assert_eq!(gone.code(), gpum_protocol::ErrorCode::NotFound);
    assert_eq!(p.node(&node.node_id).unwrap().rentable.state.as_str(), "rentable");
    let _: RentalSummary = api.post(PATH_ADMIN_RENTALS, admin, &one_hour).await.ok();
}
