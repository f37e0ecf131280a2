//! Money (issue 46): the platform's currency, the rentals' runs as the heartbeats report them,
//! and the earnings read from them. The rules are the core's (`gpum_platform_core::metering`,
//! `currency`); this file reads and writes.
//!
//! - `rental_runs` holds one row per span the agent reported a rental `running`: opened and
//!   closed by heartbeats ([`meter`], the core's `metering::beat`), closed at the node's last
//!   heartbeat when the node is deleted ([`close_node_runs`]). An open run counts up to the
//!   node's last heartbeat, so a node that went silent stops earning at once, before any beat
//!   closes the run.
//! - The currency is a setting (`settings.currency`, `serve --currency`); it cannot change once
//!   a rental was created, so no amount is ever read in another currency than it was priced in.

use super::*;
use gpum_platform_core::currency::{self, Currency};
use gpum_platform_core::metering::{self, Beat, Charge, Charged, Run, RunChange};
use gpum_protocol::{
    CurrencyInfo, Earnings, EarningsLine, EarningsSum, RentalReport, RentalSpec, RentalState, RentalSummary,
};

/// The platform's currency: the operator's setting, else [`currency::DEFAULT`] (RUB).
pub fn currency(conn: &Conn) -> Result<Currency, ApiError> {
    let v: Option<Option<String>> = conn
        .prepare_cached("SELECT value FROM settings WHERE key = 'currency'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    match v.flatten() {
        Some(code) => Currency::parse(&code).map_err(|e| {
            tracing::error!(error = %e, "the stored currency is unknown");
            ApiError::internal()
        }),
        None => Ok(currency::DEFAULT),
    }
}

/// Sets the currency (`serve --currency CODE`): an ISO 4217 code the platform knows, and, once
/// any rental exists, only the one its prices were fixed in. The error says why, for the
/// operator.
pub fn set_currency(conn: &Conn, code: &str) -> Result<Currency, String> {
    let new = Currency::parse(code)?;
    let old = currency(conn).map_err(|e| e.message)?;
    if new == old {
        // Written, so that the setting is the operator's and no longer the default.
        store_currency(conn, new).map_err(|e| e.message)?;
        return Ok(new);
    }
    let rentals: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM rentals")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(|e| e.to_string())?;
    if rentals > 0 {
        return Err(format!(
            "the platform's currency is {}: its {rentals} rentals are priced in it, so it cannot become {}",
            old.code, new.code
        ));
    }
    store_currency(conn, new).map_err(|e| e.message)?;
    Ok(new)
}

