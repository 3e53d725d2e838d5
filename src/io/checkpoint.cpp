// Checkpoints: weights (HF layout) + AdamW moments under optimizer/ + training state attributes,
// written atomically as <dir>/checkpoints/step_<8 digits>.h5; only the newest `keep` are kept.
#include "io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "io/crc32.h"
#include "io/tensor_checksum.h"

namespace fs = std::filesystem;

namespace nlp {

namespace {

constexpr const char* kExpAvg = "optimizer/exp_avg/";
constexpr const char* kExpAvgSq = "optimizer/exp_avg_sq/";
constexpr const char* kStateCrc = "nlptrain_state_crc32";

// CRC-32 of the training state in a fixed text form (the double by its bit pattern), stored as a
// root attribute so that an edited or damaged state attribute is detected like damaged tensor data.
uint32_t state_crc(const TrainState& s) {
  uint64_t metric_bits = 0;
  std::memcpy(&metric_bits, &s.best_metric, sizeof metric_bits);
  const std::string text =
      cat("step=", s.step, ";next_batch=", s.next_batch, ";seed=", s.seed, ";world_size=", s.world_size,
          ";best_metric=", metric_bits, ";optimizer_steps=", s.optimizer_steps,
          ";nonfinite_skipped=", s.nonfinite_skipped, ";nonfinite_streak=", s.nonfinite_streak,
          // recorded since resume at another world size; older files' CRCs cover the rest only
          s.batch_size > 0 ? cat(";batch_size=", s.batch_size, ";grad_accum=", s.grad_accum) : std::string(),
          s.packed_rows != 0 ? cat(";packed_rows=", s.packed_rows) : std::string(),  // (since packed steps)
          s.schedule_steps > 0 ? cat(";schedule_steps=", s.schedule_steps) : std::string());  // (since recorded)
  return crc32(text.data(), text.size());
}

// Step number of a checkpoint file name "step_<digits>.h5", or -1 for any other name (including
// temporary files "step_....h5.tmp.<pid>").
int64_t step_of(const std::string& fname) {
  const std::string pre = "step_", suf = ".h5";
  if (fname.size() <= pre.size() + suf.size()) return -1;
  if (fname.compare(0, pre.size(), pre) != 0) return -1;
  if (fname.compare(fname.size() - suf.size(), suf.size(), suf) != 0) return -1;
  const std::string digits = fname.substr(pre.size(), fname.size() - pre.size() - suf.size());
  if (digits.size() > 18) return -1;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

// (step, path) of every complete checkpoint file in dir, newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (!it->is_regular_file(ec2)) continue;
    int64_t s = step_of(it->path().filename().string());
    if (s >= 0) out.emplace_back(s, it->path().string());
  }
  if (ec) throw Error(cat("cannot list checkpoint directory '", dir.string(), "': ", ec.message()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

void write_tensors(h5::File& f, const std::vector<NamedTensor>& ts, const std::string& prefix) {
  std::set<std::string> seen;
  for (const auto& t : ts) {
    if (!seen.insert(t.name).second)
      throw Error(cat("checkpoint '", f.path(), "': tensor '", prefix, t.name, "' is listed twice"));
    write_checksummed_f32(f, prefix + t.name, t.shape, t.data);
  }
}

// <output_dir>/checkpoints/step_<8 digits>.h5
std::string checkpoint_path(const std::string& output_dir, const TrainState& state) {
  if (state.step < 0) throw Error(cat("save_checkpoint: negative step ", state.step));
  const fs::path dir = fs::path(output_dir.empty() ? "." : output_dir) / "checkpoints";
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(state.step));
  return (dir / name).string();
}

// The training state as root attributes, its CRC, and the count of checksummed datasets.
void write_state(h5::File& f, const TrainState& state, int64_t datasets) {
  f.set_attr("nlptrain_step", static_cast<int64_t>(state.step));
  f.set_attr("nlptrain_next_batch", static_cast<int64_t>(state.next_batch));
  f.set_attr("nlptrain_seed", static_cast<int64_t>(state.seed));  // uint64 bit pattern
  f.set_attr("nlptrain_world_size", static_cast<int64_t>(state.world_size));
  f.set_attr("nlptrain_best_metric", static_cast<double>(state.best_metric));
  f.set_attr("nlptrain_optimizer_steps", static_cast<int64_t>(state.optimizer_steps));
  f.set_attr("nlptrain_nonfinite_skipped", static_cast<int64_t>(state.nonfinite_skipped));
  f.set_attr("nlptrain_nonfinite_streak", static_cast<int64_t>(state.nonfinite_streak));
  if (state.batch_size > 0) {
    f.set_attr("nlptrain_batch_size", static_cast<int64_t>(state.batch_size));
    f.set_attr("nlptrain_grad_accum", static_cast<int64_t>(state.grad_accum));
  }
  if (state.packed_rows != 0) f.set_attr("nlptrain_packed_rows", static_cast<int64_t>(state.packed_rows));
  if (state.schedule_steps > 0) f.set_attr("nlptrain_schedule_steps", static_cast<int64_t>(state.schedule_steps));
  f.set_attr(kStateCrc, static_cast<int64_t>(state_crc(state)));
  record_checksum_count(f, datasets);
}

// Retention: `keep` checkpoints in the folder, the one just written among them (keep <= 0: all).
void retain(const fs::path& dir, const std::string& path, int keep) {
  if (keep <= 0) return;
  std::vector<std::string> newest_first;
  for (auto& [step, p] : list_checkpoints(dir)) newest_first.push_back(p);
  for (const auto& old : checkpoints_to_remove(newest_first, path, keep)) {
    std::error_code ec;
    fs::remove(old, ec);
    if (ec) throw Error(cat("cannot remove old checkpoint '", old, "': ", ec.message()));
  }
}

}  // namespace

std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            const std::vector<NamedTensor>& params,
                            const std::vector<NamedTensor>& exp_avg,
                            const std::vector<NamedTensor>& exp_avg_sq,
                            const std::function<void(h5::File&)>& write_model_attrs, int keep) {
  const std::string path = checkpoint_path(output_dir, state);
  const fs::path dir = fs::path(path).parent_path();

  h5::write_atomically(path, [&](h5::File& f) {
    write_tensors(f, params, "");
    write_tensors(f, exp_avg, kExpAvg);
    write_tensors(f, exp_avg_sq, kExpAvgSq);
    write_state(f, state, static_cast<int64_t>(params.size() + exp_avg.size() + exp_avg_sq.size()));
    if (write_model_attrs) write_model_attrs(f);
  });
  retain(dir, path, keep);
  return path;
}

std::string save_checkpoint(const std::string& output_dir, const TrainState& state,
                            const std::vector<NamedTensor>& specs, const TensorFetch& fetch,
                            const std::function<void(h5::File&)>& write_model_attrs, int keep) {
  const std::string path = checkpoint_path(output_dir, state);
  std::set<std::string> seen;
  size_t largest = 0;
  for (const auto& t : specs) {
    if (!seen.insert(t.name).second)
      throw Error(cat("checkpoint '", path, "': tensor '", t.name, "' is listed twice"));
    largest = std::max(largest, static_cast<size_t>(t.numel()));
  }
  std::vector<float> buf(largest);
  h5::write_atomically(path, [&](h5::File& f) {
    for (int group = 0; group < 3; ++group)
      for (size_t i = 0; i < specs.size(); ++i) {
        fetch(group, i, buf.data());
        write_checksummed_f32(f, cat(group == 0 ? "" : group == 1 ? kExpAvg : kExpAvgSq, specs[i].name),
                              specs[i].shape, buf.data());
      }
    write_state(f, state, static_cast<int64_t>(3 * specs.size()));
    if (write_model_attrs) write_model_attrs(f);
  });
  retain(fs::path(path).parent_path(), path, keep);
  return path;
}

std::vector<std::string> checkpoints_to_remove(const std::vector<std::string>& newest_first,
                                               const std::string& written, int keep) {
  std::vector<std::string> out;
  if (keep <= 0) return out;
  const bool present = std::any_of(newest_first.begin(), newest_first.end(),
                                   [&](const std::string& p) { return fs::path(p) == fs::path(written); });
  size_t kept = present ? 1 : 0;  // the one just written always stays
  for (const auto& p : newest_first) {
    if (fs::path(p) == fs::path(written)) continue;
    if (kept < static_cast<size_t>(keep)) ++kept;
    else out.push_back(p);
  }
  return out;
}

std::string latest_checkpoint(const std::string& output_dir) {
  auto all = list_checkpoints(fs::path(output_dir.empty() ? "." : output_dir) / "checkpoints");
  return all.empty() ? std::string() : all.front().second;
}

std::vector<std::string> checkpoint_files(const std::string& output_dir) {
  std::vector<std::string> out;
  for (auto& [step, path] : list_checkpoints(fs::path(output_dir.empty() ? "." : output_dir) / "checkpoints"))
    out.push_back(path);
  return out;
}

namespace {

// The training state attributes of an open checkpoint, validated (see load_checkpoint).
TrainState read_state(const h5::File& f, const std::string& path) {
  for (const char* key : {"nlptrain_step", "nlptrain_next_batch", "nlptrain_seed",
                          "nlptrain_world_size", "nlptrain_best_metric"})
    if (!f.has_attr(key))
      throw Error(cat("file '", path, "' is not an nlptrain checkpoint: root attribute '", key,
                      "' is missing"));
  TrainState s;
  s.step = f.attr_int("nlptrain_step");
  s.next_batch = f.attr_int("nlptrain_next_batch");
  // Written as the int64 bit pattern of the uint64 seed; a decimal string is accepted as well.
  bool seed_is_string = false;
  try {
    s.seed = static_cast<uint64_t>(f.attr_int("nlptrain_seed"));
  } catch (const Error&) {
    seed_is_string = true;
  }
  if (seed_is_string) {
    const std::string v = f.attr_string("nlptrain_seed");
    size_t used = 0;
    try {
      s.seed = std::stoull(v, &used, 10);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v.size() || v[0] == '-')
      throw Error(cat("file '", path, "': attribute 'nlptrain_seed' = '", v,
                      "' is not an unsigned 64-bit integer"));
  }
  s.world_size = f.attr_int("nlptrain_world_size");
  s.best_metric = f.attr_double("nlptrain_best_metric");
  // Written since non-finite steps can be skipped; older checkpoints applied every step.
  s.optimizer_steps = f.has_attr("nlptrain_optimizer_steps") ? f.attr_int("nlptrain_optimizer_steps") : s.step;
  s.nonfinite_skipped = f.has_attr("nlptrain_nonfinite_skipped") ? f.attr_int("nlptrain_nonfinite_skipped") : 0;
  s.nonfinite_streak = f.has_attr("nlptrain_nonfinite_streak") ? f.attr_int("nlptrain_nonfinite_streak") : 0;
  if (f.has_attr("nlptrain_batch_size") || f.has_attr("nlptrain_grad_accum")) {
    if (!f.has_attr("nlptrain_batch_size") || !f.has_attr("nlptrain_grad_accum"))
      throw Error(cat("file '", path, "': root attributes 'nlptrain_batch_size' and 'nlptrain_grad_accum' "
                      "come together, but only one is present: the file is damaged"));
    s.batch_size = f.attr_int("nlptrain_batch_size");
    s.grad_accum = f.attr_int("nlptrain_grad_accum");
  }
  s.packed_rows = f.has_attr("nlptrain_packed_rows") ? f.attr_int("nlptrain_packed_rows") : 0;
  s.schedule_steps = f.has_attr("nlptrain_schedule_steps") ? f.attr_int("nlptrain_schedule_steps") : 0;
  if (f.has_attr(kStateCrc)) {
    const int64_t stored = f.attr_int(kStateCrc);
    if (stored != static_cast<int64_t>(state_crc(s)))
      throw Error(cat("file '", path, "': the training state attributes fail their checksum (",
                      kStateCrc, "): the file is damaged"));
  } else if (has_checksums(f)) {
    throw Error(cat("file '", path, "': root attribute '", kStateCrc,
                    "' is missing although the file records checksums: the file is damaged"));
  }
  if (s.step < 0 || s.next_batch < 0 || s.world_size < 1 || s.optimizer_steps < 0 ||
      s.optimizer_steps > s.step || s.nonfinite_skipped < 0 || s.nonfinite_streak < 0 ||
      s.batch_size < 0 || s.grad_accum < 0 || (s.batch_size > 0) != (s.grad_accum > 0) ||
      (s.packed_rows != 0 && s.packed_rows != 1) || s.schedule_steps < 0)
    throw Error(cat("file '", path, "': invalid training state (nlptrain_step=", s.step,
                    ", nlptrain_next_batch=", s.next_batch, ", nlptrain_world_size=", s.world_size,
                    ", nlptrain_optimizer_steps=", s.optimizer_steps, ")"));
  const int64_t named = step_of(fs::path(path).filename().string());
  if (named >= 0 && named != s.step)
    throw Error(cat("file '", path, "' holds step ", s.step, " (nlptrain_step) but its name says step ",
                    named));
  return s;
}

}  // namespace

TrainState load_checkpoint(const std::string& path, const std::vector<NamedTensor>& params,
                           const std::vector<NamedTensor>& exp_avg,
                           const std::vector<NamedTensor>& exp_avg_sq) {
  h5::File f = h5::File::open_read(path);
  const TrainState s = read_state(f, path);
  load_tensors(f, params, "");
  load_tensors(f, exp_avg, kExpAvg);
  load_tensors(f, exp_avg_sq, kExpAvgSq);
  verify_checksum_count(f);
  return s;
}

TrainState load_checkpoint(const std::string& path, const std::vector<NamedTensor>& specs, const TensorSink& sink) {
  h5::File f = h5::File::open_read(path);
  const TrainState s = read_state(f, path);
  size_t largest = 0;
  for (const auto& t : specs) largest = std::max(largest, static_cast<size_t>(t.numel()));
  std::vector<float> buf(largest);
  for (int group = 0; group < 3; ++group)
    for (size_t i = 0; i < specs.size(); ++i) {
      load_tensors(f, {NamedTensor{specs[i].name, specs[i].shape, buf.data()}},
                   group == 0 ? "" : group == 1 ? kExpAvg : kExpAvgSq);
      if (sink) sink(group, i, buf.data());
    }
  verify_checksum_count(f);
  return s;
}

}  // namespace nlp
