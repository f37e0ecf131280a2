//! Join codes, the installer's enrollment and a machine's registration: a code is taken once,
//! bound to an install id, and a GPU belongs to one live node.

use super::*;

/// A new join code for `scope`'s owner (the operator's codes belong to no owner): the node it
/// registers is theirs.
pub fn create_join_code(
    conn: &Conn,
    now: u64,
    ttl_secs: u64,
    scope: &Scope,
) -> Result<JoinCodeCreated, ApiError> {
    if ttl_secs == 0 || ttl_secs > 365 * 24 * 3600 {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "ttl_secs must be between 1 and 31536000"));
    }
    if let Some(owner) = scope.owner() {
        let disabled: bool = conn
            .prepare_cached("SELECT disabled_at IS NOT NULL FROM owners WHERE id = ?1")?
            .query_row(params![owner], |r| r.get(0))
            .optional()?
            .unwrap_or(false);
        if disabled {
            return Err(crate::accounts::AccountError::OwnerDisabled.into());
        }
        check_open_codes(conn, now, owner)?;
    }
    let code = JoinCode::generate().to_string();
    let expires_at = now + ttl_secs;
    conn.prepare_cached(
        "INSERT INTO join_codes (code_hash, created_at, expires_at, owner_id) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![hash_secret(&code), now as i64, expires_at as i64, scope.owner()])?;
    Ok(JoinCodeCreated { code, expires_at })
}

/// A join code, looked up by its hash (what the dashboard's waiting page holds): when it
/// expires and the node it created, if it was used; `None` for another owner's. Read only.
pub fn join_code_use(
    conn: &Conn,
    code_hash: &str,
    scope: &Scope,
) -> Result<Option<(u64, Option<String>)>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT expires_at, node_id FROM join_codes WHERE code_hash = ?1 AND (CAST(?2 AS TEXT) IS NULL OR owner_id = ?2)",
        )?
        .query_row(params![code_hash, scope.owner()], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .optional()?)
}

/// An unused, unexpired join code, as the "add a machine" page lists it: by its hash (the code
/// itself is not stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCode {
    pub hash: String,
    pub created_at: u64,
    pub expires_at: u64,
    /// The e-mail of the owner whose server it registers; `None`: the operator's own (issue 46:
    /// the operator's list names it, since such a server is in no owner's cabinet).
    pub owner: Option<String>,
}

/// The most open codes the page lists.
pub const OPEN_CODES_SHOWN: usize = 50;

/// The join codes not used yet and not expired at `now`, newest first (at most
/// [`OPEN_CODES_SHOWN`]).
pub fn open_join_codes(conn: &Conn, now: u64, scope: &Scope) -> Result<Vec<OpenCode>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT j.code_hash, j.created_at, j.expires_at, o.email FROM join_codes j
             LEFT JOIN owners o ON o.id = j.owner_id
             WHERE j.used_at IS NULL AND j.expires_at > ?1 AND (CAST(?3 AS TEXT) IS NULL OR j.owner_id = ?3)
             ORDER BY j.created_at DESC, j.code_hash LIMIT ?2",
        )?
        .query_map(params![now as i64, OPEN_CODES_SHOWN as i64, scope.owner()], |r| {
            Ok(OpenCode {
                hash: r.get(0)?,
                created_at: r.get::<_, i64>(1)? as u64,
                expires_at: r.get::<_, i64>(2)? as u64,
                owner: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

// ---------------------------------------------------------------------------------------------
// Register

pub(crate) fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, msg)
}

/// Refuses an inventory whose lists or numbers are over the protocol's limits
/// (`Inventory::check_ranges`). Its strings are cut when stored ([`bounded_inventory_json`]),
/// not refused.
pub(super) fn validate_inventory(inv: &Inventory) -> Result<(), ApiError> {
    if inv.private.gpu_uuids.len() > limits::MAX_GPUS
        || inv.private.gpu_uuids.iter().any(|u| u.is_empty() || u.len() > MAX_ID_LEN)
    {
        return Err(invalid(format!(
            "gpu_uuids: at most {} non-empty ids of up to {MAX_ID_LEN} bytes",
            limits::MAX_GPUS
        )));
    }
    if inv.public.gpus.len() > limits::MAX_GPUS {
        return Err(invalid(format!("gpus: at most {}", limits::MAX_GPUS)));
    }
    inv.check_ranges().map_err(invalid)
}

/// The inventory's JSON as stored, with every free-text field cut to
/// [`limits::MAX_TEXT_LEN`] bytes, and the hash of the inventory as sent (what the agent
/// compares with).
pub(super) fn bounded_inventory_json(inv: &Inventory) -> (String, String) {
    let (json, hash) = inv.json_and_hash();
    let long = |s: &str| s.len() > limits::MAX_TEXT_LEN;
    let long_opt = |s: &Option<String>| s.as_deref().is_some_and(long);
    let p = &inv.private;
    let needs_cut = long(&inv.public.cpu_model)
        || inv.public.gpus.iter().any(|g| long(&g.model))
        || long(&p.hostname)
        || long(&p.os)
        || long(&p.kernel)
        || [&p.driver_version, &p.cuda_version, &p.docker_version, &p.toolkit_version]
            .into_iter()
            .any(long_opt);
    if !needs_cut {
        return (json, hash);
    }
    let cut = |s: &mut String| *s = truncate(s, limits::MAX_TEXT_LEN);
    let mut inv = inv.clone();
    cut(&mut inv.public.cpu_model);
    inv.public.gpus.iter_mut().for_each(|g| cut(&mut g.model));
    let p = &mut inv.private;
    for s in [&mut p.hostname, &mut p.os, &mut p.kernel] {
        cut(s);
    }
    for s in [&mut p.driver_version, &mut p.cuda_version, &mut p.docker_version, &mut p.toolkit_version]
        .into_iter()
        .flatten()
    {
        cut(s);
    }
    (inv.json_and_hash().0, hash)
}

/// The install id's canonical form (32 lowercase hex digits), or `invalid_request`.
pub(super) fn normalize_install_id(id: &str) -> Result<String, ApiError> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id.to_ascii_lowercase())
    } else {
        Err(invalid("install_id: 32 hexadecimal digits"))
    }
}

