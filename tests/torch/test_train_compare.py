"""tools/train_compare.py without a GPU (ctest `torch_train_compare`, label cpu;torch; issue 45's training run).

What runs on a CPU, in well under 30 s on two cores (about 10 s):
  - the model: forward and backward at a tiny size (shapes, finite gradients everywhere, causality,
    tied embeddings, the parameter count, a meta-built copy equal to the original); the attention sides
    (SDPA with enable_gqa, with K/V repeated, in fp32) against float64 attention;
  - the data: the same batches for a seed whatever the order they are asked in, other steps and seeds
    other batches, the Markov and copy structure, and a loss that falls in a few CPU steps with SDPA;
  - step 0's gradient check (run 194): fp32 attention really fp32 under the model's autocast, zero
    error only for an fp32 run, every run of a comparison equal to a fresh run of its own (nothing
    shared between runs, probes and the reference models), the probe's dO of the training's layout;
  - the in-situ check: layer 0's captured q, k, v, dO (their strides), correct sides passing and
    wrong ones (dK, dV off, no mask, a scrambled dO, a raise) failing FlashAttention-2's criterion;
    the same-dtype attention against float64; check_sdpa_runs() on synthetic errors;
  - the verdict: judge() on synthetic curves (a matching one accepted; a drift and a late spike
    rejected; no noise floor inconclusive; NaNs), judge_grads() likewise, and the whole comparison
    end to end with stand-ins for attntune: a second correct implementation accepted, a backward
    with dK 10 % off and a non-causal mask rejected (exit status 1), a candidate failing the in-situ
    check; a broken reference (the backend torch picks, scrambling dO) replaced by a valid side or
    stopping the run, and one broken only after the in-situ check making the verdict inconclusive,
    as a broken noise run does;
  - --package's path over a stand-in package (SDPA underneath): loading it, explain() stopping a
    fallback before training, the raise policy stopping one during it, --allow-fallback counting them
    (coverage), and layers x steps kernel calls of each pass for a match;
  - the command line: a run with --json and --csv, --smoke's defaults, and the argument errors.
attntune's real kernels need a GPU: docs/design/training_run.md says how to run it.

    python3 tests/torch/test_train_compare.py     (or pytest tests/torch/test_train_compare.py)
"""
import contextlib
import csv
import io
import json
import math
import os
import random
import sys
import tempfile
import unittest
from unittest import mock

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import train_compare as tc  # noqa: E402

# One thread: tiny ops, and a shared CI machine where two OpenMP threads oversubscribed ran 15x slower.
torch.set_num_threads(1)

# 2 layers, d_model 64, 4/2 heads at 16, vocab 64, 2 x 32 tokens, 4 steps: a comparison in a few seconds.
TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "64", "--seqlen", "32",
        "--batch", "2", "--steps", "4", "--warmup", "1", "--lr", "3e-3", "--lr-warmup", "2", "--log-every", "100",
        "--no-bench", "--device", "cpu"]


def tiny(*extra):
    args = tc.resolve(tc.parser().parse_args(TINY + list(extra)))
    return args, tc.validate(args)


def quiet(*_):
    pass


