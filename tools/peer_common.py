"""What the peer-timing tools share (tools/compare_varlen.py, tools/compare_chunked.py, and
tools/compare_sdpa.py its problem specs): messages, attntune's problem specs (parse and print), the
command line of a run and its checks, the visible (query, key) pairs of a sequence, the PyTorch
package's files, the FA4 kit's folders, torch set up for a run, a float32 reference of one sequence,
the graph-replay sampler, the timing schedule and the summary of its samples. Nothing here imports
torch at import time (the tools' --dry-run runs without it); the GPU side takes torch as an argument
or imports it when called."""
import argparse
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T0 = time.time()
# FlashAttention-2-style absolute error allowed against the float32 reference
ATOL = {"bf16": 2e-2, "fp16": 5e-3}
# the output's own rounding (half an ulp, relative), allowed on top of ATOL: a correct bf16 output of
# magnitude 4..8 is up to 1.6e-2 off the float32 reference from its rounding alone
RTOL = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
BACKENDS = ("cudnn", "flash", "efficient")  # the default; "math" too on request (--backends)


def fmt(x, w, spec):
    return f"{x:>{w}{spec}}" if isinstance(x, (int, float)) and x == x else f"{'-':>{w}}"


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def short(e, n=200):
    t = " ".join(f"{type(e).__name__}: {e}".split())
    return t if len(t) <= n else t[:n - 3] + "..."


class Parser(argparse.ArgumentParser):
    """Bad input: one line on stderr, exit 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (--help says more)\n")
        sys.exit(2)


# ---------------------------------------------------------------- problems

SPEC_KEYS = ("b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page", "varlen", "lens_seed")
# Problem::parse's ranges (tuner/core/problem.cpp); page, varlen and lens_seed may be 0 (not set)
MAX = {"b": 1 << 20, "h": 1 << 16, "hkv": 1 << 16, "s": 1 << 24, "sk": 1 << 24, "d": 1024, "page": 1 << 20,
       "varlen": 1 << 24, "lens_seed": (1 << 63) - 1}


def parse_spec(spec):
    """attntune's problem spec (Problem::parse) as a dict: b, h, hkv, s, sk, d, page, varlen, lens_seed as
    ints (hkv and sk default to h and s, the others to 0), dtype, causal as a bool. ValueError naming what
    is wrong; each tool adds what it times (a paged cache, a packed batch)."""
    d = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"problem {spec!r}: {part!r} is not key=value")
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in SPEC_KEYS:
            raise ValueError(f"problem {spec!r}: unknown key {k!r} (known: {', '.join(SPEC_KEYS)})")
        if k in d:
            raise ValueError(f"problem {spec!r}: key {k!r} given twice")
        d[k] = v
    missing = [k for k in ("b", "h", "s", "d", "dtype", "causal") if k not in d]
    if missing:
        raise ValueError(f"problem {spec!r}: missing {missing}")
    p = {}
    for k in ("b", "h", "hkv", "s", "sk", "d", "page", "varlen", "lens_seed"):
        text = d.get(k, d["h"] if k == "hkv" else d["s"] if k == "sk" else "0")
        try:
            p[k] = int(text)
        except ValueError:
            raise ValueError(f"problem {spec!r}: {k}={text!r} is not an integer") from None
        lo = 0 if k in ("page", "varlen", "lens_seed") else 1
        if not lo <= p[k] <= MAX[k]:
            raise ValueError(f"problem {spec!r}: {k}={p[k]} is out of range [{lo}, {MAX[k]}]")
    p["dtype"] = d["dtype"]
    if p["dtype"] not in ATOL:
        raise ValueError(f"problem {spec!r}: dtype must be bf16 or fp16")
    if d["causal"].lower() not in ("0", "1", "true", "false"):
        raise ValueError(f"problem {spec!r}: causal must be 0 or 1")
    p["causal"] = d["causal"].lower() in ("1", "true")
    if p["h"] % p["hkv"]:
        raise ValueError(f"problem {spec!r}: h={p['h']} is not a multiple of hkv={p['hkv']}")
    return p


def problem_str(p):
    """attntune's canonical problem spec (Problem::str)."""
    out = (f"b={p['b']},h={p['h']},hkv={p['hkv']},s={p['s']},sk={p['sk']},d={p['d']},dtype={p['dtype']},"
           f"causal={1 if p['causal'] else 0}")
    out += f",page={p['page']}" if p.get("page") else ""
    if p.get("varlen"):
        out += f",varlen={p['varlen']}" + (f",lens_seed={p['lens_seed']}" if p.get("lens_seed") else "")
    return out


