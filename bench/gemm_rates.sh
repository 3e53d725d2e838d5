#!/usr/bin/env bash
# GEMM rates at the models' shapes: nlptrain's CPU GEMM libraries (build/gemm_rates: OpenBLAS, oneDNN
# fp32, oneDNN bf16 with and without the operand conversion) and PyTorch's (torch.mm fp32 and bf16, the
# same shapes, the same threads), into bench/results/gemm-rates-DATE-HARDWARE-COMMIT/gemm-rates-<date>-<commit>.txt
# (bench/result_dir.sh). The table behind
# run.cpu_gemm's and run.cpu_bf16's defaults (docs/performance.md, "CPU GEMM libraries").
#   bash bench/gemm_rates.sh [threads, default 2]
set -euo pipefail
cd "$(dirname "$0")/.."
TH=${1:-2}
B=${BUILD_DIR:-build}
cmake --build "$B" --target gemm_rates -j"$(nproc)" >/dev/null
. bench/result_dir.sh
OUTDIR=$(result_dir gemm-rates)
mkdir -p "$OUTDIR"
OUT=$OUTDIR/gemm-rates-$(date -u +%Y%m%d)-$(git rev-parse --short HEAD).txt
{
  echo "# date $(date -u -Is) | commit $(git rev-parse --short HEAD) | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512_bf16|amx_bf16|avx2|fma)$' | tr '\n' ' ')"
  echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
  OMP_NUM_THREADS=$TH "$B/gemm_rates" "$TH"
  echo
  echo "# PyTorch, the same shapes (torch.mm, row-major x @ W^T, dout^T @ x and dout @ W), $TH threads"
  python3 - "$TH" <<'PY'
import sys, time, torch
th = int(sys.argv[1]); torch.set_num_threads(th)
print("torch", torch.__version__, "| mkldnn", torch.backends.mkldnn.is_available())
shapes = [("bert4x256 qkv", 704, 256, 768), ("bert4x256 fc1", 704, 256, 1024), ("bert4x256 fc2", 704, 1024, 256),
          ("bert4x256 fc1 T128", 4096, 256, 1024), ("bert-base qkv", 4096, 768, 2304), ("bert-base fc1", 4096, 768, 3072),
          ("bert-base fc2", 4096, 3072, 768), ("gpt2 qkv 4x64", 256, 768, 2304), ("gpt2 fc1 4x128", 512, 768, 3072),
          ("gpt2 lm head 4x64", 256, 768, 50257)]
def rate(f, fl):
    f(); f(); t0 = time.perf_counter(); n = 0
    while time.perf_counter() - t0 < 0.3 or n < 3:
        f(); n += 1
    return fl * n / (time.perf_counter() - t0) / 1e9
print(f"{'shape MxKxN':20s} {'op':3s} {'torch f32':>12s} {'torch bf16':>12s}")
for name, M, K, N in shapes:
    for op in ("fwd", "dW", "dX"):
        r = []
        for dt in (torch.float32, torch.bfloat16):
            x, w, d = torch.randn(M, K, dtype=dt), torch.randn(N, K, dtype=dt), torch.randn(M, N, dtype=dt)
            f = {"fwd": lambda: x @ w.t(), "dW": lambda: d.t() @ x, "dX": lambda: d @ w}[op]
            r.append(rate(f, 2.0 * M * N * K))
        print(f"{name:20s} {op:3s} {r[0]:12.1f} {r[1]:12.1f}")
PY
} | tee "$OUT"
echo "wrote $OUT"
