//! A server's figures (GPU, memory, disk) and its history chart, as numbers in the page's language.

use super::*;

/// A number with at most one decimal, in the language's way (`1.5`, `1,5`); whole numbers bare.
fn decimal(ctx: &Ctx, v: f64) -> String {
    let s = if v.fract().abs() < 0.05 || v.abs() >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") };
    match ctx.lang {
        Lang::Ru => s.replace('.', ","),
        Lang::En => s,
    }
}

/// An amount of memory in the language's units: MiB below a GiB, else GiB.
pub(super) fn memory(ctx: &Ctx, mib: u64) -> String {
    if mib >= 1024 {
        fill(ctx.t(Msg::Gib), &[("n", &decimal(ctx, mib as f64 / 1024.0))])
    } else {
        fill(ctx.t(Msg::Mib), &[("n", &mib.to_string())])
    }
}

fn used_of(ctx: &Ctx, used: u64, total: u64) -> String {
    fill(ctx.t(Msg::UsedOf), &[("used", &memory(ctx, used)), ("total", &memory(ctx, total))])
}

fn percent(ctx: &Ctx, v: f64) -> String {
    fill(ctx.t(Msg::Percent), &[("n", &decimal(ctx, v))])
}

/// The figures of the last heartbeat: per GPU, and the host's.
pub(super) fn figures(ctx: &Ctx, n: &NodeSummary) -> Markup {
    html! {
        section #figures {
            h2 { (ctx.t(Msg::FiguresTitle)) " " (seen_by(ctx, false)) }
            @match (&n.last_metrics, n.last_heartbeat_at) {
                (Some(m), Some(at)) => {
                    p.help { (fill_html(ctx.t(Msg::FiguresAsOf), &[("at", when(at))])) }
                    @if m.gpus.is_empty() {
                        p #no-gpu-figures { (ctx.t(Msg::NoGpuFigures)) }
                    } @else {
                        div.scroll {
                            table #gpu-figures {
                                thead { tr {
                                    th { (ctx.t(Msg::ColGpu)) }
                                    th { (ctx.t(Msg::ColUtil)) }
                                    th { (ctx.t(Msg::ColGpuMem)) }
                                    th { (ctx.t(Msg::ColTemp)) }
                                    th { (ctx.t(Msg::ColPower)) }
                                } }
                                tbody {
                                    @for g in &m.gpus {
                                        tr.gpu data-index=(g.index) {
                                            td.gpu-name {
                                                (g.index)
                                                @if let Some(model) = n.inventory.public.gpus.get(g.index as usize) {
                                                    " · " (cut(&model.model))
                                                }
                                            }
                                            td.util data-label=(ctx.t(Msg::ColUtil)) {
                                                (percent(ctx, f64::from(g.util_pct)))
                                            }
                                            td.mem data-label=(ctx.t(Msg::ColGpuMem)) {
                                                (used_of(ctx, g.mem_used_mib, g.mem_total_mib))
                                            }
                                            td.temp data-label=(ctx.t(Msg::ColTemp)) {
                                                (fill(ctx.t(Msg::Celsius), &[("n", &g.temp_c.to_string())]))
                                            }
                                            td.power data-label=(ctx.t(Msg::ColPower)) {
                                                (fill(ctx.t(Msg::Watts), &[("n", &decimal(ctx, f64::from(g.power_w)))]))
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    table.facts #host-figures {
                        tr { th { (ctx.t(Msg::HostCpuLoad)) } td.value #cpu-load { (percent(ctx, f64::from(m.cpu_load_pct))) } }
                        tr { th { (ctx.t(Msg::HostRamUsed)) } td.value #ram-used { (used_of(ctx, m.ram_used_mib, m.ram_total_mib)) } }
                        tr {
                            th { (ctx.t(Msg::HostDiskFree)) }
                            td.value #disk-free { (fill(ctx.t(Msg::Gib), &[("n", &m.disk_free_gib.to_string())])) }
                        }
                    }
                },
                _ => p #no-figures { (ctx.t(Msg::NoFigures)) },
            }
        }
    }
}

/// A series of the chart: a share in percent of one sample's figures, `None` where the sample
/// has nothing to give (no GPU, no total).
type Series = (&'static str, Msg, fn(&Metrics) -> Option<f64>);

const SERIES: [Series; 4] = [
    ("s-gpu", Msg::SeriesGpuUtil, |m| {
        (!m.gpus.is_empty())
            .then(|| m.gpus.iter().map(|g| f64::from(g.util_pct)).sum::<f64>() / m.gpus.len() as f64)
    }),
    ("s-vram", Msg::SeriesGpuMem, |m| {
        let total: f64 = m.gpus.iter().map(|g| g.mem_total_mib as f64).sum();
        (total > 0.0).then(|| m.gpus.iter().map(|g| g.mem_used_mib as f64).sum::<f64>() * 100.0 / total)
    }),
    ("s-cpu", Msg::SeriesCpu, |m| Some(f64::from(m.cpu_load_pct))),
    ("s-ram", Msg::SeriesRam, |m| {
        (m.ram_total_mib > 0).then(|| m.ram_used_mib as f64 * 100.0 / m.ram_total_mib as f64)
    }),
];

/// The chart's drawing area, in its own units: the day across, 0 to 100 % up.
const CHART_W: f64 = 1000.0;
const CHART_H: f64 = 100.0;

/// The polylines of one series: a line breaks where samples are more than two intervals apart
/// (the server was offline) or where the series has no value.
fn series_lines(
    samples: &[MetricsSample],
    now: u64,
    value: fn(&Metrics) -> Option<f64>,
) -> Vec<Vec<(f64, f64)>> {
    let start = now.saturating_sub(SAMPLE_WINDOW_SECS);
    let mut lines: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut prev: Option<u64> = None;
    for s in samples {
        let Some(v) = value(&s.metrics).filter(|v| v.is_finite()) else {
            prev = None;
            continue;
        };
        let x = (s.at.saturating_sub(start) as f64 / SAMPLE_WINDOW_SECS as f64 * CHART_W).clamp(0.0, CHART_W);
        let y = CHART_H - v.clamp(0.0, 100.0) * CHART_H / 100.0;
        match (prev, lines.last_mut()) {
            (Some(p), Some(line)) if s.at.saturating_sub(p) <= 2 * SAMPLE_INTERVAL_SECS => line.push((x, y)),
            _ => lines.push(vec![(x, y)]),
        }
        prev = Some(s.at);
    }
    lines
}

/// `x,y x,y …`; a line of one sample is drawn as a short dash, so that it shows.
fn points(line: &[(f64, f64)]) -> String {
    let one;
    let line = if let [(x, y)] = line {
        let x = x.clamp(2.0, CHART_W - 2.0);
        one = [(x - 2.0, *y), (x + 2.0, *y)];
        &one[..]
    } else {
        line
    };
    line.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect::<Vec<_>>().join(" ")
}

/// The day's chart: server-rendered SVG (no script, no CDN, no inline style), as wide as the
/// page; the legend and the times are HTML, so they keep their size on a phone.
pub(super) fn history_chart(ctx: &Ctx, samples: &[MetricsSample], now: u64) -> Markup {
    html! {
        section #history {
            h2 { (ctx.t(Msg::HistoryTitle)) " " (seen_by(ctx, false)) }
            @if samples.is_empty() {
                p #no-history { (ctx.t(Msg::NoHistory)) }
            } @else {
                p.help { (ctx.t(Msg::HistoryHelp)) }
                svg.chart viewBox={ "0 0 " (CHART_W) " " (CHART_H) } preserveAspectRatio="none"
                    role="img" data-samples=(samples.len()) {
                    title { (fill(ctx.t(Msg::ChartTitle), &[("n", &samples.len().to_string())])) }
                    @for y in [0.0, 25.0, 50.0, 75.0, 100.0] {
                        line.grid x1="0" x2=(CHART_W) y1=(y) y2=(y) vector-effect="non-scaling-stroke" {}
                    }
                    @for (class, _, value) in SERIES {
                        @for line in series_lines(samples, now, value) {
                            polyline.series.(class) points=(points(&line)) fill="none"
                                vector-effect="non-scaling-stroke" {}
                        }
                    }
                }
                div.axis {
                    span { (when(now.saturating_sub(SAMPLE_WINDOW_SECS))) }
                    span { (when(now)) }
                }
                ul.series-legend {
                    @for (class, label, _) in SERIES {
                        li { span.swatch.(class) {} " " (ctx.t(label)) }
                    }
                }
            }
        }
    }
}
