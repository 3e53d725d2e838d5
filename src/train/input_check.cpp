#include "train/input_check.h"

#include <exception>

#include "core/error.h"
#include "io/h5.h"
#include "model/model.h"

namespace nlp {

std::string check_input_files(const Config& cfg) {
  // model.weights: resolve_model_config reads its shape and names the key in its errors (missing
  // file, a Hugging Face folder to convert, a shape that disagrees with the keys given).
  if (!cfg.model.weights.empty()) {
    try {
      (void)resolve_model_config(cfg);
    } catch (const std::exception& e) {
      const std::string m = e.what();
      if (m.find("model.weights") != std::string::npos) return m;
      return cat("model.weights = '", cfg.model.weights, "' (", cfg.where("model.weights"), "): ", m);
    }
  }
  auto check = [&](const char* key, const std::string& path) -> std::string {
    if (path.empty()) return "";
    try {
      (void)h5::File::open_read(path);
    } catch (const std::exception& e) {
      return cat(key, " = '", path, "' (", cfg.where(key), "): ", e.what());
    }
    return "";
  };
  if (cfg.reads_train())
    if (std::string m = check("data.train", cfg.data.train); !m.empty()) return m;
  if (cfg.reads_eval())
    if (std::string m = check("data.eval", cfg.data.eval); !m.empty()) return m;
  return "";
}

}  // namespace nlp
