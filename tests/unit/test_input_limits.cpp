// Issue 28's input limits, one by one (the reliability suite's hostile-input generator runs them
// through the binary): expression depth and size, YAML documents, aliases and depth, input files
// that are not regular or too large, JSON nesting, stored text (UTF-8, control characters),
// durations.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/text.hpp"
#include "core/yaml_input.hpp"
#include "space/expr.hpp"
#include "tests/unit/db/db_test_util.hpp"

namespace test_input_limits {
using namespace attntune;

namespace {

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

std::string compile_error(const std::string& text) {
  ExprScope scope;
  scope.add("x", ExprType::kInt);
  try {
    Expr e = Expr::compile(text, scope);
    const std::int64_t slots[] = {3};
    e.eval(slots);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(InputLimits, ExpressionsDeepOrLongAreRefusedWithAColumn) {
  EXPECT_EQ(compile_error(repeat("(", 100) + "x" + repeat(")", 100) + " > 0"), "");
  EXPECT_NE(compile_error(repeat("(", 300) + "x" + repeat(")", 300) + " > 0").find("column 257: the expression is nested "
                                                                                 "more than 256 levels deep"),
            std::string::npos);
  EXPECT_NE(compile_error(repeat("(", 1000000) + "x" + repeat(")", 1000000)).find("characters long"), std::string::npos);
  EXPECT_NE(compile_error(repeat("-", 5000) + "x > 0").find("nested more than"), std::string::npos);
  EXPECT_NE(compile_error(repeat("!", 5000) + "true").find("nested more than"), std::string::npos);
  EXPECT_NE(compile_error(repeat("true ? ", 400) + "1" + repeat(" : 0", 400) + " > 0").find("nested more than"),
            std::string::npos);
  EXPECT_NE(compile_error(repeat("min(", 400) + "1" + repeat(", 2)", 400) + " > 0").find("nested more than"),
            std::string::npos);
  // A long flat chain nests nothing but builds a deep tree: evaluation would recurse through it.
  EXPECT_EQ(compile_error(repeat("x + ", 500) + "1 > 0"), "");
  EXPECT_NE(compile_error(repeat("x + ", 2000) + "1 > 0").find("more than 512 operations deep"), std::string::npos);
  EXPECT_NE(compile_error(repeat("x>0&&", 2000) + "true").find("operations deep"), std::string::npos);
}

TEST(InputLimits, YamlOneBoundedDocument) {
  EXPECT_NO_THROW(load_one_yaml_document("a: &x [1, 2]\nb: *x\n", "f.yaml"));
  try {
    load_one_yaml_document("a: 1\n---\nb: 2\n", "f.yaml");
    ADD_FAILURE() << "a second document was accepted";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "f.yaml:3:1: YAML: a second document (after '---'); the file must hold exactly one");
  }
  std::string lol = "l0: &l0 [lol, lol]\n";
  for (int i = 1; i <= 12; ++i)
    lol += fmt::format("l{}: &l{} [{}]\n", i, i, repeat(fmt::format("*l{}, ", i - 1), 5) + fmt::format("*l{}", i - 1));
  try {
    load_one_yaml_document(lol, "lol.yaml");
    ADD_FAILURE() << "nested aliases were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("lol.yaml:"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("nodes once aliases are expanded"), std::string::npos);
  }
  // An anchor used inside itself is a cycle in yaml-cpp's node graph.
  EXPECT_THROW(load_one_yaml_document("a: &a [1, *a]\n", "c.yaml"), InputError);
  EXPECT_THROW(load_one_yaml_document("a: " + repeat("[", 100) + repeat("]", 100) + "\n", "d.yaml"), InputError);
}

TEST(InputLimits, InputFilesAreRegularAndSmall) {
  test::TempDir dir;
  const std::string ok = dir.file("ok.yaml");
  test::write_bytes(ok, "a: 1\n");
  EXPECT_EQ(read_input_file(ok, "a file"), "a: 1\n");
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto error = [](const std::string& path) {
    try {
      read_input_file(path, "a search-space YAML file");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(fifo), fifo + ": is a FIFO, not a search-space YAML file (only regular files are read)");
  EXPECT_EQ(error("/dev/zero"), "/dev/zero: is a character device, not a search-space YAML file (only regular files are read)");
  EXPECT_EQ(error(dir.path().string()), dir.path().string() + ": is a directory, not a search-space YAML file");
  EXPECT_EQ(error(dir.file("none")), dir.file("none") + ": no such file");
  const std::string big = dir.file("big.yaml");
  test::write_bytes(big, std::string(kMaxInputFileBytes + 1, '#'));
  EXPECT_NE(error(big).find("is more than the 4 MiB allowed for a search-space YAML file"), std::string::npos);
}

TEST(InputLimits, JsonNesting) {
  EXPECT_NO_THROW(check_json_nesting("{\"a\": [[1], {\"b\": \"[[[[\"}]}", "m.json"));
  try {
    check_json_nesting("{\"a\":\n  " + repeat("[", 100), "m.json", 64);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "m.json:2:66: JSON nested more than 64 levels deep");
  }
}

TEST(InputLimits, StoredTextIsOneLineOfUtf8) {
  EXPECT_EQ(text_problem("plain name: ok"), "");
  EXPECT_EQ(text_problem("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "");
  EXPECT_EQ(text_problem("a\xff"), "byte 0xff at offset 1 is not UTF-8");
  EXPECT_EQ(text_problem("\xc0\x80"), "byte 0xc0 at offset 0 is not UTF-8");          // overlong
  EXPECT_EQ(text_problem("\xed\xa0\x80"), "byte 0xa0 at offset 1 is not UTF-8");      // a surrogate
  EXPECT_EQ(text_problem("\xf4\x90\x80\x80"), "byte 0x90 at offset 1 is not UTF-8");  // past U+10FFFF
  EXPECT_EQ(text_problem("caf\xc3"), "the UTF-8 sequence at offset 3 is cut short");
  EXPECT_EQ(text_problem("a\nb"), "a control character (\\n) at offset 1");
  EXPECT_EQ(text_problem("a\xc2\x85"), "a control character (U+0085) at offset 1");
  EXPECT_EQ(text_problem("a\nb\tc", true), "");
  try {
    check_stored_text("run\xff\x01", "tune: --campaign");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "tune: --campaign 'run\\xff\\x01' is not one line of UTF-8 text: byte 0xff at offset 3 is not UTF-8");
  }
  check_stored_text(std::string(kMaxStoredText, 'a'), "tune: --campaign");
  try {
    check_stored_text(std::string(kMaxStoredText + 1, 'a'), "tune: --campaign");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is 4097 bytes long: at most 4096"), std::string::npos) << e.what();
  }
}

TEST(InputLimits, DurationsAreBounded) {
  EXPECT_EQ(parse_duration("8h", "--budget-time"), 8 * 3600);
  EXPECT_EQ(parse_duration("1000000000s", "--budget-time"), 1e9);
  EXPECT_THROW(parse_duration("1000000001s", "--budget-time"), InputError);
  EXPECT_THROW(parse_duration("99999999999999999999999h", "--budget-time"), InputError);
  EXPECT_THROW(parse_duration(std::string(400, '1') + "s", "--budget-time"), InputError);
  EXPECT_THROW(parse_duration("nans", "--budget-time"), InputError);
  EXPECT_THROW(parse_duration("infs", "--budget-time"), InputError);
}

}  // namespace
}  // namespace test_input_limits
