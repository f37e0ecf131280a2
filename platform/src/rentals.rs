//! Rentals (issue 33), the platform's side: the operator creates a rental for a node, the
//! heartbeat answer carries the node's listed rentals whole, and the agent's reports move their
//! state. docs/protocol.md, "Rentals", is the contract.
//!
//! - **Everything is checked before anything is written** ([`create`]): the image is pinned by
//!   digest and from a registry the platform accepts ([`pinned_registry`]), the node is rentable
//!   by the one rule of [`crate::rentable::verdict`], the GPUs are the node's and held by no other
//!   rental, the numbers fit the node (the core's `placement::place` decides), the environment
//!   cannot choose GPUs.
//! - **Two rentals never share a GPU.** A GPU is held by a rental while the platform lists it,
//!   and after that until its agent reports it `gone` or `failed` (a rental the agent never
//!   reported holds nothing once it is no longer listed: no container was ever made for it).
//! - **The heartbeat stays cheap**: a node whose row says it has no rental that can still be
//!   listed (`nodes.rentals_until`, read in the beat's one node lookup) costs nothing more; else
//!   one indexed lookup of its listed rentals (`rentals_listed`, a partial index). A report is
//!   written only when it changes something.
//! - Events go to the node's log only on transitions: created, started (the first `running`),
//!   exited, stopped, gone, failed.
//!
//! The image rules are the agent's own, from `gpum_protocol::image` (issue 44, item 7):
//! `name@sha256:<64 hex>`, no tag beside the digest, the registry split as the engine does it,
//! `index.docker.io` is `docker.io`.

use crate::params;
use crate::sql::{Conn, Engine, OptionalExtension};
use gpum_protocol::{
    CreateRentalRequest, ErrorCode, NodeEventKind, NodeSummary, RentalList, RentalReport, RentalSpec,
    RentalState, RentalSummary, TUNNEL_CREDENTIAL_PREFIX, TunnelAccess, TunnelPort, limits, tunnel_target,
};

use crate::error::ApiError;
use crate::store::{self, Scope, invalid, record, truncate};

use gpum_protocol::image::{PinnedImage, RefError, canonical_registry};
/// The registries rental images come from when the operator has set none: the agent's default
/// probe registries too.
pub use gpum_protocol::registry::DEFAULT_REGISTRIES as DEFAULT_RENTAL_REGISTRIES;
use gpum_protocol::registry::valid_registry;
/// The longest image reference accepted.
pub const MAX_IMAGE_LEN: usize = gpum_protocol::image::MAX_REFERENCE_LEN;
/// The longest rental: a year (a rule of the core's placement).
pub use gpum_platform_core::placement::MAX_RENTAL_SECS;
use gpum_platform_core::placement::{self, Placement, Refusal};
/// The least CPU and memory a rental may ask for.
pub const MIN_CPU_MILLIS: u32 = 100;
pub const MIN_MEMORY_MIB: u64 = 64;
/// The longest reason kept from an agent's report.
const MAX_REASON_LEN: usize = 512;
/// The most registries the operator may list.
pub const MAX_RENTAL_REGISTRIES: usize = 32;

// ---------------------------------------------------------------------------------------------
// The image

/// The registry of `reference` (lower-case, `docker.io` for a name without one) when it is
/// pinned by digest (`name@sha256:<64 lower-case hex>`, no tag) and well formed, by the rules
/// the agent runs images by (`gpum_protocol::image`); else the field's error.
pub fn pinned_registry(reference: &str) -> Result<String, String> {
    match PinnedImage::parse(reference) {
        Ok(image) => Ok(image.registry().to_owned()),
        Err(RefError::NotPinned) => {
            Err("image: must be pinned by digest, name@sha256:<64 hex digits>, with no tag".into())
        }
        Err(_) => Err(format!(
            "image: not a valid image reference (1 to {MAX_IMAGE_LEN} characters, a registry host[:port], \
             lower-case name components)"
        )),
    }
}

/// The registries rental images may come from: the operator's list, or
/// [`DEFAULT_RENTAL_REGISTRIES`].
pub fn registries(conn: &Conn) -> Result<Vec<String>, ApiError> {
    let v: Option<Option<String>> = conn
        .prepare_cached("SELECT value FROM settings WHERE key = 'rental_registries'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    match v.flatten() {
        Some(json) => Ok(serde_json::from_str(&json)?),
        None => Ok(DEFAULT_RENTAL_REGISTRIES.iter().map(|s| s.to_string()).collect()),
    }
}

/// Sets the registries (`host` or `host:port` each, lower-cased, no duplicates); `None` goes
/// back to the defaults.
pub fn set_registries(conn: &Conn, list: Option<&[String]>) -> Result<Vec<String>, ApiError> {
    let Some(list) = list else {
        conn.prepare_cached("DELETE FROM settings WHERE key = 'rental_registries'")?.execute([])?;
        return registries(conn);
    };
    if list.is_empty() || list.len() > MAX_RENTAL_REGISTRIES {
        return Err(invalid(format!("registries: 1 to {MAX_RENTAL_REGISTRIES}")));
    }
    let mut out: Vec<String> = Vec::new();
    for r in list {
        let r = canonical_registry(r.trim());
        if !valid_registry(&r) {
            return Err(invalid(format!("registries: {r:?} is not a host or host:port")));
        }
        if !out.contains(&r) {
            out.push(r);
        }
    }
    conn.prepare_cached(
        "INSERT INTO settings (key, value) VALUES ('rental_registries', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![serde_json::to_string(&out)?])?;
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Validation

/// Checks what needs no database: the image's form, the numbers' bounds, the environment and
/// the command. The first failure names its field (400 `invalid_request`).
pub fn check_request(req: &CreateRentalRequest) -> Result<(), ApiError> {
    pinned_registry(&req.image).map_err(invalid)?;
    match (req.gpus, &req.gpu_uuids) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(invalid("gpus, gpu_uuids: exactly one of them (a count, or the GPUs' UUIDs)"));
        }
        (Some(n), None) if n == 0 || n as usize > limits::MAX_GPUS => {
            return Err(invalid(format!("gpus: 1 to {}", limits::MAX_GPUS)));
        }
        (None, Some(u)) if u.is_empty() || u.len() > limits::MAX_GPUS => {
            return Err(invalid(format!("gpu_uuids: 1 to {} UUIDs", limits::MAX_GPUS)));
        }
        (None, Some(u)) if u.iter().enumerate().any(|(i, x)| u[..i].contains(x)) => {
            return Err(invalid("gpu_uuids: each GPU once"));
        }
        _ => {}
    }
    if req.cpu_millis < MIN_CPU_MILLIS {
        return Err(invalid(format!("cpu_millis: at least {MIN_CPU_MILLIS}")));
    }
    if req.memory_mib < MIN_MEMORY_MIB {
        return Err(invalid(format!("memory_mib: at least {MIN_MEMORY_MIB}")));
    }
    if req.shm_mib == 0 || req.shm_mib > req.memory_mib {
        return Err(invalid("shm_mib: 1 to memory_mib"));
    }
    if req.disk_gib == 0 {
        return Err(invalid("disk_gib: at least 1"));
    }
    if req.ends_at.is_some() == req.duration_secs.is_some() {
        return Err(invalid("ends_at, duration_secs: exactly one of them"));
    }
    if req.env.len() > limits::MAX_RENTAL_ENV {
        return Err(invalid(format!("env: at most {} variables", limits::MAX_RENTAL_ENV)));
    }
    for (i, v) in req.env.iter().enumerate() {
        let b = v.name.as_bytes();
        let name_ok = !b.is_empty()
            && (b[0].is_ascii_alphabetic() || b[0] == b'_')
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
        if !name_ok || v.name.len() > limits::MAX_RENTAL_ENV_BYTES {
            return Err(invalid(format!(
                "env: {:?} is not a name ([A-Za-z_][A-Za-z0-9_]*, at most {} bytes)",
                truncate(&v.name, 64),
                limits::MAX_RENTAL_ENV_BYTES
            )));
        }
        // The GPUs are the platform's to choose and the agent's to enforce: a variable that the
        // container toolkit reads (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, …) or that
        // renumbers the GPUs a process sees is refused, not silently overridden.
        if v.name.starts_with("NVIDIA_") || v.name == "CUDA_VISIBLE_DEVICES" {
            return Err(invalid(format!(
                "env: {} is not allowed: the rented GPUs are the platform's to choose",
                v.name
            )));
        }
        if req.env[..i].iter().any(|w| w.name == v.name) {
            return Err(invalid(format!("env: {} is set twice", v.name)));
        }
        if v.value.len() > limits::MAX_RENTAL_ENV_BYTES || v.value.contains('\0') {
            return Err(invalid(format!(
                "env: the value of {} is over {} bytes or holds a NUL",
                v.name,
                limits::MAX_RENTAL_ENV_BYTES
            )));
        }
    }
    if req.ports.len() > limits::MAX_RENTAL_PORTS {
        return Err(invalid(format!("ports: at most {}", limits::MAX_RENTAL_PORTS)));
    }
    if req.ports.contains(&0) {
        return Err(invalid("ports: each 1 to 65535"));
    }
    if req.ports.iter().enumerate().any(|(i, p)| req.ports[..i].contains(p)) {
        return Err(invalid("ports: each port once"));
    }
    // The parts of the driver the container gets (issue 43): only the toolkit's names, which the
    // agent checks again (`gpum_protocol::driver`, one rule for both).
    gpum_protocol::driver::check_driver_capabilities(&req.driver_capabilities).map_err(invalid)?;
    if req.command.len() > limits::MAX_RENTAL_ARGS {
        return Err(invalid(format!("command: at most {} arguments", limits::MAX_RENTAL_ARGS)));
    }
    if req.command.iter().any(|a| a.len() > limits::MAX_RENTAL_ARG_BYTES || a.contains('\0')) {
        return Err(invalid(format!(
            "command: each argument at most {} bytes, no NUL",
            limits::MAX_RENTAL_ARG_BYTES
        )));
    }
    Ok(())
}

