// Tokenizers: byte round trip, JSON reader, GPT-2 pre-tokenizer, and GPT-2 BPE against the HF
// `tokenizers` library (run through python3) on real corpora from NLPTRAIN_SHARED_DATA.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/sha256.h"
#include "text/json_min.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace fs = std::filesystem;
using nlp::Tokenizer;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_all(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

// Shared corpora directory, or "" when absent (tests that need it skip).
std::string shared_data() {
  const char* env = std::getenv("NLPTRAIN_SHARED_DATA");
  const std::string dir = env && *env ? env : "/work/shared/data";
  std::error_code ec;
  return fs::is_directory(fs::path(dir) / "vocab" / "gpt2", ec) ? dir : "";
}

std::string gpt2_vocab() { return shared_data() + "/vocab/gpt2"; }

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "nlptrain_tok_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// First n code points of a UTF-8 string.
std::string first_chars(const std::string& s, size_t n) {
  size_t off = 0;
  for (size_t k = 0; k < n && off < s.size(); ++k) off += nlp::text::decode_utf8(s, off).len;
  return s.substr(0, off);
}

// Lines [from, from+count) of a text (each with its '\n').
std::string lines(const std::string& s, size_t from, size_t count) {
  size_t a = 0;
  for (size_t k = 0; k < from && a != std::string::npos; ++k) {
    a = s.find('\n', a);
    if (a != std::string::npos) ++a;
  }
  if (a == std::string::npos) return "";
  size_t b = a;
  for (size_t k = 0; k < count && b < s.size(); ++k) {
    b = s.find('\n', b);
    b = b == std::string::npos ? s.size() : b + 1;
  }
  return s.substr(a, b - a);
}

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::istringstream is(s);
  int32_t v;
  while (is >> v) ids.push_back(v);
  return ids;
}

// Reference encoder: HF tokenizers with GPT-2's files, byte-level BPE exactly as GPT-2.
const char* kReferenceScript = R"PY(
import os, sys
try:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
except ImportError:
    sys.exit(77)
work, vocab, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer(models.BPE.from_file(os.path.join(vocab, "encoder.json"),
                                     os.path.join(vocab, "vocab.bpe")))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
for k in range(n):
    with open(os.path.join(work, "text_%d.txt" % k), "rb") as f:
        text = f.read().decode("utf-8")
    with open(os.path.join(work, "ids_%d.txt" % k), "w") as f:
        f.write(" ".join(map(str, tok.encode(text).ids)))
)PY";

// Runs the reference script on texts; returns false (with *why) when python3 or tokenizers is
// unavailable.
bool reference_ids(const std::vector<std::string>& texts, std::vector<std::vector<int32_t>>* out,
                   std::string* why) {
  TempDir tmp;
  write_all(tmp.path / "ref.py", kReferenceScript);
  for (size_t k = 0; k < texts.size(); ++k)
    write_all(tmp.path / ("text_" + std::to_string(k) + ".txt"), texts[k]);
  const std::string cmd = "python3 '" + (tmp.path / "ref.py").string() + "' '" + tmp.path.string() +
                          "' '" + gpt2_vocab() + "' " + std::to_string(texts.size()) + " > '" +
                          (tmp.path / "log").string() + "' 2>&1";
  const int st = std::system(cmd.c_str());
  const int rc = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  if (rc == 77 || rc == 127) {
    *why = rc == 77 ? "python3 module 'tokenizers' is not installed" : "python3 not found";
    return false;
  }
  if (rc != 0) {
    std::string log;
    try {
      log = read_all(tmp.path / "log");
    } catch (...) {
    }
    ADD_FAILURE() << "reference script failed (rc " << rc << "):\n" << log;
    *why = "reference script failed";
    return false;
  }
  out->clear();
  for (size_t k = 0; k < texts.size(); ++k)
    out->push_back(parse_ids(read_all(tmp.path / ("ids_" + std::to_string(k) + ".txt"))));
  return true;
}

