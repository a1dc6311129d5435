#!/usr/bin/env python3
"""MLA decode: attntune's latent-cache kernel against the same decode step expanded to plain
attention through PyTorch's SDPA (cuDNN, efficient), in one process, interleaved (issue 44's peers).

A DeepSeek-V3-like decode step has, per sequence, `sk` cached tokens and `h` query heads. Over the
latent cache (what attntune's flash_decode_wgmma reads, `latent=1`): q [b, s, h, 576], one cache
of [pages, page, 1, 576] whose first 512 dims are V, out [b, s, h, 512]; attntune.mla_decode takes
FlashMLA's arguments. Expanded (what a stack without an absorbed-latent kernel runs): every head
its own keys of 192 dims (128 decompressed + 64 rope) and values of 128, q [b, h, s, 192], k [b, h,
sk, 192], v [b, h, sk, 128], through F.scaled_dot_product_attention with one backend forced. The
two compute the same step of the model (the expanded form after decompressing the cache; the
latent form with the up-projections absorbed into q and out), so the user's measure is the time of
the step; each line also gives the kernel's own TFLOP/s (2 * b * h * s * sk * (d + dv)) and its
bytes per second (the cache it reads).

Timing: each callable captured as --calls calls in a CUDA graph, the graph replayed a fixed
--reps times per sample (no host time loop), samples of >= --min-seconds, ours and each peer in
--rounds interleaved rounds; the median of each.

    PYTHONPATH=PKG python3 tools/mla_peers.py --b 64 --h 128 --sk 8192 [--s 1] [--page 64] \
        [--expanded-cu EXP/attntune/kernels.cu]   # attntune's flash_decode on the expanded step too
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import gpu_state, timed  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--h", type=int, default=128)
    ap.add_argument("--s", type=int, default=1)
    ap.add_argument("--sk", type=int, default=8192)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--backends", default="cudnn,efficient")
    ap.add_argument("--expanded-cu", help="an export (kernels.cu) tuned for the expanded step (d=192, dv=128, "
                    "h KV heads, dense): attntune's own decode over it, as a peer")
    args = ap.parse_args()
    import attntune  # the package of `attntune export --torch` on PYTHONPATH

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    b, h, s, sk, page = args.b, args.h, args.s, args.sk, args.page
    causal = s > 1
    pages_per = (sk + page - 1) // page
    kv = torch.randn(b * pages_per, page, 1, 576, device=dev, dtype=dt)
    table = torch.randperm(b * pages_per, device=dev, dtype=torch.int32).view(b, pages_per)
    lens = torch.full((b,), sk, device=dev, dtype=torch.int32)
    q = torch.randn(b, s, h, 576, device=dev, dtype=dt)
    scale = 1.0 / (192 ** 0.5)

    def ours():
        attntune.mla_decode(q, kv, table, lens, scale=scale, is_causal=causal)

    lib = attntune.default()
    lib.set_policy("raise", 1e9)
    ours()  # raises if no latent kernel of the package serves the call
    rows = [("attntune latent (flash_decode_wgmma)", ours, 2.0 * b * h * s * sk * (576 + 512),
             kv.numel() * 2 * sk * b / (b * pages_per * page))]

    qe = torch.randn(b, h, s, 192, device=dev, dtype=dt)
    ke = torch.randn(b, h, sk, 192, device=dev, dtype=dt)
    ve = torch.randn(b, h, sk, 128, device=dev, dtype=dt)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    names = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    for name in [x for x in args.backends.split(",") if x]:
        be = names[name]

        def peer(be=be):
            with sdpa_kernel([be]):
                F.scaled_dot_product_attention(qe, ke, ve, is_causal=False, scale=scale)

        try:
            peer()
            torch.cuda.synchronize()
        except Exception as e:  # a backend that refuses the shape says so and is left out
            print(f"SDPA {name}: refused ({str(e).splitlines()[0][:120]})")
            continue
        rows.append((f"SDPA {name}, expanded (192/128, {h} KV heads)", peer, 2.0 * b * h * s * sk * (192 + 128),
                     (ke.numel() + ve.numel()) * 2))

    if args.expanded_cu:
        exp = attntune.load(args.expanded_cu, "attntune_expanded", verbose=False)
        exp.set_policy("raise", 1e9)

        def ours_expanded():
            exp.attention(qe, ke, ve, scale=scale, is_causal=causal)

        ours_expanded()
        rows.append((f"attntune flash_decode, expanded", ours_expanded, 2.0 * b * h * s * sk * (192 + 128),
                     (ke.numel() + ve.numel()) * 2))

    print(f"MLA decode b={b} h={h} s={s} sk={sk} page={page} bf16; GPU {torch.cuda.get_device_name(0)}; "
          f"state {gpu_state()}")
    times = {name: [] for name, *_ in rows}
    for r in range(args.rounds + 1):
        order = rows if r % 2 == 0 else rows[::-1]
        for name, fn, _, _ in order:
            t = timed(fn, args.calls, args.min_seconds)
            if r > 0:  # round 0 warms the GPU up
                times[name].append(t)
    base = statistics.median(times[rows[0][0]])
    print(f"{'':48s} {'us':>9s} {'TFLOP/s':>8s} {'GB/s':>8s} {'x ours':>7s}")
    for name, _, flops, nbytes in rows:
        t = statistics.median(times[name])
        print(f"{name:48s} {t:9.1f} {flops / t / 1e6:8.1f} {nbytes / t / 1e3:8.0f} {t / base:7.2f}")
    print(f"state after: {gpu_state()}")


if __name__ == "__main__":
    main()
