-- Schema version 5 (from 4): problems over a paged KV cache (`page=N` in a problem spec: pages of
-- N rows read through a block table). campaigns gets the page size as a problem column, 0 for a
-- dense problem (every campaign before this version), and campaigns_problem indexes it, so that
-- `best --problem` and warm starts never mix a paged problem with its dense shape.

ALTER TABLE campaigns ADD COLUMN page INTEGER NOT NULL DEFAULT 0 CHECK (page >= 0);

DROP INDEX campaigns_problem;
CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal, page);
