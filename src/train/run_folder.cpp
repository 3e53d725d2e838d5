// One run per output folder and the run id (see run_folder.h).
#include "train/run_folder.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/h5.h"
#include "train/run_lock.h"

namespace nlp {
namespace fs = std::filesystem;
namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void bcast_string(Comm& c, std::string& str) {
  uint64_t n = str.size();
  c.broadcast_host(&n, sizeof n, 0);
  str.resize(n);
  if (n > 0) c.broadcast_host(str.data(), n, 0);
}

}  // namespace

std::string parse_run_id(const std::string& text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  const std::string id = text.substr(b, e - b);
  if (id.empty() || id.size() > 64 || id == "." || id == "..") return "";
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return "";
  return id;
}

RunFolder inspect_run_folder(const std::string& dir) {
  RunFolder f;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return f;
  if (fs::is_regular_file(fs::path(dir) / kRunIdFile, ec)) f.run_id = parse_run_id(read_text(fs::path(dir) / kRunIdFile));
  for (const auto& path : checkpoint_files(dir)) f.checkpoints.push_back(fs::path(path).filename().string());
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec)) {
    std::istringstream in(read_text(metrics));
    std::string line;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++f.metrics_records;
      const size_t at = line.find("\"step\":");
      if (at != std::string::npos) {
        char* end = nullptr;
        const long long v = std::strtoll(line.c_str() + at + 7, &end, 10);
        if (end != line.c_str() + at + 7) f.last_metrics_step = v;
      }
    }
  }
  return f;
}

std::string used_folder_message(const std::string& dir, const RunFolder& f) {
  std::string what;
  if (!f.checkpoints.empty()) {
    what = cat(f.checkpoints.size(), " checkpoint(s) in ", dir, "/checkpoints (");
    const size_t show = std::min<size_t>(f.checkpoints.size(), 3);
    for (size_t i = 0; i < show; ++i) what += cat(i ? ", " : "", f.checkpoints[i]);
    if (show < f.checkpoints.size()) what += ", ...";
    what += ")";
  }
  if (f.metrics_records > 0)
    what += cat(what.empty() ? "" : " and ", "metrics.jsonl with ", f.metrics_records, " record(s)",
                f.last_metrics_step >= 0 ? cat(", the last of step ", f.last_metrics_step) : std::string());
  return cat("output.dir = '", dir, "' holds another training run (",
             f.run_id.empty() ? std::string("no run id recorded") : cat("run ", f.run_id), "): ", what,
             ". A new run does not write into it. To continue that run: --train.resume=true; to start anew "
             "and move its files to '", dir, "/", kPreviousDir, "/", f.run_id.empty() ? "unnamed" : f.run_id,
             "/': --output.overwrite=true; or choose another output.dir");
}

std::string new_run_id() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof tail, "%06x", static_cast<unsigned>(rd()) & 0xffffffu);
  return cat(when, "-", tail);
}

std::string move_run_aside(const std::string& dir, const std::string& old_id) {
  const fs::path root(dir);
  const fs::path prev = root / kPreviousDir;
  std::error_code ec;
  fs::create_directories(prev, ec);
  if (ec) throw Error(cat("output.overwrite: cannot create '", prev.string(), "': ", ec.message()));
  const std::string base = old_id.empty() ? std::string("unnamed") : old_id;
  fs::path dest = prev / base;
  for (int i = 2; fs::exists(dest, ec); ++i) dest = prev / cat(base, "-", i);
  fs::create_directory(dest, ec);
  if (ec) throw Error(cat("output.overwrite: cannot create '", dest.string(), "': ", ec.message()));
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == RunLock::kFileName || name == kPreviousDir) continue;
    entries.push_back(it->path());
  }
  if (ec) throw Error(cat("output.overwrite: cannot list '", dir, "': ", ec.message()));
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries) {
    fs::rename(e, dest / e.filename(), ec);
    if (ec)
      throw Error(cat("output.overwrite: cannot move '", e.string(), "' to '", (dest / e.filename()).string(),
                      "': ", ec.message(), " (the entries moved so far are in '", dest.string(), "')"));
  }
  return dest.string();
}

std::string checkpoint_run_id(const std::string& path) {
  try {
    h5::File f = h5::File::open_read(path);
    return f.has_attr(kRunIdAttr) ? f.attr_string(kRunIdAttr) : std::string();
  } catch (const std::exception&) {
    return "";
  }
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> out;
  for (const fs::path& d : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const size_t at = name.rfind(".tmp.");
      if (at == std::string::npos || at == 0) continue;
      const std::string pid = name.substr(at + 5);
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      std::error_code ec2;
      if (it->is_regular_file(ec2) && fs::remove(it->path(), ec2)) out.push_back(it->path().string());
    }
  }
  return out;
}

void write_run_id(const std::string& dir, const std::string& id) {
  write_text_atomically((fs::path(dir) / kRunIdFile).string(), id + "\n");
}

void claim_run_folder(Comm& comm, const Config& cfg, Log& log) {
  if (cfg.mode() != RunMode::Train) return;
  const std::string dir = cfg.output.dir;
  std::string error, id;
  bool move = false;
  if (comm.rank() == 0) {
    try {
      const RunFolder f = inspect_run_folder(dir);
      if (cfg.train.resume) {
        id = f.run_id;
      } else {
        if (f.used() && !cfg.output.overwrite) throw Error(used_folder_message(dir, f));
        move = f.used();
        id = new_run_id();
      }
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "output.dir: unknown error";
    }
  }
  bcast_string(comm, error);
  if (!error.empty()) throw Error(error);
  bcast_string(comm, id);
  log.set_run_id(id);
  if (!cfg.train.resume) log.info(cat("run id ", id, " (a new run in '", dir, "')"));
  // What changes the folder waits until every input has been validated (Log::start): a run stopped
  // by bad input leaves the earlier run where it was.
  const bool fresh = !cfg.train.resume;
  log.set_before_start([&log, dir, id, move, fresh] {
    const std::vector<std::string> removed = remove_stale_temporaries(dir);
    if (!removed.empty()) {
      std::string list;
      for (const auto& r : removed) list += cat(list.empty() ? "" : ", ", r);
      log.info(cat("output.dir: removed ", removed.size(), " temporary file(s) of an unfinished write by a run that "
                   "was killed: ", list));
    }
    if (move) {
      const RunFolder f = inspect_run_folder(dir);  // as it is now (the lock kept other runs out)
      const std::string moved = move_run_aside(dir, f.run_id);
      log.info(cat("output.overwrite: the earlier run's files (",
                   f.run_id.empty() ? std::string("no run id recorded") : cat("run ", f.run_id), ") were moved to '",
                   moved, "'"));
    }
    if (fresh) write_run_id(dir, id);
  });
}

}  // namespace nlp
