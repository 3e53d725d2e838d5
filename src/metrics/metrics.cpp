// Evaluation metrics of the BERT tasks (see metrics.h). Every function reproduces a reference
// implementation exactly, as checked by tests/unit/test_metrics.cpp against the references
// themselves (tests/python/metrics_reference.py):
//
// * Entity chunking and P/R/F1: the `seqeval` package (1.2.2), default mode (no `mode="strict"`,
//   no scheme), seqeval.metrics.sequence_labeling.get_entities / precision_score / recall_score /
//   f1_score with average="micro" and zero_division="warn" (which returns 0).
//   A tag is split as seqeval does: its first character is the chunk tag (B, I, E, S, O, or
//   anything else) and its type is what follows the first '-' after that character ("_" when
//   empty), so "B-PER" -> (B, PER), "O" -> (O, _), "B" -> (B, _).
//   A chunk ends before position i when
//     the previous tag is E or S; or it is B or I and the tag is B, S or O; or the previous tag is
//     neither O nor '.' and the type changes;
//   a chunk starts at i when
//     the tag is B or S; or it is I or E after O, E or S; or it is neither O nor '.' and the type
//     changes.
//   Hence: I- without a preceding B- starts an entity (IOB1 tolerance); B-PER I-PER B-PER is two
//   entities; B-PER I-LOC is two (PER [0,1), LOC [1,2)); E-/S- follow IOBES (S- is a one-token
//   entity, E- closes one); tags that are none of these (e.g. "X") still take part the way seqeval
//   lets them (seqeval only warns). entity_prf chains the sentences exactly like seqeval does with
//   nested lists (each sentence followed by an "O"), so even such odd tags count as seqeval counts.
//   Precision is 0 when nothing is predicted, recall 0 when there is no gold entity, F1 0 when
//   both are 0 (seqeval's zero_division="warn" behaviour). seqeval raises TypeError for a corpus of
//   zero sentences; entity_prf returns all zeros there (so that an empty shard can be summed).
//
// * SQuAD v1.1: the official evaluate-v1.1.py (https://rajpurkar.github.io/SQuAD-explorer/):
//   normalize_answer(s) = white_space_fix(remove_articles(remove_punc(lower(s)))) with
//   lower = Python str.lower(), remove_punc deleting the 32 ASCII characters of string.punctuation,
//   remove_articles = re.sub(r'\b(a|an|the)\b', ' ', .), white_space_fix = ' '.join(s.split());
//   EM = normalized equality; F1 over the whitespace tokens of the normalized strings with
//   multiset (Counter) overlap, 0 when the overlap is empty; the maximum over the gold answers.
//
// * KorQuAD 1.0: the official evaluate-v1.0.py of https://korquad.github.io/ ("KorQuAD v1.0에 대한
//   공식 평가 스크립트", based on the SQuAD v1.1 script; read at
//   github.com/nakjun/Llama-3.2-1B-Instruct-KorQuAD-Finetune/evaluate-v1.0.py and
//   github.com/nojiyoon/korbert_finetuning/evaluate-v1.0.py, identical in these functions):
//   normalize_answer(s) = white_space_fix(remove_punc(lower(remove_(s)))), where remove_ replaces
//   each of the 12 characters  '  "  《  》  <  >  〈  〉  (  )  ‘  ’
//   (U+0027 U+0022 U+300A U+300B U+003C U+003E U+3008 U+3009 U+0028 U+0029 U+2018 U+2019) by a
//   space, and lower / remove_punc / white_space_fix are SQuAD's. There is NO article removal.
//   Note the ASCII ' " < > ( ) become spaces (split words) while the rest of string.punctuation is
//   deleted (joins words). EM = normalized equality. F1 is over CHARACTERS: the normalized
//   prediction and gold are split on whitespace and the tokens are concatenated into lists of
//   characters (Python code points; whitespace therefore never counts); then
//   Counter overlap, precision = same / #pred chars, recall = same / #gold chars,
//   F1 = 2PR / (P + R), 0 when the overlap is empty; the maximum over the gold answers.
//
// Text handling (both QA metrics): strings are UTF-8. lower() is Python 3.11's str.lower():
// the Unicode 14.0 lowercase mapping of every code point (the full table below, exact for all
// scripts; Hangul and CJK have no case), U+0130 -> "i" U+0307, and U+03A3 (capital sigma) -> U+03C2
// (final sigma) in Python's Final_Sigma context (exact next to Latin/Greek/Cyrillic/Armenian text,
// approximated beyond: see is_cased/is_case_ignorable).
// \b and \w are Python's Unicode ones (\w = letters L*, numbers N*, and '_'); split() splits on
// Python's str.isspace() characters. Bytes that are not well-formed UTF-8 pass through unchanged
// as opaque non-word characters.
#include "metrics/metrics.h"

