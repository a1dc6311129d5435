// Opening the Store: the file judged from its header before SQLite touches it, the connection
// (read-write in WAL mode, or read-only without a trace), and the schema created or migrated.
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "core/embedded.hpp"
#include "core/error.hpp"
#include "db/filesystem.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"

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

// The first bytes of the file: the 100-byte database header and the first b-tree page's header.
struct FileHeader {
  std::array<unsigned char, 108> bytes{};
  std::size_t got = 0;  // how many the file held
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

FileHeader read_header(std::ifstream& f) {
  FileHeader h;
  f.read(reinterpret_cast<char*>(h.bytes.data()), h.bytes.size());
  h.got = static_cast<std::size_t>(f.gcount());
  return h;
}

// An SQLite file with a valid header and, when it is all there is (no -wal), every page. Returns
// whether the header says WAL.
bool check_sqlite_header(const std::string& path, const FileHeader& header, std::uintmax_t size, bool side_files) {
  const auto& h = header.bytes;
  static constexpr char kMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f', 'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};
  if (header.got < 100 || std::memcmp(h.data(), kMagic, sizeof kMagic) != 0)
    refuse(path, "is not an SQLite database (so not an attntune database)");

  const std::uint32_t raw_page = be16(&h[16]);
  const std::uint32_t page_size = raw_page == 1 ? 65536 : raw_page;
  const bool page_ok = page_size >= 512 && page_size <= 65536 && (page_size & (page_size - 1)) == 0;
  if (!page_ok || h[21] != 64 || h[22] != 32 || h[23] != 32 || h[18] < 1 || h[18] > 2 || h[19] < 1 || h[19] > 2)
    refuse(path, "is corrupt (its SQLite header is invalid)");

  // With no -wal file the main file is all there is, so its size must hold every page.
  if (!side_files) {
    if (size % page_size != 0 || size < page_size)
      refuse(path,
             fmt::format("is corrupt (truncated: {} bytes is not a whole number of {}-byte pages)", size, page_size));
    const std::uint32_t pages = be32(&h[28]);
    const bool pages_valid = pages != 0 && be32(&h[24]) == be32(&h[92]);
    if (pages_valid && std::uintmax_t{pages} * page_size > size)
      refuse(path, fmt::format("is corrupt (truncated: its header counts {} pages, the file holds {})", pages,
                               size / page_size));
  }
  return h[18] == 2 || h[19] == 2;
}

// Whose database it is, from its application id, schema version and schema page: sets in.state
// (and in.version), or refuses it.
void judge_owner(const std::string& path, const FileHeader& header, Inspection& in) {
  const auto& h = header.bytes;
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
      return;
    }
    if (!in.side_files) refuse(path, "is corrupt (attntune application_id without a schema version)");
    in.state = FileState::kPending;
    return;
  }

  // No application id: an empty database (ours to initialize), or another program's tables.
  if (header.got < 108 || (h[100] != 0x0D && h[100] != 0x05)) refuse(path, "is corrupt (its schema page is invalid)");
  const bool has_tables = h[100] == 0x05 || be16(&h[103]) > 0;
  if (has_tables)
    refuse(path, "is not an attntune database (an SQLite database of another program); refusing to touch it");
  in.state = in.side_files ? FileState::kPending : FileState::kEmpty;
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
  const FileHeader header = read_header(f);
  in.wal_mode = check_sqlite_header(path, header, size, in.side_files);
  judge_owner(path, header, in);
  return in;
}

// ---------------------------------------------------------------------------------------------
// Damage (docs/RELIABILITY.md, "Damaged databases"): the schema's tables and indexes, every page as
// it is read, and a writer's b-trees before its first write.

// (type, name, table) of the tables and indexes a schema creates (SQLite's own indexes of UNIQUE
// constraints aside: no statement can drop them).
using SchemaObjects = std::set<std::tuple<std::string, std::string, std::string>>;

