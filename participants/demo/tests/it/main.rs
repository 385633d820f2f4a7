//! The example participants' integration tests, as one binary: each module is the tests of
//! one concern (confirm before try, HTTP, sagas, tenants, the JetStream consumer under a
//! crash), sharing `support`.

mod support;

mod confirm;
mod http;
mod nats_consumer;
mod sagas;
mod tenants;
