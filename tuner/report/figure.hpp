// The report's figure as one SVG document: best-so-far against evaluations (ok results as faint
// points, failures as marks along the bottom coloured by status), best-so-far against seconds, and
// each parameter's effect (per value: its best time over the campaign's best).
#pragma once
#include <string>
#include <vector>

#include "core/records.hpp"
#include "report/analysis.hpp"

namespace attntune::report {

struct FigureText {
  std::string title;                  // e.g. "attntune report: main"
  std::vector<std::string> subtitle;  // lines under it: problem, template, GPU, strategy, status
};

std::string render_figure(const FigureText& text, const std::vector<EvaluationRow>& rows, const Analysis& a);

// The colour the figure gives a failure status (a fixed palette; unknown statuses share grey).
std::string status_color(const std::string& status);

}  // namespace attntune::report