/// The GPUs (UUIDs) of `node_id` that its rentals hold at `now`: those of every listed rental
/// not yet expired, and of every other whose agent reported it and has not reported it `gone`
/// or `failed`.
pub fn held_gpus(conn: &Conn, node_id: &str, now: u64) -> Result<Vec<String>, ApiError> {
    let mut held = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT spec_json FROM rentals WHERE node_id = ?1 AND (
             (listed = 1 AND ends_at > ?2)
             OR (state IS NOT NULL AND state NOT IN (?3, ?4)))",
    )?;
    let specs = stmt
        .query_map(params![node_id, now as i64, RentalState::Gone, RentalState::Failed], |r| {
            r.get::<_, String>(0)
        })?;
    for s in specs {
        let spec: RentalSpec = serde_json::from_str(&s?)?;
        held.extend(spec.gpu_uuids);
    }
    Ok(held)
}

/// Creates a rental after checking all of it: 400 `invalid_request` naming the field, 404 for
/// a node that does not exist (or is deleted), 409 `node_not_rentable` for a node that cannot
/// take one now, 409 `gpus_unavailable` for GPUs it does not have free.
pub fn create(conn: &Conn, now: u64, req: &CreateRentalRequest) -> Result<RentalSummary, ApiError> {
    check_request(req)?;
    let registry = pinned_registry(&req.image).map_err(invalid)?;
    if !registries(conn)?.contains(&registry) {
        return Err(invalid(format!(
            "image: the registry {registry} is not one the platform accepts (rental-registries)"
        )));
    }
    store::live_node(conn, &req.node_id, &Scope::All)?;
    let node = node(conn, now, &req.node_id)?;
    let listed: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM rentals WHERE node_id = ?1 AND listed = 1 AND ends_at > ?2")?
        .query_row(params![req.node_id, now as i64], |r| r.get(0))?;
    let held = held_gpus(conn, &req.node_id, now)?;
    let Placement { gpu_uuids, ends_at } =
        placement::place(&node, &held, listed.max(0) as usize, req, now).map_err(refused)?;
    let spec = RentalSpec {
        id: store::new_id("rent-"),
        image: req.image.clone(),
        gpu_uuids,
        cpu_millis: req.cpu_millis,
        memory_mib: req.memory_mib,
        disk_gib: req.disk_gib,
        shm_mib: req.shm_mib,
        env: req.env.clone(),
        command: req.command.clone(),
        ends_at,
        ports: req.ports.clone(),
        driver_capabilities: req.driver_capabilities.clone(),
    };
    // The tenant's credential for the relay (issue 34): shown once, in this answer; the
    // database keeps only its SHA-256, like every other secret.
    let credential =
        (!spec.ports.is_empty()).then(|| format!("{TUNNEL_CREDENTIAL_PREFIX}{}", store::new_token()));
    conn.prepare_cached(
        "INSERT INTO rentals (id, node_id, spec_json, created_at, ends_at, tunnel_hash, price_per_gpu_hour)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        spec.id,
        req.node_id,
        serde_json::to_string(&spec)?,
        now as i64,
        ends_at as i64,
        credential.as_deref().map(store::hash_secret),
        // Issue 46: the server's price now is the rental's for good; a later change of the
        // server's price never reaches it. (Placement refused an unpriced server.)
        node.price_per_gpu_hour.map(|p| p as i64),
    ])?;
    // The heartbeat looks rentals up only until the latest end (an upper bound: a stopped one
    // costs a lookup that finds nothing, never a missed rental).
    conn.prepare_cached(
        "UPDATE nodes SET rentals_until = CASE WHEN rentals_until > ?1 THEN rentals_until ELSE ?1 END
         WHERE id = ?2",
    )?
    .execute(params![ends_at as i64, req.node_id])?;
    record(conn, &req.node_id, now, NodeEventKind::RentalCreated, &spec.id, &spec.image)?;
    let mut created = show(conn, now, &spec.id, &Scope::All)?;
    created.tunnel = credential.map(|credential| TunnelAccess {
        credential,
        ports: spec
            .ports
            .iter()
            .map(|&port| TunnelPort { port, target: tunnel_target(&spec.id, port) })
            .collect(),
    });
    Ok(created)
}

