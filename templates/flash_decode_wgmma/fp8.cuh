// ---- templates/flash_decode_wgmma/fp8.cuh: flash_decode_wgmma over an FP8 e4m3 cache (ATT_KV_FP8,
// head dim 128; issue 42), included by kernel.cu inside namespace att after the shared helpers.
//
// No byte of the cache is converted or transposed in shared memory: both products are FP8 wgmma
// (m64nNk32 e4m3 x e4m3, fp32 accumulators) arranged so that K and V serve as they lie.
//  - S = Q K^T: A = Q (64 packed rows), B = the K tile (a key's 128 bytes contiguous: K-major,
//    which is all FP8 wgmma takes), both from shared memory. Q (bf16: the space serves no fp16
//    query, whose pieces would keep 9 of its 11 bits) becomes two e4m3 pieces, hi = e4m3(q 2^-e)
//    and lo = e4m3(q 2^-e - hi), each one more pass of the k-steps; e puts the CTA's largest |q| in
//    [2^7, 2^8), and hi + lo is q 2^-e exactly down to 2^-10 of the largest (8 significant bits, 4
//    a piece). 2^e joins K's scale.
//  - O^T = V^T P^T: A = V^T from registers, B = P from shared memory, where a row's keys are
//    contiguous (K-major again). A warp's k32 A fragment holds, of its rows g and g + 8, 4 keys a
//    register; a transposing ldmatrix of V (16-bit columns = pairs of dims) gives a lane keys 2t,
//    2t + 1 at dims 2g, 2g + 1 of one 8-key matrix, and one prmt of two matrices (keys 0-7, 8-15 of
//    the step) makes the 4 keys {2t, 2t + 1, 8 + 2t, 9 + 2t} at dim 2g (row g) or 2g + 1 (row g +
//    8). P's bytes are stored in that key order (a k-step's byte 4t + i is key 2t + i, 4t + 2 + i
//    key 8 + 2t + i, and 16 + the same for keys 16..31), so each thread's P stores are whole words
//    of its own accumulator pairs. O^T's rows are dims (warp w of m-block mb: 16(4mb + w) + 2g + h),
//    its columns the packed rows; a thread's output pair (dims 2g, 2g + 1 of a row) is one store.
//  - P = 2^(x - m + 8) (up to 256, in e4m3's range), two e4m3 pieces (p_pieces: hi rounded by its
//    bits, two cvts a pair where Q's way takes four): its row sum and V's scale take the 2^-8 back.
//    A row's P pieces are bytes 0-63 (hi) and 64-127 (lo) of its 128-byte P row, so O^T's four
//    k-steps are lo, lo, hi, hi over the same two V^T fragments.
//  - Sums: FP8 wgmma adds its products and the accumulator it is given at fewer bits than fp32
//    (aligned to the largest of them; docs/design/flash_decode_wgmma.md, "FP8 caches"). S summed
//    in one accumulator over its 8 wgmmas missed the LSE's 1e-3 (H100: 1.1e-3 to 4e-3), so S goes
//    in fresh sums a k-step (lo's wgmma then hi's, 4 sums added in fp32; two k-steps a sum missed it
//    too at 32 rows, run 390). Each tile's O^T goes to fresh accumulators, P's small lo products
//    first, that one FFMA an element adds to O (O * the row's factor + the tile's).
//  - V's bytes past the sequence (stale, NaN) are zeroed in the fragments of the last tile, so P = 0
//    times them is 0; K's give scores that are masked.
// One consumer warpgroup (128 threads) and the producer warpgroup; two CTAs an SM.

// An fp16 pair to an e4m3 pair (round to nearest, saturating at 448; element 0 in bits 0..7).
__device__ __forceinline__ u32 f16x2_to_e4m3x2(u32 x) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(r) : "r"(x));
  return r;
}

