// ---- templates/export/prologue.cuh: what the exported file needs besides its kernels: the CUDA
// runtime and a few C++ standard headers, nothing else.
#include <cuda_runtime.h>
#if CUDART_VERSION >= 12000
// CUtensorMap's types, for kernels that load through TMA:
#include <cuda.h>
#endif

#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

// Everything below is this library's own: hidden from the dynamic linker (the C entry points say
// otherwise, ATTNTUNE_API), so that a process loading several exported libraries, of one attntune
// version or of several, never binds one library's launch plans, workspaces or caches to another's.
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

// The kernels use mma.sync m16n8k16, ldmatrix and cp.async (flash_fwd_wgmma: TMA and wgmma).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < @@MIN_ARCH@@
#error "attntune: this file needs compute capability @@MIN_ARCH_DOTTED@@ or newer: compile with -arch=@@MIN_ARCH_FLAG@@"
#endif
