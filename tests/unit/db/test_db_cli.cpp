// `attntune best` and `attntune campaigns` end to end, through the binary: the JSON of docs/CONTRACT.md,
// CSV (RFC 4180), tables, exit codes and error lines.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "db_test_util.hpp"
#include "tests/common/run_attntune.hpp"

namespace test_db_cli {
using namespace attntune;
using namespace attntune::test;
using attntune::testing::lines;

namespace {

const std::string kTricky = "tricky, \"quoted\" name";

// An RFC 4180 reader: quoted fields may hold commas, doubled quotes and newlines.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, any = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        field += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        field += c;
    } else if (c == '"') {
      quoted = any = true;
    } else if (c == ',') {
      row.push_back(field), field.clear();
    } else if (c == '\n') {
      row.push_back(field), field.clear();
      rows.push_back(row), row.clear();
    } else if (c != '\r') {
      field += c;
    }
  }
  if (!field.empty() || !row.empty()) row.push_back(field), rows.push_back(row);
  return rows;
}

std::size_t display_width(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

struct CliTest : ::testing::Test {
  TempDir dir, scratch;
  std::string db = dir.file("results.db");
  const Problem p1 = problem(), p2 = problem("b=1,h=8,hkv=2,s=512,sk=1024,d=64,dtype=fp16,causal=0");

  void SetUp() override {
    Store store = Store::open(db, Store::Mode::kCreate);
    const std::int64_t dev = store.upsert_device(h100());
    const std::int64_t c1 = store.open_campaign(spec("main", p1), dev);
    const std::int64_t c2 = store.open_campaign(spec(kTricky, p1), dev);
    const std::int64_t c3 = store.open_campaign(spec("small", p2), dev);
    auto eval = [&](std::int64_t c, const Config& cfg, const EvalRecord& e) {
      store.record_evaluation(c, store.upsert_candidate("flash_fwd_mma", cfg, "h1"), dev, e);
    };
    eval(c1, config(128, 64), ok_eval(1234.5678, 412.3456, 0.00195));
    eval(c1, config(64, 64), ok_eval(1500, 350));
    eval(c1, config(32, 32), failed_eval("launch_error", "too many resources requested for launch"));
    eval(c2, config(128, 128), ok_eval(1300, 390));
    eval(c3, config(64, 32), ok_eval(8.5, 12.25));
    store.finish_campaign(c1, "completed", "budget of 500 evaluations spent");
  }

  CommandResult attntune(const std::string& args) {
    return run_shell(std::string(ATTNTUNE_BIN) + " " + args, scratch.path());
  }
  std::string with_db(const std::string& args) { return args + " --db '" + db + "'"; }
};

}  // namespace

TEST_F(CliTest, BestJsonFollowsTheContract) {
  const CommandResult r = attntune(with_db("best --problem " + p1.str() + " --top 5 --format json"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);
  for (const auto& e : j) {
    for (const char* key : {"campaign", "template", "gpu", "arch", "evaluated_at"})
      EXPECT_TRUE(e.at(key).is_string()) << key;
    for (const char* key : {"median_us", "tflops", "max_abs_err"}) EXPECT_TRUE(e.at(key).is_number()) << key;
    EXPECT_TRUE(e.at("config").is_object());
    const auto& pj = e.at("problem");
    for (const char* key : {"b", "h", "hkv", "s", "sk", "d"}) EXPECT_TRUE(pj.at(key).is_number_integer()) << key;
    EXPECT_TRUE(pj.at("dtype").is_string());
    EXPECT_TRUE(pj.at("causal").is_boolean());
    EXPECT_EQ(Problem::from_json(pj), p1);
  }
  EXPECT_EQ(j[0]["campaign"], "main");
  EXPECT_EQ(j[0]["template"], "flash_fwd_mma");
  EXPECT_EQ(j[0]["config"], config_json(config(128, 64)));
  EXPECT_EQ(j[0]["median_us"].get<double>(), 1234.5678);
  EXPECT_EQ(j[0]["tflops"].get<double>(), 412.3456);
  EXPECT_DOUBLE_EQ(j[0]["gb_per_s"].get<double>(), p1.bytes() / 1234.5678 / 1e3);
  EXPECT_EQ(j[0]["max_abs_err"].get<double>(), 0.00195);
  EXPECT_EQ(j[0]["gpu"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j[0]["arch"], "sm_90");
  EXPECT_EQ(j[1]["campaign"], kTricky);
  EXPECT_EQ(j[2]["median_us"].get<double>(), 1500);
}

TEST_F(CliTest, BestCsvHasAHeaderAndQuotesFields) {
  const CommandResult r = attntune(with_db("best --top 10 --format csv"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = parse_csv(r.out);
  ASSERT_EQ(rows.size(), 5u) << r.out;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"rank", "campaign", "problem", "template", "config", "median_us",
                                               "tflops", "max_abs_err", "gpu", "arch", "evaluated_at",
                                               "gb_per_s"}));
  EXPECT_EQ(rows[1][0], "1");
  EXPECT_EQ(rows[1][1], "small");
  EXPECT_EQ(rows[1][2], p2.str());
  EXPECT_EQ(rows[1][4], config_str(config(64, 32)));
  EXPECT_EQ(rows[1][5], "8.5");
  EXPECT_EQ(rows[3][1], kTricky);
  for (const auto& row : rows) EXPECT_EQ(row.size(), 12u);
  // Bytes moved per second: the problem's Q, K, V and O over the median time.
  EXPECT_NEAR(std::stod(rows[1][11]), p2.bytes() / 8.5 / 1e3, 1e-6 * p2.bytes() / 8.5 / 1e3);
  EXPECT_NE(r.out.find("\"tricky, \"\"quoted\"\" name\""), std::string::npos) << r.out;
}

TEST_F(CliTest, BestTableIsAligned) {
  const CommandResult r = attntune(with_db("best --problem " + p1.str() + " --top 3"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto ls = lines(r.out);
  ASSERT_EQ(ls.size(), 7u) << r.out;  // title, blank, header, rule, 3 rows
  EXPECT_EQ(ls[0], "problem " + p1.str() + "  on  NVIDIA H100 80GB HBM3 (sm_90)");
  const std::string& header = ls[2];
  EXPECT_EQ(header.rfind("rank  campaign", 0), 0u) << header;
  // Numeric columns are right-aligned: every value ends where its header ends.
  for (const std::string col : {"median µs", "TFLOP/s"}) {
    const std::size_t at = header.find(col);
    ASSERT_NE(at, std::string::npos) << col;
    const std::size_t end = display_width(header.substr(0, at + col.size()));
    for (int i = 4; i < 7; ++i) {
      const std::string row = ls[static_cast<std::size_t>(i)];
      // Column positions are in characters; the rows before these columns are ASCII.
      ASSERT_GT(row.size(), end);
      EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(row[end - 1]))) << col << ": " << row;
      EXPECT_EQ(row[end], ' ') << col << ": " << row;
    }
  }
  EXPECT_NE(ls[4].find("1235"), std::string::npos) << "µs with sensible precision: " << ls[4];
  EXPECT_NE(ls[4].find("412.3"), std::string::npos) << ls[4];
  EXPECT_NE(ls[4].find("1.95e-03"), std::string::npos) << ls[4];
  EXPECT_NE(ls[5].find(kTricky), std::string::npos);
}

TEST_F(CliTest, BestWithNothingValidExitsOne) {
  const Problem none = problem("b=2,h=16,s=4096,d=128,dtype=bf16,causal=1");
  CommandResult r = attntune(with_db("best --problem " + none.str()));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "attntune: error: no valid results for problem " + none.str() + " in database '" + db + "'\n");
  r = attntune(with_db("best --format json --problem " + none.str()));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::array());
}

