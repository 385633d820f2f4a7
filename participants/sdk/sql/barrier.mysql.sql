-- idem participant barrier, MySQL / MariaDB (InnoDB).
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
-- utf8mb4_bin: the key must compare byte for byte, as on PostgreSQL and SQLite; the default
-- case-insensitive collation would make gid "A1" a duplicate of gid "a1".
CREATE TABLE IF NOT EXISTS idem_barrier (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    trans_type VARCHAR(16) NOT NULL DEFAULT '',
    tenant VARCHAR(32) NOT NULL DEFAULT 'default',
    gid VARCHAR(128) NOT NULL,
    branch_id VARCHAR(128) NOT NULL,
    op VARCHAR(16) NOT NULL,
    barrier_id VARCHAR(16) NOT NULL,
    reason VARCHAR(16) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    result MEDIUMTEXT NULL,
    owner_token VARCHAR(32) NULL,
    lease_until_ms BIGINT NULL,
    created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    UNIQUE KEY idem_barrier_tenant_uniq (tenant, gid, branch_id, op, barrier_id),
    KEY idem_barrier_created_at (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
