// The mechanics of the stage-config key registry (lib/core/config_schema_*.cpp hold the keys):
// a field per key with its type, allowed values, documentation and the setter/getter that
// parse and print it. Included by config_schema*.cpp only.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/strings.h"

namespace easyctx::config_registry {

struct EnumChoice {
  const char* name;
  int value;
};

// What a key's value is to a run. kTraining: it changes what is trained (the model, the data
// and how it is cut and masked, the optimizer and its schedule): a continuation with another
// value is not the training its earlier steps were, so a resume names it among the changed
// settings. kGlobalBatch: how the global batch is split (its size is a training setting, the
// split is not). kRun: where and how the run goes (devices, layout, memory, output, logging,
// where a new run starts), which a resume may change freely. Set per group of keys in
// config_schema*.cpp (Registry::role), so a key added to a training group is one by default.
enum class KeyRole { kTraining, kGlobalBatch, kRun };

struct Field {
  std::string key;
  std::string section_doc;  // unused for leaves
  std::string type;         // "int", "float", "bool", "string", "enum"
  std::string allowed;      // human-readable allowed set/range
  std::string doc;
  // Sets the field from a YAML scalar; returns "" on success or what was expected.
  std::function<std::string(StageConfig&, const std::string& scalar)> set;
  std::function<std::string(const StageConfig&)> get;  // YAML scalar text
  KeyRole role = KeyRole::kRun;
};

inline std::string quote_if_needed(const std::string& s) {
  if (s.empty()) return "\"\"";
  bool plain = true;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/' || c == '*'))
      plain = false;
  if (s == "true" || s == "false" || s == "null" || s == "yes" || s == "no" || s == "on" || s == "off") plain = false;
  if (plain) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

inline std::string fmt_double(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  std::string s = os.str();
  // Keep floats recognisable as floats in YAML.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

inline bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (errno != 0 || *end != '\0') {
    // Accept integral floats written with an exponent ("1e6").
    char* e2 = nullptr;
    double d = std::strtod(s.c_str(), &e2);
    if (*e2 != '\0' || !std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9e18) return false;
    out = static_cast<int64_t>(d);
    return true;
  }
  out = v;
  return true;
}

inline bool parse_float(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(d)) return false;
  out = d;
  return true;
}

inline bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "True" || s == "yes" || s == "on") return out = true, true;
  if (s == "false" || s == "False" || s == "no" || s == "off") return out = false, true;
  return false;
}

class Registry {
 public:
  std::vector<Field> fields;
  KeyRole role = KeyRole::kRun;  // of the keys added from now on

