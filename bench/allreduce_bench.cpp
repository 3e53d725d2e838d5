// Allreduce microbenchmark for the alpha-beta scaling model.
//
// Times MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM, MPI_COMM_WORLD), the call nlptrain's CPU
// communicator makes for the gradients (src/comm/comm_mpi.cpp), over message sizes from --min-bytes
// to --max-bytes (x --factor each time). Plain MPI, nothing of nlptrain: run it with the same
// launcher, placement and Open MPI settings as the training runs so that it measures the same
// transport (tools/comm_fit.py fits the ring model to its output).
// The other gradient paths of nlptrain's MPI communicator, for comparison:
//   --nonblocking: MPI_Iallreduce + MPI_Wait (comm.overlap = true: its buckets are MPI_Iallreduce;
//                  Open MPI runs non-blocking collectives with other algorithms than blocking ones)
//   --collective reduce_scatter_allgather: train.zero = 1's in-place MPI_Reduce_scatter, the move of
//                  this rank's block to its range, and the in-place MPI_Allgatherv (with
//                  --nonblocking: MPI_Ireduce_scatter / MPI_Iallgatherv, as nlptrain's comm thread)
//                  over near-equal contiguous ranges; the same bytes per rank as one ring allreduce.
//
// Per size: --warmup untimed calls, then timed calls until at least --min-reps were made and
// --min-time seconds were spent (at most --max-reps). Each call is preceded by MPI_Barrier; its
// time is the largest over the ranks (what the slowest rank, and so the collective, took). The
// median over the calls is the figure to use; min, mean and max are written too. The buffer holds
// zeros, so repeated in-place sums neither overflow nor change the work; one extra call per size on
// ones checks that every element became world_size.
//
//   mpirun -np 2 build/allreduce_bench --out ar.json
//   srun --mpi=pmix -N 2 --ntasks-per-node=2 build/allreduce_bench --max-bytes 64M --label 2x2
//
// Output (rank 0): JSON with the world size, nodes (ranks grouped by MPI_COMM_TYPE_SHARED, as
// nlptrain counts them), ranks per node, the MPI library version, the settings and one row per
// size: bytes, count, reps, median_s, min_s, mean_s, max_s. A table is printed on stdout.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Options {
  int64_t min_bytes = 4;
  int64_t max_bytes = int64_t(256) << 20;
  double factor = 2.0;
  int warmup = 2;
  int min_reps = 5;
  int max_reps = 1000;
  double min_time = 0.25;
  std::string out;
  std::string label;
  bool rs_ag = false;       // reduce-scatter + all-gather instead of allreduce
  bool nonblocking = false; // I-collectives + MPI_Wait
};

[[noreturn]] void usage_error(int rank, const std::string& msg) {
  if (rank == 0) std::fprintf(stderr, "allreduce_bench: %s (see the comment at the top of bench/allreduce_bench.cpp)\n", msg.c_str());
  MPI_Finalize();
  std::exit(2);
}

// "4", "64K", "1M", "256M": bytes (K, M, G are powers of 1024).
bool parse_bytes(const char* s, int64_t& out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s, &end, 10);
  if (errno || end == s || v <= 0) return false;
  int64_t mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1 << 10, ++end;
  else if (*end == 'M' || *end == 'm') mul = 1 << 20, ++end;
  else if (*end == 'G' || *end == 'g') mul = int64_t(1) << 30, ++end;
  if (*end) return false;
  out = v * mul;
  return true;
}

Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(rank, a + " needs a value");
      return argv[++i];
    };
    auto num = [&](double& d) {
      const char* v = val();
      char* end = nullptr;
      d = std::strtod(v, &end);
      if (end == v || *end) usage_error(rank, a + ": not a number: " + v);
    };
    auto integer = [&](int& n) {
      double d;
      num(d);
      if (d != static_cast<int>(d)) usage_error(rank, a + " must be an integer");
      n = static_cast<int>(d);
    };
    if (a == "--min-bytes" || a == "--max-bytes") {
      int64_t b;
      const char* v = val();
      if (!parse_bytes(v, b)) usage_error(rank, a + ": not a byte count: " + v);
      (a == "--min-bytes" ? o.min_bytes : o.max_bytes) = b;
    } else if (a == "--factor") num(o.factor);
    else if (a == "--warmup") integer(o.warmup);
    else if (a == "--min-reps") integer(o.min_reps);
    else if (a == "--max-reps") integer(o.max_reps);
    else if (a == "--min-time") num(o.min_time);
    else if (a == "--out") o.out = val();
    else if (a == "--label") o.label = val();
    else if (a == "--nonblocking") o.nonblocking = true;
    else if (a == "--collective") {
      std::string v = val();
      if (v == "allreduce") o.rs_ag = false;
      else if (v == "reduce_scatter_allgather") o.rs_ag = true;
      else usage_error(rank, "--collective must be allreduce or reduce_scatter_allgather, not " + v);
    }
    else if (a == "-h" || a == "--help") usage_error(rank, "options: --min-bytes --max-bytes --factor --warmup --min-reps --max-reps --min-time --collective --nonblocking --out --label");
    else usage_error(rank, "unknown argument " + a);
  }
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes) usage_error(rank, "need 4 <= --min-bytes <= --max-bytes");
  if (o.max_bytes / 4 > INT32_MAX) usage_error(rank, "--max-bytes above 8 GiB (int count)");
  if (!(o.factor > 1.0)) usage_error(rank, "--factor must be > 1");
  if (o.warmup < 0 || o.min_reps < 1 || o.max_reps < o.min_reps) usage_error(rank, "need --warmup >= 0, 1 <= --min-reps <= --max-reps");
  if (!(o.min_time >= 0)) usage_error(rank, "--min-time must be >= 0");
  return o;
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "allreduce_bench: %s failed (MPI error %d)\n", what, rc);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

