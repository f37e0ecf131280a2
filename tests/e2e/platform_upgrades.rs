//! Issue 47: signed in-place agent upgrades, the platform's side. The real server over real HTTP
//! and the real CLI against its database: a dist signed with a throwaway OpenPGP key (the same
//! signing code as `cargo xtask sign`) is added, one whose files disagree is refused; a rollout
//! at 100 % offers the version in the heartbeat's answer, only to servers whose owner and agent
//! allow automatic upgrades; the release's files download with the node's token, byte for
//! byte, and not without it; a rolled-back report halts the rollout, and the admin API, the CLI
//! and the owner's server page say why.

use std::path::Path;

use gpum_protocol::upgrade::{RELEASE_FILES, release_file_path};
use gpum_protocol::{
    HaltReason, HeartbeatRequest, HeartbeatResponse, NodeSettings, PATH_ADMIN_RELEASES, RegisterResponse,
    ReleaseList, RolloutState, RolloutSummary, UpgradeOutcome, UpgradeReport,
};
use gpum_repo_keys::release::signing::{sign_detached, sign_release, throwaway_key};
use gpum_tests::owner::{OwnerSession, text_of};
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::StatusCode;
use sha2::{Digest, Sha256};

use super::{Api, inventory};

const NEXT: &str = "0.2.0";

/// A signed dist of `version` in `dir`: gpum-agent, manifest.json(+sig) and release.json(+sig),
/// each signature a real detached OpenPGP signature by a throwaway release key.
fn signed_dist(dir: &Path, version: &str, agent: &[u8]) {
    let (cert, _, _) = throwaway_key();
    let (manifest, manifest_sig) = sign_release(&cert, &[("gpum-agent", version, agent)]);
    let expires =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 30 * 86_400;
    let release = serde_json::to_vec(&serde_json::json!({
        "format": 1,
        "version": version,
        "expires": expires,
        "manifest_sha256": hex::encode(Sha256::digest(&manifest)),
    }))
    .unwrap();
    let release_sig = sign_detached(&cert, &release);
    std::fs::create_dir_all(dir).unwrap();
    for (name, data) in [
        ("gpum-agent", agent),
        ("manifest.json", &manifest[..]),
        ("manifest.json.sig", &manifest_sig[..]),
        ("release.json", &release[..]),
        ("release.json.sig", &release_sig[..]),
    ] {
        std::fs::write(dir.join(name), data).unwrap();
    }
}

fn beat(seq: u64, uuid: &str, auto_update: bool) -> HeartbeatRequest {
    HeartbeatRequest {
        seq,
        inventory_hash: inventory(uuid).hash(),
        agent_version: Some("0.1.0".into()),
        auto_update: Some(auto_update),
        ..Default::default()
    }
}

async fn offer(api: &Api, token: &str, req: &HeartbeatRequest) -> Option<String> {
    let r: HeartbeatResponse = api.heartbeat(token, req).await.ok();
    r.upgrade.map(|o| o.version)
}

