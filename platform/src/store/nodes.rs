//! Nodes as the operator and owners see them: one node's lookup and the list's pages share one
//! row mapping (issue 44: one node costs one node); settings, deletion, commands and token
//! replacement.

use super::*;

/// Whose servers a request may see and change: the operator's (every server, through the admin
/// token: the admin API, the CLI, the operator's sign-in) or one owner's (their session or API
/// key). Every function below that names a node takes one, so no handler can forget it: a node
/// of another owner is "not found", exactly like one that does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Owner(String),
}

impl Scope {
    /// The owner whose rows these are; `None` for the operator.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Scope::All => None,
            Scope::Owner(id) => Some(id),
        }
    }
}

/// A node (live or deleted) within `scope`; `not_found` for another owner's.
pub(super) fn owned(conn: &Conn, id: &str, scope: &Scope) -> Result<(), ApiError> {
    let Scope::Owner(want) = scope else { return Ok(()) };
    let owner: Option<Option<String>> = conn
        .prepare_cached("SELECT owner_id FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))
        .optional()?;
    match owner {
        Some(Some(o)) if o == *want => Ok(()),
        _ => Err(ApiError::not_found("node")),
    }
}

/// A live node within `scope`; `not_found` for a deleted one, another owner's, or none.
pub(crate) fn live_node(conn: &Conn, id: &str, scope: &Scope) -> Result<(), ApiError> {
    let found: Option<(Option<i64>, Option<String>)> = conn
        .prepare_cached("SELECT deleted_at, owner_id FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match (found, scope) {
        (Some((None, _)), Scope::All) => Ok(()),
        (Some((None, Some(o))), Scope::Owner(want)) if o == *want => Ok(()),
        _ => Err(ApiError::not_found("node")),
    }
}

/// Whether a node whose last heartbeat was at `last` is online at `now`: the one rule of the
/// list, the dashboard and the refusal of commands.
pub(super) fn online(last: Option<u64>, now: u64) -> bool {
    last.is_some_and(|t| now < t.saturating_add(OFFLINE_AFTER_SECS))
}

/// The columns a node's summary is read from, in the order [`node_summary`] reads them. The
/// list and the one-node lookup share it, so they cannot show a node differently.
macro_rules! node_select {
    () => {
        "SELECT id, registered_at, agent_version, inventory_json, last_heartbeat_at, last_seq, metrics_json,
                health_json, verification, probe_output, probe_reason, managed_json, known_json,
                name, price_per_gpu_hour, min_rental_minutes, paused, probe_at,
                (SELECT email FROM owners WHERE owners.id = nodes.owner_id), quarantine_json,
                (SELECT disabled_at FROM owners WHERE owners.id = nodes.owner_id),
                auto_update, agent_auto_update, upgrade_offered, upgrade_from, upgrade_to, upgrade_outcome,
                upgrade_detail, upgrade_recorded_at
         FROM nodes "
    };
}

/// One row of [`node_select!`] as its summary (and its owner's standing); the histories and the
/// verdict are filled in by [`completed`].
pub(super) fn node_summary(
    r: &crate::sql::Row<'_>,
    now: u64,
) -> crate::sql::Result<(NodeSummary, crate::rentable::Owner)> {
    let last_heartbeat_at = r.get::<_, Option<i64>>(4)?.map(|v| v as u64);
    let inventory: Inventory = serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or_default();
    let owner = match r.get::<_, Option<i64>>(20)? {
        Some(at) => crate::rentable::Owner::Disabled { since: at.max(0) as u64 },
        None => crate::rentable::Owner::Enabled,
    };
    let n = NodeSummary {
        id: r.get(0)?,
        registered_at: r.get::<_, i64>(1)? as u64,
        agent_version: r.get(2)?,
        name: r.get::<_, Option<String>>(13)?.unwrap_or_else(|| inventory.private.hostname.clone()),
        price_per_gpu_hour: r.get::<_, Option<i64>>(14)?.map(|v| v.max(0) as u64),
        min_rental_minutes: r.get::<_, i64>(15)?.clamp(1, i64::from(MAX_MIN_RENTAL_MINUTES)) as u32,
        paused: r.get(16)?,
        inventory,
        online: online(last_heartbeat_at, now),
        last_probe_at: r.get::<_, Option<i64>>(17)?.map(|v| v as u64),
        last_heartbeat_at,
        last_seq: r.get::<_, Option<i64>>(5)?.map(|v| v as u64),
        last_metrics: r.get::<_, Option<String>>(6)?.and_then(|m| serde_json::from_str::<Metrics>(&m).ok()),
        health: r.get::<_, Option<String>>(7)?.and_then(|h| serde_json::from_str::<Health>(&h).ok()),
        verification: r.get(8)?,
        last_probe_output: r.get(9)?,
        last_probe_reason: r.get(10)?,
        managed_containers: serde_json::from_str(&r.get::<_, String>(11)?).unwrap_or_default(),
        known_containers: serde_json::from_str(&r.get::<_, String>(12)?).unwrap_or_default(),
        removed_containers: Vec::new(),
        commands: Vec::new(),
        rentable: Default::default(),
        reliability: None,
        occupancy: Default::default(),
        owner: r.get(18)?,
        quarantine: r.get::<_, Option<String>>(19)?.and_then(|q| serde_json::from_str::<Quarantine>(&q).ok()),
        maintenance: Vec::new(),
        upgrades: super::releases::node_upgrades(
            r.get(21)?,
            r.get(22)?,
            r.get(23)?,
            r.get(24)?,
            r.get(25)?,
            r.get(26)?,
            r.get(27)?,
            r.get(28)?,
        ),
    };
    Ok((n, owner))
}

/// A summary read by [`node_summary`] with its two histories, its maintenance windows (issue
/// 46), its rentable verdict, its reliability and its occupancy: five queries, whatever the
/// number of nodes.
pub(super) fn completed(
    conn: &Conn,
    (mut n, owner): (NodeSummary, crate::rentable::Owner),
    check_image_chosen: bool,
    now: u64,
) -> Result<NodeSummary, ApiError> {
    n.removed_containers = removals(conn, &n.id)?;
    n.commands = command_history(conn, &n.id)?;
    n.maintenance = super::maintenance::windows(conn, &n.id, now)?;
    n.rentable = crate::rentable::verdict(&n, check_image_chosen, owner, now);
    n.reliability = super::reliability::of(conn, &n, now)?;
    let held = crate::rentals::held_gpus(conn, &n.id, now)?;
    n.occupancy = gpum_platform_core::occupancy::occupancy(
        &n.inventory.private.gpu_uuids,
        &held,
        n.rentable.state == gpum_protocol::RentableState::Rentable,
    );
    Ok(n)
}

/// One live node within `scope`, as the list shows it: seven queries (its row, the check image,
/// and [`completed`]'s five), whatever the number of nodes (issue 44: one node costs one node).
/// `not_found` for a deleted node, another owner's, or none.
pub fn node(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<NodeSummary, ApiError> {
    let row = conn
        .prepare_cached(concat!(
            node_select!(),
            "WHERE id = ?1 AND deleted_at IS NULL AND (CAST(?2 AS TEXT) IS NULL OR owner_id = ?2)"
        ))?
        .query_row(params![id, scope.owner()], |r| node_summary(r, now))
        .optional()?
        .ok_or_else(|| ApiError::not_found("node"))?;
    completed(conn, row, probe_image(conn)?.is_some(), now)
}

/// How many nodes a page holds unless `?limit=` says otherwise.
pub const DEFAULT_PAGE_LIMIT: u32 = 100;
/// The most nodes one page holds.
pub const MAX_PAGE_LIMIT: u32 = 500;

/// Where a page of a list starts: after the item with this sort key, a time and a unique text
/// (a node's `registered_at` and `id`; an owner's `created_at` and e-mail). Its text form is
/// opaque to clients (base64url); the item it names need not exist any more, so a cursor taken
/// before a deletion still works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub(crate) at: i64,
    pub(crate) key: String,
}

/// The longest key a cursor carries (an e-mail address at most 254).
pub(super) const MAX_CURSOR_KEY: usize = 320;

impl Cursor {
    fn of(n: &NodeSummary) -> Cursor {
        Cursor { at: n.registered_at as i64, key: n.id.clone() }
    }

    /// The text a client passes back as `?after=`.
    pub fn encode(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}:{}", self.at, self.key))
    }

    /// A cursor from [`Cursor::encode`]; `invalid_request` for anything else.
    pub fn parse(s: &str) -> Result<Cursor, ApiError> {
        use base64::Engine as _;
        let bad =
            || ApiError::new(ErrorCode::InvalidRequest, "the cursor (after) is not one the platform gave");
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).map_err(|_| bad())?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let (at, key) = raw.split_once(':').ok_or_else(bad)?;
        let at = at.parse::<i64>().map_err(|_| bad())?;
        if key.is_empty() || key.len() > MAX_CURSOR_KEY {
            return Err(bad());
        }
        Ok(Cursor { at, key: key.to_owned() })
    }
}

