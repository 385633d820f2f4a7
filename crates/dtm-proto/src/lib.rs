//! DTM's gRPC wire schema (`package dtmgimp`): the messages, the `Dtm` service's server
//! trait (which idem's gRPC door implements) and its client (which tests use to drive it).
//!
//! The schema is DTM's, field for field (BSD-3-Clause, see `LICENSE-DTM`); generated at build
//! time from `proto/dtmgimp.proto`.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// Everything generated from `dtmgimp.proto`.
pub mod dtmgimp {
    tonic::include_proto!("dtmgimp");
}

pub use dtmgimp::dtm_client::DtmClient;
pub use dtmgimp::dtm_server::{Dtm, DtmServer};
pub use dtmgimp::{
    DtmBranchRequest, DtmGidReply, DtmProgressesReply, DtmRequest, DtmTopicRequest, DtmTransOptions,
};

/// The port DTM's gRPC server listens on by default (DTM's sample config, Helm values and
/// Kubernetes guide), which `--grpc-listen` examples use.
pub const DTM_GRPC_PORT: u16 = 36790;
