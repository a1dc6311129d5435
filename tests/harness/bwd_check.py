"""Checks and times flash_bwd_mma harness builds (tests/harness/bwd_build.sh) on the GPU machine.

Correctness: each build's dQ, dK, dV against PyTorch's float64 autograd of plain attention
(bottom-right causal, windows, GQA), by FlashAttention-2's criterion on each gradient:
max|ours - ref64| <= 2 * max|same-dtype autograd - ref64| + atol, on fresh random inputs with odd
lengths, the outputs poisoned with NaN before each call. The forward's O and LSE the kernel reads
are PyTorch's float32 ones (O rounded to the dtype).
Timing: the backward call alone, ours against SDPA's backward (cuDNN and flash backends) on the
same inputs in this process, interleaved rounds of CUDA-graph replays.
--deterministic: also the deterministic mode (Call::deterministic, dQ's shares added in key-block
order): on each check's inputs it must pass the same criterion and give the same bits of dQ, dK and
dV run after run (three runs, a call of another size between the second and the third); two normal
runs must give the same dK and dV (register sums), and whether their dQ differs is reported (the
atomics' order: if it never does, these shapes could not tell the modes apart). With --time, the
deterministic mode is timed beside the normal one (det/normal: its cost).

  python3 bwd_check.py --lib DIR NAME:D:BF16:CAUSAL:WINDOW [...] [--time SHAPES] [--deterministic]
      [--window L,R]   (the window of timed calls, for window builds)
"""
import argparse
import ctypes
import math
import os
import sys

import torch
import torch.nn.functional as F



def attention64(q, k, v, causal, left, right, dtype):
    """Plain attention of [b, s, h, d] tensors in `dtype` with autograd; returns (o, lse)."""
    b, s, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qq, kk, vv = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    if hkv != h:
        kk = kk.repeat_interleave(h // hkv, dim=1)
        vv = vv.repeat_interleave(h // hkv, dim=1)
    scores = (qq @ kk.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    i = torch.arange(s, device=q.device)[:, None] + (sk - s)
    j = torch.arange(sk, device=q.device)[None, :]
    vis = torch.ones(s, sk, dtype=torch.bool, device=q.device)
    if causal:
        vis &= j <= i
    if left >= 0:
        vis &= j >= i - left
    if right >= 0 and not causal:
        vis &= j <= i + right
    anyk = vis.any(-1, keepdim=True)
    scores = scores.masked_fill(~vis, float("-inf")).masked_fill(~anyk, 0.0)
    lse = torch.logsumexp(scores.float(), -1).masked_fill(~anyk[:, 0], float("-inf"))
    p = torch.softmax(scores.float(), -1).to(dtype) * anyk
    o = (p @ vv).transpose(1, 2)
    return o, lse


def forward_ref(q, k, v, causal, left, right, limit=2**31):
    """The forward's O and LSE (float32, no autograd) a timed call reads: attention64 over slices of one
    batch row and one KV head's query heads when the whole score tensor would pass `limit` elements
    (b1 h16 s16k: 4.3e9), so that large shapes time real softmax values, not P = 0 from a stand-in LSE
    (whose low switching activity ran the clock high under the power cap: 549 against 493 TF/s)."""
    b, s, h, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    with torch.no_grad():
        if b * h * s * sk <= limit:
            return attention64(q, k, v, causal, left, right, torch.float32)
        rep = h // hkv
        o = torch.empty(q.shape, device=q.device, dtype=torch.float32)
        lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
        for bi in range(b):
            for g in range(hkv):
                hs = slice(g * rep, (g + 1) * rep)
                oo, ll = attention64(q[bi:bi + 1, :, hs], k[bi:bi + 1, :, g:g + 1], v[bi:bi + 1, :, g:g + 1],
                                     causal, left, right, torch.float32)
                o[bi:bi + 1, :, hs] = oo
                lse[bi:bi + 1, hs] = ll
        return o, lse


def grads(q, k, v, do, causal, left, right, dtype):
    xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    o, lse = attention64(*xs, causal, left, right, dtype)
    g = torch.autograd.grad(o, xs, do.to(dtype))
    return [x.double() for x in g], o.detach(), lse.detach()


def run_ours(lib, q, k, v, o, lse, do, left, right, deterministic=0):
    b, s, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    dq = torch.full_like(q, float("nan"))
    dk = torch.full_like(k, float("nan"))
    dv = torch.full_like(v, float("nan"))
    ptr = lambda x: ctypes.c_void_p(x.data_ptr())
    args = (ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), ptr(do), ptr(dq), ptr(dk), ptr(dv), b, h, hkv, s, sk, 1, left,
            right, int(deterministic))

    def call():
        if lib.bwd_run_ex(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)) != 0:
            raise RuntimeError("bwd_run_ex refused")
    return call, (dq, dk, dv)


def bits(outs):
    """The gradients' bytes (bitwise comparison: NaN == NaN, -0 != +0)."""
    return [x.view(torch.int16).clone() for x in outs]


def same_bits(a, b):
    return [nm for nm, x, y in zip(("dq", "dk", "dv"), a, b) if not torch.equal(x, y)]


def inputs(d, bf16, causal, left, right, shape, seed):
    """Random q, k, v, dO ([b, s, h, d], the dtype) and the forward's O (rounded) and LSE of them."""
    b, h, hkv, s, sk = shape
    dt = torch.bfloat16 if bf16 else torch.float16
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, s, h, d, device="cuda", generator=g).to(dt)
    k = torch.randn(b, sk, hkv, d, device="cuda", generator=g).to(dt)
    v = torch.randn(b, sk, hkv, d, device="cuda", generator=g).to(dt)
    do = torch.randn(b, s, h, d, device="cuda", generator=g).to(dt)
    with torch.no_grad():
        o32, lse32 = attention64(q, k, v, causal, left, right, torch.float32)
    return q, k, v, do.contiguous(), o32.to(dt).contiguous(), lse32.contiguous()


