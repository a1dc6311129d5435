# cuDNN SDPA back to back for SECONDS (default 3), for power and clock sampling: "B,H,S,D[,causal[,fp16]]"
import sys, time, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
f = sys.argv[1].split(",")
B, H, S, D = (int(x) for x in f[:4])
causal = len(f) > 4 and f[4] == "1"
dt = torch.float16 if len(f) > 5 and f[5] == "fp16" else torch.bfloat16
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt) for _ in range(3))
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    print(f"MARK cudnn-{sys.argv[1]} start {time.time():.3f}", flush=True)
    t0 = time.time(); n = 0
    while time.time() - t0 < secs:
        for _ in range(20): F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize(); n += 20
    t1 = time.time()
    print(f"MARK cudnn-{sys.argv[1]} end {t1:.3f} calls={n} us_per_call={(t1 - t0) / n * 1e6:.1f}", flush=True)
