-- MigrateRuns (issue 37, decision 0043): a bulk operation of kind MIGRATE
-- carries what it moves runs to. `params` holds a kind's own arguments:
-- for MIGRATE {"target_version": N, "node_mapping": {"OLD": "NEW"}}; the
-- other kinds leave it empty.
ALTER TABLE bulk_operations ADD COLUMN params JSONB NOT NULL DEFAULT '{}';
