// Fault: does not compile (an undeclared name, a missing semicolon) -> status compile_error with
// NVRTC's log.
#include "attn_params.h"

extern "C" __global__ void flash_fwd_mma(const AttnParams p) {
  float x = p.scale * undeclared_tile_size
  static_cast<float*>(p.o)[0] = x;
}