// Index of the first difference (or the shorter length).
size_t first_diff(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

// ---- byte tokenizer -----------------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripAllBytes) {
  auto tok = nlp::make_tokenizer("byte", "");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->eos_id(), -1);
  std::string s;
  for (int b = 0; b < 256; ++b) s.push_back(static_cast<char>(b));
  s += "Hello, world! 한국어 \xff\xfe";
  const auto ids = tok->encode(s);
  ASSERT_EQ(ids.size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(s[i]));
  EXPECT_EQ(tok->decode(ids), s);
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_THROW(tok->decode({65, 256}), nlp::Error);
  EXPECT_THROW(tok->decode({-1}), nlp::Error);
}

TEST(MakeTokenizer, UnknownKindAndMissingFiles) {
  try {
    nlp::make_tokenizer("wordpiece", "");
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("wordpiece"), std::string::npos) << e.what();
  }
  TempDir tmp;
  try {
    nlp::make_tokenizer("gpt2", tmp.path.string());
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find((tmp.path / "encoder.json").string()), std::string::npos)
        << e.what();
  }
  write_all(tmp.path / "encoder.json", R"({"a": 0, "b": 1})");
  try {
    nlp::make_tokenizer("gpt2", tmp.path.string());
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find((tmp.path / "vocab.bpe").string()), std::string::npos)
        << e.what();
  }
}

// A tiny complete byte-level vocabulary: the 256 byte tokens plus a few merges.
TEST(Gpt2Tokenizer, TinyVocabularyMergesByRank) {
  TempDir tmp;
  std::string json = "{";
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) {
    std::string u;
    nlp::text::append_utf8(u, nlp::text::gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
    toks.push_back(u);
  }
  toks.insert(toks.end(), {"ab", "bc", "abc",
                           "\xC4\xA0"
                           "abc",
                           "<|endoftext|>"});  // "Ġabc"
  for (size_t i = 0; i < toks.size(); ++i) {
    std::string esc;
    for (char c : toks[i]) {
      if (c == '"' || c == '\\') esc.push_back('\\');
      esc.push_back(c);
    }
    json += (i ? ", \"" : "\"") + esc + "\": " + std::to_string(i);
  }
  json += "}";
  write_all(tmp.path / "encoder.json", json);
  // "b c" ranks before "a b": "abc" -> a + bc (no merge "a bc") -> stays [a, bc]
  write_all(tmp.path / "vocab.bpe", "#version: 0.2\nb c\na b\nab c\n\xC4\xA0 abc\n");
  auto tok = nlp::make_tokenizer("gpt2", tmp.path.string());
  EXPECT_EQ(tok->vocab_size(), 261);
  EXPECT_EQ(tok->eos_id(), 260);
  EXPECT_EQ(tok->encode("abc"), (std::vector<int32_t>{'a', 257}));
  EXPECT_EQ(tok->encode("ab"), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok->decode({256, 257, 260}), "abbc<|endoftext|>");
  EXPECT_EQ(tok->decode({32}), " ");
  EXPECT_THROW(tok->decode({261}), nlp::Error);
  // a merge naming an unknown token is an error naming the merges file and line
  write_all(tmp.path / "vocab.bpe", "#version: 0.2\nb c\nx yz\n");
  try {
    nlp::make_tokenizer("gpt2", tmp.path.string());
    FAIL() << "no error";
  } catch (const nlp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
}

// ---- JSON reader --------------------------------------------------------------------------------

TEST(JsonMin, FlatStringIntObject) {
  const auto v = nlp::text::parse_string_int_object(
      R"( { "a": 1, "\"q\\/\b\f\n\r\t": -2, "\u00e9\u0120": 3, "\ud83d\ude00": 40, "": 0 } )",
      "x.json");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0], (std::pair<std::string, int64_t>{"a", 1}));
  EXPECT_EQ(v[1].first, "\"q\\/\b\f\n\r\t");
  EXPECT_EQ(v[1].second, -2);
  EXPECT_EQ(v[2].first, "\xC3\xA9\xC4\xA0");
  EXPECT_EQ(v[3].first, "\xF0\x9F\x98\x80");  // U+1F600 from a surrogate pair
  EXPECT_EQ(v[3].second, 40);
  EXPECT_TRUE(nlp::text::parse_string_int_object("{}", "e.json").empty());
  for (const char* bad : {"", "{", R"({"a": 1,})", R"({"a": 1.5})", R"({"a": "1"})",
                          R"({"a": 1} x)", R"({"\ud83d": 1})", R"({"\ude00": 1})",
                          R"({"a": 1, "a": 2})", R"({"a" 1})", R"({"\x": 1})", "[1]"}) {
    try {
      nlp::text::parse_string_int_object(bad, "bad.json");
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(nlp::text::read_string_int_json("/nonexistent/encoder.json"), nlp::Error);
}

// ---- pre-tokenizer (expected pieces taken from HF tokenizers' GPT-2 regex) ----------------------

TEST(JsonMin, FlatStringStringObject) {
  auto v = nlp::text::parse_string_string_object(R"( {"prompt": "a\n\"b\" \u00e9", "id": ""} )", "p.jsonl");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].first, "prompt");
  EXPECT_EQ(v[0].second, "a\n\"b\" \xc3\xa9");
  EXPECT_EQ(v[1].second, "");
  for (const char* bad : {R"({"prompt": 3})", R"({"prompt": "a", "prompt": "b"})", R"(["a"])",
                          R"({"prompt": "a"} x)", R"({"prompt": null})"}) {
    try {
      nlp::text::parse_string_string_object(bad, "p.jsonl");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("p.jsonl"), std::string::npos) << e.what();
    }
  }
}

