//! The earnings page (issue 46): what the rentals on the owner's servers earned, per server,
//! month, day and rental, with totals; amounts in the owner's language ("1 234,50 ₽",
//! "RUB 1,234.50"), and the same as CSV.

use super::*;
use gpum_platform_core::currency::{Currency, group};
use gpum_protocol::{CurrencyInfo, Earnings, EarningsLine};

/// No-break space: a number and its unit, or the groups of a number, never part at a line end.
const NBSP: &str = "\u{a0}";

/// An amount of `minor` minor units in the owner's language: `1 234,50 ₽` in Russian (groups
/// of three by a no-break space, a decimal comma, the sign after), `RUB 1,234.50` in English
/// (the code first, groups by commas, a decimal point).
pub fn money(lang: Lang, minor: u64, cur: &CurrencyInfo) -> String {
    let c = gpum_platform_core::currency::Currency::parse(&cur.code)
        .unwrap_or(gpum_platform_core::currency::DEFAULT);
    money_in(lang, minor, c)
}

/// The currency as the owner's language names it beside a number: its sign in Russian
/// (`₽`, `$`, or the code for one without a sign in use), its code in English.
pub fn currency_name(lang: Lang, c: Currency) -> &'static str {
    match lang {
        Lang::En => c.code,
        Lang::Ru => match c.code {
            "RUB" => "₽",
            "USD" => "$",
            "EUR" => "€",
            "GBP" => "£",
            "CNY" | "JPY" => "¥",
            "KZT" => "₸",
            "BYN" => "Br",
            code => code,
        },
    }
}

/// [`money`] in currency `c`.
pub fn money_in(lang: Lang, minor: u64, c: Currency) -> String {
    let (whole, frac) = c.split(minor);
    match lang {
        Lang::Ru => {
            let sign = currency_name(lang, c);
            let n = group(whole, NBSP);
            match frac {
                Some(f) => format!("{n},{f}{NBSP}{sign}"),
                None => format!("{n}{NBSP}{sign}"),
            }
        }
        Lang::En => {
            let n = group(whole, ",");
            match frac {
                Some(f) => format!("{}{NBSP}{n}.{f}", c.code),
                None => format!("{}{NBSP}{n}", c.code),
            }
        }
    }
}

/// GPU-seconds as GPU-hours with two decimals (truncated), in the owner's language.
pub fn gpu_hours(lang: Lang, gpu_seconds: u64) -> String {
    let h = gpum_platform_core::metering::gpu_hours(gpu_seconds, 2);
    match lang {
        Lang::Ru => h.replace('.', ","),
        Lang::En => h,
    }
}

fn lines_table(
    ctx: &Ctx,
    id: &str,
    head: Msg,
    lines: &[EarningsLine],
    cur: &CurrencyInfo,
    link: bool,
) -> Markup {
    html! {
        table.cards.earnings id=(id) {
            thead { tr {
                th { (ctx.t(head)) }
                th.num { (ctx.t(Msg::EarningsRentals)) }
                th.num { (ctx.t(Msg::EarningsGpuHours)) }
                th.num { (ctx.t(Msg::EarningsAmount)) }
            } }
            tbody {
                @for l in lines {
                    tr {
                        td data-label=(ctx.t(head)) {
                            @if link {
                                a href={ "/dashboard/servers/" (l.key) } {
                                    @if l.label.is_empty() { (l.key) } @else { (cut(&l.label)) }
                                }
                            } @else { (l.key) }
                        }
                        td.num data-label=(ctx.t(Msg::EarningsRentals)) { (l.sum.rentals) }
                        td.num data-label=(ctx.t(Msg::EarningsGpuHours)) { (gpu_hours(ctx.lang, l.sum.gpu_seconds)) }
                        td.num data-label=(ctx.t(Msg::EarningsAmount)) { (money(ctx.lang, l.sum.amount, cur)) }
                    }
                }
            }
        }
    }
}

/// A rental's state (the API's word) in the owner's language, as the server's page says it.
fn state_words(ctx: &Ctx, word: &str) -> String {
    use gpum_protocol::RentalState::*;
    let m = match gpum_protocol::RentalState::parse(word) {
        Some(Pulling) => Msg::RentalPulling,
        Some(Starting) => Msg::RentalStarting,
        Some(Running) => Msg::RentalRunning,
        Some(Exited) => Msg::RentalExitedState,
        Some(Stopping) => Msg::RentalStopping,
        Some(Gone) => Msg::RentalGoneState,
        Some(Failed) => Msg::RentalFailedState,
        None => match word {
            "pending" => Msg::RentalPending,
            "stopped" => Msg::RentalStoppedState,
            "expired" => Msg::RentalExpired,
            other => return other.to_owned(),
        },
    };
    ctx.t(m).to_owned()
}

