// Evaluation metrics against their reference implementations: seqeval (entity chunks, micro
// P/R/F1), the official SQuAD v1.1 and KorQuAD 1.0 evaluation functions, and Python's str.lower().
// The expected values come from running tests/python/metrics_reference.py (python3 + seqeval) on
// the same cases; those tests skip when python3 or seqeval is missing. A few values are also pinned
// here (they were produced by the same references) so that the basics are covered without Python.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "metrics/metrics.h"
#include "text/unicode.h"

namespace fs = std::filesystem;
using Sentences = std::vector<std::vector<std::string>>;
using Tags = std::vector<std::string>;

namespace {

// ---- talking to the reference script ------------------------------------------------------------

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o += buf;
    } else {
      o += static_cast<char>(c);  // UTF-8 passes through
    }
  }
  return o + "\"";
}

std::string json_list(const std::vector<std::string>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) o += ',';
    o += json_str(v[i]);
  }
  return o + "]";
}

std::string json_corpus(const Sentences& c) {
  std::string o = "[";
  for (size_t i = 0; i < c.size(); ++i) {
    if (i) o += ',';
    o += json_list(c[i]);
  }
  return o + "]";
}

std::string unhex(const std::string& h) {
  if (h == "-") return "";
  std::string s;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    s.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return s;
}

std::string script_path() {
  const char* env = std::getenv("NLPTRAIN_SOURCE_DIR");
  if (env && *env) return (fs::path(env) / "tests" / "python" / "metrics_reference.py").string();
  return (fs::path(__FILE__).parent_path().parent_path() / "python" / "metrics_reference.py")
      .string();
}

// Answers keyed by "<kind> <index>" (or "lowerall <cp>"), each the remaining fields of its line.
using Answers = std::map<std::string, std::vector<std::string>>;

