//! The schema: SQLite's migrations and PostgreSQL's, with the same numbers, and opening a
//! database at this binary's version (a newer one is refused). `crate::schema` proves that both
//! lists build the same tables, columns and indexes.

use super::*;

/// The migrations, in order. `PRAGMA user_version` records how many ran.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE join_codes (
    code_hash   TEXT PRIMARY KEY,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
CREATE TABLE nodes (
    id                 TEXT PRIMARY KEY,
    token_hash         TEXT NOT NULL UNIQUE,
    registered_at      INTEGER NOT NULL,
    deleted_at         INTEGER,
    agent_version      TEXT NOT NULL DEFAULT '',
    inventory_json     TEXT NOT NULL DEFAULT '{}',
    inventory_hash     TEXT NOT NULL DEFAULT '',
    last_heartbeat_at  INTEGER,
    last_seq           INTEGER,
    metrics_json       TEXT,
    health_json        TEXT,
    verification       TEXT NOT NULL DEFAULT 'awaiting_check',
    probe_output       TEXT,
    probe_reason       TEXT,
    managed_json       TEXT NOT NULL DEFAULT '[]',
    known_json         TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE node_gpus (
    uuid     TEXT PRIMARY KEY,
    node_id  TEXT NOT NULL REFERENCES nodes(id)
);
CREATE INDEX node_gpus_node ON node_gpus(node_id);
CREATE TABLE replaced_tokens (
    token_hash   TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    replaced_at  INTEGER NOT NULL
);
CREATE TABLE commands (
    id              TEXT PRIMARY KEY,
    node_id         TEXT NOT NULL,
    kind            TEXT NOT NULL,
    queued_at       INTEGER NOT NULL,
    delivered_at    INTEGER,
    result_ok       INTEGER,
    result_message  TEXT,
    completed_at    INTEGER,
    seq             INTEGER NOT NULL
);
CREATE INDEX commands_pending ON commands(node_id, delivered_at);
CREATE TABLE container_removals (
    node_id  TEXT NOT NULL,
    at       INTEGER NOT NULL,
    id       TEXT NOT NULL,
    name     TEXT NOT NULL,
    reason   TEXT NOT NULL
);
CREATE INDEX container_removals_node ON container_removals(node_id);
CREATE TABLE settings (
    key    TEXT PRIMARY KEY,
    value  TEXT
);
"#,
    // Idempotent registration: a used code remembers the install id (hashed) that used it and the
    // node it created.
    r#"
ALTER TABLE join_codes ADD COLUMN install_id_hash TEXT;
ALTER TABLE join_codes ADD COLUMN node_id TEXT;
CREATE INDEX commands_node_seq ON commands(node_id, seq);
"#,
    // Bounded repeats (issue 29, items 2 and 3): how often the install id a code is bound to
    // used it again, and the replaced tokens of a node found by node for pruning.
    r#"
ALTER TABLE join_codes ADD COLUMN repeats INTEGER NOT NULL DEFAULT 0;
CREATE INDEX replaced_tokens_node ON replaced_tokens(node_id, replaced_at);
"#,
    // The owner's settings of a server (issue 32): a name (NULL: its host name), a price per
    // GPU-hour in minor units (NULL: not for rent yet), a minimum rental time, and paused.
    r#"
ALTER TABLE nodes ADD COLUMN name TEXT;
ALTER TABLE nodes ADD COLUMN price_per_gpu_hour INTEGER;
ALTER TABLE nodes ADD COLUMN min_rental_minutes INTEGER NOT NULL DEFAULT 60;
ALTER TABLE nodes ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
"#,
    // Owners' accounts (issue 32): each join code and node belongs to an owner (NULL: the
    // operator's own); invitations, dashboard sessions and API keys are kept as hashes only.
    r#"
CREATE TABLE owners (
    id             TEXT PRIMARY KEY,
    email          TEXT NOT NULL UNIQUE,
    password_hash  TEXT,
    totp_secret    TEXT,
    totp_last_step INTEGER,
    created_at     INTEGER NOT NULL,
    disabled_at    INTEGER
);
CREATE TABLE invitations (
    token_hash  TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
CREATE INDEX invitations_owner ON invitations(owner_id);
CREATE TABLE sessions (
    id_hash     TEXT PRIMARY KEY,
    owner_id    TEXT,
    csrf        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX sessions_owner ON sessions(owner_id, created_at);
CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL,
    key_hash      TEXT NOT NULL UNIQUE,
    label         TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER,
    revoked_at    INTEGER
);
CREATE INDEX api_keys_owner ON api_keys(owner_id);
ALTER TABLE nodes ADD COLUMN owner_id TEXT;
ALTER TABLE join_codes ADD COLUMN owner_id TEXT;
CREATE INDEX nodes_owner ON nodes(owner_id);
CREATE INDEX join_codes_owner ON join_codes(owner_id, expires_at);
"#,
    // The owner's view of a server over time (issue 32): samples of its figures, at most one per
    // `SAMPLE_INTERVAL_SECS` (`last_sample_at` decides it without a lookup) and a day of them;
    // and its event log, bounded per node.
    r#"
ALTER TABLE nodes ADD COLUMN last_sample_at INTEGER;
CREATE TABLE node_samples (
    node_id       TEXT NOT NULL,
    at            INTEGER NOT NULL,
    metrics_json  TEXT NOT NULL
);
CREATE INDEX node_samples_node ON node_samples(node_id, at);
CREATE TABLE node_events (
    node_id  TEXT NOT NULL,
    at       INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX node_events_node ON node_events(node_id);
"#,
    // A page that never misleads (issue 32): when the last probe report arrived, so that a
    // recheck is judged by the report that followed it, not by the command's acknowledgement.
    r#"
ALTER TABLE nodes ADD COLUMN probe_at INTEGER;
"#,
    // Rentals (issue 33): what the platform asks of a node, and what its agent last reported.
    // `listed` is 1 while the heartbeat answer carries it (until stopped, gone or failed; an
    // expired one is filtered by `ends_at`); the partial index makes that one lookup per beat.
    // `nodes.rentals_until` is the latest end of a rental ever listed for the node: a beat after
    // it (or of a node that never had one) skips the lookup.
    r#"
ALTER TABLE nodes ADD COLUMN rentals_until INTEGER;
CREATE TABLE rentals (
    id           TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    spec_json    TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    ends_at      INTEGER NOT NULL,
    stopped_at   INTEGER,
    listed       INTEGER NOT NULL DEFAULT 1,
    state        TEXT,
    exit_code    INTEGER,
    reason       TEXT,
    updated_at   INTEGER,
    started_at   INTEGER
);
CREATE INDEX rentals_node ON rentals(node_id, created_at);
CREATE INDEX rentals_listed ON rentals(node_id, ends_at) WHERE listed = 1;
"#,
    // Quarantine (issue 33): the node's quarantine as its agent last reported it (the
    // protocol's `Quarantine` as JSON, bounded), NULL when none. A heartbeat writes it only
    // when it changes.
    r#"
ALTER TABLE nodes ADD COLUMN quarantine_json TEXT;
"#,
    // The tunnel (issue 34): the SHA-256 of a rental's tenant credential, when it has ports.
    r#"
ALTER TABLE rentals ADD COLUMN tunnel_hash TEXT;
"#,
    // Issue 44, item 6: `rentals_listed` in the order the heartbeat reads it, as PostgreSQL's
    // always was (`schema::tests::both_engines_build_the_same_schema` found the difference).
    r#"
DROP INDEX rentals_listed;
CREATE INDEX rentals_listed ON rentals(node_id, created_at) WHERE listed = 1;
"#,
    // An owner who can always get back in (issue 43): recovery codes (only their SHA-256, each
    // deleted when used); when the operator last turned an owner's second factor off; the
    // second factor's new key a session is confirming (given only after the password and a
    // current code, so the form cannot name one), until when; and the one notice a session's
    // next servers page shows (the id of the server it deleted).
    r#"
CREATE TABLE recovery_codes (
    code_hash   TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX recovery_codes_owner ON recovery_codes(owner_id);
ALTER TABLE owners ADD COLUMN totp_reset_at INTEGER;
ALTER TABLE sessions ADD COLUMN totp_pending TEXT;
ALTER TABLE sessions ADD COLUMN totp_pending_until INTEGER;
ALTER TABLE sessions ADD COLUMN flash_deleted TEXT;
"#,
    // Issue 44, items 1 and 2: effects as data (`effects.rs`): what a change of state ends in
    // every replica's relay, written in the same transaction; `rowid` is the appliers' cursor.
    r#"
CREATE TABLE effects (
    at       INTEGER NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL
);
CREATE INDEX effects_at ON effects(at);
"#,
    // The throttle's counts (issue 43): shared by replicas, per door and per subject (a hash
    // of an address, an IPv6 /48 or an e-mail; `crate::throttle`), `last_failure` in Unix ms.
    r#"
CREATE TABLE throttle (
    door          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    failures      INTEGER NOT NULL,
    last_failure  INTEGER NOT NULL,
    PRIMARY KEY (door, subject)
);
CREATE INDEX throttle_last ON throttle(last_failure);
"#,
    // Issue 44, item 4: lists read a page at a time in registration order, each page found
    // through an index instead of a sort of every row (the operator's, and each owner's).
    r#"
CREATE INDEX nodes_live_by_registration ON nodes(registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX nodes_owner_by_registration ON nodes(owner_id, registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX owners_by_creation ON owners(created_at, email);
"#,
    // 16: the relay mesh (issue 44, item 3): live replicas and which one holds each node's tunnel.
    r#"
CREATE TABLE replicas (
    id         TEXT PRIMARY KEY,
    peer_addr  TEXT NOT NULL,
    seen_at    INTEGER NOT NULL
);
CREATE TABLE tunnel_homes (
    node_id     TEXT PRIMARY KEY,
    replica_id  TEXT NOT NULL,
    since       INTEGER NOT NULL
);
"#,
    // 17: money (issue 46): a rental's price per GPU-hour, fixed when it is created (a rental
    // made before takes its server's price now), and its runs: each span in which the agent
    // reported it `running` (`store::earnings`), open while `ended_at` is NULL.
    r#"
ALTER TABLE rentals ADD COLUMN price_per_gpu_hour INTEGER;
UPDATE rentals SET price_per_gpu_hour = (SELECT price_per_gpu_hour FROM nodes WHERE nodes.id = rentals.node_id);
CREATE TABLE rental_runs (
    rental_id   TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER
);
CREATE INDEX rental_runs_rental ON rental_runs(rental_id, started_at);
CREATE INDEX rental_runs_open ON rental_runs(node_id) WHERE ended_at IS NULL;
"#,
    // 18: scheduled maintenance (issue 46): the windows an owner plans for a server, in which
    // no rental is placed (`store::maintenance`). Deleting the node deletes them.
    r#"
CREATE TABLE maintenance (
    id          TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL REFERENCES nodes(id),
    starts_at   INTEGER NOT NULL,
    ends_at     INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX maintenance_node ON maintenance(node_id, ends_at);
"#,
    // 19: alerts to owners (issue 46, `crate::alerts`): each owner's choice (at most one row;
    // the kinds watched as three flags), the incidents (at most one open per server and kind:
    // the unique index, so two replicas' sweeps cannot both open one), and the notices each
    // incident owes, one per channel and state; a replica sends one only after it set
    // `claimed_at` where it was NULL, so each is sent at most once across replicas.
    r#"
CREATE TABLE alert_settings (
    owner_id         TEXT PRIMARY KEY,
    email            TEXT,
    webhook_url      TEXT,
    offline_minutes  INTEGER NOT NULL,
    watch_offline    INTEGER NOT NULL,
    watch_check      INTEGER NOT NULL,
    watch_quarantine INTEGER NOT NULL,
    lang             TEXT NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE TABLE alert_incidents (
    id         TEXT PRIMARY KEY,
    node_id    TEXT NOT NULL,
    owner_id   TEXT NOT NULL,
    kind       TEXT NOT NULL,
    opened_at  INTEGER NOT NULL,
    closed_at  INTEGER
);
CREATE UNIQUE INDEX alert_incidents_open ON alert_incidents(node_id, kind) WHERE closed_at IS NULL;
CREATE INDEX alert_incidents_owner ON alert_incidents(owner_id, closed_at);
CREATE TABLE alert_notices (
    incident_id  TEXT NOT NULL,
    state        TEXT NOT NULL,
    channel      TEXT NOT NULL,
    owner_id     TEXT NOT NULL,
    at           INTEGER NOT NULL,
    claimed_at   INTEGER,
    delivery     TEXT NOT NULL,
    error        TEXT,
    PRIMARY KEY (incident_id, state, channel)
);
CREATE INDEX alert_notices_unclaimed ON alert_notices(at) WHERE claimed_at IS NULL;
CREATE INDEX alert_notices_owner ON alert_notices(owner_id, at);
"#,
    // 20: signed in-place agent upgrades (issue 47, `store::releases`): the releases the
    // operator added (the signed dist's five files as they are), their rollouts (at most one
    // active or paused), each node's owner switch, the agent's reported one, the node's last
    // upgrade report (what the failure rule counts, per version), and the version its last
    // answer offered (written when the offer changes: "upgrade pending").
    r#"
ALTER TABLE nodes ADD COLUMN auto_update INTEGER NOT NULL DEFAULT 1;
ALTER TABLE nodes ADD COLUMN agent_auto_update INTEGER;
ALTER TABLE nodes ADD COLUMN upgrade_from TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_to TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_outcome TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_detail TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_at INTEGER;
ALTER TABLE nodes ADD COLUMN upgrade_recorded_at INTEGER;
ALTER TABLE nodes ADD COLUMN upgrade_offered TEXT;
CREATE INDEX nodes_upgrade_to ON nodes(upgrade_to) WHERE upgrade_to IS NOT NULL;
CREATE TABLE releases (
    version        TEXT PRIMARY KEY,
    added_at       INTEGER NOT NULL,
    expires        INTEGER NOT NULL,
    agent_size     INTEGER NOT NULL,
    agent_sha256   TEXT NOT NULL,
    release_json   BLOB NOT NULL,
    release_sig    BLOB NOT NULL,
    manifest_json  BLOB NOT NULL,
    manifest_sig   BLOB NOT NULL,
    agent          BLOB NOT NULL
);
CREATE TABLE rollouts (
    version              TEXT PRIMARY KEY REFERENCES releases(version),
    state                TEXT NOT NULL,
    percent              INTEGER NOT NULL,
    max_failure_percent  INTEGER NOT NULL,
    offer_regardless     INTEGER NOT NULL DEFAULT 0,
    halt_reason          TEXT,
    halt_reported        INTEGER,
    halt_failed          INTEGER,
    started_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL
);
CREATE INDEX rollouts_state ON rollouts(state, started_at);
"#,
    // 21: a rollout's schedule (issue 47, `rollout::scheduled_percent`): its step and interval
    // (0: none), and `stepped_at`, the moment from which the steps count (the start, the last
    // resume, or the last fold of the percentage reached into `percent`).
    r#"
ALTER TABLE rollouts ADD COLUMN step_percent INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN step_secs INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN stepped_at INTEGER NOT NULL DEFAULT 0;
"#,
];

/// The schema version this binary writes: on SQLite `PRAGMA user_version` (as before issue 35),
/// on PostgreSQL the one row of `schema_version`. A database at a higher version was migrated by
/// a newer gpum-platform, and this one refuses it rather than misread it.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// PostgreSQL's migrations, each with the schema version it brings the database to. The first
/// creates at once what SQLite's first ten migrations built up (PostgreSQL came with issue 35);
/// a later migration is added to both lists, with the same number. Where the DDL differs:
/// every integer is BIGINT (SQLite's INTEGER is 64-bit), and the tables whose pruning and order
/// rely on SQLite's implicit `rowid` get it as a real column, so the same SQL reads both.
pub(super) const PG_MIGRATIONS: &[(usize, &str)] = &[
    (
        10,
        r#"
CREATE TABLE join_codes (
    code_hash        TEXT PRIMARY KEY,
    created_at       BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    used_at          BIGINT,
    install_id_hash  TEXT,
    node_id          TEXT,
    repeats          BIGINT NOT NULL DEFAULT 0,
    owner_id         TEXT
);
CREATE TABLE nodes (
    id                  TEXT PRIMARY KEY,
    token_hash          TEXT NOT NULL UNIQUE,
    registered_at       BIGINT NOT NULL,
    deleted_at          BIGINT,
    agent_version       TEXT NOT NULL DEFAULT '',
    inventory_json      TEXT NOT NULL DEFAULT '{}',
    inventory_hash      TEXT NOT NULL DEFAULT '',
    last_heartbeat_at   BIGINT,
    last_seq            BIGINT,
    metrics_json        TEXT,
    health_json         TEXT,
    verification        TEXT NOT NULL DEFAULT 'awaiting_check',
    probe_output        TEXT,
    probe_reason        TEXT,
    managed_json        TEXT NOT NULL DEFAULT '[]',
    known_json          TEXT NOT NULL DEFAULT '[]',
    name                TEXT,
    price_per_gpu_hour  BIGINT,
    min_rental_minutes  BIGINT NOT NULL DEFAULT 60,
    paused              BIGINT NOT NULL DEFAULT 0,
    owner_id            TEXT,
    last_sample_at      BIGINT,
    probe_at            BIGINT,
    rentals_until       BIGINT,
    quarantine_json     TEXT
);
CREATE TABLE node_gpus (
    uuid     TEXT PRIMARY KEY,
    node_id  TEXT NOT NULL REFERENCES nodes(id)
);
CREATE INDEX node_gpus_node ON node_gpus(node_id);
CREATE TABLE replaced_tokens (
    token_hash   TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    replaced_at  BIGINT NOT NULL,
    rowid        BIGSERIAL
);
CREATE INDEX replaced_tokens_node ON replaced_tokens(node_id, replaced_at);
CREATE TABLE commands (
    id              TEXT PRIMARY KEY,
    node_id         TEXT NOT NULL,
    kind            TEXT NOT NULL,
    queued_at       BIGINT NOT NULL,
    delivered_at    BIGINT,
    result_ok       BIGINT,
    result_message  TEXT,
    completed_at    BIGINT,
    seq             BIGINT NOT NULL
);
CREATE INDEX commands_pending ON commands(node_id, delivered_at);
CREATE INDEX commands_node_seq ON commands(node_id, seq);
CREATE TABLE container_removals (
    node_id  TEXT NOT NULL,
    at       BIGINT NOT NULL,
    id       TEXT NOT NULL,
    name     TEXT NOT NULL,
    reason   TEXT NOT NULL,
    rowid    BIGSERIAL
);
CREATE INDEX container_removals_node ON container_removals(node_id);
CREATE TABLE settings (
    key    TEXT PRIMARY KEY,
    value  TEXT
);
CREATE TABLE owners (
    id              TEXT PRIMARY KEY,
    email           TEXT NOT NULL UNIQUE,
    password_hash   TEXT,
    totp_secret     TEXT,
    totp_last_step  BIGINT,
    created_at      BIGINT NOT NULL,
    disabled_at     BIGINT
);
CREATE TABLE invitations (
    token_hash  TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT,
    rowid       BIGSERIAL
);
CREATE INDEX invitations_owner ON invitations(owner_id);
CREATE TABLE sessions (
    id_hash     TEXT PRIMARY KEY,
    owner_id    TEXT,
    csrf        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    rowid       BIGSERIAL
);
CREATE INDEX sessions_owner ON sessions(owner_id, created_at);
CREATE TABLE api_keys (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL,
    key_hash      TEXT NOT NULL UNIQUE,
    label         TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    last_used_at  BIGINT,
    revoked_at    BIGINT,
    rowid         BIGSERIAL
);
CREATE INDEX api_keys_owner ON api_keys(owner_id);
CREATE INDEX nodes_owner ON nodes(owner_id);
CREATE INDEX join_codes_owner ON join_codes(owner_id, expires_at);
CREATE TABLE node_samples (
    node_id       TEXT NOT NULL,
    at            BIGINT NOT NULL,
    metrics_json  TEXT NOT NULL,
    rowid         BIGSERIAL
);
CREATE INDEX node_samples_node ON node_samples(node_id, at);
CREATE TABLE node_events (
    node_id  TEXT NOT NULL,
    at       BIGINT NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT '',
    rowid    BIGSERIAL
);
CREATE INDEX node_events_node ON node_events(node_id);
CREATE TABLE rentals (
    id           TEXT PRIMARY KEY,
    node_id      TEXT NOT NULL,
    spec_json    TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    ends_at      BIGINT NOT NULL,
    stopped_at   BIGINT,
    listed       BIGINT NOT NULL DEFAULT 1,
    state        TEXT,
    exit_code    BIGINT,
    reason       TEXT,
    updated_at   BIGINT,
    started_at   BIGINT,
    tunnel_hash  TEXT,
    rowid        BIGSERIAL
);
CREATE INDEX rentals_node ON rentals(node_id, created_at);
-- In the order the heartbeat lists them, so that PostgreSQL's planner takes it over
-- rentals_node (SQLite is told to use it: rentals::desired).
CREATE INDEX rentals_listed ON rentals(node_id, created_at) WHERE listed = 1;
"#,
    ),
    (
        11,
        r#"
DROP INDEX rentals_listed;
CREATE INDEX rentals_listed ON rentals(node_id, created_at) WHERE listed = 1;
"#,
    ),
    (
        12,
        r#"
CREATE TABLE recovery_codes (
    code_hash   TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX recovery_codes_owner ON recovery_codes(owner_id);
ALTER TABLE owners ADD COLUMN totp_reset_at BIGINT;
ALTER TABLE sessions ADD COLUMN totp_pending TEXT;
ALTER TABLE sessions ADD COLUMN totp_pending_until BIGINT;
ALTER TABLE sessions ADD COLUMN flash_deleted TEXT;
"#,
    ),
    (
        13,
        r#"
CREATE TABLE effects (
    at       BIGINT NOT NULL,
    kind     TEXT NOT NULL,
    subject  TEXT NOT NULL,
    rowid    BIGSERIAL
);
CREATE INDEX effects_at ON effects(at);
"#,
    ),
    (
        14,
        r#"
CREATE TABLE throttle (
    door          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    failures      BIGINT NOT NULL,
    last_failure  BIGINT NOT NULL,
    PRIMARY KEY (door, subject)
);
CREATE INDEX throttle_last ON throttle(last_failure);
"#,
    ),
    (
        15,
        r#"
CREATE INDEX nodes_live_by_registration ON nodes(registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX nodes_owner_by_registration ON nodes(owner_id, registered_at, id) WHERE deleted_at IS NULL;
CREATE INDEX owners_by_creation ON owners(created_at, email);
"#,
    ),
    (
        16,
        r#"
CREATE TABLE replicas (
    id         TEXT PRIMARY KEY,
    peer_addr  TEXT NOT NULL,
    seen_at    BIGINT NOT NULL
);
CREATE TABLE tunnel_homes (
    node_id     TEXT PRIMARY KEY,
    replica_id  TEXT NOT NULL,
    since       BIGINT NOT NULL
);
"#,
    ),
    (
        17,
        r#"
ALTER TABLE rentals ADD COLUMN price_per_gpu_hour BIGINT;
UPDATE rentals SET price_per_gpu_hour = (SELECT price_per_gpu_hour FROM nodes WHERE nodes.id = rentals.node_id);
CREATE TABLE rental_runs (
    rental_id   TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT
);
CREATE INDEX rental_runs_rental ON rental_runs(rental_id, started_at);
CREATE INDEX rental_runs_open ON rental_runs(node_id) WHERE ended_at IS NULL;
"#,
    ),
    (
        18,
        r#"
CREATE TABLE maintenance (
    id          TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL REFERENCES nodes(id),
    starts_at   BIGINT NOT NULL,
    ends_at     BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX maintenance_node ON maintenance(node_id, ends_at);
"#,
    ),
    (
        19,
        r#"
CREATE TABLE alert_settings (
    owner_id         TEXT PRIMARY KEY,
    email            TEXT,
    webhook_url      TEXT,
    offline_minutes  BIGINT NOT NULL,
    watch_offline    BIGINT NOT NULL,
    watch_check      BIGINT NOT NULL,
    watch_quarantine BIGINT NOT NULL,
    lang             TEXT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE TABLE alert_incidents (
    id         TEXT PRIMARY KEY,
    node_id    TEXT NOT NULL,
    owner_id   TEXT NOT NULL,
    kind       TEXT NOT NULL,
    opened_at  BIGINT NOT NULL,
    closed_at  BIGINT
);
CREATE UNIQUE INDEX alert_incidents_open ON alert_incidents(node_id, kind) WHERE closed_at IS NULL;
CREATE INDEX alert_incidents_owner ON alert_incidents(owner_id, closed_at);
CREATE TABLE alert_notices (
    incident_id  TEXT NOT NULL,
    state        TEXT NOT NULL,
    channel      TEXT NOT NULL,
    owner_id     TEXT NOT NULL,
    at           BIGINT NOT NULL,
    claimed_at   BIGINT,
    delivery     TEXT NOT NULL,
    error        TEXT,
    PRIMARY KEY (incident_id, state, channel)
);
CREATE INDEX alert_notices_unclaimed ON alert_notices(at) WHERE claimed_at IS NULL;
CREATE INDEX alert_notices_owner ON alert_notices(owner_id, at);
"#,
    ),
    (
        20,
        r#"
ALTER TABLE nodes ADD COLUMN auto_update BIGINT NOT NULL DEFAULT 1;
ALTER TABLE nodes ADD COLUMN agent_auto_update BIGINT;
ALTER TABLE nodes ADD COLUMN upgrade_from TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_to TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_outcome TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_detail TEXT;
ALTER TABLE nodes ADD COLUMN upgrade_at BIGINT;
ALTER TABLE nodes ADD COLUMN upgrade_recorded_at BIGINT;
ALTER TABLE nodes ADD COLUMN upgrade_offered TEXT;
CREATE INDEX nodes_upgrade_to ON nodes(upgrade_to) WHERE upgrade_to IS NOT NULL;
CREATE TABLE releases (
    version        TEXT PRIMARY KEY,
    added_at       BIGINT NOT NULL,
    expires        BIGINT NOT NULL,
    agent_size     BIGINT NOT NULL,
    agent_sha256   TEXT NOT NULL,
    release_json   BYTEA NOT NULL,
    release_sig    BYTEA NOT NULL,
    manifest_json  BYTEA NOT NULL,
    manifest_sig   BYTEA NOT NULL,
    agent          BYTEA NOT NULL
);
CREATE TABLE rollouts (
    version              TEXT PRIMARY KEY REFERENCES releases(version),
    state                TEXT NOT NULL,
    percent              BIGINT NOT NULL,
    max_failure_percent  BIGINT NOT NULL,
    offer_regardless     BIGINT NOT NULL DEFAULT 0,
    halt_reason          TEXT,
    halt_reported        BIGINT,
    halt_failed          BIGINT,
    started_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL
);
CREATE INDEX rollouts_state ON rollouts(state, started_at);
"#,
    ),
    (
        21,
        r#"
ALTER TABLE rollouts ADD COLUMN step_percent BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN step_secs BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rollouts ADD COLUMN stepped_at BIGINT NOT NULL DEFAULT 0;
"#,
    ),
];

/// Opens the platform's database at `db` (a SQLite file's path, created when absent, or a
/// `postgres://` URL) and runs pending migrations; a schema newer than [`SCHEMA_VERSION`] is
/// refused.
pub fn open(db: &Path) -> Result<Conn, crate::sql::Error> {
    open_target(&Target::parse(db))
}

/// [`open`] for a parsed target.
pub fn open_target(target: &Target) -> Result<Conn, crate::sql::Error> {
    match target {
        Target::Sqlite(path) => {
            crate::db::private_files(path)?;
            let conn = rusqlite::Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            // In WAL mode NORMAL loses at most the last transactions on power loss, never
            // integrity; it saves an fsync per commit, which is what lets one SQLite file take
            // 10,000 beats/s.
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            migrate_sqlite(&conn)?;
            Ok(Conn::from_sqlite(conn))
        }
        Target::Postgres(url) => {
            let conn = Conn::connect_postgres(url)?;
            migrate_postgres(&conn)?;
            Ok(conn)
        }
    }
}

pub(super) fn newer_schema(found: i64) -> crate::sql::Error {
    crate::sql::Error::Refused(format!(
        "the database's schema is version {found}, newer than this gpum-platform knows \
         (version {SCHEMA_VERSION}): a newer gpum-platform migrated it; run that version (or newer)"
    ))
}

pub(super) fn migrate_sqlite(conn: &rusqlite::Connection) -> Result<(), crate::sql::Error> {
    let done: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if done > SCHEMA_VERSION as i64 {
        return Err(newer_schema(done));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {m}; PRAGMA user_version = {}; COMMIT;", i + 1))?;
    }
    Ok(())
}

/// Key of the advisory lock under which a replica migrates, so that two starting at once do not
/// both create the schema.
pub(super) const PG_MIGRATION_LOCK: i64 = 0x6770_756d_0035;

pub(super) fn migrate_postgres(conn: &Conn) -> Result<(), crate::sql::Error> {
    conn.execute_batch(&format!(
        "BEGIN; SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK});
         CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)"
    ))?;
    let run = || -> Result<(), crate::sql::Error> {
        let done: i64 =
            conn.query_row("SELECT version FROM schema_version", [], |r| r.get(0)).optional()?.unwrap_or(0);
        if done > SCHEMA_VERSION as i64 {
            return Err(newer_schema(done));
        }
        for (version, m) in PG_MIGRATIONS.iter().filter(|(v, _)| *v as i64 > done) {
            conn.execute_batch(m)?;
            conn.execute("DELETE FROM schema_version", [])?;
            conn.execute("INSERT INTO schema_version (version) VALUES (?1)", params![*version as i64])?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
