// `attntune report` end to end, through the binary, on a database built with the Store API: the
// text report, the JSON and CSV, the SVG figure (well-formed, escaped), PNG through a converter on
// $PATH or exit 3 with nothing written, and the exit codes of bad input.
#include <sys/stat.h>

#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/unit/db/db_test_util.hpp"

namespace test_report_cli {
using namespace attntune;
using namespace attntune::test;

namespace {

const std::string kTricky = "night <run> & \"quoted\"";

std::string read_text(const std::string& path) { return read_bytes(path); }

std::string space_text() { return read_bytes(std::string(ATTNTUNE_SOURCE_DIR) + "/search_spaces/flash_fwd_mma.yaml"); }

Config fa_config(std::int64_t block_m, std::int64_t block_n, std::int64_t kv_stages, bool q_in_regs) {
  return {{"block_m", block_m},   {"block_n", block_n},          {"warps", std::int64_t{4}},
          {"kv_stages", kv_stages}, {"q_in_regs", q_in_regs},    {"min_blocks", std::int64_t{1}},
          {"frag_prefetch", std::int64_t{1}}, {"lazy_rescale", true}, {"kv_schedule", std::string("interleaved")},
          {"sub_n", block_n}};
}

// A tiny XML checker: every element closed in order, attribute values quoted, no raw '<' or stray
// '&' in text. Enough to catch unescaped text and unbalanced output.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  std::size_t i = 0;
  auto check_text = [&](std::size_t from, std::size_t to) -> std::string {
    for (std::size_t k = from; k < to; ++k) {
      if (doc[k] == '>') return "raw '>' in text at " + std::to_string(k);
      if (doc[k] != '&') continue;
      const std::size_t semi = doc.find(';', k);
      if (semi == std::string::npos || semi - k > 6) return "stray '&' at " + std::to_string(k);
      static const std::set<std::string> entities = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
      if (!entities.count(doc.substr(k, semi - k + 1))) return "unknown entity at " + std::to_string(k);
    }
    return "";
  };
  while (i < doc.size()) {
    const std::size_t lt = doc.find('<', i);
    if (auto e = check_text(i, lt == std::string::npos ? doc.size() : lt); !e.empty()) return e;
    if (lt == std::string::npos) break;
    bool quoted = false;
    std::size_t gt = lt + 1;
    for (; gt < doc.size(); ++gt) {
      if (doc[gt] == '"') quoted = !quoted;
      if (!quoted && doc[gt] == '<') return "'<' inside a tag at " + std::to_string(gt);
      if (quoted && doc[gt] == '<') return "'<' inside an attribute at " + std::to_string(gt);
      if (!quoted && doc[gt] == '>') break;
    }
    if (gt >= doc.size()) return "unterminated tag at " + std::to_string(lt);
    const std::string tag = doc.substr(lt + 1, gt - lt - 1);
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
    } else if (tag.back() != '/' && tag[0] != '?' && tag[0] != '!') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n\t")));
    }
    i = gt + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return "";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

bool on_path(const std::string& tool) {
  const char* env = std::getenv("PATH");
  std::string path = env ? env : "";
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    start = end + 1;
    if (!dir.empty() && ::access((dir + "/" + tool).c_str(), X_OK) == 0) return true;
  }
  return false;
}

void write_script(const std::string& path, const std::string& body) {
  write_bytes(path, "#!/bin/sh\n" + body);
  ::chmod(path.c_str(), 0755);
}

struct ReportCli : ::testing::Test {
  TempDir dir, scratch, out;
  std::string db = dir.file("results.db");

