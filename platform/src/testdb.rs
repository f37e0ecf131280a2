//! TEST ONLY (unit tests, and the `test-knobs` feature for the end-to-end harness): a fresh
//! platform database on either engine.
//!
//! The engine is [`ENGINE_VAR`]'s (`postgres`, or `sqlite`, the default), so that one suite runs
//! against both by being run twice. PostgreSQL comes from Debian's packages (`postgresql`,
//! installed by `tests/setup-deps.sh`): the first test that needs it starts one private cluster
//! for the whole run (`initdb` into a directory of the temp dir, as the `postgres` user when run
//! as root; unix socket only, no TCP), under a file lock so that parallel test processes share
//! it; every [`TestDb`] is a database of its own in it, dropped with the `TestDb`. The cluster
//! keeps running after the tests (a later run reuses it); `pg_ctl stop -D <dir>/data` ends it.
//! It runs with `fsync = off`: what it proves is the platform's SQL and transactions, not
//! PostgreSQL's durability. The tests that use PostgreSQL whatever the variable says are
//! `#[ignore = "needs PostgreSQL …"]`, run by `--run-ignored all` (as `cargo xtask test` does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::sql::{Conn, Engine};

/// `GPUM_TEST_DB=postgres` runs the engine-neutral tests on PostgreSQL.
pub const ENGINE_VAR: &str = "GPUM_TEST_DB";
/// Where the shared test cluster lives (default: `$TMPDIR/gpum-test-pg-<uid>`).
pub const CLUSTER_DIR_VAR: &str = "GPUM_TEST_PG_DIR";

/// The engine the tests run on now ([`ENGINE_VAR`]); an unknown name is a failure, not SQLite.
pub fn engine() -> Engine {
    match std::env::var(ENGINE_VAR).as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => Engine::Sqlite,
        Ok("postgres") => Engine::Postgres,
        Ok(other) => panic!("{ENGINE_VAR}={other}: expected sqlite or postgres"),
    }
}

/// A fresh, empty database (the platform's migrations run when it is opened).
pub enum TestDb {
    Sqlite(tempfile::TempDir),
    Postgres { name: String },
}

impl TestDb {
    /// On the engine of [`engine`].
    pub fn new() -> TestDb {
        TestDb::on(engine())
    }

    pub fn on(engine: Engine) -> TestDb {
        match engine {
            Engine::Sqlite => TestDb::Sqlite(tempfile::tempdir().expect("temp dir")),
            Engine::Postgres => {
                let name = format!("t_{}", crate::store::new_token()[..16].to_owned());
                cluster().admin(&format!("CREATE DATABASE {name}"));
                TestDb::Postgres { name }
            }
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            TestDb::Sqlite(_) => Engine::Sqlite,
            TestDb::Postgres { .. } => Engine::Postgres,
        }
    }

    /// What `--db` takes: the SQLite file's path, or the database's URL.
    pub fn target(&self) -> PathBuf {
        match self {
            TestDb::Sqlite(d) => d.path().join("platform.db"),
            TestDb::Postgres { name } => PathBuf::from(cluster().url(name)),
        }
    }

    /// The database's content: `pg_dump`'s SQL on PostgreSQL, the file on SQLite.
    pub fn dump(&self) -> Vec<u8> {
        match self {
            TestDb::Sqlite(_) => std::fs::read(self.target()).unwrap_or_default(),
            TestDb::Postgres { name } => {
                let c = cluster();
                let mut cmd = pg_command("pg_dump").expect("pg_dump");
                cmd.arg("-h").arg(&c.dir).args(["-U", SUPERUSER, name]);
                let out = cmd.output().expect("run pg_dump");
                assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
                out.stdout
            }
        }
    }

    /// A new connection, migrated.
    pub fn open(&self) -> Conn {
        let t = self.target();
        off_runtime(|| crate::store::open(&t))
            .unwrap_or_else(|e| panic!("open {}: {}", t.display(), e.detail()))
    }
}

