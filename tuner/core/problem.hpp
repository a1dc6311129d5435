// The attention problem a campaign tunes for (docs/CONTRACT.md "Problem spec P"):
//   b=4,h=16,s=4096,d=128,dtype=bf16,causal=1   (hkv defaults to h, sk to s)
// and, added with the serving entry points, `page=N`: attention over a paged KV cache
// (attntune_attention_forward_kvcache) with pages of N rows, sk keys per sequence.
#pragma once
#include <cstdint>
#include <string>

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

  // Parses and validates a spec; throws InputError naming the offending key and why.
  static Problem parse(const std::string& spec);
  std::string str() const;        // canonical spec, every key spelled out (page only when > 0), fixed order
  nlohmann::json json() const;    // {"b":..,"h":..,"hkv":..,"s":..,"sk":..,"d":..,"dtype":"bf16","causal":true}
  static Problem from_json(const nlohmann::json& j);
  // Useful FLOPs: 4*b*h*s*sk*d, counting only the unmasked part of the score matrix when causal
  // (exactly, including bottom-right alignment), as FlashAttention reports.
  double flops() const;
  // Bytes an attention call must move at least: K and V once, Q read and O written (decode is
  // judged by bytes / time against the HBM peak).
  double bytes() const;
  bool operator==(const Problem&) const = default;
};

}  // namespace attntune
