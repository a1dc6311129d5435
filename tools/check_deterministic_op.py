#!/usr/bin/env python3
"""The PyTorch op's deterministic flag on the GPU, through an exported package (run 199): the
backward's gradients twice with attention(..., deterministic=True) must be bit-identical (exit 1
otherwise), and twice without (dQ may differ); each against float64; the coverage table says which
kernel each backward call ran (a package of backward kernels alone: the forward falls back to SDPA).

    PYTHONPATH=PKG python3 tools/check_deterministic_op.py [--shape b,h,hkv,s,d]
"""
import argparse
import math
import sys

import torch

import attntune

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="1,16,4,2048,128", help="b,h,hkv,s,d (causal)")
b, h, hkv, s, d = (int(x) for x in ap.parse_args().shape.split(","))
torch.manual_seed(0)
mk = lambda heads: torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16)
q0, k0, v0, do = mk(h), mk(hkv), mk(hkv), mk(h)
# (the package holds a backward kernel only: the forward falls back to SDPA; the coverage table says
# which kernel each backward call ran)


def grads(det):
    q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
    o = attntune.attention(q, k, v, is_causal=True, layout="bshd", deterministic=det)
    o.backward(do)
    return [x.grad.clone() for x in (q, k, v)]


def ref64():
    q, k, v = (x.double().transpose(1, 2).requires_grad_() for x in (q0, k0, v0))
    kk, vv = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
    sc = q @ kk.transpose(-1, -2) / math.sqrt(d)
    sc = sc.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(sc, -1) @ vv
    o.backward(do.double().transpose(1, 2))
    return [x.grad.transpose(1, 2) for x in (q, k, v)]


r = ref64()
ok = True
for det in (True, False):
    a, c = grads(det), grads(det)
    same = [torch.equal(x, y) for x, y in zip(a, c)]
    err = [(x.double() - y).abs().max().item() for x, y in zip(a, r)]
    print(f"deterministic={det}: bit-identical dq/dk/dv {same}, max err vs float64 {['%.3g' % e for e in err]}")
    if det and not all(same):
        ok = False
print(attntune.coverage_table())
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
