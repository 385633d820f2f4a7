-- idem job units, PostgreSQL. One row per unit of work of a scheduled job or batch: the key is
-- what the unit processes (job, business date, shard, source id, batch), never the
-- scheduler's execution id, because a manual rerun gets a new execution id for the same
-- business date (seed §22). status is PENDING | RUNNING | DONE | FAILED; execution_id is
-- the run that last claimed (and, once DONE, finished) the unit; owner_token and
-- lease_until_ms fence a RUNNING unit worked in chunks, and checkpoint is where its next
-- chunk starts. A unit run in one local transaction is never seen RUNNING.
CREATE TABLE IF NOT EXISTS idem_job_unit (
    job VARCHAR(64) NOT NULL,
    business_date VARCHAR(10) NOT NULL,
    shard BIGINT NOT NULL,
    source_id VARCHAR(128) NOT NULL,
    batch VARCHAR(64) NOT NULL,
    status VARCHAR(24) NOT NULL,
    execution_id VARCHAR(64),
    owner_token VARCHAR(32),
    lease_until_ms BIGINT,
    checkpoint TEXT,
    attempts BIGINT NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (job, business_date, shard, source_id, batch)
);
-- Retention deletes finished units by age (seed §24); the summary counts by status.
CREATE INDEX IF NOT EXISTS idem_job_unit_status ON idem_job_unit (status, updated_at_ms);
