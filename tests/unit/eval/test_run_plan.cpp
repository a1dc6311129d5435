// The one plan executor (templates/common/run_plan.h) over a fake CUDA API that logs every call and
// behaves as CUDA does where the policy depends on it (allocation is refused on a capturing thread
// unless it is in relaxed mode; a kernel's dynamic shared memory is bounded by the device's opt-in
// limit). What the worker's driver adapter and the export's runtime adapter both rely on: the bind
// and launch order, empty grids skipped, opt-ins and occupancy asked once, workspaces grown and
// zeroed once per (build, device, stream), the capture policy, and errors passed on with nothing
// launched after them.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "templates/common/launch_plan.h"
#include "templates/common/run_plan.h"

namespace test_run_plan {
using namespace attntune_plan;

namespace {

constexpr int kFakeError = 7;  // what the fake API answers for a call told to fail

// A CUDA API that logs its calls. Function: a kernel's index; Stream: a number.
struct FakeApi {
  typedef int Function;
  typedef int Stream;

  std::vector<std::string> log;
  std::string fail;  // the call (as logged, up to its first space) that answers kFakeError
  int device = 0, sms = 132;
  long long optin = 227 * 1024, static_smem = 0;
  int clusters = 5;
  bool capturing = false;  // the thread captures a stream: allocation needs relaxed mode
  int mode = 0;            // 0 global, 1 relaxed
  unsigned long long next = 0x1000;
  std::vector<void*> allocated, released;

  int call(const std::string& line, Why* why) {
    log.push_back(line);
    if (!fail.empty() && line.rfind(fail, 0) == 0) {
      std::snprintf(why->text, sizeof why->text, "%s failed", line.c_str());
      return kFakeError;
    }
    return 0;
  }
  int current_device(int* d, Why* why) {
    *d = device;
    return call("current_device", why);
  }
  int sm_count(int d, int* out, Why* why) {
    *out = sms;
    return call(fmt::format("sm_count {}", d), why);
  }
  int smem_limits(int d, Function f, long long* o, long long* s, Why* why) {
    *o = optin;
    *s = static_smem;
    return call(fmt::format("smem_limits {} k{}", d, f), why);
  }
  int set_max_dynamic_smem(Function f, unsigned bytes, Why* why) {
    return call(fmt::format("set_max_dynamic_smem k{} {}", f, bytes), why);
  }
  int allow_nonportable_cluster(Function f, Why* why) { return call(fmt::format("allow_nonportable k{}", f), why); }
  int max_active_clusters(Function f, unsigned grid_x, unsigned block, unsigned smem) {
    log.push_back(fmt::format("max_active_clusters k{} {} {} {}", f, grid_x, block, smem));
    return clusters;
  }
  int encode_map(const TensorMap& m, void* out, Why* why) {
    std::memset(out, 0, kTensorMapBytes);
    std::memcpy(out, &m.base, sizeof m.base);  // the map "holds" its base
    return call(fmt::format("encode {}", m.name), why);
  }
  int relax_capture(int* saved, Why* why) {
    *saved = mode;
    mode = 1;
    return call("relax_capture", why);
  }
  void restore_capture(int saved) {
    log.push_back(fmt::format("restore_capture {}", saved));
    mode = saved;
  }
  int allocate(unsigned long long bytes, void** out, Why* why) {
    if (const int r = call(fmt::format("allocate {}", bytes), why)) return r;
    if (capturing && mode != 1) {
      std::snprintf(why->text, sizeof why->text, "operation not permitted when stream is capturing");
      return 900;
    }
    *out = reinterpret_cast<void*>(next);
    next += 0x1000;
    allocated.push_back(*out);
    return 0;
  }
  void release(void* p) {
    log.push_back("release");
    released.push_back(p);
  }
  int zero(void* p, unsigned long long bytes, Why* why) {
    return call(fmt::format("zero {} {}", p == allocated.back() ? "new" : "old", bytes), why);
  }
  int launch(Function f, const Launch& l, void**, Stream stream, Why* why) {
    return call(fmt::format("launch k{} ({},{},{}) s{}", f, l.grid[0], l.grid[1], l.grid[2], stream), why);
  }
};

// A family whose plan is whatever the test puts in its constants, and whose bind logs what it was
// given (to the API's log: one order of events).
struct Scenario {
  Plan planned;
  int refuse_plan = 0, refuse_bind = -1;  // refuse_bind: the launch whose bind refuses
  int ask_clusters = 0;                   // plan asks how many clusters of kernel 1 fit
  mutable int clusters_seen = -1, sms_seen = -1;
  mutable std::vector<std::string>* log = nullptr;
  mutable const void* workspace_seen[kMaxWorkspaces] = {};

