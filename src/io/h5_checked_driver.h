// A read-only HDF5 file driver that passes every call through to libhdf5's own POSIX driver (sec2)
// and checks one structure on its way in: global heap collections, the blocks that hold
// variable-length data (strings in attributes such as model_type or id2label, string datasets).
//
// Why: libhdf5 1.10 (Debian 12 ships 1.10.8) walks the objects of a collection while decoding it and
// advances by each object's stored size; a free-space object whose size is 0 never advances, and the
// decode loops forever inside H5Aread/H5Dread (H5HG_read -> H5AC_protect -> H5C_protect -> the
// collection's deserialize callback), with no error and no way for the caller to interrupt it. Found
// by tests/fuzz/fuzz_h5file (corpus/h5file/regress-hang-vlen-string-attr-corrupt-global-heap). The
// driver sees the collection's bytes before libhdf5 decodes them, walks the objects the same way, and
// fails the read when the walk would not end or an object reaches past the collection's end, so the
// read fails with a message instead of hanging.
//
// libhdf5 reads global heap collections as raw data (H5F_block_read maps H5FD_MEM_GHEAP to
// H5FD_MEM_DRAW), so the check applies to every raw read that starts with a collection's signature
// "GCOL" and version 1; dataset bytes that happen to look like that are refused only when they also
// describe a collection whose object walk does not end, which valid data does not do by chance.
#pragma once
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace nlp::h5 {

// The driver's id (registered on first use; call after H5open). Use with H5Pset_driver(fapl, id,
// nullptr) on a file access property list for read-only opens. -1 with a libhdf5 other than 1.10
// (the driver is written against 1.10's driver struct): then read through the default driver.
hid_t checked_driver_id();

// Checks the global heap collection image at the start of `buf` (`n` bytes: `n` may be less than the
// collection when the rest was not read). `sizeof_size` is the file's size of lengths (superblock).
// Returns "" when it is acceptable (or not a collection), otherwise why it is damaged.
std::string check_global_heap(const uint8_t* buf, size_t n, unsigned sizeof_size);

}  // namespace nlp::h5
