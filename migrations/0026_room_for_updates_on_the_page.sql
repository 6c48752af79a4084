-- More room on each page for the next version of a row (decision 0054).
--
-- An update is heap-only (no new index entry) only when the new version
-- fits on the old one's page. A run's row is written about four times and
-- a node's row twice, each soon after the insert, while the page fills
-- with the rows of other runs inserted at the same time: at 70 % (runs)
-- and 80 % (run_nodes) half of the node rows' and a third of the runs'
-- updates that change no indexed column found no room, went to another
-- page with a new entry in every index, and wrote a row lock first (Postgres
-- locks the old version before it lets go of its page). At 50 % in B1
-- every node update and every run update but the status change is
-- heap-only: 280 WAL bytes per task fewer. Tasks keep a fifth more room
-- for their lease and outcome on the same page. The price is space: an
-- insert fills a page of runs or node rows only to half, so rows that are
-- never updated again (an ended run's) take up to twice the pages.
ALTER TABLE runs SET (fillfactor = 50);
ALTER TABLE run_nodes SET (fillfactor = 50);
ALTER TABLE tasks SET (fillfactor = 60);
