// Tests of the HDF5 I/O layer: h5 wrappers, weights, checkpoints, token datasets, sampler, h5py interop.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/h5_checked_driver.h"
#include "io/weights.h"
#include "model/model.h"

namespace fs = std::filesystem;
using nlp::Error;
using nlp::NamedTensor;
using nlp::h5::DType;
using nlp::h5::File;

namespace {

class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "nlptrain_test_io_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    ASSERT_NE(::mkdtemp(buf.data()), nullptr);
    dir_ = buf.data();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string p(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string dir_;
};

// Runs fn, expects an nlp::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nmissing: " << part;
    return;
  }
  ADD_FAILURE() << "no nlp::Error thrown (expected one mentioning '" << (parts.empty() ? "" : parts[0]) << "')";
}

bool have_h5py() { return std::system("python3 -c 'import h5py' >/dev/null 2>&1") == 0; }

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

// ---- h5 wrappers ----------------------------------------------------------------------------------

TEST_F(IoTest, RoundTripEveryDtypeAndShapeBitwise) {
  const std::string path = p("rt.h5");
  std::vector<float> f32 = {0.0f, -0.0f, 1.5f, -3.25e-42f /* denormal */,
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  std::vector<double> f64 = {1.0 / 3.0, -1e308, 4.9e-324, -0.0};
  std::vector<int32_t> i32(12);
  std::iota(i32.begin(), i32.end(), -6);
  i32[0] = std::numeric_limits<int32_t>::min();
  i32[11] = std::numeric_limits<int32_t>::max();
  std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min()};
  std::vector<int64_t> i64v = {std::numeric_limits<int64_t>::max(), -1, 0, 42, 7, 8, 9, 10};
  std::vector<uint8_t> u8 = {0, 1, 127, 128, 255};
  std::vector<float> f32_3d(2 * 3 * 4);
  for (size_t i = 0; i < f32_3d.size(); ++i) f32_3d[i] = static_cast<float>(i) * 0.1f;
  {
    File f = File::create(path);
    f.write_f32("transformer.h.0.attn.c_attn.weight", {2, 3}, f32.data());
    f.write_f64("a/b/c.d", {4}, f64.data());
    f.write_i32("ints", {3, 4}, i32.data());
    f.write_i64("scalar", {}, i64.data());
    f.write_i64("a/i64", {2, 2, 2}, i64v.data());
    f.write_u8("bytes", {5}, u8.data());
    f.write_f32("three_d", {2, 3, 4}, f32_3d.data());
    f.write_f32("empty", {0, 4}, nullptr);
    f.close();
  }
  File f = File::open_read(path);
  EXPECT_TRUE(f.has("transformer.h.0.attn.c_attn.weight"));
  EXPECT_TRUE(f.has("a/b/c.d"));
  EXPECT_FALSE(f.has("a/b"));  // a group, not a dataset
  EXPECT_FALSE(f.has("nope"));
  EXPECT_FALSE(f.has("x/y/z"));
  EXPECT_FALSE(f.has("transformer"));  // dots are plain characters, not groups
  EXPECT_EQ(f.shape("scalar"), std::vector<int64_t>{});
  EXPECT_EQ(f.shape("a/i64"), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(f.shape("empty"), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(f.dtype("transformer.h.0.attn.c_attn.weight"), DType::F32);
  EXPECT_EQ(f.dtype("a/b/c.d"), DType::F64);
  EXPECT_EQ(f.dtype("ints"), DType::I32);
  EXPECT_EQ(f.dtype("scalar"), DType::I64);
  EXPECT_EQ(f.dtype("bytes"), DType::U8);
  EXPECT_EQ(f.list(), (std::vector<std::string>{"a/b/c.d", "a/i64", "bytes", "empty", "ints", "scalar",
                                                 "three_d", "transformer.h.0.attn.c_attn.weight"}));
  EXPECT_EQ(f.list("a"), (std::vector<std::string>{"a/b/c.d", "a/i64"}));
  EXPECT_EQ(f.list("a/b/"), (std::vector<std::string>{"a/b/c.d"}));
  EXPECT_TRUE(f.list("missing").empty());

  std::vector<float> rf32(6);
  f.read_f32("transformer.h.0.attn.c_attn.weight", {2, 3}, rf32.data());
  EXPECT_TRUE(same_bits(rf32, f32));
  std::vector<double> rf64(4);
  f.read_f64("a/b/c.d", {4}, rf64.data());
  EXPECT_TRUE(same_bits(rf64, f64));
  std::vector<int32_t> ri32(12);
  f.read_i32_rows("ints", 0, 3, ri32.data());
  EXPECT_EQ(ri32, i32);
  std::vector<int64_t> ri64(1);
  f.read_i64("scalar", {}, ri64.data());
  EXPECT_EQ(ri64, i64);
  std::vector<int64_t> ri64v(8);
  f.read_i64("a/i64", {2, 2, 2}, ri64v.data());
  EXPECT_EQ(ri64v, i64v);
  std::vector<uint8_t> ru8(5);
  f.read_u8("bytes", {5}, ru8.data());
  EXPECT_EQ(ru8, u8);
  std::vector<float> r3d(24);
  f.read_f32("three_d", {2, 3, 4}, r3d.data());
  EXPECT_TRUE(same_bits(r3d, f32_3d));
  f.read_f32("empty", {0, 4}, nullptr);
  EXPECT_EQ(nlp::h5::dtype_name(DType::F32), "float32");
  EXPECT_EQ(nlp::h5::dtype_name(DType::I64), "int64");
}

TEST_F(IoTest, AttributesOfEachType) {
  const std::string path = p("attrs.h5");
  {
    File f = File::create(path);
    float x = 1.0f;
    f.write_f32("grp/w", {1}, &x);
    f.set_attr("model_type", std::string("gpt2"));
    f.set_attr("unicode", std::string("h\xc3\xa9llo \xe2\x9c\x93"));
    f.set_attr("empty", std::string());
    f.set_attr("n_layer", int64_t{12});
    f.set_attr("big", std::numeric_limits<int64_t>::min());
    f.set_attr("eps", 1e-5);
    f.set_attr("replaced", int64_t{1});
    f.set_attr("replaced", std::string("now a string"));
    f.set_attr("note", std::string("on a dataset"), "grp/w");
    f.set_attr("scale", 0.5, "grp/w");
    f.close();
  }
  File f = File::open_read(path);
  EXPECT_TRUE(f.has_attr("model_type"));
  EXPECT_FALSE(f.has_attr("missing"));
  EXPECT_TRUE(f.has_attr("note", "grp/w"));
  EXPECT_FALSE(f.has_attr("note"));
  EXPECT_FALSE(f.has_attr("note", "no/such/object"));
  EXPECT_EQ(f.attr_string("model_type"), "gpt2");
  EXPECT_EQ(f.attr_string("unicode"), "h\xc3\xa9llo \xe2\x9c\x93");
  EXPECT_EQ(f.attr_string("empty"), "");
  EXPECT_EQ(f.attr_int("n_layer"), 12);
  EXPECT_EQ(f.attr_int("big"), std::numeric_limits<int64_t>::min());
  EXPECT_DOUBLE_EQ(f.attr_double("eps"), 1e-5);
  EXPECT_DOUBLE_EQ(f.attr_double("n_layer"), 12.0);  // ints convert
  EXPECT_EQ(f.attr_string("replaced"), "now a string");
  EXPECT_EQ(f.attr_string("note", "grp/w"), "on a dataset");
  EXPECT_DOUBLE_EQ(f.attr_double("scale", "grp/w"), 0.5);

  expect_error([&] { f.attr_int("missing"); }, {path, "missing"});
  expect_error([&] { f.attr_int("model_type"); }, {path, "model_type", "integer"});
  expect_error([&] { f.attr_string("n_layer"); }, {path, "n_layer", "string"});
  expect_error([&] { f.attr_int("eps"); }, {path, "eps", "float64"});
  expect_error([&] { f.attr_double("model_type"); }, {path, "model_type"});
  expect_error([&] { f.attr_string("x", "no/such"); }, {path, "no/such"});
}

TEST_F(IoTest, OpenErrors) {
  const std::string missing = p("does_not_exist.h5");
  expect_error([&] { File::open_read(missing); },
               {"cannot open HDF5 file '" + missing + "': no such file"});
  const std::string text = p("text.h5");
  std::ofstream(text) << "this is not an HDF5 file\n";
  expect_error([&] { File::open_read(text); }, {"cannot open HDF5 file '" + text + "'", "is not an HDF5 file"});
  expect_error([&] { File::open_read(dir_); }, {"cannot open HDF5 file '" + dir_ + "'"});
  expect_error([&] { File::create(p("no_dir/x/y.h5")); }, {p("no_dir/x/y.h5")});
}

TEST_F(IoTest, DatasetErrorsNameFileAndDataset) {
  const std::string path = p("errs.h5");
  std::vector<double> d(6, 1.0);
  std::vector<float> fl(6, 1.0f);
  {
    File f = File::create(path);
    f.write_f64("grp/doubles", {2, 3}, d.data());
    f.write_f32("floats", {2, 3}, fl.data());
    expect_error([&] { f.write_f32("floats", {2, 3}, fl.data()); }, {path, "floats", "already exists"});
    expect_error([&] { f.write_f32("neg", {-1, 3}, fl.data()); }, {path, "neg", "shape"});
  }
  File f = File::open_read(path);
  std::vector<float> out(6);
  expect_error([&] { f.read_f32("missing.weight", {2, 3}, out.data()); }, {path, "missing.weight", "not found"});
  expect_error([&] { f.shape("missing.weight"); }, {path, "missing.weight"});
  expect_error([&] { f.dtype("a/b/missing"); }, {path, "a/b/missing"});
  expect_error([&] { f.read_f32("grp", {2, 3}, out.data()); }, {path, "grp", "not a dataset"});
  expect_error([&] { f.read_f32("floats", {3, 2}, out.data()); },
               {path, "floats", "has shape [2, 3], expected [3, 2]"});
  expect_error([&] { f.read_f32("floats", {6}, out.data()); }, {path, "floats", "[2, 3]", "[6]"});
  expect_error([&] { f.read_f32("grp/doubles", {2, 3}, out.data()); },
               {path, "grp/doubles", "float64", "float32"});
  std::vector<double> dout(6);
  expect_error([&] { f.read_f64("floats", {2, 3}, dout.data()); }, {path, "floats", "float32", "float64"});
  std::vector<int64_t> iout(6);
  expect_error([&] { f.read_i64("floats", {2, 3}, iout.data()); }, {path, "floats", "int64"});
  std::vector<int32_t> i32(6);
  expect_error([&] { f.read_i32_rows("floats", 0, 1, i32.data()); }, {path, "floats", "int32"});
}

TEST_F(IoTest, HyperslabRows) {
  const std::string path = p("rows.h5");
  std::vector<int32_t> flat(10), grid(5 * 3);
  std::iota(flat.begin(), flat.end(), 100);
  std::iota(grid.begin(), grid.end(), 0);
  std::vector<int64_t> i64(4, 1);
  std::vector<int32_t> cube(8, 0);
  {
    File f = File::create(path);
    f.write_i32("flat", {10}, flat.data());
    f.write_i32("g/grid", {5, 3}, grid.data());
    f.write_i64("wide", {4}, i64.data());
    f.write_i32("cube", {2, 2, 2}, cube.data());
  }
  File f = File::open_read(path);
  std::vector<int32_t> out(10, -1);
  f.read_i32_rows("flat", 3, 4, out.data());
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 4), (std::vector<int32_t>{103, 104, 105, 106}));
  f.read_i32_rows("flat", 9, 1, out.data());
  EXPECT_EQ(out[0], 109);
  f.read_i32_rows("flat", 10, 0, out.data());  // empty read at the end is fine
  f.read_i32_rows("g/grid", 1, 2, out.data());
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 6), (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  f.read_i32_rows("g/grid", 4, 1, out.data());
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 3), (std::vector<int32_t>{12, 13, 14}));
  expect_error([&] { f.read_i32_rows("flat", 8, 3, out.data()); }, {path, "flat", "out of range"});
  expect_error([&] { f.read_i32_rows("flat", -1, 1, out.data()); }, {path, "flat", "out of range"});
  expect_error([&] { f.read_i32_rows("g/grid", 5, 1, out.data()); }, {path, "g/grid", "out of range"});
  expect_error([&] { f.read_i32_rows("wide", 0, 1, out.data()); }, {path, "wide", "int64", "int32"});
  expect_error([&] { f.read_i32_rows("cube", 0, 1, out.data()); }, {path, "cube", "1-D or 2-D"});
  expect_error([&] { f.read_i32_rows("nope", 0, 1, out.data()); }, {path, "nope"});
}

