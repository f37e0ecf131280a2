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
use gpum_protocol::{
    CommandKind, CommandStatus, Metrics, MetricsSample, NodeEvent, NodeEventKind, NodeSummary, RentableState,
    SAMPLE_INTERVAL_SECS, SAMPLE_WINDOW_SECS, VerificationState,
};
use maud::{DOCTYPE, Markup, html};

use super::i18n::{Msg, fill, nvml_problem, probe_failure, probe_fix, t, verification};
use crate::store::{OpenCode, SettingsError};

/// What every page needs: the language, the path (for the language switch) and, when signed
/// in, the session's CSRF token (for every form).
pub struct Ctx {
    pub lang: Lang,
    pub path: String,
    /// The session's form key; `Some` when signed in.
    pub csrf: Option<String>,
    /// The signed-in owner's e-mail; `None` for the operator or no session.
    pub account: Option<String>,
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
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}", secs / 3600, secs % 3600 / 60)
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
            (fill(ctx.t(Msg::LiveUpdated), &[("time", &hms(now))]))
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

/// A price in minor units as the owner writes it: `12.50`.
pub fn price_text(minor: u64) -> String {
    format!("{}.{:02}", minor / 100, minor % 100)
}

/// A price the owner typed (`12`, `12.5`, `12,50`) in minor units; `None` if it is not a number
/// with at most two decimals. The range is the store's to check.
pub fn parse_price(s: &str) -> Option<u64> {
    let s = s.trim().replace(',', ".");
    let (int, frac) = s.split_once('.').unwrap_or((&s, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || int.len() > 12 || frac.len() > 2 || !digits(int) || !digits(frac) {
        return None;
    }
    let frac =
        if frac.is_empty() { 0 } else { frac.parse::<u64>().ok()? * if frac.len() == 1 { 10 } else { 1 } };
    int.parse::<u64>().ok()?.checked_mul(100)?.checked_add(frac)
}

/// The price as the lists show it, or "not for rent yet".
fn price_label(ctx: &Ctx, n: &NodeSummary) -> String {
    match n.price_per_gpu_hour {
        Some(p) => fill(ctx.t(Msg::PricePerGpuHour), &[("price", &price_text(p))]),
        None => ctx.t(Msg::NotForRent).to_owned(),
    }
}

pub fn settings_error(ctx: &Ctx, e: SettingsError) -> &'static str {
    ctx.t(match e {
        SettingsError::NameLength => Msg::ErrNameLength,
        SettingsError::NameControl => Msg::ErrNameControl,
        SettingsError::Price => Msg::ErrPrice,
        SettingsError::MinRental => Msg::ErrMinRental,
    })
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
        | RentableState::Paused => "wait",
    }
}

/// The verdict in words: rentable, or exactly why not.
fn rentable_text(ctx: &Ctx, n: &NodeSummary) -> String {
    let r = &n.rentable;
    match r.state {
        RentableState::OwnerDisabled => {
            fill(ctx.t(Msg::RentOwnerDisabled), &[("at", &utc(r.since.unwrap_or(0)))])
        }
        RentableState::Offline => match r.since {
            Some(at) => fill(ctx.t(Msg::RentOfflineSince), &[("at", &utc(at))]),
            None => ctx.t(Msg::RentOfflineNever).to_owned(),
        },
        RentableState::Quarantined => {
            let why = n.quarantine.as_ref().map(|q| cut(&q.reason)).unwrap_or_default();
            fill(ctx.t(Msg::RentQuarantined), &[("at", &utc(r.since.unwrap_or(0))), ("why", &why)])
        }
        RentableState::NoGpu => {
            let why = n
                .health
                .as_ref()
                .and_then(|h| nvml_problem(h.nvml, ctx.lang))
                .unwrap_or_else(|| ctx.t(Msg::NoGpuListed));
            format!("{}: {why}", ctx.t(Msg::RentNoGpu))
        }
        RentableState::CheckFailed => match n.last_probe_reason {
            Some(f) => format!("{}: {}", ctx.t(Msg::RentCheckFailed), probe_failure(f, ctx.lang)),
            None => ctx.t(Msg::RentCheckFailed).to_owned(),
        },
        RentableState::AwaitingOperator => ctx.t(Msg::RentAwaitingOperator).to_owned(),
        RentableState::AwaitingCheck => ctx.t(Msg::RentAwaitingCheck).to_owned(),
        RentableState::NoPrice => ctx.t(Msg::RentNoPrice).to_owned(),
        RentableState::Paused => ctx.t(Msg::RentPaused).to_owned(),
        RentableState::Rentable => ctx.t(Msg::RentYes).to_owned(),
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

pub fn disabled(ctx: &Ctx) -> Markup {
    layout(ctx, ctx.t(Msg::Title), html! { p #disabled { (ctx.t(Msg::Disabled)) } })
}

/// Why the sign-in form is shown again.
pub enum LoginError {
    WrongToken,
    /// Too many wrong tokens from this address: try again in this many seconds.
    TooMany(u64),
}

/// The operator's sign-in form, with the admin token (`/dashboard/operator`).
pub fn operator_login(ctx: &Ctx, login_csrf: &str, error: Option<LoginError>) -> Markup {
    let error = error.map(|e| match e {
        LoginError::WrongToken => ctx.t(Msg::WrongToken).to_owned(),
        LoginError::TooMany(secs) => fill(ctx.t(Msg::TooManyAttempts), &[("n", &secs.to_string())]),
    });
    layout(
        ctx,
        ctx.t(Msg::OperatorSignInTitle),
        html! {
            @if let Some(e) = error { p.error #login-error { (e) } }
            form #login method="post" action="/dashboard/operator" autocomplete="off" {
                input type="hidden" name="csrf" value=(login_csrf);
                p { (ctx.t(Msg::SignInHelp)) }
                label for="token" { (ctx.t(Msg::AdminToken)) }
                input #token type="password" name="token" required autofocus;
                button #sign-in type="submit" { (ctx.t(Msg::SignIn)) }
            }
        },
    )
}

/// A join code refused: the owner holds the most open codes the operator allows (issue 43).
pub fn open_codes_limit(ctx: &Ctx, max: u64) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::OpenCodesLimit),
        html! {
            p.error #codes-limit { (fill(ctx.t(Msg::OpenCodesLimitHelp), &[("n", &max.to_string())])) }
            p { a href="/dashboard" { (ctx.t(Msg::Back)) } }
        },
    )
}

pub fn stale(ctx: &Ctx) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::StaleForm),
        html! {
            p #stale { (ctx.t(Msg::StaleFormHelp)) }
            p { a href="/dashboard" { (ctx.t(Msg::Back)) } }
        },
    )
}

pub fn not_found(ctx: &Ctx) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::NotFound),
        html! { p #not-found { (ctx.t(Msg::NotFound)) } p { a href="/dashboard" { (ctx.t(Msg::Back)) } } },
    )
}

/// What the owner's pages say after the operator turned their second factor off (issue 43),
/// while it stays off.
pub(crate) fn totp_reset_notice(ctx: &Ctx, at: u64) -> Markup {
    html! { p.flash #totp-reset { (fill(ctx.t(Msg::TotpResetByOperator), &[("at", &utc(at))])) } }
}

/// The servers page; `deleted`: the server this session deleted (kept with the session, never
/// taken from the address); `totp_reset_at`: when the operator turned the owner's second factor
/// off, while it stays off.
/// Which page of a list a page shows: the cursor it starts after (`None`: the first) and the
/// next page's (`None`: the last).
#[derive(Debug, Clone, Copy, Default)]
pub struct PageAt<'a> {
    pub after: Option<&'a str>,
    pub next: Option<&'a str>,
}

