#include "train/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace nlp {

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

void Log::start() {
  if (rank_ != 0 || started_) return;
  started_ = true;
  if (dir_.empty()) return;  // never opened (tests)
  if (!config_ini_.empty()) {
    const std::string tmp = cat(dir_, "/config.ini.tmp.", static_cast<long long>(::getpid()));
    const std::string dst = dir_ + "/config.ini";
    bool ok = false;
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << config_ini_;
      f.flush();
      ok = static_cast<bool>(f);
    }
    std::error_code ec;
    if (ok) std::filesystem::rename(tmp, dst, ec);
    if (!ok || ec) {
      std::filesystem::remove(tmp, ec);
      throw Error(cat("output.dir: cannot write '", dst, "'", ok ? ": " + ec.message() : std::string()));
    }
  }
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
}

void Log::info(const std::string& line) {
  if (rank_ != 0) return;
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
  if (!started_) pending_.push_back(line);
  if (log_) {
    std::fprintf(log_, "%s\n", line.c_str());
    std::fflush(log_);
  }
}

void Log::metrics(const std::string& json_line) {
  if (rank_ != 0) return;
  if (!started_) pending_metrics_.push_back(json_line);
  if (!metrics_) return;
  std::fprintf(metrics_, "%s\n", json_line.c_str());
  std::fflush(metrics_);
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

Json& Json::str(const std::string& k, const std::string& v) {
  key(k);
  s_ += "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') {
      s_ += '\\';
      s_ += c;
    } else if (c == '\n') {
      s_ += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      s_ += buf;
    } else {
      s_ += c;
    }
  }
  s_ += "\"";
  return *this;
}

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
