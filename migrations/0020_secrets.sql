-- Secrets (issue 38, decision 0044): credentials HTTP and CODE nodes use at
-- execution time, never stored in a run. Each namespace has one data key
-- (256 random bits), stored only wrapped (AES-256-GCM) by a key-encryption
-- key the operator gives the server; `kek_id` names which (a fingerprint).
-- Each secret version's value is sealed by the data key, the namespace,
-- name and version bound in as associated data, so no row's ciphertext
-- decrypts as another's.
CREATE TABLE secret_keys (
    namespace   TEXT PRIMARY KEY,
    kek_id      TEXT NOT NULL,
    -- nonce (12 bytes) then the sealed data key and its tag
    wrapped_key BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE secrets (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    version    INTEGER NOT NULL,
    -- nonce (12 bytes) then the sealed value and its tag
    sealed     BYTEA NOT NULL,
    created_by TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name, version)
);
