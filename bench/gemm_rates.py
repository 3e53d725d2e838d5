#!/usr/bin/env python3
"""sgemm rate at BERT-4x256 fine-tuning shapes (M = B*T' rows): Debian OpenBLAS (OpenMP build), the
scipy-openblas32 wheel (0.3.34), torch (MKL). 2 threads each, row-major C = A @ B^T as nn.Linear."""
import ctypes, time, os, sys
import numpy as np
os.environ.setdefault("OMP_NUM_THREADS", "2")
import scipy_openblas32 as so
RowMajor, NoTrans, Trans = 101, 111, 112
def load(path, prefix):
    lib = ctypes.CDLL(path)
    f = getattr(lib, prefix + "cblas_sgemm")
    f.restype = None
    f.argtypes = [ctypes.c_int]*6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    for name in ("openblas_set_num_threads", prefix + "openblas_set_num_threads"):
        if hasattr(lib, name): getattr(lib, name)(2)
    return f
libs = {"debian-openblas-0.3.21": load("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", ""),
        "scipy-openblas32-0.3.34": load(os.path.join(so.get_lib_dir(), "libscipy_openblas.so"), "scipy_")}
import torch; torch.set_num_threads(2)
shapes = []
for M in (704, 4096):
    for (K, N) in ((256, 768), (256, 256), (256, 1024), (1024, 256)):
        shapes.append(("fwd", M, K, N))       # out[M,N] = x[M,K] W[N,K]^T
        shapes.append(("dW", N, M, K))        # dW[N,K] = dout[M,N]^T x[M,K]  (as [N,M]x[M,K])
print(f"{'shape':22s}" + "".join(f"{k:>26s}" for k in list(libs) + ["torch-mkl"]))
for kind, M, K, N in shapes:
    a = np.random.rand(M, K).astype(np.float32); b = np.random.rand(N, K).astype(np.float32); c = np.zeros((M, N), np.float32)
    flops = 2.0 * M * N * K
    row = f"{kind} {M}x{K}x{N}".ljust(22)
    for name, f in libs.items():
        def run():
            f(RowMajor, NoTrans, Trans, M, N, K, 1.0, a.ctypes.data, K, b.ctypes.data, K, 0.0, c.ctypes.data, N)
        for _ in range(3): run()
        n = max(5, int(0.3 / max(1e-6, (lambda t0: (run(), time.perf_counter() - t0)[1])(time.perf_counter()))))
        t0 = time.perf_counter()
        for _ in range(n): run()
        dt = (time.perf_counter() - t0) / n
        row += f"{flops / dt / 1e9:20.1f} GF/s"
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for _ in range(3): torch.mm(ta, tb.t())
    n = 20; t0 = time.perf_counter()
    for _ in range(n): torch.mm(ta, tb.t())
    dt = (time.perf_counter() - t0) / n
    row += f"{flops / dt / 1e9:20.1f} GF/s"
    print(row, flush=True)
