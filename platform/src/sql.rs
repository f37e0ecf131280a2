//! The one seam between the platform's store and its database engine: SQLite (the embedded
//! default, one file) or PostgreSQL (issue 35: a database run by people who run databases, several
//! `serve` replicas on it).
//!
//! The store, rentals and accounts modules are written once against [`Conn`], with one SQL text
//! per statement in the subset both engines read alike: `?N` placeholders (rewritten to `$N` for
//! PostgreSQL once per statement, then cached), `INSERT … ON CONFLICT …`, `RETURNING`, 64-bit
//! integers, text. Values cross as [`Value`]; a row is read column by column with
//! [`Row::get`], as with rusqlite. No caller knows which engine answers, except where an engine
//! has something the other lacks (SQLite's WAL checkpoints, its file backup): those take
//! [`Conn::sqlite`].
//!
//! Why tokio-postgres on one connection and not a pool (deadpool, or sqlx): the platform
//! already runs every operation on one database thread, in batches, each inside its own
//! SAVEPOINT within one transaction that is committed before anyone is answered (`db.rs`). On
//! PostgreSQL that is still the right shape: one connection, one COMMIT (one WAL flush,
//! `synchronous_commit = on`) per batch. A pool would give each request its own transaction
//! and fsync. tokio-postgres (the rust-postgres project, well kept) runs here behind a private
//! current-thread runtime, as its synchronous wrapper `postgres` does, so the store's functions
//! stay synchronous as they are for SQLite; it is used directly because it pipelines: the
//! savepoints around each operation are sent in front of the operation's statements, in the
//! same write, instead of costing a round trip each.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Which engine a [`Conn`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// Where the platform's database is: `--db FILE` (SQLite) or `--db postgres://…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Sqlite(PathBuf),
    /// A libpq-style URL (`postgres://user@host:port/db`), without a password.
    Postgres(String),
}

impl Target {
    /// `postgres://` or `postgresql://` is PostgreSQL; anything else is a SQLite file's path.
    pub fn parse(db: &Path) -> Target {
        match db.to_str() {
            Some(s) if s.starts_with("postgres://") || s.starts_with("postgresql://") => {
                Target::Postgres(s.to_owned())
            }
            _ => Target::Sqlite(db.to_path_buf()),
        }
    }

    /// How it is named in messages: the path, or the URL with any password in it replaced by
    /// `***` (such a URL is refused, and the message that says so must not repeat it).
    pub fn display(&self) -> String {
        match self {
            Target::Sqlite(p) => p.display().to_string(),
            Target::Postgres(u) => redact(u),
        }
    }
}

/// `url` as it may be shown: every password in it replaced by `***` (issue 43, item 9: a URL with
/// a password is refused, and the message that says so must not repeat it). A password may sit
/// in the user information (`user:pw@`, read both as tokio-postgres reads it, up to the first
/// `@`, and as RFC 3986 does, up to the last `@` of the authority, so that a `/`, `?`, `#` or `@`
/// in it hides nothing) or in a query parameter whose name, percent-decoded and in any case,
/// holds `password` (`password=`, `&password=`, `pass%77ord=`, `sslpassword=`). Anything else is
/// shown unchanged.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    // The user information's password: from the first `:` to the farther of the two `@`s.
    let first_at = rest.find('@');
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let rfc_at = rest[..authority_end].rfind('@');
    let rest = match first_at.max(rfc_at) {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!("{}:***{}", &rest[..colon], &rest[at..]),
            None => rest.to_owned(),
        },
        None => rest.to_owned(),
    };
    let Some((before, query)) = rest.split_once('?') else { return format!("{scheme}://{rest}") };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            let name = percent_encoding::percent_decode_str(key).decode_utf8_lossy().to_ascii_lowercase();
            if name.contains("password") { format!("{key}=***") } else { pair.to_owned() }
        })
        .collect();
    format!("{scheme}://{before}?{}", query.join("&"))
}

/// A database failure. Callers turn it into `internal` (the details go to the log only).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgres: {0}")]
    Postgres(#[source] tokio_postgres::Error),
    #[error("the query returned no rows")]
    NoRows,
    #[error("column {0}: {1}")]
    Column(usize, String),
    /// A text parameter holds a NUL character, which PostgreSQL's text cannot hold; refused on
    /// both engines alike, before the statement runs, so that both answer the same (a request
    /// that carried it is invalid, `ApiError`'s 400).
    #[error("a text parameter holds a NUL character")]
    Nul,
    /// The database is not one this binary can use (a newer schema, a password in the URL).
    #[error("{0}")]
    Refused(String),
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Postgres(e)
    }
}