# ---------------------------------------------------------------- a run's command line

def add_run_args(ap, groups, all_rounds_help, dry_run_help, seed_help="seed of the random inputs"):
    """The options every run takes, after the tool's own (--package, --problem, ...)."""
    ap.add_argument("--fa4-aot", action="append", default=[], help="FA4 kit kernel folder (default .fa4/aot)")
    ap.add_argument("--fa4-kit", help="folder with the kit's fa4kit.py (default: beside --fa4-aot, else .fa4)")
    ap.add_argument("--contenders", default=",".join(groups), help=f"comma list of {', '.join(groups)}")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="SDPA backends to try")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.0, help="GPU time per sample (default 1)")
    ap.add_argument("--screen-seconds", type=float, default=0.5, help="the SDPA variants' screening sample")
    ap.add_argument("--warmup-seconds", type=float, help="the untimed warm-up sample (default --min-seconds)")
    ap.add_argument("--calls", type=int, default=10, help="calls per CUDA graph")
    ap.add_argument("--all-rounds", action="store_true", help=all_rounds_help)
    ap.add_argument("--atol", type=float, help="max abs error allowed (default 2e-2 bf16, 5e-3 fp16)")
    ap.add_argument("--lse-atol", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help=seed_help)
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--dry-run", action="store_true", help=dry_run_help)
    ap.add_argument("--device", default="cuda",
                    help="cuda; or cpu: correctness only, no timing, no FA4 (tests the tool without a GPU, with"
                         " --backends math; a package's CPU call is its SDPA fallback, which policy 'raise' refuses)")


def check_run_args(ap, args, groups):
    """add_run_args' options checked (ap.error otherwise): (the contenders asked for, in `groups`' order,
    the SDPA backends)."""
    asked = [g.strip() for g in args.contenders.split(",") if g.strip()]
    bad = sorted(set(asked) - set(groups))
    if bad:
        ap.error(f"--contenders: unknown {', '.join(repr(b) for b in bad)} (known: {', '.join(groups)})")
    if not asked:
        ap.error("--contenders: empty")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if set(backends) - set(BACKENDS + ("math",)):
        ap.error(f"--backends: of {', '.join(BACKENDS + ('math',))}")
    if args.device not in ("cuda", "cpu"):
        ap.error("--device: cuda or cpu")
    if args.rounds < 1 or args.calls < 1 or not (args.min_seconds >= 0) or not (args.screen_seconds >= 0):
        ap.error("--rounds and --calls must be >= 1, --min-seconds and --screen-seconds >= 0")
    return [g for g in groups if g in asked], backends  # one order, no repeats


def write_json(path, out):
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    log(f"wrote {path}")

def seq_pairs(lq, lk, causal):
    """Visible (query, key) pairs of one sequence; causal bottom-right: query i sees
    min(lk, max(0, i + lk - lq + 1)) keys."""
    if not causal:
        return lq * lk
    off = lk - lq
    lo = min(lq, max(0, -off))
    hi = min(lq, max(lo, lk - off - 1))
    part = (hi - lo) * ((lo + off + 1) + (hi + off)) // 2 if hi > lo else 0
    return part + (lq - hi) * lk


# ---------------------------------------------------------------- the package and the FA4 kit

def package_root(d):
    """The folder to put on sys.path for `import attntune` of the package in d."""
    d = os.path.abspath(d)
    if os.path.isfile(os.path.join(d, "attntune", "__init__.py")):
        return d
    if os.path.basename(d) == "attntune" and os.path.isfile(os.path.join(d, "__init__.py")):
        return os.path.dirname(d)
    raise FileNotFoundError(f"{d}: no attntune/__init__.py (a folder `attntune export --torch DIR` wrote)")


def kernels_cu(d):
    return os.path.join(package_root(d), "attntune", "kernels.cu")


def aot_dirs(args):
    return args.fa4_aot or ([os.path.join(ROOT, ".fa4", "aot")] if os.path.isdir(os.path.join(ROOT, ".fa4", "aot"))
                            else [])


def kit_dir(args, dirs):
    if args.fa4_kit:
        return args.fa4_kit
    return next((d for d in [os.path.dirname(os.path.abspath(x)) for x in dirs] + [os.path.join(ROOT, ".fa4")]
                 if os.path.isfile(os.path.join(d, "fa4kit.py"))), None)


