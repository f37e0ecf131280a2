//! Alerts to owners (issue 46): the sweeper and its two channels.
//!
//! [`sweeper`] runs in every replica, every `--alert-sweep-secs`: it sweeps the owners with
//! alert settings a page at a time (`store::sweep_owners`, which asks the pure rule
//! `gpum_platform_core::alerts::decide` and writes incidents and the notices they owe), then
//! claims the unsent notices (`store::claim_notices`: a conditional update, so each is sent by
//! one replica at most) and sends them: e-mail through the SMTP server the operator configured
//! (`serve --smtp FILE`, [`SmtpConfig`]; lettre over rustls), and a webhook, a JSON body signed
//! with the platform's Ed25519 key (`serve --alert-key-file FILE`, [`SigningKey`]; the owner
//! verifies it with the public key at `gpum_protocol::PATH_ALERTS_PUBLIC_KEY`, no shared
//! secret). A notice that fails is recorded as failed and not retried.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use gpum_common::Lang;
use gpum_protocol::{AlertChannel, AlertDelivery, AlertKind, AlertState, AlertWebhook};
use lettre::AsyncTransport as _;
use ring::signature::KeyPair as _;

use crate::server::AppState;
use crate::store::{self, ClaimedNotice};
use crate::web::i18n::{Msg, fill};

/// Owners read per page of a sweep, and notices claimed per round.
const PAGE: i64 = 100;
/// How long a webhook may take, connection included.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an SMTP exchange may take.
const SMTP_TIMEOUT: Duration = Duration::from_secs(20);

/// What the platform can send alerts with; both optional.
#[derive(Default)]
pub struct Alerts {
    pub smtp: Option<Smtp>,
    pub key: Option<SigningKey>,
    /// Between two sweeps.
    pub sweep_every: Duration,
}

impl Alerts {
    pub fn channels(&self) -> store::Channels {
        store::Channels { email: self.smtp.is_some(), webhook: self.key.is_some() }
    }
}

/// `serve --smtp FILE`: a TOML file. `password` only in a file no one else may read (0600).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SmtpFile {
    host: String,
    #[serde(default)]
    port: Option<u16>,
    /// The `From:` of every alert, e.g. `gpum <alerts@gpum.example>`.
    from: String,
    /// `starttls` (default, port 587), `tls` (port 465), or `none` (a loopback host only).
    #[serde(default)]
    tls: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The SMTP server alerts are sent through.
pub struct Smtp {
    transport: lettre::AsyncSmtpTransport<lettre::Tokio1Executor>,
    from: lettre::message::Mailbox,
    /// For the start's log line: host, port and TLS mode (never the credentials).
    pub describe: String,
}

/// Reads `serve --smtp FILE`.
pub fn load_smtp(path: &Path) -> Result<Smtp> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let f: SmtpFile =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("--smtp {}: {}", path.display(), e.message()))?;
    if f.password.is_some() {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode();
        if mode & 0o077 != 0 {
            bail!(
                "--smtp {}: it holds a password and others than its owner may read it (mode {:o}); make it 0600",
                path.display(),
                mode & 0o777
            );
        }
    }
    let from: lettre::message::Mailbox =
        f.from.parse().map_err(|e| anyhow::anyhow!("--smtp {}: from {:?}: {e}", path.display(), f.from))?;
    use lettre::transport::smtp::client::{Tls, TlsParameters};
    let tls_mode = f.tls.as_deref().unwrap_or("starttls");
    let loopback =
        f.host == "localhost" || f.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let params =
        || TlsParameters::new(f.host.clone()).map_err(|e| anyhow::anyhow!("--smtp: TLS for {}: {e}", f.host));
    let (tls, default_port) = match tls_mode {
        "starttls" => (Tls::Required(params()?), 587),
        "tls" => (Tls::Wrapper(params()?), 465),
        "none" if loopback => (Tls::None, 25),
        "none" => bail!(
            "--smtp {}: tls = \"none\" is allowed only to a loopback host, not {}",
            path.display(),
            f.host
        ),
        other => bail!("--smtp {}: tls = {other:?}: starttls, tls or none", path.display()),
    };
    let port = f.port.unwrap_or(default_port);
    let mut b = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::builder_dangerous(f.host.clone())
        .port(port)
        .tls(tls)
        .timeout(Some(SMTP_TIMEOUT));
    match (f.username, f.password) {
        (Some(u), Some(p)) => {
            b = b.credentials(lettre::transport::smtp::authentication::Credentials::new(u, p));
        }
        (None, None) => {}
        _ => bail!("--smtp {}: give both username and password, or neither", path.display()),
    }
    Ok(Smtp { transport: b.build(), from, describe: format!("{}:{port} ({tls_mode})", f.host) })
}