TEST(Sha256, NistVectorsAndIncrementalUpdates) {
  EXPECT_EQ(nlp::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(nlp::sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(nlp::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  nlp::Sha256 h;  // one million 'a', fed in uneven pieces across block boundaries
  const std::string piece(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, piece.size());
    h.update(std::string_view(piece).substr(0, n));
    left -= n;
  }
  EXPECT_EQ(h.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // the byte tokenizer's fingerprint, as Python's hashlib.sha256(b"byte:256") gives it
  EXPECT_EQ(nlp::make_tokenizer("byte", "")->vocab_sha256(),
            "18def6f6a5c917774d14d83998d4ede8bfba7821ead7008d760deb454bad0e86");
}

TEST(JsonMin, FlatObjectOfStringsIntegersAndIdArrays) {
  using nlp::text::FlatValue;
  auto v = nlp::text::parse_flat_object(
      R"({"prompt": "h\u00e9", "prompt_ids": [15496, 0, -1], "eos_id": 50256, "e": [], "s": ""})", "p.jsonl");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0].second.kind, FlatValue::String);
  EXPECT_EQ(v[0].second.str, "h\xc3\xa9");
  EXPECT_EQ(v[1].second.kind, FlatValue::IntArray);
  EXPECT_EQ(v[1].second.ints, (std::vector<int64_t>{15496, 0, -1}));
  EXPECT_EQ(v[2].second.kind, FlatValue::Integer);
  EXPECT_EQ(v[2].second.integer, 50256);
  EXPECT_EQ(v[3].second.kind, FlatValue::IntArray);
  EXPECT_TRUE(v[3].second.ints.empty());
  for (const char* bad : {R"({"a": [1, 2.5]})", R"({"a": [1,]})", R"({"a": ["x"]})", R"({"a": [1)",
                          R"({"a": 1, "a": 2})", R"({"a": null})", R"({"a": {"b": 1}})", R"({"a": 1e3})"}) {
    try {
      nlp::text::parse_flat_object(bad, "p.jsonl");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const nlp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("p.jsonl"), std::string::npos) << e.what();
    }
  }
}

