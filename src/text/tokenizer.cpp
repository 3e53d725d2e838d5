// Byte and GPT-2 byte-level BPE tokenizers (see tokenizer.h).
#include "text/tokenizer.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "core/sha256.h"
#include "text/json_min.h"
#include "text/unicode.h"

namespace nlp {
namespace text {

// ---- bytes-to-unicode ---------------------------------------------------------------------------

namespace {

struct ByteMap {
  std::array<char32_t, 256> to_unicode{};
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[b] = printable ? char32_t(b) : next++;
      to_byte[to_unicode[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Token text as stored in encoder.json -> the bytes it stands for. Like the HF ByteLevel decoder,
// a token containing a character outside the map is kept as its UTF-8 bytes unchanged.
std::string token_to_bytes(const std::string& tok) {
  const ByteMap& m = byte_map();
  std::string out;
  out.reserve(tok.size());
  for (size_t i = 0; i < tok.size();) {
    const Decoded d = decode_utf8(tok, i);
    auto it = m.to_byte.find(d.cp);
    if (d.cp == kInvalidCodePoint || it == m.to_byte.end()) return tok;
    out.push_back(static_cast<char>(it->second));
    i += d.len;
  }
  return out;
}

// ---- pre-tokenizer ------------------------------------------------------------------------------

// Calls emit(begin, end) for consecutive pieces covering s. Mirrors the regex alternatives in
// order.
template <typename Emit>
void pretokenize(std::string_view s, Emit&& emit) {
  const size_t n = s.size();
  auto cls_at = [&](size_t off, int* len) {
    const Decoded d = decode_utf8(s, off);
    *len = d.len;
    return d.cp == kInvalidCodePoint ? CharClass::Other : char_class(d.cp);
  };
  // End of the maximal run of class c starting at off.
  auto run_end = [&](size_t off, CharClass c) {
    while (off < n) {
      int len;
      if (cls_at(off, &len) != c) break;
      off += len;
    }
    return off;
  };
  size_t i = 0;
  while (i < n) {
    const char c0 = s[i];
    size_t end = 0;
    // 's|'t|'re|'ve|'m|'ll|'d   (ASCII apostrophe and lower-case letters only)
    if (c0 == '\'' && i + 1 < n) {
      const char a = s[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if (i + 2 < n) {
        const char b = s[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
      }
    }
    if (end == 0) {
      int len0;
      const CharClass k0 = cls_at(i, &len0);
      if (c0 == ' ' && i + 1 < n) {
        // ' ?\p{L}+' / ' ?\p{N}+' / ' ?[^\s\p{L}\p{N}]+' with the optional space present
        int len1;
        const CharClass k1 = cls_at(i + 1, &len1);
        if (k1 != CharClass::Space) end = run_end(i + 1 + len1, k1);
      }
      if (end == 0) {
        if (k0 != CharClass::Space) {
          end = run_end(i + len0, k0);  // the same three alternatives without the space
        } else {
          // '\s+(?!\S)' then '\s+': a whitespace run that reaches the end of the text is taken
          // whole; otherwise its last character is left to start the next piece (so " word" keeps
          // its space), unless the run is a single character.
          size_t k = i, last = i;
          while (k < n) {
            int len;
            if (cls_at(k, &len) != CharClass::Space) break;
            last = k;
            k += len;
          }
          end = (k == n || last == i) ? k : last;
        }
      }
    }
    emit(i, end);
    i = end;
  }
}

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

std::vector<std::string_view> gpt2_pretokenize(std::string_view s) {
  std::vector<std::string_view> out;
  pretokenize(s, [&](size_t a, size_t b) { out.push_back(s.substr(a, b - a)); });
  return out;
}

}  // namespace text

namespace {

// ---- byte tokenizer -----------------------------------------------------------------------------

class ByteTokenizer final : public Tokenizer {
 public:
  std::string vocab_sha256() const override { return sha256_hex("byte:256"); }
  std::vector<int32_t> encode(const std::string& s) const override {
    std::vector<int32_t> ids(s.size());
    for (size_t i = 0; i < s.size(); ++i) ids[i] = static_cast<unsigned char>(s[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > 255)
        throw Error(
            cat("byte tokenizer: token id ", ids[i], " at position ", i, " is outside [0, 256)"));
      out[i] = static_cast<char>(ids[i]);
    }
    return out;
  }
  int vocab_size() const override { return 256; }
  int eos_id() const override { return -1; }
};

// ---- GPT-2 BPE ----------------------------------------------------------------------------------

// Open-addressing hash map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t id = -1;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  void reserve(size_t count) {
    size_t cap = 16;
    while (cap < 2 * count) cap <<= 1;
    slots_.assign(cap, Entry{});
    mask_ = cap - 1;
  }
  // Later insertions of the same pair overwrite earlier ones (as in encoder.py and HF).
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t k = key(a, b);
    slots_[probe(k)] = Entry{k, rank, id};
  }
  const Entry* find(int32_t a, int32_t b) const {
    const Entry& e = slots_[probe(key(a, b))];
    return e.key == kEmpty ? nullptr : &e;
  }

 private:
  static uint64_t key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint64_t(uint32_t(b));
  }
  // Slot holding key k, or the empty slot where it would go (the table is at most half full).
  size_t probe(uint64_t k) const {
    size_t h = size_t((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
    while (slots_[h].key != kEmpty && slots_[h].key != k) h = (h + 1) & mask_;
    return h;
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

std::string find_file(const std::string& dir, const char* name, const char* alt) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(dir) / name, q = fs::path(dir) / alt;
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return p.string();
  if (fs::is_regular_file(q, ec)) return q.string();
  return {};
}

std::string need_file(const std::string& dir, const char* name, const char* alt) {
  std::string f = find_file(dir, name, alt);
  if (f.empty()) {
    namespace fs = std::filesystem;
    throw Error(cat("gpt2 tokenizer: vocabulary file '", (fs::path(dir) / name).string(),
                    "' not found (nor '", (fs::path(dir) / alt).string(), "')"));
  }
  return f;
}

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(const std::string& vocab_dir) {
    const std::string enc_path = need_file(vocab_dir, "encoder.json", "vocab.json");
    const std::string bpe_path = need_file(vocab_dir, "vocab.bpe", "merges.txt");
    load_vocab(enc_path);
    load_merges(bpe_path);
  }

  std::vector<int32_t> encode(const std::string& s) const override {
    std::vector<int32_t> out;
    out.reserve(s.size() / 3 + 4);
    text::pretokenize(s,
                      [&](size_t a, size_t b) { bpe(std::string_view(s).substr(a, b - a), out); });
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size())
        throw Error(cat("gpt2 tokenizer: token id ", ids[i], " at position ", i, " is outside [0, ",
                        vocab_size(), ")"));
      out += bytes_[ids[i]];
    }
    return out;
  }

  int vocab_size() const override { return static_cast<int>(bytes_.size()); }
  int eos_id() const override { return eos_; }
  std::string vocab_sha256() const override { return vocab_sha256_; }

 private:
  static constexpr size_t kMaxCachedWordBytes = 128;
  static constexpr size_t kMaxCacheEntries = 1 << 18;
  static constexpr size_t kLinearMaxSymbols = 64;  // longer words use the heap algorithm
  static constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

  void load_vocab(const std::string& path) {
    auto entries = text::read_string_int_json(path);
    if (entries.empty()) throw Error(cat("gpt2 tokenizer: vocabulary '", path, "' is empty"));
    const int64_t n = static_cast<int64_t>(entries.size());
    bytes_.assign(n, std::string());
    std::vector<char> seen(n, 0);
    ids_.reserve(n);
    for (auto& [tok, id] : entries) {
      if (id < 0 || id >= n)
        throw Error(cat("gpt2 tokenizer: vocabulary '", path, "': id ", id, " of token \"", tok,
                        "\" is outside [0, ", n, ") (ids must be 0..N-1)"));
      if (seen[id])
        throw Error(cat("gpt2 tokenizer: vocabulary '", path, "': id ", id, " used twice"));
      seen[id] = 1;
      bytes_[id] = text::token_to_bytes(tok);
      ids_.emplace(std::move(tok), static_cast<int32_t>(id));
    }
    for (int b = 0; b < 256; ++b) {
      std::string u;
      text::append_utf8(u, text::gpt2_byte_to_unicode(static_cast<uint8_t>(b)));
      auto it = ids_.find(u);
      if (it == ids_.end())
        throw Error(cat("gpt2 tokenizer: vocabulary '", path, "' has no token for byte ", b));
      byte_id_[b] = it->second;
    }
    auto it = ids_.find("<|endoftext|>");
    eos_ = it == ids_.end() ? -1 : it->second;
    // the fingerprint of the vocabulary's token strings, in id order
    std::vector<const std::string*> by_id(static_cast<size_t>(n), nullptr);
    for (const auto& [tok, id] : ids_) by_id[static_cast<size_t>(id)] = &tok;
    Sha256 h;
    for (int64_t id = 0; id < n; ++id) {
      std::string line = std::to_string(id) + "\t";
      for (char c : *by_id[static_cast<size_t>(id)]) {
        if (c == '\\') line += "\\\\";
        else if (c == '\t') line += "\\t";
        else if (c == '\n') line += "\\n";
        else if (c == '\r') line += "\\r";
        else line += c;
      }
      h.update(line + "\n");
    }
    vocab_sha256_ = h.hex();
  }

  void load_merges(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(cat("gpt2 tokenizer: cannot open merges file '", path, "'"));
    std::vector<std::array<int32_t, 3>> merges;
    std::string line;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (lineno == 1 && line.rfind("#version", 0) == 0) continue;
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        throw Error(cat("gpt2 tokenizer: merges file '", path, "' line ", lineno,
                        ": expected two tokens separated by one space, got \"", line, "\""));
      const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
      auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
      if (ia == ids_.end() || ib == ids_.end() || iab == ids_.end())
        throw Error(cat("gpt2 tokenizer: merges file '", path, "' line ", lineno, ": token \"",
                        ia == ids_.end()   ? a
                        : ib == ids_.end() ? b
                                           : a + b,
                        "\" is not in the vocabulary"));
      merges.push_back({ia->second, ib->second, iab->second});
    }
    if (f.bad()) throw Error(cat("gpt2 tokenizer: error reading merges file '", path, "'"));
    merges_.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r)
      merges_.insert(merges[r][0], merges[r][1], static_cast<uint32_t>(r), merges[r][2]);
    ids_.clear();  // only needed while loading
  }

