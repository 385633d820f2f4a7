-- idem job units, MySQL / MariaDB (InnoDB). One row per unit of work of a scheduled job or
-- batch: the key is what the unit processes (job, business date, shard, source id, batch),
-- never the scheduler's execution id, because a manual rerun gets a new execution id for
-- the same business date (seed §22). status is PENDING | RUNNING | DONE | FAILED;
-- execution_id is the run that last claimed (and, once DONE, finished) the unit;
-- owner_token and lease_until_ms fence a RUNNING unit worked in chunks, and checkpoint is
-- where its next chunk starts. A unit run in one local transaction is never seen RUNNING.
-- utf8mb4_bin: keys compare byte for byte, as on PostgreSQL and SQLite.
CREATE TABLE IF NOT EXISTS idem_job_unit (
    job VARCHAR(64) NOT NULL,
    business_date VARCHAR(10) NOT NULL,
    shard BIGINT NOT NULL,
    source_id VARCHAR(128) NOT NULL,
    batch VARCHAR(64) NOT NULL,
    status VARCHAR(24) NOT NULL,
    execution_id VARCHAR(64) NULL,
    owner_token VARCHAR(32) NULL,
    lease_until_ms BIGINT NULL,
    checkpoint MEDIUMTEXT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (job, business_date, shard, source_id, batch),
    -- Retention deletes finished units by age (seed §24); the summary counts by status.
    KEY idem_job_unit_status (status, updated_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
