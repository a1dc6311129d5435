// The service's queue and leases in the Store (db/store_queue.cpp): idempotent submits, claims in
// order and never twice, stale leases taken back, the write fence, tune's lease; and the commands
// `submit` and `status` on them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "service/job.hpp"
#include "service/lease.hpp"
#include "tests/common/run_attntune.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace attntune {
namespace test_queue {
namespace {

using test::TempDir;

QueuedJob job(const std::string& spec) {
  QueuedJob j;
  j.problem = Problem::parse(spec);
  j.request.spaces = service::default_spaces(j.problem);
  j.request.budget_evals = 10;
  j.campaign = service::default_campaign_name(j.request.spaces, j.problem);
  return j;
}

LeaseOwner owner(int pid, const std::string& host = "host-a") { return {host, pid, "1", 0}; }

const auto never_stale = [](const LeaseRow&, double) { return false; };
const auto expired = [](const LeaseRow& l, double now) { return l.expires < now; };

TEST(ServiceQueue, SubmitIsIdempotentAndKeepsTheRequest) {
  TempDir dir;
  Store s = Store::open(dir.file("q.db"), Store::Mode::kCreate);
  const QueuedJob j = job("b=2,h=8,s=512,d=64,dtype=bf16,causal=1");
  EXPECT_EQ(s.submit_job(j).first, Store::Submitted::kQueued);
  const auto again = s.submit_job(j);
  EXPECT_EQ(again.first, Store::Submitted::kExisting);
  EXPECT_EQ(again.second, "queued");
  const auto rows = s.queue_status();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].job.campaign, j.campaign);
  EXPECT_EQ(rows[0].job.problem, j.problem);
  EXPECT_EQ(rows[0].job.request.budget_evals, 10);
  ASSERT_EQ(rows[0].job.request.spaces.size(), j.request.spaces.size());
  EXPECT_EQ(rows[0].job.request.spaces[0].text, j.request.spaces[0].text);
}

// The screening's size travels with the request; a request queued before it existed (no
// "final_screen" in its JSON) runs without one, as it was submitted.
TEST(ServiceQueue, TheScreeningTravelsWithTheRequestAndOldRequestsRunWithoutIt) {
  JobRequest r = job("b=2,h=8,s=512,d=64,dtype=bf16,causal=1").request;
  EXPECT_EQ(r.final_screen, 24);
  r.final_screen = 40;
  EXPECT_EQ(job_request_from_json(job_request_json(r)).final_screen, 40);
  nlohmann::json old = nlohmann::json::parse(job_request_json(r));
  old.erase("final_screen");
  const JobRequest before = job_request_from_json(old.dump());
  EXPECT_EQ(before.final_screen, 0);
  EXPECT_EQ(before.final_top, r.final_top);
  EXPECT_EQ(service::tune_options(before, 100).final_screen, 0);
  EXPECT_EQ(service::tune_options(r, 100).final_screen, 40);
}

TEST(ServiceQueue, DefaultSpacesAreTheTemplatesThatServeTheProblem) {
  auto families = [](const std::string& spec) {
    std::vector<std::string> out;
    for (const CampaignSpace& s : service::default_spaces(Problem::parse(spec))) out.push_back(s.family);
    return out;
  };
  EXPECT_EQ(families("b=4,h=16,s=4096,d=128,dtype=bf16,causal=1"),
            (std::vector<std::string>{"flash_fwd_mma", "flash_fwd_wgmma"}));
  const auto decode = families("b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1");
  EXPECT_NE(std::find(decode.begin(), decode.end(), "flash_decode"), decode.end());
  EXPECT_EQ(families("b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16"),
            (std::vector<std::string>{"flash_decode"}));
  // Chunked prefill over pages: the prefill families.
  EXPECT_EQ(families("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=64"),
            (std::vector<std::string>{"flash_fwd_mma", "flash_fwd_wgmma"}));
  // ... but pages of an odd size only flash_fwd_mma (flash_fwd_wgmma's TMA boxes take 8 rows).
  EXPECT_EQ(families("b=4,h=32,hkv=8,s=2048,sk=10240,d=128,dtype=bf16,causal=1,page=12"),
            (std::vector<std::string>{"flash_fwd_mma"}));
  // A head dim no template builds: the error says which templates and why not.
  try {
    service::default_spaces(Problem::parse("b=4,h=32,hkv=8,s=2048,sk=10240,d=88,dtype=bf16,causal=1"));
    ADD_FAILURE() << "d=88 has no template";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no template serves"), std::string::npos) << e.what();
  }
}

