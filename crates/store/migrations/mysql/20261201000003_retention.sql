-- Retention's selection: terminal transactions by the time they finished.
CREATE INDEX idem_global_finished ON idem_global (status, finished_at);
