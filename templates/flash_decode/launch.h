// ---- templates/flash_decode/launch.h: how a call becomes flash_decode's launches, the one place
// that says so (templates/common/launch_plan.h tells who runs it).
//
// Work units: (batch, kv head, row block), the row blocks ceil(group * seqlen_q / BLOCK_M) of the
// kv head's packed query rows. THREADS threads and SMEM_BYTES of dynamic shared memory per CTA.
// Each unit's keys are split over num_splits CTAs (grid (num_splits * row_blocks, heads_kv,
// batch)); split.h, which the kernels include too, says how: the grid's order, which tiles each
// split takes, the pieces and the workspaces' layout. The split count comes from the call's
// shape alone (seqlen_k is the max: the host never reads cache_seqlens), by decode_splits' wave
// model (split.h). With more than one split,
// workspace 0 holds the partial O and LSE, and the merge is either the second kernel (combine:
// kernel, launch 1) or the last CTA of each unit (combine: last_cta, workspace 1: a zeroed counter
// per unit). Both workspaces are optional: without them bind asks the kernels for one split (the
// CTAs of the other splits exit at once; the combine kernel too). combine: clusterN (sm_90): the
// splits come in clusters of N (grid (row_blocks * splits, ...), split-minor), each cluster merging
// its N pieces through distributed shared memory: decode_splits' count rounded down to whole
// clusters, at least one. One cluster a unit: no workspace. Several: each cluster's merge is a
// piece in workspace 0, merged by the last cluster of the unit (workspace 1: counters, as
// last_cta); without those workspaces bind asks for one cluster a unit. Clusters of 16 are
// non-portable: the launcher opts the kernel in (run_plan.cuh, the tuner's LoadedBuild). kv_load tma: tensor maps 0 (K) and
// 1 (V), encoded per call (decode_tma_rows' box), bound into the kernels' DecodeMaps argument.
// Split dims (a build of ATT_HEAD_DIM_V, head_dim_v != head_dim): V's map, O and the pieces have
// head_dim_v columns, V's boxes its own column blocks. A latent build (ATT_LATENT: V is K's first
// head_dim_v columns) runs as a split one and serves only calls whose v is k (check_latent).
#ifndef ATTNTUNE_FLASH_DECODE_LAUNCH_H
#define ATTNTUNE_FLASH_DECODE_LAUNCH_H

#include "../common/launch_plan.h"
#include "args.h"

namespace attntune_plan {

constexpr int kDecodeMaxSeqlenQ = 16;
// TMA's L2 promotion of the K/V maps, in bytes (plan(), kv_load tma).
constexpr int kDecodeL2Promotion = 128;

// KV_LOAD tma: K/V rows per box: BLOCK_N contiguous; paged, gcd(page_size, block_n) (a box stays
// within one page, and a tile is whole boxes).
inline int decode_tma_rows(const Call& c, int block_n) {
  if (c.entry != kEntryKvcache || !c.block_table || c.page_size < 1) return block_n;
  return gcd_int(c.page_size, block_n);
}

struct FlashDecodeLaunch {
  int head_dim, bf16, causal;
  int head_dim_v;  // V's and O's: ATT_HEAD_DIM_V, else head_dim
  int latent;      // ATT_LATENT (V is K's first head_dim_v columns: calls pass v = k), else 0
  // ATT_KV_FP8: an FP8 e4m3 cache (check_kv_dtype), else 0. The kernels see it as a cache of 16-bit
  // elements, rows of head_dim / 2 (head_dim_v / 2): bind halves K's and V's strides (bytes) and the
  // maps are of those rows (traits.cuh's kKDim, kVDim).
  int kv_fp8;
  int kdim() const { return kv_fp8 ? head_dim / 2 : head_dim; }
  int vdim() const { return kv_fp8 ? head_dim_v / 2 : head_dim_v; }
  int block_m, block_n, threads, smem_bytes, ctas_per_sm;
  int last_cta;  // combine: last_cta (else the combine kernel)
  int cluster;   // combine: clusterN: N (CTAs a cluster, merged in it); else 1

