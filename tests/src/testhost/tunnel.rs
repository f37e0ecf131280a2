//! The `rental-tunnel` scenario's world inside one test host (issue 34): the platform on a
//! machine of its own, an owner's machine with no inbound path at all, and a tenant who reaches a
//! rental only through the platform's relay. The test host runs with `--network none`, so none of
//! this traffic ever leaves it.
//!
//! - **The platform's machine** ([`move_platform`]): a network namespace, [`NS`], joined to the
//!   host's root namespace by one veth pair: [`PLATFORM_ADDR`] on its side, [`HOST_ADDR`] on the
//!   host's ([`HOST_LINK`]). The host's unit `gpum-test-platform` runs there (a drop-in with
//!   `NetworkNamespacePath=`), the same binary and database, serving the API on
//!   [`PLATFORM_URL`] and the relay's tenant door (`--relay-listen`) on [`RELAY`], both with the
//!   stage's certificate, which names [`PLATFORM_ADDR`]. The namespace routes everything through
//!   the host, so a straight connection to the host or to a rental reaches the host's firewall
//!   instead of failing for want of a route. The tenant's tools run in that namespace too.
//! - **No inbound path** ([`close_inbound`], [`TABLE`]): in the host's root namespace an nftables
//!   table lets through the input hook only loopback and established/related packets, and through
//!   the forward hook nothing new that arrives on the veth (Docker's own FORWARD rules are not
//!   relied on). Each drop counts, so the scenario can show that the table, and not a missing
//!   listener or route, refused a straight connection ([`drops`]).
//! - **The tenant** ([`SESSION_SCRIPT`], [`http_get`]): `openssl s_client` for TLS to the relay,
//!   bash's builtin `printf` for `CONNECT` with `Proxy-Authorization: Basic`, then line round
//!   trips with the rental's echo server; curl (`-p -x https://…`) for HTTP. The credential is
//!   read from a 0600 file ([`write_credential`]), never given as an argument.
//! - **The rental** ([`rental_script`]): busybox `nc` as an echo server on [`ECHO_PORT`] and
//!   busybox `httpd` on [`HTTP_PORT`] serving [`BLOB`], random bytes whose SHA-256 the container
//!   prints to its log.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Host;
use super::rental::quote;

/// The platform's network namespace.
pub const NS: &str = "gpum-platform";
/// The platform's address, on its side of the veth (the stage's certificate names it).
pub const PLATFORM_ADDR: &str = "10.200.0.1";
/// The host's address on the veth.
pub const HOST_ADDR: &str = "10.200.0.2";
/// The host's end of the veth.
pub const HOST_LINK: &str = "gpv0";
/// The platform's API there: the agent's heartbeat and tunnel, and the one-liner.
pub const PLATFORM_URL: &str = "https://10.200.0.1:8443";
/// The relay's tenant door (`serve --relay-listen`).
pub const RELAY: &str = "10.200.0.1:8444";
/// The nftables table that closes every inbound path of the host.
pub const TABLE: &str = "inet gpum_test_no_inbound";
/// A listener the scenario starts on the host on every address: the one a straight connection
/// reaches while the table is absent.
pub const HOST_PROBE_PORT: u16 = 9180;
/// The rental's echo server (an ssh-like interactive session).
pub const ECHO_PORT: u16 = 2222;
/// The rental's HTTP server.
pub const HTTP_PORT: u16 = 8080;
/// The file the rental serves: its path under the server's root, and its size (over 1 MiB).
pub const BLOB: &str = "blob.bin";
pub const BLOB_BYTES: u64 = 3 * 1024 * 1024 + 17;
/// Where the tenant's files live inside the host (0700).
pub const TENANT_DIR: &str = "/root/tenant";

/// The rental's command (`sh -c`): the blob and its SHA-256 (a log line `blob <sum>`), the HTTP
/// server, the echo server (`-ll`: one `cat` per connection, for ever), then `serving`.
pub fn rental_script() -> String {
    format!(
        "mkdir -p /www && head -c {BLOB_BYTES} /dev/urandom > /www/{BLOB} \
         && echo \"blob $(sha256sum /www/{BLOB} | cut -d' ' -f1)\" \
         && httpd -p {HTTP_PORT} -h /www && {{ nc -ll -p {ECHO_PORT} -e cat & }} \
         && echo serving; sleep 86400"
    )
}

