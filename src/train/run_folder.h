// One training run per output folder, and the run id that names it.
//
// A run id (e.g. "20261128T170512Z-3fa9c2": UTC start time and 24 random bits) is made by rank 0 when
// a training run starts afresh, broadcast to every rank, kept across resumes, and written into every
// checkpoint (root attribute nlptrain_run_id), every metrics.jsonl record ("run_id"), summary.json and
// the one-line file <output.dir>/run_id.
//
// A training run without train.resume refuses an output.dir that holds another run's files
// (checkpoints/step_*.h5, or metrics.jsonl with at least one record), naming what is there and the
// ways on (train.resume = true, output.overwrite = true, another output.dir), before it writes
// anything. With output.overwrite = true it moves every entry of the folder except nlptrain.lock and
// previous/ into <output.dir>/previous/<old run id>/ by rename(2) once every input has been validated,
// right before the run's first write (Log::start; bad input leaves the folder as it was): nothing is
// copied or deleted, the run keeps holding the folder's lock (run_lock.h) all the while, and an
// interruption leaves each entry either where it was or moved whole.
//
// A resume continues the run named by <output.dir>/run_id: checkpoints of another run id are not
// used (resume.h). A folder without the file (written before run ids existed) resumes from any
// checkpoint, and the run takes the chosen checkpoint's id, or a new one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "config/config.h"
#include "train/log.h"

namespace nlp {

constexpr const char* kRunIdFile = "run_id";        // <output.dir>/run_id
constexpr const char* kPreviousDir = "previous";    // <output.dir>/previous/<run id>/
constexpr const char* kRunIdAttr = "nlptrain_run_id";  // checkpoint root attribute

// What an output folder holds of earlier training runs.
struct RunFolder {
  std::string run_id;                    // <dir>/run_id ("" = none)
  std::vector<std::string> checkpoints;  // file names in <dir>/checkpoints (step_*.h5), newest first
  int64_t metrics_records = 0;           // non-empty lines of <dir>/metrics.jsonl
  int64_t last_metrics_step = -1;        // "step" of the last record that has one (-1 = none)
  bool used() const { return !checkpoints.empty() || metrics_records > 0; }
};

// Reads `dir` (missing = empty); nothing is written.
RunFolder inspect_run_folder(const std::string& dir);

// The refusal of a fresh run into a used folder: what is there and the three ways on.
std::string used_folder_message(const std::string& dir, const RunFolder& f);

// A new run id: UTC time of day and 24 random bits ("20261128T170512Z-3fa9c2").
std::string new_run_id();

// The run id in a line of text as written to <dir>/run_id ("" when the text holds none): letters,
// digits, '-', '_', '.' only, so that it can name a folder.
std::string parse_run_id(const std::string& text);

// Moves every entry of `dir` except nlptrain.lock and previous/ into <dir>/previous/<name>/ where
// <name> is `old_id` (or "unnamed" when empty), with "-2", "-3", ... added when taken. Returns the
// folder moved to. Throws an Error naming the entry that could not be moved.
std::string move_run_aside(const std::string& dir, const std::string& old_id);

// The run id a checkpoint file records ("" when it records none or cannot be read).
std::string checkpoint_run_id(const std::string& path);

// Removes the temporary files of atomic writes (<name>.tmp.<pid>, io/atomic_file.h) in <dir> and
// <dir>/checkpoints: left by a run that was killed mid-write (SIGKILL). Only while holding the
// folder's lock (no other writer). Returns the paths removed.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

// Writes <dir>/run_id atomically.
void write_run_id(const std::string& dir, const std::string& id);

// Collective, before anything else is written to output.dir (after RunLock::acquire): for a
// training run, refuses a used folder and sets the run id
// on `log` (every rank): a new one for a fresh run, the folder's for a resume ("" when the folder
// has none: the resume sets it from the checkpoint it takes). Leaves to `log`'s start (rank 0, once the
// inputs are validated) what changes the folder: removing stale temporary files, moving the earlier
// run aside (output.overwrite) and writing <dir>/run_id. Other modes: nothing. Throws the same Error
// on every rank when the folder is refused.
void claim_run_folder(Comm& comm, const Config& cfg, Log& log);

}  // namespace nlp