/// The platform's Ed25519 key that signs webhook bodies.
pub struct SigningKey {
    pair: ring::signature::Ed25519KeyPair,
    /// The raw public key, base64.
    pub public_b64: String,
}

const KEY_LABEL: &str = "PRIVATE KEY";

/// Reads `serve --alert-key-file FILE` (PKCS#8, PEM), or makes a new key there (0600 from its
/// creation) when the file does not exist. A key file others may read is refused.
pub fn load_or_create_key(path: &Path) -> Result<SigningKey> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let b64 = base64::engine::general_purpose::STANDARD;
    if !path.exists() {
        let der = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
            .map_err(|_| anyhow::anyhow!("make an Ed25519 key"))?;
        let pem =
            format!("-----BEGIN {KEY_LABEL}-----\n{}\n-----END {KEY_LABEL}-----\n", b64.encode(der.as_ref()));
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("create {}", path.display()))?;
        f.write_all(pem.as_bytes())?;
        f.sync_all()?;
        tracing::info!(file = %path.display(), "made a new alert signing key");
    }
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "--alert-key-file {}: others than its owner may read it (mode {:o}); make it 0600",
            path.display(),
            mode & 0o777
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = b64
        .decode(body.trim())
        .map_err(|_| anyhow::anyhow!("--alert-key-file {}: not a PEM key", path.display()))?;
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
        .map_err(|_| anyhow::anyhow!("--alert-key-file {}: not an Ed25519 key (PKCS#8)", path.display()))?;
    let public_b64 = b64.encode(pair.public_key().as_ref());
    Ok(SigningKey { pair, public_b64 })
}

impl SigningKey {
    /// The `Gpum-Signature` header's value for `body` sent at `t`: `t=<t>,ed25519=<base64>`,
    /// the signature over `<t>.<body>`.
    pub fn signature(&self, t: u64, body: &[u8]) -> String {
        let mut msg = format!("{t}.").into_bytes();
        msg.extend_from_slice(body);
        let sig = self.pair.sign(&msg);
        format!("t={t},ed25519={}", base64::engine::general_purpose::STANDARD.encode(sig.as_ref()))
    }
}

/// Sweeps and sends until the process ends.
pub async fn sweeper(state: Arc<AppState>) {
    let every = state.alerts.sweep_every.max(Duration::from_millis(200));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sweep_once(&state).await {
            tracing::warn!(error = %e, "alerts: sweep failed");
        }
    }
}

/// One sweep: every page of owners, then every notice claimed.
pub async fn sweep_once(state: &Arc<AppState>) -> Result<()> {
    let channels = state.alerts.channels();
    let mut after = String::new();
    loop {
        let now = state.clock.now();
        let from = after.clone();
        let next = state
            .db
            .call(move |c| store::sweep_owners(c, now, &from, PAGE, channels))
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.body().error.message))?;
        match next {
            Some(n) => after = n,
            None => break,
        }
    }
    loop {
        let now = state.clock.now();
        let claimed = state
            .db
            .call(move |c| store::claim_notices(c, now, PAGE))
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.body().error.message))?;
        if claimed.is_empty() {
            return Ok(());
        }
        for n in claimed {
            let (delivery, error) = match send(state, &n).await {
                Ok(()) => (AlertDelivery::Delivered, None),
                Err(e) => {
                    tracing::warn!(incident = %n.incident, channel = %n.channel, error = %e, "alerts: a notice was not delivered");
                    (AlertDelivery::Failed, Some(e.to_string()))
                }
            };
            state
                .db
                .call(move |c| store::record_delivery(c, &n, delivery, error.as_deref()))
                .await
                .map_err(|e| anyhow::anyhow!("{}", e.body().error.message))?;
        }
    }
}

