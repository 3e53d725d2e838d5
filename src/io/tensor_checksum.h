// Checksums of the tensors in weights and checkpoint files, so that a damaged file is recognised
// when it is loaded instead of silently training on flipped bits.
//
// Layout: every float32 dataset nlptrain writes carries the attribute "nlptrain_crc32" (int64 holding
// the CRC-32 of the data as little-endian float32 bytes, row-major; see io/crc32.h), and the root
// carries "nlptrain_checksums" (int64: how many datasets have one), which tells a deleted dataset
// from one that never existed. Files without the root attribute (written by tools/hf_import.py or by
// an older nlptrain) carry no checksums and load unverified.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/h5.h"

namespace nlp {

inline constexpr const char* kTensorCrcAttr = "nlptrain_crc32";
inline constexpr const char* kChecksumCountAttr = "nlptrain_checksums";

// Writes `data` as the float32 dataset `name` together with its checksum attribute.
void write_checksummed_f32(h5::File& f, const std::string& name, const std::vector<int64_t>& shape,
                           const float* data);
// Records how many checksummed datasets the file holds (call once, after the last write).
void record_checksum_count(h5::File& f, int64_t count);

// True when the file carries checksums (its root has kChecksumCountAttr).
bool has_checksums(const h5::File& f);

// For a file with checksums: checks `n` floats just read from dataset `name` against the stored
// checksum; throws an Error naming the file, the dataset and both values on a mismatch, or when the
// dataset has no checksum. Does nothing for a file without checksums.
void verify_checksum(const h5::File& f, const std::string& name, const float* data, int64_t n);

// For a file with checksums: throws when the number of checksummed datasets differs from the
// recorded count (a dataset was deleted, or one was added by another tool).
void verify_checksum_count(const h5::File& f);

}  // namespace nlp