#include <algorithm>
#include <initializer_list>
#include <iterator>
#include <map>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "text/unicode.h"

namespace nlp {

// ---- accuracy -----------------------------------------------------------------------------------

double accuracy(const std::vector<int32_t>& pred, const std::vector<int32_t>& gold) {
  if (pred.size() != gold.size())
    throw Error(cat("accuracy: ", pred.size(), " predictions for ", gold.size(), " gold labels"));
  if (gold.empty()) throw Error("accuracy: no examples");
  int64_t correct = 0;
  for (size_t i = 0; i < gold.size(); ++i) correct += pred[i] == gold[i];
  return static_cast<double>(correct) / static_cast<double>(gold.size());
}

// ---- seqeval chunking ---------------------------------------------------------------------------

namespace {

struct TagParts {
  std::string_view tag;   // the first character (one code point, as Python's chunk[0])
  std::string_view type;  // chunk[1:].split('-', maxsplit=1)[-1] or '_'
};

TagParts split_tag(const std::string& chunk) {
  if (chunk.empty())
    throw Error("entity tags: empty tag string (expected e.g. \"O\" or \"B-PER\")");
  const std::string_view s(chunk);
  const size_t n = static_cast<size_t>(text::decode_utf8(s, 0).len);
  std::string_view rest = s.substr(n);
  const size_t dash = rest.find('-');
  std::string_view type = dash == std::string_view::npos ? rest : rest.substr(dash + 1);
  if (type.empty()) type = "_";
  return {s.substr(0, n), type};
}

bool is_one_of(std::string_view tag, std::string_view letters) {
  return tag.size() == 1 && letters.find(tag[0]) != std::string_view::npos;
}

bool end_of_chunk(std::string_view prev_tag, std::string_view tag, std::string_view prev_type,
                  std::string_view type) {
  if (is_one_of(prev_tag, "ES")) return true;
  if (is_one_of(prev_tag, "BI") && is_one_of(tag, "BSO")) return true;
  return prev_tag != "O" && prev_tag != "." && prev_type != type;
}

bool start_of_chunk(std::string_view prev_tag, std::string_view tag, std::string_view prev_type,
                    std::string_view type) {
  if (is_one_of(tag, "BS")) return true;
  if (is_one_of(prev_tag, "ESO") && is_one_of(tag, "IE")) return true;
  return tag != "O" && tag != "." && prev_type != type;
}

// seqeval's get_entities loop, one tag at a time. `emit(type, begin, end)` gets each chunk with an
// exclusive end. Views passed to step() must outlive the next step() call.
class Chunker {
 public:
  template <typename Emit>
  void step(std::string_view tag, std::string_view type, int64_t i, Emit&& emit) {
    if (end_of_chunk(prev_tag_, tag, prev_type_, type)) emit(prev_type_, begin_, i);
    if (start_of_chunk(prev_tag_, tag, prev_type_, type)) begin_ = i;
    prev_tag_ = tag;
    prev_type_ = type;
  }

