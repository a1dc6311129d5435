// Reliability, part 10c (docs/RELIABILITY.md, "Faults injected at every step"; issue 46): databases
// crafted by hand, as someone might hand one over (the Slurm flow copies databases between
// hosts): code, newlines and directives in stored configs, in the stored search-space text, in
// campaign and device names, in provenance (driver, uuid, stop reasons, strategies, a build's
// compiler options), nonsense numbers, and a source hash forged to match a crafted render (so the
// export's "template changed" check passes). Through every command that reads them (export of one
// campaign and of all, report, best, campaigns, replay, a resume by tune) and through the path to
// NVRTC: the configs the final re-timing would re-build, rendered as the GPU runner renders them.
//
// Each must exit 0-3 (a signal is a crash) and, when it fails, say one line and leave no file; an
// export it writes must hold the same code as the export of the clean database, integers aside (a
// kernel's constants may be another campaign's, never code); what it prints as JSON must parse; and
// a rendered source must be the candidate line, `#define NAME INTEGER` lines and the template.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/hash.hpp"
#include "families/family.hpp"
#include "fault_util.hpp"
#include "space/search_space.hpp"

namespace attntune::reliability {
namespace test_crafted_databases {
namespace {

const std::string kEvilLine = "#include \"/etc/passwd\"";
const std::string kEvilCode = "asm(\"trap;\");";

// The code of an export with every number set to 0: what a crafted database may change (a kernel's
// constants) set aside, what it must not (any other token) kept.
std::string code_shape(const std::string& cu) {
  const std::string code = code_only(cu);
  std::string out;
  for (std::size_t i = 0; i < code.size();) {
    if (std::isdigit(static_cast<unsigned char>(code[i])) &&
        (i == 0 || !(std::isalnum(static_cast<unsigned char>(code[i - 1])) || code[i - 1] == '_'))) {
      while (i < code.size() && (std::isalnum(static_cast<unsigned char>(code[i])) || code[i] == '.')) ++i;
      out += '0';
    } else {
      out += code[i++];
    }
  }
  return out;
}

struct Craft {
  std::string kind, what;
  std::vector<std::string> sql;  // run with CHECK constraints off, as a hand editor can
  bool forge_hash = false;       // set the rank-1 candidate's source_hash to its crafted render's
};

std::string q(const std::string& s) {  // an SQL string literal
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

constexpr const char* kTop = "(SELECT candidate_id FROM rankings WHERE rank = 1 AND campaign_id = (SELECT id FROM campaigns WHERE name = 'k'))";

std::vector<Craft> crafts() {
  const std::string nl = "' || char(10) || '";
  const auto set_config = [](const std::string& path, const std::string& value) {
    return fmt::format("UPDATE candidates SET config = json_set(config, {}, {}) WHERE id = {}", q(path), value, kTop);
  };
  std::vector<Craft> c = {
      {"stored config", "code in an integer value", {set_config("$.block_m", q("64); " + kEvilCode + " //"))}, true},
      {"stored config", "a newline and #include in an enum value",
       {set_config("$.kv_schedule", "'blockwise" + nl + kEvilLine + "'")}, true},
      {"stored config", "a directive as a parameter name", {set_config("$.\"x\n#define BLOCK_M 0\"", "1")}, true},
      {"stored config", "a float for an integer", {set_config("$.block_m", "64.5")}, true},
      {"stored config", "a string for a boolean", {set_config("$.q_in_regs", q("true"))}, true},
      {"stored config", "not JSON", {fmt::format("UPDATE candidates SET config = '{{{{' WHERE id = {}", kTop)}},
      {"stored config", "an integer outside the space", {set_config("$.block_m", "96")}, true},
      {"stored config", "a huge integer", {set_config("$.block_m", "9223372036854775807")}, true},
      {"space text", "code in a constraint",
       {"UPDATE campaign_spaces SET space_text = replace(space_text, 'constraints:', 'constraints:" + nl +
            "  - \"block_m > 0; " + kEvilCode + "\"')",
        "UPDATE campaigns SET space_text = (SELECT space_text FROM campaign_spaces WHERE campaign_id = campaigns.id)"}},
      {"space text", "a directive as an enum value",
       {"UPDATE campaign_spaces SET space_text = replace(space_text, 'blockwise', '\"blockwise\\n" + kEvilLine + "\"')",
        "UPDATE campaigns SET space_text = (SELECT space_text FROM campaign_spaces WHERE campaign_id = campaigns.id)"}},
      {"space text", "a newline in the family",
       {"UPDATE campaign_spaces SET space_text = replace(space_text, 'family: flash_fwd_mma', 'family: \"flash_fwd_mma\\n" +
            kEvilLine + "\"')",
        "UPDATE campaigns SET space_text = (SELECT space_text FROM campaign_spaces WHERE campaign_id = campaigns.id)"}},
      {"space text", "not YAML", {"UPDATE campaign_spaces SET space_text = '{[: " + kEvilCode + "'",
                                  "UPDATE campaigns SET space_text = '{[: " + kEvilCode + "'"}},
      {"names", "a campaign name with a newline and code",
       {"UPDATE campaigns SET name = 'k" + nl + kEvilLine + nl + "//' WHERE name = 'k2'"}},
      {"names", "a campaign name that ends a comment", {"UPDATE campaigns SET name = 'x */ " + kEvilCode + " /*' WHERE name = 'k2'"}},
      {"names", "a device name with a newline and code",
       {"UPDATE devices SET name = 'H100 */ " + kEvilCode + nl + kEvilLine + "'"}},
      {"provenance", "driver version and uuid with newlines and code",
       {"UPDATE devices SET driver_version = '580" + nl + kEvilLine + "', uuid = 'GPU-\"; " + kEvilCode + "'"}},
      {"provenance", "stop reason, strategy and space path with code",
       {"UPDATE campaigns SET stop_reason = 'budget" + nl + kEvilLine + "', space_path = '*/ " + kEvilCode + "'",
        "UPDATE campaign_runs SET strategy = 'evo" + nl + kEvilLine + "', stop_reason = '\\\"; " + kEvilCode + "'"}},
      {"provenance", "a build's compiler version and options",
       {"INSERT INTO builds (source_hash, arch, nvrtc_version, options, status, cubin, log) SELECT source_hash, 'sm_90', "
        "'13.0" + nl + kEvilLine + "', '-DX=\"" + kEvilCode + "\"', 'ok', x'7f454c46', 'ptxas" + nl + kEvilLine +
            "' FROM candidates"}},
      {"numbers", "rankings with NaN, negative and huge medians",
       {"UPDATE rankings SET median_us = CASE rank WHEN 1 THEN -1 WHEN 2 THEN 1e308 ELSE 'nan' END, tflops = 'inf'"}},
      {"numbers", "an evaluation's median as text",
       {"UPDATE evaluations SET median_us = '12; " + kEvilCode + "' WHERE phase = 'search' AND status = 'ok' AND "
        "candidate_id = " + std::string(kTop)}},
      {"problem", "an unsupported head dimension and a negative batch", {"UPDATE campaigns SET d = 96, b = -3 WHERE name = 'k'"}},
      {"problem", "code in the problem's columns",
       {"UPDATE campaigns SET d = '128; " + kEvilCode + "', dtype = 'bf16" + nl + kEvilLine + "' WHERE name = 'k'"}},
  };
  return c;
}

struct Verdict {
  int refused = 0, safe = 0, unsafe = 0;
};

TEST(ReliabilityCraftedDatabases, CraftedRowsNeverReachGeneratedCodeAndNeverCrash) {
  TempDir dir;
  const Recording rec(dir);
  const std::string clean = dir.file("clean.db");
  ASSERT_EQ(run(rec.tune(clean, "k", 0, {"--budget-evals", "20", "--final-top", "3", "--final-rounds", "1"}), dir.path()).rc, 0);
  ASSERT_EQ(run(rec.tune(clean, "k2", 0, {"--budget-evals", "8", "--final-top", "2", "--final-rounds", "1"}), dir.path()).rc, 0);
  const auto clean_export = run({"export", "--db", clean, "--campaign", "k", "-o", dir.file("clean.cu")}, dir.path());
  ASSERT_EQ(clean_export.rc, 0) << clean_export.err;
  const std::string clean_shape = code_shape(read_bytes(dir.file("clean.cu")));
  const auto clean_all = run({"export", "--db", clean, "--all-best", "-o", dir.file("clean-all.cu")}, dir.path());
  ASSERT_EQ(clean_all.rc, 0) << clean_all.err;
  const std::string clean_all_shape = code_shape(read_bytes(dir.file("clean-all.cu")));

  const SearchSpace space = SearchSpace::load(rec.space);
  const Problem problem = Problem::parse(rec.problem);
  const std::string body = flatten_includes(builtin_family(space.family()).main_file);
  const std::regex define("#define [A-Z][A-Z0-9_]* -?[0-9]+");
  const std::regex first("// attntune candidate: [a-z0-9_]+ [a-z0-9_=,]+ \\(d=[0-9]+, dtype=(fp16|bf16), causal=[01]\\)");

  std::map<std::string, Verdict> by_kind;
  std::vector<std::string> failures;
  int serial = 0, runs = 0;
  for (const Craft& craft : crafts()) {
    const fs::path cd = dir.path() / fmt::format("craft{}", serial++);
    fs::create_directories(cd / "out");
    const std::string db = (cd / "crafted.db").string();
    fs::copy_file(clean, db);
    {
      sqlite::Connection c = sqlite::Connection::open(db, SQLITE_OPEN_READWRITE);
      c.exec("PRAGMA ignore_check_constraints = ON");
      for (const std::string& sql : craft.sql) c.exec(sql);
      if (craft.forge_hash) {
        // What a forger computes: the hash of the crafted config's render, so export's check passes.
        sqlite::Statement st(c, fmt::format("SELECT config FROM candidates WHERE id = {}", kTop));
        if (st.step()) {
          try {
            const Config cfg = config_from_json(nlohmann::json::parse(st.text(0)));
            const std::string hash = render_kernel(space, cfg, problem, "sm_90").source_hash;
            sqlite::Statement(c, fmt::format("UPDATE candidates SET source_hash = ?1 WHERE id = {}", kTop)).bind(hash).run();
          } catch (const std::exception&) {
            // The renderer itself refuses it: nothing to forge.
          }
        }
      }
    }
    const std::string where = craft.kind + ": " + craft.what;
    Verdict& v = by_kind[craft.kind];
    const auto before = read_bytes(db);

    // The commands.
    struct Cmd {
      std::string name;
      std::vector<std::string> args;
      std::string out_file;  // an export's
      bool json = false;
      std::string shape;     // the clean export's code shape
    };
    const std::vector<Cmd> cmds = {
        {"export", {"export", "--db", db, "--campaign", "k", "-o", (cd / "out" / "k.cu").string()}, (cd / "out" / "k.cu").string(), false, clean_shape},
        {"export --all-best", {"export", "--db", db, "--all-best", "-o", (cd / "out" / "all.cu").string()}, (cd / "out" / "all.cu").string(), false, clean_all_shape},
        {"report", {"report", "--db", db, "--campaign", "k", "--format", "json"}, "", true, ""},
        {"best", {"best", "--db", db, "--top", "5", "--format", "json"}, "", true, ""},
        {"campaigns", {"campaigns", "--db", db, "--format", "json"}, "", true, ""},
        {"replay", {"replay", "--db", db, "--campaign", "k", "--partial", "--seeds", "1", "--budget", "5", "--format", "json"}, "", true, ""},
    };
    for (const Cmd& cmd : cmds) {
      ++runs;
      const Ran r = run(cmd.args, cd, ProcOptions{{}, std::nullopt, "", "", 20.0});
      const std::string at = where + " / " + cmd.name;
      std::string bad;
      if (r.timed_out || r.rc > 3 || r.rc < 0) {
        bad = fmt::format("exit {} (a crash or a hang): {}", r.rc, r.err);
      } else if (r.rc != 0) {
        if (count_lines(r.err) != 1 || r.err.rfind("attntune: error: ", 0) != 0) bad = "not one error line: " + r.err;
        else if (!cmd.out_file.empty() && fs::exists(cmd.out_file)) bad = "a file written on failure";
        else if (r.err.find('\n') != r.err.size() - 1) bad = "the error spans lines";
      } else if (!cmd.out_file.empty()) {
        const std::string cu = read_bytes(cmd.out_file);
        try {
          if (code_shape(cu) != cmd.shape) {
            bad = "the export's code differs from the clean export's";
          } else {
            [[maybe_unused]] const auto info = nlohmann::json::parse(kernel_info(cu));  // throws if not JSON
          }
        } catch (const std::exception& e) {
          bad = std::string("the export does not parse: ") + e.what();
        }
      } else if (cmd.json) {
        try {
          [[maybe_unused]] const auto parsed = nlohmann::json::parse(r.out);  // throws if not JSON
        } catch (const std::exception& e) {
          bad = std::string("its JSON does not parse: ") + e.what();
        }
      }
      for (const std::string& left : [&] {
             std::vector<std::string> l;
             for (const auto& e : fs::directory_iterator(cd / "out"))
               if (e.path().filename().string().find(".tmp") != std::string::npos) l.push_back(e.path().string());
             return l;
           }())
        bad += " left " + left;
      if (!bad.empty()) {
        ++v.unsafe;
        failures.push_back(at + ": " + bad);
      } else if (r.rc == 0) {
        ++v.safe;
      } else {
        ++v.refused;
      }
      if (std::getenv("ATTNTUNE_CRAFTED_VERBOSE"))
        std::printf("%s: exit %d %s\n", at.c_str(), r.rc, r.rc ? r.err.c_str() : "\n");
      fs::remove_all(cd / "out");
      fs::create_directories(cd / "out");
    }

    // tune resuming the crafted campaign (its final re-timing re-runs stored configs).
    {
      ++runs;
      const Ran r = run(rec.tune(db, "k", 0, {"--budget-evals", "24", "--final-top", "3", "--final-rounds", "1"}), cd,
                        ProcOptions{{}, std::nullopt, "", "", 30.0});
      std::string bad;
      if (r.timed_out || r.rc > 3 || r.rc < 0) bad = fmt::format("exit {} (a crash or a hang): {}", r.rc, r.err);
      else if (r.rc != 0 && (testing::lines(r.err).empty() || testing::lines(r.err).back().rfind("attntune: error: ", 0) != 0))
        bad = "its last line is not the error: " + r.err;  // progress may come first
      else if (r.rc != 0 && read_bytes(db) != before) bad = "refused, but the database changed";
      if (!bad.empty()) ++v.unsafe, failures.push_back(where + " / tune: " + bad);
      else if (r.rc == 0) ++v.safe;
      else ++v.refused;
      if (std::getenv("ATTNTUNE_CRAFTED_VERBOSE")) std::printf("%s / tune: exit %d %s\n", where.c_str(), r.rc, r.err.c_str());
    }

    // The path to NVRTC: the configs a resume's final re-timing re-builds, from the store, rendered
    // as the GPU runner renders them.
    {
      ++runs;
      std::string bad;
      bool refused = false;
      try {
        Store s = Store::open(db, Store::Mode::kReadOnly);
        const auto id = s.find_campaign("k");
        if (!id) throw InputError("no campaign k (renamed by the craft)");
        const std::optional<CampaignRow> row = s.campaign_row("k");
        const SearchSpace stored = SearchSpace::parse(row->spec.spaces.front().text, row->spec.spaces.front().path);
        for (const EvaluationRow& e : s.campaign_evaluations(*id)) {
          const RenderedKernel k = render_kernel(stored, e.config, row->spec.problem, "sm_90");
          std::istringstream lines(k.source.substr(0, k.source.size() - std::min(k.source.size(), body.size())));
          std::string line;
          std::getline(lines, line);
          if (!std::regex_match(line, first)) bad = "the candidate line: " + line;
          while (bad.empty() && std::getline(lines, line))
            if (!std::regex_match(line, define)) bad = "not an integer #define: " + line;
          if (k.source.compare(k.source.size() - body.size(), body.size(), body) != 0) bad = "the template was altered";
          if (!bad.empty()) break;
        }
      } catch (const InputError&) {
        refused = true;
      } catch (const SqliteError&) {
        refused = true;
      } catch (const std::exception& e) {
        bad = std::string("not refused as bad input: ") + e.what();
      }
      if (!bad.empty()) ++v.unsafe, failures.push_back(where + " / render for NVRTC: " + bad);
      else if (refused) ++v.refused;
      else ++v.safe;
    }
  }
  std::printf("\n%-12s %8s %20s %8s\n", "crafted", "refused", "accepted, code same", "unsafe");
  int total_refused = 0, total_safe = 0, total_unsafe = 0;
  for (const auto& [kind, v] : by_kind) {
    std::printf("%-12s %8d %20d %8d\n", kind.c_str(), v.refused, v.safe, v.unsafe);
    total_refused += v.refused, total_safe += v.safe, total_unsafe += v.unsafe;
  }
  std::printf("%zu crafted databases, %d runs: %d refused, %d accepted with the clean code, %d unsafe\n", crafts().size(),
              runs, total_refused, total_safe, total_unsafe);
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace test_crafted_databases
}  // namespace attntune::reliability
