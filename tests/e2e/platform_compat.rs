//! Issue 47, "Compatibility, tested": the exchanges of the previous release, recorded before
//! the upgrade's fields existed (the wire types of commit cbcbf7c, the last before 4dba746) in
//! `tests/fixtures/protocol/previous/` (its README says how), against this release's types and
//! its real platform over HTTP.
//!
//! - A previous agent's register and heartbeat requests parse in today's types with the new
//!   fields absent, and write back as the very same JSON (nothing of them is lost or added).
//! - A previous platform's answers parse in today's agent's types, with no upgrade offered.
//! - The real platform answers a previous agent's registration 201 and its heartbeats 200, every
//!   field the previous agent's types require is in the answers, no upgrade is offered to it,
//!   and the node keeps the version its registration named.
//!
//! The other way round (today's answer in a previous agent) rests on the previous types having
//! no `deny_unknown_fields` on the agent's messages (docs/protocol.md), which the fixtures'
//! README records.

use super::*;
use gpum_protocol::RegisterResponse;

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/protocol/previous").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn json(name: &str) -> serde_json::Value {
    serde_json::from_slice(&fixture(name)).unwrap()
}

/// `T` parsed from fixture `name`, which today's type writes back as the same JSON value.
fn parses_unchanged<T: serde::de::DeserializeOwned + serde::Serialize>(name: &str) -> T {
    let t: T = serde_json::from_slice(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(serde_json::to_value(&t).unwrap(), json(name), "{name}: written back otherwise");
    t
}

#[test]
fn a_previous_agents_requests_parse_in_todays_types() {
    let reg: RegisterRequest = parses_unchanged("register_request.json");
    assert_eq!(reg.agent_version, "0.1.0");
    for name in ["heartbeat_request_first.json", "heartbeat_request.json"] {
        let hb: HeartbeatRequest = parses_unchanged(name);
        assert_eq!((&hb.agent_version, hb.auto_update, &hb.upgrade), (&None, None, &None), "{name}");
        assert_eq!(hb.inventory_hash, reg.inventory.hash(), "{name}: the registered inventory's hash");
    }
    let first: HeartbeatRequest = parses_unchanged("heartbeat_request_first.json");
    assert_eq!(first.inventory.as_ref(), Some(&reg.inventory));
}

#[test]
fn a_previous_platforms_answers_parse_in_todays_agents_types() {
    let reg: RegisterResponse = parses_unchanged("register_response.json");
    assert_eq!(reg.node_token.len(), 64);
    let ans: HeartbeatResponse = parses_unchanged("heartbeat_response.json");
    assert_eq!(ans.upgrade, None, "a previous platform offers no upgrade");
    assert!(
        !ans.commands.is_empty() && !ans.rentals.is_empty(),
        "the fixture carries a command and a rental"
    );
    let kinds: Vec<_> = ans.commands.iter().map(|c| gpum_protocol::CommandKind::parse(&c.kind)).collect();
    assert!(kinds.iter().all(Option::is_some), "{kinds:?}");
}

/// The keys of `previous` (an object) missing from `now`, recursively through objects and
/// through the first element of arrays both have.
fn missing_keys(previous: &serde_json::Value, now: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match (previous, now) {
        (Value::Object(p), Value::Object(n)) => {
            for (k, v) in p {
                match n.get(k) {
                    None => out.push(format!("{at}.{k}")),
                    Some(nv) => missing_keys(v, nv, &format!("{at}.{k}"), out),
                }
            }
        }
        (Value::Array(p), Value::Array(n)) => {
            if let (Some(p), Some(n)) = (p.first(), n.first()) {
                missing_keys(p, n, &format!("{at}[0]"), out);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn the_platform_serves_a_previous_agent() {
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);

    // Registration: the previous agent's very body, with a join code of this platform.
    let mut reg = json("register_request.json");
    reg["join_code"] = p.join_code().into();
    let a = api.post_raw(PATH_REGISTER, None, serde_json::to_vec(&reg).unwrap()).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let mut missing = Vec::new();
    missing_keys(&json("register_response.json"), &a.body, "register", &mut missing);
    assert!(missing.is_empty(), "the previous agent's fields missing from the answer: {missing:?}");
    let r: RegisterResponse = a.ok();

    // Its first heartbeat (with the inventory), then a steady one, byte for byte as it sent them.
    for name in ["heartbeat_request_first.json", "heartbeat_request.json"] {
        let a = api.post_raw(PATH_HEARTBEAT, Some(&r.node_token), fixture(name)).await;
        assert_eq!(a.status, StatusCode::OK, "{name}: {}", a.body);
        let mut missing = Vec::new();
        // The previous answer's fields that its agent's types require (no serde default).
        let required = serde_json::json!({
            "heartbeat_interval_secs": 0, "commands": [], "known_containers": [], "probe_image": null
        });
        missing_keys(&required, &a.body, name, &mut missing);
        assert!(missing.is_empty(), "{name}: fields a previous agent needs are missing: {missing:?}");
        assert!(a.body.get("upgrade").is_none(), "{name}: no upgrade offered: {}", a.body);
        let ans: HeartbeatResponse = a.ok();
        assert!(!ans.send_inventory, "{name}: the inventory it sent is the one the platform holds");
    }
    let n = p.node(&r.node_id).expect("the node");
    assert!(n.online, "online after its heartbeats");
    assert_eq!(n.agent_version, "0.1.0", "the version its registration named, as no heartbeat names one");
    assert_eq!(n.managed_containers, ["4c01db0b339c"], "its heartbeat was stored");
}
