// Inside the Store (store.cpp, store_open.cpp, store_query.cpp): how its values map to columns.
// Nothing outside db/ includes this file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"

#include "core/records.hpp"
#include "db/sqlite.hpp"

namespace attntune::store_rows {

// The campaigns table's problem columns of `table` (its alias in the query) as a SELECT list,
// each named as itself: b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, variants, dv.
inline std::string problem_columns(const std::string& table) {
  std::string out;
  for (const char* c : {"b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page", "varlen", "lens_seed",
                        "variants", "dv"})
    out += (out.empty() ? "" : ", ") + table + "." + c + " AS " + c;
  return out;
}

// The problem of the current row of a query that selects problem_columns.
inline Problem problem_from_columns(const sqlite::Statement& st) {
  Problem p;
  p.b = st.int64("b");
  p.h = st.int64("h");
  p.hkv = st.int64("hkv");
  p.s = st.int64("s");
  p.sk = st.int64("sk");
  p.d = st.int64("d");
  p.dtype = st.text("dtype") == "bf16" ? DType::kBf16 : DType::kFp16;
  p.causal = st.int64("causal") != 0;
  p.page = st.int64("page");
  p.varlen = st.int64("varlen");
  p.lens_seed = st.int64("lens_seed");
  p.set_variants_column(st.text("variants"));
  p.dv = st.int64("dv");
  return p;
}

// A config as stored (candidates.config), and only as attntune writes one: its keys are parameter
// names and its strings enum value names (lowercase names, as the space loader requires), the rest
// integers and booleans. A config is rendered into kernel source (its values become #defines, and
// config_str names it on the source's first comment line) and into exports, so a database edited by
// hand or crafted elsewhere must not bring code, a newline or anything else through one: refused
// (InputError, exit 2) before any of it is used.
inline Config config_from_text(const std::string& text, const std::string& db_path) {
  const auto refuse = [&](const std::string& why) -> Config {
    throw InputError(fmt::format("database '{}' holds a config attntune does not write ({}); the file was edited or "
                                 "crafted: refusing to use it",
                                 db_path, why));
  };
  const auto name = [](const std::string& s) {
    if (s.empty() || s.size() > 64) return false;
    for (char c : s)
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    return s[0] < '0' || s[0] > '9';
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return refuse("not JSON");
  }
  if (!j.is_object() || j.empty()) return refuse("not a JSON object of parameters");
  for (const auto& [k, v] : j.items()) {
    if (!name(k)) return refuse(fmt::format("a parameter named {}", nlohmann::json(k).dump()));
    if (!v.is_boolean() && !v.is_number_integer() && !(v.is_string() && name(v.get<std::string>())))
      return refuse(fmt::format("{} = {}", k, v.dump()));
  }
  return config_from_json(j);
}

inline std::vector<CampaignSpace> read_campaign_spaces(sqlite::Connection& db, std::int64_t campaign_id) {
  sqlite::Statement st(db,
                       "SELECT family, space_path, space_hash, space_text FROM campaign_spaces WHERE campaign_id = ?1 "
                       "ORDER BY family");
  st.bind(campaign_id);
  std::vector<CampaignSpace> out;
  while (st.step()) out.push_back({st.text(0), st.text(1), st.text(2), st.text(3)});
  return out;
}

}  // namespace attntune::store_rows
