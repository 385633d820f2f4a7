-- Campaigns: how many coupons of a code can still be issued.
CREATE TABLE IF NOT EXISTS coupon_campaigns (
    code TEXT PRIMARY KEY,
    remaining INTEGER NOT NULL CHECK (remaining >= 0)
);
-- Issued coupons, one per saga branch (the unique (tenant, gid, branch_id) is the ledger key):
-- compensation revokes this very row, it never issues or deletes another.
-- status: issued -> revoked.
CREATE TABLE IF NOT EXISTS coupons (
    coupon_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL DEFAULT 'default',
    gid TEXT NOT NULL,
    branch_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    code TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT coupons_branch UNIQUE (tenant, gid, branch_id)
);
CREATE INDEX IF NOT EXISTS coupons_user ON coupons (user_id);
