#include "db/sqlite.hpp"

#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace attntune {

namespace {

// Whether the database's filesystem is (nearly) full, or one of its files is within a page of the
// process's file-size limit. SQLite reports an EFBIG write as a plain I/O error and its system errno
// is whatever errno was by then, so an I/O error is judged by looking, once it has happened.
bool space_exhausted(const std::string& db_path) {
  if (db_path.empty()) return false;
  constexpr unsigned long long kLargestWrite = 65536 + 64;  // a page of the largest size and its frame header
  struct statvfs vfs {};
  const std::string dir = [&] {
    const auto slash = db_path.rfind('/');
    return slash == std::string::npos ? std::string(".") : db_path.substr(0, slash + 1);
  }();
  if (::statvfs(dir.c_str(), &vfs) == 0 && static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize < kLargestWrite)
    return true;
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return false;
  for (const char* suffix : {"", "-wal", "-shm"}) {
    struct stat st {};
    if (::stat((db_path + suffix).c_str(), &st) == 0 &&
        static_cast<unsigned long long>(st.st_size) + kLargestWrite > limit.rlim_cur)
      return true;
  }
  return false;
}

// A write that failed for want of space: SQLITE_FULL (ENOSPC), or an I/O error with ENOSPC, EFBIG
// or EDQUOT, or with the disk or the file-size limit found full.
bool out_of_space(int rc, int system_errno, const std::string& db_path) {
  const int primary = rc & 0xff;
  if (primary == SQLITE_FULL) return true;
  if (primary != SQLITE_IOERR) return false;
  return system_errno == ENOSPC || system_errno == EFBIG || system_errno == EDQUOT || space_exhausted(db_path);
}

std::string describe(const std::string& call, int rc, const std::string& message, const std::string& db_path,
                     int system_errno) {
  const std::string where = db_path.empty() ? "SQLite" : fmt::format("database '{}'", db_path);
  std::string detail = fmt::format("{}: {}, {}", call, message, sqlite_code_name(rc));
  if (system_errno != 0) detail += fmt::format(", {}", std::strerror(system_errno));
  if (out_of_space(rc, system_errno, db_path))
    return fmt::format("{} cannot be written: no space left (the disk or quota is full, or the file-size limit is "
                       "reached) ({})",
                       where, detail);
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return fmt::format("{} is locked by another writer ({})", where, detail);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return fmt::format("{} is corrupt or not a database ({})", where, detail);
    default:
      return fmt::format("{}: {}", where, detail);
  }
}

// Corruption is bad input, like any database that is not ours (exit 2); a database locked by another
// writer, or a full disk, is the environment (exit 3): the input is fine, the machine cannot take it
// now; anything else is a failure of the work (exit 1).
ExitCode exit_code_for(int rc, int system_errno, const std::string& db_path) {
  const int primary = rc & 0xff;
  if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB) return ExitCode::kBadInput;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED || out_of_space(rc, system_errno, db_path))
    return ExitCode::kEnvironment;
  return ExitCode::kFailed;
}

}  // namespace

SqliteError::SqliteError(std::string call, int result_code, const std::string& message, const std::string& db_path,
                         int system_errno)
    : Error(exit_code_for(result_code, system_errno, db_path), describe(call, result_code, message, db_path, system_errno)),
      call_(std::move(call)),
      result_code_(result_code) {}

bool SqliteError::is_corrupt() const noexcept {
  return primary_code() == SQLITE_CORRUPT || primary_code() == SQLITE_NOTADB;
}

