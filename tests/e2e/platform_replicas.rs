//! Issue 35: several `serve` processes on one PostgreSQL are correct together. These run on
//! PostgreSQL whatever `GPUM_TEST_DB` says (a private cluster: `gpum_platform::testdb`).

use std::sync::Arc;

use gpum_platform::sql::Engine;
use gpum_platform::store::{self, Scope};
use gpum_platform::testdb::TestDb;
use gpum_protocol::{ErrorCode, HeartbeatResponse, PATH_REGISTER, RegisterRequest, RegisterResponse};
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use gpum_tests::tunnel::{Rental, connect, create_rental_with_ports, free_port};
use reqwest::StatusCode;

use super::{Api, beat, inventory};

/// The same join code sent to two replicas at the same moment registers exactly one node (the
/// other is told `join_code_used`), a node registered on one heartbeats on the other, a node
/// deleted through one is gone for an agent talking to the other, and a command is handed out
/// once.
#[tokio::test]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
async fn two_replicas_use_each_join_code_once_and_share_every_node() {
    let a = TestPlatform::start_on(PlatformOpts::insecure_http(), Arc::new(TestDb::on(Engine::Postgres)));
    let b = a.replica();
    assert_eq!(a.engine(), Engine::Postgres);
    let apis = [Api::new(&a), Api::new(&b)];
    let rounds = 20;
    let mut nodes = Vec::new();
    for i in 0..rounds {
        let code = a.join_code();
        let (gpu_a, gpu_b) = (format!("GPU-a{i}"), format!("GPU-b{i}"));
        let (ra, rb) = tokio::join!(apis[0].register(&code, &gpu_a), apis[1].register(&code, &gpu_b));
        let won: Vec<usize> =
            [&ra, &rb].iter().enumerate().filter(|(_, r)| r.status.is_success()).map(|(k, _)| k).collect();
        assert_eq!(won.len(), 1, "round {i}: {} and {}", ra.body, rb.body);
        let (winner, loser) = if won[0] == 0 { (&ra, &rb) } else { (&rb, &ra) };
        assert_eq!(loser.code(), ErrorCode::JoinCodeUsed, "round {i}");
        let r: RegisterResponse = winner.ok();
        // Registered on one, heartbeats on the other.
        let _: HeartbeatResponse = apis[1 - won[0]].heartbeat(&r.node_token, &beat(0)).await.ok();
        nodes.push(r);
    }
    assert_eq!(b.nodes().nodes.len(), rounds, "both replicas see every node");
    assert_eq!(a.nodes().nodes.len(), rounds);

    // Deleted through one (its CLI), refused by the other.
    let gone = &nodes[0];
    a.delete_node(&gone.node_id);
    let ans = apis[1].heartbeat(&gone.node_token, &beat(1)).await;
    assert_eq!((ans.status, ans.code()), (StatusCode::GONE, ErrorCode::NodeDeleted));
    let _: HeartbeatResponse = apis[1].heartbeat(&nodes[1].node_token, &beat(1)).await.ok();

    // A command is handed out once, even when the node's heartbeat reaches both replicas at the
    // same moment (an agent's retry that the balancer sent to the other).
    let n = &nodes[1];
    for round in 0..10u64 {
        let cmd = a.command(&n.node_id, "recheck");
        let req = beat(2 + round);
        let (ha, hb) =
            tokio::join!(apis[0].heartbeat(&n.node_token, &req), apis[1].heartbeat(&n.node_token, &req));
        let (ha, hb): (HeartbeatResponse, HeartbeatResponse) = (ha.ok(), hb.ok());
        let handed = ha.commands.iter().chain(&hb.commands).filter(|c| c.id == cmd).count();
        assert_eq!(handed, 1, "round {round}: {:?} and {:?}", ha.commands, hb.commands);
    }
}

