//! What a transition asks of the adapters, typed so that it can say only what the driver
//! does, in the one order the driver does it.
//!
//! Every transition is at most two steps, always in this order:
//!
//! 1. **store** ([`Transition::persist`]): write the new state, conditionally on the
//!    previous status and the owner token (a driver) or the version read (a client
//!    request). Nothing of step 2 happens unless this write succeeded.
//! 2. **then** ([`Transition::next`]): exactly one of
//!    - [`Next::Call`]: send these branch operations now, concurrently, as one round;
//!    - [`Next::WakeAt`]: nothing is due before this time;
//!    - [`Next::Done`]: nothing more happens without an outside event.
//!
//! The core once returned a list of effects, and the driver read it by category (did it
//! persist, what are the calls, which wake-up) rather than in order. A list can say more
//! than the driver ever did: a call before the store, two wake-ups, calls and a wake-up
//! together. This type cannot. In particular it cannot express a call that goes out before
//! the state that makes it due is durable: that order is what ARCHITECTURE.md's invariant
//! 3 (store first, then call: the decision before phase two, a round before the calls it
//! makes due) rests on, and here it is the only order there is.

use super::model::{BranchKey, Millis, Status, Transaction};

/// A new state and what to do with it: store it if `persist`, then `next`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub tx: Transaction,
    /// The state differs from the one the events were applied to: store it before
    /// performing `next`. This is what makes a decision durable before the first Confirm
    /// or Cancel goes out. False for a repeat that changes nothing.
    pub persist: bool,
    /// What follows once the state is stored (at once when there is nothing to store).
    pub next: Next,
}

/// The one thing a transition asks for after its state is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Call these branch operations now, concurrently; never empty.
    Call(Vec<BranchKey>),
    /// Nothing is due before this time.
    WakeAt(Millis),
    /// Nothing more will happen without an outside event: the transaction is terminal,
    /// stalled, or prepared without a timeout. Waiters can be told.
    Done(Status),
}

impl Transition {
    /// The branch operations to call now; empty unless `next` is a round of calls.
    pub fn calls(&self) -> &[BranchKey] {
        match &self.next {
            Next::Call(keys) => keys,
            Next::WakeAt(_) | Next::Done(_) => &[],
        }
    }
}
