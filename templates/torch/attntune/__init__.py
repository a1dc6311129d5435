"""attntune's tuned attention kernels as PyTorch ops.

Written by `attntune export --torch DIR` around the kernels it tuned (kernels.cu, beside this file).
The first import builds them for this machine (nvcc, then torch.utils.cpp_extension with ninja; cached
under $ATTNTUNE_TORCH_CACHE or ~/.cache/attntune/torch), later imports load the cached build.

    import attntune
    out = attntune.attention(q, k, v, is_causal=True)            # like F.scaled_dot_product_attention
    out = attntune.attention_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)
    out = attntune.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)
    out = attntune.attention(q, k, v, is_causal=True, window_size=(128, 0), sinks=sink_logits)  # gpt-oss
    out = attntune.attention(q, k, v, is_causal=True, window_size=(4096, 0), softcap=50.0)      # Gemma 2
    out = attntune.attention(q, k, v_128, is_causal=True)  # DeepSeek MLA prefill: q, k at 192, out at 128
    out = attntune.mla_decode(q, kv_cache, block_table, cache_seqlens)  # MLA decode, FlashMLA's call
    out = attntune.attention_kvcache(q, k_fp8, v_fp8, cache_seqlens=lens, block_table=table,
                                     k_descale=k_scales, v_descale=v_scales)  # an FP8 cache, FA3's descales
    out = attntune.attention(q_fp8, k_fp8, v_fp8, q_descale=qs, k_descale=ks, v_descale=vs)  # FP8 forward, bf16 out
    print(attntune.coverage_table())                              # what ran where; what to tune next

The ops are torch.ops.attntune.* (TORCH_LIBRARY), with fake implementations, so torch.compile
(fullgraph) traces them; they take the current stream, never synchronise, and can be captured in a
CUDA graph. Each call runs the kernel tuned for the nearest problem of its kind, or falls back to
PyTorch (counted in coverage(); set_policy(fallback="raise") raises instead): plain calls to
F.scaled_dot_product_attention, calls with variants to an explicit fp32 path of the same semantics.

attention and attention_varlen have a backward pass (torch.library.register_autograd):
`attntune.attention(q, k, v).sum().backward()` gives q, k, v (and learnable sinks) their gradients, under
torch.compile(fullgraph=True) and in CUDA graphs too, and so does attntune.attention_varlen over a packed
batch (flash_attn_varlen_func's training call). The forward keeps its LSE; the backward (the op
attention_backward, or attention_backward_varlen for a packed batch) runs the kernel tuned for the
backward pass of the nearest problem (a problem spec's `pass=bwd`, with `varlen=N` for packed batches;
coverage() counts its calls under "attention_backward" and "attention_backward_varlen") or computes the
gradients by PyTorch (explicit math in fp32, per sequence for a packed batch: the exact gradient of the
fallback's forward), so no call fails for want of a kernel. `attntune.attention(..., deterministic=True)`
(flash_attn_func's argument; attention_varlen's too, flash_attn_varlen_func's) asks for gradients that are
bit-identical run to run: the kernel adds dQ's shares in a fixed order (at some cost in time), and a
library that cannot falls back to the explicit math, which is deterministic. attention_kvcache,
mla_decode and FP8 caches are forward-only: a gradient through them raises, saying so, and so does
attention(..., out=) or attention_varlen(..., out=) (they write into a tensor).

Causal is bottom-right (query i sees keys j <= i + Sk - S), FlashAttention's convention; for
S == Sk it is SDPA's is_causal. The variants are FlashAttention's arguments: window_size=(left,
right) (-1: unbounded; query i sees keys i + Sk - S - left <= j <= i + Sk - S + right; is_causal is
right = 0, so (left, 0) is causal), softcap=C (score = C * tanh(scale * q.k / C)), sinks= a
[heads_q] float32 tensor of logits that join each row's softmax denominator (gpt-oss).

The value head dim is v's last dim, as FlashAttention takes it: v (v_cache) must have k's shape but
for it, and out is q's shape with it last (DeepSeek's MLA prefill: q, k at 192, v and out at 128). Such
a call runs only a kernel tuned for both dims (a problem spec's `dv=N`), else falls back; the LSE is
as for one head dim.

A latent cache (DeepSeek-V2/V3's MLA decode) is one buffer whose first Dv columns are V: pass
v = k[..., :Dv] (a view: k's data pointer and strides, a smaller last dim), or call mla_decode with
FlashMLA's arguments. attention and attention_kvcache take such a view as a latent problem (latent=1
in coverage and its specs): the kernels tuned for a latent cache serve it, and those over separate K
and V too.

An FP8 KV cache (vLLM's fp8 e4m3 cache; FlashAttention-3's call): k and v (k_cache and v_cache) both of
dtype torch.float8_e4m3fn, q fp16 or bf16 (out is q's dtype), with k_descale= / v_descale= the
dequantisation scales as FlashAttention-3 takes them: float32 tensors [batch, heads_kv] (a scale per
sequence and KV head), or [1] / 0-d tensors (one scale), or None (1), on q's device; tensors only (a
python float is refused: pass torch.tensor(x)). The values attended are k.float() * k_descale and
v.float() * v_descale per (sequence, KV head). Such a call runs only a kernel tuned for an FP8 cache (a
problem spec's `kv_dtype=fp8`; kv_dtype=fp8 in coverage), else falls back to the fp32 path over the
dequantised cache. attention_varlen takes no FP8 cache.

The FP8 forward (FlashAttention-3's FP8 call): attention with q, k and v all float8_e4m3fn, q_descale= /
k_descale= / v_descale= their scales as above (q_descale [batch, heads_kv]: query head h takes KV head
h / (heads / heads_kv)'s), out bfloat16. The values attended are q.float() * q_descale and so on. The
kernels read V transposed ([B, Hkv, Dv, Sk], the keys contiguous): a v whose storage already is so (v =
vt.transpose(2, 3) of such a tensor, each row a multiple of 16 bytes) is read in place, any other through
a transposed copy made in the call. Such a call runs only a kernel tuned for the FP8 forward (a problem
spec's dtype=fp8; dtype "fp8" in coverage and explain), else falls back to the fp32 path over the
dequantised inputs. Forward-only, dense (attention_kvcache and attention_varlen take no FP8 queries).
"""
import json
import math
import numbers
import operator
import os

import torch

from . import _build

__all__ = ["attention", "attention_kvcache", "attention_varlen", "mla_decode", "coverage", "coverage_table",
           "coverage_plan",
           "reset_coverage", "set_policy", "explain", "kernels", "load", "Library", "plan_from_coverage", "untunable"]

