#include "core/output_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCompanions[] = {"", "-wal", "-shm", "-journal"};

std::string shown(const std::string& what, const std::string& path) {
  return what.empty() ? path : what + " " + path;
}

bool same_inode(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// The directory holding `path` (as written: "." for a bare name) and the entry's name.
std::pair<fs::path, std::string> entry_of(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  return {dir, p.filename().string()};
}

// The same directory entry: the same directory (by identity, whatever the spelling) and name.
bool same_entry(const std::string& a, const std::string& b) {
  const auto [da, na] = entry_of(a);
  const auto [db, nb] = entry_of(b);
  if (na.empty() || na != nb || na == "." || na == "..") return false;
  struct stat sa {}, sb {};
  return ::stat(da.c_str(), &sa) == 0 && ::stat(db.c_str(), &sb) == 0 && same_inode(sa, sb);
}

bool no_space(int err) { return err == ENOSPC || err == EFBIG || err == EDQUOT; }

}  // namespace

bool is_database_file(const std::string& path, const std::string& database, std::string* which) {
  if (path.empty() || database.empty()) return false;
  struct stat target {};
  const bool target_exists = ::stat(path.c_str(), &target) == 0;
  for (const char* suffix : kCompanions) {
    const std::string file = database + suffix;
    struct stat st {};
    const bool exists = target_exists && ::stat(file.c_str(), &st) == 0;
    if ((exists && same_inode(target, st)) || same_entry(path, file)) {
      if (which) *which = *suffix ? fmt::format("the {} file of the database '{}'", suffix, database)
                                  : fmt::format("the database '{}'", database);
      return true;
    }
  }
  return false;
}

void refuse_database_path(const std::string& what, const std::string& path, const ProtectedDatabases& databases) {
  for (const std::string& db : databases) {
    std::string which;
    if (is_database_file(path, db, &which))
      throw InputError(fmt::format("{}: is {} (the same file); refusing to overwrite it: name another file "
                                   "(nothing written)",
                                   shown(what, path), which));
  }
}

void throw_write_error(const std::string& what, const std::string& path, int err) {
  if (no_space(err))
    throw EnvError(fmt::format("{} cannot be written: no space left (the disk or quota is full, or the file-size "
                               "limit is reached) ({})",
                               shown(what, path), std::strerror(err)));
  if (err == EIO) throw EnvError(fmt::format("{}: cannot write: {} (the device failed)", shown(what, path), std::strerror(err)));
  throw InputError(fmt::format("{}: cannot write: {}", shown(what, path), std::strerror(err)));
}

OutputFile::OutputFile(std::string what, std::string path, const ProtectedDatabases& databases)
    : what_(std::move(what)), path_(std::move(path)) {
  static std::atomic<int> counter{0};
  if (path_.empty()) throw InputError(fmt::format("{}: needs a file name", what_.empty() ? "output" : what_));
  refuse_database_path(what_, path_, databases);
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw InputError(fmt::format("{}: is a directory", shown(what_, path_)));
    if (!S_ISREG(st.st_mode)) {
      // A device, a FIFO or a socket (/dev/stdout, /dev/null, /dev/full): written in place, since
      // renaming over it would replace the node itself.
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd_ < 0) throw_write_error(what_, path_, errno);
      return;
    }
  }
  // Through a symbolic link, the file it points at is replaced, not the link.
  std::string real = path_;
  struct stat lst {};
  if (::lstat(path_.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
    std::error_code ec;
    const fs::path resolved = fs::weakly_canonical(path_, ec);
    if (!ec) real = resolved.string();
  }
  const auto [dir, name] = entry_of(real);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(
        fmt::format("{}: cannot write: directory '{}' does not exist", shown(what_, path_), dir.string()));
  dir_ = dir.string();
  path_ = real == path_ ? path_ : real;
  temp_ = (dir / fmt::format(".{}.tmp{}.{}", name, ::getpid(), counter++)).string();
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    const int err = errno;
    temp_.clear();  // not ours to remove
    throw_write_error(what_, path_, err);
  }
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void OutputFile::write(std::string_view data) {
  for (std::size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_write_error(what_, path_, errno);
    }
    if (n == 0) throw_write_error(what_, path_, ENOSPC);
    done += static_cast<std::size_t>(n);
  }
}

void OutputFile::commit() {
  if (committed_) return;
  // EINVAL: the file cannot be synced (a device, a FIFO): nothing to make durable.
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) throw_write_error(what_, path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_write_error(what_, path_, errno);
  if (temp_.empty()) {  // written in place
    committed_ = true;
    return;
  }
  if (::rename(temp_.c_str(), path_.c_str()) != 0) throw_write_error(what_, path_, errno);
  committed_ = true;
  // The rename reaches the disk with the directory; failing that only loses durability.
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_output_file(const std::string& what, const std::string& path, std::string_view data,
                       const ProtectedDatabases& databases) {
  OutputFile out(what, path, databases);
  out.write(data);
  out.commit();
}

// ---- Standard output ----------------------------------------------------------------------------

namespace {

// std::cout through stdout's own buffer (so it stays in order with printf), noting the errno of the
// first write that fails: by the end of a command it would be gone.
class CheckedStdout : public std::streambuf {
 public:
  int first_errno = 0;

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    if (std::fputc(traits_type::to_char_type(c), stdout) == EOF) note();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n > 0 && std::fwrite(s, 1, static_cast<std::size_t>(n), stdout) < static_cast<std::size_t>(n)) note();
    return n;
  }
  int sync() override {
    if (std::fflush(stdout) != 0) {
      note();
      return -1;
    }
    return 0;
  }

 private:
  void note() {
    if (first_errno == 0) first_errno = errno ? errno : EIO;
  }
};

// Never destroyed: std::cout is flushed after static destructors have run.
CheckedStdout& checked_stdout() {
  static CheckedStdout* buf = new CheckedStdout;
  return *buf;
}

}  // namespace

void prepare_standard_streams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", O_RDONLY);
    if (opened >= 0 && opened != fd) {
      ::dup2(opened, fd);
      ::close(opened);
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::cout.rdbuf(&checked_stdout());
}

void finish_stdout() {
  errno = 0;
  std::cout.flush();
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  int err = flush_failed ? errno : 0;
  if (checked_stdout().first_errno != 0) err = checked_stdout().first_errno;
  if (err == 0 && !flush_failed && !std::cout.fail() && !std::ferror(stdout)) return;
  if (err == 0) {
    // An earlier write failed and its errno is gone: say what standard output is.
    const int flags = ::fcntl(1, F_GETFL);
    struct stat st {};
    if (flags == -1 || (flags & O_ACCMODE) == O_RDONLY)
      err = EBADF;
    else if (::fstat(1, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
      err = EPIPE;
    else
      err = EIO;
  }
  std::clearerr(stdout);
  std::cout.clear();
  std::string why = std::strerror(err);
  if (err == EPIPE) why += " (the reader closed it before the output ended)";
  if (err == EBADF) why += " (it is closed)";
  if (no_space(err)) why += " (no space left: the disk or quota is full, or the file-size limit is reached)";
  throw EnvError(fmt::format("cannot write to standard output: {}", why));
}

}  // namespace attntune
