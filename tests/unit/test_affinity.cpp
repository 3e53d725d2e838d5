// plan_threads (core/cpu_affinity.h): the thread count from the affinity mask and the warnings with
// their fixes, for the launch situations users meet (bound to one core, unbound, bound to several,
// run.threads above the mask).
#include <gtest/gtest.h>

#include "core/cpu_affinity.h"

namespace {

nlp::CpuSet cpus(int allowed, int online, const char* list) { return nlp::CpuSet{allowed, online, list}; }

bool mentions(const std::vector<std::string>& w, const std::string& s) {
  for (const auto& x : w)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

TEST(PlanThreads, UnboundRanksShareTheNode) {
  auto p = nlp::plan_threads(0, 1, cpus(64, 64, "0-63"));
  EXPECT_EQ(p.threads, 64);
  EXPECT_TRUE(p.warnings.empty());
  p = nlp::plan_threads(0, 4, cpus(64, 64, "0-63"));  // mpirun --bind-to none, 4 ranks on the node
  EXPECT_EQ(p.threads, 16);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(PlanThreads, BoundRanksUseTheirMask) {
  // --map-by ppr:4:node:pe=16, or srun --cpus-per-task=16 --cpu-bind=cores
  auto p = nlp::plan_threads(0, 4, cpus(16, 64, "16-31"));
  EXPECT_EQ(p.threads, 16);
  EXPECT_TRUE(p.warnings.empty());
  // Open MPI's default for 2 ranks: one core each on a 64-core node: 1 thread (not 32 on one core),
  // and a warning naming the mask and the fixes
  p = nlp::plan_threads(0, 2, cpus(1, 64, "5"));
  EXPECT_EQ(p.threads, 1);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_TRUE(mentions(p.warnings, "affinity mask 5"));
  EXPECT_TRUE(mentions(p.warnings, "--bind-to none"));
  EXPECT_TRUE(mentions(p.warnings, "--map-by ppr:2:node:pe=T"));
  EXPECT_TRUE(mentions(p.warnings, "--cpus-per-task=T --cpu-bind=cores"));
  // one rank per core on a node full of ranks: nothing idles, no warning
  p = nlp::plan_threads(0, 2, cpus(1, 2, "1"));
  EXPECT_EQ(p.threads, 1);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(PlanThreads, RequestedThreadsAboveTheMaskWarn) {
  auto p = nlp::plan_threads(8, 1, cpus(2, 64, "0-1"));
  EXPECT_EQ(p.threads, 8);  // as asked, with a warning
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_TRUE(mentions(p.warnings, "run.threads = 8 but this rank may run on 2 CPU(s) (affinity mask 0-1"));
  p = nlp::plan_threads(2, 1, cpus(2, 64, "0-1"));
  EXPECT_EQ(p.threads, 2);
  EXPECT_TRUE(p.warnings.empty());
}

TEST(CurrentCpuSet, ReadsTheMask) {
  const nlp::CpuSet s = nlp::current_cpu_set();
  EXPECT_GE(s.allowed, 1);
  EXPECT_LE(s.allowed, s.online);
  EXPECT_FALSE(s.list.empty());
}

}  // namespace
