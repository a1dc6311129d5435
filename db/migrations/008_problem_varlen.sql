-- Schema version 8 (from 7): variable-length packed batches (`varlen=N` in a problem spec: b
-- sequences of lengths drawn from N..s by a generator seeded with `lens_seed=M`, through
-- attntune_attention_forward_varlen). campaigns gets both as problem columns, 0 for every other
-- problem (every campaign before this version), and campaigns_problem indexes them, so that
-- `best --problem`, export, warm starts and merge never mix a packed batch with its dense shape
-- or with another draw of lengths.

ALTER TABLE campaigns ADD COLUMN varlen INTEGER NOT NULL DEFAULT 0 CHECK (varlen >= 0);
ALTER TABLE campaigns ADD COLUMN lens_seed INTEGER NOT NULL DEFAULT 0 CHECK (lens_seed >= 0);

DROP INDEX campaigns_problem;
CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed);
