#!/usr/bin/env python3
"""The backward pass (issue 45): an exported package's attention backward kernel against SDPA's (cuDNN and
the flash backend, FlashAttention-2), the same inputs, one process, interleaved.

For each shape (b, h, hkv, s, d, causal; s = sk; [B, S, H, D] bf16 or fp16 tensors) both sides run
their forward once with autograd, then only the backward is timed: torch.autograd.grad of the output
with a fixed dO and retain_graph, so each sample is the backward's kernels alone (attntune's
attention_backward op; SDPA's backward kernel). A shape whose backward no kernel of the package
serves (explain("attention_backward")) is refused, never timed through the fallback; the forward
may fall back to SDPA (a package of backward kernels alone). Before timing, ours is checked against float64
autograd by FlashAttention-2's criterion (bounded by SDPA's own error), so a fast wrong kernel
fails the row.

Timing: --rounds interleaved rounds after a warm-up (the order reversed every other round), each
sample back-to-back calls between two events for >= --min-seconds (a backward call is milliseconds:
launch gaps are noise, and autograd does not capture into CUDA graphs from the default stream); the
median of each. TFLOP/s count 2.5x the forward's FLOPs (FlashAttention's convention), causal halved
exactly (bottom-right).

    PYTHONPATH=PKG python3 tools/compare_bwd.py --shapes 1,16,16,8192,128,0;... [--dtype bf16] [--deterministic]
        [--fa4-aot .fa4/aot [--fa4-kit .fa4]] [--dry-run]
    PYTHONPATH=PKG python3 tools/compare_bwd.py --varlen b=8,h=16,hkv=4,s=2048,d=128,dtype=bf16,causal=1,varlen=256 [...]

--varlen SPEC (repeatable; beside or instead of --shapes): a packed batch's backward, attntune's varlen
problem spec (the lengths attntune's generator draws: tools/compare_varlen.py), [total, H, D] tensors
and cu_seqlens. Ours: attntune.attention_varlen through autograd (attention_backward_varlen's kernel;
a batch no backward kernel serves is refused). Peers, each through autograd, backward only timed:
FlashAttention-4's varlen backward (--fa4-aot: a kit folder whose backward entries were built with
tools/fa4_bwd_varlen.patch, `--bwd-problem SPEC` with varlen=N), torch's own varlen_attn
(torch.nn.attention.varlen, FlashAttention-2's varlen kernels; GQA by repeated K/V heads when it
takes no enable_gqa), SDPA one call per sequence on views of the packed tensors
(cuDNN; the backward runs B kernels), and SDPA on the right-padded batch (cuDNN, causal with sk = s
only, where one causal mask is each sequence's own on its rows; padding not timed). Checked first
against a float64 reference per sequence (FlashAttention-2's criterion against the dtype's own).
TFLOP/s count the visible pairs of the sequences (2.5x the forward's).

--deterministic times ours in the backward's deterministic mode (bit-identical gradients; a package
kernel must serve a deterministic call, else the row is refused).

FlashAttention-4 (--fa4-aot DIR, repeatable, or FA4_AOT=DIR[:DIR]): FA4's sm90 backward as a fourth
contender, AOT-built by the FA4 kit with tools/fa4_bwd.patch applied (`.fa4/build_aot.py --out
.fa4/aot --suite none --bwd-problem SPEC [--bwd-deterministic]`; docs/design/backward.md "Peers")
and run through tvm_ffi: on the same q, k, v and dO ([B,S,H,D], contiguous), FA4's own forward
(the kernel its training path runs, which writes the LSE) gives O and the LSE once, outside the
timing; each timed call runs FA4's backward kernels as its interface does (preprocess, main, dQ
postprocess, GQA's dK/dV postprocesses; dq, dk, dv and the workspaces allocated per call, zeroed
where FA4 zeroes them). It is checked against float64 by the same criterion before timing, and a
wrong one is not timed. With --deterministic, FA4's deterministic mode. A shape the kit has no
kernels for prints "fa4: not built for this shape" and runs without it. Without --fa4-aot or
FA4_AOT nothing changes. --dry-run prints each shape's FA4 kernels in launch order, the arguments
checked against each kernel's parameter list, and the workspaces, without torch or a GPU.
"""
import argparse
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (no torch at import)