 private:
  std::string_view prev_tag_ = "O", prev_type_ = "";  // seqeval starts with 'O' and ''
  int64_t begin_ = 0;
};

}  // namespace

std::vector<Entity> extract_entities(const std::vector<std::string>& tags) {
  std::vector<Entity> out;
  const auto emit = [&](std::string_view type, int64_t b, int64_t e) {
    out.push_back(Entity{std::string(type), static_cast<int>(b), static_cast<int>(e)});
  };
  Chunker ch;
  int64_t i = 0;
  for (const std::string& t : tags) {
    const TagParts p = split_tag(t);
    ch.step(p.tag, p.type, i++, emit);
  }
  ch.step("O", "_", i, emit);  // seqeval appends an 'O'
  return out;
}

PRF entity_prf(const std::vector<std::vector<std::string>>& gold,
               const std::vector<std::vector<std::string>>& pred) {
  if (gold.size() != pred.size())
    throw Error(cat("entity_prf: ", pred.size(), " predicted sentences for ", gold.size(),
                    " gold sentences"));
  for (size_t s = 0; s < gold.size(); ++s)
    if (gold[s].size() != pred[s].size())
      throw Error(cat("entity_prf: sentence ", s, " has ", pred[s].size(), " predicted tags for ",
                      gold[s].size(), " gold tags"));

  // Positions are over the whole corpus, each sentence followed by an 'O' (seqeval's flattening of
  // nested lists), so (type, begin, end) identifies an entity uniquely.
  using Key = std::tuple<std::string, int64_t, int64_t>;
  const auto collect = [](const std::vector<std::vector<std::string>>& corpus) {
    std::vector<Key> ents;
    const auto emit = [&](std::string_view type, int64_t b, int64_t e) {
      ents.emplace_back(std::string(type), b, e);
    };
    Chunker ch;
    int64_t i = 0;
    for (const auto& sentence : corpus) {
      for (const std::string& t : sentence) {
        const TagParts p = split_tag(t);
        ch.step(p.tag, p.type, i++, emit);
      }
      ch.step("O", "_", i++, emit);
    }
    ch.step("O", "_", i, emit);  // get_entities' own trailing 'O'
    std::sort(ents.begin(), ents.end());
    return ents;
  };
  const std::vector<Key> g = collect(gold), p = collect(pred);
  std::vector<Key> common;
  std::set_intersection(g.begin(), g.end(), p.begin(), p.end(), std::back_inserter(common));

  PRF r;
  r.true_positives = static_cast<int64_t>(common.size());
  r.predicted = static_cast<int64_t>(p.size());
  r.gold = static_cast<int64_t>(g.size());
  const double tp = static_cast<double>(r.true_positives);
  r.precision = r.predicted ? tp / static_cast<double>(r.predicted) : 0.0;
  r.recall = r.gold ? tp / static_cast<double>(r.gold) : 0.0;
  const double denom = r.precision + r.recall;
  r.f1 = denom == 0.0 ? 0.0 : 2.0 * r.precision * r.recall / denom;  // seqeval's operation order
  return r;
}

// ---- Python-compatible text primitives ----------------------------------------------------------

namespace {

using U32 = std::u32string;

// Bytes that are not well-formed UTF-8 travel as U+DC80..U+DCFF (Python's surrogateescape), which
// are neither letters, digits, spaces nor punctuation, and are written back as the original byte.
constexpr char32_t kEscapeBase = 0xDC00;

U32 decode(const std::string& s) {
  U32 out;
  out.reserve(s.size());
  for (size_t off = 0; off < s.size();) {
    const text::Decoded d = text::decode_utf8(s, off);
    out.push_back(d.cp == text::kInvalidCodePoint ? kEscapeBase + static_cast<unsigned char>(s[off])
                                                  : d.cp);
    off += static_cast<size_t>(d.len);
  }
  return out;
}

void encode_append(std::string& out, char32_t cp) {
  if (cp >= kEscapeBase + 0x80 && cp <= kEscapeBase + 0xFF)
    out.push_back(static_cast<char>(cp - kEscapeBase));
  else
    text::append_utf8(out, cp);
}

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs.
bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// string.punctuation: !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
bool is_ascii_punct(char32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
         (c >= 0x7B && c <= 0x7E);
}

// Python 3 re's Unicode \w: str.isalnum() (general category L* or N*) or '_'.
bool is_py_word(char32_t c) {
  if (c == U'_') return true;
  const text::CharClass k = text::char_class(c);
  return k == text::CharClass::Letter || k == text::CharClass::Number;
}

// Every code point c whose lowercase is one code point other than c, as runs: c = first + k*stride
// (0 <= k < count) maps to c + delta. Python 3.11 str.lower(), Unicode 14.0; printed by
// `python3 tests/python/metrics_reference.py --lower-table` and checked code point by code point
// by the unit test. (U+0130 lower-cases to two code points and is handled separately.)
struct LowerRun {
  char32_t first;
  int32_t count, stride, delta;
};
// clang-format off
constexpr LowerRun kLowerRuns[] = {
    {0x41, 26, 1, 32}, {0xC0, 23, 1, 32}, {0xD8, 7, 1, 32}, {0x100, 24, 2, 1}, {0x132, 3, 2, 1},
    {0x139, 8, 2, 1}, {0x14A, 23, 2, 1}, {0x178, 1, 1, -121}, {0x179, 3, 2, 1}, {0x181, 1, 1, 210},
    {0x182, 2, 2, 1}, {0x186, 1, 1, 206}, {0x187, 1, 1, 1}, {0x189, 2, 1, 205}, {0x18B, 1, 1, 1},
    {0x18E, 1, 1, 79}, {0x18F, 1, 1, 202}, {0x190, 1, 1, 203}, {0x191, 1, 1, 1}, {0x193, 1, 1, 205},
    {0x194, 1, 1, 207}, {0x196, 1, 1, 211}, {0x197, 1, 1, 209}, {0x198, 1, 1, 1},
    {0x19C, 1, 1, 211}, {0x19D, 1, 1, 213}, {0x19F, 1, 1, 214}, {0x1A0, 3, 2, 1},
    {0x1A6, 1, 1, 218}, {0x1A7, 1, 1, 1}, {0x1A9, 1, 1, 218}, {0x1AC, 1, 1, 1}, {0x1AE, 1, 1, 218},
    {0x1AF, 1, 1, 1}, {0x1B1, 2, 1, 217}, {0x1B3, 2, 2, 1}, {0x1B7, 1, 1, 219}, {0x1B8, 1, 1, 1},
    {0x1BC, 1, 1, 1}, {0x1C4, 1, 1, 2}, {0x1C5, 1, 1, 1}, {0x1C7, 1, 1, 2}, {0x1C8, 1, 1, 1},
    {0x1CA, 1, 1, 2}, {0x1CB, 9, 2, 1}, {0x1DE, 9, 2, 1}, {0x1F1, 1, 1, 2}, {0x1F2, 2, 2, 1},
    {0x1F6, 1, 1, -97}, {0x1F7, 1, 1, -56}, {0x1F8, 20, 2, 1}, {0x220, 1, 1, -130},
    {0x222, 9, 2, 1}, {0x23A, 1, 1, 10795}, {0x23B, 1, 1, 1}, {0x23D, 1, 1, -163},
    {0x23E, 1, 1, 10792}, {0x241, 1, 1, 1}, {0x243, 1, 1, -195}, {0x244, 1, 1, 69},
    {0x245, 1, 1, 71}, {0x246, 5, 2, 1}, {0x370, 2, 2, 1}, {0x376, 1, 1, 1}, {0x37F, 1, 1, 116},
    {0x386, 1, 1, 38}, {0x388, 3, 1, 37}, {0x38C, 1, 1, 64}, {0x38E, 2, 1, 63}, {0x391, 17, 1, 32},
    {0x3A3, 9, 1, 32}, {0x3CF, 1, 1, 8}, {0x3D8, 12, 2, 1}, {0x3F4, 1, 1, -60}, {0x3F7, 1, 1, 1},
    {0x3F9, 1, 1, -7}, {0x3FA, 1, 1, 1}, {0x3FD, 3, 1, -130}, {0x400, 16, 1, 80},
    {0x410, 32, 1, 32}, {0x460, 17, 2, 1}, {0x48A, 27, 2, 1}, {0x4C0, 1, 1, 15}, {0x4C1, 7, 2, 1},
    {0x4D0, 48, 2, 1}, {0x531, 38, 1, 48}, {0x10A0, 38, 1, 7264}, {0x10C7, 1, 1, 7264},
    {0x10CD, 1, 1, 7264}, {0x13A0, 80, 1, 38864}, {0x13F0, 6, 1, 8}, {0x1C90, 43, 1, -3008},
    {0x1CBD, 3, 1, -3008}, {0x1E00, 75, 2, 1}, {0x1E9E, 1, 1, -7615}, {0x1EA0, 48, 2, 1},
    {0x1F08, 8, 1, -8}, {0x1F18, 6, 1, -8}, {0x1F28, 8, 1, -8}, {0x1F38, 8, 1, -8},
    {0x1F48, 6, 1, -8}, {0x1F59, 4, 2, -8}, {0x1F68, 8, 1, -8}, {0x1F88, 8, 1, -8},
    {0x1F98, 8, 1, -8}, {0x1FA8, 8, 1, -8}, {0x1FB8, 2, 1, -8}, {0x1FBA, 2, 1, -74},
    {0x1FBC, 1, 1, -9}, {0x1FC8, 4, 1, -86}, {0x1FCC, 1, 1, -9}, {0x1FD8, 2, 1, -8},
    {0x1FDA, 2, 1, -100}, {0x1FE8, 2, 1, -8}, {0x1FEA, 2, 1, -112}, {0x1FEC, 1, 1, -7},
    {0x1FF8, 2, 1, -128}, {0x1FFA, 2, 1, -126}, {0x1FFC, 1, 1, -9}, {0x2126, 1, 1, -7517},
    {0x212A, 1, 1, -8383}, {0x212B, 1, 1, -8262}, {0x2132, 1, 1, 28}, {0x2160, 16, 1, 16},
    {0x2183, 1, 1, 1}, {0x24B6, 26, 1, 26}, {0x2C00, 48, 1, 48}, {0x2C60, 1, 1, 1},
    {0x2C62, 1, 1, -10743}, {0x2C63, 1, 1, -3814}, {0x2C64, 1, 1, -10727}, {0x2C67, 3, 2, 1},
    {0x2C6D, 1, 1, -10780}, {0x2C6E, 1, 1, -10749}, {0x2C6F, 1, 1, -10783}, {0x2C70, 1, 1, -10782},
    {0x2C72, 1, 1, 1}, {0x2C75, 1, 1, 1}, {0x2C7E, 2, 1, -10815}, {0x2C80, 50, 2, 1},
    {0x2CEB, 2, 2, 1}, {0x2CF2, 1, 1, 1}, {0xA640, 23, 2, 1}, {0xA680, 14, 2, 1}, {0xA722, 7, 2, 1},
    {0xA732, 31, 2, 1}, {0xA779, 2, 2, 1}, {0xA77D, 1, 1, -35332}, {0xA77E, 5, 2, 1},
    {0xA78B, 1, 1, 1}, {0xA78D, 1, 1, -42280}, {0xA790, 2, 2, 1}, {0xA796, 10, 2, 1},
    {0xA7AA, 1, 1, -42308}, {0xA7AB, 1, 1, -42319}, {0xA7AC, 1, 1, -42315}, {0xA7AD, 1, 1, -42305},
    {0xA7AE, 1, 1, -42308}, {0xA7B0, 1, 1, -42258}, {0xA7B1, 1, 1, -42282}, {0xA7B2, 1, 1, -42261},
    {0xA7B3, 1, 1, 928}, {0xA7B4, 8, 2, 1}, {0xA7C4, 1, 1, -48}, {0xA7C5, 1, 1, -42307},
    {0xA7C6, 1, 1, -35384}, {0xA7C7, 2, 2, 1}, {0xA7D0, 1, 1, 1}, {0xA7D6, 2, 2, 1},
    {0xA7F5, 1, 1, 1}, {0xFF21, 26, 1, 32}, {0x10400, 40, 1, 40}, {0x104B0, 36, 1, 40},
    {0x10570, 11, 1, 39}, {0x1057C, 15, 1, 39}, {0x1058C, 7, 1, 39}, {0x10594, 2, 1, 39},
    {0x10C80, 51, 1, 64}, {0x118A0, 32, 1, 32}, {0x16E40, 32, 1, 32}, {0x1E900, 34, 1, 34},
};
// clang-format on

// Index into kLowerRuns of the run holding c, or -1.
int lower_run_of(char32_t c) {
  const auto it = std::upper_bound(std::begin(kLowerRuns), std::end(kLowerRuns), c,
                                   [](char32_t v, const LowerRun& r) { return v < r.first; });
  if (it == std::begin(kLowerRuns)) return -1;
  const LowerRun& r = *std::prev(it);
  const char32_t off = c - r.first;
  if (off % static_cast<char32_t>(r.stride) != 0 ||
      off / static_cast<char32_t>(r.stride) >= static_cast<char32_t>(r.count))
    return -1;
  return static_cast<int>(std::prev(it) - std::begin(kLowerRuns));
}

char32_t simple_lower(char32_t c) {
  if (c < 0x80) return (c >= U'A' && c <= U'Z') ? c + 32 : c;
  const int k = lower_run_of(c);
  return k < 0 ? c : static_cast<char32_t>(static_cast<int32_t>(c) + kLowerRuns[k].delta);
}

// Final_Sigma context of Python's lower(): Σ becomes ς when preceded by a cased letter and not
// followed by one, skipping case-ignorable characters on both sides. Python uses the Unicode
// Cased and Case_Ignorable properties; these two predicates approximate them. They agree with
// Python for every code point below U+2100 as a neighbour of Σ (cased or not) and below U+0590 as
// a character between Σ and a letter (ignorable or not), i.e. for Latin, Greek, Cyrillic,
// Armenian, IPA and combining diacritics (the unit test checks these ranges exhaustively).
// Elsewhere they can differ: marks of other scripts (Hebrew points, Arabic harakat, ...) are not
// treated as ignorable, and some letter-like symbols (U+2102 ℂ, ...) are not treated as cased;
// this only matters for a capital sigma next to such characters.
bool is_lower_image(char32_t c) {
  for (const LowerRun& r : kLowerRuns) {
    const int64_t base = static_cast<int64_t>(r.first) + r.delta;
    const int64_t off = static_cast<int64_t>(c) - base;
    if (off >= 0 && off % r.stride == 0 && off / r.stride < r.count) return true;
  }
  return false;
}

bool in_ranges(char32_t c, std::initializer_list<std::pair<char32_t, char32_t>> ranges) {
  for (const auto& [lo, hi] : ranges)
    if (c >= lo && c <= hi) return true;
  return false;
}

bool is_case_ignorable(char32_t c) {
  return in_ranges(
      c,
      {{0x27, 0x27},     {0x2E, 0x2E},     {0x3A, 0x3A},     {0x5E, 0x5E},     {0x60, 0x60},
       {0xA8, 0xA8},     {0xAD, 0xAD},     {0xAF, 0xAF},     {0xB4, 0xB4},     {0xB7, 0xB8},
       {0x2B0, 0x36F},   {0x374, 0x375},   {0x37A, 0x37A},   {0x384, 0x385},   {0x387, 0x387},
       {0x483, 0x489},   {0x559, 0x559},   {0x55F, 0x55F},   {0x1AB0, 0x1AFF}, {0x1D2C, 0x1D6A},
       {0x1D78, 0x1D78}, {0x1D9B, 0x1DFF}, {0x1FBD, 0x1FBD}, {0x1FBF, 0x1FC1}, {0x1FCD, 0x1FCF},
       {0x1FDD, 0x1FDF}, {0x1FED, 0x1FEF}, {0x1FFD, 0x1FFE}, {0x200B, 0x200F}, {0x2018, 0x2019},
       {0x2024, 0x2024}, {0x2027, 0x2027}, {0x202A, 0x202E}, {0x2060, 0x2064}, {0x2066, 0x206F},
       {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x20D0, 0x20F0}, {0xFE00, 0xFE0F},
       {0xFE13, 0xFE13}, {0xFE20, 0xFE2F}, {0xFE52, 0xFE52}, {0xFE55, 0xFE55}, {0xFEFF, 0xFEFF},
       {0xFF07, 0xFF07}, {0xFF0E, 0xFF0E}, {0xFF1A, 0xFF1A}, {0xFF3E, 0xFF3E}, {0xFF40, 0xFF40}});
}

bool is_cased(char32_t c) {
  if ((c >= U'A' && c <= U'Z') || (c >= U'a' && c <= U'z')) return true;
  if (c < 0x80) return false;
  if (lower_run_of(c) >= 0 || is_lower_image(c)) return true;
  // Lowercase letters without an uppercase partner in the simple mapping.
  if (in_ranges(c, {{0xAA, 0xAA},     {0xB5, 0xB5},     {0xBA, 0xBA},     {0xDF, 0xDF},
                    {0x130, 0x131},   {0x138, 0x138},   {0x149, 0x149},   {0x17F, 0x17F},
                    {0x18D, 0x18D},   {0x19B, 0x19B},   {0x1AA, 0x1AB},   {0x1BA, 0x1BA},
                    {0x1BE, 0x1BE},   {0x1F0, 0x1F0},   {0x221, 0x221},   {0x234, 0x239},
                    {0x250, 0x293},   {0x295, 0x2AF},   {0x390, 0x390},   {0x3B0, 0x3B0},
                    {0x3C2, 0x3C2},   {0x3D0, 0x3D6},   {0x3F0, 0x3F5},   {0x3FC, 0x3FC},
                    {0x560, 0x560},   {0x587, 0x588},   {0x1C80, 0x1C88}, {0x1D00, 0x1D2B},
                    {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E96, 0x1E9D}, {0x1E9F, 0x1E9F}}))
    return true;
  // Greek Extended and the mathematical alphanumeric letters are all cased.
  if (in_ranges(c, {{0x1F00, 0x1FFF}, {0x1D400, 0x1D7CB}}))
    return text::char_class(c) == text::CharClass::Letter;
  return false;
}

bool final_sigma_context(const U32& s, size_t i) {
  size_t j = i;
  while (j > 0 && is_case_ignorable(s[j - 1])) --j;
  if (j == 0 || !is_cased(s[j - 1])) return false;
  size_t k = i + 1;
  while (k < s.size() && is_case_ignorable(s[k])) ++k;
  return k == s.size() || !is_cased(s[k]);
}

// Python's str.lower().
U32 py_lower(const U32& s) {
  U32 out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
      out.push_back(U'i');
      out.push_back(0x307);
    } else if (c == 0x3A3) {
      out.push_back(final_sigma_context(s, i) ? 0x3C2 : 0x3C3);
    } else {
      out.push_back(simple_lower(c));
    }
  }
  return out;
}

