// Unicode helpers for the byte-level BPE pre-tokenizer: UTF-8 decoding that never fails and the
// character classes used by the GPT-2 pre-tokenization regex.
//
// Coverage: char_class() is exact for every code point U+0000..U+10FFFF with respect to the
// Unicode 16.0 General_Category groups L (Lu Ll Lt Lm Lo) and N (Nd Nl No) and the White_Space
// property, i.e. all scripts: Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, Indic, Thai,
// Georgian, Ethiopic, Hangul (syllables and jamo), Kana, CJK ideographs incl. extensions A-I,
// historic scripts, mathematical alphanumerics, fullwidth forms, ... This is the data Oniguruma
// (the regex engine of HF `tokenizers` 0.23) uses for \p{L}, \p{N} and \s; the table was checked
// against it code point by code point. Marks (Mn/Mc/Me: combining accents U+0300.., Devanagari
// vowel signs, Thai above/below vowels), symbols, punctuation, emoji, controls, format characters
// (ZWJ, U+200B, U+FEFF), private use and unassigned code points are "Other", as in the regex. Code
// points first assigned after Unicode 16.0 are "Other".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nlp::text {

enum class CharClass : uint8_t { Other = 0, Letter = 1, Number = 2, Space = 3 };

// Class of a code point (values above U+10FFFF and surrogates are Other).
CharClass char_class(char32_t cp);

// Marker returned by decode_utf8 for a byte that does not start a well-formed UTF-8 sequence
// (stray continuation byte, overlong form, surrogate, > U+10FFFF, truncated sequence).
inline constexpr char32_t kInvalidCodePoint = 0xFFFFFFFFu;

struct Decoded {
  char32_t cp;  // code point, or kInvalidCodePoint (then len == 1)
  int len;      // bytes consumed, 1..4
};

// Decode the code point starting at s[off] (off < s.size()). Never throws: an ill-formed
// sequence consumes exactly one byte and yields kInvalidCodePoint.
Decoded decode_utf8(std::string_view s, size_t off);

// Append the UTF-8 encoding of cp (must be <= U+10FFFF) to out.
template <typename Str>
void append_utf8(Str& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace nlp::text
