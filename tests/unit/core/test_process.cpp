// Child processes (core/process.hpp) as each user starts them: the workers' pipes and own process
// group (tests/unit/eval/test_protocol.cpp holds those further), the converter's stderr kept with
// stdin and stdout on /dev/null, serve's workers in our group with a program given apart from argv[0].
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/process.hpp"

namespace test_process {
using namespace attntune;

namespace {

std::string read_all(int fd) {
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

TEST(Process, KeepsStderrWithStdinAndStdoutOnDevNull) {
  SpawnOptions o;
  o.in = o.out = SpawnOptions::Stdio::kNull;
  o.err = SpawnOptions::Stdio::kPipe;
  Child c = Child::spawn({"/bin/sh", "-c", "cat; echo out; echo err >&2; exit 4"}, o);
  EXPECT_EQ(c.stdin_fd(), -1);
  EXPECT_EQ(c.stdout_fd(), -1);
  ASSERT_GE(c.stderr_fd(), 0);
  EXPECT_EQ(read_all(c.stderr_fd()), "err\n");  // cat read EOF from /dev/null; stdout went nowhere
  const ExitStatus st = c.wait();
  EXPECT_EQ(st.str(), "exited with status 4");
  EXPECT_FALSE(c.running());
  EXPECT_EQ(c.stderr_fd(), -1);
}

TEST(Process, PollsWithoutBlockingAndRunsAProgramApartFromItsArgv0) {
  SpawnOptions o;
  o.in = o.out = o.err = SpawnOptions::Stdio::kInherit;
  o.own_group = false;
  o.program = "/bin/sh";
  Child c = Child::spawn({"a-name-of-its-own", "-c", "sleep 0.3; exit 0"}, o);
  EXPECT_FALSE(c.poll());  // still sleeping
  std::optional<ExitStatus> st;
  for (int i = 0; i < 500 && !(st = c.poll()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(st);
  EXPECT_TRUE(st->ok()) << st->str();
  EXPECT_FALSE(c.running());
}

TEST(Process, SignalsTheChildAloneAndKillsOnlyItWithoutAGroupOfItsOwn) {
  SpawnOptions o;
  o.own_group = false;
  Child c = Child::spawn({"/bin/sh", "-c", "trap 'exit 9' TERM; while :; do sleep 0.05; done"}, o);
  EXPECT_EQ(::getpgid(c.pid()), ::getpgrp());  // ours: a terminal's Ctrl-C reaches it
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the trap is set
  c.signal(SIGTERM);
  EXPECT_EQ(c.wait().str(), "exited with status 9");
  Child own = Child::spawn({"/bin/sh", "-c", "sleep 100"});
  EXPECT_EQ(::getpgid(own.pid()), own.pid());
  EXPECT_EQ(own.kill().value, SIGKILL);
}

TEST(Process, SaysWhichProgramCouldNotStart) {
  SpawnOptions o;
  o.program = "/nonexistent/converter";
  try {
    Child::spawn({"converter"}, o);
    ADD_FAILURE() << "started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start /nonexistent/converter"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(self_exe().empty());
}

}  // namespace
}  // namespace test_process
