// The compile pool with no GPU: real NVRTC compiles in `attntune build-worker` processes. A compile
// that really hangs (NVRTC opening a FIFO that no one writes blocks forever in open()) is killed
// at its timeout while the others finish; compile errors keep their log; dying or babbling build
// workers give compile_error with the reason; the store's cache serves repeated builds.
#include <sys/stat.h>

#include <chrono>
#include <map>

#include <gtest/gtest.h>

#include "core/hash.hpp"
#include "eval/build_pool.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace test_build_pool {
using namespace attntune;

namespace {

using Clock = std::chrono::steady_clock;

BuildJob job(const std::string& name, const std::string& source, const std::string& arch = "sm_89") {
  BuildJob j;
  j.config = {{"name", Value(name)}};
  j.kernel = {source, "k", content_hash(source)};
  j.arch = arch;
  return j;
}

std::string good_source(int n) {
  return "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = " + std::to_string(n) + ".f * x[threadIdx.x]; }\n";
}

BuildPoolOptions options(int jobs, std::chrono::milliseconds timeout, Store* store = nullptr) {
  BuildPoolOptions o;
  o.jobs = jobs;
  o.compile_timeout = timeout;
  o.worker_argv = {ATTNTUNE_BIN, "build-worker"};
  o.store = store;
  return o;
}

std::string name_of(const BuildOutcome& o) { return std::get<std::string>(o.job.config.at("name")); }

}  // namespace

TEST(BuildPool, HangingCompileTimesOutWhileOthersFinish) {
  test::TempDir dir;
  const std::string fifo = dir.file("never-written.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  BuildPool pool(options(2, std::chrono::milliseconds(4000)));
  const auto t0 = Clock::now();
  pool.submit(job("hang", "#include \"" + fifo + "\"\n" + good_source(0)));
  for (int i = 1; i <= 4; ++i) pool.submit(job("good" + std::to_string(i), good_source(i)));
  std::vector<std::string> order;
  std::map<std::string, BuildOutcome> by_name;
  double hang_s = 0;
  while (auto o = pool.next()) {
    order.push_back(name_of(*o));
    if (name_of(*o) == "hang") hang_s = std::chrono::duration<double>(Clock::now() - t0).count();
    by_name.emplace(name_of(*o), std::move(*o));
  }
  ASSERT_EQ(order.size(), 5u);
  EXPECT_EQ(order.back(), "hang") << "the good builds must not wait for the hanging one";
  EXPECT_EQ(by_name["hang"].build.status, "compile_timeout");
  EXPECT_NE(by_name["hang"].build.log.find("did not finish within 4 s"), std::string::npos) << by_name["hang"].build.log;
  EXPECT_TRUE(by_name["hang"].build.cubin.empty());
  EXPECT_GE(hang_s, 3.9);
  EXPECT_LT(hang_s, 4.0 + 5.0);
  for (int i = 1; i <= 4; ++i) {
    const BuildOutcome& o = by_name["good" + std::to_string(i)];
    EXPECT_EQ(o.build.status, "ok") << o.build.log;
    EXPECT_FALSE(o.build.cubin.empty());
    EXPECT_FALSE(o.cache_hit);
  }
  EXPECT_EQ(pool.outstanding(), 0u);
  EXPECT_FALSE(pool.next());
}

TEST(BuildPool, CompileErrorKeepsItsLogAndTicketsMatch) {
  BuildPool pool(options(2, std::chrono::seconds(60)));
  const auto bad = pool.submit(job("bad", "extern \"C\" __global__ void k() { undeclared_thing = 1; }\n"));
  const auto good = pool.submit(job("good", good_source(7)));
  EXPECT_NE(bad, good);
  int seen = 0;
  while (auto o = pool.next()) {
    ++seen;
    if (o->ticket == bad) {
      EXPECT_EQ(name_of(*o), "bad");
      EXPECT_EQ(o->build.status, "compile_error");
      EXPECT_NE(o->build.log.find("undeclared_thing"), std::string::npos) << o->build.log;
    } else {
      EXPECT_EQ(o->ticket, good);
      EXPECT_EQ(o->build.status, "ok") << o->build.log;
      EXPECT_GT(o->build.registers, 0);
    }
  }
  EXPECT_EQ(seen, 2);
}

TEST(BuildPool, CacheServesRepeatsButNotTimeouts) {
  test::TempDir dir;
  Store store = Store::open(dir.file("cache.db"), Store::Mode::kCreate);
  const BuildJob good = job("good", good_source(3)), bad = job("bad", "this is not CUDA\n");
  {
    BuildPool pool(options(2, std::chrono::seconds(60), &store));
    pool.submit(good);
    pool.submit(bad);
    while (auto o = pool.next()) EXPECT_FALSE(o->cache_hit);
  }
  std::string first_cubin;
  {
    BuildPool pool(options(2, std::chrono::seconds(60), &store));
    pool.submit(good);
    pool.submit(bad);
    // Cache hits are ready at once, before any build worker could answer.
    const auto t0 = Clock::now();
    while (auto o = pool.next()) {
      EXPECT_TRUE(o->cache_hit) << name_of(*o);
      EXPECT_EQ(o->build.status, name_of(*o) == "good" ? "ok" : "compile_error");
      if (name_of(*o) == "good") first_cubin = o->build.cubin;
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
    EXPECT_EQ(pool.waited_seconds(), 0.0);
  }
  EXPECT_FALSE(first_cubin.empty());
  // Another arch is another cache key.
  {
    BuildPool pool(options(1, std::chrono::seconds(60), &store));
    pool.submit(job("good", good_source(3), "sm_90"));
    auto o = pool.next();
    ASSERT_TRUE(o);
    EXPECT_FALSE(o->cache_hit);
    EXPECT_EQ(o->build.status, "ok");
    EXPECT_GT(pool.waited_seconds(), 0.0);
  }
  // A recorded timeout is compiled again (it may have been a loaded machine), and is never cached.
  const std::vector<std::string> opts;
  BuildRecord timeout;
  timeout.status = "compile_timeout";
  timeout.log = "NVRTC did not finish";
  const BuildJob other = job("other", good_source(11));
  store.put_build(build_key(other.kernel, other.arch, opts), timeout);
  {
    BuildPool pool(options(1, std::chrono::seconds(60), &store));
    pool.submit(other);
    auto o = pool.next();
    ASSERT_TRUE(o);
    EXPECT_FALSE(o->cache_hit);
    EXPECT_EQ(o->build.status, "ok");
  }
  EXPECT_EQ(store.find_build(build_key(other.kernel, other.arch, opts))->status, "ok");
}

// The pool needs of the store only a BuildCache (core/record_stores.hpp): one held in memory serves
// hits without a build worker, and takes fresh results but never timeouts.
namespace {
class MemoryCache : public BuildCache {
 public:
  static std::string str(const BuildKey& k) { return k.source_hash + "|" + k.arch + "|" + k.nvrtc_version + "|" + k.options; }
  std::optional<BuildRecord> find_build(const BuildKey& key) override {
    ++finds;
    auto it = builds.find(str(key));
    if (it == builds.end()) return std::nullopt;
    return it->second;
  }
  void put_build(const BuildKey& key, const BuildRecord& build) override {
    ++puts;
    builds[str(key)] = build;
  }
  std::map<std::string, BuildRecord> builds;
  int finds = 0, puts = 0;
};
}  // namespace

TEST(BuildPool, AnyBuildCacheServesThePool) {
  MemoryCache cache;
  const BuildJob good = job("good", good_source(5));
  const std::string key = MemoryCache::str(build_key(good.kernel, good.arch, {}));
  BuildPoolOptions o = options(1, std::chrono::seconds(60));
  o.store = &cache;
  {
    BuildPool pool(o);
    pool.submit(good);
    auto r = pool.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->build.status, "ok") << r->build.log;
    EXPECT_FALSE(r->cache_hit);
  }
  EXPECT_EQ(cache.finds, 1);
  EXPECT_EQ(cache.puts, 1);
  ASSERT_TRUE(cache.builds.count(key));
  EXPECT_EQ(cache.builds[key].status, "ok");

  // What the cache holds is the answer, as it is, with no build worker at all.
  BuildRecord planted;
  planted.status = "ok";
  planted.cubin = "planted cubin";
  cache.builds[key] = planted;
  BuildPoolOptions no_worker = o;
  no_worker.worker_argv = {"/nonexistent/attntune"};
  {
    BuildPool pool(no_worker);
    pool.submit(good);
    auto r = pool.next();
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->cache_hit);
    EXPECT_EQ(r->build.cubin, "planted cubin");
  }
  EXPECT_EQ(cache.puts, 1) << "a hit is not written back";

  // A timeout is never cached.
  test::TempDir dir;
  const std::string fifo = dir.file("never-written.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  BuildPoolOptions quick = o;
  quick.compile_timeout = std::chrono::milliseconds(1500);
  {
    BuildPool pool(quick);
    pool.submit(job("hang", "#include \"" + fifo + "\"\n" + good_source(0)));
    auto r = pool.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->build.status, "compile_timeout");
  }
  EXPECT_EQ(cache.puts, 1);
}

