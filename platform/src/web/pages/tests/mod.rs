//! The pages' tests: what each screen shows, escapes and links.

use super::*;

mod wording;
pub(crate) use wording::{english_in, prose};

/// The context of a page at `/` with no session, in `lang` and the default currency.
fn plain_ctx(lang: Lang) -> Ctx {
    Ctx { lang, path: "/".into(), csrf: None, account: None, currency: gpum_platform_core::currency::DEFAULT }
}

#[test]
fn prices_as_typed_and_shown() {
    let rub = gpum_platform_core::currency::DEFAULT;
    for (typed, minor) in
        [("12", 1200), ("12.5", 1250), ("12,50", 1250), (" 0.07 ", 7), ("1000000", 100_000_000)]
    {
        assert_eq!(parse_price(typed, rub), Some(minor), "{typed}");
    }
    for bad in ["", ".5", "1.234", "-1", "1e3", "12.5.0", "１２", "9999999999999", "1.a"] {
        assert_eq!(parse_price(bad, rub), None, "{bad}");
    }
    assert_eq!(price_text(1250, rub), "12.50");
    assert_eq!(price_text(7, rub), "0.07");
    // A currency without a minor unit: whole yen typed and shown.
    let jpy = Currency::parse("JPY").unwrap();
    assert_eq!((parse_price("1500", jpy), parse_price("15.5", jpy)), (Some(1500), None));
    assert_eq!(price_text(1500, jpy), "1500");
    let ctx = plain_ctx(Lang::Ru);
    let mut n = node("node-1");
    n.price_per_gpu_hour = Some(1250);
    n.paused = true;
    let s = servers(&ctx, &[n.clone()], PageAt::default(), 6, None, None).into_string();
    assert!(s.contains("12,50\u{a0}₽ за час работы видеокарты") && s.contains("приостановлен вами"), "{s}");
    let en = Ctx { lang: Lang::En, path: "/".into(), csrf: None, account: None, currency: rub };
    let s = servers(&en, &[n.clone()], PageAt::default(), 6, None, None).into_string();
    assert!(s.contains("RUB\u{a0}12.50 per GPU-hour"), "{s}");
    let page = server(&en, &n, &History::default(), 6, None, true).into_string();
    assert!(
        page.contains("In the platform&#39;s currency (RUB), e.g. 1.50")
            || page.contains("In the platform's currency (RUB), e.g. 1.50"),
        "{page}"
    );
    n.price_per_gpu_hour = None;
    assert!(server(&ctx, &n, &History::default(), 6, None, true).into_string().contains("пока не сдаётся"));
}

/// Each verdict in words in both languages; a failed check's fix is copyable; a machine with
/// no GPU is never green, whatever its last check said.
#[test]
fn verdicts_in_words_and_a_machine_without_a_gpu_is_never_green() {
    use gpum_protocol::{GpuPublic, Health, NvmlState, ProbeFailure, Rentable};
    let mut n = node("node-1");
    n.inventory.public.gpus = vec![GpuPublic { model: "G".into(), vram_mib: 1024 }];
    n.health = Some(Health { nvml: NvmlState::LibraryMissing, ..Default::default() });
    n.verification = VerificationState::Verified;
    n.rentable = crate::rentable::verdict(&n, true, crate::rentable::Owner::Enabled, 6);
    assert_eq!(n.rentable.state, RentableState::NoGpu);
    for lang in [Lang::Ru, Lang::En] {
        let ctx = plain_ctx(lang);
        for page in [
            servers(&ctx, std::slice::from_ref(&n), PageAt::default(), 6, None, None),
            server(&ctx, &n, &History::default(), 6, None, true),
        ] {
            let s = page.into_string();
            assert!(!s.contains("class=\"ok") && !s.contains("class=\"online\""), "{s}");
            assert!(s.contains("libnvidia-ml"), "{s}");
        }
    }
    n.health = Some(Health { nvml: NvmlState::Ok, ..Default::default() });
    n.verification = VerificationState::Failed;
    n.last_probe_reason = Some(ProbeFailure::NoNvidiaRuntime);
    n.rentable = crate::rentable::verdict(&n, true, crate::rentable::Owner::Enabled, 6);
    let ctx = plain_ctx(Lang::En);
    let s = server(&ctx, &n, &History::default(), 6, None, true).into_string();
    assert!(s.contains("not rentable: the GPU check failed: Docker has no nvidia runtime"), "{s}");
    assert!(s.contains("<code id=\"fix-node-1\">sudo nvidia-ctk runtime configure"), "{s}");
    assert!(s.contains("data-copy=\"fix-node-1\""), "{s}");
    n.rentable = Rentable { state: RentableState::Offline, since: Some(1_796_290_406) };
    let ru = plain_ctx(Lang::Ru);
    assert!(
        server(&ru, &n, &History::default(), 6, None, true)
            .into_string()
            .contains(&format!("не сдаётся: офлайн с {}", when(1_796_290_406).into_string()))
    );
    n.rentable.state = RentableState::AwaitingOperator;
    assert!(
        servers(&ru, &[n], PageAt::default(), 6, None, None)
            .into_string()
            .contains("оператор платформы выберет образ")
    );
}

