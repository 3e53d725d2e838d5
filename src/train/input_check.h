// The input files a run reads (data.train, data.eval, model.weights), checked before any collective
// work: a missing file, a folder, an unreadable or non-HDF5 file, or weights that do not fit the
// configuration stop the run with one message naming the key, where it was set and the file
// (app/main.cpp agrees on it across ranks and prints it once).
#pragma once
#include <string>

#include "config/config.h"

namespace nlp {

// The first problem with the input files of cfg's run.mode, as a message naming key and file; ""
// when every file opens. Reads only the files' headers (not their data: TokenDataset checks that).
std::string check_input_files(const Config& cfg);

}  // namespace nlp
