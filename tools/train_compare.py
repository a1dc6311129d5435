#!/usr/bin/env python3
"""A real training step (issue 45): a small Llama-style decoder trained with attntune's attention and
with PyTorch's SDPA from the same seed, weights and batches; loss curves, step time and attention time
side by side, and a verdict on whether the curves match to within bf16 noise.

The model: token embedding, N pre-norm blocks (RMSNorm; attention with RoPE and GQA, heads_q query
heads over heads_kv KV heads at head_dim; SwiGLU MLP), a final RMSNorm and an untied (--tie-embeddings:
tied) output projection; no biases, no dropout. Defaults: 8 layers, d_model 2048, 16/4 heads at head
dim 128, SwiGLU hidden 5632, vocab 32000, seqlen 4096, micro-batch 1 (about 0.5 B parameters).
Precision is the usual mixed recipe: fp32 master weights and AdamW state, the matmuls under
torch.autocast(bf16), RMSNorm, RoPE, the residual stream and the loss in fp32; q, k, v enter attention
as bf16 [B, H, S, D] views of [B, S, H, D] tensors (the same tensors on every side), causal.

The data: one fixed token stream from a seeded generator (random.Random, so the same on every
machine), with structure a model learns in a few hundred steps: a first-order Markov chain whose
successors (--data-branch of them per token) are drawn from a Zipf law over the vocabulary, broken into
segments of 8-32 tokens of which half (--data-copy) repeat an earlier span of the same sequence (an
induction task: attention has to find and copy it). Step i's batch depends on (seed, i) alone; every run
sees the same batches in the same order.

The runs, interleaved step by step in one process (each step's order rotates), from one initial
state_dict and fresh AdamW (betas 0.9/0.95, weight decay, linear LR warm-up, gradient clipping):
  - sdpa (the reference): F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), the backend
    torch picks (reported: torch._fused_sdp_choice), or --sdpa-backend;
  - the noise run(s) (--noise-backend, default auto): SDPA pinned to another backend than the
    reference's (cuDNN <-> flash, else efficient, else math; a backend that refuses enable_gqa gets K/V
    repeated to heads_q), optionally --repeat-reference (the reference's backend again: run-to-run
    nondeterminism alone);
  - attntune (--package DIR, what `attntune export --torch DIR` wrote): attntune.attention(q, k, v,
    is_causal=True). Before training, explain() says which kernel the forward and the backward
    (attention_backward) would run at the model's shape; a shape that would fall back stops the run
    (--allow-fallback runs it anyway). During the run the ops' policy is "raise" (a call no kernel
    serves raises, so a finished run ran kernels only); with --allow-fallback it is "sdpa" and the
    calls that fell back are counted (coverage()). Either way coverage() must show layers x steps
    kernel calls for the forward and as many for the backward, and no fallback, for the verdict to be
    attntune's.

The sides are validated before any training, the reference included (run 194's was broken): the
in-situ check runs every side (and the gradient check's fp32 attention) on the model's own layer-0
attention call, q, k, v and dO as the initial model's forward and backward on batch 0 made them,
their strides too, after every probe (so that what the probes left behind, a cached cuDNN graph, is
what the check meets). Each side's O, dQ, dK and dV are held to FlashAttention-2's criterion against
float64 attention: max |x - x_64| <= 2 x max |x_same - x_64| + atol, x_same attention by its
definition in bf16 (P rounded to bf16; not SDPA's math backend, which computes in fp32 inside), atol
2^-9 x max |x_64|, dO scaled by a power of two to unit scale. The table says which side failed. A
failing reference is replaced, under --sdpa-backend auto, by the first valid SDPA side (a noise run
that passed, else another backend), said so; pinned, or with none valid, the run stops (inconclusive).
A failing noise run is dropped (under auto: replaced by another valid backend); with attntune and no
noise run left, the run stops. attntune failing it makes the verdict mismatch.

The tolerance, measured rather than assumed. Two correct attention implementations in bf16 differ
per call by a few bf16 ulps: they accumulate in other orders and round P (and dS) to bf16 at other
places. A training run compounds those differences chaotically, so two runs from the same seed,
weights and batches drift apart by an amount set by the model, the data, the LR and the step count,
not by a constant one could write down; and a backward whose dQ goes through atomics (FlashAttention-2,
attntune's flash_bwd_mma) is not even bit-reproducible against itself. So the noise floor is measured
on this very run, and attntune is held to two criteria, both with K = --tol-factor (3):

1. The loss curves. d_noise(t) = |L_noise(t) - L_ref(t)|, the deviation of the noise run (SDPA on
   another backend; several: the larger of each statistic) from the reference, is the bf16 noise of
   this run; attntune's d(t) = |L_attntune(t) - L_ref(t)| must keep
       mean_t d(t) <= K * mean_t d_noise(t)   and   max_t d(t) <= K * max_t d_noise(t).
   The mean tests the whole curve, the max a divergence late in the run; step 0 (identical weights)
   shows the forward alone.
2. Step 0's gradients, where every run has the same weights and batch: each run's gradients against
   those of the same model with its attention computed in fp32 (SDPA over upcast q, k, v with
   autocast off inside: SDPA is on autocast's bf16 list; the rest of the model as in every run), as
   ||g - g_fp32|| / ||g_fp32|| per parameter kind (wq, wk, wv, wo, the MLP's, norms, embeddings) over
   the layers. attntune's error of each kind must be at most K x the largest of the SDPA runs'
   (FlashAttention-2's criterion, over the whole model's backward).

The reference is held to step 0's gradients too, against a scale that does not trust it: an SDPA run
whose error of some kind exceeds 10 x the largest of the other SDPA backends' runs' and of the same
model's with attention by its definition in bf16 (the same-dtype column: what bf16 rounding alone
does; it keeps the scale honest when the only other run is the math backend, fp32 inside), is broken,
not noisy. A broken reference makes the verdict inconclusive ("the reference
disagrees with fp32 attention"), never match, in an SDPA-only run too; a broken noise run is left out of
the floor and of the gradient peers.

Why K = 3 and not 1: the envelope of one pair of chaotic trajectories is itself a noisy estimate (its
max especially), and a correct kernel may round somewhat worse than the peers: FlashAttention-2's
criterion, which every attntune kernel passes per call, allows twice the error of a same-dtype
reference, and an error twice as large per call moves the loss and the gradients about twice as far.
Why both: the curves are the issue's question (does training with attntune go where training with
SDPA goes), but they are a blunt instrument early in a run, while the gradients are a sharp one at
one point. On a CPU (docs/design/training_run.md has the table; 2 layers, 4 steps), a second correct
implementation (SDPA math with K/V repeated) stays within 1.1x of the peers on both; a backward with
dQ scaled by 0.98 gives 4x the peers' wq-gradient error, the softmax scale off by 2 % 4x, dV by 2 %
6.5x, dK by 10 % 19x, a dropped dQ 200x: all rejected by the gradients, while their loss curves stay
within 3x the noise over those few steps; a non-causal mask is rejected by both (300x). A noise run
identical to the reference bit for bit gives no floor: the verdict is then inconclusive (pick another
--noise-backend). A non-finite loss of attntune's fails; of SDPA's, the verdict is inconclusive. The
in-situ check rejects each of those stand-ins before training as well (tests/torch/).

Times: step time is the median over the steps after --warmup of the wall time of one training step
(forward, loss, backward, clipping, AdamW) between two device synchronisations. Attention time is the
attention op alone at the model's shape, forward and forward+backward (torch.autograd.grad with a fixed
dO), of every side, timed with CUDA events in interleaved rounds after the training (--bench-rounds
rounds of >= --bench-seconds each, medians); per step it is layers x forward+backward.

Output: the in-situ check's table, a table every --log-every steps (losses, |differences|, step
times), the summary (max and mean |loss difference|, tolerance, verdict and why, step and attention
times side by side, attntune's coverage), step 0's gradient errors, --csv (per step: every run's loss,
LR, step time, gradient norm, deviations) and --json (everything). Exit status 0 when the curves and
gradients match and every attntune call ran a kernel, or in an SDPA-only run (no --package, e.g. the
CPU smoke) whose reference is sound; 1 when they do not match, a call fell back, or the verdict is
inconclusive; 2 for bad arguments.

    # on a GPU with an exported package (docs/design/training_run.md has the whole recipe)
    python3 tools/train_compare.py --package train_pkg --csv train.csv --json train.json
    # a short check of the same, and the SDPA side alone on a CPU
    python3 tools/train_compare.py --package train_pkg --layers 2 --steps 10 --seqlen 512
    python3 tools/train_compare.py --smoke
"""
import argparse
import contextlib
import csv
import json
import math
import os
import random
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULTS = dict(layers=8, d_model=2048, heads=16, kv_heads=4, head_dim=None, ffn=None, vocab=32000, seqlen=4096,
                batch=1, steps=200, warmup=5, lr=5e-4, lr_warmup=20, log_every=10)
