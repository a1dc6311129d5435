#!/usr/bin/env python3
"""Time attntune's FP8 forward (dtype=fp8: Q, K, V e4m3, V transposed, O bf16) against our bf16 kernel of
the same shape, FlashAttention-4's bf16 forward and PyTorch's SDPA backends, in one process on the GPU
machine (issue 42's FP8-forward bar: >= 900 TFLOP/s at d=128 non-causal, >= 1000 at d=256, against the
best bf16 the user has).

  python3 tools/compare_fp8_forward.py --cu FILE.cu --problem SPEC [--fa4-aot DIR] [--rounds 3]
      [--min-seconds 1] [--json OUT] [--dry-run]

FILE.cu is an `attntune export` holding a kernel tuned for SPEC with dtype=fp8 and one for it with
dtype=bf16 (`export --all-best`, or --campaign twice); the tool builds it with the contract's nvcc line
(-arch=sm_90a -Xcompiler -fPIC -shared, cached beside it as FILE.so) and calls its C ABI through ctypes
(the PyTorch ops do not take FP8 queries yet). SPEC is the problem without its dtype (or with either):
b, h, hkv, s, sk, d, causal; dense, [B, H, S, D].

Contenders (--contenders, a comma list; default all):
  fp8    attntune_attention_forward_ex with attntune_options.qkv_dtype = 1: q, k float8_e4m3fn [B, H, S, D],
         v transposed [B, Hkv, D, sk padded to 16] (the keys contiguous), descales per (sequence, KV head)
         in [0.25, 2] (FlashAttention-3's descale_q/k/v), out bf16.
  ours   the same entry point with no options on bf16 q, k, v: the bf16 kernel of the file.
  fa4    FlashAttention-4's dense bf16 forward (the FA4 kit's AOT kernels, q/k/v [B, S, H, D]): skipped,
         saying why, without the kit, tvm_ffi or a kernel for the signature.
  sdpa   F.scaled_dot_product_attention in bf16 under cuDNN, flash and efficient (--backends), the
         fastest after a screening sample entering the rounds.

Correctness first, on a smaller problem of the same heads and head dim (s = 777, sk = 780: odd query
rows, keys a multiple of 4 but not of 16, so a last tile part-full and a kernel tuned with k_perm, which
refuses other key counts, served; --check-sk 781 checks the k_perm=false companion the export adds
after such a kernel for those): our FP8 output against a float32 reference over the dequantised inputs, FlashAttention-2's
criterion against a baseline that rounds as a good FP8 kernel does (scores in bf16, P in e4m3, out in
bf16): max|out - ref| <= 2 x max|base - ref| + 2^-9, and its LSE within 2 x the baseline's LSE error +
1e-3 (the tuner's criterion for dtype=fp8); ours bf16 (when a contender) against the reference within
2e-2 (peer_common's ATOL). The output and LSE are poisoned with NaN before each call. Any failure: exit 1.

Timing (peer_common.time_contenders, as compare_chunked.py): --calls calls a CUDA graph, one untimed
warm-up sample each, SDPA screened, then --rounds interleaved rounds of >= --min-seconds, order rotated;
each contender's median. TFLOP/s = 4 b h s sk d (half causal, bottom-right) / time. x/fp8 = x's time /
fp8's (> 1: the FP8 forward is faster), with the per-round range.

--dry-run prints the problem, FLOPs and contenders without torch or CUDA.
"""
import ctypes
import os
import random
import subprocess
import sys

import peer_common  # what the peer tools share
from peer_common import Parser, log, short

GROUPS = ("fp8", "ours", "fa4", "sdpa")
SMALL_Q, SMALL_K = 777, 780  # the correctness check's s and sk (sk % 4 == 0: k_perm kernels serve it)


def parse_problem(spec):
    """SPEC (with or without dtype) as peer_common's dict, dense; ValueError naming what is wrong."""
    parts = [x for x in spec.split(",") if x and not x.startswith("dtype=")]
    p = peer_common.parse_spec(",".join(parts + ["dtype=bf16"]))
    if p.get("page") or p.get("varlen"):
        raise ValueError("the FP8 forward is dense: no page= or varlen=")
    if p["d"] % 32 or (p["d"] > 128 and p["d"] != 256):
        raise ValueError(f"d={p['d']}: the FP8 forward serves head dims multiples of 32 up to 128, and 256")
    return p


def flops(p, s=None, sk=None):
    s, sk = s or p["s"], sk or p["sk"]
    return 4.0 * p["b"] * p["h"] * p["d"] * peer_common.seq_pairs(s, sk, p["causal"])


