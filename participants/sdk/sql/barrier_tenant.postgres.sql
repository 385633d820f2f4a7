-- Upgrade of a barrier table made before tenants (PostgreSQL), after barrier_lease.postgres.sql.
-- Its rows become the default tenant's (the tenant of every call before tenants existed), and
-- the unique key gains the tenant, so two tenants' same gid no longer share a row.
-- `upgrade_barrier_table` runs it in one transaction when the table still needs it; by hand:
-- `psql -1 -f barrier_tenant.postgres.sql`. Safe to run again: every step is IF [NOT] EXISTS,
-- and the lock makes a second upgrader wait for the first and then find nothing left to do.
-- The unique index is built under that lock, so calls wait for it; on a large table, add
-- the column and build idem_barrier_tenant_uniq with CREATE UNIQUE INDEX CONCURRENTLY first.
-- An older SDK's inserts name the old key in ON CONFLICT and fail once it is gone (the
-- coordinator retries them): upgrade every replica's SDK together.
LOCK TABLE idem_barrier IN ACCESS EXCLUSIVE MODE;
ALTER TABLE idem_barrier ADD COLUMN IF NOT EXISTS tenant VARCHAR(32) NOT NULL DEFAULT 'default';
CREATE UNIQUE INDEX IF NOT EXISTS idem_barrier_tenant_uniq ON idem_barrier (tenant, gid, branch_id, op, barrier_id);
ALTER TABLE idem_barrier DROP CONSTRAINT IF EXISTS idem_barrier_uniq;
