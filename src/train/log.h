// Rank-0 logging to stdout and <output.dir>/log.txt, and metrics as JSON lines in
// <output.dir>/metrics.jsonl. Other ranks write nothing.
//
// Nothing in output.dir is touched before start(): open() only checks that the folder can be written,
// and lines logged before start() are printed and kept in memory. A run calls start() once every
// input has been validated on every rank, so a run stopped by bad input leaves an earlier run's
// log.txt, metrics.jsonl and config.ini as they were.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace nlp {

class Log {
 public:
  explicit Log(int rank) : rank_(rank) {}
  ~Log();
  // Remember dir (created if missing) and check that it is writable; append=true when resuming.
  // config_ini: written to <dir>/config.ini (atomically) by start().
  void open(const std::string& dir, bool append, const std::string& config_ini = "");
  // Replace what start() writes, and under which name in dir (config.ini for training; eval,
  // predict and generate runs write config.<mode>.ini so that they keep the training run's file).
  void set_config(const std::string& file_name, const std::string& config_ini);
  // start() then leaves the configuration file that is in output.dir as it is (a no-op resume).
  void keep_config_file() { config_ini_.clear(); }
  // Write config.ini, open log.txt and metrics.jsonl (truncated unless appending) and write the
  // lines logged so far. Idempotent.
  void start();
  bool started() const { return started_; }
  bool is_root() const { return rank_ == 0; }
  void info(const std::string& line);   // one line, newline added
  // One line in log.txt only (kept for start() before it): what stderr has said already (the reports
  // of stop signals, from the thread that takes them; info and note may be called from two threads).
  void note(const std::string& line);
  void metrics(const std::string& json_line);  // "run_id" is added first when the run has one
  // The training run's id (train/run_folder.h), the same on every rank; "" = none (other modes).
  void set_run_id(const std::string& id) { run_id_ = id; }
  // Run by start() on rank 0 before it writes anything (output.overwrite moves the earlier run
  // aside there, once every input has been validated).
  void set_before_start(std::function<void()> fn) { before_start_ = std::move(fn); }
  const std::string& run_id() const { return run_id_; }
  // Resume: removes from metrics.jsonl every record of a step after `step` (written by an interrupted
  // run after its last checkpoint; the resumed run writes them again) and any line that is not a
  // complete record (a write cut off by a kill). The file is rewritten atomically. Returns the number
  // of lines removed (0 on ranks other than 0).
  int64_t drop_metrics_after(int64_t step);

 private:
  int rank_;
  std::string dir_, config_ini_, config_name_ = "config.ini", run_id_;
  bool append_ = false, started_ = false;
  std::vector<std::string> pending_, pending_metrics_;  // logged before start()
  std::function<void()> before_start_;
  std::FILE* log_ = nullptr;
  std::FILE* metrics_ = nullptr;
  std::mutex mutex_;  // pending_ and log.txt: info() and note() (the signal thread's)
};

// The lines of metrics.jsonl text to keep when resuming at `step`: complete {...} records whose
// "step" is <= step, and complete records without a "step" (run.mode = eval results). Records of a
// later step, and lines that are not a complete {...} object (a write cut off by a kill), are
// dropped. `dropped` counts the lines removed.
std::string filter_metrics_after(const std::string& text, int64_t step, int64_t* dropped);

// A JSON object on one line: Json().num("step", 3).str("split", "eval").done()
class Json {
 public:
  Json& num(const std::string& key, double v);    // 9 significant digits
  Json& exact(const std::string& key, double v);  // 17 digits: round-trips the double bitwise
  Json& integer(const std::string& key, long long v);
  Json& str(const std::string& key, const std::string& v);
  Json& boolean(const std::string& key, bool v);
  Json& raw(const std::string& key, const std::string& json);  // an already-encoded JSON value
  std::string done() const { return s_ + "}"; }

 private:
  void key(const std::string& k);
  Json& number(const std::string& k, double v, const char* fmt);
  std::string s_ = "{";
};

std::string json_string(const std::string& v);  // v as a quoted, escaped JSON string
std::string format_duration(double seconds);  // "1h02m03s", "4m05s", "12.3s"

}  // namespace nlp
