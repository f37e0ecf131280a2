//! Issue 46, "pages that never mislead": every answer under `/dashboard` is a page of the cabinet
//! in the owner's language, never the API's English JSON.
//!
//! - [`cabinet_pages`], a layer over every dashboard route: an error answer that is not a page (axum's
//!   405 for a GET of a form's address, the body reader's 413 and 408, a refusal of the store
//!   the handler passed on as [`crate::error::ApiError`]) is answered with the page that says
//!   the same, with the same status (and its `Allow`, `Retry-After`);
//! - [`unknown_page`]: a path under `/dashboard` that is no page;
//! - [`parse_form`]: a signed-in form whose key matched but whose values are not what the form
//!   sends is refused with why (400), not as "out of date" (403): a field missing, a value the
//!   form never offers, or a value that is not UTF-8 (refused, never stored as "�").

use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde::de::DeserializeOwned;

use super::pages::{self, BadForm, Ctx, Trouble};
use super::{Req, Web, page};
use crate::server::BODY_LIMIT;

/// The longest field name or value a refusal quotes.
const QUOTED_CHARS: usize = 64;

/// The layer: an error answer that is not already a page becomes one (see the module's doc).
pub(super) async fn cabinet_pages(State(web): State<Arc<Web>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let (uri, headers) = (parts.uri.clone(), parts.headers.clone());
    let resp = next.run(Request::from_parts(parts, body)).await;
    let status = resp.status();
    if !status.is_client_error() && !status.is_server_error() {
        return resp;
    }
    let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct.starts_with("text/html") {
        return resp;
    }
    let trouble = match status {
        StatusCode::NOT_FOUND => Trouble::NoSuchPage,
        StatusCode::METHOD_NOT_ALLOWED => Trouble::NotAForm { back: parent(uri.path()) },
        StatusCode::PAYLOAD_TOO_LARGE => Trouble::TooLarge(BODY_LIMIT),
        StatusCode::REQUEST_TIMEOUT => Trouble::TooSlow,
        StatusCode::TOO_MANY_REQUESTS => Trouble::TooMany,
        s if s.is_server_error() => Trouble::Internal,
        _ => Trouble::Refused,
    };
    // The request's language and session, as any page has them (the body is gone; a page
    // needs none of it).
    let mut p = axum::http::Request::builder().uri(uri).body(()).unwrap_or_default().into_parts().0;
    p.headers = headers;
    let Ok(r) = Req::from_request_parts(&mut p, &web).await;
    let mut out = page(status, pages::trouble(&r.ctx, &trouble));
    for h in [header::ALLOW, header::RETRY_AFTER] {
        if let Some(v) = resp.headers().get(&h) {
            out.headers_mut().insert(h, v.clone());
        }
    }
    out
}

/// Where a form's address leads back to: the page it belongs to (`/dashboard/servers/X` for
/// `/dashboard/servers/X/settings`), the servers for one at the top.
fn parent(path: &str) -> String {
    // A form's address deeper under a server's page (`…/maintenance/W/delete`) leads to the
    // server's page.
    if let Some(rest) = path.strip_prefix("/dashboard/servers/")
        && let Some((server, _)) = rest.split_once('/')
        && !server.is_empty()
    {
        return format!("/dashboard/servers/{server}");
    }
    let up = path.trim_end_matches('/').rsplit_once('/').map_or("", |(a, _)| a);
    match up {
        "/dashboard/servers" | "/dashboard" | "" => "/dashboard".to_owned(),
        _ if up.starts_with("/dashboard/") => up.to_owned(),
        _ => "/dashboard".to_owned(),
    }
}

/// A path under `/dashboard` that is no page of the cabinet.
pub(super) async fn unknown_page(r: Req) -> Response {
    page(StatusCode::NOT_FOUND, pages::trouble(&r.ctx, &Trouble::NoSuchPage))
}

