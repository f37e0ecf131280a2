//! Issue 46, "Alerts": the real server over real HTTP, a real SMTP server (Python's aiosmtpd,
//! writing each message it takes into a maildir) and a webhook receiver on loopback. An owner
//! asks to be told when a server is offline for 5 minutes or quarantined, by e-mail (in
//! Russian) and by webhook; the platform's clock is moved past the 5 minutes, then the server
//! beats again. Exactly one e-mail and one webhook tell each opening and each end, and every
//! webhook body carries a valid Ed25519 signature by the key the platform publishes. On SQLite
//! and (with `GPUM_TEST_DB=postgres`) PostgreSQL, there with a second replica sweeping too.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use gpum_protocol::{
    ALERT_SIGNATURE_HEADER, AlertChannel, AlertDelivery, AlertKind, AlertPublicKey, AlertSettings,
    AlertSettingsView, AlertState, AlertWebhook, HeartbeatRequest, HeartbeatResponse, PATH_ALERTS_PUBLIC_KEY,
    PATH_OWNER_ALERTS, Quarantine, RegisterRequest, RegisterResponse,
};
use gpum_tests::owner::OwnerSession;
use gpum_tests::platform::{PlatformOpts, TestPlatform};

use super::{Api, beat, inventory};

const PW: &str = "correct horse battery";
const T0: u64 = 1_796_601_000;

/// A real SMTP server: aiosmtpd (the Debian package python3-aiosmtpd, tests/setup-deps.sh)
/// with its `Mailbox` handler, which writes every message it accepts into a maildir.
struct Smtp {
    child: std::process::Child,
    port: u16,
    maildir: PathBuf,
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The Python that has aiosmtpd: Debian's (its package installs there), else the one on PATH.
fn python() -> &'static str {
    for p in ["/usr/bin/python3", "python3"] {
        let ok =
            std::process::Command::new(p).args(["-c", "import aiosmtpd"]).status().is_ok_and(|s| s.success());
        if ok {
            return p;
        }
    }
    panic!("no python3 with aiosmtpd: install python3-aiosmtpd (tests/setup-deps.sh)");
}

impl Smtp {
    fn start(dir: &Path) -> Smtp {
        let maildir = dir.join("maildir");
        let port = free_port();
        let child = std::process::Command::new(python())
            .args([
                "-m",
                "aiosmtpd",
                "-n",
                "-l",
                &format!("127.0.0.1:{port}"),
                "-c",
                "aiosmtpd.handlers.Mailbox",
            ])
            .arg(&maildir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start aiosmtpd");
        let end = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < end, "aiosmtpd did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Smtp { child, port, maildir }
    }

    /// Each message taken so far: (subject, text), decoded by Python's `email` package.
    fn messages(&self) -> Vec<(String, String, String)> {
        let Ok(dir) = std::fs::read_dir(self.maildir.join("new")) else { return Vec::new() };
        let mut out: Vec<_> = dir
            .map(|e| {
                let o = std::process::Command::new(python())
                    .args([
                        "-c",
                        "import email, email.policy, sys\n\
                         m = email.message_from_binary_file(open(sys.argv[1], 'rb'), policy=email.policy.default)\n\
                         print(m['to']); print(m['subject']); print(m.get_content(), end='')",
                    ])
                    .arg(e.unwrap().path())
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                let text = String::from_utf8(o.stdout).unwrap();
                let mut l = text.splitn(3, '\n');
                (l.next().unwrap().to_owned(), l.next().unwrap().to_owned(), l.next().unwrap_or("").to_owned())
            })
            .collect();
        out.sort_by(|a, b| a.1.cmp(&b.1));
        out
    }
}

/// One request the webhook receiver took: its signature header and body.
type Hook = (String, Vec<u8>);

/// A webhook receiver on loopback: HTTP/1.1, one request per connection, answered 204.
async fn receiver() -> (String, Arc<Mutex<Vec<Hook>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/gpum-hook", l.local_addr().unwrap());
    let got: Arc<Mutex<Vec<Hook>>> = Arc::default();
    let g = got.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            let g = g.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, len) = loop {
                    let n = s.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the request ended early");
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8(buf[..i].to_vec()).unwrap();
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap())
                            })
                            .unwrap_or(0);
                        buf.drain(..i + 4);
                        break (head, len);
                    }
                };
                while buf.len() < len {
                    let n = s.read(&mut chunk).await.unwrap();
                    assert!(n > 0);
                    buf.extend_from_slice(&chunk[..n]);
                }
                assert!(head.starts_with("POST /gpum-hook HTTP/1.1"), "{head}");
                let sig = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case(ALERT_SIGNATURE_HEADER).then(|| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                g.lock().unwrap().push((sig, buf));
                let _ = s.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n").await;
            });
        }
    });
    (url, got)
}

