//! Who may call (docs/configuration.md, who may call): typed CIDR blocks, a source's
//! `allow_ips`, and the client address behind the top-level `trusted_proxies`.

use std::fmt;
use std::net::IpAddr;

use axum::http::{header, HeaderMap};

/// One CIDR block (`192.0.2.0/24`, `2001:db8::/32`); a bare address is a block of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(ipnet::IpNet);

/// Why an entry is not a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// Neither `address/prefix` nor an address.
    #[error("{0:?} is not a CIDR block (address/prefix, e.g. 192.0.2.0/24 or 2001:db8::/32)")]
    Malformed(String),
    /// The address has bits set past the prefix: most likely a typo.
    #[error("{given:?} has bits set past its prefix length; did you mean {meant:?}?")]
    HostBits {
        /// The entry as written.
        given: String,
        /// The block it most likely means.
        meant: String,
    },
}

impl Cidr {
    /// Parses `192.0.2.0/24`, `2001:db8::/32` or a bare address; bits set past the prefix
    /// length are refused rather than silently dropped.
    pub fn parse(raw: &str) -> Result<Self, CidrError> {
        let text = raw.trim();
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Self(ipnet::IpNet::from(ip)));
        }
        let net: ipnet::IpNet = text
            .parse()
            .map_err(|_| CidrError::Malformed(raw.to_owned()))?;
        if net.trunc() != net {
            return Err(CidrError::HostBits {
                given: raw.to_owned(),
                meant: net.trunc().to_string(),
            });
        }
        Ok(Self(net))
    }

    /// Whether `ip` is in the block; an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`)
    /// matches as the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip) || self.0.contains(&ip.to_canonical())
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A list of CIDR blocks: a source's `allow_ips` or the top-level `trusted_proxies`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CidrList(Vec<Cidr>);

impl CidrList {
    /// Parses every entry of the list at config key `key`; the error names the key and
    /// the entry.
    pub fn parse(key: &str, entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|entry| Cidr::parse(entry).map_err(|e| format!("{key}: {e}")))
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// Whether `ip` is in any of the blocks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|cidr| cidr.contains(ip))
    }

    /// Whether the list has no block.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Who a request is from, as far as the TCP peer and `trusted_proxies` can vouch for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// The nearest untrusted hop: the TCP peer itself, or the hop a trusted proxy named.
    Known(IpAddr),
    /// A hop that does not parse (`junk`, `for=unknown`, `for=_hidden`) stands between the
    /// trusted proxies and the client, so nobody can say who the client is. `via` is the
    /// nearest trusted proxy that relayed it: every unknown client behind it shares its budgets.
    Unknown {
        /// The trusted proxy that relayed the request.
        via: IpAddr,
    },
}

impl Client {
    /// Whether the client is in `list`: an unknown client matches no block, so that a
    /// header a client writes can never make it pass as the proxy in front of it.
    pub fn is_in(&self, list: &CidrList) -> bool {
        match self {
            Self::Known(ip) => list.contains(*ip),
            Self::Unknown { .. } => false,
        }
    }

    /// The address per-client budgets and limits are kept under.
    pub fn budget_key(&self) -> IpAddr {
        match self {
            Self::Known(ip) | Self::Unknown { via: ip } => *ip,
        }
    }
}

/// Who a request is from: the TCP peer, unless the peer is one of `trusted_proxies`; then
/// the hops of its `Forwarded` header (or, without one, its `X-Forwarded-For`) are walked
/// from the right, and the first untrusted hop is the client. A hop that does not parse
/// stops the walk: the client is [`Client::Unknown`]. Every hop trusted: the leftmost. A
/// trusted peer that sends no forwarding header is itself the client.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted_proxies: &CidrList) -> Client {
    if trusted_proxies.is_empty() || !trusted_proxies.contains(peer) {
        return Client::Known(peer);
    }
    let Some(chain) = forwarded_chain(headers) else {
        return Client::Known(peer);
    };
    let mut nearest = peer;
    for hop in chain.iter().rev() {
        let Some(hop) = *hop else {
            return Client::Unknown { via: nearest };
        };
        nearest = hop;
        if !trusted_proxies.contains(hop) {
            break;
        }
    }
    Client::Known(nearest)
}