/// A method the address does not take (a GET of a form's address: a reload after sending it):
/// what it is, and the way back to its page.
pub(super) async fn not_a_form(r: Req) -> Response {
    let back = parent(&r.ctx.path);
    page(StatusCode::METHOD_NOT_ALLOWED, pages::trouble(&r.ctx, &Trouble::NotAForm { back }))
}

/// A form refused with why (400): nothing was changed.
pub(super) fn bad_form(ctx: &Ctx, why: BadForm) -> Response {
    page(StatusCode::BAD_REQUEST, pages::bad_form(ctx, &why))
}

/// A form's values, parsed after its key matched: `Err` is the 400 page that says which field
/// is wrong and how.
pub(super) fn parse_form<T: DeserializeOwned>(ctx: &Ctx, bytes: &[u8]) -> Result<T, Response> {
    if let Some(field) = not_utf8(bytes) {
        return Err(bad_form(ctx, BadForm::NotUtf8(field)));
    }
    serde_urlencoded::from_bytes(bytes).map_err(|e| bad_form(ctx, why(&e.to_string())))
}

/// What serde's refusal of a form means: a missing field, named; else unreadable.
fn why(e: &str) -> BadForm {
    match e.strip_prefix("missing field `").and_then(|f| f.strip_suffix('`')) {
        Some(f) => BadForm::Missing(quoted(f)),
        None => BadForm::Unreadable,
    }
}

/// Text from the request, cut to [`QUOTED_CHARS`] (the page escapes it like any other).
pub(crate) fn quoted(s: &str) -> String {
    if s.chars().count() <= QUOTED_CHARS {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(QUOTED_CHARS).collect::<String>())
    }
}

/// The first field (by name) of an `application/x-www-form-urlencoded` body whose name or value,
/// percent-decoded, is not UTF-8; `None` when all are. (The form parser would put "�" in their
/// place and go on.)
fn not_utf8(bytes: &[u8]) -> Option<String> {
    let decode = |b: &[u8]| -> Vec<u8> {
        let plus: Vec<u8> = b.iter().map(|&c| if c == b'+' { b' ' } else { c }).collect();
        percent_encoding::percent_decode(&plus).collect()
    };
    for pair in bytes.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[..0]),
        };
        let (k, v) = (decode(k), decode(v));
        if std::str::from_utf8(&k).is_err() || std::str::from_utf8(&v).is_err() {
            return Some(quoted(&String::from_utf8_lossy(&k)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_not_in_utf8_is_named_and_utf8_passes() {
        assert_eq!(not_utf8(b"csrf=ab&name=%D0%A1%D1%82%D0%BE%D0%B9%D0%BA%D0%B0+3"), None);
        assert_eq!(not_utf8("name=Стойка".as_bytes()), None);
        assert_eq!(not_utf8(b"csrf=ab&name=%FF%FE"), Some("name".into()));
        assert_eq!(not_utf8(b"csrf=ab&name=\xff"), Some("name".into()));
        assert_eq!(not_utf8(b"csrf=ab&%C3%28=1"), Some("\u{fffd}(".into()));
        assert_eq!(not_utf8(b"&&x&=y"), None);
    }

    #[test]
    fn a_missing_field_is_named() {
        assert_eq!(why("missing field `price`"), BadForm::Missing("price".into()));
        assert_eq!(why("invalid digit found in string"), BadForm::Unreadable);
    }

    #[test]
    fn a_forms_address_leads_back_to_its_page() {
        assert_eq!(parent("/dashboard/servers/node-1/settings"), "/dashboard/servers/node-1");
        assert_eq!(parent("/dashboard/servers/node-1"), "/dashboard");
        assert_eq!(parent("/dashboard/servers/node-1/maintenance"), "/dashboard/servers/node-1");
        assert_eq!(parent("/dashboard/servers/node-1/maintenance/mw-1/delete"), "/dashboard/servers/node-1");
        assert_eq!(parent("/dashboard/account/keys"), "/dashboard/account");
        assert_eq!(parent("/dashboard/logout"), "/dashboard");
        assert_eq!(parent("/dashboard"), "/dashboard");
    }
}