impl Error {
    /// PostgreSQL's message (`db error` alone says nothing) with its SQLSTATE.
    pub fn detail(&self) -> String {
        match self {
            Error::Postgres(e) => match e.as_db_error() {
                Some(db) => format!("postgres: {} ({})", db.message(), db.code().code()),
                // The cause says why (a TLS certificate refused, a connection refused).
                None => match std::error::Error::source(e) {
                    Some(cause) => format!("postgres: {e}: {cause}"),
                    None => format!("postgres: {e}"),
                },
            },
            e => e.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `query_row(…).optional()`: no row is `None`, as with rusqlite.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// One parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// What can be a parameter: `params![…]` takes each by reference, as rusqlite's does.
pub trait ToValue {
    fn to_value(&self) -> Value;
}

macro_rules! to_value_int {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
to_value_int!(i64, i32, u32, u16, u8, bool);

impl ToValue for f64 {
    fn to_value(&self) -> Value {
        Value::Real(*self)
    }
}
impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}
impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl ToValue for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}
impl ToValue for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}
impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}
impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

/// `params![a, b, …]`: the statement's parameters `?1, ?2, …`, each taken by reference and
/// turned into a [`Value`].
#[macro_export]
macro_rules! params {
    () => { [] as [$crate::sql::Value; 0] };
    ($($p:expr),+ $(,)?) => { [$($crate::sql::ToValue::to_value(&$p)),+] };
}

/// What a statement's parameters may be given as: `params![…]`, `[]`, or a slice of values.
pub trait Params {
    fn values(&self) -> &[Value];
}

fn checked<P: Params>(p: &P) -> Result<&[Value]> {
    let v = p.values();
    if v.iter().any(|v| matches!(v, Value::Text(t) if t.contains('\0'))) {
        return Err(Error::Nul);
    }
    Ok(v)
}
impl<const N: usize> Params for [Value; N] {
    fn values(&self) -> &[Value] {
        self
    }
}
impl Params for &[Value] {
    fn values(&self) -> &[Value] {
        self
    }
}
impl Params for Vec<Value> {
    fn values(&self) -> &[Value] {
        self
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// PostgreSQL infers each parameter's type from the statement (`$1` compared with a BIGINT
/// column is a BIGINT); a value is written as whatever type the server asked for, where that
/// makes sense, so one `Value::Int` serves BIGINT, INTEGER and BOOLEAN alike.
impl tokio_postgres::types::ToSql for Value {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> std::result::Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::{IsNull, Type};
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR => i.to_string().to_sql(ty, out),
                _ => Err(format!("an integer parameter where PostgreSQL wants {ty}").into()),
            },
            Value::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (*f as f32).to_sql(ty, out),
                _ => Err(format!("a real parameter where PostgreSQL wants {ty}").into()),
            },
            Value::Text(s) => s.as_str().to_sql(ty, out),
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A column's value turned into a Rust type ([`Row::get`]).
pub trait FromValue: Sized {
    fn from_value(v: Value) -> std::result::Result<Self, String>;
}

impl FromValue for Value {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        Ok(v)
    }
}
impl FromValue for i64 {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        match v {
            Value::Int(i) => Ok(i),
            v => Err(format!("expected an integer, found {v:?}")),
        }
    }
}
macro_rules! from_value_int {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            fn from_value(v: Value) -> std::result::Result<Self, String> {
                let i = i64::from_value(v)?;
                <$t>::try_from(i).map_err(|_| format!("{i} is out of range for {}", stringify!($t)))
            }
        }
    )*};
}
from_value_int!(u64, u32, i32, usize);
impl FromValue for bool {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        Ok(i64::from_value(v)? != 0)
    }
}
impl FromValue for f64 {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        match v {
            Value::Real(f) => Ok(f),
            Value::Int(i) => Ok(i as f64),
            v => Err(format!("expected a real number, found {v:?}")),
        }
    }
}
impl FromValue for String {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        match v {
            Value::Text(s) => Ok(s),
            v => Err(format!("expected text, found {v:?}")),
        }
    }
}
impl FromValue for Vec<u8> {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        match v {
            Value::Blob(b) => Ok(b),
            Value::Text(s) => Ok(s.into_bytes()),
            v => Err(format!("expected bytes, found {v:?}")),
        }
    }
}
impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: Value) -> std::result::Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// A state that is stored as its word (`named_enum!`'s, the same as on the wire): bound and
/// read as its type on both engines, so that no state crosses the database as a string literal
/// (issue 44, item 5). A word read back that names no variant is an error ([`Error::Column`]),
/// never a default.
pub trait Stored: Sized + Copy + 'static {
    /// The type's name, for the error that an unknown word is.
    const NAME: &'static str;
    /// Every variant, for the round-trip test.
    const ALL: &'static [Self];
    fn to_sql_word(&self) -> &'static str;
    fn from_sql_word(word: &str) -> Option<Self>;
}