# --smoke: the logic on a CPU (two cores: well under a minute), GQA 4:1 as the full run's.
SMOKE = dict(layers=2, d_model=256, heads=4, kv_heads=1, vocab=2048, seqlen=256, steps=10, warmup=2, lr=1e-3,
             lr_warmup=2, log_every=1)
BACKENDS = ("flash", "cudnn", "efficient", "math")
# An SDPA run whose step-0 gradient error of some kind exceeds this many times the other SDPA runs' and
# the same-dtype reference's is broken (check_sdpa_runs): bf16 rounding differs by a few x, not 10.
REFERENCE_FACTOR = 10.0


# ----------------------------------------------------------------------------------------------- config

class Config:
    """The model's shape and the run's precision."""

    def __init__(self, vocab, d_model, layers, heads, kv_heads, head_dim=None, ffn=None, rope_theta=10000.0,
                 eps=1e-5, tie_embeddings=False, dtype="bf16", init_std=0.02):
        self.vocab, self.d_model, self.layers = vocab, d_model, layers
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = head_dim if head_dim else d_model // heads
        # Llama's SwiGLU width: 2/3 of 4 d, rounded up to a multiple of 256 (5632 at d_model 2048).
        self.ffn = ffn if ffn else ((8 * d_model // 3 + 255) // 256) * 256
        self.rope_theta, self.eps, self.tie_embeddings = rope_theta, eps, tie_embeddings
        self.dtype, self.init_std = dtype, init_std

    @property
    def compute_dtype(self):
        return torch.bfloat16 if self.dtype == "bf16" else torch.float32

    def as_dict(self):
        return dict(vars(self))


# ------------------------------------------------------------------------------------------------- data

class TokenStream:
    """A seeded synthetic corpus with learnable structure (module docstring): batch(step) is a [batch,
    seqlen + 1] int64 tensor, the same for a given (seed, step) on any machine and in any order."""

    def __init__(self, vocab, seqlen, batch, seed, branch=4, copy=0.5, zipf=1.1, seg=(8, 32)):
        if vocab < 2:
            raise ValueError("TokenStream: vocab must be >= 2")
        self.vocab, self.seqlen, self.batch, self.seed = vocab, seqlen, batch, seed
        self.branch, self.copy, self.seg = branch, copy, seg
        rng = random.Random(f"attntune-train-table:{seed}:{vocab}:{branch}:{zipf}")
        cum, total = [], 0.0
        for r in range(vocab):
            total += 1.0 / (r + 5) ** zipf
            cum.append(total)
        # A random relabelling, so that frequent tokens are not simply the low ids.
        perm = list(range(vocab))
        rng.shuffle(perm)
        draws = rng.choices(perm, cum_weights=cum, k=vocab * branch)
        self.table = [draws[t * branch:(t + 1) * branch] for t in range(vocab)]
        self.first = [perm[i] for i in range(min(vocab, 64))]  # where a sequence starts

    def sequence(self, step, row):
        rng = random.Random(f"attntune-train-seq:{self.seed}:{step}:{row}")
        n = self.seqlen + 1
        toks = [self.first[rng.randrange(len(self.first))]]
        lo, hi = self.seg
        while len(toks) < n:
            length = rng.randint(lo, hi)
            if len(toks) >= 2 * length and rng.random() < self.copy:
                start = rng.randrange(0, len(toks) - length)
                toks.extend(toks[start:start + length])
            else:
                prev = toks[-1]
                for _ in range(length):
                    prev = self.table[prev][rng.randrange(self.branch)]
                    toks.append(prev)
        return toks[:n]

    def batch_at(self, step):
        return torch.tensor([self.sequence(step, r) for r in range(self.batch)], dtype=torch.long)


# ------------------------------------------------------------------------------------------------ model

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seqlen, head_dim, theta, device):
    """cos, sin [S, 1, D] fp32 (rotate-half RoPE, as Llama's Hugging Face port)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.outer(torch.arange(seqlen, dtype=torch.float64), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos().float()[:, None, :].to(device), emb.sin().float()[:, None, :].to(device))


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h, self.hkv, self.d = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, self.h * self.d, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.hkv * self.d, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.hkv * self.d, bias=False)
        self.wo = nn.Linear(self.h * self.d, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, attn, dtype):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.h, self.d)
        k = self.wk(x).view(b, s, self.hkv, self.d)
        v = self.wv(x).view(b, s, self.hkv, self.d)
        q = apply_rope(q.float(), cos, sin).to(dtype)
        k = apply_rope(k.float(), cos, sin).to(dtype)
        v = v.to(dtype)
        o = attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # [B, H, S, D] views of [B, S, H, D]
        return self.wo(o.transpose(1, 2).reshape(b, s, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn, bias=False)  # gate
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn, cfg.d_model, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.d_model, cfg.eps), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.d_model, cfg.eps), MLP(cfg)

    def forward(self, x, cos, sin, attn, dtype):
        x = x + self.attn(self.attn_norm(x), cos, sin, attn, dtype)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """The Llama-style decoder; forward(tokens, attn) -> fp32 logits, attn(q, k, v) the attention
    ([B, H, S, D] q, [B, Hkv, S, D] k and v, causal) under test. With dtype bf16 the forward runs under
    torch.autocast(bf16) of its own."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model, cfg.eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self._rope = {}  # (seqlen, device) -> (cos, sin): not buffers, so a meta-built copy needs none

    def init_weights(self, seed):
        """Normal(0, init_std) everywhere, the residual branches' output projections scaled by
        1/sqrt(2 layers) (GPT-2's rule), norms at one; from `seed` alone."""
        g = torch.Generator().manual_seed(seed)
        std = self.cfg.init_std
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    s = std / math.sqrt(2 * self.cfg.layers) if name.endswith(("wo.weight", "w2.weight")) else std
                    p.copy_(torch.randn(p.shape, generator=g) * s)
        return self

    def rope(self, seqlen, device):
        key = (seqlen, str(device))
        if key not in self._rope:
            self._rope[key] = rope_tables(seqlen, self.cfg.head_dim, self.cfg.rope_theta, device)
        return self._rope[key]

    def forward(self, tokens, attn):
        cos, sin = self.rope(tokens.shape[1], tokens.device)
        dtype = self.cfg.compute_dtype
        with torch.autocast(device_type=tokens.device.type, dtype=torch.bfloat16, enabled=self.cfg.dtype == "bf16"):
            x = self.embed(tokens)
            for blk in self.blocks:
                x = blk(x, cos, sin, attn, dtype)
            x = self.norm(x)
            logits = F.linear(x, self.embed.weight) if self.lm_head is None else self.lm_head(x)
        return logits.float()


def param_count(cfg):
    d, hd = cfg.d_model, cfg.head_dim
    block = d * hd * (2 * cfg.heads + 2 * cfg.kv_heads) + 3 * d * cfg.ffn + 2 * d
    return cfg.vocab * d * (1 if cfg.tie_embeddings else 2) + cfg.layers * block + d


# ---------------------------------------------------------------------------------------- attention sides

def _sdp_backend(name):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def _backend_name(value):
    """SDPBackend (or its int) -> our name ("flash", "cudnn", ...), else str(value)."""
    from torch.nn.attention import SDPBackend
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.CUDNN_ATTENTION: "cudnn",
             SDPBackend.EFFICIENT_ATTENTION: "efficient", SDPBackend.MATH: "math"}
    for be, n in names.items():
        if value == be or (isinstance(value, int) and value == int(be.value)):
            return n
    return str(value)


class SdpaAttention:
    """F.scaled_dot_product_attention, causal, GQA by enable_gqa ("native") or K/V repeated to heads_q
    ("repeat"), under `backend` (None: torch's pick, recorded at the first call in .picked)."""

    def __init__(self, backend=None, gqa="native"):
        self.backend, self.gqa, self.picked = backend, gqa, None

    def _context(self):
        if self.backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel
        return sdpa_kernel([_sdp_backend(self.backend)])

    def describe(self):
        chosen = self.backend or f"auto -> {self.picked or '?'}"
        return f"SDPA {chosen}" + (", K/V repeated" if self.gqa == "repeat" else ", enable_gqa")

    def __call__(self, q, k, v):
        kw = {}
        if k.shape[1] != q.shape[1]:
            if self.gqa == "repeat":
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            else:
                kw["enable_gqa"] = True
        with self._context():
            if self.picked is None:
                self.picked = sdpa_pick(q, k, v, kw.get("enable_gqa", False)) if self.backend is None else \
                    self.backend
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)


def sdpa_pick(q, k, v, enable_gqa):
    """The backend torch's SDPA picks for this call under the current sdpa_kernel flags (its private
    torch._fused_sdp_choice), or "unknown"."""
    try:
        return _backend_name(torch._fused_sdp_choice(q, k, v, None, 0.0, True, scale=None, enable_gqa=enable_gqa))
    except Exception:  # a torch without it, or with another signature: the report says unknown
        return "unknown"