/// The API's answer to each refusal of the core's [`placement::place`]: 400 `invalid_request`
/// naming the field, 409 `node_not_rentable`, 409 `gpus_unavailable`.
pub fn refused(r: Refusal) -> ApiError {
    let not_rentable = |m: String| ApiError::new(ErrorCode::NodeNotRentable, m);
    let unavailable = |m: String| ApiError::new(ErrorCode::GpusUnavailable, m);
    match r {
        Refusal::Malformed(m) => invalid(m),
        Refusal::NotRentable { state, quarantine } => {
            // A quarantine's reason goes with it (what was left on which GPU).
            let why = quarantine.map(|q| format!(": {q}")).unwrap_or_default();
            not_rentable(format!("the server is not rentable: {}{why}", state.as_str()))
        }
        Refusal::TooShort { min_rental_minutes } => invalid(format!(
            "ends_at: at least the server's minimum rental time away ({min_rental_minutes} minutes)"
        )),
        Refusal::TooLong => invalid(format!("ends_at: at most {} days away", MAX_RENTAL_SECS / 86_400)),
        // Issue 46: the window is named, and what would place the rental.
        Refusal::Maintenance { window } => not_rentable(format!(
            "the server has maintenance planned from {} to {} (window {}): a rental on it must end by {}",
            store::iso_utc(window.starts_at as i64),
            store::iso_utc(window.ends_at as i64),
            window.id,
            store::iso_utc(window.starts_at as i64),
        )),
        Refusal::Cpu { cores } => invalid(format!("cpu_millis: at most the server's {cores} cores × 1000")),
        Refusal::Memory { ram_mib } => invalid(format!("memory_mib: at most the server's {ram_mib} MiB")),
        Refusal::Disk { disk_gib } => invalid(format!("disk_gib: at most the server's free {disk_gib} GiB")),
        Refusal::Full { limit } => not_rentable(format!("the server holds its limit of {limit} rentals")),
        Refusal::NotOwnGpu { uuid } => {
            unavailable(format!("GPU {} is not one of this server's", truncate(&uuid, 128)))
        }
        Refusal::HeldGpu { uuid } => unavailable(format!("GPU {uuid} is held by another rental")),
        Refusal::TooFewFree { free, total, asked } => {
            unavailable(format!("the server has {free} free GPUs of {total}, {asked} asked"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The relay's lookups (issue 34)

/// A rental a tenant may reach through the relay now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reachable {
    pub node_id: String,
    pub ports: Vec<u16>,
}

/// Why the relay refuses a tenant's `CONNECT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// No such rental, no credential, or not this one: 407, counted as a wrong token.
    WrongCredential,
    /// The credential is right, but the rental is stopped, expired or ended: 404.
    Ended,
}

/// Checks a tenant's credential for rental `id` and whether it can be reached at `now`. The
/// credential is compared by its SHA-256 (hex, a fixed-length comparison of hashes).
pub fn reachable(conn: &Conn, now: u64, id: &str, credential: &str) -> Result<Reachable, Unreachable> {
    /// node_id, spec_json, tunnel_hash, listed, ends_at, state.
    type Row = (String, String, Option<String>, bool, i64, Option<RentalState>);
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT node_id, spec_json, tunnel_hash, listed, ends_at, state FROM rentals WHERE id = ?1",
        )
        .and_then(|mut st| {
            st.query_row(params![id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
            })
            .optional()
        })
        .map_err(|e| {
            tracing::warn!(error = %e, "relay: could not look a rental up");
            Unreachable::Ended
        })?;
    let Some((node_id, spec_json, Some(hash), listed, ends_at, state)) = row else {
        return Err(Unreachable::WrongCredential);
    };
    if !credential.starts_with(TUNNEL_CREDENTIAL_PREFIX) || store::hash_secret(credential) != hash {
        return Err(Unreachable::WrongCredential);
    }
    live_row(now, node_id, &spec_json, listed, ends_at, state)
}

/// Whether rental `id` runs now: its node and ports, without a credential. For the replica that
/// holds a node's tunnel and is asked by another replica (`relay::mesh`), which checked the
/// tenant's credential itself; an unknown rental is [`Unreachable::Ended`].
pub fn live(conn: &Conn, now: u64, id: &str) -> Result<Reachable, Unreachable> {
    type Row = (String, String, bool, i64, Option<RentalState>);
    let row: Option<Row> = conn
        .prepare_cached("SELECT node_id, spec_json, listed, ends_at, state FROM rentals WHERE id = ?1")
        .and_then(|mut st| {
            st.query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
                .optional()
        })
        .map_err(|e| {
            tracing::warn!(error = %e, "relay: could not look a rental up");
            Unreachable::Ended
        })?;
    let Some((node_id, spec_json, listed, ends_at, state)) = row else {
        return Err(Unreachable::Ended);
    };
    live_row(now, node_id, &spec_json, listed, ends_at, state)
}

fn live_row(
    now: u64,
    node_id: String,
    spec_json: &str,
    listed: bool,
    ends_at: i64,
    state: Option<RentalState>,
) -> Result<Reachable, Unreachable> {
    let ended = matches!(
        state,
        Some(RentalState::Gone | RentalState::Failed | RentalState::Exited | RentalState::Stopping)
    );
    if !listed || ends_at <= now as i64 || ended {
        return Err(Unreachable::Ended);
    }
    let spec: RentalSpec = serde_json::from_str(spec_json).map_err(|_| Unreachable::Ended)?;
    Ok(Reachable { node_id, ports: spec.ports })
}

/// The node as the list shows it, with its verdict.
fn node(conn: &Conn, now: u64, id: &str) -> Result<NodeSummary, ApiError> {
    store::node(conn, now, id, &Scope::All)
}

// ---------------------------------------------------------------------------------------------
// Reading and stopping

const COLUMNS: &str =
    "node_id, spec_json, created_at, stopped_at, listed, ends_at, state, exit_code, reason, updated_at,
     price_per_gpu_hour, (SELECT value FROM settings WHERE key = 'currency')";

fn summary(r: &crate::sql::Row<'_>, now: u64) -> crate::sql::Result<(RentalSummary, String)> {
    let spec_json: String = r.get(1)?;
    let ends_at: i64 = r.get(5)?;
    let t = |v: Option<i64>| v.map(|x| x.max(0) as u64);
    Ok((
        RentalSummary {
            node_id: r.get(0)?,
            spec: RentalSpec::default(),
            created_at: r.get::<_, i64>(2)?.max(0) as u64,
            stopped_at: t(r.get(3)?),
            listed: r.get::<_, bool>(4)? && ends_at > now as i64,
            state: r.get(6)?,
            exit_code: r.get(7)?,
            reason: r.get(8)?,
            updated_at: t(r.get(9)?),
            tunnel: None,
            // Issue 46: fixed when it was created, in the platform's currency (RUB by default).
            price: r.get::<_, Option<i64>>(10)?.map(|p| gpum_protocol::RentalPrice {
                per_gpu_hour: p.max(0) as u64,
                currency: r
                    .get::<_, Option<String>>(11)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| gpum_platform_core::currency::DEFAULT.code.to_owned()),
            }),
        },
        spec_json,
    ))
}

fn finish(rows: Vec<(RentalSummary, String)>) -> Result<Vec<RentalSummary>, ApiError> {
    rows.into_iter()
        .map(|(mut s, json)| {
            s.spec = serde_json::from_str(&json)?;
            Ok(s)
        })
        .collect()
}

/// One rental within `scope`; `not_found` when there is none, or when it runs on another
/// owner's server. An owner sees it [`for_owner`].
pub fn show(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<RentalSummary, ApiError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM rentals WHERE id = ?1
             AND (CAST(?2 AS TEXT) IS NULL OR node_id IN (SELECT id FROM nodes WHERE owner_id = ?2))"
        ))?
        .query_row(params![id, scope.owner()], |r| summary(r, now))
        .optional()?
        .ok_or_else(|| ApiError::not_found("rental"))?;
    Ok(for_scope(finish(vec![row])?.remove(0), scope))
}

/// What an owner sees of a rental on their server: everything but the tenant's environment
/// values and command, which may carry the tenant's secrets (names of the variables stay).
pub fn for_owner(mut s: RentalSummary) -> RentalSummary {
    for v in &mut s.spec.env {
        v.value.clear();
    }
    s.spec.command.clear();
    s
}

fn for_scope(s: RentalSummary, scope: &Scope) -> RentalSummary {
    match scope {
        Scope::All => s,
        Scope::Owner(_) => for_owner(s),
    }
}

/// The most rentals one listing gives.
pub const MAX_LISTED: usize = 1000;

/// The rentals within `scope`, newest first, at most `limit` (and [`MAX_LISTED`]); of one node
/// when `node_id` is given (a node that does not exist, or is another owner's, has none).
pub fn list(
    conn: &Conn,
    now: u64,
    node_id: Option<&str>,
    limit: usize,
    scope: &Scope,
) -> Result<RentalList, ApiError> {
    let rows = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM rentals WHERE (CAST(?1 AS TEXT) IS NULL OR node_id = ?1)
             AND (CAST(?3 AS TEXT) IS NULL OR node_id IN (SELECT id FROM nodes WHERE owner_id = ?3))
             ORDER BY created_at DESC, rowid DESC LIMIT ?2"
        ))?
        .query_map(params![node_id, limit.min(MAX_LISTED) as i64, scope.owner()], |r| summary(r, now))?
        .collect::<Result<Vec<_>, _>>()?;
    let rentals = finish(rows)?.into_iter().map(|s| for_scope(s, scope)).collect();
    Ok(RentalList { rentals })
}

