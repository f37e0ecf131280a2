//! Issue 32: screenshots of every page and state of the owner's cabinet, full height, in both
//! languages, and of the main pages on a phone (360 px), taken as an owner signs in (and one of
//! the operator's view). Written into `docs/screenshots/` when `GPUM_WRITE_SCREENSHOTS=1`, into a
//! temporary directory otherwise; each state is asserted before it is shot, so a picture never
//! shows something else than its name says.

use gpum_protocol::{
    Inventory, PATH_REGISTER, ProbeFailure, ProbeReport, RegisterRequest, RegisterResponse, VerificationState,
};
use gpum_tests::browser::Browser;
use gpum_tests::platform::{PlatformOpts, TestPlatform};

use super::{DIST_FILES, LIVE, beat_with, figures, misfits, sample_inventory, served_dist, shoot, type_into};

const PASSWORD: &str = "a long enough password";

async fn register_with(p: &TestPlatform, code: String, inventory: Inventory) -> RegisterResponse {
    let req = RegisterRequest { join_code: code, agent_version: "0.1.0".into(), inventory, install_id: None };
    let resp = p.http_client().post(format!("{}{PATH_REGISTER}", p.url())).json(&req).send().await.unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    resp.json().await.unwrap()
}

fn report(state: VerificationState, reason: Option<ProbeFailure>, output: &str) -> ProbeReport {
    ProbeReport { state, reason, output: output.into(), finished_at: 1, image: "img".into() }
}

/// Waits until the element's `data-state` (the rentable verdict) is `want`.
async fn verdict(b: &Browser, css: &str, want: &str) {
    b.wait_attr(css, "data-state", &[want], LIVE).await;
}

