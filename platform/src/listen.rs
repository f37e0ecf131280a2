//! The accept loop: connections, TLS, timeouts and the connection cap.
//!
//! The platform faces the internet (or a TLS terminator that does), so a client must not be able
//! to hold its resources by being slow (issue 14, item 6):
//! - **A connection cap.** At most [`Transport::max_connections`] connections are open at once;
//!   past it the loop stops accepting and new connections wait in the kernel's backlog until one
//!   closes. The cap is also kept below the process's file-descriptor limit (raised to its hard
//!   limit at start, [`raise_nofile_limit`]), so `accept` never fails with "Too many open files".
//! - **A header timeout.** A connection that has not sent a complete request head within
//!   [`Transport::header_timeout`] (hyper's `header_read_timeout`, which also bounds how long an
//!   idle keep-alive connection is kept) is closed; so is a TLS handshake that takes longer.
//! - **A body timeout** is enforced where bodies are read (`server::read_body`).
//!
//! Only HTTP/1.1 is served (ALPN `http/1.1` under TLS): it has the header timeout, and an agent
//! uses one connection at a time anyway.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// File descriptors kept free for everything but client connections (the database and its
/// WAL, downloads being served, logs).
const FD_RESERVE: u64 = 64;

/// How long connections get to finish after a shutdown signal.
const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy)]
pub struct Transport {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 1024,
    }
}

/// The connection cap: the one asked for, but never more than the descriptors allow.
pub fn effective_max_connections(asked: usize, nofile: u64) -> usize {
    let allowed = nofile.saturating_sub(FD_RESERVE).max(1);
    asked.min(usize::try_from(allowed).unwrap_or(usize::MAX)).max(1)
}

/// Serves `app` on `listener` until `shutdown` completes, then gives open connections
/// [`GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    t: Transport,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(t.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(t.header_timeout).max_buf_size(64 * 1024);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        // A slot first: at the cap, connections wait in the backlog instead of being accepted.
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // ECONNABORTED and the like concern one connection; anything else (EMFILE)
                    // gets a pause so the loop does not spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let builder = builder.clone();
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_one(stream, &builder, app, watcher).await,
                Some(acceptor) => {
                    match tokio::time::timeout(t.header_timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => serve_one(s, &builder, app, watcher).await,
                        Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(GRACE, graceful.shutdown()).await.is_err() {
        tracing::info!("connections still open after {GRACE:?}; closing them");
    }
    Ok(())
}

async fn serve_one<I>(
    io: I,
    builder: &http1::Builder,
    app: Router,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("connection: {e}");
    }
}

/// The rustls server configuration from a PEM certificate chain and key, HTTP/1.1 only.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("read the certificate chain {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("read the private key {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the TLS certificate and key do not form a valid pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_descriptor_limit() {
        assert_eq!(effective_max_connections(1024, 20_000), 1024);
        assert_eq!(effective_max_connections(1024, 256), 192);
        assert_eq!(effective_max_connections(1024, 10), 1);
        assert_eq!(effective_max_connections(0, 10_000), 1);
    }
}