/// Makes [`NS`] and its veth, and moves the host's platform unit into it (same database, same
/// binary); returns once the platform answers at [`PLATFORM_URL`] and its relay at [`RELAY`].
/// Also starts the host's [`HOST_PROBE_PORT`] listener.
pub fn move_platform(h: &Host) -> Result<()> {
    h.sh_ok(&format!(
        r#"set -eu
ip netns add {NS}
ip link add {HOST_LINK} type veth peer name eth0 netns {NS}
ip addr add {HOST_ADDR}/24 dev {HOST_LINK} && ip link set {HOST_LINK} up
ip -n {NS} addr add {PLATFORM_ADDR}/24 dev eth0
ip -n {NS} link set lo up && ip -n {NS} link set eth0 up
ip -n {NS} route add default via {HOST_ADDR}
sysctl -qw net.ipv4.ip_forward=1
mkdir -p /srv/tunnel-probe && echo host > /srv/tunnel-probe/index.html
busybox httpd -p {HOST_PROBE_PORT} -h /srv/tunnel-probe
install -d -m 0700 {TENANT_DIR}
"#
    ))?;
    let relay_port = RELAY.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
    let dropin = format!(
        "# rental-tunnel (tests/src/testhost/tunnel.rs): the platform on a machine of its own.\n\
         [Service]\n\
         NetworkNamespacePath=/run/netns/{NS}\n\
         ExecStart=\n\
         ExecStart=/opt/gpum-e2e/bin/gpum-platform --db /var/lib/gpum-test-platform/platform.db \
         --test-clock-file /etc/gpum-test/clock serve --listen {PLATFORM_ADDR}:8443 \
         --relay-listen {PLATFORM_ADDR}:{relay_port} --tls-cert /opt/gpum-e2e/tls/cert.pem \
         --tls-key /opt/gpum-e2e/tls/key.pem --dist ${{GPUM_TEST_DIST}} --heartbeat-interval 2 \
         --public-url {PLATFORM_URL}\n"
    );
    h.write_file("/etc/systemd/system/gpum-test-platform.service.d/netns.conf", dropin.as_bytes(), 0o644)?;
    h.sh_ok("systemctl daemon-reload && systemctl restart gpum-test-platform")?;
    wait_platform(h)
}

/// Waits up to 30 s until the platform answers at [`PLATFORM_URL`] (from the host) and its relay
/// accepts TLS at [`RELAY`] (from the platform's namespace).
pub fn wait_platform(h: &Host) -> Result<()> {
    h.wait_for(
        "the platform in its namespace",
        Duration::from_secs(30),
        &format!(
            "curl -fsS -o /dev/null {PLATFORM_URL}/install.sh && \
             ip netns exec {NS} bash -c 'exec 3<>/dev/tcp/{}'",
            RELAY.replace(':', "/")
        ),
    )
}

/// Loads [`TABLE`]: no new connection into the host from anywhere but itself.
pub fn close_inbound(h: &Host) -> Result<()> {
    h.sh_ok(&format!(
        r#"nft -f - <<'EOF'
table {TABLE} {{
    chain input {{
        type filter hook input priority filter - 10; policy accept;
        iif "lo" accept
        ct state established,related accept
        counter drop
    }}
    chain forward {{
        type filter hook forward priority filter - 10; policy accept;
        iifname "{HOST_LINK}" ct state established,related accept
        iifname "{HOST_LINK}" counter drop
    }}
}}
EOF"#
    ))?;
    Ok(())
}

/// The packets [`TABLE`] dropped so far: (input, forward).
pub fn drops(h: &Host) -> Result<(u64, u64)> {
    let out = h.sh_ok(&format!("nft list table {TABLE}"))?;
    let mut counts = out.lines().filter_map(|l| {
        let l = l.trim();
        let rest = l.split("counter packets ").nth(1)?;
        if !l.ends_with("drop") {
            return None;
        }
        rest.split_whitespace().next()?.parse::<u64>().ok()
    });
    match (counts.next(), counts.next()) {
        (Some(i), Some(f)) => Ok((i, f)),
        _ => bail!("no two drop counters in {TABLE}: {out}"),
    }
}