  void SetUp() override {
    Store store = Store::open(db, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    CampaignSpec main_spec = spec("main");
    main_spec.space_text = space_text();
    const std::int64_t c = store.open_campaign(main_spec, dev);
    std::vector<std::int64_t> ranked;
    auto eval = [&](const Config& cfg, const EvalRecord& e) {
      const std::int64_t id = store.upsert_candidate("flash_fwd_mma", cfg, config_str(cfg));
      store.record_evaluation(c, id, dev, e);
      return id;
    };
    eval(fa_config(64, 32, 2, false), ok_eval(1500, 350));
    const std::int64_t good = eval(fa_config(128, 64, 2, false), ok_eval(1300, 404));
    eval(fa_config(128, 128, 3, false), failed_eval("resources", "too much shared memory"));
    eval(fa_config(64, 64, 3, true), ok_eval(1400, 375));
    eval(fa_config(128, 32, 1, true), failed_eval("timeout", "ran past 2.0 s"));
    const std::int64_t best = eval(fa_config(128, 64, 3, true), ok_eval(1200, 438));
    eval(fa_config(64, 128, 2, true), failed_eval("resources", "too much shared memory"));
    eval(fa_config(64, 32, 3, true), ok_eval(1416, 371));
    eval(fa_config(128, 32, 2, false), failed_eval("wrong_result", "max |err| 0.5 > 0.01"));
    store.put_ranking(c, dev,
                      {{best, 1190.5, 441.2, 1.5e-3, 0.8, 7}, {good, 1302.25, 403.4, 1.2e-3, 1.1, 7}});
    store.finish_campaign(c, "completed", "budget of 9 evaluations spent");

    CampaignSpec empty_spec = spec("empty");
    empty_spec.space_text = main_spec.space_text;
    store.open_campaign(empty_spec, dev);

    CampaignSpec tricky = spec(kTricky);
    tricky.space_text = main_spec.space_text;
    const std::int64_t t = store.open_campaign(tricky, dev);
    store.record_evaluation(t, store.upsert_candidate("flash_fwd_mma", fa_config(64, 64, 2, true), "t1"), dev,
                            ok_eval(1350, 390));
    store.record_evaluation(t, store.upsert_candidate("flash_fwd_mma", fa_config(64, 32, 2, true), "t2"), dev,
                            failed_eval("crashed", "illegal address"));
  }

  CommandResult report(const std::string& args, const std::string& env = "") {
    return run_shell(env + " " + std::string(ATTNTUNE_BIN) + " report --db '" + db + "' " + args, scratch.path());
  }
};

}  // namespace

