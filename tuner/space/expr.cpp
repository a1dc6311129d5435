#include "space/expr.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>

#include "core/text.hpp"

namespace attntune {

const char* expr_type_name(ExprType t) {
  switch (t) {
    case ExprType::kInt: return "int";
    case ExprType::kBool: return "bool";
    case ExprType::kString: return "string";
  }
  return "?";
}

ExprError::ExprError(int column, const std::string& message)
    : InputError(fmt::format("column {}: {}", column, message)), column_(column), message_(message) {}

// ---- scope ------------------------------------------------------------------------------------

int ExprScope::add(const std::string& name, ExprType type, std::vector<std::string> values) {
  if (index_.count(name)) throw std::logic_error("ExprScope: name '" + name + "' added twice");
  const int slot = size();
  for (const auto& v : values) intern(v);
  names_.push_back({name, type, slot, std::move(values)});
  index_.emplace(name, slot);
  return slot;
}

const ExprScope::Name* ExprScope::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &names_[static_cast<std::size_t>(it->second)];
}

std::int64_t ExprScope::intern(const std::string& s) {
  auto [it, added] = symbol_ids_.emplace(s, static_cast<std::int64_t>(symbols_.size()));
  if (added) symbols_.push_back(s);
  return it->second;
}

std::optional<std::int64_t> ExprScope::symbol_id(const std::string& s) const {
  auto it = symbol_ids_.find(s);
  if (it == symbol_ids_.end()) return std::nullopt;
  return it->second;
}

// ---- did you mean -----------------------------------------------------------------------------

namespace {
// Optimal string alignment distance: edits, with a swap of neighbours ("wraps") counting as one.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}
}  // namespace

std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& candidates) {
  // One edit per three characters; none for names of one or two, where every edit is a guess.
  if (name.size() < 3) return std::nullopt;
  const std::size_t limit = std::max<std::size_t>(1, name.size() / 3);
  std::optional<std::string> best;
  std::size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    // The distance is at least the difference in length: a long name skips the quadratic table.
    if ((name.size() > c.size() ? name.size() - c.size() : c.size() - name.size()) > limit) continue;
    const std::size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

// ---- lexer ------------------------------------------------------------------------------------

namespace {

enum class Tok { kInt, kString, kIdent, kOp, kEnd };

struct Token {
  Tok kind;
  std::string text;  // identifier, operator spelling, string contents
  std::int64_t value = 0;
  int column = 0;    // 1-based
};

const std::vector<std::string> kFunctions = {"min", "max", "ceil_div", "is_pow2", "log2"};

// Limits on what an expression may be, so that no input can exhaust the stack: the parser recurses
// once per nesting level (parentheses, unary operators, '?:' branches, call arguments) and
// evaluation once per level of the tree, which a long chain such as a+a+...+a makes deep. The
// shipped spaces' longest expression is under 200 characters and 10 levels deep.
constexpr std::size_t kMaxExprLength = 16384;  // characters
constexpr int kMaxExprNesting = 256;           // levels of parentheses, unary operators, '?:'
constexpr int kMaxExprTreeDepth = 512;         // levels of the compiled tree (evaluation's recursion)

std::vector<Token> lex(std::string_view s) {
  if (s.size() > kMaxExprLength)
    throw ExprError(static_cast<int>(kMaxExprLength) + 1,
                    fmt::format("the expression is {} characters long; at most {} are allowed", s.size(), kMaxExprLength));
  std::vector<Token> out;
  std::size_t i = 0;
  auto col = [](std::size_t pos) { return static_cast<int>(pos) + 1; };
  while (i < s.size()) {
    const char ch = s[i];
    if (std::isspace(static_cast<unsigned char>(ch))) { ++i; continue; }
    const std::size_t start = i;
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      while (i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]))) ++i;
      std::string_view digits = s.substr(start, i - start);
      std::int64_t v = 0;
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec == std::errc::result_out_of_range)
        throw ExprError(col(start), fmt::format("integer '{}' is out of range", digits));
      if (ec != std::errc() || ptr != digits.data() + digits.size())
        throw ExprError(col(start), fmt::format("bad integer '{}'", digits));
      out.push_back({Tok::kInt, std::string(digits), v, col(start)});
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      out.push_back({Tok::kIdent, std::string(s.substr(start, i - start)), 0, col(start)});
      continue;
    }
    if (ch == '\'' || ch == '"') {
      const std::size_t close = s.find(ch, i + 1);
      if (close == std::string_view::npos) throw ExprError(col(start), "unterminated string");
      out.push_back({Tok::kString, std::string(s.substr(i + 1, close - i - 1)), 0, col(start)});
      i = close + 1;
      continue;
    }
    static const char* kTwo[] = {"||", "&&", "==", "!=", "<=", ">="};
    bool two = false;
    for (const char* op : kTwo) {
      if (s.substr(i, 2) == op) {
        out.push_back({Tok::kOp, op, 0, col(start)});
        i += 2;
        two = true;
        break;
      }
    }
    if (two) continue;
    if (ch == '=') throw ExprError(col(start), "'=' is not an operator (did you mean '=='?)");
    if (ch == '&') throw ExprError(col(start), "'&' is not an operator (did you mean '&&'?)");
    if (ch == '|') throw ExprError(col(start), "'|' is not an operator (did you mean '||'?)");
    if (std::string_view("?:<>+-*/%!(),").find(ch) == std::string_view::npos)
      throw ExprError(col(start), fmt::format("unexpected character '{}'", ch));
    out.push_back({Tok::kOp, std::string(1, ch), 0, col(start)});
    ++i;
  }
  out.push_back({Tok::kEnd, "", 0, col(s.size())});
  return out;
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::kEnd: return "end of expression";
    case Tok::kString: return "string '" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

}  // namespace

