//! The relay mesh (issue 44, item 3): a tenant reaches a rental through any replica.
//!
//! A node's agent keeps one tunnel, to whichever replica the load balancer gave it. That replica
//! records itself as the node's **home** (`tunnel_homes`, written at attach, removed at detach,
//! overwritten by the replica the agent lands on next), and every replica records that it is
//! alive and where its peers reach it (`replicas`: its peer address, refreshed every
//! [`ALIVE_EVERY`]; a replica not seen for [`ALIVE_WINDOW`] is ignored). A replica whose door
//! gets a tenant's `CONNECT` or HTTP request for a node whose tunnel it does not hold checks the
//! tenant as always (the throttle, the credential, the rental, the port), then **forwards the
//! stream** to the home over a peer connection: the design of Tailscale's DERP mesh, where a
//! server forwards a packet to the server its destination is connected to.
//!
//! **The peer request** (`serve --peer-listen ADDR`, advertised as `--peer-addr HOST:PORT`): a
//! TCP connection whose first line is a [`PeerOpen`] (JSON), proved by an HMAC-SHA256 with the
//! mesh's secret (`--peer-secret-file`, 0600, never argv) over the rental, the port, the node,
//! the time and a nonce. The home refuses a wrong proof, one more than [`MAX_SKEW`] from its
//! clock, or a nonce it has seen; it then re-checks that the rental runs on that node and lists
//! the port, takes a slot under the same stream caps as its own doors, opens the stream in the
//! node's tunnel and answers one [`PeerReply`] line: the agent's yes, or why not (with the
//! status its own door would give). Then bytes flow both ways until either end closes, the
//! rental ends (the effects reach every replica: both ends close) or the stream idles.
//!
//! Fail closed: without `--peer-secret-file` a replica neither forwards nor listens, and a node
//! whose tunnel is elsewhere is 502 as before the mesh. The peer connection is plain TCP: the
//! peer network must be private to the platform's replicas (as its database network is).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::StatusCode;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::db::Db;
use crate::params;
use crate::rentals::Unreachable;
use crate::sql::OptionalExtension;
use gpum_protocol::limits;
use gpum_protocol::tunnel::read_line;
pub use gpum_protocol::{PeerOpen, PeerReply};

use super::{AgentStream, Refused, Tenants};

/// How often a replica marks itself alive in `replicas`.
pub const ALIVE_EVERY: Duration = Duration::from_secs(5);
/// A replica not marked alive for this long is taken for dead: its homes are ignored.
pub const ALIVE_WINDOW: Duration = Duration::from_secs(15);
/// Seconds after which a replica not seen is deleted from `replicas`, with its homes.
const FORGET_AFTER: i64 = 86_400;
/// How far a peer request's time may be from the home's clock.
pub const MAX_SKEW: u64 = 30;

/// This replica's place in the mesh.
pub struct Mesh {
    /// Random, made at start: a restarted replica is a new one.
    pub replica_id: String,
    /// Where the other replicas reach this one's peer listener.
    pub peer_addr: String,
    key: Vec<u8>,
    db: Db,
    /// Nonces seen within [`MAX_SKEW`]: a request is used once.
    seen: Mutex<HashMap<String, u64>>,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(msg).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn sign(key: &[u8], rental: &str, port: u16, node: &str, at: u64) -> PeerOpen {
    let mut o = PeerOpen {
        rental: rental.into(),
        port,
        node: node.into(),
        at,
        nonce: hex(&rand::random::<[u8; 16]>()),
        mac: String::new(),
    };
    o.mac = hex(&hmac(key, o.signed().as_bytes()));
    o
}

/// Whether `o` is proved by `key`, within [`MAX_SKEW`] of `now`, with a nonce not in `seen`
/// (which it then joins).
fn verify(key: &[u8], seen: &Mutex<HashMap<String, u64>>, o: &PeerOpen, now: u64) -> bool {
    let mac = hex(&hmac(key, o.signed().as_bytes()));
    if !same(mac.as_bytes(), o.mac.as_bytes()) || now.abs_diff(o.at) > MAX_SKEW {
        return false;
    }
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    seen.retain(|_, at| now.abs_diff(*at) <= MAX_SKEW);
    seen.insert(o.nonce.clone(), o.at).is_none()
}

impl Mesh {
    /// `secret` is the peer secret file's content (trimmed); at least 32 characters.
    pub fn new(db: Db, peer_addr: String, secret: &str) -> Result<Mesh, String> {
        let secret = secret.trim();
        if secret.len() < 32 {
            return Err("the peer secret is shorter than 32 characters".into());
        }
        Ok(Mesh {
            replica_id: format!("replica-{}", hex(&rand::random::<[u8; 8]>())),
            peer_addr,
            key: secret.as_bytes().to_vec(),
            db,
            seen: Mutex::default(),
        })
    }

    fn sign(&self, rental: &str, port: u16, node: &str) -> PeerOpen {
        sign(&self.key, rental, port, node, unix_now())
    }

