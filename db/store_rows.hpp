// Inside the Store (store.cpp, store_open.cpp, store_query.cpp): how its values map to columns.
// Nothing outside db/ includes this file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/records.hpp"
#include "db/sqlite.hpp"

namespace attntune::store_rows {

// The campaigns table's problem columns of `table` (its alias in the query) as a SELECT list,
// each named as itself: b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed, variants.
inline std::string problem_columns(const std::string& table) {
  std::string out;
  for (const char* c : {"b", "h", "hkv", "s", "sk", "d", "dtype", "causal", "page", "varlen", "lens_seed",
                        "variants"})
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
  p.set_variants(st.text("variants"));
  return p;
}

inline Config config_from_text(const std::string& text) { return config_from_json(nlohmann::json::parse(text)); }

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
