//! The SSRF guard: which addresses a request may reach. Pure functions over addresses plus a
//! DNS resolver that refuses what they refuse, so the address checked is the address connected
//! to (a name cannot resolve to a public address for the check and a private one for the
//! connection).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// Why an address is not reachable without an allow-list entry, or `None` when it is public.
/// An IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64, 6to4, Teredo) is
/// judged by the IPv4 address it carries as well.
pub fn blocked_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

fn v6_reason(v6: Ipv6Addr) -> Option<&'static str> {
    let s = v6.segments();
    let low32 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if v6.is_unspecified() {
        Some("the unspecified address")
    } else if v6.is_loopback() {
        Some("a loopback address")
    } else if let Some(v4) = v6.to_ipv4_mapped() {
        v4_reason(v4).map(|_| "an IPv4-mapped private address")
    } else if s[..6] == [0; 6] {
        // IPv4-compatible (::a.b.c.d, deprecated): some stacks still route it as IPv4.
        Some("an IPv4-compatible address")
    } else if s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0 {
        // IPv4-translated (::ffff:0:a.b.c.d, SIIT).
        v4_reason(low32)
            .map(|_| "an IPv4-translated private address")
            .or(Some("an IPv4-translated address"))
    } else if s[0] == 0x64 && s[1] == 0xff9b {
        // NAT64: the well-known prefix 64:ff9b::/96 and the local-use 64:ff9b:1::/48 embed an
        // IPv4 address in the last 32 bits.
        if s[2] == 1 || s[2..6] == [0; 4] {
            v4_reason(low32).map(|_| "a NAT64 address of a private one")
        } else {
            Some("a reserved NAT64 address")
        }
    } else if s[0] == 0x2002 {
        // 6to4 embeds an IPv4 address in bits 16..48.
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        v4_reason(v4).map(|_| "a 6to4 address of a private one")
    } else if s[0] == 0x2001 && s[1] == 0 {
        // Teredo (2001::/32): the client's IPv4 address is the last 32 bits inverted; the
        // server's is in bits 32..64.
        let client = Ipv4Addr::from(!u32::from(low32));
        let server = Ipv4Addr::new((s[2] >> 8) as u8, s[2] as u8, (s[3] >> 8) as u8, s[3] as u8);
        v4_reason(client)
            .or_else(|| v4_reason(server))
            .map(|_| "a Teredo address of a private one")
    } else if s[0] == 0x2001 && s[1] == 0x0db8 {
        Some("a documentation address")
    } else if s[0] == 0x0100 && s[1..4] == [0, 0, 0] {
        Some("a discard-only address")
    } else if v6.is_multicast() {
        Some("a multicast address")
    } else if s[0] & 0xfe00 == 0xfc00 {
        Some("a unique-local address")
    } else if s[0] & 0xffc0 == 0xfe80 {
        Some("a link-local address")
    } else if s[0] & 0xffc0 == 0xfec0 {
        Some("a site-local address")
    } else if v6 == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        Some("a cloud metadata address")
    } else {
        None
    }
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_unspecified() || o[0] == 0 {
        Some("the unspecified address")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_private() {
        Some("a private address")
    } else if o[0] == 169 && o[1] == 254 {
        Some("a link-local or cloud metadata address")
    } else if o[0] == 100 && (64..128).contains(&o[1]) {
        Some("a carrier-grade NAT address")
    } else if ip.is_multicast() || ip.is_broadcast() || o[0] >= 240 {
        Some("a multicast or reserved address")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("an IETF protocol address")
    } else if o[0] == 198 && (o[1] == 18 || o[1] == 19) {
        Some("a benchmarking address")
    } else if (o[0], o[1], o[2]) == (192, 0, 2)
        || (o[0], o[1], o[2]) == (198, 51, 100)
        || (o[0], o[1], o[2]) == (203, 0, 113)
    {
        Some("a documentation address")
    } else if (o[0], o[1], o[2]) == (192, 88, 99) {
        Some("a 6to4 relay address")
    } else {
        None
    }
}

/// Hosts and address ranges a request may reach although the guard would refuse them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct AllowList {
    hosts: Vec<String>,
    nets: Vec<(IpAddr, u8)>,
    /// Hosts (names or addresses) allowed on one port only: the server a workflow names.
    origins: Vec<(String, u16)>,
}

