"""Attention with FlashAttention's variants, written out plainly: the reference of tests/torch/ (the
fallback on the CPU in test_ops.py, the kernels on the GPU in test_ops_gpu.py).

Semantics (docs/CONTRACT.md "Variants"): query row i of a sequence of len_q rows over len_k keys,
bottom-right aligned (i' = i + len_k - len_q), sees keys j with i' - left <= j <= i' + right and
j < len_k (-1: an unbounded side; causal is right = 0); a soft-cap c > 0 makes a score
c * tanh(scale * q.k / c) before masking; a sink logit s_h (per query head) joins each row's softmax
denominator with no value row. A row that sees no key gives zeros and LSE -inf, or s_h with a sink.

Not the ops' algorithm (variant_into in _ops.cpp): the sink joins the softmax as one more column here,
where the ops add it through the LSE afterwards, and every (row, key) pair is masked explicitly.
"""
import math

import torch


def visible_mask(S, Sk, len_q, len_k, causal, window, device=None):
    """[B, 1, S, Sk] bool: which keys each row of each sequence sees. len_q, len_k: lists of ints
    (each sequence's rows and keys; rows past len_q see what their position implies, and callers
    ignore them)."""
    left, right = window[0], 0 if causal else window[1]
    B = len(len_q)
    i = torch.arange(S, device=device)[None, :, None]
    j = torch.arange(Sk, device=device)[None, None, :]
    lq = torch.tensor(len_q, device=device)[:, None, None]
    lk = torch.tensor(len_k, device=device)[:, None, None]
    diag = i + lk - lq
    mask = j < lk
    if left >= 0:
        mask = mask & (j >= diag - left)
    if right >= 0:
        mask = mask & (j <= diag + right)
    return mask.expand(B, S, Sk)[:, None]


def attention(q, k, v, scale, *, causal=False, window=(-1, -1), softcap=0.0, sinks=None, len_q=None, len_k=None,
              dtype=torch.float64):
    """q [B, H, S, D] over k [B, Hkv, Sk, D] and v [B, Hkv, Sk, Dv] (GQA: head h reads K/V head
    h // (H / Hkv); Dv, the value head dim, may differ from D: out is [B, H, S, Dv]).
    dtype float64: the exact reference (out [B, H, S, D] and lse [B, H, S] in float64). Another
    dtype: FlashAttention's attention_ref in low precision (the inputs and P V in `dtype`, the softmax
    in float32), whose error against float64 sets the bound of FlashAttention-2's criterion."""
    B, H, S, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    len_q = [S] * B if len_q is None else list(len_q)
    len_k = [Sk] * B if len_k is None else list(len_k)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    qd, kd, vd = (t.to(dtype) for t in (q, k, v))
    if Hkv != H:
        kd, vd = kd.repeat_interleave(H // Hkv, 1), vd.repeat_interleave(H // Hkv, 1)
    # Keys past a sequence's length may hold anything (NaN in a stale cache): never multiplied.
    keep = (torch.arange(Sk, device=q.device)[None, :] < torch.tensor(len_k, device=q.device)[:, None])
    kd = torch.where(keep[:, None, :, None], kd, torch.zeros((), dtype=dtype, device=q.device))
    vd = torch.where(keep[:, None, :, None], vd, torch.zeros((), dtype=dtype, device=q.device))
    s = torch.matmul(qd, kd.transpose(-1, -2)).to(acc) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~visible_mask(S, Sk, len_q, len_k, causal, window, q.device), float("-inf"))
    if sinks is not None:  # one more column: the sink's logit, no value
        col = sinks.to(device=q.device, dtype=acc).view(1, H, 1, 1).expand(B, H, S, 1)
        s = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[..., None])
    if sinks is not None:
        p = p[..., :Sk]
    out = torch.matmul(p.to(dtype), vd)
    return out, lse.to(torch.float64)


def fa2_bound(ref_lowp, ref64, dtype):
    """FlashAttention-2's criterion: max |out - ref64| <= 2 * max |ref_lowp - ref64| + atol."""
    atol = 1 / 512 if dtype == torch.bfloat16 else 1 / 4096
    lowp = (ref_lowp.double() - ref64).abs().max().item() if ref64.numel() else 0.0
    return 2 * lowp + atol


