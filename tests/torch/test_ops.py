"""The PyTorch package of `attntune export --torch`, without a GPU (ctest `torch_ops`, label cpu;torch).

Builds a real package with the real torch and nvcc from a database this test makes: `submit` and
`serve --simulate` (the synthetic GPU: real renders and source hashes, made-up timings) over 19
problems, plain, with FlashAttention's variants, with a value head dim other than d, over a latent
cache, over an FP8 cache and of the backward pass, in copies of the shipped flash_fwd_mma and flash_decode spaces
that list the variants (a family's own YAML lists them once its kernels serve them) and in the shipped
flash_decode_wgmma and flash_bwd_mma spaces;
here the kernels are only built, never run. Then checks what runs without a GPU:
  - the dispatch: explain() against this file's own statement of the rule (the kernels built for
    the call's entry point, head dims, causality and variants; nearest lengths by ratio, then the GQA
    group, then batch * heads; the decode/prefill regime; max_length_ratio), variants included: a
    windowed call never gets a full-attention kernel, a window (L, 0) is causal;
  - the fallback's values (CPU tensors fall back) against float64 (variant_reference.py): dense with
    bottom-right causal, rows that see no key, GQA, [B,S,H,D] views, LSE; windows (left in
    {0, 1, 127, -1} x right in {0, -1, 64}), soft-caps 30 and 50, sinks (very negative and very
    large logits too), their combinations, with sk != s both ways; kvcache over random block tables
    and ragged lengths (0, 1, odd, max); varlen over ragged packings;
  - argument errors (window, is_causal, softcap, sinks), through the Python functions and the ops;
  - coverage counts, records and plans with variants, and the raise policy; the fake
    implementations (their shapes, torch.library.opcheck, torch.compile(fullgraph=True) with
    variants);
  - export --torch's refusal of a directory it did not write, and its tuner.json;
  - the backward pass (attention's autograd, the op attention_backward; flash_bwd_mma kernels at d=128
    and at d=64 with a window, pass=bwd): the dispatch (backward kernels for attention_backward alone,
    never a forward call), the gradients of the fallback against float64 autograd (FA2's criterion in
    bf16/fp16, 1e-10 in float64: GQA, bottom-right causal, rows without keys, windows, soft-caps, sinks
    and their gradient, a used LSE, [B,S,H,D]) and torch.autograd.gradcheck, .sum().backward(), the
    forward-only ops' errors, coverage, specs, plans (`submit` reads them back), tuner.json's "pass",
    untunable and the raise policy with pass=bwd, opcheck of attention_backward and of attention with
    grads, torch.compile(fullgraph=True) of a training step; deterministic=True (the ops' last
    argument, which autograd hands to attention_backward; deterministic backward calls dispatched to
    the kernels, whose plans serve them; the fallback's gradients the same bits with and without it);
  - attention_varlen's backward pass (the op attention_backward_varlen; a flash_bwd_mma kernel at d=128,
    varlen=64,pass=bwd): the dispatch (the varlen backward kernel for attention_backward_varlen alone,
    the dense one never for it), the fallback's gradients per sequence against float64 autograd on
    ragged packings (empty sequences, one row, no keys, GQA, windows, soft-caps, sinks and their
    gradient, a used LSE, Dv != D) and gradcheck, the op's argument checks, coverage, specs
    (`varlen=1,pass=bwd`), plans (`submit` reads them back), untunable and the raise policy,
    deterministic, opcheck, no double backward and torch.compile(fullgraph=True) of a training step;
  - value head dims (v's last dim Dv != D, DeepSeek's MLA prefill): the dispatch (a split kernel
    serves only calls of its two dims, and no one-dim call), the fallback's values with Dv != D on
    every entry (variants too) against float64, out's shape and strides, the refusals of mismatched
    shapes naming both, coverage and plans with `dv=N`, the fakes and torch.compile;
  - latent caches (MLA decode: v = k[..., :Dv], one buffer; flash_decode_wgmma at d=576, dv=512): the
    dispatch (attntune_options.latent: the latent kernel for latent calls only, the build over
    separate K and V for both), which calls are latent (a view with k's pointer and strides and a
    smaller last dim; not a copy, an offset view, v = k, varlen), coverage, specs, plans and the raise
    policy with `latent=1`, mla_decode as attention_kvcache over the view (FlashMLA's layout), the
    fallback's values over the view (paged, contiguous, dense, variants) against float64, and
    torch.compile;
  - FP8 caches (k and v float8_e4m3fn with FlashAttention-3's k_descale / v_descale; flash_decode at
    d=128, kv_dtype=fp8): the dispatch (the FP8 kernel for FP8 calls only, never a 16-bit kernel for
    them), the argument errors in Python and in the ops, coverage, specs, plans, tuner.json and the
    raise policy with `kv_dtype=fp8`, the fallback's values over the dequantised cache (paged and
    contiguous, ragged lengths with NaN bytes past them, scales per (sequence, KV head), one scale and
    none, variants, the dense entry in both layouts) against float64, opcheck and torch.compile.

  ATTNTUNE_BIN=build/attntune python3 tests/torch/test_ops.py
"""
import itertools
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

import variant_reference as vr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ATTNTUNE_BIN", os.path.join(ROOT, "build", "attntune"))
WORK = tempfile.mkdtemp(prefix="attntune-torch-")
DB = os.path.join(WORK, "tuned.db")
PKG = os.path.join(WORK, "pkg")
os.environ.setdefault("ATTNTUNE_TORCH_CACHE", os.path.join(WORK, "cache"))
os.environ["ATTNTUNE_TORCH_NO_AUTOLOAD"] = "1"  # loaded in setUpModule, with its time reported

# The package's problems: flash_fwd_mma's (dense prefill, plain and with variants; a chunked-prefill
# kernel, paged, serving the kvcache entry alone; a varlen kernel serving the varlen entry alone)
# and flash_decode's (paged decode; it serves the dense entry too).
PREFILL = ["b=4,h=16,hkv=16,s=4096,sk=6000,d=128,dtype=bf16,causal=0",
           "b=2,h=32,hkv=8,s=16384,sk=16384,d=128,dtype=bf16,causal=1",
           "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=1",
           "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=0",
           "b=1,h=8,hkv=1,s=4096,sk=4096,d=64,dtype=bf16,causal=1,window=128,sinks=1",        # gpt-oss
           "b=1,h=16,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,window=4096,softcap=50",  # Gemma 2
           "b=2,h=8,hkv=8,s=2048,sk=2048,d=128,dtype=bf16,causal=0,window=127,64",
           "b=2,h=8,hkv=2,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64,softcap=30",
           "b=4,h=8,hkv=2,s=512,sk=512,d=64,dtype=bf16,causal=1,varlen=4,window=64",
           "b=1,h=16,hkv=16,s=4096,sk=4096,d=192,dv=128,dtype=bf16,causal=1"]                 # MLA prefill
DECODE = ["b=16,h=64,hkv=8,s=1,sk=8192,d=64,dtype=bf16,causal=1,page=16,window=128,sinks=1",
          "b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=0,page=16,softcap=30",
          "b=16,h=16,hkv=2,s=1,sk=4096,d=64,dv=128,dtype=bf16,causal=1,page=16"]             # V wider than K
MLA, WIDE_V = PREFILL[9], DECODE[2]
# flash_decode_wgmma's (sm_90a; MLA decode at d=576, dv=512, one KV head, FlashMLA's pages of 64): over
# the latent cache (V is K's first 512 columns), and over separate K and V tuned for longer caches.
LATENT = ["b=4,h=16,hkv=1,s=1,sk=1000,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1",
          "b=4,h=16,hkv=1,s=1,sk=8000,d=576,dv=512,dtype=bf16,causal=0,page=64"]
# flash_decode over an FP8 e4m3 cache (kv_dtype=fp8): the package's only d=128 plain decode kernel, so a
# 16-bit call of its shape has none (an FP8 kernel never serves one).
FP8 = ["b=16,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8"]
# flash_fwd_wgmma's FP8 forward (dtype=fp8: q, k and v e4m3, out bf16; sm_90a): attention's with FP8 queries.
FP8_FWD = ["b=1,h=16,hkv=4,s=4096,sk=4096,d=128,dtype=fp8,causal=1"]
# flash_bwd_mma (the backward pass, pass=bwd; issue 45): attention_backward's kernels, plain GQA at d=128
# and a causal window at d=64 (the shipped space, which lists windows).
# And attention_backward_varlen's: a packed batch's backward (varlen=N,pass=bwd), GQA causal at d=128, which
# serves the varlen backward entry alone (the dense d=128 kernel never serves it, nor it a dense call).
BWD = ["b=2,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,pass=bwd",
       "b=1,h=8,hkv=1,s=4096,sk=4096,d=64,dtype=bf16,causal=1,window=128,pass=bwd",
       "b=3,h=8,hkv=2,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=64,pass=bwd"]
BWD_VARLEN = BWD[2]
VARIANT_KEYS = ("window", "softcap", "sinks")


def run(*args, check=True):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"attntune {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r


def export(*args, check=True):
    return run("export", "--db", DB, *args, check=check)


def variant_space(family):
    """A copy of the shipped space of `family` whose problem section lists every variant (those it
    does not list yet): its path in WORK."""
    with open(os.path.join(ROOT, "search_spaces", f"{family}.yaml")) as f:
        lines = f.read().split("\n")
    at = lines.index("problem:")
    end = at + 1
    while end < len(lines) and (lines[end].startswith(" ") or not lines[end].strip()):
        end += 1
    section = "\n".join(lines[at:end])
    lines[at + 1:at + 1] = [f"  {k}: [false, true]" for k in VARIANT_KEYS
                            if not re.search(rf"^\s+{k}:", section, re.M)]
    path = os.path.join(WORK, f"{family}.yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


attntune = None


def setUpModule():
    global attntune
    for space, problems in ((variant_space("flash_fwd_mma"), PREFILL),
                            (variant_space("flash_decode"), DECODE + FP8),
                            (os.path.join(ROOT, "search_spaces", "flash_decode_wgmma.yaml"), LATENT),
                            (os.path.join(ROOT, "search_spaces", "flash_fwd_wgmma.yaml"), FP8_FWD),
                            (os.path.join(ROOT, "search_spaces", "flash_bwd_mma.yaml"), BWD)):
        run("submit", "--db", DB, "--space", space, *[a for p in problems for a in ("--problem", p)],
            "--budget-evals", "2", "--final-top", "0", "--warm-start", "0")
    run("serve", "--db", DB, "--simulate", "--simulate-delay-ms", "0")
    export("--all-best", "--dtype", "bf16", "--torch", PKG)
    sys.path.insert(0, PKG)
    import attntune as mod  # noqa: E402
    attntune = mod
    attntune.load(verbose=True)


def tearDownModule():
    shutil.rmtree(WORK, ignore_errors=True)


# ------------------------------------------------------------------ references

def ref_attention(q, k, v, scale, causal, visible=None):
    """float64 attention of q [B,H,S,D] over k, v [B,Hkv,Sk,D]; bottom-right causal; `visible` an
    extra bool mask broadcastable to [B,1,S,Sk]. Rows that see no key: 0, LSE -inf."""
    q, k, v = q.double(), k.double(), v.double()
    H, Hkv = q.shape[1], k.shape[1]
    if H != Hkv:
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    S, Sk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-2, -1) * scale
    mask = torch.ones(S, Sk, dtype=torch.bool)
    if causal:
        mask = torch.arange(Sk)[None, :] <= torch.arange(S)[:, None] + (Sk - S)
    mask = mask[None, None]
    if visible is not None:
        mask = mask & visible
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return p @ v, lse


def assert_fa2(test, out, ref64, ref_lowp, dtype, what):
    """FlashAttention-2's criterion: max|out - ref64| <= 2 * max|ref_lowp - ref64| + atol."""
    atol = 1 / 512 if dtype == torch.bfloat16 else 1 / 4096
    err = (out.double() - ref64).abs().max().item() if out.numel() else 0.0
    bound = 2 * ((ref_lowp.double() - ref64).abs().max().item() if out.numel() else 0.0) + atol
    test.assertFalse(math.isnan(err), f"{what}: NaN in the output")
    test.assertLessEqual(err, bound, f"{what}: max error {err:.3g} over the bound {bound:.3g}")


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


sink_logits = vr.sink_logits


# ------------------------------------------------------------------ the rule, restated

ENTRY_BIT = {"attntune_attention_forward": 1, "attntune_attention_forward_kvcache": 2,
             "attntune_attention_forward_varlen": 4, "attntune_attention_backward": 8,
             "attntune_attention_backward_varlen": 16}
ENTRY_OF_BIT = {1: "attention", 2: "attention_kvcache", 4: "attention_varlen", 8: "attention_backward",
                16: "attention_backward_varlen"}


def normalise(causal, window):
    """(causal, (left, right)) as the ops and attntune normalise them: (L, 0) is causal; a causal
    window keeps right -1."""
    left, right = window
    if not causal and right == 0:
        causal = True
    return causal, (left, -1 if causal else right)


def flags(window, softcap, sinks):
    return (window[0] >= 0 or window[1] >= 0, softcap > 0, bool(sinks))


def nearest(kernels, entry_bit, d, causal, b, h, hkv, s, sk, window=(-1, -1), softcap=0.0, sinks=False, dv=None,
            kv_dtype=None, fp8_forward=False):
    """The library's rule as its header states it: of the kernels serving the entry and built for
    (d, dv, causal, variants, the cache dtype, the FP8 forward or not), the nearest lengths by |log ratio|
    sum, then the same GQA group, then the nearest batch * heads, then the first. (For seqlen_q > 16, as
    here: flash_decode's plan refuses those, so its kernels never win.) dv None: one head dim; kv_dtype
    None: a 16-bit cache; fp8_forward: q, k and v float8_e4m3fn (dtype=fp8 kernels serve those alone)."""
    causal, window = normalise(causal, window)
    dv = d if dv is None else dv

    def lr(a, c):
        return abs(math.log((a if a > 0 else 1) / (c if c > 0 else 1)))
    best, key = -1, None
    for i, kern in enumerate(kernels):
        p = kern["problem"]
        if p["d"] != d or p.get("dv", p["d"]) != dv or bool(p["causal"]) != causal or not (kern["entries"] & entry_bit):
            continue
        if p.get("latent"):  # serves latent calls alone (explain(..., latent=True)): LatentCaches
            continue
        if p.get("kv_dtype") != kv_dtype:  # an FP8 cache's kernels serve FP8 calls alone: Fp8Caches
            continue
        if (p["dtype"] == "fp8") != fp8_forward:  # an FP8 forward's kernels serve FP8-forward calls alone
            continue
        if flags(p.get("window", (-1, -1)), p.get("softcap", 0), p.get("sinks")) != flags(window, softcap, sinks):
            continue
        if kern["template"] == "flash_decode" and s > 16:
            continue
        k = (round(lr(s, p["s"]) + lr(sk, p["sk"]), 9), 0 if h // hkv == p["h"] // p["hkv"] else 1,
             round(lr(b * h, p["b"] * p["h"]), 9))
        if key is None or k < key:
            best, key = i, k
    return best


def kernels_with_entries():
    """kernels() with "entries": the entry bits each serves (kernel_info's entry_points)."""
    kernels = attntune.kernels()
    served = {spec: bits for name, bits in ENTRY_BIT.items()
              for spec in attntune.default().info["entry_points"].get(name, [])}
    for k in kernels:
        k["entries"] = sum(bit for name, bit in ENTRY_BIT.items()
                           if vr.spec_of(k["problem"]) in attntune.default().info["entry_points"].get(name, []))
        assert k["entries"], f"kernel {vr.spec_of(k['problem'])} serves no entry point (entry_points: {served})"
    return kernels


def variant_args(p):
    """explain()'s variant arguments (and value head dim, latent cache and cache dtype) for a kernel's
    problem."""
    return dict(window_size=tuple(p.get("window", (-1, -1))), softcap=p.get("softcap", 0.0),
                sinks=bool(p.get("sinks")), head_dim_v=p.get("dv"), latent=bool(p.get("latent")),
                kv_dtype=p.get("kv_dtype"))


class Dispatch(unittest.TestCase):
    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        self.kernels = kernels_with_entries()

    def test_the_package_holds_what_was_tuned(self):
        # A companion (after a kernel whose tunables narrow the calls it serves, e.g. k_perm's key counts
        # of fours: docs/EXPORT.md) is another kernel of the problem before it.
        self.assertEqual(sorted(vr.spec_of(k["problem"]) for k in self.kernels if "companion_for" not in k),
                         sorted(PREFILL + DECODE + LATENT + FP8 + FP8_FWD + BWD))
        for i, k in enumerate(self.kernels):
            if "companion_for" in k:
                self.assertGreater(i, 0)
                self.assertEqual(k["problem"], self.kernels[i - 1]["problem"])
        for k in self.kernels:
            p = k["problem"]
            want = [key for key, on in zip(VARIANT_KEYS, flags(p.get("window", (-1, -1)), p.get("softcap", 0),
                                                                p.get("sinks"))) if on]
            self.assertEqual(sorted(k["variants"]), sorted(want), vr.spec_of(p))

    def test_each_tuned_problem_runs_its_own_kernel(self):
        for i, k in enumerate(self.kernels):
            p = k["problem"]
            # A companion runs the calls the kernel before it refuses (k_perm's: a key count not a
            # multiple of 4); its problem's own shape runs that kernel.
            sk = p["sk"] - 1 if "companion_for" in k else p["sk"]
            for bit, entry in ENTRY_OF_BIT.items():
                if not k["entries"] & bit:
                    continue
                got = attntune.explain(entry, p["dtype"], p["d"], p["causal"], p["b"], p["h"], p["hkv"], p["s"],
                                       sk, **variant_args(p))
                self.assertEqual(got, (i, ""), f"kernel {i} ({vr.spec_of(p)}, sk {sk}) through {entry}")

    def test_random_shapes_follow_the_rule(self):
        rng = random.Random(26)
        choices = [((-1, -1), 0.0, False), ((128, 0), 0.0, True), ((256, -1), 0.0, True), ((4096, 0), 50.0, False),
                   ((127, 64), 0.0, False), ((-1, 64), 0.0, False), ((0, -1), 30.0, False), ((-1, -1), 30.0, True),
                   ((-1, 0), 0.0, False)]
        ran = 0
        for _ in range(400):
            d = rng.choice([64, 128])
            window, softcap, sinks = rng.choice(choices)
            causal = rng.random() < 0.5 and window[1] <= 0
            hkv = rng.choice([1, 2, 4, 8, 16])
            h = hkv * rng.choice([1, 2, 4, 8])
            b = rng.randint(1, 64)
            s = rng.randint(17, 40000)
            sk = s if rng.random() < 0.7 else rng.randint(s, 60000)
            want = nearest(self.kernels, 1, d, causal, b, h, hkv, s, sk, window, softcap, sinks)
            got, why = attntune.explain("attention", "bf16", d, causal, b, h, hkv, s, sk, window_size=window,
                                        softcap=softcap, sinks=sinks)
            what = f"b={b} h={h} hkv={hkv} s={s} sk={sk} d={d} causal={causal} window={window} softcap={softcap} " \
                   f"sinks={sinks}"
            if want < 0:
                self.assertEqual(got, -1, what)
                self.assertIn("no kernel of the library serves attention", why, what)
            elif got >= 0:
                self.assertEqual(got, want, what)
                ran += 1
            else:  # only ever for lengths over the ratio from the nearest
                self.assertIn("max_length_ratio", why, what)
                p = self.kernels[want]["problem"]
                off = max(max(s / p["s"], p["s"] / s), max(sk / p["sk"], p["sk"] / sk))
                self.assertGreater(off, 16.0, what)
        self.assertGreater(ran, 100)

    def test_variants_choose_kernels_built_for_them(self):
        def kernel(spec):
            return [vr.spec_of(k["problem"]) for k in self.kernels].index(spec)
        gpt, gemma, two_sided = PREFILL[4], PREFILL[5], PREFILL[6]

        def explain(entry, d, causal, b, h, hkv, s, sk, **variants):
            return attntune.explain(entry, "bf16", d, causal, b, h, hkv, s, sk, **variants)
        # The window's size and the cap's value are arguments of a kernel built for the variant.
        self.assertEqual(explain("attention", 64, True, 1, 8, 1, 4096, 4096, window_size=(128, 0), sinks=True)[0],
                         kernel(gpt))
        self.assertEqual(explain("attention", 64, True, 2, 8, 1, 3000, 3000, window_size=(1000, -1), sinks=True)[0],
                         kernel(gpt))
        # FlashAttention's (L, 0) without is_causal is causal attention within L keys.
        self.assertEqual(explain("attention", 64, False, 1, 8, 1, 4096, 4096, window_size=(128, 0), sinks=True)[0],
                         kernel(gpt))
        self.assertEqual(explain("attention", 128, True, 1, 16, 8, 4096, 4096, window_size=(512, 0), softcap=30.0)[0],
                         kernel(gemma))
        self.assertEqual(explain("attention", 128, False, 2, 8, 8, 2048, 2048, window_size=(1, 3))[0],
                         kernel(two_sided))
        # Plain calls never run a kernel built for a variant, nor the reverse.
        self.assertEqual(explain("attention", 64, True, 1, 8, 1, 4096, 4096)[0], kernel(PREFILL[2]))
        self.assertEqual(explain("attention", 64, False, 1, 8, 1, 4096, 4096, window_size=(-1, 0))[0],
                         kernel(PREFILL[2]))  # (-1, 0): causal, no window
        for variants, words in ((dict(window_size=(128, 0)), "with a sliding window (128, -1)"),
                                (dict(sinks=True), "with attention sinks"),
                                (dict(window_size=(128, 0), sinks=True, softcap=50.0),
                                 "with a sliding window (128, -1), a logit soft-cap 50, attention sinks")):
            k, why = explain("attention", 64, True, 1, 8, 1, 4096, 4096, **variants)
            self.assertEqual(k, -1, variants)
            self.assertEqual(why, "no kernel of the library serves attention with head_dim=64 is_causal=1 " + words)
        k, why = explain("attention", 128, True, 1, 16, 8, 4096, 4096, softcap=50.0)
        self.assertEqual((k, why), (-1, "no kernel of the library serves attention with head_dim=128 is_causal=1 with "
                                        "a logit soft-cap 50"))
        # The kvcache and varlen entries, decode and chunked prefill.
        self.assertEqual(explain("attention_kvcache", 64, True, 16, 64, 8, 1, 8192, window_size=(128, 0),
                                 sinks=True)[0], kernel(DECODE[0]))
        self.assertEqual(explain("attention_kvcache", 64, True, 16, 64, 8, 1, 8192)[0], -1)
        self.assertEqual(explain("attention", 128, False, 8, 32, 8, 1, 4096, softcap=30.0)[0], kernel(DECODE[1]))
        self.assertEqual(explain("attention_kvcache", 128, True, 2, 8, 2, 512, 4096, softcap=30.0)[0],
                         kernel(PREFILL[7]))
        self.assertEqual(explain("attention_varlen", 64, True, 4, 8, 2, 512, 512, window_size=(64, 0))[0],
                         kernel(PREFILL[8]))
        self.assertEqual(explain("attention_varlen", 64, True, 4, 8, 2, 512, 512)[0], -1)

    def test_what_falls_back_and_why(self):
        k, why = attntune.explain("attention", "bf16", 96, False, 1, 8, 8, 1024, 1024)
        self.assertEqual(k, -1)
        self.assertIn("head_dim=96", why)
        k, why = attntune.explain("attention", "bf16", 128, False, 64, 32, 8, 1, 4096)
        self.assertEqual(k, -1)
        self.assertIn("this call is decode", why)
        k, why = attntune.explain("attention", "fp16", 128, False, 4, 16, 16, 4096, 4096)
        self.assertEqual(k, -1)
        self.assertIn("tuned for bf16", why)
        k, why = attntune.explain("attention_kvcache", "bf16", 128, False, 4, 16, 16, 1, 4096)
        self.assertEqual(k, -1)
        self.assertIn("no kernel of the library serves attention_kvcache", why)
        # Far lengths: 64x the nearest tuned s=4096 falls back at ratio 16, runs at ratio 1000.
        k, why = attntune.explain("attention", "bf16", 128, False, 1, 16, 16, 64, 64)
        self.assertEqual(k, -1)
        self.assertIn("max_length_ratio", why)
        attntune.set_policy("sdpa", 1000.0)
        k, _ = attntune.explain("attention", "bf16", 128, False, 1, 16, 16, 64, 64)
        self.assertGreaterEqual(k, 0)

    def test_policy_rejects_nonsense(self):
        with self.assertRaisesRegex(RuntimeError, "fallback must be"):
            attntune.set_policy("maybe", 16.0)
        with self.assertRaisesRegex(RuntimeError, "max_length_ratio"):
            attntune.set_policy("sdpa", 0.5)


