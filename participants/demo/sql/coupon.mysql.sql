-- Campaigns: how many coupons of a code can still be issued.
CREATE TABLE IF NOT EXISTS coupon_campaigns (
    code VARCHAR(64) NOT NULL PRIMARY KEY,
    remaining BIGINT NOT NULL CHECK (remaining >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- Issued coupons, one per saga branch (the unique (tenant, gid, branch_id) is the ledger key):
-- compensation revokes this very row, it never issues or deletes another.
-- status: issued -> revoked.
CREATE TABLE IF NOT EXISTS coupons (
    coupon_id VARCHAR(64) NOT NULL PRIMARY KEY,
    tenant VARCHAR(32) NOT NULL DEFAULT 'default',
    gid VARCHAR(128) NOT NULL,
    branch_id VARCHAR(128) NOT NULL,
    user_id VARCHAR(64) NOT NULL,
    code VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL,
    created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
    UNIQUE KEY coupons_branch (tenant, gid, branch_id),
    KEY coupons_user (user_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
