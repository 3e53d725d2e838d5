// Messages for names that are not keys, with the closest known key or section as a suggestion.
#include "config/config_messages.h"

#include <algorithm>
#include <limits>

#include "config/config_schema.h"
#include "config/ini_text.h"
#include "core/error.h"

namespace nlp::cfg {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// Closest candidate to `bad` (case-insensitive edit distance) if it is close enough, else "".
std::string closest(const std::string& bad, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(lower(bad), lower(c));
    if (d < best_d) best_d = d, best = c;
  }
  return best_d <= std::max<size_t>(1, bad.size() / 3) ? best : "";
}

// Explanation for a key that is not in the schema: unknown section, key outside a section or unknown
// key in a known section, with the closest known key (or section) as a suggestion. `cli`: the name
// came from a command-line option (--name) rather than an INI line.
std::string unknown_key_message(const std::string& name, bool cli) {
  const auto secs = sections();
  const auto dot = name.find('.');
  const std::string sec = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
  // Same key name in another section ("[model] lr" -> train.lr) beats edit distance.
  std::string suggestion;
  for (const auto& e : schema())
    if (e.key() == key) {
      suggestion = e.name;
      break;
    }
  if (suggestion.empty()) {
    std::vector<std::string> names;
    for (const auto& e : schema()) names.push_back(dot == std::string::npos ? e.key() : e.name);
    suggestion = closest(name, names);
    if (!suggestion.empty() && dot == std::string::npos) {
      for (const auto& e : schema())
        if (e.key() == suggestion) suggestion = e.name;
    }
  }
  std::string msg;
  if (dot == std::string::npos)
    msg = cli ? cat("unknown option '--", name, "'") : cat("key '", name, "' is not inside a [section]");
  else if (std::find(secs.begin(), secs.end(), sec) == secs.end())
    msg = cat("unknown section '", sec, "' in key '", name, "'");
  else
    msg = cat("unknown key '", name, "'");
  if (!suggestion.empty()) return cat(msg, "; did you mean ", suggestion, "?");
  if (dot != std::string::npos && std::find(secs.begin(), secs.end(), sec) != secs.end()) {
    std::vector<std::string> keys;
    for (const auto& e : schema())
      if (e.section() == sec) keys.push_back(e.key());
    return cat(msg, "; keys of [", sec, "]: ", join(keys, ", "));
  }
  if (dot == std::string::npos)
    return cli ? cat(msg, "; options are --help, --version and --section.key=value (see --help)")
               : cat(msg, "; keys belong under a [section] (see --help)");
  std::string sec_suggestion = closest(sec, secs);
  if (!sec_suggestion.empty()) return cat(msg, "; did you mean [", sec_suggestion, "]?");
  return cat(msg, "; sections are ", join(secs, ", "));
}

}  // namespace nlp::cfg