SchemaObjects schema_objects(const Connection& db) {
  Statement st(db,
               "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index') AND name NOT LIKE "
               "'sqlite\\_%' ESCAPE '\\'");
  SchemaObjects out;
  while (st.step()) out.emplace(st.text(0), st.text(1), st.text(2));
  return out;
}

// The CREATE TABLE and CREATE [UNIQUE] INDEX ... ON statements of a schema script, read off its
// words (comments skipped): executing db/schema.sql in memory to ask SQLite costs a millisecond,
// a tenth of `best`. StoreDamage.EveryTableAndIndexOfTheSchemaIsRequired holds the two equal.
SchemaObjects created_objects(std::string_view sql) {
  std::vector<std::string> words;
  for (std::size_t i = 0; i < sql.size();) {
    const unsigned char c = static_cast<unsigned char>(sql[i]);
    if (c == '-' && i + 1 < sql.size() && sql[i + 1] == '-') {
      while (i < sql.size() && sql[i] != '\n') ++i;
    } else if (c == '\'') {
      for (++i; i < sql.size() && sql[i] != '\''; ++i) {
      }
      ++i;
    } else if (std::isalnum(c) || c == '_') {
      std::size_t j = i;
      while (j < sql.size() && (std::isalnum(static_cast<unsigned char>(sql[j])) || sql[j] == '_')) ++j;
      words.emplace_back(sql.substr(i, j - i));
      i = j;
    } else {
      if (c == ';' || c == '(') words.emplace_back(1, static_cast<char>(c));
      ++i;
    }
  }
  const auto upper = [](std::string w) {
    for (char& ch : w) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return w;
  };
  SchemaObjects out;
  for (std::size_t i = 0; i + 2 < words.size(); ++i) {
    if (upper(words[i]) != "CREATE") continue;
    std::size_t j = i + 1;
    if (upper(words[j]) == "UNIQUE") ++j;
    const std::string kind = upper(words[j]);
    if (kind != "TABLE" && kind != "INDEX") continue;
    ++j;
    if (j + 2 < words.size() && upper(words[j]) == "IF") j += 3;  // IF NOT EXISTS
    if (j >= words.size()) break;
    const std::string name = words[j];
    if (kind == "TABLE") {
      out.emplace("table", name, name);
    } else if (j + 2 < words.size() && upper(words[j + 1]) == "ON") {
      out.emplace("index", name, words[j + 2]);
    }
  }
  return out;
}

// The tables and indexes of schema version `version`: db/schema.sql's for the current one, and as
// the migrations make them from nothing for an older one (a database that is about to be migrated).
const SchemaObjects& expected_objects(int version) {
  static std::mutex mutex;
  static std::map<int, SchemaObjects> made;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = made.find(version);
  if (it == made.end()) {
    if (version == Store::current_schema_version()) {
      it = made.emplace(version, created_objects(embedded_file("db/schema.sql"))).first;
    } else {
      Connection mem = Connection::open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
      for (const auto& [v, sql] : migrations()) {
        if (v > version) break;
        Transaction tx(mem);
        mem.exec(sql);
        tx.commit();
      }
      it = made.emplace(version, schema_objects(mem)).first;
    }
  }
  return it->second;
}

// Every table and index its version has: a dropped index makes queries slow and, for a UNIQUE one,
// lets a writer store a row twice; a missing table loses what it held.
void check_schema_objects(const Connection& db, const std::string& path, int version) {
  const SchemaObjects have = schema_objects(db);
  for (const auto& object : expected_objects(version)) {
    if (have.count(object)) continue;
    const auto& [type, name, table] = object;
    refuse(path, type == "table" ? fmt::format("is damaged: its table '{}' is missing", name)
                                 : fmt::format("is damaged: its index '{}' of table '{}' is missing (dropped?)", name,
                                               table));
  }
}

