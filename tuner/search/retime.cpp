#include "search/retime.hpp"

#include <algorithm>
#include <set>

namespace attntune::search {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<Retimed> fastest_distinct(std::vector<EvaluationRow> rows, int top,
                                      const std::function<Config(const EvaluationRow&)>& as_seen) {
  std::stable_sort(rows.begin(), rows.end(), [](const EvaluationRow& a, const EvaluationRow& b) {
    const bool ao = a.record.status == "ok", bo = b.record.status == "ok";
    if (ao != bo) return ao;
    return ao && *a.record.median_us < *b.record.median_us;
  });
  std::vector<Retimed> out;
  std::set<std::string> taken;
  for (const EvaluationRow& e : rows) {
    if (e.record.status != "ok" || static_cast<int>(out.size()) >= top) break;
    Config c = as_seen(e);
    if (taken.insert(config_str(c)).second)
      out.push_back({std::move(c), e.family, "", {}, 0, false, "", *e.record.median_us});
  }
  return out;
}

bool retime_round(Runner& runner, std::vector<Retimed>& top, const std::function<bool()>& stop,
                  const std::function<void(Retimed&, const RunResult&)>& on_result) {
  for (Retimed& t : top) {
    if (t.failed) continue;
    if (stop && stop()) return false;
    runner.submit(t.config);
    const std::optional<RunResult> r = runner.next();
    if (!r || r->abandoned) return false;
    t.source_hash = r->source_hash;
    if (on_result) on_result(t, *r);
    if (r->record.status != "ok") {
      t.failed = true;
      t.failure = r->record.status + (r->record.error.empty() ? "" : ": " + r->record.error);
      continue;
    }
    t.medians.push_back(*r->record.median_us);
    t.max_err = std::max(t.max_err, r->record.max_abs_err.value_or(0));
  }
  return true;
}

}  // namespace attntune::search