// Runs the reference script on a JSON request. Returns false with *why when python3, seqeval or the
// script is unavailable (the caller skips); a failing script is a test failure.
bool run_reference(const std::string& request, Answers* out, std::string* why) {
  if (!fs::exists(script_path())) {
    *why = "reference script not found at " + script_path();
    return false;
  }
  char dir_tmpl[] = "/tmp/nlptrain_metrics_XXXXXX";
  if (!mkdtemp(dir_tmpl)) {
    ADD_FAILURE() << "mkdtemp failed";
    *why = "mkdtemp failed";
    return false;
  }
  const fs::path dir(dir_tmpl);
  { std::ofstream(dir / "req.json", std::ios::binary) << request; }
  const std::string cmd = "python3 '" + script_path() + "' < '" + (dir / "req.json").string() +
                          "' > '" + (dir / "ans.txt").string() + "' 2> '" +
                          (dir / "err.txt").string() + "'";
  const int st = std::system(cmd.c_str());
  const int rc = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  std::ifstream ans(dir / "ans.txt", std::ios::binary), err(dir / "err.txt");
  std::stringstream errs;
  errs << err.rdbuf();
  bool ok = false;
  if (rc == 77) {
    *why = "python3 package 'seqeval' is not installed (pip install seqeval)";
  } else if (rc == 127) {
    *why = "python3 not found";
  } else if (rc != 0) {
    ADD_FAILURE() << "reference script failed (rc " << rc << "):\n" << errs.str();
    *why = "reference script failed";
  } else {
    std::string line;
    while (std::getline(ans, line)) {
      std::istringstream is(line);
      std::string kind, idx, f;
      if (!(is >> kind >> idx)) continue;
      std::vector<std::string> fields;
      while (is >> f) fields.push_back(f);
      (*out)[kind + " " + idx] = std::move(fields);
    }
    ok = true;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return ok;
}

double num(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

// ---- the cases ----------------------------------------------------------------------------------

const std::vector<Tags> kTagCases = {
    {"B-PER", "I-PER", "O", "B-LOC"},
    {"I-PER", "I-PER", "O"},                // I- without B- starts an entity
    {"O", "I-PER", "O", "I-LOC", "I-LOC"},  // IOB1 style
    {"B-PER", "I-PER", "B-PER"},            // adjacent entities of the same type
    {"O", "O", "B-PER", "I-PER"},           // entity at the sentence end
    {"B-PER"},                              // single-token sentence
    {"B-PER", "I-LOC", "I-LOC"},            // type change inside
    {"B-PER", "I-PER", "I-ORG", "B-ORG"},
    {"S-PER", "B-LOC", "I-LOC", "E-LOC", "O", "S-ORG", "E-ORG"},  // IOBES
    {"B-PER", "E-PER", "E-PER", "I-PER", "S-PER", "I-PER"},
    {"E-PER", "I-PER", "O", "E-LOC"},
    {"B", "I", "O", "I", "B"},  // no type
    {"B-", "I-", "O"},
    {"X", "B-PER", "X-PER", "O", "X"},  // not NE tags (seqeval warns, still chunks)
    {"B-PER", ".", "I-PER", "O-PER", "I-PER"},
    {"B-PER-X", "I-PER-X", "I-PER"},  // type is everything after the first '-'
    {"BPER", "IPER", "O"},
    {"B-인물", "I-인물", "O", "B-장소", "I-기관"},  // UTF-8 types
    {"O", "O", "O"},
    {},
};

struct PrfCase {
  Sentences gold, pred;
};

const std::vector<PrfCase> kPrfCases = {
    // seqeval's docstring example
    {{{"O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"}, {"B-PER", "I-PER", "O"}},
     {{"O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"}, {"B-PER", "I-PER", "O"}}},
    // a multi-sentence corpus with boundary errors, type errors, IOB1 predictions, empty sentences
    {{{"B-PER", "I-PER", "O", "B-LOC", "O"},
      {"O", "B-ORG", "I-ORG", "I-ORG"},
      {},
      {"B-PER", "B-PER", "O", "B-MISC"},
      {"B-LOC", "I-LOC", "I-LOC", "O", "B-PER", "I-PER"},
      {"O", "O", "O"}},
     {{"B-PER", "I-PER", "O", "B-ORG", "O"},
      {"O", "B-ORG", "I-ORG", "O"},
      {},
      {"B-PER", "I-PER", "O", "I-MISC"},
      {"I-LOC", "I-LOC", "I-LOC", "O", "B-PER", "I-LOC"},
      {"B-PER", "O", "I-PER"}}},
    // entities at the end of one sentence and the start of the next stay apart
    {{{"O", "B-PER"}, {"I-PER", "O"}}, {{"O", "B-PER"}, {"B-PER", "O"}}},
    // empty predictions: precision 0 (zero_division), recall 0
    {{{"B-PER", "I-PER", "O"}, {"B-LOC"}}, {{"O", "O", "O"}, {"O"}}},
    // no gold entities, some predicted
    {{{"O", "O"}, {"O"}}, {{"B-PER", "O"}, {"I-LOC"}}},
    // nothing anywhere
    {{{"O", "O"}, {"O"}}, {{"O", "O"}, {"O"}}},
    // perfect
    {{{"B-PER", "I-PER"}, {"S-LOC", "O", "B-ORG", "E-ORG"}},
     {{"B-PER", "I-PER"}, {"S-LOC", "O", "B-ORG", "E-ORG"}}},
    // odd tags across sentence boundaries (seqeval's flattening decides)
    {{{"B-PER", "X"}, {"X", "B-LOC"}, {"I-PER"}}, {{"B-PER", "X"}, {"X", "B-LOC"}, {"X-PER"}}},
    {{{"B-PER", "O"}, {"X", "B-LOC"}}, {{"O", "B-PER"}, {"X", "B-LOC"}}},
    // sentences of only empty lists
    {{{}, {}}, {{}, {}}},
};

struct QaCase {
  std::string pred;
  std::vector<std::string> golds;
};

const std::vector<QaCase> kSquadCases = {
    {"Barack Obama", {"barack obama"}},
    {"the Eiffel Tower!", {"Eiffel Tower"}},
    {"  a  cat,  an\tapple\n", {"cat apple"}},
    {"The", {"the"}},     // both normalize to "": EM 1, F1 0
    {"", {"something"}},  // empty prediction
    {"", {""}},
    {"Obama", {"Barack Obama", "President Obama", "Obama"}},
    {"President Barack Obama", {"Barack Obama", "the president"}},
    {"don't stop", {"dont stop"}},
    {"U.S.A.", {"usa"}},
    {"an-apple", {"apple"}},  // '-' is deleted: "anapple"
    {"theater the THE tHe", {"theater"}},
    {"a_b an_ _the_", {"ab an the"}},
    {"cat cat dog", {"cat dog dog"}},  // Counter overlap
    {"1,000 (approx.)", {"1000 approx"}},
    {"New\x1cYork\x0b City", {"new york city"}},  // Python isspace() separators
    {"A\xc2\xa0"
     "B\xe3\x80\x80"
     "C",
     {"b c"}},  // NBSP, ideographic space
    {"x\xe2\x80\x8b"
     "a\xe2\x80\x8b"
     "y",
     {"x y"}},  // U+200B is not \w: "a" is an article
    {"à a été", {"à été"}},
    {"éa theé", {"éa"}},  // no word boundary inside "éa", "theé"
    {"ÁNGEL ÉCOLE", {"ángel école"}},
    {"ΟΔΟΣ", {"οδος"}},  // final sigma
    {"ΣΟΦΙΑ", {"σοφια"}},
    {"МОСКВА", {"москва"}},
    {"İstanbul", {"istanbul", "i\u0307stanbul"}},  // İ -> i + U+0307
    {"ＴＨＥ cat", {"cat"}},                       // fullwidth "the" is not an article
    {"Ⅰ ⓐ", {"ⅰ ⓐ"}},                              // cased symbols
    {"가나 a 한글", {"가나 한글"}},
    {"세종대왕은", {"세종대왕"}},
    {"“quoted”", {"quoted"}},  // curly quotes are not string.punctuation
};

const std::vector<QaCase> kKorquadCases = {
    {"세종대왕은", {"세종대왕"}},  // particle: character F1 8/9
    {"《훈민정음》", {"훈민정음"}},
    {"'한글'", {"한글"}},
    {"〈조선왕조실록〉의", {"조선왕조실록"}},
    {"‘서울’", {"서울"}},
    {"“인용”", {"인용"}},    // U+201C/D are not removed
    {"「서울」", {"서울"}},  // nor corner brackets
    {"서울, 부산", {"서울 부산"}},
    {"세종 대왕", {"세종대왕"}},  // spaces do not count in F1
    {"1443년", {"1443년에", "1443"}},
    {"BTS(방탄소년단)", {"방탄소년단", "BTS"}},
    {"The Beatles", {"beatles"}},  // no article removal
    {"don't", {"don t"}},          // ' becomes a space
    {"A(B)C", {"a b c"}},
    {"12.5%의 성장", {"125의 성장"}},
    {"가가가나", {"가나나"}},  // Counter overlap over characters
    {"", {"서울"}},
    {"", {""}},
    {"서울특별시", {"부산", "서울", "서울특별시청"}},  // multiple golds
    {"Ⅸ세기 ÉCOLE 대학교", {"ⅸ세기 école 대학교"}},
    {"약 3,000 km²", {"3000km²"}},
    {"<b>이순신</b> 장군", {"이순신 장군"}},
};

std::string qa_request(const char* key, const std::vector<QaCase>& cases) {
  std::string o = std::string("\"") + key + "\":[";
  for (size_t i = 0; i < cases.size(); ++i)
    o += std::string(i ? "," : "") + "{\"pred\":" + json_str(cases[i].pred) +
         ",\"golds\":" + json_list(cases[i].golds) + "}";
  return o + "]";
}

#define NEED_REFERENCE(request, answers)           \
  Answers answers;                                 \
  {                                                \
    std::string why;                               \
    if (!run_reference(request, &answers, &why)) { \
      if (::testing::Test::HasFailure()) return;   \
      GTEST_SKIP() << why;                         \
    }                                              \
  }

}  // namespace

// ---- accuracy -----------------------------------------------------------------------------------

TEST(Accuracy, Basics) {
  EXPECT_EQ(nlp::accuracy({1, 2, 3, 4}, {1, 2, 0, 4}), 0.75);
  EXPECT_EQ(nlp::accuracy({0}, {0}), 1.0);
  EXPECT_EQ(nlp::accuracy({1, 1, 1}, {0, 0, 0}), 0.0);
  EXPECT_EQ(nlp::accuracy({5, -1, 2}, {5, -1, 3}), 2.0 / 3.0);
}

TEST(Accuracy, SizeMismatchAndEmptyThrow) {
  EXPECT_THROW(nlp::accuracy({1, 2}, {1}), nlp::Error);
  EXPECT_THROW(nlp::accuracy({}, {1}), nlp::Error);
  EXPECT_THROW(nlp::accuracy({}, {}), nlp::Error);
}

// ---- entities -----------------------------------------------------------------------------------

TEST(Entities, PinnedSeqevalBehaviour) {
  using E = nlp::Entity;
  EXPECT_EQ(nlp::extract_entities({"B-PER", "I-PER", "O", "B-LOC"}),
            (std::vector<E>{{"PER", 0, 2}, {"LOC", 3, 4}}));
  EXPECT_EQ(nlp::extract_entities({"O", "I-PER", "I-PER"}), (std::vector<E>{{"PER", 1, 3}}));
  EXPECT_EQ(nlp::extract_entities({"B-PER", "I-PER", "B-PER"}),
            (std::vector<E>{{"PER", 0, 2}, {"PER", 2, 3}}));
  EXPECT_EQ(nlp::extract_entities({"B-PER", "I-LOC"}),
            (std::vector<E>{{"PER", 0, 1}, {"LOC", 1, 2}}));
  EXPECT_EQ(nlp::extract_entities({"S-PER", "B-LOC", "E-LOC"}),
            (std::vector<E>{{"PER", 0, 1}, {"LOC", 1, 3}}));
  EXPECT_TRUE(nlp::extract_entities({}).empty());
  EXPECT_THROW(nlp::extract_entities({"O", ""}), nlp::Error);
}

TEST(Entities, MatchSeqevalGetEntities) {
  std::string req = "{\"entities\":[";
  for (size_t i = 0; i < kTagCases.size(); ++i) {
    if (i) req += ',';
    req += json_list(kTagCases[i]);
  }
  req += "]}";
  NEED_REFERENCE(req, ans);
  for (size_t k = 0; k < kTagCases.size(); ++k) {
    SCOPED_TRACE("tag case " + std::to_string(k));
    const auto it = ans.find("entities " + std::to_string(k));
    ASSERT_NE(it, ans.end());
    const std::vector<std::string>& f = it->second;
    std::vector<nlp::Entity> want;
    const size_t n = std::stoul(f.at(0));
    ASSERT_EQ(f.size(), 1 + 3 * n);
    for (size_t j = 0; j < n; ++j)
      want.push_back({unhex(f[1 + 3 * j]), std::stoi(f[2 + 3 * j]), std::stoi(f[3 + 3 * j])});
    const std::vector<nlp::Entity> got = nlp::extract_entities(kTagCases[k]);
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < n; ++j) {
      EXPECT_EQ(got[j].type, want[j].type) << "entity " << j;
      EXPECT_EQ(got[j].begin, want[j].begin) << "entity " << j;
      EXPECT_EQ(got[j].end, want[j].end) << "entity " << j;
    }
  }
}

