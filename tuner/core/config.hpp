// A configuration: one value per tunable parameter of a search space. One spelling per tunable:
// `block_n` here, in YAML, in the DB and in JSON; `BLOCK_N` when rendered for NVRTC.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

namespace attntune {

// int for integer parameters, bool for booleans, string for enum values (always one of the
// values the space declares).
using Value = std::variant<std::int64_t, bool, std::string>;

// Ordered by name, so the canonical text and hash of a config do not depend on YAML order.
using Config = std::map<std::string, Value>;

std::string value_str(const Value& v);           // 64, true, interleaved
std::string config_str(const Config& c);         // block_m=128,block_n=64 (canonical, sorted)
nlohmann::json config_json(const Config& c);     // {"block_m":128,...}
Config config_from_json(const nlohmann::json& j);

}  // namespace attntune
