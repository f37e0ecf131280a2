//! The join page: one join code's status, live, and its install command right after it was made.

use super::*;

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
                    p { code #join-code { (code) } " " (fill_html(ctx.t(Msg::CodeExpires), &[("at", when(expires_at))])) }
                    p.help { (ctx.t(Msg::CodeShownOnce)) }
                    h2 { (ctx.t(Msg::InstallCommand)) }
                    @if let Some(m) = no_install_command(ctx, dist) {
                        (m)
                    } @else {
                        p { (ctx.t(Msg::InstallHelp)) }
                        (copyable(ctx, "cmd-install", &install))
                        h3 { (with_flags(ctx.t(Msg::DryRunCommand))) }
                        p { (with_flags(ctx.t(Msg::DryRunHelp))) }
                        (copyable(ctx, "cmd-dry-run", &dry))
                        h3 { (ctx.t(Msg::NoexecCommand)) }
                        p { (with_flags(ctx.t(Msg::NoexecHelp))) }
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
        div #join data-live={ "/dashboard/join/" (code_hash) } data-at=(iso(now))
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
