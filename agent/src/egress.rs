//! The rentals' egress table (issue 33): a rental reaches the internet and nothing else of the
//! owner's.
//!
//! gpum owns one nftables table, [`FAMILY`] [`TABLE`], and no other rule anywhere: not Docker's
//! chains (Docker 29 on nftables has no `DOCKER-USER` chain, and dockerd rewrites its own tables
//! when it restarts), not the owner's. Its two base chains match only traffic that comes in
//! through the rentals' bridge ([`BRIDGE_NAME`], the host side of the `gpum-rentals` network):
//! - `forward`: drops what a rental sends to the private, CGNAT, link-local, loopback, reserved
//!   and multicast ranges ([`DENIED_V4`], [`DENIED_V6`]) and every broadcast or multicast frame,
//!   so the owner's LAN, a cloud's metadata address (169.254.169.254), other Docker networks
//!   (172.16/12, 192.168/16) and the carrier's CGNAT peers are out of reach;
//! - `input`: drops everything a rental sends to the host itself (any of its addresses, on any
//!   interface: the kernel delivers them all through `input`), except replies to what the host
//!   started (`ct state established,related`).
//!
//! Both chains accept everything else (`policy accept`): the table adds drops, it never opens
//! anything, and traffic that is not a rental's never matches it. A drop in any base chain is
//! final, whatever Docker's own chains accept.
//!
//! [`ruleset`] is the whole table as `nft -f` reads it, a pure function: it creates the table
//! (so a missing one can be deleted), deletes it and creates it again, in one transaction, so
//! no moment exists with half a table, and a table someone changed is replaced whole.
//! [`verify_listing`] reads `nft -j list table` and checks what the kernel holds, not what was
//! sent: every denied range is covered by a drop rule on the bridge in a `forward`-hook chain
//! that accepts nothing, and the `input`-hook chain is exactly "replies pass, the rest drops".
//! nft prints an anonymous set as it stored it (adjacent ranges merged: 224/4 and 240/4 come
//! back as 224/3), so coverage is checked, not text.
//!
//! [`ensure`] verifies, and applies and verifies again when that fails. The rentals' runner
//! calls it before it starts anything (`docker::rental`: no rental starts unless the table is
//! verified in place; a rental is reported `failed` with [`Refusal::reason`] otherwise), and the
//! agent at its start: that is how the table comes back after a reboot or `nft flush ruleset`.
//! dockerd never touches a table that is not its own, so its restarts leave this one as it is
//! (the `rental-network` test host scenario proves both). `uninstall` removes it ([`remove`]).
//!
//! Every `nft` runs through the [`Host`] seam, with the ruleset on stdin. `nft` missing is
//! its own refusal: the owner installs `nftables`.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use gpum_host::{Cmd, Host};
use serde_json::Value;

pub use crate::docker::rental::BRIDGE_NAME;

/// The table's family: one table for IPv4 and IPv6.
pub const FAMILY: &str = "inet";
/// The table gpum owns, and the only one it ever changes.
pub const TABLE: &str = "gpum_rentals";
/// The program that changes and lists it.
pub const NFT: &str = "nft";

/// IPv4 destinations a rental never reaches: "this network", private (RFC 1918), CGNAT
/// (RFC 6598), loopback, link-local (a cloud's metadata address among them), multicast and the
/// reserved range with the limited broadcast address.
pub const DENIED_V4: [&str; 9] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
/// IPv6 destinations a rental never reaches: unspecified, loopback, IPv4-mapped, unique local
/// (RFC 4193), link-local and multicast.
pub const DENIED_V6: [&str; 6] = ["::/128", "::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8"];

