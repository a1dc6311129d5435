#include "db/store.hpp"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "db/sqlite.hpp"

namespace attntune {

namespace fs = std::filesystem;
using sqlite::Connection;
using sqlite::Statement;
using sqlite::Transaction;

namespace {

// ---------------------------------------------------------------------------------------------
// Schema versions: db/migrations/NNN_name.sql takes a database from version NNN-1 to NNN; the
// highest NNN is the current version, and db/schema.sql creates it directly.

const std::map<int, std::string_view>& migrations() {
  static const std::map<int, std::string_view> steps = [] {
    const std::string prefix = "db/migrations/";
    std::map<int, std::string_view> m;
    for (const auto& [path, text] : embedded_files()) {
      if (path.rfind(prefix, 0) != 0) continue;
      const std::string name = path.substr(prefix.size());
      if (name.size() < 5 ||
          !std::all_of(name.begin(), name.begin() + 3, [](unsigned char c) { return std::isdigit(c); }) ||
          name[3] != '_')
        throw std::logic_error("migration file name is not NNN_name.sql: " + path);
      const int version = std::stoi(name.substr(0, 3));
      if (!m.emplace(version, text).second) throw std::logic_error("two migrations to version " + name.substr(0, 3));
    }
    int expected = 1;
    for (const auto& [version, text] : m)
      if (version != expected++)
        throw std::logic_error(fmt::format("migration to version {} is missing", expected - 1));
    if (m.empty()) throw std::logic_error("no migrations embedded (db/migrations/*.sql)");
    return m;
  }();
  return steps;
}

// PRAGMA takes no bound parameters; the values written this way are integers of this binary.
void set_header_pragmas(Connection& db, int version) {
  db.exec(fmt::format("PRAGMA application_id = {}; PRAGMA user_version = {};",
                      static_cast<std::int32_t>(Store::kApplicationId), version));
}

std::int64_t pragma_int(const Connection& db, std::string_view pragma) {
  Statement st(db, pragma);
  return st.step() ? st.int64(0) : 0;
}

// ---------------------------------------------------------------------------------------------
// The file, judged from its header before SQLite opens it (https://sqlite.org/fileformat.html).
// Reading it ourselves is what keeps a refused file untouched: SQLite would already create -wal and
// -shm files on a WAL database, or run a hot journal's rollback, before we could ask it anything.

enum class FileState {
  kMissing,
  kEmpty,    // 0 bytes, or SQLite with no tables and no application id
  kOurs,     // attntune, schema version `version` (<= current)
  kPending,  // WAL database whose header is not written yet (content still in -wal): ask SQLite
};

struct Inspection {
  FileState state = FileState::kMissing;
  int version = 0;
  bool wal_mode = false;    // header says WAL
  bool side_files = false;  // -wal or -shm exists: a connection may be open, the header may be stale
};

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}
std::uint32_t be16(const unsigned char* p) { return (std::uint32_t{p[0]} << 8) | p[1]; }

bool file_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw InputError(fmt::format("database '{}' {}", path, why));
}

Inspection inspect(const std::string& path) {
  Inspection in;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || status.type() == fs::file_type::not_found) return in;  // kMissing
  if (status.type() == fs::file_type::directory) refuse(path, "is a directory");
  std::ifstream f(path, std::ios::binary);
  if (!f) refuse(path, fmt::format("cannot be read: {}", std::strerror(errno)));
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) refuse(path, fmt::format("cannot be read: {}", ec.message()));
  in.side_files = file_exists(path + "-wal") || file_exists(path + "-shm");
  if (size == 0) {
    in.state = in.side_files ? FileState::kPending : FileState::kEmpty;
    return in;
  }

  std::array<unsigned char, 108> h{};
  f.read(reinterpret_cast<char*>(h.data()), h.size());
  const auto got = static_cast<std::size_t>(f.gcount());
  static constexpr char kMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f', 'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};
  if (got < 100 || std::memcmp(h.data(), kMagic, sizeof kMagic) != 0)
    refuse(path, "is not an SQLite database (so not an attntune database)");

  const std::uint32_t raw_page = be16(&h[16]);
  const std::uint32_t page_size = raw_page == 1 ? 65536 : raw_page;
  const bool page_ok = page_size >= 512 && page_size <= 65536 && (page_size & (page_size - 1)) == 0;
  if (!page_ok || h[21] != 64 || h[22] != 32 || h[23] != 32 || h[18] < 1 || h[18] > 2 || h[19] < 1 || h[19] > 2)
    refuse(path, "is corrupt (its SQLite header is invalid)");
  in.wal_mode = h[18] == 2 || h[19] == 2;

  // With no -wal file the main file is all there is, so its size must hold every page.
  if (!in.side_files) {
    if (size % page_size != 0 || size < page_size)
      refuse(path,
             fmt::format("is corrupt (truncated: {} bytes is not a whole number of {}-byte pages)", size, page_size));
    const std::uint32_t pages = be32(&h[28]);
    const bool pages_valid = pages != 0 && be32(&h[24]) == be32(&h[92]);
    if (pages_valid && std::uintmax_t{pages} * page_size > size)
      refuse(path, fmt::format("is corrupt (truncated: its header counts {} pages, the file holds {})", pages,
                               size / page_size));
  }

  const std::uint32_t app_id = be32(&h[68]);
  const int version = static_cast<int>(be32(&h[60]));
  if (app_id != 0 && app_id != Store::kApplicationId)
    refuse(path,
           fmt::format("is not an attntune database (SQLite application_id 0x{:08x}); refusing to touch it", app_id));
  if (app_id == Store::kApplicationId) {
    // Versions only grow, so a stale header can only understate it.
    if (version > Store::current_schema_version())
      refuse(path, fmt::format("was written by a newer attntune (schema version {}; this binary knows up to {})",
                               version, Store::current_schema_version()));
    if (version >= 1) {
      in.state = FileState::kOurs;
      in.version = version;
      return in;
    }
    if (!in.side_files) refuse(path, "is corrupt (attntune application_id without a schema version)");
    in.state = FileState::kPending;
    return in;
  }

  // No application id: an empty database (ours to initialize), or another program's tables.
  if (got < 108 || (h[100] != 0x0D && h[100] != 0x05)) refuse(path, "is corrupt (its schema page is invalid)");
  const bool has_tables = h[100] == 0x05 || be16(&h[103]) > 0;
  if (has_tables)
    refuse(path, "is not an attntune database (an SQLite database of another program); refusing to touch it");
  in.state = in.side_files ? FileState::kPending : FileState::kEmpty;
  return in;
}

