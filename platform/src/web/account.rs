//! Owners in the dashboard: sign-in with e-mail and password (and a TOTP code when turned on),
//! the invitation link that sets the password, and the account page (the second factor, API
//! keys). The store side is [`crate::accounts`].
//!
//! - Sign-in attempts count against the client's address and against the account
//!   ([`crate::throttle`], door `SignIn`): past five failures, the form answers 429 for a
//!   growing while. Each
//!   attempt is logged (address, e-mail, outcome), never a password or a code.
//! - A wrong address, a wrong password and a wrong code give the same answer, and an unknown
//!   address is checked against a decoy hash, so the answer tells nothing about which accounts
//!   exist.
//! - Argon2id runs off the database thread, at most [`super::HASHING_AT_ONCE`] at a time.
//! - A session alone is not the account (issue 43): turning the second factor on takes the
//!   password; changing its key, turning it off and a new set of recovery codes take the
//!   password and a current code (or a recovery code). Each such check counts against the
//!   client's address as a sign-in does ([`check_credentials`]). The key a change confirms is the
//!   one the platform gave the session after the check, never one the form names.
//! - A reset invitation sets the password and ends every session and key; with the second factor
//!   on, it starts no session: the owner signs in with the new password and a code, as usual.
//! - At sign-in a recovery code, shown once when the second factor is turned on, stands in for
//!   a code from the app, once.

use std::net::IpAddr;

use axum::extract::{FromRequest, FromRequestParts, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, PreEscaped, html};
use serde::Deserialize;

use super::i18n::{Msg, fill};
use super::pages::{self, Ctx, copyable, csrf_field, layout, when};
use super::{CsrfForm, Empty, LOGIN_COOKIE, Req, St, Web, api_error, cookie_header, page, session};
use crate::accounts::{self, AccountError, ApiKeyRow, TotpConfirm};
use crate::store;
use crate::throttle::{self, Door};
use gpum_protocol::{AlertChannel, AlertDelivery, AlertKind, AlertSettings, AlertSettingsView, AlertState};

// ---------------------------------------------------------------------------------------------
// Sign-in

/// Why the owner's sign-in form is shown again.
enum SignInError {
    Wrong,
    TooMany(u64),
}

pub(super) async fn login_form(State(web): St, r: Req, RawQuery(q): RawQuery) -> Response {
    if web.app.cfg.admin_token_hash.is_none() {
        return page(StatusCode::FORBIDDEN, pages::disabled(&r.ctx));
    }
    if r.session.is_some() {
        return Redirect::to("/dashboard").into_response();
    }
    // After a reset invitation (the second factor on): a fixed notice, nothing from the query.
    let reset = q.is_some_and(|q| q.split('&').any(|kv| kv == "reset=1"));
    login_page_with(&r, StatusCode::OK, None, "", reset)
}

fn login_page(r: &Req, status: StatusCode, error: Option<SignInError>, email: &str) -> Response {
    login_page_with(r, status, error, email, false)
}

