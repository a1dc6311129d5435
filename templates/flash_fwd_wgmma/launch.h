// ---- templates/flash_fwd_wgmma/launch.h: how a call becomes flash_fwd_wgmma's launch, the one
// place that says so (templates/common/launch_plan.h tells who runs it): the grid (one CTA per
// work tile, or a persistent grid of whole clusters), the tensor maps of Q, K and V, the
// workspaces of split_tail and of the causal tile counter, and what makes a call unsupported.
//
// Work tiles: (query blocks, heads_q, batch), the query blocks ceil(seqlen_q / BLOCK_M) rounded
// up to whole clusters (kv_multicast pairs CTAs 2k and 2k+1 on one head's K and V; the kernel
// leaves the padding block idle). A persistent grid launches one CTA per SM at most, in whole
// clusters, no more clusters than fit on the device at once, and the CTAs walk the tiles. The
// counts, the persistent grid and the split tail's rule are scheduler.h's, which the kernel
// includes too.
//
// A build for packed batches (ATT_VARLEN; one CTA per tile) launches one CTA per tile of the
// packed sequences' index space ((total_q / block_m + batch) * heads_q, scheduler.h),
// (sequences longest first when the work is large: a one-CTA kernel orders them first, launch 0),
// and its tensor maps span the packed rows: it needs their counts (Call::total_q, total_k), which attntune_attention_forward_varlen_packed and the PyTorch
// op pass; the contract's varlen entry point does not, and such a build refuses it.
//
// A build for a KV cache (ATT_KVCACHE; the dense grid or a persistent one, without the split tail
// or multicast) serves
// attntune_attention_forward_kvcache: with a page table, K and V maps over the pages
// (head_dim, page_size, heads_kv, pages) in boxes of gcd(page_size, BLOCK_N) rows (page_size a
// multiple of 8: the swizzle atom's rows); without, the dense maps over seqlen_k_max rows. Each
// tile's keys come from cache_seqlens in the kernel.
#ifndef ATTNTUNE_FLASH_FWD_WGMMA_LAUNCH_H
#define ATTNTUNE_FLASH_FWD_WGMMA_LAUNCH_H

#include "../common/dense_params.h"
#include "../common/launch_plan.h"
#include "args.h"
#include "scheduler.h"

namespace attntune_plan {

struct FlashFwdWgmmaLaunch {
  int head_dim, bf16, causal;
  int value_dim;  // ATT_HEAD_DIM_V: V's and O's head dim where it is not Q's and K's, else 0
  int head_dim_v() const { return value_dim ? value_dim : head_dim; }
  int block_m, block_n, threads, smem_bytes;
  int persistent;     // the CTAs walk the work tiles
  int split_tail;     // persistent, non-causal: the last partial round shared out by K/V iterations
  int dynamic_tiles;  // persistent, causal or varlen, with a producer: tiles taken from a counter
  int split_causal;   // SPLIT_TAIL on a dense causal one: the counter's last units pieces of tiles
  int head_group;     // HEAD_GROUP: the causal tile order's groups (scheduler.h, tile_coord)
  int cluster;        // kv_multicast: 2-CTA clusters sharing each K/V load; else 1
  int consumer_warps;
  int entry;          // the entry point the build serves (prefill_entry: dense, varlen or kvcache)
  int varlen;         // entry == kEntryVarlen: built for packed batches
  int pack_gqa;       // PACK_GQA: a KV head's query heads packed into the rows of its tiles
  int kv_fp8;         // ATT_KV_FP8: an FP8 e4m3 cache (kvcache builds), viewed as rows of d / 2 16-bit elements
  int qkv_fp8;        // ATT_QKV_FP8: an FP8 forward (dense; q, k and v^T e4m3, maps over bytes)
  int k_perm;         // K_PERM: an FP8 forward whose K tiles load as two boxes of key pairs (key_pairs_map)
  Variants variants;  // the variants the build serves (exactly)

  static int load(const Define* d, int n, FlashFwdWgmmaLaunch* c, Why* why) {
    int warp_specialize = 0;
    if (define_int(d, n, "ATT_HEAD_DIM", &c->head_dim, why) || define_int(d, n, "ATT_DTYPE_BF16", &c->bf16, why) ||
        define_int(d, n, "ATT_CAUSAL", &c->causal, why) || define_int(d, n, "BLOCK_M", &c->block_m, why) ||
        define_int(d, n, "BLOCK_N", &c->block_n, why) || define_int(d, n, "THREADS", &c->threads, why) ||
        define_int(d, n, "SMEM_BYTES", &c->smem_bytes, why) || define_int(d, n, "PERSISTENT", &c->persistent, why) ||
        define_int(d, n, "WARP_SPECIALIZE", &warp_specialize, why))
      return 1;
    // Configs recorded before split_tail and kv_multicast existed lack them: off.
    const bool split = define_or(d, n, "SPLIT_TAIL", 0) != 0, multicast = define_or(d, n, "KV_MULTICAST", 0) != 0;
    c->entry = prefill_entry(d, n);
    c->value_dim = static_cast<int>(define_or(d, n, "ATT_HEAD_DIM_V", 0));
    c->varlen = c->entry == kEntryVarlen;
    c->pack_gqa = define_or(d, n, "PACK_GQA", 0) != 0;  // configs recorded before it: unpacked
    c->kv_fp8 = static_cast<int>(define_or(d, n, "ATT_KV_FP8", 0));
    c->qkv_fp8 = static_cast<int>(define_or(d, n, "ATT_QKV_FP8", 0));
    c->k_perm = c->qkv_fp8 && define_or(d, n, "K_PERM", 0) != 0;  // configs recorded before it: key order
    c->variants = Variants::load(d, n);
    // A varlen build's tiles are its sequences': no split tail, no pairs (the space says so).
    c->split_tail = c->persistent && !c->causal && !c->varlen && split;
    c->dynamic_tiles = c->persistent && (c->causal || c->varlen) && warp_specialize;
    // The causal split where the space offers it (16-bit, no window: what its tests check); a
    // build of another kind with SPLIT_TAIL runs its calls unsplit (as correct).
    c->split_causal = c->dynamic_tiles && c->causal && !c->varlen && c->entry == kEntryDense && split && !c->qkv_fp8 &&
                      !c->variants.window;
    c->head_group = static_cast<int>(define_or(d, n, "HEAD_GROUP", 1));
    c->cluster = c->persistent && !c->causal && !c->varlen && multicast ? 2 : 1;
    c->consumer_warps = c->block_m / 64 * 4;
    return 0;
  }

