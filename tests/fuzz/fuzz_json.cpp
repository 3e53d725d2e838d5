// libFuzzer harness: the minimal JSON reader (src/text/json_min.cpp), its entry points.
// The first byte picks the reader (even: {string: int} object as in encoder.json; odd: array of
// strings as in id2label; a first byte of 0xF0 or more: a flat object of strings, integers and id
// arrays, as a prompts-file line); the rest is the JSON text.
// Properties: returns or throws nlp::Error; what it accepts round-trips: the values written back as
// JSON (every byte escaped as \u00XX or \uXXXX pairs where needed) parse to the same values.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "text/json_min.h"

namespace {

// JSON string literal for a byte string: printable ASCII kept, '"' and '\\' escaped, every other byte
// as \u00XX unless it starts a valid UTF-8 sequence, which is kept as is.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);  // bytes >= 0x80 pass through raw, as the reader keeps them
    }
  }
  return out + "\"";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool array = data[0] & 1, flat = data[0] >= 0xF0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (flat) {
      const auto v = nlp::text::parse_flat_object(text, "fuzz");
      std::string again = "{";
      for (size_t i = 0; i < v.size(); ++i) {
        const auto& x = v[i].second;
        again += (i ? "," : "") + quote(v[i].first) + ":";
        if (x.kind == nlp::text::FlatValue::String) again += quote(x.str);
        else if (x.kind == nlp::text::FlatValue::Integer) again += std::to_string(x.integer);
        else {
          again += "[";
          for (size_t k = 0; k < x.ints.size(); ++k) again += (k ? "," : "") + std::to_string(x.ints[k]);
          again += "]";
        }
      }
      again += "}";
      const auto w = nlp::text::parse_flat_object(again, "again");
      bool same = w.size() == v.size();
      for (size_t i = 0; same && i < v.size(); ++i)
        same = w[i].first == v[i].first && w[i].second.kind == v[i].second.kind && w[i].second.str == v[i].second.str &&
               w[i].second.integer == v[i].second.integer && w[i].second.ints == v[i].second.ints;
      if (!same) nlp_fuzz::fail("flat object round trip: " + again);
    } else if (array) {
      const auto v = nlp::text::parse_string_array(text, "fuzz");
      std::string again = "[";
      for (size_t i = 0; i < v.size(); ++i) again += (i ? "," : "") + quote(v[i]);
      again += "]";
      if (nlp::text::parse_string_array(again, "again") != v) nlp_fuzz::fail("array round trip: " + again);
    } else {
      const auto v = nlp::text::parse_string_int_object(text, "fuzz");
      std::string again = "{";
      for (size_t i = 0; i < v.size(); ++i)
        again += (i ? "," : "") + quote(v[i].first) + ":" + std::to_string(v[i].second);
      again += "}";
      if (nlp::text::parse_string_int_object(again, "again") != v) nlp_fuzz::fail("object round trip: " + again);
    }
  } catch (const nlp::Error& e) {
    const std::string msg = e.what();
    if (msg.find("'fuzz'") == std::string::npos) nlp_fuzz::fail("error does not name the source: " + msg);
  }
  return 0;
}
