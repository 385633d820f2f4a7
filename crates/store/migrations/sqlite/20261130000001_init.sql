-- idem coordinator schema, SQLite. Timestamps are milliseconds since the Unix epoch.

CREATE TABLE idem_global (
    gid             TEXT    PRIMARY KEY NOT NULL,
    kind            TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    stalled_from    TEXT,
    request_hash    TEXT    NOT NULL,
    options         TEXT    NOT NULL,
    timeout_at      INTEGER,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    last_error      TEXT,
    reason          TEXT,
    owner_token     TEXT,
    lease_until     INTEGER,
    version         INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER
);

-- The recovery scan: only unfinished transactions, by due time.
CREATE INDEX idem_global_due ON idem_global (next_attempt_at)
    WHERE status IN ('prepared', 'running', 'committing', 'aborting');
CREATE INDEX idem_global_created ON idem_global (created_at, gid);
CREATE INDEX idem_global_status_created ON idem_global (status, created_at, gid);

-- One row per branch operation; the primary key is the unique (gid, branch_id, action).
CREATE TABLE idem_branch (
    gid             TEXT    NOT NULL,
    branch_id       TEXT    NOT NULL,
    action          TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    url             TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    last_error      TEXT,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    PRIMARY KEY (gid, branch_id, action)
) WITHOUT ROWID;

-- Calls that did not succeed at once: the retry history shown by `tx show`.
CREATE TABLE idem_attempt (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    gid         TEXT    NOT NULL,
    branch_id   TEXT    NOT NULL,
    action      TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    outcome     TEXT    NOT NULL,
    detail      TEXT
);
CREATE INDEX idem_attempt_gid ON idem_attempt (gid, id);
