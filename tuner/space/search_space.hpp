// A search space: the tunable parameters of one kernel family, their domains, the quantities
// derived from them and the constraints a config must meet, read from YAML
// (search_spaces/README.md documents the format).
//
// Every name an expression can use lives in one flat slot array, in this order:
//   problem fields (b h hkv s sk d dtype causal page varlen window window_left window_right softcap sinks dv latent kv_fp8
//   bwd) |
//   device limits | params | derived
// Enumeration binds params one at a time (depth-first, in declaration order) and checks each
// constraint, and computes each derived quantity a constraint needs, as soon as every param it
// depends on is bound, so invalid subtrees are cut without being visited.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "space/expr.hpp"
#include "core/problem.hpp"

namespace attntune {

enum class ParamKind { kInt, kBool, kEnum };
const char* param_kind_name(ParamKind k);  // "int" | "bool" | "enum"

struct Param {
  std::string name;
  ParamKind kind;
  std::vector<Value> values;  // domain in declared order
  std::string doc;            // optional one-line description
  // The value of a config that does not name the param (YAML `default:`): what a build did before
  // the param existed, so that results recorded then (a database, the shipped one, warm starts)
  // still name a config of this space. None: every config must name it.
  std::optional<Value> default_value;
};

// The value config `c` gives param `p`: its own, else p's default; null when it has neither.
const Value* param_value(const Config& c, const Param& p);
// p's domain as a message names it: "64, 128".
std::string domain_text(const Param& p);

struct DerivedDef {
  std::string name;
  std::string expr;  // as written
  ExprType type;     // int or bool
  std::string doc;   // optional one-line description
};

struct ConstraintDef {
  std::string expr;  // as written
  std::string why;   // may be empty
};

// Where the configs of `SearchSpace::enumerate` were cut, for the `space` summary: how many raw
// points each constraint rejected first (in the order enumeration evaluates them).
struct PruneStats {
  std::uint64_t raw = 0;
  std::uint64_t valid = 0;
  std::vector<std::uint64_t> rejected_by;  // index: constraint, declaration order
};

class SearchSpace {
 public:
  // Throws InputError "file:line:column: message" for anything malformed.
  static SearchSpace load(const std::string& path);
  static SearchSpace parse(const std::string& yaml_text, const std::string& display_name);
  // The space shipped with this binary for `family` (search_spaces/FAMILY.yaml, embedded), or
  // nullopt when none is (a family registered by a test).
  static std::optional<SearchSpace> shipped(const std::string& family);

  const std::string& family() const { return family_; }
  const std::string& description() const { return description_; }
  const std::string& path() const { return path_; }
  const std::string& hash() const { return hash_; }  // content_hash() of the file bytes
  const std::string& text() const { return text_; }  // the YAML as read (campaigns store it)
  const std::vector<std::string>& archs() const { return archs_; }
  std::string default_arch() const;  // the highest listed: sm_90a > sm_90 > sm_89
  const std::vector<Param>& params() const { return params_; }
  const std::vector<DerivedDef>& derived() const { return derived_defs_; }
  const std::vector<ConstraintDef>& constraints() const { return constraint_defs_; }
  const std::vector<ConstraintDef>& problem_constraints() const { return problem_constraint_defs_; }
  // Problem fields the family restricts, with the allowed values as text ("d" -> {"64", "128"}).
  const std::vector<std::pair<std::string, std::vector<std::string>>>& problem_support() const {
    return problem_support_text_;
  }
  // Device limits for an arch in declaration order; InputError for an arch the space lacks.
  std::vector<std::pair<std::string, std::int64_t>> device_limits(const std::string& arch) const;
  std::uint64_t raw_size() const { return raw_size_; }  // product of domain sizes

  // InputError("flash_fwd_mma does not support d=96 (supported: 64, 128)"), or for an arch the
  // space does not list, or a failing problem constraint.
  void check_problem(const Problem& p, const std::string& arch) const;

