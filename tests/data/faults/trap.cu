// Fault: a trap instruction, as a failed device-side check would execute -> the launch fails and
// the context is poisoned (status crashed).
#include "attn_params.h"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  if (p.batch > 0) __trap();
}
