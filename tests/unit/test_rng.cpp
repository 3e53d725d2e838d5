// core/rng.h's host generator: Rng::fill_normal (the weights' initialisation, in parallel) gives the
// values and the final counter of the same number of Rng::normal() calls in turn, bitwise, from any
// starting counter (odd ones included: a uniform() call before) and with several OpenMP threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/rng.h"

namespace {

TEST(Rng, FillNormalEqualsNormalCallsInTurn) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);  // ctest runs with OMP_NUM_THREADS=1: the parallel path needs more
  for (int skip : {0, 1, 2}) {       // uniform() calls first: the counter starts even or odd
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(1) << 17}) {  // 2^17: parallel
      SCOPED_TRACE(testing::Message() << "skip " << skip << " n " << n);
      nlp::Rng a(0xC0FFEE), b(0xC0FFEE);
      for (int k = 0; k < skip; ++k) a.uniform(), b.uniform();
      std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), -1.f);
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = 0.02f * a.normal();
      b.fill_normal(got.data(), n, 0.02f);
      EXPECT_EQ(0, n ? std::memcmp(want.data(), got.data(), size_t(n) * sizeof(float)) : 0);
      EXPECT_EQ(a.counter, b.counter);
      EXPECT_EQ(a.normal(), b.normal()) << "the streams go on alike";
    }
  }
  // and the values are standard normal (times the scale): mean ~0, variance ~scale^2
  nlp::Rng r(42);
  std::vector<float> v(1 << 18);
  r.fill_normal(v.data(), int64_t(v.size()), 2.0f);
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  const double mean = s / v.size(), var = s2 / v.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 4.0, 0.05);
  omp_set_num_threads(threads);
}

}  // namespace
