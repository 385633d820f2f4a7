//! The pure core: transaction and branch state machines.
//!
//! No I/O and no clock: the current time comes in as an argument and the work to do goes
//! out as data ([`Transition`]: store the new state, then call, wake or stop). The engine,
//! the stores and the HTTP adapters sit around it.

mod answers;
mod effects;
mod machine;
mod model;
mod payload;
mod plan;
mod register;
mod settle;

pub use answers::*;
pub use effects::*;
pub use machine::*;
pub use model::*;
pub use payload::Payload;
pub use plan::*;
pub use register::*;

#[cfg(test)]
mod tests;
