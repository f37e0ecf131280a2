//! Owners' accounts (issue 32): invitations, passwords, a second factor, dashboard sessions and
//! API keys. Everything here runs on the database thread except [`hash_password`] and
//! [`verify_password`], which are slow on purpose and run on a blocking thread (the web side).
//!
//! What the database holds, and what it never does:
//! - An owner's password only as an Argon2id hash (the `argon2` crate's defaults: 19 MiB,
//!   2 passes), in the PHC string format, salt included.
//! - Invitation links, session ids and API keys only as SHA-256 hashes of random 256-bit
//!   values: a copy of the database signs no one in.
//! - The TOTP secret in the clear (the code is computed from it), and the last time step a code
//!   was accepted for, so that a code works once.
//! - Recovery codes (issue 43) only as SHA-256 hashes of random 80-bit values, each deleted when
//!   it is used; a new set replaces the old.
//!
//! A session alone is not the account (issue 43): changing or turning off the second factor,
//! and a new set of recovery codes, take the password and a current code (or a recovery code),
//! checked by the web side; the new key a change confirms is the one the platform gave that
//! session after that check ([`start_totp_change`]), never one a form names.
//!
//! Sessions live here rather than in memory, so a restart of the platform signs no one out; each
//! owner keeps at most [`MAX_SESSIONS_PER_OWNER`] (the operator [`MAX_OPERATOR_SESSIONS`]),
//! the oldest going first, so signing in again and again cannot grow the table. Disabling an
//! owner, setting a new password from an invitation, and the operator's reset of the second
//! factor end their sessions and revoke their API keys (a revoked key never comes back).

use crate::params;
use crate::sql::{Conn, OptionalExtension};
use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString, rand_core::OsRng};
use gpum_protocol::{ErrorCode, OwnerList, OwnerSummary};
use totp_rs::{Algorithm, Secret, TOTP};

use crate::error::ApiError;
use crate::store::hash_secret;
use crate::web::session::{ct_eq, random_hex};

/// How long an invitation link works.
pub const INVITATION_TTL_SECS: u64 = 7 * 24 * 3600;
/// How long a dashboard session lasts from sign-in.
pub const SESSION_TTL_SECS: u64 = 12 * 3600;
pub const MAX_SESSIONS_PER_OWNER: usize = 16;
pub const MAX_OPERATOR_SESSIONS: usize = 256;
/// Live (unrevoked) API keys an owner may hold.
pub const MAX_API_KEYS_PER_OWNER: usize = 20;
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Longer passwords are refused before they are hashed.
pub const MAX_PASSWORD_BYTES: usize = 256;
pub const MAX_EMAIL_BYTES: usize = 254;
pub const MAX_KEY_LABEL_CHARS: usize = 64;
/// The prefix of API keys, so that one found in a log or a repository is recognisable.
pub const API_KEY_PREFIX: &str = "gpumk_";
/// TOTP as authenticator apps do it: SHA-1, 6 digits, 30-second steps, one step of skew.
const TOTP_STEP: u64 = 30;
/// Recovery codes in a set.
pub const RECOVERY_CODES: usize = 10;
/// How long a session may take to confirm a new second factor's key.
pub const TOTP_PENDING_SECS: u64 = 600;

/// Why an account operation was refused; the dashboard words each in both languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountError {
    Email,
    PasswordShort,
    PasswordLong,
    PasswordMismatch,
    TotpCode,
    KeyLabel,
    TooManyKeys,
    OwnerDisabled,
    /// The password or the code (or recovery code) that a change of the account needs is wrong.
    Credentials,
    /// A new second factor's key confirmed by a session that was given none (or too long ago).
    TotpNotStarted,
    /// Too many wrong passwords or codes from this address: retry after this many seconds.
    TooMany(u64),
}

impl AccountError {
    pub fn message(self) -> String {
        match self {
            AccountError::Email => {
                format!("email: an address like name@example.com, at most {MAX_EMAIL_BYTES} bytes")
            }
            AccountError::PasswordShort => {
                format!("the password must be at least {MIN_PASSWORD_CHARS} characters")
            }
            AccountError::PasswordLong => format!("the password must be at most {MAX_PASSWORD_BYTES} bytes"),
            AccountError::PasswordMismatch => "the two passwords differ".to_owned(),
            AccountError::TotpCode => {
                "the code from the authenticator app is wrong or was already used".to_owned()
            }
            AccountError::KeyLabel => format!("a key's label is 1 to {MAX_KEY_LABEL_CHARS} characters"),
            AccountError::TooManyKeys => {
                format!("at most {MAX_API_KEYS_PER_OWNER} API keys; revoke one first")
            }
            AccountError::OwnerDisabled => "this owner is disabled".to_owned(),
            AccountError::Credentials => "the password or the code is wrong".to_owned(),
            AccountError::TotpNotStarted => "no new key to confirm: start again with the password".to_owned(),
            AccountError::TooMany(n) => format!("too many wrong passwords or codes; retry in {n} s"),
        }
    }
}

impl From<AccountError> for ApiError {
    fn from(e: AccountError) -> ApiError {
        ApiError::new(ErrorCode::InvalidRequest, e.message())
    }
}

/// An e-mail address as stored: trimmed, lower case, one `@` with something on both sides, no
/// space or control character.
pub fn normalize_email(s: &str) -> Result<String, AccountError> {
    let e = s.trim().to_lowercase();
    let ok = e.len() <= MAX_EMAIL_BYTES
        && !e.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(e.split_once('@'), Some((a, b)) if !a.is_empty() && b.contains('.') && !b.contains('@') && !b.starts_with('.') && !b.ends_with('.'));
    if ok { Ok(e) } else { Err(AccountError::Email) }
}

/// A new password's rules, checked before it is hashed.
pub fn check_new_password(password: &str, again: &str) -> Result<(), AccountError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AccountError::PasswordLong);
    }
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(AccountError::PasswordShort);
    }
    if password != again {
        return Err(AccountError::PasswordMismatch);
    }
    Ok(())
}

/// Argon2id with a fresh salt, as a PHC string. Slow on purpose: call it off the database
/// thread.
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default().hash_password(password.as_bytes(), &salt).map(|h| h.to_string()).unwrap_or_default()
}