/// Which page of a list: at most `limit` items after `after` (from the start when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub limit: u32,
    pub after: Option<Cursor>,
}

impl Default for Page {
    fn default() -> Page {
        Page { limit: DEFAULT_PAGE_LIMIT, after: None }
    }
}

impl Page {
    /// A page from a request's `limit` and `after` (either may be absent); `invalid_request`
    /// for a limit outside 1..=[`MAX_PAGE_LIMIT`] or a cursor the platform did not give.
    pub fn parse(limit: Option<&str>, after: Option<&str>) -> Result<Page, ApiError> {
        // The same bounds for every list (nodes, owners).
        let limit = match limit {
            None => DEFAULT_PAGE_LIMIT,
            Some(l) => match l.parse::<u32>() {
                Ok(l) if (1..=MAX_PAGE_LIMIT).contains(&l) => l,
                _ => {
                    return Err(ApiError::new(
                        ErrorCode::InvalidRequest,
                        format!("limit must be a whole number from 1 to {MAX_PAGE_LIMIT}"),
                    ));
                }
            },
        };
        let after = after.map(Cursor::parse).transpose()?;
        Ok(Page { limit, after })
    }
}

/// A page of every live node (the operator's), after the cursor `(?1, ?2)`, `?3` rows.
pub(super) const PAGE_ALL: &str = concat!(
    node_select!(),
    "WHERE deleted_at IS NULL AND (registered_at, id) > (?1, ?2) ORDER BY registered_at, id LIMIT ?3"
);
/// A page of owner `?1`'s live nodes, after the cursor `(?2, ?3)`, `?4` rows.
pub(super) const PAGE_OWNED: &str = concat!(
    node_select!(),
    "WHERE deleted_at IS NULL AND owner_id = ?1 AND (registered_at, id) > (?2, ?3) ORDER BY registered_at, id LIMIT ?4"
);

