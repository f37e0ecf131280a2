//! The dashboard's pages, as maud templates: checked at compile time, and every value escaped
//! (maud escapes `&<>"` in text and attributes, and always quotes attributes). Nothing here uses
//! `PreEscaped`: a node's inventory is written by whoever holds a join code, so no text from the
//! database may ever become markup.
//!
//! A region marked `data-live="URL"` is refreshed by `dashboard.js` every 2 s from that URL (a
//! GET of a page holding the same region); forms stay outside those regions so a refresh never
//! replaces a button under the owner's pointer. Above each region, `#live-status` says when it
//! was last updated, or that the connection or the session is lost (its texts in `data-`
//! attributes, from the message table); the region carries what the rest of the page follows
//! (`data-online`: the command buttons; `data-open`: the join code's install command).

use gpum_common::Lang;
pub use gpum_platform_core::currency::Currency;
use gpum_protocol::{
    CommandKind, CommandStatus, Metrics, MetricsSample, NodeEvent, NodeEventKind, NodeSummary, RentableState,
    SAMPLE_INTERVAL_SECS, SAMPLE_WINDOW_SECS, VerificationState,
};
use maud::{DOCTYPE, Markup, html};

use super::agent_text::agent_text;
use super::i18n::{Msg, fill, nvml_problem, probe_failure, probe_fix, t, verification};
use crate::store::{OpenCode, SettingsError};

mod add;
mod confirm;
mod earnings;
mod events;
mod figures;
mod join;
mod notices;
mod server;
mod servers;
#[cfg(test)]
pub(crate) mod tests;
mod trouble;

use add::no_install_command;
pub use add::{Dist, add, commands};
pub(crate) use add::{copyable, with_flags};
pub use confirm::{command_refused, confirm_delete, confirm_rotate, rotated};
pub use earnings::earnings;
use events::{command_name, command_outcome, event_log};
use figures::{figures, history_chart, memory};
pub use join::{JoinState, Shown, join_page, join_status};
pub(crate) use notices::totp_reset_notice;
pub use notices::{LoginError, disabled, not_found, not_found_as, open_codes_limit, operator_login, stale};
pub use server::{
    History, MaintenanceError, MaintenanceRefused, RENTALS_SHOWN, Refused, TypedForm, server, server_typed,
};
pub use servers::{PageAt, servers};
pub use trouble::{BadForm, Trouble, bad_form, trouble};

/// What every page needs: the language, the path (for the language switch) and, when signed
/// in, the session's CSRF token (for every form).
pub struct Ctx {
    pub lang: Lang,
    pub path: String,
    /// The session's form key; `Some` when signed in.
    pub csrf: Option<String>,
    /// The signed-in owner's e-mail; `None` for the operator or no session.
    pub account: Option<String>,
    /// The platform's currency, named on every price (issue 46).
    pub currency: Currency,
}

impl Ctx {
    pub(crate) fn t(&self, m: Msg) -> &'static str {
        t(m, self.lang)
    }
}

/// The longest text from a node shown in a table cell; the server's page shows it whole.
const CELL_MAX_CHARS: usize = 64;

