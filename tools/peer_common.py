"""What the peer-timing tools share (tools/compare_varlen.py, tools/compare_chunked.py): messages, the
visible (query, key) pairs of a sequence, the PyTorch package's files, the FA4 kit's folders, a
float32 reference of one sequence, the graph-replay sampler and the timing schedule. Nothing here imports torch at
import time (the tools' --dry-run runs without it); the GPU side takes torch as an argument."""
import math
import os
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


# ---------------------------------------------------------------- problems

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
