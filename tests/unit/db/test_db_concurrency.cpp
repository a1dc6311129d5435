// Readers and writers in separate processes: in WAL mode a reader (best, campaigns) is never blocked
// by a writer's open transaction and sees only committed rows; a writer is never blocked by a reader;
// two writers wait for each other, and past the busy timeout fail with a clear message.
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>

#include <gtest/gtest.h>

#include "db/sqlite.hpp"
#include "db_test_util.hpp"

namespace test_db_concurrency {
using namespace attntune;
using namespace attntune::test;
using sqlite::Connection;
using sqlite::Statement;
using sqlite::Transaction;
using Clock = std::chrono::steady_clock;

namespace {

// A forked process running `body`, with a byte channel each way. The parent holds no SQLite
// connection across the fork.
class Child {
 public:
  using Body = std::function<void(Child&)>;
  explicit Child(const Body& body) {
    if (::pipe(to_parent_) != 0 || ::pipe(to_child_) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      in_child_ = true;
      try {
        body(*this);
        ::_exit(0);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
        ::_exit(1);
      }
    }
  }
  ~Child() {
    if (!in_child_ && pid_ > 0) join();
  }
  void send(char c) {
    if (::write(in_child_ ? to_parent_[1] : to_child_[1], &c, 1) != 1) throw std::runtime_error("pipe write failed");
  }
  char receive() {
    char c = 0;
    if (::read(in_child_ ? to_child_[0] : to_parent_[0], &c, 1) != 1)
      throw std::runtime_error("the other side is gone");
    return c;
  }
  int join() {
    if (pid_ <= 0) return exit_;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
    for (int fd : {to_parent_[0], to_parent_[1], to_child_[0], to_child_[1]}) ::close(fd);
    exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return exit_;
  }

 private:
  int to_parent_[2] = {-1, -1}, to_child_[2] = {-1, -1};
  pid_t pid_ = -1;
  bool in_child_ = false;
  int exit_ = -1;
};

struct ConcurrencyTest : ::testing::Test {
  TempDir dir;
  std::string path = dir.file("attntune.db");
  void SetUp() override {
    Store store = Store::open(path, Store::Mode::kCreate);
    const std::int64_t device = store.upsert_device(h100());
    const std::int64_t c = store.open_campaign(spec("c1"), device);
    store.record_evaluation(c, store.upsert_candidate("flash_fwd_mma", config(128, 64), "h1"), device, ok_eval(100));
    store.upsert_candidate("flash_fwd_mma", config(64, 64), "h1");
  }
  // A second, faster result, inserted the way record_evaluation does, in a transaction held open.
  static void insert_faster(const Connection& db) {
    Statement(db,
              "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, median_us, tflops, "
              "max_abs_err, count) VALUES (1, 2, 2, 1, 'ok', 50, 400, 0.001, 20)")
        .run();
  }
  std::vector<double> best_times() {
    Store reader = Store::open(path, Store::Mode::kReadOnly);
    BestQuery q;
    q.campaign = "c1";
    q.top = 10;
    std::vector<double> out;
    for (const auto& r : reader.best(q)) out.push_back(r.median_us);
    return out;
  }
};

}  // namespace

TEST_F(ConcurrencyTest, ReaderIsNotBlockedByAnOpenWriteTransaction) {
  Child writer([&](Child& self) {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
    db.set_busy_timeout(std::chrono::seconds(5));
    Transaction tx(db);
    insert_faster(db);
    self.send('w');  // holding the write lock, uncommitted
    if (self.receive() != 'c') return;
    tx.commit();
    self.send('d');
  });
  ASSERT_EQ(writer.receive(), 'w');
  const auto start = Clock::now();
  const std::vector<double> during = best_times();
  const auto elapsed = Clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(100))
      << std::chrono::duration<double, std::milli>(elapsed).count() << " ms";
  EXPECT_EQ(during, std::vector<double>({100})) << "sees only committed rows";
  writer.send('c');
  ASSERT_EQ(writer.receive(), 'd');
  EXPECT_EQ(best_times(), std::vector<double>({50, 100}));
  EXPECT_EQ(writer.join(), 0);
}

TEST_F(ConcurrencyTest, TheBinaryReadsWhileAWriterHoldsItsTransaction) {
  Child writer([&](Child& self) {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
    Transaction tx(db);
    insert_faster(db);
    self.send('w');
    self.receive();  // rolled back when the parent is done
  });
  ASSERT_EQ(writer.receive(), 'w');
  TempDir scratch;
  const auto start = Clock::now();
  const CommandResult r =
      run_shell(std::string(ATTNTUNE_BIN) + " best --format csv --top 5 --db '" + path + "'", scratch.path());
  const auto elapsed = Clock::now() - start;
  writer.send('x');
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(",100,"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(",50,"), std::string::npos) << "uncommitted row shown:\n" << r.out;
  // Far below the 5 s busy timeout that a blocked reader would wait out.
  EXPECT_LT(elapsed, std::chrono::seconds(2));
  EXPECT_EQ(writer.join(), 0);
}

TEST_F(ConcurrencyTest, WriterIsNotBlockedByAnOpenReadTransaction) {
  Child reader([&](Child& self) {
    Connection db = Connection::open(path, SQLITE_OPEN_READONLY);
    Transaction snapshot(db, Transaction::Kind::kDeferred);
    Statement count(db, "SELECT count(*) FROM evaluations");
    count.step();
    const std::int64_t before = count.int64(0);
    self.send('r');  // holding a read snapshot
    self.receive();
    count.reset();
    count.step();
    self.send(count.int64(0) == before ? 's' : 'x');  // the snapshot did not move
  });
  ASSERT_EQ(reader.receive(), 'r');
  Store writer = Store::open(path, Store::Mode::kCreate);
  const auto start = Clock::now();
  writer.record_evaluation(1, 2, 1, ok_eval(60));
  const auto elapsed = Clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::milliseconds(100));
  reader.send('?');
  EXPECT_EQ(reader.receive(), 's');
  EXPECT_EQ(reader.join(), 0);
  EXPECT_EQ(writer.campaign_evaluations(1).size(), 2u);
}

TEST_F(ConcurrencyTest, SecondWriterWaitsThenFailsClearly) {
  Child first([&](Child& self) {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
    Transaction tx(db);
    insert_faster(db);
    self.send('w');
    self.receive();
    tx.commit();
    self.send('d');
  });
  ASSERT_EQ(first.receive(), 'w');
  Store second = Store::open(path, Store::Mode::kCreate);
  second.set_busy_timeout(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  try {
    second.record_evaluation(1, 1, 1, ok_eval(70));
    ADD_FAILURE() << "wrote while another writer held the lock";
  } catch (const SqliteError& e) {
    EXPECT_EQ(e.primary_code(), SQLITE_BUSY);
    EXPECT_NE(std::string(e.what()).find("is locked by another writer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(250)) << "gave up without waiting";
  first.send('c');
  ASSERT_EQ(first.receive(), 'd');
  EXPECT_EQ(first.join(), 0);
  second.record_evaluation(1, 1, 1, ok_eval(70));  // the lock is free again
  const auto evals = second.campaign_evaluations(1);
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[2].record.median_us, 70);
}
}  // namespace test_db_concurrency
