-- Shoppers' sessions. The cookie holds a random token; the row holds its SHA-256 digest, so
-- the table alone opens no session. Every instance reads the same rows: a shopper signed in
-- on one is signed in on all, and signing out on one ends the session everywhere.
CREATE TABLE sessions (
    token_digest TEXT PRIMARY KEY,
    user_id BIGINT NOT NULL REFERENCES users (id),
    expires_at_ms BIGINT NOT NULL
);

CREATE INDEX sessions_by_expiry ON sessions (expires_at_ms);
