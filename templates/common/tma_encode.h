// ---- templates/common/tma_encode.h: a launch plan's TensorMap (launch_plan.h) through
// cuTensorMapEncodeTiled, for both adapters of the plan executor (run_plan.h): the tuner's (the
// driver it loads) and the exported library's (the driver entry point the CUDA runtime hands over). The recipe's fixed parts are here
// once: no interleave, zeros past the tensor's ends, the map's L2 promotion (256 bytes unless it
// names another). Host code; needs
// cuda.h's types (CUDA 12 or newer).
#ifndef ATTNTUNE_TMA_ENCODE_H
#define ATTNTUNE_TMA_ENCODE_H

#include <cuda.h>

#include "launch_plan.h"

namespace attntune_plan {

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// TMA's swizzle mode for a span of `bytes` (128, 64, 32; anything else: none).
inline CUtensorMapSwizzle tma_swizzle(int bytes) {
  return bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
         : bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
         : bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                       : CU_TENSOR_MAP_SWIZZLE_NONE;
}

// TMA's L2 promotion for a map's l2_promotion bytes (64, 128; anything else, 0 included: 256).
inline CUtensorMapL2promotion tma_l2_promotion(int bytes) {
  return bytes == 64 ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
         : bytes == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                        : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
}

// Encodes `m` into `out` (kTensorMapBytes, 64-byte aligned) with `encode`, cuTensorMapEncodeTiled.
inline CUresult encode_tensor_map(EncodeTiledFn encode, const TensorMap& m, void* out) {
  static_assert(sizeof(CUtensorMap) == kTensorMapBytes, "a CUtensorMap is 128 bytes");
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], elem[5];
  for (int i = 0; i < m.rank && i < 5; ++i) {
    dims[i] = m.dims[i];
    box[i] = m.box[i];
    elem[i] = 1;
    if (i + 1 < m.rank) strides[i] = m.strides[i];
  }
  const CUtensorMapDataType type = m.bf16 == kMapBytes ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : m.bf16               ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(static_cast<CUtensorMap*>(out), type,
                static_cast<cuuint32_t>(m.rank), const_cast<void*>(m.base), dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, tma_swizzle(m.swizzle_bytes),
                tma_l2_promotion(m.l2_promotion), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace attntune_plan

#endif  // ATTNTUNE_TMA_ENCODE_H
