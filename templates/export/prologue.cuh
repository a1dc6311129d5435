// ---- templates/export/prologue.cuh: what the exported file needs besides its kernels: the CUDA
// runtime and a few C++ standard headers, nothing else.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

// The kernels use mma.sync m16n8k16, ldmatrix and cp.async (flash_fwd_wgmma: TMA and wgmma).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < @@MIN_ARCH@@
#error "attntune: this file needs compute capability @@MIN_ARCH_DOTTED@@ or newer: compile with -arch=@@MIN_ARCH_FLAG@@"
#endif
