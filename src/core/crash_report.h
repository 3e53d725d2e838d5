// A report on stderr when a rank dies of a fatal signal, so that a crash on a cluster node (or in
// CI, where no core file may be kept) says where it happened.
//
// SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT (glibc's heap checks, failed assertions) print one
// block, then the process dies of the same signal as it would without the handler (exit status,
// core dump):
//   nlptrain: rank 1 (host n2, pid 4242): fatal signal SIGSEGV (address not mapped) at address 0x0
//   nlptrain: rank 1: instruction pointer 0x0: not in any loaded module (a call through a null or
//             stale function pointer); the call came from 0x7f..: libmpi.so.40+0x6b3c1 (ompi_...)
//   nlptrain: rank 1: backtrace: ...
// The "call came from" line is what a plain backtrace cannot give: with the instruction pointer
// at 0 the unwinder stops at the signal frame (Open MPI's own handler prints nothing more). It is
// read from the stack (x86-64: the return address at the stack pointer; aarch64: the link register).
//
// Installed before MPI_Init, so that a crash inside MPI_Init is reported too: Open MPI installs its
// own handler only where a signal still has the default action (opal_signal), so it leaves these
// to this one. Until MPI_Init has run, the rank is the launcher's (PMIX_RANK, OMPI_COMM_WORLD_RANK,
// SLURM_PROCID, PMI_RANK; "?" without one). Not installed under AddressSanitizer or
// ThreadSanitizer: their reports are better, and they own these signals.
#pragma once

namespace nlp {

// Installs the report for this process, naming the launcher's rank. Returns false, and installs
// nothing, in a sanitizer build.
bool install_crash_report();
void set_crash_report_rank(int rank);  // the MPI rank, once known
bool crash_report_available();  // false in a sanitizer build

}  // namespace nlp