TEST_F(IoTest, AtomicWriteFailureLeavesNothing) {
  const std::string path = p("sub/dir/atomic.h5");
  EXPECT_THROW(nlp::h5::write_atomically(path,
                                         [](File& f) {
                                           float x = 1;
                                           f.write_f32("x", {1}, &x);
                                           throw Error("boom");
                                         }),
               Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(files_in(p("sub/dir")).empty());  // no temporary file left behind

  // Success: the file appears complete and no temporary remains; an existing file is replaced.
  for (int v = 1; v <= 2; ++v) {
    nlp::h5::write_atomically(path, [&](File& f) { f.set_attr("version", int64_t{v}); });
    EXPECT_EQ(files_in(p("sub/dir")), std::vector<std::string>{"atomic.h5"});
    EXPECT_EQ(File::open_read(path).attr_int("version"), v);
  }
  // A failed rewrite keeps the old file intact.
  EXPECT_THROW(nlp::h5::write_atomically(path, [](File&) { throw Error("boom"); }), Error);
  EXPECT_EQ(File::open_read(path).attr_int("version"), 2);
  EXPECT_EQ(files_in(p("sub/dir")), std::vector<std::string>{"atomic.h5"});
}

// ---- weights --------------------------------------------------------------------------------------

TEST_F(IoTest, SaveWeightsLoadTensorsRoundTrip) {
  const std::string path = p("model/weights.h5");
  std::vector<float> wte(6 * 4), bias(4), extra(3);
  for (size_t i = 0; i < wte.size(); ++i) wte[i] = std::sin(static_cast<float>(i));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = -static_cast<float>(i) / 7.0f;
  std::vector<NamedTensor> ts = {{"transformer.wte.weight", {6, 4}, wte.data()},
                                 {"transformer.h.0.ln_1.bias", {4}, bias.data()},
                                 {"lm_head.extra", {3}, extra.data()}};
  nlp::save_weights(path, ts, [](File& f) {
    f.set_attr("model_type", std::string("gpt2"));
    f.set_attr("n_embd", int64_t{4});
  });
  File f = File::open_read(path);
  EXPECT_EQ(f.attr_string("model_type"), "gpt2");
  EXPECT_EQ(f.attr_int("n_embd"), 4);
  std::vector<float> rw(24), rb(4);
  std::vector<NamedTensor> want = {{"transformer.wte.weight", {6, 4}, rw.data()},
                                   {"transformer.h.0.ln_1.bias", {4}, rb.data()}};
  auto unused = nlp::load_tensors(f, want);
  EXPECT_TRUE(same_bits(rw, wte));
  EXPECT_TRUE(same_bits(rb, bias));
  EXPECT_EQ(unused, std::vector<std::string>{"lm_head.extra"});

  std::vector<float> buf(24);
  expect_error([&] { nlp::load_tensors(f, {{"transformer.wpe.weight", {6, 4}, buf.data()}}); },
               {path, "transformer.wpe.weight"});
  expect_error([&] { nlp::load_tensors(f, {{"transformer.wte.weight", {4, 6}, buf.data()}}); },
               {"file '" + path + "': tensor 'transformer.wte.weight' has shape [6, 4], expected [4, 6]"});

  const std::string f64path = p("f64.h5");
  {
    File g = File::create(f64path);
    std::vector<double> d(4);
    g.write_f64("w", {4}, d.data());
  }
  File g = File::open_read(f64path);
  expect_error([&] { nlp::load_tensors(g, {{"w", {4}, buf.data()}}); }, {f64path, "'w'", "float64", "float32"});
}

// ---- checkpoints ----------------------------------------------------------------------------------

namespace {

struct FakeModel {
  std::vector<float> w, b, m_w, m_b, v_w, v_b;
  explicit FakeModel(float base) : w(12), b(3), m_w(12), m_b(3), v_w(12), v_b(3) {
    for (size_t i = 0; i < 12; ++i) {
      w[i] = base + i;
      m_w[i] = base * 0.1f + i;
      v_w[i] = base * 0.01f + i;
    }
    for (size_t i = 0; i < 3; ++i) {
      b[i] = -base - i;
      m_b[i] = -base * 0.1f - i;
      v_b[i] = base * 0.001f + i;
    }
  }
  std::vector<NamedTensor> params() { return {{"h.0.w", {4, 3}, w.data()}, {"h.0.b", {3}, b.data()}}; }
  std::vector<NamedTensor> m() { return {{"h.0.w", {4, 3}, m_w.data()}, {"h.0.b", {3}, m_b.data()}}; }
  std::vector<NamedTensor> v() { return {{"h.0.w", {4, 3}, v_w.data()}, {"h.0.b", {3}, v_b.data()}}; }
};

}  // namespace

TEST_F(IoTest, CheckpointRoundTrip) {
  FakeModel src(1.25f);
  nlp::TrainState st;
  st.step = 1234;
  st.next_batch = 5678;
  st.seed = 0xFFFFFFFFFFFFFFF1ull;
  st.world_size = 4;
  st.best_metric = 2.718281828459045;
  const std::string out = p("run");
  EXPECT_EQ(nlp::latest_checkpoint(out), "");
  const std::string written = nlp::save_checkpoint(
      out, st, src.params(), src.m(), src.v(),
      [](File& f) { f.set_attr("model_type", std::string("gpt2")); }, 3);
  EXPECT_EQ(written, (fs::path(out) / "checkpoints" / "step_00001234.h5").string());
  EXPECT_TRUE(fs::exists(written));
  EXPECT_EQ(nlp::latest_checkpoint(out), written);

  FakeModel dst(0.0f);
  std::fill(dst.w.begin(), dst.w.end(), 0.f);
  nlp::TrainState got = nlp::load_checkpoint(written, dst.params(), dst.m(), dst.v());
  EXPECT_EQ(got.step, 1234);
  EXPECT_EQ(got.next_batch, 5678);
  EXPECT_EQ(got.seed, 0xFFFFFFFFFFFFFFF1ull);
  EXPECT_EQ(got.world_size, 4);
  EXPECT_EQ(got.best_metric, 2.718281828459045);
  EXPECT_TRUE(same_bits(dst.w, src.w));
  EXPECT_TRUE(same_bits(dst.b, src.b));
  EXPECT_TRUE(same_bits(dst.m_w, src.m_w));
  EXPECT_TRUE(same_bits(dst.m_b, src.m_b));
  EXPECT_TRUE(same_bits(dst.v_w, src.v_w));
  EXPECT_TRUE(same_bits(dst.v_b, src.v_b));

  // A checkpoint is a valid weights file; its optimizer datasets are reported as unused by name.
  File f = File::open_read(written);
  EXPECT_EQ(f.attr_string("model_type"), "gpt2");
  EXPECT_TRUE(f.has("optimizer/exp_avg/h.0.w"));
  EXPECT_TRUE(f.has("optimizer/exp_avg_sq/h.0.b"));
  FakeModel w2(0.0f);
  EXPECT_EQ(nlp::load_tensors(f, w2.params()),
            (std::vector<std::string>{"optimizer/exp_avg/h.0.b", "optimizer/exp_avg/h.0.w",
                                      "optimizer/exp_avg_sq/h.0.b", "optimizer/exp_avg_sq/h.0.w"}));
  EXPECT_TRUE(same_bits(w2.w, src.w));
  auto unused = nlp::load_tensors(f, {{"h.0.w", {4, 3}, w2.m_w.data()}}, "optimizer/exp_avg/");
  EXPECT_EQ(unused, std::vector<std::string>{"optimizer/exp_avg/h.0.b"});

  // Shape mismatch on load names the tensor.
  std::vector<float> bad(12);
  expect_error([&] { nlp::load_checkpoint(written, {{"h.0.w", {3, 4}, bad.data()}}, {}, {}); },
               {written, "h.0.w", "[4, 3]", "[3, 4]"});
  // A weights file is not a checkpoint.
  const std::string plain = p("plain.h5");
  nlp::save_weights(plain, src.params(), nullptr);
  expect_error([&] { nlp::load_checkpoint(plain, src.params(), {}, {}); }, {plain, "nlptrain_step"});
}

// Tensor by tensor (what the trainer does, so that no rank holds the whole model state): the same
// datasets, bit for bit, as the whole-view save, read back through the streamed load in the writer's
// order; the streamed load checks shapes as the other does.
TEST_F(IoTest, CheckpointStreamedEqualsWhole) {
  FakeModel src(2.5f);
  nlp::TrainState st;
  st.step = 7;
  st.next_batch = 3;
  const std::string whole = nlp::save_checkpoint(p("whole"), st, src.params(), src.m(), src.v(), nullptr, 0);
  std::vector<NamedTensor> names;
  for (const auto& t : src.params()) names.push_back({t.name, t.shape, nullptr});
  std::vector<std::pair<int, size_t>> asked;
  const std::string streamed = nlp::save_checkpoint(
      p("streamed"), st, names,
      [&](int group, size_t i, float* out) {
        asked.emplace_back(group, i);
        const auto views = group == 0 ? src.params() : group == 1 ? src.m() : src.v();
        std::copy(views[i].data, views[i].data + views[i].numel(), out);
      },
      nullptr, 0);
  EXPECT_EQ(asked, (std::vector<std::pair<int, size_t>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}}));
  File a = File::open_read(whole), b = File::open_read(streamed);
  for (const char* name : {"h.0.w", "h.0.b", "optimizer/exp_avg/h.0.w", "optimizer/exp_avg/h.0.b",
                           "optimizer/exp_avg_sq/h.0.w", "optimizer/exp_avg_sq/h.0.b"}) {
    std::vector<float> x(12), y(12);
    const auto shape = a.shape(name);
    ASSERT_EQ(shape, b.shape(name)) << name;
    a.read_f32(name, shape, x.data());
    b.read_f32(name, shape, y.data());
    EXPECT_TRUE(same_bits(x, y)) << name;
  }
  FakeModel dst(0.0f);
  std::vector<std::pair<int, size_t>> got_order;
  const nlp::TrainState got = nlp::load_checkpoint(streamed, names, [&](int group, size_t i, const float* data) {
    got_order.emplace_back(group, i);
    auto views = group == 0 ? dst.params() : group == 1 ? dst.m() : dst.v();
    std::copy(data, data + views[i].numel(), views[i].data);
  });
  EXPECT_EQ(got_order, asked);
  EXPECT_EQ(got.step, 7);
  EXPECT_EQ(got.next_batch, 3);
  for (auto [x, y] : {std::pair{&dst.w, &src.w}, {&dst.b, &src.b}, {&dst.m_w, &src.m_w}, {&dst.m_b, &src.m_b},
                      {&dst.v_w, &src.v_w}, {&dst.v_b, &src.v_b}})
    EXPECT_TRUE(same_bits(*x, *y));
  std::vector<NamedTensor> wrong = names;
  wrong[0].shape = {3, 4};
  expect_error([&] { nlp::load_checkpoint(streamed, wrong, nullptr); }, {streamed, "h.0.w", "[4, 3]", "[3, 4]"});
}

