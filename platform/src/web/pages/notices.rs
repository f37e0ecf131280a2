//! The short pages that say why nothing else is shown: disabled, the operator's sign-in, a stale form,
//! not found, the open-codes limit, the second factor turned off.

use super::*;

pub fn disabled(ctx: &Ctx) -> Markup {
    layout(ctx, ctx.t(Msg::Title), html! { p #disabled { (with_flags(ctx.t(Msg::Disabled))) } })
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
    not_found_as(ctx, Msg::NotFound)
}

/// The same page, naming what is not there (a join code's page names the code, not a server).
pub fn not_found_as(ctx: &Ctx, what: Msg) -> Markup {
    layout(
        ctx,
        ctx.t(Msg::NotFoundTitle),
        html! { p #not-found { (ctx.t(what)) } p { a href="/dashboard" { (ctx.t(Msg::Back)) } } },
    )
}

/// What the owner's pages say after the operator turned their second factor off (issue 43),
/// while it stays off.
pub(crate) fn totp_reset_notice(ctx: &Ctx, at: u64) -> Markup {
    html! { p.flash #totp-reset { (fill_html(ctx.t(Msg::TotpResetByOperator), &[("at", when(at))])) } }
}
