#!/usr/bin/env python3
"""Check and time `attntune export` files against PyTorch's SDPA backends (on the GPU machine).

For each --cu FILE.cu: build it as the PyTorch package of `attntune export --torch` does (the kernels
with docs/CONTRACT.md's nvcc command line, the ops with torch.utils.cpp_extension; cached under
$ATTNTUNE_TORCH_CACHE), load it as torch.ops.attntune_cmpN, read its kernel info, then for every
kernel in it, calling it through the ops (fallback policy "raise": a call no kernel serves fails):

  correctness  against a float64 reference (PyTorch math, on float64), FlashAttention-2's
               criterion: max|out - ref64| <= 2 * max|ref_lowp - ref64| + atol, where ref_lowp is
               the same math in the kernel's dtype and atol is 1/512 (bf16) or 1/4096 (fp16); on
               the tuned shape (with LSE), odd lengths (s=1000; s=257 with sk=1000 when not causal,
               sk=1000 bottom-right aligned when causal), [B,S,H,D] strided views (no copies) and
               GQA (hkv = h/4). The output is poisoned with NaN before each call.
  timing       ours vs SDPA's flash, cuDNN and efficient backends (and the default dispatch), each
               captured as --calls calls in a CUDA graph, the graph replayed --reps times (more
               where that takes under --min-seconds, 1 s), median: the method of
               the PyTorch peer timings, which stop at --reps. Under the GPU's power cap the
               clock swings over tenths of a second, so a 0.2 s timing (30 x 20 calls of a 0.3 ms
               kernel) falls in one phase of it: in one call the per-round ratios of d=64 fp16
               spread 1.022-1.094 at 0.2 s, 1.080-1.095 at 1 s (docs/log/PERFORMANCE.md run 61). Ours and
               cuDNN (the closest peer) are timed in --rounds interleaved rounds, each round in
               the other order, after one untimed round that warms the GPU up, and each reports
               the median of its rounds; the table gives the range of the per-round ratios, the
               CSV each round's time. Flash, efficient and the default dispatch are timed once.
               TFLOP/s = 4*B*H*S*Sk*D / t, half of it when causal.

Decoding (seqlen_q <= 16, e.g. a flash_decode export): the checks add odd key counts, MQA and, when
the file serves attntune_attention_forward_kvcache, that entry point on caches of ragged lengths
(0, 1, odd, all, random) with NaN past each length, paged (pages of 16, 256 and the tuned size,
shuffled block tables with spare pages) and contiguous; the timing is of ours on contiguous K/V,
through the kvcache entry on contiguous caches (head-first, and rows-first as inside a page) and on
paged caches (every sequence at sk), and SDPA's
backends (enable_gqa, causal_lower_right), reported as GB/s of K+V+Q+O and against the best peer.

Files whose kernels need arch-specific code (flash_fwd_wgmma: their header's build line says
-arch=sm_90a) are built for that arch whatever --arch says; the others for --arch (default: this
GPU's).

Prints a table and writes CSV (--out), with each export's time against the time its campaign
recorded ("vs tuned": the tuner times by graph replay too, so on the tuning GPU they agree within
a few %). Exit status 1 if a build or a correctness check failed, or with --max-drift PCT if an
export's time strays from the tuner's by more than PCT %.

  python3 tools/compare_sdpa.py --cu attn.cu [all.cu ...] [--arch sm_90] [--out compare.csv]
  (a flash_fwd_wgmma export is built with -arch=sm_90a, from its header)
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from gpu_timing import capture, gpu_state  # noqa: E402,F401  (shared with compare_varlen.py)
from peer_common import problem_str  # noqa: E402  (attntune's problem specs, as the other peer tools print them)

ATTNTUNE_UNSUPPORTED = 1000
ATOL = {"bf16": 1.0 / 512, "fp16": 1.0 / 4096}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
LSE_ATOL = 1e-3  # the kernel's log2/exp2 are approximate (ex2.approx, lg2.approx)


# ---------------------------------------------------------------- building and loading

# Exports are called through the PyTorch ops of the package `attntune export --torch` writes
# (templates/torch/attntune, docs/design/torch.md): each --cu file is built by the package's own
# build (nvcc with the contract's command line, then the ops with torch.utils.cpp_extension) and
# loaded under a namespace of its own, torch.ops.attntune_cmpN, so several sit side by side.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "templates", "torch"))
os.environ["ATTNTUNE_TORCH_NO_AUTOLOAD"] = "1"
import attntune as attntune_torch  # noqa: E402
from attntune import _build as torch_build  # noqa: E402


def build_arch(cu, arch):
    """The -arch to build `cu` with: its arch-specific target if it has one, else `arch`."""
    need = torch_build.header_arch(cu)
    if need and need.endswith("a"):
        if need != arch:
            print(f"{cu}: its kernels need arch-specific code: building for {need} (not {arch})")
        return need
    return arch


class Library:
    """One export as PyTorch ops. The policy is "raise" with no length limit: every call runs a
    kernel of the file or fails its check, never a fallback. Closures return 0 or
    ATTNTUNE_UNSUPPORTED, as the C entry points do, with the reason in last_error()."""

    def __init__(self, cu, index, arch):
        self.lib = attntune_torch.load(cu, namespace=f"attntune_cmp{index}", arch=arch)
        self.lib.set_policy("raise", 1e9)
        self.ops = self.lib.ops
        self.info = self.lib.info
        self.error = ""
        # The problems whose kernels serve attntune_attention_forward_kvcache (None: no kernel does).
        self.kvcache = self.info.get("entry_points", {}).get("attntune_attention_forward_kvcache") or None

    def last_error(self):
        return self.error

    def select(self, head_dim, causal, B, H, Hkv, S, Sk):
        return self.lib.explain("attention", self.info["dtype"], head_dim, causal, B, H, Hkv, S, Sk)[0]

    def _guarded(self, fn):
        def call():
            try:
                fn()
                return 0
            except RuntimeError as e:
                self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
                return ATTNTUNE_UNSUPPORTED
        return call

    def forward_fn(self, q, k, v, out, lse, causal, scale):
        """A closure calling the op on q, k, v, out: [B, H, S, D] tensors of any strides (last dim
        contiguous), on the current stream at call time."""
        ops = self.ops
        return self._guarded(lambda: ops.attention_into(q, k, v, out, lse, scale, bool(causal)))

    def kvcache_fn(self, q, cache, out, lse, causal, scale):
        """A closure calling the kvcache op on q/out [B, H, S, D] (passed as the op's [B, S, H, D]
        views) and a KvCache."""
        ops = self.ops
        qt, ot = q.transpose(1, 2), out.transpose(1, 2)
        kc, vc = cache.entry_views()
        return self._guarded(lambda: ops.attention_kvcache_into(qt, kc, vc, cache.seqlens, cache.table, ot, lse, scale,
                                                                bool(causal)))


class KvCache:
    """A KV cache as serving engines keep it, for the kvcache entry point: with `page`, K and V in
    pages [num_pages, page, hkv, D] (strides {page, head, row}) that a shuffled block table maps, with
    spare pages; without, contiguous: [B, hkv, sk_max, D] (each head's keys together), or with
    rows_first [B, sk_max, hkv, D] (flash_attn_with_kvcache's layout, a key's heads together, as in a
    page). `seqlens` (int32, device) holds each sequence's keys or None (all). Rows past a sequence's
    length hold NaN, as a stale cache may."""

    def __init__(self, k, v, seqlens, page, seed, rows_first=False):
        B, hkv, sk, D = k.shape
        self.hkv, self.sk_max, self.page = hkv, sk, page or 0
        self.rows_first = bool(rows_first) and not page
        self.seqlens = (torch.tensor(seqlens, dtype=torch.int32, device="cuda") if seqlens is not None else None)
        lens = seqlens if seqlens is not None else [sk] * B
        if not page:
            self.k, self.v = k.clone(), v.clone()
            for b, n in enumerate(lens):
                self.k[b, :, n:] = float("nan")
                self.v[b, :, n:] = float("nan")
            self.table, self.max_blocks = None, 0
            if self.rows_first:
                self.k, self.v = self.k.transpose(1, 2).contiguous(), self.v.transpose(1, 2).contiguous()
                # [B, sk, hkv, D]: the entry point's strides are {batch, head, row}.
                self.k_strides = (self.k.stride(0), self.k.stride(2), self.k.stride(1))
                self.v_strides = (self.v.stride(0), self.v.stride(2), self.v.stride(1))
            else:
                self.k_strides, self.v_strides = self.k.stride()[:3], self.v.stride()[:3]
            return
        per = (sk + page - 1) // page
        num = B * per + 3
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(num, generator=g)
        table = order[:B * per].view(B, per).to(torch.int32)
        self.table, self.max_blocks = table.cuda(), per
        self.k = torch.full((num, page, hkv, D), float("nan"), dtype=k.dtype, device="cuda")
        self.v = torch.full_like(self.k, float("nan"))
        for b, n in enumerate(lens):
            for j in range(0, n, page):
                m = min(page, n - j)
                pg = int(table[b, j // page])
                self.k[pg, :m] = k[b, :, j:j + m].transpose(0, 1)
                self.v[pg, :m] = v[b, :, j:j + m].transpose(0, 1)
        # Pages [num_pages, page, hkv, D]: the entry point's strides are {page, head, row}.
        self.k_strides = (self.k.stride(0), self.k.stride(2), self.k.stride(1))
        self.v_strides = (self.v.stride(0), self.v.stride(2), self.v.stride(1))

    def entry_views(self):
        """K and V as the kvcache op takes them: pages [num_pages, page, hkv, D], or contiguous
        [B, sk_max, hkv, D] (a view of the head-first layout)."""
        if self.table is not None or self.rows_first:
            return self.k, self.v
        return self.k.transpose(1, 2), self.v.transpose(1, 2)


# ---------------------------------------------------------------- reference

def reference(q, k, v, causal, scale, dtype):
    """Attention in `dtype` (float64, or the inputs' dtype with a float32 softmax as
    FlashAttention's attention_ref does); bottom-right causal; rows that see no key give 0 and LSE
    -inf. Returns out [B, H, S, D] and lse [B, H, S] (float64). Chunks query rows, and sequences
    where K and V in `dtype` with their heads repeated would not fit (b=64 over 32k keys: 68 GB)."""
    B, H, S, D = q.shape
    if B > 1 and 2 * B * H * k.shape[2] * D * torch.empty((), dtype=dtype).element_size() > 4e9:
        parts = [reference(q[i:i + 1], k[i:i + 1], v[i:i + 1], causal, scale, dtype) for i in range(B)]
        return torch.cat([o for o, _ in parts]), torch.cat([l for _, l in parts])
    Hkv, Sk = k.shape[1], k.shape[2]
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    if Hkv != H:
        kd = kd.repeat_interleave(H // Hkv, dim=1)
        vd = vd.repeat_interleave(H // Hkv, dim=1)
    out = torch.empty(B, H, S, D, dtype=dtype, device=q.device)
    lse = torch.empty(B, H, S, dtype=torch.float64, device=q.device)
    rows = max(1, min(S, int(1.5e9 // (8 * B * H * max(Sk, 1)))))
    cols = torch.arange(Sk, device=q.device)
    for r0 in range(0, S, rows):
        r1 = min(S, r0 + rows)
        s = torch.matmul(qd[:, :, r0:r1], kd.transpose(-1, -2)).to(torch.float64 if dtype == torch.float64
                                                                   else torch.float32) * scale
        if causal:
            i = torch.arange(r0, r1, device=q.device)[:, None]
            s = s.masked_fill(cols[None, :] > i + (Sk - S), float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        l = p.sum(dim=-1, keepdim=True)
        p = torch.where(l > 0, p / l.clamp_min(1e-300), torch.zeros_like(p))
        out[:, :, r0:r1] = torch.matmul(p.to(dtype), vd)
        lse[:, :, r0:r1] = (torch.log(l) + m).squeeze(-1).to(torch.float64)
    return out, lse


def reference_ragged(q, k, v, lens, causal, scale, dtype):
    """reference() per sequence over its first lens[b] keys (bottom-right causal per sequence); a
    sequence without keys gives 0 and LSE -inf."""
    B, H, S, D = q.shape
    out = torch.zeros(B, H, S, D, dtype=dtype, device=q.device)
    lse = torch.full((B, H, S), float("-inf"), dtype=torch.float64, device=q.device)
    for b, n in enumerate(lens):
        if n > 0:
            o, l = reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal, scale, dtype)
            out[b], lse[b] = o[0], l[0]
    return out, lse


def make_inputs(B, H, Hkv, S, Sk, D, dtype, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def tensor(heads, length):
        if layout == "BSHD":  # a [B, S, H, D] buffer seen as [B, H, S, D]: strided, no copy
            return torch.randn(B, length, heads, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
        return torch.randn(B, heads, length, D, device="cuda", dtype=dtype, generator=g)
    q, k, v = tensor(H, S), tensor(Hkv, Sk), tensor(Hkv, Sk)
    out = tensor(H, S)
    return q, k, v, out


def check(lib, name, dtype_name, B, H, Hkv, S, Sk, D, causal, layout, with_lse, seed):
    dtype = TORCH_DTYPE[dtype_name]
    scale = 1.0 / math.sqrt(D)
    q, k, v, out = make_inputs(B, H, Hkv, S, Sk, D, dtype, layout, seed)
    out.fill_(float("nan"))
    lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32) if with_lse else None
    kernel = lib.select(D, int(causal), B, H, Hkv, S, Sk)
    rc = lib.forward_fn(q, k, v, out, lse, causal, scale)()
    torch.cuda.synchronize()
    row = dict(kind="check", shape=name, dtype=dtype_name, variant=f"{layout} b={B} h={H} hkv={Hkv} s={S} sk={Sk}"
               + (" +lse" if with_lse else ""), kernel=kernel)
    if rc != 0:
        row.update(ok=False, max_err=float("nan"), bound=float("nan"), note=f"returned {rc}: {lib.last_error()}")
        return row
    ref64, lse64 = reference(q, k, v, causal, scale, torch.float64)
    ref_lowp, _ = reference(q, k, v, causal, scale, dtype)
    err = (out.double() - ref64).abs().max().item()  # NaN (unwritten or poisoned) propagates
    lowp = (ref_lowp.double() - ref64).abs().max().item()
    bound = 2 * lowp + ATOL[dtype_name]
    ok = math.isfinite(err) and err <= bound
    note = ""
    if with_lse:
        finite = torch.isfinite(lse64)
        same_inf = bool(torch.equal(torch.isneginf(lse.double()), ~finite))
        lse_err = (lse.double()[finite] - lse64[finite]).abs().max().item() if finite.any() else 0.0
        if not same_inf or not (lse_err <= LSE_ATOL):
            ok = False
        note = f"lse err {lse_err:.2e}" + ("" if same_inf else ", -inf rows differ")
    if not math.isfinite(err):
        note = (note + "; " if note else "") + "NaN in output (unwritten or wrong)"
    row.update(ok=ok, max_err=err, bound=bound, note=note)
    return row


def ragged_lengths(B, Sk, seed):
    """Keys per sequence: Sk, 0, 1, an odd count and a random one, in turn over the batch."""
    g = torch.Generator().manual_seed(seed)
    pattern = lambda b: [Sk, 0, min(Sk, 1), min(Sk, (Sk // 2) | 1),
                         int(torch.randint(1, Sk + 1, (1,), generator=g))][b % 5]
    return [pattern(b) for b in range(B)]


def check_kvcache(lib, name, dtype_name, B, H, Hkv, S, Sk, D, causal, page, seed, rows_first=False):
    """The kvcache entry point on a cache of ragged lengths (paged with a shuffled table, or
    contiguous when page is 0, head-first or rows_first), with LSE, against float64; NaN-poisoned
    output."""
    dtype = TORCH_DTYPE[dtype_name]
    scale = 1.0 / math.sqrt(D)
    q, k, v, out = make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", seed)
    lens = ragged_lengths(B, Sk, seed)
    cache = KvCache(k, v, lens, page, seed, rows_first)
    out.fill_(float("nan"))
    lse = torch.full((B, H, S), float("nan"), device="cuda", dtype=torch.float32)
    row = dict(kind="check", shape=name, dtype=dtype_name, kernel=-1,
               variant=f"kvcache {'page=' + str(page) if page else 'contiguous' + (' rows' if rows_first else '')} b={B} h={H} hkv={Hkv} s={S} "
                       f"sk<={Sk} +lse")
    rc = lib.kvcache_fn(q, cache, out, lse, causal, scale)()
    torch.cuda.synchronize()
    if rc != 0:
        row.update(ok=False, max_err=float("nan"), bound=float("nan"), note=f"returned {rc}: {lib.last_error()}")
        return row
    ref64, lse64 = reference_ragged(q, k, v, lens, causal, scale, torch.float64)
    ref_lowp, _ = reference_ragged(q, k, v, lens, causal, scale, dtype)
    err = (out.double() - ref64).abs().max().item()
    lowp = (ref_lowp.double() - ref64).abs().max().item()
    bound = 2 * lowp + ATOL[dtype_name]
    finite = torch.isfinite(lse64)
    same_inf = bool(torch.equal(torch.isneginf(lse.double()), ~finite))
    lse_err = (lse.double()[finite] - lse64[finite]).abs().max().item() if finite.any() else 0.0
    ok = math.isfinite(err) and err <= bound and same_inf and lse_err <= LSE_ATOL
    note = f"lse err {lse_err:.2e}" + ("" if same_inf else ", -inf rows differ")
    if not math.isfinite(err):
        note += "; NaN in output (unwritten, or the cache past a length leaked in)"
    row.update(ok=ok, max_err=err, bound=bound, note=note)
    return row


# ---------------------------------------------------------------- timing (as the PyTorch peers)

def time_fn(fn, iters=None, min_seconds=0.0):
    """Median milliseconds of fn over `iters` runs (default: ~0.3 s worth, 10-200), or over as many
    as take `min_seconds` when that is more."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); one = time.perf_counter() - t0
    n = iters or max(10, min(200, int(0.3 / max(one, 1e-6))))
    n = max(n, math.ceil(min_seconds / max(one, 1e-6)))
    ts = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def time_graph(fn, calls, reps, min_seconds=0.0):
    """Milliseconds per call: `calls` calls captured in one CUDA graph, median of `reps` replays
    (more where they take under `min_seconds`)."""
    return time_fn(capture(fn, calls).replay, reps, min_seconds) / calls


def flops(B, H, S, Sk, D, causal):
    f = 4.0 * B * H * S * Sk * D
    return f / 2 if causal else f


ROUND_BACKENDS = ("ours", "cudnn")  # timed in interleaved rounds; the others once
DECODE_MAX_S = 16          # seqlen_q up to this is decoding (flash_decode's kDecodeMaxSeqlenQ): checked and timed as such (GB/s)
HBM_PEAK_GBPS = 3350.0     # H100 SXM


def capture_ours(lib, fns, calls, graphs, results):
    """Each of our calls once (its return code checked), then captured into graphs[name]; a call
    that fails is reported and timed as None."""
    for n, fn in fns.items():
        rc = fn()
        torch.cuda.synchronize()
        if rc != 0:
            print(f"  {n}: returned {rc}: {lib.last_error()}")
            results[n] = None
        else:
            graphs[n] = capture(fn, calls)


def sdpa_call(q, k, v, causal, scale):
    """PyTorch SDPA on [B, H, S, D] q, k, v as attntune computes it: GQA through enable_gqa, causal
    with sk != s bottom-right aligned through causal_lower_right (SDPA's is_causal is top-left)."""
    H, S, Hkv, Sk = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    kwargs = {"enable_gqa": True} if Hkv != H else {}
    mask = None
    if causal and S != Sk:
        from torch.nn.attention.bias import causal_lower_right
        mask = causal_lower_right(S, Sk)

    def sdpa():
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **kwargs)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **kwargs)
    return sdpa


