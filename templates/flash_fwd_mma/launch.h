// ---- templates/flash_fwd_mma/launch.h: how a call becomes flash_fwd_mma's launch (the one place
// that says so; templates/common/launch_plan.h tells who runs it). One CTA per query block of
// BLOCK_M rows of one (batch, head): grid (ceil(seqlen_q / BLOCK_M), heads_q, batch), THREADS
// threads, SMEM_BYTES of dynamic shared memory; the one argument is AttnParams. A GQA-packed build
// (PACK_GQA=1) has one CTA per BLOCK_M packed rows of one (batch, KV head): grid (ceil(seqlen_q *
// q_per_kv / BLOCK_M), heads_kv, batch). A build for a
// packed batch (ATT_VARLEN) serves attntune_attention_forward_varlen with the grid of its longest
// sequence (max_seqlen_q); the blocks past a sequence's end return at once. A build for a paged
// problem (ATT_KVCACHE) serves attntune_attention_forward_kvcache (seqlen_q rows of each sequence
// over its cache_seqlens keys, paged or contiguous) with the dense grid. The query blocks, which
// block a CTA computes and the keys it visits are tiles.h's, which the kernel includes too.
#ifndef ATTNTUNE_FLASH_FWD_MMA_LAUNCH_H
#define ATTNTUNE_FLASH_FWD_MMA_LAUNCH_H

#include "../common/dense_params.h"
#include "../common/launch_plan.h"
#include "tiles.h"

namespace attntune_plan {

struct FlashFwdMmaLaunch {
  int block_m, threads, smem_bytes;
  int entry;  // the entry point the build serves (prefill_entry: dense, varlen or kvcache)
  Variants variants;  // the variants the build serves (exactly)
  int value_dim;      // ATT_HEAD_DIM_V: V's and O's head dim where it is not Q's and K's, else 0
  bool pack_gqa;      // PACK_GQA: a KV head's query heads packed into the rows of its CTAs

  static int load(const Define* d, int n, FlashFwdMmaLaunch* c, Why* why) {
    c->entry = prefill_entry(d, n);
    c->variants = Variants::load(d, n);
    c->value_dim = static_cast<int>(define_or(d, n, "ATT_HEAD_DIM_V", 0));
    c->pack_gqa = define_or(d, n, "PACK_GQA", 0) != 0;
    return define_int(d, n, "BLOCK_M", &c->block_m, why) || define_int(d, n, "THREADS", &c->threads, why) ||
           define_int(d, n, "SMEM_BYTES", &c->smem_bytes, why);
  }

  int plan(const Call& call, const Device&, Plan* p, Why* why) const {
    if (const int r = check_prefill_entry("flash_fwd_mma", call, entry, variants, value_dim, why)) return r;
    // Packed: seqlen_q rows of each of a KV head's q_per_kv query heads.
    if (pack_gqa && (call.heads_kv < 1 || call.heads_q % call.heads_kv != 0))
      return refuse(why, "flash_fwd_mma: heads_q %d is not a multiple of heads_kv %d", call.heads_q, call.heads_kv);
    const int group = pack_gqa ? call.heads_q / call.heads_kv : 1;
    const int heads = pack_gqa ? call.heads_kv : call.heads_q;
    const long long rows = static_cast<long long>(call.seqlen_q) * group;
    if (rows > 0x7fffffffLL)
      return refuse(why, "flash_fwd_mma: seqlen_q %d times %d packed query heads exceeds 2^31 rows", call.seqlen_q, group);
    const long long blocks = att::mma_tiles::query_blocks<long long>(rows, block_m);
    if (check_grid(blocks, heads, call.batch, why)) return 1;
    p->launches = 1;
    p->launch[0] = Launch{0,
                          {static_cast<unsigned>(blocks), static_cast<unsigned>(heads),
                           static_cast<unsigned>(call.batch)},
                          static_cast<unsigned>(threads),
                          static_cast<unsigned>(smem_bytes),
                          1};
    return 0;
  }

  int bind(const Call& call, const Plan&, const Resources&, int, Args* args, Why* why) const {
    if (!args->add(dense_params(call))) return refuse(why, "flash_fwd_mma: the arguments do not fit");
    return 0;
  }
};

inline constexpr LaunchFamily kFlashFwdMma = make_family<FlashFwdMmaLaunch>("flash_fwd_mma", kEntryDense | kEntryKvcache | kEntryVarlen, 1,
                                                                 "flash_fwd_mma");

}  // namespace attntune_plan

#endif  // ATTNTUNE_FLASH_FWD_MMA_LAUNCH_H