/// The whole table as `nft -f -` reads it: one transaction that creates the table if it is
/// missing, deletes it, and creates it anew. Pure.
pub fn ruleset() -> String {
    let v4 = DENIED_V4.join(", ");
    let v6 = DENIED_V6.join(", ");
    let bridge = BRIDGE_NAME;
    format!(
        "# gpum: the rentals' egress table (gpum-agent writes it; docs/agent.md).\n\
         table {FAMILY} {TABLE}\n\
         delete table {FAMILY} {TABLE}\n\
         table {FAMILY} {TABLE} {{\n\
         \tchain forward {{\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\tiifname \"{bridge}\" ip daddr {{ {v4} }} counter drop\n\
         \t\tiifname \"{bridge}\" ip6 daddr {{ {v6} }} counter drop\n\
         \t\tiifname \"{bridge}\" meta pkttype {{ broadcast, multicast }} counter drop\n\
         \t}}\n\
         \tchain input {{\n\
         \t\ttype filter hook input priority filter; policy accept;\n\
         \t\tiifname \"{bridge}\" ct state established,related accept\n\
         \t\tiifname \"{bridge}\" counter drop\n\
         \t}}\n\
         }}\n"
    )
}

/// What removes the table, as `nft -f -` reads it (absent or not, it is gone after).
fn removal() -> String {
    format!("table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n")
}

/// An IP range: family, first and last address (IPv4 in the low 32 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    v6: bool,
    first: u128,
    last: u128,
}

impl Range {
    fn prefix(addr: &str, len: u32) -> Option<Range> {
        let (v6, bits, width) = match addr.parse::<IpAddr>().ok()? {
            IpAddr::V4(a) => (false, u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (true, u128::from(a), 128),
        };
        if len > width {
            return None;
        }
        let host = if len == width { 0 } else { (u128::MAX >> (128 - width)) >> len };
        Some(Range { v6, first: bits & !host, last: (bits & !host) | host })
    }

    fn parse_cidr(s: &str) -> Option<Range> {
        let (a, l) = s.split_once('/')?;
        Range::prefix(a, l.parse().ok()?)
    }

    fn single(addr: &str) -> Option<Range> {
        let r = Range::prefix(addr, 0)?;
        Range::prefix(addr, if r.v6 { 128 } else { 32 })
    }

    fn covers(&self, o: &Range) -> bool {
        self.v6 == o.v6 && self.first <= o.first && o.last <= self.last
    }

    /// One element of a listed match's right side: an address, `{"prefix": …}` or `{"range": …}`.
    fn from_json(v: &Value) -> Option<Range> {
        if let Some(s) = v.as_str() {
            return Range::single(s);
        }
        if let Some(p) = v.get("prefix") {
            return Range::prefix(p.get("addr")?.as_str()?, u32::try_from(p.get("len")?.as_u64()?).ok()?);
        }
        let r = v.get("range")?.as_array()?;
        let (a, b) = (Range::single(r.first()?.as_str()?)?, Range::single(r.get(1)?.as_str()?)?);
        (a.v6 == b.v6).then_some(Range { v6: a.v6, first: a.first, last: b.last })
    }
}

/// One listed rule, reduced to what the check needs.
#[derive(Debug, Default)]
struct Rule {
    /// `iifname == BRIDGE_NAME` is one of its matches.
    on_bridge: bool,
    /// The ranges of its `ip daddr` / `ip6 daddr` match.
    daddr: Vec<Range>,
    /// Its `meta pkttype` match's values.
    pkttype: Vec<String>,
    /// Its `ct state` match's values.
    ct_state: Vec<String>,
    /// Matches of anything else (which would narrow it).
    other_matches: usize,
    /// `drop`, `accept`, `jump`, … (`counter` is not one).
    verdict: Option<String>,
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
        Value::Object(o) => o.get("set").map(strings).unwrap_or_default(),
        _ => vec![],
    }
}

