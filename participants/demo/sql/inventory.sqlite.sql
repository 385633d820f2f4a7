-- Stock per SKU. available + reserved + sold only changes when stock is seeded.
CREATE TABLE IF NOT EXISTS inventory_stock (
    sku TEXT PRIMARY KEY,
    available INTEGER NOT NULL CHECK (available >= 0),
    reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    sold INTEGER NOT NULL DEFAULT 0 CHECK (sold >= 0)
);
-- One row per TCC branch that reserved stock: what Confirm and Cancel act on, and what an
-- auditor reads. status: reserved -> confirmed | cancelled (TCC); sold -> returned (saga).
CREATE TABLE IF NOT EXISTS inventory_reservations (
    tenant TEXT NOT NULL DEFAULT 'default',
    gid TEXT NOT NULL,
    branch_id TEXT NOT NULL,
    sku TEXT NOT NULL,
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    status TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (tenant, gid, branch_id)
);
