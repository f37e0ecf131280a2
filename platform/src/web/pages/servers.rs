//! The servers page: the owner's machines, one page of the list at a time.

use super::*;

/// Which page of a list a page shows: the cursor it starts after (`None`: the first) and the
/// next page's (`None`: the last).
#[derive(Debug, Clone, Copy, Default)]
pub struct PageAt<'a> {
    pub after: Option<&'a str>,
    pub next: Option<&'a str>,
}

/// The servers page; `deleted`: the server this session deleted (kept with the session, never
/// taken from the address); `totp_reset_at`: when the operator turned the owner's second factor
/// off, while it stays off.
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
        div #servers data-live=(live) data-at=(iso(now)) {
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
                                td.gpus data-label=(ctx.t(Msg::ColGpus)) {
                                    @for g in gpu_summary(ctx, n, Some(CELL_MAX_CHARS)) { (g) br; }
                                    // Issue 46: never a blank cell.
                                    @if n.inventory.public.gpus.is_empty() { span.no-gpu.wait { (ctx.t(Msg::NoGpuCell)) } }
                                    (occupancy(ctx, n))
                                }
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

/// A server's GPUs at a glance (issue 46): rented, idle, not rentable; only the counts that
/// are not zero.
pub(super) fn occupancy(ctx: &Ctx, n: &NodeSummary) -> Markup {
    let o = n.occupancy;
    let parts = [
        (o.rented, Msg::OccRented, "occ-rented"),
        (o.idle, Msg::OccIdle, "occ-idle ok"),
        (o.not_rentable, Msg::OccNotRentable, "occ-not-rentable wait"),
    ];
    html! {
        span.occupancy data-rented=(o.rented) data-idle=(o.idle) data-not-rentable=(o.not_rentable) {
            @for (i, (count, m, class)) in parts.iter().filter(|p| p.0 > 0).enumerate() {
                @if i > 0 { " · " }
                span class=(class) { (fill(ctx.t(*m), &[("n", &count.to_string())])) }
            }
        }
    }
}
