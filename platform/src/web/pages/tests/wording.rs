//! The pages' wording: both languages, and Russian that reads without English words.

use super::*;

/// The figures per GPU and host, the day's chart (a line per series, broken at a gap) and the
/// event log, in both languages, with a node's text escaped and no inline style.
#[test]
fn figures_chart_and_event_log_in_both_languages() {
    use NodeEventKind::*;
    use gpum_protocol::{GpuMetrics, GpuPublic};
    let m = |util| Metrics {
        cpu_load_pct: 12.5,
        ram_used_mib: 65_536,
        ram_total_mib: 262_144,
        disk_free_gib: 870,
        gpus: vec![
            GpuMetrics {
                index: 0,
                util_pct: util,
                mem_used_mib: 40_960,
                mem_total_mib: 81_920,
                temp_c: 61,
                power_w: 250.4,
            },
            GpuMetrics {
                index: 1,
                util_pct: 0,
                mem_used_mib: 512,
                mem_total_mib: 81_920,
                temp_c: 35,
                power_w: 60.5,
            },
        ],
    };
    let mut n = node("node-1");
    n.inventory.public.gpus = vec![GpuPublic { model: "NVIDIA A100".into(), vram_mib: 81_920 }; 2];
    n.last_metrics = Some(m(87));
    let now = 100_000;
    // Six samples 5 minutes apart, an hour's gap, then three more.
    let mut samples: Vec<MetricsSample> =
        (0..6).map(|i| MetricsSample { at: now - 7200 + i * 300, metrics: m(10 * i as u32) }).collect();
    samples.extend((0..3).map(|i| MetricsSample { at: now - 600 + i * 300, metrics: m(50) }));
    let ev = |at, kind, subject: &str, detail: &str| NodeEvent {
        at,
        kind,
        subject: subject.into(),
        detail: detail.into(),
    };
    let events = vec![
        ev(now - 10, CommandFailed, "restart", "<b>no</b>"),
        ev(now - 20, CommandSent, "restart", ""),
        ev(now - 30, CheckFailed, "timeout", ""),
        ev(now - 40, HardwareChanged, "gpus,software", ""),
        ev(now - 50, ContainerRemoved, "<i>job</i>", gpum_protocol::REMOVAL_REASON_UNKNOWN),
        ev(now - 3600, Online, "", ""),
        ev(now - 7200, Offline, "", ""),
        ev(1, Registered, "", ""),
    ];
    let h = History { samples, events, ..Default::default() };
    let cases = [
        (
            Lang::En,
            [
                "87%",
                "40 GiB of 80 GiB",
                "512 MiB of 80 GiB",
                "61 °C",
                "250 W",
                "60.5 W",
                "12.5%",
                "64 GiB of 256 GiB",
                "870 GiB",
                "0 · NVIDIA A100",
            ],
            [
                "command failed: restart the agent: <b>no</b>",
                "command sent: restart the agent",
                "the GPU check failed: the check did not finish in time",
                "the hardware changed: GPUs, software",
                "the agent removed container <i>job</i>: unknown to the platform",
                "came online",
                "went offline: no heartbeat after this",
                "the server registered",
            ],
        ),
        (
            Lang::Ru,
            [
                "87 %",
                "40 ГиБ из 80 ГиБ",
                "512 МиБ из 80 ГиБ",
                "61 °C",
                "250 Вт",
                "60,5 Вт",
                "12,5 %",
                "64 ГиБ из 256 ГиБ",
                "870 ГиБ",
                "0 · NVIDIA A100",
            ],
            [
                "команда не выполнена: перезапуск агента: <b>no</b>",
                "отправлена команда: перезапуск агента",
                "проверка видеокарты не пройдена: проверка не уложилась в отведённое время",
                "изменилось оборудование: видеокарты, программы",
                "агент удалил контейнер <i>job</i>: платформа его не знает",
                "вышел на связь",
                "офлайн: после этого агент не выходил на связь",
                "сервер зарегистрирован",
            ],
        ),
    ];
    for (lang, figures, events) in cases {
        let ctx = plain_ctx(lang);
        let page = server(&ctx, &n, &h, now, None, true).into_string();
        // Text as a browser shows it: tags dropped, entities read.
        let text = |from: &str, to: &str| {
            let part = &page[page.find(from).unwrap()..page.find(to).unwrap()];
            let mut out = String::new();
            let mut in_tag = false;
            for c in part.chars() {
                match c {
                    '<' => in_tag = true,
                    '>' => in_tag = false,
                    c if !in_tag => out.push(c),
                    _ => {}
                }
            }
            out.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&quot;", "\"")
        };
        let shown = text("id=\"figures\"", "id=\"history\"");
        for f in figures {
            assert!(shown.contains(f), "{lang:?} {f:?} in {shown}");
        }
        let log = text("id=\"events\"", "</main>");
        let mut at = 0;
        for e in events {
            let i = log[at..].find(e).unwrap_or_else(|| panic!("{lang:?}: {e:?} in order in {log}")) + at;
            at = i + e.len();
        }
        assert!(!page.contains("<b>") && !page.contains("<i>"), "escaped");
        // The inventory's memory in the language's units too, here and in the list.
        let gpus = match lang {
            Lang::Ru => "2 × NVIDIA A100 (80 ГиБ)",
            Lang::En => "2 × NVIDIA A100 (80 GiB)",
        };
        assert!(page.contains(gpus), "{gpus}");
        assert!(
            servers(&ctx, std::slice::from_ref(&n), PageAt::default(), now, None, None)
                .into_string()
                .contains(gpus)
        );
        if lang == Lang::Ru {
            assert!(!page.contains("GiB") && !page.contains("MiB"), "{page}");
        }
        assert!(!page.contains("style="), "no inline style");
        // Four series, each in two lines (the gap breaks them), nine samples.
        assert_eq!(page.matches("<polyline").count(), 8, "{page}");
        assert!(page.contains("data-samples=\"9\""));
        assert_eq!(page.matches("</polyline>").count(), 8, "closed, so nothing nests in them");
    }
    // With nothing yet: said so, no chart.
    let ctx = plain_ctx(Lang::Ru);
    let page = server(&ctx, &node("node-2"), &History::default(), now, None, true).into_string();
    for id in ["no-figures", "no-history", "no-events"] {
        assert!(page.contains(&format!("id=\"{id}\"")), "{id}");
    }
    assert!(!page.contains("<svg"));
}

