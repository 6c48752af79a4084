-- Every event rewrites its run's row and the node rows it touches. With
-- free space left in each page, Postgres can make those HOT updates (the new
-- version on the same page, no index entry written), as long as no indexed
-- column changes, which is true of every event but a run's first and last.
-- Applies to pages written from now on.
ALTER TABLE runs SET (fillfactor = 70);
ALTER TABLE run_nodes SET (fillfactor = 80);