TEST_F(IoTest, CheckpointRetentionKeepsNewest) {
  FakeModel m(1.0f);
  const std::string out = p("run");
  fs::create_directories(fs::path(out) / "checkpoints");
  const std::string other = (fs::path(out) / "checkpoints" / "notes.txt").string();
  std::ofstream(other) << "keep me\n";
  for (int64_t step : {10, 20, 30, 40}) {
    nlp::TrainState st;
    st.step = step;
    st.best_metric = std::numeric_limits<double>::infinity();  // the trainer's initial value
    nlp::save_checkpoint(out, st, m.params(), m.m(), m.v(), nullptr, 2);
  }
  EXPECT_EQ(files_in(p("run/checkpoints")),
            (std::vector<std::string>{"notes.txt", "step_00000030.h5", "step_00000040.h5"}));
  const std::string last = (fs::path(out) / "checkpoints" / "step_00000040.h5").string();
  EXPECT_EQ(nlp::latest_checkpoint(out), last);
  FakeModel d(0.0f);
  nlp::TrainState got = nlp::load_checkpoint(last, d.params(), d.m(), d.v());
  EXPECT_EQ(got.step, 40);
  EXPECT_TRUE(std::isinf(got.best_metric));
}

TEST_F(IoTest, LatestCheckpointIgnoresTemporaryFiles) {
  FakeModel m(1.0f);
  const std::string out = p("run");
  nlp::TrainState st;
  st.step = 5;
  const std::string good = nlp::save_checkpoint(out, st, m.params(), m.m(), m.v(), nullptr, 0);
  // A crashed writer's leftover with a higher step, and an unrelated file.
  std::ofstream(p("run/checkpoints/step_00000009.h5.tmp.12345")) << "partial";
  std::ofstream(p("run/checkpoints/step_x.h5")) << "junk";
  EXPECT_EQ(nlp::latest_checkpoint(out), good);
  st.step = 7;
  const std::string newer = nlp::save_checkpoint(out, st, m.params(), m.m(), m.v(), nullptr, 1);
  EXPECT_EQ(nlp::latest_checkpoint(out), newer);
  EXPECT_FALSE(fs::exists(good));
  EXPECT_TRUE(fs::exists(p("run/checkpoints/step_00000009.h5.tmp.12345")));  // never touched
  EXPECT_TRUE(fs::exists(p("run/checkpoints/step_x.h5")));
}