fn rental(
    text: &str,
    state: Option<gpum_protocol::RentalState>,
    reason: Option<&str>,
) -> gpum_protocol::RentalSummary {
    gpum_protocol::RentalSummary {
        node_id: "node-1".into(),
        spec: gpum_protocol::RentalSpec {
            id: format!("rent-{text}"),
            image: format!("{text}@sha256:00"),
            gpu_uuids: vec![format!("GPU-{text}")],
            cpu_millis: 1000,
            memory_mib: 1024,
            disk_gib: 1,
            shm_mib: 64,
            env: vec![],
            command: vec![],
            ends_at: 1_796_290_406,
            ports: vec![],
            driver_capabilities: vec![],
        },
        created_at: 1,
        stopped_at: None,
        listed: state.is_none(),
        state,
        exit_code: Some(3),
        reason: reason.map(String::from),
        updated_at: None,
        tunnel: None,
        price: None,
    }
}

/// The server's rentals in a table of cards, each cell labelled, in both languages; none: a
/// line that says so.
#[test]
fn the_server_page_says_whether_a_rentals_disk_can_be_limited() {
    let mut n = node("node-1");
    for (limit, en, ru) in [
        (Some(true), "enforced: XFS with project quotas", "есть: XFS с квотами проектов"),
        (Some(false), "not enforced: a rental's disk is bounded only", "нет: диск аренды ограничен"),
        (None, "unknown: the agent did not say", "неизвестно: агент не сообщил"),
    ] {
        n.inventory.public.rental_disk_limit = limit;
        for (lang, want) in [(Lang::En, en), (Lang::Ru, ru)] {
            let ctx = plain_ctx(lang);
            let s = server(&ctx, &n, &History::default(), 6, None, true).into_string();
            assert!(s.contains(&maud::html! { (want) }.into_string()), "{lang:?} {limit:?}: {want} in {s}");
        }
    }
}

#[test]
fn the_server_page_lists_its_rentals_in_both_languages() {
    use gpum_protocol::RentalState::*;
    let n = node("node-1");
    let h = History {
        rentals: vec![
            rental("a", Some(Running), None),
            rental("b", Some(Exited), None),
            rental("c", None, None),
        ],
        ..Default::default()
    };
    for (lang, want) in [
        (Lang::En, ["Rentals", "running", "exited (3)", "waiting for the agent", "<th>End</th>"]),
        (Lang::Ru, ["Аренды", "работает", "процесс завершился (3)", "ждёт агента", "<th>Конец</th>"]),
    ] {
        let ctx = plain_ctx(lang);
        let s = server(&ctx, &n, &h, 6, None, true).into_string();
        for w in want {
            assert!(s.contains(w), "{lang:?}: {w} in {s}");
        }
        assert!(s.contains("<table class=\"cards\" id=\"rental-list\">"), "{s}");
        assert_eq!(s.matches("<tr class=\"rental\"").count(), 3);
        assert!(s.contains("2026-12-03 09:33"), "{s}");
        let empty = server(&ctx, &n, &History::default(), 6, None, true).into_string();
        assert!(empty.contains("id=\"no-rentals\""), "{empty}");
    }
    // Each cell is labelled for the phone's cards.
    let ctx = plain_ctx(Lang::Ru);
    let s = server(&ctx, &n, &h, 6, None, true).into_string();
    for label in ["Аренда", "Образ", "Видеокарты", "Состояние", "Начало", "Конец"]
    {
        assert!(s.contains(&format!("data-label=\"{label}\"")), "{label}");
    }
}

