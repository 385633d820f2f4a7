//! The coordinator's integration tests, as one binary: each module is the tests of one
//! concern (a door, a limit, a backend failure, a process), sharing `common` and `signed`.
//!
//! One binary links the coordinator once instead of once per file. Its tests share one
//! process, so a test that reads process-wide state (the metrics recorder, the global log
//! subscriber) runs itself again alone in a child process: see
//! `idem_participant::testing::in_own_process`.

mod common;
mod signed;

mod admission;
mod answers;
mod auth;
mod auth_process;
mod backup;
mod branch_limits;
mod bulk;
mod caps;
mod cli;
mod client;
mod config;
mod connections;
mod console_api;
mod console_e2e;
mod create_keys;
mod dashboard;
mod doc_links;
mod dtm;
mod dtm_door;
mod dtm_grpc;
mod dtm_python;
mod engine;
mod fair_slots;
mod in_flight;
mod layering;
mod limits;
mod liveness;
mod logs;
mod metrics;
mod openapi;
mod order_service;
mod outage;
mod outbound;
mod outbound_reach;
mod parsers;
mod participant_tenants;
mod processes;
mod repeats;
mod retention;
mod robustness;
mod same_origin;
mod signed_calls;
mod signed_calls_bound;
mod signed_keys;
mod tenants;
mod tls;
mod trace_context;
mod upgrades;
mod validation;
