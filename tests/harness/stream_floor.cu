// Streaming-read floor of the GPU: how fast can one kernel read N bytes of HBM, by which grid and
// load path? The decode family's rows are judged by bytes moved, so this is the ceiling its
// kernels are measured against (docs/design/flash_decode.md, "The floor"). Not part of the tool:
// a measurement harness, built and run by hand on the GPU machine.
//
//   nvcc -O3 -arch=sm_90a -std=c++17 -o stream_floor tests/harness/stream_floor.cu
//   ./stream_floor [seconds_per_row]
//
// Modes (each CTA reads its own contiguous slice unless said):
//   ldg    G CTAs x T threads, U independent 16-byte ld.global.nc per thread in flight
//   rows   the decode layout [sk, 8 heads, 128 d] bf16 for K and for V: CTA (split, head) reads its
//          head's 256-byte rows (2 KiB apart) of its key range, K then V per tile, U tiles of rows
//   bulk   one thread issues cp.async.bulk copies of CH bytes into an S-stage shared ring with
//          mbarriers; 4 consumer warps wait on each stage, read it, and release it
//   grid   a grid-stride loop of 16 CTAs per SM over the whole buffer
//   tma    K and V of b=1, 8 KV heads, d=128 bf16 by TMA tensor boxes into an S-stage ring of
//          BN-key K+V tiles (flash_decode's producer), CTA (split, head) unless said; variants:
//          0 [head][key][128] box (64, BN): two half-row boxes a tile (the kernel's dense map)
//          1 [head][key][128] as (64, 2, rows), box (64, 2, BN): whole rows, one box a tile
//          2 [key][head][128] as (64, 2, 8, keys), box (64, 2, 1, BN): whole rows of one head
//          3 [key][head][128] box (64, 1, BN): half rows of one head (the kernel's kvcache map)
//          4 [key][head][128] box (64, 2, 8, BN / 8): every head of BN / 8 keys (CTA = split)
// Timing: a CUDA graph of 20 launches replayed for the given seconds, median per launch.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__device__ __forceinline__ uint4 ldg_nc(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int U>
__global__ void k_ldg(const uint4* __restrict__ buf, size_t n16, unsigned* out) {
  const size_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const size_t lo = blockIdx.x * per, hi = min(n16, lo + per);
  unsigned acc = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += size_t(blockDim.x) * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t j = i + size_t(u) * blockDim.x;
      v[u] = j < hi ? ldg_nc(buf + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

template <int U>
__global__ void k_grid(const uint4* __restrict__ buf, size_t n16, unsigned* out) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += stride * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t j = i + size_t(u) * stride;
      v[u] = j < n16 ? ldg_nc(buf + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// Decode layout: K then V, each [sk][8][128] bf16 (rows of 256 bytes, a key's heads 2 KiB apart).
// blockIdx.x = split (fastest) or head (heads_fast), 256 threads: 16 chunks x 16 rows per pass.
template <int U>
__global__ void k_rows(const uint4* __restrict__ buf, int sk, int splits, int heads_fast, unsigned* out) {
  const int heads = 8;
  int split, head;
  if (heads_fast) { head = blockIdx.x % heads; split = blockIdx.x / heads; }
  else { split = blockIdx.x % splits; head = blockIdx.x / splits; }
  const int per = (sk + splits - 1) / splits;
  const int k0 = split * per, k1 = min(sk, k0 + per);
  const uint4* K = buf;
  const uint4* V = buf + size_t(sk) * heads * 16;
  const int chunk = threadIdx.x & 15, r = threadIdx.x >> 4;  // 16 rows per pass
  unsigned acc = 0;
  for (int k = k0 + r; k < k1; k += 16 * U) {
    uint4 v[2 * U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + 16 * u;
      const size_t off = (size_t(kk) * heads + head) * 16 + chunk;
      v[2 * u] = kk < k1 ? ldg_nc(K + off) : make_uint4(0, 0, 0, 0);
      v[2 * u + 1] = kk < k1 ? ldg_nc(V + off) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 2 * U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) out[0] = acc;
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)));
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned phase) {
  asm volatile(
      "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}\n" ::"r"(
          smem_u32(b)),
      "r"(phase));
}

// The ring the bulk and tma modes stream through: S stages of stage_bytes, each with a full
// barrier (the producer's arrival plus the bytes) and an empty one (the 4 consumer warps).
struct Ring {
  uint64_t* full;
  uint64_t* empty;
  char* data;
  int S, stage_bytes;
  // All threads: thread 0 initializes the barriers.
  __device__ void init() const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < S; ++s) { mbar_init(full + s, 1); mbar_init(empty + s, 4); }
      asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
  }
  // The producer: the stage of step i, once its consumers released it.
  __device__ int acquire(int i) const {
    const int s = i % S;
    if (i >= S) mbar_wait(empty + s, ((i / S) - 1) & 1);
    return s;
  }
  // Warps 0..3: wait on each of `steps` stages, read one 16-byte chunk a thread per 2 KiB of it,
  // release it.
  __device__ unsigned consume(int steps) const {
    unsigned acc = 0;
    for (int i = 0; i < steps; ++i) {
      const int s = i % S;
      mbar_wait(full + s, (i / S) & 1);
      const uint4* st = reinterpret_cast<const uint4*>(data + size_t(s) * stage_bytes);
      for (int j = threadIdx.x; j < stage_bytes / 16; j += 128 * 16) {
        const uint4 v = st[j];
        acc ^= v.x ^ v.w;
      }
      __syncwarp();
      if ((threadIdx.x & 31) == 0) mbar_arrive(empty + s);
    }
    return acc;
  }
  // The whole CTA: thread 128 (warp 4) calls issue(i, stage) for each of `steps` steps once the
  // stage is free; warps 0..3 consume. Returns the consumers' checksum (0 in warp 4).
  template <class Issue>
  __device__ unsigned stream(int steps, Issue issue) const {
    if (threadIdx.x / 32 != 4) return consume(steps);
    if (threadIdx.x == 128)
      for (int i = 0; i < steps; ++i) issue(i, acquire(i));
    return 0;
  }
};

