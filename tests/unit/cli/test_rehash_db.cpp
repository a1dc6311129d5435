// tools/rehash_db.py: results a template or space edit left stale move to the new source only where
// the machine code is the same. Real binaries and NVRTC (this tree's attntune on both sides) over the
// suite fixture (flash_fwd_mma campaigns measured with this tree's templates): as they are, every
// result is fresh; a space that gains a tunable the template does not read renders other sources
// with the same machine code, and they move (then read as fresh); a stored hash the old binary does
// not render (not the tree that measured it) stays, and the script exits 1.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include "../export/nvcc_util.hpp"  // sh()
#include "../tune/tune_test_util.hpp"
#include "cuda/nvrtc.hpp"
#include "db/sqlite.hpp"

namespace attntune::test {
namespace test_rehash_db {
namespace {

namespace fs = std::filesystem;

const char* kCampaign = "b4-s4k-d128-bf16";

struct Fixture {
  fs::path dir, db;
  Fixture() {
    dir = fs::temp_directory_path() / fmt::format("rehash-test-{}", ::getpid());
    fs::create_directories(dir);
    db = dir / "suite.db";
    fs::copy_file(testing::source_dir() + "/tests/data/campaigns/h100-suite.db", db,
                  fs::copy_options::overwrite_existing);
  }
  ~Fixture() { fs::remove_all(dir); }
  Shell rehash(const std::string& extra = "") const {
    return sh(fmt::format("python3 {}/tools/rehash_db.py --db {} --before {} --after {} --family flash_fwd_mma "
                          "--campaign {} --jobs 2 {}",
                          testing::source_dir(), db.string(), testing::attntune_bin(), testing::attntune_bin(),
                          kCampaign, extra));
  }
  // The stored source hashes of the campaign's ranked candidates, in rank order.
  std::string hashes() const {
    sqlite::Connection c = sqlite::Connection::open(db.string(), SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT k.source_hash FROM rankings r JOIN campaigns c ON c.id = r.campaign_id JOIN "
                            "candidates k ON k.id = r.candidate_id WHERE c.name = ? ORDER BY r.rank");
    st.bind(kCampaign);
    std::string out;
    while (st.step()) out += (out.empty() ? "" : ",") + st.text(0);
    return out;
  }
  // Runs statements on the fixture's database (the test's edit of what a campaign left).
  void sql(std::string_view statements) const {
    sqlite::Connection::open(db.string(), SQLITE_OPEN_READWRITE).exec(statements);
  }
};

bool have_nvrtc() {
  std::string why;
  return cuda::nvrtc_available(&why);
}

TEST(RehashDb, TheFixtureIsFreshAndNothingMoves) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC";
  Fixture f;
  const std::string before = f.hashes();
  const Shell r = f.rehash();
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("5 results looked at: 0 moved to the new source, 5 fresh"), std::string::npos) << r.output;
  EXPECT_EQ(f.hashes(), before);
}

TEST(RehashDb, ASpaceWithATunableTheTemplateDoesNotReadMovesTheResults) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC";
  Fixture f;
  // This tree's space plus a parameter no template line reads: every config renders another source
  // (its #define and the header's config), which compiles to the same machine code.
  std::ifstream in(testing::source_dir() + "/search_spaces/flash_fwd_mma.yaml");
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::size_t at = yaml.find("\nparams:\n");
  ASSERT_NE(at, std::string::npos);
  yaml.insert(at + 9, "  unread_knob: {values: [0, 1], default: 0}\n");
  const fs::path space = f.dir / "flash_fwd_mma.yaml";
  std::ofstream(space) << yaml;
  const std::string before = f.hashes();
  Shell r = f.rehash("--space flash_fwd_mma=" + space.string() + " --dry-run");
  if (r.output.find("no cuobjdump") != std::string::npos) GTEST_SKIP() << "no cuobjdump: " << r.output;
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("5 moved to the new source (dry run: not written)"), std::string::npos) << r.output;
  EXPECT_EQ(f.hashes(), before);
  r = f.rehash("--space flash_fwd_mma=" + space.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("5 moved to the new source"), std::string::npos) << r.output;
  const std::string after = f.hashes();
  EXPECT_NE(after, before);
  // Moved, they are what the new space renders: fresh under it.
  r = f.rehash("--space flash_fwd_mma=" + space.string());
  EXPECT_NE(r.output.find("0 moved to the new source, 5 fresh"), std::string::npos) << r.output;
  EXPECT_EQ(f.hashes(), after);
}

