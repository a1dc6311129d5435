"""The PyTorch package of `attntune export --torch`, without a GPU (ctest `torch_ops`, label cpu;torch).

Builds a real package from a recorded database (tests/data/campaigns/h100-suite.db: 8 bf16 kernels
of flash_fwd_mma) with the real torch and nvcc, then checks what runs without a GPU:
  - the dispatch: explain() against this file's own statement of the rule (nearest lengths by
    ratio, then the GQA group, then batch * heads; the decode/prefill regime; max_length_ratio);
  - the fallback's values (CPU tensors fall back) against a float64 reference: dense with
    bottom-right causal, rows that see no key, GQA, [B,S,H,D] views, LSE; kvcache over random
    block tables and ragged lengths (0, 1, odd, max); varlen over ragged packings;
  - coverage counts and the raise policy; the fake implementations (torch.library.opcheck, and
    torch.compile(fullgraph=True)); the autograd error;
  - export --torch's refusal of a directory it did not write.

  ATTNTUNE_BIN=build/attntune python3 tests/torch/test_ops.py
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("ATTNTUNE_BIN", os.path.join(ROOT, "build", "attntune"))
DB = os.path.join(ROOT, "tests", "data", "campaigns", "h100-suite.db")
WORK = tempfile.mkdtemp(prefix="attntune-torch-")
PKG = os.path.join(WORK, "pkg")
os.environ.setdefault("ATTNTUNE_TORCH_CACHE", os.path.join(WORK, "cache"))
os.environ["ATTNTUNE_TORCH_NO_AUTOLOAD"] = "1"  # loaded in setUpModule, with its time reported


def export(*args, check=True):
    r = subprocess.run([BIN, "export", "--db", DB, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"attntune export {' '.join(args)} failed ({r.returncode}): {r.stderr}")
    return r


attntune = None


def setUpModule():
    global attntune
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


# ------------------------------------------------------------------ the rule, restated

def nearest(kernels, entry_bit, d, causal, b, h, hkv, s, sk):
    """The library's rule as its header states it: of the kernels serving the entry and built for
    (d, causal), the nearest lengths by |log ratio| sum, then the same GQA group, then the nearest
    batch * heads, then the first."""
    def lr(a, c):
        return abs(math.log((a if a > 0 else 1) / (c if c > 0 else 1)))
    best, key = -1, None
    for i, kern in enumerate(kernels):
        p = kern["problem"]
        if p["d"] != d or bool(p["causal"]) != bool(causal) or not (kern["entries"] & entry_bit):
            continue
        k = (round(lr(s, p["s"]) + lr(sk, p["sk"]), 9), 0 if h // hkv == p["h"] // p["hkv"] else 1,
             round(lr(b * h, p["b"] * p["h"]), 9))
        if key is None or k < key:
            best, key = i, k
    return best


class Dispatch(unittest.TestCase):
    def setUp(self):
        attntune.set_policy("sdpa", 16.0)
        self.kernels = attntune.kernels()
        for k in self.kernels:
            k["entries"] = 1  # flash_fwd_mma serves attntune_attention_forward only

    def test_each_tuned_problem_runs_its_own_kernel(self):
        for i, k in enumerate(self.kernels):
            p = k["problem"]
            got = attntune.explain("attention", p["dtype"], p["d"], p["causal"], p["b"], p["h"], p["hkv"], p["s"],
                                   p["sk"])
            self.assertEqual(got, (i, ""), f"kernel {i} ({p})")

    def test_random_shapes_follow_the_rule(self):
        rng = random.Random(26)
        for _ in range(400):
            d, causal = rng.choice([64, 128]), rng.random() < 0.5
            hkv = rng.choice([1, 2, 4, 8, 16])
            h = hkv * rng.choice([1, 2, 4, 8])
            b = rng.randint(1, 64)
            s = rng.randint(17, 40000)
            sk = s if rng.random() < 0.7 else rng.randint(s, 60000)
            want = nearest(self.kernels, 1, d, causal, b, h, hkv, s, sk)
            got, why = attntune.explain("attention", "bf16", d, causal, b, h, hkv, s, sk)
            if got >= 0:
                self.assertEqual(got, want, f"b={b} h={h} hkv={hkv} s={s} sk={sk} d={d} causal={causal}")
            else:  # only ever for lengths over the ratio from the nearest
                self.assertIn("max_length_ratio", why)
                p = self.kernels[want]["problem"]
                off = max(max(s / p["s"], p["s"] / s), max(sk / p["sk"], p["sk"] / sk))
                self.assertGreater(off, 16.0)

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
        # Far lengths: 256x the nearest tuned s=16384 falls back at ratio 16, runs at ratio 1000.
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
    """CPU tensors fall back to SDPA; its values must follow the ops' semantics exactly."""

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

    def test_kvcache_paged_and_contiguous(self):
        B, H, Hkv, D, page = 5, 8, 2, 64, 16
        lens = torch.tensor([0, 1, 37, 64, 50], dtype=torch.int32)
        max_blocks = 4
        Sk = page * max_blocks
        for S, causal in ((1, False), (4, True), (3, False)):
            q = rand(B, S, H, D)
            kc, vc = rand(B, Sk, Hkv, D), rand(B, Sk, Hkv, D)
            # The same keys through shuffled pages, with spare pages between.
            num_blocks = B * max_blocks + 7
            perm = torch.randperm(num_blocks)[:B * max_blocks].view(B, max_blocks).to(torch.int32)
            kp, vp = rand(num_blocks, page, Hkv, D), rand(num_blocks, page, Hkv, D)
            for b in range(B):
                for j in range(max_blocks):
                    kp[perm[b, j]] = kc[b, j * page:(j + 1) * page]
                    vp[perm[b, j]] = vc[b, j * page:(j + 1) * page]
            scale = 1 / math.sqrt(D)
            visible = (torch.arange(Sk)[None, :] < lens[:, None].long())[:, None, None, :]
            ref64, lse64 = ref_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), scale, False,
                                         visible & self.causal_mask(S, Sk, lens, causal))
            ref_lowp = ref_attention(q.transpose(1, 2).float(), kc.transpose(1, 2).float(),
                                     vc.transpose(1, 2).float(), scale, False,
                                     visible & self.causal_mask(S, Sk, lens, causal))[0].bfloat16()
            for name, args in (("contiguous", dict(k_cache=kc, v_cache=vc)),
                               ("paged", dict(k_cache=kp, v_cache=vp, block_table=perm))):
                out, lse = attntune.attention_kvcache(q, cache_seqlens=lens, is_causal=causal, return_lse=True,
                                                      **args)
                self.assertEqual(out.shape, q.shape)
                self.assertEqual(lse.shape, (B, H, S))
                assert_fa2(self, out.transpose(1, 2), ref64, ref_lowp, torch.bfloat16, f"kvcache {name} S={S}")
                self.assertTrue(torch.equal(out[0], torch.zeros_like(out[0])), "length 0: zeros")
                self.assertTrue(torch.isinf(lse[0]).all())

    @staticmethod
    def causal_mask(S, Sk, lens, causal):
        if not causal:
            return torch.ones(1, 1, 1, 1, dtype=torch.bool)
        j, i = torch.arange(Sk)[None, None, :], torch.arange(S)[None, :, None]
        return (j <= i + lens.long()[:, None, None] - S)[:, None]

    def test_varlen(self):
        H, Hkv, D = 4, 2, 64
        for causal in (False, True):
            lens_q = [0, 1, 17, 64, 33]
            lens_k = [0, 5, 17, 64, 90] if not causal else [3, 1, 17, 80, 33]
            cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
            cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
            q, k, v = rand(int(cu_q[-1]), H, D), rand(int(cu_k[-1]), Hkv, D), rand(int(cu_k[-1]), Hkv, D)
            out, lse = attntune.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                                 return_lse=True)
            self.assertEqual(out.shape, q.shape)
            self.assertEqual(lse.shape, (H, q.shape[0]))
            for b in range(len(lens_q)):
                qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
                if lens_q[b] == 0:
                    continue
                qb, kb, vb = (t[None].transpose(1, 2) for t in (q[qs], k[ks], v[ks]))
                ref64, lse64 = ref_attention(qb, kb, vb, 1 / math.sqrt(D), causal)
                ref_lowp = ref_attention(qb.float(), kb.float(), vb.float(), 1 / math.sqrt(D), causal)[0].bfloat16()
                assert_fa2(self, out[qs][None].transpose(1, 2), ref64, ref_lowp, torch.bfloat16,
                           f"varlen seq {b} causal={causal}")
                finite = torch.isfinite(lse64[0])
                self.assertTrue(torch.equal(torch.isfinite(lse[:, qs]), finite))


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
        self.assertIn("SDPA fallback: tensors on cpu", attntune.coverage_table())
        self.assertEqual(attntune.coverage(reset=True), rows)
        self.assertEqual(attntune.coverage(), [])

    def test_raise_policy(self):
        attntune.set_policy("raise", 16.0)
        q = rand(1, 2, 8, 64)
        with self.assertRaisesRegex(RuntimeError, "no tuned kernel for b=1,h=2,hkv=2,s=8,sk=8,d=64.*tensors on cpu"):
            attntune.attention(q, q, q)
        self.assertEqual(attntune.coverage()[0]["calls"], 1)

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
        def row(entry, s, sk, tunable=True, paged=0, dtype="bf16", d=128):
            return {"entry": entry, "dtype": dtype, "calls": 1, "kernel": None, "tunable": tunable,
                    "problem": {"b": 2, "h": 32, "hkv": 8, "s": s, "sk": sk, "d": d, "causal": 1, "paged": paged}}
        rows = [row("attention", 4096, 4096), row("attention", 4096, 4096),       # twice: one problem
                row("attention_kvcache", 1, 8192, paged=16),                       # decode, paged
                row("attention_kvcache", 2048, 8192, paged=64),                    # chunked prefill, paged
                row("attention_kvcache", 512, 4096),                               # ... contiguous: tuned paged
                row("attention_varlen", 512, 512),                                 # varlen: lengths 1..512
                row("attention_varlen", 512, 256),                                 # varlen, sk < s: not said
                row("attention", 100, 100, tunable=False)]                         # a CPU tensor, say
        plan = attntune.plan_from_coverage(rows, "llama-ish")
        self.assertEqual(plan["problems"], [
            {"problem": "b=2,h=32,hkv=8,s=4096,sk=4096,d=128,dtype=bf16,causal=1", "regime": "prefill"},
            {"problem": "b=2,h=32,hkv=8,s=1,sk=8192,d=128,dtype=bf16,causal=1,page=16", "regime": "decode"},
            {"problem": "b=2,h=32,hkv=8,s=2048,sk=8192,d=128,dtype=bf16,causal=1,page=64", "regime": "chunk"},
            {"problem": "b=2,h=32,hkv=8,s=512,sk=4096,d=128,dtype=bf16,causal=1,page=64", "regime": "chunk"},
            {"problem": "b=2,h=32,hkv=8,s=512,sk=512,d=128,dtype=bf16,causal=1,varlen=1", "regime": "prefill"}])
        path, db = os.path.join(WORK, "plan.json"), os.path.join(WORK, "queue.db")
        with open(path, "w") as fh:
            json.dump(plan, fh)
        r = subprocess.run([BIN, "submit", path, "--db", db, "--format", "json"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run([BIN, "status", "--db", db, "--format", "json"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        status = json.loads(r.stdout)
        self.assertEqual(status["counts"]["queued"], 5)
        def spec(p):
            return (f"b={p['b']},h={p['h']},hkv={p['hkv']},s={p['s']},sk={p['sk']},d={p['d']},dtype={p['dtype']},"
                    f"causal={int(p['causal'])}" + (f",page={p['page']}" if p.get("page") else "") +
                    (f",varlen={p['varlen']}" if p.get("varlen") else ""))
        self.assertEqual(sorted(spec(c["problem"]) for c in status["campaigns"]),
                         sorted(p["problem"] for p in plan["problems"]))
        self.assertEqual(attntune.coverage_plan()["problems"], [])  # the CPU calls here are not tunable

    def test_what_no_family_tunes_is_not_offered(self):
        support = json.load(open(os.path.join(PKG, "attntune", "tuner.json")))
        self.assertIn("flash_decode", [f["family"] for f in support["families"]])
        row = {"entry": "attention", "dtype": "bf16", "calls": 1, "kernel": None, "tunable": True, "fallback": "x",
               "problem": {"b": 1, "h": 16, "hkv": 16, "s": 777, "sk": 777, "d": 96, "causal": 1, "paged": 0}}
        self.assertIn("no attntune family tunes head_dim=96 bf16 (head dims: 64, 128, 256)",
                      attntune.untunable(row, support))
        row["problem"]["d"] = 128
        self.assertEqual(attntune.untunable(row, support), "")


class Compile(unittest.TestCase):
    """The fake implementations: opcheck compares them with the real ones; torch.compile traces."""

    def test_opcheck(self):
        ops = torch.ops.attntune
        q, k = rand(2, 4, 9, 64), rand(2, 2, 11, 64)
        torch.library.opcheck(ops.attention.default, (q, k, k, None, True, True))
        torch.library.opcheck(ops.attention_into.default, (q, k, k, torch.empty_like(q), None, None, True))
        qd, kc = rand(2, 3, 4, 64), rand(6, 16, 2, 64)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        torch.library.opcheck(ops.attention_kvcache.default, (qd, kc, kc, lens, table, None, True, True))
        cu = torch.tensor([0, 3, 10], dtype=torch.int32)
        torch.library.opcheck(ops.attention_varlen.default, (rand(10, 4, 64), rand(10, 2, 64), rand(10, 2, 64), cu,
                                                             cu, 7, 7, None, True, True))

    def test_fullgraph(self):
        torch._dynamo.reset()

        def f(q, k, v, kc, table, lens, xq, xk, cu):
            a = attntune.attention(q, k, v, is_causal=True)
            b = attntune.attention_kvcache(q.transpose(1, 2)[:, :1], kc, kc, cache_seqlens=lens, block_table=table)
            c = attntune.attention_varlen(xq, xk, xk, cu, cu, 7, 7, is_causal=True)
            return a * 2, b + 1, c

        q, k = rand(2, 4, 9, 64), rand(2, 2, 9, 64)
        kc = rand(6, 16, 2, 64)
        table, lens = torch.tensor([[0, 1], [5, 2]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32)
        xq, xk, cu = rand(10, 4, 64), rand(10, 2, 64), torch.tensor([0, 3, 10], dtype=torch.int32)
        args = (q, k, k, kc, table, lens, xq, xk, cu)
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(*args), f(*args)):
            self.assertTrue(torch.equal(got, want))


class Autograd(unittest.TestCase):
    def test_no_wrong_gradient(self):
        q = rand(1, 2, 8, 64).requires_grad_()
        with self.assertRaisesRegex(RuntimeError, "no backward pass"):
            attntune.attention(q, q, q)
        out, _ = torch.ops.attntune.attention(q, q, q, None, False, False)
        with self.assertRaisesRegex(RuntimeError, "no backward pass"):
            out.sum().backward()
        with torch.no_grad():
            attntune.attention(q, q, q)


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
