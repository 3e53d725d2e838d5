#include "train/log.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "text/json_min.h"
#include "train/signals.h"

namespace nlp {
namespace {

// text to stdout without waiting for ever on a reader that stopped reading: mpirun, ending a job on
// Ctrl-C or SIGTERM, may read the ranks' output no more, and a log line every step fills the pipe
// long before the ranks' SIGTERM comes (measured with 1 ms steps); a rank blocked in that write would never reach the step's end
// and its checkpoint. So it waits for room in 100 ms slices, and gives up once mpirun's SIGTERM has
// come (log.txt has every line).
void write_stdout(const std::string& text) {
  size_t off = 0;
  while (off < text.size() && !stop_output_abandoned()) {
    pollfd p{1, POLLOUT, 0};
    const int r = ::poll(&p, 1, 100);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (r > 0 && (p.revents & (POLLERR | POLLNVAL)))) return;
    if (r == 0) continue;
    // POLLOUT on a pipe: PIPE_BUF bytes fit without blocking
    const ssize_t n = ::write(1, text.data() + off, std::min<size_t>(text.size() - off, PIPE_BUF));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;  // EPIPE: the reader is gone
    }
    off += static_cast<size_t>(n);
  }
}

}  // namespace

Log::~Log() {
  if (log_) std::fclose(log_);
  if (metrics_) std::fclose(metrics_);
}

void Log::open(const std::string& dir, bool append, const std::string& config_ini) {
  dir_ = dir;
  append_ = append;
  config_ini_ = config_ini;
  if (rank_ != 0) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw Error(cat("output.dir = '", dir, "' exists and is not a directory"));
  fs::create_directories(dir, ec);
  if (ec) throw Error(cat("output.dir = '", dir, "': cannot create the directory: ", ec.message()));
  // Probe: create and remove a file, so that an unwritable folder stops the run before any work.
  const std::string probe = cat(dir, "/.nlptrain-write-test.", static_cast<long long>(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0)
    throw Error(cat("output.dir = '", dir, "' is not writable: ", std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

void Log::set_config(const std::string& file_name, const std::string& config_ini) {
  config_name_ = file_name;
  config_ini_ = config_ini;
}

void Log::start() {
  if (rank_ != 0 || started_) return;
  if (before_start_) {
    auto fn = std::move(before_start_);
    before_start_ = nullptr;
    fn();
  }
  started_ = true;
  if (dir_.empty()) return;  // never opened (tests)
  if (!config_ini_.empty()) write_text_atomically(dir_ + "/" + config_name_, config_ini_);
  const char* mode = append_ ? "a" : "w";
  log_ = std::fopen((dir_ + "/log.txt").c_str(), mode);
  const int log_err = errno;
  metrics_ = std::fopen((dir_ + "/metrics.jsonl").c_str(), mode);
  if (!log_ || !metrics_)
    throw Error(cat("output.dir: cannot write log.txt / metrics.jsonl in '", dir_, "': ",
                    std::strerror(log_ ? errno : log_err)));
  for (const auto& line : pending_) std::fprintf(log_, "%s\n", line.c_str());
  for (const auto& line : pending_metrics_) std::fprintf(metrics_, "%s\n", line.c_str());
  pending_.clear();
  pending_metrics_.clear();
  std::fflush(log_);
  std::fflush(metrics_);
  if (!config_ini_.empty()) info(cat("effective configuration written to ", dir_, "/", config_name_));
}

void Log::note(const std::string& line) {
  if (rank_ != 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) pending_.push_back(line);
  if (log_) {
    std::fprintf(log_, "%s\n", line.c_str());
    std::fflush(log_);
  }
}

void Log::info(const std::string& line) {
  if (rank_ != 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // not held while stdout may wait (note() goes on)
    if (!started_) pending_.push_back(line);
    if (log_) {
      std::fprintf(log_, "%s\n", line.c_str());
      std::fflush(log_);
    }
  }
  std::fflush(stdout);  // anything printed through stdio first
  write_stdout(line + "\n");
}

void Log::metrics(const std::string& record) {
  if (rank_ != 0) return;
  const std::string json_line = run_id_.empty() || record.size() < 2 || record[0] != '{'
                                    ? record
                                    : cat("{\"run_id\":", json_string(run_id_), record.size() > 2 ? "," : "",
                                          record.substr(1));
  if (!started_) pending_metrics_.push_back(json_line);
  if (!metrics_) return;
  std::fprintf(metrics_, "%s\n", json_line.c_str());
  std::fflush(metrics_);
}

std::string filter_metrics_after(const std::string& text, int64_t step, int64_t* dropped) {
  std::string kept;
  int64_t n_dropped = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    bool keep = false;
    const size_t at = line.find("\"step\":");
    if (line.front() == '{' && line.back() == '}') {
      if (at == std::string::npos) {
        keep = true;  // a complete record of no training step (run.mode = eval writes those)
      } else {
        const char* begin = line.c_str() + at + 7;
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(begin, &end, 10);
        keep = end != begin && errno == 0 && v <= step;
      }
    }
    if (keep) kept += line + "\n";
    else ++n_dropped;
  }
  if (dropped) *dropped = n_dropped;
  return kept;
}

int64_t Log::drop_metrics_after(int64_t step) {
  if (rank_ != 0 || !metrics_) return 0;
  const std::string path = dir_ + "/metrics.jsonl";
  std::fclose(metrics_);
  metrics_ = nullptr;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  int64_t dropped = 0;
  const std::string all = text.str();
  const std::string kept = filter_metrics_after(all, step, &dropped);
  if (dropped > 0 || (!all.empty() && all.back() != '\n')) write_text_atomically(path, kept);
  metrics_ = std::fopen(path.c_str(), "a");
  if (!metrics_) throw Error(cat("output.dir: cannot write metrics.jsonl in '", dir_, "'"));
  return dropped;
}

void Json::key(const std::string& k) {
  if (s_.size() > 1) s_ += ",";
  s_ += "\"" + k + "\":";
}

Json& Json::number(const std::string& k, double v, const char* fmt) {
  key(k);
  if (!std::isfinite(v)) {
    s_ += "null";  // JSON has no NaN/Inf
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    s_ += buf;
  }
  return *this;
}

Json& Json::num(const std::string& k, double v) { return number(k, v, "%.9g"); }
Json& Json::exact(const std::string& k, double v) { return number(k, v, "%.17g"); }

Json& Json::integer(const std::string& k, long long v) {
  key(k);
  s_ += std::to_string(v);
  return *this;
}

Json& Json::boolean(const std::string& k, bool v) {
  key(k);
  s_ += v ? "true" : "false";
  return *this;
}

Json& Json::raw(const std::string& k, const std::string& json) {
  key(k);
  s_ += json;
  return *this;
}

Json& Json::str(const std::string& k, const std::string& v) {
  key(k);
  s_ += json_string(v);
  return *this;
}

std::string json_string(const std::string& v) { return text::json_quote(v); }

std::string format_duration(double s) {
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm%02ds", int(s / 3600), (int(s) / 60) % 60, int(s) % 60);
  }
  return buf;
}

}  // namespace nlp
