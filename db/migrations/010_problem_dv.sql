-- Schema version 10 (from 9): a value head dim that differs from the query/key one (`dv=N` in a
-- problem spec; DeepSeek's MLA prefill is d=192,dv=128). campaigns gets it as a problem column, `dv`:
-- 0 when V's head dim is d (every campaign before this version, and every problem with one head
-- dim), else the value head dim. campaigns_problem indexes it, so that `best --problem`, export,
-- warm starts and merge never mix a (192, 128) problem with its (192, 192) shape.

ALTER TABLE campaigns ADD COLUMN dv INTEGER NOT NULL DEFAULT 0 CHECK (dv >= 0);

DROP INDEX campaigns_problem;
CREATE INDEX campaigns_problem ON campaigns (b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, variants, dv);
