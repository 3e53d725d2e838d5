// The stages of parse_config, in the order it runs them (config.h has the public API; this header is
// for the configuration layer's files and its tests):
//   tokenise_argv -> parse_command_line -> (--help / --version) -> check_command_line
//   -> read_ini (the INI file) -> apply_overrides (the command line) -> resolve_alternatives
//   -> apply_preset (model.preset, for keys set nowhere else) -> validate_keys (types were checked
//   where the text was read; ranges and choices here) -> check_model_type -> check_cross_keys.
// Precedence: command line > INI file > model.preset > default.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_values.h"

namespace nlp::cfg {

using Origins = std::map<std::string, Origin>;  // "section.key" -> its origin

// argv[1..] as the tokens Boost reads: "--section.key=" (an empty value, which Boost rejects)
// becomes "--section.key" and "".
std::vector<std::string> tokenise_argv(int argc, const char* const* argv);

// The command line's flags, INI files and --section.key overrides, in their order.
struct CommandLine {
  bool help = false, version = false, check = false;
  std::vector<std::string> inis;
  struct Override {
    std::string name;   // "section.key" (or the unknown option's name)
    std::string value;
    std::string token;  // as typed, for messages
    bool known = false; // a key of the schema
  };
  std::vector<Override> overrides;
};
// Throws nlp::Error "command line: ..." on what Boost cannot read (e.g. a key without its value).
CommandLine parse_command_line(const std::vector<std::string>& args);
// An unknown key (with the closest known one) or more than one INI file is an error.
void check_command_line(const CommandLine& cl);

// The INI file's keys into c (c.explicitly_set, origins); errors name the file and line.
void read_ini(const std::string& path, Config& c, Origins& origins);
// The command line's keys into c; the last occurrence of a key wins.
void apply_overrides(const std::vector<CommandLine::Override>& overrides, Config& c, Origins& origins);
// A key from the command line replaces its alternative from the INI file (train.steps / train.epochs,
// generate.prompt / generate.prompts_file, model.type / model.preset), with a line in c.notes.
void resolve_alternatives(Config& c, Origins& origins);
// model.preset's shape keys, for keys not set explicitly.
void apply_preset(Config& c, Origins& origins);
// Every key's range, choice and non-empty check on its final value.
void validate_keys(const Config& c, const Origins& origins);
// Checks across keys (shapes, packing, ZeRO and CUDA graphs, generation, schedule, run.mode's inputs).
void check_cross_keys(const Config& c, const Origins& origins);

}  // namespace nlp::cfg
