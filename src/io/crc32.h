// CRC-32 as in zlib / PNG / IEEE 802.3 (reflected polynomial 0xEDB88320, initial value and final
// xor 0xFFFFFFFF): the checksum nlptrain records for every tensor it writes, so that a damaged
// checkpoint or weights file is recognised on load. Python computes the same value with
// zlib.crc32(array.astype('<f4').tobytes()).
#pragma once
#include <cstddef>
#include <cstdint>

namespace nlp {

// CRC-32 of `bytes` bytes at `data`, continuing from `crc` (the value returned for the preceding
// bytes; 0 to start). crc32(b, n) == crc32(b + k, n - k, crc32(b, k)).
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace nlp
