// The attention problem a campaign tunes for (docs/CONTRACT.md "Problem spec P"):
//   b=4,h=16,s=4096,d=128,dtype=bf16,causal=1   (hkv defaults to h, sk to s)
// and, added with the serving entry points, `page=N`: attention over a paged KV cache
// (attntune_attention_forward_kvcache) with pages of N rows, sk keys per sequence; `varlen=N`
// (and `lens_seed=M`): a packed batch of sequences of lengths N..s
// (attntune_attention_forward_varlen).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attntune {

enum class DType { kFp16, kBf16 };
const char* dtype_name(DType t);  // "fp16" | "bf16"

struct Problem {
  std::int64_t b = 0;    // batch
  std::int64_t h = 0;    // query heads
  std::int64_t hkv = 0;  // key/value heads; h % hkv == 0
  std::int64_t s = 0;    // query length
  std::int64_t sk = 0;   // key length
  std::int64_t d = 0;    // head dim of Q and K
  // Head dim of V and O (`dv=N`; DeepSeek's MLA prefill: d=192,dv=128); 0 when it is d, which parse()
  // and from_json() store for a `dv` equal to d, so that a problem with one head dim has one form.
  // str() adds ",dv=N" after d and json() "dv" only when set: every such problem reads as it always
  // did. A space serves dv != d only where its problem section lists `dv` (SearchSpace::check_problem).
  std::int64_t dv = 0;
  bool split_dims() const { return dv != 0 && dv != d; }
  std::int64_t head_dim_v() const { return split_dims() ? dv : d; }
  // `latent=1` (issue 44; docs/design/head_dims.md "Latent caches"): V is the first dv columns of K,
  // the same buffer read through K's strides (DeepSeek-V2/V3's MLA decode: one latent cache row of
  // d = kv_lora_rank + qk_rope_head_dim = 576 dims per token, V its first dv = kv_lora_rank = 512).
  // Only with split dims dv < d, and not with varlen; parse() and from_json() refuse the rest with
  // the reason. Not a variant (has_variant(), variant_spec() and variant_words() leave it out): str()
  // adds ",latent=1" at its end and json() "latent" only when set, the database keeps it in the
  // `variants` column after the variants (variants_column()), builds get ATT_LATENT, and bytes() reads
  // K once for both products.
  bool latent = false;
  // `kv_dtype=fp8` (issue 42; docs/CONTRACT.md "FP8 KV caches"): K and V are FP8 e4m3, one byte an
  // element, with dequantisation scales per (sequence, KV head) (FlashAttention-3's descale_k/v);
  // Q and O keep `dtype`. `kv_dtype=` q's dtype (or absent) is a cache of q's dtype: false. Not a
  // variant: str() adds ",kv_dtype=fp8" at its very end (after latent), json() "kv_dtype": "fp8"
  // only when set, the database keeps it in the `variants` column after latent
  // (variants_column()), builds get ATT_KV_FP8, and bytes() counts K and V at one byte an element.
  // Not with varlen (a packed K/V has no per-sequence cache scales there yet).
  bool kv_fp8 = false;
  // `dtype=fp8` (issue 42; docs/CONTRACT.md "FP8 forward"): Q, K and V are FP8 e4m3 (one byte an
  // element) with dequantisation scales per (sequence, KV head) (FlashAttention-3's descale_q/k/v),
  // V given transposed ([b, hkv, dv, sk], keys contiguous: FP8 wgmma reads both operands K-major),
  // and O is bf16: `dtype` holds bf16 (O's, which every 16-bit path reads), this flag the inputs'.
  // str() and json() say dtype=fp8 where the dtype goes; the database keeps bf16 in its dtype column
  // and "dtype=fp8" in the `variants` column after kv_dtype (variants_column()), builds get
  // ATT_QKV_FP8 (and ATT_DTYPE_BF16 1), and a space serves it where its problem section's dtype list
  // has fp8. Dense tensors only: parse() and from_json() refuse it with page, varlen, latent,
  // kv_dtype and pass=bwd, with the reason.
  bool qkv_fp8 = false;
  // The problem's dtype as a spec names it: "fp8" for an FP8 forward, else dtype_name(dtype).
  const char* dtype_spec() const;
  // `pass=bwd` (issue 45): the backward pass of the problem's attention, dQ, dK and dV given Q, K, V,
  // the forward's O and LSE, and dO (attntune_attention_backward; launch_plan.h's kEntryBackward;
  // with varlen, attntune_attention_backward_varlen, kEntryBackwardVarlen).
  // `pass=fwd` (or absent) is the forward pass: false. Not a variant: str() adds ",pass=bwd" at its
  // very end (after kv_dtype), json() "pass": "bwd" only when set, the database keeps it in the
  // `variants` column after kv_dtype (variants_column()), builds get ATT_BWD, flops() is 2.5x the
  // forward's and bytes() counts what a backward call moves. Dense tensors and packed varlen batches
  // for now: parse() and from_json() refuse it with page, latent, kv_dtype=fp8 and dv != d, with the reason
  // (causal and windows are masks, and are served; sinks too, the forward's LSE holds them; and
  // soft-caps, whose derivative multiplies dS).
  bool backward = false;
  DType dtype = DType::kFp16;
  bool causal = false;
  // 0: dense tensors (attntune_attention_forward). N > 0: a KV cache of pages of N rows, read
  // through a block table (attntune_attention_forward_kvcache), every sequence holding sk keys
  // when timed; validation adds ragged lengths (0, 1, odd, sk) and shuffled pages.
  std::int64_t page = 0;
  bool paged() const { return page > 0; }
  // 0: dense. N > 0 (`varlen=N`): a packed batch of b sequences of different lengths
  // (attntune_attention_forward_varlen): sequence i has q_lens()[i] query rows, drawn uniformly
  // from N..s by a fixed generator seeded with lens_seed (`lens_seed=M`, default 0), and
  // q_lens()[i] + sk - s keys (varlen needs sk >= s). s and sk are the largest lengths allowed.
  // Not with page; lens_seed only with varlen. str() adds ",varlen=N" (and ",lens_seed=M" when
  // M != 0), json() "varlen" and "lens_seed", both for a varlen problem only.
  // The generator (tools reproduce it; changing it changes every recorded varlen problem), in
  // unsigned 64-bit arithmetic, splitmix64:
  //   state = lens_seed
  //   for i in 0..b-1:
  //     state += 0x9e3779b97f4a7c15
  //     z = state
  //     z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
  //     z = (z ^ (z >> 27)) * 0x94d049bb133111eb
  //     z ^= z >> 31
  //     len_i = varlen + z % (s - varlen + 1)
  // In Python (M = 2**64 - 1): state = (state + 0x9e3779b97f4a7c15) & M; z = state;
  // z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M; z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M;
  // z ^= z >> 31. b*sk must stay below 2^31 (cu_seqlens are int).
  std::int64_t varlen = 0;
  std::int64_t lens_seed = 0;
  bool is_varlen() const { return varlen > 0; }