// An fp16 pair x as two e4m3 pairs, hi + lo: hi = e4m3(x), lo = e4m3(x - hi) (bits 0..15 of each).
// The difference is exact in fp16 (x's 11 bits less hi's leading 4), and lo keeps its leading 4
// bits: x = hi + lo exactly where x has at most 8 significant bits (a bf16 value) and its last bit
// is no finer than e4m3's smallest subnormal (2^-9); else within 2^-9 of |x| (or 2^-10 absolute).
__device__ __forceinline__ void f16x2_to_e4m3_pieces(u32 x, u32& hi, u32& lo) {
  hi = f16x2_to_e4m3x2(x);
  u32 back, r;
  const unsigned short h16 = static_cast<unsigned short>(hi);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(back) : "h"(h16));
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(x), "r"(back));
  lo = f16x2_to_e4m3x2(r);
}

// Two transposing-ldmatrix registers a (keys 0-7 of a step) and b (keys 8-15) of e4m3 bytes (each:
// 16-bit column g of key pair 2t, 2t + 1: key 2t dim 2g, key 2t dim 2g + 1, key 2t + 1 dim 2g, key
// 2t + 1 dim 2g + 1) to keys 2t, 2t + 1, 8 + 2t, 9 + 2t at dim 2g (even) and at dim 2g + 1 (odd).
__device__ __forceinline__ void e4m3_key_quads(u32 a, u32 b, u32& even, u32& odd) {
  asm("prmt.b32 %0, %1, %2, 0x6420;\n" : "=r"(even) : "r"(a), "r"(b));
  asm("prmt.b32 %0, %1, %2, 0x7531;\n" : "=r"(odd) : "r"(a), "r"(b));
}

// fp32 x, y to e4m3 bytes (x in byte 0, y in byte 1): round to nearest even, saturated to +-448.
__device__ __forceinline__ u32 fp8_e4m3x2(float x, float y) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(y), "f"(x));  // the first operand: the high byte
  return r;
}

// P's two e4m3 pieces of a pair (p0 in byte 0): hi is p rounded to 4 significant bits by its bits
// (add half of the dropped part, clear it: an integer add and a mask, not a conversion), lo = p -
// hi exactly in fp32, and each pair is one cvt. hi is an e4m3 value where p >= 2^-6 (e4m3's smallest
// normal; P is at most 256); below it the cvt rounds hi to e4m3's subnormal step, off by at most
// 2^-10, which lo does not see: 2^-18 of the row's largest P, against bf16's 2^-9 a value.
__device__ __forceinline__ void p_pieces(float p0, float p1, u32& hi, u32& lo) {
  const float h0 = __uint_as_float((__float_as_uint(p0) + 0x80000u) & 0xfff00000u);
  const float h1 = __uint_as_float((__float_as_uint(p1) + 0x80000u) & 0xfff00000u);
  hi = fp8_e4m3x2(h0, h1);
  lo = fp8_e4m3x2(p0 - h0, p1 - h1);
}

// A bf16 pair x times qmul as fp16 (exact for a power of two that keeps it normal).
__device__ __forceinline__ u32 fp8_q_pair(u32 x, float qmul) {
  const float lo = __uint_as_float(x << 16), hi = __uint_as_float(x & 0xffff0000u);
  return pack2<false>(lo * qmul, hi * qmul);
}