/// Whether `password` matches a stored hash; a hash that does not parse matches nothing. Slow
/// on purpose: call it off the database thread.
pub fn verify_password(stored: &str, password: &str) -> bool {
    if password.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    match PasswordHash::new(stored) {
        Ok(h) => Argon2::default().verify_password(password.as_bytes(), &h).is_ok(),
        Err(_) => false,
    }
}

/// A hash to verify against when there is no account, so that a wrong address takes as long as
/// a wrong password.
pub fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password(&random_hex()))
}

// ---------------------------------------------------------------------------------------------
// TOTP

/// A fresh TOTP secret (160 bits, as RFC 4226 recommends), base32 as apps take it.
pub fn new_totp_secret() -> String {
    let mut b = [0u8; 20];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    Secret::Raw(b.to_vec()).to_encoded().to_string()
}

/// The `otpauth://` link an authenticator app reads (typed in or scanned).
pub fn totp_link(secret: &str, email: &str) -> String {
    let label: String = serde_urlencoded::to_string([("", format!("gpum:{email}"))])
        .unwrap_or_default()
        .trim_start_matches('=')
        .to_owned();
    format!("otpauth://totp/{label}?secret={secret}&issuer=gpum&algorithm=SHA1&digits=6&period=30")
}

fn totp(secret: &str) -> Option<TOTP> {
    let bytes = Secret::Encoded(secret.to_owned()).to_bytes().ok()?;
    TOTP::new(Algorithm::SHA1, 6, 1, TOTP_STEP, bytes).ok()
}

/// The time step a code is right for (this one, the one before or after), if it is later than
/// `after`: a code is accepted once.
pub fn totp_step(secret: &str, code: &str, now: u64, after: Option<u64>) -> Option<u64> {
    let t = totp(secret)?;
    let code = code.trim().replace(' ', "");
    if code.len() != 6 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step = now / TOTP_STEP;
    [step.saturating_sub(1), step, step + 1]
        .into_iter()
        .filter(|s| after.is_none_or(|a| *s > a))
        .find(|s| ct_eq(&t.generate(s * TOTP_STEP), &code))
}

/// The current code for a secret (for tests and for the confirmation step's hint only).
pub fn totp_code(secret: &str, at: u64) -> Option<String> {
    totp(secret).map(|t| t.generate(at))
}

// ---------------------------------------------------------------------------------------------
// Owners and invitations

fn new_owner_id() -> String {
    format!("own-{}", &random_hex()[..16])
}

fn owner_summary(conn: &Conn, id: &str) -> Result<OwnerSummary, ApiError> {
    conn.prepare_cached(
        "SELECT id, email, created_at, disabled_at IS NOT NULL, password_hash IS NOT NULL, totp_secret IS NOT NULL,
                (SELECT COUNT(*) FROM nodes WHERE owner_id = owners.id AND deleted_at IS NULL)
         FROM owners WHERE id = ?1",
    )?
    .query_row(params![id], owner_row)
    .optional()?
    .ok_or_else(|| ApiError::not_found("owner"))
}

fn owner_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<OwnerSummary> {
    Ok(OwnerSummary {
        id: r.get(0)?,
        email: r.get(1)?,
        created_at: r.get::<_, i64>(2)? as u64,
        disabled: r.get(3)?,
        password_set: r.get(4)?,
        totp: r.get(5)?,
        servers: r.get::<_, i64>(6)? as u64,
    })
}

/// One page of the owners, oldest first (by creation, then e-mail), with the cursor of the next
/// page when there is one (issue 44: no list is read whole on a request).
pub fn list_owners_page(conn: &Conn, page: &crate::store::Page) -> Result<OwnerList, ApiError> {
    let limit = page.limit.clamp(1, crate::store::MAX_PAGE_LIMIT);
    let (after_at, after_email) = page.after.as_ref().map_or((i64::MIN, ""), |c| (c.at, c.key.as_str()));
    let mut owners: Vec<OwnerSummary> = conn
        .prepare_cached(
            "SELECT id, email, created_at, disabled_at IS NOT NULL, password_hash IS NOT NULL, totp_secret IS NOT NULL,
                    (SELECT COUNT(*) FROM nodes WHERE owner_id = owners.id AND deleted_at IS NULL)
             FROM owners
             WHERE (created_at, email) > (?1, ?2) ORDER BY created_at, email LIMIT ?3",
        )?
        .query_map(params![after_at, after_email, i64::from(limit) + 1], owner_row)?
        .collect::<Result<_, _>>()?;
    let more = owners.len() > limit as usize;
    owners.truncate(limit as usize);
    let next = match owners.last() {
        Some(o) if more => {
            Some(crate::store::Cursor { at: o.created_at as i64, key: o.email.clone() }.encode())
        }
        _ => None,
    };
    Ok(OwnerList { owners, next })
}

/// Every owner, read page by page (the CLI's `owners list`).
pub fn list_owners(conn: &Conn) -> Result<Vec<OwnerSummary>, ApiError> {
    let mut page = crate::store::Page { limit: crate::store::MAX_PAGE_LIMIT, after: None };
    let mut all = Vec::new();
    loop {
        let list = list_owners_page(conn, &page)?;
        all.extend(list.owners);
        match list.next {
            Some(next) => page.after = Some(crate::store::Cursor::parse(&next)?),
            None => return Ok(all),
        }
    }
}

/// An owner by id or e-mail.
pub fn find_owner(conn: &Conn, id_or_email: &str) -> Result<OwnerSummary, ApiError> {
    let email = normalize_email(id_or_email).unwrap_or_default();
    let id: Option<String> = conn
        .prepare_cached("SELECT id FROM owners WHERE id = ?1 OR email = ?2")?
        .query_row(params![id_or_email.trim(), email], |r| r.get(0))
        .optional()?;
    match id {
        Some(id) => owner_summary(conn, &id),
        None => Err(ApiError::not_found("owner")),
    }
}

