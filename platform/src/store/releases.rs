//! Signed in-place agent upgrades (issue 47): the releases the operator added, their rollouts,
//! and what a heartbeat records of an agent's version and upgrades. The rules (who is offered
//! which version, when the failures halt a rollout, what an operator's action does) are
//! `gpum_platform_core::rollout`'s; this module reads and writes.
//!
//! The platform need not know the release key: it stores the signed dist's files as they are
//! and serves them; the agent verifies them against the key compiled into it and refuses a
//! version that is not newer than its own. `releases add` still checks that the files agree
//! with each other, so an operator's mistake is caught before any agent downloads it.

use super::*;
use gpum_platform_core::rollout::{self, Action, Tally};
use gpum_protocol::upgrade::{DEFAULT_MAX_FAILURE_PERCENT, RELEASE_FILES};
use gpum_protocol::{
    HaltReason, ReleaseList, ReleaseSummary, RolloutRequest, RolloutState, RolloutStep, RolloutSummary,
    UpgradeOutcome,
};

use crate::rules::heartbeat::BeatPlan;

/// The artifact a release carries.
pub const AGENT_FILE: &str = "gpum-agent";
/// The largest agent binary accepted (the release-small agent is a few MiB).
pub const MAX_AGENT_SIZE: u64 = 256 * 1024 * 1024;
/// The largest metadata file (release.json, manifest.json, a signature) accepted.
const MAX_META_SIZE: u64 = 1024 * 1024;

/// `release.json` (written by `cargo xtask sign`, verified by the agent with
/// `gpum_repo_keys::release::verify_release`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseMeta {
    format: u32,
    version: String,
    expires: u64,
    manifest_sha256: String,
}

/// `manifest.json` (format 1), as far as the platform reads it.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    artifacts: Vec<ManifestEntry>,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestEntry {
    name: String,
    version: String,
    size: u64,
    sha256: String,
}

/// A release's five files, read from a dist directory ([`RELEASE_FILES`], in that order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseFiles {
    pub release_json: Vec<u8>,
    pub release_sig: Vec<u8>,
    pub manifest_json: Vec<u8>,
    pub manifest_sig: Vec<u8>,
    pub agent: Vec<u8>,
}

/// What [`check_release`] found in agreeing files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedRelease {
    pub version: String,
    pub expires: u64,
    pub agent_sha256: String,
}