TEST(EntityPrf, PinnedSeqevalValues) {
  // seqeval docstring example: 0.5 / 0.5 / 0.5
  const nlp::PRF a = nlp::entity_prf(kPrfCases[0].gold, kPrfCases[0].pred);
  EXPECT_EQ(a.precision, 0.5);
  EXPECT_EQ(a.recall, 0.5);
  EXPECT_EQ(a.f1, 0.5);
  EXPECT_EQ(a.true_positives, 1);
  EXPECT_EQ(a.predicted, 2);
  EXPECT_EQ(a.gold, 2);
  // nothing predicted: precision 0 (seqeval's zero_division="warn"), recall 0, F1 0
  const nlp::PRF b = nlp::entity_prf({{"B-PER", "I-PER", "O"}}, {{"O", "O", "O"}});
  EXPECT_EQ(b.precision, 0.0);
  EXPECT_EQ(b.recall, 0.0);
  EXPECT_EQ(b.f1, 0.0);
  EXPECT_EQ(b.gold, 1);
  EXPECT_EQ(b.predicted, 0);
  const nlp::PRF c = nlp::entity_prf({}, {});
  EXPECT_EQ(c.f1, 0.0);
  EXPECT_EQ(c.gold, 0);
}

TEST(EntityPrf, SizeMismatchThrows) {
  EXPECT_THROW(nlp::entity_prf({{"O"}}, {{"O"}, {"O"}}), nlp::Error);
  EXPECT_THROW(nlp::entity_prf({{"O", "B-PER"}}, {{"O"}}), nlp::Error);
  EXPECT_THROW(nlp::entity_prf({{"O"}}, {{""}}), nlp::Error);
}

