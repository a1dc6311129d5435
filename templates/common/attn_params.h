// The one kernel parameter of every attention template, passed by value. Plain C so that the
// tuner (host C++), NVRTC-compiled kernels and exported .cu files share one layout.
#ifndef ATTNTUNE_ATTN_PARAMS_H
#define ATTNTUNE_ATTN_PARAMS_H

#include "variant_params.h"

struct AttnParams {
  const void* q;  // (batch, heads_q,  seqlen_q, head_dim), strides below, last dim contiguous
  const void* k;  // (batch, heads_kv, seqlen_k, head_dim)
  const void* v;  // (batch, heads_kv, seqlen_k, head_dim)
  void* o;        // (batch, heads_q,  seqlen_q, head_dim)
  float* lse;     // (batch, heads_q, seqlen_q) contiguous, natural log; may be null
  long long q_stride[3];  // in elements: {batch, head, row}
  long long k_stride[3];
  long long v_stride[3];
  long long o_stride[3];
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int q_per_kv;        // heads_q / heads_kv (GQA/MQA group size)
  float scale;         // softmax scale, usually 1/sqrt(head_dim)
  float scale_log2;    // scale * log2(e): scores go through exp2
  // Variable-length packed batches (attntune_attention_forward_varlen): [batch + 1] prefix sums of
  // each sequence's query and key rows (device); null for every other call. Then q/o are
  // [total_q, heads_q, head_dim] and k/v [total_k, heads_kv, head_dim] through the {row, head}
  // strides in stride[2] and stride[1] (stride[0] unused), seqlen_q/seqlen_k bound every
  // sequence's lengths, and lse is [heads_q, total_q] with total_q = cu_seqlens_q[batch].
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  // A KV cache (attntune_attention_forward_kvcache, a build for a paged problem; null and 0 for
  // every other call): each sequence's valid keys ([batch], device; null: seqlen_k each, clamped to
  // 0..seqlen_k) and the page table ([batch, max_blocks_per_seq] page indices, device; null: k/v are
  // [batch, heads_kv, seqlen_k, head_dim] as for a dense call). With a table, k/v are pages
  // [pages, page_size, heads_kv, head_dim] through the {page, head, row} strides, and key j of
  // sequence b is row j % page_size of page block_table[b][j / page_size]; j / page_size =
  // umulhi(j, page_mul) >> page_shift for 0 <= j < 2^31 (page_size 1: page_mul 0).
  const int* cache_seqlens;
  const int* block_table;
  int max_blocks_per_seq, page_size;
  unsigned page_mul;
  int page_shift;
  VariantParams variant;  // windows, soft-cap, sinks (variant_params.h); read only by builds with them
};

#endif
