// Reading a YAML input file's text (a search space, a plan) as one bounded document. yaml-cpp
// loads aliases as shared nodes, so a few lines of nested aliases ("billion laughs") stand for
// billions of nodes, and every walk over the document (duplicate keys, the readers) would expand
// them; an anchor used inside itself is a cycle. yaml-cpp also reads only the first of several
// documents, silently. These limits make all three errors, with the file, line and column.
#pragma once
#include <cstddef>
#include <string>

#include <yaml-cpp/yaml.h>

#include "core/input_file.hpp"

namespace attntune {

struct YamlLimits {
  std::size_t max_nodes = 100000;  // nodes once aliases are expanded (the shipped spaces: a few hundred)
  int max_depth = kMaxInputNesting;
};

// The one document of `text`. yaml-cpp's YAML::ParserException passes through (the caller words
// it); a second document, or a document over the limits, is InputError "FILE:LINE:COLUMN: ...".
YAML::Node load_one_yaml_document(const std::string& text, const std::string& file, const YamlLimits& limits = {});

// InputError "FILE:LINE:COLUMN: ..." when `root`, aliases expanded, has more than max_nodes nodes
// or is nested deeper than max_depth. Iterative: it cannot itself overflow the stack.
void check_yaml_bounds(const YAML::Node& root, const std::string& file, const YamlLimits& limits = {});

}  // namespace attntune
