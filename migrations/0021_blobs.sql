-- Large payloads (issue 39, decision 0047): values over the offload
-- threshold live in the blob store, keyed by namespace and SHA-256; these
-- tables say which blobs exist and who still needs them.
--
-- `blobs`: one row per stored blob. An upload touches its row before the
-- blob becomes visible, and a reference accepted in a request touches it
-- again, so the collector (which deletes only rows untouched for an hour
-- and referenced by nothing, and the blob with the row, in the row's
-- transaction) never removes a blob a request is about to refer to.
CREATE TABLE blobs (
    namespace  TEXT        NOT NULL,
    sha256     TEXT        NOT NULL,
    size       BIGINT      NOT NULL,
    head       TEXT        NOT NULL,
    touched_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, sha256)
);
CREATE INDEX blobs_untouched ON blobs (touched_at);

-- `blob_refs`: who refers to a blob. `owner` is a run (its rows go with
-- the run: retention deletes them in its statement, the collector those of
-- runs gone any other way) or, with `keep_until`, an event stored for a
-- correlation key until it expires.
CREATE TABLE blob_refs (
    owner      UUID        NOT NULL,
    namespace  TEXT        NOT NULL,
    sha256     TEXT        NOT NULL,
    keep_until TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, namespace, sha256),
    FOREIGN KEY (namespace, sha256) REFERENCES blobs (namespace, sha256)
);
CREATE INDEX blob_refs_by_blob ON blob_refs (namespace, sha256);
