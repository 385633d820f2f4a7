-- Accounts. frozen is money held by open TCC branches; it can never exceed the balance.
CREATE TABLE IF NOT EXISTS payment_accounts (
    account VARCHAR(64) PRIMARY KEY,
    balance BIGINT NOT NULL CHECK (balance >= 0),
    frozen BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT payment_accounts_frozen CHECK (frozen >= 0 AND frozen <= balance)
);
-- One row per branch that moved money. status: frozen -> debited | released (TCC);
-- debited -> refunded (saga).
CREATE TABLE IF NOT EXISTS payment_ledger (
    tenant VARCHAR(32) NOT NULL DEFAULT 'default',
    gid VARCHAR(128) NOT NULL,
    branch_id VARCHAR(128) NOT NULL,
    account VARCHAR(64) NOT NULL,
    amount BIGINT NOT NULL CHECK (amount > 0),
    status VARCHAR(16) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (tenant, gid, branch_id)
);
