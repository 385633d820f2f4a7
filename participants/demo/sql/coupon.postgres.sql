-- Campaigns: how many coupons of a code can still be issued.
CREATE TABLE IF NOT EXISTS coupon_campaigns (
    code VARCHAR(64) PRIMARY KEY,
    remaining BIGINT NOT NULL CHECK (remaining >= 0)
);
-- Issued coupons, one per saga branch (the unique (tenant, gid, branch_id) is the ledger key):
-- compensation revokes this very row, it never issues or deletes another.
-- status: issued -> revoked.
CREATE TABLE IF NOT EXISTS coupons (
    coupon_id VARCHAR(64) PRIMARY KEY,
    tenant VARCHAR(32) NOT NULL DEFAULT 'default',
    gid VARCHAR(128) NOT NULL,
    branch_id VARCHAR(128) NOT NULL,
    user_id VARCHAR(64) NOT NULL,
    code VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT coupons_branch UNIQUE (tenant, gid, branch_id)
);
CREATE INDEX IF NOT EXISTS coupons_user ON coupons (user_id);