def capture_sdpa_backends(sdpa, calls, graphs, results):
    """sdpa under each of SDPA's flash, cuDNN and efficient backends, captured into graphs[name]; a
    backend that refuses the shape is reported and timed as None."""
    from torch.nn.attention import sdpa_kernel, SDPBackend
    for bname, be in {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                      "efficient": SDPBackend.EFFICIENT_ATTENTION}.items():
        try:
            with sdpa_kernel([be]):
                sdpa()
                graphs[bname] = capture(sdpa, calls)
        except Exception as e:  # a backend that refuses the shape
            results[bname] = None
            print(f"  {bname}: n/a ({str(e).splitlines()[0][:100] if str(e) else type(e).__name__})")


def time_interleaved(graphs, order, calls, reps, rounds, min_seconds, results):
    """The graphs named in `order` timed in interleaved rounds (round r starts at the r-th of them,
    so each takes each place), after one untimed round: the correctness checks before it leave the
    GPU cooler and its clock higher, and the first counted timing read 2-4% fast for whichever went
    first (runs 61-62). results gets each one's median per call, and every other graph's time of
    one timing. Returns each ordered graph's per-round times."""
    per_round = {b: [] for b in order}
    for b in order:
        time_fn(graphs[b].replay, reps, min_seconds)
    for r in range(rounds):
        for b in order[r % len(order):] + order[:r % len(order)]:
            per_round[b].append(time_fn(graphs[b].replay, reps, min_seconds) / calls)
    for b in order:
        results[b] = statistics.median(per_round[b])
    for b in graphs:
        if b not in per_round:
            results[b] = time_fn(graphs[b].replay, reps, min_seconds) / calls
    return per_round