  // Attention variants (FlashAttention's semantics, docs/CONTRACT.md "variants"), all run-time
  // values of one build whose kernel was compiled with the variant (ATT_WINDOW, ATT_SOFTCAP,
  // ATT_SINKS): a build for a window serves any window, a soft-cap build any cap.
  //  - `window=L,R` (or `window=L`: R unbounded): query row i, aligned bottom-right (i' = i + len_k -
  //    len_q), sees keys j with i' - L <= j <= i' + R; -1 is unbounded. Causal is R = 0, so a causal
  //    problem stores R = -1 (the causal flag bounds it), `causal=0,window=L,0` is read as
  //    `causal=1,window=L`, and `causal=1` with R > 0 is refused. `window=-1,-1` is no window.
  //  - `softcap=C` (C > 0; 0: none): score = C * tanh(scale * q.k / C), before masking and softmax.
  //  - `sinks=1`: a per-query-head fp32 logit s_h joins each row's softmax denominator (exp(s_h - m))
  //    and adds no value row; the LSE includes it (gpt-oss; FlashAttention-4's learnable_sink).
  // str() adds ",window=L" / ",window=L,R", ",softcap=C", ",sinks=1" only when set, json() "window"
  // ([L, R]), "softcap", "sinks" likewise: every plain problem reads as it always did.
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  double softcap = 0;
  bool sinks = false;
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  bool softcapped() const { return softcap > 0; }
  bool has_variant() const { return windowed() || softcapped() || sinks; }
  // The window's right side as the kernels apply it: 0 when causal, else window_right (-1: none).
  std::int64_t right_bound() const { return causal ? 0 : window_right; }
  // "window=4096,0 softcap=50 sinks" style words for messages; "" when plain.
  std::string variant_words() const;
  // The variants' part of str() without its leading comma ("window=4096,softcap=50,sinks=1"; ""
  // when plain): the database's `variants` column. set_variants reads it back (InputError if it is
  // not such a text), after the other fields (causal) are set.
  std::string variant_spec() const;
  void set_variants(const std::string& spec);
  // The database's `variants` column: variant_spec(), then "latent=1" for a latent problem (",latent=1"
  // after variants), then "kv_dtype=fp8" for an FP8 cache (",kv_dtype=fp8" after either), then
  // "dtype=fp8" for an FP8 forward, "pass=bwd" for the backward pass (last): str()'s tail after page and varlen. "" for every problem
  // without any, so no earlier row changes. set_variants_column reads it back (pass, kv_dtype, latent,
  // then set_variants on the rest, which refuses any key that is not a variant).
  std::string variants_column() const;
  void set_variants_column(const std::string& text);
  std::vector<int> q_lens() const;  // b lengths when varlen, else empty
  std::vector<int> k_lens() const;  // q_lens()[i] + sk - s
  std::int64_t total_q() const;     // rows of the packed q: the sum of q_lens() (b * s when dense)
  std::int64_t total_k() const;

