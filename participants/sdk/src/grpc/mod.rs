//! tonic integration: a branch call's parameters from the metadata a coordinator sends
//! over gRPC (DTM's `dtm-gid`, `dtm-trans_type`, `dtm-branch_id`, `dtm-op`, and idem's
//! `idem-tenant`), and outcomes and errors as the gRPC statuses coordinators read: DTM's
//! and idem's alike take `OK` as success, `ABORTED` as a failure and `FAILED_PRECONDITION`
//! as "in progress". So the barrier guards a gRPC method as it guards an HTTP handler:
//!
//! ```no_run
//! # use idem_participant::{BranchCall, ParticipantError};
//! # use sqlx::AnyPool;
//! # async fn transfer(_tx: &idem_participant::StepTx<'static, sqlx::Any>) -> Result<(), ParticipantError> { Ok(()) }
//! async fn trans_out(pool: &AnyPool, request: tonic::Request<Vec<u8>>) -> Result<(), tonic::Status> {
//!     let call = BranchCall::from_grpc_metadata(request.metadata())?;
//!     let outcome = call.barrier().run(pool, |tx| async move { transfer(&tx).await }).await?;
//!     idem_participant::grpc::status_of(&outcome)
//! }
//! ```
//!
//! A coordinator with signing keys signs gRPC calls too: put [`RequireSignatureLayer`] in
//! front of the services (see [`signature`]) so that only its calls reach them.

mod signature;

pub use signature::{RequireSignature, RequireSignatureLayer, verify};

use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::barrier::Outcome;
use crate::error::{InvalidCall, ParticipantError};
use crate::kit::BranchCall;
use crate::tenant::{TENANT_HEADER, tenant_of};

/// DTM's metadata names of a branch call's parameters, with the query parameter each
/// stands for, in the order of an HTTP call's query (which a signature covers).
const PARAMETERS: [(&str, &str); 4] = [
    ("dtm-gid", "gid"),
    ("dtm-trans_type", "trans_type"),
    ("dtm-branch_id", "branch_id"),
    ("dtm-op", "op"),
];

impl BranchCall {
    /// The call a coordinator's gRPC metadata names, as [`BranchCall::from_pairs`] reads
    /// the query of an HTTP call; its tenant from `idem-tenant` (none: the default).
    pub fn from_grpc_metadata(metadata: &MetadataMap) -> Result<BranchCall, InvalidCall> {
        let pairs = PARAMETERS.iter().filter_map(|(key, name)| {
            let value = metadata.get(*key)?.to_str().ok()?;
            Some((*name, value))
        });
        let call = BranchCall::from_pairs(pairs)?;
        let tenant = tenant_of(
            metadata
                .get_all(TENANT_HEADER)
                .iter()
                .map(|value| value.as_encoded_bytes()),
        )?;
        call.with_tenant(tenant)
    }
}

/// `Ok` for a step that is done (executed now, or before, or an empty rollback);
/// `ABORTED` for a step the barrier rejected (its rollback ran first), which the
/// coordinator must not retry.
pub fn status_of<T>(outcome: &Outcome<T>) -> Result<(), Status> {
    match outcome {
        Outcome::Rejected => Err(Status::aborted(
            "FAILURE: rejected: this branch was already cancelled or compensated",
        )),
        _ => Ok(()),
    }
}

/// A malformed call: `INVALID_ARGUMENT`, which a coordinator retries like any answer it
/// cannot read (the call may have been damaged on its way).
impl From<InvalidCall> for Status {
    fn from(e: InvalidCall) -> Status {
        Status::invalid_argument(quiet(&e.to_string()))
    }
}

/// A refusal is `ABORTED` (FAILURE), "not yet" is `FAILED_PRECONDITION` (ONGOING), what
/// may pass on a retry is `UNAVAILABLE`, the rest `INTERNAL`: the coordinator retries all
/// but the first.
impl From<ParticipantError> for Status {
    fn from(e: ParticipantError) -> Status {
        let text = quiet(&e.to_string());
        let code = match (&e, e.status_code()) {
            (ParticipantError::Refused(_), _) => Code::Aborted,
            (ParticipantError::InProgress(_), _) => Code::FailedPrecondition,
            (_, 503) => Code::Unavailable,
            _ => Code::Internal,
        };
        let prefix = match code {
            Code::Aborted => "FAILURE: ",
            Code::FailedPrecondition => "ONGOING: ",
            _ => "",
        };
        Status::new(code, format!("{prefix}{text}"))
    }
}

/// A message without DTM's `ONGOING` marker, which a coordinator would read in an
/// `ABORTED` status as "in progress".
fn quiet(text: &str) -> String {
    text.replace("ONGOING", "ongoing")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.append(*k, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn a_call_is_read_from_dtms_metadata_and_idems_tenant() {
        let m = metadata(&[
            ("dtm-gid", "g1"),
            ("dtm-trans_type", "saga"),
            ("dtm-branch_id", "01"),
            ("dtm-op", "compensate"),
            ("idem-tenant", "acme"),
        ]);
        let call = BranchCall::from_grpc_metadata(&m).unwrap();
        assert_eq!((call.gid(), call.branch_id()), ("g1", "01"));
        assert_eq!(call.tenant(), "acme");
        assert_eq!(call.op().to_string(), "compensate");
        let missing = metadata(&[("dtm-gid", "g1"), ("dtm-trans_type", "saga")]);
        assert!(BranchCall::from_grpc_metadata(&missing).is_err());
        let two_tenants = metadata(&[
            ("dtm-gid", "g1"),
            ("dtm-trans_type", "saga"),
            ("dtm-branch_id", "01"),
            ("dtm-op", "action"),
            ("idem-tenant", "a"),
            ("idem-tenant", "b"),
        ]);
        assert!(BranchCall::from_grpc_metadata(&two_tenants).is_err());
    }

    #[test]
    fn errors_become_the_statuses_coordinators_read() {
        let refused = Status::from(ParticipantError::refused("no ONGOING money"));
        assert_eq!(refused.code(), Code::Aborted);
        assert!(!refused.message().contains("ONGOING"), "{refused:?}");
        let later = Status::from(ParticipantError::InProgress("wait".into()));
        assert_eq!(later.code(), Code::FailedPrecondition);
        let again = Status::from(ParticipantError::transient("down"));
        assert_eq!(again.code(), Code::Unavailable);
        assert_eq!(
            status_of(&Outcome::<()>::Rejected).unwrap_err().code(),
            Code::Aborted
        );
        assert!(status_of(&Outcome::Executed(())).is_ok());
    }
}
