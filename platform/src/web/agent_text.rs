//! Issue 46: text the agent writes, in the owner's language.
//!
//! The protocol carries a command's result and a quarantine's reason as the agent's own text,
//! in English (`CommandResult::message`, `Quarantine::reason`): agents already installed send
//! nothing else. So the platform knows the agent's sentences ([`agent_text`]) and renders each in
//! the page's language from the values it holds (a rental's id, a GPU's UUID, a process count);
//! a sentence it does not know (a newer agent's, a Docker error) is shown as it came.

use gpum_common::Lang;

use super::i18n::{Msg, fill, t};

/// `raw`, the agent's text, in `lang` where the platform knows the sentence; else as it came.
pub fn agent_text(raw: &str, lang: Lang) -> String {
    known(raw, lang).unwrap_or_else(|| raw.to_owned())
}

fn known(raw: &str, lang: Lang) -> Option<String> {
    let tr = |m| t(m, lang);
    // Command results (agent/src/core.rs).
    if raw.starts_with("no probe image is set") {
        return Some(tr(Msg::AgNoProbeImage).to_owned());
    }
    match raw {
        "a probe is due already; it runs when the rate limit allows" => {
            return Some(tr(Msg::AgProbeDue).to_owned());
        }
        "restarting" => return Some(tr(Msg::AgRestarting).to_owned()),
        "probe started" => return Some(tr(Msg::AgProbeStarted).to_owned()),
        _ => {}
    }
    if let Some(kind) = raw.strip_prefix("unknown command ").and_then(|r| r.strip_suffix(": refused")) {
        return Some(fill(tr(Msg::AgUnknownCommand), &[("kind", kind.trim_matches('"'))]));
    }
    // Quarantine reasons and a rental's refusals (agent/src/docker/gpucheck.rs).
    if let Some(rest) = raw.strip_prefix("refused: this node is quarantined: ") {
        return Some(fill(tr(Msg::AgRefusedQuarantined), &[("why", &agent_text(rest, lang))]));
    }
    if let Some(rest) = raw.strip_prefix("refused: ") {
        return known(rest, lang).map(|w| fill(tr(Msg::AgRefused), &[("why", &w)]));
    }
    if raw.starts_with("the agent's GPU ledger (") && raw.ends_with(") could not be read") {
        return Some(tr(Msg::AgLedgerUnreadable).to_owned());
    }
    if let Some((rental, why)) =
        raw.strip_prefix("GPU check after rental ").and_then(|r| r.split_once(" failed: "))
    {
        return Some(fill(tr(Msg::AgAfterRental), &[("rental", rental), ("why", &gpus_why(why, lang))]));
    }
    if let Some((rental, why)) =
        raw.strip_prefix("self-test before rental ").and_then(|r| r.split_once(" failed: "))
    {
        if let Some((gpus, what)) = why
            .strip_prefix("the GPU probe on ")
            .and_then(|w| w.strip_suffix(')'))
            .and_then(|w| w.split_once(" failed ("))
        {
            let what = gpum_protocol::ProbeFailure::parse(what)
                .map_or_else(|| what.to_owned(), |f| super::i18n::probe_failure(f, lang).to_owned());
            return Some(fill(
                tr(Msg::AgSelfTestProbe),
                &[("rental", rental), ("gpus", gpus), ("what", &what)],
            ));
        }
        return Some(fill(tr(Msg::AgSelfTest), &[("rental", rental), ("why", &gpus_why(why, lang))]));
    }
    None
}

/// The NVML check's verdict on each GPU (`gpucheck::check_verdict`), `; `-separated.
fn gpus_why(why: &str, lang: Lang) -> String {
    why.split("; ").map(|one| gpu_why(one, lang)).collect::<Vec<_>>().join("; ")
}

