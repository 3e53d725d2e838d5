// parse_config and its stages (config/config_stages.h), Config::to_ini() and --help, all generated
// from the schema table (config/config_schema.cpp).
//
// Parsing order: the INI file (optional, first positional argument) is read, then the command-line
// overrides `--section.key=value` / `--section.key value` are applied (they win; on the command line
// the last occurrence of a key wins, in the INI a duplicate key is an error); a command-line key
// replaces its alternative from the INI (resolve_alternatives); then model.preset fills the shape
// keys set nowhere else. Type errors are reported where the text was read; range, choice and
// cross-key checks run on the final values and name where each value came from (INI file and line,
// command line, model.preset or default).
#include "config/config.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <system_error>

#include "config/config_messages.h"
#include "config/config_schema.h"
#include "config/config_stages.h"
#include "config/config_values.h"
#include "config/ini_text.h"
#include "core/error.h"

namespace nlp {

namespace po = boost::program_options;
using namespace cfg;

// ---- the stages of parse_config (config/config_stages.h) ------------------------------------------

namespace cfg {

po::options_description key_options() {
  po::options_description desc("keys");
  for (const auto& e : schema()) desc.add_options()(e.name.c_str(), po::value<std::string>(), "");
  return desc;
}

// Read the INI file into c; records explicitly set keys and their origins.
void read_ini(const std::string& path, Config& c, Origins& origins) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(cat("config file '", path, "' not found"));
  if (fs::is_directory(path, ec)) throw Error(cat("config file '", path, "' is a directory"));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(cat("config file '", path, "' cannot be opened for reading"));
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw Error(cat("config file '", path, "': read error"));
  require_text(path, data);
  std::istringstream in(data);
  IniText ini = clean_ini(path, in);

