// Opening databases: refusal of files that are not ours (left byte-for-byte unchanged), missing
// databases, migration from schema version 1, and read-only opens that leave no trace.
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "core/embedded.hpp"
#include "db/sqlite.hpp"
#include "db_test_util.hpp"

namespace test_db_open {
using namespace attntune;
using namespace attntune::test;
using sqlite::Connection;
using sqlite::Statement;

namespace {

constexpr Store::Mode kAllModes[] = {Store::Mode::kCreate, Store::Mode::kExisting, Store::Mode::kReadOnly};

const char* mode_name(Store::Mode m) {
  return m == Store::Mode::kCreate ? "kCreate" : m == Store::Mode::kExisting ? "kExisting" : "kReadOnly";
}

// An attntune database with enough rows to span many pages, closed (no -wal/-shm left).
void make_store(const std::string& path, int evaluations = 300) {
  Store store = Store::open(path, Store::Mode::kCreate);
  const std::int64_t device = store.upsert_device(h100());
  const std::int64_t campaign = store.open_campaign(spec("c1"), device);
  for (int i = 0; i < evaluations; ++i) {
    const std::int64_t k = store.upsert_candidate("flash_fwd_mma", config(16 * (i % 8 + 1), i), "h1");
    store.record_evaluation(campaign, k, device,
                            i % 3 ? ok_eval(100 + i) : failed_eval("crashed", std::string(200, 'x')));
  }
}

// Opens `path` in every mode; each must throw InputError mentioning `why` and leave the directory
// (the file and the absence of side files) exactly as it was.
void expect_refused(const TempDir& dir, const std::string& path, const std::string& why) {
  for (Store::Mode mode : kAllModes) {
    const auto before = snapshot(dir.path());
    try {
      Store::open(path, mode);
      ADD_FAILURE() << mode_name(mode) << ": " << path << " was opened";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << mode_name(mode) << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "names the file: " << e.what();
    }
    EXPECT_EQ(snapshot(dir.path()), before) << mode_name(mode) << " changed the directory";
    EXPECT_FALSE(fs::exists(path + "-wal")) << mode_name(mode);
    EXPECT_FALSE(fs::exists(path + "-shm")) << mode_name(mode);
    EXPECT_FALSE(fs::exists(path + "-journal")) << mode_name(mode);
  }
}

}  // namespace

TEST(StoreOpen, RefusesATextFile) {
  TempDir dir;
  const std::string path = dir.file("notes.db");
  std::string text;
  for (int i = 0; i < 50; ++i) text += "these are my notes, not a database\n";
  write_bytes(path, text);
  expect_refused(dir, path, "is not an SQLite database");
  write_bytes(path, "SQLite");  // shorter than a header
  expect_refused(dir, path, "is not an SQLite database");
}

TEST(StoreOpen, RefusesAnotherProgramsDatabase) {
  TempDir dir;
  const std::string plain = dir.file("other.db");
  {
    Connection db = Connection::open(plain, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec("PRAGMA journal_mode = WAL; CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('ada')");
  }
  expect_refused(dir, plain, "is not an attntune database");

  const std::string tagged = dir.file("tagged.db");
  {
    Connection db = Connection::open(tagged, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    db.exec("PRAGMA application_id = 1234; CREATE TABLE t (x)");
  }
  expect_refused(dir, tagged, "application_id 0x000004d2");
}

TEST(StoreOpen, RefusesATruncatedDatabase) {
  TempDir dir;
  const std::string good = dir.file("good.db");
  make_store(good);
  const std::string bytes = read_bytes(good);
  ASSERT_GT(bytes.size(), 16u * 4096);
  fs::remove(good);

  const std::string half = dir.file("half.db");
  write_bytes(half, bytes.substr(0, bytes.size() / 2 / 4096 * 4096));  // whole pages, too few
  expect_refused(dir, half, "is corrupt (truncated");
  write_bytes(half, bytes.substr(0, 4096 * 3 + 1000));  // cut inside a page
  expect_refused(dir, half, "is corrupt (truncated");
}

TEST(StoreOpen, RefusesADamagedHeaderOrSchemaPage) {
  TempDir dir;
  const std::string path = dir.file("damaged.db");
  make_store(path, 10);
  std::string bytes = read_bytes(path);
  std::string bad_page_size = bytes;
  bad_page_size[16] = 0x03;  // page size 0x0300: not a power of two
  write_bytes(path, bad_page_size);
  expect_refused(dir, path, "is corrupt");
  std::string bad_schema = bytes;
  for (int i = 100; i < 112; ++i) bad_schema[i] = '\xff';                 // the schema page's b-tree header
  bad_schema[68] = bad_schema[69] = bad_schema[70] = bad_schema[71] = 0;  // not tagged: judged by its page
  write_bytes(path, bad_schema);
  expect_refused(dir, path, "is corrupt");
}

TEST(StoreOpen, CorruptionFoundLaterIsBadInputAndChangesNothing) {
  TempDir dir;
  const std::string path = dir.file("attntune.db");
  make_store(path);
  std::int64_t root = 0;
  {
    Connection db = Connection::open(path, SQLITE_OPEN_READONLY);
    Statement st(db, "SELECT rootpage FROM sqlite_master WHERE name = 'evaluations'");
    ASSERT_TRUE(st.step());
    root = st.int64(0);
  }
  std::string bytes = read_bytes(path);
  ASSERT_LT(static_cast<std::size_t>(root * 4096), bytes.size());
  for (std::int64_t i = (root - 1) * 4096; i < root * 4096; ++i) bytes[static_cast<std::size_t>(i)] = '\xa5';
  write_bytes(path, bytes);
  const auto before = snapshot(dir.path());
  {
    Store store = Store::open(path, Store::Mode::kReadOnly);  // the header and schema are intact
    BestQuery q;
    q.top = 10;
    try {
      store.best(q);
      ADD_FAILURE() << "a damaged table was read without error";
    } catch (const SqliteError& e) {
      EXPECT_TRUE(e.is_corrupt()) << e.what();
      EXPECT_EQ(e.code(), ExitCode::kBadInput);
      EXPECT_NE(std::string(e.what()).find("is corrupt"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(snapshot(dir.path()), before);
}

TEST(StoreOpen, RefusesANewerSchema) {
  TempDir dir;
  const std::string path = dir.file("future.db");
  make_store(path, 5);
  {
    Connection db = Connection::open(path, SQLITE_OPEN_READWRITE);
    Statement(db, "CREATE TABLE added_in_the_future (x)").run();
    db.exec("PRAGMA user_version = " + std::to_string(Store::current_schema_version() + 1));
  }
  ASSERT_FALSE(fs::exists(path + "-wal"));
  expect_refused(dir, path, "was written by a newer attntune");
}

TEST(StoreOpen, MissingDatabaseIsAnErrorAndCreatesNothing) {
  TempDir dir;
  const std::string path = dir.file("absent.db");
  for (Store::Mode mode : {Store::Mode::kExisting, Store::Mode::kReadOnly}) {
    try {
      Store::open(path, mode);
      ADD_FAILURE() << mode_name(mode);
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), "database '" + path + "' does not exist");
    }
    EXPECT_TRUE(snapshot(dir.path()).empty()) << mode_name(mode);
  }
  try {
    Store::open(dir.file("no/such/dir/x.db"), Store::Mode::kCreate);
    ADD_FAILURE() << "created a database in a missing directory";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot create database '" + dir.file("no/such/dir/x.db") + "': directory '" +
                                         dir.file("no/such/dir") + "' does not exist");
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(StoreOpen, EmptyFileIsCreatedIntoButNotReadFrom) {
  TempDir dir;
  const std::string path = dir.file("empty.db");
  write_bytes(path, "");
  for (Store::Mode mode : {Store::Mode::kExisting, Store::Mode::kReadOnly}) {
    EXPECT_THROW(Store::open(path, mode), InputError) << mode_name(mode);
    EXPECT_EQ(read_bytes(path), "");
  }
  Store store = Store::open(path, Store::Mode::kCreate);
  EXPECT_EQ(store.schema_version(), Store::current_schema_version());
  EXPECT_TRUE(store.campaigns().empty());
}

TEST(StoreOpen, ReadOnlyOpenLeavesNoTraceAndRefusesWrites) {
  TempDir dir;
  const std::string path = dir.file("attntune.db");
  make_store(path, 20);
  const auto before = snapshot(dir.path());
  ASSERT_EQ(before.size(), 1u);
  {
    Store store = Store::open(path, Store::Mode::kReadOnly);
    EXPECT_EQ(store.campaigns().size(), 1u);
    EXPECT_THROW(store.upsert_device(h100()), SqliteError);
  }
  EXPECT_EQ(snapshot(dir.path()), before) << "no -wal/-shm left behind, no byte changed";
}

TEST(StoreOpen, ReadOnlyOpenWorksInADirectoryItCannotWrite) {
  TempDir dir;
  const fs::path sub = dir.path() / "shared";
  fs::create_directory(sub);
  const std::string path = (sub / "attntune.db").string();
  make_store(path, 20);
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
  fs::permissions(path,
                  fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  const auto before = snapshot(sub);
  // Root ignores directory permissions: read as "nobody" in a child process then.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(10);
    if (::access(sub.c_str(), W_OK) == 0) ::_exit(11);  // the premise: the directory is not writable
    try {
      Store store = Store::open(path, Store::Mode::kReadOnly);
      BestQuery q;
      q.campaign = "c1";
      ::_exit(store.best(q).size() == 1 ? 0 : 12);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      ::_exit(13);
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: cannot drop root, 11: directory writable, 12: wrong rows, 13: error";
  EXPECT_EQ(snapshot(sub), before);
}

// ------------------------------------------------------------------------------------------------
// Migrations

namespace {

// A database as attntune wrote it at schema version 1, with rows in every table.
void make_v1(const std::string& path) {
  Connection db = Connection::open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  db.exec("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; BEGIN");
  db.exec(embedded_file("db/migrations/001_initial.sql"));
  db.exec("PRAGMA application_id = " + std::to_string(Store::kApplicationId) + "; PRAGMA user_version = 1");
  const Problem p = problem();
  Statement(db, "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)")
      .bind("NVIDIA H100 80GB HBM3", "sm_90", 132, "GPU-1111", "550.54")
      .run();
  Statement(
      db,
      "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, space_path, space_hash, family, "
      "strategy, seed, status, budget_evals, budget_seconds, device_id, started_at, ended_at) VALUES ('old', ?1, "
      "?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'search_spaces/flash_fwd_mma.yaml', '0123456789abcdef0123456789abcdef', "
      "'flash_fwd_mma', 'evo', 7, 'completed', 500, 0, 1, '2024-06-01T10:00:00.000Z', '2024-06-01T11:00:00.000Z')")
      .bind(p.json().dump(), p.b, p.h, p.hkv, p.s, p.sk, p.d, dtype_name(p.dtype), p.causal)
      .run();
  Statement(db,
            "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, space_path, space_hash, "
            "family, strategy, seed, device_id) SELECT 'live', problem, b, h, hkv, s, sk, d, dtype, causal, "
            "space_path, space_hash, family, strategy, seed, device_id FROM campaigns WHERE name = 'old'")
      .run();
  Statement cand(
      db, "INSERT INTO candidates (family, config, config_key, source_hash) VALUES ('flash_fwd_mma', ?1, ?2, 'h1')");
  for (const Config& c : {config(128, 64), config(64, 64)}) {
    cand.reset();
    cand.bind(config_json(c).dump(), config_str(c)).run();
  }
  Statement(db,
            "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, median_us, count, tflops, "
            "max_abs_err, err_bound, evaluated_at) VALUES (1, 1, 1, 1, 'ok', 250.5, 40, 280.25, 0.002, 0.01, "
            "'2024-06-01T10:30:00.000Z')")
      .run();
  Statement(db,
            "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, error) VALUES (1, 2, 2, 1, "
            "'resources', 'needs 240 KiB shared memory, the device has 227 KiB')")
      .run();
  Statement(db,
            "INSERT INTO builds (source_hash, arch, nvrtc_version, options, status, cubin, registers) VALUES "
            "('h1', 'sm_90', '12.4', '-O3', 'ok', x'7f454c46', 128)")
      .run();
  db.exec("COMMIT");
}

// Tables, columns (sorted by name: ALTER TABLE appends), indexes and foreign keys of a database.
std::vector<std::string> schema_signature(const Connection& db) {
  std::vector<std::string> sig;
  Statement objects(
      db, "SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name");
  std::vector<std::pair<std::string, std::string>> tables;
  while (objects.step()) {
    sig.push_back(objects.text(0) + " " + objects.text(1) + " on " + objects.text(2));
    if (objects.text(0) == "table") tables.emplace_back(objects.text(1), "");
  }
  for (const auto& [table, unused] : tables) {
    Statement cols(
        db, "SELECT name, type, \"notnull\", IFNULL(dflt_value, 'NULL'), pk FROM pragma_table_info(?1) ORDER BY name");
    cols.bind(table);
    while (cols.step())
      sig.push_back(table + "." + cols.text(0) + " " + cols.text(1) + " notnull=" + cols.text(2) +
                    " default=" + cols.text(3) + " pk=" + cols.text(4));
    Statement idx(db, "SELECT name, \"unique\" FROM pragma_index_list(?1) ORDER BY name");
    idx.bind(table);
    while (idx.step()) {
      std::string line = table + " index " + (idx.text(0).rfind("sqlite_autoindex", 0) == 0 ? "(auto)" : idx.text(0)) +
                         " unique=" + idx.text(1) + " (";
      Statement cols_of(db, "SELECT IFNULL(name, '<expr>') FROM pragma_index_info(?1) ORDER BY seqno");
      cols_of.bind(idx.text(0));
      while (cols_of.step()) line += cols_of.text(0) + " ";
      sig.push_back(line + ")");
    }
    Statement fks(db,
                  "SELECT \"table\", \"from\", \"to\", on_delete FROM pragma_foreign_key_list(?1) ORDER BY \"from\"");
    fks.bind(table);
    while (fks.step())
      sig.push_back(table + "." + fks.text(1) + " -> " + fks.text(0) + "." + fks.text(2) + " on delete " + fks.text(3));
  }
  std::sort(sig.begin(), sig.end());
  return sig;
}

}  // namespace

TEST(StoreMigration, FromVersion1KeepsEveryRow) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  make_v1(path);
  ASSERT_EQ(header_u32(path, 60), 1u);
  {
    Store store = Store::open(path, Store::Mode::kExisting);
    EXPECT_EQ(store.schema_version(), Store::current_schema_version());
    auto rows = store.campaigns();
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].spec.name, "old");
    EXPECT_EQ(rows[0].status, "completed");
    EXPECT_EQ(rows[0].stop_reason, "not recorded (schema version 1)");
    EXPECT_EQ(rows[0].started_at, "2024-06-01T10:00:00.000Z");
    EXPECT_EQ(rows[0].ended_at, "2024-06-01T11:00:00.000Z");
    EXPECT_EQ(rows[0].evaluations, 2);
    EXPECT_EQ(rows[0].ok, 1);
    EXPECT_EQ(rows[0].best_us, 250.5);
    EXPECT_EQ(rows[1].spec.name, "live");
    EXPECT_EQ(rows[1].status, "running");
    EXPECT_EQ(rows[1].stop_reason, "") << "a running campaign will say why it stops";

    auto evals = store.campaign_evaluations(rows[0].id);
    ASSERT_EQ(evals.size(), 2u);
    EXPECT_EQ(evals[0].config, config(128, 64));
    EXPECT_EQ(evals[0].record.median_us, 250.5);
    EXPECT_EQ(evals[0].record.min_us, std::nullopt) << "not measured under version 1";
    EXPECT_EQ(evals[0].record.tflops, 280.25);
    EXPECT_EQ(evals[1].record.status, "resources");
    EXPECT_EQ(evals[1].record.error, "needs 240 KiB shared memory, the device has 227 KiB");

    BestQuery q;
    q.problem = problem();
    auto best = store.best(q);
    ASSERT_EQ(best.size(), 1u);
    EXPECT_EQ(best[0].campaign, "old");
    EXPECT_EQ(best[0].evaluated_at, "2024-06-01T10:30:00.000Z");
    EXPECT_EQ(best[0].gpu, "NVIDIA H100 80GB HBM3");

    auto build = store.find_build({"h1", "sm_90", "12.4", "-O3"});
    ASSERT_TRUE(build);
    EXPECT_EQ(build->cubin,
              "\x7f"
              "ELF");
    EXPECT_EQ(build->registers, 128);

    // The new columns work and numbering continues.
    EXPECT_EQ(store.upsert_device(h100()), 1);
    store.record_evaluation(rows[0].id, store.upsert_candidate("flash_fwd_mma", config(64, 64), "h1"), 1, ok_eval(240));
    evals = store.campaign_evaluations(rows[0].id);
    ASSERT_EQ(evals.size(), 3u);
    EXPECT_EQ(evals[2].record.min_us, ok_eval(240).min_us);
  }
  EXPECT_EQ(header_u32(path, 60), std::uint32_t(Store::current_schema_version()));
  EXPECT_EQ(header_u32(path, 68), Store::kApplicationId);
}

TEST(StoreMigration, MigratedAndFreshSchemasAreTheSame) {
  TempDir dir;
  make_v1(dir.file("v1.db"));
  Store::open(dir.file("v1.db"), Store::Mode::kExisting);
  Store::open(dir.file("fresh.db"), Store::Mode::kCreate);
  Connection migrated = Connection::open(dir.file("v1.db"), SQLITE_OPEN_READONLY);
  Connection fresh = Connection::open(dir.file("fresh.db"), SQLITE_OPEN_READONLY);
  const auto a = schema_signature(migrated), b = schema_signature(fresh);
  EXPECT_GT(a.size(), 40u);
  EXPECT_EQ(a, b);
}

TEST(StoreMigration, ReadOnlyOpenOfAnOlderSchemaLeavesTheFileAsItIs) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  make_v1(path);
  const auto before = snapshot(dir.path());
  {
    Store store = Store::open(path, Store::Mode::kReadOnly);
    EXPECT_EQ(store.schema_version(), Store::current_schema_version());
    auto rows = store.campaigns();
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].stop_reason, "not recorded (schema version 1)");
    BestQuery q;
    EXPECT_EQ(store.best(q).size(), 1u);
    EXPECT_THROW(store.upsert_device(h100()), SqliteError) << "still read-only";
  }
  EXPECT_EQ(snapshot(dir.path()), before);
  EXPECT_EQ(header_u32(path, 60), 1u);
}

TEST(StoreMigration, MigrationsAreNumberedFromOne) {
  int expected = 1;
  for (const auto& [path, text] : embedded_files()) {
    if (path.rfind("db/migrations/", 0) != 0) continue;
    EXPECT_EQ(std::stoi(path.substr(14, 3)), expected++) << path;
    EXPECT_FALSE(text.empty());
  }
  EXPECT_EQ(expected - 1, Store::current_schema_version());
}
}  // namespace test_db_open