ENTRY = {"attention": 1, "attention_kvcache": 2, "attention_varlen": 4, "attention_backward": 8,
         "attention_backward_varlen": 16}
# The backward pass's entries (their problems' specs end in ,pass=bwd; regime train).
BACKWARD_ENTRIES = ("attention_backward", "attention_backward_varlen")
# seqlen_q up to this is the decode regime (flash_decode's launch plan, kDecodeMaxSeqlenQ; _ops.cpp's
# kDecodeMaxQ; a unit test holds them together).
DECODE_MAX_SEQLEN_Q = 16
_REGISTERED = set()


def _no_backward(name):
    def backward(ctx, *grads):
        raise RuntimeError(f"attntune.{name} has no backward pass: it is forward-only (inference; attntune.attention "
                           "and attntune.attention_varlen have one). Use F.scaled_dot_product_attention where you need "
                           "gradients.")
    return backward


def _no_double_backward(name):
    def backward(ctx, *grads):
        raise RuntimeError(f"attntune.{name} has no double backward (a gradient of its gradients)")
    return backward


def _attention_setup(ctx, inputs, output):
    """attention's autograd context: the tensors its backward reads (the forward's inputs, out and lse,
    which attntune.attention always asks for under autograd) and its arguments. Gradients the caller
    never asked for arrive as None (not zeros): an unused LSE costs nothing and keeps the kernel path."""
    q, k, v, scale, is_causal, _, window_size, softcap, sinks = inputs[:9]
    out, lse = output
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.attrs = (scale, bool(is_causal), [int(w) for w in window_size], float(softcap))
    ctx.deterministic = bool(inputs[11]) if len(inputs) > 11 else False  # the op's last argument
    ctx.fp8 = _is_fp8_cache(k, v)


def _attention_backward(ns):
    def backward(ctx, dout, dlse):
        if ctx.fp8:
            raise RuntimeError("attntune.attention over an FP8 (float8_e4m3fn) cache is forward-only: it has no "
                               "backward pass")
        q, k, v, out, lse, sinks = ctx.saved_tensors
        if dout is None and dlse is None:
            return (None,) * 13
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is not None and dlse.numel() == 0:
            dlse = None  # the LSE of a call without return_lse: [0], nothing to differentiate
        scale, is_causal, window, softcap = ctx.attrs
        dq, dk, dv, dsinks = getattr(torch.ops, ns).attention_backward(dout, q, k, v, out, lse, dlse, scale, is_causal,
                                                                       window, softcap, sinks, ctx.deterministic)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None, None, None, None,
                None, dsinks if sinks is not None and need[8] else None, None, None, None, None)
    return backward


def _attention_varlen_setup(ctx, inputs, output):
    """attention_varlen's autograd context, as attention's: the forward's inputs (cu_seqlens and the
    maximum lengths too), out and lse ([heads, total_q], which attntune.attention_varlen always asks for
    under autograd) and its arguments; unwanted gradients arrive as None."""
    q, k, v, cu_q, cu_k, max_q, max_k, scale, is_causal, _, window_size, softcap, sinks = inputs[:13]
    out, lse = output
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks)
    ctx.attrs = (max_q, max_k, scale, bool(is_causal), [int(w) for w in window_size], float(softcap))
    ctx.deterministic = bool(inputs[13]) if len(inputs) > 13 else False  # the op's last argument


def _attention_varlen_backward(ns):
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
        if dout is None and dlse is None:
            return (None,) * 14
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is not None and dlse.numel() == 0:
            dlse = None  # the LSE of a call without return_lse: [0], nothing to differentiate
        max_q, max_k, scale, is_causal, window, softcap = ctx.attrs
        dq, dk, dv, dsinks = getattr(torch.ops, ns).attention_backward_varlen(
            dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dlse, scale, is_causal, window, softcap, sinks,
            ctx.deterministic)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None) + (None,) * 9 + \
            (dsinks if sinks is not None and need[12] else None, None)
    return backward


def _out_like(q, v):
    """The ops' own out (_ops.cpp's out_like): torch.empty_like(q) for one head dim; with v's last dim
    another, q's dims in the order of its strides (largest first, ties in dim order), the head dim
    innermost and v's, so the fake's strides are the op's."""
    if q.dtype == FP8:  # the FP8 forward: out in bf16, as the op's
        q = torch.empty_like(q, dtype=torch.bfloat16)
    if q.dim() == 0 or v.dim() == 0 or v.shape[-1] == q.shape[-1]:
        return torch.empty_like(q)
    n = q.dim()
    order = sorted(range(n - 1), key=lambda i: -q.stride(i)) + [n - 1]
    t = q.new_empty([v.shape[-1] if i == n - 1 else q.shape[i] for i in order])
    return t.permute([order.index(i) for i in range(n)])