TEST(BuildPool, DyingOrBabblingBuildWorkersGiveCompileErrors) {
  {
    BuildPoolOptions o = options(1, std::chrono::seconds(30));
    o.worker_argv = {"/bin/sh", "-c", "kill -SEGV $$"};
    BuildPool pool(o);
    pool.submit(job("x", good_source(1)));
    auto r = pool.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->build.status, "compile_error");
    EXPECT_NE(r->build.log.find("died while compiling (killed by signal 11"), std::string::npos) << r->build.log;
  }
  {
    BuildPoolOptions o = options(1, std::chrono::seconds(30));
    o.worker_argv = {"/bin/sh", "-c", "cat >/dev/null; echo 'Segmentation fault (core dumped)'"};
    BuildPool pool(o);
    pool.submit(job("x", good_source(1)));
    auto r = pool.next();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->build.status, "compile_error");
    EXPECT_NE(r->build.log.find("malformed reply"), std::string::npos) << r->build.log;
    EXPECT_NE(r->build.log.find("expected magic"), std::string::npos) << r->build.log;
  }
  {
    // A build worker that cannot be started stops the pool: next() says why.
    BuildPoolOptions o = options(1, std::chrono::seconds(30));
    o.worker_argv = {"/nonexistent/attntune"};
    BuildPool pool(o);
    pool.submit(job("x", good_source(1)));
    EXPECT_THROW(pool.next(), Error);
  }
}

TEST(BuildPool, DestroyingThePoolKillsRunningCompiles) {
  test::TempDir dir;
  const std::string fifo = dir.file("f.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = Clock::now();
  {
    BuildPool pool(options(2, std::chrono::minutes(10)));
    pool.submit(job("hang1", "#include \"" + fifo + "\"\n"));
    pool.submit(job("hang2", "#include \"" + fifo + "\"\n" + good_source(2)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
}
}  // namespace test_build_pool