fn rule_of(exprs: &[Value]) -> Rule {
    let mut r = Rule::default();
    for e in exprs {
        let Some(obj) = e.as_object() else {
            r.other_matches += 1;
            continue;
        };
        if let Some(m) = obj.get("match") {
            let (op, left, right) = (m.get("op").and_then(Value::as_str), &m["left"], &m["right"]);
            let eq = matches!(op, Some("==") | Some("in"));
            if eq && left["meta"]["key"] == "iifname" && right == BRIDGE_NAME {
                r.on_bridge = true;
            } else if eq && left["payload"]["field"] == "daddr" {
                let elems = right
                    .get("set")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_else(|| vec![right.clone()]);
                let ranges: Option<Vec<Range>> = elems.iter().map(Range::from_json).collect();
                match ranges {
                    Some(rs) => r.daddr.extend(rs),
                    None => r.other_matches += 1,
                }
            } else if eq && left["meta"]["key"] == "pkttype" {
                r.pkttype = strings(right);
            } else if eq && left["ct"]["key"] == "state" {
                r.ct_state = strings(right);
            } else {
                r.other_matches += 1;
            }
        } else if obj.contains_key("counter") {
        } else if let Some(k) = obj.keys().next() {
            r.verdict = Some(k.clone());
        }
    }
    r
}

/// A base chain as listed: its hook and its rules, in order.
#[derive(Debug, Default)]
struct Chain {
    hook: Option<String>,
    typ: Option<String>,
    policy: Option<String>,
    rules: Vec<Rule>,
}

/// Checks `nft -j list table inet gpum_rentals`'s output: `Ok` when what the kernel holds drops
/// every denied range and the host's own addresses for traffic from the rentals' bridge, and
/// lets nothing of it through before. `Err` says what is missing. Pure.
pub fn verify_listing(json: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("nft's listing is not JSON: {e}"))?;
    let items = v["nftables"].as_array().ok_or("nft's listing has no \"nftables\" array")?;
    let ours = |o: &Value| o["family"] == FAMILY && o["table"] == TABLE;
    if !items.iter().any(|i| i["table"]["family"] == FAMILY && i["table"]["name"] == TABLE) {
        return Err(format!("table {FAMILY} {TABLE} is missing"));
    }
    let mut chains: std::collections::BTreeMap<String, Chain> = Default::default();
    for i in items {
        if let Some(c) = i.get("chain").filter(|c| ours(c)) {
            let e = chains.entry(c["name"].as_str().unwrap_or_default().to_string()).or_default();
            e.hook = c["hook"].as_str().map(str::to_string);
            e.typ = c["type"].as_str().map(str::to_string);
            e.policy = c["policy"].as_str().map(str::to_string);
        } else if let Some(r) = i.get("rule").filter(|r| ours(r)) {
            let exprs = r["expr"].as_array().map(Vec::as_slice).unwrap_or_default();
            chains
                .entry(r["chain"].as_str().unwrap_or_default().to_string())
                .or_default()
                .rules
                .push(rule_of(exprs));
        }
    }
    let base = |hook: &str| {
        chains.values().find(|c| c.hook.as_deref() == Some(hook) && c.typ.as_deref() == Some("filter"))
    };

    let fwd = base("forward").ok_or("no forward-hook chain")?;
    if let Some(v) = fwd.rules.iter().filter_map(|r| r.verdict.as_deref()).find(|v| *v != "drop") {
        return Err(format!("the forward chain has a verdict other than drop: {v}"));
    }
    let drops: Vec<&Rule> = fwd
        .rules
        .iter()
        .filter(|r| r.on_bridge && r.other_matches == 0 && r.verdict.as_deref() == Some("drop"))
        .collect();
    for want in DENIED_V4.iter().chain(DENIED_V6.iter()) {
        let w = Range::parse_cidr(want).ok_or_else(|| format!("{want} is not a range"))?;
        if !drops
            .iter()
            .any(|r| r.pkttype.is_empty() && r.ct_state.is_empty() && r.daddr.iter().any(|d| d.covers(&w)))
        {
            return Err(format!("nothing drops the rentals' traffic to {want}"));
        }
    }
    for kind in ["broadcast", "multicast"] {
        if !drops
            .iter()
            .any(|r| r.daddr.is_empty() && r.ct_state.is_empty() && r.pkttype.iter().any(|p| p == kind))
        {
            return Err(format!("nothing drops the rentals' {kind} packets"));
        }
    }

    let input = base("input").ok_or("no input-hook chain")?;
    let shape: Vec<(bool, usize, bool, bool, Option<&str>)> = input
        .rules
        .iter()
        .map(|r| {
            let replies = {
                let mut s = r.ct_state.clone();
                s.sort();
                s == ["established", "related"]
            };
            (
                r.on_bridge,
                r.other_matches + r.daddr.len() + r.pkttype.len(),
                replies,
                r.ct_state.is_empty(),
                r.verdict.as_deref(),
            )
        })
        .collect();
    let want = [(true, 0, true, false, Some("accept")), (true, 0, false, true, Some("drop"))];
    if shape != want {
        return Err("the input chain is not \"replies pass, the rest from the rentals drops\"".into());
    }
    for (name, c) in [("forward", fwd), ("input", input)] {
        if c.policy.as_deref() != Some("accept") {
            // A drop policy would cut the owner's own traffic: not gpum's table.
            return Err(format!("the {name} chain's policy is not accept"));
        }
    }
    Ok(())
}

