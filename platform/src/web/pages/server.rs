//! One server's page: its details, figures, history, rentals and command buttons (the live region).

use super::*;
use gpum_platform_core::maintenance::WindowError;

fn row(ctx: &Ctx, label: Msg, public: bool, value: &str) -> Markup {
    row_of(ctx, label, public, html! { (value) })
}

/// [`row`] with a value that is markup (a time).
fn row_of(ctx: &Ctx, label: Msg, public: bool, value: Markup) -> Markup {
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
    /// The current rollout (issue 47), for why it halted.
    pub rollout: Option<gpum_protocol::RolloutSummary>,
}

/// A settings form refused (issue 46): why, and what the owner typed, shown again as typed
/// (never the stored values beside an error about them).
pub struct Refused {
    pub error: SettingsError,
    pub name: String,
    pub price: String,
    pub min_rental: String,
}

impl Refused {
    /// The field the error is about, by its element's id.
    fn field(&self) -> &'static str {
        match self.error {
            SettingsError::NameLength | SettingsError::NameControl | SettingsError::NameBidi => "name",
            SettingsError::Price => "price",
            SettingsError::MinRental => "min-rental",
        }
    }
}

/// Why the maintenance form was refused (issue 46).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaintenanceError {
    /// The start is not a date and time.
    Start,
    /// The end is not a date and time.
    End,
    /// The core's refusal of the window.
    Window(WindowError),
}

/// The maintenance form refused: why, and what the owner typed, shown again as typed.
pub struct MaintenanceRefused {
    pub error: MaintenanceError,
    pub starts: String,
    pub ends: String,
}

impl MaintenanceRefused {
    /// The field the error is about, by its element's id.
    fn field(&self) -> &'static str {
        match self.error {
            MaintenanceError::Start | MaintenanceError::Window(WindowError::TooMany) => "maint-start",
            MaintenanceError::End | MaintenanceError::Window(_) => "maint-end",
        }
    }
}

