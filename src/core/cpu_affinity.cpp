#include "core/cpu_affinity.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"

namespace nlp {

CpuSet current_cpu_set() {
  CpuSet s;
  s.online = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) {  // no mask to read: assume the node
    s.allowed = s.online;
    s.list = cat("0-", s.online - 1);
    return s;
  }
  s.allowed = CPU_COUNT(&mask);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &mask)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &mask)) ++e;
    s.list += cat(s.list.empty() ? "" : ",", c, e > c ? cat("-", e) : std::string());
    c = e;
  }
  return s;
}

ThreadPlan plan_threads(int requested, int local_ranks, const CpuSet& cpus) {
  ThreadPlan p;
  local_ranks = std::max(1, local_ranks);
  const bool bound = cpus.allowed < cpus.online;
  const std::string fix = cat(
      "launch with `mpirun --bind-to none` (threads share the node), or give each rank T cores: "
      "`mpirun --map-by ppr:", local_ranks, ":node:pe=T` (Open MPI), `srun --cpus-per-task=T --cpu-bind=cores` "
      "(SLURM), or `taskset -c LIST`");
  if (requested > 0) {
    p.threads = requested;
    if (requested > cpus.allowed)
      p.warnings.push_back(cat("warning: run.threads = ", requested, " but this rank may run on ", cpus.allowed,
                               " CPU(s) (affinity mask ", cpus.list, " of ", cpus.online,
                               " online: bound by the launcher, taskset or a cgroup): the threads share those CPUs and slow "
                               "each other down; ", fix));
    return p;
  }
  p.threads = bound ? cpus.allowed : std::max(1, cpus.online / local_ranks);
  if (bound && cpus.allowed == 1 && cpus.online > local_ranks)
    p.warnings.push_back(cat("warning: this rank is bound to 1 CPU (affinity mask ", cpus.list, ") of the ",
                             cpus.online, " online, so it runs 1 thread while ", cpus.online - local_ranks,
                             " CPU(s) of the node may stay idle (Open MPI binds each rank to a core by "
                             "default for up to 2 ranks); ", fix));
  return p;
}

}  // namespace nlp