class Options(ctypes.Structure):
    """attntune_options as templates/export/launcher.cuh declares it (docs/CONTRACT.md)."""
    _fields_ = [("size", ctypes.c_size_t), ("window", ctypes.c_int), ("window_left", ctypes.c_int),
                ("window_right", ctypes.c_int), ("softcap", ctypes.c_float), ("sinks", ctypes.c_void_p),
                ("head_dim_v", ctypes.c_int), ("latent", ctypes.c_int), ("kv_dtype", ctypes.c_int),
                ("k_descale", ctypes.c_void_p), ("v_descale", ctypes.c_void_p),
                ("k_descale_stride", ctypes.c_longlong * 2), ("v_descale_stride", ctypes.c_longlong * 2),
                ("deterministic", ctypes.c_int), ("qkv_dtype", ctypes.c_int), ("q_descale", ctypes.c_void_p),
                ("q_descale_stride", ctypes.c_longlong * 2)]


def build(cu):
    """FILE.cu -> FILE.so with the contract's nvcc line (kept when newer than the .cu)."""
    so = os.path.splitext(cu)[0] + ".so"
    if not os.path.exists(so) or os.path.getmtime(so) < os.path.getmtime(cu):
        cmd = ["nvcc", "-std=c++17", "-arch=sm_90a", "-Xcompiler", "-fPIC", "-shared", cu, "-o", so]
        log("build: " + " ".join(cmd))
        subprocess.run(cmd, check=True)
    return so


class Library:
    """The exported file's C ABI through ctypes."""

    def __init__(self, so):
        self.lib = ctypes.CDLL(so)
        f = self.lib.attntune_attention_forward_ex
        ll3 = ctypes.c_longlong * 3
        f.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 6 + [ll3] * 4 + [ctypes.c_float, ctypes.c_int,
                                                                            ctypes.POINTER(Options), ctypes.c_void_p]
        f.restype = ctypes.c_int
        self.lib.attntune_last_error.restype = ctypes.c_char_p
        self.f, self.ll3 = f, ll3

    def forward(self, torch, q, k, v, out, lse, vt_strides, scale, causal, opts):
        """out (and lse, or None) of q [B, H, S, D], k [B, Hkv, Sk, D], v (v_strides as given), on the current
        stream; RuntimeError with the library's reason."""
        B, H, S, D = q.shape
        Hkv, Sk = k.shape[1], k.shape[2]
        rc = self.f(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr() if lse is not None else None,
                    B, H, Hkv, S, Sk, D, self.ll3(*q.stride()[:3]), self.ll3(*k.stride()[:3]), self.ll3(*vt_strides),
                    self.ll3(*out.stride()[:3]), scale, 1 if causal else 0,
                    ctypes.byref(opts) if opts is not None else None, torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"attntune_attention_forward_ex: {rc}: {self.lib.attntune_last_error().decode()}")


class Fp8Inputs:
    """e4m3 q, k, v (v also transposed, the keys padded to 16), their descales and the options that say so."""

    def __init__(self, torch, B, H, Hkv, S, Sk, D, gen):
        f8 = torch.float8_e4m3fn
        self.q = torch.randn(B, H, S, D, device="cuda", generator=gen).to(f8)
        self.k = torch.randn(B, Hkv, Sk, D, device="cuda", generator=gen).to(f8)
        self.v = torch.randn(B, Hkv, Sk, D, device="cuda", generator=gen).to(f8)
        pad = (Sk + 15) // 16 * 16
        self.vt = torch.full((B, Hkv, D, pad), float("nan"), device="cuda").to(f8)
        self.vt[..., :Sk] = self.v.transpose(2, 3)
        self.vt_strides = self.vt.stride()[:3]
        self.scales = [torch.rand(B, Hkv, device="cuda", generator=gen) * 1.75 + 0.25 for _ in range(3)]
        o = Options()
        o.size = ctypes.sizeof(Options)
        o.qkv_dtype = 1
        o.q_descale, o.k_descale, o.v_descale = (t.data_ptr() for t in self.scales)
        for st in (o.q_descale_stride, o.k_descale_stride, o.v_descale_stride):
            st[0], st[1] = Hkv, 1
        self.opts = o

    def dequantised(self, torch, H):
        """float32 q, k, v with their descales applied (k and v per KV head, q per its KV head)."""
        qd, kd, vd = self.scales
        Hkv = self.k.shape[1]
        rep = H // Hkv
        q = self.q.float() * qd.repeat_interleave(rep, dim=1)[:, :, None, None]
        return q, self.k.float() * kd[:, :, None, None], self.v.float() * vd[:, :, None, None]