TEST_F(ReportCli, TextReportReadsWell) {
  const CommandResult r = report("--campaign main");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* want :
       {"Campaign 'main'", "b=4,h=16,hkv=16,s=4096,sk=4096,d=128,dtype=bf16,causal=1", "flash_fwd_mma",
        "NVIDIA H100 80GB HBM3 (sm_90)", "evo, seed 7", "completed: budget of 9 evaluations spent",
        "9 configs over", "5 ok, 2 resources, 1 timeout, 1 wrong_result", "best       1190 µs, 441.2 TFLOP/s (final ranking: re-timed over 7 rounds)",
        "the search found it at eval 6 of 9", "Convergence", "Final ranking (top 2", "Parameter effects",
        "(last evaluation)", "first ok: block_m=64"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  // Each improvement names what changed from the previous best.
  EXPECT_NE(r.out.find("block_m 64→128"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_stages 2→3, q_in_regs false→true"), std::string::npos) << r.out;
  // Readings, most influential first: kv_stages=1 only timed out; block_m=64 is 1.17x slower at best.
  EXPECT_NE(r.out.find("  block_m: 128 is best; 64 is 1.17x slower at best"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_stages: 3 is best; 2 is 1.08x slower at best; 1 never ran ok (1 timeout)"),
            std::string::npos)
      << r.out;
  EXPECT_LT(r.out.find("  block_m:"), r.out.find("  kv_stages:"));
  EXPECT_NE(r.out.find("  not varied: frag_prefetch=1, kv_schedule=interleaved, lazy_rescale=true, min_blocks=1, warps=4\n"),
            std::string::npos)
      << r.out;
}

TEST_F(ReportCli, JsonHasTheDocumentedShape) {
  const CommandResult r = report("--campaign main --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("campaign"), "main");
  EXPECT_EQ(Problem::from_json(j.at("problem")), problem());
  EXPECT_EQ(j.at("template"), "flash_fwd_mma");
  EXPECT_EQ(j.at("gpu"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j.at("evaluations"), 9);
  EXPECT_EQ(j.at("ok"), 5);
  EXPECT_EQ(j.at("by_status"), nlohmann::json({{"ok", 5}, {"resources", 2}, {"timeout", 1}, {"wrong_result", 1}}));
  // best: the final ranking's first, re-timed.
  EXPECT_EQ(j.at("best").at("config"), config_json(fa_config(128, 64, 3, true)));
  EXPECT_EQ(j.at("best").at("median_us"), 1190.5);
  EXPECT_EQ(j.at("best").at("tflops"), 441.2);

  const auto& conv = j.at("convergence");
  ASSERT_EQ(conv.size(), 4u);  // evals 1, 2, 6 improved; 9 is the last
  const std::vector<int> evals = {1, 2, 6, 9};
  const std::vector<double> best_us = {1500, 1300, 1200, 1200};
  for (std::size_t i = 0; i < conv.size(); ++i) {
    EXPECT_EQ(conv[i].at("eval"), evals[i]);
    EXPECT_EQ(conv[i].at("best_us"), best_us[i]);
    EXPECT_TRUE(conv[i].at("seconds").is_number());
    EXPECT_GE(conv[i].at("seconds").get<double>(), 0);
  }

  const auto& params = j.at("parameters");
  ASSERT_EQ(params.size(), 10u);
  EXPECT_EQ(params[0].at("name"), "block_n");  // 1.18x; ties with sub_n, then by name
  for (const auto& p : params) {
    ASSERT_TRUE(p.at("name").is_string());
    for (const auto& v : p.at("values")) {
      for (const char* key : {"value", "evaluated", "ok", "failed_by_status", "best_us", "median_us", "best_ratio"})
        EXPECT_TRUE(v.contains(key)) << key;
      EXPECT_TRUE(v.at("failed_by_status").is_object());
    }
  }
  const auto& kv_stages = *std::find_if(params.begin(), params.end(), [](const auto& p) { return p["name"] == "kv_stages"; });
  const auto& stage1 = kv_stages.at("values")[0];
  EXPECT_EQ(stage1.at("value"), 1);
  EXPECT_EQ(stage1.at("evaluated"), 1);
  EXPECT_EQ(stage1.at("ok"), 0);
  EXPECT_EQ(stage1.at("failed_by_status"), nlohmann::json({{"timeout", 1}}));
  EXPECT_TRUE(stage1.at("best_us").is_null());
  EXPECT_TRUE(stage1.at("best_ratio").is_null());
  const auto& stage2 = kv_stages.at("values")[1];
  EXPECT_EQ(stage2.at("evaluated"), 4);
  EXPECT_EQ(stage2.at("ok"), 2);
  EXPECT_EQ(stage2.at("best_us"), 1300);
  EXPECT_DOUBLE_EQ(stage2.at("best_ratio").get<double>(), 1300.0 / 1200.0);
  EXPECT_EQ(stage2.at("median_us"), 1400);  // of 1500, 1300

  const auto& ranking = j.at("ranking");
  ASSERT_EQ(ranking.size(), 2u);
  EXPECT_EQ(ranking[0].at("rank"), 1);
  EXPECT_EQ(ranking[1].at("median_us"), 1302.25);
  EXPECT_EQ(ranking[1].at("config"), config_json(fa_config(128, 64, 2, false)));
}

TEST_F(ReportCli, CsvHasOneRowPerEvaluation) {
  const CommandResult r = report("--campaign main --format csv");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string header = r.out.substr(0, r.out.find('\n'));
  EXPECT_EQ(header.rfind("eval,seconds,status,median_us,tflops,best_us,block_m,block_n,", 0), 0u) << header;
  EXPECT_EQ(count(r.out, "\n"), 10u);  // header and 9 evaluations
  EXPECT_NE(r.out.find("\n3,"), std::string::npos);
  EXPECT_NE(r.out.find("too much shared memory"), std::string::npos);
}

TEST_F(ReportCli, SvgIsWellFormedWithItsPanels) {
  const std::string svg = out.file("main.svg");
  const CommandResult r = report("--campaign main --plot '" + svg + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("plot: " + svg), std::string::npos);
  const std::string doc = read_text(svg);
  ASSERT_EQ(doc.rfind("<svg", 0), 0u) << doc.substr(0, 200);
  EXPECT_EQ(xml_problem(doc), "");
  EXPECT_EQ(count(doc, "<text"), count(doc, "</text>"));
  EXPECT_GE(count(doc, "<polyline"), 2u);  // best so far against evaluations and against time
  for (const char* want : {"Best so far against evaluations", "Best so far against time", "Parameter effects",
                           "evaluation #", "TFLOP/s", "median time (µs)", ">block_m<", ">kv_stages<",
                           "resources (2)", "timeout (1)", "attntune report: main"})
    EXPECT_NE(doc.find(want), std::string::npos) << want;
  if (on_path("xmllint")) {
    const CommandResult lint = run_shell("xmllint --noout '" + svg + "'", scratch.path());
    EXPECT_EQ(lint.status, 0) << lint.err;
  }
  // Nothing else left beside it.
  EXPECT_EQ(snapshot(out.path()).size(), 1u);
}

TEST_F(ReportCli, SvgEscapesText) {
  const std::string svg = out.file("tricky.SVG");  // the extension in any case
  const CommandResult r = report("--campaign '" + kTricky + "' --plot '" + svg + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string doc = read_text(svg);
  EXPECT_EQ(xml_problem(doc), "");
  EXPECT_NE(doc.find("night &lt;run&gt; &amp; &quot;quoted&quot;"), std::string::npos);
  EXPECT_EQ(doc.find(kTricky), std::string::npos);
  EXPECT_NE(doc.find("crashed (1)"), std::string::npos);
}

TEST_F(ReportCli, PngWithNoConverterExits3AndWritesNothing) {
  TempDir empty_path;
  const std::string png = out.file("main.png");
  const CommandResult r = report("--campaign main --plot '" + png + "'", "PATH='" + empty_path.path().string() + "'");
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.err, "attntune: error: --plot " + png +
                       " needs rsvg-convert (apt install librsvg2-bin) or ImageMagick; use a .svg name to write SVG "
                       "directly\n");
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(snapshot(out.path()).empty());
}

TEST_F(ReportCli, PngGoesThroughTheConverterAsAnArgv) {
  TempDir bin;
  const std::string args_file = bin.file("args.txt");
  // A stand-in rsvg-convert: records its argv, writes a PNG signature and the SVG after it.
  write_script(bin.file("rsvg-convert"), "for a in \"$@\"; do printf '%s\\n' \"$a\"; done > '" + args_file +
                                             "'\nprintf '\\211PNG\\r\\n\\032\\n' > \"$4\"\nwhile IFS= read -r l; do "
                                             "printf '%s\\n' \"$l\"; done < \"$5\" >> \"$4\"\n");
  const std::string png = out.file("with space & more.png");
  const CommandResult r = report("--campaign main --plot '" + png + "'", "PATH='" + bin.path().string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string image = read_bytes(png);
  EXPECT_EQ(image.rfind("\x89PNG\r\n\x1a\n", 0), 0u);
  EXPECT_NE(image.find("<svg"), std::string::npos);
  const std::string argv = read_bytes(args_file);
  EXPECT_EQ(argv.rfind("-f\npng\n-o\n", 0), 0u) << argv;
  EXPECT_NE(argv.find(".png\n"), std::string::npos) << argv;
  EXPECT_NE(argv.find(".svg\n"), std::string::npos) << argv;
  EXPECT_EQ(snapshot(out.path()).size(), 1u);  // the temporary SVG and PNG are gone
}

TEST_F(ReportCli, AFailingConverterLeavesNothing) {
  TempDir bin;
  write_script(bin.file("rsvg-convert"), "printf 'half a png' > \"$4\"\necho 'rsvg-convert: cannot render' >&2\nexit 4\n");
  const std::string png = out.file("main.png");
  const CommandResult r = report("--campaign main --plot '" + png + "'", "PATH='" + bin.path().string() + "'");
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.err.rfind("attntune: error: --plot " + png + ": could not convert the SVG to PNG: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("exit 4: rsvg-convert: cannot render"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "\n"), 1u);
  EXPECT_TRUE(snapshot(out.path()).empty());
}

TEST_F(ReportCli, PngWithTheToolsOfThisMachine) {
  // Whatever this machine has: a PNG, or exit 3 with nothing written.
  const std::string png = out.file("main.png");
  const CommandResult r = report("--campaign main --plot '" + png + "'");
  const bool any = on_path("rsvg-convert") || on_path("magick") || on_path("convert") || on_path("inkscape");
  if (on_path("rsvg-convert")) {
    EXPECT_EQ(r.status, 0) << r.err;
  }
  if (r.status == 0) {
    EXPECT_TRUE(any);
    EXPECT_EQ(read_bytes(png).rfind("\x89PNG\r\n\x1a\n", 0), 0u);
  } else {
    EXPECT_EQ(r.status, 3) << r.err;
    EXPECT_EQ(r.err.rfind("attntune: error: --plot " + png, 0), 0u) << r.err;
    EXPECT_EQ(count(r.err, "\n"), 1u) << r.err;
    EXPECT_TRUE(snapshot(out.path()).empty());
  }
}

TEST_F(ReportCli, BadInputExits2) {
  const CommandResult ext = report("--campaign main --plot '" + out.file("main.pdf") + "'");
  EXPECT_EQ(ext.status, 2);
  EXPECT_NE(ext.err.find("unknown image type '.pdf' (use a .svg or .png name)"), std::string::npos) << ext.err;
  const CommandResult none = report("--campaign main --plot '" + out.file("main") + "'");
  EXPECT_EQ(none.status, 2);
  EXPECT_TRUE(snapshot(out.path()).empty());

  const CommandResult unknown = report("--campaign nope");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_EQ(unknown.err, "attntune: error: no campaign 'nope' in database '" + db +
                             "' (attntune campaigns lists them)\n");
  EXPECT_EQ(report("").status, 2);  // --campaign is required
  EXPECT_EQ(report("--campaign main --format yaml").status, 2);
  const CommandResult dir = report("--campaign main --plot '" + out.file("missing/x.svg") + "'");
  EXPECT_EQ(dir.status, 2);
  EXPECT_EQ(dir.err.rfind("attntune: error: --plot ", 0), 0u);
  EXPECT_TRUE(snapshot(out.path()).empty());
  const CommandResult no_db = run_shell(std::string(ATTNTUNE_BIN) + " report --db '" + out.file("absent.db") +
                                            "' --campaign main",
                                        scratch.path());
  EXPECT_EQ(no_db.status, 2);
  EXPECT_FALSE(fs::exists(out.file("absent.db")));
}

TEST_F(ReportCli, ACampaignWithNoEvaluationsSaysSo) {
  const CommandResult text = report("--campaign empty");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("nothing yet: the campaign has no evaluations"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("Convergence"), std::string::npos);

  const CommandResult json = report("--campaign empty --format json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j.at("evaluations"), 0);
  EXPECT_TRUE(j.at("best").is_null());
  EXPECT_TRUE(j.at("convergence").empty());
  EXPECT_TRUE(j.at("parameters").empty());
  EXPECT_TRUE(j.at("ranking").empty());

  const std::string svg = out.file("empty.svg");
  ASSERT_EQ(report("--campaign empty --plot '" + svg + "'").status, 0);
  const std::string doc = read_text(svg);
  EXPECT_EQ(xml_problem(doc), "");
  EXPECT_NE(doc.find("No evaluations recorded yet."), std::string::npos);
}

TEST_F(ReportCli, TheDatabaseComesFromTheEnvironment) {
  const CommandResult r = run_shell("ATTNTUNE_DB='" + db + "' " + std::string(ATTNTUNE_BIN) + " report --campaign main",
                                    scratch.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Campaign 'main'"), std::string::npos);
}
}  // namespace test_report_cli