TEST(ServiceQueue, ClaimsGoInOrderAndNeverToTwoOwners) {
  TempDir dir;
  Store s = Store::open(dir.file("q.db"), Store::Mode::kCreate);
  const QueuedJob a = job("b=1,h=8,s=512,d=64,dtype=bf16,causal=1"), b = job("b=2,h=8,s=512,d=64,dtype=bf16,causal=1");
  s.submit_job(a);
  s.submit_job(b);
  const auto first = s.claim_job(owner(10), 1000, 30, never_stale);
  const auto second = s.claim_job(owner(11), 1000, 30, never_stale);
  const auto third = s.claim_job(owner(12), 1000, 30, never_stale);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->campaign, a.campaign);
  EXPECT_EQ(second->campaign, b.campaign);
  EXPECT_FALSE(third) << "nothing is left to claim";
  EXPECT_EQ(s.leases().size(), 2u);
  // The heartbeat renews only its own lease.
  EXPECT_TRUE(s.renew_lease(a.campaign, owner(10).id(), 2000));
  EXPECT_FALSE(s.renew_lease(a.campaign, owner(11).id(), 2000));
  // Release: done, and the lease is gone; a release by someone else changes nothing.
  EXPECT_FALSE(s.release_job(b.campaign, owner(10).id(), "done", ""));
  EXPECT_TRUE(s.release_job(b.campaign, owner(11).id(), "done", "budget"));
  const auto rows = s.queue_status();
  EXPECT_EQ(rows[0].job.state, "running");
  EXPECT_EQ(rows[1].job.state, "done");
  EXPECT_FALSE(rows[1].job.ended_at.empty());
}

TEST(ServiceQueue, AStaleLeaseIsTakenBackAndItsJobClaimedAgain) {
  TempDir dir;
  Store s = Store::open(dir.file("q.db"), Store::Mode::kCreate);
  const QueuedJob a = job("b=1,h=8,s=512,d=64,dtype=bf16,causal=1");
  s.submit_job(a);
  ASSERT_TRUE(s.claim_job(owner(10), 1000, 30, expired));
  EXPECT_FALSE(s.claim_job(owner(11), 1020, 30, expired)) << "the lease still runs until 1030";
  const auto again = s.claim_job(owner(11), 1031, 30, expired);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->campaign, a.campaign);
  EXPECT_EQ(again->attempts, 2);
  EXPECT_NE(again->error.find("taken back from"), std::string::npos) << again->error;
  // The old owner's heartbeat and release now fail: the campaign is the new owner's.
  EXPECT_FALSE(s.renew_lease(a.campaign, owner(10).id(), 5000));
  EXPECT_FALSE(s.release_job(a.campaign, owner(10).id(), "failed", "late"));
  EXPECT_EQ(s.queue_status()[0].job.state, "running");
}

TEST(ServiceQueue, LeaseIsStaleWhenItsProcessHereIsGone) {
  LeaseRow l;
  l.host = service::host_name();
  l.expires = service::unix_now() + 100;
  const LeaseOwner me = service::this_process();
  l.pid = me.pid;
  l.owner = me.id();
  EXPECT_FALSE(service::lease_is_stale(l, service::unix_now()));
  l.owner = me.host + ":" + std::to_string(me.pid) + ":1";  // the same pid, another start: a reused pid
  EXPECT_TRUE(service::lease_is_stale(l, service::unix_now()));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int st = 0;
  ::waitpid(child, &st, 0);
  l.pid = child;
  l.owner = me.host + ":" + std::to_string(child) + ":";
  EXPECT_TRUE(service::lease_is_stale(l, service::unix_now())) << "the process has ended";
  l.host = "another-host";
  EXPECT_FALSE(service::lease_is_stale(l, service::unix_now())) << "elsewhere only expiry counts";
  EXPECT_TRUE(service::lease_is_stale(l, l.expires + 1));
}

TEST(ServiceQueue, FencedWritesFailWithoutTheLeaseAndWriteNothing) {
  TempDir dir;
  Store s = Store::open(dir.file("q.db"), Store::Mode::kCreate);
  const std::int64_t dev = s.upsert_device(test::h100());
  const CampaignSpec spec = test::spec("fenced");
  s.acquire_lease("fenced", owner(10), 1000, 30, never_stale);
  s.fence_writes(owner(10).id());
  const std::int64_t id = s.open_campaign(spec, dev);
  const std::int64_t cand = s.upsert_candidate(spec.family, test::config(64, 64), "h1");
  s.record_evaluation(id, cand, dev, test::ok_eval(10));
  // Another process takes the campaign over (the lease expired).
  s.acquire_lease("fenced", owner(11), 2000, 30, expired);
  EXPECT_THROW(s.record_evaluation(id, cand, dev, test::ok_eval(9)), LeaseLost);
  EXPECT_THROW(s.put_ranking(id, dev, {}), LeaseLost);
  EXPECT_THROW(s.finish_campaign(id, "completed", "x"), LeaseLost);
  EXPECT_EQ(s.campaign_evaluations(id).size(), 1u);
  s.fence_writes("");
  EXPECT_EQ(s.campaign_row("fenced")->status, "running") << "the new owner's campaign is untouched";
}