/// The hops a request passed through, leftmost (farthest) first, `None` where a hop is not
/// an address: from every `Forwarded` header's `for=` parameters, or else every
/// `X-Forwarded-For`. `None` when there is neither header; a value that is not text is
/// one hop that does not parse.
fn forwarded_chain(headers: &HeaderMap) -> Option<Vec<Option<IpAddr>>> {
    let joined = |name: header::HeaderName| -> Option<Option<String>> {
        let mut values = headers.get_all(name).iter().peekable();
        values.peek()?;
        Some(
            values
                .map(|v| v.to_str().ok().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.join(",")),
        )
    };
    if let Some(forwarded) = joined(header::FORWARDED) {
        return Some(forwarded.as_deref().map_or(vec![None], forwarded_hops));
    }
    let listed = joined(header::HeaderName::from_static("x-forwarded-for"))?;
    Some(listed.map_or(vec![None], |listed| {
        listed.split(',').map(hop_address).collect()
    }))
}

/// The `for=` of each element of a `Forwarded` value (RFC 7239); `None` for an element
/// with none, or more than one, or one that is not an address.
fn forwarded_hops(value: &str) -> Vec<Option<IpAddr>> {
    value
        .split(',')
        .map(|element| {
            let mut fors = element.split(';').filter_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| value.trim())
            });
            let value = fors.next()?;
            if fors.next().is_some() {
                return None;
            }
            let unquoted = match value.strip_prefix('"') {
                Some(rest) => rest.strip_suffix('"')?,
                None => value,
            };
            hop_address(unquoted)
        })
        .collect()
}

