// ---- templates/common/bwd_params.h: the one kernel argument of the backward families (issue 45;
// flash_bwd_mma's three kernels), passed by value. Plain C, shared by host and NVRTC code. The
// forward's half (q, k, v, o, lse, their strides, sizes, scale, variants) is an AttnParams, filled
// as every forward kernel's is (launch_plan.h's fill_tensor_args), so that the two passes read one
// layout of the same tensors.
#ifndef ATTNTUNE_BWD_PARAMS_H
#define ATTNTUNE_BWD_PARAMS_H

#include "attn_params.h"
#include "tma_desc.h"

struct BwdParams {
  // q, k, v: the forward's inputs; o: the forward's output (read); lse: its LSE, [batch, heads_q,
  // seqlen_q] fp32 contiguous, natural log (read).
  AttnParams fwd;
  const void* dout;  // dO: (batch, heads_q, seqlen_q, head_dim_v), strides {batch, head, row}
  void* dq;          // (batch, heads_q,  seqlen_q, head_dim)
  void* dk;          // (batch, heads_kv, seqlen_k, head_dim): summed over each KV head's query heads
  void* dv;          // (batch, heads_kv, seqlen_k, head_dim_v)
  long long do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];
  // Workspaces (the launch plan's), written by the preprocessing kernel: dq_accum, fp32 [batch,
  // heads_q, seqlen_q_rounded, head_dim], dQ accumulated over the key blocks, unscaled (zeroed
  // first); dpsum, fp32 [batch, heads_q, seqlen_q_rounded], D_i = rowsum(dO_i * O_i), the softmax's
  // backward term (0 past seqlen_q); lse_log2, the same shape, LSE_i * log2(e) (+inf past seqlen_q,
  // so that a padded row's probabilities are 0). seqlen_q_rounded: seqlen_q rounded up to the query
  // block, so that a block's rows are always in the workspaces and their rows 16-byte aligned.
  // A varlen build (ATT_VARLEN; fwd's cu_seqlens set, its seqlens the longest): the workspaces are
  // [heads_q, seqlen_q_rounded(, head_dim)], one run of rows a head holding each sequence from its
  // own multiple of the query block (bwd_prepost.cuh's bwd_seq, bwd_launch.h's rounded_q).
  float* dq_accum;
  float* dpsum;
  float* lse_log2;
  int seqlen_q_rounded;
  // Fields added after the ones above (the backward families read those at their offsets; new ones
  // go at the end).
  // deterministic: 1, bit-identical gradients run to run (Call::deterministic): the CTAs that add
  // into a query block's dQ take turns in a fixed order through dq_semaphore, int [batch, heads_q,
  // seqlen_q_rounded / the query block], zeroed by the preprocessing kernel whenever it is given
  // (null: a call that is not deterministic; the workspace is the plan's only then). 0: dQ's shares
  // are added in whatever order the CTAs reach them.
  int deterministic;
  int* dq_semaphore;
  // The CTAs' order over a packed batch (a varlen build with varlen_lpt; null otherwise, and in the
  // deterministic mode): cta_slots (sequence, key block) slots, two ints each, written by the
  // preprocessing kernel sorted by the key block's walk, longest first (bwd_prepost.cuh,
  // build_cta_order), a sequence of -1 past the batch's key blocks; the main kernel's grid is then
  // (heads_kv * dkv_split, cta_slots): blockIdx.x the grid row, blockIdx.y the slot.
  int* cta_order;
  int cta_slots;
};

// The main kernel's second argument in builds that load Q and dO by TMA (flash_bwd_wgmma's tma_loads;
// __grid_constant__): tensor maps over q and dout ([batch, heads_q, seqlen_q, head_dim], boxes of 64
// columns by the query block's rows, the 128-byte swizzle), encoded by the launch plan's executor.
struct BwdMaps {
  att::TmaDesc q, dout;
};

#endif  // ATTNTUNE_BWD_PARAMS_H