  int plan(const Call&, const Device& device, Plan* out, Why* why) const {
    sms_seen = device.sm_count;
    if (ask_clusters) clusters_seen = device.clusters(1, 64, 16, 256, 100 * 1024);
    if (refuse_plan) return refuse(why, "the fake family refuses the call");
    *out = planned;
    return 0;
  }
  int bind(const Call&, const Plan& p, const Resources& res, int launch, Args* args, Why* why) const {
    std::string ws;
    for (int i = 0; i < p.workspaces; ++i) {
      workspace_seen[i] = res.workspace[i];
      ws += res.workspace[i] ? fmt::format(" w{}={}", i, res.workspace[i]) : fmt::format(" w{}=null", i);
    }
    for (int i = 0; i < p.maps; ++i) {
      const void* base = nullptr;
      if (res.map[i]) std::memcpy(&base, res.map[i], sizeof base);
      ws += res.map[i] ? fmt::format(" m{}={}", i, base) : fmt::format(" m{}=none", i);
    }
    if (log) log->push_back(fmt::format("bind {}{}", launch, ws));
    if (launch == refuse_bind) return refuse(why, "the fake family cannot bind launch %d", launch);
    return args->add(launch) ? 0 : 1;
  }
};

// A build of the fake family: its constants (the executor's owner of workspaces) point at a scenario.
struct Build {
  Scenario* s;
  static int load(const Define*, int, Build*, Why*) { return 0; }
  int plan(const Call& call, const Device& device, Plan* out, Why* why) const { return s->plan(call, device, out, why); }
  int bind(const Call& call, const Plan& p, const Resources& res, int launch, Args* args, Why* why) const {
    return s->bind(call, p, res, launch, args, why);
  }
};

const LaunchFamily kFake = make_family<Build>("fake", kEntryDense, 2, "k0", "k1");

using Exec = Executor<FakeApi, 8, 4>;

Launch launch_of(int kernel, unsigned x, unsigned smem = 0, unsigned cluster = 1) {
  return Launch{kernel, {x, 2, 1}, 128, smem, cluster};
}

struct RunPlan : ::testing::Test {
  std::unique_ptr<Exec> exec = std::make_unique<Exec>();
  Scenario s;
  Build build{&s};
  const int funcs[2] = {0, 1};
  Call call = empty_call();
  Why why{};

  void SetUp() override {
    s.planned = empty_plan();
    s.log = &api().log;
  }
  FakeApi& api() { return exec->api(); }
  int run(int stream = 1, const Build* consts = nullptr, RunOptions options = RunOptions()) {
    return exec->run(kFake, consts ? consts : &build, funcs, call, stream, &why, options);
  }
  // The log since the last take, without the planning calls every run makes.
  std::vector<std::string> take() {
    std::vector<std::string> out;
    for (const std::string& l : api().log)
      if (l != "current_device") out.push_back(l);
    api().log.clear();
    return out;
  }
};

using Log = std::vector<std::string>;

TEST_F(RunPlan, LaunchesInOrderBindingEachJustBeforeIt) {
  s.planned.launches = 3;
  s.planned.launch[0] = launch_of(0, 4);
  s.planned.launch[1] = launch_of(1, 1);
  s.planned.launch[2] = launch_of(0, 9);
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "bind 0", "launch k0 (4,2,1) s1", "bind 1", "launch k1 (1,2,1) s1", "bind 2",
                         "launch k0 (9,2,1) s1"}));
  EXPECT_EQ(s.sms_seen, 132);
}

