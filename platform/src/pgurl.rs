//! What `--db postgres://…` means beyond what tokio-postgres reads (issue 35): TLS to the
//! database, checked, and a password from a file, never from the command line.
//!
//! The URL's own parameters take libpq's names, so that an operator's URL reads as it does
//! elsewhere; the platform is stricter where libpq is lenient:
//! - `sslmode=verify-full` (or `require`, `verify-ca`): TLS, and the server's certificate is
//!   always checked against `sslrootcert` and its name against the URL's host (libpq's `require`
//!   would take any certificate). `sslmode=disable`: plain, said out loud. `allow` and `prefer`
//!   (plain when the server, or whoever sits between, says no TLS) are refused.
//! - No `sslmode`: plain over a unix socket or to a loopback address (the connection does not
//!   leave the machine); refused to any other host, which must say which of the two it means.
//!   What counts is the address dialled: a `hostaddr=` is dialled instead of its host name, so
//!   `localhost?hostaddr=192.0.2.2` is another host ([`dialled_locally`]).
//! - `sslrootcert=FILE`: the PEM certificates (the database's CA) the server's certificate must
//!   chain to; `sslrootcert=system`: the Mozilla roots built into the platform. TLS without it is
//!   refused: no certificate is taken on trust.
//! - `passfile=FILE`: libpq's password file (`host:port:database:user:password` lines, `*` for
//!   any, `\` escaping `:` and `\`), which must not be readable by group or others. A password in
//!   the URL itself is refused: the URL is on the command line, where `ps` shows it; and a
//!   message that shows the URL shows it redacted ([`crate::sql::redact`]).

use std::path::Path;
use std::sync::Arc;

use tokio_postgres::config::{Host, SslMode};

use crate::sql::Error;

/// A parsed `--db postgres://…`.
#[derive(Clone)]
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    /// `Some` when the connection is TLS (with the roots it trusts).
    pub tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

fn refused(what: impl Into<String>) -> Error {
    Error::Refused(what.into())
}

/// Parses `url`, reads its `sslrootcert` and `passfile`, and decides on TLS (see the module).
pub fn parse(url: &str) -> Result<PgTarget, Error> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (mut sslmode, mut rootcert, mut passfile) = (None, None, None);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let value = || {
            percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|_| refused(format!("the database URL's {k} is not UTF-8")))
        };
        match k {
            "sslmode" => sslmode = Some(value()?),
            "sslrootcert" => rootcert = Some(value()?),
            "passfile" => passfile = Some(value()?),
            "password" => return Err(password_in_url()),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
    let mut config: tokio_postgres::Config = rest.parse()?;
    if config.get_password().is_some() {
        return Err(password_in_url());
    }
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(refused(
            "the database URL names no host: postgres://USER@HOST[:PORT]/DB, or a socket's directory \
             as the host (postgres://USER@%2Fvar%2Frun%2Fpostgresql/DB)",
        ));
    }
    let local = dialled_locally(&config);
    let tls = match sslmode.as_deref() {
        None if local => false,
        None => {
            return Err(refused(
                "the database is on another host: add sslmode=verify-full and sslrootcert=FILE to its URL \
                 (TLS, the server's certificate checked), or sslmode=disable (plain, on a network you trust)",
            ));
        }
        Some("disable") => false,
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => {
            return Err(refused(format!(
                "sslmode={other}: use verify-full (TLS, the certificate checked) or disable; \
                 allow and prefer would go plain whenever the network says so"
            )));
        }
    };
    config.ssl_mode(if tls { SslMode::Require } else { SslMode::Disable });
    let tls = if tls {
        let Some(root) = rootcert else {
            return Err(refused(
                "TLS to the database needs sslrootcert=FILE (the PEM certificate of the CA that signed \
                 the server's) or sslrootcert=system (the platform's built-in roots)",
            ));
        };
        Some(tokio_postgres_rustls::MakeRustlsConnect::new(client_config(&root)?))
    } else {
        None
    };
    if let Some(file) = passfile
        && let Some(password) = password_from(Path::new(&file), &config)?
    {
        config.password(password);
    }
    Ok(PgTarget { config, tls })
}

/// Whether every address `config` dials is on this machine: a unix socket, `localhost` or a
/// loopback address. Each host is dialled at its `hostaddr` when one is given (the host name then
/// only names the server for TLS), so that is the address that counts (issue 43, item 8). No
/// address at all is not local.
pub fn dialled_locally(config: &tokio_postgres::Config) -> bool {
    let (hosts, addrs) = (config.get_hosts(), config.get_hostaddrs());
    let n = hosts.len().max(addrs.len());
    n > 0
        && (0..n).all(|i| match (addrs.get(i), hosts.get(i)) {
            (Some(ip), _) => ip.is_loopback(),
            (None, Some(Host::Unix(_))) => true,
            (None, Some(Host::Tcp(name))) => {
                name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            }
            (None, None) => false,
        })
}

fn password_in_url() -> Error {
    refused(
        "the database URL holds a password, which would be visible in the process list; \
         put it in a password file (passfile=FILE in the URL) or log in without one",
    )
}

