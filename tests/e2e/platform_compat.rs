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
//! And from `tests/fixtures/protocol/recorded/`, what the previous release's real binaries sent
//! each other on loopback (its README says how they were recorded):
//! - every message of the previous agent and the previous platform parses in today's types and
//!   writes back as the same JSON;
//! - today's platform answers the previous agent's recorded requests, replayed in order (its
//!   registration, its heartbeats, the results of the commands it was sent): the same statuses,
//!   and every field the previous platform answered with is in today's answers.
//!
//! Today's agent against the previous platform's recorded answers is the agent suite's
//! (`agent_compat.rs`). The other way round live (the previous agent's binary against today's
//! answers) was run when the exchanges were recorded (`previous-agent-next-platform.json`); in
//! CI it rests on the previous types having no `deny_unknown_fields` on the agent's messages
//! (docs/protocol.md), which the fixtures' README records.

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
    same_in_todays(&String::from_utf8(fixture(name)).expect("UTF-8"), name)
}

/// One recorded file of `tests/fixtures/protocol/recorded/`.
#[derive(serde::Deserialize)]
pub(crate) struct Recorded {
    /// The commits of the two builds.
    pub agent: String,
    pub platform: String,
    pub exchanges: Vec<Exchange>,
}

/// One request and its answer, the bodies byte for byte as they were sent.
#[derive(serde::Deserialize)]
pub(crate) struct Exchange {
    pub path: String,
    pub status: u16,
    pub request: String,
    pub response: String,
}

/// The exchanges the previous release's agent and platform (commit `PREVIOUS`) sent each other.
pub(crate) const PREVIOUS: &str = "cbcbf7c";

pub(crate) fn recorded(name: &str) -> Recorded {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/protocol/recorded").join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `T` parsed from `text`, which today's type writes back as the same JSON value.
fn same_in_todays<T: serde::de::DeserializeOwned + serde::Serialize>(text: &str, what: &str) -> T {
    let t: T = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    // Through text, as the wire has it: an `f32` field becomes a longer `f64` in a `Value`.
    let back: serde_json::Value = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(
        back,
        serde_json::from_str::<serde_json::Value>(text).unwrap(),
        "{what}: written back otherwise"
    );
    t
}

#[test]
fn the_previous_releases_recorded_messages_parse_in_todays_types() {
    let r = recorded("previous-agent-previous-platform.json");
    assert_eq!((r.agent.as_str(), r.platform.as_str()), (PREVIOUS, PREVIOUS));
    let (mut commands, mut results) = (Vec::new(), Vec::new());
    for (i, e) in r.exchanges.iter().enumerate() {
        let what = format!("exchange {i} ({})", e.path);
        if e.path == PATH_REGISTER {
            assert_eq!(e.status, 201, "{what}");
            same_in_todays::<RegisterRequest>(&e.request, &what);
            same_in_todays::<RegisterResponse>(&e.response, &what);
        } else {
            assert_eq!((e.path.as_str(), e.status), (PATH_HEARTBEAT, 200), "{what}");
            let hb: HeartbeatRequest = same_in_todays(&e.request, &what);
            assert_eq!((&hb.agent_version, hb.auto_update, &hb.upgrade), (&None, None, &None), "{what}");
            results.extend(hb.command_results.into_iter().map(|c| c.id));
            let ans: HeartbeatResponse = same_in_todays(&e.response, &what);
            assert_eq!(ans.upgrade, None, "{what}: a previous platform offers no upgrade");
            commands.extend(ans.commands.into_iter().map(|c| (c.id, c.kind)));
        }
    }
    // What the record holds, so that the replays below exercise it: the registration, the first
    // heartbeat with the inventory, the commands and a command's result.
    assert_eq!(r.exchanges[0].path, PATH_REGISTER);
    let kinds: Vec<&str> = commands.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(kinds, ["recheck", "restart"], "the recorded commands");
    assert!(results.contains(&commands[1].0), "the restart's result is in the record: {results:?}");
}

/// Today's platform, sent the previous agent's recorded requests in their order: its
/// registration with a join code of this platform, then each heartbeat byte for byte, but for
/// the node token and for the ids of the commands whose results it carries (the previous
/// platform's ids mapped to this one's). Before the heartbeat whose recorded answer carried a
/// command, the same command is queued here. Each answer has the recorded status, every field
/// of the previous platform's answer (recursively), and no upgrade offer.
#[tokio::test]
async fn todays_platform_answers_the_previous_agents_recorded_requests() {
    let r = recorded("previous-agent-previous-platform.json");
    let p = TestPlatform::start(PlatformOpts::default());
    let api = Api::new(&p);
    let (mut node, mut token) = (String::new(), String::new());
    let mut ids = std::collections::HashMap::<String, String>::new();
    for (i, e) in r.exchanges.iter().enumerate() {
        let what = format!("exchange {i} ({})", e.path);
        let recorded_answer: serde_json::Value = serde_json::from_str(&e.response).unwrap();
        let a = if e.path == PATH_REGISTER {
            let mut reg: serde_json::Value = serde_json::from_str(&e.request).unwrap();
            reg["join_code"] = p.join_code().into();
            api.post_raw(PATH_REGISTER, None, serde_json::to_vec(&reg).unwrap()).await
        } else {
            for c in recorded_answer["commands"].as_array().unwrap() {
                let id = p.command(&node, c["kind"].as_str().unwrap());
                ids.insert(c["id"].as_str().unwrap().to_owned(), id);
            }
            let mut body = e.request.clone();
            for (then, now) in &ids {
                body = body.replace(then.as_str(), now);
            }
            api.post_raw(PATH_HEARTBEAT, Some(&token), body).await
        };
        assert_eq!(a.status.as_u16(), e.status, "{what}: {}", a.body);
        let mut missing = Vec::new();
        missing_keys(&recorded_answer, &a.body, &what, &mut missing);
        assert!(missing.is_empty(), "{what}: the previous platform's fields missing: {missing:?}");
        assert!(a.body.get("upgrade").is_none(), "{what}: no upgrade offered: {}", a.body);
        if e.path == PATH_REGISTER {
            let reg: RegisterResponse = a.ok();
            (node, token) = (reg.node_id, reg.node_token);
        } else {
            let ans: HeartbeatResponse = a.ok();
            let kinds = |v: &serde_json::Value| -> Vec<String> {
                v["commands"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["kind"].as_str().unwrap().to_owned())
                    .collect()
            };
            let now: Vec<String> = ans.commands.iter().map(|c| c.kind.clone()).collect();
            assert_eq!(now, kinds(&recorded_answer), "{what}: the commands sent");
        }
    }
    assert_eq!(ids.len(), 2, "both recorded commands were queued and sent");
    let n = p.node(&node).expect("the node");
    let restart = n.commands.iter().find(|c| c.kind == "restart").expect("the restart command");
    assert!(ids.values().any(|id| *id == restart.id), "{:?}", n.commands);
    let result = restart.result.as_ref().expect("the result the previous agent reported, stored");
    assert_eq!((result.ok, result.message.as_str()), (true, "restarting"));
    assert!(n.online, "online after its heartbeats");
    assert_eq!(n.agent_version, "0.1.0", "the version its registration named");
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