def check(lib, name, d, bf16, causal, window, shape, seed, deterministic=False):
    b, h, hkv, s, sk = shape
    left, right = (window if window else (-1, -1))
    dt = torch.bfloat16 if bf16 else torch.float16
    q, k, v, do, o, lse = inputs(d, bf16, causal, left, right, shape, seed)
    ref, _, _ = grads(q, k, v, do, causal, left, right, torch.float64)
    low, _, _ = grads(q, k, v, do, causal, left, right, dt)
    atol = 1 / 512 if bf16 else 1 / 4096

    def verdict(outs):
        verdicts = []
        ok = True
        for nm, x, r, lo in zip(("dq", "dk", "dv"), outs, ref, low):
            nonfinite = int((~torch.isfinite(x)).sum())
            err = (x.double() - r).abs().max().item()
            lerr = (lo - r).abs().max().item()
            bound = 2 * lerr + atol
            good = nonfinite == 0 and err <= bound
            ok &= good
            verdicts.append(f"{nm} {err:.3g}/{bound:.3g}" + (f" nonfinite {nonfinite}" if nonfinite else ""))
        return ok, ", ".join(verdicts)

    def run(call, outs):
        for x in outs:
            x.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        return bits(outs)

    call, outs = run_ours(lib, q, k, v, o, lse, do, left, right)
    normal = run(call, outs)
    ok, words = verdict(outs)
    print(f"{'ok  ' if ok else 'FAIL'} {name} b{b} h{h}/{hkv} s{s} sk{sk} w{left},{right}: {words}", flush=True)
    if not deterministic:
        return ok
    # The deterministic mode: three runs (another size between the second and the third) of the same bits.
    again = run(call, outs)
    normal_differs = same_bits(normal, again)
    dcall, douts = run_ours(lib, q, k, v, o, lse, do, left, right, deterministic=1)
    first = run(dcall, douts)
    dok, dwords = verdict(douts)
    second = run(dcall, douts)
    ob, oh, ohkv, os_, osk = 3, 4, 4, 300, 2222  # another size: other workspaces' layout, other turns
    oq, ok_, ov, odo, oo, olse = inputs(d, bf16, causal, left, right, (ob, oh, ohkv, os_, osk), seed + 1000)
    ocall, _ = run_ours(lib, oq, ok_, ov, oo, olse, odo, left, right, deterministic=1)
    ocall()
    torch.cuda.synchronize()
    third = run(dcall, douts)
    # (The normal mode's dK and dV are register sums in its own walk's order: the same bits run to run,
    # though not necessarily the mode's, whose walk goes the other way.)
    differ = [f"second run: {' '.join(x)}" for x in [same_bits(first, second)] if x] + \
             [f"after another size: {' '.join(x)}" for x in [same_bits(first, third)] if x] + \
             [f"normal mode's two runs: {x}" for x in ("dk", "dv") if x in normal_differs]
    good = dok and not differ
    print(f"{'ok  ' if good else 'FAIL'} {name} b{b} h{h}/{hkv} s{s} sk{sk} w{left},{right} deterministic: {dwords}; "
          + ("3 runs bit-identical" if not differ else "differ: " + "; ".join(differ))
          + f" (normal mode, two runs: {'dq differs' if 'dq' in normal_differs else 'same bits'})", flush=True)
    return ok and good


