//! Where the tunnel may connect (issue 34): the address of a rental's own container on gpum's
//! rental network, as the engine reports it, and nothing else.
//!
//! The platform never names an address: it names a rental and a port, and the agent finds the
//! container itself ([`rental_address`]). The container must carry the rental mark (on itself,
//! not from its image) and be running; its address on [`NETWORK`] must lie inside that network's
//! subnet as the engine reports it, and be neither loopback, unspecified, multicast nor the
//! network's gateway (the host's side of the bridge). Anything else is refused, so a platform
//! that asks cannot make the agent reach the host, the owner's LAN, or another container.

use std::net::IpAddr;

use super::rental::{NETWORK, RENTAL, container_name};
use super::{Docker, DockerError, timed};

/// Why no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("the rental has no container here")]
    NoContainer,
    #[error("the rental's container is not running")]
    NotRunning,
    #[error("the rental's container has no address on {NETWORK}")]
    NoAddress,
    #[error("the rental's address is not inside {NETWORK}'s subnet")]
    OutsideSubnet,
    #[error("Docker: {0}")]
    Docker(String),
}

/// The address of rental `id`'s container on [`NETWORK`], checked as the module docs say.
pub async fn rental_address(docker: &Docker, id: &str) -> Result<IpAddr, AddressError> {
    let name = container_name(id);
    match docker.check_marked(&name, RENTAL).await {
        Ok(()) => {}
        Err(DockerError::NotFound(_) | DockerError::NotManaged(_)) => return Err(AddressError::NoContainer),
        Err(e) => return Err(AddressError::Docker(e.to_string())),
    }
    let api = docker.api().await.map_err(|e| AddressError::Docker(e.to_string()))?;
    let info = timed(async { api.inspect_container(&name, None).await.map_err(DockerError::from) })
        .await
        .map_err(|e| AddressError::Docker(e.to_string()))?;
    if info.state.and_then(|s| s.running) != Some(true) {
        return Err(AddressError::NotRunning);
    }
    let ip = info
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|mut n| n.remove(NETWORK))
        .and_then(|e| e.ip_address)
        .and_then(|a| a.parse::<IpAddr>().ok())
        .ok_or(AddressError::NoAddress)?;
    let net = timed(async { api.inspect_network::<String>(NETWORK, None).await.map_err(DockerError::from) })
        .await
        .map_err(|e| AddressError::Docker(e.to_string()))?;
    let configs = net.ipam.and_then(|i| i.config).unwrap_or_default();
    let inside = configs.iter().any(|c| {
        let gateway = c.gateway.as_deref().and_then(|g| g.parse::<IpAddr>().ok());
        c.subnet.as_deref().is_some_and(|s| in_subnet(ip, s)) && gateway != Some(ip)
    });
    if !inside || !usable(ip) {
        return Err(AddressError::OutsideSubnet);
    }
    Ok(ip)
}

/// Whether `ip` lies in `subnet` (`a.b.c.d/n` or an IPv6 prefix); a subnet that does not parse
/// holds nothing.
pub fn in_subnet(ip: IpAddr, subnet: &str) -> bool {
    let Some((net, len)) = subnet.split_once('/') else { return false };
    let (Ok(net), Ok(len)) = (net.parse::<IpAddr>(), len.parse::<u32>()) else { return false };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if len <= 32 => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if len <= 128 => {
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// An address a container can hold: not loopback, unspecified, multicast or broadcast.
fn usable(ip: IpAddr) -> bool {
    let v4_broadcast = matches!(ip, IpAddr::V4(v) if v.is_broadcast());
    !(ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || v4_broadcast)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn tunnel_addresses_must_lie_inside_the_rental_subnet() {
        assert!(in_subnet(ip("172.18.0.2"), "172.18.0.0/16"));
        assert!(!in_subnet(ip("172.19.0.2"), "172.18.0.0/16"));
        assert!(!in_subnet(ip("192.168.1.10"), "172.18.0.0/16"));
        assert!(!in_subnet(ip("127.0.0.1"), "172.18.0.0/16"));
        assert!(in_subnet(ip("10.1.2.3"), "10.1.2.0/24"));
        assert!(!in_subnet(ip("10.1.3.3"), "10.1.2.0/24"));
        assert!(in_subnet(ip("fd00::5"), "fd00::/64"));
        assert!(!in_subnet(ip("fd01::5"), "fd00::/64"));
        assert!(!in_subnet(ip("172.18.0.2"), "fd00::/64"), "families never mix");
        assert!(!in_subnet(ip("172.18.0.2"), "garbage"));
        assert!(!in_subnet(ip("172.18.0.2"), "172.18.0.0/33"));
        assert!(in_subnet(ip("1.2.3.4"), "0.0.0.0/0"), "a /0 holds everything, so usable() matters");
        assert!(!usable(ip("127.0.0.1")) && !usable(ip("0.0.0.0")) && !usable(ip("224.0.0.1")));
        assert!(!usable(ip("255.255.255.255")) && !usable(ip("::1")));
        assert!(usable(ip("172.18.0.2")));
    }
}
