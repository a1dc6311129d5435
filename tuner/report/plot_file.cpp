#include "report/plot_file.hpp"

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/process.hpp"
#include "core/text.hpp"

namespace attntune::report {

namespace {

namespace fs = std::filesystem;

constexpr int kConvertTimeoutSeconds = 120;
constexpr std::size_t kMaxLog = 4096;
constexpr std::string_view kPngSignature = "\x89PNG\r\n\x1a\n";


bool executable_file(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

std::vector<std::string> converter_argv(const Converter& c, const std::string& in, const std::string& out) {
  if (c.name == "rsvg-convert") return {c.path, "-f", "png", "-o", out, in};
  if (c.name == "inkscape") return {c.path, in, "--export-type=png", "--export-filename=" + out};
  return {c.path, "svg:" + in, "png:" + out};  // ImageMagick: magick or convert
}

struct RunResult {
  bool ok = false;
  std::string why;  // when not ok: the exit status and what it printed on stderr
};

// Runs argv (no shell) with stdin and stdout on /dev/null; stderr is kept for the error message.
RunResult run(const std::vector<std::string>& argv) {
  SpawnOptions o;
  o.in = o.out = SpawnOptions::Stdio::kNull;
  o.err = SpawnOptions::Stdio::kPipe;
  o.program = argv[0];  // the converter found on PATH, as a path
  Child child;
  try {
    child = Child::spawn(argv, o);
  } catch (const Error& e) {
    return {false, e.what()};
  }
  std::string log;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kConvertTimeoutSeconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{child.stderr_fd(), POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[1024];
    const ssize_t got = ::read(child.stderr_fd(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (log.size() < kMaxLog) log.append(buf, static_cast<std::size_t>(got));
  }
  const ExitStatus status = timed_out ? child.kill() : child.wait();
  if (timed_out) return {false, fmt::format("ran past {}s and was killed", kConvertTimeoutSeconds)};
  std::string detail = one_line(log.substr(0, std::min(log.size(), std::size_t{300})));
  if (status.ok()) return {true, detail};
  const std::string how = status.signaled ? fmt::format("signal {}", status.value) : fmt::format("exit {}", status.value);
  return {false, detail.empty() ? how : how + ": " + detail};
}

bool is_png(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::string head(kPngSignature.size(), '\0');
  return f.read(head.data(), static_cast<std::streamsize>(head.size())) && head == kPngSignature;
}

// Removes the temporary files it holds.
struct TempFiles {
  std::vector<fs::path> paths;
  ~TempFiles() {
    for (const auto& p : paths) {
      std::error_code ec;
      fs::remove(p, ec);
    }
  }
};

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

PlotFormat plot_format(const std::string& path) {
  const std::string ext = ascii_lower(fs::path(path).extension().string());
  if (ext == ".svg") return PlotFormat::kSvg;
  if (ext == ".png") return PlotFormat::kPng;
  throw InputError(fmt::format("--plot {}: unknown image type '{}' (use a .svg or .png name)", path, ext));
}

std::vector<Converter> find_converters() {
  std::vector<Converter> found;
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "";
  for (const char* name : {"rsvg-convert", "magick", "convert", "inkscape"}) {
    std::size_t start = 0;
    while (start <= path.size()) {
      const std::size_t end = std::min(path.find(':', start), path.size());
      const std::string dir = path.substr(start, end - start);
      start = end + 1;
      if (dir.empty()) continue;  // an empty entry means the working directory: not for running tools
      const fs::path candidate = fs::path(dir) / name;
      if (executable_file(candidate)) {
        found.push_back({name, candidate.string()});
        break;
      }
    }
  }
  return found;
}

std::string no_converter_message(const std::string& path) {
  return fmt::format(
      "--plot {} needs rsvg-convert (apt install librsvg2-bin) or ImageMagick; use a .svg name to write SVG directly",
      path);
}

void write_plot(const std::string& path, const std::string& svg, const ProtectedDatabases& databases) {
  plot_format(path);
  // The output writer (core/output_file.hpp): refuses a database, a directory, a missing directory;
  // the file appears whole or not at all; a full disk is exit 3.
  OutputFile out("--plot", path, databases);
  if (plot_format(path) == PlotFormat::kSvg) {
    out.write(svg);
    out.commit();
    return;
  }

  const std::vector<Converter> converters = find_converters();
  if (converters.empty()) throw EnvError(no_converter_message(path));
  // The converter's input and output lie beside the target (the same file system), named after the
  // output's temporary file, and are removed whatever happens.
  const std::string base = out.temp_path().empty() ? fmt::format("/tmp/.attntune-plot{}", ::getpid()) : out.temp_path();
  const fs::path svg_file = base + ".svg", png_file = base + ".png";
  TempFiles temps;
  temps.paths = {svg_file, png_file};
  write_output_file("--plot", svg_file.string(), svg);
  std::vector<std::string> failures;
  for (const Converter& c : converters) {
    std::error_code ec;
    fs::remove(png_file, ec);
    const RunResult r = run(converter_argv(c, svg_file.string(), png_file.string()));
    if (r.ok && is_png(png_file)) {
      out.write(read_all(png_file));
      out.commit();
      return;
    }
    failures.push_back(fmt::format("{} failed ({})", c.path, r.ok ? "it wrote no PNG" : r.why));
  }
  std::string all;
  for (const auto& f : failures) all += (all.empty() ? "" : "; ") + f;
  throw EnvError(fmt::format("--plot {}: could not convert the SVG to PNG: {}; install rsvg-convert (apt install "
                             "librsvg2-bin) or use a .svg name to write SVG directly",
                             path, all));
}

}  // namespace attntune::report
