//! Alerts to owners (issue 46): an owner is told by e-mail and by a signed webhook when one of
//! their servers goes offline for longer than they chose, fails its check, or is quarantined;
//! one notice when the incident opens and one when it ends. docs/protocol.md, "Alerts", is the
//! contract.

use serde::{Deserialize, Serialize};

/// An owner's alert settings: `GET` reads them (with the notices sent lately and the key
/// webhooks are signed with), `PUT` replaces them (bearer: one of the owner's API keys).
pub const PATH_OWNER_ALERTS: &str = "/api/v1/owner/alerts";
/// The platform's Ed25519 public key that signs every webhook body (no authentication).
pub const PATH_ALERTS_PUBLIC_KEY: &str = "/api/v1/alerts/public-key";
/// The header that carries a webhook body's signature: `t=<unix seconds>,ed25519=<base64>`,
/// signed over `<t>.<body>`.
pub const ALERT_SIGNATURE_HEADER: &str = "Gpum-Signature";
/// The longest an owner may ask a server to stay offline before they are told, in minutes.
pub const MAX_ALERT_OFFLINE_MINUTES: u32 = 7 * 24 * 60;
/// The longest webhook URL and e-mail address accepted, in bytes.
pub const MAX_ALERT_ADDRESS_LEN: usize = 2048;

named_enum! {
    /// What an incident is about.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum AlertKind {
        /// No heartbeat for longer than the owner's `offline_minutes`.
        Offline = "offline",
        /// The GPU check failed.
        CheckFailed = "check_failed",
        /// The agent quarantined the server (a GPU not in order between two rentals).
        Quarantined = "quarantined",
    }
}

named_enum! {
    /// Whether a notice tells that an incident opened or that it ended.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum AlertState {
        Opened = "opened",
        Closed = "closed",
    }
}

named_enum! {
    /// How a notice is sent.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum AlertChannel {
        Email = "email",
        Webhook = "webhook",
    }
}

named_enum! {
    /// What became of a notice.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum AlertDelivery {
        /// Not sent yet (or being sent).
        Pending = "pending",
        /// The SMTP server took the message, or the webhook answered 2xx.
        Delivered = "delivered",
        /// Refused or unreachable; `error` says why. It is not retried.
        Failed = "failed",
    }
}

/// What an owner chose. No address: that channel is off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertSettings {
    /// Where the e-mails go.
    #[serde(default)]
    pub email: Option<String>,
    /// Where the webhooks go: `https://` only.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// A server offline for longer than this many minutes (1 to [`MAX_ALERT_OFFLINE_MINUTES`])
    /// opens an `offline` incident.
    pub offline_minutes: u32,
    /// The kinds of incident to be told about.
    pub kinds: Vec<AlertKind>,
    /// The language of the e-mails: `ru` or `en`.
    #[serde(default = "default_language")]
    pub language: String,
}

fn default_language() -> String {
    "en".into()
}

impl Default for AlertSettings {
    fn default() -> Self {
        AlertSettings {
            email: None,
            webhook_url: None,
            offline_minutes: 10,
            kinds: AlertKind::ALL.to_vec(),
            language: default_language(),
        }
    }
}

/// One notice sent (or tried) lately.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertNotice {
    /// Unix seconds: when the incident opened, or ended.
    pub at: u64,
    pub node_id: String,
    pub node_name: String,
    pub kind: AlertKind,
    pub state: AlertState,
    pub channel: AlertChannel,
    pub delivery: AlertDelivery,
    /// Why it failed (the SMTP server's or the webhook's answer, shortened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET`/`PUT` [`PATH_OWNER_ALERTS`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertSettingsView {
    pub settings: AlertSettings,
    /// Whether the operator set up e-mail (`serve --smtp`); without it no e-mail is sent.
    pub email_available: bool,
    /// The key webhooks are signed with (base64, 32 bytes), as [`PATH_ALERTS_PUBLIC_KEY`]
    /// serves it; `None`: the operator set up no key (`serve --alert-key-file`), and no webhook
    /// is sent.
    pub webhook_public_key: Option<String>,
    /// The newest notices, newest first (at most 20).
    pub sent: Vec<AlertNotice>,
}

/// [`PATH_ALERTS_PUBLIC_KEY`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertPublicKey {
    /// `ed25519`.
    pub algorithm: String,
    /// The raw 32-byte public key, base64 (standard, padded).
    pub public_key: String,
}

/// A webhook's JSON body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertWebhook {
    /// The incident's id: the same in its `opened` and `closed` notices.
    pub incident: String,
    /// The server's id.
    pub node: String,
    pub node_name: String,
    pub kind: AlertKind,
    pub state: AlertState,
    /// Unix seconds: when the incident opened, or ended.
    pub at: u64,
}