pub fn servers(
    ctx: &Ctx,
    nodes: &[NodeSummary],
    at: PageAt<'_>,
    now: u64,
    deleted: Option<&str>,
    totp_reset_at: Option<u64>,
) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::ServersTitle),
        html! {
            @if let Some(at) = totp_reset_at { (totp_reset_notice(ctx, at)) }
            @if let Some(id) = deleted {
                p.flash #flash { (fill(ctx.t(Msg::Deleted), &[("node", id)])) }
            }
            div.legend {
                p { (seen_by(ctx, true)) " " (ctx.t(Msg::LegendTenants)) }
                p { (seen_by(ctx, false)) " " (ctx.t(Msg::LegendOwner)) }
            }
            (live_status(ctx, now))
            (servers_table(ctx, nodes, at, now))
            @if at.after.is_some() || at.next.is_some() {
                p.pages {
                    @if at.after.is_some() { a #first-page href="/dashboard" { (ctx.t(Msg::FirstPage)) } " " }
                    @if let Some(next) = at.next { a #next-page href={ "/dashboard?after=" (next) } { (ctx.t(Msg::NextPage)) } }
                }
            }
            p { a.button #add-machine href="/dashboard/add" { (ctx.t(Msg::NavAdd)) } }
        },
    )
}

fn servers_table(ctx: &Ctx, nodes: &[NodeSummary], at: PageAt<'_>, now: u64) -> Markup {
    // The live refresh reads the same page again.
    let live = match at.after {
        Some(after) => format!("/dashboard?after={after}"),
        None => "/dashboard".to_owned(),
    };
    html! {
        div #servers data-live=(live) data-at=(hms(now)) {
            @if nodes.is_empty() {
                p #no-servers { (ctx.t(Msg::NoServers)) }
            } @else {
                table.cards {
                    thead { tr {
                        th { (ctx.t(Msg::ColServer)) br; (seen_by(ctx, false)) }
                        th { (ctx.t(Msg::ColRentable)) br; (seen_by(ctx, false)) }
                        th { (ctx.t(Msg::ColState)) br; (seen_by(ctx, true)) }
                        th { (ctx.t(Msg::ColVerification)) br; (seen_by(ctx, true)) }
                        th { (ctx.t(Msg::ColPrice)) br; (seen_by(ctx, true)) }
                        th { (ctx.t(Msg::ColGpus)) br; (seen_by(ctx, true)) }
                        th { (ctx.t(Msg::ColAgent)) br; (seen_by(ctx, false)) }
                        th { (ctx.t(Msg::ColLastSeen)) br; (seen_by(ctx, false)) }
                    } }
                    tbody {
                        @for n in nodes {
                            tr.server data-node=(n.id) {
                                td data-label=(ctx.t(Msg::ColServer)) {
                                    a.node-link href={ "/dashboard/servers/" (n.id) } { span.name { (cut(&n.name)) } }
                                    br;
                                    span.node-id { (n.id) }
                                    @if ctx.account.is_none() {
                                        br;
                                        span.owner { (n.owner.as_deref().unwrap_or(ctx.t(Msg::OperatorsOwn))) }
                                    }
                                }
                                td.rentable data-label=(ctx.t(Msg::ColRentable)) { (rentable_verdict(ctx, n)) }
                                td.state.(state_class(n)) data-label=(ctx.t(Msg::ColState)) {
                                    (ctx.t(if n.online { Msg::Online } else { Msg::Offline }))
                                    @if n.paused { br; span.paused { (ctx.t(Msg::PausedByYou)) } }
                                }
                                td.verification.(verification_class(n)) data-label=(ctx.t(Msg::ColVerification)) {
                                    (verification_label(ctx, n))
                                }
                                td.price.(if n.price_per_gpu_hour.is_some() { "set" } else { "unset" })
                                    data-label=(ctx.t(Msg::ColPrice)) {
                                    (price_label(ctx, n))
                                }
                                td.gpus data-label=(ctx.t(Msg::ColGpus)) { @for g in gpu_summary(ctx, n, Some(CELL_MAX_CHARS)) { (g) br; } }
                                td.agent data-label=(ctx.t(Msg::ColAgent)) { (cut(&n.agent_version)) }
                                td.seen data-label=(ctx.t(Msg::ColLastSeen)) { (ago(ctx, n.last_heartbeat_at, now)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn add(ctx: &Ctx, dist: &Dist, open: &[OpenCode], now: u64) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::AddTitle),
        html! {
            @if let Some(m) = no_install_command(ctx, dist) { (m) }
            p { (ctx.t(Msg::AddHelp)) }
            form #create-code method="post" action="/dashboard/add" {
                (csrf_field(ctx))
                label for="ttl" { (ctx.t(Msg::Lifetime)) }
                select #ttl name="ttl" {
                    option value="3600" { (ctx.t(Msg::Ttl1h)) }
                    option value="86400" selected { (ctx.t(Msg::Ttl24h)) }
                    option value="604800" { (ctx.t(Msg::Ttl7d)) }
                }
                button #create type="submit" { (ctx.t(Msg::CreateCode)) }
            }
            h2 { (ctx.t(Msg::OpenCodes)) }
            (live_status(ctx, now))
            (open_codes(ctx, open, now))
        },
    )
}

/// The unused, unexpired join codes, each with its expiry and a link to its live status; a
/// code used meanwhile leaves the list at the next refresh. The codes themselves are not
/// stored (only their hashes), so none is shown here.
fn open_codes(ctx: &Ctx, open: &[OpenCode], now: u64) -> Markup {
    html! {
        div #open-codes data-live="/dashboard/add" data-at=(hms(now)) {
            @if open.is_empty() {
                p #no-open-codes { (ctx.t(Msg::NoOpenCodes)) }
            } @else {
                table.cards {
                    thead { tr {
                        th { (ctx.t(Msg::ColCreated)) } th { (ctx.t(Msg::ColExpires)) } th { (ctx.t(Msg::ColStatus)) }
                    } }
                    tbody {
                        @for c in open {
                            tr.open-code data-code=(c.hash) {
                                td data-label=(ctx.t(Msg::ColCreated)) { (utc(c.created_at)) }
                                td data-label=(ctx.t(Msg::ColExpires)) { (utc(c.expires_at)) }
                                td.wait data-label=(ctx.t(Msg::ColStatus)) {
                                    (ctx.t(Msg::CodeWaiting)) " · "
                                    a href={ "/dashboard/join/" (c.hash) } { (ctx.t(Msg::OpenCodePage)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The install command for `public_url` and `code`, in its three variants: the install, the
/// dry run, and the one for a `/tmp` mounted noexec (as the seed explains).
///
/// The code is on a line of its own ahead of the script, a shell variable that `install.sh`
/// hands to the installer on stdin, so that it is in no process's command line: `echo` is a
/// shell builtin, and `sudo`, `bash`, `curl` and `gpum-install` never see it in their arguments
/// (a local user reading `/proc` would; issue 29). `--` ends bash's options, so that an owner
/// may append `--dry-run` or another flag of the installer.
pub fn commands(public_url: &str, code: &str) -> [String; 3] {
    let fetch = format!("{{ echo gpum_code={code}; curl -fsSL {public_url}/install.sh; }} |");
    [
        format!("{fetch} sudo bash -s --"),
        format!("{fetch} sudo bash -s -- --dry-run"),
        format!("{fetch} sudo env TMPDIR=/var/tmp bash -s --"),
    ]
}

/// Whether the platform serves what the install command fetches (`serve --dist`).
pub enum Dist {
    Served,
    /// No `--dist`.
    Off,
    /// `--dist` lacks these files (as `/dl/` serves them: regular files).
    Lacks(Vec<&'static str>),
}

/// What the operator must do instead of an install command that would fail; `None` when the
/// platform serves the installer and the agent.
fn no_install_command(ctx: &Ctx, dist: &Dist) -> Option<Markup> {
    let text = match dist {
        Dist::Served => return None,
        Dist::Off => ctx.t(Msg::NoDist).to_owned(),
        Dist::Lacks(files) => fill(ctx.t(Msg::DistIncomplete), &[("files", &files.join(", "))]),
    };
    Some(html! { p.error #no-install-command { (text) } })
}

pub(crate) fn copyable(ctx: &Ctx, id: &str, text: &str) -> Markup {
    html! {
        div.copyable {
            pre { code #(id) { (text) } }
            button.copy type="button" data-copy=(id) data-done=(ctx.t(Msg::Copied)) { (ctx.t(Msg::Copy)) }
        }
    }
}

/// What the join page shows under the live status: the fresh code and its install command
/// (once, right after it was created), or why not.
pub enum Shown<'a> {
    /// The code, fresh from the POST that created it (the one-time flash).
    Code { code: &'a str, expires_at: u64, public_url: &'a str, dist: &'a Dist },
    /// Not used yet, but shown already: it is not stored, so it cannot be shown again.
    Once,
    /// Used or expired: its command is of no more use.
    Closed,
}

fn shown_code(ctx: &Ctx, shown: Shown<'_>) -> Markup {
    match shown {
        Shown::Code { code, expires_at, public_url, dist } => {
            let [install, dry, noexec] = commands(public_url, code);
            html! {
                // Removed by `dashboard.js` as soon as the code is used or expires.
                div #code-once data-open-only {
                    h2 { (ctx.t(Msg::CodeCreated)) }
                    p { code #join-code { (code) } " " (fill(ctx.t(Msg::CodeExpires), &[("at", &utc(expires_at))])) }
                    p.help { (ctx.t(Msg::CodeShownOnce)) }
                    h2 { (ctx.t(Msg::InstallCommand)) }
                    @if let Some(m) = no_install_command(ctx, dist) {
                        (m)
                    } @else {
                        p { (ctx.t(Msg::InstallHelp)) }
                        (copyable(ctx, "cmd-install", &install))
                        h3 { (ctx.t(Msg::DryRunCommand)) }
                        p { (ctx.t(Msg::DryRunHelp)) }
                        (copyable(ctx, "cmd-dry-run", &dry))
                        h3 { (ctx.t(Msg::NoexecCommand)) }
                        p { (ctx.t(Msg::NoexecHelp)) }
                        (copyable(ctx, "cmd-noexec", &noexec))
                    }
                }
            }
        }
        Shown::Once => html! {
            p #code-shown-once data-open-only {
                (ctx.t(Msg::CodeShownOnce)) " " a href="/dashboard/add" { (ctx.t(Msg::NewCode)) }
            }
        },
        Shown::Closed => html! { p #code-closed.help { (ctx.t(Msg::CodeUsedNoCommand)) } },
    }
}

/// Where the join code stands, as the waiting page shows it.
pub enum JoinState<'a> {
    Waiting,
    Expired,
    Registered(&'a str),
    Node(&'a NodeSummary),
    Deleted,
}

pub fn join_status(ctx: &Ctx, state: JoinState<'_>) -> Markup {
    html! {
        @match state {
            JoinState::Waiting => p #join-state.wait data-state="waiting" { (ctx.t(Msg::WaitingMachine)) },
            JoinState::Expired => p #join-state.bad data-state="expired" { (ctx.t(Msg::CodeExpired)) },
            JoinState::Registered(id) => p #join-state.wait data-state="registered" {
                (ctx.t(Msg::MachineRegistered)) " "
                a href={ "/dashboard/servers/" (id) } { (ctx.t(Msg::OpenServer)) }
            },
            JoinState::Deleted => p #join-state.bad data-state="deleted" { (ctx.t(Msg::ServerDeleted)) },
            JoinState::Node(n) => {
                p #join-state.ok data-state=(if n.online { "online" } else { "offline" }) {
                    @if n.online {
                        (fill(ctx.t(Msg::MachineOnline), &[("node", &n.id)]))
                    } @else {
                        (n.id) ": " (ctx.t(Msg::Offline))
                    }
                    " "
                    a #open-server href={ "/dashboard/servers/" (n.id) } { (ctx.t(Msg::OpenServer)) }
                }
                p #join-verification.(verification_class(n))
                    data-verification=(verification_class(n)) { (verification_label(ctx, n)) }
            },
        }
    }
}

/// The live region of the join page; `open` (unused and unexpired) goes to `data-open`, by
/// which `dashboard.js` removes the install command once the code is used.
pub fn join_region(code_hash: &str, status: Markup, open: bool, now: u64) -> Markup {
    html! {
        div #join data-live={ "/dashboard/join/" (code_hash) } data-at=(hms(now))
            data-open=(if open { "true" } else { "false" }) { (status) }
    }
}

/// The join page: the live status of the install at the top, then the code and its command
/// (only right after it was created), or why they are not shown.
pub fn join_page(
    ctx: &Ctx,
    code_hash: &str,
    status: Markup,
    open: bool,
    shown: Shown<'_>,
    now: u64,
) -> Markup {
    let shown = match shown {
        Shown::Code { .. } | Shown::Once if !open => Shown::Closed,
        s => s,
    };
    layout(
        ctx,
        ctx.t(Msg::AddTitle),
        html! {
            (live_status(ctx, now))
            (join_region(code_hash, status, open, now))
            (shown_code(ctx, shown))
        },
    )
}

fn row(ctx: &Ctx, label: Msg, public: bool, value: &str) -> Markup {
    html! { tr { th { (ctx.t(label)) } td.value { (value) } td { (seen_by(ctx, public)) } } }
}

/// What a server's page shows of its past: the samples of the last day (oldest first) and the
/// newest events (newest first), as `store::node_samples` and `store::node_events` give them.
#[derive(Default)]
pub struct History {
    pub samples: Vec<MetricsSample>,
    pub events: Vec<NodeEvent>,
    /// The server's rentals, newest first (`rentals::list`).
    pub rentals: Vec<gpum_protocol::RentalSummary>,
}

/// The server's page; `error` is why the settings form was refused, shown above it;
/// `check_image` whether the platform's operator has chosen a check image (without one, no
/// recheck runs a check).
pub fn server(
    ctx: &Ctx,
    n: &NodeSummary,
    history: &History,
    now: u64,
    error: Option<SettingsError>,
    check_image: bool,
) -> Markup {
    let title = fill(ctx.t(Msg::ServerTitle), &[("node", &n.name)]);
    let base = format!("/dashboard/servers/{}", n.id);
    // The host name is the default: the field stays empty (with it as the hint) until the owner
    // names the server.
    let named = n.name != n.inventory.private.hostname;
    layout(
        ctx,
        &title,
        html! {
            (live_status(ctx, now))
            (server_live(ctx, n, history, now, check_image))
            h2 { (ctx.t(Msg::SettingsTitle)) }
            @if let Some(e) = error { p.error #settings-error { (settings_error(ctx, e)) } }
            form #settings method="post" action={ (base) "/settings" } {
                (csrf_field(ctx))
                label for="name" { (ctx.t(Msg::ServerName)) " " (seen_by(ctx, false)) }
                input #name type="text" name="name" maxlength="64" value=(if named { n.name.as_str() } else { "" })
                    placeholder=(cut(&n.inventory.private.hostname));
                p.help { (ctx.t(Msg::ServerNameHelp)) }
                label for="price" { (ctx.t(Msg::PriceLabel)) " " (seen_by(ctx, true)) }
                input #price type="text" name="price" inputmode="decimal"
                    value=(n.price_per_gpu_hour.map(price_text).unwrap_or_default());
                p.help { (ctx.t(Msg::PriceHelp)) }
                label for="min-rental" { (ctx.t(Msg::MinRentalLabel)) " " (seen_by(ctx, true)) }
                input #min-rental type="number" name="min_rental" min="1" max="10080" required
                    value=(n.min_rental_minutes);
                button #save type="submit" { (ctx.t(Msg::Save)) }
            }
            form.inline #pause-form method="post" action={ (base) "/pause" } {
                (csrf_field(ctx))
                @if n.paused {
                    input type="hidden" name="paused" value="false";
                    button #resume type="submit" { (ctx.t(Msg::Resume)) }
                } @else {
                    input type="hidden" name="paused" value="true";
                    button #pause type="submit" { (ctx.t(Msg::Pause)) }
                }
                " " span.help { (ctx.t(Msg::PauseHelp)) }
            }
            div.actions {
                // A command reaches the agent only at its heartbeat: on an offline server the
                // buttons are disabled, with why (and the POST is refused, `web::command`); the
                // live refresh keeps them so (`dashboard.js`, from the region's `data-online`).
                p.help #commands-offline hidden[n.online] { (ctx.t(Msg::CommandsOffline)) }
                form.inline method="post" action={ (base) "/command" } {
                    (csrf_field(ctx))
                    input type="hidden" name="kind" value="recheck";
                    button #recheck type="submit" data-needs-online disabled[!n.online] { (ctx.t(Msg::Recheck)) }
                }
                form.inline method="post" action={ (base) "/command" } {
                    (csrf_field(ctx))
                    input type="hidden" name="kind" value="restart";
                    button #restart type="submit" data-needs-online disabled[!n.online] { (ctx.t(Msg::Restart)) }
                }
                a.button #rotate href={ (base) "/rotate-token" } { (ctx.t(Msg::RotateToken)) }
                a.button.danger #delete href={ (base) "/delete" } { (ctx.t(Msg::Delete)) }
            }
        },
    )
}

fn opt(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("—")
}

fn server_live(ctx: &Ctx, n: &NodeSummary, history: &History, now: u64, check_image: bool) -> Markup {
    let inv = &n.inventory;
    let p = &inv.private;
    let gpus = gpu_summary(ctx, n, None).join(", ");
    // Saturating: the platform refuses out-of-range numbers (`Inventory::check_ranges`), but a
    // database written before it did may still hold two GPUs of `u64::MAX` MiB.
    let vram = inv.public.gpus.iter().fold(0u64, |sum, g| sum.saturating_add(g.vram_mib));
    html! {
        div #server data-live={ "/dashboard/servers/" (n.id) } data-at=(hms(now))
            data-online=(if n.online { "true" } else { "false" }) {
            table.facts {
                tr {
                    th { (ctx.t(Msg::ColRentable)) }
                    td.value #rentable { (rentable_verdict(ctx, n)) }
                    td { (seen_by(ctx, false)) }
                }
                tr {
                    th { (ctx.t(Msg::ColState)) }
                    td.value #state.(state_class(n)) {
                        (ctx.t(if n.online { Msg::Online } else { Msg::Offline }))
                        " · " (ago(ctx, n.last_heartbeat_at, now))
                    }
                    td { (seen_by(ctx, true)) }
                }
                tr {
                    th { (ctx.t(Msg::ColVerification)) }
                    td.value #verification.(verification_class(n)) { (verification_label(ctx, n)) }
                    td { (seen_by(ctx, true)) }
                }
                tr {
                    th { (ctx.t(Msg::ColPrice)) }
                    td.value #price-shown {
                        (price_label(ctx, n)) " · "
                        (fill(ctx.t(Msg::MinRentalValue), &[("n", &n.min_rental_minutes.to_string())]))
                        @if n.paused { " · " span #paused { (ctx.t(Msg::PausedByYou)) } }
                    }
                    td { (seen_by(ctx, true)) }
                }
                tr {
                    th { (ctx.t(Msg::ServerName)) }
                    td.value #server-name { (n.name) }
                    td { (seen_by(ctx, false)) }
                }
                tr {
                    th { (ctx.t(Msg::NodeId)) }
                    td.value #node-id { (n.id) }
                    td { (seen_by(ctx, false)) }
                }
            }
            (figures(ctx, n))
            (history_chart(ctx, &history.samples, now))
            h2 { (ctx.t(Msg::Inventory)) }
            table.facts #inventory {
                (row(ctx, Msg::GpuModel, true, &gpus))
                (row(ctx, Msg::GpuCount, true, &inv.public.gpus.len().to_string()))
                (row(ctx, Msg::GpuMemory, true, &memory(ctx, vram)))
                (row(ctx, Msg::Cpu, true, &format!("{} ({})", inv.public.cpu_model, inv.public.cpu_cores)))
                (row(ctx, Msg::Ram, true, &memory(ctx, inv.public.ram_mib)))
                (row(ctx, Msg::Disk, true, &fill(ctx.t(Msg::Gib), &[("n", &inv.public.disk_gib.to_string())])))
                (row(ctx, Msg::RentalDiskLimit, true, ctx.t(match inv.public.rental_disk_limit {
                    Some(true) => Msg::DiskLimitOn,
                    Some(false) => Msg::DiskLimitOff,
                    None => Msg::DiskLimitUnknown,
                })))
                tr { th { (ctx.t(Msg::Hostname)) } td.value #hostname { (p.hostname) } td { (seen_by(ctx, false)) } }
                tr {
                    th { (ctx.t(Msg::GpuUuids)) }
                    td.value #gpu-uuids { @for u in &p.gpu_uuids { (u) br; } }
                    td { (seen_by(ctx, false)) }
                }
                (row(ctx, Msg::Os, false, &p.os))
                (row(ctx, Msg::Kernel, false, &p.kernel))
                (row(ctx, Msg::Driver, false, opt(&p.driver_version)))
                (row(ctx, Msg::Cuda, false, opt(&p.cuda_version)))
                (row(ctx, Msg::Docker, false, opt(&p.docker_version)))
                (row(ctx, Msg::Toolkit, false, opt(&p.toolkit_version)))
                (row(ctx, Msg::AgentVersion, false, &n.agent_version))
                (row(ctx, Msg::Registered, false, &utc(n.registered_at)))
            }
            h2 { (ctx.t(Msg::LastProbe)) }
            @match &n.last_probe_output {
                Some(out) => { p { (ctx.t(Msg::ProbeOutput)) ":" } pre #probe-output { (out) } },
                None => p #probe-output { (ctx.t(Msg::NoProbeYet)) },
            }
            h2 { (ctx.t(Msg::Commands)) }
            @if n.commands.is_empty() {
                p #no-commands { (ctx.t(Msg::NoCommands)) }
            } @else {
                table.cards #commands {
                    thead { tr {
                        th { (ctx.t(Msg::ColWhen)) } th { (ctx.t(Msg::ColCommand)) } th { (ctx.t(Msg::ColResult)) }
                    } }
                    tbody {
                        @for c in n.commands.iter().rev() {
                            @let (class, result, text) = command_outcome(ctx, n, c, check_image);
                            tr.command data-kind=(c.kind) {
                                td data-label=(ctx.t(Msg::ColWhen)) { (utc(c.queued_at)) }
                                td data-label=(ctx.t(Msg::ColCommand)) { (command_name(ctx, &c.kind)) }
                                td.result.(class) data-label=(ctx.t(Msg::ColResult)) data-result=(result) { (text) }
                            }
                        }
                    }
                }
            }
            (rental_table(ctx, &history.rentals))
            (event_log(ctx, &history.events))
        }
    }
}

/// A rental's state in words, and its class (red for a failure).
fn rental_state(ctx: &Ctx, r: &gpum_protocol::RentalSummary) -> (&'static str, String) {
    use gpum_protocol::RentalState::*;
    let m = |k| ctx.t(k).to_owned();
    match r.state {
        Some(Pulling) => ("", m(Msg::RentalPulling)),
        Some(Starting) => ("", m(Msg::RentalStarting)),
        Some(Running) => ("", m(Msg::RentalRunning)),
        Some(Exited) => match r.exit_code {
            Some(code) => ("", format!("{} ({code})", ctx.t(Msg::RentalExitedState))),
            None => ("", m(Msg::RentalExitedState)),
        },
        Some(Stopping) => ("", m(Msg::RentalStopping)),
        Some(Gone) => ("", m(Msg::RentalGoneState)),
        Some(Failed) => ("bad", m(Msg::RentalFailedState)),
        None if r.listed => ("", m(Msg::RentalPending)),
        None if r.stopped_at.is_some() => ("", m(Msg::RentalStoppedState)),
        None => ("", m(Msg::RentalExpired)),
    }
}

/// The rentals shown on a server's page.
pub const RENTALS_SHOWN: usize = 20;

/// The server's rentals, newest first: id, image, GPUs, state, until when (cards on a phone).
/// The image is shown whole (its digest is what runs; at most 400 characters, and cells wrap).
fn rental_table(ctx: &Ctx, rentals: &[gpum_protocol::RentalSummary]) -> Markup {
    html! {
        section #rentals {
            h2 { (ctx.t(Msg::RentalsTitle)) }
            @if rentals.is_empty() {
                p #no-rentals { (ctx.t(Msg::NoRentals)) }
            } @else {
                table.cards #rental-list {
                    thead { tr {
                        th { (ctx.t(Msg::ColRental)) } th { (ctx.t(Msg::ColImage)) }
                        th { (ctx.t(Msg::ColRentalGpus)) } th { (ctx.t(Msg::ColRentalState)) }
                        th { (ctx.t(Msg::ColUntil)) }
                    } }
                    tbody {
                        @for r in rentals.iter().take(RENTALS_SHOWN) {
                            @let (class, state) = rental_state(ctx, r);
                            tr.rental data-id=(r.spec.id) {
                                td.id data-label=(ctx.t(Msg::ColRental)) { (r.spec.id) }
                                td.image data-label=(ctx.t(Msg::ColImage)) { (r.spec.image) }
                                td.gpus data-label=(ctx.t(Msg::ColRentalGpus)) {
                                    @for g in &r.spec.gpu_uuids { (g) br; }
                                }
                                td.state.(class) data-label=(ctx.t(Msg::ColRentalState)) { (state) }
                                td.until data-label=(ctx.t(Msg::ColUntil)) { (utc(r.spec.ends_at)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A number with at most one decimal, in the language's way (`1.5`, `1,5`); whole numbers bare.
fn decimal(ctx: &Ctx, v: f64) -> String {
    let s = if v.fract().abs() < 0.05 || v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") };
    match ctx.lang {
        Lang::Ru => s.replace('.', ","),
        Lang::En => s,
    }
}

/// An amount of memory in the language's units: MiB below a GiB, else GiB.
fn memory(ctx: &Ctx, mib: u64) -> String {
    if mib >= 1024 {
        fill(ctx.t(Msg::Gib), &[("n", &decimal(ctx, mib as f64 / 1024.0))])
    } else {
        fill(ctx.t(Msg::Mib), &[("n", &mib.to_string())])
    }
}

fn used_of(ctx: &Ctx, used: u64, total: u64) -> String {
    fill(ctx.t(Msg::UsedOf), &[("used", &memory(ctx, used)), ("total", &memory(ctx, total))])
}

fn percent(ctx: &Ctx, v: f64) -> String {
    fill(ctx.t(Msg::Percent), &[("n", &decimal(ctx, v))])
}

/// The figures of the last heartbeat: per GPU, and the host's.
fn figures(ctx: &Ctx, n: &NodeSummary) -> Markup {
    html! {
        section #figures {
            h2 { (ctx.t(Msg::FiguresTitle)) " " (seen_by(ctx, false)) }
            @match (&n.last_metrics, n.last_heartbeat_at) {
                (Some(m), Some(at)) => {
                    p.help { (fill(ctx.t(Msg::FiguresAsOf), &[("at", &utc(at))])) }
                    @if m.gpus.is_empty() {
                        p #no-gpu-figures { (ctx.t(Msg::NoGpuFigures)) }
                    } @else {
                        div.scroll {
                            table #gpu-figures {
                                thead { tr {
                                    th { (ctx.t(Msg::ColGpu)) }
                                    th { (ctx.t(Msg::ColUtil)) }
                                    th { (ctx.t(Msg::ColGpuMem)) }
                                    th { (ctx.t(Msg::ColTemp)) }
                                    th { (ctx.t(Msg::ColPower)) }
                                } }
                                tbody {
                                    @for g in &m.gpus {
                                        tr.gpu data-index=(g.index) {
                                            td.gpu-name {
                                                (g.index)
                                                @if let Some(model) = n.inventory.public.gpus.get(g.index as usize) {
                                                    " · " (cut(&model.model))
                                                }
                                            }
                                            td.util data-label=(ctx.t(Msg::ColUtil)) {
                                                (percent(ctx, f64::from(g.util_pct)))
                                            }
                                            td.mem data-label=(ctx.t(Msg::ColGpuMem)) {
                                                (used_of(ctx, g.mem_used_mib, g.mem_total_mib))
                                            }
                                            td.temp data-label=(ctx.t(Msg::ColTemp)) {
                                                (fill(ctx.t(Msg::Celsius), &[("n", &g.temp_c.to_string())]))
                                            }
                                            td.power data-label=(ctx.t(Msg::ColPower)) {
                                                (fill(ctx.t(Msg::Watts), &[("n", &decimal(ctx, f64::from(g.power_w)))]))
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    table.facts #host-figures {
                        tr { th { (ctx.t(Msg::HostCpuLoad)) } td.value #cpu-load { (percent(ctx, f64::from(m.cpu_load_pct))) } }
                        tr { th { (ctx.t(Msg::HostRamUsed)) } td.value #ram-used { (used_of(ctx, m.ram_used_mib, m.ram_total_mib)) } }
                        tr {
                            th { (ctx.t(Msg::HostDiskFree)) }
                            td.value #disk-free { (fill(ctx.t(Msg::Gib), &[("n", &m.disk_free_gib.to_string())])) }
                        }
                    }
                },
                _ => p #no-figures { (ctx.t(Msg::NoFigures)) },
            }
        }
    }
}

/// A series of the chart: a share in percent of one sample's figures, `None` where the sample
/// has nothing to give (no GPU, no total).
type Series = (&'static str, Msg, fn(&Metrics) -> Option<f64>);

const SERIES: [Series; 4] = [
    ("s-gpu", Msg::SeriesGpuUtil, |m| {
        (!m.gpus.is_empty())
            .then(|| m.gpus.iter().map(|g| f64::from(g.util_pct)).sum::<f64>() / m.gpus.len() as f64)
    }),
    ("s-vram", Msg::SeriesGpuMem, |m| {
        let total: f64 = m.gpus.iter().map(|g| g.mem_total_mib as f64).sum();
        (total > 0.0).then(|| m.gpus.iter().map(|g| g.mem_used_mib as f64).sum::<f64>() * 100.0 / total)
    }),
    ("s-cpu", Msg::SeriesCpu, |m| Some(f64::from(m.cpu_load_pct))),
    ("s-ram", Msg::SeriesRam, |m| {
        (m.ram_total_mib > 0).then(|| m.ram_used_mib as f64 * 100.0 / m.ram_total_mib as f64)
    }),
];

/// The chart's drawing area, in its own units: the day across, 0 to 100 % up.
const CHART_W: f64 = 1000.0;
const CHART_H: f64 = 100.0;

/// The polylines of one series: a line breaks where samples are more than two intervals apart
/// (the server was offline) or where the series has no value.
fn series_lines(
    samples: &[MetricsSample],
    now: u64,
    value: fn(&Metrics) -> Option<f64>,
) -> Vec<Vec<(f64, f64)>> {
    let start = now.saturating_sub(SAMPLE_WINDOW_SECS);
    let mut lines: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut prev: Option<u64> = None;
    for s in samples {
        let Some(v) = value(&s.metrics).filter(|v| v.is_finite()) else {
            prev = None;
            continue;
        };
        let x = (s.at.saturating_sub(start) as f64 / SAMPLE_WINDOW_SECS as f64 * CHART_W).clamp(0.0, CHART_W);
        let y = CHART_H - v.clamp(0.0, 100.0) * CHART_H / 100.0;
        match (prev, lines.last_mut()) {
            (Some(p), Some(line)) if s.at.saturating_sub(p) <= 2 * SAMPLE_INTERVAL_SECS => line.push((x, y)),
            _ => lines.push(vec![(x, y)]),
        }
        prev = Some(s.at);
    }
    lines
}

/// `x,y x,y …`; a line of one sample is drawn as a short dash, so that it shows.
fn points(line: &[(f64, f64)]) -> String {
    let one;
    let line = if let [(x, y)] = line {
        let x = x.clamp(2.0, CHART_W - 2.0);
        one = [(x - 2.0, *y), (x + 2.0, *y)];
        &one[..]
    } else {
        line
    };
    line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect::<Vec<_>>().join(" ")
}

/// The day's chart: server-rendered SVG (no script, no CDN, no inline style), as wide as the
/// page; the legend and the times are HTML, so they keep their size on a phone.
fn history_chart(ctx: &Ctx, samples: &[MetricsSample], now: u64) -> Markup {
    html! {
        section #history {
            h2 { (ctx.t(Msg::HistoryTitle)) " " (seen_by(ctx, false)) }
            @if samples.is_empty() {
                p #no-history { (ctx.t(Msg::NoHistory)) }
            } @else {
                p.help { (ctx.t(Msg::HistoryHelp)) }
                svg.chart viewBox={ "0 0 " (CHART_W) " " (CHART_H) } preserveAspectRatio="none"
                    role="img" data-samples=(samples.len()) {
                    title { (fill(ctx.t(Msg::ChartTitle), &[("n", &samples.len().to_string())])) }
                    @for y in [0.0, 25.0, 50.0, 75.0, 100.0] {
                        line.grid x1="0" x2=(CHART_W) y1=(y) y2=(y) vector-effect="non-scaling-stroke" {}
                    }
                    @for (class, _, value) in SERIES {
                        @for line in series_lines(samples, now, value) {
                            polyline.series.(class) points=(points(&line)) fill="none"
                                vector-effect="non-scaling-stroke" {}
                        }
                    }
                }
                div.axis {
                    span { (fill(ctx.t(Msg::TimeUtc), &[("at", &utc(now.saturating_sub(SAMPLE_WINDOW_SECS)))])) }
                    span { (fill(ctx.t(Msg::TimeUtc), &[("at", &utc(now))])) }
                }
                ul.series-legend {
                    @for (class, label, _) in SERIES {
                        li { span.swatch.(class) {} " " (ctx.t(label)) }
                    }
                }
            }
        }
    }
}

/// A command's kind in words; an unknown one as it came.
fn command_name(ctx: &Ctx, kind: &str) -> String {
    match CommandKind::parse(kind) {
        Some(CommandKind::Recheck) => ctx.t(Msg::CmdRecheck).to_owned(),
        Some(CommandKind::Restart) => ctx.t(Msg::CmdRestart).to_owned(),
        None => kind.to_owned(),
    }
}

/// An event in words, and the message that goes with it, if any (a node's text, shown as such).
fn event_text(ctx: &Ctx, e: &NodeEvent) -> (String, Option<String>) {
    use NodeEventKind::*;
    let detail = match e.detail.as_str() {
        "" => None,
        // The exit code is in the text itself.
        _ if e.kind == NodeEventKind::RentalExited => None,
        // The agent's one reason for removing a container, in the owner's language.
        gpum_protocol::REMOVAL_REASON_UNKNOWN if e.kind == NodeEventKind::ContainerRemoved => {
            Some(ctx.t(Msg::RemovalUnknown).to_owned())
        }
        d => Some(d.to_owned()),
    };
    let text = match e.kind {
        Registered => ctx.t(Msg::EvRegistered).to_owned(),
        Online => ctx.t(Msg::EvOnline).to_owned(),
        Offline => ctx.t(Msg::EvOffline).to_owned(),
        HardwareChanged => {
            let parts: Vec<&str> = e
                .subject
                .split(',')
                .filter_map(|p| match p {
                    "gpus" => Some(ctx.t(Msg::PartGpus)),
                    "cpu" => Some(ctx.t(Msg::PartCpu)),
                    "ram" => Some(ctx.t(Msg::PartRam)),
                    "disk" => Some(ctx.t(Msg::PartDisk)),
                    "software" => Some(ctx.t(Msg::PartSoftware)),
                    "hostname" => Some(ctx.t(Msg::PartHostname)),
                    _ => None,
                })
                .collect();
            fill(ctx.t(Msg::EvHardwareChanged), &[("parts", &parts.join(", "))])
        }
        CheckPassed => ctx.t(Msg::EvCheckPassed).to_owned(),
        CheckFailed => match gpum_protocol::ProbeFailure::parse(&e.subject) {
            Some(reason) => format!("{}: {}", ctx.t(Msg::EvCheckFailed), probe_failure(reason, ctx.lang)),
            None => ctx.t(Msg::EvCheckFailed).to_owned(),
        },
        CommandSent => fill(ctx.t(Msg::EvCommandSent), &[("cmd", &command_name(ctx, &e.subject))]),
        CommandOk => fill(ctx.t(Msg::EvCommandOk), &[("cmd", &command_name(ctx, &e.subject))]),
        CommandFailed => fill(ctx.t(Msg::EvCommandFailed), &[("cmd", &command_name(ctx, &e.subject))]),
        ContainerRemoved => fill(ctx.t(Msg::EvContainerRemoved), &[("name", &cut(&e.subject))]),
        TokenReplaced => ctx.t(Msg::EvTokenReplaced).to_owned(),
        Deleted => ctx.t(Msg::EvDeleted).to_owned(),
        RentalCreated => fill(ctx.t(Msg::EvRentalCreated), &[("id", &cut(&e.subject))]),
        RentalStarted => fill(ctx.t(Msg::EvRentalStarted), &[("id", &cut(&e.subject))]),
        RentalExited => fill(ctx.t(Msg::EvRentalExited), &[("id", &cut(&e.subject)), ("code", &e.detail)]),
        RentalStopped => fill(ctx.t(Msg::EvRentalStopped), &[("id", &cut(&e.subject))]),
        RentalGone => fill(ctx.t(Msg::EvRentalGone), &[("id", &cut(&e.subject))]),
        RentalFailed => fill(ctx.t(Msg::EvRentalFailed), &[("id", &cut(&e.subject))]),
        Quarantined => ctx.t(Msg::EvQuarantined).to_owned(),
        QuarantineLifted => ctx.t(Msg::EvQuarantineLifted).to_owned(),
    };
    (text, detail)
}

/// What went wrong is red; nothing in the log is green, since a log of the past never says the
/// server is healthy now (a machine with no GPU never looks healthy, whatever it once passed).
fn event_class(k: NodeEventKind) -> &'static str {
    use NodeEventKind::*;
    match k {
        Offline | CheckFailed | CommandFailed | Deleted | RentalFailed | Quarantined => "bad",
        Registered | Online | HardwareChanged | CheckPassed | CommandSent | CommandOk | ContainerRemoved
        | TokenReplaced | RentalCreated | RentalStarted | RentalExited | RentalStopped | RentalGone
        | QuarantineLifted => "",
    }
}

/// The event log, newest first, times in UTC.
fn event_log(ctx: &Ctx, events: &[NodeEvent]) -> Markup {
    html! {
        section #events {
            h2 { (ctx.t(Msg::EventsTitle)) " " (seen_by(ctx, false)) }
            @if events.is_empty() {
                p #no-events { (ctx.t(Msg::NoEvents)) }
            } @else {
                table #event-log {
                    thead { tr { th.time { (ctx.t(Msg::ColTime)) } th { (ctx.t(Msg::ColEvent)) } } }
                    tbody {
                        @for e in events {
                            @let (text, detail) = event_text(ctx, e);
                            tr.event data-kind=(e.kind.as_str()) {
                                td.time { (utc(e.at)) }
                                td.what.(event_class(e.kind)) {
                                    (text)
                                    @if let Some(d) = detail { ": " span.detail { (d) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What became of a command, judged by what followed it, never by the acknowledgement alone:
/// the class (`ok` green, `wait`, `bad`), the `data-result` and the words.
///
/// - Not delivered: waiting for the agent, or, offline, not delivered.
/// - A restart: "restarting" from its delivery until a heartbeat later than the agent's
///   acknowledgement (the agent acknowledges, then exits; systemd starts it again), then "back
///   online"; offline meanwhile: it did not come back.
/// - A recheck: green only when a probe report arrived after the acknowledgement and the check
///   passed; "no check ran" when the operator has chosen no check image; else running, or
///   offline with no result.
fn command_outcome(
    ctx: &Ctx,
    n: &NodeSummary,
    c: &CommandStatus,
    check_image: bool,
) -> (&'static str, &'static str, String) {
    let w = |m: Msg| ctx.t(m).to_owned();
    let kind = CommandKind::parse(&c.kind);
    let Some(r) = &c.result else {
        return match (c.delivered_at, n.online, kind) {
            (None, true, _) => ("wait", "queued", w(Msg::CommandQueued)),
            (None, false, _) => ("bad", "undelivered", w(Msg::CommandUndelivered)),
            (Some(_), false, _) => ("bad", "lost", w(Msg::CommandLost)),
            (Some(_), true, Some(CommandKind::Restart)) => ("wait", "restarting", w(Msg::Restarting)),
            (Some(_), true, Some(CommandKind::Recheck)) => ("wait", "delivered", w(Msg::RecheckDelivered)),
            (Some(_), true, None) => ("wait", "delivered", w(Msg::CommandDelivered)),
        };
    };
    if !r.ok {
        let mut t = w(Msg::CommandFailed);
        if !r.message.is_empty() {
            t.push_str(": ");
            t.push_str(&r.message);
        }
        return ("bad", "failed", t);
    }
    let done = c.completed_at.unwrap_or(0);
    match kind {
        Some(CommandKind::Restart) => {
            if n.online && n.last_heartbeat_at.is_some_and(|h| h > done) {
                ("ok", "back-online", w(Msg::BackOnline))
            } else if n.online {
                ("wait", "restarting", w(Msg::Restarting))
            } else {
                ("bad", "not-back", w(Msg::NotBack))
            }
        }
        Some(CommandKind::Recheck) => {
            if n.last_probe_at.is_some_and(|p| p >= done) {
                match verification_class(n) {
                    "ok" => ("ok", "passed", w(Msg::RecheckPassed)),
                    "bad" if n.verification == VerificationState::Verified => {
                        ("bad", "no-gpu", w(Msg::RentNoGpu))
                    }
                    "bad" => {
                        let mut t = w(Msg::RecheckFailed);
                        if let Some(f) = n.last_probe_reason {
                            t.push_str(": ");
                            t.push_str(probe_failure(f, ctx.lang));
                        }
                        ("bad", "check-failed", t)
                    }
                    _ => ("wait", "checking", w(Msg::RecheckRunning)),
                }
            } else if !check_image {
                ("wait", "no-check", w(Msg::RecheckNoImage))
            } else if n.online {
                ("wait", "checking", w(Msg::RecheckRunning))
            } else {
                ("bad", "no-result", w(Msg::RecheckNoResult))
            }
        }
        None => ("ok", "ok", w(Msg::CommandOk)),
    }
}

/// A command refused because the server is offline: nothing was queued.
pub fn command_refused(ctx: &Ctx, id: &str) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::CommandRefused),
        html! {
            p.error #command-refused { (ctx.t(Msg::CommandsOffline)) }
            p { a href={ "/dashboard/servers/" (id) } { (ctx.t(Msg::Back)) } }
        },
    )
}

pub fn confirm_delete(ctx: &Ctx, id: &str) -> Markup {
    let base = format!("/dashboard/servers/{id}");
    layout(
        ctx,
        &fill(ctx.t(Msg::DeleteTitle), &[("node", id)]),
        html! {
            p { (ctx.t(Msg::DeleteWhatNext)) }
            ul #delete-explained {
                li { (ctx.t(Msg::DeleteAgentStops)) }
                li { (ctx.t(Msg::DeleteFilesStay)) }
                li { (ctx.t(Msg::DeleteNewServer)) }
            }
            form #delete-form method="post" action={ (base) "/delete" } {
                (csrf_field(ctx))
                button.danger #confirm-delete type="submit" { (ctx.t(Msg::DeleteConfirm)) }
                " "
                a #cancel href=(base) { (ctx.t(Msg::Cancel)) }
            }
        },
    )
}

pub fn confirm_rotate(ctx: &Ctx, id: &str) -> Markup {
    let base = format!("/dashboard/servers/{id}");
    layout(
        ctx,
        &fill(ctx.t(Msg::RotateTitle), &[("node", id)]),
        html! {
            p #rotate-explained { (ctx.t(Msg::RotateExplain)) }
            form #rotate-form method="post" action={ (base) "/rotate-token" } {
                (csrf_field(ctx))
                button.danger #confirm-rotate type="submit" { (ctx.t(Msg::RotateConfirm)) }
                " "
                a #cancel href=(base) { (ctx.t(Msg::Cancel)) }
            }
        },
    )
}

/// The new token, shown once (this answer is `no-store`), with the commands that hand it to
/// the agent on the machine: the token goes through stdin, never argv.
pub fn rotated(ctx: &Ctx, id: &str, token: &str, public_url: &str) -> Markup {
    let configure = format!("sudo /opt/gpum-agent/gpum-agent configure --server {public_url} --node-id {id}");
    let start = "sudo systemctl restart gpum-agent".to_owned();
    layout(
        ctx,
        &fill(ctx.t(Msg::RotatedTitle), &[("node", id)]),
        html! {
            p.error { (ctx.t(Msg::RotatedOnce)) }
            (copyable(ctx, "new-token", token))
            p { (ctx.t(Msg::RotatedSteps)) }
            (copyable(ctx, "cmd-configure", &configure))
            (copyable(ctx, "cmd-start", &start))
            p { a href={ "/dashboard/servers/" (id) } { (ctx.t(Msg::Back)) } }
        },
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn prices_as_typed_and_shown() {
        for (typed, minor) in
            [("12", 1200), ("12.5", 1250), ("12,50", 1250), (" 0.07 ", 7), ("1000000", 100_000_000)]
        {
            assert_eq!(parse_price(typed), Some(minor), "{typed}");
        }
        for bad in ["", ".5", "1.234", "-1", "1e3", "12.5.0", "１２", "9999999999999", "1.a"] {
            assert_eq!(parse_price(bad), None, "{bad}");
        }
        assert_eq!(price_text(1250), "12.50");
        assert_eq!(price_text(7), "0.07");
        let ctx = Ctx { lang: Lang::Ru, path: "/".into(), csrf: None, account: None };
        let mut n = node("node-1");
        n.price_per_gpu_hour = Some(1250);
        n.paused = true;
        let s = servers(&ctx, &[n.clone()], PageAt::default(), 6, None, None).into_string();
        assert!(s.contains("12.50 за час работы видеокарты") && s.contains("приостановлен вами"), "{s}");
        n.price_per_gpu_hour = None;
        assert!(
            server(&ctx, &n, &History::default(), 6, None, true).into_string().contains("пока не сдаётся")
        );
    }

    /// Each verdict in words in both languages; a failed check's fix is copyable; a machine with
    /// no GPU is never green, whatever its last check said.
    #[test]
    fn verdicts_in_words_and_a_machine_without_a_gpu_is_never_green() {
        use gpum_protocol::{GpuPublic, Health, NvmlState, ProbeFailure, Rentable};
        let mut n = node("node-1");
        n.inventory.public.gpus = vec![GpuPublic { model: "G".into(), vram_mib: 1024 }];
        n.health = Some(Health { nvml: NvmlState::LibraryMissing, ..Default::default() });
        n.verification = VerificationState::Verified;
        n.rentable = crate::rentable::verdict(&n, true, crate::rentable::Owner::Enabled);
        assert_eq!(n.rentable.state, RentableState::NoGpu);
        for lang in [Lang::Ru, Lang::En] {
            let ctx = Ctx { lang, path: "/".into(), csrf: None, account: None };
            for page in [
                servers(&ctx, std::slice::from_ref(&n), PageAt::default(), 6, None, None),
                server(&ctx, &n, &History::default(), 6, None, true),
            ] {
                let s = page.into_string();
                assert!(!s.contains("class=\"ok") && !s.contains("class=\"online\""), "{s}");
                assert!(s.contains("libnvidia-ml"), "{s}");
            }
        }
        n.health = Some(Health { nvml: NvmlState::Ok, ..Default::default() });
        n.verification = VerificationState::Failed;
        n.last_probe_reason = Some(ProbeFailure::NoNvidiaRuntime);
        n.rentable = crate::rentable::verdict(&n, true, crate::rentable::Owner::Enabled);
        let ctx = Ctx { lang: Lang::En, path: "/".into(), csrf: None, account: None };
        let s = server(&ctx, &n, &History::default(), 6, None, true).into_string();
        assert!(s.contains("not rentable: the GPU check failed: Docker has no nvidia runtime"), "{s}");
        assert!(s.contains("<code id=\"fix-node-1\">sudo nvidia-ctk runtime configure"), "{s}");
        assert!(s.contains("data-copy=\"fix-node-1\""), "{s}");
        n.rentable = Rentable { state: RentableState::Offline, since: Some(1_796_290_406) };
        let ru = Ctx { lang: Lang::Ru, path: "/".into(), csrf: None, account: None };
        assert!(
            server(&ru, &n, &History::default(), 6, None, true)
                .into_string()
                .contains("не сдаётся: офлайн с 2026-12-03 09:33 (UTC)")
        );
        n.rentable.state = RentableState::AwaitingOperator;
        assert!(
            servers(&ru, &[n], PageAt::default(), 6, None, None)
                .into_string()
                .contains("оператор платформы выберет образ")
        );
    }

    fn rental(
        text: &str,
        state: Option<gpum_protocol::RentalState>,
        reason: Option<&str>,
    ) -> gpum_protocol::RentalSummary {
        gpum_protocol::RentalSummary {
            node_id: "node-1".into(),
            spec: gpum_protocol::RentalSpec {
                id: format!("rent-{text}"),
                image: format!("{text}@sha256:00"),
                gpu_uuids: vec![format!("GPU-{text}")],
                cpu_millis: 1000,
                memory_mib: 1024,
                disk_gib: 1,
                shm_mib: 64,
                env: vec![],
                command: vec![],
                ends_at: 1_796_290_406,
                ports: vec![],
                driver_capabilities: vec![],
            },
            created_at: 1,
            stopped_at: None,
            listed: state.is_none(),
            state,
            exit_code: Some(3),
            reason: reason.map(String::from),
            updated_at: None,
            tunnel: None,
        }
    }

    /// The server's rentals in a table of cards, each cell labelled, in both languages; none: a
    /// line that says so.
    #[test]
    fn the_server_page_says_whether_a_rentals_disk_can_be_limited() {
        let mut n = node("node-1");
        for (limit, en, ru) in [
            (Some(true), "enforced: XFS with project quotas", "есть: XFS с квотами проектов"),
            (Some(false), "not enforced: a rental's disk is bounded only", "нет: диск аренды ограничен"),
            (None, "unknown: the agent did not say", "неизвестно: агент не сообщил"),
        ] {
            n.inventory.public.rental_disk_limit = limit;
            for (lang, want) in [(Lang::En, en), (Lang::Ru, ru)] {
                let ctx = Ctx { lang, path: "/".into(), csrf: None, account: None };
                let s = server(&ctx, &n, &History::default(), 6, None, true).into_string();
                assert!(
                    s.contains(&maud::html! { (want) }.into_string()),
                    "{lang:?} {limit:?}: {want} in {s}"
                );
            }
        }
    }

    #[test]
    fn the_server_page_lists_its_rentals_in_both_languages() {
        use gpum_protocol::RentalState::*;
        let n = node("node-1");
        let h = History {
            rentals: vec![
                rental("a", Some(Running), None),
                rental("b", Some(Exited), None),
                rental("c", None, None),
            ],
            ..Default::default()
        };
        for (lang, want) in [
            (Lang::En, ["Rentals", "running", "exited (3)", "waiting for the agent", "Until (UTC)"]),
            (Lang::Ru, ["Аренды", "работает", "процесс завершился (3)", "ждёт агента", "До (UTC)"]),
        ] {
            let ctx = Ctx { lang, path: "/".into(), csrf: None, account: None };
            let s = server(&ctx, &n, &h, 6, None, true).into_string();
            for w in want {
                assert!(s.contains(w), "{lang:?}: {w} in {s}");
            }
            assert!(s.contains("<table class=\"cards\" id=\"rental-list\">"), "{s}");
            assert_eq!(s.matches("<tr class=\"rental\"").count(), 3);
            assert!(s.contains("2026-12-03 09:33"), "{s}");
            let empty = server(&ctx, &n, &History::default(), 6, None, true).into_string();
            assert!(empty.contains("id=\"no-rentals\""), "{empty}");
        }
        // Each cell is labelled for the phone's cards.
        let ctx = Ctx { lang: Lang::Ru, path: "/".into(), csrf: None, account: None };
        let s = server(&ctx, &n, &h, 6, None, true).into_string();
        for label in ["Аренда", "Образ", "Видеокарты", "Состояние", "До (UTC)"]
        {
            assert!(s.contains(&format!("data-label=\"{label}\"")), "{label}");
        }
    }

    /// The figures per GPU and host, the day's chart (a line per series, broken at a gap) and the
    /// event log, in both languages, with a node's text escaped and no inline style.
    #[test]
    fn figures_chart_and_event_log_in_both_languages() {
        use NodeEventKind::*;
        use gpum_protocol::{GpuMetrics, GpuPublic};
        let m = |util| Metrics {
            cpu_load_pct: 12.5,
            ram_used_mib: 65_536,
            ram_total_mib: 262_144,
            disk_free_gib: 870,
            gpus: vec![
                GpuMetrics {
                    index: 0,
                    util_pct: util,
                    mem_used_mib: 40_960,
                    mem_total_mib: 81_920,
                    temp_c: 61,
                    power_w: 250.4,
                },
                GpuMetrics {
                    index: 1,
                    util_pct: 0,
                    mem_used_mib: 512,
                    mem_total_mib: 81_920,
                    temp_c: 35,
                    power_w: 60.5,
                },
            ],
        };
        let mut n = node("node-1");
        n.inventory.public.gpus = vec![GpuPublic { model: "NVIDIA A100".into(), vram_mib: 81_920 }; 2];
        n.last_metrics = Some(m(87));
        let now = 100_000;
        // Six samples 5 minutes apart, an hour's gap, then three more.
        let mut samples: Vec<MetricsSample> =
            (0..6).map(|i| MetricsSample { at: now - 7200 + i * 300, metrics: m(10 * i as u32) }).collect();
        samples.extend((0..3).map(|i| MetricsSample { at: now - 600 + i * 300, metrics: m(50) }));
        let ev = |at, kind, subject: &str, detail: &str| NodeEvent {
            at,
            kind,
            subject: subject.into(),
            detail: detail.into(),
        };
        let events = vec![
            ev(now - 10, CommandFailed, "restart", "<b>no</b>"),
            ev(now - 20, CommandSent, "restart", ""),
            ev(now - 30, CheckFailed, "timeout", ""),
            ev(now - 40, HardwareChanged, "gpus,software", ""),
            ev(now - 50, ContainerRemoved, "<i>job</i>", gpum_protocol::REMOVAL_REASON_UNKNOWN),
            ev(now - 3600, Online, "", ""),
            ev(now - 7200, Offline, "", ""),
            ev(1, Registered, "", ""),
        ];
        let h = History { samples, events, rentals: vec![] };
        let cases = [
            (
                Lang::En,
                [
                    "87%",
                    "40 GiB of 80 GiB",
                    "512 MiB of 80 GiB",
                    "61 °C",
                    "250 W",
                    "60.5 W",
                    "12.5%",
                    "64 GiB of 256 GiB",
                    "870 GiB",
                    "0 · NVIDIA A100",
                ],
                [
                    "command failed: restart the agent: <b>no</b>",
                    "command sent: restart the agent",
                    "the GPU check failed: the check did not finish in time",
                    "the hardware changed: GPUs, software",
                    "the agent removed container <i>job</i>: unknown to the platform",
                    "came online",
                    "went offline: no heartbeat after this",
                    "the server registered",
                ],
            ),
            (
                Lang::Ru,
                [
                    "87 %",
                    "40 ГиБ из 80 ГиБ",
                    "512 МиБ из 80 ГиБ",
                    "61 °C",
                    "250 Вт",
                    "60,5 Вт",
                    "12,5 %",
                    "64 ГиБ из 256 ГиБ",
                    "870 ГиБ",
                    "0 · NVIDIA A100",
                ],
                [
                    "команда не выполнена: перезапуск агента: <b>no</b>",
                    "отправлена команда: перезапуск агента",
                    "проверка видеокарты не пройдена: проверка не уложилась в отведённое время",
                    "изменилось оборудование: видеокарты, программы",
                    "агент удалил контейнер <i>job</i>: платформа его не знает",
                    "вышел на связь",
                    "офлайн: после этого агент не выходил на связь",
                    "сервер зарегистрирован",
                ],
            ),
        ];
        for (lang, figures, events) in cases {
            let ctx = Ctx { lang, path: "/".into(), csrf: None, account: None };
            let page = server(&ctx, &n, &h, now, None, true).into_string();
            // Text as a browser shows it: tags dropped, entities read.
            let text = |from: &str, to: &str| {
                let part = &page[page.find(from).unwrap()..page.find(to).unwrap()];
                let mut out = String::new();
                let mut in_tag = false;
                for c in part.chars() {
                    match c {
                        '<' => in_tag = true,
                        '>' => in_tag = false,
                        c if !in_tag => out.push(c),
                        _ => {}
                    }
                }
                out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", "\"")
            };
            let shown = text("id=\"figures\"", "id=\"history\"");
            for f in figures {
                assert!(shown.contains(f), "{lang:?} {f:?} in {shown}");
            }
            let log = text("id=\"events\"", "</main>");
            let mut at = 0;
            for e in events {
                let i = log[at..].find(e).unwrap_or_else(|| panic!("{lang:?}: {e:?} in order in {log}")) + at;
                at = i + e.len();
            }
            assert!(!page.contains("<b>") && !page.contains("<i>"), "escaped");
            // The inventory's memory in the language's units too, here and in the list.
            let gpus = match lang {
                Lang::Ru => "2 × NVIDIA A100 (80 ГиБ)",
                Lang::En => "2 × NVIDIA A100 (80 GiB)",
            };
            assert!(page.contains(gpus), "{gpus}");
            assert!(
                servers(&ctx, std::slice::from_ref(&n), PageAt::default(), now, None, None)
                    .into_string()
                    .contains(gpus)
            );
            if lang == Lang::Ru {
                assert!(!page.contains("GiB") && !page.contains("MiB"), "{page}");
            }
            assert!(!page.contains("style="), "no inline style");
            // Four series, each in two lines (the gap breaks them), nine samples.
            assert_eq!(page.matches("<polyline").count(), 8, "{page}");
            assert!(page.contains("data-samples=\"9\""));
            assert_eq!(page.matches("</polyline>").count(), 8, "closed, so nothing nests in them");
        }
        // With nothing yet: said so, no chart.
        let ctx = Ctx { lang: Lang::Ru, path: "/".into(), csrf: None, account: None };
        let page = server(&ctx, &node("node-2"), &History::default(), now, None, true).into_string();
        for id in ["no-figures", "no-history", "no-events"] {
            assert!(page.contains(&format!("id=\"{id}\"")), "{id}");
        }
        assert!(!page.contains("<svg"));
    }

    /// Proper names a Russian text may carry in Latin letters: product and program names,
    /// standard abbreviations, the name of the other language on its switch, and keys.
    const LATIN_ALLOWED: &[&str] = &[
        "gpum", "GPU", "NVIDIA", "CUDA", "Docker", "UUID", "UTC", "ID", "TOTP", "URL", "API", "XFS",
        "English", "Enter", "Ctrl", "D", "root",
    ];

    /// What a Russian text may quote verbatim because the owner types or reads it as it is: the
    /// commands, flags, files and paths it names. Cut out before the Latin words are counted.
    const QUOTED: &[&str] = &[
        "sudo nvidia-ctk runtime configure --runtime=docker",
        "sudo nvidia-ctk runtime \
             configure --runtime=docker",
        "sudo systemctl restart docker",
        "sudo /opt/gpum-agent/gpum-agent uninstall --yes",
        "sudo env TMPDIR=/var/tmp bash",
        "sudo bash",
        "sudo",
        "--admin-token-file",
        "--dist",
        "--dry-run",
        "docs/operator-guide.md",
        "libnvidia-ml",
        "nvidia-smi",
        "/tmp",
        "(noexec)",
        "@sha256:",
        "NVIDIA Container Toolkit",
        "°C",
    ];

    /// The Latin words of `text` (maximal runs of ASCII letters) that are not allowed in
    /// Russian: none may remain once the quoted commands are cut out.
    pub(crate) fn english_in(text: &str) -> Vec<String> {
        // Placeholders (`{n}`) are filled by the caller.
        let mut t = String::new();
        let mut rest = text;
        while let Some(a) = rest.find('{') {
            t.push_str(&rest[..a]);
            rest = rest[a..].find('}').map_or("", |b| &rest[a + b + 1..]);
        }
        t.push_str(rest);
        for q in QUOTED {
            t = t.replace(q, " ");
        }
        t.split(|c: char| !c.is_ascii_alphabetic())
            .filter(|w| !w.is_empty() && !LATIN_ALLOWED.contains(w))
            .map(str::to_owned)
            .collect()
    }

    /// A page's text as the owner reads it: tags and code blocks (`pre`, `code`: commands,
    /// copied as they are) cut out, the script and stylesheet links with them.
    pub(crate) fn prose(html: &str) -> String {
        let mut s = html.to_owned();
        for tag in ["pre", "code", "title"] {
            while let Some(a) = s.find(&format!("<{tag}")) {
                let end = format!("</{tag}>");
                let Some(b) = s[a..].find(&end) else { break };
                s.replace_range(a..a + b + end.len(), " ");
            }
        }
        let mut out = String::new();
        let mut in_tag = false;
        for c in s.chars() {
            match c {
                '<' => in_tag = true,
                '>' => {
                    in_tag = false;
                    out.push(' ');
                }
                c if !in_tag => out.push(c),
                _ => {}
            }
        }
        out.replace("&amp;", "&").replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">")
    }

    /// Issue 32: Russian reads naturally and never mixes English in. Every Russian text of the
    /// message table, and every page rendered in Russian (with a node whose own values are
    /// Russian, so that only the page's words are read), has no Latin word but the proper
    /// names of [`LATIN_ALLOWED`] and the commands of [`QUOTED`].
    ///
    /// The wording review fixed these phrases:
    /// - «80 GiB», «512 MiB», «870 GiB» (units) → «80 ГиБ», «512 МиБ», «870 ГиБ», as the owner's guide;
    /// - command names «recheck», «restart» shown raw in the command history → «повторная
    ///   проверка», «перезапуск агента»;
    /// - «Система» (OS) → «Операционная система»;
    /// - «ждёт агента» → «ждёт, когда агент выйдет на связь»;
    /// - «Машина зарегистрирована, ждём первой связи агента» → «…; ждём, когда агент впервые
    ///   выйдет на связь»;
    /// - «Пустое поле — имя компьютера» → «Если оставить поле пустым, названием будет имя
    ///   компьютера»;
    /// - «в Docker не настроена среда nvidia» → «в Docker не настроена среда выполнения NVIDIA»;
    /// - «Docker отказал контейнеру в доступе к GPU» → «… к видеокарте»;
    /// - «nvidia-smi в контейнере завершился с ошибкой» → «программа nvidia-smi в контейнере
    ///   завершилась с ошибкой»;
    /// - «образ для проверки не закреплён по дайджесту» → «образ для проверки указан без
    ///   контрольной суммы (@sha256:…)»;
    /// - «реестр образа для проверки не разрешён» → «хранилище образа для проверки не разрешено»;
    /// - «Нужны права root» → «Нужны права суперпользователя (root)».
    #[test]
    fn russian_reads_without_english_words() {
        let mut found = Vec::new();
        for m in Msg::ALL {
            if *m == Msg::LangSwitch {
                continue; // "English": the other language, named in its own words
            }
            let ru = t(*m, Lang::Ru);
            let bad = english_in(ru);
            if !bad.is_empty() {
                found.push(format!("{m:?}: {bad:?} in «{ru}»"));
            }
        }

        let ctx = Ctx { lang: Lang::Ru, path: "/dashboard".into(), csrf: Some("к".into()), account: None };
        let mut n = node("узел-1");
        n.name = "стойка".into();
        n.agent_version = "1".into();
        n.inventory.public.gpus =
            vec![gpum_protocol::GpuPublic { model: "видеокарта".into(), vram_mib: 81_920 }];
        n.inventory.public.cpu_model = "процессор".into();
        n.inventory.public.ram_mib = 512;
        n.inventory.public.disk_gib = 870;
        n.inventory.private.hostname = "машина".into();
        n.inventory.private.os = "система".into();
        n.inventory.private.kernel = "5.15".into();
        n.price_per_gpu_hour = Some(150);
        let cmd = |kind: &str, delivered: Option<u64>, ok: Option<bool>| CommandStatus {
            id: "к".into(),
            kind: kind.into(),
            queued_at: 1,
            delivered_at: delivered,
            result: ok.map(|ok| gpum_protocol::CommandResult { id: "к".into(), ok, message: String::new() }),
            completed_at: ok.map(|_| 3),
        };
        n.commands = vec![
            cmd("recheck", None, None),
            cmd("restart", Some(2), None),
            cmd("restart", Some(2), Some(true)),
            cmd("recheck", Some(2), Some(true)),
            cmd("recheck", Some(2), Some(false)),
        ];
        let open = [crate::store::OpenCode { hash: "х".into(), created_at: 1, expires_at: 2 }];
        let mut pages = vec![
            operator_login(&ctx, "к", Some(LoginError::TooMany(3))),
            operator_login(&ctx, "к", Some(LoginError::WrongToken)),
            disabled(&ctx),
            stale(&ctx),
            not_found(&ctx),
            servers(&ctx, &[], PageAt::default(), 6, None, Some(1_800_000_000)),
            servers(&ctx, std::slice::from_ref(&n), PageAt::default(), 6, Some("узел-1"), None),
            server(&ctx, &n, &History::default(), 6, Some(SettingsError::Price), true),
            add(&ctx, &Dist::Off, &open, 6),
            add(&ctx, &Dist::Lacks(vec!["файл"]), &[], 6),
            command_refused(&ctx, "узел-1"),
            confirm_delete(&ctx, "узел-1"),
            confirm_rotate(&ctx, "узел-1"),
            rotated(&ctx, "узел-1", "токен", "адрес"),
        ];
        let served = Dist::Served;
        for (open, shown) in [
            (true, Shown::Code { code: "код", expires_at: 9, public_url: "адрес", dist: &served }),
            (true, Shown::Code { code: "код", expires_at: 9, public_url: "адрес", dist: &Dist::Off }),
            (true, Shown::Once),
            (false, Shown::Closed),
        ] {
            pages.push(join_page(&ctx, "х", join_status(&ctx, JoinState::Waiting), open, shown, 6));
        }
        n.online = false;
        pages.push(server(&ctx, &n, &History::default(), 6, None, true));
        for st in
            [JoinState::Expired, JoinState::Registered("узел-1"), JoinState::Node(&n), JoinState::Deleted]
        {
            pages.push(join_page(&ctx, "х", join_status(&ctx, st), false, Shown::Closed, 6));
        }
        for p in pages {
            let html = p.into_string();
            let text = prose(&html);
            let bad = english_in(&text);
            if !bad.is_empty() {
                found.push(format!("{bad:?} in the page:\n{text}"));
            }
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
        // The check reads the pages' words: the same page in English has them.
        let en = Ctx { lang: Lang::En, path: "/dashboard".into(), csrf: Some("к".into()), account: None };
        let words = english_in(&prose(&server(&en, &n, &History::default(), 6, None, true).into_string()));
        for w in ["Hardware", "check", "again", "agent", "restart", "GiB", "MiB"] {
            assert!(words.iter().any(|x| x == w), "{w} in {words:?}");
        }
    }

    /// "Restart" shows "restarting" until a heartbeat after the agent's acknowledgement, then
    /// "back online", or that it did not come back; "Check again" is green only when a probe
    /// report that passed arrived after it, and says "no check ran" without a check image.
    #[test]
    fn commands_are_judged_by_what_followed_them() {
        use gpum_protocol::{CommandResult, Rentable};
        let c = |kind: &str, delivered: Option<u64>, result: Option<(bool, u64)>| CommandStatus {
            id: "c".into(),
            kind: kind.into(),
            queued_at: 10,
            delivered_at: delivered,
            result: result.map(|(ok, _)| CommandResult { id: "c".into(), ok, message: "m".into() }),
            completed_at: result.map(|(_, at)| at),
        };
        let mut n = node("node-1");
        n.last_heartbeat_at = Some(20);
        n.health = Some(gpum_protocol::Health { nvml: gpum_protocol::NvmlState::Ok, ..Default::default() });
        let ctx = Ctx { lang: Lang::En, path: "/".into(), csrf: None, account: None };
        let ru = Ctx { lang: Lang::Ru, path: "/".into(), csrf: None, account: None };
        let judge = |n: &NodeSummary, cmd: &CommandStatus| {
            let image = n.rentable.state != RentableState::AwaitingOperator;
            let (class, result, en) = command_outcome(&ctx, n, cmd, image);
            (class, result, en, command_outcome(&ru, n, cmd, image).2)
        };
        // Restart.
        assert_eq!(judge(&n, &c("restart", None, None)).1, "queued");
        let r = judge(&n, &c("restart", Some(12), None));
        assert_eq!(
            (r.0, r.1, r.2.as_str(), r.3.as_str()),
            ("wait", "restarting", "restarting…", "агент перезапускается…")
        );
        // Acknowledged at the last heartbeat: the agent is only now exiting.
        assert_eq!(judge(&n, &c("restart", Some(12), Some((true, 20)))).1, "restarting");
        let r = judge(&n, &c("restart", Some(12), Some((true, 14))));
        assert_eq!(
            (r.0, r.1, r.2.as_str(), r.3.as_str()),
            ("ok", "back-online", "back online", "агент перезапущен и снова онлайн")
        );
        assert_eq!(judge(&n, &c("restart", Some(12), Some((false, 14)))).0, "bad");
        let mut off = n.clone();
        off.online = false;
        assert_eq!(judge(&off, &c("restart", Some(12), Some((true, 20)))).1, "not-back");
        assert_eq!(judge(&off, &c("restart", Some(12), None)).1, "lost");
        assert_eq!(judge(&off, &c("restart", None, None)).1, "undelivered");

        // Recheck: acknowledged, but no report after it is never green.
        let ack = c("recheck", Some(12), Some((true, 14)));
        n.verification = VerificationState::Verified;
        n.inventory.public.gpus = vec![gpum_protocol::GpuPublic { model: "G".into(), vram_mib: 1024 }];
        n.last_probe_at = Some(5);
        assert_eq!(judge(&n, &ack).0, "wait", "an earlier pass does not count");
        assert_eq!(judge(&n, &ack).1, "checking");
        n.rentable = Rentable { state: RentableState::AwaitingOperator, since: None };
        let r = judge(&n, &ack);
        assert_eq!((r.0, r.1), ("wait", "no-check"));
        assert!(r.2.starts_with("no check ran") && r.3.starts_with("проверка не запускалась"), "{r:?}");
        n.last_probe_at = Some(16);
        let r = judge(&n, &ack);
        assert_eq!(
            (r.0, r.1, r.2.as_str(), r.3.as_str()),
            ("ok", "passed", "check passed", "проверка пройдена")
        );
        n.verification = VerificationState::Failed;
        n.last_probe_reason = Some(gpum_protocol::ProbeFailure::Timeout);
        let r = judge(&n, &ack);
        assert_eq!((r.0, r.1), ("bad", "check-failed"));
        assert_eq!(r.2, "check failed: the check did not finish in time");
        // A pass on a machine without a working driver is not green either.
        n.verification = VerificationState::Verified;
        n.health = Some(gpum_protocol::Health {
            nvml: gpum_protocol::NvmlState::LibraryMissing,
            ..Default::default()
        });
        assert_eq!(judge(&n, &ack).1, "no-gpu");
        off.last_probe_at = None;
        assert_eq!(judge(&off, &ack).1, "no-result");
        // The kinds in words, and the history's cells.
        n.commands = vec![ack];
        let s = server(&ru, &n, &History::default(), 20, None, true).into_string();
        assert!(s.contains(">повторная проверка<"), "{s}");
        assert!(!s.contains(">recheck<"), "{s}");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(1_796_290_406), "2026-12-03 09:33");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00");
    }

    /// Issue 29, item 12: the sum of the GPUs' memory overflowed (a panic in a debug build).
    #[test]
    fn a_server_page_survives_numbers_at_their_extremes() {
        let mut n = node("node-1");
        n.inventory.public.gpus = vec![gpum_protocol::GpuPublic { model: "G".into(), vram_mib: u64::MAX }; 2];
        n.inventory.public.ram_mib = u64::MAX;
        n.inventory.public.disk_gib = u64::MAX;
        n.inventory.public.cpu_cores = u32::MAX;
        let ctx = Ctx { lang: Lang::En, path: "/".into(), csrf: None, account: None };
        assert!(server(&ctx, &n, &History::default(), u64::MAX, None, true).into_string().contains("2 × G"));
        assert!(servers(&ctx, &[n], PageAt::default(), 0, None, None).into_string().contains("node-1"));
    }

    #[test]
    fn the_servers_page_links_the_next_page_and_refreshes_its_own() {
        for lang in [Lang::Ru, Lang::En] {
            let ctx = Ctx { lang, path: "/".into(), csrf: None, account: None };
            let first = servers(&ctx, &[], PageAt { after: None, next: Some("MTA6bl9h") }, 6, None, None)
                .into_string();
            assert!(first.contains(r#"href="/dashboard?after=MTA6bl9h""#), "{first}");
            assert!(first.contains(ctx.t(Msg::NextPage)) && !first.contains(r#"id="first-page""#));
            assert!(first.contains(r#"data-live="/dashboard""#));
            let later = servers(&ctx, &[], PageAt { after: Some("MTA6bl9h"), next: None }, 6, None, None)
                .into_string();
            assert!(later.contains(r#"data-live="/dashboard?after=MTA6bl9h""#), "{later}");
            assert!(later.contains(ctx.t(Msg::FirstPage)) && !later.contains(r#"id="next-page""#));
            let only = servers(&ctx, &[], PageAt::default(), 6, None, None).into_string();
            assert!(!only.contains(r#"id="next-page""#) && !only.contains(r#"id="first-page""#));
        }
    }

    fn node(id: &str) -> NodeSummary {
        NodeSummary {
            id: id.into(),
            online: true,
            verification: VerificationState::AwaitingCheck,
            last_probe_output: None,
            last_probe_reason: None,
            last_probe_at: None,
            last_heartbeat_at: Some(5),
            registered_at: 1,
            agent_version: "1".into(),
            inventory: Default::default(),
            last_metrics: None,
            health: None,
            last_seq: None,
            managed_containers: vec![],
            known_containers: vec![],
            removed_containers: vec![],
            commands: vec![],
            name: id.into(),
            price_per_gpu_hour: None,
            min_rental_minutes: 60,
            paused: false,
            rentable: Default::default(),
            owner: None,
            quarantine: None,
        }
    }

    #[test]
    fn node_text_is_escaped_everywhere() {
        let evil = "<script>alert(1)</script>\"onmouseover=alert(2) x='";
        let mut n = NodeSummary {
            verification: VerificationState::Failed,
            last_probe_output: Some(evil.into()),
            last_probe_reason: Some(gpum_protocol::ProbeFailure::NvmlUnknownError),
            agent_version: evil.into(),
            commands: vec![gpum_protocol::CommandStatus {
                id: "c".into(),
                kind: evil.into(),
                queued_at: 1,
                delivered_at: Some(2),
                result: Some(gpum_protocol::CommandResult {
                    id: "c".into(),
                    ok: false,
                    message: evil.into(),
                }),
                completed_at: Some(3),
            }],
            ..node("node-1")
        };
        n.inventory.private.hostname = evil.into();
        n.name = evil.into();
        n.owner = Some(evil.into());
        n.paused = true;
        n.inventory.private.gpu_uuids = vec![evil.into()];
        n.inventory.public.gpus = vec![gpum_protocol::GpuPublic { model: evil.into(), vram_mib: 1 }];
        // What a node sends also reaches the event log and the figures.
        let history = History {
            samples: vec![MetricsSample { at: 5, metrics: Metrics::default() }],
            events: [
                NodeEventKind::ContainerRemoved,
                NodeEventKind::CommandFailed,
                NodeEventKind::CheckFailed,
            ]
            .into_iter()
            .map(|kind| NodeEvent { at: 5, kind, subject: evil.into(), detail: evil.into() })
            .collect(),
            rentals: vec![rental(evil, Some(gpum_protocol::RentalState::Failed), Some(evil))],
        };
        n.last_metrics = Some(Metrics::default());
        for lang in [Lang::Ru, Lang::En] {
            let ctx = Ctx { lang, path: "/dashboard?<x>".into(), csrf: Some("\"><b>".into()), account: None };
            for page in [
                servers(&ctx, std::slice::from_ref(&n), PageAt::default(), 6, Some(evil), None),
                server(&ctx, &n, &history, 6, Some(SettingsError::NameControl), true),
                join_page(&ctx, "h", join_status(&ctx, JoinState::Node(&n)), false, Shown::Closed, 6),
                confirm_delete(&ctx, evil),
            ] {
                let s = page.into_string();
                assert!(!s.contains("<script>alert"), "{s}");
                assert!(!s.contains("\"onmouseover"), "{s}");
                assert!(!s.contains("<b>"), "{s}");
                assert!(!s.contains("<x>"), "{s}");
                // Only our own script tag, by file.
                assert_eq!(s.matches("<script").count(), 1);
            }
        }
    }
}
