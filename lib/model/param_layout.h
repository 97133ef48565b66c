// Where every Llama parameter lives. Units are the ZeRO-3 granularity: the token embedding,
// one flat buffer per decoder layer, and the head (final norm + lm_head, or the final norm
// alone when embeddings are tied). Inside a layer unit the tensors sit at fixed offsets,
// matrices first (q, k, v, o, gate, up, down), then the two norm vectors (then qwen2's q, k,
// v biases, qwen3's q and k norms), so a shard of a
// unit is a plain slice and the same offsets serve master weights, gradients and Adam state.
//
// With LoRA (LoraSpec::enabled) the base units are frozen (ParamUnit::frozen: held in the
// compute dtype only, never given a gradient or optimizer state) and the trainable tensors
// follow in units of their own: "lora.embed" (a trainable copy of the embedding), one
// "lora.layer.N" per layer (the adapters A and B of each target in LoraTarget order, then the
// layer's norm gains with lora.trainable norm), "lora.head" (the final norm, lm_head). A base
// unit whose every tensor has a trainable copy (the embedding when it trains; the head when the
// final norm and lm_head do) is left out. Locations (Loc) tell the model where each tensor it
// reads lives.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/lora.h"

namespace easyctx::model {

struct ParamTensor {
  std::string hf_name;         // "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // HF shape, e.g. [out, in] for a Linear weight
  int64_t offset = 0;          // elements from the start of its unit
  int64_t numel = 0;
  bool decay = true;     // AdamW weight decay (matrices yes, norm gains and biases no)
  bool is_norm = false;  // initialised to 1
  bool is_bias = false;  // initialised to 0 (the q/k/v biases of qwen2)
  // A LoRA adapter matrix (hf_name "model.layers.3.self_attn.q_proj.lora_A.weight", PEFT's key
  // without its "base_model.model." prefix): in no base model's files; initialised by
  // init_lora_range or read from an adapter folder. lora_a: A [r, in], else B [out, r].
  bool adapter = false;
  bool lora_a = false;
  // Every other tensor is a tensor of the base model ParamLayout(config) (itself, or a trainable
  // copy of it): its unit there and offset in that unit, where its initial values come from.
  int64_t base_unit = -1;
  int64_t base_offset = 0;
};

struct ParamUnit {
  std::string name;  // "embed", "layer.3", "head"; LoRA: "lora.embed", "lora.layer.3", "lora.head"
  int64_t numel = 0;
  std::vector<ParamTensor> tensors;
  bool frozen = false;     // LoRA's base: compute dtype only, no gradient, no optimizer state
  bool per_layer = false;  // a decoder layer's base unit (ZeRO-3 gathers it per use)
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
  static constexpr size_t kNone = static_cast<size_t>(-1);
  // lora: the LoRA layout (frozen base units and trainable ones) when lora.enabled().
  explicit ParamLayout(const LlamaConfig& c, const LoraSpec& lora = {});

  const std::vector<ParamUnit>& units() const { return units_; }
  size_t num_units() const { return units_.size(); }
  // The base units: the embedding's and the head's (kNone when LoRA left them out) and layer l's.
  size_t embed_unit() const { return embed_; }
  size_t layer_unit(int64_t layer) const { return first_layer_ + static_cast<size_t>(layer); }
  size_t head_unit() const { return head_; }
  int64_t num_layers() const { return num_layers_; }
  // Where unit u sits in the forward: -1 the embedding (LoRA: its copy too), l layer l's base or
  // lora.layer.l unit, num_layers() the head's (LoRA: lora.head). The optimizer split
  // (parallel.zero.offload_optimizer_layers) keeps the state of the last layers' units there.
  int64_t unit_layer(size_t u) const;
  // Index of a layer tensor inside every layer unit; throws Error for one this model lacks.
  size_t layer_slot(LayerTensor t) const;
  int64_t total_numel() const;
  // The elements of the units that train (every unit without LoRA).
  int64_t trainable_numel() const;
  int64_t frozen_numel() const { return total_numel() - trainable_numel(); }

  // ---- where the model finds each tensor: the unit holding it (a trainable copy where LoRA
  // trains it) and its index there
  struct Loc {
    size_t unit = kNone;
    size_t tensor = 0;
    bool found() const { return unit != kNone; }
  };
  const LoraSpec& lora() const { return lora_; }
  Loc embedding() const { return embedding_; }
  Loc final_norm() const { return final_norm_; }
  Loc lm_head() const { return lm_head_; }  // the embedding when tied
  // Layer l's tensor t (its norms from lora.layer.l when lora.trainable has norm); throws Error
  // for one this model lacks.
  Loc layer_tensor(int64_t layer, LayerTensor t) const;
  // Layer l's adapter A (a = true) or B of a target; not found when it is not targeted.
  Loc lora_matrix(int64_t layer, int target, bool a) const;
  // The lora.layer.l unit (kNone without LoRA).
  size_t lora_unit(int64_t layer) const {
    return first_lora_layer_ == kNone ? kNone : first_lora_layer_ + static_cast<size_t>(layer);
  }
  // (unit, tensor) of an HF name; false if absent.
  bool find(const std::string& hf_name, size_t& unit, size_t& tensor) const;
  // Every HF tensor name in order.
  std::vector<std::string> hf_names() const;

 private:
  void add_lora_units(const LlamaConfig& c, const ParamLayout& base);

  std::vector<ParamUnit> units_;
  std::vector<int> slot_ = std::vector<int>(kLayerTensors, -1);  // LayerTensor -> index, -1: absent
  LoraSpec lora_;
  size_t embed_ = 0, first_layer_ = 1, head_ = kNone, first_lora_layer_ = kNone;
  int64_t num_layers_ = 0;
  Loc embedding_, final_norm_, lm_head_;
  std::vector<int> lora_slot_ = std::vector<int>(2 * kLoraTargets, -1);    // (target, A|B) -> index in lora.layer.l
  std::vector<int> lora_norm_slot_ = std::vector<int>(kLayerTensors, -1);  // norm -> index in lora.layer.l
};

}  // namespace easyctx::model