def load_kit(args, has, lacks):
    """(fa4kit module, aot dirs, None) or (None, dirs, why not); `has(fa4kit)` says whether the kit
    offers what the tool calls (else `lacks`, naming the kit folder with {kit})."""
    dirs = aot_dirs(args)
    if not dirs:
        return None, dirs, "no FA4 kernels (no .fa4/aot; --fa4-aot DIR)"
    kit = kit_dir(args, dirs)
    if not kit or not os.path.isfile(os.path.join(kit, "fa4kit.py")):
        return None, dirs, f"no fa4kit.py beside {dirs} (--fa4-kit DIR)"
    sys.path.insert(0, kit)
    sys.dont_write_bytecode = True  # the kit folder may be read-only
    try:
        import fa4kit
    except Exception as e:  # noqa: BLE001
        return None, dirs, f"fa4kit.py did not import: {short(e)}"
    if not has(fa4kit):
        return None, dirs, lacks.format(kit=kit)
    return fa4kit, dirs, None


# ---------------------------------------------------------------- GPU side (torch passed in)

class Run:
    """torch for a run: TF32 off (the references are float32), the problem's dtype (`dt`), SDPA's
    backends by name (`backend`), `sdpa_kernel`, and what ran it (`env`: torch, CUDA, cuDNN, the GPU),
    logged."""

    def __init__(self, dtype, device):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpu_timing
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.torch, self.F, self.sdpa_kernel, self.device = torch, F, sdpa_kernel, device
        self.dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        self.backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        self.env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
        if device == "cuda":
            prop = torch.cuda.get_device_properties(0)
            self.env.update(cudnn=torch.backends.cudnn.version(), gpu=prop.name, sms=prop.multi_processor_count)
            log(f"torch {self.env['torch']} cuda {self.env['cuda']} cudnn {self.env['cudnn']}; {prop.name} "
                f"({prop.multi_processor_count} SMs)")
        else:
            self.env["gpu"] = "cpu"
            log(f"torch {self.env['torch']} on the CPU: correctness only, no timing")

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()


