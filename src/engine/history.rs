//! The history of a transaction's calls that did not simply succeed: each record numbered
//! in the order made, and only the newest kept, so that a transaction's rows and its view
//! stay bounded however long it keeps failing.

use crate::core::Transaction;
use crate::store::AttemptRecord;

/// Numbers `attempts`, the records a save of `after` (from `before`) writes, after
/// `before`'s, and counts them in `after.history`. When that takes the history past `keep`
/// records, the oldest go: `after.history_dropped` moves up to them (the store deletes
/// those rows with the save), and records of this save already past the bound are not
/// written at all. No read and no extra write for a transaction within its bound.
pub(super) fn number(
    before: &Transaction,
    after: &mut Transaction,
    attempts: &mut Vec<AttemptRecord>,
    keep: u32,
) {
    for (i, record) in attempts.iter_mut().enumerate() {
        record.number = before.history + 1 + i as i64;
    }
    after.history = before.history + attempts.len() as i64;
    let keep = i64::from(keep.max(1));
    after.history_dropped = before.history_dropped.max(after.history - keep);
    attempts.retain(|record| record.number > after.history_dropped);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Action, TxOptions};

    fn records(n: usize) -> Vec<AttemptRecord> {
        (0..n)
            .map(|i| AttemptRecord {
                number: 0,
                branch_id: format!("{:02}", i + 1),
                action: Action::Action,
                attempt: 1,
                started_at: 0,
                duration_ms: 1,
                outcome: "unknown".into(),
                detail: None,
            })
            .collect()
    }

    fn numbers(records: &[AttemptRecord]) -> Vec<i64> {
        records.iter().map(|r| r.number).collect()
    }

    #[test]
    fn records_are_numbered_on_and_the_oldest_beyond_the_bound_dropped() {
        let mut before =
            Transaction::prepared("g", crate::core::Kind::Tcc, TxOptions::default(), 0);
        let mut after = before.clone();
        let mut batch = records(3);
        number(&before, &mut after, &mut batch, 4);
        assert_eq!(numbers(&batch), [1, 2, 3]);
        assert_eq!((after.history, after.history_dropped), (3, 0));

        before = after.clone();
        let mut batch = records(3);
        number(&before, &mut after, &mut batch, 4);
        // Six made, four kept: 1 and 2 go (the store deletes them with this save).
        assert_eq!(numbers(&batch), [4, 5, 6]);
        assert_eq!((after.history, after.history_dropped), (6, 2));

        // A save of more than the bound writes only the newest of its own.
        before = after.clone();
        let mut batch = records(10);
        number(&before, &mut after, &mut batch, 4);
        assert_eq!(numbers(&batch), [13, 14, 15, 16]);
        assert_eq!((after.history, after.history_dropped), (16, 12));

        // Nothing new: nothing moves.
        before = after.clone();
        let mut none = Vec::new();
        number(&before, &mut after, &mut none, 4);
        assert_eq!((after.history, after.history_dropped), (16, 12));
    }
}