// Every connection of the Store: SQLite checks each b-tree page in full as it reads it (every
// cell inside the page, not only its header), so a damaged page a query reaches is SQLITE_CORRUPT,
// exit 2, instead of rows read from garbage.
void check_pages_as_read(Connection& db) { db.exec("PRAGMA cell_size_check = ON"); }

// A writer's check before its first write (Store::Options::tables): PRAGMA integrity_check of the
// tables it uses, with their indexes, or of the whole file. It reads every page of those b-trees and
// their overflow chains, checks that each index holds exactly its table's rows (so a page replaced
// by a valid page from elsewhere, as a copy made while a writer checkpointed leaves, is found too,
// which quick_check does not) and, for the whole file, the free list and that every page is used
// once. CHECK constraints aside: the values were checked when written, and evaluating them took 4/5
// of the time on a table of 300,000 evaluations. Memory-mapped I/O for the walk: 3-7 times faster
// than reading 1 GB of pages through read(2); cell_size_check off for it, as it repeats integrity_check's
// own check of every cell (twice the time). docs/RELIABILITY.md, part 8, measures it.
void check_integrity(Connection& db, const std::string& path, const std::vector<std::string>& tables) {
  struct Settings {
    Connection& db;
    std::int64_t mmap_size, cell_size_check;
    explicit Settings(Connection& c)
        : db(c),
          mmap_size(pragma_int(c, "PRAGMA mmap_size")),
          cell_size_check(pragma_int(c, "PRAGMA cell_size_check")) {
      db.exec("PRAGMA ignore_check_constraints = ON; PRAGMA cell_size_check = OFF; PRAGMA mmap_size = 4294967296");
    }
    ~Settings() {
      // Never left on: the writes that follow check their constraints.
      const std::string reset = fmt::format("PRAGMA ignore_check_constraints = OFF; PRAGMA cell_size_check = {}; "
                                            "PRAGMA mmap_size = {}",
                                            cell_size_check, mmap_size);
      sqlite3_exec(db.get(), reset.c_str(), nullptr, nullptr, nullptr);
    }
  } settings(db);
  std::vector<std::string> problems;
  std::size_t count = 0;
  const auto run = [&](const std::string& pragma) {
    Statement st(db, pragma);
    while (st.step()) {
      // One message per row, some of several lines; "*** in database main ***" heads the first.
      std::string text = st.text(0);
      if (text == "ok") continue;
      for (std::size_t at = 0; at < text.size();) {
        std::size_t nl = text.find('\n', at);
        if (nl == std::string::npos) nl = text.size();
        const std::string line = text.substr(at, nl - at);
        if (!line.empty() && line.rfind("***", 0) != 0 && ++count <= 2) problems.push_back(line);
        at = nl + 1;
      }
    }
  };
  try {
    if (tables.empty()) run("PRAGMA integrity_check");
    for (const std::string& t : tables) run(fmt::format("PRAGMA integrity_check('{}')", t));  // our own names
  } catch (const SqliteError& e) {
    if (!e.is_corrupt()) throw;
    problems.push_back(sqlite3_errstr(e.result_code())), ++count;
  }
  if (count == 0) return;
  refuse(path, fmt::format("is damaged (SQLite's integrity_check{}: {}{}); it was left as it is: restore it from a "
                           "copy",
                           tables.empty() ? "" : fmt::format(" of {}", fmt::join(tables, ", ")),
                           fmt::join(problems, "; "),
                           count > problems.size() ? fmt::format("; {} more", count - problems.size()) : ""));
}