/// Why the table is not in place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `nft` is not installed.
    #[error("nft (nftables) is not installed")]
    NftMissing,
    /// `nft` ran and failed, or the table it left is not the one wanted.
    #[error("{0}")]
    NotInPlace(String),
}

impl Refusal {
    /// The reason a rental carries when it does not start because of this.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NftMissing => NFT_MISSING,
            Refusal::NotInPlace(_) => NOT_IN_PLACE,
        }
    }
}

/// The reason a rental refused for [`Refusal::NftMissing`] carries.
pub const NFT_MISSING: &str = "refused: nftables is not installed on this machine; rentals need it to cut a \
     rental off from the owner's network (the owner runs: apt install nftables)";
/// The reason a rental refused for [`Refusal::NotInPlace`] carries.
pub const NOT_IN_PLACE: &str = "refused: the rentals' firewall table (nftables inet gpum_rentals) could not be \
     put in place and verified (details are in the agent's log)";

fn nft(host: &dyn Host, cmd: Cmd) -> Result<gpum_host::Output, Refusal> {
    match host.run(&cmd) {
        Ok(o) => Ok(o),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Refusal::NftMissing),
        Err(e) => Err(Refusal::NotInPlace(format!("{}: {e}", cmd.display()))),
    }
}

fn failed(cmd: &str, o: &gpum_host::Output) -> Refusal {
    Refusal::NotInPlace(format!("{cmd}: {}", String::from_utf8_lossy(&o.stderr).trim()))
}

/// Whether the table is in the kernel as [`verify_listing`] wants it.
pub fn verify(host: &dyn Host) -> Result<(), Refusal> {
    let cmd = Cmd::new(NFT).args(["-j", "list", "table", FAMILY, TABLE]);
    let o = nft(host, cmd.clone())?;
    if !o.success() {
        return Err(failed(&cmd.display(), &o));
    }
    verify_listing(&o.stdout_str()).map_err(Refusal::NotInPlace)
}

/// Replaces the table with [`ruleset`], in one transaction.
pub fn apply(host: &dyn Host) -> Result<(), Refusal> {
    let cmd = Cmd::new(NFT).args(["-f", "-"]).stdin(ruleset());
    let o = nft(host, cmd.clone())?;
    if o.success() { Ok(()) } else { Err(failed(&cmd.display(), &o)) }
}

/// What [`ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The table was in place already.
    InPlace,
    /// It was missing or not as wanted, and was put in place.
    Applied,
}