def sample(fn, min_seconds):
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = max(1, int(min_seconds / max(time.perf_counter() - t0, 1e-6)))
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3 / reps


def time_rows(fns, a):
    """The median of each contender's samples over a.rounds interleaved rounds after a warm-up round (the
    order reversed every other round)."""
    times = {n: [] for n in fns}
    order = list(fns)
    for r in range(a.rounds + 1):
        for n in (order if r % 2 == 0 else order[::-1]):
            t = sample(fns[n], a.min_seconds)
            if r > 0:
                times[n].append(t)
    return {n: statistics.median(x) for n, x in times.items()}


def row_line(name, med, fwd_flops, tail=""):
    """A row: each contender's time and TFLOP/s (2.5x the forward's FLOPs), ours against the best peer
    (and against FA4 and cuDNN where they ran: issue 45's bars name both), then `tail`."""
    tf = {n: 2.5 * fwd_flops / t / 1e6 for n, t in med.items()}
    best = min((t for n, t in med.items() if n != "ours"), default=float("nan"))
    return (f"{name}: " + "  ".join(f"{n} {med[n]:.0f} us {tf[n]:.0f} TF" for n in med) +
            f"  ours/best-peer {best / med['ours']:.3f}x" +
            "".join(f"  ours/{n} {med[n] / med['ours']:.3f}x" for n in ("fa4", "cudnn") if n in med) + tail)


def reference_grads(q, k, v, do, causal, dtype):
    """Plain attention's gradients in `dtype` ([B, S, H, D]; GQA by repeating K/V)."""
    import torch

    xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    qq, kk, vv = (x.transpose(1, 2) for x in xs)
    rep = qq.shape[1] // kk.shape[1]
    kk, vv = kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)
    s = (qq @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).tril(m - n).logical_not(), float("-inf"))
    o = (torch.softmax(s.float(), -1).to(dtype) @ vv).transpose(1, 2)
    return torch.autograd.grad(o, xs, do.to(dtype))


def parse_shapes(text):
    out = []
    for tok in filter(None, text.split(";")):
        try:
            b, h, hkv, s, d, causal = (int(x) for x in tok.split(","))
        except ValueError:
            raise ValueError(f"--shapes: {tok!r} is not b,h,hkv,s,d,causal") from None
        out.append((b, h, hkv, s, d, causal))
    return out


def fa4_dirs(a):
    """The FA4 kernel folders asked for: --fa4-aot, else FA4_AOT (colon-separated); [] = no FA4."""
    return a.fa4_aot or [d for d in os.environ.get("FA4_AOT", "").split(":") if d]


def fa4_problem(K, b, h, hkv, s, d, causal, dtype):
    return K.parse_problem(f"b={b},h={h},hkv={hkv},s={s},d={d},dtype={dtype},causal={causal}")


def load_fa4(a):
    """(fa4kit, None) or (None, why not) for the kit beside the --fa4-aot folders (or --fa4-kit)."""
    kit_args = argparse.Namespace(fa4_aot=fa4_dirs(a), fa4_kit=a.fa4_kit)
    K, _, why = peer_common.load_kit(kit_args, lambda K: hasattr(K, "find_bwd") and hasattr(K.FA4Aot, "make_bwd"),
                                     "{kit}/fa4kit.py has no backward (apply tools/fa4_bwd.patch to the kit copy)")
    return K, why


