// Fault: NVRTC never finishes. The source includes a FIFO that nobody writes, so the compile blocks
// in open() until the build pool kills it -> status compile_timeout. The caller creates the FIFO and
// puts its path in place of NEVER_WRITTEN_FIFO (left as it is, the include is missing: compile_error).
#include "attn_params.h"
#include "NEVER_WRITTEN_FIFO"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  if (p.batch < 0) static_cast<float*>(p.o)[0] = 0.f;
}
