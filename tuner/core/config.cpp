#include "core/config.hpp"

#include "core/error.hpp"

namespace attntune {

std::string value_str(const Value& v) {
  if (auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return std::get<std::string>(v);
}

std::string config_str(const Config& c) {
  std::string out;
  for (const auto& [k, v] : c) {
    if (!out.empty()) out += ',';
    out += k + '=' + value_str(v);
  }
  return out;
}

nlohmann::json config_json(const Config& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : c) std::visit([&](const auto& x) { j[k] = x; }, v);
  return j;
}

Config config_from_json(const nlohmann::json& j) {
  Config c;
  if (!j.is_object()) throw InputError("config JSON is not an object");
  for (const auto& [k, v] : j.items()) {
    if (v.is_boolean()) c[k] = v.get<bool>();
    else if (v.is_number_integer()) c[k] = v.get<std::int64_t>();
    else if (v.is_string()) c[k] = v.get<std::string>();
    else throw InputError("config value of '" + k + "' is not an integer, boolean or string");
  }
  return c;
}

}  // namespace attntune
