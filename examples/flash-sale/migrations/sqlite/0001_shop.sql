-- The shop's tables (SQLite). Ids are bounded by the API to 2^53 - 1; money is integer cents.

CREATE TABLE users (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    -- Bumped in the transaction that changes the user's cart / orders: what the event stream
    -- watches.
    cart_version BIGINT NOT NULL DEFAULT 0,
    orders_version BIGINT NOT NULL DEFAULT 0,
    -- The newest fencing token of the lock `cart:<id>` the cart has seen.
    cart_fence BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE vouchers (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    price BIGINT NOT NULL,
    stock BIGINT NOT NULL,
    initial_stock BIGINT NOT NULL,
    begin_at BIGINT NOT NULL,
    end_at BIGINT NOT NULL
);

CREATE TABLE voucher_orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id BIGINT NOT NULL,
    voucher_id BIGINT NOT NULL,
    fencing_token BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX voucher_orders_by_user ON voucher_orders (user_id, voucher_id);
CREATE INDEX voucher_orders_by_voucher ON voucher_orders (voucher_id);

-- The resource the lock `order:<user>:<voucher>` guards: the newest fencing token seen.
CREATE TABLE order_slots (
    user_id BIGINT NOT NULL,
    voucher_id BIGINT NOT NULL,
    fence BIGINT NOT NULL,
    PRIMARY KEY (user_id, voucher_id)
);

-- `fence`: the newest fencing token of the lock `sku:<id>` this row has seen.
CREATE TABLE skus (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    price BIGINT NOT NULL,
    stock BIGINT NOT NULL,
    initial_stock BIGINT NOT NULL,
    fence BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE cart_items (
    user_id BIGINT NOT NULL,
    sku_id BIGINT NOT NULL,
    qty BIGINT NOT NULL,
    PRIMARY KEY (user_id, sku_id)
);

CREATE TABLE cart_orders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id BIGINT NOT NULL,
    total BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX cart_orders_by_user ON cart_orders (user_id);

-- Name and price as they were when the order was placed.
CREATE TABLE cart_order_items (
    order_id BIGINT NOT NULL,
    sku_id BIGINT NOT NULL,
    name TEXT NOT NULL,
    price BIGINT NOT NULL,
    qty BIGINT NOT NULL,
    fencing_token BIGINT NOT NULL
);
CREATE INDEX cart_order_items_by_order ON cart_order_items (order_id);
CREATE INDEX cart_order_items_by_sku ON cart_order_items (sku_id);

-- Each instance adds its request counters to its own rows: /api/stats sums them.
CREATE TABLE counters (
    instance TEXT NOT NULL,
    name TEXT NOT NULL,
    value BIGINT NOT NULL,
    PRIMARY KEY (instance, name)
);