/// One page of the live nodes within `scope`, in registration order, with the cursor of the
/// next page when there is one: 2 + 5 × `limit` queries at most, whatever the number of nodes.
pub fn list_nodes_page(conn: &Conn, now: u64, scope: &Scope, page: &Page) -> Result<NodeList, ApiError> {
    let limit = page.limit.clamp(1, MAX_PAGE_LIMIT);
    let (after_at, after_id) = page.after.as_ref().map_or((i64::MIN, ""), |c| (c.at, c.key.as_str()));
    // One more row than asked tells whether there is a next page. The operator's and an owner's
    // each walk an index in this order from the cursor on (`nodes_live_by_registration`,
    // `nodes_owner_by_registration`), so a page costs its own rows, not the platform's.
    let more_than_asked = i64::from(limit) + 1;
    let mut rows: Vec<(NodeSummary, crate::rentable::Owner)> = match scope.owner() {
        None => conn
            .prepare_cached(PAGE_ALL)?
            .query_map(params![after_at, after_id, more_than_asked], |r| node_summary(r, now))?
            .collect::<Result<_, _>>()?,
        Some(owner) => conn
            .prepare_cached(PAGE_OWNED)?
            .query_map(params![owner, after_at, after_id, more_than_asked], |r| node_summary(r, now))?
            .collect::<Result<_, _>>()?,
    };
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let check_image_chosen = probe_image(conn)?.is_some();
    let nodes = rows
        .into_iter()
        .map(|row| completed(conn, row, check_image_chosen, now))
        .collect::<Result<Vec<_>, _>>()?;
    let next = match nodes.last() {
        Some(last) if more => Some(Cursor::of(last).encode()),
        _ => None,
    };
    Ok(NodeList { nodes, next })
}