/// Reads a dist directory's five files (each a regular file, not a link; the metadata at most
/// 1 MiB, the agent at most [`MAX_AGENT_SIZE`]).
pub fn read_release_dir(dir: &Path) -> Result<ReleaseFiles, String> {
    let read = |name: &str, max: u64| -> Result<Vec<u8>, String> {
        let path = dir.join(name);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.file_type().is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if meta.len() > max {
            return Err(format!("{} is larger than {max} bytes", path.display()));
        }
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
    };
    Ok(ReleaseFiles {
        release_json: read(RELEASE_FILES[0], MAX_META_SIZE)?,
        release_sig: read(RELEASE_FILES[1], MAX_META_SIZE)?,
        manifest_json: read(RELEASE_FILES[2], MAX_META_SIZE)?,
        manifest_sig: read(RELEASE_FILES[3], MAX_META_SIZE)?,
        agent: read(RELEASE_FILES[4], MAX_AGENT_SIZE)?,
    })
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether the files agree with each other: `release.json` (format 1, a `MAJOR.MINOR.PATCH`
/// version) names the manifest's SHA-256, the manifest lists `gpum-agent` at that version, and
/// the agent's size and SHA-256 are the manifest's. The signatures are the agent's to verify
/// (it holds the key); here they must only be present. Pure: every refusal says what differs.
pub fn check_release(f: &ReleaseFiles, now: u64) -> Result<CheckedRelease, String> {
    let meta: ReleaseMeta =
        serde_json::from_slice(&f.release_json).map_err(|e| format!("release.json is not readable: {e}"))?;
    if meta.format != 1 {
        return Err(format!("release.json has format {}; this platform reads format 1", meta.format));
    }
    if rollout::parse_version(&meta.version).is_none() {
        return Err(format!("release.json's version {:?} is not MAJOR.MINOR.PATCH", meta.version));
    }
    if meta.expires <= now {
        return Err(format!(
            "release.json expired (at {}); agents would refuse it: sign the release again",
            meta.expires
        ));
    }
    if !is_hex64(&meta.manifest_sha256) {
        return Err("release.json's manifest_sha256 is not 64 lowercase hex digits".into());
    }
    let manifest_sha = hex::encode(Sha256::digest(&f.manifest_json));
    if manifest_sha != meta.manifest_sha256 {
        return Err(format!(
            "release.json names manifest {} but manifest.json's SHA-256 is {manifest_sha}: they are not of one release",
            meta.manifest_sha256
        ));
    }
    if f.release_sig.is_empty() || f.manifest_sig.is_empty() {
        return Err("a signature file (release.json.sig, manifest.json.sig) is empty".into());
    }
    let m: Manifest = serde_json::from_slice(&f.manifest_json)
        .map_err(|e| format!("manifest.json is not readable: {e}"))?;
    if m.format != 1 {
        return Err(format!("manifest.json has format {}; this platform reads format 1", m.format));
    }
    let e = m
        .artifacts
        .iter()
        .find(|e| e.name == AGENT_FILE)
        .ok_or_else(|| "manifest.json lists no gpum-agent".to_owned())?;
    if e.version != meta.version {
        return Err(format!(
            "manifest.json lists gpum-agent {} but release.json is version {}",
            e.version, meta.version
        ));
    }
    if e.size != f.agent.len() as u64 {
        return Err(format!("gpum-agent is {} bytes; manifest.json says {}", f.agent.len(), e.size));
    }
    let agent_sha = hex::encode(Sha256::digest(&f.agent));
    if agent_sha != e.sha256 {
        return Err(format!("gpum-agent's SHA-256 is {agent_sha}; manifest.json says {}", e.sha256));
    }
    Ok(CheckedRelease { version: meta.version, expires: meta.expires, agent_sha256: agent_sha })
}

/// A request that does not fit the releases' state (a version added twice, an action that does
/// not apply): 400, with the reason.
fn conflict(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, msg)
}

/// `releases add DIR`: stores a release whose files agree ([`check_release`]); a version
/// added before is refused, whatever its bytes.
pub fn add_release(conn: &Conn, now: u64, f: &ReleaseFiles) -> Result<ReleaseSummary, ApiError> {
    let c = check_release(f, now).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e))?;
    let exists = conn
        .prepare_cached("SELECT 1 FROM releases WHERE version = ?1")?
        .query_row(params![c.version], |r| r.get::<_, i64>(0))
        .optional()?;
    if exists.is_some() {
        return Err(conflict(format!("release {} was added already", c.version)));
    }
    conn.prepare_cached(
        "INSERT INTO releases (version, added_at, expires, agent_size, agent_sha256, release_json, release_sig,
                               manifest_json, manifest_sig, agent)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        c.version,
        now as i64,
        c.expires as i64,
        f.agent.len() as i64,
        c.agent_sha256,
        f.release_json,
        f.release_sig,
        f.manifest_json,
        f.manifest_sig,
        f.agent
    ])?;
    Ok(ReleaseSummary {
        version: c.version,
        added_at: now,
        agent_size: f.agent.len() as u64,
        agent_sha256: c.agent_sha256,
        expires: c.expires,
        rollout: None,
    })
}

/// One file of a release, exactly as added; `None` for an unknown release or file name.
pub fn release_file(conn: &Conn, version: &str, file: &str) -> Result<Option<Vec<u8>>, ApiError> {
    let column = match file {
        "release.json" => "release_json",
        "release.json.sig" => "release_sig",
        "manifest.json" => "manifest_json",
        "manifest.json.sig" => "manifest_sig",
        AGENT_FILE => "agent",
        _ => return Ok(None),
    };
    let sql = format!("SELECT {column} FROM releases WHERE version = ?1");
    Ok(conn.prepare_cached(&sql)?.query_row(params![version], |r| r.get::<_, Vec<u8>>(0)).optional()?)
}

