-- The W3C trace context a transaction was created with (or the one idem started for it),
-- so that every branch call, after a restart too, continues the client's trace. idem
-- checks the lengths before it writes (traceparent: 55, tracestate: 512), as the other
-- databases' VARCHAR columns do.
ALTER TABLE idem_global ADD COLUMN traceparent TEXT;
ALTER TABLE idem_global ADD COLUMN tracestate TEXT;
