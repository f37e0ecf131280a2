//! `gpum-agent doctor`: a report an owner can read, or paste into a support request.
//!
//! It opens with the installer's machine checks (`gpum_preflight`, read-only, offline), then
//! covers the host (OS, kernel, CPU, RAM, disk), the runtime (Docker and its NVIDIA
//! runtime), the GPUs (NVML), and the platform (config and one handshake). Secrets are
//! redacted: the token is shown only as present or absent. The full report's exit code is not
//! a health verdict (0 whenever the report was produced); `--connectivity` skips the GPU part,
//! and exits with `smoke`'s codes.

use std::sync::Arc;

use gpum_common::Lang;
use gpum_common::text::escape_controls;
use gpum_common::texts::fill;
use gpum_host::Host;
use serde::Serialize;

use crate::config::{Config, Paths};
use crate::docker::Docker;
use crate::inventory::Gatherer;
use crate::smoke;
use crate::text::Msg;

#[derive(Debug, Serialize)]
pub struct Report {
    /// The installer's machine checks (`gpum_preflight`), run read-only and offline: the
    /// platform part below does its own handshake.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<gpum_preflight::Finding>,
    pub host: Option<HostPart>,
    pub runtime: Option<RuntimePart>,
    pub gpu: Option<GpuPart>,
    pub platform: PlatformPart,
}

#[derive(Debug, Serialize)]
pub struct HostPart {
    pub os: String,
    pub kernel: String,
    pub arch: String,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub ram_mib: u64,
    pub disk_free_gib: u64,
}