  // Whether the workspace's pieces are merged by the unit's last CTA or cluster (a counter), not
  // by the combine kernel.
  bool counted() const { return cluster > 1 || last_cta; }
  int kv_tma;    // kv_load: tma (K/V through tensor maps 0 and 1, sm_90), else cp.async
  Variants variants;  // the variants the build serves (exactly)

  static int load(const Define* d, int n, FlashDecodeLaunch* c, Why* why) {
    int combine = 0, combine_last = 0, kv_load = 0, kv_load_tma = 0;
    if (define_int(d, n, "ATT_HEAD_DIM", &c->head_dim, why) || define_int(d, n, "ATT_DTYPE_BF16", &c->bf16, why) ||
        define_int(d, n, "ATT_CAUSAL", &c->causal, why) || define_int(d, n, "BLOCK_M", &c->block_m, why) ||
        define_int(d, n, "BLOCK_N", &c->block_n, why) || define_int(d, n, "THREADS", &c->threads, why) ||
        define_int(d, n, "SMEM_BYTES", &c->smem_bytes, why) || define_int(d, n, "CTAS_PER_SM", &c->ctas_per_sm, why) ||
        define_int(d, n, "COMBINE", &combine, why) || define_int(d, n, "COMBINE_LAST_CTA", &combine_last, why) ||
        define_int(d, n, "KV_LOAD", &kv_load, why) || define_int(d, n, "KV_LOAD_TMA", &kv_load_tma, why) ||
        define_int(d, n, "CLUSTER", &c->cluster, why))
      return 1;
    c->kv_tma = kv_load == kv_load_tma;
    c->head_dim_v = static_cast<int>(define_or(d, n, "ATT_HEAD_DIM_V", c->head_dim));
    c->latent = static_cast<int>(define_or(d, n, "ATT_LATENT", 0));
    c->kv_fp8 = static_cast<int>(define_or(d, n, "ATT_KV_FP8", 0));
    c->variants = Variants::load(d, n);

    c->last_cta = combine == combine_last;
    if (c->block_m <= 0 || c->block_n <= 0 || c->threads <= 0)
      return refuse(why, "flash_decode: BLOCK_M, BLOCK_N and THREADS must be positive");
    if (c->cluster < 1 || c->cluster > 16 || (c->cluster & (c->cluster - 1)) || (c->cluster > 1 && c->last_cta))
      return refuse(why, "flash_decode: CLUSTER %d (1, 2, 4, 8 or 16, and not with combine last_cta)", c->cluster);
    return 0;
  }