TEST(JsonMin, QuoteEscapesAndReplacesInvalidUtf8) {
  using nlp::text::json_quote;
  EXPECT_EQ(json_quote("a\"b\\c\n\t\r\x01"), R"("a\"b\\c\n\t\r\u0001")");
  EXPECT_EQ(json_quote("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
  // A cut multi-byte character, a lone continuation byte, an overlong form, a surrogate: U+FFFD each byte.
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(json_quote("x\xe2\x82"), "\"x" + r + r + "\"");
  EXPECT_EQ(json_quote("\x80"), "\"" + r + "\"");
  EXPECT_EQ(json_quote("\xc0\xaf"), "\"" + r + r + "\"");
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"" + r + r + r + "\"");
  // Round trip through the reader for valid text.
  const std::string t = "prompt: \"\\ \x7f \xc3\xa9\n";
  EXPECT_EQ(nlp::text::parse_string_string_object("{\"k\": " + json_quote(t) + "}", "t")[0].second, t);
}

TEST(Gpt2Pretokenize, RegexCases) {
  using V = std::vector<std::string_view>;
  using nlp::text::gpt2_pretokenize;
  EXPECT_EQ(gpt2_pretokenize("I'll we've they'RE don't"),
            (V{"I", "'ll", " we", "'ve", " they", "'", "RE", " don", "'t"}));
  EXPECT_EQ(gpt2_pretokenize("a  b\n\n  c"), (V{"a", " ", " b", "\n\n ", " c"}));
  EXPECT_EQ(gpt2_pretokenize("2026-11-21 3.14"),
            (V{"2026", "-", "11", "-", "21", " 3", ".", "14"}));
  EXPECT_EQ(gpt2_pretokenize("x \n\ty  "), (V{"x", " \n", "\t", "y", "  "}));
  EXPECT_EQ(gpt2_pretokenize("h\xC3\xA9llo w\xC3\xB6rld"), (V{"h\xC3\xA9llo", " w\xC3\xB6rld"}));
  // "Ünïcödé 日本語 한국어!!"
  EXPECT_EQ(
      gpt2_pretokenize("\xC3\x9Cn\xC3\xAF"
                       "c\xC3\xB6"
                       "d\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC"
                       "\xE8\xAA\x9E \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4!!"),
      (V{"\xC3\x9Cn\xC3\xAF"
         "c\xC3\xB6"
         "d\xC3\xA9",
         " \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", " \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4", "!!"}));
  EXPECT_EQ(gpt2_pretokenize("\xC2\xA0x"), (V{"\xC2\xA0", "x"}));  // NBSP is \s but not ' '
  EXPECT_EQ(gpt2_pretokenize("e\xCC\x81t\xC3\xA9"),
            (V{"e", "\xCC\x81", "t\xC3\xA9"}));  // U+0301 is a mark
  EXPECT_TRUE(gpt2_pretokenize("").empty());
  // invalid UTF-8 bytes are one-byte "other" characters
  EXPECT_EQ(gpt2_pretokenize("ab\xFF\xC3 c"), (V{"ab", "\xFF\xC3", " c"}));
}

TEST(Unicode, Classes) {
  using nlp::text::char_class;
  using C = nlp::text::CharClass;
  for (char32_t c :
       {U'a',      U'Z',      U'\u00AA', U'\u00B5', U'\u00E9', U'\u03C9',     U'\u0416',
        U'\u05D0', U'\u0639', U'\u0939', U'\u0E01', U'\u10D0', U'\u3042',     U'\u30A2',
        U'\u4E00', U'\uAC00', U'\uD7A3', U'\u1100', U'\uFF21', U'\U00020000', U'\U0001D518'})
    EXPECT_EQ(char_class(c), C::Letter) << std::hex << uint32_t(c);
  for (char32_t c : {U'0', U'9', U'\u00B2', U'\u00BD', U'\u0661', U'\u0967', U'\u2163', U'\u2460',
                     U'\uFF11', U'\U0001D7CE'})
    EXPECT_EQ(char_class(c), C::Number) << std::hex << uint32_t(c);
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00A0', U'\u2003',
                     U'\u2028', U'\u3000'})
    EXPECT_EQ(char_class(c), C::Space) << std::hex << uint32_t(c);
  for (char32_t c : {U'!', U'\'', U'\u00D7', U'\u0301', U'\u093F', U'\u200B', U'\uFEFF', U'\u20AC',
                     U'\U0001F600', U'\u001C', U'\uE000', U'\U0010FFFF'})
    EXPECT_EQ(char_class(c), C::Other) << std::hex << uint32_t(c);
}