/// Equality of two digests without an early exit.
pub(super) fn digest_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Refuses `gpu_already_registered` when a GPU of `uuids` belongs to a live node other than
/// `node_id` (a deleted node gives its GPUs up). Registration and heartbeats share this rule.
pub(super) fn check_gpus_free(conn: &Conn, uuids: &[String], node_id: Option<&str>) -> Result<(), ApiError> {
    for uuid in uuids {
        let owner: Option<String> = conn
            .prepare_cached("SELECT node_id FROM node_gpus WHERE uuid = ?1")?
            .query_row(params![uuid], |r| r.get(0))
            .optional()?;
        if owner.is_some_and(|o| Some(o.as_str()) != node_id) {
            return Err(gpu_taken());
        }
    }
    Ok(())
}

pub(super) fn gpu_taken() -> ApiError {
    ApiError::new(
        ErrorCode::GpuAlreadyRegistered,
        "a GPU of this machine is already registered to another server; delete that server first",
    )
}

/// The join code's row, by the code's hash.
pub(super) struct CodeRow {
    expires_at: i64,
    used_at: Option<i64>,
    /// The install id the code is bound to (by [`enroll`] or its first registration), hashed.
    install_id_hash: Option<String>,
    node_id: Option<String>,
    repeats: i64,
    /// The code's owner is disabled.
    owner_disabled: bool,
    /// The owner the code was made for; `None`: the operator's.
    owner_id: Option<String>,
}

pub(super) fn code_row(conn: &Conn, code_hash: &str) -> Result<Option<CodeRow>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT expires_at, used_at, install_id_hash, node_id, repeats,
                    EXISTS (SELECT 1 FROM owners o WHERE o.id = join_codes.owner_id AND o.disabled_at IS NOT NULL),
                    owner_id
             FROM join_codes WHERE code_hash = ?1",
        )?
        .query_row(params![code_hash], |r| {
            Ok(CodeRow {
                expires_at: r.get(0)?,
                used_at: r.get(1)?,
                install_id_hash: r.get(2)?,
                node_id: r.get(3)?,
                repeats: r.get(4)?,
                owner_disabled: r.get(5)?,
                owner_id: r.get(6)?,
            })
        })
        .optional()?)
}

/// A code whose owner is disabled registers nothing (issue 43, item 13): `owners disable` ends
/// the owner's open codes, and a code read in the same moment is refused here.
pub(super) fn owner_disabled_code() -> ApiError {
    ApiError::new(
        ErrorCode::JoinCodeExpired,
        "this join code's owner is disabled by the platform's operator; it registers no server",
    )
}

pub(super) fn parse_code(raw: &str) -> Result<JoinCode, ApiError> {
    JoinCode::parse(raw)
        .map_err(|e| ApiError::new(ErrorCode::JoinCodeMalformed, format!("the join code {e}")))
}

pub(super) fn code_unknown() -> ApiError {
    ApiError::new(ErrorCode::JoinCodeUnknown, "this join code was never issued")
}

