// The set-up of a training run: its data, the optimizer's notes, the example order and the log lines
// that say how the batches are shaped.
#include "train/trainer_internal.h"

namespace nlp::trainer {

TrainData open_train_data(Session& s) {
  const Config& cfg = s.cfg;
  const TrainConfig& tc = cfg.train;
  const int world = s.comm.size();
  TrainData d{open_dataset(s, cfg.data.train, "data.train"), nullptr, nullptr, 0};
  if (tc.sample_interval > 0) check_sample_tokenizer(s);
  if (s.task == Task::Mlm && !d.train.has_token_labels())
    d.mlm = std::make_unique<MlmSpec>(read_mlm_spec(d.train, s.model.config().vocab_size));
  d.T = d.train.seq_len();
  if (d.train.size() < static_cast<int64_t>(world) * tc.batch_size)
    throw Error(cat("data.train = '", cfg.data.train, "' has ", d.train.size(), " examples, fewer than one "
                    "global batch of ", static_cast<int64_t>(world) * tc.batch_size, " (", world, " ranks x "
                    "train.batch_size = ", tc.batch_size, "): use fewer ranks or a smaller train.batch_size"));
  if (!cfg.data.eval.empty()) d.eval = std::make_unique<TokenDataset>(open_dataset(s, cfg.data.eval, "data.eval"));
  return d;
}

// summary.json's batch and optimizer fields, and the log line of the optimizer state's size.
void note_optimizer(Session& s, const Optimizer& o, const BatchShape& b, RunNotes& notes) {
  const TrainConfig& tc = s.cfg.train;
  const int world = s.comm.size();
  const AdamW& opt = o.opt;
  const size_t total = s.model.params().total();
  notes.batch_size = b.B;
  notes.grad_accum = b.A;
  notes.zero = o.sharded_grads() ? o.stage : 0;
  notes.optimizer_bytes = static_cast<int64_t>(opt.state_bytes());
  notes.optimizer_bytes_total = static_cast<int64_t>(2 * total * sizeof(float));
  notes.offload = tc.offload;
  notes.optimizer_host_bytes = static_cast<int64_t>(opt.host_bytes());
  const double mib = 1024.0 * 1024.0;
  char buf[320];
  if (o.zero)
    std::snprintf(buf, sizeof buf,
                  "optimizer: AdamW m+v %.1f MiB on this rank (train.zero = %d: shard [%zu, %zu) of %zu "
                  "parameters, 1/%d of the %.1f MiB every rank holds with train.zero = 0)",
                  double(opt.state_bytes()) / mib, tc.zero, opt.lo(), opt.hi(), total, world,
                  double(notes.optimizer_bytes_total) / mib);
  else
    std::snprintf(buf, sizeof buf, "optimizer: AdamW m+v %.1f MiB per rank (train.zero = %d%s)",
                  double(opt.state_bytes()) / mib, tc.zero,
                  tc.zero == 1 ? ": one rank, nothing to shard" : world > 1 ? "; 1 would shard it" : "");
  s.log.info(buf);
  if (o.grads) {
    const size_t shard_b = o.grads->shard_size() * sizeof(float), buf_b = o.grads->buffer_bytes();
    s.log.info(cat("gradients: train.zero = ", tc.zero, ": the gradient shard [", opt.lo(), ", ", opt.hi(), ") ",
                   std::lround(double(shard_b) / mib * 10) / 10.0, " MiB and the backward's buffers (the tensors "
                   "outside the blocks, two block slots) ", std::lround(double(buf_b) / mib * 10) / 10.0,
                   " MiB on this rank, instead of the ", std::lround(double(total * sizeof(float)) / mib * 10) / 10.0,
                   " MiB arena; each block's gradients reduce-scattered as its backward ends, every micro-batch"));
    notes.gradient_bytes = static_cast<int64_t>(shard_b + buf_b);
  } else {
    notes.gradient_bytes = static_cast<int64_t>(total * sizeof(float));
  }
  if (o.params) {
    const size_t shard_b = o.params->shard_size() * sizeof(float), buf_b = o.params->buffer_bytes();
    s.log.info(cat("parameters: train.zero = 3: the parameter shard [", opt.lo(), ", ", opt.hi(), ") ",
                   std::lround(double(shard_b) / mib * 10) / 10.0, " MiB and the tensors outside the blocks with "
                   "1 + ", tc.zero_prefetch, " block buffer(s) ", std::lround(double(buf_b) / mib * 10) / 10.0,
                   " MiB on this rank, instead of the ", std::lround(double(total * sizeof(float)) / mib * 10) / 10.0,
                   " MiB arena; each block all-gathered before it is used, the next ", tc.zero_prefetch,
                   " started ahead (train.zero_prefetch); evaluation and samples gather the whole arena for their "
                   "duration"));
    std::string both;  // the tensors whose one buffer holds their weights, then their gradient
    for (int i : s.model.weights_then_grads()) both += cat(both.empty() ? "" : ", ", s.model.params().specs()[size_t(i)].name);
    if (!both.empty())
      s.log.info(cat("parameters: train.zero = 3: ", both, ": one buffer each, the weights gathered before each "
                     "forward, the gradient from the backward on; the gradients outside the blocks reduce-scattered "
                     "in pieces of at most ", o.params->block_floats(), " floats (a block's)"));
  }
  if (opt.offloaded())
    s.log.info(cat("optimizer: train.offload = optimizer: the fp32 master weights, AdamW m and v and a gradient "
                   "copy of [", opt.lo(), ", ", opt.hi(), ") in host memory (",
                   std::lround(double(opt.host_bytes()) / mib * 10) / 10.0, " MiB on this rank", 
                   s.be.name() == "cuda" ? ", page-locked" : "", "); AdamW runs on the host"));
}

TrainOrder example_order(Session& s, const TrainData& d, const BatchShape& b, TrainState& st, RunNotes& notes) {
  static const std::vector<int32_t> no_lengths;
  const Config& cfg = s.cfg;
  const int rank = s.comm.rank(), world = s.comm.size();
  const int B = b.B, A = b.A;
  TrainOrder o;
  o.B = B;
  o.A = A;
  st.world_size = world;
  st.batch_size = B;
  st.grad_accum = A;
  // data.group_by_length and packed steps (data.pack_batch = rows): every rank reads all lengths (the
  // order is global), from the mask only. (a reference to the dataset's own copy: lengths() keeps
  // what it read)
  o.by_rows = packs_by_rows(cfg);
  const TrainState& from = b.from;
  if (!notes.resumed_from.empty() && (from.packed_rows != 0) != o.by_rows) {
    const std::string w =
        cat("warning: the checkpoint's data position (micro-batch ", from.next_batch, ") counts ",
            from.packed_rows ? "packed steps (data.pack_batch = rows)" : "micro-batches of train.batch_size examples",
            ", this run's ", o.by_rows ? "packed steps (data.pack_batch = rows)" : "micro-batches of examples",
            ": it continues at that micro-batch of its own order, so examples of the current epoch may be "
            "skipped or seen again");
    s.log.info(w);
    notes.warnings.push_back(w);
  }
  st.packed_rows = o.by_rows ? 1 : 0;
  o.lengths = cfg.data.group_by_length || o.by_rows ? &d.train.lengths() : &no_lengths;
  // Length groups are whole optimizer steps (world x B x A examples): the same sets of examples
  // at any world size that keeps the global batch (a resume at another world size does).
  o.sampler = std::make_unique<Sampler>(train_sampler(cfg, d.train.size(), B, A, rank, world, o.lengths));
  // Packed steps: the data position (st.next_batch) counts micro-batches, A to a step, as unpacked.
  if (o.by_rows) {
    o.packed = std::make_unique<PackedSampler>(*o.sampler, *o.lengths, d.T, int64_t(world) * B * A,
                                               cfg.data.pack_max_per_row);
    if (b.reshaped) {
      std::vector<std::string> lines;
      st.next_batch = packed_resume_position(from, world, B, A, cfg, *o.packed, *o.lengths, &lines);
      for (const auto& line : lines) s.log.info(line);
    }
  }
  o.trim = cfg.padding() == Padding::Longest;
  o.pack = cfg.data.packing;
  o.pack_multiple = packing_multiple(cfg, s.be.name() == "cuda");
  o.tokens_per_step = int64_t(B) * d.T * A * world;
  return o;
}

// The log lines that say what the run reads and how its batches are shaped.
void log_data_plan(Session& s, const TrainData& d, const TrainOrder& o) {
  const Config& cfg = s.cfg;
  const int world = s.comm.size();
  const int B = o.B, A = o.A, T = d.T;
  const TokenDataset& train = d.train;
  const std::vector<int32_t>& lengths = *o.lengths;
  const int pack_multiple = o.pack_multiple;
  s.log.info(cat("train: ", train.size(), " examples of ", T, " tokens in '", cfg.data.train, "' (",
                 train.in_memory() ? cat("held in memory, ", train.column_bytes() >> 20, " MiB; ")
                                   : cat("read per batch: ", train.column_bytes() >> 20,
                                         " MiB > data.cache_mb; "),
                 o.packed ? cat(o.packed->steps_in_epoch(0), " packed steps in the first epoch")
                          : cat(o.sampler->batches_per_epoch(), " global batches per epoch"),
                 "); ", o.tokens_per_step, " tokens per step (", o.packed ? "rows " : "batch ", B, " x accum ", A,
                 " x ranks ", world, ")"));
  if (cfg.data.group_by_length) {
    double sum = 0;
    for (int32_t L : lengths) sum += L;
    s.log.info(cat("data: group_by_length: mega-batches of ", o.sampler->mega_batch_steps(), " optimizer steps (",
                   int64_t(world) * B * A, " examples each) sorted by length, steps in ",
                   cfg.group_order() == GroupOrder::Shuffled ? "a shuffled order" : "each mega-batch's order, longest first",
                   " (data.group_order = ", cfg.data.group_order, "); mean example length ",
                   sum / double(lengths.size()), " of ", T));
  }
  if (o.packed) {
    const int64_t k = o.packed->steps_in_epoch(0);
    s.log.info(cat("data: packing: train.batch_size = ", B, " rows of ", T, " tokens per rank and micro-batch "
                   "(data.pack_batch = rows): each step takes the next examples of the order that fit its ",
                   int64_t(world) * B * A, " rows (first-fit, at most data.pack_max_per_row = ",
                   cfg.data.pack_max_per_row, " to a row; attention within each example, positions restarting)",
                   pack_multiple > 0 ? cat(", cut to the longest row rounded up to a multiple of ", pack_multiple)
                                     : std::string(), "; the first epoch: ", k, " steps of ",
                   std::lround(100.0 * double(train.size()) / double(k)) / 100.0,
                   " examples on average (the last partial step dropped); evaluation runs unpacked"));
    if (cfg.data.pack_fixed_examples) {
      const int per_row = std::min(cfg.data.pack_max_per_row, T);  // pack_rows' bound at the file's length
      std::string line = cat("data: packing: the heads run ", B, " x ", per_row,
                             " examples per micro-batch (data.pack_fixed_examples), those after the real ones ignored");
      if (pack_multiple > 0)
        line += cat("; the rows are cut to their longest, so the count follows the rows' length below ", per_row);
      if (s.task == Task::Ner) line += "; ner scores every position of the rows, those without a label ignored";
      s.log.info(line);
    }
  } else if (o.pack)
    s.log.info(cat("data: packing: the ", B, " examples of each micro-batch share rows (first-fit, longest "
                   "first; attention within each example, positions restarting) ",
                   pack_multiple > 0 ? cat("of the length, a multiple of ", pack_multiple, " up to ", T,
                                           ", that needs the fewest positions")
                   : o.trim ? cat("of ", T, " positions (cuDNN's attention: one row length, one graph for the "
                                  "run; data.pad_multiple = N packs into multiples of N)")
                            : cat("of ", T, " positions (data.padding = max_length)"),
                   "; evaluation runs unpacked"));
  else
    s.log.info(o.trim ? cat("data: padding = longest: each micro-batch runs at its longest row rounded up to a "
                            "multiple of ", cfg.data.pad_multiple, " (at most ", T, ")")
                      : cat("data: padding = max_length: every row runs at ", T, " positions"));
}

}  // namespace nlp::trainer