TEST(EntityPrf, MatchSeqevalScores) {
  std::string req = "{\"prf\":[";
  for (size_t i = 0; i < kPrfCases.size(); ++i)
    req += std::string(i ? "," : "") + "{\"gold\":" + json_corpus(kPrfCases[i].gold) +
           ",\"pred\":" + json_corpus(kPrfCases[i].pred) + "}";
  req += "]}";
  NEED_REFERENCE(req, ans);
  for (size_t k = 0; k < kPrfCases.size(); ++k) {
    SCOPED_TRACE("prf case " + std::to_string(k));
    const auto it = ans.find("prf " + std::to_string(k));
    ASSERT_NE(it, ans.end());
    const std::vector<std::string>& f = it->second;
    ASSERT_EQ(f.size(), 6u);
    const nlp::PRF r = nlp::entity_prf(kPrfCases[k].gold, kPrfCases[k].pred);
    EXPECT_EQ(r.precision, num(f[0]));  // same operations as seqeval: bit-identical
    EXPECT_EQ(r.recall, num(f[1]));
    EXPECT_EQ(r.f1, num(f[2]));
    EXPECT_EQ(r.true_positives, std::stoll(f[3]));
    EXPECT_EQ(r.predicted, std::stoll(f[4]));
    EXPECT_EQ(r.gold, std::stoll(f[5]));
  }
}

