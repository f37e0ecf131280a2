//! Alerts to owners (issue 46): the owners' settings, the incidents and the notices they owe.
//!
//! [`sweep_owners`] is one page of the sweep: for each owner with settings, it reads their
//! servers' facts and open incidents, asks `gpum_platform_core::alerts::decide`, and writes the
//! changes: an incident opened (the unique index on open incidents makes a second replica's
//! insert a no-op) or closed (`… WHERE closed_at IS NULL`: one replica's update wins), and, only
//! for the replica whose write changed a row, one notice per channel the owner set up.
//! [`claim_notices`] then takes the unsent notices with a conditional update, so that each is
//! sent by one replica at most, and [`record_delivery`] keeps what became of it.

use super::*;
use gpum_platform_core::alerts::{Change, Facts, Watch, decide};
use gpum_protocol::{
    AlertChannel, AlertDelivery, AlertKind, AlertNotice, AlertSettings, AlertState, MAX_ALERT_ADDRESS_LEN,
    MAX_ALERT_OFFLINE_MINUTES, VerificationState,
};

/// How many notices a settings view lists.
pub const RECENT_NOTICES: i64 = 20;
/// How long an ended incident and its notices are kept (seconds): 90 days.
pub const ALERT_RETENTION_SECS: u64 = 90 * 24 * 3600;

/// A field of the settings that is not acceptable, and why (in the owner's language on the
/// cabinet's page, in English in the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertSettingsError {
    Email,
    WebhookUrl,
    WebhookHttps,
    WebhookPrivate,
    OfflineMinutes,
    Language,
}

impl AlertSettingsError {
    /// The field it is about (the form's and the API's name).
    pub fn field(self) -> &'static str {
        match self {
            AlertSettingsError::Email => "email",
            AlertSettingsError::WebhookUrl
            | AlertSettingsError::WebhookHttps
            | AlertSettingsError::WebhookPrivate => "webhook_url",
            AlertSettingsError::OfflineMinutes => "offline_minutes",
            AlertSettingsError::Language => "language",
        }
    }

    /// The API's message.
    pub fn message(self) -> String {
        match self {
            AlertSettingsError::Email => "email: not an e-mail address".into(),
            AlertSettingsError::WebhookUrl => "webhook_url: not a URL".into(),
            AlertSettingsError::WebhookHttps => "webhook_url: only https:// URLs are allowed".into(),
            AlertSettingsError::WebhookPrivate => {
                "webhook_url: a loopback, private or link-local address is not allowed".into()
            }
            AlertSettingsError::OfflineMinutes => {
                format!("offline_minutes: a whole number from 1 to {MAX_ALERT_OFFLINE_MINUTES}")
            }
            AlertSettingsError::Language => "language: ru or en".into(),
        }
    }
}

/// Whether webhooks may go to plain `http://` on loopback (an end-to-end test's receiver): only
/// in builds with the `test-knobs` feature. A release build sends them to `https://` only, and
/// never to an address written as a loopback, private or link-local IP.
pub const WEBHOOK_HTTP_ALLOWED: bool = cfg!(feature = "test-knobs");

/// `s` as a webhook URL, or why not.
pub fn check_webhook_url(s: &str) -> Result<String, AlertSettingsError> {
    if s.len() > MAX_ALERT_ADDRESS_LEN {
        return Err(AlertSettingsError::WebhookUrl);
    }
    let u = match gpum_host::http::check_url(s) {
        Ok(u) => u,
        Err(gpum_host::HttpError::InsecureNonLoopback(_)) => return Err(AlertSettingsError::WebhookHttps),
        Err(_) => return Err(AlertSettingsError::WebhookUrl),
    };
    if u.scheme() != "https" && !WEBHOOK_HTTP_ALLOWED {
        return Err(AlertSettingsError::WebhookHttps);
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(AlertSettingsError::WebhookUrl);
    }
    let host = u.host_str().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
    if !WEBHOOK_HTTP_ALLOWED && (host.eq_ignore_ascii_case("localhost") || host.parse().is_ok_and(private_ip))
    {
        return Err(AlertSettingsError::WebhookPrivate);
    }
    Ok(u.to_string())
}