async fn admin(
    api: &Api,
    p: &TestPlatform,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (StatusCode, serde_json::Value) {
    let url = format!("{}{path}", api.url);
    let rb = match method {
        "GET" => api.c.get(url),
        "POST" => api.c.post(url),
        "PATCH" => api.c.patch(url),
        m => panic!("{m}"),
    };
    let rb = rb.bearer_auth(p.admin_token());
    let rb = match body {
        Some(b) => rb.json(&b),
        None => rb,
    };
    let r = rb.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn a_rollout_is_offered_served_and_halted_by_a_rollback() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let dir = tempfile::tempdir().unwrap();
    let agent = b"\x7fELF the next agent, version 0.2.0".repeat(1000);

    // A dist whose agent is not the manifest's is refused, with what differs; nothing is added.
    let bad = dir.path().join("bad");
    signed_dist(&bad, NEXT, &agent);
    std::fs::write(bad.join("gpum-agent"), b"\x7fELF someone else's agent").unwrap();
    let out = p.cli(["releases", "add", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("manifest.json says"), "{err}");
    // So is one whose release.json names another manifest (mix and match).
    let mixed = dir.path().join("mixed");
    signed_dist(&mixed, NEXT, &agent);
    std::fs::write(mixed.join("manifest.json"), b"{\"format\":1,\"artifacts\":[]}\n").unwrap();
    let out = p.cli(["releases", "add", mixed.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not of one release"));
    assert_eq!(p.cli_json(&["releases", "list"])["releases"], serde_json::json!([]));

    let good = dir.path().join("good");
    signed_dist(&good, NEXT, &agent);
    let added = p.cli_json(&["releases", "add", good.to_str().unwrap()]);
    assert_eq!(added["version"], NEXT);
    assert_eq!(added["agent_size"], agent.len());
    // Twice is refused.
    assert!(!p.cli(["releases", "add", good.to_str().unwrap()]).status.success());

    // An owner's server, and the operator's own.
    let owner = OwnerSession::accept(&p, &p.invite_owner("upgrades@example.org"), "upgrades password").await;
    let a: RegisterResponse = api.register(&p.owner_join_code("upgrades@example.org"), "GPU-a").await.ok();
    let b: RegisterResponse = api.register(&p.join_code(), "GPU-b").await.ok();
    assert_eq!(offer(&api, &a.node_token, &beat(1, "GPU-a", true)).await, None, "no rollout yet");

    let r: RolloutSummary =
        serde_json::from_value(p.cli_json(&["releases", "rollout", NEXT, "--percent", "100"])).unwrap();
    assert_eq!((r.state, r.percent, r.max_failure_percent), (RolloutState::Active, 100, 20));
    assert_eq!(offer(&api, &a.node_token, &beat(2, "GPU-a", true)).await.as_deref(), Some(NEXT));
    assert_eq!(p.node(&a.node_id).unwrap().upgrades.pending.as_deref(), Some(NEXT));
    let page = owner.get(&format!("/dashboard/servers/{}", a.node_id)).await;
    assert!(text_of(&page.body, "upgrade-pending").unwrap().contains(NEXT), "{}", page.body);

    // The owner's switch (the admin API, the owner's API and the cabinet's form) and the
    // agent's hold the offer back.
    let (s, v) = admin(
        &api,
        &p,
        "PATCH",
        &gpum_protocol::path_admin_node(&b.node_id),
        Some(serde_json::json!({"auto_update": false})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(!serde_json::from_value::<NodeSettings>(v).unwrap().auto_update);
    assert_eq!(offer(&api, &b.node_token, &beat(1, "GPU-b", true)).await, None, "the switch is off");
    let (s, _) = admin(
        &api,
        &p,
        "PATCH",
        &gpum_protocol::path_admin_node(&b.node_id),
        Some(serde_json::json!({"auto_update": true})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(offer(&api, &b.node_token, &beat(2, "GPU-b", true)).await.as_deref(), Some(NEXT));
    assert_eq!(offer(&api, &b.node_token, &beat(3, "GPU-b", false)).await, None, "the agent's config is off");
    assert_eq!(p.node(&b.node_id).unwrap().upgrades.agent_auto_update, Some(false));
    let key = owner.create_api_key("upgrades").await;
    let r = api
        .c
        .patch(format!("{}{}/{}", api.url, gpum_protocol::PATH_OWNER_NODES, a.node_id))
        .bearer_auth(&key)
        .json(&serde_json::json!({"auto_update": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(offer(&api, &a.node_token, &beat(3, "GPU-a", true)).await, None);
    let form = owner
        .post(&format!("/dashboard/servers/{}/auto-update", a.node_id), &[("auto_update", "true")])
        .await;
    assert_eq!(form.status, StatusCode::SEE_OTHER, "{}", form.body);
    assert!(p.node(&a.node_id).unwrap().upgrades.auto_update);
    assert_eq!(offer(&api, &a.node_token, &beat(4, "GPU-a", true)).await.as_deref(), Some(NEXT));

    // The release's files, byte for byte, with the node's token; not without it; nothing else.
    for name in RELEASE_FILES {
        let url = format!("{}{}", api.url, release_file_path(NEXT, name));
        let r = api.c.get(&url).bearer_auth(&a.node_token).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        assert_eq!(r.bytes().await.unwrap().as_ref(), std::fs::read(good.join(name)).unwrap(), "{name}");
        let r = api.c.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{name} without a token");
        let r = api.c.get(&url).bearer_auth("not-a-token").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{name} with a wrong token");
    }
    for path in [release_file_path(NEXT, "gpum-install"), release_file_path("0.9.9", "gpum-agent")] {
        let r = api.c.get(format!("{}{path}", api.url)).bearer_auth(&a.node_token).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
    }

    // The new version did not come up: the agent reports the rollback (again, until accepted:
    // recorded once), and one failure of one report is more than 20 %: the rollout halts.
    let report = UpgradeReport {
        from: "0.1.0".into(),
        to: NEXT.into(),
        outcome: UpgradeOutcome::RolledBack,
        detail: "no heartbeat within 120 s".into(),
        at: 1_800_000_000,
    };
    for seq in [5, 6] {
        let req = HeartbeatRequest { upgrade: Some(report.clone()), ..beat(seq, "GPU-a", true) };
        assert_eq!(offer(&api, &a.node_token, &req).await, None);
    }
    let (s, v) = admin(&api, &p, "GET", PATH_ADMIN_RELEASES, None).await;
    assert_eq!(s, StatusCode::OK);
    let list: ReleaseList = serde_json::from_value(v).unwrap();
    let r = list.releases[0].rollout.clone().expect("the rollout");
    assert_eq!(
        (r.state, r.halt_reason, r.failed, r.reported),
        (RolloutState::Halted, Some(HaltReason::Failures), 1, 1)
    );
    let human = String::from_utf8_lossy(&p.cli(["releases", "list"]).stdout).into_owned();
    assert!(human.contains("halted") && human.contains("1 of 1 servers"), "{human}");
    assert_eq!(offer(&api, &b.node_token, &beat(4, "GPU-b", true)).await, None, "halted: offered to none");
    let n = p.node(&a.node_id).unwrap();
    assert_eq!(n.upgrades.last.as_ref().map(|l| l.outcome), Some(UpgradeOutcome::RolledBack));
    assert_eq!(n.upgrades.pending, None);
    let page = owner.get(&format!("/dashboard/servers/{}", a.node_id)).await;
    assert!(text_of(&page.body, "rollout-halted").unwrap().contains("1 of 1"), "{}", page.body);
    assert!(page.body.contains("did not get in touch"), "{}", page.body);

    // Resumed by the operator: offered again, but never to the server that rolled it back.
    let (s, v) = admin(&api, &p, "POST", &format!("{PATH_ADMIN_RELEASES}/resume"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(offer(&api, &b.node_token, &beat(5, "GPU-b", true)).await.as_deref(), Some(NEXT));
    assert_eq!(offer(&api, &a.node_token, &beat(7, "GPU-a", true)).await, None);
    // An action that does not apply is refused; halt and pause by the API.
    let (s, _) = admin(&api, &p, "POST", &format!("{PATH_ADMIN_RELEASES}/resume"), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, v) = admin(&api, &p, "POST", &format!("{PATH_ADMIN_RELEASES}/halt"), None).await;
    assert_eq!((s, v["halt_reason"].as_str()), (StatusCode::OK, Some("operator")));
    assert_eq!(offer(&api, &b.node_token, &beat(6, "GPU-b", true)).await, None);

    // The agent upgraded: its version is shown, and it is offered nothing.
    let (s, _) = admin(
        &api,
        &p,
        "POST",
        &format!("{PATH_ADMIN_RELEASES}/{NEXT}/rollout"),
        Some(serde_json::json!({"percent": 100})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let up = HeartbeatRequest {
        agent_version: Some(NEXT.into()),
        upgrade: Some(UpgradeReport { outcome: UpgradeOutcome::Succeeded, detail: String::new(), ..report }),
        ..beat(7, "GPU-b", true)
    };
    assert_eq!(offer(&api, &b.node_token, &up).await, None);
    assert_eq!(p.node(&b.node_id).unwrap().agent_version, NEXT);
    let human = String::from_utf8_lossy(&p.cli(["nodes", "list"]).stdout).into_owned();
    assert!(human.contains(NEXT), "the operator's list shows the version: {human}");
    let (_, v) = admin(
        &api,
        &p,
        "POST",
        &format!("{PATH_ADMIN_RELEASES}/{NEXT}/rollout"),
        Some(serde_json::json!({"percent": 100, "offer_regardless": true})),
    )
    .await;
    assert_eq!(v["offer_regardless"], true, "the test build takes the test-only flag");
    // It offers the version to a server that runs it (the downgrade test's platform); the
    // agent is the one to refuse.
    assert_eq!(
        offer(
            &api,
            &b.node_token,
            &HeartbeatRequest { agent_version: Some(NEXT.into()), ..beat(8, "GPU-b", true) }
        )
        .await
        .as_deref(),
        Some(NEXT)
    );

    // The CLI's pause and the owner's switch for the operator.
    assert_eq!(p.cli_json(&["releases", "pause"])["state"], "paused");
    assert!(!p.cli(["releases", "pause"]).status.success(), "paused already");
    assert_eq!(p.cli_json(&["nodes", "set", &b.node_id, "--auto-update", "off"])["auto_update"], false);
    assert!(!p.node(&b.node_id).unwrap().upgrades.auto_update);

    // A schedule: from 0 %, 50 % more every hour. A new server is offered nothing until the
    // platform's clock has passed two steps; the list says the schedule; an interval under a
    // minute is refused with why.
    let c: RegisterResponse = api.register(&p.join_code(), "GPU-c").await.ok();
    let args = ["releases", "rollout", NEXT, "--percent", "0", "--step", "50", "--every", "1h"];
    let r: RolloutSummary = serde_json::from_value(p.cli_json(&args)).unwrap();
    assert_eq!(
        (r.state, r.percent, r.step.map(|s| (s.percent, s.every_secs))),
        (RolloutState::Active, 0, Some((50, 3600)))
    );
    let next = r.next_step_at.expect("a next step");
    assert_eq!(offer(&api, &c.node_token, &beat(1, "GPU-c", true)).await, None, "0 %");
    p.set_clock(next + 3600);
    assert_eq!(
        offer(&api, &c.node_token, &beat(2, "GPU-c", true)).await.as_deref(),
        Some(NEXT),
        "100 % by now"
    );
    let human = String::from_utf8_lossy(&p.cli(["releases", "list"]).stdout).into_owned();
    assert!(human.contains("active at 100 % (+50 % every 1h)"), "{human}");
    let out = p.cli(["releases", "rollout", NEXT, "--percent", "0", "--step", "10", "--every", "30s"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("m, h or d"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (s, v) = admin(
        &api,
        &p,
        "POST",
        &format!("{PATH_ADMIN_RELEASES}/{NEXT}/rollout"),
        Some(serde_json::json!({"percent": 0, "step": {"percent": 10, "every_secs": 30}})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v.to_string().contains("at least 60 s"), "{v}");
}