TEST_F(CliTest, BestInputErrorsExitTwo) {
  const std::string missing = dir.file("missing.db");
  CommandResult r = attntune("best --db '" + missing + "'");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "attntune: error: database '" + missing + "' does not exist\n");
  EXPECT_FALSE(fs::exists(missing));

  const std::string text = dir.file("notes.txt");
  write_bytes(text, "not a database\n");
  r = attntune("best --db '" + text + "'");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.rfind("attntune: error: database '" + text + "' is not an SQLite database", 0), 0u) << r.err;
  EXPECT_EQ(read_bytes(text), "not a database\n");

  for (const std::string args : {"best --campaign nope", "best --top 0", "best --format xml", "best --problem b=4",
                                 "best --top many", "best --bogus", "campaigns --format yaml"}) {
    r = attntune(with_db(args));
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.err.rfind("attntune: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  EXPECT_NE(attntune(with_db("best --campaign nope")).err.find("no campaign 'nope'"), std::string::npos);
}

TEST_F(CliTest, BestUsesAttntuneDbFromTheEnvironment) {
  const CommandResult r =
      run_shell("ATTNTUNE_DB='" + db + "' " + ATTNTUNE_BIN + " best --campaign small --format json", scratch.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at(0).at("campaign"), "small");
}

TEST_F(CliTest, CampaignsInEveryFormat) {
  CommandResult r = attntune(with_db("campaigns --format json"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["name"], "main");
  EXPECT_EQ(j[0]["status"], "completed");
  EXPECT_EQ(j[0]["stop_reason"], "budget of 500 evaluations spent");
  EXPECT_EQ(j[0]["evaluations"], 3);
  EXPECT_EQ(j[0]["ok"], 2);
  EXPECT_EQ(j[0]["best_us"].get<double>(), 1234.5678);
  EXPECT_EQ(j[0]["template"], "flash_fwd_mma");
  EXPECT_EQ(Problem::from_json(j[0]["problem"]), p1);
  EXPECT_TRUE(j[0]["ended_at"].is_string());
  EXPECT_TRUE(j[1]["ended_at"].is_null());
  EXPECT_EQ(j[1]["name"], kTricky);

  r = attntune(with_db("campaigns --format csv"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = parse_csv(r.out);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0][0], "name");
  EXPECT_EQ(rows[0].size(), rows[2].size());
  EXPECT_EQ(rows[2][0], kTricky);

  r = attntune(with_db("campaigns"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto ls = lines(r.out);
  ASSERT_EQ(ls.size(), 5u) << r.out;
  EXPECT_EQ(ls[0].rfind("campaign", 0), 0u);
  EXPECT_NE(ls[2].find("completed"), std::string::npos);
}

TEST_F(CliTest, CampaignsOfAnEmptyDatabaseIsAnEmptyList) {
  const std::string empty = dir.file("empty.db");
  Store::open(empty, Store::Mode::kCreate);
  CommandResult r = attntune("campaigns --format json --db '" + empty + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::array());
  r = attntune("campaigns --db '" + empty + "'");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(lines(r.out).size(), 2u) << "headers and rule: " << r.out;
  r = attntune("best --db '" + empty + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "attntune: error: no valid results in database '" + empty + "'\n");
}

TEST_F(CliTest, HelpListsTheOptions) {
  for (const std::string cmd : {"best", "campaigns"}) {
    const CommandResult r = attntune(cmd + " --help");
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.out.find("--db"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--format"), std::string::npos) << r.out;
  }
  EXPECT_NE(attntune("best --help").out.find("--top"), std::string::npos);
}
}  // namespace test_db_cli
