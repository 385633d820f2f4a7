-- idem participant barrier, MySQL / MariaDB (InnoDB).
-- One row per (gid, branch_id, op, barrier_id). `reason` is the op whose call inserted the
-- row: a `try` row whose reason is `cancel` is the marker that blocks a late Try.
-- `outcome` is executed | empty_rollback | guard (running only inside the inserting
-- transaction). `result` is the first result, as JSON, returned to every duplicate.
-- Lease mode (steps with an external side effect, barrier/lease.rs) also commits
-- `processing` rows: `owner_token` fences the claim's holder, `lease_until_ms` (Unix ms,
-- the service's clock) says when a repeat may ask the fact source instead of waiting.
-- barrier_lease.*.sql adds the two columns to a table created before them.
-- utf8mb4_bin: the key must compare byte for byte, as on PostgreSQL and SQLite; the default
-- case-insensitive collation would make gid "A1" a duplicate of gid "a1".
CREATE TABLE IF NOT EXISTS idem_barrier (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    trans_type VARCHAR(16) NOT NULL DEFAULT '',
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
    UNIQUE KEY idem_barrier_uniq (gid, branch_id, op, barrier_id),
    KEY idem_barrier_created_at (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
