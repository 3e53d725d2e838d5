// Messages of the configuration layer for names that are not keys: the closest known name as a
// suggestion. Internal to src/config/.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace nlp::cfg {

// Edit distance counting insertions, deletions, substitutions and adjacent transpositions as 1.
size_t edit_distance(const std::string& a, const std::string& b);
// Closest candidate to `bad` (case-insensitive edit distance) if it is close enough, else "".
std::string closest(const std::string& bad, const std::vector<std::string>& candidates);
// Explanation for a key that is not in the schema: unknown section, key outside a section or unknown
// key in a known section, with the closest known key (or section) as a suggestion. `cli`: the name
// came from a command-line option (--name) rather than an INI line.
std::string unknown_key_message(const std::string& name, bool cli);

}  // namespace nlp::cfg
