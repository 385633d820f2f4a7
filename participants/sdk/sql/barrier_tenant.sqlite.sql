-- Upgrade of a barrier table made before tenants (SQLite), after barrier_lease.sqlite.sql.
-- Its rows become the default tenant's (the tenant of every call before tenants existed), and
-- the unique key gains the tenant, so two tenants' same gid no longer share a row. SQLite
-- cannot change a table's unique constraint, so the table is rebuilt (ids and times kept),
-- in one transaction: `upgrade_barrier_table` opens it with BEGIN IMMEDIATE, checks that the
-- table still lacks `tenant`, and runs this; by hand, run it once inside
-- `BEGIN IMMEDIATE; ... COMMIT;`. The new table is barrier.sqlite.sql's.
-- An older SDK's inserts name the old key in ON CONFLICT and fail once it is gone (the
-- coordinator retries them): upgrade every replica's SDK together.
CREATE TABLE idem_barrier_tenant_new (
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
INSERT INTO idem_barrier_tenant_new (id, trans_type, tenant, gid, branch_id, op, barrier_id,
    reason, outcome, result, owner_token, lease_until_ms, created_at)
SELECT id, trans_type, 'default', gid, branch_id, op, barrier_id,
    reason, outcome, result, owner_token, lease_until_ms, created_at FROM idem_barrier;
DROP TABLE idem_barrier;
ALTER TABLE idem_barrier_tenant_new RENAME TO idem_barrier;
CREATE INDEX IF NOT EXISTS idem_barrier_created_at ON idem_barrier (created_at);