std::string json_escape(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') r += '\\', r += char(c);
    else if (c == '\n') r += "\\n";
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      r += b;
    } else r += char(c);
  }
  return r;
}

// One gradient reduction of `count` floats in buf, as nlptrain's communicator does it.
struct Reducer {
  const Options& o;
  int rank, size;
  std::vector<int> counts, displs;
  void operator()(float* buf, int count) {
    if (!o.rs_ag) {
      if (o.nonblocking) {
        MPI_Request r;
        check(MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r), "MPI_Iallreduce");
        check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
      } else {
        check(MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
      }
      return;
    }
    // near-equal contiguous ranges, the first count % size ranks one float more
    counts.assign(size, count / size);
    displs.assign(size, 0);
    for (int i = 0; i < count % size; ++i) ++counts[i];
    for (int i = 1; i < size; ++i) displs[i] = displs[i - 1] + counts[i - 1];
    if (o.nonblocking) {
      MPI_Request r;
      check(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r),
            "MPI_Ireduce_scatter");
      check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
    } else {
      check(MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Reduce_scatter");
    }
    std::memmove(buf + displs[rank], buf, size_t(counts[rank]) * sizeof(float));
    if (o.nonblocking) {
      MPI_Request r;
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(), MPI_FLOAT,
                            MPI_COMM_WORLD, &r),
            "MPI_Iallgatherv");
      check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
    } else {
      check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(), MPI_FLOAT,
                           MPI_COMM_WORLD),
            "MPI_Allgatherv");
    }
  }
};

struct Row {
  int64_t bytes = 0, count = 0;
  int reps = 0;
  double median = 0, min = 0, mean = 0, max = 0;
};

}  // namespace

