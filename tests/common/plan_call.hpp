// Launch plans on the host, for CPU tests: a dense call of a problem on [B, H, S, D] tensors at
// fake (never dereferenced, 256-byte aligned) addresses, and a device of a given size.
#pragma once
#include <cstdint>

#include "families/family.hpp"
#include "templates/common/launch_plan.h"

namespace attntune::testing {

// A shipped space, from the source tree.
inline SearchSpace space_of(const std::string& family) {
  return SearchSpace::load(ATTNTUNE_SOURCE_DIR "/search_spaces/" + family + ".yaml");
}

// The first valid config of `space` for `p` on `arch` that `pick` accepts (empty: none).
template <class Pick>
inline Config first_config(const SearchSpace& space, const Problem& p, const std::string& arch, Pick pick) {
  Config c;
  space.for_each_valid(p, arch, [&](const Config& x) {
    if (c.empty() && pick(x)) c = x;
  });
  return c;
}

inline attntune_plan::Call dense_call_of(const Problem& p, long long base = 1ll << 32) {
  return problem_dense_call(p, base);
}

// The backward call of p on fake addresses: the dense call's tensors and dO, dQ, dK, dV beside them.
inline attntune_plan::Call backward_call_of(const Problem& p) {
  attntune_plan::Call c = dense_call_of(p);
  c.entry = attntune_plan::kEntryBackward;
  c.lse = reinterpret_cast<float*>(3ll << 40);
  c.dout = reinterpret_cast<const void*>(4ll << 40);
  c.dq = reinterpret_cast<void*>(5ll << 40);
  c.dk = reinterpret_cast<void*>(6ll << 40);
  c.dv = reinterpret_cast<void*>(7ll << 40);
  for (int i = 0; i < 3; ++i) {
    c.do_stride[i] = c.dq_stride[i] = c.q_stride[i];
    c.dk_stride[i] = c.k_stride[i];
    c.dv_stride[i] = c.v_stride[i];
  }
  return c;
}

// The varlen call of a packed batch of p.b sequences of up to p.s rows (totals: p.b * p.s and
// p.b * p.sk unless given; -1: not given), [total, heads, d] tensors, prefix sums at fake addresses.
inline attntune_plan::Call varlen_call_of(const Problem& p, long long total_q = -2, long long total_k = -2) {
  attntune_plan::Call c = dense_call_of(p);
  c.entry = attntune_plan::kEntryVarlen;
  c.q_stride[0] = c.k_stride[0] = c.v_stride[0] = c.o_stride[0] = 0;
  c.q_stride[1] = c.k_stride[1] = c.v_stride[1] = c.o_stride[1] = p.d;
  c.q_stride[2] = c.o_stride[2] = p.h * p.d;
  c.k_stride[2] = c.v_stride[2] = p.hkv * p.d;
  c.cu_seqlens_q = reinterpret_cast<const int*>(1ll << 40);
  c.cu_seqlens_k = reinterpret_cast<const int*>((1ll << 40) + 4096);
  c.total_q = total_q == -2 ? p.b * p.s : total_q;
  c.total_k = total_k == -2 ? p.b * p.sk : total_k;
  return c;
}

// The backward call of a packed batch (attntune_attention_backward_varlen): varlen_call_of's
// tensors and totals, and dO, dQ, dK, dV (packed as q, k, v) beside them.
inline attntune_plan::Call backward_varlen_call_of(const Problem& p, long long total_q = -2, long long total_k = -2) {
  attntune_plan::Call c = varlen_call_of(p, total_q, total_k);
  const attntune_plan::Call b = backward_call_of(p);
  c.entry = attntune_plan::kEntryBackwardVarlen;
  c.lse = b.lse;
  c.dout = b.dout;
  c.dq = b.dq;
  c.dk = b.dk;
  c.dv = b.dv;
  for (int i = 0; i < 3; ++i) {
    c.do_stride[i] = c.dq_stride[i] = c.q_stride[i];
    c.dk_stride[i] = c.k_stride[i];
    c.dv_stride[i] = c.v_stride[i];
  }
  return c;
}

// A device of `sms` SMs on which `clusters` clusters fit at once (0: unknown).
struct FakeDevice {
  int sms = 132, clusters = 0;
  attntune_plan::Device device() const {
    attntune_plan::Device d;
    d.sm_count = sms;
    d.ctx = this;
    d.max_active_clusters = [](const void* ctx, int, unsigned, unsigned, unsigned, unsigned) {
      return static_cast<const FakeDevice*>(ctx)->clusters;
    };
    return d;
  }
};

}  // namespace attntune::testing