class Fallback(unittest.TestCase):
    """CPU tensors fall back to PyTorch; its values must follow the ops' semantics exactly."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        torch.manual_seed(0)

    def check_dense(self, B, H, Hkv, S, Sk, D, causal, layout="bhsd", dtype=torch.bfloat16):
        shape_q = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
        shape_k = (B, Hkv, Sk, D) if layout == "bhsd" else (B, Sk, Hkv, D)
        q, k, v = rand(*shape_q, dtype=dtype), rand(*shape_k, dtype=dtype), rand(*shape_k, dtype=dtype)
        scale = 1 / math.sqrt(D)
        out, lse = attntune.attention(q, k, v, is_causal=causal, layout=layout, return_lse=True)
        self.assertEqual(out.shape, q.shape)
        qh, kh, vh = (q, k, v) if layout == "bhsd" else (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        oh = out if layout == "bhsd" else out.transpose(1, 2)
        ref64, lse64 = ref_attention(qh, kh, vh, scale, causal)
        ref_lowp = ref_attention(qh.float(), kh.float(), vh.float(), scale, causal)[0].to(dtype)
        what = f"dense B={B} H={H} Hkv={Hkv} S={S} Sk={Sk} D={D} causal={causal} {layout}"
        assert_fa2(self, oh, ref64, ref_lowp, dtype, what)
        finite = torch.isfinite(lse64)
        self.assertTrue(torch.equal(torch.isfinite(lse), finite), what + ": LSE -inf exactly where no key is seen")
        self.assertLess((lse.double()[finite] - lse64[finite]).abs().max().item(), 1e-3, what + ": LSE")

    def test_dense(self):
        self.check_dense(2, 4, 4, 64, 64, 64, False)
        self.check_dense(2, 4, 4, 63, 63, 64, True)
        self.check_dense(1, 8, 2, 37, 101, 128, True)         # bottom-right, GQA
        self.check_dense(1, 4, 1, 100, 40, 64, True)          # 60 rows see no key
        self.check_dense(2, 4, 2, 33, 77, 64, True, layout="bshd")
        self.check_dense(1, 2, 2, 17, 29, 64, False, dtype=torch.float16)

    def test_dense_into_out_and_zero_keys(self):
        q, k = rand(1, 2, 5, 64), rand(1, 2, 0, 64)
        out = torch.full_like(q, float("nan"))
        attntune.attention(q, k, k, out=out)
        self.assertTrue(torch.equal(out, torch.zeros_like(q)))
        # With sinks: zeros still, and each row's LSE is its head's sink.
        sinks = torch.tensor([2.5, -7.0])
        out.fill_(float("nan"))
        _, lse = attntune.attention(q, k, k, out=out, sinks=sinks, return_lse=True)
        self.assertTrue(torch.equal(out, torch.zeros_like(q)))
        self.assertTrue(torch.equal(lse, sinks.view(1, 2, 1).expand(1, 2, 5)))

    # -- the variants

    def check_variant(self, q, k, v, causal, window=(-1, -1), softcap=0.0, sinks=None, layout="bhsd",
                      dtype=torch.bfloat16, what=""):
        """One dense call with variants (NaN-poisoned out, with LSE) against float64."""
        D = q.shape[-1]
        scale = 1 / math.sqrt(D)
        out = torch.full_like(q, float("nan"))
        _, lse = attntune.attention(q, k, v, is_causal=causal, window_size=window, softcap=softcap, sinks=sinks,
                                    layout=layout, return_lse=True, out=out)
        qh, kh, vh, oh = (q, k, v, out) if layout == "bhsd" else (t.transpose(1, 2) for t in (q, k, v, out))
        ref64, lse64 = vr.attention(qh, kh, vh, scale, causal=causal, window=window, softcap=softcap, sinks=sinks)
        lowp, _ = vr.attention(qh, kh, vh, scale, causal=causal, window=window, softcap=softcap, sinks=sinks,
                               dtype=dtype)
        ok, msg = vr.compare(oh, lse, ref64, lse64, lowp, dtype)
        what = (f"{what} S={qh.shape[2]} Sk={kh.shape[2]} H={qh.shape[1]} Hkv={kh.shape[1]} causal={causal} "
                f"window={window} softcap={softcap} sinks={sinks is not None} {layout}")
        self.assertTrue(ok, f"{what}: {msg}")
        return out, lse, ref64, lse64

    def test_windows(self):
        # left in {0, 1, 127, -1} x right in {0, -1, 64}; causal takes right 0 or -1 (64 is an error,
        # test_variant_arguments_are_checked), and with -1 it is the same window as (left, 0).
        for S, Sk, H, Hkv in ((37, 101, 4, 2), (100, 40, 4, 1), (64, 64, 2, 2), (130, 300, 2, 1)):
            q, k, v = rand(2, H, S, 64), rand(2, Hkv, Sk, 64), rand(2, Hkv, Sk, 64)
            for left in (0, 1, 127, -1):
                for right in (0, -1, 64):
                    self.check_variant(q, k, v, False, (left, right), what="window")
                    if right <= 0:
                        self.check_variant(q, k, v, True, (left, right), what="window")

    def test_a_window_is_not_the_plain_attention(self):
        q, k, v = rand(1, 2, 50, 64), rand(1, 2, 50, 64), rand(1, 2, 50, 64)
        plain = attntune.attention(q, k, v, is_causal=True)
        windowed = attntune.attention(q, k, v, is_causal=True, window_size=(3, 0))
        self.assertGreater((plain.float() - windowed.float()).abs().max().item(), 0.1)
        # (0, 0): each row sees its own diagonal key alone, so out is v's row.
        out = attntune.attention(q, k, v, window_size=(0, 0))
        self.assertTrue(torch.equal(out, v))

    def test_softcap(self):
        for S, Sk, H, Hkv in ((37, 101, 4, 2), (64, 64, 2, 2)):
            # Scores far over the cap (q scaled up): the cap decides the softmax.
            q, k, v = rand(1, H, S, 64) * 8, rand(1, Hkv, Sk, 64), rand(1, Hkv, Sk, 64)
            for cap in (30.0, 50.0):
                for causal in (False, True):
                    self.check_variant(q, k, v, causal, softcap=cap, what="softcap")
        # The cap applies to the scaled scores: a cap far over them changes nothing, a tiny one
        # flattens the softmax to the mean of the visible values.
        q, k, v = rand(1, 2, 9, 64), rand(1, 2, 9, 64), rand(1, 2, 9, 64)
        plain = attntune.attention(q.float(), k.float(), v.float())
        self.assertLess((attntune.attention(q.float(), k.float(), v.float(), softcap=1e6) - plain).abs().max(), 1e-5)
        flat = attntune.attention(q.float(), k.float(), v.float(), softcap=1e-6)
        self.assertLess((flat - v.float().mean(2, keepdim=True)).abs().max(), 1e-4)

    def test_sinks(self):
        for S, Sk, H, Hkv, causal in ((37, 101, 6, 2, True), (100, 40, 3, 1, True), (64, 64, 6, 6, False)):
            q, k, v = rand(2, H, S, 64), rand(2, Hkv, Sk, 64), rand(2, Hkv, Sk, 64)
            sinks = sink_logits(H, S)
            out, lse, _, lse64 = self.check_variant(q, k, v, causal, sinks=sinks, what="sinks")
            for h in range(H):
                if sinks[h] == 1e3:  # the sink takes the whole softmax
                    self.assertLess(out[:, h].float().abs().max().item(), 1e-30)
                    self.assertTrue(torch.allclose(lse[:, h], torch.full_like(lse[:, h], 1e3)))
            if S > Sk and causal:  # rows that see no key: zeros, and their LSE is the sink
                rows = S - Sk
                self.assertTrue(torch.equal(out[:, :, :rows], torch.zeros_like(out[:, :, :rows])))
                self.assertTrue(torch.equal(lse[:, :, :rows], sinks.view(1, H, 1).expand(2, H, rows)))
        # -1e4 has no effect on any row: the same bits as causal attention through the same path (a
        # window wider than the keys is none).
        q, k, v = rand(1, 2, 20, 64), rand(1, 2, 20, 64), rand(1, 2, 20, 64)
        plain, lse_plain = attntune.attention(q, k, v, is_causal=True, window_size=(10**6, 0), return_lse=True)
        none, lse_none = attntune.attention(q, k, v, is_causal=True, window_size=(10**6, 0), return_lse=True,
                                            sinks=torch.full((2,), -1e4))
        self.assertTrue(torch.equal(plain, none))
        self.assertTrue(torch.equal(lse_plain, lse_none))

    def test_combinations(self):
        q, k, v = rand(2, 6, 45, 64), rand(2, 3, 77, 64), rand(2, 3, 77, 64)
        sinks = sink_logits(6, 1)
        for causal, window, cap, sk in ((True, (16, 0), 30.0, sinks), (False, (16, 8), 50.0, None),
                                        (False, (-1, 64), 30.0, sinks), (True, (127, -1), 50.0, None),
                                        (False, (0, -1), 50.0, sinks), (True, (1, 0), 0.0, sinks)):
            self.check_variant(q, k, v, causal, window, cap, sk, what="combination")
        # [B, S, H, D] views, fp16.
        qs, ks, vs = rand(2, 45, 6, 64, dtype=torch.float16), rand(2, 77, 3, 64, dtype=torch.float16), \
            rand(2, 77, 3, 64, dtype=torch.float16)
        self.check_variant(qs, ks, vs, True, (20, 0), 30.0, sinks, layout="bshd", dtype=torch.float16, what="bshd")

    def test_long_rows_are_chunked(self):
        # Over 2^25 scores: the fallback goes chunk by chunk of query rows (and narrows the keys to
        # the window's): the same values.
        q, k, v = rand(1, 1, 6000, 64), rand(1, 1, 6000, 64), rand(1, 1, 6000, 64)
        self.check_variant(q, k, v, True, (300, 0), 30.0, torch.tensor([0.5]), what="chunked")

    def test_kvcache_paged_and_contiguous(self):
        B, H, Hkv, D, page = 5, 8, 2, 64, 16
        lens = torch.tensor([0, 1, 37, 64, 50], dtype=torch.int32)
        max_blocks = 4
        Sk = page * max_blocks
        cases = ((1, False, {}), (4, True, {}), (3, False, {}),
                 (1, True, dict(window_size=(10, 0), sinks=sink_logits(H))),
                 (4, False, dict(window_size=(5, 2), softcap=30.0)),
                 (3, True, dict(window_size=(0, -1), softcap=50.0, sinks=sink_logits(H, 1))),
                 (2, False, dict(softcap=30.0, sinks=sink_logits(H, 2))))
        for S, causal, variants in cases:
            q = rand(B, S, H, D)
            kc, vc = rand(B, Sk, Hkv, D), rand(B, Sk, Hkv, D)
            for b, n in enumerate(lens.tolist()):  # a stale cache: NaN past each length
                kc[b, n:], vc[b, n:] = float("nan"), float("nan")
            # The same keys through shuffled pages, with spare pages between.
            num_blocks = B * max_blocks + 7
            perm = torch.randperm(num_blocks)[:B * max_blocks].view(B, max_blocks).to(torch.int32)
            kp, vp = rand(num_blocks, page, Hkv, D), rand(num_blocks, page, Hkv, D)
            for b in range(B):
                for j in range(max_blocks):
                    kp[perm[b, j]] = kc[b, j * page:(j + 1) * page]
                    vp[perm[b, j]] = vc[b, j * page:(j + 1) * page]
            scale = 1 / math.sqrt(D)
            window = variants.get("window_size", (-1, -1))
            ref_args = dict(causal=causal, window=window, softcap=variants.get("softcap", 0.0),
                            sinks=variants.get("sinks"), len_k=lens.tolist())
            qh, kh, vh = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
            ref64, lse64 = vr.attention(qh, kh, vh, scale, **ref_args)
            lowp, _ = vr.attention(qh, kh, vh, scale, dtype=torch.bfloat16, **ref_args)
            for name, args in (("contiguous", dict(k_cache=kc, v_cache=vc)),
                               ("paged", dict(k_cache=kp, v_cache=vp, block_table=perm))):
                out = torch.full_like(q, float("nan"))
                _, lse = attntune.attention_kvcache(q, cache_seqlens=lens, is_causal=causal, return_lse=True, out=out,
                                                    **args, **variants)
                self.assertEqual(lse.shape, (B, H, S))
                what = f"kvcache {name} S={S} causal={causal} {variants}"
                ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, torch.bfloat16)
                self.assertTrue(ok, f"{what}: {msg}")
                self.assertTrue(torch.equal(out[0], torch.zeros_like(out[0])), what + ": length 0: zeros")
                sinks = variants.get("sinks")
                self.assertTrue(torch.equal(lse[0], sinks.view(H, 1).expand(H, S)) if sinks is not None
                                else torch.isneginf(lse[0]).all().item(), what + ": length 0: LSE")

    def test_varlen(self):
        H, Hkv, D = 4, 2, 64
        cases = ((False, {}), (True, {}), (True, dict(window_size=(7, 0), sinks=sink_logits(H))),
                 (False, dict(window_size=(3, 5), softcap=30.0)), (False, dict(window_size=(-1, 0))),
                 (True, dict(softcap=50.0, sinks=sink_logits(H, 3))))
        for causal, variants in cases:
            lens_q = [0, 1, 17, 64, 33]
            lens_k = [0, 5, 17, 64, 90] if not causal else [3, 1, 17, 80, 20]
            cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
            cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
            q, k, v = rand(int(cu_q[-1]), H, D), rand(int(cu_k[-1]), Hkv, D), rand(int(cu_k[-1]), Hkv, D)
            out, lse = attntune.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                                 return_lse=True, **variants)
            self.assertEqual(out.shape, q.shape)
            self.assertEqual(lse.shape, (H, q.shape[0]))
            ref_args = dict(causal=causal, window=variants.get("window_size", (-1, -1)),
                            softcap=variants.get("softcap", 0.0), sinks=variants.get("sinks"))
            for b in range(len(lens_q)):
                qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
                if lens_q[b] == 0:
                    continue
                qb, kb, vb = (t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks]))
                ref64, lse64 = vr.attention(qb, kb, vb, 1 / math.sqrt(D), **ref_args)
                lowp, _ = vr.attention(qb, kb, vb, 1 / math.sqrt(D), dtype=torch.bfloat16, **ref_args)
                ok, msg = vr.compare(out[qs][None].transpose(1, 2), lse[:, qs][None], ref64, lse64, lowp,
                                     torch.bfloat16)
                self.assertTrue(ok, f"varlen seq {b} causal={causal} {variants}: {msg}")

    def test_the_reference_is_plain_attention_without_variants(self):
        # variant_reference.py against this file's plain reference: the same on plain calls.
        q, k, v = rand(2, 4, 37, 64), rand(2, 2, 101, 64), rand(2, 2, 101, 64)
        for causal in (False, True):
            a, la = vr.attention(q, k, v, 0.125, causal=causal)
            b, lb = ref_attention(q, k, v, 0.125, causal)
            self.assertLess((a - b).abs().max().item(), 1e-12)
            self.assertLess((la - lb).abs().max().item(), 1e-12)


class Arguments(unittest.TestCase):
    """FlashAttention's arguments are checked with errors that say what is wrong: in the Python
    functions (ValueError) and in the ops themselves (RuntimeError), in the same words."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)

    def test_variant_arguments_are_checked(self):
        q = rand(1, 4, 8, 64)
        kv = rand(1, 2, 8, 64)
        bad = [(dict(window_size=128), "window_size must be a pair"),
               (dict(window_size=(1, 2, 3)), "window_size must be a pair"),
               (dict(window_size=("a", 1)), "window_size must be a pair of ints"),
               (dict(window_size=(True, 1)), "window_size must be a pair of ints"),
               (dict(window_size=(-2, 0)), r"window_size \(-2, 0\): each side is -1"),
               (dict(window_size=(0, -5)), r"each side is -1 \(unbounded\) or a number of keys"),
               (dict(window_size=(16, 4), is_causal=True), r"is_causal with window_size \(16, 4\)"),
               (dict(softcap=-1.0), "softcap -1.0: 0 \\(none\\) or a positive finite cap"),
               (dict(softcap=float("inf")), "softcap inf"),
               (dict(softcap=float("nan")), "softcap nan"),
               (dict(softcap="30"), "softcap must be a number"),
               (dict(softcap=torch.tensor(30.0)), "softcap must be a number"),
               (dict(sinks=torch.zeros(5)), r"sinks must be \[heads_q\] \(4 logits"),
               (dict(sinks=torch.zeros(1, 4)), r"sinks must be \[heads_q\]"),
               (dict(sinks=torch.zeros(4, dtype=torch.bfloat16)), "sinks must be float32"),
               (dict(sinks=torch.zeros(4, device="meta")), "sinks must be on q's device"),
               (dict(sinks=[0.0] * 4), "sinks must be a tensor")]
        for kwargs, pattern in bad:
            with self.assertRaisesRegex(ValueError, pattern, msg=str(kwargs)):
                attntune.attention(q, kv, kv, **kwargs)
        # The kvcache and varlen functions check the same (sinks by q's heads: [B, S, H, D], [T, H, D]).
        with self.assertRaisesRegex(ValueError, r"attention_kvcache: sinks must be \[heads_q\] \(4 logits"):
            attntune.attention_kvcache(rand(1, 1, 4, 64), rand(1, 8, 2, 64), rand(1, 8, 2, 64), sinks=torch.zeros(2))
        cu = torch.tensor([0, 8], dtype=torch.int32)
        with self.assertRaisesRegex(ValueError, r"attention_varlen: is_causal with window_size \(0, 1\)"):
            attntune.attention_varlen(rand(8, 4, 64), rand(8, 2, 64), rand(8, 2, 64), cu, cu, 8, 8, is_causal=True,
                                      window_size=(0, 1))
        with self.assertRaisesRegex(ValueError, "explain: softcap -2"):
            attntune.explain("attention", "bf16", 64, True, 1, 8, 8, 64, 64, softcap=-2.0)

    def test_the_ops_check_them_too(self):
        ops = torch.ops.attntune
        q, kv = rand(1, 4, 8, 64), rand(1, 2, 8, 64)
        for args, pattern in ((([-2, 0], 0.0, None), "each side is -1"),
                              (([4, 4], 0.0, None), r"is_causal with window_size \(4, 4\)"),
                              (([-1, -1], -3.0, None), "softcap -3: 0 \\(none\\)"),
                              (([-1, -1], float("nan"), None), "softcap nan"),
                              (([-1, -1], 0.0, torch.zeros(3)), r"sinks must be \[heads_q\] \(4 logits"),
                              (([-1, -1], 0.0, torch.zeros(4, dtype=torch.float64)), "sinks must be float32"),
                              (([1, 2, 3], 0.0, None), r"window_size must be \(left, right\)")):
            with self.assertRaisesRegex(RuntimeError, "attntune.attention: .*" + pattern, msg=str(args)):
                ops.attention(q, kv, kv, None, True, False, *args)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_kvcache: sinks must be float32"):
            ops.attention_kvcache(rand(1, 1, 4, 64), rand(1, 8, 2, 64), rand(1, 8, 2, 64), None, None, None, False,
                                  False, [-1, -1], 0.0, torch.zeros(4, dtype=torch.float16))
        cu = torch.tensor([0, 8], dtype=torch.int32)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_varlen: softcap inf"):
            ops.attention_varlen(rand(8, 4, 64), rand(8, 2, 64), rand(8, 2, 64), cu, cu, 8, 8, None, False, False,
                                 [-1, -1], float("inf"), None)