/// `stored!(Type, …)`: each `named_enum!` type as a [`Stored`] state, a parameter and a column.
macro_rules! stored {
    ($($t:ident),+ $(,)?) => {$(
        impl Stored for gpum_protocol::$t {
            const NAME: &'static str = stringify!($t);
            const ALL: &'static [Self] = gpum_protocol::$t::ALL;
            fn to_sql_word(&self) -> &'static str {
                self.as_str()
            }
            fn from_sql_word(word: &str) -> Option<Self> {
                gpum_protocol::$t::parse(word)
            }
        }
        impl ToValue for gpum_protocol::$t {
            fn to_value(&self) -> Value {
                Value::Text(self.to_sql_word().to_owned())
            }
        }
        impl FromValue for gpum_protocol::$t {
            fn from_value(v: Value) -> std::result::Result<Self, String> {
                let word = String::from_value(v)?;
                Self::from_sql_word(&word).ok_or_else(|| format!("{word:?} is not a {}", Self::NAME))
            }
        }
    )+};
}
stored!(
    VerificationState,
    ProbeFailure,
    CommandKind,
    RentableState,
    NodeEventKind,
    RentalState,
    AlertKind,
    AlertState,
    AlertChannel,
    AlertDelivery,
    UpgradeOutcome,
    RolloutState,
    HaltReason,
);

/// A column's position (`r.get(0)`, as with rusqlite).
pub trait RowIndex {
    fn index(self) -> usize;
}
impl RowIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a result, read column by column.
pub struct Row<'a>(RowInner<'a>);

enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Postgres(&'a tokio_postgres::Row),
}

impl Row<'_> {
    /// Column `i` as `T`; a NULL read as a non-`Option` type, or a value of another type, is
    /// an error.
    pub fn get<I: RowIndex, T: FromValue>(&self, i: I) -> Result<T> {
        let i = i.index();
        let v = match &self.0 {
            RowInner::Sqlite(r) => {
                use rusqlite::types::ValueRef;
                match r.get_ref(i)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(n) => Value::Int(n),
                    ValueRef::Real(f) => Value::Real(f),
                    ValueRef::Text(t) => Value::Text(
                        String::from_utf8(t.to_vec())
                            .map_err(|_| Error::Column(i, "text is not UTF-8".into()))?,
                    ),
                    ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                }
            }
            RowInner::Postgres(r) => pg_value(r, i)?,
        };
        T::from_value(v).map_err(|e| Error::Column(i, e))
    }
}

fn pg_value(r: &tokio_postgres::Row, i: usize) -> Result<Value> {
    use tokio_postgres::types::Type;
    let Some(col) = r.columns().get(i) else { return Err(Error::Column(i, "no such column".into())) };
    let ty = col.type_().clone();
    let v = match ty {
        Type::INT8 => r.try_get::<_, Option<i64>>(i)?.map(Value::Int),
        Type::INT4 => r.try_get::<_, Option<i32>>(i)?.map(|n| Value::Int(n.into())),
        Type::INT2 => r.try_get::<_, Option<i16>>(i)?.map(|n| Value::Int(n.into())),
        Type::BOOL => r.try_get::<_, Option<bool>>(i)?.map(|b| Value::Int(b.into())),
        Type::FLOAT8 => r.try_get::<_, Option<f64>>(i)?.map(Value::Real),
        Type::FLOAT4 => r.try_get::<_, Option<f32>>(i)?.map(|f| Value::Real(f.into())),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            r.try_get::<_, Option<String>>(i)?.map(Value::Text)
        }
        Type::BYTEA => r.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
        ty => return Err(Error::Column(i, format!("PostgreSQL type {ty} is not read by the platform"))),
    };
    Ok(v.unwrap_or(Value::Null))
}