/// A rustls client that trusts `root`'s certificates (or the built-in roots for `system`).
fn client_config(root: &str) -> Result<rustls::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    if root == "system" {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    } else {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let certs = CertificateDer::pem_file_iter(root)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| refused(format!("read sslrootcert {root}: {e}")))?;
        let found = certs.len();
        for cert in certs {
            roots.add(cert).map_err(|e| refused(format!("sslrootcert {root}: {e}")))?;
        }
        if found == 0 {
            return Err(refused(format!("sslrootcert {root}: no PEM certificate in it")));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| refused(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The password of the first line of the password file `file` that matches `config`'s host,
/// port, database and user (libpq's rules), if any. A file that group or others may read is
/// refused, as is one that cannot be read.
fn password_from(file: &Path, config: &tokio_postgres::Config) -> Result<Option<String>, Error> {
    use std::os::unix::fs::MetadataExt;
    let shown = file.display();
    let meta = std::fs::metadata(file).map_err(|e| refused(format!("passfile {shown}: {e}")))?;
    if meta.mode() & 0o077 != 0 {
        return Err(refused(format!(
            "passfile {shown}: group or others may read it (mode {:04o}); chmod 600 it",
            meta.mode() & 0o7777
        )));
    }
    let text = std::fs::read_to_string(file).map_err(|e| refused(format!("passfile {shown}: {e}")))?;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user().unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(fields)
        .find(|f| {
            f.len() == 5
                && [&host, &port, db, user].iter().zip(f).all(|(want, got)| got == "*" || got == *want)
        })
        .map(|mut f| f.swap_remove(4)))
}

/// A password file's line split on `:`, with `\:` and `\\` read as `:` and `\`.
fn fields(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.last_mut().expect("one field").push(n);
                }
            }
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut().expect("one field").push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match parse(url) {
            Ok(_) => panic!("{url}: accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn plain_only_on_the_machine_or_when_asked_and_never_downgradable() {
        for url in [
            "postgres://gpum@%2Fvar%2Frun%2Fpostgresql/gpum",
            "postgres://gpum@localhost/gpum",
            "postgres://gpum@127.0.0.1:5433/gpum",
            "postgres://gpum@[::1]/gpum",
            "postgres://gpum@db.internal/gpum?sslmode=disable",
        ] {
            let t = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(t.tls.is_none(), "{url}");
            assert_eq!(t.config.get_ssl_mode(), SslMode::Disable, "{url}");
        }
        assert!(err("postgres://gpum@db.internal/gpum").contains("sslmode=verify-full"));
        assert!(err("postgres://gpum@10.0.0.5/gpum").contains("another host"));
        for mode in ["prefer", "allow", "bogus"] {
            assert!(err(&format!("postgres://gpum@db.internal/gpum?sslmode={mode}")).contains(mode));
        }
        let t = parse(
            "postgres://gpum@db.internal/gpum?sslmode=verify-full&sslrootcert=system&connect_timeout=5",
        )
        .unwrap();
        assert!(t.tls.is_some());
        assert_eq!(t.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(t.config.get_connect_timeout(), Some(&std::time::Duration::from_secs(5)));
        assert!(err("postgres://gpum@db.internal/gpum?sslmode=require").contains("sslrootcert"));
        assert!(
            err("postgres://gpum@db.internal/gpum?sslmode=require&sslrootcert=/nonexistent")
                .contains("/nonexistent")
        );
    }

    /// Issue 43, item 8: `hostaddr=` is the address tokio-postgres dials (the host name then only
    /// names the server for TLS), so `localhost?hostaddr=192.0.2.2` went plain to 192.0.2.2 with
    /// the password. Whether the connection stays on the machine is decided from the addresses
    /// dialled, before anything is sent (a refused URL makes no connection: `parse` connects to
    /// nothing).
    #[test]
    fn plain_only_when_the_address_dialled_is_on_the_machine() {
        for url in [
            "postgres://gpum@localhost:5433/gpum?hostaddr=192.0.2.2",
            "postgres://gpum@127.0.0.1/gpum?hostaddr=10.0.0.5",
            "postgres://gpum@%2Fvar%2Frun%2Fpostgresql/gpum?hostaddr=192.0.2.2",
            "postgres://gpum@localhost,localhost/gpum?hostaddr=127.0.0.1,192.0.2.2",
            "postgres://gpum@/gpum?hostaddr=192.0.2.2",
            "postgres://gpum@localhost/gpum?hostaddr=%3A%3Affff%3A192.0.2.2",
            "postgres://gpum@localhost/gpum?host=db.internal",
        ] {
            assert!(err(url).contains("another host"), "{url}: {}", err(url));
        }
        for url in [
            "postgres://gpum@localhost/gpum?hostaddr=127.0.0.1",
            "postgres://gpum@db.internal/gpum?hostaddr=127.0.0.2",
            "postgres://gpum@localhost/gpum?hostaddr=%3A%3A1",
            "postgres://gpum@/gpum?hostaddr=127.0.0.1",
        ] {
            let t = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(t.tls.is_none(), "{url}");
        }
        // With TLS asked for, hostaddr is allowed anywhere (the certificate is checked against the
        // host name).
        let t = parse(
            "postgres://gpum@db.internal/gpum?hostaddr=192.0.2.2&sslmode=verify-full&sslrootcert=system",
        )
        .unwrap();
        assert!(t.tls.is_some());
        // The decision alone, on the addresses each host is dialled at.
        let cfg = |s: &str| s.parse::<tokio_postgres::Config>().unwrap();
        assert!(!dialled_locally(&cfg("postgres://u@localhost/db?hostaddr=192.0.2.2")));
        assert!(dialled_locally(&cfg("postgres://u@localhost/db")));
        assert!(!dialled_locally(&cfg("postgres://u@/db")), "nothing dialled is nothing local");
    }

    /// Issue 43, item 9: `--db "postgres://gpum@db.internal/gpum?password=TopSecretPw2"` was
    /// refused with a message that printed the URL, password and all. Every way a URL can carry
    /// a password is redacted where a URL is shown.
    #[test]
    fn a_shown_url_never_holds_a_password() {
        let secret = "TopSecretPw2";
        for url in [
            "postgres://gpum@db.internal/gpum?password=TopSecretPw2",
            "postgres://gpum@db.internal/gpum?sslmode=disable&password=TopSecretPw2",
            "postgres://gpum@db.internal/gpum?sslmode=disable&password=TopSecretPw2&connect_timeout=5",
            "postgres://gpum@db.internal/gpum?pass%77ord=TopSecretPw2",
            "postgres://gpum@db.internal/gpum?%70assword=TopSecretPw2",
            "postgres://gpum@db.internal/gpum?PASSWORD=TopSecretPw2",
            "postgres://gpum@db.internal/gpum?sslpassword=TopSecretPw2",
            "postgres://gpum:TopSecretPw2@db.internal/gpum",
            "postgresql://gpum:TopSecretPw2@db.internal:5432/gpum",
            "postgres://gpum:Top/SecretPw2@db.internal/gpum",
            "postgres://gpum:Top@SecretPw2@db.internal/gpum",
            "postgres://gpum:Top?SecretPw2@db.internal/gpum",
            "postgres://gpum:Top#SecretPw2@db.internal/gpum",
            "postgres://gpum:Top%53ecretPw2@db.internal/gpum",
            "postgres://gpum:TopSecretPw2@db1,db2/gpum",
            "postgres://:TopSecretPw2@db.internal/gpum",
            "postgres://db.internal/gpum?user=gpum&password=TopSecretPw2",
            "postgres://db.internal/gpum?password=TopSecretPw2#frag",
            "postgres://db.internal/gpum?password=Top%20SecretPw2",
        ] {
            let shown = crate::sql::redact(url);
            let plain = percent_encoding::percent_decode_str(&shown).decode_utf8_lossy().replace(' ', "");
            assert!(
                !shown.contains("Secret") && !plain.contains("Secret") && !plain.contains(secret),
                "{url} shown as {shown}"
            );
            // The refusal says so without the password.
            let e = err(url);
            assert!(!e.contains("Secret"), "{url}: {e}");
        }
        // What is not a password stays readable.
        assert_eq!(
            crate::sql::redact("postgres://gpum@db.internal:5432/gpum?sslmode=disable&passfile=/etc/gpum/pg"),
            "postgres://gpum@db.internal:5432/gpum?sslmode=disable&passfile=/etc/gpum/pg"
        );
        assert_eq!(
            crate::sql::redact("postgres://gpum@db.internal/gpum?password=x"),
            "postgres://gpum@db.internal/gpum?password=***"
        );
        assert_eq!(
            crate::sql::redact("postgres://gpum:x@db.internal/gpum"),
            "postgres://gpum:***@db.internal/gpum"
        );
    }

    #[test]
    fn a_password_comes_from_a_private_file_never_the_url() {
        use std::os::unix::fs::PermissionsExt;
        for url in ["postgres://u:secret@localhost/db", "postgres://u@localhost/db?password=secret"] {
            let e = err(url);
            assert!(e.contains("passfile") && !e.contains("secret"), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pass");
        std::fs::write(
            &f,
            "# comment\nother:5432:db:u:no\nlocalhost:5433:db:u:no\nlocalhost:*:db:u:pa\\:ss\\\\word\n*:*:*:*:fallback\n",
        )
        .unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let url = |host: &str| format!("postgres://u@{host}/db?passfile={}", f.display());
        let pw = |host: &str| parse(&url(host)).unwrap().config.get_password().map(|p| p.to_vec());
        assert_eq!(pw("localhost"), Some(b"pa:ss\\word".to_vec()));
        assert_eq!(pw("127.0.0.1"), Some(b"fallback".to_vec()));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = err(&url("localhost"));
        assert!(e.contains("chmod 600") && !e.contains("word"), "{e}");
    }
}
