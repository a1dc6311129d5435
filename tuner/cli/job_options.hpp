// The options of a campaign run (strategy, seed, budgets, convergence, the final re-timing, warm
// start, timing limits), declared and checked in one place for `tune` (which runs it) and
// `submit` (which queues it): the same flag means the same thing, with the same defaults and the
// same errors, in both.
#pragma once
#include <string>

#include "cli/command.hpp"
#include "core/queue_records.hpp"

namespace attntune::cli {

struct JobOptionValues {
  std::string strategy = "evo", budget_time;
  std::int64_t budget_evals = 0, patience = -1;
  std::uint64_t seed = 1;
  int final_top = 8, final_rounds = 6, final_screen = 24, warm = 8;
  double max_seconds = 1.0, min_gain = 0.5, min_seconds = 0, final_min_seconds = 1.0;
};

// Declares the options into `opts`, writing into `v` (whose defaults the help text shows).
void add_job_options(po::options_description& opts, JobOptionValues& v);
// InputError ("COMMAND: --flag ...") for a value out of range or an unknown strategy (parse_args has
// already refused what is not finite, negative or huge: cli/numeric_options.hpp);
// the request they make (spaces left empty).
JobRequest check_job_options(const JobOptionValues& v, const po::variables_map& vm, const std::string& command);

// The limits of building and running candidates (--compile-timeout, --deadline-floor), declared
// alike by every command that evaluates them (tune, serve, retime, eval); the check, InputError
// ("COMMAND: ..."), unless positive and at most a day.
void add_limit_options(po::options_description& opts, double& compile_timeout_s, double& deadline_floor_s);
void check_limit_options(double compile_timeout_s, double deadline_floor_s, const std::string& command);

// --allow-network-fs, declared alike by the commands that write a queue's results (serve, submit,
// tune): without it they refuse a database on NFS, SMB/CIFS, sshfs, Lustre, ... (Store::Options,
// db/filesystem.hpp; docs/design/service.md says why).
void add_network_fs_option(po::options_description& opts, bool& allow_network_fs);

}  // namespace attntune::cli
