// ---- templates/common/variant_params.h: the run-time values of the attention variants (sliding
// windows, logit soft-capping, attention sinks; docs/CONTRACT.md), one struct that every kernel
// argument (AttnParams, DecodeParams) embeds as `variant` and launch_plan.h's fill_tensor_args fills
// from a call. A kernel reads a field only when it was built with the variant (ATT_WINDOW,
// ATT_SOFTCAP, ATT_SINKS): a plain build pays nothing. Plain C, shared by host and NVRTC code.
#ifndef ATTNTUNE_VARIANT_PARAMS_H
#define ATTNTUNE_VARIANT_PARAMS_H

struct VariantParams {
  // Query row i of a sequence, aligned bottom-right (i' = i + len_k - len_q), sees keys j with
  // i' - window_left <= j <= i' + window_right; -1 is unbounded. A causal build bounds the right
  // side itself (window_right is -1 then).
  int window_left, window_right;
  // Soft-cap c > 0: score = c * tanh(scale * q.k / c), before masking; softcap_scale = scale / c (a
  // raw score q.k times it is tanh's argument). The scores are scaled once capped, so a soft-cap
  // call's scale_log2 is log2(e), not scale * log2(e).
  float softcap, softcap_scale;
  // Sinks: [heads_q] fp32 logits s_h (natural log units). Each row's softmax denominator gains
  // exp(s_h - m), no value row is added, and the LSE includes it.
  const float* sinks;
};

#endif  // ATTNTUNE_VARIANT_PARAMS_H
