//! The pure core: transaction and branch state machines.
//!
//! No I/O and no clock: the current time comes in as an argument and the work to do goes
//! out as data ([`Effect`]). The engine, the stores and the HTTP adapters sit around it.

mod machine;
mod model;

pub use machine::*;
pub use model::*;

#[cfg(test)]
mod tests;
