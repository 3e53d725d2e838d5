// The checked read-only driver (h5_checked_driver.h): a pass-through to an inner sec2 file through
// libhdf5's public H5FD* calls, plus the global heap check on raw reads.
#include "io/h5_checked_driver.h"

#include <cstring>
#include <new>
#include <vector>

#include "core/error.h"

// The driver is written against libhdf5 1.10's H5FD_class_t (the version the loop was found in, and
// Debian 12's). Later versions changed that struct (1.14 adds a version, a class value and vector
// callbacks); with them checked_driver_id() is -1 and files are read through the default driver.
#define NLP_CHECKED_DRIVER (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10)

namespace nlp::h5 {

namespace {

// The file format's numbers (HDF5 File Format Specification, "Global Heap"): a collection starts
// with "GCOL", version 1, 3 reserved bytes and the collection size (a length); each object has a
// 2-byte index, a 2-byte reference count, 4 reserved bytes and its size (a length), then its data
// padded to 8 bytes. Index 0 is the free space at the end, whose size includes its own header.
constexpr uint8_t kGcol[4] = {'G', 'C', 'O', 'L'};
constexpr uint8_t kSignature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

uint64_t decode_length(const uint8_t* p, unsigned n) {  // little-endian; bytes past 8 ignored (as libhdf5)
  uint64_t v = 0;
  for (unsigned i = 0; i < n && i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

#if NLP_CHECKED_DRIVER
namespace {

struct CheckedFile {
  H5FD_t pub;              // first: libhdf5 fills it and hands us back a pointer to it
  H5FD_t* inner = nullptr;  // the sec2 file
  unsigned sizeof_size = 8;  // the superblock's "size of lengths" (8 unless the file says otherwise)
};

CheckedFile* self(H5FD_t* f) { return reinterpret_cast<CheckedFile*>(f); }
const CheckedFile* self(const H5FD_t* f) { return reinterpret_cast<const CheckedFile*>(f); }

void push_error(const std::string& msg) {
  H5Epush2(H5E_DEFAULT, __FILE__, "nlp::h5 checked driver", __LINE__, H5E_ERR_CLS, H5E_VFL, H5E_READERROR,
           "%s", msg.c_str());
}

H5FD_t* drv_open(const char* name, unsigned flags, hid_t /*fapl*/, haddr_t maxaddr) {
  if (flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT)) {
    push_error("the checked driver opens files read-only");
    return nullptr;
  }
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) return nullptr;
  H5FD_t* inner = H5Pset_fapl_sec2(fapl) < 0 ? nullptr : H5FDopen(name, flags, fapl, maxaddr);
  H5Pclose(fapl);
  if (inner == nullptr) return nullptr;
  auto* f = new (std::nothrow) CheckedFile();
  if (f == nullptr) {
    H5FDclose(inner);
    return nullptr;
  }
  f->inner = inner;
  return &f->pub;
}

herr_t drv_close(H5FD_t* file) {
  CheckedFile* f = self(file);
  const herr_t r = H5FDclose(f->inner);
  delete f;
  return r;
}

int drv_cmp(const H5FD_t* a, const H5FD_t* b) { return H5FDcmp(self(a)->inner, self(b)->inner); }

herr_t drv_query(const H5FD_t* file, unsigned long* flags) {
  // The same features as sec2 (the metadata accumulator does not see global heap reads: libhdf5
  // reads those as raw data, which bypasses it). Called once without a file to ask the class.
  if (file == nullptr) {
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
    return 0;
  }
  return H5FDquery(self(file)->inner, flags) < 0 ? -1 : 0;
}

haddr_t drv_get_eoa(const H5FD_t* file, H5FD_mem_t type) {
  return H5FDget_eoa(const_cast<H5FD_t*>(self(file)->inner), type);
}
herr_t drv_set_eoa(H5FD_t* file, H5FD_mem_t type, haddr_t addr) { return H5FDset_eoa(self(file)->inner, type, addr); }
haddr_t drv_get_eof(const H5FD_t* file, H5FD_mem_t type) {
  return H5FDget_eof(const_cast<H5FD_t*>(self(file)->inner), type);
}
herr_t drv_get_handle(H5FD_t* file, hid_t fapl, void** handle) {
  return H5FDget_vfd_handle(self(file)->inner, fapl, handle);
}

herr_t drv_read(H5FD_t* file, H5FD_mem_t type, hid_t /*dxpl*/, haddr_t addr, size_t size, void* buffer) {
  CheckedFile* f = self(file);
  if (H5FDread(f->inner, type, H5P_DEFAULT, addr, size, buffer) < 0) return -1;
  const auto* b = static_cast<const uint8_t*>(buffer);
  if (type == H5FD_MEM_SUPER && size >= 16 && std::memcmp(b, kSignature, 8) == 0) {
    // Superblock: version 0/1 keep the size of lengths at byte 14, version 2/3 at byte 10.
    const unsigned v = b[8], s = v <= 1 ? b[14] : b[10];
    if (s == 2 || s == 4 || s == 8 || s == 16 || s == 32) f->sizeof_size = s;
    return 0;
  }
  if ((type != H5FD_MEM_DRAW && type != H5FD_MEM_GHEAP) || size < 8 + f->sizeof_size ||
      std::memcmp(b, kGcol, 4) != 0 || b[4] != 1)
    return 0;
  // A global heap collection (or raw data that starts like one). libhdf5 first reads 4096 bytes,
  // then the rest when the collection is larger: check the whole collection here.
  const uint64_t total = decode_length(b + 8, f->sizeof_size);
  std::string why;
  if (total <= size) {
    why = check_global_heap(b, size, f->sizeof_size);
  } else {
    const haddr_t eoa = H5FDget_eoa(f->inner, type);
    if (eoa == HADDR_UNDEF || addr > eoa) return 0;
    // libhdf5 1.10 checks addr + size against the end of the file's address space, which a size
    // near 2^64 wraps around, and then allocates that size.
    if (total > eoa - addr) {
      push_error(cat("damaged global heap collection at byte ", addr, ": its size ", total,
                     " reaches past the end of the file's address space (", eoa, ")"));
      return -1;
    }
    std::vector<uint8_t> whole;
    try {
      whole.resize(static_cast<size_t>(total));
    } catch (const std::exception&) {
      push_error(cat("global heap collection at byte ", addr, ": cannot check ", total, " bytes"));
      return -1;
    }
    if (H5FDread(f->inner, type, H5P_DEFAULT, addr, whole.size(), whole.data()) < 0) return -1;
    why = check_global_heap(whole.data(), whole.size(), f->sizeof_size);
  }
  if (why.empty()) return 0;
  push_error(cat("damaged global heap collection at byte ", addr, ": ", why,
                 " (libhdf5 1.10 would loop forever or read past it; the file is damaged)"));
  return -1;
}

herr_t drv_write(H5FD_t*, H5FD_mem_t, hid_t, haddr_t, size_t, const void*) {
  push_error("the checked driver opens files read-only");
  return -1;
}

herr_t drv_flush(H5FD_t*, hid_t, hbool_t) { return 0; }  // nothing is ever written
herr_t drv_lock(H5FD_t* file, hbool_t rw) { return H5FDlock(self(file)->inner, rw); }
herr_t drv_unlock(H5FD_t* file) { return H5FDunlock(self(file)->inner); }

H5FD_class_t make_class() {
  H5FD_class_t c;
  std::memset(&c, 0, sizeof c);
  c.name = "nlptrain_checked_sec2";
  c.maxaddr = (haddr_t{1} << 63) - 1;  // as sec2 (64-bit off_t)
  c.fc_degree = H5F_CLOSE_WEAK;
  c.open = drv_open;
  c.close = drv_close;
  c.cmp = drv_cmp;
  c.query = drv_query;
  c.get_eoa = drv_get_eoa;
  c.set_eoa = drv_set_eoa;
  c.get_eof = drv_get_eof;
  c.get_handle = drv_get_handle;
  c.read = drv_read;
  c.write = drv_write;
  c.flush = drv_flush;
  c.lock = drv_lock;
  c.unlock = drv_unlock;
  const H5FD_mem_t map[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::memcpy(c.fl_map, map, sizeof map);
  return c;
}

}  // namespace
#endif  // NLP_CHECKED_DRIVER

std::string check_global_heap(const uint8_t* buf, size_t n, unsigned sizeof_size) {
  const uint64_t hdr = 8 + sizeof_size, objhdr = 8 + sizeof_size;
  if (n < hdr || std::memcmp(buf, kGcol, 4) != 0 || buf[4] != 1) return "";
  const uint64_t total = decode_length(buf + 8, sizeof_size);
  // libhdf5 1.10 only asserts the size (in debug builds); below the header's own size its object
  // count underflows to an allocation of ~2^64 bytes (fuzz_h5file, regress-global-heap-size-below-header).
  if (total < hdr) return cat("its size ", total, " is smaller than its own header (", hdr, " bytes)");
  const uint64_t end = total < n ? total : n;
  // Walk the objects as libhdf5's decoder does (H5HG__cache_heap_deserialize), over the bytes we
  // have; the part past `n` is not checked (only when `n` < the collection size).
  uint64_t off = hdr;
  while (off < total) {
    if (off + objhdr > total) break;  // too small for an object header: free space to the end
    if (off + objhdr > end) return "";  // not read: nothing more to check
    const uint8_t* p = buf + off;
    const unsigned idx = p[0] | (unsigned{p[1]} << 8);
    const uint64_t osize = decode_length(p + 8, sizeof_size);
    uint64_t need;
    if (idx > 0) {
      if (osize > total) return cat("object ", idx, " has size ", osize, ", larger than the collection (", total, " bytes)");
      need = objhdr + ((osize + 7) / 8) * 8;
    } else {
      need = osize;  // the free space object: its size includes its header
      if (need == 0) return cat("its free-space object at offset ", off, " has size 0");
    }
    if (need > total - off)
      return cat("object ", idx, " at offset ", off, " (", need, " bytes with its header) reaches past the end of the ",
                 total, "-byte collection");
    off += need;
  }
  return "";
}

hid_t checked_driver_id() {
#if NLP_CHECKED_DRIVER
  static const hid_t id = [] {
    static const H5FD_class_t cls = make_class();
    return H5FDregister(&cls);
  }();
  return id;
#else
  return -1;
#endif
}

}  // namespace nlp::h5