class Coverage(unittest.TestCase):
    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()

    def test_counts_per_shape(self):
        q = rand(1, 2, 8, 64)
        for _ in range(3):
            attntune.attention(q, q, q)
        attntune.attention(rand(1, 2, 9, 64), rand(1, 2, 9, 64), rand(1, 2, 9, 64), is_causal=True)
        rows = attntune.coverage()
        self.assertEqual(sorted(r["calls"] for r in rows), [1, 3])
        for r in rows:
            self.assertIsNone(r["kernel"])
            self.assertEqual(r["fallback"], "tensors on cpu")
            self.assertFalse(r["tunable"])
            self.assertEqual((r["problem"]["window"], r["problem"]["softcap"], r["problem"]["sinks"]),
                             ([-1, -1], 0, 0))
        self.assertIn("SDPA fallback: tensors on cpu", attntune.coverage_table())
        self.assertEqual(attntune.coverage(reset=True), rows)
        self.assertEqual(attntune.coverage(), [])

    def test_variants_are_other_problems(self):
        q = rand(1, 2, 8, 64)
        attntune.attention(q, q, q, is_causal=True)
        attntune.attention(q, q, q, is_causal=True, window_size=(4, 0))
        attntune.attention(q, q, q, window_size=(4, 0))            # the same problem: (4, 0) is causal
        attntune.attention(q, q, q, window_size=(4, 2), softcap=30.0)
        attntune.attention(q, q, q, window_size=(-1, 2), sinks=torch.zeros(2))
        attntune.attention(q, q, q, window_size=(-1, -1), softcap=50.5, sinks=torch.zeros(2))
        rows = attntune.coverage()
        specs = {attntune.problem_spec(r): r["calls"] for r in rows}
        base = "b=1,h=2,hkv=2,s=8,sk=8,d=64,dtype=bf16"
        self.assertEqual(specs, {base + ",causal=1": 1, base + ",causal=1,window=4": 2,
                                 base + ",causal=0,window=4,2,softcap=30": 1, base + ",causal=0,window=-1,2,sinks=1": 1,
                                 base + ",causal=0,softcap=50.5,sinks=1": 1})
        window = {attntune.problem_spec(r): r["problem"]["window"] for r in rows}
        self.assertEqual(window[base + ",causal=1,window=4"], [4, -1])
        table = attntune.coverage_table()
        self.assertIn("fp32 fallback: tensors on cpu", table)
        self.assertIn(base + ",causal=0,window=4,2,softcap=30", table)

    def test_raise_policy(self):
        attntune.set_policy("raise", 16.0)
        q = rand(1, 2, 8, 64)
        with self.assertRaisesRegex(RuntimeError, "no tuned kernel for b=1,h=2,hkv=2,s=8,sk=8,d=64.*tensors on cpu"):
            attntune.attention(q, q, q)
        with self.assertRaisesRegex(RuntimeError, "no tuned kernel for b=1,h=2,hkv=2,s=8,sk=8,d=64,causal=1,"
                                                  "window=16,softcap=30,sinks=1: tensors on cpu"):
            attntune.attention(q, q, q, window_size=(16, 0), softcap=30.0, sinks=torch.zeros(2))
        self.assertEqual([r["calls"] for r in attntune.coverage()], [1, 1])

    def test_bad_arguments_are_errors(self):
        q = rand(1, 4, 8, 64)
        with self.assertRaisesRegex(RuntimeError, "multiple"):
            attntune.attention(q, rand(1, 3, 8, 64), rand(1, 3, 8, 64))
        with self.assertRaisesRegex(RuntimeError, "head_dim"):
            attntune.attention(q, rand(1, 4, 8, 32), rand(1, 4, 8, 32))
        with self.assertRaisesRegex(ValueError, "layout"):
            attntune.attention(q, q, q, layout="sbhd")
        with self.assertRaisesRegex(RuntimeError, "block_table must be"):
            attntune.attention_kvcache(rand(2, 1, 4, 64), rand(8, 16, 4, 64), rand(8, 16, 4, 64),
                                       block_table=torch.zeros(3, 2, dtype=torch.int32))

    def test_what_fell_back_becomes_a_plan_that_submit_queues(self):
        def row(entry, s, sk, tunable=True, paged=0, dtype="bf16", d=128, window=(-1, -1), softcap=0, sinks=0):
            return {"entry": entry, "dtype": dtype, "calls": 1, "kernel": None, "tunable": tunable,
                    "problem": {"b": 2, "h": 32, "hkv": 8, "s": s, "sk": sk, "d": d, "causal": 1, "paged": paged,
                                "window": list(window), "softcap": softcap, "sinks": sinks}}
        rows = [row("attention", 4096, 4096), row("attention", 4096, 4096),       # twice: one problem
                row("attention_kvcache", 1, 8192, paged=16),                       # decode, paged
                row("attention_kvcache", 2048, 8192, paged=64),                    # chunked prefill, paged
                row("attention_kvcache", 512, 4096),                               # ... contiguous: tuned paged
                row("attention_varlen", 512, 512),                                 # varlen: lengths 1..512
                row("attention_varlen", 512, 256),                                 # varlen, sk < s: not said
                row("attention", 100, 100, tunable=False),                         # a CPU tensor, say
                row("attention", 4096, 4096, window=(128, -1), sinks=1),           # the variants' keys
                row("attention_kvcache", 1, 8192, paged=16, window=(4096, -1), softcap=50.0),
                row("attention_varlen", 512, 512, softcap=30.5)]
        plan = attntune.plan_from_coverage(rows, "llama-ish")
        prefill_variants = [{"problem": "b=2,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1,window=128,sinks=1",
                             "regime": "prefill"},
                            {"problem": "b=2,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=1,softcap=30.5",
                             "regime": "prefill"}]
        decode_variants = [{"problem": "b=2,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16,window=4096,"
                                       "softcap=50", "regime": "decode"}]
        plain = [
            {"problem": "b=2,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1", "regime": "prefill"},
            {"problem": "b=2,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16", "regime": "decode"},
            {"problem": "b=2,h=32,hkv=8,s=2048,sk=8192,d=128,dtype=bf16,causal=1,page=64", "regime": "chunk"},
            {"problem": "b=2,h=32,hkv=8,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64", "regime": "chunk"},
            {"problem": "b=2,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=1", "regime": "prefill"}]
        self.assertEqual(plan["problems"], plain[:5] + [prefill_variants[0], decode_variants[0], prefill_variants[1]])

        # attntune reads each spec as the problem the coverage row is: the plain ones queued with the
        # shipped spaces, those with variants with the spaces that list them (this file's copies).
        db = os.path.join(WORK, "queue.db")
        for i, (problems, spaces) in enumerate(((plain, []),
                                                (prefill_variants, ["--space", variant_space("flash_fwd_mma")]),
                                                (decode_variants, ["--space", variant_space("flash_decode")]))):
            path = os.path.join(WORK, f"plan{i}.json")
            with open(path, "w") as fh:
                json.dump({"model": "llama-ish", "source": "test", "problems": problems}, fh)
            r = run("submit", path, "--db", db, "--format", "json", *spaces, check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
        r = run("status", "--db", db, "--format", "json")
        status = json.loads(r.stdout)
        self.assertEqual(status["counts"]["queued"], 8)
        # Each campaign's name ends in its problem's canonical spec ("FAMILIES:SPEC"); status's
        # "problem" leaves the variants out.
        self.assertEqual(sorted(c["campaign"].split(":", 1)[1] for c in status["campaigns"]),
                         sorted(p["problem"] for p in plan["problems"]))
        self.assertEqual(attntune.coverage_plan()["problems"], [])  # the CPU calls here are not tunable

    def test_what_no_family_tunes_is_not_offered(self):
        support = json.load(open(os.path.join(PKG, "attntune", "tuner.json")))
        self.assertIn("flash_decode", [f["family"] for f in support["families"]])
        row = {"entry": "attention", "dtype": "bf16", "calls": 1, "kernel": None, "tunable": True, "fallback": "x",
               "problem": {"b": 1, "h": 16, "hkv": 16, "s": 777, "sk": 777, "d": 88, "causal": 1, "paged": 0,
                           "window": [-1, -1], "softcap": 0, "sinks": 0}}
        # Listed in the spaces' problem section but refused by their constraints (no multiple of 16):
        # tuner.json lists the head dims a family tunes, not those it names (flash_decode_wgmma's 576
        # only beside dv=512: MLA's latent cache).
        self.assertIn("no attntune family tunes head_dim=88 bf16 (head dims: 32, 48, 64, 80, 96, 112, 128, 144, 160, "
                      "176, 192, 208, 224, 240, 256, 512, 576)", attntune.untunable(row, support))
        row["problem"]["d"] = 96
        self.assertEqual(attntune.untunable(row, support), "")
        row["problem"]["d"] = 128
        self.assertEqual(attntune.untunable(row, support), "")

    def test_variants_a_family_does_not_tune_are_not_offered(self):
        # tuner.json says, per family, which variants and regimes it tunes.
        support = {"families": [
            {"family": "flash_fwd_mma", "regimes": ["prefill", "chunk", "varlen"],
             "support": {"d": ["64", "128"], "dtype": ["fp16", "bf16"], "window": ["0", "1"], "softcap": ["0"],
                         "sinks": ["0", "1"]}},
            {"family": "flash_decode", "regimes": ["decode"],
             "support": {"d": ["64", "128"], "dtype": ["fp16", "bf16"], "window": ["0", "1"], "softcap": ["0", "1"],
                         "sinks": ["0"]}}]}

        def row(entry, s, **variants):
            p = {"b": 1, "h": 16, "hkv": 16, "s": s, "sk": 4096, "d": 128, "causal": 1, "paged": 16 if s == 1 else 0,
                 "window": [-1, -1], "softcap": 0, "sinks": 0}
            p.update(variants)
            return {"entry": entry, "dtype": "bf16", "calls": 1, "kernel": None, "tunable": True, "fallback": "x",
                    "problem": p}
        self.assertEqual(attntune.untunable(row("attention", 4096, window=[128, -1], sinks=1), support), "")
        self.assertEqual(attntune.untunable(row("attention_kvcache", 1, window=[128, -1], softcap=30.0), support), "")
        self.assertEqual(attntune.untunable(row("attention", 4096, softcap=50.0), support),
                         "no attntune family tunes this prefill problem (flash_fwd_mma tunes no logit soft-capping; "
                         "flash_decode tunes no prefill problem)")
        self.assertEqual(attntune.untunable(row("attention_kvcache", 1, softcap=30.0, sinks=1), support),
                         "no attntune family tunes this decode problem (flash_fwd_mma tunes no decode problem; "
                         "flash_decode tunes no attention sinks)")
        self.assertEqual(attntune.untunable(row("attention_varlen", 512, window=[8, 8]), support), "")
        # A tuner.json of an attntune before the variants lists none: nothing with a variant is tunable.
        old = {"families": [{"family": "flash_fwd_mma", "support": {"d": ["128"], "dtype": ["bf16"]}}]}
        self.assertEqual(attntune.untunable(row("attention", 4096), old), "")
        self.assertIn("flash_fwd_mma tunes no sliding windows", attntune.untunable(row("attention", 4096,
                                                                                       window=[8, -1]), old))

    def test_tuner_json_lists_variants_and_regimes(self):
        support = json.load(open(os.path.join(PKG, "attntune", "tuner.json")))
        regimes = {f["family"]: f["regimes"] for f in support["families"]}
        self.assertEqual(regimes["flash_decode"], ["decode"])
        self.assertEqual(regimes["flash_fwd_mma"], ["prefill", "chunk", "varlen"])
        for f in support["families"]:
            for key in VARIANT_KEYS:
                self.assertIn(f["support"][key], (["0"], ["0", "1"]), f"{f['family']} {key}")
        # What `attntune space` says each shipped space serves.
        for f in support["families"]:
            r = run("space", "--space", os.path.join(ROOT, "search_spaces", f"{f['family']}.yaml"), "--format", "json")
            problem = json.loads(r.stdout)["problem"]
            for key in VARIANT_KEYS:
                self.assertEqual(f["support"][key], problem[key], f"{f['family']} {key}")


class ValueHeadDims(unittest.TestCase):
    """v's last dim (the value head dim, Dv) other than q's and k's (D): FlashAttention's rule, and
    DeepSeek's MLA prefill (D 192, Dv 128). The package holds MLA (flash_fwd_mma, dense prefill) and
    WIDE_V (flash_decode, paged decode at D 64, Dv 128)."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()
        torch.manual_seed(44)
        self.kernels = kernels_with_entries()
        self.specs = [vr.spec_of(k["problem"]) for k in self.kernels]

    # -- the dispatch: a split kernel serves exactly its two dims

    def test_the_split_kernels_carry_their_value_dim(self):
        for spec, dv in ((MLA, 128), (WIDE_V, 128), (LATENT[0], 512), (LATENT[1], 512)):
            self.assertEqual(self.kernels[self.specs.index(spec)]["problem"].get("dv"), dv, spec)
        for k in self.kernels:  # one-dim kernels carry none
            if vr.spec_of(k["problem"]) not in [MLA, WIDE_V] + LATENT:
                self.assertNotIn("dv", k["problem"])

    def test_split_calls_run_split_kernels_only(self):
        mla, wide = self.specs.index(MLA), self.specs.index(WIDE_V)

        def explain(entry, d, causal, b, h, hkv, s, sk, **kw):
            return attntune.explain(entry, "bf16", d, causal, b, h, hkv, s, sk, **kw)
        self.assertEqual(explain("attention", 192, True, 1, 16, 16, 4096, 4096, head_dim_v=128), (mla, ""))
        self.assertEqual(explain("attention", 192, True, 2, 16, 16, 3000, 5000, head_dim_v=128)[0], mla)
        # The same shape with one head dim (None, 0 and 192 all say so): no kernel, and the reason
        # names what was asked.
        for dv in (None, 0, 192):
            self.assertEqual(explain("attention", 192, True, 1, 16, 16, 4096, 4096, head_dim_v=dv),
                             (-1, "no kernel of the library serves attention with head_dim=192 is_causal=1"), dv)
        self.assertEqual(explain("attention", 192, True, 1, 16, 16, 4096, 4096, head_dim_v=96),
                         (-1, "no kernel of the library serves attention with head_dim=192 head_dim_v=96 "
                              "is_causal=1"))
        self.assertEqual(explain("attention", 192, False, 1, 16, 16, 4096, 4096, head_dim_v=128),
                         (-1, "no kernel of the library serves attention with head_dim=192 head_dim_v=128 "
                              "is_causal=0"))
        self.assertEqual(explain("attention", 128, True, 1, 16, 16, 4096, 4096, head_dim_v=192)[0], -1)
        # A dense prefill build serves neither the kvcache nor the varlen entry.
        self.assertEqual(explain("attention_kvcache", 192, True, 1, 16, 16, 4096, 4096, head_dim_v=128)[0], -1)
        self.assertEqual(explain("attention_varlen", 192, True, 1, 16, 16, 4096, 4096, head_dim_v=128)[0], -1)
        # flash_decode at (64, 128): the kvcache entry and (it serves it too) the dense one; its
        # one-dim shape has no kernel (DECODE[0], d=64 too, is windowed).
        self.assertEqual(explain("attention_kvcache", 64, True, 16, 16, 2, 1, 4096, head_dim_v=128), (wide, ""))
        self.assertEqual(explain("attention", 64, True, 8, 16, 2, 1, 3000, head_dim_v=128)[0], wide)
        self.assertEqual(explain("attention_kvcache", 64, True, 16, 16, 2, 1, 4096),
                         (-1, "no kernel of the library serves attention_kvcache with head_dim=64 is_causal=1"))
        self.assertEqual(explain("attention_kvcache", 64, True, 16, 16, 2, 1, 4096, head_dim_v=64)[0], -1)
        with self.assertRaisesRegex(RuntimeError, "head_dim_v must be 0"):
            explain("attention", 192, True, 1, 16, 16, 4096, 4096, head_dim_v=-1)

    def test_random_shapes_follow_the_rule(self):
        rng = random.Random(44)
        ran = {}
        for _ in range(300):
            d, dv = rng.choice([(192, 128), (192, 128), (192, None), (192, 96), (64, 128), (64, 128), (128, 128),
                                (64, None)])
            causal = rng.random() < 0.7
            hkv = rng.choice([1, 2, 4, 16])
            h = hkv * rng.choice([1, 2, 8])
            b = rng.randint(1, 32)
            s = rng.choice([1, 4, rng.randint(17, 20000)])
            sk = rng.randint(max(s, 1), 20000)
            for entry, bit in (("attention", 1), ("attention_kvcache", 2)):
                got, why = attntune.explain(entry, "bf16", d, causal, b, h, hkv, s, sk, head_dim_v=dv)
                want = self._nearest(bit, d, dv, causal, b, h, hkv, s, sk)
                what = f"{entry} b={b} h={h} hkv={hkv} s={s} sk={sk} d={d} dv={dv} causal={causal}"
                if want < 0:
                    self.assertEqual(got, -1, what)
                    self.assertIn("no kernel of the library serves", why, what)
                elif got >= 0:
                    self.assertEqual(got, want, what)
                    # Two head dims run a split kernel; one (dv None or d) a one-dim kernel.
                    self.assertEqual(self.specs[got] in (MLA, WIDE_V), dv not in (None, d), what)
                    ran[self.specs[got]] = ran.get(self.specs[got], 0) + 1
                else:  # the nearest is off by more than the ratio, or of the other regime
                    self.assertRegex(why, "max_length_ratio|was tuned for (decode|prefill)", what)
        self.assertGreater(ran.get(MLA, 0), 10, ran)
        self.assertGreater(ran.get(WIDE_V, 0), 10, ran)
        self.assertGreater(sum(ran.values()), ran[MLA] + ran[WIDE_V], "one-dim calls ran one-dim kernels")

    def _nearest(self, bit, d, dv, causal, b, h, hkv, s, sk):
        """nearest() with flash_decode's own limit (seqlen_q up to 16) for decode shapes."""
        def lr(a, c):
            return abs(math.log((a if a > 0 else 1) / (c if c > 0 else 1)))
        dv = d if dv is None else dv
        best, key = -1, None
        for i, kern in enumerate(self.kernels):
            p = kern["problem"]
            if (p["d"], p.get("dv", p["d"]), bool(p["causal"])) != (d, dv, causal) or not kern["entries"] & bit:
                continue
            if kern["variants"] or p.get("kv_dtype") or p["dtype"] == "fp8" or \
                    (kern["template"] == "flash_decode" and s > 16):
                continue
            k = (round(lr(s, p["s"]) + lr(sk, p["sk"]), 9), 0 if h // hkv == p["h"] // p["hkv"] else 1,
                 round(lr(b * h, p["b"] * p["h"]), 9))
            if key is None or k < key:
                best, key = i, k
        return best

    # -- the fallback's values (CPU tensors fall back) with Dv != D

    def check_dense(self, B, H, Hkv, S, Sk, D, Dv, causal, layout="bhsd", dtype=torch.bfloat16, **variants):
        shape = (lambda n, L, dim: (B, n, L, dim)) if layout == "bhsd" else (lambda n, L, dim: (B, L, n, dim))
        q, k, v = rand(*shape(H, S, D), dtype=dtype), rand(*shape(Hkv, Sk, D), dtype=dtype), \
            rand(*shape(Hkv, Sk, Dv), dtype=dtype)
        out, lse = attntune.attention(q, k, v, is_causal=causal, layout=layout, return_lse=True, **variants)
        what = f"dense B={B} H={H} Hkv={Hkv} S={S} Sk={Sk} D={D} Dv={Dv} causal={causal} {layout} {variants}"
        self.assertEqual(out.shape, q.shape[:-1] + (Dv,), what)
        self.assertEqual(lse.shape, (B, H, S), what)
        self.assertTrue(out.is_contiguous(), what + ": out is laid out as q is ([B, S, H, Dv] for bshd)")
        # And into a NaN-poisoned out of the caller's.
        poisoned = torch.full_like(out, float("nan"))
        attntune.attention(q, k, v, is_causal=causal, layout=layout, out=poisoned, **variants)
        qh, kh, vh, oh, ph = (q, k, v, out, poisoned) if layout == "bhsd" else \
            (t.transpose(1, 2) for t in (q, k, v, out, poisoned))
        args = dict(causal=causal, window=variants.get("window_size", (-1, -1)), softcap=variants.get("softcap", 0.0),
                    sinks=variants.get("sinks"))
        ref64, lse64 = vr.attention(qh, kh, vh, 1 / math.sqrt(D), **args)
        lowp, _ = vr.attention(qh, kh, vh, 1 / math.sqrt(D), dtype=dtype, **args)
        self.assertEqual(ref64.shape[-1], Dv)
        for got, name in ((oh, "out"), (ph, "out=")):
            ok, msg = vr.compare(got, lse if name == "out" else None, ref64, lse64, lowp, dtype)
            self.assertTrue(ok, f"{what} {name}: {msg}")

    def test_dense(self):
        self.check_dense(2, 4, 4, 33, 33, 192, 128, True)                 # MLA prefill
        self.check_dense(1, 8, 2, 37, 101, 64, 128, True, "bshd")         # V wider, GQA, bottom-right
        self.check_dense(1, 4, 1, 100, 40, 192, 128, True)                # 60 rows see no key
        self.check_dense(2, 4, 2, 17, 29, 128, 80, False, dtype=torch.float16)
        self.check_dense(1, 4, 4, 20, 20, 192, 128, False, "bshd", dtype=torch.float32)

    def test_dense_with_variants(self):
        self.check_dense(2, 6, 3, 45, 77, 192, 128, True, window_size=(16, 0), softcap=30.0,
                         sinks=sink_logits(6, 1))
        self.check_dense(1, 4, 2, 40, 40, 64, 128, False, "bshd", window_size=(5, 3), sinks=sink_logits(4, 2))
        self.check_dense(1, 2, 1, 30, 12, 192, 128, True, softcap=50.0)  # rows without keys, fp32 path

    def test_dense_zero_keys(self):
        q, k, v = rand(1, 2, 5, 192), rand(1, 2, 0, 192), rand(1, 2, 0, 128)
        out, lse = attntune.attention(q, k, v, return_lse=True)
        self.assertTrue(torch.equal(out, torch.zeros(1, 2, 5, 128, dtype=q.dtype)))
        self.assertTrue(torch.isneginf(lse).all().item())
        out = attntune.attention(q, k, v, sinks=torch.tensor([1.0, 2.0]))
        self.assertTrue(torch.equal(out, torch.zeros(1, 2, 5, 128, dtype=q.dtype)))

    def test_kvcache(self):
        B, H, Hkv, D, Dv, Sk = 5, 8, 2, 192, 128, 64
        lens = [0, 1, 37, 64, 50]
        for S, causal, page, variants in ((1, True, 16, {}), (3, False, 0, {}), (4, True, 16, {}),
                                          (2, True, 16, dict(window_size=(10, 0), sinks=sink_logits(H))),
                                          (3, False, 0, dict(window_size=(5, 2), softcap=30.0))):
            q, k, v = rand(B, H, S, D), rand(B, Hkv, Sk, D), rand(B, Hkv, Sk, Dv)
            kc, vc, table = vr.paged_cache(k, v, lens, page, S)  # NaN past each length, shuffled pages
            self.assertEqual(vc.shape[-1], Dv)
            out = torch.full((B, S, H, Dv), float("nan"), dtype=q.dtype)
            _, lse = attntune.attention_kvcache(q.transpose(1, 2), kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32),
                                                block_table=table, is_causal=causal, return_lse=True, out=out,
                                                **variants)
            args = dict(causal=causal, window=variants.get("window_size", (-1, -1)),
                        softcap=variants.get("softcap", 0.0), sinks=variants.get("sinks"), len_k=lens)
            ref64, lse64 = vr.attention(q, k, v, 1 / math.sqrt(D), **args)
            lowp, _ = vr.attention(q, k, v, 1 / math.sqrt(D), dtype=torch.bfloat16, **args)
            ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, torch.bfloat16)
            self.assertTrue(ok, f"kvcache page={page} S={S} causal={causal} {variants}: {msg}")
            # The op's own out: [B, S, H, Dv].
            own = attntune.attention_kvcache(q.transpose(1, 2), kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32),
                                             block_table=table, is_causal=causal, **variants)
            self.assertEqual(own.shape, (B, S, H, Dv))
            self.assertTrue(torch.equal(own, out), "the op's out and the caller's hold the same values")

    def test_varlen(self):
        H, Hkv, D, Dv = 4, 2, 64, 128
        for causal, variants in ((False, {}), (True, {}), (True, dict(window_size=(7, 0), sinks=sink_logits(H))),
                                 (False, dict(softcap=30.0))):
            lens_q, lens_k = [0, 1, 17, 64, 33], [3, 1, 17, 80, 20]
            cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
            cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
            q, k, v = rand(sum(lens_q), H, D), rand(sum(lens_k), Hkv, D), rand(sum(lens_k), Hkv, Dv)
            out, lse = attntune.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                                 return_lse=True, **variants)
            self.assertEqual((out.shape, lse.shape), ((q.shape[0], H, Dv), (H, q.shape[0])))
            args = dict(causal=causal, window=variants.get("window_size", (-1, -1)),
                        softcap=variants.get("softcap", 0.0), sinks=variants.get("sinks"))
            for b in range(len(lens_q)):
                if lens_q[b] == 0:
                    continue
                qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
                qb, kb, vb = (t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks]))
                ref64, lse64 = vr.attention(qb, kb, vb, 1 / math.sqrt(D), **args)
                lowp, _ = vr.attention(qb, kb, vb, 1 / math.sqrt(D), dtype=torch.bfloat16, **args)
                ok, msg = vr.compare(out[qs][None].transpose(1, 2), lse[:, qs][None], ref64, lse64, lowp,
                                     torch.bfloat16)
                self.assertTrue(ok, f"varlen seq {b} causal={causal} {variants}: {msg}")
        # No keys at all (total_k 0): zeros at Dv, LSE -inf.
        q, k, v = rand(6, H, D), rand(0, Hkv, D), rand(0, Hkv, Dv)
        cu_q, cu_k = torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([0, 0, 0], dtype=torch.int32)
        out, lse = attntune.attention_varlen(q, k, v, cu_q, cu_k, 4, 0, return_lse=True)
        self.assertTrue(torch.equal(out, torch.zeros(6, H, Dv, dtype=q.dtype)))
        self.assertTrue(torch.isneginf(lse).all().item())

    # -- what is refused, naming both shapes

    def test_mismatched_shapes_are_refused(self):
        q = rand(1, 4, 8, 64)
        cases = [
            (lambda: attntune.attention(q, rand(1, 2, 8, 64), rand(1, 2, 9, 32)),
             r"attntune.attention: v must have k's shape but for its last dim \(the value head dim, which may differ "
             r"from the query/key head dim\): k \[1, 2, 8, 64\], v \[1, 2, 9, 32\]"),
            (lambda: attntune.attention(q, rand(1, 2, 8, 64), rand(1, 1, 8, 128)), r"k \[1, 2, 8, 64\], v \[1, 1, 8, 128\]"),
            (lambda: attntune.attention(q, rand(1, 2, 8, 64), rand(2, 2, 8, 128)), r"k \[1, 2, 8, 64\], v \[2, 2, 8, 128\]"),
            (lambda: attntune.attention(q, rand(1, 2, 8, 32), rand(1, 2, 8, 64)),
             r"attntune.attention: q and k must have the same head_dim \(the last dim; only v's may differ\): "
             r"q \[1, 4, 8, 64\], k \[1, 2, 8, 32\]"),
            (lambda: attntune.attention(q, rand(1, 2, 8, 64), rand(1, 2, 8, 0)), r"v's last dim \(the value head dim\) is 0"),
            (lambda: attntune.attention(q, rand(1, 2, 8, 64), rand(1, 2, 8, 128), out=torch.empty_like(q)),
             r"out must have q's shape with v's head dim last \(\[1, 4, 8, 128\]; got \[1, 4, 8, 64\]\)"),
            (lambda: attntune.attention(q, rand(1, 2, 8, 64), rand(1, 2, 8, 64), out=rand(1, 4, 8, 128)),
             r"out must have q's shape \(\[1, 4, 8, 64\]; got \[1, 4, 8, 128\]\)"),
            (lambda: attntune.attention_kvcache(rand(2, 1, 4, 64), rand(6, 16, 2, 64), rand(7, 16, 2, 128),
                                                block_table=torch.zeros(2, 2, dtype=torch.int32)),
             r"attntune.attention_kvcache: v_cache must have k_cache's shape but for its last dim .*: "
             r"k_cache \[6, 16, 2, 64\], v_cache \[7, 16, 2, 128\]"),
            (lambda: attntune.attention_kvcache(rand(2, 1, 4, 64), rand(2, 16, 2, 128), rand(2, 16, 2, 128)),
             r"q and k_cache must have the same head_dim .*: q \[2, 1, 4, 64\], k_cache \[2, 16, 2, 128\]"),
            (lambda: attntune.attention_kvcache(rand(2, 1, 4, 64), rand(2, 16, 2, 64), rand(2, 16, 2, 128),
                                                out=rand(2, 1, 4, 64)),
             r"attntune.attention_kvcache: out must have q's shape with v's head dim last \(\[2, 1, 4, 128\]"),
            (lambda: attntune.attention_varlen(rand(8, 4, 64), rand(8, 2, 64), rand(9, 2, 128),
                                               torch.tensor([0, 8], dtype=torch.int32),
                                               torch.tensor([0, 8], dtype=torch.int32), 8, 8),
             r"attntune.attention_varlen: v must have k's shape but for its last dim .*: k \[8, 2, 64\], "
             r"v \[9, 2, 128\]"),
            (lambda: attntune.attention_varlen(rand(8, 4, 64), rand(8, 2, 64), rand(8, 2, 128),
                                               torch.tensor([0, 8], dtype=torch.int32),
                                               torch.tensor([0, 8], dtype=torch.int32), 8, 8, out=rand(8, 4, 64)),
             r"attntune.attention_varlen: out must have q's shape with v's head dim last \(\[8, 4, 128\]")]
        for i, (call, pattern) in enumerate(cases):
            with self.assertRaisesRegex(RuntimeError, pattern, msg=f"case {i}"):
                call()
        self.assertEqual(attntune.coverage(), [], "a refused call is no call")

    # -- coverage, plans, the raise policy

    def test_split_calls_are_other_problems(self):
        q, k, v = rand(1, 4, 8, 192), rand(1, 2, 8, 192), rand(1, 2, 8, 128)
        attntune.attention(q, k, v, is_causal=True)
        attntune.attention(q, k, v, is_causal=True)
        attntune.attention(q, k, k, is_causal=True)  # one head dim: another problem
        attntune.attention_kvcache(rand(2, 1, 4, 64), rand(2, 16, 2, 64), rand(2, 16, 2, 128), is_causal=True)
        rows = attntune.coverage()
        self.assertEqual({attntune.problem_spec(r): r["calls"] for r in rows},
                         {"b=1,h=4,hkv=2,s=8,sk=8,d=192,dv=128,dtype=bf16,causal=1": 2,
                          "b=1,h=4,hkv=2,s=8,sk=8,d=192,dtype=bf16,causal=1": 1,
                          "b=2,h=4,hkv=2,s=1,sk=16,d=64,dv=128,dtype=bf16,causal=1": 1})
        for r in rows:  # "dv" only where it is not d, as attntune's problems carry it
            self.assertEqual(r["problem"].get("dv"), None if r["problem"]["d"] == 192 and r["calls"] == 1 else 128, r)
        attntune.set_policy("raise", 16.0)
        with self.assertRaisesRegex(RuntimeError, "no tuned kernel for b=1,h=4,hkv=2,s=8,sk=8,d=192,dv=128,causal=1,"
                                                  "window=4,softcap=30: tensors on cpu"):
            attntune.attention(q, k, v, is_causal=True, window_size=(4, 0), softcap=30.0)

    def test_plans_with_a_value_dim_are_submitted_as_such(self):
        support = json.load(open(os.path.join(PKG, "attntune", "tuner.json")))
        fams = {f["family"]: f["support"] for f in support["families"]}
        self.assertIn("128", fams["flash_fwd_mma"]["dv"])
        row = {"entry": "attention", "dtype": "bf16", "calls": 1, "kernel": None, "tunable": True, "fallback": "x",
               "problem": {"b": 1, "h": 128, "hkv": 128, "s": 8192, "sk": 8192, "d": 192, "dv": 128, "causal": 1,
                           "paged": 0, "window": [-1, -1], "softcap": 0, "sinks": 0}}
        self.assertEqual(attntune.untunable(row, support), "")
        no_dv = {"families": [{"family": "flash_fwd_mma", "regimes": ["prefill"],
                               "support": {"d": ["192"], "dtype": ["bf16"]}}]}
        self.assertEqual(attntune.untunable(row, no_dv),
                         "no attntune family tunes this prefill problem (flash_fwd_mma tunes no value head dim 128 "
                         "beside head_dim 192)")
        spec = "b=1,h=128,hkv=128,s=8192,sk=8192,d=192,dv=128,dtype=bf16,causal=1"
        plan = attntune.plan_from_coverage([row], "deepseek-ish")
        self.assertEqual(plan["problems"], [{"problem": spec, "regime": "prefill"}])
        db = os.path.join(WORK, "dv-queue.db")
        r = run("submit", "--db", db, "--problem", plan["problems"][0]["problem"], "--format", "json")
        self.assertEqual(json.loads(r.stdout)[0]["problem"]["dv"], 128)
        self.assertTrue(json.loads(r.stdout)[0]["campaign"].endswith(":" + spec), r.stdout)

    # -- the fakes and torch.compile

    def test_fakes_give_the_ops_shapes_and_strides(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        ops = torch.ops.attntune
        bshd = lambda *s: rand(*s).transpose(1, 2)  # noqa: E731  ([B, S, H, D] storage as [B, H, S, D])
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        calls = [
            (ops.attention, (rand(2, 4, 9, 192), rand(2, 2, 11, 192), rand(2, 2, 11, 128), None, True, True)),
            (ops.attention, (bshd(2, 9, 4, 192), bshd(2, 11, 2, 192), bshd(2, 11, 2, 128), None, True, False)),
            (ops.attention, (rand(1, 4, 9, 64)[:, :, :, :], rand(1, 4, 9, 64), rand(1, 4, 9, 128), None, False, True,
                             [3, 2], 30.0, torch.zeros(4))),
            (ops.attention_kvcache, (rand(2, 3, 4, 64), rand(6, 16, 2, 64), rand(6, 16, 2, 128),
                                     torch.tensor([20, 7], dtype=torch.int32),
                                     torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), None, True, True)),
            (ops.attention_varlen, (rand(10, 4, 192), rand(10, 2, 192), rand(10, 2, 128), cu, cu, 7, 7, None, True,
                                    True))]
        for op, args in calls:
            real_out, real_lse = op(*args)
            with FakeTensorMode(allow_non_fake_inputs=False) as mode:
                fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
                fake_out, fake_lse = op(*fake_args)
            what = f"{op} {[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}"
            self.assertEqual(real_out.shape[-1], 128, what)
            self.assertEqual((fake_out.shape, fake_out.stride(), fake_out.dtype),
                             (real_out.shape, real_out.stride(), real_out.dtype), what)
            self.assertEqual(fake_lse.shape, real_lse.shape, what)
        # bshd storage: the op's out is [B, S, H, Dv] storage too, as for one head dim.
        out = attntune.attention(rand(2, 9, 4, 192), rand(2, 11, 2, 192), rand(2, 11, 2, 128), layout="bshd")
        self.assertEqual(out.shape, (2, 9, 4, 128))
        self.assertTrue(out.is_contiguous())

    def test_opcheck(self):
        ops = torch.ops.attntune
        q, k, v = rand(2, 4, 9, 192), rand(2, 2, 11, 192), rand(2, 2, 11, 128)
        torch.library.opcheck(ops.attention.default, (q, k, v, None, True, True))
        torch.library.opcheck(ops.attention.default, (q.transpose(1, 2).contiguous().transpose(1, 2), k, v, None,
                                                      False, True, [4, 0], 30.0, torch.zeros(4)))
        torch.library.opcheck(ops.attention_into.default, (q, k, v, rand(2, 4, 9, 128), None, None, True))
        torch.library.opcheck(ops.attention_kvcache.default,
                              (rand(2, 3, 4, 64), rand(6, 16, 2, 64), rand(6, 16, 2, 128),
                               torch.tensor([20, 7], dtype=torch.int32),
                               torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), None, True, True))
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        torch.library.opcheck(ops.attention_varlen.default,
                              (rand(10, 4, 64), rand(10, 2, 64), rand(10, 2, 128), cu, cu, 7, 7, None, True, True))

    def test_fullgraph(self):
        torch._dynamo.reset()

        def f(q, k, v, kc, vc, table, lens, xq, xk, xv, cu):
            a, la = attntune.attention(q, k, v, is_causal=True, return_lse=True)
            b = attntune.attention_kvcache(q.transpose(1, 2)[:, :2], kc, vc, cache_seqlens=lens, block_table=table,
                                           window_size=(4, 0))
            c = attntune.attention_varlen(xq, xk, xv, cu, cu, 7, 7, is_causal=True)
            return a * 2, la, b + 1, c

        q, k, v = rand(2, 4, 9, 192), rand(2, 2, 9, 192), rand(2, 2, 9, 128)
        kc, vc = rand(6, 16, 2, 192), rand(6, 16, 2, 128)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        xq, xk, xv, cu = rand(10, 4, 64), rand(10, 2, 64), rand(10, 2, 128), torch.tensor([0, 3, 10],
                                                                                        dtype=torch.int32)
        args = (q, k, v, kc, vc, table, lens, xq, xk, xv, cu)
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(*args), f(*args)):
            self.assertEqual(got.shape, want.shape)
            self.assertTrue(torch.equal(got, want))
        self.assertEqual(compiled(*args)[0].shape, (2, 4, 9, 128))


