//! Issue 46, "Money": the real server over real HTTP, its clock stopped so that every second is
//! known. One owner's two servers, four rentals, driven by heartbeats as an agent sends them:
//! an offline gap, a price change during a rental, a rental that failed before it ran, a
//! server deleted mid-rental. The sums are checked against the hand-computed figures below,
//! through the owner API (JSON and CSV), the admin API and the CLI, on SQLite and (with
//! `GPUM_TEST_DB=postgres`) PostgreSQL.

use gpum_platform::web::{LANG_COOKIE, SESSION_COOKIE};
use gpum_protocol::{
    CreateRentalRequest, Earnings, GpuPublic, Health, HeartbeatRequest, HeartbeatResponse, Inventory,
    NvmlState, PATH_ADMIN_EARNINGS, PATH_ADMIN_RENTALS, PATH_OWNER_EARNINGS, ProbeReport, RegisterRequest,
    RegisterResponse, RentalReport, RentalState, RentalSummary, VerificationState, path_admin_rental,
    path_admin_rental_stop,
};
use gpum_tests::owner::OwnerSession;
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use reqwest::StatusCode;

use super::Api;

const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const PW: &str = "correct horse battery";
/// 2026-12-06 23:50:00 UTC: ten minutes before midnight, so the rentals' time is split
/// between two days.
const T0: u64 = 1_796_601_000;

fn inventory(tag: &str) -> Inventory {
    let mut inv = Inventory::default();
    inv.public.cpu_model = "Test CPU".into();
    inv.public.cpu_cores = 32;
    inv.public.ram_mib = 262_144;
    inv.public.disk_gib = 2000;
    inv.public.gpus = vec![GpuPublic { model: "H100".into(), vram_mib: 81_920 }; 4];
    inv.private.hostname = format!("box-{tag}");
    inv.private.gpu_uuids = (0..4).map(|i| format!("GPU-{tag}-{i}")).collect();
    inv
}

fn beat(seq: u64, tag: &str, rentals: Vec<RentalReport>) -> HeartbeatRequest {
    HeartbeatRequest {
        seq,
        inventory_hash: inventory(tag).hash(),
        health: Health { docker_ok: true, nvml: NvmlState::Ok, ..Default::default() },
        rentals,
        ..Default::default()
    }
}

fn report(id: &str, state: RentalState) -> RentalReport {
    RentalReport { id: id.into(), state, exit_code: None, reason: None }
}

/// A server of the owner's: registered with their code, verified, priced at `price` (as typed).
async fn server(p: &TestPlatform, api: &Api, owner: &str, tag: &str, price: &str) -> RegisterResponse {
    let req = RegisterRequest {
        join_code: p.owner_join_code(owner),
        agent_version: "0.1.0".into(),
        inventory: inventory(tag),
        install_id: None,
    };
    let reg: RegisterResponse = api.post(gpum_protocol::PATH_REGISTER, None, &req).await.ok();
    let mut hb = beat(1, tag, vec![]);
    hb.probe = Some(ProbeReport {
        state: VerificationState::Verified,
        reason: None,
        output: "ok".into(),
        finished_at: 1,
        image: String::new(),
    });
    let _: HeartbeatResponse = api.heartbeat(&reg.node_token, &hb).await.ok();
    p.cli_json(&["nodes", "set", &reg.node_id, "--price", price]);
    reg
}

async fn rent(p: &TestPlatform, api: &Api, node: &str, gpus: u32) -> RentalSummary {
    let req = CreateRentalRequest {
        node_id: node.into(),
        image: format!("nvcr.io/nvidia/pytorch@sha256:{H}"),
        gpus: Some(gpus),
        cpu_millis: 4000,
        memory_mib: 16_384,
        disk_gib: 50,
        shm_mib: 1024,
        duration_secs: Some(6 * 3600),
        ..Default::default()
    };
    api.post(PATH_ADMIN_RENTALS, Some(p.admin_token()), &req).await.ok()
}

async fn get(p: &TestPlatform, path: &str, token: &str) -> (StatusCode, String) {
    let r = p.http_client().get(format!("{}{path}", p.url())).bearer_auth(token).send().await.unwrap();
    (r.status(), r.text().await.unwrap())
}

