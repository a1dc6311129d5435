-- Schema version 9 (from 8): attention variants in a problem spec (`window=L,R`, `softcap=C`,
-- `sinks=1`: sliding windows, logit soft-capping, attention sinks). campaigns gets them as one
-- problem column, `variants`: the canonical spec text of the variants alone (Problem::variant_spec,
-- e.g. "window=4096,softcap=50,sinks=1"), '' for a plain problem (every campaign before this
-- version). campaigns_problem indexes it, so that `best --problem`, export, warm starts and merge
-- never mix a windowed problem with its full-attention shape.

ALTER TABLE campaigns ADD COLUMN variants TEXT NOT NULL DEFAULT '';

DROP INDEX campaigns_problem;
CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, variants);