pub(super) fn code_used() -> ApiError {
    ApiError::new(ErrorCode::JoinCodeUsed, "this join code was already used")
}

pub(super) fn code_expired() -> ApiError {
    ApiError::new(ErrorCode::JoinCodeExpired, "this join code has expired")
}

/// Counts one more use of a code by the install id it is bound to; `join_code_used` past
/// `limits::MAX_CODE_REPEATS`, so that repeating a code cannot grow the database without bound.
pub(super) fn count_repeat(conn: &Conn, code_hash: &str, row: &CodeRow) -> Result<(), ApiError> {
    if row.repeats >= i64::from(limits::MAX_CODE_REPEATS) {
        return Err(code_used());
    }
    conn.prepare_cached("UPDATE join_codes SET repeats = repeats + 1 WHERE code_hash = ?1")?
        .execute(params![code_hash])?;
    Ok(())
}

/// `POST /api/v1/agent/enroll`: binds an unused code to `install_id` (see
/// [`gpum_protocol::EnrollRequest`]). The same install id may enroll again; any other gets
/// `join_code_used`, and so does a registration with the code that lacks the install id.
pub fn enroll(conn: &Conn, now: u64, req: &EnrollRequest) -> Result<EnrollResponse, ApiError> {
    let code = parse_code(&req.join_code)?;
    let id_hash = hash_secret(&normalize_install_id(&req.install_id)?);
    let code_hash = hash_secret(&code.to_string());
    let row = code_row(conn, &code_hash)?.ok_or_else(code_unknown)?;
    if row.owner_disabled {
        return Err(owner_disabled_code());
    }
    let live = (now as i64) < row.expires_at;
    match &row.install_id_hash {
        None if row.used_at.is_some() => Err(code_used()),
        None if !live => Err(code_expired()),
        None => {
            let expires_at = row.expires_at.max((now + ENROLL_GRACE_SECS) as i64);
            // Bound only if still unbound and unused (two replicas may race; see `register`).
            let bound = conn
                .prepare_cached(
                    "UPDATE join_codes SET install_id_hash = ?1, expires_at = ?2
                     WHERE code_hash = ?3 AND install_id_hash IS NULL AND used_at IS NULL",
                )?
                .execute(params![id_hash, expires_at, code_hash])?;
            if bound != 1 {
                return Err(code_used());
            }
            Ok(EnrollResponse { expires_at: expires_at as u64 })
        }
        Some(stored) if digest_eq(stored, &id_hash) && live => {
            count_repeat(conn, &code_hash, &row)?;
            Ok(EnrollResponse { expires_at: row.expires_at as u64 })
        }
        Some(_) if row.used_at.is_none() && !live => Err(code_expired()),
        Some(_) => Err(code_used()),
    }
}