fn cut(s: &str) -> String {
    if s.chars().count() <= CELL_MAX_CHARS {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(CELL_MAX_CHARS).collect::<String>())
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM` (UTC).
pub(crate) fn utc(ts: u64) -> String {
    let days = (ts / 86_400) as i64;
    let secs = ts % 86_400;
    let (y, m, d) = gpum_platform_core::metering::civil(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}", secs / 3600, secs % 3600 / 60)
}

/// A time as the cabinet shows it (issue 46): `<time datetime="…Z" title="… UTC">… UTC</time>`.
/// Without the script the page says UTC; `dashboard.js` rewrites the text into the browser's
/// time zone and the page's language, and the `title` keeps the UTC time on hover.
pub(crate) fn when(ts: u64) -> Markup {
    let text = format!("{} UTC", utc(ts));
    html! { time datetime=(iso(ts)) title=(text) { (text) } }
}

/// [`when`] to the second (the live line's "updated at").
fn when_hms(ts: u64) -> Markup {
    let title = format!("{}:{:02} UTC", utc(ts), ts % 60);
    html! { time datetime=(iso(ts)) data-seconds title=(title) { (hms(ts)) " UTC" } }
}

/// `YYYY-MM-DDTHH:MM:SSZ`, a `<time>`'s `datetime`.
fn iso(ts: u64) -> String {
    crate::store::iso_utc(i64::try_from(ts).unwrap_or(i64::MAX))
}

/// A text of the table with its `{name}` holes filled by markup (a [`when`], or a value as
/// escaped text); the text around the holes is escaped like any other. As [`fill`], one pass,
/// and a hole without a value stays as it is.
pub(crate) fn fill_html(template: &str, values: &[(&str, Markup)]) -> Markup {
    debug_assert!(
        values.iter().all(|(name, _)| template.contains(&format!("{{{name}}}"))),
        "{template:?} lacks a hole of {:?}",
        values.iter().map(|v| v.0).collect::<Vec<_>>()
    );
    let mut parts: Vec<Result<&str, &Markup>> = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        parts.push(Ok(&rest[..i]));
        let after = &rest[i + 1..];
        match after.find('}').map(|j| (&after[..j], j)) {
            Some((name, j)) if let Some((_, v)) = values.iter().find(|(n, _)| *n == name) => {
                parts.push(Err(v));
                rest = &after[j + 1..];
            }
            _ => {
                parts.push(Ok("{"));
                rest = after;
            }
        }
    }
    parts.push(Ok(rest));
    html! { @for p in parts { @match p { Ok(text) => (text), Err(m) => (m) } } }
}

/// A plain value for [`fill_html`], escaped.
fn text(s: &str) -> Markup {
    html! { (s) }
}

/// Unix seconds as the time of day `HH:MM:SS` (UTC).
pub fn hms(ts: u64) -> String {
    let secs = ts % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// The line above a live region: when it was last updated, or that the connection or the
/// session is lost. `dashboard.js` rewrites it after each refresh from the texts in its `data-`
/// attributes (rendered here, in the page's language), with the time the fresh region carries
/// in `data-at`.
fn live_status(ctx: &Ctx, now: u64) -> Markup {
    html! {
        p #live-status.live-status data-state="updated"
            data-updated=(ctx.t(Msg::LiveUpdated)) data-lost=(ctx.t(Msg::LiveLost))
            data-signed-out=(ctx.t(Msg::LiveSignedOut)) data-sign-in=(ctx.t(Msg::SignInAgain))
            data-login="/dashboard/login" role="status" {
            (fill_html(ctx.t(Msg::LiveUpdated), &[("time", when_hms(now))]))
        }
    }
}

fn ago(ctx: &Ctx, last: Option<u64>, now: u64) -> String {
    let Some(last) = last else { return ctx.t(Msg::NeverSeen).to_owned() };
    let d = now.saturating_sub(last);
    let (m, n) = match d {
        0..60 => (Msg::SecondsAgo, d),
        60..3600 => (Msg::MinutesAgo, d / 60),
        3600..86_400 => (Msg::HoursAgo, d / 3600),
        _ => (Msg::DaysAgo, d / 86_400),
    };
    fill(ctx.t(m), &[("n", &n.to_string())])
}

/// A price in minor units as the owner types it: `12.50` in a currency of two decimal places,
/// `1250` in one without a minor unit.
pub fn price_text(minor: u64, c: Currency) -> String {
    c.plain(minor)
}

/// A price the owner typed (`12`, `12.5`, `12,50`) in minor units of `c`; `None` if it is not a
/// number with at most `c`'s decimal places. The range is the store's to check.
pub fn parse_price(s: &str, c: Currency) -> Option<u64> {
    c.parse_amount(s)
}

/// The price as the lists show it, or "not for rent yet".
fn price_label(ctx: &Ctx, n: &NodeSummary) -> String {
    match n.price_per_gpu_hour {
        Some(p) => {
            fill(ctx.t(Msg::PricePerGpuHour), &[("price", &earnings::money_in(ctx.lang, p, ctx.currency))])
        }
        None => ctx.t(Msg::NotForRent).to_owned(),
    }
}

pub fn settings_error(ctx: &Ctx, e: SettingsError) -> String {
    let m = match e {
        SettingsError::NameLength => Msg::ErrNameLength,
        SettingsError::NameControl => Msg::ErrNameControl,
        SettingsError::NameBidi => Msg::ErrNameBidi,
        SettingsError::Price => {
            let c = ctx.currency;
            let max = price_text(gpum_protocol::MAX_PRICE_PER_GPU_HOUR, c);
            let max =
                max.strip_suffix(&format!(".{}", "0".repeat(usize::from(c.minor_units)))).unwrap_or(&max);
            return fill(
                ctx.t(Msg::ErrPrice),
                &[
                    ("max", max),
                    ("currency", earnings::currency_name(ctx.lang, c)),
                    ("example", &price_text(1250, c)),
                ],
            );
        }
        SettingsError::MinRental => Msg::ErrMinRental,
    };
    ctx.t(m).to_owned()
}

/// GPUs grouped by model: `2 × NVIDIA A100 (80 GiB)`, the memory in the language's units.
fn gpu_summary(ctx: &Ctx, n: &NodeSummary, max: Option<usize>) -> Vec<String> {
    let mut groups: Vec<(&str, u64, usize)> = Vec::new();
    for g in &n.inventory.public.gpus {
        match groups.iter_mut().find(|(m, v, _)| *m == g.model && *v == g.vram_mib) {
            Some(e) => e.2 += 1,
            None => groups.push((&g.model, g.vram_mib, 1)),
        }
    }
    groups
        .into_iter()
        .map(|(m, v, c)| {
            let m = if max.is_some() { cut(m) } else { m.to_owned() };
            format!("{c} × {m} ({})", memory(ctx, v))
        })
        .collect()
}

fn verification_label(ctx: &Ctx, n: &NodeSummary) -> String {
    let mut s = verification(n.verification, ctx.lang).to_owned();
    if n.verification == VerificationState::Failed
        && let Some(r) = n.last_probe_reason
    {
        s.push_str(": ");
        s.push_str(probe_failure(r, ctx.lang));
    }
    s
}

/// A machine with no GPU or no driver never looks healthy: its check is not shown green.
fn verification_class(n: &NodeSummary) -> &'static str {
    match n.verification {
        VerificationState::Verified if crate::rentable::no_gpu(n) => "bad",
        VerificationState::Verified => "ok",
        VerificationState::AwaitingCheck => "wait",
        VerificationState::Failed => "bad",
    }
}

/// The state cell's classes: green only when online with a working GPU.
fn state_class(n: &NodeSummary) -> &'static str {
    match (n.online, crate::rentable::no_gpu(n)) {
        (true, false) => "online",
        (true, true) => "online nogpu",
        (false, _) => "offline",
    }
}

fn rentable_class(s: RentableState) -> &'static str {
    match s {
        RentableState::Rentable => "ok",
        RentableState::OwnerDisabled
        | RentableState::Offline
        | RentableState::Quarantined
        | RentableState::NoGpu
        | RentableState::CheckFailed => "bad",
        RentableState::AwaitingOperator
        | RentableState::AwaitingCheck
        | RentableState::NoPrice
        | RentableState::Maintenance
        | RentableState::Paused => "wait",
    }
}

/// The verdict in words: rentable, or exactly why not (its times as [`when`]).
fn rentable_text(ctx: &Ctx, n: &NodeSummary) -> Markup {
    let r = &n.rentable;
    let plain = |s: String| text(&s);
    match r.state {
        RentableState::OwnerDisabled => {
            fill_html(ctx.t(Msg::RentOwnerDisabled), &[("at", when(r.since.unwrap_or(0)))])
        }
        RentableState::Offline => match r.since {
            Some(at) => fill_html(ctx.t(Msg::RentOfflineSince), &[("at", when(at))]),
            None => text(ctx.t(Msg::RentOfflineNever)),
        },
        RentableState::Quarantined => {
            let why =
                n.quarantine.as_ref().map(|q| cut(&agent_text(&q.reason, ctx.lang))).unwrap_or_default();
            fill_html(ctx.t(Msg::RentQuarantined), &[("at", when(r.since.unwrap_or(0))), ("why", text(&why))])
        }
        RentableState::NoGpu => {
            let why = n
                .health
                .as_ref()
                .and_then(|h| nvml_problem(h.nvml, ctx.lang))
                .unwrap_or_else(|| ctx.t(Msg::NoGpuListed));
            plain(format!("{}: {why}", ctx.t(Msg::RentNoGpu)))
        }
        RentableState::CheckFailed => match n.last_probe_reason {
            Some(f) => plain(format!("{}: {}", ctx.t(Msg::RentCheckFailed), probe_failure(f, ctx.lang))),
            None => text(ctx.t(Msg::RentCheckFailed)),
        },
        RentableState::AwaitingOperator => text(ctx.t(Msg::RentAwaitingOperator)),
        RentableState::AwaitingCheck => text(ctx.t(Msg::RentAwaitingCheck)),
        RentableState::NoPrice => text(ctx.t(Msg::RentNoPrice)),
        RentableState::Maintenance => {
            // The window that started at the verdict's `since` (the one the server is in).
            let since = r.since.unwrap_or(0);
            let until = n.maintenance.iter().find(|w| w.starts_at == since).map_or(since, |w| w.ends_at);
            fill_html(ctx.t(Msg::RentMaintenance), &[("from", when(since)), ("until", when(until))])
        }
        RentableState::Paused => text(ctx.t(Msg::RentPaused)),
        RentableState::Rentable => text(ctx.t(Msg::RentYes)),
    }
}

/// The verdict, and for a failed check the command that fixes it, copyable.
fn rentable_verdict(ctx: &Ctx, n: &NodeSummary) -> Markup {
    let fix = match n.rentable.state {
        RentableState::CheckFailed => n.last_probe_reason.and_then(probe_fix),
        _ => None,
    };
    html! {
        span.verdict.(rentable_class(n.rentable.state)) data-state=(n.rentable.state.as_str()) {
            (rentable_text(ctx, n))
        }
        @if let Some(fix) = fix {
            div.fix {
                p.help { (ctx.t(Msg::RentFix)) }
                (copyable(ctx, &format!("fix-{}", n.id), fix))
            }
        }
    }
}

pub(crate) fn csrf_field(ctx: &Ctx) -> Markup {
    html! { input type="hidden" name="csrf" value=(ctx.csrf.as_deref().unwrap_or("")); }
}

/// A mark saying who sees a field: tenants, or only the owner (as the seed separates them).
fn seen_by(ctx: &Ctx, public: bool) -> Markup {
    if public {
        html! { span.mark.pub title=(ctx.t(Msg::TenantsSee)) { "◆ " (ctx.t(Msg::TenantsSee)) } }
    } else {
        html! { span.mark.own title=(ctx.t(Msg::OnlyYouSee)) { "◇ " (ctx.t(Msg::OnlyYouSee)) } }
    }
}

pub fn layout(ctx: &Ctx, title: &str, body: Markup) -> Markup {
    let other = match ctx.lang {
        Lang::Ru => "en",
        Lang::En => "ru",
    };
    html! {
        (DOCTYPE)
        html lang=(match ctx.lang { Lang::Ru => "ru", Lang::En => "en" }) {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · " (ctx.t(Msg::Title)) }
                link rel="stylesheet" href="/dashboard/static/dashboard.css";
                script src="/dashboard/static/dashboard.js" defer {}
            }
            body {
                header {
                    a.brand href="/dashboard" { (ctx.t(Msg::Title)) }
                    nav {
                        @if ctx.csrf.is_some() {
                            a #nav-servers href="/dashboard" { (ctx.t(Msg::NavServers)) }
                            a #nav-add href="/dashboard/add" { (ctx.t(Msg::NavAdd)) }
                            a #nav-earnings href="/dashboard/earnings" { (ctx.t(Msg::NavEarnings)) }
                        }
                        @if let Some(email) = &ctx.account {
                            a #nav-account href="/dashboard/account" title=(email) { (ctx.t(Msg::NavAccount)) }
                        } @else if ctx.csrf.is_some() {
                            span #nav-operator { (ctx.t(Msg::NavOperator)) }
                        }
                        a #lang-switch href={ (ctx.path) "?lang=" (other) } { (ctx.t(Msg::LangSwitch)) }
                        @if ctx.csrf.is_some() {
                            form.inline method="post" action="/dashboard/logout" {
                                (csrf_field(ctx))
                                button #sign-out type="submit" { (ctx.t(Msg::SignOut)) }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}