/// The nodes that reported on `version`, and how many rolled back or refused it.
fn tally(conn: &Conn, version: &str) -> Result<Tally, ApiError> {
    let (reported, failed): (i64, Option<i64>) = conn
        .prepare_cached(
            "SELECT COUNT(*), SUM(CASE WHEN upgrade_outcome = ?2 OR upgrade_outcome = ?3 THEN 1 ELSE 0 END)
             FROM nodes WHERE upgrade_to = ?1 AND deleted_at IS NULL",
        )?
        .query_row(params![version, UpgradeOutcome::RolledBack, UpgradeOutcome::Refused], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok(Tally { reported: reported.max(0) as u32, failed: failed.unwrap_or(0).max(0) as u32 })
}

const ROLLOUT_COLUMNS: &str =
    "version, state, percent, max_failure_percent, halt_reason, halt_reported, halt_failed,
     started_at, updated_at, offer_regardless, step_percent, step_secs, stepped_at";

/// A schedule as stored: none unless both the step and the interval are set.
pub(super) fn stored_step(step_percent: i64, step_secs: i64) -> Option<RolloutStep> {
    (step_percent > 0 && step_secs > 0)
        .then(|| RolloutStep { percent: step_percent.min(100) as u8, every_secs: step_secs as u64 })
}

/// A rollout row as of `now`: an active one's percentage is where its schedule has brought it
/// ([`rollout::scheduled_percent`]); any other's is the one folded in when it stopped.
fn rollout_row(r: &crate::sql::Row<'_>, now: u64) -> crate::sql::Result<RolloutSummary> {
    let state: RolloutState = r.get(1)?;
    let percent = r.get::<_, i64>(2)?.clamp(0, 100) as u8;
    let step = stored_step(r.get(10)?, r.get(11)?);
    let since = r.get::<_, i64>(12)?.max(0) as u64;
    Ok(RolloutSummary {
        version: r.get(0)?,
        state,
        percent: rollout::scheduled_percent(state, percent, step, since, now),
        max_failure_percent: r.get::<_, i64>(3)?.clamp(0, 100) as u8,
        halt_reason: r.get(4)?,
        reported: r.get::<_, Option<i64>>(5)?.unwrap_or(0).max(0) as u32,
        failed: r.get::<_, Option<i64>>(6)?.unwrap_or(0).max(0) as u32,
        started_at: r.get::<_, i64>(7)?.max(0) as u64,
        updated_at: r.get::<_, i64>(8)?.max(0) as u64,
        offer_regardless: r.get(9)?,
        step,
        next_step_at: rollout::next_step_at(state, percent, step, since, now),
    })
}

/// Before an active rollout stops (pause, halt, another rollout), the percentage its schedule
/// reached becomes its stored one, so that it shows and resumes from there.
fn fold_schedule(conn: &Conn, now: u64, version: &str) -> Result<(), ApiError> {
    let row = conn
        .prepare_cached(
            "SELECT percent, step_percent, step_secs, stepped_at FROM rollouts WHERE version = ?1 AND state = ?2",
        )?
        .query_row(params![version, RolloutState::Active], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?))
        })
        .optional()?;
    if let Some((percent, step_percent, step_secs, since)) = row
        && let Some(step) = stored_step(step_percent, step_secs)
    {
        let reached = rollout::scheduled_percent(
            RolloutState::Active,
            percent.clamp(0, 100) as u8,
            Some(step),
            since.max(0) as u64,
            now,
        );
        conn.prepare_cached("UPDATE rollouts SET percent = ?2, stepped_at = ?3 WHERE version = ?1")?
            .execute(params![version, i64::from(reached), now as i64])?;
    }
    Ok(())
}

/// A rollout's counts: frozen at the halt for one the failures halted, else as they are now.
fn with_counts(conn: &Conn, mut r: RolloutSummary) -> Result<RolloutSummary, ApiError> {
    if r.halt_reason != Some(HaltReason::Failures) {
        let t = tally(conn, &r.version)?;
        (r.reported, r.failed) = (t.reported, t.failed);
    }
    Ok(r)
}

/// The current rollout at `now`: the latest started that is not `done` (active, paused or
/// halted).
pub fn current_rollout(conn: &Conn, now: u64) -> Result<Option<RolloutSummary>, ApiError> {
    let sql = format!(
        "SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE state <> ?1 ORDER BY started_at DESC, version DESC LIMIT 1"
    );
    let r = conn
        .prepare_cached(&sql)?
        .query_row(params![RolloutState::Done], |r| rollout_row(r, now))
        .optional()?;
    r.map(|r| with_counts(conn, r)).transpose()
}

/// Every release, newest added first, with its rollout as of `now`.
pub fn list_releases(conn: &Conn, now: u64) -> Result<ReleaseList, ApiError> {
    let rows: Vec<ReleaseSummary> = conn
        .prepare_cached(
            "SELECT version, added_at, agent_size, agent_sha256, expires FROM releases
             ORDER BY added_at DESC, version DESC",
        )?
        .query_map(params![], |r| {
            Ok(ReleaseSummary {
                version: r.get(0)?,
                added_at: r.get::<_, i64>(1)?.max(0) as u64,
                agent_size: r.get::<_, i64>(2)?.max(0) as u64,
                agent_sha256: r.get(3)?,
                expires: r.get::<_, i64>(4)?.max(0) as u64,
                rollout: None,
            })
        })?
        .collect::<Result<_, _>>()?;
    let sql = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts");
    let rollouts: Vec<RolloutSummary> = conn
        .prepare_cached(&sql)?
        .query_map(params![], |r| rollout_row(r, now))?
        .collect::<Result<_, _>>()?;
    let mut releases = Vec::with_capacity(rows.len());
    for mut rel in rows {
        if let Some(r) = rollouts.iter().find(|r| r.version == rel.version) {
            rel.rollout = Some(with_counts(conn, r.clone())?);
        }
        releases.push(rel);
    }
    Ok(ReleaseList { releases })
}

