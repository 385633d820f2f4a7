-- idem coordinator schema, PostgreSQL. Timestamps are milliseconds since the Unix epoch.

CREATE TABLE idem_global (
    gid             VARCHAR(128) PRIMARY KEY,
    kind            VARCHAR(16)  NOT NULL,
    status          VARCHAR(16)  NOT NULL,
    stalled_from    VARCHAR(16),
    request_hash    VARCHAR(64)  NOT NULL,
    options         TEXT         NOT NULL,
    timeout_at      BIGINT,
    attempts        INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    last_error      TEXT,
    reason          TEXT,
    owner_token     VARCHAR(64),
    lease_until     BIGINT,
    version         BIGINT       NOT NULL DEFAULT 0,
    created_at      BIGINT       NOT NULL,
    updated_at      BIGINT       NOT NULL,
    finished_at     BIGINT
);

-- The recovery scan: only unfinished transactions, by due time.
CREATE INDEX idem_global_due ON idem_global (next_attempt_at)
    WHERE status IN ('prepared', 'running', 'committing', 'aborting');
CREATE INDEX idem_global_created ON idem_global (created_at, gid);
CREATE INDEX idem_global_status_created ON idem_global (status, created_at, gid);

-- One row per branch operation; the primary key is the unique (gid, branch_id, action).
CREATE TABLE idem_branch (
    gid             VARCHAR(128) NOT NULL,
    branch_id       VARCHAR(128) NOT NULL,
    action          VARCHAR(16)  NOT NULL,
    seq             INTEGER      NOT NULL,
    url             TEXT         NOT NULL,
    payload         TEXT         NOT NULL,
    status          VARCHAR(16)  NOT NULL,
    attempts        INTEGER      NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    last_error      TEXT,
    updated_at      BIGINT       NOT NULL,
    finished_at     BIGINT,
    PRIMARY KEY (gid, branch_id, action)
);

-- Calls that did not succeed at once: the retry history shown by `tx show`.
CREATE TABLE idem_attempt (
    id          BIGSERIAL    PRIMARY KEY,
    gid         VARCHAR(128) NOT NULL,
    branch_id   VARCHAR(128) NOT NULL,
    action      VARCHAR(16)  NOT NULL,
    attempt     INTEGER      NOT NULL,
    started_at  BIGINT       NOT NULL,
    duration_ms BIGINT       NOT NULL,
    outcome     VARCHAR(16)  NOT NULL,
    detail      TEXT
);
CREATE INDEX idem_attempt_gid ON idem_attempt (gid, id);
