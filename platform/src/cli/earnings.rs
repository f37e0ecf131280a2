//! `gpum-platform earnings` (issue 46): the operator's view of what the rentals earned, the
//! admin API's `GET /api/v1/admin/earnings` from the same function (`store::earnings`).

use anyhow::Result;
use gpum_common::text::escape_controls;
use gpum_platform_core::currency::{self, Currency};
use gpum_platform_core::metering::gpu_hours;
use gpum_protocol::{Earnings, EarningsLine};

use super::Tx;
use crate::accounts;
use crate::store::{self, Scope};

#[derive(Debug, clap::Args)]
pub(super) struct EarningsArgs {
    /// One owner's (e-mail or id); without it, every owner's, with a line per owner.
    #[arg(long, value_name = "OWNER")]
    owner: Option<String>,
    /// The rentals as CSV (the admin API's `?format=csv`), instead of the tables (`--json`: the
    /// admin API's answer).
    #[arg(long)]
    csv: bool,
}

pub(super) fn run(args: &EarningsArgs, now: u64, json: bool, tx: &Tx<'_>) -> Result<()> {
    let v = tx(&|c| {
        let owner = match &args.owner {
            Some(o) => Some(accounts::find_owner(c, o)?.id),
            None => None,
        };
        Ok(serde_json::to_value(store::earnings(c, now, &Scope::All, owner.as_deref())?)?)
    })?;
    let e: Earnings = serde_json::from_value(v.clone())?;
    if args.csv {
        print!("{}", store::earnings_csv(&e));
    } else if json {
        println!("{v}");
    } else {
        println!("{}", escape_controls(&human(&e)));
    }
    Ok(())
}

/// The tables: totals, per owner (every owner's), per server, month and day, then the rentals.
pub(super) fn human(e: &Earnings) -> String {
    let cur = Currency::parse(&e.currency.code).unwrap_or(currency::DEFAULT);
    let money = |m: u64| format!("{} {}", cur.plain(m), cur.code);
    let mut s = format!(
        "total: {} rentals, {} GPU-hours, {}",
        e.total.rentals,
        gpu_hours(e.total.gpu_seconds, 2),
        money(e.total.amount)
    );
    let mut table = |title: &str, lines: &[EarningsLine]| {
        if lines.is_empty() {
            return;
        }
        s.push_str(&format!(
            "\n\n{:<24} {:<28} {:>7} {:>12} {:>18}",
            title, "", "RENTALS", "GPU-HOURS", "AMOUNT"
        ));
        for l in lines {
            s.push_str(&format!(
                "\n{:<24} {:<28} {:>7} {:>12} {:>18}",
                l.key,
                l.label,
                l.sum.rentals,
                gpu_hours(l.sum.gpu_seconds, 2),
                money(l.sum.amount)
            ));
        }
    };
    table("OWNER", &e.owners);
    table("SERVER", &e.servers);
    table("MONTH (UTC)", &e.months);
    table("DAY (UTC)", &e.days);
    if !e.rentals.is_empty() {
        s.push_str(&format!(
            "\n\n{:<22} {:<22} {:<9} {:>4} {:>12} {:>16} {:>18}  IMAGE",
            "RENTAL", "SERVER", "STATE", "GPUS", "GPU-HOURS", "PRICE/GPU-HOUR", "AMOUNT"
        ));
        for r in &e.rentals {
            s.push_str(&format!(
                "\n{:<22} {:<22} {:<9} {:>4} {:>12} {:>16} {:>18}  {}",
                r.id,
                r.node_id,
                r.state,
                r.gpus,
                gpu_hours(r.gpu_seconds, 2),
                r.price_per_gpu_hour.map(money).unwrap_or_else(|| "-".into()),
                money(r.amount),
                r.image
            ));
        }
    }
    s
}
