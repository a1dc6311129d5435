// ---- templates/common/fp8.cuh: FP8 e4m3 bytes to the 16-bit MMA formats, exactly (every e4m3 value
// is an fp16 and a bf16 value). Header-free, like ptx.cuh. FP8 caches (ATT_KV_FP8: flash_decode's
// README, "FP8 caches") read K and V through these; tests/gpu/test_flash_decode.cpp
// (Fp8Convert.EveryCodeExactly) checks every code of every function here against its value.
//  - fp16: one cvt.rn.f16x2.e4m3x2 a pair (sm_89+).
//  - bf16: sm_89/sm_90 have no e4m3 -> bf16 cvt, so the bits move into place: a byte's sign to bit
//    15, its 7 other bits to bits 4..10 (prmt, shift, mask). That is a bf16 whose value is the e4m3
//    value times 2^-120 (exponent biases 7 and 127; e4m3's subnormals land on bf16's); one
//    fma.rn.bf16x2 by 2^120 (+ -0, so that zeros keep their sign) makes it exact.
#ifndef ATTNTUNE_FP8_CUH
#define ATTNTUNE_FP8_CUH

#include "ptx.cuh"

namespace att {

// Two e4m3 bytes (bits 0..15 of x16: byte 0 low) to an fp16 pair (element 0 in the low half).
__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 x16) {
  u32 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const unsigned short h = static_cast<unsigned short>(x16);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(h));
#else
  r = 0u * x16;  // FP8 needs sm_89 (the spaces offer it there only)
#endif
  return r;
}

// Bytes (0, 1) of x to the pair lo and bytes (2, 3) to hi, in bf16 (kBf16) or fp16.
template <bool kBf16>
__device__ __forceinline__ void e4m3x4_to_pairs(u32 x, u32& lo, u32& hi) {
  if constexpr (kBf16) {
    u32 a, b;
    asm("prmt.b32 %0, %1, 0, 0x1404;\n" : "=r"(a) : "r"(x));  // bytes 0, 1 to each half's high byte
    asm("prmt.b32 %0, %1, 0, 0x3424;\n" : "=r"(b) : "r"(x));  // bytes 2, 3
    a = (a & 0x80008000u) | ((a >> 4) & 0x07f007f0u);
    b = (b & 0x80008000u) | ((b >> 4) & 0x07f007f0u);
    const u32 two120 = 0x7b807b80u, neg0 = 0x80008000u;  // bf16x2 2^120, -0
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(lo) : "r"(a), "r"(two120), "r"(neg0));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(hi) : "r"(b), "r"(two120), "r"(neg0));
  } else {
    lo = e4m3x2_to_f16x2(x & 0xffffu);
    hi = e4m3x2_to_f16x2(x >> 16);
  }
}

// A transposing ldmatrix's register over e4m3 bytes (16-bit column g of keys 2t, 2t + 1: bytes key
// 2t dim 2g, key 2t dim 2g + 1, key 2t + 1 dim 2g, key 2t + 1 dim 2g + 1) to the fp16 pairs of the
// two keys at dim 2g (even) and at dim 2g + 1 (odd).
__device__ __forceinline__ void e4m3_key_pairs(u32 x, u32& even, u32& odd) {
  u32 y;
  asm("prmt.b32 %0, %1, 0, 0x3120;\n" : "=r"(y) : "r"(x));
  even = e4m3x2_to_f16x2(y & 0xffffu);
  odd = e4m3x2_to_f16x2(y >> 16);
}

}  // namespace att

#endif  // ATTNTUNE_FP8_CUH