/// Tries a TCP connection from the platform's namespace to each `addr:port` at once (3 s each);
/// returns `(addr:port, connected)`.
pub fn straight(h: &Host, targets: &[String]) -> Result<Vec<(String, bool)>> {
    let mut script = String::new();
    for (i, t) in targets.iter().enumerate() {
        let (a, p) = t.rsplit_once(':').context("addr:port")?;
        script.push_str(&format!(
            "(timeout 3 bash -c 'exec 3<>/dev/tcp/{a}/{p}' 2>/dev/null; echo \"t{i} $?\") & "
        ));
    }
    script.push_str("wait");
    let out = h.sh_ok(&format!("ip netns exec {NS} bash -c {}", quote(&script)))?;
    Ok(targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let ok = out.lines().any(|l| l.trim() == format!("t{i} 0"));
            (t.clone(), ok)
        })
        .collect())
}

/// Writes the tenant's credential for rental `id` into `TENANT_DIR/<name>` (0600): `id:credential`
/// with no newline (what `Proxy-Authorization: Basic` encodes), and `<name>.curl`, curl's `-K`
/// file with `proxy-user`. Returns the first path.
pub fn write_credential(h: &Host, name: &str, id: &str, credential: &str) -> Result<String> {
    let path = format!("{TENANT_DIR}/{name}");
    h.write_file(&path, format!("{id}:{credential}").as_bytes(), 0o600)?;
    h.write_file(&format!("{path}.curl"), format!("proxy-user = \"{id}:{credential}\"\n").as_bytes(), 0o600)?;
    Ok(path)
}

/// The tenant's interactive session, `bash SCRIPT TARGET CREDENTIAL_FILE ROUNDS [HOLD_SECS]`, run
/// in the platform's namespace: TLS to the relay (verified against the stage's CA), `CONNECT
/// TARGET`, the answer's status line (`connect: …`), then ROUNDS lines of random text, each read
/// back whole before the next (`rounds ok N`). With HOLD_SECS it then waits that long for the far
/// end to close the session (`closed`, else `still open`). Exit 0 only when all of it held.
pub const SESSION_SCRIPT: &str = r#"set -u
target=$1 cred=$2 rounds=$3 hold=${4:-0}
coproc T { exec openssl s_client -quiet -connect "$RELAY" -CAfile /opt/gpum-e2e/tls/ca.pem \
    -verify_ip "${RELAY%:*}" -verify_return_error 2>/dev/null; }
out=${T[1]} in=${T[0]}
auth=$(base64 -w0 < "$cred")
printf 'CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n' \
    "$target" "$target" "$auth" >&"$out"
unset auth
IFS= read -r -t 15 status <&"$in" || { echo "no answer to CONNECT"; exit 3; }
status=${status%$'\r'}
echo "connect: $status"
case $status in "HTTP/1.1 200"*) ;; *) exit 4 ;; esac
while IFS= read -r -t 15 l <&"$in"; do [ -z "${l%$'\r'}" ] && break; done
for i in $(seq 1 "$rounds"); do
    line="round $i $(head -c 48 /dev/urandom | base64 -w0)"
    printf '%s\n' "$line" >&"$out"
    IFS= read -r -t 10 got <&"$in" || { echo "round $i: no echo"; exit 5; }
    [ "$got" = "$line" ] || { echo "round $i: the echo differs"; exit 6; }
done
echo "rounds ok $rounds"
if [ "$hold" -gt 0 ]; then
    IFS= read -r -t "$hold" got <&"$in"; rc=$?
    if [ $rc -gt 128 ]; then echo "still open after ${hold} s"; exit 8; fi
    if [ $rc -eq 0 ]; then echo "unexpected bytes: $got"; exit 7; fi
    echo "closed"
fi
"#;

/// Where [`SESSION_SCRIPT`] is in the host.
pub const SESSION: &str = "/root/tenant/session.sh"; // under TENANT_DIR

/// Writes [`SESSION_SCRIPT`] into the host.
pub fn write_session_script(h: &Host) -> Result<()> {
    h.write_file(SESSION, format!("RELAY={RELAY}\n{SESSION_SCRIPT}").as_bytes(), 0o700)
}

/// The command line of one session (run in the platform's namespace).
pub fn session_cmd(target: &str, cred: &str, rounds: u32, hold: u32) -> String {
    format!("ip netns exec {NS} bash {SESSION} {} {} {rounds} {hold}", quote(target), quote(cred))
}

