-- attntune database, schema version 10 (the highest db/migrations/NNN_*.sql). A new database is
-- created from this file; an older one is brought here by the migrations, and a test checks that
-- both roads end at the same tables, columns and indexes. The store sets PRAGMA application_id
-- ("ATTN") and PRAGMA user_version in the same transaction.
-- Times are ISO-8601 UTC with milliseconds ("2025-01-31T12:00:00.000Z").

-- A GPU. The uuid may be unknown (NULL); uniqueness then counts it as ''.
CREATE TABLE devices (
  id             INTEGER PRIMARY KEY,
  name           TEXT NOT NULL,                   -- "NVIDIA H100 80GB HBM3"
  arch           TEXT NOT NULL,                   -- "sm_90"
  sm_count       INTEGER NOT NULL CHECK (sm_count >= 0),
  uuid           TEXT,                            -- "GPU-5d0e..."
  driver_version TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX devices_identity ON devices (name, arch, IFNULL(uuid, ''));

-- A tuning run for one problem over one or more search spaces (one per template family); resumed
-- by name. A campaign of several families (since version 4) has family = the families joined with
-- '+' (sorted), space_hash = the hash of the set, space_path = the paths joined with ' + ' and
-- space_text = ''; campaign_spaces holds each space.
CREATE TABLE campaigns (
  id             INTEGER PRIMARY KEY,
  name           TEXT NOT NULL UNIQUE,
  problem        TEXT NOT NULL CHECK (json_valid(problem)),  -- Problem::json()
  -- The problem again, as columns to query by (`best --problem`).
  b              INTEGER NOT NULL,
  h              INTEGER NOT NULL,
  hkv            INTEGER NOT NULL,
  s              INTEGER NOT NULL,
  sk             INTEGER NOT NULL,
  d              INTEGER NOT NULL,
  dtype          TEXT NOT NULL CHECK (dtype IN ('fp16', 'bf16')),
  causal         INTEGER NOT NULL CHECK (causal IN (0, 1)),
  page           INTEGER NOT NULL DEFAULT 0 CHECK (page >= 0),  -- since version 5: 0 dense, N paged KV cache
  varlen         INTEGER NOT NULL DEFAULT 0 CHECK (varlen >= 0),     -- since version 8: 0, or N: packed batch
  lens_seed      INTEGER NOT NULL DEFAULT 0 CHECK (lens_seed >= 0),  -- since version 8: its lengths' seed
  variants       TEXT NOT NULL DEFAULT '',        -- since version 9: Problem::variant_spec(), empty when plain;
                                                  -- with ",latent=1" (or "latent=1") after it for a latent
                                                  -- problem (Problem::variants_column(); no schema change)
  space_path     TEXT NOT NULL,
  space_hash     TEXT NOT NULL,                   -- content hash of the space file
  family         TEXT NOT NULL,                   -- kernel template ("template" in JSON)
  strategy       TEXT NOT NULL,
  seed           INTEGER NOT NULL,
  status         TEXT NOT NULL DEFAULT 'running'
                 CHECK (status IN ('running', 'completed', 'stopped', 'failed')),
  stop_reason    TEXT NOT NULL DEFAULT '',        -- since version 2
  budget_evals   INTEGER NOT NULL DEFAULT 0,      -- 0: no limit
  budget_seconds REAL NOT NULL DEFAULT 0,         -- 0: no limit
  device_id      INTEGER NOT NULL REFERENCES devices (id),
  started_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  ended_at       TEXT,
  -- Since version 3: the space YAML, for replay/export. Since version 10: dv, the head dim of V and
  -- the output, 0 when it is d (one head dim). (No comment after the last column: SQLite's DROP
  -- COLUMN, which tests use to make older databases, leaves a trailing one before the parenthesis.)
  space_text     TEXT NOT NULL DEFAULT '',
  dv             INTEGER NOT NULL DEFAULT 0 CHECK (dv >= 0)
);
CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, variants, dv);

-- Since version 7: each run of a campaign (the first, then each resume): what it asked for and how
-- it ended; campaigns keeps the latest run's (db/migrations/007_campaign_runs.sql).
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

-- Since version 4: the search spaces of each campaign, one row per template family (one row for a
-- campaign of one family, repeating its campaigns columns).
CREATE TABLE campaign_spaces (
  campaign_id INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
  family      TEXT NOT NULL,                    -- kernel template of the space
  space_path  TEXT NOT NULL,
  space_hash  TEXT NOT NULL,                    -- content hash of the space file
  space_text  TEXT NOT NULL DEFAULT '',         -- the YAML ('' for campaigns from before version 3)
  PRIMARY KEY (campaign_id, family)
);