class LatentCaches(unittest.TestCase):
    """MLA decode over one latent cache (docs/CONTRACT.md "Latent caches"): V is K's first Dv columns,
    passed as the view v = k[..., :Dv] (mla_decode: FlashMLA's kv_cache and head_dim_v). The package
    holds LATENT: flash_decode_wgmma at d=576, dv=512 over the latent cache (sk=1000) and over separate
    K and V (sk=8000)."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()
        torch.manual_seed(576)
        self.kernels = kernels_with_entries()
        self.specs = [vr.spec_of(k["problem"]) for k in self.kernels]
        self.latent, self.split = self.specs.index(LATENT[0]), self.specs.index(LATENT[1])

    def explain(self, entry, sk, s=1, causal=False, **kw):
        kw.setdefault("head_dim_v", 512)
        return attntune.explain(entry, "bf16", 576, causal, 4, 16, 1, s, sk, **kw)

    # -- the dispatch: attntune_options.latent

    def test_the_kernels_say_latent(self):
        lat, split = self.kernels[self.latent], self.kernels[self.split]
        self.assertTrue(lat["problem"].get("latent"))
        self.assertNotIn("latent", split["problem"])
        self.assertEqual((lat["template"], split["template"]), ("flash_decode_wgmma", "flash_decode_wgmma"))
        self.assertEqual(lat["variants"], [])  # latent is not a variant

    def test_only_latent_calls_run_the_latent_kernel(self):
        for entry in ("attention_kvcache", "attention"):  # flash_decode_wgmma serves both
            self.assertEqual(self.explain(entry, 1000, latent=True), (self.latent, ""), entry)
            self.assertEqual(self.explain(entry, 1300, latent=True)[0], self.latent, entry)
            # Without latent the sizes are separate K and V: never the latent kernel; the other one
            # (8x off, within max_length_ratio 16).
            self.assertEqual(self.explain(entry, 1000), (self.split, ""), entry)
            # Nearer its lengths, the kernel over separate K and V serves a latent call too (it reads
            # V through the aliasing pointer).
            self.assertEqual(self.explain(entry, 8000, latent=True), (self.split, ""), entry)
        attntune.set_policy("sdpa", 4.0)
        self.assertEqual(self.explain("attention_kvcache", 1000, latent=True)[0], self.latent)
        k, why = self.explain("attention_kvcache", 1000)
        self.assertEqual(k, -1)
        self.assertIn("max_length_ratio", why)
        attntune.set_policy("sdpa", 16.0)
        # No causal kernel at these dims: the reason says latent.
        self.assertEqual(self.explain("attention_kvcache", 1000, s=2, causal=True, latent=True),
                         (-1, "no kernel of the library serves attention_kvcache with head_dim=576 head_dim_v=512 "
                              "is_causal=1 over a latent cache (v is k's first head_dim_v columns)"))
        # Other dims: not the latent kernel.
        self.assertEqual(self.explain("attention_kvcache", 1000, latent=True, head_dim_v=256)[0], -1)
        with self.assertRaisesRegex(RuntimeError, r"latent \(V is K's first head_dim_v columns\) needs head_dim_v "
                                                  r"below head_dim \(got head_dim 576, head_dim_v 0\)"):
            self.explain("attention_kvcache", 1000, latent=True, head_dim_v=None)
        with self.assertRaisesRegex(RuntimeError, "latent is for attention and attention_kvcache"):
            self.explain("attention_varlen", 1000, latent=True)

    # -- which calls are latent

    def test_a_view_of_k_is_latent_and_nothing_else_is(self):
        B, H, page, nb = 2, 4, 16, 6
        q = rand(B, 1, H, 576)
        kv = rand(nb, page, 1, 576)
        table = torch.tensor([[0, 3], [5, 1]], dtype=torch.int32)
        lens = torch.tensor([20, 7], dtype=torch.int32)

        def latent_of(k, v):
            attntune.reset_coverage()
            out = attntune.attention_kvcache(q, k, v, cache_seqlens=lens, block_table=table)
            self.assertEqual(out.shape, (B, 1, H, v.shape[-1]))
            (row,) = attntune.coverage()
            return row["problem"].get("latent", 0)
        wide = rand(nb, page, 1, 640)
        flat = rand(nb * page * 576)
        cases = [("k[..., :512]", kv, kv[..., :512], 1),
                 ("a view of a wider buffer", wide[..., :576], wide[..., :512], 1),
                 ("a copy", kv, kv[..., :512].clone(), 0),
                 ("an offset view", kv, kv[..., 64:], 0),
                 ("another tensor", kv, rand(nb, page, 1, 512), 0),
                 ("v = k (one head dim)", kv, kv, 0),
                 ("the same pointer, other strides", flat.view(nb, page, 1, 576),
                  flat.as_strided((nb, page, 1, 512), (page * 512, 512, 512, 1)), 0)]
        for what, k, v, want in cases:
            self.assertEqual(latent_of(k, v), want, what)
        # The dense entry ([B, H, S, D] and [B, S, H, D] views alike); varlen never (no varlen latent problem).
        q, k = rand(1, 4, 3, 192), rand(1, 1, 40, 192)
        for layout, (qq, kk) in (("bhsd", (q, k)), ("bshd", (q.transpose(1, 2), k.transpose(1, 2)))):
            attntune.reset_coverage()
            out = attntune.attention(qq, kk, kk[..., :128], layout=layout)
            self.assertEqual(out.shape, qq.shape[:-1] + (128,))
            self.assertEqual([attntune.problem_spec(r) for r in attntune.coverage()],
                             ["b=1,h=4,hkv=1,s=3,sk=40,d=192,dv=128,dtype=bf16,causal=0,latent=1"], layout)
        attntune.reset_coverage()
        xk = rand(10, 1, 192)
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        attntune.attention_varlen(rand(10, 4, 192), xk, xk[..., :128], cu, cu, 7, 7)
        self.assertNotIn("latent", attntune.coverage()[0]["problem"])

    # -- coverage, specs, plans and the raise policy

    def test_coverage_plans_and_raises_latent_problems(self):
        q, kv = rand(4, 1, 16, 576), rand(70, 64, 1, 576)
        table = torch.arange(64, dtype=torch.int32).view(4, 16)
        lens = torch.tensor([1000, 1, 640, 1024], dtype=torch.int32)
        attntune.mla_decode(q, kv, table, lens)
        attntune.mla_decode(q, kv, table, lens)
        (row,) = attntune.coverage()
        spec = "b=4,h=16,hkv=1,s=1,sk=1024,d=576,dv=512,dtype=bf16,causal=0,page=64,latent=1"
        self.assertEqual(row["entry"], "attention_kvcache")
        self.assertEqual((row["calls"], row["problem"]["latent"], row["problem"]["dv"], row["problem"]["paged"]),
                         (2, 1, 512, 64))
        self.assertEqual(attntune.problem_spec(row), spec)
        self.assertIn(spec, attntune.coverage_table())
        # A GPU's row (tunable): its plan is the latent problem, which flash_decode_wgmma tunes.
        row = dict(row, tunable=True, fallback="no kernel")
        support = json.load(open(os.path.join(PKG, "attntune", "tuner.json")))
        fams = {f["family"]: f["support"] for f in support["families"]}
        self.assertIn("576", fams["flash_decode_wgmma"]["d"])
        self.assertEqual(fams["flash_decode_wgmma"]["latent"], ["0", "1"])
        self.assertEqual(attntune.untunable(row, support), "")
        no_latent = {"families": [{"family": "flash_decode_wgmma", "regimes": ["decode"],
                                   "support": {"d": ["576"], "dv": ["512"], "dtype": ["bf16"]}}]}
        self.assertEqual(attntune.untunable(row, no_latent),
                         "no attntune family tunes this decode problem (flash_decode_wgmma tunes no latent cache)")
        plan = attntune.plan_from_coverage([row], "deepseek-v3")
        self.assertEqual(plan["problems"], [{"problem": spec, "regime": "decode"}])
        db = os.path.join(WORK, "latent-queue.db")
        r = run("submit", "--db", db, "--problem", spec, "--format", "json")
        queued = json.loads(r.stdout)[0]
        self.assertTrue(queued["problem"]["latent"], r.stdout)
        self.assertTrue(queued["campaign"].endswith(":" + spec), r.stdout)
        self.assertIn("flash_decode_wgmma", queued["campaign"].split(":")[0])
        # The raise policy names the latent problem.
        attntune.set_policy("raise", 16.0)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_kvcache: no tuned kernel for b=4,h=16,hkv=1,"
                                                  "s=1,sk=1024,d=576,dv=512,causal=0,latent=1: tensors on cpu"):
            attntune.mla_decode(q, kv, table, lens)

    # -- mla_decode: FlashMLA's call, as attention_kvcache over the view

    def test_mla_decode_is_attention_kvcache_over_the_view(self):
        B, S, H = 3, 2, 8
        q, kv = rand(B, S, H, 576), rand(10, 16, 1, 576)
        table = torch.tensor([[0, 4, 7], [9, 1, 2], [3, 5, 6]], dtype=torch.int32)
        lens = torch.tensor([40, 1, 33], dtype=torch.int32)
        for kw in ({}, dict(is_causal=True), dict(scale=0.1, is_causal=True)):
            out, lse = attntune.mla_decode(q, kv, table, lens, return_lse=True, **kw)
            want, want_lse = attntune.attention_kvcache(q, kv, kv[..., :512], cache_seqlens=lens, block_table=table,
                                                        return_lse=True, **kw)
            self.assertEqual((out.shape, lse.shape), ((B, S, H, 512), (B, H, S)), kw)
            self.assertTrue(torch.equal(out, want), kw)
            self.assertTrue(torch.equal(lse, want_lse), kw)
        # head_dim_v, a contiguous cache (block_table None) and out=.
        out = attntune.mla_decode(q, kv, table, lens, head_dim_v=256)
        self.assertTrue(torch.equal(out, attntune.attention_kvcache(q, kv, kv[..., :256], cache_seqlens=lens,
                                                                    block_table=table)))
        contiguous = rand(B, 48, 1, 576)
        mine = torch.full((B, S, H, 512), float("nan"), dtype=q.dtype)
        got = attntune.mla_decode(q, contiguous, None, lens, out=mine)
        self.assertIs(got, mine)
        self.assertTrue(torch.equal(mine, attntune.attention_kvcache(q, contiguous, contiguous[..., :512],
                                                                     cache_seqlens=lens)))
        for bad, pattern in ((dict(head_dim_v=576), "head_dim_v must be an int from 1 to below the cache's head dim "
                                                    r"\(576\)"),
                             (dict(head_dim_v=0), "head_dim_v must be"), (dict(head_dim_v=True), "head_dim_v must be"),
                             (dict(head_dim_v=512.0), "head_dim_v must be")):
            with self.assertRaisesRegex(ValueError, pattern, msg=str(bad)):
                attntune.mla_decode(q, kv, table, lens, **bad)
        with self.assertRaisesRegex(ValueError, "kv_cache must be a 4-d tensor"):
            attntune.mla_decode(q, kv[:, :, 0], table, lens)

    def test_mla_decode_over_an_fp8_latent_cache_takes_one_descale_for_k_and_v(self):
        B, S, H = 3, 1, 8
        q = rand(B, S, H, 576)
        kv = fp8(10, 16, 1, 576)
        table = torch.tensor([[0, 4, 7], [9, 1, 2], [3, 5, 6]], dtype=torch.int32)
        lens = torch.tensor([40, 1, 33], dtype=torch.int32)
        scales = torch.tensor([[0.5], [2.0], [0.25]], dtype=torch.float32)  # [B, Hkv]
        for name in ("kv_descale", "kv_scale"):
            out, lse = attntune.mla_decode(q, kv, table, lens, return_lse=True, **{name: scales})
            want, want_lse = attntune.attention_kvcache(q, kv, kv[..., :512], cache_seqlens=lens, block_table=table,
                                                        return_lse=True, k_descale=scales, v_descale=scales)
            self.assertTrue(torch.equal(out, want), name)
            self.assertTrue(torch.equal(lse, want_lse), name)
        # The scales matter: without them (1) the result differs.
        self.assertFalse(torch.equal(attntune.mla_decode(q, kv, table, lens), out))
        with self.assertRaisesRegex(ValueError, "give kv_descale or kv_scale"):
            attntune.mla_decode(q, kv, table, lens, kv_descale=scales, kv_scale=scales)

    # -- the fallback's values over the view (CPU tensors fall back)

    def test_fallback_values(self):
        B, H, D, Dv, Sk = 5, 8, 576, 512, 64
        lens = [0, 1, 37, 64, 50]
        seqlens = torch.tensor(lens, dtype=torch.int32)
        for S, causal, page, variants in ((1, False, 16, {}), (2, True, 16, {}), (3, True, 0, {}), (1, False, 64, {}),
                                          (2, True, 16, dict(window_size=(10, 0), softcap=30.0)),
                                          (1, False, 0, dict(sinks=sink_logits(H, 1)))):
            q, k = rand(B, H, S, D), rand(B, 1, Sk, D)
            kc, _, table = vr.paged_cache(k, k, lens, page, S)  # one cache, NaN past each length
            out = torch.full((B, S, H, Dv), float("nan"), dtype=q.dtype)
            attntune.reset_coverage()
            if variants:
                _, lse = attntune.attention_kvcache(q.transpose(1, 2), kc, kc[..., :Dv], cache_seqlens=seqlens,
                                                    block_table=table, is_causal=causal, return_lse=True, out=out,
                                                    **variants)
            else:
                _, lse = attntune.mla_decode(q.transpose(1, 2), kc, table, seqlens, is_causal=causal,
                                             return_lse=True, out=out)
            self.assertEqual(attntune.coverage()[0]["problem"].get("latent"), 1)
            args = dict(causal=causal, window=variants.get("window_size", (-1, -1)),
                        softcap=variants.get("softcap", 0.0), sinks=variants.get("sinks"), len_k=lens)
            ref64, lse64 = vr.attention(q, k, k[..., :Dv], 1 / math.sqrt(D), **args)
            lowp, _ = vr.attention(q, k, k[..., :Dv], 1 / math.sqrt(D), dtype=torch.bfloat16, **args)
            ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, torch.bfloat16)
            self.assertTrue(ok, f"latent kvcache page={page} S={S} causal={causal} {variants}: {msg}")
        # The dense entry over a view, both layouts, plain (SDPA) and with a variant (fp32 path).
        for layout, causal, variants in (("bhsd", True, {}), ("bshd", False, {}), ("bhsd", True, dict(softcap=30.0))):
            q, k = rand(2, 4, 33, 192), rand(2, 1, 50, 192)
            qq, kk = (q, k) if layout == "bhsd" else (q.transpose(1, 2), k.transpose(1, 2))
            out, lse = attntune.attention(qq, kk, kk[..., :128], is_causal=causal, layout=layout, return_lse=True,
                                          **variants)
            oh = out if layout == "bhsd" else out.transpose(1, 2)
            args = dict(causal=causal, softcap=variants.get("softcap", 0.0))
            ref64, lse64 = vr.attention(q, k, k[..., :128], 1 / math.sqrt(192), **args)
            lowp, _ = vr.attention(q, k, k[..., :128], 1 / math.sqrt(192), dtype=torch.bfloat16, **args)
            ok, msg = vr.compare(oh, lse, ref64, lse64, lowp, torch.bfloat16)
            self.assertTrue(ok, f"latent dense {layout} causal={causal} {variants}: {msg}")

    def test_fullgraph(self):
        torch._dynamo.reset()

        def f(q, kv, table, lens):
            out, lse = attntune.mla_decode(q, kv, table, lens, is_causal=True, return_lse=True)
            return out * 2, lse

        q, kv = rand(2, 2, 8, 576), rand(6, 16, 1, 576)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(q, kv, table, lens), f(q, kv, table, lens)):
            self.assertEqual(got.shape, want.shape)
            self.assertTrue(torch.equal(got, want))


def fp8(*shape, scale=2.0):
    """Random e4m3 values (float8_e4m3fn) of `shape`: normal values times `scale`, rounded to e4m3."""
    return (torch.randn(*shape) * scale).to(torch.float8_e4m3fn)


class Fp8Forward(unittest.TestCase):
    """The FP8 forward (docs/CONTRACT.md "FP8 forward"; FlashAttention-3's FP8 call): attention with q, k
    and v float8_e4m3fn, q_descale / k_descale / v_descale float32 [batch, heads_kv] (or one scale), out
    bf16, V read transposed. The package holds FP8_FWD: flash_fwd_wgmma's d=128 causal FP8 forward
    (built, never run here: CPU tensors fall back to the fp32 path over the dequantised inputs)."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()
        torch.manual_seed(42)
        self.kernels = kernels_with_entries()
        self.specs = [vr.spec_of(k["problem"]) for k in self.kernels]
        self.fwd = self.specs.index(FP8_FWD[0])

    def test_the_kernel_says_dtype_fp8(self):
        k = self.kernels[self.fwd]
        self.assertEqual((k["template"], k["problem"]["dtype"], k["entries"]), ("flash_fwd_wgmma", "fp8", 1))
        for other in self.kernels[:self.fwd] + self.kernels[self.fwd + 1:]:
            if "companion_for" not in other:  # the FP8 kernel's companion (docs/EXPORT.md) is FP8 too
                self.assertNotEqual(other["problem"]["dtype"], "fp8")

    def test_only_fp8_forward_calls_run_it(self):
        ex = attntune.explain
        self.assertEqual(ex("attention", "fp8", 128, True, 1, 16, 4, 4096, 4096), (self.fwd, ""))
        self.assertEqual(ex("attention", "fp8", 128, True, 2, 16, 4, 1000, 3000)[0], self.fwd)
        # A bf16 call of its shape never runs it, nor an FP8 cache's.
        self.assertNotEqual(ex("attention", "bf16", 128, True, 1, 16, 4, 4096, 4096)[0], self.fwd)
        self.assertNotEqual(ex("attention", "bf16", 128, True, 1, 16, 4, 4096, 4096, kv_dtype="fp8")[0], self.fwd)
        self.assertEqual(ex("attention", "fp8", 64, True, 1, 16, 4, 4096, 4096),
                         (-1, "no kernel of the library serves attention with head_dim=64 is_causal=1 with FP8 e4m3 "
                              "q, k and v (the FP8 forward, dtype=fp8)"))
        self.assertEqual(ex("attention", "fp8", 128, False, 1, 16, 4, 4096, 4096)[0], -1)
        for entry in ("attention_kvcache", "attention_varlen"):
            with self.assertRaisesRegex(RuntimeError, r"dtype fp8 \(the FP8 forward.*\) is attention's \(entry 1\)"):
                ex(entry, "fp8", 128, True, 1, 16, 4, 4096, 4096)

    def test_opcheck_and_fullgraph(self):
        ops = torch.ops.attntune
        q, k, v, qd, kd, vd = self.inputs(S=5, Sk=9)
        # The fake and AOT-dispatch checks against the real op (test_schema perturbs the inputs
        # arithmetically, which torch has no FP8 kernels for on the CPU).
        tests = ("test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(ops.attention.default, (q, k, v, None, True, True, [-1, -1], 0.0, None, kd, vd, False,
                                                      qd), test_utils=tests)
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        torch.library.opcheck(ops.attention_into.default, (q, k, v, out, None, None, False, [-1, -1], 0.0, None, kd,
                                                           vd, qd), test_utils=tests)
        torch._dynamo.reset()

        def f(q, k, v, qd, kd, vd):
            out, lse = attntune.attention(q, k, v, is_causal=True, return_lse=True, q_descale=qd, k_descale=kd,
                                          v_descale=vd)
            return out * 2, lse

        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(q, k, v, qd, kd, vd), f(q, k, v, qd, kd, vd)):
            self.assertEqual((got.shape, got.dtype), (want.shape, want.dtype))
            self.assertTrue(torch.equal(got, want))

    def inputs(self, B=2, H=4, Hkv=2, S=37, Sk=53, D=128, per_head=True):
        q, k, v = fp8(B, H, S, D, scale=1.0), fp8(B, Hkv, Sk, D, scale=1.0), fp8(B, Hkv, Sk, D)
        if per_head:
            qd, kd, vd = torch.rand(B, Hkv) + 0.25, torch.rand(B, Hkv) + 0.25, torch.rand(B, Hkv) * 0.5 + 0.1
        else:
            qd, kd, vd = torch.tensor(0.7), torch.tensor([1.3]), None
        return q, k, v, qd, kd, vd

    @staticmethod
    def reference(q, k, v, qd, kd, vd, causal, visible=None):
        """float64 attention over the dequantised inputs (q_descale per (sequence, KV head)); `visible` an
        extra mask (a window), as ref_attention's."""
        def deq(t, d, group=1):  # [B, heads, S, D]: vr.dequantised's heads second to last
            return vr.dequantised(t.transpose(1, 2), d, group).transpose(1, 2)
        G = q.shape[1] // k.shape[1]
        return ref_attention(deq(q, qd, G), deq(k, kd), deq(v, vd), q.shape[-1] ** -0.5, causal, visible)

    def test_values_and_coverage(self):
        for causal, per_head, window in ((True, True, (-1, -1)), (False, False, (-1, -1)), (True, True, (16, 0))):
            q, k, v, qd, kd, vd = self.inputs(per_head=per_head)
            out, lse = attntune.attention(q, k, v, is_causal=causal, return_lse=True, q_descale=qd, k_descale=kd,
                                          v_descale=vd, window_size=window)
            self.assertEqual((out.shape, out.dtype), (q.shape, torch.bfloat16))
            visible = None
            if window[0] >= 0:
                S, Sk = q.shape[2], k.shape[2]
                visible = (torch.arange(Sk)[None, :] >= torch.arange(S)[:, None] + (Sk - S) - window[0])[None, None]
            ref, ref_lse = self.reference(q, k, v, qd, kd, vd, causal, visible)
            assert_fa2(self, out, ref, ref.to(torch.bfloat16), torch.bfloat16, f"fp8 forward causal={causal}")
            self.assertLess((lse.double() - ref_lse).abs().max().item(), 1e-4)
            (row,) = attntune.coverage(reset=True)
            self.assertEqual((row["entry"], row["dtype"], row["kernel"]), ("attention", "fp8", None))
            self.assertIn("tensors on cpu", row["fallback"])
            self.assertIn(",dtype=fp8,", attntune.problem_spec(row))

    def test_transposed_v_storage_gives_the_same_values(self):
        q, k, v, qd, kd, vd = self.inputs(Sk=40)
        vt = torch.empty(v.shape[0], v.shape[1], v.shape[3], 48, dtype=v.dtype)  # rows of 48 bytes, keys contiguous
        vt.view(torch.uint8)[..., :40] = v.view(torch.uint8).transpose(2, 3)
        a = attntune.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd)
        b = attntune.attention(q, k, vt[..., :40].transpose(2, 3), q_descale=qd, k_descale=kd, v_descale=vd)
        # The same values (the fallback's matmuls over other strides may round the last bit otherwise).
        self.assertLessEqual((a.float() - b.float()).abs().max().item(), 1 / 64)
        # layout="bshd" (flash_attn_func's tensors) gives the same too.
        c = attntune.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd",
                               q_descale=qd, k_descale=kd, v_descale=vd)
        self.assertLessEqual((a.float() - c.transpose(1, 2).float()).abs().max().item(), 1 / 64)

    def test_empty_keys_and_rows(self):
        # No keys: zeros and LSE -inf (as attention's); no query rows: an empty bf16 out.
        q, k, v, qd, kd, vd = self.inputs(Sk=0)
        out, lse = attntune.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(out, torch.zeros_like(out)))
        self.assertTrue(torch.isneginf(lse).all())
        q, k, v, qd, kd, vd = self.inputs(S=0)
        self.assertEqual(attntune.attention(q, k, v, q_descale=qd).shape, q.shape)

    def test_out_and_arguments(self):
        q, k, v, qd, kd, vd = self.inputs()
        out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
        r = attntune.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, out=out)
        self.assertIs(r, out)
        self.assertFalse(out.isnan().any())
        with self.assertRaisesRegex(RuntimeError, "attntune.attention: out must be bfloat16 \\(the FP8 forward's"):
            attntune.attention(q, k, v, out=torch.empty(q.shape, dtype=torch.float16))
        bq = rand(*q.shape)
        bad = [((bq, k, v), dict(q_descale=qd), r"q_descale dequantises the FP8 forward's q \(q, k and v "
                                                r"float8_e4m3fn\); q is bfloat16"),
               ((q, k, v), dict(q_descale=qd.double()), r"q_descale must be float32 \(got float64\)"),
               ((q, k, v), dict(q_descale=torch.ones(2, 4)), r"q_descale must be \[batch, heads_kv\] \(\[2, 2\]"),
               ((q, k, v), dict(q_descale=0.5), r"q_descale must be a float32 tensor")]
        for args, kw, pattern in bad:
            with self.assertRaisesRegex(ValueError, "attntune.attention: " + pattern, msg=pattern):
                attntune.attention(*args, **kw)
        # The op says the same (RuntimeError).
        with self.assertRaisesRegex(RuntimeError, r"attntune.attention: q_descale dequantises the FP8 forward's q"):
            torch.ops.attntune.attention(bq, rand(*k.shape), rand(*v.shape), None, False, False, [-1, -1], 0.0, None,
                                         None, None, False, qd)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention: q, k and v must share a dtype"):
            torch.ops.attntune.attention(q, rand(*k.shape), rand(*v.shape))
        # FP8 queries are attention's: the cache entry refuses them, saying where they go.
        kc = fp8(2, 53, 2, 128)
        with self.assertRaisesRegex(ValueError, r"attention_kvcache: .*FP8 queries are not supported here "
                                                r"\(attention takes them: the FP8 forward\)"):
            attntune.attention_kvcache(q.transpose(1, 2), kc, kc)
        # Forward-only: scales that ask for a gradient are refused.
        with self.assertRaisesRegex(RuntimeError, "forward-only"):
            attntune.attention(q, k, v, q_descale=qd.clone().requires_grad_())