  // The call's shape as the kernels see it; 0, or 1 with the reason.
  struct Shape {
    long long rows_total, units, keys, tiles;
    int group, rows, row_blocks;
  };
  int shape(const Call& c, Shape* s, Why* why) const {
    if (c.entry != kEntryDense && c.entry != kEntryKvcache)
      return refuse(why, "flash_decode serves attntune_attention_forward and attntune_attention_forward_kvcache only");
    if (c.head_dim != head_dim)
      return refuse(why, "flash_decode was built for head_dim %d; the call has head_dim %d", head_dim, c.head_dim);
    if (check_variants("flash_decode", variants, c, why) ||
        check_value_dim("flash_decode", c, head_dim_v != head_dim ? head_dim_v : 0, why) ||
        check_latent("flash_decode", c, latent, why) || check_kv_dtype("flash_decode", c, kv_fp8, why))
      return 1;
    if (kv_fp8) {
      // The cache seen as 16-bit elements (kdim): its byte strides must be whole 16-byte chunks, as a
      // 16-bit cache's are whole 8-element ones; the scales' strides index [batch, heads_kv] floats.
      for (int i = 0; i < 3; ++i)
        if (c.k_stride[i] < 0 || c.v_stride[i] < 0 || c.k_stride[i] % 16 || c.v_stride[i] % 16 ||
            c.k_stride[i] >= (1LL << 39) || c.v_stride[i] >= (1LL << 39))
          return refuse(why,
                        "flash_decode: an FP8 cache's strides must be non-negative multiples of 16 bytes below 2^39 (k "
                        "{%lld, %lld, %lld}, v {%lld, %lld, %lld})",
                        c.k_stride[0], c.k_stride[1], c.k_stride[2], c.v_stride[0], c.v_stride[1], c.v_stride[2]);
      for (int i = 0; i < 2; ++i)
        if (c.k_descale_stride[i] < 0 || c.v_descale_stride[i] < 0 || c.k_descale_stride[i] > 2147483647LL ||
            c.v_descale_stride[i] > 2147483647LL)
          return refuse(why, "flash_decode: descale strides must be 0 .. 2^31 - 1 (k {%lld, %lld}, v {%lld, %lld})",
                        c.k_descale_stride[0], c.k_descale_stride[1], c.v_descale_stride[0], c.v_descale_stride[1]);
    }
    if (c.seqlen_q > kDecodeMaxSeqlenQ)
      return refuse(why,
                    "flash_decode serves seqlen_q 1..%d (decoding, speculative decoding); the call has seqlen_q %d: "
                    "use a prefill family",
                    kDecodeMaxSeqlenQ, c.seqlen_q);
    if (c.batch < 0 || c.seqlen_q < 0 || c.seqlen_k < 0 || c.heads_q < 0 || c.heads_kv < 0)
      return refuse(why, "flash_decode: negative sizes");
    if (c.heads_kv == 0 ? c.heads_q != 0 : c.heads_q % c.heads_kv != 0)
      return refuse(why, "flash_decode: heads_q (%d) must be a multiple of heads_kv (%d)", c.heads_q, c.heads_kv);
    if (c.seqlen_q > 1 && (c.causal != 0) != (causal != 0))
      return refuse(why, "flash_decode was built %s; the call is %s (seqlen_q %d)", causal ? "causal" : "non-causal",
                    c.causal ? "causal" : "non-causal", c.seqlen_q);
    if (c.entry == kEntryKvcache && c.block_table) {
      if (c.page_size < 1) return refuse(why, "flash_decode: page_size %d (must be at least 1)", c.page_size);
      if (static_cast<long long>(c.max_blocks_per_seq) * c.page_size < c.seqlen_k)
        return refuse(why,
                      "flash_decode: max_blocks_per_seq %d pages of %d keys cannot hold seqlen_k_max %d keys",
                      c.max_blocks_per_seq, c.page_size, c.seqlen_k);
    }
    if (c.batch > 65535 || c.heads_kv > 65535)
      return refuse(why, "flash_decode: batch (%d) and heads_kv (%d) must be at most 65535 (grid z and y)", c.batch,
                    c.heads_kv);
    if (kv_tma && c.entry == kEntryKvcache && c.block_table && c.page_size >= 1) {
      // A paged box of gcd(page_size, BLOCK_N) rows of a column block lands at that many rows'
      // bytes from the last: TMA writes shared memory at multiples of 128 bytes only. K's boxes are
      // head_dim's column blocks, V's head_dim_v's (split dims: checked apart).
      const int rows = decode_tma_rows(c, block_n);
      for (const int v : {0, 1}) {
        if (v && head_dim_v == head_dim) break;
        const int dim = v ? vdim() : kdim(), cols = att::decode_tile_cols(dim);
        if (rows * cols * 2 % 128 != 0)
          return refuse(why,
                        "flash_decode (kv_load tma): pages of %d keys make %sboxes of %d rows of %d bytes, off the "
                        "128-byte alignment TMA writes shared memory at (%s %d: pages of a multiple of %d keys, or "
                        "kv_load cp_async)",
                        c.page_size, v ? "V " : "", rows, cols * 2, v ? "head_dim_v" : "head_dim",
                        v ? head_dim_v : head_dim, 64 / cols);
      }
    }
    if (kv_tma && !kv_fp8) {
      // TMA: 16-byte aligned K/V and strides (as for cp.async), strides below 2^40 bytes (FP8: 16-byte
      // multiples above; below 2^39 bytes here, checked alike).
      for (int i = 0; i < 3; ++i)
        if (c.k_stride[i] < 0 || c.v_stride[i] < 0 || c.k_stride[i] % 8 || c.v_stride[i] % 8 ||
            c.k_stride[i] >= (1LL << 39) || c.v_stride[i] >= (1LL << 39))
          return refuse(why,
                        "flash_decode (kv_load tma): K/V strides must be non-negative multiples of 8 elements below "
                        "2^39 (k {%lld, %lld, %lld})",
                        c.k_stride[0], c.k_stride[1], c.k_stride[2]);
    }
    s->group = c.heads_kv > 0 ? c.heads_q / c.heads_kv : 0;
    s->rows = s->group * c.seqlen_q;
    s->row_blocks = static_cast<int>(ceil_div(s->rows, block_m));
    s->rows_total = static_cast<long long>(c.batch) * c.heads_q * c.seqlen_q;
    if (s->rows_total >= (1LL << 31))
      return refuse(why, "flash_decode: batch * heads_q * seqlen_q = %lld rows is 2^31 or more", s->rows_total);
    s->units = static_cast<long long>(c.batch) * c.heads_kv * s->row_blocks;
    // A window build splits only the keys its rows' windows span (at most: the host reads no
    // cache_seqlens); the kernels share out their own sequence's.
    s->keys = att::unit_keys_max(c.seqlen_k, c.seqlen_q, variants.window ? c.window_left : -1);
    s->tiles = ceil_div(s->keys, block_n);
    return 0;
  }

