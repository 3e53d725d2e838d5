// The schema of the configuration: every key (name, the Config field it fills and so its type,
// validation, help), from its one row in config_keys.def, in config_schema.cpp. --help, the INI and command-line parsing, validation and
// Config::to_ini() are all generated from it. Internal to src/config/ (and its tests).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"

namespace nlp::cfg {


// Accessor of a field inside Config; the variant alternative is the key's type.
using FieldRef = std::variant<std::string* (*)(Config&), int* (*)(Config&), float* (*)(Config&),
                              bool* (*)(Config&), uint64_t* (*)(Config&)>;
enum class Type { String = 0, Int = 1, Float = 2, Bool = 3, UInt64 = 4 };
inline constexpr const char* kTypeNames[] = {"string", "int", "float", "bool", "uint64"};

// Validation of one key's value: numeric bounds (open or closed) or a set of allowed strings; and
// what the checks across keys need to know of it: the model type it belongs to, whether it names a file.
struct Check {
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  const std::vector<std::string>* choices = nullptr;
  bool nonempty = false;
  bool step_list = false;  // a string holding parse_step_list's format
  const char* owner = "";  // key_model_type: "gpt2", "bert" (every encoder), "electra"; "" = every type
  bool names_path = false;  // is_path_key: a file or folder, compared across ranks by what it names

  Check only(const char* model_type) const {
    Check k = *this;
    k.owner = model_type;
    return k;
  }
  Check path() const {
    Check k = *this;
    k.names_path = true;
    return k;
  }
};

struct Entry {
  std::string name;   // "section.key"
  FieldRef field;
  Check check;
  std::string help;   // one line
  bool escapes = false;  // string understands \n \t \r \\ \" escapes

  Type type() const { return static_cast<Type>(field.index()); }
  std::string section() const { return name.substr(0, name.find('.')); }
  std::string key() const { return name.substr(name.find('.') + 1); }
};


// Every key, in section order.
const std::vector<Entry>& schema();
// The entry of "section.key", or nullptr.
const Entry* find_entry(const std::string& name);
// The sections, in schema order.
std::vector<std::string> sections();

// model.preset's allowed values ("" = none).
extern const std::vector<std::string> kPresets;

// Whether a key owned by model type `owner` (key_model_type; "" = every type) applies to `type`:
// keys owned by "bert" serve every encoder on BERT's block (bert, roberta, electra).
bool key_applies(const std::string& owner, const std::string& type);

}  // namespace nlp::cfg
