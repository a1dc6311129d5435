// `attntune serve` on the GPU: a serve worker keeps one GPU worker process (the Evaluator) for all
// the campaigns it runs, each campaign preparing its own problem in it. Before, each campaign started
// its own (the driver, a context, the reference kernels' NVRTC compile): 3.2 s of a shipped-database
// campaign's median 9.9 on an H100 (docs/design/shipped_db.md).
#include <filesystem>
#include <string>

#include <sqlite3.h>

#include "db/sqlite.hpp"
#include "gpu_env.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_serve_gpu {
using namespace attntune;
namespace fs = std::filesystem;

TEST(ServeGpu, OneGpuWorkerProcessServesEveryCampaignOfAServeWorker) {
  ATTNTUNE_REQUIRE_GPU();
  const fs::path dir = fs::temp_directory_path() / ("attntune-serve-gpu-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string db = (dir / "q.db").string();
  // Three problems of other shapes, dtypes and validation seeds: each campaign prepares its own
  // inputs and references in the one GPU worker, and is checked against them.
  struct Queued {
    std::string problem;
    int seed;
  };
  const Queued queued[] = {{"b=2,h=4,hkv=2,s=333,d=64,dtype=bf16,causal=1", 3},
                           {"b=1,h=8,s=200,sk=517,d=128,dtype=fp16,causal=0", 4},
                           {"b=3,h=2,s=7,sk=700,d=64,dtype=bf16,causal=1", 3}};
  for (const auto& q : queued) {
    auto r = attntune::testing::run_attntune("submit --db " + db + " --space " + source_dir() +
                                             "/search_spaces/flash_fwd_mma.yaml --problem " + q.problem +
                                             " --seed " + std::to_string(q.seed) +
                                             " --budget-evals 6 --final-top 2 --final-rounds 1 --warm-start 0");
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  auto r = attntune::testing::run_attntune("serve --db " + db + " --gpus 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("3 campaigns done, queue empty; GPU worker processes started: 1"), std::string::npos) << r.err;

  const sqlite::Connection conn = sqlite::Connection::open(db, SQLITE_OPEN_READONLY);
  sqlite::Statement st(conn,
                       "SELECT c.name, c.status, SUM(e.status = 'ok'), SUM(e.status NOT IN ('ok', 'compile_error', "
                       "'resources')) FROM campaigns c JOIN evaluations e ON e.campaign_id = c.id GROUP BY c.id");
  int campaigns = 0;
  while (st.step()) {
    ++campaigns;
    EXPECT_EQ(st.text(1), "completed") << st.text(0);
    EXPECT_GE(st.int64(2), 2) << st.text(0);  // validated against its own problem's reference
    EXPECT_EQ(st.int64(3), 0) << st.text(0) << ": a candidate failed validation or crashed\n" << r.err;
  }
  EXPECT_EQ(campaigns, 3);
  fs::remove_all(dir);
}

}  // namespace test_serve_gpu