pub fn register(
    conn: &Conn,
    now: u64,
    req: &RegisterRequest,
    heartbeat_interval_secs: u64,
) -> Result<RegisterResponse, ApiError> {
    let code = parse_code(&req.join_code)?;
    validate_inventory(&req.inventory)?;
    let install_id_hash =
        req.install_id.as_deref().map(normalize_install_id).transpose()?.map(|i| hash_secret(&i));
    let code_hash = hash_secret(&code.to_string());
    let row = code_row(conn, &code_hash)?.ok_or_else(code_unknown)?;
    if row.owner_disabled {
        return Err(owner_disabled_code());
    }
    let live = (now as i64) < row.expires_at;
    // Bound to an install id (enrolled, or registered with one): only that install id may use it.
    let same_install = match (&install_id_hash, &row.install_id_hash) {
        (Some(sent), Some(stored)) => digest_eq(sent, stored),
        (_, None) => true,
        (None, Some(_)) => false,
    };
    if row.used_at.is_some() {
        // The same installation asking again (it never saw the first answer, or crashed
        // before saving the token), within the code's lifetime: the same node, a new token.
        return match (&install_id_hash, &row.install_id_hash, &row.node_id) {
            (Some(_), Some(_), Some(node_id))
                if live && same_install && live_node(conn, node_id, &Scope::All).is_ok() =>
            {
                count_repeat(conn, &code_hash, &row)?;
                register_again(conn, now, req, node_id, heartbeat_interval_secs)
            }
            _ => Err(code_used()),
        };
    }
    if !same_install {
        return Err(code_used());
    }
    if !live {
        return Err(code_expired());
    }
    // A GPU belongs to one live node. The code is not consumed on this refusal, so the owner
    // can delete the old server and run the installer again with the same code.
    check_gpus_free(conn, &req.inventory.private.gpu_uuids, None)?;
    // So is the owner's limit of servers (issue 43, item 3).
    if let Some(owner) = &row.owner_id {
        check_servers(conn, owner)?;
    }
    let node_id = new_id("node-");
    // Taken only if still unused: with several replicas on one PostgreSQL, two may have read the
    // code as unused at the same moment; the second UPDATE waits for the first to commit, then
    // finds it used and changes nothing (issue 35). On SQLite, the one writer, it always takes.
    // So does an `owners disable` committed meanwhile: it ended the code (`expires_at`).
    let taken = conn
        .prepare_cached(
            "UPDATE join_codes SET used_at = ?1, install_id_hash = ?2, node_id = ?3
             WHERE code_hash = ?4 AND used_at IS NULL AND (install_id_hash IS NULL OR install_id_hash = ?2)
               AND expires_at > ?1",
        )?
        .execute(params![now as i64, install_id_hash, node_id, code_hash])?;
    if taken != 1 {
        return match code_row(conn, &code_hash)? {
            Some(r) if r.owner_disabled => Err(owner_disabled_code()),
            Some(r) if r.used_at.is_none() && r.expires_at <= now as i64 => Err(code_expired()),
            _ => Err(code_used()),
        };
    }
    let token = new_token();
    let (inventory_json, inventory_hash) = bounded_inventory_json(&req.inventory);
    conn.prepare_cached(
        "INSERT INTO nodes (id, token_hash, registered_at, agent_version, inventory_json, inventory_hash, owner_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, (SELECT owner_id FROM join_codes WHERE code_hash = ?7))",
    )?
    .execute(params![
        node_id,
        hash_secret(&token),
        now as i64,
        truncate(&req.agent_version, 64),
        inventory_json,
        inventory_hash,
        code_hash
    ])?;
    set_gpus(conn, &node_id, &req.inventory.private.gpu_uuids)?;
    record(conn, &node_id, now, NodeEventKind::Registered, "", "")?;
    Ok(RegisterResponse {
        node_id,
        node_token: token,
        heartbeat_interval_secs,
        probe_image: probe_image(conn)?,
    })
}

/// A repeated registration of the same installation: the node takes the new inventory and a
/// fresh token; the first token is revoked like a rotated one (`token_replaced`).
pub(super) fn register_again(
    conn: &Conn,
    now: u64,
    req: &RegisterRequest,
    node_id: &str,
    heartbeat_interval_secs: u64,
) -> Result<RegisterResponse, ApiError> {
    check_gpus_free(conn, &req.inventory.private.gpu_uuids, Some(node_id))?;
    let TokenRotated { node_token } = rotate_token(conn, now, node_id, &Scope::All)?;
    let (inventory_json, inventory_hash) = bounded_inventory_json(&req.inventory);
    hardware_changed(conn, now, node_id, &inventory_json, &inventory_hash)?;
    conn.prepare_cached(
        "UPDATE nodes SET agent_version = ?1, inventory_json = ?2, inventory_hash = ?3 WHERE id = ?4",
    )?
    .execute(params![truncate(&req.agent_version, 64), inventory_json, inventory_hash, node_id])?;
    set_gpus(conn, node_id, &req.inventory.private.gpu_uuids)?;
    Ok(RegisterResponse {
        node_id: node_id.to_owned(),
        node_token,
        heartbeat_interval_secs,
        probe_image: probe_image(conn)?,
    })
}

/// Replaces the node's GPUs. Callers have checked with [`check_gpus_free`] that none belongs to
/// another node; a UUID listed twice is stored once.
/// Records the node's GPUs. [`check_gpus_free`] looked first, but another replica's
/// transaction may have taken one since (two registrations of one machine at once): the insert
/// returns the GPU's owner as committed (on PostgreSQL it waits for that other transaction), and
/// a GPU that another node now holds refuses this one, as the check would have.
pub(super) fn set_gpus(conn: &Conn, node_id: &str, uuids: &[String]) -> Result<(), ApiError> {
    conn.prepare_cached("DELETE FROM node_gpus WHERE node_id = ?1")?.execute(params![node_id])?;
    for u in uuids {
        let owner: String = conn
            .prepare_cached(
                "INSERT INTO node_gpus (uuid, node_id) VALUES (?1, ?2)
                 ON CONFLICT (uuid) DO UPDATE SET node_id = node_gpus.node_id RETURNING node_id",
            )?
            .query_row(params![u, node_id], |r| r.get(0))?;
        if owner != node_id {
            return Err(gpu_taken());
        }
    }
    Ok(())
}