fn private_ip(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v) => {
            v.is_loopback() || v.is_private() || v.is_link_local() || v.is_unspecified() || v.is_broadcast()
        }
        std::net::IpAddr::V6(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || (v.segments()[0] & 0xfe00) == 0xfc00
                || (v.segments()[0] & 0xffc0) == 0xfe80
                || v.to_ipv4_mapped().is_some_and(|m| private_ip(m.into()))
        }
    }
}

/// `s` as an e-mail address, or why not: one `@`, no space or control character, at most 254
/// bytes; `lettre` parses it again before it sends.
pub fn check_email(s: &str) -> Result<String, AlertSettingsError> {
    let s = s.trim();
    let ok = s.len() <= 254
        && s.split('@').count() == 2
        && s.split('@').all(|p| !p.is_empty())
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || is_bidi_control(c) || "<>,;\"".contains(c));
    if ok { Ok(s.to_owned()) } else { Err(AlertSettingsError::Email) }
}

/// The settings as they will be stored: blank addresses are `None`, the kinds in order without
/// repeats; or the first field that is not acceptable.
pub fn check_alert_settings(s: &AlertSettings) -> Result<AlertSettings, AlertSettingsError> {
    let blank = |v: &Option<String>| v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned);
    let email = blank(&s.email).map(|e| check_email(&e)).transpose()?;
    let webhook_url = blank(&s.webhook_url).map(|u| check_webhook_url(&u)).transpose()?;
    if !(1..=MAX_ALERT_OFFLINE_MINUTES).contains(&s.offline_minutes) {
        return Err(AlertSettingsError::OfflineMinutes);
    }
    if gpum_common::Lang::parse(&s.language).is_none() {
        return Err(AlertSettingsError::Language);
    }
    let kinds = AlertKind::ALL.iter().copied().filter(|k| s.kinds.contains(k)).collect();
    Ok(AlertSettings {
        email,
        webhook_url,
        offline_minutes: s.offline_minutes,
        kinds,
        language: s.language.clone(),
    })
}

/// An owner's settings, or `None` when they never saved any.
pub fn alert_settings(conn: &Conn, owner: &str) -> Result<Option<AlertSettings>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT email, webhook_url, offline_minutes, watch_offline, watch_check, watch_quarantine, lang
             FROM alert_settings WHERE owner_id = ?1",
        )?
        .query_row(params![owner], settings_row)
        .optional()?)
}

fn settings_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<AlertSettings> {
    let watched = [(AlertKind::Offline, 3), (AlertKind::CheckFailed, 4), (AlertKind::Quarantined, 5)];
    let mut kinds = Vec::new();
    for (k, i) in watched {
        if r.get::<_, bool>(i)? {
            kinds.push(k);
        }
    }
    Ok(AlertSettings {
        email: r.get(0)?,
        webhook_url: r.get(1)?,
        offline_minutes: r.get::<_, i64>(2)?.clamp(1, i64::from(MAX_ALERT_OFFLINE_MINUTES)) as u32,
        kinds,
        language: r.get(6)?,
    })
}

/// Stores an owner's settings (checked by [`check_alert_settings`] first).
pub fn set_alert_settings(conn: &Conn, owner: &str, s: &AlertSettings, now: u64) -> Result<(), ApiError> {
    let s = check_alert_settings(s).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.message()))?;
    conn.prepare_cached(
        "INSERT INTO alert_settings (owner_id, email, webhook_url, offline_minutes, watch_offline, watch_check,
                                     watch_quarantine, lang, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (owner_id) DO UPDATE SET email = excluded.email, webhook_url = excluded.webhook_url,
             offline_minutes = excluded.offline_minutes, watch_offline = excluded.watch_offline,
             watch_check = excluded.watch_check, watch_quarantine = excluded.watch_quarantine,
             lang = excluded.lang, updated_at = excluded.updated_at",
    )?
    .execute(params![
        owner,
        s.email,
        s.webhook_url,
        s.offline_minutes,
        s.kinds.contains(&AlertKind::Offline),
        s.kinds.contains(&AlertKind::CheckFailed),
        s.kinds.contains(&AlertKind::Quarantined),
        s.language,
        now as i64
    ])?;
    Ok(())
}

/// The name a notice gives a server: the owner's, else its host name.
fn node_name(name: Option<String>, inventory_json: &str) -> String {
    name.unwrap_or_else(|| {
        serde_json::from_str::<Inventory>(inventory_json).map(|i| i.private.hostname).unwrap_or_default()
    })
}