/// The tenant's HTTP GET of `http://TARGET/PATH` through the relay with curl (`-p`: `CONNECT`
/// then the request), the body into `out`: curl's exit, then `%{http_connect} %{http_code}`.
pub fn http_get(h: &Host, target: &str, path: &str, cred: &str, out: &str) -> Result<super::Run> {
    h.sh(&format!(
        "ip netns exec {NS} curl -sS -p -x https://{RELAY} --proxy-cacert /opt/gpum-e2e/tls/ca.pem \
         -K {} -o {} -w '%{{http_connect}} %{{http_code}}' --max-time 30 {}",
        quote(&format!("{cred}.curl")),
        quote(out),
        quote(&format!("http://{target}/{path}"))
    ))
}

/// Where [`start_prober`] logs its sessions, and the file whose presence keeps it going.
pub const PROBE_LOG: &str = "/root/tenant/prober.log"; // under TENANT_DIR
const PROBE_ON: &str = "/root/tenant/prober.on";

/// Starts a tenant in the background who opens one short session (one round trip) after
/// another, 300 ms apart, until [`stop_prober`]: each logged as `ok MILLIS` or `fail MILLIS`
/// (when the session ended, Unix milliseconds).
pub fn start_prober(h: &Host, target: &str, cred: &str) -> Result<()> {
    h.sh_ok(&format!("touch {PROBE_ON} && : > {PROBE_LOG}"))?;
    let each = format!(
        "while [ -e {PROBE_ON} ]; do if {} >/dev/null 2>&1; then r=ok; else r=fail; fi; \
         echo \"$r $(date +%s%3N)\" >> {PROBE_LOG}; sleep 0.3; done; echo done >> {PROBE_LOG}",
        session_cmd(target, cred, 1, 0)
    );
    h.sh_ok(&format!("setsid -f bash -c {} </dev/null >/dev/null 2>&1", quote(&each)))?;
    Ok(())
}

/// Stops [`start_prober`]'s tenant, waits for its last session (its own timeouts bound it), and
/// returns each session: whether it worked, and when it ended (Unix ms).
pub fn stop_prober(h: &Host) -> Result<Vec<(bool, u64)>> {
    h.sh_ok(&format!("rm -f {PROBE_ON}"))?;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let log = h.sh_ok(&format!("cat {PROBE_LOG}"))?;
        if log.lines().any(|l| l == "done") {
            return Ok(log
                .lines()
                .filter_map(|l| {
                    let (r, t) = l.split_once(' ')?;
                    Some((r == "ok", t.trim().parse().ok()?))
                })
                .collect());
        }
        if Instant::now() > deadline {
            bail!("the prober did not stop within 40 s: {}", log.lines().last().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A tenant's interruption in [`stop_prober`]'s log: the longest time (ms) between two working
/// sessions' ends, and how many sessions failed. `None` when fewer than two worked.
pub fn longest_gap(log: &[(bool, u64)]) -> Option<(u64, usize)> {
    let ok: Vec<u64> = log.iter().filter(|(ok, _)| *ok).map(|(_, t)| *t).collect();
    let gap = ok.windows(2).map(|w| w[1].saturating_sub(w[0])).max()?;
    Some((gap, log.iter().filter(|(ok, _)| !ok).count()))
}

/// Polls one tenant session of `rounds` round trips every 300 ms until it works, for up to
/// `secs`; returns how long that took.
pub fn wait_session(h: &Host, target: &str, cred: &str, secs: u64) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let r = h.sh(&session_cmd(target, cred, 3, 0))?;
        if r.code == 0 {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(secs) {
            bail!("no working session within {secs} s; the last: exit {}: {}", r.code, r.all().trim());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[cfg(test)]
mod tests {
    use super::longest_gap;

    #[test]
    fn the_gap_is_between_working_sessions_and_failures_are_counted() {
        let log =
            [(true, 1_000), (true, 1_400), (false, 2_000), (false, 9_000), (true, 9_500), (true, 9_900)];
        assert_eq!(longest_gap(&log), Some((8_100, 2)));
        assert_eq!(longest_gap(&[(true, 5)]), None);
        assert_eq!(longest_gap(&[(false, 5), (false, 6)]), None);
    }
}
