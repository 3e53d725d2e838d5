// Graceful stop on SIGUSR1 / SIGTERM (e.g. SLURM's --signal=USR1@120 before the walltime): the trainer
// finishes the current step, every rank agrees at the step boundary, a checkpoint is written and the
// run exits with kExitRequeue, which jobscripts turn into `scontrol requeue`. The requeued job runs
// with train.resume = true and continues from that checkpoint.
//
// Which thread takes the signal: one thread of its own, waiting in sigwait. main() blocks both
// signals before MPI_Init, so every thread started after (MPI's, the communicator's, OpenMP's) blocks
// them too, and no handler runs on a thread that is computing. That matters: oneDNN's AVX-512 sgemm
// kernel (jit_avx512_common_gemm_f32; oneDNN 2.6 here, reported up to 3.11 as uxlfoundation/oneDNN
// issue 4845) points the stack pointer into a heap buffer while it runs, so a handler run there
// writes its signal frame into the heap. Seen here as "corrupted size vs. prev_size" in a later
// free(), in about 1 of 10 SIGUSR1 stops of a 2-rank run over TCP. tests/python/test_reliability.py
// checks the threads' masks; the SLURM test (tests/integration) stops runs with SIGUSR1.
#pragma once

namespace nlp {

constexpr int kExitRequeue = 75;  // EX_TEMPFAIL: stopped on a signal after checkpointing; run again

void block_stop_signals();     // SIGUSR1 and SIGTERM blocked in this thread (and the threads it starts)
void install_stop_handlers();  // SIGUSR1 and SIGTERM set the stop flag (taken by a thread of their own)
int stop_signal();             // the signal received (0 = none)

}  // namespace nlp
