//! The policy's matching, its file's checks, the resolver's filter and the redaction.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::own::OwnListeners;
use super::policy::OutboundPolicy;
use super::redact_userinfo;
use super::resolve::filter;
use super::special::embedded_v4;
use crate::core::{Action, CallOutcome, Kind, Protocol};
use crate::transport::{CallRequest, CallResult, HttpTransport, Transport};

fn policy(text: &str) -> OutboundPolicy {
    OutboundPolicy::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn allowed(policy: &OutboundPolicy, tenant: &str, url: &str) -> Result<(), String> {
    policy.check_url(tenant, url).map_err(|r| r.0)
}

fn addr(policy: &OutboundPolicy, tenant: &str, ip: &str) -> Result<(), String> {
    let (_, rule) = policy.rule_for(tenant);
    rule.check_addr(ip.parse().unwrap()).map_err(|r| r.0)
}

/// The built-in entry of a server with tokens, and the quick start's.
fn built_ins() -> (OutboundPolicy, OutboundPolicy) {
    let none = OutboundPolicy::default();
    let quick = none.in_force(true, &OwnListeners::default());
    (none.in_force(false, &OwnListeners::default()), quick)
}

#[test]
fn without_a_file_only_public_addresses_are_allowed() {
    let (strict, quick) = built_ins();
    for url in [
        "http://payments.example.com/x",
        "https://203.0.113.9/x",
        "http://[2001:4860::8888]:8080/x",
        // A name is judged on its addresses when it is called.
        "http://localhost:9/x",
    ] {
        assert_eq!(allowed(&strict, "default", url), Ok(()), "{url}");
        assert_eq!(allowed(&quick, "default", url), Ok(()), "{url}");
    }
    for (url, says) in [
        ("http://127.0.0.1:9/x", "is loopback (127.0.0.0/8)"),
        ("http://127.1.2.3/x", "is loopback"),
        ("http://[::1]:8080/x", "is loopback (::1/128)"),
        ("http://0.0.0.0:9/x", "is this host's network (0.0.0.0/8)"),
        ("http://[::]:9/x", "is unspecified (::/128)"),
        ("https://10.1.2.3/x", "is private (10.0.0.0/8)"),
        ("http://172.16.0.1/x", "is private (172.16.0.0/12)"),
        ("http://192.168.1.1/x", "is private (192.168.0.0/16)"),
        (
            "http://100.64.0.1/x",
            "is shared address space (CGNAT) (100.64.0.0/10)",
        ),
        ("http://[fd00::1]/x", "is unique local (fc00::/7)"),
        ("http://[fec0::1]/x", "is site-local"),
        ("http://198.18.0.1/x", "is benchmarking"),
        ("http://[ff02::1]/x", "is multicast"),
        // IPv6 forms that carry an IPv4 address are judged as it too.
        (
            "http://[::ffff:127.0.0.1]/x",
            "address 127.0.0.1 is loopback",
        ),
        ("http://[::ffff:10.0.0.1]/x", "address 10.0.0.1 is private"),
        (
            "http://[::127.0.0.1]/x",
            "carries 127.0.0.1, which is loopback",
        ),
        ("http://[::cb00:7109]/x", "is IPv4-compatible (::/96)"),
        (
            "http://[2002:7f00:1::1]/x",
            "carries 127.0.0.1, which is loopback",
        ),
        ("http://[2002:cb00:7109::1]/x", "is 6to4 (2002::/16)"),
        (
            "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/x",
            "carries 127.0.0.1",
        ),
        (
            "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/x",
            "is Teredo (2001::/32)",
        ),
        // The URL parser reads every IPv4 form, so these are 127.0.0.1 too.
        ("http://2130706433/x", "address 127.0.0.1 is loopback"),
        ("http://0x7f.1/x", "address 127.0.0.1 is loopback"),
    ] {
        let refusal = allowed(&strict, "default", url).unwrap_err();
        assert!(refusal.contains(says), "{url}: {refusal}");
        assert!(
            refusal.contains("denied unless [built-in] cidrs"),
            "{refusal}"
        );
        // The quick start (--auth none on loopback) lets this host and private networks
        // through.
        assert_eq!(allowed(&quick, "default", url), Ok(()), "{url}");
    }
    // Refused by both: link-local, NAT64, metadata addresses and names, and IPv6 forms
    // that carry one of them.
    for (url, says) in [
        (
            "http://169.254.169.254/latest/meta-data",
            "metadata address (169.254.169.254/32)",
        ),
        ("http://169.254.1.2/x", "is link-local (169.254.0.0/16)"),
        ("http://[fe80::1]/x", "is link-local (fe80::/10)"),
        ("http://[64:ff9b::7f00:1]/x", "denied unless"),
        ("http://[64:ff9b::cb00:7109]/x", "is NAT64"),
        ("http://[64:ff9b::a9fe:a9fe]/x", "carries 169.254.169.254"),
        ("http://[64:ff9b:1::1]/x", "is local-use NAT64"),
        (
            "http://[fd00:ec2::254]/x",
            "metadata address (fd00:ec2::254/128)",
        ),
        ("http://[fd00:ec2::23]/x", "metadata address"),
        (
            "http://[fd20:ce::254]/x",
            "metadata address (fd20:ce::254/128)",
        ),
        (
            "http://100.100.100.200/x",
            "metadata address (100.100.100.200/32)",
        ),
        (
            "http://169.254.170.2/v2/credentials",
            "metadata address (169.254.170.2/32)",
        ),
        ("http://169.254.170.23/x", "metadata address"),
        ("http://192.0.0.192/x", "metadata address (192.0.0.192/32)"),
        (
            "http://168.63.129.16/machine",
            "metadata address (168.63.129.16/32)",
        ),
        (
            "http://[::ffff:169.254.169.254]/x",
            "address 169.254.169.254 is a cloud",
        ),
        ("http://0xa9fea9fe/x", "address 169.254.169.254 is a cloud"),
        (
            "http://[2002:a9fe:a9fe::]/x",
            "carries 169.254.169.254, which is a cloud",
        ),
        (
            "http://[::a9fe:a9fe]/x",
            "carries 169.254.169.254, which is a cloud",
        ),
        ("http://metadata.google.internal/x", "metadata service"),
        ("http://METADATA./x", "metadata service"),
        ("http://instance-data/x", "metadata service"),
    ] {
        for policy in [&strict, &quick] {
            let refusal = allowed(policy, "default", url).unwrap_err();
            assert!(refusal.contains(says), "{url}: {refusal}");
        }
    }
}

#[test]
fn ipv6_forms_carry_their_ipv4_address() {
    let carried = |ip: &str| embedded_v4(ip.parse().unwrap()).map(|v4| v4.to_string());
    assert_eq!(carried("::7f00:1").as_deref(), Some("127.0.0.1"));
    assert_eq!(carried("::ffff:0:a00:1").as_deref(), Some("10.0.0.1"));
    assert_eq!(
        carried("64:ff9b::a9fe:a9fe").as_deref(),
        Some("169.254.169.254")
    );
    assert_eq!(carried("2002:c000:0204::1").as_deref(), Some("192.0.2.4"));
    // Teredo: the client's address, inverted.
    let teredo = "2001:0:4136:e378:8000:63bf:3fff:fdd2";
    assert_eq!(carried(teredo).as_deref(), Some("192.0.2.45"));
    for none in ["::", "::1", "2001:4860::8888", "fd00::1"] {
        assert_eq!(carried(none), None, "{none}");
    }
}

#[test]
fn a_non_public_network_opens_only_to_a_cidr_inside_it() {
    let wide = policy("[default]\ncidrs = [\"0.0.0.0/0\", \"::/0\"]\n");
    for ip in ["10.0.0.1", "127.0.0.1", "::1", "fd00::1", "100.64.0.1"] {
        let refusal = addr(&wide, "default", ip).unwrap_err();
        assert!(
            refusal.contains("denied unless [default] cidrs lists a network inside"),
            "{refusal}"
        );
    }
    assert!(addr(&wide, "default", "203.0.113.9").is_ok());
    let narrow = policy("[default]\ncidrs = [\"10.1.0.0/16\", \"127.0.0.0/8\", \"0.0.0.0/0\"]\n");
    assert!(addr(&narrow, "default", "10.1.2.3").is_ok());
    assert!(addr(&narrow, "default", "127.0.0.1").is_ok());
    assert!(addr(&narrow, "default", "::ffff:127.0.0.1").is_ok());
    assert!(addr(&narrow, "default", "203.0.113.9").is_ok());
    let refusal = addr(&narrow, "default", "10.2.0.1").unwrap_err();
    assert!(refusal.contains("is private (10.0.0.0/8)"), "{refusal}");
    // A names-only entry is judged on every address too.
    let names = policy("[default]\nhosts = [\"localhost\"]\n");
    assert!(addr(&names, "default", "127.0.0.1").is_err());
    assert!(addr(&names, "default", "::1").is_err());
    assert!(addr(&names, "default", "203.0.113.9").is_ok());
}

#[test]
fn idems_own_listeners_are_refused_under_every_policy() {
    let own = OwnListeners::default();
    own.add("127.0.0.1:48686".parse().unwrap());
    let (strict, quick) = built_ins();
    let open = policy("[default]\ncidrs = [\"127.0.0.0/8\", \"::1\", \"0.0.0.0/8\", \"::/128\"]\n");
    for base in [&strict, &quick, &open] {
        let p = base.in_force(true, &own);
        for url in [
            "http://0.0.0.0:48686/api/v1/tokens",
            "http://127.0.0.1:48686/x",
            "http://127.0.0.2:48686/x",
            "http://[::]:48686/x",
            "http://[::1]:48686/x",
            "http://[::ffff:127.0.0.1]:48686/x",
            "http://localhost:48686/x",
            "http://LOCALHOST.:48686/x",
            "http://api.localhost:48686/x",
        ] {
            let refusal = allowed(&p, "default", url).unwrap_err();
            assert_eq!(
                refusal,
                "port 48686 on this host is idem's own API, never a participant"
            );
        }
    }
    // Another port on loopback: the quick start's, and an entry listing it.
    let quick = quick.in_force(true, &own);
    assert_eq!(
        allowed(&quick, "default", "http://127.0.0.1:48687/x"),
        Ok(())
    );
    assert_eq!(
        allowed(&quick, "default", "http://localhost:48687/x"),
        Ok(())
    );
    let open = open.in_force(false, &own);
    assert_eq!(
        allowed(&open, "default", "http://127.0.0.1:48687/x"),
        Ok(())
    );
    // Elsewhere, idem's port is anybody's.
    let strict = strict.in_force(false, &own);
    assert_eq!(
        allowed(&strict, "default", "http://203.0.113.9:48686/x"),
        Ok(())
    );
    assert_eq!(
        allowed(&strict, "default", "http://orders.example:48686/x"),
        Ok(())
    );
}

#[test]
fn denied_addresses_open_only_to_a_cidr_inside_them() {
    let p = policy(
        r#"
        [default]
        cidrs = ["0.0.0.0/0", "::/0"]
        [tenants.cloud]
        cidrs = ["169.254.169.254/32", "169.254.0.0/16", "fe80::/64"]
        "#,
    );
    // A wide network is not an explicit listing.
    assert!(addr(&p, "default", "169.254.169.254").is_err());
    assert!(addr(&p, "default", "fe80::1").is_err());
    assert!(addr(&p, "default", "8.8.8.8").is_ok());
    assert!(addr(&p, "cloud", "169.254.169.254").is_ok());
    assert!(addr(&p, "cloud", "169.254.3.4").is_ok());
    assert!(addr(&p, "cloud", "fe80::1").is_ok());
    // Inside its link-local network, but a metadata address needs its own listing.
    let narrow = policy("[default]\ncidrs = [\"169.254.0.0/16\"]\n");
    assert!(addr(&narrow, "default", "169.254.7.7").is_ok());
    assert!(addr(&narrow, "default", "169.254.169.254").is_err());
    // The metadata names open only to an exact host entry.
    let names = policy("[default]\nhost_suffixes = [\".internal\"]\n");
    assert!(allowed(&names, "default", "http://metadata.google.internal/").is_err());
    assert!(allowed(&names, "default", "http://billing.internal/").is_ok());
    let listed = policy("[default]\nhosts = [\"metadata.google.internal\"]\n");
    assert!(allowed(&listed, "default", "http://metadata.google.internal/").is_ok());
}

#[test]
fn cidrs_judge_ip_literals_and_resolved_addresses() {
    let p = policy("[default]\ncidrs = [\"127.0.0.0/8\", \"::1\"]\n");
    assert_eq!(allowed(&p, "default", "http://127.0.0.1:9/x"), Ok(()));
    assert_eq!(allowed(&p, "default", "http://[::1]:9/x"), Ok(()));
    let refusal = allowed(&p, "default", "http://203.0.113.9:9/x").unwrap_err();
    assert_eq!(refusal, "address 203.0.113.9 is not in [default] cidrs");
    let refusal = allowed(&p, "default", "http://10.1.2.3:9/x").unwrap_err();
    assert_eq!(
        refusal,
        "address 10.1.2.3 is private (10.0.0.0/8), denied unless [default] cidrs lists a \
         network inside 10.0.0.0/8"
    );
    // No names listed: any name, its addresses judged when it is called.
    assert_eq!(allowed(&p, "default", "http://anything.example/x"), Ok(()));
    assert!(addr(&p, "default", "10.0.0.1").is_err());
    assert!(addr(&p, "default", "127.3.2.1").is_ok());
}

#[test]
fn names_match_exactly_or_by_suffix_case_insensitively() {
    let p = policy(
        r#"
        [default]
        hosts = ["Payments.Example.com."]
        host_suffixes = [".svc.cluster.local"]
        "#,
    );
    for url in [
        "http://payments.example.com/x",
        "http://PAYMENTS.example.com./x",
        "http://orders.shop.svc.cluster.local:8080/x",
    ] {
        assert_eq!(allowed(&p, "default", url), Ok(()), "{url}");
    }
    for url in [
        "http://other.example.com/x",
        "http://svc.cluster.local/x",
        "http://evil-svc.cluster.local/x",
        "http://payments.example.com.evil/x",
    ] {
        let refusal = allowed(&p, "default", url).unwrap_err();
        assert!(
            refusal.contains("is not in [default] hosts"),
            "{url}: {refusal}"
        );
    }
    // Names listed without CIDRs: an IP literal would go around them.
    let refusal = allowed(&p, "default", "http://127.0.0.1/x").unwrap_err();
    assert!(refusal.contains("lists no cidrs"), "{refusal}");
    // Names and CIDRs: both must pass (the address when it is called).
    let both = policy("[default]\nhosts = [\"localhost\"]\ncidrs = [\"10.0.0.0/8\"]\n");
    assert_eq!(allowed(&both, "default", "http://localhost:1/x"), Ok(()));
    assert!(addr(&both, "default", "127.0.0.1").is_err());
}

#[test]
fn schemes_and_ports() {
    let p = policy("[default]\nschemes = [\"https\"]\nports = [443, 8443]\n");
    assert_eq!(allowed(&p, "default", "https://h/x"), Ok(()));
    assert_eq!(allowed(&p, "default", "https://h:8443/x"), Ok(()));
    let refusal = allowed(&p, "default", "http://h:443/x").unwrap_err();
    assert_eq!(
        refusal,
        "scheme http is not in [default] schemes [\"https\"]"
    );
    let refusal = allowed(&p, "default", "https://h:444/x").unwrap_err();
    assert_eq!(refusal, "port 444 is not in [default] ports [443, 8443]");
    // The default port counts as the URL's port.
    let http = policy("[default]\nports = [80]\n");
    assert_eq!(allowed(&http, "default", "http://h/x"), Ok(()));
    assert!(allowed(&http, "default", "https://h/x").is_err());
    // No scheme at all: a tenant that may call nothing.
    let nothing = policy("[default]\nschemes = []\n");
    assert!(allowed(&nothing, "default", "http://h/x").is_err());
}

#[test]
fn a_tenant_with_its_own_entry_gets_it_the_rest_get_the_default() {
    let p = policy(
        r#"
        [default]
        cidrs = ["127.0.0.0/8"]
        [tenants.acme]
        hosts = ["api.acme.example"]
        ports = [443]
        [tenants.open]
        "#,
    );
    let (index, rule) = p.rule_for("acme");
    assert_eq!((index, rule.name.as_str()), (1, "tenants.acme"));
    assert_eq!(p.rule_for("nobody").1.name, "default");
    assert_eq!(p.rule_for("nobody").0, 0);
    assert_eq!(p.rule_for("open").1.name, "tenants.open");
    assert_eq!(allowed(&p, "acme", "https://api.acme.example/x"), Ok(()));
    assert!(allowed(&p, "acme", "http://127.0.0.1/x").is_err());
    assert!(allowed(&p, "default", "https://api.acme.example/x").is_ok());
    assert!(addr(&p, "default", "10.0.0.1").is_err());
    assert!(allowed(&p, "nobody", "http://10.0.0.1/x").is_err());
    // An empty entry: any public address.
    assert_eq!(allowed(&p, "open", "http://203.0.113.9/x"), Ok(()));
    assert!(allowed(&p, "open", "http://10.0.0.1/x").is_err());
    assert!(allowed(&p, "open", "http://169.254.169.254/x").is_err());
}

#[test]
fn bad_files_name_what_is_wrong() {
    for (text, says) in [
        ("[default]\nhots = [\"h\"]\n", "unknown field `hots`"),
        ("[default]\n[tenants.a]\nports = [\"x\"]\n", "invalid type"),
        ("[tenants.a]\n", "a [default] table is required"),
        ("[default]\n[other]\n", "unknown field `other`"),
        (
            "[default]\ncidrs = [\"10.0.0.0/33\"]\n",
            "[default] cidrs: \"10.0.0.0/33\"",
        ),
        (
            "[default]\nschemes = [\"ftp\"]\n",
            "[default] schemes: \"ftp\"",
        ),
        (
            "[default]\nhost_suffixes = [\"example.com\"]\n",
            "must start with a dot",
        ),
        ("[default]\nhosts = [\"\"]\n", "an empty host name"),
        ("[default]\nports = [0]\n", "0 is not a port"),
        ("[default]\nports = [70000]\n", "line 2 (`ports = [70000]`)"),
        ("[default]\n[tenants.Big]\n", "[tenants.Big]: a tenant name"),
    ] {
        let error = OutboundPolicy::parse(text).unwrap_err();
        assert!(error.contains(says), "{text:?}: {error}");
    }
    // Host bits are cleared, a bare address is its own network.
    let p = policy("[default]\ncidrs = [\"10.1.2.3/8\", \"192.0.2.7\"]\n");
    assert!(addr(&p, "default", "10.200.0.1").is_ok());
    assert!(addr(&p, "default", "192.0.2.7").is_ok());
    assert!(addr(&p, "default", "192.0.2.8").is_err());
}

#[test]
fn the_resolver_keeps_the_allowed_addresses_or_refuses() {
    let p = policy("[default]\ncidrs = [\"127.0.0.0/8\"]\n");
    let (_, rule) = p.rule_for("default");
    let at = |ip: &str| SocketAddr::new(ip.parse::<IpAddr>().unwrap(), 0);
    let kept = filter(rule, "localhost", vec![at("::1"), at("127.0.0.1")], false).unwrap();
    assert_eq!(kept, vec![at("127.0.0.1")]);
    // The refusal does not say where the name pointed: the client would learn how names
    // resolve inside idem's network.
    let refusal = filter(
        rule,
        "rebound.example",
        vec![at("10.0.0.1"), at("169.254.169.254")],
        false,
    )
    .unwrap_err();
    assert_eq!(
        refusal.0,
        "host rebound.example: none of its addresses is allowed by [default] (idem's log \
         names the first)"
    );
    assert!(filter(rule, "empty.example", Vec::new(), false).is_err());
    // On one of idem's own ports, this host's addresses are dropped whatever the entry.
    let own = filter(rule, "localhost", vec![at("127.0.0.1"), at("::1")], true);
    assert!(own.is_err(), "{own:?}");
    let elsewhere = filter(rule, "h", vec![at("127.0.0.1"), at("203.0.113.9")], true);
    assert!(elsewhere.is_err(), "outside the cidrs: {elsewhere:?}");
}

#[test]
fn userinfo_is_redacted_wherever_a_url_appears() {
    for (text, shown) in [
        ("http://u:p@h:1/x?y=a@b", "http://***@h:1/x?y=a@b"),
        ("https://user@h/", "https://***@h/"),
        ("http://u:p%40ss@w@h", "http://***@h"),
        ("http://***@h/x", "http://***@h/x"),
        (
            "connection failed: error sending request for url (http://a:b@127.0.0.1:9/x)",
            "connection failed: error sending request for url (http://***@127.0.0.1:9/x)",
        ),
        (
            "HTTP 307: redirect to https://k:s@elsewhere/x, then http://c:d@more#f",
            "HTTP 307: redirect to https://***@elsewhere/x, then http://***@more#f",
        ),
        (
            "http://h/x?mail=me@example.com",
            "http://h/x?mail=me@example.com",
        ),
        ("no URL, just me@example.com", "no URL, just me@example.com"),
    ] {
        assert_eq!(redact_userinfo(text), shown, "{text}");
    }
    assert!(matches!(
        redact_userinfo("http://h/x"),
        std::borrow::Cow::Borrowed(_)
    ));
}

fn call(tenant: &str, url: &str) -> CallRequest {
    CallRequest {
        gid: "g".into(),
        tenant: tenant.into(),
        kind: Kind::Saga,
        branch_id: "01".into(),
        action: Action::Action,
        url: url.into(),
        payload: Default::default(),
        timeout: Duration::from_secs(5),
        headers: BTreeMap::new(),
        protocol: Protocol::Native,
        attempt: 1,
    }
}

fn detail(result: CallResult) -> String {
    match result.outcome {
        CallOutcome::Unknown(detail) => detail,
        other => panic!("not unknown: {other:?}"),
    }
}

#[tokio::test]
async fn each_call_is_judged_by_its_tenants_entry_before_any_connection() {
    let policy = "[default]\ncidrs = [\"127.0.0.0/8\"]\n[tenants.acme]\ncidrs = [\"10.0.0.0/8\"]\n\
                  [tenants.names]\nhosts = [\"localhost\"]\n";
    let policy = Arc::new(OutboundPolicy::parse(policy).unwrap());
    let transport = HttpTransport::with_policy(1024, policy, &Default::default()).unwrap();
    // Port 1 on loopback: nothing listens, so a call that is let through fails to
    // connect, and one that is not never tries.
    let acme = detail(
        transport
            .call(&call("acme", "http://u:pw@127.0.0.1:1/x"))
            .await,
    );
    assert_eq!(
        acme,
        "outbound_denied: address 127.0.0.1 is loopback (127.0.0.0/8), denied unless \
         [tenants.acme] cidrs lists a network inside 127.0.0.0/8"
    );
    // By name: the entry's every address is judged, one that lists only names included.
    for tenant in ["acme", "names"] {
        let by_name = detail(transport.call(&call(tenant, "http://localhost:1/x")).await);
        assert!(
            by_name.starts_with("outbound_denied: host localhost: none of its addresses"),
            "{by_name}"
        );
    }
    let default = detail(
        transport
            .call(&call("other", "http://u:pw@127.0.0.1:1/x"))
            .await,
    );
    assert!(default.starts_with("connection failed"), "{default}");
    assert!(!default.contains("pw"), "{default}");
    let metadata = detail(
        transport
            .call(&call("other", "http://169.254.169.254/latest"))
            .await,
    );
    assert!(
        metadata.starts_with("outbound_denied: address 169.254.169.254"),
        "{metadata}"
    );
}

#[tokio::test]
async fn a_call_to_idems_own_port_is_refused_without_a_connection() {
    // A listener standing in for idem's API: it must never see a connection.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let own = OwnListeners::default();
    own.add(listener.local_addr().unwrap());
    let open = OutboundPolicy::parse("[default]\ncidrs = [\"127.0.0.0/8\", \"::1\"]\n").unwrap();
    for base in [open, OutboundPolicy::default()] {
        for quick_start in [false, true] {
            let policy = Arc::new(base.in_force(quick_start, &own));
            let transport = HttpTransport::with_policy(1024, policy, &Default::default()).unwrap();
            for host in [
                "127.0.0.1",
                "0.0.0.0",
                "[::]",
                "localhost",
                "[::ffff:127.0.0.1]",
            ] {
                let url = format!("http://{host}:{port}/api/v1/tokens");
                let refused = detail(transport.call(&call("default", &url)).await);
                assert!(refused.starts_with("outbound_denied: "), "{url}: {refused}");
            }
        }
    }
    assert_eq!(
        listener.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "idem's own port was called"
    );
}