/// "Restart" shows "restarting" until a heartbeat after the agent's acknowledgement, then
/// "back online", or that it did not come back; "Check again" is green only when a probe
/// report that passed arrived after it, and says "no check ran" without a check image.
#[test]
fn commands_are_judged_by_what_followed_them() {
    use gpum_protocol::{CommandResult, Rentable};
    let c = |kind: &str, delivered: Option<u64>, result: Option<(bool, u64)>| CommandStatus {
        id: "c".into(),
        kind: kind.into(),
        queued_at: 10,
        delivered_at: delivered,
        result: result.map(|(ok, _)| CommandResult { id: "c".into(), ok, message: "m".into() }),
        completed_at: result.map(|(_, at)| at),
    };
    let mut n = node("node-1");
    n.last_heartbeat_at = Some(20);
    n.health = Some(gpum_protocol::Health { nvml: gpum_protocol::NvmlState::Ok, ..Default::default() });
    let ctx = plain_ctx(Lang::En);
    let ru = plain_ctx(Lang::Ru);
    let judge = |n: &NodeSummary, cmd: &CommandStatus| {
        let image = n.rentable.state != RentableState::AwaitingOperator;
        let (class, result, en) = command_outcome(&ctx, n, cmd, image);
        (class, result, en, command_outcome(&ru, n, cmd, image).2)
    };
    // Restart.
    assert_eq!(judge(&n, &c("restart", None, None)).1, "queued");
    let r = judge(&n, &c("restart", Some(12), None));
    assert_eq!(
        (r.0, r.1, r.2.as_str(), r.3.as_str()),
        ("wait", "restarting", "restarting…", "агент перезапускается…")
    );
    // Acknowledged at the last heartbeat: the agent is only now exiting.
    assert_eq!(judge(&n, &c("restart", Some(12), Some((true, 20)))).1, "restarting");
    let r = judge(&n, &c("restart", Some(12), Some((true, 14))));
    assert_eq!(
        (r.0, r.1, r.2.as_str(), r.3.as_str()),
        ("ok", "back-online", "back online", "агент перезапущен и снова онлайн")
    );
    assert_eq!(judge(&n, &c("restart", Some(12), Some((false, 14)))).0, "bad");
    let mut off = n.clone();
    off.online = false;
    assert_eq!(judge(&off, &c("restart", Some(12), Some((true, 20)))).1, "not-back");
    assert_eq!(judge(&off, &c("restart", Some(12), None)).1, "lost");
    assert_eq!(judge(&off, &c("restart", None, None)).1, "undelivered");

    // Recheck: acknowledged, but no report after it is never green.
    let ack = c("recheck", Some(12), Some((true, 14)));
    n.verification = VerificationState::Verified;
    n.inventory.public.gpus = vec![gpum_protocol::GpuPublic { model: "G".into(), vram_mib: 1024 }];
    n.last_probe_at = Some(5);
    assert_eq!(judge(&n, &ack).0, "wait", "an earlier pass does not count");
    assert_eq!(judge(&n, &ack).1, "checking");
    n.rentable = Rentable { state: RentableState::AwaitingOperator, since: None };
    let r = judge(&n, &ack);
    assert_eq!((r.0, r.1), ("wait", "no-check"));
    assert!(r.2.starts_with("no check ran") && r.3.starts_with("проверка не запускалась"), "{r:?}");
    n.last_probe_at = Some(16);
    let r = judge(&n, &ack);
    assert_eq!((r.0, r.1, r.2.as_str(), r.3.as_str()), ("ok", "passed", "check passed", "проверка пройдена"));
    n.verification = VerificationState::Failed;
    n.last_probe_reason = Some(gpum_protocol::ProbeFailure::Timeout);
    let r = judge(&n, &ack);
    assert_eq!((r.0, r.1), ("bad", "check-failed"));
    assert_eq!(r.2, "check failed: the check did not finish in time");
    // A pass on a machine without a working driver is not green either.
    n.verification = VerificationState::Verified;
    n.health =
        Some(gpum_protocol::Health { nvml: gpum_protocol::NvmlState::LibraryMissing, ..Default::default() });
    assert_eq!(judge(&n, &ack).1, "no-gpu");
    off.last_probe_at = None;
    assert_eq!(judge(&off, &ack).1, "no-result");
    // The kinds in words, and the history's cells.
    n.commands = vec![ack];
    let s = server(&ru, &n, &History::default(), 20, None, true).into_string();
    assert!(s.contains(">повторная проверка<"), "{s}");
    assert!(!s.contains(">recheck<"), "{s}");
}

