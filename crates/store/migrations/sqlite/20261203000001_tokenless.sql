-- Transactions created through DTM's door without a token (`--dtm-tenant`): the only ones a
-- caller without a token may read or change. Set when the row is inserted, never changed;
-- rows from before this column count as created with a token.
ALTER TABLE idem_global ADD COLUMN tokenless BOOLEAN NOT NULL DEFAULT FALSE;
-- A token-less caller's list (DTM's `all`): its rows of the tenant, newest first, without
-- reading the tenant's other rows; only token-less rows are in it.
CREATE INDEX idem_global_tenant_tokenless ON idem_global (tenant, created_at, gid) WHERE tokenless = TRUE;