U32 remove_ascii_punct(const U32& s) {
  U32 out;
  out.reserve(s.size());
  for (char32_t c : s)
    if (!is_ascii_punct(c)) out.push_back(c);
  return out;
}

// re.sub(r'\b(a|an|the)\b', ' ', s): a match is exactly a maximal run of \w characters equal to
// "a", "an" or "the".
U32 remove_articles(const U32& s) {
  U32 out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (!is_py_word(s[i])) {
      out.push_back(s[i++]);
      continue;
    }
    size_t j = i;
    while (j < s.size() && is_py_word(s[j])) ++j;
    const std::u32string_view run(s.data() + i, j - i);
    if (run == U"a" || run == U"an" || run == U"the")
      out.push_back(U' ');
    else
      out.append(run);
    i = j;
  }
  return out;
}

// s.split() of Python (no argument).
std::vector<U32> py_split(const U32& s) {
  std::vector<U32> toks;
  for (size_t i = 0; i < s.size();) {
    if (is_py_space(s[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && !is_py_space(s[j])) ++j;
    toks.emplace_back(s, i, j - i);
    i = j;
  }
  return toks;
}

std::string join_tokens(const std::vector<U32>& toks) {
  std::string out;
  for (size_t k = 0; k < toks.size(); ++k) {
    if (k) out.push_back(' ');
    for (char32_t c : toks[k]) encode_append(out, c);
  }
  return out;
}

std::vector<U32> squad_tokens(const std::string& s) {
  return py_split(remove_articles(remove_ascii_punct(py_lower(decode(s)))));
}

std::vector<U32> korquad_tokens(const std::string& s) {
  U32 t = decode(s);
  for (char32_t& c : t)  // remove_(): these become spaces (before lower-casing)
    if (c == U'\'' || c == U'"' || c == U'《' || c == U'》' || c == U'<' || c == U'>' ||
        c == U'〈' || c == U'〉' || c == U'(' || c == U')' || c == U'‘' || c == U'’')
      c = U' ';
  return py_split(remove_ascii_punct(py_lower(t)));
}

// Official F1 of one pair from the multiset overlap: 0 when nothing is shared.
template <typename T>
double overlap_f1(const std::vector<T>& pred, const std::vector<T>& gold) {
  std::map<T, int64_t> counts;
  for (const T& t : gold) ++counts[t];
  int64_t same = 0;
  for (const T& t : pred) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = 1.0 * static_cast<double>(same) / static_cast<double>(pred.size());
  const double recall = 1.0 * static_cast<double>(same) / static_cast<double>(gold.size());
  return (2 * precision * recall) / (precision + recall);
}

std::vector<char32_t> chars_of(const std::vector<U32>& toks) {
  std::vector<char32_t> out;
  for (const U32& t : toks) out.insert(out.end(), t.begin(), t.end());
  return out;
}

void require_golds(const char* fn, const std::vector<std::string>& golds) {
  if (golds.empty()) throw Error(cat(fn, ": no gold answers"));
}

// 1 when the prediction's units (units(answer): normalised tokens) equal some gold answer's, else 0.
template <typename Units>
double best_exact_match(const char* fn, const std::string& pred, const std::vector<std::string>& golds,
                        Units units) {
  require_golds(fn, golds);
  const auto p = units(pred);
  for (const std::string& g : golds)
    if (units(g) == p) return 1.0;
  return 0.0;
}

// The best overlap F1 of the prediction against the gold answers, over units(answer).
template <typename Units>
double best_f1(const char* fn, const std::string& pred, const std::vector<std::string>& golds, Units units) {
  require_golds(fn, golds);
  const auto p = units(pred);
  double best = 0.0;
  for (const std::string& g : golds) best = std::max(best, overlap_f1(p, units(g)));
  return best;
}

}  // namespace

// ---- SQuAD v1.1 ---------------------------------------------------------------------------------

std::string squad_normalize(const std::string& s) { return join_tokens(squad_tokens(s)); }

double squad_exact_match(const std::string& pred, const std::vector<std::string>& golds) {
  return best_exact_match("squad_exact_match", pred, golds, squad_tokens);
}

double squad_f1(const std::string& pred, const std::vector<std::string>& golds) {
  return best_f1("squad_f1", pred, golds, squad_tokens);
}

// ---- KorQuAD 1.0 --------------------------------------------------------------------------------

double korquad_exact_match(const std::string& pred, const std::vector<std::string>& golds) {
  return best_exact_match("korquad_exact_match", pred, golds, korquad_tokens);
}

double korquad_f1(const std::string& pred, const std::vector<std::string>& golds) {  // over characters
  return best_f1("korquad_f1", pred, golds, [](const std::string& s) { return chars_of(korquad_tokens(s)); });
}

}  // namespace nlp
