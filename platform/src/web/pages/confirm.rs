//! The confirmation pages: delete a server, replace its token, a command refused, the new token.

use super::*;

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
