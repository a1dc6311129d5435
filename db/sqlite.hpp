// The SQLite layer under the Store: one error checker for every sqlite3_* call, RAII for the
// connection, statements and transactions. Nothing above db/ includes this file, so sqlite3.h stays
// out of the rest of the tuner.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace attntune {

// A failed SQLite call: the call, SQLite's (extended) result code and its name, SQLite's message, the
// system error behind an I/O failure, and the database file. Corruption (SQLITE_CORRUPT,
// SQLITE_NOTADB) is bad input (exit 2), like any database that is not ours; a database locked by
// another writer (SQLITE_BUSY) or a full disk (SQLITE_FULL, or an I/O error with ENOSPC, EFBIG or
// EDQUOT) is the environment (exit 3); everything else is a failure of the work (exit 1).
class SqliteError : public Error {
 public:
  SqliteError(std::string call, int result_code, const std::string& message, const std::string& db_path,
              int system_errno = 0);
  const std::string& call() const noexcept { return call_; }
  int result_code() const noexcept { return result_code_; }  // extended code, e.g. SQLITE_BUSY_SNAPSHOT
  int primary_code() const noexcept { return result_code_ & 0xff; }
  bool is_corrupt() const noexcept;

 private:
  std::string call_;
  int result_code_;
};

// "SQLITE_BUSY", "SQLITE_CONSTRAINT", ... for the primary code of rc.
const char* sqlite_code_name(int rc);

namespace sqlite {

// The one checker: throws SqliteError unless rc is SQLITE_OK, SQLITE_ROW or SQLITE_DONE.
// db may be null (sqlite3_open_v2 before there is a handle).
void check(int rc, sqlite3* db, const char* call);

struct Blob {
  std::string_view bytes;
};

class Connection {
 public:
  // flags: SQLITE_OPEN_*. Never creates a file unless flags contain SQLITE_OPEN_CREATE.
  static Connection open(const std::string& filename, int flags);
  Connection(Connection&&) noexcept = default;
  Connection& operator=(Connection&&) noexcept = default;

  sqlite3* get() const noexcept { return db_.get(); }
  std::string path() const;  // the main database file ("" for in-memory)

  // Runs a script of statements that return no rows we need (schema, migrations, pragmas).
  void exec(std::string_view sql);
  void set_busy_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds busy_timeout() const noexcept { return busy_timeout_; }
  std::int64_t last_insert_rowid() const;
  int changes() const;

 private:
  struct Close {
    void operator()(sqlite3* db) const noexcept;
  };
  explicit Connection(sqlite3* db) : db_(db) {}
  std::unique_ptr<sqlite3, Close> db_;
  std::chrono::milliseconds busy_timeout_{0};
};

// A prepared statement. bind(...) binds its arguments to ?1, ?2, ... in order; std::nullopt,
// nullptr and empty optionals bind NULL.
class Statement {
 public:
  Statement(const Connection& db, std::string_view sql);
  Statement(Statement&&) noexcept = default;
  Statement& operator=(Statement&&) noexcept = default;

  template <class... Args>
  Statement& bind(const Args&... args) {
    int i = 0;
    (bind_at(++i, args), ...);
    return *this;
  }
  void bind_at(int i, std::int64_t v);
  void bind_at(int i, int v) { bind_at(i, static_cast<std::int64_t>(v)); }
  void bind_at(int i, bool v) { bind_at(i, static_cast<std::int64_t>(v ? 1 : 0)); }
  void bind_at(int i, double v);
  void bind_at(int i, std::string_view v);
  void bind_at(int i, const std::string& v) { bind_at(i, std::string_view(v)); }
  void bind_at(int i, const char* v) { bind_at(i, std::string_view(v)); }
  void bind_at(int i, Blob v);
  void bind_at(int i, std::nullptr_t);
  // Binds ?i to column `col` of `from`'s current row as it is stored (NULL, integer, real, text or
  // blob), so a row copied between databases reads back the same (`merge`).
  void bind_column(int i, const Statement& from, int col);
  void bind_at(int i, std::nullopt_t) { bind_at(i, nullptr); }
  template <class T>
  void bind_at(int i, const std::optional<T>& v) {
    if (v)
      bind_at(i, *v);
    else
      bind_at(i, nullptr);
  }

  bool step();   // true: a row is ready; false: done
  void run();    // steps to the end (for statements without rows)
  void reset();  // ready to step again, bindings kept

  bool is_null(int col) const;
  std::int64_t int64(int col) const;
  double real(int col) const;
  std::optional<double> opt_real(int col) const;
  std::string text(int col) const;  // "" for NULL
  std::string blob(int col) const;  // bytes; "" for NULL

  // The same by the result column's name, as the query names it with AS (SQLite leaves the name of
  // a column without AS unspecified): rows read by name, so a column added to a query shifts no
  // reader. std::logic_error naming the query's columns when it has no such column.
  int column(std::string_view name) const;
  bool is_null(std::string_view name) const { return is_null(column(name)); }
  std::int64_t int64(std::string_view name) const { return int64(column(name)); }
  double real(std::string_view name) const { return real(column(name)); }
  std::optional<double> opt_real(std::string_view name) const { return opt_real(column(name)); }
  std::string text(std::string_view name) const { return text(column(name)); }
  std::string blob(std::string_view name) const { return blob(column(name)); }

 private:
  struct Finalize {
    void operator()(sqlite3_stmt* s) const noexcept;
  };
  std::unique_ptr<sqlite3_stmt, Finalize> stmt_;
  sqlite3* db_ = nullptr;
};

// Copies the whole main database of `from` into `to` (sqlite3_backup), replacing its contents.
void copy_database(const Connection& from, Connection& to);

// BEGIN on construction; ROLLBACK in the destructor unless commit() ran. Immediate transactions take
// the write lock up front, so a writer waits (busy timeout) at BEGIN instead of failing on a stale
// snapshot halfway through. The destructor never throws.
class Transaction {
 public:
  enum class Kind { kDeferred, kImmediate };
  explicit Transaction(Connection& db, Kind kind = Kind::kImmediate);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit();

 private:
  Connection& db_;
  bool open_ = true;
};

}  // namespace sqlite
}  // namespace attntune