  int plan(const Call& call, const Device& device, Plan* p, Why* why) const {
    Shape s;
    if (shape(call, &s, why)) return 1;
    if (s.rows_total == 0) return 0;  // nothing to compute: no launch
    // The wave model (split.h): over tiles, or for a window build's even shares over keys.
    const int want = variants.window ? att::decode_splits_keys(s.units, s.keys, block_n, device.sm_count, ctas_per_sm)
                                     : att::decode_splits(s.units, s.tiles, device.sm_count, ctas_per_sm);
    const int splits = att::grid_splits(want, cluster);
    const long long grid_x = static_cast<long long>(splits) * s.row_blocks;
    if (grid_x > 2147483647LL) return refuse(why, "flash_decode: grid.x %lld exceeds 2^31 - 1", grid_x);
    p->launches = 1;
    p->launch[0] = Launch{0,
                          {static_cast<unsigned>(grid_x), static_cast<unsigned>(call.heads_kv),
                           static_cast<unsigned>(call.batch)},
                          static_cast<unsigned>(threads),
                          static_cast<unsigned>(smem_bytes),
                          static_cast<unsigned>(cluster)};
    if (kv_tma) {
      // K and V: contiguous (head_dim, seqlen_k, heads_kv, batch), box (cols, BLOCK_N); paged
      // (head_dim, page_size, heads_kv, pages), box (cols, gcd(page_size, BLOCK_N)): a box never
      // crosses a page; the page count is not part of the call, and the kernel never asks past a
      // table entry, so the map's page extent is the most a map allows. cols: the tiles' column
      // blocks (args.h's decode_tile_cols: 64, 32 or 16 elements), swizzled by their span in bytes
      // (128, 64 or 32) when a box has a multiple of 8 rows, else not (the kernel reads
      // p.tma_swizzle; shape() refused boxes that would land off 128 bytes). An empty cache
      // (seqlen_k 0 or no K/V) is never read: Q's shape stands in so the maps stay valid descriptors.
      p->maps = 2;
      const bool paged = call.entry == kEntryKvcache && call.block_table;
      const int rows = decode_tma_rows(call, block_n);
      // V's map: head_dim_v columns in boxes of its own column blocks (split dims; else K's).
      // FP8: rows of kdim() (vdim()) 16-bit elements through halved strides (the same bytes).
      const unsigned cols = static_cast<unsigned>(att::decode_tile_cols(kdim()));
      const unsigned cols_v = static_cast<unsigned>(att::decode_tile_cols(vdim()));
      long long ks[3], vs[3];
      for (int i = 0; i < 3; ++i) {
        ks[i] = kv_fp8 ? call.k_stride[i] / 2 : call.k_stride[i];
        vs[i] = kv_fp8 ? call.v_stride[i] / 2 : call.v_stride[i];
      }
      if (call.seqlen_k == 0 || !call.k || !call.v) {
        p->map[0] = operand_map("k (q standing in: no keys)", call.q, call.q_stride, call.seqlen_q > 0 ? call.seqlen_q : 1,
                                call.heads_q, call.batch, call.head_dim, cols, 1, bf16);
        p->map[1] = p->map[0];
        if (head_dim_v != head_dim)  // O has V's columns
          p->map[1] = operand_map("v (out standing in: no keys)", call.out, call.o_stride,
                                  call.seqlen_q > 0 ? call.seqlen_q : 1, call.heads_q, call.batch, head_dim_v, cols_v, 1,
                                  bf16);
      } else if (paged) {
        const int kMaxPages = 2147483647;
        p->map[0] = operand_map("k (pages)", call.k, ks, call.page_size, call.heads_kv, kMaxPages, kdim(), cols,
                                static_cast<unsigned>(rows), bf16);
        p->map[1] = operand_map("v (pages)", call.v, vs, call.page_size, call.heads_kv, kMaxPages, vdim(), cols_v,
                                static_cast<unsigned>(rows), bf16);
      } else {
        p->map[0] = operand_map("k", call.k, ks, call.seqlen_k, call.heads_kv, call.batch, kdim(), cols,
                                static_cast<unsigned>(rows), bf16);
        p->map[1] = operand_map("v", call.v, vs, call.seqlen_k, call.heads_kv, call.batch, vdim(), cols_v,
                                static_cast<unsigned>(rows), bf16);
      }
      p->map[0].swizzle_bytes = rows % 8 == 0 ? static_cast<int>(cols) * 2 : 0;
      p->map[1].swizzle_bytes = rows % 8 == 0 ? static_cast<int>(cols_v) * 2 : 0;
      // L2 promotion of 128 bytes, not 256: a cache row is one head's, its neighbours other CTAs',
      // so where rows are not whole 256-byte blocks (d=96: 192 bytes) 256 fetches parts of the next
      // head's row that are gone from L2 when that head's CTA comes. H100, one config over five
      // shapes (docs/log/PERFORMANCE.md runs 377-379): d=96 MHA paged 1.0-1.1% faster, d=128 GQA
      // 1.1%, the rest level (FP8 d=128, d=64 GQA, d=128 MHA); 64 bytes or none take 23-24% longer
      // at d=96 (685-691 us against 558).
      p->map[0].l2_promotion = p->map[1].l2_promotion = kDecodeL2Promotion;
    }
    // Partials merged through the workspace (split.h): the splits, or with clusters each cluster's
    // merge when a unit has several clusters. Merged by the combine kernel, or by the unit's last
    // CTA (cluster) to arrive at its counter.
    const int pieces = att::split_pieces(splits, cluster);
    if (pieces > 1) {
      p->workspaces = 1;
      p->workspace[0] = Workspace{att::pieces_bytes(pieces, s.rows_total, head_dim_v), 0, 1};  // O's rows
      if (counted()) {
        p->workspaces = 2;
        p->workspace[1] = Workspace{att::counters_bytes(s.units), 1, 1};
      } else {
        p->launches = 2;
        p->launch[1] = Launch{1, {static_cast<unsigned>(ceil_div(s.rows_total, att::decode_combine_rows(head_dim_v))), 1, 1},
                              static_cast<unsigned>(att::kDecodeCombineThreads), 0, 1};
      }
    }
    return 0;
  }

