#include "train/log.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"

namespace nlp {

Log::~Log() {
  if (log_) std::fclose(log_);
  if (metrics_) std::fclose(metrics_);
}

void Log::open(const std::string& dir, bool append) {
  if (rank_ != 0) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(cat("output.dir: cannot create directory '", dir, "': ", ec.message()));
  const char* mode = append ? "a" : "w";
  log_ = std::fopen((dir + "/log.txt").c_str(), mode);
  metrics_ = std::fopen((dir + "/metrics.jsonl").c_str(), mode);
  if (!log_ || !metrics_)
    throw Error(cat("output.dir: cannot write log.txt / metrics.jsonl in '", dir, "'"));
}

void Log::info(const std::string& line) {
  if (rank_ != 0) return;
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
  if (log_) {
    std::fprintf(log_, "%s\n", line.c_str());
    std::fflush(log_);
  }
}

void Log::metrics(const std::string& json_line) {
  if (rank_ != 0 || !metrics_) return;
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
