//! The tenant a coordinator call belongs to.
//!
//! A coordinator serves several tenants, and a gid is unique only within its tenant: two
//! tenants may both run `order-1` against one shared participant. The coordinator names
//! the call's tenant in the `Idem-Tenant` header (a call without it is the `default`
//! tenant's, as every call was before tenants existed), and the barrier keys its rows by
//! (tenant, gid, branch, op), so the two never share a row.
//!
//! Trust the header only as far as the call itself: behind signature verification that
//! covers the tenant, or on a network only the coordinator reaches.

use crate::error::InvalidCall;

/// The header that names a call's tenant (HTTP header names compare case-insensitively).
pub const TENANT_HEADER: &str = "idem-tenant";

/// The tenant of a call without [`TENANT_HEADER`], and of every barrier row written
/// before tenants existed; and the longest tenant name, which is how wide the barrier
/// table's `tenant` column is. The coordinator's own (`idem-types`).
pub use idem_types::{DEFAULT_TENANT, MAX_TENANT_LEN};

/// Checks a tenant name as the coordinator forms them: 1 to [`MAX_TENANT_LEN`] characters
/// of `a-z 0-9 _ -` ([`idem_types::is_tenant_name`]).
pub fn check_tenant(name: &str) -> Result<(), InvalidCall> {
    if idem_types::is_tenant_name(name) {
        Ok(())
    } else {
        Err(InvalidCall::Header {
            header: "Idem-Tenant",
            reason: format!("a tenant name is 1 to {MAX_TENANT_LEN} characters of a-z 0-9 _ -"),
        })
    }
}

/// The tenant named by a call's [`TENANT_HEADER`] values (all of them, in order): none
/// is the [`DEFAULT_TENANT`]; one is checked with [`check_tenant`]; more than one is
/// refused, since a call belongs to one tenant.
pub fn tenant_of<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Result<String, InvalidCall> {
    let (first, second) = (values.next(), values.next());
    let value = match (first, second) {
        (None, _) => return Ok(DEFAULT_TENANT.to_owned()),
        (Some(_), Some(_)) => {
            return Err(InvalidCall::Header {
                header: "Idem-Tenant",
                reason: "sent more than once".into(),
            });
        }
        (Some(value), None) => value,
    };
    let name = std::str::from_utf8(value).unwrap_or_default();
    check_tenant(name)?;
    Ok(name.to_owned())
}

/// [`tenant_of`] on a request's headers.
#[cfg(feature = "axum")]
pub fn tenant_from_headers(headers: &axum::http::HeaderMap) -> Result<String, InvalidCall> {
    tenant_of(headers.get_all(TENANT_HEADER).iter().map(|v| v.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_the_coordinators() {
        assert!(check_tenant("acme-eu_1").is_ok());
        assert!(check_tenant(&"a".repeat(MAX_TENANT_LEN)).is_ok());
        for bad in [
            "",
            "Acme",
            "a/b",
            "a b",
            "a:b",
            "ä",
            &"a".repeat(MAX_TENANT_LEN + 1),
        ] {
            assert!(
                matches!(
                    check_tenant(bad),
                    Err(InvalidCall::Header {
                        header: "Idem-Tenant",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_header_names_the_tenant_and_its_absence_the_default() {
        let one = |v: &'static str| tenant_of([v.as_bytes()].into_iter());
        assert_eq!(tenant_of(std::iter::empty()).unwrap(), DEFAULT_TENANT);
        assert_eq!(one("acme").unwrap(), "acme");
        assert_eq!(one("default").unwrap(), DEFAULT_TENANT);
        assert!(one("").is_err());
        assert!(one("ACME").is_err());
        assert!(tenant_of([&b"\xff"[..]].into_iter()).is_err());
        assert!(tenant_of([&b"acme"[..], &b"acme"[..]].into_iter()).is_err());
    }

    #[cfg(feature = "axum")]
    #[test]
    fn headers_are_read_case_insensitively() {
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(tenant_from_headers(&headers).unwrap(), DEFAULT_TENANT);
        headers.insert("Idem-Tenant", "beta".parse().unwrap());
        assert_eq!(tenant_from_headers(&headers).unwrap(), "beta");
        headers.append("idem-tenant", "acme".parse().unwrap());
        assert!(tenant_from_headers(&headers).is_err());
    }
}