/// Every live node within `scope`, read page by page (the CLI's `nodes list`, the tests).
pub fn list_nodes(conn: &Conn, now: u64, scope: &Scope) -> Result<NodeList, ApiError> {
    let mut page = Page { limit: MAX_PAGE_LIMIT, after: None };
    let mut nodes = Vec::new();
    loop {
        let list = list_nodes_page(conn, now, scope, &page)?;
        nodes.extend(list.nodes);
        match list.next {
            Some(next) => page.after = Some(Cursor::parse(&next)?),
            None => return Ok(NodeList { nodes, next: None }),
        }
    }
}

pub(super) fn removals(conn: &Conn, node_id: &str) -> Result<Vec<RemovedContainer>, ApiError> {
    let mut v: Vec<RemovedContainer> = conn
        .prepare_cached(
            "SELECT id, name, reason FROM container_removals WHERE node_id = ?1 ORDER BY rowid DESC LIMIT ?2",
        )?
        .query_map(params![node_id, HISTORY], |r| {
            Ok(RemovedContainer { id: r.get(0)?, name: r.get(1)?, reason: r.get(2)? })
        })?
        .collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}

pub(super) fn command_history(conn: &Conn, node_id: &str) -> Result<Vec<CommandStatus>, ApiError> {
    let mut v: Vec<CommandStatus> = conn
        .prepare_cached(
            "SELECT id, kind, queued_at, delivered_at, result_ok, result_message, completed_at FROM commands
             WHERE node_id = ?1 ORDER BY seq DESC LIMIT ?2",
        )?
        .query_map(params![node_id, HISTORY], |r| {
            let id: String = r.get(0)?;
            let ok: Option<bool> = r.get(4)?;
            let message: Option<String> = r.get(5)?;
            Ok(CommandStatus {
                result: ok.map(|ok| CommandResult {
                    id: id.clone(),
                    ok,
                    message: message.unwrap_or_default(),
                }),
                id,
                // The word stored: a newer replica's kind is listed, not an error.
                kind: r.get(1)?,
                queued_at: r.get::<_, i64>(2)? as u64,
                delivered_at: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                completed_at: r.get::<_, Option<i64>>(6)?.map(|v| v as u64),
            })
        })?
        .collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}