def _register_python_parts(ns):
    """Fake (meta) implementations for torch.compile, and the autograd error, for the ops of `ns`."""
    if ns in _REGISTERED:
        return
    _REGISTERED.add(ns)
    lib = f"{ns}::"

    @torch.library.register_fake(lib + "attention")
    def _(q, k, v, scale=None, is_causal=False, return_lse=False, window_size=(-1, -1), softcap=0.0, sinks=None,
          k_descale=None, v_descale=None, deterministic=False, q_descale=None):
        _check_variants("attention", q, q.shape[1], is_causal, window_size, softcap, sinks)
        _check_kv("attention", q, k, v, k_descale, v_descale, q.shape[0], k.shape[1], fp8_queries=True,
                  q_descale=q_descale)
        lse = q.new_empty((q.shape[0], q.shape[1], q.shape[2]) if return_lse else (0,), dtype=torch.float32)
        return _out_like(q, v), lse

    @torch.library.register_fake(lib + "attention_into")
    def _(q, k, v, out, lse, scale=None, is_causal=False, window_size=(-1, -1), softcap=0.0, sinks=None,
          k_descale=None, v_descale=None, q_descale=None):
        _check_variants("attention", q, q.shape[1], is_causal, window_size, softcap, sinks)
        _check_kv("attention", q, k, v, k_descale, v_descale, q.shape[0], k.shape[1], fp8_queries=True,
                  q_descale=q_descale)
        return None

    @torch.library.register_fake(lib + "attention_kvcache")
    def _(q, k_cache, v_cache, cache_seqlens=None, block_table=None, scale=None, is_causal=False, return_lse=False,
          window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None, v_descale=None):
        _check_variants("attention_kvcache", q, q.shape[2], is_causal, window_size, softcap, sinks)
        _check_kv("attention_kvcache", q, k_cache, v_cache, k_descale, v_descale, q.shape[0], k_cache.shape[2],
                  "k_cache", "v_cache")
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,), dtype=torch.float32)
        return _out_like(q, v_cache), lse

    @torch.library.register_fake(lib + "attention_kvcache_into")
    def _(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, scale=None, is_causal=False,
          window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None, v_descale=None):
        _check_variants("attention_kvcache", q, q.shape[2], is_causal, window_size, softcap, sinks)
        _check_kv("attention_kvcache", q, k_cache, v_cache, k_descale, v_descale, q.shape[0], k_cache.shape[2],
                  "k_cache", "v_cache")
        return None

    @torch.library.register_fake(lib + "attention_varlen")
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=None, is_causal=False,
          return_lse=False, window_size=(-1, -1), softcap=0.0, sinks=None, deterministic=False):
        _check_variants("attention_varlen", q, q.shape[1], is_causal, window_size, softcap, sinks)
        lse = q.new_empty((q.shape[1], q.shape[0]) if return_lse else (0,), dtype=torch.float32)
        return _out_like(q, v), lse

    @torch.library.register_fake(lib + "attention_varlen_into")
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, scale=None, is_causal=False,
          window_size=(-1, -1), softcap=0.0, sinks=None):
        _check_variants("attention_varlen", q, q.shape[1], is_causal, window_size, softcap, sinks)
        return None

    @torch.library.register_fake(lib + "attention_backward")
    def _(dout, q, k, v, out, lse, dlse=None, scale=None, is_causal=False, window_size=(-1, -1), softcap=0.0,
          sinks=None, deterministic=False):
        _check_variants("attention_backward", q, q.shape[1], is_causal, window_size, softcap, sinks)
        if k.dtype in _FLOAT8 or v.dtype in _FLOAT8:
            raise ValueError("attntune.attention_backward: attention over an FP8 (float8_e4m3fn) cache is "
                             "forward-only: it has no backward pass")
        dsinks = q.new_empty((sinks.shape[0] if sinks is not None else 0,), dtype=torch.float32)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks

    @torch.library.register_fake(lib + "attention_backward_varlen")
    def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dlse=None, scale=None,
          is_causal=False, window_size=(-1, -1), softcap=0.0, sinks=None, deterministic=False):
        _check_variants("attention_backward_varlen", q, q.shape[1], is_causal, window_size, softcap, sinks)
        if k.dtype in _FLOAT8 or v.dtype in _FLOAT8:
            raise ValueError("attntune.attention_backward_varlen: FP8 caches are read by attention and "
                             "attention_kvcache only (no varlen problem has one): k and v must be q's dtype here")
        dsinks = q.new_empty((sinks.shape[0] if sinks is not None else 0,), dtype=torch.float32)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks

    # attention's and attention_varlen's backward: the ops above (a tuned backward kernel, or the
    # gradients by PyTorch).
    torch.library.register_autograd(lib + "attention", _attention_backward(ns), setup_context=_attention_setup)
    torch.library.register_autograd(lib + "attention_varlen", _attention_varlen_backward(ns),
                                    setup_context=_attention_varlen_setup)
    # The cache op is forward-only (its problems have no backward pass).
    torch.library.register_autograd(lib + "attention_kvcache", _no_backward("attention_kvcache"),
                                    setup_context=lambda ctx, inputs, output: None)
    for name, fwd in (("attention_backward", "attention"), ("attention_backward_varlen", "attention_varlen")):
        torch.library.register_autograd(lib + name, _no_double_backward(fwd),
                                        setup_context=lambda ctx, inputs, output: None)


def _window(name, window_size):
    """window_size as the ops take it, [left, right]: a pair of ints, never one int (the op schema's
    int[2] would read n as (n, n))."""
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or len(window_size) != 2:
        raise ValueError(f"attntune.{name}: window_size must be a pair (left, right), -1 for an unbounded side "
                         f"(got {window_size!r})")
    try:
        if any(isinstance(w, bool) for w in window_size):
            raise TypeError
        return [operator.index(w) for w in window_size]
    except TypeError:
        raise ValueError(f"attntune.{name}: window_size must be a pair of ints (got {window_size!r})") from None


def _check_variants(name, q, heads, is_causal, window_size, softcap, sinks):
    """The ops' checks of FlashAttention's variant arguments, in their words (_ops.cpp's variants_of
    and sinks_of), for the fake implementations and before a call (ValueError; the op itself raises
    RuntimeError). heads: q's heads, None when q's shape is wrong (the op says so)."""
    left, right = _window(name, window_size)
    if left < -1 or right < -1 or left > 2**31 - 1 or right > 2**31 - 1:
        raise ValueError(f"attntune.{name}: window_size ({left}, {right}): each side is -1 (unbounded) or a number "
                         "of keys >= 0")
    if is_causal and right > 0:
        raise ValueError(f"attntune.{name}: is_causal with window_size ({left}, {right}): causal attention sees no "
                         "key right of the diagonal (it is window_size (left, 0)); pass is_causal=False for a window "
                         "reaching right of it")
    try:
        # A number; not a tensor (reading it would sync, and break a graph), not a string.
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError
        cap = float(softcap)
    except (TypeError, ValueError):
        raise ValueError(f"attntune.{name}: softcap must be a number (got {softcap!r})") from None
    if not math.isfinite(cap) or cap < 0 or cap > 3.4028234663852886e38:
        raise ValueError(f"attntune.{name}: softcap {softcap!r}: 0 (none) or a positive finite cap")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise ValueError(f"attntune.{name}: sinks must be a tensor of [heads_q] float32 logits or None "
                             f"(got {type(sinks).__name__})")
        if heads is not None and (sinks.dim() != 1 or sinks.shape[0] != heads):
            raise ValueError(f"attntune.{name}: sinks must be [heads_q] ({heads} logits, one per query head; got "
                             f"{list(sinks.shape)})")
        if sinks.dtype != torch.float32:
            raise ValueError(f"attntune.{name}: sinks must be float32 (got {str(sinks.dtype).replace('torch.', '')})")
        if sinks.device != q.device:
            raise ValueError(f"attntune.{name}: sinks must be on q's device ({q.device}; got {sinks.device})")


FP8 = torch.float8_e4m3fn
_FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
                if hasattr(torch, n))


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _is_fp8_cache(k, v):
    """Whether (k, v) is an FP8 cache (after _check_kv accepted them)."""
    return isinstance(k, torch.Tensor) and k.dtype == FP8 and isinstance(v, torch.Tensor) and v.dtype == FP8


