// Where every Llama parameter lives. Units are the ZeRO-3 granularity: the token embedding,
// one flat buffer per decoder layer, and the head (final norm + lm_head, or the final norm
// alone when embeddings are tied). Inside a layer unit the tensors sit at fixed offsets,
// matrices first (q, k, v, o, gate, up, down), then the two norm vectors (then qwen2's q, k,
// v biases, qwen3's q and k norms), so a shard of a
// unit is a plain slice and the same offsets serve master weights, gradients and Adam state.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"

namespace easyctx::model {

struct ParamTensor {
  std::string hf_name;         // "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape, e.g. [out, in] for a Linear weight
  int64_t offset = 0;          // elements from the start of its unit
  int64_t numel = 0;
  bool decay = true;     // AdamW weight decay (matrices yes, norm gains and biases no)
  bool is_norm = false;  // initialised to 1
  bool is_bias = false;  // initialised to 0 (the q/k/v biases of qwen2)
};

struct ParamUnit {
  std::string name;  // "embed", "layer.3", "head"
  int64_t numel = 0;
  std::vector<ParamTensor> tensors;
};

// The tensors of a layer unit, in their order; the optional ones follow the norms when the
// model has them: the q/k/v biases (LlamaConfig::qkv_bias, qwen2) and the per-head q/k norms
// (LlamaConfig::qk_norm, qwen3). ParamLayout::layer_slot maps one to its index in the unit.
enum LayerTensor {
  kQ = 0,
  kK,
  kV,
  kO,
  kGate,
  kUp,
  kDown,
  kAttnNorm,
  kMlpNorm,
  kQBias,
  kKBias,
  kVBias,
  kQNorm,
  kKNorm,
  kLayerTensors
};

class ParamLayout {
 public:
  explicit ParamLayout(const LlamaConfig& c);

  const std::vector<ParamUnit>& units() const { return units_; }
  size_t num_units() const { return units_.size(); }
  size_t embed_unit() const { return 0; }
  size_t layer_unit(int64_t layer) const { return static_cast<size_t>(1 + layer); }
  size_t head_unit() const { return units_.size() - 1; }
  // Index of a layer tensor inside every layer unit; throws Error for one this model lacks.
  size_t layer_slot(LayerTensor t) const;
  int64_t total_numel() const;
  // (unit, tensor) of an HF name; false if absent.
  bool find(const std::string& hf_name, size_t& unit, size_t& tensor) const;
  // Every HF tensor name in order.
  std::vector<std::string> hf_names() const;

 private:
  std::vector<ParamUnit> units_;
  std::vector<int> slot_ = std::vector<int>(kLayerTensors, -1);  // LayerTensor -> index, -1: absent
};

}  // namespace easyctx::model