/// Verifies the table; when that fails, applies it and verifies again. `Ok` only for a table
/// verified in the kernel.
pub fn ensure(host: &dyn Host) -> Result<Ensured, Refusal> {
    match verify(host) {
        Ok(()) => return Ok(Ensured::InPlace),
        Err(Refusal::NftMissing) => return Err(Refusal::NftMissing),
        Err(Refusal::NotInPlace(why)) => {
            tracing::info!(why = %why, "putting the rentals' egress table in place")
        }
    }
    apply(host)?;
    verify(host)?;
    Ok(Ensured::Applied)
}

/// Removes the table (`uninstall`). `Ok(true)` when it was there, `Ok(false)` when it was not
/// (or `nft` is not installed, so gpum never made one); afterwards it is verified gone.
pub fn remove(host: &dyn Host) -> Result<bool, Refusal> {
    let list = Cmd::new(NFT).args(["-j", "list", "table", FAMILY, TABLE]);
    let present = match nft(host, list.clone()) {
        Err(Refusal::NftMissing) => return Ok(false),
        Err(e) => return Err(e),
        Ok(o) => o.success(),
    };
    if !present {
        return Ok(false);
    }
    let cmd = Cmd::new(NFT).args(["-f", "-"]).stdin(removal());
    let o = nft(host, cmd.clone())?;
    if !o.success() {
        return Err(failed(&cmd.display(), &o));
    }
    match nft(host, list)? {
        o if o.success() => Err(Refusal::NotInPlace(format!("table {FAMILY} {TABLE} is still there"))),
        _ => Ok(true),
    }
}

/// The rentals' runner's handle on the table: [`ensure`] on the machine, off the async
/// runtime's threads (`nft` is a process the agent waits for), logging what changed.
#[derive(Clone)]
pub struct Gate {
    host: Arc<dyn Host>,
    /// The last outcome logged, so a table that stays missing is logged once, not every round.
    last: Arc<Mutex<Option<Result<(), Refusal>>>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("egress::Gate")
    }
}

impl Gate {
    /// The gate on `host`'s nftables.
    pub fn new(host: Arc<dyn Host>) -> Gate {
        Gate { host, last: Arc::default() }
    }

    /// [`ensure`]: `Ok` only for a table verified in the kernel now.
    pub async fn ensure(&self) -> Result<(), Refusal> {
        let host = self.host.clone();
        let r = tokio::task::spawn_blocking(move || ensure(host.as_ref()))
            .await
            .unwrap_or_else(|e| Err(Refusal::NotInPlace(format!("the check did not finish: {e}"))));
        let outcome = r.as_ref().map(|_| ()).map_err(Clone::clone);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match &r {
            Ok(Ensured::Applied) => tracing::info!(table = TABLE, "put the rentals' egress table in place"),
            Err(e) if last.as_ref() != Some(&outcome) => {
                tracing::warn!(table = TABLE, error = %e, "the rentals' egress table is not in place; no rental starts")
            }
            _ => {}
        }
        *last = Some(outcome.clone());
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpum_host::Output;
    use gpum_host::fake::FakeHost;

    /// `nft -j list table inet gpum_rentals` after `nft -f` of [`ruleset`], captured from
    /// nftables 1.0.6 (Debian 12); note 224.0.0.0/3 (nft merged 224/4 and 240/4).
    const LISTED: &str = include_str!("../../tests/fixtures/egress/listed-1.0.6.json");

    fn list_cmd() -> String {
        format!("nft -j list table {FAMILY} {TABLE}")
    }

    fn out(code: i32, stdout: &str, stderr: &str) -> std::io::Result<Output> {
        Ok(Output { code: Some(code), stdout: stdout.into(), stderr: stderr.into() })
    }

    #[test]
    fn egress_ruleset_is_one_transaction_on_gpums_table_only() {
        let r = ruleset();
        let lines: Vec<&str> = r.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            &lines[..3],
            ["table inet gpum_rentals", "delete table inet gpum_rentals", "table inet gpum_rentals {"]
        );
        // Every table it names is gpum's; no flush of anything else.
        for l in r.lines().filter(|l| l.contains("table")) {
            assert!(l.contains("inet gpum_rentals") || l.starts_with('#'), "{l}");
        }
        assert!(!r.contains("flush"));
        assert!(r.contains("type filter hook forward priority filter; policy accept;"));
        assert!(r.contains("type filter hook input priority filter; policy accept;"));
        // Every rule matches the rentals' bridge and nothing else's traffic.
        let rules: Vec<&str> = r.lines().map(str::trim).filter(|l| l.starts_with("iifname")).collect();
        assert_eq!(rules.len(), 5);
        assert!(rules.iter().all(|l| l.starts_with("iifname \"gpum-rent0\" ")), "{rules:?}");
        for range in DENIED_V4.iter().chain(DENIED_V6.iter()) {
            assert!(r.contains(range), "{range}");
        }
        assert_eq!(
            rules[3..],
            [
                "iifname \"gpum-rent0\" ct state established,related accept",
                "iifname \"gpum-rent0\" counter drop"
            ]
        );
    }