impl AllowList {
    /// Parses entries: a host name (`searx.lan`), an address (`127.0.0.1`, `::1`) or a CIDR
    /// (`10.0.0.0/8`).
    pub fn parse<S: AsRef<str>>(entries: impl IntoIterator<Item = S>) -> Result<AllowList, String> {
        let mut list = AllowList::default();
        for e in entries {
            list.add(e.as_ref())?;
        }
        Ok(list)
    }

    /// Adds one entry (see [`AllowList::parse`]).
    pub fn add(&mut self, entry: &str) -> Result<(), String> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Ok(());
        }
        let bare = entry.trim_start_matches('[').trim_end_matches(']');
        if let Some((addr, len)) = bare.split_once('/') {
            let ip: IpAddr = addr.parse().map_err(|_| format!("`{entry}` is not a CIDR"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("`{entry}` has a bad prefix length"))?;
            self.push_net(ip, len);
        } else if let Ok(ip) = bare.parse::<IpAddr>() {
            self.push_net(ip, if ip.is_ipv4() { 32 } else { 128 });
        } else if bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
            let host = bare.to_ascii_lowercase();
            if !self.hosts.contains(&host) {
                self.hosts.push(host);
            }
        } else {
            return Err(format!("`{entry}` is neither a host, an address nor a CIDR"));
        }
        Ok(())
    }

    /// Allows `host` (a name or an address) on `port` only: see [`AllowList::for_port`].
    pub fn add_origin(&mut self, host: &str, port: u16) -> Result<(), String> {
        let mut probe = AllowList::default();
        probe.add(host)?;
        let host = host
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        if !host.is_empty() && !self.origins.contains(&(host.clone(), port)) {
            self.origins.push((host, port));
        }
        Ok(())
    }

    /// The list that applies to a connection on `port`: the hosts and ranges, and the origins
    /// on that port as hosts; origins on other ports are dropped.
    pub fn for_port(&self, port: u16) -> AllowList {
        let mut out = AllowList {
            hosts: self.hosts.clone(),
            nets: self.nets.clone(),
            origins: Vec::new(),
        };
        for (host, p) in &self.origins {
            if *p == port {
                // `add_origin` accepted this entry, so `add` does.
                let _ = out.add(host);
            }
        }
        out
    }

    fn push_net(&mut self, ip: IpAddr, len: u8) {
        if !self.nets.contains(&(ip, len)) {
            self.nets.push((ip, len));
        }
    }

    /// Adds every entry of `other`.
    pub fn extend(&mut self, other: &AllowList) {
        for h in &other.hosts {
            if !self.hosts.contains(h) {
                self.hosts.push(h.clone());
            }
        }
        for (ip, len) in &other.nets {
            self.push_net(*ip, *len);
        }
        for o in &other.origins {
            if !self.origins.contains(o) {
                self.origins.push(o.clone());
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.nets.is_empty() && self.origins.is_empty()
    }

    /// Whether `host` (a name as written in a URL) is allowed by name.
    pub fn allows_host(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        self.hosts.contains(&host)
    }

    /// Whether `ip` lies in an allowed address or range.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|(net, len)| in_net(ip, *net, *len))
    }

    /// `Ok` when a request to `host` connecting to `ip` may go ahead.
    pub fn check(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        match blocked_reason(ip) {
            None => Ok(()),
            Some(_) if self.allows_host(host) || self.allows_ip(ip) => Ok(()),
            Some(why) => Err(format!(
                "refused to connect to `{host}`: it resolves to {why} ({ip}); allow it with the node's `allow` or --allow-net"
            )),
        }
    }

    /// A stable key, so that clients can be shared by requests with the same allow-list.
    pub(crate) fn key(&self) -> String {
        let mut parts: Vec<String> = self.hosts.clone();
        parts.extend(self.nets.iter().map(|(ip, len)| format!("{ip}/{len}")));
        parts.extend(self.origins.iter().map(|(h, p)| format!("{h}@{p}")));
        parts.sort();
        parts.join(",")
    }
}

