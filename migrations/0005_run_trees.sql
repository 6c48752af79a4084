-- run_trees: how many runs a root run's tree holds (the root, its children,
-- theirs, ...), so that recursion through SUB_WORKFLOW and MAP stops at
-- `--max-runs-per-tree` instead of filling the database. A row appears when
-- a root starts its first child and goes with the root.
CREATE TABLE run_trees (
    root_run_id UUID    PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    runs        INTEGER NOT NULL
);