/// The node's row: its last heartbeat and whether it was deleted; `not_found` if there never
/// was such a node.
pub(super) fn node_row(conn: &Conn, id: &str) -> Result<(Option<i64>, bool), ApiError> {
    conn.prepare_cached("SELECT last_heartbeat_at, deleted_at IS NOT NULL FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or_else(|| ApiError::not_found("node"))
}

/// A node's figures over the last day before `now`, oldest first: at most one sample per
/// [`SAMPLE_INTERVAL_SECS`]. A deleted node has none.
pub fn node_samples(conn: &Conn, node_id: &str, now: u64, scope: &Scope) -> Result<NodeMetrics, ApiError> {
    owned(conn, node_id, scope)?;
    node_row(conn, node_id)?;
    let now = now as i64;
    let samples = conn
        .prepare_cached(
            "SELECT at, metrics_json FROM node_samples WHERE node_id = ?1 AND at > ?2 AND at <= ?3
             ORDER BY at, rowid",
        )?
        .query_map(params![node_id, now - SAMPLE_WINDOW_SECS as i64, now], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
        })?
        .filter_map(|row| match row {
            Ok((at, json)) => serde_json::from_str::<Metrics>(&json)
                .ok()
                .map(|metrics| Ok(MetricsSample { at: at as u64, metrics })),
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_, _>>()?;
    Ok(NodeMetrics { interval_secs: SAMPLE_INTERVAL_SECS, samples })
}

/// A node's event log, newest first, at most `limit` entries: the recorded events, the
/// containers its agent removed (kept apart, in `container_removals`), and, while it is offline
/// now, `offline` at its last heartbeat (recorded only once the gap ends). A deleted node's log
/// holds only `deleted`.
pub fn node_events(
    conn: &Conn,
    node_id: &str,
    now: u64,
    limit: usize,
    scope: &Scope,
) -> Result<NodeEvents, ApiError> {
    owned(conn, node_id, scope)?;
    let (last_beat, deleted) = node_row(conn, node_id)?;
    // Offline now: `offline` at the last heartbeat, in its place by time (issue 46: listed
    // first whatever its time, it stood above the token replacement that caused it).
    let offline = match last_beat {
        Some(last)
            if !deleted && now as i64 >= last.saturating_add(OFFLINE_AFTER_SECS as i64) && limit > 0 =>
        {
            Some(NodeEvent {
                at: last.max(0) as u64,
                kind: NodeEventKind::Offline,
                subject: String::new(),
                detail: String::new(),
            })
        }
        _ => None,
    };
    let mut events = Vec::new();
    let rows = conn
        .prepare_cached(
            "SELECT at, kind, subject, detail, 0 AS src, rowid FROM node_events WHERE node_id = ?1
             UNION ALL
             SELECT at, CAST(?3 AS TEXT), name, reason, 1 AS src, rowid FROM container_removals
             WHERE node_id = ?1
             ORDER BY at DESC, src DESC, rowid DESC LIMIT ?2",
        )?
        .query_map(params![node_id, limit as i64, NodeEventKind::ContainerRemoved], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    // A kind this version does not know (written by a newer replica during a rolling upgrade)
    // is left out, on purpose: the log is history, and one unknown line must not hide the rest.
    events.extend(rows.into_iter().filter_map(|(at, kind, subject, detail)| {
        Some(NodeEvent { at: at.max(0) as u64, kind: NodeEventKind::parse(&kind)?, subject, detail })
    }));
    // Under every later event, above those of the last heartbeat's second and before (that
    // heartbeat recorded them).
    if let Some(o) = offline {
        let i = events.iter().position(|e| e.at <= o.at).unwrap_or(events.len());
        events.insert(i, o);
        events.truncate(limit);
    }
    Ok(NodeEvents { events })
}

/// Why the owner's settings of a server are refused; [`SettingsError::message`] is the API's
/// text, the dashboard has its own in both languages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingsError {
    /// Empty, or longer than [`MAX_NODE_NAME_CHARS`].
    NameLength,
    /// A control character (a newline, an escape...).
    NameControl,
    /// A bidirectional control (U+202E and the like, [`is_bidi_control`]), which makes the
    /// name read otherwise than it is written (issue 46).
    NameBidi,
    /// Zero, or over [`MAX_PRICE_PER_GPU_HOUR`].
    Price,
    /// Outside `1..=`[`MAX_MIN_RENTAL_MINUTES`].
    MinRental,
}

impl SettingsError {
    pub fn message(self) -> String {
        match self {
            SettingsError::NameLength => format!("name must be 1 to {MAX_NODE_NAME_CHARS} characters"),
            SettingsError::NameControl => "name must not contain control characters".to_owned(),
            SettingsError::NameBidi => {
                "name must not contain bidirectional controls (U+061C, U+200E, U+200F, U+202A to U+202E, \
                 U+2066 to U+2069)"
                    .to_owned()
            }
            SettingsError::Price => format!(
                "price_per_gpu_hour must be 1 to {MAX_PRICE_PER_GPU_HOUR} minor units, or null (not for rent)"
            ),
            SettingsError::MinRental => {
                format!("min_rental_minutes must be 1 to {MAX_MIN_RENTAL_MINUTES}")
            }
        }
    }
}

impl From<SettingsError> for ApiError {
    fn from(e: SettingsError) -> ApiError {
        ApiError::new(ErrorCode::InvalidRequest, e.message())
    }
}

/// A Unicode bidirectional control (the marks, embeddings, overrides and isolates, and the Arabic
/// letter mark): text holding one reads otherwise than it is written ("Trojan Source"), so no
/// name may hold one.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// A server name as stored: trimmed, 1 to [`MAX_NODE_NAME_CHARS`] characters, no control
/// character.
pub fn check_name(name: &str) -> Result<String, SettingsError> {
    let name = name.trim();
    if name.chars().any(char::is_control) {
        return Err(SettingsError::NameControl);
    }
    if name.chars().any(is_bidi_control) {
        return Err(SettingsError::NameBidi);
    }
    let n = name.chars().count();
    if n == 0 || n > MAX_NODE_NAME_CHARS {
        return Err(SettingsError::NameLength);
    }
    Ok(name.to_owned())
}

/// Checks every field of `req` (before anything is written): the normalised name, if one.
pub fn check_update(req: &UpdateNodeRequest) -> Result<Option<Option<String>>, SettingsError> {
    if let Some(Some(p)) = req.price_per_gpu_hour
        && !(1..=MAX_PRICE_PER_GPU_HOUR).contains(&p)
    {
        return Err(SettingsError::Price);
    }
    if let Some(m) = req.min_rental_minutes
        && !(1..=MAX_MIN_RENTAL_MINUTES).contains(&m)
    {
        return Err(SettingsError::MinRental);
    }
    match &req.name {
        Some(Some(n)) => Ok(Some(Some(check_name(n)?))),
        Some(None) => Ok(Some(None)),
        None => Ok(None),
    }
}

/// Changes the owner's settings of a live node: only the fields `req` carries, all or none.
pub fn update_node(
    conn: &Conn,
    id: &str,
    req: &UpdateNodeRequest,
    scope: &Scope,
) -> Result<NodeSettings, ApiError> {
    let name = check_update(req)?;
    live_node(conn, id, scope)?;
    conn.prepare_cached(
        "UPDATE nodes SET
             name = CASE WHEN ?2 THEN ?3 ELSE name END,
             price_per_gpu_hour = CASE WHEN ?4 THEN ?5 ELSE price_per_gpu_hour END,
             min_rental_minutes = COALESCE(?6, min_rental_minutes),
             paused = COALESCE(?7, paused),
             auto_update = COALESCE(?8, auto_update)
         WHERE id = ?1",
    )?
    .execute(params![
        id,
        name.is_some(),
        name.flatten(),
        req.price_per_gpu_hour.is_some(),
        req.price_per_gpu_hour.flatten().map(|p| p as i64),
        req.min_rental_minutes,
        req.paused,
        req.auto_update,
    ])?;
    node_settings(conn, id)
}

/// A live node's settings, its name defaulting to its host name.
pub fn node_settings(conn: &Conn, id: &str) -> Result<NodeSettings, ApiError> {
    let row = conn
        .prepare_cached(
            "SELECT name, inventory_json, price_per_gpu_hour, min_rental_minutes, paused, auto_update FROM nodes
             WHERE id = ?1 AND deleted_at IS NULL",
        )?
        .query_row(params![id], |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, bool>(4)?,
                r.get::<_, bool>(5)?,
            ))
        })
        .optional()?;
    let Some((name, inv, price, min, paused, auto_update)) = row else {
        return Err(ApiError::not_found("node"));
    };
    let name = name.unwrap_or_else(|| {
        serde_json::from_str::<Inventory>(&inv).map(|i| i.private.hostname).unwrap_or_default()
    });
    Ok(NodeSettings {
        id: id.to_owned(),
        name,
        price_per_gpu_hour: price.map(|v| v.max(0) as u64),
        min_rental_minutes: min.clamp(1, i64::from(MAX_MIN_RENTAL_MINUTES)) as u32,
        paused,
        auto_update,
    })
}

