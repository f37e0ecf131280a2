//! Issue 35: several `serve` processes on one PostgreSQL are correct together. These run on
//! PostgreSQL whatever `GPUM_TEST_DB` says (a private cluster: `gpum_platform::testdb`).

use std::sync::Arc;

use gpum_platform::sql::Engine;
use gpum_platform::testdb::TestDb;
use gpum_protocol::{ErrorCode, HeartbeatResponse, RegisterResponse};
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::StatusCode;

use super::{Api, beat};

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