def time_problem(lib, name, dtype_name, p, calls, reps, rounds, min_seconds):
    B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
    dtype = TORCH_DTYPE[dtype_name]
    scale = 1.0 / math.sqrt(D)
    q, k, v, out = make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", 0)
    fl = flops(B, H, S, Sk, D, causal)
    results, graphs = {}, {}

    capture_ours(lib, {"ours": lib.forward_fn(q, k, v, out, None, causal, scale)}, calls, graphs, results)
    sdpa = sdpa_call(q, k, v, causal, scale)
    capture_sdpa_backends(sdpa, calls, graphs, results)
    per_round = time_interleaved(graphs, [b for b in ROUND_BACKENDS if b in graphs], calls, reps, rounds,
                                 min_seconds, results)
    try:
        sdpa()
        results["default"] = time_graph(sdpa, calls, reps, min_seconds)
    except Exception:
        results["default"] = None
    del graphs

    rows = []
    ours_ms = results.get("ours")
    for bname, ms in results.items():
        ratios = ([a / o for a, o in zip(per_round[bname], per_round["ours"])]
                  if bname in per_round and bname != "ours" and "ours" in per_round else [])
        rows.append(dict(kind="time", shape=name, dtype=dtype_name, variant=bname,
                         us=ms * 1000 if ms else None, tflops=fl / ms / 1e9 if ms else None,
                         ours_speedup=(ms / ours_ms) if (ms and ours_ms) else None,
                         rounds=len(per_round.get(bname, [])) or 1,
                         round_min=min(ratios) if ratios else None, round_max=max(ratios) if ratios else None,
                         round_us=";".join(f"{t * 1000:.1f}" for t in per_round.get(bname, [])),
                         tuned_us=p.get("_tuned_us")))
    return rows


