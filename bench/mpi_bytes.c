/* Bytes on the wire per rank, counted at the MPI interface: a PMPI shim loaded with LD_PRELOAD
 * (bench/zero_stages.sh builds it with mpicc) that counts, per collective, the calls, the elements
 * handed to MPI and the bytes this rank sends under a bandwidth-optimal (ring) algorithm:
 *   allreduce of n elements          2 (P-1)/P n
 *   reduce-scatter, all-gather(v)    n - this rank's part     (= (P-1)/P n for equal parts)
 *   bcast, reduce, gatherv           n (at most; start-up and checkpoints, reported apart)
 * times the datatype's size. What Open MPI's chosen algorithm really sends differs by its own factor;
 * this is the algorithm-independent volume the ZeRO papers count (2x the parameter bytes per step
 * for stages 1 and 2, 3x for stage 3). At MPI_Finalize each rank writes $MPI_BYTES_OUT.rank<R>.json.
 *
 *   mpicc -shared -fPIC -O2 -o mpi_bytes.so bench/mpi_bytes.c
 *   MPI_BYTES_OUT=/tmp/run mpirun -np 2 -x LD_PRELOAD=$PWD/mpi_bytes.so -x MPI_BYTES_OUT build/nlptrain ...
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BCAST, REDUCE, GATHERV, NKIND };
static const char* kName[NKIND] = {"allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "gatherv"};
static long long calls[NKIND], elems[NKIND];
static double sent[NKIND];

static int world(MPI_Comm c) {
  int p = 1;
  PMPI_Comm_size(c, &p);
  return p;
}
static int me(MPI_Comm c) {
  int r = 0;
  PMPI_Comm_rank(c, &r);
  return r;
}
static int tsize(MPI_Datatype t) {
  int s = 0;
  PMPI_Type_size(t, &s);
  return s;
}
static void add(int k, long long n, double bytes_sent) {
  calls[k] += 1;
  elems[k] += n;
  sent[k] += bytes_sent;
}
static void allreduce(int count, MPI_Datatype t, MPI_Comm c) {
  const int p = world(c);
  add(ALLREDUCE, count, 2.0 * (p - 1) / p * (double)count * tsize(t));
}
static void reduce_scatter(const int* counts, MPI_Datatype t, MPI_Comm c) {
  const int p = world(c);
  long long n = 0;
  for (int i = 0; i < p; ++i) n += counts[i];
  add(REDUCE_SCATTER, n, (double)(n - counts[me(c)]) * tsize(t));
}
static void allgatherv(const int* counts, MPI_Datatype t, MPI_Comm c) {
  const int p = world(c);
  long long n = 0;
  for (int i = 0; i < p; ++i) n += counts[i];
  add(ALLGATHER, n, (double)(n - counts[me(c)]) * tsize(t));
}

int MPI_Allreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
  allreduce(n, t, c);
  return PMPI_Allreduce(s, r, n, t, o, c);
}
int MPI_Iallreduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, MPI_Comm c, MPI_Request* q) {
  allreduce(n, t, c);
  return PMPI_Iallreduce(s, r, n, t, o, c, q);
}
int MPI_Reduce_scatter(const void* s, void* r, const int* k, MPI_Datatype t, MPI_Op o, MPI_Comm c) {
  reduce_scatter(k, t, c);
  return PMPI_Reduce_scatter(s, r, k, t, o, c);
}
int MPI_Ireduce_scatter(const void* s, void* r, const int* k, MPI_Datatype t, MPI_Op o, MPI_Comm c,
                        MPI_Request* q) {
  reduce_scatter(k, t, c);
  return PMPI_Ireduce_scatter(s, r, k, t, o, c, q);
}
int MPI_Allgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int* k, const int* d,
                   MPI_Datatype rt, MPI_Comm c) {
  allgatherv(k, rt, c);
  return PMPI_Allgatherv(s, sn, st, r, k, d, rt, c);
}
int MPI_Iallgatherv(const void* s, int sn, MPI_Datatype st, void* r, const int* k, const int* d,
                    MPI_Datatype rt, MPI_Comm c, MPI_Request* q) {
  allgatherv(k, rt, c);
  return PMPI_Iallgatherv(s, sn, st, r, k, d, rt, c, q);
}
int MPI_Bcast(void* b, int n, MPI_Datatype t, int root, MPI_Comm c) {
  add(BCAST, n, (double)n * tsize(t));
  return PMPI_Bcast(b, n, t, root, c);
}
int MPI_Reduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, int root, MPI_Comm c) {
  add(REDUCE, n, (double)n * tsize(t));
  return PMPI_Reduce(s, r, n, t, o, root, c);
}
int MPI_Ireduce(const void* s, void* r, int n, MPI_Datatype t, MPI_Op o, int root, MPI_Comm c, MPI_Request* q) {
  add(REDUCE, n, (double)n * tsize(t));
  return PMPI_Ireduce(s, r, n, t, o, root, c, q);
}
int MPI_Gatherv(const void* s, int sn, MPI_Datatype st, void* r, const int* k, const int* d, MPI_Datatype rt,
                int root, MPI_Comm c) {
  add(GATHERV, sn, (double)sn * tsize(st));
  return PMPI_Gatherv(s, sn, st, r, k, d, rt, root, c);
}

int MPI_Finalize(void) {
  const char* out = getenv("MPI_BYTES_OUT");
  if (out && *out) {
    char path[4096];
    snprintf(path, sizeof path, "%s.rank%d.json", out, me(MPI_COMM_WORLD));
    FILE* f = fopen(path, "w");
    if (f) {
      fprintf(f, "{\"rank\": %d, \"world\": %d", me(MPI_COMM_WORLD), world(MPI_COMM_WORLD));
      for (int k = 0; k < NKIND; ++k)
        fprintf(f, ", \"%s\": {\"calls\": %lld, \"elements\": %lld, \"bytes_sent\": %.0f}", kName[k], calls[k],
                elems[k], sent[k]);
      fprintf(f, "}\n");
      fclose(f);
    }
  }
  return PMPI_Finalize();
}
