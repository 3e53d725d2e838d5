// Minimal flat {string: int} JSON reader (see json_min.h).
#include "text/json_min.h"

#include <cstdio>
#include <fstream>
#include <type_traits>
#include <limits>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include "core/error.h"
#include "text/unicode.h"

namespace nlp::text {
namespace {

class Parser {
 public:
  Parser(const std::string& s, const std::string& source) : s_(s), src_(source) {}

  // ["a", "b", ...]
  std::vector<std::string> parse_string_array() {
    std::vector<std::string> out;
    parse_items('[', ']', "array", [&] { out.push_back(parse_string()); });
    return out;
  }

  template <class V = int64_t>
  std::vector<std::pair<std::string, V>> parse_object() {
    std::vector<std::pair<std::string, V>> out;
    std::unordered_set<std::string> seen;
    parse_items('{', '}', "object", [&] {
      const size_t key_at = i_;
      std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      V v;
      if constexpr (std::is_same_v<V, std::string>) {
        if (peek() != '"') fail(i_, cat("the value of \"", key, "\" must be a string"));
        v = parse_string();
      } else if constexpr (std::is_same_v<V, FlatValue>) {
        v = parse_flat_value(key);
      } else {
        v = parse_int();
      }
      if (!seen.insert(key).second) fail(key_at, cat("duplicate key \"", key, "\""));
      out.emplace_back(std::move(key), v);
    });
    return out;
  }

 private:
  // The whole input: `open`, items separated by ',' (each read by item() between white space),
  // `close`; `what` names it in the error about data after it.
  template <class Item>
  void parse_items(char open, char close, const char* what, Item item) {
    skip_ws();
    expect(open);
    skip_ws();
    if (peek() == close) {
      ++i_;
    } else {
      for (;;) {
        skip_ws();
        item();
        skip_ws();
        const char c = peek();
        if (c == ',') {
          ++i_;
          continue;
        }
        if (c == close) {
          ++i_;
          break;
        }
        fail(i_, cat("expected ',' or '", close, "'"));
      }
    }
    skip_ws();
    if (i_ != s_.size()) fail(i_, cat("unexpected data after the ", what));
  }

  FlatValue parse_flat_value(const std::string& key) {
    FlatValue v;
    if (peek() == '"') {
      v.str = parse_string();
      return v;
    }
    if (peek() != '[') {
      if (peek() != '-' && (peek() < '0' || peek() > '9'))
        fail(i_, cat("the value of \"", key, "\" must be a string, an integer or an array of integers"));
      v.kind = FlatValue::Integer;
      v.integer = parse_int();
      return v;
    }
    v.kind = FlatValue::IntArray;
    ++i_;
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.ints.push_back(parse_int());
      skip_ws();
      const char c = peek();
      ++i_;
      if (c == ']') return v;
      if (c != ',') fail(i_ - 1, cat("expected ',' or ']' in the array \"", key, "\""));
    }
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(cat("JSON file '", src_, "': ", what, " at byte offset ", at));
  }
  char peek() const {
    if (i_ >= s_.size()) fail(i_, "unexpected end of input");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(i_, cat("expected '", c, "'"));
    ++i_;
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail(i_, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= unsigned(c - 'A' + 10);
      else
        fail(i_ - 1, "bad hex digit in \\u escape");
    }
    return v;
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail(i_, "unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail(i_, "control character in string");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++i_;
        continue;
      }
      const size_t esc_at = i_;
      ++i_;
      const char e = peek();
      ++i_;
      // the one-character escapes: \" \\ \/ \b \f \n \r \t
      static constexpr std::string_view kEscaped = "\"\\/bfnrt", kMeans = "\"\\/\b\f\n\r\t";
      if (const size_t k = kEscaped.find(e); k != std::string_view::npos) {
        out.push_back(kMeans[k]);
        continue;
      }
      switch (e) {
        case 'u': {
          char32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // high surrogate: a low one must follow
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u')
              fail(esc_at, "high surrogate not followed by a low surrogate");
            i_ += 2;
            const char32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF)
              fail(esc_at, "high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail(esc_at, "lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail(esc_at, cat("bad escape '\\", e, "'"));
      }
    }
  }
  int64_t parse_int() {
    const size_t start = i_;
    bool neg = false;
    if (peek() == '-') {
      neg = true;
      ++i_;
    }
    if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') fail(start, "expected an integer value");
    if (s_[i_] == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      fail(start, "leading zero in number");
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const int d = s_[i_] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - d) / 10) fail(start, "integer out of range");
      v = v * 10 + d;
      ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      fail(start, "expected an integer value, got a fraction or exponent");
    return neg ? -v : v;
  }

  const std::string& s_;
  const std::string& src_;
  size_t i_ = 0;
};

}  // namespace

std::vector<std::pair<std::string, int64_t>> parse_string_int_object(const std::string& json,
                                                                     const std::string& source) {
  return Parser(json, source).parse_object();
}

std::vector<std::pair<std::string, std::string>> parse_string_string_object(
    const std::string& json, const std::string& source) {
  return Parser(json, source).parse_object<std::string>();
}

std::vector<std::pair<std::string, FlatValue>> parse_flat_object(const std::string& json,
                                                                 const std::string& source) {
  return Parser(json, source).parse_object<FlatValue>();
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default:
          if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out += char(c);
          }
      }
      ++i;
      continue;
    }
    // Length and validity of a multi-byte sequence (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned char d = b[i + k];
      ok = k == 1 ? (d >= lo && d <= hi) : (d >= 0x80 && d <= 0xBF);
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    }
  }
  out += '"';
  return out;
}

std::vector<std::string> parse_string_array(const std::string& json, const std::string& source) {
  return Parser(json, source).parse_string_array();
}

std::vector<std::pair<std::string, int64_t>> read_string_int_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat("cannot open JSON file '", path, "'"));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(cat("error reading JSON file '", path, "'"));
  return parse_string_int_object(ss.str(), path);
}

std::string write_string_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + json_quote(items[i]);
  return out + "]";
}

}  // namespace nlp::text