def dry_run(a, shapes, batches):
    """Each shape's FA4 backward: its kernels in launch order, checked against their parameter lists."""
    K, why, ok = None, "not asked for (--fa4-aot DIR or FA4_AOT)", True
    if fa4_dirs(a):
        K, why = load_fa4(a)
    mans = []
    if K is not None:
        mans, errs = K.load_manifests(fa4_dirs(a))
        for e in errs:
            print(f"fa4: {e}")
    for b, h, hkv, s, d, causal in shapes:
        name = f"b{b} h{h}/{hkv} s{s} d{d} {a.dtype}{' causal' if causal else ''}"
        if K is None:
            print(f"{name}: fa4: {why}")
            continue
        p = fa4_problem(K, b, h, hkv, s, d, causal, a.dtype)
        man, ent, how = K.find_bwd(mans, p, a.deterministic)
        if ent is None:
            print(f"{name}: fa4: not built for this shape ({how})")
            continue
        good, lines = K.plan_fa4_bwd(man, ent)
        ok &= good
        f = ent["fa4"]
        print(f"{name}: fa4 ({man['_dir']}): tile {f['m_block_size']}x{f['n_block_size']}, {f['num_threads']} threads"
              + (", deterministic" if ent.get("deterministic") else ""))
        for x in lines:
            print("    " + x)
    for bt in batches:
        p = bt.p
        name = f"varlen b{p['b']} h{p['h']}/{p['hkv']} d{p['d']} {p['dtype']}{' causal' if p['causal'] else ''}"
        print(f"{name}: query lengths {min(bt.lq)}..{bt.max_q} (total {bt.total_q}), key lengths "
              f"{min(bt.lk)}..{bt.max_k} (total {bt.total_k}); peers torch_varlen, sdpa_loop_cudnn"
              + (", sdpa_padded_cudnn" if p["causal"] and p["sk"] == p["s"] else ""))
        if K is None:
            print(f"{name}: fa4: {why}")
            continue
        if not hasattr(K, "bwd_input_names"):
            print(f"{name}: fa4: the kit builds no varlen backward (apply tools/fa4_bwd_varlen.patch to it)")
            continue
        man, ent, how = K.find_bwd(mans, K.parse_problem(bt.spec, allow_varlen=True), a.deterministic)
        if ent is None:
            print(f"{name}: fa4: not built for this batch ({how})")
            continue
        good, lines = K.plan_fa4_bwd(man, ent)
        ok &= good
        print(f"{name}: fa4 ({man['_dir']}): tile {ent['fa4']['m_block_size']}x{ent['fa4']['n_block_size']}")
        for x in lines:
            print("    " + x)
    print("plan only (--dry-run): ours is the package's attention_backward (PYTHONPATH), cudnn and flash SDPA's")
    return 0 if ok else 1


def varlen_batch(spec):
    """--varlen SPEC: compare_varlen's Batch (the lengths attntune draws; .spec the text), or ValueError
    saying why not."""
    from compare_varlen import Batch, parse_spec

    p = parse_spec(spec)
    if not p["varlen"]:
        raise ValueError(f"problem {spec!r}: names no varlen=N (a packed batch)")
    if p["hkv"] != p["h"] and p["h"] % p["hkv"]:
        raise ValueError(f"problem {spec!r}: h is not a multiple of hkv")
    bt = Batch(p)
    bt.spec = spec
    return bt