    /// Whether `o` is proved by the mesh's secret, timely and new (its nonce is then spent).
    fn verify(&self, o: &PeerOpen, now: u64) -> bool {
        verify(&self.key, &self.seen, o, now)
    }

    /// Marks this replica alive every [`ALIVE_EVERY`], for ever.
    pub async fn keep_alive(self: Arc<Self>) {
        loop {
            let (id, addr, now) = (self.replica_id.clone(), self.peer_addr.clone(), unix_now() as i64);
            let r = self
                .db
                .call(move |c| {
                    c.execute(
                        "INSERT INTO replicas (id, peer_addr, seen_at) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (id) DO UPDATE SET peer_addr = excluded.peer_addr, seen_at = excluded.seen_at",
                        params![id, addr, now],
                    )?;
                    // Replicas gone for a day, and the homes they left, are forgotten.
                    c.execute("DELETE FROM replicas WHERE seen_at < ?1", params![now - FORGET_AFTER])?;
                    c.execute(
                        "DELETE FROM tunnel_homes WHERE replica_id NOT IN (SELECT id FROM replicas)",
                        [],
                    )?;
                    Ok(())
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "mesh: could not mark this replica alive");
            }
            tokio::time::sleep(ALIVE_EVERY).await;
        }
    }

    /// Records this replica as node `node_id`'s home (its tunnel attached here).
    pub async fn home(&self, node_id: &str) {
        let (node, id, now) = (node_id.to_string(), self.replica_id.clone(), unix_now() as i64);
        let r = self
            .db
            .call(move |c| {
                c.execute(
                    "INSERT INTO tunnel_homes (node_id, replica_id, since) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (node_id) DO UPDATE SET replica_id = excluded.replica_id, since = excluded.since",
                    params![node, id, now],
                )?;
                Ok(())
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(node = %node_id, error = %e, "mesh: could not record the tunnel's home");
        }
    }

    /// Forgets node `node_id`'s home if it is still this replica (its tunnel detached here).
    pub async fn left(&self, node_id: &str) {
        let (node, id) = (node_id.to_string(), self.replica_id.clone());
        let r = self
            .db
            .call(move |c| {
                c.execute(
                    "DELETE FROM tunnel_homes WHERE node_id = ?1 AND replica_id = ?2",
                    params![node, id],
                )?;
                Ok(())
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(node = %node_id, error = %e, "mesh: could not forget the tunnel's home");
        }
    }

    /// The peer address of the live replica, other than this one, that holds node `node_id`'s
    /// tunnel.
    async fn holder(&self, node_id: &str) -> Option<String> {
        let (node, me) = (node_id.to_string(), self.replica_id.clone());
        let alive_since = unix_now().saturating_sub(ALIVE_WINDOW.as_secs()) as i64;
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    "SELECT r.peer_addr FROM tunnel_homes h JOIN replicas r ON r.id = h.replica_id \
                     WHERE h.node_id = ?1 AND r.id <> ?2 AND r.seen_at >= ?3",
                    params![node, me, alive_since],
                    |r| r.get::<_, String>(0),
                )
                .optional()?)
            })
            .await
            .ok()
            .flatten()
    }

    /// The stream to rental `id`'s `port` through the replica that holds node `node_id`'s
    /// tunnel, its yes read; 502 when no live replica holds it.
    pub(crate) async fn forward(&self, node_id: &str, id: &str, port: u16) -> Result<AgentStream, Refused> {
        let no_tunnel = || {
            Refused::Answer(
                StatusCode::BAD_GATEWAY,
                "the rental's server has no tunnel to the platform now".into(),
            )
        };
        let addr = self.holder(node_id).await.ok_or_else(no_tunnel)?;
        let talk = async {
            let tcp = TcpStream::connect(&addr).await.ok()?;
            let _ = tcp.set_nodelay(true);
            let mut s =
                BufReader::with_capacity(limits::MAX_TUNNEL_LINE, tokio_util::either::Either::Right(tcp));
            let mut line = serde_json::to_vec(&self.sign(id, port, node_id)).expect("plain JSON");
            line.push(b'\n');
            s.write_all(&line).await.ok()?;
            s.flush().await.ok()?;
            let reply = read_line(&mut s).await.ok()?;
            Some((s, serde_json::from_slice::<PeerReply>(&reply).ok()?))
        };
        match tokio::time::timeout(super::OPEN_TIMEOUT, talk).await {
            Ok(Some((s, PeerReply { ok: true, .. }))) => Ok(s),
            Ok(Some((_, PeerReply { status, reason, .. }))) => {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                let why: String =
                    reason.unwrap_or_default().chars().filter(|c| !c.is_control()).take(200).collect();
                Err(Refused::Answer(status, why))
            }
            _ => {
                tracing::info!(node = %node_id, peer = %addr, "mesh: the replica that holds the tunnel did not answer");
                Err(no_tunnel())
            }
        }
    }
}