  // All valid configs in deterministic order: lexicographic over params in declaration order,
  // each domain in its declared order. Calls check_problem first.
  std::vector<Config> enumerate(const Problem& p, const std::string& arch) const;
  std::uint64_t count(const Problem& p, const std::string& arch) const;
  // Calls `visit` with each valid config in enumeration order; `stats`, if given, is filled in.
  void for_each_valid(const Problem& p, const std::string& arch, const std::function<void(const Config&)>& visit,
                      PruneStats* stats = nullptr) const;

  // nullopt if valid; else the first failing constraint's `why` (or its expression), in the order
  // enumeration evaluates them (by the last param each depends on, then declaration order: so
  // check() fails exactly where enumeration would prune, and never evaluates what it skips), or
  // "block_m=96 is not in the domain of block_m (64, 128)" / "missing parameter warps" /
  // "unknown parameter foo".
  std::optional<std::string> check(const Config& c, const Problem& p, const std::string& arch) const;
  // Derived quantities of a config (which must name every param, with values in their domains;
  // constraints need not hold), in declaration order, bools as 0/1.
  std::vector<std::pair<std::string, std::int64_t>> derive(const Config& c, const Problem& p,
                                                           const std::string& arch) const;
  // `c` with every param it does not name that has a default (Param::default_value) set to it:
  // the config a result recorded before those params existed names in this space.
  Config complete(Config c) const;
  // "block_m=64,warps=4,..." against the declared params: each given once, values in the domain.
  Config parse_config(const std::string& text) const;

 private:
  friend class SpaceLoader;
  struct Derived {
    Expr expr;
    int level;  // 1 + index of the last param it depends on (0: none)
  };
  struct Constraint {
    Expr expr;
    int level;
  };
  // One step of checking a config: compute derived `index` or check constraint `index`.
  struct Step {
    bool constraint;
    int index;
  };
  struct ProblemRule {
    int field;                         // problem slot
    std::vector<std::int64_t> values;  // encoded like slot values
  };

  SearchSpace() = default;
  // Fills problem and device-limit slots; InputError for an arch the space does not list.
  void bind_problem(const Problem& p, const std::string& arch, std::vector<std::int64_t>& slots) const;
  // Fills param slots from a config; returns the reason it does not fit the declared params.
  std::optional<std::string> bind_config(const Config& c, std::vector<std::int64_t>& slots) const;
  Config decode(const std::int64_t* slots) const;
  // Runs steps in order; returns the index of the first failing constraint, or -1.
  int run_steps(const std::vector<Step>& steps, std::int64_t* slots) const;
  void plan();  // computes levels, steps_by_level_ and check_steps_ after loading
  template <class Visit>
  void dfs(int depth, std::int64_t* slots, Visit& visit, PruneStats* stats) const;
  template <class Visit>
  void walk(const Problem& p, const std::string& arch, Visit& visit, PruneStats* stats) const;

  std::string family_, description_, path_, hash_, text_;
  std::vector<std::string> archs_;
  std::vector<std::string> limit_names_;
  std::vector<std::vector<std::int64_t>> limit_values_;  // per arch (archs_ order), per limit
  std::vector<ProblemRule> problem_rules_;
  std::vector<std::pair<std::string, std::vector<std::string>>> problem_support_text_;
  std::vector<Expr> problem_constraints_;
  std::vector<ConstraintDef> problem_constraint_defs_;
  std::vector<Param> params_;
  std::vector<std::vector<std::int64_t>> encoded_;  // per param, its domain as slot values
  std::vector<Derived> derived_;
  std::vector<DerivedDef> derived_defs_;
  std::vector<Constraint> constraints_;
  std::vector<ConstraintDef> constraint_defs_;
  ExprScope scope_;
  int limit_base_ = 0, param_base_ = 0, derived_base_ = 0;
  std::uint64_t raw_size_ = 0;
  std::vector<std::vector<Step>> steps_by_level_;  // enumeration: steps run after binding `level` params
  std::vector<Step> check_steps_;                  // check(): steps_by_level_ concatenated
  std::vector<std::uint64_t> subtree_size_;        // product of domain sizes of params [depth, n)
};

}  // namespace attntune