// Q's 64 rows (row0.., zeros past rows_here) as e4m3 pieces hi (at q) and lo (at q + kQPiece), each
// 64 rows of 128 bytes in the 128-byte swizzle; K's scale times 2^e. The 128 consumer threads, one
// barrier (1) inside and none after: the caller fences and syncs.
__device__ __forceinline__ void fp8_load_q(const DecodeParams& p, u32 q, u32 stats, int b, int kvh, int row0,
                                           int rows_here, int tid, float& kds) {
  constexpr int kChunks = T::kHeadDim / 8;          // 16-byte chunks of a 16-bit row
  constexpr int kPer = T::kBlockM * kChunks / 128;  // a thread's
  const elem_bits* qg = static_cast<const elem_bits*>(p.q) + b * p.q_stride[0];
  uint4 v[kPer];
  u32 mx = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = tid + 128 * i, r = c / kChunks, ch = c - r * kChunks;
    v[i] = make_uint4(0, 0, 0, 0);
    if (r < rows_here) {
      const int rr = row0 + r, gq = rr / p.seqlen_q, qi = rr - gq * p.seqlen_q;
      v[i] = __ldg(reinterpret_cast<const uint4*>(qg + (kvh * p.group + gq) * p.q_stride[1] + qi * p.q_stride[2] + ch * 8));
    }
    const u32 w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) mx = max(mx, max(w[k] & 0x7fffu, (w[k] >> 16) & 0x7fffu));
  }
  // The CTA's largest magnitude (bf16 magnitudes order as integers), then e.
  mx = __reduce_max_sync(0xffffffffu, mx);
  if ((tid & 31) == 0) asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(stats + 4 * (tid >> 5)), "r"(mx) : "memory");
  named_bar_sync(1, 128);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    u32 x;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x) : "r"(stats + 4 * w) : "memory");
    mx = max(mx, x);
  }
  int e = 0;
  if (mx != 0) {
    const int top = static_cast<int>(mx >> 7) - 127;
    e = min(max(top - 7, -100), 100);
  }
  const float qmul = __int_as_float((127 - e) << 23);
  kds *= __int_as_float((127 + e) << 23);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int c = tid + 128 * i, r = c / kChunks, ch = c - r * kChunks;
    u32 hi[4], lo[4];
    const u32 w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) f16x2_to_e4m3_pieces(fp8_q_pair(w[k], qmul), hi[k], lo[k]);
    // 8 elements = 8 bytes: half of the 16-byte chunk ch / 2 of row r.
    const u32 at = r * 128 + ((((ch >> 1) ^ (r & 7)) << 4) | ((ch & 1) << 3));
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(q + at), "r"(hi[0] | (hi[1] << 16)), "r"(hi[2] | (hi[3] << 16))
                 : "memory");
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(q + T::kQPiece + at), "r"(lo[0] | (lo[1] << 16)),
                 "r"(lo[2] | (lo[3] << 16))
                 : "memory");
  }
}