-- A config of a template, as rendered: the same config from an edited template is another candidate.
CREATE TABLE candidates (
  id          INTEGER PRIMARY KEY,
  family      TEXT NOT NULL,
  config      TEXT NOT NULL CHECK (json_valid(config)),  -- canonical: keys sorted
  config_key  TEXT NOT NULL,                             -- canonical "block_m=128,block_n=64"
  source_hash TEXT NOT NULL,                             -- content hash of the rendered source
  UNIQUE (family, config_key, source_hash)
);

-- The compile cache: one NVRTC result per source, arch, compiler version and options.
CREATE TABLE builds (
  id            INTEGER PRIMARY KEY,
  source_hash   TEXT NOT NULL,
  arch          TEXT NOT NULL,
  nvrtc_version TEXT NOT NULL,
  options       TEXT NOT NULL,
  status        TEXT NOT NULL CHECK (status IN ('ok', 'compile_error', 'compile_timeout')),
  cubin         BLOB,                             -- NULL unless ok
  log           TEXT NOT NULL DEFAULT '',
  registers     INTEGER NOT NULL DEFAULT 0,
  smem_static   INTEGER NOT NULL DEFAULT 0,
  spill_stores  INTEGER NOT NULL DEFAULT 0,
  spill_loads   INTEGER NOT NULL DEFAULT 0,
  local_bytes   INTEGER NOT NULL DEFAULT 0,
  compile_ms    REAL NOT NULL DEFAULT 0,
  created_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  UNIQUE (source_hash, arch, nvrtc_version, options)
);

-- Every outcome of every candidate, failures included: failures are data.
CREATE TABLE evaluations (
  id           INTEGER PRIMARY KEY,
  campaign_id  INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
  seq          INTEGER NOT NULL CHECK (seq >= 1),  -- 1, 2, ... in evaluation order within the campaign
  candidate_id INTEGER NOT NULL REFERENCES candidates (id),
  device_id    INTEGER NOT NULL REFERENCES devices (id),
  status       TEXT NOT NULL CHECK (status IN ('ok', 'compile_error', 'compile_timeout', 'resources',
                                               'launch_error', 'crashed', 'timeout', 'wrong_result',
                                               'nan_or_unwritten')),
  error        TEXT NOT NULL DEFAULT '',
  median_us    REAL,
  min_us       REAL,                              -- since version 2
  max_us       REAL,                              -- since version 2
  stdev_us     REAL,                              -- since version 2
  count        INTEGER NOT NULL DEFAULT 0,        -- timed launches
  tflops       REAL,
  max_abs_err  REAL,
  err_bound    REAL,
  evaluated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  -- since version 3: 'search', or 'final' for the re-timing of the top candidates at the end
  phase        TEXT NOT NULL DEFAULT 'search' CHECK (phase IN ('search', 'final')),
  CHECK (status <> 'ok' OR (median_us IS NOT NULL AND tflops IS NOT NULL AND max_abs_err IS NOT NULL)),
  UNIQUE (campaign_id, seq)
);
-- `best` and `campaigns` walk a campaign's ok evaluations fastest first (ties: candidate, then
-- rowid); with candidate_id in the index the walk never reads the table, only the rows it returns.
CREATE INDEX evaluations_best ON evaluations (campaign_id, status, median_us, candidate_id);

-- A campaign's result: its top candidates re-timed interleaved at the end, fastest first.
CREATE TABLE rankings (
  campaign_id  INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
  rank         INTEGER NOT NULL CHECK (rank >= 1),
  candidate_id INTEGER NOT NULL REFERENCES candidates (id),
  device_id    INTEGER NOT NULL REFERENCES devices (id),
  median_us    REAL NOT NULL,                   -- median over the rounds of each round's median
  tflops       REAL NOT NULL,
  max_abs_err  REAL NOT NULL,                   -- the largest error over the rounds
  spread_pct   REAL NOT NULL DEFAULT 0,         -- (slowest - fastest round) / median, in percent
  rounds       INTEGER NOT NULL CHECK (rounds >= 1),
  ranked_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  PRIMARY KEY (campaign_id, rank),
  UNIQUE (campaign_id, candidate_id)
);

-- Since version 6: the tuning service's queue, the campaigns' leases and the serving hosts' GPUs
-- (db/migrations/006_queue.sql says what each holds).
CREATE TABLE queue (
  id           INTEGER PRIMARY KEY,               -- claim order
  campaign     TEXT NOT NULL UNIQUE,              -- the campaign's name (campaigns.name once it runs)
  plan         TEXT NOT NULL DEFAULT '',          -- the plan's model it came from; '' for submit --problem
  regime       TEXT NOT NULL DEFAULT '',          -- prefill | decode | chunk | varlen | ''
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