def decode_bytes(B, H, Hkv, S, Sk, D):
    """Bytes a decode call must move at least: K and V once, Q read, O written (2-byte elements)."""
    return 2.0 * D * (2.0 * B * Hkv * Sk + 2.0 * B * H * S)


def time_decode(lib, name, dtype_name, p, calls, reps, rounds, min_seconds, pages):
    """Decode timing: ours on contiguous K/V (the dense entry), through the kvcache entry on a
    contiguous cache in both layouts (ours_cache: each head's keys together; ours_cache_rows: a
    key's heads together, as inside a page, so ours_pN / ours_cache_rows is the cost of paging
    alone) and on paged caches (pages of each size in `pages`, shuffled tables, every
    sequence at sk), and PyTorch SDPA's backends (enable_gqa; bottom-right causal as
    causal_lower_right), ours and cuDNN in interleaved rounds. GB/s = (K+V+Q+O bytes) / time."""
    B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
    dtype = TORCH_DTYPE[dtype_name]
    scale = 1.0 / math.sqrt(D)
    q, k, v, out = make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", 0)
    nbytes = decode_bytes(B, H, Hkv, S, Sk, D)
    graphs, results = {}, {}
    fns = {"ours": lib.forward_fn(q, k, v, out, None, causal, scale)}
    if lib.kvcache is not None:
        fns["ours_cache"] = lib.kvcache_fn(q, KvCache(k, v, None, 0, 1), out, None, causal, scale)
        fns["ours_cache_rows"] = lib.kvcache_fn(q, KvCache(k, v, None, 0, 1, rows_first=True), out, None, causal,
                                                scale)
        for pg in pages:
            fns[f"ours_p{pg}"] = lib.kvcache_fn(q, KvCache(k, v, None, pg, pg), out, None, causal, scale)
    capture_ours(lib, fns, calls, graphs, results)
    capture_sdpa_backends(sdpa_call(q, k, v, causal, scale), calls, graphs, results)
    per_round = time_interleaved(graphs, [b for b in graphs if b.startswith("ours") or b == "cudnn"], calls, reps,
                                 rounds, min_seconds, results)
    del graphs
    peers = [ms for b, ms in results.items() if ms and not b.startswith("ours")]
    best_peer = min(peers) if peers else None
    rows = []
    for bname, ms in results.items():
        rows.append(dict(kind="time", decode=True, shape=name, dtype=dtype_name, variant=bname,
                         us=ms * 1000 if ms else None, gbps=nbytes / ms / 1e6 if ms else None,
                         ours_speedup=(ms / results["ours"]) if (ms and results.get("ours")) else None,
                         vs_best_peer=(best_peer / ms) if (ms and best_peer and bname.startswith("ours")) else None,
                         rounds=len(per_round.get(bname, [])) or 1,
                         round_us=";".join(f"{t * 1000:.2f}" for t in per_round.get(bname, [])),
                         tuned_us=p.get("_tuned_us") if bname == ("ours_p%d" % p.get("page", 0) if p.get("page")
                                                                 else "ours") else None))
    return rows