/// A registration as a load balancer's client sees it: the answer, or `None` when the replica
/// died before answering (the connection broke) or answered with an error.
async fn try_register(api: &Api, code: &str, uuid: &str) -> Option<RegisterResponse> {
    let req = RegisterRequest {
        join_code: code.into(),
        agent_version: "0.1.0".into(),
        inventory: inventory(uuid),
        install_id: None,
    };
    let r = api.c.post(format!("{}{PATH_REGISTER}", api.url)).json(&req).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// A replica killed (SIGKILL) in the middle of registrations: the other answers every request
/// sent to it, and every registration either replica acknowledged is there, its token accepted.
#[tokio::test]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
async fn a_replica_killed_mid_load_loses_nothing_it_acknowledged() {
    let mut a = TestPlatform::start_on(PlatformOpts::insecure_http(), Arc::new(TestDb::on(Engine::Postgres)));
    let b = a.replica();
    // Join codes made straight in the database: the CLI is too slow to make enough of them for
    // the load to outlast the kill.
    let n = 600;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let codes: Vec<String> = b.with_db(|c| {
        (0..n).map(|_| store::create_join_code(c, now, 3600, &Scope::All).unwrap().code).collect()
    });
    let apis = [Api::new(&a), Api::new(&b)];
    let uuids: Vec<String> = (0..n).map(|i| format!("GPU-k{i}")).collect();
    // Eight clients, each registering its share one after another, alternating replicas.
    let clients = (0..8).map(|k| {
        let (apis, codes, uuids) = (&apis, &codes, &uuids);
        async move {
            let mut out = Vec::new();
            for i in (k..n).step_by(8) {
                out.push((i, try_register(&apis[i % 2], &codes[i], &uuids[i]).await));
            }
            out
        }
    });
    let kill = async {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        a.stop();
    };
    let (per_client, ()) = tokio::join!(futures_util::future::join_all(clients), kill);
    let mut answers: Vec<(usize, Option<RegisterResponse>)> = per_client.into_iter().flatten().collect();
    answers.sort_by_key(|(i, _)| *i);
    let answers: Vec<Option<RegisterResponse>> = answers.into_iter().map(|(_, r)| r).collect();
    let lost = answers.iter().enumerate().filter(|(i, r)| i % 2 == 0 && r.is_none()).count();
    assert!(lost > 0, "the kill came after the load: make it longer");
    for (i, r) in answers.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        assert!(r.is_some(), "registration {i}, sent to the replica that lives, failed");
    }
    let acknowledged: Vec<&RegisterResponse> = answers.iter().flatten().collect();
    let listed: Vec<String> = b.nodes().nodes.into_iter().map(|n| n.id).collect();
    for r in &acknowledged {
        assert!(listed.contains(&r.node_id), "{} was acknowledged, and is gone", r.node_id);
        let _: HeartbeatResponse = apis[1].heartbeat(&r.node_token, &beat(1)).await.ok();
    }
    eprintln!(
        "{} of {n} registrations acknowledged ({} by the killed replica)",
        acknowledged.len(),
        answers.iter().enumerate().filter(|(i, r)| i % 2 == 0 && r.is_some()).count()
    );
}

/// Issue 43, item 2: the throttle's counts are shared by replicas. Wrong admin tokens from one
/// address, sent to two replicas in turn, are blocked after five in all; before the fix each
/// replica counted alone, and two gave twice the guesses.
#[tokio::test]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
async fn replicas_share_the_throttles_counts() {
    let a = TestPlatform::start_on(PlatformOpts::insecure_http(), Arc::new(TestDb::on(Engine::Postgres)));
    let b = a.replica();
    let c = reqwest::Client::new();
    let mut statuses = Vec::new();
    for i in 0..8 {
        let p = if i % 2 == 0 { &a } else { &b };
        let r = c
            .get(format!("{}{}", p.url(), gpum_protocol::PATH_ADMIN_NODES))
            .bearer_auth(format!("guess-{i}-0123456789abcdef0123456789abcdef"))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429]);
}