/// An owner's newest notices, newest first.
pub fn recent_notices(conn: &Conn, owner: &str, limit: i64) -> Result<Vec<AlertNotice>, ApiError> {
    let rows = conn
        .prepare_cached(
            "SELECT n.at, i.node_id, nodes.name, nodes.inventory_json, i.kind, n.state, n.channel, n.delivery, n.error
             FROM alert_notices n JOIN alert_incidents i ON i.id = n.incident_id
             LEFT JOIN nodes ON nodes.id = i.node_id
             WHERE n.owner_id = ?1 ORDER BY n.at DESC, n.incident_id, n.state DESC, n.channel LIMIT ?2",
        )?
        .query_map(params![owner, limit], |r| {
            Ok(AlertNotice {
                at: r.get::<_, i64>(0)?.max(0) as u64,
                node_id: r.get(1)?,
                node_name: node_name(r.get(2)?, &r.get::<_, Option<String>>(3)?.unwrap_or_default()),
                kind: r.get(4)?,
                state: r.get(5)?,
                channel: r.get(6)?,
                delivery: r.get(7)?,
                error: r.get(8)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Which channels this platform can send on: e-mail with `serve --smtp`, webhooks with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels {
    pub email: bool,
    pub webhook: bool,
}

/// One page of the sweep: the owners with settings after `after` (by id), at most `limit` of
/// them; the last one's id when there may be more.
pub fn sweep_owners(
    conn: &Conn,
    now: u64,
    after: &str,
    limit: i64,
    channels: Channels,
) -> Result<Option<String>, ApiError> {
    let owners = conn
        .prepare_cached(
            "SELECT owner_id, email, webhook_url, offline_minutes, watch_offline, watch_check, watch_quarantine
             FROM alert_settings WHERE owner_id > ?1 ORDER BY owner_id LIMIT ?2",
        )?
        .query_map(params![after, limit], |r| {
            let owner: String = r.get(0)?;
            let email: Option<String> = r.get(1)?;
            let webhook: Option<String> = r.get(2)?;
            let mut to = Vec::new();
            if email.is_some() && channels.email {
                to.push(AlertChannel::Email);
            }
            if webhook.is_some() && channels.webhook {
                to.push(AlertChannel::Webhook);
            }
            let minutes = r.get::<_, i64>(3)?.clamp(1, i64::from(MAX_ALERT_OFFLINE_MINUTES)) as u32;
            let mut kinds = Vec::new();
            for (k, i) in [(AlertKind::Offline, 4), (AlertKind::CheckFailed, 5), (AlertKind::Quarantined, 6)] {
                // Nobody to tell: nothing opens (what is open still ends).
                if r.get::<_, bool>(i)? && !to.is_empty() {
                    kinds.push(k);
                }
            }
            Ok((owner, Watch::new(minutes, &kinds), to))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (owner, watch, to) in &owners {
        sweep_owner(conn, now, owner, watch, to)?;
    }
    Ok(if owners.len() as i64 >= limit { owners.last().map(|o| o.0.clone()) } else { None })
}

/// One owner's servers: the live ones, and the deleted ones with an incident still open.
fn sweep_owner(
    conn: &Conn,
    now: u64,
    owner: &str,
    watch: &Watch,
    to: &[AlertChannel],
) -> Result<(), ApiError> {
    let nodes = conn
        .prepare_cached(
            "SELECT id, last_heartbeat_at, verification, quarantine_json IS NOT NULL, deleted_at IS NOT NULL
             FROM nodes WHERE owner_id = ?1
               AND (deleted_at IS NULL
                    OR id IN (SELECT node_id FROM alert_incidents WHERE owner_id = ?1 AND closed_at IS NULL))
             -- In one order, so that two replicas sweeping one owner take the same locks in turn.
             ORDER BY id",
        )?
        .query_map(params![owner], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Facts {
                    last_heartbeat_at: r.get::<_, Option<i64>>(1)?.map(|t| t.max(0) as u64),
                    check_failed: r.get::<_, VerificationState>(2)? == VerificationState::Failed,
                    quarantined: r.get(3)?,
                    deleted: r.get(4)?,
                },
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let open = conn
        .prepare_cached(
            "SELECT id, node_id, kind FROM alert_incidents WHERE owner_id = ?1 AND closed_at IS NULL",
        )?
        .query_map(params![owner], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, AlertKind>(2)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (node, facts) in &nodes {
        let mine: Vec<&(String, String, AlertKind)> = open.iter().filter(|o| o.1 == *node).collect();
        let kinds: Vec<AlertKind> = mine.iter().map(|o| o.2).collect();
        for change in decide(facts, watch, &kinds, now) {
            match change {
                Change::Open(kind) => {
                    let id = new_id("inc-");
                    let opened = conn
                        .prepare_cached(
                            "INSERT INTO alert_incidents (id, node_id, owner_id, kind, opened_at)
                             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                        )?
                        .execute(params![id, node, owner, kind, now as i64])?;
                    if opened == 1 {
                        owe(conn, &id, AlertState::Opened, owner, now, to)?;
                    }
                }
                Change::Close(kind) => {
                    let Some((id, _, _)) = mine.iter().find(|o| o.2 == kind) else { continue };
                    let closed = conn
                        .prepare_cached(
                            "UPDATE alert_incidents SET closed_at = ?1 WHERE id = ?2 AND closed_at IS NULL",
                        )?
                        .execute(params![now as i64, id])?;
                    if closed != 1 {
                        continue;
                    }
                    // The end is told on the channels the opening was told on (and only then).
                    let told: Vec<AlertChannel> = conn
                        .prepare_cached(
                            "SELECT channel FROM alert_notices WHERE incident_id = ?1 AND state = ?2",
                        )?
                        .query_map(params![id, AlertState::Opened], |r| r.get::<_, AlertChannel>(0))?
                        .collect::<Result<Vec<_>, _>>()?;
                    owe(conn, id, AlertState::Closed, owner, now, &told)?;
                }
            }
        }
    }
    // Bounded: what ended long ago goes, notices first.
    let before = now.saturating_sub(ALERT_RETENTION_SECS) as i64;
    conn.prepare_cached(
        "DELETE FROM alert_notices WHERE incident_id IN
             (SELECT id FROM alert_incidents WHERE owner_id = ?1 AND closed_at < ?2)",
    )?
    .execute(params![owner, before])?;
    conn.prepare_cached("DELETE FROM alert_incidents WHERE owner_id = ?1 AND closed_at < ?2")?
        .execute(params![owner, before])?;
    Ok(())
}

fn owe(
    conn: &Conn,
    incident: &str,
    state: AlertState,
    owner: &str,
    now: u64,
    to: &[AlertChannel],
) -> Result<(), ApiError> {
    for ch in to {
        conn.prepare_cached(
            "INSERT INTO alert_notices (incident_id, state, channel, owner_id, at, delivery)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        )?
        .execute(params![incident, state, ch, owner, now as i64, AlertDelivery::Pending])?;
    }
    Ok(())
}

/// A notice this replica claimed: everything its sender needs.
#[derive(Debug, Clone)]
pub struct ClaimedNotice {
    pub incident: String,
    pub state: AlertState,
    pub channel: AlertChannel,
    pub at: u64,
    pub kind: AlertKind,
    pub node_id: String,
    pub node_name: String,
    /// The owner's address on this channel (e-mail or URL), as it is now.
    pub to: Option<String>,
    pub lang: gpum_common::Lang,
}

/// Takes up to `limit` unclaimed notices for this replica: each is marked claimed where it was
/// not, and only those this call marked are returned, so no two replicas send one.
pub fn claim_notices(conn: &Conn, now: u64, limit: i64) -> Result<Vec<ClaimedNotice>, ApiError> {
    let pending = conn
        .prepare_cached(
            "SELECT n.incident_id, n.state, n.channel, n.at, i.kind, i.node_id, nodes.name, nodes.inventory_json,
                    s.email, s.webhook_url, s.lang
             FROM alert_notices n JOIN alert_incidents i ON i.id = n.incident_id
             LEFT JOIN nodes ON nodes.id = i.node_id
             LEFT JOIN alert_settings s ON s.owner_id = n.owner_id
             WHERE n.claimed_at IS NULL ORDER BY n.at, n.incident_id, n.state DESC, n.channel LIMIT ?1",
        )?
        .query_map(params![limit], |r| {
            let channel: AlertChannel = r.get(2)?;
            let email: Option<String> = r.get(8)?;
            let webhook: Option<String> = r.get(9)?;
            Ok(ClaimedNotice {
                incident: r.get(0)?,
                state: r.get(1)?,
                channel,
                at: r.get::<_, i64>(3)?.max(0) as u64,
                kind: r.get(4)?,
                node_id: r.get(5)?,
                node_name: node_name(r.get(6)?, &r.get::<_, Option<String>>(7)?.unwrap_or_default()),
                to: match channel {
                    AlertChannel::Email => email,
                    AlertChannel::Webhook => webhook,
                },
                lang: r.get::<_, Option<String>>(10)?.and_then(|l| gpum_common::Lang::parse(&l)).unwrap_or(gpum_common::Lang::En),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut mine = Vec::new();
    for n in pending {
        let claimed = conn
            .prepare_cached(
                "UPDATE alert_notices SET claimed_at = ?1
                 WHERE incident_id = ?2 AND state = ?3 AND channel = ?4 AND claimed_at IS NULL",
            )?
            .execute(params![now as i64, n.incident, n.state, n.channel])?;
        if claimed == 1 {
            mine.push(n);
        }
    }
    Ok(mine)
}

/// What became of a claimed notice.
pub fn record_delivery(
    conn: &Conn,
    n: &ClaimedNotice,
    delivery: AlertDelivery,
    error: Option<&str>,
) -> Result<(), ApiError> {
    conn.prepare_cached(
        "UPDATE alert_notices SET delivery = ?1, error = ?2 WHERE incident_id = ?3 AND state = ?4 AND channel = ?5",
    )?
    .execute(params![delivery, error.map(|e| truncate(e, 300)), n.incident, n.state, n.channel])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_field_by_field() {
        let ok = AlertSettings {
            email: Some(" ann@example.com ".into()),
            webhook_url: Some("https://hooks.example.com/gpum".into()),
            offline_minutes: 10,
            kinds: vec![AlertKind::Quarantined, AlertKind::Offline, AlertKind::Offline],
            language: "ru".into(),
        };
        let c = check_alert_settings(&ok).unwrap();
        assert_eq!(c.email.as_deref(), Some("ann@example.com"));
        assert_eq!(c.kinds, vec![AlertKind::Offline, AlertKind::Quarantined]);
        let blank =
            AlertSettings { email: Some("  ".into()), webhook_url: Some(String::new()), ..ok.clone() };
        let c = check_alert_settings(&blank).unwrap();
        assert_eq!((c.email, c.webhook_url), (None, None));
        for (bad, why) in [
            (AlertSettings { email: Some("ann".into()), ..ok.clone() }, AlertSettingsError::Email),
            (AlertSettings { email: Some("a@b@c".into()), ..ok.clone() }, AlertSettingsError::Email),
            (AlertSettings { email: Some("a b@c".into()), ..ok.clone() }, AlertSettingsError::Email),
            (
                AlertSettings { webhook_url: Some("ftp://x/".into()), ..ok.clone() },
                AlertSettingsError::WebhookUrl,
            ),
            (
                AlertSettings { webhook_url: Some("http://hooks.example.com/".into()), ..ok.clone() },
                AlertSettingsError::WebhookHttps,
            ),
            (
                AlertSettings { webhook_url: Some("https://u:p@hooks.example.com/".into()), ..ok.clone() },
                AlertSettingsError::WebhookUrl,
            ),
            (AlertSettings { offline_minutes: 0, ..ok.clone() }, AlertSettingsError::OfflineMinutes),
            (
                AlertSettings { offline_minutes: MAX_ALERT_OFFLINE_MINUTES + 1, ..ok.clone() },
                AlertSettingsError::OfflineMinutes,
            ),
            (AlertSettings { language: "de".into(), ..ok.clone() }, AlertSettingsError::Language),
        ] {
            assert_eq!(check_alert_settings(&bad), Err(why), "{bad:?}");
        }
        if !WEBHOOK_HTTP_ALLOWED {
            for u in [
                "https://127.0.0.1/",
                "https://10.0.0.1/x",
                "https://[::1]/",
                "https://169.254.169.254/",
                "https://localhost/",
            ] {
                assert_eq!(check_webhook_url(u), Err(AlertSettingsError::WebhookPrivate), "{u}");
            }
        }
    }
}