int main(int argc, char** argv) {
  // The thread level nlptrain asks for (src/app/main.cpp), in case Open MPI's paths depend on it.
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Options o = parse(argc, argv, rank);

  // Nodes as nlptrain counts them: one per shared-memory group.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  int leader = local_rank == 0 ? 1 : 0, nodes = 0, max_local = 0;
  MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&local_size, &max_local, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Comm_free(&node);

  std::vector<int64_t> sizes;  // in bytes, multiples of 4
  for (double b = double(o.min_bytes); b <= double(o.max_bytes) * (1 + 1e-9); b *= o.factor) {
    int64_t v = std::max<int64_t>(4, (static_cast<int64_t>(b + 0.5) / 4) * 4);
    if (sizes.empty() || v != sizes.back()) sizes.push_back(v);
  }
  if (sizes.back() != (o.max_bytes / 4) * 4) sizes.push_back((o.max_bytes / 4) * 4);

  std::vector<float> buf(static_cast<size_t>(sizes.back() / 4), 0.0f);  // zero-filled: pages touched
  Reducer reduce{o, rank, size, {}, {}};
  std::vector<Row> rows;
  std::vector<double> times;
  bool ok = true;
  for (int64_t bytes : sizes) {
    const int count = static_cast<int>(bytes / 4);
    // Correctness, once: ones summed over the ranks.
    std::fill(buf.begin(), buf.begin() + count, 1.0f);
    reduce(buf.data(), count);
    for (int i = 0; i < count; ++i)
      if (buf[i] != float(size)) {
        std::fprintf(stderr, "allreduce_bench: rank %d: element %d of %d is %g, expected %d\n", rank, i, count,
                     double(buf[i]), size);
        ok = false;
        break;
      }
    std::fill(buf.begin(), buf.begin() + count, 0.0f);
    for (int w = 0; w < o.warmup; ++w) reduce(buf.data(), count);
    times.clear();
    double spent = 0;
    // Every rank sees the same (max-reduced) times, so every rank makes the same stop decision.
    while (static_cast<int>(times.size()) < o.max_reps &&
           (static_cast<int>(times.size()) < o.min_reps || spent < o.min_time)) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      reduce(buf.data(), count);
      double dt = MPI_Wtime() - t0, dt_max = 0;
      MPI_Allreduce(&dt, &dt_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times.push_back(dt_max);
      spent += dt_max;
    }
    std::vector<double> s = times;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    Row r;
    r.bytes = bytes;
    r.count = count;
    r.reps = static_cast<int>(n);
    r.median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    r.min = s.front();
    r.max = s.back();
    double sum = 0;
    for (double t : s) sum += t;
    r.mean = sum / n;
    rows.push_back(r);
    if (rank == 0) {
      std::printf("%12" PRId64 " B %6d reps  median %11.3f us  min %11.3f us  max %11.3f us  %8.3f GB/s algbw\n",
                  bytes, r.reps, r.median * 1e6, r.min * 1e6, r.max * 1e6, bytes / r.median / 1e9);
      std::fflush(stdout);
    }
  }
  int all_ok = 0, mine = ok ? 1 : 0;
  MPI_Allreduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);

  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\0')) v.pop_back();
    const char* call = o.rs_ag ? (o.nonblocking ? "MPI_Ireduce_scatter + memmove + MPI_Iallgatherv (in place, float, sum)"
                                                : "MPI_Reduce_scatter + memmove + MPI_Allgatherv (in place, float, sum)")
                               : (o.nonblocking ? "MPI_Iallreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM) + MPI_Wait"
                                                : "MPI_Allreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM)");
    std::string j = "{\"tool\":\"allreduce_bench\",\"call\":\"" + std::string(call) + "\"";
    j += ",\"collective\":\"" + std::string(o.rs_ag ? "reduce_scatter_allgather" : "allreduce") + "\"";
    j += ",\"nonblocking\":" + std::string(o.nonblocking ? "true" : "false");
    j += ",\"label\":\"" + json_escape(o.label) + "\"";
    j += ",\"world_size\":" + std::to_string(size) + ",\"nodes\":" + std::to_string(nodes) +
         ",\"ranks_per_node\":" + std::to_string(max_local);
    j += ",\"mpi_library\":\"" + json_escape(v) + "\"";
    j += ",\"correct\":" + std::string(all_ok ? "true" : "false");
    char settings[256];
    std::snprintf(settings, sizeof settings,
                  ",\"warmup\":%d,\"min_reps\":%d,\"max_reps\":%d,\"min_time_s\":%.17g,\"timing\":\"max over ranks per call, barrier before each\"",
                  o.warmup, o.min_reps, o.max_reps, o.min_time);
    j += settings;
    j += ",\"results\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      char b[320];
      std::snprintf(b, sizeof b,
                    "%s{\"bytes\":%" PRId64 ",\"count\":%" PRId64 ",\"reps\":%d,\"median_s\":%.9g,\"min_s\":%.9g,\"mean_s\":%.9g,\"max_s\":%.9g}",
                    i ? "," : "", r.bytes, r.count, r.reps, r.median, r.min, r.mean, r.max);
      j += b;
    }
    j += "]}\n";
    if (!o.out.empty()) {
      const std::string tmp = o.out + ".tmp";
      FILE* f = std::fopen(tmp.c_str(), "w");
      if (!f || std::fwrite(j.data(), 1, j.size(), f) != j.size() || std::fclose(f) != 0 ||
          std::rename(tmp.c_str(), o.out.c_str()) != 0) {
        std::fprintf(stderr, "allreduce_bench: cannot write %s: %s\n", o.out.c_str(), std::strerror(errno));
        all_ok = 0;
      } else {
        std::printf("allreduce_bench: %d rank(s) on %d node(s): wrote %s\n", size, nodes, o.out.c_str());
      }
    } else {
      std::fputs(j.c_str(), stdout);
    }
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
