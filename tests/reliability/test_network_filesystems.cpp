// Reliability, part 9 (docs/RELIABILITY.md, "Network filesystems"; docs/design/service.md): serve,
// submit and tune refuse a database on a network filesystem, with the reason and what to do
// instead, unless given --allow-network-fs; the commands that only read it are not refused. The
// filesystem probe's test seam (ATTNTUNE_TEST_FS_TYPE, db/filesystem.hpp) stands in for NFS, SMB
// and the others, which test machines do not have; the probe itself is tested on this machine's
// filesystems (tests/unit/db/test_db_damage.cpp).
#include <gtest/gtest.h>

#include "fault_util.hpp"

namespace attntune::reliability {
namespace test_network_filesystems {
namespace {

TEST(ReliabilityNetworkFs, ServeSubmitAndTuneRefuseANetworkFilesystemUnlessAllowed) {
  TempDir dir;
  const Recording rec(dir);
  const std::string queued = dir.file("queue.db");
  ASSERT_EQ(run(submit_args(queued, {service_problem(0)}, 6), dir.path()).rc, 0);

  int refusals = 0, allowed = 0;
  for (const char* type : {"nfs", "nfs4", "cifs", "smb3", "fuse.sshfs", "lustre", "ceph", "gpfs", "9p", "beegfs",
                           "fuse.glusterfs"}) {
    SCOPED_TRACE(type);
    ProcOptions on;
    on.env = {{"ATTNTUNE_TEST_FS_TYPE", type}};
    const std::string fresh = dir.file(fmt::format("fresh-{}.db", refusals));
    const std::map<std::string, std::vector<std::string>> writers = {
        {"tune", rec.tune(fresh, "k", 0, {"--budget-evals", "5", "--final-top", "0"})},
        {"submit", submit_args(fresh, {service_problem(1)}, 6)},
        {"serve", serve_args(queued, "0", 0)},
    };
    for (const auto& [name, args] : writers) {
      const auto before = tree(dir.path());
      const Ran r = run(args, dir.path(), on);
      EXPECT_EQ(r.rc, 2) << name << ": " << r.err;
      EXPECT_EQ(count_lines(r.err), 1u) << name << ": " << r.err;
      for (const std::string& part : {std::string("is on a network filesystem (") + type + ")",
                                      std::string("SQLite's locks do not hold between hosts"),
                                      std::string("a database per host"), std::string("attntune merge"),
                                      std::string("--allow-network-fs")})
        EXPECT_NE(r.err.find(part), std::string::npos) << name << " does not say '" << part << "': " << r.err;
      EXPECT_TRUE(r.out.empty()) << name;
      EXPECT_EQ(tree(dir.path()), before) << name << " wrote something";
      refusals += r.rc == 2;
    }
    // Reading is not refused.
    const Ran status = run({"status", "--db", queued}, dir.path(), on);
    EXPECT_EQ(status.rc, 0) << status.err;
  }

  // --allow-network-fs: each runs.
  ProcOptions on;
  on.env = {{"ATTNTUNE_TEST_FS_TYPE", "nfs4"}};
  const std::string fresh = dir.file("allowed.db");
  for (std::vector<std::string> args : {rec.tune(fresh, "k", 0, {"--budget-evals", "5", "--final-top", "0"}),
                                        submit_args(fresh, {service_problem(1)}, 6), serve_args(fresh, "0", 0)}) {
    args.push_back("--allow-network-fs");
    const Ran r = run(args, dir.path(), on);
    EXPECT_EQ(r.rc, 0) << args[0] << ": " << r.err;
    allowed += r.rc == 0;
  }
  // A local filesystem named by the seam, and this machine's own (no seam): not refused.
  ProcOptions local;
  local.env = {{"ATTNTUNE_TEST_FS_TYPE", "ext4"}};
  EXPECT_EQ(run(submit_args(dir.file("ext4.db"), {service_problem(2)}, 6), dir.path(), local).rc, 0);
  EXPECT_EQ(run(submit_args(dir.file("here.db"), {service_problem(2)}, 6), dir.path()).rc, 0);
  for (const char* cmd : {"tune", "submit", "serve"}) {
    const Ran help = run({cmd, "--help"}, dir.path());
    EXPECT_NE(help.out.find("--allow-network-fs"), std::string::npos) << cmd << " --help";
  }
  std::printf("network filesystems: %d refusals (11 types x tune, submit, serve), %d runs allowed by "
              "--allow-network-fs\n",
              refusals, allowed);
}

}  // namespace
}  // namespace test_network_filesystems
}  // namespace attntune::reliability