TEST(RehashDb, AResultTheOldBinaryDoesNotRenderStays) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC";
  Fixture f;
  f.sql(fmt::format("UPDATE candidates SET source_hash = '{}' WHERE id = (SELECT r.candidate_id FROM rankings r JOIN "
                    "campaigns c ON c.id = r.campaign_id WHERE c.name = '{}' AND r.rank = 1)",
                    std::string(32, '0'), kCampaign));
  const std::string before = f.hashes();
  const Shell r = f.rehash();
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("not-the-tree " + std::string(kCampaign)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 fresh, 1 not-the-tree"), std::string::npos) << r.output;
  EXPECT_EQ(f.hashes(), before);
}

// A shipped flash_fwd_wgmma result whose campaign's stored space predates a tunable (fa4_loop):
// `export` renders it through that space, so the template must build without the tunable's #define,
// and the shipped hash must be that rendering. Found 2026-11-30: FA4_LOOP had no default in the
// template (the old space's source did not compile) and the first rehash moved the results to the
// tree space's hash, which no export renders (186 campaigns stale). This fails again when a template
// edit leaves the shipped file stale (tools/rehash_db.py, then tools/build_shipped_db.sh --check).
TEST(RehashDb, AShippedResultFromBeforeATunableBuildsAsExportRendersIt) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC";
  Fixture f;
  const fs::path shipped = f.dir / "shipped.db";
  fs::copy_file(testing::source_dir() + "/db/shipped/attntune-shipped.db", shipped, fs::copy_options::overwrite_existing);
  // A ranked campaign whose stored flash_fwd_wgmma space predates fa4_loop, the one of d=64 s=32k
  // causal where there is still one (the shipped file's deepening measures campaigns again with the
  // tree's space: which ones are older changes as it goes).
  std::string campaign, space;
  {
    sqlite::Connection c = sqlite::Connection::open(shipped.string(), SQLITE_OPEN_READONLY);
    sqlite::Statement st(c, "SELECT c.name, s.space_text FROM campaigns c JOIN campaign_spaces s ON s.campaign_id = c.id "
                            "AND s.family = 'flash_fwd_wgmma' WHERE instr(s.space_text, 'fa4_loop') = 0 AND EXISTS "
                            "(SELECT 1 FROM rankings r JOIN candidates k ON k.id = r.candidate_id WHERE r.campaign_id = "
                            "c.id AND k.family = 'flash_fwd_wgmma') ORDER BY c.name");
    const std::string want = "flash_fwd_mma+flash_fwd_wgmma:b=1,h=16,hkv=16,s=32768,sk=32768,d=64,dtype=bf16,causal=1";
    while (st.step()) {
      if (campaign.empty() || st.text(0) == want) {
        campaign = st.text(0);
        space = st.text(1);
      }
    }
  }
  ASSERT_FALSE(campaign.empty()) << "no shipped flash_fwd_wgmma result from before fa4_loop";
  ASSERT_EQ(space.find("fa4_loop"), std::string::npos) << "the campaign's space should predate fa4_loop";
  const Shell r = sh(fmt::format(
      "python3 {}/tools/rehash_db.py --db {} --before {} --after {} --family flash_fwd_wgmma --campaign '{}' --jobs 2 "
      "--dry-run",
      testing::source_dir(), shipped.string(), testing::attntune_bin(), testing::attntune_bin(), campaign));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("results looked at: 0 moved to the new source"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("build"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not-the-tree"), std::string::npos) << r.output;
}

// A campaign a time box stopped has no final ranking, and `best` and `export` answer from its search
// results: rehash looks at its fastest ones without --top. Found 2026-11-30: the deepening's second
// box stopped two shipped campaigns, the rehash after the FP8 d=256 merge looked at none of their
// results, and --check then found both stale.
TEST(RehashDb, ACampaignWithNoFinalRankingIsLookedAtThroughItsSearchResults) {
  if (!have_nvrtc()) GTEST_SKIP() << "no NVRTC";
  Fixture f;
  f.sql(fmt::format("DELETE FROM rankings WHERE campaign_id = (SELECT id FROM campaigns WHERE name = '{0}'); "
                    "UPDATE campaigns SET status = 'stopped' WHERE name = '{0}'",
                    kCampaign));
  const Shell r = f.rehash();
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("5 results looked at: 0 moved to the new source, 5 fresh"), std::string::npos) << r.output;
}

TEST(RehashDb, BadInputIsRefused) {
  Fixture f;
  Shell r = sh(fmt::format("python3 {}/tools/rehash_db.py --db {} --before {} --after {} --campaign nope",
                           testing::source_dir(), f.db.string(), testing::attntune_bin(), testing::attntune_bin()));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("no campaign 'nope'"), std::string::npos) << r.output;
  r = sh(fmt::format("python3 {}/tools/rehash_db.py --db {}/missing.db --before {} --after {}", testing::source_dir(),
                     f.dir.string(), testing::attntune_bin(), testing::attntune_bin()));
  EXPECT_EQ(r.status, 2) << r.output;
}

}  // namespace
}  // namespace test_rehash_db
}  // namespace attntune::test
