// Atomic file replacement: write `<path>.tmp.<pid>`, fsync it, rename it onto `path`, fsync the
// folder. Readers (and a job killed half-way) never see a partial file, and a failed write (disk
// full, RLIMIT_FSIZE, a removed folder) removes the temporary file and leaves the previous `path`.
// h5::write_atomically (io/h5.h) uses the same three steps for HDF5 files.
#pragma once
#include <string>

namespace nlp {

// Creates path's folder when missing and returns the temporary name to write to.
void atomic_begin(const std::string& path, std::string* tmp_path);
// fsync(tmp), rename(tmp, path), fsync(folder); throws naming both paths on failure.
void atomic_commit(const std::string& tmp_path, const std::string& path);
// Removes the temporary file (no error when it is already gone).
void atomic_abort(const std::string& tmp_path);

// The temporary files begun and neither committed nor aborted yet (in this process), removed by
// remove_pending_temporaries(): an immediate exit (a second stop signal, train/signals.h) leaves no
// temporary file behind. The final names are never touched: they hold a complete file or none.
void remove_pending_temporaries();

// Replaces the text file `path` by `text` atomically; throws nlp::Error naming the path and the
// reason (and leaves no temporary file) when it cannot.
void write_text_atomically(const std::string& path, const std::string& text);

}  // namespace nlp
