// Reliability, part 5 (docs/RELIABILITY.md): input safety.
//
// Code: values from YAML or the command line reach generated source only as validated integers
// (ints, booleans as 0/1, enum values as their index). Injection attempts through each parameter
// kind, names, limits, archs, problem fields and expressions are refused with exit 2; a space whose
// free text (description, docs, comments) carries code renders sources whose every line before the
// template is `#define NAME INTEGER`, and whose rest is the template itself; a crafted campaign name
// (comment and string terminators, newlines are refused) changes no code of an exported .cu, only
// its comments and the escaped kernel_info string, which decodes back to the name.
//
// SQL: metacharacters through every string field the store keeps (devices, campaigns, candidates,
// builds, evaluations) come back byte for byte through the Store API and the binary (`campaigns`,
// `best`, `report`, `export`), match exactly (no LIKE wildcards), and the schema is intact.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/embedded.hpp"
#include "families/family.hpp"
#include "reliability_util.hpp"
#include "space/search_space.hpp"

namespace attntune::reliability {
namespace test_input_safety {
namespace {

// Strings that end comments, strings and statements in C, CUDA and SQL.
const std::vector<std::string>& hostile() {
  static const std::vector<std::string> s = {
      "k'; DROP TABLE evaluations; --",
      "x\" OR \"1\"=\"1",
      "*/ asm(\"trap;\"); /*",
      "\"); system(\"rm -rf ~\"); //",
      "%_ LIKE '%' ESCAPE '\\' ?1 :a @b $c",
      "back\\slash\\ ?" "?/ trigraph",
      "ünïcødé ✓ 注入",
  };
  return s;
}

std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const std::size_t at = s.find(from);
  if (at == std::string::npos) throw std::runtime_error("not in the space: " + from);
  return s.replace(at, from.size(), to);
}

TEST(ReliabilityInputSafety, CodeInYamlIsRefusedWhereverItCouldReachTheSource) {
  TempDir dir;
  const Recording rec(dir);
  const std::string base = read_bytes(rec.space);
  struct Attempt {
    std::string what, from, to, says;
  };
  const std::vector<Attempt> attempts = {
      {"int param: code as a value", "block_m: [64, 128]", "block_m: [64, 128); asm(\"trap;\"); //]", "expected an integer"},
      {"int param: an expression", "block_m: [64, 128]", "block_m: [64, 128 + 1]", "expected an integer"},
      {"int param: a quoted number", "block_m: [64, 128]", "block_m: [64, \"128\"]", "expected an integer"},
      {"bool param: code", "q_in_regs: bool", "q_in_regs: [true, \"1; asm(\\\"trap;\\\")\"]", "q_in_regs"},
      {"enum param: a newline and a directive", "enum: [interleaved, blockwise]",
       "enum: [interleaved, \"blockwise\\n#include </etc/passwd>\"]", "is not a valid value name"},
      {"enum param: a call", "enum: [interleaved, blockwise]", "enum: [interleaved, \"b) asm(\\\"trap;\\\"); (\"]",
       "is not a valid value name"},
      {"param name: a comment", "  block_m: [64, 128]", "  \"block_m */ asm(\\\"trap;\\\"); /*\": [64, 128]", "block_m"},
      {"param name: a directive", "  block_m: [64, 128]", "  \"block_m\\n#define ATT_HEAD_DIM 7\": [64, 128]", "block_m"},
      {"family: a directive", "family: flash_fwd_mma", "family: \"flash_fwd_mma\\n#include <evil.h>\"", "family"},
      {"derived: a comment in the expression", "threads: warps * 32", "threads: \"warps * 32 /* */\"", "threads"},
      {"derived: a string", "threads: warps * 32", "threads: \"'x' + 1\"", "threads"},
      {"device limit: code as a value", "max_threads_per_block: 1024}",
       "max_threads_per_block: \"1024); asm(\\\"trap;\\\")\"}", "expected an integer"},
      {"arch: an option", "archs: [sm_80, sm_86, sm_89, sm_90]", "archs: [sm_80, sm_86, sm_89, \"sm_90 -DEVIL=1\"]",
       "is not an arch of the form"},
      {"problem field: code", "d: [64, 128, 256]", "d: [64, \"128); asm(\\\"trap;\\\")\", 256]", "problem.d"},
  };
  int n = 0;
  for (const Attempt& a : attempts) {
    SCOPED_TRACE(a.what);
    const std::string path = dir.file(fmt::format("attempt{:02}.yaml", n++));
    write_bytes(path, replace_once(base, a.from, a.to));
    try {
      SearchSpace::load(path);
      ADD_FAILURE() << "loaded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ":"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(a.says), std::string::npos) << e.what();
    }
    const Ran r = run({"space", "--space", path, "--problem", rec.problem, "--count"}, dir.path());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  std::printf("%zu injection attempts through the YAML refused (exit 2, file:line:column)\n", attempts.size());
}

TEST(ReliabilityInputSafety, CodeOnTheCommandLineIsRefused) {
  TempDir dir;
  const Recording rec(dir);
  const SearchSpace space = SearchSpace::load(rec.space);
  const std::string good = "block_m=128,block_n=64,warps=4,kv_stages=2,q_in_regs=true,min_blocks=1,frag_prefetch=1,"
                           "lazy_rescale=true,kv_schedule=interleaved,sub_n=64";
  ASSERT_NO_THROW(space.parse_config(good));
  struct Attempt {
    std::string from, to;
  };
  const std::vector<Attempt> configs = {
      {"block_m=128", "block_m=128);asm(\"trap;\");//"},  // int
      {"block_m=128", "block_m=0x80"},
      {"block_m=128", "block_m=128 /*x*/"},
      {"q_in_regs=true", "q_in_regs=true;asm(\"trap;\")"},  // bool
      {"q_in_regs=true", "q_in_regs=TRUE"},
      {"kv_schedule=interleaved", "kv_schedule=interleaved\n#include <evil.h>"},  // enum
      {"kv_schedule=interleaved", "kv_schedule=KV_SCHEDULE_BLOCKWISE"},
      {"kv_schedule=interleaved", "kv_schedule=1"},
      {"sub_n=64", "sub_n=64,ATT_HEAD_DIM=7"},  // a macro of the source as a parameter
  };
  for (const Attempt& a : configs) {
    const std::string text = replace_once(good, a.from, a.to);
    SCOPED_TRACE(text);
    EXPECT_THROW(space.parse_config(text), InputError);
    // eval refuses it before it starts a GPU worker (exit 2, here and on a GPU machine alike).
    const Ran r = run({"eval", "--space", rec.space, "--problem", rec.problem, "--config", text}, dir.path());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  }
  for (const std::string p : {"b=4,h=16,s=4096,d=128);asm(\"trap;\");//,dtype=bf16,causal=0",
                              "b=4,h=16,s=4096,d=128,dtype=bf16\n#define X,causal=0",
                              "b=4,h=16,s=4096,d=128,dtype=bf16,causal=0;DROP TABLE campaigns"}) {
    SCOPED_TRACE(p);
    EXPECT_THROW(Problem::parse(p), InputError);
    const Ran r = run({"space", "--space", rec.space, "--problem", p, "--count"}, dir.path());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << "one line, even with a newline in the input:\n" << r.err;
  }
  // A campaign name is free text, but one line of it: control characters are refused.
  for (const std::string& name : std::vector<std::string>{"a\nb", "tab\there", std::string("esc") + '\x1b' + "[31m"}) {
    const Ran r = run(rec.tune(dir.file("w.db"), name, 0, {"--budget-evals", "3"}), dir.path());
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("w.db")));
  }
}

TEST(ReliabilityInputSafety, RenderedSourcesHoldOnlyIntegersFromTheInputs) {
  TempDir dir;
  const Recording rec(dir);
  // Valid YAML whose free text carries code: it must not reach any source.
  const std::string evil = "*/ #include </etc/passwd> /* \\\" asm(\\\"trap;\\\");";
  std::string text = read_bytes(rec.space);
  text = replace_once(text, "description: ", "description: \"" + evil + "\" # ");
  text = replace_once(text, "block_m: [64, 128]", "block_m: {values: [64, 128], doc: \"" + evil + "\"}");
  text += "# " + evil + "\n";
  const std::string path = dir.file("hostile-but-valid.yaml");
  write_bytes(path, text);
  const SearchSpace space = SearchSpace::load(path);
  const Problem problem = Problem::parse(rec.problem);
  const std::string body = flatten_includes(builtin_family(space.family()).main_file);
  const std::regex define("#define [A-Z][A-Z0-9_]* -?[0-9]+");
  const std::regex first("// attntune candidate: [a-z0-9_]+ [a-z0-9_=,]+ \\(d=[0-9]+, dtype=(fp16|bf16), causal=[01]\\)");
  std::size_t n = 0, defines = 0;
  for (const std::string arch : {"sm_80", "sm_89", "sm_90"}) {
    for (const Config& c : space.enumerate(problem, arch)) {
      const RenderedKernel k = render_kernel(space, c, problem, arch);
      ++n;
      ASSERT_EQ(k.source.find("passwd"), std::string::npos);
      ASSERT_EQ(k.source.find("trap;"), std::string::npos);
      ASSERT_GE(k.source.size(), body.size());
      // Everything before the template: the candidate line, then #define NAME INTEGER lines.
      ASSERT_EQ(k.source.compare(k.source.size() - body.size(), body.size(), body), 0) << "the template was altered";
      std::istringstream lines(k.source.substr(0, k.source.size() - body.size()));
      std::string line;
      ASSERT_TRUE(std::getline(lines, line));
      ASSERT_TRUE(std::regex_match(line, first)) << line;
      while (std::getline(lines, line)) {
        ASSERT_TRUE(std::regex_match(line, define)) << "not an integer #define: " << line;
        ++defines;
      }
    }
  }
  EXPECT_GT(n, 1000u);
  std::printf("%zu rendered candidates (sm_80/89/90) from a space whose free text carries code: %zu #define lines, "
              "each NAME INTEGER; the template verbatim\n", n, defines);
}

// ---- SQL metacharacters ---------------------------------------------------------------------------

TEST(ReliabilityInputSafety, SqlMetacharactersRoundTripThroughEveryStoredStringField) {
  TempDir dir;
  const std::string path = dir.file("sql.db");
  int i = 0;
  for (const std::string& s : hostile()) {
    SCOPED_TRACE(s);
    const std::string tag = std::to_string(i++);
    Store store = Store::open(path, Store::Mode::kCreate);
    const DeviceInfo dev{s + " GPU", "sm_90" + s, "GPU-" + s, 132, "580" + s};
    const std::int64_t d = store.upsert_device(dev);
    EXPECT_EQ(store.upsert_device(dev), d) << "the same device found again";
    CampaignSpec spec;
    spec.name = s + tag;
    spec.problem = Problem::parse("b=1,h=2,s=64,d=64,dtype=fp16,causal=1");
    spec.space_path = "/spaces/" + s + ".yaml";
    spec.space_hash = "hash" + s;
    spec.family = "family" + s;
    spec.strategy = "strategy" + s;
    spec.space_text = "description: " + s + "\n" + std::string(1, '\0') + "after a NUL";
    const std::int64_t c = store.open_campaign(spec, d);
    const Config config = {{"e", Value("value_" + tag)}, {"i", Value(std::int64_t{7})}, {"b", Value(true)}};
    const std::int64_t cand = store.upsert_candidate(spec.family, config, "src" + s);
    EXPECT_EQ(store.upsert_candidate(spec.family, config, "src" + s), cand);
    // A config is stored through bound parameters whatever it holds; read back, one that no space
    // can produce (SQL in an enum value) is refused as a crafted database's (db/store_rows.hpp).
    {
      CampaignSpec other = spec;
      other.name = spec.name + "-config";
      const std::int64_t oc = store.open_campaign(other, d);
      const Config hostile_config = {{"e", Value(s)}, {"i", Value(std::int64_t{7})}};
      store.record_evaluation(oc, store.upsert_candidate(spec.family, hostile_config, "src" + s), d, EvalRecord{"compile_error", "x"});
      try {
        store.campaign_evaluations(oc);
        ADD_FAILURE() << "a config no space can hold was read back";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("holds a config attntune does not write"), std::string::npos) << e.what();
      }
    }
    EvalRecord bad;
    bad.status = "compile_error";
    bad.error = "error: " + s;
    store.record_evaluation(c, cand, d, bad);
    EvalRecord ok = bad;
    ok.status = "ok";
    ok.error = "";
    ok.median_us = 12.5;
    ok.tflops = 3;
    ok.max_abs_err = 1e-3;
    store.record_evaluation(c, cand, d, ok);
    BuildRecord b;
    b.status = "compile_error";
    b.log = "log " + s;
    b.cubin = std::string("bytes\0x", 7) + s;
    const BuildKey key{"src" + s, "sm_90" + s, "13.0" + s, "-std=c++17 " + s};
    store.put_build(key, b);
    store.finish_campaign(c, "stopped", "reason: " + s);

    const auto row = store.campaign_row(spec.name);
    ASSERT_TRUE(row);
    EXPECT_EQ(row->spec.name, spec.name);
    EXPECT_EQ(row->spec.space_path, spec.space_path);
    EXPECT_EQ(row->spec.space_hash, spec.space_hash);
    EXPECT_EQ(row->spec.family, spec.family);
    EXPECT_EQ(row->spec.strategy, spec.strategy);
    EXPECT_EQ(row->spec.space_text, spec.space_text);
    EXPECT_EQ(row->stop_reason, "reason: " + s);
    EXPECT_EQ(row->gpu, dev.name);
    EXPECT_EQ(row->arch, dev.arch);
    const auto evals = store.campaign_evaluations(c);
    ASSERT_EQ(evals.size(), 2u);
    EXPECT_EQ(evals[0].config, config);
    EXPECT_EQ(evals[0].record.error, bad.error);
    const auto built = store.find_build(key);
    ASSERT_TRUE(built);
    EXPECT_EQ(built->log, b.log);
    EXPECT_EQ(built->cubin, b.cubin);
    BestQuery q;
    q.campaign = spec.name;
    const auto best = store.best(q);
    ASSERT_EQ(best.size(), 1u);
    EXPECT_EQ(best[0].campaign, spec.name);
    EXPECT_EQ(best[0].gpu, dev.name);
    EXPECT_EQ(best[0].config, config);
    EXPECT_EQ(best[0].source_hash, "src" + s);
    // Exact matches only: a name with LIKE or GLOB wildcards finds itself and nothing else.
    q.campaign = "%";
    EXPECT_TRUE(store.best(q).empty());
    EXPECT_FALSE(store.find_campaign("k%"));
  }
  ASSERT_EQ(integrity_check(path), "ok");
  Store store = Store::open(path, Store::Mode::kReadOnly);
  EXPECT_EQ(store.campaigns().size(), 2 * hostile().size()) << "every campaign there, no table dropped";
}