TEST_F(RunPlan, SkipsEmptyGridsWithoutBindingThem) {
  s.planned.launches = 3;
  s.planned.launch[0] = launch_of(0, 0);  // no query blocks
  s.planned.launch[1] = launch_of(1, 3);
  s.planned.launch[2] = launch_of(0, 5);
  s.planned.launch[2].grid[2] = 0;
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "bind 1", "launch k1 (3,2,1) s1"}));
}

TEST_F(RunPlan, AsksTheSmCountOncePerDevice) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  ASSERT_EQ(run(), 0);
  ASSERT_EQ(run(), 0);
  api().device = 3;
  ASSERT_EQ(run(), 0);
  int asked = 0;
  for (const std::string& l : take()) asked += l.rfind("sm_count", 0) == 0;
  EXPECT_EQ(asked, 2);
}

TEST_F(RunPlan, OptsKernelsIntoSharedMemoryAndLargeClustersOncePerDevice) {
  s.planned.launches = 2;
  s.planned.launch[0] = launch_of(0, 1, 100 * 1024, 16);
  s.planned.launch[1] = launch_of(1, 1, 48 * 1024, 8);  // within the defaults: asked, nothing to allow
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "smem_limits 0 k0", "set_max_dynamic_smem k0 102400", "allow_nonportable k0",
                         "bind 0", "launch k0 (1,2,1) s1", "smem_limits 0 k1", "bind 1", "launch k1 (1,2,1) s1"}));
  ASSERT_EQ(run(2), 0);  // another stream: the same kernel on the same device
  EXPECT_EQ(take(), (Log{"bind 0", "launch k0 (1,2,1) s2", "bind 1", "launch k1 (1,2,1) s2"}));
  s.planned.launch[0].smem = 90 * 1024;  // less than allowed: nothing
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"bind 0", "launch k0 (1,2,1) s1", "bind 1", "launch k1 (1,2,1) s1"}));
  s.planned.launch[0].smem = 200 * 1024;  // more: raised again; the cluster opt-in stands
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"smem_limits 0 k0", "set_max_dynamic_smem k0 204800", "bind 0", "launch k0 (1,2,1) s1",
                         "bind 1", "launch k1 (1,2,1) s1"}));
  api().device = 1;  // another device: its own opt-ins
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"sm_count 1", "smem_limits 1 k0", "set_max_dynamic_smem k0 204800", "allow_nonportable k0",
                         "bind 0", "launch k0 (1,2,1) s1", "smem_limits 1 k1", "bind 1", "launch k1 (1,2,1) s1"}));
}

// 48 KiB is static and dynamic shared memory together: a launch of 48 KiB dynamic beside 1 KiB
// static opts in (without it the driver refused flash_decode's launch on an H100, 2026-12-06), one
// of 47 KiB does not, and the static bytes are asked once.
TEST_F(RunPlan, CountsStaticSharedMemoryAgainstTheDefaultAllowance) {
  api().static_smem = 1024;
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1, 47 * 1024);
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "smem_limits 0 k0", "bind 0", "launch k0 (1,2,1) s1"}));
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"bind 0", "launch k0 (1,2,1) s1"}));
  s.planned.launch[0].smem = 48 * 1024;
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"smem_limits 0 k0", "set_max_dynamic_smem k0 49152", "bind 0", "launch k0 (1,2,1) s1"}));
  s.planned.launch[0].smem = 0;  // static alone: never asked
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"bind 0", "launch k0 (1,2,1) s1"}));
}

TEST_F(RunPlan, RefusesSharedMemoryBeyondTheDevicesOptInLimit) {
  api().optin = 100 * 1024;
  api().static_smem = 8 * 1024;
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1, 96 * 1024);
  EXPECT_EQ(run(), kUnsupported);
  EXPECT_STREQ(why.text, "a kernel needs 106496 bytes of shared memory per block; device 0 allows 102400");
  for (const std::string& l : take()) EXPECT_EQ(l.find("launch"), std::string::npos) << l;
}