def reference_attention(q, k, v):
    """Causal GQA attention in float64, by its definition."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


def wrong_backward(dq=1.0, dk=1.0, dv=1.0, read_do=lambda do: do):
    """SDPA's forward, its backward with dQ, dK, dV scaled and dO read through read_do: a stand-in
    for a wrong backward kernel."""
    class Faulty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        @staticmethod
        def backward(ctx, do):
            xs = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            with torch.enable_grad():
                o = F.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=True)
                gq, gk, gv = torch.autograd.grad(o, xs, read_do(do))
            return gq * dq, gk * dk, gv * dv
    return lambda q, k, v: Faulty.apply(q, k, v)


def non_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)


# A backward that reads dO in the wrong order (the sequence reversed), as a backward that takes dO
# with another layout's strides does (run 194's reference, likely).
scrambled = wrong_backward(read_do=lambda do: do.flip(2))


@contextlib.contextmanager
def broken_sdpa(which, after_choice=False):
    """SdpaAttention with a scrambled backward where which(attn) says so (e.g. the auto reference: the
    backend torch picks broken, as cuDNN was in run 194); after_choice: only once choose_sides is done
    (broken in training but not in the in-situ check, as a state-dependent fault would be)."""
    state = {"on": not after_choice}
    call, choose = tc.SdpaAttention.__call__, tc.choose_sides

    def broken_call(self, q, k, v):
        if state["on"] and which(self):
            call(self, q, k, v)  # records the pick
            return scrambled(q, k, v)
        return call(self, q, k, v)

    def chosen(*a, **kw):
        r = choose(*a, **kw)
        state["on"] = True
        return r
    with mock.patch.object(tc.SdpaAttention, "__call__", broken_call), mock.patch.object(tc, "choose_sides", chosen):
        yield


class ModelTest(unittest.TestCase):
    def setUp(self):
        self.cfg = tc.Config(vocab=64, d_model=64, layers=2, heads=4, kv_heads=2)
        self.model = tc.Decoder(self.cfg).init_weights(0)
        self.tokens = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))

    def test_forward_backward(self):
        logits = self.model(self.tokens, tc.SdpaAttention())  # under its own autocast (bf16)
        self.assertEqual(logits.shape, (2, 24, 64))
        self.assertEqual(logits.dtype, torch.float32)
        F.cross_entropy(logits[:, :-1].flatten(0, 1), self.tokens[:, 1:].flatten()).backward()
        for name, p in self.model.named_parameters():
            self.assertIsNotNone(p.grad, name)
            self.assertTrue(torch.isfinite(p.grad).all(), name)
            self.assertGreater(p.grad.abs().sum().item(), 0, name)

    def test_causal(self):
        other = self.tokens.clone()
        other[:, 12:] = (other[:, 12:] + 1) % 64
        with torch.no_grad():
            a, b = self.model(self.tokens, tc.SdpaAttention()), self.model(other, tc.SdpaAttention())
        self.assertTrue(torch.equal(a[:, :12], b[:, :12]))
        self.assertFalse(torch.equal(a[:, 12:], b[:, 12:]))

    def test_attention_sides_against_float64(self):
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(2, h, 40, 16, generator=g) for h in (4, 2, 2))
        ref = reference_attention(q, k, v)
        for attn in (tc.SdpaAttention(), tc.SdpaAttention(gqa="repeat"), tc.SdpaAttention("math"), tc.Fp32Attention()):
            out = attn(q, k, v)
            self.assertEqual(out.shape, q.shape, tc.describe(attn))
            self.assertLess((out.double() - ref).abs().max().item(), 1e-5, tc.describe(attn))
        self.assertEqual(tc.SdpaAttention("math").picked, None)  # a pinned backend records on its first call
        picked = tc.SdpaAttention()
        picked(q, k, v)
        self.assertIn(picked.picked, ("flash", "math", "efficient", "cudnn", "unknown"))

    def test_meta_build_and_tied(self):
        state = {k: v.clone() for k, v in self.model.state_dict().items()}
        copy = tc.build_model(self.cfg, state, torch.device("cpu"))
        with torch.no_grad():
            self.assertTrue(torch.equal(copy(self.tokens, tc.SdpaAttention()),
                                        self.model(self.tokens, tc.SdpaAttention())))
        self.assertEqual(tc.param_count(self.cfg), sum(p.numel() for p in self.model.parameters()))
        tied = tc.Config(vocab=64, d_model=64, layers=2, heads=4, kv_heads=2, tie_embeddings=True)
        m = tc.Decoder(tied).init_weights(0)
        self.assertIsNone(m.lm_head)
        self.assertEqual(tc.param_count(tied), sum(p.numel() for p in m.parameters()))
        with torch.no_grad():
            self.assertEqual(m(self.tokens, tc.SdpaAttention()).shape, (2, 24, 64))

    def test_full_size(self):
        cfg = tc.Config(vocab=32000, d_model=2048, layers=8, heads=16, kv_heads=4)
        self.assertEqual((cfg.head_dim, cfg.ffn), (128, 5632))
        self.assertTrue(0.4e9 < tc.param_count(cfg) < 0.6e9)

    def test_param_kind(self):
        self.assertEqual(tc.param_kind("blocks.3.attn.wq.weight"), "wq")
        self.assertEqual(tc.param_kind("blocks.0.mlp_norm.weight"), "mlp_norm")
        self.assertEqual(tc.param_kind("embed.weight"), "embed")
        self.assertEqual(tc.param_kind("norm.weight"), "final_norm")
        self.assertEqual(tc.param_kind("lm_head.weight"), "lm_head")


class DataTest(unittest.TestCase):
    def test_deterministic(self):
        a, b = tc.TokenStream(500, 300, 3, seed=7), tc.TokenStream(500, 300, 3, seed=7)
        x = a.batch_at(5)
        b.batch_at(0)  # asked in another order: the same batches
        self.assertTrue(torch.equal(x, b.batch_at(5)))
        self.assertEqual(x.shape, (3, 301))
        self.assertEqual(x.dtype, torch.long)
        self.assertTrue(0 <= x.min().item() and x.max().item() < 500)
        self.assertFalse(torch.equal(x, a.batch_at(6)))
        self.assertFalse(torch.equal(x, tc.TokenStream(500, 300, 3, seed=8).batch_at(5)))
        self.assertFalse(torch.equal(x[0], x[1]))

    def test_structure(self):
        markov = tc.TokenStream(500, 400, 1, seed=3, copy=0.0)
        seq = markov.sequence(0, 0)
        self.assertTrue(all(b in markov.table[a] for a, b in zip(seq, seq[1:])))
        copying = tc.TokenStream(500, 2000, 1, seed=3, copy=0.5)
        seq = copying.sequence(0, 0)
        earlier = set()
        repeated = 0
        for i in range(8, len(seq)):  # 8-grams seen before: copies (a Markov chain of 4 successors rarely repeats one)
            gram = tuple(seq[i - 8:i])
            repeated += gram in earlier
            earlier.add(gram)
        self.assertGreater(repeated / len(seq), 0.25)

    def test_learnable(self):
        cfg = tc.Config(vocab=64, d_model=64, layers=2, heads=4, kv_heads=2)
        stream = tc.TokenStream(64, 64, 4, seed=0)
        run = tc.Run("sdpa", tc.SdpaAttention(), cfg, tc.initial_state(cfg, 0), torch.device("cpu"), lr=1e-2,
                     lr_warmup=1, weight_decay=0.0, grad_clip=1.0)
        tc.train([run], [stream.batch_at(i) for i in range(10)], torch.device("cpu"))
        self.assertAlmostEqual(run.losses[0], math.log(64), delta=0.3)
        self.assertLess(sum(run.losses[-3:]) / 3, run.losses[0] - 0.5, run.losses)


class GradCheckTest(unittest.TestCase):
    """Step 0's gradient check, and the runs' independence (run 194: the "fp32" reference was bf16 SDPA,
    because SDPA under the model's autocast casts fp32 inputs back to bf16)."""

    def setUp(self):
        self.cfg = tc.Config(vocab=64, d_model=64, layers=2, heads=4, kv_heads=2)
        self.state = tc.initial_state(self.cfg, 0)
        stream = tc.TokenStream(64, 32, 2, seed=0)
        self.batches = [stream.batch_at(i) for i in range(3)]
        self.cpu = torch.device("cpu")

    def run_of(self, name, attn):
        return tc.Run(name, attn, self.cfg, self.state, self.cpu, 3e-3, 2, 0.1, 1.0)

    def test_fp32_attention_is_fp32_under_autocast(self):
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, 24, h, 16, generator=g).to(torch.bfloat16).transpose(1, 2) for h in (4, 2, 2))
        plain = tc.Fp32Attention()(q, k, v)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = tc.Fp32Attention()(q, k, v)
            low = tc.SdpaAttention(gqa="repeat")(q, k, v)
        self.assertEqual(under.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(under, plain))  # autocast changes nothing inside
        self.assertFalse(torch.equal(under, low))  # and it is not bf16 SDPA

    def test_zero_error_only_for_an_fp32_run(self):
        check = tc.GradCheck(tc.reference_grads(self.cfg, self.state, self.batches[0], self.cpu))
        sides = {"fp32": tc.Fp32Attention(), "auto": tc.SdpaAttention(), "repeat": tc.SdpaAttention(gqa="repeat"),
                 "math": tc.SdpaAttention("math")}
        tc.train([self.run_of(n, a) for n, a in sides.items()], self.batches[:1], self.cpu, grad_check=check)
        self.assertEqual(set(check.errors), set(sides))
        self.assertEqual(set(check.errors["fp32"].values()), {0.0}, check.errors["fp32"])
        for name in ("auto", "repeat"):  # bf16 kernels (the math backend computes in fp32 inside: near zero)
            for kind, err in check.errors[name].items():
                self.assertGreater(err, 1e-4, (name, kind))  # final_norm and lm_head too: the forward differs
                self.assertLess(err, 0.05, (name, kind))
        self.assertLess(max(check.errors["math"].values()), 0.05)

    def test_probe_has_the_training_layouts(self):
        """probe_sdpa calls a side with q, k, v and dO of the training's strides: torch's cuDNN SDPA may
        keep the first call's dO strides in the backward graph it caches per q, k, v layout."""
        class Recording(tc.SdpaAttention):
            def __init__(self):
                super().__init__()
                self.seen = []

            def __call__(self, q, k, v):
                o = super().__call__(q, k, v)
                o.register_hook(lambda g: self.seen.append(tuple(t.stride() for t in (q, k, v, o, g))))
                return o
        training, probe = Recording(), Recording()
        model = tc.build_model(self.cfg, self.state, self.cpu)
        tokens = self.batches[0]
        F.cross_entropy(model(tokens[:, :-1], training).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        b, s = tokens.shape[0], tokens.shape[1] - 1
        self.assertEqual(tc.probe_sdpa(probe, (b, 4, 2, s, 16), torch.bfloat16, self.cpu), "flash")
        self.assertEqual(len(training.seen), 2)
        self.assertEqual(probe.seen, training.seen[:1])

    def capture(self):
        cap = tc.Capture(tc.Fp32Attention())
        tc.reference_grads(self.cfg, self.state, self.batches[0], self.cpu, cap)
        return cap.saved

    def test_in_situ_check(self):
        q, k, v, do = self.capture()
        b, s = self.batches[0].shape[0], self.batches[0].shape[1] - 1
        self.assertEqual((q.shape, k.shape), ((b, 4, s, 16), (b, 2, s, 16)))
        self.assertEqual((q.stride(), do.stride()), ((s * 64, 16, 64, 1),) * 2)  # [B, H, S, D] of [B, S, H, D]
        check = tc.InSituCheck(q, k, v, do, autocast=True)
        self.assertEqual(check.do.stride(), do.stride())
        self.assertTrue(0.5 <= check.do.double().pow(2).mean().sqrt().item() < 1)
        for name in tc.IN_SITU_TENSORS:
            self.assertGreater(check.same_dtype[name], 0)
            self.assertGreater(check.bound[name], 2 * check.same_dtype[name])
        for attn in (tc.SdpaAttention(), tc.SdpaAttention(gqa="repeat"), tc.SdpaAttention("math"), tc.Fp32Attention(),
                     tc.SameDtypeAttention()):
            r = check.check(attn)
            self.assertTrue(r["ok"], (tc.describe(attn), r))
        for attn in (wrong_backward(dk=0.9), wrong_backward(dv=1.1), non_causal, scrambled):
            r = check.check(attn)
            self.assertFalse(r["ok"], r)
        self.assertEqual([n for n, e in check.check(wrong_backward(dk=0.9))["err"].items()
                          if e > check.bound[n]], ["dk"])

        def raises(q, k, v):
            raise RuntimeError("no kernel")
        r = check.check(raises)
        self.assertEqual((r["ok"], r["error"]), (False, "RuntimeError: no kernel"))

    def test_same_dtype_attention(self):
        g = torch.Generator().manual_seed(4)
        q, k, v, do = (torch.randn(2, h, 40, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        o = tc.SameDtypeAttention()(*xs)
        self.assertLess((o - reference_attention(q, k, v)).abs().max().item(), 1e-12)
        grads = torch.autograd.grad(o, xs, do)
        ys = [t.clone().requires_grad_() for t in (q, k, v)]
        want = torch.autograd.grad(reference_attention(*ys), ys, do)
        for a, b in zip(grads, want):
            self.assertLess((a - b).abs().max().item(), 1e-12)

    def test_check_sdpa_runs(self):
        kinds = ("wq", "lm_head")
        errors = {"sdpa": dict(zip(kinds, (5e-3, 3e-3))), "sdpa-flash": dict(zip(kinds, (6e-3, 2e-3))),
                  "sdpa-math": dict(zip(kinds, (1e-6, 0.0))), "same-dtype": dict(zip(kinds, (6e-3, 4e-3))),
                  "broken": dict(zip(kinds, (1.1, 3e-3)))}
        backends = {"sdpa": "cudnn", "sdpa-flash": "flash", "sdpa-math": "math"}
        self.assertEqual(tc.check_sdpa_runs(errors, backends), {})
        flagged = tc.check_sdpa_runs(errors, dict(backends, broken="efficient"))
        self.assertEqual(list(flagged), ["broken"])
        self.assertEqual(flagged["broken"], ["wq 1.1 > 10 x 0.006"])
        # the math backend alone (fp32 inside) does not make a bf16 kernel look broken: the same-dtype floor
        only = {n: errors[n] for n in ("sdpa", "sdpa-math", "same-dtype")}
        self.assertEqual(tc.check_sdpa_runs(only, {"sdpa": "flash", "sdpa-math": "math"}), {})
        self.assertIn("sdpa", tc.check_sdpa_runs(only, {"sdpa": "flash", "sdpa-math": "math"}, floor=None))
        # a run on the same backend is no check of it (the same fault)
        same = dict(errors, repeat=errors["broken"])
        self.assertEqual(set(tc.check_sdpa_runs(same, {"broken": "cudnn", "repeat": "cudnn", "sdpa-flash": "flash"})),
                         {"broken", "repeat"})
        nan = dict(errors, sdpa={"wq": float("nan"), "lm_head": 3e-3})
        self.assertIn("sdpa", tc.check_sdpa_runs(nan, backends))

    def test_runs_independent(self):
        """Every run of a comparison whose sides all run one attention (SDPA math) has the step-0 gradients
        and the losses of a fresh run of its own: nothing leaks between runs, the fp32 model and the
        probes, whichever goes first."""
        baseline = self.run_of("baseline", tc.SdpaAttention("math"))
        grads = {}

        class Keep:
            def __call__(self, run):
                grads[run.name] = {n: p.grad.clone() for n, p in run.model.named_parameters()}

            def release(self):
                pass
        args, device = tiny("--sdpa-backend", "math", "--noise-backend", "math", "--repeat-reference",
                            "--steps", "3", "--warmup", "1")
        stream = tc.TokenStream(args.vocab, args.seqlen, args.batch, args.seed)
        tc.train([baseline], [stream.batch_at(i) for i in range(3)], device, grad_check=Keep())
        original = tc.GradCheck.__call__

        def record(check, run):
            Keep()(run)
            original(check, run)
        with mock.patch.object(tc.GradCheck, "__call__", record):
            s = tc.compare(args, device, candidate=tc.SdpaAttention("math"), out=quiet)
        self.assertEqual(list(s["runs"]), ["sdpa", "sdpa-math", "sdpa-repeat", "attntune"])
        for name, r in s["runs"].items():
            self.assertEqual(r["losses"], baseline.losses, name)
            for n, g in grads["baseline"].items():
                self.assertTrue(torch.equal(grads[name][n], g), (name, n))
        self.assertEqual(len({json.dumps(s["grad_check"][n], sort_keys=True) for n in s["runs"]}), 1)


def curve(seed, size=1e-3, steps=200):
    """A falling loss curve plus bf16-like noise of `size` that grows along the run (seeded)."""
    rng = random.Random(seed)
    base = [6.0 - 3.0 * (1 - math.exp(-t / 40)) + 0.05 * math.sin(t / 3) for t in range(steps)]
    return base, [x + size * (1 + t / 50) * rng.uniform(-1, 1) for t, x in enumerate(base)]


class VerdictTest(unittest.TestCase):
    def setUp(self):
        self.base, self.ref = curve(1)
        self.noise = curve(2)[1]

    def test_matching_accepted(self):
        j = tc.judge(self.ref, curve(3)[1], [self.noise])
        self.assertTrue(j["match"], j["reasons"])
        self.assertFalse(j["inconclusive"])
        self.assertLess(j["candidate"]["mean"], j["tolerance"]["mean"])
        self.assertEqual(j["tolerance"]["mean"], 3.0 * j["noise"]["mean"])

    def test_drift_rejected(self):
        cand = [x + 0.03 * t / 200 for t, x in enumerate(curve(3)[1])]
        j = tc.judge(self.ref, cand, [self.noise])
        self.assertFalse(j["match"])
        self.assertTrue(any("mean" in r for r in j["reasons"]))
        self.assertTrue(any("max" in r for r in j["reasons"]))

    def test_late_spike_rejected(self):
        cand = curve(3)[1]
        cand[180] += 0.1
        j = tc.judge(self.ref, cand, [self.noise])
        self.assertFalse(j["match"])
        self.assertEqual(j["candidate"]["argmax"], 180)
        self.assertTrue(any("step 180" in r for r in j["reasons"]))

    def test_several_noise_runs_take_the_larger(self):
        big = curve(4, size=8e-3)[1]
        cand = curve(3, size=6e-3)[1]
        self.assertFalse(tc.judge(self.ref, cand, [self.noise])["match"])
        self.assertTrue(tc.judge(self.ref, cand, [self.noise, big])["match"])

    def test_no_floor_and_nans(self):
        j = tc.judge(self.ref, curve(3)[1], [list(self.ref)])
        self.assertTrue(j["inconclusive"])
        self.assertFalse(j["match"])
        cand = curve(3)[1]
        cand[50] = float("nan")
        j = tc.judge(self.ref, cand, [self.noise])
        self.assertFalse(j["match"])
        self.assertFalse(j["inconclusive"])
        ref = list(self.ref)
        ref[10] = float("inf")
        j = tc.judge(ref, curve(3)[1], [self.noise])
        self.assertTrue(j["inconclusive"])
        with self.assertRaises(ValueError):
            tc.judge(self.ref, self.ref[:-1], [self.noise])
        with self.assertRaises(ValueError):
            tc.judge(self.ref, self.ref, [])
        with self.assertRaises(ValueError):
            tc.judge(self.ref, self.ref, [self.noise], factor=0)

    def test_judge_grads(self):
        errors = {"sdpa": {"wq": 4e-3, "wk": 5e-3}, "sdpa-math": {"wq": 6e-3, "wk": 4e-3},
                  "ok": {"wq": 1.5e-2, "wk": 1e-2}, "bad": {"wq": 2e-2, "wk": 5e-3},
                  "nan": {"wq": float("nan"), "wk": 5e-3}, "zero": {"wq": 0.0, "wk": 0.0}}
        g = tc.judge_grads(errors, "ok", ["sdpa", "sdpa-math"])
        self.assertTrue(g["match"], g["reasons"])
        self.assertEqual(g["peers"], {"wq": 6e-3, "wk": 5e-3})
        self.assertEqual(g["worst_kind"], "wq")
        g = tc.judge_grads(errors, "bad", ["sdpa", "sdpa-math"])
        self.assertFalse(g["match"])
        self.assertTrue(g["reasons"][0].startswith("step 0's wq gradients"))
        self.assertFalse(tc.judge_grads(errors, "nan", ["sdpa"])["match"])
        self.assertTrue(tc.judge_grads(errors, "ok", ["zero"])["inconclusive"])
        with self.assertRaises(ValueError):
            tc.judge_grads(errors, "missing", ["sdpa"])


class EndToEndTest(unittest.TestCase):
    """The whole comparison on a CPU, stand-ins in attntune's place (the summary calls them attntune)."""

    def compare(self, candidate):
        args, device = tiny()
        return tc.compare(args, device, candidate=candidate, out=quiet)

    def test_correct_implementation_accepted(self):
        s = self.compare(tc.SdpaAttention("math", "repeat"))
        self.assertEqual(list(s["runs"]), ["sdpa", "sdpa-math", "attntune"])
        self.assertEqual((s["verdict"], s["exit"]), ("match", 0), s["comparison"]["reasons"])
        self.assertLess(s["comparison"]["gradients"]["worst_ratio"], 1.5)
        self.assertEqual(len(s["runs"]["attntune"]["losses"]), 4)
        # Step 0's weights are the same everywhere: the forward alone differs.
        losses0 = [r["losses"][0] for r in s["runs"].values()]
        self.assertLess(max(losses0) - min(losses0), 1e-2)

    def test_wrong_backward_rejected(self):
        s = self.compare(wrong_backward(dk=0.9))
        self.assertEqual((s["verdict"], s["exit"]), ("mismatch", 1))
        g = s["comparison"]["gradients"]
        self.assertFalse(g["match"])
        self.assertEqual(g["worst_kind"], "wk")
        self.assertGreater(g["worst_ratio"], 6)

    def test_wrong_mask_rejected(self):
        s = self.compare(non_causal)
        self.assertEqual((s["verdict"], s["exit"]), ("mismatch", 1))
        self.assertFalse(s["comparison"]["match"])  # the curves too, not only the gradients

    def test_in_situ_table(self):
        lines = []
        args, device = tiny()
        s = tc.compare(args, device, candidate=tc.SdpaAttention("math", "repeat"), out=lines.append)
        rows = {r["side"]: r for r in s["in_situ"]["sides"]}
        self.assertEqual(list(rows), ["sdpa", "sdpa-math", "fp32", "attntune"])
        self.assertTrue(all(r["ok"] for r in rows.values()), rows)
        self.assertEqual([rows[n]["used"] for n in rows], ["reference", "noise", "gradient check's truth", "candidate"])
        text = "\n".join(lines)
        self.assertIn("in-situ check, layer 0's attention call", text)
        self.assertNotIn("IN-SITU CHECK FAILED", text)
        self.assertEqual(s["verdict_reasons"], [])
        self.assertIn("same-dtype", s["grad_check"])
        self.assertEqual(s["reference_check"]["flagged"], {})

    def test_candidate_failing_in_situ(self):
        lines = []
        args, device = tiny()
        s = tc.compare(args, device, candidate=wrong_backward(dk=0.9), out=lines.append)
        self.assertFalse(s["in_situ"]["sides"][-1]["ok"])
        self.assertEqual((s["verdict"], s["exit"]), ("mismatch", 1))
        self.assertIn("attntune fails the in-situ check", s["verdict_reasons"][0])
        self.assertIn("IN-SITU CHECK FAILED: attntune's attention is wrong", "\n".join(lines))

    def test_broken_reference_replaced(self):
        """The backend torch picks (CPU flash here, cuDNN in run 194) broken: the in-situ check says so
        before training and the first valid SDPA side, a noise run that passed, becomes the reference."""
        lines = []
        args, device = tiny("--noise-backend", "flash,math")
        with broken_sdpa(lambda a: a.backend is None):
            s = tc.compare(args, device, candidate=tc.SdpaAttention("math", "repeat"), out=lines.append)
        text = "\n".join(lines)
        self.assertIn("IN-SITU CHECK FAILED: the reference (SDPA auto -> flash, enable_gqa)", text)
        self.assertIn("the reference is SDPA flash, enable_gqa instead", text)
        rows = s["in_situ"]["sides"]
        self.assertEqual([(r["side"], r["ok"], r["used"]) for r in rows[:3]],
                         [("sdpa", False, "- (fails)"), ("sdpa-flash", True, "reference"),
                          ("sdpa-math", True, "noise")])
        self.assertEqual(list(s["runs"]), ["sdpa", "sdpa-math", "attntune"])
        self.assertEqual(s["runs"]["sdpa"]["attention"], "SDPA flash, enable_gqa")
        self.assertEqual((s["verdict"], s["exit"]), ("match", 0), s.get("comparison", {}).get("reasons"))

    def test_broken_reference_stops(self):
        # auto: no other valid backend than math on a CPU, and math is then the reference: no noise floor
        with broken_sdpa(lambda a: a.backend is None):
            s = self.compare(tc.SdpaAttention("math", "repeat"))
        self.assertEqual((s["verdict"], s["exit"]), ("inconclusive", 1))
        self.assertIn("no noise floor", s["verdict_reasons"][0])
        self.assertNotIn("runs", s)
        # pinned: no substitute
        args, device = tiny("--sdpa-backend", "math", "--noise-backend", "flash")
        with broken_sdpa(lambda a: a.backend == "math"):
            s = tc.compare(args, device, candidate=tc.SdpaAttention("math", "repeat"), out=quiet)
        self.assertEqual((s["verdict"], s["exit"]), ("inconclusive", 1))
        self.assertIn("pinned by --sdpa-backend math", s["verdict_reasons"][0])

    def test_reference_disagreeing_with_fp32_is_inconclusive(self):
        """A reference that passes the in-situ check but is broken in training (a state-dependent fault):
        step 0's gradients say so, and the verdict is inconclusive, never match (run 194's was match)."""
        lines = []
        args, device = tiny()
        with broken_sdpa(lambda a: a.backend is None, after_choice=True):
            s = tc.compare(args, device, candidate=tc.SdpaAttention("math", "repeat"), out=lines.append)
        self.assertTrue(s["in_situ"]["sides"][0]["ok"])
        self.assertEqual(list(s["reference_check"]["flagged"]), ["sdpa"])
        self.assertEqual((s["verdict"], s["exit"]), ("inconclusive", 1))
        self.assertTrue(s["verdict_reasons"][0].startswith("the reference disagrees with fp32 attention"))
        text = "\n".join(lines)
        self.assertIn("WARNING: step 0's gradients of sdpa", text)
        self.assertIn("verdict: inconclusive (the reference disagrees with fp32 attention: step 0's wk 1.1", text)
        # an SDPA-only run too
        args, device = tiny()
        with broken_sdpa(lambda a: a.backend is None, after_choice=True):
            s = tc.compare(args, device, out=quiet)
        self.assertEqual((s["verdict"], s["exit"]), ("inconclusive", 1))

    def test_noise_disagreeing_with_fp32_is_dropped(self):
        with broken_sdpa(lambda a: a.backend == "math", after_choice=True):
            s = self.compare(wrong_backward())  # SDPA, unchanged
        self.assertEqual(list(s["reference_check"]["flagged"]), ["sdpa-math"])
        self.assertEqual((s["verdict"], s["exit"]), ("inconclusive", 1))
        self.assertIn("no noise run agrees with fp32 attention", s["verdict_reasons"][0])


# A stand-in for an exported package (`attntune export --torch DIR` writes DIR/attntune/): the calls
# train_compare makes (default(), explain, set_policy, reset_coverage, coverage, attention with autograd),
# SDPA underneath, its kernels or fallbacks as FAKE_MODE says, so that --package's path runs on a CPU.
FAKE_PACKAGE = '''
import torch
import torch.nn.functional as F

FAKE_MODE = "kernels"  # "kernels", "explain_bwd_falls_back", "bwd_falls_back"


class _Lib:
    def __init__(self):
        self.calls, self.policy = {}, "sdpa"

    def explain(self, entry, dtype, head_dim, is_causal, b, h, hkv, s, sk, **kw):
        if entry == "attention_backward" and FAKE_MODE == "explain_bwd_falls_back":
            return -1, "no kernel for pass=bwd"
        return (0 if entry == "attention" else 1), "fake"

    def set_policy(self, fallback="sdpa", max_length_ratio=16.0):
        self.policy = fallback

    def reset_coverage(self):
        self.calls = {}

    def count(self, entry, q, k, kernel):
        b, h, s, d = q.shape
        key = (entry, b, h, k.shape[1], s, d, kernel)
        self.calls[key] = self.calls.get(key, 0) + 1

    def coverage(self):
        return [dict(entry=e, dtype="bf16", problem=dict(b=b, h=h, hkv=hkv, s=s, sk=s, d=d), calls=n, kernel=kernel,
                     label=None, fallback=None if kernel is not None else "fake fallback", tunable=kernel is None)
                for (e, b, h, hkv, s, d, kernel), n in self.calls.items()]


_LIB = _Lib()


def default():
    return _LIB


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        _LIB.count("attention", q, k, 0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        if FAKE_MODE == "bwd_falls_back":
            if _LIB.policy == "raise":
                raise RuntimeError("attntune.attention_backward: no tuned kernel for b=2,...,pass=bwd: fake")
            _LIB.count("attention_backward", q, k, None)
        else:
            _LIB.count("attention_backward", q, k, 1)
        xs = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            o = F.scaled_dot_product_attention(*xs, is_causal=True, enable_gqa=True)
            return torch.autograd.grad(o, xs, do)


def attention(q, k, v, *, is_causal=False, **kw):
    assert is_causal
    return _Attention.apply(q, k, v)
'''


class PackageTest(unittest.TestCase):
    """--package's path (load, explain, the raise policy, coverage, the verdict) over FAKE_PACKAGE."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        os.makedirs(os.path.join(cls.dir.name, "attntune"))
        with open(os.path.join(cls.dir.name, "attntune", "__init__.py"), "w") as f:
            f.write(FAKE_PACKAGE)
        cls.module = tc.load_attntune(os.path.join(cls.dir.name, "attntune"))  # DIR/attntune is taken too

    @classmethod
    def tearDownClass(cls):
        sys.modules.pop("attntune", None)
        sys.path.remove(cls.dir.name)
        cls.dir.cleanup()

    def compare(self, mode, *extra):
        self.module.FAKE_MODE = mode
        args = tc.resolve(tc.parser().parse_args(TINY + ["--package", self.dir.name, *extra]))
        return tc.compare(args, torch.device("cpu"), out=quiet)  # validate() wants CUDA for --package

    def test_kernels_everywhere(self):
        s = self.compare("kernels")
        self.assertEqual((s["verdict"], s["exit"]), ("match", 0), s.get("comparison", {}).get("reasons"))
        cov = s["attntune"]["coverage"]
        self.assertEqual(cov["kernel_calls"], {"attention": 2 * 4, "attention_backward": 2 * 4})  # layers x steps
        self.assertEqual((cov["fallback_calls"], cov["problems"]), (0, []))
        self.assertEqual(s["attntune"]["explain"]["attention_backward"]["kernel"], 1)
        self.assertEqual(self.module.default().policy, "raise")

    def test_explain_stops_a_fallback_before_training(self):
        s = self.compare("explain_bwd_falls_back")
        self.assertEqual((s["verdict"], s["exit"]), ("fallback", 1))
        self.assertNotIn("runs", s)

    def test_fallback_during_training(self):
        s = self.compare("bwd_falls_back")  # policy raise: the first backward stops the run
        self.assertEqual((s["verdict"], s["exit"]), ("fallback", 1))
        self.assertIn("no tuned kernel", s["attntune"]["failed"])
        s = self.compare("bwd_falls_back", "--allow-fallback")  # policy sdpa: counted, the curves still compared
        self.assertEqual((s["verdict"], s["exit"]), ("fallback", 1))
        self.assertEqual(s["attntune"]["coverage"]["fallback_calls"], 2 * 4)
        self.assertTrue(s["comparison"]["match"])


class CommandLineTest(unittest.TestCase):
    def main(self, *argv):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = tc.main(list(argv))
            except SystemExit as e:
                code = e.code
        return code, out.getvalue(), err.getvalue()

    def test_run_json_csv(self):
        with tempfile.TemporaryDirectory() as d:
            js, cs = os.path.join(d, "s.json"), os.path.join(d, "s.csv")
            argv = [a for a in TINY if a != "--no-bench"]
            code, out, err = self.main(*argv, "--steps", "3", "--json", js, "--csv", cs, "--bench-rounds", "1",
                                       "--bench-seconds", "0.01", "--log-every", "1")
            self.assertEqual(code, 0, err)
            with open(js) as f:
                summary = json.load(f)
            self.assertEqual(summary["verdict"], "sdpa only (no attntune run)")
            self.assertEqual(sorted(summary["runs"]), ["sdpa", "sdpa-math"])
            self.assertEqual(summary["config"]["params"], tc.param_count(tc.Config(64, 64, 2, 4, 2)))
            self.assertGreater(summary["attention_time"]["sdpa"]["fwd_bwd_ms"], 0)
            self.assertIn("wq", summary["grad_check"]["sdpa"])
            with open(cs) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual([r["step"] for r in rows], ["0", "1", "2"])
            self.assertIn("absdiff_sdpa-math", rows[0])
            self.assertAlmostEqual(float(rows[2]["loss_sdpa"]), summary["runs"]["sdpa"]["losses"][2], places=5)
        self.assertIn("verdict: sdpa only", out)
        self.assertIn("|sdpa-math - sdpa|", out)

    def test_smoke_defaults(self):
        args = tc.resolve(tc.parser().parse_args(["--smoke", "--layers", "3"]))
        self.assertEqual((args.layers, args.d_model, args.seqlen, args.steps), (3, 256, 256, 10))
        args = tc.resolve(tc.parser().parse_args([]))
        self.assertEqual((args.layers, args.d_model, args.heads, args.kv_heads, args.seqlen, args.steps, args.vocab),
                         (8, 2048, 16, 4, 4096, 200, 32000))

    def test_argument_errors(self):
        cases = [(["--heads", "6", "--kv-heads", "4"], "must be a multiple of --kv-heads 4"),
                 (["--steps", "4", "--warmup", "4"], "leaves no timed step"),
                 (["--d-model", "100", "--heads", "3", "--kv-heads", "1"], "not a multiple of --heads 3"),
                 (["--head-dim", "15"], "must be even"),
                 (["--noise-backend", "flash,bogus"], "unknown backend(s) bogus"),
                 (["--package", "/nonexistent"], "run on a CUDA device"),
                 (["--lr", "0"], "--lr must be a positive number"),
                 (["--steps", "0"], "--steps must be >= 1"),
                 (["--seqlen", "1"], "--seqlen must be >= 2"),
                 (["--data-copy", "1"], "--data-copy must be in [0, 1)"),
                 (["--noise-backend", "none", "--package", "/nonexistent"], "no noise floor")]
        for extra, message in cases:
            code, _, err = self.main(*TINY, *extra)
            self.assertEqual(code, 2, extra)
            self.assertIn(message, err, extra)

    def test_package_errors(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(ValueError, "no attntune package there"):
                tc.load_attntune(d)

    def test_coverage_count(self):
        class Lib:
            def __init__(self, rows):
                self.rows = rows

            def coverage(self):
                return self.rows
        p = {"b": 1, "h": 16, "hkv": 4, "s": 4096, "sk": 4096, "d": 128}
        good = [dict(entry="attention", dtype="bf16", problem=p, calls=16, kernel=0, fallback=None),
                dict(entry="attention_backward", dtype="bf16", problem=p, calls=16, kernel=1, fallback=None)]
        c = tc.attntune_coverage(Lib(good), layers=8, steps=2)
        self.assertEqual((c["fallback_calls"], c["problems"]), (0, []))
        bad = [good[0], dict(good[1], kernel=None, fallback="no kernel for pass=bwd")]
        c = tc.attntune_coverage(Lib(bad), layers=8, steps=2)
        self.assertEqual(c["fallback_calls"], 16)
        self.assertEqual(len(c["problems"]), 2)  # the fallback, and 0 of 16 backward calls on a kernel
        self.assertIn("no kernel for pass=bwd", c["problems"][0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