/// Deletes a node: its next heartbeat gets 410 `node_deleted`. Everything but the id, the token
/// hash and the deletion time goes.
pub fn delete_node(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<(), ApiError> {
    live_node(conn, id, scope)?;
    conn.prepare_cached(
        "UPDATE nodes SET deleted_at = ?1, inventory_json = '{}', inventory_hash = '', metrics_json = NULL, last_sample_at = NULL,
             health_json = NULL, probe_output = NULL, probe_reason = NULL, managed_json = '[]', known_json = '[]',
             agent_version = '', name = NULL, price_per_gpu_hour = NULL, paused = 0
         WHERE id = ?2",
    )?
    .execute(params![now as i64, id])?;
    conn.prepare_cached("DELETE FROM node_gpus WHERE node_id = ?1")?.execute(params![id])?;
    // Its rentals end (no heartbeat will carry them again); their records stay for the operator,
    // and their runs end at its last heartbeat (issue 46).
    super::earnings::close_node_runs(conn, id)?;
    let ended = crate::rentals::end_for_node(conn, now, id, "node deleted")?;
    // Its tunnel and those rentals' streams end on every replica.
    crate::effects::record(conn, now, &crate::effects::rules::node_deleted(id, &ended))?;
    conn.prepare_cached("DELETE FROM commands WHERE node_id = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM container_removals WHERE node_id = ?1")?.execute(params![id])?;
    // Its history goes too: the event log keeps only that it was deleted, and when.
    conn.prepare_cached("DELETE FROM node_samples WHERE node_id = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM node_events WHERE node_id = ?1")?.execute(params![id])?;
    // Its maintenance windows go (issue 46).
    super::maintenance::delete_node_windows(conn, id)?;
    record(conn, id, now, NodeEventKind::Deleted, "", "")?;
    Ok(())
}

pub fn queue_command(
    conn: &Conn,
    now: u64,
    id: &str,
    kind: &str,
    scope: &Scope,
) -> Result<CommandQueued, ApiError> {
    let Some(kind) = CommandKind::parse(kind) else {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("unknown command kind {kind:?}; one of: recheck, restart"),
        ));
    };
    live_node(conn, id, scope)?;
    // A command reaches the agent only at its heartbeat: an offline server is refused one, by
    // every door (the dashboard, the admin API, the CLI), and nothing is queued.
    // The node's row is locked (PostgreSQL) so that two commands sent to it at once through two
    // replicas get their places in its queue one after the other.
    let last: Option<i64> = conn
        .prepare_cached(&conn.for_update("SELECT last_heartbeat_at FROM nodes WHERE id = ?1"))?
        .query_row(params![id], |r| r.get(0))?;
    if !online(last.map(|v| v as u64), now) {
        return Err(ApiError::new(
            ErrorCode::NodeOffline,
            "the server is offline: a command reaches it only at its heartbeat; nothing was queued",
        ));
    }
    let cmd_id = new_id("cmd-");
    // Its place in the node's queue (the index on node_id, seq finds the last at once).
    let seq: i64 = conn.query_row(
        "SELECT COALESCE(MAX(seq), 0) + 1 FROM commands WHERE node_id = ?1",
        params![id],
        |r| r.get(0),
    )?;
    conn.prepare_cached(
        "INSERT INTO commands (id, node_id, kind, queued_at, seq) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![cmd_id, id, kind, now as i64, seq])?;
    record(conn, id, now, NodeEventKind::CommandSent, kind.as_str(), "")?;
    Ok(CommandQueued { id: cmd_id })
}

