-- idem coordinator schema, MySQL/MariaDB. Timestamps are milliseconds since the Unix epoch.
-- utf8mb4_bin: gids and branch ids compare case-sensitively, as on the other databases.

CREATE TABLE idem_global (
    gid             VARCHAR(128) NOT NULL PRIMARY KEY,
    kind            VARCHAR(16)  NOT NULL,
    status          VARCHAR(16)  NOT NULL,
    stalled_from    VARCHAR(16),
    request_hash    VARCHAR(64)  NOT NULL,
    options         MEDIUMTEXT   NOT NULL,
    timeout_at      BIGINT,
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    last_error      TEXT,
    reason          TEXT,
    owner_token     VARCHAR(64),
    lease_until     BIGINT,
    version         BIGINT       NOT NULL DEFAULT 0,
    created_at      BIGINT       NOT NULL,
    updated_at      BIGINT       NOT NULL,
    finished_at     BIGINT,
    -- The recovery scan (MariaDB has no partial indexes).
    KEY idem_global_due (status, next_attempt_at),
    KEY idem_global_created (created_at, gid),
    KEY idem_global_status_created (status, created_at, gid)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per branch operation; the primary key is the unique (gid, branch_id, action).
CREATE TABLE idem_branch (
    gid             VARCHAR(128) NOT NULL,
    branch_id       VARCHAR(128) NOT NULL,
    action          VARCHAR(16)  NOT NULL,
    seq             INT          NOT NULL,
    url             TEXT         NOT NULL,
    payload         MEDIUMTEXT   NOT NULL,
    status          VARCHAR(16)  NOT NULL,
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    last_error      TEXT,
    updated_at      BIGINT       NOT NULL,
    finished_at     BIGINT,
    PRIMARY KEY (gid, branch_id, action)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Calls that did not succeed at once: the retry history shown by `tx show`.
CREATE TABLE idem_attempt (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    gid         VARCHAR(128) NOT NULL,
    branch_id   VARCHAR(128) NOT NULL,
    action      VARCHAR(16)  NOT NULL,
    attempt     INT          NOT NULL,
    started_at  BIGINT       NOT NULL,
    duration_ms BIGINT       NOT NULL,
    outcome     VARCHAR(16)  NOT NULL,
    detail      TEXT,
    KEY idem_attempt_gid (gid, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
