// GEMM rates at the models' shapes through the CPU backend's own dispatch (src/backend/cpu/gemm.h):
// OpenBLAS sgemm, oneDNN sgemm, oneDNN bf16 (fp32 accumulation) with bf16 operands, and the same bf16
// GEMM including the fp32 -> bf16 conversion of both operands (what one native-bf16 matmul costs).
// Row-major out[M,N] = x[M,K] W[N,K]^T (nn.Linear), the input gradient dx[M,K] = dout W and the weight
// gradient dW[N,K] = dout^T x: the three GEMMs of a linear layer's training step.
// The library choice of run.cpu_gemm and the bf16 path of run.cpu_bf16 rest on this table
// (docs/performance.md, "CPU GEMM libraries"). Run by bench/gemm_rates.sh, which adds PyTorch's rates.
//   gemm_rates [threads]
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/round.h"
#include "core/rng.h"

extern "C" void openblas_set_num_threads(int);

using nlp::cpu::bf16;
using nlp::cpu::GemmLib;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GFLOP/s of f: two warm-up calls, then at least 3 calls and 0.3 s
template <class F>
double rate(F f, double flops) {
  f();
  f();
  const double t0 = now();
  int n = 0;
  while (now() - t0 < 0.3 || n < 3) {
    f();
    ++n;
  }
  return flops * n / (now() - t0) / 1e9;
}

struct Shape {
  const char* name;
  int M, K, N;
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  std::string what;
  const bool dnnl = nlp::cpu::onednn_available(&what);
  const bool native = nlp::cpu::native_bf16_available(&what);
  std::printf("threads %d | %s | %s | native bf16: %s\n", threads,
              nlp::cpu::gemm_lib_description(GemmLib::OpenBlas).c_str(),
              nlp::cpu::gemm_lib_description(GemmLib::OneDnn).c_str(), native ? what.c_str() : what.c_str());
  // M = rows (B x T): BERT 4x256 fine-tuning batches (704 = a grouped NSMC batch, 4096 = 32 x 128),
  // BERT-base (32 x 128), GPT-2 124M (4 x 64 and 4 x 128), the GPT-2 LM head (vocab 50257).
  const Shape shapes[] = {
      {"bert4x256 qkv", 704, 256, 768},   {"bert4x256 fc1", 704, 256, 1024},
      {"bert4x256 fc2", 704, 1024, 256},  {"bert4x256 fc1 T128", 4096, 256, 1024},
      {"bert-base qkv", 4096, 768, 2304}, {"bert-base fc1", 4096, 768, 3072},
      {"bert-base fc2", 4096, 3072, 768}, {"gpt2 qkv 4x64", 256, 768, 2304},
      {"gpt2 fc1 4x128", 512, 768, 3072}, {"gpt2 lm head 4x64", 256, 768, 50257},
  };
  std::printf("%-20s %-3s %12s %12s %12s %14s   (GFLOP/s)\n", "shape MxKxN", "op", "openblas f32",
              "onednn f32", "onednn bf16", "bf16+convert");
  nlp::Rng rng(1);
  for (const Shape& s : shapes) {
    const int M = s.M, K = s.K, N = s.N;
    std::vector<float> x((size_t)M * K), w((size_t)N * K), dout((size_t)M * N), out((size_t)M * N),
        dw((size_t)N * K), dx((size_t)M * K);
    for (auto& v : x) v = rng.normal();
    for (auto& v : w) v = 0.05f * rng.normal();
    for (auto& v : dout) v = rng.normal();
    std::vector<bf16> xb(x.size()), wb(w.size()), db(dout.size());
    auto conv = [](const std::vector<float>& a, std::vector<bf16>& b) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < a.size(); ++i) b[i].bits = nlp::cpu::to_bf16_bits(a[i]);
    };
    conv(x, xb), conv(w, wb), conv(dout, db);
    const double fl = 2.0 * M * N * K;
    for (int op = 0; op < 3; ++op) {  // 0: forward, 1: weight gradient, 2: input gradient
      double r[4] = {0, 0, 0, 0};
      auto f32 = [&](GemmLib lib) {
        if (op == 0)
          nlp::cpu::gemm(lib, false, true, M, N, K, x.data(), K, w.data(), K, 0.0f, out.data(), N);
        else if (op == 1)
          nlp::cpu::gemm(lib, true, false, N, K, M, dout.data(), N, x.data(), K, 1.0f, dw.data(), K);
        else
          nlp::cpu::gemm(lib, false, false, M, K, N, dout.data(), N, w.data(), K, 0.0f, dx.data(), K);
      };
      auto b16 = [&] {
        if (op == 0)
          nlp::cpu::gemm(GemmLib::OneDnn, false, true, M, N, K, xb.data(), K, wb.data(), K, 0.0f, out.data(), N);
        else if (op == 1)
          nlp::cpu::gemm(GemmLib::OneDnn, true, false, N, K, M, db.data(), N, xb.data(), K, 1.0f, dw.data(), K);
        else
          nlp::cpu::gemm(GemmLib::OneDnn, false, false, M, K, N, db.data(), N, wb.data(), K, 0.0f, dx.data(), K);
      };
      r[0] = rate([&] { f32(GemmLib::OpenBlas); }, fl);
      if (dnnl) r[1] = rate([&] { f32(GemmLib::OneDnn); }, fl);
      if (native) {
        r[2] = rate(b16, fl);
        r[3] = rate([&] {
          if (op == 0) conv(x, xb), conv(w, wb);
          else if (op == 1) conv(dout, db), conv(x, xb);
          else conv(dout, db), conv(w, wb);
          b16();
        }, fl);
      }
      char name[64];
      std::snprintf(name, sizeof name, "%s", s.name);
      static const char* const kOp[3] = {"fwd", "dW", "dX"};
      // the product's M x K x N as computed: forward M,K,N; weight gradient N,M,K; input gradient M,N,K
      const int pm = op == 1 ? N : M, pk = op == 0 ? K : op == 1 ? M : N, pn = op == 0 ? N : K;
      std::printf("%-20s %-3s %12.1f %12.1f %12.1f %14.1f   %dx%dx%d\n", name, kOp[op], r[0], r[1],
                  r[2], r[3], pm, pk, pn);
    }
  }
  return 0;
}
