// A small Llama for the tests that build one by hand.
#pragma once
#include <cstdint>
#include <string>

#include "model/llama_config.h"

namespace easyctx::test {

// The shape of a test model; every field not given here keeps LlamaConfig's default.
struct LlamaShape {
  int64_t hidden_size, num_layers, num_heads, num_kv_heads, head_dim, intermediate_size, vocab_size;
};

inline model::LlamaConfig llama_config(const std::string& name, const LlamaShape& s) {
  model::LlamaConfig c;
  c.name = name;
  c.hidden_size = s.hidden_size;
  c.num_layers = s.num_layers;
  c.num_heads = s.num_heads;
  c.num_kv_heads = s.num_kv_heads;
  c.head_dim = s.head_dim;
  c.intermediate_size = s.intermediate_size;
  c.vocab_size = s.vocab_size;
  return c;
}

}  // namespace easyctx::test
