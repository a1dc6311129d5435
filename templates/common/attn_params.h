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
};

#endif