// ---- token datasets -------------------------------------------------------------------------------

namespace {

void write_2d(const std::string& path, int64_t n, int64_t T, const std::vector<int32_t>& ids,
              const std::vector<int32_t>* mask, const std::vector<int32_t>* labels) {
  File f = File::create(path);
  f.write_i32("input_ids", {n, T}, ids.data());
  if (mask) f.write_i32("attention_mask", {n, T}, mask->data());
  if (labels) f.write_i32("labels", {n, T}, labels->data());
}

}  // namespace

TEST_F(IoTest, TokenDataset2DWithoutMaskAndLabels) {
  const std::string path = p("ids.h5");
  const int64_t N = 7, T = 5;
  std::vector<int32_t> ids(N * T);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37) % 100);
  write_2d(path, N, T, ids, nullptr, nullptr);
  nlp::TokenDataset ds(path, 0, 100);
  EXPECT_FALSE(ds.is_stream());
  EXPECT_EQ(ds.size(), N);
  EXPECT_EQ(ds.seq_len(), T);
  nlp::TokenDataset ds2(path, 5, 100);  // explicit matching seq_len
  EXPECT_EQ(ds2.seq_len(), 5);

  const int64_t idx[] = {3, 4, 5, 0, 6, 2};
  nlp::TokenBatch b;
  ds.read(idx, 6, b);
  ASSERT_EQ(b.n, 6);
  ASSERT_EQ(b.T, 5);
  for (int k = 0; k < 6; ++k) {
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(b.input_ids[k * T + t], ids[idx[k] * T + t]);
      EXPECT_EQ(b.labels[k * T + t], ids[idx[k] * T + t]);
      EXPECT_EQ(b.attention_mask[k * T + t], 1);
    }
    EXPECT_EQ(b.label_next[k], -100);
  }
  ds.read(idx, 0, b);
  EXPECT_EQ(b.n, 0);
  EXPECT_TRUE(b.input_ids.empty());
  const int64_t bad[] = {7};
  expect_error([&] { ds.read(bad, 1, b); }, {path, "7"});

  expect_error([&] { nlp::TokenDataset(path, 8, 100); }, {path, "input_ids", "5", "8"});
}

TEST_F(IoTest, TokenDataset2DWithMaskAndLabels) {
  const std::string path = p("full.h5");
  const int64_t N = 4, T = 3;
  std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<int32_t> mask = {1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0};
  std::vector<int32_t> labels = {-100, 2, 3, 4, -100, -100, 7, 8, 9, -100, -100, -100};
  write_2d(path, N, T, ids, &mask, &labels);
  nlp::TokenDataset ds(path, 3, 13);
  const int64_t idx[] = {2, 0, 1};
  nlp::TokenBatch b;
  ds.read(idx, 3, b);
  for (int k = 0; k < 3; ++k)
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(b.input_ids[k * T + t], ids[idx[k] * T + t]);
      EXPECT_EQ(b.attention_mask[k * T + t], mask[idx[k] * T + t]);
      EXPECT_EQ(b.labels[k * T + t], labels[idx[k] * T + t]);  // -100 accepted
    }

  // Label out of range (not -100) and a bad mask value are rejected with file/row/value.
  std::vector<int32_t> bad_labels = labels;
  bad_labels[4] = -1;
  write_2d(p("badlab.h5"), N, T, ids, &mask, &bad_labels);
  nlp::TokenDataset dl(p("badlab.h5"), 0, 13);
  const int64_t one[] = {1};
  expect_error([&] { dl.read(one, 1, b); }, {p("badlab.h5"), "labels[row 1, pos 1] = -1"});
  std::vector<int32_t> bad_mask = mask;
  bad_mask[11] = 2;
  write_2d(p("badmask.h5"), N, T, ids, &bad_mask, &labels);
  nlp::TokenDataset dm(p("badmask.h5"), 0, 13);
  const int64_t three[] = {3};
  expect_error([&] { dm.read(three, 1, b); }, {p("badmask.h5"), "attention_mask[row 3, pos 2] = 2"});
  const int64_t zero[] = {0};
  dm.read(zero, 1, b);  // row 0 is fine

  // Mismatched column shape is rejected at open.
  {
    File f = File::create(p("shape.h5"));
    f.write_i32("input_ids", {4, 3}, ids.data());
    f.write_i32("labels", {3, 4}, labels.data());
  }
  expect_error([&] { nlp::TokenDataset(p("shape.h5"), 0, 13); }, {p("shape.h5"), "labels", "[3, 4]", "[4, 3]"});
}

