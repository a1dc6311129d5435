// The database of tuned results that ships with attntune (docs/design/shipped_db.md), so that a new
// user is not behind on day one: `best --problem` and `export --problem` (`export --all-best --plan`
// per problem) answer from it when the user's database has no result for the problem, and `tune`
// warm-starts from it when the user's database has no tuned neighbour. It is always opened as a
// reader (Store::Mode::kReadOnly, with the checks every reader gets) and never written.
#pragma once
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/records.hpp"
#include "db/store.hpp"

namespace attntune::cli {

// Where the shipped database is: $ATTNTUNE_SHIPPED_DB when it is set ("" = none); else
// ../share/attntune/attntune-shipped.db beside the binary (an installed attntune: cmake --install);
// else the source tree's db/shipped/attntune-shipped.db (compiled in: a build tree). A default
// location that does not exist is no shipped database, silently; nullopt then.
std::optional<std::string> shipped_db_path();

// The shipped database, opened on first use (a command that never needs it never reads it).
class ShippedDb {
 public:
  // enabled = false: --no-shipped.
  explicit ShippedDb(bool enabled);
  // nullptr when there is none (disabled, $ATTNTUNE_SHIPPED_DB="", no file at a default location).
  // InputError (exit 2) for a file that is not a readable attntune database (damaged, foreign,
  // newer than this binary) or a $ATTNTUNE_SHIPPED_DB that does not exist, naming it and how to do
  // without it: best and export answer from it, so a broken one must not pass for "no result".
  Store* store();
  // The same, but a broken file is a warning on `warn` and nullptr: tune's warm start only speeds
  // the search up, and the campaign measures everything itself.
  Store* store_or_warn(std::ostream& warn);
  const std::string& path() const { return path_; }

 private:
  bool enabled_;
  bool opened_ = false;
  std::string path_;
  std::optional<Store> store_;
};

// The end of a "no result for `problem`" error when the shipped database was asked too and had none:
// that it has none either, and what measures the problem (a tune, warm-started from the shipped
// database's nearest problems). Empty when there is no shipped database to ask (--no-shipped, none
// installed), so the error says only what was looked at.
std::string shipped_miss(ShippedDb& shipped, const Problem& problem);

// One line for stderr: that `rows` (of the shipped database at `path`) answer `what` because the
// user's database `db_path` has none, where and when they were measured, and what measures them on
// the user's GPU.
std::string shipped_note(const std::string& path, const std::string& db_path, const std::string& what,
                         const std::vector<BestRow>& rows, const std::string& tune_hint);

// The file name the exports' provenance gives as their source ("no paths of the tuning machine").
std::string shipped_source(const std::string& path);

}  // namespace attntune::cli
