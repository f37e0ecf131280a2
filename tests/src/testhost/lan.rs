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
//! - the host itself, on 192.168.77.1, 198.51.100.1 and the container's bridge's gateway: denied.
//!
//! IPv6 is left out here: the rentals' network has no IPv6, so a rental cannot send any, with or
//! without the table (the table's IPv6 ranges are proved by `agent/src/egress.rs`'s tests).

use anyhow::Result;

use super::Host;

/// Every server's port.
pub const PORT: u16 = 8080;

/// An address a container tries, and whether the table must drop it for a rental.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub what: &'static str,
    /// An address, or `$gw`: the container's own default gateway (the host on that bridge).
    pub addr: &'static str,
    /// The body its server answers with (the namespace's name, or `host`).
    pub answers: &'static str,
    pub denied: bool,
}

/// Every address tried: the namespaces' and the host's own.
pub const TARGETS: &[Target] = &[
    Target { what: "the owner's LAN (192.168/16)", addr: "192.168.77.2", answers: "lan", denied: true },
    Target { what: "a metadata address (169.254/16)", addr: "169.254.169.254", answers: "lan", denied: true },
    Target { what: "a CGNAT address (100.64/10)", addr: "100.64.7.7", answers: "lan", denied: true },
    Target { what: "a 10/8 address", addr: "10.77.0.2", answers: "lan", denied: true },
    Target { what: "a 172.16/12 address", addr: "172.31.77.2", answers: "lan", denied: true },
    Target { what: "the host on its LAN address", addr: "192.168.77.1", answers: "host", denied: true },
    Target { what: "the host on its internet address", addr: "198.51.100.1", answers: "host", denied: true },
    Target { what: "the host on the container's own bridge", addr: "$gw", answers: "host", denied: true },
    Target { what: "the internet (198.51.100.0/24)", addr: "198.51.100.7", answers: "inet", denied: false },
];

/// The marker a probe script prints once every GET has ended.
pub const DONE: &str = "probes done";

/// A container's command (`sh -c`) that GETs every [`TARGETS`] address at once (a denied one
/// waits out its 3 s timeout), prints one line per address, `probe <i> rc=<nc's exit> body=<the
/// answer's last line>`, then [`DONE`], and stays up. The probes run as the container's own
/// processes, not through `docker exec`, and with busybox `nc` (busybox-static's `wget` crashes
/// in a root without NSS libraries).
pub fn probe_script() -> String {
    let mut s = String::from("gw=$(ip route | awk '/^default/ {print $3}'); echo \"gateway $gw\"; ");
    for (i, t) in TARGETS.iter().enumerate() {
        s.push_str(&format!(
            "(b=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | timeout 6 nc -w 3 {} {PORT} 2>&1); rc=$?; \
             echo \"probe {i} rc=$rc body=$(echo \"$b\" | tail -n 1)\") & ",
            t.addr
        ));
    }
    s.push_str(&format!("wait; echo '{DONE}'; sleep 86400"));
    s
}

/// What a probe script printed for each target: `(target, Some((wget's exit, body)))`, or `None`
/// where no line says (the probe did not run: never a pass).
pub fn results(logs: &str) -> Vec<(Target, Option<(i32, String)>)> {
    TARGETS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let prefix = format!("probe {i} rc=");
            let r = logs.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|rest| {
                let (rc, body) = rest.split_once(" body=")?;
                Some((rc.trim().parse().ok()?, body.trim().to_string()))
            });
            (*t, r)
        })
        .collect()
}

/// Waits up to 30 s for container `name`'s probe script to finish; returns its logs.
pub fn wait_probes(h: &Host, name: &str) -> Result<String> {
    let start = std::time::Instant::now();
    loop {
        let logs = h.sh(&format!("docker logs {name} 2>&1"))?.stdout;
        if logs.contains(DONE) {
            return Ok(logs);
        }
        if start.elapsed() > std::time::Duration::from_secs(30) {
            anyhow::bail!("{name}'s probes did not finish within 30 s: {logs}");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// Creates both namespaces, their links, addresses and routes, and the three servers.
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