TEST(ReliabilityInputSafety, CraftedCampaignNamesSpacePathsDeviceNamesAndErrorsThroughTheBinary) {
  TempDir dir;
  const Recording rec(dir);
  // A recording whose GPU name and one error text are hostile: `tune --simulate-db` copies both
  // into the campaign it writes ("simulated <gpu>", the evaluation's error).
  const std::string evil_gpu = "H100'); DROP TABLE devices; -- */ #include <x>";
  const std::string evil_error = "ptxas: \"'); DELETE FROM evaluations; --";
  const std::string recording = dir.file("recording.db");
  fs::copy_file(rec.db, recording);
  const SearchSpace space = SearchSpace::load(rec.space);
  const Config first = space.enumerate(Problem::parse(rec.problem), "sm_90").front();
  {
    sqlite::Connection c = sqlite::Connection::open(recording, SQLITE_OPEN_READWRITE);
    sqlite::Statement(c, "UPDATE devices SET name = ?1").bind(evil_gpu).run();
    sqlite::Statement(c,
                      "UPDATE evaluations SET status = 'compile_error', error = ?1, median_us = NULL, tflops = NULL, "
                      "max_abs_err = NULL WHERE candidate_id IN (SELECT id FROM candidates WHERE config_key = ?2)")
        .bind(evil_error, config_str(first))
        .run();
  }
  // The space under a hostile file name (same bytes, same hash).
  const std::string evil_space = dir.file("space'; DROP TABLE campaigns; --.yaml");
  fs::copy_file(rec.space, evil_space);

  const std::string db = dir.file("names.db");
  std::vector<std::string> names = hostile();
  names.push_back("plain");
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const Ran r = run({"tune", "--space", evil_space, "--problem", rec.problem, "--db", db, "--campaign", name,
                       "--simulate-db", recording, "--simulate-campaign", rec.campaign, "--strategy", "exhaustive",
                       "--budget-evals", "6", "--final-top", "2", "--final-rounds", "1"},
                      dir.path());
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  ASSERT_EQ(integrity_check(db), "ok");

  const Ran listed = run({"campaigns", "--db", db, "--format", "json"}, dir.path());
  ASSERT_EQ(listed.rc, 0) << listed.err;
  const nlohmann::json all = nlohmann::json::parse(listed.out);
  ASSERT_EQ(all.size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(all[i]["name"], names[i]);
    EXPECT_EQ(all[i]["space_path"], evil_space);
    EXPECT_EQ(all[i]["gpu"], "simulated " + evil_gpu);
    EXPECT_EQ(all[i]["evaluations"], 6);
  }
  {
    Store s = Store::open(db, Store::Mode::kReadOnly);
    const auto evals = s.campaign_evaluations(*s.find_campaign("plain"));
    ASSERT_FALSE(evals.empty());
    EXPECT_EQ(evals.front().config, first);
    EXPECT_EQ(evals.front().record.error, evil_error);
  }
  const Ran plain_cu = run({"export", "--db", db, "--campaign", "plain", "-o", dir.file("plain.cu")}, dir.path());
  ASSERT_EQ(plain_cu.rc, 0) << plain_cu.err;
  const std::string plain_code = code_only(read_bytes(dir.file("plain.cu")));
  for (const std::string& name : hostile()) {
    SCOPED_TRACE(name);
    const Ran best = run({"best", "--db", db, "--campaign", name, "--top", "3", "--format", "json"}, dir.path());
    ASSERT_EQ(best.rc, 0) << best.err;
    const nlohmann::json rows = nlohmann::json::parse(best.out);
    ASSERT_EQ(rows.size(), 3u) << "only this campaign's rows";
    for (const auto& row : rows) {
      EXPECT_EQ(row["campaign"], name);
      EXPECT_EQ(row["gpu"], "simulated " + evil_gpu);
    }
    const Ran report = run({"report", "--db", db, "--campaign", name, "--format", "json"}, dir.path());
    EXPECT_EQ(report.rc, 0) << report.err;
    const Ran table = run({"campaigns", "--db", db}, dir.path());
    EXPECT_NE(table.out.find(name), std::string::npos);

    const std::string cu = dir.file("hostile.cu");
    const Ran ex = run({"export", "--db", db, "--campaign", name, "-o", cu}, dir.path());
    ASSERT_EQ(ex.rc, 0) << ex.err;
    const std::string source = read_bytes(cu);
    EXPECT_EQ(code_only(source), plain_code) << "the campaign name or GPU name changed the exported code";
    const nlohmann::json info = nlohmann::json::parse(kernel_info(source));
    EXPECT_EQ(info["campaign"], name);
    EXPECT_EQ(info["gpu"], "simulated " + evil_gpu);
  }
  std::printf("%zu crafted campaign names, a crafted space path, GPU name and error text: stored and read back "
              "byte for byte by campaigns/best/report/export; exported code identical to a plain name's\n",
              hostile().size());
}

}  // namespace
}  // namespace test_input_safety
}  // namespace attntune::reliability