// ---- parser and type checker ------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(std::string_view text, ExprScope& scope, int visible, std::string_view why)
      : toks_(lex(text)), scope_(scope), visible_(visible), not_visible_why_(why) {}

  Expr run(std::string_view text) {
    expr_.text_ = std::string(text);
    if (toks_.front().kind == Tok::kEnd) throw ExprError(1, "empty expression");
    Operand root = ternary();
    if (peek().kind != Tok::kEnd)
      throw ExprError(peek().column, fmt::format("unexpected {} after a complete expression", describe(peek())));
    expr_.root_ = root.node;
    expr_.type_ = root.type;
    std::sort(expr_.slots_used_.begin(), expr_.slots_used_.end());
    expr_.slots_used_.erase(std::unique(expr_.slots_used_.begin(), expr_.slots_used_.end()),
                            expr_.slots_used_.end());
    return std::move(expr_);
  }

 private:
  using Op = Expr::Op;
  // One level of nesting for as long as it lives; too many is an error at the token that opened it.
  class Nest {
   public:
    Nest(ExprParser& p, int column) : p_(p) {
      if (++p_.nesting_ > kMaxExprNesting)
        throw ExprError(column, fmt::format("the expression is nested more than {} levels deep", kMaxExprNesting));
    }
    ~Nest() { --p_.nesting_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    ExprParser& p_;
  };
  // A typed subexpression. For strings, `values` lists what it can evaluate to when known (a
  // literal, an enum-typed name, a ternary of those) and `owner` names the enum, for typo checks.
  struct Operand {
    Operand(std::int32_t n, ExprType t, int col) : node(n), type(t), column(col) {}
    std::int32_t node;
    ExprType type;
    int column;
    std::optional<std::vector<std::string>> values;
    std::string owner;
    bool literal = false;
  };

  const Token& peek() const { return toks_[pos_]; }
  bool accept(std::string_view op) {
    const Token& t = peek();
    if ((t.kind == Tok::kOp && t.text == op) ||
        (t.kind == Tok::kIdent && ((op == "||" && t.text == "or") || (op == "&&" && t.text == "and") ||
                                   (op == "!" && t.text == "not")))) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(std::string_view op, std::string_view context) {
    if (!accept(op))
      throw ExprError(peek().column, fmt::format("expected '{}' {}, got {}", op, context, describe(peek())));
  }

  // A node over operands a, b, c; the tree's depth is checked as it grows (at the token just read).
  std::int32_t add(Op op, std::int32_t a = -1, std::int32_t b = -1, std::int32_t c = -1, std::int64_t v = 0) {
    int depth = 0;
    for (const std::int32_t x : {a, b, c})
      if (x >= 0) depth = std::max(depth, depths_[static_cast<std::size_t>(x)]);
    if (++depth > kMaxExprTreeDepth)
      throw ExprError(toks_[pos_ > 0 ? pos_ - 1 : 0].column,
                      fmt::format("the expression is more than {} operations deep (a chain this long needs "
                                  "splitting into several constraints or derived quantities)",
                                  kMaxExprTreeDepth));
    expr_.nodes_.push_back({op, a, b, c, v});
    depths_.push_back(depth);
    return static_cast<std::int32_t>(expr_.nodes_.size() - 1);
  }

  static void want(const Operand& x, ExprType t, int column, std::string_view what) {
    if (x.type != t)
      throw ExprError(column, fmt::format("{} needs {}, got {}", what, expr_type_name(t), expr_type_name(x.type)));
  }

  Operand ternary() {
    const Nest nest(*this, peek().column);
    Operand cond = logic_or();
    const int column = peek().column;
    if (!accept("?")) return cond;
    want(cond, ExprType::kBool, cond.column, "the condition of '?:'");
    Operand a = ternary();
    expect(":", "in 'c ? a : b'");
    Operand b = ternary();
    if (a.type != b.type)
      throw ExprError(column, fmt::format("the branches of '?:' have different types: {} and {}",
                                          expr_type_name(a.type), expr_type_name(b.type)));
    Operand r(add(Op::kCond, cond.node, a.node, b.node), a.type, cond.column);
    if (a.values && b.values) {
      r.values = *a.values;
      for (const auto& v : *b.values)
        if (std::find(r.values->begin(), r.values->end(), v) == r.values->end()) r.values->push_back(v);
      r.owner = a.owner == b.owner ? a.owner : "";
    }
    return r;
  }

  Operand logic_or() {
    Operand l = logic_and();
    for (;;) {
      const Token op = peek();
      if (!accept("||")) return l;
      Operand r = logic_and();
      want(l, ExprType::kBool, l.column, fmt::format("'{}'", op.text));
      want(r, ExprType::kBool, r.column, fmt::format("'{}'", op.text));
      l = {add(Op::kOr, l.node, r.node), ExprType::kBool, l.column};
    }
  }

  Operand logic_and() {
    Operand l = equality();
    for (;;) {
      const Token op = peek();
      if (!accept("&&")) return l;
      Operand r = equality();
      want(l, ExprType::kBool, l.column, fmt::format("'{}'", op.text));
      want(r, ExprType::kBool, r.column, fmt::format("'{}'", op.text));
      l = {add(Op::kAnd, l.node, r.node), ExprType::kBool, l.column};
    }
  }

  // Comparing a string with a value it can never take is a typo: 'bf61' for dtype.
  static void check_string_compare(const Operand& l, const Operand& r) {
    if (!l.values || !r.values) return;
    for (const auto& v : *l.values)
      if (std::find(r.values->begin(), r.values->end(), v) != r.values->end()) return;
    const Operand& lit = l.literal ? l : r;
    const Operand& other = l.literal ? r : l;
    if (lit.literal && !other.literal) {
      const std::string& value = lit.values->front();
      if (!other.owner.empty())
        throw ExprError(lit.column, fmt::format("'{}' is not a value of {} ({})", value, other.owner,
                                                join(*other.values)));
      throw ExprError(lit.column, fmt::format("'{}' is never a value of the other side ({})", value,
                                              join(*other.values)));
    }
    throw ExprError(r.column, fmt::format("the two sides can never be equal (values {} vs {})",
                                          join(*l.values), join(*r.values)));
  }

  Operand equality() {
    Operand l = relational();
    for (;;) {
      const Token op = peek();
      Op code;
      if (accept("==")) code = Op::kEq;
      else if (accept("!=")) code = Op::kNe;
      else return l;
      Operand r = relational();
      if (l.type != r.type)
        throw ExprError(op.column, fmt::format("'{}' compares {} with {}", op.text, expr_type_name(l.type),
                                               expr_type_name(r.type)));
      if (l.type == ExprType::kString) check_string_compare(l, r);
      l = {add(code, l.node, r.node), ExprType::kBool, l.column};
    }
  }

  Operand relational() {
    Operand l = additive();
    for (;;) {
      const Token op = peek();
      Op code;
      if (accept("<")) code = Op::kLt;
      else if (accept("<=")) code = Op::kLe;
      else if (accept(">")) code = Op::kGt;
      else if (accept(">=")) code = Op::kGe;
      else return l;
      Operand r = additive();
      int_operands(op, l, r);
      l = {add(code, l.node, r.node), ExprType::kBool, l.column};
    }
  }

  static void int_operands(const Token& op, const Operand& l, const Operand& r) {
    if (l.type != ExprType::kInt || r.type != ExprType::kInt)
      throw ExprError(op.column, fmt::format("'{}' needs int operands, got {} and {}", op.text,
                                             expr_type_name(l.type), expr_type_name(r.type)));
  }

  Operand additive() {
    Operand l = multiplicative();
    for (;;) {
      const Token op = peek();
      Op code;
      if (accept("+")) code = Op::kAdd;
      else if (accept("-")) code = Op::kSub;
      else return l;
      Operand r = multiplicative();
      int_operands(op, l, r);
      l = {add(code, l.node, r.node), ExprType::kInt, l.column};
    }
  }

  Operand multiplicative() {
    Operand l = unary();
    for (;;) {
      const Token op = peek();
      Op code;
      if (accept("*")) code = Op::kMul;
      else if (accept("/")) code = Op::kDiv;
      else if (accept("%")) code = Op::kMod;
      else return l;
      Operand r = unary();
      int_operands(op, l, r);
      l = {add(code, l.node, r.node), ExprType::kInt, l.column};
    }
  }

  Operand unary() {
    const Token op = peek();
    if (accept("-")) {
      const Nest nest(*this, op.column);
      Operand x = unary();
      want(x, ExprType::kInt, op.column, "unary '-'");
      return {add(Op::kNeg, x.node), ExprType::kInt, op.column};
    }
    if (accept("!")) {
      const Nest nest(*this, op.column);
      Operand x = unary();
      want(x, ExprType::kBool, op.column, fmt::format("'{}'", op.text));
      return {add(Op::kNot, x.node), ExprType::kBool, op.column};
    }
    return primary();
  }

  Operand primary() {
    const Token t = peek();
    switch (t.kind) {
      case Tok::kInt:
        ++pos_;
        return {add(Op::kConst, -1, -1, -1, t.value), ExprType::kInt, t.column};
      case Tok::kString: {
        ++pos_;
        const std::int64_t id = scope_.intern(t.text);
        Operand r(add(Op::kConst, -1, -1, -1, id), ExprType::kString, t.column);
        r.values = std::vector<std::string>{t.text};
        r.literal = true;
        return r;
      }
      case Tok::kIdent:
        ++pos_;
        if (t.text == "true" || t.text == "false")
          return {add(Op::kConst, -1, -1, -1, t.text == "true"), ExprType::kBool, t.column};
        if (t.text == "and" || t.text == "or" || t.text == "not")
          throw ExprError(t.column, fmt::format("expected a value, got '{}'", t.text));
        if (peek().kind == Tok::kOp && peek().text == "(") return call(t);
        return name(t);
      case Tok::kOp:
        if (accept("(")) {
          Operand x = ternary();
          expect(")", fmt::format("to close the '(' at column {}", t.column));
          x.column = t.column;
          return x;
        }
        [[fallthrough]];
      case Tok::kEnd:
        break;
    }
    throw ExprError(t.column, fmt::format("expected a value, got {}", describe(t)));
  }

  Operand name(const Token& t) {
    if (std::find(kFunctions.begin(), kFunctions.end(), t.text) != kFunctions.end())
      throw ExprError(t.column, fmt::format("'{}' is a function; call it as {}(...)", t.text, t.text));
    const ExprScope::Name* n = scope_.find(t.text);
    if (!n) {
      std::vector<std::string> known;
      for (const auto& x : scope_.names())
        if (visible_ < 0 || x.slot < visible_) known.push_back(x.name);
      auto hint = closest_name(t.text, known);
      throw ExprError(t.column, fmt::format("unknown name '{}'{}", t.text,
                                            hint ? fmt::format(" (did you mean '{}'?)", *hint) : ""));
    }
    if (visible_ >= 0 && n->slot >= visible_)
      throw ExprError(t.column, fmt::format("'{}' cannot be used here: {}", t.text, not_visible_why_));
    expr_.slots_used_.push_back(n->slot);
    Operand r{add(Op::kSlot, -1, -1, -1, n->slot), n->type, t.column};
    if (n->type == ExprType::kString && !n->values.empty()) r.values = n->values, r.owner = n->name;
    return r;
  }

  Operand call(const Token& f) {
    expect("(", "");
    std::vector<Operand> args;
    if (!accept(")")) {
      do args.push_back(ternary());
      while (accept(","));
      expect(")", fmt::format("to close the call of {}", f.text));
    }
    auto arity = [&](std::size_t lo, std::size_t hi) {
      if (args.size() < lo || args.size() > hi) {
        const std::string n = lo == hi ? std::to_string(lo) : fmt::format("at least {}", lo);
        throw ExprError(f.column, fmt::format("{}() takes {} argument{}, got {}", f.text, n, lo == 1 ? "" : "s",
                                              args.size()));
      }
      for (std::size_t i = 0; i < args.size(); ++i)
        want(args[i], ExprType::kInt, args[i].column, fmt::format("argument {} of {}()", i + 1, f.text));
    };
    if (f.text == "min" || f.text == "max") {
      arity(2, SIZE_MAX);
      const Op op = f.text == "min" ? Op::kMin : Op::kMax;
      std::int32_t acc = args[0].node;
      for (std::size_t i = 1; i < args.size(); ++i) acc = add(op, acc, args[i].node);
      return {acc, ExprType::kInt, f.column};
    }
    if (f.text == "ceil_div") {
      arity(2, 2);
      return {add(Op::kCeilDiv, args[0].node, args[1].node), ExprType::kInt, f.column};
    }
    if (f.text == "is_pow2") {
      arity(1, 1);
      return {add(Op::kIsPow2, args[0].node), ExprType::kBool, f.column};
    }
    if (f.text == "log2") {
      arity(1, 1);
      return {add(Op::kLog2, args[0].node), ExprType::kInt, f.column};
    }
    if (scope_.find(f.text)) throw ExprError(f.column, fmt::format("'{}' is not a function", f.text));
    auto hint = closest_name(f.text, kFunctions);
    throw ExprError(f.column, fmt::format("unknown function '{}' ({}known: {})", f.text,
                                          hint ? fmt::format("did you mean '{}'? ", *hint) : "", join(kFunctions)));
  }

  std::vector<Token> toks_;
  std::size_t pos_ = 0;
  int nesting_ = 0;
  std::vector<int> depths_;  // per node: the depth of its subtree
  ExprScope& scope_;
  int visible_;
  std::string_view not_visible_why_;
  Expr expr_;
};

Expr Expr::compile(std::string_view text, ExprScope& scope, int visible_slots, std::string_view not_visible_why) {
  return ExprParser(text, scope, visible_slots, not_visible_why).run(text);
}

// ---- evaluation -------------------------------------------------------------------------------

void Expr::runtime_error(const char* what) const {
  throw InputError(fmt::format("{} '{}': {}", origin_, text_, what));
}

std::int64_t Expr::eval_node(std::int32_t i, const std::int64_t* s) const {
  const Node& n = nodes_[static_cast<std::size_t>(i)];
  std::int64_t r = 0;
  switch (n.op) {
    case Op::kConst: return n.value;
    case Op::kSlot: return s[n.value];
    case Op::kNeg:
      if (__builtin_sub_overflow(std::int64_t{0}, eval_node(n.a, s), &r)) runtime_error("integer overflow");
      return r;
    case Op::kNot: return !eval_node(n.a, s);
    case Op::kAdd:
      if (__builtin_add_overflow(eval_node(n.a, s), eval_node(n.b, s), &r)) runtime_error("integer overflow");
      return r;
    case Op::kSub:
      if (__builtin_sub_overflow(eval_node(n.a, s), eval_node(n.b, s), &r)) runtime_error("integer overflow");
      return r;
    case Op::kMul:
      if (__builtin_mul_overflow(eval_node(n.a, s), eval_node(n.b, s), &r)) runtime_error("integer overflow");
      return r;
    case Op::kDiv:
    case Op::kMod: {
      const std::int64_t a = eval_node(n.a, s), b = eval_node(n.b, s);
      if (b == 0) runtime_error(n.op == Op::kDiv ? "division by zero" : "modulo by zero");
      if (b == -1) return n.op == Op::kDiv ? (a == INT64_MIN ? (runtime_error("integer overflow"), 0) : -a) : 0;
      return n.op == Op::kDiv ? a / b : a % b;
    }
    case Op::kEq: return eval_node(n.a, s) == eval_node(n.b, s);
    case Op::kNe: return eval_node(n.a, s) != eval_node(n.b, s);
    case Op::kLt: return eval_node(n.a, s) < eval_node(n.b, s);
    case Op::kLe: return eval_node(n.a, s) <= eval_node(n.b, s);
    case Op::kGt: return eval_node(n.a, s) > eval_node(n.b, s);
    case Op::kGe: return eval_node(n.a, s) >= eval_node(n.b, s);
    case Op::kAnd: return eval_node(n.a, s) && eval_node(n.b, s);
    case Op::kOr: return eval_node(n.a, s) || eval_node(n.b, s);
    case Op::kCond: return eval_node(n.a, s) ? eval_node(n.b, s) : eval_node(n.c, s);
    case Op::kMin: return std::min(eval_node(n.a, s), eval_node(n.b, s));
    case Op::kMax: return std::max(eval_node(n.a, s), eval_node(n.b, s));
    case Op::kCeilDiv: {
      const std::int64_t a = eval_node(n.a, s), b = eval_node(n.b, s);
      if (b == 0) runtime_error("ceil_div by zero");
      if (b == -1) return a == INT64_MIN ? (runtime_error("integer overflow"), 0) : -a;
      const std::int64_t q = a / b;
      return (a % b != 0 && ((a < 0) == (b < 0))) ? q + 1 : q;
    }
    case Op::kIsPow2: {
      const std::int64_t x = eval_node(n.a, s);
      return x > 0 && (x & (x - 1)) == 0;
    }
    case Op::kLog2: {
      const std::int64_t x = eval_node(n.a, s);
      if (x <= 0) runtime_error("log2 of a non-positive value");
      return 63 - __builtin_clzll(static_cast<unsigned long long>(x));
    }
  }
  return 0;
}

}  // namespace attntune