def attention32(torch, q, k, v, causal, scale, lowp=False):
    """float32 attention with GQA and bottom-right causal, per (batch, head): (out, lse natural log). lowp:
    scores rounded to bf16, 2^8 P (relative to the row max) to e4m3 over the exact sum, out to bf16."""
    B, H, S, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    out = torch.empty(B, H, S, D, device=q.device)
    lse = torch.empty(B, H, S, device=q.device)
    mask = None
    if causal:
        i = torch.arange(S, device=q.device)[:, None] + (Sk - S)
        mask = torch.arange(Sk, device=q.device)[None, :] > i
    for b in range(B):
        for h in range(H):
            s = (q[b, h] @ k[b, h // (H // Hkv)].T) * scale
            if lowp:
                s = s.to(torch.bfloat16).float()
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            m = s.max(dim=1, keepdim=True).values
            e = torch.exp(s - m)
            l = e.sum(dim=1, keepdim=True)
            # P scaled by 2^8 before e4m3 (FlashAttention-3's max_offset, as the kernel does): small P
            # stay out of e4m3's subnormals
            p = ((e * 256).to(torch.float8_e4m3fn).float() / 256 if lowp else e) / l
            o = p @ v[b, h // (H // Hkv)]
            out[b, h] = o.to(torch.bfloat16).float() if lowp else o
            lse[b, h] = (m + torch.log(l)).squeeze(1)
    return out, lse


def check(torch, lib, p, scale, small_k, with_bf16):
    """The FP8 call (and the bf16 one, with_bf16) on a small problem (SMALL_Q queries, small_k keys)
    against float32; (ok, lines)."""
    B, H, Hkv, D, causal = p["b"], p["h"], p["hkv"], p["d"], p["causal"]
    gen = torch.Generator(device="cuda").manual_seed(1234)
    x = Fp8Inputs(torch, 1, H, Hkv, SMALL_Q, small_k, D, gen)
    out = torch.full((1, H, SMALL_Q, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((1, H, SMALL_Q), float("nan"), device="cuda")
    lib.forward(torch, x.q, x.k, x.vt, out, lse, x.vt_strides, scale, causal, x.opts)
    torch.cuda.synchronize()
    q, k, v = x.dequantised(torch, H)
    ref, ref_lse = attention32(torch, q, k, v, causal, scale)
    base, base_lse = attention32(torch, q, k, v, causal, scale, lowp=True)
    err, base_err = (out.float() - ref).abs().max().item(), (base - ref).abs().max().item()
    lse_err, base_lse_err = (lse - ref_lse).abs().max().item(), (base_lse - ref_lse).abs().max().item()
    ok8 = err == err and err <= 2 * base_err + 2.0 ** -9 and lse_err <= 2 * base_lse_err + 1e-3
    lines = [f"fp8 (s={SMALL_Q}, sk={small_k}): max|out-ref| {err:.3g} (bound {2 * base_err + 2.0 ** -9:.3g}), LSE "
             f"{lse_err:.3g} (bound {2 * base_lse_err + 1e-3:.3g}): {'ok' if ok8 else 'FAIL'}"]
    if not with_bf16:
        return ok8, lines
    q16, k16, v16 = (torch.randn(1, n, rows, D, device="cuda", generator=gen, dtype=torch.bfloat16)
                     for n, rows in ((H, SMALL_Q), (Hkv, small_k), (Hkv, small_k)))
    out16 = torch.full_like(out, float("nan"))
    lib.forward(torch, q16, k16, v16, out16, None, v16.stride()[:3], scale, causal, None)
    torch.cuda.synchronize()
    ref16, _ = attention32(torch, q16.float(), k16.float(), v16.float(), causal, scale)
    err16 = (out16.float() - ref16).abs().max().item()
    ok16 = err16 == err16 and err16 <= peer_common.ATOL["bf16"]
    lines.append(f"ours bf16: max|out-ref| {err16:.3g} (atol {peer_common.ATOL['bf16']}): {'ok' if ok16 else 'FAIL'}")
    return ok8 and ok16, lines


def main():
    ap = Parser(description=__doc__.split("\n\n")[0], formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    ap.add_argument("--cu", help="the exported file (FP8 and bf16 kernels for the problem)")
    ap.add_argument("--problem", required=True, help="b=..,h=..,s=..,d=..,causal=.. (hkv, sk optional)")
    ap.add_argument("--check-sk", type=int, default=SMALL_K,
                    help=f"the correctness check's key count (default {SMALL_K}; one that is not a multiple of 4 "
                         "checks a k_perm kernel's companion, which the export adds after it)")
    peer_common.add_run_args(ap, GROUPS, "time every SDPA backend in the rounds", "print the plan and exit")
    args = ap.parse_args()
    groups, backends = peer_common.check_run_args(ap, args, GROUPS)
    try:
        p = parse_problem(args.problem)
    except ValueError as e:
        ap.error(f"--problem: {e}")
    if ("fp8" in groups or "ours" in groups) and not args.cu:
        ap.error("--cu is needed for fp8 and ours (or leave them out: --contenders fa4,sdpa)")
    B, H, Hkv, S, Sk, D, causal = p["b"], p["h"], p["hkv"], p["s"], p["sk"], p["d"], p["causal"]
    total = flops(p)
    log(f"problem {peer_common.problem_str(p).replace('dtype=bf16', 'dtype=fp8')}: {total / 1e12:.3f} TFLOP; "
        f"contenders {', '.join(groups)}")
    if args.dry_run:
        for g in groups:
            print(f"  {g}")
        return 0
    run = peer_common.Run("bf16", "cuda")
    torch = run.torch
    random.seed(args.seed)
    scale = D ** -0.5
    lib = Library(build(args.cu)) if args.cu else None
    res, cands, skipped = {}, {}, {}
    if lib is not None:
        ok, lines = check(torch, lib, p, scale, args.check_sk, "ours" in groups)
        for line in lines:
            log(line)
        if not ok:
            log("correctness failed: not timing")
            return 1
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    if "fp8" in groups:
        x = Fp8Inputs(torch, B, H, Hkv, S, Sk, D, gen)
        o8 = torch.empty(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        cands["fp8"] = dict(group="fp8", fn=lambda: lib.forward(torch, x.q, x.k, x.vt, o8, None, x.vt_strides, scale,
                                                                 causal, x.opts))
    q, k, v = (torch.randn(B, n, l, D, device="cuda", generator=gen, dtype=torch.bfloat16)
               for n, l in ((H, S), (Hkv, Sk), (Hkv, Sk)))
    if "ours" in groups:
        o16 = torch.empty_like(q)
        cands["ours"] = dict(group="ours", fn=lambda: lib.forward(torch, q, k, v, o16, None, v.stride()[:3], scale,
                                                                   causal, None))
    if "fa4" in groups:
        K, dirs, why = peer_common.load_kit(args, lambda K: hasattr(K, "FA4Aot") and hasattr(K.FA4Aot, "make"),
                                            "{kit}/fa4kit.py has no FA4Aot.make (not the FA4 kit?)")
        if K is not None:
            try:
                spec = peer_common.problem_str(p)
                qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                call = K.FA4Aot(dirs).make(K.parse_problem(spec), qs, ks, vs, scale)
                cands["fa4"] = dict(group="fa4", fn=call)
                log(f"fa4: {call.kernel} ({call.how})")
            except Exception as e:  # noqa: BLE001 - skipped, saying why
                why = short(e, 400)
        if "fa4" not in cands:
            skipped["fa4"] = why
            log(f"fa4: skipped: {why}")
    if "sdpa" in groups:
        kw = {"scale": scale, "enable_gqa": Hkv != H}
        if causal and S == Sk:
            kw["is_causal"] = True
        elif causal:
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(S, Sk)
        for b in backends:
            def fn(b=b):
                with run.sdpa_kernel(run.backend[b]):
                    return run.F.scaled_dot_product_attention(q, k, v, **kw)
            try:
                fn()
                torch.cuda.synchronize()
                cands[f"sdpa_{b}"] = dict(group="sdpa", fn=fn)
            except Exception as e:  # noqa: BLE001
                skipped[f"sdpa_{b}"] = short(e)
                log(f"sdpa_{b}: skipped: {short(e)}")
    for n in cands:
        res[n] = {}
    capture_failed, timing_failed, before, after = peer_common.time_contenders(torch, cands, res, args, ("sdpa",))
    peer_common.summarise(res, "fp8", args.rounds, lambda n: total, "vs_fp8")
    log(f"GPU before {before}, after {after}")
    print(f"\n=== FP8 forward, {peer_common.problem_str(p).replace('dtype=bf16,', '')} "
          f"({run.env.get('gpu')}, one process, {args.rounds} interleaved rounds of >= {args.min_seconds} s)")
    print(f"{'contender':<16} {'us':>10} {'TFLOP/s':>8} {'x/fp8':>7}  per-round")
    for n, r in sorted(res.items(), key=lambda kv: kv[1].get("us") or 1e30):
        if not r.get("us"):
            print(f"{n:<16} {'-':>10} {'-':>8} {'-':>7}  {r.get('error', 'not timed')}")
            continue
        rng = f"{r['vs_fp8_min']:.3f}-{r['vs_fp8_max']:.3f}" if "vs_fp8_min" in r else ""
        ratio = f"{r['vs_fp8']:.3f}" if "vs_fp8" in r else "1.000" if n == "fp8" else "-"
        print(f"{n:<16} {r['us']:>10.1f} {r['tflops']:>8.1f} {ratio:>7}  {rng}{' (screen only)' if r.get('screen_only') else ''}")
    for n, why in skipped.items():
        print(f"{n:<16} skipped: {why}")
    if args.json:
        peer_common.write_json(args.json, {"problem": args.problem, "env": run.env, "results": res, "skipped": skipped})
    return 1 if capture_failed or timing_failed else 0


if __name__ == "__main__":
    sys.exit(main())
