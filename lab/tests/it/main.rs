//! The lab's integration tests, as one binary: each module is the tests of one tool (the
//! benchmark, chaos, the database-link faults, the named scenarios in `tests/scenarios/`, the
//! own-service example), with `private_postgres`, a PostgreSQL server of a test's own.

mod private_postgres;

mod bench;
mod bodies;
mod chaos;
mod db_link_freeze;
mod db_link_proxy;
mod own_service;
mod scenarios;