class AttntuneAttention:
    """attntune.attention(q, k, v, is_causal=True) of a loaded package ([B, H, S, D], as SDPA)."""

    def __init__(self, module):
        self.module = module

    def describe(self):
        return f"attntune.attention ({os.path.dirname(os.path.dirname(os.path.abspath(self.module.__file__)))})"

    def __call__(self, q, k, v):
        return self.module.attention(q, k, v, is_causal=True)


def load_attntune(path):
    """The attntune package of an `attntune export --torch DIR` directory (DIR, or DIR/attntune): its
    directory goes first on sys.path and the package is imported (the first import builds it)."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, "attntune", "__init__.py")):
        root = path
    elif os.path.basename(path) == "attntune" and os.path.isfile(os.path.join(path, "__init__.py")):
        root = os.path.dirname(path)
    else:
        raise ValueError(f"--package {path}: no attntune package there (expected {path}/attntune/__init__.py, "
                         "as `attntune export --torch DIR` writes it)")
    sys.path.insert(0, root)
    import attntune
    where = os.path.dirname(os.path.abspath(attntune.__file__))
    if os.path.dirname(where) != root:
        raise ValueError(f"--package {root}: `import attntune` found another package first ({where})")
    attntune.default()  # raises, saying so, when the package holds no kernels
    return attntune


def describe(attn):
    return attn.describe() if hasattr(attn, "describe") else getattr(attn, "__name__", type(attn).__name__)


def probe_sdpa(attn, shape, dtype, device):
    """The backend `attn` (an SdpaAttention) runs at the model's attention shape, forward and backward
    ("unknown" where torch does not say), or None where it refuses the shape.

    Every tensor has the training's layout, dO included: [B, H, S, D] views of [B, S, H, D]. torch's
    cuDNN SDPA caches its backward graph per q, k, v layout, and the graph it builds at the first call
    may keep that call's dO strides (torch's aten/src/ATen/native/cudnn/MHA.cpp, in the versions whose
    cache key holds q, k and v's layouts but not dO's): a later call with another dO layout would reuse
    it and read dO wrongly. The likely cause of run 194's broken reference, probed with the contiguous
    dO of `o.float().sum().backward()` (docs/design/training_run.md)."""
    b, h, hkv, s, d = shape
    q = torch.randn(b, s, h, d, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(b, s, hkv, d, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(b, s, hkv, d, device=device, dtype=dtype, requires_grad=True)
    do = torch.randn(b, s, h, d, device=device, dtype=dtype)
    try:
        with warnings.catch_warnings():  # a refusing backend warns why, then raises
            warnings.simplefilter("ignore")
            o = attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            torch.autograd.grad(o, (q, k, v), do.transpose(1, 2))
        return attn.picked or "unknown"
    except RuntimeError:
        return None
    finally:
        attn.picked = None


def pick_noise_backends(spec, ref_backend, shape, dtype, device):
    """The noise runs' SdpaAttention(s) for --noise-backend `spec`: "none", "auto" (one backend other
    than the reference's that runs the shape: cuDNN <-> flash first, then efficient, then math), or a
    comma-separated list of backends. Each gets enable_gqa, or K/V repeated where it refuses that."""
    if spec == "none":
        return []
    if spec == "auto":
        prefer = {"cudnn": ["flash"], "flash": ["cudnn"]}.get(ref_backend, ["flash", "cudnn"])
        names = prefer + [b for b in BACKENDS if b not in prefer and b != ref_backend]
        want = 1
    else:
        names, want = spec.split(","), None
    out = []
    for name in names:
        for gqa in ("native", "repeat"):
            cand = SdpaAttention(name, gqa)
            if probe_sdpa(cand, shape, dtype, device) is not None:
                out.append(cand)
                break
        else:
            if want is None:
                raise ValueError(f"--noise-backend {name}: SDPA's {name} backend refuses the model's attention "
                                 f"(b, h, hkv, s, d = {shape}, {dtype}) on {device}")
        if want is not None and len(out) == want:
            break
    if not out:
        raise ValueError(f"--noise-backend auto: no SDPA backend other than the reference's ({ref_backend}) runs "
                         f"the model's attention on {device}: name one (--noise-backend) or --repeat-reference")
    return out


# ----------------------------------------------------------------------------------------------- training

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(cfg, state, device):
    """A Decoder on `device` holding `state` (built on the meta device: no init of its own)."""
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device=device)
    model.load_state_dict(state)
    return model


class Run:
    """One training run: its own copy of the model (from the shared initial state), AdamW and LR."""

    def __init__(self, name, attn, cfg, state, device, lr, lr_warmup, weight_decay, grad_clip):
        self.name, self.attn, self.cfg, self.device = name, attn, cfg, device
        self.model = build_model(cfg, state, device)
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        plain = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                      {"params": plain, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: min(1.0, (i + 1) / max(1, lr_warmup)))
        self.grad_clip = grad_clip
        self.losses, self.times, self.grad_norms, self.lrs = [], [], [], []

    def step(self, x, y, grad_hook=None):
        self.lrs.append(self.opt.param_groups[0]["lr"])
        sync(self.device)
        t0 = time.perf_counter()
        logits = self.model(x, self.attn)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        if grad_hook is not None:
            sync(self.device)
            paused = time.perf_counter()
            grad_hook(self)
            sync(self.device)
            t0 += time.perf_counter() - paused  # not the step's time
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        sync(self.device)
        self.times.append(time.perf_counter() - t0)
        self.losses.append(loss.item())
        self.grad_norms.append(gn.item())
        return self.losses[-1]


def param_kind(name):
    """A parameter's kind across layers: "blocks.3.attn.wq.weight" -> "wq", "embed.weight" -> "embed",
    "norm.weight" -> "final_norm"."""
    parts = name.split(".")
    if parts[0] == "blocks":
        return parts[-2]
    return "final_norm" if parts[0] == "norm" else parts[0]


class Fp32Attention:
    """The gradient check's reference attention: SDPA over q, k, v upcast to fp32 (K/V repeated to
    heads_q, which every backend takes; torch picks it: the efficient kernel or math on a GPU), the
    output rounded back to q's dtype as every side's is.

    Autocast is off inside: the model calls attention under its torch.autocast(bf16), and SDPA is on
    autocast's lower-precision list (CUDA and CPU), so without that the fp32 inputs would be cast back
    to bf16 and this would be bf16 SDPA with K/V repeated, not fp32 attention (run 194: the reference
    run's final_norm and lm_head gradients equalled this model's bit for bit)."""

    def describe(self):
        return "SDPA in fp32"

    def __call__(self, q, k, v):
        rep = q.shape[1] // k.shape[1]
        with torch.autocast(device_type=q.device.type, enabled=False):
            qf, kf, vf = q.float(), k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
        if o.dtype != torch.float32:
            raise RuntimeError(f"Fp32Attention: SDPA returned {o.dtype}, not float32: the gradient check's reference "
                               "would not be fp32 attention")
        return o.to(q.dtype)


def plain_attention(q, k, v, dtype):
    """Causal attention of [B, H, S, D] q over [B, Hkv, S, D] k and v (K/V repeated to H) by its
    definition, in `dtype`, with autograd: scores and P rounded to `dtype`, the softmax in fp32 (fp64 for
    fp64), as FlashAttention-2's tests and tests/harness/bwd_check.py write the same-dtype reference.
    Autocast off."""
    rep = q.shape[1] // k.shape[1]
    with torch.autocast(device_type=q.device.type, enabled=False):
        qq, kk, vv = q.to(dtype), k.to(dtype), v.to(dtype)
        if rep > 1:
            kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
        s = (qq @ kk.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
        n, m = s.shape[-2:]
        visible = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
        p = torch.softmax(s.masked_fill(~visible, float("-inf")).to(torch.promote_types(dtype, torch.float32)), -1)
        return p.to(dtype) @ vv


def _groups(q, k):
    """The query heads of each KV head: [(slice of q's heads, slice of k's heads)]."""
    rep = q.shape[1] // k.shape[1]
    return [(slice(g * rep, (g + 1) * rep), slice(g, g + 1)) for g in range(k.shape[1])]


def plain_grads(q, k, v, do, dtype):
    """[o, dq, dk, dv] of plain_attention in `dtype` at output gradient `do`, one KV head's group of
    query heads at a time (one group's S x S scores in memory at once, not every head's)."""
    outs = [[], [], [], []]
    for hq, hk in _groups(q, k):
        xs = [t.detach().to(dtype).requires_grad_() for t in (q[:, hq], k[:, hk], v[:, hk])]
        with torch.enable_grad():
            o = plain_attention(*xs, dtype)
            grads = torch.autograd.grad(o, xs, do[:, hq].to(dtype))
        for acc, t in zip(outs, (o.detach(),) + grads):
            acc.append(t)
    return [torch.cat(acc, dim=1) for acc in outs]


class _SameDtype(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        with torch.no_grad():
            return torch.cat([plain_attention(q[:, hq], k[:, hk], v[:, hk], q.dtype) for hq, hk in _groups(q, k)],
                             dim=1)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        _, dq, dk, dv = plain_grads(q, k, v, do, q.dtype)
        return dq, dk, dv


class SameDtypeAttention:
    """Attention by its definition in q's dtype (plain_attention: FlashAttention-2's same-dtype
    reference), a KV group at a time, recomputed in the backward: the scale of the gradient check
    (what a bf16 attention's rounding alone does to the model's gradients)."""

    def describe(self):
        return "attention by its definition in the compute dtype"

    def __call__(self, q, k, v):
        return _SameDtype.apply(q, k, v)


class Capture:
    """`attn`, keeping its first call's q, k, v and output gradient dO (layer 0's, with their strides)."""

    def __init__(self, attn):
        self.attn, self.saved = attn, None

    def describe(self):
        return describe(self.attn)

    def __call__(self, q, k, v):
        o = self.attn(q, k, v)
        if self.saved is None:
            self.saved = [q.detach(), k.detach(), v.detach(), None]
            if o.requires_grad:
                o.register_hook(self._keep)
        return o

    def _keep(self, grad):
        self.saved[3] = grad.detach()


def reference_grads(cfg, state, tokens, device, attn=None):
    """Step 0's gradients {name: tensor} of the model with `attn` (default Fp32Attention), from `state` on
    batch `tokens` (the rest of the model in its mixed precision, as in every run)."""
    model = build_model(cfg, state, device)
    tokens = tokens.to(device)
    logits = model(tokens[:, :-1], Fp32Attention() if attn is None else attn)
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return {n: p.grad for n, p in model.named_parameters()}


class GradCheck:
    """Step 0's gradients, where every run has the same weights and batch, against those of the model
    with its attention in fp32 (reference_grads): ||g - g_fp32|| / ||g_fp32|| per parameter kind over all
    layers, errors[run][kind]."""

    def __init__(self, truth):
        self.truth, self.errors = truth, {}

    def __call__(self, run):
        self.add(run.name, {n: p.grad for n, p in run.model.named_parameters()})

    def add(self, name, grads):
        """errors[name] for the gradients {parameter name: tensor or None} of one model."""
        acc = {}
        for n, r in self.truth.items():
            g = grads.get(n)
            rf = r.float()
            d2 = (rf.pow(2).sum() if g is None else (g.float() - rf).pow(2).sum()).item()
            a = acc.setdefault(param_kind(n), [0.0, 0.0])
            a[0] += d2
            a[1] += rf.pow(2).sum().item()
        self.errors[name] = {k: (math.sqrt(d / r) if r > 0 else (0.0 if d == 0 else float("inf")))
                             for k, (d, r) in acc.items()}

    def release(self):
        self.truth = None


# atol of the in-situ check, times the largest |entry| of the float64 result: a quarter to a half of a ulp
# of that entry in the dtype, what storing it alone may cost (tests/harness/bwd_check.py's 1/512 for bf16
# and 1/4096 for fp16, whose random tensors are of unit scale).
IN_SITU_ATOL = {torch.bfloat16: 2.0 ** -9, torch.float16: 2.0 ** -12, torch.float32: 2.0 ** -25}
IN_SITU_TENSORS = ("o", "dq", "dk", "dv")


def strided_like(t, values):
    """`values` in a new tensor of t's shape, dtype and strides."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(values)