def varlen_row(a, bt, dt, fa=None, K=None):
    """One packed batch (--varlen SPEC): ours and the peers' backward, checked, then timed (fa: the FA4
    kit's FA4Aot, whose varlen backward entries tools/fa4_bwd_varlen.patch builds). Returns (line,
    failures)."""
    import inspect

    import torch
    import torch.nn.functional as F
    import attntune
    from torch.nn.attention import SDPBackend, sdpa_kernel

    p = bt.p
    h, hkv, d, causal = p["h"], p["hkv"], p["d"], p["causal"]
    g = torch.Generator(device="cuda").manual_seed(p["b"] * 7 + p["s"])
    q = torch.randn(bt.total_q, h, d, device="cuda", dtype=dt, generator=g).requires_grad_()
    k = torch.randn(bt.total_k, hkv, d, device="cuda", dtype=dt, generator=g).requires_grad_()
    v = torch.randn(bt.total_k, hkv, d, device="cuda", dtype=dt, generator=g).requires_grad_()
    do = torch.randn(bt.total_q, h, d, device="cuda", dtype=dt, generator=g)
    cu_q = torch.tensor(bt.cq, dtype=torch.int32, device="cuda")
    cu_k = torch.tensor(bt.ck, dtype=torch.int32, device="cuda")
    name = f"varlen b{p['b']} h{h}/{hkv} d{d} {a.dtype}{' causal' if causal else ''} (q {min(bt.lq)}..{bt.max_q}, total {bt.total_q})"
    kernel, why = attntune.default().explain("attention_backward_varlen", a.dtype, d, causal, p["b"], h, hkv,
                                             bt.max_q, bt.max_k, deterministic=a.deterministic)
    if kernel < 0:
        return f"{name}: no backward kernel of the package serves it ({why})", 1
    out = attntune.attention_varlen(q, k, v, cu_q, cu_k, bt.max_q, bt.max_k, is_causal=causal,
                                    deterministic=a.deterministic)
    ours = lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
    fns, notes, failures = {"ours": ours}, [], 0
    # FA4's varlen backward (the kit, with tools/fa4_bwd_varlen.patch): its own varlen forward gives O and
    # the LSE ([H, total_q]) once, outside the timing; each call runs its backward's kernels.
    fa4 = None
    if fa is not None:
        try:
            if not hasattr(K, "bwd_input_names"):
                raise RuntimeError("the kit builds no varlen backward (apply tools/fa4_bwd_varlen.patch to it)")
            p4 = K.parse_problem(bt.spec, allow_varlen=True)
            _, ent, how = fa.lookup_bwd(p4, a.deterministic)
            if ent is None:
                raise RuntimeError(f"not built for this batch ({how})")
            qf, kf, vf = (x.detach() for x in (q, k, v))
            cus = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
            o4, lse4 = fa.make_fwd_lse(p4, qf, kf, vf, deterministic=a.deterministic, **cus)()
            fa4 = fa.make_bwd(p4, qf, kf, vf, o4, do, lse4, deterministic=a.deterministic, **cus)
            fa4()
        except Exception as e:  # noqa: BLE001  no entry for the batch, or a kit that cannot run here: say so
            fa4 = None
            notes.append(f"fa4: {type(e).__name__}: {str(e)[:160]}")
    check = ""
    if not a.no_check:
        atol = 1 / 512 if a.dtype == "bf16" else 1 / 4096
        refs = []
        for i in range(p["b"]):
            sq, sk_ = slice(bt.cq[i], bt.cq[i + 1]), slice(bt.ck[i], bt.ck[i + 1])
            args = [x[sl][None] for x, sl in ((q, sq), (k, sk_), (v, sk_), (do, sq))]
            refs.append(((sq, sk_, sk_), reference_grads(*args, causal, torch.float64),
                         reference_grads(*args, causal, dt)))

        def wrong(got):
            bad = set()
            for sls, ref, low in refs:
                for n, x, sl, r, lo in zip(("dq", "dk", "dv"), got, sls, ref, low):
                    xs = x[sl][None].double()
                    if not torch.isfinite(xs).all() or (xs - r).abs().max() > 2 * (lo.double() - r).abs().max() + atol:
                        bad.add(n)
            return bad

        bad = wrong(ours())
        check = "ok" if not bad else "WRONG " + ",".join(sorted(bad))
        failures += bool(bad)
        if fa4 is not None:
            bad4 = wrong(fa4())
            check += " fa4 " + ("ok" if not bad4 else "WRONG " + ",".join(sorted(bad4)))
            if bad4:  # a wrong peer is not timed
                failures += 1
                fa4 = None
        del refs
    if fa4 is not None:
        fns["fa4"] = fa4
    # torch's varlen_attn (FlashAttention-2's varlen kernels), where this torch has it.
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
        kw, kq, vq, label = {}, k, v, "torch_varlen"
        if "is_causal" in params:
            kw["is_causal"] = causal
        elif causal:
            kw["window_size"] = (-1, 0)
        if hkv != h:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                kq, vq, label = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1), "torch_varlen+kvrep"
        o_tv = varlen_attn(q, kq, vq, cu_q, cu_k, bt.max_q, bt.max_k, **kw)
        fns[label] = lambda: torch.autograd.grad(o_tv, (q, k, v), do, retain_graph=True)  # noqa: E731
        fns[label]()
    except Exception as e:  # noqa: BLE001  not in this torch, or it refuses the batch
        fns.pop("torch_varlen", None)
        fns.pop("torch_varlen+kvrep", None)
        notes.append(f"torch_varlen: {type(e).__name__}: {str(e)[:100]}")
    # SDPA one call a sequence ([1, H, len, D] views of the packed tensors), cuDNN.
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            outs = []
            for i in range(p["b"]):
                sq, sk_ = slice(bt.cq[i], bt.cq[i + 1]), slice(bt.ck[i], bt.ck[i + 1])
                outs.append(F.scaled_dot_product_attention(
                    q[sq].transpose(0, 1)[None], k[sk_].transpose(0, 1)[None], v[sk_].transpose(0, 1)[None],
                    is_causal=causal and bt.lq[i] == bt.lk[i], enable_gqa=hkv != h,
                    attn_mask=None if not causal or bt.lq[i] == bt.lk[i] else torch.ones(
                        bt.lq[i], bt.lk[i], dtype=torch.bool, device="cuda").tril(bt.lk[i] - bt.lq[i])))
        dos = [do[bt.cq[i]:bt.cq[i + 1]].transpose(0, 1)[None] for i in range(p["b"])]
        fns["sdpa_loop_cudnn"] = lambda: torch.autograd.grad(outs, (q, k, v), dos, retain_graph=True)  # noqa: E731
        fns["sdpa_loop_cudnn"]()
    except Exception as e:  # noqa: BLE001
        fns.pop("sdpa_loop_cudnn", None)
        notes.append(f"sdpa_loop_cudnn: {type(e).__name__}: {str(e)[:100]}")
    # SDPA on the right-padded batch, cuDNN: causal with sk = s only (one causal mask is each
    # sequence's own on its valid rows, and hides the padded keys from them).
    if causal and p["sk"] == p["s"]:
        try:
            def pad(x, c, lens, m):
                y = x.new_zeros(p["b"], m, x.shape[1], d)
                for i in range(p["b"]):
                    y[i, :lens[i]] = x[c[i]:c[i + 1]]
                return y.transpose(1, 2).detach().requires_grad_()
            qp, kp, vp = pad(q, bt.cq, bt.lq, bt.max_q), pad(k, bt.ck, bt.lk, bt.max_k), pad(v, bt.ck, bt.lk, bt.max_k)
            dop = pad(do, bt.cq, bt.lq, bt.max_q).detach()
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o_p = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=hkv != h)
            fns["sdpa_padded_cudnn"] = lambda: torch.autograd.grad(o_p, (qp, kp, vp), dop, retain_graph=True)  # noqa: E731
            fns["sdpa_padded_cudnn"]()
        except Exception as e:  # noqa: BLE001
            fns.pop("sdpa_padded_cudnn", None)
            notes.append(f"sdpa_padded_cudnn: {type(e).__name__}: {str(e)[:100]}")
    line = row_line(name, time_rows(fns, a), bt.flops,
                    (f"  check {check}" if check else "") + "".join(f"  ({x})" for x in notes))
    return line, failures


