//! Issue 47, "Compatibility, tested", the agent's side: today's agent against the previous
//! release's platform, as its real binary answered the previous agent on loopback
//! (`tests/fixtures/protocol/recorded/previous-agent-previous-platform.json`, README beside it).
//! A loopback server plays the recorded answers back in their order: the registration's, then
//! one heartbeat answer per heartbeat, the two commands the previous platform sent among them.
//! Today's agent registers with it, heartbeats, obeys the commands and reports their results as
//! the previous platform expects, and restarts (exit 75) when told to.

use super::*;
use gpum_protocol::{HeartbeatRequest, PATH_HEARTBEAT, PATH_REGISTER, RegisterRequest, RegisterResponse};

#[derive(serde::Deserialize)]
struct Recorded {
    platform: String,
    exchanges: Vec<Exchange>,
}

#[derive(serde::Deserialize)]
struct Exchange {
    path: String,
    status: u16,
    response: String,
}

/// What the agent sent the replaying server: the path, the `Authorization` value, the body.
type Received = Arc<std::sync::Mutex<Vec<(String, Option<String>, String)>>>;

/// Serves `answers` (path, status, body) in order on keep-alive connections, the last again
/// once they run out, and records every request.
fn replay(answers: Vec<(String, u16, String)>) -> (u16, Received) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got: Received = Default::default();
    let (g, next) = (got.clone(), Arc::new(std::sync::atomic::AtomicUsize::new(0)));
    let answers = Arc::new(answers);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let (g, next, answers) = (g.clone(), next.clone(), answers.clone());
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
                    let (mut len, mut auth) = (0usize, None);
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
                        match k.to_ascii_lowercase().as_str() {
                            "content-length" => len = v.trim().parse().unwrap_or(0),
                            "authorization" => auth = Some(v.trim().to_owned()),
                            _ => {}
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        return;
                    }
                    g.lock().unwrap().push((path, auth, String::from_utf8_lossy(&body).into_owned()));
                    let i = next.fetch_add(1, Ordering::SeqCst).min(answers.len() - 1);
                    let (_, status, answer) = &answers[i];
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        answer.len()
                    );
                    if w.write_all(head.as_bytes()).and_then(|()| w.write_all(answer.as_bytes())).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, got)
}

#[test]
fn todays_agent_works_with_the_previous_platforms_recorded_answers() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/protocol/recorded/previous-agent-previous-platform.json");
    let r: Recorded = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    assert_eq!(r.platform, "cbcbf7c", "the previous release's platform");
    // The answers up to the one after the restart command's (the restart's result goes with
    // the heartbeat after it; the record then goes on with the previous agent's next run).
    let restart_at = r
        .exchanges
        .iter()
        .position(|e| e.response.contains("\"kind\":\"restart\""))
        .expect("the record's restart command");
    let answers: Vec<_> = r.exchanges[..=restart_at + 1]
        .iter()
        .map(|e| (e.path.clone(), e.status, e.response.clone()))
        .collect();
    let reg: RegisterResponse = serde_json::from_str(&answers[0].2).unwrap();
    let commands: Vec<(String, String)> = answers
        .iter()
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(&a.2).ok())
        .flat_map(|v| v["commands"].as_array().cloned().unwrap_or_default())
        .map(|c| (c["id"].as_str().unwrap().to_owned(), c["kind"].as_str().unwrap().to_owned()))
        .collect();
    let (port, got) = replay(answers);

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let server = format!("http://127.0.0.1:{port}");
    let reg_cmd =
        agent_cmd(&["register", "--state", state, "--server", &server, "--docker-socket", MISSING_DOCKER]);
    let out = run_with_stdin(reg_cmd, "GPUM-QWF8A-JPFXV-PG37S-J8QPP-~\n");
    assert!(out.status.success(), "register against the previous platform's answer: {}", text(&out));
    let node = Node { dir, id: reg.node_id.clone() };
    assert_eq!(node.token(), reg.node_token, "the token the previous platform issued, kept");

    let mut a = Agent::start(&node);
    let exit = a.wait_exit(Duration::from_secs(60));
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(75),
        "restarts when the previous platform says so: {}",
        a.log()
    );

    let got = got.lock().unwrap().clone();
    assert_eq!(got[0].0, PATH_REGISTER);
    let _: RegisterRequest = serde_json::from_str(&got[0].2).expect("today's registration");
    let mut results = Vec::new();
    let mut seqs = Vec::new();
    for (path, auth, body) in &got[1..] {
        assert_eq!(path, PATH_HEARTBEAT);
        assert_eq!(auth.as_deref(), Some(format!("Bearer {}", reg.node_token).as_str()));
        let hb: HeartbeatRequest = serde_json::from_str(body).expect("a heartbeat");
        seqs.push(hb.seq);
        results.extend(hb.command_results);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "heartbeats in order: {seqs:?}");
    let restart = commands.iter().find(|c| c.1 == "restart").expect("a restart in the record");
    let answered = results.iter().find(|c| c.id == restart.0).expect("the restart's result reported");
    assert!(answered.ok, "{answered:?}");
    assert!(
        a.log().contains("command recheck: the GPU probe runs again"),
        "the recorded recheck obeyed: {}",
        a.log()
    );
    assert!(!a.log().contains(" ERROR "), "no error against the previous platform: {}", a.log());
}