// ---- GPT-2 against HF tokenizers ----------------------------------------------------------------

TEST(Gpt2Tokenizer, MatchesHuggingFaceTokenizers) {
  const std::string data = shared_data();
  if (data.empty()) GTEST_SKIP() << "shared data (NLPTRAIN_SHARED_DATA/vocab/gpt2) absent";
  auto tok = nlp::make_tokenizer("gpt2", gpt2_vocab());
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eos_id(), 50256);

  std::vector<std::string> names, texts;
  auto add = [&](const std::string& name, const std::string& text) {
    names.push_back(name);
    texts.push_back(text);
  };
  add("tinyshakespeare[:20000]",
      first_chars(read_all(fs::path(data) / "tinyshakespeare/input.txt"), 20000));
  add("wikitext2 raw lines 1000-1600",
      lines(read_all(fs::path(data) / "wikitext2/wiki.test.raw"), 1000, 600));
  add("nsmc train lines 1-400",
      lines(read_all(fs::path(data) / "nsmc/nsmc_from_raw_train.tsv"), 1, 400));
  const char* hand[] = {
      "I'll we've they're she'd he's it'd I'm can't WE'LL 'S 'tis ''s",
      "2026-11-21 3.14 1,000,000 v2.0.1 0x1F 12345678901234567890",
      "a  b\n\n  c",
      "  leading spaces, trailing spaces   ",
      "tabs\tand\r\nCRLF\r\n\r\nlines\n \n\t \n",
      "emoji 😀🎉👍🏽 🇰🇷 family 👨‍👩‍👧",
      "accents: café naïve résumé Ångström façade Zoë e\xCC\x81 (combining)",
      "Ελληνικά Русский язык עברית العربية हिन्दी ไทย 日本語のテキスト 中文 한국어 텍스트",
      "numbers: ½ ² ٣ ३ Ⅻ ①  １２３ ",
      "nbsp\xC2\xA0here ideographic\xE3\x80\x80space line\xE2\x80\xA8sep zero\xE2\x80\x8Bwidth",
      "<|endoftext|> is plain text here",
      "!!!??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((( )))",
      "",
      " ",
      "\n",
      "x",
  };
  for (const char* h : hand) add(std::string("hand: ") + h, h);
  add("long letter run", std::string(3000, 'a'));
  add("long punctuation run", std::string(700, '!') + " " + std::string(300, '='));
  // deterministic fuzz over a tricky alphabet
  const std::vector<std::string> alphabet = {" ",
                                             " ",
                                             "  ",
                                             "\n",
                                             "\t",
                                             "\r",
                                             "'",
                                             "s",
                                             "t",
                                             "re",
                                             "ll",
                                             "d",
                                             "S",
                                             "a",
                                             "Z",
                                             "0",
                                             "9",
                                             "!",
                                             ".",
                                             "-",
                                             "\xC2\xA0",
                                             "\xE3\x80\x80",
                                             "\xC3\xA9",
                                             "\xED\x95\x9C",
                                             "\xE6\x97\xA5",
                                             "\xF0\x9F\x98\x80",
                                             "\xCC\x81",
                                             "\xC2\xBD",
                                             "\xD9\xA3",
                                             "\xE2\x80\x8B"};
  std::mt19937 rng(1234);
  for (int k = 0; k < 60; ++k) {
    std::string s;
    const int n = static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    add("fuzz " + std::to_string(k), s);
  }

  std::vector<std::vector<int32_t>> ref;
  std::string why;
  if (!reference_ids(texts, &ref, &why)) GTEST_SKIP() << why;
  ASSERT_EQ(ref.size(), texts.size());
  size_t total = 0;
  for (size_t k = 0; k < texts.size(); ++k) {
    const auto ids = tok->encode(texts[k]);
    total += ids.size();
    if (ids != ref[k]) {
      const size_t d = first_diff(ids, ref[k]);
      ADD_FAILURE() << names[k] << ": " << ids.size() << " ids vs " << ref[k].size()
                    << " from HF; first difference at index " << d << ": "
                    << (d < ids.size() ? ids[d] : -1) << " vs "
                    << (d < ref[k].size() ? ref[k][d] : -1);
    }
    EXPECT_EQ(tok->decode(ids), texts[k]) << names[k];
  }
  EXPECT_GT(total, 10000u);
}

