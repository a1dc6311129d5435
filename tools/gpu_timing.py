"""CUDA-graph capture and the GPU's state, shared by tools/compare_sdpa.py and
tools/compare_varlen.py (and tests/torch/test_ops_gpu.py through compare_sdpa). No import side
effects beyond torch."""
import subprocess
import time

import torch


def capture(fn, calls):
    """`calls` calls of fn captured in one CUDA graph (after 3 eager calls on the capture stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g



def gpu_state():
    """'T C, SM F MHz, P W' of this process's GPU from nvidia-smi, or None where it cannot say.
    Under the power cap a hot GPU runs kernels 2-4% slower, ours more than cuDNN
    (docs/log/PERFORMANCE.md runs 55-59), so each timing prints the state it started and ended in."""
    def query(sel):
        out = subprocess.run(["nvidia-smi", *sel, "--query-gpu=temperature.gpu,clocks.sm,power.draw",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None

    try:
        uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "") or "")
        line = query(["-i", uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"]) if uuid else None
        if line is None and torch.cuda.device_count() == 1:  # one GPU: no doubt which line is ours
            line = query([])
        if line is None:
            return None
        t, c, w = [x.strip() for x in line.split(",")[:3]]
        return f"{t} C, SM {c} MHz, {float(w):.0f} W"
    except Exception:  # no nvidia-smi, an unexpected format: the timing goes on without it
        return None


def timed(fn, calls, min_seconds):
    """Median-free single sample: us per call over replays of a graph of `calls` calls, replayed a
    fixed count chosen once so that a sample lasts about min_seconds."""
    g = capture(fn, calls)
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    reps = max(1, int(min_seconds / max(one, 1e-6)))
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1e3 / (reps * calls)