TEST_F(IoTest, TokenDatasetOutOfRangeIdNamesFileRowValue) {
  const std::string path = p("oob.h5");
  const int64_t N = 20, T = 8;
  std::vector<int32_t> ids(N * T, 5);
  ids[12 * T + 3] = 50300;
  write_2d(path, N, T, ids, nullptr, nullptr);
  nlp::TokenDataset ds(path, 0, 50257);
  nlp::TokenBatch b;
  const int64_t idx[] = {11, 12, 13};
  expect_error([&] { ds.read(idx, 3, b); },
               {"file '" + path + "': input_ids[row 12, pos 3] = 50300 is out of range for vocab_size 50257"});
  const int64_t ok[] = {11, 13};
  ds.read(ok, 2, b);
  // Negative ids too.
  ids[12 * T + 3] = -1;
  write_2d(p("neg.h5"), N, T, ids, nullptr, nullptr);
  nlp::TokenDataset dn(p("neg.h5"), 0, 50257);
  expect_error([&] { dn.read(idx + 1, 1, b); }, {p("neg.h5"), "input_ids[row 12, pos 3] = -1"});
}

TEST_F(IoTest, TokenDatasetStreamWindows) {
  const std::string path = p("stream.h5");
  const int64_t L = 23;
  const int T = 4;  // N = (23-1)/4 = 5 windows
  std::vector<int32_t> tok(L);
  for (int64_t i = 0; i < L; ++i) tok[i] = static_cast<int32_t>((i * 7 + 3) % 50);
  {
    File f = File::create(path);
    f.write_i32("tokens", {L}, tok.data());
  }
  nlp::TokenDataset ds(path, T, 50);
  EXPECT_TRUE(ds.is_stream());
  EXPECT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.seq_len(), T);
  const int64_t idx[] = {4, 1, 2, 3, 0, 0};
  nlp::TokenBatch b;
  ds.read(idx, 6, b);
  ASSERT_EQ(b.n, 6);
  for (int k = 0; k < 6; ++k) {
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(b.input_ids[k * T + t], tok[idx[k] * T + t]) << "k=" << k << " t=" << t;
      EXPECT_EQ(b.labels[k * T + t], tok[idx[k] * T + t]);
      EXPECT_EQ(b.attention_mask[k * T + t], 1);
    }
    EXPECT_EQ(b.label_next[k], tok[idx[k] * T + T]);
  }
  // Last window's label_next is tokens[20]; tokens[21..22] are never used.
  EXPECT_EQ(b.label_next[0], tok[20]);

  expect_error([&] { nlp::TokenDataset(path, 0, 50); }, {path, "seq_len"});
  expect_error([&] { nlp::TokenDataset(path, 23, 50); }, {path, "23 tokens", "24"});
  nlp::TokenDataset exact(path, 22, 50);  // 23 tokens = exactly one window of 22 + 1
  EXPECT_EQ(exact.size(), 1);

  // An out-of-range token in the stream names file, position and value.
  tok[9] = 77;
  {
    File f = File::create(p("bad_stream.h5"));
    f.write_i32("tokens", {L}, tok.data());
  }
  nlp::TokenDataset bad(p("bad_stream.h5"), T, 50);
  const int64_t w2[] = {2};
  expect_error([&] { bad.read(w2, 1, b); }, {p("bad_stream.h5"), "tokens[9]", "77", "vocab_size 50"});
}

namespace {

void expect_same_batch(const nlp::TokenBatch& a, const nlp::TokenBatch& b) {
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.T, b.T);
  EXPECT_EQ(a.input_ids, b.input_ids);
  EXPECT_EQ(a.attention_mask, b.attention_mask);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.token_labels, b.token_labels);
  EXPECT_EQ(a.label_next, b.label_next);
  EXPECT_EQ(a.token_type_ids, b.token_type_ids);
  EXPECT_EQ(a.seq_labels, b.seq_labels);
  EXPECT_EQ(a.start_positions, b.start_positions);
  EXPECT_EQ(a.end_positions, b.end_positions);
}

}  // namespace

// data.cache_mb: a dataset held in memory gives exactly the batches read from the file, in every
// layout and with every column, checks its values as strictly, and is not held when too large.
TEST_F(IoTest, TokenDatasetHeldInMemoryReadsAsTheFile) {
  const int64_t N = 37, T = 6;
  std::vector<int32_t> ids(N * T), mask(N * T), labels(N * T), types(N * T), seq(N), start(N), end(N);
  for (int64_t i = 0; i < N * T; ++i) {
    ids[i] = static_cast<int32_t>((i * 13 + 5) % 29);
    mask[i] = (i % T) < 1 + (i / T) % T ? 1 : 0;
    labels[i] = i % 5 == 0 ? -100 : static_cast<int32_t>(i % 7);
    types[i] = (i % T) >= T / 2 ? 1 : 0;
  }
  for (int64_t r = 0; r < N; ++r) {
    seq[r] = static_cast<int32_t>(r % 3);
    start[r] = r % 4 == 0 ? -100 : static_cast<int32_t>(r % T);
    end[r] = r % 4 == 0 ? -100 : static_cast<int32_t>(std::min<int64_t>(T - 1, r % T + 1));
  }
  {
    File f = File::create(p("tok.h5"));  // token labels and segment ids (ner, mlm, pair inputs)
    f.write_i32("input_ids", {N, T}, ids.data());
    f.write_i32("attention_mask", {N, T}, mask.data());
    f.write_i32("labels", {N, T}, labels.data());
    f.write_i32("token_type_ids", {N, T}, types.data());
  }
  {
    File f = File::create(p("seq.h5"));  // sequence labels and answer spans
    f.write_i32("input_ids", {N, T}, ids.data());
    f.write_i32("attention_mask", {N, T}, mask.data());
    f.write_i32("labels", {N}, seq.data());
    f.write_i32("start_positions", {N}, start.data());
    f.write_i32("end_positions", {N}, end.data());
  }
  std::vector<int32_t> tok(N * T + 1);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 11 + 2) % 29);
  {
    File f = File::create(p("stream.h5"));
    f.write_i32("tokens", {int64_t(tok.size())}, tok.data());
  }
  // consecutive runs (coalesced reads), repeats, the first and last rows
  const std::vector<int64_t> idx = {36, 0, 1, 2, 17, 5, 5, 35, 36, 9, 10};
  const struct {
    std::string file;
    int seq_len;
    size_t bytes;
  } cases[] = {{p("tok.h5"), 0, 4 * size_t(N * T) * 4},
               {p("seq.h5"), 0, (2 * size_t(N * T) + 3 * size_t(N)) * 4},
               {p("stream.h5"), int(T), tok.size() * 4}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    nlp::TokenDataset from_file(c.file, c.seq_len, 29, {7, 2});
    nlp::TokenDataset held(c.file, c.seq_len, 29, {7, 2});
    EXPECT_EQ(held.column_bytes(), c.bytes);
    EXPECT_FALSE(held.hold_in_memory(c.bytes - 1));  // one byte short: stays on the file
    EXPECT_FALSE(held.in_memory());
    EXPECT_TRUE(held.hold_in_memory(c.bytes));
    EXPECT_TRUE(held.in_memory());
    nlp::TokenBatch a, b;
    from_file.read(idx.data(), int(idx.size()), a);
    held.read(idx.data(), int(idx.size()), b);
    expect_same_batch(a, b);
    EXPECT_EQ(held.lengths(), from_file.lengths());
    const std::vector<int32_t>& len = from_file.lengths();  // one past the last 1 of each row's mask
    ASSERT_EQ(int64_t(len.size()), from_file.size());
    for (int64_t r = 0; r < from_file.size(); ++r)
      EXPECT_EQ(len[size_t(r)], from_file.is_stream() ? T : 1 + r % T) << "row " << r;
    EXPECT_EQ(&len, &from_file.lengths()) << "lengths() read again";  // kept for the next evaluation
    held.validate(0, 1);
  }
  // A bad value in memory is reported as from the file: file, column, row and value.
  ids[12 * T + 3] = 40;
  write_2d(p("bad.h5"), N, T, ids, &mask, &labels);
  nlp::TokenDataset bad(p("bad.h5"), 0, 29, {7, 2});
  ASSERT_TRUE(bad.hold_in_memory(size_t(1) << 20));
  const int64_t row12[] = {12};
  nlp::TokenBatch b;
  expect_error([&] { bad.read(row12, 1, b); },
               {"file '" + p("bad.h5") + "': input_ids[row 12, pos 3] = 40 is out of range for vocab_size 29"});
  expect_error([&] { bad.validate(0, 1); }, {p("bad.h5"), "row 12"});
}

