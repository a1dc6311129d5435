"""The PyTorch ops on a GPU (label gpu;torch): values, torch.compile, CUDA graphs, and the op's cost.

The package is $ATTNTUNE_TORCH_PKG (a directory `attntune export --torch` wrote), else one exported
here from $ATTNTUNE_TORCH_DB (default tests/data/campaigns/h100-suite.db) in $ATTNTUNE_TORCH_DTYPE
(default bf16). For every kernel of
it, on the problem it was tuned for and on odd shapes near it:
  - values: NaN-poisoned out, against float64 (FlashAttention-2's criterion; compare_sdpa.py's
    reference), with LSE; [B,S,H,D] views; GQA; through attention_kvcache (paged with shuffled block
    tables and ragged lengths, and contiguous) for kernels that serve it (a chunked-prefill kernel,
    tuned on a paged problem of more than 16 rows, through it alone); every call must have run a
    kernel (coverage), none fallen back;
  - torch.compile(fullgraph=True) (inductor) and a captured CUDA graph replayed on new inputs give
    the eager op's values bit for bit;
  - time: the op against the raw C entry point (ctypes) on the same library, both captured in CUDA
    graphs, interleaved rounds of >= --min-seconds; the op must be within 3% (ATTNTUNE_OP_MAX_COST).
Prints a table last.

  ATTNTUNE_TORCH_PKG=pkg python3 tests/torch/test_ops_gpu.py [--min-seconds 1.0] [--rounds 4]
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
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return SKIP

    work = tempfile.mkdtemp(prefix="attntune-torch-gpu-")
    os.environ.setdefault("ATTNTUNE_TORCH_CACHE", os.path.join(work, "cache"))
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
            return 1
    os.environ["ATTNTUNE_TORCH_NO_AUTOLOAD"] = "1"
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
    dense = [k["problem"] for k in lib.kernels() if not k["problem"].get("varlen")]
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
    kv_kernels = [k["problem"] for k in lib.kernels() if cs.problem_str(k["problem"]) in kv_problems]
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
            if p.get("varlen"):
                continue  # timed against the peers by tools/compare_varlen.py
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
    print(f"\n{'PASSED' if not failures else 'FAILED'}: {len(failures)} failure(s)")
    for m in failures:
        print(f"  {m}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
