//! Issue 46: the pages that answer what is no page of the cabinet (an unknown address, a GET of
//! a form's address, an oversized or slow form, a refusal) and a form refused with why.

use super::*;

/// Why an answer is no ordinary page (`web::trouble::cabinet_pages` picks it from the status).
pub enum Trouble {
    /// No page of the cabinet has this address.
    NoSuchPage,
    /// The address takes a form (a reload of a form's result, say); `back` is its page.
    NotAForm {
        back: String,
    },
    /// The form is over this many bytes.
    TooLarge(usize),
    /// The form did not arrive within the body timeout.
    TooSlow,
    TooMany,
    /// Any other refusal.
    Refused,
    Internal,
}

pub fn trouble(ctx: &Ctx, t: &Trouble) -> Markup {
    let (title, text, back) = match t {
        Trouble::NoSuchPage => (Msg::NotFoundTitle, ctx.t(Msg::NoSuchPage).to_owned(), "/dashboard"),
        Trouble::NotAForm { back } => {
            (Msg::NotAFormTitle, ctx.t(Msg::NotAFormHelp).to_owned(), back.as_str())
        }
        Trouble::TooLarge(n) => {
            (Msg::TooLargeTitle, fill(ctx.t(Msg::TooLargeHelp), &[("n", &n.to_string())]), "/dashboard")
        }
        Trouble::TooSlow => (Msg::TooSlowTitle, ctx.t(Msg::TooSlowHelp).to_owned(), "/dashboard"),
        Trouble::TooMany => (Msg::TooManyTitle, ctx.t(Msg::TooManyHelp).to_owned(), "/dashboard"),
        Trouble::Refused => (Msg::RefusedTitle, ctx.t(Msg::RefusedHelp).to_owned(), "/dashboard"),
        Trouble::Internal => (Msg::InternalTitle, ctx.t(Msg::InternalHelp).to_owned(), "/dashboard"),
    };
    layout(
        ctx,
        ctx.t(title),
        html! {
            p #trouble data-trouble=(match t {
                Trouble::NoSuchPage => "no-such-page",
                Trouble::NotAForm { .. } => "not-a-form",
                Trouble::TooLarge(_) => "too-large",
                Trouble::TooSlow => "too-slow",
                Trouble::TooMany => "too-many",
                Trouble::Refused => "refused",
                Trouble::Internal => "internal",
            }) { (text) }
            p { a #back href=(back) { (ctx.t(Msg::BackToPage)) } }
        },
    )
}

/// Why a form was refused (400), whose key matched: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadForm {
    /// This field is missing.
    Missing(String),
    /// This field holds a value the form never sends.
    Value {
        field: &'static str,
        value: String,
    },
    /// This field's name or value is not UTF-8.
    NotUtf8(String),
    /// A command the platform has none of, as it was sent.
    UnknownCommand(String),
    Unreadable,
}

pub fn bad_form(ctx: &Ctx, why: &BadForm) -> Markup {
    let text = match why {
        BadForm::Missing(f) => fill(ctx.t(Msg::BadFormMissing), &[("field", f)]),
        BadForm::Value { field, value } => {
            fill(ctx.t(Msg::BadFormValue), &[("field", *field), ("value", &cut(value))])
        }
        BadForm::NotUtf8(f) => fill(ctx.t(Msg::BadFormNotUtf8), &[("field", f)]),
        BadForm::UnknownCommand(k) => fill(ctx.t(Msg::UnknownCommand), &[("kind", &cut(k))]),
        BadForm::Unreadable => ctx.t(Msg::BadFormUnreadable).to_owned(),
    };
    layout(
        ctx,
        ctx.t(Msg::BadFormTitle),
        html! {
            p.error #bad-form { (text) }
            p { a #back href="/dashboard" { (ctx.t(Msg::BackToPage)) } }
        },
    )
}
