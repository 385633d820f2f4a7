//! idem's lab: failure replay and measurement, beside the coordinator rather than in it.
//!
//! - [`faults`]: fault plans; the transport wrapper and crash points that apply them in a
//!   coordinator (`idem-lab serve`), and the axum middleware that applies them in front of
//!   a participant service; the timeline of a run.
//! - [`scenario`]: scenario files run against real participants and coordinator processes,
//!   recordings and their replay, the chaos run and its invariant checks.
//! - [`bench`]: the load generator (`idem-lab bench`).
//! - [`participants`]: the demo's participant services in this process, as the benchmark
//!   and the scenarios start them.
//! - [`harness`]: failure replay in a participant's own tests: a coordinator in-process
//!   with a fault plan, and the layer that puts the plan in front of the service.
//!
//! The production binary, `idem`, contains none of this; `idem-lab` is `idem serve` plus
//! these tools. A participant's own test suite can use this crate as a dev-dependency to
//! put a fault plan in front of its service (see docs/lab.md).

pub mod bench;
pub mod cli;
pub mod faults;
pub mod harness;
pub mod participants;
pub mod scenario;
