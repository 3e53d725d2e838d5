// libFuzzer harness: the command line (nlp::parse_config on argv), in particular `--section.key=value`
// overrides. The input is split at '\n' into arguments (argv[0] = "nlptrain").
// Properties: returns or throws nlp::Error; an accepted configuration round-trips through to_ini(),
// and its overrides are really applied: `--section.key=value` given again on top of to_ini()'s file
// gives the same configuration.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_util.h"

namespace {

// A token that may name an INI file (a positional argument or --ini-file's value) must not name
// something that never ends (/dev/zero, a FIFO): only missing paths and small regular files pass.
bool safe_ini_path(const std::string& p) {
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (ec || !std::filesystem::exists(st)) return true;
  if (std::filesystem::is_directory(st)) return true;  // parse_config rejects a folder without reading
  return std::filesystem::is_regular_file(st) && std::filesystem::file_size(p, ec) < (1u << 20) && !ec;
}

nlp::ParseResult parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"nlptrain"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return nlp::parse_config(static_cast<int>(argv.size()), argv.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args;
  std::string cur;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (size) args.push_back(cur);
  // A real argv element ends at its first NUL byte, and that is all parse_config sees (c_str()).
  // The checks below must use the same strings: a '=' after a NUL once made the harness re-apply
  // "--data.train\0...=u" as an override, which parse_config saw as "--data.train" with no value
  // (corpus/cli/regress-nul-in-argument).
  for (auto& a : args) a.resize(std::char_traits<char>::length(a.c_str()));
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() > 4096) return 0;
    if (a.empty() || a[0] != '-') {
      if (!safe_ini_path(a)) return 0;
    } else if (a.rfind("--ini-file", 0) == 0) {
      const size_t eq = a.find('=');
      if (eq != std::string::npos ? !safe_ini_path(a.substr(eq + 1))
                                  : i + 1 < args.size() && !safe_ini_path(args[i + 1]))
        return 0;
    }
  }
  nlp::ParseResult r;
  try {
    r = parse(args);
  } catch (const nlp::Error&) {
    return 0;
  }
  if (r.help && r.help_text.empty()) nlp_fuzz::fail("--help gave no text");
  if (r.help || r.version) return 0;
  const std::string ini = nlp_fuzz::without_comments(r.config.to_ini());
  static const std::string again = nlp_fuzz::scratch_path("cli-again.ini");
  nlp_fuzz::write_file(again, ini.data(), ini.size());
  try {
    const nlp::ParseResult r2 = parse({again});
    if (nlp_fuzz::without_comments(r2.config.to_ini()) != ini)
      nlp_fuzz::fail("to_ini() does not round-trip:\n" + ini + "\n--- parsed again:\n" + r2.config.to_ini());
    // The same overrides on top of the effective file change nothing (an override that was dropped or
    // applied differently the second time would show here).
    // Only when every option is in the --key=value form: with "--key value" (the value a separate
    // argument) which tokens Boost pairs is its own business, and re-applying only the --key=value
    // ones while a later "--key value" set the same key gave a false report (last one wins;
    // corpus/cli/regress-override-then-separate-value).
    std::vector<std::string> with_file{again};
    bool all_inline = true;
    for (const auto& a : args)
      if (a.rfind("--", 0) == 0) {
        if (a.find('=') != std::string::npos) with_file.push_back(a);
        else all_inline = false;
      }
    if (!all_inline) return 0;
    const nlp::ParseResult r3 = parse(with_file);
    if (nlp_fuzz::without_comments(r3.config.to_ini()) != ini)
      nlp_fuzz::fail("overrides on top of to_ini() give another config:\n" + ini + "\n---\n" +
                     r3.config.to_ini());
  } catch (const nlp::Error& e) {
    nlp_fuzz::fail(std::string("an accepted config is rejected when given again: ") + e.what() + "\n" + ini);
  }
  return 0;
}
