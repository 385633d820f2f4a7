-- idem participant barrier, PostgreSQL.
-- One row per (gid, branch_id, op, barrier_id). `reason` is the op whose call inserted the
-- row: a `try` row whose reason is `cancel` is the marker that blocks a late Try.
-- `outcome` is executed | empty_rollback | guard (running only inside the inserting
-- transaction). `result` is the first result, as JSON, returned to every duplicate.
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
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT idem_barrier_uniq UNIQUE (gid, branch_id, op, barrier_id)
);
CREATE INDEX IF NOT EXISTS idem_barrier_created_at ON idem_barrier (created_at);