TEST(Gpt2Tokenizer, RoundTripArbitraryBytes) {
  if (shared_data().empty()) GTEST_SKIP() << "shared data (NLPTRAIN_SHARED_DATA/vocab/gpt2) absent";
  auto tok = nlp::make_tokenizer("gpt2", gpt2_vocab());
  std::mt19937 rng(7);
  for (int k = 0; k < 200; ++k) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 ? rng() % 128 : rng() % 256);
    const auto ids = tok->encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
    ASSERT_EQ(tok->decode(ids), s);
  }
  // decode of a slice that splits a multi-byte character returns the raw bytes
  const auto ids = tok->encode("\xF0\x9F\x98\x80");  // U+1F600: several byte-level tokens
  ASSERT_GT(ids.size(), 1u);
  const std::string part = tok->decode({ids[0]});
  EXPECT_LT(part.size(), 4u);
  EXPECT_EQ(std::string("\xF0\x9F\x98\x80").rfind(part, 0), 0u);
  EXPECT_THROW(tok->decode({50257}), nlp::Error);
  EXPECT_THROW(tok->decode({-5}), nlp::Error);
}

// encode() shares a word cache between threads: concurrent calls must give the serial result.
TEST(Gpt2Tokenizer, ConcurrentEncode) {
  const std::string data = shared_data();
  if (data.empty()) GTEST_SKIP() << "shared data (NLPTRAIN_SHARED_DATA/vocab/gpt2) absent";
  const std::string text =
      first_chars(read_all(fs::path(data) / "tinyshakespeare/input.txt"), 200000);
  const auto serial = nlp::make_tokenizer("gpt2", gpt2_vocab())->encode(text);
  auto tok = nlp::make_tokenizer("gpt2", gpt2_vocab());
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { got[t] = tok->encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, serial);
}

// Reports encode throughput on the whole of tinyshakespeare (1.1 MB): cold (empty word cache) and
// warm (second pass). The lower bound only catches pathological slowness.
TEST(Gpt2Tokenizer, EncodeSpeedTinyShakespeare) {
  const std::string data = shared_data();
  if (data.empty()) GTEST_SKIP() << "shared data (NLPTRAIN_SHARED_DATA/vocab/gpt2) absent";
  const std::string text = read_all(fs::path(data) / "tinyshakespeare/input.txt");
  auto tok = nlp::make_tokenizer("gpt2", gpt2_vocab());
  auto time_encode = [&](std::vector<int32_t>* ids) {
    const auto t0 = std::chrono::steady_clock::now();
    *ids = tok->encode(text);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<int32_t> ids, ids2;
  const double cold = time_encode(&ids);
  const double warm = time_encode(&ids2);
  EXPECT_EQ(ids, ids2);
  EXPECT_EQ(tok->decode(ids), text);
  const double cold_rate = ids.size() / cold, warm_rate = ids.size() / warm;
  std::cout << "[ speed    ] gpt2 encode tinyshakespeare: " << text.size() << " bytes -> "
            << ids.size() << " tokens; cold " << static_cast<int64_t>(cold_rate)
            << " tokens/s, warm " << static_cast<int64_t>(warm_rate) << " tokens/s" << std::endl;
  RecordProperty("cold_tokens_per_s", std::to_string(static_cast<int64_t>(cold_rate)));
  RecordProperty("warm_tokens_per_s", std::to_string(static_cast<int64_t>(warm_rate)));
  EXPECT_GT(cold_rate, 1e5);
}
