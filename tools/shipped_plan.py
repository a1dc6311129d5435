#!/usr/bin/env python3
"""The plan of the shipped database (docs/design/shipped_db.md): the attention problems of the
common model families, prefill and decode, written as an `attntune plan` file (docs/design/plan.md,
"The plan file") that `attntune submit` queues and `attntune serve` tunes.

usage: tools/shipped_plan.py [-o PLAN.yaml] [--dtype bf16|fp16|both] [--bin ATTNTUNE] [--no-models] [--count]

Two parts, in this order:
1. What a user's `attntune plan --model config.json` asks for: the default plan (its default
   batches, lengths, contexts and pages; the model's dtype; windows, soft-caps, sinks and MLA as
   the model has them) of each model in MODELS, made by `attntune plan` itself, so that `export
   --all-best --plan` answers such a user's whole plan from the shipped database on day one.
2. A grid for the warm starts and for problems no plan names: the families below span what such
   models run (query heads 8..128, GQA groups 1..16, head dims 64, 128 and 256) at the lengths
   (512..32k; chunked prefills of 512 and 2048 queries over 4k and 8k keys; batches of 1k
   non-causal sequences) and decode batches
   (1..256, pages of 16 and 64) that serving uses, so `tune` finds a shipped neighbour within a
   factor of 2 of any length for the same head dim and layout; and
   multi-head latent attention's decode over its latent cache (d=576, dv=512, one KV head,
   `latent=1`), DeepSeek's. Plain attention only (part 1 has the variants).
Each part in spread order (round robin over its blocks, each block from the middle of its range
outwards), so that a build stopped part-way has covered every model, family and regime.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Part 1's models: configs with the published models' attention keys (tests/data/models/README.md
# says where each number comes from). Not falcon_rw_1b (ALiBi: refused by plan) nor
# qwen25_1p5b_swa (a published config with its window switched on, which no checkpoint ships).
MODELS = ["llama3_8b", "qwen2_7b", "mistral_7b_v01", "gpt_oss_20b", "gemma3_4b", "gemma2_9b",
          "deepseek_v3", "llama2_7b", "falcon_7b"]

# name, query heads, KV heads, head dim. Each family's heads are as its config.json has them
# (tests/data/models/ holds some); the names are for the reader, the plan keeps only the shapes.
FAMILIES = [
    ("llama-3-8b / mistral-7b", 32, 8, 128),      # group 4
    ("llama-2-7b", 32, 32, 128),                  # group 1 (multi-head)
    ("qwen2.5-7b", 28, 4, 128),                   # group 7, odd head count
    ("llama-3-70b / qwen2.5-72b", 64, 8, 128),    # group 8
    ("llama-3.1-405b", 128, 8, 128),              # group 16, the most heads
    ("llama-3.2-1b", 32, 8, 64),                  # d=64
    ("qwen2.5-0.5b", 14, 2, 64),                  # group 7, few heads
    ("gpt-oss-20b (plain layers)", 64, 8, 64),    # d=64, group 8
    ("gemma-2-9b", 16, 8, 256),                   # d=256, group 2
    ("gemma-3-4b", 8, 4, 256),                    # d=256, 8 heads
    ("phi-3.5-moe-like", 16, 16, 64),             # multi-head at d=64
]

PREFILL_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
# Non-causal prefill (encoders, cross-attention, bidirectional prefixes): fewer lengths.
NONCAUSAL_SEQLENS = [512, 4096, 16384]
# Batches of short prompts: the same work as one long prompt, laid out across the grid.
PREFILL_BATCHED = [(8, 512), (4, 2048)]
# Batches of short non-causal sequences (encoders, bidirectional prefixes run batched): the warm start
# of a batched non-causal shape had only single-sequence non-causal and batched causal neighbours
# (runs 284 and 295: b4 h20 s=1000 d=64 stayed 1.023x behind its pick at its 4th evaluation).
NONCAUSAL_BATCHED = [(4, 1024)]
# Chunked prefill (a chunk of a long prompt's queries over the keys cached before it and its own,
# bottom-right causal: what serving engines run for long prompts): (batch, chunk, keys). The warm
# starts of such shapes had no neighbour of their kind (run 284: a 512-query chunk over 4608 keys
# stayed 1.10x behind its pick after 5 evaluations). Dense here; `plan --regimes chunk` plans a
# model's over its paged cache.
CHUNKED_PREFILL = [(1, 2048, 8192), (4, 512, 4096)]
DECODE_BATCHES = [1, 8, 32, 64, 128, 256]
DECODE_CONTEXTS = [2048, 8192, 32768]
PAGES = [16, 64]
# Multi-head latent attention's decode over its latent cache (DeepSeek-V2/V3, Kimi: one KV head of
# 576 dims a token, V its first 512; flash_decode_wgmma): the query heads a GPU holds under tensor
# parallelism (128 / 8 = 16) and under data-parallel attention (128), FlashMLA's pages of 64.
MLA_DECODE_HEADS = [16, 128]
MLA_DECODE_BATCHES = [1, 8, 32, 64, 128]
# The KV cache of the largest decode problems is bounded (K and V of every sequence, bf16): b *
# context <= 2M tokens keeps any family's cache under 17 GB, so a worker's validation (inputs, fp32
# reference, poisoned output) fits beside others on one GPU.
MAX_DECODE_TOKENS = 2 * 1024 * 1024


def spec(b, h, hkv, s, sk, d, dtype, causal, page=0, dv=0, latent=False):
    # The canonical spec (Problem::str()): the order `attntune plan` writes, so a plan diffs cleanly.
    out = f"b={b},h={h},hkv={hkv},s={s},sk={sk},d={d}" + (f",dv={dv}" if dv and dv != d else "")
    out += f",dtype={dtype},causal={int(causal)}"
    return out + (f",page={page}" if page else "") + (",latent=1" if latent else "")


def spread(items):
    """items reordered so that any prefix spans their range: the middle one, then the middles of
    the two halves, and so on (breadth first over the bisection)."""
    out, spans = [], [(0, len(items))]
    while spans:
        lo, hi = spans.pop(0)
        if lo >= hi:
            continue
        mid = (lo + hi) // 2
        out.append(items[mid])
        spans += [(lo, mid), (mid + 1, hi)]
    return out


def interleave(*lists):
    out = []
    for i in range(max(len(x) for x in lists)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def blocks(dtype):
    """The plan as blocks of related problems (a family's prefill, its decode, an MLA head count),
    each in spread order."""
    out = []
    for _, h, hkv, d in FAMILIES:
        causal = [(spec(1, h, hkv, s, s, d, dtype, True), "prefill") for s in spread(PREFILL_SEQLENS)]
        other = interleave([(spec(1, h, hkv, s, s, d, dtype, False), "prefill") for s in spread(NONCAUSAL_SEQLENS)],
                           [(spec(b, h, hkv, s, s, d, dtype, True), "prefill") for b, s in PREFILL_BATCHED],
                           [(spec(b, h, hkv, s, s, d, dtype, False), "prefill") for b, s in NONCAUSAL_BATCHED],
                           [(spec(b, h, hkv, s, sk, d, dtype, True), "prefill") for b, s, sk in CHUNKED_PREFILL])
        out.append(interleave(causal, other))
    for i, (_, h, hkv, d) in enumerate(FAMILIES):
        # Each family gets both page sizes, alternating over its batches, so the plan holds every
        # (batch, page) pair across families without doubling every decode problem.
        page = {b: PAGES[(i + j) % len(PAGES)] for j, b in enumerate(DECODE_BATCHES)}
        out.append([(spec(b, h, hkv, 1, sk, d, dtype, True, page[b]), "decode")
                    for sk in spread(DECODE_CONTEXTS) for b in spread(DECODE_BATCHES) if b * sk <= MAX_DECODE_TOKENS])
    for h in MLA_DECODE_HEADS:
        out.append([(spec(b, h, 1, 1, sk, 576, dtype, True, 64, dv=512, latent=True), "decode")
                    for sk in spread(DECODE_CONTEXTS) for b in spread(MLA_DECODE_BATCHES)
                    if b * sk <= MAX_DECODE_TOKENS])
    return out


def model_blocks(binary, models):
    """Each model's default plan, as `attntune plan --model` makes it (part 1), a block per model."""
    out = []
    for m in models:
        path = os.path.join(ROOT, "tests", "data", "models", m + ".json")
        r = subprocess.run([binary, "plan", "--model", path, "--format", "json"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"shipped_plan.py: attntune plan --model {path} failed ({r.returncode}): {r.stderr.strip()}")
        entries = [(e["problem"], e["regime"]) for e in json.loads(r.stdout)["problems"]]
        out.append(spread(entries))
    return out


def problems(dtypes, binary=None, models=()):
    """Every problem once, in round-robin order over the blocks (the first problem of each block,
    then the second of each, ...), the models' plans first: `serve` claims in plan order, so a build
    stopped part-way (tools/build_shipped_db.sh --serve-seconds) has covered every model, family,
    regime and head dim at a spread of lengths and batches, not the first families completely and
    the rest not at all."""
    out = interleave(*model_blocks(binary, models)) if models else []
    out += interleave(*[b for dtype in dtypes for b in blocks(dtype)])
    seen, unique = set(), []
    for p, regime in out:
        if p not in seen:
            seen.add(p)
            unique.append((p, regime))
    return unique


def plan_yaml(entries):
    lines = ["# attntune plan: the shipped database's problems (tools/shipped_plan.py; docs/design/shipped_db.md)",
             "model: attntune-shipped", "source: shipped_plan.py", "problems:"]
    lines += [f'  - {{problem: "{p}", regime: {r}}}' for p, r in entries]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", help="the plan file to write (default: stdout)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "both"], default="bf16",
                    help="the grid's dtype: bf16 (default: what most checkpoints use), fp16, or both (the models' plans keep each model's own)")
    ap.add_argument("--bin", default=os.environ.get("ATTNTUNE_BIN", os.path.join(ROOT, "build", "attntune")),
                    help="the attntune binary that plans the models ($ATTNTUNE_BIN, else build/attntune)")
    ap.add_argument("--no-models", action="store_true", help="the grid only (part 2): no binary needed")
    ap.add_argument("--count", action="store_true", help="print the number of problems only")
    a = ap.parse_args()
    dtypes = ["bf16", "fp16"] if a.dtype == "both" else [a.dtype]
    models = [] if a.no_models else MODELS
    if models and not os.access(a.bin, os.X_OK):
        sys.exit(f"shipped_plan.py: no attntune binary at '{a.bin}' to plan the models (--bin, $ATTNTUNE_BIN; "
                 "--no-models for the grid alone)")
    entries = problems(dtypes, a.bin, models)
    if a.count:
        print(len(entries))
        return 0
    text = plan_yaml(entries)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