/// Invites `email` (creating the owner when new): a one-time link token, valid for
/// [`INVITATION_TTL_SECS`]. Earlier unused links of the owner stop working. A disabled owner is
/// refused: enable them first.
pub fn invite(conn: &Conn, now: u64, email: &str) -> Result<(OwnerSummary, String, u64), ApiError> {
    let email = normalize_email(email)?;
    let found: Option<(String, Option<i64>)> = conn
        .prepare_cached("SELECT id, disabled_at FROM owners WHERE email = ?1")?
        .query_row(params![email], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let id = match found {
        Some((_, Some(_))) => return Err(AccountError::OwnerDisabled.into()),
        Some((id, None)) => id,
        None => {
            let id = new_owner_id();
            conn.prepare_cached("INSERT INTO owners (id, email, created_at) VALUES (?1, ?2, ?3)")?
                .execute(params![id, email, now as i64])?;
            id
        }
    };
    conn.prepare_cached("UPDATE invitations SET used_at = ?1 WHERE owner_id = ?2 AND used_at IS NULL")?
        .execute(params![now as i64, id])?;
    // Spent invitations are history of no use: only the newest few of an owner stay.
    conn.prepare_cached(
        "DELETE FROM invitations WHERE owner_id = ?1 AND rowid NOT IN
           (SELECT rowid FROM invitations WHERE owner_id = ?1 ORDER BY created_at DESC, rowid DESC LIMIT 8)",
    )?
    .execute(params![id])?;
    let token = random_hex();
    let expires_at = now + INVITATION_TTL_SECS;
    conn.prepare_cached(
        "INSERT INTO invitations (token_hash, owner_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![hash_secret(&token), id, now as i64, expires_at as i64])?;
    Ok((owner_summary(conn, &id)?, token, expires_at))
}

/// The owner an invitation link is for, while it is unused, unexpired and the owner enabled:
/// (id, e-mail).
pub fn invitation(conn: &Conn, now: u64, token: &str) -> Result<Option<(String, String)>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT o.id, o.email FROM invitations i JOIN owners o ON o.id = i.owner_id
             WHERE i.token_hash = ?1 AND i.used_at IS NULL AND i.expires_at > ?2 AND o.disabled_at IS NULL",
        )?
        .query_row(params![hash_secret(token), now as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// An accepted invitation: whose, and whether their second factor is on (then the link starts
/// no session: the owner signs in with the new password and a code, as usual).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub owner: String,
    pub totp: bool,
}

/// Accepts an invitation: the owner's password becomes `password_hash` (made off this thread),
/// the link is spent, and every session and API key of theirs ends (a reset by a new
/// invitation is a new start; the owner makes new keys). `None` when the link no longer works.
pub fn accept_invitation(
    conn: &Conn,
    now: u64,
    token: &str,
    password_hash: &str,
) -> Result<Option<Accepted>, ApiError> {
    let Some((id, _)) = invitation(conn, now, token)? else { return Ok(None) };
    conn.prepare_cached("UPDATE invitations SET used_at = ?1 WHERE token_hash = ?2")?
        .execute(params![now as i64, hash_secret(token)])?;
    conn.prepare_cached("UPDATE owners SET password_hash = ?1 WHERE id = ?2")?
        .execute(params![password_hash, id])?;
    end_sessions_and_keys(conn, now, &id)?;
    let totp = owner_summary(conn, &id)?.totp;
    Ok(Some(Accepted { owner: id, totp }))
}

/// Ends every session of an owner and revokes every live API key of theirs.
fn end_sessions_and_keys(conn: &Conn, now: u64, owner: &str) -> Result<(), ApiError> {
    conn.prepare_cached("DELETE FROM sessions WHERE owner_id = ?1")?.execute(params![owner])?;
    conn.prepare_cached("UPDATE api_keys SET revoked_at = ?1 WHERE owner_id = ?2 AND revoked_at IS NULL")?
        .execute(params![now as i64, owner])?;
    Ok(())
}

/// Disables or enables an owner. Disabling ends their sessions, unused invitations, open join
/// codes and the rentals on their servers (whose streams close: `effects`), and revokes their
/// API keys (enabling them again revives none of them); their servers stay (the operator
/// deletes them if they must go), but none is rentable while the owner is disabled
/// (`rentable::verdict`, issue 43).
pub fn set_disabled(conn: &Conn, now: u64, id: &str, disabled: bool) -> Result<OwnerSummary, ApiError> {
    let o = find_owner(conn, id)?;
    conn.prepare_cached(
        "UPDATE owners SET disabled_at = CASE WHEN ?2 THEN COALESCE(disabled_at, ?3) ELSE NULL END WHERE id = ?1",
    )?
    .execute(params![o.id, disabled, now as i64])?;
    if disabled {
        end_sessions_and_keys(conn, now, &o.id)?;
        conn.prepare_cached("UPDATE invitations SET used_at = ?1 WHERE owner_id = ?2 AND used_at IS NULL")?
            .execute(params![now as i64, o.id])?;
        conn.prepare_cached(
            "UPDATE join_codes SET expires_at = ?1 WHERE owner_id = ?2 AND used_at IS NULL AND expires_at > ?1",
        )?
        .execute(params![now as i64, o.id])?;
        // The rentals on their servers end, and their tenants' streams close on every replica.
        let nodes: Vec<String> = conn
            .prepare_cached("SELECT id FROM nodes WHERE owner_id = ?1 AND deleted_at IS NULL")?
            .query_map(params![o.id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let mut ended = Vec::new();
        for n in &nodes {
            ended.extend(crate::rentals::end_for_node(conn, now, n, "owner disabled")?);
        }
        crate::effects::record(conn, now, &crate::effects::rules::rentals_ended(&ended))?;
    }
    owner_summary(conn, &o.id)
}

/// What sign-in needs of an enabled owner with a password: (id, password hash, TOTP secret,
/// last TOTP step).
pub struct SignInRow {
    pub id: String,
    pub password_hash: String,
    pub totp_secret: Option<String>,
    pub totp_last_step: Option<u64>,
}

pub fn sign_in_row(conn: &Conn, email: &str) -> Result<Option<SignInRow>, ApiError> {
    let Ok(email) = normalize_email(email) else { return Ok(None) };
    Ok(conn
        .prepare_cached(
            "SELECT id, password_hash, totp_secret, totp_last_step FROM owners
             WHERE email = ?1 AND disabled_at IS NULL AND password_hash IS NOT NULL",
        )?
        .query_row(params![email], |r| {
            Ok(SignInRow {
                id: r.get(0)?,
                password_hash: r.get(1)?,
                totp_secret: r.get(2)?,
                totp_last_step: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
            })
        })
        .optional()?)
}

/// [`sign_in_row`] for a signed-in owner, by id: what the account page checks a change with.
pub fn owner_credentials(conn: &Conn, owner: &str) -> Result<Option<SignInRow>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, password_hash, totp_secret, totp_last_step FROM owners
             WHERE id = ?1 AND disabled_at IS NULL AND password_hash IS NOT NULL",
        )?
        .query_row(params![owner], |r| {
            Ok(SignInRow {
                id: r.get(0)?,
                password_hash: r.get(1)?,
                totp_secret: r.get(2)?,
                totp_last_step: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
            })
        })
        .optional()?)
}

/// Accepts a TOTP code for an owner once: checks it against their secret (or `pending`, the
/// secret being turned on) and records its step. `false` for a wrong or reused code.
pub fn use_totp_code(
    conn: &Conn,
    now: u64,
    owner: &str,
    code: &str,
    pending: Option<&str>,
) -> Result<bool, ApiError> {
    let row: Option<(Option<String>, Option<i64>)> = conn
        .prepare_cached(
            "SELECT totp_secret, totp_last_step FROM owners WHERE id = ?1 AND disabled_at IS NULL",
        )?
        .query_row(params![owner], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((secret, last)) = row else { return Ok(false) };
    // A pending key is new: its codes were never used, whatever step the old key's last code
    // had; the step recorded is the later of the two, so neither code works again.
    let last = last.map(|v| v as u64);
    let after = if pending.is_some() { None } else { last };
    let Some(secret) = pending.map(str::to_owned).or(secret) else { return Ok(false) };
    let Some(step) = totp_step(&secret, code, now, after) else { return Ok(false) };
    let step = last.map_or(step, |l| step.max(l));
    conn.prepare_cached("UPDATE owners SET totp_last_step = ?1 WHERE id = ?2")?
        .execute(params![step as i64, owner])?;
    Ok(true)
}

/// Turns the second factor on (with a secret whose code was just accepted) or off; off, the
/// recovery codes go with it.
pub fn set_totp(conn: &Conn, owner: &str, secret: Option<&str>) -> Result<(), ApiError> {
    conn.prepare_cached("UPDATE owners SET totp_secret = ?1 WHERE id = ?2")?
        .execute(params![secret, owner])?;
    if secret.is_none() {
        conn.prepare_cached("DELETE FROM recovery_codes WHERE owner_id = ?1")?.execute(params![owner])?;
    }
    Ok(())
}

/// The second factor at sign-in (and for the account page's changes): a current TOTP code,
/// or one of the owner's recovery codes, which is then spent. `false` for anything else.
pub fn use_second_factor(conn: &Conn, now: u64, owner: &str, code: &str) -> Result<bool, ApiError> {
    match normalize_recovery_code(code) {
        Some(rc) => {
            let n = conn
                .prepare_cached("DELETE FROM recovery_codes WHERE owner_id = ?1 AND code_hash = ?2")?
                .execute(params![owner, hash_secret(&rc)])?;
            Ok(n == 1)
        }
        None => use_totp_code(conn, now, owner, code, None),
    }
}

/// The first step of turning the second factor on or changing its key, once the web side has
/// checked the password (and the current code): `secret` becomes the key this session, and
/// only this session, may confirm within [`TOTP_PENDING_SECS`].
pub fn start_totp_change(conn: &Conn, now: u64, session_id: &str, secret: &str) -> Result<(), ApiError> {
    conn.prepare_cached("UPDATE sessions SET totp_pending = ?1, totp_pending_until = ?2 WHERE id_hash = ?3")?
        .execute(params![secret, (now + TOTP_PENDING_SECS) as i64, hash_secret(session_id)])?;
    Ok(())
}

/// What confirming a new second factor's key came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TotpConfirm {
    /// This session was given no key (or too long ago): start again, with the password.
    NotStarted,
    /// The code is not the pending key's: the key, to show again.
    WrongCode(String),
    /// On, with this key; the new recovery codes, to show once.
    On(Vec<String>),
}

/// The second step: a code of the key this session was given turns it on, with a new set of
/// recovery codes.
pub fn confirm_totp(
    conn: &Conn,
    now: u64,
    owner: &str,
    session_id: &str,
    code: &str,
) -> Result<TotpConfirm, ApiError> {
    let pending: Option<String> = conn
        .prepare_cached(
            "SELECT totp_pending FROM sessions
             WHERE id_hash = ?1 AND owner_id = ?2 AND totp_pending_until > ?3",
        )?
        .query_row(params![hash_secret(session_id), owner, now as i64], |r| r.get(0))
        .optional()?
        .flatten();
    let Some(secret) = pending else { return Ok(TotpConfirm::NotStarted) };
    if !use_totp_code(conn, now, owner, code, Some(&secret))? {
        return Ok(TotpConfirm::WrongCode(secret));
    }
    set_totp(conn, owner, Some(&secret))?;
    conn.prepare_cached(
        "UPDATE sessions SET totp_pending = NULL, totp_pending_until = NULL WHERE owner_id = ?1",
    )?
    .execute(params![owner])?;
    Ok(TotpConfirm::On(replace_recovery_codes(conn, now, owner)?))
}

/// The operator's way back in for an owner who lost their authenticator (`owners reset-2fa`):
/// the second factor off, its recovery codes gone, every session and API key ended, and the
/// time recorded, which the owner's pages show.
pub fn reset_second_factor(conn: &Conn, now: u64, id_or_email: &str) -> Result<OwnerSummary, ApiError> {
    let o = find_owner(conn, id_or_email)?;
    set_totp(conn, &o.id, None)?;
    conn.prepare_cached("UPDATE owners SET totp_reset_at = ?1 WHERE id = ?2")?
        .execute(params![now as i64, o.id])?;
    end_sessions_and_keys(conn, now, &o.id)?;
    owner_summary(conn, &o.id)
}

// ---------------------------------------------------------------------------------------------
// Recovery codes

/// The letters of a recovery code: lower-case base32, 16 of them (80 bits).
const RECOVERY_ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
const RECOVERY_CHARS: usize = 16;

/// A fresh recovery code as shown: four groups of four, `abcd-efgh-ijkl-mnop`.
fn new_recovery_code() -> String {
    let mut b = [0u8; RECOVERY_CHARS];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    let letters: Vec<char> = b.iter().map(|x| RECOVERY_ALPHABET[usize::from(x % 32)] as char).collect();
    letters.chunks(4).map(|c| c.iter().collect::<String>()).collect::<Vec<_>>().join("-")
}

/// A recovery code as typed (any case, with or without the dashes or spaces) in the form its
/// hash is taken of; `None` when it cannot be one.
pub fn normalize_recovery_code(typed: &str) -> Option<String> {
    let s: String =
        typed.chars().filter(|c| *c != '-' && !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
    (s.len() == RECOVERY_CHARS && s.bytes().all(|b| RECOVERY_ALPHABET.contains(&b))).then_some(s)
}

/// A new set of [`RECOVERY_CODES`] codes for `owner`, replacing the old set; returned to be
/// shown once (only their hashes are kept).
pub fn replace_recovery_codes(conn: &Conn, now: u64, owner: &str) -> Result<Vec<String>, ApiError> {
    conn.prepare_cached("DELETE FROM recovery_codes WHERE owner_id = ?1")?.execute(params![owner])?;
    let codes: Vec<String> = (0..RECOVERY_CODES).map(|_| new_recovery_code()).collect();
    for c in &codes {
        let plain = normalize_recovery_code(c).unwrap_or_default();
        conn.prepare_cached(
            "INSERT INTO recovery_codes (code_hash, owner_id, created_at) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![hash_secret(&plain), owner, now as i64])?;
    }
    Ok(codes)
}

// ---------------------------------------------------------------------------------------------
// Sessions

/// A live session: whose it is (`None`: the operator's), its owner's e-mail, its CSRF token.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub owner: Option<String>,
    pub email: Option<String>,
    pub totp: bool,
    pub csrf: String,
    /// When the operator last turned the owner's second factor off, while it stays off: the
    /// owner's pages say so.
    pub totp_reset_at: Option<u64>,
}

/// Starts a session at `now`; returns the id for the cookie (only its hash is kept).
pub fn create_session(conn: &Conn, now: u64, owner: Option<&str>) -> Result<String, ApiError> {
    let id = random_hex();
    conn.prepare_cached("DELETE FROM sessions WHERE expires_at <= ?1")?.execute(params![now as i64])?;
    let keep = if owner.is_some() { MAX_SESSIONS_PER_OWNER } else { MAX_OPERATOR_SESSIONS } - 1;
    conn.prepare_cached(
        "DELETE FROM sessions WHERE owner_id IS NOT DISTINCT FROM ?1 AND rowid NOT IN
           (SELECT rowid FROM sessions WHERE owner_id IS NOT DISTINCT FROM ?1 ORDER BY created_at DESC, rowid DESC LIMIT ?2)",
    )?
    .execute(params![owner, keep as i64])?;
    conn.prepare_cached(
        "INSERT INTO sessions (id_hash, owner_id, csrf, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        hash_secret(&id),
        owner,
        random_hex(),
        now as i64,
        (now + SESSION_TTL_SECS) as i64
    ])?;
    Ok(id)
}

/// The live session for a cookie's id; an owner's only while they are enabled.
pub fn session(conn: &Conn, now: u64, id: &str) -> Result<Option<SessionRow>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT s.owner_id, o.email, o.totp_secret IS NOT NULL, s.csrf,
                    CASE WHEN o.totp_secret IS NULL THEN o.totp_reset_at END
             FROM sessions s
             LEFT JOIN owners o ON o.id = s.owner_id
             WHERE s.id_hash = ?1 AND s.expires_at > ?2 AND (s.owner_id IS NULL OR o.disabled_at IS NULL)",
        )?
        .query_row(params![hash_secret(id), now as i64], |r| {
            Ok(SessionRow {
                owner: r.get(0)?,
                email: r.get(1)?,
                totp: r.get::<_, Option<bool>>(2)?.unwrap_or(false),
                csrf: r.get(3)?,
                totp_reset_at: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
            })
        })
        .optional()?)
}

