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
  std::int64_t d = 0;    // head dim
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
  std::vector<int> q_lens() const;  // b lengths when varlen, else empty
  std::vector<int> k_lens() const;  // q_lens()[i] + sk - s
  std::int64_t total_q() const;     // rows of the packed q: the sum of q_lens() (b * s when dense)
  std::int64_t total_k() const;

  // Parses and validates a spec; throws InputError naming the offending key and why.
  static Problem parse(const std::string& spec);
  std::string str() const;        // canonical spec, every key spelled out (page, varlen only when > 0), fixed order
  nlohmann::json json() const;    // {"b":..,"h":..,"hkv":..,"s":..,"sk":..,"d":..,"dtype":"bf16","causal":true}
  static Problem from_json(const nlohmann::json& j);
  // Useful FLOPs: 4*b*h*s*sk*d, counting only the unmasked part of the score matrix when causal
  // (exactly, including bottom-right alignment), as FlashAttention reports. Varlen: the sum over
  // the sequences of 4*h*len_q*len_k*d, each causal sequence bottom-right aligned on its own.
  double flops() const;
  // Bytes an attention call must move at least: K and V once, Q read and O written (decode is
  // judged by bytes / time against the HBM peak). Varlen: the packed tensors' rows (total_q, total_k).
  double bytes() const;
  bool operator==(const Problem&) const = default;
};

}  // namespace attntune