fn login_page_with(
    r: &Req,
    status: StatusCode,
    error: Option<SignInError>,
    email: &str,
    reset: bool,
) -> Response {
    let token = session::random_hex();
    let ctx = &r.ctx;
    let error = error.map(|e| match e {
        SignInError::Wrong => ctx.t(Msg::WrongPassword).to_owned(),
        SignInError::TooMany(secs) => fill(ctx.t(Msg::TooManySignIns), &[("n", &secs.to_string())]),
    });
    let m = layout(
        ctx,
        ctx.t(Msg::SignInTitle),
        html! {
            @if let Some(e) = error { p.error #login-error { (e) } }
            @if reset { p.flash #login-notice { (ctx.t(Msg::PasswordSetSignIn)) } }
            form #login method="post" action="/dashboard/login" {
                input type="hidden" name="csrf" value=(token);
                p { (ctx.t(Msg::OwnerSignInHelp)) }
                label for="email" { (ctx.t(Msg::Email)) }
                input #email type="email" name="email" value=(email) autocomplete="username" required autofocus;
                label for="password" { (ctx.t(Msg::Password)) }
                input #password type="password" name="password" autocomplete="current-password" required;
                label for="code" { (ctx.t(Msg::TotpCodeOptional)) }
                input #code type="text" name="code" autocomplete="one-time-code" maxlength="32";
                button #sign-in type="submit" { (ctx.t(Msg::SignIn)) }
            }
        },
    );
    let mut resp = page(status, m);
    resp.headers_mut().append(header::SET_COOKIE, cookie_header(LOGIN_COOKIE, &token, 3600));
    resp
}

#[derive(Deserialize)]
struct LoginForm {
    email: String,
    password: String,
    #[serde(default)]
    code: String,
}

pub(super) async fn login(State(web): St, r: Req, req: Request) -> Response {
    if web.app.cfg.admin_token_hash.is_none() {
        return page(StatusCode::FORBIDDEN, pages::disabled(&r.ctx));
    }
    let too_many = |secs| login_page(&r, StatusCode::TOO_MANY_REQUESTS, Some(SignInError::TooMany(secs)), "");
    let (client, f) = match super::sign_in_form::<LoginForm>(&web, &r, Door::SignIn, req, too_many).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let email = f.email.trim().to_lowercase();
    // The account's own count (failures from every address), before its password is looked at.
    if let Err(wait) = web.throttle.check(Door::SignIn, client, Some(&email)).await {
        let secs = crate::throttle::retry_after(wait);
        let mut resp = too_many(secs);
        resp.headers_mut().insert(header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
        return resp;
    }
    let owner = match signed_in_owner(&web, &f).await {
        Ok(o) => o,
        Err(e) => return api_error(&r, e),
    };
    let Some(owner) = owner else {
        let blocked = web.throttle.failed(Door::SignIn, client, Some(&email)).await;
        tracing::warn!(client = %client, email = %email, blocked_for = ?blocked, "dashboard: an owner's sign-in failed");
        return login_page(&r, StatusCode::UNAUTHORIZED, Some(SignInError::Wrong), &email);
    };
    web.throttle.succeeded(Door::SignIn, client, Some(&email)).await;
    tracing::info!(client = %client, email = %email, "dashboard: an owner signed in");
    super::start_session(&web, &r, Some(owner)).await
}

/// The owner whose e-mail, password and (when on) code these are. An unknown address is checked
/// against a decoy hash, so it takes as long as a wrong password.
async fn signed_in_owner(web: &Web, f: &LoginForm) -> Result<Option<String>, crate::error::ApiError> {
    let email = f.email.clone();
    let row = web.app.db.call(move |c| accounts::sign_in_row(c, &email)).await?;
    let stored =
        row.as_ref().map(|r| r.password_hash.clone()).unwrap_or_else(|| accounts::decoy_hash().to_owned());
    let password = f.password.clone();
    let ok = {
        let _permit = web.hashing.acquire().await.map_err(|_| crate::error::ApiError::internal())?;
        tokio::task::spawn_blocking(move || accounts::verify_password(&stored, &password))
            .await
            .unwrap_or(false)
    };
    let Some(row) = row.filter(|_| ok) else { return Ok(None) };
    if row.totp_secret.is_some() {
        let (now, id, code) = (web.app.clock.now(), row.id.clone(), f.code.clone());
        if !web.app.db.call(move |c| accounts::use_second_factor(c, now, &id, &code)).await? {
            return Ok(None);
        }
    }
    Ok(Some(row.id))
}

/// Whether `password` is right for the stored hash, checked off the database thread.
async fn password_matches(web: &Web, stored: String, password: &str) -> Result<bool, crate::error::ApiError> {
    let password = password.to_owned();
    let _permit = web.hashing.acquire().await.map_err(|_| crate::error::ApiError::internal())?;
    Ok(tokio::task::spawn_blocking(move || accounts::verify_password(&stored, &password))
        .await
        .unwrap_or(false))
}

/// What a change of the account needs (issue 43): the client's address not blocked, the
/// owner's password, and while the second factor is on a current code or a recovery code (looked
/// at only after the password passed, so a wrong password spends no recovery code). A wrong one
/// counts against the address and the account at the account page's own door.
async fn check_credentials(
    web: &Web,
    client: IpAddr,
    owner: &str,
    password: &str,
    code: &str,
) -> Result<Result<(), AccountError>, crate::error::ApiError> {
    if let Err(wait) = web.throttle.check(Door::AccountPage, client, Some(owner)).await {
        return Ok(Err(AccountError::TooMany(throttle::retry_after(wait))));
    }
    let o = owner.to_owned();
    let row = web.app.db.call(move |c| accounts::owner_credentials(c, &o)).await?;
    let stored =
        row.as_ref().map(|r| r.password_hash.clone()).unwrap_or_else(|| accounts::decoy_hash().to_owned());
    let mut ok = password_matches(web, stored, password).await? && row.is_some();
    if ok && row.as_ref().is_some_and(|r| r.totp_secret.is_some()) {
        let (now, o, code) = (web.app.clock.now(), owner.to_owned(), code.to_owned());
        ok = web.app.db.call(move |c| accounts::use_second_factor(c, now, &o, &code)).await?;
    }
    if ok {
        web.throttle.succeeded(Door::AccountPage, client, Some(owner)).await;
        Ok(Ok(()))
    } else {
        let blocked = web.throttle.failed(Door::AccountPage, client, Some(owner)).await;
        tracing::warn!(client = %client, owner = %owner, blocked_for = ?blocked, "dashboard: a wrong password or code on the account page");
        Ok(Err(AccountError::Credentials))
    }
}

// ---------------------------------------------------------------------------------------------
// Invitations

fn invite_gone(ctx: &Ctx) -> Response {
    page(
        StatusCode::NOT_FOUND,
        layout(ctx, ctx.t(Msg::InviteTitle), html! { p.error #invite-gone { (ctx.t(Msg::InviteGone)) } }),
    )
}

fn invite_page(r: &Req, token: &str, email: &str, error: Option<AccountError>) -> Response {
    let ctx = &r.ctx;
    let form_key = session::random_hex();
    let m = layout(
        ctx,
        ctx.t(Msg::InviteTitle),
        html! {
            @if let Some(e) = error { p.error #invite-error { (account_error(ctx, e)) } }
            form #invite method="post" action={ "/dashboard/invite/" (token) } {
                input type="hidden" name="csrf" value=(form_key);
                p { (fill(ctx.t(Msg::InviteHelp), &[("email", email), ("n", &accounts::MIN_PASSWORD_CHARS.to_string())])) }
                input type="email" name="email" value=(email) autocomplete="username" readonly hidden;
                label for="password" { (ctx.t(Msg::Password)) }
                input #password type="password" name="password" autocomplete="new-password" required autofocus;
                label for="again" { (ctx.t(Msg::PasswordAgain)) }
                input #again type="password" name="again" autocomplete="new-password" required;
                button #set-password type="submit" { (ctx.t(Msg::SetPassword)) }
            }
        },
    );
    let status = if error.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let mut resp = page(status, m);
    resp.headers_mut().append(header::SET_COOKIE, cookie_header(LOGIN_COOKIE, &form_key, 3600));
    resp
}

fn account_error(ctx: &Ctx, e: AccountError) -> String {
    let n = |m: Msg, n: usize| fill(ctx.t(m), &[("n", &n.to_string())]);
    match e {
        AccountError::PasswordShort => n(Msg::PasswordShort, accounts::MIN_PASSWORD_CHARS),
        AccountError::PasswordLong => ctx.t(Msg::PasswordLong).to_owned(),
        AccountError::PasswordMismatch => ctx.t(Msg::PasswordMismatch).to_owned(),
        AccountError::TotpCode => ctx.t(Msg::TotpWrong).to_owned(),
        AccountError::KeyLabel => n(Msg::KeyLabelBad, accounts::MAX_KEY_LABEL_CHARS),
        AccountError::TooManyKeys => n(Msg::TooManyKeys, accounts::MAX_API_KEYS_PER_OWNER),
        AccountError::Email | AccountError::OwnerDisabled => ctx.t(Msg::InviteGone).to_owned(),
        AccountError::Credentials => ctx.t(Msg::CredentialsWrong).to_owned(),
        AccountError::TotpNotStarted => ctx.t(Msg::TotpNotStarted).to_owned(),
        AccountError::TooMany(secs) => fill(ctx.t(Msg::TooManyAccountChecks), &[("n", &secs.to_string())]),
    }
}

/// An invitation token as the link carries it: 64 hex digits; anything else is no invitation
/// and costs no lookup.
fn token_shape(t: &str) -> bool {
    t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit())
}

pub(super) async fn invite_form(State(web): St, r: Req, Path(token): Path<String>) -> Response {
    if !token_shape(&token) {
        return invite_gone(&r.ctx);
    }
    let (now, t) = (web.app.clock.now(), token.clone());
    match web.app.db.call(move |c| accounts::invitation(c, now, &t)).await {
        Ok(Some((_, email))) => invite_page(&r, &token, &email, None),
        Ok(None) => invite_gone(&r.ctx),
        Err(e) => api_error(&r, e),
    }
}

#[derive(Deserialize)]
struct InviteForm {
    password: String,
    again: String,
}

pub(super) async fn accept(State(web): St, r: Req, Path(token): Path<String>, req: Request) -> Response {
    if !token_shape(&token) {
        return invite_gone(&r.ctx);
    }
    // The same door as a sign-in: a blocked address waits, and the form must be this browser's.
    let blocked = |secs: u64| {
        let ctx = &r.ctx;
        let text = fill(ctx.t(Msg::TooManySignIns), &[("n", &secs.to_string())]);
        page(
            StatusCode::TOO_MANY_REQUESTS,
            layout(ctx, ctx.t(Msg::InviteTitle), html! { p.error #invite-error { (text) } }),
        )
    };
    let (_, f) = match super::sign_in_form::<InviteForm>(&web, &r, Door::SignIn, req, blocked).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let (now, t) = (web.app.clock.now(), token.clone());
    let email = match web.app.db.call(move |c| accounts::invitation(c, now, &t)).await {
        Ok(Some((_, email))) => email,
        Ok(None) => return invite_gone(&r.ctx),
        Err(e) => return api_error(&r, e),
    };
    if let Err(e) = accounts::check_new_password(&f.password, &f.again) {
        return invite_page(&r, &token, &email, Some(e));
    }
    let hash = {
        let Ok(_permit) = web.hashing.acquire().await else {
            return api_error(&r, crate::error::ApiError::internal());
        };
        let pw = f.password;
        tokio::task::spawn_blocking(move || accounts::hash_password(&pw)).await.unwrap_or_default()
    };
    if hash.is_empty() {
        return api_error(&r, crate::error::ApiError::internal());
    }
    let (now, t) = (web.app.clock.now(), token.clone());
    match web.app.db.call(move |c| accounts::accept_invitation(c, now, &t, &hash)).await {
        Ok(Some(acc)) => {
            tracing::info!(email = %email, "dashboard: an owner set their password from an invitation");
            if acc.totp {
                // A link alone is not the second factor: sign in with it as usual.
                let mut resp = Redirect::to("/dashboard/login?reset=1").into_response();
                resp.headers_mut().append(header::SET_COOKIE, cookie_header(LOGIN_COOKIE, "", 0));
                return resp;
            }
            super::start_session(&web, &r, Some(acc.owner)).await
        }
        Ok(None) => invite_gone(&r.ctx),
        Err(e) => api_error(&r, e),
    }
}

// ---------------------------------------------------------------------------------------------
// The account page

/// The guard of the account pages: a signed-in owner (the operator has no account here, and is
/// sent to the servers). Refused as [`super::SignedIn`] first.
pub(super) struct Owner {
    r: Req,
    /// The owner's id.
    id: String,
}

impl std::ops::Deref for Owner {
    type Target = Req;
    fn deref(&self) -> &Req {
        &self.r
    }
}

impl FromRequestParts<std::sync::Arc<Web>> for Owner {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &std::sync::Arc<Web>) -> Result<Self, Response> {
        let Ok(r) = Req::from_request_parts(parts, web).await;
        super::signed_in(web, &r)?;
        let id = r.owner().map(str::to_owned).ok_or_else(|| Redirect::to("/dashboard").into_response())?;
        Ok(Owner { r, id })
    }
}

/// The password and code fields of a form that changes the account (ids prefixed by `form`).
fn credential_fields(ctx: &Ctx, form: &str, code: bool) -> Markup {
    html! {
        label for={ (form) "-password" } { (ctx.t(Msg::CurrentPassword)) }
        input id={ (form) "-password" } type="password" name="password" autocomplete="current-password" required;
        @if code {
            label for={ (form) "-code" } { (ctx.t(Msg::CodeOrRecovery)) }
            input id={ (form) "-code" } type="text" name="code" autocomplete="one-time-code" maxlength="32" required;
        }
    }
}

fn account_page(
    ctx: &Ctx,
    public_url: &str,
    totp: bool,
    reset_at: Option<u64>,
    keys: &[ApiKeyRow],
    error: Option<AccountError>,
    alerts: Markup,
) -> Markup {
    let email = ctx.account.clone().unwrap_or_default();
    layout(
        ctx,
        ctx.t(Msg::AccountTitle),
        html! {
            p #signed-in-as { (fill(ctx.t(Msg::SignedInAs), &[("email", &email)])) }
            @if let Some(e) = error { p.error #account-error { (account_error(ctx, e)) } }
            @if let Some(at) = reset_at { (pages::totp_reset_notice(ctx, at)) }
            section #totp {
                h2 { (ctx.t(Msg::TotpTitle)) }
                @if totp {
                    p #totp-state data-on="true" { (ctx.t(Msg::TotpOn)) }
                    p { (ctx.t(Msg::TotpChangesNeed)) }
                    form #totp-change method="post" action="/dashboard/account/totp" {
                        (csrf_field(ctx))
                        (credential_fields(ctx, "totp-change", true))
                        button #totp-change-key type="submit" { (ctx.t(Msg::TotpChangeKey)) }
                    }
                    form #recovery-new method="post" action="/dashboard/account/recovery" {
                        (csrf_field(ctx))
                        (credential_fields(ctx, "recovery-new", true))
                        button #recovery-new-set type="submit" { (ctx.t(Msg::RecoveryNewSet)) }
                    }
                    form #totp-off method="post" action="/dashboard/account/totp/off" {
                        (csrf_field(ctx))
                        (credential_fields(ctx, "totp-off", true))
                        button.danger #totp-turn-off type="submit" { (ctx.t(Msg::TotpTurnOff)) }
                    }
                } @else {
                    p #totp-state data-on="false" { (ctx.t(Msg::TotpOff)) }
                    form #totp-on method="post" action="/dashboard/account/totp" {
                        (csrf_field(ctx))
                        (credential_fields(ctx, "totp-on", false))
                        button #totp-turn-on type="submit" { (ctx.t(Msg::TotpTurnOn)) }
                    }
                }
            }
            section #api-keys {
                h2 { (ctx.t(Msg::ApiKeysTitle)) }
                p { (ctx.t(Msg::ApiKeysHelp)) }
                pre { code #api-key-use { "curl -H 'Authorization: Bearer gpumk_…' " (public_url) "/api/v1/owner/nodes" } }
                @if keys.is_empty() {
                    p #no-keys { (ctx.t(Msg::NoApiKeys)) }
                } @else {
                    table.cards #keys {
                        thead { tr {
                            th { (ctx.t(Msg::ColKeyLabel)) } th { (ctx.t(Msg::ColCreated)) }
                            th { (ctx.t(Msg::ColLastUsed)) } th {}
                        } }
                        tbody {
                            @for k in keys {
                                tr data-key=(k.id) {
                                    td.label data-label=(ctx.t(Msg::ColKeyLabel)) { (k.label) }
                                    td data-label=(ctx.t(Msg::ColCreated)) { (when(k.created_at)) }
                                    td data-label=(ctx.t(Msg::ColLastUsed)) {
                                        @match k.last_used_at { Some(t) => (when(t)), None => (ctx.t(Msg::NeverUsed)) }
                                    }
                                    td {
                                        form.inline method="post" action={ "/dashboard/account/keys/" (k.id) "/revoke" } {
                                            (csrf_field(ctx))
                                            button.danger type="submit" { (ctx.t(Msg::Revoke)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                form #new-key method="post" action="/dashboard/account/keys" {
                    (csrf_field(ctx))
                    label for="label" { (ctx.t(Msg::KeyLabel)) }
                    input #label type="text" name="label" required maxlength=(accounts::MAX_KEY_LABEL_CHARS);
                    button #create-key type="submit" { (ctx.t(Msg::CreateKey)) }
                }
            }
            (alerts)
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Alerts (issue 46)

/// The alerts form as posted: every value kept as typed, so that a refused one is shown again
/// next to its error.
#[derive(Deserialize, Default, Clone)]
pub(super) struct AlertForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    webhook_url: String,
    #[serde(default)]
    offline_minutes: String,
    #[serde(default)]
    kind_offline: Option<String>,
    #[serde(default)]
    kind_check_failed: Option<String>,
    #[serde(default)]
    kind_quarantined: Option<String>,
}

impl AlertForm {
    fn of(s: &AlertSettings) -> AlertForm {
        let on = |k| s.kinds.contains(&k).then(|| "on".to_owned());
        AlertForm {
            email: s.email.clone().unwrap_or_default(),
            webhook_url: s.webhook_url.clone().unwrap_or_default(),
            offline_minutes: s.offline_minutes.to_string(),
            kind_offline: on(AlertKind::Offline),
            kind_check_failed: on(AlertKind::CheckFailed),
            kind_quarantined: on(AlertKind::Quarantined),
        }
    }

    /// The settings it asks for, in the page's language, or the first field refused.
    fn settings(&self, lang: gpum_common::Lang) -> Result<AlertSettings, store::AlertSettingsError> {
        let offline_minutes =
            self.offline_minutes.trim().parse().map_err(|_| store::AlertSettingsError::OfflineMinutes)?;
        let kinds = [
            (AlertKind::Offline, &self.kind_offline),
            (AlertKind::CheckFailed, &self.kind_check_failed),
            (AlertKind::Quarantined, &self.kind_quarantined),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k)
        .collect();
        store::check_alert_settings(&AlertSettings {
            email: Some(self.email.clone()),
            webhook_url: Some(self.webhook_url.clone()),
            offline_minutes,
            kinds,
            language: crate::alerts::lang_tag(lang).into(),
        })
    }
}

/// `text` with its one `{hole}` filled with `value` as code (a header's name, a URL's scheme:
/// typed as it is, in any language).
fn fill_code(text: &str, hole: &str, value: &str) -> Markup {
    let mark = format!("{{{hole}}}");
    let (a, b) = text.split_once(mark.as_str()).unwrap_or((text, ""));
    html! { (a) code { (value) } (b) }
}

fn alert_error(ctx: &Ctx, e: store::AlertSettingsError) -> Markup {
    use store::AlertSettingsError as E;
    match e {
        E::Email => html! { (ctx.t(Msg::AlertErrEmail)) },
        E::WebhookUrl => html! { (ctx.t(Msg::AlertErrUrl)) },
        E::WebhookHttps => fill_code(ctx.t(Msg::AlertErrHttps), "https", "https://"),
        E::WebhookPrivate => html! { (ctx.t(Msg::AlertErrPrivate)) },
        E::OfflineMinutes | E::Language => {
            html! { (fill(ctx.t(Msg::AlertErrMinutes), &[("n", &gpum_protocol::MAX_ALERT_OFFLINE_MINUTES.to_string())])) }
        }
    }
}

/// The account page's alerts section: the form (with what was typed and the error beside its
/// field, when refused), the key webhooks are signed with, and the notices sent lately.
fn alerts_section(
    ctx: &Ctx,
    view: &AlertSettingsView,
    typed: Option<&AlertForm>,
    error: Option<store::AlertSettingsError>,
) -> Markup {
    let f = typed.cloned().unwrap_or_else(|| AlertForm::of(&view.settings));
    let err = |field: &str| error.filter(|e| e.field() == field).map(|e| alert_error(ctx, e));
    let (e_email, e_url, e_min) = (err("email"), err("webhook_url"), err("offline_minutes"));
    let kind_text = |k: AlertKind| match k {
        AlertKind::Offline => ctx.t(Msg::AlertKindOffline),
        AlertKind::CheckFailed => ctx.t(Msg::AlertKindCheck),
        AlertKind::Quarantined => ctx.t(Msg::AlertKindQuarantine),
    };
    let checkbox = |id: &str, k: AlertKind, on: bool| {
        html! {
            label.check for=(id) {
                input id=(id) type="checkbox" name=(id.replace('-', "_")) checked[on];
                " " (kind_text(k))
            }
        }
    };
    html! {
        section #alerts {
            h2 { (ctx.t(Msg::AlertsTitle)) }
            p { (ctx.t(Msg::AlertsHelp)) }
            @if !view.email_available { p.note #alerts-no-email { (ctx.t(Msg::AlertNoEmail)) } }
            @match &view.webhook_public_key {
                Some(k) => {
                    p { (fill_code(ctx.t(Msg::AlertKeyHelp), "header", gpum_protocol::ALERT_SIGNATURE_HEADER)) }
                    pre { code #alerts-public-key { "ed25519 " (k) } }
                }
                None => { p.note #alerts-no-webhook { (ctx.t(Msg::AlertNoWebhook)) } }
            }
            form #alerts-form method="post" action="/dashboard/account/alerts" {
                (csrf_field(ctx))
                label for="alert-email" { (ctx.t(Msg::AlertEmail)) }
                input #alert-email type="email" name="email" value=(f.email) maxlength="254"
                    autocomplete="email" autofocus[e_email.is_some()] aria-invalid=[e_email.as_ref().map(|_| "true")];
                @if let Some(e) = &e_email { p.error #alert-email-error role="alert" { (e) } }
                label for="alert-webhook" { (ctx.t(Msg::AlertWebhook)) " " code { "https://…" } }
                input #alert-webhook type="url" name="webhook_url" value=(f.webhook_url)
                    maxlength=(gpum_protocol::MAX_ALERT_ADDRESS_LEN) autofocus[e_url.is_some()]
                    aria-invalid=[e_url.as_ref().map(|_| "true")];
                @if let Some(e) = &e_url { p.error #alert-webhook-error role="alert" { (e) } }
                label for="alert-minutes" { (ctx.t(Msg::AlertOfflineMinutes)) }
                input #alert-minutes type="number" name="offline_minutes" value=(f.offline_minutes) min="1"
                    max=(gpum_protocol::MAX_ALERT_OFFLINE_MINUTES) autofocus[e_min.is_some()]
                    aria-invalid=[e_min.as_ref().map(|_| "true")];
                @if let Some(e) = &e_min { p.error #alert-minutes-error role="alert" { (e) } }
                fieldset {
                    legend { (ctx.t(Msg::AlertKindsLegend)) }
                    (checkbox("kind-offline", AlertKind::Offline, f.kind_offline.is_some()))
                    (checkbox("kind-check-failed", AlertKind::CheckFailed, f.kind_check_failed.is_some()))
                    (checkbox("kind-quarantined", AlertKind::Quarantined, f.kind_quarantined.is_some()))
                }
                button #alerts-save type="submit" { (ctx.t(Msg::AlertSave)) }
            }
            h3 { (ctx.t(Msg::AlertSentTitle)) }
            @if view.sent.is_empty() {
                p #alerts-none { (ctx.t(Msg::AlertNoneSent)) }
            } @else {
                table.cards #alerts-sent {
                    thead { tr {
                        th { (ctx.t(Msg::AlertColTime)) } th { (ctx.t(Msg::AlertColServer)) }
                        th { (ctx.t(Msg::AlertColKind)) } th { (ctx.t(Msg::AlertColState)) }
                        th { (ctx.t(Msg::AlertColChannel)) } th { (ctx.t(Msg::AlertColDelivery)) }
                    } }
                    tbody {
                        @for n in &view.sent {
                            tr data-kind=(n.kind) data-state=(n.state) data-channel=(n.channel) data-delivery=(n.delivery) {
                                td data-label=(ctx.t(Msg::AlertColTime)) { (when(n.at)) }
                                td data-label=(ctx.t(Msg::AlertColServer)) {
                                    a href={ "/dashboard/servers/" (n.node_id) } { (n.node_name) }
                                }
                                td data-label=(ctx.t(Msg::AlertColKind)) { (kind_text(n.kind)) }
                                td data-label=(ctx.t(Msg::AlertColState)) {
                                    (ctx.t(match n.state { AlertState::Opened => Msg::AlertStateOpened, AlertState::Closed => Msg::AlertStateClosed }))
                                }
                                td data-label=(ctx.t(Msg::AlertColChannel)) {
                                    (ctx.t(match n.channel { AlertChannel::Email => Msg::AlertChannelEmail, AlertChannel::Webhook => Msg::AlertChannelWebhook }))
                                }
                                td data-label=(ctx.t(Msg::AlertColDelivery)) {
                                    (ctx.t(match n.delivery {
                                        AlertDelivery::Delivered => Msg::AlertDelivered,
                                        AlertDelivery::Failed => Msg::AlertFailed,
                                        AlertDelivery::Pending => Msg::AlertPending,
                                    }))
                                    @if let Some(e) = &n.error { " " code.error-detail { (e) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(super) async fn save_alerts(
    State(web): St,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<AlertForm, Owner>,
) -> Response {
    let owner = r.id.clone();
    match f.settings(r.ctx.lang) {
        Ok(s) => {
            let now = web.app.clock.now();
            match web.app.db.call(move |c| store::set_alert_settings(c, &owner, &s, now)).await {
                Ok(()) => Redirect::to("/dashboard/account#alerts").into_response(),
                Err(e) => api_error(&r, e),
            }
        }
        Err(e) => show_account_with(&web, &r, owner, None, Some((f, e))).await,
    }
}

async fn show_account(web: &Web, r: &Req, owner: String, error: Option<AccountError>) -> Response {
    show_account_with(web, r, owner, error, None).await
}

/// The account page; `alert` is an alerts form that was refused (kept as typed) and why.
async fn show_account_with(
    web: &Web,
    r: &Req,
    owner: String,
    error: Option<AccountError>,
    alert: Option<(AlertForm, store::AlertSettingsError)>,
) -> Response {
    let alerts = web.app.alerts.clone();
    let read = web
        .app
        .db
        .call(move |c| {
            Ok((accounts::list_api_keys(c, &owner)?, crate::server::alerts_view(c, &alerts, &owner)?))
        })
        .await;
    match read {
        Ok((keys, view)) => {
            let alerts =
                alerts_section(&r.ctx, &view, alert.as_ref().map(|a| &a.0), alert.as_ref().map(|a| a.1));
            let totp = r.session.as_ref().is_some_and(|(_, s)| s.totp);
            let reset_at = r.session.as_ref().and_then(|(_, s)| s.totp_reset_at);
            let status = match error {
                None if alert.is_some() => StatusCode::BAD_REQUEST,
                None => StatusCode::OK,
                Some(AccountError::TooMany(_)) => StatusCode::TOO_MANY_REQUESTS,
                Some(_) => StatusCode::BAD_REQUEST,
            };
            let mut resp = page(
                status,
                account_page(&r.ctx, &web.app.cfg.public_url, totp, reset_at, &keys, error, alerts),
            );
            if let Some(AccountError::TooMany(secs)) = error {
                resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
            }
            resp
        }
        Err(e) => api_error(r, e),
    }
}

pub(super) async fn account(State(web): St, r: Owner) -> Response {
    show_account(&web, &r, r.id.clone(), None).await
}

#[derive(Deserialize)]
pub(super) struct KeyForm {
    label: String,
}

pub(super) async fn create_key(
    State(web): St,
    CsrfForm { signed: r, form: f, .. }: CsrfForm<KeyForm, Owner>,
) -> Response {
    let owner = r.id.clone();
    let (now, o) = (web.app.clock.now(), owner.clone());
    match web.app.db.call(move |c| accounts::create_api_key(c, now, &o, &f.label)).await {
        Ok((_, key)) => {
            let ctx = &r.ctx;
            page(
                StatusCode::OK,
                layout(
                    ctx,
                    ctx.t(Msg::KeyCreatedTitle),
                    html! {
                        p { (ctx.t(Msg::KeyCreatedHelp)) }
                        (copyable(ctx, "api-key", &key))
                        p { a #to-account href="/dashboard/account" { (ctx.t(Msg::ToAccount)) } }
                    },
                ),
            )
        }
        Err(e) => {
            let err = if e.message.contains("at most") {
                AccountError::TooManyKeys
            } else {
                AccountError::KeyLabel
            };
            show_account(&web, &r, owner, Some(err)).await
        }
    }
}

pub(super) async fn revoke_key(
    State(web): St,
    Path(id): Path<String>,
    CsrfForm { signed: r, .. }: CsrfForm<Empty, Owner>,
) -> Response {
    let owner = r.id.clone();
    let now = web.app.clock.now();
    match web.app.db.call(move |c| accounts::revoke_api_key(c, now, &owner, &id)).await {
        Ok(()) => Redirect::to("/dashboard/account").into_response(),
        Err(e) => api_error(&r, e),
    }
}

fn totp_setup(ctx: &Ctx, secret: &str, error: bool) -> Markup {
    let email = ctx.account.clone().unwrap_or_default();
    layout(
        ctx,
        ctx.t(Msg::TotpTitle),
        html! {
            @if error { p.error #totp-error { (ctx.t(Msg::TotpWrong)) } }
            p { (ctx.t(Msg::TotpSetupHelp)) }
            @if let Some(qr) = totp_qr(&accounts::totp_link(secret, &email)) {
                figure #totp-qr role="img" aria-label=(ctx.t(Msg::TotpQr)) {
                    (qr)
                    figcaption { (ctx.t(Msg::TotpQr)) }
                }
            }
            h2 { (ctx.t(Msg::TotpKey)) }
            (copyable(ctx, "totp-secret", secret))
            h2 { (ctx.t(Msg::TotpLink)) }
            (copyable(ctx, "totp-link", &accounts::totp_link(secret, &email)))
            form #totp-confirm method="post" action="/dashboard/account/totp/confirm" {
                (csrf_field(ctx))
                label for="code" { (ctx.t(Msg::TotpCode)) }
                input #code type="text" name="code" inputmode="numeric" autocomplete="one-time-code" required autofocus;
                button #totp-confirm-button type="submit" { (ctx.t(Msg::TotpConfirm)) }
            }
        },
    )
}

/// The `otpauth://` link as a QR code for an authenticator app to scan (issue 46): inline SVG,
/// a rectangle and one path of numbers, with no script and no style attribute, so the pages'
/// CSP lets it be drawn. `None` for a link too long for a QR code (never for ours).
fn totp_qr(link: &str) -> Option<Markup> {
    let code = qrcode::QrCode::with_error_correction_level(link.as_bytes(), qrcode::EcLevel::M).ok()?;
    let svg = code.render::<qrcode::render::svg::Color>().min_dimensions(200, 200).quiet_zone(true).build();
    let svg = svg.strip_prefix(r#"<?xml version="1.0" standalone="yes"?>"#).unwrap_or(&svg);
    Some(PreEscaped(svg.to_owned()))
}

/// The recovery codes, shown once: when the second factor is turned on (or its key changed),
/// and when the owner asks for a new set.
fn recovery_page(ctx: &Ctx, codes: &[String]) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::RecoveryTitle),
        html! {
            p { (ctx.t(Msg::RecoveryHelp)) }
            ul #recovery-codes {
                @for c in codes { li { code.recovery-code { (c) } } }
            }
            p { a #to-account href="/dashboard/account" { (ctx.t(Msg::ToAccount)) } }
        },
    )
}

/// The session's id (behind [`Owner`], there is one).
fn session_id(r: &Req) -> String {
    r.session.as_ref().map(|(id, _)| id.clone()).unwrap_or_default()
}

#[derive(Deserialize)]
pub(super) struct CredentialsForm {
    #[serde(default)]
    password: String,
    #[serde(default)]
    code: String,
}

/// A form that changes the account, with its credentials checked: `Ok` is the owner, `Err`
/// the answer to give instead.
async fn checked_change(web: &Web, f: &CsrfForm<CredentialsForm, Owner>) -> Result<String, Response> {
    let (r, owner) = (&f.signed.r, f.signed.id.clone());
    match check_credentials(web, f.client, &owner, &f.form.password, &f.form.code).await {
        Ok(Ok(())) => Ok(owner),
        Ok(Err(e)) => Err(show_account(web, r, owner, Some(e)).await),
        Err(e) => Err(api_error(r, e)),
    }
}

/// The first step: with the password (and, to change the key, a current code), a fresh secret,
/// kept with this session and shown with a form that confirms it with a code.
pub(super) async fn totp_start(State(web): St, f: CsrfForm<CredentialsForm, Owner>) -> Response {
    let r = &f.signed;
    let owner = match checked_change(&web, &f).await {
        Ok(o) => o,
        Err(resp) => return resp,
    };
    let secret = accounts::new_totp_secret();
    let (now, sid, s) = (web.app.clock.now(), session_id(r), secret.clone());
    if let Err(e) = web.app.db.call(move |c| accounts::start_totp_change(c, now, &sid, &s)).await {
        return api_error(r, e);
    }
    tracing::info!(owner = %owner, "dashboard: an owner was given a new second factor's key to confirm");
    page(StatusCode::OK, totp_setup(&r.ctx, &secret, false))
}

#[derive(Deserialize)]
pub(super) struct CodeForm {
    code: String,
}

/// The second step: a code of the key this session was given turns it on; the recovery codes
/// are shown once.
pub(super) async fn totp_confirm(
    State(web): St,
    CsrfForm { signed: r, form: f, client }: CsrfForm<CodeForm, Owner>,
) -> Response {
    let owner = r.id.clone();
    if let Err(wait) = web.throttle.check(Door::AccountPage, client, Some(&owner)).await {
        return show_account(&web, &r, owner, Some(AccountError::TooMany(throttle::retry_after(wait)))).await;
    }
    let (now, sid, o) = (web.app.clock.now(), session_id(&r), owner.clone());
    match web.app.db.call(move |c| accounts::confirm_totp(c, now, &o, &sid, &f.code)).await {
        Ok(TotpConfirm::On(codes)) => {
            web.throttle.succeeded(Door::AccountPage, client, Some(&owner)).await;
            tracing::info!(owner = %owner, "dashboard: an owner turned on the second factor");
            page(StatusCode::OK, recovery_page(&r.ctx, &codes))
        }
        Ok(TotpConfirm::WrongCode(secret)) => {
            web.throttle.failed(Door::AccountPage, client, Some(&owner)).await;
            page(StatusCode::BAD_REQUEST, totp_setup(&r.ctx, &secret, true))
        }
        Ok(TotpConfirm::NotStarted) => {
            show_account(&web, &r, owner, Some(AccountError::TotpNotStarted)).await
        }
        Err(e) => api_error(&r, e),
    }
}

/// Turning the second factor off takes the password and a current code (or a recovery code),
/// so a session left open is not enough.
pub(super) async fn totp_off(State(web): St, f: CsrfForm<CredentialsForm, Owner>) -> Response {
    let r = &f.signed;
    let owner = match checked_change(&web, &f).await {
        Ok(o) => o,
        Err(resp) => return resp,
    };
    let o = owner.clone();
    match web.app.db.call(move |c| accounts::set_totp(c, &o, None)).await {
        Ok(()) => {
            tracing::info!(owner = %owner, "dashboard: an owner turned off the second factor");
            Redirect::to("/dashboard/account").into_response()
        }
        Err(e) => api_error(r, e),
    }
}

/// A new set of recovery codes (the old set stops working), with the password and a code.
pub(super) async fn recovery_codes(State(web): St, r: Req, req: Request) -> Response {
    if !r.session.as_ref().is_some_and(|(_, s)| s.totp) {
        return Redirect::to("/dashboard/account").into_response();
    }
    // Only then the guard and the form, in this order as before (a second look at the session).
    let f = match CsrfForm::<CredentialsForm, Owner>::from_request(req, &web).await {
        Ok(f) => f,
        Err(resp) => return resp,
    };
    let owner = match checked_change(&web, &f).await {
        Ok(o) => o,
        Err(resp) => return resp,
    };
    let (now, o) = (web.app.clock.now(), owner.clone());
    match web.app.db.call(move |c| accounts::replace_recovery_codes(c, now, &o)).await {
        Ok(codes) => {
            tracing::info!(owner = %owner, "dashboard: an owner made a new set of recovery codes");
            page(StatusCode::OK, recovery_page(&r.ctx, &codes))
        }
        Err(e) => api_error(&r, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::pages::tests::{english_in, prose};
    use gpum_common::Lang;

    /// The account's pages in Russian carry no English word (issue 32's wording review, as
    /// `pages::tests::russian_reads_without_english_words` does for the rest), and every value
    /// is escaped.
    #[test]
    fn the_totp_qr_code_draws_exactly_the_links_dark_modules_as_plain_svg() {
        let link = accounts::totp_link("JBSWY3DPEHPK3PXP", "ann@example.org");
        let svg = totp_qr(&link).unwrap().into_string();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"), "{svg}");
        // Nothing a CSP without 'unsafe-inline' would block, nothing of the link's text.
        for bad in ["<script", "style=", " on", "otpauth", "<?xml"] {
            assert!(!svg.contains(bad), "{bad} in {svg}");
        }
        // The path's rectangles cover exactly the code's dark modules.
        let code = qrcode::QrCode::with_error_correction_level(link.as_bytes(), qrcode::EcLevel::M).unwrap();
        let dark = code.to_colors().iter().filter(|c| **c == qrcode::Color::Dark).count() as u64;
        let d = svg.split(" d=\"").nth(1).unwrap().split('"').next().unwrap();
        let (mut area, mut w) = (0u64, 0u64);
        for part in d.split('M').skip(1) {
            // "x yhWvHH…V…": width after 'h', height after 'v'.
            let num = |after: char| -> u64 {
                let rest = &part[part.find(after).unwrap() + 1..];
                rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
            };
            let (width, height) = (num('h'), num('v'));
            area += width * height;
            w = w.max(height);
        }
        // Each module is a square of `w` pixels (the rectangles are one module high).
        assert_eq!(area, dark * w * w, "{svg}");
    }

    #[test]
    fn account_pages_read_in_russian_and_escape_values() {
        let evil = "<script>alert(1)</script>";
        let ru = Ctx {
            lang: Lang::Ru,
            path: "/dashboard/account".into(),
            csrf: Some("к".into()),
            account: Some(evil.into()),
            currency: gpum_platform_core::currency::DEFAULT,
        };
        let keys = [ApiKeyRow { id: "к".into(), label: evil.into(), created_at: 1, last_used_at: None }];
        let pages = [
            account_page(
                &ru,
                "https://адрес",
                false,
                Some(1),
                &keys,
                Some(AccountError::TooManyKeys),
                html! {},
            ),
            account_page(
                &ru,
                "https://адрес",
                true,
                None,
                &[],
                Some(AccountError::TotpCode),
                alerts_example(&ru, evil),
            ),
            totp_setup(&ru, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", true),
            recovery_page(&ru, &["abcd-efgh-ijkl-mnop".to_owned()]),
            layout(&ru, ru.t(Msg::InviteTitle), html! { p { (ru.t(Msg::InviteGone)) } }),
        ];
        for p in pages {
            let html = p.into_string();
            assert!(!html.contains("<script>"), "escaped");
            let bad = english_in(&prose(&html).replace(evil, " "));
            assert!(bad.is_empty(), "{bad:?} in {}", prose(&html));
        }
        for e in [
            store::AlertSettingsError::Email,
            store::AlertSettingsError::WebhookUrl,
            store::AlertSettingsError::WebhookHttps,
            store::AlertSettingsError::WebhookPrivate,
            store::AlertSettingsError::OfflineMinutes,
        ] {
            assert!(english_in(&prose(&alert_error(&ru, e).into_string())).is_empty(), "{e:?}");
        }
        for e in [
            AccountError::PasswordShort,
            AccountError::PasswordLong,
            AccountError::PasswordMismatch,
            AccountError::KeyLabel,
            AccountError::Credentials,
            AccountError::TotpNotStarted,
            AccountError::TooMany(5),
        ] {
            assert!(english_in(&account_error(&ru, e)).is_empty(), "{e:?}");
        }
    }

    /// The alerts section with one notice of each kind, state, channel and delivery, a refused
    /// field, and `evil` as a server's name.
    fn alerts_example(ctx: &Ctx, evil: &str) -> Markup {
        use gpum_protocol::AlertNotice;
        let mut sent = Vec::new();
        for (i, kind) in AlertKind::ALL.iter().enumerate() {
            for state in AlertState::ALL {
                for channel in AlertChannel::ALL {
                    sent.push(AlertNotice {
                        at: 1_796_601_000 + i as u64,
                        node_id: "n".into(),
                        node_name: evil.into(),
                        kind: *kind,
                        state: *state,
                        channel: *channel,
                        delivery: AlertDelivery::ALL[i % 3],
                        error: None,
                    });
                }
            }
        }
        let view = AlertSettingsView {
            settings: AlertSettings::default(),
            email_available: false,
            webhook_public_key: Some("MCowBQYDK2VwAyEA".into()),
            sent,
        };
        let typed = AlertForm { email: evil.into(), ..AlertForm::of(&view.settings) };
        alerts_section(ctx, &view, Some(&typed), Some(store::AlertSettingsError::Email))
    }
}
