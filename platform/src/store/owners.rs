//! What one owner may hold (issue 43): open join codes and servers, operator-set in
//! `settings`, checked under the owner's row lock; and the platform's check image.

use super::*;

/// What one owner may hold (issue 43, item 3): open join codes (unused, unexpired) and live
/// servers. Set by the operator (`gpum-platform owners limits`, kept in `settings`, so every
/// replica applies the same); the defaults are more than an honest owner meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OwnerLimits {
    pub open_codes: u64,
    pub servers: u64,
}

impl Default for OwnerLimits {
    fn default() -> Self {
        OwnerLimits { open_codes: 100, servers: 1000 }
    }
}

pub(super) const LIMIT_OPEN_CODES: &str = "owner_max_open_codes";
pub(super) const LIMIT_SERVERS: &str = "owner_max_servers";

/// The owners' limits in force.
pub fn owner_limits(conn: &Conn) -> Result<OwnerLimits, ApiError> {
    let get = |key: &str| -> Result<Option<u64>, ApiError> {
        let v: Option<Option<String>> = conn
            .prepare_cached("SELECT value FROM settings WHERE key = ?1")?
            .query_row(params![key], |r| r.get(0))
            .optional()?;
        Ok(v.flatten().and_then(|s| s.parse().ok()))
    };
    let d = OwnerLimits::default();
    Ok(OwnerLimits {
        open_codes: get(LIMIT_OPEN_CODES)?.unwrap_or(d.open_codes),
        servers: get(LIMIT_SERVERS)?.unwrap_or(d.servers),
    })
}

/// Sets the limits given (the operator's CLI); the others stay.
pub fn set_owner_limits(
    conn: &Conn,
    open_codes: Option<u64>,
    servers: Option<u64>,
) -> Result<OwnerLimits, ApiError> {
    for (key, v) in [(LIMIT_OPEN_CODES, open_codes), (LIMIT_SERVERS, servers)] {
        let Some(v) = v else { continue };
        conn.prepare_cached(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?
        .execute(params![key, v.to_string()])?;
    }
    owner_limits(conn)
}

/// Locks owner `owner`'s row until the transaction ends (PostgreSQL: another replica's check
/// of the same owner's limits waits for this one's COMMIT), so a count and the insert after it
/// are not raced.
pub(super) fn lock_owner(conn: &Conn, owner: &str) -> Result<(), ApiError> {
    conn.prepare_cached(&conn.for_update("SELECT id FROM owners WHERE id = ?1"))?
        .query_row(params![owner], |r| r.get::<_, String>(0))
        .optional()?;
    Ok(())
}

pub(super) fn limit_reached(what: &str, n: u64) -> ApiError {
    ApiError::new(
        ErrorCode::OwnerLimitReached,
        format!(
            "the owner holds {n} {what}, the most the platform's operator allows; \
             delete or let some expire first, or ask the operator to raise the limit"
        ),
    )
}

/// Refuses a join code past owner `owner`'s open codes.
pub(super) fn check_open_codes(conn: &Conn, now: u64, owner: &str) -> Result<(), ApiError> {
    lock_owner(conn, owner)?;
    let max = owner_limits(conn)?.open_codes;
    let open: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM join_codes WHERE owner_id = ?1 AND used_at IS NULL AND expires_at > ?2",
        )?
        .query_row(params![owner, now as i64], |r| r.get(0))?;
    if u64::try_from(open).unwrap_or(0) >= max {
        return Err(limit_reached("open join codes", max));
    }
    Ok(())
}

/// Refuses a registration past owner `owner`'s servers.
pub(super) fn check_servers(conn: &Conn, owner: &str) -> Result<(), ApiError> {
    lock_owner(conn, owner)?;
    let max = owner_limits(conn)?.servers;
    let live: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM nodes WHERE owner_id = ?1 AND deleted_at IS NULL")?
        .query_row(params![owner], |r| r.get(0))?;
    if u64::try_from(live).unwrap_or(0) >= max {
        return Err(limit_reached("servers", max));
    }
    Ok(())
}

pub fn probe_image(conn: &Conn) -> Result<Option<String>, ApiError> {
    let v: Option<Option<String>> = conn
        .prepare_cached("SELECT value FROM settings WHERE key = 'probe_image'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(v.flatten())
}

pub fn set_probe_image(conn: &Conn, image: Option<&str>) -> Result<(), ApiError> {
    if let Some(i) = image
        && (i.is_empty() || i.len() > 512 || i.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "image: 1 to 512 characters, no spaces"));
    }
    conn.prepare_cached(
        "INSERT INTO settings (key, value) VALUES ('probe_image', ?1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![image])?;
    Ok(())
}
