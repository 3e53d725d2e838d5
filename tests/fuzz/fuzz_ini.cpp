// libFuzzer harness: the INI parser (nlp::parse_config on `nlptrain <file>`).
// Properties: parse_config returns or throws nlp::Error (any other exception escapes and is a finding),
// and a configuration it accepts round-trips: its to_ini() text parses again to the same to_ini().
#include <cstdint>
#include <string>

#include "config/config.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nlp_fuzz::scratch_path("input.ini");
  static const std::string again = nlp_fuzz::scratch_path("again.ini");
  nlp_fuzz::write_file(path, data, size);
  const char* argv[] = {"nlptrain", path.c_str()};
  nlp::ParseResult r;
  try {
    r = nlp::parse_config(2, argv);
  } catch (const nlp::Error&) {
    return 0;  // rejected with a message: fine
  }
  const std::string ini = nlp_fuzz::without_comments(r.config.to_ini());
  nlp_fuzz::write_file(again, ini.data(), ini.size());
  const char* argv2[] = {"nlptrain", again.c_str()};
  try {
    const nlp::ParseResult r2 = nlp::parse_config(2, argv2);
    if (nlp_fuzz::without_comments(r2.config.to_ini()) != ini)
      nlp_fuzz::fail("to_ini() does not round-trip:\n" + ini + "\n--- parsed again:\n" + r2.config.to_ini());
  } catch (const nlp::Error& e) {
    nlp_fuzz::fail(std::string("to_ini() of an accepted config is rejected: ") + e.what() + "\n" + ini);
  }
  return 0;
}
