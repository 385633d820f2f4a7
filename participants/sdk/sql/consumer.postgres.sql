-- idem consumer log, PostgreSQL. One row per business event a consumer group's handler version
-- has applied, written in the same local transaction as the handler's business change, so
-- "applied" and "logged" are one fact (seed §17). The key is the business event id, never
-- the broker's message id: a producer retry publishes the same event under a new message
-- id (seed §16). broker_message_id is kept only to diagnose redeliveries.
CREATE TABLE IF NOT EXISTS idem_consumer_log (
    consumer_group VARCHAR(128) NOT NULL,
    handler_version VARCHAR(32) NOT NULL,
    event_id VARCHAR(128) NOT NULL,
    broker_message_id VARCHAR(128),
    processed_at_ms BIGINT NOT NULL,
    result TEXT,
    PRIMARY KEY (consumer_group, handler_version, event_id)
);
-- Retention deletes by age (seed §24).
CREATE INDEX IF NOT EXISTS idem_consumer_log_processed ON idem_consumer_log (processed_at_ms);
