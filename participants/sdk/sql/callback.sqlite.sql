-- idem participant payment callbacks, SQLite.
-- One row per provider transaction: the unique key (provider, merchant, provider_txn_id) is
-- what lets exactly one delivery of a callback credit its order; every other delivery
-- collides with it and is answered by reading the order. `outcome` is CREDITED (the order
-- turned PAID by this transaction) or CONFLICT (it did not fit the order: kept for a human,
-- never purged automatically). `received_at_ms` is Unix ms, the retention's clock.
CREATE TABLE IF NOT EXISTS idem_payment_callback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    provider VARCHAR(32) NOT NULL,
    merchant VARCHAR(64) NOT NULL,
    provider_txn_id VARCHAR(128) NOT NULL,
    order_ref VARCHAR(128) NOT NULL,
    amount_minor BIGINT NOT NULL,
    currency VARCHAR(8) NOT NULL,
    outcome VARCHAR(24) NOT NULL,
    received_at_ms BIGINT NOT NULL,
    CONSTRAINT idem_payment_callback_uniq UNIQUE (provider, merchant, provider_txn_id)
);
-- The purge's scan: terminal rows by age.
CREATE INDEX IF NOT EXISTS idem_payment_callback_received ON idem_payment_callback (outcome, received_at_ms);