    #[test]
    fn egress_denies_what_the_issue_lists_and_not_the_internet() {
        let denied: Vec<Range> =
            DENIED_V4.iter().chain(DENIED_V6.iter()).map(|s| Range::parse_cidr(s).unwrap()).collect();
        let hit = |a: &str| denied.iter().any(|d| d.covers(&Range::single(a).unwrap()));
        for a in [
            "10.1.2.3",
            "172.17.0.1",
            "172.31.255.255",
            "192.168.77.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "127.0.0.1",
            "224.0.0.251",
            "239.255.255.250",
            "255.255.255.255",
            "fd00::1",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::1",
            "::ffff:192.168.1.1",
        ] {
            assert!(hit(a), "{a} must be denied");
        }
        for a in [
            "198.51.100.7",
            "8.8.8.8",
            "1.1.1.1",
            "100.128.0.1",
            "172.32.0.1",
            "2001:db8::1",
            "2606:4700::1111",
        ] {
            assert!(!hit(a), "{a} is the internet");
        }
        for a in crate::docker::rental::DNS {
            assert!(!hit(a), "a rental's resolver {a} must be reachable");
        }
    }

    #[test]
    fn egress_listing_of_the_real_table_verifies() {
        assert_eq!(verify_listing(LISTED), Ok(()));
    }

