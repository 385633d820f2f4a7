-- The order service (participants/demo/src/order/). Times are Unix milliseconds.
-- orders: one row per client intent. (tenant, idem_key) is the Idempotency-Key the order
-- POST came with: the fact source the recovery of an interrupted POST reads ("did this
-- key already make an order?"). status: WAIT_PAY -> PAID; paid_txn is the provider's
-- transaction id that paid it (the only one that ever will).
CREATE TABLE IF NOT EXISTS orders (
    order_id VARCHAR(64) NOT NULL PRIMARY KEY,
    tenant VARCHAR(128) NOT NULL,
    idem_key VARCHAR(128) NOT NULL,
    customer VARCHAR(64) NOT NULL,
    sku VARCHAR(64) NOT NULL,
    quantity BIGINT NOT NULL,
    amount_minor BIGINT NOT NULL,
    currency VARCHAR(3) NOT NULL,
    merchant VARCHAR(64) NOT NULL,
    status VARCHAR(16) NOT NULL,
    saga_gid VARCHAR(128) NOT NULL,
    paid_txn VARCHAR(128),
    business_date VARCHAR(10) NOT NULL,
    shard BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    CONSTRAINT orders_key UNIQUE (tenant, idem_key)
);
CREATE INDEX IF NOT EXISTS orders_paid_by_date ON orders (business_date, status, shard);
-- The outbox: an "order paid" event written in the payment's own transaction, published
-- to the broker after commit (again after a crash: the consumer's log absorbs repeats).
CREATE TABLE IF NOT EXISTS order_outbox (
    event_id VARCHAR(128) NOT NULL PRIMARY KEY,
    subject VARCHAR(128) NOT NULL,
    body TEXT NOT NULL,
    published_at_ms BIGINT,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS order_outbox_unpublished ON order_outbox (published_at_ms);
-- Loyalty points, credited by the consumer of "order paid" events. Deliberately no unique
-- key: only the consumer log keeps it to one row per order, so a second credit would show.
CREATE TABLE IF NOT EXISTS order_points (
    order_id VARCHAR(64) NOT NULL,
    customer VARCHAR(64) NOT NULL,
    points BIGINT NOT NULL
);
-- The nightly settlement: one line per (business date, shard) unit the job ran, the paid
-- orders of that shard summed. No unique key either: the job units keep a rerun from
-- adding a second line.
CREATE TABLE IF NOT EXISTS order_settlement (
    business_date VARCHAR(10) NOT NULL,
    shard BIGINT NOT NULL,
    orders BIGINT NOT NULL,
    amount_minor BIGINT NOT NULL,
    execution_id VARCHAR(64) NOT NULL
);
CREATE INDEX IF NOT EXISTS order_settlement_date ON order_settlement (business_date, shard);
