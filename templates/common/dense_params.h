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

// Whether a prefill build (dense, or for packed batches when `varlen`) serves `call`'s entry point:
// 0, or 1 with the reason. A varlen call also needs its prefix sums.
inline int check_prefill_entry(const char* family, const Call& call, int varlen, Why* why) {
  if (varlen) {
    if (call.entry != kEntryVarlen)
      return refuse(why,
                    "this %s kernel was built for packed batches of different lengths: it serves "
                    "attntune_attention_forward_varlen only (tune a dense problem for this call)",
                    family);
    if (!call.cu_seqlens_q || !call.cu_seqlens_k) return refuse(why, "cu_seqlens_q and cu_seqlens_k must not be NULL");
    return 0;
  }
  if (call.entry == kEntryVarlen)
    return refuse(why,
                  "this %s kernel was built for dense tensors: a packed batch (attntune_attention_forward_varlen) "
                  "needs a kernel tuned on a varlen problem (`varlen=N` in the problem spec)",
                  family);
  if (call.entry != kEntryDense) return refuse(why, "%s serves attntune_attention_forward only", family);
  return 0;
}

// The grid limits every one-CTA-per-tile launch shares: y and z at most 65535, x below 2^31.
inline int check_grid(long long x, long long y, long long z, Why* why) {
  if (x > 2147483647LL || y > 65535 || z > 65535)
    return refuse(why, "a grid of (%lld, %lld, %lld) CTAs exceeds the limits (2^31 - 1, 65535, 65535)", x, y, z);
  return 0;
}

}  // namespace attntune_plan

#endif  // ATTNTUNE_DENSE_PARAMS_H