  // Parses and validates a spec; throws InputError naming the offending key and why.
  static Problem parse(const std::string& spec);
  // `pass=fwdbwd` (issue 45): the pair a training step runs, the forward and the backward of one
  // problem, each its own problem and campaign (their best kernels are independent: the backward
  // reads whatever O and LSE the forward wrote). A spec with it reads as {forward, backward} (the
  // backward's refusals, such as a paged cache's, said as its own); any other spec as {parse(spec)}.
  // tune, submit, best and export take it; parse() refuses it, naming them.
  static std::vector<Problem> parse_passes(const std::string& spec);
  std::string str() const;        // canonical spec, every key spelled out (page, varlen only when > 0), fixed order
  nlohmann::json json() const;    // {"b":..,"h":..,"hkv":..,"s":..,"sk":..,"d":..,"dtype":"bf16","causal":true}
  // The same keys in the spec's order (b, h, hkv, s, sk, d, dtype, causal, then page, varlen,
  // lens_seed, window, softcap, sinks, latent, kv_dtype, pass where json() has them): what the CLI
  // and the export print.
  nlohmann::ordered_json ordered_json() const;
  static Problem from_json(const nlohmann::json& j);
  // Useful FLOPs: 2*b*h*s*sk*(d+dv) (4*b*h*s*sk*d with one head dim), counting only the unmasked part of the score matrix when causal
  // or windowed (exactly, including bottom-right alignment), as FlashAttention reports. Varlen: the
  // sum over the sequences of 4*h*len_q*len_k*d, each sequence bottom-right aligned on its own.
  // The backward pass (pass=bwd): 2.5x the forward's (FlashAttention's convention: five matrix
  // products of the score matrix's size against the forward's two).
  double flops() const;
  // Bytes an attention call must move at least: K (d) and V (dv) once, Q (d) read and O (dv) written (decode is
  // judged by bytes / time against the HBM peak). Varlen: the packed tensors' rows (total_q, total_k).
  // A window counts only the K/V rows some query of the sequence sees (a kernel that skips the
  // rest reads no more). Latent: V is K's first dv columns, not read separately (K, Q and O only).
  // kv_fp8: K and V (or the latent cache) at one byte an element, Q and O at two. qkv_fp8: Q, K and
  // V at one byte, O at two.
  // The backward pass (pass=bwd; one head dim): Q, O, dO and the LSE (fp32) read and dQ
  // written, b*h*s rows each (varlen: h*total_q); K and V read (only the rows some query sees, as the forward) and dK
  // and dV written (all b*hkv*sk rows: a key no query sees gets a zero gradient). Workspaces (dQ's
  // fp32 accumulator, rowsum(dO * O)) are a kernel's choice and not counted.
  double bytes() const;
  bool operator==(const Problem&) const = default;
};

}  // namespace attntune
