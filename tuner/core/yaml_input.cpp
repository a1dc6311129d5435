#include "core/yaml_input.hpp"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"

namespace attntune {

namespace {
SourcePos at(const std::string& file, const YAML::Mark& m) {
  if (m.line < 0) return {file, 1, 1};
  return {file, m.line + 1, m.column + 1};
}

// Where the second document starts: its root's mark, else the line of its '---'.
SourcePos second_document(const std::string& text, const std::string& file, const YAML::Node& doc) {
  if (doc.Mark().line >= 0) return at(file, doc.Mark());
  int line = 1, seen = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((i == 0 || text[i - 1] == '\n') && text.compare(i, 3, "---") == 0 && ++seen == 2) return {file, line, 1};
    if (text[i] == '\n') ++line;
  }
  return {file, line, 1};
}
}  // namespace

YAML::Node load_one_yaml_document(const std::string& text, const std::string& file, const YamlLimits& limits) {
  std::vector<YAML::Node> docs = YAML::LoadAll(text);
  if (docs.size() > 1)
    throw InputError(fmt::format("{}: YAML: a second document (after '---'); the file must hold exactly one",
                                 second_document(text, file, docs[1]).str()));
  if (docs.empty()) return YAML::Node();
  check_yaml_bounds(docs[0], file, limits);
  return docs[0];
}

void check_yaml_bounds(const YAML::Node& root, const std::string& file, const YamlLimits& limits) {
  if (!root.IsDefined()) return;
  std::vector<std::pair<YAML::Node, int>> todo{{root, 1}};
  std::size_t nodes = 0;
  while (!todo.empty()) {
    auto [n, depth] = std::move(todo.back());
    todo.pop_back();
    if (++nodes > limits.max_nodes)
      throw InputError(fmt::format("{}: YAML: more than {} nodes once aliases are expanded (nested aliases?)",
                                   at(file, n.Mark()).str(), limits.max_nodes));
    if (depth > limits.max_depth)
      throw InputError(fmt::format("{}: YAML: nested more than {} levels deep (an alias inside itself?)",
                                   at(file, n.Mark()).str(), limits.max_depth));
    if (n.IsMap()) {
      for (auto it = n.begin(); it != n.end(); ++it) {
        todo.emplace_back(it->first, depth + 1);
        todo.emplace_back(it->second, depth + 1);
      }
    } else if (n.IsSequence()) {
      for (auto it = n.begin(); it != n.end(); ++it) todo.emplace_back(*it, depth + 1);
    }
  }
}

}  // namespace attntune