fn in_net(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// A DNS resolver that drops every address the allow-list does not permit, and fails when
/// none is left. The client connects only to what it returns.
#[derive(Debug)]
pub(crate) struct GuardedResolver {
    pub allow: AllowList,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let ok: Vec<SocketAddr> = addrs
                .into_iter()
                .filter(|a| match allow.check(&host, a.ip()) {
                    Ok(()) => true,
                    Err(e) => {
                        refused = Some(e);
                        false
                    }
                })
                .collect();
            if ok.is_empty() {
                let msg = refused.unwrap_or_else(|| format!("`{host}` did not resolve"));
                return Err(Box::new(Refused(msg)) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(ok.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A connection the guard refused (found again in the error chain to classify it).
#[derive(Debug)]
pub(crate) struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

pub(crate) fn resolver(allow: AllowList) -> Arc<GuardedResolver> {
    Arc::new(GuardedResolver { allow })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_and_special_addresses_are_refused() {
        for a in [
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.254",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "127.0.0.1",
            "127.0.0.2",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fd00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "2002:c0a8:101::1",
            // documentation ranges (reachable on some networks)
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.200",
            "2001:db8::1",
            // IPv4-compatible, in every spelling
            "::127.0.0.1",
            "::7f00:1",
            "::8.8.8.8",
            "::a00:1",
            // IPv4-mapped and -translated
            "::ffff:7f00:1",
            "::ffff:0:7f00:1",
            "::ffff:0:a00:1",
            "::ffff:0:808:808",
            "::ffff:c000:201",
            // NAT64, well-known and local-use prefixes
            "64:ff9b::127.0.0.1",
            "64:ff9b::c000:201",
            "64:ff9b:1::a9fe:a9fe",
            "64:ff9b:1:2::1",
            // 6to4 of loopback and a documentation address
            "2002:7f00:1::1",
            "2002:cb00:7101::1",
            // Teredo: client 127.0.0.1 (inverted 80ff:fffe), or a private server
            "2001:0:4136:e378:8000:63bf:80ff:fffe",
            "2001:0:a00:1:8000:63bf:f7f7:f7f7",
            "100::1",
        ] {
            assert!(blocked_reason(ip(a)).is_some(), "{a} should be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for a in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "192.0.3.1",
            "198.51.101.1",
            "203.0.114.1",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:0:4136:e378:8000:63bf:f7f7:f7f7",
        ] {
            assert_eq!(blocked_reason(ip(a)), None, "{a} should pass");
        }
    }

    #[test]
    fn the_allow_list_takes_hosts_addresses_and_cidrs() {
        let allow = AllowList::parse(["127.0.0.1", "10.1.0.0/16", "Searx.Lan"]).unwrap();
        assert!(allow.check("127.0.0.1", ip("127.0.0.1")).is_ok());
        assert!(allow.check("127.0.0.2", ip("127.0.0.2")).is_err());
        assert!(allow.check("x", ip("10.1.200.3")).is_ok());
        assert!(allow.check("x", ip("::ffff:10.1.200.3")).is_ok());
        assert!(allow.check("x", ip("10.2.0.1")).is_err());
        assert!(allow.check("searx.lan", ip("192.168.1.9")).is_ok());
        assert!(allow.check("other.lan", ip("192.168.1.9")).is_err());
        assert!(allow.check("anything", ip("8.8.8.8")).is_ok());
        let e = AllowList::default()
            .check("metadata", ip("169.254.169.254"))
            .unwrap_err();
        assert!(e.contains("metadata") && e.contains("--allow-net"), "{e}");
        assert!(AllowList::parse(["10.0.0.0/40"]).is_err());
        let mut origin = AllowList::default();
        origin.add_origin("127.0.0.1", 9000).unwrap();
        origin.add_origin("Svc.Lan", 80).unwrap();
        assert!(origin.check("127.0.0.1", ip("127.0.0.1")).is_err());
        assert!(origin.for_port(9000).check("127.0.0.1", ip("127.0.0.1")).is_ok());
        assert!(origin.for_port(9001).check("127.0.0.1", ip("127.0.0.1")).is_err());
        assert!(origin.for_port(80).check("svc.lan", ip("10.0.0.2")).is_ok());
        assert!(origin.for_port(9000).check("svc.lan", ip("10.0.0.2")).is_err());
        assert!(origin.add_origin("http://x", 80).is_err());
        assert!(AllowList::parse(["http://x"]).is_err());
    }
}
