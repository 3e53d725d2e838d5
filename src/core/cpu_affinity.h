// CPU threads per rank from the CPU set the launcher gave the process (sched_getaffinity), not from
// the node's core count: Open MPI binds each rank to one core by default for 2 ranks or fewer, and
// threads sized by the node then pile onto that core (measured: 147.8 ms per GPT-2 step
// under `mpirun -np 1` against 79.6 ms unbound, 2 threads on the 2-core development machine).
#pragma once
#include <string>
#include <vector>

namespace nlp {

struct CpuSet {
  int allowed = 0;  // CPUs in this process's affinity mask
  int online = 0;   // CPUs online on the node
  std::string list;  // the mask as a list, e.g. "0-3,8"
};
CpuSet current_cpu_set();

struct ThreadPlan {
  int threads = 1;
  std::vector<std::string> warnings;  // each with the fix
};
// run.threads (0 = automatic) for one of `local_ranks` ranks on this node:
//  - automatic: the CPUs of the mask when the launcher bound the rank (mask < online), else the
//    node's CPUs divided among its ranks;
//  - a warning when run.threads asks for more threads than the mask has CPUs, and when a rank is
//    bound to a single CPU on a node with more (both name the mask, the likely binding and the fix).
ThreadPlan plan_threads(int requested, int local_ranks, const CpuSet& cpus);

}  // namespace nlp
