//! The `rental-network` scenario's made-up world inside one test host (issue 33): an owner's
//! "LAN" and an "internet", each a network namespace joined to the host by a veth pair that the
//! scenario creates, each with a tiny HTTP server (busybox `httpd`) on [`PORT`]; and the host's
//! own server on the same port. The test host runs with `--network none`, so none of this
//! traffic ever leaves it.
//!
//! - `lan`: 192.168.77.2/24 on the veth (the host's side is 192.168.77.1), plus, routed through
//!   it by the host, a cloud's metadata address 169.254.169.254, a CGNAT address 100.64.7.7, a
//!   10/8 address and a 172.16/12 address: every one is denied to a rental;
//! - `inet`: 198.51.100.7/24 (TEST-NET-2, not denied; the host's side is 198.51.100.1): allowed;
//! - the host itself, on 192.168.77.1, 198.51.100.1 and the rentals' bridge's gateway: denied.
//!
//! IPv6 is left out here: the rentals' network has no IPv6, so a rental cannot send any, with or
//! without the table (the table's IPv6 ranges are proved by `agent/src/egress.rs`'s tests).

use anyhow::Result;

use super::{Host, Run};

/// Every server's port.
pub const PORT: u16 = 8080;

/// An address a rental tries, and whether the table must drop it.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub what: &'static str,
    pub addr: &'static str,
    /// The body its server answers with (the namespace's name).
    pub answers: &'static str,
    pub denied: bool,
}

/// The addresses in the namespaces; the host's own are [`host_targets`].
pub const TARGETS: &[Target] = &[
    Target { what: "the owner's LAN (192.168/16)", addr: "192.168.77.2", answers: "lan", denied: true },
    Target { what: "a metadata address (169.254/16)", addr: "169.254.169.254", answers: "lan", denied: true },
    Target { what: "a CGNAT address (100.64/10)", addr: "100.64.7.7", answers: "lan", denied: true },
    Target { what: "a 10/8 address", addr: "10.77.0.2", answers: "lan", denied: true },
    Target { what: "a 172.16/12 address", addr: "172.31.77.2", answers: "lan", denied: true },
    Target { what: "the internet (198.51.100.0/24)", addr: "198.51.100.7", answers: "inet", denied: false },
];

/// The host's own addresses a rental must not reach: both veth ends' and `gateway` (the rentals'
/// bridge's own address).
pub fn host_targets(gateway: &str) -> Vec<(String, &'static str)> {
    vec![
        ("192.168.77.1".to_string(), "the host on its LAN address"),
        ("198.51.100.1".to_string(), "the host on its internet address"),
        (gateway.to_string(), "the host on the rentals' bridge"),
    ]
}

/// Creates both namespaces, their links, addresses and routes, and the three servers.
/// Idempotent enough for one run: it fails if they exist.
pub fn build(h: &Host) -> Result<()> {
    let script = format!(
        r#"set -eu
for ns in lan inet; do ip netns add $ns; done
ip link add lan0 type veth peer name eth0 netns lan
ip link add wan0 type veth peer name eth0 netns inet
ip addr add 192.168.77.1/24 dev lan0 && ip link set lan0 up
ip addr add 198.51.100.1/24 dev wan0 && ip link set wan0 up
ip -n lan addr add 192.168.77.2/24 dev eth0
for a in 169.254.169.254 100.64.7.7 10.77.0.2 172.31.77.2; do
  ip -n lan addr add $a/32 dev eth0
  ip route add $a/32 via 192.168.77.2 dev lan0
done
ip -n inet addr add 198.51.100.7/24 dev eth0
for ns in lan inet; do
  ip -n $ns link set lo up && ip -n $ns link set eth0 up
done
ip -n lan route add default via 192.168.77.1
ip -n inet route add default via 198.51.100.1
sysctl -qw net.ipv4.ip_forward=1
for w in lan inet host; do mkdir -p /srv/$w && echo $w > /srv/$w/index.html; done
ip netns exec lan busybox httpd -p {PORT} -h /srv/lan
ip netns exec inet busybox httpd -p {PORT} -h /srv/inet
busybox httpd -p {PORT} -h /srv/host
"#
    );
    h.sh_ok(&script)?;
    Ok(())
}

/// From inside container `name` (with busybox's `wget`): an HTTP GET of `addr`, a short timeout.
pub fn fetch(h: &Host, name: &str, addr: &str) -> Result<Run> {
    h.sh(&format!("docker exec {name} wget -q -T 3 -O - http://{addr}:{PORT}/"))
}

/// The same GET from a throwaway container of `image` on Docker's default bridge, which the
/// table does not match: proves that the world answers, so that a refusal from a rental is the
/// table's.
pub fn fetch_from_default_bridge(h: &Host, image: &str, addr: &str) -> Result<Run> {
    h.sh(&format!("docker run --rm --network bridge {image} wget -q -T 3 -O - http://{addr}:{PORT}/"))
}