class InSituCheck:
    """Each attention side on the model's own layer-0 attention call, before training: q, k, v and dO as
    the initial model's forward and backward on batch 0 made them (Capture: their strides too), against
    float64 attention by FlashAttention-2's criterion, max |x - x_64| <= 2 x max |x_same - x_64| + atol
    for O, dQ, dK and dV (x_same: plain_attention in the inputs' dtype; atol IN_SITU_ATOL x max |x_64|).
    dO is scaled by a power of two to an RMS in [0.5, 1) (exact; the backward is linear in it),
    so that atol means what it does in the kernel tests. check(attn) -> {ok, err, bound, error}."""

    def __init__(self, q, k, v, do, autocast):
        if do is None:
            raise ValueError("InSituCheck: no dO was captured (the capture's output did not require grad)")
        rms = do.double().pow(2).mean().sqrt().item()
        self.scale = 2.0 ** -(math.floor(math.log2(rms)) + 1) if rms > 0 and math.isfinite(rms) else 1.0
        self.q, self.k, self.v, self.autocast = q, k, v, autocast
        self.do = strided_like(do, do * self.scale)
        self.truth = plain_grads(q, k, v, self.do, torch.float64)
        same = plain_grads(q, k, v, self.do, q.dtype)
        eps = IN_SITU_ATOL.get(q.dtype, 0.0)
        self.same_dtype = {n: (x.double() - t).abs().max().item() for n, x, t in zip(IN_SITU_TENSORS, same, self.truth)}
        self.atol = {n: eps * t.abs().max().item() for n, t in zip(IN_SITU_TENSORS, self.truth)}
        self.bound = {n: 2 * self.same_dtype[n] + self.atol[n] for n in IN_SITU_TENSORS}

    def describe(self):
        def lay(t):
            return f"{list(t.shape)} {t.dtype} strides {list(t.stride())}".replace("torch.", "")
        return f"q {lay(self.q)}, k {lay(self.k)}, v {lay(self.v)}, dO {lay(self.do)} (x 2^{math.log2(self.scale):g})"

    def check(self, attn):
        xs = [t.detach().requires_grad_() for t in (self.q, self.k, self.v)]
        try:
            with torch.autocast(device_type=self.q.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                o = attn(*xs)
            grads = torch.autograd.grad(o, xs, self.do)
        except (RuntimeError, ValueError) as e:  # a backend that refuses, a policy that raises
            return dict(ok=False, err={}, bound=dict(self.bound), error=f"{type(e).__name__}: {str(e)[:300]}")
        err = {}
        for n, x, t in zip(IN_SITU_TENSORS, (o,) + tuple(grads), self.truth):
            err[n] = (x.double() - t).abs().max().item() if x.shape == t.shape else float("inf")
        ok = all(err[n] <= self.bound[n] for n in IN_SITU_TENSORS)  # NaN fails
        return dict(ok=ok, err=err, bound=dict(self.bound), error=None)


def backend_of(attn):
    """An SdpaAttention's backend (its pin, else torch's pick at its first call), else None."""
    if not isinstance(attn, SdpaAttention):
        return None
    return attn.backend or attn.picked or "unknown"


def sdpa_label(attn):
    return f"sdpa-{attn.backend}" + ("-repeat" if attn.gqa == "repeat" else "")


def choose_sides(check, ref, noises, candidate, args, shape, dtype, device, out=print):
    """The in-situ check (InSituCheck) of every side, and the reference and noise runs it leaves: a side
    that fails is reported; a failing reference is replaced, when --sdpa-backend is auto, by the first
    valid SDPA side (a noise run's backend that passed, else another backend, in BACKENDS' order), else
    the run stops; a failing noise run is dropped, and with --noise-backend auto replaced by another
    valid backend than the reference's. Returns {ref, noises, rows (the table), stop (why the run
    stops, or None), fp32_ok, candidate_ok}."""
    rows = []

    def run(name, attn, used):
        r = check.check(attn)
        rows.append(dict(side=name, attention=describe(attn), used=used, **r))
        return r

    ref_ok = run("sdpa", ref, "reference")["ok"]
    noise_ok = [run(f"sdpa-{n.backend}", n, "noise")["ok"] for n in noises]
    fp32_ok = run("fp32", Fp32Attention(), "gradient check's truth")["ok"]
    candidate_ok = run("attntune", candidate, "candidate")["ok"] if candidate is not None else None
    failed = {backend_of(ref)} if not ref_ok else set()
    failed |= {n.backend for n, ok in zip(noises, noise_ok) if not ok}

    def alternative(exclude):
        """The first backend not in `exclude` that runs the shape and passes (native GQA, else K/V repeated)."""
        for backend in BACKENDS:
            if backend in exclude:
                continue
            for gqa in ("native", "repeat"):
                cand = SdpaAttention(backend, gqa)
                if probe_sdpa(cand, shape, dtype, device) is None:
                    continue
                if run(sdpa_label(cand), cand, "-")["ok"]:
                    return cand, rows[-1]
                failed.add(backend)
                break
        return None, None

    stop = None
    if not ref_ok:
        rows[0]["used"] = "- (fails)"
        out(f"train_compare: IN-SITU CHECK FAILED: the reference ({describe(ref)}) is wrong on layer 0's attention "
            "call (table below)")
        if args.sdpa_backend != "auto":
            stop = (f"the reference, pinned by --sdpa-backend {args.sdpa_backend}, fails the in-situ check: pick "
                    "another --sdpa-backend (or auto)")
        else:
            new = next((i for i, ok in enumerate(noise_ok) if ok), None)
            if new is not None:
                ref, row = noises[new], rows[1 + new]
            else:
                ref, row = alternative(failed | {n.backend for n in noises})
            if ref is None:
                stop = "the reference fails the in-situ check and no other SDPA backend passes it"
            else:
                row["used"] = "reference"
                out(f"train_compare: the reference is {describe(ref)} instead, the first valid SDPA side")
    kept = []
    if stop is None:
        for i, (n, ok) in enumerate(zip(noises, noise_ok)):
            row = rows[1 + i]
            if n is ref:
                continue
            if not ok:
                row["used"] = "- (fails)"
                out(f"train_compare: IN-SITU CHECK FAILED: the noise run ({describe(n)}) is wrong on layer 0's "
                    "attention call: dropped (table below)")
            else:
                kept.append(n)
        if not kept and noises and args.noise_backend == "auto":
            alt, row = alternative(failed | {backend_of(ref)})
            if alt is not None:
                row["used"] = "noise"
                kept.append(alt)
                out(f"train_compare: the noise run is {describe(alt)} instead")
    if candidate_ok is False:
        out("train_compare: IN-SITU CHECK FAILED: attntune's attention is wrong on layer 0's attention call, or "
            "raised (table below)")
    if not fp32_ok:
        out("train_compare: IN-SITU CHECK FAILED: fp32 attention, the gradient check's truth, is wrong on layer 0's "
            "attention call (table below)")
    return dict(ref=ref, noises=kept, rows=rows, stop=stop, fp32_ok=fp32_ok, candidate_ok=candidate_ok)


def in_situ_table(check, rows, out=print):
    out(f"in-situ check, layer 0's attention call of the initial model on batch 0: {check.describe()}. Max "
        "|x - x_fp64| of each side, at most 2 x the same-dtype reference's + atol (FlashAttention-2's criterion):")
    widths = [11, 34] + [9] * len(IN_SITU_TENSORS) + [7, 4, 0]
    out(fmt_row(["side", "attention"] + list(IN_SITU_TENSORS) + ["worst", "", "used as"], widths))
    out(fmt_row(["bound", "2 x same-dtype + atol"] + [f"{check.bound[n]:.2e}" for n in IN_SITU_TENSORS] + ["", "", ""],
                widths))
    for r in rows:
        errs = [f"{r['err'][n]:.2e}" if n in r["err"] else "-" for n in IN_SITU_TENSORS]
        worst = max((r["err"][n] / check.bound[n] for n in r["err"] if check.bound[n] > 0), default=float("nan"))
        out(fmt_row([r["side"], r["attention"][:34]] + errs + [f"{worst:.2f}x", "ok" if r["ok"] else "FAIL", r["used"]],
                    widths))
        if r["error"]:
            out(f"{'':>13}{r['error']}")


def check_sdpa_runs(errors, backends, floor="same-dtype", factor=10.0):
    """Step 0's gradient errors of the SDPA runs (`backends`: {run name: its backend}) against fp32
    attention (GradCheck.errors), each held to factor x the largest of the SDPA runs' on other
    backends and the same-dtype reference's (errors[floor]; it keeps the scale honest when the only
    other run computes in fp32 inside, as the math backend does), kind by kind. Returns {run name:
    ["kind error > factor x scale", ...], the worst first} for the runs far above it: not bf16 rounding,
    a broken run."""
    flagged = {}
    for name, backend in backends.items():
        others = [o for o, b in backends.items() if o != name and b != backend] + ([floor] if floor in errors else [])
        over = []
        for kind, e in errors[name].items():
            scale = max((errors[o].get(kind, 0.0) for o in others), default=0.0)
            if scale > 0 and not e <= factor * scale:  # NaN is flagged
                over.append((e / scale if e == e else float("inf"), f"{kind} {e:.3g} > {factor:g} x {scale:.3g}"))
        if over:
            flagged[name] = [why for _, why in sorted(over, key=lambda x: -x[0])]
    return flagged


def train(runs, batches, device, log=None, grad_check=None):
    """Trains `runs` on `batches` (a list of [B, S + 1] token tensors), one step of each in turn (the
    order rotated every step, so no run always goes first). grad_check: called with each run after
    step 0's backward (GradCheck), before clipping and the optimizer's step."""
    for i, tokens in enumerate(batches):
        tokens = tokens.to(device)
        x, y = tokens[:, :-1], tokens[:, 1:]
        for j in range(len(runs)):
            runs[(i + j) % len(runs)].step(x, y, grad_check if i == 0 else None)
        if i == 0 and grad_check is not None:
            grad_check.release()
        if log is not None:
            log(i)


def initial_state(cfg, seed):
    model = Decoder(cfg).init_weights(seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------------ verdict

def deviation(a, b):
    """|a(t) - b(t)| over the steps of two loss curves: {max, mean, final, argmax}; NaN where a loss is
    not finite."""
    if len(a) != len(b) or not a:
        raise ValueError("deviation: the curves must be non-empty and of one length")
    d = [abs(x - y) for x, y in zip(a, b)]
    if not all(math.isfinite(x) for x in d):
        return dict(max=float("nan"), mean=float("nan"), final=float("nan"), argmax=None)
    i = max(range(len(d)), key=d.__getitem__)
    return dict(max=d[i], mean=sum(d) / len(d), final=d[-1], argmax=i)


def judge(ref, cand, noises, factor=3.0):
    """Whether the loss curve `cand` matches `ref` to within bf16 noise, the noise measured by the
    curves `noises` (other correct implementations from the same start; module docstring):
    mean |cand - ref| <= factor * mean |noise - ref| and max |cand - ref| <= factor * max |noise - ref|
    (the larger of each over the noise curves). Returns {match, inconclusive, reasons, candidate,
    noise, tolerance}."""
    if factor <= 0:
        raise ValueError("judge: factor must be > 0")
    if not noises:
        raise ValueError("judge: no noise curve: the tolerance is measured from at least one")
    reasons, inconclusive = [], False
    for name, c in [("reference", ref), ("candidate", cand)] + [("noise run", n) for n in noises]:
        bad = [i for i, x in enumerate(c) if not math.isfinite(x)]
        if bad:
            reasons.append(f"the {name}'s loss is not finite (step {bad[0]})")
            inconclusive = inconclusive or name != "candidate"
    cd = deviation(cand, ref) if len(cand) == len(ref) else None
    if cd is None:
        raise ValueError(f"judge: the candidate's curve has {len(cand)} steps, the reference's {len(ref)}")
    nds = [deviation(n, ref) for n in noises]
    finite = [n for n in nds if math.isfinite(n["mean"])]
    noise = dict(max=max((n["max"] for n in finite), default=float("nan")),
                 mean=max((n["mean"] for n in finite), default=float("nan")))
    tol = dict(factor=factor, max=factor * noise["max"], mean=factor * noise["mean"])
    if finite and noise["max"] == 0.0:
        inconclusive = True
        reasons.append("the noise run(s) equal the reference bit for bit: no measured noise floor (pick another "
                       "--noise-backend)")
    if not reasons:
        if cd["mean"] > tol["mean"]:
            reasons.append(f"mean |difference| {cd['mean']:.3g} > {factor:g} x the noise's {noise['mean']:.3g}")
        if cd["max"] > tol["max"]:
            reasons.append(f"max |difference| {cd['max']:.3g} (step {cd['argmax']}) > {factor:g} x the noise's "
                           f"{noise['max']:.3g}")
    return dict(match=not reasons, inconclusive=inconclusive, reasons=reasons, candidate=cd,
                noise=dict(noise, runs=nds), tolerance=tol)


def judge_grads(errors, cand, peers, factor=3.0):
    """Whether step 0's gradients of run `cand` are as close to the fp32-attention reference's as SDPA's
    (GradCheck.errors: each run's relative error per parameter kind): FlashAttention-2's criterion over
    the whole model, the candidate's error of each kind at most factor x the largest of the `peers`
    (the SDPA runs). Returns {match, inconclusive, reasons, candidate, peers, worst_kind, worst_ratio}."""
    if cand not in errors or not peers or any(n not in errors for n in peers):
        raise ValueError("judge_grads: step 0's gradients of the candidate and of at least one SDPA run are needed")
    if factor <= 0:
        raise ValueError("judge_grads: factor must be > 0")
    ce = errors[cand]
    pe = {k: max(errors[n].get(k, 0.0) for n in peers) for k in ce}
    reasons, inconclusive = [], False
    if all(v == 0 for v in pe.values()):
        inconclusive = True
        reasons.append("step 0's gradients of the SDPA runs equal the fp32 reference's bit for bit: no measured "
                       "error to hold attntune's to")
    ratios = {k: (ce[k] / pe[k] if pe[k] > 0 else (0.0 if ce[k] == 0 else float("inf"))) for k in ce}
    worst = max(ratios, key=lambda k: ratios[k] if not math.isnan(ratios[k]) else float("inf"))
    if not inconclusive:
        for k in ce:
            if not ce[k] <= factor * pe[k]:  # NaN fails too
                reasons.append(f"step 0's {k} gradients: relative error {ce[k]:.3g} against fp32 attention's, > "
                               f"{factor:g} x SDPA's {pe[k]:.3g}")
    return dict(match=not reasons, inconclusive=inconclusive, reasons=reasons, candidate=ce, peers=pe,
                worst_kind=worst, worst_ratio=ratios[worst])


# ------------------------------------------------------------------------------------------ attention time

def _timed(fn, device, min_seconds):
    """Seconds per call of fn: a first call sets the repeat count, then that many calls between two
    CUDA events (perf_counter on a CPU)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    reps = max(1, int(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    if device.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(stop) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def bench_attention(sides, shape, dtype, device, rounds, min_seconds, seed=0):
    """Each side's attention alone at the model's shape ([B, H, S, D] views of [B, S, H, D] bf16, causal,
    inputs requiring grad as in training): forward, and forward + backward (autograd.grad with a fixed
    dO); `rounds` interleaved rounds after one untimed one, the order rotated each round; medians in
    ms. sides: {name: attn}."""
    b, h, hkv, s, d = shape
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, s, h, d, device=device, dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(b, s, hkv, d, device=device, dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(b, s, hkv, d, device=device, dtype=dtype, generator=g).requires_grad_()
    do = torch.randn(b, s, h, d, device=device, dtype=dtype, generator=g)
    qt, kt, vt, dot = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), do.transpose(1, 2)
    fns = {}
    for name, attn in sides.items():
        fns[(name, "fwd")] = lambda attn=attn: attn(qt, kt, vt)
        fns[(name, "fwd_bwd")] = lambda attn=attn: torch.autograd.grad(attn(qt, kt, vt), (q, k, v), dot)
    keys = list(fns)
    times = {key: [] for key in keys}
    for r in range(rounds + 1):
        for j in range(len(keys)):
            key = keys[(r + j) % len(keys)]
            t = _timed(fns[key], device, min_seconds)
            if r > 0:
                times[key].append(t)
    out = {name: {} for name in sides}
    for (name, what), ts in times.items():
        out[name][what + "_ms"] = statistics.median(ts) * 1e3
    for name in out:
        out[name]["bwd_ms"] = out[name]["fwd_bwd_ms"] - out[name]["fwd_ms"]
    return out


# ------------------------------------------------------------------------------------------------ attntune

def attntune_coverage(lib, layers, steps):
    """What coverage() says of a run of `steps` steps: attention's forward and backward calls that ran a
    kernel and that fell back (a row's status is its shape's decision, which depends on the shape
    alone), and whether there were layers x steps of each."""
    rows = lib.coverage()
    out = dict(rows=rows, fallback_calls=0, kernel_calls={"attention": 0, "attention_backward": 0}, problems=[])
    for r in rows:
        if r["kernel"] is None:
            out["fallback_calls"] += r["calls"]
            out["problems"].append(f"{r['entry']} {r['dtype']} {r['problem']}: {r['calls']} calls fell back "
                                   f"({r['fallback']})")
        elif r["entry"] in out["kernel_calls"]:
            out["kernel_calls"][r["entry"]] += r["calls"]
    for entry, n in out["kernel_calls"].items():
        if n != layers * steps:
            out["problems"].append(f"{entry}: {n} calls ran a kernel, not layers x steps = {layers * steps}")
    return out


# ---------------------------------------------------------------------------------------------------- CLI

def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = ap.add_argument_group("model (defaults: 8 layers, d_model 2048, 16/4 heads at 128, vocab 32000, seqlen 4096)")
    m.add_argument("--layers", type=int)
    m.add_argument("--d-model", type=int)
    m.add_argument("--heads", type=int, help="query heads")
    m.add_argument("--kv-heads", type=int, help="KV heads (GQA: heads is a multiple of it)")
    m.add_argument("--head-dim", type=int, help="default d_model / heads")
    m.add_argument("--ffn", type=int, help="SwiGLU hidden size (default 8/3 d_model rounded up to 256)")
    m.add_argument("--vocab", type=int)
    m.add_argument("--tie-embeddings", action="store_true", help="output projection = embedding (default untied)")
    m.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                   help="bf16: autocast (attntune needs it); fp32: no autocast, SDPA only (CPU checks)")
    t = ap.add_argument_group("training")
    t.add_argument("--seqlen", type=int)
    t.add_argument("--batch", type=int, help="micro-batch (sequences a step)")
    t.add_argument("--steps", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--lr-warmup", type=int, help="steps of linear LR warm-up")
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0, help="weights and data")
    t.add_argument("--data-branch", type=int, default=4, help="Markov successors per token")
    t.add_argument("--data-copy", type=float, default=0.5, help="share of segments copying an earlier span")
    t.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    t.add_argument("--smoke", action="store_true",
                   help="small defaults: " + ", ".join(f"{k} {v}" for k, v in SMOKE.items()) + " (options given win)")
    s = ap.add_argument_group("sides")
    s.add_argument("--package", help="the directory `attntune export --torch DIR` wrote (DIR or DIR/attntune)")
    s.add_argument("--sdpa-backend", default="auto", choices=("auto",) + BACKENDS,
                   help="the reference's SDPA backend (auto: torch picks)")
    s.add_argument("--noise-backend", default="auto",
                   help="auto, none, or a comma-separated list of flash, cudnn, efficient, math: the noise runs")
    s.add_argument("--repeat-reference", action="store_true",
                   help="one more noise run: the reference's own backend again (run-to-run nondeterminism)")
    s.add_argument("--allow-fallback", action="store_true",
                   help="run attntune even where a call falls back (policy sdpa, counted; the verdict still fails)")
    r = ap.add_argument_group("report")
    r.add_argument("--tol-factor", type=float, default=3.0, help="K: attntune's deviation <= K x the noise's")
    r.add_argument("--warmup", type=int, help="steps left out of the median step time")
    r.add_argument("--log-every", type=int, help="table row every N steps")
    r.add_argument("--csv", help="per-step CSV")
    r.add_argument("--json", help="summary JSON")
    r.add_argument("--bench-rounds", type=int, default=5, help="attention timing: interleaved rounds")
    r.add_argument("--bench-seconds", type=float, default=0.3, help="attention timing: seconds a sample")
    r.add_argument("--no-bench", action="store_true", help="skip the attention timing")
    return ap


def resolve(args):
    """Fills the model and run options not given from --smoke's or the full run's defaults."""
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, SMOKE.get(key, value) if args.smoke else value)
    return args


def validate(args):
    """Checks the resolved options; raises ValueError with what is wrong and how to fix it."""
    def positive(name, minimum=1):
        val = getattr(args, name)
        if val < minimum:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum} (got {val})")
    for name in ("layers", "d_model", "heads", "kv_heads", "batch", "steps", "log_every", "bench_rounds"):
        positive(name)
    positive("seqlen", 2)
    positive("vocab", 2)
    positive("data_branch")
    if args.warmup < 0 or args.lr_warmup < 0:
        raise ValueError("--warmup and --lr-warmup must be >= 0")
    if args.warmup >= args.steps:
        raise ValueError(f"--warmup {args.warmup} leaves no timed step of --steps {args.steps}: use fewer warm-up "
                         "steps or more steps")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads} (GQA groups)")
    head_dim = args.head_dim or args.d_model // args.heads
    if not args.head_dim and args.d_model % args.heads:
        raise ValueError(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}: pass --head-dim")
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head dim {head_dim} must be even (RoPE rotates pairs)")
    if args.ffn is not None and args.ffn < 1:
        raise ValueError(f"--ffn must be >= 1 (got {args.ffn})")
    for name in ("lr", "grad_clip", "tol_factor", "bench_seconds"):
        val = getattr(args, name)
        if not (val > 0 and math.isfinite(val)):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number (got {val})")
    if args.weight_decay < 0:
        raise ValueError("--weight-decay must be >= 0")
    if not 0 <= args.data_copy < 1:
        raise ValueError(f"--data-copy must be in [0, 1) (got {args.data_copy})")
    if args.noise_backend not in ("auto", "none"):
        bad = [b for b in args.noise_backend.split(",") if b not in BACKENDS]
        if bad:
            raise ValueError(f"--noise-backend: unknown backend(s) {', '.join(bad)} (auto, none, or a "
                             f"comma-separated list of {', '.join(BACKENDS)})")
    if args.noise_backend == "none" and not args.repeat_reference and args.package:
        raise ValueError("--noise-backend none leaves no noise floor for the verdict: keep a noise backend or add "
                         "--repeat-reference")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device")
    if args.package:
        if device.type != "cuda":
            raise ValueError("--package: attntune's kernels run on a CUDA device (this run is on "
                             f"{device}); without --package the SDPA side runs anywhere")
        if args.dtype != "bf16":
            raise ValueError("--package needs --dtype bf16 (attntune's kernels are bf16 and fp16; fp32 falls back)")
        if not os.path.isdir(args.package):
            raise ValueError(f"--package {args.package}: no such directory")
    return device


def fmt_row(cells, widths):
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))


def compare(args, device, candidate=None, out=print):
    """The whole comparison for resolved, validated args: returns the summary dict (summary["exit"]
    the exit status). candidate: an attention callable in place of --package's (tests), or None."""
    torch.manual_seed(args.seed)
    if device.type == "cpu":
        # AdamW's second moments of tiny early gradients are denormal floats, which x86 cores handle
        # in microcode: 10-20x slower steps on a CPU until they grow. (No effect on a GPU.)
        torch.set_flush_denormal(True)
    cfg = Config(args.vocab, args.d_model, args.layers, args.heads, args.kv_heads, args.head_dim, args.ffn,
                 tie_embeddings=args.tie_embeddings, dtype=args.dtype)
    shape = (args.batch, cfg.heads, cfg.kv_heads, args.seqlen, cfg.head_dim)
    dtype = cfg.compute_dtype
    summary = dict(config=dict(cfg.as_dict(), seqlen=args.seqlen, batch=args.batch, steps=args.steps, lr=args.lr,
                               lr_warmup=args.lr_warmup, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                               seed=args.seed, data_branch=args.data_branch, data_copy=args.data_copy,
                               params=param_count(cfg)),
                   torch=torch.__version__, device=str(device))
    if device.type == "cuda":
        summary["gpu"] = torch.cuda.get_device_name(device)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from gpu_timing import gpu_state
        summary["gpu_state_before"] = gpu_state()
    out(f"train_compare: {cfg.layers} layers, d_model {cfg.d_model}, heads {cfg.heads}/{cfg.kv_heads} at "
        f"{cfg.head_dim}, ffn {cfg.ffn}, vocab {cfg.vocab}, seqlen {args.seqlen}, batch {args.batch}, "
        f"{summary['config']['params'] / 1e6:.1f} M params, {args.steps} steps, {args.dtype}, on "
        f"{summary.get('gpu', device)}; torch {torch.__version__}")

    # The sides.
    lib = attntune = None
    if args.package and candidate is None:
        t0 = time.perf_counter()
        attntune = load_attntune(args.package)
        lib = attntune.default()
        summary["attntune"] = dict(package=os.path.abspath(args.package), load_s=time.perf_counter() - t0)
        explained = {}
        for entry in ("attention", "attention_backward"):
            kernel, why = lib.explain(entry, "bf16", cfg.head_dim, True, args.batch, cfg.heads, cfg.kv_heads,
                                      args.seqlen, args.seqlen)
            explained[entry] = dict(kernel=kernel, reason=why)
            out(f"attntune {entry}: " + (f"kernel {kernel} ({why})" if kernel >= 0 else f"FALLS BACK: {why}"))
        summary["attntune"]["explain"] = explained
        if any(e["kernel"] < 0 for e in explained.values()) and not args.allow_fallback:
            summary.update(verdict="fallback", exit=1)
            out("train_compare: no kernel of the package serves the model's attention (above): tune "
                f"b={args.batch},h={cfg.heads},hkv={cfg.kv_heads},s={args.seqlen},d={cfg.head_dim},dtype=bf16,"
                "causal=1 and the same with ,pass=bwd, export --torch again (docs/design/training_run.md), or "
                "--allow-fallback to run it anyway")
            return summary
        lib.set_policy("sdpa" if args.allow_fallback else "raise")
        candidate = AttntuneAttention(attntune)
    # The reference, and torch's pick of its backend (recorded again at its first call in training).
    ref = SdpaAttention(None if args.sdpa_backend == "auto" else args.sdpa_backend)
    ref_backend = probe_sdpa(ref, shape, dtype, device)
    if ref_backend is None:
        ref.gqa = "repeat"
        ref_backend = probe_sdpa(ref, shape, dtype, device)
        if ref_backend is None:
            raise ValueError(f"--sdpa-backend {args.sdpa_backend}: SDPA refuses the model's attention on {device}")
    noises = pick_noise_backends(args.noise_backend, ref_backend, shape, dtype, device)

    # Data, weights, and step 0's references: the model with fp32 attention (the gradient check's truth,
    # and layer 0's attention inputs and dO for the in-situ check) and with attention by its definition
    # in the compute dtype (the gradient errors' scale).
    t0 = time.perf_counter()
    stream = TokenStream(cfg.vocab, args.seqlen, args.batch, args.seed, branch=args.data_branch, copy=args.data_copy)
    batches = [stream.batch_at(i) for i in range(args.steps)]
    state = initial_state(cfg, args.seed)
    capture = Capture(Fp32Attention())
    grad_check = GradCheck(reference_grads(cfg, state, batches[0], device, capture))
    grad_check.add("same-dtype", reference_grads(cfg, state, batches[0], device, SameDtypeAttention()))

    # Every side on layer 0's own attention call against float64, before any training (after the probes:
    # what they left behind, a cached cuDNN graph, is what training would meet).
    check = InSituCheck(*capture.saved, autocast=cfg.dtype == "bf16")
    del capture
    chosen = choose_sides(check, ref, noises, candidate, args, shape, dtype, device, out)
    ref, noises = chosen["ref"], chosen["noises"]
    sides = [("sdpa", ref)] + [(f"sdpa-{n.backend}", n) for n in noises]
    if args.repeat_reference and chosen["stop"] is None:
        repeat = SdpaAttention(ref.backend, ref.gqa)
        r = check.check(repeat)
        chosen["rows"].append(dict(side="sdpa-repeat", attention=describe(repeat), used="noise", **r))
        sides.append(("sdpa-repeat", repeat))
    if candidate is not None:
        sides.append(("attntune", candidate))
    in_situ_table(check, chosen["rows"], out)
    summary["in_situ"] = dict(inputs=check.describe(), bound=check.bound, same_dtype=check.same_dtype,
                              atol=check.atol, sides=chosen["rows"])
    if chosen["stop"] is None and candidate is not None and len(sides) == 2 and not args.repeat_reference:
        chosen["stop"] = ("no noise run passes the in-situ check: no noise floor (name another --noise-backend, or "
                          "--repeat-reference)")
    if chosen["stop"] is not None:
        summary.update(verdict="inconclusive", verdict_reasons=[chosen["stop"]], exit=1)
        out(f"train_compare: stopped before training: {chosen['stop']}")
        out(f"verdict: inconclusive ({chosen['stop']})")
        return summary
    ref_backend = backend_of(ref)
    for name, attn in sides[1:]:
        if isinstance(attn, SdpaAttention) and backend_of(attn) == ref_backend and name != "sdpa-repeat":
            out(f"train_compare: warning: {name} uses the reference's own backend ({ref_backend}): its deviation "
                "measures nondeterminism only, not a second implementation")

    runs = [Run(name, attn, cfg, state, device, args.lr, args.lr_warmup, args.weight_decay, args.grad_clip)
            for name, attn in sides]
    del state
    out(f"train_compare: data, step 0's references and {len(runs)} copies of the model in "
        f"{time.perf_counter() - t0:.1f} s")

    names = [r.name for r in runs]
    widths = [5] + [max(9, len(n)) for n in names] + [max(9, len(n) + 3) for n in names[1:]] + \
        [max(8, len(n) + 3) for n in names]
    header = ["step"] + names + [f"|{n}-ref|" for n in names[1:]] + [f"{n} ms" for n in names]

    def log(i):
        if i == 0:
            out(fmt_row(header, widths))
        if i % args.log_every == 0 or i == args.steps - 1:
            ref_loss = runs[0].losses[i]
            out(fmt_row([i] + [f"{r.losses[i]:.4f}" for r in runs] +
                        [f"{abs(r.losses[i] - ref_loss):.2e}" for r in runs[1:]] +
                        [f"{r.times[i] * 1e3:.1f}" for r in runs], widths))

    if lib is not None:
        lib.reset_coverage()
    failed = None
    try:
        train(runs, batches, device, log, grad_check)
    except RuntimeError as e:
        if lib is None or "attntune" not in str(e):
            raise
        failed = str(e)
    for name, attn in sides:
        if isinstance(attn, SdpaAttention):
            out(f"{name}: {attn.describe()}")
    summary["runs"] = {}
    for r in runs:
        timed = r.times[args.warmup:]
        summary["runs"][r.name] = dict(attention=describe(r.attn), losses=r.losses, grad_norms=r.grad_norms,
                                       step_ms=[t * 1e3 for t in r.times],
                                       step_ms_median=statistics.median(timed) * 1e3 if timed else None,
                                       first_loss=r.losses[0] if r.losses else None,
                                       last_loss=r.losses[-1] if r.losses else None)
    summary["reference_backend"] = backend_of(ref)
    exit_code = 0
    verdict = "sdpa only (no attntune run)"
    reasons = []  # why the verdict is inconclusive, or why attntune's failed before the curves
    if lib is not None:
        cov = attntune_coverage(lib, cfg.layers, args.steps) if failed is None else None
        summary["attntune"]["coverage"] = cov
        if failed is not None:
            summary["attntune"]["failed"] = failed
            verdict, exit_code = "fallback", 1
            out(f"attntune: a call fell back (policy raise) at step {len(runs[-1].losses)}: {failed}")
        else:
            for p in cov["problems"]:
                out(f"attntune coverage: {p}")
            out(f"attntune coverage: forward {cov['kernel_calls']['attention']} and backward "
                f"{cov['kernel_calls']['attention_backward']} calls ran kernels, {cov['fallback_calls']} fell back "
                f"(expected {cfg.layers * args.steps} each)")
    if failed is None:
        curves = {r.name: r.losses for r in runs}
        sdpa_runs = {r.name: backend_of(r.attn) for r in runs
                     if r.name != "attntune" and isinstance(r.attn, SdpaAttention)}
        noise_names = [n for n in sdpa_runs if n != "sdpa"]
        for n in names[1:]:
            dv = deviation(curves[n], curves["sdpa"])
            out(f"|{n} - sdpa|: max {dv['max']:.3g} (step {dv['argmax']}), mean {dv['mean']:.3g}, "
                f"final {dv['final']:.3g}")
        if grad_check.errors:
            cols = [n for n in names if n in grad_check.errors] + ["same-dtype"]
            kinds = list(grad_check.errors[cols[0]])
            widths = [10] + [max(10, len(n)) for n in cols]
            out("step 0's gradients against the model's with fp32 attention, ||g - g_fp32|| / ||g_fp32|| per "
                "parameter kind over the layers (same-dtype: attention by its definition in the compute dtype):")
            out(fmt_row(["kind"] + cols, widths))
            for k in kinds:
                out(fmt_row([k] + [f"{grad_check.errors[n][k]:.2e}" for n in cols], widths))
            summary["grad_check"] = grad_check.errors
            # The SDPA runs themselves: one far off fp32 attention is broken, not bf16 noise.
            flagged = check_sdpa_runs(grad_check.errors, sdpa_runs, factor=REFERENCE_FACTOR)
            summary["reference_check"] = dict(factor=REFERENCE_FACTOR, flagged=flagged)
            for n, why in flagged.items():
                out(f"train_compare: WARNING: step 0's gradients of {n} ({describe(dict(sides)[n])}) are far from fp32 "
                    f"attention's, more than {REFERENCE_FACTOR:g} x those of the other SDPA runs and of the same-dtype "
                    f"reference: {'; '.join(why)}")
            if "sdpa" in flagged:
                more = len(flagged["sdpa"]) - 1
                reasons.append(f"the reference disagrees with fp32 attention: step 0's {flagged['sdpa'][0]}"
                               + (f" and {more} more parameter kind(s)" if more else ""))
            noise_names = [n for n in noise_names if n not in flagged]
        if not chosen["fp32_ok"]:
            reasons.append("fp32 attention, the gradient check's truth, fails the in-situ check")
        if "attntune" in curves:
            if not noise_names and "sdpa" not in flagged:
                reasons.append("no noise run agrees with fp32 attention: no noise floor")
            j = g = None
            if noise_names:
                j = judge(curves["sdpa"], curves["attntune"], [curves[n] for n in noise_names], args.tol_factor)
                g = judge_grads(grad_check.errors, "attntune", ["sdpa"] + noise_names, args.tol_factor)
                summary["comparison"] = dict(j, sides=dict(reference="sdpa", candidate="attntune", noise=noise_names),
                                             gradients=g)
                out(f"tolerance: mean {j['tolerance']['mean']:.3g}, max {j['tolerance']['max']:.3g} "
                    f"({args.tol_factor:g} x the noise's {j['noise']['mean']:.3g}, {j['noise']['max']:.3g}); step 0's "
                    f"gradients: attntune's error at most {g['worst_ratio']:.2g} x SDPA's ({g['worst_kind']})")
                for why in j["reasons"] + g["reasons"]:
                    out(f"  {why}")
            cov = summary.get("attntune", {}).get("coverage")
            kernels_only = cov is None or (cov["fallback_calls"] == 0 and not cov["problems"])
            if chosen["candidate_ok"] is False:
                # Measured against float64 on the model's own tensors: whatever the reference did.
                verdict, exit_code = "mismatch", 1
                reasons = ["attntune fails the in-situ check (layer 0's attention against float64)"]
            elif reasons:
                verdict, exit_code = "inconclusive", 1
            elif j["match"] and g["match"] and kernels_only:
                verdict = "match"
            elif j["inconclusive"] or g["inconclusive"]:
                verdict, exit_code = "inconclusive", 1
            elif not (j["match"] and g["match"]):
                verdict, exit_code = "mismatch", 1
            else:
                verdict, exit_code = "fallback", 1
        elif reasons:
            verdict, exit_code = "inconclusive", 1
    first, last = runs[0].losses[0], runs[0].losses[-1]
    out(f"sdpa loss {first:.4f} -> {last:.4f}" + ("" if last < first else "  (warning: the loss did not fall)"))

    # Times side by side.
    if not args.no_bench and failed is None:
        if lib is not None:
            lib.reset_coverage()
        summary["attention_time"] = bench_attention({n: a for n, a in sides if n != "sdpa-repeat"}, shape, dtype,
                                                    device, args.bench_rounds, args.bench_seconds)
        if lib is not None:
            bench_fallbacks = sum(r["calls"] for r in lib.coverage() if r["kernel"] is None)
            summary["attntune"]["bench_fallback_calls"] = bench_fallbacks
            if bench_fallbacks:
                out(f"attntune: {bench_fallbacks} calls of the attention timing fell back")
                verdict, exit_code = ("fallback", 1) if verdict == "match" else (verdict, exit_code)
    out("")
    out(f"{'side':<14} {'attention':<40} {'step ms':>9} {'attn fwd':>9} {'fwd+bwd':>9} {'x layers':>9} {'share':>6}")
    for r in runs:
        rs = summary["runs"][r.name]
        at = summary.get("attention_time", {}).get(r.name)
        step = rs["step_ms_median"]
        cells = [f"{r.name:<14}", f"{rs['attention'][:40]:<40}", f"{step:9.2f}" if step is not None else f"{'-':>9}"]
        if at:
            per_step = at["fwd_bwd_ms"] * cfg.layers
            at["per_step_ms"] = per_step
            cells += [f"{at['fwd_ms']:9.3f}", f"{at['fwd_bwd_ms']:9.3f}", f"{per_step:9.2f}",
                      f"{per_step / step:6.0%}" if step else f"{'-':>6}"]
        out(" ".join(cells))
    if "attntune" in summary["runs"] and summary["runs"]["attntune"]["step_ms_median"]:
        a, b = summary["runs"]["sdpa"]["step_ms_median"], summary["runs"]["attntune"]["step_ms_median"]
        line = f"step time sdpa / attntune: {a / b:.3f}x"
        if "attention_time" in summary:
            at = summary["attention_time"]
            ratio = at["sdpa"]["fwd_bwd_ms"] / at["attntune"]["fwd_bwd_ms"]
            line += f"; attention fwd+bwd sdpa / attntune: {ratio:.3f}x"
        out(line)
    if device.type == "cuda":
        summary["gpu_state_after"] = gpu_state()
    summary.update(verdict=verdict, verdict_reasons=reasons, exit=exit_code)
    out(f"verdict: {verdict}" + (f" ({'; '.join(reasons)})" if reasons else ""))
    if args.csv:
        write_csv(args.csv, runs)
    return summary


def write_csv(path, runs):
    names = [r.name for r in runs]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "lr"] + [f"loss_{n}" for n in names] + [f"absdiff_{n}" for n in names[1:]] +
                   [f"step_ms_{n}" for n in names] + [f"grad_norm_{n}" for n in names])
        for i in range(min(len(r.losses) for r in runs)):
            ref = runs[0].losses[i]
            w.writerow([i, f"{runs[0].lrs[i]:.6g}"] + [f"{r.losses[i]:.6f}" for r in runs] +
                       [f"{abs(r.losses[i] - ref):.6g}" for r in runs[1:]] +
                       [f"{r.times[i] * 1e3:.3f}" for r in runs] + [f"{r.grad_norms[i]:.6g}" for r in runs])


def main(argv=None):
    ap = parser()
    args = resolve(ap.parse_args(argv))
    try:
        device = validate(args)
    except ValueError as e:
        ap.error(str(e))
    try:
        summary = compare(args, device)
    except ValueError as e:
        ap.error(str(e))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    return summary["exit"]


if __name__ == "__main__":
    sys.exit(main())
