#!/usr/bin/env python3
"""A float64 model of Hopper's FP8 wgmma sums, for choosing how the FP8 decode path (flash_decode_wgmma,
kv_dtype=fp8: templates/flash_decode_wgmma/fp8.cuh) sums S = Q K^T (docs/design/flash_decode_wgmma.md,
"FP8 wgmma's sums").

Each wgmma (k = 32) is modelled as adding its 32 exact e4m3 x e4m3 products and the accumulator it is
given after aligning them to the largest and truncating below 2^-BITS of it (Hopper keeps ~13-14
bits; the errors runs 386-387 measured on an H100 are what the model gives at 10-11). Q is bf16 as
two e4m3 pieces (hi, lo) as fp8.cuh makes them, K e4m3 of N(0, 1); a way of summing is a list of
groups, each a chain of (piece, k-step) wgmmas in fresh sums, the groups added in fp32. Prints the
largest LSE error of a 64-row tile against float64 for each way and BITS.

    tools/fp8_sums_model.py [--bits 10 11 13] [--keys 777] [--reps 3]

Needs numpy.
"""
import argparse

import numpy as np


def e4m3(x):
    """Round to e4m3 (4 significant bits, smallest normal 2^-6, subnormal step 2^-9), saturating."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -6)
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448)


def bf16(x):
    u = np.asarray(x, dtype=np.float32).copy().view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32).astype(np.float64)


def wgmma(acc, products, bits):
    """acc + sum(products) with every term aligned to the largest and truncated below 2^-bits of it."""
    terms = np.concatenate([acc[..., None], products], -1)
    top = np.floor(np.log2(np.maximum(np.abs(terms).max(-1), 1e-30)))
    step = 2.0 ** (top - bits)
    return (np.trunc(terms / step[..., None]) * step[..., None]).sum(-1)


WAYS = {
    "one sum, hi first": [[("h", k) for k in range(4)] + [("l", k) for k in range(4)]],
    "one sum, lo first": [[("l", k) for k in range(4)] + [("h", k) for k in range(4)]],
    "hi and lo apart": [[("h", k) for k in range(4)], [("l", k) for k in range(4)]],
    "k_pair (two k-steps a sum)": [[("l", 0), ("h", 0), ("l", 1), ("h", 1)], [("l", 2), ("h", 2), ("l", 3), ("h", 3)]],
    "k_step (lo, hi a k-step)": [[("l", k), ("h", k)] for k in range(4)],
    "piece (a wgmma each)": [[(p, k)] for p in "lh" for k in range(4)],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, nargs="+", default=[10, 11, 13])
    ap.add_argument("--keys", type=int, default=777)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    d, rows = 128, 64
    rng = np.random.default_rng(0)
    for bits in args.bits:
        for name, groups in WAYS.items():
            worst = 0.0
            for _ in range(args.reps):
                q = bf16(rng.standard_normal((rows, d)))
                k = e4m3(rng.standard_normal((args.keys, d)))
                e = int(np.floor(np.log2(np.abs(q).max()))) - 7
                hi = e4m3(q * 2.0**-e)
                pieces = {"h": hi, "l": e4m3(q * 2.0**-e - hi)}
                s = 0
                for group in groups:
                    acc = np.zeros((rows, args.keys))
                    for piece, ks in group:
                        cols = slice(32 * ks, 32 * ks + 32)
                        acc = wgmma(acc, pieces[piece][:, None, cols] * k[None, :, cols], bits)
                    s = s + acc
                scale = 1 / np.sqrt(d)
                lse = np.log(np.exp(s * 2.0**e * scale).sum(1))
                exact = np.log(np.exp(q @ k.T * scale).sum(1))
                worst = max(worst, float(np.abs(lse - exact).max()))
            print(f"bits {bits:2d}  {name:26s}  max LSE error {worst:.2e}")


if __name__ == "__main__":
    main()
