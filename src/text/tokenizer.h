// Tokenizers: text (UTF-8 bytes) <-> token ids.
//
//   "byte": id = byte value, vocabulary 256, no end-of-text token.
//   "gpt2": GPT-2 byte-level BPE, identical to OpenAI's encoder.py and to HF `tokenizers`
//           (models.BPE + pre_tokenizers.ByteLevel(add_prefix_space=False) + decoders.ByteLevel):
//           1. pre-tokenize with the GPT-2 regex, implemented by hand on code points:
//                's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//              (\p{L}, \p{N}, \s: Unicode 16.0 classes, see text/unicode.h for the coverage);
//           2. each piece's bytes start as one symbol per byte (the 256 byte tokens of the
//              bytes-to-unicode map), then adjacent symbols are merged by merge rank (lowest rank
//              first, leftmost first among equal ranks) until no listed merge applies;
//           3. decode maps each token back to its bytes through the inverse bytes-to-unicode map.
//           Files in vocab_dir: encoder.json (or vocab.json) and vocab.bpe (or merges.txt; a first
//           line "#version..." is skipped). "<|endoftext|>" is eos_id() but text is never parsed
//           for special tokens: the string "<|endoftext|>" in the input is encoded as ordinary
//           text.
//
// Input need not be valid UTF-8: a byte that does not start a well-formed sequence is treated as a
// one-byte punctuation-like character ("Other" class), so decode(encode(s)) == s for every byte
// string s. decode() returns raw bytes and may therefore return invalid UTF-8 (e.g. for a slice of
// ids that splits a multi-byte character). Ids outside [0, vocab_size()) are an nlp::Error.
// encode() and decode() are const and safe to call from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace nlp {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& utf8) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;  // may be invalid UTF-8
  virtual int vocab_size() const = 0;
  virtual int eos_id() const = 0;  // -1 when the tokenizer has none ("byte")
  // The vocabulary's fingerprint as the data tools define it (tools/hub_tokenizer.py): SHA-256 of
  // "<id>\t<token>\n" for every id (\\ \t \n \r escaped in the token), or of "byte:256" for bytes.
  virtual std::string vocab_sha256() const = 0;
};

// kind: "byte" (vocab_dir ignored) or "gpt2". Missing or malformed vocabulary files and unknown
// kinds are an nlp::Error naming the path or the kind.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir);

// The GPT-2 BPE files make_tokenizer("gpt2", dir) reads: the vocabulary (encoder.json, else
// vocab.json, the Hugging Face name) and the merges (vocab.bpe, else merges.txt). Either path is
// empty when neither name exists in dir.
struct Gpt2VocabFiles {
  std::string vocab, merges;
  bool complete() const { return !vocab.empty() && !merges.empty(); }
};
Gpt2VocabFiles find_gpt2_vocab_files(const std::string& dir);

namespace text {

// GPT-2 pre-tokenization of `s` into consecutive pieces (views into s) that cover s exactly.
std::vector<std::string_view> gpt2_pretokenize(std::string_view s);

// The GPT-2 bytes-to-unicode map: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to
// themselves, the other 68 bytes to U+0100.. in increasing byte order (space -> U+0120 'Ġ').
char32_t gpt2_byte_to_unicode(uint8_t b);

}  // namespace text
}  // namespace nlp