def _descales(name, k_descale, v_descale, k_scale, v_scale):
    """k_scale / v_scale (vLLM's names for the same per-tensor or per-(sequence, KV head) dequantisation
    factors) as k_descale / v_descale; both names for one tensor is refused."""
    if k_scale is not None:
        if k_descale is not None:
            raise ValueError(f"attntune.{name}: pass k_descale or k_scale (the same factor), not both")
        k_descale = k_scale
    if v_scale is not None:
        if v_descale is not None:
            raise ValueError(f"attntune.{name}: pass v_descale or v_scale (the same factor), not both")
        v_descale = v_scale
    return k_descale, v_descale


def _check_kv(name, q, k, v, k_descale, v_descale, batch, heads_kv, kn="k", vn="v", fp8_queries=False,
              q_descale=None):
    """The ops' checks of an FP8 cache and its scales (_ops.cpp's kv_fp8_of and descale_of), in their
    words (ValueError; the op itself raises RuntimeError): k and v both float8_e4m3fn or neither, q
    fp16/bf16 over one (or, where fp8_queries: attention's, float8_e4m3fn too: the FP8 forward, whose
    q_descale is Q's scales), scales only with one, float32 [batch, heads_kv], [1] or 0-d on q's device.
    batch, heads_kv: the call's (None when the shapes are wrong: the op says so)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return
    kf, vf = k.dtype in _FLOAT8, v.dtype in _FLOAT8
    qkv = fp8_queries and q.dtype == FP8 and k.dtype == FP8 and v.dtype == FP8  # the FP8 forward
    if q_descale is not None and not qkv:
        raise ValueError(f"attntune.{name}: q_descale dequantises the FP8 forward's q (q, k and v float8_e4m3fn); "
                         f"q is {_dtype_name(q.dtype)}")
    if kf or vf:
        if not (kf and vf):
            raise ValueError(f"attntune.{name}: {kn} and {vn} must both be float8_e4m3fn (an FP8 cache) or neither "
                             f"({kn} {_dtype_name(k.dtype)}, {vn} {_dtype_name(v.dtype)})")
        if k.dtype != FP8 or v.dtype != FP8:
            raise ValueError(f"attntune.{name}: an FP8 cache is float8_e4m3fn (got {kn} {_dtype_name(k.dtype)})")
        if q.dtype not in (torch.float16, torch.bfloat16) and not qkv:
            raise ValueError(f"attntune.{name}: an FP8 (float8_e4m3fn) cache takes fp16 or bf16 queries (q is "
                             f"{_dtype_name(q.dtype)}): " +
                             ("FP8 queries are float8_e4m3fn (the FP8 forward: q, k and v float8_e4m3fn)" if fp8_queries
                              else "FP8 queries are not supported here (attention takes them: the FP8 forward)"))
    for what, t in (("k_descale", k_descale), ("v_descale", v_descale), ("q_descale", q_descale)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"attntune.{name}: {what} must be a float32 tensor ([batch, heads_kv], [1] or 0-d) or "
                             f"None (got {type(t).__name__}; for one scale pass torch.tensor(x))")
        if not kf:
            raise ValueError(f"attntune.{name}: {what} dequantises an FP8 (float8_e4m3fn) cache; this cache is "
                             f"{_dtype_name(k.dtype)}: pass k_descale and v_descale with float8_e4m3fn caches only")
        if t.dtype != torch.float32:
            raise ValueError(f"attntune.{name}: {what} must be float32 (got {_dtype_name(t.dtype)})")
        if t.device != q.device:
            raise ValueError(f"attntune.{name}: {what} must be on q's device ({q.device}; got {t.device})")
        one = t.dim() == 0 or (t.dim() == 1 and t.shape[0] == 1)
        if not one and batch is not None and heads_kv is not None and \
                (t.dim() != 2 or t.shape[0] != batch or t.shape[1] != heads_kv):
            raise ValueError(f"attntune.{name}: {what} must be [batch, heads_kv] ([{batch}, {heads_kv}]: a scale per "
                             f"sequence and KV head), [1] or 0-d (one scale; got {list(t.shape)})")


def _needs_grad(*tensors):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _check_grad(name, *tensors):
    if _needs_grad(*tensors):
        raise RuntimeError(f"attntune.{name} has no backward pass: it is forward-only (inference; attntune.attention "
                           "and attntune.attention_varlen have one). Call it under torch.no_grad() / "
                           "inference_mode(), or use F.scaled_dot_product_attention where you need gradients.")


class Library:
    """One export's ops: `Library(cu, namespace)` builds and loads kernels.cu as torch.ops.<namespace>.
    The package's own kernels are attntune.default(); compare_sdpa.py loads several side by side."""

    def __init__(self, cu, namespace="attntune", arch=None, verbose=True):
        self.cu = os.path.abspath(cu)
        self.namespace = namespace
        self.ops, self.kernels_library = _build.load(cu, namespace=namespace, arch=arch, verbose=verbose)
        _register_python_parts(namespace)
        self.info = json.loads(self.ops.kernel_info())
        # What the attntune that wrote the package can tune (tuner.json, beside kernels.cu), or None.
        support = os.path.join(os.path.dirname(self.cu), "tuner.json")
        self.support = None
        if os.path.isfile(support):
            with open(support) as f:
                self.support = json.load(f)

    # -- the calls
    # The variants (every call): window_size=(left, right), softcap=C, sinks=[heads_q] float32 logits
    # (FlashAttention's arguments and semantics; the module's docstring).
    def attention(self, q, k, v, *, scale=None, is_causal=False, layout="bhsd", return_lse=False, out=None,
                  window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None, v_descale=None, k_scale=None,
                  v_scale=None, deterministic=False, q_descale=None):
        """SDPA's call: q [B, H, S, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (layout="bshd": [B, S, H,
        D] tensors, as flash_attn_func takes them; no copies either way). GQA when Hkv < H; Dv, v's
        last dim, may differ from D. Returns out (q's shape with Dv last), or (out, lse [B, H, S] fp32)
        with return_lse. `out`: write into this tensor instead. k and v float8_e4m3fn: an FP8 cache,
        dequantised by k_descale / v_descale (float32 [B, Hkv], [1] or 0-d; None: 1; vLLM's names
        k_scale / v_scale are the same arguments). q, k and v all float8_e4m3fn: the FP8 forward
        (FlashAttention-3's FP8 call), dequantised by q_descale / k_descale / v_descale (as above), out
        bfloat16; v is read transposed, in place when its storage already is ([B, Hkv, Dv, Sk] seen as
        vt.transpose(2, 3), rows of a multiple of 16 bytes), else through a transposed copy.
        deterministic=True (flash_attn_func's): the backward pass's gradients are bit-identical run to
        run (the forward is already)."""
        if deterministic not in (True, False):
            raise ValueError(f"attntune.attention: deterministic must be True or False (got {deterministic!r})")
        deterministic = bool(deterministic)
        k_descale, v_descale = _descales("attention", k_descale, v_descale, k_scale, v_scale)
        # Under autograd the forward keeps its LSE for the backward (attention_backward), asked for
        # whether or not the caller wants it; what cannot be differentiated is refused here.
        grad = _needs_grad(q, k, v, sinks, k_descale, v_descale, q_descale)
        if grad:
            if out is not None:
                raise RuntimeError("attntune.attention: out= writes into a tensor and is not differentiable; drop "
                                   "out= (or call it under torch.no_grad())")
            if (isinstance(q, torch.Tensor) and q.dtype == FP8) or _needs_grad(q_descale):
                raise RuntimeError("attntune.attention: the FP8 forward (float8_e4m3fn q, k and v) is forward-only: "
                                   "it has no backward pass (call it under torch.no_grad() / inference_mode())")
            if _is_fp8_cache(k, v) or _needs_grad(k_descale, v_descale):
                raise RuntimeError("attntune.attention over an FP8 (float8_e4m3fn) cache is forward-only: it has no "
                                   "backward pass (call it under torch.no_grad() / inference_mode())")
        if layout not in ("bhsd", "bshd"):
            raise ValueError(f"attntune.attention: layout must be 'bhsd' or 'bshd' (got {layout!r})")
        if layout == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if out is not None:
                out = out.transpose(1, 2)
        window = _window("attention", window_size)
        _check_variants("attention", q, q.shape[1] if q.dim() == 4 else None, is_causal, window, softcap,
                        sinks)
        four = q.dim() == 4 and k.dim() == 4
        _check_kv("attention", q, k, v, k_descale, v_descale, q.shape[0] if four else None,
                  k.shape[1] if four else None, fp8_queries=True, q_descale=q_descale)
        if out is not None:
            lse = q.new_empty(q.shape[:3], dtype=torch.float32) if return_lse else None
            self.ops.attention_into(q, k, v, out, lse, scale, is_causal, window, float(softcap), sinks, k_descale,
                                    v_descale, q_descale)
            o = out
        else:
            o, lse = self.ops.attention(q, k, v, scale, is_causal, return_lse or grad, window, float(softcap), sinks,
                                        k_descale, v_descale, deterministic, q_descale)
        if layout == "bshd":
            o = o.transpose(1, 2)
        return (o, lse) if return_lse else o

    def attention_kvcache(self, q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale=None,
                          is_causal=False, return_lse=False, out=None, window_size=(-1, -1), softcap=0.0,
                          sinks=None, k_descale=None, v_descale=None, k_scale=None, v_scale=None):
        """flash_attn_with_kvcache's call: q [B, S, H, D]; caches [B, Sk, Hkv, D], or pages
        [num_blocks, page_size, Hkv, D] with block_table [B, max_blocks] (int32), v_cache's last dim
        Dv (may differ from D); cache_seqlens [B] (int32): the keys of each sequence (None: all; the
        window is aligned to each sequence's last key). Returns out [B, S, H, Dv], or (out, lse
        [B, H, S]). Caches of float8_e4m3fn: an FP8 cache, dequantised by k_descale / v_descale
        (FlashAttention-3's: float32 [B, Hkv] per sequence and KV head, [1] or 0-d; None: 1; vLLM's
        names k_scale / v_scale are the same arguments)."""
        k_descale, v_descale = _descales("attention_kvcache", k_descale, v_descale, k_scale, v_scale)
        _check_grad("attention_kvcache", q, k_cache, v_cache, sinks, k_descale, v_descale)
        window = _window("attention_kvcache", window_size)
        _check_variants("attention_kvcache", q, q.shape[2] if q.dim() == 4 else None, is_causal, window,
                        softcap, sinks)
        four = q.dim() == 4 and k_cache.dim() == 4
        _check_kv("attention_kvcache", q, k_cache, v_cache, k_descale, v_descale, q.shape[0] if four else None,
                  k_cache.shape[2] if four else None, "k_cache", "v_cache")
        if out is not None:
            lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32) if return_lse else None
            self.ops.attention_kvcache_into(q, k_cache, v_cache, cache_seqlens, block_table, out, lse, scale,
                                            is_causal, window, float(softcap), sinks, k_descale, v_descale)
            o = out
        else:
            o, lse = self.ops.attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale, is_causal,
                                                return_lse, window, float(softcap), sinks, k_descale, v_descale)
        return (o, lse) if return_lse else o

    def mla_decode(self, q, kv_cache, block_table, cache_seqlens, *, head_dim_v=512, scale=None, is_causal=False,
                   return_lse=False, out=None, kv_descale=None, kv_scale=None):
        """Multi-head latent attention's decode over its latent cache, as FlashMLA's
        flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, ..., softmax_scale,
        causal) takes it: q [B, S, H, D] (the absorbed queries, D = kv_lora_rank + qk_rope_head_dim = 576
        for DeepSeek-V2/V3), kv_cache [num_blocks, page_size, Hkv, D] pages (FlashMLA's layout, Hkv 1;
        pages of 64) that block_table [B, max_blocks] (int32) maps, cache_seqlens [B] (int32) the keys of
        each sequence; V is each cache row's first head_dim_v (512) dims. block_table None: kv_cache is
        [B, Sk, Hkv, D], one contiguous cache per sequence. Exactly
        attention_kvcache(q, kv_cache, kv_cache[..., :head_dim_v], cache_seqlens=, block_table=, ...):
        a latent call. scale None: 1/sqrt(D) (FlashMLA's default too). Returns out [B, S, H, head_dim_v],
        or (out, lse [B, H, S] fp32) with return_lse, as FlashMLA returns them. A float8_e4m3fn cache
        (an FP8 latent cache) is dequantised by kv_descale (float32 [B, Hkv] per sequence and KV head,
        [1] or 0-d; vLLM's name kv_scale is the same argument; None: 1): one scale for K and for V,
        which is K's first head_dim_v dims."""
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
            raise ValueError("attntune.mla_decode: kv_cache must be a 4-d tensor: [num_blocks, page_size, heads_kv, "
                             "head_dim] pages (FlashMLA's), or [batch, seqlen_k, heads_kv, head_dim] without a "
                             "block_table")
        if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, numbers.Integral) or \
                not 0 < head_dim_v < kv_cache.shape[-1]:
            raise ValueError(f"attntune.mla_decode: head_dim_v must be an int from 1 to below the cache's head dim "
                             f"({kv_cache.shape[-1]}): V is each row's first head_dim_v dims (got {head_dim_v!r})")
        if kv_descale is not None and kv_scale is not None:
            raise ValueError("attntune.mla_decode: give kv_descale or kv_scale (the same argument, vLLM's name), "
                             "not both")
        descale = kv_descale if kv_descale is not None else kv_scale
        return self.attention_kvcache(q, kv_cache, kv_cache[..., :int(head_dim_v)], cache_seqlens=cache_seqlens,
                                      block_table=block_table, scale=scale, is_causal=is_causal,
                                      return_lse=return_lse, out=out, k_descale=descale, v_descale=descale)

    def attention_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale=None,
                         is_causal=False, return_lse=False, out=None, window_size=(-1, -1), softcap=0.0, sinks=None,
                         deterministic=False):
        """flash_attn_varlen_func's call: q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]
        (Dv may differ from D), cu_seqlens [B + 1] (int32, on the device; total_q = cu_seqlens_q[B], as
        flash_attn_varlen_func packs them), max lengths as ints. Returns out [total_q, H, Dv], or (out, lse
        [H, total_q]). Differentiable (attention_backward_varlen); deterministic=True
        (flash_attn_varlen_func's): the backward pass's gradients are bit-identical run to run."""
        if deterministic not in (True, False):
            raise ValueError(f"attntune.attention_varlen: deterministic must be True or False (got {deterministic!r})")
        deterministic = bool(deterministic)
        if any(isinstance(t, torch.Tensor) and t.dtype in _FLOAT8 for t in (k, v)):
            raise ValueError("attntune.attention_varlen: FP8 caches are read by attention and attention_kvcache only "
                             "(no varlen problem has one): k and v must be q's dtype here")
        # Under autograd the forward keeps its LSE for the backward (attention_backward_varlen).
        grad = _needs_grad(q, k, v, sinks)
        if grad and out is not None:
            raise RuntimeError("attntune.attention_varlen: out= writes into a tensor and is not differentiable; drop "
                               "out= (or call it under torch.no_grad())")
        window = _window("attention_varlen", window_size)
        _check_variants("attention_varlen", q, q.shape[1] if q.dim() == 3 else None, is_causal, window,
                        softcap, sinks)
        if out is not None:
            lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if return_lse else None
            self.ops.attention_varlen_into(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse,
                                           scale, is_causal, window, float(softcap), sinks)
            o = out
        else:
            o, lse = self.ops.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               scale, is_causal, return_lse or grad, window, float(softcap), sinks,
                                               deterministic)
        return (o, lse) if return_lse else o

    # -- what ran where
    def coverage(self, reset=False):
        """One entry per call shape seen: its entry point, dtype, problem, calls, and the kernel that
        served it (index and label) or why it fell back ("tunable": tuning that problem would give it a
        kernel, as against a CPU tensor or a layout the kernels cannot read). Calls inside a captured
        CUDA graph count once, at capture."""
        rows = json.loads(self.ops.coverage())
        for r in rows:
            if r["tunable"]:
                why = untunable(r, self.support)
                if why:
                    r["tunable"] = False
                    r["fallback"] += f"; {why}"
        if reset:
            self.ops.reset_coverage()
        return rows

    def reset_coverage(self):
        self.ops.reset_coverage()

    def coverage_table(self):
        """coverage() as a table, with the problem specs to tune for the shapes that fell back."""
        rows = self.coverage()
        if not rows:
            return "attntune: no calls yet"
        specs = [problem_spec(r) for r in rows]
        width = max([44] + [len(s) for s in specs])
        ew = max([18] + [len(r["entry"]) for r in rows])  # "attention_backward_varlen" is longer
        lines = [f"{'entry':<{ew}} {'dtype':<5} {'problem':<{width}} {'calls':>7}  served by"]
        todo = []
        for r, spec in zip(rows, specs):
            # Calls with variants or an FP8 cache fall back to the explicit fp32 path, plain ones to SDPA.
            # attention's and attention_varlen's backward fall back to explicit fp32 gradients.
            fp32 = _variant_spec(r["problem"]) or r["problem"].get("kv_dtype") == "fp8" or r["dtype"] == "fp8" or \
                r["entry"] in BACKWARD_ENTRIES
            path = "fp32 fallback" if fp32 else "SDPA fallback"
            served = r["label"] if r["kernel"] is not None else f"{path}: {r['fallback']}"
            lines.append(f"{r['entry']:<{ew}} {r['dtype']:<5} {spec:<{width}} {r['calls']:>7}  {served}")
            if r["tunable"] and spec:
                todo.append(spec)
        if todo:
            lines.append("")
            lines.append("to tune them (on the GPU), one by one or all at once (coverage_plan(PATH), then "
                         "attntune submit PATH and attntune serve):")
            lines += [f"  attntune tune --problem {s}" for s in todo]
        return "\n".join(lines)

    def coverage_plan(self, path=None, model="attntune coverage"):
        """The shapes that fell back for want of a tuned kernel, as a plan that `attntune submit PLAN`
        queues (then `attntune serve`, and export --torch again); written to `path` (JSON) if given,
        and returned as a dict. Empty when nothing is left to tune."""
        plan = plan_from_coverage(self.coverage(), model)
        if path is not None:
            with open(path, "w") as f:
                json.dump(plan, f, indent=2)
                f.write("\n")
        return plan

    def set_policy(self, fallback="sdpa", max_length_ratio=16.0):
        """fallback: "sdpa" (calls no kernel serves run in PyTorch: F.scaled_dot_product_attention, or
        for calls with variants or an FP8 cache an explicit fp32 path of the same semantics) or "raise".
        max_length_ratio: how far (as a ratio of seqlen_q or seqlen_k) a call may be from the problem its
        nearest kernel was tuned for, and still run it."""
        self.ops.set_policy(fallback, float(max_length_ratio))

    def explain(self, entry, dtype, head_dim, is_causal, b, h, hkv, s, sk, *, window_size=(-1, -1), softcap=0.0,
                sinks=False, head_dim_v=None, latent=False, kv_dtype=None, deterministic=False):
        """(kernel index or -1, reason): what a call of `entry` ("attention", "attention_kvcache",
        "attention_varlen", "attention_backward": attention's backward pass, or "attention_backward_varlen":
        attention_varlen's, b sequences of up to s rows) with this problem would run, on a GPU, and why.
        The variants as the
        calls take them (sinks: whether the call passes any); head_dim_v: v's head dim (None:
        head_dim); latent: v is k's first head_dim_v columns (a view of one cache, mla_decode's);
        kv_dtype: "fp8" for an FP8 e4m3 cache (None: a cache of q's dtype); dtype "fp8": the FP8 forward
        (attention with q, k and v float8_e4m3fn, out bf16); deterministic: a backward
        call of attention(..., deterministic=True) or attention_varlen(..., deterministic=True)
        (bit-identical gradients)."""
        if entry not in ENTRY:
            raise ValueError(f"attntune.explain: entry must be one of {', '.join(ENTRY)} (got {entry!r})")
        if kv_dtype is not None and kv_dtype not in ("fp8", dtype):
            raise ValueError(f"attntune.explain: kv_dtype must be None (a cache of q's dtype), 'fp8' (an FP8 e4m3 "
                             f"cache) or the dtype, {dtype} (got {kv_dtype!r})")
        window = _window("explain", window_size)
        _check_variants("explain", None, None, is_causal, window, softcap, None)
        args = (ENTRY[entry], dtype, head_dim, bool(is_causal), b, h, hkv, s, sk, window, float(softcap),
                sinks is not None and sinks is not False, 0 if head_dim_v is None else head_dim_v, bool(latent))
        return tuple(self.ops.explain(*args, "fp8" if kv_dtype == "fp8" else None, bool(deterministic)))

    def kernels(self):
        """The kernels of the library: attntune_kernel_info()'s "kernels"."""
        return self.info.get("kernels", [])


