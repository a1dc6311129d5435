// The one writer of every file a command writes besides its database (export -o, report --plot,
// plan -o), and the check of standard output at the end of every command (issue 28).
//
// A file appears whole or not at all: written to a temporary file in the target's directory,
// fsync'd, closed and renamed over the target; every write, the fsync, the close and the rename
// are checked, and the temporary file is removed on any failure. Before anything is created the
// target is compared with the databases in play: a path that is a database or one of its SQLite
// companions (-wal, -shm, -journal), by filesystem identity (another spelling, a symbolic link, a
// hard link), is refused. Errors are one line naming the path:
//   - the disk, the quota or the file-size limit is full (ENOSPC, EFBIG, EDQUOT) or the device
//     failed (EIO): EnvError (exit 3);
//   - anything else (EACCES, EROFS, a missing directory, a directory as the target): InputError
//     (exit 2).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace attntune {

// The files an output must never be: databases (each with its -wal, -shm and -journal).
using ProtectedDatabases = std::vector<std::string>;

// True when `path` names `database` or one of its SQLite companions: the same file (device and
// inode, when both exist) or the same directory entry (the same directory by identity and the same
// name, whether or not the file exists yet). Sets `which` to "the database" or "its -wal file".
bool is_database_file(const std::string& path, const std::string& database, std::string* which = nullptr);

// InputError when `path` is one of `databases` or their companions. `what` prefixes the message
// ("-o", "--plot"; "" for none).
void refuse_database_path(const std::string& what, const std::string& path, const ProtectedDatabases& databases);

// The error for errno `err` while writing `path`: EnvError for a full disk, quota or file-size
// limit and for EIO, InputError otherwise. `what` prefixes the path as above.
[[noreturn]] void throw_write_error(const std::string& what, const std::string& path, int err);

// An output file being written: created (as a temporary file beside `path`) by the constructor,
// which first refuses a protected path, a directory and a missing directory; appears at `path`
// only on commit(). The destructor removes the temporary file unless committed.
class OutputFile {
 public:
  OutputFile(std::string what, std::string path, const ProtectedDatabases& databases = {});
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  const std::string& path() const { return path_; }
  // The temporary file's path: a sibling of the target, for helpers writing beside it (a converter).
  const std::string& temp_path() const { return temp_; }
  void write(std::string_view data);
  // fsync, close, rename over the target, then (best effort) fsync the directory.
  void commit();

 private:
  std::string what_, path_, dir_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `data` to `path` whole or not at all (OutputFile, then commit).
void write_output_file(const std::string& what, const std::string& path, std::string_view data,
                       const ProtectedDatabases& databases = {});

// ---- Standard output ----------------------------------------------------------------------------

// Call first in main: a closed descriptor 0, 1 or 2 is reopened on /dev/null, read-only, so the
// next file opened (the database) can never become standard output and receive what a command
// prints; writes to such a standard output fail (EBADF) and are reported at the end. Ignores
// SIGPIPE: a reader that closed the pipe early makes the writes fail with EPIPE, which
// finish_stdout reports (exit 3) instead of the process dying silently by the signal.
void prepare_standard_streams();

// Flushes std::cout and stdout; EnvError "cannot write to standard output: REASON" when that or
// any earlier write to them failed.
void finish_stdout();

}  // namespace attntune