  template <typename Acc>
  void add_int(const std::string& key, Acc acc, int64_t lo, int64_t hi, const std::string& doc) {
    std::string allowed =
        range_text(std::to_string(lo), hi == std::numeric_limits<int64_t>::max() ? "" : std::to_string(hi));
    fields.push_back({key, "", "int", allowed, doc,
                      [acc, lo, hi, allowed](StageConfig& c, const std::string& s) -> std::string {
                        int64_t v;
                        if (!parse_int(s, v)) return "an integer " + allowed;
                        if (v < lo || v > hi) return "an integer " + allowed;
                        acc(c) = v;
                        return "";
                      },
                      [acc](const StageConfig& c) { return std::to_string(acc(const_cast<StageConfig&>(c))); }});
    fields.back().role = role;
  }
  template <typename Acc>
  void add_uint(const std::string& key, Acc acc, const std::string& doc) {
    fields.push_back({key, "", "int", ">= 0", doc,
                      [acc](StageConfig& c, const std::string& s) -> std::string {
                        // The full 64-bit range (seeds): strtoull, refusing signs and junk.
                        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
                          return "an integer >= 0";
                        errno = 0;
                        const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
                        if (errno != 0) return "an integer in [0, 18446744073709551615]";
                        acc(c) = static_cast<uint64_t>(v);
                        return "";
                      },
                      [acc](const StageConfig& c) { return std::to_string(acc(const_cast<StageConfig&>(c))); }});
    fields.back().role = role;
  }
  // Range [lo, hi] with lo_open/hi_open making the bound exclusive.
  template <typename Acc>
  void add_float(const std::string& key, Acc acc, double lo, bool lo_open, double hi, bool hi_open,
                 const std::string& doc) {
    std::string allowed;
    bool has_hi = hi < std::numeric_limits<double>::max();
    if (has_hi)
      allowed =
          std::string("in ") + (lo_open ? "(" : "[") + fmt_double(lo) + ", " + fmt_double(hi) + (hi_open ? ")" : "]");
    else allowed = std::string(lo_open ? "> " : ">= ") + fmt_double(lo);
    fields.push_back({key, "", "float", allowed, doc,
                      [acc, lo, lo_open, hi, hi_open, allowed](StageConfig& c, const std::string& s) -> std::string {
                        double v;
                        if (!parse_float(s, v)) return "a number " + allowed;
                        if (v < lo || (lo_open && v == lo) || v > hi || (hi_open && v == hi))
                          return "a number " + allowed;
                        acc(c) = v;
                        return "";
                      },
                      [acc](const StageConfig& c) { return fmt_double(acc(const_cast<StageConfig&>(c))); }});
    fields.back().role = role;
  }
  template <typename Acc>
  void add_bool(const std::string& key, Acc acc, const std::string& doc) {
    fields.push_back(
        {key, "", "bool", "true or false", doc,
         [acc](StageConfig& c, const std::string& s) -> std::string {
           bool v;
           if (!parse_bool(s, v)) return "true or false";
           acc(c) = v;
           return "";
         },
         [acc](const StageConfig& c) { return std::string(acc(const_cast<StageConfig&>(c)) ? "true" : "false"); }});
    fields.back().role = role;
  }
  // A bool that may also be "auto" (acc_auto: whether the value is still to be chosen).
  template <typename Acc, typename AccAuto>
  void add_bool_or_auto(const std::string& key, Acc acc, AccAuto acc_auto, const std::string& doc) {
    fields.push_back({key, "", "bool or auto", "true, false or auto", doc,
                      [acc, acc_auto](StageConfig& c, const std::string& s) -> std::string {
                        bool v = false;
                        const bool is_auto = s == "auto";
                        if (!is_auto && !parse_bool(s, v)) return "true, false or auto";
                        acc(c) = v;
                        acc_auto(c) = is_auto;
                        return "";
                      },
                      [acc, acc_auto](const StageConfig& c) {
                        StageConfig& m = const_cast<StageConfig&>(c);
                        return std::string(acc_auto(m) && !acc(m) ? "auto" : acc(m) ? "true" : "false");
                      }});
    fields.back().role = role;
  }
  // check(value) returns "" or what is expected.
  template <typename Acc>
  void add_string(const std::string& key, Acc acc, const std::string& allowed, const std::string& doc,
                  std::function<std::string(const std::string&)> check = nullptr) {
    fields.push_back({key, "", "string", allowed, doc,
                      [acc, check](StageConfig& c, const std::string& s) -> std::string {
                        if (check) {
                          std::string e = check(s);
                          if (!e.empty()) return e;
                        }
                        acc(c) = s;
                        return "";
                      },
                      [acc](const StageConfig& c) { return quote_if_needed(acc(const_cast<StageConfig&>(c))); }});
    fields.back().role = role;
  }
  // A list of names: comma-separated in a scalar ("q_proj,v_proj", what --set takes), or a YAML
  // sequence ([q_proj, v_proj]) the loader joins with commas. check(value) returns "" or what is
  // expected; the names' own rules are checked where the list is used.
  template <typename Acc>
  void add_list(const std::string& key, Acc acc, const std::string& allowed, const std::string& doc) {
    fields.push_back({key, "", "list", allowed, doc,
                      [acc](StageConfig& c, const std::string& s) -> std::string {
                        acc(c) = s;
                        return "";
                      },
                      [acc](const StageConfig& c) { return quote_if_needed(acc(const_cast<StageConfig&>(c))); }});
    fields.back().role = role;
  }
  // `aliases`: other names accepted for a value (EasyContext's spellings); `allowed`, the dump
  // and the docs show the canonical names of `choices` only.
  template <typename E, typename Acc>
  void add_enum(const std::string& key, Acc acc, std::vector<EnumChoice> choices, const std::string& doc,
                std::vector<EnumChoice> aliases = {}) {
    std::string allowed = "one of ";
    for (size_t i = 0; i < choices.size(); ++i) allowed += (i ? ", " : "") + std::string(choices[i].name);
    std::vector<EnumChoice> accepted = choices;
    accepted.insert(accepted.end(), aliases.begin(), aliases.end());
    fields.push_back({key, "", "enum", allowed, doc,
                      [acc, accepted, allowed](StageConfig& c, const std::string& s) -> std::string {
                        for (const auto& ch : accepted)
                          if (s == ch.name) {
                            acc(c) = static_cast<E>(ch.value);
                            return "";
                          }
                        return allowed;
                      },
                      [acc, choices](const StageConfig& c) {
                        int v = static_cast<int>(acc(const_cast<StageConfig&>(c)));
                        for (const auto& ch : choices)
                          if (ch.value == v) return std::string(ch.name);
                        return std::string("?");
                      }});
    fields.back().role = role;
  }

  // An enum that may also be "auto" (acc_auto: whether the value is still to be chosen; until
  // then the field holds `pending`, the choice code that reads it before resolution sees).
  template <typename E, typename Acc, typename AccAuto>
  void add_enum_or_auto(const std::string& key, Acc acc, AccAuto acc_auto, E pending, std::vector<EnumChoice> choices,
                        const std::string& doc) {
    add_enum<E>(key, acc, choices, doc);
    Field& f = fields.back();
    f.allowed += " or auto";
    f.set = [set = f.set, acc, acc_auto, pending, allowed = f.allowed](StageConfig& c, const std::string& s) {
      acc_auto(c) = s == "auto";
      if (s != "auto") return set(c, s).empty() ? std::string() : allowed;
      acc(c) = pending;
      return std::string();
    };
    f.get = [get = f.get, acc_auto](const StageConfig& c) {
      return acc_auto(const_cast<StageConfig&>(c)) ? std::string("auto") : get(c);
    };
  }

  const Field* find(const std::string& key) const {
    for (const auto& f : fields)
      if (f.key == key) return &f;
    return nullptr;
  }
  bool is_section(const std::string& prefix) const {
    for (const auto& f : fields)
      if (starts_with(f.key, prefix + ".")) return true;
    return false;
  }
  std::vector<std::string> keys_and_sections() const {
    std::vector<std::string> out;
    for (const auto& f : fields) {
      out.push_back(f.key);
      auto parts = split(f.key, '.');
      std::string p;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        p += (i ? "." : "") + parts[i];
        out.push_back(p);
      }
    }
    return out;
  }

 private:
  static std::string range_text(const std::string& lo, const std::string& hi) {
    return hi.empty() ? ">= " + lo : "in [" + lo + ", " + hi + "]";
  }
};

}  // namespace easyctx::config_registry