// The same judgement, asked of SQLite once the file is open and before anything is written: the
// header can be stale while a WAL file holds the latest commits. Returns the schema version, 0 for an
// empty database.
int verify_opened(const Connection& db, const std::string& path) {
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
    check_schema_objects(db, path, version);
    return version;
  } catch (const SqliteError& e) {
    if (e.is_corrupt())
      refuse(path, fmt::format("is corrupt (its schema cannot be read: {})", sqlite3_errstr(e.result_code())));
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
// Migration

// A migration rewrites tables; a damaged database must not be rewritten. (Scoped: a pending
// statement would lock the tables the migration drops or alters.)
void refuse_damaged(Connection& db) {
  Statement check(db, "PRAGMA quick_check");
  if (check.step() && check.text(0) != "ok")
    throw SqliteError("PRAGMA quick_check", SQLITE_CORRUPT, check.text(0), db.path());
}

void check_foreign_keys(Connection& db, int version) {
  Statement fk(db, "PRAGMA foreign_key_check");
  if (fk.step())
    throw std::logic_error(fmt::format("schema version {}: foreign key violation in table {}", version, fk.text(0)));
}

// Creates the schema (version 0) or runs the migrations after `from`, in the caller's transaction.
void bring_to_current(Connection& db, int from) {
  const int current = Store::current_schema_version();
  if (from == 0) {
    db.exec(embedded_file("db/schema.sql"));
  } else {
    refuse_damaged(db);
    for (const auto& [version, sql] : migrations())
      if (version > from) db.exec(sql);
  }
  set_header_pragmas(db, current);
  check_foreign_keys(db, current);
}

// ---------------------------------------------------------------------------------------------
// kCreate and kExisting: a read-write connection in WAL mode, created or migrated as needed.

std::unique_ptr<Connection> connect_writable(const std::string& path, Store::Mode mode, const Inspection& in) {
  int flags = SQLITE_OPEN_READWRITE;
  if (mode == Store::Mode::kCreate) flags |= SQLITE_OPEN_CREATE;
  try {
    return std::make_unique<Connection>(Connection::open(path, flags));
  } catch (const SqliteError& e) {
    if (in.state != FileState::kMissing) throw;
    const fs::path dir = fs::absolute(path).parent_path();
    std::error_code ec;
    throw InputError(fmt::format("cannot create database '{}': {}", path,
                                 fs::is_directory(dir, ec)
                                     ? std::string(sqlite3_errstr(e.result_code()))
                                     : fmt::format("directory '{}' does not exist", dir.string())));
  }
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

std::string immutable_uri(const std::string& path) {
  return "file:" + uri_escape(fs::absolute(path).string()) + "?immutable=1";
}

// The integrity check on a connection of its own that writes nothing: the file read as immutable
// when no other connection has it open (no -wal or -shm: SQLite would create both for a read-write
// connection, and one that met damage left its empty -wal behind), else read-only beside the
// connections that have it. False when the file cannot be read that way (the caller checks it on
// its own connection).
bool check_integrity_apart(const std::string& path, bool side_files, const std::vector<std::string>& tables) {
  std::unique_ptr<Connection> db;
  try {
    db = std::make_unique<Connection>(
        side_files ? Connection::open(path, SQLITE_OPEN_READONLY)
                   : Connection::open(immutable_uri(path), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI));
    db->set_busy_timeout(Store::kDefaultBusyTimeout);
  } catch (const SqliteError& e) {
    if (e.is_corrupt()) refuse(path, fmt::format("is corrupt ({})", sqlite3_errstr(e.result_code())));
    return false;
  }
  if (verify_opened(*db, path) > 0) check_integrity(*db, path, tables);
  return true;
}

// A writer's check before its first write (Store::Options).
bool checked_apart(const std::string& path, const Inspection& in, const Store::Options& options) {
  if (!options.check_integrity || (in.state != FileState::kOurs && in.state != FileState::kPending)) return true;
  return check_integrity_apart(path, in.side_files, options.tables);
}

// Creates or migrates the schema under the write lock; returns the current version.
int migrate_file(Connection& db, const std::string& path) {
  Transaction tx(db);
  // Another process may have created or migrated it while we waited for the write lock.
  const int version = verify_opened(db, path);
  if (version < Store::current_schema_version()) bring_to_current(db, version);
  tx.commit();
  return Store::current_schema_version();
}

std::pair<std::unique_ptr<Connection>, int> open_writable(const std::string& path, Store::Mode mode,
                                                          const Inspection& in, const Store::Options& options) {
  // Before the first write (the journal mode below, a migration, the command's own).
  const bool checked = checked_apart(path, in, options);
  std::unique_ptr<Connection> db = connect_writable(path, mode, in);
  db->set_busy_timeout(Store::kDefaultBusyTimeout);
  db->exec("PRAGMA foreign_keys = ON");
  check_pages_as_read(*db);
  int version = verify_opened(*db, path);
  if (version == 0 && mode != Store::Mode::kCreate) refuse(path, "is empty, not an attntune database");
  if (version > 0 && options.check_integrity && !checked) check_integrity(*db, path, options.tables);
  // Written only now that the file is known to be ours (or empty). NORMAL is durable in WAL mode
  // against a crash of the process; only a power loss can drop the last commits.
  db->exec("PRAGMA journal_mode = WAL");
  db->exec("PRAGMA synchronous = NORMAL");
  if (version < Store::current_schema_version()) version = migrate_file(*db, path);
  return {std::move(db), version};
}

// ---------------------------------------------------------------------------------------------
// kReadOnly: queries only, never a write to the file.

// How a read-only open names and opens the file.
struct ReadOnlyTarget {
  std::string name;
  int flags = SQLITE_OPEN_READONLY;
  bool query_only = false;
};

ReadOnlyTarget read_only_target(const std::string& path, const Inspection& in) {
  ReadOnlyTarget t{path};
  if (in.wal_mode && !in.side_files) {
    // SQLite reads a WAL database through its -shm index. A read-only connection would create -wal
    // and -shm and could not remove them when it closes; a read-write one removes them when it is
    // the last connection, so it is the one used when it can create them, made read-only by
    // query_only. A directory that is not writable cannot hold a writer's -wal either, so the file
    // is read as immutable then.
    const fs::path dir = fs::absolute(path).parent_path();
    if (::access(dir.c_str(), W_OK) == 0) {
      t.flags = SQLITE_OPEN_READWRITE;  // never SQLITE_OPEN_CREATE: the file exists
      t.query_only = true;
    } else {
      t.flags = SQLITE_OPEN_READONLY | SQLITE_OPEN_URI;
      t.name = immutable_uri(path);
    }
  }
  return t;
}

// A full disk (or quota, or file-size limit): SQLite cannot make or grow the -shm index. While the
// -wal log is empty or absent every committed row is in the main file, so reading that file as
// immutable gives exactly the database (a failed open may leave an empty -wal behind).
bool can_read_as_immutable(const std::string& path, const Inspection& in, const SqliteError& e) {
  const int code = e.primary_code();
  std::error_code ec;
  const fs::path wal = path + "-wal";
  const bool wal_empty = !fs::exists(wal, ec) || fs::file_size(wal, ec) == 0;
  return in.wal_mode && wal_empty && (code == SQLITE_FULL || code == SQLITE_IOERR || code == SQLITE_CANTOPEN);
}

std::pair<std::unique_ptr<Connection>, int> connect_read_only(const std::string& path, const Inspection& in) {
  const ReadOnlyTarget target = read_only_target(path, in);
  std::unique_ptr<Connection> db;
  try {
    db = std::make_unique<Connection>(Connection::open(target.name, target.flags));
    db->set_busy_timeout(Store::kDefaultBusyTimeout);
    if (target.query_only) db->exec("PRAGMA query_only = 1");
    check_pages_as_read(*db);
    const int version = verify_opened(*db, path);
    return {std::move(db), version};
  } catch (const SqliteError& e) {
    if (!can_read_as_immutable(path, in, e)) throw;
  }
  db.reset();
  db = std::make_unique<Connection>(Connection::open(immutable_uri(path), SQLITE_OPEN_READONLY | SQLITE_OPEN_URI));
  check_pages_as_read(*db);
  const int version = verify_opened(*db, path);
  return {std::move(db), version};
}

// An older schema is brought up to date in a private in-memory copy; the file stays as it is until a
// writing command (tune) migrates it.
std::unique_ptr<Connection> migrated_copy(Connection& db, int version) {
  auto mem = std::make_unique<Connection>(Connection::open(":memory:", SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE));
  {
    Transaction read(db, Transaction::Kind::kDeferred);  // one snapshot for the whole copy
    sqlite::copy_database(db, *mem);
    read.commit();
  }
  mem->exec("PRAGMA foreign_keys = ON");
  Transaction tx(*mem);
  bring_to_current(*mem, version);
  tx.commit();
  mem->exec("PRAGMA query_only = 1");
  return mem;
}

std::pair<std::unique_ptr<Connection>, int> open_read_only(const std::string& path, const Inspection& in) {
  auto [db, version] = connect_read_only(path, in);
  if (version == 0) refuse(path, "is empty, not an attntune database");
  if (version == Store::current_schema_version()) return {std::move(db), version};
  return {migrated_copy(*db, version), Store::current_schema_version()};
}

// Write-protected by its mode: not written, even by root (whom access() would let through).
void refuse_write_protected(const std::string& path) {
  std::error_code ec;
  const fs::perms perms = fs::status(path, ec).permissions();
  const bool no_write_bit = !ec && (perms & (fs::perms::owner_write | fs::perms::group_write |
                                             fs::perms::others_write)) == fs::perms::none;
  if (no_write_bit || ::access(path.c_str(), W_OK) != 0)
    refuse(path, fmt::format("is read-only (mode {:04o}); commands that record results need it writable, those that "
                             "only read it (best, campaigns, report, export) do not",
                             static_cast<unsigned>(perms) & 07777));
}

// serve, submit and tune on NFS, CIFS, ...: db/filesystem.hpp says why not.
void refuse_network_filesystem(const std::string& path) {
  const Filesystem f = filesystem_of(path);
  if (!f.network) return;
  refuse(path, fmt::format("is on a network filesystem ({}), where SQLite's locks do not hold between hosts: two "
                           "hosts writing it can corrupt it or lose results. Keep a database per host on a local "
                           "disk and combine them with `attntune merge` (as tools/slurm/ does), or pass "
                           "--allow-network-fs if no other host ever opens it",
                           f.type));
}

}  // namespace

int Store::current_schema_version() { return migrations().rbegin()->first; }

Store Store::open(const std::string& path, Mode mode, const Options& options) {
  if (options.refuse_network_fs) refuse_network_filesystem(path);
  const Inspection in = inspect(path);
  if (in.state == FileState::kMissing && mode != Mode::kCreate) refuse(path, "does not exist");
  if (in.state == FileState::kEmpty && mode != Mode::kCreate) refuse(path, "is empty, not an attntune database");
  if (in.state != FileState::kMissing && mode != Mode::kReadOnly) refuse_write_protected(path);
  auto [db, version] = mode == Mode::kReadOnly ? open_read_only(path, in) : open_writable(path, mode, in, options);
  return Store(path, std::move(db), version);
}

Store Store::another_connection() const {
  if (!db_) throw std::logic_error("use of a moved-from Store");
  auto db = std::make_unique<Connection>(Connection::open(path_, SQLITE_OPEN_READWRITE));
  db->set_busy_timeout(kDefaultBusyTimeout);
  db->exec("PRAGMA foreign_keys = ON");
  db->exec("PRAGMA synchronous = NORMAL");
  check_pages_as_read(*db);
  return Store(path_, std::move(db), schema_version_);
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

void Store::check_integrity(const std::vector<std::string>& tables) {
  const bool side_files = file_exists(path_ + "-wal") || file_exists(path_ + "-shm");
  if (!check_integrity_apart(path_, side_files, tables)) attntune::check_integrity(db(), path_, tables);
}

void Store::set_busy_timeout(std::chrono::milliseconds timeout) { db().set_busy_timeout(timeout); }

}  // namespace attntune