TEST(ServiceQueue, TuneLeaseIsRefusedWhileAnotherHoldsItAndNamesTheHolder) {
  TempDir dir;
  Store s = Store::open(dir.file("q.db"), Store::Mode::kCreate);
  s.acquire_lease("c", owner(10), 1000, 30, never_stale);
  try {
    s.acquire_lease("c", owner(11), 1001, 30, never_stale);
    ADD_FAILURE() << "two writers of one campaign";
  } catch (const EnvError& e) {
    EXPECT_NE(std::string(e.what()).find("pid 10 on host-a"), std::string::npos) << e.what();
  }
  s.release_lease("c", owner(10).id());
  EXPECT_NO_THROW(s.acquire_lease("c", owner(11), 1002, 30, never_stale));
}

TEST(ServiceCli, SubmitQueuesOnceAndStatusCountsIt) {
  TempDir dir;
  const std::string db = dir.file("q.db");
  using testing::run_attntune;
  const auto first = run_attntune("submit --db " + db +
                                  " --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1 --problem "
                                  "b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16 --budget-evals 20");
  ASSERT_EQ(first.rc, 0) << first.err;
  EXPECT_NE(first.err.find("2 campaigns queued, 0 already"), std::string::npos) << first.err;
  const auto second = run_attntune("submit --db " + db + " --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1");
  ASSERT_EQ(second.rc, 0) << second.err;
  EXPECT_NE(second.out.find("already queued"), std::string::npos) << second.out;
  const auto status = run_attntune("status --db " + db + " --format json");
  ASSERT_EQ(status.rc, 0) << status.err;
  const auto j = nlohmann::json::parse(status.out);
  EXPECT_EQ(j["counts"]["queued"], 2);
  EXPECT_EQ(j["counts"]["done"], 0);
  ASSERT_EQ(j["campaigns"].size(), 2u);
  EXPECT_EQ(j["campaigns"][1]["campaign"], "flash_decode:b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16");
  EXPECT_EQ(j["campaigns"][1]["budget_evals"], 20);
}

// --name-suffix: the same problems queued again under other names, beside the first ones (one plan
// tuned on a second GPU model into the same database: a campaign stays with the model that started
// it); idempotent under its own names; a suffix that is not a plain word is refused.
TEST(ServiceCli, SubmitWithANameSuffixQueuesTheSameProblemsUnderOtherNames) {
  TempDir dir;
  const std::string db = dir.file("q.db");
  using testing::run_attntune;
  const std::string problem = " --problem b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16";
  const std::string name = "flash_decode:b=16,h=32,hkv=8,s=1,sk=4096,d=128,dtype=bf16,causal=1,page=16";
  ASSERT_EQ(run_attntune("submit --db " + db + problem).rc, 0);
  const auto suffixed = run_attntune("submit --db " + db + problem + " --name-suffix @h100 --format json");
  ASSERT_EQ(suffixed.rc, 0) << suffixed.err;
  EXPECT_EQ(nlohmann::json::parse(suffixed.out)[0]["campaign"], name + "@h100");
  EXPECT_NE(suffixed.err.find("1 campaign queued, 0 already"), std::string::npos) << suffixed.err;
  const auto again = run_attntune("submit --db " + db + problem + " --name-suffix @h100");
  EXPECT_NE(again.err.find("0 campaigns queued, 1 already"), std::string::npos) << again.err;
  const auto status = run_attntune("status --db " + db + " --format json");
  const auto j = nlohmann::json::parse(status.out);
  ASSERT_EQ(j["campaigns"].size(), 2u);
  EXPECT_EQ(j["campaigns"][0]["campaign"], name);
  EXPECT_EQ(j["campaigns"][1]["campaign"], name + "@h100");
  const std::string before = test::read_bytes(db);
  for (const std::string& bad : {std::string("'@h 100'"), std::string("@x@stale"), std::string(65, 'x')}) {
    const auto r = run_attntune("submit --db " + db + problem + " --name-suffix " + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("--name-suffix"), std::string::npos) << r.err;
  }
  EXPECT_EQ(test::read_bytes(db), before);
}

