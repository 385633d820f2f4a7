//! What a callback carries, what became of it, and the order table it credits.

use serde::{Deserialize, Serialize};

use super::{MAX_CURRENCY_LEN, MAX_MERCHANT_LEN, MAX_ORDER_REF_LEN, MAX_TXN_ID_LEN};
use crate::kit::check_table_name;

/// What a provider's callback says, once its body is parsed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentNotice {
    /// The provider's transaction id: the idempotency key, with the provider and merchant.
    pub provider_txn_id: String,
    /// The service's order id.
    pub order_ref: String,
    /// The amount paid, in minor units (cents).
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The merchant the payment was made to.
    pub merchant: String,
}

/// What became of a callback. Credited and Duplicate are successes to answer the provider
/// with; the others are not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// The order went from WAIT_PAY to PAID in this call.
    Credited,
    /// Already PAID by this transaction id: a redelivery. Nothing changed.
    Duplicate,
    /// The payment does not fit the order's state (PAID by another transaction, closed, the
    /// id reused): nothing credited, recorded and logged for a human.
    Conflict(String),
    /// The signature did not verify (401-class). Nothing was read.
    BadSignature,
    /// Amount, currency or merchant differ from the order's (named here; 400-class).
    Mismatch(&'static str),
    /// No such order (404-class).
    UnknownOrder,
    /// The body does not parse or a field is empty or too long (400-class).
    Invalid(String),
}

impl CallbackOutcome {
    /// A stable name (the metric's `outcome`).
    pub fn kind(&self) -> &'static str {
        match self {
            CallbackOutcome::Credited => "credited",
            CallbackOutcome::Duplicate => "duplicate",
            CallbackOutcome::Conflict(_) => "conflict",
            CallbackOutcome::BadSignature => "bad_signature",
            CallbackOutcome::Mismatch(_) => "mismatch",
            CallbackOutcome::UnknownOrder => "unknown_order",
            CallbackOutcome::Invalid(_) => "invalid",
        }
    }

    /// True for Credited and Duplicate: answer the provider's "received".
    pub fn is_success(&self) -> bool {
        matches!(self, CallbackOutcome::Credited | CallbackOutcome::Duplicate)
    }

    /// The HTTP status [`PaymentCallbacks::respond`](super::PaymentCallbacks::respond) answers with. A conflict is 409, so
    /// the provider keeps it visible on its side too.
    pub fn status_code(&self) -> u16 {
        match self {
            CallbackOutcome::Credited | CallbackOutcome::Duplicate => 200,
            CallbackOutcome::Conflict(_) => 409,
            CallbackOutcome::BadSignature => 401,
            CallbackOutcome::Mismatch(_) | CallbackOutcome::Invalid(_) => 400,
            CallbackOutcome::UnknownOrder => 404,
        }
    }
}

/// The service's order table and the names the conditional update uses.
#[derive(Clone, Debug)]
pub struct OrderTable {
    pub(super) table: String,
    pub(super) id: String,
    pub(super) status: String,
    pub(super) paid_txn: String,
    pub(super) amount: String,
    pub(super) currency: String,
    pub(super) merchant: String,
    pub(super) wait_status: String,
    pub(super) paid_status: String,
}

impl OrderTable {
    /// `table` with columns `id` (text), `status`, `paid_txn`, `amount_minor`, `currency`,
    /// `merchant`, and statuses `WAIT_PAY` → `PAID`.
    pub fn new(table: &str) -> Result<OrderTable, String> {
        check_table_name(table)?;
        Ok(OrderTable {
            table: table.into(),
            id: "id".into(),
            status: "status".into(),
            paid_txn: "paid_txn".into(),
            amount: "amount_minor".into(),
            currency: "currency".into(),
            merchant: "merchant".into(),
            wait_status: "WAIT_PAY".into(),
            paid_status: "PAID".into(),
        })
    }

    /// Other column names, in the order id, status, paid_txn, amount, currency, merchant.
    pub fn columns(mut self, names: [&str; 6]) -> Result<OrderTable, String> {
        for name in names {
            check_table_name(name)?;
        }
        let [id, status, paid_txn, amount, currency, merchant] = names.map(str::to_owned);
        (self.id, self.status, self.paid_txn) = (id, status, paid_txn);
        (self.amount, self.currency, self.merchant) = (amount, currency, merchant);
        Ok(self)
    }

    /// Other status values for "waiting for payment" and "paid".
    pub fn statuses(mut self, wait: &str, paid: &str) -> OrderTable {
        self.wait_status = wait.into();
        self.paid_status = paid.into();
        self
    }
}

pub(super) fn check_field(name: &'static str, value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("`{name}` is empty"));
    }
    if value.chars().count() > max {
        return Err(format!("`{name}` is longer than {max} characters"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("`{name}` contains control characters"));
    }
    Ok(())
}

pub(super) fn check_notice(n: &PaymentNotice) -> Result<(), String> {
    check_field("provider_txn_id", &n.provider_txn_id, MAX_TXN_ID_LEN)?;
    check_field("order_ref", &n.order_ref, MAX_ORDER_REF_LEN)?;
    check_field("currency", &n.currency, MAX_CURRENCY_LEN)?;
    check_field("merchant", &n.merchant, MAX_MERCHANT_LEN)?;
    if n.amount_minor <= 0 {
        return Err("`amount_minor` must be positive".into());
    }
    Ok(())
}
