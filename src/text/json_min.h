// A minimal JSON reader for one flat object mapping strings to integers, e.g. GPT-2's
// encoder.json: {"!": 0, "\"": 1, ..., "<|endoftext|>": 50256}.
// Strings support every JSON escape, including \uXXXX and UTF-16 surrogate pairs (decoded to UTF-8;
// a lone surrogate is an error). Values must be integers (no fraction or exponent). Anything else
// -- nested values, trailing garbage, duplicate keys -- is an nlp::Error naming `source` and the
// byte offset.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nlp::text {

// Parse `json` (the whole text). `source` (usually the file path) is used in error messages.
// Entries are returned in file order.
std::vector<std::pair<std::string, int64_t>> parse_string_int_object(const std::string& json,
                                                                     const std::string& source);

// Parse a JSON array of strings, e.g. ["O", "B-PS", "I-PS"]; errors name `source`.
std::vector<std::string> parse_string_array(const std::string& json, const std::string& source);

// A JSON array of strings (", \ and control characters escaped; UTF-8 kept as is): the inverse of
// parse_string_array.
std::string write_string_array(const std::vector<std::string>& items);

// Parse one flat JSON object whose values are all strings, e.g. a prompts-file line
// {"prompt": "Hello", "id": "a1"}; entries in order, duplicate keys are an error naming `source`.
std::vector<std::pair<std::string, std::string>> parse_string_string_object(
    const std::string& json, const std::string& source);

// A value of parse_flat_object: a string, an integer, or an array of integers.
struct FlatValue {
  enum Kind { String, Integer, IntArray } kind = String;
  std::string str;
  int64_t integer = 0;
  std::vector<int64_t> ints;
};
// Parse one flat JSON object whose values are strings, integers or arrays of integers, e.g. a
// prompts-file line {"prompt": "Hello", "prompt_ids": [15496], "vocab_sha256": "..."}; entries in
// order; duplicate keys and other value types are an error naming `source`.
std::vector<std::pair<std::string, FlatValue>> parse_flat_object(const std::string& json,
                                                                 const std::string& source);

// `s` as a JSON string literal (with the quotes). Bytes that are not well-formed UTF-8 become
// U+FFFD, so the result is always valid JSON; control characters are escaped.
std::string json_quote(const std::string& s);

// Read and parse a file; a missing or unreadable file is an error naming the path.
std::vector<std::pair<std::string, int64_t>> read_string_int_json(const std::string& path);

}  // namespace nlp::text