TEST_F(RunPlan, AsksClusterOccupancyOnceAfterAllowingTheKernelItsSharedMemoryAndClusterSize) {
  s.ask_clusters = 1;
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(1, 10, 100 * 1024, 16);
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(s.clusters_seen, 5);
  EXPECT_EQ(take(), (Log{"sm_count 0", "smem_limits 0 k1", "set_max_dynamic_smem k1 102400", "allow_nonportable k1",
                         "max_active_clusters k1 64 256 102400", "bind 0", "launch k1 (10,2,1) s1"}));
  api().clusters = 9;  // asked once: the cached answer stands
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(s.clusters_seen, 5);
  EXPECT_EQ(take(), (Log{"bind 0", "launch k1 (10,2,1) s1"}));
  // A plan can ask for what it has not launched yet; a device that cannot allow the memory
  // answers 0 (the launch then says why), and is asked again next time.
  exec = std::make_unique<Exec>();
  s.log = &api().log;
  api().optin = 64 * 1024;
  EXPECT_EQ(run(), kUnsupported);
  EXPECT_EQ(s.clusters_seen, 0);
}

TEST_F(RunPlan, GrowsWorkspacesByIndexAndZeroesAZeroedOneOnlyWhenItAllocatesIt) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 2;
  s.planned.workspace[0] = Workspace{100, 1, 0};
  s.planned.workspace[1] = Workspace{50, 0, 1};
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "relax_capture", "allocate 100", "zero new 100", "restore_capture 0",
                         "relax_capture", "allocate 50", "restore_capture 0", "bind 0 w0=0x1000 w1=0x2000",
                         "launch k0 (1,2,1) s1"}));
  s.planned.workspace[0].bytes = 80;  // smaller: the same workspaces, not zeroed again
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"bind 0 w0=0x1000 w1=0x2000", "launch k0 (1,2,1) s1"}));
  s.planned.workspace[0].bytes = 300;  // larger: a new zeroed one; the old one is kept, not freed
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(take(), (Log{"relax_capture", "allocate 300", "zero new 300", "restore_capture 0",
                         "bind 0 w0=0x3000 w1=0x2000", "launch k0 (1,2,1) s1"}));
  EXPECT_TRUE(api().released.empty());
}

TEST_F(RunPlan, KeepsAWorkspaceSetPerBuildDeviceAndStream) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{64, 1, 0};
  const Build other{&s};  // another build of the family: its own constants, its own workspaces
  ASSERT_EQ(run(1), 0);
  ASSERT_EQ(run(2), 0);
  ASSERT_EQ(run(1, &other), 0);
  api().device = 1;
  ASSERT_EQ(run(1), 0);
  ASSERT_EQ(run(1), 0);
  api().device = 0;
  ASSERT_EQ(run(2), 0);
  ASSERT_EQ(run(1, &other), 0);
  EXPECT_EQ(api().allocated.size(), 4u);
}

TEST_F(RunPlan, AllocatesInsideAStreamCaptureInRelaxedModeAndRestoresTheCallersMode) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{4096, 1, 0};
  api().capturing = true;  // a first call inside a capture (PyTorch's graphs)
  api().mode = 0;
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "relax_capture", "allocate 4096", "zero new 4096", "restore_capture 0",
                         "bind 0 w0=0x1000", "launch k0 (1,2,1) s1"}));
  EXPECT_EQ(api().mode, 0);  // the caller's mode again
}

TEST_F(RunPlan, ReleasesAWorkspaceItCouldNotZeroAndRestoresTheMode) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{4096, 1, 0};
  api().fail = "zero";
  EXPECT_EQ(run(), kFakeError);
  EXPECT_STREQ(why.text, "zero new 4096 failed");
  EXPECT_EQ(take(), (Log{"sm_count 0", "relax_capture", "allocate 4096", "zero new 4096", "release",
                         "restore_capture 0"}));
  ASSERT_EQ(api().released.size(), 1u);
  EXPECT_EQ(api().released[0], api().allocated[0]);
  api().fail.clear();  // the next call allocates again
  ASSERT_EQ(run(), 0);
  EXPECT_EQ(api().allocated.size(), 2u);
}

