// libFuzzer harness: the HDF5 token-dataset reader (nlp::TokenDataset), on structured inputs.
// The fuzz bytes do not become the HDF5 file itself (that would mostly fuzz the HDF5 library's own
// file-format parser, see README.md); they choose the columns (input_ids, attention_mask, labels,
// token_type_ids, start/end_positions, tokens), each one's dtype, shape and values, which the
// project's own writer puts into a valid HDF5 file; then seq_len, vocab_size and the limits, and the
// example indices to read.
// Properties: the constructor and read() return or throw nlp::Error; an accepted dataset has >= 1
// example of length >= 1; every batch read holds exactly the values written (a reference model of
// both layouts), and every value is in its documented range.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "io/dataset.h"
#include "io/h5.h"

namespace {

struct Column {
  std::vector<int64_t> shape;
  nlp::h5::DType dtype = nlp::h5::DType::I32;
  std::vector<int32_t> values;  // as written (converted for other dtypes)
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

void check(bool ok, const std::string& what) {
  if (!ok) nlp_fuzz::fail(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using nlp::h5::DType;
  FuzzedDataProvider in(data, size);
  static const std::string path = nlp_fuzz::scratch_path("dataset.h5");
  const int64_t N = in.ConsumeIntegralInRange<int64_t>(0, 5);
  const int64_t T = in.ConsumeIntegralInRange<int64_t>(0, 6);
  const int vocab = in.ConsumeIntegralInRange<int>(-1, 40);
  // Values: mostly near the valid ranges, sometimes anything.
  auto value = [&]() -> int32_t {
    switch (in.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: return -100;
      case 1: return in.ConsumeIntegral<int32_t>();
      case 2: return in.ConsumeIntegralInRange<int32_t>(-2, 2);
      default: return in.ConsumeIntegralInRange<int32_t>(0, vocab > 0 ? vocab : 1);
    }
  };
  const char* names[] = {"input_ids", "attention_mask", "labels", "token_type_ids",
                         "start_positions", "end_positions", "tokens"};
  std::map<std::string, Column> cols;
  for (const char* name : names) {
    if (!in.ConsumeBool()) continue;
    Column c;
    const std::string n = name;
    // The natural shape most of the time, else any small shape of rank 0..3.
    if (in.ConsumeIntegralInRange<int>(0, 3) != 0) {
      if (n == "tokens") c.shape = {in.ConsumeIntegralInRange<int64_t>(0, 40)};
      else if (n == "start_positions" || n == "end_positions" || (n == "labels" && in.ConsumeBool()))
        c.shape = {N};
      else c.shape = {N, T};
    } else {
      const int rank = in.ConsumeIntegralInRange<int>(0, 3);
      for (int r = 0; r < rank; ++r) c.shape.push_back(in.ConsumeIntegralInRange<int64_t>(0, 6));
    }
    const int t = in.ConsumeIntegralInRange<int>(0, 9);
    c.dtype = t == 9 ? DType::F32 : t == 8 ? DType::I64 : t == 7 ? DType::U8 : t == 6 ? DType::F64 : DType::I32;
    c.values.resize(static_cast<size_t>(numel(c.shape)));
    for (auto& v : c.values) v = value();
    cols[n] = std::move(c);
  }
  const int seq_len = in.ConsumeIntegralInRange<int>(-1, 8);
  nlp::DatasetLimits limits;
  limits.label_range = in.ConsumeIntegralInRange<int>(-1, 12);
  limits.type_vocab = in.ConsumeIntegralInRange<int>(1, 3);  // callers pass type_vocab_size >= 1

  try {
    nlp::h5::File f = nlp::h5::File::create(path);
    for (auto& [name, c] : cols) {
      switch (c.dtype) {
        case DType::I32: f.write_i32(name, c.shape, c.values.data()); break;
        case DType::I64: {
          std::vector<int64_t> v(c.values.begin(), c.values.end());
          f.write_i64(name, c.shape, v.data());
          break;
        }
        case DType::U8: {
          std::vector<uint8_t> v(c.values.size());
          for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(c.values[i]);
          f.write_u8(name, c.shape, v.data());
          break;
        }
        case DType::F64: {
          std::vector<double> v(c.values.begin(), c.values.end());
          f.write_f64(name, c.shape, v.data());
          break;
        }
        default: {
          std::vector<float> v(c.values.begin(), c.values.end());
          f.write_f32(name, c.shape, v.data());
        }
      }
    }
    f.close();
  } catch (const nlp::Error&) {
    return 0;  // the writer refused this layout (e.g. a zero-sized dataset): not what is fuzzed here
  }

  std::unique_ptr<nlp::TokenDataset> ds;
  try {
    ds = std::make_unique<nlp::TokenDataset>(path, seq_len, vocab, limits);
  } catch (const nlp::Error&) {
    return 0;
  }
  // Accepted: the layout must be one of the two documented ones, with int32 columns.
  const int64_t n = ds->size();
  const int Tn = ds->seq_len();
  check(n >= 1 && Tn >= 1, "accepted a dataset with no examples or empty rows");
  check(vocab >= 1, "accepted vocab_size < 1");
  const int label_range = limits.label_range > 0 ? limits.label_range : vocab;
  const bool stream = ds->is_stream();
  const Column* ids = nullptr;
  if (stream) {
    check(!cols.count("input_ids") && cols.count("tokens"), "stream layout without a tokens column");
    ids = &cols["tokens"];
    check(ids->shape.size() == 1 && Tn == seq_len && n == (ids->shape[0] - 1) / Tn, "stream size");
  } else {
    ids = &cols["input_ids"];
    check(ids->shape == std::vector<int64_t>({n, Tn}), "2-D input_ids shape");
    check(seq_len == 0 || seq_len == Tn, "seq_len ignored");
  }
  check(ids->dtype == DType::I32, "accepted a non-int32 input column");
  for (auto& [name, c] : cols)
    if (!stream && name != "tokens" && c.dtype != DType::I32)
      check(false, "accepted a non-int32 column " + name);

  const int count = in.ConsumeIntegralInRange<int>(0, 6);
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (auto& i : idx)
    i = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-1, n) : in.ConsumeIntegralInRange<int64_t>(0, n - 1);
  nlp::TokenBatch b;
  try {
    ds->read(idx.data(), count, b);
  } catch (const nlp::Error&) {
    return 0;
  }
  check(b.n == count && b.T == Tn, "batch size");
  for (int k = 0; k < count; ++k) {
    const int64_t e = idx[static_cast<size_t>(k)];
    check(e >= 0 && e < n, "read accepted an out-of-range index");
    for (int j = 0; j < Tn; ++j) {
      const size_t at = static_cast<size_t>(k) * Tn + j;
      const int32_t id = b.input_ids[at];
      check(id >= 0 && id < vocab, "token id out of range accepted");
      const size_t src = stream ? static_cast<size_t>(e * Tn + j) : static_cast<size_t>(e * Tn + j);
      check(id == ids->values[src], "input_ids differ from the file");
      const int32_t m = b.attention_mask[at];
      check(m == 0 || m == 1, "mask value accepted");
      if (!stream && ds->has_token_labels()) {
        check(b.labels[at] == cols["labels"].values[src], "labels differ from the file");
        check(b.labels[at] == -100 || (b.labels[at] >= 0 && b.labels[at] < label_range), "label range");
      } else {
        check(b.labels[at] == id, "default labels are not the input ids");
      }
      if (!stream && cols.count("attention_mask")) check(m == cols["attention_mask"].values[src], "mask differs");
      if (!stream && cols.count("token_type_ids"))
        check(b.token_type_ids[at] == cols["token_type_ids"].values[src], "token types differ");
      check(b.token_type_ids[at] >= 0 && b.token_type_ids[at] < limits.type_vocab, "token type range");
    }
    if (stream) {
      check(b.label_next[k] == ids->values[static_cast<size_t>(e * Tn + Tn)], "label_next differs");
    } else {
      check(b.label_next[k] == -100, "label_next of a 2-D row");
      if (ds->has_seq_labels()) {
        const int32_t l = b.seq_labels[k];
        check(l == cols["labels"].values[static_cast<size_t>(e)], "sequence label differs");
        check(l == -100 || (l >= 0 && l < label_range), "sequence label range");
      }
      if (ds->has_positions()) {
        for (const char* col : {"start_positions", "end_positions"}) {
          const int32_t p = std::string(col) == "start_positions" ? b.start_positions[k] : b.end_positions[k];
          check(p == cols[col].values[static_cast<size_t>(e)], std::string(col) + " differs");
          check(p == -100 || (p >= 0 && p < Tn), std::string(col) + " range");
        }
      }
    }
  }
  return 0;
}