  // A work tile's query rows and the heads the tiles run over (scheduler.h, pack_rows): a packed
  // build's pack_rows of every query head of a KV head, else block_m of one query head.
  int tile_rows(const Call& c) const {
    return pack_gqa ? att::sched::pack_rows(block_m, c.heads_kv > 0 ? c.heads_q / c.heads_kv : 0) : block_m;
  }
  int tile_heads(const Call& c) const { return pack_gqa ? c.heads_kv : c.heads_q; }

  long long work_tiles(const Call& c) const {
    return att::sched::query_blocks(static_cast<long long>(c.seqlen_q), tile_rows(c), cluster) * tile_heads(c) *
           c.batch;
  }

  int plan(const Call& call, const Device& device, Plan* p, Why* why) const {
    if (const int r = check_prefill_entry("flash_fwd_wgmma", call, entry, variants, value_dim, why, kv_fp8, qkv_fp8))
      return r;
    // An FP8 forward: TMA reads q, k and v^T as bytes, every stride a multiple of 16 bytes (v^T's
    // rows are the value dims: its keys contiguous).
    if (qkv_fp8)
      for (int i = 0; i < 3; ++i)
        if (call.q_stride[i] % 16 != 0 || call.k_stride[i] % 16 != 0 || call.v_stride[i] % 16 != 0)
          return refuse(why,
                        "an FP8 forward's byte strides must be multiples of 16 (TMA): q {%lld, %lld, %lld}, k {%lld, "
                        "%lld, %lld}, v (transposed: batch, head, value dim) {%lld, %lld, %lld}",
                        call.q_stride[0], call.q_stride[1], call.q_stride[2], call.k_stride[0], call.k_stride[1],
                        call.k_stride[2], call.v_stride[0], call.v_stride[1], call.v_stride[2]);
    // k_perm: K's map splits the keys in fours, and TMA bounds-checks the fours, not the keys: at
    // seqlen_k % 4 != 0 the last box would read up to 3 rows past the tensor.
    if (k_perm && call.seqlen_k % 4 != 0)
      return refuse(why,
                    "this FP8 forward kernel loads K in groups of 4 keys (k_perm): seqlen_k %d is not a multiple of 4 "
                    "(a kernel tuned with k_perm=false serves it)",
                    call.seqlen_k);
    // An FP8 cache: TMA reads its rows as d / 2 16-bit elements, so every byte stride must be even
    // (and TMA's 16-byte multiple, checked below as for any map).
    if (kv_fp8)
      for (int i = 0; i < 3; ++i)
        if (call.k_stride[i] % 16 != 0 || call.v_stride[i] % 16 != 0)
          return refuse(why,
                        "an FP8 cache's byte strides must be multiples of 16 (TMA reads its rows as 16-bit "
                        "elements): k {%lld, %lld, %lld}, v {%lld, %lld, %lld}",
                        call.k_stride[0], call.k_stride[1], call.k_stride[2], call.v_stride[0], call.v_stride[1],
                        call.v_stride[2]);
    if (pack_gqa) {
      if (call.heads_kv < 1 || call.heads_q % call.heads_kv != 0)
        return refuse(why, "a GQA-packed flash_fwd_wgmma kernel needs heads_q (%d) to be a multiple of heads_kv (%d)",
                      call.heads_q, call.heads_kv);
      if (tile_rows(call) < 1)
        return refuse(why,
                      "a GQA-packed flash_fwd_wgmma kernel holds a query row of every head of a KV head's group "
                      "in its %d rows: %d query heads per KV head do not fit",
                      block_m, call.heads_q / call.heads_kv);
    }
    if (varlen && (call.total_q <= 0 || call.total_k < 0 || call.total_q > 2147483647LL || call.total_k > 2147483647LL))
      return refuse(why,
                    "a flash_fwd_wgmma kernel reads the packed rows through TMA tensor maps, whose extents are the "
                    "rows of q and k (total_q %lld, total_k %lld): call attntune_attention_forward_varlen_packed, "
                    "which takes them (attntune_attention_forward_varlen does not)",
                    call.total_q, call.total_k);
    // Kvcache with a page table: K/V in boxes of kv_box_rows rows within a page.
    const bool paged = entry == kEntryKvcache && call.block_table;
    if (paged && call.page_size % 8 != 0)
      return refuse(why,
                    "flash_fwd_wgmma reads K/V pages in TMA boxes of whole swizzle atoms (8 rows, whatever the "
                    "head dim's swizzle span): page_size %d is not a multiple of 8",
                    call.page_size);
    // Rows of each tensor along its row dimension, and the batch the maps step along (varlen: the
    // packed rows, one batch; pages: a page's rows, and the pages, as many as a map allows: the
    // call does not say, and the kernel reads only pages the table names).
    const int kMaxPages = 2147483647;
    const long long q_rows = varlen ? call.total_q : call.seqlen_q, kv_rows = varlen ? call.total_k : call.seqlen_k;
    const int map_batch = varlen ? 1 : call.batch;
    const long long kv_len = paged ? call.page_size : kv_rows, kv_batch = paged ? kMaxPages : map_batch;
    // TMA: tensor-map strides below 2^40 bytes along every dimension of extent > 1.
    const struct {
      const char* name;
      const long long* stride;
      long long batch;
      int heads;
      long long len;
    } tensors[] = {{"q_strides", call.q_stride, map_batch, call.heads_q, q_rows},
                   {"k_strides", call.k_stride, kv_batch, call.heads_kv, kv_len},
                   {"v_strides", call.v_stride, kv_batch, call.heads_kv, kv_len}};
    for (const auto& t : tensors) {
      const long long extent[3] = {t.batch, t.heads, t.len};
      for (int i = 0; i < 3; ++i)
        if (extent[i] > 1 && t.stride[i] >= (1LL << 40) / 2)
          return refuse(why, "%s {%lld, %lld, %lld}: a stride of 2^40 bytes or more does not fit a TMA tensor map",
                        t.name, t.stride[0], t.stride[1], t.stride[2]);
    }
    // Varlen, longest first: the order kernel runs first (launch 0) and fills a workspace the
    // main kernel reads (varlen_orders says when).
    const bool order = varlen && varlen_orders(call);
    const bool dequant = !varlen && dequant_first(call);
    const Places at = places(order, dequant);
    if (at.counter >= 0) p->workspace[at.counter] = Workspace{2 * sizeof(int), 1, 1};
    if (order) {
      p->launch[0] = Launch{1, {1, 1, 1}, static_cast<unsigned>(att::kVarlenOrderThreads), 0, 1};
      p->workspace[at.order] = Workspace{(2ull * call.batch + 1) * sizeof(int), 0, 1};
    }
    if (dequant) {
      const long long threads_per_seq =
          static_cast<long long>(call.seqlen_k) * call.heads_kv * ((call.head_dim + head_dim_v()) / 16);
      p->launch[0] = Launch{2,
                            {static_cast<unsigned>(ceil_div(threads_per_seq, att::kKvDequantThreads)),
                             static_cast<unsigned>(call.batch), 1},
                            static_cast<unsigned>(att::kKvDequantThreads), 0, 1};
      p->workspace[at.dequant] = Workspace{dequant_bytes(call), 0, 1};
    }
    p->workspaces = at.count;
    Launch& l = p->launch[order || dequant ? 1 : 0];
    p->launches = order || dequant ? 2 : 1;
    if (varlen) {
      // One CTA per tile of the packed index space (scheduler.h, work_tiles.cuh's varlen_tile): floor(total_q / block_m)
      // + batch indices, times heads_q. Persistent: one CTA per SM at most, the tiles from the
      // counter.
      const long long tiles = varlen_tiles(call);
      if (tiles > 2147483647LL)
        return refuse(why, "%lld work tiles ((total_q / %d + batch) * %s) exceed a grid of 2^31 - 1 CTAs", tiles,
                      tile_rows(call), pack_gqa ? "heads_kv" : "heads_q");
      const unsigned sms = static_cast<unsigned>(device.sm_count > 0 ? device.sm_count : 1);
      const unsigned ctas = persistent ? att::sched::persistent_ctas(static_cast<unsigned long long>(tiles), sms, 0, 1)
                                       : static_cast<unsigned>(tiles);
      l = Launch{0, {ctas, 1, 1}, static_cast<unsigned>(threads), static_cast<unsigned>(smem_bytes), 1};
    } else {
      const long long blocks =
          att::sched::query_blocks(static_cast<long long>(call.seqlen_q), tile_rows(call), cluster);
      const long long tiles = work_tiles(call);
      if (tiles > 2147483647LL)
        return refuse(why,
                      "%lld work tiles (ceil(seqlen_q / %d), in whole clusters of %d, * %s * batch) is more "
                      "than the kernel numbers (2^31 - 1): split the batch",
                      tiles, tile_rows(call), cluster, pack_gqa ? "heads_kv" : "heads_q");
      l = Launch{0,
                 {static_cast<unsigned>(blocks), static_cast<unsigned>(tile_heads(call)),
                  static_cast<unsigned>(call.batch)},
                 static_cast<unsigned>(threads), static_cast<unsigned>(smem_bytes), static_cast<unsigned>(cluster)};
      if (!persistent) {
        if (check_grid(blocks, tile_heads(call), call.batch, why)) return 1;
      } else {
        const unsigned sms = static_cast<unsigned>(device.sm_count > 0 ? device.sm_count : 1);
        const int fit = cluster > 1 ? device.clusters(0, sms / cluster * cluster, cluster, l.block, l.smem) : 0;
        const unsigned ctas = att::sched::persistent_ctas(static_cast<unsigned long long>(tiles), sms,
                                              fit > 0 ? static_cast<unsigned>(fit) : 0, cluster);
        l.grid[0] = ctas;
        l.grid[1] = l.grid[2] = 1;
        if (at.split >= 0) {  // sized for this call's split; at least a slot and a counter when it has none
          const att::sched::CausalSplit cs = causal_split(call, ctas);
          p->handoff[0] = cs.s1, p->handoff[1] = cs.p1, p->handoff[2] = cs.s2, p->handoff[3] = cs.p2;  // for bind
          const unsigned slots = static_cast<unsigned>(cs.s1 * cs.p1 + cs.s2 * cs.p2);
          p->workspace[at.split] = Workspace{
              att::sched::split_workspace_bytes(slots > 0 ? (slots + 1) / 2 : 1, consumer_warps,
                                                static_cast<unsigned>(head_dim_v())), 0, 1};
          p->workspace[at.split + 1] = Workspace{
              att::sched::split_counter_bytes(cs.s1 + cs.s2 > 0 ? static_cast<unsigned>(cs.s1 + cs.s2) : 1, consumer_warps),
              1, 1};
        }
        const unsigned tail = split_tail ? tail_tiles(call, ctas) : 0;
        if (tail > 0) {
          p->workspace[p->workspaces++] =
              Workspace{att::sched::split_workspace_bytes(ctas, consumer_warps, static_cast<unsigned>(head_dim_v())), 0, 1};
          p->workspace[p->workspaces++] = Workspace{att::sched::split_counter_bytes(tail, consumer_warps), 1, 1};
        }
      }
    }
    // Q, K and V: box (one column block: wgmma_tile::cols(head_dim) columns, rows), swizzled over its
    // row (args.h); no keys: no tile loads K or V (every row outputs zeros and LSE -inf), but the maps
    // must still be valid descriptors and k and v may be NULL: q stands in.
    const unsigned cols = static_cast<unsigned>(att::wgmma_tile::cols(head_dim));
    const int swizzle = att::wgmma_tile::swizzle_bytes(head_dim);
    p->maps = 3;
    // GQA-packed: (head_dim, heads_q, rows, batch) in boxes of (cols, group, pack_rows), which fill a
    // tile's rows in packed order (mainloop.cuh, load_q).
    p->map[0] = pack_gqa ? operand_map_heads_inner("q (GQA-packed)", call.q, call.q_stride, static_cast<int>(q_rows),
                                                   call.heads_q, map_batch, call.head_dim, cols,
                                                   static_cast<unsigned>(call.heads_q / call.heads_kv),
                                                   static_cast<unsigned>(tile_rows(call)), bf16, swizzle)
                         : operand_map("q", call.q, call.q_stride, static_cast<int>(q_rows), call.heads_q, map_batch,
                                       call.head_dim, cols, static_cast<unsigned>(block_m), bf16, swizzle);
    // K and V (V at head_dim_v, another value head dim: its own column blocks and swizzle). An FP8
    // cache: rows of d bytes as d / 2 16-bit elements (strides halved), in the staging buffers'
    // column blocks and swizzle (traits.cuh, kColsRawK).
    const long long half_k[3] = {call.k_stride[0] / 2, call.k_stride[1] / 2, call.k_stride[2] / 2};
    const long long half_v[3] = {call.v_stride[0] / 2, call.v_stride[1] / 2, call.v_stride[2] / 2};
    const long long* k_stride = kv_fp8 ? half_k : call.k_stride;
    const long long* v_stride = kv_fp8 ? half_v : call.v_stride;
    const int k_dim = kv_fp8 ? call.head_dim / 2 : call.head_dim, v_dim = kv_fp8 ? head_dim_v() / 2 : head_dim_v();
    const unsigned k_cols = static_cast<unsigned>(att::wgmma_tile::cols(k_dim));
    const unsigned kv_v_cols = static_cast<unsigned>(att::wgmma_tile::cols(v_dim));
    const int k_swizzle = att::wgmma_tile::swizzle_bytes(k_dim), kv_v_swizzle = att::wgmma_tile::swizzle_bytes(v_dim);
    if (kv_rows > 0 && paged) {
      const unsigned rows = static_cast<unsigned>(kv_box_rows(call));
      p->map[1] = operand_map("k (pages)", call.k, k_stride, call.page_size, call.heads_kv, kMaxPages, k_dim, k_cols,
                              rows, bf16, k_swizzle);
      p->map[2] = operand_map("v (pages)", call.v, v_stride, call.page_size, call.heads_kv, kMaxPages, v_dim,
                              kv_v_cols, rows, bf16, kv_v_swizzle);
    } else if (kv_rows > 0) {
      p->map[1] = operand_map("k", call.k, k_stride, static_cast<int>(kv_rows), call.heads_kv, map_batch, k_dim, k_cols,
                              static_cast<unsigned>(block_n), bf16, k_swizzle);
      p->map[2] = operand_map("v", call.v, v_stride, static_cast<int>(kv_rows), call.heads_kv, map_batch, v_dim,
                              kv_v_cols, static_cast<unsigned>(block_n), bf16, kv_v_swizzle);
    } else {
      p->map[1] = operand_map("k (q standing in: seqlen_k is 0)", call.q, call.q_stride, static_cast<int>(q_rows),
                              call.heads_q, map_batch, call.head_dim, cols, static_cast<unsigned>(block_n), bf16,
                              swizzle);
      p->map[2] = p->map[1];
    }
    if (qkv_fp8) {
      // An FP8 forward: maps over bytes (kMapBytes), a column block's width in bytes, as the kernel's
      // tiles (traits.cuh: rows of d bytes as d / 2 16-bit columns); V transposed, (seqlen_k,
      // head_dim_v, heads_kv, batch) in boxes of (a span of the tile's keys, head_dim_v rows).
      const int row_bytes = att::wgmma_tile::swizzle_bytes(call.head_dim / 2);
      const int v_row_bytes = att::wgmma_tile::swizzle_bytes(block_n / 2);
      p->map[0] = operand_map("q (fp8)", call.q, call.q_stride, static_cast<int>(q_rows), call.heads_q, map_batch,
                              call.head_dim, static_cast<unsigned>(row_bytes), static_cast<unsigned>(block_m),
                              kMapBytes, row_bytes);
      if (kv_rows > 0) {
        p->map[1] = k_perm ? key_pairs_map("k (fp8, key pairs)", call.k, call.k_stride, kv_rows, call.heads_kv,
                                           map_batch, call.head_dim, static_cast<unsigned>(row_bytes),
                                           static_cast<unsigned>(block_n), row_bytes)
                           : operand_map("k (fp8)", call.k, call.k_stride, static_cast<int>(kv_rows), call.heads_kv,
                                         map_batch, call.head_dim, static_cast<unsigned>(row_bytes),
                                         static_cast<unsigned>(block_n), kMapBytes, row_bytes);
        p->map[2] = operand_map("v (fp8, transposed)", call.v, call.v_stride, head_dim_v(), call.heads_kv, map_batch,
                                static_cast<int>(kv_rows), static_cast<unsigned>(v_row_bytes),
                                static_cast<unsigned>(head_dim_v()), kMapBytes, v_row_bytes);
      } else {  // no keys: q stands in (nothing loads them)
        p->map[1] = p->map[2] = p->map[0];
      }
    }
    if (dequant) {
      // The converted copy in the workspace (args.h): K [batch][heads_kv][seqlen_k][d], V after it,
      // maps as over a contiguous 16-bit cache; encoded only when the workspace is there.
      const long long sk = call.seqlen_k, hkv = call.heads_kv, dv = head_dim_v();
      const long long ks[3] = {hkv * sk * call.head_dim, sk * call.head_dim, call.head_dim};
      const long long vs[3] = {hkv * sk * dv, sk * dv, dv};
      const unsigned v_cols = static_cast<unsigned>(att::wgmma_tile::cols(head_dim_v()));
      p->map[3] = operand_map("k (dequantised)", nullptr, ks, call.seqlen_k, call.heads_kv, call.batch, call.head_dim,
                              cols, static_cast<unsigned>(block_n), bf16, swizzle);
      p->map[4] = operand_map("v (dequantised)",
                              reinterpret_cast<const void*>(static_cast<unsigned long long>(
                                  att::kv_dequant_v_offset(call.batch, call.heads_kv, call.seqlen_k, call.head_dim))),
                              vs, call.seqlen_k, call.heads_kv, call.batch, head_dim_v(), v_cols,
                              static_cast<unsigned>(block_n), bf16, att::wgmma_tile::swizzle_bytes(head_dim_v()));
      p->map[3].workspace = p->map[4].workspace = at.dequant + 1;
      p->maps = 5;
    }
    return 0;
  }

