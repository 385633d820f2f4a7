-- Accounts. frozen is money held by open TCC branches; it can never exceed the balance.
CREATE TABLE IF NOT EXISTS payment_accounts (
    account TEXT PRIMARY KEY,
    balance INTEGER NOT NULL CHECK (balance >= 0),
    frozen INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT payment_accounts_frozen CHECK (frozen >= 0 AND frozen <= balance)
);
-- One row per branch that moved money. status: frozen -> debited | released (TCC);
-- debited -> refunded (saga).
CREATE TABLE IF NOT EXISTS payment_ledger (
    tenant TEXT NOT NULL DEFAULT 'default',
    gid TEXT NOT NULL,
    branch_id TEXT NOT NULL,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0),
    status TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (tenant, gid, branch_id)
);