/// A TCP balancer in front of `backends` (loopback ports): each connection goes to the next
/// one in turn; one that refuses is skipped, as a balancer's health check would. Its port, and
/// the task that ends it.
async fn round_robin(backends: Vec<u16>) -> (u16, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            let Ok((mut down, _)) = l.accept().await else { continue };
            let (start, backends) = (next, backends.clone());
            next += 1;
            tokio::spawn(async move {
                for k in 0..backends.len() {
                    let to = backends[(start + k) % backends.len()];
                    if let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                        let _ = (down.set_nodelay(true), up.set_nodelay(true));
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        return;
                    }
                }
            });
        }
    });
    (port, task)
}

/// A `CONNECT` to `r`'s port 7000 at the relay on loopback port `relay`, proved by an echo:
/// the status, and the stream when it echoed.
fn echoed(relay: u16, r: &Rental) -> (u16, Option<std::net::TcpStream>) {
    use std::io::{Read, Write};
    let (status, s) = connect(relay, &r.id, 7000, &r.id, &r.credential);
    let Some(mut s) = s else { return (status, None) };
    let mut back = [0u8; 6];
    let ok = s.write_all(b"hello\n").is_ok() && s.read_exact(&mut back).is_ok() && &back == b"hello\n";
    (status, ok.then_some(s))
}

/// Whether an open stream still echoes.
fn still_echoes(s: &mut std::net::TcpStream) -> bool {
    use std::io::{Read, Write};
    let mut back = [0u8; 5];
    s.write_all(b"again").is_ok() && s.read_exact(&mut back).is_ok() && &back == b"again"
}

