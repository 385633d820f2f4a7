-- The console's overview: the coordinators seen (each recovery loop writes its node's row
-- every few seconds), and a tenant's finished transactions per minute.
CREATE TABLE idem_coordinator (
    node          TEXT    PRIMARY KEY NOT NULL,
    last_seen_at  INTEGER NOT NULL,
    last_claim_at INTEGER
);
CREATE INDEX idem_global_tenant_finished ON idem_global (tenant, finished_at);
