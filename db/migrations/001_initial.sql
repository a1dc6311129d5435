-- Schema version 1: the base. Databases created by attntune before timing statistics and stop
-- reasons were recorded. Never edit a shipped migration; add the next one.

CREATE TABLE devices (
  id             INTEGER PRIMARY KEY,
  name           TEXT NOT NULL,
  arch           TEXT NOT NULL,
  sm_count       INTEGER NOT NULL CHECK (sm_count >= 0),
  uuid           TEXT,
  driver_version TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX devices_identity ON devices (name, arch, IFNULL(uuid, ''));

CREATE TABLE campaigns (
  id             INTEGER PRIMARY KEY,
  name           TEXT NOT NULL UNIQUE,
  problem        TEXT NOT NULL CHECK (json_valid(problem)),
  b              INTEGER NOT NULL,
  h              INTEGER NOT NULL,
  hkv            INTEGER NOT NULL,
  s              INTEGER NOT NULL,
  sk             INTEGER NOT NULL,
  d              INTEGER NOT NULL,
  dtype          TEXT NOT NULL CHECK (dtype IN ('fp16', 'bf16')),
  causal         INTEGER NOT NULL CHECK (causal IN (0, 1)),
  space_path     TEXT NOT NULL,
  space_hash     TEXT NOT NULL,
  family         TEXT NOT NULL,
  strategy       TEXT NOT NULL,
  seed           INTEGER NOT NULL,
  status         TEXT NOT NULL DEFAULT 'running'
                 CHECK (status IN ('running', 'completed', 'stopped', 'failed')),
  budget_evals   INTEGER NOT NULL DEFAULT 0,
  budget_seconds REAL NOT NULL DEFAULT 0,
  device_id      INTEGER NOT NULL REFERENCES devices (id),
  started_at     TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  ended_at       TEXT
);
CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal);

CREATE TABLE candidates (
  id          INTEGER PRIMARY KEY,
  family      TEXT NOT NULL,
  config      TEXT NOT NULL CHECK (json_valid(config)),
  config_key  TEXT NOT NULL,
  source_hash TEXT NOT NULL,
  UNIQUE (family, config_key, source_hash)
);

CREATE TABLE builds (
  id            INTEGER PRIMARY KEY,
  source_hash   TEXT NOT NULL,
  arch          TEXT NOT NULL,
  nvrtc_version TEXT NOT NULL,
  options       TEXT NOT NULL,
  status        TEXT NOT NULL CHECK (status IN ('ok', 'compile_error', 'compile_timeout')),
  cubin         BLOB,
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

CREATE TABLE evaluations (
  id           INTEGER PRIMARY KEY,
  campaign_id  INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
  seq          INTEGER NOT NULL CHECK (seq >= 1),
  candidate_id INTEGER NOT NULL REFERENCES candidates (id),
  device_id    INTEGER NOT NULL REFERENCES devices (id),
  status       TEXT NOT NULL CHECK (status IN ('ok', 'compile_error', 'compile_timeout', 'resources',
                                               'launch_error', 'crashed', 'timeout', 'wrong_result',
                                               'nan_or_unwritten')),
  error        TEXT NOT NULL DEFAULT '',
  median_us    REAL,
  count        INTEGER NOT NULL DEFAULT 0,
  tflops       REAL,
  max_abs_err  REAL,
  err_bound    REAL,
  evaluated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  CHECK (status <> 'ok' OR (median_us IS NOT NULL AND tflops IS NOT NULL AND max_abs_err IS NOT NULL)),
  UNIQUE (campaign_id, seq)
);
CREATE INDEX evaluations_campaign_status ON evaluations (campaign_id, status);