/// `releases rollout VERSION --percent N`: offers an added release to `percent` % of the
/// eligible nodes. Another current rollout becomes `done`; the same version's is changed
/// (its percentage, its share) and made active again (also after a halt: the operator decided).
/// `offer_regardless` is refused unless `allow_test_knobs` (a test-knobs build).
pub fn start_rollout(
    conn: &Conn,
    now: u64,
    version: &str,
    req: &RolloutRequest,
    allow_test_knobs: bool,
) -> Result<RolloutSummary, ApiError> {
    if req.percent > 100 {
        return Err(invalid(format!("percent: 0 to 100, got {}", req.percent)));
    }
    let share = req.max_failure_percent.unwrap_or(DEFAULT_MAX_FAILURE_PERCENT);
    if share > 100 {
        return Err(invalid(format!("max_failure_percent: 0 to 100, got {share}")));
    }
    if req.offer_regardless && !allow_test_knobs {
        return Err(invalid("offer_regardless exists only in test builds"));
    }
    if let Some(step) = &req.step {
        rollout::check_step(step).map_err(invalid)?;
    }
    let (step_percent, step_secs) =
        req.step.map_or((0, 0), |s| (i64::from(s.percent), s.every_secs.min(i64::MAX as u64) as i64));
    let known = conn
        .prepare_cached("SELECT 1 FROM releases WHERE version = ?1")?
        .query_row(params![version], |r| r.get::<_, i64>(0))
        .optional()?;
    if known.is_none() {
        return Err(ApiError::not_found("release"));
    }
    if let Some(cur) = current_rollout(conn, now)?
        && cur.version != version
    {
        fold_schedule(conn, now, &cur.version)?;
    }
    conn.prepare_cached(
        "UPDATE rollouts SET state = ?1, updated_at = ?2 WHERE version <> ?3 AND state <> ?1",
    )?
    .execute(params![RolloutState::Done, now as i64, version])?;
    let changed = conn
        .prepare_cached(
            "UPDATE rollouts SET state = ?2, percent = ?3, max_failure_percent = ?4, offer_regardless = ?5,
                 halt_reason = NULL, halt_reported = NULL, halt_failed = NULL, updated_at = ?6,
                 step_percent = ?7, step_secs = ?8, stepped_at = ?6
             WHERE version = ?1",
        )?
        .execute(params![
            version,
            RolloutState::Active,
            i64::from(req.percent),
            i64::from(share),
            req.offer_regardless,
            now as i64,
            step_percent,
            step_secs
        ])?;
    if changed == 0 {
        conn.prepare_cached(
            "INSERT INTO rollouts (version, state, percent, max_failure_percent, offer_regardless, started_at, updated_at,
                 step_percent, step_secs, stepped_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?6)",
        )?
        .execute(params![
            version,
            RolloutState::Active,
            i64::from(req.percent),
            i64::from(share),
            req.offer_regardless,
            now as i64,
            step_percent,
            step_secs
        ])?;
    } else {
        // A rollout made active again starts its step now (its order among rollouts too).
        conn.prepare_cached("UPDATE rollouts SET started_at = ?2 WHERE version = ?1")?
            .execute(params![version, now as i64])?;
    }
    current_rollout(conn, now)?.ok_or_else(ApiError::internal)
}

/// `releases pause|resume|halt`: the current rollout's state by [`rollout::apply`]; refused
/// when there is none or the action does not apply to its state.
pub fn rollout_action(conn: &Conn, now: u64, action: Action) -> Result<RolloutSummary, ApiError> {
    let Some(cur) = current_rollout(conn, now)? else {
        return Err(conflict("no rollout is current (releases rollout VERSION --percent N starts one)"));
    };
    let Some(next) = rollout::apply(cur.state, action) else {
        return Err(conflict(format!(
            "the rollout of {} is {}: {action:?} does not apply",
            cur.version, cur.state
        )));
    };
    let reason = (next == RolloutState::Halted).then_some(HaltReason::Operator);
    // Stopping keeps the percentage the schedule reached; resuming counts the next step from
    // now (`stepped_at`): the time stopped does not count.
    fold_schedule(conn, now, &cur.version)?;
    conn.prepare_cached(
        "UPDATE rollouts SET state = ?2, halt_reason = ?3, halt_reported = NULL, halt_failed = NULL, updated_at = ?4,
             stepped_at = ?4
         WHERE version = ?1",
    )?
    .execute(params![cur.version, next, reason, now as i64])?;
    current_rollout(conn, now)?.ok_or_else(ApiError::internal)
}