pub fn end_session(conn: &Conn, id: &str) -> Result<(), ApiError> {
    conn.prepare_cached("DELETE FROM sessions WHERE id_hash = ?1")?.execute(params![hash_secret(id)])?;
    Ok(())
}

/// Keeps, with the session, that it deleted server `node`: its next servers page says so, once
/// (issue 43: the notice comes from the platform, never from the address bar).
pub fn set_flash_deleted(conn: &Conn, id: &str, node: &str) -> Result<(), ApiError> {
    conn.prepare_cached("UPDATE sessions SET flash_deleted = ?1 WHERE id_hash = ?2")?
        .execute(params![node, hash_secret(id)])?;
    Ok(())
}

/// The server the session deleted since its last servers page, if any; taken, so shown once.
pub fn take_flash_deleted(conn: &Conn, id: &str) -> Result<Option<String>, ApiError> {
    let h = hash_secret(id);
    let node: Option<String> = conn
        .prepare_cached("SELECT flash_deleted FROM sessions WHERE id_hash = ?1")?
        .query_row(params![h], |r| r.get(0))
        .optional()?
        .flatten();
    if node.is_some() {
        conn.prepare_cached("UPDATE sessions SET flash_deleted = NULL WHERE id_hash = ?1")?
            .execute(params![h])?;
    }
    Ok(node)
}