/// A connection to either engine. Used from one thread at a time (the database thread, or a
/// CLI command).
pub struct Conn(Inner);

enum Inner {
    Sqlite(rusqlite::Connection),
    Postgres(Box<RefCell<Pg>>),
}

struct Pg {
    /// A current-thread runtime of the connection's own: its calls are made from the
    /// synchronous database thread (`block_on`), as the `postgres` crate does.
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    /// To connect again when the server closed the connection (a restart, a failover).
    target: crate::pgurl::PgTarget,
    /// Prepared statements by their `?N` text: each is parsed and planned once per connection.
    stmts: HashMap<String, tokio_postgres::Statement>,
    /// Statements without parameters or results (an operation's `SAVEPOINT`, `RELEASE`,
    /// `ROLLBACK TO`) that go out in front of the next statement, pipelined with it: they cost
    /// no round trip of their own (issue 35: round trips were what bounded a replica).
    prefix: String,
    /// A prefix failed, so the transaction is aborted: its COMMIT must fail, not report a
    /// success (PostgreSQL answers COMMIT in an aborted transaction with a silent ROLLBACK).
    poisoned: bool,
}

/// Sends `prefix` (if any) and then `fut`'s statement on `client` without waiting in between,
/// and waits for both. A failed prefix poisons the transaction and is the error returned.
fn pipelined<T>(
    rt: &tokio::runtime::Runtime,
    client: &tokio_postgres::Client,
    prefix: &str,
    poisoned: &mut bool,
    fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T> {
    let pre = async { if prefix.is_empty() { Ok(()) } else { client.batch_execute(prefix).await } };
    // Biased: the prefix is polled first, so its message is queued (and sent) first.
    let (pre, r) = rt.block_on(async { tokio::join!(biased; pre, fut) });
    if let Err(e) = pre {
        *poisoned = true;
        return Err(e.into());
    }
    Ok(r?)
}

impl Pg {
    fn statement(&mut self, sql: &str) -> Result<tokio_postgres::Statement> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let text = dollar_placeholders(sql);
        let prefix = std::mem::take(&mut self.prefix);
        let s = pipelined(&self.rt, &self.client, &prefix, &mut self.poisoned, self.client.prepare(&text))?;
        self.stmts.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    fn execute(&mut self, sql: &str, p: &[Value]) -> Result<u64> {
        let s = self.statement(sql)?;
        let prefix = std::mem::take(&mut self.prefix);
        let params = pg_params(p);
        pipelined(&self.rt, &self.client, &prefix, &mut self.poisoned, self.client.execute(&s, &params))
    }

    fn query(&mut self, sql: &str, p: &[Value]) -> Result<Vec<tokio_postgres::Row>> {
        let s = self.statement(sql)?;
        let prefix = std::mem::take(&mut self.prefix);
        let params = pg_params(p);
        pipelined(&self.rt, &self.client, &prefix, &mut self.poisoned, self.client.query(&s, &params))
    }

    fn batch_execute(&mut self, sql: &str) -> Result<()> {
        let prefix = std::mem::take(&mut self.prefix);
        pipelined(&self.rt, &self.client, &prefix, &mut self.poisoned, self.client.batch_execute(sql))
    }

    /// Adds `sql` to what goes out with the next statement.
    fn defer(&mut self, sql: &str) {
        self.prefix.push_str(sql);
        self.prefix.push(';');
    }
}

fn pg_connect(target: &crate::pgurl::PgTarget) -> Result<(tokio::runtime::Runtime, tokio_postgres::Client)> {
    // Driven whenever the database thread waits on the runtime (`block_on`).
    fn drive<S, T>(rt: &tokio::runtime::Runtime, connection: tokio_postgres::Connection<S, T>)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        rt.spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("database: the PostgreSQL connection ended: {e}");
            }
        });
    }
    let connect = || -> Result<_> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Refused(format!("start the PostgreSQL connection's runtime: {e}")))?;
        let client = match &target.tls {
            Some(tls) => {
                let (client, connection) = rt.block_on(target.config.connect(tls.clone()))?;
                drive(&rt, connection);
                client
            }
            None => {
                let (client, connection) = rt.block_on(target.config.connect(tokio_postgres::NoTls))?;
                drive(&rt, connection);
                client
            }
        };
        Ok((rt, client))
    };
    // `block_on` must not run inside another runtime (serve opens the database before its
    // runtime starts; tests may not): then the connection is made on a thread of its own.
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| s.spawn(connect).join())
            .map_err(|_| Error::Refused("the PostgreSQL connection thread panicked".into()))?
    } else {
        connect()
    }
}