/// What a heartbeat's plan writes of the agent's upgrades (all rare: a steady beat writes
/// nothing here): the agent's version and switch when they changed, the offer when it changed,
/// a new upgrade report, and the halt when that report's failure puts the active rollout's
/// failures over its share.
pub(super) fn apply_beat(conn: &Conn, now: u64, node_id: &str, plan: &BeatPlan) -> Result<(), ApiError> {
    if let Some(a) = &plan.agent {
        conn.prepare_cached("UPDATE nodes SET agent_version = ?2, agent_auto_update = ?3 WHERE id = ?1")?
            .execute(params![node_id, a.version, a.auto_update])?;
    }
    if plan.offer_changed {
        conn.prepare_cached("UPDATE nodes SET upgrade_offered = ?2 WHERE id = ?1")?
            .execute(params![node_id, plan.offer.as_ref().map(|o| o.version.as_str())])?;
    }
    if let Some(u) = &plan.upgrade_report {
        conn.prepare_cached(
            "UPDATE nodes SET upgrade_from = ?2, upgrade_to = ?3, upgrade_outcome = ?4, upgrade_detail = ?5,
                 upgrade_at = ?6, upgrade_recorded_at = ?7
             WHERE id = ?1",
        )?
        .execute(params![
            node_id,
            u.from,
            u.to,
            u.outcome,
            u.detail,
            u.at.min(i64::MAX as u64) as i64,
            now as i64
        ])?;
    }
    if let Some(version) = &plan.tally {
        let row = conn
            .prepare_cached("SELECT state, max_failure_percent FROM rollouts WHERE version = ?1")?
            .query_row(params![version], |r| Ok((r.get::<_, RolloutState>(0)?, r.get::<_, i64>(1)?)))
            .optional()?;
        if let Some((state, share)) = row {
            let t = tally(conn, version)?;
            if let Some(reason) = rollout::halt(state, t, share.clamp(0, 100) as u8) {
                fold_schedule(conn, now, version)?;
                conn.prepare_cached(
                    "UPDATE rollouts SET state = ?2, halt_reason = ?3, halt_reported = ?4, halt_failed = ?5, updated_at = ?6
                     WHERE version = ?1 AND state IN (?7, ?8)",
                )?
                .execute(params![
                    version,
                    RolloutState::Halted,
                    reason,
                    i64::from(t.reported),
                    i64::from(t.failed),
                    now as i64,
                    RolloutState::Active,
                    RolloutState::Paused
                ])?;
                tracing::warn!(version = %version, failed = t.failed, reported = t.reported, "rollout halted: too many nodes failed to upgrade");
            }
        }
    }
    Ok(())
}

