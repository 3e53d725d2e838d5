// CPU attention forward and backward time at one shape (best of N calls), for comparing versions of
// src/backend/cpu/attention.cpp: build this file against another attention.cpp object to compare (see
// docs/performance.md, "CPU attention"). The checksum must not change between versions that claim the same
// numerics.
//   cpu_attention [B T NH HS threads]   (default: KorQuAD's fine-tuning shape 32 256 4 64, 2 threads)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/rng.h"

int main(int argc, char** argv) {
  auto arg = [&](int i, int d) { return argc > i ? std::atoi(argv[i]) : d; };
  const int B = arg(1, 32), T = arg(2, 256), NH = arg(3, 4), HS = arg(4, 64), threads = arg(5, 2);
  const int C = NH * HS;
  omp_set_num_threads(threads);
  std::vector<float> qkv((size_t)B * T * 3 * C), out((size_t)B * T * C);
  std::vector<float> att(nlp::cpu::attention_stats_floats(B, T, NH));  // the forward's saved state
  std::vector<float> dout(out.size()), dqkv(qkv.size());
  nlp::Rng r(1);
  for (auto& x : qkv) x = r.normal();
  for (auto& x : dout) x = r.normal();
  // padding: sequence b has 200 + b real positions (capped at T)
  std::vector<int32_t> mask((size_t)B * T, 1);
  for (int b = 0; b < B; ++b)
    for (int t = std::min(T, 200 + b); t < T; ++t) mask[(size_t)b * T + t] = 0;
  double best_f = 1e30, best_b = 1e30;
  for (int it = 0; it < 6; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    nlp::cpu::attention_forward(out.data(), att.data(), qkv.data(), mask.data(), false, 0.1f, 7, B, T,
                                NH, HS);
    const auto t1 = std::chrono::steady_clock::now();
    nlp::cpu::attention_backward(dqkv.data(), nullptr, dout.data(), qkv.data(), att.data(),
                                 mask.data(), false, 0.1f, 7, B, T, NH, HS);
    const auto t2 = std::chrono::steady_clock::now();
    best_f = std::min(best_f, std::chrono::duration<double>(t1 - t0).count());
    best_b = std::min(best_b, std::chrono::duration<double>(t2 - t1).count());
  }
  double sum = 0;
  for (float x : dqkv) sum += x;
  for (float x : out) sum += x;
  std::printf("B=%d T=%d NH=%d HS=%d threads=%d: forward %.1f ms, backward %.1f ms (best of 6), checksum %.10g\n",
              B, T, NH, HS, threads, best_f * 1e3, best_b * 1e3, sum);
  return 0;
}
