// Time per parameter of one AdamW step on the CPU: the host AdamW of train.offload = optimizer
// (src/train/host_adamw.cpp) against the CPU backend's adamw_update_spans (what train.offload = none
// runs on the cpu backend), on the tensors of a GPT-2 (its spans: weights with weight decay 0.1,
// biases and LayerNorm without). bench/adamw_rates.sh runs it beside torch.optim.AdamW
// (bench/adamw_torch.py) on the same CPU in the same run.
//
//   adamw_rates [n_layer 12] [n_embd 768] [vocab 50257] [threads 2] [steps 10]
//
// Prints one line per optimizer: the median, min and max over `steps` timed steps (after 2 untimed)
// of the step's wall time divided by the parameter count, in ns/parameter, and a bitwise check of the
// two on a copy of the first 2M parameters after 3 steps (host_adamw.h promises the same bits).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "core/backend.h"
#include "core/rng.h"
#include "train/host_adamw.h"

using nlp::Backend;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GPT-2's parameter tensors in nlptrain's order does not matter for the rate; their sizes and decay
// do (many small spans cost more than one large one).
std::vector<Backend::AdamWSpan> gpt2_spans(size_t L, size_t C, size_t V) {
  std::vector<Backend::AdamWSpan> s;
  size_t off = 0;
  auto add = [&](size_t n, float wd) {
    s.push_back({off, n, wd});
    off += n;
  };
  add(V * C, 0.1f);     // wte (tied LM head)
  add(1024 * C, 0.1f);  // wpe
  for (size_t l = 0; l < L; ++l) {
    add(C, 0), add(C, 0);                  // ln_1 weight, bias
    add(3 * C * C, 0.1f), add(3 * C, 0);   // c_attn
    add(C * C, 0.1f), add(C, 0);           // attn c_proj
    add(C, 0), add(C, 0);                  // ln_2
    add(4 * C * C, 0.1f), add(4 * C, 0);   // c_fc
    add(4 * C * C, 0.1f), add(C, 0);       // mlp c_proj
  }
  add(C, 0), add(C, 0);  // ln_f
  return s;
}

size_t total(const std::vector<Backend::AdamWSpan>& s) { return s.back().offset + s.back().numel; }

void fill(std::vector<float>& x, uint64_t seed, float scale) {
  nlp::Rng r{seed};
  for (float& e : x) e = scale * r.normal();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t L = argc > 1 ? std::atol(argv[1]) : 12, C = argc > 2 ? std::atol(argv[2]) : 768,
               V = argc > 3 ? std::atol(argv[3]) : 50257;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2, steps = argc > 5 ? std::atoi(argv[5]) : 10;
  omp_set_num_threads(threads);
  auto be = nlp::make_backend("cpu", threads, 0);
  const auto spans = gpt2_spans(L, C, V);
  const size_t N = total(spans);
  const float lr = 1e-4f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;

  // Bitwise check on the first spans up to 2M parameters: host AdamW vs the backend's, 3 steps.
  {
    std::vector<Backend::AdamWSpan> sub;
    for (const auto& sp : spans) {
      if (sp.offset >= (size_t(2) << 20)) break;
      sub.push_back({sp.offset, std::min(sp.numel, (size_t(2) << 20) - sp.offset), sp.weight_decay});
    }
    const size_t n = total(sub);
    std::vector<float> p(n), g(n), m(n, 0.f), v(n, 0.f);
    fill(p, 1, 0.02f), fill(g, 2, 1e-3f);
    std::vector<float> p2 = p, g2 = g, m2 = m, v2 = v;
    for (int t = 1; t <= 3; ++t) {
      nlp::host_adamw_update(p.data(), g.data(), m.data(), v.data(), sub, lr, b1, b2, eps, 0.5f, t);
      be->adamw_update_spans(p2.data(), g2.data(), m2.data(), v2.data(), sub, lr, b1, b2, eps, 0.5f, t, false);
    }
    const bool same = !std::memcmp(p.data(), p2.data(), n * 4) && !std::memcmp(m.data(), m2.data(), n * 4) &&
                      !std::memcmp(v.data(), v2.data(), n * 4);
    std::printf("bitwise host == backend after 3 steps on %zu parameters: %s\n", n, same ? "yes" : "NO");
  }

  std::printf("parameters %zu (n_layer %zu, n_embd %zu, vocab %zu), %zu spans, threads %d, timed steps %d\n", N, L,
              C, V, spans.size(), threads, steps);
  std::vector<float> p(N), g(N), m(N, 0.f), v(N, 0.f);
  fill(p, 3, 0.02f), fill(g, 4, 1e-3f);
  auto time = [&](const char* name, auto step) {
    std::vector<double> ns;
    for (int t = 1; t <= steps + 2; ++t) {
      const double t0 = now();
      step(t);
      if (t > 2) ns.push_back((now() - t0) * 1e9 / double(N));
    }
    std::sort(ns.begin(), ns.end());
    std::printf("%-8s ns/parameter median %.3f min %.3f max %.3f\n", name, ns[ns.size() / 2], ns.front(),
                ns.back());
  };
  time("host", [&](int t) {
    nlp::host_adamw_update(p.data(), g.data(), m.data(), v.data(), spans, lr, b1, b2, eps, 1.0f, t);
  });
  time("backend", [&](int t) {
    be->adamw_update_spans(p.data(), g.data(), m.data(), v.data(), spans, lr, b1, b2, eps, 1.0f, t, false);
  });
  return 0;
}