/// Checks `Gpum-Signature: t=…,ed25519=…` over `t.body` with the published key.
fn verify(public_key: &[u8], sig: &str, body: &[u8]) {
    let (t, s) = sig
        .strip_prefix("t=")
        .and_then(|r| r.split_once(",ed25519="))
        .unwrap_or_else(|| panic!("signature header {sig:?}"));
    let s = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    let mut msg = format!("{t}.").into_bytes();
    msg.extend_from_slice(body);
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public_key)
        .verify(&msg, &s)
        .unwrap_or_else(|_| panic!("the signature {sig:?} does not verify"));
    // A body changed by one byte does not.
    let mut bad = msg.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert!(
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public_key)
            .verify(&bad, &s)
            .is_err()
    );
}

/// Polls `f` until it holds (the sweeper runs every second); panics with `what` after 30 s.
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_owner_is_told_once_by_email_and_signed_webhook_when_a_server_goes_offline_and_once_when_it_is_back()
 {
    let dir = tempfile::tempdir().unwrap();
    let smtp = Smtp::start(dir.path());
    let smtp_file = dir.path().join("smtp.toml");
    std::fs::write(
        &smtp_file,
        format!(
            "host = \"127.0.0.1\"\nport = {}\nfrom = \"gpum <alerts@gpum.test>\"\ntls = \"none\"\n",
            smtp.port
        ),
    )
    .unwrap();
    let key_file = dir.path().join("alert-key.pem");
    let (hook_url, hooks) = receiver().await;
    let p = TestPlatform::start(PlatformOpts {
        extra_args: vec![
            "--smtp".into(),
            smtp_file.display().to_string(),
            "--alert-key-file".into(),
            key_file.display().to_string(),
            "--alert-sweep-secs".into(),
            "1".into(),
        ],
        ..Default::default()
    });
    // Made at the first start, readable by its owner only.
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // On PostgreSQL a second replica sweeps the same database, with the same key and SMTP server:
    // each notice is still sent once.
    let replica = (p.engine() == gpum_platform::sql::Engine::Postgres).then(|| p.replica());
    let set_clock = |t: u64| {
        p.set_clock(t);
        if let Some(r) = &replica {
            r.set_clock(t);
        }
    };
    let api = Api::new(&p);
    set_clock(T0);
    let ann = OwnerSession::accept(&p, &p.invite_owner("ann@example.com"), PW).await;
    let key = ann.create_api_key("alerts").await;
    let c = p.http_client();
    let put =
        |s: &AlertSettings| c.put(format!("{}{PATH_OWNER_ALERTS}", p.url())).bearer_auth(&key).json(s).send();
    // The account page's form: a refused field keeps what was typed, with the error beside it.
    let page = ann
        .post(
            "/dashboard/account/alerts",
            &[
                ("email", "ann@example.com"),
                ("webhook_url", "http://hooks.example.com/x"),
                ("offline_minutes", "7"),
                ("kind_offline", "on"),
            ],
        )
        .await;
    assert_eq!(page.status, 400, "{}", page.body);
    assert!(page.body.contains("id=\"alert-webhook-error\""), "{}", page.body);
    assert!(page.body.contains("value=\"http://hooks.example.com/x\"") && page.body.contains("value=\"7\""));
    assert!(!page.body.contains("id=\"alert-email-error\""));
    let page = ann
        .post(
            "/dashboard/account/alerts",
            &[("email", "ann@example.com"), ("offline_minutes", "7"), ("kind_offline", "on")],
        )
        .await;
    assert_eq!((page.status.as_u16(), page.location.as_deref()), (303, Some("/dashboard/account#alerts")));
    let page = ann.get("/dashboard/account").await;
    assert!(page.body.contains("value=\"7\"") && page.body.contains("id=\"alerts-none\""), "{}", page.body);
    // A plain-http webhook to somewhere else than loopback is refused with the reason.
    let bad = AlertSettings { webhook_url: Some("http://hooks.example.com/x".into()), ..Default::default() };
    let r = put(&bad).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("https"));
    let settings = AlertSettings {
        email: Some("ann@example.com".into()),
        webhook_url: Some(hook_url.clone()),
        offline_minutes: 5,
        kinds: vec![AlertKind::Offline, AlertKind::Quarantined],
        language: "ru".into(),
    };
    let r = put(&settings).await.unwrap();
    assert_eq!(r.status(), 200);
    let view: AlertSettingsView = r.json().await.unwrap();
    assert_eq!(view.settings, settings);
    assert!(view.email_available);
    let published: AlertPublicKey =
        c.get(format!("{}{PATH_ALERTS_PUBLIC_KEY}", p.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(published.algorithm, "ed25519");
    assert_eq!(view.webhook_public_key.as_deref(), Some(published.public_key.as_str()));
    let public_key = base64::engine::general_purpose::STANDARD.decode(&published.public_key).unwrap();

    // A server of Ann's beats at T0.
    let reg: RegisterResponse = api
        .post(
            gpum_protocol::PATH_REGISTER,
            None,
            &RegisterRequest {
                join_code: p.owner_join_code("ann@example.com"),
                agent_version: "0.1.0".into(),
                inventory: inventory("GPU-alert"),
                install_id: None,
            },
        )
        .await
        .ok();
    let hb = |seq: u64, quarantine: Option<Quarantine>| HeartbeatRequest {
        quarantine,
        inventory_hash: inventory("GPU-alert").hash(),
        ..beat(seq)
    };
    let _: HeartbeatResponse = api.heartbeat(&reg.node_token, &hb(1, None)).await.ok();

    // Offline for the platform after a minute, but Ann said five: nothing yet. Then past five.
    set_clock(T0 + 120);
    set_clock(T0 + 5 * 60 + 1);
    let mails = until("the offline e-mail", || Some(smtp.messages()).filter(|m| !m.is_empty())).await;
    let got =
        until("the offline webhook", || Some(hooks.lock().unwrap().clone()).filter(|h| !h.is_empty())).await;
    assert_eq!(mails.len(), 1, "{mails:?}");
    let (to, subject, text) = &mails[0];
    assert_eq!(to, "ann@example.com");
    assert_eq!(subject, "gpum: сервер owner-box не на связи");
    assert!(text.contains(&reg.node_id) && text.contains("Оповещения настраиваются"), "{text}");
    assert_eq!(got.len(), 1);
    verify(&public_key, &got[0].0, &got[0].1);
    let w: AlertWebhook = serde_json::from_slice(&got[0].1).unwrap();
    assert_eq!(
        (w.node.as_str(), w.kind, w.state, w.at),
        (reg.node_id.as_str(), AlertKind::Offline, AlertState::Opened, T0 + 301)
    );

    // Back: one beat ends the incident, told once on each channel.
    set_clock(T0 + 600);
    let _: HeartbeatResponse = api.heartbeat(&reg.node_token, &hb(2, None)).await.ok();
    until("the ended e-mail", || Some(()).filter(|_| smtp.messages().len() >= 2)).await;
    until("the ended webhook", || Some(()).filter(|_| hooks.lock().unwrap().len() >= 2)).await;
    let mails = smtp.messages();
    assert!(mails.iter().any(|m| m.1 == "gpum: сервер owner-box снова на связи"), "{mails:?}");
    let closed = hooks.lock().unwrap()[1].clone();
    verify(&public_key, &closed.0, &closed.1);
    let w2: AlertWebhook = serde_json::from_slice(&closed.1).unwrap();
    assert_eq!((w2.incident.as_str(), w2.state, w2.at), (w.incident.as_str(), AlertState::Closed, T0 + 600));

    // Quarantined by its agent, then lifted: one more incident, told the same way.
    let q = Quarantine {
        reason: "GPU GPU-alert: 1 process left".into(),
        since: T0 + 610,
        gpu_uuids: vec!["GPU-alert".into()],
    };
    set_clock(T0 + 610);
    let _: HeartbeatResponse = api.heartbeat(&reg.node_token, &hb(3, Some(q))).await.ok();
    until("the quarantine's notices", || {
        Some(()).filter(|_| hooks.lock().unwrap().len() >= 3 && smtp.messages().len() >= 3)
    })
    .await;
    set_clock(T0 + 620);
    let _: HeartbeatResponse = api.heartbeat(&reg.node_token, &hb(4, None)).await.ok();
    until("the quarantine's end", || {
        Some(()).filter(|_| hooks.lock().unwrap().len() >= 4 && smtp.messages().len() >= 4)
    })
    .await;

    // A few more sweeps send nothing more; the owner's view lists every notice, delivered.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let view: AlertSettingsView = c
        .get(format!("{}{PATH_OWNER_ALERTS}", p.url()))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mails = smtp.messages();
    let subjects: Vec<&str> = mails.iter().map(|m| m.1.as_str()).collect();
    assert_eq!(
        subjects,
        [
            "gpum: сервер owner-box на карантине",
            "gpum: сервер owner-box не на связи",
            "gpum: сервер owner-box снова на связи",
            "gpum: сервер owner-box снят с карантина",
        ]
    );
    let hooks = hooks.lock().unwrap().clone();
    assert_eq!(hooks.len(), 4);
    let told: Vec<(AlertKind, AlertState)> = hooks
        .iter()
        .map(|(sig, body)| {
            verify(&public_key, sig, body);
            let w: AlertWebhook = serde_json::from_slice(body).unwrap();
            (w.kind, w.state)
        })
        .collect();
    assert_eq!(
        told,
        [
            (AlertKind::Offline, AlertState::Opened),
            (AlertKind::Offline, AlertState::Closed),
            (AlertKind::Quarantined, AlertState::Opened),
            (AlertKind::Quarantined, AlertState::Closed),
        ]
    );
    assert_eq!(view.sent.len(), 8, "{:?}", view.sent);
    assert!(
        view.sent.iter().all(|n| n.delivery == AlertDelivery::Delivered && n.node_name == "owner-box"),
        "{:?}",
        view.sent
    );
    for ch in [AlertChannel::Email, AlertChannel::Webhook] {
        assert_eq!(view.sent.iter().filter(|n| n.channel == ch).count(), 4);
    }
    // The account page lists them, and shows the key to check the webhooks with.
    let page = ann.get("/dashboard/account").await;
    assert_eq!(page.body.matches("data-delivery=\"delivered\"").count(), 8, "{}", page.body);
    assert!(page.body.contains(&published.public_key));
}
