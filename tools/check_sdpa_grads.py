#!/usr/bin/env python3
"""Checks SDPA's backward (each backend torch offers) against float64 autograd on a GQA causal shape
in the layout a model hands it: q, k, v as [B, H, S, D] views of [B, S, H, D] bf16 tensors, with
enable_gqa=True. A peer that is timed must also be right: run 194 found SDPA's cuDNN backend's
gradients off on training_run.md's shape. FlashAttention-2's criterion on each gradient (the error
at most 2x the same-dtype math backend's, plus a small atol).

    python3 tools/check_sdpa_grads.py [--shape b,h,hkv,s,d] [--contiguous] [--first-do-contiguous]

--first-do-contiguous: each backend is first called once with a contiguous [B, H, S, D] dO (as a
probe's o.sum().backward() would), then checked with the model's dO, a [B, H, S, D] view of
[B, S, H, D]: a backend that caches its backward plan by q, k, v alone reads the second dO with the
first one's strides (docs/design/training_run.md, run 194).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,16,4,4096,128")
    ap.add_argument("--contiguous", action="store_true", help="[B, H, S, D] contiguous tensors instead of views")
    ap.add_argument("--first-do-contiguous", action="store_true",
                    help="call each backend once with a contiguous dO before the checked call")
    a = ap.parse_args()
    b, h, hkv, s, d = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda heads: torch.randn(b, s, heads, d, device="cuda", generator=g, dtype=torch.bfloat16)
    q, k, v, do = mk(h), mk(hkv), mk(hkv), mk(h)

    def grads(backend, dtype, gqa=True, d_out=None):
        xs = [x.to(dtype).detach().requires_grad_() for x in (q, k, v)]
        qq, kk, vv = (x.transpose(1, 2) for x in xs)
        if a.contiguous:
            qq, kk, vv = (x.contiguous() for x in (qq, kk, vv))
        if not gqa:
            kk, vv = kk.repeat_interleave(h // hkv, 1), vv.repeat_interleave(h // hkv, 1)
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=gqa)
        o.backward(do.to(dtype).transpose(1, 2) if d_out is None else d_out)
        return [x.grad.double() for x in xs]

    ref = grads(SDPBackend.MATH, torch.float64, gqa=False)
    base = grads(SDPBackend.MATH, torch.bfloat16, gqa=False)
    bound = [2 * (x - r).abs().max().item() + 1 / 512 for x, r in zip(base, ref)]
    bad = 0
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            if a.first_do_contiguous:
                grads(be, torch.bfloat16, d_out=do.transpose(1, 2).contiguous())
            got = grads(be, torch.bfloat16)
        except Exception as e:  # a backend that refuses the call
            print(f"{name}: refused ({type(e).__name__}: {str(e)[:80]})")
            continue
        errs = [(x - r).abs().max().item() for x, r in zip(got, ref)]
        rel = [((x - r).norm() / r.norm()).item() for x, r in zip(got, ref)]
        ok = all(e <= bd for e, bd in zip(errs, bound))
        bad += not ok
        print(f"{name}: {'ok  ' if ok else 'WRONG'} " + ", ".join(
            f"d{n} max {e:.3g} (bound {bd:.3g}) rel {r_:.2e}" for n, e, bd, r_ in zip("qkv", errs, bound, rel)))
    print(f"shape b{b} h{h}/{hkv} s{s} d{d} causal, {'contiguous' if a.contiguous else '[B,S,H,D] views'}"
          f"{', after a call with a contiguous dO' if a.first_do_contiguous else ''}: "
          f"{bad} backend(s) wrong; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")


if __name__ == "__main__":
    main()
