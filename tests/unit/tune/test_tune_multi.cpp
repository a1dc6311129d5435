// tune with two search spaces (flash_fwd_mma and flash_fwd_wgmma) in one campaign, against simulated
// evaluators (one recorded campaign per template): both templates searched and ranked together,
// each stored under its own template and arch; resume (also after SIGKILL, and with the --space
// order swapped); the same seed gives the same campaign; a template that only fails gets little;
// errors for the same space twice, other spaces on resume and a template the arch cannot run; and
// best, campaigns, report and replay reading the mixed campaign.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "search/multi_family.hpp"
#include "tune_test_util.hpp"

namespace attntune::test {
namespace test_tune_multi {
namespace {

// `attntune ARGS...`, each argument quoted for the shell.
testing::Outcome run_attntune(const std::vector<std::string>& args) {
  std::string line;
  for (const std::string& a : args) {
    std::string q = "'";
    for (const char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += q + "' ";
  }
  return testing::run_attntune(line);
}

inline std::string wgmma_file() { return std::string(ATTNTUNE_SOURCE_DIR) + "/search_spaces/flash_fwd_wgmma.yaml"; }

// Records every valid config of `space_path` for kProblem on `arch` as campaign `name`: `base` µs
// spread by a hash of the config, with failures; base 0: every config fails to compile.
// `device_arch`: the arch the recording claims (default `arch`).
void record(const std::string& db, const std::string& space_path, const std::string& arch, const std::string& name,
            double base, const std::string& device_arch = "") {
  const SearchSpace space = SearchSpace::load(space_path);
  const Problem problem = Problem::parse(kProblem);
  Store store = Store::open(db, Store::Mode::kCreate);
  const std::int64_t dev = store.upsert_device(
      {"NVIDIA H100 80GB HBM3", device_arch.empty() ? arch : device_arch, "GPU-rec", 132, "580"});
  CampaignSpec spec;
  spec.name = name;
  spec.problem = problem;
  spec.space_path = "/tuning/machine/" + space.family() + ".yaml";
  spec.space_hash = space.hash();
  spec.space_text = space.text();
  spec.family = space.family();
  spec.strategy = "exhaustive";
  const std::int64_t c = store.open_campaign(spec, dev);
  for (const Config& cfg : space.enumerate(problem, arch)) {
    const std::string key = config_str(cfg);
    const std::uint64_t h = std::hash<std::string>{}(key);
    EvalRecord r;
    if (base <= 0 || h % 23 == 0) {
      r.status = "compile_error";
      r.error = "ptxas fatal: synthetic";
    } else {
      r = recorded_ok(base * (1 + 0.4 * double(h % 89) / 89), problem);
    }
    store.record_evaluation(c, store.upsert_candidate(space.family(), cfg, content_hash(space.family() + key)), dev,
                            r);
  }
  store.finish_campaign(c, "completed", "space exhausted");
}

class TuneMulti : public ::testing::Test {
 protected:
  void SetUp() override {
    record(rec, space_file(), "sm_90", "rec_mma", 1000);
    record(rec, wgmma_file(), "sm_90a", "rec_wgmma", 700);
    record(rec, wgmma_file(), "sm_90a", "rec_wgmma_fails", 0);
  }
  std::vector<std::string> args(int budget, const std::string& db, const std::string& wgmma_rec = "rec_wgmma",
                                bool swapped = false, int delay_ms = 0) const {
    std::vector<std::string> a = {"tune", "--problem", kProblem, "--db", db, "--campaign", "k", "--simulate-db", rec,
                                  "--simulate-campaign", "rec_mma", "--simulate-campaign", wgmma_rec,
                                  "--simulate-delay-ms", std::to_string(delay_ms), "--budget-evals",
                                  std::to_string(budget), "--patience", "0", "--log-interval", "1", "--seed", "3"};
    const std::vector<std::string> spaces =
        swapped ? std::vector<std::string>{"--space", wgmma_file(), "--space", space_file()}
                : std::vector<std::string>{"--space", space_file(), "--space", wgmma_file()};
    a.insert(a.begin() + 1, spaces.begin(), spaces.end());
    return a;
  }
  // The search's evaluations: (template, config, status) in order.
  std::vector<std::tuple<std::string, std::string, std::string>> evaluations(const std::string& db) const {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    if (!fs::exists(db)) return out;
    std::optional<Store> opened;
    try {
      opened.emplace(Store::open(db, Store::Mode::kReadOnly));
    } catch (const InputError& e) {
      // Killed after creating the file, before its schema was committed: nothing recorded yet.
      if (std::string(e.what()).find("is empty") != std::string::npos) return out;
      throw;
    }
    Store& s = *opened;
    auto id = s.find_campaign("k");
    if (!id) return out;
    for (const EvaluationRow& e : s.campaign_evaluations(*id))
      out.emplace_back(e.family, config_str(e.config), e.record.status);
    return out;
  }
  std::map<std::string, int> per_template(const std::string& db) const {
    std::map<std::string, int> n;
    for (const auto& [family, config, status] : evaluations(db)) ++n[family];
    return n;
  }
  TempDir dir;
  std::string rec = dir.file("rec.db"), work = dir.file("work.db"), log_path = dir.file("tune.log");
};

TEST_F(TuneMulti, SearchesBothTemplatesAndRanksThemTogether) {
  auto r = run_attntune(args(80, work));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("valid configs (flash_fwd_mma "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("evaluations by template: flash_fwd_mma "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("template"), std::string::npos) << "the ranking names each row's template\n" << r.out;

  const auto n = per_template(work);
  ASSERT_EQ(n.size(), 2u);
  EXPECT_GE(n.at("flash_fwd_mma"), 8);
  EXPECT_GT(n.at("flash_fwd_wgmma"), n.at("flash_fwd_mma")) << "wgmma is faster here";
  EXPECT_EQ(n.at("flash_fwd_mma") + n.at("flash_fwd_wgmma"), 80);

  Store s = Store::open(work, Store::Mode::kReadOnly);
  const auto c = s.campaign_row("k");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->spec.family, "flash_fwd_mma+flash_fwd_wgmma");
  ASSERT_EQ(c->spec.spaces.size(), 2u);
  EXPECT_EQ(c->spec.spaces[1].family, "flash_fwd_wgmma");
  EXPECT_EQ(c->spec.spaces[1].text, SearchSpace::load(wgmma_file()).text()) << "each space's text is kept";
  EXPECT_EQ(c->status, "completed");
  // Stored as each template's space has them: no `template` key in any config.
  for (const EvaluationRow& e : s.campaign_evaluations(c->id)) {
    EXPECT_EQ(e.config.count(search::kTemplateKey), 0u);
    const bool mma = e.family == "flash_fwd_mma";
    EXPECT_EQ(SearchSpace::load(mma ? space_file() : wgmma_file())
                  .check(e.config, Problem::parse(kProblem), mma ? "sm_90" : "sm_90a"),
              std::nullopt);
  }
  // The ranking holds both templates (each one's best is re-timed), fastest first.
  const auto ranking = s.ranking(c->id);
  std::set<std::string> ranked;
  for (const RankedRow& row : ranking) ranked.insert(row.family);
  EXPECT_EQ(ranked, (std::set<std::string>{"flash_fwd_mma", "flash_fwd_wgmma"}));
  EXPECT_EQ(ranking.front().family, "flash_fwd_wgmma");
  for (std::size_t i = 1; i < ranking.size(); ++i) EXPECT_LE(ranking[i - 1].entry.median_us, ranking[i].entry.median_us);

  // best: both templates, each under the arch it was built for.
  BestQuery q;
  q.campaign = "k";
  q.top = 100;
  std::map<std::string, std::set<std::string>> archs;
  for (const BestRow& b : s.best(q)) archs[b.family].insert(b.arch);
  EXPECT_EQ(archs["flash_fwd_mma"], std::set<std::string>{"sm_90"});
  EXPECT_EQ(archs["flash_fwd_wgmma"], std::set<std::string>{"sm_90a"});
  const auto top = s.best({std::nullopt, std::string("k"), 1});
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].family, "flash_fwd_wgmma");
  EXPECT_EQ(top[0].median_us, ranking.front().entry.median_us);
}

// A warm start where both templates' nearest tuned problem is the same: the campaign's warm-up
// follows their times there (search::AllocationOptions): flash_fwd_mma, 1.4x flash_fwd_wgmma's
// time in the recordings, gets its best 2 seeds, not 8, and the progress says so.
TEST_F(TuneMulti, AWarmStartThatPutsATemplateFarBehindShortensItsWarmUp) {
  ASSERT_EQ(run_attntune(args(40, work)).rc, 0);
  std::vector<std::string> a = args(12, work);
  a[std::find(a.begin(), a.end(), "k") - a.begin()] = "k2";
  const auto r = run_attntune(a);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("warm start: flash_fwd_mma was 1."), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("x flash_fwd_wgmma's time there: its warm-up is its best 2 configs"), std::string::npos)
      << r.err;
  Store s = Store::open(work, Store::Mode::kReadOnly);
  const auto id = s.find_campaign("k2");
  ASSERT_TRUE(id);
  std::map<std::string, int> first10;
  const auto evals = s.campaign_evaluations(*id);
  ASSERT_GE(evals.size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) ++first10[evals[i].family];
  EXPECT_EQ(first10["flash_fwd_mma"], 2) << "before: 5 of the first 10 (the templates in turn)";
  EXPECT_EQ(first10["flash_fwd_wgmma"], 8);
}

TEST_F(TuneMulti, JsonResultNamesTheTemplateOfEachRankedConfig) {
  auto a = args(40, work);
  a.insert(a.end(), {"--format", "json"});
  auto r = run_attntune(a);
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["template"], "flash_fwd_mma+flash_fwd_wgmma");
  EXPECT_EQ(j["templates"], nlohmann::json({"flash_fwd_mma", "flash_fwd_wgmma"}));
  std::set<std::string> ranked;
  for (const auto& row : j["ranking"]) {
    ranked.insert(row["template"].get<std::string>());
    EXPECT_FALSE(row["config"].contains("template"));
  }
  EXPECT_EQ(ranked.size(), 2u);
}

