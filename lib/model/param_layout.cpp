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

ParamLayout::ParamLayout(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), ff = c.intermediate_size;
  ParamUnit embed{"embed", 0, {}};
  add(embed, "model.embed_tokens.weight", {c.vocab_size, d}, false);
  units_.push_back(std::move(embed));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    ParamUnit u{"layer." + std::to_string(l), 0, {}};
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