fn store_currency(conn: &Conn, c: Currency) -> Result<(), ApiError> {
    conn.prepare_cached(
        "INSERT INTO settings (key, value) VALUES ('currency', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![c.code])?;
    Ok(())
}

/// A heartbeat's part in metering: the node's open runs read (one lookup on a partial index,
/// only for a node that has or had a rental), the core's rule applied, the changes written.
/// `reports` are the beat's own (the ids of other nodes' rentals are ignored).
pub(crate) fn meter(
    conn: &Conn,
    now: u64,
    node_id: &str,
    last_beat: Option<i64>,
    seq: u64,
    reports: &[RentalReport],
) -> Result<(), ApiError> {
    let open: Vec<String> = conn
        .prepare_cached("SELECT rental_id FROM rental_runs WHERE node_id = ?1 AND ended_at IS NULL")?
        .query_map(params![node_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let running: Vec<&str> =
        reports.iter().filter(|r| r.state == RentalState::Running).map(|r| r.id.as_str()).collect();
    if open.is_empty() && running.is_empty() {
        return Ok(());
    }
    let open_refs: Vec<&str> = open.iter().map(String::as_str).collect();
    let beat = Beat { now: now as i64, last_beat, handshake: seq == 0, running: &running };
    for change in metering::beat(&open_refs, beat) {
        match change {
            RunChange::Close { rental, at } => {
                conn.prepare_cached(
                    "UPDATE rental_runs SET ended_at = CASE WHEN ?1 > started_at THEN ?1 ELSE started_at END
                     WHERE rental_id = ?2 AND node_id = ?3 AND ended_at IS NULL",
                )?
                .execute(params![at, rental, node_id])?;
            }
            RunChange::Open { rental, at } => {
                // Only this node's own rentals.
                conn.prepare_cached(
                    "INSERT INTO rental_runs (rental_id, node_id, started_at)
                     SELECT id, node_id, CAST(?1 AS BIGINT) FROM rentals WHERE id = ?2 AND node_id = ?3",
                )?
                .execute(params![at, rental, node_id])?;
            }
        }
    }
    Ok(())
}

/// The node's open runs end at its last heartbeat (it is deleted: no beat will come).
pub(crate) fn close_node_runs(conn: &Conn, node_id: &str) -> Result<(), ApiError> {
    conn.prepare_cached(
        "UPDATE rental_runs SET ended_at = COALESCE(
             (SELECT CASE WHEN n.last_heartbeat_at > rental_runs.started_at THEN n.last_heartbeat_at
                          ELSE rental_runs.started_at END
              FROM nodes n WHERE n.id = rental_runs.node_id),
             started_at)
         WHERE node_id = ?1 AND ended_at IS NULL",
    )?
    .execute(params![node_id])?;
    Ok(())
}

/// One rental as the earnings read it.
struct Row {
    id: String,
    node_id: String,
    server_name: String,
    owner_id: String,
    owner_email: String,
    spec_json: String,
    created_at: i64,
    price: Option<u64>,
    summary: RentalSummary,
    last_beat: Option<i64>,
    node_deleted: bool,
}

/// The earnings of the rentals within `scope` (an owner's servers, or all), of one owner's
/// when `owner` is given (the operator's `?owner=`); at `now`. The operator's view of every
/// owner also lists each owner's totals.
pub fn earnings(conn: &Conn, now: u64, scope: &Scope, owner: Option<&str>) -> Result<Earnings, ApiError> {
    let owner = scope.owner().or(owner);
    let cur = currency(conn)?;
    let rows: Vec<Row> = conn
        .prepare_cached(
            "SELECT r.id, r.node_id, COALESCE(n.name, ''), COALESCE(n.owner_id, ''),
                    COALESCE((SELECT email FROM owners o WHERE o.id = n.owner_id), ''),
                    r.spec_json, r.created_at, r.price_per_gpu_hour, r.stopped_at, r.listed, r.ends_at,
                    r.state, r.exit_code, r.updated_at, n.last_heartbeat_at, n.inventory_json, n.deleted_at
             FROM rentals r JOIN nodes n ON n.id = r.node_id
             WHERE (CAST(?1 AS TEXT) IS NULL OR n.owner_id = ?1)
             ORDER BY r.created_at DESC, r.id DESC",
        )?
        .query_map(params![owner], |r| {
            let ends_at: i64 = r.get(10)?;
            let t = |v: Option<i64>| v.map(|x| x.max(0) as u64);
            let name: String = r.get(2)?;
            let inventory: String = r.get(15)?;
            let deleted: Option<i64> = r.get(16)?;
            let server_name = if !name.is_empty() || deleted.is_some() {
                name
            } else {
                serde_json::from_str::<gpum_protocol::Inventory>(&inventory)
                    .map(|i| i.private.hostname)
                    .unwrap_or_default()
            };
            Ok(Row {
                id: r.get(0)?,
                node_id: r.get(1)?,
                server_name,
                owner_id: r.get(3)?,
                owner_email: r.get(4)?,
                spec_json: r.get(5)?,
                created_at: r.get(6)?,
                price: r.get::<_, Option<i64>>(7)?.map(|p| p.max(0) as u64),
                summary: RentalSummary {
                    node_id: String::new(),
                    spec: RentalSpec::default(),
                    created_at: 0,
                    stopped_at: t(r.get(8)?),
                    listed: r.get::<_, bool>(9)? && ends_at > now as i64,
                    state: r.get(11)?,
                    exit_code: r.get(12)?,
                    reason: None,
                    updated_at: t(r.get(13)?),
                    tunnel: None,
                    price: None,
                },
                last_beat: r.get(14)?,
                node_deleted: deleted.is_some(),
            })
        })?
        .collect::<Result<_, _>>()?;

    let mut charges: Vec<Charge> = Vec::with_capacity(rows.len());
    let mut out_rentals = Vec::with_capacity(rows.len());
    // Every run of these rentals in one lookup (not one per rental).
    let mut runs_of: std::collections::HashMap<String, Vec<Run>> = std::collections::HashMap::new();
    let all_runs: Vec<(String, Run)> = conn
        .prepare_cached(
            "SELECT rr.rental_id, rr.started_at, rr.ended_at
             FROM nodes n JOIN rentals r ON r.node_id = n.id JOIN rental_runs rr ON rr.rental_id = r.id
             WHERE (CAST(?1 AS TEXT) IS NULL OR n.owner_id = ?1)",
        )?
        .query_map(params![owner], |r| Ok((r.get(0)?, Run { start: r.get(1)?, end: r.get(2)? })))?
        .collect::<Result<_, _>>()?;
    for (rental, run) in all_runs {
        runs_of.entry(rental).or_default().push(run);
    }
    for row in &rows {
        let runs = runs_of.remove(&row.id).unwrap_or_default();
        // An open run counts up to the node's last heartbeat (never past now).
        let open_end = row.last_beat.unwrap_or(0).min(now as i64);
        let spans: Vec<(i64, i64)> = runs.iter().map(|r| r.span(open_end)).collect();
        let spec: RentalSpec = serde_json::from_str(&row.spec_json)?;
        let gpus = spec.gpu_uuids.len() as u32;
        let charge = metering::charge(&spans, gpus, row.price);
        out_rentals.push(gpum_protocol::RentalEarnings {
            id: row.id.clone(),
            node_id: row.node_id.clone(),
            server_name: row.server_name.clone(),
            image: image_name(&spec.image),
            gpus,
            created_at: row.created_at.max(0) as u64,
            // A rental whose server was deleted ended then, whatever its agent said last.
            state: match row.summary.state {
                Some(RentalState::Gone | RentalState::Failed) | None => {
                    crate::rentals::state_word(&row.summary)
                }
                Some(_) if row.node_deleted => "stopped".to_owned(),
                Some(_) => crate::rentals::state_word(&row.summary),
            },
            price_per_gpu_hour: row.price,
            gpu_seconds: charge.gpu_seconds,
            amount: charge.amount,
        });
        charges.push(charge);
    }
    let charged: Vec<Charged<'_>> =
        rows.iter().zip(&charges).map(|(r, c)| Charged { server: &r.node_id, charge: c }).collect();
    let summary = metering::summarize(&charged);
    let sum =
        |s: &metering::Sum| EarningsSum { rentals: s.rentals, gpu_seconds: s.gpu_seconds, amount: s.amount };
    let servers = summary
        .servers
        .iter()
        .map(|(node, s)| EarningsLine {
            key: node.clone(),
            label: rows
                .iter()
                .find(|r| &r.node_id == node)
                .map(|r| r.server_name.clone())
                .unwrap_or_default(),
            sum: sum(s),
        })
        .collect();
    let days = summary
        .days
        .iter()
        .map(|(d, s)| EarningsLine { key: metering::day_name(*d), label: String::new(), sum: sum(s) })
        .collect();
    let months = summary
        .months
        .iter()
        .map(|(m, s)| EarningsLine { key: metering::month_name(*m), label: String::new(), sum: sum(s) })
        .collect();
    // The operator's view of every owner: one line per owner.
    let mut owners: Vec<EarningsLine> = Vec::new();
    if matches!(scope, Scope::All) && owner.is_none() {
        for (row, c) in rows.iter().zip(&charges) {
            let i = match owners.iter().position(|o| o.key == row.owner_id) {
                Some(i) => i,
                None => {
                    owners.push(EarningsLine {
                        key: row.owner_id.clone(),
                        label: row.owner_email.clone(),
                        sum: EarningsSum::default(),
                    });
                    owners.len() - 1
                }
            };
            let o = &mut owners[i].sum;
            o.rentals += 1;
            o.gpu_seconds = o.gpu_seconds.saturating_add(c.gpu_seconds);
            o.amount = o.amount.saturating_add(c.amount);
        }
        owners.sort_by(|a, b| b.sum.amount.cmp(&a.sum.amount).then_with(|| a.key.cmp(&b.key)));
    }
    Ok(Earnings {
        currency: CurrencyInfo { code: cur.code.to_owned(), minor_units: cur.minor_units },
        at: now,
        total: sum(&summary.total),
        rentals: out_rentals,
        servers,
        days,
        months,
        owners,
    })
}

/// An image reference without its digest (`nvcr.io/nvidia/pytorch@sha256:…` →
/// `nvcr.io/nvidia/pytorch`).
pub fn image_name(reference: &str) -> String {
    reference.split('@').next().unwrap_or(reference).to_owned()
}

/// The earnings' rentals as CSV (RFC 4180, `\r\n`), one line each, with the currency named on
/// every amount: `rental,server_id,server,image,gpus,created_at,state,gpu_hours,price_per_gpu_hour,amount,currency`.
/// Amounts are plain decimals (`1234.50`), GPU-hours with four decimals (truncated; the sums use
/// seconds), times ISO 8601 UTC. A field that a spreadsheet would run as a formula is quoted
/// with a leading `'`.
pub fn csv(e: &Earnings) -> String {
    let cur = Currency::parse(&e.currency.code).unwrap_or(currency::DEFAULT);
    let mut out = String::from(
        "rental,server_id,server,image,gpus,created_at,state,gpu_hours,price_per_gpu_hour,amount,currency\r\n",
    );
    for r in &e.rentals {
        let fields = [
            r.id.clone(),
            r.node_id.clone(),
            r.server_name.clone(),
            r.image.clone(),
            r.gpus.to_string(),
            iso_utc(r.created_at as i64),
            r.state.clone(),
            metering::gpu_hours(r.gpu_seconds, 4),
            r.price_per_gpu_hour.map(|p| cur.plain(p)).unwrap_or_default(),
            cur.plain(r.amount),
            e.currency.code.clone(),
        ];
        let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        out.push_str(&line.join(","));
        out.push_str("\r\n");
    }
    out
}

fn csv_field(f: &str) -> String {
    let f = if f.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{f}") } else { f.to_owned() };
    if f.contains([',', '"', '\n', '\r']) { format!("\"{}\"", f.replace('"', "\"\"")) } else { f }
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
pub fn iso_utc(t: i64) -> String {
    let day = t.div_euclid(metering::DAY_SECS);
    let s = t.rem_euclid(metering::DAY_SECS);
    format!("{}T{:02}:{:02}:{:02}Z", metering::day_name(day), s / 3600, s % 3600 / 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Migration 17: a rental made before prices were fixed on rentals takes its server's price
    /// at the upgrade (and one on an unpriced server none); it has no runs, so it is charged
    /// nothing, and the currency is RUB until the operator sets one.
    #[test]
    fn rentals_made_before_take_their_servers_price_at_the_upgrade() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p.db");
        {
            let c = rusqlite::Connection::open(&p).unwrap();
            for (i, m) in MIGRATIONS.iter().enumerate().take(16) {
                c.execute_batch(&format!("BEGIN; {m}; PRAGMA user_version = {}; COMMIT;", i + 1)).unwrap();
            }
            let spec = |id: &str| {
                serde_json::to_string(&RentalSpec {
                    id: id.into(),
                    gpu_uuids: vec!["GPU-1".into()],
                    ..RentalSpec::default()
                })
                .unwrap()
            };
            c.execute_batch(
                "INSERT INTO nodes (id, token_hash, registered_at, price_per_gpu_hour) VALUES ('n1', 'h1', 1, 1250);
                 INSERT INTO nodes (id, token_hash, registered_at) VALUES ('n2', 'h2', 1);",
            )
            .unwrap();
            for (id, node) in [("r1", "n1"), ("r2", "n2")] {
                c.execute(
                    "INSERT INTO rentals (id, node_id, spec_json, created_at, ends_at) VALUES (?1, ?2, ?3, 10, 20)",
                    rusqlite::params![id, node, spec(id)],
                )
                .unwrap();
            }
        }
        let c = open(&p).unwrap();
        let e = earnings(&c, 100, &Scope::All, None).unwrap();
        let prices: Vec<(&str, Option<u64>, u64)> =
            e.rentals.iter().map(|r| (r.id.as_str(), r.price_per_gpu_hour, r.amount)).collect();
        assert_eq!(prices, [("r2", None, 0), ("r1", Some(1250), 0)]);
        assert_eq!(e.currency, CurrencyInfo { code: "RUB".into(), minor_units: 2 });
        // Rentals exist: the currency cannot change any more; the same one is kept.
        assert!(set_currency(&c, "USD").unwrap_err().contains("cannot become USD"));
        assert_eq!(set_currency(&c, "RUB").unwrap().code, "RUB");
    }

    #[test]
    fn csv_quotes_and_defuses_formulas() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("=1+1"), "'=1+1");
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(1_796_594_400), "2026-12-06T22:00:00Z");
        assert_eq!(image_name("nvcr.io/nvidia/pytorch@sha256:00"), "nvcr.io/nvidia/pytorch");
    }
}