  // An FP8 cache read by several query tiles of each KV head (chunked prefill) is converted once,
  // before the main kernel, into a 16-bit copy in a workspace (kernel.cu, flash_fwd_wgmma_kv_dequant):
  // converted in the kernel, each query tile's producer warps convert the whole cache again, and
  // that conversion, not the MMAs, set the time (0.61x the bf16 cache's time at b4 h32/8 s2048
  // sk10240, H200 2026-11-30; converting a pass twice added its cost again). One query tile a KV
  // head (short chunks) converts in the kernel, as does a call whose copy would pass
  // kDequantMaxBytes, or whose workspace is left out.
  static constexpr unsigned long long kDequantMaxBytes = 1ull << 30;
  unsigned long long dequant_bytes(const Call& call) const {
    const unsigned long long rows = static_cast<unsigned long long>(call.batch) * call.heads_kv * call.seqlen_k;
    return att::kv_dequant_v_offset(call.batch, call.heads_kv, call.seqlen_k, call.head_dim) + rows * head_dim_v() * 2;
  }
  bool dequant_first(const Call& call) const {
    if (!kv_fp8 || entry != kEntryKvcache || call.seqlen_k < 1 || call.batch < 1 || call.heads_kv < 1) return false;
    if (work_tiles(call) < 2LL * call.heads_kv * call.batch) return false;
    return dequant_bytes(call) <= kDequantMaxBytes;
  }

