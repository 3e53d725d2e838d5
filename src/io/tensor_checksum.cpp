// Per-dataset CRC-32 attributes and the root count of checksummed datasets (see tensor_checksum.h).
#include "io/tensor_checksum.h"

#include <cstdio>

#include "core/error.h"
#include "io/crc32.h"

namespace nlp {
namespace {

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

void write_checksummed_f32(h5::File& f, const std::string& name, const std::vector<int64_t>& shape,
                           const float* data) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  f.write_f32(name, shape, data);
  const uint32_t crc = crc32(data, static_cast<size_t>(n) * sizeof(float));
  f.set_attr(kTensorCrcAttr, static_cast<int64_t>(crc), name);
}

void record_checksum_count(h5::File& f, int64_t count) { f.set_attr(kChecksumCountAttr, count); }

bool has_checksums(const h5::File& f) { return f.has_attr(kChecksumCountAttr); }

void verify_checksum(const h5::File& f, const std::string& name, const float* data, int64_t n) {
  if (!has_checksums(f)) return;
  if (!f.has_attr(kTensorCrcAttr, name))
    throw Error(cat("file '", f.path(), "': tensor '", name, "' has no checksum (attribute '",
                    kTensorCrcAttr, "') although the file records checksums: the file is damaged"));
  const int64_t stored = f.attr_int(kTensorCrcAttr, name);
  const uint32_t computed = crc32(data, static_cast<size_t>(n) * sizeof(float));
  if (stored != static_cast<int64_t>(computed))
    throw Error(cat("file '", f.path(), "': tensor '", name, "' fails its checksum (stored CRC-32 ",
                    stored >= 0 && stored <= 0xFFFFFFFFll ? hex32(static_cast<uint32_t>(stored))
                                                          : std::to_string(stored),
                    ", data has ", hex32(computed), "): the file is damaged"));
}

void verify_checksum_count(const h5::File& f) {
  if (!has_checksums(f)) return;
  const int64_t recorded = f.attr_int(kChecksumCountAttr);
  int64_t found = 0;
  for (const auto& name : f.list())
    if (f.has_attr(kTensorCrcAttr, name)) ++found;
  if (found != recorded)
    throw Error(cat("file '", f.path(), "': ", recorded, " checksummed tensors were written but ", found,
                    " are present", found < recorded ? " (a dataset was deleted)" : "",
                    ": the file is damaged"));
}

}  // namespace nlp
