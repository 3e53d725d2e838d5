// RAII wrappers over the HDF5 C API: files, datasets, attributes, hyperslab reads.
// Every error names the file and the dataset or attribute concerned.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/atomic_file.h"

namespace nlp::h5 {

enum class DType { F32, F64, I32, I64, U8, Other };
std::string dtype_name(DType t);
std::string shape_str(const std::vector<int64_t>& shape);  // "[2, 3]" for error messages

class File {
 public:
  // Create (truncate) for writing. Intermediate groups are created for names with '/'.
  static File create(const std::string& path);
  // Open an existing file read-only; throws "cannot open HDF5 file '<path>'" when missing/invalid.
  static File open_read(const std::string& path);
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  void flush();
  void close();  // also done by the destructor; throws on failure

  // ---- datasets (name may contain '/' for groups; '.' is a plain character) ----
  bool has(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  DType dtype(const std::string& name) const;
  // Names of all datasets under a group ("" = root, recursive), in sorted order.
  std::vector<std::string> list(const std::string& group = "") const;

  void write_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data);
  void write_f64(const std::string& name, const std::vector<int64_t>& shape, const double* data);
  void write_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
  void write_i64(const std::string& name, const std::vector<int64_t>& shape, const int64_t* data);
  void write_u8(const std::string& name, const std::vector<int64_t>& shape, const uint8_t* data);

  // Whole-dataset reads. The stored shape must equal `expect` and the dtype must match
  // (float32 for read_f32 etc.); otherwise throws naming file, dataset, expected and actual.
  void read_f32(const std::string& name, const std::vector<int64_t>& expect, float* out) const;
  void read_f64(const std::string& name, const std::vector<int64_t>& expect, double* out) const;
  void read_i64(const std::string& name, const std::vector<int64_t>& expect, int64_t* out) const;
  void read_u8(const std::string& name, const std::vector<int64_t>& expect, uint8_t* out) const;
  void read_i32(const std::string& name, const std::vector<int64_t>& expect, int32_t* out) const;
  // A 1-D dataset of strings (variable- or fixed-length, as h5py writes them).
  std::vector<std::string> read_strings(const std::string& name) const;

  // Hyperslab read of int32 data along the first dimension:
  // rows [row0, row0+nrows) of a 1-D or 2-D int32 dataset, into out (nrows * row_len values).
  void read_i32_rows(const std::string& name, int64_t row0, int64_t nrows, int32_t* out) const;

  // ---- attributes on the root (or on a dataset when obj is given) ----
  bool has_attr(const std::string& key, const std::string& obj = "") const;
  void set_attr(const std::string& key, const std::string& value, const std::string& obj = "");
  void set_attr(const std::string& key, int64_t value, const std::string& obj = "");
  void set_attr(const std::string& key, double value, const std::string& obj = "");
  std::string attr_string(const std::string& key, const std::string& obj = "") const;
  int64_t attr_int(const std::string& key, const std::string& obj = "") const;
  double attr_double(const std::string& key, const std::string& obj = "") const;  // int attrs convert

 private:
  File(int64_t id, std::string path);
  int64_t id_ = -1;  // hid_t
  std::string path_;
};

// Write to `<path>.tmp.<pid>`, fsync, then rename onto `path` (io/atomic_file.h): readers never see
// a partial file, and on failure (exception from fn) the temporary file is removed.
template <typename Fn>
void write_atomically(const std::string& path, Fn&& fn);

template <typename Fn>
void write_atomically(const std::string& path, Fn&& fn) {
  std::string tmp;
  atomic_begin(path, &tmp);
  try {
    {
      File f = File::create(tmp);
      fn(f);
      f.close();
    }
    atomic_commit(tmp, path);
  } catch (...) {
    atomic_abort(tmp);
    throw;
  }
}

}  // namespace nlp::h5
