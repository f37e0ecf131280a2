//! `gpum-platform migrate --from sqlite:FILE --to postgres://…` (issue 35): moves a platform's
//! whole database from SQLite to PostgreSQL, once, while no `serve` runs on either.
//!
//! Both ends are opened with `store::open`, so both are at this binary's schema version (the
//! SQLite file is migrated first, as `serve` would). The target must be empty of platform data:
//! a copy never merges. Every table is copied row by row, column by column by name, in one
//! transaction on the target, so a failure leaves it empty; the `rowid` that PostgreSQL's tables
//! carry as a column (`store::migrations`) takes SQLite's implicit one, so orders and pruning stay as they
//! were, and its sequence continues after the highest. Then the copy is compared, table by
//! table, by row count. The tables are those the schema holds (`schema::tables`, SQLite's in
//! the order they were created), never a list kept by hand.

use anyhow::{Context, Result, bail};

use crate::sql::{Conn, Engine, Value};

/// Rows copied, per table.
pub type Copied = Vec<(String, u64)>;

fn columns(c: &Conn, table: &str) -> Result<Vec<String>> {
    let sql = match c.engine() {
        Engine::Sqlite => format!("SELECT name FROM pragma_table_info('{table}') ORDER BY cid"),
        Engine::Postgres => format!(
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = '{table}' ORDER BY ordinal_position"
        ),
    };
    Ok(c.prepare_cached(&sql)?.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
}

fn count(c: &Conn, table: &str) -> Result<u64> {
    Ok(c.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?)
}

/// Copies every table of `from` (SQLite) into `to` (PostgreSQL, empty).
pub fn copy(from: &Conn, to: &Conn) -> Result<Copied> {
    if from.engine() != Engine::Sqlite || to.engine() != Engine::Postgres {
        bail!("migrate copies a SQLite database into PostgreSQL");
    }
    // SQLite's tables in the order they were created, so that foreign keys are satisfied.
    let tables = crate::schema::tables(from)?;
    let (mut mine, mut theirs) = (tables.clone(), crate::schema::tables(to)?);
    mine.sort();
    theirs.sort();
    if mine != theirs {
        bail!("the two databases hold different tables: {mine:?} and {theirs:?}");
    }
    for t in &tables {
        if count(to, t)? != 0 {
            bail!(
                "the target already holds platform data (table {t}); migrate copies only into an empty database"
            );
        }
    }
    to.begin()?;
    let r = copy_tables(from, to, &tables);
    match r {
        Ok(copied) => {
            to.execute_batch("COMMIT")?;
            Ok(copied)
        }
        Err(e) => {
            let _ = to.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn copy_tables(from: &Conn, to: &Conn, tables: &[String]) -> Result<Copied> {
    let mut copied = Vec::new();
    for t in tables {
        let target_cols = columns(to, t)?;
        let source_cols = columns(from, t)?;
        // Every column the target has; `rowid` is SQLite's implicit one.
        let cols: Vec<&String> =
            target_cols.iter().filter(|c| c.as_str() == "rowid" || source_cols.contains(c)).collect();
        if let Some(extra) = source_cols.iter().find(|c| !target_cols.contains(c)) {
            bail!("column {t}.{extra} has no place in PostgreSQL's schema");
        }
        let list = cols.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ");
        let marks = (1..=cols.len()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let rows: Vec<Vec<Value>> = from
            .prepare_cached(&format!("SELECT {list} FROM {t}"))?
            .query_map([], |r| (0..cols.len()).map(|i| r.get::<_, Value>(i)).collect())?
            .collect::<Result<_, _>>()?;
        let insert = format!("INSERT INTO {t} ({list}) VALUES ({marks})");
        for row in &rows {
            to.execute(&insert, row.as_slice()).with_context(|| format!("copy a row of {t}"))?;
        }
        if cols.iter().any(|c| c.as_str() == "rowid") {
            to.execute_batch(&format!(
                "SELECT setval(pg_get_serial_sequence('{t}', 'rowid'), COALESCE(MAX(rowid), 0) + 1, false) FROM {t}"
            ))?;
        }
        let n = count(to, t)?;
        if n != rows.len() as u64 || n != count(from, t)? {
            bail!("table {t}: {} rows read, {n} in the copy", rows.len());
        }
        copied.push((t.clone(), n));
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{self, Scope};
    use crate::testdb::TestDb;

    /// A platform with something in every table moves to PostgreSQL whole: the same rows, the
    /// same answers from the store, and new rows after the copied ones.
    #[test]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    fn a_sqlite_platform_moves_to_postgres_whole() {
        let src = TestDb::on(Engine::Sqlite);
        let s = src.open();
        let now = 1_000_000;
        let code = store::create_join_code(&s, now, 3600, &Scope::All).unwrap().code;
        let _unused = store::create_join_code(&s, now, 3600, &Scope::All).unwrap();
        let mut inventory = gpum_protocol::Inventory::default();
        inventory.private.gpu_uuids = vec!["GPU-m".into()];
        inventory.private.hostname = "box".into();
        let req = gpum_protocol::RegisterRequest {
            join_code: code,
            agent_version: "1".into(),
            inventory,
            install_id: None,
        };
        let reg = store::register(&s, now, &req, 10).unwrap();
        let hb = gpum_protocol::HeartbeatRequest { seq: 1, ..Default::default() };
        store::heartbeat(&s, now + 1, &reg.node_token, &hb, 10).unwrap();
        store::rotate_token(&s, now + 2, &reg.node_id, &Scope::All).unwrap();
        let (owner, _, _) = crate::accounts::invite(&s, now, "ann@example.com").unwrap();
        crate::accounts::create_session(&s, now, Some(&owner.id)).unwrap();
        let image = format!("docker.io/nvidia/cuda@sha256:{}", "a".repeat(64));
        store::set_probe_image(&s, Some(&image)).unwrap();

        let dst = TestDb::on(Engine::Postgres);
        let d = dst.open();
        let copied = copy(&s, &d).unwrap();
        assert!(copied.iter().any(|(t, n)| t == "nodes" && *n == 1), "{copied:?}");
        assert!(copied.iter().any(|(t, n)| t == "node_events" && *n > 0), "{copied:?}");
        for t in crate::schema::tables(&s).unwrap() {
            assert_eq!(count(&s, &t).unwrap(), count(&d, &t).unwrap(), "{t}");
        }
        assert_eq!(
            serde_json::to_value(store::list_nodes(&s, now + 3, &Scope::All).unwrap()).unwrap(),
            serde_json::to_value(store::list_nodes(&d, now + 3, &Scope::All).unwrap()).unwrap()
        );
        assert_eq!(store::probe_image(&s).unwrap(), store::probe_image(&d).unwrap());
        // New rows go after the copied ones (PostgreSQL's rowid sequence continues).
        let rotated = store::rotate_token(&d, now + 3, &reg.node_id, &Scope::All).unwrap();
        let hb = gpum_protocol::HeartbeatRequest { seq: 2, ..Default::default() };
        store::heartbeat(&d, now + 400, &rotated.node_token, &hb, 10).unwrap();
        let newest: i64 = d.query_row("SELECT MAX(rowid) FROM node_events", [], |r| r.get(0)).unwrap();
        assert!(newest as u64 > count(&s, "node_events").unwrap(), "{newest}");
        // A second copy into a database that holds data is refused, and changes nothing.
        let e = copy(&s, &d).unwrap_err();
        assert!(e.to_string().contains("empty database"), "{e}");
    }
}