impl Default for TestDb {
    fn default() -> Self {
        TestDb::new()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let TestDb::Postgres { name } = self {
            cluster().admin(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

/// Runs `f` on a thread of its own: the synchronous PostgreSQL client starts its own runtime,
/// which it may not do on a thread that runs one (an async test).
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("thread"))
}

/// The shared test cluster.
pub struct Cluster {
    dir: PathBuf,
}

/// The superuser `initdb` creates; trusted on the cluster's socket, which only its directory's
/// owner and root can reach.
const SUPERUSER: &str = "gpum";

/// The shared cluster, started (or found running) by the first caller in this process.
pub fn cluster() -> &'static Cluster {
    static C: OnceLock<Cluster> = OnceLock::new();
    C.get_or_init(|| {
        let dir = std::env::var_os(CLUSTER_DIR_VAR).map(PathBuf::from).unwrap_or_else(|| {
            std::env::temp_dir().join(format!("gpum-test-pg-{}", nix::unistd::geteuid()))
        });
        start_cluster(&dir).unwrap_or_else(|e| {
            panic!(
                "start the test PostgreSQL in {}: {e} (install PostgreSQL: tests/setup-deps.sh, or apt-get install postgresql)",
                dir.display()
            )
        });
        Cluster { dir }
    })
}

impl Cluster {
    /// The URL of database `db`, over the cluster's unix socket.
    pub fn url(&self, db: &str) -> String {
        let host = self.dir.to_str().expect("UTF-8 temp dir").replace('/', "%2F");
        format!("postgres://{SUPERUSER}@{host}/{db}")
    }

