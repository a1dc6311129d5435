// ---- templates/export/launch_tma.cuh: launching a kernel that loads Q, K and V through the
// tensor-memory accelerator (flash_fwd_wgmma, sm_90a): kernel(AttnParams, TmaMaps), where TmaMaps
// holds three CUtensorMaps encoded for each call with cuTensorMapEncodeTiled (host-only, about a
// microsecond each; a CUDA graph captures them by value). The maps are the tuner's
// (tuner/eval/attention_gpu.cpp, templates/flash_fwd_wgmma/README.md): 4-d tensors (head_dim,
// seqlen, heads, batch) with the call's strides in bytes, box (64, rows), 128-byte swizzle, zeros
// past the ends, so odd lengths need nothing more (the kernel masks keys past seqlen_k).
// cuTensorMapEncodeTiled is a driver function: it comes through the CUDA runtime
// (cudaGetDriverEntryPoint), so the library needs no -lcuda; cuda.h gives only its types.
#include <cuda.h>

#include <climits>
#include <cstring>
#include <mutex>

#if !defined(CUDART_VERSION) || CUDART_VERSION < 12000
#error "attntune: this file's kernels load through TMA tensor maps: it needs CUDA 12.0 or newer"
#endif

namespace attntune_export {

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static std::atomic<EncodeTiledFn> g_encode_tiled(nullptr);

// cuTensorMapEncodeTiled from the driver, looked up once.
static int tma_encoder(EncodeTiledFn* out) {
  EncodeTiledFn fn = g_encode_tiled.load(std::memory_order_acquire);
  if (!fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess) return cuda_failed(e, "cudaGetDriverEntryPoint(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || !p)
      return unsupported(
          "the CUDA driver does not provide cuTensorMapEncodeTiled (query result %d): this file's kernels load "
          "through TMA tensor maps, which need a driver for CUDA 12.0 or newer",
          static_cast<int>(found));
    fn = reinterpret_cast<EncodeTiledFn>(p);
    g_encode_tiled.store(fn, std::memory_order_release);
  }
  *out = fn;
  return 0;
}

static const long long kTmaElementBytes = 2;  // fp16 and bf16
static const long long kTmaMaxStride = 1LL << 40;  // bytes, cuTensorMapEncodeTiled's limit

// What TMA adds to the shared checks (16-byte alignment of bases and strides is one of those):
// tensor-map strides below 2^40 bytes along every dimension of extent > 1, and work tiles that the
// kernel can number with an int.
static int check_tma(const Kernel& k, const Args& a) {
  const struct {
    const char* name;
    const long long* stride;
    int heads, len;
  } tensors[] = {{"q_strides", a.q_stride, a.heads_q, a.seqlen_q},
                 {"k_strides", a.k_stride, a.heads_kv, a.seqlen_k},
                 {"v_strides", a.v_stride, a.heads_kv, a.seqlen_k}};
  for (const auto& t : tensors) {
    const int extent[3] = {a.batch, t.heads, t.len};
    for (int i = 0; i < 3; ++i)
      if (extent[i] > 1 && t.stride[i] >= kTmaMaxStride / kTmaElementBytes)
        return unsupported("%s {%lld, %lld, %lld}: a stride of 2^40 bytes or more does not fit a TMA tensor map",
                           t.name, t.stride[0], t.stride[1], t.stride[2]);
  }
  const long long tiles = work_tiles(k, a);
  if (tiles > INT_MAX)
    return unsupported("%lld work tiles (ceil(seqlen_q / %d), in whole clusters of %d, * heads_q * batch) is more "
                       "than the kernel numbers (2^31 - 1): split the batch",
                       tiles, k.block_m, k.cluster);
  return 0;
}

// One operand's map: (head_dim, len, heads, batch), strides {batch, head, row} in elements.
static int encode_tma(EncodeTiledFn encode, CUtensorMap* map, const char* name, const void* base,
                      const long long* stride, int len, int heads, int batch, int head_dim, int rows, int bf16) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(len),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  cuuint64_t strides[3];  // bytes, for dims 1..3: row, head, batch
  for (int i = 0; i < 3; ++i) {
    // A dimension of extent 1 is never stepped along: its stride (which may be 0, or anything a
    // framework left on a size-1 dimension) is replaced by one the encoder accepts.
    const bool stepped = dims[i + 1] > 1;
    strides[i] = static_cast<cuuint64_t>(stepped ? stride[2 - i] * kTmaElementBytes : head_dim * kTmaElementBytes);
  }
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(rows), 1, 1}, elem[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                            const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return unsupported(
        "cuTensorMapEncodeTiled refused %s's tensor map (CUresult %d): base %p, dims {%llu, %llu, %llu, %llu}, "
        "strides {%llu, %llu, %llu} bytes, box {64, %d}",
        name, static_cast<int>(r), base, static_cast<unsigned long long>(dims[0]),
        static_cast<unsigned long long>(dims[1]), static_cast<unsigned long long>(dims[2]),
        static_cast<unsigned long long>(dims[3]), static_cast<unsigned long long>(strides[0]),
        static_cast<unsigned long long>(strides[1]), static_cast<unsigned long long>(strides[2]), rows);
  return 0;
}