TEST_F(IoTest, TokenDatasetLayoutAndDtypeErrors) {
  // int64 input_ids are rejected naming the dtype.
  {
    File f = File::create(p("i64.h5"));
    std::vector<int64_t> ids(6, 1);
    f.write_i64("input_ids", {2, 3}, ids.data());
  }
  expect_error([&] { nlp::TokenDataset(p("i64.h5"), 0, 10); }, {p("i64.h5"), "input_ids", "int64", "int32"});
  // Neither layout: the error lists what the file has.
  {
    File f = File::create(p("neither.h5"));
    std::vector<int32_t> x(4, 1);
    f.write_i32("ids", {4}, x.data());
    f.write_i32("g/text", {2, 2}, x.data());
  }
  expect_error([&] { nlp::TokenDataset(p("neither.h5"), 4, 10); },
               {p("neither.h5"), "input_ids", "tokens", "g/text", "ids"});
  // 1-D input_ids is not a 2-D layout.
  {
    File f = File::create(p("flat_ids.h5"));
    std::vector<int32_t> x(4, 1);
    f.write_i32("input_ids", {4}, x.data());
  }
  expect_error([&] { nlp::TokenDataset(p("flat_ids.h5"), 0, 10); }, {p("flat_ids.h5"), "input_ids", "2-D"});
  expect_error([&] { nlp::TokenDataset(p("missing.h5"), 0, 10); }, {p("missing.h5"), "no such file"});
}

// ---- sampler --------------------------------------------------------------------------------------

TEST_F(IoTest, SamplerRanksTogetherEqualOneRank) {
  const int64_t N = 40;
  for (bool shuffle : {false, true}) {
    nlp::Sampler single(N, 6, 0, 1, 99, shuffle);
    nlp::Sampler r0(N, 3, 0, 2, 99, shuffle), r1(N, 3, 1, 2, 99, shuffle);
    EXPECT_EQ(single.batches_per_epoch(), 6);
    EXPECT_EQ(r0.batches_per_epoch(), 6);
    for (int64_t g = 0; g < 20; ++g) {
      auto all = single.indices(g);
      auto a = r0.indices(g), b = r1.indices(g);
      std::vector<int64_t> joined = a;
      joined.insert(joined.end(), b.begin(), b.end());
      EXPECT_EQ(joined, all) << "global batch " << g << " shuffle " << shuffle;
    }
  }
}