TEST_F(TuneMulti, ResumesWhateverTheOrderOfSpacesAndEvaluatesNothingTwice) {
  ASSERT_EQ(run_attntune(args(30, work)).rc, 0);
  const auto first = evaluations(work);
  ASSERT_EQ(first.size(), 30u);
  auto r = run_attntune(args(70, work, "rec_wgmma", /*swapped=*/true));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("resuming campaign 'k': 30 evaluations recorded"), std::string::npos) << r.err;
  const auto all = evaluations(work);
  ASSERT_EQ(all.size(), 70u);
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(all[i], first[i]);
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& [family, config, status] : all)
    EXPECT_TRUE(seen.insert({family, config}).second) << "evaluated twice: " << family << " " << config;
}

TEST_F(TuneMulti, KilledAndResumedLosesNothingAndEndsComplete) {
  const int budget = 90;
  std::mt19937 rng(7);
  std::vector<std::tuple<std::string, std::string, std::string>> before;
  for (int kill = 0; kill < 6; ++kill) {
    TuneProcess p(args(budget, work, "rec_wgmma", kill % 2 == 1, 10), log_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(80, 400)(rng)));
    p.signal(SIGKILL);
    const int rc = p.wait();
    const auto now = evaluations(work);
    if (rc == 0) {
      ASSERT_EQ(static_cast<int>(now.size()), budget);
    } else {
      ASSERT_EQ(rc, 128 + SIGKILL);
    }
    ASSERT_GE(now.size(), before.size());
    for (std::size_t i = 0; i < before.size(); ++i) ASSERT_EQ(now[i], before[i]) << "committed, then lost or changed";
    before = now;
    if (static_cast<int>(now.size()) >= budget) break;
  }
  TuneProcess last(args(budget, work), log_path);
  ASSERT_EQ(last.wait(), 0) << read_bytes(log_path);
  const auto all = evaluations(work);
  ASSERT_EQ(static_cast<int>(all.size()), budget);
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(all[i], before[i]);
  std::set<std::pair<std::string, std::string>> seen;
  for (const auto& [family, config, status] : all) EXPECT_TRUE(seen.insert({family, config}).second);
  const auto n = per_template(work);
  EXPECT_EQ(n.size(), 2u) << "both templates resumed";
  Store s = Store::open(work, Store::Mode::kReadOnly);
  EXPECT_FALSE(s.ranking(*s.find_campaign("k")).empty());
}

