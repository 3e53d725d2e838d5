// Stopping a run on SIGINT, SIGTERM or SIGUSR1 (Ctrl-C; SLURM's --signal=USR1@120 before the walltime;
// scancel): the first one makes the trainer finish the step in progress, every rank agrees at the
// step boundary, a checkpoint is written and the run exits with kExitRequeue (75), which jobscripts
// turn into `scontrol requeue`; the requeued job runs with train.resume = true and continues from
// that checkpoint. A first signal during start-up (before the first step; in eval, predict, generate
// and gradients mode: at any time) ends the process at once with code 75 and no checkpoint. A second
// SIGINT or SIGTERM (not a SIGTERM repeated by the MPI launcher; a repeated SIGUSR1 changes nothing:
// the jobscripts re-send it until the ranks have stopped) ends the process at once with code 128 +
// signal, after removing the temporary files of writes in flight (io/atomic_file.h): a checkpoint
// is either complete under its final name or absent. Each signal is reported at once on stderr by
// rank 0 (a signal that reached another rank alone shows in the log at the step boundary).
//
// Under Open MPI's mpirun (4.1.4 measured), Ctrl-C reaches mpirun only: the ranks run in process
// groups of their own. mpirun then waits odls_base_sigkill_timeout seconds (1 by default), sends
// SIGTERM to every rank, after as long again SIGKILL, and exits with 1 whatever the ranks return; a
// SIGTERM to mpirun does the same. The ranks report that SIGTERM as coming from mpirun, and the run
// checkpoints only when the step in progress ends within that second. SIGUSR1 to mpirun is forwarded
// to every rank, and the job's exit code is then 75.
//
// Which thread takes the signal: one thread of its own, waiting in sigwaitinfo. main() blocks the
// signals before MPI_Init, so every thread started after (MPI's, the communicator's, OpenMP's) blocks
// them too, and no handler runs on a thread that is computing. That matters: oneDNN's AVX-512 sgemm
// kernel (jit_avx512_common_gemm_f32; oneDNN 2.6 here, reported up to 3.11 as uxlfoundation/oneDNN
// issue 4845) points the stack pointer into a heap buffer while it runs, so a handler run there
// writes its signal frame into the heap. Seen here as "corrupted size vs. prev_size" in a later
// free(), in about 1 of 10 SIGUSR1 stops of a 2-rank run over TCP. tests/python/test_reliability.py
// checks the threads' masks; the SLURM test (tests/integration) stops runs with SIGUSR1.
#pragma once
#include <cstdint>

namespace nlp {

constexpr int kExitRequeue = 75;  // EX_TEMPFAIL: stopped on a signal after checkpointing; run again

void block_stop_signals();     // SIGINT, SIGUSR1 and SIGTERM blocked in this thread (and those it starts)
void install_stop_handlers();  // the stop signals set the stop flag (taken by a thread of their own)
void set_stop_rank(int rank);  // rank 0 reports signals on stderr as they come
int stop_signal();             // the signal received (0 = none)
// From now on the stop signals change nothing (the process is ending on an error: MPI_Abort, whose
// SIGTERM to the other ranks is not a stop to report).
void ignore_stop_signals();

// At a step boundary (and once before the first step, with next_step = the first step): the signal
// received so far (0 = none); when none, records that a signal from now on stops the run after step
// `next_step` (1-based), which is what the report of a signal then says. Before the first call a
// signal is reported as arriving in start-up.
int stop_check(int64_t next_step);

}  // namespace nlp
