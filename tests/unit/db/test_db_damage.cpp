// What Store::open checks of a damaged database (Store::Options, docs/RELIABILITY.md "Damaged
// databases"): a missing index or table refuses every open; a damaged page refuses a writer at open
// (the tables it uses, or the whole file) and a reader when it reads the page; the file is left
// byte for byte. And the network filesystem refusal with its test seam (db/filesystem.hpp).
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/statfs.h>

#include <optional>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/embedded.hpp"
#include "db/filesystem.hpp"
#include "db/sqlite.hpp"
#include "db_test_util.hpp"

namespace test_db_damage {
using namespace attntune;
using namespace attntune::test;
using sqlite::Connection;
using sqlite::Statement;

namespace {

// A database of two campaigns with enough evaluations to span many pages, and a queue row; closed.
void make_store(const std::string& path) {
  Store store = Store::open(path, Store::Mode::kCreate);
  const std::int64_t device = store.upsert_device(h100());
  for (const char* name : {"c1", "c2"}) {
    const std::int64_t campaign = store.open_campaign(spec(name), device);
    for (int i = 0; i < 300; ++i) {
      const std::int64_t k = store.upsert_candidate("flash_fwd_mma", config(16 * (i % 8 + 1), i), "h1");
      store.record_evaluation(campaign, k, device, i % 3 ? ok_eval(100 + i) : failed_eval("crashed", std::string(200, 'x')));
    }
  }
  QueuedJob job;
  job.campaign = "queued-one";
  job.problem = problem();
  store.submit_job(job);
}

std::int64_t root_page(const std::string& path, const std::string& name) {
  Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);  // read-write: the last one removes -wal and -shm
  Statement st(db, "SELECT rootpage FROM sqlite_master WHERE name = ?1");
  st.bind(name);
  if (!st.step()) throw std::runtime_error("no " + name);
  return st.int64(0);
}

// The page holding a table's latest rows: the root's right-most child (an interior b-tree page keeps
// that pointer at offset 8 of its header), or the root when it is the only page.
std::int64_t page_of_last_row(const std::string& path, const std::string& table) {
  const std::int64_t root = root_page(path, table);
  const std::string bytes = read_bytes(path);
  const std::size_t at = static_cast<std::size_t>(root - 1) * 4096 + (root == 1 ? 100 : 0);
  if (static_cast<unsigned char>(bytes[at]) != 0x05) return root;  // a single leaf
  std::int64_t child = 0;
  for (int i = 0; i < 4; ++i) child = (child << 8) | static_cast<unsigned char>(bytes[at + 8 + i]);
  return child;
}

void damage_page(const std::string& path, std::int64_t page, char fill) {
  std::string bytes = read_bytes(path);
  ASSERT_LE(static_cast<std::size_t>(page * 4096), bytes.size());
  for (std::size_t i = static_cast<std::size_t>(page - 1) * 4096; i < static_cast<std::size_t>(page) * 4096; ++i)
    bytes[i] = static_cast<char>(fill ^ static_cast<char>(i * 131));
  write_bytes(path, bytes);
}

// Equal snapshots; otherwise says which files differ (the contents are too long to print).
::testing::AssertionResult same_files(const std::map<std::string, std::string>& now,
                                      const std::map<std::string, std::string>& then) {
  if (now == then) return ::testing::AssertionSuccess();
  std::string diff;
  for (const auto& [name, bytes] : now)
    if (!then.count(name)) diff += " added " + name + fmt::format(" ({} bytes)", bytes.size());
    else if (then.at(name) != bytes) diff += " changed " + name;
  for (const auto& [name, bytes] : then)
    if (!now.count(name)) diff += " removed " + name;
  return ::testing::AssertionFailure() << "files:" << diff;
}

Store::Options writes(std::vector<std::string> tables) {
  Store::Options o;
  o.tables = std::move(tables);
  return o;
}

// Store::open must throw InputError containing `why` and leave the directory as it was.
void expect_open_refused(const TempDir& dir, const std::string& path, Store::Mode mode, const Store::Options& o,
                         const std::string& why) {
  const auto before = snapshot(dir.path());
  try {
    Store::open(path, mode, o);
    ADD_FAILURE() << "opened";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "names the file: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
  EXPECT_TRUE(same_files(snapshot(dir.path()), before)) << "the refused open changed the directory";
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(StoreDamage, AMissingIndexOrTableRefusesEveryOpen) {
  TempDir dir;
  for (const char* drop : {"DROP INDEX evaluations_best", "DROP INDEX queue_state", "DROP TABLE gpus"}) {
    const std::string path = dir.file("dropped.db");
    fs::remove(path);
    make_store(path);
    {
      Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
      db.exec(drop);
    }
    const std::string what = std::string(drop).find("INDEX") != std::string::npos ? "is missing (dropped?)" : "is missing";
    for (Store::Mode mode : {Store::Mode::kCreate, Store::Mode::kExisting, Store::Mode::kReadOnly})
      expect_open_refused(dir, path, mode, {}, what);
  }
}

TEST(StoreDamage, EveryTableAndIndexOfTheSchemaIsRequired) {
  // What the store expects of the current schema is read off db/schema.sql's text; SQLite's own
  // reading of it must be the same: a fresh database opens (nothing expected that is not there),
  // and without any one of its tables or indexes it is refused (nothing there that is not expected).
  TempDir dir;
  const std::string fresh = dir.file("fresh.db");
  make_store(fresh);
  std::vector<std::pair<std::string, std::string>> objects;  // (type, name)
  {
    Connection db = Connection::open(fresh, SQLITE_OPEN_READWRITE);
    Statement st(db, "SELECT type, name FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'");
    while (st.step()) objects.emplace_back(st.text(0), st.text(1));
  }
  EXPECT_GE(objects.size(), 15u);  // 11 tables and 4 indexes at schema version 8
  for (const auto& [type, name] : objects) {
    const std::string copy = dir.file(name + ".db");
    fs::copy_file(fresh, copy);
    {
      Connection db = Connection::open(copy, SQLITE_OPEN_READWRITE);
      db.exec(fmt::format("DROP {} \"{}\"", type == "table" ? "TABLE" : "INDEX", name));
    }
    expect_open_refused(dir, copy, Store::Mode::kReadOnly, {}, "is missing");
  }
}

TEST(StoreDamage, AnOlderSchemaIsHeldToItsOwnTablesAndIndexes) {
  // A version-1 database (as its migration makes it) is whole; the check does not ask for the
  // tables later versions add.
  TempDir dir;
  const std::string path = dir.file("v1.db");
  {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec(std::string(attntune::embedded_file("db/migrations/001_initial.sql")));
    db.exec(fmt::format("PRAGMA application_id = {}; PRAGMA user_version = 1", static_cast<std::int32_t>(Store::kApplicationId)));
  }
  EXPECT_NO_THROW(Store::open(path, Store::Mode::kReadOnly));
  {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
    db.exec("DROP TABLE builds");
  }
  expect_open_refused(dir, path, Store::Mode::kReadOnly, {}, "its table 'builds' is missing");
}

TEST(StoreDamage, ADamagedPageRefusesAWriterAtOpenAndAReaderWhenItReadsThePage) {
  TempDir dir;
  const std::string path = dir.file("damaged.db");
  make_store(path);
  damage_page(path, page_of_last_row(path, "evaluations"), '\xa5');

  // Writers: the whole file (the default), or a scope that holds the damaged table.
  expect_open_refused(dir, path, Store::Mode::kExisting, {}, "is damaged (SQLite's integrity_check");
  expect_open_refused(dir, path, Store::Mode::kCreate, {}, "is damaged");
  expect_open_refused(dir, path, Store::Mode::kExisting, writes({"queue", "evaluations"}), "integrity_check of queue, evaluations");

  const auto before = snapshot(dir.path());
  // A scope without it opens (submit checks the queue), and so does a worker's open.
  EXPECT_NO_THROW(Store::open(path, Store::Mode::kExisting, writes({"queue", "campaigns"})));
  Store::Options unchecked;
  unchecked.check_integrity = false;
  EXPECT_NO_THROW(Store::open(path, Store::Mode::kExisting, unchecked));

  // A reader opens it, answers what does not touch the page, and fails on what does.
  {
    Store store = Store::open(path, Store::Mode::kReadOnly);
    EXPECT_TRUE(store.find_campaign("c2").has_value());
    EXPECT_TRUE(store.gpus().empty());
    BestQuery q;
    q.top = 1000;
    try {
      store.best(q);
      ADD_FAILURE() << "the damaged page was read without error";
    } catch (const SqliteError& e) {
      EXPECT_TRUE(e.is_corrupt()) << e.what();
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
    }
  }
  EXPECT_TRUE(same_files(snapshot(dir.path()), before));
}

TEST(StoreDamage, AZeroedPageIsFoundAsARandomOneIs) {
  TempDir dir;
  const std::string path = dir.file("zeroed.db");
  make_store(path);
  const std::int64_t page = root_page(path, "evaluations_best");
  std::string bytes = read_bytes(path);
  std::fill(bytes.begin() + (page - 1) * 4096, bytes.begin() + page * 4096, '\0');
  write_bytes(path, bytes);
  expect_open_refused(dir, path, Store::Mode::kExisting, {}, "is damaged");
}

TEST(StoreDamage, TheCheckLeavesConstraintsOnForTheWritesThatFollow) {
  TempDir dir;
  const std::string path = dir.file("ok.db");
  make_store(path);
  Store store = Store::open(path, Store::Mode::kExisting);  // checked with CHECK constraints set aside
  const std::int64_t campaign = *store.find_campaign("c1");
  const std::int64_t k = store.upsert_candidate("flash_fwd_mma", config(64, 64), "h1");
  EXPECT_THROW(store.record_evaluation(campaign, k, 1, failed_eval("no_such_status", "")), SqliteError);
  Connection db = Connection::open(path, SQLITE_OPEN_READONLY);
  Statement st(db, "PRAGMA quick_check");
  ASSERT_TRUE(st.step());
  EXPECT_EQ(st.text(0), "ok");
}

// ---- Network filesystems ----------------------------------------------------------------------

TEST(NetworkFilesystem, TypesAndMagicNumbers) {
  for (const char* t : {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "9p", "afs", "glusterfs",
                        "beegfs", "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "fuse.rclone", "fuse.ceph-fuse"})
    EXPECT_TRUE(is_network_filesystem(t)) << t;
  for (const char* t : {"ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "fuse.fuse-overlayfs", "fuseblk", "fuse",
                        "virtiofs", "", "nfsd", "fuse.", "fuse.sshfsx"})
    EXPECT_FALSE(is_network_filesystem(t)) << t;
  EXPECT_EQ(network_filesystem_of_magic(0x6969), "nfs");
  EXPECT_EQ(network_filesystem_of_magic(0xFF534D42), "cifs");
  EXPECT_EQ(network_filesystem_of_magic(0xFE534D42), "smb3");
  EXPECT_EQ(network_filesystem_of_magic(0x517B), "smbfs");
  EXPECT_EQ(network_filesystem_of_magic(0x0BD00BD0), "lustre");
  EXPECT_EQ(network_filesystem_of_magic(0x65735546), "fuse");
  EXPECT_EQ(network_filesystem_of_magic(0xEF53), "");      // ext2/3/4
  EXPECT_EQ(network_filesystem_of_magic(0x01021994), "");  // tmpfs
}

TEST(NetworkFilesystem, TheProbeSeesThisMachinesLocalFilesystems) {
  TempDir dir;
  const Filesystem here = filesystem_of(dir.file("missing.db"));  // a file to be created: its directory's
  EXPECT_FALSE(here.network) << here.type;
  EXPECT_FALSE(here.type.empty());
  const Filesystem proc = filesystem_of("/proc/self/status");
  EXPECT_EQ(proc.type, "proc");
  EXPECT_FALSE(proc.network);
}

TEST(NetworkFilesystem, AWriterThatAsksIsRefusedOnOneAndCreatesNothing) {
  TempDir dir;
  const std::string fresh = dir.file("fresh.db"), existing = dir.file("existing.db");
  make_store(existing);
  Store::Options refuse;
  refuse.refuse_network_fs = true;
  {
    ScopedEnv seam("ATTNTUNE_TEST_FS_TYPE", "nfs4");
    for (const std::string& path : {fresh, existing}) {
      expect_open_refused(dir, path, Store::Mode::kCreate, refuse, "is on a network filesystem (nfs4)");
      expect_open_refused(dir, path, Store::Mode::kCreate, refuse, "attntune merge");
      expect_open_refused(dir, path, Store::Mode::kCreate, refuse, "--allow-network-fs");
    }
    EXPECT_FALSE(fs::exists(fresh));
    // Without the refusal (readers; --allow-network-fs): opened.
    EXPECT_NO_THROW(Store::open(existing, Store::Mode::kReadOnly));
    EXPECT_NO_THROW(Store::open(existing, Store::Mode::kExisting));
  }
  {
    ScopedEnv seam("ATTNTUNE_TEST_FS_TYPE", "fuse.sshfs");
    expect_open_refused(dir, existing, Store::Mode::kExisting, refuse, "(fuse.sshfs)");
  }
  {
    ScopedEnv seam("ATTNTUNE_TEST_FS_TYPE", "ext4");
    EXPECT_NO_THROW(Store::open(existing, Store::Mode::kExisting, refuse));
  }
  EXPECT_NO_THROW(Store::open(fresh, Store::Mode::kCreate, refuse)) << "this machine's disk is local";
}
}  // namespace test_db_damage
