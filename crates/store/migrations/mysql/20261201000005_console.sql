-- The console's overview: the coordinators seen (each recovery loop writes its node's row
-- every few seconds), and a tenant's finished transactions per minute.
CREATE TABLE idem_coordinator (
    node          VARCHAR(64) NOT NULL PRIMARY KEY,
    last_seen_at  BIGINT      NOT NULL,
    last_claim_at BIGINT
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX idem_global_tenant_finished ON idem_global (tenant, finished_at);