/// The page.
pub fn earnings(ctx: &Ctx, e: &Earnings) -> Markup {
    let cur = &e.currency;
    layout(
        ctx,
        ctx.t(Msg::EarningsTitle),
        html! {
            p #earnings-help { (fill(ctx.t(Msg::EarningsHelp), &[("currency", &cur.code)])) }
            p #earnings-total.total {
                (fill(ctx.t(Msg::EarningsTotal), &[
                    ("amount", &money(ctx.lang, e.total.amount, cur)),
                    ("hours", &gpu_hours(ctx.lang, e.total.gpu_seconds)),
                    ("n", &e.total.rentals.to_string()),
                ]))
            }
            p { a.button #earnings-csv href="/dashboard/earnings.csv" download { (ctx.t(Msg::EarningsCsv)) } }
            @if e.rentals.is_empty() {
                p #no-earnings { (ctx.t(Msg::EarningsNone)) }
            } @else {
                h2 { (ctx.t(Msg::EarningsByServer)) }
                (lines_table(ctx, "earnings-servers", Msg::EarningsServer, &e.servers, cur, true))
                h2 { (ctx.t(Msg::EarningsByMonth)) }
                (lines_table(ctx, "earnings-months", Msg::EarningsMonth, &e.months, cur, false))
                h2 { (ctx.t(Msg::EarningsByDay)) }
                (lines_table(ctx, "earnings-days", Msg::EarningsDay, &e.days, cur, false))
                h2 { (ctx.t(Msg::EarningsByRental)) }
                table.cards.earnings #earnings-rentals {
                    thead { tr {
                        th { (ctx.t(Msg::EarningsRental)) }
                        th { (ctx.t(Msg::EarningsServer)) }
                        th { (ctx.t(Msg::EarningsState)) }
                        th.num { (ctx.t(Msg::EarningsGpus)) }
                        th.num { (ctx.t(Msg::EarningsGpuHours)) }
                        th.num { (ctx.t(Msg::EarningsPrice)) }
                        th.num { (ctx.t(Msg::EarningsAmount)) }
                    } }
                    tbody {
                        @for r in &e.rentals {
                            tr id={ "earning-" (r.id) } {
                                td data-label=(ctx.t(Msg::EarningsRental)) { code { (r.id) } br; small { (cut(&r.image)) " · " (when(r.created_at)) } }
                                td data-label=(ctx.t(Msg::EarningsServer)) { a href={ "/dashboard/servers/" (r.node_id) } {
                                    @if r.server_name.is_empty() { (r.node_id) } @else { (cut(&r.server_name)) }
                                } }
                                td data-label=(ctx.t(Msg::EarningsState)) { (state_words(ctx, &r.state)) }
                                td.num data-label=(ctx.t(Msg::EarningsGpus)) { (r.gpus) }
                                td.num data-label=(ctx.t(Msg::EarningsGpuHours)) { (gpu_hours(ctx.lang, r.gpu_seconds)) }
                                td.num data-label=(ctx.t(Msg::EarningsPrice)) { @match r.price_per_gpu_hour {
                                    Some(p) => { (money(ctx.lang, p, cur)) }
                                    None => { "—" }
                                } }
                                td.num data-label=(ctx.t(Msg::EarningsAmount)) { (money(ctx.lang, r.amount, cur)) }
                            }
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_read_as_the_owners_language_writes_them() {
        let rub = CurrencyInfo { code: "RUB".into(), minor_units: 2 };
        assert_eq!(money(Lang::Ru, 123_450, &rub), "1\u{a0}234,50\u{a0}₽");
        assert_eq!(money(Lang::En, 123_450, &rub), "RUB\u{a0}1,234.50");
        assert_eq!(money(Lang::Ru, 5, &rub), "0,05\u{a0}₽");
        let jpy = CurrencyInfo { code: "JPY".into(), minor_units: 0 };
        assert_eq!(money(Lang::En, 1_234_567, &jpy), "JPY\u{a0}1,234,567");
        assert_eq!(money(Lang::Ru, 1_234_567, &jpy), "1\u{a0}234\u{a0}567\u{a0}¥");
        assert_eq!(gpu_hours(Lang::Ru, 5400), "1,50");
        assert_eq!(gpu_hours(Lang::En, 5400), "1.50");
    }
}