/// Proper names a Russian text may carry in Latin letters: product and program names,
/// standard abbreviations, the name of the other language on its switch, and keys.
const LATIN_ALLOWED: &[&str] = &[
    "gpum", "GPU", "NVIDIA", "CUDA", "Docker", "UUID", "UTC", "ID", "TOTP", "URL", "API", "XFS", "English",
    "Enter", "Ctrl", "D", "root", "CSV",
];

/// What a Russian text may quote verbatim because the owner types or reads it as it is: the
/// commands, flags, files and paths it names. Cut out before the Latin words are counted.
const QUOTED: &[&str] = &[
    "sudo nvidia-ctk runtime configure --runtime=docker",
    "sudo nvidia-ctk runtime \
         configure --runtime=docker",
    "sudo systemctl restart docker",
    "sudo /opt/gpum-agent/gpum-agent uninstall --yes",
    "sudo env TMPDIR=/var/tmp bash",
    "sudo bash",
    "sudo",
    "--admin-token-file",
    "--dist",
    "--dry-run",
    // Issue 46: an encoding's and a character's names, and the agent's own file.
    "UTF-8",
    "U+202E",
    "gpus.json",
    "docs/operator-guide.md",
    "libnvidia-ml",
    "nvidia-smi",
    "/tmp",
    "(noexec)",
    "@sha256:",
    "NVIDIA Container Toolkit",
    "°C",
];

