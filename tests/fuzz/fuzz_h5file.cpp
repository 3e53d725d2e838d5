// libFuzzer harness: raw bytes as an HDF5 file, opened through the project's readers (TokenDataset,
// the weights' model config, h5::File listing, string attributes and string datasets). Unlike the
// other harnesses this one mostly exercises libhdf5's own file-format parser, whose crashes on
// malformed files nlptrain cannot prevent (README.md: what a run found); the one hang it found (a
// damaged global heap collection) is refused by the checked file driver every read goes through
// (io/h5_checked_driver.h), so that input is replayed with the corpus. It is built and its corpus
// replayed, but it is not part of the short CI fuzzing runs; use it for longer runs by hand.
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_util.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nlp_fuzz::scratch_path("raw.h5");
  nlp_fuzz::write_file(path, data, size);
  try {
    nlp::TokenDataset ds(path, 4, 256);
    const int64_t idx[2] = {0, ds.size() - 1};
    nlp::TokenBatch b;
    ds.read(idx, 2, b);
  } catch (const nlp::Error&) {
  }
  try {
    nlp::Config cfg;
    cfg.model.weights = path;
    nlp::resolve_model_config(cfg);
  } catch (const nlp::Error&) {
  }
  try {
    nlp::h5::File f = nlp::h5::File::open_read(path);
    for (const auto& name : f.list()) (void)f.shape(name);
  } catch (const nlp::Error&) {
  }
  // The string readers (variable-length data in global heap collections, where the hang was): the
  // string attributes nlptrain reads, and small 1-D datasets as the qa evaluation reads them.
  for (const char* key : {"model_type", "id2label", "nlptrain_seed"}) {
    try {
      (void)nlp::h5::File::open_read(path).attr_string(key);
    } catch (const nlp::Error&) {
    }
  }
  try {
    nlp::h5::File f = nlp::h5::File::open_read(path);
    for (const auto& name : f.list()) {
      try {
        const auto shape = f.shape(name);
        if (f.dtype(name) == nlp::h5::DType::Other && shape.size() == 1 && shape[0] <= 4096)
          (void)f.read_strings(name);
      } catch (const nlp::Error&) {
      }
    }
  } catch (const nlp::Error&) {
  }
  return 0;
}