def timed(fns, seconds=0.5, rounds=3):
    """Median microseconds a call of each fn: interleaved rounds of back-to-back calls between two
    events (a backward call is milliseconds: launch gaps are noise; autograd does not capture)."""
    import time
    calls = []
    for fn in fns:
        fn()
        torch.cuda.synchronize()
        t0 = time.time()
        fn()
        torch.cuda.synchronize()
        calls.append(max(1, min(50, int(0.02 / max(time.time() - t0, 1e-6)))))
    samples = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t_end = time.time() + seconds / rounds
            while time.time() < t_end:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls[i]):
                    fn()
                end.record()
                end.synchronize()
                samples[i].append(start.elapsed_time(end) * 1000 / calls[i])
    return [sorted(x)[len(x) // 2] for x in samples]


def time_shape(lib, d, bf16, causal, shape, seconds, deterministic=False, window=(-1, -1)):
    b, h, hkv, s, sk = shape
    dt = torch.bfloat16 if bf16 else torch.float16
    q = torch.randn(b, s, h, d, device="cuda", dtype=dt)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt)
    do = torch.randn(b, s, h, d, device="cuda", dtype=dt)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    peers = {}
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    for nm, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), enable_gqa=hkv != h)
            dot = do.transpose(1, 2)

            def fn(out=out, be=be):
                torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)
            fn()
            peers[nm] = fn
        except Exception as e:  # a backend that refuses the shape
            print(f"  {nm}: {type(e).__name__}: {str(e)[:100]}")
    left, right = window
    o32, lse32 = forward_ref(q, k, v, causal, left, right)
    o, lse = o32.to(dt).contiguous(), lse32.contiguous()
    call, _ = run_ours(lib, q, k, v, o, lse, do, left, right)
    ours = {"ours": call}
    if deterministic:
        ours["ours-det"] = run_ours(lib, q, k, v, o, lse, do, left, right, deterministic=1)[0]
    if left >= 0 or right >= 0:
        peers = {}  # SDPA's backends take no window
    names = list(ours) + list(peers)
    us = timed(list(ours.values()) + list(peers.values()), seconds=seconds)
    fwd = 4 * b * h * s * sk * d
    if causal or left >= 0 or right >= 0:
        lo = [0 if left < 0 else max(0, i + sk - s - left) for i in range(s)]
        hi = [min(sk - 1, i + sk - s + (0 if causal else right if right >= 0 else sk)) for i in range(s)]
        fwd = 4 * b * h * d * sum(max(0, y - x + 1) for x, y in zip(lo, hi))
    flops = 2.5 * fwd
    cells = "  ".join(f"{n} {t:.0f}us {flops / t / 1e6:.0f}TF" for n, t in zip(names, us))
    n_ours = len(ours)
    best_peer = min(us[n_ours:]) if len(us) > n_ours else float("nan")
    det = f"  det/normal {us[1] / us[0]:.3f}x" if deterministic else ""
    wtxt = f" w{left},{right}" if left >= 0 or right >= 0 else ""
    print(f"time b{b} h{h}/{hkv} s{s} sk{sk} d{d} {'bf16' if bf16 else 'fp16'} {'causal' if causal else 'full'}{wtxt}: "
          f"{cells}  ours/best-peer {best_peer / us[0]:.3f}x{det}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--time", default="", help="b,h,hkv,s,sk;...")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--deterministic", action="store_true",
                    help="also check (bit-identical runs) and time the deterministic mode")
    ap.add_argument("--window", default="-1,-1", help="L,R: the window of timed calls (window builds)")
    a = ap.parse_args()
    window_timed = tuple(int(x) for x in a.window.split(","))
    torch.backends.cuda.matmul.allow_tf32 = False
    failures = 0
    for spec in a.builds:
        name, d, bf16, causal, window = spec.split(":")
        d, bf16, causal, window = int(d), int(bf16), int(causal), int(window)
        lib = ctypes.CDLL(os.path.join(a.lib, f"lib{name}.so"))
        regs, local, smem = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        lib.bwd_attrs(ctypes.byref(regs), ctypes.byref(local), ctypes.byref(smem))
        print(f"build {name}: {regs.value} registers, {local.value} bytes local, {smem.value} bytes smem", flush=True)
        if not a.no_check:
            shapes = [(2, 4, 4, 257, 257), (1, 8, 2, 389, 389), (2, 2, 1, 200, 533), (1, 4, 2, 533, 200),
                      (1, 2, 2, 1, 77), (1, 2, 2, 77, 1), (1, 4, 4, 1531, 1531)]
            windows = [None] if not window else ([(64, -1), (17, -1), (300, -1)] if causal else
                                                 [(64, 64), (17, 129), (-1, 100)])
            for i, sh in enumerate(shapes):
                for w in windows:
                    if not check(lib, name, d, bf16, causal, w, sh, 1000 + i, a.deterministic):
                        failures += 1
        for tok in filter(None, a.time.split(";")):
            time_shape(lib, d, bf16, causal, tuple(int(x) for x in tok.split(",")), a.seconds, a.deterministic,
                       window_timed if window else (-1, -1))
    print(f"failures: {failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
