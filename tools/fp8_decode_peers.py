#!/usr/bin/env python3
"""FP8 KV-cache decode (issue 42): attntune over an FP8 e4m3 cache against the same step over a bf16
cache through attntune's own best kernel, PyTorch's SDPA (cuDNN, and the flash / efficient
backends where they take the shape) and FlashAttention-4's sm90 forward (the kit's AOT kernels built for
the rows' dense bf16 problems; --fa4-aot, default .fa4/aot; a row without its kernel is said and left
out), in one process, interleaved.

Each row of the suite is one decode step: q [b, s, h, d] bf16, a paged cache of pages of `page` rows
([pages, page, hkv, d], shuffled block table), every sequence `sk` keys, causal bottom-right when s > 1.
attntune.attention_kvcache runs it twice: over the FP8 cache (float8_e4m3fn, FlashAttention-3's
per-(sequence, KV head) descales) and over the bf16 cache; the package's policy is "raise", so a call no
tuned kernel serves fails instead of falling back. SDPA reads the bf16 cache contiguous ([b, hkv, sk,
d], enable_gqa: what a serving stack without a paged kernel would call; causal bottom-right through
causal_lower_right). Each line gives us, the GB/s of the bytes the call must move (its cache in its
dtype, q and out: Problem::bytes), and the FP8 row's speed-up over it.

Timing: each callable captured as --calls calls in a CUDA graph, replayed for >= --min-seconds a
sample, --rounds interleaved rounds after a warm-up round (the order reversed every other round), the
median of each.

    PYTHONPATH=PKG python3 tools/fp8_decode_peers.py [--rows b16-8k,b64-8k,...] [--check]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_timing import gpu_state, timed  # noqa: E402

# name: b, h, hkv, s, sk, d (page from --page)
ROWS = {
    "b16-8k": (16, 32, 8, 1, 8192, 128),
    "b64-8k": (64, 32, 8, 1, 8192, 128),
    "b128-2k": (128, 32, 8, 1, 2048, 128),
    "b1-32k": (1, 32, 8, 1, 32768, 128),
    "spec4": (32, 64, 8, 4, 4096, 128),
    "q8": (32, 32, 8, 8, 4096, 128),
    "q16": (32, 32, 8, 16, 4096, 128),
    # issue 42's chunked prefill over an FP8 cache: a chunk of 2048 queries after 8192 cached keys
    "chunk": (4, 32, 8, 2048, 10240, 128),
}


def row(name, b, h, hkv, s, sk, d, page, args, attntune, fa4_kit=None, fa4_aot=None):
    dev = "cuda"
    torch.manual_seed(0)
    causal = s > 1
    pages_per = (sk + page - 1) // page
    k16 = torch.randn(b * pages_per, page, hkv, d, device=dev, dtype=torch.bfloat16)
    v16 = torch.randn(b * pages_per, page, hkv, d, device=dev, dtype=torch.bfloat16)
    # FP8: the same values quantised per (sequence, KV head) as a serving engine does (amax / 448); the
    # pages of sequence i are rows i * pages_per.. of the table's permutation, so scale by sequence.
    table = torch.randperm(b * pages_per, device=dev, dtype=torch.int32).view(b, pages_per)
    lens = torch.full((b,), sk, device=dev, dtype=torch.int32)
    kd = torch.rand(b, hkv, device=dev, dtype=torch.float32) * 0.02 + 0.01
    vd = torch.rand(b, hkv, device=dev, dtype=torch.float32) * 0.02 + 0.01
    seq_rows = torch.arange(b, device=dev).repeat_interleave(pages_per)  # the table's entries' sequences
    inv = torch.empty(b * pages_per, hkv, device=dev)
    inv[table.view(-1).long()] = 1.0 / kd[seq_rows]
    k8 = (k16.float() * inv[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    inv[table.view(-1).long()] = 1.0 / vd[seq_rows]
    v8 = (v16.float() * inv[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    q = torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16)
    scale = d ** -0.5
    out8 = torch.empty(b, s, h, d, device=dev, dtype=torch.bfloat16)
    out16 = torch.empty_like(out8)

    def ours_fp8():
        attntune.attention_kvcache(q, k8, v8, cache_seqlens=lens, block_table=table, scale=scale, is_causal=causal,
                                   k_descale=kd, v_descale=vd, out=out8)

    def ours_bf16():
        attntune.attention_kvcache(q, k16, v16, cache_seqlens=lens, block_table=table, scale=scale,
                                   is_causal=causal, out=out16)

    qs = q.transpose(1, 2).contiguous()  # [b, h, s, d]
    # The bf16 cache contiguous in the table's order: [b, sk, hkv, d] for FA4, [b, hkv, sk, d] for SDPA.
    kb = k16[table.long()].reshape(b, pages_per * page, hkv, d)[:, :sk].contiguous()
    vb = v16[table.long()].reshape(b, pages_per * page, hkv, d)[:, :sk].contiguous()
    kc, vc = kb.transpose(1, 2).contiguous(), vb.transpose(1, 2).contiguous()
    bf16_bytes = b * sk * hkv * d * 4 + 2 * q.numel() * 2
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    mask = causal_lower_right(s, sk) if causal else None
    rows = [("attntune, FP8 cache", ours_fp8, b * sk * hkv * d * 2 + 2 * q.numel() * 2)]
    if not args.no_ours_bf16:  # context (what the FP8 cache saves us), not a peer
        rows.append(("attntune, bf16 cache", ours_bf16, bf16_bytes))
    for be_name, be in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                        ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def peer(be=be):
            with sdpa_kernel([be]):
                if mask is None:
                    F.scaled_dot_product_attention(qs, kc, vc, scale=scale, enable_gqa=True)
                else:
                    F.scaled_dot_product_attention(qs, kc, vc, attn_mask=mask, scale=scale, enable_gqa=True)
        try:
            peer()
            torch.cuda.synchronize()
        except Exception as e:  # a backend that refuses the shape is left out, said so
            print(f"  SDPA {be_name}: refused ({str(e).splitlines()[0][:100]})")
            continue
        rows.append((f"SDPA {be_name}, bf16 cache", peer, bf16_bytes))
    fa4 = None
    if fa4_aot is not None:  # FlashAttention-4's dense sm90 forward over the bf16 cache, [b, sk, hkv, d]
        spec = f"b={b},h={h},hkv={hkv},s={s},sk={sk},d={d},dtype=bf16,causal={int(causal)}"
        try:
            fa4 = fa4_aot.make(fa4_kit.parse_problem(spec), q, kb, vb, scale)
            print(f"  FA4: {fa4.kernel} ({fa4.how})")
            rows.append(("FA4, bf16 cache", fa4, bf16_bytes))
        except Exception as e:  # noqa: BLE001  no kernel built for the row: said so, left out
            print(f"  FA4: skipped ({str(e).splitlines()[0][:160]})")

    ours_fp8()
    if not args.no_ours_bf16:
        ours_bf16()
    torch.cuda.synchronize()
    if args.check:  # both against float64 over the FP8 cache's values and the bf16 one's
        def ref(kk, vv):
            kf = kk[table.long()].reshape(b, -1, hkv, d)[:, :sk].double()
            vf = vv[table.long()].reshape(b, -1, hkv, d)[:, :sk].double()
            g = h // hkv
            kf = kf.repeat_interleave(g, dim=2)
            vf = vf.repeat_interleave(g, dim=2)
            sc = torch.einsum("bshd,bkhd->bhsk", q.double(), kf) * scale
            if causal:
                i = torch.arange(s, device=dev)[:, None] + sk - s
                sc = sc.masked_fill(torch.arange(sk, device=dev)[None, :] > i, float("-inf"))
            return torch.einsum("bhsk,bkhd->bshd", sc.softmax(-1), vf)
        # dequantised caches through the table: page p of sequence i has scale kd[i]
        seq_of_page = torch.empty(b * pages_per, dtype=torch.long, device=dev)
        seq_of_page[table.view(-1).long()] = seq_rows
        k8f = k8.double() * kd[seq_of_page][:, None, :, None].double()
        v8f = v8.double() * vd[seq_of_page][:, None, :, None].double()
        e8 = (out8.double() - ref(k8f, v8f)).abs().max().item()
        if args.no_ours_bf16:
            print(f"  check: FP8 max |err| {e8:.2e} against float64 over the dequantised cache")
        else:
            e16 = (out16.double() - ref(k16, v16)).abs().max().item()
            print(f"  check: FP8 max |err| {e8:.2e} against float64 over the dequantised cache; bf16 {e16:.2e}")
        if fa4 is not None:
            ea = (fa4().double() - ref(k16, v16)).abs().max().item()
            print(f"  check: FA4 max |err| {ea:.2e} against float64 over the bf16 cache")

    times = {n: [] for n, *_ in rows}
    for r in range(args.rounds + 1):
        for n, fn, _ in (rows if r % 2 == 0 else rows[::-1]):
            t = timed(fn, args.calls, args.min_seconds)
            if r > 0:
                times[n].append(t)
    base = statistics.median(times[rows[0][0]])
    out = []
    for n, _, nbytes in rows:
        t = statistics.median(times[n])
        out.append((name, n, t, nbytes / t / 1e3, t / base))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="b16-8k,b64-8k,b128-2k,spec4,b1-32k")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--check", action="store_true", help="each row's outputs against float64 first")
    ap.add_argument("--fa4-aot", action="append", default=[],
                    help="FA4 kernels built for the rows' dense bf16 problems (the kit's build_aot.py; "
                         "repeatable; default .fa4/aot where it exists)")
    ap.add_argument("--fa4-kit", default=None, help="the FA4 kit's folder (its fa4kit.py)")
    ap.add_argument("--no-fa4", action="store_true", help="leave FlashAttention-4 out")
    ap.add_argument("--no-ours-bf16", action="store_true",
                    help="leave out attntune over the bf16 cache (context, not a peer: for a package "
                         "tuned over the FP8 cache alone)")
    args = ap.parse_args()
    fa4_kit, fa4_dirs, fa4_aot = None, [], None
    if not args.no_fa4:
        import peer_common
        fa4_kit, fa4_dirs, why = peer_common.load_kit(args, lambda K: hasattr(K, "FA4Aot"),
                                                      "{kit}/fa4kit.py has no FA4Aot (not the FA4 kit?)")
        if fa4_kit is None:
            print(f"FA4: skipped: {why}")
        else:
            try:
                fa4_aot = fa4_kit.FA4Aot(fa4_dirs)
            except Exception as e:  # noqa: BLE001
                print(f"FA4: skipped: {str(e).splitlines()[0][:160]}")
    import attntune  # the package of `attntune export --torch` on PYTHONPATH

    attntune.default().set_policy("raise", 1e9)
    print(f"FP8 KV-cache decode, pages of {args.page}; GPU {torch.cuda.get_device_name(0)}; state {gpu_state()}")
    table = []
    for name in args.rows.split(","):
        b, h, hkv, s, sk, d = ROWS[name]
        print(f"{name}: b={b} h={h}/{hkv} s={s} sk={sk} d={d}")
        table += row(name, b, h, hkv, s, sk, d, args.page, args, attntune, fa4_kit, fa4_aot)
    print(f"\n{'row':8s} {'contender':28s} {'us':>9s} {'GB/s':>7s} {'x FP8':>7s}")
    for name, n, t, gbs, x in table:
        print(f"{name:8s} {n:28s} {t:9.2f} {gbs:7.0f} {x:7.2f}")
    print(f"state after: {gpu_state()}")


if __name__ == "__main__":
    main()
