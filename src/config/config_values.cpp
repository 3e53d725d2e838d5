// One key's value: text to field (assign), field to text (value_text), final-value checks (validate).
#include "config/config_values.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <system_error>
#include <variant>

#include "config/ini_text.h"
#include "core/error.h"

namespace nlp::cfg {

std::string format_float(float v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return std::string(buf, r.ptr);
}

std::string format_bound(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

namespace {

// "s" (appended piece by piece: GCC 12's -Wrestrict misreads the inlined '"' + s + '"')
std::string quoted(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  out += s;
  out += '"';
  return out;
}

}  // namespace

// The value of e in c as INI text (strings quoted when needed, prompts escaped).
std::string value_text(const Entry& e, const Config& cc) {
  Config& c = const_cast<Config&>(cc);  // accessors take Config&; nothing is written
  return std::visit(
      [&](auto get) -> std::string {
        const auto& v = *get(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (e.escapes) return quoted(escape(v));
          bool quote = !v.empty() && (v != trim(v) || v.find_first_of("#;\"") != std::string::npos);
          return quote ? quoted(v) : v;
        } else if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, float>) {
          return format_float(v);
        } else {
          return std::to_string(v);
        }
      },
      e.field);
}

[[noreturn]] void bad_value(const Entry& e, const Origin& o, const std::string& why) {
  throw Error(cat(o.where, ": ", e.name, " = '", o.text, "': ", why));
}

// [+-]digits: an integer in syntax (used to tell "out of range" from "not an integer").
bool integer_syntax(const std::string& t) {
  size_t i = !t.empty() && (t[0] == '+' || t[0] == '-') ? 1 : 0;
  return t.size() > i && t.find_first_not_of("0123456789", i) == std::string::npos;
}

// Parse `raw` according to e's type and store it in c; throws on a wrong type.
void assign(const Entry& e, Config& c, const std::string& raw, const Origin& o) {
  // A value with escapes holds any byte (to_ini() writes control bytes as escapes); others may not.
  if (const size_t i = e.escapes ? std::string::npos : find_control(raw); i != std::string::npos)
    bad_value(e, o, cat("control character ", hex_byte(raw[i]), " in the value (only a tab is allowed)"));
  if (!e.escapes)  // config.ini must stay UTF-8 text (the INI reader requires it)
    for (size_t i = 0; i < raw.size();) {
      const size_t n = utf8_length(raw, i);
      if (n == 0) bad_value(e, o, cat("byte ", hex_byte(raw[i]), " at offset ", i, " is not UTF-8 text"));
      i += n;
    }
  const std::string t = trim(raw);
  std::visit(
      [&](auto get) {
        auto& v = *get(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          std::string s = t.size() >= 2 && t.front() == '"' && t.back() == '"' ? unquote(t) : raw;
          v = e.escapes ? unescape(s) : s;
        } else if constexpr (std::is_same_v<T, bool>) {
          const std::string l = lower(t);
          if (l == "true" || l == "1" || l == "yes" || l == "on") v = true;
          else if (l == "false" || l == "0" || l == "no" || l == "off") v = false;
          else bad_value(e, o, "expected a bool (true/false, 1/0, yes/no, on/off)");
        } else if constexpr (std::is_same_v<T, float>) {
          std::string s = !t.empty() && t[0] == '+' ? t.substr(1) : t;
          float f = 0;
          auto r = std::from_chars(s.data(), s.data() + s.size(), f);
          if (s.empty() || s[0] == '+' || r.ptr != s.data() + s.size() ||
              (r.ec != std::errc() && r.ec != std::errc::result_out_of_range))
            bad_value(e, o, "expected a number");
          if (r.ec == std::errc::result_out_of_range) bad_value(e, o, "number out of range for a float");
          if (!std::isfinite(f)) bad_value(e, o, "expected a finite number");
          v = f;
        } else if constexpr (std::is_same_v<T, int>) {
          long long x = 0;
          if (!parse_integer(t, x)) {
            if (integer_syntax(t)) bad_value(e, o, "integer out of range");
            bad_value(e, o, "expected an integer");
          }
          if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
            bad_value(e, o, "integer out of range");
          v = static_cast<int>(x);
        } else {
          uint64_t x = 0;
          if (!t.empty() && t[0] == '-') bad_value(e, o, "expected a non-negative integer");
          if (!parse_integer(t, x)) {
            if (integer_syntax(t)) bad_value(e, o, "integer out of range for uint64");
            bad_value(e, o, "expected a non-negative integer");
          }
          v = x;
        }
      },
      e.field);
}

// The constraint in words; `compact` (for --help) lists choices as a|b|c.
std::string check_text(const Check& k, bool compact) {
  if (k.choices) return compact ? join(*k.choices, "|") : "one of: " + join(*k.choices, ", ");
  if (k.nonempty) return "not empty";
  if (k.step_list) return compact ? "steps >= 1, comma-separated" : "a comma-separated list of steps >= 1";
  if (k.lo && k.hi)
    return cat("in ", k.lo_open ? "(" : "[", format_bound(*k.lo), ", ", format_bound(*k.hi),
               k.hi_open ? ")" : "]");
  if (k.lo) return cat(k.lo_open ? "> " : ">= ", format_bound(*k.lo));
  if (k.hi) return cat(k.hi_open ? "< " : "<= ", format_bound(*k.hi));
  return "";
}

// Range / choice / non-empty check of e's final value.
void validate(const Entry& e, const Config& cc, const Origin& o) {
  Config& c = const_cast<Config&>(cc);
  const Check& k = e.check;
  Origin shown{o.where, o.text.empty() && o.where == "default" ? value_text(e, cc) : o.text};
  std::visit(
      [&](auto get) {
        const auto& v = *get(c);
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (k.choices && std::find(k.choices->begin(), k.choices->end(), v) == k.choices->end())
            bad_value(e, shown, "must be " + check_text(k));
          if (k.nonempty && v.empty()) bad_value(e, shown, "must not be empty");
          if (k.step_list) {
            try {
              parse_step_list(v);
            } catch (const Error& err) {
              bad_value(e, shown, cat(err.what(), "; expected ", check_text(k), ", e.g. 3,7"));
            }
          }
        } else if constexpr (!std::is_same_v<T, bool>) {
          const double x = static_cast<double>(v);
          bool ok = true;
          if (k.lo) ok = ok && (k.lo_open ? x > *k.lo : x >= *k.lo);
          if (k.hi) ok = ok && (k.hi_open ? x < *k.hi : x <= *k.hi);
          if (!ok) bad_value(e, shown, "must be " + check_text(k));
        }
      },
      e.field);
}

}  // namespace nlp::cfg

namespace nlp {

std::vector<int64_t> parse_step_list(const std::string& text) {
  std::vector<int64_t> out;
  if (cfg::trim(text).empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const size_t n = comma == std::string::npos ? std::string::npos : comma - start;
    const std::string item = cfg::trim(text.substr(start, n));
    long long v = 0;
    if (item.empty()) throw Error("empty element in the list");
    if (!cfg::parse_integer(item, v)) {
      if (cfg::integer_syntax(item)) throw Error(cat("'", item, "' is out of range"));
      throw Error(cat("'", item, "' is not an integer"));
    }
    if (v < 1) throw Error(cat("step ", v, " is not >= 1"));
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace nlp
