// ---- templates/common/bwd_launch.h: the launch plan of the backward families (flash_bwd_mma,
// flash_bwd_wgmma), once. Three kernels, each with BwdParams as its one argument:
//   0 flash_bwd_preprocess  grid (seqlen_q_rounded / BLOCK_M, heads_q, batch), THREADS threads;
//   1 the main loop         grid (ceil(seqlen_k / block_n), heads_kv, batch), THREADS threads,
//                           SMEM_BYTES of dynamic shared memory;
//   2 flash_bwd_convert     grid (ceil(seqlen_q / BLOCK_M), heads_q, batch), THREADS threads.
// Workspaces (none zeroed: the preprocessing kernel writes them every call): 0 dq_accum (fp32,
// [batch, heads_q, seqlen_q_rounded, head_dim]), 1 dpsum and 2 lse_log2 (fp32, [batch, heads_q,
// seqlen_q_rounded]), and for a deterministic call 3 dq_semaphore (int, one a query block: the turns
// of bwd_blocks.h); seqlen_q_rounded is seqlen_q rounded up to BLOCK_M. A call without queries
// launches the main kernel only (dK = dV = 0), one without keys the other two (dQ = 0).
//
// A family's launch struct derives from BwdLaunch<Itself> and gives its name (kName) and load(),
// which reads its defines into the members (block_n from its own tunables).
#ifndef ATTNTUNE_BWD_LAUNCH_H
#define ATTNTUNE_BWD_LAUNCH_H

#include "bwd_params.h"
#include "dense_params.h"
#include "launch_plan.h"

namespace attntune_plan {

template <class Family>
struct BwdLaunch {
  int head_dim, causal, block_m, block_n, threads, smem_bytes;
  Variants variants;  // the variants the build serves (exactly): a window only, for now

  // The defines every backward build has; the family's load() adds block_n.
  static int load_common(const Define* d, int n, BwdLaunch* c, Why* why) {
    c->variants = Variants::load(d, n);
    c->causal = static_cast<int>(define_or(d, n, "ATT_CAUSAL", 0));
    return define_int(d, n, "ATT_HEAD_DIM", &c->head_dim, why) || define_int(d, n, "BLOCK_M", &c->block_m, why) ||
           define_int(d, n, "THREADS", &c->threads, why) || define_int(d, n, "SMEM_BYTES", &c->smem_bytes, why);
  }

  long long rounded_q(const Call& call) const { return ceil_div(call.seqlen_q, block_m) * block_m; }

  int plan(const Call& call, const Device&, Plan* p, Why* why) const {
    const char* name = Family::kName;
    if (call.entry != kEntryBackward)
      return refuse(why, "this %s kernel computes the backward pass: it serves attntune_attention_backward only (tune "
                    "a problem with pass=bwd)", name);
    if (check_variants(name, variants, call, why) || check_value_dim(name, call, 0, why) ||
        check_kv_dtype(name, call, 0, why))
      return 1;
    if (call.head_dim != head_dim)
      return refuse(why, "this %s kernel was built for head_dim %d; the call has %d", name, head_dim, call.head_dim);
    if ((call.causal != 0) != (causal != 0))
      return refuse(why, "this %s kernel was built for %s attention; the call is %s", name,
                    causal ? "causal" : "non-causal", call.causal ? "causal" : "non-causal");
    if (!call.lse || !call.out || !call.dout || !call.dq || !call.dk || !call.dv)
      return refuse(why, "the backward pass needs out, softmax_lse, dout, dq, dk and dv (none may be NULL)");
    if (call.heads_kv < 1 || call.heads_q % call.heads_kv != 0)
      return refuse(why, "heads_q %d is not a multiple of heads_kv %d", call.heads_q, call.heads_kv);
    const long long rows = static_cast<long long>(call.batch) * call.heads_q * rounded_q(call);
    if (check_grid(rounded_q(call) / block_m, call.heads_q, call.batch, why) ||
        check_grid(ceil_div(call.seqlen_k, block_n), call.heads_kv, call.batch, why))
      return 1;
    p->workspaces = call.deterministic ? 4 : 3;
    p->workspace[0] = Workspace{static_cast<unsigned long long>(rows) * head_dim * 4, 0, 0};
    p->workspace[1] = Workspace{static_cast<unsigned long long>(rows) * 4, 0, 0};
    p->workspace[2] = Workspace{static_cast<unsigned long long>(rows) * 4, 0, 0};
    if (call.deterministic) p->workspace[3] = Workspace{static_cast<unsigned long long>(rows / block_m) * 4, 0, 0};
    const unsigned hq = static_cast<unsigned>(call.heads_q), bt = static_cast<unsigned>(call.batch);
    if (call.seqlen_q > 0)
      p->launch[p->launches++] =
          Launch{0, {static_cast<unsigned>(rounded_q(call) / block_m), hq, bt}, static_cast<unsigned>(threads), 0, 1};
    if (call.seqlen_k > 0)
      p->launch[p->launches++] = Launch{1,
                                        {static_cast<unsigned>(ceil_div(call.seqlen_k, block_n)),
                                         static_cast<unsigned>(call.heads_kv), bt},
                                        static_cast<unsigned>(threads),
                                        static_cast<unsigned>(smem_bytes),
                                        1};
    if (call.seqlen_q > 0)
      p->launch[p->launches++] = Launch{
          2, {static_cast<unsigned>(ceil_div(call.seqlen_q, block_m)), hq, bt}, static_cast<unsigned>(threads), 0, 1};
    return 0;
  }

  int bind(const Call& call, const Plan&, const Resources& res, int, Args* args, Why* why) const {
    BwdParams p;
    std::memset(&p, 0, sizeof p);
    Call fwd = call;
    fwd.entry = kEntryDense;  // the forward's half: the dense tensors
    p.fwd = dense_params(fwd);
    p.fwd.o = call.out;
    p.dout = call.dout;
    p.dq = call.dq;
    p.dk = call.dk;
    p.dv = call.dv;
    for (int i = 0; i < 3; ++i) {
      p.do_stride[i] = call.do_stride[i];
      p.dq_stride[i] = call.dq_stride[i];
      p.dk_stride[i] = call.dk_stride[i];
      p.dv_stride[i] = call.dv_stride[i];
    }
    p.dq_accum = static_cast<float*>(res.workspace[0]);
    p.dpsum = static_cast<float*>(res.workspace[1]);
    p.lse_log2 = static_cast<float*>(res.workspace[2]);
    p.seqlen_q_rounded = static_cast<int>(rounded_q(call));
    p.deterministic = call.deterministic ? 1 : 0;
    p.dq_semaphore = call.deterministic ? static_cast<int*>(res.workspace[3]) : nullptr;
    if (p.deterministic && rounded_q(call) > 0 && call.batch > 0 && call.heads_q > 0 && !p.dq_semaphore)
      return refuse(why, "%s: a deterministic call without its semaphore workspace", Family::kName);
    if (!args->add(p)) return refuse(why, "%s: the arguments do not fit", Family::kName);
    return 0;
  }
};

}  // namespace attntune_plan

#endif  // ATTNTUNE_BWD_LAUNCH_H
