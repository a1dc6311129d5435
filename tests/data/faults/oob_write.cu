// Fault: a store 16 TiB past the output, outside any allocation -> CUDA_ERROR_ILLEGAL_ADDRESS,
// which poisons the context (status crashed; the worker is replaced).
#include "attn_params.h"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  volatile float* far = reinterpret_cast<volatile float*>(static_cast<char*>(p.o) + (1ull << 44));
  far[threadIdx.x] = 1.f;
}