_VARIANT_WORDS = {"window": "sliding windows", "softcap": "logit soft-capping", "sinks": "attention sinks"}


def _variants_of(p):
    """The variant keys a coverage() problem has: of "window", "softcap", "sinks"."""
    window = p.get("window", [-1, -1])
    return [key for key, on in (("window", window[0] >= 0 or window[1] >= 0), ("softcap", p.get("softcap", 0) > 0),
                                ("sinks", bool(p.get("sinks")))) if on]


def _regime(row):
    """The regime a coverage() row's problem is tuned as (coverage_plan's, and tuner.json's
    "regimes"): decode for seqlen_q <= 16; chunk for the kvcache entry with more rows; varlen; prefill.
    attention's and attention_varlen's backward (attention_backward, attention_backward_varlen) are a
    training step's: train (plan's regime word; a dense or packed problem of any length, pass=bwd)."""
    if row["entry"] in BACKWARD_ENTRIES:
        return "train"
    if row["problem"]["s"] <= 16:
        return "decode"
    return {"attention_kvcache": "chunk", "attention_varlen": "varlen"}.get(row["entry"], "prefill")


def _pass(row):
    """The pass of a coverage() row's problem: "bwd" for attention's and attention_varlen's backward, else
    "fwd" (tuner.json's "pass": the passes a family tunes; a family without it tunes the forward alone)."""
    return "bwd" if row["entry"] in BACKWARD_ENTRIES else "fwd"