  // Appends the BPE tokens of one pre-tokenized piece to out.
  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.size() == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(word[0])]);
      return;
    }
    const bool cacheable = word.size() <= kMaxCachedWordBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      auto it = cache_.find(std::string(word));
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> sym(word.size());
    for (size_t i = 0; i < word.size(); ++i) sym[i] = byte_id_[static_cast<unsigned char>(word[i])];
    if (sym.size() <= kLinearMaxSymbols)
      merge_linear(sym);
    else
      merge_heap(sym);
    out.insert(out.end(), sym.begin(), sym.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      cache_.emplace(std::string(word), std::move(sym));
    }
  }

  // Repeatedly apply the lowest-ranked merge among adjacent pairs, leftmost first. rank[i] holds
  // the rank of pair (sym[i], sym[i+1]), so each step costs one scan plus two lookups.
  void merge_linear(std::vector<int32_t>& sym) const {
    std::vector<uint32_t> rank(sym.size());
    std::vector<int32_t> made(sym.size());
    auto look = [&](size_t i) {
      const MergeTable::Entry* e = merges_.find(sym[i], sym[i + 1]);
      rank[i] = e ? e->rank : kNoRank;
      made[i] = e ? e->id : -1;
    };
    size_t m = sym.size();
    for (size_t i = 0; i + 1 < m; ++i) look(i);
    while (m > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < m; ++i)
        if (rank[i] < rank[best]) best = i;
      if (rank[best] == kNoRank) break;
      sym[best] = made[best];
      for (size_t i = best + 1; i + 1 < m; ++i) {
        sym[i] = sym[i + 1];
        rank[i] = rank[i + 1];
        made[i] = made[i + 1];
      }
      --m;
      if (best > 0) look(best - 1);
      if (best + 1 < m) look(best);
    }
    sym.resize(m);
  }

  // Same result as merge_linear in O(n log n): a min-heap of candidate merges ordered by
  // (rank, position) over a doubly linked list of symbols; stale candidates are skipped.
  void merge_heap(std::vector<int32_t>& sym) const {
    const int n = static_cast<int>(sym.size());
    std::vector<int> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      uint32_t rank;
      int pos;
      int32_t id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
    auto push = [&](int pos) {
      if (pos < 0 || next[pos] < 0) return;
      if (const MergeTable::Entry* e = merges_.find(sym[pos], sym[next[pos]]))
        q.push({e->rank, pos, e->id});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!q.empty()) {
      const Cand c = q.top();
      q.pop();
      if (!alive[c.pos] || next[c.pos] < 0) continue;
      const MergeTable::Entry* e = merges_.find(sym[c.pos], sym[next[c.pos]]);
      if (!e || e->id != c.id || e->rank != c.rank) continue;  // stale
      const int r = next[c.pos];
      sym[c.pos] = c.id;
      alive[r] = 0;
      next[c.pos] = next[r];
      if (next[r] >= 0) prev[next[r]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
    size_t m = 0;
    for (int i = 0; i >= 0 && i < n; i = next[i]) sym[m++] = sym[i];
    sym.resize(m);
  }

  std::vector<std::string> bytes_;                // id -> bytes
  std::unordered_map<std::string, int32_t> ids_;  // token text -> id (loading only)
  std::array<int32_t, 256> byte_id_{};
  MergeTable merges_;
  int32_t eos_ = -1;
  std::string vocab_sha256_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") return std::make_unique<Gpt2Tokenizer>(vocab_dir);
  throw Error(cat("unknown tokenizer '", kind, "' (expected \"byte\" or \"gpt2\")"));
}

Gpt2VocabFiles find_gpt2_vocab_files(const std::string& dir) {
  return {find_file(dir, "encoder.json", "vocab.json"), find_file(dir, "vocab.bpe", "merges.txt")};
}

}  // namespace nlp