#[derive(Debug, Serialize)]
pub struct RuntimePart {
    pub docker_socket: String,
    pub docker_version: Option<String>,
    pub docker_error: Option<String>,
    pub nvidia_runtime: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct GpuPart {
    pub nvml: gpum_protocol::NvmlState,
    pub nvml_detail: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<gpum_protocol::GpuPublic>,
}

#[derive(Debug, Serialize)]
pub struct PlatformPart {
    pub config: String,
    pub config_error: Option<String>,
    pub server: Option<String>,
    pub node_id: Option<String>,
    /// `"<redacted>"` when a token is configured; never the token.
    pub token: Option<&'static str>,
    pub handshake_exit: i32,
    pub handshake: String,
    pub clock_skew_secs: Option<i64>,
    /// The last in-place upgrade (issue 47), from `upgrade.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<gpum_common::agent_state::UpgradeRecord>,
    /// Its line in the owner's language (`status`'s).
    #[serde(skip)]
    pub upgrade_text: Option<String>,
}

/// Builds the report. With `connectivity`, only the platform part.
pub async fn report(host: Arc<dyn Host>, paths: &Paths, connectivity: bool, lang: Lang) -> Report {
    let cfg = Config::load(host.as_ref(), &paths.config);
    let hs = smoke::handshake(host.clone(), paths).await;
    let upgrade = gpum_common::agent_state::read_upgrade(host.as_ref(), &paths.state_dir).ok().flatten();
    let platform = PlatformPart {
        config: paths.config.display().to_string(),
        config_error: cfg.as_ref().err().map(|e| e.to_string()),
        server: cfg.as_ref().ok().map(|c| c.server.clone()),
        node_id: cfg.as_ref().ok().map(|c| c.node_id.clone()),
        token: cfg.as_ref().ok().map(|_| "<redacted>"),
        handshake_exit: hs.code,
        handshake: hs.detail,
        clock_skew_secs: hs.clock_skew_secs,
        upgrade: upgrade.clone(),
        upgrade_text: upgrade
            .as_ref()
            .map(|u| crate::status::upgrade_value(u, crate::state::unix(host.now()), lang)),
    };
    if connectivity {
        return Report { checks: Vec::new(), host: None, runtime: None, gpu: None, platform };
    }
    let socket =
        crate::run::docker_socket(host.as_ref(), cfg.as_ref().ok().and_then(|c| c.docker_socket.as_deref()));
    let (docker_version, docker_error, nvidia_runtime) = match Docker::connect(socket.as_deref()) {
        Ok(d) => match d.version().await {
            Ok(v) => (Some(v), None, d.has_nvidia_runtime().await.ok()),
            Err(e) => (None, Some(e.to_string()), None),
        },
        Err(e) => (None, Some(e.to_string()), None),
    };
    let mut g = Gatherer::new(host.clone());
    let inv = g.inventory(docker_version.clone());
    let m = g.metrics();
    let opts = gpum_preflight::GatherOptions { server: None, offline: true, extra_roots_pem: Vec::new() };
    let facts = gpum_preflight::gather(host.as_ref(), &opts, &gpum_preflight::gpu::NvmlProbe);
    Report {
        checks: gpum_preflight::checks::run_all(&facts, lang),
        host: Some(HostPart {
            os: inv.private.os.clone(),
            kernel: inv.private.kernel.clone(),
            arch: host.arch(),
            cpu_model: inv.public.cpu_model.clone(),
            cpu_cores: inv.public.cpu_cores,
            ram_mib: inv.public.ram_mib,
            disk_free_gib: m.disk_free_gib,
        }),
        runtime: Some(RuntimePart {
            docker_socket: socket
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| crate::docker::DEFAULT_SOCKET.to_string()),
            docker_version,
            docker_error,
            nvidia_runtime,
        }),
        gpu: Some(GpuPart {
            nvml: g.nvml_state(),
            nvml_detail: g.nvml_detail().map(String::from),
            driver_version: inv.private.driver_version.clone(),
            cuda_version: inv.private.cuda_version.clone(),
            gpus: inv.public.gpus.clone(),
        }),
        platform,
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map(|x| x.to_string()).unwrap_or_else(|| "-".into())
}

/// The text form, its labels in `lang`.
pub fn render_text(r: &Report, lang: Lang) -> String {
    let t = |m: Msg| m.text(lang);
    let mut out = String::new();
    for f in &r.checks {
        let status = serde_json::to_value(f.status)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        out.push_str(&format!("[{status:>4}] {}: {}\n", f.id, escape_controls(&f.message)));
        if let Some(fix) = &f.fix {
            out.push_str(&format!("       -> {}\n", escape_controls(fix)));
        }
    }
    // Values come from the machine, the engine, NVML and the platform: control characters are
    // printed escaped.
    let mut line = |k: Msg, v: String| out.push_str(&format!("  {:<18}{}\n", t(k), escape_controls(&v)));
    if let Some(h) = &r.host {
        line(Msg::DoctorHost, String::new());
        line(Msg::DoctorOs, h.os.clone());
        line(Msg::DoctorKernel, h.kernel.clone());
        line(Msg::DoctorArch, h.arch.clone());
        let threads = h.cpu_cores.to_string();
        line(Msg::DoctorCpu, fill(t(Msg::DoctorCpuValue), &[("model", &h.cpu_model), ("threads", &threads)]));
        line(Msg::DoctorRam, fill(t(Msg::DoctorRamValue), &[("mib", &h.ram_mib.to_string())]));
        line(
            Msg::DoctorDiskFree,
            fill(t(Msg::DoctorDiskFreeValue), &[("gib", &h.disk_free_gib.to_string())]),
        );
    }
    if let Some(rt) = &r.runtime {
        line(Msg::DoctorRuntime, String::new());
        line(Msg::DoctorDockerSocket, rt.docker_socket.clone());
        line(
            Msg::DoctorDocker,
            rt.docker_version.clone().unwrap_or_else(|| {
                fill(t(Msg::DoctorDockerUnavailable), &[("error", &opt(&rt.docker_error))])
            }),
        );
        line(
            Msg::DoctorNvidiaRuntime,
            rt.nvidia_runtime
                .map(|b| t(if b { Msg::DoctorYes } else { Msg::DoctorNo }).to_string())
                .unwrap_or_else(|| "-".into()),
        );
    }
    if let Some(g) = &r.gpu {
        line(Msg::DoctorGpu, String::new());
        let state = match g.nvml {
            gpum_protocol::NvmlState::Ok => t(Msg::DoctorNvmlOk).to_string(),
            gpum_protocol::NvmlState::LibraryMissing => t(Msg::DoctorNvmlLibraryMissing).to_string(),
            gpum_protocol::NvmlState::DriverLibraryMismatch => t(Msg::DoctorNvmlMismatch).to_string(),
            gpum_protocol::NvmlState::NoDevices => t(Msg::DoctorNvmlNoDevices).to_string(),
            gpum_protocol::NvmlState::Error => {
                fill(t(Msg::DoctorNvmlError), &[("detail", &opt(&g.nvml_detail))])
            }
        };
        line(Msg::DoctorNvml, state);
        line(Msg::DoctorDriver, opt(&g.driver_version));
        line(Msg::DoctorCuda, opt(&g.cuda_version));
        for (i, gpu) in g.gpus.iter().enumerate() {
            let label = fill(t(Msg::DoctorGpuN), &[("i", &i.to_string())]);
            let value =
                fill(t(Msg::DoctorGpuValue), &[("model", &gpu.model), ("mib", &gpu.vram_mib.to_string())]);
            out.push_str(&format!("  {label:<18}{}\n", escape_controls(&value)));
        }
    }
    let mut line = |k: Msg, v: String| out.push_str(&format!("  {:<18}{}\n", t(k), escape_controls(&v)));
    let p = &r.platform;
    line(Msg::DoctorPlatform, String::new());
    line(Msg::DoctorConfig, p.config.clone());
    if let Some(e) = &p.config_error {
        line(Msg::DoctorConfigError, e.clone());
    }
    line(Msg::DoctorServer, opt(&p.server));
    line(Msg::DoctorNode, opt(&p.node_id));
    line(
        Msg::DoctorToken,
        t(if p.token.is_some() { Msg::DoctorTokenRedacted } else { Msg::DoctorTokenAbsent }).to_string(),
    );
    let code = p.handshake_exit.to_string();
    line(
        Msg::DoctorHandshake,
        fill(t(Msg::DoctorHandshakeValue), &[("detail", &p.handshake), ("code", &code)]),
    );
    if let Some(s) = p.clock_skew_secs {
        line(Msg::DoctorClockSkew, fill(t(Msg::DoctorClockSkewValue), &[("skew", &format!("{s:+}"))]));
    }
    if let Some(u) = &p.upgrade_text {
        line(Msg::DoctorUpgrade, u.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_text_is_printed_with_control_characters_escaped() {
        let r = Report {
            checks: vec![gpum_preflight::Finding::warn(
                "docker",
                "engine \x1b[2J".into(),
                Some("fix\rforged".into()),
            )],
            host: None,
            runtime: Some(RuntimePart {
                docker_socket: "/s".into(),
                docker_version: Some("20.10\x1b[1;1H".into()),
                docker_error: None,
                nvidia_runtime: None,
            }),
            gpu: Some(GpuPart {
                nvml: gpum_protocol::NvmlState::Ok,
                nvml_detail: None,
                driver_version: Some("550\u{9b}2J".into()),
                cuda_version: None,
                gpus: vec![gpum_protocol::GpuPublic { model: "T4\n  gpu 1:  forged".into(), vram_mib: 1 }],
            }),
            platform: PlatformPart {
                config: "/c".into(),
                config_error: None,
                server: Some("https://x".into()),
                node_id: Some("n\x07".into()),
                token: None,
                handshake_exit: 1,
                handshake: "platform answered 500: \x1b]0;t\x07".into(),
                clock_skew_secs: None,
                upgrade: None,
                upgrade_text: None,
            },
        };
        for lang in [Lang::En, Lang::Ru] {
            let t = render_text(&r, lang);
            assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
            let gpu_1 = fill(Msg::DoctorGpuN.text(lang), &[("i", "1")]);
            assert!(!t.lines().any(|l| l.trim_start().starts_with(&gpu_1)), "no forged line: {t}");
        }
        let t = render_text(&r, Lang::En);
        assert!(t.contains("T4\\n  gpu 1") && t.contains("20.10\\x1b[1;1H"), "{t}");
    }

    #[test]
    fn the_text_is_in_the_users_language_with_the_values_lined_up() {
        let r = Report {
            checks: Vec::new(),
            host: Some(HostPart {
                os: "Ubuntu 22.04.4 LTS".into(),
                kernel: "6.8.0".into(),
                arch: "x86_64".into(),
                cpu_model: "EPYC".into(),
                cpu_cores: 16,
                ram_mib: 64000,
                disk_free_gib: 900,
            }),
            runtime: Some(RuntimePart {
                docker_socket: "/run/docker.sock".into(),
                docker_version: None,
                docker_error: Some("connection refused".into()),
                nvidia_runtime: Some(true),
            }),
            gpu: Some(GpuPart {
                nvml: gpum_protocol::NvmlState::NoDevices,
                nvml_detail: None,
                driver_version: Some("550.54".into()),
                cuda_version: None,
                gpus: vec![gpum_protocol::GpuPublic { model: "T4".into(), vram_mib: 15360 }],
            }),
            platform: PlatformPart {
                config: "/etc/gpum/agent.toml".into(),
                config_error: Some("missing token".into()),
                server: None,
                node_id: None,
                token: Some("<redacted>"),
                handshake_exit: 2,
                handshake: "no config".into(),
                clock_skew_secs: Some(-3),
                upgrade: None,
                upgrade_text: None,
            },
        };
        let ru = render_text(&r, Lang::Ru);
        for want in [
            "  [машина]",
            "  процессор:        EPYC (потоков: 16)\n",
            "  место на диске:   900 ГиБ свободно (каталог данных Docker)\n",
            "  Docker:           недоступен: connection refused\n",
            "  среда nvidia:     есть\n",
            "  NVML:             видеокарт не найдено\n",
            "  видеокарта 0:     T4 (15360 МиБ)\n",
            "  ошибка настроек:  missing token\n",
            "  токен:            <скрыт>\n",
            "  проверка связи:   no config (код 2)\n",
            "  разница часов:    -3 с\n",
        ] {
            assert!(ru.contains(want), "{want:?} in\n{ru}");
        }
        let en = render_text(&r, Lang::En);
        for want in [
            "  [host]",
            "  cpu:              EPYC (16 threads)\n",
            "  disk free:        900 GiB (Docker data root)\n",
            "  docker:           unavailable: connection refused\n",
            "  nvidia runtime:   yes\n",
            "  gpu 0:            T4 (15360 MiB)\n",
            "  token:            <redacted>\n",
            "  handshake:        no config (exit 2)\n",
            "  clock skew:       -3 s\n",
        ] {
            assert!(en.contains(want), "{want:?} in\n{en}");
        }
        assert_eq!(ru.lines().count(), en.lines().count());
        // Every label fits the column: a value never runs into its label.
        for m in Msg::ALL
            .iter()
            .filter(|m| format!("{m:?}").starts_with("Doctor") && m.text(Lang::Ru).ends_with(':'))
        {
            for lang in [Lang::Ru, Lang::En] {
                assert!(m.text(lang).chars().count() <= 17, "{m:?} is too long in {lang:?}");
            }
        }
    }
}
