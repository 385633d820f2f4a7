-- Stock per SKU. available + reserved + sold only changes when stock is seeded.
CREATE TABLE IF NOT EXISTS inventory_stock (
    sku VARCHAR(64) PRIMARY KEY,
    available BIGINT NOT NULL CHECK (available >= 0),
    reserved BIGINT NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold BIGINT NOT NULL DEFAULT 0 CHECK (sold >= 0)
);
-- One row per TCC branch that reserved stock: what Confirm and Cancel act on, and what an
-- auditor reads. status: reserved -> confirmed | cancelled (TCC); sold -> returned (saga).
CREATE TABLE IF NOT EXISTS inventory_reservations (
    tenant VARCHAR(32) NOT NULL DEFAULT 'default',
    gid VARCHAR(128) NOT NULL,
    branch_id VARCHAR(128) NOT NULL,
    sku VARCHAR(64) NOT NULL,
    quantity BIGINT NOT NULL CHECK (quantity > 0),
    status VARCHAR(16) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (tenant, gid, branch_id)
);