/// Issue 46: a time is a `<time>` whose `datetime` is ISO 8601 UTC and whose text and `title`
/// say the UTC time (the script rewrites the text into the browser's zone); a sentence holding
/// one escapes its text and values around the markup.
#[test]
fn times_are_time_elements_in_utc() {
    use gpum_protocol::Rentable;
    assert_eq!(
        when(1_796_290_406).into_string(),
        r#"<time datetime="2026-12-03T09:33:26Z" title="2026-12-03 09:33 UTC">2026-12-03 09:33 UTC</time>"#
    );
    assert_eq!(
        when(0).into_string(),
        r#"<time datetime="1970-01-01T00:00:00Z" title="1970-01-01 00:00 UTC">1970-01-01 00:00 UTC</time>"#
    );
    assert_eq!(
        when_hms(1_796_290_406).into_string(),
        r#"<time datetime="2026-12-03T09:33:26Z" data-seconds title="2026-12-03 09:33:26 UTC">09:33:26 UTC</time>"#
    );
    let s = fill_html("<i>{why}</i> & {at} {none}", &[("at", when(0)), ("why", text("<b>\"x\""))]);
    assert_eq!(
        s.into_string(),
        "&lt;i&gt;&lt;b&gt;&quot;x&quot;&lt;/i&gt; &amp; <time datetime=\"1970-01-01T00:00:00Z\" \
         title=\"1970-01-01 00:00 UTC\">1970-01-01 00:00 UTC</time> {none}"
    );
    // Every page's times so, and the live region's `data-at` too; the labels no longer say
    // "(UTC)": the time itself names its zone.
    let ctx = plain_ctx(Lang::En);
    let mut n = node("node-1");
    n.rentable = Rentable { state: RentableState::Offline, since: Some(1_796_290_406) };
    let s = servers(&ctx, &[n.clone()], PageAt::default(), 1_796_290_500, None, None).into_string();
    assert!(s.contains(r#"data-at="2026-12-03T09:35:00Z""#), "{s}");
    assert!(s.contains(r#"Updated at <time datetime="2026-12-03T09:35:00Z" data-seconds"#), "{s}");
    assert!(s.contains(&format!("offline since {}", when(1_796_290_406).into_string())), "{s}");
    let s = server(&ctx, &n, &History::default(), 1_796_290_500, None, true).into_string();
    assert!(!s.contains("(UTC)"), "{s}");
    assert!(s.contains(r#"<time datetime="2026-12-03T09:35:00Z" data-seconds"#), "{s}");
}

#[test]
fn utc_dates() {
    assert_eq!(utc(0), "1970-01-01 00:00");
    assert_eq!(utc(1_796_290_406), "2026-12-03 09:33");
    assert_eq!(utc(951_782_400), "2000-02-29 00:00");
}

/// Issue 29, item 12: the sum of the GPUs' memory overflowed (a panic in a debug build).
#[test]
fn a_server_page_survives_numbers_at_their_extremes() {
    let mut n = node("node-1");
    n.inventory.public.gpus = vec![gpum_protocol::GpuPublic { model: "G".into(), vram_mib: u64::MAX }; 2];
    n.inventory.public.ram_mib = u64::MAX;
    n.inventory.public.disk_gib = u64::MAX;
    n.inventory.public.cpu_cores = u32::MAX;
    let ctx = plain_ctx(Lang::En);
    assert!(server(&ctx, &n, &History::default(), u64::MAX, None, true).into_string().contains("2 × G"));
    assert!(servers(&ctx, &[n], PageAt::default(), 0, None, None).into_string().contains("node-1"));
}

#[test]
fn the_servers_page_links_the_next_page_and_refreshes_its_own() {
    for lang in [Lang::Ru, Lang::En] {
        let ctx = plain_ctx(lang);
        let first =
            servers(&ctx, &[], PageAt { after: None, next: Some("MTA6bl9h") }, 6, None, None).into_string();
        assert!(first.contains(r#"href="/dashboard?after=MTA6bl9h""#), "{first}");
        assert!(first.contains(ctx.t(Msg::NextPage)) && !first.contains(r#"id="first-page""#));
        assert!(first.contains(r#"data-live="/dashboard""#));
        let later =
            servers(&ctx, &[], PageAt { after: Some("MTA6bl9h"), next: None }, 6, None, None).into_string();
        assert!(later.contains(r#"data-live="/dashboard?after=MTA6bl9h""#), "{later}");
        assert!(later.contains(ctx.t(Msg::FirstPage)) && !later.contains(r#"id="next-page""#));
        let only = servers(&ctx, &[], PageAt::default(), 6, None, None).into_string();
        assert!(!only.contains(r#"id="next-page""#) && !only.contains(r#"id="first-page""#));
    }
}

fn node(id: &str) -> NodeSummary {
    NodeSummary {
        id: id.into(),
        online: true,
        verification: VerificationState::AwaitingCheck,
        last_heartbeat_at: Some(5),
        registered_at: 1,
        agent_version: "1".into(),
        name: id.into(),
        price_per_gpu_hour: None,
        min_rental_minutes: 60,
        ..Default::default()
    }
}

#[test]
fn node_text_is_escaped_everywhere() {
    let evil = "<script>alert(1)</script>\"onmouseover=alert(2) x='";
    let mut n = NodeSummary {
        verification: VerificationState::Failed,
        last_probe_output: Some(evil.into()),
        last_probe_reason: Some(gpum_protocol::ProbeFailure::NvmlUnknownError),
        agent_version: evil.into(),
        commands: vec![gpum_protocol::CommandStatus {
            id: "c".into(),
            kind: evil.into(),
            queued_at: 1,
            delivered_at: Some(2),
            result: Some(gpum_protocol::CommandResult { id: "c".into(), ok: false, message: evil.into() }),
            completed_at: Some(3),
        }],
        ..node("node-1")
    };
    n.inventory.private.hostname = evil.into();
    n.name = evil.into();
    n.owner = Some(evil.into());
    n.paused = true;
    n.inventory.private.gpu_uuids = vec![evil.into()];
    n.inventory.public.gpus = vec![gpum_protocol::GpuPublic { model: evil.into(), vram_mib: 1 }];
    // What a node sends also reaches the event log and the figures.
    let history = History {
        samples: vec![MetricsSample { at: 5, metrics: Metrics::default() }],
        events: [NodeEventKind::ContainerRemoved, NodeEventKind::CommandFailed, NodeEventKind::CheckFailed]
            .into_iter()
            .map(|kind| NodeEvent { at: 5, kind, subject: evil.into(), detail: evil.into() })
            .collect(),
        rentals: vec![rental(evil, Some(gpum_protocol::RentalState::Failed), Some(evil))],
        ..Default::default()
    };
    n.last_metrics = Some(Metrics::default());
    // A refused form shows what was typed again: escaped too.
    let refused = Refused {
        error: SettingsError::NameControl,
        name: evil.into(),
        price: evil.into(),
        min_rental: evil.into(),
    };
    for lang in [Lang::Ru, Lang::En] {
        let ctx = Ctx {
            lang,
            path: "/dashboard?<x>".into(),
            csrf: Some("\"><b>".into()),
            account: None,
            currency: gpum_platform_core::currency::DEFAULT,
        };
        for page in [
            servers(&ctx, std::slice::from_ref(&n), PageAt::default(), 6, Some(evil), None),
            server(&ctx, &n, &history, 6, Some(&refused), true),
            join_page(&ctx, "h", join_status(&ctx, JoinState::Node(&n)), false, Shown::Closed, 6),
            confirm_delete(&ctx, evil),
        ] {
            let s = page.into_string();
            assert!(!s.contains("<script>alert"), "{s}");
            assert!(!s.contains("\"onmouseover"), "{s}");
            assert!(!s.contains("<b>"), "{s}");
            assert!(!s.contains("<x>"), "{s}");
            // Only our own script tag, by file.
            assert_eq!(s.matches("<script").count(), 1);
        }
    }
}

/// Issue 46: the maintenance section lists the windows not over (the one on now marked), each
/// with its delete form and the session's key; inside one the verdict says until when; a refused
/// form keeps what was typed, escaped, with the error at its field, which has the focus.
#[test]
fn the_maintenance_section_lists_windows_and_keeps_a_refused_form() {
    use gpum_platform_core::maintenance::WindowError;
    use gpum_protocol::{MaintenanceWindow, Rentable};
    let mut n = node("node-1");
    n.maintenance = vec![
        MaintenanceWindow {
            id: "mw-a".into(),
            starts_at: 1_796_601_000,
            ends_at: 1_796_608_200,
            created_at: 1,
        },
        MaintenanceWindow {
            id: "mw-b".into(),
            starts_at: 1_796_700_000,
            ends_at: 1_796_703_600,
            created_at: 1,
        },
    ];
    n.rentable = Rentable { state: RentableState::Maintenance, since: Some(1_796_601_000) };
    let now = 1_796_601_060;
    for (lang, verdict, none) in [
        (
            Lang::Ru,
            "не сдаётся: обслуживание с 2026-12-06 23:50 UTC до 2026-12-07 01:50 UTC",
            "Обслуживание не запланировано.",
        ),
        (
            Lang::En,
            "not rentable: maintenance from 2026-12-06 23:50 UTC to 2026-12-07 01:50 UTC",
            "No maintenance planned.",
        ),
    ] {
        let ctx = Ctx {
            lang,
            path: "/dashboard/servers/node-1".into(),
            csrf: Some("k".into()),
            account: None,
            currency: gpum_platform_core::currency::DEFAULT,
        };
        let s = server(&ctx, &n, &History::default(), now, None, true).into_string();
        let words = prose(&s).split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains(verdict), "{s}");
        assert!(s.contains(r#"action="/dashboard/servers/node-1/maintenance/mw-a/delete""#), "{s}");
        assert!(s.contains(r#"action="/dashboard/servers/node-1/maintenance/mw-b/delete""#), "{s}");
        assert_eq!(s.matches(r#"class="now""#).count(), 1, "only the window on now");
        assert!(!s.contains("maintenance-error") && !s.contains(none));
        let mut empty = n.clone();
        empty.maintenance.clear();
        assert!(server(&ctx, &empty, &History::default(), now, None, true).into_string().contains(none));

        let refused = MaintenanceRefused {
            error: MaintenanceError::Window(WindowError::EndNotAfterStart),
            starts: "2026-12-07T02:00".into(),
            ends: "<b>\"".into(),
        };
        let s =
            server_typed(&ctx, &n, &History::default(), now, Some(TypedForm::Maintenance(&refused)), true)
                .into_string();
        assert!(s.contains(r#"value="2026-12-07T02:00""#) && s.contains("value=\"&lt;b&gt;&quot;\""), "{s}");
        assert!(!s.contains("<b>"));
        let at_end = s.find("id=\"maintenance-error\"").unwrap();
        assert!(
            at_end > s.find("for=\"maint-end\"").unwrap() && at_end < s.find("id=\"maint-end\"").unwrap()
        );
        let end_field = &s[s.find("id=\"maint-end\"").unwrap()..];
        let end_field = &end_field[..end_field.find('>').unwrap()];
        assert!(
            end_field.contains("autofocus") && end_field.contains(r#"aria-invalid="true""#),
            "{end_field}"
        );
        assert_eq!(s.matches("autofocus").count(), 1, "one field has the focus");
    }
}

/// Issue 46: the operator's open join codes name whose server each registers (a code without
/// an owner registers the operator's own, in no owner's cabinet); an owner's list has no such
/// column, all its codes being theirs.
#[test]
fn the_operators_open_codes_name_their_owner() {
    let code = |hash: &str, owner: Option<&str>| OpenCode {
        hash: hash.into(),
        created_at: 1,
        expires_at: 2,
        owner: owner.map(String::from),
    };
    let open = [code("a1", Some("ann@example.org")), code("b2", None)];
    for (lang, own) in [(Lang::En, "the operator's own"), (Lang::Ru, "сервер оператора")] {
        let operator = Ctx {
            lang,
            path: "/".into(),
            csrf: None,
            account: None,
            currency: Currency::parse("RUB").unwrap(),
        };
        let page = add(&operator, &Dist::Off, &open, 1).into_string();
        assert!(page.contains("ann@example.org"), "{page}");
        assert!(page.contains(&maud::html! { (own) }.into_string()), "{page}");
        let owner = Ctx { account: Some("ann@example.org".into()), ..operator };
        let page = add(&owner, &Dist::Off, &open[..1], 1).into_string();
        assert!(!page.contains("td class=\"owner\"") && !page.contains(t(Msg::ColOwner, lang)), "{page}");
    }
}

/// Issue 47: the server's page shows the agent's version, an upgrade pending, the last
/// upgrade's result, why the rollout of that version halted, and the owner's switch as a CSRF
/// form, in both languages; what the agent sent is escaped.
#[test]
fn the_server_page_shows_the_agents_upgrades_in_both_languages() {
    use gpum_protocol::{
        HaltReason, NodeUpgrades, RolloutState, RolloutSummary, UpgradeOutcome, UpgradeReport,
    };
    let evil = "<b>0.2.0</b>";
    let mut n = node("node-1");
    n.agent_version = "0.1.0".into();
    n.upgrades = NodeUpgrades {
        auto_update: true,
        agent_auto_update: Some(false),
        pending: None,
        last: Some(UpgradeReport {
            from: "0.1.0".into(),
            to: "0.2.0".into(),
            outcome: UpgradeOutcome::RolledBack,
            detail: evil.into(),
            at: 5,
        }),
    };
    let rollout = RolloutSummary {
        version: "0.2.0".into(),
        state: RolloutState::Halted,
        percent: 100,
        max_failure_percent: 20,
        halt_reason: Some(HaltReason::Failures),
        reported: 4,
        failed: 3,
        started_at: 1,
        updated_at: 2,
        offer_regardless: false,
        step: None,
        next_step_at: None,
    };
    let h = History { rollout: Some(rollout.clone()), ..Default::default() };
    for (lang, want) in [
        (Lang::En, ["the previous one was put back", "3 of 4 servers failed", "Turn automatic upgrades off"]),
        (Lang::Ru, ["возвращена прежняя", "3 из 4 серверов", "Выключить автоматические обновления"]),
    ] {
        let ctx = Ctx { csrf: Some("k".into()), ..plain_ctx(lang) };
        let html = server(&ctx, &n, &h, 6, None, true).into_string();
        for w in want {
            assert!(html.contains(w), "{lang:?}: {w}: {html}");
        }
        assert!(html.contains(r#"action="/dashboard/servers/node-1/auto-update""#));
        assert!(html.contains(r#"name="auto_update" value="false""#));
        assert!(html.contains(r#"id="agent-auto-update-off""#));
        assert!(html.contains(r#"data-outcome="rolled_back""#));
        assert!(!html.contains(evil) && html.contains("&lt;b&gt;0.2.0&lt;/b&gt;"), "escaped");
    }
    // Pending, switched off, and no halt of another version shown.
    n.upgrades =
        NodeUpgrades { auto_update: false, pending: Some("0.3.0".into()), ..NodeUpgrades::default() };
    let other = History {
        rollout: Some(RolloutSummary { version: "0.9.0".into(), ..rollout }),
        ..Default::default()
    };
    let html = server(&plain_ctx(Lang::En), &n, &other, 6, None, true).into_string();
    assert!(html.contains("Upgrade to 0.3.0 pending") && html.contains("Not upgraded yet"), "{html}");
    assert!(html.contains(r#"name="auto_update" value="true""#) && !html.contains(r#"id="rollout-halted""#));
}
