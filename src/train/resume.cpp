// The resume choice (see resume.h): rank 0 verifies, every rank receives what rank 0 loaded.
#include "train/resume.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <type_traits>

#include "core/error.h"
#include "train/batches.h"
#include "train/log.h"
#include "train/run_folder.h"

namespace nlp {
namespace {

// "1 rank", "4 ranks"
std::string ranks(int64_t n) { return cat(n, n == 1 ? " rank" : " ranks"); }

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

// data.pack_batch = rows: the batch shape as chosen, the data position left to the trainer (which
// re-derives it from the packed steps: resume_packed_position), and the shape lines.
BatchPlan packed_rows_plan(BatchPlan p, const TrainState& st, int world, int64_t G0, int64_t B0, int64_t A0,
                           int64_t Bc, int64_t Ac) {
  const int64_t G = world * int64_t(p.batch_size) * p.grad_accum;
  const std::string now = cat(ranks(world), " x ", p.batch_size, " rows x grad_accum ", p.grad_accum);
  const std::string was = cat(ranks(st.world_size), " x ", B0, " rows x accum ", A0);
  p.info.push_back(cat("train.resume: the checkpoint was written by ", ranks(st.world_size), ", this run has ", world,
                       st.world_size == world ? " (the same) but another batch shape" : ""));
  if (G == G0)
    p.info.push_back(cat("packed rows per step ", G, " kept: ", now, ", was ", was,
                         p.batch_size != Bc || p.grad_accum != Ac ? " (adjusted)" : " (as configured)"));
  else
    p.warnings.push_back(cat("warning: packed rows per step change from ", G0, " to ", G, ": ", now, ", was ", was,
                             " (train.batch_size and train.grad_accum as given for this run, or no adjustment "
                             "keeps it; the learning rate schedule is unchanged)"));
  Json j;
  j.integer("from_world_size", st.world_size).integer("world_size", world)
      .integer("from_batch_size", B0).integer("from_grad_accum", A0)
      .integer("batch_size", p.batch_size).integer("grad_accum", p.grad_accum)
      .integer("from_global_batch", G0).integer("global_batch", G).boolean("global_batch_kept", G == G0)
      .str("batch_counts", "rows");
  p.json = j.done();
  return p;
}

// The checkpoint's batch shape and its data position in examples.
struct FromShape {
  int64_t W0, B0, A0;  // ranks, batch, accumulation
  int64_t G0, m0;      // global batch; examples per micro-batch over the ranks
  int64_t bpe0;        // micro-batches per epoch
  int64_t epoch, seen;  // the epoch of the data position; its examples already used
};

// A batch shape for this run: per-rank batch and accumulation.
struct Cand {
  int64_t b, a;
};

// The shapes that keep the checkpoint's global batch on `world` ranks, in the order preferred (the
// keys given for this run fixed: gB, gA); the given keys as they are when none keeps it. Throws when
// nothing is given and no shape keeps it.
std::vector<Cand> candidate_shapes(const FromShape& f, int world, int64_t n, int64_t Bc, int64_t Ac, bool gB,
                                   bool gA) {
  const int64_t W0 = f.W0, B0 = f.B0, A0 = f.A0, G0 = f.G0;
  std::vector<Cand> cands;
  if (gB && gA) {
    cands.push_back({Bc, Ac});
  } else if (G0 % world == 0) {
    const int64_t per = G0 / world;  // batch x accum on each rank
    std::vector<int64_t> bs;
    if (gB) {
      bs.push_back(Bc);
    } else {  // keep the per-rank batch, else smaller ones (more accumulation), else larger ones
      bs.push_back(B0);
      for (int64_t b = std::min(per, B0 - 1); b >= 1; --b) bs.push_back(b);
      for (int64_t b = B0 + 1; b <= per; ++b) bs.push_back(b);
    }
    for (int64_t b : bs) {
      if (b < 1 || per % b != 0) continue;
      const int64_t a = per / b;
      if (gA && a != Ac) continue;
      if (n / (world * b) < 1) continue;
      cands.push_back({b, a});
    }
  }
  if (cands.empty() && (gB || gA)) cands.push_back({Bc, Ac});  // a value given: used as given, warned below
  if (cands.empty()) {
    const int64_t sb = std::max<int64_t>(1, std::min(B0, G0 / world));
    const int64_t sa = std::max<int64_t>(1, (G0 + world * sb / 2) / (world * sb));
    throw Error(cat("train.resume: the checkpoint was written by ", W0, " ranks x train.batch_size ", B0,
                    " x train.grad_accum ", A0, " = global batch ", G0, ", which cannot be kept on ", world,
                    " ranks (", G0 % world != 0 ? cat(G0, " is not divisible by ", world)
                                                : cat("fewer examples than one micro-batch"), ")",
                    "; set train.batch_size and/or train.grad_accum for this run (e.g. --train.batch_size=", sb,
                    " --train.grad_accum=", sa, ": global batch ", world * sb * sa,
                    "), which continues with that global batch, or resume on a number of ranks that divides ", G0));
  }
  return cands;
}

// Micro-batches of examples (not packed rows) in shape c: the data position in this run's
// micro-batches (rounded up: no example seen twice in an epoch), the log and warning lines, and
// summary.json's resume_world object.
BatchPlan examples_plan(BatchPlan p, const FromShape& f, Cand c, int world, int64_t n, int64_t Bc, int64_t Ac) {
  const int64_t W0 = f.W0, B0 = f.B0, A0 = f.A0, G0 = f.G0, m0 = f.m0, bpe0 = f.bpe0, epoch = f.epoch,
                seen = f.seen;
  const int64_t G = world * c.b * c.a, m = world * c.b, bpe = n / m;
  int64_t within = (seen + m - 1) / m;  // round up: an example is never seen twice in an epoch
  const int64_t skipped = std::min(within * m, n) - seen;
  int64_t new_epoch = epoch;
  if (within >= bpe) {
    ++new_epoch;
    within = 0;
  }
  p.next_batch = new_epoch * bpe + within;

  std::vector<std::string> adjusted;
  if (c.b != Bc) adjusted.push_back(cat("train.batch_size ", Bc, " -> ", c.b));
  if (c.a != Ac) adjusted.push_back(cat("train.grad_accum ", Ac, " -> ", c.a));
  const std::string now = cat(ranks(world), " x batch ", c.b, " x grad_accum ", c.a);
  const std::string was = cat(ranks(W0), " x batch ", B0, " x accum ", A0);
  p.info.push_back(cat("train.resume: the checkpoint was written by ", ranks(W0), ", this run has ", world,
                       W0 == world ? " (the same) but another batch shape" : ""));
  if (G == G0) {
    p.info.push_back(cat("global batch ", G, " kept: ", now, ", was ", was,
                         adjusted.empty() ? std::string(" (as configured)")
                                          : cat(" (adjusted: ", adjusted.size() == 2 ? adjusted[0] + ", " + adjusted[1] : adjusted[0], ")")));
  } else {
    p.warnings.push_back(cat("warning: global batch changes from ", G0, " to ", G, ": ", now, ", was ", was,
                             " (train.batch_size and train.grad_accum as given for this run, or no adjustment keeps it; the learning rate "
                             "schedule is unchanged)"));
  }
  p.info.push_back(cat("data position kept in examples: epoch ", epoch, " (the same example order, from train.seed); ",
                       seen, " of its examples were already seen and are not repeated, the rest of the epoch "
                       "follows in the same order"));
  if (skipped > 0)
    p.warnings.push_back(cat("warning: ", skipped, " example(s) of epoch ", epoch, " are skipped: the data position (",
                             seen, " examples into the epoch) is not a multiple of ", m, " (", ranks(world),
                             " x batch ", c.b, ")"));
  if (bpe * m != bpe0 * m0)
    p.info.push_back(cat("an epoch now uses ", bpe * m, " of the ", n, " examples (was ", bpe0 * m0,
                         "): the remainder after the last full ", m, "-example micro-batch is left out of each epoch"));
  p.info.push_back(cat("note: results differ from the uninterrupted ", W0, "-rank run in the last bits: the same "
                       "examples make each step, but losses and gradients are summed in another order over ranks "
                       "and micro-batches; dropout (and MLM masking) draws its masks per step, micro-batch and rank, "
                       "so with dropout > 0 the masks from here on are other ones (same distribution)"));
  Json j;
  j.integer("from_world_size", W0).integer("world_size", world)
      .integer("from_batch_size", B0).integer("from_grad_accum", A0)
      .integer("batch_size", c.b).integer("grad_accum", c.a)
      .integer("from_global_batch", G0).integer("global_batch", G).boolean("global_batch_kept", G == G0);
  std::string adj = "[";
  if (c.b != Bc) adj += "\"train.batch_size\"";
  if (c.a != Ac) adj += cat(adj.size() > 1 ? "," : "", "\"train.grad_accum\"");
  j.raw("adjusted", adj + "]");
  j.integer("epoch", epoch).integer("examples_seen_in_epoch", seen).integer("examples_skipped", skipped);
  p.json = j.done();
  return p;
}

}  // namespace

BatchPlan plan_resume_batches(const TrainState& st, int world, int64_t n, const Config& cfg) {
  BatchPlan p;
  const int64_t Bc = cfg.train.batch_size, Ac = cfg.train.grad_accum;
  p.batch_size = static_cast<int>(Bc);
  p.grad_accum = static_cast<int>(Ac);
  p.next_batch = st.next_batch;
  const int64_t W0 = st.world_size;
  int64_t B0 = st.batch_size, A0 = st.grad_accum;
  if (B0 <= 0) {  // an older checkpoint: its batch shape is not recorded
    if (W0 == world) return p;  // as before: same world, this run's keys
    B0 = Bc;
    A0 = Ac;
    p.warnings.push_back(cat("warning: the checkpoint does not record its train.batch_size and train.grad_accum "
                             "(an older nlptrain wrote it); assuming they were this run's, batch ", Bc,
                             " x accum ", Ac));
  }
  if (W0 == world && B0 == Bc && A0 == Ac) return p;  // same shape: bitwise the uninterrupted run
  p.changed = true;
  const int64_t G0 = W0 * B0 * A0, m0 = W0 * B0;
  const int64_t bpe0 = n / m0;
  if (bpe0 < 1)
    throw Error(cat("train.resume: the checkpoint was written by ", W0, " ranks x train.batch_size ", B0,
                    ", more than the ", n, " examples of data.train: is it the same dataset?"));
  const int64_t epoch = st.next_batch / bpe0;
  const int64_t seen = (st.next_batch % bpe0) * m0;  // examples of the current epoch already used
  const FromShape from{W0, B0, A0, G0, m0, bpe0, epoch, seen};

  // A key is "given" for this run when set on the command line or to another value than the checkpoint's.
  auto given = [&](const char* key, int64_t v, int64_t old) {
    return cfg.set_on_command_line.count(key) > 0 || v != old;
  };
  const bool gB = given("train.batch_size", Bc, B0), gA = given("train.grad_accum", Ac, A0);
  const std::vector<Cand> cands = candidate_shapes(from, world, n, Bc, Ac, gB, gA);
  Cand c = cands.front();
  for (const Cand& x : cands)  // prefer a shape whose micro-batch ends where the checkpoint's data position is
    if (seen % (world * x.b) == 0) {
      c = x;
      break;
    }
  p.batch_size = static_cast<int>(c.b);
  p.grad_accum = static_cast<int>(c.a);
  if (packs_by_rows(cfg)) return packed_rows_plan(p, st, world, G0, B0, A0, Bc, Ac);
  return examples_plan(p, from, c, world, n, Bc, Ac);
}

int64_t packed_resume_position(const TrainState& from, int world, int B, int A, const Config& cfg,
                               const PackedSampler& now, const std::vector<int32_t>& lengths,
                               std::vector<std::string>* info) {
  const int64_t A0 = std::max<int64_t>(1, from.grad_accum), B0 = from.batch_size > 0 ? from.batch_size : B;
  const int64_t G0 = int64_t(from.world_size) * B0 * A0, G = int64_t(world) * B * A;
  const int64_t step0 = from.next_batch / A0;  // packed steps taken
  if (G == G0) {
    info->push_back(cat("data position: packed step ", step0, " (the same ", G, " rows per step make the same steps)"));
    return step0 * A;
  }
  const int64_t n = static_cast<int64_t>(lengths.size());
  const Sampler old_order = train_sampler(cfg, n, static_cast<int>(B0), static_cast<int>(A0), 0, from.world_size, &lengths);
  const PackedSampler old(old_order, lengths, now.row_length(), G0, cfg.data.pack_max_per_row);
  const auto [epoch, offset] = old.position(step0);
  const int64_t step = now.step_at(epoch, offset);
  const auto [e1, o1] = now.position(step);
  info->push_back(cat("data position: epoch ", epoch, ", ", offset, " of its examples seen (packed step ", step0,
                      " of ", G0, " rows); with ", G, " rows per step the run continues at packed step ", step,
                      e1 == epoch ? cat(", skipping ", o1 - offset, " example(s)")
                                  : cat(", the start of epoch ", e1, " (the rest of epoch ", epoch, " skipped)")));
  return step * A;
}

ResumeOutcome resume_from_checkpoint(Session& s, AdamW& opt, TrainState& st) {
  static_assert(std::is_trivially_copyable_v<TrainState>, "TrainState is broadcast as bytes");
  ParamStore& ps = s.model.params();
  const std::string dir = s.cfg.output.dir + "/checkpoints";
  ResumeOutcome out;
  int32_t status = kNone;
  TrainState loaded = st;
  // the tensors' names and shapes: the checkpoint is verified, then read, a tensor at a time
  std::vector<NamedTensor> names;
  for (const auto& sp : ps.specs()) names.push_back({sp.name, sp.shape, nullptr});
  if (s.comm.rank() == 0) {
    const std::string& want = s.log.run_id();  // the run this folder holds ("" = not recorded)
    for (const auto& file : checkpoint_files(s.cfg.output.dir)) {
      const std::string id = checkpoint_run_id(file);
      // A file that records no run id (damaged, not a checkpoint, or written before run ids) is
      // tried: load_checkpoint reports what is wrong with it.
      if (!want.empty() && !id.empty() && id != want) {
        out.other_runs.emplace_back(file, id);
        continue;
      }
      try {
        loaded = load_checkpoint(file, names, nullptr);  // verified, nothing kept
        out.run_id = id;
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
  bcast_string(s.comm, out.run_id);
  uint64_t n_other = out.other_runs.size();
  s.comm.broadcast_host(&n_other, sizeof n_other, 0);
  out.other_runs.resize(n_other);
  for (auto& [file, id] : out.other_runs) {
    bcast_string(s.comm, file);
    bcast_string(s.comm, id);
  }
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
  // Rank 0 reads the verified file again a tensor at a time and broadcasts each; every rank keeps the
  // weights and its own range of the moments. No rank holds more than one tensor beyond its state.
  const auto& specs = ps.specs();
  auto take = [&](int group, size_t i, const float* data) {
    const ParamSpec& sp = specs[i];
    if (group == 0 && opt.sharded_params()) {  // train.zero = 3: this rank's part into its shard
      const size_t a = std::max(sp.offset, opt.lo()), b = std::min(sp.offset + sp.numel, opt.hi());
      if (a < b) s.be.to_device(opt.params() + (a - opt.lo()), data + (a - sp.offset), (b - a) * sizeof(float));
      return;
    }
    if (group == 0) {
      s.be.to_device(ps.data() + sp.offset, data, sp.numel * sizeof(float));  // refreshes the bf16 copy
      return;
    }
    const size_t a = std::max(sp.offset, opt.lo()), b = std::min(sp.offset + sp.numel, opt.hi());
    if (a < b) opt.write_moment(group - 1, a, b, data + (a - sp.offset));
  };
  auto bcast = [&](std::vector<float>& v) { bcast_floats(s.comm, v); };
  std::vector<float> buf;
  if (s.comm.rank() == 0) {
    load_checkpoint(out.path, names, [&](int group, size_t i, const float* data) {
      buf.assign(data, data + specs[i].numel);
      bcast(buf);
      take(group, i, buf.data());
    });
  } else {
    for (int group = 0; group < 3; ++group)
      for (size_t i = 0; i < specs.size(); ++i) {
        buf.resize(specs[i].numel);
        bcast(buf);
        take(group, i, buf.data());
      }
  }
  opt.load_master();  // train.offload = optimizer: the host master weights from the loaded ones
  st = loaded;
  return out;
}

}  // namespace nlp
