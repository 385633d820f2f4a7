//! The key of a guarded step: the coordinator's call to one branch, named by its protocol,
//! tenant, gid, branch and op. [`BranchCall`] is that key, once: the axum extractor parses
//! it ([`crate::http`]), a [`Barrier`](crate::Barrier) is built on it, and a barrier
//! step's transaction ([`StepTx`](crate::StepTx)) carries it to the closure.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::InvalidCall;
use crate::tenant::{DEFAULT_TENANT, check_tenant};

/// Longest gid and branch id accepted, in characters; the barrier table's columns are this
/// wide, and so are the coordinator's.
pub const MAX_ID_LEN: usize = 128;

/// The branch id of a two-phase message's local transaction (DTM's convention).
pub const MSG_BRANCH_ID: &str = "00";

/// The protocol of the global transaction a call belongs to (`trans_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransType {
    /// Try-Confirm-Cancel.
    Tcc,
    /// Actions with compensations.
    Saga,
    /// A two-phase message.
    Msg,
}

impl TransType {
    /// The name in callbacks and the barrier table.
    pub fn as_str(self) -> &'static str {
        match self {
            TransType::Tcc => "tcc",
            TransType::Saga => "saga",
            TransType::Msg => "msg",
        }
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<TransType> {
        match s {
            "tcc" => Some(TransType::Tcc),
            "saga" => Some(TransType::Saga),
            "msg" => Some(TransType::Msg),
            _ => None,
        }
    }

    /// Whether `op` belongs to this protocol: a `cancel` in a saga is a caller bug, and
    /// guarding it would write barrier rows no real call ever matches.
    pub fn allows(self, op: Op) -> bool {
        matches!(
            (self, op),
            (TransType::Tcc, Op::Try | Op::Confirm | Op::Cancel)
                | (TransType::Saga, Op::Action | Op::Compensate)
                | (TransType::Msg, Op::Action | Op::Msg)
        )
    }
}

