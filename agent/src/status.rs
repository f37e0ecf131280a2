//! `gpum-agent status`: what the service last recorded in `state.json`, and the GPU quarantine
//! it keeps in `gpus.json` ([`crate::docker::gpucheck`]), for a person (or `--json` for a
//! script).
//!
//! The system paths are root's (`/etc/gpum-agent` holds the token), so without root, and
//! without `--state`, status exits 13 with the seed's «нужны права root (sudo)» rather than
//! pretending nothing is there. A `--state DIR` the caller can read needs no root.

use std::io::ErrorKind;
use std::time::Duration;

use gpum_common::agent_state::{AgentState, Connection, StopReason, UpgradeRecord, UpgradeState};
use gpum_common::text::escape_controls;
use gpum_common::texts::fill;
use gpum_common::{Failure, Lang};
use gpum_host::Host;
use gpum_protocol::{Quarantine, VerificationState};

use crate::config::Paths;
use crate::text::Msg;

/// The localized sentence for a stop: what happened, then what to do.
pub fn stop_message(reason: StopReason, lang: Lang) -> String {
    match reason {
        StopReason::Revoked => Failure::StoppedRevoked.message(lang),
        StopReason::ConfigError => Failure::StoppedConfig(String::new()).message(lang),
    }
}

/// Reads the state, or the failure to report (13 without the rights to read it).
pub fn load(host: &dyn Host, paths: &Paths) -> Result<Option<AgentState>, Failure> {
    if paths.system && host.euid() != 0 {
        return Err(Failure::StatusNeedsRoot);
    }
    match crate::state::read(host, &paths.state_dir) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Err(Failure::StatusNeedsRoot),
        Err(e) => {
            Err(Failure::Other(format!("{}: {e}", crate::state::state_path(&paths.state_dir).display())))
        }
    }
}

/// The quarantine the service keeps in `gpus.json`, if any (a file that cannot be read is one,
/// as the service itself counts it). Called after [`load`], which checked the rights.
pub fn quarantine(host: &dyn Host, paths: &Paths, now: u64) -> Option<Quarantine> {
    crate::docker::gpucheck::GpuLedger::load(host, &paths.state_dir, now).quarantine
}

/// The `--json` form: the state file's fields, `quarantine` while there is one, plus
/// `stop_message` when stopped.
pub fn render_json(st: Option<&AgentState>, quarantine: Option<&Quarantine>, lang: Lang) -> String {
    let mut v = match st {
        Some(s) => serde_json::to_value(s).expect("state serializes"),
        None => serde_json::json!({ "connection": "never_ran" }),
    };
    if let Some(q) = quarantine {
        v["quarantine"] = serde_json::to_value(q).expect("quarantine serializes");
    }
    if let Some(stop) = st.and_then(|s| s.stopped.as_ref()) {
        v["stop_message"] = serde_json::Value::String(stop_message(stop.reason, lang));
    }
    serde_json::to_string_pretty(&v).expect("json")
}

fn ago(now: u64, then: u64, lang: Lang) -> String {
    let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_secs(then));
    let secs = now.saturating_sub(then).to_string();
    fill(Msg::StatusAgo.text(lang), &[("date", &date), ("secs", &secs)])
}

/// The last upgrade, in the owner's language: versions, outcome with its reason, when.
pub fn upgrade_value(u: &UpgradeRecord, now: u64, lang: Lang) -> String {
    let with_detail = |m: Msg| fill(m.text(lang), &[("detail", &u.detail)]);
    let outcome = match u.state {
        UpgradeState::Pending => Msg::UpgradePending.text(lang).to_string(),
        UpgradeState::Succeeded => Msg::UpgradeSucceeded.text(lang).to_string(),
        UpgradeState::RolledBack => with_detail(Msg::UpgradeRolledBack),
        UpgradeState::Refused => with_detail(Msg::UpgradeRefused),
        UpgradeState::Failed => with_detail(Msg::UpgradeFailed),
    };
    let ago = ago(now, u.at.unwrap_or(u.started), lang);
    fill(
        Msg::UpgradeValue.text(lang),
        &[("from", &u.from), ("to", &u.to), ("outcome", &outcome), ("ago", &ago)],
    )
}

/// `status`'s line for the last upgrade (aligned as [`render_text`]'s, escaped).
pub fn upgrade_line(u: &UpgradeRecord, now: u64, lang: Lang) -> String {
    format!("{:<16}{}\n", Msg::StatusUpgrade.text(lang), escape_controls(&upgrade_value(u, now, lang)))
}

