// The resume choice (see resume.h): rank 0 verifies, every rank receives what rank 0 loaded.
#include "train/resume.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <type_traits>

#include "core/error.h"

namespace nlp {
namespace {

enum Status : int32_t { kNone = 0, kLoaded = 1, kAllDamaged = 2 };

void bcast_string(Comm& c, std::string& str) {
  uint64_t n = str.size();
  c.broadcast_host(&n, sizeof n, 0);
  str.resize(n);
  if (n > 0) c.broadcast_host(str.data(), n, 0);
}

void bcast_floats(Comm& c, std::vector<float>& v) {
  const size_t chunk = size_t(1) << 28;  // 1 GiB per call: MPI counts are int
  for (size_t off = 0; off < v.size(); off += chunk)
    c.broadcast_host(v.data() + off, std::min(chunk, v.size() - off) * sizeof(float), 0);
}

}  // namespace

ResumeOutcome resume_from_checkpoint(Session& s, AdamW& opt, TrainState& st) {
  static_assert(std::is_trivially_copyable_v<TrainState>, "TrainState is broadcast as bytes");
  const ParamStore& ps = s.model.params();
  const std::string dir = s.cfg.output.dir + "/checkpoints";
  ResumeOutcome out;
  int32_t status = kNone;
  TrainState loaded = st;
  std::vector<float> hp, hm, hv;
  if (s.comm.rank() == 0) {
    auto pv = ps.host_views(hp);
    auto mv = ps.host_views(hm);
    auto vv = ps.host_views(hv);
    for (const auto& file : checkpoint_files(s.cfg.output.dir)) {
      try {
        loaded = load_checkpoint(file, pv, mv, vv);
        out.path = file;
        status = kLoaded;
        break;
      } catch (const std::exception& e) {
        out.damaged.emplace_back(file, e.what());
      }
    }
    if (status == kNone && !out.damaged.empty()) status = kAllDamaged;
    if (status == kLoaded) {
      for (const auto& [file, reason] : out.damaged) {
        std::error_code ec;
        std::filesystem::rename(file, file + ".damaged", ec);
        out.moved_to.push_back(ec ? std::string() : file + ".damaged");
      }
    }
  }

  s.comm.broadcast_host(&status, sizeof status, 0);
  bcast_string(s.comm, out.path);
  uint64_t n_damaged = out.damaged.size();
  s.comm.broadcast_host(&n_damaged, sizeof n_damaged, 0);
  out.damaged.resize(n_damaged);
  out.moved_to.resize(status == kLoaded ? n_damaged : 0);
  for (uint64_t i = 0; i < n_damaged; ++i) {
    bcast_string(s.comm, out.damaged[i].first);
    bcast_string(s.comm, out.damaged[i].second);
    if (status == kLoaded) bcast_string(s.comm, out.moved_to[i]);
  }

  if (status == kAllDamaged) {
    std::string msg = cat("train.resume: none of the ", n_damaged, " checkpoint(s) in '", dir,
                          "' is intact; tried, newest first:");
    for (const auto& [file, reason] : out.damaged) msg += cat("\n  ", file, ": ", reason);
    msg += cat("\nrepair or move them away to start from step 0 (or set train.resume = false, which "
               "starts over and overwrites the outputs)");
    throw Error(msg);
  }
  if (status == kNone) return out;

  s.comm.broadcast_host(&loaded, sizeof loaded, 0);
  if (s.comm.rank() != 0) {
    hp.resize(ps.total());
    hm.resize(ps.total());
    hv.resize(ps.total());
  }
  bcast_floats(s.comm, hp);
  bcast_floats(s.comm, hm);
  bcast_floats(s.comm, hv);
  s.model.params().upload(hp);
  opt.upload(opt.exp_avg(), hm);
  opt.upload(opt.exp_avg_sq(), hv);
  st = loaded;
  return out;
}

}  // namespace nlp
