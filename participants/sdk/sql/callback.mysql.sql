-- idem participant payment callbacks, MySQL / MariaDB (InnoDB).
-- One row per provider transaction: the unique key (provider, merchant, provider_txn_id) is
-- what lets exactly one delivery of a callback credit its order; every other delivery
-- collides with it and is answered by reading the order. `outcome` is CREDITED (the order
-- turned PAID by this transaction) or CONFLICT (it did not fit the order: kept for a human,
-- never purged automatically). `received_at_ms` is Unix ms, the retention's clock.
-- utf8mb4_bin: transaction ids compare byte for byte, as on PostgreSQL and SQLite.
CREATE TABLE IF NOT EXISTS idem_payment_callback (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    provider VARCHAR(32) NOT NULL,
    merchant VARCHAR(64) NOT NULL,
    provider_txn_id VARCHAR(128) NOT NULL,
    order_ref VARCHAR(128) NOT NULL,
    amount_minor BIGINT NOT NULL,
    currency VARCHAR(8) NOT NULL,
    outcome VARCHAR(24) NOT NULL,
    received_at_ms BIGINT NOT NULL,
    UNIQUE KEY idem_payment_callback_uniq (provider, merchant, provider_txn_id),
    -- The purge's scan: terminal rows by age.
    KEY idem_payment_callback_received (outcome, received_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
