-- idem participant barrier, PostgreSQL.
-- One row per (gid, branch_id, op, barrier_id). `reason` is the op whose call inserted the
-- row: a `try` row whose reason is `cancel` is the marker that blocks a late Try.
-- `outcome` is executed | empty_rollback | guard (running only inside the inserting
-- transaction). `result` is the first result, as JSON, returned to every duplicate.
-- Lease mode (steps with an external side effect, barrier/lease.rs) also commits
-- `processing` rows: `owner_token` fences the claim's holder, `lease_until_ms` (Unix ms,
-- the service's clock) says when a repeat may ask the fact source instead of waiting.
-- barrier_lease.*.sql adds the two columns to a table created before them.
CREATE TABLE IF NOT EXISTS idem_barrier (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    trans_type VARCHAR(16) NOT NULL DEFAULT '',
    gid VARCHAR(128) NOT NULL,
    branch_id VARCHAR(128) NOT NULL,
    op VARCHAR(16) NOT NULL,
    barrier_id VARCHAR(16) NOT NULL,
    reason VARCHAR(16) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    result TEXT,
    owner_token VARCHAR(32),
    lease_until_ms BIGINT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT idem_barrier_uniq UNIQUE (gid, branch_id, op, barrier_id)
);
CREATE INDEX IF NOT EXISTS idem_barrier_created_at ON idem_barrier (created_at);