// An optional workspace that cannot be allocated is left out (the call runs without it, and so do the
// maps over it); a required one's failure is the call's error.
TEST_F(RunPlan, LeavesOutAnOptionalWorkspaceItCannotAllocate) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 2;
  s.planned.workspace[0] = Workspace{100, 1, 0};
  s.planned.workspace[1] = Workspace{1 << 20, 0, 1};
  s.planned.maps = 1;
  s.planned.map[0].name = "copy";
  s.planned.map[0].workspace = 2;
  api().fail = "allocate 1048576";
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "relax_capture", "allocate 100", "zero new 100", "restore_capture 0",
                         "relax_capture", "allocate 1048576", "restore_capture 0", "bind 0 w0=0x1000 w1=null m0=none",
                         "launch k0 (1,2,1) s1"}));
  api().fail.clear();  // the next call has it
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"relax_capture", "allocate 1048576", "restore_capture 0", "encode copy",
                         "bind 0 w0=0x1000 w1=0x2000 m0=0x2000", "launch k0 (1,2,1) s1"}));
  s.planned.workspace[1].optional = 0;
  s.planned.workspace[1].bytes = 2 << 20;
  api().fail = "allocate 2097152";
  EXPECT_EQ(run(), kFakeError);
  EXPECT_STREQ(why.text, "allocate 2097152 failed");
}

TEST_F(RunPlan, WithholdsOptionalWorkspacesOnRequest) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 2;
  s.planned.workspace[0] = Workspace{100, 1, 0};
  s.planned.workspace[1] = Workspace{50, 1, 1};
  RunOptions without;
  without.optional_workspaces = 0;
  ASSERT_EQ(run(1, nullptr, without), 0) << why.text;
  EXPECT_NE(s.workspace_seen[0], nullptr);
  EXPECT_EQ(s.workspace_seen[1], nullptr);
  ASSERT_EQ(run(), 0);  // then given, as usual
  EXPECT_NE(s.workspace_seen[1], nullptr);
}

TEST_F(RunPlan, AFullWorkspaceTableLeavesOptionalOnesOutAndRefusesRequiredOnes) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{64, 0, 1};
  for (int stream = 1; stream <= 4; ++stream) ASSERT_EQ(run(stream), 0);  // Exec holds 4 sets
  EXPECT_EQ(api().allocated.size(), 4u);
  ASSERT_EQ(run(5), 0) << why.text;  // optional: left out, the call still runs
  EXPECT_EQ(s.workspace_seen[0], nullptr);
  EXPECT_EQ(api().allocated.size(), 4u);
  s.planned.workspace[0].optional = 0;
  api().log.clear();
  EXPECT_EQ(run(5), kUnsupported);
  EXPECT_STREQ(why.text, "the workspace table is full (4 build, device and stream combinations have used it)");
  for (const std::string& l : take()) EXPECT_EQ(l.find("launch"), std::string::npos) << l;
  ASSERT_EQ(run(2), 0);  // a stream it knows still runs
}

TEST_F(RunPlan, EncodesTheMapsForBind) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.maps = 2;
  s.planned.map[0].name = "q";
  s.planned.map[0].base = reinterpret_cast<const void*>(0x100);
  s.planned.map[1].name = "k";
  s.planned.map[1].base = reinterpret_cast<const void*>(0x200);
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "encode q", "encode k", "bind 0 m0=0x100 m1=0x200", "launch k0 (1,2,1) s1"}));
}

// A map over a workspace (TensorMap::workspace, the byte offset in base) is encoded after the
// workspaces, at the workspace's address plus the offset; over an optional workspace left out, it is
// not encoded at all (Resources::map null: bind does without it).
TEST_F(RunPlan, EncodesAMapOverAWorkspaceAtItsAddressOrNotAtAll) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{0x800, 0, 1};
  s.planned.maps = 2;
  s.planned.map[0].name = "q";
  s.planned.map[0].base = reinterpret_cast<const void*>(0x100);
  s.planned.map[1].name = "copy";
  s.planned.map[1].base = reinterpret_cast<const void*>(0x40);  // offset into workspace 0
  s.planned.map[1].workspace = 1;
  ASSERT_EQ(run(), 0) << why.text;
  EXPECT_EQ(take(), (Log{"sm_count 0", "encode q", "relax_capture", "allocate 2048", "restore_capture 0", "encode copy",
                         "bind 0 w0=0x1000 m0=0x100 m1=0x1040", "launch k0 (1,2,1) s1"}));
  RunOptions without;
  without.optional_workspaces = 0;
  ASSERT_EQ(run(1, nullptr, without), 0) << why.text;
  EXPECT_EQ(take(), (Log{"encode q", "bind 0 w0=null m0=0x100 m1=none", "launch k0 (1,2,1) s1"}));
}

