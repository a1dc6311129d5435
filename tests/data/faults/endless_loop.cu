// Fault: never returns. The spin reads a volatile flag, so the compiler may not assume the loop
// ends (a loop without side effects could be removed). The worker blocks in synchronize; only the
// parent's watchdog can end it (status timeout).
#include "attn_params.h"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  __shared__ volatile int flag;
  if (threadIdx.x == 0) flag = p.batch > 0 ? 0 : 1;
  __syncthreads();
  while (flag == 0) {
  }
}