  // Whether a varlen call orders its sequences longest first (scheduler.h, work_tiles.cuh's
  // varlen_tile): for 2 to kVarlenOrderThreads sequences, when the work is large enough that the
  // order kernel's launch (a few microseconds) is lost in it: at most 4 * heads_q * head_dim *
  // total_q * visible_keys FLOPs of at least kVarlenOrderMinFlops, ~400 us at 600 TFLOP/s. In the
  // packed order a long sequence late in the batch starts its longest tiles last and the SMs end
  // unevenly; longest first, the short tiles fill the end (docs/design/flash_fwd_wgmma.md).
  static constexpr double kVarlenOrderMinFlops = 2.4e11;
  bool varlen_orders(const Call& call) const {
    if (call.batch < 2 || call.batch > att::kVarlenOrderThreads) return false;
    return 4.0 * call.heads_q * call.head_dim * static_cast<double>(call.total_q) * visible_keys(call) >=
           kVarlenOrderMinFlops;
  }
  // The keys a query row sees at most, for estimates of work: max_seqlen_k, half of it when causal,
  // and with a window bounded on both sides (causal: the right side) its width.
  double visible_keys(const Call& call) const {
    const double keys = call.seqlen_k;
    const long long right = causal ? 0 : call.window_right;
    if (variants.window && call.window_left >= 0 && right >= 0) {
      const double width = static_cast<double>(call.window_left) + static_cast<double>(right) + 1;
      return width < keys ? width : keys;
    }
    return causal ? keys / 2 : keys;
  }

