// Fault: writes NaN into every output element (0x7fff is a NaN in fp16 and in bf16, and differs
// from the evaluator's 0xffff poison) -> status nan_or_unwritten.
#include "attn_params.h"

constexpr int kRowsPerBlock = 64;

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  const int head = blockIdx.y, batch = blockIdx.z, row0 = blockIdx.x * kRowsPerBlock;
  unsigned short* o = static_cast<unsigned short*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];
  for (int i = threadIdx.x; i < kRowsPerBlock * HEAD_DIM; i += blockDim.x) {
    const int row = row0 + i / HEAD_DIM, col = i % HEAD_DIM;
    if (row < p.seqlen_q) o[row * p.o_stride[2] + col] = 0x7fff;
  }
}