const char* sqlite_code_name(int rc) {
  switch (rc & 0xff) {
    case SQLITE_OK:
      return "SQLITE_OK";
    case SQLITE_ERROR:
      return "SQLITE_ERROR";
    case SQLITE_INTERNAL:
      return "SQLITE_INTERNAL";
    case SQLITE_PERM:
      return "SQLITE_PERM";
    case SQLITE_ABORT:
      return "SQLITE_ABORT";
    case SQLITE_BUSY:
      return "SQLITE_BUSY";
    case SQLITE_LOCKED:
      return "SQLITE_LOCKED";
    case SQLITE_NOMEM:
      return "SQLITE_NOMEM";
    case SQLITE_READONLY:
      return "SQLITE_READONLY";
    case SQLITE_INTERRUPT:
      return "SQLITE_INTERRUPT";
    case SQLITE_IOERR:
      return "SQLITE_IOERR";
    case SQLITE_CORRUPT:
      return "SQLITE_CORRUPT";
    case SQLITE_NOTFOUND:
      return "SQLITE_NOTFOUND";
    case SQLITE_FULL:
      return "SQLITE_FULL";
    case SQLITE_CANTOPEN:
      return "SQLITE_CANTOPEN";
    case SQLITE_PROTOCOL:
      return "SQLITE_PROTOCOL";
    case SQLITE_EMPTY:
      return "SQLITE_EMPTY";
    case SQLITE_SCHEMA:
      return "SQLITE_SCHEMA";
    case SQLITE_TOOBIG:
      return "SQLITE_TOOBIG";
    case SQLITE_CONSTRAINT:
      return "SQLITE_CONSTRAINT";
    case SQLITE_MISMATCH:
      return "SQLITE_MISMATCH";
    case SQLITE_MISUSE:
      return "SQLITE_MISUSE";
    case SQLITE_NOLFS:
      return "SQLITE_NOLFS";
    case SQLITE_AUTH:
      return "SQLITE_AUTH";
    case SQLITE_FORMAT:
      return "SQLITE_FORMAT";
    case SQLITE_RANGE:
      return "SQLITE_RANGE";
    case SQLITE_NOTADB:
      return "SQLITE_NOTADB";
    case SQLITE_NOTICE:
      return "SQLITE_NOTICE";
    case SQLITE_WARNING:
      return "SQLITE_WARNING";
    case SQLITE_ROW:
      return "SQLITE_ROW";
    case SQLITE_DONE:
      return "SQLITE_DONE";
    default:
      return "SQLITE_UNKNOWN";
  }
}

namespace sqlite {

namespace {
std::string db_path_of(sqlite3* db) {
  if (!db) return "";
  const char* f = sqlite3_db_filename(db, "main");
  return f ? f : "";
}
}  // namespace

void check(int rc, sqlite3* db, const char* call) {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return;
  // The connection's message belongs to its last failed call; without a handle only the code is known.
  const int extended = db ? sqlite3_extended_errcode(db) : rc;
  const std::string message = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  // The OS error behind an I/O failure (ENOSPC, EFBIG, ...), which SQLite's message does not say.
  const int system_errno = db && (rc & 0xff) == SQLITE_IOERR ? sqlite3_system_errno(db) : 0;
  throw SqliteError(call, (extended & 0xff) == (rc & 0xff) ? extended : rc, message, db_path_of(db), system_errno);
}

void Connection::Close::operator()(sqlite3* db) const noexcept {
  // close_v2 defers the close until any statement still alive is finalized, so it cannot fail with
  // SQLITE_BUSY here; the last connection of a WAL database checkpoints and removes -wal and -shm.
  sqlite3_close_v2(db);
}

Connection Connection::open(const std::string& filename, int flags) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(filename.c_str(), &raw, flags | SQLITE_OPEN_EXRESCODE, nullptr);
  Connection conn(raw);  // owns the handle even when the open failed
  if (rc != SQLITE_OK) {
    const std::string message = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    throw SqliteError("sqlite3_open_v2", rc, message, filename,
                      raw && (rc & 0xff) == SQLITE_IOERR ? sqlite3_system_errno(raw) : 0);
  }
  return conn;
}

std::string Connection::path() const { return db_path_of(db_.get()); }

void Connection::exec(std::string_view sql) {
  // sqlite3_exec needs a terminated string; scripts are small.
  const std::string text(sql);
  check(sqlite3_exec(db_.get(), text.c_str(), nullptr, nullptr, nullptr), db_.get(), "sqlite3_exec");
}

void Connection::set_busy_timeout(std::chrono::milliseconds timeout) {
  check(sqlite3_busy_timeout(db_.get(), static_cast<int>(timeout.count())), db_.get(), "sqlite3_busy_timeout");
  busy_timeout_ = timeout;
}

std::int64_t Connection::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_.get()); }

int Connection::changes() const { return sqlite3_changes(db_.get()); }

void Statement::Finalize::operator()(sqlite3_stmt* s) const noexcept { sqlite3_finalize(s); }