// The same judgement, asked of SQLite once the file is open and before anything is written: the
// header can be stale while a WAL file holds the latest commits. Returns the schema version, 0 for an
// empty database.
int verify_opened(const Connection& db, const std::string& path) {
  static const std::array<const char*, 5> kTables = {"devices", "campaigns", "candidates", "builds", "evaluations"};
  try {
    const auto app_id = static_cast<std::uint32_t>(pragma_int(db, "PRAGMA application_id"));
    const int version = static_cast<int>(pragma_int(db, "PRAGMA user_version"));
    Statement count(db, "SELECT count(*) FROM sqlite_master");
    count.step();
    const std::int64_t objects = count.int64(0);
    if (app_id == 0 && objects == 0) return 0;
    if (app_id != Store::kApplicationId)
      refuse(path,
             fmt::format("is not an attntune database (SQLite application_id 0x{:08x}); refusing to touch it", app_id));
    if (version > Store::current_schema_version())
      refuse(path, fmt::format("was written by a newer attntune (schema version {}; this binary knows up to {})",
                               version, Store::current_schema_version()));
    if (version < 1) refuse(path, "is corrupt (attntune application_id without a schema version)");
    Statement table(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
    for (const char* name : kTables) {
      table.reset();
      table.bind(name);
      if (!table.step()) refuse(path, fmt::format("is corrupt (table '{}' is missing)", name));
    }
    return version;
  } catch (const SqliteError& e) {
    if (e.is_corrupt()) refuse(path, fmt::format("is corrupt ({})", e.what()));
    throw;
  }
}

// Creates the schema (version 0) or runs the migrations after `from`, in the caller's transaction.
void bring_to_current(Connection& db, int from) {
  const int current = Store::current_schema_version();
  if (from == 0) {
    db.exec(embedded_file("db/schema.sql"));
  } else {
    {
      // A migration rewrites tables; a damaged database must not be rewritten. (Scoped: a pending
      // statement would lock the tables the migration drops or alters.)
      Statement check(db, "PRAGMA quick_check");
      if (check.step() && check.text(0) != "ok")
        throw SqliteError("PRAGMA quick_check", SQLITE_CORRUPT, check.text(0), db.path());
    }
    for (const auto& [version, sql] : migrations())
      if (version > from) db.exec(sql);
  }
  set_header_pragmas(db, current);
  Statement fk(db, "PRAGMA foreign_key_check");
  if (fk.step())
    throw std::logic_error(fmt::format("schema version {}: foreign key violation in table {}", current, fk.text(0)));
}

// kCreate and kExisting: a read-write connection in WAL mode, created or migrated as needed.
std::pair<std::unique_ptr<Connection>, int> open_writable(const std::string& path, Store::Mode mode,
                                                          const Inspection& in) {
  int flags = SQLITE_OPEN_READWRITE;
  if (mode == Store::Mode::kCreate) flags |= SQLITE_OPEN_CREATE;
  std::unique_ptr<Connection> db;
  try {
    db = std::make_unique<Connection>(Connection::open(path, flags));
  } catch (const SqliteError& e) {
    if (in.state != FileState::kMissing) throw;
    const fs::path dir = fs::absolute(path).parent_path();
    std::error_code ec;
    throw InputError(fmt::format("cannot create database '{}': {}", path,
                                 fs::is_directory(dir, ec)
                                     ? std::string(sqlite3_errstr(e.result_code()))
                                     : fmt::format("directory '{}' does not exist", dir.string())));
  }
  db->set_busy_timeout(Store::kDefaultBusyTimeout);
  db->exec("PRAGMA foreign_keys = ON");
  int version = verify_opened(*db, path);
  if (version == 0 && mode != Store::Mode::kCreate) refuse(path, "is empty, not an attntune database");
  // Written only now that the file is known to be ours (or empty). NORMAL is durable in WAL mode
  // against a crash of the process; only a power loss can drop the last commits.
  db->exec("PRAGMA journal_mode = WAL");
  db->exec("PRAGMA synchronous = NORMAL");
  if (version < Store::current_schema_version()) {
    Transaction tx(*db);
    // Another process may have created or migrated it while we waited for the write lock.
    version = verify_opened(*db, path);
    if (version < Store::current_schema_version()) bring_to_current(*db, version);
    tx.commit();
    version = Store::current_schema_version();
  }
  return {std::move(db), version};
}

std::string uri_escape(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '%' || c == '?' || c == '#')
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    else
      out += c;
  }
  return out;
}