class Fp8Caches(unittest.TestCase):
    """FP8 e4m3 KV caches (docs/CONTRACT.md "FP8 KV caches"; FlashAttention-3's call): k and v
    float8_e4m3fn, q and out bf16/fp16, k_descale / v_descale float32 [batch, heads_kv] (or one scale).
    The package holds FP8: flash_decode at d=128 over an FP8 cache (built, never run here)."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()
        torch.manual_seed(8)
        self.kernels = kernels_with_entries()
        self.specs = [vr.spec_of(k["problem"]) for k in self.kernels]
        self.fp8 = self.specs.index(FP8[0])

    def explain(self, entry, sk=8192, d=128, **kw):
        return attntune.explain(entry, "bf16", d, False, 16, 32, 8, 1, sk, **kw)

    # -- the dispatch: attntune_options.kv_dtype

    def test_the_kernel_says_fp8(self):
        k = self.kernels[self.fp8]
        self.assertEqual((k["template"], k["problem"]["kv_dtype"], k["variants"]), ("flash_decode", "fp8", []))
        self.assertEqual(k["entries"], 3)  # flash_decode: the dense and kvcache entries
        for other in self.kernels[:self.fp8] + self.kernels[self.fp8 + 1:]:
            self.assertNotIn("kv_dtype", other["problem"])

    def test_only_fp8_calls_run_the_fp8_kernel(self):
        for entry in ("attention_kvcache", "attention"):
            self.assertEqual(self.explain(entry, kv_dtype="fp8"), (self.fp8, ""), entry)
            self.assertEqual(self.explain(entry, sk=3000, kv_dtype="fp8")[0], self.fp8, entry)
            # A 16-bit call of its shape: no kernel (never the FP8 one), however near its lengths.
            k, why = self.explain(entry)
            self.assertNotEqual(k, self.fp8, entry)
            self.assertEqual(self.explain(entry, kv_dtype="bf16"), (k, why), entry)  # q's dtype: a 16-bit cache
        self.assertEqual(self.explain("attention_kvcache"),
                         (-1, "no kernel of the library serves attention_kvcache with head_dim=128 is_causal=0"))
        # Other dims, variants or lengths far off: the reason names the FP8 cache.
        self.assertEqual(self.explain("attention_kvcache", d=64, kv_dtype="fp8"),
                         (-1, "no kernel of the library serves attention_kvcache with head_dim=64 is_causal=0 over "
                              "an FP8 e4m3 cache (kv_dtype=fp8)"))
        self.assertEqual(self.explain("attention_kvcache", softcap=30.0, kv_dtype="fp8")[0], -1)
        k, why = self.explain("attention_kvcache", sk=8192 * 64, kv_dtype="fp8")
        self.assertEqual(k, -1)
        self.assertIn("max_length_ratio", why)
        with self.assertRaisesRegex(RuntimeError, "kv_dtype 'fp8' is for attention and attention_kvcache"):
            attntune.explain("attention_varlen", "bf16", 128, False, 16, 32, 8, 1, 8192, kv_dtype="fp8")
        with self.assertRaisesRegex(ValueError, r"explain: kv_dtype must be None \(a cache of q's dtype\), 'fp8'"):
            self.explain("attention_kvcache", kv_dtype="fp16")
        with self.assertRaisesRegex(RuntimeError, "explain: kv_dtype must be None"):
            torch.ops.attntune.explain(2, "bf16", 128, False, 16, 32, 8, 1, 8192, [-1, -1], 0.0, False, 0, False,
                                       "e5m2")

    # -- the arguments

    def test_arguments_are_checked(self):
        B, H, Hkv, D = 2, 4, 2, 64
        q, kv = rand(B, 1, H, D), fp8(B, 16, Hkv, D)
        bf = rand(B, 16, Hkv, D)
        good = torch.ones(B, Hkv)
        bad = [((kv, bf), {}, r"k_cache and v_cache must both be float8_e4m3fn \(an FP8 cache\) or neither "
                              r"\(k_cache float8_e4m3fn, v_cache bfloat16\)"),
               ((bf, kv), {}, "k_cache and v_cache must both be float8_e4m3fn"),
               ((kv.to(torch.float8_e5m2), kv.to(torch.float8_e5m2)), {}, "an FP8 cache is float8_e4m3fn"),
               ((kv, kv), dict(q=q.to(torch.float8_e4m3fn)), r"fp16 or bf16 queries \(q is float8_e4m3fn\): FP8 "
                                                             "queries are not supported"),
               ((kv, kv), dict(q=q.float()), r"fp16 or bf16 queries \(q is float32\)"),
               ((bf, bf), dict(k_descale=good), r"k_descale dequantises an FP8 \(float8_e4m3fn\) cache; this cache "
                                                "is bfloat16"),
               ((bf, bf), dict(v_descale=good), "v_descale dequantises an FP8"),
               ((kv, kv), dict(k_descale=good.double()), "k_descale must be float32 \\(got float64\\)"),
               ((kv, kv), dict(v_descale=torch.ones(B, H)), r"v_descale must be \[batch, heads_kv\] \(\[2, 2\]: a "
                                                           r"scale per sequence and KV head\), \[1\] or 0-d \(one "
                                                           r"scale; got \[2, 4\]\)"),
               ((kv, kv), dict(k_descale=torch.ones(B * Hkv)), r"k_descale must be \[batch, heads_kv\]"),
               ((kv, kv), dict(k_descale=torch.ones(B, Hkv, device="meta")), "k_descale must be on q's device"),
               ((kv, kv), dict(k_descale=0.5), r"k_descale must be a float32 tensor .* or None \(got float; for one "
                                               r"scale pass torch.tensor\(x\)\)")]
        for (kc, vc), kw, pattern in bad:
            kw = dict(kw)
            qq = kw.pop("q", q)
            with self.assertRaisesRegex(ValueError, "attntune.attention_kvcache: .*" + pattern, msg=pattern):
                attntune.attention_kvcache(qq, kc, vc, **kw)
            ks = kw.get("k_descale", good)
            if not isinstance(ks, torch.Tensor) or ks.device.type == "meta":  # a meta tensor runs the fake
                continue
            # The ops say the same (RuntimeError), before any dispatch.
            with self.assertRaisesRegex(RuntimeError, "attntune.attention_kvcache: .*" + pattern, msg=pattern):
                torch.ops.attntune.attention_kvcache(qq, kc, vc, None, None, None, False, False, [-1, -1], 0.0, None,
                                                     kw.get("k_descale"), kw.get("v_descale"))
        # The dense entry checks the same (its caches [B, Hkv, Sk, D]); varlen takes no FP8 cache.
        qd, kd = rand(B, H, 3, D), fp8(B, Hkv, 16, D)
        with self.assertRaisesRegex(ValueError, r"attntune.attention: k_descale must be \[batch, heads_kv\] "
                                                r"\(\[2, 2\]"):
            attntune.attention(qd, kd, kd, k_descale=torch.ones(Hkv, B + 1))
        with self.assertRaisesRegex(ValueError, "attention: k and v must both be float8_e4m3fn"):
            attntune.attention(qd, kd, rand(B, Hkv, 16, D))
        with self.assertRaisesRegex(RuntimeError, "attntune.attention: k and v must both be float8_e4m3fn"):
            torch.ops.attntune.attention(qd, rand(B, Hkv, 16, D), kd)
        cu = torch.tensor([0, 8], dtype=torch.int32)
        xk = fp8(8, Hkv, D)
        with self.assertRaisesRegex(ValueError, "attention_varlen: FP8 caches are read by attention and "
                                                "attention_kvcache only"):
            attntune.attention_varlen(rand(8, H, D), xk, xk, cu, cu, 8, 8)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_varlen: FP8 caches are read by"):
            torch.ops.attntune.attention_varlen(rand(8, H, D), xk, xk, cu, cu, 8, 8)
        # Accepted: [B, Hkv], [1], 0-d and None, in any combination.
        for ks, vs in ((good, good), (torch.ones(1), None), (None, torch.tensor(2.0)), (None, None)):
            out = attntune.attention_kvcache(q, kv, kv, k_descale=ks, v_descale=vs)
            self.assertEqual((out.shape, out.dtype), (q.shape, q.dtype))

    # -- the fallback: the dequantised cache through the fp32 path (CPU tensors fall back)

    def check_kvcache(self, B, H, Hkv, D, S, page, lens, causal, scales, variants, dtype=torch.bfloat16):
        Sk = max(lens) + 5
        q = rand(B, S, H, D, dtype=dtype)
        k, v = fp8(B, Hkv, Sk, D), fp8(B, Hkv, Sk, D)
        if scales == "per_head":
            kd, vd = torch.rand(B, Hkv) * 2 + 0.05, torch.rand(B, Hkv) * 0.5 + 0.01
        elif scales == "one":
            kd, vd = torch.tensor([1.7]), torch.tensor(0.3)
        else:
            kd = vd = None
        kc, vc, table = vr.paged_cache(k, v, lens, page, S)  # NaN bytes past each length
        seqlens = torch.tensor(lens, dtype=torch.int32)
        out = torch.full((B, S, H, D), float("nan"), dtype=dtype)
        _, lse = attntune.attention_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, is_causal=causal,
                                            return_lse=True, out=out, k_descale=kd, v_descale=vd, **variants)
        (row,) = attntune.coverage(reset=True)
        self.assertEqual(row["problem"]["kv_dtype"], "fp8")
        # The reference: float64 over the dequantised cache (k.float() * k_descale[b, h]).
        kq = vr.dequantised(k.transpose(1, 2), kd).transpose(1, 2)
        vq = vr.dequantised(v.transpose(1, 2), vd).transpose(1, 2)
        args = dict(causal=causal, window=variants.get("window_size", (-1, -1)),
                    softcap=variants.get("softcap", 0.0), sinks=variants.get("sinks"), len_k=lens)
        qh = q.transpose(1, 2)
        ref64, lse64 = vr.attention(qh, kq, vq, 1 / math.sqrt(D), **args)
        lowp, _ = vr.attention(qh, kq, vq, 1 / math.sqrt(D), dtype=dtype, **args)
        ok, msg = vr.compare(out.transpose(1, 2), lse, ref64, lse64, lowp, dtype)
        self.assertTrue(ok, f"fp8 kvcache page={page} S={S} causal={causal} scales={scales} {variants}: {msg}")
        return out, lse

    def test_fallback_values(self):
        H = 8
        for B, Hkv, D, S, page, lens, causal, scales, variants in (
                (3, 2, 64, 1, 16, [0, 33, 64], False, "per_head", {}),
                (3, 2, 64, 2, 16, [1, 40, 17], True, "per_head", {}),
                (2, 8, 128, 1, 0, [50, 7], False, "one", {}),
                (4, 1, 64, 3, 64, [70, 1, 0, 64], True, None, {}),
                (3, 4, 64, 2, 16, [30, 64, 9], True, "per_head", dict(window_size=(10, 0), softcap=30.0)),
                (2, 2, 64, 1, 0, [20, 41], False, "per_head", dict(sinks=sink_logits(H, 4)))):
            self.check_kvcache(B, H, Hkv, D, S, page, lens, causal, scales, variants)
        self.check_kvcache(2, 4, 2, 64, 1, 16, [9, 30], False, "per_head", {}, dtype=torch.float16)

    def test_the_scales_are_applied(self):
        # The same cache bytes with the scales doubled: K's double every score's logit, V's the output.
        B, H, Hkv, D = 2, 4, 2, 64
        q, k, v = rand(B, 1, H, D), fp8(B, 20, Hkv, D), fp8(B, 20, Hkv, D)
        ones = torch.ones(B, Hkv)
        base = attntune.attention_kvcache(q, k, v, k_descale=ones, v_descale=ones).double()
        self.assertTrue(torch.equal(attntune.attention_kvcache(q, k, v).double(), base))
        out = attntune.attention_kvcache(q, k, v, k_descale=ones, v_descale=ones * 2).double()
        self.assertLess((out - 2 * base).abs().max().item(), 2 ** -6 * base.abs().max().item())
        sharp = attntune.attention_kvcache(q, k, v, k_descale=ones * 2, v_descale=ones).double()
        want = attntune.attention_kvcache(q, k, v, scale=2 / math.sqrt(D)).double()
        self.assertLess((sharp - want).abs().max().item(), 1e-2)
        # Per (sequence, KV head): only sequence 1's KV head 0 (query heads 0 and 1) changes.
        per = ones.clone()
        per[1, 0] = 3.0
        got = attntune.attention_kvcache(q, k, v, v_descale=per).double()
        self.assertTrue(torch.equal(got[0], base[0]))
        self.assertTrue(torch.equal(got[1, :, 2:], base[1, :, 2:]))
        self.assertLess((got[1, :, :2] - 3 * base[1, :, :2]).abs().max().item(), 2 ** -5 * base.abs().max().item())

    def test_vllm_names_are_the_same_arguments(self):
        # k_scale / v_scale (vLLM's names) are k_descale / v_descale: the same output bit for bit;
        # both names for one tensor are refused.
        B, H, Hkv, D = 2, 4, 2, 64
        q, k, v = rand(B, 1, H, D), fp8(B, 20, Hkv, D), fp8(B, 20, Hkv, D)
        kd, vd = torch.rand(B, Hkv) + 0.5, torch.rand(B, Hkv) + 0.5
        want = attntune.attention_kvcache(q, k, v, k_descale=kd, v_descale=vd)
        self.assertTrue(torch.equal(attntune.attention_kvcache(q, k, v, k_scale=kd, v_scale=vd), want))
        self.assertTrue(torch.equal(attntune.attention_kvcache(q, k, v, k_scale=kd, v_descale=vd), want))
        qd, kk, vv = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        self.assertTrue(torch.equal(attntune.attention(qd, kk, vv, k_scale=kd, v_scale=vd),
                                    attntune.attention(qd, kk, vv, k_descale=kd, v_descale=vd)))
        with self.assertRaisesRegex(ValueError, "pass k_descale or k_scale"):
            attntune.attention_kvcache(q, k, v, k_descale=kd, k_scale=kd)
        with self.assertRaisesRegex(ValueError, "pass v_descale or v_scale"):
            attntune.attention(qd, kk, vv, v_descale=vd, v_scale=vd)

    def test_dense_entry(self):
        B, H, Hkv, S, Sk, D = 2, 8, 2, 3, 45, 64
        kd, vd = torch.rand(B, Hkv) + 0.5, torch.rand(B, Hkv) + 0.5
        for layout, causal, variants in (("bhsd", False, {}), ("bshd", True, {}), ("bhsd", True, dict(softcap=30.0))):
            q, k, v = rand(B, H, S, D), fp8(B, Hkv, Sk, D), fp8(B, Hkv, Sk, D)
            qq, kk, vv = (q, k, v) if layout == "bhsd" else (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            out, lse = attntune.attention(qq, kk, vv, is_causal=causal, layout=layout, return_lse=True, k_descale=kd,
                                          v_descale=vd, **variants)
            oh = out if layout == "bhsd" else out.transpose(1, 2)
            kq = vr.dequantised(k.transpose(1, 2), kd).transpose(1, 2)
            vq = vr.dequantised(v.transpose(1, 2), vd).transpose(1, 2)
            args = dict(causal=causal, softcap=variants.get("softcap", 0.0))
            ref64, lse64 = vr.attention(q, kq, vq, 1 / math.sqrt(D), **args)
            lowp, _ = vr.attention(q, kq, vq, 1 / math.sqrt(D), dtype=torch.bfloat16, **args)
            ok, msg = vr.compare(oh, lse, ref64, lse64, lowp, torch.bfloat16)
            self.assertTrue(ok, f"fp8 dense {layout} causal={causal} {variants}: {msg}")

    # -- coverage, specs, plans, tuner.json and the raise policy

    def test_coverage_plans_and_raises_fp8_problems(self):
        q, kv = rand(4, 1, 32, 128), fp8(70, 16, 8, 128)
        table = torch.arange(64, dtype=torch.int32).view(4, 16)
        lens = torch.tensor([200, 1, 100, 256], dtype=torch.int32)
        ds = torch.ones(4, 8)
        for _ in range(2):
            attntune.attention_kvcache(q, kv, kv, cache_seqlens=lens, block_table=table, k_descale=ds, v_descale=ds)
        attntune.attention_kvcache(q, kv.float().bfloat16(), kv.float().bfloat16(), cache_seqlens=lens,
                                   block_table=table)  # the same shape over a bf16 cache: another problem
        rows = {attntune.problem_spec(r): r for r in attntune.coverage()}
        spec = "b=4,h=32,hkv=8,s=1,sk=256,d=128,dtype=bf16,causal=0,page=16,kv_dtype=fp8"
        self.assertEqual(sorted(rows), sorted([spec, spec.replace(",kv_dtype=fp8", "")]))
        row = rows[spec]
        self.assertEqual((row["calls"], row["problem"]["kv_dtype"], row["dtype"]), (2, "fp8", "bf16"))
        self.assertNotIn("kv_dtype", rows[spec.replace(",kv_dtype=fp8", "")]["problem"])
        self.assertIn(spec + "       2  fp32 fallback: tensors on cpu", attntune.coverage_table())
        # A GPU's row (tunable): flash_decode tunes FP8 decode, flash_fwd_wgmma FP8 chunked prefill
        # (flash_fwd_mma does not).
        support = json.load(open(os.path.join(PKG, "attntune", "tuner.json")))
        fams = {f["family"]: f["support"] for f in support["families"]}
        self.assertEqual(fams["flash_decode"]["kv_fp8"], ["0", "1"])
        self.assertEqual(fams["flash_fwd_wgmma"]["kv_fp8"], ["0", "1"])
        self.assertNotIn("1", fams["flash_fwd_mma"].get("kv_fp8", []))
        row = dict(row, tunable=True, fallback="no kernel")
        self.assertEqual(attntune.untunable(row, support), "")
        chunk = dict(row, problem=dict(row["problem"], s=512, sk=4096))
        self.assertEqual(attntune.untunable(chunk, support), "")
        without_wgmma = dict(support, families=[f for f in support["families"] if f["family"] != "flash_fwd_wgmma"])
        self.assertIn("flash_fwd_mma tunes no FP8 KV cache", attntune.untunable(chunk, without_wgmma))
        old = {"families": [{"family": "flash_decode", "regimes": ["decode"],
                             "support": {"d": ["128"], "dtype": ["bf16"]}}]}
        self.assertEqual(attntune.untunable(row, old),
                         "no attntune family tunes this decode problem (flash_decode tunes no FP8 KV cache)")
        plan = attntune.plan_from_coverage([row], "fp8-serving")
        self.assertEqual(plan["problems"], [{"problem": spec, "regime": "decode"}])
        db = os.path.join(WORK, "fp8-queue.db")
        r = run("submit", "--db", db, "--problem", spec, "--format", "json")
        queued = json.loads(r.stdout)[0]
        self.assertEqual(queued["problem"]["kv_dtype"], "fp8", r.stdout)
        self.assertTrue(queued["campaign"].endswith(":" + spec), r.stdout)
        self.assertIn("flash_decode", queued["campaign"].split(":")[0])
        # The raise policy names the FP8 problem.
        attntune.set_policy("raise", 16.0)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_kvcache: no tuned kernel for b=4,h=32,hkv=8,"
                                                  "s=1,sk=256,d=128,causal=0,kv_dtype=fp8: tensors on cpu"):
            attntune.attention_kvcache(q, kv, kv, cache_seqlens=lens, block_table=table)

    # -- the fakes

    def test_opcheck_and_fullgraph(self):
        ops = torch.ops.attntune
        qd, kc = rand(2, 3, 4, 64), fp8(6, 16, 2, 64)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        ds = torch.rand(2, 2) + 0.5
        # opcheck's test_schema perturbs every input arithmetically, which torch has no FP8 kernels for on
        # the CPU: the fake and AOT-dispatch checks, against the real op.
        tests = ("test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(ops.attention_kvcache.default, (qd, kc, kc, lens, table, None, True, True, [-1, -1],
                                                              0.0, None, ds, torch.tensor(0.5)), test_utils=tests)
        q, k = rand(2, 4, 3, 64), fp8(2, 2, 11, 64)
        torch.library.opcheck(ops.attention.default, (q, k, k, None, True, True, [-1, -1], 0.0, None, ds, ds),
                              test_utils=tests)
        torch.library.opcheck(ops.attention_into.default, (q, k, k, torch.empty_like(q), None, None, False,
                                                           [-1, -1], 0.0, None, None, ds), test_utils=tests)
        torch._dynamo.reset()

        def f(q, kc, table, lens, ds):
            out, lse = attntune.attention_kvcache(q, kc, kc, cache_seqlens=lens, block_table=table, is_causal=True,
                                                  return_lse=True, k_descale=ds, v_descale=ds)
            return out * 2, lse

        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(qd, kc, table, lens, ds), f(qd, kc, table, lens, ds)):
            self.assertEqual(got.shape, want.shape)
            self.assertTrue(torch.equal(got, want))


class Compile(unittest.TestCase):
    """The fake implementations: their shapes, opcheck against the real ones, torch.compile."""

    def test_opcheck(self):
        ops = torch.ops.attntune
        q, k = rand(2, 4, 9, 64), rand(2, 2, 11, 64)
        sinks = torch.tensor([0.5, -3.0, 2.0, 1e3])
        torch.library.opcheck(ops.attention.default, (q, k, k, None, True, True))
        torch.library.opcheck(ops.attention.default, (q, k, k, None, True, True, [4, 0], 30.0, sinks))
        torch.library.opcheck(ops.attention.default, (q, k, k, None, False, False, [3, 2], 0.0, None))
        torch.library.opcheck(ops.attention_into.default, (q, k, k, torch.empty_like(q), None, None, True))
        torch.library.opcheck(ops.attention_into.default, (q, k, k, torch.empty_like(q), torch.empty(2, 4, 9), None,
                                                           True, [4, -1], 50.0, sinks))
        qd, kc = rand(2, 3, 4, 64), rand(6, 16, 2, 64)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        torch.library.opcheck(ops.attention_kvcache.default, (qd, kc, kc, lens, table, None, True, True))
        torch.library.opcheck(ops.attention_kvcache.default, (qd, kc, kc, lens, table, None, True, True, [5, 0],
                                                              30.0, sinks))
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        xq, xk = rand(10, 4, 64), rand(10, 2, 64)
        torch.library.opcheck(ops.attention_varlen.default, (xq, xk, xk, cu, cu, 7, 7, None, True, True))
        torch.library.opcheck(ops.attention_varlen.default, (xq, xk, xk, cu, cu, 7, 7, None, False, True, [2, 1],
                                                             50.0, sinks))

    def test_fake_shapes(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        ops = torch.ops.attntune
        with FakeTensorMode():
            sinks = torch.empty(4)
            q, k = torch.empty(2, 4, 9, 64, dtype=torch.bfloat16), torch.empty(2, 2, 11, 64, dtype=torch.bfloat16)
            out, lse = ops.attention(q, k, k, None, True, True, [4, 0], 30.0, sinks)
            self.assertEqual((out.shape, out.dtype, lse.shape, lse.dtype),
                             (q.shape, q.dtype, torch.Size([2, 4, 9]), torch.float32))
            out, lse = ops.attention(q, k, k, None, True, False, [4, 0], 30.0, sinks)
            self.assertEqual(lse.shape, torch.Size([0]))
            qd = torch.empty(2, 3, 4, 64, dtype=torch.bfloat16)
            kc = torch.empty(6, 16, 2, 64, dtype=torch.bfloat16)
            out, lse = ops.attention_kvcache(qd, kc, kc, None, torch.empty(2, 2, dtype=torch.int32), None, False,
                                             True, [-1, 8], 0.0, sinks)
            self.assertEqual((out.shape, lse.shape), (qd.shape, torch.Size([2, 4, 3])))
            xq, xk = torch.empty(10, 4, 64, dtype=torch.bfloat16), torch.empty(12, 2, 64, dtype=torch.bfloat16)
            cu = torch.empty(3, dtype=torch.int32)
            out, lse = ops.attention_varlen(xq, xk, xk, cu, cu, 7, 7, None, False, True, [2, 1], 50.0, sinks)
            self.assertEqual((out.shape, lse.shape), (xq.shape, torch.Size([4, 10])))
            # The fakes check the variants as the ops do: a bad call fails at trace time.
            with self.assertRaisesRegex(ValueError, "sinks must be"):
                ops.attention(q, k, k, None, True, True, [4, 0], 30.0, torch.empty(3))
            with self.assertRaisesRegex(ValueError, "is_causal with window_size"):
                ops.attention_varlen(xq, xk, xk, cu, cu, 7, 7, None, True, True, [2, 1], 0.0, None)

    def test_fullgraph(self):
        torch._dynamo.reset()

        def f(q, k, v, kc, table, lens, xq, xk, cu, sinks):
            a = attntune.attention(q, k, v, is_causal=True)
            b = attntune.attention_kvcache(q.transpose(1, 2)[:, :1], kc, kc, cache_seqlens=lens, block_table=table)
            c = attntune.attention_varlen(xq, xk, xk, cu, cu, 7, 7, is_causal=True)
            return a * 2, b + 1, c

        def g(q, k, v, kc, table, lens, xq, xk, cu, sinks):
            a, la = attntune.attention(q, k, v, is_causal=True, window_size=(3, 0), softcap=30.0, sinks=sinks,
                                       return_lse=True)
            b = attntune.attention_kvcache(q.transpose(1, 2)[:, :2], kc, kc, cache_seqlens=lens, block_table=table,
                                           window_size=(4, 1), sinks=sinks)
            c = attntune.attention_varlen(xq, xk, xk, cu, cu, 7, 7, window_size=(2, 0), softcap=50.0)
            return a * 2, la - 1, b + 1, c

        q, k = rand(2, 4, 9, 64), rand(2, 2, 9, 64)
        kc = rand(6, 16, 2, 64)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        xq, xk, cu = rand(10, 4, 64), rand(10, 2, 64), torch.tensor([0, 3, 10], dtype=torch.int32)
        sinks = torch.tensor([0.5, -3.0, 2.0, 1e3])
        args = (q, k, k, kc, table, lens, xq, xk, cu, sinks)
        for fn in (f, g):
            compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
            for got, want in zip(compiled(*args), fn(*args)):
                self.assertTrue(torch.equal(got, want), fn.__name__)


def assert_grads(tc, ours, ref64, lowp, dtype, what):
    """The backward tests' check of gradients (dq, dk, dv, dsinks) against float64: shapes, no NaN, and
    FlashAttention-2's criterion from the same-dtype gradients `lowp` (None: float64 inputs, within
    1e-10); the sinks' float32 gradient within 1e-4."""
    names = ("dq", "dk", "dv", "dsinks")
    for i, (a, r) in enumerate(zip(ours, ref64)):
        tc.assertEqual(a.shape, r.shape, f"{what} {names[i]}")
        tc.assertFalse(torch.isnan(a).any().item(), f"{what} {names[i]}: NaN")
        err = (a.double() - r).abs().max().item() if a.numel() else 0.0
        if names[i] == "dsinks":  # float32 logits, float32 gradients
            bound = 1e-4 * max(1.0, r.abs().max().item())
        elif lowp is None:
            bound = 1e-10 * max(1.0, r.abs().max().item())
        else:
            bound = vr.fa2_bound(lowp[i], r, dtype)
        tc.assertLessEqual(err, bound, f"{what} {names[i]}: max error {err:.3g} over the bound {bound:.3g}")


