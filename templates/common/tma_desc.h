// ---- templates/common/tma_desc.h: a CUtensorMap as a kernel argument sees it: 128 opaque bytes,
// 64-byte aligned, passed by value inside a __grid_constant__ kernel parameter. The host fills it
// with cuTensorMapEncodeTiled (the executors of templates/common/launch_plan.h). Plain C++, so both
// the kernels and the host code that binds their arguments include it.
#ifndef ATTNTUNE_TMA_DESC_H
#define ATTNTUNE_TMA_DESC_H

namespace att {

struct alignas(64) TmaDesc {
  unsigned long long opaque[16];
};

}  // namespace att

#endif  // ATTNTUNE_TMA_DESC_H