/// A form of the server's page that was refused, with what was typed in it.
pub enum TypedForm<'a> {
    Settings(&'a Refused),
    Maintenance(&'a MaintenanceRefused),
}

/// The server's page; `refused` is a settings form refused: its error is shown at the field it
/// is about, which has the focus (so the page opens there, `dashboard.js` scrolls to it too), and
/// the fields hold what was typed; `check_image` whether the platform's operator has chosen a
/// check image (without one, no recheck runs a check).
pub fn server(
    ctx: &Ctx,
    n: &NodeSummary,
    history: &History,
    now: u64,
    refused: Option<&Refused>,
    check_image: bool,
) -> Markup {
    server_typed(ctx, n, history, now, refused.map(TypedForm::Settings), check_image)
}

/// [`server`], with whichever of its forms was refused (the settings or the maintenance form).
pub fn server_typed(
    ctx: &Ctx,
    n: &NodeSummary,
    history: &History,
    now: u64,
    typed: Option<TypedForm<'_>>,
    check_image: bool,
) -> Markup {
    let (refused, maint) = match typed {
        Some(TypedForm::Settings(r)) => (Some(r), None),
        Some(TypedForm::Maintenance(m)) => (None, Some(m)),
        None => (None, None),
    };
    let title = fill(ctx.t(Msg::ServerTitle), &[("node", &n.name)]);
    let base = format!("/dashboard/servers/{}", n.id);
    // The host name is the default: the field stays empty (with it as the hint) until the owner
    // names the server.
    let named = n.name != n.inventory.private.hostname;
    let stored_price = n.price_per_gpu_hour.map(|p| price_text(p, ctx.currency)).unwrap_or_default();
    let stored_min = n.min_rental_minutes.to_string();
    let (name, price, min_rental) = match refused {
        Some(r) => (r.name.as_str(), r.price.as_str(), r.min_rental.as_str()),
        None => (if named { n.name.as_str() } else { "" }, stored_price.as_str(), stored_min.as_str()),
    };
    let bad = refused.map(Refused::field);
    let error = |field: &str| {
        html! {
            @if let Some(r) = refused.filter(|_| bad == Some(field)) {
                p.error #settings-error role="alert" { (settings_error(ctx, r.error)) }
            }
        }
    };
    layout(
        ctx,
        &title,
        html! {
            (live_status(ctx, now))
            (server_live(ctx, n, history, now, check_image))
            h2 { (ctx.t(Msg::SettingsTitle)) }
            form #settings method="post" action={ (base) "/settings" } {
                (csrf_field(ctx))
                label for="name" { (ctx.t(Msg::ServerName)) " " (seen_by(ctx, false)) }
                (error("name"))
                input #name type="text" name="name" maxlength="64" value=(name)
                    placeholder=(cut(&n.inventory.private.hostname))
                    autofocus[bad == Some("name")] aria-invalid=[(bad == Some("name")).then_some("true")];
                p.help { (ctx.t(Msg::ServerNameHelp)) }
                label for="price" { (ctx.t(Msg::PriceLabel)) " " (seen_by(ctx, true)) }
                (error("price"))
                input #price type="text" name="price" inputmode="decimal" value=(price)
                    autofocus[bad == Some("price")] aria-invalid=[(bad == Some("price")).then_some("true")];
                p.help {
                    (fill(ctx.t(Msg::PriceHelp), &[("currency", earnings::currency_name(ctx.lang, ctx.currency)), ("example", &price_text(150, ctx.currency))]))
                }
                label for="min-rental" { (ctx.t(Msg::MinRentalLabel)) " " (seen_by(ctx, true)) }
                (error("min-rental"))
                input #min-rental type="number" name="min_rental" min="1" max="10080" required value=(min_rental)
                    autofocus[bad == Some("min-rental")]
                    aria-invalid=[(bad == Some("min-rental")).then_some("true")];
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
            (maintenance(ctx, n, now, maint))
            (upgrades(ctx, n, history.rollout.as_ref()))
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

/// Issue 47: the agent's version, an upgrade pending, the last upgrade's result, the current
/// rollout's halt when it concerns this server, and the owner's switch "automatic upgrades" (a
/// CSRF form, as the pause's).
fn upgrades(ctx: &Ctx, n: &NodeSummary, rollout: Option<&gpum_protocol::RolloutSummary>) -> Markup {
    let u = &n.upgrades;
    let base = format!("/dashboard/servers/{}/auto-update", n.id);
    html! {
        section #upgrades {
            h2 { (ctx.t(Msg::UpgradesTitle)) }
            table.facts {
                (row(ctx, Msg::AgentVersion, false, &n.agent_version))
                tr {
                    th { (ctx.t(Msg::UpgradesTitle)) }
                    td.value #upgrade-pending {
                        @match &u.pending {
                            Some(v) => (fill(ctx.t(Msg::UpgradePending), &[("version", v.as_str())])),
                            None => (ctx.t(Msg::NoUpgradePending)),
                        }
                    }
                    td { (seen_by(ctx, false)) }
                }
                tr {
                    th { (ctx.t(Msg::LastUpgrade)) }
                    td.value #last-upgrade data-outcome=[u.last.as_ref().map(|l| l.outcome.as_str())] {
                        @match &u.last {
                            Some(l) => {
                                (upgrade_result(ctx, l))
                                @if !l.detail.is_empty() { " (" (l.detail) ")" }
                            },
                            None => (ctx.t(Msg::NoUpgradeYet)),
                        }
                    }
                    td { (seen_by(ctx, false)) }
                }
            }
            @if let Some(r) = rollout {
                @if r.state == gpum_protocol::RolloutState::Halted
                    && (u.pending.as_deref() == Some(r.version.as_str())
                        || u.last.as_ref().is_some_and(|l| l.to == r.version)) {
                    p.error #rollout-halted {
                        @match r.halt_reason {
                            Some(gpum_protocol::HaltReason::Operator) => (fill(ctx.t(Msg::RolloutHaltedByOperator), &[("version", r.version.as_str())])),
                            _ => (fill(ctx.t(Msg::RolloutHalted), &[
                                ("version", r.version.as_str()),
                                ("failed", r.failed.to_string().as_str()),
                                ("reported", r.reported.to_string().as_str()),
                            ])),
                        }
                    }
                }
            }
            @if u.agent_auto_update == Some(false) {
                p.help #agent-auto-update-off { (ctx.t(Msg::AutoUpdateAgentOff)) }
            }
            form.inline #auto-update-form method="post" action=(base) {
                (csrf_field(ctx))
                span #auto-update { (ctx.t(if u.auto_update { Msg::AutoUpdateOn } else { Msg::AutoUpdateOff })) }
                " "
                @if u.auto_update {
                    input type="hidden" name="auto_update" value="false";
                    button #auto-update-off type="submit" { (ctx.t(Msg::AutoUpdateTurnOff)) }
                } @else {
                    input type="hidden" name="auto_update" value="true";
                    button #auto-update-on type="submit" { (ctx.t(Msg::AutoUpdateTurnOn)) }
                }
                " " span.help { (ctx.t(Msg::AutoUpdateHelp)) }
            }
        }
    }
}