pub fn rotate_token(conn: &Conn, now: u64, id: &str, scope: &Scope) -> Result<TokenRotated, ApiError> {
    live_node(conn, id, scope)?;
    let old: String = conn
        .prepare_cached("SELECT token_hash FROM nodes WHERE id = ?1")?
        .query_row(params![id], |r| r.get(0))?;
    let token = new_token();
    conn.prepare_cached(
        "INSERT INTO replaced_tokens (token_hash, node_id, replaced_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (token_hash) DO UPDATE SET node_id = excluded.node_id, replaced_at = excluded.replaced_at",
    )?
    .execute(params![old, id, now as i64])?;
    // Only the newest replaced tokens are remembered (their agents are told `token_replaced`),
    // so repeated rotations and re-registrations cannot grow the table without bound.
    conn.prepare_cached(
        "DELETE FROM replaced_tokens WHERE node_id = ?1 AND rowid NOT IN
           (SELECT rowid FROM replaced_tokens WHERE node_id = ?1
            ORDER BY replaced_at DESC, rowid DESC LIMIT ?2)",
    )?
    .execute(params![id, limits::MAX_REPLACED_TOKENS_PER_NODE as i64])?;
    conn.prepare_cached("UPDATE nodes SET token_hash = ?1 WHERE id = ?2")?
        .execute(params![hash_secret(&token), id])?;
    record(conn, id, now, NodeEventKind::TokenReplaced, "", "")?;
    // The tunnel the old token opened ends on every replica.
    crate::effects::record(conn, now, &crate::effects::rules::token_replaced(id))?;
    Ok(TokenRotated { node_token: token })
}

pub fn set_known_containers(conn: &Conn, id: &str, ids: &[String]) -> Result<(), ApiError> {
    if ids.len() > limits::MAX_KNOWN_CONTAINERS || ids.iter().any(|c| c.is_empty() || c.len() > MAX_ID_LEN) {
        return Err(invalid(format!(
            "container_ids: at most {} ids of 1 to {MAX_ID_LEN} bytes",
            limits::MAX_KNOWN_CONTAINERS
        )));
    }
    live_node(conn, id, &Scope::All)?;
    conn.prepare_cached("UPDATE nodes SET known_json = ?1 WHERE id = ?2")?
        .execute(params![serde_json::to_string(ids)?, id])?;
    Ok(())
}
