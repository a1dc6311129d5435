-- Schema version 6 (from 5): the tuning service (`submit`, `serve`, `status`; docs/design/service.md).
--  * queue: the campaigns submitted to run, in claim order. A campaign is queued, running (leased to
--    a worker), done or failed; a worker that stops early (SIGTERM, a GPU that fails) puts it back.
--  * leases: who writes a campaign now. One row per campaign at most (the primary key), taken in the
--    claiming transaction, renewed by heartbeats, deleted on release. Every write of a campaign's
--    results checks in its own transaction that the writer still holds the lease, so two processes
--    never both write one campaign. `tune` takes the same lease as `serve`'s workers.
--  * gpus: each serving host's GPUs as its workers last saw them; a GPU that failed is skipped.

CREATE TABLE queue (
  id           INTEGER PRIMARY KEY,               -- claim order
  campaign     TEXT NOT NULL UNIQUE,              -- the campaign's name (campaigns.name once it runs)
  plan         TEXT NOT NULL DEFAULT '',          -- the plan's model it came from; '' for submit --problem
  regime       TEXT NOT NULL DEFAULT '',          -- prefill | decode | chunk | ''
  problem      TEXT NOT NULL CHECK (json_valid(problem)),
  request      TEXT NOT NULL CHECK (json_valid(request)),  -- spaces and tune options (service/job.hpp)
  state        TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done', 'failed')),
  attempts     INTEGER NOT NULL DEFAULT 0,        -- claims so far
  error        TEXT NOT NULL DEFAULT '',          -- why it failed, or why it went back to the queue
  worker       TEXT NOT NULL DEFAULT '',          -- the last worker that claimed it: "host:pid gpu N"
  submitted_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  started_at   TEXT,                              -- first claimed
  ended_at     TEXT                               -- done or failed
);
CREATE INDEX queue_state ON queue (state, id);

CREATE TABLE leases (
  campaign     TEXT PRIMARY KEY,
  owner        TEXT NOT NULL,                     -- "host:pid:start" (start: the process's start time)
  host         TEXT NOT NULL,
  pid          INTEGER NOT NULL,
  gpu          INTEGER,                           -- the worker's GPU ordinal; NULL for `tune`
  acquired_at  TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  heartbeat_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  expires      REAL NOT NULL                      -- unix seconds: past this without a heartbeat, stale
);

CREATE TABLE gpus (
  host         TEXT NOT NULL,
  ordinal      INTEGER NOT NULL,
  name         TEXT NOT NULL DEFAULT '',
  uuid         TEXT NOT NULL DEFAULT '',
  state        TEXT NOT NULL DEFAULT 'ok' CHECK (state IN ('ok', 'failed')),
  error        TEXT NOT NULL DEFAULT '',
  updated_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  PRIMARY KEY (host, ordinal)
);