fn pg_params(p: &[Value]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    p.iter().map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync)).collect()
}

/// `?N` placeholders as PostgreSQL's `$N` (outside quoted strings and identifiers).
pub fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quote: Option<char> = None;
    for c in sql.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '?' => {
                out.push('$');
                continue;
            }
            None => {}
        }
        out.push(c);
    }
    out
}

impl Conn {
    /// A SQLite connection, as it is.
    pub fn from_sqlite(c: rusqlite::Connection) -> Conn {
        Conn(Inner::Sqlite(c))
    }

    /// Connects to PostgreSQL at `url` (`postgres://user@host:port/db?…`): TLS and the password
    /// as [`crate::pgurl`] says; a password in the URL is refused, since the URL is on the
    /// command line.
    pub fn connect_postgres(url: &str) -> Result<Conn> {
        Conn::postgres_at(crate::pgurl::parse(url)?)
    }

    fn postgres_at(target: crate::pgurl::PgTarget) -> Result<Conn> {
        let (rt, client) = pg_connect(&target)?;
        Ok(Conn(Inner::Postgres(Box::new(RefCell::new(Pg {
            rt,
            client,
            target,
            stmts: HashMap::new(),
            prefix: String::new(),
            poisoned: false,
        })))))
    }

    /// A second connection to the same PostgreSQL database, as this one was made (its URL, TLS
    /// and password read once, at the first). SQLite has one writer: refused.
    pub fn connect_again(&self) -> Result<Conn> {
        match &self.0 {
            Inner::Postgres(pg) => Conn::postgres_at(pg.borrow().target.clone()),
            Inner::Sqlite(_) => Err(Error::Refused("a SQLite database has one writer".into())),
        }
    }

    /// [`Conn::begin`], and on PostgreSQL, when the server had closed the connection (it
    /// restarted, or a failover moved it), a new connection and the BEGIN again. What failed on
    /// the old connection stays failed: it was answered as such.
    pub fn begin_or_reconnect(&self) -> Result<()> {
        match (self.begin(), &self.0) {
            (Err(e), Inner::Postgres(pg)) if pg.borrow().client.is_closed() => {
                tracing::warn!("database: the connection was closed ({}); connecting again", e.detail());
                let mut pg = pg.borrow_mut();
                let (rt, client) = pg_connect(&pg.target)?;
                // The old client first: its runtime goes with it.
                pg.client = client;
                pg.rt = rt;
                pg.stmts.clear();
                drop(pg);
                self.begin()
            }
            (r, _) => r,
        }
    }

    /// Where this PostgreSQL connection was made (for a connection of another kind, such as
    /// `effects`' `LISTEN`); `None` on SQLite.
    pub fn pg_target(&self) -> Option<crate::pgurl::PgTarget> {
        match &self.0 {
            Inner::Postgres(pg) => Some(pg.borrow().target.clone()),
            Inner::Sqlite(_) => None,
        }
    }

    pub fn engine(&self) -> Engine {
        match self.0 {
            Inner::Sqlite(_) => Engine::Sqlite,
            Inner::Postgres(_) => Engine::Postgres,
        }
    }

