//! Payment callbacks, credited once (the seed's §15, with §18's conditional state change
//! and §24/§28 for retention and metrics).
//!
//! A payment provider calls back until it gets a success, often several times at once. The
//! order of checks is the seed's:
//!
//! 1. **Signature first**: HMAC-SHA256 of the raw body with the provider's secret, compared
//!    in constant time. Nothing is read from the database before it passes, so a forged
//!    callback costs no query and learns nothing.
//! 2. **Amount, currency and merchant** against the order (a plain read). A real provider
//!    transaction id replayed with another amount is refused here, before any idempotent
//!    "success" could be answered.
//! 3. **One local transaction**: insert-if-absent the provider transaction id into
//!    `idem_payment_callback` (unique per provider, merchant and id), then the conditional
//!    update `SET status = 'PAID', paid_txn = ? WHERE id = ? AND status = 'WAIT_PAY' AND
//!    amount/currency/merchant = ?` on the service's order table, then the service's own
//!    writes ([`PaymentCallbacks::on_credit`], e.g. an outbox row), all committed together.
//!
//! What decides is always a read of the row, never an affected-row count:
//!
//! * the transaction id was new and the order now reads PAID by it → [`CallbackOutcome::Credited`];
//! * the order already reads PAID by this transaction id (a redelivery, or one whose
//!   callback row was purged) → [`CallbackOutcome::Duplicate`], a success;
//! * anything else (PAID by another transaction id, CLOSED, the id already used for another
//!   order) → [`CallbackOutcome::Conflict`]: logged with `tracing::warn`, counted, recorded
//!   as a `CONFLICT` row for a human, and never a second credit.
//!
//! The order row is read `FOR UPDATE` inside the transaction on PostgreSQL and MySQL (it
//! exists: step 2 found it), so the update and the read after it cannot disagree; SQLite's
//! `BEGIN IMMEDIATE` serialises the whole transaction. Concurrent deliveries of one
//! transaction id queue on the unique index and then find the first one's committed row.
//!
//! Not done here: the event type (a refund notification is not a payment) and the
//! provider's own body format are the caller's to check and map into a [`PaymentNotice`]
//! (or use the JSON shape of [`PaymentNotice`] with [`PaymentCallbacks::handle`]); the
//! order's id column must be text.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::error::ParticipantError;
use crate::kit::local::{LocalTx, exec, fetch, run_local};
use crate::kit::{RetryPolicy, SharedClock, StepConnections, check_table_name, system_clock};
use idem_sql::Backend;

#[cfg(feature = "axum")]
mod http;
mod table;
mod types;

pub use table::{create_callback_tables, create_callback_tables_named, purge_payment_callbacks};
pub use types::{CallbackOutcome, OrderTable, PaymentNotice};
use types::{check_field, check_notice};

/// The callback table's default name.
pub const DEFAULT_CALLBACK_TABLE: &str = "idem_payment_callback";
/// Callbacks by provider and outcome.
pub const CALLBACK_TOTAL: &str = "idem_participant_callback_total";
/// The shortest retention [`purge_payment_callbacks`] accepts: longer than the usual
/// providers' notification schedules (about 25 hours). A purged row is not a double credit
/// (the order keeps the paid transaction id), but it is the audit trail of what came in.
pub const MIN_CALLBACK_RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);

/// Longest provider name, transaction id, order reference, currency and merchant accepted,
/// the columns' widths.
pub const MAX_PROVIDER_LEN: usize = 32;
/// See [`MAX_PROVIDER_LEN`].
pub const MAX_TXN_ID_LEN: usize = 128;
/// See [`MAX_PROVIDER_LEN`].
pub const MAX_ORDER_REF_LEN: usize = 128;
/// See [`MAX_PROVIDER_LEN`].
pub const MAX_CURRENCY_LEN: usize = 8;
/// See [`MAX_PROVIDER_LEN`].
pub const MAX_MERCHANT_LEN: usize = 64;

/// The header [`PaymentCallbacks::respond`] reads the signature from (hex HMAC-SHA256).
pub const SIGNATURE_HEADER: &str = "Idem-Payment-Signature";

