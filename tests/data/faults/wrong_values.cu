// Fault: writes every output element and LSE entry, all finite, none right (bits 0x3c00: 1.0 in
// fp16, 2^-7 in bf16) -> status wrong_result with the measured error.
#include "attn_params.h"

constexpr int kRowsPerBlock = 64;

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  const int head = blockIdx.y, batch = blockIdx.z, row0 = blockIdx.x * kRowsPerBlock;
  unsigned short* o = static_cast<unsigned short*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];
  for (int i = threadIdx.x; i < kRowsPerBlock * HEAD_DIM; i += blockDim.x) {
    const int row = row0 + i / HEAD_DIM, col = i % HEAD_DIM;
    if (row < p.seqlen_q) o[row * p.o_stride[2] + col] = 0x3c00;
  }
  for (int r = threadIdx.x; r < kRowsPerBlock; r += blockDim.x)
    if (row0 + r < p.seqlen_q && p.lse)
      p.lse[(static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q + row0 + r] = 0.f;
}
