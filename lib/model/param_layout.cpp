#include "model/param_layout.h"

#include "core/checked.h"
#include "core/error.h"

namespace easyctx::model {
namespace {

void add(ParamUnit& u, std::string name, std::vector<int64_t> shape, bool norm, bool bias = false) {
  ParamTensor t;
  t.hf_name = std::move(name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel = checked_elements({t.numel, d}, t.hf_name + ": elements");
  t.offset = u.numel;
  t.is_norm = norm;
  t.is_bias = bias;
  t.decay = !norm && !bias;
  u.numel = checked_elements({checked_add(u.numel, t.numel, u.name + ": elements")}, u.name + ": elements");
  u.tensors.push_back(std::move(t));
}

}  // namespace

ParamLayout::ParamLayout(const LlamaConfig& c, const LoraSpec& lora) : lora_(lora), num_layers_(c.num_layers) {
  if (lora.enabled()) {
    // With tied embeddings PEFT's modules_to_save would train a copy of one of the two and leave
    // the other: the export would untie them.
    EASYCTX_CHECK_INPUT(!c.tie_word_embeddings || (!lora.embed_tokens && !lora.lm_head), "lora.trainable: ", c.name,
                        " ties its embeddings to the LM head (tie_word_embeddings), and PEFT's "
                        "modules_to_save would train a copy of one and leave the other, untying them; drop "
                        "embed_tokens and lm_head");
    const ParamLayout base(c);
    slot_ = base.slot_;
    embed_ = kNone;
    if (!lora.embed_tokens) {  // (a trained embedding has its copy: the base's is not needed)
      embed_ = units_.size();
      units_.push_back(base.units_[base.embed_unit()]);
      units_.back().frozen = true;
    }
    first_layer_ = units_.size();
    for (int64_t l = 0; l < c.num_layers; ++l) {
      units_.push_back(base.units_[base.layer_unit(l)]);
      units_.back().frozen = true;
    }
    const bool head_trains = lora.norm && (lora.lm_head || c.tie_word_embeddings);
    if (!head_trains) {
      head_ = units_.size();
      units_.push_back(base.units_[base.head_unit()]);
      units_.back().frozen = true;
    }
    add_lora_units(c, base);
    return;
  }
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), ff = c.intermediate_size;
  ParamUnit embed{"embed", 0, {}};
  add(embed, "model.embed_tokens.weight", {c.vocab_size, d}, false);
  units_.push_back(std::move(embed));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ParamUnit u{"layer." + std::to_string(l), 0, {}};
    u.per_layer = true;
    // Order must match enum LayerTensor.
    add(u, p + "self_attn.q_proj.weight", {q, d}, false);
    add(u, p + "self_attn.k_proj.weight", {kv, d}, false);
    add(u, p + "self_attn.v_proj.weight", {kv, d}, false);
    add(u, p + "self_attn.o_proj.weight", {d, q}, false);
    add(u, p + "mlp.gate_proj.weight", {ff, d}, false);
    add(u, p + "mlp.up_proj.weight", {ff, d}, false);
    add(u, p + "mlp.down_proj.weight", {d, ff}, false);
    add(u, p + "input_layernorm.weight", {d}, true);
    add(u, p + "post_attention_layernorm.weight", {d}, true);
    if (c.qkv_bias) {
      add(u, p + "self_attn.q_proj.bias", {q}, false, true);
      add(u, p + "self_attn.k_proj.bias", {kv}, false, true);
      add(u, p + "self_attn.v_proj.bias", {kv}, false, true);
    }
    if (c.qk_norm) {  // one gain per head dimension, shared by the heads
      add(u, p + "self_attn.q_norm.weight", {c.head_dim}, true);
      add(u, p + "self_attn.k_norm.weight", {c.head_dim}, true);
    }
    units_.push_back(std::move(u));
  }
  int next = 0;
  for (int t = 0; t < kLayerTensors; ++t) {
    const bool present = t <= kMlpNorm || (t <= kVBias ? c.qkv_bias : c.qk_norm);
    if (present) slot_[static_cast<size_t>(t)] = next++;
  }
  ParamUnit head{"head", 0, {}};
  add(head, "model.norm.weight", {d}, true);
  if (!c.tie_word_embeddings) add(head, "lm_head.weight", {c.vocab_size, d}, false);
  units_.push_back(std::move(head));
  head_ = units_.size() - 1;
  for (size_t u = 0; u < units_.size(); ++u)
    for (ParamTensor& t : units_[u].tensors) {
      t.base_unit = static_cast<int64_t>(u);
      t.base_offset = t.offset;
    }
  embedding_ = {embed_, 0};
  final_norm_ = {head_, 0};
  lm_head_ = c.tie_word_embeddings ? embedding_ : Loc{head_, 1};
}

