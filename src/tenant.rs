//! Tenants: every transaction belongs to one, and its gid is unique only within it.
//!
//! The storage key of a transaction is its gid for the default tenant and
//! `<tenant>/<gid>` for any other. Neither a gid nor a tenant name may contain `/`, so
//! two tenants' keys never collide and the default tenant's keys are the gids rows had
//! before tenants existed (DTM clients keep their wire format). Participants are always
//! called with the client's own gid; the key is the coordinator's business.

/// The tenant of requests that carry no token (loopback-only or `--insecure` mode), of
/// the DTM door's configured default, and of every row stored before tenants existed; and
/// the longest tenant name. Shared with the participant SDK (`idem-types`).
pub use idem_types::{DEFAULT_TENANT, MAX_TENANT_LEN};

/// A tenant name: 1 to [`MAX_TENANT_LEN`] characters of `a-z 0-9 _ -`.
pub fn check_tenant(name: &str) -> Result<(), String> {
    if idem_types::is_tenant_name(name) {
        Ok(())
    } else {
        Err(format!(
            "a tenant name is 1 to {MAX_TENANT_LEN} characters of a-z 0-9 _ - (got {name:?})"
        ))
    }
}

/// The storage key of `gid` in `tenant`.
pub fn scoped_key(tenant: &str, gid: &str) -> String {
    if tenant == DEFAULT_TENANT {
        gid.to_owned()
    } else {
        format!("{tenant}/{gid}")
    }
}

/// The tenant and the client's gid of a storage key.
pub fn split_key(key: &str) -> (&str, &str) {
    match key.split_once('/') {
        Some((tenant, gid)) => (tenant, gid),
        None => (DEFAULT_TENANT, key),
    }
}

/// The client's gid of a storage key.
pub fn client_gid(key: &str) -> &str {
    split_key(key).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_never_collide() {
        assert_eq!(scoped_key(DEFAULT_TENANT, "order-1"), "order-1");
        assert_eq!(scoped_key("acme", "order-1"), "acme/order-1");
        assert_eq!(split_key("acme/order-1"), ("acme", "order-1"));
        assert_eq!(split_key("order-1"), (DEFAULT_TENANT, "order-1"));
        assert_ne!(scoped_key("acme", "x"), scoped_key("acm", "e/x"));
        assert_eq!(client_gid("acme/a:b"), "a:b");
    }

    #[test]
    fn tenant_names() {
        assert!(check_tenant("acme-eu_1").is_ok());
        assert!(check_tenant("").is_err());
        assert!(check_tenant("Acme").is_err());
        assert!(check_tenant("a/b").is_err());
        assert!(check_tenant(&"a".repeat(MAX_TENANT_LEN)).is_ok());
        assert!(check_tenant(&"a".repeat(MAX_TENANT_LEN + 1)).is_err());
    }
}