# ---------------------------------------------------------------- main

def shape_name(p):
    name = f"b{p['b']}-h{p['h']}" + (f"-hkv{p['hkv']}" if p["hkv"] != p["h"] else "") + f"-s{p['s']}"
    name += (f"-sk{p['sk']}" if p["sk"] != p["s"] else "") + f"-d{p['d']}"
    return name + ("-causal" if p["causal"] else "") + (f"-page{p['page']}" if p.get("page") else "")


def fmt(v, spec):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cu", action="extend", nargs="+", required=True,
                    help="exported .cu files (--cu a.cu b.cu, or --cu repeated)")
    ap.add_argument("--arch", help="nvcc -arch (default: this GPU's, e.g. sm_90)")
    ap.add_argument("--out", default="compare_sdpa.csv", help="CSV to write")
    ap.add_argument("--reps", type=int, default=30, help="graph replays to take the median of (at least)")
    ap.add_argument("--min-seconds", type=float, default=1.0,
                    help="each timing replays its graph for at least this long (default 1.0): a short timing"
                         " lands in one phase of the power cap's clock swings, a longer one averages over them")
    ap.add_argument("--calls", type=int, default=20, help="calls captured per graph")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved rounds timing ours and cuDNN, each round in the other order (median; default 4:"
                         " each goes first as often)")
    ap.add_argument("--nvcc", help="nvcc to use")
    ap.add_argument("--no-timing", action="store_true", help="correctness only")
    ap.add_argument("--max-drift", type=float, default=0,
                    help="fail when our time differs from the tuner's recorded time by more than this many %% "
                         "(0: report only; meaningful on the GPU the campaign ran on)")
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1 or args.calls < 1:
        ap.error("--rounds, --reps and --calls must be at least 1")
    if not (args.min_seconds >= 0 and math.isfinite(args.min_seconds)):
        ap.error("--min-seconds must be a finite number >= 0")

    prop = torch.cuda.get_device_properties(0)
    arch = args.arch or f"sm_{prop.major}{prop.minor}"
    print(f"torch {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()}; "
          f"{prop.name} (sm_{prop.major}{prop.minor}, {prop.multi_processor_count} SMs, uuid "
          f"{getattr(prop, 'uuid', 'n/a')}); building for {arch}")
    if args.nvcc:
        os.environ["CUDACXX"] = args.nvcc
    rows, failed = [], False
    # nvcc is one process per file: build the kernels of all at once, then load, check and time
    # one by one.
    from concurrent.futures import ThreadPoolExecutor

    def prepare(ic):
        try:
            torch_build.prepare(ic[1], f"attntune_cmp{ic[0]}", build_arch(ic[1], arch))
            return True
        except Exception as e:  # noqa: BLE001 - reported, and the run fails
            print(f"build failed: {ic[1]}: {e}", file=sys.stderr)
            return False
    with ThreadPoolExecutor(max_workers=max(1, min(len(args.cu), os.cpu_count() or 1))) as pool:
        built = list(pool.map(prepare, enumerate(args.cu)))
    for i, cu in enumerate(args.cu):
        if not built[i]:
            failed = True
            continue
        lib = Library(cu, i, build_arch(cu, arch))
        dtype_name = lib.info["dtype"]
        print(f"{cu}: {lib.info['mode']}, {len(lib.info['kernels'])} kernel(s), {dtype_name}, tuned on "
              f"{lib.info['kernels'][0]['gpu']} ({lib.info['arch']})")
        for kinfo in lib.info["kernels"]:
            p = dict(kinfo["problem"])
            if p.get("varlen"):
                print(f"{problem_str(p)}: a packed-batch kernel; tools/compare_varlen.py times it against the peers")
                continue
            p["_tuned_us"] = kinfo["median_us"]
            B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
            name = shape_name(p)
            print(f"{name} {dtype_name}: {kinfo['template']} {json.dumps(kinfo['config'], separators=(',', ':'))}"
                  f" (campaign {kinfo['campaign']}: {kinfo['median_us']:.1f} us)")
            decode = S <= DECODE_MAX_S
            serves_kvcache = problem_str(p) in lib.info.get("entry_points", {}).get(
                "attntune_attention_forward_kvcache", [])
            if decode:
                variants = [(B, H, Hkv, S, Sk, "BHSD", True), (2, H, Hkv, S, 1001, "BSHD", True),
                            (3, H, Hkv, S, 777, "BHSD", False)]
                if H > 1 and Hkv > 1:
                    variants.append((2, H, 1, S, 500, "BHSD", True))  # MQA
                if S > 1:
                    variants.append((2, H, Hkv, max(1, S // 2), 900, "BHSD", True))
            else:
                variants = [(B, H, Hkv, S, Sk, "BHSD", True),
                            (1, 4, 4, 1000, 1000, "BHSD", True),
                            (2, 3, 3, 257, 1000, "BHSD", False),
                            (B, H, Hkv, min(S, 2048), min(Sk, 2048), "BSHD", True),
                            (2, 8, 2, 1000, 1000, "BSHD", True),
                            (2, 8, 2, 333, 777 if not causal else 1000, "BHSD", False)]
                if H % 4 == 0:
                    variants.append((B, H, H // 4, min(S, 2048), min(Sk, 2048), "BHSD", False))
                if causal:
                    variants.append((2, 4, 4, 1000, 300, "BHSD", True))  # rows that see no key: zeros, -inf
            for seed, (b, h, hkv, s, sk, layout, with_lse) in enumerate(variants):
                r = check(lib, name, dtype_name, b, h, hkv, s, sk, D, causal, layout, with_lse, seed + 1)
                failed |= not r["ok"]
                rows.append(r)
                print(f"  check {'ok  ' if r['ok'] else 'FAIL'} {r['variant']:<44} kernel {r['kernel']}  "
                      f"max err {fmt(r['max_err'], '.2e')} <= {fmt(r['bound'], '.2e')}  {r.get('note', '')}")
            pages = sorted({p.get("page") or 16, 16, 256}) if serves_kvcache else []
            for seed, (page, rows_first) in enumerate([(pg, False) for pg in pages] +
                                                      ([(0, False), (0, True)] if serves_kvcache else [])):
                r = check_kvcache(lib, name, dtype_name, max(5, min(B, 16)), H, Hkv, S, min(Sk, 4099), D, causal,
                                  page, 100 + seed, rows_first)
                failed |= not r["ok"]
                rows.append(r)
                print(f"  check {'ok  ' if r['ok'] else 'FAIL'} {r['variant']:<44}  "
                      f"max err {fmt(r['max_err'], '.2e')} <= {fmt(r['bound'], '.2e')}  {r.get('note', '')}")
            if not args.no_timing:
                before = gpu_state()
                if decode:
                    rows += time_decode(lib, name, dtype_name, p, args.calls, args.reps, args.rounds,
                                        args.min_seconds, pages)
                else:
                    rows += time_problem(lib, name, dtype_name, p, args.calls, args.reps, args.rounds,
                                         args.min_seconds)
                after = gpu_state()
                if before or after:
                    print(f"  gpu before timing: {before or 'n/a'}; after: {after or 'n/a'}")

    timed = [r for r in rows if r["kind"] == "time" and not r.get("decode")]
    decoded = [r for r in rows if r["kind"] == "time" and r.get("decode")]
    if decoded:
        print(f"\n{'decode shape':<28} {'dtype':<5} {'backend':<11} {'us':>9} {'GB/s':>7} {'% HBM':>6} {'x best peer':>11}"
              f" {'tuned us':>9}")
        for r in decoded:
            print(f"{r['shape']:<28} {r['dtype']:<5} {r['variant']:<11} {fmt(r['us'], '9.2f')} {fmt(r['gbps'], '7.0f')}"
                  f" {fmt(r['gbps'] / HBM_PEAK_GBPS * 100 if r['gbps'] else None, '6.1f')}"
                  f" {fmt(r.get('vs_best_peer'), '11.3f')} {fmt(r.get('tuned_us'), '9.2f')}")
        print(f"GB/s = (K+V+Q+O bytes) / time; % HBM against {HBM_PEAK_GBPS:.0f} GB/s (the H100 SXM's peak);"
              " x best peer = the fastest PyTorch backend's time / ours")
    if timed:
        print(f"\n{'shape':<28} {'dtype':<5} {'backend':<10} {'us':>10} {'TFLOP/s':>8} {'ours x':>7} {'tuned us':>9}"
              f" {'vs tuned':>8}  {'ours x per round':>16}")
        for r in timed:
            drift = None
            if r["variant"] == "ours" and r.get("us") and r.get("tuned_us"):
                drift = r["drift_pct"] = (r["us"] / r["tuned_us"] - 1) * 100
            print(f"{r['shape']:<28} {r['dtype']:<5} {r['variant']:<10} {fmt(r['us'], '10.1f')} "
                  f"{fmt(r['tflops'], '8.1f')} {fmt(r['ours_speedup'], '7.2f')} {fmt(r['tuned_us'], '9.1f')}"
                  f" {fmt(drift, '+7.1f') + '%' if drift is not None else '':>8}"
                  f"  {fmt(r.get('round_min'), '.3f') + '-' + fmt(r.get('round_max'), '.3f') if r.get('round_min') else ''}")
        drifts = [abs(r["drift_pct"]) for r in timed if r.get("drift_pct") is not None]
        if drifts:
            limit = args.max_drift or 3.0
            print(f"export vs tuner: max |drift| {max(drifts):.1f}%, {sum(d <= limit for d in drifts)} of "
                  f"{len(drifts)} within {limit:g}%")
            if args.max_drift and max(drifts) > args.max_drift:
                failed = True
    print("\nours x = backend time / our time (> 1: ours is faster), medians of the interleaved rounds; "
          "per round: the range of that ratio over the rounds; checks: "
          f"{sum(1 for r in rows if r['kind'] == 'check' and r['ok'])} ok, "
          f"{sum(1 for r in rows if r['kind'] == 'check' and not r['ok'])} failed")
    fields = ["kind", "shape", "dtype", "variant", "kernel", "us", "tflops", "gbps", "vs_best_peer", "ours_speedup",
              "rounds", "round_min",
              "round_max", "round_us", "tuned_us", "drift_pct",
              "max_err",
              "bound", "ok", "note"]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