def untunable(row, support):
    """Why no family of the attntune that wrote the package (its tuner.json) tunes this coverage()
    row's problem ("" when one does, or when that is not known): its head_dim or dtype, its regime,
    its value head dim, its latent cache, its FP8 cache, or its variants (a windowed prefill problem is not tunable
    because flash_decode tunes windows)."""
    if not support:
        return ""
    p = row["problem"]
    # Only the families of the row's pass (a backward family never tunes a forward problem, nor the reverse).
    fams = [f for f in support.get("families", []) if _pass(row) in f.get("support", {}).get("pass", ["fwd"])]
    if not fams and _pass(row) == "bwd":
        return "no attntune family tunes the backward pass (pass=bwd)"
    regime, wanted = _regime(row), _variants_of(p)
    dv = p.get("dv")  # only where it is not d
    why = []
    for f in fams:
        s = f.get("support", {})
        if str(p["d"]) not in s.get("d", [str(p["d"])]) or row["dtype"] not in s.get("dtype", [row["dtype"]]):
            continue
        if "regimes" in f and regime not in f["regimes"]:
            why.append(f"{f['family']} tunes no {regime} problem")
            continue
        # A family tunes dv != d only where its problem section lists dv (an attntune before it: none).
        if dv is not None and str(dv) not in s.get("dv", []):
            why.append(f"{f['family']} tunes no value head dim {dv} beside head_dim {p['d']}")
            continue
        # A latent cache only where it lists latent (an attntune before it: none).
        if p.get("latent") and "1" not in s.get("latent", []):
            why.append(f"{f['family']} tunes no latent cache")
            continue
        # An FP8 cache only where it lists kv_fp8 (an attntune before it: none).
        if p.get("kv_dtype") == "fp8" and "1" not in s.get("kv_fp8", []):
            why.append(f"{f['family']} tunes no FP8 KV cache")
            continue
        # A key the family's support lacks: an attntune before the variants, which tuned none.
        missing = [_VARIANT_WORDS[k] for k in wanted if "1" not in s.get(k, ["0"])]
        if missing:
            why.append(f"{f['family']} tunes no {' or '.join(missing)}")
            continue
        return ""
    if not why:
        ds = sorted({int(d) for f in fams for d in f.get("support", {}).get("d", [])})
        return f"no attntune family tunes head_dim={p['d']} {row['dtype']} (head dims: {', '.join(map(str, ds))})"
    return f"no attntune family tunes this {regime} problem ({'; '.join(why)})"