// ---- SQuAD / KorQuAD ----------------------------------------------------------------------------

TEST(Squad, PinnedOfficialValues) {
  EXPECT_EQ(nlp::squad_normalize("  The  Eiffel-Tower, (Paris)! "), "eiffeltower paris");
  EXPECT_EQ(nlp::squad_exact_match("the Eiffel Tower!", {"Eiffel Tower"}), 1.0);
  EXPECT_DOUBLE_EQ(nlp::squad_f1("Obama", {"Barack Obama", "President Obama"}), 2.0 / 3.0);
  EXPECT_EQ(nlp::squad_f1("The", {"the"}), 0.0);
  EXPECT_EQ(nlp::squad_exact_match("The", {"the"}), 1.0);
  EXPECT_EQ(nlp::squad_f1("", {"x"}), 0.0);
  EXPECT_EQ(nlp::squad_normalize("세종대왕은"), "세종대왕은");  // Korean passes through
  // Bytes that are not UTF-8 pass through as opaque non-word characters.
  EXPECT_EQ(nlp::squad_normalize("X\xff  \xc3Y"), "x\xff \xc3y");
  EXPECT_EQ(nlp::squad_normalize("\xff" "a\xfe"), "\xff \xfe");
  EXPECT_THROW(nlp::squad_f1("x", {}), nlp::Error);
  EXPECT_THROW(nlp::squad_exact_match("x", {}), nlp::Error);
}

TEST(Korquad, PinnedOfficialValues) {
  EXPECT_DOUBLE_EQ(nlp::korquad_f1("세종대왕은", {"세종대왕"}), 8.0 / 9.0);  // P 4/5, R 1
  EXPECT_EQ(nlp::korquad_exact_match("《훈민정음》", {"훈민정음"}), 1.0);
  EXPECT_EQ(nlp::korquad_exact_match("The Beatles", {"beatles"}), 0.0);
  EXPECT_EQ(nlp::korquad_f1("세종 대왕", {"세종대왕"}), 1.0);
  EXPECT_THROW(nlp::korquad_f1("x", {}), nlp::Error);
  EXPECT_THROW(nlp::korquad_exact_match("x", {}), nlp::Error);
}

TEST(Squad, MatchOfficialScript) {
  NEED_REFERENCE("{" + qa_request("squad", kSquadCases) + "}", ans);
  for (size_t k = 0; k < kSquadCases.size(); ++k) {
    SCOPED_TRACE("squad case " + std::to_string(k) + ": " + kSquadCases[k].pred);
    const auto it = ans.find("squad " + std::to_string(k));
    ASSERT_NE(it, ans.end());
    const std::vector<std::string>& f = it->second;
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(nlp::squad_normalize(kSquadCases[k].pred), unhex(f[0]));
    EXPECT_EQ(nlp::squad_exact_match(kSquadCases[k].pred, kSquadCases[k].golds), num(f[1]));
    EXPECT_EQ(nlp::squad_f1(kSquadCases[k].pred, kSquadCases[k].golds), num(f[2]));
  }
}

