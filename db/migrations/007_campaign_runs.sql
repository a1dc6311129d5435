-- Schema version 7 (from 6): each run of a campaign (the first, then each resume) keeps what it
-- asked for. campaigns holds the latest run's budgets, strategy, seed and device; a resume with
-- other budgets overwrote the earlier ones (issue 28). One row per run: its number, budgets,
-- strategy, seed and device, when it started and ended, how it ended. A campaign from before this
-- version gets one row, its first run as the campaigns row last recorded it.

CREATE TABLE campaign_runs (
  campaign_id    INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
  run            INTEGER NOT NULL CHECK (run >= 1),  -- 1, 2, ... within the campaign
  strategy       TEXT NOT NULL,
  seed           INTEGER NOT NULL,
  budget_evals   INTEGER NOT NULL DEFAULT 0,         -- 0: no limit
  budget_seconds REAL NOT NULL DEFAULT 0,            -- 0: no limit
  device_id      INTEGER NOT NULL REFERENCES devices (id),
  started_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  ended_at       TEXT,
  status         TEXT NOT NULL DEFAULT 'running'
                 CHECK (status IN ('running', 'completed', 'stopped', 'failed')),
  stop_reason    TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (campaign_id, run)
);

INSERT INTO campaign_runs (campaign_id, run, strategy, seed, budget_evals, budget_seconds, device_id, started_at,
                           ended_at, status, stop_reason)
  SELECT id, 1, strategy, seed, budget_evals, budget_seconds, device_id, started_at, ended_at, status, stop_reason
  FROM campaigns;