/// Serves the other replicas' peer requests on `listener` until `shutdown` completes.
pub async fn serve_peers(
    listener: TcpListener,
    t: Arc<Tenants>,
    mesh: Arc<Mesh>,
    shutdown: impl Future<Output = ()>,
) {
    let limit = Arc::new(tokio::sync::Semaphore::new(t.relay.cfg.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            r = listener.accept() => match r {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "mesh: accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "mesh: the peer listener holds its limit of connections");
            continue;
        };
        let (t, mesh) = (t.clone(), mesh.clone());
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            serve_peer(stream, t, mesh).await;
            drop(permit);
        });
    }
}

async fn reply<W: AsyncWrite + Unpin>(w: &mut W, r: &PeerReply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("plain JSON");
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await
}

fn refused(status: StatusCode, why: &str) -> PeerReply {
    PeerReply { ok: false, status: status.as_u16(), reason: Some(why.to_string()) }
}

/// One peer request: the proof, the rental, the caps, the agent's yes; then the bytes.
async fn serve_peer<S>(stream: S, t: Arc<Tenants>, mesh: Arc<Mesh>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut s = BufReader::with_capacity(limits::MAX_TUNNEL_LINE, stream);
    let line = match tokio::time::timeout(t.relay.cfg.header_timeout, read_line(&mut s)).await {
        Ok(Ok(l)) => l,
        _ => return,
    };
    let Ok(open) = serde_json::from_slice::<PeerOpen>(&line) else {
        let _ = reply(&mut s, &refused(StatusCode::BAD_REQUEST, "not a peer request")).await;
        return;
    };
    if !mesh.verify(&open, unix_now()) {
        tracing::warn!(rental = %open.rental, "mesh: a peer request without a valid proof was refused");
        let _ = reply(&mut s, &refused(StatusCode::FORBIDDEN, "the peer request's proof is not valid")).await;
        return;
    }
    let (now, id) = (t.clock.now(), open.rental.clone());
    let found = t.db.call(move |c| Ok(crate::rentals::live(c, now, &id))).await;
    let answer = match found {
        Ok(Ok(r)) if r.node_id != open.node => {
            Err(refused(StatusCode::NOT_FOUND, "the rental is on another server"))
        }
        Ok(Ok(r)) if !r.ports.contains(&open.port) => {
            Err(refused(StatusCode::FORBIDDEN, "the rental does not expose that port"))
        }
        Ok(Ok(_)) => Ok(()),
        Ok(Err(Unreachable::Ended | Unreachable::WrongCredential)) => {
            Err(refused(StatusCode::NOT_FOUND, "the rental has ended"))
        }
        Err(_) => Err(refused(StatusCode::SERVICE_UNAVAILABLE, "the platform could not look the rental up")),
    };
    let opened = match answer {
        Ok(()) => super::open_local(&t.relay, &open.node, &open.rental, open.port).await,
        Err(r) => Err(r),
    };
    let (agent, slot) = match opened {
        Ok(v) => v,
        Err(r) => {
            let _ = reply(&mut s, &r).await;
            return;
        }
    };
    if reply(&mut s, &PeerReply { ok: true, status: 200, reason: None }).await.is_err() {
        return;
    }
    tokio::select! {
        () = super::splice(s, agent, slot.bucket.clone(), t.relay.cfg.idle_timeout) => {}
        () = slot.cancel.cancelled() => tracing::debug!(rental = %open.rental, "mesh: stream closed, the rental ended"),
    }
    drop(slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test case 2.
    #[test]
    fn hmac_is_rfc_4231s() {
        assert_eq!(
            hex(&hmac(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// A peer request opens a stream only with the mesh's secret, near the home's clock, once;
    /// and what it names cannot be changed under its proof.
    #[test]
    fn a_peer_request_needs_the_secret_the_time_and_a_new_nonce() {
        let (key, other) =
            (b"0123456789abcdef0123456789abcdef".as_slice(), b"another secret of 32 characters!".as_slice());
        let seen = Mutex::default();
        let now = 1_000_000;
        let o = sign(key, "rent-00112233445566aa", 7000, "node-1", now);
        assert!(!verify(other, &seen, &o, now), "another secret");
        assert!(!verify(key, &seen, &o, now + MAX_SKEW + 1), "too late");
        assert!(!verify(key, &seen, &o, now - MAX_SKEW - 1), "too early");
        for changed in [
            PeerOpen { port: 22, ..sign(key, "rent-00112233445566aa", 7000, "node-1", now) },
            PeerOpen {
                rental: "rent-ffffffffffffffff".into(),
                ..sign(key, "rent-00112233445566aa", 7000, "node-1", now)
            },
            PeerOpen { node: "node-2".into(), ..sign(key, "rent-00112233445566aa", 7000, "node-1", now) },
        ] {
            assert!(!verify(key, &seen, &changed, now), "{changed:?}");
        }
        assert!(verify(key, &seen, &o, now + 3), "the right one");
        assert!(!verify(key, &seen, &o, now + 4), "replayed");
        assert!(
            verify(key, &seen, &sign(key, "rent-00112233445566aa", 7000, "node-1", now), now),
            "a new nonce"
        );
    }
}
