#include "core/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

namespace {

std::string size_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  return fmt::format("{} bytes", bytes);
}

const char* kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_input_file(const std::string& path, std::string_view what, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever. The checks are made
  // on the opened file (fstat), so a path swapped after a check cannot slip past them.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw InputError(fmt::format("{}: no such file", path));
    throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw InputError(fmt::format("{}: is a directory, not {}", path, what));
  if (!S_ISREG(st.st_mode))
    throw InputError(fmt::format("{}: is {}, not {} (only regular files are read)", path, kind_of(st.st_mode), what));
  if (st.st_size < 0 || static_cast<std::uintmax_t>(st.st_size) > max_bytes)
    throw InputError(fmt::format("{}: {} is more than the {} allowed for {}", path,
                                 size_text(static_cast<std::size_t>(st.st_size)), size_text(max_bytes), what));
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {  // to the end, or past the limit if the file grows while read
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_bytes)
      throw InputError(fmt::format("{}: more than the {} allowed for {}", path, size_text(max_bytes), what));
  }
  return text;
}

void check_json_nesting(std::string_view text, const std::string& file, int max_depth) {
  int depth = 0, line = 1;
  std::size_t line_start = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line, line_start = i + 1;
    } else if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw InputError(fmt::format("{}: JSON nested more than {} levels deep",
                                     SourcePos{file, line, static_cast<int>(i - line_start) + 1}.str(), max_depth));
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace attntune