def reference_seq(torch, q, k, v, causal, scale, max_bytes=1 << 30):
    """float32 attention of one sequence: q [H, lq, D], k/v [Hkv, lk, D] -> (out [H, lq, D], lse [H, lq]);
    bottom-right causal; a row that sees no key gives 0 and LSE -inf. Chunks heads."""
    H, lq, D = q.shape
    Hkv, lk = k.shape[0], k.shape[1]
    g = H // Hkv
    out = torch.zeros(H, lq, D, device=q.device, dtype=torch.float32)
    lse = torch.full((H, lq), float("-inf"), device=q.device, dtype=torch.float32)
    if lq == 0 or lk == 0:
        return out, lse
    mask = None
    if causal:
        i = torch.arange(lq, device=q.device)[:, None]
        j = torch.arange(lk, device=q.device)[None, :]
        mask = j > i + (lk - lq)
    hc = max(1, min(H, max_bytes // max(1, lq * lk * 4)))
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        kvh = torch.arange(h0, h1, device=q.device) // g
        s = torch.matmul(q[h0:h1].float(), k.index_select(0, kvh).float().transpose(-1, -2)).mul_(scale)
        if mask is not None:
            s.masked_fill_(mask, float("-inf"))
        l = torch.logsumexp(s, dim=-1)
        pm = torch.exp(s - torch.where(torch.isinf(l), torch.zeros_like(l), l)[..., None])
        out[h0:h1] = torch.matmul(pm, v.index_select(0, kvh).float())
        lse[h0:h1] = l
        del s, pm
    return out, lse


class Timer:
    """One contender's graph; a sample replays it back to back between two CUDA events, as many
    times as span the sample's target (the replay count learnt from the samples before)."""

    def __init__(self, torch, graph, calls, min_s):
        self.torch, self.g, self.calls, self.min_s = torch, graph, calls, min_s
        self.ms_per_replay = max(self._run(1), 1e-3)

    def _run(self, n):
        t = self.torch
        a, b = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            self.g.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    def sample(self, seconds=None):
        """Microseconds per call over one sample of at least `seconds` (default --min-seconds) of GPU time."""
        target = 1000.0 * (self.min_s if seconds is None else seconds)
        n = max(1, math.ceil(target * 1.03 / self.ms_per_replay))
        while True:
            ms = self._run(n)
            self.ms_per_replay = max(ms / n, 1e-3)
            if ms >= target:
                return ms * 1000.0 / (n * self.calls)
            n = max(n + 1, math.ceil(target * 1.05 / self.ms_per_replay))


def time_contenders(torch, cands, res, args, sdpa_groups):
    """The tools' timing, after their checks: each contender's fn (cands[name]["fn"]) captured as
    --calls calls in a CUDA graph and replayed once; an untimed warm-up of each (--warmup-seconds,
    else --min-seconds: the GPU reaches its steady clock); a screening sample (--screen-seconds) of
    each SDPA variant (cands[name]["group"] in sdpa_groups), keeping the fastest of each group for
    the rounds (all of them with --all-rounds); then --rounds interleaved rounds, the order rotated
    each round. Samples go to res[name]["samples_us"]; a contender that fails gets
    res[name]["error"] and drops out. Returns (a capture failed, a timing failed, the GPU's state
    before, after)."""
    import contextlib

    import gpu_timing  # graph capture and GPU state, as compare_sdpa.py's

    def sync():
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()

    timers, capture_failed, timing_failed = {}, False, False
    for name, c in cands.items():
        try:
            g = gpu_timing.capture(c["fn"], args.calls)
            g.replay()
            torch.cuda.synchronize()
            timers[name] = Timer(torch, g, args.calls, args.min_seconds)
        except Exception as e:  # noqa: BLE001
            res[name]["error"] = f"graph capture: {short(e, 300)}"
            log(f"{name}: not timed: {res[name]['error']}")
            capture_failed = True
            sync()
    before = gpu_timing.gpu_state()
    warm = args.min_seconds if args.warmup_seconds is None else args.warmup_seconds
    for t in timers.values():
        t.sample(warm)
    sdpa_names = [n for n in timers if cands[n]["group"] in sdpa_groups]
    for n in list(sdpa_names):
        try:
            res[n]["screen_us"] = timers[n].sample(args.screen_seconds)
        except Exception as e:  # noqa: BLE001
            res[n]["error"] = f"timing: {short(e, 300)}"
            sdpa_names.remove(n)
            del timers[n]
    if sdpa_names:
        log("screen (us): " + ", ".join(f"{n} {res[n]['screen_us']:.1f}" for n in sdpa_names))
    order = [n for n in timers if n not in sdpa_names]
    for grp in sdpa_groups:
        members = [n for n in sdpa_names if cands[n]["group"] == grp]
        if members:
            order += members if args.all_rounds else [min(members, key=lambda n: res[n]["screen_us"])]
    for r in range(args.rounds):
        rot = order[r % len(order):] + order[:r % len(order)] if order else []
        msg = []
        for n in rot:
            if n not in timers:
                continue
            try:
                us = timers[n].sample()
            except Exception as e:  # noqa: BLE001 - reported; the others go on
                res[n]["error"] = f"timing: {short(e, 300)}"
                timing_failed = True
                del timers[n]
                msg.append(f"{n}=ERROR")
                sync()
                continue
            res[n].setdefault("samples_us", []).append(us)
            msg.append(f"{n}={us:.1f}")
        log(f"round {r + 1}/{args.rounds}: " + " ".join(msg))
    after = gpu_timing.gpu_state()
    return capture_failed, timing_failed, before, after


def summarise(res, base, rounds, flops_of, key, exclude=()):
    """Each timed contender's median over its samples (res[n]["us"]; a screening sample's where it has
    none: screen_only) and TFLOP/s of flops_of(n); its time over `base`'s as res[n][key] (not for base
    nor `exclude`), with the range of the per-round ratios (key_min, key_max) when both have a sample
    in every one of the `rounds`."""
    b = res.get(base, {})
    base_s = b.get("samples_us") if len(b.get("samples_us") or []) == rounds else None
    for n, r in res.items():
        if r.get("samples_us"):
            r["us"] = statistics.median(r["samples_us"])
            r["rounds"] = len(r["samples_us"])
        elif r.get("screen_us"):
            r["us"], r["screen_only"] = r["screen_us"], True
    for n, r in res.items():
        if not r.get("us"):
            continue
        r["tflops"] = flops_of(n) / (r["us"] * 1e6)
        if n == base or n in exclude or not b.get("us"):
            continue
        r[key] = r["us"] / b["us"]
        if base_s and len(r.get("samples_us") or []) == len(base_s):
            ratios = [x / o for x, o in zip(r["samples_us"], base_s)]
            r[key + "_min"], r[key + "_max"] = min(ratios), max(ratios)
