// Stopping a run on SIGINT, SIGTERM or SIGUSR1 (Ctrl-C; SLURM's --signal=USR1@120 before the walltime;
// scancel): the first one makes the trainer finish the step in progress, every rank agrees at the
// step boundary, a checkpoint is written and the run exits with kExitRequeue (75), which jobscripts
// turn into `scontrol requeue`; the requeued job runs with train.resume = true and continues from
// that checkpoint. A first signal during start-up (before the first step; in eval, predict, generate
// and gradients mode: at any time) ends the process at once with code 75 and no checkpoint. A second
// SIGINT or SIGTERM (not a SIGTERM repeated by the MPI launcher; a repeated SIGUSR1 changes nothing:
// the jobscripts re-send it until the ranks have stopped) ends the process at once with code 128 +
// signal, after removing the temporary files of writes in flight (io/atomic_file.h): a checkpoint
// is either complete under its final name or absent. Each signal is reported at once on stderr (and in
// log.txt) by rank 0 (a signal that reached another rank alone shows in the log at the step boundary).
//
// Under Open MPI's mpirun (4.1.4 measured), Ctrl-C reaches mpirun only: the ranks run in process
// groups of their own. mpirun then waits odls_base_sigkill_timeout seconds (1 by default), sends
// SIGTERM to every rank, after as long again SIGKILL, and exits with 1 whatever the ranks return; a
// SIGTERM to mpirun does the same, in and out of a terminal. Neither can be forwarded instead
// (ess_base_forward_signals refuses SIGINT and SIGTERM); SIGUSR1 to mpirun is forwarded to every
// rank, and the job's exit code is then 75. tools/nlprun runs mpirun so that SIGINT, SIGTERM and
// SIGHUP reach it as SIGUSR1. mpirun exports odls_base_sigkill_timeout to the ranks' environment
// (OMPI_MCA_odls_base_sigkill_timeout) when it is set in the environment or on its command line, so
// a SIGTERM from it says when the SIGKILL comes; the first report of a signal then says whether the
// step in progress and its checkpoint are expected to end before it (from the last step's time and
// the last checkpoint's), and names the newest checkpoint when not. A SIGINT or SIGTERM from someone
// else under SLURM (scancel, the time limit: SLURM's KillWait is not known here) is reported as "a
// checkpoint if the step ends before the launcher kills the ranks". Rank 0 also writes each report
// to log.txt (set_stop_log).
//
// The stop file: <output.dir>/STOP (kStopFileName), looked for by every rank at every step boundary
// (train/trainer_after_step.cpp), stops a training run like SIGUSR1 under any launcher.
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
#include <functional>
#include <string>

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

// What the report of a signal says of the step in progress (the trainer tells after each step how
// long it took, and after each checkpoint where it is and how long its write took).
void stop_note_step(double seconds);
void stop_note_checkpoint(const std::string& path, int64_t step, double seconds);
// Rank 0's reports of signals also go to log.txt through fn (nullptr: stderr only).
void set_stop_log(std::function<void(const std::string&)> fn);

// Open MPI's delay between its SIGTERM to the ranks and its SIGKILL (odls_base_sigkill_timeout, from
// OMPI_MCA_odls_base_sigkill_timeout, else an mca-params.conf file, else Open MPI's default of 1 s).
int ompi_sigkill_timeout();

// True once Open MPI's launcher has sent SIGTERM (it ends the job and reads the ranks' output no
// more): output to stdout is then dropped instead of waiting on a full pipe (train/log.cpp).
bool stop_output_abandoned();

// The stop file: created in output.dir by the user (touch <output.dir>/STOP), removed by the run.
constexpr const char* kStopFileName = "STOP";
bool stop_file_exists(const std::string& output_dir);
void remove_stop_file(const std::string& output_dir);  // no error when it is gone already

}  // namespace nlp