    /// The SQLite connection underneath, for what only SQLite has (pragmas, checkpoints).
    pub fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.0 {
            Inner::Sqlite(c) => Some(c),
            Inner::Postgres(_) => None,
        }
    }

    /// Runs statements without parameters or results (migrations, BEGIN).
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.0 {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Postgres(pg) => pg.borrow_mut().batch_execute(sql),
        }
    }

    /// Starts a write transaction (SQLite takes the write lock now, not at the first write).
    pub fn begin(&self) -> Result<()> {
        match &self.0 {
            Inner::Sqlite(c) => Ok(c.execute_batch("BEGIN IMMEDIATE")?),
            Inner::Postgres(pg) => {
                let mut pg = pg.borrow_mut();
                pg.prefix.clear();
                pg.poisoned = false;
                pg.batch_execute("BEGIN")
            }
        }
    }

    /// Opens the savepoint `op` that one operation of a batch runs in (`db.rs`). On PostgreSQL
    /// it goes out with the operation's first statement; an operation that runs none costs
    /// nothing.
    pub fn savepoint(&self) -> Result<()> {
        match &self.0 {
            Inner::Sqlite(c) => Ok(c.execute_batch("SAVEPOINT op")?),
            Inner::Postgres(pg) => {
                pg.borrow_mut().defer("SAVEPOINT op");
                Ok(())
            }
        }
    }

    /// Closes the savepoint of [`Conn::savepoint`]: kept when `ok`, else rolled back to. On
    /// PostgreSQL it goes out with the next statement or the COMMIT; if it fails there, the
    /// whole transaction fails ([`Conn::commit`]).
    pub fn end_savepoint(&self, ok: bool) -> Result<()> {
        let end = if ok { "RELEASE op" } else { "ROLLBACK TO op; RELEASE op" };
        match &self.0 {
            Inner::Sqlite(c) => Ok(c.execute_batch(end)?),
            Inner::Postgres(pg) => {
                let mut pg = pg.borrow_mut();
                // Nothing ran since it was opened: neither needs to be sent.
                match pg.prefix.strip_suffix("SAVEPOINT op;").map(str::len) {
                    Some(keep) => pg.prefix.truncate(keep),
                    None => pg.defer(end),
                }
                Ok(())
            }
        }
    }

    /// Commits the transaction, with whatever [`Conn::end_savepoint`] left to send. Fails, and
    /// nothing is committed, when any of that failed.
    pub fn commit(&self) -> Result<()> {
        match &self.0 {
            Inner::Sqlite(c) => Ok(c.execute_batch("COMMIT")?),
            Inner::Postgres(pg) => {
                let mut pg = pg.borrow_mut();
                pg.batch_execute("COMMIT")?;
                if pg.poisoned {
                    return Err(Error::Refused("the transaction was aborted; nothing was committed".into()));
                }
                Ok(())
            }
        }
    }

    /// Ends a transaction that failed; what it wrote is gone.
    pub fn rollback(&self) {
        if let Inner::Postgres(pg) = &self.0 {
            let mut pg = pg.borrow_mut();
            pg.prefix.clear();
            pg.poisoned = false;
        }
        let _ = self.execute_batch("ROLLBACK");
    }

    /// `sql`, a `SELECT` of rows that the transaction goes on to change, with `FOR UPDATE` on
    /// PostgreSQL: another replica's transaction that selects them so waits for this one's
    /// COMMIT and then reads what it wrote. On SQLite the write transaction already holds the
    /// whole database (`BEGIN IMMEDIATE`).
    pub fn for_update<'s>(&self, sql: &'s str) -> std::borrow::Cow<'s, str> {
        match self.engine() {
            Engine::Sqlite => sql.into(),
            Engine::Postgres => format!("{sql} FOR UPDATE").into(),
        }
    }

    /// [`Conn::for_update`] for a statement that joins other tables: only `table`'s rows are
    /// locked (PostgreSQL refuses `FOR UPDATE` over the nullable side of an outer join).
    pub fn for_update_of<'s>(&self, sql: &'s str, table: &str) -> std::borrow::Cow<'s, str> {
        match self.engine() {
            Engine::Sqlite => sql.into(),
            Engine::Postgres => format!("{sql} FOR UPDATE OF {table}").into(),
        }
    }

    /// A statement, prepared once per connection and cached.
    pub fn prepare_cached<'c, 's>(&'c self, sql: &'s str) -> Result<Stmt<'c, 's>> {
        Ok(Stmt { conn: self, sql })
    }

    pub fn execute<P: Params>(&self, sql: &str, p: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(p)
    }

    pub fn query_row<T, P: Params, F: FnOnce(&Row<'_>) -> Result<T>>(
        &self,
        sql: &str,
        p: P,
        f: F,
    ) -> Result<T> {
        self.prepare_cached(sql)?.query_row(p, f)
    }
}

