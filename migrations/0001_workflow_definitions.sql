-- Workflow definitions: one immutable row per (namespace, name, version).
-- Registering identical content again returns the existing version, found
-- through content_hash.
CREATE TABLE workflow_definitions (
    namespace     TEXT        NOT NULL,
    name          TEXT        NOT NULL,
    version       INTEGER     NOT NULL CHECK (version >= 1),
    description   TEXT        NOT NULL DEFAULT '',
    source        TEXT        NOT NULL,
    definition    JSONB       NOT NULL,
    content_hash  TEXT        NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name, version)
);

-- ListWorkflows pages by (namespace, name); GetWorkflow (latest) reads the
-- highest version of one name: both are served by the primary key.