  // Where each workspace goes. The launchers (run_plan.cuh, the tuner's LoadedBuild) keep a
  // kernel's workspaces by index and zero a zeroed one only when they allocate it, so an index
  // holds the same thing in every plan of a build: the tile counter first (persistent causal or
  // varlen grids, every call), then the varlen order (the calls that order). (The order first put
  // the counter at index 1 or 0 from one call to the next, and an ordered call's order then
  // served the next call as its counter: tiles went unprocessed.) The split tail's two come alone.
  struct Places {
    int counter = -1, order = -1, dequant = -1, split = -1, count = 0;
  };
  Places places(bool ordered, bool dequant) const {
    Places at;
    if (persistent && dynamic_tiles) at.counter = at.count++;
    if (split_causal) {  // the causal split's slots and counters (every call: indices stay put)
      at.split = at.count;
      at.count += 2;
    }
    if (ordered) at.order = at.count++;
    if (dequant) at.dequant = at.count++;  // an FP8 build's (never varlen), after the counter
    return at;
  }

  // A varlen call's work tiles: the packed index space (scheduler.h, work_tiles.cuh's varlen_tile).
  long long varlen_tiles(const Call& call) const {
    return att::sched::varlen_index_tiles(call.total_q, call.batch, tile_heads(call), tile_rows(call));
  }

