// The microbenchmark of overlap-zero-20261123.md ("The first version"): 25 MB summed between two
// ranks by each call, polled the way the communication thread polls. Build and run:
//   mpicxx -O2 -std=c++17 overlap-zero-20261123-ireduce-micro.cpp -o micro
//   OMPI_MCA_pml=ob1 mpirun -np 2 ./micro
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
using C = std::chrono::steady_clock;
double now() { return std::chrono::duration<double>(C::now().time_since_epoch()).count(); }
void wait(MPI_Request* r) {
  int d = 0;
  int p = 0;
  while (!d) {
    MPI_Test(r, &d, MPI_STATUS_IGNORE);
    if (++p % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}
int main(int argc, char** argv) {
  int pr;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &pr);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int n = 6553600;
  std::vector<float> a(n, 1.f);
  for (int rep = 0; rep < 3; rep++) {
    MPI_Request r;
    double t = now();
    MPI_Iallreduce(MPI_IN_PLACE, a.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    wait(&r);
    double t1 = now() - t;
    t = now();
    MPI_Ireduce(rank == 1 ? MPI_IN_PLACE : a.data(), rank == 1 ? a.data() : nullptr, n, MPI_FLOAT, MPI_SUM, 1,
                MPI_COMM_WORLD, &r);
    wait(&r);
    double t2 = now() - t;
    t = now();
    MPI_Reduce(rank == 1 ? MPI_IN_PLACE : a.data(), rank == 1 ? a.data() : nullptr, n, MPI_FLOAT, MPI_SUM, 1,
               MPI_COMM_WORLD);
    double t3 = now() - t;
    std::vector<int> c = {0, n};
    t = now();
    MPI_Ireduce_scatter(MPI_IN_PLACE, a.data(), c.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    wait(&r);
    double t4 = now() - t;
    std::vector<int> c2 = {n / 2, n / 2};
    t = now();
    MPI_Ireduce_scatter(MPI_IN_PLACE, a.data(), c2.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
    wait(&r);
    double t5 = now() - t;
    if (rank == 0)
      printf(
          "iallreduce %.1f ms  ireduce %.1f ms  reduce %.1f ms  ireduce_scatter[0,n] %.1f ms  "
          "ireduce_scatter[n/2,n/2] %.1f ms\n",
          t1 * 1e3, t2 * 1e3, t3 * 1e3, t4 * 1e3, t5 * 1e3);
  }
  MPI_Finalize();
}
