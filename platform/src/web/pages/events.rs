//! A server's event log and its commands' outcomes, in words.

use super::*;

/// A command's kind in words; an unknown one as it came.
pub(super) fn command_name(ctx: &Ctx, kind: &str) -> String {
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
        // The agent's text (a command's result, a quarantine's reason), in the owner's language
        // where the platform knows it.
        d => Some(agent_text(d, ctx.lang)),
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
pub(super) fn event_log(ctx: &Ctx, events: &[NodeEvent]) -> Markup {
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
                                td.time { (when(e.at)) }
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
pub(super) fn command_outcome(
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
            t.push_str(&agent_text(&r.message, ctx.lang));
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