// How many statements this thread ran, for the tests that prove a lookup's cost does not grow
// with the number of rows (issue 44: one node costs one node).
#[cfg(test)]
thread_local! {
    static STATEMENTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many statements this thread has run so far (tests only).
#[cfg(test)]
pub fn statements_run() -> u64 {
    STATEMENTS.with(|c| c.get())
}

fn counted() {
    #[cfg(test)]
    STATEMENTS.with(|c| c.set(c.get() + 1));
}

/// A cached statement of a [`Conn`].
pub struct Stmt<'c, 's> {
    conn: &'c Conn,
    sql: &'s str,
}

impl Stmt<'_, '_> {
    /// Runs it; the rows it changed.
    pub fn execute<P: Params>(&mut self, p: P) -> Result<usize> {
        let p = checked(&p)?;
        counted();
        match &self.conn.0 {
            Inner::Sqlite(c) => {
                Ok(c.prepare_cached(self.sql)?.execute(rusqlite::params_from_iter(p.iter()))?)
            }
            Inner::Postgres(pg) => Ok(pg.borrow_mut().execute(self.sql, p)? as usize),
        }
    }

    /// The first row through `f`; [`Error::NoRows`] when there is none.
    pub fn query_row<T, P: Params, F: FnOnce(&Row<'_>) -> Result<T>>(&mut self, p: P, f: F) -> Result<T> {
        let p = checked(&p)?;
        counted();
        match &self.conn.0 {
            Inner::Sqlite(c) => {
                let mut s = c.prepare_cached(self.sql)?;
                let mut rows = s.query(rusqlite::params_from_iter(p.iter()))?;
                match rows.next()? {
                    Some(r) => f(&Row(RowInner::Sqlite(r))),
                    None => Err(Error::NoRows),
                }
            }
            Inner::Postgres(pg) => {
                let rows = pg.borrow_mut().query(self.sql, p)?;
                match rows.first() {
                    Some(r) => f(&Row(RowInner::Postgres(r))),
                    None => Err(Error::NoRows),
                }
            }
        }
    }

    /// Every row through `f`, in order.
    pub fn query_map<T, P: Params, F: FnMut(&Row<'_>) -> Result<T>>(
        &mut self,
        p: P,
        mut f: F,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let p = checked(&p)?;
        counted();
        let mut out = Vec::new();
        match &self.conn.0 {
            Inner::Sqlite(c) => {
                let mut s = c.prepare_cached(self.sql)?;
                let mut rows = s.query(rusqlite::params_from_iter(p.iter()))?;
                while let Some(r) = rows.next()? {
                    out.push(f(&Row(RowInner::Sqlite(r))));
                }
            }
            Inner::Postgres(pg) => {
                let rows = pg.borrow_mut().query(self.sql, p)?;
                out.extend(rows.iter().map(|r| f(&Row(RowInner::Postgres(r)))));
            }
        }
        Ok(out.into_iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_dollars_outside_quotes() {
        assert_eq!(
            dollar_placeholders("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND (?2 IS NULL OR d = ?2)"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND ($2 IS NULL OR d = $2)"
        );
    }

    #[test]
    fn a_postgres_url_is_postgres_and_anything_else_a_file() {
        assert_eq!(
            Target::parse(Path::new("postgres://gpum@127.0.0.1:5432/gpum")),
            Target::Postgres("postgres://gpum@127.0.0.1:5432/gpum".into())
        );
        assert_eq!(Target::parse(Path::new("postgresql://x/y")), Target::Postgres("postgresql://x/y".into()));
        assert_eq!(Target::parse(Path::new("platform.db")), Target::Sqlite("platform.db".into()));
        assert_eq!(Target::parse(Path::new("./postgres://x")), Target::Sqlite("./postgres://x".into()));
    }

    #[test]
    fn a_password_is_never_shown() {
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@%2Ftmp/db"), "postgres://u@%2Ftmp/db");
        assert_eq!(redact("postgresql://u:p%40ss@h/db?x=1"), "postgresql://u:***@h/db?x=1");
        assert_eq!(Target::parse(Path::new("postgres://u:s@h/d")).display(), "postgres://u:***@h/d");
    }

    #[test]
    fn a_password_in_the_url_is_refused() {
        let Err(e) = Conn::connect_postgres("postgres://u:secret@127.0.0.1:1/db") else {
            panic!("connected")
        };
        assert!(matches!(e, Error::Refused(_)), "{e}");
        assert!(!e.to_string().contains("secret"));
    }

    /// Every state of every stored type goes in as its type and comes back the same, on the
    /// engine `GPUM_TEST_DB` names; a word no variant has is an error, not a default.
    #[test]
    fn every_stored_state_round_trips_and_an_unknown_word_is_an_error() {
        use gpum_protocol::{
            CommandKind, NodeEventKind, ProbeFailure, RentableState, RentalState, VerificationState,
        };
        fn round_trip<T: Stored + ToValue + FromValue + PartialEq + std::fmt::Debug>(c: &Conn) {
            c.execute_batch("DELETE FROM words").unwrap();
            for (i, v) in T::ALL.iter().enumerate() {
                c.execute("INSERT INTO words (n, w) VALUES (?1, ?2)", params![i as i64, v]).unwrap();
                let back: T =
                    c.query_row("SELECT w FROM words WHERE n = ?1", params![i as i64], |r| r.get(0)).unwrap();
                assert_eq!(&back, v, "{}", T::NAME);
                assert_eq!(T::from_sql_word(v.to_sql_word()), Some(*v));
            }
            let stored: i64 = c.query_row("SELECT COUNT(DISTINCT w) FROM words", [], |r| r.get(0)).unwrap();
            assert_eq!(stored as usize, T::ALL.len(), "{}: two states share a word", T::NAME);
            let none: Option<T> = c.query_row("SELECT NULL", [], |r| r.get(0)).unwrap();
            assert_eq!(none, None);
            c.execute("INSERT INTO words (n, w) VALUES (?1, ?2)", params![-1i64, "no_such_word"]).unwrap();
            let unknown = c.query_row("SELECT w FROM words WHERE n = -1", [], |r| r.get::<_, T>(0));
            assert!(
                matches!(&unknown, Err(Error::Column(0, e)) if e.contains("no_such_word")),
                "{unknown:?}"
            );
            let unknown = c.query_row("SELECT w FROM words WHERE n = -1", [], |r| r.get::<_, Option<T>>(0));
            assert!(
                matches!(unknown, Err(Error::Column(..))),
                "{}: an unknown word read as a state",
                T::NAME
            );
        }
        let db = crate::testdb::TestDb::new();
        let c = db.open();
        c.execute_batch("CREATE TABLE words (n BIGINT NOT NULL, w TEXT NOT NULL)").unwrap();
        round_trip::<VerificationState>(&c);
        round_trip::<ProbeFailure>(&c);
        round_trip::<CommandKind>(&c);
        round_trip::<RentableState>(&c);
        round_trip::<NodeEventKind>(&c);
        round_trip::<RentalState>(&c);
        round_trip::<gpum_protocol::AlertKind>(&c);
        round_trip::<gpum_protocol::AlertState>(&c);
        round_trip::<gpum_protocol::AlertChannel>(&c);
        round_trip::<gpum_protocol::AlertDelivery>(&c);
    }

    /// The tidy rule of issue 44, item 5: in the store's and the rentals' code, no state's word
    /// is written as a literal, in SQL (`'gone'`) or in Rust (`"gone"`); states cross the
    /// database as their types ([`Stored`]). Schema defaults (`store/migrations.rs`) are the one
    /// place a word is written out.
    #[test]
    fn states_cross_the_database_only_as_types() {
        use gpum_protocol::{
            CommandKind, NodeEventKind, ProbeFailure, RentableState, RentalState, VerificationState,
        };
        let words: Vec<&str> = [
            VerificationState::ALL.iter().map(Stored::to_sql_word).collect::<Vec<_>>(),
            ProbeFailure::ALL.iter().map(Stored::to_sql_word).collect(),
            CommandKind::ALL.iter().map(Stored::to_sql_word).collect(),
            RentableState::ALL.iter().map(Stored::to_sql_word).collect(),
            NodeEventKind::ALL.iter().map(Stored::to_sql_word).collect(),
            RentalState::ALL.iter().map(Stored::to_sql_word).collect(),
        ]
        .concat();
        let sources = [
            ("store/mod.rs", include_str!("store/mod.rs")),
            ("store/earnings.rs", include_str!("store/earnings.rs")),
            ("store/enroll.rs", include_str!("store/enroll.rs")),
            ("store/events.rs", include_str!("store/events.rs")),
            ("store/heartbeat.rs", include_str!("store/heartbeat.rs")),
            ("store/maintenance.rs", include_str!("store/maintenance.rs")),
            ("store/nodes.rs", include_str!("store/nodes.rs")),
            ("store/owners.rs", include_str!("store/owners.rs")),
            ("store/alerts.rs", include_str!("store/alerts.rs")),
            ("rentals.rs", include_str!("rentals.rs")),
            ("accounts.rs", include_str!("accounts.rs")),
        ];
        for (name, src) in sources {
            // The product code only: a file's tests may spell a word out to prove it.
            let product = src.split("#[cfg(test)]\nmod tests").next().unwrap_or(src);
            for w in &words {
                for quoted in [format!("'{w}'"), format!("\"{w}\"")] {
                    assert!(!product.contains(&quoted), "{name} writes the state {quoted} as a literal");
                }
            }
        }
    }
}