def _variant_spec(p):
    """The problem spec's variant keys of a coverage() problem (",window=L[,R],softcap=C,sinks=1"),
    as attntune writes them: a causal window has no right side, an unbounded side is -1."""
    spec = ""
    left, right = p.get("window", [-1, -1])
    if left >= 0 or right >= 0:
        spec += f",window={left}" if right < 0 else f",window={left},{right}"
    cap = p.get("softcap", 0)
    if cap > 0:
        spec += f",softcap={int(cap)}" if float(cap).is_integer() and abs(cap) < 1e15 else f",softcap={cap!r}"
    if p.get("sinks"):
        spec += ",sinks=1"
    return spec


def problem_spec(row):
    """attntune's problem spec of one coverage() row ("b=..,h=..,...,d=..[,dv=N],dtype=..,causal=..
    [,page=N|,varlen=1][,window=L[,R]][,softcap=C][,sinks=1][,latent=1][,kv_dtype=fp8][,pass=bwd]"); varlen=1
    for a packed batch (entries "attention_varlen" and "attention_backward_varlen"), pass=bwd for the backward
    pass (entries "attention_backward" and "attention_backward_varlen")."""
    p = row["problem"]
    dv = f",dv={p['dv']}" if p.get("dv") is not None and p["dv"] != p["d"] else ""
    spec = (f"b={p['b']},h={p['h']},hkv={p['hkv']},s={p['s']},sk={p['sk']},d={p['d']}{dv},dtype={row['dtype']},"
            f"causal={p['causal']}")
    if row["entry"] == "attention_kvcache" and p["paged"]:
        spec += f",page={p['paged']}"
    elif row["entry"] == "attention_kvcache" and p["s"] > DECODE_MAX_SEQLEN_Q:
        # Chunked prefill over a contiguous cache: a prefill kernel serves the kvcache entry only
        # when tuned on a paged problem, and that build serves contiguous caches too (pages of 64
        # are what it is timed on).
        spec += ",page=64"
    if row["entry"] in ("attention_varlen", "attention_backward_varlen"):
        # A packed batch of b sequences up to max_seqlen_q (s) rows: tuned on lengths drawn from 1..s
        # (`varlen=1`), keys sk - s more than queries. "" when that cannot be said (sk < s). Its backward
        # pass the same, with pass=bwd.
        if p["sk"] < p["s"] or p["s"] < 1:
            return ""
        spec += ",varlen=1"
    # A windowed call is another problem: its kernel is built for the window (its sides are
    # arguments: the tuned ones are the call's). A latent call (v a view of k's first dv columns) is
    # a latent problem: `latent=1` last, as attntune prints it.
    # An FP8 cache: `kv_dtype=fp8` at the very end, as attntune prints it.
    # The backward pass: `pass=bwd` at the very end, as attntune prints it.
    return spec + _variant_spec(p) + (",latent=1" if p.get("latent") else "") + \
        (",kv_dtype=fp8" if p.get("kv_dtype") == "fp8" else "") + \
        (",pass=bwd" if row["entry"] in BACKWARD_ENTRIES else "")


