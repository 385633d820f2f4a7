//! Participant SDK for idem (being built).

#[cfg(feature = "testing")]
pub mod testing;