/// One hop: `192.0.2.7`, `192.0.2.7:4711`, `2001:db8::7`, `[2001:db8::7]` or
/// `[2001:db8::7]:4711`.
fn hop_address(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = hop.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok());
        return port_ok
            .then(|| inside.parse::<std::net::Ipv6Addr>().ok())
            .flatten()
            .map(IpAddr::V6);
    }
    hop.parse::<std::net::SocketAddrV4>()
        .ok()
        .map(|a| IpAddr::V4(*a.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn known(s: &str) -> Client {
        Client::Known(ip(s))
    }

    fn list(entries: &[&str]) -> CidrList {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        CidrList::parse("trusted_proxies", &entries).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn cidr_blocks_parse_and_match() {
        let v4 = Cidr::parse("192.0.2.0/24").unwrap();
        assert!(v4.contains(ip("192.0.2.7")));
        assert!(!v4.contains(ip("192.0.3.7")));
        assert!(
            v4.contains(ip("::ffff:192.0.2.7")),
            "IPv4-mapped IPv6 matches its IPv4 block"
        );
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:1::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("192.0.2.7")));
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(one.to_string(), "127.0.0.1/32");
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains(ip("203.0.113.1")));
    }

    #[test]
    fn bad_cidr_blocks_are_named() {
        for bad in [
            "192.0.2.0/33",
            "2001:db8::/129",
            "nope",
            "192.0.2/24",
            "",
            "10.0.0.0/",
        ] {
            assert_eq!(
                Cidr::parse(bad),
                Err(CidrError::Malformed(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            Cidr::parse("192.0.2.1/24"),
            Err(CidrError::HostBits {
                given: "192.0.2.1/24".into(),
                meant: "192.0.2.0/24".into()
            })
        );
        let err =
            CidrList::parse("allow_ips", &["10.0.0.0/8".into(), "10.0.0.0/40".into()]).unwrap_err();
        assert!(
            err.starts_with("allow_ips: \"10.0.0.0/40\" is not a CIDR block"),
            "{err}"
        );
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let peer = ip("127.0.0.1");
        let xff = headers(&[("x-forwarded-for", "192.0.2.7")]);
        assert_eq!(
            client_address(peer, &xff, &CidrList::default()),
            Client::Known(peer)
        );
        assert_eq!(
            client_address(peer, &xff, &list(&["10.0.0.0/8"])),
            Client::Known(peer)
        );
        assert_eq!(
            client_address(peer, &xff, &list(&["127.0.0.1/32"])),
            known("192.0.2.7")
        );
    }

    #[test]
    fn the_walk_stops_at_the_nearest_untrusted_hop() {
        let trusted = list(&["127.0.0.1/32", "10.0.0.0/8"]);
        let peer = ip("127.0.0.1");
        // A client-written first entry is passed over: the nearest untrusted hop wins.
        let xff = headers(&[("x-forwarded-for", "6.6.6.6, 192.0.2.7, 10.1.1.1")]);
        assert_eq!(client_address(peer, &xff, &trusted), known("192.0.2.7"));
        // Two headers are one list, in order.
        let split = headers(&[
            ("x-forwarded-for", "6.6.6.6, 192.0.2.7"),
            ("x-forwarded-for", "10.1.1.1"),
        ]);
        assert_eq!(client_address(peer, &split, &trusted), known("192.0.2.7"));
        // Every hop trusted: the farthest.
        let all = headers(&[("x-forwarded-for", "10.0.0.2, 10.0.0.3")]);
        assert_eq!(client_address(peer, &all, &trusted), known("10.0.0.2"));
        let ported = headers(&[("x-forwarded-for", "192.0.2.7:4711, [2001:db8::7]:80")]);
        assert_eq!(
            client_address(peer, &ported, &trusted),
            known("2001:db8::7")
        );
    }

    #[test]
    fn forwarded_is_read_before_x_forwarded_for() {
        let trusted = list(&["127.0.0.1/32"]);
        let peer = ip("127.0.0.1");
        let both = headers(&[
            (
                "forwarded",
                "for=192.0.2.7;proto=https, For=\"[2001:db8::9]:4711\"",
            ),
            ("x-forwarded-for", "198.51.100.1"),
        ]);
        assert_eq!(client_address(peer, &both, &trusted), known("2001:db8::9"));
        let quoted = headers(&[("forwarded", "for=\"192.0.2.7\";by=10.0.0.1")]);
        assert_eq!(client_address(peer, &quoted, &trusted), known("192.0.2.7"));
    }

    #[test]
    fn a_hop_that_does_not_parse_makes_the_client_unknown() {
        let trusted = list(&["127.0.0.1/32", "10.0.0.0/8"]);
        let peer = ip("127.0.0.1");
        for (name, value) in [
            ("x-forwarded-for", "192.0.2.7, not-an-address"),
            ("x-forwarded-for", "junk"),
            ("x-forwarded-for", ""),
            ("x-forwarded-for", "192.0.2.7:99999"),
            ("forwarded", "for=unknown"),
            ("forwarded", "for=_hidden"),
            ("forwarded", "proto=https"),
            ("forwarded", "for=192.0.2.7;for=192.0.2.8"),
            ("forwarded", "for=\"[2001:db8::1]"),
        ] {
            let client = client_address(peer, &headers(&[(name, value)]), &trusted);
            assert_eq!(client, Client::Unknown { via: peer }, "{name}: {value}");
            assert!(
                !client.is_in(&list(&["0.0.0.0/0", "::/0"])),
                "an unknown client matches no block"
            );
            assert_eq!(client.budget_key(), peer);
        }
        // The walk stops at the first hop that does not parse, after trusted ones.
        let behind = headers(&[("x-forwarded-for", "192.0.2.7, _hidden, 10.1.1.1")]);
        assert_eq!(
            client_address(peer, &behind, &trusted),
            Client::Unknown {
                via: ip("10.1.1.1")
            }
        );
        // Junk left of the first untrusted hop is never reached.
        let before = headers(&[("x-forwarded-for", "junk, 192.0.2.7, 10.1.1.1")]);
        assert_eq!(client_address(peer, &before, &trusted), known("192.0.2.7"));
    }

    proptest! {
        #[test]
        fn the_client_is_a_hop_of_the_chain_the_peer_or_unknown(
            hops in proptest::collection::vec(any::<[u8; 4]>(), 0..6),
            trusted_bits in any::<u8>(),
            junk in proptest::option::of("[a-z0-9:., ]{0,12}"),
            forwarded in any::<bool>(),
        ) {
            let peer = ip("10.0.0.1");
            let addrs: Vec<IpAddr> = hops.iter().map(|o| IpAddr::from(*o)).collect();
            // Some hops trusted, picked by bit, as single-address blocks.
            let mut trusted: Vec<String> = vec!["10.0.0.1".into()];
            trusted.extend(addrs.iter().enumerate()
                .filter(|(i, _)| trusted_bits & (1 << i) != 0)
                .map(|(_, a)| a.to_string()));
            let trusted = CidrList::parse("trusted_proxies", &trusted).unwrap();
            let mut entries: Vec<String> = addrs.iter().map(|a| if forwarded {
                format!("for={a}")
            } else {
                a.to_string()
            }).collect();
            if let Some(junk) = junk {
                entries.insert(entries.len() / 2, junk);
            }
            let value = entries.join(", ");
            let mut map = HeaderMap::new();
            if let Ok(v) = value.parse() {
                map.insert(if forwarded { "forwarded" } else { "x-forwarded-for" }, v);
            }
            let client = client_address(peer, &map, &trusted);
            let vouched = match client {
                Client::Known(ip) => ip == peer || addrs.contains(&ip),
                Client::Unknown { via } => via == peer || addrs.contains(&via),
            };
            prop_assert!(vouched, "{client:?} from {value:?}");
        }
    }
}