// split_tail: how many tail tiles of a persistent grid to share out by K/V iterations (0: none):
// when the tail gives every CTA two iterations or more and the kernel's 32-bit share arithmetic
// holds (tail * iterations * ctas and tiles + 2 * ctas below 2^31). The same rule as the tuner's (tuner/families).
static int split_tail_tiles(long long tiles, int ctas, long long iterations) {
  if (ctas <= 0 || tiles <= ctas) return 0;
  const long long tail = tiles % ctas;
  if (tail == 0 || tail * iterations < 2ll * ctas || tail * iterations * ctas >= (1ll << 31) ||
      tiles + 2ll * ctas >= (1ll << 31))
    return 0;
  return static_cast<int>(tail);
}

// The workspace of persistent grids: split_tail's partial results and counters, and the dynamic
// tile counters of causal ones. One per (device, stream) for the process, grown on demand, never
// freed (nor what it outgrows): kernels on one stream run in order, so each finds the counters at
// zero (every launch leaves them so), and launches on other streams have their own. Inside a
// stream capture (a CUDA graph) it is allocated all the same, with cudaMalloc in relaxed capture
// mode (as PyTorch's allocator does), and the counters zeroed on a stream of its own: graphs are
// often captured on a stream no call has used before (PyTorch's, for one). A captured graph
// keeps its stream's workspace, so replay it on one stream at a time, apart from direct launches
// on the stream it was captured from. When the table is full the caller launches unsplit or
// round-robin, which is as correct.
struct Workspace {
  float* floats = nullptr;
  int* counters = nullptr;
};
static int workspace(const Device& device, cudaStream_t stream, size_t floats_bytes, size_t counter_bytes,
                     Workspace* out) {
  struct Slot {
    int device;
    cudaStream_t stream;
    float* floats;
    int* counters;
    size_t floats_bytes, counter_bytes;
  };
  static Slot slots[256];
  static int used = 0;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  Slot* s = nullptr;
  for (int i = 0; i < used && !s; ++i)
    if (slots[i].device == device.index && slots[i].stream == stream) s = &slots[i];
  if (!s) {
    if (used == static_cast<int>(sizeof slots / sizeof slots[0])) return 0;
    s = &slots[used++];
    *s = Slot{device.index, stream, nullptr, nullptr, 0, 0};
  }
  // Outgrown buffers are kept, not freed: a launch still running, or a graph captured earlier,
  // may use them (the counters stay at zero).
  if (s->floats_bytes < floats_bytes || s->counter_bytes < counter_bytes) {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (const cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode))
      return cuda_failed(e, "cudaThreadExchangeStreamCaptureMode");
    cudaError_t e = cudaSuccess;
    const char* call = "";
    float* f = nullptr;
    int* c = nullptr;
    cudaStream_t zero = nullptr;  // its own stream: the caller's may be capturing
    if (s->floats_bytes < floats_bytes && (e = cudaMalloc(&f, floats_bytes)) != cudaSuccess) call = "cudaMalloc (workspace)";
    if (!e && s->counter_bytes < counter_bytes) {
      if ((e = cudaMalloc(&c, counter_bytes)) != cudaSuccess) call = "cudaMalloc (workspace counters)";
      else if ((e = cudaStreamCreateWithFlags(&zero, cudaStreamNonBlocking)) != cudaSuccess) call = "cudaStreamCreate";
      else if ((e = cudaMemsetAsync(c, 0, counter_bytes, zero)) != cudaSuccess) call = "cudaMemsetAsync (workspace counters)";
      else if ((e = cudaStreamSynchronize(zero)) != cudaSuccess) call = "cudaStreamSynchronize (workspace counters)";
      if (zero) cudaStreamDestroy(zero);
    }
    if (e) {
      if (f) cudaFree(f);
      if (c) cudaFree(c);
    }
    cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's mode
    if (e) return cuda_failed(e, call);
    if (f) {
      s->floats = f;
      s->floats_bytes = floats_bytes;
    }
    if (c) {
      s->counters = c;
      s->counter_bytes = counter_bytes;
    }
  }
  out->floats = s->floats;
  out->counters = s->counters;
  return 0;
}

