-- idem participant barrier, SQLite.
-- One row per (tenant, gid, branch_id, op, barrier_id): a gid is unique only within its
-- tenant (the call's Idem-Tenant header; `default` without it), so two tenants' `order-1` at
-- one shared participant never share a row. 32 characters hold any tenant name and 128 any
-- gid or branch id the coordinator accepts. `reason` is the op whose call inserted the
-- row: a `try` row whose reason is `cancel` is the marker that blocks a late Try.
-- `outcome` is executed | empty_rollback | guard (running only inside the inserting
-- transaction). `result` is the first result, as JSON, returned to every duplicate.
-- Lease mode (steps with an external side effect, barrier/lease.rs) also commits
-- `processing` rows: `owner_token` fences the claim's holder, `lease_until_ms` (Unix ms,
-- the service's clock) says when a repeat may ask the fact source instead of waiting.
-- A table made by an older SDK is brought to this shape by `upgrade_barrier_table` (which
-- `create_barrier_table` runs): barrier_lease.*.sql adds the two lease columns, then
-- barrier_tenant.*.sql the tenant and its key; its rows become the default tenant's.
CREATE TABLE IF NOT EXISTS idem_barrier (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    trans_type TEXT NOT NULL DEFAULT '',
    tenant TEXT NOT NULL DEFAULT 'default',
    gid TEXT NOT NULL,
    branch_id TEXT NOT NULL,
    op TEXT NOT NULL,
    barrier_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    outcome TEXT NOT NULL,
    result TEXT,
    owner_token TEXT,
    lease_until_ms INTEGER,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT idem_barrier_tenant_uniq UNIQUE (tenant, gid, branch_id, op, barrier_id)
);
CREATE INDEX IF NOT EXISTS idem_barrier_created_at ON idem_barrier (created_at);