  // Kvcache with a page table: K/V rows per TMA box, gcd(page_size, block_n) (args.h); else 0.
  int kv_box_rows(const Call& call) const {
    if (entry != kEntryKvcache || !call.block_table || call.page_size < 1) return 0;
    return gcd_int(call.page_size, block_n);
  }

  // The causal split's bands for a call on `ctas` CTAs (scheduler.h, CausalSplit; none: zeros): the
  // counter's hand-out simulated as the kernel does it (each CTA takes the next unit when it is
  // done; a unit costs its K/V iterations and one more (Q, the epilogue), a piece half an iteration
  // more (its partial O written) and a tile's last piece 0.6 of one a piece more (the combine reads
  // every piece's partial O from L2: ~70 KB each at d=128), in tenths), for a few bands, and the one
  // that ends soonest if it ends at least 2% sooner than whole tiles. Only
  // where the tiles are few (at most 4 rounds: beyond that the longest-first order already ends the
  // SMs together) and the CTAs no more than a device's SMs.
  // Host time: a call's plan computes it once and hands it to its bind (Plan::handoff); the whole
  // tiles' hand-out is simulated once for all the bands (each band's pieces continue from it where
  // its tiles start); a call whose whole tiles already end within 2% of the average CTA's work stops
  // there; and each thread keeps its last 4 answers (a model's layers ask the same shapes over and
  // over). 30-55 us a new shape that splits at 132 CTAs, 7-9 us one that cannot (2026-12-08, the CPU
  // machine; the first version, simulating every band from the start, in plan and again in bind,
  // took 80-140 us twice). The tests keep that version as the reference
  // (tests/unit/families/test_persistent_grid.cpp).
  att::sched::CausalSplit causal_split(const Call& call, unsigned ctas) const {
    att::sched::CausalSplit none{0, 0, 0, 0};
    constexpr int kMaxCtas = 1024;
    const long long tiles = work_tiles(call);
    if (!split_causal || ctas < 2 || ctas > static_cast<unsigned>(kMaxCtas) || tiles <= ctas ||
        tiles > 4LL * ctas || call.seqlen_k <= 0)
      return none;
    // What the answer depends on beyond the checks above.
    const int key[10] = {block_m, block_n, pack_gqa, head_group, call.seqlen_q, call.seqlen_k,
                         call.heads_q, call.heads_kv, call.batch, static_cast<int>(ctas)};
    struct Memo {
      int key[10];
      att::sched::CausalSplit split;
      int used;
    };
    static thread_local Memo memo[4] = {};
    static thread_local int next_memo = 0;
    for (const Memo& m : memo)
      if (m.used && std::memcmp(m.key, key, sizeof key) == 0) return m.split;
    const att::sched::CausalSplit best = simulate_causal_split(call, static_cast<int>(tiles), static_cast<int>(ctas));
    Memo& m = memo[next_memo];
    next_memo = (next_memo + 1) % 4;
    std::memcpy(m.key, key, sizeof key);
    m.split = best;
    m.used = 1;
    return best;
  }
  att::sched::CausalSplit simulate_causal_split(const Call& call, int T, int C) const {
    att::sched::CausalSplit none{0, 0, 0, 0};
    constexpr int kMaxCtas = 1024, kMaxTiles = 4 * kMaxCtas;
    const int m_blocks = static_cast<int>(att::sched::query_blocks(static_cast<long long>(call.seqlen_q), tile_rows(call), 1));
    int n[kMaxTiles];  // each tile's K/V iterations, in the counter's order (work_tiles.cuh, work_tile)
    long long work = 0;  // every CTA's whole tiles' cost
    for (int t = 0; t < T; ++t) {
      const att::sched::TileCoord c =
          att::sched::tile_coord<true>(t, m_blocks, tile_heads(call) * call.batch, head_group > 0 ? head_group : 1);
      n[t] = att::sched::kv_tiles(att::sched::kv_end<true>(c.m_block, tile_rows(call), call.seqlen_k,
                                                           call.seqlen_k - call.seqlen_q),
                                  block_n);
      work += 10LL * n[t] + 10;
    }
    struct Heap {  // when each CTA is free (a min-heap), and when the last one ends
      long long busy[kMaxCtas];
      long long end;
      int size;
      void take(long long cost) {  // the CTA free first takes a unit
        const long long t = busy[0] + cost;
        if (t > end) end = t;
        int i = 0;  // sift down
        for (;;) {
          int c = 2 * i + 1;
          if (c >= size) break;
          if (c + 1 < size && busy[c + 1] < busy[c]) ++c;
          if (busy[c] >= t) break;
          busy[i] = busy[c];
          i = c;
        }
        busy[i] = t;
      }
    };
    // {the last tiles split, their pieces, the last of those in finer pieces, theirs} (run 401's
    // simulations: the chunked prefills' best bands were within 1% of these), widest first: each
    // band's whole tiles are a prefix of the next one's.
    const int bands[][4] = {{C, 2, C / 4, 8}, {C, 2, C / 4, 6}, {C / 2, 2, C / 4, 6}, {C, 3, 0, 0},
                            {C / 4, 1, C / 4, 8}, {C / 2, 4, 0, 0}, {2 * C, 2, C / 4, 8}, {C / 2, 1, C / 2, 2},
                            {C / 2, 1, C / 2, 3}, {C, 2, C / 8, 8}};
    constexpr int kBands = sizeof bands / sizeof bands[0];
    int order[kBands];
    for (int i = 0; i < kBands; ++i) order[i] = i;
    for (int i = 1; i < kBands; ++i)  // by width, widest first (stable: the list's order among equals)
      for (int j = i; j > 0 && bands[order[j]][0] > bands[order[j - 1]][0]; --j) {
        const int x = order[j];
        order[j] = order[j - 1];
        order[j - 1] = x;
      }
    Heap prefix, run;  // whole tiles handed out in order; a band's (or all tiles') hand-out from there
    prefix.size = run.size = C;
    prefix.end = run.end = 0;
    for (int i = 0; i < C; ++i) prefix.busy[i] = run.busy[i] = 0;
    int handed = 0;  // prefix's whole tiles
    for (int t = 0; t < T; ++t) run.take(10LL * n[t] + 10);
    const long long whole = run.end;
    // A split adds work, so no band ends before the average CTA's whole-tile work: where whole tiles
    // end within 2% of it, no band is 2% sooner.
    if (whole * 49 * C < work * 50) return none;
    long long ends[kBands];
    for (int k = 0; k < kBands; ++k) {
      const int* b = bands[order[k]];
      ends[order[k]] = -1;
      att::sched::CausalSplit cs{b[0] - b[2], b[1], b[2], b[3]};  // the last b[0] tiles, of which the last b[2] in b[3]
      if (cs.s1 < 0 || cs.s1 + cs.s2 > T || cs.s1 + cs.s2 == 0) continue;
      const int plain = T - cs.s1 - cs.s2;
      for (; handed < plain; ++handed) prefix.take(10LL * n[handed] + 10);
      std::memcpy(run.busy, prefix.busy, sizeof(long long) * static_cast<size_t>(C));
      run.end = prefix.end;
      for (int t = plain; t < T; ++t) {
        const int p = t - plain < cs.s1 ? cs.p1 : cs.p2;
        for (int j = 0; j < p; ++j)
          run.take(10LL * (att::sched::piece_begin(n[t], j + 1, p) - att::sched::piece_begin(n[t], j, p)) + 15 +
                   (j == p - 1 ? 6LL * p : 0));
      }
      ends[order[k]] = run.end;
    }
    att::sched::CausalSplit best = none;
    long long best_end = whole;
    for (int i = 0; i < kBands; ++i)  // the soonest; the list's first among equals
      if (ends[i] >= 0 && ends[i] < best_end) {
        best_end = ends[i];
        best = att::sched::CausalSplit{bands[i][0] - bands[i][2], bands[i][1], bands[i][2], bands[i][3]};
        if (best.s2 == 0) best.p2 = 0;
        if (best.s1 == 0) best.p1 = 0;
      }
    return best_end * 50 <= whole * 49 ? best : none;
  }