    /// Each way the kernel's table can differ from the wanted one is caught.
    #[test]
    fn egress_verification_fails_closed() {
        let v: Value = serde_json::from_str(LISTED).unwrap();
        let edit = |f: &dyn Fn(&mut Vec<Value>)| {
            let mut v = v.clone();
            f(v["nftables"].as_array_mut().unwrap());
            verify_listing(&v.to_string())
        };
        let is_rule = |i: &Value, chain: &str| i["rule"]["chain"] == chain;
        // The table missing (nft prints nothing of it), flushed (chains without rules), a
        // chain gone.
        assert!(edit(&|a| a.retain(|i| i.get("metainfo").is_some())).unwrap_err().contains("missing"));
        assert!(edit(&|a| a.retain(|i| i.get("rule").is_none())).unwrap_err().contains("nothing drops"));
        assert!(edit(&|a| a.retain(|i| i["chain"]["name"] != "input" && !is_rule(i, "input"))).is_err());
        // One range gone from the set.
        let e = edit(&|a| {
            for i in a.iter_mut().filter(|i| is_rule(i, "forward")) {
                if let Some(set) = i["rule"]["expr"][1]["match"]["right"]["set"].as_array_mut() {
                    set.retain(|p| p["prefix"]["addr"] != "169.254.0.0");
                }
            }
        });
        assert_eq!(e, Err("nothing drops the rentals' traffic to 169.254.0.0/16".into()));
        // An accept slipped in before the drops.
        let e = edit(&|a| {
            let pos = a.iter().position(|i| is_rule(i, "forward")).unwrap();
            let mut r = a[pos].clone();
            r["rule"]["expr"] = serde_json::json!([{"accept": null}]);
            a.insert(pos, r);
        });
        assert!(e.unwrap_err().contains("other than drop"));
        // A drop narrowed to one port matches less than it must.
        let e = edit(&|a| {
            for i in a.iter_mut().filter(|i| is_rule(i, "forward")) {
                let ex = i["rule"]["expr"].as_array_mut().unwrap();
                ex.insert(1, serde_json::json!({"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}}));
            }
        });
        assert!(e.unwrap_err().contains("nothing drops"));
        // Another interface than the rentals' bridge.
        assert!(verify_listing(&LISTED.replace("gpum-rent0", "gpum-rent1")).is_err());
        // The input chain accepting everything, or a drop policy.
        let e = edit(&|a| {
            for i in a.iter_mut().filter(|i| is_rule(i, "input")) {
                i["rule"]["expr"][1] = serde_json::json!({"accept": null});
            }
        });
        assert!(e.unwrap_err().contains("input chain"));
        let e = edit(&|a| {
            for i in a.iter_mut().filter(|i| i["chain"]["name"] == "forward") {
                i["chain"]["policy"] = "drop".into();
            }
        });
        assert!(e.unwrap_err().contains("policy"));
        assert!(verify_listing("not json").is_err());
    }

    #[test]
    fn egress_ensure_applies_only_what_is_not_verified_and_fails_closed() {
        // In place: only listed, nothing applied.
        let h = FakeHost::new().command(&list_cmd(), out(0, LISTED, ""));
        assert_eq!(ensure(&h), Ok(Ensured::InPlace));
        assert_eq!(h.ran().len(), 1);

        // Missing, applied, and still not there: refused, however the apply answered.
        let h = FakeHost::new()
            .command(&list_cmd(), out(1, "", "Error: No such file or directory"))
            .command("nft -f -", out(0, "", ""));
        assert!(matches!(ensure(&h), Err(Refusal::NotInPlace(_))));
        let ran = h.ran();
        assert_eq!(
            ran.iter().map(Cmd::display).collect::<Vec<_>>(),
            [list_cmd(), "nft -f -".into(), list_cmd()]
        );
        assert_eq!(ran[1].stdin.as_deref(), Some(ruleset().as_bytes()), "the ruleset goes on stdin");

        // The apply refused by the kernel.
        let h = FakeHost::new()
            .command(&list_cmd(), out(1, "", "Error: No such file or directory"))
            .command("nft -f -", out(1, "", "Error: Could not process rule: Operation not permitted"));
        let e = ensure(&h).unwrap_err();
        assert!(e.to_string().contains("Operation not permitted"), "{e}");
        assert_eq!(e.reason(), NOT_IN_PLACE);

        // No nft at all.
        let h = FakeHost::new();
        assert_eq!(ensure(&h), Err(Refusal::NftMissing));
        assert!(Refusal::NftMissing.reason().contains("apt install nftables"));
    }

    #[test]
    fn egress_remove_deletes_only_gpums_table() {
        let h = FakeHost::new().command(&list_cmd(), out(1, "", "Error: No such file or directory"));
        assert_eq!(remove(&h), Ok(false));
        assert_eq!(h.ran().len(), 1, "nothing to remove, nothing removed");
        assert_eq!(remove(&FakeHost::new()), Ok(false), "no nft: gpum never made a table");

        // Present, and (in this fake) still listed after the delete: not verified gone.
        let h = FakeHost::new().command(&list_cmd(), out(0, LISTED, "")).command("nft -f -", out(0, "", ""));
        assert!(remove(&h).is_err());
        let del = &h.ran()[1];
        assert_eq!(del.stdin.as_deref(), Some(removal().as_bytes()));
        assert_eq!(removal(), "table inet gpum_rentals\ndelete table inet gpum_rentals\n");
    }
}