// kReadOnly: queries only, never a write to the file.
std::pair<std::unique_ptr<Connection>, int> open_read_only(const std::string& path, const Inspection& in) {
  int flags = SQLITE_OPEN_READONLY;
  std::string name = path;
  bool query_only = false;
  if (in.wal_mode && !in.side_files) {
    // SQLite reads a WAL database through its -shm index. A read-only connection would create -wal
    // and -shm and could not remove them when it closes; a read-write one removes them when it is
    // the last connection, so it is the one used when it can create them, made read-only by
    // query_only. A directory that is not writable cannot hold a writer's -wal either, so the file
    // is read as immutable then.
    const fs::path dir = fs::absolute(path).parent_path();
    if (::access(dir.c_str(), W_OK) == 0) {
      flags = SQLITE_OPEN_READWRITE;  // never SQLITE_OPEN_CREATE: the file exists
      query_only = true;
    } else {
      flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI;
      name = "file:" + uri_escape(fs::absolute(path).string()) + "?immutable=1";
    }
  }
  std::unique_ptr<Connection> db;
  int version = 0;
  try {
    db = std::make_unique<Connection>(Connection::open(name, flags));
    db->set_busy_timeout(Store::kDefaultBusyTimeout);
    if (query_only) db->exec("PRAGMA query_only = 1");
    version = verify_opened(*db, path);
  } catch (const SqliteError& e) {
    // A full disk (or quota, or file-size limit): SQLite cannot make or grow the -shm index. While
    // the -wal log is empty or absent every committed row is in the main file, so reading that
    // file as immutable gives exactly the database (a failed open may leave an empty -wal behind).
    const int code = e.primary_code();
    std::error_code ec;
    const fs::path wal = path + "-wal";
    const bool wal_empty = !fs::exists(wal, ec) || fs::file_size(wal, ec) == 0;
    if (!in.wal_mode || !wal_empty || (code != SQLITE_FULL && code != SQLITE_IOERR && code != SQLITE_CANTOPEN)) throw;
    db.reset();
    db = std::make_unique<Connection>(Connection::open(
        "file:" + uri_escape(fs::absolute(path).string()) + "?immutable=1", SQLITE_OPEN_READONLY | SQLITE_OPEN_URI));
    version = verify_opened(*db, path);
  }
  if (version == 0) refuse(path, "is empty, not an attntune database");
  if (version == Store::current_schema_version()) return {std::move(db), version};

  // An older schema is brought up to date in a private in-memory copy; the file stays as it is
  // until a writing command (tune) migrates it.
  auto mem = std::make_unique<Connection>(Connection::open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE));
  {
    Transaction read(*db, Transaction::Kind::kDeferred);  // one snapshot for the whole copy
    sqlite::copy_database(*db, *mem);
    read.commit();
  }
  mem->exec("PRAGMA foreign_keys = ON");
  Transaction tx(*mem);
  bring_to_current(*mem, version);
  tx.commit();
  mem->exec("PRAGMA query_only = 1");
  return {std::move(mem), Store::current_schema_version()};
}

Problem problem_from_columns(const Statement& st, int col) {
  Problem p;
  p.b = st.int64(col);
  p.h = st.int64(col + 1);
  p.hkv = st.int64(col + 2);
  p.s = st.int64(col + 3);
  p.sk = st.int64(col + 4);
  p.d = st.int64(col + 5);
  p.dtype = st.text(col + 6) == "bf16" ? DType::kBf16 : DType::kFp16;
  p.causal = st.int64(col + 7) != 0;
  return p;
}

Config config_from_text(const std::string& text) { return config_from_json(nlohmann::json::parse(text)); }

// Test hook of the reliability suite (tests/reliability/): with ATTNTUNE_TEST_COMMIT_DELAY_MS=N set,
// record_evaluation holds its transaction open N ms after writing the row, and says so on stderr,
// so that a SIGKILL can be landed inside a commit. Unset (the product's normal state): nothing.
int test_commit_delay_ms() {
  static const int ms = [] {
    const char* v = std::getenv("ATTNTUNE_TEST_COMMIT_DELAY_MS");
    return v && *v ? std::max(0, std::atoi(v)) : 0;
  }();
  return ms;
}

