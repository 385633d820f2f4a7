-- The W3C trace context a transaction was created with (or the one idem started for it),
-- so that every branch call, after a restart too, continues the client's trace.
ALTER TABLE idem_global ADD COLUMN traceparent VARCHAR(55);
ALTER TABLE idem_global ADD COLUMN tracestate VARCHAR(512);