/// Gives [`CALLBACK_TOTAL`] its HELP text in the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        CALLBACK_TOTAL,
        "Payment callbacks by provider and outcome: credited, duplicate, conflict, bad_signature, \
         mismatch, unknown_order, invalid, error."
    );
}

/// The order as the callback reads it.
#[derive(Debug)]
struct OrderView {
    amount: Option<i64>,
    currency: String,
    merchant: String,
    status: String,
    paid_txn: Option<String>,
}

/// The service's writes that commit with the credit (an outbox row, a ledger entry).
pub type OnCredit<DB> = Arc<
    dyn Fn(
            LocalTx<'static, DB>,
            PaymentNotice,
        ) -> Pin<Box<dyn Future<Output = Result<(), ParticipantError>> + Send>>
        + Send
        + Sync,
>;

/// Handles one provider's callbacks against one order table (module documentation).
pub struct PaymentCallbacks<DB: BarrierDatabase> {
    provider: String,
    secret: Vec<u8>,
    orders: OrderTable,
    table: String,
    clock: SharedClock,
    retry: RetryPolicy,
    on_credit: Option<OnCredit<DB>>,
}

// By hand: a derive would ask for `DB: Clone`, which the database marker types are not.
impl<DB: BarrierDatabase> Clone for PaymentCallbacks<DB> {
    fn clone(&self) -> Self {
        PaymentCallbacks {
            provider: self.provider.clone(),
            secret: self.secret.clone(),
            orders: self.orders.clone(),
            table: self.table.clone(),
            clock: self.clock.clone(),
            retry: self.retry,
            on_credit: self.on_credit.clone(),
        }
    }
}

impl<DB: BarrierDatabase> std::fmt::Debug for PaymentCallbacks<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("PaymentCallbacks")
            .field("provider", &self.provider)
            .field("orders", &self.orders)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

type HmacSha256 = Hmac<Sha256>;

impl<DB: BarrierDatabase> PaymentCallbacks<DB> {
    /// Callbacks of `provider` (a configured name: it is a metric label), signed with
    /// `secret`, crediting `orders`.
    pub fn new(
        provider: &str,
        secret: impl Into<Vec<u8>>,
        orders: OrderTable,
    ) -> Result<Self, String> {
        check_field("provider", provider, MAX_PROVIDER_LEN)?;
        let secret = secret.into();
        if secret.is_empty() {
            return Err("the provider's secret is empty".into());
        }
        Ok(PaymentCallbacks {
            provider: provider.into(),
            secret,
            orders,
            table: DEFAULT_CALLBACK_TABLE.into(),
            clock: system_clock(),
            retry: RetryPolicy::default(),
            on_credit: None,
        })
    }

    /// Reads the time of `received_at_ms` from `clock`.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Uses another callback table (created with [`create_callback_tables_named`]).
    pub fn with_table(mut self, table: &str) -> Result<Self, String> {
        check_table_name(table)?;
        self.table = table.into();
        Ok(self)
    }

    /// Runs `hook` in the crediting transaction, after the order turned PAID: its writes
    /// commit with the credit or not at all (the seed's outbox step).
    pub fn on_credit(mut self, hook: OnCredit<DB>) -> Self {
        self.on_credit = Some(hook);
        self
    }