std::optional<std::string> null_if_empty(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

const CampaignSpace* CampaignSpec::space_of(const std::string& family_name) const {
  for (const CampaignSpace& s : spaces)
    if (s.family == family_name) return &s;
  return nullptr;
}

void set_spaces(CampaignSpec& spec, std::vector<CampaignSpace> spaces) {
  if (spaces.empty()) throw std::logic_error("set_spaces: a campaign has at least one space");
  std::stable_sort(spaces.begin(), spaces.end(),
                   [](const CampaignSpace& a, const CampaignSpace& b) { return a.family < b.family; });
  for (std::size_t i = 1; i < spaces.size(); ++i)
    if (spaces[i].family == spaces[i - 1].family)
      throw InputError(fmt::format("{} and {} are both spaces of template '{}'; a campaign searches one space per "
                                   "template",
                                   spaces[i - 1].path, spaces[i].path, spaces[i].family));
  if (spaces.size() == 1) {
    spec.family = spaces[0].family;
    spec.space_path = spaces[0].path;
    spec.space_hash = spaces[0].hash;
    spec.space_text = spaces[0].text;
  } else {
    std::vector<std::string> families, paths;
    std::string identity;
    for (const CampaignSpace& s : spaces) {
      families.push_back(s.family);
      paths.push_back(s.path);
      identity += s.family + ":" + s.hash + "\n";
    }
    spec.family = fmt::format("{}", fmt::join(families, "+"));
    spec.space_path = fmt::format("{}", fmt::join(paths, " + "));
    spec.space_hash = content_hash(identity);
    spec.space_text.clear();
  }
  spec.spaces = std::move(spaces);
}

namespace {

// The spaces a spec writes: its list, or the one space its campaign-level fields describe.
std::vector<CampaignSpace> spaces_to_write(const CampaignSpec& spec) {
  if (!spec.spaces.empty()) return spec.spaces;
  return {CampaignSpace{spec.family, spec.space_path, spec.space_hash, spec.space_text}};
}

// "template 'a'", or for a campaign of several: "templates a and b", "templates a, b and c"
std::string templates_phrase(const std::string& family) {
  std::vector<std::string> names;
  for (std::size_t at = 0;;) {
    const std::size_t plus = family.find('+', at);
    names.push_back(family.substr(at, plus - at));
    if (plus == std::string::npos) break;
    at = plus + 1;
  }
  if (names.size() == 1) return fmt::format("template '{}'", family);
  const std::string last = names.back();
  names.pop_back();
  return fmt::format("templates {} and {}", fmt::join(names, ", "), last);
}

std::vector<CampaignSpace> read_campaign_spaces(Connection& db, std::int64_t campaign_id) {
  Statement st(db,
               "SELECT family, space_path, space_hash, space_text FROM campaign_spaces WHERE campaign_id = ?1 "
               "ORDER BY family");
  st.bind(campaign_id);
  std::vector<CampaignSpace> out;
  while (st.step()) out.push_back({st.text(0), st.text(1), st.text(2), st.text(3)});
  return out;
}

}  // namespace

int Store::current_schema_version() { return migrations().rbegin()->first; }

Store Store::open(const std::string& path, Mode mode) {
  const Inspection in = inspect(path);
  if (in.state == FileState::kMissing && mode != Mode::kCreate) refuse(path, "does not exist");
  if (in.state == FileState::kEmpty && mode != Mode::kCreate) refuse(path, "is empty, not an attntune database");
  if (in.state != FileState::kMissing && mode != Mode::kReadOnly) {
    // Write-protected by its mode: not written, even by root (whom access() would let through).
    std::error_code ec;
    const fs::perms perms = fs::status(path, ec).permissions();
    const bool no_write_bit = !ec && (perms & (fs::perms::owner_write | fs::perms::group_write |
                                               fs::perms::others_write)) == fs::perms::none;
    if (no_write_bit || ::access(path.c_str(), W_OK) != 0)
      refuse(path, fmt::format("is read-only (mode {:04o}); commands that record results need it writable, those that "
                               "only read it (best, campaigns, report, export) do not",
                               static_cast<unsigned>(perms) & 07777));
  }
  auto [db, version] = mode == Mode::kReadOnly ? open_read_only(path, in) : open_writable(path, mode, in);
  return Store(path, std::move(db), version);
}

Store::Store(std::string path, std::unique_ptr<Connection> db, int schema_version)
    : path_(std::move(path)), db_(std::move(db)), schema_version_(schema_version) {}
Store::Store(Store&&) noexcept = default;
Store& Store::operator=(Store&&) noexcept = default;
Store::~Store() = default;

Connection& Store::db() {
  if (!db_) throw std::logic_error("use of a moved-from Store");
  return *db_;
}

void Store::set_busy_timeout(std::chrono::milliseconds timeout) { db().set_busy_timeout(timeout); }

std::int64_t Store::upsert_device(const DeviceInfo& device) {
  Transaction tx(db());
  Statement find(db(), "SELECT id FROM devices WHERE name = ?1 AND arch = ?2 AND IFNULL(uuid, '') = ?3");
  find.bind(device.name, device.arch, device.uuid);
  std::int64_t id = 0;
  if (find.step()) {
    id = find.int64(0);
    // A driver upgrade does not make it another GPU. (Nothing is written when nothing changed.)
    Statement update(db(),
                     "UPDATE devices SET sm_count = ?2, driver_version = ?3 "
                     "WHERE id = ?1 AND (sm_count IS NOT ?2 OR driver_version IS NOT ?3)");
    update.bind(id, device.sm_count, device.driver_version).run();
  } else {
    Statement insert(db(),
                     "INSERT INTO devices (name, arch, sm_count, uuid, driver_version) VALUES (?1, ?2, ?3, ?4, ?5)");
    insert.bind(device.name, device.arch, device.sm_count, null_if_empty(device.uuid), device.driver_version).run();
    id = db().last_insert_rowid();
  }
  tx.commit();
  return id;
}

std::optional<std::int64_t> Store::check_resume(const CampaignSpec& spec) {
  Statement find(db(),
                 "SELECT id, b, h, hkv, s, sk, d, dtype, causal, space_hash, space_path, family "
                 "FROM campaigns WHERE name = ?1");
  find.bind(spec.name);
  if (!find.step()) return std::nullopt;
  const Problem problem = problem_from_columns(find, 1);
  const std::string space_hash = find.text(9), space_path = find.text(10), family = find.text(11);
  const std::string hint = "start a new campaign with another --campaign name";
  if (problem != spec.problem)
    throw InputError(fmt::format("campaign '{}' tunes problem {}; it cannot be resumed for problem {} ({})", spec.name,
                                 problem.str(), spec.problem.str(), hint));
  if (family != spec.family)
    throw InputError(fmt::format("campaign '{}' tunes {}; it cannot be resumed with {} ({})", spec.name,
                                 templates_phrase(family), templates_phrase(spec.family), hint));
  const std::int64_t id = find.int64(0);
  if (space_hash != spec.space_hash) {
    // The same families: name the space that changed.
    for (const CampaignSpace& now : spaces_to_write(spec))
      for (const CampaignSpace& then : read_campaign_spaces(db(), id))
        if (then.family == now.family && then.hash != now.hash)
          throw InputError(fmt::format(
              "campaign '{}' was started with another search space{} ('{}', hash {}; now '{}', hash {}); it cannot "
              "be resumed ({})",
              spec.name, family.find('+') == std::string::npos ? "" : " for template '" + now.family + "'", then.path,
              then.hash, now.path, now.hash, hint));
    throw InputError(fmt::format(
        "campaign '{}' was started with another search space ('{}', hash {}; now '{}', hash {}); it cannot be "
        "resumed ({})",
        spec.name, space_path, space_hash, spec.space_path, spec.space_hash, hint));
  }
  return id;
}

void Store::check_writable() {
  Transaction probe(db());  // takes the write lock (waiting up to the busy timeout), then rolls back
}

std::int64_t Store::open_campaign(const CampaignSpec& spec, std::int64_t device_id) {
  Transaction tx(db());
  std::int64_t id = 0;
  if (const std::optional<std::int64_t> existing = check_resume(spec)) {
    id = *existing;
    Statement resume(db(),
                     "UPDATE campaigns SET status = 'running', stop_reason = '', ended_at = NULL, "
                     "budget_evals = ?2, budget_seconds = ?3, device_id = ?4, strategy = ?5, seed = ?6, "
                     "space_path = ?7, space_text = CASE WHEN ?8 = '' THEN space_text ELSE ?8 END WHERE id = ?1");
    resume
        .bind(id, spec.budget_evals, spec.budget_seconds, device_id, spec.strategy, spec.seed, spec.space_path,
              spec.space_text)
        .run();
  } else {
    const Problem& p = spec.problem;
    Statement insert(db(),
                     "INSERT INTO campaigns (name, problem, b, h, hkv, s, sk, d, dtype, causal, space_path, "
                     "space_hash, family, strategy, seed, budget_evals, budget_seconds, device_id, space_text) "
                     "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)");
    insert
        .bind(spec.name, p.json().dump(), p.b, p.h, p.hkv, p.s, p.sk, p.d, dtype_name(p.dtype), p.causal,
              spec.space_path, spec.space_hash, spec.family, spec.strategy, spec.seed, spec.budget_evals,
              spec.budget_seconds, device_id, spec.space_text)
        .run();
    id = db().last_insert_rowid();
  }
  // Each space of the campaign: the latest run's path, and its text unless it brings none.
  Statement space(db(),
                  "INSERT INTO campaign_spaces (campaign_id, family, space_path, space_hash, space_text) "
                  "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (campaign_id, family) DO UPDATE SET "
                  "space_path = excluded.space_path, space_hash = excluded.space_hash, space_text = "
                  "CASE WHEN excluded.space_text = '' THEN space_text ELSE excluded.space_text END");
  for (const CampaignSpace& sp : spaces_to_write(spec)) {
    space.reset();
    space.bind(id, sp.family, sp.path, sp.hash, sp.text).run();
  }
  tx.commit();
  return id;
}

void Store::finish_campaign(std::int64_t campaign_id, const std::string& status, const std::string& stop_reason) {
  Statement update(db(),
                   "UPDATE campaigns SET status = ?2, stop_reason = ?3, "
                   "ended_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?1");
  update.bind(campaign_id, status, stop_reason).run();
  if (db().changes() != 1) throw std::logic_error(fmt::format("finish_campaign: no campaign with id {}", campaign_id));
}

std::optional<std::int64_t> Store::find_campaign(const std::string& name) {
  Statement find(db(), "SELECT id FROM campaigns WHERE name = ?1");
  find.bind(name);
  if (!find.step()) return std::nullopt;
  return find.int64(0);
}

std::int64_t Store::upsert_candidate(const std::string& family, const Config& config, const std::string& source_hash) {
  const std::string key = config_str(config);
  Transaction tx(db());
  Statement insert(db(),
                   "INSERT INTO candidates (family, config, config_key, source_hash) VALUES (?1, ?2, ?3, ?4) "
                   "ON CONFLICT (family, config_key, source_hash) DO NOTHING");
  insert.bind(family, config_json(config).dump(), key, source_hash).run();
  Statement find(db(), "SELECT id FROM candidates WHERE family = ?1 AND config_key = ?2 AND source_hash = ?3");
  find.bind(family, key, source_hash);
  if (!find.step()) throw std::logic_error("upsert_candidate: the row just written is missing");
  const std::int64_t id = find.int64(0);
  tx.commit();
  return id;
}

std::optional<BuildRecord> Store::find_build(const BuildKey& key) {
  Statement find(db(),
                 "SELECT status, cubin, log, registers, smem_static, spill_stores, spill_loads, local_bytes, "
                 "compile_ms FROM builds "
                 "WHERE source_hash = ?1 AND arch = ?2 AND nvrtc_version = ?3 AND options = ?4");
  find.bind(key.source_hash, key.arch, key.nvrtc_version, key.options);
  if (!find.step()) return std::nullopt;
  BuildRecord b;
  b.status = find.text(0);
  b.cubin = find.blob(1);
  b.log = find.text(2);
  b.registers = static_cast<int>(find.int64(3));
  b.smem_static = static_cast<int>(find.int64(4));
  b.spill_stores = static_cast<int>(find.int64(5));
  b.spill_loads = static_cast<int>(find.int64(6));
  b.local_bytes = static_cast<int>(find.int64(7));
  b.compile_ms = find.real(8);
  return b;
}

void Store::put_build(const BuildKey& key, const BuildRecord& b) {
  Statement put(db(),
                "INSERT INTO builds (source_hash, arch, nvrtc_version, options, status, cubin, log, registers, "
                "smem_static, spill_stores, spill_loads, local_bytes, compile_ms) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) "
                "ON CONFLICT (source_hash, arch, nvrtc_version, options) DO UPDATE SET "
                "status = excluded.status, cubin = excluded.cubin, log = excluded.log, "
                "registers = excluded.registers, smem_static = excluded.smem_static, "
                "spill_stores = excluded.spill_stores, spill_loads = excluded.spill_loads, "
                "local_bytes = excluded.local_bytes, compile_ms = excluded.compile_ms, "
                "created_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')");
  std::optional<sqlite::Blob> cubin;
  if (!b.cubin.empty()) cubin = sqlite::Blob{b.cubin};
  put.bind(key.source_hash, key.arch, key.nvrtc_version, key.options, b.status, cubin, b.log, b.registers,
           b.smem_static, b.spill_stores, b.spill_loads, b.local_bytes, b.compile_ms)
      .run();
}

std::int64_t Store::record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                      const EvalRecord& e, Phase phase) {
  Transaction tx(db());
  // seq: the next number in the campaign, read under the write lock (the unique (campaign_id, seq)
  // index makes the MAX a single lookup).
  Statement insert(db(),
                   "INSERT INTO evaluations (campaign_id, seq, candidate_id, device_id, status, error, median_us, "
                   "min_us, max_us, stdev_us, count, tflops, max_abs_err, err_bound, phase) VALUES (?1, "
                   "(SELECT IFNULL(MAX(seq), 0) + 1 FROM evaluations WHERE campaign_id = ?1), "
                   "?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)");
  insert
      .bind(campaign_id, candidate_id, device_id, e.status, e.error, e.median_us, e.min_us, e.max_us, e.stdev_us,
            e.count, e.tflops, e.max_abs_err, e.err_bound, phase == Phase::kFinal ? "final" : "search")
      .run();
  const std::int64_t id = db().last_insert_rowid();
  if (const int ms = test_commit_delay_ms(); ms > 0) {
    Statement seq(db(), "SELECT seq FROM evaluations WHERE id = ?1");
    seq.bind(id);
    seq.step();
    std::fprintf(stderr, "attntune: test hook: evaluation %lld of campaign %lld written, commit in %d ms\n",
                 static_cast<long long>(seq.int64(0)), static_cast<long long>(campaign_id), ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  tx.commit();
  return id;
}

std::vector<EvaluationRow> Store::campaign_evaluations(std::int64_t campaign_id) {
  Statement st(db(),
               "SELECT c.config, e.status, e.error, e.median_us, e.min_us, e.max_us, e.stdev_us, e.tflops, "
               "e.max_abs_err, e.err_bound, e.count, e.seq, e.evaluated_at, c.family "
               "FROM evaluations e JOIN candidates c ON c.id = e.candidate_id "
               "WHERE e.campaign_id = ?1 AND e.phase = 'search' ORDER BY e.seq");
  st.bind(campaign_id);
  std::vector<EvaluationRow> out;
  while (st.step()) {
    EvalRecord r;
    r.status = st.text(1);
    r.error = st.text(2);
    r.median_us = st.opt_real(3);
    r.min_us = st.opt_real(4);
    r.max_us = st.opt_real(5);
    r.stdev_us = st.opt_real(6);
    r.tflops = st.opt_real(7);
    r.max_abs_err = st.opt_real(8);
    r.err_bound = st.opt_real(9);
    r.count = st.int64(10);
    out.push_back({st.int64(11), config_from_text(st.text(0)), std::move(r), st.text(12), st.text(13)});
  }
  return out;
}

void Store::put_ranking(std::int64_t campaign_id, std::int64_t device_id, const std::vector<RankingEntry>& entries) {
  Transaction tx(db());
  Statement clear(db(), "DELETE FROM rankings WHERE campaign_id = ?1");
  clear.bind(campaign_id).run();
  Statement insert(db(),
                   "INSERT INTO rankings (campaign_id, rank, candidate_id, device_id, median_us, tflops, max_abs_err, "
                   "spread_pct, rounds) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  int rank = 1;
  for (const RankingEntry& e : entries) {
    insert.reset();
    insert
        .bind(campaign_id, rank++, e.candidate_id, e.device_id ? e.device_id : device_id, e.median_us, e.tflops,
              e.max_abs_err, e.spread_pct, e.rounds)
        .run();
  }
  tx.commit();
}

std::vector<RankedRow> Store::ranking(std::int64_t campaign_id) {
  Statement st(db(),
               "SELECT r.rank, c.config, r.candidate_id, r.median_us, r.tflops, r.max_abs_err, r.spread_pct, r.rounds, "
               "c.family, r.device_id FROM rankings r JOIN candidates c ON c.id = r.candidate_id WHERE r.campaign_id = ?1 ORDER BY r.rank");
  st.bind(campaign_id);
  std::vector<RankedRow> out;
  while (st.step()) {
    RankedRow row;
    row.rank = static_cast<int>(st.int64(0));
    row.config = config_from_text(st.text(1));
    row.entry.candidate_id = st.int64(2);
    row.entry.median_us = st.real(3);
    row.entry.tflops = st.real(4);
    row.entry.max_abs_err = st.real(5);
    row.entry.spread_pct = st.real(6);
    row.entry.rounds = static_cast<int>(st.int64(7));
    row.family = st.text(8);
    row.entry.device_id = st.int64(9);
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<Problem> Store::problems_with_results(const std::string& family) {
  Statement st(db(),
               "SELECT c.b, c.h, c.hkv, c.s, c.sk, c.d, c.dtype, c.causal FROM campaigns c WHERE EXISTS (SELECT 1 "
               "FROM evaluations e JOIN candidates k ON k.id = e.candidate_id WHERE e.campaign_id = c.id AND "
               "e.status = 'ok' AND k.family = ?1) ORDER BY c.id");
  st.bind(family);
  std::vector<Problem> out;
  while (st.step()) {
    Problem p = problem_from_columns(st, 0);
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

namespace {

// A best row from a query whose first columns are: median_us, tflops, max_abs_err, the time it
// was measured, family, config, device name, arch, source_hash (ranked and evaluated rows alike).
BestRow read_best_row(const Statement& st, const std::string& campaign, const Problem& problem) {
  BestRow row;
  row.campaign = campaign;
  row.problem = problem;
  row.median_us = st.real(0);
  row.tflops = st.real(1);
  row.max_abs_err = st.real(2);
  row.evaluated_at = st.text(3);
  row.family = st.text(4);
  row.config = config_from_text(st.text(5));
  row.gpu = st.text(6);
  row.arch = st.text(7);
  row.source_hash = st.text(8);
  return row;
}

}  // namespace

std::vector<BestRow> Store::best(const BestQuery& q) {
  if (q.top < 1) throw InputError(fmt::format("best: top must be at least 1 (got {})", q.top));
  // One snapshot for all campaigns, so a concurrent writer's commit cannot split the answer.
  Transaction read(db(), Transaction::Kind::kDeferred);

  Statement camps(db(),
                  "SELECT id, name, b, h, hkv, s, sk, d, dtype, causal FROM campaigns "
                  "WHERE (?1 IS NULL OR name = ?1) AND (?2 IS NULL OR (b = ?2 AND h = ?3 AND hkv = ?4 AND "
                  "s = ?5 AND sk = ?6 AND d = ?7 AND dtype = ?8 AND causal = ?9)) ORDER BY id");
  camps.bind(q.campaign);
  if (q.problem) {
    const Problem& p = *q.problem;
    camps.bind_at(2, p.b);
    camps.bind_at(3, p.h);
    camps.bind_at(4, p.hkv);
    camps.bind_at(5, p.s);
    camps.bind_at(6, p.sk);
    camps.bind_at(7, p.d);
    camps.bind_at(8, dtype_name(p.dtype));
    camps.bind_at(9, p.causal);
  }

  // Each campaign's ok evaluations, fastest first, straight off the evaluations_best index (which
  // holds candidate_id, so the walk reads no table rows and needs no sort; ties go to the lower
  // candidate, then the earlier evaluation): the first time a (template, config) shows
  // up is its best median, so a campaign needs only as many entries as it takes to see `top`
  // distinct configs, however many evaluations it holds. Only the rows kept are read in full.
  // A campaign with a ranking (its final re-timing) puts the ranking first.
  Statement ranked(db(),
                   "SELECT r.median_us, r.tflops, r.max_abs_err, r.ranked_at, c.family, c.config, d.name, d.arch, "
                   "c.source_hash, c.config_key FROM rankings r JOIN candidates c ON c.id = r.candidate_id "
                   "JOIN devices d ON d.id = r.device_id WHERE r.campaign_id = ?1 ORDER BY r.rank");
  Statement walk(db(),
                 "SELECT e.id, e.median_us, e.candidate_id FROM evaluations e "
                 "WHERE e.campaign_id = ?1 AND e.status = 'ok' ORDER BY e.median_us, e.candidate_id, e.id");
  Statement config_of(db(), "SELECT family, config_key FROM candidates WHERE id = ?1");
  std::map<std::int64_t, std::pair<std::string, std::string>> candidate_keys;  // id -> (family, config_key)
  struct Found {
    double key;                  // the order: the median, never ahead of what the campaign ranked above it
    std::int64_t campaign_id, local;  // ties: campaign, then its own order
    std::int64_t evaluation_id;  // 0 for a ranked row (filled in `row`)
    std::optional<BestRow> row;  // a ranked row, complete
    std::string campaign;
    Problem problem;
  };
  std::vector<Found> found;
  while (camps.step()) {
    const std::int64_t campaign_id = camps.int64(0);
    const std::string name = camps.text(1);
    const Problem problem = problem_from_columns(camps, 2);
    std::set<std::pair<std::string, std::string>> seen;
    double floor = 0;  // the last ranked median: unranked configs never go ahead of it
    std::int64_t local = 0;
    ranked.reset();
    ranked.bind(campaign_id);
    while (static_cast<int>(seen.size()) < q.top && ranked.step()) {
      BestRow row = read_best_row(ranked, name, problem);
      if (!seen.insert({row.family, ranked.text(9)}).second) continue;
      floor = std::max(floor, row.median_us);
      found.push_back({floor, campaign_id, local++, 0, std::move(row), name, problem});
    }
    walk.reset();
    walk.bind(campaign_id);
    while (static_cast<int>(seen.size()) < q.top && walk.step()) {
      const std::int64_t candidate = walk.int64(2);
      auto key = candidate_keys.find(candidate);
      if (key == candidate_keys.end()) {
        config_of.reset();
        config_of.bind(candidate);
        if (!config_of.step()) throw std::logic_error("evaluation of a missing candidate");
        key = candidate_keys.emplace(candidate, std::pair(config_of.text(0), config_of.text(1))).first;
      }
      if (seen.insert(key->second).second)
        found.push_back({std::max(floor, walk.real(1)), campaign_id, local++, walk.int64(0), std::nullopt, name, problem});
    }
  }
  ranked.reset();
  walk.reset();
  config_of.reset();
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.key, a.campaign_id, a.local) < std::tie(b.key, b.campaign_id, b.local);
  });
  if (found.size() > static_cast<std::size_t>(q.top)) found.resize(static_cast<std::size_t>(q.top));

  Statement detail(db(),
                   "SELECT e.median_us, e.tflops, e.max_abs_err, e.evaluated_at, c.family, c.config, d.name, d.arch, "
                   "c.source_hash FROM evaluations e JOIN candidates c ON c.id = e.candidate_id JOIN devices d ON d.id = e.device_id "
                   "WHERE e.id = ?1");
  std::vector<BestRow> out;
  for (Found& f : found) {
    if (f.row) {
      out.push_back(std::move(*f.row));
      continue;
    }
    detail.reset();
    detail.bind(f.evaluation_id);
    if (!detail.step()) throw std::logic_error("evaluation vanished inside a read transaction");
    out.push_back(read_best_row(detail, f.campaign, f.problem));
  }
  detail.reset();
  read.commit();
  return out;
}

namespace {

// The campaign columns every CampaignRow query reads, in read_campaign_row's order.
constexpr const char* kCampaignColumns =
    "SELECT c.id, c.name, c.b, c.h, c.hkv, c.s, c.sk, c.d, c.dtype, c.causal, c.space_path, c.space_hash, "
    "c.family, c.strategy, c.seed, c.budget_evals, c.budget_seconds, c.status, c.stop_reason, "
    "c.started_at, IFNULL(c.ended_at, ''), d.name, d.arch, "
    "(SELECT count(*) FROM evaluations e WHERE e.campaign_id = c.id AND e.phase = 'search'), "
    "(SELECT count(*) FROM evaluations e WHERE e.campaign_id = c.id AND e.phase = 'search' AND e.status = 'ok'), "
    "IFNULL(rk.median_us, best.median_us), IFNULL(rk.tflops, best.tflops), c.space_text "
    "FROM campaigns c JOIN devices d ON d.id = c.device_id "
    "LEFT JOIN rankings rk ON rk.campaign_id = c.id AND rk.rank = 1 "
    "LEFT JOIN evaluations best ON best.id = (SELECT e.id FROM evaluations e "
    "  WHERE e.campaign_id = c.id AND e.status = 'ok' ORDER BY e.median_us, e.candidate_id, e.id LIMIT 1) ";

CampaignRow read_campaign_row(Statement& st) {
  CampaignRow r;
  r.id = st.int64(0);
  r.spec.name = st.text(1);
  r.spec.problem = problem_from_columns(st, 2);
  r.spec.space_path = st.text(10);
  r.spec.space_hash = st.text(11);
  r.spec.family = st.text(12);
  r.spec.strategy = st.text(13);
  r.spec.seed = st.int64(14);
  r.spec.budget_evals = st.int64(15);
  r.spec.budget_seconds = st.real(16);
  r.status = st.text(17);
  r.stop_reason = st.text(18);
  r.started_at = st.text(19);
  r.ended_at = st.text(20);
  r.gpu = st.text(21);
  r.arch = st.text(22);
  r.evaluations = st.int64(23);
  r.ok = st.int64(24);
  r.best_us = st.opt_real(25);
  r.best_tflops = st.opt_real(26);
  r.spec.space_text = st.text(27);
  return r;
}

}  // namespace

std::vector<CampaignRow> Store::campaigns() {
  Statement st(db(), std::string(kCampaignColumns) + "ORDER BY c.id");
  std::vector<CampaignRow> out;
  while (st.step()) out.push_back(read_campaign_row(st));
  for (CampaignRow& r : out) r.spec.spaces = read_campaign_spaces(db(), r.id);
  return out;
}

std::optional<CampaignRow> Store::campaign_row(const std::string& name) {
  Statement st(db(), std::string(kCampaignColumns) + "WHERE c.name = ?1");
  st.bind(name);
  if (!st.step()) return std::nullopt;
  CampaignRow row = read_campaign_row(st);
  st.reset();
  row.spec.spaces = read_campaign_spaces(db(), row.id);
  return row;
}

}  // namespace attntune
