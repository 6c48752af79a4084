//! The SSRF guard: which addresses an HTTP node may reach.
//!
//! Every address is checked right before it is connected to: host names
//! inside [`GuardedResolver`] (so the addresses checked are exactly the ones
//! the connector is handed, with no second lookup an attacker could rebind),
//! IP-literal hosts (which never reach a resolver) by [`AddressPolicy::check_url`],
//! for the first request and for every redirect.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// What an address is, as far as outbound requests are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// Anything not listed below: always allowed.
    Public,
    /// 127.0.0.0/8 and ::1: allowed only with `allow_loopback`.
    Loopback,
    /// Private networks (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7,
    /// fec0::/10): allowed only with `allow_private_networks`. The text says
    /// which range.
    Private(&'static str),
    /// Never allowed, whatever the configuration: link-local (with the cloud
    /// metadata addresses), unspecified, multicast, broadcast, reserved. The
    /// text says which range.
    Forbidden(&'static str),
}

/// Classifies an address. IPv4 addresses embedded in IPv6 (mapped
/// `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`) are
/// classified as the IPv4 address they reach.
pub fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    use AddressClass::*;
    let [a, b, ..] = ip.octets();
    if a == 0 {
        // 0.0.0.0 connects to the local host on Linux.
        Forbidden("unspecified (0.0.0.0/8)")
    } else if a == 169 && b == 254 {
        Forbidden(
            "link-local (169.254.0.0/16, which holds the cloud metadata address 169.254.169.254)",
        )
    } else if ip == Ipv4Addr::new(100, 100, 100, 200) {
        Forbidden("a cloud metadata address (100.100.100.200)")
    } else if ip.is_broadcast() {
        Forbidden("broadcast (255.255.255.255)")
    } else if ip.is_multicast() {
        Forbidden("multicast (224.0.0.0/4)")
    } else if a >= 240 {
        Forbidden("reserved (240.0.0.0/4)")
    } else if a == 127 {
        Loopback
    } else if a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168) {
        Private("a private network (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16)")
    } else if a == 100 && (64..128).contains(&b) {
        Private("shared address space (100.64.0.0/10)")
    } else {
        Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    use AddressClass::*;
    if ip.is_unspecified() {
        return Forbidden("unspecified (::)");
    }
    if ip.is_loopback() {
        return Loopback;
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let s = ip.segments();
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        Forbidden("a cloud metadata address (fd00:ec2::254)")
    } else if s[0] & 0xffc0 == 0xfe80 {
        Forbidden("link-local (fe80::/10)")
    } else if s[0] & 0xff00 == 0xff00 {
        Forbidden("multicast (ff00::/8)")
    } else if s[0] & 0xfe00 == 0xfc00 {
        Private("a unique local address (fc00::/7)")
    } else if s[0] & 0xffc0 == 0xfec0 {
        Private("a site-local address (fec0::/10)")
    } else {
        Public
    }
}

/// The IPv4 address an IPv6 address stands for, if it embeds one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let [.., a, b, c, d] = ip.octets();
    let v4 = Ipv4Addr::new(a, b, c, d);
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let compatible = s[..6] == [0; 6];
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (mapped || compatible || nat64).then_some(v4)
}

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// The host name that resolved to `addr`, when the URL named one.
    pub host: Option<String>,
    /// The refused address.
    pub addr: IpAddr,
    /// Why: the range, and the setting that would allow it if one would.
    pub reason: String,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Some(host) => write!(f, "host {host} resolves to {}: {}", self.addr, self.reason),
            None => write!(f, "address {}: {}", self.addr, self.reason),
        }
    }
}

impl std::error::Error for Blocked {}

/// Which classes of address are allowed, from the executor's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Allow [`AddressClass::Private`].
    pub allow_private_networks: bool,
    /// Allow [`AddressClass::Loopback`].
    pub allow_loopback: bool,
}

impl AddressPolicy {
    /// Refuses an address this policy does not allow.
    pub fn check(&self, addr: IpAddr) -> Result<(), Blocked> {
        let reason = match classify(addr) {
            AddressClass::Public => return Ok(()),
            AddressClass::Loopback if self.allow_loopback => return Ok(()),
            AddressClass::Private(_) if self.allow_private_networks => return Ok(()),
            AddressClass::Loopback => {
                "loopback, refused unless the server runs with --http-allow-loopback \
                 (COMPOSER_HTTP_ALLOW_LOOPBACK)"
                    .to_owned()
            }
            AddressClass::Private(range) => format!(
                "{range}, refused unless the server runs with --http-allow-private \
                 (COMPOSER_HTTP_ALLOW_PRIVATE)"
            ),
            AddressClass::Forbidden(range) => format!("{range}, always refused"),
        };
        Err(Blocked {
            host: None,
            addr,
            reason,
        })
    }

    /// Checks a URL whose host is an IP literal (those never reach the
    /// resolver); a host name passes here and is checked when resolved.
    pub fn check_url(&self, url: &Url) -> Result<(), Blocked> {
        match url_ip(url) {
            Some(ip) => self.check(ip),
            None => Ok(()),
        }
    }
}

/// The IP address a URL's host is written as, if it is an IP literal. The
/// URL parser has already normalised forms like `2130706433` or `0x7f.1`.
fn url_ip(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse().ok()
}

/// A resolver that hands the connector only addresses the policy allows, and
/// refuses the whole name if any of its addresses is refused.
#[derive(Debug, Clone)]
pub(crate) struct GuardedResolver {
    pub(crate) policy: AddressPolicy,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if addrs.is_empty() {
                return Err(format!("host {host} has no addresses").into());
            }
            for addr in &addrs {
                policy.check(addr.ip()).map_err(|blocked| Blocked {
                    host: Some(host.clone()),
                    ..blocked
                })?;
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}
