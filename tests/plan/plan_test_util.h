// Helpers for the memory-plan tests: a small model written as a model YAML, a stage on a
// walk shard, a CPU target, and the measured backend peak of a real Trainer.
#pragma once
#include <fstream>
#include <string>

#include "core/config.h"
#include "ops/ops.h"
#include "plan/memory_plan.h"
#include "train/train_test_util.h"

namespace easyctx::test {

// hidden 128, `layers` layers, 4 query / 2 KV heads of 32, MLP 344, vocab 512: dir/small.yaml
// (2 layers) or dir/small<layers>.yaml.
// kv_heads: 2, or 4 (no GQA: head groups of 4).
inline std::string write_small_model(const std::string& dir, int layers = 2, int kv_heads = 2) {
  const std::string path = dir + "/small" + (layers == 2 ? std::string() : std::to_string(layers)) +
                           (kv_heads == 2 ? std::string() : "_kv" + std::to_string(kv_heads)) + ".yaml";
  std::ofstream(path) << "hidden_size: 128\nnum_hidden_layers: " << layers
                      << "\nnum_attention_heads: 4\nnum_key_value_heads: " << kv_heads
                      << "\n"
                         "intermediate_size: 344\nvocab_size: 512\nmax_position_embeddings: 4096\n"
                         "rms_norm_eps: 1.0e-5\nrope_theta: 10000.0\ntie_word_embeddings: false\n";
  return path;
}

// The small model on `shard` (a walk shard of vocab 512), sequences of 256, CPU backend.
inline StageConfig small_stage(const std::string& model, const std::string& shard, const std::string& out) {
  StageConfig c = tiny_stage(shard, out);
  c.model.config = model;
  c.data.seq_length = 256;
  c.train.batch_size = 2;
  c.activation.lm_head_tile = 100;
  return c;
}

inline plan::PlanTarget cpu_target(int ranks = 1) {
  plan::PlanTarget t;
  t.backend = DeviceKind::Cpu;
  t.gpus_per_node = ranks;
  t.nodes = 1;
  t.host_memory_bytes = int64_t{64} << 30;
  t.host_source = "test";
  return t;
}

inline double rel_diff(int64_t a, int64_t b) {
  return std::abs(static_cast<double>(a - b)) / static_cast<double>(std::max<int64_t>(1, b));
}

}  // namespace easyctx::test
