#!/usr/bin/env python3
"""Time attntune's chunked prefill over a paged KV cache against the same kernel on a contiguous
cache, a dense build, FA4's dense forward and PyTorch's SDPA, in one process on the GPU machine
(the serving targets for chunked prefill).

  python3 tools/compare_chunked.py --package DIR --problem SPEC [--dense-package DIR2] [--fa4-aot .fa4/aot]
      [--rounds 3] [--min-seconds 1] [--json OUT] [--dry-run]

SPEC is attntune's paged problem spec (tuner/core/problem.hpp), e.g.
b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64: b sequences, each with s new query
rows attending to sk keys that sit in a paged KV cache (the sk - s tokens before the chunk and the s
new ones, already written), pages of `page` rows; h query heads, hkv KV heads (GQA), head dim d.
Causal is bottom-right per sequence (docs/CONTRACT.md): query i of sequence b sees keys
j <= i + cache_seqlens[b] - s. Inputs: random normal in the problem's dtype (fixed --seed).

Contenders (--contenders, a comma list of these groups; default all that apply):
  ours_paged   attntune.attention_kvcache(q, k_pages, v_pages, cache_seqlens=lens, block_table=table,
               is_causal=...) of the PyTorch package `attntune export --torch DIR` wrote (DIR holds
               attntune/), fallback policy "raise": a call no kernel serves fails. q [B, S, H, D]
               (flash_attn_with_kvcache's layout); pages [num_pages, page, Hkv, D]; block_table int32
               [B, ceil(sk/page)] mapping each sequence's pages onto a random permutation of all the
               pages, with SPARE_PAGES more than the table names, so no sequence is contiguous;
               cache_seqlens int32 [B], sk each (every sequence full: the timed case). Rows past sk in
               a sequence's last page, and the spare pages, hold NaN.
  ours_contig  the same op, block_table=None, on contiguous caches [B, sk, Hkv, D] (the same
               cache_seqlens): the same kernel on contiguous KV. The target: paged within 5% of it.
  ours_dense   with --dense-package DIR2 (none by default: skipped, saying so): attention() of that
               package on the contiguous equivalent, q [B,H,S,D], k/v [B,Hkv,Sk,D] (contiguous
               copies), is_causal (bottom-right, S != Sk): the config tuned and built for the dense
               problem (the spec without page=).
  fa4          FlashAttention-4's dense forward (flash_attn_func's kernel, sm90) on the contiguous
               equivalent, q [B,S,H,D], k/v [B,Sk,Hkv,D] (causal bottom-right, FA's convention),
               AOT-built by the FA4 kit (.fa4: build_aot.py --problem SPEC-without-page; the dry run
               prints the command when the kernel is missing) and called through tvm_ffi; its output is
               allocated per call, as FA4's interface does. Skipped, saying why, when there is no kit,
               no tvm_ffi wheel for this Python, or no kernel for the spec's FA4 signature.
  sdpa         F.scaled_dot_product_attention on [B,H,S,D] / [B,Hkv,Sk,D] (contiguous), causal as
               torch.nn.attention.bias.causal_lower_right(S, Sk) (is_causal when S == Sk), GQA through
               enable_gqa; a backend that refuses it gets K/V with heads repeated beforehand (name
               +kvrep, the repeat not timed). Under each of cuDNN, flash and efficient (--backends).
               How each backend serves the lower-right mask (the aten flash op, the efficient op, or
               a materialized [S, Sk] mask: torch's CausalBias dispatch) is logged and in the JSON.

Correctness: each contender's output once against a float32 reference computed per sequence (TF32
off; float32 throughout, no subsampling: b*h of s x sk score blocks, chunked to 1 GiB), bottom-right
causal; max abs diff beyond the output's own rounding (--atol, FA2-style 2e-2 for bf16, 5e-3 for
fp16, as tools/compare_varlen.py); ours' LSE ([B, H, S], natural log, return_lse=True) against the
reference's (--lse-atol 1e-3). Then a ragged batch through the kvcache op, paged (a fresh shuffled
table) and contiguous: b' = max(b, 5) sequences (--ragged-batch) whose cache_seqlens cycle through
0, sk, 1, an odd count and a random one; every cache row past a sequence's length NaN (a stale cache:
the kernel must not let it through), out and LSE poisoned with NaN before the call; rows whose
queries see no key must hold exact zeros and LSE -inf. Any failure: exit 1.

Timing (as tools/compare_varlen.py): each contender's calls captured --calls at a time in a CUDA
graph; a sample replays the graph back to back between two CUDA events until it spans at least
--min-seconds of GPU time; one untimed warm-up sample each; then --rounds rounds, round r starting
at the r-th contender (order rotated), each contender's median over the rounds. The SDPA variants
are first screened with one sample of --screen-seconds each; the fastest enters the rounds
(--all-rounds: every variant). TFLOP/s = 4*h*d*(visible (query, key) pairs, bottom-right causal,
counted exactly) / time, the useful work (Problem::flops); GB/s of Problem::bytes (Q, K, V read and
O written once). paged/X = X's time / ours_paged's (> 1: ours_paged is faster), with the range of
the per-round ratios. Headlines: paged / contiguous (ours_contig's time / ours_paged's: the target's
"within 5%", >= 0.95) and ours vs FA4 (contiguous) (fa4's time / ours_paged's, and / the best of ours).

--dry-run prints the problem, FLOPs, bytes, page table shape, the ragged lengths and the contenders
without torch, CUDA or a package build. --json OUT writes the numbers.
"""
import argparse
import contextlib
import glob
import importlib.util
import json
import math
import os
import random
import sys
import time
import warnings

