#include <gtest/gtest.h>

#include "core/config.hpp"
#include "core/error.hpp"

namespace test_core_config {
using namespace attntune;

TEST(Config, CanonicalTextIsSortedByName) {
  Config c{{"warps", std::int64_t{4}}, {"block_m", std::int64_t{128}}, {"q_in_regs", true},
           {"kv_load", std::string("ahead")}};
  EXPECT_EQ(config_str(c), "block_m=128,kv_load=ahead,q_in_regs=true,warps=4");
}

TEST(Config, JsonRoundTripKeepsTypes) {
  Config c{{"block_m", std::int64_t{64}}, {"q_in_regs", false}, {"kv_load", std::string("x")}};
  auto j = config_json(c);
  EXPECT_TRUE(j["q_in_regs"].is_boolean());
  EXPECT_EQ(config_from_json(j), c);
  EXPECT_THROW(config_from_json(nlohmann::json::parse(R"({"a":1.5})")), InputError);
}
}  // namespace test_core_config
