// Where the tests find `attntune` in a build carried to another machine without $ATTNTUNE_BIN
// (tests/common/run_attntune.hpp, carried_attntune).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/run_attntune.hpp"

namespace fs = std::filesystem;

namespace {

struct CarriedTree : ::testing::Test {
  fs::path root;
  void SetUp() override {
    root = fs::temp_directory_path() / ("attntune-carried-" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root / "carried" / "tests");
  }
  void TearDown() override { fs::remove_all(root); }
  static void touch(const fs::path& p) { std::ofstream(p) << "#!/bin/sh\n"; }
};

TEST_F(CarriedTree, TheBuiltPathWhereItExists) {
  touch(root / "built-attntune");
  touch(root / "carried" / "attntune");
  EXPECT_EQ(attntune::testing::carried_attntune((root / "built-attntune").string(), root / "carried" / "attntune_gpu_tests"),
            (root / "built-attntune").string());
}

TEST_F(CarriedTree, ElseTheOneBesideTheTestBinary) {
  touch(root / "carried" / "attntune");
  EXPECT_EQ(attntune::testing::carried_attntune((root / "gone" / "attntune").string(), root / "carried" / "attntune_gpu_tests"),
            (root / "carried" / "attntune").string());
}

TEST_F(CarriedTree, ElseOneFolderUpAsInTheBuildTree) {
  touch(root / "carried" / "attntune");
  EXPECT_EQ(attntune::testing::carried_attntune((root / "gone" / "attntune").string(),
                                                root / "carried" / "tests" / "attntune_gpu_tests"),
            (root / "carried" / "attntune").string());
}

TEST_F(CarriedTree, ElseTheBuiltPathSoThatTheErrorNamesIt) {
  fs::create_directories(root / "carried" / "attntune");  // a folder of that name is not the binary
  const std::string built = (root / "gone" / "attntune").string();
  EXPECT_EQ(attntune::testing::carried_attntune(built, root / "carried" / "attntune_gpu_tests"), built);
  EXPECT_EQ(attntune::testing::carried_attntune(built, fs::path()), built);
}

}  // namespace