/// The Latin words of `text` (maximal runs of ASCII letters) that are not allowed in
/// Russian: none may remain once the quoted commands are cut out.
pub(crate) fn english_in(text: &str) -> Vec<String> {
    // Placeholders (`{n}`) are filled by the caller.
    let mut t = String::new();
    let mut rest = text;
    while let Some(a) = rest.find('{') {
        t.push_str(&rest[..a]);
        rest = rest[a..].find('}').map_or("", |b| &rest[a + b + 1..]);
    }
    t.push_str(rest);
    for q in QUOTED {
        t = t.replace(q, " ");
    }
    t.split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty() && !LATIN_ALLOWED.contains(w))
        .map(str::to_owned)
        .collect()
}

/// A page's text as the owner reads it: tags and code blocks (`pre`, `code`: commands,
/// copied as they are) cut out, the script and stylesheet links with them.
pub(crate) fn prose(html: &str) -> String {
    let mut s = html.to_owned();
    for tag in ["pre", "code", "title"] {
        while let Some(a) = s.find(&format!("<{tag}")) {
            let end = format!("</{tag}>");
            let Some(b) = s[a..].find(&end) else { break };
            s.replace_range(a..a + b + end.len(), " ");
        }
    }
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                out.push(' ');
            }
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&amp;", "&").replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">")
}