TEST_F(TuneMulti, TheSameSeedGivesTheSameCampaign) {
  const std::string other = dir.file("other.db");
  ASSERT_EQ(run_attntune(args(50, work)).rc, 0);
  ASSERT_EQ(run_attntune(args(50, other, "rec_wgmma", /*swapped=*/true)).rc, 0);
  EXPECT_EQ(evaluations(work), evaluations(other));
}

TEST_F(TuneMulti, ATemplateThatOnlyFailsGetsFewEvaluations) {
  auto r = run_attntune(args(100, work, "rec_wgmma_fails"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto n = per_template(work);
  EXPECT_GE(n.at("flash_fwd_wgmma"), 8) << "it was tried";
  EXPECT_LE(n.at("flash_fwd_wgmma"), 16) << "then left alone";
  Store s = Store::open(work, Store::Mode::kReadOnly);
  for (const RankedRow& row : s.ranking(*s.find_campaign("k"))) EXPECT_EQ(row.family, "flash_fwd_mma");
}

TEST_F(TuneMulti, TheSameSpaceTwiceIsAnError) {
  auto r = run_attntune({"tune", "--space", space_file(), "--space", space_file(), "--problem", kProblem, "--db", work,
                         "--simulate-db", rec, "--simulate-campaign", "rec_mma", "--simulate-campaign", "rec_mma"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("is the same search space as --space"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(work)) << "nothing written for a bad input";
}

TEST_F(TuneMulti, OneRecordingPerSpace) {
  auto a = args(10, work);
  a.erase(std::find(a.begin(), a.end(), "rec_wgmma") - 1, std::find(a.begin(), a.end(), "rec_wgmma") + 1);
  auto r = run_attntune(a);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("give one recorded campaign per space"), std::string::npos) << r.err;
}

TEST_F(TuneMulti, ResumingWithOtherSpacesIsAnError) {
  ASSERT_EQ(run_attntune(args(20, work)).rc, 0);
  auto r = run_attntune({"tune", "--space", space_file(), "--problem", kProblem, "--db", work, "--campaign", "k",
                         "--simulate-db", rec, "--simulate-campaign", "rec_mma"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("attntune: error: campaign 'k' tunes templates flash_fwd_mma and flash_fwd_wgmma; it cannot "
                       "be resumed with template 'flash_fwd_mma'"),
            std::string::npos)
      << r.err;
  // And the other way: a campaign of one template cannot grow a second.
  auto one = run_attntune({"tune", "--space", space_file(), "--problem", kProblem, "--db", work, "--campaign", "solo",
                           "--simulate-db", rec, "--simulate-campaign", "rec_mma", "--budget-evals", "5"});
  ASSERT_EQ(one.rc, 0) << one.err;
  auto a = args(20, work);
  *std::find(a.begin(), a.end(), "k") = "solo";
  r = run_attntune(a);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("campaign 'solo' tunes template 'flash_fwd_mma'; it cannot be resumed with templates "
                       "flash_fwd_mma and flash_fwd_wgmma"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(evaluations(work).size(), 20u) << "the refused runs changed nothing";
}

TEST_F(TuneMulti, ATemplateTheArchCannotRunIsAnError) {
  // flash_fwd_wgmma recorded as if built for plain sm_90: its space lists only sm_90a.
  record(rec, wgmma_file(), "sm_90a", "rec_wgmma_sm90", 700, "sm_90");
  auto r = run_attntune(args(10, work, "rec_wgmma_sm90"));
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("sm_90"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(work));
}

TEST_F(TuneMulti, ReadersShowTheMixedCampaign) {
  ASSERT_EQ(run_attntune(args(60, work)).rc, 0);
  // campaigns
  auto c = run_attntune({"campaigns", "--db", work, "--format", "json"});
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_NE(c.out.find("flash_fwd_mma+flash_fwd_wgmma"), std::string::npos) << c.out;
  // best: both templates, the contract's fields
  auto b = run_attntune({"best", "--db", work, "--campaign", "k", "--top", "100", "--format", "json"});
  ASSERT_EQ(b.rc, 0) << b.err;
  std::set<std::string> templates;
  for (const auto& row : nlohmann::json::parse(b.out)) templates.insert(row["template"].get<std::string>());
  EXPECT_EQ(templates, (std::set<std::string>{"flash_fwd_mma", "flash_fwd_wgmma"}));
  // report: per-template curves and effects
  auto rj = run_attntune({"report", "--db", work, "--campaign", "k", "--format", "json"});
  ASSERT_EQ(rj.rc, 0) << rj.err;
  const auto j = nlohmann::json::parse(rj.out);
  ASSERT_EQ(j["families"].size(), 2u);
  EXPECT_EQ(j["families"][1]["template"], "flash_fwd_wgmma");
  EXPECT_GT(j["families"][1]["parameters"].size(), 2u);
  EXPECT_FALSE(j["families"][0]["convergence"].empty());
  ASSERT_EQ(j["parameters"].size(), 1u) << "campaign-wide, only `template` means one thing";
  EXPECT_EQ(j["parameters"][0]["name"], "template");
  auto rt = run_attntune({"report", "--db", work, "--campaign", "k"});
  ASSERT_EQ(rt.rc, 0) << rt.err;
  EXPECT_NE(rt.out.find("Template flash_fwd_mma:"), std::string::npos) << rt.out;
  EXPECT_NE(rt.out.find("Template flash_fwd_wgmma:"), std::string::npos) << rt.out;
  auto csv = run_attntune({"report", "--db", work, "--campaign", "k", "--format", "csv"});
  ASSERT_EQ(csv.rc, 0) << csv.err;
  EXPECT_NE(csv.out.substr(0, csv.out.find('\n')).find("template"), std::string::npos);
  // replay: a mixed recording is refused with the reason
  auto rp = run_attntune({"replay", "--db", work, "--campaign", "k", "--strategy", "random", "--seeds", "2"});
  EXPECT_EQ(rp.rc, 2);
  EXPECT_NE(rp.err.find("searched several templates"), std::string::npos) << rp.err;
}

}  // namespace
}  // namespace test_tune_multi
}  // namespace attntune::test