/// The text form.
pub fn render_text(st: Option<&AgentState>, quarantine: Option<&Quarantine>, now: u64, lang: Lang) -> String {
    let Some(s) = st else {
        return format!("{}\n", Msg::StatusNeverRan.text(lang));
    };
    let t = |m: Msg| m.text(lang);
    let mut out = String::new();
    // Every value may hold text from elsewhere (the platform's node id and error messages, a
    // hand-edited state file): control characters are printed escaped.
    let mut line = |k: Msg, v: String| out.push_str(&format!("{:<16}{}\n", t(k), escape_controls(&v)));
    line(Msg::StatusNode, s.node_id.clone().unwrap_or_else(|| "-".into()));
    line(Msg::StatusServer, s.server.clone().unwrap_or_else(|| "-".into()));
    let conn = match s.connection {
        Connection::Connecting => Msg::StatusConnecting,
        Connection::Connected => Msg::StatusConnected,
        Connection::Unreachable => Msg::StatusUnreachable,
        Connection::Stopped => Msg::StatusStoppedValue,
    };
    line(Msg::StatusConnection, t(conn).into());
    line(
        Msg::StatusLastHeartbeat,
        s.last_heartbeat_at.map(|at| ago(now, at, lang)).unwrap_or_else(|| t(Msg::StatusNever).into()),
    );
    let verification = match s.verification.unwrap_or_default() {
        VerificationState::AwaitingCheck => Msg::StatusAwaitingCheck,
        VerificationState::Verified => Msg::StatusVerified,
        VerificationState::Failed => Msg::StatusCheckFailed,
    };
    line(Msg::StatusVerification, t(verification).into());
    if let Some(ok) = s.docker_ok {
        line(
            Msg::StatusDocker,
            t(if ok { Msg::StatusDockerOk } else { Msg::StatusDockerUnavailable }).into(),
        );
    }
    if let Some(sk) = s.clock_skew_secs {
        line(Msg::StatusClockSkew, fill(t(Msg::StatusSkew), &[("skew", &format!("{sk:+}"))]));
    }
    if let Some(e) = &s.last_error {
        line(Msg::StatusLastError, e.clone());
    }
    if let Some(stop) = &s.stopped {
        let message = stop_message(stop.reason, lang);
        let values =
            [("message", message.as_str()), ("detail", &stop.detail), ("ago", &ago(now, stop.at, lang))];
        line(Msg::StatusStopped, fill(t(Msg::StatusStop), &values));
    }
    if let Some(q) = quarantine {
        let gpus = if q.gpu_uuids.is_empty() { "-".to_string() } else { q.gpu_uuids.join(", ") };
        let values = [("reason", q.reason.as_str()), ("gpus", &gpus), ("ago", &ago(now, q.since, lang))];
        line(Msg::StatusQuarantine, fill(t(Msg::StatusQuarantined), &values));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_common::agent_state::Stopped;
    use gpum_host::fake::FakeHost;
    use std::path::Path;

    /// Issue 47: the last upgrade's line, each outcome in both languages, escaped.
    #[test]
    fn the_last_upgrade_is_shown_in_both_languages() {
        let rec = UpgradeRecord {
            from: "0.1.0".into(),
            to: "0.2.0".into(),
            started: 1000,
            deadline: 1120,
            state: UpgradeState::RolledBack,
            detail: "no good heartbeat within 120 s\x1b[2J".into(),
            at: Some(1130),
            reported: true,
        };
        let en = upgrade_line(&rec, 1200, Lang::En);
        assert!(en.starts_with("upgrade:        0.1.0 → 0.2.0: rolled back to the previous version: no good heartbeat within 120 s\\x1b[2J"), "{en}");
        assert!(en.contains("70 s ago"), "{en}");
        let ru = upgrade_line(&rec, 1200, Lang::Ru);
        assert!(ru.contains("откачено к прежней версии"), "{ru}");
        for (state, en_word, ru_word) in [
            (UpgradeState::Pending, "first accepted heartbeat", "первого ответа"),
            (UpgradeState::Succeeded, "succeeded", "выполнено"),
            (UpgradeState::Refused, "refused by verification", "отклонено"),
            (UpgradeState::Failed, "will be retried", "будет повторено"),
        ] {
            let r = UpgradeRecord { state, ..rec.clone() };
            assert!(upgrade_line(&r, 1200, Lang::En).contains(en_word), "{state:?}");
            assert!(upgrade_line(&r, 1200, Lang::Ru).contains(ru_word), "{state:?}");
        }
    }

    #[test]
    fn system_paths_need_root() {
        let h = FakeHost::new().with_euid(1000);
        assert_eq!(load(&h, &Paths::resolve(None)), Err(Failure::StatusNeedsRoot));
        assert_eq!(Failure::StatusNeedsRoot.code(), 13);
        // A scratch directory does not.
        assert_eq!(load(&h, &Paths::resolve(Some(Path::new("/scratch")))), Ok(None));
    }

    #[test]
    fn shows_why_it_stopped_in_both_languages() {
        let st = AgentState {
            node_id: Some("n1".into()),
            connection: Connection::Stopped,
            stopped: Some(Stopped { reason: StopReason::Revoked, detail: "node_deleted".into(), at: 100 }),
            ..Default::default()
        };
        let ru = render_text(Some(&st), None, 160, Lang::Ru);
        assert!(ru.contains("Агент остановлен: сервер удалён или токен заменён"), "{ru}");
        assert!(ru.contains("node_deleted") && ru.contains("60 с назад"), "{ru}");
        assert!(ru.contains("соединение:     остановлен\n"), "{ru}");
        let en = render_text(Some(&st), None, 160, Lang::En);
        assert!(en.contains("Agent stopped: server deleted or token replaced"));
        assert!(en.contains("node_deleted") && en.contains("60 s ago"), "{en}");
        assert!(en.contains("connection:     stopped\n"), "{en}");
        let j: serde_json::Value = serde_json::from_str(&render_json(Some(&st), None, Lang::Ru)).unwrap();
        assert_eq!(j["stopped"]["reason"], "revoked");
        assert!(j["stop_message"].as_str().unwrap().starts_with("Агент остановлен"));
        let cfg = AgentState {
            stopped: Some(Stopped { reason: StopReason::ConfigError, detail: "x".into(), at: 1 }),
            ..Default::default()
        };
        assert!(render_text(Some(&cfg), None, 2, Lang::Ru).contains("Агент остановлен: ошибка конфигурации"));
        assert!(render_text(None, None, 0, Lang::En).contains("has not run"));
    }

    /// Each label leaves at least one space before its value, in both languages.
    #[test]
    fn labels_line_up() {
        use Msg::*;
        let labels = [
            StatusNode,
            StatusServer,
            StatusConnection,
            StatusLastHeartbeat,
            StatusVerification,
            StatusDocker,
            StatusClockSkew,
            StatusLastError,
            StatusStopped,
            StatusQuarantine,
        ];
        for (m, lang) in labels.iter().flat_map(|m| [(m, Lang::Ru), (m, Lang::En)]) {
            assert!(m.text(lang).chars().count() < 16, "{m:?} {lang:?}");
        }
    }

    #[test]
    fn foreign_text_is_printed_with_control_characters_escaped() {
        let st = AgentState {
            node_id: Some("n1\x1b[2J\x1b[1;1Hforged".into()),
            server: Some("https://x\rserver: https://evil".into()),
            last_error: Some("platform answered 500: \x1b]0;title\x07\u{9b}31m".into()),
            stopped: Some(Stopped { reason: StopReason::Revoked, detail: "d\nstopped: fake".into(), at: 1 }),
            ..Default::default()
        };
        for lang in [Lang::Ru, Lang::En] {
            let t = render_text(Some(&st), None, 2, lang);
            assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
            assert_eq!(t.lines().count(), 7, "no forged line: {t}");
            assert!(t.contains("n1\\x1b[2J") && t.contains("\\u{9b}"), "{t}");
        }
    }

    #[test]
    fn shows_a_quarantine_in_both_languages_and_json() {
        let st = AgentState { node_id: Some("n1".into()), ..Default::default() };
        let q = Quarantine {
            reason: "GPU-a still runs process 4242\x1b[2J after the rental ended".into(),
            since: 100,
            gpu_uuids: vec!["GPU-a".into()],
        };
        let ru = render_text(Some(&st), Some(&q), 130, Lang::Ru);
        assert!(ru.contains("карантин:       GPU-a still runs process 4242\\x1b[2J"), "{ru}");
        assert!(ru.contains("(GPU: GPU-a; ") && ru.contains("30 с назад"), "{ru}");
        assert!(ru.contains("Аренды не начнутся"), "{ru}");
        let en = render_text(Some(&st), Some(&q), 130, Lang::En);
        assert!(en.contains("quarantine:     GPU-a still runs") && en.contains("No rental starts"), "{en}");
        assert!(!render_text(Some(&st), None, 130, Lang::En).contains("quarantine"));
        let j: serde_json::Value = serde_json::from_str(&render_json(Some(&st), Some(&q), Lang::En)).unwrap();
        assert_eq!(j["quarantine"]["gpu_uuids"][0], "GPU-a");
        assert_eq!(j["quarantine"]["since"], 100);
    }

    #[test]
    fn reads_the_quarantine_from_the_ledger_and_an_unreadable_ledger_is_one() {
        let paths = Paths::resolve(Some(Path::new("/scratch")));
        let h = FakeHost::new();
        assert_eq!(quarantine(&h, &paths, 5), None);
        h.write_atomic(&paths.state_dir.join(crate::docker::gpucheck::FILE), b"{not json", 0o600).unwrap();
        let q = quarantine(&h, &paths, 5).expect("an unreadable ledger is a quarantine");
        assert_eq!(q.since, 5);
        assert!(q.reason.contains("gpus.json"), "{}", q.reason);
    }
}