// One producer thread (warp 4) streams the CTA's slice in CH-byte bulk copies into S stages;
// warps 0..3 wait, read one 16-byte chunk per thread per 2 KiB, release.
__global__ void k_bulk(const char* __restrict__ buf, size_t n, int S, int CH, unsigned* out) {
  extern __shared__ __align__(128) char smem[];
  const Ring ring{reinterpret_cast<uint64_t*>(smem), reinterpret_cast<uint64_t*>(smem) + 8, smem + 128, S, CH};
  const size_t per = ((n + gridDim.x - 1) / gridDim.x + CH - 1) / CH * CH;
  const size_t lo = blockIdx.x * per, hi = min(n, lo + per);
  const int steps = lo < hi ? int((hi - lo + CH - 1) / CH) : 0;
  ring.init();
  const unsigned acc = ring.stream(steps, [&](int i, int s) {
    const size_t off = lo + size_t(i) * CH;
    const unsigned bytes = unsigned(min(size_t(CH), hi - off));
    mbar_expect_tx(ring.full + s, bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(ring.data + size_t(s) * CH)),
        "l"(buf + off), "r"(bytes), "r"(smem_u32(ring.full + s))
        : "memory");
  });
  if (acc == 0x9e3779b9u) out[0] = acc;
}

// flash_decode's producer, without the math: one thread issues each stage's K and V boxes; 4
// consumer warps wait on the stage, read a little of it, and release it.
__global__ void k_tma(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, int variant,
                      int sk, int splits, int BN, int S, unsigned* out) {
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int tile = BN * 256;
  const Ring ring{reinterpret_cast<uint64_t*>(smem), reinterpret_cast<uint64_t*>(smem) + 8, smem + 1024, S, 2 * tile};
  // CTA (split, head); variant 4: CTA = split, every head in each box.
  const int split = variant == 4 ? blockIdx.x : blockIdx.x % splits;
  const int head = variant == 4 ? 0 : blockIdx.x / splits;
  const int per = sk / splits, k0 = split * per;
  const int keys_per_tile = variant == 4 ? BN / 8 : BN;
  const int steps = per / keys_per_tile;
  ring.init();
  const unsigned acc = ring.stream(steps, [&](int i, int s) {
    mbar_expect_tx(ring.full + s, 2 * tile);
    const int key = k0 + i * keys_per_tile;
    for (int kv = 0; kv < 2; ++kv) {
      const CUtensorMap* m = kv ? &mv : &mk;
      const unsigned dst = smem_u32(ring.data + size_t(s) * 2 * tile + kv * tile);
      const unsigned bar = smem_u32(ring.full + s);
      if (variant == 0) {
        for (int c = 0; c < 2; ++c)
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
                  dst + c * (tile / 2)),
              "l"(m), "r"(c * 64), "r"(head * sk + key), "r"(bar)
              : "memory");
      } else if (variant == 1) {
        asm volatile(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
                dst),
            "l"(m), "r"(0), "r"(0), "r"(head * sk + key), "r"(bar)
            : "memory");
      } else if (variant == 3) {
        for (int c = 0; c < 2; ++c)
          asm volatile(
              "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
                  dst + c * (tile / 2)),
              "l"(m), "r"(c * 64), "r"(head), "r"(key), "r"(bar)
              : "memory");
      } else {
        asm volatile(
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(
                dst),
            "l"(m), "r"(0), "r"(0), "r"(variant == 2 ? head : 0), "r"(key), "r"(bar)
            : "memory");
      }
    }
  });
  if (acc == 0x9e3779b9u) out[0] = acc;
}

