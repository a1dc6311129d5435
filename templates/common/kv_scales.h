// ---- templates/common/kv_scales.h: an FP8 KV cache's dequantisation scales (docs/CONTRACT.md "FP8
// KV caches"), the kernel argument's part that builds of an FP8 cache read (flash_decode's
// DecodeParams::kv, the reference's attn_reference_kv_fp8) and launch_plan.h's fill_kv_scales fills
// from a call. Apart from VariantParams, whose text every prefill kernel's source holds (a change
// there is a new source for every recorded kernel). Plain C, shared by host and NVRTC code.
#ifndef ATTNTUNE_KV_SCALES_H
#define ATTNTUNE_KV_SCALES_H

struct KvScales {
  // FlashAttention-3's descale_k / descale_v: [batch, heads_kv] fp32 through {batch, head} strides
  // in elements (0, 0: one scale for the tensor); null: 1. A key's value is its e4m3 byte's value
  // times k_descale[b * k_descale_stride[0] + kv_head * k_descale_stride[1]] (V's likewise).
  const float* k_descale;
  const float* v_descale;
  int k_descale_stride[2], v_descale_stride[2];
};

#endif  // ATTNTUNE_KV_SCALES_H
