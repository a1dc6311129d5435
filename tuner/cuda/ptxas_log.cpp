#include "cuda/ptxas_log.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace attntune::cuda {

namespace {

std::string_view trim_space(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// One item of a line: "Used 32 registers" -> (32, "registers"), "4096 bytes smem" -> (4096,
// "smem"), "360 bytes cmem[0]" -> (360, "cmem[0]"), "used 1 barriers" -> (1, "barriers").
bool parse_item(std::string_view item, long& value, std::string_view& kind) {
  item = trim_space(item);
  if (starts_with(item, "Used ") || starts_with(item, "used ")) item = trim_space(item.substr(5));
  const char* end = item.data() + item.size();
  auto [p, ec] = std::from_chars(item.data(), end, value);
  if (ec != std::errc() || p == item.data()) return false;
  item = trim_space(item.substr(static_cast<std::size_t>(p - item.data())));
  if (starts_with(item, "bytes ")) item = trim_space(item.substr(6));
  kind = item;
  return !kind.empty();
}

template <class F>
void for_each_item(std::string_view msg, F&& apply) {
  while (!msg.empty()) {
    const std::size_t comma = msg.find(',');
    long value = 0;
    std::string_view kind;
    if (parse_item(msg.substr(0, comma), value, kind)) apply(kind, static_cast<int>(value));
    if (comma == std::string_view::npos) break;
    msg.remove_prefix(comma + 1);
  }
}

// Applies the items a function's lines can carry.
void apply_item(PtxasFunction& f, std::string_view kind, int v) {
  if (kind == "registers") f.registers = v;
  else if (kind == "barriers") f.barriers = v;
  else if (kind == "smem") f.smem = v;
  else if (starts_with(kind, "cmem[")) f.cmem += v;
  else if (kind == "stack frame") f.stack_frame = v;
  else if (kind == "cumulative stack size") f.cumulative_stack = v;
  else if (kind == "spill stores") f.spill_stores = v;
  else if (kind == "spill loads") f.spill_loads = v;
}

// The text between the first pair of single quotes.
std::string_view first_quoted(std::string_view s) {
  const std::size_t a = s.find('\'');
  if (a == std::string_view::npos) return {};
  const std::size_t b = s.find('\'', a + 1);
  if (b == std::string_view::npos) return {};
  return s.substr(a + 1, b - a - 1);
}

}  // namespace

PtxasInfo parse_ptxas_log(std::string_view log) {
  PtxasInfo info;
  auto find = [&](std::string_view name) -> int {
    for (std::size_t i = 0; i < info.functions.size(); ++i)
      if (info.functions[i].name == name) return static_cast<int>(i);
    return -1;
  };
  int entry = -1;   // the kernel of the last "Compiling entry function"
  int target = -1;  // the function of the last "Function properties for"

  while (!log.empty()) {
    const std::size_t nl = log.find('\n');
    std::string_view line = trim_space(log.substr(0, nl));
    log.remove_prefix(nl == std::string_view::npos ? log.size() : nl + 1);
    if (!starts_with(line, "ptxas")) continue;
    std::string_view rest = trim_space(line.substr(5));

    if (starts_with(rest, ".")) {  // continuation: "ptxas . 0 bytes stack frame, ..."
      if (target >= 0)
        for_each_item(rest.substr(1), [&](std::string_view k, int v) {
          apply_item(info.functions[static_cast<std::size_t>(target)], k, v);
        });
      continue;
    }
    if (!starts_with(rest, "info")) continue;  // warnings, errors, fatal
    const std::size_t colon = rest.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view msg = trim_space(rest.substr(colon + 1));

    if (starts_with(msg, "Compiling entry function")) {
      const std::string_view name = first_quoted(msg);
      entry = find(name);
      if (entry < 0) {
        info.functions.push_back(PtxasFunction{std::string(name), true});
        entry = static_cast<int>(info.functions.size()) - 1;
      }
      info.functions[static_cast<std::size_t>(entry)].entry = true;
      target = -1;
    } else if (starts_with(msg, "Function properties for")) {
      const std::string_view name = trim_space(msg.substr(std::string_view("Function properties for").size()));
      target = find(name);
      if (target < 0) {
        info.functions.push_back(PtxasFunction{std::string(name), false});
        target = static_cast<int>(info.functions.size()) - 1;
      }
    } else if (starts_with(msg, "Used") && entry >= 0) {
      for_each_item(msg, [&](std::string_view k, int v) {
        apply_item(info.functions[static_cast<std::size_t>(entry)], k, v);
      });
    } else if (msg.find("bytes gmem") != std::string_view::npos ||
               (msg.find("bytes cmem[") != std::string_view::npos && entry < 0)) {
      for_each_item(msg, [&](std::string_view k, int v) {
        if (k == "gmem") info.gmem += v;
        else if (starts_with(k, "cmem[")) info.cmem += v;
      });
    }
  }
  return info;
}

const PtxasFunction* PtxasInfo::entry(std::string_view name) const {
  for (const auto& f : functions)
    if (f.entry && f.name == name) return &f;
  return nullptr;
}

namespace {
template <class Pred, class Get>
int max_of(const std::vector<PtxasFunction>& fs, Pred pred, Get get) {
  int m = 0;
  for (const auto& f : fs)
    if (pred(f)) m = std::max(m, get(f));
  return m;
}
const auto kEntries = [](const PtxasFunction& f) { return f.entry; };
const auto kAll = [](const PtxasFunction&) { return true; };
}  // namespace

int PtxasInfo::max_registers() const {
  return max_of(functions, kEntries, [](const PtxasFunction& f) { return f.registers; });
}
int PtxasInfo::max_smem() const {
  return max_of(functions, kEntries, [](const PtxasFunction& f) { return f.smem; });
}
int PtxasInfo::max_local_bytes() const {
  return max_of(functions, kEntries,
                [](const PtxasFunction& f) { return std::max(f.stack_frame, f.cumulative_stack); });
}
int PtxasInfo::max_spill_stores() const {
  return max_of(functions, kAll, [](const PtxasFunction& f) { return f.spill_stores; });
}
int PtxasInfo::max_spill_loads() const {
  return max_of(functions, kAll, [](const PtxasFunction& f) { return f.spill_loads; });
}
int PtxasInfo::max_entry_cmem() const {
  return max_of(functions, kEntries, [](const PtxasFunction& f) { return f.cmem; });
}

}  // namespace attntune::cuda