async fn send(state: &AppState, n: &ClaimedNotice) -> Result<()> {
    let Some(to) = &n.to else { bail!("the owner removed this channel's address") };
    match n.channel {
        AlertChannel::Email => {
            let Some(smtp) = &state.alerts.smtp else { bail!("e-mail is not set up (serve --smtp)") };
            let (subject, body) = email_text(n, &state.cfg.public_url);
            let to: lettre::message::Mailbox = to.parse().map_err(|e| anyhow::anyhow!("the address: {e}"))?;
            let msg = lettre::Message::builder()
                .from(smtp.from.clone())
                .to(to)
                .subject(subject)
                .header(lettre::message::header::ContentType::TEXT_PLAIN)
                .body(body)?;
            smtp.transport.send(msg).await?;
            Ok(())
        }
        AlertChannel::Webhook => {
            let Some(key) = &state.alerts.key else {
                bail!("webhooks are not set up (serve --alert-key-file)")
            };
            // Checked again: the rule may have changed since the owner saved it.
            let url = store::check_webhook_url(to).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
            let body = serde_json::to_vec(&AlertWebhook {
                incident: n.incident.clone(),
                node: n.node_id.clone(),
                node_name: n.node_name.clone(),
                kind: n.kind,
                state: n.state,
                at: n.at,
            })?;
            let opts = gpum_host::http::ClientOptions {
                timeout: Some(WEBHOOK_TIMEOUT),
                connect_timeout: Some(WEBHOOK_TIMEOUT),
                ..Default::default()
            };
            // No redirects are followed (the client's policy): a 3xx is a failure.
            let client = gpum_host::http::client_for(&url, &opts)?;
            let r = client
                .post(&url)
                .header("content-type", "application/json")
                .header(gpum_protocol::ALERT_SIGNATURE_HEADER, key.signature(state.clock.now(), &body))
                .body(body)
                .send()
                .await
                .map_err(|e| anyhow::anyhow!("{}", gpum_host::http::error_chain(&e)))?;
            let status = r.status();
            // The answer's body is never read: only its status counts.
            drop(r);
            if !status.is_success() {
                bail!("the webhook answered {status}");
            }
            Ok(())
        }
    }
}

/// An e-mail's subject and body, in the owner's language.
pub fn email_text(n: &ClaimedNotice, public_url: &str) -> (String, String) {
    let l = n.lang;
    let what = match (n.kind, n.state) {
        (AlertKind::Offline, AlertState::Opened) => Msg::AlertOfflineOpened,
        (AlertKind::Offline, AlertState::Closed) => Msg::AlertOfflineClosed,
        (AlertKind::CheckFailed, AlertState::Opened) => Msg::AlertCheckOpened,
        (AlertKind::CheckFailed, AlertState::Closed) => Msg::AlertCheckClosed,
        (AlertKind::Quarantined, AlertState::Opened) => Msg::AlertQuarantineOpened,
        (AlertKind::Quarantined, AlertState::Closed) => Msg::AlertQuarantineClosed,
    };
    let name = gpum_common::text::escape_controls(&n.node_name).into_owned();
    let subject = fill(what.text(l), &[("name", &name)]);
    let at = crate::store::iso_utc(n.at as i64);
    let body = fill(
        Msg::AlertEmailBody.text(l),
        &[
            ("what", &subject),
            ("name", &name),
            ("id", &n.node_id),
            ("at", &at),
            ("url", &format!("{public_url}/dashboard/servers/{}", n.node_id)),
            ("settings", &format!("{public_url}/dashboard/account#alerts")),
        ],
    );
    (format!("gpum: {subject}"), body)
}