/// The node's upgrades as its summary shows them (`NodeSummary::upgrades`), from the columns
/// [`super::nodes`]'s row mapping reads.
#[allow(clippy::too_many_arguments)]
pub(super) fn node_upgrades(
    auto_update: bool,
    agent_auto_update: Option<bool>,
    offered: Option<String>,
    from: Option<String>,
    to: Option<String>,
    outcome: Option<UpgradeOutcome>,
    detail: Option<String>,
    at: Option<i64>,
) -> gpum_protocol::NodeUpgrades {
    let last = match (from, to, outcome) {
        (Some(from), Some(to), Some(outcome)) => Some(gpum_protocol::UpgradeReport {
            from,
            to,
            outcome,
            detail: detail.unwrap_or_default(),
            at: at.unwrap_or(0).max(0) as u64,
        }),
        _ => None,
    };
    gpum_protocol::NodeUpgrades { auto_update, agent_auto_update, pending: offered, last }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_protocol::{UpgradeReport, limits};

    const NOW: u64 = 1_800_000_000;

    /// Files that agree: an agent, its manifest entry at `version`, release.json naming the
    /// manifest (the signatures are the agent's to check; here they are only present).
    fn files(version: &str) -> ReleaseFiles {
        let agent = format!("\x7fELF agent {version}").repeat(100).into_bytes();
        let manifest = serde_json::to_vec_pretty(&serde_json::json!({"format": 1, "artifacts": [
            {"name": "gpum-agent", "version": version, "size": agent.len(), "sha256": hex::encode(Sha256::digest(&agent))},
            {"name": "gpum-install", "version": version, "size": 1, "sha256": "0".repeat(64)},
        ]}))
        .unwrap();
        let release = serde_json::to_vec(&serde_json::json!({
            "format": 1, "version": version, "expires": NOW + 86_400,
            "manifest_sha256": hex::encode(Sha256::digest(&manifest)),
        }))
        .unwrap();
        ReleaseFiles {
            release_json: release,
            release_sig: b"-----BEGIN PGP SIGNATURE-----".to_vec(),
            manifest_json: manifest,
            manifest_sig: b"-----BEGIN PGP SIGNATURE-----".to_vec(),
            agent,
        }
    }

    fn with_release(f: &ReleaseFiles, edit: impl FnOnce(&mut serde_json::Value)) -> ReleaseFiles {
        let mut v: serde_json::Value = serde_json::from_slice(&f.release_json).unwrap();
        edit(&mut v);
        ReleaseFiles { release_json: serde_json::to_vec(&v).unwrap(), ..f.clone() }
    }

    #[test]
    fn a_release_whose_files_disagree_is_refused_with_what_differs() {
        let good = files("0.2.0");
        assert_eq!(check_release(&good, NOW).unwrap().version, "0.2.0");
        let cases: Vec<(ReleaseFiles, &str)> = vec![
            (ReleaseFiles { agent: b"another agent".to_vec(), ..good.clone() }, "bytes; manifest.json says"),
            (
                ReleaseFiles { agent: good.agent.iter().map(|b| b ^ 1).collect(), ..good.clone() },
                "SHA-256 is",
            ),
            (with_release(&good, |v| v["version"] = "0.3.0".into()), "but release.json is version 0.3.0"),
            (with_release(&good, |v| v["manifest_sha256"] = "a".repeat(64).into()), "not of one release"),
            (with_release(&good, |v| v["expires"] = NOW.into()), "expired"),
            (with_release(&good, |v| v["format"] = 2.into()), "format 2"),
            (with_release(&good, |v| v["extra"] = true.into()), "not readable"),
            (with_release(&good, |v| v["version"] = "0.2".into()), "MAJOR.MINOR.PATCH"),
            (ReleaseFiles { manifest_sig: Vec::new(), ..good.clone() }, "empty"),
        ];
        for (f, want) in cases {
            let err = check_release(&f, NOW).unwrap_err();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        }
        // A manifest without gpum-agent.
        let mut f = good.clone();
        f.manifest_json = br#"{"format":1,"artifacts":[]}"#.to_vec();
        let f = with_release(&f, |v| {
            v["manifest_sha256"] = hex::encode(Sha256::digest(br#"{"format":1,"artifacts":[]}"#)).into()
        });
        assert!(check_release(&f, NOW).unwrap_err().contains("no gpum-agent"));
    }

    fn node(c: &Conn, uuid: &str) -> RegisterResponse {
        let code = create_join_code(c, NOW, 60, &Scope::All).unwrap().code;
        let mut inventory = Inventory::default();
        inventory.private.gpu_uuids = vec![uuid.into()];
        let req =
            RegisterRequest { join_code: code, agent_version: "0.1.0".into(), inventory, install_id: None };
        register(c, NOW, &req, 10).unwrap()
    }

    fn beat(seq: u64, upgrade: Option<UpgradeReport>) -> HeartbeatRequest {
        HeartbeatRequest {
            seq,
            agent_version: Some("0.1.0".into()),
            auto_update: Some(true),
            upgrade,
            ..Default::default()
        }
    }

    fn rollout(percent: u8) -> RolloutRequest {
        RolloutRequest { percent, max_failure_percent: None, offer_regardless: false, step: None }
    }

    #[test]
    fn a_release_is_stored_as_added_and_served_by_name_only() {
        let (_t, c) = super::super::tests::db();
        let f = files("0.2.0");
        let added = add_release(&c, NOW, &f).unwrap();
        assert_eq!((added.agent_size, added.expires), (f.agent.len() as u64, NOW + 86_400));
        assert!(add_release(&c, NOW, &f).unwrap_err().message.contains("added already"));
        for (name, want) in RELEASE_FILES.iter().zip([
            &f.release_json,
            &f.release_sig,
            &f.manifest_json,
            &f.manifest_sig,
            &f.agent,
        ]) {
            assert_eq!(release_file(&c, "0.2.0", name).unwrap().as_ref(), Some(want), "{name}");
        }
        assert_eq!(release_file(&c, "0.2.0", "gpum-install").unwrap(), None);
        assert_eq!(release_file(&c, "0.2.0", "../agent").unwrap(), None);
        assert_eq!(release_file(&c, "0.9.0", "gpum-agent").unwrap(), None);
        assert_eq!(list_releases(&c, NOW).unwrap().releases.len(), 1);
    }

    /// A schedule raises the percentage by whole steps of active time: the heartbeat's offer
    /// follows it, a pause keeps the percentage reached, and a resume counts the next step
    /// from the resume.
    #[test]
    fn a_scheduled_rollout_rises_by_itself_and_a_pause_stops_its_clock() {
        let (_t, c) = super::super::tests::db();
        let a = node(&c, "GPU-a");
        add_release(&c, NOW, &files("0.2.0")).unwrap();
        let hour = 3600;
        let every = |percent, every_secs| RolloutRequest {
            step: Some(RolloutStep { percent, every_secs }),
            ..rollout(0)
        };
        assert!(start_rollout(&c, NOW, "0.2.0", &every(0, hour), false).is_err(), "a step of 0 %");
        assert!(start_rollout(&c, NOW, "0.2.0", &every(10, 59), false).is_err(), "under a minute");
        let r = start_rollout(&c, NOW, "0.2.0", &every(50, hour), false).unwrap();
        assert_eq!((r.percent, r.next_step_at), (0, Some(NOW + hour)));
        let offered =
            |seq: u64, t: u64| heartbeat(&c, t, &a.node_token, &beat(seq, None), 10).unwrap().upgrade;
        assert_eq!(offered(1, NOW + hour - 1), None, "0 % offers none");
        let at = |t: u64| current_rollout(&c, t).unwrap().unwrap();
        assert_eq!((at(NOW + hour).percent, at(NOW + hour).next_step_at), (50, Some(NOW + 2 * hour)));
        // Paused half-way through the second step: stays at 50 %, no next step.
        let p = rollout_action(&c, NOW + hour + hour / 2, Action::Pause).unwrap();
        assert_eq!((p.state, p.percent, p.next_step_at), (RolloutState::Paused, 50, None));
        assert_eq!(at(NOW + 10 * hour).percent, 50, "a paused rollout does not move");
        // Resumed ten hours on: the next step an hour after the resume, then 100 %.
        let resumed = NOW + 10 * hour;
        let r = rollout_action(&c, resumed, Action::Resume).unwrap();
        assert_eq!((r.percent, r.next_step_at), (50, Some(resumed + hour)));
        assert_eq!(at(resumed + hour - 1).percent, 50);
        assert_eq!((at(resumed + hour).percent, at(resumed + hour).next_step_at), (100, None));
        assert_eq!(
            offered(2, resumed + hour).map(|o| o.version).as_deref(),
            Some("0.2.0"),
            "at 100 % every node"
        );
        // Another rollout ends this one at the percentage it reached.
        add_release(&c, NOW, &files("0.3.0")).unwrap();
        start_rollout(&c, resumed + 2 * hour, "0.3.0", &rollout(0), false).unwrap();
        let list = list_releases(&c, resumed + 20 * hour).unwrap().releases;
        let old = list.iter().find(|r| r.version == "0.2.0").unwrap().rollout.clone().unwrap();
        assert_eq!((old.state, old.percent, old.next_step_at), (RolloutState::Done, 100, None));
    }

    /// A failure reported while the rollout is paused halts it: resuming would otherwise hand
    /// the version out again as if nothing had failed.
    #[test]
    fn a_failure_reported_while_paused_halts_the_rollout() {
        let (_t, c) = super::super::tests::db();
        let a = node(&c, "GPU-a");
        let b = node(&c, "GPU-b");
        add_release(&c, NOW, &files("0.2.0")).unwrap();
        start_rollout(&c, NOW, "0.2.0", &rollout(100), false).unwrap();
        let ok = UpgradeReport {
            from: "0.1.0".into(),
            to: "0.2.0".into(),
            outcome: UpgradeOutcome::Succeeded,
            detail: String::new(),
            at: NOW + 1,
        };
        let up = HeartbeatRequest { agent_version: Some("0.2.0".into()), ..beat(1, Some(ok.clone())) };
        heartbeat(&c, NOW + 1, &b.node_token, &up, 10).unwrap();
        assert_eq!(rollout_action(&c, NOW + 2, Action::Pause).unwrap().state, RolloutState::Paused);
        let back = UpgradeReport { outcome: UpgradeOutcome::RolledBack, ..ok };
        heartbeat(&c, NOW + 3, &a.node_token, &beat(2, Some(back)), 10).unwrap();
        let r = current_rollout(&c, NOW + 100).unwrap().unwrap();
        assert_eq!(
            (r.state, r.halt_reason, r.failed, r.reported),
            (RolloutState::Halted, Some(HaltReason::Failures), 1, 2)
        );
        // Resuming now is the operator's decision, as after any halt.
        assert_eq!(rollout_action(&c, NOW + 4, Action::Resume).unwrap().state, RolloutState::Active);
    }

    #[test]
    fn a_rollout_offers_records_a_report_once_and_halts_on_failures() {
        let (_t, c) = super::super::tests::db();
        let a = node(&c, "GPU-a");
        let b = node(&c, "GPU-b");
        let offered = |token: &str, req: &HeartbeatRequest, t: u64| {
            heartbeat(&c, t, token, req, 10).unwrap().upgrade.map(|o| o.version)
        };
        assert!(rollout_action(&c, NOW, Action::Pause).is_err(), "no rollout yet");
        assert_eq!(
            start_rollout(&c, NOW, "0.2.0", &rollout(100), false).unwrap_err().code,
            ErrorCode::NotFound
        );
        add_release(&c, NOW, &files("0.2.0")).unwrap();
        assert!(start_rollout(&c, NOW, "0.2.0", &rollout(101), false).is_err());
        let knobs = RolloutRequest { offer_regardless: true, ..rollout(100) };
        assert!(start_rollout(&c, NOW, "0.2.0", &knobs, false).is_err(), "the test flag only in test builds");
        assert_eq!(offered(&a.node_token, &beat(1, None), NOW + 1), None);
        let r = start_rollout(&c, NOW + 1, "0.2.0", &rollout(100), false).unwrap();
        assert_eq!((r.state, r.percent, r.max_failure_percent), (RolloutState::Active, 100, 20));
        assert_eq!(offered(&a.node_token, &beat(2, None), NOW + 2).as_deref(), Some("0.2.0"));
        assert_eq!(node_of(&c, &a.node_id).upgrades.pending.as_deref(), Some("0.2.0"));

        // Paused: offered to none, and no longer pending.
        assert_eq!(rollout_action(&c, NOW + 3, Action::Pause).unwrap().state, RolloutState::Paused);
        assert_eq!(offered(&a.node_token, &beat(3, None), NOW + 3), None);
        assert_eq!(node_of(&c, &a.node_id).upgrades.pending, None);
        assert!(rollout_action(&c, NOW + 3, Action::Pause).is_err(), "paused already");
        assert_eq!(rollout_action(&c, NOW + 4, Action::Resume).unwrap().state, RolloutState::Active);

        // A success of b: one of one reported, none failed.
        let ok = UpgradeReport {
            from: "0.1.0".into(),
            to: "0.2.0".into(),
            outcome: UpgradeOutcome::Succeeded,
            detail: String::new(),
            at: NOW + 5,
        };
        let up = HeartbeatRequest { agent_version: Some("0.2.0".into()), ..beat(4, Some(ok.clone())) };
        assert_eq!(offered(&b.node_token, &up, NOW + 5), None);
        assert_eq!(node_of(&c, &b.node_id).agent_version, "0.2.0");
        // a rolls back: 1 of 2 failed, 50 % > 20 %: halted, with the counts at the halt.
        let back = UpgradeReport { outcome: UpgradeOutcome::RolledBack, detail: "x".repeat(5000), ..ok };
        assert_eq!(offered(&a.node_token, &beat(5, Some(back.clone())), NOW + 6), None);
        let r = current_rollout(&c, NOW + 100).unwrap().unwrap();
        assert_eq!(
            (r.state, r.halt_reason, r.failed, r.reported),
            (RolloutState::Halted, Some(HaltReason::Failures), 1, 2)
        );
        let last = node_of(&c, &a.node_id).upgrades.last.unwrap();
        assert_eq!((last.outcome, last.detail.len()), (UpgradeOutcome::RolledBack, limits::MAX_TEXT_LEN));
        // The same report again writes nothing (recorded once).
        let before = crate::sql::statements_run();
        offered(&a.node_token, &beat(6, Some(back.clone())), NOW + 7);
        let again = crate::sql::statements_run() - before;
        let before = crate::sql::statements_run();
        offered(&a.node_token, &beat(7, None), NOW + 8);
        assert_eq!(again, crate::sql::statements_run() - before, "a repeated report costs nothing more");

        // Resumed: never again to the node that rolled it back.
        rollout_action(&c, NOW + 9, Action::Resume).unwrap();
        assert_eq!(offered(&a.node_token, &beat(8, None), NOW + 9), None);

        // Another version's rollout ends this one.
        add_release(&c, NOW, &files("0.3.0")).unwrap();
        start_rollout(&c, NOW + 10, "0.3.0", &rollout(100), false).unwrap();
        let list = list_releases(&c, NOW).unwrap().releases;
        let state = |v: &str| list.iter().find(|r| r.version == v).unwrap().rollout.as_ref().unwrap().state;
        assert_eq!((state("0.2.0"), state("0.3.0")), (RolloutState::Done, RolloutState::Active));
        assert_eq!(offered(&a.node_token, &beat(9, None), NOW + 11).as_deref(), Some("0.3.0"));
        // The owner's switch.
        update_node(
            &c,
            &a.node_id,
            &UpdateNodeRequest { auto_update: Some(false), ..Default::default() },
            &Scope::All,
        )
        .unwrap();
        assert_eq!(offered(&a.node_token, &beat(10, None), NOW + 12), None);
        assert!(!node_settings(&c, &a.node_id).unwrap().auto_update);
    }

    /// The steady heartbeat's cost does not change with a rollout: the active rollout rides in
    /// the node's one lookup, and nothing is written while nothing changes.
    #[test]
    fn a_steady_heartbeat_costs_the_same_with_a_rollout() {
        let (_t, c) = super::super::tests::db();
        let a = node(&c, "GPU-a");
        let cost = |seq: u64| {
            let before = crate::sql::statements_run();
            heartbeat(&c, NOW + seq, &a.node_token, &beat(seq, None), 10).unwrap();
            crate::sql::statements_run() - before
        };
        cost(1);
        let without = cost(2);
        add_release(&c, NOW, &files("0.2.0")).unwrap();
        start_rollout(&c, NOW, "0.2.0", &rollout(100), false).unwrap();
        cost(3); // the first offer is written once
        assert_eq!(cost(4), without);
        update_node(
            &c,
            &a.node_id,
            &UpdateNodeRequest { auto_update: Some(false), ..Default::default() },
            &Scope::All,
        )
        .unwrap();
        cost(5);
        assert_eq!(cost(6), without);
    }

    fn node_of(c: &Conn, id: &str) -> gpum_protocol::NodeSummary {
        super::super::node(c, NOW, id, &Scope::All).unwrap()
    }
}