// The trainable units of a LoRA layout after its frozen ones: the embedding's copy, each
// layer's adapters (and norm copies), the head's copies; with the locations the model reads.
void ParamLayout::add_lora_units(const LlamaConfig& c, const ParamLayout& base) {
  auto copy_of = [&](ParamUnit& u, const ParamLayout::Loc& from) {
    const ParamTensor& t = base.units_[from.unit].tensors[from.tensor];
    add(u, t.hf_name, t.shape, t.is_norm, t.is_bias);
    u.tensors.back().base_unit = static_cast<int64_t>(from.unit);
    u.tensors.back().base_offset = t.offset;
    return Loc{units_.size(), u.tensors.size() - 1};
  };
  embedding_ = {embed_, 0};
  if (lora_.embed_tokens) {
    ParamUnit u{"lora.embed", 0, {}};
    embedding_ = copy_of(u, base.embedding());
    units_.push_back(std::move(u));
  }
  first_lora_layer_ = units_.size();
  const int64_t d = c.hidden_size,
                io[kLoraTargets][2] = {{c.q_dim(), d},          {c.kv_dim(), d},          {c.kv_dim(), d},
                                       {d, c.q_dim()},          {c.intermediate_size, d}, {c.intermediate_size, d},
                                       {d, c.intermediate_size}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    ParamUnit u{"lora.layer." + std::to_string(l), 0, {}};
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (int t = 0; t < kLoraTargets; ++t) {
      if (!lora_.targets[static_cast<size_t>(t)]) continue;
      for (const bool a : {true, false}) {
        lora_slot_[static_cast<size_t>(2 * t + (a ? 0 : 1))] = static_cast<int>(u.tensors.size());
        const std::vector<int64_t> shape =
            a ? std::vector<int64_t>{lora_.rank, io[t][1]} : std::vector<int64_t>{io[t][0], lora_.rank};
        add(u, p + lora_target_module(t) + (a ? ".lora_A.weight" : ".lora_B.weight"), shape, false);
        u.tensors.back().adapter = true;
        u.tensors.back().lora_a = a;
      }
    }
    for (const LayerTensor t : {kAttnNorm, kMlpNorm, kQNorm, kKNorm}) {
      if (!lora_.norm || slot_[static_cast<size_t>(t)] < 0) continue;
      lora_norm_slot_[static_cast<size_t>(t)] = static_cast<int>(u.tensors.size());
      copy_of(u, base.layer_tensor(l, t));
    }
    units_.push_back(std::move(u));
  }
  final_norm_ = {head_, 0};
  lm_head_ = c.tie_word_embeddings ? embedding_ : Loc{head_, 1};
  if (lora_.norm || lora_.lm_head) {
    ParamUnit u{"lora.head", 0, {}};
    if (lora_.norm) final_norm_ = copy_of(u, base.final_norm());
    if (lora_.lm_head) lm_head_ = copy_of(u, base.lm_head());
    units_.push_back(std::move(u));
  }
}

ParamLayout::Loc ParamLayout::layer_tensor(int64_t layer, LayerTensor t) const {
  const int ls = lora_norm_slot_.at(static_cast<size_t>(t));
  if (ls >= 0) return {lora_unit(layer), static_cast<size_t>(ls)};
  return {layer_unit(layer), layer_slot(t)};
}

ParamLayout::Loc ParamLayout::lora_matrix(int64_t layer, int target, bool a) const {
  const int s = lora_slot_.at(static_cast<size_t>(2 * target + (a ? 0 : 1)));
  if (s < 0) return {};
  return {lora_unit(layer), static_cast<size_t>(s)};
}

int64_t ParamLayout::unit_layer(size_t u) const {
  EASYCTX_CHECK(u < units_.size(), "ParamLayout::unit_layer: unit ", u, " of ", units_.size());
  const size_t layers = static_cast<size_t>(num_layers_);
  for (const size_t first : {first_layer_, first_lora_layer_})
    if (first != kNone && u >= first && u < first + layers) return static_cast<int64_t>(u - first);
  return u < first_layer_ || units_[u].name == "lora.embed" ? -1 : num_layers_;
}

int64_t ParamLayout::trainable_numel() const {
  int64_t n = 0;
  for (const auto& u : units_)
    if (!u.frozen) n = checked_add(n, u.numel, "the model's trainable parameter count");
  return n;
}

size_t ParamLayout::layer_slot(LayerTensor t) const {
  const int s = slot_.at(static_cast<size_t>(t));
  EASYCTX_CHECK(s >= 0, "ParamLayout: this model's layers have no tensor ", static_cast<int>(t));
  return static_cast<size_t>(s);
}

int64_t ParamLayout::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n = checked_add(n, u.numel, "the model's parameter count");
  return n;
}

bool ParamLayout::find(const std::string& hf_name, size_t& unit, size_t& tensor) const {
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t t = 0; t < units_[u].tensors.size(); ++t)
      if (units_[u].tensors[t].hf_name == hf_name) {
        unit = u;
        tensor = t;
        return true;
      }
  return false;
}

std::vector<std::string> ParamLayout::hf_names() const {
  std::vector<std::string> names;
  for (const auto& u : units_)
    for (const auto& t : u.tensors) names.push_back(t.hf_name);
  return names;
}

}  // namespace easyctx::model