def assert_backward_support(tc, row, support):
    """What untunable says of a backward coverage row (a d=64 call) by head dim: tunable; d=96 too (the
    backward families compute it padded to 128, D_PAD); 72 not (head dims step by 16 in the backward);
    and nothing without a backward family. Returns the d=96 row."""
    tc.assertEqual(attntune.untunable(row, support), "")
    row96 = json.loads(json.dumps(row))
    row96["problem"]["d"] = 96
    tc.assertEqual(attntune.untunable(row96, support), "")
    row72 = json.loads(json.dumps(row))
    row72["problem"]["d"] = 72
    tc.assertIn("no attntune family tunes head_dim=72 bf16", attntune.untunable(row72, support))
    no_bwd = {"families": [f for f in support["families"] if "bwd" not in f["support"].get("pass", [])]}
    tc.assertEqual(attntune.untunable(row, no_bwd), "no attntune family tunes the backward pass (pass=bwd)")
    return row96


class Backward(unittest.TestCase):
    """attention's backward pass (issue 45; docs/design/torch.md "The backward pass"): autograd through
    attntune.attention, the op attention_backward (the package's flash_bwd_mma kernels for BWD, built
    and never run here; CPU tensors fall back to the explicit gradients), against float64 autograd of
    variant_reference.attention; the forward-only ops' errors; coverage, plans and the raise policy with
    pass=bwd; the fake, opcheck and torch.compile of a training step."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()
        torch.manual_seed(0)
        self.kernels = kernels_with_entries()

    # -- dispatch

    def test_backward_kernels_serve_the_backward_alone(self):
        bwd = {vr.spec_of(k["problem"]): i for i, k in enumerate(self.kernels) if k["problem"].get("pass") == "bwd"}
        self.assertEqual(sorted(bwd), sorted(BWD))
        for i, k in enumerate(self.kernels):
            p = k["problem"]
            # A backward kernel serves its own entry alone: a packed batch's (16) or dense tensors' (8).
            want = (16 if p.get("varlen") else 8) if p.get("pass") == "bwd" else k["entries"] & 7
            self.assertEqual(k["entries"], want, vr.spec_of(p))
            self.assertEqual(k["problem"].get("pass") == "bwd", k["template"] == "flash_bwd_mma", vr.spec_of(p))
        for spec, i in bwd.items():
            p = self.kernels[i]["problem"]
            args = (p["dtype"], p["d"], p["causal"], p["b"], p["h"], p["hkv"], p["s"], p["sk"])
            window = tuple(p.get("window", (-1, -1)))
            entry, other = (("attention_backward_varlen", "attention_backward") if p.get("varlen") else
                            ("attention_backward", "attention_backward_varlen"))
            self.assertEqual(attntune.explain(entry, *args, window_size=window), (i, ""), spec)
            # Odd lengths near it (no regime rule for the backward: s=1 too, within the ratio).
            self.assertEqual(attntune.explain(entry, p["dtype"], p["d"], p["causal"], 3, p["h"],
                                              p["hkv"], p["s"] // 3 + 1, p["sk"] // 2 - 7, window_size=window)[0], i)
            # The forward never runs it, nor the other backward entry (dense / packed).
            self.assertNotEqual(attntune.explain("attention", *args, window_size=window)[0], i, spec)
            self.assertNotEqual(attntune.explain("attention_varlen", *args, window_size=window)[0], i, spec)
            self.assertNotEqual(attntune.explain(other, *args, window_size=window)[0], i, spec)
        # Nothing else has a backward kernel: another head dim, a soft-cap, sinks, another window kind.
        base = ("bf16", 128, True, 2, 32, 8, 4096, 4096)
        self.assertEqual(attntune.explain("attention_backward", *base)[0], bwd[BWD[0]])
        for variants, words in ((dict(softcap=30.0), "a logit soft-cap 30"), (dict(sinks=True), "attention sinks"),
                                (dict(window_size=(128, 0)), "a sliding window (128, -1)")):
            k, why = attntune.explain("attention_backward", *base, **variants)
            self.assertEqual((k, why), (-1, "no kernel of the library serves attention_backward with head_dim=128 "
                                            "is_causal=1 with " + words))
        k, why = attntune.explain("attention_backward", "bf16", 96, True, 2, 32, 8, 4096, 4096)
        self.assertEqual(k, -1)
        self.assertIn("attention_backward with head_dim=96", why)
        with self.assertRaisesRegex(RuntimeError, "forward-only"):
            attntune.explain("attention_backward", "bf16", 576, False, 1, 16, 1, 1, 1000, head_dim_v=512, latent=True)

    # -- the gradients (CPU: the fallback) against float64

    def grads(self, q, k, v, causal=False, window=(-1, -1), softcap=0.0, sinks=None, layout="bhsd", lse_weight=None):
        """attntune.attention's gradients of sum(out * g) (+ sum(lse * lse_weight)) for q, k, v (and
        sinks): (ours, ref64, lowp) lists, lowp the same math in q's dtype (variant_reference's
        low-precision path; None in float64)."""
        dtype = q.dtype
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        sk = sinks.detach().clone().requires_grad_() if sinks is not None else None
        ins = leaves + ([sk] if sk is not None else [])
        res = attntune.attention(*leaves, is_causal=causal, window_size=window, softcap=softcap, sinks=sk,
                                 layout=layout, return_lse=lse_weight is not None)
        out, lse = res if lse_weight is not None else (res, None)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
        loss = (out.float() * g.float()).sum() + ((lse * lse_weight).sum() if lse is not None else 0)
        ours = torch.autograd.grad(loss, ins)

        def ref(dt):
            xs = [t.detach().to(torch.float64 if dt == torch.float64 else dtype).requires_grad_() for t in (q, k, v)]
            s64 = sinks.detach().double().requires_grad_() if sinks is not None else None
            xh = xs if layout == "bhsd" else [t.transpose(1, 2) for t in xs]
            o, lse = vr.attention(*xh, 1 / math.sqrt(q.shape[-1]), causal=causal, window=window, softcap=softcap,
                                  sinks=s64, dtype=dt)
            if layout != "bhsd":
                o = o.transpose(1, 2)
            gg = g.double() if dt == torch.float64 else g
            lw = (lse * lse_weight.double()).sum() if lse_weight is not None else 0
            return torch.autograd.grad((o * gg).sum() + lw, xs + ([s64] if s64 is not None else []))
        return list(ours), list(ref(torch.float64)), (None if dtype == torch.float64 else list(ref(dtype)))

    def check(self, q, k, v, what, **args):
        ours, ref64, lowp = self.grads(q, k, v, **args)
        assert_grads(self, ours, ref64, lowp, q.dtype, what)

    def test_dense_against_float64(self):
        for dtype in (torch.bfloat16, torch.float16, torch.float64):
            for B, H, Hkv, S, Sk, D, causal in ((2, 4, 4, 33, 33, 64, False), (1, 8, 2, 37, 101, 128, True),
                                                (1, 4, 1, 100, 40, 64, True),   # 60 rows see no key
                                                (2, 4, 2, 61, 17, 64, False), (1, 2, 2, 1, 77, 64, True)):
                q, k, v = rand(B, H, S, D, dtype=dtype), rand(B, Hkv, Sk, D, dtype=dtype), rand(B, Hkv, Sk, D,
                                                                                              dtype=dtype)
                self.check(q, k, v, f"{dtype} B={B} H={H}/{Hkv} S={S} Sk={Sk} D={D} causal={causal}", causal=causal)
        q, k = rand(2, 33, 4, 64), rand(2, 77, 2, 64)
        self.check(q, k, rand(2, 77, 2, 64), "bshd", causal=True, layout="bshd")

    def test_variants_against_float64(self):
        q, k, v = rand(2, 4, 37, 64), rand(2, 2, 101, 64), rand(2, 2, 101, 64)
        for window in ((0, 0), (1, -1), (16, 8), (-1, 3), (127, 0)):
            self.check(q, k, v, f"window {window}", window=window)
        self.check(q, k, v, "causal window", causal=True, window=(10, -1))
        self.check(q * 8, k * 8, v, "softcap 30 (scores past it)", softcap=30.0)
        sinks = sink_logits(4, seed=3)
        self.check(q, k, v, "sinks", causal=True, sinks=sinks)
        self.check(q, k, v, "everything", causal=True, window=(20, -1), softcap=50.0, sinks=torch.tensor(
            [0.5, -3.0, 2.0, 1.0]))
        # Rows that see no key but a sink: their weight is the sink's alone.
        self.check(rand(1, 4, 50, 64), rand(1, 2, 20, 64), rand(1, 2, 20, 64), "sinks, rows without keys",
                   causal=True, sinks=torch.tensor([0.5, -3.0, 2.0, 1.0]))
        self.check(rand(1, 4, 5, 64), rand(1, 2, 0, 64), rand(1, 2, 0, 64), "no keys", sinks=torch.tensor(
            [0.5, -3.0, 2.0, 1.0]), lse_weight=torch.ones(1, 4, 5))

    def test_the_lse_has_a_gradient(self):
        q, k, v = rand(1, 4, 37, 64), rand(1, 2, 53, 64), rand(1, 2, 53, 64)
        w = torch.randn(1, 4, 37)
        self.check(q, k, v, "lse", causal=True, lse_weight=w)
        self.check(q.double(), k.double(), v.double(), "lse float64", causal=True, window=(5, -1), lse_weight=w)
        rows = {r["entry"]: r for r in attntune.coverage()}
        self.assertIn("the forward's LSE has a gradient (return_lse=True and the LSE used): the kernels take dout "
                      "alone", rows["attention_backward"]["fallback"])
        self.assertFalse(rows["attention_backward"]["tunable"])

    def test_gradcheck(self):
        def gen(*shape):
            return torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        q, k, v = gen(1, 4, 5, 16), gen(1, 2, 7, 16), gen(1, 2, 7, 16)
        sinks = torch.tensor([0.5, -3.0, 2.0, 1.0])
        for args in (dict(is_causal=True), dict(is_causal=False), dict(window_size=(2, 1), softcap=3.0),
                     dict(is_causal=True, window_size=(1, 0), sinks=sinks)):
            self.assertTrue(torch.autograd.gradcheck(lambda q, k, v: attntune.attention(q, k, v, **args), (q, k, v)),
                            str(args))

    def test_sum_backward_and_partial_grads(self):
        # attention(q, k, v).sum().backward(): dout is an expanded tensor of stride 0.
        q, k, v = (rand(1, 2, 8, 64).requires_grad_() for _ in range(3))
        attntune.attention(q, k, v, is_causal=True).sum().backward()
        for t in (q, k, v):
            self.assertEqual(t.grad.shape, t.shape)
            self.assertTrue(torch.isfinite(t.grad.float()).all().item())
        # Only k requires grad; sinks as parameters get theirs.
        k = rand(1, 2, 8, 64).requires_grad_()
        sinks = torch.zeros(2, requires_grad=True)
        attntune.attention(q.detach(), k, v.detach(), sinks=sinks).square().sum().backward()
        self.assertIsNotNone(k.grad)
        self.assertIsNotNone(sinks.grad)
        self.assertEqual(sinks.grad.dtype, torch.float32)
        # The op itself, without return_lse (no LSE kept): its backward falls back, saying so.
        out, _ = torch.ops.attntune.attention(q, k, v, None, False, False)
        out.sum().backward()
        rows = [r for r in attntune.coverage() if r["entry"] == "attention_backward"]
        self.assertTrue(rows)
        with torch.no_grad():  # no autograd, no backward
            attntune.attention(q, k, v)

    def test_forward_only_ops_say_so(self):
        x = rand(1, 2, 8, 64).requires_grad_()
        xt = x.transpose(1, 2)
        with self.assertRaisesRegex(RuntimeError, "attention_kvcache has no backward pass: it is forward-only"):
            attntune.attention_kvcache(xt, xt, xt)
        cu = torch.tensor([0, 8], dtype=torch.int32)
        with self.assertRaisesRegex(RuntimeError, "attention_varlen: out= writes into a tensor and is not "
                                                  "differentiable"):
            attntune.attention_varlen(x[0].transpose(0, 1), x[0].transpose(0, 1), x[0].transpose(0, 1), cu, cu, 8, 8,
                                      out=torch.empty(8, 2, 64, dtype=torch.bfloat16))
        with self.assertRaisesRegex(RuntimeError, "out= writes into a tensor and is not differentiable"):
            attntune.attention(x, x, x, out=torch.empty(1, 2, 8, 64, dtype=torch.bfloat16))
        kc = torch.zeros(1, 2, 8, 64).to(torch.float8_e4m3fn)
        with self.assertRaisesRegex(RuntimeError, "FP8 .* cache is forward-only"):
            attntune.attention(x, kc, kc)
        # Through the ops directly: the gradient raises, naming the op.
        o, _ = torch.ops.attntune.attention_kvcache(xt, xt, xt, None, None, None, False, False)
        with self.assertRaisesRegex(RuntimeError, "attention_kvcache has no backward pass"):
            o.sum().backward()
        o, _ = torch.ops.attntune.attention(x, kc, kc, None, False, True)
        with self.assertRaisesRegex(RuntimeError, "FP8 .* forward-only"):
            o.float().sum().backward()
        # No double backward.
        q = rand(1, 2, 8, 64, dtype=torch.float64).requires_grad_()
        (g,) = torch.autograd.grad(attntune.attention(q, q, q).sum(), q, create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "no double backward"):
            g.sum().backward()

    # -- coverage, plans, the raise policy

    def test_coverage_plans_and_raises_backward_problems(self):
        q, k, v = (rand(1, 2, 8, 64).requires_grad_() for _ in range(3))
        attntune.attention(q, k, v, is_causal=True, window_size=(4, 0)).sum().backward()
        rows = {r["entry"]: r for r in attntune.coverage()}
        self.assertEqual(sorted(rows), ["attention", "attention_backward"])
        spec = "b=1,h=2,hkv=2,s=8,sk=8,d=64,dtype=bf16,causal=1,window=4"
        self.assertEqual(attntune.problem_spec(rows["attention"]), spec)
        self.assertEqual(attntune.problem_spec(rows["attention_backward"]), spec + ",pass=bwd")
        self.assertIn("fp32 fallback: tensors on cpu", attntune.coverage_table())
        row = dict(rows["attention_backward"], tunable=True)
        plan = attntune.plan_from_coverage([row], "train")
        self.assertEqual(plan["problems"], [{"problem": spec + ",pass=bwd", "regime": "train"}])
        # attntune reads the spec back as a backward problem (the shipped backward spaces tune it).
        db = os.path.join(WORK, "bwd-queue.db")
        r = run("submit", "--db", db, "--problem", plan["problems"][0]["problem"], "--format", "json")
        self.assertTrue(json.loads(r.stdout)[0]["campaign"].endswith(":" + spec + ",pass=bwd"), r.stdout)
        # tuner.json: flash_bwd_mma (and flash_bwd_wgmma) tune the backward pass alone; untunable reads it.
        with open(os.path.join(PKG, "attntune", "tuner.json")) as fh:
            support = json.load(fh)
        fams = {f["family"]: f for f in support["families"]}
        self.assertEqual(fams["flash_bwd_mma"]["support"]["pass"], ["bwd"])
        self.assertEqual(fams["flash_bwd_mma"]["regimes"], ["train"])
        row96 = assert_backward_support(self, row, support)
        self.assertEqual(attntune.untunable(dict(row96, entry="attention"), support), "")
        # The raise policy: the backward's own message.
        o = attntune.attention(q, k, v, is_causal=True)
        attntune.set_policy("raise", 16.0)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_backward: no tuned kernel for b=1,h=2,hkv=2,s=8,"
                                                  "sk=8,d=64,causal=1,pass=bwd: tensors on cpu .*the gradients by "
                                                  "explicit math"):
            o.sum().backward()

    # -- deterministic=True (flash_attn_func's argument)

    def test_deterministic(self):
        ops = torch.ops.attntune
        # The ops take it last, defaulted (calls without it mean what they did); attention's is followed by
        # q_descale (the FP8 forward's, later), defaulted too.
        for op in (ops.attention.default, ops.attention_backward.default, ops.attention_varlen.default,
                   ops.attention_backward_varlen.default):
            args = op._schema.arguments
            last = -2 if op is ops.attention.default else -1
            arg = args[last]
            self.assertEqual((arg.name, str(arg.type), arg.default_value), ("deterministic", "bool", False), op)
        q_descale = ops.attention.default._schema.arguments[-1]
        self.assertEqual((q_descale.name, str(q_descale.type), q_descale.default_value),
                         ("q_descale", "Optional[Tensor]", None))
        # The dispatch: the package's backward kernels (flash_bwd_mma) serve deterministic calls too (the
        # flag reaches the library's dispatcher through attntune_options.deterministic, and their plans
        # take it); the forward's entry takes no such flag.
        bwd = {vr.spec_of(k["problem"]): i for i, k in enumerate(self.kernels) if k["problem"].get("pass") == "bwd"}
        for spec, i in bwd.items():
            p = self.kernels[i]["problem"]
            args = (p["dtype"], p["d"], p["causal"], p["b"], p["h"], p["hkv"], p["s"], p["sk"])
            window = tuple(p.get("window", (-1, -1)))
            entry = "attention_backward_varlen" if p.get("varlen") else "attention_backward"
            self.assertEqual(attntune.explain(entry, *args, window_size=window, deterministic=True), (i, ""), spec)
        with self.assertRaisesRegex(RuntimeError, "deterministic is the backward pass's"):
            attntune.explain("attention", "bf16", 128, True, 2, 32, 8, 4096, 4096, deterministic=True)
        with self.assertRaisesRegex(ValueError, "deterministic must be True or False"):
            attntune.attention(rand(1, 2, 8, 64), rand(1, 2, 8, 64), rand(1, 2, 8, 64), deterministic="yes")

        # Autograd hands it to attention_backward (recorded under a dispatch mode), and the gradients
        # (here the fallback's explicit math, deterministic either way) are the same bits with and
        # without it, run after run.
        from torch.utils._python_dispatch import TorchDispatchMode

        class Calls(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.seen = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is ops.attention_backward.default:
                    names = [a.name for a in func._schema.arguments]
                    full = dict(zip(names, args), **kwargs)
                    self.seen.append(full.get("deterministic", False))
                return func(*args, **kwargs)

        q, k, v = rand(1, 4, 37, 64), rand(1, 2, 53, 64), rand(1, 2, 53, 64)
        g = rand(1, 4, 37, 64)
        results = {}
        for det in (False, True, True):
            xs = [t.clone().requires_grad_() for t in (q, k, v)]
            calls = Calls()
            with calls:
                out = attntune.attention(*xs, is_causal=True, window_size=(20, 0), deterministic=det)
                grads = torch.autograd.grad(out, xs, g)
            self.assertEqual(calls.seen, [det])
            results.setdefault(det, []).append(grads)
        for a, b, c in zip(results[False][0], results[True][0], results[True][1]):
            self.assertTrue(torch.equal(a.view(torch.int16), b.view(torch.int16)))
            self.assertTrue(torch.equal(b.view(torch.int16), c.view(torch.int16)))
        # The op's own checks and fake with it, and a compiled training step.
        out, lse = ops.attention(q, k, k, None, True, True, deterministic=True)
        torch.library.opcheck(ops.attention_backward.default, (g, q, k, k, out, lse, None, None, True),
                              {"deterministic": True})
        qg = q.clone().requires_grad_()
        torch.library.opcheck(ops.attention.default, (qg, k, k, None, True, True), {"deterministic": True})
        torch._dynamo.reset()

        def step(q, k, v):
            return attntune.attention(q, k, v, is_causal=True, deterministic=True).float().square().sum()

        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        got, want = [], []
        for fn, into in ((compiled, got), (step, want)):
            xs = [t.clone().requires_grad_() for t in (q, k, v)]
            into.extend(torch.autograd.grad(fn(*xs), xs))
        for a, b in zip(got, want):
            self.assertTrue(torch.equal(a, b))

    # -- the fake and torch.compile

    def test_opcheck_and_fullgraph(self):
        ops = torch.ops.attntune
        q, k = rand(2, 4, 9, 64), rand(2, 2, 11, 64)
        out, lse = ops.attention(q, k, k, None, True, True)
        g = rand(2, 4, 9, 64)
        torch.library.opcheck(ops.attention_backward.default, (g, q, k, k, out, lse, None, None, True))
        torch.library.opcheck(ops.attention_backward.default, (g, q, k, k, out, lse, torch.randn(2, 4, 9), None, False,
                                                               [3, 2], 30.0, torch.randn(4)))
        torch.library.opcheck(ops.attention_backward.default, (g, q, k, k, out, torch.empty(0), None, None, True))
        # The forward with grads: its autograd registration and the fake's AOT path.
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        torch.library.opcheck(ops.attention.default, (qg, kg, kg, None, True, True))
        torch.library.opcheck(ops.attention.default, (qg, kg, kg, None, False, True, [4, 0], 30.0,
                                                      torch.zeros(4, requires_grad=True)))

        torch._dynamo.reset()

        def step(q, k, v, sinks):
            a = attntune.attention(q, k, v, is_causal=True)
            b, lse = attntune.attention(q, k, v, window_size=(3, 0), softcap=30.0, sinks=sinks, return_lse=True)
            return (a.float() * 2).sum() + b.float().square().sum() + lse.sum()

        leaves = [rand(2, 4, 9, 64), rand(2, 2, 9, 64), rand(2, 2, 9, 64), torch.tensor([0.5, -3.0, 2.0, 1e3])]
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        results = []
        for fn in (compiled, step):
            xs = [t.clone().requires_grad_() for t in leaves]
            loss = fn(*xs)
            results.append([loss] + list(torch.autograd.grad(loss, xs)))
        for got, want in zip(*results):
            self.assertEqual(got.shape, want.shape)
            self.assertTrue(torch.equal(got, want))


def packed_batch(lens_q, lens_k, H, Hkv, D, dtype, Dv=None, seed=0):
    """A packed batch as flash_attn_varlen_func takes it: cu_seqlens_q/k (int32 prefix sums of the
    lengths) and q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] (seeded)."""
    g = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lens_k)), dtype=torch.int32)
    Tq, Tk = int(cu_q[-1]), int(cu_k[-1])
    q = torch.randn(Tq, H, D, generator=g).to(dtype)
    k = torch.randn(Tk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(Tk, Hkv, Dv or D, generator=g).to(dtype)
    return cu_q, cu_k, q, k, v


class BackwardVarlen(unittest.TestCase):
    """attention_varlen's backward pass (flash_attn_varlen_func's training call; docs/design/torch.md
    "The backward pass"): autograd through attntune.attention_varlen, the op attention_backward_varlen
    (the package's varlen flash_bwd_mma kernel, BWD_VARLEN, built and never run here; CPU tensors fall
    back to the explicit gradients per sequence), against float64 autograd of variant_reference.attention
    per sequence on ragged packings (empty sequences, one row, one key, rows without keys, GQA, windows,
    soft-caps, sinks and their gradient, a used LSE, Dv != D); gradcheck; the dispatch (the varlen
    backward kernel for attention_backward_varlen alone); coverage, specs, plans and the raise policy with
    varlen=1,pass=bwd; deterministic; opcheck of the op and of attention_varlen with grads; no double
    backward; torch.compile(fullgraph=True) of a training step."""

    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        attntune.reset_coverage()
        torch.manual_seed(0)
        self.kernels = kernels_with_entries()

    # -- dispatch

    def test_the_varlen_backward_kernel_serves_the_varlen_backward_alone(self):
        specs = [vr.spec_of(k["problem"]) for k in self.kernels]
        kv, kd = specs.index(BWD_VARLEN), specs.index(BWD[0])
        self.assertEqual(self.kernels[kv]["entries"], 16)
        self.assertIn(BWD_VARLEN, attntune.default().info["entry_points"]["attntune_attention_backward_varlen"])
        self.assertEqual(attntune.default().info["entry_points"]["attntune_attention_backward_varlen"], [BWD_VARLEN])
        # A packed batch's backward: the varlen kernel, at its problem and lengths near it (any count of
        # sequences; no regime rule for the backward: a few rows too, within the ratio); a dense backward
        # of the same shapes: the dense kernel (tuned at s=4096: none past 16x off); the reverse never.
        for b, h, hkv, s, sk, dense in ((3, 8, 2, 512, 512, kd), (7, 8, 2, 333, 600, kd), (1, 32, 8, 4096, 4096, kd),
                                        (2, 8, 2, 40, 40, -1)):
            self.assertEqual(attntune.explain("attention_backward_varlen", "bf16", 128, True, b, h, hkv, s, sk),
                             (kv, ""), (b, h, hkv, s, sk))
            self.assertEqual(attntune.explain("attention_backward", "bf16", 128, True, b, h, hkv, s, sk)[0], dense)
            self.assertNotEqual(attntune.explain("attention_varlen", "bf16", 128, True, b, h, hkv, s, sk)[0], kv)
        self.assertEqual(attntune.explain("attention_backward_varlen", "bf16", 128, True, 3, 8, 2, 512, 512,
                                          deterministic=True), (kv, ""))
        # Nothing else: not causal, d=64, variants, fp16, lengths far off.
        for args, kw, words in (((128, False), {}, "attention_backward_varlen with head_dim=128 is_causal=0"),
                                ((64, True), {}, "attention_backward_varlen with head_dim=64 is_causal=1"),
                                ((128, True), dict(window_size=(64, 0)), "with a sliding window (64, -1)"),
                                ((128, True), dict(sinks=True), "with attention sinks"),
                                ((128, True), dict(softcap=30.0), "with a logit soft-cap 30")):
            k, why = attntune.explain("attention_backward_varlen", "bf16", *args, 3, 8, 2, 512, 512, **kw)
            self.assertEqual(k, -1, (args, kw))
            self.assertIn(words, why)
        k, why = attntune.explain("attention_backward_varlen", "fp16", 128, True, 3, 8, 2, 512, 512)
        self.assertEqual(k, -1)
        self.assertIn("tuned for bf16", why)
        k, why = attntune.explain("attention_backward_varlen", "bf16", 128, True, 3, 8, 2, 16384, 16384)
        self.assertEqual(k, -1)
        self.assertIn("max_length_ratio", why)
        with self.assertRaisesRegex(RuntimeError, "latent is for attention and attention_kvcache"):
            attntune.explain("attention_backward_varlen", "bf16", 576, False, 1, 16, 1, 1, 1000, head_dim_v=512,
                             latent=True)
        with self.assertRaisesRegex(RuntimeError, "forward-only"):
            attntune.explain("attention_backward_varlen", "bf16", 128, False, 1, 16, 1, 100, 1000, kv_dtype="fp8")

    # -- the gradients (CPU: the fallback) against float64, per sequence

    def grads(self, lens_q, lens_k, H, Hkv, D, dtype, causal=False, window=(-1, -1), softcap=0.0, sinks=None,
              lse_weight=False, Dv=None, seed=0):
        """attention_varlen's gradients of sum(out * g) (+ sum(lse * w)) for q, k, v (and sinks) on a packed
        batch: (ours, ref64, lowp), the references by autograd of variant_reference.attention over each
        sequence alone (lowp: in q's dtype; None in float64); an empty sequence contributes nothing."""
        cu_q, cu_k, q, k, v = packed_batch(lens_q, lens_k, H, Hkv, D, dtype, Dv, seed)
        gen = torch.Generator().manual_seed(seed + 7)
        g = torch.randn(q.shape[0], H, v.shape[-1], generator=gen).to(dtype)
        w = torch.randn(H, q.shape[0], generator=gen) if lse_weight else None
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        sk = sinks.detach().clone().requires_grad_() if sinks is not None else None
        ins = leaves + ([sk] if sk is not None else [])
        res = attntune.attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                        window_size=window, softcap=softcap, sinks=sk, return_lse=lse_weight)
        out, lse = res if lse_weight else (res, None)
        self.assertEqual(out.shape, g.shape)
        loss = (out.float() * g.float()).sum() + ((lse * w).sum() if lse_weight else 0)
        ours = list(torch.autograd.grad(loss, ins))
        scale = 1 / math.sqrt(D)

        def ref(dt):
            xs = [t.detach().to(torch.float64 if dt == torch.float64 else dtype).requires_grad_() for t in (q, k, v)]
            s64 = sinks.detach().double().requires_grad_() if sinks is not None else None
            gg = g.double() if dt == torch.float64 else g
            total = xs[0].sum() * 0
            for b in range(len(lens_q)):
                if lens_q[b] == 0:
                    continue
                qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
                qb, kb, vb = (t[sl][None].transpose(1, 2) for t, sl in zip(xs, (qs, ks, ks)))
                o, lb = vr.attention(qb, kb, vb, scale, causal=causal, window=window, softcap=softcap, sinks=s64,
                                     dtype=dt)
                total = total + (o * gg[qs][None].transpose(1, 2)).sum()
                if lse_weight:  # rows without keys (and sinks) have LSE -inf: their weight does nothing
                    lf = torch.where(torch.isfinite(lb), lb, torch.zeros_like(lb))
                    total = total + (lf * w[:, qs][None].double()).sum()
            wrt = xs + ([s64] if s64 is not None else [])
            got = torch.autograd.grad(total, wrt, allow_unused=True)
            return [torch.zeros_like(t) if d is None else d for d, t in zip(got, wrt)]
        return ours, ref(torch.float64), (None if dtype == torch.float64 else ref(dtype))

    def check(self, lens_q, lens_k, what, H=4, Hkv=2, D=64, dtype=torch.bfloat16, **args):
        ours, ref64, lowp = self.grads(lens_q, lens_k, H, Hkv, D, dtype, **args)
        assert_grads(self, ours, ref64, lowp, dtype, what)

    # Ragged packings: an empty sequence (with keys: their gradient is 0), one row, one key, no keys,
    # rows that see no key (causal, fewer keys than rows), more keys than rows.
    LENS_Q = [0, 1, 17, 64, 33, 5, 3]
    LENS_K = [4, 0, 17, 80, 20, 1, 9]

    def test_plain_against_float64(self):
        for dtype in (torch.bfloat16, torch.float16, torch.float64):
            for causal in (False, True):
                self.check(self.LENS_Q, self.LENS_K, f"{dtype} causal={causal}", dtype=dtype, causal=causal)
        self.check([7, 0, 30], [7, 12, 30], "MHA d=128", H=2, Hkv=2, D=128, causal=True)
        self.check([1], [1], "one row, one key", H=8, Hkv=1, causal=True)
        self.check([0, 0], [3, 0], "no query rows at all", causal=True)

    def test_variants_against_float64(self):
        lq, lk = self.LENS_Q, self.LENS_K
        for window in ((0, 0), (3, 5), (7, -1), (-1, 2)):
            self.check(lq, lk, f"window {window}", window=window)
        self.check(lq, lk, "causal window", causal=True, window=(10, -1))
        self.check(lq, lk, "softcap 30", softcap=30.0)
        self.check(lq, lk, "sinks", causal=True, sinks=sink_logits(4, seed=3))
        self.check(lq, lk, "sinks, no keys and empty rows", sinks=torch.tensor([0.5, -3.0, 2.0, 1.0]),
                   lse_weight=True)
        self.check(lq, lk, "everything", causal=True, window=(20, -1), softcap=50.0,
                   sinks=torch.tensor([0.5, -3.0, 2.0, 1.0]))
        self.check(lq, lk, "everything float64", dtype=torch.float64, window=(6, 3), softcap=5.0,
                   sinks=torch.tensor([0.5, -3.0, 2.0, 1.0]), lse_weight=True)
        self.check(lq, lk, "Dv != D", dtype=torch.float64, causal=True, Dv=32)
        self.check(lq, lk, "Dv != D, window", causal=True, window=(5, -1), Dv=128)

    def test_the_lse_has_a_gradient(self):
        self.check(self.LENS_Q, self.LENS_K, "lse", causal=True, lse_weight=True)
        self.check(self.LENS_Q, self.LENS_K, "lse float64", dtype=torch.float64, causal=True, window=(5, -1),
                   lse_weight=True)
        rows = {r["entry"]: r for r in attntune.coverage()}
        self.assertIn("the forward's LSE has a gradient (return_lse=True and the LSE used): the kernels take dout "
                      "alone", rows["attention_backward_varlen"]["fallback"])
        self.assertFalse(rows["attention_backward_varlen"]["tunable"])

    def test_gradcheck(self):
        cu_q, cu_k, q, k, v = packed_batch([3, 0, 1, 4], [2, 3, 1, 5], 4, 2, 8, torch.float64, seed=5)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        sinks = torch.tensor([0.5, -3.0, 2.0, 1.0])
        for args in (dict(is_causal=True), dict(is_causal=False), dict(window_size=(2, 1), softcap=3.0),
                     dict(is_causal=True, window_size=(1, 0), sinks=sinks)):
            self.assertTrue(torch.autograd.gradcheck(
                lambda q, k, v: attntune.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, **args), leaves), str(args))

    def test_sum_backward_partial_grads_and_no_lse(self):
        cu_q, cu_k, q, k, v = packed_batch([5, 0, 9], [5, 2, 9], 4, 2, 64, torch.bfloat16)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        attntune.attention_varlen(q, k, v, cu_q, cu_k, 9, 9, is_causal=True).sum().backward()
        for t in (q, k, v):
            self.assertEqual(t.grad.shape, t.shape)
            self.assertTrue(torch.isfinite(t.grad.float()).all().item())
        self.assertTrue(torch.equal(k.grad[5:7].float(), torch.zeros(2, 2, 64)))  # an empty sequence's keys
        # Only k requires grad; learnable sinks get theirs (float32).
        kk = k.detach().clone().requires_grad_()
        sinks = torch.zeros(4, requires_grad=True)
        attntune.attention_varlen(q.detach(), kk, v.detach(), cu_q, cu_k, 9, 9, sinks=sinks).square().sum().backward()
        self.assertIsNotNone(kk.grad)
        self.assertEqual(sinks.grad.dtype, torch.float32)
        # The op itself without return_lse (no LSE kept): its backward falls back, saying so.
        attntune.reset_coverage()
        out, _ = torch.ops.attntune.attention_varlen(q, k, v, cu_q, cu_k, 9, 9, None, True, False)
        out.sum().backward()
        rows = [r for r in attntune.coverage() if r["entry"] == "attention_backward_varlen"]
        self.assertEqual(len(rows), 1)
        self.assertIn("the forward's LSE was not saved (torch.ops.attntune.attention_varlen called with "
                      "return_lse=False", rows[0]["fallback"])
        with torch.no_grad():  # no autograd, no backward
            attntune.attention_varlen(q, k, v, cu_q, cu_k, 9, 9)
        # No double backward.
        q64 = q.detach().double().requires_grad_()
        (gq,) = torch.autograd.grad(attntune.attention_varlen(q64, q64[:, :2], q64[:, :2], cu_q, cu_q, 9, 9).sum(), q64,
                                    create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "attention_varlen has no double backward"):
            gq.sum().backward()

    def test_the_op_checks_its_arguments(self):
        ops = torch.ops.attntune
        cu_q, cu_k, q, k, v = packed_batch([5, 3], [5, 3], 4, 2, 64, torch.bfloat16)
        out, lse = ops.attention_varlen(q, k, v, cu_q, cu_k, 5, 5, None, True, True)
        g = torch.randn_like(out)
        for args, pattern in (((g[:4], q, k, v, out, lse, cu_q, cu_k, 5, 5), "dout must have out's shape"),
                              ((g, q, k, v, out, lse[:, :3], cu_q, cu_k, 5, 5), "lse has the wrong shape"),
                              ((g, q, k, v, out, lse, cu_q[:2], cu_k, 5, 5), r"must be \[batch \+ 1\]"),
                              ((g, q, k, v, out, lse, cu_q, cu_k, 5, 5, torch.zeros(3)), r"dlse must be \[heads, "
                                                                                         r"total_q\]"),
                              ((g, q, k[:, :1].expand(8, 3, 64), v, out, lse, cu_q, cu_k, 5, 5), "v must have k's")):
            with self.assertRaisesRegex(RuntimeError, "attntune.attention_backward_varlen: .*" + pattern, msg=pattern):
                ops.attention_backward_varlen(*args)
        with self.assertRaisesRegex(RuntimeError, r"attention_backward_varlen: is_causal with window_size \(2, 2\)"):
            ops.attention_backward_varlen(g, q, k, v, out, lse, cu_q, cu_k, 5, 5, None, None, True, [2, 2])

    # -- coverage, plans, the raise policy

    def test_coverage_plans_and_raises_varlen_backward_problems(self):
        cu_q, cu_k, q, k, v = packed_batch([5, 0, 9], [6, 2, 12], 4, 2, 64, torch.bfloat16)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        attntune.attention_varlen(q, k, v, cu_q, cu_k, 9, 12, is_causal=True, window_size=(4, 0)).sum().backward()
        rows = {r["entry"]: r for r in attntune.coverage()}
        self.assertEqual(sorted(rows), ["attention_backward_varlen", "attention_varlen"])
        spec = "b=3,h=4,hkv=2,s=9,sk=12,d=64,dtype=bf16,causal=1,varlen=1,window=4"
        self.assertEqual(attntune.problem_spec(rows["attention_varlen"]), spec)
        self.assertEqual(attntune.problem_spec(rows["attention_backward_varlen"]), spec + ",pass=bwd")
        table = attntune.coverage_table()
        self.assertIn("attention_backward_varlen bf16", table)
        self.assertIn("fp32 fallback: tensors on cpu", table)
        row = dict(rows["attention_backward_varlen"], tunable=True)
        plan = attntune.plan_from_coverage([row], "train")
        self.assertEqual(plan["problems"], [{"problem": spec + ",pass=bwd", "regime": "train"}])
        # attntune reads the spec back as a packed batch's backward problem (the shipped backward spaces).
        db = os.path.join(WORK, "bwd-varlen-queue.db")
        r = run("submit", "--db", db, "--problem", plan["problems"][0]["problem"], "--format", "json")
        self.assertTrue(json.loads(r.stdout)[0]["campaign"].endswith(":" + spec + ",pass=bwd"), r.stdout)
        with open(os.path.join(PKG, "attntune", "tuner.json")) as fh:
            support = json.load(fh)
        assert_backward_support(self, row, support)
        # The raise policy: the varlen backward's own message.
        o = attntune.attention_varlen(q, k, v, cu_q, cu_k, 9, 12, is_causal=True)
        attntune.set_policy("raise", 16.0)
        with self.assertRaisesRegex(RuntimeError, "attntune.attention_backward_varlen: no tuned kernel for b=3,h=4,hkv=2,"
                                                  "s=9,sk=12,d=64,causal=1,pass=bwd: tensors on cpu .*the gradients by "
                                                  "explicit math"):
            o.sum().backward()

    # -- deterministic=True (flash_attn_varlen_func's argument)

    def test_deterministic(self):
        ops = torch.ops.attntune
        cu, _, x, y, _ = packed_batch([4], [4], 2, 2, 64, torch.bfloat16)
        with self.assertRaisesRegex(ValueError, "attention_varlen: deterministic must be True or False"):
            attntune.attention_varlen(x, y, y, cu, cu, 4, 4, deterministic=1.5)
        from torch.utils._python_dispatch import TorchDispatchMode

        class Calls(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.seen = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is ops.attention_backward_varlen.default:
                    names = [a.name for a in func._schema.arguments]
                    self.seen.append(dict(zip(names, args), **kwargs).get("deterministic", False))
                return func(*args, **kwargs)

        cu_q, cu_k, q, k, v = packed_batch(self.LENS_Q, self.LENS_K, 4, 2, 64, torch.bfloat16)
        g = torch.randn(q.shape[0], 4, 64).to(torch.bfloat16)
        results = {}
        for det in (False, True, True):
            xs = [t.clone().requires_grad_() for t in (q, k, v)]
            calls = Calls()
            with calls:
                out = attntune.attention_varlen(*xs, cu_q, cu_k, 64, 80, is_causal=True, window_size=(20, 0),
                                                deterministic=det)
                grads = torch.autograd.grad(out, xs, g)
            self.assertEqual(calls.seen, [det])
            results.setdefault(det, []).append(grads)
        for a, b, c in zip(results[False][0], results[True][0], results[True][1]):
            self.assertTrue(torch.equal(a.view(torch.int16), b.view(torch.int16)))
            self.assertTrue(torch.equal(b.view(torch.int16), c.view(torch.int16)))

    # -- the fake and torch.compile

    def test_opcheck_and_fullgraph(self):
        ops = torch.ops.attntune
        cu_q, cu_k, q, k, v = packed_batch([3, 0, 7], [4, 2, 7], 4, 2, 64, torch.bfloat16)
        out, lse = ops.attention_varlen(q, k, v, cu_q, cu_k, 7, 7, None, True, True)
        g = torch.randn_like(out)
        torch.library.opcheck(ops.attention_backward_varlen.default, (g, q, k, v, out, lse, cu_q, cu_k, 7, 7, None,
                                                                      None, True))
        torch.library.opcheck(ops.attention_backward_varlen.default, (g, q, k, v, out, lse, cu_q, cu_k, 7, 7,
                                                                      torch.randn(4, 10), None, False, [3, 2], 30.0,
                                                                      torch.randn(4)))
        torch.library.opcheck(ops.attention_backward_varlen.default, (g, q, k, v, out, torch.empty(0), cu_q, cu_k, 7, 7,
                                                                      None, None, True), {"deterministic": True})
        # The forward with grads: its autograd registration and the fake's AOT path.
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        torch.library.opcheck(ops.attention_varlen.default, (qg, kg, kg, cu_q, cu_k, 7, 7, None, True, True))
        torch.library.opcheck(ops.attention_varlen.default, (qg, kg, kg, cu_q, cu_k, 7, 7, None, False, True, [4, 0],
                                                             30.0, torch.zeros(4, requires_grad=True)))
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            fq, fk = torch.empty(10, 4, 64, dtype=torch.bfloat16), torch.empty(13, 2, 64, dtype=torch.bfloat16)
            fv = torch.empty(13, 2, 32, dtype=torch.bfloat16)
            fcu = torch.empty(3, dtype=torch.int32)
            dq, dk, dv, ds = ops.attention_backward_varlen(torch.empty(10, 4, 32, dtype=torch.bfloat16), fq, fk, fv,
                                                           torch.empty(10, 4, 32, dtype=torch.bfloat16),
                                                           torch.empty(4, 10), fcu, fcu, 7, 7, None, None, True,
                                                           [-1, -1], 0.0, torch.empty(4))
            self.assertEqual((dq.shape, dk.shape, dv.shape, ds.shape, ds.dtype),
                             (fq.shape, fk.shape, fv.shape, torch.Size([4]), torch.float32))

        torch._dynamo.reset()

        def step(q, k, v, sinks, cu_q, cu_k):
            a = attntune.attention_varlen(q, k, v, cu_q, cu_k, 7, 7, is_causal=True)
            b, lse = attntune.attention_varlen(q, k, v, cu_q, cu_k, 7, 7, window_size=(3, 0), softcap=30.0,
                                               sinks=sinks, return_lse=True)
            return (a.float() * 2).sum() + b.float().square().sum() + lse.sum()

        leaves = [q, k, v, torch.tensor([0.5, -3.0, 2.0, 1e3])]
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        results = []
        for fn in (compiled, step):
            xs = [t.clone().requires_grad_() for t in leaves]
            loss = fn(*xs, cu_q, cu_k)
            results.append([loss] + list(torch.autograd.grad(loss, xs)))
        for got, want in zip(*results):
            self.assertEqual(got.shape, want.shape)
            self.assertTrue(torch.equal(got, want))


class Build(unittest.TestCase):
    def test_a_torch_without_cuda_is_a_clear_error(self):
        real = torch.version.cuda
        try:
            torch.version.cuda = None
            with self.assertRaisesRegex(RuntimeError, "built without CUDA"):
                attntune.load(os.path.join(PKG, "attntune", "kernels.cu"), namespace="attntune_nocuda")
        finally:
            torch.version.cuda = real

    def test_a_missing_kernels_file_says_how_to_make_one(self):
        with self.assertRaisesRegex(FileNotFoundError, "export --torch"):
            attntune.load(os.path.join(WORK, "nothing.cu"), namespace="attntune_missing")

    def test_namespace_must_be_an_identifier(self):
        with self.assertRaisesRegex(ValueError, "identifier"):
            attntune.load(os.path.join(PKG, "attntune", "kernels.cu"), namespace="a-b")


class ExportTorch(unittest.TestCase):
    def test_package_files(self):
        for f in ("pyproject.toml", "attntune/__init__.py", "attntune/_build.py", "attntune/_ops.cpp",
                  "attntune/kernels.cu", "attntune/kernels.json", "attntune/tuner.json"):
            self.assertTrue(os.path.isfile(os.path.join(PKG, f)), f)
        with open(os.path.join(PKG, "attntune", "kernels.json")) as fh:
            self.assertEqual(json.load(fh)["kernels"], json.loads(torch.ops.attntune.kernel_info())["kernels"])

    def test_refuses_a_foreign_directory_and_rewrites_its_own(self):
        foreign = os.path.join(WORK, "foreign")
        os.makedirs(foreign)
        with open(os.path.join(foreign, "notes.txt"), "w") as fh:
            fh.write("mine")
        r = export("--problem", "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=1", "--torch", foreign,
                   check=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("neither empty nor a package attntune wrote", r.stderr)
        self.assertEqual(os.listdir(foreign), ["notes.txt"])
        again = os.path.join(WORK, "again")
        export("--problem", "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=1", "--torch", again)
        export("--problem", "b=8,h=16,hkv=16,s=2048,sk=2048,d=64,dtype=bf16,causal=0", "--torch", again)
        with open(os.path.join(again, "attntune", "kernels.json")) as fh:
            self.assertFalse(json.load(fh)["kernels"][0]["problem"]["causal"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
