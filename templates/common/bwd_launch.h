// ---- templates/common/bwd_launch.h: the launch plan of the backward families (flash_bwd_mma,
// flash_bwd_wgmma), once, for attntune_attention_backward (kEntryBackward) and, a build with
// ATT_VARLEN, attntune_attention_backward_varlen (kEntryBackwardVarlen: seqlen_q/seqlen_k are the
// longest sequence's, the workspaces a run of rows a head, bwd_prepost.cuh's bwd_seq). Three kernels,
// each with BwdParams as its one argument:
//   0 flash_bwd_preprocess  grid (seqlen_q_rounded / BLOCK_M, heads_q, batch), THREADS threads;
//   1 the main loop         grid (ceil(seqlen_k / block_n), heads_kv * DKV_SPLIT, batch), THREADS threads,
//                           SMEM_BYTES of dynamic shared memory; a packed batch's sorted order
//                           (VARLEN_LPT, a call not in the deterministic mode) grid (heads_kv *
//                           DKV_SPLIT, slots), slots = total_k / block_n + batch;
//   2 flash_bwd_convert     grid (ceil(seqlen_q / BLOCK_M), heads_q, batch), THREADS threads.
// Workspaces (none zeroed: the preprocessing kernel writes them every call): 0 dq_accum (fp32,
// [batch, heads_q, seqlen_q_rounded, head_dim]), 1 dpsum and 2 lse_log2 (fp32, [batch, heads_q,
// seqlen_q_rounded]), and for a deterministic call 3 dq_semaphore (int, one a query block: the turns
// of bwd_blocks.h), for a sorted order instead 3 cta_order (two ints a slot); seqlen_q_rounded is seqlen_q rounded up to BLOCK_M. A call without queries
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
  int d_pad;          // D_PAD: the head dim the kernels compute over (the call's, zero-padded to 64, 128 or 256)
  int varlen;         // ATT_VARLEN: the build serves attntune_attention_backward_varlen alone
  int dkv_split;      // DKV_SPLIT (flash_bwd_mma): CTAs a key block, each a part of dK's and dV's head dims
  int varlen_lpt;     // VARLEN_LPT (varlen builds): the main kernel's CTAs in the preprocessing kernel's order
  int bf16;           // ATT_DTYPE_BF16: the maps' element type (tma_loads)
  int tma_loads;      // TMA_LOADS (flash_bwd_wgmma, dense builds): Q and dO by TMA, their maps the main kernel's second argument
  Variants variants;  // the variants the build serves (exactly)

  // The defines every backward build has; the family's load() adds block_n.
  static int load_common(const Define* d, int n, BwdLaunch* c, Why* why) {
    c->variants = Variants::load(d, n);
    c->causal = static_cast<int>(define_or(d, n, "ATT_CAUSAL", 0));
    c->varlen = define_or(d, n, "ATT_VARLEN", 0) ? 1 : 0;
    c->dkv_split = static_cast<int>(define_or(d, n, "DKV_SPLIT", 1));
    c->varlen_lpt = c->varlen && define_or(d, n, "VARLEN_LPT", 0) ? 1 : 0;
    c->tma_loads = define_or(d, n, "TMA_LOADS", 0) ? 1 : 0;
    c->bf16 = define_or(d, n, "ATT_DTYPE_BF16", 0) ? 1 : 0;
    if (define_int(d, n, "ATT_HEAD_DIM", &c->head_dim, why)) return 1;
    c->d_pad = static_cast<int>(define_or(d, n, "D_PAD", c->head_dim));
    return define_int(d, n, "BLOCK_M", &c->block_m, why) ||
           define_int(d, n, "THREADS", &c->threads, why) || define_int(d, n, "SMEM_BYTES", &c->smem_bytes, why);
  }

  // The rows of a run of the workspaces (BwdParams::seqlen_q_rounded): dense, seqlen_q rounded up
  // to the query block (one run a (batch, head)); varlen, one run a head holding every sequence
  // from its own multiple of the query block (bwd_prepost.cuh's bwd_seq): (total_q + batch *
  // block_m) rounded down to it.
  long long rounded_q(const Call& call) const {
    if (varlen) return (call.total_q + static_cast<long long>(call.batch) * block_m) / block_m * block_m;
    return ceil_div(call.seqlen_q, block_m) * block_m;
  }
  // A packed batch's CTA order (varlen_lpt; bwd_prepost.cuh's build_cta_order): its slots, at least
  // the batch's (sequence, key block) pairs (ceil(len_k / block_n) a sequence, so at most
  // total_k / block_n + 1 each), or 0 where the call keeps the grid's order: the deterministic mode
  // (its turns need a sequence's lower key blocks launched first) and calls the preprocessing kernel
  // does not run for (no queries) or with no keys.
  long long order_slots(const Call& call) const {
    if (!varlen_lpt || call.deterministic || call.seqlen_q <= 0 || call.seqlen_k <= 0) return 0;
    const long long slots = call.total_k / block_n + call.batch;
    return slots <= 65535 ? slots : 0;  // a grid's y (past it, more keys than a sort pays for: the grid's order)
  }
  // The workspaces' rows in all.
  long long workspace_rows(const Call& call) const {
    return varlen ? call.heads_q * rounded_q(call)
                  : static_cast<long long>(call.batch) * call.heads_q * rounded_q(call);
  }

  int plan(const Call& call, const Device&, Plan* p, Why* why) const {
    const char* name = Family::kName;
    const int entry = varlen ? kEntryBackwardVarlen : kEntryBackward;
    if (call.entry != entry) {
      if (call.entry == kEntryBackward || call.entry == kEntryBackwardVarlen)
        return refuse(why, "this %s kernel was built for the backward pass of %s (%s); the call is %s", name,
                      varlen ? "packed varlen batches" : "dense tensors",
                      varlen ? "attntune_attention_backward_varlen" : "attntune_attention_backward",
                      call.entry == kEntryBackwardVarlen ? "a packed varlen batch's" : "of dense tensors");
      return refuse(why, "this %s kernel computes the backward pass: it serves %s only (tune a problem with pass=bwd)",
                    name, varlen ? "attntune_attention_backward_varlen" : "attntune_attention_backward");
    }
    if (varlen) {
      if (!call.cu_seqlens_q || !call.cu_seqlens_k)
        return refuse(why, "cu_seqlens_q and cu_seqlens_k must not be NULL");
      if (call.total_q < 0 || call.total_k < 0)
        return refuse(why, "the backward pass of a packed batch needs total_q and total_k (the packed rows)");
      if (rounded_q(call) > 2147483647LL)
        return refuse(why, "total_q %lld with batch %d exceeds the workspaces' row index (2^31 - 1)", call.total_q,
                      call.batch);
    }
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
    if (tma_loads && refuse_tma(call, why)) return 1;
    const long long rows = workspace_rows(call);
    // The preprocessing kernel's query blocks: a run's, dense; the longest sequence's, varlen.
    const long long pre_blocks = varlen ? ceil_div(call.seqlen_q, block_m) : rounded_q(call) / block_m;
    const long long slots = order_slots(call), grid_rows = static_cast<long long>(call.heads_kv) * dkv_split;
    if (check_grid(pre_blocks, call.heads_q, call.batch, why) ||
        (slots > 0 ? check_grid(grid_rows, slots, 1, why)
                   : check_grid(ceil_div(call.seqlen_k, block_n), grid_rows, call.batch, why)))
      return 1;
    p->workspaces = call.deterministic || slots > 0 ? 4 : 3;
    p->workspace[0] = Workspace{static_cast<unsigned long long>(rows) * d_pad * 4, 0, 0};  // dQ's fp32 accumulator
    p->workspace[1] = Workspace{static_cast<unsigned long long>(rows) * 4, 0, 0};
    p->workspace[2] = Workspace{static_cast<unsigned long long>(rows) * 4, 0, 0};
    if (call.deterministic) p->workspace[3] = Workspace{static_cast<unsigned long long>(rows / block_m) * 4, 0, 0};
    if (slots > 0) p->workspace[3] = Workspace{static_cast<unsigned long long>(slots) * 8, 0, 0};  // two ints a slot
    const unsigned hq = static_cast<unsigned>(call.heads_q), bt = static_cast<unsigned>(call.batch);
    if (call.seqlen_q > 0)
      p->launch[p->launches++] =
          Launch{0, {static_cast<unsigned>(pre_blocks), hq, bt}, static_cast<unsigned>(threads), 0, 1};
    if (call.seqlen_k > 0) {
      // (grid rows, slots) in the sorted order; else (key blocks of the longest, grid rows, batch).
      const unsigned kx = static_cast<unsigned>(ceil_div(call.seqlen_k, block_n)), gr = static_cast<unsigned>(grid_rows);
      p->launch[p->launches++] =
          Launch{1, {slots > 0 ? gr : kx, slots > 0 ? static_cast<unsigned>(slots) : gr, slots > 0 ? 1u : bt},
                 static_cast<unsigned>(threads), static_cast<unsigned>(smem_bytes), 1};
    }
    if (call.seqlen_q > 0)
      p->launch[p->launches++] = Launch{
          2, {static_cast<unsigned>(ceil_div(call.seqlen_q, block_m)), hq, bt}, static_cast<unsigned>(threads), 0, 1};
    if (tma_loads) {
      // Q's and dO's maps: boxes of 64 columns (zeros past head_dim: a padded build's columns) by
      // block_m rows (zeros past seqlen_q), in the 128-byte swizzle the kernel's tiles have.
      const int len = call.seqlen_q > 0 ? call.seqlen_q : 1;
      p->maps = 2;
      p->map[0] = operand_map("q", call.q, call.q_stride, len, call.heads_q, call.batch, call.head_dim, 64,
                              static_cast<unsigned>(block_m), bf16);
      p->map[1] = operand_map("dout", call.dout, call.do_stride, len, call.heads_q, call.batch, call.head_dim, 64,
                              static_cast<unsigned>(block_m), bf16);
    }
    return 0;
  }

  // A TMA-loading build (tma_loads) against a call: its maps need q's and dout's rows 16-byte aligned
  // (base and every stride of an extent past 1 a multiple of 8 elements) and strides below 2^40 bytes.
  static int refuse_tma(const Call& call, Why* why) {
    const struct {
      const char* name;
      const void* base;
      const long long* stride;
    } tensors[] = {{"q", call.q, call.q_stride}, {"dout", call.dout, call.do_stride}};
    const long long extent[3] = {call.batch, call.heads_q, call.seqlen_q};
    for (const auto& t : tensors) {
      if (reinterpret_cast<unsigned long long>(t.base) % 16 != 0)
        return refuse(why, "this kernel loads %s by TMA, which needs a 16-byte aligned base (%p)", t.name, t.base);
      for (int i = 0; i < 3; ++i)
        if (extent[i] > 1 && (t.stride[i] % 8 != 0 || t.stride[i] >= (1LL << 40) / 2))
          return refuse(why,
                        "this kernel loads %s by TMA, whose strides must be multiples of 8 elements (16 bytes) and "
                        "below 2^40 bytes: %s strides {%lld, %lld, %lld}",
                        t.name, t.name, t.stride[0], t.stride[1], t.stride[2]);
    }
    return 0;
  }

  int bind(const Call& call, const Plan& plan, const Resources& res, int launch, Args* args, Why* why) const {
    BwdParams p;
    std::memset(&p, 0, sizeof p);
    Call fwd = call;
    fwd.entry = varlen ? kEntryVarlen : kEntryDense;  // the forward's half: its tensors (varlen: prefix sums)
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
    if (p.deterministic && workspace_rows(call) > 0 && !p.dq_semaphore)
      return refuse(why, "%s: a deterministic call without its semaphore workspace", Family::kName);
    p.cta_slots = static_cast<int>(order_slots(call));
    p.cta_order = p.cta_slots > 0 ? static_cast<int*>(res.workspace[3]) : nullptr;
    if (p.cta_slots > 0 && !p.cta_order)
      return refuse(why, "%s: a packed batch's CTA order without its workspace", Family::kName);
    if (!args->add(p)) return refuse(why, "%s: the arguments do not fit", Family::kName);
    if (tma_loads && plan.launch[launch].kernel == 1) {  // the main kernel's maps
      if (!res.map[0] || !res.map[1]) return refuse(why, "%s: Q's and dO's tensor maps are missing", Family::kName);
      BwdMaps maps;
      std::memcpy(&maps.q, res.map[0], sizeof maps.q);
      std::memcpy(&maps.dout, res.map[1], sizeof maps.dout);
      if (!args->add(maps)) return refuse(why, "%s: the arguments do not fit", Family::kName);
    }
    return 0;
  }
};

}  // namespace attntune_plan

#endif  // ATTNTUNE_BWD_LAUNCH_H
