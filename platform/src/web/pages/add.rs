//! The add-a-server page: the install commands and the open join codes.

use super::*;

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
        div #open-codes data-live="/dashboard/add" data-at=(iso(now)) {
            @if open.is_empty() {
                p #no-open-codes { (ctx.t(Msg::NoOpenCodes)) }
            } @else {
                table.cards {
                    thead { tr {
                        // The operator sees every owner's codes: each names whose it is.
                        @if ctx.account.is_none() { th { (ctx.t(Msg::ColOwner)) } }
                        th { (ctx.t(Msg::ColCreated)) } th { (ctx.t(Msg::ColExpires)) } th { (ctx.t(Msg::ColStatus)) }
                    } }
                    tbody {
                        @for c in open {
                            tr.open-code data-code=(c.hash) {
                                @if ctx.account.is_none() {
                                    td.owner data-label=(ctx.t(Msg::ColOwner)) {
                                        (c.owner.as_deref().unwrap_or(ctx.t(Msg::OperatorsOwn)))
                                    }
                                }
                                td data-label=(ctx.t(Msg::ColCreated)) { (when(c.created_at)) }
                                td data-label=(ctx.t(Msg::ColExpires)) { (when(c.expires_at)) }
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
pub(super) fn no_install_command(ctx: &Ctx, dist: &Dist) -> Option<Markup> {
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
            pre { code #(id) { (with_flags(text)) } }
            button.copy type="button" data-copy=(id) data-done=(ctx.t(Msg::Copied)) { (ctx.t(Msg::Copy)) }
        }
    }
}

/// `text` with each command-line option (`--dry-run`, `--admin-token-file`) in a `span.opt`
/// that never breaks inside (issue 46: "--dry-|run"); the text itself is unchanged (a copy
/// button copies the same characters).
pub(crate) fn with_flags(text: &str) -> Markup {
    let mut parts: Vec<(bool, &str)> = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("--") {
        // An option starts a word: `--` at the start or after a space or an opening bracket.
        let starts = i == 0 || rest[..i].ends_with([' ', '(', '\n']);
        let len =
            rest[i..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(rest.len() - i);
        if starts && len > 2 {
            parts.push((false, &rest[..i]));
            parts.push((true, &rest[i..i + len]));
        } else {
            parts.push((false, &rest[..i + len.max(2)]));
        }
        rest = &rest[i + len.max(2)..];
    }
    parts.push((false, rest));
    html! { @for (opt, p) in parts { @if opt { span.opt { (p) } } @else { (p) } } }
}

#[cfg(test)]
mod flag_tests {
    use super::*;

    #[test]
    fn options_are_kept_whole_and_the_text_unchanged() {
        let m =
            with_flags("curl -fsSL x | sudo bash -s -- --dry-run (--admin-token-file) a--b").into_string();
        assert_eq!(
            m,
            "curl -fsSL x | sudo bash -s -- <span class=\"opt\">--dry-run</span> \
             (<span class=\"opt\">--admin-token-file</span>) a--b"
        );
        assert_eq!(
            with_flags("Только проверка (--dry-run)").into_string(),
            "Только проверка (<span class=\"opt\">--dry-run</span>)"
        );
        assert_eq!(with_flags("").into_string(), "");
    }
}