// A plan's varlen regime (packed prefill batches) is queued and shown as it is: the queue's regime
// column is free text (db/schema.sql: no CHECK), so no schema change is needed.
TEST(ServiceCli, SubmitKeepsAPlansVarlenRegime) {
  TempDir dir;
  const std::string db = dir.file("q.db"), plan = dir.file("plan.yaml");
  using testing::run_attntune;
  const auto made = run_attntune("plan --model " + testing::source_dir() + "/tests/data/models/llama3_8b.json" +
                                 " --regimes prefill,varlen --batch 2 --seqlen 1024 -o " + plan);
  ASSERT_EQ(made.rc, 0) << made.err;
  const auto sub = run_attntune("submit --db " + db + " " + plan + " --budget-evals 5");
  ASSERT_EQ(sub.rc, 0) << sub.err;
  EXPECT_NE(sub.err.find("2 campaigns queued, 0 already"), std::string::npos) << sub.err;
  const auto status = run_attntune("status --db " + db + " --format json");
  ASSERT_EQ(status.rc, 0) << status.err;
  const auto j = nlohmann::json::parse(status.out);
  ASSERT_EQ(j["campaigns"].size(), 2u);
  EXPECT_EQ(j["campaigns"][0]["regime"], "prefill");
  EXPECT_EQ(j["campaigns"][1]["regime"], "varlen");
  EXPECT_EQ(Problem::from_json(j["campaigns"][1]["problem"]).str(),
            "b=2,h=32,hkv=8,s=1024,sk=1024,d=128,dtype=bf16,causal=1,varlen=64");
}

TEST(ServiceCli, BadInputIsOneLineAndLeavesTheDatabaseAlone) {
  TempDir dir;
  const std::string db = dir.file("q.db");
  using testing::run_attntune;
  ASSERT_EQ(run_attntune("submit --db " + db + " --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1").rc, 0);
  const std::string before = test::read_bytes(db);
  for (const std::string& args : std::vector<std::string>{
           " --problem b=4,h=32,hkv=8,s=2048,sk=10240,d=88,dtype=bf16,causal=1,page=64",  // nothing serves d=88 (no multiple of 16)
        " --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1 --budget-evals -1",
        " --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1 --max-seconds nan",
        " --problem b=1,h=8,s=512,d=64,dtype=bf16,causal=1 --shard 3/2",
        " --problem b=1,h=8,s=512,d=64,dtype=bf16",  // no causal
        " " + dir.file("missing-plan.yaml")}) {
    const auto r = run_attntune("submit --db " + db + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    EXPECT_EQ(testing::lines(r.err).size(), 1u) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("attntune: error: ", 0), 0u) << r.err;
  }
  EXPECT_EQ(test::read_bytes(db), before);
  for (const std::string args : {" --gpus 0,x --simulate", " --gpus 0 --simulate --lease-seconds inf"}) {
    const auto r = run_attntune("serve --db " + db + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace test_queue
}  // namespace attntune

namespace attntune {
namespace test_queue {
namespace {

// Results are per GPU model: an H200's time never ranks against an H100's (issue 30).
TEST(ServiceResults, BestRanksOneGpuModelAndSaysWhenResultsSpanSeveral) {
  TempDir dir;
  const std::string path = dir.file("two-models.db");
  {
    Store s = Store::open(path, Store::Mode::kCreate);
    const std::int64_t h100 = s.upsert_device(test::h100());
    const std::int64_t h200 = s.upsert_device({"NVIDIA H200", "sm_90", "GPU-2222", 132, "550.54"});
    const CampaignSpec a = test::spec("on-h100"), b = test::spec("on-h200");
    const std::int64_t ia = s.open_campaign(a, h100), ib = s.open_campaign(b, h200);
    s.record_evaluation(ia, s.upsert_candidate(a.family, test::config(64, 64), "h1"), h100, test::ok_eval(20));
    s.record_evaluation(ib, s.upsert_candidate(b.family, test::config(128, 64), "h2"), h200, test::ok_eval(10));
    // A resume on the other model is refused: its times would join the first model's.
    EXPECT_THROW(s.open_campaign(a, h200), InputError);
    BestQuery q;
    q.problem = test::problem();
    EXPECT_EQ(s.result_gpus(q), (std::vector<std::string>{"NVIDIA H100 80GB HBM3", "NVIDIA H200"}));
    q.gpu = "NVIDIA H100 80GB HBM3";
    const auto rows = s.best(q);
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].campaign, "on-h100");
    EXPECT_EQ(rows[0].median_us, 20);
  }
  using testing::run_attntune;
  const std::string spec = test::problem().str();
  const auto mixed = run_attntune("best --db " + path + " --problem " + spec);
  EXPECT_EQ(mixed.rc, 2) << mixed.err;
  EXPECT_NE(mixed.err.find("several GPU models"), std::string::npos) << mixed.err;
  const auto one = run_attntune("best --db " + path + " --problem " + spec + " --gpu 'NVIDIA H200' --format json");
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(nlohmann::json::parse(one.out)[0]["campaign"], "on-h200");
  const auto exp = run_attntune("export --db " + path + " --problem " + spec + " -o " + dir.file("x.cu"));
  EXPECT_EQ(exp.rc, 2) << exp.err;
  EXPECT_NE(exp.err.find("pass --gpu"), std::string::npos) << exp.err;
}

}  // namespace
}  // namespace test_queue
}  // namespace attntune