/// Stops a rental: the platform stops listing it, so its agent tears it down and reports
/// `stopping`, then `gone`. Stopping one that is already stopped changes nothing.
pub fn stop(conn: &Conn, now: u64, id: &str) -> Result<RentalSummary, ApiError> {
    let node_id: String = conn
        .prepare_cached("SELECT node_id FROM rentals WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| ApiError::not_found("rental"))?;
    let changed = conn
        .prepare_cached(
            "UPDATE rentals SET stopped_at = ?1, listed = 0 WHERE id = ?2 AND stopped_at IS NULL",
        )?
        .execute(params![now as i64, id])?;
    if changed > 0 {
        record(conn, &node_id, now, NodeEventKind::RentalStopped, id, "")?;
    }
    // Its tenants' streams close now, on every replica, not when the agent next hears of it.
    crate::effects::record(conn, now, &crate::effects::rules::rental_stopped(id, changed > 0))?;
    show(conn, now, id, &Scope::All)
}

/// Node `node_id`'s open rentals end (`reason`: its node deleted, its owner disabled): none is
/// listed any more, and each not stopped yet records why. Returns those that ended: their
/// streams must close.
pub fn end_for_node(conn: &Conn, now: u64, node_id: &str, reason: &str) -> Result<Vec<String>, ApiError> {
    let ended: Vec<String> = conn
        .prepare_cached("SELECT id FROM rentals WHERE node_id = ?1 AND (listed = 1 OR stopped_at IS NULL)")?
        .query_map(params![node_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    conn.prepare_cached(
        "UPDATE rentals SET stopped_at = COALESCE(stopped_at, ?1), listed = 0,
             reason = CASE WHEN stopped_at IS NULL THEN ?3 ELSE reason END
         WHERE node_id = ?2 AND (listed = 1 OR stopped_at IS NULL)",
    )?
    .execute(params![now as i64, node_id, reason])?;
    Ok(ended)
}

// ---------------------------------------------------------------------------------------------
// The heartbeat

/// The rentals the heartbeat answer carries: listed and not expired, oldest first. One lookup
/// by the partial index `rentals_listed`; a node with no rental finds nothing in it. (SQLite is
/// told the index, so that a test can prove when the lookup runs; PostgreSQL has no such hint
/// and picks the partial index itself.)
pub fn desired(conn: &Conn, now: u64, node_id: &str) -> Result<Vec<RentalSpec>, ApiError> {
    let mut stmt = conn.prepare_cached(match conn.engine() {
        Engine::Sqlite => {
            "SELECT spec_json FROM rentals INDEXED BY rentals_listed
             WHERE node_id = ?1 AND listed = 1 AND ends_at > ?2 ORDER BY created_at, rowid LIMIT ?3"
        }
        Engine::Postgres => {
            "SELECT spec_json FROM rentals
             WHERE node_id = ?1 AND listed = 1 AND ends_at > ?2 ORDER BY created_at, rowid LIMIT ?3"
        }
    })?;
    let rows = stmt.query_map(params![node_id, now as i64, limits::MAX_RENTALS_PER_NODE as i64], |r| {
        r.get::<_, String>(0)
    })?;
    let mut out = Vec::new();
    for json in rows {
        out.push(serde_json::from_str(&json?)?);
    }
    Ok(out)
}

/// A rental's reported state, exit code and reason, and when it first ran.
type ReportRow = (Option<RentalState>, Option<i64>, Option<String>, Option<i64>);

/// Records the agent's reports, each for one of this node's own rentals only (another id is
/// ignored), and only when it changes something; an event on each transition. A rental
/// reported `gone` or `failed` is no longer listed.
pub fn record_reports(
    conn: &Conn,
    now: u64,
    node_id: &str,
    reports: &[RentalReport],
) -> Result<(), ApiError> {
    for rep in reports {
        if rep.id.len() > 64 {
            continue;
        }
        let row: Option<ReportRow> = conn
            .prepare_cached(
                "SELECT state, exit_code, reason, started_at FROM rentals WHERE id = ?1 AND node_id = ?2",
            )?
            .query_row(params![rep.id, node_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()?;
        let Some((old_state, old_code, old_reason, started_at)) = row else { continue };
        let reason = rep.reason.as_deref().map(|r| truncate(r, MAX_REASON_LEN));
        let same_state = old_state == Some(rep.state);
        if same_state && old_code == rep.exit_code && (reason.is_none() || old_reason == reason) {
            continue;
        }
        let ends = matches!(rep.state, RentalState::Gone | RentalState::Failed);
        conn.prepare_cached(
            "UPDATE rentals SET state = ?1, exit_code = ?2, reason = COALESCE(?3, reason), updated_at = ?4,
                 started_at = CASE WHEN ?7 THEN COALESCE(started_at, ?4) ELSE started_at END,
                 listed = CASE WHEN ?5 THEN 0 ELSE listed END
             WHERE id = ?6",
        )?
        .execute(params![
            rep.state,
            rep.exit_code,
            reason,
            now as i64,
            ends,
            rep.id,
            rep.state == RentalState::Running
        ])?;
        if same_state {
            continue;
        }
        let id = rep.id.as_str();
        match rep.state {
            RentalState::Running if started_at.is_none() => {
                record(conn, node_id, now, NodeEventKind::RentalStarted, id, "")?
            }
            RentalState::Exited => {
                let code = rep.exit_code.map(|c| c.to_string()).unwrap_or_default();
                record(conn, node_id, now, NodeEventKind::RentalExited, id, &code)?
            }
            RentalState::Gone => record(conn, node_id, now, NodeEventKind::RentalGone, id, "")?,
            RentalState::Failed => {
                record(conn, node_id, now, NodeEventKind::RentalFailed, id, reason.as_deref().unwrap_or(""))?
            }
            _ => {}
        }
    }
    Ok(())
}

/// The state a summary shows in words for the CLI: the agent's, else what the platform knows.
pub fn state_word(s: &RentalSummary) -> String {
    match (s.state, s.listed, s.stopped_at) {
        (Some(st), _, _) => st.as_str().into(),
        (None, true, _) => "pending".into(),
        (None, false, Some(_)) => "stopped".into(),
        (None, false, None) => "expired".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::{
        EnvVar, GpuPublic, Health, HeartbeatRequest, Inventory, NvmlState, ProbeReport, RegisterRequest,
        RentableState, UpdateNodeRequest, VerificationState,
    };

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const T0: u64 = 1_000_000;

    /// A fresh database on the engine of `GPUM_TEST_DB` (`crate::testdb`).
    fn db() -> (crate::testdb::TestDb, Conn) {
        let t = crate::testdb::TestDb::new();
        let c = t.open();
        (t, c)
    }

    fn inventory(tag: &str) -> Inventory {
        let mut inv = Inventory::default();
        inv.private.gpu_uuids = (0..4).map(|i| format!("GPU-{tag}-{i}")).collect();
        inv.public.gpus = vec![GpuPublic { model: "H100".into(), vram_mib: 81_920 }; 4];
        inv.public.cpu_cores = 32;
        inv.public.ram_mib = 262_144;
        inv.public.disk_gib = 1000;
        inv
    }

    /// A node that is rentable at `T0`: four GPUs, verified, priced, beating; its token.
    fn node(c: &Conn, tag: &str) -> (String, String) {
        node_of(c, tag, &Scope::All)
    }

    /// [`node`], registered with a join code of `scope`'s (so it is that owner's server).
    fn node_of(c: &Conn, tag: &str, scope: &Scope) -> (String, String) {
        let code = store::create_join_code(c, T0, 3600, scope).unwrap().code;
        let req = RegisterRequest {
            join_code: code,
            agent_version: "1".into(),
            inventory: inventory(tag),
            install_id: None,
        };
        let r = store::register(c, T0, &req, 10).unwrap();
        let upd = UpdateNodeRequest { price_per_gpu_hour: Some(Some(100)), ..Default::default() };
        store::update_node(c, &r.node_id, &upd, &Scope::All).unwrap();
        let mut hb = beat(1, vec![]);
        hb.probe = Some(ProbeReport {
            state: VerificationState::Verified,
            reason: None,
            output: String::new(),
            finished_at: T0,
            image: String::new(),
        });
        store::heartbeat(c, T0, &r.node_token, &hb, 10).unwrap();
        (r.node_id, r.node_token)
    }

    fn beat(seq: u64, rentals: Vec<RentalReport>) -> HeartbeatRequest {
        HeartbeatRequest {
            seq,
            inventory_hash: inventory("x").hash(),
            health: Health { docker_ok: true, nvml: NvmlState::Ok, ..Default::default() },
            rentals,
            ..Default::default()
        }
    }

    fn req(node_id: &str) -> CreateRentalRequest {
        CreateRentalRequest {
            node_id: node_id.into(),
            image: format!("nvcr.io/nvidia/pytorch@sha256:{H}"),
            gpus: Some(1),
            cpu_millis: 4000,
            memory_mib: 16_384,
            disk_gib: 50,
            shm_mib: 1024,
            duration_secs: Some(2 * 3600),
            ..Default::default()
        }
    }

    fn refused(c: &Conn, r: &CreateRentalRequest) -> (ErrorCode, String) {
        let e = create(c, T0, r).unwrap_err();
        (e.code, e.message)
    }

    /// Each refusal of the core's placement answers what `create` answered before the rules
    /// moved there: the same code and the same message.
    #[test]
    fn each_refusal_answers_its_code_and_message() {
        use ErrorCode::{GpusUnavailable as G, InvalidRequest as I, NodeNotRentable as N};
        let long = "x".repeat(300);
        let cases = [
            (
                Refusal::Malformed("ends_at, duration_secs: exactly one of them"),
                I,
                "ends_at, duration_secs: exactly one of them".to_string(),
            ),
            (
                Refusal::NotRentable { state: RentableState::Paused, quarantine: None },
                N,
                "the server is not rentable: paused".into(),
            ),
            (
                Refusal::NotRentable { state: RentableState::Quarantined, quarantine: Some("left".into()) },
                N,
                "the server is not rentable: quarantined: left".into(),
            ),
            (
                Refusal::TooShort { min_rental_minutes: 60 },
                I,
                "ends_at: at least the server's minimum rental time away (60 minutes)".into(),
            ),
            (Refusal::TooLong, I, "ends_at: at most 366 days away".into()),
            (
                Refusal::Maintenance {
                    window: gpum_protocol::MaintenanceWindow {
                        id: "mw-1".into(),
                        starts_at: 1_796_601_000,
                        ends_at: 1_796_608_200,
                        created_at: 1,
                    },
                },
                N,
                "the server has maintenance planned from 2026-12-06T23:50:00Z to 2026-12-07T01:50:00Z \
                 (window mw-1): a rental on it must end by 2026-12-06T23:50:00Z"
                    .into(),
            ),
            (Refusal::Cpu { cores: 8 }, I, "cpu_millis: at most the server's 8 cores × 1000".into()),
            (Refusal::Memory { ram_mib: 512 }, I, "memory_mib: at most the server's 512 MiB".into()),
            (Refusal::Disk { disk_gib: 5 }, I, "disk_gib: at most the server's free 5 GiB".into()),
            (Refusal::Full { limit: 64 }, N, "the server holds its limit of 64 rentals".into()),
            (Refusal::NotOwnGpu { uuid: "GPU-9".into() }, G, "GPU GPU-9 is not one of this server's".into()),
            (
                Refusal::NotOwnGpu { uuid: long.clone() },
                G,
                format!("GPU {} is not one of this server's", truncate(&long, 128)),
            ),
            (Refusal::HeldGpu { uuid: "GPU-1".into() }, G, "GPU GPU-1 is held by another rental".into()),
            (
                Refusal::TooFewFree { free: 1, total: 4, asked: 2 },
                G,
                "the server has 1 free GPUs of 4, 2 asked".into(),
            ),
        ];
        for (r, code, message) in cases {
            let e = super::refused(r.clone());
            assert_eq!((e.code, e.message), (code, message), "{r:?}");
        }
    }

    fn count(c: &Conn) -> i64 {
        c.query_row("SELECT COUNT(*) FROM rentals", [], |r| r.get(0)).unwrap()
    }

    /// Each rule refuses on its own, names its field, and nothing is written.
    #[test]
    fn each_validation_rule_refuses_before_anything_is_written() {
        let (_d, c) = db();
        let (id, _) = node(&c, "a");
        let base = req(&id);
        type Change = Box<dyn Fn(&mut CreateRentalRequest)>;
        let cases: Vec<(&str, Change)> = vec![
            ("image", Box::new(|r| r.image = "nvcr.io/nvidia/pytorch:24.01".into())),
            ("image", Box::new(|r| r.image = format!("nvcr.io/nvidia/pytorch:24.01@sha256:{H}"))),
            ("image", Box::new(|r| r.image = format!("nvcr.io/nvidia/pytorch@sha256:{}", &H[1..]))),
            ("image", Box::new(|r| r.image = format!("Bad Name@sha256:{H}"))),
            ("registry 10.0.0.5:5000", Box::new(|r| r.image = format!("10.0.0.5:5000/x@sha256:{H}"))),
            ("gpus, gpu_uuids", Box::new(|r| r.gpu_uuids = Some(vec!["GPU-a-0".into()]))),
            ("gpus, gpu_uuids", Box::new(|r| r.gpus = None)),
            ("gpus: 1 to", Box::new(|r| r.gpus = Some(0))),
            (
                "gpu_uuids: each GPU once",
                Box::new(|r| {
                    r.gpus = None;
                    r.gpu_uuids = Some(vec!["GPU-a-0".into(), "GPU-a-0".into()]);
                }),
            ),
            ("cpu_millis: at least", Box::new(|r| r.cpu_millis = 10)),
            ("cpu_millis: at most", Box::new(|r| r.cpu_millis = 32_001)),
            ("memory_mib: at least", Box::new(|r| r.memory_mib = 1)),
            ("memory_mib: at most", Box::new(|r| r.memory_mib = 262_145)),
            ("shm_mib", Box::new(|r| r.shm_mib = 16_385)),
            ("shm_mib", Box::new(|r| r.shm_mib = 0)),
            ("disk_gib: at least", Box::new(|r| r.disk_gib = 0)),
            ("disk_gib: at most", Box::new(|r| r.disk_gib = 1001)),
            ("ends_at, duration_secs", Box::new(|r| r.ends_at = Some(T0 + 7200))),
            ("ends_at, duration_secs", Box::new(|r| r.duration_secs = None)),
            ("ends_at: at least", Box::new(|r| r.duration_secs = Some(59 * 60))),
            (
                "ends_at: at least",
                Box::new(|r| {
                    r.duration_secs = None;
                    r.ends_at = Some(T0 - 1);
                }),
            ),
            ("ends_at: at most", Box::new(|r| r.duration_secs = Some(MAX_RENTAL_SECS + 1))),
            ("env: \"1X\"", Box::new(|r| r.env = vec![EnvVar { name: "1X".into(), value: "v".into() }])),
            ("env: \"A-B\"", Box::new(|r| r.env = vec![EnvVar { name: "A-B".into(), value: "v".into() }])),
            (
                "NVIDIA_VISIBLE_DEVICES is not allowed",
                Box::new(|r| {
                    r.env = vec![EnvVar { name: "NVIDIA_VISIBLE_DEVICES".into(), value: "all".into() }]
                }),
            ),
            (
                "NVIDIA_DRIVER_CAPABILITIES is not allowed",
                Box::new(|r| {
                    r.env = vec![EnvVar { name: "NVIDIA_DRIVER_CAPABILITIES".into(), value: "all".into() }]
                }),
            ),
            (
                "CUDA_VISIBLE_DEVICES is not allowed",
                Box::new(|r| {
                    r.env = vec![EnvVar { name: "CUDA_VISIBLE_DEVICES".into(), value: "0,1".into() }]
                }),
            ),
            ("set twice", Box::new(|r| r.env = vec![EnvVar { name: "A".into(), value: "1".into() }; 2])),
            (
                "env: the value",
                Box::new(|r| {
                    r.env =
                        vec![EnvVar { name: "A".into(), value: "x".repeat(limits::MAX_RENTAL_ENV_BYTES + 1) }]
                }),
            ),
            (
                "env: at most",
                Box::new(|r| {
                    r.env = (0..=limits::MAX_RENTAL_ENV)
                        .map(|i| EnvVar { name: format!("V{i}"), value: "1".into() })
                        .collect()
                }),
            ),
            ("command: at most", Box::new(|r| r.command = vec!["a".into(); limits::MAX_RENTAL_ARGS + 1])),
            ("command: each argument", Box::new(|r| r.command = vec!["a\0b".into()])),
            ("driver_capabilities: \"all\"", Box::new(|r| r.driver_capabilities = vec!["all".into()])),
            ("driver_capabilities: \"gpu\"", Box::new(|r| r.driver_capabilities = vec!["gpu".into()])),
            (
                "driver_capabilities: compute is listed twice",
                Box::new(|r| r.driver_capabilities = vec!["compute".into(), "compute".into()]),
            ),
        ];
        for (want, f) in cases {
            let mut r = base.clone();
            f(&mut r);
            let (code, msg) = refused(&c, &r);
            assert_eq!(code, ErrorCode::InvalidRequest, "{want}: {msg}");
            assert!(msg.contains(want), "wanted {want:?} in {msg:?}");
        }
        assert_eq!(count(&c), 0);
        // Within the rules, it is created; an ends_at instead of a duration, too.
        create(&c, T0, &base).unwrap();
        let mut at = base.clone();
        at.duration_secs = None;
        at.ends_at = Some(T0 + 3600);
        at.env = vec![EnvVar { name: "_MY_VAR1".into(), value: "x=y".into() }];
        at.driver_capabilities = vec!["utility".into(), "compute".into(), "video".into()];
        let made = create(&c, T0, &at).unwrap();
        assert_eq!(made.spec.driver_capabilities, ["utility", "compute", "video"], "carried to the agent");
        assert_eq!(count(&c), 2);
    }

    #[test]
    fn the_registries_are_the_platforms_setting() {
        let (_d, c) = db();
        let (id, _) = node(&c, "a");
        let mut r = req(&id);
        r.image = format!("registry.example.com:5000/team/job@sha256:{H}");
        assert!(refused(&c, &r).1.contains("registry registry.example.com:5000 is not one"));
        set_registries(&c, Some(&["Registry.Example.com:5000".into()])).unwrap();
        create(&c, T0, &r).unwrap();
        // nvcr.io is no longer accepted once the list is the operator's own.
        assert!(refused(&c, &req(&id)).1.contains("registry nvcr.io"));
        assert!(set_registries(&c, Some(&["not a host".into()])).is_err());
        assert_eq!(set_registries(&c, None).unwrap(), DEFAULT_RENTAL_REGISTRIES.map(String::from));
        // Docker Hub names without a registry are docker.io's.
        assert_eq!(pinned_registry(&format!("busybox@sha256:{H}")).unwrap(), "docker.io");
        assert_eq!(
            pinned_registry(&format!("index.docker.io/library/busybox@sha256:{H}")).unwrap(),
            "docker.io"
        );
    }

    /// The node must be rentable by the one verdict; the GPUs must be its own and free.
    #[test]
    fn a_node_that_cannot_take_it_is_refused_with_409() {
        let (_d, c) = db();
        let (id, _) = node(&c, "a");
        // Paused.
        let pause = |p| UpdateNodeRequest { paused: Some(p), ..Default::default() };
        store::update_node(&c, &id, &pause(true), &Scope::All).unwrap();
        let (code, msg) = refused(&c, &req(&id));
        assert_eq!((code, msg.as_str()), (ErrorCode::NodeNotRentable, "the server is not rentable: paused"));
        store::update_node(&c, &id, &pause(false), &Scope::All).unwrap();
        // Offline.
        let e = create(&c, T0 + 61, &req(&id)).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::NodeNotRentable, "the server is not rentable: offline")
        );
        // Not verified.
        let (id2, tok2) = node(&c, "b");
        let mut hb = beat(2, vec![]);
        hb.probe = Some(ProbeReport {
            state: VerificationState::Failed,
            reason: None,
            output: String::new(),
            finished_at: T0,
            image: String::new(),
        });
        store::heartbeat(&c, T0, &tok2, &hb, 10).unwrap();
        assert_eq!(refused(&c, &req(&id2)).1, "the server is not rentable: check_failed");
        // Deleted, or unknown.
        let (id3, _) = node(&c, "c");
        store::delete_node(&c, T0, &id3, &Scope::All).unwrap();
        assert_eq!(refused(&c, &req(&id3)).0, ErrorCode::NotFound);
        assert_eq!(refused(&c, &req("node-nope")).0, ErrorCode::NotFound);
        // Another node's GPU, or more GPUs than it has.
        let mut r = req(&id);
        r.gpus = None;
        r.gpu_uuids = Some(vec!["GPU-b-0".into()]);
        assert_eq!(refused(&c, &r).0, ErrorCode::GpusUnavailable);
        let mut r = req(&id);
        r.gpus = Some(5);
        let (code, msg) = refused(&c, &r);
        assert_eq!(
            (code, msg.as_str()),
            (ErrorCode::GpusUnavailable, "the server has 4 free GPUs of 4, 5 asked")
        );
        assert_eq!(count(&c), 0);
    }

    /// A quarantine the agent reports: stored, the verdict `quarantined` with its reason (before
    /// any other but offline), a new rental refused with 409 naming it, one event per change, and
    /// a heartbeat without it lifts it.
    #[test]
    fn a_quarantined_node_is_refused_until_its_agent_lifts_it() {
        let (_d, c) = db();
        let (id, tok) = node(&c, "q");
        let events = |kind: NodeEventKind| {
            store::node_events(&c, &id, T0 + 100, 256, &Scope::All)
                .unwrap()
                .events
                .into_iter()
                .filter(|e| e.kind == kind)
                .map(|e| e.detail)
                .collect::<Vec<_>>()
        };
        let q = gpum_protocol::Quarantine {
            reason: "GPU check after rental rent-0000000000000001 failed: GPU-q-0: 1 process left (pid 4242)"
                .into(),
            since: T0 + 5,
            gpu_uuids: vec!["GPU-q-0".into()],
        };
        for seq in 2..5 {
            let hb = HeartbeatRequest { quarantine: Some(q.clone()), ..beat(seq, vec![]) };
            store::heartbeat(&c, T0 + seq, &tok, &hb, 10).unwrap();
        }
        let n = node_summary(&c, &id);
        assert_eq!(n.quarantine.as_ref(), Some(&q));
        assert_eq!(
            n.rentable,
            gpum_protocol::Rentable { state: RentableState::Quarantined, since: Some(T0 + 5) }
        );
        let (code, msg) = refused(&c, &req(&id));
        assert_eq!(code, ErrorCode::NodeNotRentable);
        assert_eq!(msg, format!("the server is not rentable: quarantined: {}", q.reason));
        assert_eq!(count(&c), 0);
        assert_eq!(events(NodeEventKind::Quarantined), vec![q.reason.clone()], "once, not per beat");
        // A reason far too long is cut when stored.
        let long = gpum_protocol::Quarantine { reason: "x".repeat(100_000), ..q.clone() };
        store::heartbeat(
            &c,
            T0 + 6,
            &tok,
            &HeartbeatRequest { quarantine: Some(long), ..beat(6, vec![]) },
            10,
        )
        .unwrap();
        assert_eq!(node_summary(&c, &id).quarantine.unwrap().reason.len(), limits::MAX_TEXT_LEN);
        // Lifted: rentable again, and the log says so once.
        for seq in 7..9 {
            store::heartbeat(&c, T0 + seq, &tok, &beat(seq, vec![]), 10).unwrap();
        }
        let n = node_summary(&c, &id);
        assert_eq!((n.quarantine, n.rentable.state), (None, RentableState::Rentable));
        assert_eq!(events(NodeEventKind::QuarantineLifted).len(), 1);
        assert_eq!(events(NodeEventKind::Quarantined).len(), 2);
        create(&c, T0 + 9, &req(&id)).unwrap();
    }

    fn node_summary(c: &Conn, id: &str) -> NodeSummary {
        store::node(c, T0 + 10, id, &Scope::All).unwrap()
    }

    /// Two rentals never share a GPU: a GPU is held while listed, and after that until the agent
    /// reports it gone.
    #[test]
    fn two_rentals_never_share_a_gpu() {
        let (_d, c) = db();
        let (id, tok) = node(&c, "a");
        let mut three = req(&id);
        three.gpus = Some(3);
        let a = create(&c, T0, &three).unwrap();
        assert_eq!(a.spec.gpu_uuids, ["GPU-a-0", "GPU-a-1", "GPU-a-2"]);
        let mut two = req(&id);
        two.gpus = Some(2);
        assert_eq!(refused(&c, &two).0, ErrorCode::GpusUnavailable);
        let mut named = req(&id);
        named.gpus = None;
        named.gpu_uuids = Some(vec!["GPU-a-1".into()]);
        let (code, msg) = refused(&c, &named);
        assert_eq!(
            (code, msg.as_str()),
            (ErrorCode::GpusUnavailable, "GPU GPU-a-1 is held by another rental")
        );
        let b = create(&c, T0, &req(&id)).unwrap();
        assert_eq!(b.spec.gpu_uuids, ["GPU-a-3"]);
        assert_eq!(refused(&c, &req(&id)).0, ErrorCode::GpusUnavailable);

        // Stopped, but the agent runs it still: its GPUs stay held until it reports `gone`.
        let rep = |state| RentalReport { id: a.spec.id.clone(), state, exit_code: None, reason: None };
        store::heartbeat(&c, T0 + 1, &tok, &beat(2, vec![rep(RentalState::Running)]), 10).unwrap();
        stop(&c, T0 + 2, &a.spec.id).unwrap();
        assert_eq!(refused(&c, &req(&id)).0, ErrorCode::GpusUnavailable);
        store::heartbeat(&c, T0 + 3, &tok, &beat(3, vec![rep(RentalState::Stopping)]), 10).unwrap();
        assert_eq!(refused(&c, &req(&id)).0, ErrorCode::GpusUnavailable);
        store::heartbeat(&c, T0 + 4, &tok, &beat(4, vec![rep(RentalState::Gone)]), 10).unwrap();
        let mut again = req(&id);
        again.gpus = Some(3);
        assert_eq!(create(&c, T0 + 5, &again).unwrap().spec.gpu_uuids, ["GPU-a-0", "GPU-a-1", "GPU-a-2"]);

        // One the agent never reported holds nothing once it is no longer listed.
        let (id2, _) = node(&c, "b");
        let mut all = req(&id2);
        all.gpus = Some(4);
        let x = create(&c, T0, &all).unwrap();
        assert_eq!(refused(&c, &all).0, ErrorCode::GpusUnavailable);
        stop(&c, T0 + 1, &x.spec.id).unwrap();
        create(&c, T0 + 2, &all).unwrap();
    }

    /// The heartbeat carries exactly the listed rentals, whole; a stopped or expired one is no
    /// longer carried.
    #[test]
    fn the_heartbeat_carries_exactly_the_live_rentals() {
        let (_d, c) = db();
        let (id, tok) = node(&c, "a");
        let (other, _) = node(&c, "b");
        let hb = |at, seq| store::heartbeat(&c, at, &tok, &beat(seq, vec![]), 10).unwrap().rentals;
        assert!(hb(T0, 2).is_empty());
        let short = create(&c, T0, &req(&id)).unwrap(); // ends at T0 + 2 h
        let mut long = req(&id);
        long.duration_secs = Some(5 * 3600);
        long.command = vec!["python".into(), "train.py".into()];
        let long = create(&c, T0, &long).unwrap();
        let stopped = create(&c, T0, &req(&id)).unwrap();
        create(&c, T0, &req(&other)).unwrap();
        assert_eq!(hb(T0 + 1, 3), [short.spec.clone(), long.spec.clone(), stopped.spec.clone()]);
        stop(&c, T0 + 2, &stopped.spec.id).unwrap();
        assert_eq!(hb(T0 + 3, 4), [short.spec.clone(), long.spec.clone()]);
        // Expired at ends_at exactly.
        assert_eq!(hb(short.spec.ends_at - 1, 5), [short.spec.clone(), long.spec.clone()]);
        assert_eq!(hb(short.spec.ends_at, 6), std::slice::from_ref(&long.spec));
        let s = show(&c, short.spec.ends_at, &short.spec.id, &Scope::All).unwrap();
        assert!(!s.listed && s.stopped_at.is_none());
        assert_eq!(state_word(&s), "expired");
        // The lookup is the partial index's (PostgreSQL's planner would rather scan a table this
        // small, so it is told not to, to show that the index serves the query).
        let query = "SELECT spec_json FROM rentals
                     WHERE node_id = 'n' AND listed = 1 AND ends_at > 0 ORDER BY created_at";
        let plan: String = match c.engine() {
            Engine::Sqlite => c.query_row(&format!("EXPLAIN QUERY PLAN {query}"), [], |r| r.get(3)).unwrap(),
            Engine::Postgres => {
                c.execute_batch("SET enable_seqscan = off").unwrap();
                let lines: Vec<String> = c
                    .prepare_cached(&format!("EXPLAIN {query}"))
                    .unwrap()
                    .query_map([], |r| r.get(0))
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                lines.join("\n")
            }
        };
        assert!(plan.contains("rentals_listed"), "{plan}");
    }

    /// Reports are recorded only for the node's own rentals, and each transition is one event.
    #[test]
    fn reports_move_only_own_rentals_and_events_come_once_per_transition() {
        let (_d, c) = db();
        let (id, tok) = node(&c, "a");
        let (other, other_tok) = node(&c, "b");
        let r = create(&c, T0, &req(&id)).unwrap();
        let theirs = create(&c, T0, &req(&other)).unwrap();
        let rep = |id: &str, state, exit_code, reason: Option<&str>| RentalReport {
            id: id.into(),
            state,
            exit_code,
            reason: reason.map(String::from),
        };
        let send = |at, seq, tok: &str, reps| store::heartbeat(&c, at, tok, &beat(seq, reps), 10).unwrap();
        // Node b reports node a's rental: ignored.
        send(T0 + 1, 2, &other_tok, vec![rep(&r.spec.id, RentalState::Failed, None, Some("x"))]);
        assert_eq!(show(&c, T0 + 1, &r.spec.id, &Scope::All).unwrap().state, None);
        for (i, st) in
            [RentalState::Pulling, RentalState::Starting, RentalState::Running, RentalState::Running]
                .into_iter()
                .enumerate()
        {
            send(T0 + 2 + i as u64, 3 + i as u64, &tok, vec![rep(&r.spec.id, st, None, None)]);
        }
        let s = show(&c, T0 + 9, &r.spec.id, &Scope::All).unwrap();
        assert_eq!((s.state, s.updated_at, s.listed), (Some(RentalState::Running), Some(T0 + 4), true));
        send(T0 + 10, 10, &tok, vec![rep(&r.spec.id, RentalState::Exited, Some(3), None)]);
        send(T0 + 11, 11, &tok, vec![rep(&r.spec.id, RentalState::Exited, Some(3), None)]);
        send(T0 + 12, 12, &tok, vec![rep(&r.spec.id, RentalState::Failed, None, Some("teardown: GPU busy"))]);
        let s = show(&c, T0 + 12, &r.spec.id, &Scope::All).unwrap();
        assert_eq!(
            (s.state, s.exit_code, s.reason.as_deref(), s.listed),
            (Some(RentalState::Failed), None, Some("teardown: GPU busy"), false)
        );
        // Node b's own rental, unknown ids and long ids: nothing breaks.
        send(
            T0 + 13,
            13,
            &other_tok,
            vec![
                rep(&theirs.spec.id, RentalState::Running, None, None),
                rep("rent-unknown", RentalState::Running, None, None),
                rep(&"x".repeat(5000), RentalState::Running, None, None),
            ],
        );
        let events = store::node_events(&c, &id, T0 + 14, 100, &Scope::All).unwrap().events;
        let rental: Vec<(NodeEventKind, String, String)> = events
            .iter()
            .rev()
            .filter(|e| e.kind.as_str().starts_with("rental_"))
            .map(|e| (e.kind, e.subject.clone(), e.detail.clone()))
            .collect();
        let rid = r.spec.id.clone();
        assert_eq!(
            rental,
            [
                (NodeEventKind::RentalCreated, rid.clone(), r.spec.image.clone()),
                (NodeEventKind::RentalStarted, rid.clone(), String::new()),
                (NodeEventKind::RentalExited, rid.clone(), "3".into()),
                (NodeEventKind::RentalFailed, rid.clone(), "teardown: GPU busy".into()),
            ]
        );
        // A stop is one event, a second stop none; gone is one event.
        let r2 = create(&c, T0 + 20, &req(&id)).unwrap();
        stop(&c, T0 + 21, &r2.spec.id).unwrap();
        stop(&c, T0 + 22, &r2.spec.id).unwrap();
        send(T0 + 23, 23, &tok, vec![rep(&r2.spec.id, RentalState::Gone, None, None)]);
        send(T0 + 24, 24, &tok, vec![rep(&r2.spec.id, RentalState::Gone, None, None)]);
        let events = store::node_events(&c, &id, T0 + 25, 100, &Scope::All).unwrap().events;
        let n = |k| events.iter().filter(|e| e.kind == k && e.subject == r2.spec.id).count();
        assert_eq!((n(NodeEventKind::RentalStopped), n(NodeEventKind::RentalGone)), (1, 1));
        // Too many reports are refused with the limits' error.
        let many = vec![rep(&r2.spec.id, RentalState::Gone, None, None); limits::MAX_RENTAL_REPORTS + 1];
        let e = store::heartbeat(&c, T0 + 26, &tok, &beat(26, many), 10).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest);
    }

    /// A node that never had a rental, or whose rentals all ended, beats without the rental
    /// lookup; one with a rental that can still be listed runs it. Proved by taking the lookup's
    /// index away: the lookup names it (`INDEXED BY`, SQLite's), so only a beat that runs it
    /// fails.
    #[test]
    fn a_beat_looks_rentals_up_only_while_one_can_be_listed() {
        let d = crate::testdb::TestDb::on(Engine::Sqlite);
        let c = d.open();
        let (_, never) = node(&c, "a");
        let (id, had) = node(&c, "b");
        let (busy_id, busy) = node(&c, "c");
        let r = create(&c, T0, &req(&id)).unwrap();
        create(&c, T0, &req(&busy_id)).unwrap();
        // Past the end of `b`'s only rental; `c` gets a longer one.
        let mut long = req(&busy_id);
        long.duration_secs = Some(10 * 3600);
        create(&c, T0, &long).unwrap();
        let after = r.spec.ends_at;
        c.execute_batch("DROP INDEX rentals_listed").unwrap();
        store::heartbeat(&c, after, &never, &beat(9, vec![]), 10).unwrap();
        store::heartbeat(&c, after, &had, &beat(9, vec![]), 10).unwrap();
        let e = store::heartbeat(&c, after, &busy, &beat(9, vec![]), 10).unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal);
    }

    /// Deleting a node ends its rentals, with the reason recorded.
    #[test]
    fn deleting_a_node_ends_its_rentals() {
        let (_d, c) = db();
        let (id, _) = node(&c, "a");
        let r = create(&c, T0, &req(&id)).unwrap();
        let done = create(&c, T0, &req(&id)).unwrap();
        stop(&c, T0 + 1, &done.spec.id).unwrap();
        store::delete_node(&c, T0 + 5, &id, &Scope::All).unwrap();
        let s = show(&c, T0 + 6, &r.spec.id, &Scope::All).unwrap();
        assert_eq!(
            (s.listed, s.stopped_at, s.reason.as_deref()),
            (false, Some(T0 + 5), Some("node deleted"))
        );
        let d = show(&c, T0 + 6, &done.spec.id, &Scope::All).unwrap();
        assert_eq!((d.stopped_at, d.reason), (Some(T0 + 1), None));
        assert_eq!(list(&c, T0 + 6, Some(&id), MAX_LISTED, &Scope::All).unwrap().rentals.len(), 2);
        assert!(list(&c, T0 + 6, Some("node-other"), MAX_LISTED, &Scope::All).unwrap().rentals.is_empty());
    }

    /// An owner sees the rentals on their own servers only, and never the tenant's environment
    /// values or command; another owner's rental is `not_found`, like a missing one.
    #[test]
    fn an_owner_sees_only_rentals_on_their_servers_without_the_tenants_secrets() {
        let (_d, c) = db();
        let a = Scope::Owner(crate::accounts::invite(&c, T0, "a@example.com").unwrap().0.id);
        let b = Scope::Owner(crate::accounts::invite(&c, T0, "b@example.com").unwrap().0.id);
        let (node_a, _) = node_of(&c, "a", &a);
        let (node_b, _) = node_of(&c, "b", &b);
        let mut with_secrets = req(&node_a);
        with_secrets.env = vec![EnvVar { name: "HF_TOKEN".into(), value: "hf_secret".into() }];
        with_secrets.command = vec!["serve".into(), "--key=secret".into()];
        let ra = create(&c, T0, &with_secrets).unwrap();
        let rb = create(&c, T0, &req(&node_b)).unwrap();

        let seen = list(&c, T0 + 1, None, MAX_LISTED, &a).unwrap().rentals;
        assert_eq!(seen.iter().map(|r| r.spec.id.as_str()).collect::<Vec<_>>(), [ra.spec.id.as_str()]);
        assert_eq!(seen[0].spec.env, [EnvVar { name: "HF_TOKEN".into(), value: String::new() }]);
        assert!(seen[0].spec.command.is_empty());
        assert_eq!(seen[0].spec.gpu_uuids, ra.spec.gpu_uuids);
        assert!(list(&c, T0 + 1, Some(&node_b), MAX_LISTED, &a).unwrap().rentals.is_empty());
        assert_eq!(show(&c, T0 + 1, &ra.spec.id, &a).unwrap().spec.env[0].value, "");
        assert_eq!(show(&c, T0 + 1, &rb.spec.id, &a).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(show(&c, T0 + 1, &ra.spec.id, &b).unwrap_err().code, ErrorCode::NotFound);
        // The operator sees both, whole.
        let all = list(&c, T0 + 1, None, MAX_LISTED, &Scope::All).unwrap().rentals;
        assert_eq!(all.len(), 2);
        assert_eq!(show(&c, T0 + 1, &ra.spec.id, &Scope::All).unwrap().spec.command.len(), 2);
    }
}
