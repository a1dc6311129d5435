// One 16x8x16 bf16 tile through the instructions the attention kernels are made of: cp.async,
// ldmatrix (plain and .trans) and mma.sync. Compiled by the NVRTC tests (CPU) and run by the
// driver tests (GPU).
#pragma once

namespace attntune::testing {

inline constexpr const char* kMmaTile = R"(
extern "C" __global__ void mma_tile(const unsigned short* __restrict__ a,  // [16,16] row-major
                                    const unsigned short* __restrict__ b,  // [16,8] (k,n) row-major
                                    float* __restrict__ c) {               // [16,8]
  __shared__ alignas(128) unsigned short sa[16 * 16];
  __shared__ alignas(128) unsigned short sb[16 * 8];
  const int t = threadIdx.x;  // one warp
  const unsigned sa_dst = static_cast<unsigned>(__cvta_generic_to_shared(sa + t * 8));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa_dst), "l"(a + t * 8));
  if (t < 16) {
    const unsigned sb_dst = static_cast<unsigned>(__cvta_generic_to_shared(sb + t * 8));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sb_dst), "l"(b + t * 8));
  }
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();
  unsigned a0, a1, a2, a3, b0, b1;
  const unsigned a_src =
      static_cast<unsigned>(__cvta_generic_to_shared(sa + (t % 16) * 16 + (t / 16) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(a_src));
  const unsigned b_src = static_cast<unsigned>(__cvta_generic_to_shared(sb + (t % 16) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1) : "r"(b_src));
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  const int row = t / 4, col = (t % 4) * 2;
  c[row * 8 + col] = d0;
  c[row * 8 + col + 1] = d1;
  c[(row + 8) * 8 + col] = d2;
  c[(row + 8) * 8 + col + 1] = d3;
}
)";

}  // namespace attntune::testing