def main():
    ap = peer_common.Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="", help="b,h,hkv,s,d,causal;...")
    ap.add_argument("--varlen", action="append", default=[], help="a packed batch's problem spec (repeatable)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--deterministic", action="store_true",
                    help="ours with attention(..., deterministic=True): the backward's deterministic mode, timed")
    ap.add_argument("--fa4-aot", action="append", default=[],
                    help="FA4 kit kernel folder with backward entries (repeatable; default $FA4_AOT, else no FA4)")
    ap.add_argument("--fa4-kit", help="folder with the kit's fa4kit.py (default: beside --fa4-aot, else .fa4)")
    ap.add_argument("--dry-run", action="store_true", help="print the FA4 plan of each shape; no torch, no GPU")
    a = ap.parse_args()
    try:
        shapes = parse_shapes(a.shapes)
    except ValueError as e:
        ap.error(str(e))
    if not shapes and not a.varlen:
        ap.error("give --shapes or --varlen")
    batches = []
    for spec in a.varlen:
        try:
            batches.append(varlen_batch(spec))
        except ValueError as e:
            ap.error(f"--varlen: {e}")
        if batches[-1].p["dtype"] != a.dtype:
            ap.error(f"--varlen {spec!r}: dtype {batches[-1].p['dtype']} is not --dtype {a.dtype}")
    if a.dry_run:
        sys.exit(dry_run(a, shapes, batches))
    import torch
    import torch.nn.functional as F
    from gpu_timing import gpu_state
    import attntune
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # The forward may fall back to SDPA (a package of backward kernels alone); the backward must run
    # a kernel: explain() says which, and a row whose backward would fall back is refused.
    attntune.default().set_policy("sdpa", 1e9)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    print(f"GPU: {torch.cuda.get_device_name()} ({gpu_state()}); torch {torch.__version__}", flush=True)
    fa, K = None, None
    if fa4_dirs(a):
        K, why = load_fa4(a)
        if K is not None:
            try:
                fa = K.FA4Aot(fa4_dirs(a))
            except Exception as e:  # noqa: BLE001  no manifest, no runtime, no tvm_ffi wheel for this Python
                why = f"{type(e).__name__}: {e}"
        if fa is None:
            print(f"fa4: skipped: {why}", flush=True)
    rows, failures = [], 0
    for b, h, hkv, s, d, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(b * 7 + s)
        q = torch.randn(b, s, h, d, device="cuda", dtype=dt, generator=g).requires_grad_()
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=dt, generator=g).requires_grad_()
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=dt, generator=g).requires_grad_()
        do = torch.randn(b, s, h, d, device="cuda", dtype=dt, generator=g)
        name = f"b{b} h{h}/{hkv} s{s} d{d} {a.dtype}{' causal' if causal else ''}"
        kernel, why = attntune.default().explain("attention_backward", a.dtype, d, bool(causal), b, h, hkv, s, s,
                                                 deterministic=a.deterministic)
        if kernel < 0:
            print(f"{name}: no backward kernel of the package serves it ({why})", flush=True)
            failures += 1
            continue
        out = attntune.attention(q, k, v, is_causal=bool(causal), layout="bshd", deterministic=a.deterministic)
        ours = lambda out=out: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)  # noqa: E731
        fa4, fa4_note = None, ""
        if fa is not None:
            p4 = fa4_problem(K, b, h, hkv, s, d, causal, a.dtype)
            _, ent, how = fa.lookup_bwd(p4, a.deterministic)
            if ent is None:
                fa4_note = f"fa4: not built for this shape ({how})"
            else:
                try:
                    qf, kf, vf = (x.detach() for x in (q, k, v))  # [B,S,H,D] contiguous, FA4's layout
                    o4, lse4 = fa.make_fwd_lse(p4, qf, kf, vf, deterministic=a.deterministic)()
                    fa4 = fa.make_bwd(p4, qf, kf, vf, o4, do, lse4, deterministic=a.deterministic)
                    fa4()
                except Exception as e:  # noqa: BLE001  a kit that cannot run its kernels here: say so, time the rest
                    fa4, fa4_note = None, f"fa4: failed to run ({type(e).__name__}: {str(e)[:160]})"
                    failures += 1
            if fa4_note:
                print(f"  {name}: {fa4_note}", flush=True)
        check = ""
        if not a.no_check and b * h * s * s <= 2**31:
            ref = reference_grads(q, k, v, do, causal, torch.float64)
            low = reference_grads(q, k, v, do, causal, dt)
            atol = 1 / 512 if a.dtype == "bf16" else 1 / 4096

            def wrong(got):
                return [n for n, x, r, lo in zip(("dq", "dk", "dv"), got, ref, low)
                        if not torch.isfinite(x).all() or
                        (x.double() - r).abs().max() > 2 * (lo.double() - r).abs().max() + atol]

            bad = wrong(ours())
            check = "ok" if not bad else "WRONG " + ",".join(bad)
            failures += bool(bad)
            if fa4 is not None:
                bad4 = wrong(fa4())
                check += " fa4 " + ("ok" if not bad4 else "WRONG " + ",".join(bad4))
                if bad4:  # a wrong peer is not timed
                    failures += 1
                    fa4 = None
            del ref, low
        fns = {"ours": ours}
        if fa4 is not None:
            fns["fa4"] = fa4
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)
        for peer, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), enable_gqa=hkv != h)
                fn = lambda o=o: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)  # noqa: E731
                fn()
                fns[peer] = fn
            except Exception as e:  # a backend that refuses the shape
                print(f"  {name}: {peer} refused ({type(e).__name__}: {str(e)[:80]})")
        fwd = 4 * b * h * d * (sum(min(s, i + 1) for i in range(s)) if causal else s * s)
        line = row_line(name, time_rows(fns, a), fwd,
                        (f"  check {check}" if check else "") + (f"  ({fa4_note})" if fa4_note else ""))
        print(line, flush=True)
        rows.append(line)
        del q, k, v, do, out, qt, kt, vt, fns, fa4
        torch.cuda.empty_cache()
    for bt in batches:
        line, bad = varlen_row(a, bt, dt, fa, K)
        print(line, flush=True)
        rows.append(line)
        failures += bad
        torch.cuda.empty_cache()
    print(f"GPU after: {gpu_state()}")
    print("\n".join(rows))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
