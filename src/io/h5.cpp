// HDF5 wrappers: every id opened here is owned by a small RAII guard, HDF5's own error printing is
// silenced, and every failure becomes an nlp::Error naming the file and the dataset or attribute.
#include "io/h5.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <system_error>

#include "core/error.h"
#include "io/h5_checked_driver.h"

namespace fs = std::filesystem;

namespace nlp::h5 {

static_assert(sizeof(hid_t) == sizeof(int64_t), "hid_t is expected to be 64-bit (HDF5 >= 1.10)");

namespace {

// ---- library setup and HDF5 error text ----------------------------------------------------------

// Opens the library once and silences HDF5's automatic error printing. The error stack (and its
// printing setting) is per thread in thread-safe builds, so every public entry point calls this.
void init_library() {
  static const bool opened = [] {
    H5open();
    return true;
  }();
  (void)opened;
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err && err->desc) *out = err->desc;  // innermost (most specific) entry
  return 0;
}

// The most specific message on HDF5's error stack; call right after the failing call, before any
// other HDF5 call (each API call clears the stack).
std::string h5_reason() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &s);
  return s.empty() ? std::string("HDF5 error") : s;
}

// ---- RAII guard for any HDF5 id -------------------------------------------------------------------

class Id {
 public:
  Id() = default;
  explicit Id(hid_t id) : id_(id) {}
  Id(Id&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      o.id_ = -1;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() { reset(); }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0 && H5Iis_valid(id_) > 0) H5Idec_ref(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
};


std::string norm_obj(const std::string& obj) { return obj.empty() ? std::string("/") : obj; }

// Human-readable name of a stored type (for error messages).
std::string type_desc(hid_t t) {
  H5T_class_t c = H5Tget_class(t);
  size_t size = H5Tget_size(t);
  switch (c) {
    case H5T_INTEGER: {
      bool sign = H5Tget_sign(t) == H5T_SGN_2;
      return cat(sign ? "int" : "uint", size * 8);
    }
    case H5T_FLOAT: return cat("float", size * 8);
    case H5T_STRING: return H5Tis_variable_str(t) > 0 ? "variable-length string" : cat("string (", size, " bytes)");
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    case H5T_REFERENCE: return "reference";
    case H5T_TIME: return "time";
    default: return "unknown type";
  }
}

DType classify(hid_t t) {
  H5T_class_t c = H5Tget_class(t);
  size_t size = H5Tget_size(t);
  if (c == H5T_FLOAT) {
    if (size == 4) return DType::F32;
    if (size == 8) return DType::F64;
  } else if (c == H5T_INTEGER) {
    bool sign = H5Tget_sign(t) == H5T_SGN_2;
    if (sign && size == 4) return DType::I32;
    if (sign && size == 8) return DType::I64;
    if (!sign && size == 1) return DType::U8;
  }
  return DType::Other;
}

std::vector<int64_t> space_shape(hid_t space) {
  int rank = H5Sget_simple_extent_ndims(space);
  if (rank <= 0) return {};
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return std::vector<int64_t>(dims.begin(), dims.end());
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Split "a/b/c" into components (empty components from leading/trailing/double '/' dropped).
std::vector<std::string> components(const std::string& name) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= name.size()) {
    size_t j = name.find('/', i);
    if (j == std::string::npos) j = name.size();
    if (j > i) out.push_back(name.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// True when every link along `name` exists (H5Lexists fails on a missing intermediate group).
bool link_exists(hid_t file, const std::string& name) {
  auto parts = components(name);
  if (parts.empty()) return true;  // the root
  std::string path;
  for (const auto& p : parts) {
    path += (path.empty() ? "" : "/") + p;
    if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

H5I_type_t object_type(hid_t file, const std::string& name) {
  if (!link_exists(file, name)) return H5I_BADID;
  Id o(H5Oopen(file, name.empty() ? "/" : name.c_str(), H5P_DEFAULT));
  if (!o.ok()) return H5I_BADID;
  return H5Iget_type(o.get());
}

hid_t native_of(DType t) {
  switch (t) {
    case DType::F32: return H5T_NATIVE_FLOAT;
    case DType::F64: return H5T_NATIVE_DOUBLE;
    case DType::I32: return H5T_NATIVE_INT32;
    case DType::I64: return H5T_NATIVE_INT64;
    case DType::U8: return H5T_NATIVE_UINT8;
    default: return -1;
  }
}

hid_t file_type_of(DType t) {
  switch (t) {
    case DType::F32: return H5T_IEEE_F32LE;
    case DType::F64: return H5T_IEEE_F64LE;
    case DType::I32: return H5T_STD_I32LE;
    case DType::I64: return H5T_STD_I64LE;
    case DType::U8: return H5T_STD_U8LE;
    default: return -1;
  }
}

}  // namespace

std::string dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    default: return "other";
  }
}

// ---- File -----------------------------------------------------------------------------------------

namespace {

// `checked`: read through the checked driver (io/h5_checked_driver.h), for files opened read-only.
Id make_fapl(bool checked = false) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  if (!fapl.ok()) throw Error(cat("HDF5: cannot create a file access property list: ", h5_reason()));
  if (checked && H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10) {  // see h5_checked_driver.cpp
    const hid_t drv = checked_driver_id();
    if (drv < 0 || H5Pset_driver(fapl.get(), drv, nullptr) < 0)
      throw Error(cat("HDF5: cannot set up the checked file driver: ", h5_reason()));
  }
  // Close every object of the file with it, so that close() really releases the file.
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
#if H5_VERSION_GE(1, 10, 7)
  // Keep using file locks, but do not fail on file systems that do not support them.
  H5Pset_file_locking(fapl.get(), true, true);
#endif
  return fapl;
}

// Helper shared by the dataset accessors: open a dataset or throw naming file and dataset.
Id open_dataset(hid_t file, const std::string& path, const std::string& name) {
  if (file < 0) throw Error(cat("HDF5 file '", path, "': file is closed (accessing '", name, "')"));
  H5I_type_t t = object_type(file, name);
  if (t == H5I_BADID)
    throw Error(cat("file '", path, "': dataset '", name, "' not found"));
  if (t != H5I_DATASET)
    throw Error(cat("file '", path, "': '", name, "' is a group, not a dataset"));
  Id d(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  if (!d.ok()) throw Error(cat("file '", path, "': cannot open dataset '", name, "': ", h5_reason()));
  return d;
}

// libhdf5 1.10 does not compare a compact dataset's stored bytes (kept in its object header) with its
// shape, and a read of one whose data is missing copies from a null buffer (SEGV; fuzz_h5file,
// corpus/h5file/regress-compact-dataset-without-data; HDF5 1.14 refuses such a dataset at open).
// Variable-length types are left to libhdf5 (their stored size is not the element size).
void check_compact_size(hid_t dset, hid_t type, const std::vector<int64_t>& shape, const std::string& path,
                        const std::string& name) {
  Id dcpl(H5Dget_create_plist(dset));
  if (!dcpl.ok() || H5Pget_layout(dcpl.get()) != H5D_COMPACT) return;
  if (H5Tget_class(type) == H5T_VLEN || H5Tis_variable_str(type) > 0) return;
  uint64_t need = H5Tget_size(type);
  bool overflow = false;
  for (auto d : shape) overflow |= __builtin_mul_overflow(need, static_cast<uint64_t>(d), &need);
  const hsize_t stored = H5Dget_storage_size(dset);
  if (overflow || stored != need)
    throw Error(cat("file '", path, "': dataset '", name, "': its compact storage holds ", stored,
                    " bytes, but shape ", shape_str(shape), " of ", type_desc(type), " needs ",
                    overflow ? std::string("more than 2^64") : cat(need), ": the file is damaged"));
}

struct DatasetInfo {
  Id dset, space, type;
  std::vector<int64_t> shape;
  DType dtype = DType::Other;
  std::string type_desc;
  bool scalar = false;
};

DatasetInfo inspect(hid_t file, const std::string& path, const std::string& name) {
  DatasetInfo info;
  info.dset = open_dataset(file, path, name);
  info.space = Id(H5Dget_space(info.dset.get()));
  if (!info.space.ok())
    throw Error(cat("file '", path, "': dataset '", name, "': cannot read dataspace: ", h5_reason()));
  info.type = Id(H5Dget_type(info.dset.get()));
  if (!info.type.ok())
    throw Error(cat("file '", path, "': dataset '", name, "': cannot read datatype: ", h5_reason()));
  H5S_class_t sc = H5Sget_simple_extent_type(info.space.get());
  if (sc == H5S_NULL)
    throw Error(cat("file '", path, "': dataset '", name, "' has an empty (null) dataspace"));
  info.scalar = sc == H5S_SCALAR;
  info.shape = space_shape(info.space.get());
  info.dtype = classify(info.type.get());
  info.type_desc = type_desc(info.type.get());
  check_compact_size(info.dset.get(), info.type.get(), info.shape, path, name);
  return info;
}

void check_dtype(const DatasetInfo& info, DType want, const std::string& path, const std::string& name) {
  if (info.dtype != want)
    throw Error(cat("file '", path, "': dataset '", name, "' has dtype ", info.type_desc, ", expected ",
                    dtype_name(want)));
}

void check_shape(const DatasetInfo& info, const std::vector<int64_t>& expect, const std::string& path,
                 const std::string& name) {
  if (info.shape != expect)
    throw Error(cat("file '", path, "': dataset '", name, "' has shape ", shape_str(info.shape),
                    ", expected ", shape_str(expect)));
}

void write_any(hid_t file, const std::string& path, const std::string& name,
               const std::vector<int64_t>& shape, const void* data, DType t) {
  if (file < 0) throw Error(cat("HDF5 file '", path, "': file is closed (writing '", name, "')"));
  if (components(name).empty())
    throw Error(cat("file '", path, "': invalid dataset name '", name, "'"));
  for (auto d : shape)
    if (d < 0)
      throw Error(cat("file '", path, "': dataset '", name, "': invalid shape ", shape_str(shape)));
  const int64_t n = numel(shape);
  if (n > 0 && data == nullptr)
    throw Error(cat("file '", path, "': dataset '", name, "': no data to write"));
  if (link_exists(file, name))
    throw Error(cat("file '", path, "': dataset '", name, "' already exists"));

  Id space;
  if (shape.empty()) {
    space = Id(H5Screate(H5S_SCALAR));
  } else {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    space = Id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  }
  if (!space.ok())
    throw Error(cat("file '", path, "': dataset '", name, "': cannot create dataspace ", shape_str(shape),
                    ": ", h5_reason()));
  Id lcpl(H5Pcreate(H5P_LINK_CREATE));
  if (!lcpl.ok() || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    throw Error(cat("file '", path, "': dataset '", name, "': cannot set up link creation: ", h5_reason()));
  Id dset(H5Dcreate2(file, name.c_str(), file_type_of(t), space.get(), lcpl.get(), H5P_DEFAULT,
                     H5P_DEFAULT));
  if (!dset.ok())
    throw Error(cat("file '", path, "': cannot create dataset '", name, "': ", h5_reason()));
  if (n > 0 && H5Dwrite(dset.get(), native_of(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    throw Error(cat("file '", path, "': cannot write dataset '", name, "': ", h5_reason()));
}

void read_any(hid_t file, const std::string& path, const std::string& name,
              const std::vector<int64_t>& expect, void* out, DType t) {
  DatasetInfo info = inspect(file, path, name);
  check_dtype(info, t, path, name);
  check_shape(info, expect, path, name);
  if (numel(info.shape) == 0) return;
  if (out == nullptr) throw Error(cat("file '", path, "': dataset '", name, "': no output buffer"));
  if (H5Dread(info.dset.get(), native_of(t), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    throw Error(cat("file '", path, "': cannot read dataset '", name, "': ", h5_reason()));
}

}  // namespace

File::File(int64_t id, std::string path) : id_(id), path_(std::move(path)) {}

File::File(File&& o) noexcept : id_(o.id_), path_(std::move(o.path_)) { o.id_ = -1; }

File& File::operator=(File&& o) noexcept {
  init_library();
  if (this != &o) {
    if (id_ >= 0) H5Fclose(id_);
    id_ = o.id_;
    path_ = std::move(o.path_);
    o.id_ = -1;
  }
  return *this;
}

File::~File() {
  init_library();
  if (id_ >= 0) H5Fclose(id_);
}

File File::create(const std::string& path) {
  init_library();
  Id fapl = make_fapl();
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) throw Error(cat("cannot create HDF5 file '", path, "': ", h5_reason()));
  return File(id, path);
}

File File::open_read(const std::string& path) {
  init_library();
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(cat("cannot open HDF5 file '", path, "': no such file"));
  if (fs::is_directory(st)) throw Error(cat("cannot open HDF5 file '", path, "': is a directory"));
  if (::access(path.c_str(), R_OK) != 0)
    throw Error(cat("cannot open HDF5 file '", path, "': ", std::strerror(errno)));
  htri_t is = H5Fis_hdf5(path.c_str());
  if (is == 0) throw Error(cat("cannot open HDF5 file '", path, "': is not an HDF5 file"));
  if (is < 0) throw Error(cat("cannot open HDF5 file '", path, "': ", h5_reason()));
  Id fapl = make_fapl(/*checked=*/true);
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id < 0) throw Error(cat("cannot open HDF5 file '", path, "': ", h5_reason()));
  return File(id, path);
}

void File::flush() {
  init_library();
  if (id_ < 0) throw Error(cat("HDF5 file '", path_, "': flush of a closed file"));
  if (H5Fflush(id_, H5F_SCOPE_LOCAL) < 0)
    throw Error(cat("HDF5 file '", path_, "': flush failed: ", h5_reason()));
}

void File::close() {
  init_library();
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = -1;
  if (H5Fclose(id) < 0) throw Error(cat("HDF5 file '", path_, "': close failed: ", h5_reason()));
}

bool File::has(const std::string& name) const {
  init_library();
  if (id_ < 0) return false;
  return object_type(id_, name) == H5I_DATASET;
}

std::vector<int64_t> File::shape(const std::string& name) const {
  init_library();
  return inspect(id_, path_, name).shape;
}

DType File::dtype(const std::string& name) const {
  init_library();
  return inspect(id_, path_, name).dtype;
}

namespace {

struct VisitCtx {
  hid_t group;
  std::string prefix;
  std::vector<std::string>* out;
  int64_t links = 0;
  bool too_deep = false, too_many = false;
};

// Bounds on a listing. libhdf5 1.10 detects a hard-link cycle only for groups whose link count says
// they are linked more than once, so a corrupt file whose group links to itself made H5Lvisit
// recurse without end (found by tests/fuzz/fuzz_h5file). The project's files nest a few levels and
// hold at most some thousands of datasets.
constexpr int kMaxListDepth = 32;
constexpr int64_t kMaxListLinks = int64_t{1} << 18;

herr_t visit_cb(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  auto* ctx = static_cast<VisitCtx*>(data);
  if (std::count(name, name + std::strlen(name), '/') >= kMaxListDepth) {
    ctx->too_deep = true;
    return -1;  // stops H5Lvisit, which then returns < 0
  }
  if (++ctx->links > kMaxListLinks) {
    ctx->too_many = true;
    return -1;
  }
  if (info && info->type != H5L_TYPE_HARD && info->type != H5L_TYPE_SOFT) return 0;
  Id o(H5Oopen(group, name, H5P_DEFAULT));
  if (o.ok() && H5Iget_type(o.get()) == H5I_DATASET) ctx->out->push_back(ctx->prefix + name);
  return 0;
}

}  // namespace

std::vector<std::string> File::list(const std::string& group) const {
  init_library();
  if (id_ < 0) throw Error(cat("HDF5 file '", path_, "': listing a closed file"));
  auto parts = components(group);
  std::string g, prefix;
  for (const auto& p : parts) g += (g.empty() ? "" : "/") + p;
  if (!g.empty()) prefix = g + "/";
  std::vector<std::string> out;
  H5I_type_t t = object_type(id_, g);
  if (t == H5I_BADID) return out;  // no such group: nothing under it
  if (t != H5I_GROUP)
    throw Error(cat("file '", path_, "': '", group, "' is not a group"));
  Id gid(H5Gopen2(id_, g.empty() ? "/" : g.c_str(), H5P_DEFAULT));
  if (!gid.ok()) throw Error(cat("file '", path_, "': cannot open group '", group, "': ", h5_reason()));
  VisitCtx ctx{gid.get(), prefix, &out};
  if (H5Lvisit(gid.get(), H5_INDEX_NAME, H5_ITER_INC, visit_cb, &ctx) < 0) {
    if (ctx.too_deep)
      throw Error(cat("file '", path_, "': cannot list group '", norm_obj(group), "': groups nested more than ",
                      kMaxListDepth, " deep (a link cycle in a damaged file?)"));
    if (ctx.too_many)
      throw Error(cat("file '", path_, "': cannot list group '", norm_obj(group), "': more than ",
                      kMaxListLinks, " links"));
    throw Error(cat("file '", path_, "': cannot list group '", norm_obj(group), "': ", h5_reason()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

void File::write_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  init_library();
  write_any(id_, path_, name, shape, data, DType::F32);
}
void File::write_f64(const std::string& name, const std::vector<int64_t>& shape, const double* data) {
  init_library();
  write_any(id_, path_, name, shape, data, DType::F64);
}
void File::write_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
  init_library();
  write_any(id_, path_, name, shape, data, DType::I32);
}
void File::write_i64(const std::string& name, const std::vector<int64_t>& shape, const int64_t* data) {
  init_library();
  write_any(id_, path_, name, shape, data, DType::I64);
}
void File::write_u8(const std::string& name, const std::vector<int64_t>& shape, const uint8_t* data) {
  init_library();
  write_any(id_, path_, name, shape, data, DType::U8);
}

void File::read_f32(const std::string& name, const std::vector<int64_t>& expect, float* out) const {
  init_library();
  read_any(id_, path_, name, expect, out, DType::F32);
}
void File::read_f64(const std::string& name, const std::vector<int64_t>& expect, double* out) const {
  init_library();
  read_any(id_, path_, name, expect, out, DType::F64);
}
void File::read_i64(const std::string& name, const std::vector<int64_t>& expect, int64_t* out) const {
  init_library();
  read_any(id_, path_, name, expect, out, DType::I64);
}
void File::read_i32(const std::string& name, const std::vector<int64_t>& expect, int32_t* out) const {
  init_library();
  read_any(id_, path_, name, expect, out, DType::I32);
}

std::vector<std::string> File::read_strings(const std::string& name) const {
  init_library();
  Id ds(H5Dopen2(id_, name.c_str(), H5P_DEFAULT));
  if (!ds.ok()) throw Error(cat("file '", path_, "': no dataset '", name, "'"));
  Id type(H5Dget_type(ds.get()));
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw Error(cat("file '", path_, "': dataset '", name, "' has type ", type_desc(type.get()),
                    ", expected strings"));
  Id space(H5Dget_space(ds.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank != 1)
    throw Error(cat("file '", path_, "': dataset '", name, "' must be a 1-D array of strings"));
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  check_compact_size(ds.get(), type.get(), {static_cast<int64_t>(n)}, path_, name);
  std::vector<std::string> out(n);
  if (n == 0) return out;
  const H5T_cset_t cset = H5Tget_cset(type.get());
  if (H5Tis_variable_str(type.get()) > 0) {
    Id mt(H5Tcopy(H5T_C_S1));
    H5Tset_size(mt.get(), H5T_VARIABLE);
    H5Tset_cset(mt.get(), cset);
    std::vector<char*> ptrs(n, nullptr);
    if (H5Dread(ds.get(), mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
      throw Error(cat("file '", path_, "': cannot read strings '", name, "': ", h5_reason()));
    for (hsize_t i = 0; i < n; ++i) out[i] = ptrs[i] ? std::string(ptrs[i]) : std::string();
    H5Dvlen_reclaim(mt.get(), space.get(), H5P_DEFAULT, ptrs.data());
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  std::string buf(size * n, '\0');
  Id mt(H5Tcopy(type.get()));
  if (H5Dread(ds.get(), mt.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
    throw Error(cat("file '", path_, "': cannot read strings '", name, "': ", h5_reason()));
  for (hsize_t i = 0; i < n; ++i) {
    std::string v = buf.substr(i * size, size);
    const size_t end = v.find('\0');
    if (end != std::string::npos) v.resize(end);
    out[i] = v;
  }
  return out;
}

void File::read_u8(const std::string& name, const std::vector<int64_t>& expect, uint8_t* out) const {
  init_library();
  read_any(id_, path_, name, expect, out, DType::U8);
}

void File::read_i32_rows(const std::string& name, int64_t row0, int64_t nrows, int32_t* out) const {
  init_library();
  DatasetInfo info = inspect(id_, path_, name);
  check_dtype(info, DType::I32, path_, name);
  const size_t rank = info.shape.size();
  if (rank != 1 && rank != 2)
    throw Error(cat("file '", path_, "': dataset '", name, "' has shape ", shape_str(info.shape),
                    ", expected a 1-D or 2-D dataset"));
  const int64_t rows = info.shape[0];
  if (row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
    throw Error(cat("file '", path_, "': dataset '", name, "': rows [", row0, ", ", row0 + nrows,
                    ") are out of range for ", rows, " rows"));
  const int64_t row_len = rank == 2 ? info.shape[1] : 1;
  if (nrows == 0 || row_len == 0) return;
  if (out == nullptr) throw Error(cat("file '", path_, "': dataset '", name, "': no output buffer"));
  hsize_t start[2] = {static_cast<hsize_t>(row0), 0};
  hsize_t count[2] = {static_cast<hsize_t>(nrows), static_cast<hsize_t>(row_len)};
  if (H5Sselect_hyperslab(info.space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0)
    throw Error(cat("file '", path_, "': dataset '", name, "': cannot select rows [", row0, ", ",
                    row0 + nrows, "): ", h5_reason()));
  hsize_t mdims[1] = {static_cast<hsize_t>(nrows * row_len)};
  Id mem(H5Screate_simple(1, mdims, nullptr));
  if (!mem.ok())
    throw Error(cat("file '", path_, "': dataset '", name, "': cannot create memory space: ", h5_reason()));
  if (H5Dread(info.dset.get(), H5T_NATIVE_INT32, mem.get(), info.space.get(), H5P_DEFAULT, out) < 0)
    throw Error(cat("file '", path_, "': cannot read rows [", row0, ", ", row0 + nrows, ") of dataset '",
                    name, "': ", h5_reason()));
}

// ---- attributes -----------------------------------------------------------------------------------

namespace {

std::string attr_where(const std::string& path, const std::string& key, const std::string& obj) {
  return cat("file '", path, "': attribute '", key, "'", obj.empty() ? std::string() : cat(" of '", obj, "'"));
}

void require_object(hid_t file, const std::string& path, const std::string& key, const std::string& obj) {
  if (file < 0) throw Error(cat("HDF5 file '", path, "': file is closed (attribute '", key, "')"));
  if (!obj.empty() && object_type(file, obj) == H5I_BADID)
    throw Error(cat(attr_where(path, key, obj), ": object '", obj, "' not found"));
}

struct AttrInfo {
  Id attr, type, space;
};

AttrInfo open_attr(hid_t file, const std::string& path, const std::string& key, const std::string& obj) {
  require_object(file, path, key, obj);
  htri_t ex = H5Aexists_by_name(file, norm_obj(obj).c_str(), key.c_str(), H5P_DEFAULT);
  if (ex < 0) throw Error(cat(attr_where(path, key, obj), ": cannot query: ", h5_reason()));
  if (ex == 0) throw Error(cat(attr_where(path, key, obj), " not found"));
  AttrInfo a;
  a.attr = Id(H5Aopen_by_name(file, norm_obj(obj).c_str(), key.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.attr.ok()) throw Error(cat(attr_where(path, key, obj), ": cannot open: ", h5_reason()));
  a.type = Id(H5Aget_type(a.attr.get()));
  a.space = Id(H5Aget_space(a.attr.get()));
  if (!a.type.ok() || !a.space.ok())
    throw Error(cat(attr_where(path, key, obj), ": cannot read type/space: ", h5_reason()));
  // A single value: scalar, or a one-element array (as numpy writes np.array([x])).
  H5S_class_t sc = H5Sget_simple_extent_type(a.space.get());
  hssize_t n = H5Sget_simple_extent_npoints(a.space.get());
  if (sc == H5S_NULL || (sc == H5S_SIMPLE && n != 1))
    throw Error(cat(attr_where(path, key, obj), " holds ", sc == H5S_NULL ? 0 : n,
                    " values, expected a single value"));
  return a;
}

// Create (replacing any existing) a scalar attribute of the given file type and write `buf`.
void write_attr(hid_t file, const std::string& path, const std::string& key, const std::string& obj,
                hid_t ftype, hid_t mtype, const void* buf) {
  require_object(file, path, key, obj);
  const std::string o = norm_obj(obj);
  htri_t ex = H5Aexists_by_name(file, o.c_str(), key.c_str(), H5P_DEFAULT);
  if (ex < 0) throw Error(cat(attr_where(path, key, obj), ": cannot query: ", h5_reason()));
  if (ex > 0 && H5Adelete_by_name(file, o.c_str(), key.c_str(), H5P_DEFAULT) < 0)
    throw Error(cat(attr_where(path, key, obj), ": cannot replace: ", h5_reason()));
  Id space(H5Screate(H5S_SCALAR));
  if (!space.ok()) throw Error(cat(attr_where(path, key, obj), ": cannot create dataspace: ", h5_reason()));
  Id attr(H5Acreate_by_name(file, o.c_str(), key.c_str(), ftype, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT));
  if (!attr.ok()) throw Error(cat(attr_where(path, key, obj), ": cannot create: ", h5_reason()));
  if (H5Awrite(attr.get(), mtype, buf) < 0)
    throw Error(cat(attr_where(path, key, obj), ": cannot write: ", h5_reason()));
}

}  // namespace

bool File::has_attr(const std::string& key, const std::string& obj) const {
  init_library();
  if (id_ < 0) return false;
  if (!obj.empty() && object_type(id_, obj) == H5I_BADID) return false;
  return H5Aexists_by_name(id_, norm_obj(obj).c_str(), key.c_str(), H5P_DEFAULT) > 0;
}

void File::set_attr(const std::string& key, const std::string& value, const std::string& obj) {
  init_library();
  if (value.find('\0') != std::string::npos)
    throw Error(cat(attr_where(path_, key, obj), ": string values cannot contain NUL characters"));
  // Variable-length UTF-8: h5py reads it back as str.
  Id t(H5Tcopy(H5T_C_S1));
  if (!t.ok() || H5Tset_size(t.get(), H5T_VARIABLE) < 0 || H5Tset_cset(t.get(), H5T_CSET_UTF8) < 0 ||
      H5Tset_strpad(t.get(), H5T_STR_NULLTERM) < 0)
    throw Error(cat(attr_where(path_, key, obj), ": cannot create string type: ", h5_reason()));
  const char* p = value.c_str();
  write_attr(id_, path_, key, obj, t.get(), t.get(), &p);
}

void File::set_attr(const std::string& key, int64_t value, const std::string& obj) {
  init_library();
  write_attr(id_, path_, key, obj, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void File::set_attr(const std::string& key, double value, const std::string& obj) {
  init_library();
  write_attr(id_, path_, key, obj, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

std::string File::attr_string(const std::string& key, const std::string& obj) const {
  init_library();
  AttrInfo a = open_attr(id_, path_, key, obj);
  if (H5Tget_class(a.type.get()) != H5T_STRING)
    throw Error(cat(attr_where(path_, key, obj), " has type ", type_desc(a.type.get()),
                    ", expected a string"));
  H5T_cset_t cset = H5Tget_cset(a.type.get());
  if (H5Tis_variable_str(a.type.get()) > 0) {
    Id mt(H5Tcopy(H5T_C_S1));
    if (!mt.ok() || H5Tset_size(mt.get(), H5T_VARIABLE) < 0 || H5Tset_cset(mt.get(), cset) < 0)
      throw Error(cat(attr_where(path_, key, obj), ": cannot create string type: ", h5_reason()));
    char* p = nullptr;
    if (H5Aread(a.attr.get(), mt.get(), &p) < 0)
      throw Error(cat(attr_where(path_, key, obj), ": cannot read: ", h5_reason()));
    std::string s = p ? std::string(p) : std::string();
    if (p) H5free_memory(p);
    return s;
  }
  size_t size = H5Tget_size(a.type.get());
  H5T_str_t pad = H5Tget_strpad(a.type.get());
  Id mt(H5Tcopy(a.type.get()));
  if (!mt.ok()) throw Error(cat(attr_where(path_, key, obj), ": cannot copy string type: ", h5_reason()));
  std::string buf(size, '\0');
  if (size > 0 && H5Aread(a.attr.get(), mt.get(), buf.data()) < 0)
    throw Error(cat(attr_where(path_, key, obj), ": cannot read: ", h5_reason()));
  if (pad == H5T_STR_SPACEPAD) {
    size_t end = buf.find_last_not_of(' ');
    buf.resize(end == std::string::npos ? 0 : end + 1);
  } else {
    size_t end = buf.find('\0');
    if (end != std::string::npos) buf.resize(end);
  }
  return buf;
}

int64_t File::attr_int(const std::string& key, const std::string& obj) const {
  init_library();
  AttrInfo a = open_attr(id_, path_, key, obj);
  if (H5Tget_class(a.type.get()) != H5T_INTEGER)
    throw Error(cat(attr_where(path_, key, obj), " has type ", type_desc(a.type.get()),
                    ", expected an integer"));
  if (H5Tget_sign(a.type.get()) == H5T_SGN_NONE && H5Tget_size(a.type.get()) >= 8) {
    uint64_t u = 0;
    if (H5Aread(a.attr.get(), H5T_NATIVE_UINT64, &u) < 0)
      throw Error(cat(attr_where(path_, key, obj), ": cannot read: ", h5_reason()));
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error(cat(attr_where(path_, key, obj), " = ", u, " does not fit in int64"));
    return static_cast<int64_t>(u);
  }
  if (H5Tget_size(a.type.get()) > 8)
    throw Error(cat(attr_where(path_, key, obj), " has type ", type_desc(a.type.get()),
                    ", wider than int64"));
  int64_t v = 0;
  if (H5Aread(a.attr.get(), H5T_NATIVE_INT64, &v) < 0)
    throw Error(cat(attr_where(path_, key, obj), ": cannot read: ", h5_reason()));
  return v;
}

double File::attr_double(const std::string& key, const std::string& obj) const {
  init_library();
  {
    AttrInfo a = open_attr(id_, path_, key, obj);
    H5T_class_t c = H5Tget_class(a.type.get());
    if (c == H5T_FLOAT) {
      double v = 0;
      if (H5Aread(a.attr.get(), H5T_NATIVE_DOUBLE, &v) < 0)
        throw Error(cat(attr_where(path_, key, obj), ": cannot read: ", h5_reason()));
      return v;
    }
    if (c != H5T_INTEGER)
      throw Error(cat(attr_where(path_, key, obj), " has type ", type_desc(a.type.get()),
                      ", expected a number"));
  }
  return static_cast<double>(attr_int(key, obj));
}

// ---- atomic writes --------------------------------------------------------------------------------

namespace {

}  // namespace

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace nlp::h5