/// An upgrade's result in the page's language.
fn upgrade_result(ctx: &Ctx, l: &gpum_protocol::UpgradeReport) -> String {
    use gpum_protocol::UpgradeOutcome::*;
    let m = match l.outcome {
        Succeeded => Msg::UpgradeSucceeded,
        RolledBack => Msg::UpgradeRolledBack,
        Refused => Msg::UpgradeRefused,
        Failed => Msg::UpgradeFailed,
    };
    fill(ctx.t(m), &[("from", l.from.as_str()), ("to", l.to.as_str())])
}

/// Issue 46: the server's maintenance windows not over yet, each with its delete button, and the
/// form that plans one (`datetime-local` inputs, read as UTC); a refused form keeps what was
/// typed, with the error at its field, which has the focus.
fn maintenance(ctx: &Ctx, n: &NodeSummary, now: u64, refused: Option<&MaintenanceRefused>) -> Markup {
    let base = format!("/dashboard/servers/{}/maintenance", n.id);
    let (starts, ends) = refused.map_or(("", ""), |r| (r.starts.as_str(), r.ends.as_str()));
    let bad = refused.map(MaintenanceRefused::field);
    let error = |field: &str| {
        html! {
            @if let Some(r) = refused.filter(|_| bad == Some(field)) {
                p.error #maintenance-error role="alert" { (maintenance_error(ctx, r.error)) }
            }
        }
    };
    html! {
        section #maintenance {
            h2 { (ctx.t(Msg::MaintenanceTitle)) }
            p.help { (ctx.t(Msg::MaintenanceHelp)) }
            @if n.maintenance.is_empty() {
                p #no-maintenance { (ctx.t(Msg::NoMaintenance)) }
            } @else {
                table.cards #maintenance-list {
                    thead { tr {
                        th { (ctx.t(Msg::ColMaintStart)) } th { (ctx.t(Msg::ColMaintEnd)) } th {}
                    } }
                    tbody {
                        @for w in &n.maintenance {
                            tr.window data-id=(w.id) {
                                td.start data-label=(ctx.t(Msg::ColMaintStart)) {
                                    (when(w.starts_at))
                                    @if w.starts_at <= now && now < w.ends_at {
                                        " · " span.now { (ctx.t(Msg::MaintNow)) }
                                    }
                                }
                                td.end data-label=(ctx.t(Msg::ColMaintEnd)) { (when(w.ends_at)) }
                                td {
                                    form.inline method="post" action={ (base) "/" (w.id) "/delete" } {
                                        (csrf_field(ctx))
                                        button.danger type="submit" { (ctx.t(Msg::MaintDelete)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            form #maintenance-form method="post" action=(base) {
                (csrf_field(ctx))
                label for="maint-start" { (ctx.t(Msg::MaintStartLabel)) }
                (error("maint-start"))
                input #maint-start type="datetime-local" name="starts" required value=(starts)
                    autofocus[bad == Some("maint-start")]
                    aria-invalid=[(bad == Some("maint-start")).then_some("true")];
                label for="maint-end" { (ctx.t(Msg::MaintEndLabel)) }
                (error("maint-end"))
                input #maint-end type="datetime-local" name="ends" required value=(ends)
                    autofocus[bad == Some("maint-end")]
                    aria-invalid=[(bad == Some("maint-end")).then_some("true")];
                button #maint-add type="submit" { (ctx.t(Msg::MaintAdd)) }
            }
        }
    }
}

/// A refusal of the maintenance form in the page's language.
fn maintenance_error(ctx: &Ctx, e: MaintenanceError) -> String {
    use gpum_protocol::limits::{MAX_MAINTENANCE_AHEAD_SECS, MAX_MAINTENANCE_WINDOWS_PER_NODE};
    match e {
        MaintenanceError::Start | MaintenanceError::End => ctx.t(Msg::ErrMaintTime).to_owned(),
        MaintenanceError::Window(WindowError::EndNotAfterStart) => ctx.t(Msg::ErrMaintOrder).to_owned(),
        MaintenanceError::Window(WindowError::EndPassed) => ctx.t(Msg::ErrMaintPast).to_owned(),
        MaintenanceError::Window(WindowError::TooFarAhead) => {
            fill(ctx.t(Msg::ErrMaintAhead), &[("days", &(MAX_MAINTENANCE_AHEAD_SECS / 86_400).to_string())])
        }
        MaintenanceError::Window(WindowError::TooMany) => {
            fill(ctx.t(Msg::ErrMaintTooMany), &[("n", &MAX_MAINTENANCE_WINDOWS_PER_NODE.to_string())])
        }
    }
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
        div #server data-live={ "/dashboard/servers/" (n.id) } data-at=(iso(now))
            data-online=(if n.online { "true" } else { "false" }) {
            table.facts {
                tr {
                    th { (ctx.t(Msg::ColRentable)) }
                    td.value #rentable {
                        (rentable_verdict(ctx, n))
                        @if let (RentableState::Quarantined, Some(q)) = (n.rentable.state, &n.quarantine) {
                            @let advice = crate::web::agent_text::quarantine_advice(q, inv, ctx.lang);
                            @if !advice.is_empty() {
                                ul.fix #quarantine-advice { @for a in &advice { li { (a) } } }
                            }
                        }
                    }
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
                tr #reliability-row {
                    th { (ctx.t(Msg::ColReliability)) }
                    td.value #reliability { (reliability_text(ctx, n)) p.help #reliability-help { (ctx.t(Msg::ReliabilityHelp)) } }
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
                tr #occupancy-row {
                    th { (ctx.t(Msg::ColOccupancy)) }
                    td.value { (super::servers::occupancy(ctx, n)) }
                    td { (seen_by(ctx, false)) }
                }
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
                (row_of(ctx, Msg::Registered, false, when(n.registered_at)))
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
                                td data-label=(ctx.t(Msg::ColWhen)) { (when(c.queued_at)) }
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
                        th { (ctx.t(Msg::ColStart)) } th { (ctx.t(Msg::ColUntil)) }
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
                                td.start data-label=(ctx.t(Msg::ColStart)) { (when(r.created_at)) }
                                td.until data-label=(ctx.t(Msg::ColUntil)) { (when(rental_end(r))) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A server's reliability in words (issue 46): the share, and over which window.
pub(super) fn reliability_text(ctx: &Ctx, n: &NodeSummary) -> Markup {
    let Some(r) = n.reliability else { return text(ctx.t(Msg::ReliabilityNone)) };
    let pct = format!("{}.{}", r.permille / 10, r.permille % 10);
    let pct = match ctx.lang {
        Lang::Ru => pct.replace('.', ","),
        Lang::En => pct,
    };
    if r.window_secs >= gpum_platform_core::reliability::WINDOW_SECS {
        text(&fill(ctx.t(Msg::ReliabilityLast30), &[("pct", &pct)]))
    } else {
        fill_html(ctx.t(Msg::ReliabilitySince), &[("pct", text(&pct)), ("at", when(n.registered_at))])
    }
}

/// When a rental ends (issue 46): a current one at its end time; a past one when it ended (the
/// operator stopped it, or the agent last reported it), never later than its end time.
fn rental_end(r: &gpum_protocol::RentalSummary) -> u64 {
    use gpum_protocol::RentalState::*;
    if r.listed {
        return r.spec.ends_at;
    }
    let ended = match r.state {
        Some(Gone | Failed | Exited) => r.stopped_at.or(r.updated_at),
        _ => r.stopped_at,
    };
    ended.map_or(r.spec.ends_at, |at| at.min(r.spec.ends_at))
}
