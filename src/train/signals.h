// Graceful stop on SIGUSR1 / SIGTERM (e.g. SLURM's --signal=USR1@120 before the walltime): the trainer
// finishes the current step, every rank agrees at the step boundary, a checkpoint is written and the
// run exits with kExitRequeue, which jobscripts turn into `scontrol requeue`. The requeued job runs
// with train.resume = true and continues from that checkpoint.
#pragma once

namespace nlp {

constexpr int kExitRequeue = 75;  // EX_TEMPFAIL: stopped on a signal after checkpointing; run again

void install_stop_handlers();  // SIGUSR1 and SIGTERM set the stop flag
int stop_signal();             // the signal received (0 = none)

}  // namespace nlp