import peer_common  # what the peer tools share
from peer_common import (ATOL, ROOT, RTOL, Parser, fmt, kernels_cu, kit_dir, log, package_root, problem_str,
                         reference_seq, seq_pairs, short)

GROUPS = ("ours_paged", "ours_contig", "ours_dense", "fa4", "sdpa")
OURS = ("ours_paged", "ours_contig", "ours_dense")
SPARE_PAGES = 4      # pages beyond those the block table names (never read; NaN)
RAGGED_MIN_B = 5     # the ragged check's batch: at least one sequence of each length kind
FA4_VENV_PY = "~/.cache/fa4kit/venv/bin/python"  # .fa4/setup_cpu.sh's venv, on the CPU machine
# the serving targets for chunked prefill: paged within 5% of the same kernel on contiguous KV (and of
# the dense build), >= 1.05x FA4 on the contiguous equivalent; PyTorch's best is reported against
# the varlen bar (1.3x), the target for packed batches.
TARGETS = {"paged_vs_contig": 0.95, "paged_vs_dense": 0.95, "vs_fa4": 1.05, "vs_pytorch_best": 1.3}


# ---------------------------------------------------------------- problems (no torch)

def parse_spec(spec):
    """attntune's paged problem spec (peer_common.parse_spec), with what this tool needs: page=N > 0,
    s <= sk, no packed batch."""
    p = peer_common.parse_spec(spec)
    if p["varlen"] or p["lens_seed"]:
        raise ValueError(f"problem {spec!r}: varlen=N is a packed batch (tools/compare_varlen.py), not a paged cache")
    if not p["page"]:
        raise ValueError(f"problem {spec!r}: not a paged problem (no page=N): this tool times chunked prefill over "
                         f"a paged KV cache (dense: tools/compare_sdpa.py, varlen: tools/compare_varlen.py)")
    if p["s"] > p["sk"]:
        raise ValueError(f"problem {spec!r}: s={p['s']} > sk={p['sk']}: the chunk's s new tokens are in the cache, "
                         f"so sk >= s")
    if p["b"] * -(-p["sk"] // p["page"]) + SPARE_PAGES > 2 ** 31 - 1:
        raise ValueError(f"problem {spec!r}: too many pages for an int32 block table")
    return p


def spec_str(p, paged=True):
    """The canonical spec (Problem::str); paged=False: the dense problem of the same shapes."""
    return problem_str(p if paged else dict(p, page=0))


def ragged_lengths(b, sk, seed):
    """cache_seqlens of the ragged check: 0, sk, 1, an odd count, a random one (1..sk), in turn."""
    rng = random.Random(seed)
    kinds = (0, sk, min(1, sk), min(sk, (sk // 2) | 1), None)
    return [kinds[i % 5] if kinds[i % 5] is not None else rng.randint(1, sk) for i in range(b)]


def keyless_rows(s, lens, causal):
    """Query rows that see no key (zeros and LSE -inf expected): all s rows of a sequence with no
    key; when causal, rows i < s - n of a sequence of n keys."""
    return sum(s if n == 0 else (max(0, s - n) if causal else 0) for n in lens)


class Chunked:
    """A paged problem and what follows from it."""

    def __init__(self, p, ragged_b=None, seed=0):
        self.p = p
        self.per = -(-p["sk"] // p["page"])            # max_blocks_per_seq
        self.num_pages = p["b"] * self.per + SPARE_PAGES
        self.pairs = p["b"] * seq_pairs(p["s"], p["sk"], p["causal"])
        self.flops = 4.0 * p["h"] * p["d"] * self.pairs
        # Problem::bytes: K and V once, Q read and O written (2-byte elements)
        self.bytes = 2.0 * p["d"] * (2.0 * p["b"] * p["hkv"] * p["sk"] + 2.0 * p["b"] * p["h"] * p["s"])
        self.ragged_b = ragged_b or max(p["b"], RAGGED_MIN_B)
        self.ragged_lens = ragged_lengths(self.ragged_b, p["sk"], seed + 1)


# ---------------------------------------------------------------- the FA4 kit (no torch to look up)

def load_kit(args):
    """(fa4kit module, aot dirs, None) or (None, dirs, why not): a kit with FA4Aot.make."""
    return peer_common.load_kit(args, lambda K: hasattr(K, "FA4Aot") and hasattr(K.FA4Aot, "make"),
                                "{kit}/fa4kit.py has no FA4Aot.make (not the FA4 kit?)")


def rel(path):
    path = os.path.abspath(path)
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def fa4_build_cmd(args, dirs, p):
    """The command (CPU machine, the kit's venv) that builds FA4's kernel for p's dense signature
    into the first kernel folder; --suite none: only that problem, earlier entries kept."""
    out = dirs[0] if dirs else os.path.join(ROOT, ".fa4", "aot")
    kit = kit_dir(args, dirs) or os.path.join(ROOT, ".fa4")
    return (f"{FA4_VENV_PY} {rel(os.path.join(kit, 'build_aot.py'))} --out {rel(out)} --suite none "
            f"--problem {spec_str(p, False)}")


def fa4_lookup(K, dirs, p):
    """(manifest entry, how, signature) or (None, why, signature) for p's dense equivalent."""
    kp = K.parse_problem(spec_str(p, False))
    sig = K.fa4_sig(kp)
    mans, errs = K.load_manifests(dirs)
    if not mans:
        return None, "no FA4 manifest: " + "; ".join(errs), sig
    _, ent, how = K.find_kernel(mans, kp)
    return ent, how, sig


def fa4_missing(how, sig):
    """Why fa4_lookup found nothing, in a few words (find_kernel's own text names its build command)."""
    return how if how.startswith("no FA4 manifest") else f"no FA4 kernel for signature {sig}"


def tvm_ffi_note(args, dirs):
    """Whether this Python can load FA4's kernels: the kit's apache-tvm-ffi wheel for its tag, or an
    installed tvm_ffi (what fa4kit.ensure_tvm_ffi looks for)."""
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    kit = kit_dir(args, dirs)
    wheels = sorted(glob.glob(os.path.join(kit, "whl", "apache_tvm_ffi-*.whl"))) if kit else []
    mine = [w for w in wheels if f"-{tag}-" in os.path.basename(w)]
    if mine:
        return True, f"tvm_ffi from {os.path.basename(mine[-1])}"
    if importlib.util.find_spec("tvm_ffi") is not None:
        return True, "tvm_ffi installed"
    tags = sorted({os.path.basename(w).split("-")[2] for w in wheels if len(os.path.basename(w).split("-")) > 2})
    return False, (f"no tvm_ffi for this Python ({tag}; the kit's wheels: {', '.join(tags) or 'none'}): under it fa4 "
                   f"is skipped (the GPU machine's python3 is 3.12)")


# ---------------------------------------------------------------- package

# ---------------------------------------------------------------- dry run

def dry_run(args, p, cp, groups, backends):
    B, H, Hkv, S, Sk, D, page = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], p["page"]
    mib = lambda n: f"{n * 2 / 2**20:.1f} MiB"  # noqa: E731 - 2-byte elements
    print(f"problem {spec_str(p)}")
    print(f"  chunked prefill: {B} sequence(s), each {S} new query rows over {Sk} keys in the cache "
          f"({Sk - S} before the chunk); {H} query heads, {Hkv} KV heads (GQA {H // Hkv}), head dim {D}, "
          f"{p['dtype']}, {'causal (bottom-right)' if p['causal'] else 'not causal'}")
    print(f"  visible pairs {cp.pairs} -> {cp.flops / 1e12:.4f} TFLOP per call (4*h*d*pairs); "
          f"{cp.bytes / 1e6:.1f} MB per call (Q, K, V read and O written once)")
    print(f"  q [{B}, {S}, {H}, {D}] ({mib(B * S * H * D)}); paged cache: k/v pages "
          f"[{cp.num_pages}, {page}, {Hkv}, {D}] ({mib(cp.num_pages * page * Hkv * D)} each), "
          f"block_table int32 [{B}, {cp.per}] over a random permutation of the pages ({SPARE_PAGES} spare), "
          f"cache_seqlens int32 [{B}] = {Sk} each"
          + (f"; the last page of each sequence holds {Sk - (cp.per - 1) * page} of {page} rows" if Sk % page else ""))
    print(f"  contiguous: caches [{B}, {Sk}, {Hkv}, {D}]; dense equivalent {spec_str(p, False)}")
    print(f"  ragged check: b={cp.ragged_b}, cache_seqlens {cp.ragged_lens}, NaN past each length; "
          f"{keyless_rows(S, cp.ragged_lens, p['causal'])} of {cp.ragged_b * S} query rows see no key")
    print("contenders:")
    for g in groups:
        if g in ("ours_paged", "ours_contig"):
            if not args.package:
                print(f"  {g}: needs --package DIR (the package `attntune export --torch DIR` wrote for "
                      f"{spec_str(p)})")
                continue
            try:
                cu = kernels_cu(args.package)
                print(f"  {g}: attention_kvcache ({'paged' if g == 'ours_paged' else 'block_table=None'}) of {cu}"
                      + ("" if os.path.isfile(cu) else "  (MISSING: no kernels.cu)"))
            except FileNotFoundError as e:
                print(f"  {g}: unavailable: {e}")
        elif g == "ours_dense":
            if not args.dense_package:
                print("  ours_dense: skipped: no --dense-package (a package exported for "
                      f"{spec_str(p, False)})")
                continue
            try:
                cu = kernels_cu(args.dense_package)
                print(f"  ours_dense: attention() of {cu} on [B,H,S,D]" + ("" if os.path.isfile(cu) else
                                                                            "  (MISSING: no kernels.cu)"))
            except FileNotFoundError as e:
                print(f"  ours_dense: unavailable: {e}")
        elif g == "fa4":
            K, dirs, why = load_kit(args)
            if K is None:
                print(f"  fa4: skipped: {why}")
                continue
            ent, how, sig = fa4_lookup(K, dirs, p)
            ok, note = tvm_ffi_note(args, dirs)
            if ent:
                print(f"  fa4: {ent['kernel']} ({how}; signature {sig}); {note}")
            else:
                print(f"  fa4: skipped: {fa4_missing(how, sig)} in {', '.join(rel(d) for d in dirs)}; "
                      f"build it on the CPU machine:\n      {fa4_build_cmd(args, dirs, p)}")
                if not ok:
                    print(f"      ({note})")
        elif g == "sdpa":
            mask = ("causal_lower_right" if S != Sk else "is_causal") if p["causal"] else "no mask"
            print(f"  sdpa: {', '.join(backends)} on [B={B}, H={H}, {S}, D={D}] / [{B}, {Hkv}, {Sk}, {D}], {mask}"
                  + (", enable_gqa (+kvrep where refused)" if Hkv != H else "")
                  + (", all in the rounds" if args.all_rounds else ", screened, the fastest in the rounds"))
    for g in GROUPS:
        if g not in groups:
            print(f"  {g}: not asked for (--contenders)")
    print(f"timing: {args.rounds} round(s) of samples >= {args.min_seconds:g} s, CUDA graphs of {args.calls} calls")
    return 0


# ---------------------------------------------------------------- GPU side

def build_pages(torch, k, v, lens, page, seed):
    """A paged copy of the caches k/v [B, Sk, Hkv, D]: (k_pages, v_pages [num_pages, page, Hkv, D],
    block_table int32 [B, ceil(Sk/page)]). Sequence b's row j lives in page table[b, j // page], row
    j % page; the table is a random permutation of B*per + SPARE_PAGES pages, the spare ones left
    unnamed. Rows at or past lens[b], and the spare pages, hold NaN (a stale cache)."""
    B, Sk, Hkv, D = k.shape
    per = -(-Sk // page)
    num = B * per + SPARE_PAGES
    order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
    table = order[:B * per].view(B, per)
    idx = table.flatten().to(k.device)
    past = torch.arange(per * page, device=k.device)[None, :] >= torch.tensor(lens, device=k.device)[:, None]
    out = []
    for t in (k, v):
        rows = torch.full((B, per * page, Hkv, D), float("nan"), dtype=t.dtype, device=t.device)
        rows[:, :Sk] = t
        rows[past] = float("nan")
        pages = torch.full((num, page, Hkv, D), float("nan"), dtype=t.dtype, device=t.device)
        pages.index_copy_(0, idx, rows.view(B * per, page, Hkv, D))
        out.append(pages)
        del rows
    return out[0], out[1], table.to(device=k.device, dtype=torch.int32).contiguous()


def nan_past(torch, t, lens):
    """A copy of the cache t [B, Sk, Hkv, D] with the rows at or past lens[b] NaN."""
    t = t.clone()
    past = torch.arange(t.shape[1], device=t.device)[None, :] >= torch.tensor(lens, device=t.device)[:, None]
    t[past] = float("nan")
    return t


def main():
    ap = Parser(description=" ".join(__doc__.split("\n\n")[0].split()),
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--package", help="folder `attntune export --torch` wrote for the paged problem (holds attntune/)")
    ap.add_argument("--problem", required=True, help="attntune's paged problem spec (page=N, s <= sk)")
    ap.add_argument("--dense-package", help="package of the dense problem (the spec without page=) for ours_dense")
    peer_common.add_run_args(ap, GROUPS, all_rounds_help="every SDPA variant in the rounds, not the fastest",
                             dry_run_help="print the problem, FLOPs, pages and contenders; no torch",
                             seed_help="seed of the random inputs, tables and ragged lengths")
    ap.add_argument("--ragged-batch", type=int, help=f"sequences in the ragged check (default max(b, {RAGGED_MIN_B}))")
    args = ap.parse_args()

    try:
        p = parse_spec(args.problem)
    except ValueError as e:
        ap.error(str(e))
    groups, backends = peer_common.check_run_args(ap, args, GROUPS)
    if args.ragged_batch is not None and args.ragged_batch < 1:
        ap.error("--ragged-batch must be >= 1")
    cp = Chunked(p, args.ragged_batch, args.seed)
    if args.dry_run:
        return dry_run(args, p, cp, groups, backends)
    if ("ours_paged" in groups or "ours_contig" in groups) and not args.package:
        ap.error("--package is needed for ours_paged and ours_contig (or leave them out: --contenders fa4,sdpa)")
    skipped = {}
    if "ours_dense" in groups and not args.dense_package:
        skipped["ours_dense"] = f"no --dense-package (a package exported for {spec_str(p, False)})"
    if args.device == "cpu":  # ours stays: its CPU path (the op's fallback) is what runs
        skipped["fa4"] = "on the CPU (CUDA only)"
    for g, why in skipped.items():
        if g in groups:
            groups.remove(g)
            print(f"{g}: skipped: {why}")
    if not groups:
        ap.error("no contender left to run")
    return run(args, p, cp, groups, backends, {g: w for g, w in skipped.items() if g in GROUPS})


def run(args, p, cp, groups, backends, skipped):
    R = peer_common.Run(p["dtype"], args.device)
    torch, F, sdpa_kernel, be_enum, dt, env, sync, dev = (R.torch, R.F, R.sdpa_kernel, R.backend, R.dt, R.env,
                                                          R.sync, args.device)
    H, Hkv, D, B, S, Sk, page, causal = p["h"], p["hkv"], p["d"], p["b"], p["s"], p["sk"], p["page"], p["causal"]
    scale = 1.0 / math.sqrt(D)
    atol = args.atol if args.atol is not None else ATOL[p["dtype"]]
    rtol = RTOL[p["dtype"]]
    log(f"problem {spec_str(p)}: {cp.flops / 1e12:.4f} TFLOP, {cp.bytes / 1e6:.1f} MB per call; pages "
        f"[{cp.num_pages}, {page}, {Hkv}, {D}], block_table [{B}, {cp.per}]")

    # The inputs: q [B, S, H, D] and the logical caches [B, Sk, Hkv, D]; every contender reads these values.
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    q = torch.randn(B, S, H, D, device=dev, dtype=dt, generator=gen)
    k = torch.randn(B, Sk, Hkv, D, device=dev, dtype=dt, generator=gen)
    v = torch.randn(B, Sk, Hkv, D, device=dev, dtype=dt, generator=gen)
    lens = torch.full((B,), Sk, dtype=torch.int32, device=dev)
    kp = vp = table = None
    if "ours_paged" in groups:
        kp, vp, table = build_pages(torch, k, v, [Sk] * B, page, args.seed + 2)
    bhsd = None
    if "ours_dense" in groups or "sdpa" in groups:  # SDPA's layout, contiguous (what the dense build was tuned on)
        bhsd = tuple(x.transpose(1, 2).contiguous() for x in (q, k, v))

    # name -> {group, fn, to_bshd (output -> [B, S, H, D]), lse_fn (ours: (out, lse [B, H, S]))}
    cands, failed = {}, False
    res = {}

    # ours: the package(s)
    lib = dlib = None
    main_root = dense_root = None
    try:
        if args.package and ("ours_paged" in groups or "ours_contig" in groups):
            main_root = package_root(args.package)
        if "ours_dense" in groups:
            dense_root = package_root(args.dense_package)
    except FileNotFoundError as e:
        log(f"ours: {e}")
        failed = True
        main_root = dense_root = None
        for g in OURS:
            if g in groups:
                res[g] = {"group": g, "ok": False, "error": str(e)}
    first_root = main_root or dense_root
    if first_root:
        try:
            sys.path.insert(0, first_root)
            import attntune
            if not os.path.abspath(attntune.__file__).startswith(first_root):
                raise RuntimeError(f"imported attntune from {attntune.__file__}, not from the package")
            first = attntune.default()
            first.set_policy("raise")
            log(f"ours: {first.cu}: {len(first.kernels())} kernel(s)")
            lib = first if main_root else None
            if dense_root:
                dlib = first if dense_root == first_root else attntune.load(kernels_cu(dense_root),
                                                                             namespace="attntune_dense")
                dlib.set_policy("raise")
                if dlib is not first:
                    log(f"ours_dense: {dlib.cu}: {len(dlib.kernels())} kernel(s)")
        except Exception as e:  # noqa: BLE001
            log(f"ours: the package did not load: {short(e, 400)}")
            failed = True
            lib = dlib = None
            for g in OURS:
                if g in groups:
                    res[g] = {"group": g, "ok": False, "error": f"the package did not load: {short(e, 300)}"}

    def explain(L, entry, name):
        with contextlib.suppress(Exception):
            idx, why = L.explain(entry, p["dtype"], D, causal, B, H, Hkv, S, Sk)
            kinfo = L.kernels()[idx] if idx >= 0 else {}
            log(f"{name}: {entry} -> kernel {idx} ({why}); {kinfo.get('template', '')} "
                f"{json.dumps(kinfo.get('config', {}), separators=(',', ':'))} tuned for {kinfo.get('problem', '')}")
            return {"kernel": idx, "why": why, "template": kinfo.get("template"), "config": kinfo.get("config"),
                    "tuned_for": kinfo.get("problem")}
        return None

    if lib is not None:
        kx = explain(lib, "attention_kvcache", "ours")

        def kvcache_cand(name, kk, vv, tbl):  # ours through the kvcache op on this cache
            return dict(group=name, explain=kx, to_bshd=lambda o: o,
                        fn=lambda: lib.attention_kvcache(q, kk, vv, cache_seqlens=lens, block_table=tbl, scale=scale,
                                                         is_causal=causal),
                        lse_fn=lambda: lib.attention_kvcache(q, kk, vv, cache_seqlens=lens, block_table=tbl,
                                                             scale=scale, is_causal=causal, return_lse=True))
        if "ours_paged" in groups:
            cands["ours_paged"] = kvcache_cand("ours_paged", kp, vp, table)
        if "ours_contig" in groups:
            cands["ours_contig"] = kvcache_cand("ours_contig", k, v, None)
    if dlib is not None:
        dq, dk, dv = bhsd
        cands["ours_dense"] = dict(
            group="ours_dense", explain=explain(dlib, "attention", "ours_dense"), to_bshd=lambda o: o.transpose(1, 2),
            fn=lambda: dlib.attention(dq, dk, dv, scale=scale, is_causal=causal),
            lse_fn=lambda: dlib.attention(dq, dk, dv, scale=scale, is_causal=causal, return_lse=True))

    # FA4: the dense forward on the contiguous equivalent
    if "fa4" in groups:
        K, dirs, why = load_kit(args)
        if K is not None:
            try:
                ent, how, sig = fa4_lookup(K, dirs, p)
                if ent is None:
                    raise RuntimeError(f"{fa4_missing(how, sig)}; build it on the CPU machine: "
                                       f"{fa4_build_cmd(args, dirs, p)}")
                have_ffi, note = tvm_ffi_note(args, dirs)
                if not have_ffi:
                    raise RuntimeError(note)
                fa4 = K.FA4Aot(dirs)
                call = fa4.make(K.parse_problem(spec_str(p, False)), q, k, v, scale)
                log(f"fa4: {call.kernel} ({call.how}; signature {sig})")
                cands["fa4"] = dict(group="fa4", fn=call, to_bshd=lambda o: o, kernel=call.kernel)
            except Exception as e:  # noqa: BLE001 - no tvm_ffi, no runtime, no kernel: skipped, saying why
                why = short(e, 400)
        if "fa4" not in cands:
            skipped["fa4"] = why
            log(f"fa4: skipped: {why}")

    # SDPA
    if "sdpa" in groups:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention, can_use_efficient_attention
        sq, sk_, sv = bhsd
        gqa = Hkv != H
        kw0 = {"scale": scale}
        if causal and S == Sk:
            kw0["is_causal"] = True
        elif causal:
            from torch.nn.attention.bias import causal_lower_right
            kw0["attn_mask"] = causal_lower_right(S, Sk)
        kvrep = None
        for be in backends:
            for rep in ((False, True) if gqa else (False,)):
                if rep and kvrep is None:
                    kvrep = (sk_.repeat_interleave(H // Hkv, dim=1), sv.repeat_interleave(H // Hkv, dim=1))
                kk, vv = kvrep if rep else (sk_, sv)
                kw = dict(kw0, enable_gqa=True) if (gqa and not rep) else dict(kw0)

                def f(be=be, kk=kk, vv=vv, kw=kw):
                    with sdpa_kernel([be_enum[be]]):
                        return F.scaled_dot_product_attention(sq, kk, vv, **kw)
                name = f"sdpa_{be}" + ("+kvrep" if rep else "")
                route = None
                if causal and S != Sk:  # torch's CausalBias dispatch (torch/nn/attention/bias.py)
                    with contextlib.suppress(Exception), sdpa_kernel([be_enum[be]]):
                        prm = SDPAParams(sq, kk, vv, None, 0.0, False, bool(kw.get("enable_gqa", False)))
                        route = ("the aten flash op" if can_use_flash_attention(prm) else "the efficient op"
                                 if can_use_efficient_attention(prm) else "a materialized [S, Sk] mask")
                try:
                    with warnings.catch_warnings():  # a refusing backend warns why, then raises
                        warnings.simplefilter("ignore")
                        f()
                    sync()
                    cands[name] = dict(group="sdpa", fn=f, to_bshd=lambda o: o.transpose(1, 2), backend=be,
                                       mask_route=route)
                    if route:
                        log(f"{name}: lower-right causal through {route}")
                    break
                except Exception as e:  # noqa: BLE001
                    skipped[name] = short(e, 160)
                    log(f"{name}: refused: {skipped[name]}")
                    with contextlib.suppress(Exception):
                        sync()

    # ---- correctness: first calls, then the float32 reference per sequence
    outs, lses = {}, {}
    for name, c in list(cands.items()):
        r = res.setdefault(name, {"group": c["group"]})
        for key in ("backend", "mask_route", "kernel", "explain"):
            if c.get(key) is not None:
                r[key] = c[key]
        try:
            t1 = time.time()
            o = c["fn"]()
            sync()
            r["first_call_s"] = round(time.time() - t1, 3)
            outs[name] = c["to_bshd"](o)
        except Exception as e:  # noqa: BLE001
            r.update(ok=False, error=short(e, 400))
            log(f"{name}: the call failed: {r['error']}")
            del cands[name]
            failed = True
            with contextlib.suppress(Exception):
                sync()
            continue
        if c.get("lse_fn"):
            try:
                _, lses[name] = c["lse_fn"]()
                sync()
            except Exception as e:  # noqa: BLE001
                r["lse_note"] = f"return_lse=True failed: {short(e, 200)}"
                failed = True
    if lib is not None:
        with contextlib.suppress(Exception):
            for row in lib.coverage():
                if row["entry"] == "attention_kvcache":
                    log(f"ours coverage: kvcache paged={row['problem'].get('paged')} calls {row['calls']} -> "
                        + (row["label"] or f"fallback: {row['fallback']}"))

    def errors(o, ref):
        """(max |o - ref|, max(|o - ref| - rtol*|ref|)), NaN counted as inf."""
        d = (o.float() - ref).abs().nan_to_num(float("inf"))
        return d.max().item(), (d - rtol * ref.abs()).max().item()

    err = {n: 0.0 for n in outs}
    exc = {n: -math.inf for n in outs}
    nonfinite = {n: 0 for n in outs}
    lse_err = {n: 0.0 for n in lses}
    lse_inf_bad = {n: False for n in lses}
    for b in range(B):
        ref, rlse = reference_seq(torch, q[b].transpose(0, 1), k[b].transpose(0, 1), v[b].transpose(0, 1), causal,
                                  scale)
        ref = ref.transpose(0, 1)  # [S, H, D]
        for n in outs:
            o = outs[n][b]
            nonfinite[n] += int((~torch.isfinite(o)).sum().item())
            e, x = errors(o, ref)
            err[n], exc[n] = max(err[n], e), max(exc[n], x)
        fin = torch.isfinite(rlse)
        for n in lses:
            l = lses[n][b].float()
            lse_inf_bad[n] |= not bool(torch.equal(torch.isneginf(l), ~fin))
            if fin.any():
                lse_err[n] = max(lse_err[n], (l[fin] - rlse[fin]).abs().nan_to_num(float("inf")).max().item())
        del ref, rlse
    for n in outs:
        ok = exc[n] <= atol and nonfinite[n] == 0
        res[n].update(max_err=err[n], max_excess=exc[n], nonfinite=nonfinite[n])
        if n in cands and cands[n].get("lse_fn"):
            lok = n in lses and lse_err[n] <= args.lse_atol and not lse_inf_bad[n]
            res[n].update(lse_err=lse_err.get(n), lse_ok=lok)
            ok = ok and lok
        res[n]["ok"] = ok
        log(f"check {'ok  ' if ok else 'FAIL'} {n:<22} max err {err[n]:.2e}, beyond {rtol:g}*|ref| "
            f"{exc[n]:.2e} (<= {atol:g})"
            + (f", {nonfinite[n]} non-finite" if nonfinite[n] else "")
            + (f"; lse err {lse_err[n]:.2e} (<= {args.lse_atol:g})" + (", -inf rows differ" if lse_inf_bad[n] else "")
               if n in lses else "")
            + (f"; {res[n]['lse_note']}" if res[n].get("lse_note") else ""))
        failed |= not ok
    outs.clear()
    lses.clear()

    # ---- the ragged batch through the kvcache op: paged (a fresh table) and contiguous
    ragged = {}
    want = [n for n in ("ours_paged", "ours_contig") if n in cands]
    if want:
        RB, rl = cp.ragged_b, cp.ragged_lens
        rg = torch.Generator(device=dev).manual_seed(args.seed + 7)
        rq = torch.randn(RB, S, H, D, device=dev, dtype=dt, generator=rg)
        rk = torch.randn(RB, Sk, Hkv, D, device=dev, dtype=dt, generator=rg)
        rv = torch.randn(RB, Sk, Hkv, D, device=dev, dtype=dt, generator=rg)
        rlens = torch.tensor(rl, dtype=torch.int32, device=dev)
        routs = {}
        for n in want:
            try:
                if n == "ours_paged":
                    ck, cv, ct = build_pages(torch, rk, rv, rl, page, args.seed + 9)
                else:
                    ck, cv, ct = nan_past(torch, rk, rl), nan_past(torch, rv, rl), None
                out = torch.full_like(rq, float("nan"))
                lse = torch.full((RB, H, S), float("nan"), dtype=torch.float32, device=dev)
                lib.ops.attention_kvcache_into(rq, ck, cv, rlens, ct, out, lse, scale, bool(causal))
                sync()
                routs[n] = (out, lse)
                del ck, cv
            except Exception as e:  # noqa: BLE001
                ragged[n] = {"ok": False, "error": short(e, 400)}
                log(f"ragged {n}: the call failed: {ragged[n]['error']}")
                with contextlib.suppress(Exception):
                    sync()
        st = {n: {"max_err": 0.0, "max_excess": -math.inf, "nonfinite": 0, "lse_err": 0.0, "lse_inf_bad": False,
                  "keyless_not_zero": 0} for n in routs}
        for b in range(RB):
            n_k = rl[b]
            ref, rlse = reference_seq(torch, rq[b].transpose(0, 1), rk[b, :n_k].transpose(0, 1),
                                      rv[b, :n_k].transpose(0, 1), causal, scale)
            ref = ref.transpose(0, 1)  # [S, H, D]
            fin = torch.isfinite(rlse)  # [H, S]
            for n, (out, lse) in routs.items():
                s_ = st[n]
                o = out[b]
                s_["nonfinite"] += int((~torch.isfinite(o)).sum().item())
                e, x = errors(o, ref)
                s_["max_err"], s_["max_excess"] = max(s_["max_err"], e), max(s_["max_excess"], x)
                keyless = ~fin.transpose(0, 1)  # [S, H]: rows that see no key
                if keyless.any():
                    s_["keyless_not_zero"] += int((o[keyless] != 0).any(dim=-1).sum().item())
                l = lse[b]
                s_["lse_inf_bad"] |= not bool(torch.equal(torch.isneginf(l), ~fin))
                if fin.any():
                    s_["lse_err"] = max(s_["lse_err"], (l[fin] - rlse[fin]).abs().nan_to_num(float("inf")).max().item())
            del ref, rlse
        for n, s_ in st.items():
            ok = (s_["max_excess"] <= atol and s_["nonfinite"] == 0 and s_["keyless_not_zero"] == 0
                  and not s_["lse_inf_bad"] and s_["lse_err"] <= args.lse_atol)
            ragged[n] = dict(s_, ok=ok)
            log(f"ragged {'ok  ' if ok else 'FAIL'} {n:<15} b={RB} lens {rl}: max err {s_['max_err']:.2e}, beyond "
                f"{rtol:g}*|ref| {s_['max_excess']:.2e} (<= {atol:g}); lse err {s_['lse_err']:.2e}"
                + (", -inf rows differ" if s_["lse_inf_bad"] else "")
                + (f"; {s_['nonfinite']} non-finite (NaN past a length let through, or rows unwritten)"
                   if s_["nonfinite"] else "")
                + (f"; {s_['keyless_not_zero']} keyless rows not zero" if s_["keyless_not_zero"] else ""))
        for n, r in ragged.items():
            res[n]["ragged"] = r
            if not r["ok"]:
                res[n]["ok"] = False
                failed = True
        routs.clear()
        del rq, rk, rv

    if dev != "cuda":
        for n, r in res.items():
            print(f"{n:<22} {'ok' if r.get('ok') else 'FAIL'} max err {r.get('max_err', float('nan')):.2e}"
                  + (f" ({r['error']})" if r.get("error") else ""))
        for n, why in skipped.items():
            print(f"{n:<22} skipped: {why}")
        print("no timing on the CPU")
        return 1 if failed else 0
    torch.cuda.empty_cache()

    # ---- timing
    capture_failed, timing_failed, before, after = peer_common.time_contenders(torch, cands, res, args, ("sdpa",))
    failed = failed or capture_failed or timing_failed

    # ---- numbers
    peer_common.summarise(res, "ours_paged", args.rounds, lambda n: cp.flops, "paged_x")
    for r in res.values():
        if r.get("us"):
            r["gbps"] = cp.bytes / (r["us"] * 1e3)

    def headline(key, label, n, target, over=None):
        """X's time / ours_paged's (or / `over`'s), with the per-round range."""
        rx, ro = res.get(n, {}), res.get(over or "ours_paged", {})
        if not (rx.get("us") and ro.get("us")):
            return
        h = {"label": label, "contender": n, "over": over or "ours_paged", "ratio": rx["us"] / ro["us"],
             "target": target}
        xs, os_ = rx.get("samples_us") or [], ro.get("samples_us") or []
        if xs and len(xs) == len(os_) and not rx.get("screen_only"):
            rr = [a / b for a, b in zip(xs, os_)]
            h["min"], h["max"] = min(rr), max(rr)
        headlines[key] = h

    headlines = {}
    headline("paged_vs_contig", "paged / contiguous", "ours_contig", TARGETS["paged_vs_contig"])
    headline("vs_fa4", "ours vs FA4 (contiguous)", "fa4", TARGETS["vs_fa4"])
    ours_timed = [n for n in OURS if res.get(n, {}).get("us")]
    if ours_timed and res.get("fa4", {}).get("us"):
        best = min(ours_timed, key=lambda n: res[n]["us"])
        if best != "ours_paged":
            headline("vs_fa4_best_ours", f"ours vs FA4 (contiguous), best of ours ({best})", "fa4", TARGETS["vs_fa4"],
                     over=best)
    headline("paged_vs_dense", "paged / dense build", "ours_dense", TARGETS["paged_vs_dense"])
    torch_timed = [n for n in res if res[n].get("group") == "sdpa" and res[n].get("samples_us")]
    if torch_timed:
        b_ = min(torch_timed, key=lambda n: res[n]["us"])
        headline("vs_pytorch_best", f"ours vs PyTorch's best ({b_})", b_, TARGETS["vs_pytorch_best"])

    if args.json:
        out = {"problem": spec_str(p), "dense_problem": spec_str(p, False), "flops": cp.flops, "bytes": cp.bytes,
               "cache_seqlens": [Sk] * B, "block_table": [B, cp.per], "pages": [cp.num_pages, page, Hkv, D],
               "spare_pages": SPARE_PAGES, "ragged_lens": cp.ragged_lens, "env": env,
               "settings": {k_: getattr(args, k_) for k_ in ("rounds", "min_seconds", "screen_seconds", "calls", "seed",
                                                              "all_rounds", "lse_atol")},
               "atol": atol, "rtol": rtol, "contenders": res, "skipped": skipped, "headlines": headlines,
               "gpu_before": before, "gpu_after": after, "failed": failed}
        peer_common.write_json(args.json, out)

    # ---- the table, last
    print(f"\n{spec_str(p)}  ({B} x {S} new rows over {Sk} keys; {cp.flops / 1e12:.3f} TFLOP useful, "
          f"{cp.bytes / 1e6:.0f} MB per call)")
    print(f"{'contender':<22} {'median us':>10} {'TFLOP/s':>8} {'GB/s':>7} {'paged/X':>8} {'per round':>13}  "
          f"check (max err)")
    for n, r in res.items():
        rng = (f"{r['paged_x_min']:.3f}-{r['paged_x_max']:.3f}" if r.get("paged_x_min") else
               ("screen only" if r.get("screen_only") else ""))
        chk = ("ok" if r.get("ok") else "FAIL") + (f" {r['max_err']:.1e}" if "max_err" in r else "")
        if r.get("ragged"):
            chk += "; ragged " + ("ok" if r["ragged"].get("ok") else "FAIL")
        print(f"{n[:22]:<22} {fmt(r.get('us'), 10, '.1f')} {fmt(r.get('tflops'), 8, '.1f')} "
              f"{fmt(r.get('gbps'), 7, '.0f')} {fmt(r.get('paged_x'), 8, '.3f')} {rng:>13}  {chk}"
              + (f"  ({r['error'][:80]})" if r.get("error") else ""))
    for n, why in skipped.items():
        print(f"{n[:22]:<22} skipped: {why[:160]}")
    for h in headlines.values():
        rng = f" (per round {h['min']:.3f}-{h['max']:.3f})" if "min" in h else ""
        print(f"{h['label']}: {h['ratio']:.3f}{rng}  [{h['contender']} time / {h['over']} time; target: "
              f">= {h['target']}] {'met' if h['ratio'] >= h['target'] else 'MISSED'}")
    print(f"gpu before timing: {before or 'n/a'}; after: {after or 'n/a'}")
    print("paged/X = X's median time / ours_paged's (> 1: ours_paged is faster); TFLOP/s of the useful work "
          "(4*h*d*visible pairs, bottom-right causal)")
    if failed:
        print("FAILED: a correctness check or a contender's call failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