  std::istringstream text(ini.text);
  po::parsed_options parsed(nullptr);
  const auto desc = key_options();
  try {
    parsed = po::parse_config_file(text, desc, /*allow_unregistered=*/true);
  } catch (const po::error& err) {
    throw Error(cat("config file '", path, "': ", err.what()));
  }
  std::map<std::string, size_t> seen;
  for (const auto& opt : parsed.options) {
    const std::string& name = opt.string_key;
    std::string value = opt.value.empty() ? "" : opt.value.front();
    std::replace(value.begin(), value.end(), kHashStandIn, '#');
    const auto& where_lines = ini.lines[name];
    const size_t idx = seen[name]++;
    const int line = idx < where_lines.size() ? where_lines[idx] : 0;
    const std::string at =
        line ? cat("config file '", path, "', line ", line) : cat("config file '", path, "'");
    const Entry* e = opt.unregistered ? nullptr : find_entry(name);
    if (!e) throw Error(cat(at, ": ", unknown_key_message(name, false), " (value '", value, "')"));
    if (idx > 0)
      throw Error(cat(at, ": duplicate key ", name, " = '", value, "' (already set on line ",
                      where_lines.empty() ? 0 : where_lines.front(), ")"));
    Origin o{at, value};
    assign(*e, c, value, o);
    origins[name] = o;
    c.explicitly_set.insert(name);
  }
}

// model.preset: the shape keys of a standard architecture, for keys not set explicitly (HF's
// --config_name NAME --config_overrides k=v,...). The values are those of the Hub's config.json.
void apply_preset(Config& c, Origins& origins) {
  if (c.model.preset.empty()) return;
  using KV = std::vector<std::pair<const char*, const char*>>;
  auto gpt2 = [](const char* layers, const char* heads, const char* width) {
    return KV{{"model.type", "gpt2"}, {"model.n_layer", layers}, {"model.n_head", heads},
              {"model.n_embd", width}, {"model.n_positions", "1024"}, {"model.vocab_size", "50257"}};
  };
  auto bert = [](const char* layers, const char* heads, const char* width, const char* mlp) {
    return KV{{"model.type", "bert"}, {"model.num_hidden_layers", layers},
              {"model.num_attention_heads", heads}, {"model.hidden_size", width},
              {"model.intermediate_size", mlp}, {"model.max_position_embeddings", "512"},
              {"model.type_vocab_size", "2"}, {"model.vocab_size", "30522"}};
  };
  const std::map<std::string, KV> presets = {
      {"gpt2", gpt2("12", "12", "768")},          {"gpt2-medium", gpt2("24", "16", "1024")},
      {"gpt2-large", gpt2("36", "20", "1280")},   {"gpt2-xl", gpt2("48", "25", "1600")},
      {"bert-base", bert("12", "12", "768", "3072")}, {"bert-large", bert("24", "16", "1024", "4096")}};
  const auto it = presets.find(c.model.preset);
  if (it == presets.end()) return;  // validate() names the allowed values
  for (const auto& [key, value] : it->second) {
    const Entry& e = *find_entry(key);
    if (c.is_set(key)) {
      if (std::string(key) == "model.type" && c.model.type != value)
        throw Error(cat("model.preset = ", c.model.preset, " (", c.where("model.preset"), ") is a ", value,
                        " architecture but model.type = ", c.model.type, " (", c.where("model.type"), ")"));
      continue;  // an explicit key overrides the preset
    }
    Origin o{"model.preset = " + c.model.preset, value};
    assign(e, c, value, o);
    origins[key] = o;
    c.preset_keys[key] = c.model.preset;
  }
}

// Keys that are alternatives to each other: train.steps or train.epochs, generate.prompt or
// generate.prompts_file, and model.type or a model.preset of another type. When both are given and
// one came from the command line, the other from the INI file, the command line wins (precedence:
// command line > INI file > model.preset > default): the INI's key goes back to its default, and
// Config::notes gets one line saying so. Both from the same source stay an error (parse_config's
// cross-key checks, apply_preset).
void resolve_alternatives(Config& c, Origins& origins) {
  struct Pair {
    const char* a;
    const char* b;
    bool (*conflict)(const Config&);
  };
  static const Pair pairs[] = {
      {"train.steps", "train.epochs",
       [](const Config& k) { return k.is_set("train.steps") && k.train.epochs > 0; }},
      {"generate.prompt", "generate.prompts_file",
       [](const Config& k) {
         return k.is_set("generate.prompt") && !k.generate.prompt.empty() &&
                k.generate.prompt != GenerateConfig{}.prompt && !k.generate.prompts_file.empty();
       }},
      {"model.type", "model.preset",
       [](const Config& k) {
         const std::string& p = k.model.preset;
         return k.is_set("model.type") && !p.empty() &&
                std::find(kPresets.begin(), kPresets.end(), p) != kPresets.end() &&
                k.model.type != (p.rfind("bert", 0) == 0 ? "bert" : "gpt2");
       }},
  };
  const Config defaults;
  for (const Pair& pair : pairs) {
    if (!pair.conflict(c)) continue;
    const bool a_cli = c.set_on_command_line.count(pair.a) > 0;
    const bool b_cli = c.set_on_command_line.count(pair.b) > 0;
    if (a_cli == b_cli) continue;  // the same source: an error below
    const std::string won = a_cli ? pair.a : pair.b, lost = a_cli ? pair.b : pair.a;
    const Entry& w = *find_entry(won);
    const Entry& l = *find_entry(lost);
    const std::string lost_text = value_text(l, c);
    const std::string lost_where = origins.count(lost) ? origins[lost].where : c.where(lost);
    assign(l, c, value_text(l, defaults), Origin{"default", ""});
    origins.erase(lost);
    c.explicitly_set.erase(lost);
    c.notes.push_back(cat(won, " = ", value_text(w, c), " (command line) replaces ", lost, " = ", lost_text,
                          " (", lost_where, "): the command line wins over the INI file"));
  }
}


std::vector<std::string> tokenise_argv(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // "--section.key=" (empty value): Boost rejects it, so pass the empty value as the next token.
    if (a.size() > 3 && a.rfind("--", 0) == 0 && a.find('=') == a.size() - 1) {
      args.push_back(a.substr(0, a.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(a);
    }
  }
  return args;
}

CommandLine parse_command_line(const std::vector<std::string>& args) {
  po::options_description desc = key_options();
  desc.add_options()("help,h", "")("version", "")("check", "")("ini-file", po::value<std::vector<std::string>>(), "");
  po::positional_options_description pos;
  pos.add("ini-file", -1);
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next | po::command_line_style::allow_short |
                    po::command_line_style::short_allow_next |
                    po::command_line_style::allow_dash_for_short;
  po::parsed_options parsed(nullptr);
  try {
    parsed = po::command_line_parser(args)
                 .options(desc)
                 .positional(pos)
                 .style(style)
                 .allow_unregistered()
                 .run();
  } catch (const po::error& err) {
    throw Error(cat("command line: ", err.what()));
  }

  CommandLine out;
  for (const auto& opt : parsed.options) {
    if (opt.string_key == "help") out.help = true;
    else if (opt.string_key == "version") out.version = true;
    else if (opt.string_key == "check") out.check = true;
    else if (opt.string_key == "ini-file") out.inis.insert(out.inis.end(), opt.value.begin(), opt.value.end());
    else
      out.overrides.push_back({opt.string_key, opt.value.empty() ? "" : opt.value.front(),
                               opt.original_tokens.empty() ? opt.string_key : opt.original_tokens.front(),
                               !opt.unregistered && find_entry(opt.string_key) != nullptr});
  }
  return out;
}

void check_command_line(const CommandLine& cl) {
  for (const auto& o : cl.overrides) {
    if (o.known) continue;
    const std::string& token = o.token;
    if (token.rfind("--", 0) != 0) throw Error(cat("command line: unknown option '", token, "' (see --help)"));
    std::string name = token.substr(2, token.find('=') == std::string::npos ? std::string::npos
                                                                             : token.find('=') - 2);
    throw Error(cat("command line: ", unknown_key_message(name, true), " (in '", token, "')"));
  }
  if (cl.inis.size() > 1)
    throw Error(cat("command line: more than one INI file given ('", join(cl.inis, "', '"),
                    "'); keys are overridden with --section.key=value"));
}

void apply_overrides(const std::vector<CommandLine::Override>& overrides, Config& c, Origins& origins) {
  for (const auto& opt : overrides) {
    const Entry& e = *find_entry(opt.name);
    Origin o{"command line", opt.value};
    assign(e, c, opt.value, o);
    origins[e.name] = o;
    c.explicitly_set.insert(e.name);
    c.set_on_command_line.insert(e.name);
  }
}

void validate_keys(const Config& c, const Origins& origins) {
  for (const auto& e : schema()) {
    const auto it = origins.find(e.name);
    validate(e, c, it != origins.end() ? it->second : Origin{"default", ""});
  }
}

}  // namespace cfg

ParseResult parse_config(int argc, const char* const* argv) {
  using namespace cfg;
  ParseResult result;
  const CommandLine cl = parse_command_line(tokenise_argv(argc, argv));
  result.help = cl.help;
  result.version = cl.version;
  result.check = cl.check;
  if (cl.help) {
    result.help_text = config_help();
    return result;
  }
  if (cl.version) return result;
  check_command_line(cl);

  Config& c = result.config;
  Origins origins;
  if (!cl.inis.empty()) {
    c.source = cl.inis.front();
    read_ini(c.source, c, origins);
  }
  apply_overrides(cl.overrides, c, origins);
  resolve_alternatives(c, origins);
  apply_preset(c, origins);
  validate_keys(c, origins);
  // model.type not given with model.weights: the weights' model_type decides, and
  // resolve_model_config runs these checks once it is known
  if (!model_type_from_weights(c)) check_model_type(c);
  check_cross_keys(c, origins);
  return result;
}

std::string Config::to_ini() const {
  std::ostringstream os;
  os << "# nlptrain configuration" << (source.empty() ? "" : " (read from " + source + ")") << "\n";
  std::string section;
  for (const auto& e : schema()) {
    if (e.section() != section) {
      section = e.section();
      os << "\n[" << section << "]\n";
    }
    const std::string owner = key_model_type(e.name);
    if (e.name == "train.steps" && train.epochs > 0)
      os << "# " << e.key() << " = " << value_text(e, *this) << "   (from train.epochs)\n";
    else if (!key_applies(owner, model.type))
      os << "# " << e.key() << " = " << value_text(e, *this) << "   (" << owner
         << " only: unused with model.type = " << model.type << ")\n";
    else
      os << e.key() << " = " << value_text(e, *this) << "\n";
  }
  return os.str();
}

std::string Config::where(const std::string& key) const {
  if (set_on_command_line.count(key)) return "command line";
  if (explicitly_set.count(key)) return source.empty() ? "command line" : "config file '" + source + "'";
  if (auto it = preset_keys.find(key); it != preset_keys.end()) return "model.preset = " + it->second;
  return "default";
}

std::string config_help() {
  std::ostringstream os;
  os << "usage: nlptrain [--help] [--version] [--check] [input.ini] [--section.key=value ...]\n"
        "\n"
        "Reads input.ini (optional), then applies the command-line overrides. Precedence: command\n"
        "line > INI file > model.preset > default. A key given on the command line replaces its\n"
        "alternative from the INI file (train.steps for train.epochs and back, generate.prompt for\n"
        "generate.prompts_file and back, model.type for a model.preset of the other type), with a\n"
        "line in the log; both in the same place are an error.\n"
        "Each key below is written `key = value` under its [section] in the INI file, or given on\n"
        "the command line as --section.key=value or --section.key value (the last one wins).\n"
        "Without an INI file the defaults are used. INI comments start with # or ;.\n"
        "  --help      print this help and exit\n"
        "  --version   print the version and exit\n"
        "  --check     read and validate input.ini and the overrides (keys, types, ranges, combinations),\n"
        "              print the effective configuration and exit; no dataset or weights file is opened\n"
        "Types: int, uint64, float, bool (true/false, 1/0, yes/no, on/off), string (surrounding\n"
        "double quotes optional).\n";
  const Config defaults;
  size_t w_name = 4, w_def = 7;
  for (const auto& e : schema()) {
    w_name = std::max(w_name, e.name.size());
    std::string d = value_text(e, defaults);
    w_def = std::max(w_def, d.empty() ? 2 : d.size());
  }
  auto pad = [](std::string s, size_t w) { return s.size() < w ? s + std::string(w - s.size(), ' ') : s; };
  os << "\n  " << pad("KEY", w_name) << "  " << pad("TYPE", 6) << "  " << pad("DEFAULT", w_def)
     << "  MEANING (ALLOWED VALUES)\n";
  std::string section;
  for (const auto& e : schema()) {
    if (e.section() != section) {
      section = e.section();
      os << "\n[" << section << "]\n";
    }
    std::string d = value_text(e, defaults);
    if (d.empty()) d = "\"\"";
    std::string check = check_text(e.check, true);
    os << "  " << pad(e.name, w_name) << "  " << pad(kTypeNames[static_cast<int>(e.type())], 6) << "  "
       << pad(d, w_def) << "  " << e.help << (check.empty() ? "" : " (" + check + ")") << "\n";
  }
  return os.str();
}

std::string gpt2_vocab_dir(const Config& c) {
  if (!c.generate.vocab_dir.empty()) return c.generate.vocab_dir;
  const std::filesystem::path p = std::filesystem::path(c.model.weights).parent_path();
  return p.empty() ? std::string(".") : p.string();
}


}  // namespace nlp
