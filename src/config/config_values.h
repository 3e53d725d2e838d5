// One key's value: read from text into its Config field (type errors), written back as INI text,
// and checked against its schema row (ranges, choices). Internal to src/config/.
#pragma once
#include <charconv>
#include <string>

#include "config/config_schema.h"

namespace nlp::cfg {

// Where a value was read: "config file 'x.ini', line 4", "command line", "model.preset = P" or
// "default", and the value as given.
struct Origin {
  std::string where;
  std::string text;
};

std::string format_float(float v);   // the shortest text that reads back as v
std::string format_bound(double v);
// The value of e in c as INI text (strings quoted when needed, prompts escaped).
std::string value_text(const Entry& e, const Config& c);
[[noreturn]] void bad_value(const Entry& e, const Origin& o, const std::string& why);

template <typename T>
bool parse_integer(const std::string& s, T& out) {
  std::string t = s;
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (t.empty() || t[0] == '+') return false;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out);
  return r.ec == std::errc() && r.ptr == t.data() + t.size();
}
// [+-]digits: an integer in syntax (used to tell "out of range" from "not an integer").
bool integer_syntax(const std::string& t);

// Parse `raw` according to e's type and store it in c; throws on a wrong type.
void assign(const Entry& e, Config& c, const std::string& raw, const Origin& o);
// The constraint in words; `compact` (for --help) lists choices as a|b|c.
std::string check_text(const Check& k, bool compact = false);
// Range / choice / non-empty check of e's final value.
void validate(const Entry& e, const Config& c, const Origin& o);

}  // namespace nlp::cfg