// Maps is the kernel's own TmaMaps: 128-byte, 64-byte-aligned descriptors q, k and v.
template <class Params, class Maps>
int launch_tma(const Kernel& kernel, const Args& a, const Device& device, cudaStream_t stream) {
  EncodeTiledFn encode = nullptr;
  if (const int r = tma_encoder(&encode)) return r;
  CUtensorMap q, k, v;
  if (const int r = encode_tma(encode, &q, "q", a.q, a.q_stride, a.seqlen_q, a.heads_q, a.batch, a.head_dim,
                               kernel.tma_q_rows, kernel.bf16))
    return r;
  if (a.seqlen_k > 0) {
    if (const int r = encode_tma(encode, &k, "k", a.k, a.k_stride, a.seqlen_k, a.heads_kv, a.batch, a.head_dim,
                                 kernel.tma_kv_rows, kernel.bf16))
      return r;
    if (const int r = encode_tma(encode, &v, "v", a.v, a.v_stride, a.seqlen_k, a.heads_kv, a.batch, a.head_dim,
                                 kernel.tma_kv_rows, kernel.bf16))
      return r;
  } else {
    // No keys: no work tile loads K or V (every row outputs zeros and LSE -inf), but the kernel's
    // maps must still be valid descriptors, and k and v may be NULL: q's memory stands in.
    if (const int r = encode_tma(encode, &k, "k (q standing in: seqlen_k is 0)", a.q, a.q_stride, a.seqlen_q,
                                 a.heads_q, a.batch, a.head_dim, kernel.tma_kv_rows, kernel.bf16))
      return r;
    v = k;
  }
  Maps maps = Maps();  // any member besides q, k and v stays zero
  static_assert(sizeof(maps.q) == sizeof(CUtensorMap) && sizeof(maps.k) == sizeof(CUtensorMap) &&
                    sizeof(maps.v) == sizeof(CUtensorMap),
                "the kernel's tensor maps q, k and v must be CUtensorMaps");
  std::memcpy(&maps.q, &q, sizeof q);
  std::memcpy(&maps.k, &k, sizeof k);
  std::memcpy(&maps.v, &v, sizeof v);
  if (kernel.persistent && kernel.causal) {  // the dynamic tile counters
    Workspace ws;
    if (const int r = workspace(device, stream, 0, 2 * sizeof(int), &ws)) return r;
    maps.tile_count = ws.counters;  // null (the table full): round-robin
  } else if (kernel.persistent && kernel.split_tail) {
    const long long tiles = work_tiles(kernel, a);
    const int ctas = persistent_ctas(kernel, a, device);
    const int warps = (kernel.threads - 128) / 32;  // the consumer warps (a producer warpgroup first)
    const int tail = split_tail_tiles(tiles, ctas, (a.seqlen_k + kernel.tma_kv_rows - 1) / kernel.tma_kv_rows);
    Workspace ws;
    if (tail > 0) {
      if (const int r = workspace(device, stream, 2ull * ctas * warps * (a.head_dim / 2 + 4) * 32 * sizeof(float),
                                  1ull * tail * warps * sizeof(int), &ws))
        return r;
    }
    if (ws.floats) {  // else (the table full) the launch runs unsplit: as correct
      maps.split_ws = ws.floats;
      maps.split_count = ws.counters;
      maps.split_tail = tail;
    }
  }
  Params p = make_params<Params>(a);
  void* params[] = {&p, &maps};
  return launch_kernel(kernel, a, device, params, stream);
}

}  // namespace attntune_export
