// Fault: 32 KiB of static shared memory, and the test asks for dynamic shared memory that (a)
// alone exceeds the device's per-block opt-in limit, or (b) fits alone but not with the static
// part -> status resources (the launch cannot happen on this device).
#include "attn_params.h"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  __shared__ float fixed[8192];
  extern __shared__ float dynamic[];
  fixed[threadIdx.x] = p.scale;
  dynamic[threadIdx.x] = fixed[(threadIdx.x + 1) % blockDim.x];
  if (dynamic[threadIdx.x] == 12345.f) static_cast<float*>(p.o)[threadIdx.x] = 0.f;
}
