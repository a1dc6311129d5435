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

// A problem from the campaigns columns b, h, hkv, s, sk, d, dtype, causal, page, varlen, lens_seed,
// variants (twelve, in that order) starting at `col`.
inline constexpr int kProblemColumns = 12;
inline Problem problem_from_columns(const sqlite::Statement& st, int col) {
  Problem p;
  p.b = st.int64(col);
  p.h = st.int64(col + 1);
  p.hkv = st.int64(col + 2);
  p.s = st.int64(col + 3);
  p.sk = st.int64(col + 4);
  p.d = st.int64(col + 5);
  p.dtype = st.text(col + 6) == "bf16" ? DType::kBf16 : DType::kFp16;
  p.causal = st.int64(col + 7) != 0;
  p.page = st.int64(col + 8);
  p.varlen = st.int64(col + 9);
  p.lens_seed = st.int64(col + 10);
  p.set_variants(st.text(col + 11));
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
