// Text helpers of the configuration layer and the INI file's reading: trimming, escapes, UTF-8,
// control bytes, comment stripping with line numbers. Internal to src/config/.
#pragma once
#include <cstddef>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace nlp::cfg {

std::string trim(const std::string& s);
std::string lower(std::string s);
std::string join(const std::vector<std::string>& v, const std::string& sep);

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one (overlong forms, surrogates
// and code points above U+10FFFF are invalid).
size_t utf8_length(const std::string& s, size_t i);
// s for an INI value with escapes: line breaks, tabs, quotes and backslashes escaped; other control
// bytes and bytes that are not UTF-8 text as \xHH, so that the written config.ini is text that reads
// back to the same bytes.
std::string escape(const std::string& s);
// The escapes \n \t \r \\ \" \xHH read back.
std::string unescape(const std::string& s);
// Strip one pair of matching surrounding double quotes.
std::string unquote(const std::string& s);
// The first ASCII control byte other than a tab in s, or npos.
size_t find_control(const std::string& s);
// "0x1F"
std::string hex_byte(char ch);

constexpr char kHashStandIn = '\x1f';  // protects '#' inside values from Boost's comment stripping

struct IniText {
  std::string text;                                 // cleaned text for Boost
  std::map<std::string, std::vector<int>> lines;    // "section.key" -> line numbers, in order
};
// Strip comments ('#' or ';' at the start of a line or after whitespace, outside double quotes),
// check the syntax line by line (so errors carry line numbers) and record where each key is.
IniText clean_ini(const std::string& path, std::istream& in);
// An INI file is UTF-8 text: a NUL byte or invalid UTF-8 is an error naming the file, line and byte.
void require_text(const std::string& path, const std::string& data);

}  // namespace nlp::cfg