def plan_from_coverage(rows, model="attntune coverage"):
    """The plan (docs/design/plan.md: {model, source, problems: [{problem, regime}]}) of the rows of
    coverage() that fell back for want of a tuned kernel: regime decode for seqlen_q <= DECODE_MAX_SEQLEN_Q, chunk
    for the kvcache entry with more rows (chunked prefill, tuned paged), prefill for the dense and
    varlen entries, train for attention's and attention_varlen's backward (their specs end in ,pass=bwd;
    attention_varlen's, ,varlen=1,pass=bwd)."""
    problems, seen = [], set()
    for r in rows:
        if not r.get("tunable"):
            continue
        decode = r["problem"]["s"] <= DECODE_MAX_SEQLEN_Q
        regime = ("train" if r["entry"] in BACKWARD_ENTRIES else "decode" if decode else
                  "chunk" if r["entry"] == "attention_kvcache" else "prefill")
        spec = problem_spec(r)
        if spec and spec not in seen:
            seen.add(spec)
            problems.append({"problem": spec, "regime": regime})
    return {"model": model, "source": "attntune.coverage()", "problems": problems}


_default = None
_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.cu")


def load(cu=None, namespace="attntune", arch=None, verbose=True):
    """The package's own kernels (cu=None) as torch.ops.attntune, or another export under its own
    namespace. Imported packages load their kernels at import."""
    global _default
    if cu is None:
        if _default is None:
            _default = Library(_KERNELS, "attntune", arch=arch, verbose=verbose)
        return _default
    return Library(cu, namespace, arch=arch, verbose=verbose)


def default():
    if _default is None:
        raise RuntimeError("attntune: this package holds no kernels.cu (write a package with "
                           "`attntune export --torch DIR`), or use attntune.load(cu, namespace)")
    return _default


if os.path.exists(_KERNELS) and not os.environ.get("ATTNTUNE_TORCH_NO_AUTOLOAD"):
    load()


def attention(q, k, v, *, scale=None, is_causal=False, layout="bhsd", return_lse=False, out=None,
              window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None, v_descale=None, k_scale=None,
              v_scale=None, deterministic=False, q_descale=None):
    return default().attention(q, k, v, scale=scale, is_causal=is_causal, layout=layout, return_lse=return_lse,
                               out=out, window_size=window_size, softcap=softcap, sinks=sinks, k_descale=k_descale,
                               v_descale=v_descale, k_scale=k_scale, v_scale=v_scale, deterministic=deterministic,
                               q_descale=q_descale)


def attention_kvcache(q, k_cache, v_cache, *, cache_seqlens=None, block_table=None, scale=None, is_causal=False,
                      return_lse=False, out=None, window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None,
                      v_descale=None, k_scale=None, v_scale=None):
    return default().attention_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                                       scale=scale, is_causal=is_causal, return_lse=return_lse, out=out,
                                       window_size=window_size, softcap=softcap, sinks=sinks, k_descale=k_descale,
                                       v_descale=v_descale, k_scale=k_scale, v_scale=v_scale)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale=None,
                     is_causal=False, return_lse=False, out=None, window_size=(-1, -1), softcap=0.0, sinks=None,
                     deterministic=False):
    return default().attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=scale,
                                      is_causal=is_causal, return_lse=return_lse, out=out, window_size=window_size,
                                      softcap=softcap, sinks=sinks, deterministic=deterministic)


def mla_decode(q, kv_cache, block_table, cache_seqlens, *, head_dim_v=512, scale=None, is_causal=False,
               return_lse=False, out=None, kv_descale=None, kv_scale=None):
    return default().mla_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v=head_dim_v, scale=scale,
                                is_causal=is_causal, return_lse=return_lse, out=out, kv_descale=kv_descale,
                                kv_scale=kv_scale)


def coverage(reset=False):
    return default().coverage(reset)


def coverage_table():
    return default().coverage_table()


def reset_coverage():
    default().reset_coverage()


def coverage_plan(path=None, model="attntune coverage"):
    return default().coverage_plan(path, model)


def set_policy(fallback="sdpa", max_length_ratio=16.0):
    default().set_policy(fallback, max_length_ratio)


def explain(entry, dtype, head_dim, is_causal, b, h, hkv, s, sk, *, window_size=(-1, -1), softcap=0.0, sinks=False,
            head_dim_v=None, latent=False, kv_dtype=None, deterministic=False):
    return default().explain(entry, dtype, head_dim, is_causal, b, h, hkv, s, sk, window_size=window_size,
                             softcap=softcap, sinks=sinks, head_dim_v=head_dim_v, latent=latent, kv_dtype=kv_dtype,
                             deterministic=deterministic)


def kernels():
    return default().kernels()