  unsigned tail_tiles(const Call& call, unsigned ctas) const {
    const long long iterations = att::sched::split_iterations(static_cast<long long>(call.seqlen_k), block_n);
    return att::sched::split_tail_tiles(static_cast<unsigned long long>(work_tiles(call)), ctas,
                                        static_cast<unsigned long long>(iterations));
  }

  int bind(const Call& call, const Plan& plan, const Resources& res, int launch, Args* args, Why* why) const {
    const bool ordered = plan.launches == 2 && plan.launch[0].kernel == 1;
    const bool dequant = plan.launches == 2 && plan.launch[0].kernel == 2;
    const Places at = places(ordered, dequant);
    if (plan.launch[launch].kernel == 1) {  // the varlen order kernel; without its workspace, a no-op
      if (!args->add(dense_params(call)) || !args->add(static_cast<int*>(res.workspace[at.order])))
        return refuse(why, "flash_fwd_wgmma: the arguments do not fit");
      return 0;
    }
    // The FP8 cache's conversion; without its workspace (or its maps), a no-op, and the main
    // kernel converts each tile itself.
    const bool converted = dequant && res.workspace[at.dequant] && res.map[3] && res.map[4];
    if (plan.launch[launch].kernel == 2) {
      if (!args->add(dense_params(call)) ||
          !args->add(converted ? static_cast<unsigned char*>(res.workspace[at.dequant]) : nullptr))
        return refuse(why, "flash_fwd_wgmma: the arguments do not fit");
      return 0;
    }
    att::TmaMaps maps;
    std::memset(&maps, 0, sizeof maps);
    std::memcpy(&maps.q, res.map[0], sizeof maps.q);
    std::memcpy(&maps.k, res.map[converted ? 3 : 1], sizeof maps.k);
    std::memcpy(&maps.v, res.map[converted ? 4 : 2], sizeof maps.v);
    maps.kv_box_rows = converted ? 0 : kv_box_rows(call);  // the copy is contiguous
    maps.kv_dequantised = converted ? 1 : 0;
    if (ordered) maps.varlen_order = static_cast<const int*>(res.workspace[at.order]);  // null: the packed order
    if (varlen) maps.varlen_tiles = static_cast<int>(varlen_tiles(call));
    if (pack_gqa) maps.pack_rows = tile_rows(call);
    fill_kv_scales(call, &maps.kv);
    if (qkv_fp8) {
      maps.q_descale = call.q_descale;
      maps.q_descale_stride[0] = static_cast<int>(call.q_descale_stride[0]);
      maps.q_descale_stride[1] = static_cast<int>(call.q_descale_stride[1]);
    }
    if (at.counter >= 0) {
      maps.tile_count = static_cast<int*>(res.workspace[at.counter]);  // null: round-robin
      // The causal split needs the counter (its pieces are units the counter hands out) and both of
      // its workspaces; without any of them the launch runs unsplit: as correct.
      if (at.split >= 0 && maps.tile_count && res.workspace[at.split] && res.workspace[at.split + 1]) {
        maps.causal_split = att::sched::CausalSplit{plan.handoff[0], plan.handoff[1], plan.handoff[2], plan.handoff[3]};
        if (maps.causal_split.s1 + maps.causal_split.s2 > 0) {
          maps.split_ws = static_cast<float*>(res.workspace[at.split]);
          maps.split_count = static_cast<int*>(res.workspace[at.split + 1]);
        }
      }
    } else if (plan.workspaces == 2 && res.workspace[0] && res.workspace[1]) {
      // else (no workspace) the launch runs unsplit: as correct
      maps.split_ws = static_cast<float*>(res.workspace[0]);
      maps.split_count = static_cast<int*>(res.workspace[1]);
      maps.split_tail = static_cast<int>(tail_tiles(call, plan.launch[0].grid[0]));
    }
    AttnParams params = dense_params(call);
    if (converted) params.block_table = nullptr;  // the copy is [batch][heads_kv][seqlen_k]
    if (!args->add(params) || !args->add(maps)) return refuse(why, "flash_fwd_wgmma: the arguments do not fit");
    return 0;
  }
};

static_assert(sizeof(att::TmaDesc) == kTensorMapBytes, "a TmaDesc is a CUtensorMap");

inline constexpr LaunchFamily kFlashFwdWgmma =
    make_family<FlashFwdWgmmaLaunch>("flash_fwd_wgmma", kEntryDense | kEntryKvcache | kEntryVarlen, 3, "flash_fwd_wgmma",
                                     "flash_fwd_wgmma_varlen_order", "flash_fwd_wgmma_kv_dequant");

}  // namespace attntune_plan

#endif  // ATTNTUNE_FLASH_FWD_WGMMA_LAUNCH_H