    /// Runs `sql` on the `postgres` database as the superuser.
    pub fn admin(&self, sql: &str) {
        let url = self.url("postgres");
        off_runtime(|| -> Result<(), postgres::Error> {
            let mut c = url.parse::<postgres::Config>()?.connect(postgres::NoTls)?;
            c.batch_execute(sql)
        })
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

fn bin(name: &str) -> anyhow::Result<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    // Debian keeps the server's programs out of PATH.
    if let Ok(rd) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev());
    }
    dirs.into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{name} not found in PATH or /usr/lib/postgresql/*/bin"))
}

/// Runs a PostgreSQL program: as the `postgres` user when we are root (initdb refuses root).
fn pg_command(name: &str) -> anyhow::Result<Command> {
    let prog = bin(name)?;
    Ok(if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(prog);
        c
    } else {
        Command::new(prog)
    })
}

fn run(mut c: Command) -> anyhow::Result<()> {
    let out = c.output()?;
    if !out.status.success() {
        anyhow::bail!(
            "{:?}: {}\n{}{}",
            c,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A new cluster in `data`: [`SUPERUSER`] trusted (the socket's directory keeps others out).
fn initdb(data: &Path) -> anyhow::Result<()> {
    let mut c = pg_command("initdb")?;
    c.arg("-D").arg(data).args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]);
    run(c)
}

fn start_cluster(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;

    std::fs::create_dir_all(dir)?;
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("lock"))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("lock {}: {e}", dir.display()))?;
    let data = dir.join("data");
    if nix::unistd::geteuid().is_root() {
        // The postgres user owns the cluster; the directory (its socket's) is closed to others.
        let pg = nix::unistd::User::from_name("postgres")?
            .ok_or_else(|| anyhow::anyhow!("no postgres user (is the postgresql package installed?)"))?;
        nix::unistd::chown(dir, Some(pg.uid), Some(pg.gid))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    if !data.join("PG_VERSION").exists() {
        initdb(&data)?;
    }
    let mut status = pg_command("pg_ctl")?;
    status.arg("status").arg("-D").arg(&data);
    if status.output()?.status.success() {
        return Ok(());
    }
    let mut c = pg_command("pg_ctl")?;
    c.arg("start").arg("-w").arg("-D").arg(&data).arg("-l").arg(dir.join("log")).arg("-o").arg(format!(
        "-c listen_addresses='' -k {} -c fsync=off -c full_page_writes=off -c max_connections=200",
        dir.display()
    ));
    run(c)
}

#[cfg(test)]
impl TestDb {
    /// A connection without migrations (to look at a refused database).
    fn open_unmigrated(&self) -> Conn {
        match self {
            TestDb::Sqlite(_) => Conn::from_sqlite(rusqlite::Connection::open(self.target()).unwrap()),
            TestDb::Postgres { name } => {
                let url = cluster().url(name);
                off_runtime(|| Conn::connect_postgres(&url)).unwrap()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params;

    /// Issue 35: a database migrated by a newer gpum-platform is refused, with a message that
    /// says what to do, on both engines; nothing is changed.
    #[test]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    fn an_older_binary_refuses_a_newer_schema() {
        for engine in [Engine::Sqlite, Engine::Postgres] {
            let t = TestDb::on(engine);
            let c = t.open();
            let newer = crate::store::SCHEMA_VERSION as i64 + 1;
            match engine {
                Engine::Sqlite => c.execute_batch(&format!("PRAGMA user_version = {newer}")).unwrap(),
                Engine::Postgres => {
                    c.execute("UPDATE schema_version SET version = ?1", params![newer]).unwrap();
                }
            }
            drop(c);
            let target = t.target();
            let Err(e) = off_runtime(|| crate::store::open(&target)) else { panic!("{engine:?}: opened") };
            let msg = e.to_string();
            assert!(msg.contains(&format!("version {newer}, newer than this gpum-platform")), "{msg}");
            let c = t.open_unmigrated();
            let v: i64 = match engine {
                Engine::Sqlite => c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap(),
                Engine::Postgres => {
                    c.query_row("SELECT version FROM schema_version", [], |r| r.get(0)).unwrap()
                }
            };
            assert_eq!(v, newer, "{engine:?}");
        }
    }

    /// PostgreSQL's text cannot hold a NUL; both engines refuse it alike, as an invalid request.
    #[test]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    fn a_nul_in_text_is_an_invalid_request_on_both_engines() {
        for engine in [Engine::Sqlite, Engine::Postgres] {
            let t = TestDb::on(engine);
            let c = t.open();
            let e =
                c.query_row("SELECT id FROM nodes WHERE id = ?1", params!["x\0y"], |r| r.get::<_, String>(0));
            assert!(matches!(e, Err(crate::sql::Error::Nul)), "{engine:?}: {e:?}");
            let e = crate::store::node_settings(&c, "x\0y").unwrap_err();
            assert_eq!(e.code, gpum_protocol::ErrorCode::InvalidRequest, "{engine:?}");
        }
    }

    /// A throwaway CA and a server certificate it signed for `localhost` only: (CA PEM,
    /// certificate PEM, key PEM).
    fn certs() -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "gpum test database CA");
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        (ca.pem(), cert.pem(), key.serialize_pem())
    }

    /// A cluster of its own, stopped when dropped.
    struct TlsCluster(PathBuf);

    impl Drop for TlsCluster {
        fn drop(&mut self) {
            if let Ok(mut c) = pg_command("pg_ctl") {
                let _ = c.arg("stop").args(["-m", "immediate", "-D"]).arg(self.0.join("data")).output();
            }
        }
    }

    /// TLS to PostgreSQL and a password from a file (`pgurl`), against a real server: a private
    /// cluster on a loopback TCP port with `ssl = on`, a certificate for `localhost` from a test
    /// CA, and the platform's role allowed only over TLS with a SCRAM password. The platform
    /// connects, migrates and works, over TLS; a certificate from another CA, a host name the
    /// certificate does not name, and a wrong password are each refused, and no message shows
    /// the password.
    #[test]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    fn tls_with_a_checked_certificate_and_a_password_from_a_file() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pg");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (ca, cert, key) = certs();
        std::fs::write(dir.join("server.crt"), cert).unwrap();
        std::fs::write(dir.join("server.key"), key).unwrap();
        std::fs::set_permissions(dir.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        if nix::unistd::geteuid().is_root() {
            let pg = nix::unistd::User::from_name("postgres").unwrap().expect("the postgres user");
            for f in ["", "server.crt", "server.key"] {
                nix::unistd::chown(&dir.join(f), Some(pg.uid), Some(pg.gid)).unwrap();
            }
        }
        let data = dir.join("data");
        initdb(&data).unwrap();
        let _stop = TlsCluster(dir.clone());
        // The platform's role: only over TLS, only with its password. The superuser: the socket.
        let hba = format!(
            "local all {SUPERUSER} trust\nhostssl all app 127.0.0.1/32 scram-sha-256\nhostssl all app ::1/128 scram-sha-256\n"
        );
        let hba_file = data.join("pg_hba.conf");
        let owner = std::fs::metadata(&hba_file).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap();
        std::fs::write(&hba_file, hba).unwrap();
        nix::unistd::chown(&hba_file, Some(nix::unistd::Uid::from_raw(owner)), None).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut c = pg_command("pg_ctl").unwrap();
        c.arg("start").arg("-w").arg("-D").arg(&data).arg("-l").arg(dir.join("log")).arg("-o").arg(format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -k {d} -c fsync=off -c ssl=on \
             -c ssl_cert_file={d}/server.crt -c ssl_key_file={d}/server.key",
            d = dir.display()
        ));
        run(c).unwrap();
        let password = crate::store::new_token();
        let socket = dir.to_str().unwrap().replace('/', "%2F");
        let admin = format!("postgres://{SUPERUSER}@{socket}:{port}/postgres");
        off_runtime(|| -> Result<(), postgres::Error> {
            let mut c = admin.parse::<postgres::Config>()?.connect(postgres::NoTls)?;
            c.batch_execute(&format!("CREATE ROLE app LOGIN PASSWORD '{password}'"))?;
            c.batch_execute("CREATE DATABASE appdb OWNER app")
        })
        .unwrap();

        let files = tmp.path();
        std::fs::write(files.join("ca.pem"), &ca).unwrap();
        std::fs::write(files.join("other-ca.pem"), certs().0).unwrap();
        let passfile = |name: &str, pw: &str| {
            let f = files.join(name);
            std::fs::write(&f, format!("localhost:{port}:appdb:app:{pw}\n")).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            f
        };
        let (good, bad) = (passfile("pass", &password), passfile("wrong", "not-the-password"));
        let url = |host: &str, ca: &str, pass: &Path| {
            format!(
                "postgres://app@{host}:{port}/appdb?sslmode=verify-full&sslrootcert={}&passfile={}",
                files.join(ca).display(),
                pass.display()
            )
        };

        let ok = url("localhost", "ca.pem", &good);
        let c =
            off_runtime(|| crate::store::open(Path::new(&ok))).unwrap_or_else(|e| panic!("{}", e.detail()));
        let ssl: bool = c
            .query_row("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", [], |r| r.get(0))
            .unwrap();
        assert!(ssl, "the connection is TLS");
        // `serve`'s further connections are made as the first was (TLS, the same password).
        let more = c.connect_again().unwrap_or_else(|e| panic!("{}", e.detail()));
        let ssl: bool = more
            .query_row("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", [], |r| r.get(0))
            .unwrap();
        assert!(ssl, "the second connection is TLS too");
        let v: i64 = c.query_row("SELECT version FROM schema_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v as usize, crate::store::SCHEMA_VERSION);

        for (url, why) in [
            (url("localhost", "other-ca.pem", &good), "certificate"),
            (url("127.0.0.1", "ca.pem", &good), "certificate"),
            (url("localhost", "ca.pem", &bad), "password"),
        ] {
            let Err(e) = off_runtime(|| Conn::connect_postgres(&url)) else { panic!("{url}: connected") };
            let msg = e.detail();
            assert!(msg.contains(why), "{url}: {msg}");
            assert!(!msg.contains(&password), "{url}: the password is in the message");
        }
    }

    /// Both engines' migrations end at the same version, and PostgreSQL's reach it at once.
    #[test]
    #[ignore = "needs PostgreSQL (tests/setup-deps.sh)"]
    fn postgres_migrates_to_the_same_version_and_twice_is_harmless() {
        let t = TestDb::on(Engine::Postgres);
        drop(t.open());
        let c = t.open();
        let v: i64 = c.query_row("SELECT version FROM schema_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v as usize, crate::store::SCHEMA_VERSION);
        let n: i64 = c.query_row("SELECT count(*) FROM schema_version", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
    }
}
