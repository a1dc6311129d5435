// The constraint language: precedence, types, short-circuit evaluation, functions, errors.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "space/expr.hpp"

namespace test_expr {
using namespace attntune;

namespace {

// a=7, b=2, flag=true, mode='fast' (of fast|slow), zero=0.
struct Env {
  ExprScope scope;
  std::vector<std::int64_t> slots;
  Env() {
    scope.add("a", ExprType::kInt);
    scope.add("b", ExprType::kInt);
    scope.add("flag", ExprType::kBool);
    scope.add("mode", ExprType::kString, {"fast", "slow"});
    scope.add("zero", ExprType::kInt);
    slots = {7, 2, 1, *scope.symbol_id("fast"), 0};
  }
  std::int64_t eval(const std::string& text) {
    Expr e = Expr::compile(text, scope);
    return e.eval(slots.data());
  }
  ExprType type(const std::string& text) { return Expr::compile(text, scope).type(); }
  // The compile error as "column: message".
  std::string error(const std::string& text) {
    try {
      Expr::compile(text, scope);
    } catch (const ExprError& e) {
      return std::to_string(e.column()) + ": " + e.message();
    }
    return "(no error)";
  }
  std::string runtime_error(const std::string& text) {
    Expr e = Expr::compile(text, scope);
    e.set_origin("x.yaml:3:5: constraint");
    try {
      e.eval(slots.data());
    } catch (const InputError& err) {
      return err.what();
    }
    return "(no error)";
  }
};

}  // namespace

TEST(Expr, ArithmeticPrecedenceAndAssociativity) {
  Env env;
  EXPECT_EQ(env.eval("1 + 2 * 3"), 7);
  EXPECT_EQ(env.eval("(1 + 2) * 3"), 9);
  EXPECT_EQ(env.eval("10 - 4 - 3"), 3);  // left-associative
  EXPECT_EQ(env.eval("64 / 4 / 2"), 8);
  EXPECT_EQ(env.eval("2 * 3 % 4"), 2);   // (2 * 3) % 4
  EXPECT_EQ(env.eval("2 + 3 % 2"), 3);
  EXPECT_EQ(env.eval("-a + 10"), 3);
  EXPECT_EQ(env.eval("- -a"), 7);
  EXPECT_EQ(env.eval("a * b - a / b"), 11);
}

TEST(Expr, IntegerDivisionTruncatesTowardZero) {
  Env env;
  EXPECT_EQ(env.eval("7 / 2"), 3);
  EXPECT_EQ(env.eval("-7 / 2"), -3);
  EXPECT_EQ(env.eval("7 / -2"), -3);
  EXPECT_EQ(env.eval("-7 % 2"), -1);
  EXPECT_EQ(env.eval("7 % -2"), 1);
}

TEST(Expr, LogicalAndComparisonPrecedence) {
  Env env;
  EXPECT_EQ(env.eval("true || false && false"), 1);  // && binds tighter than ||
  EXPECT_EQ(env.eval("(true || false) && false"), 0);
  EXPECT_EQ(env.eval("!false && false"), 0);         // ! binds tighter than &&
  EXPECT_EQ(env.eval("not flag or a == 7"), 1);      // keywords spell the same operators
  EXPECT_EQ(env.eval("a > 5 and b < 3"), 1);
  EXPECT_EQ(env.eval("1 + 2 == 3"), 1);              // arithmetic before comparison
  EXPECT_EQ(env.eval("1 < 2 == 2 < 3"), 1);          // relational before equality
  EXPECT_EQ(env.eval("a >= 7 && a <= 7 && a != 8"), 1);
  EXPECT_EQ(env.eval("flag == true"), 1);
  EXPECT_EQ(env.type("a < b"), ExprType::kBool);
}

TEST(Expr, TernaryIsLowestAndRightAssociative) {
  Env env;
  EXPECT_EQ(env.eval("a > 5 ? 1 : 2"), 1);
  EXPECT_EQ(env.eval("false ? 1 : true ? 2 : 3"), 2);
  EXPECT_EQ(env.eval("flag ? a : b"), 7);
  EXPECT_EQ(env.eval("1 + (flag ? 10 : 20) * 2"), 21);
  EXPECT_EQ(env.eval("flag || false ? 1 : 2"), 1);  // (flag || false) ? 1 : 2
}

TEST(Expr, StringsCompareAsSymbols) {
  Env env;
  EXPECT_EQ(env.eval("mode == 'fast'"), 1);
  EXPECT_EQ(env.eval("mode != \"slow\""), 1);
  EXPECT_EQ(env.eval("'slow' == mode"), 0);
  EXPECT_EQ(env.eval("(flag ? 'fast' : 'slow') == mode"), 1);
  env.slots[3] = *env.scope.symbol_id("slow");
  EXPECT_EQ(env.eval("mode == 'slow'"), 1);
}

TEST(Expr, ShortCircuitSkipsTheOtherOperand) {
  Env env;
  EXPECT_EQ(env.eval("false && a / zero == 1"), 0);
  EXPECT_EQ(env.eval("true || a / zero == 1"), 1);
  EXPECT_EQ(env.eval("zero == 0 ? 0 : a / zero"), 0);
  EXPECT_EQ(env.eval("zero != 0 && a % zero == 0"), 0);
  EXPECT_THROW(env.eval("true && a / zero == 1"), InputError);
  EXPECT_THROW(env.eval("false || a / zero == 1"), InputError);
}

TEST(Expr, Functions) {
  Env env;
  EXPECT_EQ(env.eval("min(3, 1, 2)"), 1);
  EXPECT_EQ(env.eval("max(3, 9, 2)"), 9);
  EXPECT_EQ(env.eval("min(a, b)"), 2);
  EXPECT_EQ(env.eval("ceil_div(7, 2)"), 4);
  EXPECT_EQ(env.eval("ceil_div(8, 2)"), 4);
  EXPECT_EQ(env.eval("ceil_div(-7, 2)"), -3);
  EXPECT_EQ(env.eval("ceil_div(7, -2)"), -3);
  EXPECT_EQ(env.eval("ceil_div(-7, -2)"), 4);
  EXPECT_EQ(env.eval("is_pow2(64)"), 1);
  EXPECT_EQ(env.eval("is_pow2(1)"), 1);
  EXPECT_EQ(env.eval("is_pow2(96)"), 0);
  EXPECT_EQ(env.eval("is_pow2(0)"), 0);
  EXPECT_EQ(env.eval("is_pow2(-4)"), 0);
  EXPECT_EQ(env.eval("log2(1)"), 0);
  EXPECT_EQ(env.eval("log2(64)"), 6);
  EXPECT_EQ(env.eval("log2(127)"), 6);
  EXPECT_EQ(env.type("is_pow2(a)"), ExprType::kBool);
}

TEST(Expr, RuntimeErrorsNameTheExpression) {
  Env env;
  EXPECT_EQ(env.runtime_error("a / (b - 2) > 0"), "x.yaml:3:5: constraint 'a / (b - 2) > 0': division by zero");
  EXPECT_EQ(env.runtime_error("a % zero == 0"), "x.yaml:3:5: constraint 'a % zero == 0': modulo by zero");
  EXPECT_EQ(env.runtime_error("ceil_div(a, zero) > 0"), "x.yaml:3:5: constraint 'ceil_div(a, zero) > 0': ceil_div by zero");
  EXPECT_EQ(env.runtime_error("log2(b - 2) > 0"), "x.yaml:3:5: constraint 'log2(b - 2) > 0': log2 of a non-positive value");
  EXPECT_EQ(env.runtime_error("log2(-a) > 0"), "x.yaml:3:5: constraint 'log2(-a) > 0': log2 of a non-positive value");
  EXPECT_EQ(env.runtime_error("9223372036854775807 + b > 0"),
            "x.yaml:3:5: constraint '9223372036854775807 + b > 0': integer overflow");
  EXPECT_EQ(env.runtime_error("4611686018427387904 * b > 0"),
            "x.yaml:3:5: constraint '4611686018427387904 * b > 0': integer overflow");
}

TEST(Expr, TypeErrorsPointAtTheOperator) {
  Env env;
  EXPECT_EQ(env.error("a + true"), "3: '+' needs int operands, got int and bool");
  EXPECT_EQ(env.error("(a + 1) * flag"), "9: '*' needs int operands, got int and bool");
  EXPECT_EQ(env.error("a == flag"), "3: '==' compares int with bool");
  EXPECT_EQ(env.error("mode == 1"), "6: '==' compares string with int");
  EXPECT_EQ(env.error("flag < true"), "6: '<' needs int operands, got bool and bool");
  EXPECT_EQ(env.error("a && flag"), "1: '&&' needs bool, got int");
  EXPECT_EQ(env.error("flag or b"), "9: 'or' needs bool, got int");
  EXPECT_EQ(env.error("!a"), "1: '!' needs bool, got int");
  EXPECT_EQ(env.error("-flag"), "1: unary '-' needs int, got bool");
  EXPECT_EQ(env.error("a ? 1 : 2"), "1: the condition of '?:' needs bool, got int");
  EXPECT_EQ(env.error("flag ? 1 : true"), "6: the branches of '?:' have different types: int and bool");
  EXPECT_EQ(env.error("min(flag, 1)"), "5: argument 1 of min() needs int, got bool");
  EXPECT_EQ(env.error("mode + 1"), "6: '+' needs int operands, got string and int");
}

TEST(Expr, EnumComparedWithAnUndeclaredValueIsATypo) {
  Env env;
  EXPECT_EQ(env.error("mode == 'fats'"), "9: 'fats' is not a value of mode (fast, slow)");
  EXPECT_EQ(env.error("flag && 'slo' != mode"), "9: 'slo' is not a value of mode (fast, slow)");
  EXPECT_EQ(env.error("'a' == 'b'"), "8: the two sides can never be equal (values a vs b)");
  EXPECT_EQ(env.eval("'a' == 'a'"), 1);
}

TEST(Expr, NameErrorsSuggestTheClosestName) {
  Env env;
  EXPECT_EQ(env.error("falg && true"), "1: unknown name 'falg' (did you mean 'flag'?)");
  EXPECT_EQ(env.error("a + qqq"), "5: unknown name 'qqq'");
  EXPECT_EQ(env.error("ceil_dv(a, 2)"), "1: unknown function 'ceil_dv' (did you mean 'ceil_div'? known: min, max, ceil_div, is_pow2, log2)");
  EXPECT_EQ(env.error("a(1)"), "1: 'a' is not a function");
  EXPECT_EQ(env.error("min + 1"), "1: 'min' is a function; call it as min(...)");
  EXPECT_EQ(env.error("min(a)"), "1: min() takes at least 2 arguments, got 1");
  EXPECT_EQ(env.error("log2(a, b)"), "1: log2() takes 1 argument, got 2");
  EXPECT_EQ(env.error("ceil_div(a)"), "1: ceil_div() takes 2 arguments, got 1");
}

TEST(Expr, SyntaxErrorsHaveColumns) {
  Env env;
  EXPECT_EQ(env.error(""), "1: empty expression");
  EXPECT_EQ(env.error("   "), "1: empty expression");
  EXPECT_EQ(env.error("a = 1"), "3: '=' is not an operator (did you mean '=='?)");
  EXPECT_EQ(env.error("flag & flag"), "6: '&' is not an operator (did you mean '&&'?)");
  EXPECT_EQ(env.error("flag | flag"), "6: '|' is not an operator (did you mean '||'?)");
  EXPECT_EQ(env.error("a +"), "4: expected a value, got end of expression");
  EXPECT_EQ(env.error("(a + 1"), "7: expected ')' to close the '(' at column 1, got end of expression");
  EXPECT_EQ(env.error("a b"), "3: unexpected 'b' after a complete expression");
  EXPECT_EQ(env.error("a + 1)"), "6: unexpected ')' after a complete expression");
  EXPECT_EQ(env.error("mode == 'fast"), "9: unterminated string");
  EXPECT_EQ(env.error("a # b"), "3: unexpected character '#'");
  EXPECT_EQ(env.error("12ab + 1"), "1: bad integer '12ab'");
  EXPECT_EQ(env.error("a + 99999999999999999999"), "5: integer '99999999999999999999' is out of range");
  EXPECT_EQ(env.error("a and and b"), "7: expected a value, got 'and'");
  EXPECT_EQ(env.error("flag ? 1 2"), "10: expected ':' in 'c ? a : b', got '2'");
  EXPECT_EQ(env.error("min(1, 2"), "9: expected ')' to close the call of min, got end of expression");
}

TEST(Expr, VisibilityLimitsWhichSlotsMayBeUsed) {
  Env env;
  try {
    Expr::compile("a + zero", env.scope, 4, "only the first four");
    FAIL() << "expected an ExprError";
  } catch (const ExprError& e) {
    EXPECT_EQ(e.column(), 5);
    EXPECT_EQ(e.message(), "'zero' cannot be used here: only the first four");
  }
  EXPECT_EQ(Expr::compile("a + b", env.scope, 2).eval(env.slots.data()), 9);
}

TEST(Expr, ReportsTheSlotsItReads) {
  Env env;
  Expr e = Expr::compile("b + a * b > zero || flag", env.scope);
  EXPECT_EQ(e.slots_used(), (std::vector<int>{0, 1, 2, 4}));
  EXPECT_TRUE(Expr::compile("1 + 2 > 0", env.scope).slots_used().empty());
}

TEST(Expr, ClosestNameIsNilForDistantNames) {
  EXPECT_EQ(closest_name("wraps", {"warps", "block_m"}), "warps");
  EXPECT_EQ(closest_name("block_n", {"block_m", "block_k"}), "block_m");
  EXPECT_EQ(closest_name("xyz", {"warps", "block_m"}), std::nullopt);
}
}  // namespace test_expr