fn gpu_why(one: &str, lang: Lang) -> String {
    // "GPU-…: 2 processes left (pid 1, 2)"
    if let Some((uuid, rest)) = one.split_once(": ")
        && let Some((n, pids)) =
            rest.split_once(" process left (pid ").or_else(|| rest.split_once(" processes left (pid "))
        && let Some(pids) = pids.strip_suffix(')')
    {
        return fill(t(Msg::AgGpuBusy, lang), &[("gpu", uuid), ("n", n), ("pids", pids)]);
    }
    // "GPU-… does not answer (why)"
    if let Some((uuid, why)) = one.split_once(" does not answer (")
        && let Some(why) = why.strip_suffix(')')
    {
        return fill(t(Msg::AgGpuNoAnswer, lang), &[("gpu", uuid), ("why", why)]);
    }
    if let Some(e) = one.strip_prefix("the GPU check did not finish (").and_then(|e| e.strip_suffix(')')) {
        return fill(t(Msg::AgCheckUnfinished, lang), &[("why", e)]);
    }
    one.to_owned()
}

/// What is wrong with one GPU of a quarantine, as the agent's reason says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuTrouble {
    /// Processes were left on it.
    Busy,
    /// It did not answer NVML.
    NoAnswer,
    /// Something else (the self-test's probe failed on it, the check did not finish).
    Other,
    /// It is not one of this server's GPUs (its inventory does not list it): no check on
    /// this machine can pass on it; a recheck lifts the quarantine (agent/src/docker/gpucheck.rs
    /// `not_here`).
    NotHere,
}

/// One GPU a quarantine names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedGpu<'a> {
    pub uuid: &'a str,
    /// Its index and model in the server's inventory; `None`: not one of its GPUs.
    pub at: Option<(usize, &'a str)>,
    pub trouble: GpuTrouble,
}

/// Each GPU a quarantine names (by UUID), where the server's inventory lists it and what is
/// wrong with it. Pure.
pub fn quarantine_gpus<'a>(
    q: &'a gpum_protocol::Quarantine,
    inv: &'a gpum_protocol::Inventory,
) -> Vec<QuarantinedGpu<'a>> {
    q.gpu_uuids
        .iter()
        .map(|uuid| {
            let i = inv.private.gpu_uuids.iter().position(|u| u == uuid);
            let at = i.map(|i| (i, inv.public.gpus.get(i).map_or("", |g| g.model.as_str())));
            let trouble = if at.is_none() {
                GpuTrouble::NotHere
            } else if q.reason.contains(&format!("{uuid}: ")) && q.reason.contains(" left (pid ") {
                GpuTrouble::Busy
            } else if q.reason.contains(&format!("{uuid} does not answer")) {
                GpuTrouble::NoAnswer
            } else {
                GpuTrouble::Other
            };
            QuarantinedGpu { uuid, at, trouble }
        })
        .collect()
}

