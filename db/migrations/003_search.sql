-- Schema version 3 (from 2): what `tune`, `replay`, `report` and `export` need.
--  * campaigns keep the text of their search space, so a recorded campaign can be replayed,
--    reported and exported on another machine without the file it was tuned from;
--  * evaluations say which phase made them: the search, or the re-timing of the top candidates
--    at the end of a campaign ('final'), which must not count as evaluating a config twice;
--  * rankings hold each campaign's result: its top candidates re-timed interleaved, in order.

ALTER TABLE campaigns ADD COLUMN space_text TEXT NOT NULL DEFAULT '';

ALTER TABLE evaluations ADD COLUMN phase TEXT NOT NULL DEFAULT 'search' CHECK (phase IN ('search', 'final'));

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
