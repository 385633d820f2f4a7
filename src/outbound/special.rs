//! Addresses that are not the public internet: the networks a participant URL reaches only
//! when an entry lists them explicitly.
//!
//! Two classes. The **always denied** (link-local, NAT64, cloud metadata services) are
//! refused under every policy, the permissive quick start included: they hand out a node's
//! credentials, or (NAT64) reach any IPv4 address through a translator. The **non-public**
//! (loopback, unspecified, private, shared, unique local, the transition forms) are refused
//! by the built-in policy of a server with tokens and by every entry of a policy file; only
//! `--auth none` on loopback without a file (the developer's quick start) lets them through.
//! Either way, only a CIDR *inside* the narrowest such network holding an address unlocks it
//! (`127.0.0.0/8` unlocks loopback; `0.0.0.0/0` unlocks nothing), so an operator allows
//! their own private participants on purpose, never by a wide catch-all.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use ipnet::IpNet;

/// Which policies refuse a network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Every policy.
    Always,
    /// Every policy but the quick start's.
    NonPublic,
}

const METADATA: &str = "a cloud metadata address";

/// The networks, with what they are (for messages). A metadata address sits inside a wider
/// network of the table: as the narrowest, it needs its own listing.
const SPECIAL: &[(&str, &str, Class)] = &[
    ("169.254.0.0/16", "link-local", Class::Always),
    ("fe80::/10", "link-local", Class::Always),
    (
        "64:ff9b::/96",
        "NAT64 (it reaches IPv4 hosts through a translator)",
        Class::Always,
    ),
    ("64:ff9b:1::/48", "local-use NAT64", Class::Always),
    // AWS, GCP, Azure, Oracle, DigitalOcean, OpenStack, Hetzner, Huawei, IBM...
    ("169.254.169.254/32", METADATA, Class::Always),
    // AWS: IMDS over IPv6, ECS task credentials, EKS Pod Identity (both families).
    ("fd00:ec2::254/128", METADATA, Class::Always),
    ("169.254.170.2/32", METADATA, Class::Always),
    ("169.254.170.23/32", METADATA, Class::Always),
    ("fd00:ec2::23/128", METADATA, Class::Always),
    // GCP over IPv6.
    ("fd20:ce::254/128", METADATA, Class::Always),
    // Azure's WireServer (a public-looking address every Azure VM reaches).
    ("168.63.129.16/32", METADATA, Class::Always),
    // Alibaba Cloud.
    ("100.100.100.200/32", METADATA, Class::Always),
    // Oracle Cloud's older address.
    ("192.0.0.192/32", METADATA, Class::Always),
    // Tencent Cloud.
    ("169.254.0.23/32", METADATA, Class::Always),
    // Scaleway (both families).
    ("169.254.42.42/32", METADATA, Class::Always),
    ("fd00:42::42/128", METADATA, Class::Always),
    // OpenStack over IPv6.
    ("fe80::a9fe:a9fe/128", METADATA, Class::Always),
    // 0.0.0.0 as a destination is this host.
    ("0.0.0.0/8", "this host's network", Class::NonPublic),
    ("127.0.0.0/8", "loopback", Class::NonPublic),
    ("10.0.0.0/8", "private", Class::NonPublic),
    ("172.16.0.0/12", "private", Class::NonPublic),
    ("192.168.0.0/16", "private", Class::NonPublic),
    (
        "100.64.0.0/10",
        "shared address space (CGNAT)",
        Class::NonPublic,
    ),
    (
        "192.0.0.0/24",
        "IETF protocol assignments",
        Class::NonPublic,
    ),
    ("198.18.0.0/15", "benchmarking", Class::NonPublic),
    ("224.0.0.0/4", "multicast", Class::NonPublic),
    ("240.0.0.0/4", "reserved", Class::NonPublic),
    ("::/128", "unspecified", Class::NonPublic),
    ("::1/128", "loopback", Class::NonPublic),
    ("::/96", "IPv4-compatible", Class::NonPublic),
    ("::ffff:0:0:0/96", "IPv4-translated", Class::NonPublic),
    ("100::/64", "discard-only", Class::NonPublic),
    ("2001::/32", "Teredo", Class::NonPublic),
    ("2002::/16", "6to4", Class::NonPublic),
    ("fc00::/7", "unique local", Class::NonPublic),
    ("fec0::/10", "site-local", Class::NonPublic),
    ("ff00::/8", "multicast", Class::NonPublic),
];

/// Host names of metadata services: refused unless listed in `hosts` exactly (their
/// addresses are refused anyway; the name is refused at registration already).
pub const DENIED_NAMES: [&str; 5] = [
    "metadata.google.internal",
    "metadata",
    "metadata.tencentyun.com",
    "instance-data",
    "instance-data.ec2.internal",
];

/// The network that refuses an address, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    pub net: IpNet,
    pub what: &'static str,
}

/// The narrowest network of the table holding `ip` that applies (`non_public`: whether
/// the non-public ones do), if any.
pub fn denied(ip: IpAddr, non_public: bool) -> Option<Denied> {
    static TABLE: LazyLock<Vec<(IpNet, &'static str, Class)>> = LazyLock::new(|| {
        SPECIAL
            .iter()
            .map(|&(net, what, class)| (net.parse().expect("a valid CIDR"), what, class))
            .collect()
    });
    TABLE
        .iter()
        .filter(|(net, _, class)| (non_public || *class == Class::Always) && net.contains(&ip))
        .max_by_key(|(net, _, _)| net.prefix_len())
        .map(|&(net, what, _)| Denied { net, what })
}

/// The IPv4 address an IPv6 address carries, in the forms that can deliver to it through
/// a tunnel or a translator: IPv4-compatible (`::a.b.c.d`), IPv4-translated
/// (`::ffff:0:a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`), 6to4 (`2002:aabb:ccdd::`) and
/// Teredo's client (the last 32 bits, inverted). IPv4-mapped addresses are judged as their
/// IPv4 address before this (`to_canonical`).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    match s {
        // `::` and `::1` are themselves, not IPv4 addresses.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, hi, lo] | [0, 0, 0, 0, 0xffff, 0, hi, lo] => Some(v4(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        [0x2001, 0, .., hi, lo] => Some(v4(!hi, !lo)),
        _ => None,
    }
}