/// The quarantine's advice, one line per GPU, naming it and saying what can work.
pub fn quarantine_advice(
    q: &gpum_protocol::Quarantine,
    inv: &gpum_protocol::Inventory,
    lang: Lang,
) -> Vec<String> {
    quarantine_gpus(q, inv)
        .into_iter()
        .map(|QuarantinedGpu { uuid, at, trouble }| {
            let gpu = match at {
                Some((i, model)) => fill(
                    t(Msg::QuarGpuNamed, lang),
                    &[("i", &i.to_string()), ("model", model), ("uuid", uuid)],
                ),
                None => uuid.to_owned(),
            };
            let m = match trouble {
                GpuTrouble::Busy => Msg::QuarBusy,
                GpuTrouble::NoAnswer => Msg::QuarNoAnswer,
                GpuTrouble::Other => Msg::QuarOther,
                GpuTrouble::NotHere => Msg::QuarNotHere,
            };
            fill(t(m, lang), &[("gpu", &gpu)])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarantine_names_each_gpu_and_what_can_work() {
        let mut inv = gpum_protocol::Inventory::default();
        inv.private.gpu_uuids = vec!["GPU-aa".into(), "GPU-bb".into()];
        inv.public.gpus = vec![
            gpum_protocol::GpuPublic { model: "NVIDIA H100".into(), vram_mib: 1 },
            gpum_protocol::GpuPublic { model: "NVIDIA A100".into(), vram_mib: 1 },
        ];
        let q = gpum_protocol::Quarantine {
            reason: "GPU check after rental r failed: GPU-aa: 2 processes left (pid 1, 2); GPU-bb does not answer (Unknown Error); GPU-zz does not answer (Not found)".into(),
            since: 1,
            gpu_uuids: vec!["GPU-aa".into(), "GPU-bb".into(), "GPU-zz".into()],
        };
        let got: Vec<_> = quarantine_gpus(&q, &inv).into_iter().map(|g| (g.uuid, g.at, g.trouble)).collect();
        assert_eq!(
            got,
            vec![
                ("GPU-aa", Some((0, "NVIDIA H100")), GpuTrouble::Busy),
                ("GPU-bb", Some((1, "NVIDIA A100")), GpuTrouble::NoAnswer),
                ("GPU-zz", None, GpuTrouble::NotHere),
            ]
        );
        for lang in [Lang::Ru, Lang::En] {
            let a = quarantine_advice(&q, &inv, lang);
            assert_eq!(a.len(), 3);
            assert!(
                a[0].contains("0") && a[0].contains("NVIDIA H100") && a[0].contains("nvidia-smi"),
                "{a:?}"
            );
            assert!(a[1].contains("NVIDIA A100") && a[1].contains("GPU-bb"), "{a:?}");
            assert!(a[2].contains("GPU-zz"), "{a:?}");
            assert_ne!(a[0], a[1]);
            assert_ne!(a[1], a[2]);
        }
        assert!(quarantine_advice(&q, &inv, Lang::Ru)[2].contains("не из видеокарт этого сервера"));
        assert!(quarantine_advice(&q, &inv, Lang::En)[2].contains("not one of this server's GPUs"));
    }

    /// Every sentence the agent writes today, as agent/src/core.rs and gpucheck.rs write them,
    /// in Russian with its values kept; an unknown one as it came.
    #[test]
    fn the_agents_sentences_in_russian_with_their_values() {
        let ru = |s: &str| agent_text(s, Lang::Ru);
        let en = |s: &str| agent_text(s, Lang::En);
        let cases = [
            ("no probe image is set; the check waits for one", "образ для проверки не выбран"),
            ("no probe image is set", "образ для проверки не выбран"),
            ("a probe is due already; it runs when the rate limit allows", "проверка уже назначена"),
            ("restarting", "перезапускается"),
            ("probe started", "проверка запущена"),
            ("unknown command \"reboot\": refused", "«reboot»"),
            ("the agent's GPU ledger (gpus.json) could not be read", "gpus.json"),
            (
                "GPU check after rental rent-1 failed: GPU-aa: 2 processes left (pid 10, 11); GPU-bb does not answer (Unknown Error)",
                "после аренды rent-1 не пройдена: GPU-aa: осталось процессов: 2 (номера 10, 11); GPU-bb не отвечает (Unknown Error)",
            ),
            ("self-test before rental r2 failed: GPU-cc: 1 process left (pid 7)", "перед арендой r2"),
            (
                "refused: self-test before rental r3 failed: the GPU probe on GPU-1, GPU-2 failed (timeout)",
                "на GPU-1, GPU-2",
            ),
            (
                "refused: this node is quarantined: the agent's GPU ledger (gpus.json) could not be read",
                "карантин",
            ),
        ];
        for (raw, want) in cases {
            let r = ru(raw);
            assert!(r.contains(want), "{raw} → {r}");
            assert!(!r.contains("failed") && !r.contains("refused") && !r.contains("probe"), "{raw} → {r}");
            assert_ne!(en(raw), "", "{raw}");
        }
        // Values stay as they came; the English is the agent's meaning.
        assert!(en("GPU check after rental rent-1 failed: GPU-aa does not answer (x)").contains("GPU-aa"));
        // Unknown: as it came, in both languages.
        for raw in ["Cannot connect to the Docker daemon", "refused: something new", ""] {
            assert_eq!(ru(raw), raw);
            assert_eq!(en(raw), raw);
        }
    }
}
