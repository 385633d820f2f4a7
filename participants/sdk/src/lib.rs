//! Participant SDK for idem (being built).
