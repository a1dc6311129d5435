// Fault: returns without writing anything; the output keeps the evaluator's NaN poison ->
// status nan_or_unwritten.
#include "attn_params.h"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  if (p.batch < 0) static_cast<float*>(p.o)[0] = 0.f;  // never: keeps p used
}
