// The one kernel parameter of every attention template, passed by value. Plain C so that the
// tuner (host C++), NVRTC-compiled kernels and exported .cu files share one layout.
#ifndef ATTNTUNE_ATTN_PARAMS_H
#define ATTNTUNE_ATTN_PARAMS_H

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
};

#endif