    /// The provider's name.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The callback table's name (what [`purge_payment_callbacks`] must be given).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The hex HMAC-SHA256 of `body` under the secret (what the provider sends; for tests
    /// and simulators).
    pub fn sign(&self, body: &[u8]) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key");
        mac.update(body);
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `signature` (hex) is `body`'s, compared in constant time.
    pub fn verify(&self, body: &[u8], signature: &str) -> bool {
        let Ok(given) = hex::decode(signature.trim()) else {
            return false;
        };
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key");
        mac.update(body);
        mac.verify_slice(&given).is_ok()
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(CALLBACK_TOTAL, "provider" => self.provider.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// Verifies `signature` over the raw `body`, parses it as a JSON [`PaymentNotice`] and
    /// credits it (module documentation). Errors are the database's (503-class).
    pub async fn handle<S>(
        &self,
        pool: &S,
        body: &[u8],
        signature: &str,
    ) -> Result<CallbackOutcome, ParticipantError>
    where
        S: StepConnections<Database = DB>,
    {
        if !self.verify(body, signature) {
            self.count("bad_signature");
            tracing::warn!(provider = %self.provider, "payment callback with a bad signature refused");
            return Ok(CallbackOutcome::BadSignature);
        }
        let notice: PaymentNotice = match serde_json::from_slice(body) {
            Ok(n) => n,
            Err(e) => {
                self.count("invalid");
                return Ok(CallbackOutcome::Invalid(format!(
                    "the callback body is not a payment notice: {e}"
                )));
            }
        };
        self.credit_verified(pool, &notice).await
    }

    /// Steps 2 and 3 for a notice whose signature the caller has verified (a provider with
    /// its own signing scheme).
    pub async fn credit_verified<S>(
        &self,
        pool: &S,
        notice: &PaymentNotice,
    ) -> Result<CallbackOutcome, ParticipantError>
    where
        S: StepConnections<Database = DB>,
    {
        let result = self.credit_inner(pool, notice).await;
        match &result {
            Ok(outcome) => self.count(outcome.kind()),
            Err(_) => self.count("error"),
        }
        if let Ok(CallbackOutcome::Conflict(why)) = &result {
            tracing::warn!(provider = %self.provider, order_ref = %notice.order_ref,
                provider_txn_id = %notice.provider_txn_id, reason = %why,
                "payment callback conflicts with the order's state; not credited, needs a human");
        }
        result
    }

    async fn credit_inner<S>(
        &self,
        pool: &S,
        notice: &PaymentNotice,
    ) -> Result<CallbackOutcome, ParticipantError>
    where
        S: StepConnections<Database = DB>,
    {
        if let Err(why) = check_notice(notice) {
            return Ok(CallbackOutcome::Invalid(why));
        }
        let order = run_local(
            pool,
            self.retry,
            "payment callback check",
            |tx| async move { self.read_order(&tx, &notice.order_ref, false).await },
        )
        .await?;
        let Some(order) = order else {
            return Ok(CallbackOutcome::UnknownOrder);
        };
        if let Some(field) = mismatch(&order, notice) {
            tracing::warn!(provider = %self.provider, order_ref = %notice.order_ref, field,
                "payment callback does not match its order; not credited");
            return Ok(CallbackOutcome::Mismatch(field));
        }
        run_local(pool, self.retry, "payment callback credit", |tx| {
            self.credit_tx(tx, notice)
        })
        .await
    }

    async fn read_order(
        &self,
        tx: &LocalTx<'_, DB>,
        order_ref: &str,
        lock: bool,
    ) -> Result<Option<OrderView>, ParticipantError> {
        let o = &self.orders;
        let lock = match (lock, tx.dialect()) {
            (true, Backend::Postgres | Backend::Mysql) => " FOR UPDATE",
            _ => "",
        };
        let sql = format!(
            "SELECT {}, {}, {}, {}, {} FROM {} WHERE {} = ?{lock}",
            o.amount, o.currency, o.merchant, o.status, o.paid_txn, o.table, o.id
        );
        const KINDS: &[CellKind] = &[
            CellKind::Int,
            CellKind::Text,
            CellKind::Text,
            CellKind::Text,
            CellKind::Text,
        ];
        let rows = fetch(tx, &sql, vec![Arg::Text(order_ref.into())], KINDS).await?;
        Ok(rows.into_iter().next().map(|c| {
            let text = |i: usize| c.get(i).and_then(Cell::text).map(str::to_owned);
            OrderView {
                amount: c.first().and_then(Cell::int),
                currency: text(1).unwrap_or_default(),
                merchant: text(2).unwrap_or_default(),
                status: text(3).unwrap_or_default(),
                paid_txn: text(4),
            }
        }))
    }

    fn paid_by(&self, order: &Option<OrderView>, txn: &str) -> bool {
        order.as_ref().is_some_and(|o| {
            o.status == self.orders.paid_status && o.paid_txn.as_deref() == Some(txn)
        })
    }

    fn describe_state(&self, order: &Option<OrderView>) -> String {
        match order {
            None => "the order disappeared".into(),
            Some(o) => format!(
                "the order is {} (paid by {})",
                o.status,
                o.paid_txn.as_deref().unwrap_or("nobody")
            ),
        }
    }

    /// Step 3, one local transaction.
    async fn credit_tx(
        &self,
        tx: LocalTx<'static, DB>,
        n: &PaymentNotice,
    ) -> Result<CallbackOutcome, ParticipantError> {
        let txn = n.provider_txn_id.as_str();
        if !self.insert_callback(&tx, n).await? {
            return self.resolve_known_txn(&tx, n).await;
        }
        let before = self.read_order(&tx, &n.order_ref, true).await?;
        if self.paid_by(&before, txn) {
            // Its callback row had been purged; the order remembers the transaction.
            return Ok(CallbackOutcome::Duplicate);
        }
        if before
            .as_ref()
            .is_some_and(|o| o.status == self.orders.wait_status)
        {
            let o = &self.orders;
            let sql = format!(
                "UPDATE {} SET {} = ?, {} = ? WHERE {} = ? AND {} = ? AND {} = ? AND {} = ? AND {} = ?",
                o.table, o.status, o.paid_txn, o.id, o.status, o.amount, o.currency, o.merchant
            );
            let args = vec![
                Arg::Text(o.paid_status.clone()),
                Arg::Text(txn.into()),
                Arg::Text(n.order_ref.clone()),
                Arg::Text(o.wait_status.clone()),
                Arg::Int(n.amount_minor),
                Arg::Text(n.currency.clone()),
                Arg::Text(n.merchant.clone()),
            ];
            exec(&tx, &sql, args).await?;
            let after = self.read_order(&tx, &n.order_ref, false).await?;
            if self.paid_by(&after, txn) {
                if let Some(hook) = &self.on_credit {
                    hook(tx.clone(), n.clone()).await?;
                }
                return Ok(CallbackOutcome::Credited);
            }
            let why = self.describe_state(&after);
            self.mark_conflict(&tx, n).await?;
            return Ok(CallbackOutcome::Conflict(why));
        }
        let why = self.describe_state(&before);
        self.mark_conflict(&tx, n).await?;
        Ok(CallbackOutcome::Conflict(why))
    }

    /// Inserts the callback row unless its transaction id is known; true when inserted.
    async fn insert_callback(
        &self,
        tx: &LocalTx<'_, DB>,
        n: &PaymentNotice,
    ) -> Result<bool, ParticipantError> {
        let columns = "(provider, merchant, provider_txn_id, order_ref, amount_minor, currency, outcome, received_at_ms) \
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
        let args = vec![
            Arg::Text(self.provider.clone()),
            Arg::Text(n.merchant.clone()),
            Arg::Text(n.provider_txn_id.clone()),
            Arg::Text(n.order_ref.clone()),
            Arg::Int(n.amount_minor),
            Arg::Text(n.currency.clone()),
            Arg::Text("CREDITED".into()),
            Arg::Int(self.clock.now_ms()),
        ];
        let key = "provider, merchant, provider_txn_id";
        crate::kit::insert_if_absent(tx, &self.table, columns, key, args).await
    }

    /// A transaction id seen before: a duplicate only if it was for this very payment and
    /// the order is PAID by it. The reads are the transaction's first (its snapshot is
    /// taken after the colliding insert, which waited for the other writer's commit).
    async fn resolve_known_txn(
        &self,
        tx: &LocalTx<'_, DB>,
        n: &PaymentNotice,
    ) -> Result<CallbackOutcome, ParticipantError> {
        let sql = format!(
            "SELECT order_ref, amount_minor, currency, outcome FROM {} \
             WHERE provider = ? AND merchant = ? AND provider_txn_id = ?",
            self.table
        );
        const KINDS: &[CellKind] = &[
            CellKind::Text,
            CellKind::Int,
            CellKind::Text,
            CellKind::Text,
        ];
        let args = vec![
            Arg::Text(self.provider.clone()),
            Arg::Text(n.merchant.clone()),
            Arg::Text(n.provider_txn_id.clone()),
        ];
        let rows = fetch(tx, &sql, args, KINDS).await?;
        let Some(row) = rows.into_iter().next() else {
            return Err(ParticipantError::transient(
                "the callback row that blocked this one disappeared; retry",
            ));
        };
        let same = row[0].text() == Some(n.order_ref.as_str())
            && row[1].int() == Some(n.amount_minor)
            && row[2].text() == Some(n.currency.as_str());
        if !same {
            return Ok(CallbackOutcome::Conflict(
                "the provider transaction id was already used for another order or amount".into(),
            ));
        }
        let order = self.read_order(tx, &n.order_ref, false).await?;
        if self.paid_by(&order, &n.provider_txn_id) {
            Ok(CallbackOutcome::Duplicate)
        } else {
            Ok(CallbackOutcome::Conflict(self.describe_state(&order)))
        }
    }

    async fn mark_conflict(
        &self,
        tx: &LocalTx<'_, DB>,
        n: &PaymentNotice,
    ) -> Result<(), ParticipantError> {
        let sql = format!(
            "UPDATE {} SET outcome = ? WHERE provider = ? AND merchant = ? AND provider_txn_id = ?",
            self.table
        );
        let args = vec![
            Arg::Text("CONFLICT".into()),
            Arg::Text(self.provider.clone()),
            Arg::Text(n.merchant.clone()),
            Arg::Text(n.provider_txn_id.clone()),
        ];
        exec(tx, &sql, args).await?;
        Ok(())
    }
}

fn mismatch(order: &OrderView, n: &PaymentNotice) -> Option<&'static str> {
    if order.amount != Some(n.amount_minor) {
        Some("amount")
    } else if order.currency != n.currency {
        Some("currency")
    } else if order.merchant != n.merchant {
        Some("merchant")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cb() -> PaymentCallbacks<sqlx::Any> {
        PaymentCallbacks::new(
            "acmepay",
            b"s3cret".to_vec(),
            OrderTable::new("orders").unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn signatures_verify_only_for_the_same_body_and_secret() {
        let c = cb().clone();
        assert!(
            !format!("{c:?}").contains("s3cret"),
            "Debug never shows the secret"
        );
        let sig = c.sign(b"{\"a\":1}");
        assert!(c.verify(b"{\"a\":1}", &sig));
        assert!(!c.verify(b"{\"a\":2}", &sig));
        assert!(!c.verify(b"{\"a\":1}", "zz"));
        assert!(!c.verify(b"{\"a\":1}", ""));
        let other = PaymentCallbacks::<sqlx::Any>::new(
            "acmepay",
            b"other".to_vec(),
            OrderTable::new("orders").unwrap(),
        )
        .unwrap();
        assert!(!other.verify(b"{\"a\":1}", &sig));
    }

    #[test]
    fn names_and_fields_are_checked() {
        assert!(OrderTable::new("orders; drop").is_err());
        assert!(
            OrderTable::new("orders")
                .unwrap()
                .columns(["id", "st", "tx", "amt", "cur", "m x"])
                .is_err()
        );
        assert!(
            PaymentCallbacks::<sqlx::Any>::new("", b"k".to_vec(), OrderTable::new("o").unwrap())
                .is_err()
        );
        assert!(
            PaymentCallbacks::<sqlx::Any>::new("p", Vec::new(), OrderTable::new("o").unwrap())
                .is_err()
        );
        let mut n = PaymentNotice {
            provider_txn_id: "t".repeat(129),
            order_ref: "o1".into(),
            amount_minor: 100,
            currency: "EUR".into(),
            merchant: "m1".into(),
        };
        assert!(check_notice(&n).is_err());
        n.provider_txn_id = "t1".into();
        assert!(check_notice(&n).is_ok());
        n.amount_minor = 0;
        assert!(check_notice(&n).is_err());
    }

    #[test]
    fn outcomes_map_to_stable_statuses() {
        assert_eq!(CallbackOutcome::Credited.status_code(), 200);
        assert_eq!(CallbackOutcome::Duplicate.status_code(), 200);
        assert_eq!(CallbackOutcome::BadSignature.status_code(), 401);
        assert_eq!(CallbackOutcome::Mismatch("amount").status_code(), 400);
        assert_eq!(CallbackOutcome::Conflict("x".into()).kind(), "conflict");
        assert!(!CallbackOutcome::Conflict("x".into()).is_success());
    }
}