/// Issue 44, item 3: a tenant reaches a rental through any replica. Two replicas in a relay
/// mesh behind round-robin fronts (the API, the `CONNECT` door, the HTTP door), node 1's tunnel
/// on replica A and node 2's on B: 100 of 100 `CONNECT`s and 100 of 100 HTTP-door requests to
/// node 1's rental reach it, half of them through B, which forwards them to A. A peer request
/// without the mesh's secret is refused; a replica without the mesh answers 502 for the rental
/// (the behaviour before the mesh, fail closed). A is killed: node 1's agent
/// dials again through the front, lands on B, and new connections work again within
/// [`REDIAL_BOUND`], while a stream to node 2's rental held by B goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
async fn a_tenant_reaches_a_rental_through_either_replica_and_a_survivor_takes_the_tunnel() {
    use super::effects::{HTTP_PORT, TunnelEnd, rentable};
    /// How soon after the agent's new tunnel a tenant's new connection works again.
    const REDIAL_BOUND: std::time::Duration = std::time::Duration::from_secs(5);
    const DOMAIN: &str = "relay.test";
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("peer-secret");
    gpum_tests::platform::write_private(&secret, b"0123456789abcdef0123456789abcdef-mesh");
    let ports: Vec<[u16; 3]> = (0..2).map(|_| [free_port(), free_port(), free_port()]).collect();
    let opts = |[relay, door, peer]: [u16; 3]| PlatformOpts {
        extra_args: [
            "--relay-listen".into(),
            format!("127.0.0.1:{relay}"),
            "--relay-http-listen".into(),
            format!("127.0.0.1:{door}"),
            "--relay-domain".into(),
            DOMAIN.into(),
            "--peer-listen".into(),
            format!("127.0.0.1:{peer}"),
            "--peer-addr".into(),
            format!("127.0.0.1:{peer}"),
            "--peer-secret-file".into(),
            secret.display().to_string(),
        ]
        .to_vec(),
        ..PlatformOpts::insecure_http()
    };
    let mut a = TestPlatform::start_on(opts(ports[0]), Arc::new(TestDb::on(Engine::Postgres)));
    let b = a.replica_with(opts(ports[1]));
    let lone_relay = free_port();
    let lone = a.replica_with(PlatformOpts {
        extra_args: vec!["--relay-listen".into(), format!("127.0.0.1:{lone_relay}")],
        ..PlatformOpts::insecure_http()
    });
    let (api, _api_task) = round_robin(vec![a.port(), b.port()]).await;
    let (relay, _relay_task) = round_robin(vec![ports[0][0], ports[1][0]]).await;
    let (door, _door_task) = round_robin(vec![ports[0][1], ports[1][1]]).await;

    let n1 = rentable(&a, a.join_code(), "GPU-m4400001-0000-4000-8000-00000000000").await;
    let n2 = rentable(&a, a.join_code(), "GPU-m4400002-0000-4000-8000-00000000000").await;
    let _t1 = TunnelEnd::open_at(a.port(), &n1.node_token).await;
    let _t2 = TunnelEnd::open_at(b.port(), &n2.node_token).await;
    let image = format!("nvcr.io/nvidia/pytorch@sha256:{}", "ab".repeat(32));
    let r1 = create_rental_with_ports(&a, &n1.node_id, &image, &[7000, HTTP_PORT], "true");
    let r2 = create_rental_with_ports(&a, &n2.node_id, &image, &[7000], "true");
    let logs = || format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());

    // Through the front, to node 1's rental: every CONNECT.
    let (rc, r1c) = (relay, r1.clone());
    let statuses = tokio::task::spawn_blocking(move || {
        (0..100)
            .map(|_| {
                let (status, s) = echoed(rc, &r1c);
                (s.is_some(), status)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let reached = statuses.iter().filter(|(ok, _)| *ok).count();
    assert_eq!(reached, 100, "{statuses:?}\n{}", logs());
    // And every HTTP-door request, each on a new connection.
    let host = format!("{}-{HTTP_PORT}.{DOMAIN}", r1.id.strip_prefix("rent-").unwrap());
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .resolve(&host, ([127, 0, 0, 1], door).into())
        .build()
        .unwrap();
    let mut answered = 0;
    for _ in 0..100 {
        let r = c.get(format!("http://{host}:{door}/")).basic_auth(&r1.id, Some(&r1.credential)).send().await;
        if let Ok(r) = r
            && r.status() == StatusCode::OK
            && r.text().await.unwrap_or_default() == r1.id
        {
            answered += 1;
        }
    }
    assert_eq!(answered, 100, "{}", logs());
    // A peer request without the mesh's secret is refused by the replica that holds the tunnel.
    let forged = gpum_protocol::PeerOpen {
        rental: r1.id.clone(),
        port: 7000,
        node: n1.node_id.clone(),
        at: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
        nonce: "00".repeat(16),
        mac: "ab".repeat(32),
    };
    let peer_a = ports[0][2];
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", peer_a)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
        let mut line = serde_json::to_vec(&forged).unwrap();
        line.push(b'\n');
        s.write_all(&line).unwrap();
        let mut back = String::new();
        std::io::BufReader::new(s).read_line(&mut back).unwrap();
        serde_json::from_str::<gpum_protocol::PeerReply>(&back).unwrap()
    })
    .await
    .unwrap();
    assert!(!answer.ok && answer.status == 403, "{answer:?}");
    // Without the mesh, the replica that does not hold the tunnel cannot reach it.
    let r1c = r1.clone();
    let alone = tokio::task::spawn_blocking(move || echoed(lone_relay, &r1c).0).await.unwrap();
    assert_eq!(alone, 502, "a replica outside the mesh");
    drop(lone);

    // A stream to node 2's rental, held by B end to end.
    let r2c = r2.clone();
    let mut kept =
        tokio::task::spawn_blocking(move || echoed(ports[1][0], &r2c).1).await.unwrap().expect("r2");
    // A, which holds node 1's tunnel, is killed; node 1's agent dials again through the front.
    a.stop();
    let _t1 = TunnelEnd::open_at(api, &n1.node_token).await;
    let (rc, r1c) = (relay, r1.clone());
    let back = tokio::task::spawn_blocking(move || {
        let start = std::time::Instant::now();
        while start.elapsed() < REDIAL_BOUND {
            if echoed(rc, &r1c).1.is_some() {
                return (0..20).filter(|_| echoed(rc, &r1c).1.is_some()).count();
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        0
    })
    .await
    .unwrap();
    assert_eq!(back, 20, "new connections after the redial\n{}", b.log());
    let kept_on = tokio::task::spawn_blocking(move || still_echoes(&mut kept)).await.unwrap();
    assert!(kept_on, "the stream B held end to end went on");
}