impl fmt::Display for TransType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation the coordinator asks for (`op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// TCC phase one.
    Try,
    /// TCC phase two after a commit.
    Confirm,
    /// TCC phase two after an abort.
    Cancel,
    /// A saga or msg forward step.
    Action,
    /// A saga step's undo.
    Compensate,
    /// DTM's name for the local transaction of a two-phase message, and for the
    /// coordinator's check whether it committed (see [`crate::query_prepared`]).
    Msg,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 6] = [
        Op::Try,
        Op::Confirm,
        Op::Cancel,
        Op::Action,
        Op::Compensate,
        Op::Msg,
    ];

    /// The name in callbacks and the barrier table.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Try => "try",
            Op::Confirm => "confirm",
            Op::Cancel => "cancel",
            Op::Action => "action",
            Op::Compensate => "compensate",
            Op::Msg => "msg",
        }
    }

    /// The operation named `s`, if any.
    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == s)
    }

    /// The forward op this op undoes: Cancel undoes Try, compensate undoes action.
    pub fn origin(self) -> Option<Op> {
        match self {
            Op::Cancel => Some(Op::Try),
            Op::Compensate => Some(Op::Action),
            _ => None,
        }
    }

    /// The forward op that must have run (and committed) before this one may run: a TCC
    /// Confirm needs its Try. Nothing else has one: a compensation before its forward op
    /// is an empty rollback instead, and an action or msg starts its branch.
    pub fn prerequisite(self) -> Option<Op> {
        match self {
            Op::Confirm => Some(Op::Try),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The coordinator's call to one branch: `trans_type`, `gid`, `branch_id`, `op` and the
/// call's tenant ([`crate::tenant`]); the key every guarded step of the call is stored
/// under (a gid is unique only within its tenant).
///
/// With the `axum` feature it is an extractor too ([`crate::http`]): it answers a call that
/// lacks a parameter, or has one that is unknown or too long, or a malformed tenant, with
/// 400 and a JSON body naming the parameter or header. The tenant is the signed one when
/// [`require_signature`](crate::signature::require_signature) verified a v2 signature,
/// else the `Idem-Tenant` header (which anyone reaching the service can set), else the
/// default tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchCall {
    trans_type: TransType,
    tenant: Cow<'static, str>,
    gid: String,
    branch_id: String,
    op: Op,
}

impl BranchCall {
    /// The call named by these parameters, in the default tenant
    /// ([`BranchCall::with_tenant`] names another). Refuses an empty or overlong id, and an
    /// op that is not one of `trans_type`'s.
    pub fn new(
        trans_type: TransType,
        gid: impl Into<String>,
        branch_id: impl Into<String>,
        op: Op,
    ) -> Result<BranchCall, InvalidCall> {
        let (gid, branch_id) = (gid.into(), branch_id.into());
        check_id("gid", &gid)?;
        check_id("branch_id", &branch_id)?;
        if !trans_type.allows(op) {
            return Err(InvalidCall::Invalid {
                param: "op",
                reason: format!("`{op}` is not an operation of a {trans_type} transaction"),
            });
        }
        Ok(BranchCall {
            trans_type,
            tenant: Cow::Borrowed(DEFAULT_TENANT),
            gid,
            branch_id,
            op,
        })
    }

    /// A two-phase message's local transaction, which [`crate::query_prepared`] looks for:
    /// branch `00`, op `msg`.
    pub fn msg(gid: impl Into<String>) -> Result<BranchCall, InvalidCall> {
        BranchCall::new(TransType::Msg, gid, MSG_BRANCH_ID, Op::Msg)
    }

    /// Parses the parameters from `(name, value)` pairs (already percent-decoded), in the
    /// default tenant ([`BranchCall::with_tenant`] names another).
    /// Unknown parameters are ignored (DTM's clients add their own, such as `dtm`).
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<BranchCall, InvalidCall> {
        let (mut gid, mut trans_type, mut branch_id, mut op) = (None, None, None, None);
        for (name, value) in pairs {
            match name {
                "gid" => gid = Some(value),
                "trans_type" => trans_type = Some(value),
                "branch_id" => branch_id = Some(value),
                "op" => op = Some(value),
                _ => {}
            }
        }
        let present = |value: Option<&'a str>, name| {
            value
                .filter(|v| !v.is_empty())
                .ok_or(InvalidCall::Missing(name))
        };
        let gid = present(gid, "gid")?;
        let trans_type_text = present(trans_type, "trans_type")?;
        let branch_id = present(branch_id, "branch_id")?;
        let op_text = present(op, "op")?;
        // The ids first: a call with a bad id and a bad kind is answered about its id.
        check_id("gid", gid)?;
        check_id("branch_id", branch_id)?;
        let trans_type = TransType::parse(trans_type_text).ok_or_else(|| InvalidCall::Invalid {
            param: "trans_type",
            reason: format!("`{trans_type_text}` is not one of tcc, saga, msg"),
        })?;
        let op = Op::parse(op_text).ok_or_else(|| InvalidCall::Invalid {
            param: "op",
            reason: format!(
                "`{op_text}` is not one of try, confirm, cancel, action, compensate, msg"
            ),
        })?;
        BranchCall::new(trans_type, gid, branch_id, op)
    }

    /// The same call in `tenant`: the tenant the call names (its `Idem-Tenant` header, read
    /// with [`crate::tenant::tenant_of`]). Refuses a name the coordinator would not give a
    /// tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Result<BranchCall, InvalidCall> {
        let tenant = tenant.into();
        check_tenant(&tenant)?;
        self.tenant = if tenant == DEFAULT_TENANT {
            Cow::Borrowed(DEFAULT_TENANT)
        } else {
            Cow::Owned(tenant)
        };
        Ok(self)
    }

    /// The transaction kind named by the call.
    pub fn trans_type(&self) -> TransType {
        self.trans_type
    }

    /// The tenant the call belongs to: keys every row the call writes, beside the gid.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The global transaction's id (unique within its tenant).
    pub fn gid(&self) -> &str {
        &self.gid
    }

    /// The branch within it.
    pub fn branch_id(&self) -> &str {
        &self.branch_id
    }

    /// The operation this call performs.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Checks that the op named by the URL path (for a coordinator that registers one URL
    /// per op, like `.../reserve/{op}`) is the op of the call. 400 otherwise.
    pub fn expect_path_op(&self, path_op: &str) -> Result<Op, InvalidCall> {
        if path_op == self.op.as_str() {
            Ok(self.op)
        } else {
            Err(InvalidCall::Invalid {
                param: "op",
                reason: format!("this URL is for `{path_op}`, the call says `{}`", self.op),
            })
        }
    }

    /// Checks that this call's op is one of `ops`, for a handler that serves only some
    /// (an inventory reservation has no saga action). 400 otherwise.
    pub fn expect_op(&self, ops: &[Op]) -> Result<Op, InvalidCall> {
        if ops.contains(&self.op) {
            Ok(self.op)
        } else {
            let names: Vec<&str> = ops.iter().map(|o| o.as_str()).collect();
            Err(InvalidCall::Invalid {
                param: "op",
                reason: format!(
                    "this endpoint serves {}, not `{}`",
                    names.join(", "),
                    self.op
                ),
            })
        }
    }
}

/// Checks a gid or branch id: non-empty, at most [`MAX_ID_LEN`] characters, no control
/// characters (they would end up in logs and URLs).
fn check_id(param: &'static str, value: &str) -> Result<(), InvalidCall> {
    if value.is_empty() {
        return Err(InvalidCall::Missing(param));
    }
    if value.chars().count() > MAX_ID_LEN {
        return Err(InvalidCall::Invalid {
            param,
            reason: format!("longer than {MAX_ID_LEN} characters"),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(InvalidCall::Invalid {
            param,
            reason: "contains control characters".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &[(&'static str, &'static str)]) -> Result<BranchCall, InvalidCall> {
        BranchCall::from_pairs(q.iter().copied())
    }

    #[test]
    fn ops_round_trip_and_know_their_origin() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.as_str()), Some(op));
        }
        assert_eq!(Op::parse("rollback"), None);
        assert_eq!(Op::Cancel.origin(), Some(Op::Try));
        assert_eq!(Op::Compensate.origin(), Some(Op::Action));
        assert_eq!(Op::Try.origin(), None);
        assert_eq!(Op::Confirm.origin(), None);
        assert_eq!(Op::Msg.origin(), None);
        assert_eq!(Op::Confirm.prerequisite(), Some(Op::Try));
        for op in [Op::Try, Op::Cancel, Op::Action, Op::Compensate, Op::Msg] {
            assert_eq!(op.prerequisite(), None, "{op}");
        }
    }

    #[test]
    fn trans_types_allow_their_own_ops_only() {
        assert!(TransType::Tcc.allows(Op::Try));
        assert!(TransType::Tcc.allows(Op::Cancel));
        assert!(!TransType::Tcc.allows(Op::Action));
        assert!(TransType::Saga.allows(Op::Compensate));
        assert!(!TransType::Saga.allows(Op::Confirm));
        assert!(TransType::Msg.allows(Op::Msg));
        assert!(TransType::Msg.allows(Op::Action));
        assert!(!TransType::Msg.allows(Op::Compensate));
        assert_eq!(TransType::parse("saga"), Some(TransType::Saga));
        assert_eq!(TransType::parse("xa"), None);
    }

    #[test]
    fn a_call_validates_its_key() {
        assert!(BranchCall::new(TransType::Tcc, "g1", "01", Op::Try).is_ok());
        assert_eq!(
            BranchCall::new(TransType::Tcc, "", "01", Op::Try).unwrap_err(),
            InvalidCall::Missing("gid")
        );
        assert!(matches!(
            BranchCall::new(TransType::Tcc, "g".repeat(129), "01", Op::Try),
            Err(InvalidCall::Invalid { param: "gid", .. })
        ));
        assert!(BranchCall::new(TransType::Tcc, "g".repeat(128), "01", Op::Try).is_ok());
        assert!(matches!(
            BranchCall::new(TransType::Tcc, "g1", "0\n1", Op::Try),
            Err(InvalidCall::Invalid {
                param: "branch_id",
                ..
            })
        ));
        assert!(matches!(
            BranchCall::new(TransType::Saga, "g1", "01", Op::Cancel),
            Err(InvalidCall::Invalid { param: "op", .. })
        ));
    }

    #[test]
    fn a_call_is_the_default_tenants_unless_told() {
        let call = BranchCall::new(TransType::Tcc, "g1", "01", Op::Try).unwrap();
        assert_eq!(call.tenant(), DEFAULT_TENANT);
        let acme = call.clone().with_tenant("acme").unwrap();
        assert_eq!((acme.tenant(), acme.gid()), ("acme", "g1"));
        assert!(matches!(
            call.clone().with_tenant("acme/x"),
            Err(InvalidCall::Header { .. })
        ));
        assert!(call.clone().with_tenant("Beta").is_err());
        assert!(call.with_tenant("t".repeat(33)).is_err());
    }

    #[test]
    fn parses_a_complete_call() {
        let call = pairs(&[
            ("gid", "g-1"),
            ("trans_type", "tcc"),
            ("branch_id", "01"),
            ("op", "cancel"),
            ("dtm", "ignored"),
        ])
        .unwrap();
        assert_eq!(call.gid(), "g-1");
        assert_eq!(call.trans_type(), TransType::Tcc);
        assert_eq!(call.branch_id(), "01");
        assert_eq!(call.op(), Op::Cancel);
        assert_eq!(call.tenant(), DEFAULT_TENANT);
    }

    #[test]
    fn names_the_missing_or_bad_parameter() {
        assert_eq!(
            pairs(&[("trans_type", "tcc"), ("branch_id", "01"), ("op", "try")]),
            Err(InvalidCall::Missing("gid"))
        );
        assert_eq!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "tcc"),
                ("branch_id", ""),
                ("op", "try")
            ]),
            Err(InvalidCall::Missing("branch_id"))
        );
        assert_eq!(
            pairs(&[("gid", "g"), ("branch_id", "01"), ("op", "try")]),
            Err(InvalidCall::Missing("trans_type"))
        );
        assert!(matches!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "xa"),
                ("branch_id", "01"),
                ("op", "try")
            ]),
            Err(InvalidCall::Invalid {
                param: "trans_type",
                ..
            })
        ));
        assert!(matches!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "tcc"),
                ("branch_id", "01"),
                ("op", "rollback")
            ]),
            Err(InvalidCall::Invalid { param: "op", .. })
        ));
        assert!(matches!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "saga"),
                ("branch_id", "01"),
                ("op", "try")
            ]),
            Err(InvalidCall::Invalid { param: "op", .. })
        ));
    }
}