using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static EncodeFn encode_fn() {
  static EncodeFn fn = nullptr;
  if (!fn) {
    cudaDriverEntryPointQueryResult q;
    void* p = nullptr;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    fn = reinterpret_cast<EncodeFn>(p);
  }
  return fn;
}

// K or V of b=1, 8 heads, sk keys, d=128 bf16 at base, as variant v sees it.
static CUtensorMap make_map(void* base, int variant, int sk, int BN) {
  CUtensorMap m;
  cuuint64_t dims[4], strides[3];
  cuuint32_t box[4], es[4] = {1, 1, 1, 1};
  int rank;
  if (variant == 0) {
    rank = 2; dims[0] = 128; dims[1] = cuuint64_t(sk) * 8; strides[0] = 256; box[0] = 64; box[1] = BN;
  } else if (variant == 1) {
    rank = 3; dims[0] = 64; dims[1] = 2; dims[2] = cuuint64_t(sk) * 8; strides[0] = 128; strides[1] = 256;
    box[0] = 64; box[1] = 2; box[2] = BN;
  } else if (variant == 3) {
    rank = 3; dims[0] = 128; dims[1] = 8; dims[2] = sk; strides[0] = 256; strides[1] = 2048;
    box[0] = 64; box[1] = 1; box[2] = BN;
  } else {
    rank = 4; dims[0] = 64; dims[1] = 2; dims[2] = 8; dims[3] = sk; strides[0] = 128; strides[1] = 256;
    strides[2] = 2048; box[0] = 64; box[1] = 2; box[2] = variant == 2 ? 1 : 8; box[3] = variant == 2 ? BN : BN / 8;
  }
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims, strides, box, es,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled variant %d failed: %d\n", variant, int(r));
    std::exit(1);
  }
  return m;
}

struct Row {
  const char* mode;
  size_t bytes;
  int grid, threads, u, s, ch, heads_fast;
};

