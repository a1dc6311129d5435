// ---- templates/common/dense_params.h: AttnParams (the prefill kernels' first argument) filled from
// one call of a launch plan, the one way every executor fills it. Host code, plain C++.
#ifndef ATTNTUNE_DENSE_PARAMS_H
#define ATTNTUNE_DENSE_PARAMS_H

#include "attn_params.h"
#include "launch_plan.h"

namespace attntune_plan {

inline AttnParams dense_params(const Call& c) {
  AttnParams p;
  std::memset(&p, 0, sizeof p);
  fill_tensor_args(c, &p);
  p.q_per_kv = c.heads_kv > 0 ? c.heads_q / c.heads_kv : 1;
  if (c.entry == kEntryVarlen) {
    p.cu_seqlens_q = c.cu_seqlens_q;
    p.cu_seqlens_k = c.cu_seqlens_k;
  }
  if (c.entry == kEntryKvcache) {
    p.cache_seqlens = c.cache_seqlens;
    p.block_table = c.block_table;
    p.max_blocks_per_seq = c.block_table ? c.max_blocks_per_seq : 0;
    p.page_size = c.block_table ? c.page_size : 0;
    if (c.block_table) page_divisor(c.page_size, &p.page_mul, &p.page_shift);
  }
  return p;
}

// The other way: the call of attntune_attention_forward on the tensors `p` describes (tests and
// harnesses hold their inputs as AttnParams).
inline Call dense_call(const AttnParams& p, int head_dim, int causal) {
  Call c = empty_call();
  c.entry = kEntryDense;
  c.q = p.q;
  c.k = p.k;
  c.v = p.v;
  c.out = p.o;
  c.lse = p.lse;
  for (int i = 0; i < 3; ++i) {
    c.q_stride[i] = p.q_stride[i];
    c.k_stride[i] = p.k_stride[i];
    c.v_stride[i] = p.v_stride[i];
    c.o_stride[i] = p.o_stride[i];
  }
  c.batch = p.batch;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.seqlen_q = p.seqlen_q;
  c.seqlen_k = p.seqlen_k;
  c.head_dim = head_dim;
  c.scale = p.scale;
  c.causal = causal;
  return c;
}

// The entry point a prefill build serves, from its constants: attntune_attention_forward_varlen
// for a build of a packed batch (ATT_VARLEN), attntune_attention_forward_kvcache for one of a paged
// problem (ATT_KVCACHE), else attntune_attention_forward. Builds recorded before either existed
// lack both: dense.
inline int prefill_entry(const Define* d, int n) {
  if (define_or(d, n, "ATT_VARLEN", 0)) return kEntryVarlen;
  if (define_or(d, n, "ATT_KVCACHE", 0)) return kEntryKvcache;
  return kEntryDense;
}

// Whether a prefill build for `entry` (prefill_entry) with `variants` serves `call`: 0, or 1 with
// the reason. A varlen call also needs its prefix sums; a kvcache call with a page table pages that
// can hold seqlen_k_max keys; every call the build's variants exactly.
// value_dim: the build's ATT_HEAD_DIM_V (0: one head dim), check_value_dim.
inline int check_prefill_entry(const char* family, const Call& call, int entry, const Variants& variants, int value_dim,
                               Why* why, int kv_fp8 = 0, int qkv_fp8 = 0) {
  if (call.entry == entry) {
    // A call's cache dtype must be the build's (kv_fp8: an FP8 cache build, flash_fwd_wgmma's
    // kvcache only): refused with the reason here, for every prefill family, rather than by the
    // export's table alone.
    if (check_variants(family, variants, call, why) || check_value_dim(family, call, value_dim, why) ||
        check_kv_dtype(family, call, kv_fp8, why, qkv_fp8))
      return 1;
    if (entry == kEntryVarlen && (!call.cu_seqlens_q || !call.cu_seqlens_k))
      return refuse(why, "cu_seqlens_q and cu_seqlens_k must not be NULL");
    if (entry == kEntryKvcache && call.block_table) {
      if (call.page_size < 1) return refuse(why, "%s: page_size %d (must be at least 1)", family, call.page_size);
      if (static_cast<long long>(call.max_blocks_per_seq) * call.page_size < call.seqlen_k)
        return refuse(why, "%s: max_blocks_per_seq %d pages of %d keys cannot hold seqlen_k_max %d keys", family,
                      call.max_blocks_per_seq, call.page_size, call.seqlen_k);
      if (static_cast<long long>(call.max_blocks_per_seq) * call.batch >= (1LL << 31))
        return refuse(why, "%s: a block table of batch %d x max_blocks_per_seq %d entries is 2^31 or more", family,
                      call.batch, call.max_blocks_per_seq);
    }
    return 0;
  }
  const char* tune = call.entry == kEntryKvcache ? "a paged problem (`page=N` in the problem spec)"
                     : call.entry == kEntryVarlen ? "a varlen problem (`varlen=N` in the problem spec)"
                                                  : "a dense problem";
  const char* serves = entry == kEntryVarlen    ? "packed batches of different lengths: it serves "
                                                  "attntune_attention_forward_varlen only"
                       : entry == kEntryKvcache ? "a KV cache: it serves attntune_attention_forward_kvcache only"
                                                : "dense tensors: it serves attntune_attention_forward only";
  return refuse(why, "this %s kernel was built for %s (tune %s for this call)", family, serves, tune);
}

// The grid limits every one-CTA-per-tile launch shares: y and z at most 65535, x below 2^31.
inline int check_grid(long long x, long long y, long long z, Why* why) {
  if (x > 2147483647LL || y > 65535 || z > 65535)
    return refuse(why, "a grid of (%lld, %lld, %lld) CTAs exceeds the limits (2^31 - 1, 65535, 65535)", x, y, z);
  return 0;
}

}  // namespace attntune_plan

#endif  // ATTNTUNE_DENSE_PARAMS_H