def compare(out, lse, ref64, lse64, ref_lowp, dtype, lse_atol=1e-3):
    """(ok, message): out against float64 by FlashAttention-2's criterion (NaN fails), and the LSE
    (None: not checked): -inf exactly where the reference's is, within lse_atol elsewhere (a sink of
    1e3 is its rows' LSE: fp32 holds it within 6e-5)."""
    err = (out.double() - ref64).abs().max().item() if out.numel() else 0.0
    bound = fa2_bound(ref_lowp, ref64, dtype)
    ok = math.isfinite(err) and err <= bound
    msg = f"err {err:.2e} <= {bound:.2e}"
    if lse is not None:
        got = lse.double()
        finite = torch.isfinite(lse64)
        same_inf = torch.equal(torch.isneginf(got), torch.isneginf(lse64)) and not torch.isnan(got).any().item()
        lse_err = (got[finite] - lse64[finite]).abs().max().item() if finite.any() else 0.0
        ok = ok and same_inf and lse_err <= lse_atol
        msg += f", lse err {lse_err:.1e}" + ("" if same_inf else ", -inf rows differ")
    return ok, msg


def paged_cache(k, v, lens, page, seed):
    """A paged KV cache as serving engines keep it, from k [B, Hkv, Sk, D] and v [B, Hkv, Sk, Dv]:
    pages [num_pages, page, Hkv, D] (v's Dv) that a shuffled block table [B, ceil(Sk / page)] (int32) maps, with spare pages,
    NaN past each sequence's length (lens) and in the spare pages, as a stale cache may hold. page
    0: the contiguous cache [B, Sk, Hkv, D] (NaN past each length) and table None."""
    B, Hkv, Sk, D = k.shape
    if not page:
        kc, vc = k.transpose(1, 2).clone(), v.transpose(1, 2).clone()
        for b, n in enumerate(lens):
            kc[b, n:], vc[b, n:] = float("nan"), float("nan")
        return kc, vc, None
    per = (Sk + page - 1) // page
    num = B * per + 3
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(num, generator=g)[:B * per].view(B, per).to(torch.int32)
    kp = torch.full((num, page, Hkv, D), float("nan"), dtype=k.dtype, device=k.device)
    vp = torch.full((num, page, Hkv, v.shape[-1]), float("nan"), dtype=v.dtype, device=v.device)
    for b, n in enumerate(lens):
        for j in range(0, n, page):
            m = min(page, n - j)
            kp[int(table[b, j // page]), :m] = k[b, :, j:j + m].transpose(0, 1)
            vp[int(table[b, j // page]), :m] = v[b, :, j:j + m].transpose(0, 1)
    return kp, vp, table.to(k.device)


def sink_logits(H, seed=0, device=None):
    """Sink logits by head in turns as the tuner validates them: a random one in [-2, 10], -1e4 (no
    effect) and 1e3 (every row's output ~0, its LSE 1e3)."""
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([[float(torch.rand((), generator=g)) * 12 - 2, -1e4, 1e3][h % 3] for h in range(H)],
                        dtype=torch.float32, device=device)


def spec_of(p):
    """A kernel's problem (kernel_info) as attntune writes its spec (kernel_info's entry_points)."""
    dv = f",dv={p['dv']}" if p.get("dv") and p["dv"] != p["d"] else ""  # only for two head dims
    s = (f"b={p['b']},h={p['h']},hkv={p['hkv']},s={p['s']},sk={p['sk']},d={p['d']}{dv},dtype={p['dtype']},"
         f"causal={int(p['causal'])}")
    if p.get("page"):
        s += f",page={p['page']}"
    if p.get("varlen"):
        s += f",varlen={p['varlen']}" + (f",lens_seed={p['lens_seed']}" if p.get("lens_seed") else "")
    if "window" in p:
        s += f",window={p['window'][0]}" + (f",{p['window'][1]}" if p["window"][1] >= 0 else "")
    if p.get("softcap"):
        s += f",softcap={p['softcap']:g}"
    if p.get("sinks"):
        s += ",sinks=1"
    if p.get("latent"):  # V is K's first dv columns: last, after the variants
        s += ",latent=1"
    if p.get("kv_dtype") == "fp8":  # an FP8 cache: after the rest
        s += ",kv_dtype=fp8"
    if p.get("pass") == "bwd":  # the backward pass: the very end
        s += ",pass=bwd"
    return s


def dequantised(cache, descale, group=1):
    """An FP8 cache [.., Hkv, D] (float8_e4m3fn, the heads second to last: [B, Sk, Hkv, D] or pages) as
    float64 values times its scales (FlashAttention-3's descale: [B, Hkv] per sequence and KV head with
    the batch first, [1] / 0-d one, None 1): what the kernels and the fallback attend to. `group`: the
    FP8 forward's q ([B, S, H, D], H = Hkv * group), query head h taking KV head h / group's scale."""
    x = cache.double()
    if descale is None:
        return x
    d = descale.double()
    if d.numel() == 1:
        return x * d.reshape(())
    d = d.repeat_interleave(group, 1)
    return x * d.view(d.shape[0], *([1] * (cache.dim() - 3)), d.shape[1], 1)