/// The hand-computed case. Node A (4 GPUs), 150.00 RUB per GPU-hour until T0+100, then
/// 200.00; node B (4 GPUs), 100.00. Beats every 10 s, except A's gap (silent from T0+620 to
/// T0+920, over the 60 s offline threshold) and B's silence after T0+400 (deleted at T0+700).
///
/// - R1, A, 2 GPUs at 150.00 (created before the price change, which never reaches it): running
///   T0+20..620 and T0+920..1550 (stopped at 1545, reported `stopping` at 1550): 600 + 630 s ×
///   2 = 2460 GPU-s = 2460 × 15000 / 3600 = 10250 → 102.50.
/// - R2, A, 1 GPU at 200.00: running T0+130..620 and T0+920..1250 (exited): 490 + 330 = 820
///   GPU-s = 820 × 20000 / 3600 = 4555.56 → 4556 (45.56).
/// - R3, A, 1 GPU: pulling, then failed at T0+160: nothing ran, nothing charged.
/// - R4, B, 1 GPU at 100.00: running T0+40..400, then B went silent and was deleted: 360 GPU-s
///   = 1000 (10.00).
///
/// Midnight is T0+600. 2026-12-06: R1 580 s × 2 = 1160 GPU-s (cumulative 4833.3 → 4833), R2
/// 470 (2611.1 → 2611), R4 360 (1000): 1990 GPU-s, 8444. 2026-12-07: R1 1300 GPU-s (10250 −
/// 4833 = 5417), R2 350 (4556 − 2611 = 1945): 1650 GPU-s, 7362. Total 3640 GPU-s, 15806
/// (158.06 RUB).
#[tokio::test]
async fn earnings_are_metered_from_what_ran_and_add_up_to_the_hand_computed_sums() {
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--currency".into(), "RUB".into()],
        ..Default::default()
    });
    let api = Api::new(&p);
    p.set_clock(T0);
    let ann = OwnerSession::accept(&p, &p.invite_owner("ann@example.com"), PW).await;
    let key = ann.create_api_key("books").await;
    // Another owner's rental must not show in Ann's figures.
    OwnerSession::accept(&p, &p.invite_owner("bob@example.com"), PW).await;

    let a = server(&p, &api, "ann@example.com", "a", "150.00").await;
    let b = server(&p, &api, "ann@example.com", "b", "100.00").await;
    let c = server(&p, &api, "bob@example.com", "c", "100.00").await;
    let r1 = rent(&p, &api, &a.node_id, 2).await;
    assert_eq!(r1.price.as_ref().map(|x| (x.per_gpu_hour, x.currency.as_str())), Some((15_000, "RUB")));
    let mut r2 = None;
    let mut r3 = None;
    let mut r4 = None;
    let r5 = rent(&p, &api, &c.node_id, 1).await;
    let mut seq = 1;
    for t in (10..=1560u64).step_by(10) {
        p.set_clock(T0 + t);
        seq += 1;
        if t == 100 {
            // The owner's price changes during R1.
            p.cli_json(&["nodes", "set", &a.node_id, "--price", "200.00"]);
        }
        if t == 10 {
            r4 = Some(rent(&p, &api, &b.node_id, 1).await);
        }
        let id = |r: &Option<RentalSummary>| r.as_ref().map(|r| r.spec.id.clone()).unwrap_or_default();
        // A's beat.
        if t <= 620 || t >= 920 {
            let mut reps = vec![report(
                &r1.spec.id,
                match t {
                    ..20 => RentalState::Pulling,
                    20..1550 => RentalState::Running,
                    1550 => RentalState::Stopping,
                    _ => RentalState::Gone,
                },
            )];
            if t > 100 {
                reps.push(report(
                    &id(&r2),
                    match t {
                        ..130 => RentalState::Pulling,
                        130..1250 => RentalState::Running,
                        _ => RentalState::Exited,
                    },
                ));
                if t <= 160 {
                    reps.push(report(
                        &id(&r3),
                        if t < 160 { RentalState::Pulling } else { RentalState::Failed },
                    ));
                }
            }
            let _: HeartbeatResponse = api.heartbeat(&a.node_token, &beat(seq, "a", reps)).await.ok();
        }
        // B's beat, until it goes silent.
        if t <= 400 {
            let state = if t < 40 { RentalState::Pulling } else { RentalState::Running };
            let _: HeartbeatResponse =
                api.heartbeat(&b.node_token, &beat(seq, "b", vec![report(&id(&r4), state)])).await.ok();
        }
        // Bob's rental runs the whole time: none of it is Ann's.
        let _: HeartbeatResponse = api
            .heartbeat(&c.node_token, &beat(seq, "c", vec![report(&r5.spec.id, RentalState::Running)]))
            .await
            .ok();
        if t == 100 {
            r2 = Some(rent(&p, &api, &a.node_id, 1).await);
            r3 = Some(rent(&p, &api, &a.node_id, 1).await);
        }
        if t == 700 {
            p.delete_node(&b.node_id);
        }
        if t == 1540 {
            let _: RentalSummary =
                api.post_raw(&path_admin_rental_stop(&r1.spec.id), Some(p.admin_token()), "").await.ok();
        }
    }
    let (r2, r3, r4) = (r2.unwrap(), r3.unwrap(), r4.unwrap());
    assert_eq!(r2.price.as_ref().map(|x| x.per_gpu_hour), Some(20_000), "the price at its creation");
    // R1 keeps the price it was created with.
    let shown: RentalSummary = api
        .send(
            api.c.get(format!("{}{}", p.url(), path_admin_rental(&r1.spec.id))).bearer_auth(p.admin_token()),
        )
        .await
        .ok();
    assert_eq!(shown.price.map(|x| x.per_gpu_hour), Some(15_000));
    // B's deletion closed its run at its last heartbeat.
    let r4_runs: Vec<(i64, Option<i64>)> = p.with_db(|c| {
        c.prepare_cached("SELECT started_at, ended_at FROM rental_runs WHERE rental_id = ?1")
            .unwrap()
            .query_map(gpum_platform::params![r4.spec.id], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    });
    assert_eq!(r4_runs, [((T0 + 40) as i64, Some((T0 + 400) as i64))]);

    // The owner's figures.
    let (status, text) = get(&p, PATH_OWNER_EARNINGS, &key).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let e: Earnings = serde_json::from_str(&text).unwrap();
    assert_eq!((e.currency.code.as_str(), e.currency.minor_units), ("RUB", 2));
    let rentals: Vec<(&str, &str, u64, u64, Option<u64>)> = e
        .rentals
        .iter()
        .map(|r| (r.id.as_str(), r.state.as_str(), r.gpu_seconds, r.amount, r.price_per_gpu_hour))
        .collect();
    assert_eq!(rentals.len(), 4, "{rentals:?}");
    let of = |id: &str| *rentals.iter().find(|r| r.0 == id).unwrap_or_else(|| panic!("{id}: {rentals:?}"));
    assert_eq!(of(&r1.spec.id), (r1.spec.id.as_str(), "gone", 2460, 10_250, Some(15_000)));
    assert_eq!(of(&r2.spec.id), (r2.spec.id.as_str(), "exited", 820, 4556, Some(20_000)));
    assert_eq!(of(&r3.spec.id), (r3.spec.id.as_str(), "failed", 0, 0, Some(20_000)));
    assert_eq!(of(&r4.spec.id), (r4.spec.id.as_str(), "stopped", 360, 1000, Some(10_000)));
    assert_eq!((e.total.rentals, e.total.gpu_seconds, e.total.amount), (4, 3640, 15_806));
    let lines = |l: &[gpum_protocol::EarningsLine]| {
        l.iter().map(|x| (x.key.clone(), x.sum.rentals, x.sum.gpu_seconds, x.sum.amount)).collect::<Vec<_>>()
    };
    assert_eq!(
        lines(&e.days),
        [("2026-12-06".to_string(), 3, 1990, 8444), ("2026-12-07".to_string(), 2, 1650, 7362)]
    );
    assert_eq!(lines(&e.months), [("2026-12".to_string(), 3, 3640, 15_806)]);
    let mut servers = lines(&e.servers);
    servers.sort();
    let mut want = vec![(a.node_id.clone(), 3, 3280, 14_806), (b.node_id.clone(), 1, 360, 1000)];
    want.sort();
    assert_eq!(servers, want);
    assert!(e.owners.is_empty(), "the owner's view has no owners' lines");

    // The CSV: one line per rental, the currency named on each amount.
    let (status, csv) = get(&p, &format!("{PATH_OWNER_EARNINGS}?format=csv"), &key).await;
    assert_eq!(status, StatusCode::OK);
    let mut lines_csv = csv.split("\r\n");
    assert_eq!(
        lines_csv.next(),
        Some(
            "rental,server_id,server,image,gpus,created_at,state,gpu_hours,price_per_gpu_hour,amount,currency"
        )
    );
    let r2_line = csv.split("\r\n").find(|l| l.starts_with(&r2.spec.id)).expect(&csv);
    assert_eq!(
        r2_line,
        format!(
            "{},{},box-a,nvcr.io/nvidia/pytorch,1,2026-12-06T23:51:40Z,exited,0.2277,200.00,45.56,RUB",
            r2.spec.id, a.node_id
        )
    );
    assert_eq!(csv.split("\r\n").filter(|l| !l.is_empty()).count(), 5, "{csv}");

    // The cabinet's page, in each language, and its CSV download.
    for (lang, total, r2_amount) in
        [("en", "RUB\u{a0}158.06", "RUB\u{a0}45.56"), ("ru", "158,06\u{a0}₽", "45,56\u{a0}₽")]
    {
        let r = p
            .http_client()
            .get(format!("{}/dashboard/earnings", p.url()))
            .header("cookie", format!("{SESSION_COOKIE}={}; {LANG_COOKIE}={lang}", ann.session))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let page = r.text().await.unwrap();
        let total_line = gpum_tests::owner::text_of(&page, "earnings-total").expect(&page);
        assert!(total_line.contains(total), "{lang}: {total_line}");
        let row = page.split(&format!("id=\"earning-{}\"", r2.spec.id)).nth(1).expect(&page);
        let row = row.split("</tr>").next().unwrap();
        assert!(row.contains(r2_amount), "{lang}: {row}");
        assert!(!page.contains(&r5.spec.id), "another owner's rental");
    }
    let page = ann.get("/dashboard/earnings.csv").await;
    assert_eq!((page.status, page.body.as_str()), (StatusCode::OK, csv.as_str()));

    // The operator: the same for Ann, and a line per owner.
    let (status, text) =
        get(&p, &format!("{PATH_ADMIN_EARNINGS}?owner=ann@example.com"), p.admin_token()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let for_ann: Earnings = serde_json::from_str(&text).unwrap();
    assert_eq!(for_ann.total, e.total);
    let (_, text) = get(&p, PATH_ADMIN_EARNINGS, p.admin_token()).await;
    let all: Earnings = serde_json::from_str(&text).unwrap();
    let owners: Vec<(&str, u64)> = all.owners.iter().map(|o| (o.label.as_str(), o.sum.amount)).collect();
    // Bob's rental ran from T0+10 (its first beat) to T0+1560, on one GPU at 100.00.
    let bob = (1560 - 10) * 10_000 / 3600 + 1; // 4305.56 → 4306
    assert_eq!(owners, [("ann@example.com", 15_806), ("bob@example.com", bob)]);
    assert_eq!(all.total.amount, 15_806 + bob);
    // The owner's key cannot ask for another owner's.
    let (status, _) = get(&p, &format!("{PATH_OWNER_EARNINGS}?owner=x"), &key).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // The CLI: the same figures, in the currency.
    let v = p.cli_json(&["earnings", "--owner", "ann@example.com"]);
    let cli: Earnings = serde_json::from_value(v).unwrap();
    assert_eq!((cli.total.clone(), cli.days.clone()), (e.total.clone(), e.days.clone()));
    let human = p.cli(["earnings", "--owner", "ann@example.com"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("total: 4 rentals, 1.01 GPU-hours, 158.06 RUB"), "{human}");
    let csv_cli = p.cli(["earnings", "--owner", "ann@example.com", "--csv"]);
    assert_eq!(String::from_utf8_lossy(&csv_cli.stdout), csv);

    // The currency cannot change under priced rentals, and an unknown code is refused.
    let out = p.cli(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--currency", "USD"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the platform's currency is RUB") && err.contains("cannot become USD"), "{err}");
    let out = p.cli(["serve", "--listen", "127.0.0.1:0", "--insecure-http", "--currency", "rub"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ISO 4217"), "{:?}", out);
}

/// A currency without a minor unit (issue 46): yen are typed and shown whole, on the operator's
/// CLI and named beside the price; a price with decimals is refused with the currency's example.
#[tokio::test]
async fn a_currency_without_a_minor_unit_is_typed_whole() {
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec!["--currency".into(), "JPY".into()],
        ..PlatformOpts::insecure_http()
    });
    let api = Api::new(&p);
    let req = RegisterRequest {
        join_code: p.join_code(),
        agent_version: "0.1.0".into(),
        inventory: inventory("yen"),
        install_id: None,
    };
    let reg: RegisterResponse = api.post(gpum_protocol::PATH_REGISTER, None, &req).await.ok();
    let v = p.cli_json(&["nodes", "set", &reg.node_id, "--price", "1500"]);
    assert_eq!(v["price_per_gpu_hour"], 1500);
    let out = p.cli(["nodes", "set", &reg.node_id, "--price", "15.5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a price in JPY such as 1250"), "{err}");
    let list = p.cli(["nodes", "list"]);
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.contains("PRICE JPY") && list.contains(" 1500 "), "{list}");
    let line = p.cli(["nodes", "set", &reg.node_id, "--price", "2000"]);
    assert!(String::from_utf8_lossy(&line.stdout).contains("JPY 2000 per GPU-hour"), "{line:?}");
}
