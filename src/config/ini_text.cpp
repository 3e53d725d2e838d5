// Text helpers of the configuration layer and the INI file's text: escapes, UTF-8, control bytes,
// comments and line numbers (the keys and values are then read by Boost in read_ini).
#include "config/ini_text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>

#include "config/config_messages.h"
#include "config/config_schema.h"
#include "core/error.h"

namespace nlp::cfg {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}


// s for an INI value with escapes: line breaks, tabs, quotes and backslashes escaped; other control
// bytes and bytes that are not UTF-8 text as \xHH, so that the written config.ini is text that reads
// back to the same bytes.
std::string escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const size_t n = utf8_length(s, i);
      if (n > 0) {
        out.append(s, i, n);
        i += n - 1;
        continue;
      }
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) {  // \xHH
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[i + 1];
      const char* rep = n == 'n' ? "\n" : n == 't' ? "\t" : n == 'r' ? "\r" : n == '\\' ? "\\"
                        : n == '"' ? "\"" : nullptr;
      if (rep) {
        out += rep;
        ++i;
        continue;
      }
      auto hex = [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; };
      if (n == 'x' && i + 3 < s.size() && hex(s[i + 2]) && hex(s[i + 3])) {  // \xHH: one byte
        out += static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// Strip one pair of matching surrounding double quotes.
std::string unquote(const std::string& s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

// The first ASCII control byte other than a tab in s, or npos. A value without escapes may not hold
// one: it would not survive to_ini() and reading back (a line break splits the line, and 0x1F is the
// stand-in that protects '#' from Boost: it came back as '#', found by tests/fuzz/fuzz_cli). Values
// with escapes (generate.prompt) hold any byte: to_ini() writes control bytes as \n, \r, \xHH.
size_t find_control(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto ch = static_cast<unsigned char>(s[i]);
    if (ch < 0x20 && ch != '\t') return i;
  }
  return std::string::npos;
}

std::string hex_byte(char ch) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(ch)));
  return buf;
}


// Strip comments ('#' or ';' at the start of a line or after whitespace, outside double quotes),
// check the syntax line by line (so errors carry line numbers) and record where each key is.
IniText clean_ini(const std::string& path, std::istream& in) {
  IniText out;
  const auto secs = sections();
  std::string section, line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 byte order mark
    const std::string at = cat("config file '", path, "', line ", n);
    bool quoted = false;
    size_t cut = line.size();
    for (size_t i = 0; i < line.size(); ++i) {
      char ch = line[i];
      if (quoted && ch == '\\') {
        ++i;
        continue;
      }
      if (ch == '"') quoted = !quoted;
      if (!quoted && (ch == '#' || ch == ';') &&
          (i == 0 || std::isspace(static_cast<unsigned char>(line[i - 1])))) {
        cut = i;
        break;
      }
    }
    std::string s = trim(line.substr(0, cut));
    if (s.empty()) {
      out.text += "\n";
      continue;
    }
    if (s.front() == '[') {
      if (s.back() != ']') throw Error(cat(at, ": malformed section header '", s, "'"));
      section = trim(s.substr(1, s.size() - 2));
      if (std::find(secs.begin(), secs.end(), section) == secs.end()) {
        std::string sug = closest(section, secs);
        throw Error(cat(at, ": unknown section [", section, "]",
                        sug.empty() ? cat("; sections are ", join(secs, ", "))
                                    : cat("; did you mean [", sug, "]?")));
      }
      out.text += "[" + section + "]\n";
      continue;
    }
    if (const size_t i = find_control(s); i != std::string::npos)
      throw Error(cat(at, ": control character ", hex_byte(s[i]), " (only a tab is allowed)"));
    auto eq = s.find('=');
    if (eq == std::string::npos)
      throw Error(cat(at, ": expected 'key = value' or '[section]', got '", s, "'"));
    std::string key = trim(s.substr(0, eq));
    if (key.empty()) throw Error(cat(at, ": missing key before '=' in '", s, "'"));
    out.lines[section.empty() ? key : section + "." + key].push_back(n);
    std::replace(s.begin(), s.end(), '#', kHashStandIn);
    out.text += s + "\n";
  }
  return out;
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one (overlong forms, surrogates
// and code points above U+10FFFF are invalid).
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  const size_t n = c >= 0xF5 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
  if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // UTF-16 surrogates
  if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
  if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // above U+10FFFF
  return n;
}

// An INI file is UTF-8 text: a NUL byte (an HDF5 or other binary file given by mistake) or invalid
// UTF-8 is an error naming the file, line and byte, rather than a confusing syntax error later.
void require_text(const std::string& path, const std::string& data) {
  int line = 1;
  for (size_t i = 0; i < data.size();) {
    if (data[i] == '\0')
      throw Error(cat("config file '", path, "', line ", line, ": is not a text file (NUL byte at offset ",
                      i, "); give an INI file, e.g. nlptrain input.ini"));
    const size_t n = utf8_length(data, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(data[i]));
      throw Error(cat("config file '", path, "', line ", line, ": is not a text file (invalid UTF-8 byte ",
                      hex, " at offset ", i, ")"));
    }
    if (data[i] == '\n') ++line;
    i += n;
  }
}


}  // namespace nlp::cfg
