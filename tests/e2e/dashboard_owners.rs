//! Issue 32: an owner's account in headless Chromium, in both languages, each at 1280 px and 360 px:
//! the invitation link sets a password and signs in; the sign-in form never asks for the admin
//! token; the second factor is turned on with a code from the key the page shows (computed here
//! with `totp-rs`, as an authenticator app would); sign-in then needs a code, and a code works
//! once; an API key is shown once, works on the owner API and stops when revoked.

use std::time::{SystemTime, UNIX_EPOCH};

use gpum_protocol::PATH_OWNER_NODES;
use gpum_tests::browser::Browser;
use gpum_tests::platform::{PlatformOpts, TestPlatform};
use totp_rs::{Algorithm, Secret, TOTP};

use super::type_into;

const PASSWORD: &str = "a long enough password";

/// The code an authenticator app shows for `secret` (base32) at `at` (Unix seconds).
fn app_code(secret: &str, at: u64) -> String {
    let bytes = Secret::Encoded(secret.to_owned()).to_bytes().expect("a base32 key");
    TOTP::new(Algorithm::SHA1, 6, 1, 30, bytes).expect("a TOTP").generate(at)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Waits until `css` exists and its text contains `want`.
async fn wait_contains(b: &Browser, css: &str, want: &str) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        if b.has(css).await && b.text(css).await.contains(want) {
            return;
        }
        assert!(std::time::Instant::now() < end, "{css} never said {want:?}; page:\n{}", b.body_text().await);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Nothing wider than the window, nothing cut at its edge, no word squeezed into a narrower
/// cell ([`super::misfits`]).
async fn fits(b: &Browser, what: &str) {
    let bad = super::misfits(b).await;
    assert!(bad.is_empty(), "{what}: {bad:?}");
}

async fn owner_api_status(p: &TestPlatform, key: &str) -> u16 {
    p.http_client()
        .get(format!("{}{PATH_OWNER_NODES}", p.url()))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[ignore = "needs chromium and chromedriver"]
#[tokio::test(flavor = "multi_thread")]
async fn an_owner_joins_by_invitation_turns_on_totp_and_manages_api_keys_in_both_languages() {
    for (lang, width) in [("ru", 360), ("en", 1280), ("ru", 1280), ("en", 360)] {
        let p = TestPlatform::start(PlatformOpts::insecure_http());
        let email = format!("owner-{lang}@example.com");
        let link = p.invite_owner(&email);
        let b = Browser::start("an_owner_joins_by_invitation", lang).await;
        b.client.set_window_size(width, 800).await.unwrap();
        let says = |ru: &'static str, en: &'static str| if lang == "ru" { ru } else { en };

        // The invitation: a short password is refused with why, then a good one signs in.
        b.goto(&link).await;
        assert!(b.text("main").await.contains(&email));
        fits(&b, "the invitation").await;
        type_into(&b, "#password", "short").await;
        type_into(&b, "#again", "short").await;
        b.click("#set-password").await;
        wait_contains(&b, "#invite-error", says("не короче 12 символов", "at least 12 characters")).await;
        type_into(&b, "#password", PASSWORD).await;
        type_into(&b, "#again", PASSWORD).await;
        b.click("#set-password").await;
        b.wait_for("#nav-account").await;
        assert!(b.url().await.ends_with("/dashboard"), "{}", b.url().await);
        // The link worked once.
        b.goto(&link).await;
        b.wait_for("#invite-gone").await;
        assert!(b.text("#invite-gone").await.contains(says("недействительна", "no longer works")));

        // The account page: the second factor, from the key the page shows.
        b.goto(&format!("{}/dashboard/account", p.url())).await;
        assert_eq!(b.find("#totp-state").await.attr("data-on").await.unwrap().as_deref(), Some("false"));
        assert!(b.text("#signed-in-as").await.contains(&email));
        fits(&b, "the account page").await;
        // Turning it on takes the password (issue 43).
        type_into(&b, "#totp-on-password", "not the password").await;
        b.click("#totp-turn-on").await;
        wait_contains(&b, "#account-error", says("Неверный пароль или код", "Wrong password or code")).await;
        type_into(&b, "#totp-on-password", PASSWORD).await;
        b.click("#totp-turn-on").await;
        b.wait_for("#totp-secret").await;
        let secret = b.text("#totp-secret").await;
        assert!(b.text("#totp-link").await.starts_with("otpauth://totp/gpum%3A"));
        // The QR code is drawn (inline SVG under the page's CSP), large enough to scan.
        let qr = b.js("const s = document.querySelector('#totp-qr svg'); return s ? s.getBoundingClientRect().width : 0").await;
        assert!(qr.as_f64().unwrap_or(0.0) >= 150.0, "{qr}");
        fits(&b, "the second factor's page").await;
        type_into(&b, "#code", "000000").await;
        b.click("#totp-confirm-button").await;
        wait_contains(&b, "#totp-error", says("Код не подошёл", "The code did not match")).await;
        let t = now();
        type_into(&b, "#code", &app_code(&secret, t)).await;
        b.click("#totp-confirm-button").await;
        // The recovery codes, shown once.
        b.wait_for("#recovery-codes").await;
        assert!(b.text("main").await.contains(says("Коды восстановления", "Recovery codes")));
        fits(&b, "the recovery codes").await;
        b.click("#to-account").await;
        b.wait_for("#totp-state[data-on='true']").await;
        assert!(b.has("#totp-off-password").await && b.has("#totp-off-code").await, "off needs both");
        assert!(b.text("#totp-state").await.contains(says("Включён", "On")));

        // Signed out, the password alone is not enough; with the app's code it is, once.
        b.click("#sign-out").await;
        b.wait_for("#login").await;
        assert!(!b.has("#token").await, "the owners' form never asks for the admin token");
        fits(&b, "the sign-in form").await;
        type_into(&b, "#email", &email).await;
        type_into(&b, "#password", PASSWORD).await;
        b.click("#sign-in").await;
        wait_contains(
            &b,
            "#login-error",
            says("Неверный адрес, пароль или код", "Wrong e-mail, password or code"),
        )
        .await;
        // The next step's code: the one used to turn it on is spent.
        let code = app_code(&secret, t + 30);
        type_into(&b, "#password", PASSWORD).await;
        type_into(&b, "#code", &code).await;
        b.click("#sign-in").await;
        b.wait_for("#nav-account").await;
        b.click("#sign-out").await;
        b.wait_for("#login").await;
        type_into(&b, "#email", &email).await;
        type_into(&b, "#password", PASSWORD).await;
        type_into(&b, "#code", &code).await;
        b.click("#sign-in").await;
        b.wait_for("#login-error").await;
        assert!(!b.has("#nav-account").await, "a code works once");
        // A minute later (the platform's test clock), the app's new code signs in.
        p.advance_clock(60);
        type_into(&b, "#password", PASSWORD).await;
        type_into(&b, "#code", &app_code(&secret, now() + 60)).await;
        b.click("#sign-in").await;
        b.wait_for("#nav-account").await;

        // An API key: shown once, works, revoked stops.
        b.goto(&format!("{}/dashboard/account", p.url())).await;
        assert!(b.has("#no-keys").await);
        type_into(&b, "#label", "ci <script>").await;
        b.click("#create-key").await;
        b.wait_for("#api-key").await;
        let key = b.text("#api-key").await;
        assert!(key.starts_with("gpumk_") && key.len() == 70, "{key}");
        fits(&b, "the new key's page").await;
        assert_eq!(owner_api_status(&p, &key).await, 200);
        b.click("#to-account").await;
        b.wait_for("#keys").await;
        assert_eq!(b.text("#keys .label").await, "ci <script>", "a label is text");
        assert!(!b.body_text().await.contains(&key), "the key is never shown again");
        fits(&b, "the account page with a key").await;
        b.click("#keys button.danger").await;
        b.wait_for("#no-keys").await;
        assert_eq!(owner_api_status(&p, &key).await, 401);
        // The owner's servers page is empty, and says how to add one.
        b.goto(&format!("{}/dashboard", p.url())).await;
        b.wait_for("#nav-add").await;
        fits(&b, "the empty servers page").await;
        b.close().await;
    }
}