__device__ __forceinline__ void consume_fp8(const DecodeParams& p, u32 s_q, u32 ring, u32 bars, u32 s_p, u32 stats,
                                            int b, int kvh, int split, int rb, int t_begin, int n, int len, int tid) {
  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, q4 = lane & 3;
  const int r_lo = warp * 16 + g;  // S's rows r_lo, r_lo + 8
  const int row0 = rb * T::kBlockM, rows_here = min(T::kBlockM, p.rows - row0);
  // Stats (floats): [0, 128) O's factors by row of P tiles 0 and 1, [128, 192) the rows' maxima,
  // [192, 256) their sums.
  const u32 s_f = stats, s_m = stats + 128 * 4, s_l = stats + 192 * 4;

  // This unit's (sequence, KV head) dequantisation scales (1 without a table).
  float kds = 1.f, vds = 1.f;
  {
    const KvScales& s = p.kv;
    if (s.k_descale) kds = __ldg(s.k_descale + b * s.k_descale_stride[0] + kvh * s.k_descale_stride[1]);
    if (s.v_descale) vds = __ldg(s.v_descale + b * s.v_descale_stride[0] + kvh * s.v_descale_stride[1]);
  }
  fp8_load_q(p, s_q, stats, b, kvh, row0, rows_here, tid, kds);
  fence_proxy_async();  // Q's generic stores, then wgmma's reads through the async proxy
  named_bar_sync(1, 128);

  int lim[2];
  key_limits(p, row0 + r_lo, len, lim);
  const float sl = p.scale_log2 * kds;
  const u64 q_hi = smem_desc_sw128(s_q, 16, 1024), q_lo = smem_desc_sw128(s_q + T::kQPiece, 16, 1024);
  const u64 p_desc = smem_desc_sw128(s_p, 16, 1024);

  float o[2][32];  // O^T by m-block (dims 64mb ..): rows 16 warp + g (+ 8) of it, columns 8j + 2q4 (+ 1)
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i >> 5][i & 31] = 0.f;
  float m_run[2] = {neg_inf(), neg_inf()}, l_run[2] = {0.f, 0.f};

  // One tile's steps (the loop below). issue_s: S = Q K^T in sums of a k-step (above), V^T's
  // fragments loaded while the first are in flight; S is s + s2, whose last sums are left in flight
  // for the softmax to add.
  // load_va: V^T's A fragments of this warp's dims (chunk 4mb + warp) over the tile's two k32
  // steps, V's bytes past the sequence zeroed (a fragment byte's keys: above). softmax: tile t's S,
  // read only (a write to an accumulator while another wgmma is in flight makes ptxas serialize
  // them): mask, online softmax (log2 units), P's pieces and O's factors by row into registers,
  // which store_p puts in the P tile and beside it. issue_o: O^T's tile from the P tile (lo, lo, hi,
  // hi k-steps over the two V^T fragments) into fresh accumulators. fold: O = O * the rows' factors
  // + the tile.
  auto load_va = [&](int t, u32 (&va)[2][2][4]) {
    const u32 sv = ring + (t % T::kStages) * T::kStageBytes + T::kKBytes;
    const int j0 = (t_begin + t) * T::kBlockN;
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const int row = 32 * kk + lane, ch = 4 * mb + warp;
        u32 r0, r1, r2, r3;
        ldmatrix_x4_trans(sv + row * 128 + ((ch ^ (row & 7)) << 4), r0, r1, r2, r3);
        e4m3_key_quads(r0, r1, va[mb][kk][0], va[mb][kk][1]);
        e4m3_key_quads(r2, r3, va[mb][kk][2], va[mb][kk][3]);
      }
    if (j0 + T::kBlockN > len) {
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int k = j0 + 32 * kk + 16 * half + 2 * q4;  // the register's keys k, k + 1, k + 8, k + 9
          const u32 keep = (k < len ? 0xffu : 0u) | (k + 1 < len ? 0xff00u : 0u) | (k + 8 < len ? 0xff0000u : 0u) |
                           (k + 9 < len ? 0xff000000u : 0u);
#pragma unroll
          for (int mb = 0; mb < 2; ++mb) {
            va[mb][kk][2 * half] &= keep;
            va[mb][kk][2 * half + 1] &= keep;
          }
        }
    }
  };
  // S's wgmma descriptors of tile t's stage (K's k-steps) and Q's pieces, made before issue_s and
  // pinned (an empty volatile asm): none is computed between two wgmma issues (a non-wgmma
  // instruction defining a wgmma input while wgmmas are in flight serializes them all: ptxas
  // C7513). The form run 388 timed.
  struct SDescs {
    u64 k[4], q[8];  // q: lo's k-steps 0-3, then hi's
  };
  auto s_descs = [&](int t, SDescs& d) {
    const u64 k_desc = smem_desc_sw128(ring + (t % T::kStages) * T::kStageBytes, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      d.k[kk] = k_desc + 2 * kk;
      d.q[kk] = q_lo + 2 * kk;
      d.q[4 + kk] = q_hi + 2 * kk;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+l"(d.k[i]));
#pragma unroll
    for (int i = 0; i < 8; ++i) asm volatile("" : "+l"(d.q[i]));
  };
  // Tile t's stage is loaded (before issue_s: no wait loop between two wgmma issues).
  auto wait_tile = [&](int t) { mbar_wait(bars + 8 * (t % T::kStages), (t / T::kStages) & 1); };
  auto issue_s = [&](int t, float (&s)[32], float (&s2)[32], u32 (&va)[2][2][4], const SDescs& d) {
    // Sum j's wgmma (lo's k-steps 0-3, then hi's 4-7) into acc, fresh if `fresh`.
    auto mma = [&](float (&acc)[32], int j, bool fresh) { WgmmaE4m3<64>::ss(acc, d.q[j], d.k[j & 3], !fresh); };
    // k-step kk's two pieces (lo, then hi) in fresh sums, added in fp32: kk 0 into s and 1 into
    // s2, both in flight, then s += s2 and kk 2, then s += s2 and kk 3, whose sums the softmax adds
    // to s once the caller's wait is done. (Two k-steps a sum, no wait here, ran 4% faster at q16
    // but missed the LSE's bound on 32-row shapes: run 390.)
    wgmma_fence();
    mma(s, 0, true), mma(s, 4, false);
    mma(s2, 1, true), mma(s2, 5, false);
    wgmma_commit();
    load_va(t, va);
#pragma unroll
    for (int kk = 2; kk < 4; ++kk) {
      wgmma_wait<0>();
      reg_fence(s);
      reg_fence(s2);
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] += s2[i];
      wgmma_fence();
      mma(s2, kk, true), mma(s2, 4 + kk, false);
      wgmma_commit();
    }
  };
  // The stage is read: K by S, V into the fragments.
  auto release = [&](int t) { mbar_arrive(bars + 8 * (T::kStages + t % T::kStages)); };
  struct PWords {
    u32 w[2][2][2][2];  // [k-step][row h][word at 4q4 / 16 + 4q4][hi, lo]
    float f[2];
  };
  auto softmax = [&](int t, const float (&s)[32], const float (&s2)[32], PWords& pw) {
    const int j0 = (t_begin + t) * T::kBlockN;
    const bool masked = j0 + T::kBlockN > min(lim[0], lim[1]);
    float pr[32];  // S read once; keys past a row's limit masked on the tiles that have any
#pragma unroll
    for (int i = 0; i < 32; ++i) pr[i] = s[i] + s2[i];
    if (masked) {
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (j0 + 8 * (i / 4) + 2 * q4 + (i & 1) >= lim[(i >> 1) & 1]) pr[i] = neg_inf();
    }
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int i = 0; i < 32; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], pr[i]);
    float use8[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(m_run[h], mx[h] * sl);
      const float m_use = m_new == neg_inf() ? 0.f : m_new;
      pw.f[h] = ex2(m_run[h] - m_use);
      m_run[h] = m_new;
      l_run[h] *= pw.f[h];
      use8[h] = m_use - 8.f;
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int w = 0; w < 2; ++w) pw.w[kk][h][w][0] = pw.w[kk][h][w][1] = 0;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int i = 4 * (4 * kk + jj) + 2 * h;
          const float p0 = ex2(fmaf(pr[i], sl, -use8[h])), p1 = ex2(fmaf(pr[i + 1], sl, -use8[h]));
          sum[h] += p0 + p1;
          u32 ph, pl;
          p_pieces(p0, p1, ph, pl);
          pw.w[kk][h][jj >> 1][0] |= ph << (16 * (jj & 1));
          pw.w[kk][h][jj >> 1][1] |= pl << (16 * (jj & 1));
        }
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) l_run[h] += sum[h] * (1.f / 256.f);  // this thread's part (the quad sums at the end)
  };
  auto store_p = [&](const PWords& pw, int buf) {
    const u32 pt = s_p + buf * T::kPTile, ft = s_f + buf * 64 * 4;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (q4 == 0) st_shared_f32(ft + 4 * (r_lo + 8 * h), pw.f[h]);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r_lo + 8 * h;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const int off = 32 * kk + 16 * w + 4 * q4;  // hi; lo at + 64
          const u32 at = pt + r * 128 + (4 * q4 | (((off >> 4) ^ (r & 7)) << 4));
          const u32 at_lo = pt + r * 128 + (4 * q4 | ((((off + 64) >> 4) ^ (r & 7)) << 4));
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pw.w[kk][h][w][0]) : "memory");
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at_lo), "r"(pw.w[kk][h][w][1]) : "memory");
        }
      }
  };
  auto issue_o = [&](const u32 (&va)[2][2][4], int buf, float (&acc)[2][32]) {
    const u64 pd = p_desc + ((buf * T::kPTile) >> 4);
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) {
        const int ks = (kq + 2) & 3;  // P's lo k-steps (2, 3) before its hi ones: the small products first
        WgmmaE4m3<64>::rs(acc[mb], va[mb][ks & 1], pd + 2 * ks, kq > 0);
      }
    wgmma_commit();
  };
  auto fold = [&](int buf, const float (&acc)[2][32]) {
    float f[16];  // O's factors of this thread's columns 8j + 2q4 + e
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float2 x;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(x.x), "=f"(x.y)
                   : "r"(s_f + buf * 64 * 4 + 4 * (8 * j + 2 * q4))
                   : "memory");
      f[2 * j] = x.x, f[2 * j + 1] = x.y;
    }
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[mb][i] = fmaf(o[mb][i], f[2 * (i >> 2) + (i & 1)], acc[mb][i]);
  };

  // Two P tiles (and their rows' factors) taken in turn: one barrier a tile, after P_t's stores.
  // Past it every warp has also folded O^T_{t-1}, so that tile is free for P_{t+1}. (The end's
  // maxima and sums are other words.)
  {
    // S_t, its softmax, O^T_t, one tile after the other (the fused schedule, O^T_t and S_{t+1}
    // issued together with one wait, measured 2-4% slower in run 388: tag tried/fp8-wgmma-fused).
    for (int t = 0; t < n; ++t) {
      const int buf = t & 1;
      float s[32], s2[32];
      u32 va[2][2][4];
      SDescs d;
      s_descs(t, d);
      wait_tile(t);
      issue_s(t, s, s2, va, d);  // and V^T's fragments while S's first sums run
      wgmma_wait<0>();
      reg_fence(s);
      reg_fence(s2);
      release(t);
      PWords pw;
      softmax(t, s, s2, pw);
      store_p(pw, buf);
      fence_proxy_async();  // P's generic stores, then wgmma's reads
      named_bar_sync(1, 128);
      float acc[2][32];
      issue_o(va, buf, acc);
      wgmma_wait<0>();
      reg_fence(acc[0]);
      reg_fence(acc[1]);
      fold(buf, acc);
    }
  }

  // The rows' sums and maxima by row, then O^T's threads write their columns' rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  if (q4 == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st_shared_f32(s_m + 4 * (r_lo + 8 * h), m_run[h]);
      st_shared_f32(s_l + 4 * (r_lo + 8 * h), l_run[h]);
    }
  }
  named_bar_sync(1, 128);
  const int pieces = p.num_splits;
  const float vd = vds * (1.f / 256.f);  // V's scale, and P's 2^8
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * j + 2 * q4 + e;
      if (r >= rows_here) continue;
      const float lt = ld_shared_f32(s_l + 4 * r), mr = ld_shared_f32(s_m + 4 * r);
      const float inv = lt > 0.f ? vd / lt : 0.f;
      const float lse = lt > 0.f ? (mr + lg2(lt)) * kLn2 : neg_inf();
      const int rr = row0 + r, gq = rr / p.seqlen_q, qi = rr - gq * p.seqlen_q, head = kvh * p.group + gq;
      const long long R = (static_cast<long long>(b) * p.heads_q + head) * p.seqlen_q + qi;
      if (pieces <= 1) {
        if (warp == 0 && g == 0 && p.lse) p.lse[R] = lse;
        elem_bits* dst = static_cast<elem_bits*>(p.o) + b * p.o_stride[0] + head * p.o_stride[1] + qi * p.o_stride[2];
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
          *reinterpret_cast<u32*>(dst + 16 * (4 * mb + warp) + 2 * g) =
              pack2<T::kBf16>(o[mb][4 * j + e] * inv, o[mb][4 * j + 2 + e] * inv);
      } else {
        if (warp == 0 && g == 0) __stcg(p.part_lse + piece_lse(split, R, p.rows_total), lse);
        float* dst = p.part_o + piece_o(split, R, p.rows_total, T::kHeadDimV);
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
          __stcg(reinterpret_cast<float2*>(dst + 16 * (4 * mb + warp) + 2 * g),
                 make_float2(o[mb][4 * j + e] * inv, o[mb][4 * j + 2 + e] * inv));
      }
    }
  if (pieces <= 1 || !T::kLastCta) return;
  // combine: last_cta (as consume's).
  __threadfence();
  named_bar_sync(1, 128);
  const u32 s_last = s_m;  // read above
  if (tid == 0) {
    int* counter = p.counters + unit_counter(b, kvh, rb, p.heads_kv, p.row_blocks);
    const int last = atomicAdd(counter, 1) == pieces - 1;
    if (last) *counter = 0;
    st_shared_f32(s_last, last ? 1.f : 0.f);
  }
  named_bar_sync(1, 128);
  if (ld_shared_f32(s_last) == 0.f) return;
  __threadfence();
  const int r_base = (b * p.heads_q + kvh * p.group) * p.seqlen_q + row0;
  combine_rows(p, r_base, rows_here, pieces, tid, 128);
}
