#include "cli/shipped.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFileName = "attntune-shipped.db";

// The running binary's own path (/proc/self/exe), "" when it cannot be read.
fs::path self_path() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : p;
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return !p.empty() && fs::exists(p, ec);
}

const char* const kWithout = "--no-shipped, or ATTNTUNE_SHIPPED_DB= (empty), does without it";

}  // namespace

std::optional<std::string> shipped_db_path() {
  if (const char* env = std::getenv("ATTNTUNE_SHIPPED_DB")) {
    if (!*env) return std::nullopt;
    return std::string(env);  // the user named it: ShippedDb::store() refuses it when it is missing
  }
  if (const fs::path exe = self_path(); !exe.empty()) {
    const fs::path installed = exe.parent_path().parent_path() / "share" / "attntune" / kFileName;
    if (is_file(installed)) return installed.string();
  }
#ifdef ATTNTUNE_SHIPPED_DB_DEFAULT
  if (is_file(ATTNTUNE_SHIPPED_DB_DEFAULT)) return std::string(ATTNTUNE_SHIPPED_DB_DEFAULT);
#endif
  return std::nullopt;
}

ShippedDb::ShippedDb(bool enabled) : enabled_(enabled) {}

Store* ShippedDb::store() {
  if (opened_) return store_ ? &*store_ : nullptr;
  opened_ = true;
  if (!enabled_) return nullptr;
  const std::optional<std::string> path = shipped_db_path();
  if (!path) return nullptr;
  path_ = *path;
  if (!is_file(path_))
    throw InputError(fmt::format("the shipped database '{}' ($ATTNTUNE_SHIPPED_DB) does not exist ({})", path_,
                                 kWithout));
  try {
    store_.emplace(Store::open(path_, Store::Mode::kReadOnly));
  } catch (const InputError& e) {
    throw InputError(fmt::format("the shipped database cannot be used: {} (reinstall attntune, or rebuild it: "
                                 "tools/build_shipped_db.sh; {})",
                                 e.what(), kWithout));
  }
  return &*store_;
}

Store* ShippedDb::store_or_warn(std::ostream& warn) {
  try {
    return store();
  } catch (const InputError& e) {
    warn << "attntune: warning: " << e.what() << "; going on without it\n";
    return nullptr;
  }
}

std::string shipped_source(const std::string& path) {
  return fmt::format("shipped database {}", fs::path(path).filename().string());
}

std::string shipped_miss(ShippedDb& shipped, const Problem& problem) {
  if (!shipped.store()) return "";
  return fmt::format("; the shipped database '{}' has none for it either: attntune tune --problem {} measures it "
                     "on your GPU, starting from the shipped database's nearest problems",
                     shipped.path(), problem.str());
}

std::string shipped_note(const std::string& path, const std::string& db_path, const std::string& what,
                         const std::vector<BestRow>& rows, const std::string& tune_hint) {
  std::set<std::string> gpus, dates;
  for (const BestRow& r : rows) {
    gpus.insert(r.gpu);
    dates.insert(r.evaluated_at.substr(0, 10));  // ISO 8601: the day
  }
  std::string when = dates.empty() ? "" : *dates.begin();
  if (dates.size() > 1) when += ".." + *dates.rbegin();
  return fmt::format("attntune: note: no result {} in database '{}': answering from the shipped database '{}' "
                     "(measured on {}, {}); {} to measure on your GPU\n",
                     what, db_path, path, fmt::join(gpus, ", "), when, tune_hint);
}

}  // namespace attntune::cli
