-- Schema version 2 (from 1):
--  * evaluations keep the spread of their timings (min, max, standard deviation), not only the
--    median, so reports can tell a noisy measurement from a real difference;
--  * campaigns record why they stopped (budget spent, interrupted, space exhausted, error);
--  * "best ok evaluations of a campaign" walk an index in median order that also names the
--    candidate, instead of sorting or reading the table.

ALTER TABLE evaluations ADD COLUMN min_us REAL;
ALTER TABLE evaluations ADD COLUMN max_us REAL;
ALTER TABLE evaluations ADD COLUMN stdev_us REAL;

ALTER TABLE campaigns ADD COLUMN stop_reason TEXT NOT NULL DEFAULT '';
-- Campaigns that ended under version 1 did not say why.
UPDATE campaigns SET stop_reason = 'not recorded (schema version 1)' WHERE status <> 'running';

DROP INDEX evaluations_campaign_status;
CREATE INDEX evaluations_best ON evaluations (campaign_id, status, median_us, candidate_id);
