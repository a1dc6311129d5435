"""The PyTorch ops on a GPU (label gpu;torch): values, torch.compile, CUDA graphs, and the op's cost.

Two phases (docs/design/torch.md "Tests"):

Plain: the package is $ATTNTUNE_TORCH_PKG (a directory `attntune export --torch` wrote), else one
exported here from $ATTNTUNE_TORCH_DB (default tests/data/campaigns/h100-suite.db) in
$ATTNTUNE_TORCH_DTYPE (default bf16). For every kernel of it, on the problem it was tuned for and on
odd shapes near it:
  - values: NaN-poisoned out, against float64 (FlashAttention-2's criterion; compare_sdpa.py's
    reference), with LSE; [B,S,H,D] views; GQA; through attention_kvcache (paged with shuffled block
    tables and ragged lengths, and contiguous) for kernels that serve it (a chunked-prefill kernel,
    tuned on a paged problem of more than 16 rows, through it alone); every call must have run a
    kernel (coverage), none fallen back;
  - torch.compile(fullgraph=True) (inductor) and a captured CUDA graph replayed on new inputs give
    the eager op's values bit for bit;
  - time: the op against the raw C entry point (ctypes) on the same library, both captured in CUDA
    graphs, interleaved rounds of >= --min-seconds; the op must be within 3% (ATTNTUNE_OP_MAX_COST).

Variants (FlashAttention's window_size, softcap, sinks): the package is $ATTNTUNE_TORCH_VARIANTS_PKG,
else one exported from $ATTNTUNE_TORCH_VARIANTS_DB, else one this test tunes: it submits
VARIANT_PROBLEMS (gpt-oss-, Gemma-2- and Mistral-like: windowed and full prefill with sinks, soft-cap,
two-sided windows, paged decode, chunked prefill, varlen) and one plain problem with a small budget
($ATTNTUNE_TORCH_VARIANTS_BUDGET evaluations, default 2) to a database of its own
($ATTNTUNE_TORCH_VARIANTS_TUNE_DB, else a temporary one; a second run resumes it), runs `attntune
serve` on this GPU and exports them (`submit` refuses a problem no family tunes yet: reported as
SKIP, never a failure). Then, policy "raise" (a call that falls back fails):
  - every kernel built with variants through its entry point, windows left in {0, 1, 127, 4096, the
    tuned} (right 0 or -1 causal; 64, -1 two-sided), soft-caps 30 and 50, sinks (random, -1e4, 1e3 by
    head), tuned and odd shapes, [B,S,H,D], ragged kvcache (paged with shuffled tables and NaN past
    each length, contiguous), ragged varlen, NaN-poisoned out and LSE, against float64
    (variant_reference.py); and the same odd shape through the fallback (max_length_ratio 1);
  - the fallback on the GPU (head_dim 96: no kernel) for all three entry points with variants;
  - torch.compile(fullgraph=True) and CUDA-graph capture (new inputs, replay) of a variant kernel's
    call and of the fallback's, against float64.

Value head dims (v's last dim Dv other than q's and k's D; issue 44): the package is
$ATTNTUNE_TORCH_DV_PKG, else one exported from $ATTNTUNE_TORCH_DV_DB, else one this test tunes
(DV_PROBLEMS: DeepSeek's MLA prefill d=192, dv=128 dense, paged, varlen and decode, and d=64, dv=128
dense and decode; $ATTNTUNE_TORCH_DV_BUDGET evaluations each, default 2, into
$ATTNTUNE_TORCH_DV_TUNE_DB or a temporary database). Then, policy "raise":
  - every kernel built for two head dims through its entry points, on its tuned and odd shapes
    ([B,S,H,D], GQA, ragged kvcache paged with shuffled tables and NaN past each length, contiguous,
    ragged varlen), NaN-poisoned out and LSE, against float64 (FlashAttention-2's criterion), and the
    op's own out ([.., Dv], laid out as q); every call ran a kernel of its dims (coverage);
  - a one-head-dim call at a split kernel's d, and one of another dv, raise (no split kernel serves
    them), naming dv; mismatched shapes are refused naming both;
  - the same dims through the fallback (max_length_ratio 1: SDPA with Dv != D, the fp32 path with
    variants), and dims no kernel has ((96, 64), (64, 96)) on all three entries;
  - torch.compile(fullgraph=True) and a captured CUDA graph of a split kernel's call and of the
    fallback's, against float64.

Latent caches (MLA decode over one cache whose first Dv columns are V; issue 44, docs/design/torch.md
"Latent caches (MLA)"): Hopper (compute capability 9.0) only, else SKIP. The package is
$ATTNTUNE_TORCH_LATENT_PKG, else one exported from $ATTNTUNE_TORCH_LATENT_DB, else one this test tunes
(LATENT_PROBLEMS: DeepSeek-V3's decode, d=576, dv=512, one KV head, pages of 64, s=1 and causal s=2,
latent=1, which flash_decode_wgmma tunes; $ATTNTUNE_TORCH_LATENT_BUDGET evaluations each, default 2,
into $ATTNTUNE_TORCH_LATENT_TUNE_DB or a temporary database). Then, policy "raise":
  - every latent kernel through mla_decode (FlashMLA's call: q [B, S, H, 576], kv_cache [blocks, 64,
    1, 576], block table, cache_seqlens), attention_kvcache with v_cache = kv_cache[..., :512] and the
    dense entry with v = k[..., :512], on its tuned and odd shapes (ragged lengths with NaN past each,
    shuffled pages of 64 and 16, a contiguous cache), NaN-poisoned out and LSE, against float64
    (FlashAttention-2's criterion); every call ran a latent kernel (coverage: label, problem), and
    explain(..., latent=True) names it where explain without latent does not;
  - the same dims over separate K and V raise (the latent kernels refuse them), naming the problem;
  - the fallback over the view (max_length_ratio 1: SDPA), against float64;
  - torch.compile(fullgraph=True) and a captured CUDA graph (new inputs, replay) of mla_decode,
    against float64.

FP8 KV caches (k and v float8_e4m3fn, q bf16, FlashAttention-3's k_descale / v_descale; issue 42,
docs/design/torch.md "FP8 KV caches"): compute capability 8.9 or newer, else SKIP. The package is
$ATTNTUNE_TORCH_FP8_PKG, else one exported from $ATTNTUNE_TORCH_FP8_DB, else one this test tunes
(FP8_PROBLEMS: paged decode d=128, 32/8 heads, pages of 16, s=1 and causal s=2, and dense decode d=64,
kv_dtype=fp8, which flash_decode tunes; on sm_90, FP8_PROBLEMS_SM90's chunked prefill, flash_fwd_wgmma's; $ATTNTUNE_TORCH_FP8_BUDGET evaluations each, default 2, into
$ATTNTUNE_TORCH_FP8_TUNE_DB or a temporary database). Then, policy "raise":
  - every FP8 kernel through its entry points (attention_kvcache paged with shuffled pages of its own
    size and of 16, ragged lengths with NaN bytes past each, a contiguous cache; the dense entry in
    both layouts), on its tuned and odd shapes, with scales per (sequence, KV head) (contiguous and
    strided), one scale ([1], 0-d) and none, NaN-poisoned out and LSE, against float64 over the
    dequantised cache (FlashAttention-2's criterion); every call ran an FP8 kernel (coverage: label,
    problem), and explain(..., kv_dtype="fp8") names it where explain without does not;
  - the same shape over a bf16 cache raises (an FP8 kernel never serves it), naming the problem;
  - the fallback on the GPU (max_length_ratio 1, and head_dim 96, which no kernel has): the cache
    dequantised per (sequence, KV head) through the fp32 path, paged, contiguous and dense;
  - torch.compile(fullgraph=True) of an FP8 kernel's call, and captured CUDA graphs (new cache bytes
    and new scales in the captured tensors, replay) of a kernel's call and of the fallback's, against
    float64.
The backward pass (attention's autograd through flash_bwd_mma kernels; issue 45, docs/design/torch.md
"The backward pass"): the packages are $ATTNTUNE_TORCH_BWD_PKG (its dtype alone), else exports (bf16 and
fp16) of $ATTNTUNE_TORCH_BWD_DB, else of BWD_PROBLEMS tuned here (backward problems, pass=bwd, at d=64
and 128, causal and not, GQA, a causal window, and two forward problems; packed batches' backward,
varlen=64,pass=bwd, at d=128 with its forward and at d=64 with a causal window and sinks; in both dtypes;
$ATTNTUNE_TORCH_BWD_BUDGET evaluations each, default 2, into $ATTNTUNE_TORCH_BWD_TUNE_DB or a temporary
database). Then, for each package:
  - every backward kernel through attntune.attention and torch.autograd.grad on its tuned shape and
    odd ones (S != Sk both ways, rows without keys, s=1, sk=1, [B,S,H,D], its window and others), dq,
    dk, dv against float64 autograd by FlashAttention-2's criterion, the low-precision bound from
    SDPA's gradients (a boolean mask where S != Sk or a window) or, where a row sees no key, from the
    reference in the dtype; the allocator's free memory NaN-poisoned first; each call ran the kernel
    explain("attention_backward") names (coverage);
  - every varlen backward kernel through attntune.attention_varlen and torch.autograd.grad on ragged
    packings (its own draw of lengths, lengths 0 and 1, no keys, fewer and more keys than rows, 32 short
    sequences; its window and others, its sinks learnable), each sequence's gradients against float64
    autograd of that sequence alone (of the forward's saved output where a kernel runs), the same
    criterion; each call ran the kernel explain("attention_backward_varlen") names (coverage);
  - the fallback on the GPU (max_length_ratio 1, and d=96), its gradients against float64, and a
    causal window with a soft-cap and learnable sinks (their gradient too); packed batches likewise;
  - torch.compile(fullgraph=True) (inductor) of a training step (its backward ran the kernel), and CUDA
    graphs of forward and backward (capture, new inputs, replay) through a kernel and through the
    fallback, against float64; the same through a varlen backward kernel for a packed batch;
  - informational: forward + backward time against SDPA's on the kernels' tuned problems.

Prints a table last.

  ATTNTUNE_TORCH_PKG=pkg python3 tests/torch/test_ops_gpu.py [--min-seconds 1.0] [--rounds 4]
  python3 tests/torch/test_ops_gpu.py --variants-only     # or ATTNTUNE_TORCH_VARIANTS_ONLY=1 (ctest)
  python3 tests/torch/test_ops_gpu.py --dv-only           # or ATTNTUNE_TORCH_DV_ONLY=1: value head dims
  python3 tests/torch/test_ops_gpu.py --latent-only       # or ATTNTUNE_TORCH_LATENT_ONLY=1: latent caches
  python3 tests/torch/test_ops_gpu.py --fp8-only          # or ATTNTUNE_TORCH_FP8_ONLY=1: FP8 KV caches
  python3 tests/torch/test_ops_gpu.py --bwd-only          # or ATTNTUNE_TORCH_BWD_ONLY=1: the backward pass
  python3 tests/torch/test_ops_gpu.py --fp8-forward-only  # or ATTNTUNE_TORCH_FP8FWD_ONLY=1: the FP8 forward
  ATTNTUNE_TORCH_VARIANTS=0, ATTNTUNE_TORCH_DV=0, ATTNTUNE_TORCH_LATENT=0, ATTNTUNE_TORCH_FP8=0,
  ATTNTUNE_TORCH_BWD=0, ATTNTUNE_TORCH_FP8FWD=0: leave that phase out

The FP8 forward (q, k and v float8_e4m3fn, q_descale / k_descale / v_descale, out bf16; issue 42,
docs/design/torch.md "The FP8 forward"): sm_90 only, else SKIP. The package is
$ATTNTUNE_TORCH_FP8FWD_PKG, else one exported from $ATTNTUNE_TORCH_FP8FWD_DB, else one this test tunes
(FP8_FWD_PROBLEMS, flash_fwd_wgmma's dtype=fp8; $ATTNTUNE_TORCH_FP8FWD_BUDGET evaluations each). Then,
policy "raise": every FP8-forward kernel through attention on its tuned and odd shapes, v given
contiguous (the op's transposed copy), as a view of transposed storage (read in place) and in
layout="bshd", per-(sequence, KV head), single and no scales, NaN-poisoned out and LSE, against float64
over the dequantised inputs (FlashAttention-2's criterion against a baseline that rounds as an FP8
kernel does: scores bf16, 2^8 P e4m3, out bf16; the LSE within 2 x that baseline's LSE error + 1e-3);
every call ran an FP8-forward kernel (coverage), explain(..., dtype="fp8") names it and "bf16" does
not; and a captured CUDA graph of a call (the transposed copy inside it) replayed on new inputs.
"""
import argparse
import ctypes
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
SKIP = 77


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--max-cost", type=float, default=float(os.environ.get("ATTNTUNE_OP_MAX_COST", "0.03")))
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--variants-only", action="store_true",
                    default=os.environ.get("ATTNTUNE_TORCH_VARIANTS_ONLY", "0") == "1")
    ap.add_argument("--no-variants", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_VARIANTS", "1") == "0")
    ap.add_argument("--dv-only", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_DV_ONLY", "0") == "1")
    ap.add_argument("--no-dv", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_DV", "1") == "0")
    ap.add_argument("--latent-only", action="store_true",
                    default=os.environ.get("ATTNTUNE_TORCH_LATENT_ONLY", "0") == "1")
    ap.add_argument("--no-latent", action="store_true",
                    default=os.environ.get("ATTNTUNE_TORCH_LATENT", "1") == "0")
    ap.add_argument("--fp8-only", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_FP8_ONLY", "0") == "1")
    ap.add_argument("--no-fp8", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_FP8", "1") == "0")
    ap.add_argument("--bwd-only", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_BWD_ONLY", "0") == "1")
    ap.add_argument("--no-bwd", action="store_true", default=os.environ.get("ATTNTUNE_TORCH_BWD", "1") == "0")
    ap.add_argument("--fp8-forward-only", action="store_true",
                    default=os.environ.get("ATTNTUNE_TORCH_FP8FWD_ONLY", "0") == "1")
    ap.add_argument("--no-fp8-forward", action="store_true",
                    default=os.environ.get("ATTNTUNE_TORCH_FP8FWD", "1") == "0")
    args = ap.parse_args()
    device = os.environ.get("ATTNTUNE_TORCH_VARIANTS_DEVICE", "cuda")  # "cpu": a rehearsal of the variants phase
    dv_device = os.environ.get("ATTNTUNE_TORCH_DV_DEVICE", "cuda")  # "cpu": a rehearsal of the value-dims phase
    latent_device = os.environ.get("ATTNTUNE_TORCH_LATENT_DEVICE", "cuda")  # "cpu": a rehearsal of the latent phase
    fp8_device = os.environ.get("ATTNTUNE_TORCH_FP8_DEVICE", "cuda")  # "cpu": a rehearsal of the FP8 phase
    bwd_device = os.environ.get("ATTNTUNE_TORCH_BWD_DEVICE", "cuda")  # "cpu": a rehearsal of the backward phase
    if args.dv_only:
        device = dv_device
    if args.latent_only:
        device = latent_device
    if args.fp8_only:
        device = fp8_device
    if args.bwd_only:
        device = bwd_device
    if device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return SKIP

    work = tempfile.mkdtemp(prefix="attntune-torch-gpu-")
    os.environ.setdefault("ATTNTUNE_TORCH_CACHE", os.path.join(work, "cache"))
    os.environ["ATTNTUNE_TORCH_NO_AUTOLOAD"] = "1"
    failures = []
    if args.fp8_forward_only:
        failures += fp8_forward_phase(work)
    elif args.bwd_only:
        failures += bwd_phase(work, bwd_device)
    elif args.fp8_only:
        failures += fp8_phase(work, fp8_device)
    elif args.latent_only:
        failures += latent_phase(work, latent_device)
    elif args.dv_only:
        failures += dv_phase(work, dv_device)
    else:
        if not args.variants_only:
            failures += plain_phase(args, work)
        if not args.no_variants:
            failures += variants_phase(work, device)
        if not args.variants_only and not args.no_dv:
            failures += dv_phase(work, dv_device)
        if not args.variants_only and not args.no_latent:
            failures += latent_phase(work, latent_device)
        if not args.variants_only and not args.no_fp8:
            failures += fp8_phase(work, fp8_device)
        if not args.variants_only and not args.no_bwd:
            failures += bwd_phase(work, bwd_device)
        if not args.variants_only and not args.no_fp8_forward:
            failures += fp8_forward_phase(work)
    print(f"\n{'PASSED' if not failures else 'FAILED'}: {len(failures)} failure(s)")
    for m in failures:
        print(f"  {m}")
    return 1 if failures else 0


def plain_phase(args, work):
    """The plain phase (the module's docstring); returns its failures."""
    pkg = os.environ.get("ATTNTUNE_TORCH_PKG")
    if not pkg:
        pkg = os.path.join(work, "pkg")
        db = os.environ.get("ATTNTUNE_TORCH_DB", os.path.join(ROOT, "tests", "data", "campaigns", "h100-suite.db"))
        binary = os.environ.get("ATTNTUNE_BIN", os.path.join(ROOT, "build", "attntune"))
        dtype_arg = os.environ.get("ATTNTUNE_TORCH_DTYPE", "bf16")
        r = subprocess.run([binary, "export", "--db", db, "--all-best", "--dtype", dtype_arg, "--torch", pkg],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: export --torch: {r.stderr}")
            return [f"plain phase: export --torch from {db}: {r.stderr.strip()}"]
    sys.path.insert(0, pkg)
    import attntune  # noqa: E402
    import compare_sdpa as cs  # noqa: E402  (its reference, caches and timing)

    t0 = time.time()
    lib = attntune.load()
    print(f"loaded {pkg} in {time.time() - t0:.0f} s: {len(lib.kernels())} kernels, {lib.info['dtype']}; "
          f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    dtype_name = lib.info["dtype"]
    dtype = cs.TORCH_DTYPE[dtype_name]
    kv_problems = set(lib.info.get("entry_points", {}).get("attntune_attention_forward_kvcache", []))
    failures, table = [], []

    def fail(msg):
        failures.append(msg)
        print(f"  FAIL {msg}")

    # ---- values
    def check_dense(B, H, Hkv, S, Sk, D, causal, layout, seed):
        scale = 1 / math.sqrt(D)
        q, k, v, out = cs.make_inputs(B, H, Hkv, S, Sk, D, dtype, layout, seed)
        out.fill_(float("nan"))
        _, lse = lib.attention(q, k, v, is_causal=causal, return_lse=True, out=out)
        torch.cuda.synchronize()
        ref64, lse64 = cs.reference(q, k, v, causal, scale, torch.float64)
        lowp, _ = cs.reference(q, k, v, causal, scale, dtype)
        err = (out.double() - ref64).abs().max().item()
        bound = 2 * (lowp.double() - ref64).abs().max().item() + cs.ATOL[dtype_name]
        finite = torch.isfinite(lse64)
        lse_err = (lse.double()[finite] - lse64[finite]).abs().max().item() if finite.any() else 0.0
        what = f"dense b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} causal={int(causal)} {layout}"
        ok = math.isfinite(err) and err <= bound and lse_err <= cs.LSE_ATOL and torch.equal(
            torch.isneginf(lse.double()), ~finite)
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<58} err {err:.2e} <= {bound:.2e}, lse {lse_err:.1e}")
        if not ok:
            failures.append(what)

    def check_kvcache(B, H, Hkv, S, Sk, D, causal, page, seed):
        scale = 1 / math.sqrt(D)
        q, k, v, out = cs.make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", seed)
        lens = cs.ragged_lengths(B, Sk, seed)
        cache = cs.KvCache(k, v, lens, page, seed)
        out_bshd = torch.full((B, S, H, D), float("nan"), dtype=dtype, device="cuda")
        kc, vc = (cache.k, cache.v) if page else (cache.k.transpose(1, 2), cache.v.transpose(1, 2))
        o, lse = lib.attention_kvcache(q.transpose(1, 2), kc, vc, cache_seqlens=cache.seqlens, block_table=cache.table,
                                       is_causal=causal, return_lse=True, out=out_bshd)
        torch.cuda.synchronize()
        ref64, lse64 = cs.reference_ragged(q, k, v, lens, causal, scale, torch.float64)
        lowp, _ = cs.reference_ragged(q, k, v, lens, causal, scale, dtype)
        err = (out_bshd.transpose(1, 2).double() - ref64).abs().max().item()
        bound = 2 * (lowp.double() - ref64).abs().max().item() + cs.ATOL[dtype_name]
        finite = torch.isfinite(lse64)
        lse_err = (lse.double()[finite] - lse64[finite]).abs().max().item() if finite.any() else 0.0
        what = f"kvcache {'page=' + str(page) if page else 'contiguous'} b={B} h={H} hkv={Hkv} s={S} sk<={Sk}"
        ok = math.isfinite(err) and err <= bound and lse_err <= cs.LSE_ATOL
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<58} err {err:.2e} <= {bound:.2e}, lse {lse_err:.1e}")
        if not ok:
            failures.append(what)

    def check_varlen(lens_q, extra_k, H, Hkv, D, causal, seed):
        # A packed batch (flash_attn_varlen_func's layout), each sequence against float64. extra_k:
        # keys more than queries in every sequence, or each sequence's keys (a list).
        scale = 1 / math.sqrt(D)
        lens_k = list(extra_k) if isinstance(extra_k, list) else [n + extra_k for n in lens_q]
        cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(int(cu_q[-1]), H, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(int(cu_k[-1]), Hkv, D, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(int(cu_k[-1]), Hkv, D, device="cuda", dtype=dtype, generator=g)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((H, q.shape[0]), float("nan"), device="cuda")
        lib.ops.attention_varlen_into(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), out, lse, scale, causal)
        torch.cuda.synchronize()
        err = bound = lse_err = 0.0
        ok = True
        for b in range(len(lens_q)):
            if lens_q[b] == 0:
                continue
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            qb, kb, vb = (t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks]))
            ref64, lse64 = cs.reference(qb, kb, vb, causal, scale, torch.float64)
            lowp, _ = cs.reference(qb, kb, vb, causal, scale, dtype)
            e = (out[qs][None].transpose(1, 2).double() - ref64).abs().max().item()
            bd = 2 * (lowp.double() - ref64).abs().max().item() + cs.ATOL[dtype_name]
            finite = torch.isfinite(lse64[0])
            got = lse[:, qs].double()
            le = (got[finite] - lse64[0][finite]).abs().max().item() if finite.any() else 0.0
            ok = ok and math.isfinite(e) and e <= bd and le <= cs.LSE_ATOL and torch.equal(torch.isneginf(got), ~finite)
            err, bound, lse_err = max(err, e), max(bound, bd), max(lse_err, le)
        keys = f"keys {lens_k}" if isinstance(extra_k, list) else f"+{extra_k} keys"
        what = f"varlen lens {lens_q[:8]}{'...' if len(lens_q) > 8 else ''} {keys} h={H} hkv={Hkv}"
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<58} err {err:.2e} <= {bound:.2e}, lse {lse_err:.1e}")
        if not ok:
            failures.append(what)

    lib.set_policy("sdpa", 16.0)
    lib.reset_coverage()
    for i, kinfo in enumerate(lib.kernels()):
        p = kinfo["problem"]
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        if p.get("dv"):
            print(f"kernel {i}: built for head_dim {p['d']} and head_dim_v {p['dv']}: the value-dims phase checks it")
            continue
        if kinfo.get("variants"):
            print(f"kernel {i}: built with {', '.join(kinfo['variants'])}: the variants phase checks it")
            continue
        if p.get("kv_dtype"):
            print(f"kernel {i}: built for an FP8 KV cache: the FP8 phase checks it")
            continue
        if p.get("pass") == "bwd":
            print(f"kernel {i}: the backward pass (pass=bwd): the backward phase checks it")
            continue
        print(f"kernel {i}: {kinfo['template']} tuned for {cs.problem_str(p)}")
        if p.get("varlen"):
            # A packed batch of lengths up to S: empty, one-row, odd and the longest sequences.
            s2 = max(2, (S * 3 // 4) | 1)
            # The last: fewer keys than queries (causal: the first rows see none, zeros and LSE -inf).
            for seed, (lens, extra) in enumerate((([0, 1, 129, S, s2, 7, 0, 1000 % S + 1], Sk - S),
                                                  ([S, 1, 63, s2], Sk - S + 77),
                                                  ([300, 5, 257, 40], [40, 5, 1, 3]))):
                # (lengths far from the tuned ones: the kernel anyway, not the length-ratio fallback)
                lib.set_policy("sdpa", 16.0 if seed < 2 else 1e9)
                check_varlen(lens, extra, H, Hkv, D, causal, 200 + 10 * i + seed)
            lib.set_policy("sdpa", 16.0)
            continue
        if cs.problem_str(p) in kv_problems and S > cs.DECODE_MAX_S:
            # A chunked-prefill kernel serves the kvcache entry only: the tuned page size, 16, 256 and
            # a contiguous cache, ragged (0, 1, odd, all, random keys), and chunks near the tuned one.
            for seed, page in enumerate(sorted({p.get("page") or 64, 16, 256}) + [0]):
                check_kvcache(max(5, min(B, 8)), H, Hkv, S, min(Sk, S + 2051), D, causal, page, 100 + seed)
            check_kvcache(5, H, Hkv, max(17, (S * 3 // 4) | 1), min(Sk, S + 2051), D, causal, 64, 120)
            continue
        if S <= cs.DECODE_MAX_S:
            shapes = [(B, H, Hkv, S, Sk, "BHSD"), (3, H, Hkv, S, (Sk * 3 // 4) | 1, "BSHD")]
        else:
            s2 = max(17, (S * 3 // 4) | 1)
            shapes = [(B, H, Hkv, S, Sk, "BHSD"), (2, H, Hkv, s2, s2 if not causal else s2 + 130, "BSHD")]
            if H % 4 == 0:
                shapes.append((2, H, H // 4, s2, s2, "BHSD"))
        for seed, (b, h, hkv, s, sk, layout) in enumerate(shapes):
            check_dense(b, h, hkv, s, sk, D, causal, layout, 10 * i + seed)
        if cs.problem_str(p) in kv_problems:
            for seed, page in enumerate((16, 256, 0)):
                check_kvcache(max(5, min(B, 16)), H, Hkv, S, min(Sk, 4099), D, causal, page, 100 + seed)
    fallbacks = [r for r in lib.coverage() if r["kernel"] is None]
    for r in fallbacks:
        fail(f"{r['entry']} {r['problem']} fell back: {r['fallback']}")
    print(f"coverage: {len(lib.coverage())} shapes, {len(fallbacks)} fell back")

    # ---- torch.compile and CUDA graphs: the first kernel's problem through attention, and the first
    # kvcache kernel's through attention_kvcache on a paged cache. Each result is checked against
    # float64 like the eager calls above, and compared with the eager op's bits (reported): equal
    # for deterministic kernels. flash_decode is one since 524de8c (its key groups merge in a fixed
    # order; before, with shared-memory atomics, its last bits varied from call to call).
    def fa2_ok(got, ref64, lowp):
        err = (got.double() - ref64).abs().max().item()
        return math.isfinite(err) and err <= 2 * (lowp.double() - ref64).abs().max().item() + cs.ATOL[dtype_name], err

    cases = []
    dense = [k["problem"] for k in lib.kernels() if not k["problem"].get("varlen") and not k.get("variants")
             and not k["problem"].get("dv") and not k["problem"].get("kv_dtype") and k["problem"].get("pass") != "bwd"]
    p = dense[0] if dense else {"b": 1, "h": 1, "hkv": 1, "s": 1, "sk": 1, "d": 64, "causal": 0}
    B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])

    def dense_case(seed, B=B, H=H, Hkv=Hkv, S=S, Sk=Sk, D=D, causal=causal):
        q, k, v, _ = cs.make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", seed)
        call = lambda q, k, v: attntune.attention(q, k, v, is_causal=causal)  # noqa: E731
        ref = lambda: (cs.reference(q, k, v, causal, 1 / math.sqrt(D), torch.float64)[0],  # noqa: E731
                       cs.reference(q, k, v, causal, 1 / math.sqrt(D), dtype)[0])
        return (q, k, v), call, ref
    if dense:
        cases.append(("attention " + cs.problem_str(p), dense_case))
    kv_kernels = [k["problem"] for k in lib.kernels()
                  if cs.problem_str(k["problem"]) in kv_problems and not k.get("variants") and not k["problem"].get("dv")
                  and not k["problem"].get("kv_dtype") and k["problem"].get("pass") != "bwd"]
    if kv_kernels:
        pk = kv_kernels[0]

        def kv_case(seed, p=pk):
            B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
            q, k, v, _ = cs.make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", seed)
            cache = cs.KvCache(k, v, None, p.get("page") or 16, seed)
            call = lambda q, kc, vc, table: attntune.attention_kvcache(  # noqa: E731
                q.transpose(1, 2), kc, vc, block_table=table, is_causal=causal).transpose(1, 2)
            ref = lambda: (cs.reference(q, k, v, causal, 1 / math.sqrt(D), torch.float64)[0],  # noqa: E731
                           cs.reference(q, k, v, causal, 1 / math.sqrt(D), dtype)[0])
            return (q, cache.k, cache.v, cache.table), call, ref
        cases.append(("attention_kvcache " + cs.problem_str(pk), kv_case))
    for name, make in cases:
        args_, call, ref = make(7)
        ref64, lowp = ref()
        torch._dynamo.reset()
        eager = call(*args_)
        compiled = torch.compile(lambda *a: call(*a) * 1.0, fullgraph=True)(*args_)
        torch.cuda.synchronize()
        ok, err = fa2_ok(compiled, ref64, lowp)
        print(f"  {'ok  ' if ok else 'FAIL'} torch.compile(fullgraph=True) {name}: err {err:.2e}, "
              f"{'bit-identical to eager' if torch.equal(eager, compiled) else 'not bit-identical to eager'}")
        if not ok:
            failures.append(f"torch.compile {name}")
        # A CUDA graph: warm up on a side stream, capture, then new inputs copied in and replayed.
        static = [t.clone() if t is not None else None for t in args_]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call(*static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            graph_out = call(*static)
        fresh, _, fresh_ref = make(8)
        for dst, src in zip(static, fresh):
            if dst is not None:
                dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        ref64, lowp = fresh_ref()
        ok, err = fa2_ok(graph_out, ref64, lowp)
        eager = call(*fresh)
        torch.cuda.synchronize()
        print(f"  {'ok  ' if ok else 'FAIL'} CUDA graph (capture, new inputs, replay) {name}: err {err:.2e}, "
              f"{'bit-identical to eager' if torch.equal(eager, graph_out) else 'not bit-identical to eager'}")
        if not ok:
            failures.append(f"CUDA graph {name}")

    # ---- the op's cost against the raw entry point
    if not args.no_timing:
        raw = ctypes.CDLL(lib.kernels_library)
        fwd = raw.attntune_attention_forward
        fwd.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 6 + [ctypes.POINTER(ctypes.c_longlong)] * 4 +
                        [ctypes.c_float, ctypes.c_int, ctypes.c_void_p])
        kvf = getattr(raw, "attntune_attention_forward_kvcache", None)
        if kvf is not None:
            kvf.argtypes = ([ctypes.c_void_p] * 7 + [ctypes.c_int] * 8 + [ctypes.POINTER(ctypes.c_longlong)] * 4 +
                            [ctypes.c_float, ctypes.c_int, ctypes.c_void_p])
        for kinfo in lib.kernels():
            p = kinfo["problem"]
            if p.get("varlen") or kinfo.get("variants") or p.get("dv") or p.get("kv_dtype") or p.get("pass") == "bwd":
                continue  # varlen: timed against the peers by tools/compare_varlen.py; split dims, FP8: not here
            B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
            scale = 1 / math.sqrt(D)
            q, k, v, out = cs.make_inputs(B, H, Hkv, S, Sk, D, dtype, "BHSD", 3)
            # Decode kernels and chunked-prefill ones (which serve nothing else): through the kvcache
            # entry, on a paged cache (every sequence at sk).
            kv = cs.problem_str(p) in kv_problems and (S <= cs.DECODE_MAX_S or bool(p.get("page")))
            if kv:
                cache = cs.KvCache(k, v, None, p.get("page") or 16, 5)
                qt, ot = q.transpose(1, 2), out.transpose(1, 2)
                st = [(ctypes.c_longlong * 3)(*x) for x in (q.stride()[:3], cache.k_strides, cache.v_strides,
                                                            out.stride()[:3])]

                def raw_call():
                    r = kvf(q.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(), out.data_ptr(), None, None,
                            cache.table.data_ptr(), cache.max_blocks, cache.page, B, H, Hkv, S, Sk, D, *st,
                            ctypes.c_float(scale), int(causal),
                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
                    assert r == 0, raw.attntune_last_error()

                def op_call():
                    lib.ops.attention_kvcache_into(qt, cache.k, cache.v, None, cache.table, ot, None, scale, causal)
            else:
                st = [(ctypes.c_longlong * 3)(*t.stride()[:3]) for t in (q, k, v, out)]

                def raw_call():
                    r = fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None, B, H, Hkv, S, Sk, D, *st,
                            ctypes.c_float(scale), int(causal),
                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
                    assert r == 0, raw.attntune_last_error()

                def op_call():
                    lib.ops.attention_into(q, k, v, out, None, scale, causal)
            graphs = {"raw": cs.capture(raw_call, args.calls), "op": cs.capture(op_call, args.calls)}
            results = {}
            cs.time_interleaved(graphs, ("raw", "op"), args.calls, 30, args.rounds, args.min_seconds, results)
            raw_us, op_us = results["raw"] * 1000, results["op"] * 1000
            # Eager (no graph): the op's host cost shows where the kernel is short.
            eager_raw = cs.time_fn(raw_call) * 1000
            eager_op = cs.time_fn(op_call) * 1000
            cost = op_us / raw_us - 1
            table.append((cs.problem_str(p) + (" paged" if kv else ""), raw_us, op_us, cost, eager_raw, eager_op))
            if cost > args.max_cost:
                fail(f"{cs.problem_str(p)}: the op costs {cost * 100:+.1f}% over the raw kernel (graph replay)")

    if table:
        print(f"\n{'problem':<62} {'raw us':>9} {'op us':>9} {'op cost':>8} {'eager raw':>10} {'eager op':>9}")
        for name, r_us, o_us, cost, er, eo in table:
            print(f"{name:<62} {r_us:9.2f} {o_us:9.2f} {cost * 100:+7.2f}% {er:10.2f} {eo:9.2f}")
        print("raw: attntune_attention_forward(_kvcache) by ctypes; op: torch.ops.attntune.*_into; both captured "
              f"{args.calls} calls per CUDA graph, medians of {args.rounds} interleaved rounds of >= "
              f"{args.min_seconds} s; eager: one call per CUDA-event timing, no graph")
    return failures


# ------------------------------------------------------------------ the variants phase

# What the variants phase tunes when it is given no package or database: models' layers at small
# sizes (a few tuned kernels, the fewer evaluations the better), bf16. A problem no family tunes
# yet is refused by `submit` (exit 2) and reported as SKIP.
VARIANT_PROBLEMS = [
    "b=2,h=8,hkv=1,s=1024,sk=1024,d=64,dtype=bf16,causal=1,window=128,sinks=1",        # gpt-oss window layer
    "b=1,h=8,hkv=1,s=1024,sk=1024,d=64,dtype=bf16,causal=1,sinks=1",                   # gpt-oss full layer
    "b=1,h=8,hkv=4,s=1024,sk=1024,d=128,dtype=bf16,causal=1,window=256,softcap=50",    # Gemma 2
    "b=2,h=4,hkv=4,s=512,sk=700,d=128,dtype=bf16,causal=0,window=127,64,softcap=30",   # two-sided
    "b=8,h=16,hkv=2,s=1,sk=4096,d=64,dtype=bf16,causal=1,page=16,window=128,sinks=1",  # gpt-oss decode
    "b=4,h=8,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=0,page=16,softcap=30",          # Gemma 2 decode
    "b=2,h=8,hkv=2,s=256,sk=2048,d=128,dtype=bf16,causal=1,page=64,window=512",        # chunked prefill
    "b=4,h=8,hkv=2,s=512,sk=512,d=64,dtype=bf16,causal=1,varlen=4,window=64,sinks=1",  # varlen
]
# So that a package exists when no family tunes a variant yet: the fallback is checked through it.
PLAIN_PROBLEM = "b=1,h=8,hkv=2,s=512,sk=512,d=64,dtype=bf16,causal=1"
ENTRY_POINTS = {"attntune_attention_forward": "attention", "attntune_attention_forward_kvcache": "attention_kvcache",
                "attntune_attention_forward_varlen": "attention_varlen",
                "attntune_attention_backward": "attention_backward"}


def tuned_package(work, env, problems, label, name):
    """A phase's package and the notes to print (what was not tuned, and why): $<env>_PKG, else an
    export of $<env>_DB as it is, else `problems` submitted with $<env>_BUDGET evaluations each
    (default 2) into $<env>_TUNE_DB (a second run resumes it: submitting a queued or done problem
    again is a no-op, serve finishes what is left) or WORK/<name>.db, tuned by `attntune serve` on
    this GPU and exported to WORK/<name>_pkg. `submit` refuses a problem no family tunes yet (exit
    2): a SKIP note, never a failure."""
    pkg = os.environ.get(env + "_PKG")
    if pkg:
        return pkg, []
    binary = os.environ.get("ATTNTUNE_BIN", os.path.join(ROOT, "build", "attntune"))
    db = os.environ.get(env + "_DB")
    notes = []
    if not db:
        db = os.environ.get(env + "_TUNE_DB") or os.path.join(work, name + ".db")
        budget = os.environ.get(env + "_BUDGET", "2")
        for p in problems:
            r = subprocess.run([binary, "submit", "--db", db, "--problem", p, "--budget-evals", budget, "--final-top",
                                "0", "--warm-start", "0", "--max-seconds", "0.3"], capture_output=True, text=True)
            if r.returncode == 2:
                notes.append(f"SKIP {p}: {r.stderr.strip()}")
            elif r.returncode != 0:
                raise RuntimeError(f"attntune submit {p} failed ({r.returncode}): {r.stderr}")
        t0 = time.time()
        r = subprocess.run([binary, "serve", "--db", db], capture_output=True, text=True)
        print(f"{label}: tuned in {time.time() - t0:.0f} s (attntune serve, budget {budget} each): "
              f"{r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
        if r.returncode != 0:
            raise RuntimeError(f"attntune serve failed ({r.returncode}): {r.stderr[-4000:]}")
    pkg = os.path.join(work, name + "_pkg")
    r = subprocess.run([binary, "export", "--db", db, "--all-best", "--dtype", "bf16", "--torch", pkg],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"attntune export --torch from {db} failed ({r.returncode}): {r.stderr}")
    return pkg, notes


def variant_package(work):
    """The variants phase's package (tuned_package: $ATTNTUNE_TORCH_VARIANTS_*)."""
    return tuned_package(work, "ATTNTUNE_TORCH_VARIANTS", [PLAIN_PROBLEM] + VARIANT_PROBLEMS, "variants", "variants")


def load_package(pkg, namespace, notes=()):
    """An exported package's kernels.cu loaded as torch ops under `namespace` (the package put first on
    sys.path for the first phase: one attntune module serves every library); prints how long it took
    and the package's notes. Returns the attntune module and the library."""
    if "attntune" not in sys.modules:
        sys.path.insert(0, pkg)
    import attntune  # noqa: E402
    t0 = time.time()
    lib = attntune.load(os.path.join(pkg, "attntune", "kernels.cu"), namespace=namespace)
    print(f"loaded {pkg} in {time.time() - t0:.0f} s: {len(lib.kernels())} kernels")
    for n in notes:
        print(f"  {n}")
    return attntune, lib


def variants_phase(work, device="cuda"):
    """The variants phase (the module's docstring); returns its failures. device "cpu" rehearses it
    without a GPU (ATTNTUNE_TORCH_VARIANTS_DEVICE=cpu, with ATTNTUNE_TORCH_VARIANTS_PKG): every call
    falls back there, so the kernel checks run the fallback, and graphs and inductor are left out."""
    print("\n==== variants: window_size, softcap, sinks")
    try:
        pkg, notes = variant_package(work)
    except RuntimeError as e:
        print(f"  FAIL {e}")
        return [f"variants: {e}"]
    attntune, lib = load_package(pkg, "attntune_variants", notes)
    import variant_reference as vr  # noqa: E402
    gpu = device == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[lib.info["dtype"]]
    failures = []
    gen = torch.Generator(device=device)

    def randn(*shape, seed):
        gen.manual_seed(seed)
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    def record(ok, what, msg):
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<96} {msg}")
        if not ok:
            failures.append(what)

    def call(fn, what):
        """fn() under the raise policy; a fallback or an error is the check's failure."""
        try:
            fn()
            if gpu:
                torch.cuda.synchronize()
            return True
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return False

    def words(causal, window, softcap, sinks):
        return f"causal={int(causal)} window={tuple(window)} softcap={softcap:g} sinks={sinks is not None}"

    def check_dense(B, H, Hkv, S, Sk, D, causal, window, softcap, sinks, layout, seed, tag):
        scale = 1 / math.sqrt(D)
        q, k, v = (randn(B, n, L, D, seed=seed + i) for i, (n, L) in enumerate(((H, S), (Hkv, Sk), (Hkv, Sk))))
        if layout == "BSHD":  # [B, S, H, D] storage seen as [B, H, S, D]: strided, no copy
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        out = torch.full_like(q, float("nan"))
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = f"{tag} dense b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} {words(causal, window, softcap, sinks)} {layout}"
        if not call(lambda: lib.ops.attention_into(q, k, v, out, lse, scale, causal, list(window), softcap, sinks),
                    what):
            return
        args = dict(causal=causal, window=window, softcap=softcap, sinks=sinks)
        ref64, lse64 = vr.attention(q, k, v, scale, **args)
        lowp, _ = vr.attention(q, k, v, scale, dtype=dtype, **args)
        ok, msg = vr.compare(out, lse, ref64, lse64, lowp, dtype, lse_atol=1e-3)
        record(ok, what, msg)

    def check_kvcache(B, H, Hkv, S, Sk, D, causal, window, softcap, sinks, page, seed, tag):
        scale = 1 / math.sqrt(D)
        q, k, v = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1), randn(B, Hkv, Sk, D, seed=seed + 2)
        g = torch.Generator().manual_seed(seed)
        # Ragged: every key, none, one, an odd count and a random one, in turns.
        lens = [[Sk, 0, 1, (Sk // 2) | 1, int(torch.randint(1, Sk + 1, (1,), generator=g))][b % 5] for b in range(B)]
        kc, vc, table = vr.paged_cache(k, v, lens, page, seed)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        qt = q.transpose(1, 2)  # [B, S, H, D] as flash_attn_with_kvcache takes it
        out = torch.full_like(qt, float("nan"))
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = (f"{tag} kvcache {'page=' + str(page) if page else 'contiguous'} b={B} h={H} hkv={Hkv} s={S} "
                f"sk<={Sk} d={D} {words(causal, window, softcap, sinks)}")
        if not call(lambda: lib.ops.attention_kvcache_into(qt, kc, vc, seqlens, table, out, lse, scale, causal,
                                                           list(window), softcap, sinks), what):
            return
        args = dict(causal=causal, window=window, softcap=softcap, sinks=sinks, len_k=lens)
        ref64, lse64 = vr.attention(q, k, v, scale, **args)
        lowp, _ = vr.attention(q, k, v, scale, dtype=dtype, **args)
        ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, dtype)
        record(ok, what, msg)

    def check_varlen(lens_q, lens_k, H, Hkv, D, causal, window, softcap, sinks, seed, tag):
        scale = 1 / math.sqrt(D)
        cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=device)
        cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=device)
        q, k, v = randn(sum(lens_q), H, D, seed=seed), randn(sum(lens_k), Hkv, D, seed=seed + 1), \
            randn(sum(lens_k), Hkv, D, seed=seed + 2)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((H, q.shape[0]), float("nan"), device=device)
        what = (f"{tag} varlen lens {lens_q[:6]}{'...' if len(lens_q) > 6 else ''} h={H} hkv={Hkv} d={D} "
                f"{words(causal, window, softcap, sinks)}")
        if not call(lambda: lib.ops.attention_varlen_into(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), out, lse,
                                                          scale, causal, list(window), softcap, sinks), what):
            return
        worst_ok, worst, worst_err = True, "", -1.0
        for b in range(len(lens_q)):
            if lens_q[b] == 0:
                continue
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            qb, kb, vb = (t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks]))
            args = dict(causal=causal, window=window, softcap=softcap, sinks=sinks)
            ref64, lse64 = vr.attention(qb, kb, vb, scale, **args)
            lowp, _ = vr.attention(qb, kb, vb, scale, dtype=dtype, **args)
            got = out[qs][None].transpose(1, 2)
            ok, msg = vr.compare(got, lse[:, qs][None], ref64, lse64, lowp, dtype)
            err = (got.double() - ref64).abs().max().nan_to_num(float("inf")).item()
            if (not ok and worst_ok) or (ok == worst_ok and err > worst_err):  # the first failure, else the worst
                worst, worst_err = f"seq {b}: {msg}", err
            worst_ok = worst_ok and ok
        record(worst_ok, what, worst)

    # -- the variant kernels, policy "raise": every call must run its kernel
    kernels = lib.kernels()
    entries = {spec: [] for spec in (vr.spec_of(k["problem"]) for k in kernels)}
    for name, specs in lib.info.get("entry_points", {}).items():
        for spec in specs:
            entries.setdefault(spec, []).append(ENTRY_POINTS[name])
    # split: the value-dims phase; FP8 caches: the FP8 phase (of kernels without variants)
    tuned = [k for k in kernels if k.get("variants") and not k["problem"].get("dv") and not k["problem"].get("kv_dtype")
             and k["problem"].get("pass") != "bwd"]  # a windowed backward kernel: the backward phase
    print(f"variants: {len(tuned)} kernels built with variants: "
          + ("; ".join(f"{vr.spec_of(k['problem'])} ({', '.join(k['variants'])})" for k in tuned) or "none"))
    lib.set_policy("raise" if gpu else "sdpa", 1e9)
    lib.reset_coverage()
    first = {}
    for i, kinfo in enumerate(tuned):
        p = kinfo["problem"]
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        left, right = p.get("window", [-1, -1])
        if left < 0 and right < 0:
            windows = [(-1, -1)]
        elif causal:
            windows = list(dict.fromkeys([(left, -1), (0, 0), (1, -1), (127, 0), (4096, 0)]))
        else:
            windows = list(dict.fromkeys([(left, right), (127, 64), (-1, 64), (0, -1), (1, 64)]))
        caps = [30.0, 50.0] if p.get("softcap") else [0.0]
        sinks = vr.sink_logits(H, i, device) if p.get("sinks") else None
        how = entries.get(vr.spec_of(p), [])
        tag = f"k{i}"
        cases = [(windows[j % len(windows)], caps[j % len(caps)]) for j in range(max(len(windows), 2))]
        if p.get("varlen"):
            s2 = max(2, (S * 3 // 4) | 1)
            for j, (window, cap) in enumerate(cases):
                lens_q = [[0, 1, min(S, 129), S, s2, 7], [S, 1, 63, s2]][j % 2]
                lens_k = [n + (Sk - S) + (77 if j % 2 else 0) for n in lens_q]
                check_varlen(lens_q, lens_k, H, Hkv, D, causal, window, cap, sinks, 300 + 10 * i + j, tag)
            first.setdefault("varlen", (p, sinks))
        elif "attention_kvcache" in how and (S <= 16 or p.get("page")):
            pages = [p.get("page") or 16, 0, 256]
            for j, (window, cap) in enumerate(cases):
                s_rows = S if j % 2 == 0 else (max(1, S // 2) | 1 if S <= 16 else max(17, (S * 3 // 4) | 1))
                check_kvcache(max(5, min(B, 8)), H, Hkv, s_rows, Sk if j % 2 == 0 else (Sk * 3 // 4) | 1, D, causal,
                              window, cap, sinks, pages[j % 3], 200 + 10 * i + j, tag)
            first.setdefault("kvcache", (p, sinks))
        if "attention" in how and not p.get("varlen") and not (p.get("page") and S > 16):
            s2 = max(17, (S * 3 // 4) | 1) if S > 16 else S
            shapes = [(B, S, Sk, "BHSD"), (2, s2, (s2 + 130) if S > 16 else (Sk * 3 // 4) | 1, "BSHD")]
            for j, (window, cap) in enumerate(cases):
                b, s, sk, layout = shapes[j % 2]
                check_dense(b, H, Hkv, s, sk, D, causal, window, cap, sinks, layout, 100 + 10 * i + j, tag)
            first.setdefault("dense", (p, sinks))
    for r in lib.coverage():
        if r["kernel"] is None and gpu:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} fell back", r["fallback"])

    # -- the same odd shapes through the fallback: max_length_ratio 1 sends every call not exactly
    # at a tuned problem to it.
    lib.set_policy("sdpa", 1.0)
    lib.reset_coverage()
    for name, (p, sinks) in first.items():
        H, Hkv, D, causal = p["h"], p["hkv"], p["d"], bool(p["causal"])
        window = tuple(p.get("window", (-1, -1)))
        cap = p.get("softcap", 0.0)
        if name == "dense":
            check_dense(2, H, Hkv, 77, 77 + 64, D, causal, window, cap, sinks, "BSHD", 500, "fallback")
        elif name == "kvcache":
            check_kvcache(5, H, Hkv, 3 if p["s"] <= 16 else 40, 333, D, causal, window, cap, sinks, 16, 510, "fallback")
        else:
            check_varlen([0, 5, 33], [7, 5, 40], H, Hkv, D, causal, window, cap, sinks, 520, "fallback")
    # -- the fallback with every combination, where no kernel is (head_dim 96: no family tunes it)
    s8 = vr.sink_logits(8, 7, device)
    for j, (causal, window, cap, sk) in enumerate(((True, (16, 0), 30.0, s8), (False, (16, 8), 50.0, None),
                                                  (False, (-1, 64), 0.0, s8), (True, (-1, -1), 50.0, s8))):
        check_dense(2, 8, 2, 100, 150 if j % 2 else 60, 96, causal, window, cap, sk, "BSHD" if j % 2 else "BHSD",
                    600 + j, "fallback")
    check_kvcache(5, 8, 2, 1, 500, 96, True, (100, 0), 30.0, s8, 16, 610, "fallback")
    check_kvcache(5, 8, 2, 20, 300, 96, False, (30, 5), 0.0, s8, 0, 620, "fallback")
    check_varlen([0, 1, 17, 64, 33], [3, 1, 17, 80, 20], 8, 2, 96, True, (7, 0), 50.0, s8, 630, "fallback")
    for r in lib.coverage():
        if r["kernel"] is not None:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} ran kernel {r['label']}",
                   "expected the fallback (max_length_ratio 1, or head_dim 96)")

    # -- torch.compile(fullgraph=True) and CUDA graphs, of a variant kernel's call and the fallback's
    if gpu:
        lib.set_policy("sdpa", 1e9)
        cases = []
        if "dense" in first:
            p, sinks = first["dense"]
            cases.append(("kernel " + vr.spec_of(p), p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"]),
                          tuple(p.get("window", (-1, -1))), p.get("softcap", 0.0), sinks))
        cases.append(("fallback d=96", 2, 8, 2, 100, 150, 96, True, (16, 0), 30.0, s8))
        for name, B, H, Hkv, S, Sk, D, causal, window, cap, sinks in cases:
            scale = 1 / math.sqrt(D)

            def inputs(seed):
                return [randn(B, n, L, D, seed=seed + j) for j, (n, L) in enumerate(((H, S), (Hkv, Sk), (Hkv, Sk)))]

            def op(q, k, v, sk):
                return lib.attention(q, k, v, is_causal=causal, window_size=window, softcap=cap, sinks=sk,
                                     return_lse=True)

            def reference(q, k, v, sk):
                args = dict(causal=causal, window=window, softcap=cap, sinks=sk)
                return vr.attention(q, k, v, scale, **args), vr.attention(q, k, v, scale, dtype=dtype, **args)[0]
            q, k, v = inputs(700)
            torch._dynamo.reset()
            eager = op(q, k, v, sinks)
            compiled = torch.compile(lambda *a: tuple(t * 1.0 for t in op(*a)), fullgraph=True)(q, k, v, sinks)
            torch.cuda.synchronize()
            (ref64, lse64), lowp = reference(q, k, v, sinks)
            ok, msg = vr.compare(compiled[0], compiled[1], ref64, lse64, lowp, dtype)
            same = torch.equal(eager[0], compiled[0])
            record(ok, f"torch.compile(fullgraph=True) {name}",
                   msg + (", bit-identical to eager" if same else ", not bit-identical to eager"))
            # A CUDA graph: warm up on a side stream, capture, new inputs (and sinks) copied in, replay.
            static = [t.clone() for t in (q, k, v)] + [sinks.clone() if sinks is not None else None]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                op(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graph_out = op(*static)
            fresh = inputs(800) + [sinks.flip(0) if sinks is not None else None]
            for dst, src in zip(static, fresh):
                if dst is not None:
                    dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            (ref64, lse64), lowp = reference(*fresh)
            ok, msg = vr.compare(graph_out[0], graph_out[1], ref64, lse64, lowp, dtype)
            record(ok, f"CUDA graph (capture, new inputs and sinks, replay) {name}", msg)
    if not tuned:
        print("variants: no kernel was built with a variant (no family tunes one yet, or none was given): the "
              "fallback alone was checked")
    return [f"variants: {f}" for f in failures]


# ------------------------------------------------------------------ the value-head-dims phase

# What the value-dims phase tunes when it is given no package or database (issue 44; docs/design/
# head_dims.md "Value head dims"): DeepSeek's MLA prefill (d=192, dv=128) dense, paged (chunked
# prefill), varlen and decode, and V wider than K (d=64, dv=128), at small sizes, bf16.
DV_PROBLEMS = [
    "b=1,h=16,hkv=16,s=1024,sk=1024,d=192,dv=128,dtype=bf16,causal=1",         # MLA prefill
    "b=2,h=8,hkv=2,s=512,sk=512,d=64,dv=128,dtype=bf16,causal=0",              # V wider than K, GQA
    "b=2,h=16,hkv=16,s=256,sk=2048,d=192,dv=128,dtype=bf16,causal=1,page=64",  # chunked prefill
    "b=4,h=16,hkv=16,s=512,sk=512,d=192,dv=128,dtype=bf16,causal=1,varlen=4",  # varlen
    "b=8,h=16,hkv=2,s=1,sk=4096,d=64,dv=128,dtype=bf16,causal=1,page=16",      # decode, V wider
    "b=8,h=16,hkv=16,s=1,sk=2048,d=192,dv=128,dtype=bf16,causal=0,page=16",    # decode at MLA's dims
]


def dv_package(work):
    """The value-dims phase's package (tuned_package: $ATTNTUNE_TORCH_DV_*, DV_PROBLEMS)."""
    return tuned_package(work, "ATTNTUNE_TORCH_DV", DV_PROBLEMS, "value dims", "dv")


def dv_phase(work, device="cuda"):
    """The value-head-dims phase (v's last dim Dv != D; the module's docstring); returns its
    failures. device "cpu" rehearses it without a GPU (ATTNTUNE_TORCH_DV_DEVICE=cpu, with a package
    or a database): every call falls back there, so the kernel checks check the fallback, and
    graphs and inductor are left out."""
    print("\n==== value head dims: v's last dim other than q's and k's")
    try:
        pkg, notes = dv_package(work)
    except RuntimeError as e:
        print(f"  FAIL {e}")
        return [f"value dims: {e}"]
    attntune, lib = load_package(pkg, "attntune_dv", notes)
    import variant_reference as vr  # noqa: E402
    gpu = device == "cuda"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[lib.info["dtype"]]
    failures = []
    gen = torch.Generator(device=device)

    def randn(*shape, seed):
        gen.manual_seed(seed)
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    def record(ok, what, msg):
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<100} {msg}")
        if not ok:
            failures.append(what)

    def call(fn, what):
        """fn()'s result, or None when it raised (under the raise policy a fallback raises)."""
        try:
            r = fn()
            if gpu:
                torch.cuda.synchronize()
            return r if r is not None else True
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return None

    def reference(q, k, v, scale, **args):
        return vr.attention(q, k, v, scale, **args), vr.attention(q, k, v, scale, dtype=dtype, **args)[0]

    def variant_words(var):
        return " ".join(f"{k}={v if not isinstance(v, torch.Tensor) else 'yes'}" for k, v in var.items())

    def check_dense(B, H, Hkv, S, Sk, D, Dv, causal, layout, seed, tag, var):
        scale = 1 / math.sqrt(D)
        q, k, v = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1), randn(B, Hkv, Sk, Dv, seed=seed + 2)
        if layout == "BSHD":  # [B, S, H, D] storage seen as [B, H, S, D]: strided, no copy
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        out = torch.full((B, S, H, Dv) if layout == "BSHD" else (B, H, S, Dv), float("nan"), device=device,
                         dtype=dtype)
        out = out.transpose(1, 2) if layout == "BSHD" else out
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = f"{tag} dense b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} dv={Dv} causal={int(causal)} {layout} " \
               f"{variant_words(var)}"
        win = list(var.get("window_size", (-1, -1)))
        if not call(lambda: lib.ops.attention_into(q, k, v, out, lse, scale, causal, win, var.get("softcap", 0.0),
                                                   var.get("sinks")), what):
            return
        args = dict(causal=causal, window=tuple(win), softcap=var.get("softcap", 0.0), sinks=var.get("sinks"))
        (ref64, lse64), lowp = reference(q, k, v, scale, **args)
        ok, msg = vr.compare(out, lse, ref64, lse64, lowp, dtype)
        # The op's own out: [B, H, S, Dv], laid out as q is.
        own = call(lambda: lib.attention(q, k, v, is_causal=causal, **var), what + " (own out)")
        if own is None:
            return
        ok_own, msg_own = vr.compare(own, None, ref64, lse64, lowp, dtype)
        shape_ok = own.shape == (B, H, S, Dv) and own.stride() == attntune._out_like(q, v).stride() and (
            layout != "BSHD" or own.transpose(1, 2).is_contiguous())
        record(ok and ok_own and shape_ok, what, msg + ("" if shape_ok else f", own out {tuple(own.shape)} "
                                                         f"strides {own.stride()}") +
               ("" if ok_own else f", own out: {msg_own}"))

    def check_kvcache(B, H, Hkv, S, Sk, D, Dv, causal, page, seed, tag, var):
        scale = 1 / math.sqrt(D)
        q, k, v = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1), randn(B, Hkv, Sk, Dv, seed=seed + 2)
        g = torch.Generator().manual_seed(seed)
        # Ragged: every key, none, one, an odd count and a random one, in turns.
        lens = [[Sk, 0, 1, (Sk // 2) | 1, int(torch.randint(1, Sk + 1, (1,), generator=g))][b % 5] for b in range(B)]
        kc, vc, table = vr.paged_cache(k, v, lens, page, seed)  # NaN past each length, shuffled pages
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        qt = q.transpose(1, 2)  # [B, S, H, D]
        out = torch.full((B, S, H, Dv), float("nan"), device=device, dtype=dtype)
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = (f"{tag} kvcache {'page=' + str(page) if page else 'contiguous'} b={B} h={H} hkv={Hkv} s={S} "
                f"sk<={Sk} d={D} dv={Dv} causal={int(causal)} {variant_words(var)}")
        win = list(var.get("window_size", (-1, -1)))
        if not call(lambda: lib.ops.attention_kvcache_into(qt, kc, vc, seqlens, table, out, lse, scale, causal, win,
                                                           var.get("softcap", 0.0), var.get("sinks")), what):
            return
        args = dict(causal=causal, window=tuple(win), softcap=var.get("softcap", 0.0), sinks=var.get("sinks"),
                    len_k=lens)
        (ref64, lse64), lowp = reference(q, k, v, scale, **args)
        ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, dtype)
        own = call(lambda: lib.attention_kvcache(qt, kc, vc, cache_seqlens=seqlens, block_table=table,
                                                 is_causal=causal, **var), what + " (own out)")
        if own is None:
            return
        ok_own, _ = vr.compare(own.transpose(1, 2), None, ref64, lse64, lowp, dtype)
        # Laid out as q is (here a [B, H, S, D] tensor seen as [B, S, H, D]), as the fake says.
        shape_ok = own.shape == (B, S, H, Dv) and own.stride() == attntune._out_like(qt, vc).stride()
        record(ok and ok_own and shape_ok, what, msg + ("" if shape_ok else f", own out {tuple(own.shape)} "
                                                         f"strides {own.stride()}") +
               ("" if ok_own else ", own out over the bound"))

    def check_varlen(lens_q, lens_k, H, Hkv, D, Dv, causal, seed, tag, var):
        scale = 1 / math.sqrt(D)
        cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=device)
        cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=device)
        q, k, v = randn(sum(lens_q), H, D, seed=seed), randn(sum(lens_k), Hkv, D, seed=seed + 1), \
            randn(sum(lens_k), Hkv, Dv, seed=seed + 2)
        out = torch.full((q.shape[0], H, Dv), float("nan"), device=device, dtype=dtype)
        lse = torch.full((H, q.shape[0]), float("nan"), device=device)
        what = (f"{tag} varlen lens {lens_q[:6]}{'...' if len(lens_q) > 6 else ''} h={H} hkv={Hkv} d={D} dv={Dv} "
                f"causal={int(causal)} {variant_words(var)}")
        win = list(var.get("window_size", (-1, -1)))
        if not call(lambda: lib.ops.attention_varlen_into(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), out, lse,
                                                          scale, causal, win, var.get("softcap", 0.0),
                                                          var.get("sinks")), what):
            return
        worst_ok, worst, worst_err = True, "", -1.0
        for b in range(len(lens_q)):
            if lens_q[b] == 0:
                continue
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            qb, kb, vb = (t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks]))
            args = dict(causal=causal, window=tuple(win), softcap=var.get("softcap", 0.0), sinks=var.get("sinks"))
            (ref64, lse64), lowp = reference(qb, kb, vb, scale, **args)
            got = out[qs][None].transpose(1, 2)
            ok, msg = vr.compare(got, lse[:, qs][None], ref64, lse64, lowp, dtype)
            err = (got.double() - ref64).abs().max().nan_to_num(float("inf")).item()
            if (not ok and worst_ok) or (ok == worst_ok and err > worst_err):  # the first failure, else the worst
                worst, worst_err = f"seq {b}: {msg}", err
            worst_ok = worst_ok and ok
        record(worst_ok, what, worst)

    # -- the split kernels, policy "raise": every call must run its kernel
    kernels = lib.kernels()
    entries = {}
    for name, specs in lib.info.get("entry_points", {}).items():
        for spec in specs:
            entries.setdefault(spec, []).append(ENTRY_POINTS[name])
    split = [k for k in kernels if k["problem"].get("dv") and not k["problem"].get("kv_dtype")]
    print(f"value dims: {len(split)} kernels built for two head dims: "
          + ("; ".join(vr.spec_of(k["problem"]) for k in split) or "none"))
    if not split:
        failures.append("value dims: the package holds no kernel built for two head dims")
    lib.set_policy("raise" if gpu else "sdpa", 1e9)
    lib.reset_coverage()
    first = {}
    for i, kinfo in enumerate(split):
        p = kinfo["problem"]
        B, H, Hkv, S, Sk, D, Dv, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], p["dv"], bool(p["causal"])
        var = {}  # a split kernel built with variants runs with its tuned ones
        if "window" in p:
            var["window_size"] = tuple(p["window"])
        if p.get("softcap"):
            var["softcap"] = float(p["softcap"])
        if p.get("sinks"):
            var["sinks"] = vr.sink_logits(H, i, device)
        how = entries.get(vr.spec_of(p), [])
        tag = f"k{i}"
        if p.get("varlen"):
            s2 = max(2, (S * 3 // 4) | 1)
            for j, lens_q in enumerate(([0, 1, min(S, 129), S, s2, 7], [S, 1, 63, s2])):
                lens_k = [n + (Sk - S) + (77 if j else 0) for n in lens_q]
                check_varlen(lens_q, lens_k, H, Hkv, D, Dv, causal, 300 + 10 * i + j, tag, var)
            if not causal:  # fewer keys than queries
                check_varlen([300, 5, 257, 40], [40, 5, 1, 3], H, Hkv, D, Dv, causal, 309 + 10 * i, tag, var)
            first.setdefault("varlen", (p, var))
        elif "attention_kvcache" in how and (S <= 16 or p.get("page")):
            for j, page in enumerate(dict.fromkeys([p.get("page") or 16, 16, 0, 256])):
                s_rows = S if j % 2 == 0 else (max(1, S // 2) | 1 if S <= 16 else max(17, (S * 3 // 4) | 1))
                check_kvcache(max(5, min(B, 8)), H, Hkv, s_rows, Sk if j % 2 == 0 else (Sk * 3 // 4) | 1, D, Dv,
                              causal, page, 200 + 10 * i + j, tag, var)
            first.setdefault("kvcache", (p, var))
        if "attention" in how and not p.get("varlen") and not (p.get("page") and S > 16):
            s2 = max(17, (S * 3 // 4) | 1) if S > 16 else S
            shapes = [(B, Hkv, S, Sk, "BHSD"), (2, Hkv, s2, (s2 + 130) if S > 16 else (Sk * 3 // 4) | 1, "BSHD")]
            if S > 16 and H % 4 == 0 and H // 4 != Hkv:
                shapes.append((2, H // 4, s2, s2, "BHSD"))
            for j, (b, hkv, s, sk, layout) in enumerate(shapes):
                check_dense(b, H, hkv, s, sk, D, Dv, causal, layout, 100 + 10 * i + j, tag, var)
            first.setdefault("dense", (p, var))
    for r in lib.coverage():
        if r["kernel"] is None and gpu:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} fell back", r["fallback"])
        elif gpu:
            # coverage's "kernel" is the index in kernel_info's "kernels" (which carry no label)
            ran = kernels[r["kernel"]]["problem"] if 0 <= r["kernel"] < len(kernels) else {}
            ok = r["problem"].get("dv") is not None and r["problem"].get("dv") == ran.get("dv")
            record(ok, f"{r['entry']} {attntune.problem_spec(r)} ran a kernel of its dims", r["label"])

    # -- one head dim at a split kernel's d, and another dv: never a split kernel (raise: they raise)
    if gpu and "dense" in first:
        p, var = first["dense"]
        D, Dv = p["d"], p["dv"]
        q, k = randn(1, p["h"], 64, D, seed=900), randn(1, p["hkv"], 64, D, seed=901)
        built = {(k["problem"]["d"], k["problem"].get("dv", k["problem"]["d"]), bool(k["problem"]["causal"]))
                 for k in kernels}
        for vd in (D, Dv + 16 if Dv + 16 != D else Dv + 32):
            if (D, vd, bool(p["causal"])) in built:
                continue  # a package of one's own may hold kernels for them
            v = randn(1, p["hkv"], 64, vd, seed=902)
            want = f"no tuned kernel for b=1,h={p['h']},hkv={p['hkv']},s=64,sk=64,d={D}" + \
                   (f",dv={vd}" if vd != D else "") + f",causal={int(p['causal'])}"
            try:
                lib.attention(q, k, v, is_causal=bool(p["causal"]), **var)
                torch.cuda.synchronize()
                record(False, f"d={D} dv={vd} under the raise policy", "ran a kernel: expected to raise")
            except RuntimeError as e:
                record(want in str(e), f"d={D} dv={vd} under the raise policy raises, naming dv",
                       str(e).splitlines()[0][:200])

    # -- mismatched shapes are refused on the device too, naming both shapes
    q = randn(1, 4, 8, 64, seed=910)
    for fn, pattern in (
            (lambda: lib.attention(q, randn(1, 2, 8, 64, seed=1), randn(1, 2, 9, 128, seed=2)),
             "v must have k's shape but for its last dim"),
            (lambda: lib.attention(q, randn(1, 2, 8, 32, seed=1), randn(1, 2, 8, 128, seed=2)),
             "q and k must have the same head_dim"),
            (lambda: lib.attention(q, randn(1, 2, 8, 64, seed=1), randn(1, 2, 8, 128, seed=2), out=torch.empty_like(q)),
             "out must have q's shape with v's head dim last"),
            (lambda: lib.attention_kvcache(randn(2, 1, 4, 64, seed=3), randn(6, 16, 2, 64, seed=4),
                                           randn(6, 16, 1, 128, seed=5),
                                           block_table=torch.zeros(2, 2, dtype=torch.int32, device=device)),
             "v_cache must have k_cache's shape but for its last dim"),
            (lambda: lib.attention_varlen(randn(8, 4, 64, seed=6), randn(8, 2, 64, seed=7), randn(7, 2, 128, seed=8),
                                          torch.tensor([0, 8], dtype=torch.int32, device=device),
                                          torch.tensor([0, 8], dtype=torch.int32, device=device), 8, 8),
             "v must have k's shape but for its last dim")):
        try:
            fn()
            record(False, f"refusal: {pattern}", "no error")
        except RuntimeError as e:
            record(pattern in str(e), f"refusal: {pattern}", str(e).splitlines()[0][:160])

    # -- the same dims through the fallback: max_length_ratio 1 sends every call not exactly at a
    # tuned problem to it (SDPA with Dv != D, or the fp32 path with variants)
    lib.set_policy("sdpa", 1.0)
    lib.reset_coverage()
    for name, (p, var) in first.items():
        H, Hkv, D, Dv, causal = p["h"], p["hkv"], p["d"], p["dv"], bool(p["causal"])
        if name == "dense":
            check_dense(2, H, Hkv, 77, 77 + 64, D, Dv, causal, "BSHD", 500, "fallback", var)
            check_dense(2, H, Hkv, 77, 77 + 64, D, Dv, causal, "BHSD", 501, "fallback",
                        dict(window_size=(16, 0) if causal else (16, 8), softcap=30.0))
        elif name == "kvcache":
            check_kvcache(5, H, Hkv, 3 if p["s"] <= 16 else 40, 333, D, Dv, causal, 16, 510, "fallback", var)
        else:
            check_varlen([0, 5, 33], [7, 5, 40], H, Hkv, D, Dv, causal, 520, "fallback", var)
    # Dims no kernel has: (96, 64) and (64, 96), plain (SDPA) and with a variant (fp32).
    for j, (D, Dv) in enumerate(((96, 64), (64, 96))):
        check_dense(2, 8, 2, 100, 150, D, Dv, True, "BHSD" if j else "BSHD", 600 + j, "fallback", {})
        check_dense(2, 8, 2, 100, 60, D, Dv, True, "BHSD", 602 + j, "fallback", dict(window_size=(16, 0)))
    check_kvcache(5, 8, 2, 1, 500, 96, 64, True, 16, 610, "fallback", {})
    check_varlen([0, 1, 17, 64, 33], [3, 1, 17, 80, 20], 8, 2, 96, 64, True, 630, "fallback", {})
    for r in lib.coverage():
        if r["kernel"] is not None:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} ran kernel {r['label']}",
                   "expected the fallback (max_length_ratio 1, or dims no kernel has)")

    # -- torch.compile(fullgraph=True) and a CUDA graph of a split kernel's call and of the fallback's
    if gpu:
        lib.set_policy("sdpa", 1e9)
        cases = []
        if "dense" in first:
            p, var = first["dense"]
            cases.append(("kernel " + vr.spec_of(p), p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], p["dv"],
                          bool(p["causal"]), var))
        cases.append(("fallback d=96 dv=64", 2, 8, 2, 100, 150, 96, 64, True, {}))
        for name, B, H, Hkv, S, Sk, D, Dv, causal, var in cases:
            scale = 1 / math.sqrt(D)

            def inputs(seed):
                return [randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1),
                        randn(B, Hkv, Sk, Dv, seed=seed + 2)]

            def op(q, k, v):
                return lib.attention(q, k, v, is_causal=causal, return_lse=True, **var)

            def ref(q, k, v):
                args = dict(causal=causal, window=tuple(var.get("window_size", (-1, -1))),
                            softcap=var.get("softcap", 0.0), sinks=var.get("sinks"))
                return reference(q, k, v, scale, **args)
            q, k, v = inputs(700)
            torch._dynamo.reset()
            eager = op(q, k, v)
            compiled = torch.compile(lambda *a: tuple(t * 1.0 for t in op(*a)), fullgraph=True)(q, k, v)
            torch.cuda.synchronize()
            (ref64, lse64), lowp = ref(q, k, v)
            ok, msg = vr.compare(compiled[0], compiled[1], ref64, lse64, lowp, dtype)
            ok = ok and compiled[0].shape == (B, H, S, Dv)
            record(ok, f"torch.compile(fullgraph=True) {name}",
                   msg + (", bit-identical to eager" if torch.equal(eager[0], compiled[0])
                          else ", not bit-identical to eager"))
            static = [t.clone() for t in (q, k, v)]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                op(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graph_out = op(*static)
            fresh = inputs(800)
            for dst, src in zip(static, fresh):
                dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            (ref64, lse64), lowp = ref(*fresh)
            ok, msg = vr.compare(graph_out[0], graph_out[1], ref64, lse64, lowp, dtype)
            record(ok, f"CUDA graph (capture, new inputs, replay) {name}", msg)
    return [f"value dims: {f}" for f in failures]


# ------------------------------------------------------------------ the latent-cache phase

# What the latent phase tunes when it is given no package or database (issue 44; docs/design/
# head_dims.md "Latent caches"): DeepSeek-V3's MLA decode over its latent cache (d=576 =
# kv_lora_rank 512 + qk_rope_head_dim 64, V the first 512, one KV head, 16 query heads a GPU at tp=8,
# FlashMLA's pages of 64), one query a sequence and two (multi-token prediction, causal), bf16.
LATENT_PROBLEMS = [
    "b=4,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1",
    "b=4,h=16,hkv=1,s=2,sk=1000,d=576,dv=512,dtype=bf16,causal=1,page=64,latent=1",
]


def latent_package(work):
    """The latent phase's package (tuned_package: $ATTNTUNE_TORCH_LATENT_*, LATENT_PROBLEMS)."""
    return tuned_package(work, "ATTNTUNE_TORCH_LATENT", LATENT_PROBLEMS, "latent", "latent")


def latent_phase(work, device="cuda"):
    """The latent-cache phase (MLA decode, v = k[..., :Dv]; the module's docstring); returns its
    failures. device "cpu" rehearses it without a GPU (ATTNTUNE_TORCH_LATENT_DEVICE=cpu, with a
    package or a database): every call falls back there, so the kernel checks check the fallback,
    and graphs and inductor are left out."""
    print("\n==== latent caches: MLA decode over one cache, v = k[..., :512]")
    gpu = device == "cuda"
    if gpu and torch.cuda.get_device_capability() != (9, 0):
        major, minor = torch.cuda.get_device_capability()
        print(f"  SKIP latent caches: flash_decode_wgmma is sm_90a code (Hopper); this GPU is sm_{major}{minor}")
        return []
    try:
        pkg, notes = latent_package(work)
    except RuntimeError as e:
        print(f"  FAIL {e}")
        return [f"latent: {e}"]
    attntune, lib = load_package(pkg, "attntune_latent", notes)
    import variant_reference as vr  # noqa: E402
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[lib.info["dtype"]]
    failures = []
    gen = torch.Generator(device=device)

    def randn(*shape, seed):
        gen.manual_seed(seed)
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    def record(ok, what, msg):
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<100} {msg}")
        if not ok:
            failures.append(what)

    def call(fn, what):
        """fn()'s result, or None when it raised (under the raise policy a fallback raises)."""
        try:
            r = fn()
            if gpu:
                torch.cuda.synchronize()
            return r if r is not None else True
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return None

    def reference(q, k, Dv, scale, **args):
        """float64 and low-precision attention of q [B, H, S, D] over k [B, Hkv, Sk, D], V its first Dv."""
        v = k[..., :Dv]
        return vr.attention(q, k, v, scale, **args), vr.attention(q, k, v, scale, dtype=dtype, **args)[0]

    def ragged(B, Sk, seed):
        g = torch.Generator().manual_seed(seed)
        return [[Sk, 0, 1, (Sk // 2) | 1, int(torch.randint(1, Sk + 1, (1,), generator=g))][b % 5] for b in range(B)]

    def check_kvcache(B, H, Hkv, S, Sk, D, Dv, causal, page, seed, tag, via):
        """One latent call over a cache of Sk keys at most (pages of `page`, 0: contiguous) through
        mla_decode, or attention_kvcache(..., kv_cache[..., :Dv]) (via "view")."""
        scale = 1 / math.sqrt(D)
        q, k = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1)
        lens = ragged(B, Sk, seed)
        kc, _, table = vr.paged_cache(k, k, lens, page, seed)  # one cache: NaN past each length, shuffled pages
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        qt = q.transpose(1, 2)  # [B, S, H, D]
        out = torch.full((B, S, H, Dv), float("nan"), device=device, dtype=dtype)
        what = (f"{tag} {via} {'page=' + str(page) if page else 'contiguous'} b={B} h={H} hkv={Hkv} s={S} "
                f"sk<={Sk} d={D} dv={Dv} causal={int(causal)}")
        if via == "mla_decode":
            got = call(lambda: lib.mla_decode(qt, kc, table, seqlens, head_dim_v=Dv, is_causal=causal,
                                              return_lse=True, out=out), what)
            if got is None:
                return
            lse = got[1]
        else:
            lse = torch.full((B, H, S), float("nan"), device=device)
            if not call(lambda: lib.ops.attention_kvcache_into(qt, kc, kc[..., :Dv], seqlens, table, out, lse, scale,
                                                               causal, [-1, -1], 0.0, None), what):
                return
        (ref64, lse64), lowp = reference(q, k, Dv, scale, causal=causal, len_k=lens)
        ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, dtype)
        record(ok, what, msg)

    def check_dense(B, H, Hkv, S, Sk, D, Dv, causal, seed, tag):
        """The dense entry over a latent cache: k [B, Hkv, Sk, D], v = k[..., :Dv]."""
        scale = 1 / math.sqrt(D)
        q, k = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1)
        out = torch.full((B, H, S, Dv), float("nan"), device=device, dtype=dtype)
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = f"{tag} dense view b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} dv={Dv} causal={int(causal)}"
        if not call(lambda: lib.ops.attention_into(q, k, k[..., :Dv], out, lse, scale, causal, [-1, -1], 0.0, None),
                    what):
            return
        (ref64, lse64), lowp = reference(q, k, Dv, scale, causal=causal)
        ok, msg = vr.compare(out, lse, ref64, lse64, lowp, dtype)
        record(ok, what, msg)

    # -- the latent kernels, policy "raise": every call must run one
    kernels = lib.kernels()
    entries = {}
    for name, specs in lib.info.get("entry_points", {}).items():
        for spec in specs:
            entries.setdefault(spec, []).append(ENTRY_POINTS[name])
    latent = [k for k in kernels if k["problem"].get("latent") and not k["problem"].get("kv_dtype")]
    print(f"latent: {len(latent)} kernels built for a latent cache: "
          + ("; ".join(vr.spec_of(k["problem"]) for k in latent) or "none"))
    if not latent:
        failures.append("latent: the package holds no kernel built for a latent cache")
    lib.set_policy("raise" if gpu else "sdpa", 1e9)
    lib.reset_coverage()
    first = None
    for i, kinfo in enumerate(latent):
        p = kinfo["problem"]
        B, H, Hkv, S, Sk, D, Dv, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], p["dv"], bool(p["causal"])
        page = p.get("page") or 64
        how = entries.get(vr.spec_of(p), [])
        tag = f"k{i}"
        first = first or p
        if "attention_kvcache" in how:
            odd = (Sk * 3 // 4) | 1
            for j, (b, sk, pg, via) in enumerate(((B, Sk, page, "mla_decode"), (max(5, B), odd, page, "view"),
                                                  (max(5, B), odd, 16, "mla_decode"), (B, Sk, 0, "mla_decode"),
                                                  (3, 5000, page, "view"))):
                check_kvcache(b, H, Hkv, S, sk, D, Dv, causal, pg, 100 + 10 * i + j, tag, via)
        if "attention" in how:
            check_dense(B, H, Hkv, S, Sk, D, Dv, causal, 200 + 10 * i, tag)
            check_dense(2, H, Hkv, S, (Sk * 3 // 4) | 1, D, Dv, causal, 201 + 10 * i, tag)
        # explain: the latent kernel for the latent call, another (or none) for the same sizes over
        # separate K and V.
        got = lib.explain("attention_kvcache", lib.info["dtype"], D, causal, B, H, Hkv, S, Sk, head_dim_v=Dv,
                          latent=True)
        plain = lib.explain("attention_kvcache", lib.info["dtype"], D, causal, B, H, Hkv, S, Sk, head_dim_v=Dv)
        ok = got[0] >= 0 and kernels[got[0]]["problem"].get("latent") and (
            plain[0] < 0 or not kernels[plain[0]]["problem"].get("latent"))
        record(bool(ok), f"{tag} explain: latent=True names a latent kernel, latent=False none",
               f"{got} / {plain}")
    for r in lib.coverage():
        if r["kernel"] is None and gpu:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} fell back", r["fallback"])
        elif gpu:
            k = kernels[r["kernel"]]
            ok = r["problem"].get("latent") == 1 and bool(k["problem"].get("latent")) and r["label"].endswith(" latent")
            record(ok, f"{r['entry']} {attntune.problem_spec(r)} ran a latent kernel", r["label"])

    # -- the same dims over separate K and V: the latent kernels refuse them (raise: they raise)
    if gpu and first is not None:
        built = {(k["problem"]["d"], k["problem"].get("dv"), bool(k["problem"]["causal"])) for k in kernels
                 if not k["problem"].get("latent")}
        p = first
        if (p["d"], p["dv"], bool(p["causal"])) not in built:  # a package of one's own may hold one
            q, kc = randn(2, p["s"], p["h"], p["d"], seed=900), randn(2, 64, p["hkv"], p["d"], seed=901)
            vc = randn(2, 64, p["hkv"], p["dv"], seed=902)
            want = f"no tuned kernel for b=2,h={p['h']},hkv={p['hkv']},s={p['s']},sk=64,d={p['d']},dv={p['dv']}," \
                   f"causal={int(p['causal'])}:"
            try:
                lib.attention_kvcache(q, kc, vc, is_causal=bool(p["causal"]))
                torch.cuda.synchronize()
                record(False, "separate K and V under the raise policy", "ran a kernel: expected to raise")
            except RuntimeError as e:
                record(want in str(e), "separate K and V under the raise policy raises, naming the problem",
                       str(e).splitlines()[0][:200])

    # -- the fallback over the view: max_length_ratio 1 sends every call not exactly at a tuned
    # problem to SDPA (V a strided view of the gathered cache)
    if first is not None:
        lib.set_policy("sdpa", 1.0)
        lib.reset_coverage()
        p = first
        check_kvcache(5, p["h"], p["hkv"], p["s"], 333, p["d"], p["dv"], bool(p["causal"]), 64, 500, "fallback",
                      "mla_decode")
        check_kvcache(5, p["h"], p["hkv"], 2, 200, p["d"], p["dv"], True, 0, 501, "fallback", "view")
        check_dense(2, p["h"], p["hkv"], 3, 150, p["d"], p["dv"], True, 502, "fallback")
        for r in lib.coverage():
            if r["kernel"] is not None:
                record(False, f"{r['entry']} {attntune.problem_spec(r)} ran kernel {r['label']}",
                       "expected the fallback (max_length_ratio 1)")

    # -- torch.compile(fullgraph=True) and a CUDA graph of mla_decode
    if gpu and first is not None:
        lib.set_policy("raise", 1e9)
        p = first
        B, H, Hkv, S, Sk, D, Dv, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], p["dv"], bool(p["causal"])
        page = p.get("page") or 64
        scale = 1 / math.sqrt(D)
        lens = ragged(B, Sk, 700)

        def inputs(seed):
            q, k = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1)
            kc, _, table = vr.paged_cache(k, k, lens, page, 700)  # one table for every input
            return q, k, q.transpose(1, 2).contiguous(), kc, table

        def op(qt, kc, table, seqlens):
            return lib.mla_decode(qt, kc, table, seqlens, head_dim_v=Dv, is_causal=causal, return_lse=True)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        q, k, qt, kc, table = inputs(710)
        (ref64, lse64), lowp = reference(q, k, Dv, scale, causal=causal, len_k=lens)
        try:
            torch._dynamo.reset()
            eager = op(qt, kc, table, seqlens)
            compiled = torch.compile(lambda *a: tuple(t * 1.0 for t in op(*a)), fullgraph=True)(qt, kc, table, seqlens)
            torch.cuda.synchronize()
            ok, msg = vr.compare(compiled[0].transpose(1, 2), compiled[1], ref64, lse64, lowp, dtype)
            record(ok and compiled[0].shape == (B, S, H, Dv), "torch.compile(fullgraph=True) mla_decode",
                   msg + (", bit-identical to eager" if torch.equal(eager[0], compiled[0])
                          else ", not bit-identical to eager"))
        except RuntimeError as e:
            record(False, "torch.compile(fullgraph=True) mla_decode", str(e).splitlines()[0][:300])
        try:
            static = [qt.clone(), kc.clone()]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                op(static[0], static[1], table, seqlens)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graph_out = op(static[0], static[1], table, seqlens)
            q2, k2, qt2, kc2, _ = inputs(810)
            static[0].copy_(qt2)
            static[1].copy_(kc2)
            graph.replay()
            torch.cuda.synchronize()
            (ref64, lse64), lowp = reference(q2, k2, Dv, scale, causal=causal, len_k=lens)
            ok, msg = vr.compare(graph_out[0].transpose(1, 2), graph_out[1], ref64, lse64, lowp, dtype)
            record(ok, "CUDA graph (capture, new inputs, replay) mla_decode", msg)
        except RuntimeError as e:
            record(False, "CUDA graph (capture, new inputs, replay) mla_decode", str(e).splitlines()[0][:300])
    return [f"latent: {f}" for f in failures]


# ------------------------------------------------------------------ the FP8-cache phase

# What the FP8 phase tunes when it is given no package or database (issue 42): decode over an FP8 e4m3
# cache with q bf16, which flash_decode tunes: paged (a Llama-3-8B-like layer, 32/8 heads, pages of
# 16), one query a sequence and two (speculative decoding, causal), and a contiguous cache through the
# dense entry at d=64.
FP8_PROBLEMS = [
    "b=4,h=32,hkv=8,s=1,sk=2048,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8",
    "b=4,h=32,hkv=8,s=2,sk=2048,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8",
    "b=2,h=8,hkv=2,s=1,sk=4096,d=64,dtype=bf16,causal=0,kv_dtype=fp8",
]
# And on Hopper, chunked prefill over an FP8 cache (flash_fwd_wgmma; 64 queries of 4 heads a KV head:
# two query tiles, so the call converts the cache into its workspace first, then reads the copy).
FP8_PROBLEMS_SM90 = [
    "b=2,h=8,hkv=2,s=64,sk=1024,d=128,dtype=bf16,causal=1,page=16,kv_dtype=fp8",
]


def fp8_package(work):
    """The FP8 phase's package (tuned_package: $ATTNTUNE_TORCH_FP8_*, FP8_PROBLEMS, and
    FP8_PROBLEMS_SM90 on sm_90 and newer)."""
    problems = FP8_PROBLEMS
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
        problems = problems + FP8_PROBLEMS_SM90
    return tuned_package(work, "ATTNTUNE_TORCH_FP8", problems, "fp8", "fp8")


def fp8_phase(work, device="cuda"):
    """The FP8-cache phase (k and v float8_e4m3fn with FlashAttention-3's scales; the module's
    docstring); returns its failures. device "cpu" rehearses it without a GPU
    (ATTNTUNE_TORCH_FP8_DEVICE=cpu, with a package or a database): every call falls back there, so
    the kernel checks check the fallback, and graphs and inductor are left out."""
    print("\n==== FP8 KV caches: float8_e4m3fn k and v, k_descale / v_descale")
    gpu = device == "cuda"
    if gpu and torch.cuda.get_device_capability() < (8, 9):
        major, minor = torch.cuda.get_device_capability()
        print(f"  SKIP FP8 caches: the kernels convert e4m3 on sm_89 and newer; this GPU is sm_{major}{minor}")
        return []
    try:
        pkg, notes = fp8_package(work)
    except RuntimeError as e:
        print(f"  FAIL {e}")
        return [f"fp8: {e}"]
    attntune, lib = load_package(pkg, "attntune_fp8", notes)
    import variant_reference as vr  # noqa: E402
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[lib.info["dtype"]]
    fp8 = torch.float8_e4m3fn
    failures = []
    gen = torch.Generator(device=device)

    def randn(*shape, seed):
        gen.manual_seed(seed)
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    def cache_values(*shape, seed):
        """Random e4m3 values (float8_e4m3fn) on the device: normals times 2, rounded to e4m3."""
        gen.manual_seed(seed)
        return (torch.randn(*shape, device=device, generator=gen) * 2).to(fp8)

    def scales(kind, B, Hkv, seed):
        """(k_descale, v_descale) of a kind: "per_head" [B, Hkv] contiguous, "strided" [B, Hkv] as a
        transposed [Hkv, B], "one" [1] and 0-d, None."""
        g = torch.Generator().manual_seed(seed)
        if kind is None:
            return None, None
        if kind == "one":
            return (torch.tensor([0.05 + 1.5 * float(torch.rand((), generator=g))], device=device),
                    torch.tensor(0.05 + 1.5 * float(torch.rand((), generator=g)), device=device))
        k, v = (torch.rand(B, Hkv, generator=g) * 2 + 0.01, torch.rand(B, Hkv, generator=g) * 0.5 + 0.01)
        if kind == "strided":
            k, v = k.t().contiguous().t(), v.t().contiguous().t()
        return k.to(device), v.to(device)

    def record(ok, what, msg):
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<100} {msg}")
        if not ok:
            failures.append(what)

    def call(fn, what):
        """fn()'s result, or None when it raised (under the raise policy a fallback raises)."""
        try:
            r = fn()
            if gpu:
                torch.cuda.synchronize()
            return r if r is not None else True
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return None

    def reference(q, k, v, kd, vd, scale, **args):
        """float64 and low-precision attention of q [B, H, S, D] over the dequantised caches k, v
        [B, Hkv, Sk, D] (float8_e4m3fn) times their scales per (sequence, KV head)."""
        kq = vr.dequantised(k.transpose(1, 2), kd).transpose(1, 2)
        vq = vr.dequantised(v.transpose(1, 2), vd).transpose(1, 2)
        return vr.attention(q, kq, vq, scale, **args), vr.attention(q, kq, vq, scale, dtype=dtype, **args)[0]

    def ragged(B, Sk, seed):
        g = torch.Generator().manual_seed(seed)
        return [[Sk, 0, 1, (Sk // 2) | 1, int(torch.randint(1, Sk + 1, (1,), generator=g))][b % 5] for b in range(B)]

    def check_kvcache(B, H, Hkv, S, Sk, D, causal, page, kind, seed, tag):
        """One call over an FP8 cache of Sk keys at most (pages of `page`, 0: contiguous), ragged
        lengths with NaN bytes past each, scales of `kind`."""
        scale = 1 / math.sqrt(D)
        q = randn(B, H, S, D, seed=seed)
        k, v = cache_values(B, Hkv, Sk, D, seed=seed + 1), cache_values(B, Hkv, Sk, D, seed=seed + 2)
        kd, vd = scales(kind, B, Hkv, seed)
        lens = ragged(B, Sk, seed)
        # The pages on the host (the same bytes; NaN past each length), then on the device.
        kc, vc, table = vr.paged_cache(k.cpu(), v.cpu(), lens, page, seed)
        kc, vc = kc.to(device), vc.to(device)
        table = table.to(device) if table is not None else None
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        qt = q.transpose(1, 2)  # [B, S, H, D]
        out = torch.full((B, S, H, D), float("nan"), device=device, dtype=dtype)
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = (f"{tag} kvcache {'page=' + str(page) if page else 'contiguous'} b={B} h={H} hkv={Hkv} s={S} "
                f"sk<={Sk} d={D} causal={int(causal)} scales={kind}")
        if not call(lambda: lib.ops.attention_kvcache_into(qt, kc, vc, seqlens, table, out, lse, scale, causal,
                                                           [-1, -1], 0.0, None, kd, vd), what):
            return
        (ref64, lse64), lowp = reference(q, k, v, kd, vd, scale, causal=causal, len_k=lens)
        ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, dtype)
        record(ok, what, msg)

    def check_dense(B, H, Hkv, S, Sk, D, causal, layout, kind, seed, tag):
        """The dense entry over an FP8 cache: k, v [B, Hkv, Sk, D] (layout "bshd": [B, Sk, Hkv, D] storage)."""
        scale = 1 / math.sqrt(D)
        q = randn(B, H, S, D, seed=seed)
        if layout == "bshd":
            k = cache_values(B, Sk, Hkv, D, seed=seed + 1).transpose(1, 2)
            v = cache_values(B, Sk, Hkv, D, seed=seed + 2).transpose(1, 2)
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
        else:
            k, v = cache_values(B, Hkv, Sk, D, seed=seed + 1), cache_values(B, Hkv, Sk, D, seed=seed + 2)
        kd, vd = scales(kind, B, Hkv, seed)
        out = torch.full((B, H, S, D), float("nan"), device=device, dtype=dtype)
        if layout == "bshd":
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        lse = torch.full((B, H, S), float("nan"), device=device)
        what = f"{tag} dense {layout} b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} causal={int(causal)} scales={kind}"
        if not call(lambda: lib.ops.attention_into(q, k, v, out, lse, scale, causal, [-1, -1], 0.0, None, kd, vd),
                    what):
            return
        (ref64, lse64), lowp = reference(q, k, v, kd, vd, scale, causal=causal)
        ok, msg = vr.compare(out, lse, ref64, lse64, lowp, dtype)
        record(ok, what, msg)

    # -- the FP8 kernels, policy "raise": every call must run one
    kernels = lib.kernels()
    entries = {}
    for name, specs in lib.info.get("entry_points", {}).items():
        for spec in specs:
            entries.setdefault(spec, []).append(ENTRY_POINTS[name])
    # Kernels of one head dim without variants (an FP8 kernel with variants, two head dims or a latent
    # cache would be refused these calls: not checked here yet).
    fp8_kernels = [k for k in kernels if k["problem"].get("kv_dtype") == "fp8" and not k.get("variants")
                   and not k["problem"].get("dv") and not k["problem"].get("latent")]
    print(f"fp8: {len(fp8_kernels)} kernels built for an FP8 cache: "
          + ("; ".join(vr.spec_of(k["problem"]) for k in fp8_kernels) or "none"))
    if not fp8_kernels:
        failures.append("fp8: the package holds no kernel built for an FP8 cache")
    lib.set_policy("raise" if gpu else "sdpa", 1e9)
    lib.reset_coverage()
    first = None
    kinds = ("per_head", "strided", "one", None)
    for i, kinfo in enumerate(fp8_kernels):
        p = kinfo["problem"]
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        page = p.get("page") or 0
        how = entries.get(vr.spec_of(p), [])
        tag = f"k{i}"
        first = first or p
        odd = (Sk * 3 // 4) | 1
        if "attention_kvcache" in how:
            for j, (b, sk, pg, kind) in enumerate(((B, Sk, page or 16, "per_head"), (max(5, B), odd, page or 16, "strided"),
                                                   (max(5, B), odd, 16, "one"), (B, Sk, 0, "per_head"),
                                                   (3, 5000, page or 64, None))):
                check_kvcache(b, H, Hkv, S, sk, D, causal, pg, kind, 100 + 10 * i + j, tag)
        if "attention" in how:
            for j, (b, sk, layout) in enumerate(((B, Sk, "bhsd"), (3, odd, "bshd"))):
                check_dense(b, H, Hkv, S, sk, D, causal, layout, kinds[j % len(kinds)], 200 + 10 * i + j, tag)
        # explain: the FP8 kernel for the FP8 call, another (or none) for the same sizes over a bf16 cache.
        entry = "attention_kvcache" if "attention_kvcache" in how else "attention"
        got = lib.explain(entry, lib.info["dtype"], D, causal, B, H, Hkv, S, Sk, kv_dtype="fp8")
        plain = lib.explain(entry, lib.info["dtype"], D, causal, B, H, Hkv, S, Sk)
        ok = got[0] >= 0 and kernels[got[0]]["problem"].get("kv_dtype") == "fp8" and (
            plain[0] < 0 or kernels[plain[0]]["problem"].get("kv_dtype") != "fp8")
        record(bool(ok), f"{tag} explain: kv_dtype='fp8' names an FP8 kernel, a 16-bit cache none", f"{got} / {plain}")
    for r in lib.coverage():
        if r["kernel"] is None and gpu:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} fell back", r["fallback"])
        elif gpu:
            k = kernels[r["kernel"]]
            ok = r["problem"].get("kv_dtype") == "fp8" and k["problem"].get("kv_dtype") == "fp8" and \
                r["label"].endswith(" kv_dtype=fp8")
            record(ok, f"{r['entry']} {attntune.problem_spec(r)} ran an FP8 kernel", r["label"])

    # -- the same shape over a bf16 cache: an FP8 kernel never serves it (raise: it raises)
    if gpu and first is not None:
        p = first
        built = {(k["problem"]["d"], bool(k["problem"]["causal"])) for k in kernels
                 if k["problem"].get("kv_dtype") != "fp8" and not k["problem"].get("dv")}
        if (p["d"], bool(p["causal"])) not in built:  # a package of one's own may hold one
            q = randn(2, p["s"], p["h"], p["d"], seed=900)
            kc, vc = randn(2, 64, p["hkv"], p["d"], seed=901), randn(2, 64, p["hkv"], p["d"], seed=902)
            want = f"no tuned kernel for b=2,h={p['h']},hkv={p['hkv']},s={p['s']},sk=64,d={p['d']}," \
                   f"causal={int(p['causal'])}:"
            try:
                lib.attention_kvcache(q, kc, vc, is_causal=bool(p["causal"]))
                torch.cuda.synchronize()
                record(False, "a bf16 cache under the raise policy", "ran a kernel: expected to raise")
            except RuntimeError as e:
                record(want in str(e), "a bf16 cache under the raise policy raises, naming the problem",
                       str(e).splitlines()[0][:200])

    # -- the fallback: max_length_ratio 1 sends every call not exactly at a tuned problem to it (the
    # cache dequantised through the fp32 path); head_dim 96 has no kernel at all
    lib.set_policy("sdpa", 1.0)
    lib.reset_coverage()
    p = first or {"h": 8, "hkv": 2, "s": 1, "d": 128, "causal": 0}
    check_kvcache(5, p["h"], p["hkv"], p["s"], 333, p["d"], bool(p["causal"]), 16, "per_head", 500, "fallback")
    check_kvcache(5, p["h"], p["hkv"], 2, 200, p["d"], True, 0, "one", 501, "fallback")
    check_dense(2, p["h"], p["hkv"], 3, 150, p["d"], True, "bshd", "strided", 502, "fallback")
    check_kvcache(3, 8, 2, 1, 300, 96, False, 16, "per_head", 503, "fallback d=96")
    check_dense(2, 8, 2, 1, 170, 96, False, "bhsd", None, 504, "fallback d=96")
    for r in lib.coverage():
        if r["kernel"] is not None:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} ran kernel {r['label']}",
                   "expected the fallback (max_length_ratio 1)")

    # -- torch.compile(fullgraph=True) of a kernel's call; CUDA graphs of it and of the fallback, with
    # new cache bytes and new scales copied into the captured tensors
    if gpu:
        graphs = [("fallback", 1.0, {"b": 3, "h": 8, "hkv": 2, "s": 1, "sk": 300, "d": 96, "causal": 0})]
        if first is not None:
            graphs.insert(0, ("kernel", 1e9, first))
        for name, ratio, p in graphs:
            lib.set_policy("raise" if name == "kernel" else "sdpa", ratio)
            B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
            page = p.get("page") or 16
            scale = 1 / math.sqrt(D)
            lens = ragged(B, Sk, 700)

            def inputs(seed):
                q = randn(B, H, S, D, seed=seed)
                k, v = cache_values(B, Hkv, Sk, D, seed=seed + 1), cache_values(B, Hkv, Sk, D, seed=seed + 2)
                kc, vc, table = vr.paged_cache(k.cpu(), v.cpu(), lens, page, 700)  # one table for every input
                kd, vd = scales("per_head", B, Hkv, seed)
                return q, k, v, kd, vd, q.transpose(1, 2).contiguous(), kc.to(device), vc.to(device), table.to(device)

            def op(qt, kc, vc, table, seqlens, kd, vd):
                return lib.attention_kvcache(qt, kc, vc, cache_seqlens=seqlens, block_table=table, is_causal=causal,
                                             return_lse=True, k_descale=kd, v_descale=vd)
            seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
            q, k, v, kd, vd, qt, kc, vc, table = inputs(710)
            (ref64, lse64), lowp = reference(q, k, v, kd, vd, scale, causal=causal, len_k=lens)
            if name == "kernel":
                try:
                    torch._dynamo.reset()
                    eager = op(qt, kc, vc, table, seqlens, kd, vd)
                    compiled = torch.compile(lambda *a: tuple(t * 1.0 for t in op(*a)), fullgraph=True)(
                        qt, kc, vc, table, seqlens, kd, vd)
                    torch.cuda.synchronize()
                    ok, msg = vr.compare(compiled[0].transpose(1, 2), compiled[1], ref64, lse64, lowp, dtype)
                    record(ok and compiled[0].shape == (B, S, H, D), "torch.compile(fullgraph=True) fp8 kvcache",
                           msg + (", bit-identical to eager" if torch.equal(eager[0], compiled[0])
                                  else ", not bit-identical to eager"))
                except RuntimeError as e:
                    record(False, "torch.compile(fullgraph=True) fp8 kvcache", str(e).splitlines()[0][:300])
            try:
                static = [qt.clone(), kc.clone(), vc.clone(), kd.clone(), vd.clone()]
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    op(static[0], static[1], static[2], table, seqlens, static[3], static[4])
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    graph_out = op(static[0], static[1], static[2], table, seqlens, static[3], static[4])
                q2, k2, v2, kd2, vd2, qt2, kc2, vc2, _ = inputs(810)
                for dst, src in zip(static, (qt2, kc2, vc2, kd2, vd2)):
                    dst.copy_(src)
                graph.replay()
                torch.cuda.synchronize()
                (ref64, lse64), lowp = reference(q2, k2, v2, kd2, vd2, scale, causal=causal, len_k=lens)
                ok, msg = vr.compare(graph_out[0].transpose(1, 2), graph_out[1], ref64, lse64, lowp, dtype)
                record(ok, f"CUDA graph (capture, new cache and scales, replay) fp8 {name}", msg)
            except RuntimeError as e:
                record(False, f"CUDA graph (capture, new cache and scales, replay) fp8 {name}",
                       str(e).splitlines()[0][:300])
    return [f"fp8: {f}" for f in failures]


# ------------------------------------------------------------------ the FP8-forward phase

# What the FP8-forward phase tunes when it is given no package or database: flash_fwd_wgmma's dtype=fp8
# (sm_90a), GQA causal at d=128 and MHA non-causal at d=64.
FP8_FWD_PROBLEMS = [
    "b=1,h=8,hkv=2,s=1024,sk=1024,d=128,dtype=fp8,causal=1",
    "b=2,h=4,hkv=4,s=512,sk=768,d=64,dtype=fp8,causal=0",
]


def fp8_forward_reference(q, k, v, qd, kd, vd, scale, causal):
    """(out64, lse64, out_lowp, lse_lowp) of the FP8 forward over the dequantised q, k, v [B, H|Hkv, S|Sk, D]
    (float8_e4m3fn; scales [B, Hkv], one, or None; query head h takes KV head h / G's): float64, and the
    baseline of the tuner's criterion (scores rounded to bf16, 2^8 P rounded to e4m3 over the exact sum,
    out rounded to bf16; reference.cu's attn_reference_qkv_fp8 with lowp), bottom-right causal."""
    import variant_reference as vr  # noqa: E402
    S, Sk = q.shape[2], k.shape[2]
    G = q.shape[1] // k.shape[1]

    def deq(t, d, group=1):  # [B, heads, S, D]: vr.dequantised's heads second to last
        return vr.dequantised(t.transpose(1, 2), d, group).transpose(1, 2)
    qf, kf, vf = deq(q, qd, G), deq(k, kd).repeat_interleave(G, 1), deq(v, vd).repeat_interleave(G, 1)
    s = qf @ kf.transpose(-2, -1) * scale
    if causal:
        mask = torch.arange(Sk, device=q.device)[None, :] > torch.arange(S, device=q.device)[:, None] + (Sk - S)
        s = s.masked_fill(mask, float("-inf"))
    out, lse = [], []
    for lowp in (False, True):
        x = s.to(torch.bfloat16).double() if lowp else s
        m = x.amax(-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        e = torch.exp(x - m)
        l = e.sum(-1, keepdim=True)
        p = ((e * 256).float().to(torch.float8_e4m3fn).double() / 256) if lowp else e
        o = torch.where(l > 0, (p @ vf) / l, torch.zeros((), dtype=torch.float64, device=q.device))
        out.append(o.to(torch.bfloat16).double() if lowp else o)
        lse.append((torch.log(l) + m).squeeze(-1))
    return out[0], lse[0], out[1], lse[1]


def fp8_forward_phase(work):
    """The FP8-forward phase (the module's docstring); returns its failures."""
    print("\n==== the FP8 forward: float8_e4m3fn q, k and v, q_descale / k_descale / v_descale, out bf16")
    if torch.cuda.get_device_capability() < (9, 0):
        major, minor = torch.cuda.get_device_capability()
        print(f"  SKIP the FP8 forward: flash_fwd_wgmma is sm_90a's; this GPU is sm_{major}{minor}")
        return []
    try:
        pkg, notes = tuned_package(work, "ATTNTUNE_TORCH_FP8FWD", FP8_FWD_PROBLEMS, "fp8 forward", "fp8fwd")
    except RuntimeError as e:
        print(f"  FAIL {e}")
        return [f"fp8 forward: {e}"]
    attntune, lib = load_package(pkg, "attntune_fp8fwd", notes)
    import variant_reference as vr  # noqa: E402
    fp8, dev = torch.float8_e4m3fn, "cuda"
    failures = []
    gen = torch.Generator(device=dev)

    def record(ok, what, msg):
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<100} {msg}")
        if not ok:
            failures.append(what)

    def values(*shape, seed, scale=1.0):
        gen.manual_seed(seed)
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(fp8)

    def bytes_of(t):
        return t.view(torch.uint8)  # float8 moved as bytes (no float8 kernels needed for copies)

    def contig(t):
        return bytes_of(t).contiguous().view(fp8)

    def scales(kind, B, Hkv, seed):
        g = torch.Generator().manual_seed(seed)
        if kind is None:
            return None, None, None
        if kind == "one":
            return tuple(torch.tensor(0.25 + 1.5 * float(torch.rand((), generator=g)), device=dev) for _ in range(3))
        return tuple((torch.rand(B, Hkv, generator=g) * 1.75 + 0.25).to(dev) for _ in range(3))

    def check(B, H, Hkv, S, Sk, D, causal, v_form, kind, seed, tag):
        scale = 1 / math.sqrt(D)
        q, k, v = values(B, H, S, D, seed=seed), values(B, Hkv, Sk, D, seed=seed + 1), values(B, Hkv, Sk, D, seed=seed + 2)
        qd, kd, vd = scales(kind, B, Hkv, seed)
        vt = None
        if v_form == "transposed":  # storage [B, Hkv, D, Sk padded to 16], read in place
            vt = torch.full((B, Hkv, D, (Sk + 15) // 16 * 16), float("nan"), device=dev).to(fp8)
            bytes_of(vt)[..., :Sk] = bytes_of(v).transpose(2, 3)
            v_arg = vt[..., :Sk].transpose(2, 3)
        else:
            v_arg = v
        what = f"{tag} b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} causal={int(causal)} v={v_form} scales={kind}"
        try:
            if v_form == "bshd":
                out, lse = lib.attention(contig(q.transpose(1, 2)), contig(k.transpose(1, 2)),
                                         contig(v.transpose(1, 2)), is_causal=causal, layout="bshd",
                                         return_lse=True, q_descale=qd, k_descale=kd, v_descale=vd)
                out = out.transpose(1, 2)
            else:
                out = torch.full((B, H, S, D), float("nan"), device=dev, dtype=torch.bfloat16)
                lse = torch.full((B, H, S), float("nan"), device=dev)
                lib.ops.attention_into(q, k, v_arg, out, lse, scale, causal, [-1, -1], 0.0, None, kd, vd, qd)
            torch.cuda.synchronize()
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return
        ref, lse64, lowp, lse_lowp = fp8_forward_reference(q, k, v, qd, kd, vd, scale, causal)
        lse_bound = 2 * (lse_lowp - lse64)[torch.isfinite(lse64)].abs().max().item() + 1e-3
        ok, msg = vr.compare(out, lse, ref, lse64, lowp, torch.bfloat16, lse_atol=lse_bound)
        record(ok and out.dtype == torch.bfloat16, what, msg + f" (lse bound {lse_bound:.1e})")

    kernels = lib.kernels()
    fwd = [k for k in kernels if k["problem"]["dtype"] == "fp8"]
    print(f"fp8 forward: {len(fwd)} kernels: " + ("; ".join(vr.spec_of(k["problem"]) for k in fwd) or "none"))
    if not fwd:
        failures.append("fp8 forward: the package holds no dtype=fp8 kernel")
    lib.set_policy("raise", 1e9)
    lib.reset_coverage()
    for i, kinfo in enumerate(fwd):
        p = kinfo["problem"]
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        tag = f"k{i}"
        for j, (b, s, sk, form, kind) in enumerate(((B, S, Sk, "contiguous", "per_head"),
                                                    (B, S, Sk, "transposed", "one"),
                                                    (3, (S // 2) | 1, (Sk * 3 // 4) | 1, "contiguous", None),
                                                    (2, 77, (Sk // 2) | 1, "transposed", "per_head"),
                                                    (2, 129, 257, "bshd", "per_head"))):
            check(b, H, Hkv, s, sk, D, causal, form, kind, 300 + 10 * i + j, tag)
        got = lib.explain("attention", "fp8", D, causal, B, H, Hkv, S, Sk)
        plain = lib.explain("attention", "bf16", D, causal, B, H, Hkv, S, Sk)
        ok = got[0] >= 0 and kernels[got[0]]["problem"]["dtype"] == "fp8" and (
            plain[0] < 0 or kernels[plain[0]]["problem"]["dtype"] != "fp8")
        record(bool(ok), f"{tag} explain: dtype 'fp8' names the FP8-forward kernel, 'bf16' does not", f"{got} / {plain}")
    for r in lib.coverage():
        if r["kernel"] is None:
            record(False, f"{r['entry']} {attntune.problem_spec(r)} fell back", r["fallback"])
        else:
            ok = r["dtype"] == "fp8" and kernels[r["kernel"]]["problem"]["dtype"] == "fp8"
            record(ok, f"{r['entry']} {attntune.problem_spec(r)} ran an FP8-forward kernel", r["label"])

    # -- a captured CUDA graph (v contiguous: the transposed copy is captured too), replayed on new inputs
    if fwd:
        p = fwd[0]["problem"]
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        scale = 1 / math.sqrt(D)
        q, k, v = values(B, H, S, D, seed=800), values(B, Hkv, Sk, D, seed=801), values(B, Hkv, Sk, D, seed=802)
        qd, kd, vd = scales("per_head", B, Hkv, 800)
        try:
            lib.attention(q, k, v, is_causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)  # warm-up
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out, lse = lib.attention(q, k, v, is_causal=causal, return_lse=True, q_descale=qd, k_descale=kd,
                                         v_descale=vd)
            q2, k2, v2 = values(B, H, S, D, seed=810), values(B, Hkv, Sk, D, seed=811), values(B, Hkv, Sk, D, seed=812)
            qd2, kd2, vd2 = scales("per_head", B, Hkv, 810)
            for dst, src in ((q, q2), (k, k2), (v, v2)):
                bytes_of(dst).copy_(bytes_of(src))
            for dst, src in ((qd, qd2), (kd, kd2), (vd, vd2)):
                dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            ref, lse64, lowp, lse_lowp = fp8_forward_reference(q2, k2, v2, qd2, kd2, vd2, scale, causal)
            lse_bound = 2 * (lse_lowp - lse64)[torch.isfinite(lse64)].abs().max().item() + 1e-3
            ok, msg = vr.compare(out, lse, ref, lse64, lowp, torch.bfloat16, lse_atol=lse_bound)
            record(ok, "CUDA graph of an FP8-forward call (v's transposed copy inside), replayed on new inputs", msg)
        except RuntimeError as e:
            record(False, "CUDA graph of an FP8-forward call", str(e).splitlines()[0][:300])
    return failures


# ------------------------------------------------------------------ the backward phase

# What the backward phase tunes when it is given no package or database (issue 45): the backward
# families' problems (pass=bwd) at d=64 and 128, causal and not, GQA, a causal window, a causal window
# with learnable sinks (the kernel gives dq, dk, dv; the op adds the sinks' gradient), a soft-cap, and
# Gemma 2's local layer at its head dim 256 (a causal window with a soft-cap), in bf16 and fp16
# (one package each), and the forward of two of them, so that a training step runs kernels both ways;
# and packed varlen batches' backward (varlen=N,pass=bwd: attention_varlen's autograd,
# attention_backward_varlen), GQA causal at d=128 (with its forward) and a causal window with sinks at d=64.
BWD_SHAPES = [
    "b=2,h=8,hkv=8,s=1024,sk=1024,d=128,dtype={dt},causal=0,pass=bwd",
    "b=2,h=8,hkv=2,s=1024,sk=1024,d=128,dtype={dt},causal=1,pass=bwd",
    "b=2,h=8,hkv=8,s=1024,sk=1024,d=64,dtype={dt},causal=1,pass=bwd",
    "b=2,h=8,hkv=2,s=1024,sk=1024,d=64,dtype={dt},causal=0,pass=bwd",
    "b=1,h=8,hkv=4,s=1024,sk=1024,d=64,dtype={dt},causal=1,window=255,pass=bwd",
    "b=2,h=8,hkv=2,s=1024,sk=1024,d=64,dtype={dt},causal=1,window=127,sinks=1,pass=bwd",  # gpt-oss-like
    "b=1,h=8,hkv=4,s=1024,sk=1024,d=128,dtype={dt},causal=1,softcap=50,pass=bwd",         # Gemma-2-like
    "b=1,h=8,hkv=4,s=1024,sk=1024,d=256,dtype={dt},causal=1,window=255,softcap=50,pass=bwd",  # Gemma 2's own d
    "b=2,h=8,hkv=8,s=1024,sk=1024,d=96,dtype={dt},causal=1,pass=bwd",                      # Phi-3 (padded to 128)
    "b=2,h=8,hkv=2,s=1024,sk=1024,d=128,dtype={dt},causal=1",
    "b=2,h=8,hkv=8,s=1024,sk=1024,d=64,dtype={dt},causal=1",
    "b=4,h=8,hkv=2,s=1024,sk=1024,d=128,dtype={dt},causal=1,varlen=64,pass=bwd",
    "b=4,h=8,hkv=2,s=1024,sk=1024,d=64,dtype={dt},causal=1,varlen=64,window=127,sinks=1,pass=bwd",
    "b=4,h=8,hkv=2,s=1024,sk=1024,d=128,dtype={dt},causal=1,varlen=64",
]
BWD_PROBLEMS = [p.format(dt=dt) for dt in ("bf16", "fp16") for p in BWD_SHAPES]


def bwd_packages(work):
    """The backward phase's packages by dtype ({"bf16": DIR, "fp16": DIR}) and its notes:
    $ATTNTUNE_TORCH_BWD_PKG alone (its own dtype), else tuned_package's database
    ($ATTNTUNE_TORCH_BWD_DB, or BWD_PROBLEMS tuned into $ATTNTUNE_TORCH_BWD_TUNE_DB or WORK/bwd.db)
    exported once per dtype."""
    env = "ATTNTUNE_TORCH_BWD"
    if os.environ.get(env + "_PKG"):
        return {None: os.environ[env + "_PKG"]}, []
    bf16, notes = tuned_package(work, env, BWD_PROBLEMS, "backward", "bwd")
    db = os.environ.get(env + "_DB") or os.environ.get(env + "_TUNE_DB") or os.path.join(work, "bwd.db")
    binary = os.environ.get("ATTNTUNE_BIN", os.path.join(ROOT, "build", "attntune"))
    fp16 = os.path.join(work, "bwd_fp16_pkg")
    r = subprocess.run([binary, "export", "--db", db, "--all-best", "--dtype", "fp16", "--torch", fp16],
                       capture_output=True, text=True)
    pkgs = {"bf16": bf16}
    if r.returncode == 0:
        pkgs["fp16"] = fp16
    else:
        notes.append(f"SKIP fp16: export --torch --dtype fp16 from {db}: {r.stderr.strip()[:300]}")
    return pkgs, notes


def bwd_phase(work, device="cuda"):
    """The backward phase (attention's autograd through the backward kernels; docs/design/torch.md
    "The backward pass"); returns its failures. Every backward kernel of each package through
    attntune.attention(...) and torch.autograd.grad, on its tuned and odd shapes (S != Sk both ways,
    rows without keys, s=1, [B,S,H,D], its window and others), each of dq, dk, dv against float64
    autograd by FlashAttention-2's criterion, the bound from SDPA's gradients in the dtype (a boolean
    mask where S != Sk or a window; variant_reference's low-precision autograd where a row sees no key,
    where SDPA gives NaN), the gradients' memory poisoned with NaN first; every such call ran the kernel
    explain("attention_backward") names (coverage). The varlen backward kernels the same through
    attntune.attention_varlen on ragged packed batches (lengths 0 and 1 among them), per sequence
    against float64, each call run by the kernel explain("attention_backward_varlen") names. Then the
    fallback on the GPU (max_length_ratio 1, and d=96: no kernel; dense and packed), a learnable sink's
    gradient, torch.compile(fullgraph=True) (inductor) of a training step, and a CUDA graph of forward
    and backward (capture, new inputs, replay), dense and packed, against float64; last,
    informational: forward+backward time against SDPA's. device "cpu" rehearses it
    without a GPU (ATTNTUNE_TORCH_BWD_DEVICE=cpu, with a package or a database): every call falls back
    there, so the kernel checks check the fallback, and graphs, inductor and times are left out."""
    print("\n==== the backward pass: attention's gradients through the backward kernels")
    gpu = device == "cuda"
    try:
        pkgs, notes = bwd_packages(work)
    except RuntimeError as e:
        print(f"  FAIL {e}")
        return [f"backward: {e}"]
    for n in notes:
        print(f"  {n}")
    failures = []
    # Packages tuned here hold varlen backward kernels (unless submit refused their problems): their
    # absence is then a failure; a given package or database may predate them.
    env = "ATTNTUNE_TORCH_BWD"
    expect_varlen = not os.environ.get(env + "_PKG") and not os.environ.get(env + "_DB") and \
        not any("varlen=" in n and "pass=bwd" in n for n in notes)
    for n, (dt_name, pkg) in enumerate(pkgs.items()):
        failures += bwd_checks(pkg, f"attntune_bwd{n}", device, gpu, expect_varlen)
    return [f"backward: {f}" for f in failures]


def bwd_checks(pkg, namespace, device, gpu, expect_varlen=False):
    if "attntune" not in sys.modules:
        sys.path.insert(0, pkg)
    import attntune  # noqa: E402
    import variant_reference as vr  # noqa: E402
    t0 = time.time()
    lib = attntune.load(os.path.join(pkg, "attntune", "kernels.cu"), namespace=namespace)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[lib.info["dtype"]]
    print(f"loaded {pkg} in {time.time() - t0:.0f} s: {len(lib.kernels())} kernels, {lib.info['dtype']}")
    failures = []
    gen = torch.Generator(device=device)
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # the references' fp32 matmuls

    def randn(*shape, seed):
        gen.manual_seed(seed)
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    def record(ok, what, msg):
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<100} {msg}")
        if not ok:
            failures.append(f"{lib.info['dtype']} {what}")

    def poison(numel):
        """Fill the caching allocator's free memory with NaN, so that gradients the backward allocates
        (empty_like) start as NaN where a kernel leaves an element unwritten (best effort)."""
        if gpu:
            t = torch.full((numel * 2 + (1 << 20),), float("nan"), device=device, dtype=dtype)
            del t

    def sdpa_grads(q, k, v, dout, scale, causal, window):
        """SDPA's gradients in the dtype (its math or memory-efficient backend take a boolean mask for
        bottom-right causal and windows), or None where some row sees no key (SDPA gives NaN there)."""
        B, H, S, _ = q.shape
        Sk = k.shape[2]
        if S == 0 or Sk == 0:
            return None
        mask = vr.visible_mask(S, Sk, [S] * B, [Sk] * B, causal, window, q.device)
        if not bool(mask.any(-1).all()):
            return None
        xs = [t.detach().requires_grad_() for t in (q, k, v)]
        plain = window == (-1, -1) and (not causal or S == Sk)
        o = torch.nn.functional.scaled_dot_product_attention(
            *xs, attn_mask=None if plain else mask, is_causal=causal and plain, scale=scale,
            enable_gqa=k.shape[1] != H)
        return torch.autograd.grad(o, xs, dout)

    def references(q, k, v, dout, scale, causal, window, softcap=0.0, sinks=None, saved=None):
        """float64 autograd of variant_reference.attention, and the low-precision gradients whose error
        sets FA2's bound (SDPA's where it can, else variant_reference's in the dtype).

        saved: the output the forward returned (in the dtype), which a FlashAttention-style backward
        reads for D = rowsum(dO * O). The float64 reference is then the exact backward of the saved
        output: D's part in dS is -P * D, and D_i = dO_i . O_i enters every gradient as
        -D_i d(LSE_i) (the sink's column included), so the saved output's rounding is the exact
        gradient plus -sum_i delta_i d(LSE_i), delta_i = dO_i . (saved_i - O_i). The check then measures
        the backward's own error, not the forward's rounding: in a row whose softmax is nearly one
        column (one key, or one key and a sink) dP - D cancels, and O's rounding alone can exceed
        the dtype's autograd bound, which derives D from dP instead."""
        def grads(dt):
            xs = [t.detach().to(torch.float64 if dt == torch.float64 else dtype).requires_grad_() for t in (q, k, v)]
            sk = sinks.detach().double().requires_grad_() if sinks is not None else None
            o, lse = vr.attention(*xs, scale, causal=causal, window=window, softcap=softcap, sinks=sk, dtype=dt)
            if dt != torch.float64:
                return torch.autograd.grad(o, xs + ([sk] if sk is not None else []), dout)
            dout64 = dout.double()
            loss = (o * dout64).sum()
            if saved is not None:
                delta = ((saved.detach().double() - o.detach()) * dout64).sum(-1)
                finite = torch.isfinite(lse)
                loss = loss - (torch.where(finite, delta, torch.zeros_like(delta))
                               * torch.where(finite, lse, torch.zeros_like(lse))).sum()
            return torch.autograd.grad(loss, xs + ([sk] if sk is not None else []), allow_unused=True)
        ref64 = grads(torch.float64)
        lowp = sdpa_grads(q, k, v, dout, scale, causal, window) if softcap == 0 and sinks is None else None
        return ref64, (lowp if lowp is not None else grads(dtype)), lowp is not None

    def compare_grads(got, ref64, lowp):
        ok, parts = True, []
        for name, a, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref64, lowp):
            if name == "dsinks":
                # The fallback's (float32 math) within 1e-3; a kernel's, whose D = dO . O reads the
                # forward's O in the dtype, within FA2's bound of the dtype's own autograd.
                err = (a.double() - r).abs().max().item()
                bound = max(1e-3 * max(1.0, r.abs().max().item()), vr.fa2_bound(lo, r, dtype))
            else:
                err = (a.double() - r).abs().max().nan_to_num(float("inf")).item() if a.numel() else 0.0
                bound = vr.fa2_bound(lo, r, dtype)
            ok = ok and math.isfinite(err) and err <= bound
            parts.append(f"{name} {err:.2e}<={bound:.2e}")
        return ok, ", ".join(parts)

    def judge(what, got, leaves, ref64, lowp, from_sdpa, entry, want_kernel):
        """Records one backward check: the gradients by compare_grads, the kernel coverage() says ran
        for `entry` against want_kernel (None: either; < 0: the fallback), and their shapes."""
        ok, msg = compare_grads(got, ref64, lowp)
        msg += " (bound from SDPA)" if from_sdpa else " (bound from the reference in the dtype)"
        rows = [r for r in lib.coverage() if r["entry"] == entry]
        ran = rows[0]["kernel"] if rows else None
        if want_kernel is not None and ran != (None if want_kernel < 0 else want_kernel):
            ok = False
            msg += f"; ran {ran if ran is not None else 'the fallback: ' + (rows[0]['fallback'] if rows else '?')}, " \
                   f"expected {'the fallback' if want_kernel < 0 else 'kernel ' + str(want_kernel)}"
        shapes = all(g.shape == t.shape for g, t in zip(got, leaves))
        record(ok and shapes, what, msg + ("" if shapes else ", shapes differ"))

    def check(B, H, Hkv, S, Sk, D, causal, window, layout, seed, tag, want_kernel, sinks=None, softcap=0.0):
        """One training call: attention(q, k, v) and torch.autograd.grad with a random dO (and with
        learnable `sinks`, their gradient too)."""
        scale = 1 / math.sqrt(D)
        q, k, v = randn(B, H, S, D, seed=seed), randn(B, Hkv, Sk, D, seed=seed + 1), randn(B, Hkv, Sk, D, seed=seed + 2)
        dout = randn(B, H, S, D, seed=seed + 3)
        if layout == "BSHD":  # [B, S, H, D] storage seen as [B, H, S, D]
            q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, dout))
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if sinks is not None:
            leaves.append(sinks.detach().clone().requires_grad_())
        what = (f"{tag} b={B} h={H} hkv={Hkv} s={S} sk={Sk} d={D} causal={int(causal)} window={window} {layout}"
                + (" sinks" if sinks is not None else "") + (f" softcap={softcap:g}" if softcap else ""))
        lib.reset_coverage()
        try:
            poison(q.numel() + 2 * k.numel())
            o = lib.attention(*leaves[:3], is_causal=causal, window_size=window, softcap=softcap,
                              sinks=leaves[3] if sinks is not None else None)
            got = torch.autograd.grad(o, leaves, dout)
            if gpu:
                torch.cuda.synchronize()
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return
        ref64, lowp, from_sdpa = references(q, k, v, dout, scale, causal, window, softcap=softcap, sinks=sinks,
                                                saved=o)
        judge(what, got, leaves, ref64, lowp, from_sdpa, "attention_backward", want_kernel)

    kernels = lib.kernels()
    # Dense backward kernels (attention_backward) here; packed batches' (varlen=N, attention_backward_varlen)
    # below.
    bwd = [(i, k["problem"]) for i, k in enumerate(kernels)
           if k["problem"].get("pass") == "bwd" and not k["problem"].get("varlen")]
    bwd_varlen = [(i, k["problem"]) for i, k in enumerate(kernels)
                  if k["problem"].get("pass") == "bwd" and k["problem"].get("varlen")]
    print(f"backward: {len(bwd)} kernels built for the backward pass: "
          + ("; ".join(vr.spec_of(p) for _, p in bwd) or "none"))
    print(f"backward: {len(bwd_varlen)} kernels built for the backward pass of packed batches: "
          + ("; ".join(vr.spec_of(p) for _, p in bwd_varlen) or "none"))
    if not bwd:
        failures.append(f"{lib.info['dtype']}: the package holds no backward kernel")
    if not bwd_varlen and expect_varlen:
        failures.append(f"{lib.info['dtype']}: the package holds no varlen backward kernel")
    lib.set_policy("sdpa", 1e9)
    for i, p in bwd:
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        left, right = p.get("window", [-1, -1])
        windows = [(-1, -1)] if left < 0 and right < 0 else list(dict.fromkeys(
            [(left, -1), (17, -1), (300, -1), (0, 0)] if causal else [(left, right), (64, 64), (17, 129), (-1, 100)]))
        shapes = [(B, S, Sk, "BHSD"), (2, 257, 257, "BSHD"), (1, 389, 389, "BHSD"), (2, 200, 533, "BHSD"),
                  (1, 533, 200, "BSHD"), (1, 1, 77, "BHSD"), (1, 77, 1, "BHSD"), (1, 1531, 1531, "BHSD")]
        for j, (b, s, sk, layout) in enumerate(shapes):
            window = windows[j % len(windows)]
            sinks = vr.sink_logits(H, 40 + j, device) if p.get("sinks") else None
            cap = float(p.get("softcap", 0.0))
            want = lib.explain("attention_backward", lib.info["dtype"], D, causal, b, H, Hkv, s, sk,
                               window_size=window, softcap=cap, sinks=sinks is not None)[0] if gpu else None
            if gpu and want != i and j == 0:
                record(False, f"explain on kernel {i}'s own problem", f"names {want}")
            check(b, H, Hkv, s, sk, D, causal, window, layout, 1000 + 20 * i + j, f"k{i}", want, sinks=sinks,
                  softcap=cap)

    # -- the fallback on the GPU: max_length_ratio 1 (kernels at their tuned lengths only), and d=96
    lib.set_policy("sdpa", 1.0)
    for j, (b, h, hkv, s, sk, d, causal, window) in enumerate(((2, 8, 2, 333, 333, 64, True, (-1, -1)),
                                                                (1, 4, 4, 100, 257, 128, False, (32, 16)),
                                                                (2, 8, 2, 129, 77, 96, True, (-1, -1)))):
        check(b, h, hkv, s, sk, d, causal, window, "BHSD", 2000 + 10 * j, "fallback", -1 if gpu else None)
    # Sinks (learnable, as gpt-oss's) and a soft-cap: the fallback's gradients, the sinks' included.
    scale = 1 / 8
    q, k, v = randn(2, 4, 77, 64, seed=3000), randn(2, 2, 100, 64, seed=3001), randn(2, 2, 100, 64, seed=3002)
    dout = randn(2, 4, 77, 64, seed=3003)
    sinks = vr.sink_logits(4, 5, device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)] + [sinks.clone().requires_grad_()]
    try:
        o = lib.attention(*leaves[:3], is_causal=True, window_size=(31, 0), softcap=30.0, sinks=leaves[3])
        got = torch.autograd.grad(o, leaves, dout)
        ref64, lowp, _ = references(q, k, v, dout, scale, True, (31, -1), softcap=30.0, sinks=sinks)
        ok, msg = compare_grads(got, ref64, lowp)
        record(ok, "fallback: causal window 31, soft-cap 30, sinks (their gradient too)", msg)
    except RuntimeError as e:
        record(False, "fallback: causal window, soft-cap, sinks", str(e).splitlines()[0][:300])

    # -- attention_varlen's backward (attention_backward_varlen): ragged packed batches through the varlen
    # backward kernels, each sequence's gradients against float64 autograd of that sequence alone (the
    # forward's saved output's, as references()), assembled into the packing.
    import random  # noqa: E402

    def packed(lens_q, lens_k, H, Hkv, D, seed):
        """cu_seqlens_q/k (int32 on the device) and packed q, k, v, dO."""
        cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device=device)
        cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32, device=device)
        Tq, Tk = sum(lens_q), sum(lens_k)
        return (cu_q, cu_k, randn(Tq, H, D, seed=seed), randn(Tk, Hkv, D, seed=seed + 1),
                randn(Tk, Hkv, D, seed=seed + 2), randn(Tq, H, D, seed=seed + 3))

    def varlen_references(q, k, v, dout, o, lens_q, lens_k, scale, causal, window, softcap, sinks):
        """references() of each sequence as packed gradients: (ref64, lowp, from_sdpa). o: the forward's
        saved output, for a kernel's backward (references()' saved=; it reads D = dO . O from it), or None
        for the fallback's (exact: it recomputes D from P and dP). A sequence without query rows has none
        (its keys' gradients are 0)."""
        ref64 = [torch.zeros(t.shape, dtype=torch.float64, device=device) for t in (q, k, v)]
        lowp = [torch.zeros_like(t) for t in (q, k, v)]
        if sinks is not None:
            ref64.append(torch.zeros(sinks.shape, dtype=torch.float64, device=device))
            lowp.append(torch.zeros(sinks.shape, dtype=torch.float64, device=device))
        from_sdpa, q0, k0 = True, 0, 0
        for lq, lk in zip(lens_q, lens_k):
            qs, ks = slice(q0, q0 + lq), slice(k0, k0 + lk)
            q0, k0 = q0 + lq, k0 + lk
            if lq == 0:
                continue
            per = [t[sl][None].transpose(1, 2) for t, sl in ((q, qs), (k, ks), (v, ks), (dout, qs))]
            saved = o[qs][None].transpose(1, 2) if o is not None else None
            r64, lo, sd = references(*per, scale, causal, window, softcap=softcap, sinks=sinks, saved=saved)
            from_sdpa = from_sdpa and sd
            for j, sl in enumerate((qs, ks, ks)):
                if r64[j] is not None:
                    ref64[j][sl] = r64[j][0].transpose(0, 1)
                lowp[j][sl] = lo[j][0].transpose(0, 1)
            if sinks is not None:
                if r64[3] is not None:
                    ref64[3] += r64[3]
                lowp[3] += lo[3].double()
        return ref64, lowp, from_sdpa

    def lens_words(lens):
        return f"{len(lens)} seqs {min(lens)}..{max(lens)} ({sum(1 for x in lens if x == 0)} empty)"

    def check_varlen(lens_q, lens_k, H, Hkv, D, causal, window, seed, tag, want_kernel, sinks=None, softcap=0.0):
        """One training call of a packed batch: attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k) and
        torch.autograd.grad with a random dO (learnable `sinks` too)."""
        scale = 1 / math.sqrt(D)
        cu_q, cu_k, q, k, v, dout = packed(lens_q, lens_k, H, Hkv, D, seed)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if sinks is not None:
            leaves.append(sinks.detach().clone().requires_grad_())
        what = (f"{tag} varlen h={H} hkv={Hkv} d={D} causal={int(causal)} window={window} q: {lens_words(lens_q)}, "
                f"k: {lens_words(lens_k)}" + (" sinks" if sinks is not None else "") +
                (f" softcap={softcap:g}" if softcap else ""))
        lib.reset_coverage()
        try:
            poison(q.numel() + 2 * k.numel())
            o = lib.attention_varlen(*leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                     window_size=window, softcap=softcap,
                                     sinks=leaves[3] if sinks is not None else None)
            got = torch.autograd.grad(o, leaves, dout)
            if gpu:
                torch.cuda.synchronize()
        except RuntimeError as e:
            record(False, what, str(e).splitlines()[0][:300])
            return
        # The saved output's reference where a kernel runs the backward (it reads D from that output); the
        # exact one where the fallback does (the rehearsal's every call).
        saved = o.detach() if want_kernel is not None and want_kernel >= 0 else None
        ref64, lowp, from_sdpa = varlen_references(q, k, v, dout, saved, lens_q, lens_k, scale, causal, window,
                                                   softcap, sinks)
        judge(what, got, leaves, ref64, lowp, from_sdpa, "attention_backward_varlen", want_kernel)

    def varlen_batches(p, rng):
        """(lens_q, lens_k) of a kernel's problem: its own draw (lengths varlen..s, keys sk - s more, the
        longest s), ragged ones with empty sequences, one row, one key and no keys, fewer keys than rows
        (rows without keys when causal), more keys than rows, and many short sequences."""
        B, S, Sk, lo = p["b"], p["s"], p["sk"], p.get("varlen", 1)
        own = [S] + [rng.randint(lo, S) for _ in range(B - 1)]
        yield own, [x + Sk - S for x in own]
        lq = [0, 1, 1, 7, 300, S] + [rng.randint(1, S) for _ in range(B)]
        lk = [5, 1, 0, 7, 100, Sk] + [x + rng.randint(0, 64) for x in lq[6:]]
        yield lq, lk
        lq = [rng.randint(0, S) for _ in range(B + 3)]
        yield lq, [rng.randint(0, Sk) for _ in lq]
        lq = [rng.randint(0, 40) for _ in range(32)]
        yield lq, [x + rng.randint(0, 3) for x in lq]

    lib.set_policy("sdpa", 1e9)
    for i, p in bwd_varlen:
        H, Hkv, D, causal = p["h"], p["hkv"], p["d"], bool(p["causal"])
        left, right = p.get("window", [-1, -1])
        windows = [(-1, -1)] if left < 0 and right < 0 else list(dict.fromkeys(
            [(left, -1), (17, -1), (0, 0)] if causal else [(left, right), (64, 64), (17, 129)]))
        cap = float(p.get("softcap", 0.0))
        rng = random.Random(700 + i)
        for j, (lens_q, lens_k) in enumerate(varlen_batches(p, rng)):
            window = windows[j % len(windows)]
            sinks = vr.sink_logits(H, 60 + j, device) if p.get("sinks") else None
            want = lib.explain("attention_backward_varlen", lib.info["dtype"], D, causal, len(lens_q), H, Hkv,
                               max(lens_q), max(lens_k), window_size=window, softcap=cap,
                               sinks=sinks is not None)[0] if gpu else None
            if gpu and want != i and j == 0:
                record(False, f"explain on varlen kernel {i}'s own problem", f"names {want}")
            check_varlen(lens_q, lens_k, H, Hkv, D, causal, window, 1500 + 20 * i + j, f"k{i}", want, sinks=sinks,
                         softcap=cap)
    # The fallback of packed batches on the GPU: max_length_ratio 1 (lengths off every kernel's), and d=96.
    lib.set_policy("sdpa", 1.0)
    for j, (lens_q, lens_k, h, hkv, d, causal, window) in enumerate((
            ([0, 1, 77, 333], [3, 1, 90, 333], 8, 2, 128, True, (-1, -1)),
            ([5, 0, 129], [0, 7, 200], 4, 4, 64, False, (32, 16)),
            ([1, 64, 100], [1, 64, 80], 8, 2, 96, True, (-1, -1)))):
        check_varlen(lens_q, lens_k, h, hkv, d, causal, window, 2500 + 10 * j, "fallback", -1 if gpu else None)
    # torch.compile(fullgraph=True) (inductor) of a packed batch's training step, and a CUDA graph of its
    # forward and backward (capture, new inputs, replay), through the first varlen backward kernel.
    if gpu and bwd_varlen:
        lib.set_policy("sdpa", 1e9)
        i, p = bwd_varlen[0]
        H, Hkv, D, causal = p["h"], p["hkv"], p["d"], bool(p["causal"])
        window = tuple(p.get("window", (-1, -1)))
        if causal and window[0] >= 0:
            window = (window[0], -1)
        cap = float(p.get("softcap", 0.0))
        vsinks = vr.sink_logits(H, 77, device) if p.get("sinks") else None
        lens_q = [0, 1, 200, p["s"], 37]
        lens_k = [3, 1, 200 + p["sk"] - p["s"], p["sk"], 37 + p["sk"] - p["s"]]
        mq, mk = max(lens_q), max(lens_k)
        vscale = 1 / math.sqrt(D)

        def vstep(q, k, v, dout, cu_q, cu_k):
            return (lib.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, is_causal=causal, window_size=window,
                                         softcap=cap, sinks=vsinks).float() * dout.float()).sum()

        def vrefs(q, k, v, dout):
            with torch.no_grad():
                o = lib.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, is_causal=causal, window_size=window,
                                         softcap=cap, sinks=vsinks)
            return varlen_references(q, k, v, dout, o, lens_q, lens_k, vscale, causal, window, cap, vsinks)[:2]

        cu_q, cu_k, q, k, v, dout = packed(lens_q, lens_k, H, Hkv, D, 4500)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        eager = torch.autograd.grad(vstep(*leaves, dout, cu_q, cu_k), leaves)
        torch._dynamo.reset()
        lib.reset_coverage()
        compiled = torch.compile(vstep, fullgraph=True)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        try:
            got = torch.autograd.grad(compiled(*leaves, dout, cu_q, cu_k), leaves)
            torch.cuda.synchronize()
            ok, msg = compare_grads(got, *vrefs(q, k, v, dout))
            ran = [r["kernel"] for r in lib.coverage() if r["entry"] == "attention_backward_varlen"]
            ok = ok and ran == [i]
            same = all(torch.equal(a, b) for a, b in zip(got, eager))
            record(ok, f"torch.compile(fullgraph=True) of a packed batch's training step, kernel {i}",
                   msg + f", backward ran {ran}" + (", bit-identical to eager" if same else
                                                    ", not bit-identical to eager (dQ's atomics)"))
        except Exception as e:  # noqa: BLE001 - a compile error is a failure to report
            record(False, f"torch.compile(fullgraph=True) of a packed batch's training step, kernel {i}",
                   f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        try:
            static = [t.clone() for t in (q, k, v, dout)]
            leaves = [t.requires_grad_() for t in static[:3]]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: workspaces, the ops' first calls
                for _ in range(2):
                    torch.autograd.grad(vstep(*leaves, static[3], cu_q, cu_k), leaves)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            lib.reset_coverage()
            with torch.cuda.graph(graph):
                graph_grads = torch.autograd.grad(vstep(*leaves, static[3], cu_q, cu_k), leaves)
            captured = [r["kernel"] for r in lib.coverage() if r["entry"] == "attention_backward_varlen"]
            fresh = list(packed(lens_q, lens_k, H, Hkv, D, 4600)[2:])
            with torch.no_grad():
                for dst, src in zip(static, fresh):
                    dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            ok, msg = compare_grads(graph_grads, *vrefs(*fresh))
            ok = ok and captured == [i]
            record(ok, f"CUDA graph of a packed batch's forward and backward (capture, new inputs, replay), kernel {i}",
                   msg + f", the captured backward ran {captured} (expected {[i]})")
        except RuntimeError as e:
            record(False, f"CUDA graph of a packed batch's forward and backward, kernel {i}",
                   str(e).splitlines()[0][:300])

    if not gpu or not bwd:
        return failures
    # -- torch.compile(fullgraph=True) (inductor) of a training step, and a CUDA graph of fwd + bwd
    lib.set_policy("sdpa", 1e9)
    i, p = bwd[0]
    B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
    window = tuple(p.get("window", (-1, -1)))
    if causal and window[0] >= 0:
        window = (window[0], -1)
    scale = 1 / math.sqrt(D)

    def inputs(seed, extra=0):
        """q, k, v, dO of the kernel's tuned problem (extra: more query rows and keys, off its lengths)."""
        return [randn(B, H, S + extra, D, seed=seed), randn(B, Hkv, Sk + extra, D, seed=seed + 1),
                randn(B, Hkv, Sk + extra, D, seed=seed + 2), randn(B, H, S + extra, D, seed=seed + 3)]

    def step(q, k, v, dout):
        return (lib.attention(q, k, v, is_causal=causal, window_size=window).float() * dout.float()).sum()

    q, k, v, dout = inputs(4000)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    eager = torch.autograd.grad(step(*leaves, dout), leaves)
    torch._dynamo.reset()
    lib.reset_coverage()
    compiled = torch.compile(step, fullgraph=True)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    try:
        got = torch.autograd.grad(compiled(*leaves, dout), leaves)
        torch.cuda.synchronize()
        ref64, lowp, _ = references(q, k, v, dout, scale, causal, window)
        ok, msg = compare_grads(got, ref64, lowp)
        ran = [r["kernel"] for r in lib.coverage() if r["entry"] == "attention_backward"]
        ok = ok and ran == [i]
        same = all(torch.equal(a, b) for a, b in zip(got, eager))
        record(ok, f"torch.compile(fullgraph=True) of a training step, kernel {i}",
               msg + f", backward ran {ran}" + (", bit-identical to eager" if same else
                                                ", not bit-identical to eager (dQ's atomics)"))
    except Exception as e:  # noqa: BLE001 - a compile error is a failure to report
        record(False, f"torch.compile(fullgraph=True) of a training step, kernel {i}",
               f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")

    # The fallback's graph: 7 more rows and keys than the kernel's problem at max_length_ratio 1.
    for name, ratio, extra in ((f"kernel {i}", 1e9, 0), ("the fallback", 1.0, 7)):
        lib.set_policy("sdpa", ratio)
        static = [t.clone() for t in inputs(5000, extra)]
        leaves = [t.requires_grad_() for t in static[:3]]
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: workspaces, the ops' first calls
                for _ in range(2):
                    torch.autograd.grad(step(*leaves, static[3]), leaves)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            lib.reset_coverage()
            with torch.cuda.graph(graph):
                graph_grads = torch.autograd.grad(step(*leaves, static[3]), leaves)
            captured = [r["kernel"] for r in lib.coverage() if r["entry"] == "attention_backward"]
            fresh = inputs(6000, extra)
            with torch.no_grad():
                for dst, src in zip(static, fresh):
                    dst.copy_(src)
            lib.reset_coverage()
            graph.replay()
            torch.cuda.synchronize()
            ref64, lowp, _ = references(*fresh, scale, causal, window)
            ok, msg = compare_grads(graph_grads, ref64, lowp)
            want = [i] if extra == 0 else [None]
            replay_counted = lib.coverage() != []  # a replay runs no host code: nothing is counted
            ok = ok and captured == want and not replay_counted
            record(ok, f"CUDA graph of forward and backward (capture, new inputs, replay), {name}",
                   msg + f", the captured backward ran {captured} (expected {want})" +
                   (", a replay counted a call" if replay_counted else ""))
        except RuntimeError as e:
            record(False, f"CUDA graph of forward and backward, {name}", str(e).splitlines()[0][:300])

    # -- informational: a training step's attention (forward + backward) against SDPA's, per kernel
    lib.set_policy("sdpa", 1e9)
    for i, p in bwd:
        B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], bool(p["causal"])
        window = tuple(p.get("window", (-1, -1)))
        if window != (-1, -1):
            continue  # SDPA has no window
        q, k, v, dout = (t.requires_grad_() if j < 3 else t for j, t in enumerate(inputs(7000)))

        def ours():
            torch.autograd.grad(lib.attention(q, k, v, is_causal=causal), (q, k, v), dout)

        def sdpa():
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hkv != H)
            torch.autograd.grad(o, (q, k, v), dout)
        times = []
        for fn in (ours, sdpa):
            fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 100)  # us a call
        print(f"  time {vr.spec_of(p)}: forward+backward {times[0]:.0f} us, SDPA {times[1]:.0f} us "
              f"({times[1] / times[0]:.2f}x)")
    return failures


if __name__ == "__main__":
    sys.exit(main())
