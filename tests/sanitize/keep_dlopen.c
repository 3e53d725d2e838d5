// Test helper for the sanitizer build's mpirun test (tests/sanitize/test_mpi_train.sh), LD_PRELOADed
// into each rank: dlclose() does nothing, so shared objects stay mapped until the process exits.
// Open MPI dlopen()s its MCA components and dlclose()s them in MPI_Finalize; LeakSanitizer runs
// after that, when the components' code and static data are gone. Memory they still referenced
// then looks leaked, and the allocating frames show as "<unknown module>", which no suppression
// can name. With the components kept mapped, their globals are scanned as roots, stacks are
// symbolized, and tests/sanitize/lsan.supp can name Open MPI's libraries precisely.
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