/// The language tag stored with an owner's settings.
pub fn lang_tag(l: Lang) -> &'static str {
    match l {
        Lang::Ru => "ru",
        Lang::En => "en",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn notice(kind: AlertKind, state: AlertState, lang: Lang) -> ClaimedNotice {
        ClaimedNotice {
            incident: "inc-1".into(),
            state,
            channel: AlertChannel::Email,
            at: 1_796_601_301,
            kind,
            node_id: "node-1".into(),
            node_name: "box\u{1b}[31m".into(),
            to: Some("ann@example.com".into()),
            lang,
        }
    }

    #[test]
    fn emails_say_what_when_and_where_in_the_owners_language() {
        let (s, b) =
            email_text(&notice(AlertKind::Offline, AlertState::Opened, Lang::En), "https://gpum.example");
        assert_eq!(s, "gpum: server box\\x1b[31m is offline");
        assert!(b.contains("When: 2026-12-06T23:55:01Z"), "{b}");
        assert!(b.contains("https://gpum.example/dashboard/servers/node-1"), "{b}");
        let (s, b) =
            email_text(&notice(AlertKind::Quarantined, AlertState::Closed, Lang::Ru), "https://gpum.example");
        assert_eq!(s, "gpum: сервер box\\x1b[31m снят с карантина");
        assert!(b.contains("Оповещения настраиваются"), "{b}");
        for k in AlertKind::ALL {
            for st in AlertState::ALL {
                for l in [Lang::Ru, Lang::En] {
                    let (s, b) = email_text(&notice(*k, *st, l), "u");
                    assert!(!s.contains('{') && !b.contains('{'), "{s} {b}");
                }
            }
        }
    }

    #[test]
    fn the_key_is_made_private_once_and_its_signatures_verify() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("alert-key.pem");
        let k = load_or_create_key(&f).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(
            load_or_create_key(&f).unwrap().public_b64,
            k.public_b64,
            "the same key at the next start"
        );
        let sig = k.signature(17, b"{\"a\":1}");
        let s = sig.strip_prefix("t=17,ed25519=").unwrap();
        let s = base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        let pk = base64::engine::general_purpose::STANDARD.decode(&k.public_b64).unwrap();
        let v = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &pk);
        v.verify(b"17.{\"a\":1}", &s).unwrap();
        assert!(v.verify(b"18.{\"a\":1}", &s).is_err());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_or_create_key(&f).err().unwrap().to_string().contains("make it 0600"));
    }

    #[test]
    fn the_smtp_file_keeps_its_password_private_and_plain_smtp_on_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("smtp.toml");
        let write = |text: &str, mode: u32| {
            std::fs::write(&f, text).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let err = |text: &str, mode: u32| {
            write(text, mode);
            load_smtp(&f).err().map(|e| e.to_string()).unwrap_or_default()
        };
        let with_password = "host = \"smtp.example.com\"\nfrom = \"gpum <a@gpum.example>\"\nusername = \"u\"\npassword = \"p\"\n";
        assert!(err(with_password, 0o644).contains("make it 0600"));
        write(with_password, 0o600);
        let s = load_smtp(&f).unwrap();
        assert_eq!(s.describe, "smtp.example.com:587 (starttls)");
        assert!(
            err("host = \"smtp.example.com\"\nfrom = \"a@gpum.example\"\ntls = \"none\"\n", 0o644)
                .contains("loopback")
        );
        assert!(
            err("host = \"smtp.example.com\"\nfrom = \"a@gpum.example\"\nusername = \"u\"\n", 0o600)
                .contains("both")
        );
        assert!(err("host = \"h\"\nfrom = \"not an address\"\n", 0o644).contains("from"));
        write("host = \"127.0.0.1\"\nport = 2525\nfrom = \"a@gpum.example\"\ntls = \"none\"\n", 0o644);
        assert_eq!(load_smtp(&f).unwrap().describe, "127.0.0.1:2525 (none)");
    }
}
