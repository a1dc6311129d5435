// Subcommands register themselves here (one file per command in tuner/cli/), so main.cpp never
// needs editing to add one. Command files are compiled into the executable itself, not into a
// library, so their static registrations are never dropped by the linker.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace attntune::cli {

namespace po = boost::program_options;

struct Command {
  std::string name;
  std::string summary;  // one line for `attntune --help`
  bool hidden = false;  // internal commands (e.g. the GPU worker) are not listed
  // Receives the arguments after the command name. Returns the exit code; throws attntune::Error
  // for failures (main prints them).
  std::function<int(const std::vector<std::string>& args)> run;
};

bool register_command(Command c);
const std::vector<Command>& registered_commands();

// Parses args against opts; handles --help (prints usage "attntune NAME [options]" with opts and
// returns true, meaning: exit 0 now). Unknown options, missing values and positional arguments
// become InputError.
bool parse_args(const std::string& name, const std::string& summary,
                const po::options_description& opts, const std::vector<std::string>& args,
                po::variables_map& vm);

// The same, with positional arguments: up to `max_count` (-1: any number) go to the option named
// `option`, which `opts` must declare; `usage` names them in --help ("PLAN", "A.db B.db ...").
struct Positional {
  std::string option, usage;
  int max_count = -1;
};
bool parse_args(const std::string& name, const std::string& summary, const po::options_description& opts,
                const std::vector<std::string>& args, po::variables_map& vm, const Positional& positional);

// --db default: $ATTNTUNE_DB if set, else ./attntune.db (docs/CONTRACT.md).
std::string default_db_path();

enum class Format { kTable, kJson, kCsv };
Format parse_format(const std::string& s, bool allow_csv = true);  // InputError on anything else

}  // namespace attntune::cli