TEST_F(IoTest, SamplerShuffleIsDeterministicPermutationAndRollsOver) {
  const int64_t N = 25;
  const int B = 4;  // bpe = 6, 1 example dropped per epoch
  nlp::Sampler s(N, B, 0, 1, 1234, true);
  ASSERT_EQ(s.batches_per_epoch(), 6);
  auto epoch_order = [&](nlp::Sampler& smp, int64_t epoch) {
    std::vector<int64_t> out;
    for (int64_t g = epoch * 6; g < (epoch + 1) * 6; ++g) {
      auto v = smp.indices(g);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  auto e0 = epoch_order(s, 0), e1 = epoch_order(s, 1);
  ASSERT_EQ(e0.size(), 24u);
  std::set<int64_t> u0(e0.begin(), e0.end()), u1(e1.begin(), e1.end());
  EXPECT_EQ(u0.size(), 24u);  // no repeats within an epoch
  EXPECT_EQ(u1.size(), 24u);
  for (auto i : e0) EXPECT_TRUE(i >= 0 && i < N);
  EXPECT_NE(e0, e1);  // epochs are reshuffled
  std::vector<int64_t> ident(24);
  std::iota(ident.begin(), ident.end(), 0);
  EXPECT_NE(e0, ident);

  // Deterministic: a fresh sampler (and access in any order) gives the same batches.
  nlp::Sampler t(N, B, 0, 1, 1234, true);
  EXPECT_EQ(t.indices(7), s.indices(7));
  EXPECT_EQ(t.indices(0), s.indices(0));
  EXPECT_EQ(epoch_order(t, 1), e1);
  nlp::Sampler other_seed(N, B, 0, 1, 1235, true);
  EXPECT_NE(epoch_order(other_seed, 0), e0);

  // No shuffle: identity order, rolling over each epoch.
  nlp::Sampler plain(N, B, 0, 1, 1234, false);
  EXPECT_EQ(plain.indices(0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(plain.indices(5), (std::vector<int64_t>{20, 21, 22, 23}));
  EXPECT_EQ(plain.indices(6), (std::vector<int64_t>{0, 1, 2, 3}));

  expect_error([] { nlp::Sampler(5, 3, 0, 2, 1, true); }, {"5 examples", "6"});
  expect_error([] { nlp::Sampler(10, 2, 2, 2, 1, true); }, {"rank 2"});
}

// ---- h5py interop ---------------------------------------------------------------------------------

TEST_F(IoTest, ReadsFileWrittenByH5py) {
  if (!have_h5py()) GTEST_SKIP() << "python3 with h5py is not available";
  const std::string path = p("from_h5py.h5");
  const std::string cmd =
      "python3 -c 'import sys, h5py, numpy as np\n"
      "f = h5py.File(sys.argv[1], \"w\")\n"
      "f.attrs[\"model_type\"] = \"gpt2\"\n"
      "f.attrs[\"fixed\"] = np.bytes_(b\"bert\")\n"
      "f.attrs[\"n_layer\"] = 12\n"
      "f.attrs[\"eps\"] = 1e-5\n"
      "f.create_dataset(\"input_ids\", data=np.arange(12, dtype=np.int32).reshape(3, 4))\n"
      "f.create_dataset(\"tokens\", data=np.arange(9, dtype=np.int32))\n"
      "f.create_dataset(\"half\", data=np.zeros(3, dtype=np.float16))\n"
      "f.close()' " +
      path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  File f = File::open_read(path);
  EXPECT_EQ(f.attr_string("model_type"), "gpt2");
  EXPECT_EQ(f.attr_string("fixed"), "bert");
  EXPECT_EQ(f.attr_int("n_layer"), 12);
  EXPECT_DOUBLE_EQ(f.attr_double("eps"), 1e-5);
  EXPECT_EQ(f.dtype("input_ids"), DType::I32);
  EXPECT_EQ(f.shape("input_ids"), (std::vector<int64_t>{3, 4}));
  std::vector<int32_t> rows(8);
  f.read_i32_rows("input_ids", 1, 2, rows.data());
  EXPECT_EQ(rows, (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(f.dtype("half"), DType::Other);
  std::vector<float> h(3);
  expect_error([&] { f.read_f32("half", {3}, h.data()); }, {path, "half", "float16", "float32"});
  nlp::TokenDataset ds(path, 0, 100);  // input_ids takes precedence over tokens
  EXPECT_EQ(ds.size(), 3);
}

TEST_F(IoTest, H5pyReadsOurFile) {
  if (!have_h5py()) GTEST_SKIP() << "python3 with h5py is not available";
  const std::string path = p("ours.h5");
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f};
  nlp::save_weights(path, {{"transformer.h.0.attn.c_attn.weight", {2, 2}, w.data()}}, [](File& f) {
    f.set_attr("model_type", std::string("gpt2"));
    f.set_attr("n_layer", int64_t{12});
    f.set_attr("layer_norm_epsilon", 1e-5);
  });
  const std::string cmd =
      "python3 -c 'import sys, h5py, numpy as np\n"
      "f = h5py.File(sys.argv[1], \"r\")\n"
      "v = f.attrs[\"model_type\"]\n"
      "assert isinstance(v, str) and v == \"gpt2\", repr(v)\n"
      "assert int(f.attrs[\"n_layer\"]) == 12\n"
      "assert abs(float(f.attrs[\"layer_norm_epsilon\"]) - 1e-5) < 1e-12\n"
      "d = f[\"transformer.h.0.attn.c_attn.weight\"]\n"
      "assert d.dtype == np.float32 and d.shape == (2, 2), (d.dtype, d.shape)\n"
      "assert (d[()] == np.array([[1.5, -2.0], [3.25, 0.0]], dtype=np.float32)).all()\n"
      "' " +
      path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// ---- model configuration from a weights file's root attributes (found by tests/fuzz/fuzz_weights) ----

namespace {

void write_gpt2_attrs(File& f) {
  f.set_attr("model_type", std::string("gpt2"));
  f.set_attr("vocab_size", int64_t{256});
  f.set_attr("n_layer", int64_t{2});
  f.set_attr("n_head", int64_t{4});
  f.set_attr("n_embd", int64_t{64});
  f.set_attr("n_positions", int64_t{128});
  f.set_attr("layer_norm_epsilon", 1e-5);
  f.set_attr("embd_pdrop", 0.0);
  f.set_attr("attn_pdrop", 0.1);
  f.set_attr("resid_pdrop", 0.2);
  f.set_attr("initializer_range", 0.02);
}

nlp::Config gpt2_config(const std::string& weights) {
  nlp::Config c;
  c.model.weights = weights;
  return c;
}

}  // namespace

TEST_F(IoTest, ModelConfigFromWeightsAttributes) {
  {
    File f = File::create(p("w.h5"));
    write_gpt2_attrs(f);
  }
  const nlp::ModelConfig mc = nlp::resolve_model_config(gpt2_config(p("w.h5")));
  EXPECT_EQ(mc.vocab_size, 256);
  EXPECT_EQ(mc.n_layer, 2);
  EXPECT_EQ(mc.n_head, 4);
  EXPECT_EQ(mc.n_embd, 64);
  EXPECT_EQ(mc.n_positions, 128);
  EXPECT_FLOAT_EQ(mc.layer_norm_epsilon, 1e-5f);
  EXPECT_FLOAT_EQ(mc.resid_pdrop, 0.2f);
}

// Sizes wider than int used to wrap around: n_layer = 2^32 - 1 became -1, n_embd = 2^32 + 64 became 64.
TEST_F(IoTest, ModelConfigRejectsSizesThatDoNotFitInt) {
  for (int64_t bad : {(int64_t{1} << 32) - 1, (int64_t{1} << 32) + 64, int64_t{1} << 31}) {
    {
      File f = File::create(p("w.h5"));
      write_gpt2_attrs(f);
      f.set_attr("n_embd", bad);
    }
    expect_error([&] { nlp::resolve_model_config(gpt2_config(p("w.h5"))); },
                 {p("w.h5"), "n_embd", std::to_string(bad), "too large"});
  }
}

// Float attributes get the INI schema's ranges: a NaN, negative or overflowing epsilon and a dropout
// probability outside [0, 1) (also one that rounds to 1 as a float) used to be accepted.
TEST_F(IoTest, ModelConfigRejectsOutOfRangeFloatAttributes) {
  const std::vector<std::pair<std::string, double>> bad = {
      {"layer_norm_epsilon", std::nan("")}, {"layer_norm_epsilon", -1e-5},  {"layer_norm_epsilon", 1e300},
      {"layer_norm_epsilon", 1e-300},       {"initializer_range", 0.0},     {"embd_pdrop", 1.5},
      {"attn_pdrop", -0.1},                 {"resid_pdrop", 0.9999999999}, {"resid_pdrop", INFINITY}};
  for (const auto& [key, value] : bad) {
    {
      File f = File::create(p("w.h5"));
      write_gpt2_attrs(f);
      f.set_attr(key, value);
    }
    expect_error([&] { nlp::resolve_model_config(gpt2_config(p("w.h5"))); },
                 {p("w.h5"), key, "out of range"});
  }
  // A dropout set in the INI wins over the file's (training choice), so the file's value is not used.
  {
    File f = File::create(p("w.h5"));
    write_gpt2_attrs(f);
    f.set_attr("embd_pdrop", 1.5);
  }
  nlp::Config c = gpt2_config(p("w.h5"));
  c.model.embd_pdrop = 0.25f;
  c.explicitly_set.insert("model.embd_pdrop");
  EXPECT_FLOAT_EQ(nlp::resolve_model_config(c).embd_pdrop, 0.25f);
}

// Listing is bounded (found by tests/fuzz/fuzz_h5file: a damaged file whose group links to itself
// made H5Lvisit recurse without end). Nesting deeper than 32 groups is an error naming the file.
TEST_F(IoTest, ListingRejectsGroupsNestedTooDeep) {
  const float x = 1.f;
  std::string deep, ok;
  for (int i = 0; i < 40; ++i) deep += "g/";
  for (int i = 0; i < 8; ++i) ok += "g/";
  {
    File f = File::create(p("deep.h5"));
    f.write_f32(ok + "w", {1}, &x);
    f.write_f32(deep + "w", {1}, &x);
  }
  File f = File::open_read(p("deep.h5"));
  expect_error([&] { f.list(); }, {p("deep.h5"), "nested more than 32"});
  {
    File g = File::create(p("ok.h5"));
    g.write_f32(ok + "w", {1}, &x);
  }
  EXPECT_EQ(File::open_read(p("ok.h5")).list(), std::vector<std::string>{ok + "w"});
}

namespace {

// Zeroes the size of the free-space object (index 0) of the first global heap collection in the
// file at `path`: the damage found by tests/fuzz/fuzz_h5file on which libhdf5 1.10 loops forever.
void zero_global_heap_free_space(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find("GCOL\x01", 0, 5);
  ASSERT_NE(at, std::string::npos) << path << " has no global heap collection";
  uint64_t total = 0;
  std::memcpy(&total, bytes.data() + at + 8, 8);  // little-endian, 8-byte lengths
  size_t off = at + 16;
  while (off + 16 <= at + total) {
    const unsigned idx = uint8_t(bytes[off]) | (unsigned(uint8_t(bytes[off + 1])) << 8);
    uint64_t size = 0;
    std::memcpy(&size, bytes.data() + off + 8, 8);
    if (idx == 0) {
      const uint64_t zero = 0;
      f.seekp(static_cast<std::streamoff>(off + 8));
      f.write(reinterpret_cast<const char*>(&zero), 8);
      return;
    }
    off += 16 + (size + 7) / 8 * 8;
  }
  FAIL() << path << ": no free-space object in the collection at byte " << at;
}

// Runs fn on another thread and fails the whole test binary if it has not returned after 30 s (a
// hang inside libhdf5 cannot be interrupted).
void within_30s(const std::function<void()>& fn) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([fn, done] {
    fn();
    done->store(true);
  });
  for (int i = 0; i < 300 && !done->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!done->load()) {
    std::fprintf(stderr, "FATAL: a read of a damaged global heap did not return within 30 s (hang in libhdf5)\n");
    std::_Exit(1);
  }
  t.join();
}

}  // namespace

// A variable-length string (attribute or dataset) lives in a global heap collection; libhdf5 1.10
// loops forever decoding a collection whose free-space object has size 0 (fuzz_h5file,
// corpus/h5file/regress-hang-vlen-string-attr-corrupt-global-heap). Files are read through the
// checked driver, which refuses such a collection: an error naming the file and the attribute or
// dataset, at once.
TEST_F(IoTest, DamagedGlobalHeapIsAnErrorNotAHang) {
  {
    File f = File::create(p("attr.h5"));
    f.set_attr("model_type", std::string("gpt2"));
    f.set_attr("n_layer", int64_t{2});
  }
  {
    File f = File::open_read(p("attr.h5"));
    EXPECT_EQ(f.attr_string("model_type"), "gpt2");
  }
  zero_global_heap_free_space(p("attr.h5"));
  within_30s([&] {
    File f = File::open_read(p("attr.h5"));
    EXPECT_EQ(f.attr_int("n_layer"), 2);  // the rest of the file still reads
    expect_error([&] { f.attr_string("model_type"); },
                 {p("attr.h5"), "attribute 'model_type'", "damaged global heap collection"});
    nlp::Config cfg;
    cfg.model.weights = p("attr.h5");
    expect_error([&] { nlp::resolve_model_config(cfg); }, {p("attr.h5"), "model_type", "global heap"});
  });

  // A string dataset (as h5py writes a list of str) read with read_strings.
  {
    File f = File::create(p("strings.h5"));
    const float x = 1.f;
    f.write_f32("x", {1}, &x);
  }
  {
    hid_t fid = H5Fopen(p("strings.h5").c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(fid, 0);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hsize_t n = 2;
    hid_t sp = H5Screate_simple(1, &n, nullptr);
    hid_t d = H5Dcreate2(fid, "names", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const char* v[2] = {"alpha", "beta"};
    ASSERT_GE(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
    H5Dclose(d);
    H5Sclose(sp);
    H5Tclose(t);
    H5Fclose(fid);
  }
  EXPECT_EQ(File::open_read(p("strings.h5")).read_strings("names"), (std::vector<std::string>{"alpha", "beta"}));
  zero_global_heap_free_space(p("strings.h5"));
  within_30s([&] {
    File f = File::open_read(p("strings.h5"));
    expect_error([&] { f.read_strings("names"); }, {p("strings.h5"), "'names'", "damaged global heap collection"});
  });
}

// A collection size that libhdf5 1.10 turns into an allocation of ~2^64 bytes: below the header's own
// size (its object count underflows; fuzz_h5file, regress-global-heap-size-below-header) or past the
// end of the file (addr + size wraps around its end-of-file check).
TEST_F(IoTest, GlobalHeapSizeOutOfRangeIsAnError) {
  for (const uint64_t size : {uint64_t{15}, ~uint64_t{0} - 0x7fff}) {
    const std::string path = p("size.h5");
    {
      File f = File::create(path);
      f.set_attr("model_type", std::string("gpt2"));
    }
    {
      std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(io)), std::istreambuf_iterator<char>());
      const size_t at = bytes.find("GCOL\x01", 0, 5);
      ASSERT_NE(at, std::string::npos);
      io.seekp(static_cast<std::streamoff>(at + 8));
      io.write(reinterpret_cast<const char*>(&size), 8);
    }
    File f = File::open_read(path);
    expect_error([&] { f.attr_string("model_type"); },
                 {path, "attribute 'model_type'", "damaged global heap collection",
                  size == 15 ? "smaller than its own header" : "past the end of the file"});
  }
}

// The checked driver reads collections larger than libhdf5's first 4096-byte read whole, and leaves
// valid files alone.
TEST_F(IoTest, CheckedDriverReadsLargeStringAttributes) {
  std::string big(20000, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char('a' + i % 26);
  {
    File f = File::create(p("big.h5"));
    f.set_attr("id2label", big);
    f.set_attr("model_type", std::string("bert"));
  }
  File f = File::open_read(p("big.h5"));
  EXPECT_EQ(f.attr_string("id2label"), big);
  EXPECT_EQ(f.attr_string("model_type"), "bert");
}

TEST(GlobalHeapCheck, WalksObjectsAsLibhdf5Does) {
  using nlp::h5::check_global_heap;
  // A 4096-byte collection: object 1 (5 bytes, padded to 8), then free space to the end.
  std::vector<uint8_t> c(4096, 0);
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) c[at + i] = uint8_t(v >> (8 * i));
  };
  std::memcpy(c.data(), "GCOL\x01", 5);
  put(8, 4096, 8);
  put(16, 1, 2);
  put(24, 5, 8);
  put(40, 0, 2);  // object 1: 16-byte header + 8 bytes
  put(48, 4096 - 40, 8);
  EXPECT_EQ(check_global_heap(c.data(), c.size(), 8), "");
  EXPECT_EQ(check_global_heap(c.data(), 100, 8), "");  // only the start read: nothing wrong in it
  put(48, 0, 8);                                        // free space of size 0: libhdf5 loops
  EXPECT_NE(check_global_heap(c.data(), c.size(), 8).find("size 0"), std::string::npos);
  put(48, 4096, 8);  // free space past the end
  EXPECT_NE(check_global_heap(c.data(), c.size(), 8).find("past the end"), std::string::npos);
  put(48, 4096 - 40, 8);
  put(24, ~uint64_t{0} - 3, 8);  // an object size that would wrap the walk around
  EXPECT_NE(check_global_heap(c.data(), c.size(), 8), "");
  put(8, 15, 8);  // smaller than the collection's own header
  EXPECT_NE(check_global_heap(c.data(), c.size(), 8).find("smaller than its own header"), std::string::npos);
  c[0] = 'X';  // not a collection: not checked
  EXPECT_EQ(check_global_heap(c.data(), c.size(), 8), "");
}
