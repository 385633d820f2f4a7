-- Tenants. A transaction's key is `<tenant>/<gid>` (the bare gid in the default tenant, so
-- every existing row is the default tenant's); `tenant` is derived from the key, so no
-- write has to set it and no row can disagree with its key. (SQLite's TEXT has no length:
-- the coordinator checks the same bounds as on the other databases.)
ALTER TABLE idem_global ADD COLUMN tenant TEXT GENERATED ALWAYS AS (
    CASE WHEN instr(gid, '/') > 0 THEN substr(gid, 1, instr(gid, '/') - 1) ELSE 'default' END
) VIRTUAL;
-- A tenant's list, and its count of unfinished transactions (the per-tenant cap).
CREATE INDEX idem_global_tenant_created ON idem_global (tenant, created_at, gid);
CREATE INDEX idem_global_tenant_status ON idem_global (tenant, status);

-- API tokens: only a SHA-256 of the secret is kept. A token is `idem_<id>_<secret>`.
CREATE TABLE idem_token (
    id          TEXT    PRIMARY KEY NOT NULL,
    tenant      TEXT    NOT NULL,
    role        TEXT    NOT NULL,
    secret_hash TEXT    NOT NULL,
    label       TEXT    NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
