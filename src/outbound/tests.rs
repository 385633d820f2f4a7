//! The policy's matching, its file's checks, the resolver's filter and the redaction.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::policy::OutboundPolicy;
use super::redact_userinfo;
use super::resolve::filter;
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

#[test]
fn without_a_file_only_link_local_and_metadata_are_refused() {
    let none = OutboundPolicy::default();
    for url in [
        "http://127.0.0.1:9/x",
        "https://10.1.2.3/x",
        "http://payments.example.com/x",
        "http://[::1]:8080/x",
        "http://[fd00::1]/x",
    ] {
        assert_eq!(allowed(&none, "default", url), Ok(()), "{url}");
    }
    for (url, says) in [
        (
            "http://169.254.169.254/latest/meta-data",
            "169.254.169.254/32",
        ),
        ("http://169.254.1.2/x", "169.254.0.0/16"),
        ("http://[fe80::1]/x", "fe80::/10"),
        ("http://[fd00:ec2::254]/x", "fd00:ec2::254/128"),
        ("http://100.100.100.200/x", "100.100.100.200/32"),
        // The IPv4-mapped form reaches the same host.
        ("http://[::ffff:169.254.169.254]/x", "169.254.169.254/32"),
        // The URL parser reads every IPv4 form, so hex is the same address.
        ("http://0xa9fea9fe/x", "169.254.169.254/32"),
        ("http://metadata.google.internal/x", "metadata service"),
        ("http://METADATA./x", "metadata service"),
    ] {
        let refusal = allowed(&none, "default", url).unwrap_err();
        assert!(refusal.contains(says), "{url}: {refusal}");
    }
    assert!(addr(&none, "default", "169.254.169.254").is_err());
    assert!(addr(&none, "default", "10.0.0.1").is_ok());
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
    let refusal = allowed(&p, "default", "http://10.1.2.3:9/x").unwrap_err();
    assert_eq!(refusal, "address 10.1.2.3 is not in [default] cidrs");
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
    // An empty entry: anything but the always-denied.
    assert_eq!(allowed(&p, "open", "http://10.0.0.1/x"), Ok(()));
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
    let kept = filter(rule, "localhost", vec![at("::1"), at("127.0.0.1")]).unwrap();
    assert_eq!(kept, vec![at("127.0.0.1")]);
    let refusal = filter(
        rule,
        "rebound.example",
        vec![at("10.0.0.1"), at("169.254.169.254")],
    )
    .unwrap_err();
    assert_eq!(
        refusal.0,
        "host rebound.example: address 10.0.0.1 is not in [default] cidrs"
    );
    assert!(filter(rule, "empty.example", Vec::new()).is_err());
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

#[tokio::test]
async fn each_call_is_judged_by_its_tenants_entry_before_any_connection() {
    let policy = "[default]\n[tenants.acme]\ncidrs = [\"10.0.0.0/8\"]\n";
    let policy = Arc::new(OutboundPolicy::parse(policy).unwrap());
    let transport = HttpTransport::with_policy(1024, policy, &Default::default()).unwrap();
    // Port 1 on loopback: nothing listens, so a call that is let through fails to
    // connect, and one that is not never tries.
    let call = |tenant: &str, url: &str| CallRequest {
        gid: "g".into(),
        tenant: tenant.into(),
        kind: Kind::Saga,
        branch_id: "01".into(),
        action: Action::Action,
        url: url.into(),
        payload: String::new(),
        timeout: Duration::from_secs(5),
        headers: BTreeMap::new(),
        protocol: Protocol::Native,
        attempt: 1,
    };
    let detail = |result: CallResult| match result.outcome {
        CallOutcome::Unknown(detail) => detail,
        other => panic!("not unknown: {other:?}"),
    };
    let acme = detail(
        transport
            .call(&call("acme", "http://u:pw@127.0.0.1:1/x"))
            .await,
    );
    assert_eq!(
        acme,
        "outbound_denied: address 127.0.0.1 is not in [tenants.acme] cidrs"
    );
    let by_name = detail(transport.call(&call("acme", "http://localhost:1/x")).await);
    assert!(
        by_name.starts_with("outbound_denied: host localhost: address"),
        "{by_name}"
    );
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
