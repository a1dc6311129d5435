// attntune: find the fastest correct attention kernel for a GPU and a problem shape.
// The one top-level catch: every failure below becomes "attntune: error: ..." and its exit code.
#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/numeric_options.hpp"
#include "core/error.hpp"
#include "core/output_file.hpp"
#include "core/text.hpp"

namespace attntune::cli {

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

void print_help() {
  std::printf(
      "attntune: finds the fastest correct attention kernel for a GPU and a problem shape\n\n"
      "usage: attntune COMMAND [options]   (attntune COMMAND --help for a command's options)\n\n"
      "commands:\n");
  for (const auto& c : registry())
    if (!c.hidden) std::printf("  %-10s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf(
      "\nexit codes: 0 success, 1 the work ran and failed, 2 bad input, 3 environment (no GPU,\n"
      "driver or NVRTC; a full disk; a database locked by another writer). The database is\n"
      "./attntune.db unless --db or $ATTNTUNE_DB says otherwise.\n");
}
}  // namespace

bool register_command(Command c) {
  registry().push_back(std::move(c));
  return true;
}
const std::vector<Command>& registered_commands() { return registry(); }

bool parse_args(const std::string& name, const std::string& summary,
                const po::options_description& opts, const std::vector<std::string>& args,
                po::variables_map& vm) {
  return parse_args(name, summary, opts, args, vm, {});
}

bool parse_args(const std::string& name, const std::string& summary, const po::options_description& opts,
                const std::vector<std::string>& args, po::variables_map& vm, const Positional& positional) {
  po::options_description all(opts);
  all.add_options()("help,h", "show this help");
  po::positional_options_description pos;
  if (!positional.option.empty()) pos.add(positional.option.c_str(), positional.max_count);
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: attntune " << name << (positional.usage.empty() ? "" : " " + positional.usage)
                << " [options]\n" << summary << "\n\n" << all;
      return true;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw InputError(fmt::format("{}: {} (see attntune {} --help)", name, e.what(), name));
  }
  check_numeric_options(vm, name);  // every double option of every command: finite, in range
  return false;
}

std::string default_db_path() {
  const char* env = std::getenv("ATTNTUNE_DB");
  return (env && *env) ? env : "attntune.db";
}

Format parse_format(const std::string& s, bool allow_csv) {
  if (s == "table") return Format::kTable;
  if (s == "json") return Format::kJson;
  if (s == "csv" && allow_csv) return Format::kCsv;
  throw InputError(fmt::format("unknown --format '{}' (expected table, json{})", s,
                               allow_csv ? " or csv" : ""));
}

}  // namespace attntune::cli

int main(int argc, char** argv) {
  using namespace attntune;
  // Before anything opens a file: a closed standard output must never become the database's
  // descriptor, and a closed pipe must be an error we report, not a silent death (output_file.hpp).
  prepare_standard_streams();
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    // Every success ends with standard output flushed and checked: output lost to a full disk, a
    // closed descriptor or a reader gone is exit 3, never a silent 0.
    auto finish = [](int rc) {
      if (rc == 0) finish_stdout();
      return rc;
    };
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      cli::print_help();
      return finish(args.empty() ? 2 : 0);
    }
    if (args[0] == "--version") {
      std::printf("attntune %s\n", ATTNTUNE_VERSION);
      return finish(0);
    }
    for (const auto& c : cli::registered_commands()) {
      if (c.name == args[0]) {
        return finish(c.run(std::vector<std::string>(args.begin() + 1, args.end())));
      }
    }
    throw InputError(fmt::format("unknown command '{}' (see attntune --help)", args[0]));
  } catch (const Error& e) {
    // One line, whatever the message quotes (a file or campaign name may hold a newline).
    std::fprintf(stderr, "attntune: error: %s\n", printable_line(e.what()).c_str());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attntune: error: internal: %s\n", printable_line(e.what()).c_str());
    return 1;
  }
}
