//! The baseline of `cargo xtask bench platform`: the least a heartbeat endpoint can do, served
//! by the platform's own accept loop (`listen::serve`: HTTP/1.1, the same header timeout and
//! TLS configuration), so that the ratio of the two servers' CPU per heartbeat is the cost of
//! what the platform adds (authentication, the database, durability), not of the transport.
//!
//! `POST /api/v1/heartbeat` takes a bearer token (not checked against anything), parses the
//! body as a `HeartbeatRequest` and answers a fixed `HeartbeatResponse`.
//!
//! - `bench_baseline serve [--tls-cert F --tls-key F]`: listens on a free loopback port and
//!   prints `listening on URL` first.
//! - `bench_baseline cert DIR`: writes `ca.pem`, and `cert.pem` and `key.pem` for 127.0.0.1
//!   signed by it, which both servers of the TLS run use.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use gpum_platform::listen::{Transport, serve, tls_config};
use gpum_protocol::{HeartbeatRequest, HeartbeatResponse, PATH_HEARTBEAT};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cert") => cert(args.get(1).context("bench_baseline cert DIR")?),
        Some("serve") => {
            let tls = match (flag(&args, "--tls-cert"), flag(&args, "--tls-key")) {
                (Some(c), Some(k)) => Some(tls_config(c.as_ref(), k.as_ref())?),
                (None, None) => None,
                _ => bail!("give both --tls-cert and --tls-key, or neither"),
            };
            // The same runtime shape as `gpum-platform serve`.
            tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(tls))
        }
        _ => bail!("usage: bench_baseline serve [--tls-cert F --tls-key F] | cert DIR"),
    }
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

async fn run(tls: Option<tokio_rustls::TlsAcceptor>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    println!("listening on {}://{addr}", if tls.is_some() { "https" } else { "http" });
    let app = Router::new().route(PATH_HEARTBEAT, post(heartbeat));
    let t = Transport::new(Duration::from_secs(30), 10_000);
    serve(listener, tls, app, t, std::future::pending()).await?;
    Ok(())
}

async fn heartbeat(headers: HeaderMap, body: Bytes) -> Response {
    let authed = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.strip_prefix("Bearer ").is_some_and(|t| !t.is_empty()));
    if !authed {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Ok(req) = serde_json::from_slice::<HeartbeatRequest>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let resp = HeartbeatResponse {
        heartbeat_interval_secs: 10,
        commands: Vec::new(),
        known_containers: Vec::new(),
        probe_image: None,
        send_inventory: req.inventory.is_none() && req.inventory_hash.is_empty(),
        rentals: Vec::new(),
        upgrade: None,
    };
    axum::Json(resp).into_response()
}

/// A throwaway CA (`ca.pem`, which the load generator trusts) and a server certificate it signed
/// for 127.0.0.1 (`cert.pem`, `key.pem`), as the end-to-end suites make them.
fn cert(dir: &str) -> Result<()> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gpum bench CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(format!("{dir}/ca.pem"), ca.pem())?;
    std::fs::write(format!("{dir}/cert.pem"), cert.pem())?;
    std::fs::write(format!("{dir}/key.pem"), key.serialize_pem())?;
    Ok(())
}
