-- The console's overview: the coordinators seen (each recovery loop writes its node's row
-- every few seconds), and a tenant's finished transactions per minute.
CREATE TABLE idem_coordinator (
    node          VARCHAR(64) PRIMARY KEY,
    last_seen_at  BIGINT      NOT NULL,
    last_claim_at BIGINT
);
CREATE INDEX idem_global_tenant_finished ON idem_global (tenant, finished_at);