// ---------------------------------------------------------------------------------------------
// API keys

/// An API key as its owner sees it in the list (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRow {
    pub id: String,
    pub label: String,
    pub created_at: u64,
    pub last_used_at: Option<u64>,
}

/// A new API key for `owner`: (its id, the key, shown once).
pub fn create_api_key(conn: &Conn, now: u64, owner: &str, label: &str) -> Result<(String, String), ApiError> {
    let label = label.trim();
    let n = label.chars().count();
    // No control character, and no bidirectional control (issue 46), as a server's name.
    if n == 0
        || n > MAX_KEY_LABEL_CHARS
        || label.chars().any(|c| c.is_control() || crate::store::is_bidi_control(c))
    {
        return Err(AccountError::KeyLabel.into());
    }
    let live: i64 = conn
        .prepare_cached("SELECT COUNT(*) FROM api_keys WHERE owner_id = ?1 AND revoked_at IS NULL")?
        .query_row(params![owner], |r| r.get(0))?;
    if live as usize >= MAX_API_KEYS_PER_OWNER {
        return Err(AccountError::TooManyKeys.into());
    }
    // Revoked keys are not kept for ever: the newest few stay, for the list's history.
    conn.prepare_cached(
        "DELETE FROM api_keys WHERE owner_id = ?1 AND revoked_at IS NOT NULL AND rowid NOT IN
           (SELECT rowid FROM api_keys WHERE owner_id = ?1 AND revoked_at IS NOT NULL
            ORDER BY revoked_at DESC, rowid DESC LIMIT ?2)",
    )?
    .execute(params![owner, MAX_API_KEYS_PER_OWNER as i64])?;
    let id = format!("key-{}", &random_hex()[..12]);
    let key = format!("{API_KEY_PREFIX}{}", random_hex());
    conn.prepare_cached(
        "INSERT INTO api_keys (id, owner_id, key_hash, label, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![id, owner, hash_secret(&key), label, now as i64])?;
    Ok((id, key))
}

/// An owner's live API keys, newest first.
pub fn list_api_keys(conn: &Conn, owner: &str) -> Result<Vec<ApiKeyRow>, ApiError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, label, created_at, last_used_at FROM api_keys
             WHERE owner_id = ?1 AND revoked_at IS NULL ORDER BY created_at DESC, rowid DESC",
        )?
        .query_map(params![owner], |r| {
            Ok(ApiKeyRow {
                id: r.get(0)?,
                label: r.get(1)?,
                created_at: r.get::<_, i64>(2)? as u64,
                last_used_at: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// Revokes one of `owner`'s keys; another owner's key is "not found".
pub fn revoke_api_key(conn: &Conn, now: u64, owner: &str, id: &str) -> Result<(), ApiError> {
    let n = conn
        .prepare_cached(
            "UPDATE api_keys SET revoked_at = ?1 WHERE id = ?2 AND owner_id = ?3 AND revoked_at IS NULL",
        )?
        .execute(params![now as i64, id, owner])?;
    if n == 0 { Err(ApiError::not_found("API key")) } else { Ok(()) }
}

/// The enabled owner an API key belongs to, if it is live; marks it used (at most once a
/// minute, so a busy client does not write on every call).
pub fn owner_by_api_key(conn: &Conn, now: u64, key: &str) -> Result<Option<String>, ApiError> {
    if !key.starts_with(API_KEY_PREFIX) {
        return Ok(None);
    }
    let h = hash_secret(key);
    let owner: Option<String> = conn
        .prepare_cached(
            "SELECT k.owner_id FROM api_keys k JOIN owners o ON o.id = k.owner_id
             WHERE k.key_hash = ?1 AND k.revoked_at IS NULL AND o.disabled_at IS NULL",
        )?
        .query_row(params![h], |r| r.get(0))
        .optional()?;
    if owner.is_some() {
        conn.prepare_cached(
            "UPDATE api_keys SET last_used_at = ?1 WHERE key_hash = ?2 AND (last_used_at IS NULL OR last_used_at < ?1 - 60)",
        )?
        .execute(params![now as i64, h])?;
    }
    Ok(owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store;

    /// A fresh database on the engine of `GPUM_TEST_DB` (`crate::testdb`).
    fn db() -> (crate::testdb::TestDb, Conn) {
        let t = crate::testdb::TestDb::new();
        let c = t.open();
        (t, c)
    }

    #[test]
    fn emails_and_passwords() {
        assert_eq!(normalize_email("  Ann@Example.COM ").unwrap(), "ann@example.com");
        for bad in
            ["", "ann", "@example.com", "ann@", "ann@example", "a b@example.com", "a@b@c.com", "ann@.com"]
        {
            assert_eq!(normalize_email(bad), Err(AccountError::Email), "{bad:?}");
        }
        assert_eq!(check_new_password("short", "short"), Err(AccountError::PasswordShort));
        assert_eq!(
            check_new_password("long enough pw", "long enough px"),
            Err(AccountError::PasswordMismatch)
        );
        let huge = "x".repeat(MAX_PASSWORD_BYTES + 1);
        assert_eq!(check_new_password(&huge, &huge), Err(AccountError::PasswordLong));
        assert!(check_new_password("long enough pw", "long enough pw").is_ok());
        let h = hash_password("long enough pw");
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(!h.contains("long enough pw"));
        assert!(verify_password(&h, "long enough pw"));
        assert!(!verify_password(&h, "long enough px"));
        assert!(!verify_password("not a hash", "long enough pw"));
        assert!(!verify_password(decoy_hash(), "long enough pw"));
    }

    #[test]
    fn invitations_are_one_time_and_only_hashes_are_kept() {
        let (_d, c) = db();
        let (o, token, exp) = invite(&c, 100, "Ann@example.com").unwrap();
        assert_eq!(
            (o.email.as_str(), o.password_set, exp),
            ("ann@example.com", false, 100 + INVITATION_TTL_SECS)
        );
        assert_eq!(invitation(&c, 101, &token).unwrap().unwrap().0, o.id);
        assert!(invitation(&c, 100 + INVITATION_TTL_SECS, &token).unwrap().is_none(), "expired");
        // A second invitation replaces the first.
        let (o2, token2, _) = invite(&c, 102, "ann@EXAMPLE.com").unwrap();
        assert_eq!(o2.id, o.id, "the same owner");
        assert!(invitation(&c, 103, &token).unwrap().is_none(), "the old link stopped working");
        let s = create_session(&c, 103, Some(&o.id)).unwrap();
        assert_eq!(
            accept_invitation(&c, 104, &token2, "$argon2id$x").unwrap(),
            Some(Accepted { owner: o.id.clone(), totp: false })
        );
        assert!(session(&c, 105, &s).unwrap().is_none(), "a new password ends the sessions");
        assert!(accept_invitation(&c, 105, &token2, "$argon2id$y").unwrap().is_none(), "used once");
        assert!(find_owner(&c, "ann@example.com").unwrap().password_set);
        let stored: Vec<String> = c
            .prepare_cached("SELECT token_hash FROM invitations")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(stored.iter().all(|h| *h != token && *h != token2));
        // A disabled owner cannot be invited, nor accept, nor keep a session.
        let (_, t3, _) = invite(&c, 106, "ann@example.com").unwrap();
        let s = create_session(&c, 106, Some(&o.id)).unwrap();
        set_disabled(&c, 107, &o.id, true).unwrap();
        assert!(session(&c, 108, &s).unwrap().is_none());
        assert!(invitation(&c, 108, &t3).unwrap().is_none());
        assert_eq!(invite(&c, 108, "ann@example.com").unwrap_err().code, ErrorCode::InvalidRequest);
        assert!(sign_in_row(&c, "ann@example.com").unwrap().is_none());
        assert!(!set_disabled(&c, 109, "ann@example.com", false).unwrap().disabled);
        assert!(sign_in_row(&c, "ann@example.com").unwrap().is_some());
    }

    #[test]
    fn sessions_survive_a_reopen_expire_and_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        let c = store::open(&path).unwrap();
        let (o, _, _) = invite(&c, 1, "bo@example.com").unwrap();
        let s = create_session(&c, 10, Some(&o.id)).unwrap();
        let op = create_session(&c, 10, None).unwrap();
        drop(c);
        let c = store::open(&path).unwrap();
        let row = session(&c, 11, &s).unwrap().expect("a restart signs no one out");
        assert_eq!(
            (row.owner.as_deref(), row.email.as_deref()),
            (Some(o.id.as_str()), Some("bo@example.com"))
        );
        assert_eq!(row.csrf.len(), 64);
        assert!(session(&c, 11, &op).unwrap().unwrap().owner.is_none(), "the operator's");
        assert!(session(&c, 10 + SESSION_TTL_SECS, &s).unwrap().is_none(), "expired");
        end_session(&c, &op).unwrap();
        assert!(session(&c, 12, &op).unwrap().is_none());
        for i in 0..MAX_SESSIONS_PER_OWNER + 5 {
            create_session(&c, 20 + i as u64, Some(&o.id)).unwrap();
        }
        let n: i64 = c
            .query_row("SELECT COUNT(*) FROM sessions WHERE owner_id = ?1", params![o.id], |r| r.get(0))
            .unwrap();
        assert_eq!(n as usize, MAX_SESSIONS_PER_OWNER);
    }

    #[test]
    fn api_keys_are_shown_once_hashed_scoped_and_revocable() {
        let (_d, c) = db();
        let (a, _, _) = invite(&c, 1, "a@example.com").unwrap();
        let (b, _, _) = invite(&c, 1, "b@example.com").unwrap();
        let (id, key) = create_api_key(&c, 2, &a.id, "ci").unwrap();
        assert!(key.starts_with(API_KEY_PREFIX));
        assert_eq!(owner_by_api_key(&c, 3, &key).unwrap().as_deref(), Some(a.id.as_str()));
        assert!(owner_by_api_key(&c, 3, "gpumk_nope").unwrap().is_none());
        assert_eq!(list_api_keys(&c, &a.id).unwrap()[0].last_used_at, Some(3));
        let n: i64 = c
            .query_row("SELECT COUNT(*) FROM api_keys WHERE key_hash = ?1", params![key], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0, "the key itself is never stored");
        assert_eq!(revoke_api_key(&c, 4, &b.id, &id).unwrap_err().code, ErrorCode::NotFound, "not b's");
        revoke_api_key(&c, 4, &a.id, &id).unwrap();
        assert!(owner_by_api_key(&c, 5, &key).unwrap().is_none(), "revoked");
        assert!(list_api_keys(&c, &a.id).unwrap().is_empty());
        // Issue 43: disabling revokes; enabling again brings no key back.
        let (_, key) = create_api_key(&c, 6, &a.id, "before").unwrap();
        set_disabled(&c, 6, &a.id, true).unwrap();
        assert!(owner_by_api_key(&c, 7, &key).unwrap().is_none(), "refused while disabled");
        set_disabled(&c, 7, &a.id, false).unwrap();
        assert!(owner_by_api_key(&c, 7, &key).unwrap().is_none(), "still revoked once enabled");
        assert!(list_api_keys(&c, &a.id).unwrap().is_empty());
        assert_eq!(create_api_key(&c, 8, &a.id, " ").unwrap_err().code, ErrorCode::InvalidRequest);
        for i in 0..MAX_API_KEYS_PER_OWNER {
            create_api_key(&c, 9, &a.id, &format!("k{i}")).unwrap();
        }
        assert_eq!(create_api_key(&c, 9, &a.id, "one more").unwrap_err().code, ErrorCode::InvalidRequest);
    }

    /// Issue 43: a new key is confirmed only as the session was given it; recovery codes are
    /// hashed, work once in place of a code, and a new set replaces the old; the operator's
    /// reset and a reset invitation end every session and key.
    #[test]
    fn second_factor_changes_recovery_codes_and_resets() {
        let (_d, c) = db();
        let (o, token, _) = invite(&c, 1, "rc@example.com").unwrap();
        accept_invitation(&c, 2, &token, "$argon2id$x").unwrap();
        let now = 1_800_000_000;
        let s = create_session(&c, now, Some(&o.id)).unwrap();
        let other = create_session(&c, now, Some(&o.id)).unwrap();
        assert_eq!(confirm_totp(&c, now, &o.id, &s, "123456").unwrap(), TotpConfirm::NotStarted);
        let secret = new_totp_secret();
        start_totp_change(&c, now, &s, &secret).unwrap();
        let code = totp_code(&secret, now).unwrap();
        assert_eq!(
            confirm_totp(&c, now, &o.id, &other, &code).unwrap(),
            TotpConfirm::NotStarted,
            "another session was given no key"
        );
        assert_eq!(
            confirm_totp(&c, now + TOTP_PENDING_SECS, &o.id, &s, &code).unwrap(),
            TotpConfirm::NotStarted,
            "too late"
        );
        let wrong = if code == "000000" { "111111" } else { "000000" };
        assert_eq!(confirm_totp(&c, now, &o.id, &s, wrong).unwrap(), TotpConfirm::WrongCode(secret.clone()));
        let TotpConfirm::On(codes) = confirm_totp(&c, now, &o.id, &s, &code).unwrap() else { panic!() };
        assert_eq!(codes.len(), RECOVERY_CODES);
        assert!(find_owner(&c, &o.id).unwrap().totp);
        assert_eq!(confirm_totp(&c, now, &o.id, &s, &code).unwrap(), TotpConfirm::NotStarted, "spent");
        let stored: Vec<String> = c
            .prepare_cached("SELECT code_hash FROM recovery_codes")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(stored.len(), RECOVERY_CODES);
        assert!(codes.iter().all(|k| !stored.contains(k) && !stored.contains(&k.replace('-', ""))));
        // In place of a code, each once, typed any way.
        assert!(use_second_factor(&c, now, &o.id, &codes[0]).unwrap());
        assert!(!use_second_factor(&c, now, &o.id, &codes[0]).unwrap(), "once");
        assert!(use_second_factor(&c, now, &o.id, &codes[1].to_uppercase().replace('-', " ")).unwrap());
        assert!(!use_second_factor(&c, now, &o.id, "aaaa-aaaa-aaaa-aaaa").unwrap());
        assert_eq!(normalize_recovery_code("abcd-efgh-ijkl-mno1"), None, "1 is not base32");
        let (b, _, _) = invite(&c, 1, "other@example.com").unwrap();
        assert!(!use_second_factor(&c, now, &b.id, &codes[2]).unwrap(), "not another owner's");
        let fresh = replace_recovery_codes(&c, now, &o.id).unwrap();
        assert!(!use_second_factor(&c, now, &o.id, &codes[2]).unwrap(), "the old set is gone");
        assert!(use_second_factor(&c, now, &o.id, &fresh[0]).unwrap());

        // The operator's reset.
        let (_, key) = create_api_key(&c, now, &o.id, "k").unwrap();
        let after = reset_second_factor(&c, now + 5, "RC@example.com").unwrap();
        assert!(!after.totp);
        assert!(
            session(&c, now + 6, &s).unwrap().is_none() && session(&c, now + 6, &other).unwrap().is_none()
        );
        assert!(owner_by_api_key(&c, now + 6, &key).unwrap().is_none());
        assert!(!use_second_factor(&c, now, &o.id, &fresh[1]).unwrap(), "its recovery codes went with it");
        let s = create_session(&c, now + 7, Some(&o.id)).unwrap();
        assert_eq!(session(&c, now + 7, &s).unwrap().unwrap().totp_reset_at, Some(now + 5));
        assert_eq!(reset_second_factor(&c, now, "nobody@example.com").unwrap_err().code, ErrorCode::NotFound);

        // A reset invitation ends every session and key, and says the second factor is on.
        set_totp(&c, &o.id, Some(&secret)).unwrap();
        assert_eq!(session(&c, now + 7, &s).unwrap().unwrap().totp_reset_at, None, "on again: no notice");
        let (_, key) = create_api_key(&c, now + 8, &o.id, "k2").unwrap();
        let (_, t, _) = invite(&c, now + 8, "rc@example.com").unwrap();
        assert_eq!(
            accept_invitation(&c, now + 9, &t, "$argon2id$y").unwrap(),
            Some(Accepted { owner: o.id.clone(), totp: true })
        );
        assert!(session(&c, now + 9, &s).unwrap().is_none());
        assert!(owner_by_api_key(&c, now + 9, &key).unwrap().is_none());
    }

    /// Issue 43: the servers page's notice is what the session did, shown once.
    #[test]
    fn a_deleted_notice_is_kept_with_the_session_and_shown_once() {
        let (_d, c) = db();
        let (o, _, _) = invite(&c, 1, "f@example.com").unwrap();
        let s = create_session(&c, 2, Some(&o.id)).unwrap();
        let other = create_session(&c, 2, Some(&o.id)).unwrap();
        assert_eq!(take_flash_deleted(&c, &s).unwrap(), None);
        set_flash_deleted(&c, &s, "node-1").unwrap();
        assert_eq!(take_flash_deleted(&c, &other).unwrap(), None, "only the session's own");
        assert_eq!(take_flash_deleted(&c, &s).unwrap().as_deref(), Some("node-1"));
        assert_eq!(take_flash_deleted(&c, &s).unwrap(), None, "once");
    }

    #[test]
    fn totp_codes_work_once_within_a_step_of_skew() {
        let (_d, c) = db();
        let (o, _, _) = invite(&c, 1, "t@example.com").unwrap();
        let secret = new_totp_secret();
        assert_eq!(secret.len(), 32, "160 bits in base32");
        let now = 1_800_000_000;
        let code = totp_code(&secret, now).unwrap();
        assert!(!use_totp_code(&c, now, &o.id, &code, None).unwrap(), "no secret yet");
        assert!(use_totp_code(&c, now, &o.id, &code, Some(&secret)).unwrap(), "the pending secret's code");
        set_totp(&c, &o.id, Some(&secret)).unwrap();
        assert!(!use_totp_code(&c, now, &o.id, &code, None).unwrap(), "a code works once");
        let next = totp_code(&secret, now + 30).unwrap();
        assert!(use_totp_code(&c, now + 45, &o.id, &next, None).unwrap(), "one step of skew");
        let old = totp_code(&secret, now - 300).unwrap();
        assert!(!use_totp_code(&c, now + 300, &o.id, &old, None).unwrap(), "too old");
        assert!(!use_totp_code(&c, now + 300, &o.id, "12345a", None).unwrap());
        assert!(
            totp_link(&secret, "t@example.com").starts_with("otpauth://totp/gpum%3At%40example.com?secret=")
        );
    }

    // Issue 44: the owners' list came whole on every request.
    #[test]
    fn owners_come_a_page_at_a_time_each_once() {
        let (_t, c) = db();
        // Seven owners, several created in the same second (the e-mail breaks the tie).
        for (i, at) in [1, 1, 1, 2, 2, 3, 4].iter().enumerate() {
            invite(&c, *at, &format!("o{i}@example.org")).unwrap();
        }
        let all: Vec<String> = list_owners(&c).unwrap().into_iter().map(|o| o.email).collect();
        assert_eq!(all.len(), 7);
        let (mut seen, mut sizes) = (Vec::new(), Vec::new());
        let mut page = store::Page { limit: 3, after: None };
        loop {
            let got = list_owners_page(&c, &page).unwrap();
            sizes.push(got.owners.len());
            seen.extend(got.owners.into_iter().map(|o| o.email));
            match got.next {
                Some(next) => page.after = Some(store::Cursor::parse(&next).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, all, "each once, oldest first");
        assert_eq!(sizes, [3, 3, 1]);
        let whole = list_owners_page(&c, &store::Page { limit: 7, after: None }).unwrap();
        assert_eq!((whole.owners.len(), whole.next), (7, None));
    }
}