static double time_row(const Row& r, const char* buf, unsigned* out, double seconds, cudaStream_t st) {
  auto launch = [&]() {
    const size_t n16 = r.bytes / 16;
    const uint4* b4 = reinterpret_cast<const uint4*>(buf);
    if (!std::strcmp(r.mode, "ldg")) {
      if (r.u == 4) k_ldg<4><<<r.grid, r.threads, 0, st>>>(b4, n16, out);
      else if (r.u == 8) k_ldg<8><<<r.grid, r.threads, 0, st>>>(b4, n16, out);
      else k_ldg<16><<<r.grid, r.threads, 0, st>>>(b4, n16, out);
    } else if (!std::strcmp(r.mode, "grid")) {
      if (r.u == 4) k_grid<4><<<r.grid, r.threads, 0, st>>>(b4, n16, out);
      else k_grid<8><<<r.grid, r.threads, 0, st>>>(b4, n16, out);
    } else if (!std::strcmp(r.mode, "rows")) {
      const int sk = int(r.bytes / 2 / (8 * 256));
      const int splits = r.grid / 8;
      if (r.u == 4) k_rows<4><<<r.grid, 256, 0, st>>>(b4, sk, splits, r.heads_fast, out);
      else if (r.u == 8) k_rows<8><<<r.grid, 256, 0, st>>>(b4, sk, splits, r.heads_fast, out);
      else k_rows<16><<<r.grid, 256, 0, st>>>(b4, sk, splits, r.heads_fast, out);
    } else if (!std::strcmp(r.mode, "tma")) {
      // r.u = variant, r.ch = BN; the CTA grid: 8 heads x splits (variant 4: splits = grid)
      const int sk = int(r.bytes / 2 / (8 * 256));
      const int splits = r.u == 4 ? r.grid : r.grid / 8;
      const CUtensorMap mk = make_map(const_cast<char*>(buf), r.u, sk, r.ch);
      const CUtensorMap mv = make_map(const_cast<char*>(buf) + r.bytes / 2, r.u, sk, r.ch);
      k_tma<<<r.grid, 160, 1024 + 1024 + size_t(r.s) * 2 * r.ch * 256, st>>>(mk, mv, r.u, sk, splits, r.ch,
                                                                           r.s, out);
    } else {
      k_bulk<<<r.grid, 160, 128 + size_t(r.s) * r.ch, st>>>(buf, r.bytes, r.s, r.ch, out);
    }
  };
  launch();
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) launch();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  float total = 0;
  CK(cudaGraphLaunch(ge, st));
  while (total < seconds * 1000) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / 20);
    total += t;
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ms[ms.size() / 2] * 1000.0;  // us
}

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs\n", prop.name, sms);
  const size_t mb134 = size_t(134217728), mb536 = 4 * mb134;
  char* buf;
  unsigned* out;
  CK(cudaMalloc(&buf, mb536));
  CK(cudaMalloc(&out, 64));
  CK(cudaMemset(buf, 1, mb536));
  CK(cudaFuncSetAttribute(k_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  CK(cudaFuncSetAttribute(k_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  const char* only = std::getenv("FLOOR_ONLY");  // a mode name: run only its rows
  std::vector<int> grids = {128, 256};           // tma rows' grids (FLOOR_TMA_GRIDS: a comma list)
  if (const char* g = std::getenv("FLOOR_TMA_GRIDS")) {
    grids.clear();
    for (const char* c = g; *c; ++c)
      if (c == g || c[-1] == ',') grids.push_back(std::atoi(c));
  }
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  std::vector<Row> rows;
  for (size_t n : {mb134, mb536}) {
    // tma: variant in u, BN in ch
    for (int v : {0, 1, 2, 3, 4})
      for (int g : grids) {
        rows.push_back({"tma", n, g, 160, v, g > 132 ? 3 : 6, 64, 0});
        if (g == 128) rows.push_back({"tma", n, g, 160, v, 3, 128, 0});
      }
    rows.push_back({"grid", n, sms * 16, 256, 4, 0, 0, 0});
    rows.push_back({"grid", n, sms * 8, 512, 8, 0, 0, 0});
    for (int g : {128, sms, 256, 2 * sms})
      for (int t : {512, 1024})
        for (int u : {4, 8}) rows.push_back({"ldg", n, g, t, u, 0, 0, 0});
    for (int g : {128, 256})
      for (int u : {4, 8, 16})
        for (int hf : {0, 1}) rows.push_back({"rows", n, g, 256, u, 0, 0, hf});
    for (int g : {128, sms, 256, 2 * sms})
      for (int s : {3, 6})
        for (int ch : {16384, 32768}) {
          if (size_t(s) * ch + 128 > 227 * 1024) continue;
          if (g > sms && size_t(s) * ch + 128 > 113 * 1024) continue;
          rows.push_back({"bulk", n, g, 160, 0, s, ch, 0});
        }
  }
  std::printf("%-5s %9s %5s %5s %3s %2s %6s %3s %9s %7s\n", "mode", "MB", "grid", "thr", "u", "S", "chunk",
              "hf", "us", "TB/s");
  for (const Row& r : rows) {
    if (only && std::strcmp(only, r.mode)) continue;
    const double us = time_row(r, buf, out, seconds, st);
    std::printf("%-5s %9.1f %5d %5d %3d %2d %6d %3d %9.2f %7.3f\n", r.mode, r.bytes / 1e6, r.grid, r.threads,
                r.u, r.s, r.ch, r.heads_fast, us, r.bytes / us / 1e6);
    std::fflush(stdout);
  }
  return 0;
}