Statement::Statement(const Connection& db, std::string_view sql) : db_(db.get()) {
  sqlite3_stmt* raw = nullptr;
  check(sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &raw, nullptr), db_, "sqlite3_prepare_v2");
  if (!raw) throw SqliteError("sqlite3_prepare_v2", SQLITE_MISUSE, "empty SQL statement", db_path_of(db_));
  stmt_.reset(raw);
}

void Statement::bind_at(int i, std::int64_t v) {
  check(sqlite3_bind_int64(stmt_.get(), i, v), db_, "sqlite3_bind_int64");
}
void Statement::bind_at(int i, double v) { check(sqlite3_bind_double(stmt_.get(), i, v), db_, "sqlite3_bind_double"); }
void Statement::bind_at(int i, std::string_view v) {
  check(sqlite3_bind_text64(stmt_.get(), i, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8), db_,
        "sqlite3_bind_text64");
}
void Statement::bind_at(int i, Blob v) {
  check(sqlite3_bind_blob64(stmt_.get(), i, v.bytes.data(), v.bytes.size(), SQLITE_TRANSIENT), db_,
        "sqlite3_bind_blob64");
}
void Statement::bind_at(int i, std::nullptr_t) { check(sqlite3_bind_null(stmt_.get(), i), db_, "sqlite3_bind_null"); }
void Statement::bind_column(int i, const Statement& from, int col) {
  check(sqlite3_bind_value(stmt_.get(), i, sqlite3_column_value(from.stmt_.get(), col)), db_, "sqlite3_bind_value");
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // Leave the statement reusable; the error stays readable on the connection until the next call.
  check(rc, db_, "sqlite3_step");
  return false;
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  // sqlite3_reset repeats the last step's error; that error was already thrown by step().
  sqlite3_reset(stmt_.get());
}

bool Statement::is_null(int col) const { return sqlite3_column_type(stmt_.get(), col) == SQLITE_NULL; }
std::int64_t Statement::int64(int col) const { return sqlite3_column_int64(stmt_.get(), col); }
double Statement::real(int col) const { return sqlite3_column_double(stmt_.get(), col); }
std::optional<double> Statement::opt_real(int col) const {
  if (is_null(col)) return std::nullopt;
  return real(col);
}
std::string Statement::text(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_.get(), col));
  const int n = sqlite3_column_bytes(stmt_.get(), col);
  return p ? std::string(p, static_cast<std::size_t>(n)) : std::string();
}
int Statement::column(std::string_view name) const {
  const int n = sqlite3_column_count(stmt_.get());
  for (int i = 0; i < n; ++i) {
    const char* c = sqlite3_column_name(stmt_.get(), i);
    if (c && name == c) return i;
  }
  std::string names;
  for (int i = 0; i < n; ++i) {
    const char* c = sqlite3_column_name(stmt_.get(), i);
    names += (i ? ", " : "") + std::string(c ? c : "?");
  }
  throw std::logic_error(fmt::format("no result column '{}' in: {} ({})", name, sqlite3_sql(stmt_.get()), names));
}

std::string Statement::blob(int col) const {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_.get(), col));
  const int n = sqlite3_column_bytes(stmt_.get(), col);
  return p ? std::string(p, static_cast<std::size_t>(n)) : std::string();
}

void copy_database(const Connection& from, Connection& to) {
  sqlite3_backup* backup = sqlite3_backup_init(to.get(), "main", from.get(), "main");
  if (!backup) check(sqlite3_errcode(to.get()), to.get(), "sqlite3_backup_init");
  const int rc = sqlite3_backup_step(backup, -1);
  // finish() reports the step's error and leaves its message on the destination connection.
  const int finish_rc = sqlite3_backup_finish(backup);
  if (rc != SQLITE_DONE) check(finish_rc != SQLITE_OK ? finish_rc : rc, to.get(), "sqlite3_backup_step");
}

Transaction::Transaction(Connection& db, Kind kind) : db_(db) {
  db_.exec(kind == Kind::kImmediate ? "BEGIN IMMEDIATE" : "BEGIN DEFERRED");
}

Transaction::~Transaction() {
  if (!open_) return;
  // Never throws: a failed rollback (e.g. the connection already rolled back after an I/O error)
  // leaves nothing more to undo.
  sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);
}

void Transaction::commit() {
  db_.exec("COMMIT");
  open_ = false;
}

}  // namespace sqlite
}  // namespace attntune
