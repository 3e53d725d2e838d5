// SHA-256 (FIPS 180-4), for the tokenizer fingerprints (vocab_sha256) that the data tools write
// (tools/hub_tokenizer.py, with Python's hashlib) and that nlptrain compares.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nlp {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hex();  // the digest as 64 lower-case hex digits; ends the computation

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);

}  // namespace nlp
