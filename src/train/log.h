// Rank-0 logging to stdout and <output.dir>/log.txt, and metrics as JSON lines in
// <output.dir>/metrics.jsonl. Other ranks write nothing.
#pragma once
#include <cstdio>
#include <string>

namespace nlp {

class Log {
 public:
  explicit Log(int rank) : rank_(rank) {}
  ~Log();
  // Start writing log.txt and metrics.jsonl in dir (append=true when resuming).
  void open(const std::string& dir, bool append);
  bool is_root() const { return rank_ == 0; }
  void info(const std::string& line);   // one line, newline added
  void metrics(const std::string& json_line);

 private:
  int rank_;
  std::FILE* log_ = nullptr;
  std::FILE* metrics_ = nullptr;
};

// A JSON object on one line: Json().num("step", 3).str("split", "eval").done()
class Json {
 public:
  Json& num(const std::string& key, double v);    // 9 significant digits
  Json& exact(const std::string& key, double v);  // 17 digits: round-trips the double bitwise
  Json& integer(const std::string& key, long long v);
  Json& str(const std::string& key, const std::string& v);
  Json& boolean(const std::string& key, bool v);
  std::string done() const { return s_ + "}"; }

 private:
  void key(const std::string& k);
  Json& number(const std::string& k, double v, const char* fmt);
  std::string s_ = "{";
};

std::string format_duration(double seconds);  // "1h02m03s", "4m05s", "12.3s"

}  // namespace nlp