  int bind(const Call& c, const Plan& plan, const Resources& res, int, Args* args, Why* why) const {
    Shape s;
    if (shape(c, &s, why)) return 1;
    att::DecodeParams d;
    std::memset(&d, 0, sizeof d);
    fill_tensor_args(c, &d);
    fill_kv_scales(c, &d.kv);
    if (kv_fp8)  // the cache as 16-bit elements (shape() checked the strides are whole 16-byte chunks)
      for (int i = 0; i < 3; ++i) {
        d.k_stride[i] /= 2;
        d.v_stride[i] /= 2;
      }
    // A window side of seqlen_k + seqlen_q keys or more reaches past every row's keys, as an
    // unbounded one does; clamped there, the kernels' i + diag -/+ side stays far from int overflow
    // (a side of 2^31 - 1 would wrap).
    const long long side_max = static_cast<long long>(c.seqlen_k) + c.seqlen_q;
    if (d.variant.window_left > side_max) d.variant.window_left = static_cast<int>(side_max);
    if (d.variant.window_right > side_max) d.variant.window_right = static_cast<int>(side_max);
    if (c.entry == kEntryKvcache) {
      d.cache_seqlens = c.cache_seqlens;
      d.block_table = c.block_table;
      d.max_blocks_per_seq = c.max_blocks_per_seq;
      d.page_size = c.block_table ? c.page_size : 0;
      if (c.block_table) page_divisor(c.page_size, &d.page_mul, &d.page_shift);
    }
    d.group = s.group;
    d.rows = s.rows;
    d.row_blocks = s.row_blocks;
    d.rows_total = static_cast<int>(s.rows_total);
    d.num_splits = s.row_blocks > 0 ? static_cast<int>(plan.launch[0].grid[0] / s.row_blocks) : 1;
    const int pieces = att::split_pieces(d.num_splits, cluster);  // as plan's
    if (pieces > 1) {
      // Without its workspaces (optional) the call runs as one piece (unsplit, or one cluster a
      // unit; the other CTAs exit at once): as correct, slower.
      if (!res.workspace[0] || (counted() && !res.workspace[1])) {
        d.num_splits = cluster;
      } else {
        d.part_o = static_cast<float*>(res.workspace[0]);
        d.part_lse = d.part_o + att::piece_lse_start(pieces, s.rows_total, head_dim_v);
        d.counters = counted() ? static_cast<int*>(res.workspace[1]) : nullptr;
      }
    }
    att::DecodeMaps maps;
    std::memset(&maps, 0, sizeof maps);
    if (kv_tma) {
      d.tma_rows = decode_tma_rows(c, block_n);
      d.tma_swizzle = d.tma_rows % 8 == 0;
      if (plan.maps < 2 || !res.map[0] || !res.map[1]) return refuse(why, "flash_decode: K/V tensor maps missing");
      std::memcpy(&maps.k, res.map[0], sizeof maps.k);
      std::memcpy(&maps.v, res.map[1], sizeof maps.v);
    }
    if (!args->add(d) || !args->add(maps)) return refuse(why, "flash_decode: the arguments do not fit");
    return 0;
  }
};

inline constexpr LaunchFamily kFlashDecode = make_family<FlashDecodeLaunch>("flash_decode", kEntryDense | kEntryKvcache, 2,
                                                                      "flash_decode", "flash_decode_combine");

}  // namespace attntune_plan

#endif  // ATTNTUNE_FLASH_DECODE_LAUNCH_H