/// Issue 32: Russian reads naturally and never mixes English in. Every Russian text of the
/// message table, and every page rendered in Russian (with a node whose own values are
/// Russian, so that only the page's words are read), has no Latin word but the proper
/// names of [`LATIN_ALLOWED`] and the commands of [`QUOTED`].
///
/// The wording review fixed these phrases:
/// - «80 GiB», «512 MiB», «870 GiB» (units) → «80 ГиБ», «512 МиБ», «870 ГиБ», as the owner's guide;
/// - command names «recheck», «restart» shown raw in the command history → «повторная
///   проверка», «перезапуск агента»;
/// - «Система» (OS) → «Операционная система»;
/// - «ждёт агента» → «ждёт, когда агент выйдет на связь»;
/// - «Машина зарегистрирована, ждём первой связи агента» → «…; ждём, когда агент впервые
///   выйдет на связь»;
/// - «Пустое поле — имя компьютера» → «Если оставить поле пустым, названием будет имя
///   компьютера»;
/// - «в Docker не настроена среда nvidia» → «в Docker не настроена среда выполнения NVIDIA»;
/// - «Docker отказал контейнеру в доступе к GPU» → «… к видеокарте»;
/// - «nvidia-smi в контейнере завершился с ошибкой» → «программа nvidia-smi в контейнере
///   завершилась с ошибкой»;
/// - «образ для проверки не закреплён по дайджесту» → «образ для проверки указан без
///   контрольной суммы (@sha256:…)»;
/// - «реестр образа для проверки не разрешён» → «хранилище образа для проверки не разрешено»;
/// - «Нужны права root» → «Нужны права суперпользователя (root)».
#[test]
fn russian_reads_without_english_words() {
    let mut found = Vec::new();
    for m in Msg::ALL {
        if *m == Msg::LangSwitch {
            continue; // "English": the other language, named in its own words
        }
        let ru = t(*m, Lang::Ru);
        let bad = english_in(ru);
        if !bad.is_empty() {
            found.push(format!("{m:?}: {bad:?} in «{ru}»"));
        }
    }

    let ctx = Ctx {
        lang: Lang::Ru,
        path: "/dashboard".into(),
        csrf: Some("к".into()),
        account: None,
        currency: gpum_platform_core::currency::DEFAULT,
    };
    let mut n = node("узел-1");
    n.name = "стойка".into();
    n.agent_version = "1".into();
    n.inventory.public.gpus =
        vec![gpum_protocol::GpuPublic { model: "видеокарта".into(), vram_mib: 81_920 }];
    n.inventory.public.cpu_model = "процессор".into();
    n.inventory.public.ram_mib = 512;
    n.inventory.public.disk_gib = 870;
    n.inventory.private.hostname = "машина".into();
    n.inventory.private.os = "система".into();
    n.inventory.private.kernel = "5.15".into();
    n.price_per_gpu_hour = Some(150);
    let cmd = |kind: &str, delivered: Option<u64>, ok: Option<bool>| CommandStatus {
        id: "к".into(),
        kind: kind.into(),
        queued_at: 1,
        delivered_at: delivered,
        result: ok.map(|ok| gpum_protocol::CommandResult { id: "к".into(), ok, message: String::new() }),
        completed_at: ok.map(|_| 3),
    };
    n.commands = vec![
        cmd("recheck", None, None),
        cmd("restart", Some(2), None),
        cmd("restart", Some(2), Some(true)),
        cmd("recheck", Some(2), Some(true)),
        cmd("recheck", Some(2), Some(false)),
    ];
    let open = [crate::store::OpenCode { hash: "х".into(), created_at: 1, expires_at: 2, owner: None }];
    let mut pages = vec![
        operator_login(&ctx, "к", Some(LoginError::TooMany(3))),
        operator_login(&ctx, "к", Some(LoginError::WrongToken)),
        disabled(&ctx),
        stale(&ctx),
        not_found(&ctx),
        servers(&ctx, &[], PageAt::default(), 6, None, Some(1_800_000_000)),
        servers(&ctx, std::slice::from_ref(&n), PageAt::default(), 6, Some("узел-1"), None),
        server(
            &ctx,
            &n,
            &History::default(),
            6,
            Some(&Refused {
                error: SettingsError::Price,
                name: "стойка".into(),
                price: "1,234".into(),
                min_rental: "60".into(),
            }),
            true,
        ),
        add(&ctx, &Dist::Off, &open, 6),
        add(&ctx, &Dist::Lacks(vec!["файл"]), &[], 6),
        command_refused(&ctx, "узел-1"),
        confirm_delete(&ctx, "узел-1"),
        confirm_rotate(&ctx, "узел-1"),
        rotated(&ctx, "узел-1", "токен", "адрес"),
    ];
    let served = Dist::Served;
    for (open, shown) in [
        (true, Shown::Code { code: "код", expires_at: 9, public_url: "адрес", dist: &served }),
        (true, Shown::Code { code: "код", expires_at: 9, public_url: "адрес", dist: &Dist::Off }),
        (true, Shown::Once),
        (false, Shown::Closed),
    ] {
        pages.push(join_page(&ctx, "х", join_status(&ctx, JoinState::Waiting), open, shown, 6));
    }
    n.online = false;
    pages.push(server(&ctx, &n, &History::default(), 6, None, true));
    for st in [JoinState::Expired, JoinState::Registered("узел-1"), JoinState::Node(&n), JoinState::Deleted]
    {
        pages.push(join_page(&ctx, "х", join_status(&ctx, st), false, Shown::Closed, 6));
    }
    for p in pages {
        let html = p.into_string();
        let text = prose(&html);
        let bad = english_in(&text);
        if !bad.is_empty() {
            found.push(format!("{bad:?} in the page:\n{text}"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    // The check reads the pages' words: the same page in English has them.
    let en = Ctx {
        lang: Lang::En,
        path: "/dashboard".into(),
        csrf: Some("к".into()),
        account: None,
        currency: gpum_platform_core::currency::DEFAULT,
    };
    let words = english_in(&prose(&server(&en, &n, &History::default(), 6, None, true).into_string()));
    for w in ["Hardware", "check", "again", "agent", "restart", "GiB", "MiB"] {
        assert!(words.iter().any(|x| x == w), "{w} in {words:?}");
    }
}
