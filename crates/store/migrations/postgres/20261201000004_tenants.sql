-- Tenants. A transaction's key is `<tenant>/<gid>` (the bare gid in the default tenant, so
-- every existing row is the default tenant's): the gid columns widen to a 32-character
-- tenant, the slash and a 128-character gid, and `tenant` is derived from the key, so no
-- write has to set it and no row can disagree with its key.
ALTER TABLE idem_global ALTER COLUMN gid TYPE VARCHAR(161);
ALTER TABLE idem_branch ALTER COLUMN gid TYPE VARCHAR(161);
ALTER TABLE idem_attempt ALTER COLUMN gid TYPE VARCHAR(161);
ALTER TABLE idem_global ADD COLUMN tenant VARCHAR(32) GENERATED ALWAYS AS (
    CASE WHEN strpos(gid, '/') > 0 THEN split_part(gid, '/', 1) ELSE 'default' END
) STORED;
-- A tenant's list, and its count of unfinished transactions (the per-tenant cap).
CREATE INDEX idem_global_tenant_created ON idem_global (tenant, created_at, gid);
CREATE INDEX idem_global_tenant_status ON idem_global (tenant, status);

-- API tokens: only a SHA-256 of the secret is kept. A token is `idem_<id>_<secret>`.
CREATE TABLE idem_token (
    id          VARCHAR(32)  PRIMARY KEY,
    tenant      VARCHAR(32)  NOT NULL,
    role        VARCHAR(16)  NOT NULL,
    secret_hash VARCHAR(64)  NOT NULL,
    label       VARCHAR(128) NOT NULL DEFAULT '',
    created_at  BIGINT       NOT NULL,
    revoked_at  BIGINT
);
