//! Who owns a transaction: owner tokens that are unique per process, and which leases a
//! starting process may take back.
//!
//! A token is `<node tag>:<instance>:<random>`. The node tag names the node (readable when
//! the name is short and plain, else shortened with a hash of the whole name, so that two
//! long names with a common prefix never share a tag); the instance is drawn when the
//! process starts, so two processes never share a token even under one node name; the
//! random part is new for every claim. A starting process releases the leases of earlier
//! instances of its node only when the node name is an identity the operator vouches for
//! (`--node`, e.g. a StatefulSet's pod name): a default name built from the host name can
//! be shared by live peers (pods of one Deployment), whose leases must be left alone.

use sha2::{Digest, Sha256};

/// Longest node tag; with the instance and the random part a token fits the 64-character
/// `owner_token` column.
const TAG_LEN: usize = 24;

/// The tag of a node name in owner tokens.
pub fn node_tag(node: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !node.is_empty() && node.len() <= TAG_LEN && node.chars().all(plain) {
        return node.to_owned();
    }
    let digest = Sha256::digest(node.as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let head: String = node
        .chars()
        .filter(|&c| plain(c))
        .take(TAG_LEN - 9)
        .collect();
    format!("{head}~{hash}")
}

/// A new instance id for this process.
pub fn new_instance() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The prefix every token of this node's processes starts with.
pub fn node_prefix(node: &str) -> String {
    format!("{}:", node_tag(node))
}

/// The prefix every token of this one process starts with.
pub fn instance_prefix(node: &str, instance: &str) -> String {
    format!("{}{instance}:", node_prefix(node))
}

/// A token for one claim by this process.
pub fn new_token(node: &str, instance: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{}{}", instance_prefix(node, instance), &random[..24])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_fit_the_column_and_differ_per_instance() {
        let long = "a-very-long-kubernetes-deployment-name-7d9f8c6b5-x2x4z";
        for node in ["idem-8686", long, "weird node:name/é", ""] {
            let t = new_token(node, &new_instance());
            assert!(t.len() <= 64, "{t}");
            assert!(t.starts_with(&node_prefix(node)));
        }
        let (a, b) = (new_instance(), new_instance());
        assert_ne!(a, b);
        assert!(!new_token("n", &a).starts_with(&format!("n:{b}")));
    }

    #[test]
    fn names_with_a_common_prefix_get_different_tags() {
        let a = "checkout-coordinator-7d9f8c6b5-x2x4z";
        let b = "checkout-coordinator-7d9f8c6b5-qq81m";
        assert_ne!(node_tag(a), node_tag(b));
        assert_eq!(node_tag("idem-8686"), "idem-8686");
        // A tag never contains the separator, so a prefix match is exact.
        assert!(!node_tag("a:b").contains(':'));
    }
}
