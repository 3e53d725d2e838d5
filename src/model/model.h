// The model interface the trainer drives. GPT-2 (gpt2.cpp) implements it on the shared transformer
// block; BERT and its heads will implement the same interface.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/backend.h"
#include "io/h5.h"
#include "model/params.h"

namespace nlp {

// A batch in backend memory. targets are already aligned with positions (for CLM: shifted).
struct DeviceBatch {
  int B = 0, T = 0;
  const int32_t* ids = nullptr;      // [B,T]
  const int32_t* mask = nullptr;     // [B,T] key padding mask (1 keep, 0 pad); nullable
  const int32_t* targets = nullptr;  // [B,T] (-100 = ignore)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual ParamStore& params() = 0;
  virtual const ModelConfig& config() const = 0;
  // Writes model_type and the HF config names as root attributes.
  virtual void write_attrs(h5::File& f) const = 0;
  // Initialise from scratch, seeded (HF's initialisation scheme).
  virtual void init_weights(uint64_t seed) = 0;
  // Forward; returns the SUM of per-token losses over targets != -100 (host double).
  virtual double forward(const DeviceBatch& b, bool training, uint64_t seed) = 0;
  // Backward of dloss * (sum of losses) through the last forward, accumulating into params().grad().
  virtual void backward(const DeviceBatch& b, float dloss, bool training, uint64_t seed) = 0;
  virtual const float* logits() const = 0;  // [B,T,V] of the last forward (backend memory)
  // Bytes of activations needed for a batch of B x T (for the memory report).
  virtual size_t activation_bytes(int B, int T) const = 0;
};

// Incremental decoding with a KV cache (GPT-2).
class Decoder {
 public:
  virtual ~Decoder() = default;
  // Feed one token per sequence at position pos (0-based); returns logits [B,V] on the host.
  virtual const std::vector<float>& step(const std::vector<int32_t>& tokens, int pos) = 0;
  virtual int max_positions() const = 0;
};

// Model config from the run config, or from the weights file's root attributes when model.weights
// is set (then model keys given explicitly in the INI must agree, else an error naming both).
ModelConfig resolve_model_config(const Config& cfg);

std::unique_ptr<Model> make_model(const ModelConfig& mc, Backend& be);
std::unique_ptr<Decoder> make_decoder(Model& m, Backend& be, int B);

}  // namespace nlp

namespace nlp {
// Load model.weights into the model's parameters (HF names and shapes validated). Returns the names
// of datasets in the file that the model does not use (lm_head.weight, tied to the token embedding,
// and attention mask buffers are expected and not reported).
std::vector<std::string> load_model_weights(Model& m, const std::string& path);
}  // namespace nlp