#[ignore = "needs chromium and chromedriver"]
#[tokio::test(flavor = "multi_thread")]
async fn screenshots_of_every_page_and_state_full_height_in_both_languages_and_on_a_phone() {
    let keep = std::env::var("GPUM_WRITE_SCREENSHOTS").as_deref() == Ok("1");
    let tmp = tempfile::tempdir().unwrap();
    let dir =
        if keep { gpum_tests::workspace_root().join("docs/screenshots") } else { tmp.path().to_path_buf() };
    std::fs::create_dir_all(&dir).unwrap();
    for lang in ["ru", "en"] {
        let dist = served_dist(&DIST_FILES);
        let p = TestPlatform::start(PlatformOpts {
            dist: Some(dist.path().to_owned()),
            ..PlatformOpts::insecure_http()
        });
        p.set_probe_image(&format!("registry.example/probe@sha256:{}", "0".repeat(64)));
        let email = format!("owner-{lang}@example.com");
        let link = p.invite_owner(&email);
        let b = Browser::start("screenshots_of_every_page_and_state", lang).await;
        b.client.set_window_size(1280, 800).await.unwrap();
        let url = p.url().to_owned();

        // The invitation, then the owner's empty list.
        b.goto(&link).await;
        b.wait_for("#set-password").await;
        shoot(&b, &dir, &format!("invitation.{lang}")).await;
        type_into(&b, "#password", PASSWORD).await;
        type_into(&b, "#again", PASSWORD).await;
        b.click("#set-password").await;
        b.wait_for("#no-servers").await;
        shoot(&b, &dir, &format!("servers-empty.{lang}")).await;

        // A code: the join page, waiting for the machine.
        b.click("#nav-add").await;
        b.wait_for("#create").await;
        b.click("#create").await;
        b.wait_for("#join-code").await;
        assert_eq!(b.wait_attr("#join-state", "data-state", &["waiting"], LIVE).await, "waiting");
        shoot(&b, &dir, &format!("join-waiting.{lang}")).await;

        // Five servers of this owner, one per state.
        let owner_code = || p.owner_join_code(&email);
        let inv_ok = sample_inventory("rack-1", &["GPU-a1", "GPU-a2"]);
        let ok = register_with(&p, owner_code(), inv_ok.clone()).await;
        let inv_bad = sample_inventory("rack-2", &["GPU-b1"]);
        let bad = register_with(&p, owner_code(), inv_bad.clone()).await;
        let inv_paused = sample_inventory("rack-3", &["GPU-c1"]);
        let paused = register_with(&p, owner_code(), inv_paused.clone()).await;
        let inv_wait = sample_inventory("rack-4", &["GPU-d1"]);
        let waiting = register_with(&p, owner_code(), inv_wait.clone()).await;
        let inv_off = sample_inventory("rack-5", &["GPU-e1"]);
        let off = register_with(&p, owner_code(), inv_off.clone()).await;
        let passed = || {
            Some(report(
                VerificationState::Verified,
                None,
                "NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: 12.4",
            ))
        };
        // The offline one was seen once, two minutes ago.
        beat_with(&p, &off.node_token, 1, &inv_off, figures(5), |r| r.probe = passed()).await;
        p.advance_clock(120);
        for i in 0..3u64 {
            beat_with(&p, &ok.node_token, 1 + i, &inv_ok, figures(40 + 20 * i as u32), |r| {
                r.probe = passed()
            })
            .await;
        }
        beat_with(&p, &bad.node_token, 1, &inv_bad, figures(0), |r| {
            r.probe = Some(report(
                VerificationState::Failed,
                Some(ProbeFailure::NoNvidiaRuntime),
                "docker: Error response from daemon: unknown or invalid runtime name: nvidia.",
            ))
        })
        .await;
        beat_with(&p, &paused.node_token, 1, &inv_paused, figures(0), |r| r.probe = passed()).await;
        beat_with(&p, &waiting.node_token, 1, &inv_wait, figures(0), |_| {}).await;
        for id in [&ok.node_id, &paused.node_id] {
            let out = p.cli(["nodes", "set", id, "--price", "1.20"]);
            assert!(out.status.success(), "{out:?}");
        }
        let out = p.cli(["nodes", "set", &paused.node_id, "--pause"]);
        assert!(out.status.success(), "{out:?}");

        b.goto(&format!("{url}/dashboard")).await;
        let row = |id: &str| format!("tr.server[data-node='{id}'] td.rentable [data-state]");
        for (id, state) in [
            (&ok.node_id, "rentable"),
            (&bad.node_id, "check_failed"),
            (&paused.node_id, "paused"),
            (&waiting.node_id, "awaiting_check"),
            (&off.node_id, "offline"),
        ] {
            verdict(&b, &row(id), state).await;
        }
        shoot(&b, &dir, &format!("servers-states.{lang}")).await;
        for (id, name) in [
            (&ok.node_id, "server-rentable"),
            (&bad.node_id, "server-failed"),
            (&paused.node_id, "server-paused"),
            (&off.node_id, "server-offline"),
        ] {
            b.goto(&format!("{url}/dashboard/servers/{id}")).await;
            b.wait_for("#rentable").await;
            shoot(&b, &dir, &format!("{name}.{lang}")).await;
        }

        // The account: the second factor's setup, a new key, the page with it.
        b.goto(&format!("{url}/dashboard/account")).await;
        type_into(&b, "#totp-on-password", PASSWORD).await;
        b.click("#totp-turn-on").await;
        b.wait_for("#totp-secret").await;
        shoot(&b, &dir, &format!("account-totp.{lang}")).await;
        b.goto(&format!("{url}/dashboard/account")).await;
        type_into(&b, "#label", "ci").await;
        b.click("#create-key").await;
        b.wait_for("#api-key").await;
        shoot(&b, &dir, &format!("account-key.{lang}")).await;
        b.click("#to-account").await;
        b.wait_for("#keys").await;
        shoot(&b, &dir, &format!("account.{lang}")).await;

        // A phone: the list, a server, the account.
        b.client.set_window_size(360, 800).await.unwrap();
        for (path, name) in [
            ("/dashboard".to_owned(), "servers-states"),
            (format!("/dashboard/servers/{}", bad.node_id), "server-failed"),
            ("/dashboard/account".to_owned(), "account"),
        ] {
            b.goto(&format!("{url}{path}")).await;
            b.wait_for("main h1").await;
            let bad = misfits(&b).await;
            assert!(bad.is_empty(), "{name} at 360 px: {bad:?}");
            shoot(&b, &dir, &format!("{name}.phone.{lang}")).await;
        }
        b.client.set_window_size(1280, 800).await.unwrap();

        // Signed out: the owners' sign-in form.
        b.click("#sign-out").await;
        b.wait_for("#login").await;
        assert!(!b.has("#token").await, "the owners' form (sign-in.{{ru,en}}.png) asks no admin token");

        // The operator's view: every owner's servers, with whose each is.
        b.goto(&format!("{url}/dashboard/operator")).await;
        b.find("#token").await.send_keys(p.admin_token()).await.unwrap();
        b.click("#sign-in").await;
        b.wait_for("#nav-operator").await;
        b.wait_for("span.owner").await;
        assert!(b.text("span.owner").await.contains(&email));
        shoot(&b, &dir, &format!("operator-servers.{lang}")).await;
        b.close().await;
    }
}
