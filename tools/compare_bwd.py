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

--deterministic times ours in the backward's deterministic mode (bit-identical gradients; a package
kernel must serve a deterministic call, else the row is refused).
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import gpu_state  # noqa: E402


def sample(fn, min_seconds):
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


def reference_grads(q, k, v, do, causal, dtype):
    """Plain attention's gradients in `dtype` ([B, S, H, D]; GQA by repeating K/V)."""
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, help="b,h,hkv,s,d,causal;...")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--deterministic", action="store_true",
                    help="ours with attention(..., deterministic=True): the backward's deterministic mode, timed")
    a = ap.parse_args()
    import attntune
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # The forward may fall back to SDPA (a package of backward kernels alone); the backward must run
    # a kernel: explain() says which, and a row whose backward would fall back is refused.
    attntune.default().set_policy("sdpa", 1e9)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    print(f"GPU: {torch.cuda.get_device_name()} ({gpu_state()}); torch {torch.__version__}", flush=True)
    rows, failures = [], 0
    for tok in filter(None, a.shapes.split(";")):
        b, h, hkv, s, d, causal = (int(x) for x in tok.split(","))
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
        check = ""
        if not a.no_check and b * h * s * s <= 2**31:
            got = ours()
            ref = reference_grads(q, k, v, do, causal, torch.float64)
            low = reference_grads(q, k, v, do, causal, dt)
            atol = 1 / 512 if a.dtype == "bf16" else 1 / 4096
            bad = [n for n, x, r, lo in zip(("dq", "dk", "dv"), got, ref, low)
                   if not torch.isfinite(x).all() or
                   (x.double() - r).abs().max() > 2 * (lo.double() - r).abs().max() + atol]
            check = "ok" if not bad else "WRONG " + ",".join(bad)
            failures += bool(bad)
            del got, ref, low
        fns = {"ours": ours}
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
        times = {n: [] for n in fns}
        order = list(fns)
        for r in range(a.rounds + 1):
            for n in (order if r % 2 == 0 else order[::-1]):
                t = sample(fns[n], a.min_seconds)
                if r > 0:
                    times[n].append(t)
        med = {n: statistics.median(x) for n, x in times.items()}
        fwd = 4 * b * h * d * (sum(min(s, i + 1) for i in range(s)) if causal else s * s)
        tf = {n: 2.5 * fwd / t / 1e6 for n, t in med.items()}
        best = min((t for n, t in med.items() if n != "ours"), default=float("nan"))
        line = f"{name}: " + "  ".join(f"{n} {med[n]:.0f} us {tf[n]:.0f} TF" for n in med) + \
               f"  ours/best-peer {best / med['ours']:.3f}x" + (f"  check {check}" if check else "")
        print(line, flush=True)
        rows.append(line)
        del q, k, v, do, out, qt, kt, vt
        torch.cuda.empty_cache()
    print(f"GPU after: {gpu_state()}")
    print("\n".join(rows))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