TEST(Korquad, MatchOfficialScript) {
  NEED_REFERENCE("{" + qa_request("korquad", kKorquadCases) + "}", ans);
  for (size_t k = 0; k < kKorquadCases.size(); ++k) {
    SCOPED_TRACE("korquad case " + std::to_string(k) + ": " + kKorquadCases[k].pred);
    const auto it = ans.find("korquad " + std::to_string(k));
    ASSERT_NE(it, ans.end());
    const std::vector<std::string>& f = it->second;
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(nlp::korquad_exact_match(kKorquadCases[k].pred, kKorquadCases[k].golds), num(f[1]));
    EXPECT_EQ(nlp::korquad_f1(kKorquadCases[k].pred, kKorquadCases[k].golds), num(f[2]));
  }
}

// ---- lower-casing (Python's str.lower(), which both official scripts apply) ---------------------

// squad_normalize of a string without punctuation, articles or spaces is exactly its lower().
TEST(PythonLower, EveryCodePointMatchesPython) {
  NEED_REFERENCE("{\"lower_all\":true}", ans);
  size_t checked = 0, mismatches = 0;
  for (char32_t cp = 1; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    std::string s;
    nlp::text::append_utf8(s, cp);
    const std::string got = nlp::squad_normalize(s);
    // Characters the normalization drops or splits on are not about lower-casing.
    if (got.empty() || got.find(' ') != std::string::npos) continue;
    const auto it = ans.find("lowerall " + std::to_string(static_cast<uint32_t>(cp)));
    const std::string want = it == ans.end() ? s : unhex(it->second.at(0));
    ++checked;
    if (got != want && ++mismatches <= 20)
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp);
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(checked, 1000000u);
}

// Capital sigma: σ or final ς depending on the context (Python's Final_Sigma rule, applied by
// lower() before punctuation is removed), compared through the official SQuAD normalization.
TEST(PythonLower, FinalSigmaContexts) {
  std::vector<QaCase> cases;
  for (const char* s :
       {"ΟΔΟΣ", "ΟΔΟΣ.", "Σ",   "ΑΣ",  "ΑΣΑ",      "ΑΣ'Α", "Α'Σ",  "ΑΣ Α", "ΣΑΣ", "ΌΣΟΣ ΟΣΟΣ",
        "ΑΣ̈",   "ΑΣ.Β",  "1Σ",  "ßΣ",  "ÅΣ",       "ΪΣ",   "ΐΣ",   "ʰΣ",   "AʰΣ", "AΣʰ",
        "ἈΣ",   "ΑΣ:Α",  "ΣΣ",  "ΑΣΣ", "Α\u00adΣ", "aΣb",  "ɐΣ",   "АΣ",   "ԱΣ",  "ⅠΣ",
        "ⓐΣ",   "ΑΣ가",  "가Σ", "ＡΣ", "𝐀Σ",       "ᾼΣ",   "ΑΣ-Β", "ΑΣ’Β", "(ΑΣ)"})
    cases.push_back({s, {""}});
  NEED_REFERENCE("{" + qa_request("squad", cases) + "}", ans);
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto it = ans.find("squad " + std::to_string(k));
    ASSERT_NE(it, ans.end());
    EXPECT_EQ(nlp::squad_normalize(cases[k].pred), unhex(it->second.at(0))) << cases[k].pred;
  }
}

// Every code point c below U+2100 in the contexts "cΣ" and "ΩΣc" (is c cased?) and below U+0590 in
// "ΩcΣ" (is c case-ignorable?): the range where metrics.cpp claims Python's exact Final_Sigma rule.
TEST(PythonLower, FinalSigmaExhaustiveBelowU2100) {
  std::vector<QaCase> cases;
  for (char32_t cp = 1; cp < 0x2100; ++cp) {
    std::string c;
    nlp::text::append_utf8(c, cp);
    cases.push_back({c + "Σ", {""}});
    cases.push_back({"ΩΣ" + c, {""}});
    if (cp < 0x590) cases.push_back({"Ω" + c + "Σ", {""}});
  }
  NEED_REFERENCE("{" + qa_request("squad", cases) + "}", ans);
  size_t mismatches = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto it = ans.find("squad " + std::to_string(k));
    ASSERT_NE(it, ans.end());
    if (nlp::squad_normalize(cases[k].pred) != unhex(it->second.at(0)) && ++mismatches <= 20)
      ADD_FAILURE() << "context " << cases[k].pred;
  }
  EXPECT_EQ(mismatches, 0u);
}
