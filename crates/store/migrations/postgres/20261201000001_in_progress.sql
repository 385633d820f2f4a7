-- When a branch operation first answered "in progress" (425 / ONGOING), so that the
-- time it may stay so is bounded (TxOptions::max_in_progress_ms).
ALTER TABLE idem_branch ADD COLUMN in_progress_since BIGINT;
