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
  p.q = c.q;
  p.k = c.k;
  p.v = c.v;
  p.o = c.out;
  p.lse = c.lse;
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = c.q_stride[i];
    p.k_stride[i] = c.k_stride[i];
    p.v_stride[i] = c.v_stride[i];
    p.o_stride[i] = c.o_stride[i];
  }
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k;
  p.q_per_kv = c.heads_kv > 0 ? c.heads_q / c.heads_kv : 1;
  p.scale = c.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(c.scale) * 1.4426950408889634);  // log2(e)
  return p;
}

// The grid limits every one-CTA-per-tile launch shares: y and z at most 65535, x below 2^31.
inline int check_grid(long long x, long long y, long long z, Why* why) {
  if (x > 2147483647LL || y > 65535 || z > 65535)
    return refuse(why, "a grid of (%lld, %lld, %lld) CTAs exceeds the limits (2^31 - 1, 65535, 65535)", x, y, z);
  return 0;
}

}  // namespace attntune_plan

#endif  // ATTNTUNE_DENSE_PARAMS_H
