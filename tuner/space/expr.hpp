// The constraint language of search spaces: integer, boolean and string expressions such as
//   smem_bytes <= max_smem_per_block && (dtype == 'bf16' ? block_n >= 64 : true)
// Grammar, lowest precedence first:
//   ternary  c ? a : b            or   a || b, a or b          and  a && b, a and b
//   equality == !=                rel  < <= > >=               add  + -
//   mul      * / %  (integer; / truncates toward zero)         unary - ! not
//   primary  integer | true | false | 'str' | "str" | name | f(args) | ( expr )
//   functions: min(a, b, ...), max(a, b, ...), ceil_div(a, b), is_pow2(x), log2(x)
// Our own parser rather than muparser: Debian ships no static libmuparser (the GPU-machine build
// links non-system dependencies statically), and muparser has neither string comparison nor token
// positions for error messages.
//
// Names are resolved once, at compile time, to slots of a flat int64 array; evaluation then does no
// lookups and no allocation. Every value is an int64 in that array: bools are 0/1 and strings are
// ids interned in the scope's symbol table, so `kv_load == 'ahead'` compares two integers.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"

namespace attntune {

enum class ExprType { kInt, kBool, kString };
const char* expr_type_name(ExprType t);  // "int" | "bool" | "string"

// A syntax, name or type error. column() is 1-based within the expression text, so a loader can
// turn it into file:line:column; what() reads "column N: message".
class ExprError : public InputError {
 public:
  ExprError(int column, const std::string& message);
  int column() const { return column_; }
  const std::string& message() const { return message_; }

 private:
  int column_;
  std::string message_;
};

// The names an expression may use, each bound to a slot, plus the symbol table for strings.
class ExprScope {
 public:
  struct Name {
    std::string name;
    ExprType type;
    int slot;
    std::vector<std::string> values;  // kString names: the values it can take (for typo checks)
  };

  // Adds a name in the next slot and returns the slot. Names must be unique (std::logic_error).
  int add(const std::string& name, ExprType type, std::vector<std::string> values = {});
  const Name* find(std::string_view name) const;
  // Fixes a name's type once known (a derived quantity's, after its expression is compiled).
  void set_type(int slot, ExprType type) { names_.at(static_cast<std::size_t>(slot)).type = type; }
  const std::vector<Name>& names() const { return names_; }
  int size() const { return static_cast<int>(names_.size()); }

  // Symbol table: a string's id (added on first use) and back.
  std::int64_t intern(const std::string& s);
  std::optional<std::int64_t> symbol_id(const std::string& s) const;
  const std::string& symbol(std::int64_t id) const { return symbols_.at(static_cast<std::size_t>(id)); }

 private:
  std::vector<Name> names_;
  std::unordered_map<std::string, int> index_;
  std::vector<std::string> symbols_;
  std::unordered_map<std::string, std::int64_t> symbol_ids_;
};

class Expr {
 public:
  // Parses and type-checks `text` against `scope` (interning its string literals there). Only
  // slots below `visible_slots` may be used (-1: all); using a later one is an error that says
  // `not_visible_why`. Throws ExprError.
  static Expr compile(std::string_view text, ExprScope& scope, int visible_slots = -1,
                      std::string_view not_visible_why = {});

  ExprType type() const { return type_; }
  const std::string& text() const { return text_; }
  // Sorted, distinct slots the expression reads.
  const std::vector<int>& slots_used() const { return slots_used_; }
  // Prefix for runtime errors, e.g. "spaces/x.yaml:14:5: constraint" (default: "expression").
  void set_origin(std::string origin) { origin_ = std::move(origin); }

  // Evaluates against slot values (bools 0/1, strings as symbol ids). Division or modulo by zero,
  // log2 of a non-positive value and int64 overflow throw InputError naming the expression.
  std::int64_t eval(const std::int64_t* slots) const { return eval_node(root_, slots); }

 private:
  friend class ExprParser;
  enum class Op : std::uint8_t {
    kConst, kSlot, kNeg, kNot, kAdd, kSub, kMul, kDiv, kMod, kEq, kNe, kLt, kLe, kGt, kGe,
    kAnd, kOr, kCond, kMin, kMax, kCeilDiv, kIsPow2, kLog2
  };
  struct Node {
    Op op;
    std::int32_t a = -1, b = -1, c = -1;  // operand node indices
    std::int64_t value = 0;               // kConst: the value; kSlot: the slot
  };

  std::int64_t eval_node(std::int32_t i, const std::int64_t* s) const;
  [[noreturn]] void runtime_error(const char* what) const;

  std::vector<Node> nodes_;
  std::int32_t root_ = -1;
  ExprType type_ = ExprType::kInt;
  std::string text_;
  std::string origin_ = "expression";
  std::vector<int> slots_used_;
};

// The closest candidate by edit distance if it is close enough to be a likely typo, for
// "did you mean" hints.
std::optional<std::string> closest_name(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace attntune
