// The attention problem a campaign tunes for (CONTRACT.md "Problem spec P"):
//   b=4,h=16,s=4096,d=128,dtype=bf16,causal=1   (hkv defaults to h, sk to s)
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

  // Parses and validates a spec; throws InputError naming the offending key and why.
  static Problem parse(const std::string& spec);
  std::string str() const;        // canonical spec, every key spelled out, fixed order
  nlohmann::json json() const;    // {"b":..,"h":..,"hkv":..,"s":..,"sk":..,"d":..,"dtype":"bf16","causal":true}
  static Problem from_json(const nlohmann::json& j);
  // Useful FLOPs: 4*b*h*s*sk*d, counting only the unmasked part of the score matrix when causal
  // (exactly, including bottom-right alignment), as FlashAttention reports.
  double flops() const;
  bool operator==(const Problem&) const = default;
};

}  // namespace attntune