TEST_F(RunPlan, PassesOnRefusalsAndErrorsWithNothingLaunchedAfterThem) {
  s.planned.launches = 2;
  s.planned.launch[0] = launch_of(0, 1);
  s.planned.launch[1] = launch_of(1, 1);
  s.planned.maps = 1;
  s.planned.map[0].name = "q";
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{64, 0, 0};

  s.refuse_plan = 1;
  EXPECT_EQ(run(), kUnsupported);
  EXPECT_STREQ(why.text, "the fake family refuses the call");
  EXPECT_EQ(take(), (Log{"sm_count 0"}));
  s.refuse_plan = 0;

  api().fail = "encode";
  EXPECT_EQ(run(), kFakeError);
  EXPECT_STREQ(why.text, "encode q failed");
  EXPECT_EQ(take(), (Log{"encode q"}));

  api().fail = "allocate";
  EXPECT_EQ(run(), kFakeError);
  EXPECT_EQ(take(), (Log{"encode q", "relax_capture", "allocate 64", "restore_capture 0"}));
  api().fail.clear();

  s.refuse_bind = 1;
  EXPECT_EQ(run(), kUnsupported);
  EXPECT_STREQ(why.text, "the fake family cannot bind launch 1");
  const Log refused = take();
  EXPECT_EQ(refused.back(), "bind 1 w0=0x1000 m0=0x0");
  EXPECT_EQ(std::count(refused.begin(), refused.end(), "launch k1 (1,2,1) s1"), 0);
  s.refuse_bind = -1;

  api().fail = "launch k0";
  EXPECT_EQ(run(), kFakeError);
  EXPECT_STREQ(why.text, "launch k0 (1,2,1) s1 failed");
  EXPECT_EQ(take(), (Log{"encode q", "bind 0 w0=0x1000 m0=0x0", "launch k0 (1,2,1) s1"}));

  api().fail = "current_device";
  EXPECT_EQ(run(), kFakeError);
  api().fail = "sm_count";
  api().device = 2;
  EXPECT_EQ(run(), kFakeError);
  EXPECT_STREQ(why.text, "sm_count 2 failed");
}

TEST_F(RunPlan, APreparedCallLaunchesAgainWithoutPlanningAgain) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 3);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{64, 1, 0};
  Prepared prepared;
  ASSERT_EQ(exec->prepare(kFake, &build, funcs, call, 1, &prepared, &why), 0) << why.text;
  EXPECT_EQ(prepared.plan.launches, 1);
  ASSERT_NE(prepared.res.workspace[0], nullptr);
  take();
  for (int i = 0; i < 2; ++i) ASSERT_EQ(exec->launch(kFake, &build, funcs, call, prepared, 1, &why), 0);
  EXPECT_EQ(take(), (Log{"bind 0 w0=0x1000", "launch k0 (3,2,1) s1", "bind 0 w0=0x1000", "launch k0 (3,2,1) s1"}));
}

TEST_F(RunPlan, PlansWithoutLaunching) {
  s.planned.launches = 1;
  s.planned.launch[0] = launch_of(0, 3);
  s.planned.workspaces = 1;
  s.planned.workspace[0] = Workspace{64, 1, 0};
  Plan p = empty_plan();
  ASSERT_EQ(exec->plan(kFake, &build, funcs, call, &p, &why), 0);
  EXPECT_EQ(p.launch[0].grid[0], 3u);
  EXPECT_EQ(take(), (Log{"sm_count 0"}));
}

}  // namespace
}  // namespace test_run_plan
